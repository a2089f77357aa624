"""``attnbench verdicts``: one command from suites to the verdict table. A tiny CPU suite and a
tiny claims file stand in for the bundled claim suites (the bundled ones are left out here by
pointing the device's suite pattern at nothing): a claim that must be confirmed, one that must
be refuted, a thin one that must say what would decide it; the ``--dry-run`` order; a session
cut by its time limit and resumed; bad input in one line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness import SUITES_DIR
from harness.cli import main
from harness.cli import verdicts as verb
from harness.execute.deadline import Deadline

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

SUITE = """
name = "tiny-verdicts"
scenario = "attention"
implementations = ["full"]
device = "cpu"
[fixed]
heads = 4
head_dim = 8
[sweep]
seq_len = [64, 96, 128, 192, 256, 384]
[measure]
budget_s = 0.02
min_samples = 3
passes = 2
threads = 1
"""

# full (eager) attention keeps the H x n x n scores: its peak memory grows as n^2
CLAIMS = """
[[claim]]
id = "planted-memory-n2"
text = "eager attention's peak memory is quadratic in n"
impl = "full"
metric = "peak_mem_bytes"
over = "seq_len"
expect_exponent = 2.0

[[claim]]
id = "planted-memory-n1"
text = "eager attention's peak memory is linear in n (false)"
impl = "full"
metric = "peak_mem_bytes"
over = "seq_len"
expect_exponent = 1.0

[[claim]]
id = "planted-thin"
text = "two lengths cannot make a fit"
impl = "full"
metric = "peak_mem_bytes"
over = "seq_len"
range = [64, 96]
expect_exponent = 2.0

