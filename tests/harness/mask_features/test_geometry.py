"""The feature modules: ``-1`` read in one place, and the one block plan against the dense
rule (skipped, full or partial per block pair) on every kind of built-in mask."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from harness import block_plan as plan_mod
from harness.mask_features import RunsFeature, window
from harness.masks import MaskError, MaskSpec, dense_mask, kept_pairs
from harness.sweep.expand import _shape_fields
from harness.sweep.validate import SuiteReporter


def test_minus_one_is_read_by_window_side_only():
    assert window.side(-1) is None and window.side(None) is None and window.side(0) == 0
    with pytest.raises(ValueError, match="-2"):
        window.side(-2)
    assert MaskSpec(window=(-1, 3)).window == (None, 3)
    with pytest.raises(MaskError, match="window sides must be >= 0 or -1/None, got -2"):
        MaskSpec(window=(-2, 0))
    values = _shape_fields({"window": [-1, 5]}, "suite", SuiteReporter("suite.toml"))
    assert (values["window_left"], values["window_right"]) == (None, 5)


SPECS = [  # (spec, n_q, n_k, block_q, block_k)
    (MaskSpec(causal=True, window=(9, 0)), 70, 70, 16, 8),
    (MaskSpec(window=(3, 2), dilation=3, global_tokens=(2, 40, 41), prefix_len=17), 53, 61, 8, 16),
    (MaskSpec(causal=True, window=(4, 0), prefix_len=11, documents=(30, 1, 26)), 57, 57, 8, 8),
    (MaskSpec(causal=True, global_tokens=3), 45, 33, 16, 16),
    (MaskSpec(causal=True, window=(1, 0), block_size=8, random_blocks=1, global_tokens=8,
              seed=2), 50, 50, 16, 8),
    (MaskSpec(causal=True, window=(0, 0)), 40, 40, 8, 8),  # the diagonal only
]


@pytest.mark.parametrize(("spec", "n_q", "n_k", "bq", "bk"), SPECS,
                         ids=[s[0].describe() for s in SPECS])
def test_block_plan_states_are_the_dense_rule_per_block(spec, n_q, n_k, bq, bk):
    plan = plan_mod.block_plan(spec, n_q, n_k, bq, bk)
    mask = dense_mask(spec, n_q, n_k)
    padded = torch.zeros(plan.shape[0] * bq, plan.shape[1] * bk, dtype=torch.long)
    padded[:n_q, :n_k] = mask.long()
    per_block = padded.reshape(plan.shape[0], bq, plan.shape[1], bk).sum((1, 3))
    want = torch.where(per_block == 0, plan_mod.SKIP,
                       torch.where(per_block == bq * bk, plan_mod.FULL, plan_mod.PARTIAL))
    assert torch.equal(plan.states().long(), want)
    assert int(plan.count.sum()) == kept_pairs(spec, n_q, n_k)


@dataclass(frozen=True)
class _KeysOnly(RunsFeature):
    """Keys 0 and 1 visible to every query."""

    name = "keys-only"

    def key_runs(self):
        return ((0, 2),)


def test_band_tables_split_rows_and_keys_only_when_they_differ():
    """Global tokens (rows = keys): one list and one count table, as the kernels always read
    them (no APART clause). A keys-only feature: each direction lists partners then owns."""
    from implementations._kernels.triton.band_plan import OWN_SHIFT, TABLE
    from implementations._kernels.triton.plan_tables import band_tables

    tables = band_tables(MaskSpec(causal=True, window=(4, 0), global_tokens=(3, 9)), 20, 20,
                         "cpu")
    assert tables.gpos.tolist() == tables.gpos_t.tolist() == [3, 9]
    assert tables.gidx.numel() == 22 and "APART" not in tables.plan.flags
    assert all(s[8] >> OWN_SHIFT == 0 for s in tables.plan.slots)

    sinks = MaskSpec(causal=True, window=(4, 0), global_tokens=(9,),
                     extra=(_KeysOnly(),))
    tables = band_tables(sinks, 20, 20, "cpu")
    plan = tables.plan
    assert (plan.row_globals, plan.key_globals) == ((9,), (0, 1, 9))
    assert tables.gpos.tolist() == [0, 1, 9, 9] and tables.gpos_t.tolist() == [9, 0, 1, 9]
    assert tables.gidx.numel() == 2 * 22 and plan.flags["APART"]
    table_slot = [s for s in plan.slots if s[8] & TABLE]
    assert [(s[2], s[3]) for s in table_slot] == [(3, 1)]  # the row 9, past the 3 partners
    assert all(s[8] >> OWN_SHIFT == 22 for s in plan.slots if not s[8] & TABLE)



@pytest.mark.parametrize("spec", [MaskSpec(window=(2, 2), global_tokens=(0, 5)),
                                  MaskSpec(window=(3, 0), dilation=2, global_tokens=(0, 1, 7))],
                         ids=["positions", "positions-dilated"])
def test_fused_rows_before_the_first_key_with_global_position_zero(spec):
    """n_q > n_k, global positions naming 0: a row before the first key counts as position 0,
    a global row that keeps every key (rule 2). The band tables read the rows from the
    globals module, which says so; before, these rows kept only their band and the global
    keys (max error 1.85 and 2.09 against float64)."""
    pytest.importorskip("triton")
    from harness.oracle.agreement import output_agreement
    from harness.oracle.reference import reference_attention
    from implementations._kernels.triton import masked_attention
    from tests.conftest import make_qkv

    q, k, v = make_qkv(1, 1, 60, 40, 16, seed=1)
    out = masked_attention.triton_attention(q, k, v, spec)
    result = output_agreement(out, reference_attention(q, k, v, spec), torch.float32)
    assert result["agree"], result


def test_residue_classes_by_hand():
    """Dilation's class geometry (read by the CPU tiles and the Triton band slots): class
    sizes, class order and the count of a class in a range, against a by-hand count."""
    from harness.mask_features.dilation import class_order, class_sizes, in_class

    for n in range(0, 14):
        for d in range(1, 5):
            assert class_sizes(n, d).tolist() == [sum(p % d == r for p in range(n))
                                                  for r in range(d)]
            for first in range(-6, 4):
                want = sorted(range(n), key=lambda i: ((first + i) % d, i))
                assert class_order(first, n, d).tolist() == want
    for u in range(-4, 8):
        for v in range(-4, 9):
            for d, r in ((1, 0), (2, 1), (3, 0), (3, 2)):
                assert in_class(u, v, r, d) == sum(j % d == r for j in range(u, v))
