"""``step = "attention"``: the cached attention of one decode step by itself, as a serving
engine runs it: the cache read and attend of a batch of sequences of different lengths, what
FlashInfer's and vLLM's kernel benchmarks time (no projections, no MLP, no cache write).

A point's ``contexts`` gives the B lengths (:mod:`.ragged`, the step's ``q_per_step`` tokens
included), ``cache`` how they are held: ``paged`` (pages of ``page_size`` in shuffled physical
order, a block table) or ``full`` (contiguous: every sequence padded to the longest). Seeded
N(0, 1) keys/values (Σ lengths, H_kv, D), the sequences end to end, are written into the pool
(the prefill, then the step's append) and seeded queries (B, H, q_per_step, D) attend; the
timed call is the implementation's paged form (:class:`harness.spec.Paged`) on that pool.

The step is launched as a decode step is (``[measure] decode_graph``, else ``cuda_graph``; on
CUDA a CUDA graph by default, captured after warm-up calls, so a path's per-step set-up such as
a block mask or a choice is made before the capture); a path that reads the lengths on the host
(the plain one) cannot be captured and runs eagerly, the row saying why.

The check: against the float64 plain path (:func:`harness.paged.paged_attention`) over each
sequence's keys as drawn, not read through the pool's block table, so a path that reads a wrong
page fails; the same plain path in the point's dtype gives the naive error that scales
the tolerance.

Cost: useful FLOPs 4·H·D per kept (query, key) pair; executed: every score of the q_per_step
queries against the real keys (Σ lengths), or against B·max for a path that pads
(``Paged.padded``). ``step_bytes``: the K/V bytes of the real tokens (no padding: FlashInfer's
definition of bandwidth utilisation) plus the queries read and the outputs written; the bytes a
padded path executes (``executed_bytes``, its roofline's) count B·max slots.
"""

from __future__ import annotations

import time
from functools import cached_property

import torch
from torch import Tensor

from harness import registry
from harness.masks import MaskSpec
from harness.measure import calibrate
from harness.measure.device import Device
from harness.oracle.agreement import output_agreement
from harness.paged import paged_attention
from harness.registry import Implementation
from harness.scenarios.case import Case, CaseOptions
from harness.scenarios.decode import ragged, step_graph
from harness.scenarios.interface import Point, PointCost, check_choice
from harness.spec import Problem, itemsize

STEP_CACHES = ("full", "paged")  # the caches the attention step holds a ragged batch in


def context_lengths(point: Point) -> tuple[int, ...]:
    """The point's B context lengths (:func:`.ragged.lengths`)."""
    s = point.settings
    return ragged.lengths(s.contexts, point.seq_len, point.batch)


def step_call(point: Point) -> Problem:
    """The step as one attention call: q_per_step queries over the longest context, causal
    within the step (one query: every key, the dense mask)."""
    q = point.settings.q_per_step
    mask = MaskSpec(causal=True) if q > 1 else MaskSpec()
    return point.attention_call(q, max(context_lengths(point)), mask)


def reasons(point: Point, impl: Implementation) -> list[str]:
    """Why ``impl`` cannot run the attention step of ``point`` here (empty = it can): no paged
    form; the form's device or availability; the implementation's availability; the pool's
    layout; the page size; the form's (or else the implementation's) capabilities for the
    step's call."""
    if impl.paged is None:
        return [f"{impl.name} has no paged decode form (harness.spec.Paged)"]
    paged, s, device = impl.paged, point.settings, torch.device(point.device).type
    out = paged.reasons(device)
    unavailable = None if out else impl.unavailable_reason(device)
    out += [f"unavailable: {unavailable}"] if unavailable else []
    if out:
        return out
    if s.kv_layout not in paged.layouts:
        return [f"its paged form reads {' or '.join(paged.layouts)} pages, not {s.kv_layout}"]
    page = s.page_size if s.cache == "paged" else max(context_lengths(point))
    if page % paged.page_multiple:
        return [f"page size {page} is not a multiple of {paged.page_multiple}"]
    if paged.max_q_len is not None and s.q_per_step > paged.max_q_len:
        return [f"q_per_step {s.q_per_step} > {paged.max_q_len}, the most its paged form takes"]
    if paged.caps is not None:
        return paged.caps.reasons(step_call(point))
    return impl.not_supported(step_call(point))


