"""The command line as a user meets it: list, run, table, claims, maxlen, their messages and
exit codes. Every test calls ``harness.cli.main`` in this process (the one end-to-end
subprocess run is ``test_reliability.test_isolated_sweep_survives_segfault_abort_and_hang``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import registry
from harness.cli import listing, main
from harness.execute import session
from harness.masks import MaskSpec
from harness.results import PASSES_FILE, ROWS_FILE, RowWriter, load_env, load_rows, write_env
from harness.scenarios.interface import Point
from harness.spec import Capabilities, Cost
from tests.conftest import CORE_IMPLEMENTATIONS

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py

TINY = """
name = "tiny"
scenario = "attention"
implementations = ["full", "sdpa", "flash-tiled", "xformers"]
[fixed]
heads = 2
head_dim = 16
causal = true
[sweep]
seq_len = [33, 64]
[measure]
budget_s = 0.02
min_samples = 3
"""
ONE = TINY.replace('["full", "sdpa", "flash-tiled", "xformers"]', '["sdpa"]').replace(
    "seq_len = [33, 64]", "seq_len = [33]"
)


def cli(capsys, *args) -> tuple[int, str, str]:
    """``attnbench ARGS`` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def suite_file(tmp_path: Path, text: str = TINY, name: str = "tiny.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _tiny_call_works(name: str) -> bool:
    """This test's own verdict: does one tiny real call of ``name`` run on this machine's
    preferred declared device? (Independent of the registry's cached probe.)"""
    impl = registry.get(name)
    kinds = ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]
    kind = next((d for d in kinds if d in impl.caps.devices), None)
    if kind is None:
        return False
    dtype = torch.float16 if kind == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 16, 64, generator=gen).to(kind, dtype) for _ in range(3))
    try:
        return bool(torch.isfinite(impl.fn(q, k, v, MaskSpec(causal=True))).all())
    except Exception:  # any failure of the real call means unavailable
        return False


def test_list_shows_every_implementation_with_availability(capsys):
    # --probe: on a GPU machine too, every backend's availability from its real call
    code, out, err = cli(capsys, "list", "--json", "--probe")
    assert code == 0, err
    listed = {d["name"]: d for d in json.loads(out)}
    assert set(CORE_IMPLEMENTATIONS) <= set(listed)
    assert listed["sdpa"]["available"] is True
    # optional backends: availability is what a real call says, on CPU and CUDA machines alike
    for name in ("xformers", "flash-attn", "sdpa-efficient", "sdpa-cudnn", "sdpa-flash"):
        assert listed[name]["available"] is _tiny_call_works(name), listed[name]
        if not listed[name]["available"]:
            assert listed[name]["status"].startswith("unavailable: "), listed[name]
            reason = registry.get(name).unavailable_reason()
            assert listed[name]["status"] == f"unavailable: {reason}"


