"""The agreement gate catches wrong answers at long sequences, where a fixed atol cannot.

Planted bugs on correct CPU implementations at n = 16384 (B=1, H=1, D=32), bf16 and fp32,
through the runner's sampled-rows check path. Each bug must come out ``agree = false``; the
correct implementation must agree on the same inputs (the gate is not failing everything).
"""

from __future__ import annotations

import math

import pytest
import torch

from harness import registry
from harness.masks import MaskSpec
from harness.oracle.agreement import TOLERANCES, judge, output_agreement
from harness.scenarios.attention.attention_case import make_inputs
from harness.scenarios.attention.checking import (
    boundary_rows,
    check_attention,
    checked_rows,
    judge_rows,
    sample_rows,
)
from harness.scenarios.interface import Point, check_choice

N, D = 16384, 32
WINDOW = (255, 0)  # a causal sliding window of 256 keys


def _point(dtype: str, causal: bool = False, window: tuple[int, int] | None = None) -> Point:
    left, right = window if window else (None, None)
    impl = "local" if window else "sdpa"
    return Point.of(impl=impl, dtype=dtype, seq_len=N, heads=1, head_dim=D, causal=causal,
                 window_left=left, window_right=right, seed=3)


def _core(name: str, mask: MaskSpec):
    fn = registry.get(name).fn  # the raw core: bugs below call it with masks/scales of their own
    return lambda q, k, v, scale=None: fn(q, k, v, mask, scale=scale)


def _zero_tile(tile: int, index: int):
    def run(q, k, v, good):
        out = good.clone()
        out[..., tile * index : tile * (index + 1), :] = 0
        return out

    return run


def _causal_plus_one(q, k, v, good):
    """Causal with ``j <= i + 1``: n-1 queries against n keys, bottom-right aligned, keep one
    key too many per row; the last row has no key i + 1 and stays right."""
    attn = _core("sdpa", MaskSpec(causal=True))
    return torch.cat([attn(q[..., :-1, :], k, v), good[..., -1:, :]], dim=-2)


# bug -> (causal point?, the buggy output from the inputs and the correct sdpa output). Dense
# (non-causal) outputs at n = 16k are ~0.01: that is where a fixed atol let wrong answers pass.
BUGS = {
    "output-x0.5": (False, lambda q, k, v, good: good * 0.5),
    "64-row-tile-zeroed": (False, _zero_tile(64, 101)),
    "256-row-tile-zeroed": (False, _zero_tile(256, 37)),
    "wrong-scale-1/D": (
        False, lambda q, k, v, good: _core("sdpa", MaskSpec())(q, k, v, scale=1 / D)
    ),
    "causal-off-by-one": (True, _causal_plus_one),
}
_CASES: dict = {}


