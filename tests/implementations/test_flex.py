"""FlexAttention beyond the generated matrix: its mask mods and block masks against
``dense_mask`` on every kind of spec; the mask mods specialize (Python constants, only the
clauses used); a repeated spec never recompiles; block lists skip what the mask skips.

Every distinct (spec, shape) compiles its own kernel (seconds on CPU), so the compiled cases
here are few (the matrix runs each variant's features); the mask mods themselves are checked
eagerly on many specs (hypothesis)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from harness import registry
from harness.block_plan import block_plan
from harness.masks import MaskSpec, dense_mask, kept_pairs
from harness.oracle.reference import reference_attention
from harness.spec import Problem
from implementations import flex
from implementations._flex_masks import BLOCK, block_counts, build_block_mask, mask_mod_for
from tests.conftest import make_qkv
from tests.harness.test_masks import specs_and_lengths

AVAILABLE = registry.get("flex-local").unavailable_reason() is None
needs_flex = pytest.mark.skipif(not AVAILABLE, reason="FlexAttention/torch.compile unavailable")

SHAPES = [(1, 2, 97, 97, 32), (1, 2, 161, 33, 32)]
CASES = [  # (shape index, implementation, mask): each one compile
    (0, "flex-local", MaskSpec(causal=True, window=(5, 0), documents=(40, 1, 56))),
    (1, "flex-dilated", MaskSpec(window=(2, 5), dilation=2, global_tokens=(0, 9), prefix_len=3)),
]


def _compiles() -> int:
    """Frames dynamo has compiled so far (a cache hit does not count)."""
    return torch._dynamo.utils.counters["frames"]["ok"]


@needs_flex
@pytest.mark.slow
def test_a_repeated_spec_never_recompiles():
    """Direct calls and prepared calls of the same specs: the second round must hit the
    compiled cache for every spec (the mask mod and block mask are cached per spec)."""
    inputs = [make_qkv(*shape, seed=1) for shape in SHAPES]
    for _ in range(2):
        before = _compiles()
        for index, name, mask in CASES:
            q, k, v = inputs[index]
            prepared = registry.get(name).prepare(Problem(*SHAPES[index], mask=mask))
            for out in (registry.get(name)(q, k, v, mask), prepared(q, k, v)):
                torch.testing.assert_close(
                    out.double(), reference_attention(q, k, v, mask), atol=2e-5, rtol=1e-4,
                    msg=f"{name} {mask.describe()}",
                )
        after = _compiles()
    assert after == before, f"{after - before} recompiles on the second round"


def test_the_availability_rule_is_dynamos_own_without_importing_it(monkeypatch):
    """The quick rule agrees with ``torch._dynamo.is_dynamo_supported()`` here, refuses a
    Python torch.compile does not support, and checking it imports no ``torch._dynamo``."""
    import subprocess
    import sys

    assert (flex.dynamo_unsupported_reason() is None) == torch._dynamo.is_dynamo_supported()
    monkeypatch.setattr(sys, "version_info", (3, 15, 0, "final", 0))
    assert "3.15" in flex.dynamo_unsupported_reason()
    monkeypatch.undo()
    code = ("import sys; from implementations import flex; flex.dynamo_unsupported_reason(); "
            "sys.exit('torch._dynamo' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_backward_on_cpu_is_declared_unsupported():
    reasons = registry.get("flex-local").not_supported(
        Problem(1, 1, 64, 64, 16, mask=MaskSpec(causal=True, window=(3, 0)), backward=True)
    )
    assert reasons


side = st.one_of(st.none(), st.integers(0, 300))


@st.composite
def long_specs(draw):
    """Specs over up to 400 tokens (several 128-blocks): windows, globals at any positions,
    prefix, packed documents."""
    n_q, n_k = draw(st.integers(1, 400)), draw(st.integers(1, 400))
    kw = {"causal": draw(st.booleans()), "window": (draw(side), draw(side)),
          "dilation": draw(st.integers(1, 3))}
    if draw(st.booleans()):
        docs = draw(st.lists(st.integers(1, 200), min_size=1, max_size=8))
        kw["documents"], n_q = tuple(docs), sum(docs)
        n_k = n_q
    longest = max(kw.get("documents") or (n_k,))
    kw["global_tokens"] = draw(st.one_of(
        st.integers(0, 40), st.lists(st.integers(0, longest - 1), max_size=6).map(tuple)))
    kw["prefix_len"] = draw(st.integers(0, n_k)) if draw(st.booleans()) else 0
    return MaskSpec(**kw), n_q, n_k


@settings(max_examples=25, deadline=None)
@given(case=long_specs())
def test_block_counts_match_dense_mask(case):
    """``any`` blocks are exactly the blocks that keep a pair, ``full`` blocks only kept pairs
    (and complete), executed pairs the listed blocks' area."""
    mask, n_q, n_k = case
    any_, full, executed = block_counts(mask, n_q, n_k)
    dense = dense_mask(mask, n_q, n_k)
    n_qb, n_kb = any_.shape
    padded = torch.zeros(n_qb * BLOCK, n_kb * BLOCK, dtype=torch.bool)
    padded[:n_q, :n_k] = dense
    blocks = padded.view(n_qb, BLOCK, n_kb, BLOCK)
    assert torch.equal(any_, blocks.any(3).any(1))
    assert not (full & ~blocks.all(3).all(1)).any()
    assert kept_pairs(mask, n_q, n_k) <= executed <= n_q * n_k


