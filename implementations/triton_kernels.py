"""The fused Triton kernels' public face, for the benchmarks and tools that drive them.

The kernels live in :mod:`implementations._kernels.triton`, private to the implementations;
the scripts of ``benchmarks/`` (``kernel_sweep.py``, ``aot_kernels.py``, ``lease/warm_cache.py``,
``lease/triton_cache.py``) reach them through this
module only, so a change inside the folder breaks no script that this list does not name.
Not a plug-in: it registers no implementation. The modules load on first use (most import
Triton, an optional dependency, and :mod:`.aot_check` Triton's NVIDIA backend), so importing
this module costs nothing and a missing Triton surfaces where a script asks for a kernel.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what a type checker sees of the lazy attributes below
    from implementations._kernels.triton import (  # noqa: F401 (served by __getattr__)
        aot_check,
        attention_launches,
        autotune,
        band_plan,
        feature_attention,
        fused_path,
        kernel_launch,
        masked_attention,
        plan_tables,
    )

MODULES = ("aot_check", "autotune", "feature_attention", "fused_path", "kernel_launch",
           "attention_launches", "masked_attention", "band_plan", "plan_tables")
"""The kernel folder's modules the scripts use, each an attribute of this module."""
__all__ = [*MODULES, "JIT_MODULES", "MODULES", "import_jit_modules"]

JIT_MODULES = ("forward", "backward", "backward_blocks", "decode_split_kv", "feature_kernels",
               "linear_chunk", "paged_decode")
"""The modules whose ``@triton.jit`` kernels a compile or a cache warm-up reaches."""

_PACKAGE = "implementations._kernels.triton"


def __getattr__(name: str) -> ModuleType:
    """A module of :data:`MODULES`, imported on first use."""
    if name in MODULES:
        return importlib.import_module(f"{_PACKAGE}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The lazy modules too, for ``dir()`` and completion."""
    return sorted({*globals(), *MODULES})


def import_jit_modules(names: tuple[str, ...] = JIT_MODULES) -> list[ModuleType]:
    """Import the kernel modules ``names`` (default :data:`JIT_MODULES`; no other name)."""
    unknown = sorted(set(names) - set(JIT_MODULES))
    if unknown:
        raise ValueError(f"not kernel modules: {unknown} (one of {JIT_MODULES})")
    return [importlib.import_module(f"{_PACKAGE}.{name}") for name in names]
