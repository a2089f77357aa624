"""A validated suite's tables -> its points: which implementations run with which axes, the
cartesian product of the swept values, and each combination built into a :class:`Point`.

Rules between fields of one point are checked here, as the point is built: ``d_model`` must
split into ``heads``, ``kv_heads`` divide ``heads``, the mask fields make one valid mask that
fits the sequence, the scenario accepts its settings, and each method parameter is one the
implementation declares, within its declared range. A parameter reaches only the points of
implementations that declare it.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator

from harness import fmt, registry
from harness.errors import SuiteError
from harness.mask_features.window import side as window_side
from harness.masks import MaskError
from harness.measure.device import resolve_device_name
from harness.scenarios import interface
from harness.scenarios.interface import SHAPE_FIELDS, Point, Scenario, SettingsError
from harness.scenarios.suite_mask import PointMask
from harness.spec import Param
from harness.sweep.validate import SHAPE_AXES, Axes, SuiteReporter, check_mask, is_swept

_SHAPE = frozenset(f.name for f in SHAPE_FIELDS)  # the Point fields a suite value sets itself
MAX_POINTS = 100_000  # a typo'd sweep must not expand for minutes before it is refused

# One implementation's share of a suite: (implementation name, its own [[variant]] axes).
Entry = tuple[str, dict]


def suite_axes(
    scenario: Scenario, impls: list[str], variants: list[dict], err: SuiteReporter
) -> Axes:
    """The keys a suite may use: point fields, the scenario's settings, and the method
    parameters the suite's registered implementations declare."""
    params: dict[str, list[Param]] = {}
    fields = SHAPE_AXES | set(interface.settings_types(scenario))
    named = [*impls, *(v.get("implementation") for v in variants if isinstance(v, dict))]
    for impl in dict.fromkeys(n for n in named if isinstance(n, str)):
        try:
            declared = registry.get(impl).params
        except registry.UnknownImplementation:
            continue  # reported by entries()
        for name, param in declared.items():
            if name in fields:
                err.fail("implementations", impl, f"declares a parameter {name!r}, a point field")
            params.setdefault(name, []).append(param)
    return Axes(scenario, params)


def entries(
    impls: list[str], variants: list[dict], scenario: Scenario, axes: Axes, err: SuiteReporter
) -> list[Entry]:
    """The (implementation, variant axes) pairs a suite runs: each listed implementation with
    no axes of its own, replaced by its ``[[variant]]`` blocks (several add up)."""
    known = set(registry.names()) | set(scenario.baselines)
    runs: list[Entry] = [(impl, {}) for impl in impls]
    for impl in impls:
        if impl not in known:
            err.fail("implementations", impl, _unknown(impl, known))
    for index, variant in enumerate(variants):
        at = f"variant[{index}]"
        impl = variant.get("implementation")
        if not isinstance(impl, str):
            err.fail(f"{at}.implementation", impl, "each [[variant]] needs an implementation name")
        if impl not in known:
            err.fail(f"{at}.implementation", impl, _unknown(impl, known))
        own = {k: v for k, v in variant.items() if k != "implementation"}
        axes.validate(own, at, err, lists=None)
        for key in own.keys() & axes.params.keys() - _declared(impl).keys():
            err.fail(f"{at}.{key}", own[key], f"{impl} declares no parameter {key!r}")
        runs = [(i, a) for i, a in runs if i != impl or a] + [(impl, own)]
    if not runs:
        err.fail("implementations", impls, "no implementation to run")
    return runs


def _unknown(impl: str, known: set[str]) -> str:
    """Why ``impl`` is not an implementation of this suite's scenario: another scenario's
    baseline, a plug-in of that name whose entry point failed to load (its error alone), or
    nobody's (with the plug-ins that failed to load: one of them may be the one meant)."""
    words = [w for w in interface.names() if impl in interface.get(w).baselines]
    owners = sorted({w.split("+")[0] for w in words})
    if owners:
        return f"{impl} runs in the {' and '.join(owners)} scenario only"
    broken = registry.load_errors()
    if impl in broken:  # the plug-in of this very name is installed but does not import
        return broken[impl]
    hint = fmt.did_you_mean(impl, known)
    text = f"unknown implementation{hint} (known: {', '.join(sorted(known))})"
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


