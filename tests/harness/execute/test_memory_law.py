"""A plug-in's declared memory law, with no ``memory_model``: the runner's budget check and
``maxlen`` predict its workspace from the declared exponent, calibrated on one short measured
call (:mod:`harness.cost.memory_law`), and the row says how. Deterministic: every peak is
measured by the CPU allocator's events, nothing is timed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness import plugins, registry
from harness.cli import main
from harness.cost.memory_law import CALIBRATION_LEN
from harness.execute.calibrate_memory import calibrated
from harness.execute.maxlen import largest_fitting, predicted_max
from harness.execute.runner import run_point
from harness.measure.device import CpuDevice
from harness.measure.timing import TimingConfig
from harness.scenarios.case import CaseOptions
from harness.scenarios.interface import Point, cost_of, scenario_of
from harness.sweep.suite import MeasureConfig

SCORES = '''
import torch
from harness.registry import register
from harness.spec import Capabilities, Cost


@register("scores-n2", family="test", caps=Capabilities(devices={"cpu"}),
          cost=Cost(time_exponent=2, memory_exponent=2))
def scores_attention(q, k, v, mask, scale=None):
    """Softmax attention through the materialized (B, H, n_q, n_k) score matrix."""
    s = q @ k.transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
    if mask.causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(n_k - n_q + 1), -torch.inf)
    return torch.softmax(s, -1) @ v
'''
POINT = Point("scores-n2", heads=4, head_dim=32)


@pytest.fixture
def scores_plugin(tmp_path: Path, monkeypatch) -> Path:
    """The plug-in loaded into a copy of the registry (and of the loaded-files memory)."""
    registry.names()
    for module, name in ((registry, "_REGISTRY"), (registry, "_ORIGINS"),
                         (registry, "_CONTRACT"), (plugins, "_LOADED")):  # fmt: skip
        monkeypatch.setattr(module, name, dict(getattr(module, name)))
    # set, then removed: monkeypatch then restores the variable's absence after the test,
    # when the run under test set it (a --plugin run does, for its child processes)
    monkeypatch.setenv(plugins.PLUGINS_ENV, "")
    monkeypatch.delenv(plugins.PLUGINS_ENV)
    path = tmp_path / "scores.py"
    path.write_text(SCORES)
    registry.load_plugins([path])
    return path


def measured_peak(point: Point) -> int:
    """The point's peak as ``maxlen``'s verification measures it: inputs built and one call."""
    device = CpuDevice()

    def call() -> None:
        scenario_of(point).build_case(point, device, CaseOptions(check="none")).run()

    call()
    return device.peak_memory(call).peak_bytes


def test_maxlen_predicts_a_declared_n2_law_within_2x_of_the_measured_answer(scores_plugin):
    """Before: the prediction was the inputs alone (``maxlen --budget 256MiB`` predicted 32768
    where 1984 was true for such a plug-in)."""
    budget = 24 * 2**20
    true_max, _ = largest_fitting(lambda n: measured_peak(replace(POINT, seq_len=n)) <= budget,
                                  512, 64)  # fmt: skip
    predicted = predicted_max(POINT, budget, 64)
    assert true_max > CALIBRATION_LEN  # the law is extrapolated, not the call itself measured
    assert true_max / 2 <= predicted <= 2 * true_max, (predicted, true_max)


def test_the_budget_skips_what_the_law_says_is_over_and_the_row_says_how(scores_plugin):
    config = MeasureConfig(timing=TimingConfig(budget_s=0.05, min_samples=3, warmup_calls=1))
    row = run_point(replace(POINT, seq_len=2048), config, CpuDevice(), mem_budget=64 * 2**20)
    assert row["status"] == "skipped" and "predicted peak" in row["reason"]
    assert row["mem_prediction"] == f"declared-exponent (calibrated at n={CALIBRATION_LEN})"
    small = run_point(replace(POINT, seq_len=512), config, CpuDevice(), mem_budget=64 * 2**20)
    assert small["status"] == "ok"
    inputs = 3 * 4 * 512 * 32 * 4
    assert small["predicted_mem_bytes"] <= 2 * (small["peak_mem_bytes"] + inputs)
    assert small["predicted_mem_bytes"] >= (small["peak_mem_bytes"] + inputs) / 2


def test_how_each_prediction_is_made(scores_plugin):
    at = replace(POINT, seq_len=1024)
    assert cost_of(at).mem_prediction == "inputs"  # no device to calibrate on: analytic only
    with calibrated("cpu"):
        assert cost_of(at).mem_prediction.startswith("declared-exponent")
        assert cost_of(replace(at, impl="full")).mem_prediction == "model"
        assert cost_of(replace(at, impl="sdpa")).mem_prediction == "inputs"  # exponent 1


def test_maxlen_json_says_how_it_predicted(scores_plugin, capsys):
    args = ["maxlen", "scores-n2", "--heads", "4", "--head-dim", "32", "--budget", "24MiB"]
    code = main([*args, "--no-verify", "--json"])  # the plug-in is registered in this process
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["mem_prediction"].startswith("declared-exponent")
    assert out["predicted_max_seq_len"] < 4096  # the inputs alone would say ~50k
