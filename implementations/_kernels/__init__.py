"""Kernels the implementations share, one folder per family, each with one module as the way in:

- :mod:`.tiles`: the CPU tile path (way in: :mod:`.tiles.tile_attention`), exact masked
  attention as batched GEMMs over the tiles of a plan; ``local``, ``dilated``, ``longformer``
  and ``bigbird`` on CPU and in float64;
- :mod:`.saved_lse`: the autograd both share (forward keeps the row log-sum-exp, backward
  recomputes from it);
- :mod:`.triton`: the fused Triton kernels for CUDA (way in: :mod:`.triton.masked_attention`),
  FlashAttention-2 forward, backward and split-KV decode with the masks computed in the
  kernels; ``flash-tiled``, ``local``, ``dilated``, ``longformer`` and ``bigbird`` on CUDA.
"""
