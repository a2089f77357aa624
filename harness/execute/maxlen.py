"""``attnbench maxlen IMPL``: the largest sequence length that fits a memory budget.

Two answers, side by side: the *predicted* maximum from the analytic model
(the scenario's ``PointCost.peak_bytes``, the same figure the runner skips points by; a core
without a ``memory_model`` is predicted from its declared memory exponent, calibrated on one
short measured call: :mod:`harness.cost.memory_law`) and
the *verified* maximum: the largest length on the grid of ``--multiple`` whose **measured** peak
(one call in a fresh child process, the device's peak method: CPU allocator events, CUDA
allocator peak) is within the budget. The search starts at the prediction, gallops outward
until it brackets the boundary, then bisects to ``--multiple``; it never goes below the
shortest length the mask fits (:func:`harness.sweep.validate.shortest_length`).

The verdict is the measured peak against the budget, never whether the child survived a cap:
the child's allocation is capped at the budget plus :func:`headroom` (CPU: ``RLIMIT_DATA`` over
its baseline after a warm-up run; CUDA: the allocator's per-process memory fraction) only so
that a length far over the budget fails fast instead of meeting the OOM killer. A cap exactly
at the budget decided by the process's mapped data, which includes allocator slack that varies
from run to run: the same command then answered 8192 once (measured peak 64.09 MiB over a
64 MiB budget) and 8128 the next time. The measured peak counts allocator events on both
devices and repeats to the byte at a given thread count (:data:`METHOD_SLACK`), and the lengths
the search tries depend only on the verdicts, so the same command gives the same answer. The
search assumes a peak that grows with n; where it does not (tile padding), the answer is still
a length whose measured peak is within the budget, the same one each time.

A candidate that runs out of memory under the cap, is killed, or crashes does not fit. One that
exceeds ``--time-limit`` is *unknown*; the search treats it as not fitting and the report says
so, since the verified figure is then a lower bound set by time, not by memory.

The command line (arguments -> :class:`~harness.scenarios.interface.Point`) is
:mod:`harness.cli.maxlen`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from harness import fmt
from harness.errors import CliError
from harness.execute.calibrate_memory import calibrated
from harness.execute.isolate import capped_run_task, run_isolated
from harness.scenarios.interface import Point, cost_of

SEARCH_CAP = 2**34  # no sequence length beyond this is searched (the prediction stops here)


@dataclass
class MaxLenResult:
    """Predicted and verified maximum sequence lengths of one point shape under ``budget``."""

    point: Point
    budget: int
    multiple: int
    predicted: int  # 0 = not even the shortest length fits the model
    verified: int | None = None  # None = not verified (--no-verify)
    first_failing: int | None = None  # smallest length seen not to fit (None = none seen)
    runs: dict[int, dict] = field(default_factory=dict)  # length -> child outcome
    time_limited: bool = False  # a run hit --time-limit: ``verified`` is a lower bound
    budget_text: str = ""  # the budget as given (``64 MiB``); "" = in the unit fmt.size picks
    unit: tuple[str, int] = ("MiB", 2**20)  # the unit peaks are reported in (the budget's)
    shortest: int = 0  # the shortest length searched (the mask's shortest, on the grid)

    def as_dict(self) -> dict:
        return {
            "point": self.point.fields(),
            "budget_bytes": self.budget,
            "budget": self.budget_text or fmt.size(self.budget),
            "shortest_seq_len": self.shortest or self.multiple,
            "multiple": self.multiple,
            "predicted_max_seq_len": self.predicted,
            "mem_prediction": prediction_method(
                replace(self.point, seq_len=self.predicted or self.point.seq_len)
            ),
            "verified_max_seq_len": self.verified,
            "first_failing_seq_len": self.first_failing,
            "time_limited": self.time_limited,
            "runs": {str(n): r for n, r in sorted(self.runs.items())},
        }


def largest_fitting(
    fits: Callable[[int], bool],
    start: int,
    multiple: int,
    cap: int = SEARCH_CAP,
    low: int | None = None,
) -> tuple[int, int | None]:
    """Largest multiple of ``multiple`` n in [``low``, ``cap``] with ``fits(n)``, for a ``fits``
    that is true up to some length and false beyond (``low`` defaults to ``multiple``; it must be
    a multiple). Gallops from ``start`` (steps doubling from ~1/16 of it), then bisects; the
    lengths it tries depend only on ``fits``' answers. Returns (largest fitting length or 0,
    smallest failing or None).
    """
    low = low or multiple
    top = cap // multiple * multiple
    n = min(max(start // multiple * multiple, low), top)
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
            candidate = max(hi - step, low)
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


def predicted_max(point: Point, budget: int, multiple: int, low: int | None = None) -> int:
    """Largest multiple of ``multiple`` (from ``low`` up) whose predicted peak memory is within
    ``budget``."""
    def fits(n: int) -> bool:
        try:
            return predicted_peak(replace(point, seq_len=n)) <= budget
        except Exception as exc:  # a gap in the model: say so at the command line
            raise CliError(f"no memory prediction for {point.label()}: {exc}") from None

    low = low or multiple
    return largest_fitting(fits, low, multiple, low=low)[0]


def predicted_peak(point: Point) -> int:
    """The predicted peak of ``point``, as the runner's budget check predicts it (a declared
    memory law calibrated on a short call on the point's device)."""
    with calibrated(point.device):
        return cost_of(point).peak_bytes


