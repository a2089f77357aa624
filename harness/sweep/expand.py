"""A validated suite's tables -> its points: which implementations run with which axes, the
cartesian product of the swept values, and each combination built into a :class:`Point`.

Rules between fields of one point are checked here, as the point is built: ``d_model`` must
split into ``heads``, ``kv_heads`` divide ``heads``, the mask fields make one valid mask.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import fields

from harness import registry
from harness.errors import SuiteError
from harness.masks import MaskError
from harness.measure.device import resolve_device_name
from harness.sweep.point import Point
from harness.sweep.validate import SuiteReporter, is_swept, validate_axes
from harness.sweep.vocab import MIXER_IMPLS

MAX_POINTS = 100_000  # a typo'd sweep must not expand for minutes before it is refused
POINT_FIELD_NAMES = frozenset(f.name for f in fields(Point))

# One implementation's share of a suite: (implementation name, its own [[variant]] axes).
Entry = tuple[str, dict]


def entries(impls: list[str], variants: list[dict], err: SuiteReporter) -> list[Entry]:
    """The (implementation, variant axes) pairs a suite runs: each listed implementation with
    no axes of its own, replaced by its ``[[variant]]`` blocks (several add up)."""
    known = set(registry.names()) | MIXER_IMPLS
    runs: list[Entry] = [(impl, {}) for impl in impls]
    for impl in impls:
        if impl not in known:
            err.fail("implementations", impl, unknown_implementation(known))
    for index, variant in enumerate(variants):
        at = f"variant[{index}]"
        impl = variant.get("implementation")
        if not isinstance(impl, str):
            err.fail(f"{at}.implementation", impl, "each [[variant]] needs an implementation name")
        if impl not in known:
            err.fail(f"{at}.implementation", impl, unknown_implementation(known))
        axes = {k: v for k, v in variant.items() if k != "implementation"}
        validate_axes(axes, at, err, lists=None)
        runs = [(i, a) for i, a in runs if i != impl or a] + [(impl, axes)]
    if not runs:
        err.fail("implementations", impls, "no implementation to run")
    return runs


def unknown_implementation(known: set[str]) -> str:
    """The problem of a name that is not registered: the known names, and the plug-ins whose
    entry point failed to load (one of them may be the one meant)."""
    text = f"unknown implementation (known: {', '.join(sorted(known))})"
    broken = registry.load_errors()
    if broken:
        text += "; plug-ins that failed to load: " + "; ".join(
            f"{name}: {reason}" for name, reason in broken.items()
        )
    return text


def grid(base: dict, sweep: dict, axes: dict) -> tuple[dict, dict]:
    """(fixed values, swept lists) of one implementation: its variant axes override the suite's."""
    fixed = dict(base)
    swept = dict(sweep)
    for key, value in axes.items():
        swept.pop(key, None)
        fixed.pop(key, None)
        (swept if is_swept(key, value) else fixed)[key] = value
    return fixed, swept


def expand_points(
    runs: list[Entry], scenario: str, base: dict, sweep: dict, err: SuiteReporter
) -> tuple[Point, ...]:
    """Every point of the suite, in order: implementation by implementation, then the
    cartesian product of its swept values (keys sorted). At most MAX_POINTS, none twice."""
    total = sum(math.prod(len(v) for v in grid(base, sweep, axes)[1].values()) for _, axes in runs)
    if total > MAX_POINTS:
        err.fail("sweep", f"{total} points", f"more than {MAX_POINTS} points; split the suite")
    points: list[Point] = []
    for impl, axes in runs:
        points.extend(_combinations(impl, scenario, *grid(base, sweep, axes), err))
    seen: set[Point] = set()
    for point in points:
        if point in seen:
            err.fail("point", point.label(), "the suite produces the same point twice (an "
                     "implementation, a [sweep] value or a [[variant]] repeats another)")
        seen.add(point)
    return tuple(points)


def _combinations(
    impl: str, scenario: str, fixed: dict, swept: dict, err: SuiteReporter
) -> Iterator[Point]:
    keys = sorted(swept)
    for combo in itertools.product(*(swept[k] for k in keys)):
        values = {**fixed, **dict(zip(keys, combo, strict=True))}
        yield make_point(impl, scenario, values, err)


def make_point(impl: str, scenario: str, values: dict, err: SuiteReporter) -> Point:
    """The Point of one combination of suite values (``window`` and ``d_model`` resolved into
    point fields, ``device = "auto"`` into the device found here)."""
    label = f"point({impl}, {values})"
    values = _shape_fields(values, label, err)
    if impl in MIXER_IMPLS:
        if not scenario.startswith("block"):
            err.fail(f"{label}: implementations", impl, "lstm/conv mixers need the block scenario")
        values["mixer"] = impl
    elif values.get("mixer", "attention") != "attention":
        err.fail(
            f"{label}: mixer",
            values["mixer"],
            "set the mixer by listing 'lstm'/'conv' as implementations",
        )
    if values.get("q_len") is not None and not scenario.startswith("attention"):
        err.fail(f"{label}: q_len", values["q_len"], "q_len applies to attention scenarios only")
    values["device"] = resolve_device_name(values.get("device", "cpu"))
    given = {k: v for k, v in values.items() if k in POINT_FIELD_NAMES}
    point = Point(impl=impl, scenario=scenario, **given)
    try:
        point.mask  # noqa: B018 - validates the mask fields together
    except MaskError as exc:
        raise SuiteError(f"{err.where}: {label}: {exc}") from None
    return point


def _shape_fields(values: dict, label: str, err: SuiteReporter) -> dict:
    """A copy of ``values`` with ``window = [left, right]`` as the two window sides (-1 ->
    None: unbounded) and ``d_model`` as ``head_dim = d_model / heads``; kv_heads checked."""
    values = dict(values)
    window = values.pop("window", None)
    if window is not None:
        values["window_left"], values["window_right"] = window
    for side in ("window_left", "window_right"):
        if values.get(side) == -1:
            values[side] = None
    d_model = values.pop("d_model", None)
    heads = values.get("heads", Point.__dataclass_fields__["heads"].default)
    if d_model is not None:
        if d_model % heads:
            err.fail(f"{label}: d_model", d_model, f"not divisible by heads={heads}")
        if "head_dim" in values and values["head_dim"] * heads != d_model:
            err.fail(f"{label}: d_model", d_model, "contradicts head_dim * heads")
        values["head_dim"] = d_model // heads
    kv = values.get("kv_heads")
    if kv is not None and heads % kv:
        err.fail(f"{label}: kv_heads", kv, f"must divide heads={heads}")
    return values