def _case(dtype: str, causal: bool):
    """Inputs, the correct sdpa output and the sampled reference rows of one n=16384 point
    (computed once per module: the float64 rows are the slow part)."""
    if (dtype, causal) not in _CASES:
        point = _point(dtype, causal)
        choice = check_choice(point)
        assert choice.extent == "rows"  # the runner's path at this size
        q, k, v = make_inputs(point, "cpu")
        with torch.no_grad():
            good = _core("sdpa", point.mask)(q, k, v)
        _CASES[dtype, causal] = point, (q, k, v, good), checked_rows(q, k, v, point, choice)
    return _CASES[dtype, causal]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_is_caught(dtype, bug):
    causal, make_bug = BUGS[bug]
    point, (q, k, v, good), (rows, ref, naive) = _case(dtype, causal)
    with torch.no_grad():
        out = make_bug(q, k, v, good)
    result = judge_rows(out, rows, ref, naive, point.torch_dtype)
    assert result["agree"] is False, result
    assert result["mismatch_reason"]
    assert judge_rows(good, rows, ref, naive, point.torch_dtype)["agree"] is True


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_correct_sdpa_agrees_and_x05_does_not_through_check_attention(dtype):
    point, (q, k, v, _), _ = _case(dtype, causal=False)
    attn = registry.get("sdpa").prepare(point.problem())
    choice = check_choice(point)
    good = check_attention(attn, q, k, v, None, point, choice)
    assert good["agree"] is True, good
    assert good["naive_err"] > 0 and good["naive_rel_err"] > 0
    assert good["max_abs_err"] <= good["tolerance"] and good["rel_err"] <= good["rel_tolerance"]
    bad = check_attention(lambda *a: attn(*a) * 0.5, q, k, v, None, point, choice)
    assert bad["agree"] is False, bad


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_window_off_by_one_is_caught_and_the_right_window_agrees(dtype):
    point = _point(dtype, causal=True, window=WINDOW)
    choice = check_choice(point)
    q, k, v = make_inputs(point, "cpu")
    rows, ref, naive = checked_rows(q, k, v, point, choice)
    with torch.no_grad():
        right = _core("local", point.mask)(q, k, v)
        wide = _core("local", MaskSpec(causal=True, window=(WINDOW[0] + 1, 0)))(q, k, v)
    good = judge_rows(right, rows, ref, naive, point.torch_dtype)
    assert good["agree"] is True, good
    assert judge_rows(wide, rows, ref, naive, point.torch_dtype)["agree"] is False


def test_nonfinite_output_never_agrees():
    ref = torch.randn(2, 3, 8, 4, dtype=torch.float64)
    naive = ref.float()
    out = naive.clone()
    out[0, 0, 0, 0] = float("nan")
    result = output_agreement(out, ref, torch.float32, naive=naive)
    assert result["agree"] is False and result["nonfinite"] and result["max_abs_err"] is None


def test_rule_bounds_both_errors():
    tol = TOLERANCES[torch.bfloat16]
    naive, scale = (1e-2, 1e-3), 0.5
    eps_abs = tol.eps * scale
    within = judge(
        (tol.k_abs * 1e-2 + eps_abs, tol.k * 1e-3 + tol.eps), naive, torch.bfloat16, scale
    )
    assert within["agree"] is True
    abs_only = judge((tol.k_abs * 1e-2 + 2 * eps_abs, 1e-3), naive, torch.bfloat16, scale)
    rel_only = judge((1e-2, tol.k * 1e-3 + 2 * tol.eps), naive, torch.bfloat16, scale)
    assert abs_only["agree"] is False and "max_abs_err" in abs_only["mismatch_reason"]
    assert rel_only["agree"] is False and "rel_err" in rel_only["mismatch_reason"]
    assert judge((None, None), naive, torch.bfloat16, scale)["agree"] is False


def test_eps_is_the_dtype_ulp():
    for dtype, tol in TOLERANCES.items():
        assert tol.eps == torch.finfo(dtype).eps and tol.k == 2 and tol.k_abs == 4


@pytest.mark.parametrize("n", [4097, 8192, 16384, 65536, 65537])
def test_sample_holds_every_64_row_tile_boundary(n):
    rows = set(sample_rows(n, seed=5).tolist())
    for start in range(0, n, 64):  # first and last row of every 64, 128 and 256-row tile
        assert start in rows and min(start + 63, n - 1) in rows
    assert len(rows) >= len(boundary_rows(n, 64)) + 200  # random rows on top
    assert len(rows) <= max(2 * math.ceil(n / 64), 512) + 256
    assert sample_rows(n, seed=5).tolist() == sorted(rows)
    assert set(sample_rows(n, seed=6).tolist()) != rows  # the random part is seeded


def test_finer_tiles_when_the_budget_allows():
    rows = set(sample_rows(8192).tolist())
    assert all(s in rows and s + 31 in rows for s in range(0, 8192, 32))
    rows = set(sample_rows(4096).tolist())
    assert all(s in rows and s + 15 in rows for s in range(0, 4096, 16))
