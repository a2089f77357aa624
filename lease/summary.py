"""The summary of a ``lease/proof.sh`` run: what ran, what failed, what did not fit.

Reads OUT_DIR as the proof leaves it, finished or cut short: ``steps.tsv`` (one line per step),
the verdicts step's rows (``verdicts/``, as ``attnbench verdicts`` writes them: its own table,
``verdicts.md``, says per claim the verdict, interval, axis range, points and timing mode), the
Triton compiles each step logged (``triton-misses/*.jsonl``: cache misses, 0 expected when the
kernels arrived compiled), the JUnit XML of each test step and the count of verdicts
(``verdicts/verdicts.json``). Prints the summary; exits 1 when a step failed, stopped at its
cap or did not fit, a test failed, or a measured row is neither ok nor skipped.

    python lease/summary.py OUT_DIR
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import warnings
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEST_STEPS = ("tests-parallel", "tests-serial")
# a verdict that decides (the claim holds, fails, or holds over part of its range); the rest
# are "inconclusive" (or not judged)
DECISIVE = ("confirmed", "refuted", "mixed", "holds in part")


def steps(out: Path) -> tuple[list[str], int]:
    """One line per step, and how many did not end ok."""
    path = out / "steps.tsv"
    if not path.exists():
        return ["no steps.tsv: the proof did not start"], 1
    with path.open(newline="") as fh:
        table = [{k: v or "" for k, v in row.items()}  # a missing field reads as empty
                 for row in csv.DictReader(fh, delimiter="\t")]
    lines, bad = [], 0
    for s in table:
        note = f" ({s['note']})" if s["note"] else ""
        lines.append(f"  {s['step']:<34} {s['status']:<20} {s['seconds']:>4} s of cap "
                     f"{s['cap_s']} s{note}")
        bad += s["status"] not in ("ok", "skipped")  # skipped: by design (the kernel sweep)
    return lines, bad


def tests(out: Path, name: str) -> tuple[list[str], int]:
    """The test counts of one test step and every test that did not pass."""
    xml = out / f"{name}.xml"
    if not xml.exists():
        return [f"{name}: no JUnit report (see {name}.log)"], 1
    root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    lines = [f"{name}: {passed} passed, {n['failures']} failed, {n['errors']} errors, "
             f"{n['skipped']} skipped of {n['tests']} in {float(suite.get('time', 0)):.0f} s"]
    skips: Counter[str] = Counter()
    for case in suite.iter("testcase"):
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is None:
                continue
            message = ((node.get("message") or "").splitlines() or [""])[0][:160]
            if tag == "skipped":  # one line per reason: a parametrized skip is one decision
                skips[message] += 1
            else:
                lines.append(f"  {tag} {case.get('classname')}::{case.get('name')}: {message}")
    lines += [f"  skipped {count}: {reason}" for reason, count in skips.most_common()]
    return lines, n["failures"] + n["errors"]


def run_rows(out: Path, name: str) -> tuple[list[str], int, pd.DataFrame | None]:
    """Status counts of one run folder and every row that is neither ok nor skipped."""
    folder = out / name
    if not (folder / "rows.jsonl").exists() and not (folder / "passes.jsonl").exists():
        return [f"{name}: no rows"], 1, None
    # pandas and the harness only where there are rows to read (a second of the summary's
    # start otherwise)
    from harness.results import load_rows

    with warnings.catch_warnings():  # an interrupted run's partial rows are counted below
        warnings.simplefilter("ignore")
        rows = load_rows(folder)
    counts = ", ".join(f"{v} {k}" for k, v in rows["status"].value_counts().items())
    partial = int(rows["partial"].fillna(False).astype(bool).sum()) if "partial" in rows else 0
    note = f" ({partial} partial: read from an interrupted run's passes)" if partial else ""
    lines, bad = [f"{name}: {len(rows)} rows: {counts}{note}"], 0
    for _, r in rows[~rows["status"].isin(["ok", "skipped"])].iterrows():
        bad += 1
        lines.append(f"  {r['status']} {r['impl']} n={r['seq_len']}: {str(r['reason'])[:160]}")
    return lines, bad, rows


def triton_misses(out: Path) -> list[str]:
    """Triton compiles per step (cache misses), from the listener's JSON lines: a line whose
    ``hit`` is true is a disk-cache hit (the warm cache serving it), counted apart."""
    folder = out / "triton-misses"
    if not folder.is_dir():
        return []
    counts = {}
    for path in sorted(folder.glob("*.jsonl")):
        hits = [_is_hit(line) for line in path.read_text().splitlines() if line.strip()]
        counts[path.stem] = (hits.count(False), hits.count(True))
    if not counts:
        return ["triton compiles (cache misses): none logged (no listener on PYTHONPATH?)"]
    return ["triton compiles (cache misses), 0 expected with a warm cache: " + ", ".join(
        f"{step} {misses}" + (f" ({hits} hits)" if hits else "")
        for step, (misses, hits) in counts.items())]


def _is_hit(line: str) -> bool:
    """Whether a listener line is a disk-cache hit (an unreadable line counts as a miss)."""
    try:
        return json.loads(line).get("hit") is True
    except (ValueError, AttributeError):
        return False


def verdict_counts(out: Path) -> list[str]:
    """One line: how many claims got each verdict (``verdicts/verdicts.json``), and how many of
    them decided (confirmed, refuted, mixed, holds in part)."""
    try:
        data = json.loads((out / "verdicts" / "verdicts.json").read_text())
    except (OSError, ValueError):
        return ["verdicts: no verdicts.json (the verdicts step did not finish)"]
    if isinstance(data, dict):
        data = data.get("verdicts") or data.get("claims") or []
    words = Counter(str(v.get("verdict")) for v in data if isinstance(v, dict))
    decisive = sum(words[w] for w in DECISIVE)
    total = sum(words.values())
    return [f"verdicts: {total} claims: " + ", ".join(f"{n} {w}" for w, n in words.most_common())
            + f"; decisive {decisive} of {total}"
            + (f" ({decisive / total:.0%})" if total else "") + " (verdicts/verdicts.md)"]


def measured_rows(out: Path) -> tuple[list[str], int]:
    """The verdicts step's run folders (every folder under ``verdicts/`` with rows): their
    status lines."""
    lines, bad = [], 0
    folders = {p.parent for name in ("rows.jsonl", "passes.jsonl")
               for p in (out / "verdicts").rglob(name)}  # passes alone: a run cut short
    for folder in sorted(folders):
        row_lines, row_bad, _ = run_rows(out, str(folder.relative_to(out)))
        lines += row_lines
        bad += row_bad
    return lines or ["verdicts: no rows"], bad


def summarize(out: Path) -> tuple[list[str], int]:
    lines, bad = ["proof summary", "steps:"], 0
    step_lines, step_bad = steps(out)
    lines += step_lines
    bad += step_bad
    setup = out / "setup.log"
    if setup.exists():
        lines += [line for line in setup.read_text().splitlines()
                  if line.startswith(("torch ", "attnbench list:", "warm cache", "compiling"))]
    row_lines, row_bad = measured_rows(out)
    lines += row_lines + triton_misses(out)
    bad += row_bad
    for name in TEST_STEPS:
        if (out / f"{name}.log").exists():
            test_lines, test_bad = tests(out, name)
            lines += test_lines
            bad += test_bad
    lines += verdict_counts(out)
    lines.append("result: " + ("every step ran and passed" if bad == 0 else
                               f"{bad} problem(s): see above"))
    return lines, bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the proof's OUT_DIR")
    args = parser.parse_args()
    if not args.out.is_dir():
        print(f"summary: {args.out}: no such directory", file=sys.stderr)
        return 2
    lines, bad = summarize(args.out)
    print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
