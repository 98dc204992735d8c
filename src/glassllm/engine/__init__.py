"""The engine: what makes the glass fast, kept apart from it.

- `parallel`: the thread pool that runs the elementwise passes over slices of rows;
- `blas`: the matrix-product backend (NumPy's BLAS, or Intel MKL's SGEMM where it is installed);
- `cpu`: thread counts, load measurement;
- `decode`: one decoding step over plain arrays, llama2.c's `forward()`.

Nothing in the glass imports this package: the engine plugs its fast forms into the glass
(`glassllm.kernels`) when `glassllm` is imported, unless GLASSLLM_KERNELS=reference.
"""
