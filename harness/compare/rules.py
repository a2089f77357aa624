"""How one point's change between two runs is judged: the thresholds (parsed like
pytest-benchmark's ``median:10%``: ``time=median:10%,mem=5%``), the options of a comparison,
the change of a point's time with its confidence interval, and the per-metric verdicts --
status, time, memory, numerics -- on a point present in both runs.

Time is noisy and judged on a confidence interval; memory and numerics are deterministic and
compared directly. The time rule fails a point only when the *lower* end of a bootstrap
confidence interval on the change of a statistic (by default the ratio of medians,
``median(current) / median(baseline) - 1``) is above the threshold: the slowdown must exceed
the threshold even at the optimistic end of what the measured noise allows. A real 1.5x
slowdown with a few percent of noise is caught; a 12% jump in a run whose samples spread over
±20% is not.

Rows measured in several passes (``pass_samples`` cuts ``time_samples_s`` into passes) are
compared with a hierarchical bootstrap (:mod:`harness.measure.passes`): passes, then samples,
are resampled, so disagreement between a point's passes widens the interval as it should. The
time basis: ``absolute`` (seconds), ``normalized`` (each pass's samples divided by the
reference kernel's time in that pass, ``ref_kernel_s``), which cancels a machine that is
uniformly slower today, or ``cpu`` (each pass's per-call CPU times divided by the reference
kernel's CPU time in that pass, ``ref_kernel_cpu_s``), which a time-shared core does not move
either: the wait for a CPU is in wall time, not in CPU time. ``auto`` compares one-thread rows
that have CPU time on both sides in ``cpu`` (:func:`pair_basis`), the rest as before.

Within-run samples cannot see a burst of load that covers a whole point (on a busy 2-core
machine one point can run 10-100x slower for its whole budget). For such machines the
``report`` gate fails a time regression only when it is also above a wide margin and stands out
of the run-to-run scatter of all the suite's points (:func:`harness.compare.noise.time_scatter`);
compare's ``--confirm`` additionally asks it to reproduce in another run
(:func:`harness.compare.noise.confirm_failures`).
"""

# size: thresholds, the time change and the verdicts are one rule read together
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from harness import fmt
from harness.compare.findings import Finding
from harness.measure import passes as pass_stats

TIME_STATS = ("median", "mean", "min")
METRICS = ("time", "mem")
BASES = ("auto", "absolute", "normalized", "cpu")
_UNITS = {"": 1.0, "b": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6} | {
    f"{prefix}{suffix}": base**power  # kb, mb, gb (decimal); kib, mib, gib (binary)
    for power, prefix in enumerate("kmg", 1)
    for suffix, base in (("b", 1000.0), ("ib", 1024.0))
}
_VALUE = re.compile(r"^(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>%|[a-zA-Z]*)$")


@dataclass(frozen=True)
class Threshold:
    """One metric's threshold: relative (``threshold`` is a fraction, 0.10 = 10%) or absolute
    (seconds for time, bytes for memory). ``stat`` is the per-run statistic compared."""

    metric: str
    stat: str
    threshold: float
    relative: bool = True

    def change(self, base: float, cur: float) -> float:
        """The change from ``base`` to ``cur`` in this check's units (fraction or absolute)."""
        if not self.relative:
            return cur - base
        if base == 0:
            return 0.0 if cur == 0 else math.inf
        return cur / base - 1.0

    def exceeds(self, base: float, cur: float) -> bool:
        """True when ``cur`` is worse than ``base`` by more than the threshold (point estimate)."""
        return self.change(base, cur) > self.threshold

    def describe(self) -> str:
        """The rule as written on the command line, e.g. ``median:10%``."""
        if self.relative:
            return f"{self.stat}:{self.threshold * 100:g}%"
        unit = "s" if self.metric == "time" else "B"
        return f"{self.stat}:{self.threshold:g}{unit}"

    def format_change(self, change: float) -> str:
        """``+12.3%`` (relative), ``+4.1 ms`` (time) or ``+1.20 MiB`` (memory)."""
        if self.relative:
            return fmt.signed_percent(change)
        shown = fmt.seconds if self.metric == "time" else fmt.mebibytes
        return ("-" if change < 0 else "+") + shown(abs(change))


