"""The verdict table of ``attnbench verdicts``: one line per claim as text (the terminal) and as
a markdown table (``verdicts.md``), from :class:`harness.analysis.undecided.VerdictLine`\\ s.
Claims no bundled suite of the device measures (another device's claims) are folded into one
line at the end; ``verdicts.json`` has every line."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness import fmt
from harness.analysis.claims import VERDICTS
from harness.analysis.undecided import VerdictLine
from harness.render.verdict_views import format_value
from harness.results import dumps_json

OTHER_DEVICE = "no rows: no bundled suite of this device"


def _other(line: VerdictLine) -> bool:
    return line.decide.startswith(OTHER_DEVICE)


def _value(line: VerdictLine) -> str:
    if line.measured is None:
        return "n/a"
    return (
        f"{format_value(line.measured)} [{format_value(line.ci_low)}, {format_value(line.ci_high)}]"
    )


def _used(line: VerdictLine) -> str:
    if not line.axis:
        return "no rows"
    return f"{line.axis}, {fmt.plural(line.points, 'point')}" if line.points else line.axis


def counts(lines: Sequence[VerdictLine]) -> str:
    """``5 confirmed, 2 refuted, 9 inconclusive`` (mixed and holds in part when present)."""
    verdicts = [line.verdict for line in lines]
    always = ("confirmed", "refuted", "inconclusive")
    return ", ".join(
        f"{verdicts.count(k)} {k}" for k in VERDICTS if verdicts.count(k) or k in always
    )


def text_table(lines: Sequence[VerdictLine]) -> str:
    """One line per claim: id, verdict, the figure and interval, expected, axis range and
    points, timing mode, the statement, and for a claim not decided what would decide it;
    then the folded claims and the counts."""
    shown = [line for line in lines if not _other(line)]
    folded = [line for line in lines if _other(line)]
    width = max((len(line.claim) for line in shown), default=5)
    out = []
    for line in shown:
        text = (
            f"{line.claim:<{width}}  {line.verdict:<13} {_value(line):<24} expected "
            f"{line.expected}; {_used(line)}"
            + (f"; {line.timing}" if line.timing else "")
            + f'; "{line.statement}"'
        )
        if line.decide:
            text += f"; would decide it: {line.decide}"
        out.append(text)
    if folded:
        out.append(
            f"{fmt.plural(len(folded), 'claim')} about another device's rows, not judged "
            f"here: {', '.join(line.claim for line in folded)}"
        )
    out.append(
        f"verdicts: {counts(shown)}" + (f" (and {len(folded)} not judged here)" if folded else "")
    )
    return "\n".join(out)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(lines: Sequence[VerdictLine], title: str, notes: Sequence[str] = ()) -> str:
    """``verdicts.md``: a heading, ``notes`` (the session: device, minutes, suites), the table
    and the folded claims."""
    shown = [line for line in lines if not _other(line)]
    folded = [line for line in lines if _other(line)]
    out = [
        f"# {title}",
        "",
        *[f"- {note}" for note in notes],
        "",
        f"**{counts(shown)}**",
        "",
        "| claim | statement | verdict | measured [95% interval] | expected | axis, points "
        "| timing | what would decide it |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for line in shown:
        cells = (
            line.claim,
            line.statement,
            line.verdict,
            _value(line),
            line.expected,
            _used(line),
            line.timing,
            line.decide,
        )
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if folded:
        out += [
            "",
            f"Not judged here ({fmt.plural(len(folded), 'claim')} about another "
            f"device's rows): {', '.join(line.claim for line in folded)}.",
        ]
    return "\n".join(out) + "\n"


def write_tables(out: Path, lines: Sequence[VerdictLine], notes: Sequence[str], meta: dict) -> None:
    """``out/verdicts.md`` and ``out/verdicts.json`` (``meta``, the notes, every line)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "verdicts.md").write_text(markdown_table(lines, "attnbench verdicts", notes))
    doc = {
        **meta,
        "notes": list(notes),
        "counts": counts(lines),
        "claims": [line.as_dict() for line in lines],
    }
    (out / "verdicts.json").write_text(dumps_json(doc) + "\n")