def _own_grid(impl: str, base: dict, sweep: dict, axes: dict, params: Axes) -> tuple[dict, dict]:
    """:func:`grid` without the method parameters ``impl`` does not declare."""
    fixed, swept = grid(base, sweep, axes)
    declared = _declared(impl)
    foreign = {k for k in params.params if k not in declared}
    return (
        {k: v for k, v in fixed.items() if k not in foreign},
        {k: v for k, v in swept.items() if k not in foreign},
    )


def _declared(impl: str) -> dict[str, Param]:
    try:
        return registry.get(impl).params
    except registry.UnknownImplementation:
        return {}


def expand_points(
    runs: list[Entry], scenario: str, base: dict, sweep: dict, axes: Axes, err: SuiteReporter
) -> tuple[Point, ...]:
    """Every point of the suite, in order: implementation by implementation, then the
    cartesian product of its swept values (keys sorted). At most MAX_POINTS, none twice."""
    grids = [(impl, _own_grid(impl, base, sweep, own, axes)) for impl, own in runs]
    total = sum(math.prod(len(v) for v in swept.values()) for _, (_, swept) in grids)
    if total > MAX_POINTS:
        err.fail("sweep", f"{total} points", f"more than {MAX_POINTS} points; split the suite")
    points: list[Point] = []
    for impl, (fixed, swept) in grids:
        points.extend(_combinations(impl, scenario, fixed, swept, axes, err))
    seen: set[Point] = set()
    for point in points:
        if point in seen:
            err.fail("point", point.label(), "the suite produces the same point twice (an "
                     "implementation, a [sweep] value or a [[variant]] repeats another)")
        seen.add(point)
    return tuple(points)


def _combinations(
    impl: str, scenario: str, fixed: dict, swept: dict, axes: Axes, err: SuiteReporter
) -> Iterator[Point]:
    keys = sorted(swept)
    for combo in itertools.product(*(swept[k] for k in keys)):
        values = {**fixed, **dict(zip(keys, combo, strict=True))}
        yield make_point(impl, scenario, values, axes, err)


def make_point(impl: str, scenario: str, values: dict, axes: Axes, err: SuiteReporter) -> Point:
    """The Point of one combination of suite values (``window`` and ``d_model`` resolved into
    point fields, ``device = "auto"`` into the device found here, the scenario's settings and
    the implementation's parameters gathered)."""
    label = f"point({impl}, {values})"
    values = _shape_fields(values, label, err)
    values["device"] = resolve_device_name(values.get("device", "cpu"))
    settings = {k: values.pop(k) for k in list(values) if k in axes.settings}
    params = {k: values.pop(k) for k in list(values) if k in axes.params}
    for name, value in params.items():
        problems = _declared(impl)[name].reasons(name, value)
        if problems:
            err.fail(f"{label}: {name}", value, "; ".join(problems))
    sc = axes.scenario
    try:
        point = Point(
            impl=impl,
            scenario=scenario,
            **{k: v for k, v in values.items() if k in _SHAPE},
            masking=PointMask.from_columns(values),
            settings=sc.make_settings(impl, settings),
            params=tuple(params.items()),
        )
        check_mask(point.masking, point.n_q, point.seq_len)  # every mask field together
    except SettingsError as exc:
        err.fail(f"{label}: {exc.key}", exc.value, str(exc))
    except MaskError as exc:
        raise SuiteError(f"{err.where}: {label}: {exc}") from None
    for problem in sc.point_errors(point):
        err.fail(f"{label}: {problem.key}", problem.value, str(problem))
    return point


def _shape_fields(values: dict, label: str, err: SuiteReporter) -> dict:
    """A copy of ``values`` with ``window = [left, right]`` as the two window sides (-1 ->
    None: unbounded) and ``d_model`` as ``head_dim = d_model / heads``; kv_heads checked."""
    values = dict(values)
    window = values.pop("window", None)
    if window is not None:
        values["window_left"], values["window_right"] = window
    for name in ("window_left", "window_right"):
        value = values.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            with contextlib.suppress(ValueError):  # out of range: the validator names it
                values[name] = window_side(value)  # the one reader of -1
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
