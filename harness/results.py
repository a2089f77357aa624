"""Run directories and the one loader of results.

A run directory holds ``rows.jsonl`` (one JSON object per point, appended, flushed and fsynced
as each point finishes), ``env.json`` beside it, and ``passes.jsonl`` (every finished timing
pass, :mod:`harness.execute.passlog`). Every reader of results -- ``table``, ``report``,
``claims``, ``compare``, ``baseline`` -- goes through :func:`read_run` (or :func:`load_rows`,
its DataFrame):

- **Format version.** Rows and env.json carry ``schema_version`` (:data:`SCHEMA_VERSION`), as
  asv's ``api_version``; a file without one is version 1 (the committed baselines). A newer
  version than this attnbench reads is refused in one line (:class:`ResultsError`).
- **Bad rows.** A line that is not a complete JSON object, a row without ``impl`` or with an
  unknown ``status``, or a documented column of the wrong type (``seq_len = "abc"``) is left
  out with one line that says where and why (a :class:`~harness.errors.ResultsWarning`);
  ``NaN``/``Infinity`` read as missing. A run with no usable row is a ResultsError (exit 2).
- **Interrupted runs.** Points whose last timing pass never finished have no row in
  rows.jsonl, but passes.jsonl holds their finished passes: they are read from there, marked
  ``partial`` (``passes`` says how many passes went into the row).

Nothing here executes, imports or unpickles anything from a results file: rows are plain JSON.
"""

# size: the results format in one place: how rows are written, read, checked and versioned
from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness import fmt
from harness.errors import CliError, ResultsWarning
from harness.schema import BY_NAME, NAMES

ROWS_FILE = "rows.jsonl"
ENV_FILE = "env.json"
PASSES_FILE = "passes.jsonl"
SCHEMA_VERSION = 1  # the results format this attnbench writes; rows without one are version 1
VERSION_KEY = "schema_version"

STATUSES = ("ok", "skipped", "oom", "error", "mismatch", "timeout")

# The documented columns, in display order (declared in harness/schema.py, which documents each).
# Rows may carry more (scenario-specific) columns; loaders keep them.
ROW_COLUMNS: tuple[str, ...] = NAMES

# schema kind -> the JSON types a value of that kind may have (None is always allowed)
_NUMBER = (int, float)
_KIND_TYPES: dict[str, tuple[type, ...]] = {
    "text": (str,),
    "int": (int,),
    "bool": (bool,),
    "seconds": _NUMBER,
    "bytes": _NUMBER,
    "flops": _NUMBER,
    "rate": _NUMBER,
    "error": _NUMBER,
    "share": _NUMBER,
    "number": _NUMBER,
}


class ResultsError(CliError, ValueError):
    """An unusable results directory or file (exit status 2 at the command line)."""


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


def repair_tail(path: Path) -> None:
    """A write cut mid-line (SIGKILL, power loss) leaves a partial line: end it, so the next
    append starts a line of its own (the cut line is then left out by the loader)."""
    if path.is_file() and path.stat().st_size:
        with path.open("rb+") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.write(b"\n")


def append_line(path: Path, record: dict) -> None:
    """``record`` as one strict-JSON line appended to ``path``, flushed and fsynced."""
    line = json.dumps(json_safe(record), allow_nan=False)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


