"""The ``decode`` scenario: prefill a context of ``seq_len`` tokens through ``layers`` causal
blocks, then time one generated token's step.

The timed call feeds the next token embedding at position ``seq_len`` and runs every layer:
``full``: one query against ``seq_len + 1`` cached keys (O(n)); ``rolling``: against at most
``window`` keys (O(w)); ``none``: the whole prefix again (O(n²)); ``state``: the core's recurrent
state advanced by one token (O(1); cores with a ``recurrence``: ``linear``, ``performer``).
An approximate core is checked against its own float64 definition
(:mod:`harness.oracle.definition`). The step writes at a fixed
position rather than advancing a pointer, so the many timed calls redo the same step and the
cache never grows; caches are pre-sized for ``seq_len + gen_tokens`` positions, which the
agreement check walks through ``gen_tokens`` steps deep on a second, fresh set of caches.

Inputs are seeded N(0, 1) token embeddings (B, seq_len + gen_tokens, d_model); outputs are the
last block's hidden states (no final norm or vocabulary head: they are the same for every cache).

The timed step is launched as every scenario's timed call is (``[measure] cuda_graph``), with
decode's own ``[measure] decode_graph`` and its static step (:mod:`.step_graph`): by default a
CUDA graph on CUDA, eager on CPU. Rows name the mode used (``decode_graph``, as ``cuda_graph``)
and why a requested one was not (``decode_graph_reason``), the bytes a step must move
(``step_bytes``: weights, the K/V it reads, the K/V it writes) and the fraction of the measured
memory bandwidth that reached (``bw_fraction``).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from harness.masks import MaskSpec
from harness.measure import calibrate
from harness.measure.device import Device
from harness.measure.graphs import TimedCall
from harness.model import FFNS, NORMS, POSITIONS
from harness.model.transformer import BlockConfig, build_block
from harness.oracle.agreement import output_agreement, tolerance
from harness.oracle.definition import Definition
from harness.registry import Implementation
from harness.scenarios.case import Case, CaseOptions, CheckChoice, MeasureOption
from harness.scenarios.decode import attention_step, ragged, step_graph
from harness.scenarios.decode.caches import CACHES, cache_nbytes
from harness.scenarios.decode.decode_cost import (
    DecodeCost,
    prefill_problem,
    sequence_problem,
    step_problem,
    stepwise,
)
from harness.scenarios.decode.stack import DecoderStack
from harness.scenarios.interface import Point, Scenario, SettingsError, check_choice, register
from harness.spec import Problem, RecurrentState

MODEL_MASK_FEATURES = frozenset({"causal", "window"})
# a mask feature -> the suite key that sets it (for the suite error naming it)
MASK_KEYS = {"documents": "documents", "prefix": "prefix_len", "global": "global_tokens",
             "global_positions": "global_tokens", "block_sparse": "block_size",
             "dilation": "dilation"}  # fmt: skip
STEPS = ("block", "attention")  # the whole block step, or its cached attention alone


@dataclass(frozen=True)
class DecodeSettings:
    """The decoder: the block's layout, its depth, its cache kind and the tokens the check
    generates."""

    norm: str = field(default="pre", metadata={"choices": NORMS})
    ffn: str = field(default="gelu", metadata={"choices": FFNS})
    pos: str = field(default="rope", metadata={"choices": POSITIONS})
    layers: int = field(default=2, metadata={"minimum": 1})
    cache: str = field(default="full", metadata={"choices": (*CACHES, "paged")})
    gen_tokens: int = field(default=8, metadata={"minimum": 1})
    # the serving form (attention_step, ragged): what is timed, the batch's lengths, how they
    # are held and the tokens each sequence adds per step
    step: str = field(default="block", metadata={"choices": STEPS})
    contexts: str = "uniform"
    page_size: int = field(default=16, metadata={"minimum": 1})
    q_per_step: int = field(default=1, metadata={"minimum": 1})
    kv_layout: str = field(default="NHD", metadata={"choices": ragged.LAYOUTS})


class CoreAttend:
    """The registry core, prepared once per (n_q, n_k, mask) outside the timed step."""

    def __init__(self, impl: Implementation, point: Point):
        self.impl, self.point = impl, point
        self._prepared: dict[tuple, object] = {}

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec) -> Tensor:
        key = (q.shape[2], k.shape[2], mask)
        fn = self._prepared.get(key)
        if fn is None:
            fn = self._prepared[key] = self.impl.prepare(self.point.attention_call(*key))
        return fn(q, k, v)

    def new_state(self) -> RecurrentState:
        """An empty recurrent state of the core for one layer (``cache = "state"``)."""
        return self.impl.new_state(self.point.attention_call(1, 1, self.point.mask))


def make_stack(point: Point, impl: Implementation) -> DecoderStack:
    """Seeded blocks (layer i from seed + i) with ``impl`` as the core and the point's cache."""
    # every layer's block: causal, long enough for the generated tokens
    cfg = BlockConfig.of(point, causal=True, max_len=point.seq_len + point.settings.gen_tokens)
    blocks = [
        build_block(cfg, point.seed + i, point.device, point.torch_dtype).eval()
        for i in range(point.settings.layers)
    ]
    return DecoderStack(
        blocks,
        CoreAttend(impl, point),
        point.mask,
        point.settings.cache,
        point.batch,
        point.seq_len + point.settings.gen_tokens,
        stepwise(point, impl),
    )


