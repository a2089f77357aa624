"""Deterministic shards of a suite: ``attnbench run SUITE --shard K/N``.

The partition depends only on the *set* of points and the suite's ``[measure]`` budget (both
fixed by the suite file's fingerprint), never on their order in the file, the machine or what
is installed on it, so every worker of a cluster computes the same shards on its own.

Balancing rule (longest-processing-time first, Graham 1969): predict each point's wall time
(:func:`predicted_seconds`, from the FLOPs its scenario's cost model predicts for it:
``PointCost.predicted_flops``), sort by (predicted time descending, point_id), and give each point
to the shard with the least predicted load so far (ties: the lowest shard number). The busiest
shard then exceeds the mean load by at most one point's predicted time.

Each shard is a normal run directory whose ``env.json`` carries a ``shard`` entry: ``k``, ``n``,
this shard's point ids and the whole suite's point ids, which ``attnbench merge`` checks against.
"""

from __future__ import annotations

import argparse
import heapq
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from harness import registry
from harness.errors import CliError
from harness.execute.session import RunOptions, RunResult, run_suite
from harness.results import ENV_FILE, ROWS_FILE, ResultsError, iter_rows, load_env, write_env
from harness.scenarios.interface import Point, scenario_of
from harness.sweep.suite import MeasureConfig, Suite

RULE = "lpt-predicted-seconds-v3"  # recorded in env.json: shards of different rules never mix
# Nominal throughput (FLOP/s) of the attention call on each device kind. Only the ratio of one
# point's time to another's matters for balancing, so an order of magnitude is enough.
NOMINAL_FLOPS = {"cpu": 1e11, "cuda": 1e14}
POINT_OVERHEAD_S = 0.5  # inputs, reference check, memory pass, bookkeeping of a small point
UNTIMED_CALLS = 6  # first call, warm-up, agreement check, memory pass
# a later timing pass: the case built again, the reference kernel timed before and after
# (docs/noise.md), one warm-up call; no check, no memory pass
LATER_PASS_S = 0.05
LATER_UNTIMED_CALLS = 1
MIN_TIMED_CALLS = 5
# What one small core call costs beyond its FLOPs, per device kind: the price of a scenario's
# setup calls (PointCost.setup_calls: a decode prefill filled token by token). On the 2-core
# CPU a rolling sdpa prefill (2 layers, d_model 256, window 512) took 25.5 s for 4096 tokens at
# load ~5 (3.1 ms a token and layer, 2026-11-29); 1 ms is that pace on a core of its own.
CALL_OVERHEAD_S = {"cpu": 1e-3, "cuda": 1e-4}
SKIPPED_S = 0.01  # a point outside the implementation's declared capabilities: one row, no run


@dataclass(frozen=True)
class ShardSpec:
    """Shard ``k`` of ``n`` (1-based)."""

    k: int
    n: int

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.n:
            raise ValueError(f"shard {self.k}/{self.n}: need 1 <= K <= N")

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"

    @property
    def dirname(self) -> str:
        return f"shard-{self.k}-of-{self.n}"