class AttentionStepCost(PointCost):
    """The attention of one step over a ragged batch; see the module docstring."""

    @cached_property
    def lengths(self) -> tuple[int, ...]:
        return context_lengths(self.point)

    @cached_property
    def kv_row(self) -> int:
        """Bytes of one token's K and V."""
        p = self.point
        return 2 * (p.kv_heads or p.heads) * p.head_dim * itemsize(p.dtype)

    @property
    def padded(self) -> bool:
        paged = registry.get(self.point.impl).paged
        return bool(paged and paged.padded)

    @cached_property
    def useful_flops(self) -> float:
        p, q = self.point, self.point.settings.q_per_step
        kept = sum(q * n - q * (q - 1) // 2 for n in self.lengths)
        return 4.0 * p.heads * p.head_dim * kept

    @cached_property
    def executed_keys(self) -> int:
        """Keys each query row is scored against, over the batch: Σ lengths, or B·max for a
        path that pads."""
        return self.point.batch * max(self.lengths) if self.padded else sum(self.lengths)

    @cached_property
    def executed_flops(self) -> float:
        p, q = self.point, self.point.settings.q_per_step
        return 4.0 * p.heads * p.head_dim * q * self.executed_keys

    @cached_property
    def query_bytes(self) -> int:
        """The queries read, once (the outputs written are as many)."""
        p = self.point
        return p.batch * p.settings.q_per_step * p.heads * p.head_dim * itemsize(p.dtype)

    @cached_property
    def step_bytes(self) -> int:
        """K/V of the real tokens, the queries read and the outputs written."""
        return self.kv_row * sum(self.lengths) + 2 * self.query_bytes

    @property
    def compulsory_bytes(self) -> float:
        return float(self.step_bytes)

    @cached_property
    def executed_bytes(self) -> float:
        """The K/V slots the call reads (its executed FLOPs' keys: B·max for a path that pads,
        so the padded step's roofline is its own, not that of Σ bytes at B·max FLOPs), the
        queries read and the outputs written."""
        return float(self.kv_row * self.executed_keys + 2 * self.query_bytes)

    @cached_property
    def pages(self) -> int:
        """Pages the pool holds: Σ ⌈lᵢ / page_size⌉ (paged), B (contiguous)."""
        s = self.point.settings
        return (
            ragged.pages_of(self.lengths, s.page_size) if s.cache == "paged" else len(self.lengths)
        )

    @cached_property
    def cache_bytes(self) -> int:
        """The pool: pages · page_size tokens (paged), B · max (contiguous)."""
        if self.point.settings.cache == "paged":
            return self.pages * self.point.settings.page_size * self.kv_row
        return self.padded_cache_bytes

    @cached_property
    def padded_cache_bytes(self) -> int:
        """The padded contiguous alternative: B · max slots."""
        return len(self.lengths) * max(self.lengths) * self.kv_row

    @cached_property
    def call_bytes(self) -> int:
        """Scores (three tensors at once) and gathered K/V: of the whole padded batch for a
        path that pads, of the longest sequence for one that goes sequence by sequence. A
        contiguous cache is read in place (:mod:`harness.paged`): no gathered K/V."""
        p, q = self.point, self.point.settings.q_per_step
        rows = p.batch if self.padded else 1
        gathered = self.kv_row if self.point.settings.cache == "paged" else 0
        per_key = gathered + 3 * p.heads * q * itemsize(p.dtype)
        return rows * max(self.lengths) * per_key

    @cached_property
    def peak_bytes(self) -> int:
        """The pool, the keys it was filled from (Σ lengths), a float64 copy of the longest
        sequence's for the check and the call's workspace."""
        drawn = sum(self.lengths) * self.kv_row
        longest = max(self.lengths) * self.kv_row * 8 // itemsize(self.point.dtype)
        return self.cache_bytes + drawn + longest + self.call_bytes

    def columns(self) -> dict:
        """The ragged batch's row columns (results/README.md)."""
        lens = self.lengths
        padded = len(lens) * max(lens)
        return {
            "context_lengths": list(lens),
            "context_tokens": sum(lens),
            "context_max": max(lens),
            "padded_tokens": padded,
            "padding_waste": 1 - sum(lens) / padded,
            "padding_factor": padded / sum(lens),
            "pages": self.pages,
            "step_bytes": self.step_bytes,
            "step_keys": max(lens) if self.padded else sum(lens),
            "cache_bytes_analytic": self.cache_bytes,
            "padded_cache_bytes": self.padded_cache_bytes,
        }


def make_inputs(point: Point) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded q (B, H, q_per_step, D) and keys/values packed end to end (Σ lengths, H_kv, D)."""
    gen = torch.Generator(device=point.device).manual_seed(point.seed + 1)
    b, d, total = point.batch, point.head_dim, sum(context_lengths(point))
    kv = (total, point.kv_heads or point.heads, d)
    opts = {"generator": gen, "device": point.device, "dtype": point.torch_dtype}
    q = torch.randn(b, point.heads, point.settings.q_per_step, d, **opts)
    return q, torch.randn(kv, **opts), torch.randn(kv, **opts)


def reference(q: Tensor, keys: Tensor, values: Tensor, lens: tuple[int, ...]) -> Tensor:
    """The plain path sequence by sequence over its keys as drawn (packed (Σ lens, H_kv, D)),
    each held as one page, in the inputs' dtype: float64 inputs make it the reference, one
    sequence in float64 at a time."""
    out, starts = torch.empty_like(q), ragged.offsets(lens)
    one = torch.zeros(1, 1, dtype=torch.int32, device=q.device)
    for b, n in enumerate(lens):
        k, v = (x[starts[b] : starts[b] + n].unsqueeze(0).to(q.dtype) for x in (keys, values))
        lens_b = torch.tensor([n], dtype=torch.int32, device=q.device)
        out[b : b + 1] = paged_attention(q[b : b + 1], k, v, one, lens_b)
    return out


def build_attention_case(point: Point, device: Device, options: CaseOptions,
                         impl: Implementation) -> Case:  # fmt: skip
    """Fill the pool (untimed), then time the implementation's paged form on it."""
    why = reasons(point, impl)
    if why:
        raise ValueError("decode: " + "; ".join(why))
    s, lens = point.settings, context_lengths(point)
    q, keys, values = make_inputs(point)
    def fill() -> ragged.KVPool:  # the prefill and the step's append, as the point holds them
        return ragged.fill_pool(keys, values, lens, s.q_per_step, s.cache == "paged",
                                s.page_size, point.seed, s.kv_layout)  # fmt: skip

    pool = fill()
    fn = impl.paged.fn

    def run() -> Tensor:
        with torch.no_grad():
            return fn(q, pool.k, pool.v, pool.block_table, pool.context_lens)

    def check() -> dict:
        if check_choice(point, options.check).extent == "none":
            return {"agree": None}
        out = case.run()
        with torch.no_grad():
            ref = reference(q.double(), keys, values, lens)
            # float64 points: the naive error would be the reference's own (zero): fixed rule
            naive = None if q.dtype == torch.float64 else reference(q, keys, values, lens)
        return {**output_agreement(out, ref, point.torch_dtype, naive), "check": "float64"}

    cost = AttentionStepCost(point)

    def extra(measurement, timer) -> dict:
        device.synchronize()
        start = time.perf_counter()
        fill()
        device.synchronize()
        out = {
            "prefill_s": time.perf_counter() - start,
            "cache_bytes": sum(t.untyped_storage().nbytes() for t in pool.tensors()),
        }
        if measurement is not None:
            bandwidth, source = calibrate.bandwidth_for(device)
            out |= {
                "bw_fraction": cost.step_bytes / measurement.median / bandwidth,
                "bw_source": source,
            }
        return out

    case = Case(
        run=run,
        tokens=point.batch * s.q_per_step,
        check=check,
        extra=extra,
        columns={"check": "none", **cost.columns()},
        graph=options.options.get("decode_graph", step_graph.DECODE_GRAPH.default),
        graph_default=step_graph.DEFAULT_LAUNCH,
        launch_columns=step_graph.launch_columns,
    )
    return case
