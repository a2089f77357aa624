"""``attnbench table``: one line per point shape at any suite shape, markdown and CSV, speedups,
every documented metric."""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path

import pandas as pd
import pytest

from harness import fmt
from harness.render import pivot, table
from harness.results import ROW_COLUMNS
from harness.scenarios.interface import Point

README = Path(__file__).resolve().parents[3] / "results" / "README.md"
SPARSE_IMPLS = {  # a sparse-cpu-like suite: [[variant]] fields owned by one implementation each
    "local": {},
    "dilated": {"dilation": 2},
    "longformer": {"global_tokens": 16},
    "bigbird": {"block_size": 64, "window_left": 3, "random_blocks": 2, "global_tokens": 64},
    "sdpa-flash": {"window_left": None, "window_right": None},
}


def _row(point: Point, status: str = "ok", seconds: float = 1e-3, **extra) -> dict:
    ok = status == "ok"
    return {
        **point.columns(),
        "status": status,
        "reason": None if ok else "unavailable: needs a CUDA GPU",
        "time_median_s": seconds if ok else None,
        "peak_mem_bytes": 2.0**20 * point.seq_len / 512 if ok else None,
        "rel_err": 1e-7 if ok else None,
        "agree": True if ok else None,
        **extra,
    }


def sparse_rows() -> pd.DataFrame:
    rows = []
    for n in (512, 1024, 2048):
        for i, (impl, fields) in enumerate(SPARSE_IMPLS.items()):
            base = {"causal": True, "window_left": 255, "window_right": 0, "seq_len": n}
            seconds = (i + 1) * 1e-3 * n / 512
            rows.append(_row(Point.of(impl, **{**base, **fields}), seconds=seconds))
        rows.append(_row(Point.of("xformers", causal=True, seq_len=n), status="skipped"))
    return pd.DataFrame(rows)


def decode_rows() -> pd.DataFrame:
    rows = []
    for n in (128, 256):
        for cache in ("none", "full"):
            for kv in (4, 1):
                rows.append(
                    _row(Point.of("sdpa", "decode", heads=4, kv_heads=kv, cache=cache, seq_len=n))
                )
            rows.append(_row(Point.of("full", "decode", heads=4, cache=cache, seq_len=n)))
        rows.append(
            _row(
                Point.of(
                    "local",
                    "decode",
                    heads=4,
                    cache="rolling",
                    window_left=255,
                    window_right=0,
                    seq_len=n,
                )
            )
        )
    return pd.DataFrame(rows)


def test_variant_suite_has_one_line_per_shape_and_no_skipped_column():
    frame = sparse_rows()
    text = table.render(frame, ("time_median_s",))
    tables = text.split("\n\n")
    first = tables[0].splitlines()
    assert first[0] == "median time (ms)"
    assert first[1].split() == ["seq_len", *SPARSE_IMPLS]  # title not repeated as a header
    assert [line.split()[0] for line in first[2:]] == ["512", "1024", "2048"]
    assert "xformers" not in first[1]
    assert "skipped" not in tables[0]
    notes = tables[-1]
    assert "dilated: dilation=2" in notes and "sdpa-flash: window=none" in notes
    skipped = [line for line in notes.splitlines() if "not shown" in line]
    assert len(skipped) == 1 and "3 points" in skipped[0] and "xformers" in skipped[0]
    assert "needs a CUDA GPU" in skipped[0]
    assert len(text.splitlines()) < 12  # was hundreds of lines of empty index rows


def test_decode_suite_rows_are_the_fields_that_vary_within_an_implementation():
    frame = decode_rows()
    lay = pivot.layout(frame)
    assert set(lay.rows) == {"kv_heads", "cache", "seq_len"}
    assert lay.variants == {"local": "window=255,0"}
    assert lay.rows[-1] == "seq_len"
    cells = table.cells(frame, "time_median_s", lay)
    assert len(cells) == 14  # 7 shapes (sdpa 4, full 2, local 1) at each of 2 lengths
    filled = (cells[lay.shown] != "").sum(axis=1)
    assert (filled >= 1).all()  # no empty line (the old pivot's cartesian product)