def make_tokens(point: Point) -> Tensor:
    """Seeded embeddings of the context and the tokens to generate: (B, n + gen_tokens, d)."""
    gen = torch.Generator(device=point.device).manual_seed(point.seed + 1)
    shape = (point.batch, point.seq_len + point.settings.gen_tokens, point.d_model)
    return torch.randn(shape, generator=gen, device=point.device, dtype=point.torch_dtype)


@register
class Decode(Scenario):
    """One generated token's step; see the module docstring."""

    serves: ClassVar[dict[str, bool]] = {"decode": False}
    settings = DecodeSettings
    measure_options: ClassVar[dict[str, MeasureOption]] = {
        "decode_graph": step_graph.DECODE_GRAPH
    }

    def point_errors(self, point: Point) -> list[SettingsError]:
        out = []
        extra = sorted(point.mask.features - MODEL_MASK_FEATURES)
        if extra:  # a suite error, seen by --dry-run: no decode point can take such a mask
            key = MASK_KEYS.get(extra[0], extra[0])
            problem = f"decode supports causal (sliding-window) models, not {extra}"
            out.append(SettingsError(key, point.masking.columns(True).get(key), problem))
        s = point.settings
        if point.q_len is not None:
            problem = "q_len applies to attention scenarios only"
            out.append(SettingsError("q_len", point.q_len, problem))
        for problem in ragged.problems(s.contexts, point.seq_len, point.batch, s.q_per_step):
            out.append(SettingsError("contexts", s.contexts, problem))
        if s.step == "attention":
            if s.cache not in attention_step.STEP_CACHES:
                problem = f'step = "attention" holds the batch in {attention_step.STEP_CACHES}'
                out.append(SettingsError("cache", s.cache, problem))
            return out
        serving = {
            "cache": s.cache == "paged",
            "contexts": s.contexts != "uniform",
            "q_per_step": s.q_per_step != 1,
            "kv_layout": s.kv_layout != "NHD",
        }
        for key, set_ in serving.items():
            if set_:
                problem = (
                    f'{key} = {getattr(s, key)!r} needs step = "attention" (the '
                    "whole-block step runs uniform contexts, one token, contiguous caches)"
                )
                out.append(SettingsError(key, getattr(s, key), problem))
        if out:
            return out
        if CACHES[point.settings.cache].recurrent:
            core = self.core(point)
            if core is not None and core.recurrence is None:
                problem = (
                    f"{point.impl} has no recurrent state (cache = \"state\" needs an "
                    "implementation that declares a recurrence, e.g. linear or performer)"
                )
                out.append(SettingsError("cache", point.settings.cache, problem))
        return out

    def problem(self, point: Point) -> Problem:
        if point.settings.step == "attention":
            return attention_step.step_call(point)
        return step_problem(point)

    def cost(self, point: Point) -> DecodeCost | attention_step.AttentionStepCost:
        if point.settings.step == "attention":
            return attention_step.AttentionStepCost(point)
        return DecodeCost(point)

    def planned_columns(self, point: Point) -> dict:
        """The attention step's ragged-batch columns (``context_tokens``, ``padded_tokens``,
        ``pages``, ...): the lengths are drawn from the point's settings alone."""
        if point.settings.step == "attention":
            return attention_step.AttentionStepCost(point).columns()
        return {}

    def support(self, point: Point) -> list[str]:
        """The model's rules (causal, a window at most, what the cache kind needs), then the
        core's reasons for the step and, unless the cache fills by steps, the prefill."""
        out = []
        if not point.mask.causal:
            out.append("decode is causal: set causal = true")
        extra = point.mask.features - MODEL_MASK_FEATURES
        if point.settings.step == "attention":
            if extra | {"causal"} != {"causal"} or point.mask.left is not None:
                out.append("the attention step runs plain causal models (no window)")
            return out or attention_step.reasons(point, self.core(point))
        if extra:
            out.append(f"decode supports causal (sliding-window) models, not {sorted(extra)}")
        out += CACHES[point.settings.cache].reasons(point.mask)
        if out:
            return out
        step, prefill = self.core(point).not_supported_each(
            [step_problem(point), prefill_problem(point)]
        )
        if CACHES[point.settings.cache].fills_by_steps and prefill:
            return step  # the cache fills token by token: the prefill is steps too
        return step + [r for r in prefill if r not in step]

    def build_case(self, point: Point, device: Device, options: CaseOptions) -> Case:
        """Prefill once (untimed), then time the step at position seq_len; the runner launches
        it as ``decode_graph`` (else ``[measure] cuda_graph``) says, capturing the static step
        (:func:`harness.scenarios.case.launch_case`, outside the timing). ``step =
        "attention"``: the cached attention alone (:mod:`.attention_step`)."""
        if point.settings.step == "attention":
            return attention_step.build_attention_case(point, device, options, self.core(point))
        reasons = self.support(point)
        if reasons:
            raise ValueError("decode: " + "; ".join(reasons))
        choice = check_choice(point, options.check)
        stack = make_stack(point, self.core(point))
        x = make_tokens(point)
        n = point.seq_len
        with torch.no_grad():
            stack.prefill(x[:, :n])
        token = x[:, n : n + 1]

        def eager() -> Tensor:
            with torch.no_grad():
                return stack.step(token, n)

        cost = self.cost(point)

        def check() -> dict:  # the timed step as launched: case.run once the runner launched it
            return check_decode(stack, case.run, x, point, choice)

        def extra(measurement, timer) -> dict:
            device.synchronize()
            start = time.perf_counter()
            with torch.no_grad():
                stack.prefill(x[:, :n])  # same inputs, same positions: the caches end as they were
            device.synchronize()
            prefill_s = time.perf_counter() - start
            alloc = device.peak_memory(stack.new_caches)
            state = {"state_bytes": cache_nbytes(stack.caches)} if stack.kind.recurrent else {}
            return {
                **state,
                **_bandwidth_columns(cost.step_bytes, measurement, device),
                "prefill_s": prefill_s,
                "prefill_tokens_per_s": point.batch * n / prefill_s,
                "cache_bytes": cache_nbytes(stack.caches),
                "cache_bytes_analytic": cost.cache_bytes,
                "cache_alloc_bytes": alloc.peak_bytes,
            }

        columns = {
            "check": "none",  # the check replaces it with float64 or recompute
            "prefill_mode": "stepwise" if stack.stepwise_prefill else "parallel",
            "step_keys": cost.step.n_k,
            "step_bytes": cost.step_bytes,
            **step_graph.launch_columns(TimedCall(eager, "none")),  # until the runner launches
        }
        case = Case(
            run=eager, tokens=point.batch, check=check, extra=extra, columns=columns,
            capture=lambda: step_graph.StaticStep(stack, token, n),
            graph=options.options.get("decode_graph", step_graph.DECODE_GRAPH.default),
            graph_default=step_graph.DEFAULT_LAUNCH, launch_columns=step_graph.launch_columns,
        )
        return case


