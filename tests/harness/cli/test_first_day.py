"""What a newcomer meets on a first day, each said in one line: a budget without a unit or
below zero, ``baseline list`` where there are none, a decode suite with packed documents
(refused by ``--dry-run``, not at run time), ``--dry-run`` lines that show grouped K/V heads,
and an unknown implementation answered with the nearest name."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

ROOT = Path(__file__).resolve().parents[3]
DECODE = ROOT / "suites" / "decode-cpu.toml"


def cli(capsys, *args) -> tuple[int, str, list[str]]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["maxlen", "sdpa", "--budget", "64", "--no-verify"],
            "--budget: '64' has no unit: a size needs one (e.g. 64MiB",
        ),
        (
            ["maxlen", "sdpa", "--budget", "-64MB", "--no-verify"],
            "--budget: size must be > 0: '-64MB'",
        ),
        (
            ["maxlen", "sdpa", "--budget=-64MB", "--no-verify"],
            "--budget: size must be > 0: '-64MB'",
        ),
        (["run", "--dry-run", "--mem-budget", "512"], "--mem-budget: '512' has no unit"),
        (["run", "--dry-run", "--mem-budget", "-1GiB"], "--mem-budget: size must be > 0"),
    ],
)
def test_a_budget_needs_a_unit_and_a_positive_size(capsys, argv, said) -> None:
    code, out, err = cli(capsys, *argv)
    assert code == 2 and len(err) == 1 and said in err[0] and not out, err
    assert "expected one argument" not in err[0]


def test_a_negative_number_is_still_a_value_where_one_is_expected(capsys) -> None:
    """``--window -3 0`` (two values, plain numbers) is read as before: refused by its check."""
    code, _, err = cli(capsys, "maxlen", "full", "--window", "-3", "0", "--no-verify")
    assert code == 2 and len(err) == 1 and "window = [-3, 0]" in err[0], err


def test_baseline_list_without_baselines_says_where_it_looked(
    tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)  # outside the checkout
    code, out, err = cli(capsys, "baseline", "list")
    assert code == 3 and not out and len(err) == 1, err
    assert f"no baselines found under {tmp_path / 'results' / 'baselines'}" in err[0]
    assert "no such directory" in err[0] and "--root" in err[0]
    code, out, err = cli(capsys, "baseline", "list", "--root", ROOT / "results" / "baselines")
    assert code == 0 and out and not err


def test_documents_in_a_decode_suite_are_refused_by_dry_run(tmp_path, capsys) -> None:
    suite = tmp_path / "decode-docs.toml"
    text = DECODE.read_text().replace("[fixed]\n", '[fixed]\ndocuments = "uniform:256"\n', 1)
    suite.write_text(text)
    code, out, err = cli(capsys, "run", suite, "--dry-run")
    assert code == 2 and not out and len(err) == 1, err
    assert "documents = 'uniform:256': decode supports causal (sliding-window) models" in err[0]


def test_dry_run_lines_show_kv_heads(capsys) -> None:
    code, out, _ = cli(capsys, "run", DECODE, "--dry-run")
    lines = out.splitlines()[1:]
    assert code == 0
    assert any(" H=4 kv_heads=1 D=64 " in line for line in lines)
    assert all("kv_heads=4 " not in line.split("[")[0] for line in lines)  # = heads: not said


def test_an_unknown_implementation_gets_the_nearest_name(tmp_path, capsys) -> None:
    code, _, err = cli(capsys, "maxlen", "sdpaa", "--no-verify")
    assert code == 2 and len(err) == 1 and "did you mean 'sdpa'?" in err[0], err
    suite = tmp_path / "typo.toml"
    suite.write_text(
        'name = "t"\nscenario = "attention"\nimplementations = ["flash-tiledd"]\n'
        "[fixed]\nbatch = 1\nheads = 2\nhead_dim = 16\n[sweep]\nseq_len = [64]\n"
    )
    code, _, err = cli(capsys, "run", suite, "--dry-run")
    assert code == 2 and len(err) == 1 and "did you mean 'flash-tiled'?" in err[0], err


def test_a_claim_left_on_thin_data_names_the_bundled_suite_that_decides_it(capsys) -> None:
    """The smoke run sweeps seq_len only: the claim over d_model has one point per group, and
    the line under it names the suite whose sweep has enough (found from the suites' points)."""
    smoke = ROOT / "results" / "baselines" / "cpu-intel-r-xeon-r-t1" / "smoke"
    code, out, _ = cli(capsys, "claims", smoke)
    assert code == 0
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("attention-time-d1 "))
    block = []
    for line in lines[start + 1 :]:
        if not line.startswith(" "):
            break
        block.append(line.strip())
    assert block[-1].startswith(
        "decided by a run of suites/claims-cpu-heads.toml: 4 values of d_model in one group "
        "(these rows have 1)"
    ), block


def test_a_run_predicts_at_the_matmul_rate_this_machine_measured(tmp_path) -> None:
    """The expected time of a run is computed at the fp32 matmul rate its env.json calibration
    measured on this machine, not a nominal one (a nominal rate was 1.7x off on 2 cores)."""
    from harness.distributed.shard import NOMINAL_FLOPS, predicted_seconds
    from harness.execute.session import at_measured_rate
    from harness.results import write_env
    from harness.scenarios.interface import Point

    point = Point.of("sdpa", seq_len=4096, heads=8, head_dim=64)
    seen = []
    write_env(tmp_path, {"run_id": "r", "calibration": {"matmul_flops_per_s": 4e11}})
    at_measured_rate(lambda p, rate, first: seen.append(rate) or 1.0, tmp_path)(point)
    write_env(tmp_path, {"run_id": "r"})  # no calibration: the nominal rate
    at_measured_rate(lambda p, rate, first: seen.append(rate) or 1.0, tmp_path)(point)
    assert seen == [4e11, None]
    nominal = predicted_seconds(point, 60.0)
    assert predicted_seconds(point, 60.0, NOMINAL_FLOPS["cpu"]) == nominal
    assert predicted_seconds(point, 60.0, 4 * NOMINAL_FLOPS["cpu"]) < nominal / 2
