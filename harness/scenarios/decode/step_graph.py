"""How decode's timed step can be launched: the static step a CUDA graph captures, decode's own
``[measure] decode_graph`` option, and the columns that name the launch.

An eager step of a small-batch decoder is launch-bound on a GPU: ~120 kernels per step for two
layers, each a few microseconds of launch for a few microseconds of work, so the O(n) KV-cache
read that the scenario exists to show hides under a constant. So decode launches its step from
a CUDA graph on CUDA by default. The launch is the one every scenario has
(:mod:`harness.measure.graphs`, ``[measure] cuda_graph``); what is decode's is the step it
hands over to be captured. Capturing needs static buffers: :class:`StaticStep` keeps the token
and its position in device memory, and :meth:`.stack.DecoderStack.static_step` writes the caches
in place at that position with ``index_copy_`` (no Python int that changes per step is baked
into the graph). A graph holds one key count: the timed step repeats position ``seq_len``, so
one capture serves all of its replays. The graph keeps the StaticStep, and with it every buffer
it reads, alive (:class:`harness.measure.graphs.GraphedCall`).

``decode_graph`` (decode suites): ``auto`` follows ``[measure] cuda_graph`` (unset: a CUDA graph
on CUDA, eager on a CPU), ``none`` eager, ``cuda-graph`` a CUDA graph, ``compile``
``torch.compile(mode="reduce-overhead")`` of the static step (inductor's CUDA graph trees). On a
CPU a requested graph falls back to the eager step and the row says ``unavailable: CUDA graphs
need a CUDA device``; a capture or compilation that fails on CUDA falls back the same way, with
the failure as the reason. Rows name the launch twice: ``cuda_graph`` as every row does, and
``decode_graph`` as decode rows always have.
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.measure.graphs import TimedCall
from harness.scenarios.case import GRAPH_MODES, MeasureOption
from harness.scenarios.decode.stack import DecoderStack

DECODE_GRAPH = MeasureOption(
    choices=GRAPH_MODES,
    default="auto",
    doc="how the timed step is launched: auto (as [measure] cuda_graph says; unset: a CUDA "
    "graph on CUDA), none (eager), cuda-graph, compile (torch.compile reduce-overhead)",
)
DEFAULT_LAUNCH = "cuda-graph"  # on CUDA, when neither decode_graph nor cuda_graph asks


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
        address, and what ``compile`` marks static)."""
        caches = [t for c in self.stack.caches for t in c.tensors()]
        tokens = [self.stack.tokens] if self.stack.tokens is not None else []
        return [self.x, self.index, *caches, *tokens]


def launch_columns(launched: TimedCall) -> dict:
    """Decode's names for how its step ran: ``decode_graph`` (the mode) and
    ``decode_graph_reason`` (why a requested mode was not used)."""
    return {"decode_graph": launched.mode, "decode_graph_reason": launched.reason}
