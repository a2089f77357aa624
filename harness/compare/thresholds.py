"""Compare's thresholds and options: per-metric checks parsed like pytest-benchmark's
``median:10%`` (``time=median:10%,mem=5%``), and :class:`CompareOptions`, everything a
comparison is asked to do.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from harness import fmt

TIME_STATS = ("median", "mean", "min")
METRICS = ("time", "mem")
BASES = ("auto", "absolute", "normalized")
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
    time_basis: str = "auto"  # auto | absolute | normalized (time / ref_kernel_s)
