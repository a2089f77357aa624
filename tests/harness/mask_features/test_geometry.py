"""The feature modules: ``-1`` read in one place, and the one block plan against the dense
rule (skipped, full or partial per block pair) on every kind of built-in mask."""

from __future__ import annotations

import pytest
import torch

from harness.mask_features import block_plan as plan_mod
from harness.mask_features import window
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
