"""The summary of a ``benchmarks/gpu_proof.sh`` run: what ran, what failed, what did not fit.

Reads OUT_DIR as the proof leaves it, finished or cut short: ``steps.tsv`` (one line per step),
the JUnit XML of each test step, the smoke and profile run folders, the decode targets' log and
the verdicts. Prints the summary; exits 1 when a step failed, stopped at its cap or did not fit,
a test failed, or a suite row is neither ok nor skipped.

    python benchmarks/gpu_proof_summary.py OUT_DIR
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.results import load_rows

TEST_STEPS = ("tests-parallel", "tests-serial")
SMOKE = ("gpu-smoke-decode", "gpu-smoke")


def steps(out: Path) -> tuple[list[str], int]:
    """One line per step, and how many did not end ok."""
    path = out / "steps.tsv"
    if not path.exists():
        return ["no steps.tsv: the proof did not start"], 1
    table = pd.read_csv(path, sep="\t", dtype=str).fillna("")
    lines, bad = [], 0
    for _, s in table.iterrows():
        note = f" ({s['note']})" if s["note"] else ""
        lines.append(f"  {s['step']:<15} {s['status']:<22} {s['seconds']:>4} s of cap "
                     f"{s['cap_s']} s{note}")
        bad += s["status"] != "ok"
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


def smoke_figures(name: str, rows: pd.DataFrame) -> list[str]:
    """The figures worth reading at a glance: the largest causal points, the decode steps."""
    ok = rows[rows["status"] == "ok"]
    if ok.empty:
        return []
    if name == "gpu-smoke":
        big = ok[(ok["seq_len"] == ok["seq_len"].max()) & ok["causal"]]
        return [f"  {r['impl']:>15} n={r['seq_len']} causal: {r['time_median_s'] * 1e3:8.3f} ms "
                f"{r['tflops_per_s'] or 0:7.1f} TFLOP/s agree={r['agree']}"
                for _, r in big.sort_values("time_median_s").iterrows()]
    return [f"  decode n={r['seq_len']} {r.get('decode_graph')}: "
            f"{r['time_median_s'] * 1e3:.3f} ms/token, {r['bw_fraction']:.2f} of measured "
            f"bandwidth" + (f" [{r['decode_graph_reason']}]"
                            if isinstance(r.get("decode_graph_reason"), str) else "")
            for _, r in ok.iterrows()]


def verdict_lines(out: Path) -> list[str]:
    """The claims' verdict words and counts, from claims.txt."""
    path = out / "claims.txt"
    if not path.exists():
        return ["claims: not judged"]
    text = path.read_text()
    words = re.findall(r"\b(confirmed|refuted|inconclusive|mixed|holds in part)\b", text)
    counts = pd.Series(words, dtype=str).value_counts().to_dict() if words else {}
    return [f"claims on the profile rows: {counts or 'no verdicts'} (claims.txt, report/)"]


def summarize(out: Path) -> tuple[list[str], int]:
    lines, bad = ["gpu_proof summary", "steps:"], 0
    step_lines, step_bad = steps(out)
    lines += step_lines
    bad += step_bad
    listing = out / "setup.log"
    if listing.exists():
        lines += [line for line in listing.read_text().splitlines()
                  if line.startswith(("torch ", "attnbench list:"))]
    for name in TEST_STEPS:
        if (out / f"{name}.log").exists():
            test_lines, test_bad = tests(out, name)
            lines += test_lines
            bad += test_bad
    for name in SMOKE:
        if (out / f"{name}").exists() or (out / "smoke.log").exists():
            row_lines, row_bad, rows = run_rows(out, name)
            lines += row_lines + (smoke_figures(name, rows) if rows is not None else [])
            bad += row_bad
    targets = out / "decode-targets.log"
    if targets.exists():
        lines += ["decode targets:", *("  " + t for t in targets.read_text().splitlines()[-6:])]
    for folder in sorted(out.glob("profile-*")):
        row_lines, row_bad, _ = run_rows(out, folder.name)
        lines += row_lines
        bad += row_bad
    profile_log = out / "profile.log"
    if profile_log.exists():
        lines += ["  " + t for t in profile_log.read_text().splitlines()
                  if t.startswith("profile-") and not t.endswith("finished")]
    lines += verdict_lines(out)
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
