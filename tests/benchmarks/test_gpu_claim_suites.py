"""The GPU claims suites against the claims they serve (issue 37, item 2), checked with the
project's own claim matching: the suites' points become rows (identity columns as the runner
writes them, every metric present), and ``subject_rows``, ``group_keys``/``aggregate`` (the
groups an exponent is fitted in), ``matched`` (the pairs of a ratio or crossover) and
``exponents.thin`` (the fewest points that can decide) say what the claims would see.

Every claim a GPU suite serves must get each of its groups from at least 5 points inside its
range (6 for a power+const fit), its ratio and crossover pairs at 5 or more common points;
the launch-bound families are graph-timed; an eager timed point is one where the GPU is busy.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis.claims import DEFAULT_CLAIMS, Claim, load_claims
from harness.analysis.evidence import subject_rows
from harness.analysis.exponents import thin
from harness.analysis.frames import aggregate, group_keys, group_label, iter_groups, select
from harness.analysis.ratios import matched, points_needed
from harness.execute.runner import point_row
from harness.scenarios.interface import cost_of
from harness.sweep.suite import Suite, load_suite

ROOT = Path(__file__).resolve().parents[2]
# families whose calls are launches the GPU waits on (host_frac 0.57-0.99 eagerly on the H100)
LAUNCH_BOUND = {"linear", "performer", "linformer", "nystrom", "fla-linear"}
# the seeds' headline claims, which the GPU suites must serve (issue 37)
HEADLINE = {
    "flash-time-n2", "flash-memory-n1", "full-memory-n2", "flash-speedup-2-4x",
    "flash-memory-5-20pct", "kv-cache-step-n1", "local-time-n1", "linear-time-n1",
    "performer-time-n1", "linformer-time-n1", "flash-crosses-linformer-512-1024-gpu",
    "flash-crosses-performer-512-1024-gpu",
}
H100_FLOPS, H100_BYTES = 740e12, 2.83e12  # env.json's calibration on the lease (FACTS.md)
BUSY_S = 50e-6  # an eager call shorter than this at the roofline may leave the GPU waiting
METRICS = ("time_median_s", "peak_mem_bytes", "mixer_time_s", "state_bytes", "approx_err",
           "bw_fraction", "tflops_per_s")


def gpu_suites() -> list[Suite]:
    return [s for s in map(load_suite, sorted((ROOT / "suites").glob("claims-*.toml")))
            if s.points[0].device == "cuda"]


def suite_rows(suites: list[Suite]) -> pd.DataFrame:
    """One ok row per point, as the runner writes its identity columns, with every metric a
    claim may read, the launch the suite asks for, and the call's time at the H100's roofline
    (``roofline_s``)."""
    rows = []
    for suite in suites:
        graph = "cuda-graph" if suite.measure.cuda_graph else "none"
        for point in suite.points:
            cost = cost_of(point)
            roofline = max(cost.executed_flops / H100_FLOPS, cost.compulsory_bytes / H100_BYTES)
            rows.append({**point_row(point), **dict.fromkeys(METRICS, 1.0), "status": "ok",
                         "cuda_graph": graph, "suite": suite.name, "roofline_s": roofline})
    return pd.DataFrame(rows)


def groups_of(claim: Claim, df: pd.DataFrame) -> list[tuple[str, int]]:
    """(group, points) as the claim's verdict would form them: an exponent's fitted groups (a
    one-point group beside swept ones is dropped, as ``device_groups`` does), or the groups of
    matched subject/baseline points."""
    rows = select(subject_rows(df, claim), claim.metric)
    if claim.kind in ("exponent", "bound"):
        keys = group_keys(rows, claim.over, claim.hold)
        agg = aggregate(rows, claim.over, claim.metric, keys)
        if claim.min_x is not None:
            agg = agg[agg["x"] >= claim.min_x]
        parts = list(iter_groups(agg, keys))
        parts = [(v, p) for v, p in parts if len(p) > 1] or parts
        return [(group_label(v), len(p)) for v, p in parts]
    base = select(subject_rows(df, claim, baseline=True), claim.metric)
    pairs, _ = matched(rows, base, claim)
    return [(group_label({k: v for k, v in g.items() if k != "_first"}), len(p))
            for g, p in pairs]


def too_thin(claim: Claim, df: pd.DataFrame) -> list[str]:
    """The groups of a served claim that cannot decide it, in words; and a claim whose rows
    are there but form no group at all (ratio rows without partners)."""
    groups = groups_of(claim, df)
    if not groups:
        return [f"{claim.id}: rows but no group (no pairs at common points?)"]
    if claim.kind == "exponent":
        return [f"{claim.id}: {label}: {k} points" for label, k in groups
                if thin(k, claim.model, claim.min_points or 3)]
    need = 5 if points_needed(claim) > 1 else 1  # a claim about one point: that point
    what = "points" if claim.kind == "bound" else "pairs"
    return [f"{claim.id}: {label}: {k} {what}" for label, k in groups if k < need]


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return suite_rows(gpu_suites())


@pytest.fixture(scope="module")
def served(rows) -> list[Claim]:
    return [c for c in load_claims(DEFAULT_CLAIMS) if len(subject_rows(rows, c))]


def test_the_gpu_suites_serve_the_seeds_headline_claims(served):
    missing = HEADLINE - {c.id for c in served}
    assert not missing, sorted(missing)


def test_every_served_claim_has_enough_points_in_every_group(rows, served):
    problems = [p for claim in served for p in too_thin(claim, rows)]
    assert problems == []


def test_ratio_claims_are_paired_at_every_point_of_their_range(rows, served):
    """Within a suite that runs both sides of a ratio claim, every point of one side in the
    claim's range has its partner: a ratio read at some points only says less than it could."""
    unpaired = []
    for claim in (c for c in served if c.kind == "ratio"):
        sub, base = subject_rows(rows, claim), subject_rows(rows, claim, baseline=True)
        for suite in set(sub["suite"]) & set(base["suite"]):
            xs = {side: set(part[part["suite"] == suite][claim.over])
                  for side, part in (("impl", sub), ("baseline", base))}
            if xs["impl"] != xs["baseline"]:
                unpaired.append(f"{claim.id} in {suite}: {sorted(xs['impl'] ^ xs['baseline'])}")
    assert unpaired == []


