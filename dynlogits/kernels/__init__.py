"""Fused device kernels (Triton) behind registered torch custom ops (``fused``): each op's CPU
implementation is its eager reference, its CUDA implementation launches a declared number of
kernels. Triton is imported only when a CUDA tensor reaches a kernel.

Specialization (each kernel's ``triton.jit`` flags): every runtime int is in ``do_not_specialize`` (row and
entry counts, widths, positions, lengths, and the deployment constants too: vocab, row strides,
matrix widths) and every pointer in ``do_not_specialize_on_alignment``. Triton would otherwise key a
compiled variant on whether each int equals 1 or is divisible by 16 and each address is 16-byte
aligned; the load-time probe's sizes and fresh tensors differ from an engine's (its batch, window,
vocab, offset views), and a variant it did not compile compiles inside an engine step, the whole
batch waiting. The cost: no load vectorized on a proven 16-divisible stride or address (these loads
are per-row gathers or masked row slices). Only the innermost strides (1 in engines and probes:
a contiguous row) stay specialized; the variants left are the constexprs' and the dtypes'
(``tests/kernels/test_kernel_specialization.py``).
A kernel module that keeps an argument keyed says which and why."""
