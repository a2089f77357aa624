"""The scenario interface: a :class:`Point`, what a :class:`Scenario` answers about it, and where
the scenarios are found.

A point is shape + mask + dtype/device + the settings of its scenario (a small frozen dataclass
the scenario declares, :attr:`Scenario.settings`) + the method parameters of its implementation.
Everything that depends on *what* is timed (the attention call, the cost model, the support
rules, the timed callable, the extra row columns) is the scenario's: the runner, the shard
planner, the analysis and the renderers ask it (:func:`get`, :func:`scenario_of`) and never test
a scenario's name.

The mask is one value, :class:`~harness.scenarios.suite_mask.PointMask` (the MaskSpec, with the
documents as the suite wrote them); :attr:`Point.mask` is the MaskSpec it makes for the
point's sequence length. Rows hold it flat, one column per MaskSpec field
(:mod:`harness.scenarios.suite_mask`).

Identity: :attr:`Point.point_id` is the sha1 of the JSON of :meth:`Point.fields` (sorted keys),
cut to 12 hex digits. ``fields()`` is flat, one entry per row column: the 26 fields every point
has had since the first results (the shape fields, the mask's
:data:`~harness.scenarios.suite_mask.FIRST_COLUMNS`, and :data:`FIRST_SETTINGS`: a setting that
the point's scenario does not have counts at the value it had then), plus every field added
since then (a mask field, a scenario setting, a method parameter) only when it is not at its
default. So a point that could be written before keeps its id, and committed baselines still
match.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache, cached_property
from typing import ClassVar

import torch

from harness import registry, scenarios
from harness.cost import memory_law
from harness.masks import MaskSpec
from harness.measure.device import Device
from harness.scenarios import packing, suite_mask
from harness.scenarios.case import Case, CaseOptions, CheckChoice, MeasureOption, choose_check
from harness.scenarios.figures import ReportPanel
from harness.scenarios.suite_mask import PointMask
from harness.spec import DTYPES, ParamValue, Problem

# the scenario settings of the first point ids, with the values they hashed when a point's
# scenario had no such setting (every point had all 26 fields then)
FIRST_SETTINGS: dict[str, object] = {
    "norm": "pre", "ffn": "gelu", "pos": "rope", "mixer": "attention", "conv_kernel": 3,
    "layers": 2, "cache": "full", "gen_tokens": 8,
}  # fmt: skip


class SettingsError(ValueError):
    """A suite value a scenario refuses: ``key`` and ``value`` name it, the message says why."""

    def __init__(self, key: str, value: object, problem: str):
        super().__init__(problem)
        self.key, self.value = key, value


@dataclass(frozen=True)
class Point:
    """One sweep point.

    q: (batch, heads, q_len or seq_len, head_dim); k/v: (batch, kv_heads, seq_len, head_dim).
    ``masking`` is the mask as the suite wrote it (:attr:`mask` realises it for seq_len);
    ``settings`` the scenario's settings dataclass (None: its defaults for ``impl``);
    ``params`` the implementation's method parameters set away from their declared defaults,
    sorted by name.
    """

    impl: str
    scenario: str = "attention"
    device: str = "cpu"
    dtype: str = "float32"
    batch: int = 1
    seq_len: int = 1024
    q_len: int | None = None  # queries when != seq_len (keys)
    heads: int = 8
    kv_heads: int | None = None  # grouped/multi-query K/V; None = heads
    head_dim: int = 64
    masking: PointMask = field(default_factory=PointMask)
    settings: typing.Any = None
    params: tuple[tuple[str, ParamValue], ...] = ()

    @classmethod
    def of(cls, impl: str, scenario: str = "attention", **fields: object) -> Point:
        """A point from flat fields, as a suite or a row spells them: the shape fields, the mask
        columns (``causal=True, window_left=255``), the scenario's settings (``cache="rolling"``)
        and the implementation's declared method parameters by name. A name that is none of
        these is a TypeError."""
        kind = get(scenario)
        types = settings_types(kind)
        params = declared_params(impl, {})
        shape = {f.name for f in SHAPE_FIELDS}
        unknown = set(fields) - shape - set(suite_mask.COLUMNS) - set(types) - set(params)
        if unknown:
            raise TypeError(f"not a field of a {scenario} point of {impl}: {sorted(unknown)}")
        settings = kind.make_settings(impl, {k: v for k, v in fields.items() if k in types})
        return cls(
            impl=impl,
            scenario=scenario,
            **{k: v for k, v in fields.items() if k in shape},
            masking=PointMask.from_columns(fields),
            settings=settings,
            params=tuple((k, v) for k, v in fields.items() if k in params),
        )

    def __post_init__(self) -> None:
        if self.settings is None:  # the scenario's defaults for this implementation
            object.__setattr__(self, "settings", get(self.scenario).make_settings(self.impl, {}))
        object.__setattr__(self, "params", _set_params(self.impl, self.params))

    @property
    def d_model(self) -> int:
        return self.heads * self.head_dim

    @property
    def n_q(self) -> int:
        return self.seq_len if self.q_len is None else self.q_len

    @property
    def backward(self) -> bool:
        return get(self.scenario).serves[self.scenario]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def mask(self) -> MaskSpec:
        """The mask of this point's sequence: ``masking`` with its documents realised."""
        return self.masking.resolve(self.seq_len)

    @property
    def seed(self) -> int:
        """The seed of the inputs (and of the mask's random blocks)."""
        return self.masking.spec.seed

    @property
    def document_lengths(self) -> tuple[int, ...] | None:
        """The realised lengths of the documents (None without documents)."""
        return self.mask.documents

    def attention_call(self, n_q: int, n_k: int, mask: MaskSpec, backward: bool = False) -> Problem:
        """One attention call of this point's shape and method parameters: q (B, H, n_q, D),
        k/v (B, H_kv, n_k, D) under ``mask``."""
        return Problem(
            batch=self.batch,
            heads=self.heads,
            n_q=n_q,
            n_k=n_k,
            head_dim=self.head_dim,
            dtype=self.torch_dtype,
            device=self.device,
            mask=mask,
            backward=backward,
            kv_heads=self.kv_heads,
            params=self.params,
        )

    def problem(self) -> Problem:
        """The attention call this point makes (per layer), as its scenario says."""
        return get(self.scenario).problem(self)

    def fields(self) -> dict:
        """The point as flat row columns: what :attr:`point_id` hashes (module docstring)."""
        return self._flat(complete=False)

    @property
    def point_id(self) -> str:
        """A short stable hash of :meth:`fields` (same point -> same id on every machine)."""
        blob = json.dumps(self.fields(), sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:12]

    def columns(self) -> dict:
        """The point's row columns: every field at its value, defaults included (its scenario's
        settings, its implementation's declared parameters), the realised document lengths and
        their token-weighted mean ``document_len``, d_model and point_id."""
        out = self._flat(complete=True)
        lengths = self.document_lengths
        if lengths is not None:
            out["document_lengths"] = list(lengths)
            out["document_len"] = packing.document_len(lengths)
        return {**out, "d_model": self.d_model, "point_id": self.point_id}

    def _flat(self, complete: bool) -> dict:
        """Flat fields; ``complete=False`` leaves out what was added after the first point ids
        while it is at its default (the id form), ``True`` keeps everything (the row form)."""
        out = {f.name: getattr(self, f.name) for f in SHAPE_FIELDS}
        out.update(self.masking.columns(complete))
        settings = dataclasses.asdict(self.settings)
        defaults = dataclasses.asdict(type(self.settings)())
        for name, first in FIRST_SETTINGS.items():
            out[name] = settings.pop(name, first)
        out.update({k: v for k, v in settings.items() if complete or v != defaults[k]})
        out.update(declared_params(self.impl, dict(self.params)) if complete else self.params)
        return out

    def label(self) -> str:
        """Short human label for progress bars and logs."""
        mask = self.mask.describe()
        grouped = f" kv_heads={self.kv_heads}" if self.kv_heads not in (None, self.heads) else ""
        return (
            f"{self.impl} {self.scenario} n={self.seq_len} B={self.batch} H={self.heads}"
            f"{grouped} D={self.head_dim} {self.dtype} {mask}"
        )


