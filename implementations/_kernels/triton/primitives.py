"""The ``@triton.jit`` building blocks that the forward, backward and decode kernels share: an
own block's positions and partner interval, the loop bounds of its walk and its key blocks, the
cross span over global partners, the one-compare mask, a CSR row's lanes, masked tile loads
and the fp32 dot (Triton inlines them).

*Own* positions are the tile's rows (queries in the forward and dQ, keys in dK/dV), *partners*
the positions it walks. Positions are absolute (query position ``p = i + n_k - n_q``, key
``j``: bottom-right aligned, as :mod:`harness.masks`); slots and coordinates as
:mod:`.band_plan`. Tiles are (rows, BLOCK_D) with BLOCK_D the head dim D padded to a power
of two. Each mask clause (prefix, documents, global tokens, dilation)
is a ``tl.constexpr``: a kernel compiled without it carries no code for it. With documents,
global tokens and the prefix are each document's own (counted from its start): the plan lists
the globals as absolute positions, and :func:`own_bounds` offsets the prefix by the start.
Under dilation the prefix is a span apart (:func:`prefix_bounds`): the cross span over
global positions then starts past an own's prefix.
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG: tl.constexpr = tl.constexpr(-1.0e30)  # finite "minus infinity": no inf - inf
# a row max below this has seen no kept key: the exponent's bias is clamped here, so masked
# scores (NEG) give exp2(-huge) = 0 rather than exp2(0) = 1
HALF_NEG: tl.constexpr = tl.constexpr(-5.0e29)
EMPTY: tl.constexpr = tl.constexpr(-(1 << 30))  # the start of an empty interval


@triton.jit
def own_block(SP, GPOS, pid, BLOCK: tl.constexpr):
    """Own block ``pid`` of slot ``SP``: own coordinates ``x`` (BLOCK,), positions ``p``,
    validity ``ok``, the first and last valid own (x0, p0, x1, p1) and the slot's class
    (r, step). A TABLE slot's owns are the global positions ``GPOS[x]`` (then x = p)."""
    r, step, x_start, n_own = tl.load(SP), tl.load(SP + 1), tl.load(SP + 2), tl.load(SP + 3)
    flags = tl.load(SP + 8)
    a0 = x_start + pid * BLOCK
    a = a0 + tl.arange(0, BLOCK)
    ok = a < x_start + n_own
    a1 = tl.minimum(a0 + BLOCK, x_start + n_own) - 1
    x, p, x0, p0, x1, p1 = own_positions(GPOS, a, ok, a0, a1, r, step, flags)
    return x, p, ok, x0, p0, x1, p1, r, step, flags


@triton.jit
def own_positions(GPOS, a, ok, a0, a1, r, step, flags):
    """(x, p, x0, p0, x1, p1): the own coordinates and positions of a slot's owns at slot
    coordinates ``a`` (valid ``ok``), its first ``a0`` and last ``a1``. A TABLE slot's owns are
    the global positions ``GPOS[a]`` (then x = p); a class slot's are ``r + step·a``."""
    if (flags & 2) != 0:
        p = tl.load(GPOS + a, mask=ok, other=0)
        p0, p1 = tl.load(GPOS + a0), tl.load(GPOS + a1)
        x, x0, x1 = p, p0, p1
    else:
        p = r + step * a
        p0, p1 = r + step * a0, r + step * a1
        x, x0, x1 = a, a0, a1
    return x, p, x0, p0, x1, p1


