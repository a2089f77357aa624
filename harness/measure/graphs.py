"""How a timed call is launched: eagerly, replayed from a CUDA graph, or compiled with
``torch.compile(mode="reduce-overhead")`` (inductor's CUDA graph trees). One mechanism for
every scenario (``[measure] cuda_graph = true``, and decode's ``decode_graph``), as
tritonbench's ``--cudagraph`` and ``triton.testing.do_bench_cudagraph`` capture the call
they time.

A call that issues many small kernels is launch-bound on a GPU: each launch costs the host a
few microseconds, so the time measures Python rather than the kernels. A graph launches the
whole call at once. Capturing needs a call on static buffers, with no host synchronization and
no tensor created from a Python value per call: the scenarios build their inputs once, outside
the timed call, so the timed closure is such a call (decode hands over its static step, which
keeps the position in a device tensor).

A graph holds raw device addresses, not Python references: every buffer it reads or writes
must outlive it, or the caching allocator hands that memory to the next tensor and a replay
reads whatever lies there (the 2026-11-26 H100 crash: decode's position tensor was freed once
its launch returned, reused, and ``index_copy_`` read a garbage index). So a
:class:`GraphedCall` keeps the captured callable, and with it everything the callable holds
(a closure's tensors, a static step's buffers), for as long as the graph exists.

After capture the graph's static output is poisoned (NaN), the graph replayed and its output
compared once with an eager call of the same callable: a replay that does not write its output
(an empty graph: the call's kernels went to another stream than the capture's, so they ran
once, eagerly, and were not recorded) or computes something else is caught there. A capture
that fails, or a replay that differs, falls back to the eager call with the reason, which the
row states. On a CPU there are no CUDA graphs (:data:`NO_CUDA`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.errors import first_line

MODES = ("none", "cuda-graph", "compile")  # eager, a captured CUDA graph, torch.compile
NO_CUDA = "unavailable: CUDA graphs need a CUDA device"
WARMUP_CALLS = 3  # before capture: compilation, autotuning and allocator pools settle
# A replay may differ from an eager call by reduction order (atomics): a few units in the last
# place of the output's largest value. Beyond this many it computes something else.
REPLAY_ULPS = 16


@dataclass(frozen=True)
class TimedCall:
    """The timed call and how it is launched: ``mode`` the one used (a :data:`MODES` word),
    ``reason`` why a requested mode was not (None when it was, or when none was asked)."""

    run: Callable[[], object]
    mode: str
    reason: str | None = None


class GraphedCall:
    """``call`` captured in a ``torch.cuda.CUDAGraph``; calling it replays the graph and returns
    the static output, overwritten by the next replay. Keeps ``call`` (and so every buffer the
    graph reads) alive as long as itself."""

    def __init__(self, call: Callable[[], object]):
        self.call = call
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
            for _ in range(WARMUP_CALLS):
                call()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = call()

    def __call__(self) -> object:
        self.graph.replay()
        return self.out


def reduce_overhead(call: Callable[[], object]) -> tuple[Callable[[], object], str | None]:
    """``torch.compile(mode="reduce-overhead")`` of ``call``: inductor's kernels, replayed from
    its CUDA graph trees; plus a reason when inductor compiled it but declined to graph it.
    A callable with ``buffers()`` (tensors written in place) has them marked static, so those
    writes do not make inductor decline."""
    for tensor in getattr(call, "buffers", list)():
        torch._dynamo.mark_static_address(tensor)
    # dynamo traces functions and bound methods; an object is traced through its __call__
    target = call if inspect.isfunction(call) or inspect.ismethod(call) else call.__call__
    compiled = torch.compile(target, mode="reduce-overhead", dynamic=False)
    before = _cudagraph_skips()
    for _ in range(WARMUP_CALLS):  # inductor records its graph on the second or third call
        compiled()
    if _cudagraph_skips() > before:
        return compiled, "compiled, but inductor skipped CUDA graphs (TORCH_LOGS=perf_hints)"
    return compiled, None


def _cudagraph_skips() -> int:
    return int(torch._dynamo.utils.counters["inductor"]["cudagraph_skips"])


def launch(
    eager: Callable[[], object],
    mode: str,
    reason: str | None = None,
    capturable: Callable[[], Callable[[], object]] | None = None,
) -> TimedCall:
    """``eager`` launched as ``mode`` (a :data:`MODES` word, already resolved for the device),
    or ``eager`` itself with the reason when that fails or the replay differs from an eager
    call. ``capturable()`` makes the form of the call a graph captures (static buffers; None:
    ``eager`` itself); ``reason``: why the mode differs from what was asked (kept when ``mode``
    is ``none``)."""
    if mode not in MODES:
        raise ValueError(f"launch mode must be one of {MODES}, got {mode!r}")
    if mode == "none":
        return TimedCall(eager, "none", reason)
    try:
        call = capturable() if capturable is not None else eager
        run, note = (GraphedCall(call), None) if mode == "cuda-graph" else reduce_overhead(call)
        if isinstance(run, GraphedCall):
            poison(run.out)  # a replay must write every element of its output again
        differs = replay_difference(run(), call())
    except Exception as exc:  # a call that syncs with the host cannot be captured: say so
        return TimedCall(eager, "none", f"{mode} failed: {first_line(exc)}"[:300])
    if differs is not None:
        return TimedCall(eager, "none", f"{mode} replay differs from the eager call: {differs}")
    return TimedCall(run, mode, note)


def poison(out: object) -> None:
    """Fill every floating-point tensor of ``out`` (a tensor, or a tuple/list of them) with
    NaN, in place."""
    if isinstance(out, tuple | list):
        for item in out:
            poison(item)
    elif isinstance(out, torch.Tensor) and out.is_floating_point():
        out.fill_(float("nan"))


def replay_difference(replayed: object, eager: object) -> str | None:
    """None when a replay's output (a tensor, or a tuple/list of them) equals the eager call's
    within :data:`REPLAY_ULPS` units in the last place of its largest value; else what
    differs."""
    if isinstance(eager, tuple | list):
        if not isinstance(replayed, tuple | list) or len(replayed) != len(eager):
            return "a different number of outputs"
        found = (replay_difference(r, e) for r, e in zip(replayed, eager, strict=True))
        return next((d for d in found if d is not None), None)
    if not isinstance(eager, torch.Tensor) or not eager.is_floating_point():
        return None
    if eager.numel() and not bool(torch.isfinite(eager).all()):
        return None  # NaN/inf: the runner's own finiteness check names that, graph or not
    if not isinstance(replayed, torch.Tensor) or replayed.shape != eager.shape:
        return "a different output shape"
    if replayed.numel() and not bool(torch.isfinite(replayed).all()):
        return ("the replay left its output unwritten (the graph is empty: the call's kernels "
                "ran outside the capture stream)")
    diff = float((replayed.double() - eager.double()).abs().max()) if eager.numel() else 0.0
    scale = float(eager.double().abs().max()) if eager.numel() else 0.0
    bound = REPLAY_ULPS * torch.finfo(eager.dtype).eps * scale
    return None if diff <= bound else f"max |difference| {diff:.3g} > {bound:.3g}"
