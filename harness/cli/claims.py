"""``attnbench claims RUN_DIR [RUN_DIR...] [--claims FILE] [--json] [--all]
[--allow-contended]``: the verdict on every claim of a claims file from the rows of run
directories.

Several run directories, some unusable (a run that crashed before its first row has env.json
and no rows.jsonl): each one without usable rows or without env.json is skipped with one
warning line and the others are judged. Exit status: 0 when every directory was judged; 3 when
some were skipped and the verdicts come from the rest (a CI job that judges ``runs/*`` must not
pass silently over a crashed run, and 1 and 2 already mean a wrong result and unusable input:
a script that accepts a partial answer tests for 3); 2 when nothing was left to judge, in one
line.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pandas as pd

from harness import PROJECT_DIR
from harness.analysis.claims import DEFAULT_CLAIMS, Claim, load_claims
from harness.analysis.exponents import coverage, points_needed
from harness.analysis.verdicts import Verdict, judge_claims
from harness.cli.plugin_use import add_plugin_option, check_claim_names, use_plugins
from harness.errors import CliError
from harness.render.verdict_views import render_text
from harness.results import ENV_FILE, ROWS_FILE, ResultsError, dumps_json, load_envs, load_rows
from harness.sweep.suite import load_suite

SKIPPED = 3  # exit status: verdicts printed, but some run directory was skipped


def add_cli(subparsers) -> None:
    """Add ``attnbench claims RUN_DIR [RUN_DIR...] [--claims FILE] [--json] [--all]``."""
    p = subparsers.add_parser("claims", help="verdicts on the claims file from run directories",
                              description="Exit status: 0 every run directory judged; 3 some "
                              "skipped (no usable rows or no env.json: one warning line each), "
                              "the verdicts from the rest; 2 nothing left to judge.")
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument(
        "--claims",
        type=Path,
        default=DEFAULT_CLAIMS,
        help=f"claims TOML (default: {DEFAULT_CLAIMS.name} in suites/)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="a JSON list of every claim: claim, verdict, measured, ci_low, ci_high, regions, ...",
    )
    p.add_argument(
        "--all",
        action="store_true",
        dest="show_all",
        help="list the claims these runs cannot judge too (no rows, or an implementation, "
        "baseline or device they lack; folded into one line "
        "by default)",
    )
    p.add_argument(
        "--allow-contended",
        action="store_true",
        help="use rows measured under contention for time verdicts (left out of them by "
        "default; memory and work verdicts always use them)",
    )
    add_plugin_option(p)
    p.set_defaults(func=cmd_claims)


def usable_runs(run_dirs: list[Path]) -> tuple[pd.DataFrame, list[Path], list[str]]:
    """The rows of the run directories that can be judged, those directories, and one line
    per directory skipped (no usable rows, or no env.json beside them)."""
    frames, kept, skipped = [], [], []
    for run_dir in run_dirs:
        folder = run_dir.parent if run_dir.name == ROWS_FILE else run_dir
        try:
            frame = load_rows(run_dir)
        except ResultsError as exc:
            skipped.append(f"{run_dir}: skipped: {exc}")
            continue
        if not (folder / ENV_FILE).is_file():
            skipped.append(f"{run_dir}: skipped: no {ENV_FILE} (the run's environment and "
                           "calibration); its rows cannot be judged")
            continue
        frames.append(frame)
        kept.append(run_dir)
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return rows, kept, skipped


def cmd_claims(args) -> int:
    """Load the claims and the usable runs, judge, print the verdicts (text or ``--json``);
    exit 0, or :data:`SKIPPED` when a run directory was skipped (see the module docstring)."""
    claims = load_claims(args.claims)
    use_plugins(args.plugin, args.run_dirs)
    check_claim_names(claims, args.claims, args.run_dirs)
    rows, kept, skipped = usable_runs(args.run_dirs)
    if not kept:  # one line: why the only (or every) directory cannot be judged
        raise CliError("; ".join(skipped) if len(skipped) == 1 else
                       f"nothing to judge: every run directory was skipped ({'; '.join(skipped)})")
    for line in skipped:
        print(f"attnbench: warning: {line}", file=sys.stderr)
    verdicts, note = judge_claims(claims, rows, load_envs(kept),
                                  allow_contended=args.allow_contended)
    if note:
        print(f"attnbench: warning: {note}", file=sys.stderr)
    if args.json:
        print(dumps_json([{**v.as_dict(), "utilization": v.utilization()} for v in verdicts]))
    else:
        hints = deciding_suites(verdicts, claims, rows)
        print(render_text(verdicts, fold=not args.show_all, hints=hints))
    return SKIPPED if skipped else 0


def deciding_suites(verdicts: list[Verdict], claims: list[Claim], rows: pd.DataFrame) -> dict:
    """claim id -> the line that names the bundled suite deciding it, for each exponent claim
    these rows leave inconclusive on thin data: the first suite (by name) on the rows' devices
    whose sweep gives one fit group more values of ``over`` than these rows, and at least the
    ones a fit needs, read from the suite's points (:func:`harness.analysis.exponents.coverage`),
    not from a table."""
    by_id = {c.id: c for c in claims}
    thin = [by_id[v.claim] for v in verdicts
            if v.verdict == "inconclusive" and v.about_these_runs and v.claim in by_id
            and by_id[v.claim].kind == "exponent" and "thin data" in f"{v.reason} {v.work_reason}"]
    if not thin:
        return {}
    devices = {str(d) for d in rows.get("device", pd.Series(["cpu"])).dropna()}
    hints = {}
    for claim in thin:
        have, need = coverage(rows, claim), points_needed(claim)
        for path in _candidate_suites(claim, devices):
            points = pd.DataFrame([p.columns() for p in load_suite(path).points])
            found = coverage(points, claim) if len(points) else 0
            if found >= need and found > have:
                shown = path.relative_to(PROJECT_DIR) if path.is_relative_to(PROJECT_DIR) else path
                hints[claim.id] = (f"decided by a run of {shown}: {found} values of {claim.over} "
                                   f"in one group (these rows have {have})")
                break
    return hints


def _candidate_suites(claim: Claim, devices: set[str]) -> list[Path]:
    """The bundled suites (not claims files) on one of ``devices`` that name the claim's
    implementation and baseline, read from their TOML without expanding them."""
    out = []
    for path in sorted(DEFAULT_CLAIMS.parent.glob("*.toml")):
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            continue
        named = set(doc.get("implementations") or ())
        named |= {v.get("implementation") for v in doc.get("variant") or () if isinstance(v, dict)}
        wanted = {claim.impl, claim.baseline} - {None}
        if "claim" in doc or doc.get("device", "cpu") not in devices | {"auto"}:
            continue
        if wanted <= named:
            out.append(path)
    return out
