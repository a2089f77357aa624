"""One run directory from the shards of a sweep (``attnbench merge DIR... --out DIR``).

Checks, in order: every directory comes from the same suite file (fingerprint; else exit 2);
no point was measured twice (two different rows for one point_id: exit 2; a byte-identical
copy of a row is kept once); which points and shards are missing, against the suite's point
ids that every shard records in its env.json (the merged run is still written, exit 1); and
which environment fields differ between shards. Shards measured on different devices (device
fingerprints differ, e.g. an A100 node and an H100 node) are flagged: a warning, the
differences in the merged env.json, and a merged fingerprint ``mixed:<a>+<b>`` that no
single-device baseline matches, so such a run is never compared as if it were one device.
Each merged row gains ``shard`` (``k/n``) and ``fingerprint`` columns.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import CliError
from harness.results import ROWS_FILE, ResultsError, iter_rows, load_env, write_env

# env.json fields that must agree for rows to be comparable; a difference is reported.
ENV_FIELDS = (
    "fingerprint",
    "device_name",
    "capability",
    "total_memory_bytes",
    "threads",
    "cuda",
    "torch",
    "torch_cuda",
    "harness_version",
    "git_sha",
    "git_dirty",
    "python",
)


class MergeError(CliError):
    """Shards that cannot be merged (different suites, duplicate points)."""


@dataclass
class MergeReport:
    """What a merge found; ``complete`` is False when points or shards are missing."""

    out: Path
    rows: int = 0
    expected: int | None = None  # suite points, None when no shard recorded them
    missing_points: list[str] = field(default_factory=list)
    missing_shards: list[str] = field(default_factory=list)
    env_differences: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def heterogeneous(self) -> bool:
        return "fingerprint" in self.env_differences

    @property
    def complete(self) -> bool:
        return not self.missing_points and not self.missing_shards


@dataclass
class _Shard:
    path: Path
    env: dict
    rows: list[dict]

    @property
    def label(self) -> str:
        spec = self.env.get("shard") or {}
        return f"{spec['k']}/{spec['n']}" if "k" in spec else str(self.path)


def _read(path: Path) -> _Shard:
    try:
        env = load_env(path)
    except ResultsError as exc:
        raise MergeError(f"{path}: not a run directory ({exc})") from None
    rows_file = path / ROWS_FILE
    rows = list(iter_rows(rows_file)) if rows_file.is_file() else []  # an empty shard has none
    return _Shard(path, env, rows)


def merge_runs(dirs: list[Path], out: Path, *, overwrite: bool = False) -> MergeReport:
    """Merge the run directories ``dirs`` into ``out`` (rows.jsonl + env.json)."""
    unique = list(dict.fromkeys(Path(d).resolve() for d in dirs))
    if not unique:
        raise MergeError("nothing to merge")
    if Path(out).resolve() in unique:
        raise MergeError(f"--out {out} is one of the inputs")
    if (Path(out) / ROWS_FILE).exists() and not overwrite:
        raise MergeError(f"--out {out} already holds results; choose a new directory or --force")
    shards = [_read(d) for d in unique]
    _check_same_suite(shards)
    report = MergeReport(out=Path(out))
    rows = _merged_rows(shards, report)
    _check_completeness(shards, rows, report)
    report.env_differences = _env_differences(shards)
    env = _merged_env(shards, report)
    Path(out).mkdir(parents=True, exist_ok=True)
    tmp = Path(out) / (ROWS_FILE + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, allow_nan=False) + "\n")
    tmp.replace(Path(out) / ROWS_FILE)
    write_env(Path(out), env)
    report.rows = len(rows)
    return report


def _check_same_suite(shards: list[_Shard]) -> None:
    first = shards[0]
    for shard in shards[1:]:
        if shard.env.get("suite_fingerprint") != first.env.get("suite_fingerprint"):
            raise MergeError(
                f"{shard.path} ran suite {shard.env.get('suite')!r} ({shard.env.get('suite_path')})"
                f", {first.path} ran {first.env.get('suite')!r} ({first.env.get('suite_path')}):"
                " different suite files (fingerprints differ) cannot be merged"
            )
    rules = {(s.env.get("shard") or {}).get("rule") for s in shards} - {None}
    if len(rules) > 1:
        raise MergeError(
            f"shards partitioned by different rules {sorted(rules)}; rerun them "
            "with one harness version"
        )


def _merged_rows(shards: list[_Shard], report: MergeReport) -> list[dict]:
    seen: dict[str, tuple[dict, Path]] = {}
    clashes: list[str] = []
    rows: list[dict] = []
    for shard in shards:
        for row in shard.rows:
            row = {
                **row,
                "shard": shard.label if shard.env.get("shard") else None,
                "fingerprint": shard.env.get("fingerprint"),
            }
            pid = row.get("point_id")
            if pid in seen:
                other, where = seen[pid]
                if _same_measurement(row, other):
                    report.notes.append(
                        f"point {pid}: identical row in {where} and {shard.path}; kept once"
                    )
                    continue
                clashes.append(f"{pid} ({where}, {shard.path})")
                continue
            seen[pid] = (row, shard.path)
            rows.append(row)
    if clashes:
        more = f" and {len(clashes) - 3} more" if len(clashes) > 3 else ""
        raise MergeError(
            f"{len(clashes)} point(s) measured twice with different results: "
            f"{'; '.join(clashes[:3])}{more}; remove the surplus run directory"
        )
    return rows


def _same_measurement(a: dict, b: dict) -> bool:
    skip = {"shard", "fingerprint"}
    return {k: v for k, v in a.items() if k not in skip} == {
        k: v for k, v in b.items() if k not in skip
    }


def _check_completeness(shards: list[_Shard], rows: list[dict], report: MergeReport) -> None:
    specs = [s.env.get("shard") for s in shards if s.env.get("shard")]
    expected: set[str] = set()
    for spec in specs:
        expected.update(spec.get("suite_point_ids", []))
    if not specs:
        report.notes.append("no shard records the suite's points: missing points not checked")
        return
    report.expected = len(expected)
    have = {r.get("point_id") for r in rows}
    report.missing_points = sorted(expected - have)
    totals = {spec["n"] for spec in specs}
    if len(totals) > 1:
        report.notes.append(f"shards of different partitions N={sorted(totals)}")
    for n in sorted(totals):
        present = {spec["k"] for spec in specs if spec["n"] == n}
        report.missing_shards += [f"{k}/{n}" for k in range(1, n + 1) if k not in present]
    unknown = have - expected
    if unknown:
        report.notes.append(f"{len(unknown)} row(s) are not points of the suite")


def _env_differences(shards: list[_Shard]) -> dict[str, dict[str, list[str]]]:
    out: dict[str, dict[str, list[str]]] = {}
    for key in ENV_FIELDS:
        values: dict[str, list[str]] = defaultdict(list)
        for shard in shards:
            if key in shard.env:
                values[json.dumps(shard.env[key])].append(shard.label)
        if len(values) > 1:
            out[key] = dict(values)
    return out


def _merged_env(shards: list[_Shard], report: MergeReport) -> dict:
    env = {k: v for k, v in shards[0].env.items() if k not in ("shard", "run_id")}
    env["run_id"] = (
        shards[0].env.get("run_id")
        if len(shards) == 1
        else "merged-" + "+".join(sorted(str(s.env.get("run_id")) for s in shards))
    )
    for key in report.env_differences:
        env[key] = None  # differs between shards: see "merge" below, never one shard's value
    if report.heterogeneous:
        prints = sorted({str(s.env.get("fingerprint")) for s in shards})
        env["fingerprint"] = "mixed:" + "+".join(prints)
    env["merge"] = {
        "shards": [
            {
                "path": str(s.path),
                "shard": s.label if s.env.get("shard") else None,
                "run_id": s.env.get("run_id"),
                "fingerprint": s.env.get("fingerprint"),
                "device_name": s.env.get("device_name"),
                "rows": len(s.rows),
                "started_utc": s.env.get("started_utc"),
                "calibration": s.env.get("calibration"),
            }
            for s in shards
        ],
        "heterogeneous": report.heterogeneous,
        "env_differences": report.env_differences,
        "expected_points": report.expected,
        "missing_points": report.missing_points,
        "missing_shards": report.missing_shards,
    }
    return env


def print_report(report: MergeReport, file=None) -> None:
    """The merge's findings as a few readable lines (to stderr by default)."""
    file = file or sys.stderr
    total = f" of {report.expected}" if report.expected is not None else ""
    print(f"attnbench: merged {report.rows}{total} points -> {report.out / ROWS_FILE}", file=file)
    for key, values in report.env_differences.items():
        kind = "warning: heterogeneous devices" if key == "fingerprint" else f"note: {key} differs"
        detail = "; ".join(f"{json.loads(v)} ({', '.join(s)})" for v, s in values.items())
        print(f"attnbench: {kind}: {detail}", file=file)
    if report.missing_shards:
        print(f"attnbench: missing shard(s): {', '.join(report.missing_shards)}", file=file)
    if report.missing_points:
        shown = ", ".join(report.missing_points[:5])
        more = (
            f" and {len(report.missing_points) - 5} more" if len(report.missing_points) > 5 else ""
        )
        print(f"attnbench: {len(report.missing_points)} point(s) missing: {shown}{more}", file=file)
    for note in report.notes:
        print(f"attnbench: note: {note}", file=file)