DEFAULT_THRESHOLDS: dict[str, Threshold] = {
    "time": Threshold("time", "median", 0.10),
    "mem": Threshold("mem", "peak", 0.05),
}


def parse_amount(text: str) -> tuple[float, bool]:
    """``10%`` -> (0.10, relative); ``0.001`` / ``2ms`` / ``1MiB`` -> (absolute value, False)."""
    match = _VALUE.match(text.strip())
    if not match or match["unit"].lower() not in {*_UNITS, "%"}:
        raise ValueError(f"cannot parse threshold {text!r} (want e.g. 10% or 0.001 or 1MiB)")
    number = float(match["num"])
    if match["unit"] == "%":
        return number / 100.0, True
    return number * _UNITS[match["unit"].lower()], False


def parse_threshold(metric: str, spec: str) -> Threshold:
    """``time``, ``median:10%`` -> Threshold; ``mem``, ``5%`` -> Threshold (stat ``peak``)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} in threshold (known: {', '.join(METRICS)})")
    stat, _, amount = spec.rpartition(":")
    if metric == "time":
        stat = stat or "median"
        if stat not in TIME_STATS:
            raise ValueError(f"unknown time statistic {stat!r} (known: {', '.join(TIME_STATS)})")
    elif stat not in ("", "peak"):
        raise ValueError(f"memory threshold takes no statistic, got {stat!r}")
    threshold, relative = parse_amount(amount)
    return Threshold(metric, stat or "peak", threshold, relative)


def parse_thresholds(
    text: str | None, defaults: dict[str, Threshold] | None = None
) -> dict[str, Threshold]:
    """``time=median:10%,mem=5%`` -> {metric: Threshold}; unnamed ``median:10%`` means time.

    Metrics not named keep their default.
    """
    checks = dict(DEFAULT_THRESHOLDS if defaults is None else defaults)
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        metric, sep, spec = part.partition("=")
        if not sep:
            metric, spec = "time", part
        checks[metric.strip()] = parse_threshold(metric.strip(), spec.strip())
    return checks


@dataclass(frozen=True)
class CompareOptions:
    """How to compare: per-metric checks, time gate and noise-test settings."""

    checks: dict[str, Threshold] = field(default_factory=lambda: parse_thresholds(None))
    normalize_peak: bool = False
    time_gate: str = "hard"  # hard: time regressions fail; report: only beyond time_fail
    time_fail: float | None = 0.5  # report gate: fail when the CI's low end is above this
    confidence: float = 0.99
    scatter_k: float = 3.0  # report gate: fail only beyond k x the runs' time scatter too
    numerics_growth: float = 2.0  # error growth (x) within tolerance reported as info
    time_basis: str = "auto"  # auto | absolute | normalized (time / ref_kernel_s) | cpu
    # auto, resolved (harness.compare.noise.resolve_basis): one-thread rows with CPU time on
    # both sides are compared in cpu time, the others in time_basis (pair_basis)
    cpu_rows: bool = False


# --- the change of one point's time -------------------------------------------------------

@dataclass(frozen=True)
class TimeChange:
    """A time comparison: statistics, the change (point estimate) and its confidence interval,
    in the check's units (fraction when relative, seconds or reference times when absolute)."""

    base: float
    cur: float
    change: float
    low: float
    high: float
    method: str  # passes | bootstrap | run-ci | none (no samples: point estimate only)


def _stat(values: np.ndarray, stat: str, axis: int | None = None) -> np.ndarray:
    return {"median": np.median, "mean": np.mean, "min": np.min}[stat](values, axis=axis)