@triton.jit
def own_bounds(x, p, ok, SP, P, DS, DE, PREFIX: tl.constexpr, DOCS: tl.constexpr,
               DILATED: tl.constexpr):
    """[lo, hi] (class coordinates, inclusive) of the partners that owns ``x`` at positions
    ``p`` keep, scalars or vectors: the window ``[x + lo_rel, x + hi_rel]``, joined with the
    prefix ``[0, P)`` when ``p < P`` (a row before the first key counts as position 0), cut to
    p's document, then to the slot's partner range. With documents ``[ds, de)`` the prefix is
    the document's own: ``p - ds < P`` keeps ``[ds, ds + P)``. Both ends are nondecreasing in
    x. Only a slot of step 1 joins the prefix: a dilated class slot (step > 1) walks it as a
    span of its own (:func:`prefix_bounds`)."""
    r, step = tl.load(SP), tl.load(SP + 1)
    lo = x + tl.load(SP + 6)
    hi = x + tl.load(SP + 7)
    c_start = tl.load(SP + 4)
    if DOCS:
        ds = tl.load(DS + p, mask=ok, other=0)
        de = tl.load(DE + p, mask=ok, other=0)
        if PREFIX:  # class coordinates are positions in a slot of step 1
            inside = p - ds < P
            if DILATED:
                inside = inside & (step == 1)
            lo = tl.where(inside, tl.minimum(lo, ds), lo)
            hi = tl.where(inside, tl.maximum(hi, ds + P - 1), hi)
        lo = tl.maximum(lo, (ds - r + step - 1) // step)  # numerators >= 0: // is floor
        hi = tl.minimum(hi, (de - 1 - r + step) // step - 1)
    elif PREFIX:
        inside = p < P
        if DILATED:
            inside = inside & (step == 1)
        lo = tl.where(inside, tl.minimum(lo, c_start), lo)  # rows p < 0 too (key slots)
        hi = tl.where(inside, tl.maximum(hi, P - 1), hi)
    lo = tl.maximum(lo, c_start)
    hi = tl.minimum(hi, tl.load(SP + 5) - 1)
    return lo, hi


@triton.jit
def prefix_bounds(p, ok, first, P, DS, DE, DOCS: tl.constexpr):
    """[plo, phi] (absolute positions, inclusive) of the partners that owns at positions ``p``
    keep through the prefix, an empty interval (plo > phi) for owns outside it: the
    document's ``[ds, min(ds + P, de))``, or without documents ``[first, P)`` (``first``: the
    first partner position, 0 for keys, ``n_k - n_q`` for rows, whose rows before the first key
    count as position 0). Used by dilated class slots, whose band is one residue class."""
    if DOCS:
        ds = tl.load(DS + p, mask=ok, other=0)
        inside = ok & (p - ds < P)
        plo = ds
        phi = tl.minimum(ds + P, tl.load(DE + p, mask=ok, other=0)) - 1
    else:
        inside = ok & (p < P)
        plo = first + 0 * p
        phi = P - 1 + 0 * p
    return tl.where(inside, plo, 1 << 30), tl.where(inside, phi, EMPTY)


@triton.jit
def walk(lo0, hi0, lo1, hi1, BLOCK: tl.constexpr):
    """Loop bounds ``lo <= mid <= post <= end`` of an own block whose first own keeps
    [lo0, hi0] and last [lo1, hi1]: partner blocks start at ``lo + i·BLOCK`` below ``end``;
    those in ``[mid, post)`` are kept by every own (no mask), the rest are masked edges."""
    lo = lo0
    end = tl.maximum(hi1 + 1, lo)
    mid = tl.minimum(lo + tl.cdiv(tl.maximum(lo1 - lo, 0), BLOCK) * BLOCK, end)
    post = tl.minimum(mid + tl.maximum(hi0 + 1 - mid, 0) // BLOCK * BLOCK, end)
    return lo, mid, post, end


@triton.jit
def key_block(c0, c_end, r, step, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
              DILATED: tl.constexpr):
    """Class coordinates ``c`` (BLOCK_N,) of the band's key block c0 .. c0 + BLOCK_N and the
    keys' positions ``j`` (r + step·c under dilation). A MASKED block clamps its keys to the
    last, ``c_end - 1`` (no predicated loads): keys past it are outside every row's interval,
    so their scores are masked."""
    c = c0 + tl.arange(0, BLOCK_N)
    if MASKED:
        c = tl.minimum(c, c_end - 1)
    return c, (r + step * c if DILATED else c)


@triton.jit
def edge_start(i, lo, post, n_lo, BLOCK: tl.constexpr):
    """Start of masked block ``i`` of :func:`walk`'s edges: ``n_lo`` blocks from ``lo``, then
    the blocks from ``post``."""
    return tl.where(i < n_lo, lo + i * BLOCK, post + (i - n_lo) * BLOCK)


@triton.jit
def kept(cols, lo, hi):
    """(owns, partners) bool: ``lo[own] <= cols[partner] <= hi[own]`` with one unsigned
    compare per pair (an empty interval, hi < lo, keeps nothing)."""
    width = hi - lo
    start = tl.where(width >= 0, lo, EMPTY)
    width = tl.maximum(width, 0).to(tl.uint32, bitcast=True)
    return (cols[None, :] - start[:, None]).to(tl.uint32, bitcast=True) <= width[:, None]


@triton.jit
def cross_bounds(y, ok, xlo, xhi, DS, DE, DOCS: tl.constexpr):
    """[glo, hi] (absolute positions) of the global partners an own at position ``y`` may
    keep: within ``[y + xlo, y + xhi]`` (causality) and its document."""
    glo = y + xlo
    ghi = y + xhi
    if DOCS:
        glo = tl.maximum(glo, tl.load(DS + y, mask=ok, other=0))
        ghi = tl.minimum(ghi, tl.load(DE + y, mask=ok, other=0) - 1)
    return glo, ghi


@triton.jit
def global_span(p, ok, p0, p1, GIDX, xlo, xhi, first, n_k, P, DS, DE, DOCS: tl.constexpr,
                   PREFIX: tl.constexpr, DILATED: tl.constexpr):
    """The cross span over global partners of an own block: each own's [glo, ghi]
    (:func:`cross_bounds`; under a dilated prefix, past the prefix's end, which the prefix
    span holds) and the entries [e0, e1) of the global partners the block walks, from the
    first own's glo (not before ``first``, the first partner position: 0 for keys, ``off``
    for rows) to the last own's ghi (not past n_k - 1). Owns at positions ``p`` (valid ``ok``),
    the first and last at p0, p1; ``GIDX[y]`` counts the global positions below y."""
    glo, ghi = cross_bounds(p, ok, xlo, xhi, DS, DE, DOCS)
    if PREFIX:  # noqa: SIM102 (compile-time clauses)
        if DILATED:  # the prefix span holds the partners up to the prefix's end
            _, pend = prefix_bounds(p, ok, first, P, DS, DE, DOCS)
            glo = tl.maximum(glo, pend + 1)
    lo_first, _ = cross_bounds(p0, p0 >= 0, xlo, xhi, DS, DE, DOCS)
    _, hi_last = cross_bounds(p1, p1 >= 0, xlo, xhi, DS, DE, DOCS)
    e0 = tl.load(GIDX + tl.maximum(lo_first, first))
    e1 = tl.load(GIDX + tl.minimum(hi_last, n_k - 1) + 1)
    return glo, ghi, e0, e1


@triton.jit
def span_block(GPOS, e, e1, BLOCK: tl.constexpr, GATHER: tl.constexpr):
    """Positions and validity (BLOCK,) of the entries ``ev = e .. e + BLOCK`` of a cross
    span that ends at ``e1``: valid below e1; positions those of the entries clamped to the
    last, ``e1 - 1``: the global positions ``GPOS[ev]`` (GATHER), or ``ev`` itself (the keys or
    rows of a dilated prefix)."""
    ev = e + tl.arange(0, BLOCK)
    ok = ev < e1
    last = tl.minimum(ev, e1 - 1)
    if GATHER:
        return tl.load(GPOS + last), ok
    return last, ok


@triton.jit
def cross_keep(ppos, glo, ghi, lo, hi, r, step, DILATED: tl.constexpr, GATHER: tl.constexpr):
    """(owns, partners) keep of a span of partners at positions ``ppos`` outside the band:
    those in each own's [glo, ghi] (:func:`cross_bounds`, or :func:`prefix_bounds`) and not
    already in its band (class r, class coordinate in [lo, hi]). GATHER (global partners): a
    global row before position 0 is in no class slot's band (a global count's class slots
    start past it); a prefix's rows before position 0 may be."""
    keep = kept(ppos, glo, ghi)
    if DILATED:
        rel = ppos - r
        if GATHER:  # noqa: SIM108 (a constexpr branch, one test compiled)
            in_class = (rel >= 0) & (rel % step == 0)
        else:
            in_class = rel % step == 0  # exact for rel < 0 too (C or floor remainder)
        band = kept(rel // step, lo, hi) & in_class[None, :]
    else:
        band = kept(ppos, lo, hi)
    return keep & ~band


@triton.jit
def allowed(own, partners, ds, PRED: tl.constexpr, OWN_ROWS: tl.constexpr):
    """(owns, partners) bool: a predicate feature's ``PRED(query position, key)`` (rule 6 of
    :mod:`harness.masks`) at positions inside each own's document (``ds``: its start, 0
    without documents); the owns are query rows (OWN_ROWS: forward, dQ) or keys (dK/dV)."""
    part = partners[None, :] - ds[:, None]
    mine = (own - ds)[:, None]
    if OWN_ROWS:
        return PRED(mine, part)
    return PRED(part, mine)


@triton.jit
def own_start(p, ok, DS, DOCS: tl.constexpr, PRED: tl.constexpr):
    """The document start of owns at positions ``p``, where a predicate feature reads
    positions (0 without documents; unused and compiled away without PRED)."""
    ds = p * 0
    if PRED is not None:  # noqa: SIM102 (compile-time clauses)
        if DOCS:
            ds = tl.load(DS + p, mask=ok, other=0)
    return ds


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
def csr_rows(Q_POS, row, off, n_q, block, TILE: tl.constexpr):
    """The TILE lanes of CSR row ``row``'s query block: positions ``p`` from ``Q_POS[row]``,
    row indices ``i = p - off`` and validity (within the block's ``block`` rows and [0, n_q))."""
    lane = tl.arange(0, TILE)
    p = tl.load(Q_POS + row) + lane
    i = p - off
    return p, i, (lane < block) & (i >= 0) & (i < n_q)


@triton.jit
def mma(a, b, acc, PRECISION: tl.constexpr):
    """``a @ b (+ acc)`` in fp32. PRECISION "upcast": operands cast to fp32 first (the
    interpreter's bf16 ``tl.dot`` is wrong; compiled kernels never take this branch)."""
    if PRECISION == "upcast":
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out
