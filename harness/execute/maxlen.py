"""``attnbench maxlen IMPL``: the largest sequence length that fits a memory budget.

Two answers, side by side: the *predicted* maximum from the analytic model
(the scenario's ``PointCost.peak_bytes``, the same figure the runner skips points by) and
the *verified* maximum, found by running the point once per candidate length in a child process
whose memory is capped at the budget (CPU: ``RLIMIT_DATA`` over the child's baseline after a
small warm-up run; CUDA: the allocator's per-process memory fraction). The search starts at the
prediction, gallops outward until it brackets the boundary, then bisects to ``--multiple``.

A candidate that runs out of memory, is killed, or crashes does not fit. One that exceeds
``--time-limit`` is *unknown*; the search treats it as not fitting and the report says so, since
the verified figure is then a lower bound set by time, not by memory.

The command line (arguments -> :class:`~harness.scenarios.interface.Point`) is
:mod:`harness.cli.maxlen`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from harness.errors import CliError
from harness.execute.isolate import capped_run_task, run_isolated
from harness.scenarios.interface import Point, cost_of

SEARCH_CAP = 2**34  # no sequence length beyond this is searched (the prediction stops here)


@dataclass
class MaxLenResult:
    """Predicted and verified maximum sequence lengths of one point shape under ``budget``."""

    point: Point
    budget: int
    multiple: int
    predicted: int  # 0 = not even ``multiple`` fits the model
    verified: int | None = None  # None = not verified (--no-verify)
    first_failing: int | None = None  # smallest length seen not to fit (None = none seen)
    runs: dict[int, dict] = field(default_factory=dict)  # length -> child outcome
    time_limited: bool = False  # a run hit --time-limit: ``verified`` is a lower bound

    def as_dict(self) -> dict:
        return {
            "point": self.point.fields(),
            "budget_bytes": self.budget,
            "multiple": self.multiple,
            "predicted_max_seq_len": self.predicted,
            "verified_max_seq_len": self.verified,
            "first_failing_seq_len": self.first_failing,
            "time_limited": self.time_limited,
            "runs": {str(n): r for n, r in sorted(self.runs.items())},
        }


def largest_fitting(
    fits: Callable[[int], bool], start: int, multiple: int, cap: int = SEARCH_CAP
) -> tuple[int, int | None]:
    """Largest multiple of ``multiple`` n <= ``cap`` with ``fits(n)``, for a ``fits`` that is
    true up to some length and false beyond. Gallops from ``start`` (steps doubling from
    ~1/16 of it), then bisects. Returns (largest fitting length or 0, smallest failing or None).
    """
    top = cap // multiple * multiple
    n = min(max(start // multiple * multiple, multiple), top)
    step = max(n // 16 // multiple * multiple, multiple)
    if fits(n):
        lo, hi = n, None
        while hi is None:
            if lo == top:
                return lo, None
            candidate = min(lo + step, top)
            if fits(candidate):
                lo, step = candidate, step * 2
            else:
                hi = candidate
    else:
        lo, hi = 0, n
        while lo == 0:
            candidate = max(hi - step, multiple)
            if candidate == hi:
                return 0, hi
            if fits(candidate):
                lo = candidate
            else:
                hi, step = candidate, step * 2
    while hi - lo > multiple:
        mid = (lo + hi) // 2 // multiple * multiple
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def predicted_max(point: Point, budget: int, multiple: int) -> int:
    """Largest multiple of ``multiple`` whose predicted peak memory is within ``budget``."""
    def fits(n: int) -> bool:
        try:
            return cost_of(replace(point, seq_len=n)).peak_bytes <= budget
        except Exception as exc:  # a gap in the model: say so at the command line
            raise CliError(f"no memory prediction for {point.label()}: {exc}") from None

    return largest_fitting(fits, multiple, multiple)[0]


def find_max_len(
    point: Point,
    budget: int,
    *,
    multiple: int = 64,
    verify: bool = True,
    time_limit_s: float | None = 300.0,
    threads: int | None = None,
    log: Callable[[str], None] | None = None,
) -> MaxLenResult:
    """Predict, then (``verify``) confirm by bisection over isolated, memory-capped runs.

    If a run exceeds ``time_limit_s`` the memory boundary is out of reach in that time: the
    search then climbs by doubling from below (runs cost ~n^2, so the climb costs about as much
    as its last run) and reports the largest length that completed, marked ``time_limited``.
    """
    result = MaxLenResult(point, budget, multiple, predicted_max(point, budget, multiple))
    if not verify:
        return result

    def attempt(n: int) -> str:
        if n not in result.runs:
            result.runs[n] = _verify_run(
                replace(point, seq_len=n), budget, multiple, time_limit_s, threads
            )
            if log is not None:
                record = result.runs[n]
                log(
                    f"n={n}: {record['status']} "
                    + (record.get("reason") or f"in {record.get('seconds', 0):.2f} s")
                )
        return result.runs[n]["status"]

    def fits(n: int) -> bool:
        status = attempt(n)
        if status == "timeout":
            raise _TooSlow(n)
        return status == "ok"

    try:
        result.verified, result.first_failing = largest_fitting(fits, result.predicted, multiple)
    except _TooSlow as slow:
        result.time_limited = True
        done = [n for n, r in result.runs.items() if r["status"] == "ok" and n < slow.n]
        n, failing = max(done, default=0), slow.n
        while (step := max(2 * n, multiple) // multiple * multiple) < failing:
            if attempt(step) != "ok":
                failing = step
                break
            n = step
        result.verified, result.first_failing = n, failing
    return result


class _TooSlow(Exception):
    def __init__(self, n: int):
        super().__init__(n)
        self.n = n


def warmup_length(n: int, multiple: int) -> int:
    """The uncapped warm-up length of a capped run at ``n``: the smallest multiple of
    ``multiple`` in n's power-of-two bucket ``(2^(k-1), 2^k]``.

    Autotuned kernels tune once per length bucket (the fused Triton kernels key on the
    power-of-two of the length, as is usual). A warm-up in another bucket would leave the
    target's untuned, and the autotuner would then time every config inside the capped,
    measured call (Triton's benchmarker allocates a 256 MB cache-flush buffer for it)."""
    bucket = 1 << max(n - 1, 0).bit_length()
    first = bucket // 2 + 1
    return min(n, max(multiple, -(-first // multiple) * multiple))


def _verify_run(
    point: Point, budget: int, multiple: int, time_limit_s: float | None, threads: int | None
) -> dict:
    """One capped child run of ``point``: its outcome record (status, reason, seconds, peak)."""
    warmup = warmup_length(point.seq_len, multiple)
    payload = {"point": point.fields(), "budget": budget, "warmup_len": warmup,
               "threads": threads}
    outcome = run_isolated(capped_run_task, payload, time_limit_s)
    record = outcome.result or {"status": outcome.status, "reason": outcome.reason}
    record["wall_s"] = round(outcome.seconds, 3)
    return record


CPU_FLOPS_GUESS = 5e10  # FLOP/s of one verification call on a CPU (a few cores, fp32)
CHILD_START_S = 3.0  # a fresh child process: interpreter, torch import, warm-up run


def verification_notice(point: Point, budget: int, multiple: int, time_limit: float) -> str:
    """One line said before verifying: how many isolated runs, at what length, and roughly how
    long (each run is one call of the point at a length near the predicted maximum)."""
    predicted = predicted_max(point, budget, multiple)
    if not predicted:
        return "maxlen: nothing fits the model; verifying from the smallest length"
    runs = max(predicted // multiple, 2).bit_length() + 3  # gallop + bisection, ~log2 steps
    flops = cost_of(replace(point, seq_len=predicted)).useful_flops * (1 + point.backward)
    per_run = CHILD_START_S + (flops / CPU_FLOPS_GUESS if point.device == "cpu" else 1.0)
    total = runs * min(per_run, time_limit)
    slow = " (slow: --no-verify gives the prediction alone)" if total > 60 else ""
    return (
        f"maxlen: predicted max seq_len {predicted}; verifying with ~{runs} isolated runs near it,"
        f" each up to ~{min(per_run, time_limit):.0f} s: ~{total / 60:.1f} min in all{slow}"
    )


def report(result: MaxLenResult) -> str:
    """Human-readable summary: predicted vs verified maximum and why the next length fails."""
    p, gib = result.point, 2**30
    lines = [
        f"{p.impl} {p.scenario} B={p.batch} H={p.heads} D={p.head_dim} {p.dtype} "
        f"{p.mask.describe()} on {p.device}, budget {result.budget / gib:.3f} GiB "
        f"({result.budget} B), lengths in multiples of {result.multiple}"
    ]
    if result.predicted:
        peak = cost_of(replace(p, seq_len=result.predicted)).peak_bytes
        lines.append(
            f"  predicted max seq_len: {result.predicted} (predicted peak {peak / gib:.3f} GiB)"
        )
    else:
        lines.append(f"  predicted max seq_len: none (even {result.multiple} is over budget)")
    if result.verified is None:
        return "\n".join(lines)
    ok = result.runs.get(result.verified, {})
    lines.append(
        f"  verified  max seq_len: {result.verified or 'none'}"
        + (
            f" (ran in {ok.get('seconds', 0):.2f} s, measured peak "
            f"{(ok.get('peak_bytes') or 0) / gib:.3f} GiB)"
            if ok
            else ""
        )
    )
    failing = result.runs.get(result.first_failing or -1)
    if failing:
        lines.append(f"  seq_len {result.first_failing}: {failing['status']}: {failing['reason']}")
    if result.time_limited:
        lines.append("  (runs hit --time-limit: the verified figure is a lower bound set by time)")
        over = [n for n, r in result.runs.items() if r["status"] not in ("ok", "timeout")]
        if over:
            n = min(over)
            lines.append(f"  seq_len {n} did not fit: {result.runs[n]['reason']}")
    lines.append(f"  {len(result.runs)} isolated verification runs")
    return "\n".join(lines)
