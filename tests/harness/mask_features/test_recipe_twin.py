"""The twin of test_a_feature_is_a_module.py, written from docs/README.md's recipe "Add a mask
feature" alone: two toy features that nothing else in the project names, one of each form.

- **Landmarks** (runs form): every ``stride``-th key, ``count`` of them, is visible to every
  query (a strided set of global keys, as memory/landmark tokens are), and optionally one
  ``reader`` query position sees every key. Several key runs and a row run, where the toy
  sinks have one key run.
- **Key stride** (predicate form): a pair is allowed when its key is a multiple of
  ``STRIDE`` or lies in the query's own group of ``STRIDE`` positions (a strided block
  pattern with a floor division of ``p``, which is negative for rows before the first key:
  the case where Triton's truncating ``//`` and torch's flooring ``//`` differ).

Each runs on the dense reference, counts exactly, plans its blocks, runs on the CPU tiles,
in Flex's mask mod and block mask, in the fused Triton kernels under the interpreter
(tests/conftest.py sets ``TRITON_INTERPRET=1``), and is refused by name by a path that cannot
run it; a planted removal (and, for the predicate, a planted wrong Triton twin) fails."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from harness import registry
from harness.block_plan import FULL, PARTIAL, SKIP, block_plan
from harness.mask_features import MaskError, RunsFeature
from harness.mask_features.predicate import PredicateFeature
from harness.masks import MaskSpec, block_pair_counts, check_rows, dense_mask, kept_pairs
from harness.oracle.reference import reference_attention
from harness.spec import Problem
from implementations._kernels.tiles.tile_attention import tile_attention
from implementations._kernels.tiles.tile_plan import plan_shape, tile_plan
from tests.conftest import make_qkv

BLOCK = 16  # the block plan's block in these tests


# --- the runs form ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Landmarks(RunsFeature):
    """Keys ``0, stride, ..., (count - 1) * stride`` are visible to every query (before
    causality); the query position ``reader`` (None: none) sees every key."""

    stride: int = 16
    count: int = 4
    reader: int | None = None
    name = "landmarks"  # a class attribute, not a field: no annotation

    def key_runs(self):
        return tuple((k * self.stride, k * self.stride + 1) for k in range(self.count))

    def row_runs(self):
        return () if self.reader is None else ((self.reader, self.reader + 1),)

    def check(self) -> None:
        if self.stride < 1 or self.count < 1:
            raise ValueError(f"stride and count must be >= 1, got {self.stride}, {self.count}")
        if self.reader is not None and self.reader < 0:
            raise ValueError(f"reader must be >= 0, got {self.reader}")

    def label(self) -> str:
        return f"landmarks={self.count}x{self.stride}"


@dataclass(frozen=True)
class NoLandmarks(Landmarks):
    """The feature's module removed: the same name, no geometry."""

    def key_runs(self):
        return ()

    def row_runs(self):
        return ()


def expected_landmarks(spec: MaskSpec, n_q: int, n_k: int) -> torch.Tensor:
    """The landmarks by hand, on the mask without them: (window | landmark key | reader row)
    & causal."""
    feature = spec.extra[0]
    base = dense_mask(MaskSpec(causal=False, window=spec.window), n_q, n_k)
    p = torch.arange(n_q)[:, None] + n_k - n_q
    j = torch.arange(n_k)[None, :]
    landmark = (j % feature.stride == 0) & (j < feature.count * feature.stride)
    reader = p.clamp_min(0) == (-1 if feature.reader is None else feature.reader)
    keep = base | landmark | reader
    return keep & (j <= p) if spec.causal else keep


def assert_states_match_mask(plan, mask: torch.Tensor) -> None:
    """Every block of a BLOCK x BLOCK plan: SKIP, FULL or PARTIAL exactly as the mask says."""
    states = plan.states()
    for a in range(states.shape[0]):
        for b in range(states.shape[1]):
            tile = mask[a * BLOCK:(a + 1) * BLOCK, b * BLOCK:(b + 1) * BLOCK]
            want = SKIP if not tile.any() else FULL if tile.sum() == BLOCK * BLOCK else PARTIAL
            assert int(states[a, b]) == want, (a, b)


