"""FlexAttention variants against the float64 reference; their mask mods and block masks against
``dense_mask``; the mask mods specialize (Python constants, only the clauses used).

Every distinct (spec, shape) compiles its own kernel (seconds on CPU), so the compiled cases
here are few; the mask mods themselves are checked eagerly on many specs (hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from harness import registry
from harness.masks import MaskSpec, dense_mask, kept_pairs
from harness.oracle.reference import reference_attention
from harness.spec import Problem
from implementations import flex
from implementations.flex import BLOCK, block_counts, mask_mod_for
from tests.conftest import make_qkv

AVAILABLE = registry.get("flex-local").unavailable_reason() is None
needs_flex = pytest.mark.skipif(not AVAILABLE, reason="FlexAttention/torch.compile unavailable")

SHAPES = [(1, 2, 97, 97, 32), (1, 2, 161, 33, 32)]
CASES = [  # (shape index, implementation, mask): each one compile
    (0, "flex-local", MaskSpec(causal=True, window=(5, 0))),
    (0, "flex-local", MaskSpec(window=(300, 200), global_tokens=4)),
    (0, "flex-dilated", MaskSpec(causal=True, window=(4, 2), dilation=3)),
    (1, "flex-dilated", MaskSpec(window=(2, 5), dilation=2, global_tokens=5)),
]
BLOCK_CASES = [
    MaskSpec(causal=True, window=(1, 0), block_size=8, random_blocks=2, global_tokens=16),
    MaskSpec(window=(1, 1), block_size=8, random_blocks=1, seed=4),
]


def _compiles() -> int:
    """Frames dynamo has compiled so far (a cache hit does not count)."""
    return torch._dynamo.utils.counters["frames"]["ok"]


@needs_flex
@pytest.mark.slow
def test_window_family_matches_reference_and_never_recompiles_a_spec():
    inputs = [make_qkv(*shape, seed=1) for shape in SHAPES]
    for _ in range(2):  # the second round must hit the compiled cache for every spec
        before = _compiles()
        for index, name, mask in CASES:
            _check_window_case(name, mask, *inputs[index])
        after = _compiles()
    assert after == before, f"{after - before} recompiles on the second round"


def _check_window_case(name, mask, q, k, v):
    out = registry.get(name)(q, k, v, mask)
    assert torch.isfinite(out).all(), (name, mask)
    torch.testing.assert_close(
        out.double(),
        reference_attention(q, k, v, mask),
        atol=2e-5,
        rtol=1e-4,
        msg=f"{name} {mask.describe()}",
    )


@needs_flex
@pytest.mark.slow
def test_blocksparse_matches_reference_and_prepare():
    shape = SHAPES[0]
    q, k, v = make_qkv(*shape, seed=2)
    for mask in BLOCK_CASES:
        fn = registry.get("flex-blocksparse").prepare(Problem(*shape, mask=mask))
        torch.testing.assert_close(
            fn(q, k, v).double(),
            reference_attention(q, k, v, mask),
            atol=2e-5,
            rtol=1e-4,
            msg=mask.describe(),
        )


def test_backward_on_cpu_is_declared_unsupported():
    reasons = registry.get("flex-local").not_supported(
        Problem(1, 1, 64, 64, 16, mask=MaskSpec(causal=True, window=(3, 0)), backward=True)
    )
    assert reasons


side = st.one_of(st.none(), st.integers(0, 300))


@settings(max_examples=25, deadline=None)
@given(
    causal=st.booleans(),
    left=side,
    right=side,
    d=st.integers(1, 3),
    g=st.integers(0, 40),
    n_q=st.integers(1, 400),
    n_k=st.integers(1, 400),
)
def test_block_counts_match_dense_mask(causal, left, right, d, g, n_q, n_k):
    """``any`` blocks hold every kept pair, ``full`` blocks only kept pairs."""
    mask = MaskSpec(causal=causal, window=(left, right), dilation=d, global_tokens=g)
    any_, full, executed = block_counts(mask, n_q, n_k)
    dense = dense_mask(mask, n_q, n_k)
    n_qb, n_kb = any_.shape
    padded = torch.zeros(n_qb * BLOCK, n_kb * BLOCK, dtype=torch.bool)
    padded[:n_q, :n_k] = dense
    blocks = padded.view(n_qb, BLOCK, n_kb, BLOCK)
    assert torch.equal(any_, blocks.any(3).any(1))
    assert not (full & ~blocks.all(3).all(1)).any()
    assert kept_pairs(mask, n_q, n_k) <= executed <= n_q * n_k


def _evaluate(mask_mod, n_q: int, n_k: int) -> torch.Tensor:
    """A mask mod on the whole (n_q, n_k) grid, eagerly, with flex's int32 indices."""
    q = torch.arange(n_q, dtype=torch.int32)[:, None]
    kv = torch.arange(n_k, dtype=torch.int32)[None, :]
    zero = torch.zeros((), dtype=torch.int32)
    return mask_mod(zero, zero, q, kv).expand(n_q, n_k)


