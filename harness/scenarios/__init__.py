"""Scenarios turn a Point into a :class:`Case`: the timed zero-argument callable plus how to
check and describe it. One module per scenario; :func:`build_case` dispatches on the name.
"""

from __future__ import annotations

from harness.scenarios import attention, block, decode
from harness.scenarios.base import Case, CheckPlan, check_plan

__all__ = ["Case", "CheckPlan", "build_case", "check_plan"]

# a point's scenario without "+backward" -> the module whose build() makes its Case
BUILDERS = {"attention": attention, "block": block}


def build_case(point, impl, device, check: str = "auto", decode_graph: str = "auto") -> Case:
    """The Case for ``point`` run by ``impl`` (a registry Implementation) on ``device``;
    ``decode_graph`` is how a decode step is launched (see :mod:`decode_step`)."""
    base = point.scenario.removesuffix("+backward")
    if base == "decode":
        return decode.build(point, impl, device, check_plan(point, check), decode_graph)
    if base not in BUILDERS:
        raise ValueError(f"unknown scenario {point.scenario!r}")
    return BUILDERS[base].build(point, impl, device, check_plan(point, check))
