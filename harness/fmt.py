"""How values are written as text: the one number formatter and the one markdown table
writer. Every table, report, verdict reason and compare summary formats numbers through these
functions, so a value reads the same everywhere.

Missing values (None, NaN) print as :data:`MISSING` unless the caller asks for another mark.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable

import pandas as pd

MISSING = "-"
TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))


def is_missing(value) -> bool:
    """None, or a float NaN (numpy floats included)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def number(value, digits: int = 4, missing: str = MISSING) -> str:
    """``value`` to ``digits`` significant digits; integers (and integral floats that came
    from integers) without a decimal point; anything else as ``str``."""
    if is_missing(value):
        return missing
    if isinstance(value, bool) or not isinstance(value, int | float):
        if hasattr(value, "item"):  # numpy scalar
            return number(value.item(), digits, missing)
        return str(value)
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits}g}"


def seconds(value: float | None, digits: int = 3, missing: str = MISSING) -> str:
    """A duration with the largest unit that keeps it >= 1: ``1.23 ms``, ``45.6 us``."""
    if is_missing(value):
        return missing
    for unit, scale in TIME_UNITS:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {unit}"
    return f"{value / 1e-9:.{digits}g} ns"


def mebibytes(value: float | None, missing: str = MISSING) -> str:
    """Bytes as ``12.34 MiB``."""
    return missing if is_missing(value) else f"{value / 2**20:.2f} MiB"


def ratio(value: float | None, missing: str = MISSING) -> str:
    """A speed-up or size ratio: ``2.10x``."""
    return missing if is_missing(value) else f"{value:.2f}x"


def percent(fraction: float | None, missing: str = MISSING) -> str:
    """A fraction as a whole percentage: ``0.423`` -> ``42%``."""
    return missing if is_missing(fraction) else f"{100 * fraction:.0f}%"


def exact(value, missing: str = MISSING) -> str:
    """A value as written, not rounded (an axis value such as ``seq_len`` or a window side):
    integral floats without the decimal point (``512.0`` -> ``512``), anything else as ``str``."""
    if is_missing(value):
        return missing
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def readable(value: float | None, digits: int = 3, missing: str = MISSING) -> str:
    """``digits`` significant digits below 1000, whole numbers with thousands separators from
    1000 up (no exponent): ``0.0456``, ``12.3``, ``3,072``."""
    if is_missing(value):
        return missing
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"


def fixed(
    value: float | None, decimals: int = 2, grouped: bool = False, missing: str = MISSING
) -> str:
    """``decimals`` digits after the point (``1.95`` -> ``1.95``, ``0`` decimals -> ``2``);
    ``grouped`` adds thousands separators (``12,345``)."""
    if is_missing(value):
        return missing
    return f"{value:,.{decimals}f}" if grouped else f"{value:.{decimals}f}"


def scientific(value: float | None, digits: int = 1, missing: str = MISSING) -> str:
    """Mantissa with ``digits`` decimals and a power of ten: ``1.2e-07``."""
    return missing if is_missing(value) else f"{value:.{digits}e}"


def signed_percent(fraction: float | None, decimals: int = 1, missing: str = MISSING) -> str:
    """A relative change with its sign: ``0.123`` -> ``+12.3%``; infinity -> ``+inf``."""
    if is_missing(fraction):
        return missing
    if math.isinf(fraction):
        return "+inf" if fraction > 0 else "-inf"
    return f"{100 * fraction:+.{decimals}f}%"


def plural(count: int, noun: str) -> str:
    """``1 point``, ``2 points``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


SIZE_UNITS = (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the nearest of ``choices`` to a mistyped ``word`` (a typo
    is the usual cause of an unknown name), or ``""`` when none is near."""
    near = difflib.get_close_matches(word, sorted(set(choices)), n=1)
    return f"; did you mean {near[0]!r}?" if near else ""


def size(nbytes: float | None, missing: str = MISSING) -> str:
    """Bytes in the unit a person reads: ``1.5 GiB``, ``5.4 PiB`` from 1 GiB up (the largest
    binary unit that keeps the number >= 1), else whole ``MiB``; under 1 MiB whole ``KiB``,
    under 1 KiB bytes (a 1 KiB budget is not ``0 MiB``)."""
    if is_missing(nbytes):
        return missing
    for unit, scale in SIZE_UNITS:
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.0f} MiB"
    if nbytes >= 2**10:
        return f"{nbytes / 2**10:.0f} KiB"
    return f"{nbytes:.0f} B"


def percent_range(low: float | None, high: float | None, missing: str = "n/a") -> str:
    """Two fractions as one percentage span: ``12–48%``, or ``5%`` when they read the same
    (two significant digits under 10 %, whole percents above)."""
    if is_missing(low) or is_missing(high):
        return missing
    a, b = 100 * low, 100 * high
    shown = (lambda v: f"{v:.2g}") if b < 10 else (lambda v: f"{v:.0f}")
    return f"{shown(a)}%" if shown(a) == shown(b) else f"{shown(a)}–{shown(b)}%"


def markdown_table(frame: pd.DataFrame) -> str:
    """``frame`` as a GitHub-flavoured pipe table: cells as given (format numbers first, with
    the functions above), ``|`` escaped, newlines folded, missing values blank; columns whose
    cells all read as numbers are right-aligned."""
    shown = frame.astype(object).map(
        lambda v: "" if is_missing(v) else str(v).replace("|", "\\|").replace("\n", " ")
    )
    shown.columns = [str(c).replace("|", "\\|") for c in shown.columns]
    align = ["right" if _numeric_column(shown[c]) else "left" for c in shown.columns]
    return shown.to_markdown(index=False, tablefmt="pipe", disable_numparse=True, colalign=align)


def _numeric_column(column: pd.Series) -> bool:
    """Every non-blank cell starts like a number ("1.5", "-3", "2.1x", "4.0 (!)")."""
    filled = [str(v) for v in column if str(v) not in ("", MISSING)]
    return bool(filled) and all(v.lstrip("-+")[:1].isdigit() for v in filled)
