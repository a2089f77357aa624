#!/usr/bin/env python
"""Power of the time gate on this machine: false alarms on honest reruns and detections of a
real slowdown, each with and without a loaded neighbour, against the committed baseline.

    .venv/bin/python scripts/gate_power.py --runs 5
    .venv/bin/python scripts/gate_power.py --runs 5 --reuse --gate ci="--time-gate report"

For each condition -- honest or ``--impl`` made ``--factor`` times slower by a real delay in
its calls (``scripts/slowed.py``: each call runs the implementation ``factor`` times), and
quiet or with a neighbour busy-looping on one core -- the suite runs ``--runs`` times.
Each run is compared with the baseline (``attnbench baseline find``) under every ``--gate``;
``ci`` is evaluated as ``.ci/run`` does it: a failure counts only when it reproduces with the
next run of the same condition given as ``--confirm``. Rates are printed per gate and
condition: honest runs that fail are false alarms, slowed runs that pass are misses.
Targets: 0/5 false alarms, 5/5 detections.

``--record-gate FILE`` measures the small gate suite of ``tests/harness/compare/test_noise.py``
(:data:`GATE_SUITE`: sdpa and flash-tiled at n = 128, 256, timed as the smoke suite is: three
passes of 0.25 s, one thread) for real three times -- a baseline, an honest rerun and a run
with flash-tiled made 3x slower -- with a neighbour busy on one core (``--neighbour off``:
without), and writes every pass's raw samples and reference-kernel time to FILE. The test
replays those recorded samples through the runner and the gate, so its verdict is the same on
every machine and under any load;
this script is where the gate meets real runs.

    .venv/bin/python scripts/gate_power.py \
        --record-gate tests/harness/compare/data/gate_samples.json

On a machine shared with other work, give the recording and its neighbour the machine (a
scheduling group ahead of the rest; the file notes the group it ran in), so the samples are
those of a 2-core runner with one busy neighbour, not of whatever else was running:

    setsid bash -c 'echo -15 > /proc/self/autogroup; exec .venv/bin/python \
        scripts/gate_power.py --record-gate tests/harness/compare/data/gate_samples.json'
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from harness import registry
from harness.compare.baseline import find_baseline, run_suite
from harness.compare.runs import compare_runs
from harness.execute.passlog import PassLog
from harness.execute.runner import run_points
from harness.measure.timing import TimingConfig
from harness.results import RowWriter, load_env, load_rows
from harness.sweep.suite import MeasureConfig, parse_suite

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from false_alarm import gate_options  # noqa: E402
from slowed import slow_down  # noqa: E402

GATE_SUITE = {
    "name": "gate", "scenario": "attention", "implementations": ["sdpa", "flash-tiled"],
    "fixed": {"batch": 1, "heads": 2, "head_dim": 32},
    "sweep": {"seq_len": [128, 256]},
}
GATE_MEASURE = MeasureConfig(timing=TimingConfig(budget_s=0.25, min_samples=5, warmup_calls=1),
                             passes=3, check="none")
RECORDED = ("time_samples_s", "calls_per_sample", "ref_kernel_s", "contended", "contention",
            "status")

CI_GATE = "--time-gate report --no-rerun"  # .ci/run: plain compare (its rerun: the ci confirm)
DEFAULT_GATES = (f"ci={CI_GATE}", "strict=--strict")


def neighbour() -> subprocess.Popen:
    """A busy loop pinned to CPU 0 (one core of load, as another CI job would take)."""
    code = "import os\ntry: os.sched_setaffinity(0, {0})\nexcept OSError: pass\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def one_run(suite: str, out: Path, slow: tuple[str, int] | None) -> None:
    """A fresh run of ``suite`` into ``out``, slowed when ``slow`` = (impl, factor)."""
    prefix = [str(HERE / "slowed.py"), slow[0], str(slow[1])] if slow else ["-m", "harness.cli"]
    cmd = [sys.executable, *prefix, "run", suite, "--out", str(out), "--no-progress",
           "--no-table"]
    started = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = load_rows(out)
    flagged = int(rows.get("contended", False).fillna(False).astype(bool).sum())
    print(f"  {out.name}: {time.monotonic() - started:.0f} s, load {os.getloadavg()[0]:.1f}, "
          f"{flagged}/{len(rows)} rows contended", flush=True)


def conditions(args) -> list[tuple[str, tuple[str, int] | None, bool]]:
    slow = (args.impl, args.factor)
    out = []
    for loaded in (False, True) if args.neighbour == "both" else (args.neighbour == "on",):
        for name, s in (("honest", None), (f"{args.impl}x{args.factor}", slow)):
            out.append((f"{name}{'+neighbour' if loaded else ''}", s, loaded))
    return out


def measure(args, runs: dict[str, list[Path]]) -> None:
    for name, slow, loaded in conditions(args):
        print(f"{name}: {args.runs} runs of {args.suite}", flush=True)
        load = neighbour() if loaded else None
        try:
            for run_dir in runs[name]:
                if run_dir.exists():
                    subprocess.run(["rm", "-r", str(run_dir)], check=True)
                one_run(args.suite, run_dir, slow)
        finally:
            if load is not None:
                load.kill()
                load.wait()


def record_run(slow: int) -> list[dict]:
    """The gate suite measured for real (one thread; ``flash-tiled`` repeated ``slow`` times
    per call): per point, its columns and every pass's recorded fields."""
    points = list(parse_suite(GATE_SUITE).points)
    original, threads = registry.get("flash-tiled"), torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: a neighbour time-shares it instead of stalling a team
    try:
        if slow > 1:
            slow_down("flash-tiled", slow)
        with tempfile.TemporaryDirectory() as tmp:
            run_points(points, RowWriter(Path(tmp)), GATE_MEASURE, run_id="r", suite_name="gate")
            logged = PassLog(Path(tmp)).read({p.point_id for p in points})
    finally:
        registry._REGISTRY["flash-tiled"] = original
        torch.set_num_threads(threads)
    out = []
    for point in points:
        _, records = logged[point.point_id]
        passes = [{k: records[i][k] for k in RECORDED if k in records[i]} for i in sorted(records)]
        out.append({"point": point.columns(), "passes": passes})
    return out


