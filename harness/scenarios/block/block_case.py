"""The ``block`` scenario: x (B, N, d_model) through one transformer block with the plugged core,
forward or forward + backward (``block+backward``), checked against a float64 copy of the block
with the float64 reference core.

The ``lstm`` and ``conv`` implementations are the scenario's own baselines: they replace the
attention mixer (Vaswani et al. 2017, Table 1). Rows add the mixer's own time on the same shapes
(``mixer_time_s``) and its share of the block's time (``attn_share`` for attention cores,
``mixer_share`` for every mixer).

Cost: the dense layers (mixer weights and FFN, 2·in·out per token) plus the core's kept pairs;
memory: the block's live activations plus the core's declared workspace
(:mod:`harness.cost.components`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import torch
from torch import Tensor

from harness.cost.components import (
    BACKWARD_FACTOR,
    LINEAR_BACKWARD_FACTOR,
    activation_bytes,
    attention_flops,
    attention_io_bytes,
    attention_params,
    attention_workspace,
    block_params,
    ffn_flops,
    kv_dim,
    projection_flops,
)
from harness.measure.device import Device
from harness.model import FFNS, NORMS, POSITIONS
from harness.model.transformer import BlockConfig, TransformerBlock, build_block
from harness.oracle.agreement import grad_agreement, output_agreement
from harness.oracle.definition import Definition
from harness.scenarios.block import BASELINES
from harness.scenarios.block.mixers import (
    conv_flops,
    conv_params,
    flop_crossover,
    lstm_flops,
    lstm_params,
    mixer_factory,
)
from harness.scenarios.case import Case, CaseOptions, CheckChoice
from harness.scenarios.figures import CrossoverPanel
from harness.scenarios.interface import (
    Point,
    PointCost,
    Scenario,
    SettingsError,
    check_choice,
    register,
)
from harness.spec import Problem, itemsize

MIXERS = ("attention", *BASELINES)


@dataclass(frozen=True)
class BlockSettings:
    """The block's layout (:class:`harness.model.transformer.BlockConfig`). ``mixer`` follows
    the implementation: ``lstm``/``conv`` for those baselines, ``attention`` otherwise."""

    norm: str = field(default="pre", metadata={"choices": NORMS})
    ffn: str = field(default="gelu", metadata={"choices": FFNS})
    pos: str = field(default="rope", metadata={"choices": POSITIONS})
    mixer: str = field(default="attention", metadata={"choices": MIXERS})
    conv_kernel: int = field(default=3, metadata={"minimum": 1})


def core_problem(point: Point) -> Problem:
    """The core's call inside the block: B·H queries over n keys with the point's mask."""
    return point.attention_call(point.seq_len, point.seq_len, point.mask, point.backward)


class BlockCost(PointCost):
    """One block over B·n tokens; see the module docstring."""

    @property
    def attends(self) -> bool:
        return self.point.settings.mixer == "attention"

    @cached_property
    def mixer_flops_per_token(self) -> float:
        """Forward FLOPs per token of the mixer's weights (W_Q/K/V/O, LSTM or conv)."""
        p, d = self.point, self.point.d_model
        if p.settings.mixer == "lstm":
            return float(lstm_flops(d))
        if p.settings.mixer == "conv":
            return float(conv_flops(d, p.settings.conv_kernel))
        return float(projection_flops(d, kv_dim(p.heads, p.kv_heads, p.head_dim)))

    @cached_property
    def weight_bytes(self) -> int:
        """Parameter bytes: mixer + FFN + norms (+ a learned position table)."""
        p, d = self.point, self.point.d_model
        if p.settings.mixer == "lstm":
            mixer = lstm_params(d)
        elif p.settings.mixer == "conv":
            mixer = conv_params(d, p.settings.conv_kernel)
        else:
            mixer = attention_params(d, kv_dim(p.heads, p.kv_heads, p.head_dim))
        rows = p.seq_len if p.settings.pos == "learned" else 0
        return block_params(d, mixer, p.settings.ffn, rows) * itemsize(p.dtype)

    @cached_property
    def useful_flops(self) -> float:
        p = self.point
        per_token = self.mixer_flops_per_token + ffn_flops(p.d_model, p.settings.ffn)
        linear = per_token * p.batch * p.seq_len
        core = attention_flops(p.impl, self.problem, backward=False) if self.attends else 0.0
        if p.backward:
            return linear * (1 + LINEAR_BACKWARD_FACTOR) + core * (1 + BACKWARD_FACTOR)
        return linear + core

    @cached_property
    def compulsory_bytes(self) -> float:
        p = self.point
        acts = 2 * p.batch * p.seq_len * p.d_model * itemsize(p.dtype)
        return float((self.weight_bytes + acts) * (3 if p.backward else 1))

    @cached_property
    def call_bytes(self) -> int:
        """Live activations and the core's workspace; backward saves every activation, then
        adds gradients the size of the weights."""
        p = self.point
        size, tokens = itemsize(p.dtype), p.batch * p.seq_len
        acts = activation_bytes(tokens, p.d_model, p.settings.ffn, size)
        if self.attends:
            work = attention_workspace(p.impl, self.problem)
        else:
            work = 4 * tokens * p.d_model * size
        if p.backward:
            return 2 * (acts + work) + self.weight_bytes
        return acts + work

    @cached_property
    def peak_bytes(self) -> int:
        p = self.point
        x = p.batch * p.seq_len * p.d_model * itemsize(p.dtype)
        return self.weight_bytes + x + self.call_bytes

    def timed_work(self, column: str, kind: str) -> float:
        """``mixer_time_s`` times the mixer alone: the attention core (its projections run
        outside that call), or the LSTM / conv layer over B·n tokens."""
        if column != "mixer_time_s":
            return super().timed_work(column, kind)
        p = self.point
        times = 1 + LINEAR_BACKWARD_FACTOR if p.backward else 1
        if self.attends:
            if kind == "flops":
                return attention_flops(p.impl, self.problem)
            inputs, out = attention_io_bytes(p.impl, self.problem)
            return float((inputs + out) * (3 if p.backward else 1))
        if kind == "flops":
            return float(self.mixer_flops_per_token * p.batch * p.seq_len * times)
        d = p.d_model
        if p.settings.mixer == "lstm":
            weights = lstm_params(d)
        else:
            weights = conv_params(d, p.settings.conv_kernel)
        acts = 2 * p.batch * p.seq_len * d
        return float((weights + acts) * itemsize(p.dtype) * (3 if p.backward else 1))