def assert_block_counts(spec: MaskSpec, mask: torch.Tensor, block_q: int, block_k: int) -> None:
    """:func:`block_pair_counts` lists each block's kept pairs as the dense mask has them."""
    n_q, n_k = mask.shape
    qb, kb, counts = block_pair_counts(spec, n_q, n_k, block_q, block_k)
    grid = torch.zeros(-(-n_q // block_q), -(-n_k // block_k), dtype=torch.int64)
    grid.index_put_((torch.arange(n_q)[:, None] // block_q,
                     torch.arange(n_k)[None, :] // block_k), mask.long(), accumulate=True)
    listed = torch.zeros_like(grid)
    listed[torch.from_numpy(qb), torch.from_numpy(kb)] = torch.from_numpy(counts)
    assert torch.equal(listed, grid)


def run_cpu_tiles(spec: MaskSpec, n_q: int, n_k: int, dtype: torch.dtype, dim: int, seed: int):
    """The CPU tiles against float64; their executed pairs as :func:`plan_shape` predicts."""
    q, k, v = make_qkv(1, 2, n_q, n_k, dim, seed=seed, dtype=dtype)
    plan = tile_plan(spec, n_q, n_k, dtype, "cpu")
    out = tile_attention(q, k, v, plan)
    tol = {torch.float32: (2e-5, 1e-4), torch.float64: (1e-10, 1e-10)}[dtype]
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, spec),
                               atol=tol[0], rtol=tol[1])
    assert plan_shape(spec, n_q, n_k, "cpu").executed_pairs == plan.executed_pairs
    return plan


def triton_agreement(spec: MaskSpec, n_q: int, n_k: int, dim: int, seed: int) -> tuple[dict, dict]:
    """The fused kernels under the interpreter: forward and gradient agreement with float64."""
    from harness.oracle.agreement import grad_agreement, output_agreement
    from harness.oracle.reference import reference_grads
    from implementations._kernels.triton import masked_attention

    q, k, v = (t.requires_grad_(True) for t in make_qkv(1, 2, n_q, n_k, dim, seed=seed))
    out = masked_attention.triton_attention(q, k, v, spec)
    ref = reference_attention(q.detach(), k.detach(), v.detach(), spec)
    forward = output_agreement(out.detach(), ref, torch.float32)
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1))
    grads = torch.autograd.grad(out, (q, k, v), g)
    return forward, grad_agreement(grads, reference_grads(q, k, v, g, spec), torch.float32)


SPECS = [  # (spec, n_q, n_k): odd sizes, unequal lengths both ways, a reader row in one
    (MaskSpec(causal=True, window=(6, 0), extra=(Landmarks(20, 4),)), 83, 83),
    (MaskSpec(causal=True, window=(5, 0), extra=(Landmarks(9, 5),)), 29, 70),
    (MaskSpec(window=(3, 2), extra=(Landmarks(13, 3, reader=30),)), 61, 45),
]


@pytest.mark.parametrize(("spec", "n_q", "n_k"), SPECS)
def test_dense_rule_and_closed_form_count(spec, n_q, n_k):
    mask = dense_mask(spec, n_q, n_k)
    assert torch.equal(mask, expected_landmarks(spec, n_q, n_k))
    assert kept_pairs(spec, n_q, n_k) == int(mask.sum())
    assert_block_counts(spec, mask, 16, 8)


def test_removing_the_feature_changes_every_reader():
    """The planted failure: without the feature's geometry the checks above fail."""
    for spec, n_q, n_k in SPECS:
        gone = MaskSpec(causal=spec.causal, window=spec.window,
                        extra=(NoLandmarks(*_fields(spec.extra[0])),))
        assert not torch.equal(dense_mask(gone, n_q, n_k), expected_landmarks(spec, n_q, n_k))
        assert kept_pairs(gone, n_q, n_k) < kept_pairs(spec, n_q, n_k)
        assert (block_plan(gone, n_q, n_k, BLOCK, BLOCK).executed_pairs
                < block_plan(spec, n_q, n_k, BLOCK, BLOCK).executed_pairs)


