"""The ``toy`` scenario: ``repeat`` calls of the core on seeded (B, H, N, D) inputs per timed
call, checked against the float64 reference. Its cost is ``repeat`` times the core's. Its own
``[measure] toy_order`` (``same`` or ``reversed``: the order of the inputs it builds) shows
that a scenario brings its options without the runner knowing them, and its report panel
(``toy-time``) that it brings its figures without the renderer knowing them."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import torch
from torch import Tensor

from harness.cost.components import attention_flops, attention_io_bytes, attention_workspace
from harness.measure.device import Device
from harness.oracle.agreement import output_agreement
from harness.oracle.reference import reference_attention
from harness.scenarios.case import Case, CaseOptions, MeasureOption
from harness.scenarios.figures import MetricPanel
from harness.scenarios.interface import Point, PointCost, Scenario, check_choice, register
from harness.spec import Problem


@dataclass(frozen=True)
class ToySettings:
    repeat: int = field(default=2, metadata={"minimum": 1})


class ToyCost(PointCost):
    @cached_property
    def problem(self) -> Problem:
        p = self.point
        return p.attention_call(p.seq_len, p.seq_len, p.mask)

    @cached_property
    def useful_flops(self) -> float:
        return self.point.settings.repeat * attention_flops(self.point.impl, self.problem)

    @cached_property
    def compulsory_bytes(self) -> float:
        return float(sum(attention_io_bytes(self.point.impl, self.problem)))

    @cached_property
    def call_bytes(self) -> int:
        out = attention_io_bytes(self.point.impl, self.problem)[1]
        return out + attention_workspace(self.point.impl, self.problem)

    @cached_property
    def peak_bytes(self) -> int:
        return attention_io_bytes(self.point.impl, self.problem)[0] + self.call_bytes


@register
class Toy(Scenario):
    serves: ClassVar[dict[str, bool]] = {"toy": False}
    settings = ToySettings
    measure_options: ClassVar[dict[str, MeasureOption]] = {
        "toy_order": MeasureOption(("same", "reversed"), "same", "the order inputs are drawn in")
    }
    panels: ClassVar[tuple[MetricPanel, ...]] = (
        MetricPanel("toy-time", "Toy: repeated calls against n",
                    "The median time of `repeat` core calls.", metric="time_median_s"),
    )  # fmt: skip

    def problem(self, point: Point) -> Problem:
        return point.attention_call(point.seq_len, point.seq_len, point.mask)

    def cost(self, point: Point) -> ToyCost:
        return ToyCost(point)

    def build_case(self, point: Point, device: Device, options: CaseOptions) -> Case:
        choice = check_choice(point, options.check)
        attn = self.core(point).prepare(self.problem(point))
        gen = torch.Generator().manual_seed(point.seed + 1)
        shape = (point.batch, point.heads, point.seq_len, point.head_dim)
        q, k, v = (torch.randn(shape, generator=gen, dtype=point.torch_dtype) for _ in range(3))
        order = options.options.get("toy_order", "same")
        if order == "reversed":
            q, k, v = v, k, q

        def run() -> Tensor:
            with torch.no_grad():
                for _ in range(point.settings.repeat - 1):
                    attn(q, k, v)
                return attn(q, k, v)

        def check() -> dict:
            if choice.extent == "none":
                return {"agree": None}
            ref = reference_attention(q, k, v, point.mask)
            calls = point.settings.repeat
            return {**output_agreement(run(), ref, point.torch_dtype), "toy_calls": calls}

        return Case(run=run, tokens=point.batch * point.seq_len, check=check,
                    columns={"check": choice.describe(), "toy_order": order})  # fmt: skip
