"""One run of a suite into a run directory: the directory is created (or resumed), ``env.json``
written with the device calibration, and every point measured by :mod:`harness.execute.runner`,
in this process or each in a child process (:mod:`harness.execute.isolate`).

``attnbench run`` turns its flags into :class:`RunOptions` and :func:`configure`, then calls
:func:`run_suite` (through :func:`harness.distributed.shard.run_here`, which records the shard
in ``env.json``). A refusal (a bad option, no such device, a run directory that is not
writable or holds another run) raises :class:`~harness.errors.CliError` before any point runs.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from harness import plugins
from harness.errors import CliError, Interrupted
from harness.execute.deadline import Deadline
from harness.execute.isolate import isolated_executor, run_environment
from harness.execute.passlog import PassLog
from harness.execute.runner import default_budget, run_points
from harness.fmt import plural
from harness.measure import calibrate, env
from harness.measure.device import get_device
from harness.results import (
    ENV_FILE,
    PASSES_FILE,
    ROWS_FILE,
    RowWriter,
    iter_rows,
    load_env,
    write_env,
)
from harness.scenarios.interface import Point, cost_of
from harness.sweep.suite import MAX_PASSES, MeasureConfig, Suite
from harness.terminal import Progress, duration


@dataclass(frozen=True)
class RunOptions:
    """How to run a suite (the ``attnbench run`` flags); None and False keep the suite's own
    ``[measure]`` settings."""

    out: Path | None = None  # run directory; None: runs/<suite>-<run id>
    resume: bool = False  # continue ``out``, skipping the points (and passes) it holds
    force: bool = False  # resume even if the suite or device fingerprint differs
    mem_budget: int | None = None  # bytes; skip points predicted to need more
    check: str | None = None  # agreement check: auto | full | rows | none
    budget_s: float | None = None  # timing budget per point, seconds
    passes: int | None = None  # timing passes over the suite ([measure] passes)
    isolate: bool = False  # each point in its own child process
    point_timeout: float | None = None  # seconds; with isolation, give up on a point after this
    progress: bool = True  # a progress bar while points run
    time_limit: float | None = None  # seconds for the whole run ([measure] time_limit_s)
    # point ids in the first pass's order (a time-limited run's coarse-to-fine order,
    # harness.sweep.order); None: the shuffled order. Ids not in the suite are ignored.
    first_order: tuple[str, ...] | None = None
    # with a time limit: (first-pass rows so far, env.json) -> point ids that may wait at the
    # back of the first pass (harness.analysis.groups.StoppingRule)
    stopping_rule: Callable[[list[dict], dict], set[str]] | None = None
    # with a time limit: (point id, ids left out) -> still worth running (StoppingRule.wanted)
    wanted: Callable[[str, set[str]], bool] | None = None


@dataclass(frozen=True)
class RunResult:
    """Where a run went and how its points ended (status -> number of points)."""

    run_dir: Path
    counts: dict[str, int]


def configure(suite: Suite, options: RunOptions) -> MeasureConfig:
    """The suite's ``[measure]`` settings with the options' overrides; refuses a budget or
    timeout that is not a positive number of seconds, and a timeout without isolation."""
    measure = suite.measure
    for flag, value in (("--budget-s", options.budget_s),
                        ("--point-timeout", options.point_timeout),
                        ("--time-limit", options.time_limit)):
        if value is not None and not 0 < value < float("inf"):
            raise CliError(f"{flag} {value}: must be a positive number of seconds")
    if options.check:
        measure = replace(measure, check=options.check)
    if options.time_limit is not None:
        measure = replace(measure, time_limit_s=options.time_limit)
    if options.budget_s:
        measure = replace(measure, timing=replace(measure.timing, budget_s=options.budget_s))
    if options.passes is not None:
        if not 1 <= options.passes <= MAX_PASSES:
            raise CliError(f"--passes {options.passes}: must be 1..{MAX_PASSES}")
        measure = replace(measure, passes=options.passes)
    if ((options.point_timeout or measure.point_timeout_s)
            and not (options.isolate or measure.isolate)):
        raise CliError("--point-timeout / [measure] point_timeout_s needs --isolate "
                       "(a hung point is stopped by killing its child)")
    return measure


def run_suite(suite: Suite, measure: MeasureConfig, options: RunOptions,
              on_open: Callable[[Path, bool], None] | None = None,
              predict: Callable[..., float] | None = None, *,
              deadline: Deadline | None = None, calibration: dict | None = None,
              quiet: bool = False) -> RunResult:
    """Measure every point of ``suite`` with ``measure`` into ``options.out`` (a new directory,
    or the one being resumed). ``on_open(run_dir, resumed)`` runs once ``env.json`` is in place,
    before any point (a shard records itself there). ``predict(point, flops_per_s, first)``:
    the predicted seconds of one pass of a point (its first, or a later one) at this machine's
    measured matmul rate (:func:`at_measured_rate`), for the expected time said before the run
    starts and the ETA of the progress display. Progress and a summary go to stderr; Ctrl-C
    keeps every finished row and pass and says how to resume
    (:class:`~harness.errors.Interrupted`, exit 130).

    A session over several suites (``attnbench verdicts``) shares one ``deadline`` between its
    calls (one clock, one pace; this call sets its ``calls`` and ``predict``), gives a new run
    directory the ``calibration`` it measured already on the same device and threads, and is
    ``quiet``: it says itself what its calls do."""
    for kind in sorted({p.device for p in suite.points}):  # refuse before anything is written
        try:
            get_device(kind)
        except RuntimeError as exc:
            raise CliError(f"{suite.path}: device = {kind!r}: {exc}") from None
    if measure.threads:  # before the resume check: the device fingerprint includes threads
        torch.set_num_threads(measure.threads)
    new_id = env.new_run_id()  # one id: the default folder is named after it
    run_dir = options.out or Path("runs") / f"{suite.name}-{new_id}"
    done, run_id = resume_state(run_dir, suite, options)
    points = [p for p in suite.points if p.point_id not in done]
    resumed = run_id is not None  # rows or finished passes to continue
    isolate = options.isolate or measure.isolate
    if not resumed:
        make_run_dir(run_dir)
        run_id = new_id
        prepare_run(suite, run_dir, run_id, isolate, calibration)
    if on_open is not None:
        on_open(run_dir, resumed)
    executor = None
    bandwidth = run_bandwidth(suite, run_dir)
    if isolate:
        timeout = options.point_timeout or measure.point_timeout_s
        executor = isolated_executor(measure, options.mem_budget, timeout, bandwidth)
    writer = RowWriter(run_dir)
    if predict is not None:
        predict = _over_budget_is_instant(at_measured_rate(predict, run_dir), options.mem_budget)
    schedule = passes_to_run(points, PassLog(run_dir), max(measure.passes, 1), predict)
    order = first_order(points, options.first_order) if measure.time_limit_s else None
    timing = measure.timing  # the calls a pass cannot skip (first: first call, check, memory)
    calls = (3 + timing.warmup_calls + timing.min_samples, timing.warmup_calls + timing.min_samples)
    if deadline is not None:  # shared by a session: this suite's calls and predictor
        deadline.calls, deadline.predict = calls, predict
    elif measure.time_limit_s and points:
        deadline = Deadline(measure.time_limit_s, predict, calls=calls)
    say = (lambda text: None) if quiet else (lambda text: print(text, file=sys.stderr))
    say(f"attnbench: {plural(len(points), 'point')} of suite {suite.name!r} -> {run_dir}"
        + (f" ({len(done)} already done)" if done else "")
        + (f"; expected about {duration(sum(schedule.values()))} "
           "(predicted; the ETA follows the run's pace)" if predict and points else ""))
    if deadline is not None:
        say(limit_notice(deadline, points, order, schedule))
    try:
        with (Progress(schedule, max(measure.passes, 1), limit_s=measure.time_limit_s)
              if options.progress and points else nullcontext()) as bar:
            counts = run_points(points, writer, measure, run_id=run_id, suite_name=suite.name,
                                mem_budget=options.mem_budget, executor=executor,
                                on_pass=_stepper(bar),
                                after_fault=_isolate_after_fault(measure, options,
                                                                 bandwidth),
                                first_order=order, deadline=deadline,
                                defer=_defer(options.stopping_rule, run_dir, deadline),
                                wanted=options.wanted)
    except KeyboardInterrupt:
        raise Interrupted(interrupted_message(suite, run_dir)) from None
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or (
        "no point finished all its passes" if deadline and deadline.started else "nothing to run")
    say(f"attnbench: {summary}; rows in {run_dir / ROWS_FILE}")
    if deadline is not None and (deadline.left_out or deadline.cut):
        say(cut_message(deadline, suite, run_dir, max(measure.passes, 1)))
    return RunResult(run_dir, counts)


def _defer(rule, run_dir: Path, deadline: Deadline | None):
    """The runner's ``defer`` for a time-limited run with a stopping rule (None otherwise)."""
    if rule is None or deadline is None:
        return None
    env = load_env(run_dir)
    return lambda rows: rule(rows, env)


