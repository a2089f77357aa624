"""The report's answer first: a few sentences computed from the rows and the verdicts (who is
fastest in each band of sizes and by how much, the speedups against the baseline with their
ranges, peak memory at the largest size, agreement with the float64 reference, the verdicts),
and the agreement in numbers (a table beside the agreement figures).

Every figure in a sentence is read from the rows; nothing is written that the rows do not
hold. Ties are called ties: a lead under :data:`TIE` is "level with", not "fastest".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis.claims import VERDICTS
from harness.analysis.verdicts import Verdict
from harness.render import pivot
from harness.render.checks import ERRORS, over_bound

TIME = "time_median_s"
MOST = 6  # sentences in the summary at most
TIE = 1.05  # a lead smaller than this (5 %) is within the run-to-run noise of a CPU median


def sentences(rows: pd.DataFrame, baseline: str | None, verdicts: list[Verdict] | None,
              claims_name: str = "") -> list[str]:
    """The summary, in reading order: the fastest per band of sizes (one sentence per
    scenario), the speedups, memory, agreement, the verdicts; sentences without data left
    out, and at most :data:`MOST` (several scenarios: their memory and speedup sentences
    give way first)."""
    first: list[str] = []
    speed: list[str] = []
    mem: list[str] = []
    last: list[str] = []
    if len(rows) and {"impl", "status", "scenario"} <= set(rows.columns):
        for scenario, part in rows.groupby("scenario", sort=True):
            part = part.reset_index(drop=True)
            first.append(fastest(part, str(scenario)))
            speed.append(speedups(part, baseline, str(scenario)))
            mem.append(memory(part, str(scenario)))
        last.append(agreement(rows))
    if verdicts:
        last.append(verdict_words(verdicts, claims_name))
    first, speed, mem, last = ([s for s in x if s] for x in (first, speed, mem, last))
    # at most MOST sentences: with several scenarios, memory goes first, then the speedups
    while len(first) + len(speed) + len(mem) + len(last) > MOST and (mem or speed):
        (mem or speed).pop()
    return first[: max(1, MOST - len(last))] + speed + mem + last


def _per_size(part: pd.DataFrame, metric: str) -> tuple[pd.DataFrame, list[str]] | None:
    """Medians of ``metric`` per point (rows: the point axes, seq_len last; columns: the
    implementations), and the axes other than seq_len; None without two measured columns."""
    lay = pivot.layout(part)
    table = pivot.time_pivot(part, lay, metric)
    if table is None or table.shape[1] < 2:
        return None
    return table, [a for a in lay.rows if a != "seq_len"]


def _bands(table: pd.DataFrame) -> list[tuple[list, str, str, list[float], bool]]:
    """Runs of neighbouring sizes with one answer: (sizes, fastest, next fastest, leads), from
    the geometric mean time per size over the points every implementation there measured, and
    whether it is a tie: a lead under :data:`TIE` makes the two level, (sizes, "a and b",
    the third, their leads over it, True)."""
    if "seq_len" in (table.index.names or []):
        sizes = table.index.get_level_values("seq_len")
    else:
        sizes = pd.Index(["all"] * len(table))
    out: list = []
    for size in sorted(set(sizes), key=pivot.natural_key):
        at = table[sizes == size]
        complete = at.dropna(axis=1, how="any")  # implementations with every point here
        if complete.shape[1] < 2:
            continue
        mean = np.exp(np.log(complete).mean()).sort_values()
        first, second = str(mean.index[0]), str(mean.index[1])
        lead = float(mean.iloc[1] / mean.iloc[0])
        tie = lead < TIE
        key = (tie, first if not tie else frozenset((first, second)))
        if tie and len(mean) > 2:  # a tie: the lead of the two over the third
            second, lead = str(mean.index[2]), float(mean.iloc[2] / mean.iloc[1])
        elif tie:
            second, lead = "", lead
        if out and out[-1][0] == key:
            out[-1][1].append(size)
            out[-1][2].append(second)
            out[-1][3].append(lead)
        else:
            out.append((key, [size], [second], [lead], first))
    return [(sizes_, first if not key[0] else " and ".join(sorted(key[1])),
             " / ".join(n for n in dict.fromkeys(seconds) if n), leads, key[0])
            for key, sizes_, seconds, leads, first in out]


def _span(values: list, unit: str = "") -> str:
    """``256–512`` or ``1024``; ``1.03–1.05x`` or ``1.2x``."""
    if unit:
        lo, hi = fmt.number(min(values), 3), fmt.number(max(values), 3)
    else:
        lo, hi = str(values[0]), str(values[-1])
    return f"{lo}{unit}" if lo == hi else f"{lo}–{hi}{unit}"


def fastest(part: pd.DataFrame, scenario: str) -> str:
    """``attention: sdpa is fastest at seq_len 512, 1.05x ahead of sdpa-flash; sdpa and
    sdpa-flash are level (within 5%) at seq_len 1024 (geometric mean time over causal).``"""
    found = _per_size(part, TIME)
    if found is None:
        return ""
    bands = _bands(found[0])
    if not bands:
        return ""
    words = []
    for sizes, first, second, leads, tie in bands:
        at = "" if sizes == ["all"] else f" at seq_len {_span([fmt.exact(s) for s in sizes])}"
        if tie:  # ``first`` names both
            words.append(f"{first} are level (within {round((TIE - 1) * 100)}%){at}" + (
                f", {_span(leads, 'x')} ahead of {second}" if second else ""))
        else:
            words.append(f"{first} is fastest{at}, {_span(leads, 'x')} ahead of {second}")
    over = f" (geometric mean time over {', '.join(found[1])})" if found[1] else ""
    return f"{scenario}: {'; '.join(words)}{over}."


def speedups(part: pd.DataFrame, baseline: str | None, scenario: str) -> str:
    """``attention, time of sdpa / each: sdpa-flash 0.93–1.03x, full 0.10–0.66x (above 1:
    faster than sdpa; over every measured point).``"""
    found = _per_size(part, TIME)
    if found is None or baseline is None or baseline not in found[0].columns:
        return ""
    table = found[0]
    ratio = table.rdiv(table[baseline], axis=0).drop(columns=baseline)
    spans = []
    for impl in ratio.columns:
        values = ratio[impl].dropna()
        if len(values):
            spans.append((float(values.median()), f"{impl} {_span(list(values), 'x')}"))
    if not spans:
        return ""
    spans.sort(reverse=True)
    return (f"{scenario}, speedup against {baseline} (its time / each one's, above 1: faster, "
            f"the range over every point both measured): {', '.join(s for _, s in spans)}.")


def memory(part: pd.DataFrame, scenario: str) -> str:
    """``attention, peak memory at seq_len 1024: lowest sdpa-flash 1.2 MiB, highest full 16
    MiB (13x).``"""
    found = _per_size(part, "peak_mem_bytes")
    if found is None:
        return ""
    table = found[0]
    if "seq_len" in (table.index.names or []):
        sizes = table.index.get_level_values("seq_len")
        top = max(set(sizes), key=pivot.natural_key)
        table = table[sizes == top]
        at = f" at seq_len {top}"
    else:
        at = ""
    peak = table.max().dropna().sort_values()  # each one's largest over the other axes
    if len(peak) < 2:
        return ""
    low, high = peak.index[0], peak.index[-1]
    if peak.iloc[-1] / peak.iloc[0] < TIE:
        return (f"{scenario}, peak memory{at}: level across implementations "
                f"({fmt.size(peak.iloc[0])} to {fmt.size(peak.iloc[-1])}).")
    return (f"{scenario}, peak memory{at}: lowest {low} {fmt.size(peak.iloc[0])}, highest "
            f"{high} {fmt.size(peak.iloc[-1])} ({fmt.number(peak.iloc[-1] / peak.iloc[0], 3)}x).")


def _agreement_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The measured rows that were checked against the reference (``agree`` not null)."""
    if "agree" not in rows.columns or "status" not in rows.columns:
        return rows.iloc[0:0]
    measured = rows[rows["status"].isin(pivot.MEASURED)]
    return measured[measured["agree"].notna()]