class RowWriter:
    """Appends rows to ``DIR/rows.jsonl`` with the format version; each row is flushed and
    fsynced before returning."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ROWS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_tail(self.path)

    def write(self, row: dict) -> None:
        append_line(self.path, {**row, VERSION_KEY: SCHEMA_VERSION})


def _parse_line(line: str):
    """One JSON value; NaN and ±Infinity (which strict JSON lacks) read as None."""
    return json.loads(line, parse_constant=lambda _: None)


def json_lines(path: Path) -> Iterator[tuple[int, object | None, str | None]]:
    """``(line number, value, problem)`` for every non-blank line of a JSON Lines file:
    ``problem`` is None for a complete JSON value."""
    with Path(path).open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield number, _parse_line(line), None
            except json.JSONDecodeError:
                yield number, None, "not a complete JSON line (truncated or corrupt)"


def iter_rows(path: Path) -> Iterable[dict]:
    """The JSON objects of a JSON Lines file as written (no checks beyond the JSON); lines that
    are not a complete JSON object are skipped with a :class:`ResultsWarning`."""
    for number, value, problem in json_lines(path):
        if problem is None and isinstance(value, dict):
            yield value
        else:
            warnings.warn(f"{path}:{number}: {problem or 'not a JSON object'}; skipped",
                          ResultsWarning, stacklevel=2)


def check_version(value, where: str) -> int:
    """The format version ``value`` (None: 1), refused in one line when this attnbench cannot
    read it."""
    version = 1 if value is None else value
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ResultsError(f"{where}: {VERSION_KEY} = {value!r} is not a format version")
    if version > SCHEMA_VERSION:
        raise ResultsError(
            f"{where}: results format version {version} is newer than this attnbench reads "
            f"(up to {SCHEMA_VERSION}); upgrade attnbench to read it"
        )
    return version


def row_problem(row) -> str | None:
    """Why ``row`` (a parsed JSON value) is not a usable result row, or None."""
    if not isinstance(row, dict):
        return f"not a JSON object (a {type(row).__name__})"
    if not isinstance(row.get("impl"), str) or not row["impl"]:
        return "no 'impl' (the implementation's name)"
    if row.get("status") not in STATUSES:
        return f"status = {row.get('status')!r} is not one of {', '.join(STATUSES)}"
    for name, value in row.items():
        column = BY_NAME.get(name)
        if column is None or value is None:
            continue
        if column.many:
            if not isinstance(value, list):
                return f"{name} = {_shown(value)} is not a list"
            continue
        allowed = _KIND_TYPES[column.kind]
        integral = column.kind == "int" and isinstance(value, float) and value.is_integer()
        if (isinstance(value, bool) and bool not in allowed) or not (
            isinstance(value, allowed) or integral
        ):
            return f"{name} = {_shown(value)} is not {_KIND_WORDS[column.kind]}"
    return None


_KIND_WORDS = {"text": "text", "int": "an integer", "bool": "true or false"}
_KIND_WORDS.update({kind: "a number" for kind in _KIND_TYPES if kind not in _KIND_WORDS})


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class Run:
    """A run directory as read: its usable rows (file order; partial ones last), env.json
    (None when absent), and one line per row left out or file that is missing."""

    path: Path
    rows: tuple[dict, ...]
    env: dict | None
    problems: tuple[str, ...] = ()
    partial: int = 0  # rows read from the finished passes of an interrupted run

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame, documented columns first."""
        frame = pd.DataFrame(list(self.rows))
        ordered = [c for c in ROW_COLUMNS if c in frame.columns]
        return frame[ordered + [c for c in frame.columns if c not in ordered]]


def rows_path(run_dir: Path | str) -> Path:
    """``DIR/rows.jsonl`` (or the path itself when it names the file); must exist."""
    path = Path(run_dir)
    path = path if path.name == ROWS_FILE else path / ROWS_FILE
    if not path.is_file():
        raise ResultsError(f"{path}: no such results file")
    return path


def read_run(run_dir: Path | str) -> Run:
    """The one loader: a run directory's usable rows, env.json and the problems met.

    Raises :class:`ResultsError` when there are no results at all, when a row or env.json is
    of a newer format version, or when no row is usable."""
    given = Path(run_dir)
    run_dir = given.parent if given.name == ROWS_FILE else given
    rows_file, passes_file = run_dir / ROWS_FILE, run_dir / PASSES_FILE
    if not rows_file.is_file() and not passes_file.is_file():
        raise ResultsError(f"{rows_file}: no such results file")
    env = load_env(run_dir) if (run_dir / ENV_FILE).is_file() else None
    rows, problems = _read_rows(rows_file) if rows_file.is_file() else ([], [])
    done = {r.get("point_id") for r in rows}
    partial = [r for r in _partial_rows(passes_file, env) if r.get("point_id") not in done]
    if not rows and not partial:
        why = f" ({len(problems)} left out; the first: {problems[0]})" if problems else ""
        raise ResultsError(f"{rows_file}: no usable rows{why}")
    return Run(run_dir, tuple(rows + partial), env, tuple(problems), len(partial))


