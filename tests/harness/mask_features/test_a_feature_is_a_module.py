"""A toy mask feature written in this file runs everywhere: the mask's counterpart of
tests/harness/scenarios/test_scenarios.py::test_a_scenario_is_a_folder.

The feature is attention sinks (StreamingLLM, Xiao et al. 2023): the first ``count`` keys are
visible to every query, on top of a sliding window. It is a :class:`RunsFeature` of a few
lines; nothing else in the project names it. It must run on the dense reference, count in
closed form, plan its blocks, run on the CPU tiles (``longformer``) and in Flex's mask mod and
block mask, and be refused, by name, by a path that cannot run it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from harness import registry
from harness.block_plan import FULL, PARTIAL, SKIP, block_plan
from harness.mask_features import RunsFeature
from harness.mask_features.predicate import PredicateFeature
from harness.masks import MaskError, MaskSpec, block_pair_counts, dense_mask, kept_pairs
from harness.oracle.reference import reference_attention
from harness.spec import Problem
from implementations._kernels.tiles.tile_attention import tile_attention
from implementations._kernels.tiles.tile_plan import plan_shape, tile_plan
from tests.conftest import make_qkv


@dataclass(frozen=True)
class Sinks(RunsFeature):
    """The first ``count`` keys are visible to every query (before causality)."""

    count: int = 4
    name = "sinks"

    def key_runs(self):
        return ((0, self.count),)

    def check(self) -> None:
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")

    def label(self) -> str:
        return f"sinks={self.count}"


@dataclass(frozen=True)
class NoSinks(Sinks):
    """The feature's module removed: the same name, no geometry."""

    def key_runs(self):
        return ()


def expected(spec: MaskSpec, sinks: int, n_q: int, n_k: int) -> torch.Tensor:
    """Sinks by hand, from the mask without them: (window | j < sinks) & causal."""
    base = dense_mask(MaskSpec(causal=False, window=spec.window), n_q, n_k)
    p = torch.arange(n_q)[:, None] + n_k - n_q
    j = torch.arange(n_k)[None, :]
    keep = base | (j < sinks)
    return keep & (j <= p) if spec.causal else keep


def assert_states_match_mask(plan, mask: torch.Tensor) -> None:
    """Every block of a 16 x 16 plan: SKIP, FULL or PARTIAL exactly as the dense mask says."""
    states = plan.states()
    for a in range(states.shape[0]):
        for b in range(states.shape[1]):
            tile = mask[a * 16:(a + 1) * 16, b * 16:(b + 1) * 16]
            want = SKIP if not tile.any() else FULL if tile.sum() == 256 else PARTIAL
            assert int(states[a, b]) == want, (a, b)


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


def run_triton(spec: MaskSpec, n_q: int, n_k: int, dim: int, seed: int) -> None:
    """The fused kernels under the interpreter, forward and gradients against float64."""
    from harness.oracle.agreement import grad_agreement, output_agreement
    from harness.oracle.reference import reference_grads
    from implementations._kernels.triton import masked_attention

    q, k, v = (t.requires_grad_(True) for t in make_qkv(1, 2, n_q, n_k, dim, seed=seed))
    out = masked_attention.triton_attention(q, k, v, spec)
    ref = reference_attention(q.detach(), k.detach(), v.detach(), spec)
    result = output_agreement(out.detach(), ref, torch.float32)
    assert result["agree"], result
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1))
    grads = torch.autograd.grad(out, (q, k, v), g)
    result = grad_agreement(grads, reference_grads(q, k, v, g, spec), torch.float32)
    assert result["grad_agree"], result


SPECS = [  # (spec, n_q, n_k): odd sizes, unequal lengths both ways
    (MaskSpec(causal=True, window=(7, 0), extra=(Sinks(4),)), 83, 83),
    (MaskSpec(causal=True, window=(5, 0), extra=(Sinks(3),)), 29, 70),
    (MaskSpec(window=(3, 2), extra=(Sinks(5),)), 61, 45),
]


