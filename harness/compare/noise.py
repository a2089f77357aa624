"""Run-level noise: which time basis a comparison uses, how much the runs' times scatter, and
which time regressions reproduce in further runs of the current code.

The time basis: ``absolute`` (seconds), ``normalized`` (per reference-kernel time,
``ref_kernel_s``: survives a machine that is uniformly slower today) or ``cpu`` (CPU time per
the reference kernel's CPU time, ``ref_kernel_cpu_s``: survives a core time-shared with other
tasks too, since the wait for a CPU is not CPU time); ``auto`` compares one-thread rows that
have CPU time on both sides in ``cpu`` and the rest normalized when every compared row has a
reference time. Rows flagged ``contended`` (measured while other processes took the CPU or
GPU, see :mod:`harness.measure.contention`) are still compared -- the CPU and normalized bases
and the pass structure are what make their times usable -- but the output says how many there
were: CPU time does not see the wait for a core, but it does see memory bandwidth and caches
shared with the other tasks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from harness import fmt
from harness.compare.findings import CompareError, Finding, Run
from harness.compare.rules import (
    CompareOptions,
    PointPair,
    cpu_gated,
    has_cpu_time,
    has_reference,
    pair_basis,
    row_time,
    time_finding,
)
from harness.measure import contention


def _is_timed(row: dict) -> bool:
    return row.get("status") == "ok" and bool(row.get("time_median_s"))


def _timed(rows: dict[str, dict]) -> list[dict]:
    return [r for r in rows.values() if _is_timed(r)]


def _in_passes(rows: dict[str, dict]) -> bool:
    """Every timed row was measured in two or more passes."""
    return all(len(r.get("pass_samples") or ()) >= 2 for r in _timed(rows))


def resolve_basis(opts: CompareOptions, runs: Sequence[dict[str, dict]], notes: list[str]):
    """``opts`` with ``auto`` resolved: one-thread rows with CPU time on both sides in ``cpu``
    (``cpu_rows``), the others normalized when every timed row has a reference time and the
    threshold is relative; raises when ``normalized`` or ``cpu`` is asked for and impossible."""
    timed = [r for rows in runs for r in _timed(rows)]
    relative = opts.checks["time"].relative
    if opts.time_basis == "cpu":
        without = sum(not has_cpu_time(r) for r in timed)
        if without or not relative:
            why = (f"{without} timed rows have no CPU time (cpu_time_samples_s and "
                   "ref_kernel_cpu_s: recorded on a CPU since 2026-11-28)" if without
                   else "threshold is absolute")
            raise CompareError(f"--time-basis cpu: impossible ({why})")
        threaded = sum(r.get("threads") != 1 for r in timed)
        if threaded:
            notes.append(f"{threaded} timed rows ran more than one thread: their CPU time counts "
                         "every thread, spin-waits included (auto compares them in wall time)")
        return opts
    missing = sum(not has_reference(r) for r in timed)
    if opts.time_basis == "normalized" and (missing or not relative):
        why = f"{missing} timed rows have no ref_kernel_s" if missing else "threshold is absolute"
        raise CompareError(f"--time-basis normalized: impossible ({why})")
    if opts.time_basis == "auto":
        basis = "normalized" if timed and not missing and relative else "absolute"
        if basis == "absolute" and missing and len(timed) > missing:
            notes.append(f"{missing} timed rows have no reference-kernel time: absolute basis")
        return replace(opts, time_basis=basis, cpu_rows=relative)
    return opts


def basis_used(opts: CompareOptions, base: dict[str, dict], cur: dict[str, dict]) -> str:
    """The basis the time gate used over the points timed in both runs, as the summary line
    names it: ``cpu``, the wall basis, or ``cpu+<wall basis>`` when some points were
    compared each way (:func:`harness.compare.rules.pair_basis`)."""
    used = {pair_basis(opts, base[pid], cur[pid]) for pid in base.keys() & cur.keys()
            if _is_timed(base[pid]) and _is_timed(cur[pid])}
    if opts.time_basis == "cpu" or used == {"cpu"}:
        return "cpu"
    return f"cpu+{opts.time_basis}" if "cpu" in used else opts.time_basis


def cpu_basis_note(opts: CompareOptions, runs: Sequence[dict[str, dict]]) -> list[str]:
    """Under ``auto``: a note when some rows have CPU time but ran more than one thread, so
    they were compared in wall time."""
    if not opts.cpu_rows:
        return []
    threaded = sum(has_cpu_time(r) and not cpu_gated(r) for rows in runs for r in _timed(rows))
    if not threaded:
        return []
    return [f"{threaded} timed rows ran more than one thread: compared in {opts.time_basis} "
            "wall time, not CPU time (which counts every thread, spin-waits included)"]


def _peak_scale(base_env: dict, cur_env: dict) -> float:
    """current peak / baseline peak: multiplies current times into baseline-machine seconds."""
    peaks = [(e.get("calibration") or {}).get("matmul_flops_per_s") for e in (base_env, cur_env)]
    if not all(isinstance(p, (int, float)) and p > 0 for p in peaks):
        raise CompareError("--normalize-peak needs calibration.matmul_flops_per_s in both env.json")
    return peaks[1] / peaks[0]


def time_scale(base: Run, cur: Run, opts: CompareOptions) -> float:
    """The factor that multiplies ``cur``'s times: the peak ratio with ``normalize_peak``."""
    if opts.time_basis in ("normalized", "cpu"):  # the reference kernel cancels machine speed
        return 1.0
    return _peak_scale(base.env, cur.env) if opts.normalize_peak else 1.0