SHAPE_FIELDS = tuple(f for f in fields(Point) if f.name not in ("masking", "settings", "params"))
# a shape or mask column's default: what a row written without that column meant
FIELD_DEFAULTS: dict[str, object] = {
    **{f.name: f.default for f in SHAPE_FIELDS},
    **PointMask().columns(),
}


def declared_params(impl: str, given: dict[str, ParamValue]) -> dict[str, ParamValue]:
    """Every method parameter ``impl`` declares, at its value in ``given`` or its default ({}
    for a name the registry does not know: a scenario's own baseline)."""
    try:
        return registry.get(impl).param_values(given)
    except registry.UnknownImplementation:
        return {}


def _set_params(impl: str, params) -> tuple[tuple[str, ParamValue], ...]:
    """``params`` sorted, without the ones at their declared default (one spelling per point)."""
    params = tuple(sorted(dict(params).items()))
    if not params:
        return ()
    defaults = declared_params(impl, {})
    return tuple((k, v) for k, v in params if k not in defaults or defaults[k] != v)


# --- scenarios -------------------------------------------------------------------------------


class PointCost:
    """The analytic cost of one point, as its scenario models it. Every figure is computed when
    first read (the memory check before a point runs reads one, the runner after it others).

    FLOPs count a multiply-add as 2; bytes are compulsory traffic or allocated memory as named.
    """

    def __init__(self, point: Point):
        self.point = point

    @cached_property
    def problem(self) -> Problem:
        """The attention call the point makes (per layer), as its scenario says."""
        return self.point.problem()

    @property
    def useful_flops(self) -> float:
        """Useful FLOPs of the timed call (per generated token for a decode step)."""
        raise NotImplementedError

    @property
    def executed_flops(self) -> float:
        """FLOPs the timed call really executes (block granularity, recomputation)."""
        return self.useful_flops

    @property
    def compulsory_bytes(self) -> float:
        """Bytes any implementation must move at least once in the timed call (roofline)."""
        raise NotImplementedError

    @property
    def executed_bytes(self) -> float:
        """Bytes the timed call really moves at least once: its compulsory bytes, or more for
        an implementation that reads work it then masks (a decode step on the padded batch
        reads B·max slots of K/V): the bytes its ``executed_flops`` come with on a roofline."""
        return self.compulsory_bytes

    @property
    def call_bytes(self) -> int:
        """Predicted peak bytes the timed call allocates beyond its live inputs (what
        ``peak_mem_bytes`` measures)."""
        raise NotImplementedError

    @property
    def peak_bytes(self) -> int:
        """Predicted peak bytes of the whole point: the runner's memory-budget check."""
        raise NotImplementedError

    @property
    def mem_prediction(self) -> str:
        """How the workspace of the point's core call was predicted (``model``,
        ``declared-exponent (calibrated at n=...)`` or ``inputs``): :mod:`harness.cost.memory_law`;
        ``model`` for a scenario's own baseline (its own formula)."""
        try:
            return memory_law.workspace(self.point.impl, self.problem).how
        except registry.UnknownImplementation:
            return "model"

    @property
    def predicted_flops(self) -> float:
        """Every FLOP the point computes, untimed work included (a decode point's prefill): what
        the shard planner balances by."""
        return self.executed_flops

    def setup_calls(self, first: bool = True) -> int:
        """Core calls a pass makes outside the timing whose cost is their count, not their
        FLOPs (a decode prefill filled token by token: one small call per token and layer):
        the planner prices each at the device's per-call overhead. ``first``: a first pass
        (case, agreement check, memory pass), else a later one (the case built again)."""
        return 0

    def timed_work(self, column: str, kind: str) -> float:
        """Executed FLOPs (``kind="flops"``) or executed bytes (``"bytes"``) of what the time
        column ``column`` times, a pair of one call (a roofline's intensity is their ratio);
        ValueError for a column this scenario does not time."""
        if column != "time_median_s":
            raise ValueError(f"no work model for metric {column!r}")
        return self.executed_flops if kind == "flops" else self.executed_bytes

    def work(self, metric: str, kind: str = "flops") -> float:
        """The analytic work behind a row's ``metric``: the timed call's FLOPs or compulsory
        bytes for a time or rate, the predicted call bytes for ``peak_mem_bytes``."""
        if metric == "peak_mem_bytes":
            return float(self.call_bytes)
        if metric in ("tokens_per_s", "tflops_per_s"):
            metric = "time_median_s"
        return float(self.timed_work(metric, kind))


