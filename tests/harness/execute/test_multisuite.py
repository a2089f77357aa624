"""The order of a session over several suites (``attnbench verdicts``): pure functions of the
suites, the claims and predicted seconds; nothing is measured here."""

from __future__ import annotations

from pathlib import Path

from harness.analysis.claims import parse_claims
from harness.analysis.groups import StoppingRule, judged_groups
from harness.execute.deadline import Deadline
from harness.execute.multisuite import Session
from harness.execute.stages import DEAR, Member, point_levels, schedule
from harness.sweep.suite import parse_suite

SUITE = {
    "name": "s",
    "scenario": "attention",
    "implementations": ["full", "sdpa"],
    "fixed": {"heads": 2, "head_dim": 8},
    "sweep": {"seq_len": [64, 128, 256, 512, 1024, 8192]},
}
CLAIMS = {
    "claim": [
        {
            "id": "mem",
            "impl": "full",
            "metric": "peak_mem_bytes",
            "over": "seq_len",
            "expect_exponent": 2.0,
        },
        {
            "id": "time",
            "impl": "sdpa",
            "metric": "time_median_s",
            "over": "seq_len",
            "expect_exponent": 2.0,
        },
        {
            "id": "ratio",
            "impl": "sdpa",
            "baseline": "full",
            "metric": "peak_mem_bytes",
            "over": "seq_len",
            "expect_ratio_min": 0.5,
            "expect_ratio_max": 2.0,
        },
    ]
}


def member(tmp_path: Path, claims=None) -> Member:
    suite = parse_suite(SUITE, "s.toml")
    claims = claims or parse_claims(CLAIMS)
    groups = judged_groups(suite.points, claims)
    timed = frozenset(c.id for c in claims if c.timed)
    # n = 8192 is dear: predicted 64x n = 1024's seconds
    return Member(
        suite,
        tmp_path / "s",
        groups,
        StoppingRule(groups, claims),
        timed,
        lambda p: (p.seq_len / 1024) ** 2,
    )


def labels(m: Member, ids) -> list[str]:
    by_id = {p.point_id: f"{p.impl}@{p.seq_len}" for p in m.suite.points}
    return [by_id[pid] for pid in ids]


def test_counted_claims_lead_a_time_claim_by_a_level_and_dear_points_come_last(tmp_path):
    m = member(tmp_path)
    levels = point_levels(m, limit_s=100.0)  # dear: over 3 s
    by = dict(zip(labels(m, levels), levels.values(), strict=True))
    assert by["full@64"] == by["full@1024"] == 0  # the ends of mem's affordable axis
    assert by["full@8192"] >= DEAR and by["sdpa@8192"] >= DEAR
    assert by["sdpa@64"] == 0  # ratio's pair at 64 runs with full@64
    assert by["full@256"] == 1  # mem's middle
    stages = schedule([m], 100.0)
    first = labels(m, stages[0].point_ids)
    assert set(first) == {"full@64", "sdpa@64", "full@1024", "sdpa@1024"}
    assert first.index("sdpa@64") == first.index("full@64") + 1 or (
        first.index("full@64") == first.index("sdpa@64") + 1
    )  # the pair back to back
    assert labels(m, stages[-1].point_ids)  # later passes close the session
    assert stages[-1].later


def test_points_of_decided_claims_are_not_measured(tmp_path):
    m = member(tmp_path)
    session = Session([m], Deadline(100.0), decided_claims={"mem", "ratio"})
    ids = {pid for s in schedule([m], 100.0, session.skip) for pid in s.point_ids}
    names = set(labels(m, ids))
    assert not any(name.startswith("full@") for name in names)  # read only by decided claims
    assert "sdpa@256" in names  # still read by the undecided time claim
