"""The summary of a ``benchmarks/gpu_proof.sh`` run: what ran, what failed, what did not fit,
and each claim the measured rows serve.

Reads OUT_DIR as the proof leaves it, finished or cut short: ``steps.tsv`` (one line per step),
the measure steps' run folders (``measure-*``), the Triton compiles each measure step logged
(``triton-misses/*.jsonl``: cache misses, 0 expected when the kernels arrived compiled), the
JUnit XML of each test step and the verdicts (``claims.json``). Each claim with rows gets one
line: its verdict, the range of its swept axis in the rows it reads, the points of each group
its verdict was formed from, the range of their ``host_frac`` and their timing mode (eager,
graph, or both). Prints the summary; exits 1 when a step failed, stopped at its cap or did not
fit, a test failed, or a measured row is neither ok nor skipped.

    python benchmarks/gpu_proof_summary.py OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.analysis.claims import DEFAULT_CLAIMS, Claim, load_claims
from harness.analysis.evidence import subject_rows
from harness.analysis.frames import column, select
from harness.measure.timing import HOST_BOUND_FRAC
from harness.results import load_rows

TEST_STEPS = ("tests-parallel", "tests-serial")
# a verdict that decides (the claim holds, fails, or holds over part of its range); the rest
# are "inconclusive" (or not judged)
DECISIVE = ("confirmed", "refuted", "mixed", "holds in part")
MODES = {"none": "eager", "cuda-graph": "graph", "compile": "compiled"}


def steps(out: Path) -> tuple[list[str], int]:
    """One line per step, and how many did not end ok."""
    path = out / "steps.tsv"
    if not path.exists():
        return ["no steps.tsv: the proof did not start"], 1
    table = pd.read_csv(path, sep="\t", dtype=str).fillna("")
    lines, bad = [], 0
    for _, s in table.iterrows():
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


def _span(values: pd.Series, digits: int = 2) -> str:
    """``0.01–0.12`` (or one number, or ``n/a``)."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return "n/a"
    lo, hi = f"{v.min():.{digits}f}", f"{v.max():.{digits}f}"
    return lo if lo == hi else f"{lo}–{hi}"


def claim_line(claim: Claim, verdict: dict | None, rows: pd.DataFrame) -> tuple[str, int]:
    """One claim in one line, and how many host-bound rows of a timed claim it reads."""
    used = select(subject_rows(rows, claim), claim.metric)
    if claim.baseline:
        used = pd.concat([used, select(subject_rows(rows, claim, baseline=True), claim.metric)])
    x = pd.to_numeric(column(used, claim.over), errors="coerce").dropna()
    span = "n/a" if x.empty else f"{x.min():g}" + ("" if x.min() == x.max() else f"..{x.max():g}")
    axis = f"{claim.over} {span}"
    groups = (verdict or {}).get("groups") or []
    points = ", ".join(str(g.get("n_points", "?")) for g in groups) or "none"
    frac = pd.to_numeric(column(used, "host_frac"), errors="coerce")
    bound = int(frac.ge(HOST_BOUND_FRAC).sum()) if claim.timed else 0
    modes = sorted({MODES.get(m, str(m)) for m in column(used, "cuda_graph").dropna()})
    word = verdict["verdict"] if verdict else "not judged"
    line = (f"  {claim.id:<40} {word:<13} {axis:<22} points/group {points:<12} "
            f"host_frac {_span(frac)}{f' ({bound} host-bound)' if bound else ''}  "
            f"{'+'.join(modes) or 'n/a'}")
    return line, bound


def claims_lines(out: Path, rows: pd.DataFrame) -> list[str]:
    """Every claim the measured rows serve: verdict, n range, points per group, host_frac
    range, timing mode; then the count of decisive verdicts."""
    path = out / "claims.json"
    try:  # absent, or cut short by the verdicts step's cap: the lines say "not judged"
        verdicts = {v["claim"]: v for v in json.loads(path.read_text())}
    except (OSError, ValueError, TypeError, KeyError):
        verdicts = {}
    served = [c for c in load_claims(DEFAULT_CLAIMS) if len(subject_rows(rows, c))]
    if not served:
        return ["claims: no measured rows"]
    lines, words, bound = [], Counter(), []
    for claim in served:
        line, host = claim_line(claim, verdicts.get(claim.id), rows)
        lines.append(line)
        words[verdicts[claim.id]["verdict"] if claim.id in verdicts else "not judged"] += 1
        if host:
            bound.append(claim.id)
    decisive = sum(words[w] for w in DECISIVE)
    head = (f"claims served by the measured rows: {len(served)}; "
            + ", ".join(f"{n} {w}" for w, n in words.most_common())
            + f"; decisive {decisive} of {len(served)} ({decisive / len(served):.0%})"
            + f"; timed claims reading a host-bound row: {len(bound)}"
            + ("" if verdicts else " (no verdicts in claims.json: the verdicts step did not "
                                   "finish)"))
    return [head, *lines]


def measured_rows(out: Path) -> tuple[list[str], int, pd.DataFrame]:
    """The measure steps' run folders: their status lines and all their rows together."""
    lines, bad, frames = [], 0, []
    for folder in sorted(out.glob("measure-*")):
        if not folder.is_dir():
            continue
        row_lines, row_bad, rows = run_rows(out, folder.name)
        lines += row_lines
        bad += row_bad
        if rows is not None:
            frames.append(rows)
    return lines, bad, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def summarize(out: Path) -> tuple[list[str], int]:
    lines, bad = ["gpu_proof summary", "steps:"], 0
    step_lines, step_bad = steps(out)
    lines += step_lines
    bad += step_bad
    setup = out / "setup.log"
    if setup.exists():
        lines += [line for line in setup.read_text().splitlines()
                  if line.startswith(("torch ", "attnbench list:", "warm cache", "compiling"))]
    row_lines, row_bad, rows = measured_rows(out)
    lines += row_lines + triton_misses(out)
    bad += row_bad
    for name in TEST_STEPS:
        if (out / f"{name}.log").exists():
            test_lines, test_bad = tests(out, name)
            lines += test_lines
            bad += test_bad
    if len(rows):
        lines += claims_lines(out, rows)
    lines.append("result: " + ("every step ran and passed" if bad == 0 else
                               f"{bad} problem(s): see above"))
    return lines, bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the proof's OUT_DIR")
    args = parser.parse_args()
    if not args.out.is_dir():
        print(f"gpu_proof_summary: {args.out}: no such directory", file=sys.stderr)
        return 2
    lines, bad = summarize(args.out)
    print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
