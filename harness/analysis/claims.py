"""Claims: statements from the literature, checked against result rows.

A claims file (TOML) holds ``[[claim]]`` entries. Common keys: ``id``, ``source``, ``text``,
``metric`` (a row column), ``over`` (the swept variable, the derived ``window`` = keys per
query, or ``document_len`` = the token-weighted mean length of packed documents), and row
filters ``impl``, ``scenario``, ``where = {column = value}``, ``range = [lo, hi]`` (of
``over``), ``hold = [fields]`` (kept fixed per fit, e.g. d_model in a heads sweep). Forms:

- exponent: ``expect_exponent`` and ``tolerance`` (``bound = "both" | "upper" | "lower"``,
  ``model = "power" | "power+const"``, ``min_points``): the fitted slope's interval against
  ``[e - t, e + t]`` (or its upper/lower side).
- ratio: ``baseline`` (impl; ``baseline_where`` for other filters), ``expect_ratio_min`` and/or
  ``expect_ratio_max``, ``ratio = "impl/baseline" | "baseline/impl"``: metric ratios at matched
  points; measured = their geometric mean, interval = the envelope of the per-point intervals
  (so "2-4x at n = 1k..8k" must hold at every n in the range). With ``relative_to`` equal to
  ``over``, the band is in units of the axis: each point's ratio is divided by its ``over``
  value ("the padded step costs B·max / Σ times the ragged one": ``over = relative_to =
  "padding_factor"``, the band [0.8, 1.25]).
- trend: ``baseline`` with ``expect_exponent`` and ``tolerance`` (``bound``, ``ratio``): the
  exponent of the metric ratio along ``over`` at matched points, a power law fitted to the
  per-point ratios with their bootstrap errors. "The padded step costs B·max / Σ times the
  ragged one" says the ratio grows as padding_factor^1, whatever the two paths' speeds at no
  padding (a ratio band in units of the axis would also ask them to be equal there).
- crossover: ``baseline``, ``expect_crossover_min``/``_max``: the ``over`` at which ``impl``
  and the baseline cost the same, censored at the sweep's ends. ``cheaper = "below"`` (the
  default: ``impl`` is the cheaper one below the crossover) or ``"above"``. With
  ``relative_to`` (a column, e.g. ``d_model``) the crossover is in units of that column
  ("cheaper while n < d"); without it, in units of ``over`` itself, an absolute range of the
  swept axis ("crosses over between n = 512 and 1024").
- bound: ``expect_value_min`` and/or ``expect_value_max``: the metric itself at every point
  (``bw_fraction >= 0.8``, ``time_median_s <= 1e-3``), each point's interval from its samples
  (:mod:`harness.analysis.bounds`), judged along the axis as a ratio claim is.

Regime keys (all optional; docs/claims.md): ``concerns = "work" | "device" | "both"`` (default:
both for an exponent of a timed metric, else device), ``work = "flops" | "bytes"`` (the
analytic count a work verdict fits), ``plateau`` (default 0.15: time verdicts only over the
region where the exponent of utilization along ``over`` is within ±plateau),
``saturation`` (default 0: off; an extra floor, a fraction of the bound that every row of the
region must reach) and ``saturation_rule = "roofline" | "peak"`` (the bound utilization is a
fraction of); ``min_x`` (a lower bound on ``over`` that the claim states, e.g. where its
asymptotics start); ``time_basis = "absolute" | "normalized"`` (a ``time_median_s`` claim:
``normalized`` divides each timing pass's samples by the reference kernel's time in that pass,
:mod:`harness.measure.refkernel`, so a machine whose speed shifts between passes, another
tenant on the core's sibling, moves both and cancels;
:func:`harness.analysis.frames.normalized_time`).

This module is the :class:`Claim` type and the parsing of the file, once;
:mod:`harness.analysis.verdicts` judges each claim.
"""

from __future__ import annotations

import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from harness import bundled
from harness.analysis.powerfit import MODELS
from harness.errors import CliError
from harness.fmt import did_you_mean
from harness.schema import COLUMNS