def parse_shard(text: str) -> ShardSpec:
    """``"2/4"`` -> ShardSpec(2, 4); an argparse ``type``."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a shard: {text!r} (K/N, e.g. 1/4)")
    try:
        return ShardSpec(int(match.group(1)), int(match.group(2)))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def declared_unsupported(point: Point) -> bool:
    """True when the implementation's *declared* capabilities exclude the point (the runner
    skips it at once). Declared data is the same on every machine running this harness
    version; availability (what is installed here) is not, so it is deliberately ignored."""
    try:
        return bool(scenario_of(point).declared_support(point))
    except registry.UnknownImplementation:
        return False


@lru_cache(maxsize=65536)
def predicted_seconds(
    point: Point, budget_s: float = 2.0, flops_per_s: float | None = None, first: bool = True
) -> float:
    """Predicted wall time of one pass of a point: the timing loop (at least MIN_TIMED_CALLS
    calls, at most about ``budget_s``) and, for its ``first`` pass, a fixed overhead and the
    untimed calls (first call, check, memory), for a later pass only the case's rebuild and a
    warm-up call; each pass's setup calls (``PointCost.setup_calls``) at CALL_OVERHEAD_S;
    SKIPPED_S for a point the implementation declares unsupported. Calls run at
    ``flops_per_s``: a run's ETA passes the matmul rate measured on this machine at its start
    (env.json calibration); without it, the device's nominal rate, so that shards (balanced by
    the first pass) are the same on every worker: a pure function of the point and the harness
    version, not of the machine."""
    if declared_unsupported(point):
        return SKIPPED_S if first else 0.0
    device = point.device.split(":", 1)[0]
    cost = scenario_of(point).cost(point)
    call_s = cost.predicted_flops / (flops_per_s or NOMINAL_FLOPS.get(device, NOMINAL_FLOPS["cpu"]))
    timed = max(min(budget_s, 50 * call_s), MIN_TIMED_CALLS * call_s)
    setup = cost.setup_calls(first) * CALL_OVERHEAD_S.get(device, CALL_OVERHEAD_S["cpu"])
    if not first:
        return LATER_PASS_S + LATER_UNTIMED_CALLS * call_s + timed + setup
    return POINT_OVERHEAD_S + UNTIMED_CALLS * call_s + timed + setup


def partition(
    points: tuple[Point, ...] | list[Point], n: int, budget_s: float = 2.0
) -> list[list[Point]]:
    """Split ``points`` into ``n`` shards balanced by predicted time (see the module docstring).
    Within a shard, points keep their order in ``points`` (the suite's order)."""
    if n < 1:
        raise ValueError("need at least one shard")
    order = {p.point_id: i for i, p in enumerate(points)}
    ranked = sorted(points, key=lambda p: (-predicted_seconds(p, budget_s), p.point_id))
    heap = [(0.0, k) for k in range(n)]  # (predicted load, shard index)
    shards: list[list[Point]] = [[] for _ in range(n)]
    for point in ranked:
        load, k = heapq.heappop(heap)
        shards[k].append(point)
        heapq.heappush(heap, (load + predicted_seconds(point, budget_s), k))
    return [sorted(s, key=lambda p: order[p.point_id]) for s in shards]


def select_shard(
    points: tuple[Point, ...] | list[Point], k: int, n: int, budget_s: float = 2.0
) -> list[Point]:
    """The points of shard ``k`` of ``n`` (1-based)."""
    spec = ShardSpec(k, n)
    return partition(points, spec.n, budget_s)[spec.k - 1]


def restrict(suite: Suite, spec: ShardSpec | None) -> Suite:
    """The suite with only shard ``spec``'s points (same name and fingerprint); None: all."""
    if spec is None:
        return suite
    points = select_shard(suite.points, spec.k, spec.n, suite.measure.timing.budget_s)
    return replace(suite, points=tuple(points))


def run_here(
    suite: Suite, measure: MeasureConfig, options: RunOptions, spec: ShardSpec | None
) -> RunResult:
    """Run shard ``spec`` of ``suite`` (all of it when None) in this process into
    ``options.out``, recording the shard in the run's env.json (:func:`stamp`)."""
    return run_suite(
        restrict(suite, spec),
        measure,
        options,
        on_open=lambda run_dir, resumed: stamp(run_dir, suite, spec, resumed),
        predict=lambda point, rate, first=True: predicted_seconds(
            point, measure.timing.budget_s, rate, first
        ),
    )


def shard_entry(suite: Suite, spec: ShardSpec) -> dict:
    """The ``shard`` entry of a shard's env.json."""
    mine = restrict(suite, spec).points
    return {
        "k": spec.k,
        "n": spec.n,
        "rule": RULE,
        "point_ids": [p.point_id for p in mine],
        "suite_point_ids": sorted(p.point_id for p in suite.points),
    }


def stamp(run_dir: Path, suite: Suite, spec: ShardSpec | None, resumed: bool) -> None:
    """Record shard ``spec`` of the whole ``suite`` in ``run_dir/env.json``; refuse to resume a
    directory that holds another shard or an unsharded run (``spec`` None: refuse a shard)."""
    try:
        env = load_env(run_dir)
    except ResultsError as exc:
        raise CliError(str(exc)) from None
    old = env.get("shard")
    if spec is None:
        if resumed and old:
            raise CliError(
                f"{run_dir} holds shard {old.get('k')}/{old.get('n')}; "
                f"add --shard {old.get('k')}/{old.get('n')} to resume it"
            )
        return
    entry = shard_entry(suite, spec)
    if resumed and not old:
        raise CliError(f"{run_dir} holds an unsharded run, not shard {spec}; choose another --out")
    if old and (old.get("k"), old.get("n"), old.get("rule")) != (spec.k, spec.n, RULE):
        raise CliError(
            f"{run_dir} holds shard {old.get('k')}/{old.get('n')} "
            f"({old.get('rule')}), not {spec} ({RULE}); choose another --out"
        )
    if old != entry:
        write_env(run_dir, {**env, "shard": entry})


def shard_done(run_dir: Path, suite_fingerprint: str | None = None) -> bool:
    """True when ``run_dir`` is a shard (of the suite file with ``suite_fingerprint``, when
    given) whose every point has a row: a launcher does not submit it again."""
    if not (run_dir / ENV_FILE).is_file():
        return False
    try:
        env = load_env(run_dir)
    except ResultsError:
        return False
    entry = env.get("shard") or {}
    if suite_fingerprint is not None and env.get("suite_fingerprint") != suite_fingerprint:
        return False  # another suite file: resubmit; the shard's resume check then refuses
    if "point_ids" not in entry:
        return False
    rows = run_dir / ROWS_FILE
    have = {r.get("point_id") for r in iter_rows(rows)} if rows.is_file() else set()
    return set(entry["point_ids"]) <= have
