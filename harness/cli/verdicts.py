"""``attnbench verdicts [--minutes M] [--device cpu|cuda] [--out DIR] [--claims FILE]
[--suite FILE]... [--plugin FILE.py]... [--resume] [--dry-run] [--json]``: the verdict on every
claim from one command. The bundled claim suites of the device (``claims-*gpu*`` and
``decode-serving-gpu`` on CUDA, ``claims-*cpu*`` and ``decode-serving-cpu`` elsewhere) and
the ``--suite``\\ s are measured under one time limit, coarse to fine across all of them (the
order: :mod:`harness.execute.stages`; the session: :mod:`harness.execute.multisuite`), then
every claim is judged (:func:`harness.analysis.verdicts.judge_claims`, as ``claims`` and
``report`` judge) and the table printed: one line per claim (:mod:`harness.analysis.undecided`,
:mod:`harness.render.verdict_table`). Under ``--out``: ``runs/<suite>/`` (each suite's run
directory: rows.jsonl, passes.jsonl, env.json), ``verdicts.md``, ``verdicts.json`` and
``report/index.html``.

Exit codes, as ``run`` defines them over the rows of every suite: 0 every point ok or left out
for a stated reason (the time limit among them); 1 a point failed (error or mismatch); 2 usage
or unusable input (one line); 3 nothing was measured; 130 interrupted (``--resume``
continues).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
import tomllib
import warnings
from pathlib import Path

import torch

from harness import bundled_files, fmt
from harness.analysis.claims import DEFAULT_CLAIMS, Claim, load_claims
from harness.analysis.evidence import subject_rows
from harness.analysis.groups import DECISIVE, StoppingRule, judged_groups, point_frame
from harness.analysis.undecided import Reach, verdict_line
from harness.analysis.verdicts import judge_claims
from harness.cli import output_dir
from harness.cli.claims import usable_runs
from harness.cli.plugin_use import add_plugin_option, check_claim_names, use_plugins
from harness.cli.run import run_verdict
from harness.distributed.shard import predicted_seconds
from harness.errors import CliError, ResultsWarning, SuiteError
from harness.execute import kernel_cache
from harness.execute.deadline import Deadline
from harness.execute.multisuite import Session, has_results
from harness.execute.stages import Member, check_names, describe, schedule
from harness.measure import env
from harness.render.report import build_report
from harness.render.verdict_table import text_table, write_tables
from harness.results import dumps_json, load_envs
from harness.sweep.suite import Suite, load_suite

# the bundled suites of each device (file name patterns): its claim suites and its serving suite
SUITES = {
    "cuda": ("claims-*gpu*.toml", "decode-serving-gpu.toml"),
    "cpu": ("claims-*cpu*.toml", "decode-serving-cpu.toml"),
}
# seconds kept for judging and writing the table: this share of the minutes, at least JUDGE_S
# (judging 42 claims over 8 rows took 17 s on the 2-core CPU at load 10, ~100 rows more)
JUDGE_SHARE, JUDGE_S = 0.1, 15.0
EXIT_CODES = """exit codes (as run's, over every suite's rows): 0 every point ok or left out for a
stated reason (skipped, oom, the time limit); 1 a point failed (error or mismatch); 2 usage or
unusable input; 3 nothing was measured; 130 interrupted (--resume continues)"""


def minutes(text: str) -> float:
    """``type=`` for ``--minutes``: a positive, finite number of minutes."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of minutes: {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number of minutes: {text!r}")
    return value


def add_cli(sub) -> None:
    p = sub.add_parser(
        "verdicts",
        help="measure the claim suites under one time limit and print the verdict on every claim",
        epilog=EXIT_CODES,
        description="Measure the device's claim suites (and the --suite files) under one "
        "time limit, coarse to fine across all of them; judge every claim and print one line "
        "per claim, with what would decide an undecided one (docs/time_limit.md).",
    )
    p.add_argument(
        "--minutes",
        type=minutes,
        default=5.0,
        metavar="M",
        help="the whole command's time: the table is printed by then (default 5)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="the device whose claim suites run (default: cuda if present, else cpu)",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where the runs, verdicts.md, verdicts.json and report/ go "
        "(default: runs/verdicts-<device>-<run id>)",
    )
    p.add_argument(
        "--claims", type=Path, metavar="FILE", help="claims TOML (default: the bundled claims.toml)"
    )
    p.add_argument(
        "--suite",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="another suite to measure beside the bundled claim suites (repeatable)",
    )
    add_plugin_option(p)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the session in --out: its decided claims are not measured "
        "again; the minutes go to the points the others still lack",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the order (stages, time per suite and per claim); measure nothing",
    )
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=cmd_verdicts)


