"""Kernels the implementations share: the CPU tile path (plans, the tile kernel, its thread pool)
and the fused Triton kernels for CUDA (plans, forward, backward, launch, autotuning)."""
