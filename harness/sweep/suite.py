"""Suite files (TOML) -> validated sweep points.

```toml
name = "seq-scaling-cpu"
scenario = "attention"            # attention | attention+backward | block | block+backward | decode
implementations = ["full", "sdpa"]
[fixed]                           # one value for every point
heads = 8
head_dim = 64                     # or d_model = 512 (head_dim = d_model / heads)
[sweep]                           # lists; cartesian product
seq_len = [1024, 2048]
[[variant]]                       # an implementation plus axes for it alone
implementation = "local"
window = [[127, 0], [255, 0]]     # [left, right]; -1 = unbounded side
[measure]                         # timing budget and checks (all optional)
budget_s = 1.0                    # per point and pass
passes = 3                        # timing passes, each in an order shuffled by order_seed
```
Every problem is reported as one line naming the file, the key and the value (SuiteError):
TOML syntax (with line and column), unknown keys, wrong types, non-finite numbers, impossible
values (seq_len <= 0, d_model % heads != 0, window sides < -1, unknown dtype/device), unknown
implementations (with the known ones listed) and sweeps of more than MAX_POINTS points.
Nothing in a suite is executed or imported; implementation names are looked up in the registry.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from harness import registry
from harness.dtypes import DTYPES
from harness.errors import SuiteError
from harness.masks import MaskError
from harness.measure.timing import TimingConfig
from harness.model.transformer import FFNS, MIXERS, NORMS, POSITIONS
from harness.scenarios.decode_step import GRAPH_MODES
from harness.sweep.point import SCENARIOS, Point

# fmt: off
TOP_KEYS = {"name", "description", "scenario", "implementations", "device", "fixed", "sweep",
            "variant", "measure"}
MIXER_IMPLS = {"lstm", "conv"}  # block-scenario baselines that replace the attention mixer
CACHES = ("none", "full", "rolling")
DEVICES = ("cpu", "cuda", "auto")
MAX_POINTS = 100_000  # a typo'd sweep must not expand for minutes before it is refused
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # the name becomes part of a path

# Point fields a suite may set, with their types (bool is checked before int: True is an int).
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "device": str, "dtype": str, "batch": int, "seq_len": int, "q_len": int, "heads": int,
    "kv_heads": int, "head_dim": int, "causal": bool, "window_left": int, "window_right": int,
    "dilation": int, "global_tokens": int, "block_size": int, "random_blocks": int, "seed": int,
    "norm": str, "ffn": str, "pos": str, "mixer": str, "conv_kernel": int, "layers": int,
    "cache": str, "gen_tokens": int,
}
AXES = set(_FIELD_TYPES) | {"window", "d_model"}
_CHOICES = {"dtype": tuple(DTYPES), "device": DEVICES, "norm": NORMS, "ffn": FFNS,
            "pos": POSITIONS, "mixer": MIXERS, "cache": CACHES}
_POSITIVE = {"batch", "seq_len", "q_len", "heads", "kv_heads", "head_dim", "dilation",
             "block_size", "conv_kernel", "layers", "gen_tokens", "d_model"}
_NON_NEGATIVE = {"global_tokens", "random_blocks", "seed"}

MEASURE_KEYS: dict[str, type | tuple[type, ...]] = {
    "budget_s": (int, float), "min_samples": int, "max_samples": int,
    "target_rel_ci": (int, float), "warmup_calls": int, "min_sample_s": (int, float),
    "check": str, "threads": int, "flush_l2": bool, "isolate": bool,
    "point_timeout_s": (int, float), "passes": int, "order_seed": int,
    "decode_graph": str,
}
# Lower bounds of [measure] numbers: (bound, inclusive). Floats must also be finite.
_MEASURE_MIN = {"budget_s": (0, False), "min_samples": (1, True), "max_samples": (1, True),
                "target_rel_ci": (0, True), "warmup_calls": (0, True), "min_sample_s": (0, True),
                "threads": (1, True), "point_timeout_s": (0, False), "passes": (1, True),
                "order_seed": (0, True)}
MAX_PASSES = 100
MAX_THREADS = 4096
# fmt: on


@dataclass(frozen=True)
class MeasureConfig:
    """Per-suite measurement settings (``[measure]``)."""

    timing: TimingConfig = field(default_factory=TimingConfig)
    check: str = "auto"  # auto | full | rows | none
    threads: int | None = None  # CPU threads; None = torch's default
    flush_l2: bool = False
    isolate: bool = False
    point_timeout_s: float | None = None
    passes: int = 3  # timing passes over the suite, each in its own shuffled order
    order_seed: int = 0  # fixes the pass orders
    decode_graph: str = "auto"  # how a decode step launches: auto | none | cuda-graph | compile


@dataclass(frozen=True)
class Suite:
    name: str
    scenario: str
    path: str
    points: tuple[Point, ...]
    measure: MeasureConfig
    fingerprint: str  # sha256 of the file's bytes: resume refuses a different suite
    description: str = ""


def load_suite(path: str | Path) -> Suite:
    """Read, validate and expand a suite file; raises SuiteError with one readable line."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SuiteError(f"{path}: suite file not found") from None
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read suite ({exc.strerror})") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SuiteError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: invalid TOML: {exc}") from None
    return parse_suite(doc, str(path), hashlib.sha256(raw).hexdigest())