def cmd_verdicts(args) -> int:
    started = time.monotonic()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda: no CUDA device is visible here")
    if args.resume and args.out is None:
        raise CliError("--resume needs --out DIR (the verdicts session to continue)")
    out = args.out or Path("runs") / f"verdicts-{device}-{env.new_run_id()}"
    if not args.dry_run:
        output_dir(out)
    # a resumed session's runs may hold a plug-in's rows: loaded as every verb loads them
    held_runs = sorted(p for p in (out / "runs").glob("*") if p.is_dir()) if args.resume else []
    use_plugins(args.plugin, held_runs)
    claims_path = args.claims or DEFAULT_CLAIMS
    claims = load_claims(claims_path)
    check_claim_names(claims, claims_path, held_runs)
    suites = [load_suite(path) for path in suite_paths(device, args.suite)]
    check_names(suites)
    members = [member(suite, claims, out) for suite in suites]
    held = [m for m in members if has_results(m.run_dir)]
    if held and not args.resume and not args.dry_run:
        raise CliError(
            f"--out {out} holds a verdicts session ({held[0].run_dir}); add --resume "
            "to spend more minutes on its undecided claims, or choose a new --out"
        )
    decided = decided_claims(claims, held) if held and args.resume else set()
    # where each claim's points are: static, so found before the clock starts
    reaches = [] if args.dry_run else [reach(c, members, device) for c in claims]
    keep = max(JUDGE_S, JUDGE_SHARE * args.minutes * 60)
    limit = max(args.minutes * 60 - (time.monotonic() - started) - keep, 1.0)
    session = Session(members, Deadline(limit), decided)
    stages = schedule(members, limit, session.skip)
    command = (
        f"attnbench verdicts --device {device} --out {out}"
        + "".join(f" --suite {s}" for s in args.suite)
        + (f" --claims {args.claims}" if args.claims else "")
        + "".join(f" --plugin {p}" for p in args.plugin)
    )
    if args.dry_run:
        print("\n".join(describe(stages, members, limit, decided)))
        return 0
    notes = (
        kernel_cache.install(out)
        if device == "cuda"
        else ["triton cache: not used on cpu (the CPU runs no Triton kernel)"]
    )
    for note in notes:
        print(f"attnbench: {note}", file=sys.stderr)
    session.run(stages, command)
    if device == "cuda" and (line := kernel_cache.summary(out)):
        notes.append(line)
    measured = time.monotonic() - started
    return judge_and_write(
        args, claims, members, session, out, notes, device, measured, command, reaches
    )


def suite_paths(device: str, extra: list[Path]) -> list[Path]:
    """The bundled claim suites of ``device`` and the ``--suite`` files (each once)."""
    for path in extra:
        if not path.is_file():
            raise SuiteError(f"--suite {path}: suite file not found")
    paths = [*(p for pattern in SUITES[device] for p in bundled_files(pattern)), *extra]
    return list({p.resolve(): p for p in paths}.values())


def about(claim: Claim, suite: Suite) -> bool:
    """Could ``claim`` read points of ``suite`` (its implementation, baseline and scenario are
    there)? A quick filter before the groups are built from its rows."""
    impls = {p.impl for p in suite.points}
    scenarios = {p.scenario for p in suite.points}
    return (
        claim.impl in (None, *impls)
        and claim.baseline in (None, *impls)
        and claim.scenario in (None, *scenarios)
    )


def one_length(claim: Claim) -> bool:
    """A ratio or crossover claim about one value of its axis (a pair at one length is all of
    it; an exponent needs several values)."""
    return (
        claim.kind != "exponent" and claim.range is not None and (claim.range[0] == claim.range[1])
    )


def member(suite: Suite, claims: list[Claim], out: Path) -> Member:
    mine = [c for c in claims if about(c, suite)]
    single = {c.id for c in mine if one_length(c)}
    groups = [
        g
        for g in judged_groups(suite.points, mine, min_values=1)
        if len(g.units) >= 2 or g.claim in single
    ]
    timed = frozenset(c.id for c in claims if c.timed and "device" in c.aspects)
    budget = suite.measure.timing.budget_s
    return Member(
        suite,
        out / "runs" / suite.name,
        groups,
        StoppingRule(groups, claims),
        timed,
        lambda point, rate=None, first=True: predicted_seconds(point, budget, rate, first),
    )