def time_scatter(
    pairs: Iterable[tuple[dict, dict]],
    stat: str = "median",
    basis: str | CompareOptions = "absolute",
) -> float | None:
    """Run-to-run scatter of two runs' times over their common points: the robust standard
    deviation (1.4826 * MAD) of log(current / baseline). None with fewer than 8 points.
    ``basis``: one basis for every pair, or the options whose :func:`pair_basis` picks it.

    The other points act as controls: a real regression moves some points, a busy machine
    scatters all of them."""
    logs = []
    for base, cur in pairs:
        used = basis if isinstance(basis, str) else pair_basis(basis, base, cur)
        b, c = row_time(base, stat, used), row_time(cur, stat, used)
        if b and c and b > 0 and c > 0:
            logs.append(math.log(c / b))
    if len(logs) < 8:
        return None
    x = np.asarray(logs)
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def run_scatter(
    runs: Sequence[tuple[Run, Run]], opts: CompareOptions, what: str, notes: list[str]
) -> float | None:
    """Run-to-run time scatter (largest over the run pairs); None unless the report gate uses
    it. Rows timed in several shuffled passes need no scatter: a burst shows up in their own
    intervals, as disagreement between passes."""
    if opts.time_gate != "report":
        return None
    if all(_in_passes(run.rows) for pair in runs for run in pair):
        return None
    values = []
    for a, b in runs:
        common = [(a.rows[p], b.rows[p]) for p in a.rows.keys() & b.rows.keys()]
        values.append(time_scatter(common, opts.checks["time"].stat, opts))
    scatter = max((v for v in values if v is not None), default=None)
    if scatter is not None and scatter > 0.1:
        notes.append(
            f"times of {what} scatter by {fmt.ratio(math.exp(scatter))} (robust sd of log "
            f"ratios over points): slowdowns under {fmt.ratio(math.exp(opts.scatter_k * scatter))}"
            " are reported, not failed"
        )
    return scatter


CPU_CONTENTION = ("rows compared in CPU time do not hold the wait for a core; they do hold "
                  "the memory bandwidth and caches the other tasks shared")


def contention_notes(runs: Sequence[tuple[str, dict[str, dict]]], cpu: bool = False) -> list[str]:
    """One note per run (name, rows by point id) with rows measured under contention; with
    ``cpu`` (some points compared in CPU time) and any such note, one more saying what
    contention still does to CPU time."""
    out = []
    for name, rows in runs:
        if rows:
            line = contention.notice(pd.DataFrame(list(rows.values())), "rows")
            if line:
                out.append(f"{name}: {line}")
    return [*out, CPU_CONTENTION] if out and cpu else out


