"""``attnbench report``: every section; self-contained HTML, markdown and CSV tables."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re

import numpy as np
import pandas as pd
import pytest

from harness.cli import claims as claims_cli
from harness.cli import report as report_cli
from harness.errors import CliError
from harness.render import checks, efficiency, page, panels, plots, report
from harness.results import RowWriter, write_env
from harness.scenarios.interface import Point

SECTIONS = (
    "summary",
    "claims",
    "results",
    "speedup",
    "fits",
    "time",
    "throughput",
    "memory",
    "axes",
    "heatmaps",
    "flops",
    "roofline",
    "layers",
    "agreement",
    "status",
    "environment",
)
ABSENT = ("fwdbwd", "history")  # one run, no backward rows: left out, said in one line
CALIBRATION = {"matmul_flops_per_s": 1.5e11, "mem_bandwidth_bytes_per_s": 3e10}


@pytest.fixture
def unrendered(monkeypatch):
    """The report's figures are made but not rasterized (a 1x1 PNG stands in for each): for
    the tests that read the report's tables and text. Drawing is 1 s a figure, half of a
    report's time; the tests of the ``built`` report check the images themselves, and
    ``test_history_forward_backward_and_chosen_baseline`` draws the figures only a history of
    runs has."""
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, format="PNG")

    def no_pixels(fig) -> bytes:
        plt.close(fig)
        return buf.getvalue()

    monkeypatch.setattr(plots, "png", no_pixels)


def row(point: Point, seconds: float, mem: float, **extra) -> dict:
    rng = np.random.default_rng(point.seq_len + point.heads)
    samples = list(seconds * np.exp(rng.normal(0, 0.02, 9)))
    flops = 4.0 * point.heads * point.head_dim * point.seq_len**2
    return {
        **point.columns(),
        "run_id": "r1",
        "status": "ok",
        "reason": None,
        "time_median_s": float(np.median(samples)),
        "time_ci_low_s": float(np.median(samples)) * 0.97,
        "time_ci_high_s": float(np.median(samples)) * 1.03,
        "time_samples_s": samples,
        "tokens_per_s": point.seq_len / seconds,
        "useful_flops": flops,
        "tflops_per_s": flops / seconds / 1e12,
        "peak_mem_bytes": mem,
        "max_abs_err": 1e-7 * point.seq_len**0.5,
        "rel_err": 1e-7,
        **extra,
    }


def synthetic_rows() -> list[dict]:
    out = []
    for n in (512, 1024, 2048, 4096):
        out.append(row(Point.of("full", seq_len=n), 2e-10 * n**2, 8.0 * 8 * n * n + 4e5))
        out.append(row(Point.of("sdpa-flash", seq_len=n), 8e-11 * n**2, 2048.0 * n + 1e6))
    for h in (1, 2, 4, 8):
        for d in (256, 512, 1024):
            out.append(
                row(
                    Point.of("sdpa", heads=h, head_dim=d // h, seq_len=1024),
                    1e-6 * d * h**0.1,
                    4.0 * d * 1024,
                )
            )
    for n in (128, 256, 512, 1024):
        block = {"scenario": "block", "heads": 4, "head_dim": 64, "seq_len": n}
        out.append(row(Point.of("sdpa", **block), 3e-3, 1e6, mixer_time_s=1e-8 * n * n))
        out.append(row(Point.of("lstm", **block), 5e-3, 1e6, mixer_time_s=2e-6 * n))
        out.append(row(Point.of("conv", **block), 2e-3, 1e6, mixer_time_s=1e-6 * n))
    failed = {
        **Point.of("full", seq_len=65536).columns(),
        "run_id": "r1",
        "status": "skipped",
        "reason": "predicted peak 131072 MiB > budget",
    }
    return [*out, failed]


@pytest.fixture(scope="module")
def built(synthetic_report):
    """The synthetic rows' report, figures drawn (``conftest.synthetic_report``: built once)."""
    base, page, _ = synthetic_report
    return base, page


def test_html_page_has_every_section_and_is_self_contained(built):
    _, page = built
    text = page.read_text()
    for key in SECTIONS:
        assert f'<section id="{key}">' in text
    assert not re.search(r'(src|href)="(https?:)?//', text), "no network resources"
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) >= 7
    assert 'class="v-confirmed"' in text and 'class="v-refuted"' in text
    for key in ABSENT:
        assert f'<section id="{key}">' not in text
    assert text.count("Not shown (nothing to show") == 1