@contextlib.contextmanager
def partial_rows_expected():
    """A session's cut points are partial rows by design (every first pass before any later
    one): the loaders' line for each run with partial rows is left out; the table says what
    the time limit left out. Other problems with rows are still said."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*an interrupted run", category=ResultsWarning)
        yield


def decided_claims(claims: list[Claim], held: list[Member]) -> set[str]:
    """Claims the rows already in ``--out`` confirm or refute (a resumed session)."""
    with partial_rows_expected():
        rows, kept, _ = usable_runs([m.run_dir for m in held])
    if not kept:
        return set()
    verdicts, _ = judge_claims(claims, rows, load_envs(kept))
    return {v.claim for v in verdicts if v.verdict in DECISIVE}


def judge_and_write(
    args,
    claims,
    members,
    session,
    out: Path,
    notes: list[str],
    device: str,
    measured: float,
    command: str,
    reaches: list[Reach],
) -> int:
    """Judge every claim on the rows of every suite, write verdicts.md and verdicts.json, print
    the table, build the report; the exit code of the rows (``run``'s)."""
    dirs = [m.run_dir for m in members if has_results(m.run_dir)]
    with partial_rows_expected():
        rows, kept, _ = usable_runs(dirs)
    verdicts, note = judge_claims(claims, rows, load_envs(kept))
    lines = [
        verdict_line(v, c, rows, where, seconds(session, members))
        for v, c, where in zip(verdicts, claims, reaches, strict=True)
    ]
    said = [  # the session's own lines (the cache's were said when it was installed)
        f"device {device}; {args.minutes:g} min asked, measured for {measured:.0f} s; "
        f"suites: {', '.join(m.suite.name for m in members)}",
        *([note] if note else []),
    ]
    left = sum(len(ids) for ids in session.left_out.values())
    if left:
        said.append(
            f"{fmt.plural(left, 'point')} left out by the time limit; more minutes: "
            f"{command} --resume --minutes M"
        )
    notes = [*said[:1], *notes, *said[1:]]
    write_tables(
        out,
        lines,
        notes,
        {"device": device, "minutes": args.minutes, "measured_s": round(measured, 1)},
    )
    if args.json:
        print(
            dumps_json(
                {"device": device, "notes": notes, "claims": [line.as_dict() for line in lines]}
            )
        )
    else:
        print(text_table(lines))
        for text in said:
            print(f"attnbench: {text}", file=sys.stderr)
    sys.stdout.flush()
    if kept:
        with partial_rows_expected():
            page = build_report(
                kept, out / "report", args.claims or DEFAULT_CLAIMS, "attnbench verdicts"
            )
        print(f"attnbench: report: {page}; table: {out / 'verdicts.md'}", file=sys.stderr)
    return run_verdict(*dirs) if dirs else 3


def seconds(session: Session, members: list[Member]):
    """Expected seconds of a point not measured yet: the session's pace when it has one."""
    predict = {p.point_id: m.predict for m in members for p in m.suite.points}

    def expected(point) -> float:
        guess = session.deadline.expected(point, True) if session.deadline.started else 0.0
        return guess or predict[point.point_id](point)

    return expected


_OTHER_SUITES: dict[str, list[Suite]] = {}


def reach(claim: Claim, members: list[Member], device: str) -> Reach:
    """Where ``claim``'s points are: groups over the session's suites, else the bundled suites
    of ``device`` outside the session that have its points."""
    groups = tuple((m.suite.name, g) for m in members for g in m.groups if g.claim == claim.id)
    points = {p.point_id: p for m in members for p in m.suite.points}
    if groups:
        return Reach(groups, points)
    here = tuple(
        m.suite.name for m in members if len(subject_rows(point_frame(m.suite.points), claim))
    )
    if here:
        return Reach((), points, here=here)
    names = {m.suite.name for m in members}
    elsewhere = tuple(
        s.path
        for s in other_suites(device)
        if s.name not in names and len(subject_rows(point_frame(s.points), claim))
    )
    return Reach((), points, elsewhere)


def other_suites(device: str) -> list[Suite]:
    """The bundled suites whose points run on ``device`` (loaded once; a file that says
    another device, or no suite at all, is not expanded)."""
    if device not in _OTHER_SUITES:
        found = []
        for path in bundled_files("*.toml"):
            try:
                doc = tomllib.loads(path.read_text())
                if "claim" in doc or str(doc.get("device", "cpu")).split(":")[0] != device:
                    continue
                found.append(load_suite(path))
            except (OSError, ValueError, CliError):
                continue  # a suite this installation cannot expand has no points to offer
        _OTHER_SUITES[device] = found
    return _OTHER_SUITES[device]
