"""The engine: what makes the glass fast, kept apart from it.

- `compiled` (numba loops in `numba_kernels`, loaded on first use by `jit`): the fused
  elementwise forms, each one registered form that runs its numba kernel where numba loads
  and its NumPy form (`ops`, `optimizer`) otherwise; `fast_decode`: the decoding step, a
  whole token compiled for small llama-family models, `decode`'s NumPy step otherwise;
- `ops`, `attention`, `optimizer`: the NumPy forms (sliced over threads, in place, attention
  in query blocks); those without a compiled form are registered as they are;
- `backward`: the autograd's backward pass with gradient buffers reused (added into in place,
  handed to leaves uncopied), the fast form of `tensor.backward_pass`;
- `buffers`: the output arrays the compiled forwards reuse from step to step;
- `parallel`: the thread pool that runs the elementwise passes over slices of rows;
- `blas`: the matrix-product backend (NumPy's BLAS, or Intel MKL's SGEMM where it is installed);
- `cpu`: thread counts, load measurement, and the process's default (the CLI's choice,
  applied at the first op: `cpu.apply_default_threads`).

Each op has its reference and at most one fast form (`kernels.register` refuses a second),
tested equal to it (tests/test_kernels.py with numba off, tests/test_numba_kernels.py on);
docs/kernels.md lists them with their count of forms.

Nothing in the glass imports this package: importing it (which `import glassllm` does) plugs
the engine into the glass through `glassllm.kernels`. GLASSLLM_KERNELS=reference then runs the
references all the same; the BLAS backend computes every matrix product in both modes.
"""
from .. import kernels
from . import attention, backward, blas, compiled, cpu, decode, fast_decode, ops, optimizer

kernels.register_gemm(blas.matmul)
for _module in (backward, ops, attention, optimizer, compiled, fast_decode):  # one per op
    for _reference, _fast in _module.FAST_FORMS:
        kernels.register(_reference, _fast)
del _module, _reference, _fast
