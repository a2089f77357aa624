"""Built-in attention implementations, one module per family.

Each module registers its implementations with :func:`harness.registry.register` at import and
imports only the harness's public surface (:mod:`harness.spec`, :mod:`harness.registry`,
:mod:`harness.masks`). Modules whose name starts with ``_`` are shared helpers, not plug-ins;
:mod:`.triton_kernels`, the fused Triton kernels' public face for the benchmarks, registers
nothing.
"""