def _layer_guides(d_model: float) -> tuple[tuple[float, str], ...]:
    """The textbook FLOP crossover n = d and the exact one with an LSTM (constants counted)."""
    return (d_model, "n = d"), (flop_crossover(int(d_model), "lstm"), "FLOPs: 4d (LSTM)")


# per-layer cost: the mixer timed alone, attention against the recurrent and conv baselines
LAYERS = CrossoverPanel(
    "layers",
    "Per-layer cost: attention vs recurrent vs convolution",
    "Mixer time alone inside the block. Dashed lines: textbook FLOP crossover n = d, exact FLOP "
    "crossover with an LSTM (4·d, constants counted), measured crossover.",
    metric="mixer_time_s",
    baselines=("lstm", "conv"),
    subject="attention",
    split=("conv", "conv_kernel", "k"),
    guides=_layer_guides,
    measured_against="lstm",
    figure_title="per-layer cost",
)


@register
class Block(Scenario):
    """One transformer block; see the module docstring."""

    serves: ClassVar[dict[str, bool]] = {"block": False, "block+backward": True}
    settings = BlockSettings
    baselines: ClassVar[dict[str, str]] = BASELINES
    axes: ClassVar[tuple[str, ...]] = ("conv_kernel",)
    panels: ClassVar[tuple[CrossoverPanel, ...]] = (LAYERS,)

    def make_settings(self, impl: str, values: dict) -> BlockSettings:
        """The mixer comes from the implementation (a suite never sets it to a baseline)."""
        mixer = values.get("mixer", "attention")
        if impl in BASELINES:
            values = {**values, "mixer": impl}
        elif mixer != "attention":
            raise SettingsError(
                "mixer", mixer, "set the mixer by listing 'lstm'/'conv' as implementations"
            )
        return BlockSettings(**values)

    def point_errors(self, point: Point) -> list[SettingsError]:
        if point.q_len is not None:
            problem = "q_len applies to attention scenarios only"
            return [SettingsError("q_len", point.q_len, problem)]
        return []

    def problem(self, point: Point) -> Problem:
        return core_problem(point)

    def cost(self, point: Point) -> BlockCost:
        return BlockCost(point)

    def build_case(self, point: Point, device: Device, options: CaseOptions) -> Case:
        """x: (B, N, d_model) through one block; the baselines have no registry core."""
        choice = check_choice(point, options.check)
        cfg = BlockConfig.of(point, causal=point.mask.causal, max_len=point.seq_len)
        mixer = mixer_factory(point.settings.mixer, point.settings.conv_kernel)
        block = build_block(cfg, point.seed, point.device, point.torch_dtype, mixer)
        block = block.eval()
        impl = self.core(point)
        core = impl.prepare(self.problem(point)) if impl is not None else None
        gen = torch.Generator(device=point.device).manual_seed(point.seed + 1)
        shape = (point.batch, point.seq_len, point.d_model)
        x = torch.randn(shape, generator=gen, device=point.device, dtype=point.torch_dtype)
        params = [p for p in block.parameters() if p.requires_grad]
        grad_out = torch.randn(shape, generator=gen, device=point.device, dtype=point.torch_dtype)
        if point.backward:
            x.requires_grad_(True)

            def run() -> tuple[Tensor, ...]:
                return torch.autograd.grad(block(x, core), [x, *params], grad_out)
        else:

            def run() -> Tensor:
                with torch.no_grad():
                    return block(x, core)

        def check() -> dict:
            definition = Definition.of(impl, point.params)
            return check_block(block, core, x, grad_out, point, choice, definition)

        def extra(measurement, timer) -> dict:
            mixer_fn = mixer_call(block, core, x, grad_out, point.backward)
            mixer_time = timer(mixer_fn).median
            share = mixer_time / measurement.median
            out = {"mixer_time_s": mixer_time, "mixer_share": share}
            if point.settings.mixer == "attention":
                out["attn_share"] = share
            return out

        return Case(
            run=run,
            tokens=point.batch * point.seq_len,
            check=check,
            extra=extra,
            columns={"check": choice.describe()},
        )


