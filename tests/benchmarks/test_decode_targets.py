"""``benchmarks/decode_targets.py``'s GPU target without a GPU: the cached step at the largest
context <= 32k must move its bytes at >= 80% of the measured bandwidth, judged for SDPA's
decode path and the split-KV kernels (``flash-tiled``) alike; ``--add-impl`` times the
split-KV kernels beside a suite's SDPA points."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from harness.sweep.suite import load_suite

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("decode_targets", ROOT / "benchmarks" /
                                              "decode_targets.py")
decode_targets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(decode_targets)


def _rows(impl: str, device: str, fractions: dict[int, float]) -> pd.DataFrame:
    return pd.DataFrame([
        {"status": "ok", "impl": impl, "device": device, "seq_len": n, "heads": 32,
         "kv_heads": None, "window_left": None, "cache": "full", "time_median_s": 1e-3 * n / 8192,
         "bw_fraction": f, "decode_graph": "cuda-graph", "cache_bytes": 1.0,
         "cache_bytes_analytic": 1.0}
        for n, f in fractions.items()
    ])


@pytest.mark.parametrize("impl", ["sdpa", "flash-tiled"])
@pytest.mark.parametrize(("fraction", "met"), [(0.85, True), (0.8, True), (0.7, False)])
def test_the_cached_step_at_32k_must_reach_80_percent_of_bandwidth(impl, fraction, met):
    rows = _rows(impl, "cuda", {8192: 0.3, 32768: fraction, 65536: 0.1})  # 64k: past 32k
    verdicts = {name: (value, ok) for name, value, ok in decode_targets.judge(rows, impl)}
    name = "bw_fraction of the cached step at n=32768 (cuda-graph) >= 0.8"
    assert verdicts[name] == (pytest.approx(fraction), met)


def test_a_cpu_row_is_information_not_a_target():
    rows = _rows("sdpa", "cpu", {4096: 0.1})
    verdicts = {name: ok for name, _, ok in decode_targets.judge(rows, "sdpa")}
    assert verdicts["bw_fraction of the cached step at n=4096 (cuda-graph) >= 0.8"] is None


def test_add_impl_times_the_split_kv_kernels_beside_each_sdpa_point(monkeypatch):
    """--add-impl flash-tiled: every point of the GPU smoke suite once more with flash-tiled,
    through run_point (faked here: no GPU)."""
    seen = []

    def fake_run_point(point, config, device):
        seen.append(point)
        return {"point_id": f"{point.impl}-{point.seq_len}", "time_median_s": 1.0}

    monkeypatch.setattr(decode_targets, "run_point", fake_run_point)
    monkeypatch.setattr(decode_targets, "get_device", lambda kind, flush: kind)
    suite = ROOT / "suites" / "gpu-smoke-decode.toml"
    df = decode_targets.run_direct(1, None, 0.1, suite, ("flash-tiled",))
    points = load_suite(suite).points
    assert [(p.impl, p.seq_len) for p in seen] == [(p.impl, p.seq_len) for p in points] + [
        ("flash-tiled", p.seq_len) for p in points]
    assert {p.settings.cache for p in seen} == {"full"} and len(df) == 2 * len(points)
