"""The linear-complexity family in the scenarios: an approximation is held to its own float64
definition in a sweep and its distance from softmax attention is the ``approx_err`` column;
every new implementation runs in the block and backward scenarios; ``cache = "state"`` decodes
through the recurrent state (O(1) per step); bad method parameters and a state cache for a
core without a recurrence are refused in one line."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from harness import registry
from harness.analysis.claims import DEFAULT_CLAIMS, load_claims
from harness.analysis.verdicts import evaluate
from harness.cli import main
from harness.errors import SuiteError
from harness.execute.runner import run_point
from harness.measure.device import CpuDevice
from harness.measure.timing import TimingConfig
from harness.oracle.agreement import rel_frobenius
from harness.oracle.reference import reference_attention
from harness.render import table
from harness.results import load_rows
from harness.scenarios.attention.attention_case import make_inputs
from harness.scenarios.attention.checking import sample_rows
from harness.scenarios.case import CaseOptions
from harness.scenarios.decode.caches import StateCache
from harness.scenarios.interface import Point, cost_of, scenario_of
from harness.sweep.suite import MeasureConfig, parse_suite

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

CPU = CpuDevice()
FAST = MeasureConfig(
    timing=TimingConfig(budget_s=0.01, min_samples=2, warmup_calls=1), passes=1, check="full"
)
ROWS = dataclasses.replace(FAST, check="rows")
# odd sizes; linformer projects to fewer rows than the 97 keys
PARAMS = {"linformer": {"projected_len": 40}, "nystrom": {"landmarks": 13}, "performer": {}}
CASES = [
    ("linear", False), ("linear", True), ("performer", False), ("performer", True),
    ("linformer", False), ("nystrom", False),
]  # fmt: skip


def _attention(impl: str, causal: bool, scenario: str = "attention", **kw) -> Point:
    base = dict(seq_len=97, heads=2, head_dim=59, causal=causal, seed=3)
    return Point.of(impl, scenario, **{**base, **PARAMS.get(impl, {}), **kw})


def _output(point: Point) -> tuple[torch.Tensor, tuple]:
    q, k, v = make_inputs(point, "cpu")
    impl = registry.get(point.impl)
    with torch.no_grad():
        return impl(q, k, v, point.mask, **dict(point.params)), (q, k, v)


# --- approximations in a sweep -------------------------------------------------------------


@pytest.mark.parametrize("impl, causal", CASES)
def test_an_approximation_agrees_with_its_own_definition_and_measures_approx_err(impl, causal):
    point = _attention(impl, causal)
    row = run_point(point, FAST, CPU)
    assert row["status"] == "ok" and row["agree"] is True, row
    out, (q, k, v) = _output(point)
    exact = reference_attention(q, k, v, point.mask)
    assert row["approx_err"] == pytest.approx(rel_frobenius(out, exact), rel=1e-6)
    assert row["approx_err"] > 1e-2  # an approximation, not softmax attention
    assert row["rel_err"] < 1e-5  # against its own definition


def test_approx_err_on_sampled_rows():
    point = _attention("performer", True, seq_len=901, head_dim=16, qk_std=0.25)
    row = run_point(point, ROWS, CPU)
    assert row["check"] == "rows" and row["agree"] is True
    rows = sample_rows(point.n_q, seed=point.seed)
    out, (q, k, v) = _output(point)
    exact = reference_attention(q, k, v, point.mask, rows=rows)
    assert row["approx_err"] == pytest.approx(rel_frobenius(out[..., rows, :], exact), rel=1e-6)


def test_an_exact_implementation_has_no_approx_err():
    row = run_point(_attention("sdpa", True), FAST, CPU)
    assert row["agree"] is True and "approx_err" not in row


def test_a_wrong_approximation_is_a_mismatch(monkeypatch):
    """Output 0.1% off its own definition: far inside approx_err, far outside the rule."""
    impl = registry.get("performer")

    def off(*args, **kw):
        return impl.fn(*args, **kw) * 1.001

    monkeypatch.setitem(registry._REGISTRY, "performer", dataclasses.replace(impl, fn=off))
    row = run_point(_attention("performer", False), FAST, CPU)
    assert row["status"] == "mismatch" and row["agree"] is False


def test_performer_error_falls_with_the_features_at_small_inputs():
    """FAVOR+'s estimator: more features, closer to softmax (q, k with std 0.25)."""
    errs = [
        run_point(_attention("performer", False, qk_std=0.25, features=m), FAST, CPU)["approx_err"]
        for m in (16, 256)
    ]
    assert errs[1] < 0.5 * errs[0]