class Scenario:
    """What is timed for a point, and everything that depends on it. A folder registers one
    subclass with :func:`register`; class attributes declare it:

    - ``serves``: the suite's ``scenario`` words it serves -> whether that one runs backward;
    - ``settings``: its frozen settings dataclass (every field with a default; a field's
      ``metadata`` may give ``choices`` and a ``minimum``, which suites are checked against);
    - ``baselines``: implementations it runs itself, not from the registry -> their family;
    - ``core_exponents``: whether a row's time and memory in n are those of the attention core
      alone (so an implementation's declared exponents apply to them);
    - ``measure_options``: ``[measure]`` keys of its own (name -> :class:`MeasureOption`),
      which its suites may set and :meth:`build_case` reads from ``options.options``;
    - ``panels``: the report sections it adds (:mod:`harness.scenarios.figures`), drawn from
      its rows;
    - ``axes``: its own settings the report fits time against, beside the shape's.

    What the readers of rows make of a column it adds (its title, whether it is a time, whether
    tables show it by default) is declared with the column, in its folder's ``COLUMNS``.
    """

    serves: ClassVar[Mapping[str, bool]] = {}
    settings: ClassVar[type] = type(None)
    baselines: ClassVar[Mapping[str, str]] = {}
    core_exponents: ClassVar[bool] = False
    measure_options: ClassVar[Mapping[str, MeasureOption]] = {}
    panels: ClassVar[tuple[ReportPanel, ...]] = ()
    axes: ClassVar[tuple[str, ...]] = ()

    def make_settings(self, impl: str, values: dict) -> object:
        """The settings of ``impl``'s points from a suite's values for the settings fields
        (type-checked already); raises SettingsError for a combination it refuses."""
        return self.settings(**values)

    def point_errors(self, point: Point) -> list[SettingsError]:
        """Suite errors of a built point (rules between its fields); empty = none."""
        return []

    def core(self, point: Point) -> registry.Implementation | None:
        """The registry implementation the point plugs in (None for a scenario's baseline)."""
        return None if point.impl in self.baselines else registry.get(point.impl)

    def family(self, point: Point) -> str | None:
        """The family of the point's implementation (None when nobody registered it)."""
        if point.impl in self.baselines:
            return self.baselines[point.impl]
        try:
            return registry.get(point.impl).family
        except registry.UnknownImplementation:
            return None

    def problem(self, point: Point) -> Problem:
        """The attention call the point makes (per layer): support and FLOPs are judged on it."""
        raise NotImplementedError

    def cost(self, point: Point) -> PointCost:
        raise NotImplementedError

    def planned_columns(self, point: Point) -> dict:
        """Row columns the point's settings alone decide, known before it runs (a ragged
        batch's Σ lengths): a claim fitted along one of them plans its points by them (the
        judged groups of a time-limited run, ``attnbench verdicts``). Empty by default."""
        return {}

    def support(self, point: Point) -> list[str]:
        """Readable reasons why the point cannot run here (empty = it can)."""
        core = self.core(point)
        return [] if core is None else core.not_supported(self.problem(point))

    def declared_support(self, point: Point) -> list[str]:
        """Reasons from the implementation's *declared* capabilities alone (the same on every
        machine: what the shard planner may use)."""
        core = self.core(point)
        return [] if core is None else core.caps.reasons(self.problem(point))

    def build_case(self, point: Point, device: Device, options: CaseOptions) -> Case:
        """The point ready to run on ``device``: set-up done here, outside the timing."""
        raise NotImplementedError


