"""The one number formatter: every table, report, verdict reason and compare summary formats
numbers through these functions, so a value reads the same everywhere.

Missing values (None, NaN) print as :data:`MISSING` unless the caller asks for another mark.
"""

from __future__ import annotations

import math

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
