"""Core subcommands: ``list``, ``run``, ``table``."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path

from harness.errors import CliError

# Heavy modules (torch through the registry, pandas through the results loader) are imported
# inside the commands: ``attnbench --help`` and argument errors stay fast.

SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
              "gib": 2**30, "tib": 2**40, "tb": 10**12}


def parse_size(text: str) -> int:
    """'8GiB', '500MB', '1e9' -> bytes."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8GiB, 500MB, 1000000)")
    try:
        value = float(match.group(1)) * SIZE_UNITS[match.group(2).lower()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be > 0: {text!r}")
    return int(value)


def add_cli(sub) -> None:
    """Add ``list``, ``run`` and ``table``."""
    for add in (add_list_cli, add_run_cli, add_table_cli):
        add(sub)


def add_list_cli(sub) -> None:
    p = sub.add_parser("list", help="every implementation, available or not, and why")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)


def add_run_cli(sub) -> None:
    p = sub.add_parser("run", help="run a suite; rows go to DIR/rows.jsonl")
    p.add_argument("suite", nargs="?", help="suite TOML (default: the bundled smoke suite)")
    p.add_argument("--out", type=Path, help="run directory (default: runs/<suite>-<run id>)")
    p.add_argument("--resume", action="store_true", help="skip points already in --out")
    p.add_argument("--force", action="store_true",
                   help="resume even if the suite or device fingerprint differs")
    p.add_argument("--mem-budget", type=parse_size,
                   help="skip points predicted to need more (default: 80%% of free memory)")
    p.add_argument("--check", choices=["auto", "full", "rows", "none"],
                   help="agreement check (overrides the suite's [measure].check)")
    p.add_argument("--budget-s", type=float, help="timing budget per point (overrides the suite)")
    p.add_argument("--isolate", action="store_true",
                   help="run each point in a child process (crashes take only that point)")
    p.add_argument("--point-timeout", type=float, metavar="SECONDS",
                   help="with --isolate: give up on a point after this long")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-table", action="store_true", help="do not print the comparison table")
    from harness.distributed.launch import add_run_options  # --shard K/N, --launcher ray|slurm, ...

    add_run_options(p)
    p.set_defaults(func=cmd_run)


def add_table_cli(sub) -> None:
    p = sub.add_parser("table", help="comparison table of a run directory (text, markdown, CSV)",
                       description="One line per point shape, one column per implementation; "
                       "only the point fields that vary are shown. CSV: one line per point, "
                       "raw units.")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--metric", action="append", metavar="COLUMN",
                   help="metric column to show (repeatable; default: time_median_s and "
                   "peak_mem_bytes): any documented numeric row column, e.g. tflops_per_s, "
                   "rel_err, tokens_per_s")
    p.add_argument("--format", choices=("text", "markdown", "csv"), default="text", dest="fmt",
                   help="output format (default: text)")
    p.add_argument("--baseline", metavar="IMPL",
                   help="add speedups against this implementation (its time / each time)")
    p.set_defaults(func=cmd_table)


def cmd_list(args) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from harness import registry

    impls = registry.all_implementations()
    if args.json:
        print(json.dumps([_describe(i) for i in impls], indent=2))
        return 0
    table = Table(title="attnbench implementations", show_lines=False)
    for col in ("name", "family", "status", "devices", "dtypes", "mask features",
                "time~n^", "mem~n^"):
        table.add_column(col)
    for impl in impls:
        d = _describe(impl)
        table.add_row(d["name"], d["family"], d["status"], ",".join(d["devices"]),
                      ",".join(d["dtypes"]), ",".join(d["mask_features"]),
                      f"{d['time_exponent']:g}", f"{d['memory_exponent']:g}")
    Console(width=160).print(table)
    print("block-scenario mixers (baselines, not attention cores): lstm, conv")
    for name, reason in registry.load_errors().items():
        print(f"plug-in {name}: {reason}")
    return 0


