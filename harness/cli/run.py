"""``attnbench run [SUITE]``: run a suite into a run directory, here (all of it or ``--shard
K/N``) or as ``--shards N`` on Ray or Slurm; then print its comparison table. ``attnbench merge
DIR... --out DIR`` puts shard runs back together (docs/distributed.md).

``run`` exits 0 when every point ran or was skipped for a stated reason, 1 when a point's result
disagrees with the float64 reference (``mismatch``: a wrong result is a failure, whatever the
sweep did next), 2 on a usage or suite error, 130 when interrupted (the finished rows are kept,
and the message says how to resume).
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness import bundled, registry
from harness.cli import output_dir, parse_size
from harness.cli.table import print_table
from harness.distributed.launch import launch
from harness.distributed.merge import merge_runs, print_report
from harness.distributed.plan import LaunchOptions
from harness.distributed.shard import parse_shard, run_here
from harness.errors import CliError
from harness.execute.session import RunOptions, configure
from harness.plugins import add_plugin_option
from harness.scenarios.case import CHECK_MODES
from harness.sweep.suite import load_suite

DEFAULT_SUITE = "smoke.toml"  # bundled: the checkout's suites/, or the installed package's copy


def add_cli(sub) -> None:
    """Add ``run`` and ``merge``."""
    _add_run(sub)
    p = sub.add_parser("merge", help="merge shard run directories into one run")
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="shard run directories")
    p.add_argument("--out", type=Path, required=True, help="merged run directory")
    p.add_argument("--force", action="store_true", help="overwrite --out if it holds results")
    p.set_defaults(func=cmd_merge)


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="run a suite; rows go to DIR/rows.jsonl")
    p.add_argument("suite", nargs="?", help="suite TOML (default: the bundled smoke suite)")
    p.add_argument("--out", type=Path, help="run directory (default: runs/<suite>-<run id>)")
    p.add_argument("--resume", action="store_true", help="skip points already in --out")
    p.add_argument("--force", action="store_true",
                   help="resume even if the suite or device fingerprint differs")
    p.add_argument("--mem-budget", type=parse_size,
                   help="skip points predicted to need more (default: 80%% of free memory)")
    p.add_argument("--check", choices=CHECK_MODES,
                   help="agreement check (overrides the suite's [measure].check)")
    p.add_argument("--budget-s", type=float, help="timing budget per point (overrides the suite)")
    p.add_argument("--passes", type=int, metavar="N",
                   help="timing passes over the suite (overrides [measure] passes; 1 = a quick "
                        "profile)")
    p.add_argument("--isolate", action="store_true",
                   help="run each point in a child process (crashes take only that point)")
    p.add_argument("--point-timeout", type=float, metavar="SECONDS",
                   help="with --isolate: give up on a point after this long")
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
    if args.out is not None:
        output_dir(args.out)
    registry.load_plugins(args.plugin)  # --plugin FILE (and ATTNBENCH_PLUGINS): one line if bad
    options = RunOptions(
        out=args.out, resume=args.resume, force=args.force, mem_budget=args.mem_budget,
        check=args.check, budget_s=args.budget_s, passes=args.passes, isolate=args.isolate,
        point_timeout=args.point_timeout, progress=not args.no_progress,
    )
    suite = load_suite(args.suite or default_suite())
    measure = configure(suite, options)
    if args.launcher != "local":  # every shard on Ray / Slurm, merged into --out
        if args.shard is not None:
            raise CliError("--shard K/N runs one shard here; --launcher runs them all (use one)")
        return launch(suite, options, _launch_options(args))
    if args.shards is not None:
        raise CliError("--shards N needs --launcher ray|slurm (one shard here: --shard K/N)")
    result = run_here(suite, measure, options, args.shard)
    if not args.no_table:
        print_table(result.run_dir)
    mismatched = result.counts.get("mismatch", 0)
    if mismatched:
        print(f"attnbench: {mismatched} point{'s' * (mismatched != 1)} disagree"
              f"{'s' * (mismatched == 1)} with the float64 reference (status mismatch): exit 1",
              file=sys.stderr)
        return 1
    return 0


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