[[claim]]
id = "planted-other-device"
impl = "sdpa"
where = { device = "cuda" }
metric = "time_median_s"
over = "seq_len"
expect_exponent = 1.0
"""


@pytest.fixture
def files(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """The tiny suite and claims file; no bundled suite is picked up."""
    monkeypatch.setattr(verb, "SUITES", {"cpu": ("no-bundled-suite-*",), "cuda": ("none-*",)})
    monkeypatch.setattr(verb, "_OTHER_SUITES", {"cpu": []})
    suite, claims = tmp_path / "tiny.toml", tmp_path / "claims.toml"
    suite.write_text(SUITE)
    claims.write_text(CLAIMS)
    return suite, claims


def fast_clock() -> float:
    return 1000.0 * time.monotonic()


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def line_of(table: str, claim: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(claim + " "))


def test_verdicts_end_to_end(tmp_path, capsys, files):
    suite, claims = files
    out = tmp_path / "v"
    code, table, err = cli(
        capsys,
        "verdicts",
        "--device",
        "cpu",
        "--minutes",
        "2",
        "--out",
        out,
        "--suite",
        suite,
        "--claims",
        claims,
    )
    assert code == 0, err
    confirmed = line_of(table, "planted-memory-n2")
    assert " confirmed " in confirmed and "seq_len 64..384" in confirmed
    assert "peak memory" in confirmed and "quadratic in n" in confirmed
    refuted = line_of(table, "planted-memory-n1")
    assert " refuted " in refuted and "would decide it" not in refuted
    thin = line_of(table, "planted-thin")
    assert " inconclusive " in thin and "would decide it: " in thin and "thin data" in thin
    assert "1 claim about another device's rows" in table and "planted-other-device" in table
    doc = json.loads((out / "verdicts.json").read_text())
    by_id = {c["claim"]: c for c in doc["claims"]}
    assert by_id["planted-memory-n2"]["verdict"] == "confirmed"
    assert by_id["planted-thin"]["decide"]
    assert "| planted-memory-n1 |" in (out / "verdicts.md").read_text()
    assert (out / "report" / "index.html").is_file()
    # memory is measured in a first pass: no later pass is spent on these claims, and once
    # the stopping rule has decided both claims their other points are not measured
    passes = (out / "runs" / "tiny-verdicts" / "passes.jsonl").read_text().splitlines()
    assert 3 <= len(passes) <= 6 and all('"pass": 0' in line for line in passes)
    assert "triton cache: not used on cpu" in err
    # a second session in the same --out must say --resume
    code, _, err = cli(
        capsys, "verdicts", "--device", "cpu", "--out", out, "--suite", suite, "--claims", claims
    )
    assert code == 2 and "--resume" in err and len(err.strip().splitlines()) == 1


def test_dry_run_prints_the_order_and_measures_nothing(tmp_path, capsys, files):
    suite, claims = files
    out = tmp_path / "v"
    code, text, err = cli(
        capsys,
        "verdicts",
        "--device",
        "cpu",
        "--dry-run",
        "--out",
        out,
        "--suite",
        suite,
        "--claims",
        claims,
    )
    assert code == 0, err
    lines = text.splitlines()
    assert lines[1].split()[1] == "L0" and "tiny-verdicts" in lines[1]
    # the ends of each judged axis first: 64..384, and 64..96 for the thin claim's range
    first = lines[2].split("; ")
    assert [label.split()[2] for label in first] == ["n=64", "n=384", "n=96"]
    assert any("time per suite" in line for line in lines)
    assert any(line.strip().startswith("planted-memory-n2:") for line in lines)
    assert not out.exists()


def test_a_cut_session_resumes_and_spends_its_minutes_on_what_is_undecided(
    tmp_path, capsys, files, monkeypatch
):
    suite, claims = files
    out = tmp_path / "v"
    args = ["verdicts", "--device", "cpu", "--out", out, "--suite", suite, "--claims", claims]
    monkeypatch.setattr(verb, "JUDGE_S", 0.0)
    with monkeypatch.context() as patch:
        # a clock 1000x fast: every point overruns the minutes, however fast this machine is
        # (on a real clock a quiet machine can measure enough points to decide every claim
        # before the limit, and nothing is left to resume)
        patch.setattr(verb, "Deadline", lambda limit: Deadline(limit, clock=fast_clock))
        code, table, err = cli(capsys, *args, "--minutes", "0.001")
    assert code == 0, err
    rows = (out / "runs" / "tiny-verdicts" / "passes.jsonl").read_text().splitlines()
    assert 1 <= len(rows) < 6
    cut = line_of(table, "planted-memory-n2")
    assert " inconclusive " in cut and "not measured: " in cut
    assert "left out by the time limit" in err and "--resume --minutes M" in err
    code, text, err = cli(capsys, *args, "--minutes", "2", "--resume", "--json")
    assert code == 0, err
    by_id = {c["claim"]: c for c in json.loads(text)["claims"]}
    assert set(by_id) == {
        "planted-memory-n2",
        "planted-memory-n1",
        "planted-thin",
        "planted-other-device",
    }
    assert by_id["planted-memory-n2"]["verdict"] == "confirmed"
    assert by_id["planted-memory-n1"]["verdict"] == "refuted"


@pytest.mark.parametrize("value", ["0", "-1", "abc", "inf"])
def test_bad_minutes_are_one_line_exit_2(tmp_path, capsys, files, value):
    suite, _ = files
    code, _, err = cli(
        capsys, "verdicts", f"--minutes={value}", "--out", tmp_path / "v", "--suite", suite
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--minutes" in err
    assert not (tmp_path / "v").exists()


def test_an_unknown_suite_file_is_one_line_exit_2(tmp_path, capsys, files):
    code, _, err = cli(
        capsys,
        "verdicts",
        "--device",
        "cpu",
        "--out",
        tmp_path / "v",
        "--suite",
        tmp_path / "missing.toml",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "missing.toml" in err


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_each_device_measures_its_claim_suites_and_its_serving_suite(device):
    """The serving claims (suites/claims.toml's ragged-*, paged-*, padded-*) are decided by the
    decode-serving suite of the device, so ``verdicts`` measures it beside the claim suites."""
    names = {p.name for p in verb.suite_paths("cuda" if device == "gpu" else "cpu", [])}
    bundled = {p.name for p in SUITES_DIR.glob("*.toml")}
    claim_suites = {n for n in bundled if n.startswith("claims-") and device in n}
    assert claim_suites and claim_suites <= names
    assert f"decode-serving-{device}.toml" in names
    other = "cpu" if device == "gpu" else "gpu"
    assert not any(other in n for n in names)
