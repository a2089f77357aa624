"""Per-metric verdicts on one point present in both runs: status, time, memory, numerics.

Time is noisy and judged on a confidence interval (:mod:`harness.compare.timechange`); memory
and numerics are deterministic and compared directly. Within-run samples cannot see a burst
of load that covers a whole point (on a busy 2-core machine one point can run 10-100x slower
for its whole budget). For such machines the ``report`` gate fails a time regression only when
it is also above a wide margin and stands out of the run-to-run scatter of all the suite's
points (:func:`harness.compare.noise.time_scatter`); compare's ``--confirm`` additionally asks
it to reproduce in another run (:func:`harness.compare.noise.confirm_failures`).
"""

from __future__ import annotations

import math

from harness import fmt
from harness.compare.findings import Finding
from harness.compare.thresholds import CompareOptions
from harness.compare.timechange import row_time, row_time_change

FAILED_STATUSES = ("error", "oom", "mismatch", "timeout", "skipped")


def status_finding(pid: str, label: str, base: dict, cur: dict) -> Finding:
    """ok -> error/oom/mismatch/timeout/skipped fails; a fix or another change is info."""
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
    log(1 + low) is above ``scatter_k`` times the runs' scatter (see
    :func:`harness.compare.noise.time_scatter`). ``scale`` multiplies current times."""
    check = opts.checks["time"]
    basis = opts.time_basis if opts.time_basis != "auto" else "absolute"
    seed = int(pid[:8], 16) if pid else 0
    tc = row_time_change(check, base, cur, basis, scale, opts.confidence, seed)
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
        shown = (f"{fmt.number(tc.base, 3)} x ref", f"{fmt.number(tc.cur, 3)} x ref")
    else:
        shown = (fmt.seconds(tc.base), fmt.seconds(tc.cur))
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


def memory_finding(
    pid: str, label: str, base: dict, cur: dict, opts: CompareOptions
) -> Finding | None:
    """Peak memory (bytes) above the threshold fails; a different ``mem_method`` warns."""
    b, c = base.get("peak_mem_bytes"), cur.get("peak_mem_bytes")
    if b is None or c is None:
        return None
    check = opts.checks["mem"]
    args = (pid, label, "mem")
    shown = (fmt.mebibytes(b), fmt.mebibytes(c), check.format_change(check.change(b, c)))
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


def numerics_finding(
    pid: str, label: str, base: dict, cur: dict, opts: CompareOptions
) -> Finding | None:
    """``agree`` going false, or ``max_abs_err`` passing the row's ``tolerance``, fails."""
    b_agree, c_agree = base.get("agree"), cur.get("agree")
    b_err, c_err = base.get("max_abs_err"), cur.get("max_abs_err")
    tol = cur.get("tolerance")
    if b_agree is None and c_agree is None and (b_err is None or c_err is None):
        return None
    shown = (fmt.number(b_err, 3), fmt.number(c_err, 3))
    args = (pid, label, "numerics")
    if b_agree is not False and c_agree is False:
        return Finding(*args, "fail", "agree -> false", *shown, f"tolerance {tol}")
    grew = None not in (b_err, c_err) and c_err > opts.numerics_growth * max(b_err, 1e-30)
    if grew and tol is not None and b_err <= tol < c_err:  # tolerance = atol of agreement.py
        return Finding(*args, "fail", "error beyond tolerance", *shown, f"tolerance {tol}")
    if b_agree is False and c_agree is True:
        return Finding(*args, "info", "agrees again", *shown)
    if grew:
        return Finding(*args, "info", f"error grew > {fmt.number(opts.numerics_growth)}x", *shown)
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
    found = [status_finding(pid, label, base, cur)]
    found.append(time_finding(pid, label, base, cur, opts, scale, scatter))
    found.append(memory_finding(pid, label, base, cur, opts))
    found.append(numerics_finding(pid, label, base, cur, opts))
    return [f for f in found if f is not None]