@settings(max_examples=60, deadline=None)
@given(
    causal=st.booleans(),
    left=side,
    right=side,
    d=st.integers(1, 5),
    g=st.sampled_from([0, 0, 1, 7, 33]),
    n_q=st.integers(1, 211),
    n_k=st.integers(1, 211),
)
def test_window_mask_mods_equal_dense_mask(causal, left, right, d, g, n_q, n_k):
    mask = MaskSpec(causal=causal, window=(left, right), dilation=d, global_tokens=g)
    got = _evaluate(mask_mod_for(mask, n_q, n_k, "cpu"), n_q, n_k)
    assert torch.equal(got, dense_mask(mask, n_q, n_k)), mask.describe()


@settings(max_examples=40, deadline=None)
@given(
    causal=st.booleans(),
    left=st.one_of(st.none(), st.integers(0, 3)),
    right=st.one_of(st.none(), st.integers(0, 3)),
    b=st.sampled_from([3, 4, 8]),
    random_blocks=st.integers(0, 2),
    g_blocks=st.integers(0, 2),
    seed=st.integers(0, 5),
    n_q=st.integers(1, 97),
    n_k=st.integers(1, 97),
)
def test_layout_mask_mods_equal_dense_mask(
    causal, left, right, b, random_blocks, g_blocks, seed, n_q, n_k
):
    mask = MaskSpec(
        causal=causal,
        window=(left, right),
        block_size=b,
        random_blocks=random_blocks,
        global_tokens=g_blocks * b,
        seed=seed,
    )
    got = _evaluate(mask_mod_for(mask, n_q, n_k, "cpu"), n_q, n_k)
    assert torch.equal(got, dense_mask(mask, n_q, n_k)), mask.describe()


def _ops(mask_mod) -> set[str]:
    """The aten ops a mask mod traces to (what the compiled kernel evaluates per element)."""
    zero = torch.zeros((), dtype=torch.int32)
    graph = make_fx(mask_mod)(zero, zero, zero, zero).graph
    assert not [n for n in graph.nodes if n.op == "get_attr"], "captured a tensor constant"
    return {str(n.target).split(".")[1] for n in graph.nodes if n.op == "call_function"}


SPECIALIZED = [  # (mask, ops that must appear, ops that must not)
    (MaskSpec(causal=True, window=(255, 0)), {"ge", "le"}, {"remainder", "lt", "bitwise_or"}),
    (MaskSpec(window=(3, None)), {"ge"}, {"le", "remainder", "bitwise_or"}),
    (MaskSpec(causal=True, window=(8, 0), dilation=2), {"bitwise_and"}, {"remainder", "lt"}),
    (MaskSpec(causal=True, window=(8, 0), dilation=3), {"remainder"}, {"lt", "bitwise_or"}),
    (MaskSpec(causal=True, window=(8, 0), global_tokens=4), {"lt", "bitwise_or"}, {"remainder"}),
]


@pytest.mark.parametrize("mask, present, absent", SPECIALIZED, ids=lambda m: str(m))
def test_mask_mods_hold_only_the_clauses_the_spec_uses(mask, present, absent):
    mask_mod = mask_mod_for(mask, 97, 97, "cpu")
    cells = [c.cell_contents for c in mask_mod.__closure__ or ()]
    assert not any(isinstance(c, torch.Tensor) for c in cells), "numbers must be constants"
    ops = _ops(mask_mod)
    assert present <= ops and not (absent & ops), ops


def test_mask_mods_are_cached_per_spec_and_shape():
    mask = MaskSpec(causal=True, window=(5, 0))
    assert mask_mod_for(mask, 97, 97, "cpu") is mask_mod_for(mask, 97, 97, "cpu")
    assert mask_mod_for(mask, 97, 97, "cpu") is not mask_mod_for(mask, 98, 98, "cpu")


def test_recompile_limits_are_raised_and_hitting_them_fails_loudly():
    """Every distinct spec compiles its own kernel: past dynamo's default limit of 8 it would
    silently run eager (O(n²)); the limits are lifted and a hit raises instead."""
    flex.raise_recompile_limits()
    cfg = torch._dynamo.config
    assert cfg.recompile_limit >= flex.RECOMPILE_LIMIT
    assert cfg.accumulated_recompile_limit >= flex.RECOMPILE_LIMIT
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        assert cfg.fail_on_recompile_limit_hit is True