def test_list_on_a_gpu_launches_no_probe_and_says_what_earlier_probes_found(capsys,
                                                                          monkeypatch,
                                                                          tmp_path):
    """On a (fake) CUDA machine ``list`` runs no probe on the GPU (a probe may compile kernels:
    fla's Triton kernels, seconds each): those backends say they are not probed yet, with the
    command that probes them. ``list --probe`` runs each probe once and records it; a later
    ``list`` (a new process: no in-process outcome) shows what was found without a call."""
    from dataclasses import replace

    from harness import probecache

    monkeypatch.setenv(probecache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(probecache, "environment", lambda: {"fake": "an H100 machine"})
    monkeypatch.setattr(registry, "_PROBED", {})
    calls: list[tuple[str, str]] = []

    def compiling(name: str):
        def probe(device_type: str):
            calls.append((name, device_type))  # a real probe would compile and launch here
            if name == "xformers":
                raise RuntimeError("No operator found for `memory_efficient_attention_forward`")
            return torch.ones(1)

        return probe

    probed = [i.name for i in registry.all_implementations() if i.probe is not None]
    assert {"fla-linear", "xformers", "sdpa-flash"} <= set(probed)
    for name in probed:
        impl = registry.get(name)
        monkeypatch.setitem(registry._REGISTRY, name, replace(impl, probe=compiling(name)))

    def listed(*flags: str) -> dict:
        code, out, err = cli(capsys, "list", "--json", *flags)
        assert code == 0, err
        return {d["name"]: d for d in json.loads(out)}

    first = listed()
    assert calls == []  # nothing compiled or launched
    for name in probed:
        assert first[name]["available"] is None, first[name]
        assert first[name]["status"].startswith("not probed on cuda here yet")
        assert "attnbench list --probe" in first[name]["status"]
    assert first["full"]["available"] is True  # no probe needed
    for width in (80, 250):  # paragraphs, or a table with the not-probed ones under it
        flat = " ".join(listing.render(list(first.values()), {}, width).split())
        assert re.search(r"fla-linear( \(linear\))?: not probed on cuda here yet", flat), flat
    assert calls == []

    listed("--probe")
    assert sorted(calls) == sorted((name, "cuda") for name in probed)
    calls.clear()
    monkeypatch.setattr(registry, "_PROBED", {})  # as in a new process
    later = listed()
    assert calls == []
    assert later["fla-linear"]["available"] is True and later["sdpa-flash"]["status"] == "available"
    assert later["xformers"]["available"] is False
    assert later["xformers"]["status"].startswith("unavailable: probe on cuda: RuntimeError")


def _words(text: str) -> set[str]:
    return {w.strip(",;:()") for w in text.split()} - {""}


@pytest.mark.parametrize("width", [60, 80, 100, 120, 160, 250])
def test_list_wraps_at_word_boundaries_to_the_width(width):
    """Every line fits ``width`` and every word printed is a whole word of what is listed
    (a 100-column terminal once showed ``availabl`` / ``e``); nothing is left out."""
    impls = [listing._describe(i) for i in registry.all_implementations()]
    errors = {"broken-plugin": "ImportError: No module named 'broken_plugin_dep'"}
    text = listing.render(impls, errors, width)
    assert max(len(line) for line in text.splitlines()) <= width
    source = " ".join([*listing.HEADER, listing.baselines_text(), *errors.values(),
                       *(" ".join(map(str, [*d.values(), *d["devices"], *d["dtypes"],
                                            *d["mask_features"]])) for d in impls),
                       *(listing._params_text(d["params"]) for d in impls),
                       *(f"~n^{d[k]:g}" for d in impls for k in ("time_exponent",
                                                                   "memory_exponent")),
                       f"{len(impls)} {sum(d['available'] is True for d in impls)}",
                       "attnbench implementations here unavailable available time memory "
                       "params devices dtypes mask features: none plug-in broken-plugin"])
    assert _words(text) <= _words(source) | {"-" * k for k in range(1, width + 1)}
    flat = " ".join(text.split())
    for d in impls:
        assert d["name"] in _words(text)
        reason = d["status"].removeprefix("unavailable: ")
        assert d["available"] or reason in flat, d["name"]


def test_list_piped_is_a_sane_width(capsys, monkeypatch):
    """Off a terminal (a pipe, a file) without $COLUMNS: 100 columns, not the widest cell."""
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, _ = cli(capsys, "list")
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 100
    monkeypatch.setenv("COLUMNS", "250")
    code, wide, _ = cli(capsys, "list")
    assert code == 0 and 100 < max(len(line) for line in wide.splitlines()) <= 250


def test_run_writes_rows_env_and_prints_a_table(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = cli(capsys, "run", suite_file(tmp_path), "--out", out, "--no-progress")
    assert code == 0, err
    rows = load_rows(out)
    assert len(rows) == 8
    assert set(rows["status"]) == {"ok", "skipped"}
    assert rows.loc[rows["status"] == "ok", "agree"].all()
    env = load_env(out)
    assert env["calibration"]["matmul_flops_per_s"] > 0 and env["threads"] >= 1
    assert "median time (ms)" in stdout and "flash-tiled" in stdout
    code, table, _ = cli(capsys, "table", out)
    assert code == 0 and "peak memory (MiB)" in table


def test_run_says_its_expected_time_and_progress_off_a_terminal(tmp_path, capsys):
    """stderr is not a terminal here: progress comes as plain lines, after an up-front ETA."""
    code, _, err = cli(capsys, "run", suite_file(tmp_path, ONE), "--out", tmp_path / "r",
                       "--no-table")
    assert code == 0, err
    lines = err.splitlines()
    assert "1 point of suite 'tiny'" in lines[0] and "expected about" in lines[0]
    assert "1 points" not in err
    assert any("pass 3/3: 1/1 point (100%)" in line for line in lines), err


def test_passes_overrides_the_suite_and_one_pass_is_a_quick_profile(tmp_path, capsys):
    code, _, err = cli(capsys, "run", suite_file(tmp_path, ONE), "--out", tmp_path / "r",
                       "--no-table", "--passes", "1")
    assert code == 0, err
    assert any("pass 1/1: 1/1 point (100%)" in line for line in err.splitlines()), err
    assert set(load_rows(tmp_path / "r")["passes"]) == {1}


def test_the_expected_time_leaves_out_points_over_the_memory_budget(tmp_path, capsys):
    """A point predicted not to fit is skipped at once: it adds nothing to the expected time
    (``local`` at n=10^6 once said "expected about 563 h" and was done in a second)."""
    from harness.distributed.shard import predicted_seconds
    from harness.terminal import duration

    text = ONE.replace("seq_len = [33]", "seq_len = [33, 1000000]")
    code, _, err = cli(capsys, "run", suite_file(tmp_path, text), "--out", tmp_path / "r",
                       "--no-table", "--mem-budget", "16MiB", "--budget-s", "0.02")
    assert code == 0, err
    small = Point.of("sdpa", seq_len=33, heads=2, head_dim=16, causal=True)
    rate = load_env(tmp_path / "r")["calibration"]["matmul_flops_per_s"]  # measured here
    first, later = (predicted_seconds(small, 0.02, rate, first) for first in (True, False))
    expected = duration(first + 2 * later)  # the first pass checks and profiles; 2 time only
    assert f"expected about {expected} " in err.splitlines()[0], err
    assert "1 ok, 1 skipped" in err


def test_the_default_run_folder_is_named_after_the_run_id(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, "run", suite_file(tmp_path, ONE), "--no-progress", "--no-table")
    assert code == 0, err
    (run_dir,) = (tmp_path / "runs").iterdir()
    run_id = load_env(run_dir)["run_id"]
    assert run_dir.name == f"tiny-{run_id}"
    assert set(load_rows(run_dir)["run_id"]) == {run_id}


def test_run_refuses_to_overwrite_a_finished_run(tmp_path, capsys):
    suite = suite_file(tmp_path, ONE)
    out = tmp_path / "run"
    assert cli(capsys, "run", suite, "--out", out, "--no-progress", "--no-table")[0] == 0
    code, _, err = cli(capsys, "run", suite, "--out", out, "--no-progress")
    assert code == 2 and "--resume" in err
    assert len(err.strip().splitlines()) == 1


def test_resume_of_an_empty_directory_says_it_starts_afresh(tmp_path, capsys):
    typo = tmp_path / "runz"
    code, _, err = cli(capsys, "run", suite_file(tmp_path, ONE), "--out", typo, "--resume",
                       "--no-progress", "--no-table")
    assert code == 0, err
    assert f"nothing to resume in {typo}; starting a new run" in err
    assert len(load_rows(typo)) == 1


def test_ctrl_c_in_run_says_what_is_saved_and_how_to_resume(tmp_path, capsys, monkeypatch):
    suite = suite_file(tmp_path, TINY)
    real = session.run_points

    def interrupted(points, writer, *args, **kwargs):
        real(points[:1], writer, *args, **kwargs)  # one point finishes, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "run_points", interrupted)
    out = tmp_path / "run"
    code, _, err = cli(capsys, "run", suite, "--out", out, "--no-progress", "--no-table")
    assert code == 130
    last = err.strip().splitlines()[-1]
    assert "1 finished row" in last and str(out) in last
    assert f"attnbench run {suite} --out {out} --resume" in last
    monkeypatch.setattr(session, "run_points", real)
    code, _, err = cli(capsys, "run", suite, "--out", out, "--resume", "--no-progress",
                       "--no-table")
    assert code == 0 and "(1 already done)" in err
    assert len(load_rows(out)) == 8


def test_ctrl_c_in_maxlen_says_nothing_is_saved(capsys, monkeypatch):
    from harness.cli import maxlen

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(maxlen, "find_max_len", interrupted)
    code, _, err = cli(capsys, "maxlen", "sdpa", "--budget", "64MiB")
    assert code == 130
    assert "saves nothing" in err and "--no-verify" in err and "finished rows" not in err


def test_table_of_a_missing_directory_is_one_line(tmp_path, capsys):
    code, _, err = cli(capsys, "table", tmp_path / "nope")
    assert code == 2
    assert err.strip().count("\n") == 0 and "Traceback" not in err


# --- papercuts: fast help, one-line usage errors, quiet pipes, strict JSON -------------------


def test_help_imports_nothing_heavy():
    """A fresh interpreter (``attnbench --help`` as typed); its time is measured by
    benchmarks/cli_help.py, not asserted here."""
    code = (
        "import sys, contextlib, io\n"
        "from harness.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('table' in out.getvalue(),\n"
        "      sorted(m for m in ('torch', 'matplotlib', 'pandas', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    listed, heavy = result.stdout.split(" ", 1)
    assert listed == "True" and heavy.strip() == "[]", result.stdout


def test_subcommand_help_loads_only_its_module():
    from harness.cli import build_parser

    code = (
        "import sys\nfrom harness.cli import build_parser\n"
        "try:\n    build_parser('table').parse_args(['table', '--help'])\n"
        "except SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip().endswith("False False"), result.stdout
    for name in ("table", "report", "compare", "baseline", "claims", "maxlen", "merge", "run"):
        assert name in build_parser(name)._subparsers._group_actions[0].choices


def test_usage_errors_have_one_prefix(capsys):
    assert main(["table"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnbench: table: ") and "attnbench: attnbench" not in err
    assert len(err.splitlines()) == 1 and "RUN_DIR" in err


def test_resume_without_out_is_a_usage_error(capsys):
    assert main(["run", "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--resume needs --out" in err


def _small_run(path: Path, suite: str, impls=("sdpa", "full")) -> Path:
    writer = RowWriter(path)
    for impl in impls:
        for n in (64, 128):
            writer.write({**Point(impl, seq_len=n).columns(), "run_id": path.name,
                          "suite": suite, "status": "ok", "time_median_s": 1e-3 * n,
                          "peak_mem_bytes": 1024.0 * n, "max_abs_err": float("nan")})
    write_env(path, {"run_id": path.name, "suite": suite})
    return path


def test_table_formats_baseline_and_metrics_from_the_cli(tmp_path, capsys):
    run = _small_run(tmp_path / "run", "tiny")
    assert main(["table", str(run), "--format", "csv", "--baseline", "sdpa",
                 "--metric", "rel_err", "--metric", "time_median_s"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("impl,seq_len,status") and "speedup_vs_sdpa" in lines[0]
    assert len(lines) == 5
    assert main(["table", str(run), "--baseline", "nope"]) == 2
    assert "--baseline nope" in capsys.readouterr().err


def test_table_metric_says_why_a_column_cannot_be_shown(tmp_path, capsys):
    run = _small_run(tmp_path / "run", "tiny")
    code, _, err = cli(capsys, "table", run, "--metric", "pass_medians_s")
    assert code == 2 and "a list per row (one value per sample or pass)" in err
    code, _, err = cli(capsys, "table", run, "--metric", "seq_len")
    assert code == 2 and "point field" in err
    code, _, err = cli(capsys, "table", run, "--metric", "schema_version")
    assert code == 2 and "which run or point a row is" in err
    assert "schema_version" not in err.split("(metrics:")[1]  # not offered as a metric
    code, out, _ = cli(capsys, "table", run, "--metric", "nvml_peak_bytes", "--metric",
                       "time_median_s")
    assert code == 0 and "median time (ms)" in out
    assert "nvml_peak_bytes: no row of this run has a value (recorded for CUDA rows only)" in out
    code, out, _ = cli(capsys, "table", run, "--metric", "nvml_peak_bytes", "--format", "csv")
    header, *rows = out.strip().splitlines()
    assert code == 0 and header.endswith(",nvml_peak_bytes") and all(r.endswith(",") for r in rows)


def test_compare_of_two_suites_is_a_usage_error(tmp_path, capsys):
    a = _small_run(tmp_path / "a", "smoke")
    b = _small_run(tmp_path / "b", "sparse-cpu", impls=("local",))
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'smoke'" in err and "'sparse-cpu'" in err


def test_claims_json_is_strict_json_with_nan_rows(tmp_path, capsys):
    run = _small_run(tmp_path / "run", "tiny")
    code, out, err = cli(capsys, "claims", run, "--json")
    assert code == 0, err
    verdicts = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert verdicts and all(v["verdict"] in {"confirmed", "refuted", "inconclusive"}
                            for v in verdicts)


def test_json_guard_turns_nan_into_null():
    import numpy as np

    from harness.results import dumps_json

    text = dumps_json({"a": float("nan"), "b": [np.float64("inf"), 1.5], "c": np.int64(3)})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": 3}


def test_maxlen_says_up_front_how_long_verification_takes():
    from harness.execute.maxlen import verification_notice

    slow = verification_notice(Point("sdpa"), 256 * 2**20, 64, 120.0)
    fast = verification_notice(Point.of("full", causal=True), 256 * 2**20, 64, 120.0)
    assert "isolated runs" in slow and "min in all" in slow and "--no-verify" in slow
    assert "--no-verify" not in fast


# --- plug-ins: one that fails to import, one that computes the wrong thing --------------------


def test_run_names_a_plugin_that_failed_to_load(tmp_path, capsys, monkeypatch):
    """A distribution whose entry point names a module that does not import: ``run`` of a
    suite that asks for its implementation says why, not only "unknown implementation"."""
    site = tmp_path / "site"
    info = site / "attnbench_broken-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: attnbench-broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[attnbench.implementations]\nbroken = attnbench_not_installed_anywhere\n"
    )
    monkeypatch.syspath_prepend(str(site))
    registry._load()
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "_LOAD_ERRORS", {})
    suite = suite_file(tmp_path, ONE.replace('["sdpa"]', '["my-broken-attn"]'))
    code, _, err = cli(capsys, "run", suite, "--out", tmp_path / "o")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "my-broken-attn" in err and "unknown implementation" in err
    assert "broken: entry point attnbench_not_installed_anywhere failed to load" in err
    assert "No module named 'attnbench_not_installed_anywhere'" in err
    named = suite_file(tmp_path, ONE.replace('["sdpa"]', '["broken"]'), "named.toml")
    code, _, err = cli(capsys, "run", named, "--out", tmp_path / "o")
    assert code == 2 and "unknown implementation" not in err, err  # it is known, and broken
    assert "implementations = 'broken': entry point attnbench_not_installed_anywhere failed " \
           "to load: No module named 'attnbench_not_installed_anywhere'" in err


@pytest.fixture
def wrong_plugin(monkeypatch):
    """``half-attn``: SDPA's output times 0.5 (a plug-in with a real bug), registered here."""
    def half(q, k, v, mask, scale=None):
        return 0.5 * torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False)

    registry._load()
    # a copy of the registry for this test: the plug-in is gone again afterwards
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("half-attn", family="test", caps=Capabilities(devices={"cpu"}),
                      cost=Cost(2, 2))(half)
    return "half-attn"


def test_a_mismatching_plugin_gets_a_column_its_marks_and_exit_1(tmp_path, capsys, wrong_plugin):
    suite = suite_file(tmp_path, TINY.replace('["full", "sdpa", "flash-tiled", "xformers"]',
                                             '["sdpa", "half-attn"]').replace("causal = true", ""))
    code, out, err = cli(capsys, "run", suite, "--out", tmp_path / "r", "--no-progress")
    assert code == 1
    assert ("attnbench: half-attn: 2 of 2 points disagree with the float64 reference (status "
            "mismatch); first: max_abs_err") in err
    assert err.strip().splitlines()[-1] == "attnbench: 2 mismatch, 2 ok: a point failed: exit 1"
    header = out.splitlines()[1].split()
    assert header[0] == "seq_len" and sorted(header[1:]) == ["half-attn", "sdpa"]
    column = header.index("half-attn")
    marked = [line.split() for line in out.splitlines() if line.split()[:1] in (["33"], ["64"])]
    assert len(marked) == 4  # two tables (time, memory), two lengths
    assert all(cells[column + 1] == "(!)" for cells in marked), marked  # after its value
    notes = [line for line in out.splitlines() if line.startswith("(!)")]
    assert len(notes) == 1 and "half-attn (2): max_abs_err" in notes[0]
    assert "(and 1 more like it)" in notes[0] and "not ok" not in out


def test_a_plugin_returning_the_wrong_shape_is_a_mismatch_that_says_so(tmp_path, capsys,
                                                                        monkeypatch):
    """(B, N, H, D) instead of (B, H, N, D): a recorded mismatch naming both shapes, not a raw
    RuntimeError from the comparison."""
    def transposed(q, k, v, mask, scale=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)

    registry._load()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("bnhd-attn", family="test", caps=Capabilities(devices={"cpu"}),
                      cost=Cost(2, 2))(transposed)
    suite = suite_file(tmp_path, ONE.replace('["sdpa"]', '["bnhd-attn"]').replace(
        "causal = true", ""))
    code, _, err = cli(capsys, "run", suite, "--out", tmp_path / "r", "--no-progress",
                       "--no-table")
    assert code == 1, err
    (row,) = load_rows(tmp_path / "r").to_dict("records")
    assert row["status"] == "mismatch", row
    assert row["reason"] == "output shape 1 x 33 x 2 x 16 ≠ expected 1 x 2 x 33 x 16"


# --- suite messages ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (TINY + '[[variant]]\nimplementation = "dilatd"\ndilation = [2]\n',
         "variant[0].implementation = 'dilatd': unknown implementation"),
        (ONE + '[[variant]]\nimplementation = "sdpa"\nseq_len = [33, 33]\n',
         "point = 'sdpa attention n=33 B=1 H=2 D=16 float32 causal': the suite produces the same "
         "point twice"),
        ("", "empty suite file"),
        ("\n# only a comment\n", "empty suite file"),
    ],
    ids=["variant-typo", "duplicate-point", "empty", "comment-only"],
)
def test_suite_mistakes_are_named(tmp_path, capsys, text, needle):
    code, _, err = cli(capsys, "run", suite_file(tmp_path, text), "--out", tmp_path / "o")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert needle in err and "= None" not in err
    assert not (tmp_path / "o").exists()


def test_an_interrupted_multi_pass_run_shows_its_finished_passes(tmp_path, capsys, monkeypatch):
    """Ctrl-C in the second of three passes: table shows every point, marked partial."""
    suite = suite_file(tmp_path, ONE.replace("[33]", "[33, 48, 64]"))
    real, calls = session.run_points, []

    def interrupted(points, writer, *args, on_pass=None, **kwargs):
        def count(point, k, record):
            calls.append(k)
            if k == 1:
                raise KeyboardInterrupt
        return real(points, writer, *args, on_pass=count, **kwargs)

    monkeypatch.setattr(session, "run_points", interrupted)
    out = tmp_path / "run"
    assert cli(capsys, "run", suite, "--out", out, "--no-progress", "--no-table")[0] == 130
    assert not (out / ROWS_FILE).exists() and (out / PASSES_FILE).exists()
    code, table, err = cli(capsys, "table", out)
    assert code == 0 and "no such results file" not in err
    assert all(n in table for n in ("33", "48", "64")) and "interrupted run" in err


# --- output paths -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("report", "{run}", "--out", "{file}"), "--out {file}: exists and is not a directory"),
        (("report", "{run}", "--out", "{file}/sub"), "--out {file}/sub: {file} is a file"),
        (("merge", "{run}", "--out", "{file}"), "--out {file}: exists and is not a directory"),
        (("run", "{run}/suite.toml", "--out", "{file}"),
         "--out {file}: exists and is not a directory"),
        (("compare", "{run}", "{run}", "--markdown", "{dir}"),
         "--markdown {dir}: is a directory, not a file"),
        (("baseline", "save", "{run}", "--root", "{file}"),
         "--root {file}: exists and is not a directory"),
    ],
    ids=["report", "report-under-a-file", "merge", "run", "compare-markdown", "baseline-save"],
)
def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(
    tmp_path, capsys, argv, needle
):
    """Every verb that writes files checks where first: one line, exit 2. The run directory
    named does not exist, so a verb that did any work first would complain about it instead."""
    names = {"run": tmp_path / "missing-run", "file": tmp_path / "afile", "dir": tmp_path / "adir"}
    names["file"].write_text("not a directory\n")
    names["dir"].mkdir()
    code, out, err = cli(capsys, *(a.format(**names) for a in argv))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"attnbench: {needle.format(**names)}"), err
