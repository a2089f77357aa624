"""How the timed decode step is launched: eagerly, replayed from a CUDA graph, or compiled with
``torch.compile(mode="reduce-overhead")`` (inductor's CUDA graphs).

An eager step of a small-batch decoder is launch-bound on a GPU: ~120 kernels per step for two
layers, each a few microseconds of launch for a few microseconds of work, so the O(n) KV-cache
read that the scenario exists to show hides under a constant. A CUDA graph launches the whole
step at once. Capturing needs static buffers: :class:`StaticStep` keeps the token and its
position in device memory, and :meth:`.stack.DecoderStack.static_step` writes the caches in place
at that position with ``index_copy_`` (no Python int that changes per step is baked into the
graph). A graph holds one key count: the timed step repeats position ``seq_len``, so one
capture serves all of its replays.

On a CPU there are no CUDA graphs: a requested graph mode falls back to the eager step and the
row says ``unavailable: CUDA graphs need a CUDA device``. A capture or compilation that fails on
CUDA falls back the same way, with the failure as the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from harness.errors import first_line
from harness.scenarios.case import GRAPH_MODES
from harness.scenarios.decode.stack import DecoderStack

NO_CUDA = "unavailable: CUDA graphs need a CUDA device"
WARMUP_STEPS = 3  # before capture: compilation, autotuning and allocator pools settle


@dataclass(frozen=True)
class StepLaunch:
    """The timed step and how it is launched: ``mode`` is the one used (a row's
    ``decode_graph``), ``reason`` why a requested mode was not (``decode_graph_reason``)."""

    run: Callable[[], Tensor]
    mode: str
    reason: str | None = None


class StaticStep:
    """One decode step at a fixed position on static buffers: x (B, 1, d) and the position (1,)
    long live on the device; calling it runs :meth:`DecoderStack.static_step` -> (B, 1, d)."""

    def __init__(self, stack: DecoderStack, x: Tensor, pos: int):
        self.stack = stack
        self.x = x.clone()
        self.index = torch.tensor([pos], device=x.device)
        self.n_keys = stack.step_keys(pos)

    def __call__(self) -> Tensor:
        with torch.no_grad():
            return self.stack.static_step(self.x, self.index, self.n_keys)

    def buffers(self) -> list[Tensor]:
        """Every tensor the step reads or writes in place (what a graph must keep at one
        address)."""
        caches = [t for c in self.stack.caches for t in c.tensors()]
        tokens = [self.stack.tokens] if self.stack.tokens is not None else []
        return [self.x, self.index, *caches, *tokens]


def resolve_mode(requested: str, device_kind: str) -> tuple[str, str | None]:
    """(mode to try, reason it differs from the request). ``auto``: CUDA graph on CUDA, eager
    on CPU (no reason: eager is the CPU's only mode)."""
    if requested not in GRAPH_MODES:
        raise ValueError(f"decode_graph must be one of {GRAPH_MODES}, got {requested!r}")
    if requested == "auto":
        return ("cuda-graph" if device_kind == "cuda" else "none"), None
    if requested != "none" and device_kind != "cuda":
        return "none", NO_CUDA
    return requested, None


def launch(
    stack: DecoderStack, x: Tensor, pos: int, requested: str, device_kind: str
) -> StepLaunch:
    """The timed step at ``pos`` for token x (B, 1, d) in the requested mode, or the eager step
    with the reason when that mode is unavailable or fails here."""
    mode, reason = resolve_mode(requested, device_kind)

    def eager() -> Tensor:
        with torch.no_grad():
            return stack.step(x, pos)

    if mode == "none":
        return StepLaunch(eager, "none", reason)
    step = StaticStep(stack, x, pos)
    try:
        run, note = (cuda_graph(step), None) if mode == "cuda-graph" else reduce_overhead(step)
    except Exception as exc:  # a core that syncs with the host cannot be captured: say so
        return StepLaunch(eager, "none", f"{mode} failed: {first_line(exc)}"[:300])
    return StepLaunch(run, mode, note)


class GraphedStep:
    """``step`` captured in a ``torch.cuda.CUDAGraph``; calling it replays the graph and returns
    the static output (B, 1, d), overwritten by the next replay.

    A graph holds raw device addresses, not Python references: every buffer it reads or writes
    must outlive it, or the caching allocator hands that memory to the next tensor and a replay
    reads whatever lies there (the 2026-11-26 H100 crash: the position tensor was freed once
    ``launch`` returned, reused, and ``index_copy_`` got a garbage index). So this object keeps
    the :class:`StaticStep`, and with it x, the position and the caches, for as long as the
    graph exists.
    """

    def __init__(self, step: StaticStep):
        self.step = step
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
            for _ in range(WARMUP_STEPS):
                step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = step()

    def __call__(self) -> Tensor:
        self.graph.replay()
        return self.out


def cuda_graph(step: StaticStep) -> Callable[[], Tensor]:
    """The replay of ``step`` captured in a CUDA graph (:class:`GraphedStep`)."""
    return GraphedStep(step)


def reduce_overhead(step: StaticStep) -> tuple[Callable[[], Tensor], str | None]:
    """``torch.compile(mode="reduce-overhead")`` of the static step: inductor's kernels, replayed
    from its CUDA graph trees; plus a reason when inductor compiled the step but declined to
    graph it. The buffers are marked static so the in-place cache writes do not cause that."""
    for tensor in step.buffers():
        torch._dynamo.mark_static_address(tensor)
    compiled = torch.compile(step.__call__, mode="reduce-overhead", dynamic=False)
    before = _cudagraph_skips()
    for _ in range(WARMUP_STEPS):  # inductor records its graph on the second or third call
        compiled()
    if _cudagraph_skips() > before:
        return compiled, "compiled, but inductor skipped CUDA graphs (TORCH_LOGS=perf_hints)"
    return compiled, None


def _cudagraph_skips() -> int:
    return int(torch._dynamo.utils.counters["inductor"]["cudagraph_skips"])