def _describe(impl) -> dict:
    reason = impl.unavailable_reason()
    return {
        "name": impl.name, "family": impl.family,
        "status": "available" if reason is None else f"unavailable: {reason}",
        "available": reason is None,
        "devices": sorted(impl.caps.devices),
        "dtypes": sorted(str(d).removeprefix("torch.") for d in impl.caps.dtypes),
        "mask_features": sorted(impl.caps.mask_features),
        "time_exponent": impl.cost.time_exponent, "memory_exponent": impl.cost.memory_exponent,
        "description": impl.description,
    }


def cmd_run(args) -> int:
    if args.resume and args.out is None:
        raise CliError("--resume needs --out DIR (the run directory to continue)")
    from harness.execute.runner import prepare_run, run_points
    from harness.measure import env as env_mod
    from harness.results import ROWS_FILE, RowWriter
    from harness.sweep.suite import load_suite

    suite = load_suite(args.suite or DEFAULT_SUITE_PATH())
    measure = suite.measure
    for flag, value in (("--budget-s", args.budget_s), ("--point-timeout", args.point_timeout)):
        if value is not None and not 0 < value < float("inf"):
            raise CliError(f"{flag} {value}: must be a positive number of seconds")
    if args.check:
        measure = replace(measure, check=args.check)
    if args.budget_s:
        measure = replace(measure, timing=replace(measure.timing, budget_s=args.budget_s))
    if (args.point_timeout or measure.point_timeout_s) and not (args.isolate or measure.isolate):
        raise CliError("--point-timeout / [measure] point_timeout_s needs --isolate "
                       "(a hung point is stopped by killing its child)")
    from harness.distributed import shard as shard_mod

    # shards on Ray / Slurm, merged into --out (harness/distributed/launch.py)
    if args.launcher != "local":
        from harness.distributed.launch import launch

        return launch(suite, args)
    full_suite, suite = suite, shard_mod.from_args(suite, args)  # --shard K/N: its points
    from harness.measure.device import get_device

    for kind in sorted({p.device for p in suite.points}):  # refuse before anything is written
        try:
            get_device(kind)
        except RuntimeError as exc:
            raise CliError(f"{suite.path}: device = {kind!r}: {exc}") from None
    if measure.threads:  # before the resume check: the device fingerprint includes threads
        import torch

        torch.set_num_threads(measure.threads)
    run_dir = args.out or Path("runs") / f"{suite.name}-{env_mod.new_run_id()}"
    done, run_id = _resume_state(run_dir, suite, args)
    points = [p for p in suite.points if p.point_id not in done]
    if not done:
        _make_run_dir(run_dir)
        run_id = env_mod.new_run_id()
        prepare_run(suite, run_dir, run_id)
    shard_mod.stamp(run_dir, full_suite, args.shard, resumed=bool(done))  # env.json: shard K/N
    executor = None
    if args.isolate or measure.isolate:
        from harness.execute.isolate import isolated_executor

        timeout = args.point_timeout or measure.point_timeout_s
        executor = isolated_executor(measure, args.mem_budget, timeout)
    writer = RowWriter(run_dir)
    print(f"attnbench: {len(points)} points of suite {suite.name!r} -> {run_dir}"
          + (f" ({len(done)} already done)" if done else ""), file=sys.stderr)
    counts = _with_progress(points, not args.no_progress, lambda on_row: run_points(
        points, writer, measure, run_id=run_id, suite_name=suite.name,
        mem_budget=args.mem_budget, executor=executor, on_row=on_row))
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "nothing to run"
    print(f"attnbench: {summary}; rows in {run_dir / ROWS_FILE}", file=sys.stderr)
    if not args.no_table:
        _print_table(run_dir)
    return 0


def DEFAULT_SUITE_PATH() -> Path:
    from harness.cli import DEFAULT_SUITE

    if not DEFAULT_SUITE.is_file():
        raise CliError(f"no SUITE given and the bundled default {DEFAULT_SUITE} is missing")
    return DEFAULT_SUITE


