"""The rules one suite value must follow, and the one-line :class:`SuiteError` that names the
file, the key and the value when it does not.

The keys of ``[fixed]``, ``[sweep]`` and ``[[variant]]`` are the point fields (shape, mask,
dtype/device), the settings of the suite's scenario (declared with the scenario:
:attr:`harness.scenarios.interface.Scenario.settings`) and the method parameters the suite's
implementations declare (:class:`harness.spec.Param`). :class:`Axes` holds the rules of one
suite; a value is checked here on its own (type, allowed words, sign); rules between fields
(``d_model % heads``, the mask fields together, a parameter's range for each implementation)
are checked when the point is built (:mod:`harness.sweep.expand`). The rule for mask settings
at a point is :func:`check_mask` (docs/masks.md, "What a suite may ask for"): the suite and
``attnbench maxlen`` (whose ``--set KEY=VALUE`` is :func:`assignment`) refuse through it alike.
An unknown key names the nearest known one (:func:`unknown_key`).

A value that is itself a list: a window is ``[left, right]``; ``documents`` may be the list of
lengths; ``global_tokens`` may be the list of positions. In ``[fixed]`` such a list is the one
value; in ``[sweep]`` and a ``[[variant]]`` a list of numbers is a sweep (of counts for
``global_tokens``), so a list of positions or lengths is swept as a list of lists.
"""

from __future__ import annotations

import math
import tomllib
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from harness import fmt
from harness.errors import SuiteError
from harness.mask_features.window import spelled
from harness.masks import MaskError, check_fits
from harness.scenarios import interface, packing
from harness.scenarios.interface import Scenario, settings_types
from harness.scenarios.suite_mask import PointMask, suite_types
from harness.spec import DTYPES, Param

DEVICES = ("cpu", "cuda", "auto")
# fmt: off
# Point fields a suite may set, with their types (bool is checked before int: True is an int).
# The mask columns' types come from the MaskSpec (harness.scenarios.suite_mask).
FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "device": str, "dtype": str, "batch": int, "seq_len": int, "q_len": int, "heads": int,
    "kv_heads": int, "head_dim": int, **suite_types(),
}
SHAPE_AXES = set(FIELD_TYPES) | {"window", "d_model"}
_CHOICES = {"dtype": tuple(DTYPES), "device": DEVICES}
_POSITIVE = {"batch", "seq_len", "q_len", "heads", "kv_heads", "head_dim", "dilation",
             "block_size", "d_model"}
_NON_NEGATIVE = {"random_blocks", "seed", "prefix_len"}
LIST_VALUES = {"window", "documents", "global_tokens"}  # keys whose one value may be a list
# fmt: on


def unknown_key(key: str, allowed: Iterable[str], kind: str = "allowed") -> str:
    """The problem of an unknown ``key``: the nearest allowed key first (a typo is the usual
    cause), then every allowed key."""
    allowed = sorted(allowed)
    return f"unknown key{fmt.did_you_mean(key, allowed)} ({kind}: {allowed})"


def settings_owners(key: str) -> list[str]:
    """The scenarios (folder names) that declare a setting ``key``."""
    words = [w for w in interface.names() if key in settings_types(interface.get(w))]
    return sorted({w.split("+")[0] for w in words})


