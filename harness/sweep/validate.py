"""The rules one suite value must follow, and the one-line :class:`SuiteError` that names the
file, the key and the value when it does not.

A point field set in ``[fixed]``, ``[sweep]`` or a ``[[variant]]`` is checked here on its own
(type, allowed words, sign); rules between fields (``d_model % heads``, the mask fields together)
are checked when the point is built (:mod:`harness.sweep.expand`).
"""

from __future__ import annotations

from harness.dtypes import DTYPES
from harness.errors import SuiteError
from harness.sweep.vocab import CACHES, DEVICES, FFNS, MIXERS, NORMS, POSITIONS

# fmt: off
# Point fields a suite may set, with their types (bool is checked before int: True is an int).
FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "device": str, "dtype": str, "batch": int, "seq_len": int, "q_len": int, "heads": int,
    "kv_heads": int, "head_dim": int, "causal": bool, "window_left": int, "window_right": int,
    "dilation": int, "global_tokens": int, "block_size": int, "random_blocks": int, "seed": int,
    "norm": str, "ffn": str, "pos": str, "mixer": str, "conv_kernel": int, "layers": int,
    "cache": str, "gen_tokens": int,
}
AXES = set(FIELD_TYPES) | {"window", "d_model"}
_CHOICES = {"dtype": tuple(DTYPES), "device": DEVICES, "norm": NORMS, "ffn": FFNS,
            "pos": POSITIONS, "mixer": MIXERS, "cache": CACHES}
_POSITIVE = {"batch", "seq_len", "q_len", "heads", "kv_heads", "head_dim", "dilation",
             "block_size", "conv_kernel", "layers", "gen_tokens", "d_model"}
_NON_NEGATIVE = {"global_tokens", "random_blocks", "seed"}
# fmt: on


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


def is_pair(value) -> bool:
    """A window written as ``[left, right]`` (two ints)."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(s, int) and not isinstance(s, bool) for s in value)
    )


def is_swept(key: str, value) -> bool:
    """Is ``value`` a list of values for ``key`` (a window pair alone is one value)?"""
    return isinstance(value, list) and not (key == "window" and is_pair(value))


def validate_axes(axes: dict, where: str, err: SuiteReporter, lists: bool | None) -> None:
    """Every key a point field; lists=True: every value a non-empty list; False: scalars;
    None: either."""
    for key, value in axes.items():
        if key not in AXES:
            err.fail(f"{where}.{key}", value, f"unknown key (point fields: {sorted(AXES)})")
        swept = is_swept(key, value)
        if lists is True and not swept:
            err.fail(f"{where}.{key}", value, "[sweep] values must be lists")
        if lists is False and swept:
            err.fail(f"{where}.{key}", value, "must be a single value (lists belong in [sweep])")
        values = value if swept else [value]
        if swept and not values:
            err.fail(f"{where}.{key}", value, "empty list")
        for item in values:
            validate_value(key, item, err, f"{where}.{key}")


def validate_value(key: str, value, err: SuiteReporter, at: str | None = None) -> None:
    """One value of point field ``key``: its type, allowed words and sign."""
    at = at or key
    if key == "window":
        if not is_pair(value) or any(s < -1 for s in value):
            err.fail(at, value, "a window is [left, right] with sides >= -1 (-1 = unbounded)")
        return
    kind = int if key == "d_model" else FIELD_TYPES[key]
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