def test_markdown_and_csv_tables(built):
    base, _ = built
    out = base / "out"
    md = (out / "report.md").read_text()
    assert md.startswith("# attnbench report")
    assert re.search(r"\| claim +\| verdict +\|", md)
    assert (
        "![time_median_s-vs-seq_len-attention](plots/time_median_s-vs-seq_len-attention.png)" in md
    )
    for name in ("claims", "fits", "flops", "crossover", "throughput", "status", "environment"):
        assert (out / "tables" / f"{name}.csv").is_file(), name
    claims = pd.read_csv(out / "tables" / "claims.csv").set_index("claim")
    assert claims.loc["full-memory-n2", "verdict"] == "confirmed"
    assert claims.loc["flash-memory-n1", "verdict"] == "confirmed"
    assert claims.loc["false-full-memory-n1", "verdict"] == "refuted"
    assert claims.loc["local-time-n1", "verdict"] == "inconclusive"  # no local rows
    fits = pd.read_csv(out / "tables" / "fits.csv")
    full_mem = fits[(fits["impl"] == "full") & (fits["metric"] == "peak_mem_bytes")].iloc[0]
    assert full_mem["claimed"] == 2 and abs(full_mem["exponent"] - 2) < 0.05
    flops = pd.read_csv(out / "tables" / "flops.csv")
    assert (flops["max_pct_peak"] > 0).all()
    crossover = pd.read_csv(out / "tables" / "crossover.csv")
    lstm = crossover[crossover["baseline"] == "lstm"].iloc[0]
    assert lstm["crossover_n_over_d"] == pytest.approx(200 / 256, rel=0.05)  # 1e-8·n² = 2e-6·n


def test_markdown_table_escapes_and_formats():
    table = page.markdown_table(pd.DataFrame({"a": [1.234567, None], "b": ["x|y", "z"]}))
    lines = table.splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == ["a", "b"]
    assert re.fullmatch(r"\| +1\.235 \| x\\\|y +\|", lines[2]), lines[2]
    assert re.fullmatch(r"\| +\| z +\|", lines[3]), lines[3]


