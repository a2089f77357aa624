"""``attnbench claims`` (and ``report``, ``table``) as a user meets them on real runs: a run of
each implementation family alone, several run directories with one unusable, the listing with
the claims without rows folded.

``data/families/<family>/`` are tiny CPU runs made with ``attnbench run`` (2 heads, head_dim 16,
n = 64..256) of one family each: local (windows 16 and 32), decode (full and no cache), block
(sdpa, lstm and conv mixers), linear (linear, performer, linformer, nystrom); their per-call
sample lists were dropped to keep them small (optional columns: the fits use the stored
intervals).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.cli.claims import SKIPPED

FAMILIES = Path(__file__).parent / "data" / "families"
VERDICTS = {"confirmed", "refuted", "mixed", "holds in part", "inconclusive"}


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("family", ["local", "decode", "block", "linear"])
def test_every_analysis_command_reads_a_run_of_one_family_alone(family, tmp_path, capsys):
    """A run of one family has none of the others' optional columns (no ``document_len``
    without packed documents: the claims over it once stopped with a KeyError)."""
    run = FAMILIES / family
    code, out, err = cli(capsys, "claims", run, "--json")
    assert code == 0, err
    verdicts = json.loads(out)
    assert {v["verdict"] for v in verdicts} <= VERDICTS and "internal error" not in err
    assert sum(v["rows_seen"] > 0 for v in verdicts) > 0 or family == "linear"
    packing = {v["claim"]: v for v in verdicts if v["over"] == "document_len"}
    assert all(v["rows_seen"] == 0 for v in packing.values())
    if family == "local":  # the packing claims are about local rows with documents
        assert packing["packing-causal-time-l1"]["reason"] == (
            "missing rows: the 6 impl=local, scenario=attention, causal=True rows have no "
            "document_len")
    code, out, err = cli(capsys, "claims", run)
    assert code == 0 and "these runs do not have (inconclusive: missing rows)" in out, err
    code, out, err = cli(capsys, "table", run)
    assert code == 0 and "median time (ms)" in out, err
    code, out, err = cli(capsys, "report", run, "--out", tmp_path / "report")
    assert code == 0, err
    assert "## Claims" in (tmp_path / "report" / "report.md").read_text()


def test_a_folder_without_rows_is_skipped_and_the_exit_status_says_so(tmp_path, capsys):
    crashed = tmp_path / "crashed"  # a run that died on its first point: env.json, no rows
    crashed.mkdir()
    shutil.copy(FAMILIES / "local" / "env.json", crashed / "env.json")
    no_env = tmp_path / "no-env"
    no_env.mkdir()
    shutil.copy(FAMILIES / "decode" / "rows.jsonl", no_env / "rows.jsonl")
    code, out, err = cli(capsys, "claims", crashed, FAMILIES / "local", no_env, "--json")
    assert code == SKIPPED == 3
    lines = err.strip().splitlines()
    assert lines[0] == f"attnbench: warning: {crashed}: skipped: {crashed}/rows.jsonl: no such " \
        "results file"
    assert lines[1].startswith(f"attnbench: warning: {no_env}: skipped: no env.json")
    judged = {v["claim"]: v for v in json.loads(out)}
    assert judged["local-memory-n1"]["rows_seen"] == 6  # the good run was judged
    assert judged["kv-cache-step-n1"]["rows_seen"] == 0  # the skipped decode rows were not
    code, out, err = cli(capsys, "claims", FAMILIES / "local")
    assert code == 0
    code, out, err = cli(capsys, "report", crashed, FAMILIES / "local", "--out", tmp_path / "r")
    assert code == SKIPPED and err.startswith(f"attnbench: warning: {crashed}: skipped:"), err
    assert "## Claims" in (tmp_path / "r" / "report.md").read_text()
    code, _, err = cli(capsys, "report", crashed, "--out", tmp_path / "r2")
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "r2" / "report.md").exists()


def test_nothing_left_to_judge_is_exit_2_in_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = cli(capsys, "claims", empty, tmp_path / "nowhere")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("attnbench: nothing to judge: every run")
    code, _, err = cli(capsys, "claims", empty)
    assert code == 2 and err == f"attnbench: {empty}: skipped: {empty}/rows.jsonl: no such " \
        "results file\n"


def test_claims_without_rows_are_folded_and_listed_with_all(capsys):
    code, out, _ = cli(capsys, "claims", FAMILIES / "local")
    assert code == 0
    folded = [line for line in out.splitlines()
              if "these runs do not have (inconclusive: missing rows)" in line]
    assert len(folded) == 1 and "flash-time-n2" in folded[0] and "--all lists them" in folded[0]
    assert not any(line.startswith("flash-time-n2") for line in out.splitlines())
    assert out.splitlines()[0].startswith("local-time-n1")
    code, everything, _ = cli(capsys, "claims", FAMILIES / "local", "--all")
    assert code == 0 and "these runs do not have (inconclusive: missing rows)" not in everything
    assert any(line.startswith("flash-time-n2 ") for line in everything.splitlines())
    assert everything.count("missing rows") >= 30
