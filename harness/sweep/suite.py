"""Suite files (TOML) -> validated sweep points.

```toml
name = "seq-scaling-cpu"
scenario = "attention"            # attention | attention+backward | block | block+backward | decode
implementations = ["full", "sdpa"]
[fixed]                           # one value for every point
heads = 8
head_dim = 64                     # or d_model = 512 (head_dim = d_model / heads)
documents = "uniform:512"         # packed documents (harness.scenarios.packing); or a list
[sweep]                           # lists; cartesian product
seq_len = [1024, 2048]
[[variant]]                       # an implementation plus axes for it alone
implementation = "local"
window = [[127, 0], [255, 0]]     # [left, right]; -1 = unbounded side
[measure]                         # timing budget and checks (all optional)
budget_s = 1.0                    # per point and pass
passes = 3                        # timing passes, each in an order shuffled by order_seed
cuda_graph = true                 # replay the timed call from a CUDA graph (CUDA only)
time_limit_s = 240                # whole run: stop cleanly, coarse-to-fine (docs/time_limit.md)
```
``[measure]`` also takes the options the suite's scenario declares for itself
(``Scenario.measure_options``: decode's ``decode_graph``); they reach its cases through
``CaseOptions.options``, not through the runner.
The keys of ``[fixed]``, ``[sweep]`` and ``[[variant]]`` are the point fields (shape, mask,
dtype, device), the settings of the suite's scenario (``qk_std`` for attention, ``ffn`` for
block, ``cache`` for decode, ...: each scenario declares its own) and the method parameters
the suite's implementations declare (a parameter reaches only the points of implementations
that declare it).

Every problem is reported as one line naming the file, the key and the value (SuiteError):
TOML syntax (with line and column), unknown keys, wrong types, non-finite numbers, impossible
values (seq_len <= 0, d_model % heads != 0, window sides < -1, unknown dtype/device, a method
parameter out of its declared range), mask settings a point cannot honour (one rule,
docs/masks.md: positions or lengths past the sequence, a right window side with causal), unknown
implementations (with the known ones listed) and sweeps of more than MAX_POINTS points.
Nothing in a suite is executed or imported; implementation names are looked up in the registry.

This module reads the file and its top level and ``[measure]``; the point fields are checked by
:mod:`harness.sweep.validate` and expanded into points by :mod:`harness.sweep.expand`.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from harness.errors import SuiteError
from harness.measure.timing import TimingConfig
from harness.scenarios import interface
from harness.scenarios.case import CHECK_EXTENTS
from harness.scenarios.interface import Point
from harness.sweep.expand import entries, expand_points, suite_axes
from harness.sweep.validate import SuiteReporter, required, table, unknown_key, validate_value

# fmt: off
TOP_KEYS = {"name", "description", "scenario", "implementations", "device", "fixed", "sweep",
            "variant", "measure"}
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # the name becomes part of a path

MEASURE_KEYS: dict[str, type | tuple[type, ...]] = {
    "budget_s": (int, float), "min_samples": int, "max_samples": int,
    "target_rel_ci": (int, float), "warmup_calls": int, "min_sample_s": (int, float),
    "check": str, "threads": int, "flush_l2": bool, "isolate": bool,
    "point_timeout_s": (int, float), "passes": int, "order_seed": int, "cuda_graph": bool,
    "time_limit_s": (int, float),
}
# Lower bounds of [measure] numbers: (bound, inclusive). Floats must also be finite.
_MEASURE_MIN = {"budget_s": (0, False), "min_samples": (1, True), "max_samples": (1, True),
                "target_rel_ci": (0, True), "warmup_calls": (0, True), "min_sample_s": (0, True),
                "threads": (1, True), "point_timeout_s": (0, False), "passes": (1, True),
                "order_seed": (0, True), "time_limit_s": (0, False)}
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
    # replay the timed call from a CUDA graph (True), eagerly (False), or as the scenario does
    # by default (None: decode graphs its step on CUDA, the others run eagerly)
    cuda_graph: bool | None = None
    options: tuple[tuple[str, str], ...] = ()  # the scenario's own [measure] options, by name
    # seconds for the whole run: a cut run keeps its finished rows (docs/time_limit.md)
    time_limit_s: float | None = None


@dataclass(frozen=True)
class Suite:
    name: str
    scenario: str
    path: str
    points: tuple[Point, ...]
    measure: MeasureConfig
    sha256: str  # of the file's bytes (env.json: suite_fingerprint): resume refuses another suite
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


def parse_suite(doc: dict, where: str = "<suite>", sha256: str = "") -> Suite:
    """Validate a parsed TOML document and expand it into points."""
    err = SuiteReporter(where)
    if not doc:
        raise SuiteError(f"{where}: empty suite file (a suite needs name, scenario and "
                         "implementations; suites/smoke.toml is an example)")
    if "claim" in doc and "scenario" not in doc:  # `attnbench run suites/claims.toml`
        raise SuiteError(f"{where}: a claims file ([[claim]] entries), not a suite; judge runs "
                         f"with it: attnbench claims RUN_DIR --claims {where}")
    name, scenario, impls = _top_level(doc, err)
    device = doc.get("device", "cpu")
    fixed = table(doc, "fixed", err)
    sweep = table(doc, "sweep", err)
    variants = doc.get("variant", [])
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        err.fail("variant", variants, "must be an array of tables ([[variant]])")
    axes = suite_axes(interface.get(scenario), impls, variants, err)
    axes.validate(fixed, "fixed", err, lists=False)
    axes.validate(sweep, "sweep", err, lists=True)
    both = set(fixed) & set(sweep)
    if both:
        key = sorted(both)[0]
        err.fail(f"sweep.{key}", sweep[key], "also set in [fixed]; set it in one place")
    base = {"device": device, **fixed}
    validate_value("device", device, err)
    runs = entries(impls, variants, axes.scenario, axes, err)
    points = expand_points(runs, scenario, base, sweep, axes, err)
    return Suite(
        name=name,
        scenario=scenario,
        path=where,
        points=points,
        measure=_measure(doc.get("measure", {}), err, scenario),
        sha256=sha256,
        description=doc.get("description", ""),
    )


def _top_level(doc: dict, err: SuiteReporter) -> tuple[str, str, list[str]]:
    """(name, scenario, implementations) after checking the top-level keys."""
    unknown = set(doc) - TOP_KEYS
    if unknown:
        key = sorted(unknown)[0]
        err.fail(key, doc[key], unknown_key(key, TOP_KEYS))
    name = required(doc, "name", str, err)
    if not NAME_RE.fullmatch(name):
        err.fail("name", name, "use 1-100 letters, digits, '.', '_', '-' (it names the run folder)")
    if not isinstance(doc.get("description", ""), str):
        err.fail("description", doc["description"], "must be a string")
    scenario = required(doc, "scenario", str, err)
    if scenario not in interface.names():
        err.fail("scenario", scenario, f"unknown scenario (one of {list(interface.names())})")
    impls = doc.get("implementations", [])
    if not isinstance(impls, list) or not all(isinstance(i, str) for i in impls):
        err.fail("implementations", impls, "must be a list of implementation names")
    return name, scenario, impls


def _measure(settings: dict, err: SuiteReporter, scenario: str) -> MeasureConfig:
    """``[measure]`` as a MeasureConfig (every key typed and bounded; the scenario's own keys
    one of their choices)."""
    own = _scenario_options(settings, err, scenario)
    _measure_values({k: v for k, v in settings.items() if k not in own}, err, scenario)
    timing_keys = {f.name for f in fields(TimingConfig)}
    try:
        timing = replace(TimingConfig(), **{k: v for k, v in settings.items() if k in timing_keys})
    except ValueError as exc:
        err.fail("measure", settings, str(exc))
    check = settings.get("check", "auto")
    if check not in CHECK_EXTENTS:
        err.fail("measure.check", check, f"must be {'|'.join(CHECK_EXTENTS)}")
    threads = settings.get("threads")
    if threads is not None and threads > MAX_THREADS:
        err.fail("measure.threads", threads, f"must be <= {MAX_THREADS}")
    if settings.get("passes", 1) > MAX_PASSES:
        err.fail("measure.passes", settings["passes"], f"must be <= {MAX_PASSES}")
    return MeasureConfig(
        passes=settings.get("passes", 3),
        order_seed=settings.get("order_seed", 0),
        timing=timing,
        check=check,
        threads=threads,
        flush_l2=settings.get("flush_l2", False),
        isolate=settings.get("isolate", False),
        point_timeout_s=settings.get("point_timeout_s"),
        cuda_graph=settings.get("cuda_graph"),
        options=tuple(sorted(own.items())),
        time_limit_s=settings.get("time_limit_s"),
    )


def _scenario_options(settings: dict, err: SuiteReporter, scenario: str) -> dict[str, str]:
    """The ``[measure]`` keys that the suite's scenario declares, each one of its choices."""
    if not isinstance(settings, dict):
        err.fail("measure", settings, "must be a table")
    declared = interface.get(scenario).measure_options
    own = {k: v for k, v in settings.items() if k in declared}
    for key, value in own.items():
        if value not in declared[key].choices:
            err.fail(f"measure.{key}", value, f"must be one of {list(declared[key].choices)}")
    return own


def _owner(key: str) -> str | None:
    """The scenario whose own ``[measure]`` options include ``key`` (None: none does)."""
    return next((w for w in interface.names() if key in interface.get(w).measure_options), None)


def _measure_values(settings: dict, err: SuiteReporter, scenario: str) -> None:
    """Each general ``[measure]`` key known, of its type, finite and within its lower bound."""
    for key, value in settings.items():
        if key not in MEASURE_KEYS:
            owner = _owner(key)
            if owner is not None:
                err.fail(f"measure.{key}", value, f"an option of {owner} suites; this suite's "
                         f"scenario is {scenario}")
            allowed = sorted({*MEASURE_KEYS, *interface.get(scenario).measure_options})
            err.fail(f"measure.{key}", value, unknown_key(key, allowed))
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
