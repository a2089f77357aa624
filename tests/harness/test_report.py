"""``attnbench report``: every section; self-contained HTML, markdown and CSV tables."""

from __future__ import annotations

import argparse
import re

import numpy as np
import pandas as pd
import pytest

from harness import report
from harness.errors import CliError
from harness.point import Point
from harness.results import RowWriter, write_env

SECTIONS = (
    "claims",
    "fits",
    "time",
    "memory",
    "axes",
    "heatmaps",
    "flops",
    "layers",
    "agreement",
    "status",
    "environment",
)
CALIBRATION = {"matmul_flops_per_s": 1.5e11, "mem_bandwidth_bytes_per_s": 3e10}


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
        out.append(row(Point("full", seq_len=n), 2e-10 * n**2, 8.0 * 8 * n * n + 4e5))
        out.append(row(Point("sdpa-flash", seq_len=n), 8e-11 * n**2, 2048.0 * n + 1e6))
    for h in (1, 2, 4, 8):
        for d in (256, 512, 1024):
            out.append(
                row(
                    Point("sdpa", heads=h, head_dim=d // h, seq_len=1024),
                    1e-6 * d * h**0.1,
                    4.0 * d * 1024,
                )
            )
    for n in (128, 256, 512, 1024):
        block = {"scenario": "block", "heads": 4, "head_dim": 64, "seq_len": n}
        out.append(row(Point("sdpa", **block), 3e-3, 1e6, mixer_time_s=1e-8 * n * n))
        out.append(row(Point("lstm", mixer="lstm", **block), 5e-3, 1e6, mixer_time_s=2e-6 * n))
        out.append(row(Point("conv", mixer="conv", **block), 2e-3, 1e6, mixer_time_s=1e-6 * n))
    failed = {
        **Point("full", seq_len=65536).columns(),
        "run_id": "r1",
        "status": "skipped",
        "reason": "predicted peak 131072 MiB > budget",
    }
    return [*out, failed]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("report")
    writer = RowWriter(base / "run")
    for r in synthetic_rows():
        writer.write(r)
    write_env(
        base / "run",
        {
            "run_id": "r1",
            "suite": "synthetic",
            "device_name": "test cpu",
            "torch": "x",
            "calibration": CALIBRATION,
        },
    )
    page = report.build_report([base / "run"], base / "out")
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
    assert "Nothing to show" not in text  # every section had rows here


def test_markdown_and_csv_tables(built):
    base, _ = built
    out = base / "out"
    md = (out / "report.md").read_text()
    assert md.startswith("# attnbench report")
    assert "| claim | verdict |" in md
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
    table = report.markdown_table(pd.DataFrame({"a": [1.234567, None], "b": ["x|y", "z"]}))
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1.235 | x\\|y |", "|  | z |"]


def test_report_without_claims_or_env_and_bad_dirs(tmp_path):
    writer = RowWriter(tmp_path / "run")
    for r in synthetic_rows()[:4]:
        writer.write(r)
    page = report.build_report([tmp_path / "run"], tmp_path / "out", claims_path=None)
    text = page.read_text()
    assert "No claims file" in text and "no env.json" in text
    parser = argparse.ArgumentParser()
    report.add_cli(parser.add_subparsers())
    args = parser.parse_args(["report", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    with pytest.raises(CliError, match="no such results file"):
        args.func(args)
