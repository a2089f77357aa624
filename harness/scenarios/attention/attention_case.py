"""The ``attention`` scenario: one call of the core on seeded (B, H, N, D) inputs, timed forward
(under ``no_grad``) or forward + backward (``attention+backward``, through autograd).

Cost: useful FLOPs from the exact kept pairs (or the method's own formula), executed FLOPs from
the implementation's block-granular pair count, compulsory bytes (q, k, v read and out written;
backward adds the row lse, a second read of q, k, v, out with dout and lse, and the gradients:
:func:`harness.cost.components.attention_bytes`), and the peak from the implementation's
declared workspace. Rows carry the compulsory bytes and ``bw_fraction``: those bytes per median
second over the measured copy bandwidth (:func:`bandwidth_columns`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import torch
from torch import Tensor

from harness.cost.components import (
    attention_bytes,
    attention_flops,
    attention_io_bytes,
    attention_workspace,
    bandwidth_fraction,
    executed_attention_flops,
)
from harness.measure import calibrate
from harness.measure.device import Device
from harness.measure.timing import Measurement
from harness.oracle.definition import Definition
from harness.scenarios.attention.checking import check_attention
from harness.scenarios.case import Case, CaseOptions
from harness.scenarios.interface import Point, PointCost, Scenario, check_choice, register
from harness.spec import AttnFn, Problem


@dataclass(frozen=True)
class AttentionSettings:
    """``qk_std``: the standard deviation of q and k (v is N(0, 1))."""

    qk_std: float = field(default=1.0, metadata={"above": 0.0})


def make_inputs(point: Point, device: str, requires_grad: bool = False) -> tuple[Tensor, ...]:
    """Fresh seeded inputs: q (B, H, n_q, D) and k (B, H_kv, n_k, D) ~ N(0, qk_std²), v ~ N(0, 1)
    (B, H_kv, n_k, D). The same seed draws the same numbers at any ``qk_std``."""
    gen = torch.Generator(device=device).manual_seed(point.seed + 1)
    kv_heads = point.kv_heads or point.heads
    shapes = [
        (point.batch, point.heads, point.n_q, point.head_dim),
        (point.batch, kv_heads, point.seq_len, point.head_dim),
        (point.batch, kv_heads, point.seq_len, point.head_dim),
    ]
    q, k, v = (
        torch.randn(s, generator=gen, device=device, dtype=point.torch_dtype) for s in shapes
    )
    std = point.settings.qk_std
    if std != 1.0:  # scaled in place, before autograd sees them: leaves, as at std 1
        q.mul_(std)
        k.mul_(std)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


class AttentionCost(PointCost):
    """One call of the core; see the module docstring."""

    @cached_property
    def useful_flops(self) -> float:
        return attention_flops(self.point.impl, self.problem)

    @cached_property
    def executed_flops(self) -> float:
        return executed_attention_flops(self.point.impl, self.problem)

    @cached_property
    def compulsory_bytes(self) -> float:
        return float(attention_bytes(self.point.impl, self.problem))

    @cached_property
    def call_bytes(self) -> int:
        """The output and the workspace; backward doubles the workspace (saved + recomputed
        tensors) and adds gradients the size of the inputs plus the upstream gradient."""
        inputs, out = attention_io_bytes(self.point.impl, self.problem)
        work = attention_workspace(self.point.impl, self.problem)
        return out + work if not self.problem.backward else 2 * out + inputs + 2 * work

    @cached_property
    def peak_bytes(self) -> int:
        inputs, _ = attention_io_bytes(self.point.impl, self.problem)
        return inputs + self.call_bytes


def get_problem(point: Point) -> Problem:
    """q (B, H, n_q, D) over k/v (B, H_kv, seq_len, D) with the point's mask; backward for
    ``attention+backward``."""
    return point.attention_call(point.n_q, point.seq_len, point.mask, backward=point.backward)


@register
class Attention(Scenario):
    """The core op alone; the implementation's declared exponents in n are those of its rows."""

    serves: ClassVar[dict[str, bool]] = {"attention": False, "attention+backward": True}
    settings = AttentionSettings
    core_exponents = True

    def problem(self, point: Point) -> Problem:
        return get_problem(point)

    def cost(self, point: Point) -> AttentionCost:
        return AttentionCost(point)

    def build_case(self, point: Point, device: Device, options: CaseOptions) -> Case:
        """Time the core on fresh inputs; forward under no_grad, or forward+backward via
        autograd. The check runs the same prepared call."""
        choice = check_choice(point, options.check)
        core = self.core(point)
        attn: AttnFn = core.prepare(self.problem(point))
        definition = Definition.of(core, point.params)
        q, k, v = make_inputs(point, point.device, requires_grad=point.backward)
        grad_out = None
        if point.backward:
            gen = torch.Generator(device=point.device).manual_seed(point.seed + 2)
            grad_out = torch.randn(q.shape, generator=gen, device=point.device, dtype=q.dtype)

            def run() -> tuple[Tensor, ...]:
                return torch.autograd.grad(attn(q, k, v), (q, k, v), grad_out)
        else:

            def run() -> Tensor:
                with torch.no_grad():
                    return attn(q, k, v)

        def check() -> dict:
            return check_attention(attn, q, k, v, grad_out, point, choice, definition)

        nbytes = self.cost(point).compulsory_bytes
        return Case(
            run=run, tokens=point.batch * point.n_q, check=check,
            extra=lambda measurement, timer: bandwidth_columns(nbytes, measurement, device),
            columns={"check": choice.describe(), "compulsory_bytes": int(nbytes)},
        )


def bandwidth_columns(nbytes: float, measurement: Measurement | None, device: Device) -> dict:
    """``bw_fraction``: ``nbytes`` per median second over the measured copy bandwidth (the
    run's calibration, else measured once in this process), and where that bandwidth came
    from."""
    if measurement is None:
        return {}
    bandwidth, source = calibrate.bandwidth_for(device)
    return {"bw_fraction": bandwidth_fraction(nbytes, measurement.median, bandwidth),
            "bw_source": source}
