"""``local``, ``dilated``, ``longformer``: sliding-window attention that computes only the band.

Both paths are :mod:`implementations._sparse_paths`. On CUDA (fp32/fp16/bf16, D <= 256) all
three run the fused Triton kernels of :mod:`implementations._kernels.triton.masked_attention`:
one launch per call, the band computed
arithmetically per query block, forward and backward fused (``masked_reasons`` refuses the mask
features those kernels lack, rather than computing another mask). On CPU, and for float64,
they run the CPU tile path (:mod:`implementations._kernels.tiles.tile_attention`) over its
plan's band tiles: query blocks of 64 rows each attend to the key span
``[first - left, last + right]`` of the block (a view, no copy), so a causal window of w keys
costs ``64 + w - 1`` executed keys per query: time and memory O(n·w), never O(n²).

- ``local``: window ``(left, right)``, causal or not; a bidirectional prefix (prefix-LM).
- ``dilated``: Longformer's dilated window. Queries and keys are regrouped into the d residue
  classes ``p mod d`` (a permutation, O(n) copies), where the dilated window is a plain band:
  cost O(n·w), not O(n·w·d).
- ``longformer``: window (optionally dilated) plus global tokens, the first g or at named
  positions: each band tile also takes the global keys (up to its causal bound), and global
  rows take every key up to theirs: O(n·(w + g)). A plug-in feature of visible runs
  (:class:`harness.mask_features.RunsFeature`, e.g. attention sinks) runs here the same way.

All three take packed documents: each document is planned as its own sequence (equal
documents are folded into the batch), so no tile holds a key outside its rows' document and
the work is Σ over documents, not n².
"""

from __future__ import annotations

from harness.registry import register
from harness.spec import FLOAT_DTYPES, Capabilities
from implementations._kernels.triton.masked_attention import masked_reasons
from implementations._sparse_paths import COST, prepare, sparse_attention

_PACKED = {"causal", "window", "documents", "prefix", "predicate"}
_VARIANTS = {
    "local": (_PACKED, "sliding window computed band tile by band tile, O(n·w)"),
    "dilated": (
        _PACKED | {"dilation"},
        "dilated sliding window via residue classes, O(n·w) for any dilation",
    ),
    "longformer": (
        _PACKED | {"dilation", "global", "global_positions"},
        "sliding (dilated) window plus global rows and columns, O(n·(w+g))",
    ),
}

for _name, (_features, _description) in _VARIANTS.items():
    register(
        _name,
        family="local",
        caps=Capabilities(dtypes=FLOAT_DTYPES, mask_features=_features),
        cost=COST,
        description=_description,
        extra_reasons=masked_reasons,
        prepare=prepare,
    )(sparse_attention)
