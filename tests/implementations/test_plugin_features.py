"""A plug-in mask feature is honoured by every registered path that accepts it.

The correctness matrix (test_matrix.py) draws its masks from MaskSpec's named fields; a path
that reads only those fields (``mask.window``, ``mask.global_tokens``) would pass all of it
and still give a wrong answer on a mask that carries a plug-in feature, since a plug-in
feature runs wherever the capability it ``needs`` is declared. Here every implementation
that accepts a runs-form and a predicate-form feature (``not_supported`` is empty) is run on
them, on odd sizes, against the float64 definition. A path that cannot honour one must refuse
it by name instead."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from harness import registry
from harness.mask_features import RunsFeature
from harness.mask_features.predicate import FULL, PARTIAL, PredicateFeature
from harness.masks import MaskSpec
from harness.oracle.agreement import output_agreement
from harness.oracle.reference import naive_attention, reference_attention
from harness.spec import Problem
from tests.conftest import make_qkv

COMPILED_FAMILIES = {"flex"}  # a compile per mask: covered by the mask feature tests
N, D = 97, 59


@dataclass(frozen=True)
class EveryThirtiethKey(RunsFeature):
    """Keys 0, 30, 60, 90 visible to every query (runs of one key)."""

    name = "every-30th"

    def key_runs(self):
        return tuple((j, j + 1) for j in range(0, 4096, 30))


@dataclass(frozen=True)
class EvenKeyGroups(PredicateFeature):
    """Keys in even groups of 8, plus the query's own group (every row keeps a key)."""

    name = "even-groups"

    def keep(self, p, j):
        return ((j // 8) % 2 == 0) | (j // 8 == p // 8)

    def classify(self, p0, p1, j0, j1):
        even_only = ((j0 // 8) == ((j1 - 1) // 8)) & ((j0 // 8) % 2 == 0)
        return np.where(even_only, FULL, PARTIAL).astype(np.int8)


try:  # the fused band kernels' twin of keep(); the module imports triton.language (jit needs it)
    import triton
    import triton.language as tl
except ImportError:  # no Triton: the fused paths refuse the feature by name
    triton = None

if triton is not None:

    @triton.jit
    def even_groups_keep(p, j):
        """keep() on int32 tensors; Triton's // truncates, so p's group is floored by hand."""
        own = tl.where(p < 0, (p - 7) // 8, p // 8)
        return ((j // 8) % 2 == 0) | (j // 8 == own)

    EvenKeyGroups.triton_keep = even_groups_keep


MASKS = {
    "runs": MaskSpec(causal=True, window=(6, 0), extra=(EveryThirtiethKey(),)),
    "predicate": MaskSpec(causal=True, window=(24, 0), extra=(EvenKeyGroups(),)),
}


def _implementations():
    for impl in registry.all_implementations():
        if impl.family not in COMPILED_FAMILIES and not impl.approximate:
            for mask_id in MASKS:
                yield pytest.param(impl.name, mask_id, id=f"{impl.name}-{mask_id}")


@pytest.mark.parametrize("name,mask_id", list(_implementations()))
def test_a_path_that_accepts_a_plugin_feature_honours_it(name, mask_id):
    impl = registry.get(name)
    mask = MASKS[mask_id]
    feature = mask.extra[0].name
    problem = Problem(batch=1, heads=2, n_q=N, n_k=N, head_dim=D, mask=mask)
    reasons = impl.not_supported(problem)
    if reasons:
        base = replace(problem, mask=replace(mask, extra=()))
        if not impl.not_supported(base):  # the feature alone is refused: by its name
            assert any(feature in r for r in reasons), reasons
        pytest.skip("; ".join(reasons))
    q, k, v = make_qkv(1, 2, N, N, D, seed=11)
    out = impl(q, k, v, mask)
    ref = reference_attention(q, k, v, mask)
    result = output_agreement(out, ref, torch.float32, naive=naive_attention(q, k, v, mask))
    assert result["agree"], f"{name} on a {feature} mask: {result}"


@pytest.mark.parametrize("mask_id", list(MASKS))
def test_only_paths_proven_here_accept_a_plugin_feature(mask_id):
    """From the declarations alone, so CUDA-only paths are checked on a CPU too: a path that
    accepts a plug-in feature must be one the test above runs against float64 on this CPU (or
    a compiled Flex variant, run by the mask feature tests). flash-attn declares windows and
    would run its own ``window_size`` with a predicate ignored: it must refuse the feature,
    by name, and so must every path that declares a window but not the feature's need."""
    mask = MASKS[mask_id]
    feature = mask.extra[0]
    problem = Problem(batch=1, heads=2, n_q=N, n_k=N, head_dim=D, mask=mask)
    base = replace(problem, mask=replace(mask, extra=()))
    accepting, proven = set(), set()
    for impl in registry.all_implementations():
        anywhere = {"dtype": next(iter(impl.caps.dtypes)), "device": next(iter(impl.caps.devices))}
        own = replace(base, **anywhere)
        if impl.caps.reasons(own) or (impl.extra_reasons and impl.extra_reasons(own)):
            continue  # the mask without the feature is refused already (bigbird: no blocks)
        reasons = impl.caps.reasons(replace(problem, **anywhere))
        if reasons:
            assert any(feature.name in r for r in reasons), (impl.name, reasons)
        else:
            accepting.add(impl.name)
        if impl.family in COMPILED_FAMILIES or not impl.not_supported(problem):
            proven.add(impl.name)
    assert len(accepting) >= 3, accepting
    assert accepting <= proven, f"accepted but never run against float64: {accepting - proven}"


def test_the_predicate_twin_agrees_in_the_fused_kernels():
    """The Triton twin above, through the fused band kernels under the interpreter (rows
    before the first key included: n_q > n_k), against float64."""
    pytest.importorskip("triton")
    from implementations._kernels.triton import masked_attention

    mask = MASKS["predicate"]
    q, k, v = make_qkv(1, 2, 41, 33, 16, seed=5)
    out = masked_attention.triton_attention(q, k, v, mask)
    ref = reference_attention(q, k, v, mask)
    result = output_agreement(out, ref, torch.float32, naive=naive_attention(q, k, v, mask))
    assert result["agree"], result