def test_the_check_finds_a_thin_group_and_a_ratio_without_pairs(rows, served):
    """Planted: the eager rows at 512 and 768 gone (full-memory-n2: 5 points over 512..4096,
    a power+const fit needs 6), then sdpa-flash moved off full's points (no pairs)."""
    claims = {c.id: c for c in served}
    cut = rows[~((rows["impl"] == "full") & rows["seq_len"].isin([512, 768]))]
    assert too_thin(claims["full-memory-n2"], cut) == ["full-memory-n2: all rows: 5 points"]
    moved = rows.assign(seq_len=rows["seq_len"].where(
        ~((rows["impl"] == "sdpa-flash") & (rows["suite"] == "claims-gpu")), rows["seq_len"] + 1))
    assert too_thin(claims["flash-speedup-2-4x"], moved) == [
        "flash-speedup-2-4x: rows but no group (no pairs at common points?)"]


def test_launch_bound_families_and_decode_are_graph_timed():
    for suite in gpu_suites():
        families = {point_row(p)["family"] for p in suite.points}
        if families & LAUNCH_BOUND or suite.scenario == "decode":
            assert suite.measure.cuda_graph is True, suite.name


def test_every_eager_timed_point_keeps_the_gpu_busy(rows, served):
    """A timed claim's point that is not graph-timed takes >= 50 µs even at the H100's
    calibrated roofline (740 TFLOP/s, 2.83 TB/s): there the host's issue time (10-20 µs a
    launch) is a small share."""
    slow = set()
    for claim in (c for c in served if c.timed):
        used = subject_rows(rows, claim)
        if claim.baseline:
            used = pd.concat([used, subject_rows(rows, claim, baseline=True)])
        eager = used[used["cuda_graph"] == "none"]
        slow |= {f"{r.suite}: {r.impl} n={r.seq_len}: {r.roofline_s * 1e6:.0f} µs"
                 for r in eager.itertuples() if r.roofline_s < BUSY_S}
    assert sorted(slow) == []


def test_the_busy_rule_would_catch_an_eager_linear_suite(rows, served):
    """Planted: the linear suite eager (as it was on the leases): its small points are caught."""
    eager = rows.assign(cuda_graph="none")
    claim = next(c for c in served if c.id == "flash-crosses-linformer-512-1024-gpu")
    used = pd.concat([subject_rows(eager, claim), subject_rows(eager, claim, baseline=True)])
    assert (used["roofline_s"] < BUSY_S).any()


def test_each_header_states_the_time_derived_from_the_lease_rows():
    """The '# Run time on one H100: ~N seconds' line of each GPU claims suite is what
    lease/suite_time.py derives from the lease rows (within 10%): a suite changed
    without its figure, or a figure made up, fails here."""
    spec = importlib.util.spec_from_file_location("suite_time",
                                                  ROOT / "lease/suite_time.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    rates = module.lease_rates()
    assert rates["sdpa-flash"] > 100e12 and rates["linear"] > 1e12  # rows read, not defaults
    wrong = []
    for path in module.gpu_suites():
        stated = re.search(r"^# Run time on one H100: ~(\d+) seconds", path.read_text(), re.M)
        derived = module.estimate(path, rates).seconds
        if not stated or abs(int(stated.group(1)) - derived) > 0.1 * derived:
            wrong.append(f"{path.name}: header {stated and stated.group(1)} s, derived "
                         f"{derived:.0f} s")
    assert wrong == []