def parse_suite(doc: dict, where: str = "<suite>", fingerprint: str = "") -> Suite:
    """Validate a parsed TOML document and expand it into points."""
    err = _Reporter(where)
    unknown = set(doc) - TOP_KEYS
    if unknown:
        key = sorted(unknown)[0]
        err.fail(key, doc[key], f"unknown key (allowed: {sorted(TOP_KEYS)})")
    name = _required(doc, "name", str, err)
    if not NAME_RE.fullmatch(name):
        err.fail("name", name, "use 1-100 letters, digits, '.', '_', '-' (it names the run folder)")
    if not isinstance(doc.get("description", ""), str):
        err.fail("description", doc["description"], "must be a string")
    scenario = _required(doc, "scenario", str, err)
    if scenario not in SCENARIOS:
        err.fail("scenario", scenario, f"unknown scenario (one of {list(SCENARIOS)})")
    impls = doc.get("implementations", [])
    if not isinstance(impls, list) or not all(isinstance(i, str) for i in impls):
        err.fail("implementations", impls, "must be a list of implementation names")
    device = doc.get("device", "cpu")
    fixed = _table(doc, "fixed", err)
    sweep = _table(doc, "sweep", err)
    variants = doc.get("variant", [])
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        err.fail("variant", variants, "must be an array of tables ([[variant]])")
    _check_axes(fixed, "fixed", err, lists=False)
    _check_axes(sweep, "sweep", err, lists=True)
    both = set(fixed) & set(sweep)
    if both:
        key = sorted(both)[0]
        err.fail(f"sweep.{key}", sweep[key], "also set in [fixed]; set it in one place")
    base = {"device": device, **fixed}
    _check_value("device", device, err)
    plan: list[tuple[str, dict]] = [(impl, {}) for impl in impls]
    for index, variant in enumerate(variants):
        at = f"variant[{index}]"
        impl = variant.get("implementation")
        if not isinstance(impl, str):
            err.fail(f"{at}.implementation", impl, "each [[variant]] needs an implementation name")
        axes = {k: v for k, v in variant.items() if k != "implementation"}
        _check_axes(axes, at, err, lists=None)
        # a variant replaces the plain entry of its implementation; several variants add up
        plan = [(i, a) for i, a in plan if i != impl or a] + [(impl, axes)]
    if not plan:
        err.fail("implementations", impls, "no implementation to run")
    known = set(registry.names()) | MIXER_IMPLS
    for impl, _ in plan:
        if impl not in known:
            err.fail(
                "implementations",
                impl,
                f"unknown implementation (known: {', '.join(sorted(known))})",
            )
    total = sum(math.prod(len(v) for v in _grid(base, sweep, axes)[1].values()) for _, axes in plan)
    if total > MAX_POINTS:
        err.fail("sweep", f"{total} points", f"more than {MAX_POINTS} points; split the suite")
    points: list[Point] = []
    for impl, axes in plan:
        points.extend(_expand(impl, scenario, base, sweep, axes, err))
    if len(set(points)) != len(points):
        err.fail("sweep", "", "the suite produces the same point twice")
    measure = _measure(doc.get("measure", {}), err)
    return Suite(
        name=name,
        scenario=scenario,
        path=where,
        points=tuple(points),
        measure=measure,
        fingerprint=fingerprint,
        description=doc.get("description", ""),
    )