def confirm_failures(
    findings: list[Finding],
    base: Run,
    run: Run,
    name: str,
    opts: CompareOptions,
    scatter: float | None,
) -> list[Finding]:
    """Time failures that do not reproduce against ``run`` (another run of the current code,
    called ``name``) become warnings; those that do say so. Points ``run`` does not hold
    (a rerun of the suspects only) keep their verdict."""
    scale, out = time_scale(base, run, opts), []
    for f in findings:
        if _is_suspect(f) and f.point_id in run.rows:
            pid, rows = f.point_id, run.rows
            again = rows[pid].get("status") == "ok" and time_finding(
                PointPair(pid, "", base.rows[pid], rows[pid]), opts, scale, scatter
            )
            if not again or again.level != "fail":
                f = replace(f, level="warn", suspect=False, verdict=f"{f.verdict}, not in {name}")
            else:  # a suspect warning the rerun shows beyond the margin fails too
                f = replace(f, level="fail", suspect=False,
                            verdict=f"{f.verdict}, again in {name}")
        out.append(f)
    return out


def _is_suspect(f: Finding) -> bool:
    return f.metric == "time" and (f.level == "fail" or (f.level == "warn" and f.suspect))


def time_failures(findings: Sequence[Finding]) -> list[str]:
    """Point ids of the time regressions that fail, and of the suspect warnings (estimate
    beyond the margin, interval not wholly): what a rerun measures again."""
    return sorted({f.point_id for f in findings if _is_suspect(f)})


# rerun(point ids) -> (the rerun of those points, its directory), or (None, why it could not)
Rerun = Callable[[list[str]], tuple[Run | None, str]]
RERUN_TRIES = 2  # a suspect reproduced only in a contended rerun is measured once more


def confirm_by_rerun(
    findings: list[Finding],
    base: Run,
    rerun: Rerun,
    opts: CompareOptions,
    scatter: float | None,
    notes: list[str],
) -> list[Finding]:
    """Time suspects measured again, now, by ``rerun``: one that does not reproduce becomes a
    warning (a burst of load rarely hits the same point twice); one that does fails. A
    suspect reproduced in a rerun row flagged ``contended`` (weaker evidence: contention slows
    calls) is measured once more, and only a *clean* second rerun that does not show it turns
    it into a warning: contended evidence is overridden by clean evidence, never by more
    contended evidence (on a machine that stays busy, a real regression must still fail).
    When no rerun can be made the failures stand, with a note saying why."""
    suspects = time_failures(findings)
    for attempt in range(RERUN_TRIES):
        if not suspects:
            break
        run, where = rerun(suspects)
        if run is None:
            notes.append(f"time regressions not confirmed by a rerun ({where}); they fail as "
                         "measured (give a second run of the current code with --confirm DIR)")
            break
        name = f"the rerun{'' if attempt == 0 else ' ' + str(attempt + 1)} ({where})"
        before = {f.point_id: f for f in findings if f.metric == "time"}
        findings = confirm_failures(findings, base, run, name, opts, scatter)
        if attempt > 0:  # a contended second rerun cannot clear what the first one showed
            findings = [_kept(f, before[f.point_id], run, name) if f.metric == "time"
                        and f.point_id in suspects else f for f in findings]
        suspects = [pid for pid in time_failures(findings)
                    if pid in suspects and run.rows.get(pid, {}).get("contended") is True]
    return findings


def _kept(now: Finding, before: Finding, run: Run, name: str) -> Finding:
    """``now`` unless the second rerun cleared ``before`` while itself contended."""
    if now.level == "fail" or run.rows.get(now.point_id, {}).get("contended") is not True:
        return now
    return replace(before, verdict=f"{before.verdict}; not in {name}, contended too")