def _bandwidth_columns(step_bytes: int, measurement, device: Device) -> dict:
    """``bw_fraction``: step_bytes per median step time over the measured memory bandwidth."""
    if measurement is None:
        return {}
    bandwidth, source = calibrate.bandwidth_for(device)
    return {"bw_fraction": step_bytes / measurement.median / bandwidth, "bw_source": source}


def check_decode(stack: DecoderStack, run, x: Tensor, point: Point, choice: CheckChoice) -> dict:
    """``gen_tokens`` cached steps (fresh caches) against full recomputation of the sequence.

    ``full`` check: against a float64 copy of the stack with the float64 reference core; the
    same-dtype recomputation with the same core (where the core supports that whole-sequence
    call) gives ``naive_err`` and ``recompute_max_abs_err``. ``rows`` check (long contexts):
    against that same-dtype recomputation, or float64 where the core cannot recompute.
    The timed step must reproduce step 0 (same state, same position).
    """
    if choice.extent == "none":
        return {"agree": None}
    n, g = point.seq_len, point.settings.gen_tokens
    definition = Definition.of(stack.attend.impl, point.params)
    can_recompute = not stack.attend.impl.not_supported(sequence_problem(point))
    fresh = stack.fresh()
    with torch.no_grad():
        fresh.prefill(x[:, :n])
        steps = torch.cat([fresh.step(x[:, t : t + 1], t) for t in range(n, n + g)], dim=1)
        del fresh
        timed = run()
        # causal, so row t of one forward over all n + g tokens is step t's recomputation
        recomputed = stack.forward(x)[:, n:] if can_recompute else None
        use_ref = choice.extent == "full" or recomputed is None
        ref = reference_stack(stack, definition).forward(x.double())[:, n:] if use_ref else None
    result = output_agreement(steps, ref if use_ref else recomputed, point.torch_dtype)
    result["check"] = "float64" if use_ref else "recompute"
    if recomputed is not None:
        result["recompute_max_abs_err"] = _max_err(steps, recomputed)
        if ref is not None:
            result["naive_err"] = _max_err(recomputed, ref)
    result["timed_step_max_abs_err"] = _max_err(timed, steps[:, :1])
    tol = tolerance(point.torch_dtype).atol
    result["agree"] = result["agree"] and result["timed_step_max_abs_err"] <= tol
    return result


def _max_err(a: Tensor, b: Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def reference_stack(stack: DecoderStack, definition: Definition | None = None) -> DecoderStack:
    """A float64 copy of the blocks with the float64 reference core (an approximation's own
    definition), recomputing (no cache)."""
    blocks = [copy.deepcopy(b).double() for b in stack.blocks]
    definition = definition or Definition()

    def attend(q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec) -> Tensor:
        return definition.float64(q, k, v, mask)

    return DecoderStack(blocks, attend, stack.mask, "none", stack.batch, stack.capacity)
