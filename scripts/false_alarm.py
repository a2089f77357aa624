#!/usr/bin/env python
"""False-alarm rate of ``attnbench compare`` on this machine: run a suite 2N times back to back,
compare each pair (run 2k against run 2k+1, nothing changed in between) and count the pairs
that a gate would have failed.

    .venv/bin/python scripts/false_alarm.py --pairs 5
    .venv/bin/python scripts/false_alarm.py --reuse --gate strict= --gate ci="--time-gate report"

Each ``--gate NAME=ARGS`` is a set of ``attnbench compare`` options evaluated on the same pairs
(default: the strict gate, the CI gate of .ci/run, and the CI gate with ``--confirm``); in ARGS,
``NEXT`` stands for the next pair's first run, a third honest run to confirm with.
``--reuse`` re-evaluates the runs left in ``--workdir`` by an earlier call instead of
measuring again. The load average is printed beside each run: on a shared machine it
explains most of the timing noise.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from harness.cli import main as compare_main
from harness.compare.runs import compare_runs

DEFAULT_GATES = (
    "strict=--strict",
    "ci=--time-gate report",
    "ci+confirm=--time-gate report --confirm NEXT",
)


def run_suite(suite: str, out: Path) -> None:
    """One fresh run of ``suite`` into ``out`` through the real CLI."""
    cmd = [
        sys.executable,
        "-m",
        "harness.cli",
        "run",
        suite,
        "--out",
        str(out),
        "--no-progress",
        "--no-table",
    ]
    started, load = time.monotonic(), os.getloadavg()[0]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    print(
        f"  {out.name}: {time.monotonic() - started:.0f} s, load average {load:.1f} -> "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )


def gate_options(args_text: str):
    """Parse ``attnbench compare`` options into (CompareOptions, confirm run dirs)."""
    import argparse as ap

    from harness.cli.compare import add_cli, options_from_args

    parser = ap.ArgumentParser()
    add_cli(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["compare", "A", "B", *shlex.split(args_text)])
    return options_from_args(ns), ns.confirm or []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="suites/smoke.toml")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/attnbench-false-alarm"))
    parser.add_argument("--reuse", action="store_true", help="compare runs already in --workdir")
    parser.add_argument(
        "--gate",
        action="append",
        metavar="NAME=ARGS",
        help="compare options to evaluate (repeatable)",
    )
    parser.add_argument("--show", metavar="GATE", help="print the full comparison for this gate")
    args = parser.parse_args(argv)
    gates = dict(g.split("=", 1) for g in (args.gate or DEFAULT_GATES))
    pairs = [(args.workdir / f"pair{i}-a", args.workdir / f"pair{i}-b") for i in range(args.pairs)]
    if not args.reuse:
        print(f"running {args.suite} {2 * args.pairs} times into {args.workdir}", flush=True)
        for a, b in pairs:
            for run_dir in (a, b):
                if run_dir.exists():
                    subprocess.run(["rm", "-r", str(run_dir)], check=True)
                run_suite(args.suite, run_dir)
    print(f"\n{'gate':<12} {'false alarms':>14} {'failing findings per pair'}")
    for name, text in gates.items():
        results = []
        for i, (a, b) in enumerate(pairs):  # NEXT: the next pair's first run (a 3rd honest run)
            nxt = str(pairs[(i + 1) % len(pairs)][0])
            opts, confirm = gate_options(text.replace("NEXT", nxt))
            results.append(compare_runs(a, b, opts, confirm))
        failed = sum(r.exit_code != 0 for r in results)
        per_pair = " ".join(str(r.count("fail")) for r in results)
        print(
            f"{name:<12} {failed:>5}/{len(pairs)} = {failed / len(pairs):4.0%}   [{per_pair}]  "
            f"({text or 'defaults'})"
        )
        for r in results:
            for f in r.findings:
                if f.level == "fail":
                    print(
                        f"    {Path(r.current).name}: {f.label} {f.metric} {f.change} {f.verdict}"
                    )
        if name == args.show:
            for i, (a, b) in enumerate(pairs):
                nxt = str(pairs[(i + 1) % len(pairs)][0])
                compare_main(["compare", str(a), str(b), *shlex.split(text.replace("NEXT", nxt))])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