DEFAULT_CLAIMS = bundled("claims.toml")  # the installed copy, or the checkout's suites/
VERDICTS = ("confirmed", "refuted", "mixed", "holds in part", "inconclusive")
BOUNDS = ("both", "upper", "lower")
RATIOS = ("impl/baseline", "baseline/impl")
CONCERNS = ("work", "device", "both")
TIME_BASES = ("absolute", "normalized")
CHEAPER = ("below", "above")
PLATEAU = 0.15  # default: utilization is level where its exponent along the axis is within ±this
SATURATION = 0.0  # default: no floor on utilization (the plateau rule decides)
# the times of a timed call and the rates of one (each scenario declares its own: Column.timed)
TIMED_METRICS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.timed)
METRIC_NAMES: frozenset[str] = frozenset(c.name for c in COLUMNS)  # every row schema's columns


@dataclass(frozen=True)
class Claim:
    """One ``[[claim]]`` entry; ``kind`` is derived from which expectation keys are set."""

    id: str
    metric: str
    over: str
    source: str = ""
    text: str = ""
    impl: str | None = None
    scenario: str | None = None
    where: dict = field(default_factory=dict)
    hold: tuple[str, ...] = ()
    range: tuple[float, float] | None = None
    expect_exponent: float | None = None
    tolerance: float = 0.2
    bound: str = "both"
    model: str = "power"
    min_points: int | None = None
    baseline: str | None = None
    baseline_where: dict | None = None
    ratio: str = "impl/baseline"
    expect_ratio_min: float | None = None
    expect_ratio_max: float | None = None
    expect_crossover_min: float | None = None
    expect_crossover_max: float | None = None
    expect_value_min: float | None = None
    expect_value_max: float | None = None
    relative_to: str | None = None
    cheaper: str = "below"
    min_x: float | None = None
    concerns: str | None = None
    work: str = "flops"
    plateau: float = PLATEAU
    saturation: float = SATURATION
    saturation_rule: str = "roofline"
    time_basis: str = "absolute"

    @property
    def timed(self) -> bool:
        """Is the metric a time (or a rate derived from one)? Its verdicts need the plateau."""
        return self.metric in TIMED_METRICS

    @property
    def aspects(self) -> tuple[str, ...]:
        """What the claim is judged on: ``("device",)``, ``("work",)`` or both. By default an
        exponent of a timed metric is a complexity claim, judged on both."""
        concerns = self.concerns
        if concerns is None:
            concerns = "both" if self.kind == "exponent" and self.timed else "device"
        return {"both": ("work", "device"), "work": ("work",), "device": ("device",)}[concerns]

    @property
    def kind(self) -> str:
        if self.expect_exponent is not None:
            return "trend" if self.baseline is not None else "exponent"
        if self.expect_crossover_min is not None or self.expect_crossover_max is not None:
            return "crossover"
        if self.expect_value_min is not None or self.expect_value_max is not None:
            return "bound"
        return "ratio"

    @property
    def band(self) -> tuple[float, float]:
        """The interval a measurement must lie in to confirm the claim."""
        inf = float("inf")
        if self.kind in ("exponent", "trend"):
            e, t = self.expect_exponent, self.tolerance
            return (
                -inf if self.bound == "upper" else e - t,
                inf if self.bound == "lower" else e + t,
            )
        lo, hi = {
            "ratio": (self.expect_ratio_min, self.expect_ratio_max),
            "crossover": (self.expect_crossover_min, self.expect_crossover_max),
            "bound": (self.expect_value_min, self.expect_value_max),
        }[self.kind]
        return (-inf if lo is None else lo, inf if hi is None else hi)

    def in_ratio_order(self, impl_side: object, baseline_side: object) -> tuple:
        """The implementation's and the baseline's sides as the claim's ratio reads them:
        (numerator, denominator)."""
        if self.ratio == "impl/baseline":
            return impl_side, baseline_side
        return baseline_side, impl_side

    def expected(self) -> str:
        if self.kind in ("exponent", "trend"):
            sign = {"both": "±", "upper": "≤ +", "lower": "≥ -"}[self.bound]
            band = f"{self.expect_exponent:g} {sign}{self.tolerance:g}"
            if self.kind == "exponent":
                return band
            top, bottom = self.in_ratio_order(self.impl, self.baseline)
            return f"{band} ({top}/{bottom})"
        lo, hi = self.band
        if self.kind == "bound":
            return " and ".join(([f"{self.metric} >= {lo:g}"] if lo > -float("inf") else [])
                                + ([f"{self.metric} <= {hi:g}"] if hi < float("inf") else []))
        if self.kind == "ratio":
            return f"[{lo:g}, {hi:g}]" + (f" x {self.relative_to}" if self.relative_to else "")
        unit = f" x {self.relative_to}" if self.relative_to else f" {self.over}"
        side = "" if self.cheaper == "below" else f" ({self.impl} cheaper above)"
        return f"[{lo:g}, {hi:g}]{unit}{side}"


