"""The one markdown table writer (GitHub-flavoured, pipe tables)."""

from __future__ import annotations

import pandas as pd

from harness.fmt import MISSING, is_missing


def table(frame: pd.DataFrame) -> str:
    """``frame`` as a pipe table: cells as given (format numbers first, with
    :mod:`harness.fmt`), ``|`` escaped, newlines folded, missing values blank; columns whose
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