def _disagrees(checked: pd.DataFrame) -> pd.Series:
    return checked["agree"].eq(False) | checked["status"].eq("mismatch")


def agreement(rows: pd.DataFrame) -> str:
    """``All 30 measured rows agree with the float64 reference within tolerance (the largest
    error is 0.31 of its bound).`` or the rows that disagree, named."""
    checked = _agreement_rows(rows)
    if not len(checked):
        return ""
    bad = checked[_disagrees(checked)]
    worst = max((over_bound(checked, m).max() for m in ERRORS), default=np.nan)
    largest = (f" (the largest error is {fmt.number(worst, 2)} of its bound)"
               if np.isfinite(worst) else "")
    if not len(bad):
        who = ("The one measured row agrees" if len(checked) == 1 else
               f"{'Both' if len(checked) == 2 else 'All'} {len(checked)} measured rows agree")
        return f"{who} with the float64 reference within tolerance{largest}."
    named = [_point(r) for _, r in bad.head(4).iterrows()]
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    return (f"{len(bad)} of {len(checked)} measured rows disagree with the float64 reference: "
            f"{'; '.join(named)}{more}.")


def _point(row: pd.Series) -> str:
    """``full (seq_len=1024, causal=True)``."""
    keys = [k for k in ("scenario", "seq_len", "causal", "dtype") if k in row and
            not fmt.is_missing(row[k])]
    return f"{row['impl']} ({', '.join(f'{k}={fmt.exact(row[k])}' for k in keys)})"