# --- block and backward --------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["attention+backward", "block", "block+backward"])
@pytest.mark.parametrize("impl, causal", CASES)
def test_every_new_implementation_runs_in_block_and_backward_points(impl, causal, scenario):
    point = _attention(impl, causal, scenario, seq_len=67, head_dim=12)
    row = run_point(point, FAST, CPU)
    assert row["status"] == "ok" and row["agree"] is True, row
    if scenario.endswith("backward"):
        assert row["check"] == "full+grads" and row["grad_rel_err"] < 1e-4


def test_a_wrong_approximation_fails_the_block_check(monkeypatch):
    impl = registry.get("linear")
    monkeypatch.setitem(
        registry._REGISTRY, "linear",
        dataclasses.replace(impl, fn=lambda *a, **kw: impl.fn(*a, **kw) * 1.01),
    )  # fmt: skip
    row = run_point(_attention("linear", True, "block", seq_len=67, head_dim=12), FAST, CPU)
    assert row["agree"] is False


# --- decode with a recurrent state ---------------------------------------------------------


def _decode(impl: str, cache: str = "state", n: int = 37, **kw) -> Point:
    base = dict(seq_len=n, heads=4, head_dim=10, layers=2, gen_tokens=6, causal=True, batch=2)
    return Point.of(impl, "decode", cache=cache, **{**base, **kw})


def _case(point: Point, check: str = "auto"):
    return scenario_of(point).build_case(point, CPU, CaseOptions(check))


@pytest.mark.parametrize("impl", ["linear", "performer"])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_state_decode_agrees_with_the_float64_definition(impl, kv_heads):
    case = _case(_decode(impl, kv_heads=kv_heads))
    case.run()
    result = case.check()
    assert result["agree"] is True and result["check"] == "float64", result
    assert result["recompute_max_abs_err"] < 1e-5
    assert result["timed_step_max_abs_err"] == 0.0  # the timed step is step 0 of the check


@pytest.mark.parametrize("impl", ["linear", "performer"])
def test_the_timed_state_step_repeats_and_the_state_does_not_grow(impl):
    point = _decode(impl)
    case = _case(point, "none")
    first = case.run()
    before = case.extra(None, None)
    again = [case.run() for _ in range(4)]
    after = case.extra(None, None)  # re-prefills: a fresh state over the same context
    assert all(torch.equal(first, out) for out in again)
    assert torch.equal(case.run(), first)
    state = registry.get(impl).recurrence.state_bytes(cost_of(point).step)
    assert before["state_bytes"] == after["state_bytes"] == 2 * state
    assert before["cache_bytes"] == before["cache_bytes_analytic"] == 2 * state


def test_a_state_that_forgets_its_undo_copy_is_caught(monkeypatch):
    """Redoing the step without restoring adds the token twice: the timed step drifts."""
    monkeypatch.setattr(StateCache, "_restore", lambda self: None)
    case = _case(_decode("linear"))
    case.run()
    result = case.check()
    assert result["timed_step_max_abs_err"] > 0 and result["agree"] is False


def test_a_state_step_costs_the_same_at_any_context():
    short, long = cost_of(_decode("linear", n=64)), cost_of(_decode("linear", n=4096))
    assert short.useful_flops == long.useful_flops > 0
    assert short.step_bytes == long.step_bytes and short.cache_bytes == long.cache_bytes
    full = cost_of(_decode("linear", "full", n=4096))
    assert full.useful_flops > long.useful_flops and full.cache_bytes > long.cache_bytes
    assert long.step.n_q == long.step.n_k == 1


def test_state_cache_needs_a_plain_causal_model():
    point = _decode("linear", window_left=7, window_right=0)
    assert any("plain causal" in r for r in scenario_of(point).support(point))


# --- bad input -----------------------------------------------------------------------------

DECODE_SUITE = """
name = "bad"
scenario = "decode"
implementations = ["{impl}"]
device = "cpu"
[fixed]
heads = 2
head_dim = 8
causal = true
cache = "state"
seq_len = 64
"""

ATTENTION_SUITE = """
name = "bad"
scenario = "attention"
implementations = ["{impl}"]
device = "cpu"
[fixed]
heads = 2
head_dim = 8
seq_len = 64
{extra}
"""


def test_cache_state_for_a_core_without_a_recurrence_is_a_suite_error():
    doc = {"name": "t", "scenario": "decode", "implementations": ["sdpa"],
           "fixed": {"causal": True, "cache": "state", "seq_len": 32}}  # fmt: skip
    with pytest.raises(SuiteError, match="sdpa has no recurrent state"):
        parse_suite(doc)
    assert parse_suite({**doc, "implementations": ["linear", "performer"]}).points