def first_order(points: list[Point], ids: tuple[str, ...] | None) -> list[int]:
    """Indices of ``points`` in the order of ``ids`` (a coarse-to-fine order); points it does
    not name follow in the suite's order."""
    where = {p.point_id: i for i, p in enumerate(points)}
    named = [where[pid] for pid in dict.fromkeys(ids or ()) if pid in where]
    seen = set(named)
    return named + [i for i in range(len(points)) if i not in seen]


def limit_notice(deadline: Deadline, points: list[Point], order: list[int] | None,
                 schedule: dict[tuple[str, int], float]) -> str:
    """The line a time-limited run starts with: the limit, the order, and whether the first
    point alone is expected to take longer (it runs anyway)."""
    text = (f"attnbench: time limit {duration(deadline.limit_s)}: points in coarse-to-fine "
            "order (--dry-run lists it); a cut run keeps every finished row")
    pending = [i for i in (order or range(len(points))) if (points[i].point_id, 0) in schedule]
    if pending:
        first = points[pending[0]]
        expected = schedule[(first.point_id, 0)]
        if expected > deadline.limit_s:
            text += (f"; the first point ({first.impl} n={first.seq_len}) is expected to take "
                     f"about {duration(expected)}, longer than the limit: that one point runs")
    return text


def cut_message(deadline: Deadline, suite: Suite, run_dir: Path, passes: int) -> str:
    """The line a run cut by its time limit ends with: how many points it left out."""
    text = (f"attnbench: time limit {duration(deadline.limit_s)} reached after "
            f"{duration(deadline.elapsed())}: {plural(len(deadline.left_out), 'point')} "
            "left out")
    if deadline.cut:
        text += (f", {plural(len(deadline.cut), 'point')} with fewer than {passes} timing "
                 "passes (read as partial rows)")
    return text + f"; continue with: attnbench run {suite.path} --out {run_dir} --resume"


