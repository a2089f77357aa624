"""Regression rules: threshold checks parsed like pytest-benchmark's ``median:10%`` and the
noise-aware test on raw timing samples.

The time rule (see :func:`time_change`): a point's time regressed only when the *lower* end of a
bootstrap confidence interval on the change of a statistic (by default the ratio of medians,
``median(current) / median(baseline) - 1``) is above the threshold. So the slowdown must exceed
the threshold even at the optimistic end of what the measured noise allows: a real 1.5x
slowdown with a few percent of noise is caught, a 12% jump in a run whose samples spread
over ±20% is not. Memory and numerics are deterministic and compared directly.

Within-run samples cannot see a burst of load that covers a whole point (on a busy 2-core
machine one point can run 10-100x slower for its whole budget). For such machines the
``report`` gate fails a time regression only when it is also above a wide margin and stands
out of the run-to-run scatter of all the suite's points (:func:`time_scatter`); compare's
``--confirm`` additionally asks it to reproduce in another run.

Rows measured in several passes (``pass_samples`` cuts ``time_samples_s`` into passes) are
compared with a hierarchical bootstrap (:mod:`harness.measure.passes`): passes, then samples, are
resampled, so disagreement between a point's passes widens the interval as it should.
The time basis: ``absolute`` (seconds) or ``normalized`` (each pass's samples divided by the
reference kernel's time in that pass, ``ref_kernel_s``), which cancels a machine that is
uniformly slower today; ``auto`` normalizes when every compared row has a reference time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.measure import passes as pass_stats

TIME_STATS = ("median", "mean", "min")
METRICS = ("time", "mem")
_UNITS = {"": 1.0, "b": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6} | {
    f"{prefix}{suffix}": base**power  # kb, mb, gb (decimal); kib, mib, gib (binary)
    for power, prefix in enumerate("kmg", 1)
    for suffix, base in (("b", 1000.0), ("ib", 1024.0))
}
_VALUE = re.compile(r"^(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>%|[a-zA-Z]*)$")


@dataclass(frozen=True)
class Check:
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
        """``+12.3%`` or ``+0.004s`` / ``+1.2 MiB``."""
        if self.relative:
            return "+inf" if math.isinf(change) else f"{change * 100:+.1f}%"
        return f"{change:+.3g}s" if self.metric == "time" else f"{change / 2**20:+.2f} MiB"


DEFAULT_CHECKS: dict[str, Check] = {
    "time": Check("time", "median", 0.10),
    "mem": Check("mem", "peak", 0.05),
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


def parse_check(metric: str, spec: str) -> Check:
    """``time``, ``median:10%`` -> Check; ``mem``, ``5%`` -> Check (stat ``peak``)."""
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
    return Check(metric, stat or "peak", threshold, relative)


def parse_checks(text: str | None, defaults: dict[str, Check] | None = None) -> dict[str, Check]:
    """``time=median:10%,mem=5%`` -> {metric: Check}; unnamed ``median:10%`` means time.

    Metrics not named keep their default.
    """
    checks = dict(DEFAULT_CHECKS if defaults is None else defaults)
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        metric, sep, spec = part.partition("=")
        if not sep:
            metric, spec = "time", part
        checks[metric.strip()] = parse_check(metric.strip(), spec.strip())
    return checks


@dataclass(frozen=True)
class TimeChange:
    """A time comparison: statistics, the change (point estimate) and its confidence interval."""

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
    check: Check,
    confidence: float = 0.99,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of ``check.change(stat(base), stat(cur))``; each run's samples
    are resampled independently. Seeded, so a comparison is reproducible."""
    rng = np.random.default_rng(seed)
    b = _stat(rng.choice(base, size=(resamples, base.size)), check.stat, axis=1)
    c = _stat(rng.choice(cur, size=(resamples, cur.size)), check.stat, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        changes = c / b - 1.0 if check.relative else c - b
    alpha = 1.0 - confidence
    low, high = np.nanquantile(changes, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def time_change(
    check: Check,
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


BASES = ("auto", "absolute", "normalized")


def has_reference(row: dict) -> bool:
    """Whether ``row`` can be compared in normalized time."""
    ref = row.get("ref_kernel_s")
    return isinstance(ref, int | float) and ref > 0


def row_groups(row: dict, basis: str = "absolute") -> list[np.ndarray]:
    """A row's per-call samples cut into passes; ``normalized`` divides each pass by its
    reference-kernel time (the row's ``ref_kernel_s`` when passes carry none)."""
    raw = [x for x in row.get("time_samples_s") or [] if x is not None and x > 0]
    groups = pass_stats.split_samples(raw, row.get("pass_samples"))
    if basis != "normalized":
        return groups
    refs = row.get("pass_ref_kernel_s") or []
    if len(refs) != len(groups) or not all(isinstance(r, int | float) and r > 0 for r in refs):
        refs = [row["ref_kernel_s"]] * len(groups)
    return [g / r for g, r in zip(groups, refs, strict=True)]


def row_time(row: dict, stat: str = "median", basis: str = "absolute") -> float | None:
    """A row's time statistic: from its raw samples (median over passes of the per-pass
    statistic) when present, else ``time_median_s``; ``normalized``: per reference time."""
    groups = row_groups(row, basis)
    if groups:
        return pass_stats.point_estimate(groups, stat)
    value = row.get("time_median_s")
    if basis == "normalized" and value is not None:
        return value / row["ref_kernel_s"]
    return value


def pass_time_change(
    check: Check,
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


def time_scatter(
    pairs: Iterable[tuple[dict, dict]], stat: str = "median", basis: str = "absolute"
) -> float | None:
    """Run-to-run scatter of two runs' times over their common points: the robust standard
    deviation (1.4826 * MAD) of log(current / baseline). None with fewer than 8 points.

    The other points act as controls: a real regression moves some points, a busy machine
    scatters all of them."""
    logs = []
    for base, cur in pairs:
        b, c = row_time(base, stat, basis), row_time(cur, stat, basis)
        if b and c and b > 0 and c > 0:
            logs.append(math.log(c / b))
    if len(logs) < 8:
        return None
    x = np.asarray(logs)
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


# Per-metric verdicts on one matched point -------------------------------------------------

LEVELS = ("fail", "warn", "info", "ok")
FAILED_STATUSES = ("error", "oom", "mismatch", "timeout", "skipped")


@dataclass(frozen=True)
class Finding:
    """One point's verdict on one metric (status, time, mem, numerics or point presence)."""

    point_id: str
    label: str
    metric: str
    level: str
    verdict: str
    baseline: str = ""
    current: str = ""
    change: str = ""


@dataclass(frozen=True)
class CompareOptions:
    """How to compare: per-metric checks, time gate and noise-test settings."""

    checks: dict[str, Check] = field(default_factory=lambda: parse_checks(None))
    normalize_peak: bool = False
    time_gate: str = "hard"  # hard: time regressions fail; report: only beyond time_fail
    time_fail: float | None = 0.5  # report gate: fail when the CI's low end is above this
    confidence: float = 0.99
    scatter_k: float = 3.0  # report gate: fail only beyond k x the runs' time scatter too
    numerics_growth: float = 2.0  # error growth (x) within tolerance reported as info
    time_basis: str = "auto"  # auto | absolute | normalized (time / ref_kernel_s)


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def fmt_bytes(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.2f} MiB"


def _status(pid: str, label: str, base: dict, cur: dict) -> Finding:
    b, c = base.get("status") or "ok", cur.get("status") or "ok"
    args = (pid, label, "status")
    if b == c:
        return Finding(*args, "ok", "same", b, c)
    if b == "ok" and c in FAILED_STATUSES:
        reason = str(cur.get("reason") or "")[:80]
        return Finding(*args, "fail", f"ok -> {c}", b, c, reason)
    return Finding(*args, "info", "fixed" if c == "ok" else "changed", b, c)


def time_finding(
    pid: str,
    label: str,
    base: dict,
    cur: dict,
    opts: CompareOptions,
    scale: float = 1.0,
    scatter: float | None = None,
) -> Finding | None:
    """The time verdict. Hard gate: a regression when the CI's low end is above the threshold.
    Report gate: such a regression fails only when the low end is also above ``time_fail`` and
    log(1 + low) is above ``scatter_k`` times the runs' scatter (see :func:`time_scatter`)."""
    check = opts.checks["time"]
    basis = opts.time_basis if opts.time_basis != "auto" else "absolute"
    seed = int(pid[:8], 16) if pid else 0
    tc = _time_change(check, base, cur, basis, scale, opts.confidence, seed)
    if tc is None:
        return None
    change = f"{check.format_change(tc.change)}"
    if tc.method != "none":
        change += f" [{check.format_change(tc.low)}, {check.format_change(tc.high)}]"
    if basis == "normalized":  # the absolute change too, so a slower machine is visible
        absolute = row_time(cur, check.stat) or 0.0
        reference = row_time(base, check.stat) or 0.0
        if absolute > 0 and reference > 0:
            change += f" (absolute {check.format_change(check.change(reference, absolute))})"
        shown = (f"{tc.base:.3g} x ref", f"{tc.cur:.3g} x ref")
    else:
        shown = (fmt_time(tc.base), fmt_time(tc.cur))
    args = (pid, label, "time", *shown, change)
    if tc.low > check.threshold:
        rel_low = tc.low if check.relative else tc.low / tc.base
        wide = opts.time_fail is not None and tc.low > opts.time_fail
        wide = wide and (scatter is None or math.log1p(rel_low) > opts.scatter_k * scatter)
        hard = opts.time_gate == "hard" or wide
        rule = f"{check.describe()} beyond noise" + (", normalized" if basis != "absolute" else "")
        return Finding(*args[:3], "fail" if hard else "warn", f"slower ({rule})", *args[3:])
    if tc.change > check.threshold:
        return Finding(*args[:3], "info", "slower within noise", *args[3:])
    if tc.high < -check.threshold:
        return Finding(*args[:3], "info", "faster", *args[3:])
    return Finding(*args[:3], "ok", "same", *args[3:])


def _time_change(
    check: Check, base: dict, cur: dict, basis: str, scale: float, confidence: float, seed: int
) -> TimeChange | None:
    """Pass-structured rows: hierarchical bootstrap; otherwise :func:`time_change`."""
    b_groups, c_groups = row_groups(base, basis), row_groups(cur, basis)
    structured = len(b_groups) > 1 or len(c_groups) > 1
    if structured and all(g.size >= 1 for g in b_groups + c_groups) and b_groups and c_groups:
        c_groups = [g * scale for g in c_groups]
        return pass_time_change(check, b_groups, c_groups, confidence, seed)
    if basis == "normalized":
        b_ref, c_ref = base["ref_kernel_s"], cur["ref_kernel_s"]
        return time_change(
            check,
            [x / b_ref for x in base.get("time_samples_s") or [] if x],
            [x / c_ref for x in cur.get("time_samples_s") or [] if x],
            _div(base.get("time_median_s"), b_ref),
            _div(cur.get("time_median_s"), c_ref),
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


def _mem(pid: str, label: str, base: dict, cur: dict, opts: CompareOptions):
    b, c = base.get("peak_mem_bytes"), cur.get("peak_mem_bytes")
    if b is None or c is None:
        return None
    check = opts.checks["mem"]
    args = (pid, label, "mem")
    shown = (fmt_bytes(b), fmt_bytes(c), check.format_change(check.change(b, c)))
    if base.get("mem_method") != cur.get("mem_method"):
        methods = f"method {base.get('mem_method')} -> {cur.get('mem_method')}"
        return Finding(*args, "warn", f"not comparable ({methods})", *shown)
    if check.exceeds(b, c):
        return Finding(
            *args, "fail", f"more memory (> {check.describe().removeprefix('peak:')})", *shown
        )
    if check.exceeds(c, b):
        return Finding(*args, "info", "less memory", *shown)
    return Finding(*args, "ok", "same", *shown)


def _numerics(pid: str, label: str, base: dict, cur: dict, opts: CompareOptions):
    b_agree, c_agree = base.get("agree"), cur.get("agree")
    b_err, c_err = base.get("max_abs_err"), cur.get("max_abs_err")
    tol = cur.get("tolerance")
    if b_agree is None and c_agree is None and (b_err is None or c_err is None):
        return None
    shown = ("-" if b_err is None else f"{b_err:.3g}", "-" if c_err is None else f"{c_err:.3g}")
    args = (pid, label, "numerics")
    if b_agree is not False and c_agree is False:
        return Finding(*args, "fail", "agree -> false", *shown, f"tolerance {tol}")
    grew = None not in (b_err, c_err) and c_err > opts.numerics_growth * max(b_err, 1e-30)
    if grew and tol is not None and b_err <= tol < c_err:  # tolerance = atol of agreement.py
        return Finding(*args, "fail", "error beyond tolerance", *shown, f"tolerance {tol}")
    if b_agree is False and c_agree is True:
        return Finding(*args, "info", "agrees again", *shown)
    if grew:
        return Finding(*args, "info", f"error grew > {opts.numerics_growth:g}x", *shown)
    return Finding(*args, "ok", "same", *shown)


def point_findings(
    pid: str,
    base: dict,
    cur: dict,
    opts: CompareOptions,
    scale: float = 1.0,
    scatter: float | None = None,
) -> list[Finding]:
    """Status, time, memory and numerics findings for one point present in both runs."""
    label = cur["_label"]
    found = [_status(pid, label, base, cur)]
    found.append(time_finding(pid, label, base, cur, opts, scale, scatter))
    found.append(_mem(pid, label, base, cur, opts))
    found.append(_numerics(pid, label, base, cur, opts))
    return [f for f in found if f is not None]