def bootstrap_interval(
    base: np.ndarray,
    cur: np.ndarray,
    check: Threshold,
    confidence: float = 0.99,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of ``check.change(stat(base), stat(cur))``; each run's samples
    (1-D, seconds) are resampled independently. Seeded, so a comparison is reproducible."""
    rng = np.random.default_rng(seed)
    b = _stat(rng.choice(base, size=(resamples, base.size)), check.stat, axis=1)
    c = _stat(rng.choice(cur, size=(resamples, cur.size)), check.stat, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        changes = c / b - 1.0 if check.relative else c - b
    alpha = 1.0 - confidence
    low, high = np.nanquantile(changes, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def time_change(
    check: Threshold,
    base_samples: Sequence[float] | None,
    cur_samples: Sequence[float] | None,
    base_stat: float | None = None,
    cur_stat: float | None = None,
    base_ci: tuple[float, float] | None = None,
    cur_ci: tuple[float, float] | None = None,
    scale: float = 1.0,
    confidence: float = 0.99,
    seed: int = 0,
) -> TimeChange | None:
    """Compare two runs' times; ``scale`` multiplies current times (peak normalisation).

    Uses the raw samples when both runs have at least two; else each run's own CI of the
    median (``time_ci_low_s``/``time_ci_high_s``), combined conservatively; else only the
    point estimate (low = high = change). None when a run has no time at all.
    """
    b = np.asarray([x for x in base_samples or [] if x is not None and x > 0], dtype=float)
    c = np.asarray([x for x in cur_samples or [] if x is not None and x > 0], dtype=float) * scale
    if b.size >= 2 and c.size >= 2:
        bs, cs = float(_stat(b, check.stat)), float(_stat(c, check.stat))
        low, high = bootstrap_interval(b, c, check, confidence, seed=seed)
        return TimeChange(bs, cs, check.change(bs, cs), low, high, "bootstrap")
    bs = float(_stat(b, check.stat)) if b.size else base_stat
    cs = float(_stat(c, check.stat)) if c.size else (None if cur_stat is None else cur_stat * scale)
    if bs is None or cs is None or bs <= 0:
        return None
    change = check.change(bs, cs)
    if base_ci and cur_ci and None not in (*base_ci, *cur_ci):
        low = check.change(base_ci[1], cur_ci[0] * scale)
        high = check.change(base_ci[0], cur_ci[1] * scale)
        return TimeChange(bs, cs, change, min(low, change), max(high, change), "run-ci")
    return TimeChange(bs, cs, change, change, change, "none")


def has_reference(row: dict) -> bool:
    """Whether ``row`` can be compared in normalized time."""
    ref = row.get("ref_kernel_s")
    return isinstance(ref, int | float) and ref > 0


def has_cpu_time(row: dict) -> bool:
    """Whether ``row`` can be compared in CPU time: a CPU time for every wall sample (or, with
    no samples kept, ``cpu_time_median_s``) and the reference kernel's CPU time."""
    ref = row.get("ref_kernel_cpu_s")
    if not (isinstance(ref, int | float) and ref > 0):
        return False
    cpu, wall = row.get("cpu_time_samples_s"), row.get("time_samples_s")
    if cpu or wall:
        return bool(cpu) and bool(wall) and len(cpu) == len(wall)
    median = row.get("cpu_time_median_s")
    return isinstance(median, int | float) and median > 0


def cpu_gated(row: dict) -> bool:
    """Whether ``auto`` compares ``row`` in CPU time: it has one (:func:`has_cpu_time`) and ran
    one thread. With more threads CPU time counts every thread, OpenMP workers spin-waiting at
    a barrier included, so it measures the team's waiting as much as the work; such rows keep
    the wall basis."""
    return row.get("threads") == 1 and has_cpu_time(row)


def pair_basis(opts: CompareOptions, base: dict, cur: dict) -> str:
    """The basis two rows of one point are compared in: ``cpu`` when asked for, or under a
    resolved ``auto`` when both rows are :func:`cpu_gated`; else the wall basis
    ``opts.time_basis`` (``auto`` unresolved: ``absolute``)."""
    if opts.time_basis == "cpu" or (opts.cpu_rows and cpu_gated(base) and cpu_gated(cur)):
        return "cpu"
    return opts.time_basis if opts.time_basis != "auto" else "absolute"


def _per_pass_refs(row: dict, count: int, per_pass: str, overall: str) -> list[float]:
    """The reference time of each of ``count`` passes (``per_pass``; the row's ``overall``
    reference for each when the passes carry none)."""
    refs = row.get(per_pass) or []
    if len(refs) != count or not all(isinstance(r, int | float) and r > 0 for r in refs):
        refs = [row[overall]] * count
    return refs


def row_groups(row: dict, basis: str = "absolute") -> list[np.ndarray]:
    """A row's per-call samples (seconds) cut into passes; ``normalized`` divides each pass by
    its reference-kernel time (the row's ``ref_kernel_s`` when passes carry none); ``cpu``
    takes the samples' CPU times, each pass divided by the reference kernel's CPU time."""
    key = "cpu_time_samples_s" if basis == "cpu" else "time_samples_s"
    raw = [x for x in row.get(key) or [] if x is not None and x > 0]
    groups = pass_stats.split_samples(raw, row.get("pass_samples"))
    if basis == "cpu":
        refs = _per_pass_refs(row, len(groups), "pass_ref_kernel_cpu_s", "ref_kernel_cpu_s")
    elif basis == "normalized":
        refs = _per_pass_refs(row, len(groups), "pass_ref_kernel_s", "ref_kernel_s")
    else:
        return groups
    return [g / r for g, r in zip(groups, refs, strict=True)]


def row_time(row: dict, stat: str = "median", basis: str = "absolute") -> float | None:
    """A row's time statistic: from its raw samples (median over passes of the per-pass
    statistic) when present, else ``time_median_s``; ``normalized``: per reference time;
    ``cpu``: CPU time per reference CPU time."""
    groups = row_groups(row, basis)
    if groups:
        return pass_stats.point_estimate(groups, stat)
    if basis == "cpu":
        return _div(row.get("cpu_time_median_s"), row["ref_kernel_cpu_s"])
    value = row.get("time_median_s")
    if basis == "normalized" and value is not None:
        return value / row["ref_kernel_s"]
    return value


def pass_time_change(
    check: Threshold,
    base: list[np.ndarray],
    cur: list[np.ndarray],
    confidence: float = 0.99,
    seed: int = 0,
    resamples: int = 1000,
) -> TimeChange:
    """The change between two runs' pass-structured samples, with a hierarchical bootstrap
    interval (each run resampled independently: passes, then samples within them)."""
    bs, cs = pass_stats.point_estimate(base, check.stat), pass_stats.point_estimate(cur, check.stat)
    b = pass_stats.hierarchical_bootstrap(base, check.stat, resamples, seed)
    c = pass_stats.hierarchical_bootstrap(cur, check.stat, resamples, seed + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        changes = c / b - 1.0 if check.relative else c - b
    alpha = 1.0 - confidence
    low, high = np.nanquantile(changes, [alpha / 2, 1 - alpha / 2])
    return TimeChange(bs, cs, check.change(bs, cs), float(low), float(high), "passes")


def row_time_change(
    check: Threshold, base: dict, cur: dict, basis: str, scale: float, confidence: float, seed: int
) -> TimeChange | None:
    """Two rows' time change: pass-structured rows by :func:`pass_time_change`, others by
    :func:`time_change`; ``basis`` is ``absolute``, ``normalized`` or ``cpu``."""
    b_groups, c_groups = row_groups(base, basis), row_groups(cur, basis)
    structured = len(b_groups) > 1 or len(c_groups) > 1
    if structured and all(g.size >= 1 for g in b_groups + c_groups) and b_groups and c_groups:
        c_groups = [g * scale for g in c_groups]
        return pass_time_change(check, b_groups, c_groups, confidence, seed)
    if basis in ("normalized", "cpu"):
        ref, samples, median = (("ref_kernel_cpu_s", "cpu_time_samples_s", "cpu_time_median_s")
                                if basis == "cpu" else
                                ("ref_kernel_s", "time_samples_s", "time_median_s"))
        b_ref, c_ref = base[ref], cur[ref]
        return time_change(
            check,
            [x / b_ref for x in base.get(samples) or [] if x],
            [x / c_ref for x in cur.get(samples) or [] if x],
            _div(base.get(median), b_ref),
            _div(cur.get(median), c_ref),
            confidence=confidence,
            seed=seed,
        )
    return time_change(
        check,
        base.get("time_samples_s"),
        cur.get("time_samples_s"),
        base.get("time_median_s"),
        cur.get("time_median_s"),
        (base.get("time_ci_low_s"), base.get("time_ci_high_s")),
        (cur.get("time_ci_low_s"), cur.get("time_ci_high_s")),
        scale=scale,
        confidence=confidence,
        seed=seed,
    )


def _div(value: float | None, by: float) -> float | None:
    return None if value is None else value / by


# --- the verdicts on one point ---------------------------------------------------------------

FAILED_STATUSES = ("error", "oom", "mismatch", "timeout", "skipped")


@dataclass(frozen=True)
class PointPair:
    """One point's row in the baseline run (``base``) and in the current run (``cur``): what
    each verdict on the point reads, and the identity each of its findings carries."""

    point_id: str
    label: str
    base: dict
    cur: dict

    def finding(self, metric: str, level: str, verdict: str, *shown: str,
                suspect: bool = False) -> Finding:
        """A finding on this point; ``shown``: baseline, current and change as shown."""
        return Finding(self.point_id, self.label, metric, level, verdict, *shown,
                       suspect=suspect)


def status_finding(pair: PointPair) -> Finding:
    """ok -> error/oom/mismatch/timeout/skipped fails; a fix or another change is info."""
    b, c = pair.base.get("status") or "ok", pair.cur.get("status") or "ok"
    if b == c:
        return pair.finding("status", "ok", "same", b, c)
    if b == "ok" and c in FAILED_STATUSES:
        reason = str(pair.cur.get("reason") or "")[:80]
        return pair.finding("status", "fail", f"ok -> {c}", b, c, reason)
    return pair.finding("status", "info", "fixed" if c == "ok" else "changed", b, c)


def time_finding(pair: PointPair, opts: CompareOptions, scale: float = 1.0,
                 scatter: float | None = None) -> Finding | None:
    """The time verdict. Hard gate: a regression when the CI's low end is above the threshold.
    Report gate: such a regression fails only when the low end is also above ``time_fail`` and
    log(1 + low) is above ``scatter_k`` times the runs' scatter (see
    :func:`harness.compare.noise.time_scatter`). ``scale`` multiplies current times."""
    check = opts.checks["time"]
    base, cur = pair.base, pair.cur
    basis = pair_basis(opts, base, cur)
    if basis == "cpu":  # the reference kernel's CPU time already cancels machine speed
        scale = 1.0
    seed = int(pair.point_id[:8], 16) if pair.point_id else 0
    tc = row_time_change(check, base, cur, basis, scale, opts.confidence, seed)
    if tc is None:
        return None
    change = f"{check.format_change(tc.change)}"
    if tc.method != "none":
        change += f" [{check.format_change(tc.low)}, {check.format_change(tc.high)}]"
    if basis in ("normalized", "cpu"):  # the absolute (wall) change too, so a slower machine
        # is visible, each named: the gate judged the first one (a row marked slower once
        # showed only "(absolute -33.1%)")
        change = f"{basis} {change}"
        absolute = row_time(cur, check.stat) or 0.0
        reference = row_time(base, check.stat) or 0.0
        wall = "wall" if basis == "cpu" else "absolute"
        if absolute > 0 and reference > 0:
            change += (f"; {wall} {check.format_change(check.change(reference, absolute))}"
                       " (not gated)")
        unit = "x ref CPU" if basis == "cpu" else "x ref"
        shown = (f"{fmt.number(tc.base, 3)} {unit}", f"{fmt.number(tc.cur, 3)} {unit}")
    else:
        shown = (fmt.seconds(tc.base), fmt.seconds(tc.cur))
    shown = (*shown, change)
    if tc.low > check.threshold:
        rel_low = tc.low if check.relative else tc.low / tc.base
        wide = opts.time_fail is not None and tc.low > opts.time_fail
        wide = wide and (scatter is None or math.log1p(rel_low) > opts.scatter_k * scatter)
        hard = opts.time_gate == "hard" or wide
        rule = f"{check.describe()} beyond noise"
        why = "" if hard else _why_not_failed(tc.low > (opts.time_fail or math.inf))
        rel = tc.change if check.relative else tc.change / tc.base
        suspect = not hard and opts.time_fail is not None and rel > opts.time_fail
        return pair.finding("time", "fail" if hard else "warn",
                            f"slower in {basis} time ({rule}){why}", *shown, suspect=suspect)
    if tc.change > check.threshold:
        return pair.finding("time", "info", "slower within noise", *shown)
    if tc.high < -check.threshold:
        return pair.finding("time", "info", "faster", *shown)
    return pair.finding("time", "ok", "same", *shown)


def _why_not_failed(beyond_margin: bool) -> str:
    """Why the report gate warns on a slowdown beyond noise instead of failing it."""
    if beyond_margin:
        return "; within the runs' scatter"
    return "; not wholly above the --time-fail margin"


def memory_finding(pair: PointPair, opts: CompareOptions) -> Finding | None:
    """Peak memory (bytes) above the threshold fails; a different ``mem_method`` warns."""
    base, cur = pair.base, pair.cur
    b, c = base.get("peak_mem_bytes"), cur.get("peak_mem_bytes")
    if b is None or c is None:
        return None
    check = opts.checks["mem"]
    shown = (fmt.mebibytes(b), fmt.mebibytes(c), check.format_change(check.change(b, c)))
    if base.get("mem_method") != cur.get("mem_method"):
        methods = f"method {base.get('mem_method')} -> {cur.get('mem_method')}"
        return pair.finding("mem", "warn", f"not comparable ({methods})", *shown)
    if check.exceeds(b, c):
        more = f"more memory (> {check.describe().removeprefix('peak:')})"
        return pair.finding("mem", "fail", more, *shown)
    if check.exceeds(c, b):
        return pair.finding("mem", "info", "less memory", *shown)
    return pair.finding("mem", "ok", "same", *shown)


def numerics_finding(pair: PointPair, opts: CompareOptions) -> Finding | None:
    """``agree`` going false, or ``max_abs_err`` passing the row's ``tolerance``, fails."""
    base, cur = pair.base, pair.cur
    b_agree, c_agree = base.get("agree"), cur.get("agree")
    b_err, c_err = base.get("max_abs_err"), cur.get("max_abs_err")
    tol = cur.get("tolerance")
    if b_agree is None and c_agree is None and (b_err is None or c_err is None):
        return None
    shown = (fmt.number(b_err, 3), fmt.number(c_err, 3))
    if b_agree is not False and c_agree is False:
        return pair.finding("numerics", "fail", "agree -> false", *shown, f"tolerance {tol}")
    grew = None not in (b_err, c_err) and c_err > opts.numerics_growth * max(b_err, 1e-30)
    if grew and tol is not None and b_err <= tol < c_err:  # tolerance = atol of agreement.py
        beyond = "error beyond tolerance"
        return pair.finding("numerics", "fail", beyond, *shown, f"tolerance {tol}")
    if b_agree is False and c_agree is True:
        return pair.finding("numerics", "info", "agrees again", *shown)
    if grew:
        grown = f"error grew > {fmt.number(opts.numerics_growth)}x"
        return pair.finding("numerics", "info", grown, *shown)
    return pair.finding("numerics", "ok", "same", *shown)


def point_findings(
    pid: str,
    base: dict,
    cur: dict,
    opts: CompareOptions,
    scale: float = 1.0,
    scatter: float | None = None,
) -> list[Finding]:
    """Status, time, memory and numerics findings for one point present in both runs. Time
    and memory are compared only when the point ran in both (``ok``), numerics when it was
    checked in both (``ok`` or ``mismatch``): ok -> skipped is a status regression, not a
    time or memory change against nothing."""
    pair = PointPair(pid, cur["_label"], base, cur)
    statuses = (base.get("status") or "ok", cur.get("status") or "ok")
    found = [status_finding(pair)]
    if statuses == ("ok", "ok"):
        found.append(time_finding(pair, opts, scale, scatter))
        found.append(memory_finding(pair, opts))
    if all(s in ("ok", "mismatch") for s in statuses):
        found.append(numerics_finding(pair, opts))
    return [f for f in found if f is not None]