_SCENARIOS: dict[str, Scenario] = {}


class UnknownScenario(KeyError):
    """A scenario word no folder registered."""

    def __str__(self) -> str:
        return str(self.args[0])


def register(cls: type[Scenario]) -> type[Scenario]:
    """Class decorator: serve every word of ``cls.serves`` with one instance of ``cls``."""
    instance = cls()
    for word in cls.serves:
        if word in _SCENARIOS and type(_SCENARIOS[word]) is not cls:
            raise ValueError(f"scenario {word!r} registered twice")
        _SCENARIOS[word] = instance
    return cls


def _load() -> None:
    """Import every module of every scenario folder (registration happens at import)."""
    for module in scenarios.modules():
        importlib.import_module(module)


def get(word: str) -> Scenario:
    """The scenario serving the suite word ``word`` (``"block+backward"``)."""
    if word not in _SCENARIOS:
        _load()
    try:
        return _SCENARIOS[word]
    except KeyError:
        raise UnknownScenario(f"unknown scenario {word!r} (one of {list(names())})") from None


def names() -> tuple[str, ...]:
    """Every scenario word, folder by folder (``attention``, ``attention+backward``, ...)."""
    _load()
    order = {folder: i for i, folder in enumerate(scenarios.folders())}
    words = sorted(_SCENARIOS, key=lambda w: (order.get(_folder(w), len(order)), w))
    return tuple(words)