def test_markdown_csv_and_speedup():
    frame = sparse_rows()
    md = table.render(frame, ("time_median_s",), "markdown", baseline="local")
    assert "### median time (ms)" in md and "### speedup vs local" in md
    body = [line for line in md.splitlines() if line.startswith("|")]
    assert body[0].replace(" ", "").startswith("|seq_len|local|dilated|")
    speed = md.split("### speedup vs local")[1]
    # dilated is 2x slower than local at every n in sparse_rows
    assert speed.count("0.50x") == 3 and "local |" not in speed.splitlines()[2]
    csv = pd.read_csv(io.StringIO(table.render(frame, ("time_median_s",), "csv", "local")))
    assert len(csv) == len(frame)  # one line per point, skipped ones included
    assert {"impl", "seq_len", "dilation", "status", "time_median_s"} <= set(csv.columns)
    dilated = csv[csv["impl"] == "dilated"]
    assert dilated["speedup_vs_local"].to_numpy() == pytest.approx([0.5] * 3)
    assert csv.loc[csv["impl"] == "xformers", "speedup_vs_local"].isna().all()


def test_every_documented_metric_is_accepted_and_formatted():
    documented = set()
    text = README.read_text()
    columns = text[text.index("<!-- column table"):text.index("<!-- end column table")]
    for line in columns.splitlines():
        if line.startswith("| `"):
            documented |= set(re.findall(r"`([a-z0-9_]+)`", line.split("|")[1]))
    assert documented <= set(ROW_COLUMNS), documented - set(ROW_COLUMNS)
    numeric = {c for c in documented if table.unit_of(c) is not None}
    assert {"rel_err", "tflops_per_s", "tokens_per_s", "time_ci_low_s", "cache_bytes"} <= numeric
    assert "time_samples_s" not in table.METRICS and "seq_len" not in table.METRICS
    assert numeric <= set(table.METRICS)
    frame = sparse_rows()
    assert table.render(frame, ("rel_err",)).splitlines()[0] == "relative error vs float64"
    assert table.title("peak_mem_bytes") == "peak memory (MiB)"
    assert table.fmt_value("time_median_s", 0.0123) == "12.3"
    assert table.fmt_value("peak_mem_bytes", 3 * 2**30) == "3,072"


def test_markdown_writer_escapes_and_aligns():
    out = fmt.markdown_table(pd.DataFrame({"a": ["1.5", None], "b": ["x|y", "z"]}))
    lines = out.splitlines()
    rule = lines[1].strip("|").split("|")
    assert rule[0].endswith(":") and rule[1].startswith(":")  # numbers right, text left
    assert "x\\|y" in out and "None" not in out


# --- order: the suite's, not the shuffled order the passes ran in ------------------------------

SHUFFLED = ("performer", "linformer", "nystrom", "sdpa", "linear")  # as the passes ran them
DECLARED = ("sdpa", "linear", "performer", "linformer", "nystrom")


def shuffled_rows(seed: int = 3) -> pd.DataFrame:
    """Rows of a suite declaring :data:`DECLARED`, in a shuffled execution order."""
    rows = [_row(Point.of(impl, seq_len=n, causal=False), seconds=1e-3 * n / 256)
            for n in (1024, 256, 512) for impl in SHUFFLED]
    return pd.DataFrame(rows).sample(frac=1.0, random_state=seed).reset_index(drop=True)


def suite_env(tmp_path: Path, impls=DECLARED, name: str = "mine") -> dict:
    path = tmp_path / f"{name}.toml"
    listed = ", ".join(f'"{i}"' for i in impls[:-1])
    path.write_text(f'name = "{name}"\nscenario = "attention"\nimplementations = [{listed}]\n'
                    f'[[variant]]\nimplementation = "{impls[-1]}"\nseq_len = [256]\n')
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"suite": name, "suite_path": str(path), "suite_fingerprint": digest}


def test_implementations_and_csv_rows_follow_the_suites_declared_order(tmp_path):
    frame = pivot.in_suite_order(shuffled_rows(), [suite_env(tmp_path)])
    text = table.render(frame, ("time_median_s",))
    assert text.splitlines()[1].split() == ["seq_len", *DECLARED]
    csv = pd.read_csv(io.StringIO(table.render(frame, ("time_median_s",), "csv")))
    expected = [(impl, n) for impl in DECLARED for n in (256, 512, 1024)]
    assert list(zip(csv["impl"], csv["seq_len"], strict=True)) == expected


