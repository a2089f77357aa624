"""``attnbench claims`` as a reader sees it: statements, every judged group, utilization only
for time claims, thin data with the points left out, one-point ratio claims inconclusive,
absent implementations and devices folded; on the committed smoke baseline and on synthetic
rows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.analysis.claims import DEFAULT_CLAIMS, load_claims, parse_claims
from harness.analysis.verdicts import Verdict, evaluate, judge_claims, verdict_table
from harness.render.verdict_views import MAX_GROUP_LINES, other_groups, render_text
from harness.results import load_envs, load_rows
from tests.harness.analysis.test_claims import NS, make_rows, ratio_rows

SMOKE = sorted(Path(__file__).parents[3].glob("results/baselines/cpu-*/smoke"))


def ratio_claim(**kw):
    base = {"id": "speedup", "impl": "sdpa-flash", "baseline": "full", "over": "seq_len",
            "metric": "time_median_s", "ratio": "baseline/impl", "expect_ratio_min": 2.0,
            "expect_ratio_max": 4.0, "text": "flash is 2-4x faster"}
    return parse_claims({"claim": [{**base, **kw}]})[0]


@pytest.fixture(scope="module", params=SMOKE, ids=lambda p: p.parent.name)
def smoke(request):
    run = request.param
    verdicts, _ = judge_claims(load_claims(DEFAULT_CLAIMS), load_rows(run), load_envs([run]))
    return {v.claim: v for v in verdicts}, render_text(verdicts, fold=True)


def test_the_smoke_baseline_lists_no_missing_rows_and_shows_each_statement(smoke):
    verdicts, text = smoke
    listed = [v for v in verdicts.values() if v.about_these_runs]
    assert listed and len(listed) < len(verdicts)
    lines = text.splitlines()
    for v in listed:
        at = next(i for i, line in enumerate(lines) if line.startswith(v.claim + " "))
        assert lines[at + 1].strip() == f'"{v.text}"', v.claim
        assert not v.reason.startswith("missing rows"), v.claim
    # the -gpu claims, and those whose baseline (linformer, performer) did not run: folded
    folded = next(line for line in lines if "not listed; --all lists them" in line)
    for claim in ("flash-crosses-linformer-512-1024-gpu", "flash-crosses-linformer-512-1024",
                  "flash-half-linformer-memory-gpu"):
        assert not verdicts[claim].about_these_runs and claim in folded
        assert not any(line.startswith(claim + " ") for line in lines)


def test_the_smoke_baseline_gives_no_headline_verdict_from_one_point(smoke):
    verdicts, _ = smoke
    for claim in ("flash-speedup-2-4x", "flash-memory-5-20pct"):  # range 1k..8k: smoke has 1k
        v = verdicts[claim]
        assert v.verdict == "inconclusive" and v.reason.startswith("one point (seq_len 1024;")
        assert "left out: seq_len 256, 512 (outside the claim's range 1024..8192)" in v.reason
        assert len(v.groups) == 2  # causal and not: both judged, both listed


def test_memory_claims_show_no_utilization_and_thin_data_says_what_was_left_out(smoke):
    verdicts, text = smoke
    headline = next(line for line in text.splitlines() if line.startswith("full-memory-n2 "))
    assert "util" not in headline and "roofline" not in headline
    time = next(line for line in text.splitlines() if line.startswith("flash-time-n2 "))
    assert "% of roofline" in time
    reason = verdicts["full-memory-n2"].reason
    assert reason.startswith("thin data (2 points: seq_len 512, 1024; a power+const fit needs 4)")
    assert reason.endswith("left out: seq_len 256 (outside the claim's range 512..4096)")
    table = verdict_table(list(verdicts.values())).set_index("claim")
    assert table.loc["full-memory-n2", "utilization"] == ""
    assert table.loc["flash-time-n2", "utilization"].startswith("util ")


def test_a_ratio_claim_needs_two_points_of_a_range_and_one_of_a_single_value():
    one = ratio_rows({n: 10.0 for n in NS})
    one = one[one["seq_len"] == 1024]
    v = evaluate(ratio_claim(range=[1024, 8192]), one)
    assert v.verdict == "inconclusive" and v.reason.startswith(
        "one point (seq_len 1024; the claim's range 1024..8192 needs 2)")
    assert evaluate(ratio_claim(range=[1024, 1024]), one).verdict == "refuted"
    two = ratio_rows({n: 10.0 for n in NS})
    assert evaluate(ratio_claim(range=[1024, 8192]), two).verdict == "refuted"


def test_a_claim_without_its_baseline_or_device_is_folded():
    rows = pd.DataFrame(make_rows("sdpa-flash", lambda p: 1e-9 * p.seq_len**2))
    no_base = evaluate(ratio_claim(), rows)
    assert no_base.rows_seen > 0 and no_base.absent and not no_base.about_these_runs
    busy = rows.assign(contended=True, contention="other processes used 1.3 cores")
    contended = evaluate(ratio_claim(), busy)  # its own reason is contention; still folded
    assert "contention" in contended.reason and not contended.about_these_runs
    both_busy = ratio_rows({n: 3.0 for n in NS}).assign(contended=True)
    assert evaluate(ratio_claim(), both_busy).about_these_runs  # both ran: listed, no verdict
    gpu = evaluate(ratio_claim(where={"device": "cuda"}), ratio_rows({n: 3.0 for n in NS}))
    assert gpu.rows_seen == 0 and not gpu.about_these_runs
    here = evaluate(ratio_claim(), ratio_rows({n: 3.0 for n in NS}))
    assert here.verdict == "confirmed" and here.about_these_runs
    text = render_text([no_base, here], fold=True)
    assert text.splitlines()[0].startswith("speedup ") and "1 claim about" in text


def _verdict(groups: list[dict]) -> Verdict:
    return Verdict(claim="c", verdict=groups[0]["verdict"], measured=None, ci_low=None,
                   ci_high=None, expected="[2, 4]", reason="r", kind="ratio",
                   metric="time_median_s", over="seq_len", impl="x", group=groups[0]["group"],
                   groups=tuple(groups))


def test_every_other_group_is_listed_worst_first_and_alike_groups_share_a_line():
    g = [{"group": "a", "verdict": "confirmed", "reason": "inside; detail", "measured": 3.0,
          "ci_low": 2.5, "ci_high": 3.5},
         {"group": "b", "verdict": "inconclusive", "reason": "thin data (1 point: x 1; a fit "
          "needs 3); detail", "measured": None},
         {"group": "c", "verdict": "inconclusive", "reason": "thin data (1 point: x 1; a fit "
          "needs 3)", "measured": None},
         {"group": "d", "verdict": "refuted", "reason": "outside; detail", "measured": 10.0,
          "ci_low": 9.0, "ci_high": 11.0}]
    lines = other_groups(_verdict(g))
    assert lines == ["also d: refuted 10 [9, 11], outside",
                     "also 2 groups (b; c): inconclusive, thin data (1 point: x 1; a fit needs 3)"]
    many = [g[0]] + [{"group": f"g{i}", "verdict": "inconclusive", "reason": f"why {i}",
                      "measured": None} for i in range(MAX_GROUP_LINES + 2)]
    lines = other_groups(_verdict(many))
    assert len(lines) == MAX_GROUP_LINES + 1 and lines[-1] == "2 more groups (--json lists " \
        "every group)"
    assert other_groups(_verdict(g[:1])) == []


@pytest.fixture
def drawn(monkeypatch):
    """The figures the report would encode, kept as matplotlib figures to look into."""
    import matplotlib.pyplot as plt

    from harness.render import plots

    figures = []
    monkeypatch.setattr(plots, "png", lambda fig: figures.append(fig) or b"figure")
    yield figures
    for fig in figures:
        plt.close(fig)


def _legend(fig) -> list[str]:
    (ax,) = fig.axes
    return [t.get_text() for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize(("power", "speed"), [(1, 0.7), (2, 1.0)])
def test_a_trend_claim_draws_its_ratios_its_fit_and_the_claimed_exponents(drawn, power, speed):
    """A trend's figure: the ratio at each matched point inside its interval, the fitted
    exponent in the legend, and the claimed exponents shaded as a fan; a planted x² ratio
    shows its own slope, not the claim's."""
    ns = (1, 2, 3, 4, 6, 8)
    base = make_rows("full", lambda p: 1e-3 * p.seq_len, ns=ns, noise=0.01, seed=1)
    padded = make_rows("sdpa", lambda p: speed * 1e-3 * p.seq_len ** (1 + power), ns=ns,
                       noise=0.01, seed=2)
    c = parse_claims({"claim": [{"id": "pad", "impl": "sdpa", "baseline": "full",
                                 "metric": "time_median_s", "over": "seq_len",
                                 "expect_exponent": 1.0, "tolerance": 0.25}]})[0]
    verdict = evaluate(c, pd.DataFrame(base + padded))
    (group,) = verdict.groups
    ev = group["_ratios"]
    assert ev["x"] == list(ns)
    assert ev["y"] == pytest.approx([speed * n**power for n in ns], rel=0.05)
    assert all(lo <= y <= hi for lo, y, hi in zip(ev["low"], ev["y"], ev["high"], strict=True))
    assert ev["fit"]["exponent"] == pytest.approx(power, abs=0.03)
    assert "_ratios" not in verdict.as_dict()["groups"][0]  # plot data stays out of JSON
    from harness.render.verdict_views import claim_figure

    assert claim_figure(verdict, c) == b"figure"
    (fig,) = drawn
    (ax,) = fig.axes
    assert ax.get_title() == "pad: " + verdict.verdict + "\nsdpa / full"
    assert ax.get_ylabel() == "ratio of time_median_s"
    legend = _legend(fig)
    assert f"matched points (fit {power:.2f}) [claim 1]" in legend
    assert "claimed: exponent 0.75..1.25" in legend
    from matplotlib.collections import PolyCollection

    assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 1  # the fan


