"""``--plugin`` on every verb that reads rows, and the plug-ins a run recorded in env.json: a
plug-in's rows judged without ``--plugin`` give the verdicts they give with it (the recorded
file, unchanged, is loaded and said), a changed or missing file is one warning line, never a
silent difference; a claims file with a typo is one line and exit 2 with "did you mean"."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import plugins, registry
from harness.cli import build_parser, main
from harness.results import load_env
from tests.conftest import calibrated_cli_argv

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

PLUGIN = """
import torch
from harness.registry import register
from harness.spec import Capabilities, Cost

@register("tiny-plugged", family="test", caps=Capabilities(devices={"cpu"}), cost=Cost(2, 1))
def attention(q, k, v, mask, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=mask.causal)
"""
SUITE = """
name = "tiny-plugged"
scenario = "attention"
implementations = ["tiny-plugged"]
device = "cpu"
[fixed]
batch = 1
heads = 2
head_dim = 16
[sweep]
seq_len = [64, 128, 256]
[measure]
threads = 1
"""
CLAIMS = """
[[claim]]
id = "tiny-time-n2"
impl = "tiny-plugged"
metric = "time_median_s"
over = "seq_len"
expect_exponent = 2
"""


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    """Each test loads plug-ins into a copy of the registry and of the loaded-files memory."""
    registry.names()
    for module, name in (
        (registry, "_REGISTRY"),
        (registry, "_ORIGINS"),
        (registry, "_CONTRACT"),
        (plugins, "_LOADED"),
        (plugins, "_DIGESTS"),
    ):
        monkeypatch.setattr(module, name, dict(getattr(module, name)))
    # set, then removed: monkeypatch then restores the variable's absence after the test,
    # when the run under test set it (a --plugin run does, for its child processes)
    monkeypatch.setenv(plugins.PLUGINS_ENV, "")
    monkeypatch.delenv(plugins.PLUGINS_ENV)


@pytest.fixture(scope="module")
def plugged_run(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(run directory, plug-in file, claims file): a real run of the plug-in, made in a child
    process so this one's registry never holds it."""
    folder = tmp_path_factory.mktemp("plugged")
    plugin, suite, claims = folder / "tiny.py", folder / "tiny.toml", folder / "claims.toml"
    plugin.write_text(PLUGIN)
    suite.write_text(SUITE)
    claims.write_text(CLAIMS)
    run = folder / "run"
    done = subprocess.run(
        calibrated_cli_argv(
            "run",
            str(suite),
            "--plugin",
            str(plugin),
            "--out",
            str(run),
            "--passes",
            "1",
            "--budget-s",
            "0.01",
            "--no-progress",
            "--no-table",
        ),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ATTNBENCH_PLUGINS": ""},
    )
    assert done.returncode == 0, done.stderr
    return run, plugin, claims


def cli(capsys, *args) -> tuple[int, str, list[str]]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


def verdicts(out: str) -> list[dict]:
    return json.loads(out)


def test_a_run_records_the_plugin_files_it_loaded(plugged_run) -> None:
    run, plugin, _ = plugged_run
    (record,) = load_env(run)["plugins"]
    assert record["path"] == str(plugin.resolve())
    assert record["sha256"] == plugins.file_digest(plugin)
    assert record["implementations"] == ["tiny-plugged"]


def test_claims_without_plugin_load_the_recorded_file_and_judge_the_same(
    plugged_run, capsys
) -> None:
    run, plugin, claims = plugged_run
    code, with_plugin, err = cli(
        capsys, "claims", run, "--claims", claims, "--json", "--plugin", plugin
    )
    assert code == 0 and not [line for line in err if "not registered" in line], err
    registry._REGISTRY.pop("tiny-plugged")  # as in a fresh process without --plugin
    plugins._LOADED.clear()
    code, without, err = cli(capsys, "claims", run, "--claims", claims, "--json")
    assert code == 0, err
    said = [line for line in err if "not registered" in line]
    assert len(said) == 1 and "unchanged since the run: loaded" in said[0]
    assert str(plugin.resolve()) in said[0]
    assert verdicts(without) == verdicts(with_plugin)
    assert verdicts(without)[0]["work_verdict"] is not None  # the cost model was used


def test_a_changed_plugin_file_is_said_in_one_line_and_not_loaded(
    plugged_run, tmp_path, capsys
) -> None:
    run, _, claims = plugged_run
    moved = tmp_path / "run"
    shutil.copytree(run, moved)
    env = json.loads((moved / "env.json").read_text())
    changed = tmp_path / "tiny.py"
    changed.write_text(PLUGIN + "# edited since the run\n")
    env["plugins"][0]["path"] = str(changed)
    (moved / "env.json").write_text(json.dumps(env))
    code, _, err = cli(capsys, "claims", moved, "--claims", claims)
    said = [line for line in err if "not registered" in line]
    assert code == 0 and len(said) == 1, err
    assert "has changed since the run" in said[0] and "not loaded" in said[0]
    assert f"--plugin {changed}" in said[0]
    assert "tiny-plugged" not in registry.names()
    changed.unlink()
    code, _, err = cli(capsys, "table", moved)
    said = [line for line in err if "not registered" in line]
    assert code == 0 and len(said) == 1 and "no longer exists" in said[0], err


@pytest.mark.parametrize(
    "argv",
    [
        ["list"],
        ["run", "--dry-run"],
        ["table", "RUN"],
        ["claims", "RUN"],
        ["report", "RUN", "--out", "OUT"],
        ["compare", "RUN", "RUN"],
        ["maxlen", "sdpa"],
    ],
)
def test_every_verb_that_reads_rows_takes_plugin(argv: list[str]) -> None:
    args = build_parser(argv[0]).parse_args([*argv, "--plugin", "a.py", "--plugin", "b.py"])
    assert args.plugin == [Path("a.py"), Path("b.py")]


def test_table_and_list_load_the_plugin_given(plugged_run, capsys) -> None:
    run, plugin, _ = plugged_run
    code, out, err = cli(capsys, "table", run, "--plugin", plugin)
    assert code == 0 and "tiny-plugged" in out and not err, err
    code, out, _ = cli(capsys, "list", "--plugin", plugin)
    assert code == 0 and "tiny-plugged" in out


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            'metric = "time_median_s"',
            'metric = "time_median"',
            "metric = 'time_median': no row schema has this column; did you mean 'time_median_s'?",
        ),
        (
            'impl = "tiny-plugged"',
            'impl = "tiny-pluged"',
            "impl = 'tiny-pluged': no registered implementation and no row has this name; "
            "did you mean 'tiny-plugged'?",
        ),
    ],
)
def test_a_claims_typo_is_one_line_and_exit_2(
    plugged_run, tmp_path, capsys, old, new, said
) -> None:
    run, plugin, claims = plugged_run
    typo = tmp_path / "typo.toml"
    typo.write_text(claims.read_text().replace(old, new))
    for verb in (["claims", run], ["report", run, "--out", tmp_path / "report"]):
        code, _, err = cli(capsys, *verb, "--claims", typo, "--plugin", plugin)
        assert code == 2 and len(err) == 1 and said in err[0], err
        assert str(typo) in err[0]
