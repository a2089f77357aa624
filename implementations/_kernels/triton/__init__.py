"""The fused Triton attention kernels for CUDA, one module per part, named by what it holds.

The way in is :mod:`.masked_attention`: ``triton_attention`` (autograd), the dispatch rule
``use_triton``, ``masked_reasons``, executed pairs and workspace; ``flash-tiled``, ``local``,
``dilated``, ``longformer`` and ``bigbird`` call it on CUDA. Below it, in the order a call runs:

- :mod:`.attention_launches`: one forward or backward call as kernel launches (grids, arguments, the
  block sizes the autotuner chose);
- :mod:`.kernel_launch`: how one launch runs (autotuned, pinned by ``ATTNBENCH_AUTOTUNE=off``,
  forced) and who watches it;
- the kernels: :mod:`.forward` (the fused forward, band and block lists), :mod:`.backward`
  (delta, dQ, dK/dV over the band), :mod:`.backward_blocks` (dQ, dK/dV over block lists),
  :mod:`.decode_split_kv` (split-KV decode and its combine), :mod:`.paged_decode` (split-KV
  decode over a paged KV cache: ``paged_decode_attention``, the decode scenario's paged
  cache calls it), all built from :mod:`.primitives` (the ``@triton.jit`` building blocks);
- the plan, built on the host without Triton: :mod:`.band_plan` (band slots),
  :mod:`.blocklist_plan` (BigBird block lists), :mod:`.plan_tables` (both as cached device
  tables, and the autotuner's key);
- :mod:`.autotune`: the configs per kernel, head dim and GPU, and the measured defaults;
- :mod:`.aot_check`: ahead-of-time compiles for sm_90 and sm_80 and their gates
  (``benchmarks/aot_kernels.py``), read by :mod:`.cubin` (registers, stack, SASS);
- :mod:`.interpreter`: Triton's interpreter (``TRITON_INTERPRET=1``, the CPU tests) without
  its idle work, applied by :mod:`.kernel_launch`.

This package's name is ``triton`` inside ``implementations._kernels``; its modules import the
Triton library as ``import triton`` (absolute imports), never this package.
"""