def test_report_without_claims_or_env_and_bad_dirs(tmp_path, unrendered):
    writer = RowWriter(tmp_path / "run")
    for r in synthetic_rows()[:4]:
        writer.write(r)
    page = report.build_report([tmp_path / "run"], tmp_path / "out", claims_path=None)
    text = page.read_text()
    assert '<section id="claims">' not in text and "no env.json" in text
    parser = argparse.ArgumentParser()
    report_cli.add_cli(parser.add_subparsers())
    args = parser.parse_args(["report", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    with pytest.raises(CliError, match="no such results file"):
        args.func(args)


# --- readability: plot resolution and units, styles, complete grids, more sections ----------


def test_plots_are_high_resolution_and_shown_at_their_size(built):
    _, page = built
    images = re.findall(
        r'<img alt="[^"]*" width="(\d+)" src="data:image/png;base64,([^"]+)"', page.read_text()
    )
    assert len(images) >= 8
    for width, b64 in images:
        pixels = plots.png_size(base64.b64decode(b64))[0]
        assert pixels / (int(width) / 96) >= 150  # dpi at the size shown
        assert int(width) <= 1100  # fits the page column: no horizontal scrolling
        assert int(width) >= 700  # not a 518 px thumbnail


def test_units_styles_and_claimed_slope():
    assert panels.display_unit("peak_mem_bytes", [3 * 2**30]) == ("GiB", 2.0**-30)
    assert panels.display_unit("peak_mem_bytes", [5e6])[0] == "MiB"
    assert panels.display_unit("time_median_s", [0.2]) == ("ms", 1e3)
    styles = plots.Styles()
    drawn = {tuple(sorted(map(str, styles(f"impl{i}").values()))) for i in range(20)}
    assert len(drawn) == 20  # overlapping series stay distinguishable
    x = np.array([256.0, 512, 1024, 2048])
    y = 3e-9 * x**2 * np.array([1.0, 1.0, 1.0, 1.3])  # a noisy last point
    fit = {"exponent": 2.0, "prefactor": 3e-9, "offset": 0.0, "x_lo": 256.0, "x_hi": 2048.0}
    line = plots.claimed_line(plots.Series("full", x, y, fit, 2.0), x)
    residual = np.log(y / line)
    assert abs(residual.mean()) < 1e-12  # through the fitted constant, not the last point
    assert abs(residual[-1]) < np.log(1.3)


def test_heat_maps_need_complete_grids():
    rows = pd.DataFrame(synthetic_rows())
    full_grid, images = efficiency.heat(rows)
    assert images and len(full_grid)
    holes = rows.drop(
        rows[(rows["impl"] == "sdpa") & (rows["heads"] == 2) & (rows["head_dim"] == 128)].index
    )
    assert efficiency.heat(holes)[1] == []  # unrelated runs: no half-empty grid


def two_runs(base) -> list:
    dirs = []
    for i, slow in enumerate((1.0, 1.5)):
        writer = RowWriter(base / f"run{i}")
        for n in (256, 512, 1024):
            for scenario in ("attention", "attention+backward"):
                for impl, k in (("sdpa", 1.0), ("full", 2.0)):
                    t = slow * k * 1e-9 * n**2 * (2.5 if "backward" in scenario else 1)
                    r = row(
                        Point.of(impl, scenario=scenario, seq_len=n),
                        t,
                        1e3 * n,
                        run_id=f"r{i}",
                        suite="s",
                    )
                    writer.write({**r, "point_id": Point.of(impl, scenario, seq_len=n).point_id})
        write_env(
            base / f"run{i}",
            {
                "run_id": f"r{i}",
                "suite": "s",
                "started_utc": f"2026-01-0{i + 1}T00:00:00+00:00",
                "git_sha": f"{i}abcdef0",
                "calibration": CALIBRATION,
            },
        )
        dirs.append(base / f"run{i}")
    return dirs


def test_history_forward_backward_and_chosen_baseline(tmp_path):
    page = report.build_report(
        two_runs(tmp_path), tmp_path / "out", claims_path=None, baseline="full"
    )
    text = page.read_text()
    for key in ("history", "fwdbwd", "speedup", "throughput", "roofline", "results"):
        assert f'<section id="{key}">' in text, key
    assert "Speedup vs full" in text
    history = pd.read_csv(tmp_path / "out" / "tables" / "history.csv")
    second = history[history["run_id"] == "r1"].set_index("impl")["vs_first_run"]
    assert second.to_numpy() == pytest.approx([1.5, 1.5], rel=0.05)
    speed = pd.read_csv(tmp_path / "out" / "tables" / "speedup.csv")
    assert speed.loc[speed["impl"] == "sdpa", "speedup"].to_numpy() == pytest.approx(2, rel=0.1)
    rows_csv = pd.read_csv(tmp_path / "out" / "tables" / "rows.csv")
    assert len(rows_csv) == 24 and "time_samples_s" not in rows_csv.columns
    with pytest.raises(CliError, match="--baseline nope"):
        report.build_report(two_runs(tmp_path), tmp_path / "o2", None, baseline="nope")


# --- one judging path, contention, relevance, beaten calibrations, history, plots ----------


def write_run(path, rows: list[dict], calibration: dict | None = CALIBRATION, run_id="r1"):
    writer = RowWriter(path)
    for r in rows:
        writer.write({**r, "run_id": run_id})
    write_env(path, {"run_id": run_id, "suite": "s", "calibration": calibration})
    return path


def claims_json(run_dir, capsys, *extra) -> dict[str, dict]:
    parser = argparse.ArgumentParser()
    claims_cli.add_cli(parser.add_subparsers())
    args = parser.parse_args(["claims", str(run_dir), "--json", *extra])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    return {v["claim"]: v for v in json.loads(captured.out)}, captured.err


def one_claim(tmp_path, claim_id: str) -> str:
    """A claims file holding only ``claim_id``'s block of the bundled one: a claim is judged
    on its own, and judging the other 74 would be most of the test's time."""
    from harness.analysis.claims import DEFAULT_CLAIMS

    head, *blocks = DEFAULT_CLAIMS.read_text().split("\n[[claim]]\n")
    (block,) = [b for b in blocks if f'id = "{claim_id}"' in b]
    path = tmp_path / f"{claim_id}.toml"
    path.write_text(f"{head}\n[[claim]]\n{block}")
    return str(path)


def contended(rows: list[dict], every: bool) -> list[dict]:
    return [
        {**r, "contended": every or i % 4 < 2, "contention": "other processes used 1.9 cores"}
        for i, r in enumerate(rows)
    ]


@pytest.mark.parametrize("every", [False, True], ids=["half-contended", "all-contended"])
def test_claims_and_report_give_the_same_verdict_for_every_claim(tmp_path, capsys, every,
                                                                 unrendered):
    run = write_run(tmp_path / "run", contended(synthetic_rows(), every))
    said = {}
    for extra in ([], ["--allow-contended"]) if not every else ([],):
        verdicts, err = said[len(extra)] = claims_json(run, capsys, *extra)
        out = tmp_path / f"out{len(extra)}"
        report.build_report([run], out, allow_contended=bool(extra))
        table = pd.read_csv(out / "tables" / "claims.csv").set_index("claim")
        assert set(table.index) == set(verdicts)
        for claim_id, v in verdicts.items():
            assert table.loc[claim_id, "verdict"] == v["verdict"], claim_id
            assert str(table.loc[claim_id, "reason"]) == v["reason"], claim_id
        assert "measured under contention" in err
    # memory claims and work verdicts keep contended rows: an allocation is not a timing
    plain, err = said[0]  # the plain `claims` of the loop's first round
    assert plain["full-memory-n2"]["verdict"] == "confirmed"
    assert plain["false-full-memory-n1"]["verdict"] == "refuted"
    assert plain["attention-time-n2"]["work_verdict"] == "confirmed"
    if every:
        assert plain["attention-time-n2"]["reason"].startswith("no time verdict: every ")
        assert "--allow-contended" in plain["attention-time-n2"]["reason"]
        assert "Every row is contended" in err and "--allow-contended" in err
        page = (tmp_path / "out0" / "index.html").read_text()
        assert "Every row is contended" in page
    else:
        assert "rows measured under contention left out" in plain["attention-time-n2"]["reason"]


def test_claims_about_these_runs_come_first_and_the_others_are_folded(built):
    base, page = built
    text = page.read_text()
    claims = text[text.index('<section id="claims">') : text.index('<section id="results">')]
    open_part, folded = claims.split("<details>", 1)
    assert "attention-time-n2" in open_part and "full-memory-n2" in open_part
    assert "local-time-n1" not in open_part and "local-time-n1" in folded
    table = pd.read_csv(base / "out" / "tables" / "claims.csv")
    summary = re.search(r"<summary>(.*?)</summary>", folded).group(1)
    folded_words = r"claims about implementations, baselines or devices these runs do not have"
    assert re.fullmatch(folded_words + r" \(\d+\)", summary), summary
    assert "local-time-n1" in set(table["claim"])  # the CSV keeps every claim


def test_each_time_claim_has_its_fit_over_utilization_under_it(built):
    base, page = built
    plots_dir = base / "out" / "plots"
    assert (plots_dir / "claim-attention-time-n2.png").is_file()
    assert (plots_dir / "claim-flash-time-n2.png").is_file()
    assert not (plots_dir / "claim-full-memory-n2.png").exists()  # not a time claim
    assert 'alt="claim-attention-time-n2"' in page.read_text()


def test_a_beaten_calibration_is_flagged_in_verdicts_tables_and_notes(built, tmp_path, capsys):
    # the synthetic rows run at ~10 TFLOP/s against a 0.15 TFLOP/s calibration (the built
    # report's run: its env.json has CALIBRATION)
    base, page = built
    # the claim judged on its own (``one_claim``), as the honest run's below: judging the
    # other 74 was most of the test's time
    verdicts, _ = claims_json(base / "run", capsys, "--claims",
                              one_claim(tmp_path, "attention-time-n2"))
    assert verdicts["attention-time-n2"]["calibration_beaten"] is True
    assert "(calibration beaten: rows above 100%)" in verdicts["attention-time-n2"]["utilization"]
    flops = pd.read_csv(base / "out" / "tables" / "flops.csv")
    assert set(flops["calibration"].dropna()) == {"beaten"}
    assert "calibration beaten: full reaches" in page.read_text()
    honest = write_run(tmp_path / "honest", synthetic_rows(), {**CALIBRATION,
                       "matmul_flops_per_s": 1e15, "mem_bandwidth_bytes_per_s": 1e13})
    verdicts, _ = claims_json(honest, capsys, "--claims", one_claim(tmp_path, "attention-time-n2"))
    assert verdicts["attention-time-n2"]["calibration_beaten"] is False


def test_history_points_are_counted_per_implementation(tmp_path, unrendered):
    dirs = two_runs(tmp_path)
    extra = row(Point.of("full", seq_len=2048), 4e-3, 1e6, suite="s")  # full only, both runs
    for i, d in enumerate(dirs):
        writer = RowWriter(d)
        point_id = Point.of("full", seq_len=2048).point_id
        writer.write({**extra, "run_id": f"r{i}", "point_id": point_id})
    report.build_report(dirs, tmp_path / "out", claims_path=None)
    history = pd.read_csv(tmp_path / "out" / "tables" / "history.csv")
    points = history.groupby("impl")["points"].unique()
    assert list(points["full"]) == [7] and list(points["sdpa"]) == [6]


def test_legends_name_only_what_varies():
    rows = pd.DataFrame(
        [{**Point.of("full", seq_len=n).columns(), "status": "ok", "pct": 1.0} for n in (512, 1024)]
        + [
            {**Point.of("bigbird", seq_len=n, block_size=64, random_blocks=r).columns(),
             "status": "ok", "pct": 2.0}
            for n in (512, 1024)
            for r in (0, 3)
        ]
    )
    keys = ["impl", "block_size", "random_blocks"]
    labels = sorted(s.label for s in panels.series_by(rows, "pct", keys))
    assert labels == ["bigbird random_blocks=0", "bigbird random_blocks=3", "full"]


@pytest.mark.parametrize(("low", "high"), [(0.05, 0.6), (0.3, 0.6), (0.002, 40.0)])
def test_a_log_axis_has_at_least_two_labelled_ticks(low, high):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [low, high])
    plots.axes_style(ax, "t", "x", "TFLOP/s", log_y=True)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    shown = [t for t in ax.yaxis.get_majorticklabels()
             if t.get_text() and lo <= t.get_position()[1] <= hi]
    plt.close(fig)
    assert len(shown) >= 2, [t.get_text() for t in shown]


def agreement_rows() -> pd.DataFrame:
    """Rows judged by the naive-relative rule, bounds as on the H100 (2026-11-26): exact
    attention's bound ~1e-2, Linformer's up to ~30 (its naive error is large), all agreeing,
    plus one sdpa row beyond its bound (a mismatch); and decode rows judged by allclose."""
    out = []
    for n in (1024, 4096, 16384):
        for impl, err, bound, rel, rel_bound in (
            ("sdpa-flash", 8e-4, 1.6e-2, 2.2e-3, 1.7e-2),
            ("linformer", 0.34 * n / 8192, 3.1 * n / 8192, 6.7e-3, 3.2e-2),
            ("performer", 7.8e-3, 0.27, 1.7e-3, 5.4e-2),
        ):
            point = Point.of(impl, seq_len=n)
            out.append(row(point, 1e-3, 1e6, max_abs_err=err, tolerance=bound, rel_err=rel,
                           rel_tolerance=rel_bound, agree=True))
    wrong = row(Point.of("sdpa", seq_len=4096), 1e-3, 1e6, max_abs_err=0.05, tolerance=0.01,
                rel_err=0.02, rel_tolerance=0.017, agree=False, status="mismatch")
    decode = [row(Point.of("sdpa", scenario="decode", seq_len=n), 1e-3, 1e6,
                  max_abs_err=2e-6 * n / 1024, tolerance=1e-5, agree=True)
              for n in (1024, 2048)]
    return pd.DataFrame([*out, wrong, *decode])


def test_the_agreement_plot_draws_each_row_over_its_own_bound():
    """Every agreeing row is at or under the line at 1 and the mismatch above it, whatever its
    bound; the median-bound line of before put every Linformer point above it."""
    rows = agreement_rows()
    for metric in checks.ERRORS:
        ratio = checks.over_bound(rows, metric)
        judged = rows["scenario"] == "attention"
        assert (ratio[judged & rows["agree"]] <= 1).all()
        assert (ratio[judged & ~rows["agree"]] > 1).all()
        assert ratio[~judged].isna().all()  # allclose rows keep no per-row bound
    exact = rows[rows["scenario"] == "attention"]
    old_line = exact.groupby("seq_len")["tolerance"].transform("median")  # the line of before
    assert (exact["agree"] & (exact["max_abs_err"] > old_line)).any()
    figures = {f.name: f for f in checks.agreement_figures(rows)}
    own = figures["agreement-attention"]
    assert own.hline[0] == 1.0 and "own bound" in own.hline[1]
    drawn = {s.label: np.asarray(s.y, float) for p in own.panels for s in p.series}
    assert {"sdpa-flash", "linformer", "performer", "sdpa"} <= set(drawn)
    assert all((drawn[impl] <= 1).all() for impl in ("sdpa-flash", "linformer", "performer"))
    assert (drawn["sdpa"] > 1).all()
    fixed = figures["agreement-decode-allclose"]
    (guide,) = fixed.panels[0].guides
    assert guide.label.startswith("atol") and set(np.asarray(guide.y)) == {1e-5}


def test_the_report_lists_implementations_in_the_suites_order(tmp_path, unrendered):
    """The results table and tables/rows.csv follow the suite file env.json names, not the
    shuffled order the passes wrote the rows in."""
    suite = tmp_path / "s.toml"
    suite.write_text('name = "s"\nscenario = "attention"\n'
                     'implementations = ["sdpa", "full", "flash-tiled"]\n')
    writer = RowWriter(tmp_path / "run")
    for n, impl in [(1024, "full"), (512, "flash-tiled"), (512, "sdpa"), (512, "full"),
                    (1024, "sdpa"), (1024, "flash-tiled")]:
        writer.write(row(Point.of(impl, seq_len=n), 1e-3, 1e6, suite="s"))
    digest = hashlib.sha256(suite.read_bytes()).hexdigest()
    write_env(tmp_path / "run", {"run_id": "r1", "suite": "s", "suite_path": str(suite),
                                 "suite_fingerprint": digest})
    report.build_report([tmp_path / "run"], tmp_path / "out", claims_path=None)
    rows = pd.read_csv(tmp_path / "out" / "tables" / "rows.csv")
    assert list(zip(rows["impl"], rows["seq_len"], strict=True)) == [
        ("sdpa", 512), ("sdpa", 1024), ("full", 512), ("full", 1024), ("flash-tiled", 512),
        ("flash-tiled", 1024)]
    results = (tmp_path / "out" / "report.md").read_text().split("median time (ms)")[1]
    header = next(line for line in results.splitlines() if "seq_len" in line)
    assert [c.strip() for c in header.strip("|").split("|")] == ["seq_len", "sdpa", "full",
                                                                  "flash-tiled"]


def test_plot_axes_name_each_metric_and_its_unit():
    """An axis reads ``median time (ms)``, never ``time_median_s (ms)``: every metric a
    bundled claims file measures, and every metric the report plots against n."""
    from harness import SUITES_DIR
    from harness.analysis.claims import load_claims

    files = [f for f in SUITES_DIR.glob("*.toml") if "[[claim]]" in f.read_text()]
    claimed = {c.metric for f in files for c in load_claims(f)}
    assert {"time_median_s", "approx_err", "state_bytes"} <= claimed
    for metric in claimed | {"time_median_s", "peak_mem_bytes", "mixer_time_s", "tflops_per_s"}:
        unit, _ = panels.display_unit(metric, [1.0])
        label = panels.axis_label(metric, unit)
        assert "_" not in label.split(" (")[0], label
    assert panels.axis_label("time_median_s", "ms") == "median time (ms)"
    assert panels.display_unit("tflops_per_s", [1.0]) == ("TFLOP/s", 1.0)  # the schema's unit


def test_a_time_claims_figure_names_its_axis(synthetic_report):
    """The y-axis label the built report's Claims section gave each claim figure it drew
    (every time claim of the bundled claims file over the synthetic rows)."""
    _, _, seen = synthetic_report
    assert seen and set(seen) == {"median time (ms)", "mixer time (ms)"}


def test_every_verdict_has_its_own_cell_colour():
    """mixed and holds in part (several groups, ratio claims along the axis) are coloured as
    the three older verdicts are."""
    import re

    from harness.analysis.claims import VERDICTS
    from harness.render import page

    html = page.html_table(pd.DataFrame({"verdict": list(VERDICTS)}))
    for verdict in VERDICTS:
        css = "v-" + verdict.replace(" ", "-")
        assert f'<td class="{css}">{verdict}</td>' in html
        assert re.search(rf"td\.{css}\{{background:#[0-9a-f]{{6}}\}}", page.CSS), css
