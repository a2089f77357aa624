"""Several suites measured under one time limit (``attnbench verdicts``): one clock, one pace,
one coarse-to-fine order across every suite, so a session cut anywhere holds the rows that
decide the most claims it could.

While it runs, the stopping rule (:class:`~harness.analysis.groups.StoppingRule`, one per
suite, over the suite's first passes of every stage so far) marks groups decided; a point
whose every group is decided (or whose claims the rows already in ``--out`` decide) is not
measured. A stage is one :func:`~harness.execute.session.run_suite` call into the suite's run
directory with the shared :class:`~harness.execute.deadline.Deadline`; ``--resume`` continues
each directory as ``run --resume`` does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.errors import Interrupted
from harness.execute.deadline import Deadline
from harness.execute.passlog import PassLog
from harness.execute.session import RunOptions, configure, run_suite
from harness.execute.stages import DEAR, Member, Stage, point_ids
from harness.results import ENV_FILE, PASSES_FILE, ROWS_FILE, iter_rows, load_env


def has_results(run_dir: Path) -> bool:
    return (run_dir / ROWS_FILE).exists() or (run_dir / PASSES_FILE).exists()


def first_passes(member: Member) -> dict[str, dict]:
    """point id -> its first-pass record or row so far (rows.jsonl and passes.jsonl)."""
    if not has_results(member.run_dir):
        return {}
    ids = {p.point_id for p in member.suite.points}
    out = {
        pid: first
        for pid, (first, _) in PassLog(member.run_dir).read(ids).items()
        if first is not None
    }
    rows = member.run_dir / ROWS_FILE
    if rows.exists():
        out.update({r["point_id"]: r for r in iter_rows(rows) if r.get("point_id") in ids})
    return out


def finished(member: Member) -> set[str]:
    """Point ids with a final row in the suite's run directory."""
    rows = member.run_dir / ROWS_FILE
    return {r.get("point_id") for r in iter_rows(rows)} if rows.exists() else set()


@dataclass
class Session:
    """One ``verdicts`` measurement: the members, the shared deadline and what it left out."""

    members: list[Member]
    deadline: Deadline
    decided_claims: set[str] = field(default_factory=set)  # decided by rows in --out at start
    left_out: dict[str, set[str]] = field(default_factory=dict)  # suite -> point ids not run
    calibrations: dict[tuple[str, int | None], dict] = field(default_factory=dict)
    measured: dict[str, str] = field(default_factory=dict)  # point id -> suite that measured it
    say: Callable[[str], None] = lambda text: print(text, file=sys.stderr)

    def skip(self, member: Member, pid: str, timed_only: bool = False) -> bool:
        """Is the point not worth measuring: every group that reads it is decided (by the
        stopping rule, or its claim by the rows in --out when the session started)?
        ``timed_only``: of the groups of claims judged on time (later passes refine a time;
        memory and counts are measured once, in the first pass)."""
        mine = [
            g
            for g in member.groups
            if pid in point_ids(g) and (not timed_only or g.claim in member.time_judged)
        ]
        if timed_only and not mine:
            return True  # read by no time claim: a later pass would refine nothing
        return bool(mine) and all(
            g.claim in self.decided_claims or g.label in member.rule.decided for g in mine
        )

    def run(self, stages: Sequence[Stage], command: str) -> None:
        """Run ``stages`` in order under the deadline; Ctrl-C says how to continue
        (``command``)."""
        by_name = {m.suite.name: m for m in self.members}
        try:
            for number, stage in enumerate(stages, 1):
                member = by_name[stage.suite]
                if self.deadline.elapsed() >= self.deadline.limit_s:
                    self._leave(member, stage)
                    continue
                self._stage(member, stage, number, len(stages))
        except (Interrupted, KeyboardInterrupt):
            raise Interrupted(
                f"interrupted: every finished row and timing pass is saved under "
                f"the run directories of --out; continue with: {command} "
                "--resume"
            ) from None

    def _stage(self, member: Member, stage: Stage, number: int, total: int) -> None:
        done = finished(member)
        firsts = first_passes(member)
        self.measured.update((pid, member.suite.name) for pid in firsts)
        # a point another suite of the session measured (the same fields) is judged from there
        elsewhere = {pid for pid, name in self.measured.items() if name != member.suite.name}
        ids = [
            pid
            for pid in stage.point_ids
            if pid not in done
            and pid not in elsewhere
            and not self.skip(member, pid)
            and (stage.later or pid not in firsts)
        ]
        if stage.later:  # later passes: points whose first pass went well, for a time claim
            ids = [
                pid
                for pid in ids
                if (firsts.get(pid) or {}).get("status") == "ok"
                and not self.skip(member, pid, timed_only=True)
            ]
        if not ids:
            return
        wanted = set(ids)
        suite = replace(
            member.suite, points=tuple(p for p in member.suite.points if p.point_id in wanted)
        )
        measure = configure(member.suite, RunOptions(time_limit=self.deadline.limit_s))
        prior = [r for pid, r in firsts.items() if pid not in wanted and r.get("status") == "ok"]
        rule = member.rule
        options = RunOptions(
            out=member.run_dir,
            resume=has_results(member.run_dir),
            progress=False,
            time_limit=self.deadline.limit_s,
            first_order=tuple(ids),
            stopping_rule=lambda rows, env: rule([*prior, *rows], env),
            wanted=rule.wanted,
        )
        what = (
            "later passes"
            if stage.later
            else f"level {stage.level}"
            if stage.level < DEAR
            else "a dear point"
        )
        self.say(
            f"attnbench: verdicts: stage {number}/{total}: {member.suite.name}, {what}: "
            f"{len(ids)} point{'s' if len(ids) != 1 else ''} "
            f"({self.deadline.elapsed():.0f} s of {self.deadline.limit_s:.0f} s)"
        )
        self.deadline.later_passes = stage.later
        key = (
            member.suite.points[0].device if member.suite.points else "cpu",
            member.suite.measure.threads,
        )
        run_suite(
            suite,
            measure,
            options,
            predict=member.predict,
            deadline=self.deadline,
            calibration=self.calibrations.get(key),
            quiet=True,
        )
        if key not in self.calibrations and (member.run_dir / ENV_FILE).is_file():
            calibration = load_env(member.run_dir).get("calibration")
            if calibration and not member.suite.measure.isolate:
                self.calibrations[key] = calibration
        ran = first_passes(member)
        self.measured.update((pid, member.suite.name) for pid in ran)
        missed = {pid for pid in ids if pid not in ran} if not stage.later else set()
        self.left_out.setdefault(member.suite.name, set()).update(missed)

    def _leave(self, member: Member, stage: Stage) -> None:
        if not stage.later:
            firsts = first_passes(member)
            self.left_out.setdefault(member.suite.name, set()).update(
                pid for pid in stage.point_ids if pid not in firsts
            )