def prediction_method(point: Point) -> str:
    """How :func:`predicted_peak` predicts ``point``'s core workspace (``mem_prediction``)."""
    with calibrated(point.device):
        return cost_of(point).mem_prediction


def find_max_len(
    point: Point,
    budget: int,
    *,
    multiple: int = 64,
    verify: bool = True,
    time_limit_s: float | None = 300.0,
    threads: int | None = None,
    log: Callable[[str], None] | None = None,
    shortest: int | None = None,
    budget_text: str = "",
    unit: tuple[str, int] = ("MiB", 2**20),
) -> MaxLenResult:
    """Predict, then (``verify``) confirm by bisection over isolated runs whose measured peak
    must be within ``budget``; lengths are multiples of ``multiple`` from ``shortest`` (a
    multiple; default ``multiple``) up.

    If a run exceeds ``time_limit_s`` the memory boundary is out of reach in that time: the
    search then climbs by doubling from below (runs cost ~n^2, so the climb costs about as much
    as its last run) and reports the largest length that completed, marked ``time_limited``.
    """
    low = shortest or multiple
    predicted = predicted_max(point, budget, multiple, low)
    result = MaxLenResult(
        point, budget, multiple, predicted, budget_text=budget_text, unit=unit, shortest=low
    )
    if not verify:
        return result

    def attempt(n: int) -> str:
        if n not in result.runs:
            result.runs[n] = _verify_run(
                replace(point, seq_len=n), budget, multiple, time_limit_s, threads
            )
            if log is not None:
                record = result.runs[n]
                reason = record.get("reason")
                log(f"n={n}: {record['status']}" + (f": {reason}" if reason else _ran(record)))
        return result.runs[n]["status"]

    def fits(n: int) -> bool:
        status = attempt(n)
        if status == "timeout":
            raise _TooSlow(n)
        return status == "ok"

    try:
        result.verified, result.first_failing = largest_fitting(
            fits, result.predicted or low, multiple, low=low
        )
    except _TooSlow as slow:
        result.time_limited = True
        done = [n for n, r in result.runs.items() if r["status"] == "ok" and n < slow.n]
        n, failing = max(done, default=0), slow.n
        while (step := max(2 * n, low) // multiple * multiple) < failing:
            if attempt(step) != "ok":
                failing = step
                break
            n = step
        result.verified, result.first_failing = n, failing
    return result


def _ran(record: dict) -> str:
    peak = record.get("peak_bytes")
    return f" in {record.get('seconds', 0):.2f} s" + (f", peak {peak} B" if peak else "")


def headroom(budget: int) -> int:
    """How far over ``budget`` a verification child may allocate before its cap stops it: a
    quarter of the budget plus 64 MiB. The cap counts the process's mapped data (allocator
    slack, arenas, thread stacks), not the tensors the peak counts, so a cap at the budget
    itself would decide near the boundary by that slack; with this headroom a run near the
    boundary finishes and its measured peak decides."""
    return budget // 4 + 64 * 2**20


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
    """One capped child run of ``point``: its outcome record (status, reason, seconds, peak).
    A run that finished with a measured peak over ``budget`` is ``over-budget``: it does not
    fit."""
    warmup = warmup_length(point.seq_len, multiple)
    payload = {"point": point.fields(), "budget": budget + headroom(budget),
               "warmup_len": warmup, "threads": threads}
    outcome = run_isolated(capped_run_task, payload, time_limit_s)
    record = outcome.result or {"status": outcome.status, "reason": outcome.reason}
    record["wall_s"] = round(outcome.seconds, 3)
    peak = record.get("peak_bytes")
    slack = METHOD_SLACK.get(record.get("mem_method", ""), 0)
    if record["status"] == "ok" and peak is not None and peak + slack > budget:
        record["status"] = "over-budget"
        within = f" (+ {slack} B for {record['mem_method']}'s error)" if slack else ""
        record["reason"] = f"measured peak {peak} B{within} > budget {budget} B"
    return record


# What a peak method's reading may fall short of the true peak by. The allocator-event methods
# (CPU torch-profiler, CUDA allocator) are exact and repeat to the byte (5 of 5 repeats of
# `local`, causal window 255, n = 8128 and 8192 on the 2-core CPU: 66682368 and 67206656 B
# each time at 2 threads; 68642304 / 69166592 B at 1 thread, so --threads is part of the
# question); the RSS high-water fallback reads within ~1 MiB of the exact figure, so it must clear
# the budget by that much.
METHOD_SLACK = {"rss-hwm": 2**20}


CPU_FLOPS_GUESS = 5e10  # FLOP/s of one verification call on a CPU (a few cores, fp32)
CHILD_START_S = 3.0  # a fresh child process: interpreter, torch import, warm-up run


def verification_notice(
    point: Point, budget: int, multiple: int, time_limit: float, shortest: int | None = None
) -> str:
    """One line said before verifying: how many isolated runs, at what length, and roughly how
    long (each run is one call of the point at a length near the predicted maximum)."""
    predicted = predicted_max(point, budget, multiple, shortest)
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
    """Human-readable summary: predicted vs verified maximum and why the next length fails;
    the budget as it was given, every peak in its unit."""
    p = result.point

    def size(nbytes: int) -> str:
        name, scale = result.unit
        return f"{nbytes / scale:.3f} {name}" if scale > 1 else fmt.size(nbytes)

    budget = result.budget_text or fmt.size(result.budget)
    if budget != f"{result.budget} B":
        budget += f" ({result.budget} B)"
    lines = [
        f"{p.impl} {p.scenario} B={p.batch} H={p.heads} D={p.head_dim} {p.dtype} "
        f"{_mask_text(p)} on {p.device}, budget {budget}, "
        f"lengths in multiples of {result.multiple}"
        + (f" from {result.shortest}" if result.shortest > result.multiple else "")
    ]
    if result.predicted:
        at = replace(p, seq_len=result.predicted)
        lines.append(
            f"  predicted max seq_len: {result.predicted} (predicted peak "
            f"{size(predicted_peak(at))}; workspace from {prediction_method(at)})"
        )
    else:
        shortest = result.shortest or result.multiple
        lines.append(f"  predicted max seq_len: none (even {shortest} is over budget)")
    if result.verified is None:
        return "\n".join(lines)
    ok = result.runs.get(result.verified, {})
    lines.append(
        f"  verified  max seq_len: {result.verified or 'none'}"
        + (
            f" (ran in {ok.get('seconds', 0):.2f} s, measured peak "
            f"{size(ok.get('peak_bytes') or 0)} = {ok.get('peak_bytes') or 0} B)"
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


def _mask_text(point: Point) -> str:
    """The point's mask in short, documents as their rule (the lengths change with n)."""
    rule = point.masking.documents
    if not isinstance(rule, str):
        return point.mask.describe()
    rest = point.masking.spec.describe()
    return f"documents={rule}" if rest == "dense" else f"{rest},documents={rule}"
