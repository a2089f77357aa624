"""``attnbench run [SUITE]``: run a suite into a run directory, here (all of it or ``--shard
K/N``) or as ``--shards N`` on Ray or Slurm; then print its comparison table. ``attnbench merge
DIR... --out DIR`` puts shard runs back together (docs/distributed.md).

``run``'s exit codes (:data:`EXIT_CODES`, also in ``attnbench run --help``) are read from every
row of the run directory, so a resumed run is judged whole:

- 0: every point ran ``ok`` or was left out for a stated reason: ``skipped`` (capability,
  memory budget), ``oom`` (the device ran out of memory: a capacity, not a wrong result; the
  memory columns and ``compare`` judge memory), ``timeout`` (``--point-timeout``: a limit the
  user set), or a ``--time-limit`` cut. The last line counts each of them.
- 1: a point failed: ``error`` (the implementation raised or crashed) or ``mismatch`` (its result
  disagrees with the float64 reference); one line per failing implementation says which.
- 2: a usage or suite error (nothing ran).
- 3: nothing was measured: the run holds no ``ok`` row (every point skipped or out of memory).
  A shard that holds no point (``--shard 9/9`` of 8 points) has nothing to measure: exit 0.
- 130: interrupted (the finished rows are kept, and the message says how to resume).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

from harness import bundled, fmt
from harness.analysis.claims import DEFAULT_CLAIMS, load_claims
from harness.analysis.groups import StoppingRule, judged_groups
from harness.cli import output_dir, parse_size
from harness.cli.plugin_use import add_plugin_option, use_plugins
from harness.cli.table import print_table
from harness.distributed.launcher import launch
from harness.distributed.merge import merge_runs, print_report
from harness.distributed.shard import parse_shard, restrict, run_here
from harness.distributed.shard_setup import LaunchOptions
from harness.errors import CliError
from harness.execute.session import RunOptions, configure
from harness.results import ResultsError, read_run
from harness.scenarios.case import CHECK_EXTENTS
from harness.sweep.order import Slot, coarse_to_fine, describe
from harness.sweep.suite import Suite, load_suite
from harness.terminal import duration

DEFAULT_SUITE = "smoke.toml"  # bundled: the checkout's suites/, or the installed package's copy
EXIT_CODES = """exit codes: 0 every point ok or left out for a stated reason (skipped: capability or
memory budget; oom; timeout; a --time-limit cut), each counted in the last line; 1 a point failed
(error or mismatch: one line per failing implementation); 2 usage or suite error; 3 nothing
was measured (no ok row); 130 interrupted (finished rows kept; --resume continues)"""
FAILED = ("error", "mismatch")  # statuses that fail a run (exit 1)
_DURATION = re.compile(r"(?:(\d+(?:\.\d*)?)h)?(?:(\d+(?:\.\d*)?)m)?(?:(\d+(?:\.\d*)?)s)?")


def add_cli(sub) -> None:
    """Add ``run`` and ``merge``."""
    _add_run(sub)
    p = sub.add_parser("merge", help="merge shard run directories into one run")
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="shard run directories")
    p.add_argument("--out", type=Path, required=True, help="merged run directory")
    p.add_argument("--force", action="store_true", help="overwrite --out if it holds results")
    p.set_defaults(func=cmd_merge)


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="run a suite; rows go to DIR/rows.jsonl", epilog=EXIT_CODES)
    p.add_argument("suite", nargs="?", help="suite TOML (default: the bundled smoke suite)")
    p.add_argument("--out", type=Path, help="run directory (default: runs/<suite>-<run id>)")
    p.add_argument("--resume", action="store_true", help="skip points already in --out")
    p.add_argument("--force", action="store_true",
                   help="resume even if the suite or device fingerprint differs")
    p.add_argument("--mem-budget", type=parse_size,
                   help="skip points predicted to need more (default: 80%% of free memory)")
    p.add_argument("--check", choices=CHECK_EXTENTS,
                   help="agreement check (overrides the suite's [measure].check)")
    p.add_argument("--budget-s", type=float, help="timing budget per point (overrides the suite)")
    p.add_argument("--passes", type=int, metavar="N",
                   help="timing passes over the suite (overrides [measure] passes; 1 = a quick "
                        "profile)")
    p.add_argument("--isolate", action="store_true",
                   help="run each point in a child process (crashes take only that point)")
    p.add_argument("--point-timeout", type=float, metavar="SECONDS",
                   help="with --isolate: give up on a point after this long")
    p.add_argument("--time-limit", type=parse_duration, metavar="DURATION",
                   help="stop cleanly after this long (90s, 4m, 1h, 1m30s, or seconds; "
                        "overrides [measure] time_limit_s): points run coarse to fine, every "
                        "finished row is kept, exit 0 (docs/time_limit.md)")
    p.add_argument("--claims", type=Path, metavar="FILE",
                   help="claims file whose judged groups order a time-limited run "
                        "(default: the bundled claims.toml)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the points in their coarse-to-fine order and exit; run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-table", action="store_true", help="do not print the comparison table")
    add_plugin_option(p)
    _add_shard_options(p)
    p.set_defaults(func=cmd_run)


def _add_shard_options(p) -> None:
    """The sharding and launcher options (docs/distributed.md)."""
    g = p.add_argument_group("sharding and launchers (docs/distributed.md)")
    g.add_argument("--shard", type=parse_shard, metavar="K/N", help="run only shard K of N")
    engines = ["local", "ray", "slurm"]
    g.add_argument("--launcher", choices=engines, default="local", help="engine for --shards N")
    g.add_argument("--shards", type=int, metavar="N", help="number of shards for --launcher")
    g.add_argument("--max-retries", type=int, default=1, help="retries of a failed shard")
    g.add_argument("--gpus-per-shard", type=int, help="default: 1 for cuda suites, else 0")
    g.add_argument("--cpus-per-shard", type=int, help="default: [measure] threads, else 1")
    g.add_argument("--ray-address", help="Ray cluster to join (default: start a local one)")
    g.add_argument("--slurm-partition", help="Slurm partition for the shard jobs")
    g.add_argument("--slurm-timeout-min", type=int, default=240, help="time limit per shard")
    g.add_argument("--slurm-local", action="store_true", help="submitit's LocalExecutor")


def cmd_run(args) -> int:
    if args.resume and args.out is None:
        raise CliError("--resume needs --out DIR (the run directory to continue)")
    if args.out is not None and not args.dry_run:
        output_dir(args.out)
    use_plugins(args.plugin)  # --plugin FILE (and ATTNBENCH_PLUGINS): one line if bad
    options = RunOptions(
        out=args.out, resume=args.resume, force=args.force, mem_budget=args.mem_budget,
        check=args.check, budget_s=args.budget_s, passes=args.passes, isolate=args.isolate,
        point_timeout=args.point_timeout, progress=not args.no_progress,
        time_limit=args.time_limit,
    )
    suite = load_suite(args.suite or default_suite())
    measure = configure(suite, options)
    if args.dry_run or measure.time_limit_s:
        claims = load_claims(args.claims or DEFAULT_CLAIMS)
        groups = judged_groups(suite.points, claims)
        order = coarse_to_fine([p.point_id for p in suite.points], groups)
        if args.dry_run:
            return print_order(suite, order, measure.passes, measure.time_limit_s)
        rule = StoppingRule(groups, claims)
        options = replace(options, first_order=tuple(slot.point_id for slot in order),
                          stopping_rule=rule, wanted=rule.wanted)
    if args.launcher != "local":  # every shard on Ray / Slurm, merged into --out
        if args.shard is not None:
            raise CliError("--shard K/N runs one shard here; --launcher runs them all (use one)")
        return launch(suite, options, _launch_options(args))
    if args.shards is not None:
        raise CliError("--shards N needs --launcher ray|slurm (one shard here: --shard K/N)")
    result = run_here(suite, measure, options, args.shard)
    if args.shard is not None and not restrict(suite, args.shard).points:
        print(f"attnbench: shard {args.shard} holds no point of this suite: nothing to run: "
              "exit 0", file=sys.stderr)  # more shards than points: a merge expects it
        return 0
    if not args.no_table:
        print_table(result.run_dir)
    return run_verdict(result.run_dir)


def parse_duration(text: str) -> float:
    """``type=`` for ``--time-limit``: '90s', '4m', '1h', '1m30s' or a bare number of seconds
    -> seconds (> 0, finite)."""
    value = text.strip().lower()
    match = _DURATION.fullmatch(value)
    try:
        if match and value and any(match.groups()):
            h, m, s = (float(g) if g else 0.0 for g in match.groups())
            seconds = 3600 * h + 60 * m + s
        else:
            seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (e.g. 90s, 4m, 1h, 1m30s, or seconds)") from None
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive duration: {text!r}")
    return seconds


def print_order(suite: Suite, order: list[Slot], passes: int, limit_s: float | None) -> int:
    """``--dry-run``: the coarse-to-fine order, one point a line, and when a run uses it."""
    labels = {p.point_id: p.label() for p in suite.points}
    used = (f"a run with its time limit ({duration(limit_s)}) runs its first pass in this "
            if limit_s else "with --time-limit (or [measure] time_limit_s) a run's first pass "
            "runs in this ")
    print(f"{suite.name}: {fmt.plural(len(order), 'point')}; {used}order (L0: the ends of a "
          "judged group's axis, L1, L2, ...: bisection in log space; [the group]); "
          + (f"passes 2..{passes} follow, each shuffled by order_seed" if passes > 1
             else "one pass"))
    print("\n".join(describe(order, labels)))
    return 0


def run_verdict(run_dir: Path, *more: Path) -> int:
    """The exit code of a finished run from every row of ``run_dir`` (and of ``more`` run
    directories, judged as one: ``verdicts``), partial ones included, with one line per failing
    implementation and a last line that counts every status."""
    rows = []
    for folder in (run_dir, *more):
        with contextlib.suppress(ResultsError):  # no rows: counted as none
            rows += list(read_run(folder).rows)
    counts = Counter(str(r.get("status")) for r in rows)
    for impl, bad in _failures(rows).items():
        print(f"attnbench: {impl}: {bad}", file=sys.stderr)
    tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no rows"
    code = 1 if any(counts[s] for s in FAILED) else 0 if counts["ok"] else 3
    why = {1: "a point failed", 3: "nothing was measured (no ok row)", 0: "done"}[code]
    print(f"attnbench: {tally}: {why}: exit {code}", file=sys.stderr)
    return code


def _failures(rows: list[dict]) -> dict[str, str]:
    """impl -> what failed, for each implementation with an ``error`` or ``mismatch`` row."""
    out = {}
    for impl in dict.fromkeys(str(r.get("impl")) for r in rows):
        mine = [r for r in rows if str(r.get("impl")) == impl]
        parts = []
        for status, words in (("error", "ended in error"),
                              ("mismatch", "disagree with the float64 reference "
                                           "(status mismatch)")):
            bad = [r for r in mine if r.get("status") == status]
            if bad:
                parts.append(f"{len(bad)} of {fmt.plural(len(mine), 'point')} {words}; first: "
                             f"{bad[0].get('reason') or 'no reason recorded'}")
        if parts:
            out[impl] = "; ".join(parts)
    return out


def cmd_merge(args) -> int:
    """Exit 0: complete; 1: written, but points or shards are missing; 2: refused."""
    output_dir(args.out)
    report = merge_runs(args.dirs, args.out, overwrite=args.force)
    print_report(report)
    return 0 if report.complete else 1


def _launch_options(args) -> LaunchOptions:
    return LaunchOptions(
        launcher=args.launcher, shards=args.shards, max_retries=args.max_retries,
        gpus_per_shard=args.gpus_per_shard, cpus_per_shard=args.cpus_per_shard,
        ray_address=args.ray_address, slurm_partition=args.slurm_partition,
        slurm_timeout_min=args.slurm_timeout_min, slurm_local=args.slurm_local,
    )


def default_suite() -> Path:
    """The bundled smoke suite, the suite of ``attnbench run`` without SUITE."""
    path = bundled(DEFAULT_SUITE)
    if not path.is_file():
        raise CliError(f"no SUITE given and the bundled default {path} is missing")
    return path