def _folder(word: str) -> str:
    return type(_SCENARIOS[word]).__module__.split(".")[2]


def backward_pair(word: str) -> str | None:
    """The word of the same scenario that also runs backward (``attention`` ->
    ``attention+backward``), for a forward word; None for anything else (or an unknown word)."""
    try:
        serves = get(word).serves
    except UnknownScenario:
        return None
    if serves[word]:
        return None
    return next((w for w, backward in serves.items() if backward), None)


def each_scenario() -> list[Scenario]:
    """Every scenario once (one serves several words: ``block`` and ``block+backward``), in
    folder order."""
    return list({id(get(w)): get(w) for w in names()}.values())


def scenario_of(point: Point) -> Scenario:
    """The scenario of ``point``."""
    return get(point.scenario)


def check_choice(point: Point, requested: str = "auto") -> CheckChoice:
    """The agreement check ``point`` gets when ``requested`` (``auto``: full up to
    FULL_CHECK_MAX_PAIRS query-key pairs, sampled rows beyond)."""
    return choose_check(requested, point.n_q, point.seq_len, point.backward)


def cost_of(point: Point) -> PointCost:
    """The analytic cost of ``point`` as its scenario models it."""
    return get(point.scenario).cost(point)


def settings_types(scenario: Scenario) -> dict[str, type]:
    """The type of every settings field of ``scenario`` (annotations resolved)."""
    return dict(_field_types(scenario.settings))


@cache
def _field_types(cls: type) -> tuple[tuple[str, type], ...]:
    """(name, resolved annotation) of each field of a dataclass, resolved once per class:
    ``typing.get_type_hints`` evaluates every annotation string anew on each call (0.3 ms for
    Point, most of :func:`point_from_row`, which judging claims runs per row)."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in fields(cls))


def point_fields() -> tuple[str, ...]:
    """Every Point field as a row column, in the schema's order: the shape fields, the mask
    columns, then each scenario's settings (once each, folder by folder). Method parameters are
    not here: they are the implementations'."""
    out = [f.name for f in SHAPE_FIELDS] + list(suite_mask.COLUMNS)
    for word in names():
        out += [f.name for f in fields(get(word).settings) if f.name not in out]
    return tuple(out)


def point_from_row(row: Mapping) -> Point:
    """Rebuild a Point from a result row or :meth:`Point.fields` (extra columns ignored,
    NaN -> None, whole floats from pandas -> int)."""
    values = {k: _cell(v) for k, v in row.items()}
    scenario = get(values.get("scenario") or "attention")
    hints = dict(_field_types(Point))
    base = {
        f.name: _typed(values[f.name], hints[f.name])
        for f in SHAPE_FIELDS
        if values.get(f.name) is not None
    }
    masking = PointMask.from_columns(
        {k: _typed(values[k], t) for k, t in suite_mask.HINTS.items() if values.get(k) is not None}
    )
    types = settings_types(scenario)
    settings = scenario.settings(
        **{k: _typed(values[k], t) for k, t in types.items() if values.get(k) is not None}
    )
    declared = declared_params(base.get("impl", ""), {})
    params = {k: values[k] for k in declared if values.get(k) is not None}
    return Point(**base, masking=masking, settings=settings, params=tuple(params.items()))


def _cell(value: object) -> object:
    if isinstance(value, float) and value != value:  # NaN from pandas
        return None
    return value


def _typed(value: object, hint: object) -> object:
    """``value`` as the annotated type wants it: a whole float as int, 0/1 as bool."""
    kinds = typing.get_args(hint) or (hint,)
    if bool in kinds and not isinstance(value, str):
        return bool(value)
    if int in kinds and isinstance(value, float) and value.is_integer():
        return int(value)
    return value
