"""``passes.jsonl``: every finished timing pass of a point, kept beside ``rows.jsonl`` so a
crash loses no pass, and the combination of a point's passes into its final row.

The first pass's line holds the whole first-pass row; a later pass's line holds only its
per-pass fields (:data:`PASS_FIELDS`: raw time samples in seconds, on a CPU their CPU times,
calls per sample, the reference-kernel bracket and the contention readings of that pass) plus
``partial_row``: the point's row combined over the passes finished so far. So the rows of an
interrupted run stay readable (:func:`harness.results.read_run` marks them ``partial``)
without the reader having to combine passes.
"""

from __future__ import annotations

from pathlib import Path

from harness.measure import passes
from harness.results import PASSES_FILE, append_line, iter_rows, repair_tail

# per-pass fields kept in passes.jsonl and combined into the row by passes.combine
PASS_FIELDS = ("time_samples_s", "calls_per_sample", "ref_kernel_s", "contended", "contention",
               "other_cpu_cores", "cpu_steal_frac", "load_avg_1m", "gpu_other_processes",
               "gpu_throttle_reasons", "gpu_contention_status", "host_issue_s", "gpu_time_s",
               "cpu_time_samples_s", "ref_kernel_cpu_s")


class PassLog:
    """``passes.jsonl``: one line per finished pass of a point (the first pass's line holds the
    whole first-pass row, a later one the row combined so far), appended and fsynced, so no
    finished pass is lost to a crash."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / PASSES_FILE
        repair_tail(self.path)  # a line cut by a kill: end it
        self._first: dict[str, dict] = {}
        self._records: dict[str, dict[int, dict]] = {}

    def write(self, point_id: str, index: int, record: dict, row: dict | None = None) -> None:
        """Log pass ``index`` of a point (``row``: its first-pass row, with pass 0)."""
        entry: dict = {"point_id": point_id, "pass": index, "record": record}
        if row is not None:
            entry["row"] = row
            self._first[point_id] = row
        self._records.setdefault(point_id, {})[index] = record
        first = self._first.get(point_id)
        if index > 0 and first is not None and first.get("status") == "ok":
            entry["partial_row"] = final_row(first, self._records[point_id])
        append_line(self.path, entry)

    def read(self, point_ids: set[str]) -> dict[str, tuple[dict | None, dict[int, dict]]]:
        """point_id -> (first-pass row, {pass index: record}) for ``point_ids``."""
        out: dict[str, tuple[dict | None, dict[int, dict]]] = {}
        if not self.path.is_file():
            return out
        for entry in iter_rows(self.path):
            pid = entry.get("point_id")
            if pid not in point_ids or not isinstance(entry.get("record"), dict):
                continue
            row, records = out.get(pid, (None, {}))
            records[int(entry.get("pass", 0))] = entry["record"]
            out[pid] = (entry.get("row", row), records)
        for pid, (row, records) in out.items():  # later passes continue the partial rows
            if row is not None:
                self._first[pid] = row
            self._records[pid] = dict(records)
        return out


def pass_record(row: dict) -> dict:
    """The per-pass fields of a first-pass row."""
    return {"pass": 0, "status": row.get("status"),
            **{k: row[k] for k in PASS_FIELDS if k in row}}


def final_row(first: dict, records: dict[int, dict]) -> dict:
    """The point's row: its first-pass row with time and contention columns from every pass."""
    row = dict(first)
    if row.get("status") != "ok":
        return row
    ordered = [{"pass": k, **records[k]} for k in sorted(records)]
    old_median = row.get("time_median_s")
    row.update(passes.combine(ordered, seed=int(str(row.get("point_id") or "0")[:8], 16)
                              if row.get("point_id") else 0))
    row.update(_combined_contention(ordered))
    row.update(_combined_host(ordered))
    new_median = row.get("time_median_s")
    if old_median and new_median:  # throughput follows the combined median
        for key in ("tokens_per_s", "tflops_per_s"):
            if row.get(key) is not None:
                row[key] = row[key] * old_median / new_median
    return row


def _combined_contention(records: list[dict]) -> dict:
    timed = [r for r in records if r.get("time_samples_s")]
    flagged = [r for r in timed if r.get("contended")]
    out: dict = {"contended": bool(flagged), "pass_contended": [bool(r.get("contended"))
                                                                for r in timed]}
    shown = flagged or timed[:1]
    out["contention"] = "; ".join(f"pass {r['pass'] + 1}: {r.get('contention')}" for r in shown)
    for key in ("other_cpu_cores", "cpu_steal_frac", "load_avg_1m", "gpu_other_processes"):
        values = [r[key] for r in timed if isinstance(r.get(key), int | float)]
        if values:
            out[key] = max(values)
    return out


def _combined_host(records: list[dict]) -> dict:
    """``host_issue_s``, ``gpu_time_s`` and ``host_frac`` over every timed pass that has them:
    per-call means weighted by the calls each pass timed (a pass without them, e.g. on CPU,
    leaves the first pass's ``null`` columns as they are)."""
    timed = [r for r in records if r.get("time_samples_s")
             and isinstance(r.get("host_issue_s"), int | float)
             and isinstance(r.get("gpu_time_s"), int | float)]
    if not timed:
        return {}
    calls = [len(r["time_samples_s"]) * (r.get("calls_per_sample") or 1) for r in timed]
    host = sum(n * r["host_issue_s"] for n, r in zip(calls, timed, strict=True)) / sum(calls)
    gpu = sum(n * r["gpu_time_s"] for n, r in zip(calls, timed, strict=True)) / sum(calls)
    return {"host_issue_s": host, "gpu_time_s": gpu, "host_frac": host / gpu if gpu > 0 else None}