def test_without_a_readable_suite_the_order_is_by_name_not_by_execution(tmp_path):
    """env.json names a suite that changed since (another fingerprint) and no bundled suite
    has its name: implementations by name, points in numeric order."""
    env = {**suite_env(tmp_path), "suite_fingerprint": "0" * 64}
    for envs in ([env], []):
        frame = pivot.in_suite_order(shuffled_rows(), envs)
        assert list(dict.fromkeys(frame["impl"])) == sorted(SHUFFLED)
    other = pivot.in_suite_order(shuffled_rows(seed=11), [env])
    pd.testing.assert_frame_equal(frame, other)  # whatever order the passes ran in


def test_a_bundled_suite_orders_rows_measured_elsewhere():
    """A run from another machine names a suite path that is not here: the bundled suite of
    that name gives the order (suites/smoke.toml)."""
    env = {"suite": "smoke", "suite_path": "/elsewhere/smoke.toml", "suite_fingerprint": "x"}
    impls = ("flash-tiled", "sdpa-flash", "full", "sdpa")
    frame = pd.DataFrame([_row(Point(i, seq_len=256)) for i in impls])
    assert list(pivot.in_suite_order(frame, [env])["impl"]) == ["full", "sdpa", "sdpa-flash",
                                                                 "flash-tiled"]


def test_windows_and_other_numbers_sort_numerically():
    rows = [_row(Point.of("local", causal=True, window_left=w, window_right=0, seq_len=2048))
            for w in (1023, 127, 255, 63)]
    rows.append(_row(Point.of("local", causal=True, window_left=None, window_right=0,
                           seq_len=2048)))
    cells = table.cells(pd.DataFrame(rows), "time_median_s", pivot.layout(pd.DataFrame(rows)))
    assert list(cells["window"]) == ["-,0", "63,0", "127,0", "255,0", "1023,0"]
    values = pd.Series(["10", "9", "-", "100", "b", "a"])
    assert list(values[pivot.sort_key(values).sort_values().index]) == ["-", "9", "10", "100",
                                                                         "a", "b"]


def test_host_bound_rows_are_marked_in_time_cells_with_a_footnote():
    """A row whose host took at least half the GPU time to issue its calls is marked ``(h)``
    in time columns (not in memory columns), and a line under the table names it; rows below
    the threshold and CPU rows (host_frac null) are not."""
    rows = pd.DataFrame([
        _row(Point("performer", seq_len=n), host_frac=frac, seconds=1e-3 * n / 512)
        for n, frac in ((512, 0.93), (1024, 0.3), (2048, None))
    ] + [_row(Point("sdpa", seq_len=512), host_frac=0.02)])
    text = table.render(rows, ("time_median_s", "peak_mem_bytes"))
    time_part, memory_part = text.split("peak memory")[0], text.split("peak memory")[1]
    marked = [line for line in time_part.splitlines() if pivot.HOST_MARK in line]
    assert len(marked) == 1 and marked[0].split()[0] == "512"
    assert pivot.HOST_MARK not in memory_part.split("(h) host-bound")[0]
    (note,) = [line for line in text.splitlines() if line.startswith("(h) host-bound")]
    assert note.endswith(": performer (1)") and "host_frac" in note
    assert pivot.HOST_MARK not in table.render(rows.assign(host_frac=0.1))


def test_where_a_column_is_recorded_comes_from_the_scenario_folders():
    """A column one scenario folder declares is "recorded for <folder> rows only"; table.py
    names no scenario (the folders say which columns are theirs)."""
    import importlib
    from pathlib import Path

    from harness import scenarios
    from harness.render import table

    folders = scenarios.folders()
    for folder in folders:
        for column in importlib.import_module(f"harness.scenarios.{folder}").COLUMNS:
            owners = scenarios.declaring(column.name)
            assert folder in owners
            if len(owners) < len(folders):
                assert table._why_empty(column.name) == \
                    f"recorded for {' and '.join(owners)} rows only"
    assert table._why_empty("cache_bytes") == "recorded for decode rows only"
    assert table._why_empty("nvml_peak_bytes") == "recorded for CUDA rows only"
    assert table._why_empty("time_median_s") == "not recorded for these rows"
    source = Path(table.__file__).read_text()
    assert not [f for f in folders if f'"{f}"' in source or f"'{f}'" in source]