def run_bandwidth(suite: Suite, run_dir: Path) -> dict[str, float]:
    """Device kind -> the copy bandwidth of the run's calibration (env.json, of
    :func:`calibrated_device`): what its isolated children compare their rows' bytes against.
    Empty when env.json has none."""
    if not (run_dir / ENV_FILE).is_file():
        return {}
    calibration = load_env(run_dir).get("calibration") or {}
    bandwidth = calibration.get("mem_bandwidth_bytes_per_s")
    return {torch.device(calibrated_device(suite)).type: bandwidth} if bandwidth else {}


def calibrated_device(suite: Suite) -> str:
    """The device a run's env.json calibrates: the suite's first device (sorted)."""
    return min({p.device for p in suite.points}, default="cpu")


def _isolate_after_fault(measure: MeasureConfig, options: RunOptions,
                         bandwidth: dict[str, float]):
    """The runner's ``after_fault``: say in one line that a CUDA error may have poisoned this
    process, and go on as ``--isolate`` does, each remaining point in a fresh child."""

    def switch(point: Point, record: dict) -> Callable[..., dict]:
        print(f"attnbench: {point.impl} n={point.seq_len} hit a CUDA error ({record.get('reason')}"
              "); this process's CUDA context may be unusable, so the remaining points run "
              "each in a fresh child process (as with --isolate)", file=sys.stderr)
        return isolated_executor(measure, options.mem_budget, options.point_timeout, bandwidth)

    return switch


def interrupted_message(suite: Suite, run_dir: Path) -> str:
    """What Ctrl-C leaves behind in ``run_dir`` and the command that continues it."""
    rows = run_dir / ROWS_FILE
    finished = sum(1 for _ in iter_rows(rows)) if rows.is_file() else 0
    return (f"interrupted: {plural(finished, 'finished row')} and every finished timing pass "
            f"are saved in {run_dir}; continue with: attnbench run {suite.path} --out "
            f"{run_dir} --resume")


def at_measured_rate(
    predict: Callable[..., float], run_dir: Path
) -> Callable[..., float]:
    """``predict(point, flops_per_s, first)`` at the fp32 matmul rate this machine measured at the
    run's start (env.json ``calibration.matmul_flops_per_s``; None when the run has none, and
    the predictor falls back to a nominal rate)."""
    try:
        rate = (load_env(run_dir).get("calibration") or {}).get("matmul_flops_per_s")
    except CliError:
        rate = None
    rate = float(rate) if isinstance(rate, int | float) and rate > 0 else None
    return lambda point, first=True: predict(point, rate, first)