@pytest.mark.parametrize(("spec", "n_q", "n_k"), SPECS)
def test_dense_rule_and_closed_form_count(spec, n_q, n_k):
    mask = dense_mask(spec, n_q, n_k)
    assert torch.equal(mask, expected(spec, spec.extra[0].count, n_q, n_k))
    assert kept_pairs(spec, n_q, n_k) == int(mask.sum())
    qb, kb, counts = block_pair_counts(spec, n_q, n_k, 16, 8)
    grid = torch.zeros(-(-n_q // 16), -(-n_k // 8), dtype=torch.int64)
    grid.index_put_((torch.arange(n_q)[:, None] // 16, torch.arange(n_k)[None, :] // 8),
                    mask.long(), accumulate=True)
    listed = torch.zeros_like(grid)
    listed[torch.from_numpy(qb), torch.from_numpy(kb)] = torch.from_numpy(counts)
    assert torch.equal(listed, grid)


def test_removing_the_feature_changes_every_reader():
    """The planted failure: without the feature's geometry the checks above fail."""
    spec, n_q, n_k = SPECS[0]
    gone = MaskSpec(causal=True, window=(7, 0), extra=(NoSinks(4),))
    assert not torch.equal(dense_mask(gone, n_q, n_k), expected(spec, 4, n_q, n_k))
    assert kept_pairs(gone, n_q, n_k) < kept_pairs(spec, n_q, n_k)


@pytest.mark.parametrize(("spec", "n_q", "n_k"), SPECS)
def test_block_plan_skips_what_the_mask_skips(spec, n_q, n_k):
    plan = block_plan(spec, n_q, n_k, 16, 16)
    assert_states_match_mask(plan, dense_mask(spec, n_q, n_k))
    heights = np.minimum(16, n_q - plan.qb * 16)
    widths = np.minimum(16, n_k - plan.kb * 16)
    assert plan.executed_pairs == int((heights * widths).sum()) < n_q * n_k


@pytest.mark.parametrize(("spec", "n_q", "n_k"), SPECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_tiles(spec, n_q, n_k, dtype):
    plan = run_cpu_tiles(spec, n_q, n_k, dtype, 16, seed=3)
    assert kept_pairs(spec, n_q, n_k) <= plan.executed_pairs < n_q * n_k


@pytest.mark.parametrize(("runs", "refuses", "reason", "kind"), [
    ("longformer", "local", "mask features ['sinks'] not supported", "runs"),
    ("local", "sdpa", "mask features ['alternate-chunks', 'window'] not supported", "predicate"),
])
def test_a_registered_path_runs_it_and_another_refuses_it_by_name(runs, refuses, reason, kind):
    spec, n_q, n_k = (SPECS if kind == "runs" else CHUNK_SPECS)[0]
    problem = Problem(1, 2, n_q, n_k, 16, mask=spec)
    assert registry.get(runs).not_supported(problem) == []
    q, k, v = make_qkv(1, 2, n_q, n_k, 16, seed=4, dtype=torch.float64)
    out = registry.get(runs)(q, k, v, spec)
    torch.testing.assert_close(out, reference_attention(q, k, v, spec), atol=1e-10, rtol=1e-10)
    assert registry.get(refuses).not_supported(problem) == [reason]


def test_flex_mask_mod_and_block_mask_read_the_feature():
    from implementations._flex_masks import BLOCK, block_counts, mask_mod_for

    spec = MaskSpec(causal=True, window=(20, 0), extra=(Sinks(130),))
    n_q = n_k = 300
    mod = mask_mod_for(spec, n_q, n_k, "cpu")
    zero = torch.zeros((), dtype=torch.int64)
    q_idx, kv_idx = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    assert torch.equal(mod(zero, zero, q_idx, kv_idx), dense_mask(spec, n_q, n_k))
    any_, full, executed = block_counts(spec, n_q, n_k)
    assert executed == block_plan(spec, n_q, n_k, BLOCK, BLOCK).executed_pairs
    assert any_.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert full.tolist() == [[False] * 3, [True, False, False], [False] * 3]


def test_a_bad_feature_is_refused_in_one_line():
    with pytest.raises(MaskError, match=r"^sinks: count must be >= 1, got 0$"):
        MaskSpec(causal=True, extra=(Sinks(0),))
    with pytest.raises(MaskError, match=r"\['sinks'\] cannot be combined with block_size"):
        MaskSpec(block_size=16, extra=(Sinks(16),))


@pytest.mark.parametrize(("spec", "n_q", "n_k"), SPECS)
def test_triton_kernels_in_the_interpreter(spec, n_q, n_k):
    """The fused band kernels (``TRITON_INTERPRET=1`` on CPU, tests/conftest.py): the sinks
    are their global keys (no global rows), forward and gradients against float64."""
    pytest.importorskip("triton")
    from implementations._kernels.triton.band_plan import band_executed_pairs, band_plan

    run_triton(spec, n_q, n_k, 16, seed=5)
    plan = band_plan(spec, n_q, n_k)
    assert plan.key_globals == tuple(range(spec.extra[0].count)) and plan.row_globals == ()
    assert plan.flags["APART"]  # the kernels' clause for rows and keys that differ
    executed = band_executed_pairs(plan, 16, 16)
    assert kept_pairs(spec, n_q, n_k) <= executed < 4 * n_q * n_k


@pytest.mark.slow
def test_flex_compiled_runs_it():
    """One compile of ``flex-local`` (CPU inductor): the sinks through its BlockMask and mask
    mod, against float64; its executed pairs are the block plan's."""
    flex = registry.get("flex-local")
    if flex.unavailable_reason() is not None:
        pytest.skip(flex.unavailable_reason())
    spec, n_q, n_k = MaskSpec(causal=True, window=(20, 0), extra=(Sinks(130),)), 300, 300
    q, k, v = make_qkv(1, 2, n_q, n_k, 32, seed=7)
    out = flex(q, k, v, spec)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, spec),
                               atol=2e-5, rtol=1e-4)
    problem = Problem(1, 2, n_q, n_k, 32, mask=spec)
    assert flex.cost.executed_pairs(problem) == block_plan(spec, n_q, n_k, 128, 128).executed_pairs


def test_with_documents_each_document_has_its_own_sinks():
    """Packed documents: the sinks are every document's first keys (rule 5), on the dense
    rule, the count, the CPU tiles and (where Triton is installed) the fused kernels."""
    spec, n = MaskSpec(causal=True, window=(3, 0), documents=(20, 2, 31), extra=(Sinks(3),)), 53
    mask = dense_mask(spec, n, n)
    assert bool(mask[30, 22]) and not bool(mask[30, 0]) and not bool(mask[30, 25])
    assert kept_pairs(spec, n, n) == int(mask.sum())
    q, k, v = make_qkv(1, 2, n, n, 16, seed=8, dtype=torch.float64)
    out = tile_attention(q, k, v, tile_plan(spec, n, n, torch.float64, "cpu"))
    torch.testing.assert_close(out, reference_attention(q, k, v, spec), atol=1e-10, rtol=1e-10)
    try:
        from implementations._kernels.triton import masked_attention
    except ImportError:
        return
    q32, k32, v32 = (t.float() for t in (q, k, v))
    out = masked_attention.triton_attention(q32, k32, v32, spec)
    torch.testing.assert_close(out.double(), reference_attention(q32, k32, v32, spec),
                               atol=2e-5, rtol=1e-4)


# --- the predicate form: a feature that restricts pairs (rule 6 of harness.masks) ----------------
#
# "Alternate chunks": keys in even chunks of CHUNK positions, plus the query's own chunk (a
# strided block pattern, attention-gym mask_mod style). Its torch predicate, its @triton.jit
# twin (set below when Triton imports) and its block classification are all it states.

CHUNK = 16


@dataclass(frozen=True)
class AlternateChunks(PredicateFeature):
    """Keys in even chunks of ``CHUNK`` positions, and every key of the query's own chunk."""

    name = "alternate-chunks"

    def keep(self, p, j):
        start = j - j % CHUNK  # j >= 0: its chunk's first key; p may be < 0
        return ((j // CHUNK) % 2 == 0) | ((p >= start) & (p < start + CHUNK))

    def classify(self, p0, p1, j0, j1):
        kc = j0 // CHUNK
        one = kc == (j1 - 1) // CHUNK  # the keys lie in one chunk
        meets = (p0 < kc * CHUNK + CHUNK) & (p1 > kc * CHUNK)  # some row in that chunk
        inside = (p0 >= kc * CHUNK) & (p1 <= kc * CHUNK + CHUNK)  # every row in it
        out = np.full(np.shape(p0), PARTIAL, dtype=np.int8)
        out[one & (kc % 2 == 1) & ~meets] = SKIP
        out[one & ((kc % 2 == 0) | inside)] = FULL
        return out


try:
    import triton
    import triton.language as tl

    @triton.jit
    def alternate_chunks_keep(p, j):
        start = j - j % 16  # CHUNK: a jitted function reads no Python global
        return ((j // 16) % 2 == 0) | ((p >= start) & (p < start + 16))

    AlternateChunks.triton_keep = alternate_chunks_keep
except ImportError:  # the fused kernels then refuse the feature by name
    tl = None


@dataclass(frozen=True)
class NoChunks(AlternateChunks):
    """The feature's module removed: the same name, every pair allowed."""

    def keep(self, p, j):
        return (p == p) | (j == j)

    def classify(self, p0, p1, j0, j1):
        return np.full(np.shape(p0), FULL, dtype=np.int8)


def expected_chunks(spec: MaskSpec, n_q: int, n_k: int) -> torch.Tensor:
    """The chunks by hand, on the mask without them."""
    base = dense_mask(MaskSpec(causal=spec.causal, window=spec.window,
                               global_tokens=spec.global_tokens), n_q, n_k)
    p = torch.arange(n_q)[:, None] + n_k - n_q
    j = torch.arange(n_k)[None, :]
    own = torch.div(p, CHUNK, rounding_mode="floor") == j // CHUNK
    return base & (((j // CHUNK) % 2 == 0) | own)


CHUNK_SPECS = [  # odd sizes, unequal lengths both ways, with global tokens
    (MaskSpec(causal=True, window=(40, 0), extra=(AlternateChunks(),)), 97, 97),
    (MaskSpec(causal=True, window=(30, 0), extra=(AlternateChunks(),)), 45, 97),
    (MaskSpec(window=(20, 9), global_tokens=2, extra=(AlternateChunks(),)), 97, 70),
]


@pytest.mark.parametrize(("spec", "n_q", "n_k"), CHUNK_SPECS)
def test_predicate_dense_rule_count_and_block_plan(spec, n_q, n_k):
    mask = dense_mask(spec, n_q, n_k)
    assert torch.equal(mask, expected_chunks(spec, n_q, n_k))
    assert kept_pairs(spec, n_q, n_k) == int(mask.sum())
    plan = block_plan(spec, n_q, n_k, 16, 16)
    assert_states_match_mask(plan, mask)
    assert int(plan.count.sum()) == int(mask.sum())
    without = block_plan(MaskSpec(causal=spec.causal, window=spec.window,
                                  global_tokens=spec.global_tokens), n_q, n_k, 16, 16)
    assert plan.executed_pairs < without.executed_pairs  # the classification skips blocks


def test_removing_the_predicate_changes_every_reader():
    """The planted failure: without the feature's geometry the checks above fail."""
    spec, n_q, n_k = CHUNK_SPECS[0]
    gone = MaskSpec(causal=True, window=(40, 0), extra=(NoChunks(),))
    assert not torch.equal(dense_mask(gone, n_q, n_k), expected_chunks(spec, n_q, n_k))
    assert kept_pairs(gone, n_q, n_k) > kept_pairs(spec, n_q, n_k)
    assert (block_plan(gone, n_q, n_k, 16, 16).executed_pairs
            > block_plan(spec, n_q, n_k, 16, 16).executed_pairs)


@pytest.mark.parametrize(("spec", "n_q", "n_k"), CHUNK_SPECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_predicate_on_cpu_tiles(spec, n_q, n_k, dtype):
    plan = run_cpu_tiles(spec, n_q, n_k, dtype, 59, seed=9)
    assert kept_pairs(spec, n_q, n_k) < plan.executed_pairs < n_q * n_k


def test_flex_mask_mod_and_block_mask_read_the_predicate():
    from implementations._flex_masks import BLOCK, block_counts, mask_mod_for

    spec, n_q, n_k = MaskSpec(causal=True, window=(200, 0), extra=(AlternateChunks(),)), 300, 300
    mod = mask_mod_for(spec, n_q, n_k, "cpu")
    zero = torch.zeros((), dtype=torch.int64)
    q_idx, kv_idx = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    assert torch.equal(mod(zero, zero, q_idx, kv_idx), dense_mask(spec, n_q, n_k))
    any_, full, executed = block_counts(spec, n_q, n_k)
    plan = block_plan(spec, n_q, n_k, BLOCK, BLOCK)
    assert executed == plan.executed_pairs
    assert torch.equal(any_, plan.states() != SKIP) and not bool(full.any())


@pytest.mark.parametrize(("spec", "n_q", "n_k"), CHUNK_SPECS)
def test_predicate_in_the_triton_kernels(spec, n_q, n_k):
    """The fused band kernels under the interpreter with the feature's @triton.jit predicate
    as their PRED constexpr, forward and gradients against float64 (D = 59)."""
    pytest.importorskip("triton")
    from implementations._kernels.triton.band_plan import band_executed_pairs, band_plan

    plan = band_plan(spec, n_q, n_k)
    assert plan.flags["PRED"] is alternate_chunks_keep
    base = MaskSpec(causal=spec.causal, window=spec.window, global_tokens=spec.global_tokens)
    assert "PRED" not in band_plan(base, n_q, n_k).flags  # without it: the kernels of today
    run_triton(spec, n_q, n_k, 59, seed=11)
    executed = band_executed_pairs(plan, 16, 16)  # the slots' pairs, as without the predicate
    assert executed == band_executed_pairs(band_plan(base, n_q, n_k), 16, 16)
    assert kept_pairs(spec, n_q, n_k) < executed


def test_predicate_in_the_split_decode_kernel():
    """A few query rows take the split-KV decode kernel (its PRED as the forward's), the
    gradients the band backward's; D = 59 against float64."""
    pytest.importorskip("triton")
    from implementations._kernels.triton.plan_tables import is_decode

    spec = MaskSpec(causal=True, window=(60, 0), global_tokens=3, extra=(AlternateChunks(),))
    assert is_decode(5)
    run_triton(spec, 5, 97, 59, seed=15)


def test_predicate_with_documents_reads_document_positions():
    """Rule 6 inside each document: the chunks restart at every document's first key, on the
    dense rule, the count, the CPU tiles and (where Triton is installed) the fused kernels."""
    spec, n = MaskSpec(causal=True, window=(30, 0), documents=(37, 60),
                       extra=(AlternateChunks(),)), 97
    mask = dense_mask(spec, n, n)
    assert bool(mask[37 + 20, 37 + 3]) and not bool(mask[37 + 40, 37 + 16])
    assert kept_pairs(spec, n, n) == int(mask.sum())
    q, k, v = make_qkv(1, 2, n, n, 16, seed=13, dtype=torch.float64)
    out = tile_attention(q, k, v, tile_plan(spec, n, n, torch.float64, "cpu"))
    torch.testing.assert_close(out, reference_attention(q, k, v, spec), atol=1e-10, rtol=1e-10)
    if tl is None:
        return
    from implementations._kernels.triton import masked_attention

    q32, k32, v32 = (t.float() for t in (q, k, v))
    out = masked_attention.triton_attention(q32, k32, v32, spec)
    torch.testing.assert_close(out.double(), reference_attention(q32, k32, v32, spec),
                               atol=2e-5, rtol=1e-4)


@pytest.mark.slow
def test_flex_compiled_runs_the_predicate():
    """One compile of ``flex-local`` (CPU inductor): the predicate in its mask mod, the
    classification in its BlockMask, against float64."""
    flex = registry.get("flex-local")
    if flex.unavailable_reason() is not None:
        pytest.skip(flex.unavailable_reason())
    spec, n_q, n_k = MaskSpec(causal=True, window=(200, 0), extra=(AlternateChunks(),)), 300, 300
    q, k, v = make_qkv(1, 2, n_q, n_k, 32, seed=14)
    out = flex(q, k, v, spec)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, spec),
                               atol=2e-5, rtol=1e-4)


@dataclass(frozen=True)
class TorchOnly(PredicateFeature):
    """A predicate without its @triton.jit twin."""

    name = "torch-only"

    def keep(self, p, j):
        return j % 3 != 1


@dataclass(frozen=True)
class NamedTwin(AlternateChunks):
    """The twin named by a string, resolved where Triton is imported."""

    name = "named-twin"
    triton_keep = f"{__name__}:alternate_chunks_keep"


def test_the_fused_kernels_refuse_a_predicate_they_cannot_run_by_name():
    from implementations._kernels.triton.band_plan import fused_band_reasons, triton_predicate

    assert fused_band_reasons(MaskSpec(causal=True, extra=(TorchOnly(),))) == [
        "mask feature 'torch-only' gives no @triton.jit predicate (triton_keep) for the fused "
        "band kernels"]
    assert fused_band_reasons(MaskSpec(causal=True, extra=(AlternateChunks(), TorchOnly()))) == [
        "the fused band kernels take one predicate feature, got ['alternate-chunks', "
        "'torch-only']"]
    if tl is not None:  # a "module:function" string names the twin
        spec = MaskSpec(causal=True, extra=(NamedTwin(),))
        assert fused_band_reasons(spec) == []
        assert triton_predicate(spec) is alternate_chunks_keep