def mixer_call(block: TransformerBlock, core, x: Tensor, grad_out: Tensor, backward: bool):
    """A zero-argument call of the block's mixer alone on the shapes it sees inside the block."""
    positions = torch.arange(x.shape[1], device=x.device)
    with torch.no_grad():
        h = block.ln1(block.embed(x))
    if block.attends:
        q, k, v = (t.detach().requires_grad_(backward) for t in block.mixer.project(h, positions))
        if backward:
            core_grad = torch.randn_like(q)  # (B, H, N, D), the core's output shape
            return lambda: torch.autograd.grad(core(q, k, v), (q, k, v), core_grad)

        def attend() -> Tensor:
            with torch.no_grad():
                return core(q, k, v)

        return attend
    h = h.detach().requires_grad_(backward)
    if backward:
        return lambda: torch.autograd.grad(block.mix(h, None, positions), (h,), grad_out)

    def mix() -> Tensor:
        with torch.no_grad():
            return block.mix(h, None, positions)

    return mix


def check_block(
    block: TransformerBlock,
    core,
    x: Tensor,
    grad_out: Tensor,
    point: Point,
    choice: CheckChoice,
    definition: Definition | None = None,
) -> dict:
    """Block output (and dx) against a float64 copy with the float64 reference core (an
    approximation's own float64 definition, :mod:`harness.oracle.definition`)."""
    if choice.extent == "none":
        return {"agree": None}
    ref_block = copy.deepcopy(block).double()
    ref_core = (definition or Definition()).core64(point.mask)
    x64 = x.detach().double().requires_grad_(choice.grads)
    with torch.set_grad_enabled(choice.grads):
        ref = ref_block(x64, ref_core if core is not None else None)
    with torch.no_grad():
        out = block(x.detach(), core)
    result = output_agreement(out, ref.detach(), point.torch_dtype)
    if choice.grads:
        x_grad = x.detach().requires_grad_(True)
        (dx,) = torch.autograd.grad(block(x_grad, core), (x_grad,), grad_out)
        (dx_ref,) = torch.autograd.grad(ref, (x64,), grad_out.double())
        result.update(grad_agreement((dx,), (dx_ref,), point.torch_dtype))
        result["agree"] = result["agree"] and result["grad_agree"]
    return result
