"""Regression checks between two runs (``attnbench compare BASELINE_DIR CURRENT_DIR``).

Rows are matched by point (:func:`harness.compare.findings.load_run`), never by position. Per
point and metric a :class:`~harness.compare.findings.Finding` with a level:

- ``fail``: a regression (exit status 1): status ok -> error/oom/mismatch/timeout/skipped, a
  missing point, peak memory above the threshold, ``agree`` going false or the error passing
  the tolerance, and a time regression by the noise-aware rule of :mod:`harness.compare.rules`
  (with the ``report`` time gate, only one whose whole confidence interval is above
  ``time_fail`` and that stands out of the suite's run-to-run scatter; with confirm runs, only
  one that reproduces in them; the rest are ``warn``); times are compared in the basis
  :func:`harness.compare.noise.resolve_basis` picks: ``normalized`` (per reference-kernel
  time), ``absolute``, or ``auto``;
- ``warn`` / ``info``: reported, never fail (slower within noise, faster, new points, fixes);
- ``ok``: unchanged.

Exit 0 when nothing failed, 1 on any regression, 2 on unusable input (a
:class:`~harness.compare.findings.CompareError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from harness.compare.baseline import machine_key
from harness.compare.findings import LEVELS, CompareError, Comparison, Finding, load_run
from harness.compare.noise import (
    Rerun,
    basis_used,
    confirm_by_rerun,
    confirm_failures,
    contention_notes,
    cpu_basis_note,
    resolve_basis,
    run_scatter,
    time_scale,
)
from harness.compare.rules import CompareOptions, point_findings
from harness.results import ResultsError, load_env


def _env_notes(base: dict, cur: dict, opts: CompareOptions) -> list[str]:
    """Warnings when the two runs were not measured alike."""
    notes = []
    if machine_key(base) != machine_key(cur):
        hint = "" if opts.normalize_peak else "; consider --normalize-peak"
        notes.append(
            f"device fingerprints differ: baseline {machine_key(base)!r}, current "
            f"{machine_key(cur)!r}: times and CPU memory may not be comparable{hint}"
        )
    if base.get("torch") != cur.get("torch"):
        notes.append(
            f"torch versions differ ({base.get('torch')} vs {cur.get('torch')}): "
            "CPU memory figures (profiler allocation events) may differ slightly"
        )
    if cur.get("malloc_tuning") and base.get("malloc_tuning") != cur.get("malloc_tuning"):
        notes.append(
            f"host allocator states differ (baseline {base.get('malloc_tuning') or 'not recorded'}"
            f", current {cur['malloc_tuning']}): CPU points with buffers of 128 KiB to 32 MiB "
            "may time apart by their page faults (docs/noise.md, the allocator)"
        )
    if base.get("suite") != cur.get("suite"):
        notes.append(f"suites differ: {base.get('suite')!r} vs {cur.get('suite')!r}")
    return notes


def _other_machine_time(findings: list[Finding], notes: list[str]) -> list[Finding]:
    """Under the report gate, a time regression against another machine's baseline warns.

    Normalized time (time / a matmul timed beside it) cancels a machine's speed, not its balance
    of compute and memory: an op's time relative to a matmul differs between CPU models by tens
    of percent (sdpa-math, which writes its n x n scores, measured +50..+100 % on an Intel Xeon
    against an AMD EPYC baseline), which the report gate's margin must not read as a regression.
    Status, memory and numerics still fail; ``--time-gate hard`` still fails on time."""
    kept = [
        replace(f, level="warn", verdict=f"{f.verdict}; another machine's baseline")
        if f.metric == "time" and f.level == "fail"
        else f
        for f in findings
    ]
    if kept != findings:
        notes.append(
            "time regressions against another machine's baseline are warnings under "
            "--time-gate report; record this machine's with: attnbench baseline save RUN_DIR"
        )
    return kept


def _presence(base_rows: dict[str, dict], cur_rows: dict[str, dict]) -> list[Finding]:
    """A baseline point missing from the current run fails; a new point is info."""
    found = []
    for pid, row in base_rows.items():
        if pid not in cur_rows:
            status = row.get("status") or ""
            found.append(Finding(pid, row["_label"], "point", "fail", "missing", status, "-"))
    for pid in cur_rows.keys() - base_rows.keys():
        status = cur_rows[pid].get("status") or ""
        found.append(Finding(pid, cur_rows[pid]["_label"], "point", "info", "new", "-", status))
    return found


def compare_runs(
    baseline: Path | str,
    current: Path | str,
    opts: CompareOptions,
    confirm: Sequence[Path | str] = (),
    rerun: Rerun | None = None,
) -> Comparison:
    """Compare two run directories; raises :class:`CompareError` on unusable input.

    ``confirm``: more runs of the current code; a time regression fails only when it also
    fails against each of them (a burst of load on a shared machine rarely hits twice).
    ``rerun(point_ids)``: measures the suspects again now (:func:`confirm_by_rerun`), after
    the ``confirm`` runs; what plain ``attnbench compare`` does."""
    notes: list[str] = []
    base, cur = load_run(Path(baseline), notes), load_run(Path(current), notes)
    if base.env and cur.env:
        notes += _env_notes(base.env, cur.env, opts)
    others = [(load_run(Path(d), notes), Path(d).name) for d in confirm]
    compared = [base.rows, cur.rows] + [run.rows for run, _ in others]
    opts = resolve_basis(opts, compared, notes)
    notes += cpu_basis_note(opts, compared)
    basis = basis_used(opts, base.rows, cur.rows)
    notes += contention_notes(
        [(str(baseline), base.rows), (str(current), cur.rows)]
        + [(str(d), run.rows) for (run, _), d in zip(others, confirm, strict=True)],
        cpu=basis.startswith("cpu"),
    )
    # Scatter over every pair of runs, the largest kept: between runs of the same code it is
    # pure noise (a real regression cannot inflate it); against the baseline it also covers
    # the baseline's own lucky or unlucky points, which the confirm runs cannot reveal.
    runs = [(base, cur)] + [p for run, _ in others for p in ((base, run), (cur, run))]
    scatter = run_scatter(runs, opts, "the runs", notes)
    scale = time_scale(base, cur, opts)
    findings: list[Finding] = []
    for pid, row in base.rows.items():
        if pid in cur.rows:
            findings += point_findings(pid, row, cur.rows[pid], opts, scale, scatter)
    findings += _presence(base.rows, cur.rows)
    for run, name in others:
        findings = confirm_failures(findings, base, run, name, opts, scatter)
    if opts.time_gate == "report" and machine_key(base.env) != machine_key(cur.env):
        findings = _other_machine_time(findings, notes)
    if rerun is not None:
        findings = confirm_by_rerun(findings, base, rerun, opts, scatter, notes)
    findings.sort(key=lambda f: (LEVELS.index(f.level), f.label, f.metric))
    return Comparison(
        str(baseline),
        str(current),
        machine_key(base.env),
        machine_key(cur.env),
        tuple(findings),
        tuple(notes),
        len(base.rows.keys() | cur.rows.keys()),
        basis,
    )


def check_same_suite(baseline_dir: Path, current_dir: Path) -> None:
    """``compare`` of runs of two different suites is a usage error (every point would be
    missing from the other run), not a list of regressions."""
    suites = []
    for run_dir in (baseline_dir, current_dir):
        try:
            suites.append(load_env(run_dir).get("suite"))
        except ResultsError:  # compare itself reports an unusable run
            return
    if all(suites) and suites[0] != suites[1]:
        raise CompareError(
            f"compare: {baseline_dir} is a run of suite {suites[0]!r} and "
            f"{current_dir} of {suites[1]!r}; compare two runs of one suite"
        )