@pytest.mark.parametrize(
    "impl, extra, message",
    [
        ("performer", "features = 0", "features = 0 is below its minimum 1"),
        ("nystrom", "landmarks = -3", "landmarks = -3 is below its minimum 1"),
        ("linformer", "projected_len = 0", "projected_len = 0 is below its minimum 1"),
        ("sdpa", "features = 64", "features"),
    ],
)
def test_a_bad_method_parameter_is_one_line_exit_2_and_nothing_written(
    tmp_path, capsys, impl, extra, message
):
    suite = tmp_path / "bad.toml"
    suite.write_text(ATTENTION_SUITE.format(impl=impl, extra=extra))
    out = tmp_path / "run"
    assert main(["run", str(suite), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err
    assert not out.exists()


def test_cache_state_for_sdpa_on_the_command_line(tmp_path, capsys):
    suite = tmp_path / "bad.toml"
    suite.write_text(DECODE_SUITE.format(impl="sdpa"))
    out = tmp_path / "run"
    assert main(["run", str(suite), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no recurrent state" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "point, reason",
    [
        (_attention("linformer", False, projected_len=128), "projecting them up"),
        (_attention("nystrom", False, landmarks=200), "landmarks"),
        (_attention("linformer", True), "mask features ['causal'] not supported"),
        (_attention("nystrom", True), "mask features ['causal'] not supported"),
    ],
)
def test_out_of_range_for_the_point_is_a_skipped_row_with_the_reason(point, reason):
    row = run_point(point, FAST, CPU)
    assert row["status"] == "skipped" and reason in row["reason"], row


# --- tables and the listing ----------------------------------------------------------------


def test_tables_show_approx_err_and_cache_bytes_where_rows_have_them(tmp_path, capsys):
    suite = tmp_path / "s.toml"
    suite.write_text(
        ATTENTION_SUITE.format(impl="performer", extra="").replace(
            '["performer"]', '["performer", "sdpa"]'
        )
        + "[measure]\nbudget_s = 0.01\nmin_samples = 2\npasses = 1\n"
    )
    out = tmp_path / "run"
    assert main(["run", str(suite), "--out", str(out), "--no-progress", "--no-table"]) == 0
    frame = load_rows(out)
    assert table.default_metrics(frame) == ("time_median_s", "peak_mem_bytes", "approx_err")
    assert main(["table", str(out)]) == 0
    assert table.TITLES["approx_err"] in capsys.readouterr().out  # its human title


def test_list_shows_method_parameters(capsys):
    assert main(["list", "--json"]) == 0
    listed = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    assert listed["performer"]["params"]["features"]["default"] == 256
    assert listed["performer"]["approximate"] and listed["performer"]["recurrent"]
    assert listed["linformer"]["params"]["projected_len"]["default"] == 256
    assert not listed["sdpa"]["params"] and not listed["sdpa"]["approximate"]


# --- the shipped claims on synthetic rows --------------------------------------------------

SHIPPED = {c.id: c for c in load_claims(DEFAULT_CLAIMS)}
CALIBRATION = {"matmul_flops_per_s": 1.75e11, "mem_bandwidth_bytes_per_s": 3.6e10}
CPU_ENV = {"cpu": {"run_id": "cpu", "calibration": {**CALIBRATION, "dtype": "float32"}}}


def _error_rows(slope: float, qk_std: float = 0.25) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    for m in (64, 128, 256, 512, 1024):
        point = Point.of("performer", seq_len=4096, heads=4, features=m, qk_std=qk_std)
        err = 0.9 * m**slope * float(np.exp(rng.normal(0, 0.02)))
        rows.append({**point.columns(), "status": "ok", "run_id": "cpu", "approx_err": err})
    return pd.DataFrame(rows)


def test_the_favor_error_claim_fits_approx_err_over_the_features():
    claim = SHIPPED["performer-error-m-half-small-inputs"]
    assert evaluate(claim, _error_rows(-0.5), CPU_ENV).verdict == "confirmed"
    assert evaluate(claim, _error_rows(-0.05), CPU_ENV).verdict == "refuted"
    other = SHIPPED["performer-error-m-half-unit-inputs"]  # rows at qk_std 0.25 are not its own
    assert evaluate(other, _error_rows(-0.5), CPU_ENV).verdict == "inconclusive"


def test_the_state_step_claim_is_judged_on_state_rows_only():
    ns = [int(1024 * 2 ** (i / 2)) for i in range(9)]
    rows = []
    for cache, time_of in (("state", lambda n: 2e-3), ("full", lambda n: 1e-3 + n * 1e-7)):
        for n in ns:
            point = _decode("linear", cache, n=n, heads=8, head_dim=64, batch=1)
            t = time_of(n)
            rows.append({**point.columns(), "status": "ok", "run_id": "cpu", "time_median_s": t,
                         "time_samples_s": [t] * 5, "state_bytes": 1024})  # fmt: skip
    verdict = evaluate(SHIPPED["state-decode-step-n0"], pd.DataFrame(rows), CPU_ENV)
    assert verdict.verdict == "confirmed" and abs(verdict.measured) < 0.05