def agreement_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Agreement in numbers, one line per scenario and implementation: rows checked, how many
    agree, the largest max abs and relative errors, and the largest error over its row's own
    bound (<= 1: within it; blank where rows keep no such bound)."""
    checked = _agreement_rows(rows)
    if not len(checked):
        return pd.DataFrame()
    checked = checked.assign(
        _bad=_disagrees(checked),
        _ratio=pd.concat([over_bound(checked, m) for m in ERRORS], axis=1).max(axis=1),
    )
    out = []
    for (scenario, impl), part in checked.groupby(["scenario", "impl"], sort=False):
        out.append({
            "scenario": scenario, "impl": impl, "rows": len(part),
            "agree": int((~part["_bad"]).sum()),
            "max_abs_err": pd.to_numeric(part.get("max_abs_err"), errors="coerce").max(),
            "rel_err": pd.to_numeric(part.get("rel_err"), errors="coerce").max(),
            "worst_over_bound": part["_ratio"].max(),
        })
    return pd.DataFrame(out)


def verdict_words(verdicts: list[Verdict], claims_name: str = "") -> str:
    """``Claims (claims.toml) about these runs: 1 confirmed (flash-time-n2), 9 inconclusive;
    32 others are about implementations or devices these runs lack.``"""
    mine = [v for v in verdicts if v.about_these_runs]
    rest = len(verdicts) - len(mine)
    others = (f"; {rest} other{'s are' if rest != 1 else ' is'} about implementations, "
              "baselines or devices these runs lack" if rest else "")
    name = f" ({claims_name})" if claims_name else ""
    if not mine:
        return f"No claim{name} is about these runs{others}."
    parts = []
    for verdict in VERDICTS:
        ids = [v.claim for v in mine if v.verdict == verdict]
        if ids:
            named = f" ({', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''})"
            parts.append(f"{len(ids)} {verdict}{named if verdict != 'inconclusive' else ''}")
    return f"Claims{name} about these runs: {', '.join(parts)}{others}."
