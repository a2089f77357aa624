"""Run directories: ``rows.jsonl`` (one JSON object per point, appended, flushed and fsynced as
each point finishes) and ``env.json`` beside it. Loaders return pandas DataFrames.

Nothing here executes, imports or unpickles anything from a results file: rows are plain JSON.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from harness.schema import NAMES

ROWS_FILE = "rows.jsonl"
ENV_FILE = "env.json"

STATUSES = ("ok", "skipped", "oom", "error", "mismatch", "timeout")

# The documented columns, in display order (declared in harness/schema.py, which documents each).
# Rows may carry more (scenario-specific) columns; loaders keep them.
ROW_COLUMNS: tuple[str, ...] = NAMES


class ResultsError(ValueError):
    """An unusable results directory or file."""


def json_safe(value):
    """``value`` with every non-finite float (NaN, inf) as None and numpy scalars as Python
    numbers, at any depth of dicts, lists and tuples: what strict JSON can hold."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):  # numpy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps_json(value, indent: int | None = 2) -> str:
    """Strict JSON (missing numbers as null, never NaN) for ``--json`` outputs."""
    return json.dumps(json_safe(value), indent=indent, allow_nan=False)


class RowWriter:
    """Appends rows to ``DIR/rows.jsonl``; each row is flushed and fsynced before returning."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ROWS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_tail()

    def _repair_tail(self) -> None:
        """A write cut mid-line (SIGKILL, power loss) leaves a partial line: end it cleanly."""
        if self.path.exists() and self.path.stat().st_size:
            with self.path.open("rb+") as fh:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    fh.write(b"\n")

    def write(self, row: dict) -> None:
        line = json.dumps(json_safe(row), allow_nan=False)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def iter_rows(path: Path) -> Iterable[dict]:
    """Parse a rows.jsonl file; skips (with a warning) lines that are not complete JSON objects."""
    with Path(path).open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                warnings.warn(f"{path}:{number}: skipping a truncated or corrupt row", stacklevel=2)
                continue
            if isinstance(row, dict):
                yield row


def rows_path(run_dir: Path | str) -> Path:
    path = Path(run_dir)
    path = path if path.name == ROWS_FILE else path / ROWS_FILE
    if not path.is_file():
        raise ResultsError(f"{path}: no such results file")
    return path


def load_rows(run_dir: Path | str) -> pd.DataFrame:
    """All rows of a run directory (or rows.jsonl path) as a DataFrame, documented columns first."""
    rows = list(iter_rows(rows_path(run_dir)))
    frame = pd.DataFrame(rows)
    ordered = [c for c in ROW_COLUMNS if c in frame.columns]
    return frame[ordered + [c for c in frame.columns if c not in ordered]]


def load_runs(run_dirs: Iterable[Path | str]) -> pd.DataFrame:
    """Rows of several runs concatenated (``run_id`` tells them apart)."""
    frames = [load_rows(d) for d in run_dirs]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def write_env(run_dir: Path, env: dict) -> None:
    path = Path(run_dir) / ENV_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(env, indent=2, sort_keys=True, default=str) + "\n")


def load_env(run_dir: Path | str) -> dict:
    path = Path(run_dir) / ENV_FILE
    if not path.is_file():
        raise ResultsError(f"{path}: no such environment file")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not valid JSON ({exc})") from None