def _autogroup() -> str:
    """This process's scheduling group and its nice value (Linux autogroups), or why not."""
    try:
        return Path("/proc/self/autogroup").read_text().strip()
    except OSError as exc:
        return f"unknown ({exc.strerror})"


def record_gate(path: Path, loaded: bool) -> None:
    """Record the gate suite's base, honest and 3x-slowed runs into ``path`` (JSON)."""
    load = neighbour() if loaded else None
    try:
        conditions = {name: record_run(slow) for name, slow in
                      (("base", 1), ("honest", 1), ("slow", 3))}
    finally:
        if load is not None:
            load.kill()
            load.wait()
    info = {"recorded": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} after",
            "neighbour": "busy loop pinned to CPU 0" if loaded else "none",
            "scheduling": _autogroup(),
            "torch": torch.__version__, "suite": GATE_SUITE,
            "conditions": conditions}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=1) + "\n")
    print(f"recorded {path} ({info['machine']}, neighbour: {info['neighbour']})")


def failed(baseline: Path, run_dir: Path, text: str, confirm: Path | None) -> bool:
    """Whether the gate ``text`` fails ``run_dir``; ``confirm``: .ci/run's second run."""
    opts, extra = gate_options(text)
    if not compare_runs(baseline, run_dir, opts, extra).exit_code:
        return False
    if confirm is None:
        return True
    return bool(compare_runs(baseline, run_dir, opts, [*extra, confirm]).exit_code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="suites/smoke.toml")
    parser.add_argument("--runs", type=int, default=5, help="runs per condition")
    parser.add_argument("--impl", default="flash-tiled", help="implementation to slow down")
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--neighbour", choices=("both", "on", "off"), default="both")
    parser.add_argument("--baseline", type=Path, help="default: attnbench baseline find")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/attnbench-gate-power"))
    parser.add_argument("--reuse", action="store_true", help="evaluate runs already in workdir")
    parser.add_argument("--gate", action="append", metavar="NAME=ARGS",
                        help="compare options to evaluate (repeatable); 'ci' adds a confirm run")
    parser.add_argument("--record-gate", type=Path, metavar="FILE",
                        help="record the test gate suite's real samples into FILE and exit")
    args = parser.parse_args(argv)
    if args.record_gate is not None:
        record_gate(args.record_gate, args.neighbour != "off")
        return 0
    if args.runs < 2:
        parser.error("--runs must be >= 2 (the CI gate confirms with another run)")
    gates = dict(g.split("=", 1) for g in (args.gate or DEFAULT_GATES))
    runs = {name: [args.workdir / f"{name}-{i}" for i in range(args.runs)]
            for name, _, _ in conditions(args)}
    if not args.reuse:
        measure(args, runs)
    first = next(iter(runs.values()))[0]
    baseline = args.baseline or find_baseline(load_env(first), run_suite(first, load_env(first)))[0]
    print(f"\nbaseline {baseline}\n{'gate':<10} {'condition':<28} {'failed':>8}  target")
    for gate, text in gates.items():
        for name, slow, _ in conditions(args):
            dirs = runs[name]
            fails = sum(
                failed(baseline, d, text, dirs[(i + 1) % len(dirs)] if gate == "ci" else None)
                for i, d in enumerate(dirs)
            )
            target = "all" if slow else "none"
            print(f"{gate:<10} {name:<28} {fails:>3}/{len(dirs):<4}  {target}  "
                  f"({shlex.join(shlex.split(text)) or 'defaults'})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
