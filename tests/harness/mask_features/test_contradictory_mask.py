"""A contradictory mask (a query row inside the keys that keeps no key) gets one error, from
:func:`harness.masks.check_rows`, on every path, before anything runs.

The named fields cannot make one (each keeps a row's diagonal: a window of 0 on both sides keeps
the query's own key here, the inclusive rule of docs/masks.md); a predicate feature can: "even
keys only" with a window of 0 on both sides leaves every odd row with nothing. Rows before the
first key (n_q > n_k) that the other rules give no key output zeros, as before; one that they
give keys and the predicate empties is a contradiction too."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from harness import registry
from harness.mask_features.predicate import PredicateFeature
from harness.masks import MaskError, MaskSpec, block_pair_counts, check_rows, dense_mask, kept_pairs
from harness.oracle.reference import reference_attention
from tests.conftest import make_qkv


@dataclass(frozen=True)
class EvenKeys(PredicateFeature):
    """Only keys at even positions."""

    name = "even-keys"

    def keep(self, p, j):
        return j % 2 == 0


try:
    import triton

    @triton.jit
    def even_keys_keep(p, j):
        return j % 2 == 0

    EvenKeys.triton_keep = even_keys_keep
except ImportError:
    pass

@dataclass(frozen=True)
class NotKeyZero(PredicateFeature):
    """Every key but the first."""

    name = "not-key-zero"

    def keep(self, p, j):
        return j != 0


N = 9
SPEC = MaskSpec(window=(0, 0), extra=(EvenKeys(),))
MESSAGE = (r"^contradictory mask window=\(0,0\),even-keys: query row 1 \(position 1\) keeps no "
           r"key \(4 such rows of 9\); the predicate features \['even-keys'\] remove every key "
           r"the other rules keep there$")


def _qkv():
    return make_qkv(1, 2, N, N, 16, seed=1)


def _triton(q, k, v):
    pytest.importorskip("triton")
    from implementations._kernels.triton.masked_attention import triton_attention

    return triton_attention(q, k, v, SPEC)


def _tiles(q, k, v):
    from implementations._kernels.tiles.tile_attention import tile_attention
    from implementations._kernels.tiles.tile_plan import tile_plan

    return tile_attention(q, k, v, tile_plan(SPEC, N, N, q.dtype, "cpu"))


def _registered(name: str):
    return lambda q, k, v: registry.get(name)(q, k, v, SPEC)


def _flex_block_mask(q, k, v):
    from implementations._flex_masks import build_block_mask

    return build_block_mask(SPEC, N, N, "cpu")


PATHS = {
    "reference": lambda q, k, v: reference_attention(q, k, v, SPEC),
    "dense rule": lambda q, k, v: dense_mask(SPEC, N, N),
    "count": lambda q, k, v: kept_pairs(SPEC, N, N),
    "block plan": lambda q, k, v: block_pair_counts(SPEC, N, N, 4, 4),
    "cpu tiles": _tiles,
    "flex block mask": _flex_block_mask,
    "triton": _triton,
    **{name: _registered(name)
       for name in ("full", "sdpa", "local", "longformer", "flash-tiled", "flex-local")},
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_path_gives_the_one_error(path):
    with pytest.raises(MaskError, match=MESSAGE):
        PATHS[path](*_qkv())


def test_a_mask_with_keys_for_every_row_passes():
    check_rows(MaskSpec(window=(1, 0), extra=(EvenKeys(),)), N, N)  # odd rows keep j - 1
    check_rows(MaskSpec(window=(0, 0)), N, N)  # the diagonal: one key per row
    check_rows(MaskSpec(causal=True, extra=(EvenKeys(),)), 12, 5)  # rows before key 0: zeros
    with pytest.raises(MaskError, match=r"query row 8 \(position 1\)"):
        check_rows(MaskSpec(causal=True, window=(0, 0), extra=(EvenKeys(),)), 12, 5)
    # window (0, 1) over 5 keys: row 1 (position -1) keeps key 0 alone, which the predicate drops
    with pytest.raises(MaskError, match=r"query row 1 \(position -1\) keeps no key \(1 such"):
        check_rows(MaskSpec(window=(0, 1), extra=(NotKeyZero(),)), 7, 5)


def test_rows_before_the_first_key_still_output_zeros():
    spec = MaskSpec(causal=True, extra=(EvenKeys(),))
    q, k, v = make_qkv(1, 2, 12, 5, 16, seed=2, dtype=torch.float64)
    out = registry.get("full")(q, k, v, spec)
    assert torch.equal(out[..., :7, :], torch.zeros_like(out[..., :7, :]))
    torch.testing.assert_close(out, reference_attention(q, k, v, spec))