VMAP_SPECS = [  # every clause that reads a table or writes nothing in place, under vmap
    (MaskSpec(causal=True, window=(8, 0), global_tokens=(1, 3, 5, 7, 9, 60)), 97, 97),
    (MaskSpec(causal=True, window=(5, 2), documents=(40, 1, 56), global_tokens=2), 97, 97),
    (MaskSpec(window=(1, 1), block_size=16, random_blocks=1, global_tokens=16), 80, 161),
    (MaskSpec(window=(2, 5), dilation=3, global_tokens=(0, 9), prefix_len=3), 161, 33),
]


@pytest.mark.parametrize(("mask", "n_q", "n_k"), VMAP_SPECS, ids=lambda x: str(x)[:40])
def test_mask_mods_run_under_flexs_vmap(mask, n_q, n_k):
    """Flex evaluates a mask mod on scalar indices under nested vmap (``create_mask``): the
    composed feature clauses must run there (no tensor created and written in place) and
    equal the dense rule."""
    from torch.nn.attention.flex_attention import create_mask

    got = create_mask(mask_mod_for(mask, n_q, n_k, "cpu"), 1, 1, n_q, n_k, device="cpu")
    assert torch.equal(got[0, 0], dense_mask(mask, n_q, n_k)), mask.describe()


@settings(max_examples=20, deadline=None)
@given(case=long_specs())
def test_block_mask_lists_are_the_block_plan(case):
    """The BlockMask's partial and full lists hold exactly the plan's partial and full blocks,
    each row's key blocks ascending."""
    mask, n_q, n_k = case
    plan = block_plan(mask, n_q, n_k, BLOCK, BLOCK)
    got = build_block_mask(mask, n_q, n_k, "cpu")
    for num, idx, want in ((got.kv_num_blocks, got.kv_indices, ~plan.full),
                           (got.full_kv_num_blocks, got.full_kv_indices, plan.full)):
        pairs = [(qb, int(kb)) for qb, (n, row) in enumerate(zip(num[0, 0], idx[0, 0],
                                                                   strict=True))
                 for kb in row[: int(n)]]
        assert pairs == list(zip(plan.qb[want].tolist(), plan.kb[want].tolist(), strict=True))


def _lognormal(seed: int, n: int, mean: int) -> tuple[int, ...]:
    """Seeded lengths, lognormal (sigma 1) around ``mean``, summing to n."""
    rng, out, left = random.Random(seed), [], n
    while left:
        out.append(min(left, max(1, round(rng.lognormvariate(math.log(mean) - 0.5, 1.0)))))
        left -= out[-1]
    return tuple(out)


@pytest.mark.parametrize("mean", [17, 64, 256, 700])
@pytest.mark.parametrize("causal", [True, False])
def test_document_block_lists_skip_other_documents(mean, causal):
    """Packed documents (lognormal lengths, n = 16384): the listed blocks (partial + full) stay
    within Σ ceil(l/128)² + 2·documents for causal documents. Non-causal unaligned documents
    need more: every listed block keeps a pair (the lists are exact, checked above), and a
    document's square meets up to ceil(l/128) + 1 blocks a side."""
    n = 16384
    docs = _lognormal(mean, n, mean)
    any_, _, _ = block_counts(MaskSpec(causal=causal, documents=docs), n, n)
    if causal:
        bound = sum(math.ceil(x / BLOCK) ** 2 for x in docs) + 2 * len(docs)
    else:
        bound = sum((math.ceil(x / BLOCK) + 1) ** 2 for x in docs)
    assert int(any_.sum()) <= bound