# --- parsing -------------------------------------------------------------------------------

def _toml_types(hint: object) -> tuple[type, ...]:
    """The TOML values a field of this annotation takes: a float field takes an integer too,
    a tuple field an array; None is the absence of the key."""
    if isinstance(hint, types.UnionType):  # X | None: the key is absent for None
        hint = next(k for k in typing.get_args(hint) if k is not type(None))
    kind = typing.get_origin(hint) or hint
    return {float: (int, float), tuple: (list,)}.get(kind, (kind,))


# every Claim field is a claims-file key, of the types its annotation says
_TYPES = {name: _toml_types(hint) for name, hint in typing.get_type_hints(Claim).items()}
_CHOICES = {
    "bound": BOUNDS,
    "model": MODELS,
    "ratio": RATIOS,
    "cheaper": CHEAPER,
    "concerns": CONCERNS,
    "work": ("flops", "bytes"),
    "saturation_rule": ("roofline", "peak"),
    "time_basis": TIME_BASES,
}


class ClaimsError(CliError):
    """A claims file that cannot be used: names the file, the claim, the key and the value."""


def load_claims(path: str | Path) -> list[Claim]:
    """Read and validate a claims TOML file."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ClaimsError(f"{path}: claims file not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ClaimsError(f"{path}: cannot read claims: {exc}") from None
    return parse_claims(doc, str(path))


def parse_claims(doc: dict, where: str = "<claims>") -> list[Claim]:
    """Validate a parsed claims document; one readable line per problem (the first found)."""
    extra = set(doc) - {"claim", "description"}
    if extra:
        key = sorted(extra)[0]
        raise ClaimsError(
            f"{where}: {key} = {doc[key]!r}: unknown key (allowed: claim, description)"
        )
    entries = doc.get("claim")
    if (
        not isinstance(entries, list)
        or not entries
        or not all(isinstance(e, dict) for e in entries)
    ):
        raise ClaimsError(f"{where}: claim: needs one or more [[claim]] tables")
    claims, seen = [], set()
    for index, entry in enumerate(entries):
        claim = _parse_one(entry, f"{where}: claim[{index}]")
        if claim.id in seen:
            raise ClaimsError(f"{where}: claim[{index}].id = {claim.id!r}: duplicate id")
        seen.add(claim.id)
        claims.append(claim)
    return claims


def check_names(claims: list[Claim], impls: set[str], columns: set[str], where: str) -> None:
    """Refuse (:class:`ClaimsError`, one line, exit 2, "did you mean") a claim whose ``metric``
    no row schema declares (:data:`METRIC_NAMES`) and no row has (``columns``), or whose
    ``impl`` or ``baseline`` is none of ``impls`` (the registry's names, the scenarios' baselines,
    the rows' implementations): a typo would otherwise be folded into "claims these runs cannot
    judge", exit 0."""
    metrics = METRIC_NAMES | columns
    for index, claim in enumerate(claims):
        if claim.metric not in metrics:
            raise ClaimsError(
                f"{where}: claim[{index}] ({claim.id}).metric = {claim.metric!r}: no row schema "
                f"has this column{did_you_mean(claim.metric, METRIC_NAMES)} (results/README.md "
                "lists them)"
            )
        for key in ("impl", "baseline"):
            name = getattr(claim, key)
            if name is not None and name not in impls:
                raise ClaimsError(
                    f"{where}: claim[{index}] ({claim.id}).{key} = {name!r}: no registered "
                    f"implementation and no row has this name{did_you_mean(name, impls)} "
                    "(attnbench list shows them; a plug-in's: --plugin FILE)"
                )


def _forms(entry: dict) -> list[bool]:
    """Which expectation keys an entry sets: [exponent, ratio, crossover, bound]."""
    return [
        any(k in entry for k in keys)
        for keys in (
            ("expect_exponent",),
            ("expect_ratio_min", "expect_ratio_max"),
            ("expect_crossover_min", "expect_crossover_max"),
            ("expect_value_min", "expect_value_max"),
        )
    ]


def _parse_one(entry: dict, at: str) -> Claim:
    if isinstance(entry.get("id"), str):
        at = f"{at} ({entry['id']})"

    def fail(key: str, problem: str):
        raise ClaimsError(f"{at}.{key} = {entry.get(key)!r}: {problem}")

    for key, value in entry.items():
        if key not in _TYPES:
            fail(key, f"unknown key (allowed: {', '.join(sorted(_TYPES))})")
        if isinstance(value, bool) or not isinstance(value, _TYPES[key]):
            fail(key, f"must be {' or '.join(t.__name__ for t in _TYPES[key])}")
        if key in _CHOICES and value not in _CHOICES[key]:
            fail(key, f"must be one of {list(_CHOICES[key])}")
    for key in ("id", "metric", "over"):
        if key not in entry:
            fail(key, "required key missing")
    values = dict(entry)
    if "range" in values:
        rng = values["range"]
        if len(rng) != 2 or not all(isinstance(v, int | float) for v in rng) or rng[0] > rng[1]:
            fail("range", "must be [low, high] numbers with low <= high")
        values["range"] = (float(rng[0]), float(rng[1]))
    for key in ("where", "baseline_where"):
        bad = [k for k, v in values.get(key, {}).items() if not isinstance(v, str | int | float)]
        if bad:
            fail(key, f"{bad[0]}: filter values must be strings, numbers or booleans")
    if values.get("min_points", 2) < 2:
        fail("min_points", "must be >= 2")
    if "hold" in values:
        if not all(isinstance(v, str) for v in values["hold"]):
            fail("hold", "must be a list of column names")
        values["hold"] = tuple(values["hold"])
    forms = _forms(entry)
    if sum(forms) != 1:
        fail(
            "id",
            "set exactly one of expect_exponent, expect_ratio_min/max, "
            "expect_crossover_min/max, expect_value_min/max",
        )
    if (forms[1] or forms[2]) and "baseline" not in entry:
        fail("baseline", "ratio and crossover claims need a baseline implementation")
    if forms[3] and ("baseline" in entry or "baseline_where" in entry):
        fail("baseline", "a bound claim is on one implementation's rows: no baseline")
    lo, hi = values.get("expect_value_min"), values.get("expect_value_max")
    if lo is not None and hi is not None and lo > hi:
        fail("expect_value_min", f"must be <= expect_value_max ({hi!r})")
    if "cheaper" in entry and not forms[2]:
        fail("cheaper", "only crossover claims take this key")
    if "relative_to" in entry and not forms[2]:
        if not forms[1]:
            fail("relative_to", "only crossover and ratio claims take this key")
        if entry["relative_to"] != entry.get("over"):
            fail("relative_to", f"a ratio claim's band is in units of its axis: must be over "
                                f"({entry.get('over')!r})")
    if forms[0] and "baseline" in entry:  # a trend: the exponent of a ratio
        if values.get("model", "power") != "power":
            fail("model", "a trend (an exponent with a baseline) fits the ratio as a power law: "
                          "\"power\" only")
        if values.get("concerns", "device") != "device":
            fail("concerns", "a trend (an exponent with a baseline) has no work verdict")
    if values.get("tolerance", 0.2) <= 0:
        fail("tolerance", "must be > 0")
    if not 0 <= values.get("saturation", SATURATION) < 1:
        fail("saturation", "must be a fraction in [0, 1) (0 = no floor on utilization)")
    if not 0 < values.get("plateau", PLATEAU) < 1:
        fail("plateau", "must be in (0, 1): the utilization exponent band, e.g. 0.15")
    if "concerns" in values and values["concerns"] != "device" and not forms[0]:
        fail("concerns", "work verdicts are for exponent claims only")
    if values.get("time_basis") == "normalized" and values["metric"] != "time_median_s":
        fail("time_basis", "normalized time is for metric = \"time_median_s\"")
    if "min_x" in values:
        values["min_x"] = float(values["min_x"])
    return Claim(**values)