def _over_budget_is_instant(predict: Callable[..., float],
                            mem_budget: int | None) -> Callable[..., float]:
    """``predict`` for a point that runs; 0 s for one the runner will skip at once because its
    predicted peak memory exceeds the budget (``mem_budget``, else the device's default, as
    the runner decides), so the expected time counts only what will run."""
    budgets: dict[str, int] = {}

    def seconds(point: Point, first: bool = True) -> float:
        if point.device not in budgets:
            budgets[point.device] = (mem_budget if mem_budget is not None
                                     else default_budget(get_device(point.device)))
        try:
            peak = cost_of(point).peak_bytes
        except Exception:  # a model gap: the runner records it and runs the point
            peak = None
        over = peak is not None and peak > budgets[point.device]
        return 0.0 if over else predict(point, first)

    return seconds


def passes_to_run(points: list[Point], log: PassLog, passes: int,
              predict: Callable[..., float] | None) -> dict[tuple[str, int], float]:
    """(point id, pass) -> predicted seconds, for every pass still to run (passes logged in
    ``passes.jsonl`` by an interrupted run are left out); 1 s each without a predictor."""
    restored = log.read({p.point_id for p in points})
    schedule = {}
    for point in points:
        first, records = restored.get(point.point_id, (None, {}))
        if first is not None and first.get("status") != "ok":
            continue  # failed in its first pass: nothing left but writing its row
        for k in range(passes):
            if k not in records:
                schedule[(point.point_id, k)] = (
                    predict(point, first=k == 0) if predict is not None else 1.0
                )
    return schedule


def _stepper(bar):
    """The runner's ``on_pass``: one progress step per pass; a point that fails its first
    pass leaves the later passes."""
    if not isinstance(bar, Progress):
        return None

    def on_pass(point: Point, k: int, record: dict) -> None:
        status = record.get("status")
        if k == 0 and status != "ok":
            bar.forget(point.point_id)
        bar.step(point.point_id, k, f"{point.impl} n={point.seq_len}: {status}")

    return on_pass


def make_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` and prove it writable, before any point runs."""
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


def resume_state(run_dir: Path, suite: Suite, options: RunOptions) -> tuple[set[str], str | None]:
    """Point ids already measured in ``run_dir`` and its run id; (empty, None) for a fresh run.
    ``--resume`` of a directory that holds no results says so and starts a new run."""
    if run_dir.exists() and not run_dir.is_dir():
        raise CliError(f"--out {run_dir}: exists and is not a directory")
    rows_file = run_dir / ROWS_FILE
    if not rows_file.exists() and not (run_dir / PASSES_FILE).exists():
        if options.resume:
            print(f"attnbench: nothing to resume in {run_dir}; starting a new run",
                  file=sys.stderr)
        return set(), None
    if not options.resume:
        raise CliError(f"--out {run_dir} already holds results; add --resume to continue it "
                       "or choose a new --out")
    recorded = load_env(run_dir)
    if recorded.get("suite_fingerprint") != suite.sha256 and not options.force:
        raise CliError(f"{run_dir} was run from a different suite file "
                       f"({recorded.get('suite_path')}); use --force to resume anyway")
    here = (env.fingerprint(get_device(suite.points[0].device).info())
            if suite.points else None)
    if here and recorded.get("fingerprint") != here and not options.force:
        raise CliError(f"{run_dir} was measured on {recorded.get('fingerprint')}, this is {here}; "
                       "use --force to mix them")
    rows = iter_rows(rows_file) if rows_file.exists() else ()
    done = {row["point_id"] for row in rows if "point_id" in row}
    return done, recorded.get("run_id") or run_dir.name


def prepare_run(suite: Suite, run_dir: Path, run_id: str, isolate: bool = False,
                calibration: dict | None = None) -> dict:
    """Write env.json (with the device calibration) for a new run; returns it. With
    ``isolate`` a child process collects it, so this process never holds a GPU context or
    the calibration's cached memory while the points' children run. ``calibration``: one this
    process measured already on the same device and threads (not measured again)."""
    if suite.measure.threads:
        torch.set_num_threads(suite.measure.threads)
    kind = calibrated_device(suite)
    run = (suite.name, suite.path, suite.sha256, run_id)
    if isolate:
        info = run_environment(kind, suite.measure.flush_l2, suite.measure.threads, run)
    else:
        device = get_device(kind, suite.measure.flush_l2)
        info = env.collect(device, *run)
        info["calibration"] = calibration or calibrate.calibrate(device)
    # the plug-in files this process loaded (path, sha256): a verb that reads these rows
    # without --plugin loads them again while they are unchanged (harness.cli.plugin_use)
    info["plugins"] = plugins.loaded_records()
    write_env(run_dir, info)
    return info