def _read_rows(path: Path) -> tuple[list[dict], list[str]]:
    rows, problems = [], []
    for number, value, problem in json_lines(path):
        where = f"{path}:{number}"
        if problem is None and isinstance(value, dict):
            check_version(value.get(VERSION_KEY), where)
            problem = row_problem(value)
        elif problem is None:
            problem = row_problem(value)
        if problem is None:
            rows.append({**value, VERSION_KEY: value.get(VERSION_KEY) or 1})
        else:
            problems.append(f"{where}: {problem}; row left out")
    return rows, problems


def _partial_rows(path: Path, env: dict | None) -> list[dict]:
    """Rows of points with finished passes but no final row: each point's latest combined row
    in passes.jsonl (``partial_row``; the first pass's ``row`` before any later pass)."""
    if not path.is_file():
        return []
    latest: dict[str, tuple[int, dict]] = {}
    for _, entry, problem in json_lines(path):
        if problem or not isinstance(entry, dict) or not isinstance(entry.get("point_id"), str):
            continue
        row = entry.get("partial_row") or entry.get("row")
        index = entry.get("pass") if isinstance(entry.get("pass"), int) else 0
        if isinstance(row, dict) and index >= latest.get(entry["point_id"], (-1, {}))[0]:
            latest[entry["point_id"]] = (index, row)
    out = []
    for pid, (_, row) in latest.items():
        row = {"run_id": (env or {}).get("run_id"), "suite": (env or {}).get("suite"), **row,
               "point_id": pid, "partial": True}
        row.setdefault("passes", 1)
        if row_problem(row) is None:
            out.append({**row, VERSION_KEY: row.get(VERSION_KEY) or 1})
    return out


def warn_problems(run: Run) -> None:
    """Each row the loader left out, and an interrupted run's partial rows, as one
    :class:`ResultsWarning` line each."""
    for problem in run.problems:
        warnings.warn(problem, ResultsWarning, stacklevel=3)
    if run.partial:
        warnings.warn(
            f"{run.path}: an interrupted run: {fmt.plural(run.partial, 'point')} read from the "
            f"finished passes in {PASSES_FILE} (marked partial); `attnbench run SUITE --out "
            f"{run.path} --resume` finishes it",
            ResultsWarning,
            stacklevel=3,
        )


def load_rows(run_dir: Path | str) -> pd.DataFrame:
    """All usable rows of a run directory (or rows.jsonl path) as a DataFrame, documented
    columns first; rows left out and partial rows are said as :class:`ResultsWarning`\\ s."""
    run = read_run(run_dir)
    warn_problems(run)
    return run.frame()


def load_runs(run_dirs: Iterable[Path | str]) -> pd.DataFrame:
    """Rows of several runs concatenated (``run_id`` tells them apart)."""
    frames = [load_rows(d) for d in run_dirs]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def write_env(run_dir: Path, env: dict) -> None:
    """``DIR/env.json`` with the format version."""
    path = Path(run_dir) / ENV_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({**env, VERSION_KEY: SCHEMA_VERSION}, indent=2, sort_keys=True, default=str)
    path.write_text(text + "\n")


def load_env(run_dir: Path | str) -> dict:
    """``DIR/env.json`` (its format version checked)."""
    path = Path(run_dir) / ENV_FILE
    if not path.is_file():
        raise ResultsError(f"{path}: no such environment file")
    try:
        env = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(env, dict):
        raise ResultsError(f"{path}: not a JSON object")
    check_version(env.get(VERSION_KEY), str(path))
    return env


def env_or_note(run_dir: Path | str) -> dict:
    """A run directory's env.json, or ``{"run_id": <folder>, "note": "no env.json"}``."""
    try:
        return load_env(run_dir)
    except ResultsError:
        return {"run_id": Path(run_dir).name, "note": "no env.json"}


def load_envs(run_dirs: Iterable[Path | str]) -> dict[str, dict]:
    """run_id -> env.json for run directories (a directory without env.json is left out)."""
    envs = {}
    for run_dir in run_dirs:
        if (Path(run_dir) / ENV_FILE).is_file():
            env = load_env(run_dir)
            envs[str(env.get("run_id", Path(run_dir).name))] = env
    return envs
