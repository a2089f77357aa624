"""``type=`` converters for argparse shared by several verbs."""

from __future__ import annotations

import argparse
import re

SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
              "gib": 2**30, "tib": 2**40, "tb": 10**12}


def parse_size(text: str) -> int:
    """'8GiB', '500MB', '1e9' -> bytes."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8GiB, 500MB, 1000000)")
    try:
        value = float(match.group(1)) * SIZE_UNITS[match.group(2).lower()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be > 0: {text!r}")
    return int(value)
