"""Floating-point dtypes by name, and their sizes: the one place that says which dtypes a
point may use and how many bytes an element takes."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
FLOAT_DTYPES = frozenset(DTYPES.values())
HALF_DTYPES = frozenset({torch.float16, torch.bfloat16})


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a name from :data:`DTYPES` (a torch dtype passes through)."""
    return DTYPES[dtype] if isinstance(dtype, str) else dtype


def itemsize(dtype: str | torch.dtype) -> int:
    """Bytes per element of a dtype name (``"bfloat16"`` -> 2) or torch dtype."""
    return torch_dtype(dtype).itemsize