def one_line(text: str, limit: int = 400) -> str:
    """``text`` as a single line (control characters escaped), cut to ``limit`` characters."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Reporter:
    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, value, problem: str):
        shown = one_line(repr(value), 120)
        raise SuiteError(one_line(f"{self.where}: {key} = {shown}: {problem}", 600))


def _required(doc: dict, key: str, kind: type, err: _Reporter):
    if key not in doc:
        err.fail(key, None, "required key missing")
    if not isinstance(doc[key], kind):
        err.fail(key, doc[key], f"must be a {kind.__name__}")
    return doc[key]


def _table(doc: dict, key: str, err: _Reporter) -> dict:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        err.fail(key, value, "must be a table")
    return value


def _check_axes(axes: dict, where: str, err: _Reporter, lists: bool | None) -> None:
    """lists=True: every value a non-empty list; False: scalars; None: either."""
    for key, value in axes.items():
        if key not in AXES:
            err.fail(f"{where}.{key}", value, f"unknown key (point fields: {sorted(AXES)})")
        is_list = isinstance(value, list) and not (key == "window" and _is_pair(value))
        if lists is True and not is_list:
            err.fail(f"{where}.{key}", value, "[sweep] values must be lists")
        if lists is False and is_list:
            err.fail(f"{where}.{key}", value, "must be a single value (lists belong in [sweep])")
        values = value if is_list else [value]
        if is_list and not values:
            err.fail(f"{where}.{key}", value, "empty list")
        for item in values:
            _check_value(key, item, err, f"{where}.{key}")


def _is_pair(value) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(s, int) and not isinstance(s, bool) for s in value)
    )


def _check_value(key: str, value, err: _Reporter, at: str | None = None) -> None:
    at = at or key
    if key == "window":
        if not _is_pair(value) or any(s < -1 for s in value):
            err.fail(at, value, "a window is [left, right] with sides >= -1 (-1 = unbounded)")
        return
    kind = int if key == "d_model" else _FIELD_TYPES[key]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        err.fail(at, value, f"must be {kind.__name__}")
    if key in _CHOICES and value not in _CHOICES[key]:
        err.fail(at, value, f"must be one of {list(_CHOICES[key])}")
    if key in _POSITIVE and value <= 0:
        err.fail(at, value, "must be > 0")
    if key in _NON_NEGATIVE and value < 0:
        err.fail(at, value, "must be >= 0")
    if key in ("window_left", "window_right") and value < -1:
        err.fail(at, value, "must be >= -1 (-1 = unbounded)")


def _grid(base: dict, sweep: dict, axes: dict) -> tuple[dict, dict]:
    """(fixed values, swept lists) of one implementation: its variant axes override the suite's."""
    fixed = dict(base)
    grid = dict(sweep)
    for key, value in axes.items():
        is_list = isinstance(value, list) and not (key == "window" and _is_pair(value))
        grid.pop(key, None)
        fixed.pop(key, None)
        (grid if is_list else fixed)[key] = value
    return fixed, grid


def _expand(impl: str, scenario: str, base: dict, sweep: dict, axes: dict, err: _Reporter):
    fixed, grid = _grid(base, sweep, axes)
    keys = sorted(grid)
    for combo in itertools.product(*(grid[k] for k in keys)):
        values = {**fixed, **dict(zip(keys, combo, strict=True))}
        yield _make_point(impl, scenario, values, err)


def _make_point(impl: str, scenario: str, values: dict, err: _Reporter) -> Point:
    values = dict(values)
    label = f"point({impl}, {values})"
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
    from harness.measure.device import resolve_device_name

    values["device"] = resolve_device_name(values.get("device", "cpu"))
    allowed = {f.name for f in fields(Point)}
    point = Point(impl=impl, scenario=scenario, **{k: v for k, v in values.items() if k in allowed})
    try:
        point.mask  # noqa: B018 - validates the mask fields together
    except MaskError as exc:
        raise SuiteError(f"{err.where}: {label}: {exc}") from None
    return point


def _measure(table: dict, err: _Reporter) -> MeasureConfig:
    if not isinstance(table, dict):
        err.fail("measure", table, "must be a table")
    for key, value in table.items():
        if key not in MEASURE_KEYS:
            err.fail(f"measure.{key}", value, f"unknown key (allowed: {sorted(MEASURE_KEYS)})")
        kind = MEASURE_KEYS[key]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            err.fail(f"measure.{key}", value, f"must be {names}")
        if isinstance(value, float) and not math.isfinite(value):
            err.fail(f"measure.{key}", value, "must be a finite number")
        if key in _MEASURE_MIN:
            bound, inclusive = _MEASURE_MIN[key]
            if value < bound or (value == bound and not inclusive):
                err.fail(f"measure.{key}", value, f"must be {'>=' if inclusive else '>'} {bound}")
    timing_keys = {f.name for f in fields(TimingConfig)}
    try:
        timing = replace(TimingConfig(), **{k: v for k, v in table.items() if k in timing_keys})
    except ValueError as exc:
        err.fail("measure", table, str(exc))
    check = table.get("check", "auto")
    if check not in ("auto", "full", "rows", "none"):
        err.fail("measure.check", check, "must be auto|full|rows|none")
    decode_graph = table.get("decode_graph", "auto")
    if decode_graph not in GRAPH_MODES:
        err.fail("measure.decode_graph", decode_graph, f"must be one of {list(GRAPH_MODES)}")
    threads = table.get("threads")
    if threads is not None and threads > MAX_THREADS:
        err.fail("measure.threads", threads, f"must be <= {MAX_THREADS}")
    if table.get("passes", 1) > MAX_PASSES:
        err.fail("measure.passes", table["passes"], f"must be <= {MAX_PASSES}")
    return MeasureConfig(
        passes=table.get("passes", 3),
        order_seed=table.get("order_seed", 0),
        timing=timing,
        check=check,
        threads=threads,
        flush_l2=table.get("flush_l2", False),
        isolate=table.get("isolate", False),
        point_timeout_s=table.get("point_timeout_s"),
        decode_graph=decode_graph,
    )
