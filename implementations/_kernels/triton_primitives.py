"""The ``@triton.jit`` building blocks that the forward and backward kernels share: the band's
key ranges, masked tile loads, the fp32 dot and the mask rule (Triton inlines them).

Positions are absolute (query position ``p = i + n_k - n_q``, key ``j``: bottom-right
aligned, as :mod:`harness.masks`); tiles are (rows, BLOCK_D) with BLOCK_D the head dim D
padded to a power of two.
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG: tl.constexpr = tl.constexpr(-1.0e30)  # finite "minus infinity": no inf - inf


@triton.jit
def band_ranges(x0, x1, lo_rel, hi_rel, lo_bound, hi_bound, BLOCK: tl.constexpr):
    """Partners of rows [x0, x1] in a band: [lo, hi_x), the middle [mid, post) of whole
    BLOCK-wide steps that every row keeps (no mask), and the masked edges around it."""
    lo = tl.maximum(x0 + lo_rel, lo_bound)
    hi_x = tl.minimum(x1 + hi_rel + 1, hi_bound)
    safe_lo = tl.maximum(x1 + lo_rel, lo)
    safe_hi = tl.minimum(x0 + hi_rel + 1, hi_x)
    mid = lo + tl.cdiv(tl.maximum(safe_lo - lo, 0), BLOCK) * BLOCK
    post = mid + tl.maximum(safe_hi - mid, 0) // BLOCK * BLOCK
    return lo, hi_x, mid, post


@triton.jit
def load_rows(ptrs, ok, D: tl.constexpr, BLOCK_D: tl.constexpr, USE_OK: tl.constexpr):
    """Load a (rows, BLOCK_D) tile, rows masked by ``ok`` when USE_OK. The head-dim mask is
    emitted only when D is padded: a mask that varies along the contiguous dim would turn the
    vectorized loads into scalar ones."""
    dd = tl.arange(0, BLOCK_D)
    if USE_OK:
        if BLOCK_D == D:
            x = tl.load(ptrs, mask=ok[:, None], other=0.0)
        else:
            x = tl.load(ptrs, mask=ok[:, None] & (dd[None, :] < D), other=0.0)
    else:
        if BLOCK_D == D:  # noqa: SIM108 (a constexpr branch, one load compiled)
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=dd[None, :] < D, other=0.0)
    return x


@triton.jit
def mma(a, b, acc, PRECISION: tl.constexpr):
    """``a @ b (+ acc)`` in fp32. PRECISION "upcast": operands cast to fp32 first (the
    interpreter's bf16 ``tl.dot`` is wrong; compiled kernels never take this branch)."""
    if PRECISION == "upcast":
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out


@triton.jit
def keep_mask(p, j, row_ok, col_ok, lo, hi, g, hg):
    """The mask rule on absolute positions p (rows), j (cols): band ``lo <= j - p <= hi`` or a
    global key ``j < g`` within ``j - p <= hg`` (causality), inside valid rows and columns."""
    rel = j[None, :] - p[:, None]
    keep = ((rel >= lo) & (rel <= hi)) | ((j[None, :] < g) & (rel <= hg))
    return keep & row_ok[:, None] & col_ok[None, :]