def _evaluate(mask_mod, n_q: int, n_k: int) -> torch.Tensor:
    """A mask mod on the whole (n_q, n_k) grid, eagerly, with flex's int32 indices."""
    q = torch.arange(n_q, dtype=torch.int32)[:, None]
    kv = torch.arange(n_k, dtype=torch.int32)[None, :]
    zero = torch.zeros((), dtype=torch.int32)
    return mask_mod(zero, zero, q, kv).expand(n_q, n_k)


@settings(max_examples=150, deadline=None)
@given(case=specs_and_lengths())
def test_mask_mods_equal_dense_mask(case):
    """Every kind of spec (windows, dilation, globals anywhere, prefix, documents, BigBird
    layouts with global blocks anywhere), odd and unequal lengths."""
    mask, n_q, n_k = case
    got = _evaluate(mask_mod_for(mask, n_q, n_k, "cpu"), n_q, n_k)
    assert torch.equal(got, dense_mask(mask, n_q, n_k)), mask.describe()


@settings(max_examples=30, deadline=None)
@given(case=long_specs())
def test_mask_mods_equal_dense_mask_over_several_blocks(case):
    mask, n_q, n_k = case
    got = _evaluate(mask_mod_for(mask, n_q, n_k, "cpu"), n_q, n_k)
    assert torch.equal(got, dense_mask(mask, n_q, n_k)), mask.describe()


def _trace(mask_mod) -> tuple[set[str], list[torch.Tensor]]:
    """The aten ops a mask mod traces to (what the compiled kernel evaluates per element) and
    the tensors it captured."""
    zero = torch.zeros(1, dtype=torch.int32)  # (1,): a table lookup traces as an index op
    module = make_fx(mask_mod)(zero, zero, zero, zero)
    captured = [getattr(module, n.target) for n in module.graph.nodes if n.op == "get_attr"]
    ops = {str(n.target).split(".")[1] for n in module.graph.nodes if n.op == "call_function"}
    return ops, captured


SPECIALIZED = [  # (mask, ops that must appear, ops that must not)
    (MaskSpec(causal=True, window=(255, 0)), {"ge", "le"}, {"remainder", "lt", "bitwise_or"}),
    (MaskSpec(window=(3, None)), {"ge"}, {"le", "remainder", "bitwise_or"}),
    (MaskSpec(causal=True, window=(8, 0), dilation=2), {"bitwise_and"}, {"remainder", "lt"}),
    (MaskSpec(causal=True, window=(8, 0), dilation=3), {"remainder"}, {"lt", "bitwise_or"}),
    (MaskSpec(causal=True, window=(8, 0), global_tokens=4), {"lt", "bitwise_or"}, {"remainder"}),
    (MaskSpec(causal=True, window=(8, 0), global_tokens=(0, 1, 40, 90)), {"ge", "lt"},
     {"remainder", "index"}),
    (MaskSpec(causal=True, prefix_len=7), {"lt", "bitwise_or"}, {"remainder", "index"}),
    # equal documents of 2^k: a shift and a bit mask, no division, no table
    (MaskSpec(causal=True, documents=(16,) * 6), {"__rshift__", "eq"},
     {"remainder", "floor_divide", "index", "div"}),
    (MaskSpec(causal=True, documents=(24,) * 4, global_tokens=1), {"floor_divide", "eq"},
     {"remainder", "index"}),
]


@pytest.mark.parametrize(
    "mask, present, absent", SPECIALIZED, ids=[m.describe() for m, _, _ in SPECIALIZED]
)
def test_mask_mods_hold_only_the_clauses_the_spec_uses(mask, present, absent):
    n = sum(mask.documents) if mask.documents else 97
    ops, captured = _trace(mask_mod_for(mask, n, n, "cpu"))
    assert not captured, "numbers must be constants"
    assert present <= ops and not (absent & ops), ops


@pytest.mark.parametrize(
    "mask, dtype",
    [
        (MaskSpec(causal=True, documents=(40, 1, 56)), torch.int32),  # one start per position
        (MaskSpec(causal=True, window=(8, 0), global_tokens=(1, 3, 5, 7, 9)), torch.bool),
    ],
    ids=["unequal-documents", "five-global-runs"],
)
def test_mask_mods_read_one_small_table_where_constants_cannot_say_it(mask, dtype):
    """Unequal documents and many global runs: one captured int32 / bool table, read once per
    index (the 25x trap was an int64 table and a remainder on every element)."""
    ops, captured = _trace(mask_mod_for(mask, 97, 97, "cpu"))
    tables = {t.data_ptr(): t for t in captured}  # one table, read for q and for kv
    assert [t.dtype for t in tables.values()] == [dtype] and "remainder" not in ops


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