def _make_run_dir(run_dir: Path) -> None:
    import tempfile

    existed = run_dir.is_dir()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"--out {run_dir}: cannot create directory ({exc.strerror})") from None
    if not run_dir.is_dir():
        raise CliError(f"--out {run_dir}: not a directory")
    try:  # a read-only or full file system fails here, before any point runs
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as exc:
        if not existed:
            run_dir.rmdir()
        raise CliError(f"--out {run_dir}: cannot write there ({exc.strerror})") from None


def _resume_state(run_dir: Path, suite, args) -> tuple[set[str], str | None]:
    """Point ids already measured in ``run_dir`` (empty for a fresh run) and its run id."""
    from harness.results import ROWS_FILE, ResultsError, iter_rows, load_env

    if run_dir.exists() and not run_dir.is_dir():
        raise CliError(f"--out {run_dir}: exists and is not a directory")
    rows_file = run_dir / ROWS_FILE
    if not rows_file.exists():
        return set(), None
    if not args.resume:
        raise CliError(f"--out {run_dir} already holds results; add --resume to continue it "
                       "or choose a new --out")
    try:
        env = load_env(run_dir)
    except ResultsError as exc:
        raise CliError(str(exc)) from None
    if env.get("suite_fingerprint") != suite.fingerprint and not args.force:
        raise CliError(f"{run_dir} was run from a different suite file "
                       f"({env.get('suite_path')}); use --force to resume anyway")
    from harness.measure.device import get_device
    from harness.measure.env import fingerprint

    here = fingerprint(get_device(suite.points[0].device).info()) if suite.points else None
    if here and env.get("fingerprint") != here and not args.force:
        raise CliError(f"{run_dir} was measured on {env.get('fingerprint')}, this is {here}; "
                       "use --force to mix them")
    done = {row["point_id"] for row in iter_rows(rows_file) if "point_id" in row}
    return done, env.get("run_id")


def _with_progress(points, enabled: bool, body):
    if not enabled or not points:
        return body(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task("running", total=len(points))

        def on_row(row: dict) -> None:
            progress.update(task, advance=1,
                            description=f"{row['impl']} n={row['seq_len']}: {row['status']}")

        return body(on_row)


def _print_table(run_dir: Path, metrics: tuple[str, ...] | None = None, fmt: str = "text",
                 baseline: str | None = None) -> None:
    from harness.render import table
    from harness.results import ResultsError, load_rows

    try:
        frame = load_rows(run_dir)
    except ResultsError as exc:
        raise CliError(str(exc)) from None
    if frame.empty:
        print("(no rows)")
        return
    if baseline is not None and baseline not in set(frame["impl"]):
        impls = ", ".join(dict.fromkeys(frame["impl"].astype(str)))
        raise CliError(f"--baseline {baseline}: no rows of it in {run_dir} (has {impls})")
    print(table.render(frame, metrics or table.DEFAULT_METRICS, fmt, baseline))


def cmd_table(args) -> int:
    from harness.render.table import METRICS

    if not args.run_dir.exists():
        raise CliError(f"{args.run_dir}: no such run directory")
    metrics = tuple(args.metric) if args.metric else None
    unknown = [m for m in metrics or () if m not in METRICS]
    if unknown:
        raise CliError(f"--metric {unknown[0]}: unknown (one of {', '.join(METRICS)})")
    _print_table(args.run_dir, metrics, args.fmt, args.baseline)
    return 0


def check_same_suite(baseline_dir: Path, current_dir: Path) -> None:
    """``compare`` of runs of two different suites is a usage error (every point would be
    missing from the other run), not a list of regressions."""
    from harness.results import ResultsError, load_env

    suites = []
    for run_dir in (baseline_dir, current_dir):
        try:
            suites.append(load_env(run_dir).get("suite"))
        except ResultsError:  # compare itself reports an unusable run
            return
    if all(suites) and suites[0] != suites[1]:
        raise CliError(f"compare: {baseline_dir} is a run of suite {suites[0]!r} and "
                       f"{current_dir} of {suites[1]!r}; compare two runs of one suite")
