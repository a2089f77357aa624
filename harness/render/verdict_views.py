"""Verdicts shown: as plain text for a terminal (``attnbench claims``), and as the report's
Claims section: one table with the claims about these runs first and the others folded, the
contention and beaten-calibration notes, under each time claim its fit over the plateau
with utilization drawn against the same axis, and under each ratio or trend claim its matched
points' ratios against what was claimed. Both views take their verdicts from
:func:`harness.analysis.verdicts.judge_claims`, the one judging path."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis.claims import VERDICTS, Claim, load_claims
from harness.analysis.judging import head
from harness.analysis.verdicts import Verdict, judge_claims, verdict_table
from harness.render.page import Section
from harness.render.panels import axis_label, display_unit
from harness.render.plots import Series, fit_over_utilization, ratio_along

MAX_GROUPS = 8  # series per claim figure


def format_value(value: float | None) -> str:
    """A measured value or interval end to 3 significant digits, from 1000 up as a plain whole
    number (an axis value such as a crossover n: 1904, not 1.9e+03); ``n/a`` when it is None,
    NaN or infinite (a censored interval end)."""
    finite = value is not None and math.isfinite(value)
    if finite and abs(value) >= 1000:
        return f"{value:.0f}"
    return fmt.number(float(value) if finite else None, digits=3, missing="n/a")


def render_text(verdicts: list[Verdict], fold: bool = False, hints: dict | None = None) -> str:
    """A plain-text verdict list: one headline per claim, its statement quoted below it, the
    deciding group's reason, every other judged group (the worst first; past
    :data:`MAX_GROUP_LINES`, ``k more groups``), then the counts. Utilization only for time
    claims. ``fold``: the claims these runs cannot judge (no rows, or an implementation,
    baseline or device they lack) in one line at the end instead (``attnbench claims``
    without ``--all``). ``hints``: claim id -> one more line under it (the suite that
    decides a claim left on thin data)."""
    hints = hints or {}
    folded = [v for v in verdicts if fold and not v.about_these_runs]
    verdicts = [v for v in verdicts if not (fold and not v.about_these_runs)]
    width = max((len(v.claim) for v in verdicts), default=5)
    pad = " " * width
    lines = []
    for v in verdicts:
        interval = f"[{format_value(v.ci_low)}, {format_value(v.ci_high)}]"
        aspect = "work" if v.aspect == "work" else "time" if v.timed else ""
        lines.append(
            f"{v.claim:<{width}}  {v.verdict:<13}  measured {format_value(v.measured):>7} "
            f"{interval:<18} expected {v.expected}"
            + (f"  {v.utilization()}" if v.timed and v.aspect != "work" else "")
            + (f"  [{aspect}]" if aspect else "")
        )
        lines += [f"{pad}  {line}" for line in explanation(v)]
        if v.claim in hints:
            lines.append(f"{pad}  {hints[v.claim]}")
    if folded:
        lines.append(
            f"{fmt.plural(len(folded), 'claim')} about implementations, baselines or devices "
            f"these runs do not have (inconclusive: missing rows), not listed; --all lists "
            f"them: {', '.join(v.claim for v in folded)}"
        )
    lines.append(_counts([v.verdict for v in verdicts])
                 + (f" (and {len(folded)} without rows)" if folded else ""))
    if any(v.work_verdict for v in verdicts):
        lines.append("work: " + _counts([v.work_verdict for v in verdicts]))
    return "\n".join(lines)


def explanation(v: Verdict) -> list[str]:
    """The lines under a verdict's headline: the claim's statement quoted, the deciding
    group's reason, the other judged groups, the work verdict (the CLI text and the report's
    claims table alike)."""
    lines = [f'"{v.text}"'] if v.text else []
    lines.append(f"{v.group + ': ' if v.group else ''}{v.reason}")
    lines += other_groups(v)
    if v.work_verdict is not None:
        lines.append(
            f"work: {v.work_verdict}, exponent {format_value(v.work_measured)} ({v.work_reason})"
        )
    return lines


def claims_view(verdicts: list[Verdict]) -> pd.DataFrame:
    """The report's claims table as the CLI says it, in four columns that fit a page: the
    claim (and what it is judged on), the verdict, measured [interval] vs expected (with
    utilization for a time verdict), and the statement with the reasons (one per line)."""
    records = []
    for v in verdicts:
        aspect = "work" if v.aspect == "work" else "time" if v.timed else ""
        measured = (f"{format_value(v.measured)} [{format_value(v.ci_low)}, "
                    f"{format_value(v.ci_high)}]\nexpected {v.expected}")
        if v.timed and v.aspect != "work":
            measured += f"\n{v.utilization()}"
        records.append({
            "claim": v.claim + (f" [{aspect}]" if aspect else ""),
            "verdict": v.verdict,
            "measured vs expected": measured,
            "statement and reason": "\n".join(explanation(v)),
        })
    return pd.DataFrame(records, columns=list(VIEW_COLUMNS))


VIEW_COLUMNS = ("claim", "verdict", "measured vs expected", "statement and reason")
MAX_GROUP_LINES = 3  # other groups listed under a claim before "k more groups"
_SEVERITY = {"refuted": 0, "mixed": 1, "holds in part": 2, "confirmed": 3, "inconclusive": 4}


def other_groups(v: Verdict) -> list[str]:
    """The judged groups besides the one that decided ``v``, worst first, groups with the same
    verdict and reason on one line: ``also causal=True: refuted 10 [6.63, 10.8], outside
    ...``; ``also 5 groups (a; b; ...): inconclusive, thin data (1 point ...)``. Past
    :data:`MAX_GROUP_LINES` lines, one ``k more groups`` line (``--json`` lists every group)."""
    others = [g for g in v.groups if g.get("group") != v.group]
    if len(v.groups) < 2 or not others:
        return []
    others.sort(key=lambda g: _SEVERITY.get(g.get("verdict"), 5))
    alike: dict[tuple[str, str], list[dict]] = {}
    for g in others:
        alike.setdefault((g["verdict"], head(g.get("reason", ""))), []).append(g)
    lines = []
    for (verdict, reason), groups in list(alike.items())[:MAX_GROUP_LINES]:
        labels = [g["group"] for g in groups]
        named = labels[0] if len(labels) == 1 else (
            f"{len(labels)} groups ({'; '.join(labels[:2])}{'; ...' if len(labels) > 2 else ''})"
        )
        g = groups[0]
        value = ""
        if len(groups) == 1 and g.get("measured") is not None and math.isfinite(g["measured"]):
            value = (f" {format_value(g['measured'])} [{format_value(g.get('ci_low'))}, "
                     f"{format_value(g.get('ci_high'))}]")
        lines.append(f"also {named}: {verdict}{value}, {reason}")
    rest = sum(len(gs) for gs in list(alike.values())[MAX_GROUP_LINES:])
    if rest:
        lines.append(f"{fmt.plural(rest, 'more group')} (--json lists every group)")
    return lines


def _counts(verdicts: list[str | None]) -> str:
    """``5 confirmed, 1 refuted, 2 holds in part, 8 inconclusive``: mixed and holds in part
    only when some claim has them."""
    always = ("confirmed", "refuted", "inconclusive")
    counts = {k: verdicts.count(k) for k in VERDICTS}
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n or k in always)


INTRO = (
    "Each claim's verdict: confirmed (interval inside the claimed band), refuted (outside), "
    "mixed (groups of rows that decide disagree), holds in part (a ratio inside the band over "
    "part of its axis: the regions say where), inconclusive (interval spans the claim, thin "
    "data, missing rows). A time verdict is "
    "fitted only where the device's utilization is level along the claim's axis (plateau: "
    "where it was fitted; utilization: the range over the rows used); where utilization climbs "
    "or falls, the time measures the device, not the algorithm, and there is no time verdict. "
    "Work verdicts fit the cost model's counts over every swept point (docs/claims.md). Claims "
    "about these runs come first; the others are folded."
)


Judged = tuple[list[Claim], list[Verdict], str | None]  # claims, verdicts, contention note


def judge_file(
    rows: pd.DataFrame,
    claims_path: Path | None,
    envs: dict | None = None,
    allow_contended: bool = False,
) -> Judged | None:
    """The claims of a claims file and their verdicts over the rows (None without a file):
    judged once per report, for its summary and its Claims section."""
    if claims_path is None or not Path(claims_path).is_file():
        return None
    claims = load_claims(claims_path)
    verdicts, note = judge_claims(claims, rows, envs, allow_contended=allow_contended)
    return claims, verdicts, note


def claims_section(
    rows: pd.DataFrame,
    claims_path: Path | None,
    envs: dict | None = None,
    allow_contended: bool = False,
    judged: Judged | None = None,
) -> Section:
    """Each claim's verdict from the claims file (left out when there is none): the table
    (claims with rows in these runs first, the rest folded), the notes, and a figure under
    each time, ratio or trend claim. ``judged``: the verdicts when the caller has them already."""
    judged = judged or judge_file(rows, claims_path, envs, allow_contended)
    if judged is None:
        return Section("claims", "Claims", INTRO)  # no claims file: left out
    claims, verdicts, note = judged
    order = sorted(range(len(verdicts)), key=lambda i: not verdicts[i].about_these_runs)
    verdicts = [verdicts[i] for i in order]
    by_id = {c.id: c for c in claims}
    table = verdict_table(verdicts)
    related = sum(v.about_these_runs for v in verdicts)
    section = Section(
        "claims",
        f"Claims ({Path(claims_path).name})",
        INTRO,
        [("claims", table)],  # the CSV: every column of every verdict
        views={"claims": claims_view(verdicts)},  # the page: as `attnbench claims` says it
    )
    if related < len(verdicts):
        # the page adds their count
        other = "claims about implementations, baselines or devices these runs do not have"
        section.folds["claims"] = (related, other)
    if note:
        section.notes.append(note)
    section.notes += [
        f"{v.claim}: {v.utilization()}: a row beat its calibration, so its utilization is "
        "overstated (re-calibrate on an idle machine)"
        for v in verdicts
        if v.calibration_beaten
    ]
    for v in verdicts[:related]:
        image = claim_figure(v, by_id[v.claim])
        if image is not None:
            section.images.append((f"claim-{v.claim}", image))
    return section


def claim_figure(verdict: Verdict, claim: Claim) -> bytes | None:
    """A time claim's fit over its plateau, above utilization against the same axis; a ratio
    or trend claim's ratios along its axis (:func:`ratio_figure`); None for a claim without
    that evidence (memory, work-only, no rows)."""
    groups = [g for g in verdict.groups if g.get("_evidence", {}).get("basis")][:MAX_GROUPS]
    if not groups:
        return ratio_figure(verdict, claim)
    values = [y for g in groups for y in g["_evidence"]["y"]]
    unit, k = display_unit(claim.metric, values)
    fitted, util, regions = [], [], []
    percent = all(g["_evidence"]["basis"] == "utilization" for g in groups)
    for g in groups:
        ev = g["_evidence"]
        label = g["group"] if len(groups) > 1 else (claim.impl or g["group"])
        fit = ev["fit"]
        if fit is not None:
            fit = {**fit, "prefactor": fit["prefactor"] * k, "offset": fit["offset"] * k}
        x = np.asarray(ev["x"], float)
        fitted.append(Series(label, x, np.asarray(ev["y"], float) * k, fit,
                             claim.expect_exponent))
        scale = 100.0 if ev["basis"] == "utilization" else 1e-12
        util.append(Series(label, x, np.asarray(ev["utilization"], float) * scale))
        if ev["region"]:
            regions.append(tuple(ev["region"]))
    span = fmt.percent_range(verdict.util_low, verdict.util_high)
    title = f"{claim.id}: {verdict.verdict} (time)" + (
        f", util {span} of {verdict.util_basis}" if span != "n/a" else ""
    )
    return fit_over_utilization(
        fitted, util, regions,
        xlabel=claim.over,
        ylabel=axis_label(claim.metric, unit),
        util_label=f"% of {claim.saturation_rule}" if percent else "achieved TFLOP/s",
        title=title,
        percent=percent,
    )


def ratio_figure(verdict: Verdict, claim: Claim) -> bytes | None:
    """A ratio or trend claim's matched points: each group's ratio with its interval along
    the claim's axis, the claimed band (a ratio) or exponents (a trend, with its fit); None
    when no group has matched points."""
    groups = [g for g in verdict.groups if g.get("_ratios", {}).get("x")][:MAX_GROUPS]
    if not groups:
        return None
    trend = claim.kind == "trend"
    series = [
        Series(g["group"] if len(groups) > 1 else "matched points", r["x"], r["y"],
               r["fit"], claim.expect_exponent if trend else None, r["low"], r["high"])
        for g in groups
        for r in (g["_ratios"],)
    ]
    top, bottom = claim.in_ratio_order(*ratio_sides(claim))
    per = f" / {claim.over}" if claim.relative_to else ""
    lo, hi = claim.band
    return ratio_along(
        series,
        band=None if trend else (lo, hi),
        fan=(lo, hi) if trend else None,
        xlabel=claim.over,
        ylabel=f"ratio of {claim.metric}{per}",
        title=f"{claim.id}: {verdict.verdict}\n{top} / {bottom}{per}",
    )


def ratio_sides(claim: Claim) -> tuple[str, str]:
    """The two sides of a ratio claim in words, the implementation's then the baseline's
    (:meth:`Claim.in_ratio_order` puts them in the ratio's order): each, with the settings of
    ``baseline_where`` where they tell the sides apart (``full [cache=paged]`` over ``full
    [cache=full]``)."""
    own = claim.baseline_where or {}
    keys = [k for k in own if claim.where.get(k) != own[k]]

    def side(impl: str | None, where: dict) -> str:
        shown = " ".join(f"{k}={where[k]}" for k in keys if k in where)
        return f"{impl} [{shown}]" if shown else str(impl)

    return side(claim.impl, claim.where), side(claim.baseline, own)
