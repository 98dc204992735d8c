"""The engine: what makes the glass fast, kept apart from it.

- `compiled` (numba loops in `numba_kernels`, loaded on first use by `jit`): the fused
  elementwise forms that replace `ops`' NumPy ones where numba loads; `fast_decode`: a
  whole decoding step compiled, for small llama-family models;
- `ops`, `attention`, `optimizer`, `decode`: the fast forms of the ops (sliced over threads, in
  place, attention in query blocks, llama2.c-style decoding), each registered below against
  its reference form and tested equal to it (tests/test_kernels.py);
- `backward`: the autograd's backward pass with gradient buffers reused (added into in place,
  handed to leaves uncopied), the fast form of `tensor.backward_pass`;
- `parallel`: the thread pool that runs the elementwise passes over slices of rows;
- `blas`: the matrix-product backend (NumPy's BLAS, or Intel MKL's SGEMM where it is installed);
- `cpu`: thread counts, load measurement, and the process's default (the CLI's choice,
  applied at the first op: `cpu.apply_default_threads`).

Nothing in the glass imports this package: importing it (which `import glassllm` does) plugs
the engine into the glass through `glassllm.kernels`. GLASSLLM_KERNELS=reference then runs the
references all the same; the BLAS backend computes every matrix product in both modes.
"""
from .. import kernels
from . import attention, backward, blas, compiled, cpu, decode, fast_decode, ops, optimizer

kernels.register_gemm(blas.matmul)
for _module in (backward, ops, attention, optimizer, decode, compiled, fast_decode):  # later wins
    for _reference, _fast in _module.FAST_FORMS:
        kernels.register(_reference, _fast)
del _module, _reference, _fast