def _fields(feature: Landmarks) -> tuple:
    return feature.stride, feature.count, feature.reader


@pytest.mark.parametrize(("spec", "n_q", "n_k"), SPECS)
def test_block_plan_skips_what_the_mask_skips(spec, n_q, n_k):
    plan = block_plan(spec, n_q, n_k, BLOCK, BLOCK)
    assert_states_match_mask(plan, dense_mask(spec, n_q, n_k))
    heights = np.minimum(BLOCK, n_q - plan.qb * BLOCK)
    widths = np.minimum(BLOCK, n_k - plan.kb * BLOCK)
    assert plan.executed_pairs == int((heights * widths).sum()) < n_q * n_k


@pytest.mark.parametrize(("spec", "n_q", "n_k"), SPECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_tiles(spec, n_q, n_k, dtype):
    plan = run_cpu_tiles(spec, n_q, n_k, dtype, 23, seed=3)
    assert kept_pairs(spec, n_q, n_k) <= plan.executed_pairs < n_q * n_k


def test_flex_mask_mod_and_block_mask_read_the_feature():
    from implementations._flex_masks import BLOCK as FLEX_BLOCK
    from implementations._flex_masks import block_counts, mask_mod_for

    spec = MaskSpec(causal=True, window=(20, 0), extra=(Landmarks(140, 2, reader=200),))
    n_q = n_k = 300
    mod = mask_mod_for(spec, n_q, n_k, "cpu")
    zero = torch.zeros((), dtype=torch.int64)
    q_idx, kv_idx = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    mask = dense_mask(spec, n_q, n_k)
    assert torch.equal(mod(zero, zero, q_idx, kv_idx), mask)
    any_, full, executed = block_counts(spec, n_q, n_k)
    assert executed == block_plan(spec, n_q, n_k, FLEX_BLOCK, FLEX_BLOCK).executed_pairs
    # keys 0 and 140 and the reader row 200 reach blocks the window alone does not
    assert any_.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert not bool(full.any())


@pytest.mark.slow
def test_flex_compiled_runs_it():
    """One compile of ``flex-local`` (CPU inductor): the landmarks through its BlockMask and
    mask mod, against float64; its executed pairs are the block plan's."""
    flex = registry.get("flex-local")
    if flex.unavailable_reason() is not None:
        pytest.skip(flex.unavailable_reason())
    spec, n_q, n_k = MaskSpec(causal=True, window=(20, 0),
                              extra=(Landmarks(140, 2, reader=200),)), 300, 300
    q, k, v = make_qkv(1, 2, n_q, n_k, 32, seed=7)
    out = flex(q, k, v, spec)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, spec),
                               atol=2e-5, rtol=1e-4)
    problem = Problem(1, 2, n_q, n_k, 32, mask=spec)
    assert flex.cost.executed_pairs(problem) == block_plan(spec, n_q, n_k, 128, 128).executed_pairs


def test_a_bad_feature_is_refused_in_one_line():
    with pytest.raises(MaskError, match=r"^landmarks: stride and count must be >= 1, got 0, 4$"):
        MaskSpec(causal=True, extra=(Landmarks(0, 4),))
    with pytest.raises(MaskError, match=r"\['landmarks'\] cannot be combined with block_size"):
        MaskSpec(block_size=16, extra=(Landmarks(16, 2),))


@pytest.mark.parametrize(("spec", "n_q", "n_k"), SPECS)
def test_triton_kernels_in_the_interpreter(spec, n_q, n_k):
    """The fused band kernels: the landmarks are their global keys, the reader a global row."""
    pytest.importorskip("triton")
    from implementations._kernels.triton.band_plan import band_executed_pairs, band_plan

    forward, backward = triton_agreement(spec, n_q, n_k, 16, seed=5)
    assert forward["agree"] and backward["grad_agree"], (forward, backward)
    plan = band_plan(spec, n_q, n_k)
    feature = spec.extra[0]
    assert plan.key_globals == tuple(k * feature.stride for k in range(feature.count))
    assert plan.row_globals == (() if feature.reader is None else (feature.reader,))
    executed = band_executed_pairs(plan, 16, 16)
    assert kept_pairs(spec, n_q, n_k) <= executed < 4 * n_q * n_k