def assignment(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` as a suite line would read it: VALUE is a TOML value (``true``, ``64``,
    ``[255, 0]``, ``"uniform:512"``); a VALUE that is not TOML is taken as a string, so
    ``documents=uniform:512`` needs no quotes. Raises SuiteError (one line)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.replace("_", "").isalnum():
        shown = one_line(repr(text), 120)
        raise SuiteError(f"--set {shown}: must be KEY=VALUE, e.g. prefix_len=64")
    try:
        return key, tomllib.loads(f"value = {raw.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        return key, raw.strip()


def one_line(text: str, limit: int = 400) -> str:
    """``text`` as a single line (control characters escaped), cut to ``limit`` characters."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SuiteReporter:
    """Raises the one-line SuiteError of a suite file: ``<where>: <key> = <value>: <problem>``."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, value, problem: str):
        shown = one_line(repr(value), 120)
        raise SuiteError(one_line(f"{self.where}: {key} = {shown}: {problem}", 600))


def required(doc: dict, key: str, kind: type, err: SuiteReporter):
    """``doc[key]``, which must be present and a ``kind``."""
    if key not in doc:
        raise SuiteError(f"{err.where}: {key}: required key missing")
    if not isinstance(doc[key], kind):
        err.fail(key, doc[key], f"must be a {kind.__name__}")
    return doc[key]


def table(doc: dict, key: str, err: SuiteReporter) -> dict:
    """The TOML table ``doc[key]`` ({} when absent)."""
    value = doc.get(key, {})
    if not isinstance(value, dict):
        err.fail(key, value, "must be a table")
    return value


def _numbers(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(s, int) and not isinstance(s, bool) for s in value
    )


def is_swept(key: str, value, lists: bool | None = None) -> bool:
    """Is ``value`` a list of values for ``key``? A window pair is one value, so is a list of
    document lengths, and a list of global positions in ``[fixed]`` (``lists`` False)."""
    if not isinstance(value, list):
        return False
    if key == "window":
        return not (len(value) == 2 and _numbers(value))
    if key == "documents":
        return not (value and _numbers(value))
    if key == "global_tokens":
        return not (lists is False and _numbers(value))
    return True


@dataclass(frozen=True)
class Axes:
    """The keys one suite's tables may use: the point fields, the settings of its scenario and
    the parameters its implementations declare (name -> the declarations, one per
    implementation that declares it)."""

    scenario: Scenario
    params: dict[str, list[Param]] = field(default_factory=dict)

    @property
    def settings(self) -> dict[str, type]:
        return settings_types(self.scenario)

    def known(self) -> list[str]:
        return sorted(SHAPE_AXES | set(self.settings) | set(self.params))

    def validate(self, axes: dict, where: str, err: SuiteReporter, lists: bool | None) -> None:
        """Every key known; lists=True: every value a non-empty list; False: scalars;
        None: either."""
        for key, value in axes.items():
            if key not in SHAPE_AXES and key not in self.settings and key not in self.params:
                owners = settings_owners(key)
                if owners:  # not a typo: the setting of another scenario
                    problem = f"unknown key: a setting of {' and '.join(owners)} suites only"
                    err.fail(f"{where}.{key}", value, problem)
                err.fail(f"{where}.{key}", value, unknown_key(key, self.known(), "point fields"))
            swept = is_swept(key, value, lists)
            if lists is True and not swept:
                err.fail(f"{where}.{key}", value, "[sweep] values must be lists")
            if lists is False and swept:
                problem = "must be a single value (lists belong in [sweep])"
                err.fail(f"{where}.{key}", value, problem)
            values = value if swept else [value]
            if swept and not values:
                err.fail(f"{where}.{key}", value, "empty list")
            for item in values:
                self.value(key, item, err, f"{where}.{key}")

    def value(self, key: str, value, err: SuiteReporter, at: str | None = None) -> None:
        """One value of ``key``: its type, allowed words and sign."""
        at = at or key
        if key in self.settings:
            _setting_value(self.scenario, key, self.settings[key], value, err, at)
        elif key in self.params:
            if isinstance(value, bool) or not isinstance(value, int | float):
                err.fail(at, value, "must be a number (a method parameter)")
            if isinstance(value, float) and not math.isfinite(value):
                err.fail(at, value, "must be a finite number")
        else:
            validate_value(key, value, err, at)


def validate_value(key: str, value, err: SuiteReporter, at: str | None = None) -> None:
    """One value of point field ``key``: its type, allowed words and sign."""
    at = at or key
    if key == "window":
        if not (_numbers(value) and len(value) == 2) or any(s < -1 for s in value):
            err.fail(at, value, "a window is [left, right] with sides >= -1 (-1 = unbounded)")
        return
    kind = int if key == "d_model" else FIELD_TYPES[key]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        err.fail(at, value, f"must be {names}")
    if key in _CHOICES and value not in _CHOICES[key]:
        err.fail(at, value, f"must be one of {list(_CHOICES[key])}")
    if key in _POSITIVE and value <= 0:
        err.fail(at, value, "must be > 0")
    if key in _NON_NEGATIVE and value < 0:
        err.fail(at, value, "must be >= 0")
    if key in ("window_left", "window_right") and value < -1:
        err.fail(at, value, "must be >= -1 (-1 = unbounded)")
    if key == "documents":
        try:
            packing.parse(value)
        except ValueError as exc:
            err.fail(at, value, str(exc))
    if key == "global_tokens":
        if isinstance(value, int) and value < 0:
            err.fail(at, value, "must be >= 0")
        if isinstance(value, list) and (not _numbers(value) or min(value, default=0) < 0):
            err.fail(at, value, "global positions are whole numbers >= 0")


def _setting_value(scenario: Scenario, key: str, hint, value, err: SuiteReporter, at: str) -> None:
    """A value of one of the scenario's settings: its annotated type and its field metadata
    (``choices``, inclusive ``minimum``, exclusive ``above``)."""
    kinds = typing.get_args(hint) or (hint,)
    if float in kinds:
        kinds = (*kinds, int)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        err.fail(at, value, f"must be {'/'.join(k.__name__ for k in kinds)}")
    if isinstance(value, float) and not math.isfinite(value):
        err.fail(at, value, "must be a finite number")
    meta = next(f.metadata for f in fields(scenario.settings) if f.name == key)
    if "choices" in meta and value not in meta["choices"]:
        err.fail(at, value, f"must be one of {list(meta['choices'])}")
    if "minimum" in meta and value < meta["minimum"]:
        err.fail(at, value, f"must be >= {meta['minimum']}")
    if "above" in meta and value <= meta["above"]:
        err.fail(at, value, f"must be > {meta['above']}")


# The one rule for mask settings at a point (docs/masks.md, "What a suite may ask for").
def check_mask(masking: PointMask, n_q: int, n_k: int) -> None:
    """Raise :class:`MaskError` (one line naming the setting and its value) when a setting of
    ``masking`` cannot be honoured by a point of ``n_q`` queries over ``n_k`` keys.

    The rule: a setting is refused when it names a position or a length the point does not
    have (``global_tokens = g`` names positions 0..g-1, ``prefix_len = P`` positions 0..P-1,
    counted in the longest document when there are documents; a documents rule names its
    length; documents as lengths must tile the sequence), or when it asks for keys another
    setting of the same mask removes (a window's right side > 0 with ``causal``). Everything
    else is accepted and means what the mask rules say (a window side longer than the sequence
    bounds nothing, like -1)."""
    spec = masking.spec
    if spec.causal and spec.right not in (None, 0):
        window = [spelled(spec.left), spec.right]
        raise MaskError(
            f"window = {window} with causal = true: causal removes every key after the query, "
            f"so the right side {spec.right} asks for keys it removes (use [{window[0]}, 0])"
        )
    docs = masking.documents
    nominal = packing.nominal_length(docs) if docs is not None else None
    if nominal is not None and nominal > n_k:
        raise MaskError(
            f"documents = {packing.text(docs)!r}: documents of {nominal:g} tokens are longer "
            f"than the sequence ({n_k} tokens)"
        )
    resolved = masking.resolve(n_k)
    longest = max(resolved.documents) if resolved.documents else n_k
    where = (
        f"the longest document ({longest} tokens)"
        if docs is not None
        else f"the sequence ({n_k} tokens)"
    )
    count = spec.global_tokens
    for key, size in (
        ("global_tokens", count if isinstance(count, int) else 0),
        ("prefix_len", spec.prefix_len),
    ):
        if size > longest:
            raise MaskError(
                f"{key} = {size}: names positions 0..{size - 1}, past the end of {where}"
            )
    # the MaskSpec's own length checks: documents that tile the sequence (n_q == n_k), global
    # positions inside it, block-sparse globals in whole blocks; then no contradictory row
    check_fits(resolved, n_q, n_k)


def shortest_length(masking: PointMask) -> int:
    """The shortest sequence whose length every setting of ``masking`` fits (the lengths and
    positions :func:`check_mask` asks for): what ``maxlen`` searches from."""
    spec, docs = masking.spec, masking.documents
    count = spec.global_tokens
    names = [
        count if isinstance(count, int) else count[-1] + 1,
        spec.prefix_len,
        math.ceil(packing.nominal_length(docs) or 0) if docs is not None else 0,
    ]
    if isinstance(docs, tuple):
        names.append(sum(docs))
    return max(1, *names)
