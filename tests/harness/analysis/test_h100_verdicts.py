"""Verdicts on real H100 rows (one lease, 2026-11-26): no poisoning from another suite's thin
group, no refutation by tile overhead, ratio claims answered along the axis.

The rows under ``data/h100/`` are the shared rows of that lease (the sdpa-flash and full rows of
claims-gpu, the sdpa-flash rows of claims-linear-gpu, every local row of claims-gpu-local),
per-call samples rounded to 6 significant digits; env.json as written there.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from harness.analysis.claims import DEFAULT_CLAIMS, load_claims
from harness.analysis.verdicts import judge_claims
from harness.results import load_envs, load_runs

DATA = Path(__file__).parent / "data" / "h100"
FOLDERS = ("claims-gpu", "claims-gpu-local", "claims-linear-gpu")
CLAIMS = {c.id: c for c in load_claims(DEFAULT_CLAIMS)}


def verdicts(*folders: str, ids=None) -> dict:
    """claim id -> Verdict over the rows of ``folders``."""
    dirs = [DATA / f for f in folders]
    claims = [CLAIMS[i] for i in ids] if ids else list(CLAIMS.values())
    judged, _ = judge_claims(claims, load_runs(dirs), load_envs(dirs))
    return {v.claim: v for v in judged}


@pytest.mark.parametrize(
    "folders",
    [c for k in (1, 2, 3) for c in itertools.combinations(FOLDERS, k) if "claims-gpu" in c],
    ids="+".join,
)
def test_the_n2_time_claims_are_confirmed_with_any_other_suite_beside(folders):
    """claims-gpu confirms flash-time-n2 and attention-time-n2; a thin (3-point) sdpa-flash
    group of claims-linear-gpu is listed, not counted, so adding that run changes nothing."""
    got = verdicts(*folders, ids=["flash-time-n2", "attention-time-n2"])
    assert got["flash-time-n2"].verdict == "confirmed", got["flash-time-n2"].reason
    assert got["flash-time-n2"].measured == pytest.approx(2.0, abs=0.05)
    assert got["attention-time-n2"].verdict == "confirmed", got["attention-time-n2"].reason
    if "claims-linear-gpu" in folders:
        assert "not judged: batch=1, head_dim=64, d_model=1024 (thin data: 3 points)" in \
            got["flash-time-n2"].reason
        assert got["flash-time-n2"].group.startswith("batch=4")


def test_the_linear_suite_alone_leaves_flash_time_inconclusive_for_thin_data():
    """The thin group decides nothing when it is the only one: inconclusive, never confirmed."""
    alone = verdicts("claims-linear-gpu", ids=["flash-time-n2"])["flash-time-n2"]
    assert alone.verdict == "inconclusive" and alone.reason.startswith("thin data (3 points:")


def test_local_time_in_the_window_is_not_refuted_by_tile_overhead():
    """At w = 256..2048 a 128x64-tile kernel executes a band of w + 128 keys a row: the
    executed work grows as w^0.78 at n = 8192, so these sizes cannot test O(n·w)."""
    got = verdicts("claims-gpu-local", ids=["local-time-w1", "local-time-n1"])
    w1 = got["local-time-w1"]
    assert w1.verdict == "inconclusive"
    assert "executed work grows as window^0.78" in w1.reason and "tile overhead" in w1.reason
    assert "sizes too small to test O(n·w)" in w1.reason
    assert all(g["verdict"] != "refuted" for g in w1.groups)
    assert got["local-time-n1"].verdict == "confirmed"  # linear in n at every window that decides


def test_ratio_claims_give_their_regions_along_n():
    got = verdicts("claims-gpu", ids=["flash-speedup-2-4x", "flash-memory-5-20pct",
                                      "false-full-memory-n1"])
    speedup, memory = got["flash-speedup-2-4x"], got["flash-memory-5-20pct"]
    assert speedup.verdict == "holds in part"
    assert "holds at 1536..2048 (3.6–3.64)" in speedup.reason
    assert "above at 3072..4096 (4.17–4.38)" in speedup.reason
    inside = [r for r in speedup.regions if r["where"] == "inside"]
    assert [(r["from"], r["to"]) for r in inside] == [(1536.0, 2048.0)]
    assert all(r["ci_low"] >= 2.0 and r["ci_high"] <= 4.0 for r in inside)
    assert memory.verdict == "holds in part"
    assert [(r["from"], r["to"], r["where"]) for r in memory.regions] == [
        (1024.0, 1024.0, "inside"), (1536.0, 8192.0, "below")]
    assert memory.reason.startswith("holds at seq_len 1024 (0.0597); below from 1536")
    assert got["false-full-memory-n1"].verdict == "refuted"  # the false control stays refuted
