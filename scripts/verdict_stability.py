#!/usr/bin/env python
"""Stability of ``attnbench claims`` verdicts across identical reruns of a suite.

    .venv/bin/python scripts/verdict_stability.py --runs 5
    .venv/bin/python scripts/verdict_stability.py --runs 5 --reuse --allow-contended

Runs ``--suite`` (default suites/claims-cpu.toml) ``--runs`` times into ``--workdir``, takes
``attnbench claims RUN --claims FILE --json`` of each run, and prints every claim's verdicts
side by side. A claim is stable when one verdict holds in at least ``--agree`` of the runs
(default: all but one) and it is never confirmed in one run and refuted in another.
Exit status 1 when any claim is unstable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path


def claims_json(run_dir: Path, claims: str, allow_contended: bool) -> dict[str, str]:
    """claim id -> verdict for one run."""
    cmd = [sys.executable, "-m", "harness.cli", "claims", str(run_dir), "--claims", claims,
           "--json"] + (["--allow-contended"] if allow_contended else [])
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    for line in done.stderr.splitlines():
        print(f"    {run_dir.name}: {line}")
    return {v["claim"]: v["verdict"] for v in json.loads(done.stdout)}


def stable(verdicts: list[str], agree: int) -> bool:
    """One verdict in >= ``agree`` runs, and never both confirmed and refuted."""
    counts = Counter(verdicts)
    flip = counts["confirmed"] and counts["refuted"]
    return not flip and max(counts.values()) >= agree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="suites/claims-cpu.toml")
    parser.add_argument("--claims", default="suites/claims.toml")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--agree", type=int, help="runs that must agree (default: runs - 1)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/attnbench-verdicts"))
    parser.add_argument("--reuse", action="store_true", help="judge runs already in workdir")
    parser.add_argument("--allow-contended", action="store_true")
    args = parser.parse_args(argv)
    agree = args.agree or max(args.runs - 1, 1)
    dirs = [args.workdir / f"run{i}" for i in range(args.runs)]
    if not args.reuse:
        for run_dir in dirs:
            if run_dir.exists():
                subprocess.run(["rm", "-r", str(run_dir)], check=True)
            started = time.monotonic()
            subprocess.run(
                [sys.executable, "-m", "harness.cli", "run", args.suite, "--out", str(run_dir),
                 "--no-progress", "--no-table"],
                check=True, stdout=subprocess.DEVNULL,
            )
            print(f"  {run_dir.name}: {time.monotonic() - started:.0f} s, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    per_run = [claims_json(d, args.claims, args.allow_contended) for d in dirs]
    ids = sorted({c for run in per_run for c in run})
    width = max((len(c) for c in ids), default=5)
    bad = 0
    for claim in ids:
        verdicts = [run.get(claim, "missing") for run in per_run]
        ok = stable(verdicts, agree)
        bad += not ok
        print(f"{claim:<{width}}  {'stable  ' if ok else 'UNSTABLE'}  {' '.join(verdicts)}")
    print(f"{len(ids) - bad}/{len(ids)} claims stable (>= {agree} of {args.runs} agree, "
          "no confirmed/refuted flip)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