# --- the predicate form ----------------------------------------------------------------------

STRIDE = 40


@dataclass(frozen=True)
class KeyStride(PredicateFeature):
    """Keys that are multiples of ``STRIDE``, and every key of the query's own group of
    ``STRIDE`` positions (groups by floor division: a row before the first key is in none)."""

    name = "key-stride"

    def keep(self, p, j):
        return (j % STRIDE == 0) | (torch.div(p, STRIDE, rounding_mode="floor") == j // STRIDE)

    def classify(self, p0, p1, j0, j1):
        has_multiple = -(-j0 // STRIDE) * STRIDE < j1  # some key in [j0, j1) is a multiple
        kg0, kg1 = j0 // STRIDE, (j1 - 1) // STRIDE  # the key groups met (numpy floors)
        pg0, pg1 = p0 // STRIDE, (p1 - 1) // STRIDE  # the row groups met
        overlap = (np.maximum(kg0, pg0) <= np.minimum(kg1, pg1))
        same_one = (kg0 == kg1) & (pg0 == pg1) & (kg0 == pg0)  # one group for all
        single_multiple = (j1 - j0 == 1) & (j0 % STRIDE == 0)
        out = np.full(np.shape(p0), PARTIAL, dtype=np.int8)
        out[~has_multiple & ~overlap] = SKIP
        out[same_one | single_multiple] = FULL
        return out


try:
    import triton
    import triton.language as tl  # noqa: F401  (the interpreter asserts it is a module global)

    @triton.jit
    def key_stride_keep(p, j):
        # 40 = STRIDE: a jitted function reads no Python global. Triton's // truncates
        # towards zero, so -39 // 40 is 0 (torch: -1): only rows at p >= 0 have a group.
        return (j % 40 == 0) | ((p >= 0) & (p // 40 == j // 40))

    @triton.jit
    def key_stride_truncating(p, j):
        return (j % 40 == 0) | (p // 40 == j // 40)  # the planted error: p < 0 joins group 0

    KeyStride.triton_keep = key_stride_keep
except ImportError:  # the fused kernels then refuse the feature by name
    triton = None


@dataclass(frozen=True)
class NoStride(KeyStride):
    """The feature's module removed: the same name, every pair allowed."""

    def keep(self, p, j):
        return (p == p) | (j == j)

    def classify(self, p0, p1, j0, j1):
        return np.full(np.shape(p0), FULL, dtype=np.int8)


@dataclass(frozen=True)
class TruncatingStride(KeyStride):
    """The torch predicate right, the Triton twin written with a truncating ``//``."""

    name = "key-stride-truncating"
    triton_keep = f"{__name__}:key_stride_truncating"


def expected_stride(spec: MaskSpec, n_q: int, n_k: int) -> torch.Tensor:
    """The stride by hand, on the mask without it."""
    base = dense_mask(MaskSpec(causal=spec.causal, window=spec.window,
                               global_tokens=spec.global_tokens), n_q, n_k)
    p = torch.arange(n_q)[:, None] + n_k - n_q
    j = torch.arange(n_k)[None, :]
    own = (p >= 0) & (p // STRIDE == j // STRIDE)
    return base & ((j % STRIDE == 0) | own)


STRIDE_SPECS = [  # odd sizes, unequal lengths both ways (rows before the first key), globals
    (MaskSpec(causal=True, window=(50, 0), extra=(KeyStride(),)), 97, 97),
    (MaskSpec(causal=True, window=(45, 0), extra=(KeyStride(),)), 45, 131),
    (MaskSpec(window=(20, 9), global_tokens=2, extra=(KeyStride(),)), 97, 70),
]


@pytest.mark.parametrize(("spec", "n_q", "n_k"), STRIDE_SPECS)
def test_predicate_dense_rule_count_and_block_plan(spec, n_q, n_k):
    check_rows(spec, n_q, n_k)  # no row emptied: not a contradictory mask
    mask = dense_mask(spec, n_q, n_k)
    assert torch.equal(mask, expected_stride(spec, n_q, n_k))
    assert kept_pairs(spec, n_q, n_k) == int(mask.sum())
    assert_block_counts(spec, mask, 16, 8)
    plan = block_plan(spec, n_q, n_k, BLOCK, BLOCK)
    assert_states_match_mask(plan, mask)
    assert int(plan.count.sum()) == int(mask.sum())
    without = block_plan(MaskSpec(causal=spec.causal, window=spec.window,
                                  global_tokens=spec.global_tokens), n_q, n_k, BLOCK, BLOCK)
    assert plan.executed_pairs < without.executed_pairs  # the classification skips blocks


def test_the_classification_is_sound_on_every_rectangle():
    """classify against the predicate itself, on every rectangle of a small grid (p < 0 too)."""
    feature = KeyStride()
    spans = [(a, b) for a in range(-50, 130, 7) for b in range(a + 1, a + 60, 11)]
    p0, p1 = np.array([s[0] for s in spans]), np.array([s[1] for s in spans])
    keys = [(a, b) for a in range(0, 130, 9) for b in range(a + 1, a + 60, 13)]
    for j0, j1 in keys:
        states = feature.classify(p0, p1, np.full_like(p0, j0), np.full_like(p0, j1))
        for (a, b), state in zip(spans, states, strict=True):
            allowed = feature.keep(torch.arange(a, b)[:, None], torch.arange(j0, j1)[None, :])
            if state == SKIP:
                assert not bool(allowed.any()), (a, b, j0, j1)
            elif state == FULL:
                assert bool(allowed.all()), (a, b, j0, j1)


def test_removing_the_predicate_changes_every_reader():
    """The planted failure: without the feature's geometry the checks above fail."""
    spec, n_q, n_k = STRIDE_SPECS[0]
    gone = MaskSpec(causal=True, window=(50, 0), extra=(NoStride(),))
    assert not torch.equal(dense_mask(gone, n_q, n_k), expected_stride(spec, n_q, n_k))
    assert kept_pairs(gone, n_q, n_k) > kept_pairs(spec, n_q, n_k)
    assert (block_plan(gone, n_q, n_k, BLOCK, BLOCK).executed_pairs
            > block_plan(spec, n_q, n_k, BLOCK, BLOCK).executed_pairs)


@pytest.mark.parametrize(("spec", "n_q", "n_k"), STRIDE_SPECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_predicate_on_cpu_tiles(spec, n_q, n_k, dtype):
    plan = run_cpu_tiles(spec, n_q, n_k, dtype, 59, seed=9)
    assert kept_pairs(spec, n_q, n_k) < plan.executed_pairs < n_q * n_k


@pytest.mark.parametrize(("runs", "refuses", "reason", "spec", "n_q", "n_k"), [
    ("longformer", "local", "mask features ['landmarks'] not supported", *SPECS[0]),
    ("local", "sdpa", "mask features ['key-stride', 'window'] not supported", *STRIDE_SPECS[0]),
])
def test_a_registered_path_runs_it_and_another_refuses_it_by_name(
        runs, refuses, reason, spec, n_q, n_k):
    problem = Problem(1, 2, n_q, n_k, 16, mask=spec)
    assert registry.get(runs).not_supported(problem) == []
    q, k, v = make_qkv(1, 2, n_q, n_k, 16, seed=4, dtype=torch.float64)
    out = registry.get(runs)(q, k, v, spec)
    torch.testing.assert_close(out, reference_attention(q, k, v, spec), atol=1e-10, rtol=1e-10)
    assert registry.get(refuses).not_supported(problem) == [reason]


def test_flex_mask_mod_and_block_mask_read_the_predicate():
    from implementations._flex_masks import BLOCK as FLEX_BLOCK
    from implementations._flex_masks import block_counts, mask_mod_for

    spec, n_q, n_k = MaskSpec(causal=True, window=(200, 0), extra=(KeyStride(),)), 300, 300
    mod = mask_mod_for(spec, n_q, n_k, "cpu")
    zero = torch.zeros((), dtype=torch.int64)
    q_idx, kv_idx = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    assert torch.equal(mod(zero, zero, q_idx, kv_idx), dense_mask(spec, n_q, n_k))
    any_, full, executed = block_counts(spec, n_q, n_k)
    plan = block_plan(spec, n_q, n_k, FLEX_BLOCK, FLEX_BLOCK)
    assert executed == plan.executed_pairs
    assert torch.equal(any_, plan.states() != SKIP) and not bool(full.any())


@pytest.mark.parametrize(("spec", "n_q", "n_k"), STRIDE_SPECS)
def test_predicate_in_the_triton_kernels(spec, n_q, n_k):
    """The fused band kernels under the interpreter with the @triton.jit twin as their PRED
    constexpr, forward and gradients against float64 (D = 59)."""
    pytest.importorskip("triton")
    from implementations._kernels.triton.band_plan import band_executed_pairs, band_plan

    plan = band_plan(spec, n_q, n_k)
    assert plan.flags["PRED"] is key_stride_keep
    forward, backward = triton_agreement(spec, n_q, n_k, 59, seed=11)
    assert forward["agree"] and backward["grad_agree"], (forward, backward)
    assert kept_pairs(spec, n_q, n_k) < band_executed_pairs(plan, 16, 16)


def test_a_truncating_triton_twin_is_caught():
    """The planted Triton error: a twin whose ``//`` truncates puts rows before the first key
    in group 0; the interpreter's output then disagrees with float64."""
    pytest.importorskip("triton")
    base, n_q, n_k = STRIDE_SPECS[2]
    spec = MaskSpec(window=base.window, global_tokens=base.global_tokens,
                    extra=(TruncatingStride(),))
    forward, _ = triton_agreement(spec, n_q, n_k, 16, seed=12)
    assert not forward["agree"], forward


def test_predicate_with_documents_reads_document_positions():
    """Rule 6 inside each document: the groups restart at each document's first key."""
    spec, n = MaskSpec(causal=True, window=(60, 0), documents=(37, 60),
                       extra=(KeyStride(),)), 97
    mask = dense_mask(spec, n, n)
    assert bool(mask[37 + 45, 37 + 40]) and not bool(mask[37 + 45, 37 + 39])
    assert kept_pairs(spec, n, n) == int(mask.sum())
    q, k, v = make_qkv(1, 2, n, n, 16, seed=13, dtype=torch.float64)
    out = tile_attention(q, k, v, tile_plan(spec, n, n, torch.float64, "cpu"))
    torch.testing.assert_close(out, reference_attention(q, k, v, spec), atol=1e-10, rtol=1e-10)
    if triton is None:
        return
    from implementations._kernels.triton import masked_attention

    q32, k32, v32 = (t.float() for t in (q, k, v))
    out = masked_attention.triton_attention(q32, k32, v32, spec)
    torch.testing.assert_close(out.double(), reference_attention(q32, k32, v32, spec),
                               atol=2e-5, rtol=1e-4)


def test_a_predicate_that_empties_a_row_is_refused():
    """The stride never empties a row (every row keeps its own position and key 0); keeping
    only the multiples does, and is refused in one line that names the feature."""
    check_rows(MaskSpec(causal=True, window=(0, 0), extra=(KeyStride(),)), 50, 50)
    with pytest.raises(MaskError, match="multiples-only") as caught:
        check_rows(MaskSpec(causal=True, window=(5, 0), extra=(MultiplesOnly(),)), 50, 50)
    assert "\n" not in str(caught.value)


@dataclass(frozen=True)
class MultiplesOnly(PredicateFeature):
    """Only keys that are multiples of ``STRIDE``: rows whose window holds none keep nothing."""

    name = "multiples-only"

    def keep(self, p, j):
        return (j % STRIDE == 0) & (p == p)