def test_a_ratio_claim_draws_its_band_and_names_the_sides_by_their_settings(drawn):
    """A ratio claim's figure: the ratios with their intervals and the claimed band, the
    sides told apart by the settings of ``baseline_where`` when the implementation is the
    same; a claim without matched points draws nothing."""
    from harness.render.verdict_views import claim_figure, ratio_sides

    c = parse_claims({"claim": [{"id": "speedup", "impl": "sdpa-flash", "baseline": "full",
                                 "over": "seq_len", "metric": "time_median_s",
                                 "ratio": "baseline/impl", "expect_ratio_max": 4.0}]})[0]
    verdict = evaluate(c, ratio_rows({n: 3.0 for n in NS}))
    assert verdict.groups[0]["_ratios"]["fit"] is None
    assert claim_figure(verdict, c) == b"figure"
    (fig,) = drawn
    (ax,) = fig.axes
    assert ax.get_title().endswith("\nfull / sdpa-flash")  # baseline/impl
    assert "claimed: [-inf, 4]" in _legend(fig)
    (span,) = ax.patches
    assert span.get_extents().y0 <= ax.transData.transform((1, ax.get_ylim()[0]))[1] + 1
    assert ax.get_ylim()[1] >= 4.0
    paging = parse_claims({"claim": [{
        "id": "paging", "impl": "full", "baseline": "full", "metric": "time_median_s",
        "over": "seq_len", "where": {"cache": "paged", "page_size": 16},
        "baseline_where": {"cache": "full"}, "expect_ratio_max": 1.1}]})[0]
    assert ratio_sides(paging) == ("full [cache=paged]", "full [cache=full]")
    assert ratio_sides(c) == ("sdpa-flash", "full")
    nothing = evaluate(c, ratio_rows({n: 3.0 for n in NS}).query("impl == 'full'"))
    assert claim_figure(nothing, c) is None


@pytest.mark.parametrize(("xs", "scale"), [((0, 64, 128), "linear"), ((32, 64, 128), "log")])
def test_a_ratio_along_an_axis_from_zero_is_drawn_on_a_linear_axis(drawn, xs, scale):
    """A log axis would drop the point at 0 (a prefix of 0 tokens) without a word."""
    from harness.render.plots import Series, ratio_along

    s = Series("matched points", xs, [1.0, 1.2, 1.5], low=[0.9, 1.1, 1.3], high=[1.1, 1.3, 1.7])
    ratio_along([s], band=(0.8, 1.25), fan=None, xlabel="prefix_len", ylabel="a / b",
                title="t")
    (fig,) = drawn
    (ax,) = fig.axes
    assert ax.get_xscale() == scale
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "matched points"]
    assert list(line.get_xdata()) == list(xs)
