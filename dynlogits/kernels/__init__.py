"""Fused device kernels (Triton) behind registered torch custom ops (``fused``): each op's CPU
implementation is its eager reference, its CUDA implementation launches a declared number of
kernels. Triton is imported only when a CUDA tensor reaches a kernel."""
