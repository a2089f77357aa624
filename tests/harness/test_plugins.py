"""Plug-ins from one file (``--plugin FILE``, ``ATTNBENCH_PLUGINS``): the bundled example runs
first time; every mistake is one line and exit 2; the ``reference=`` contract is checked once,
when the file is loaded."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from harness import plugins, registry
from harness.cli import main

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "elu_linear.py"
EXAMPLE_SUITE = ROOT / "docs" / "examples" / "elu_linear.toml"

HEADER = """
import torch
from harness.registry import register
from harness.spec import Capabilities, Cost
"""
EXACT = HEADER + """
@register({name!r}, family="test", caps=Capabilities(devices={{"cpu"}}), cost=Cost(2, 1))
def attention(q, k, v, mask, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=mask.causal)
"""
APPROX = HEADER + """
def reference(q, k, v, mask{rows}):
    w = (q{cast} @ k{cast}.transpose(-1, -2)).relu() + 1
    return (w / w.sum(-1, keepdim=True)) @ v{cast}

@register("relu-attn", family="test", caps=Capabilities(devices={{"cpu"}}, mask_features=set()),
          cost=Cost(2, 2), reference=reference)
def relu_attention(q, k, v, mask, scale=None):
    return reference(q, k, v, mask)
"""


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    """Each test loads plug-ins into a copy of the registry and of the loaded-files memory."""
    registry.names()  # the built-ins first
    for module, name in ((registry, "_REGISTRY"), (registry, "_ORIGINS"),
                         (registry, "_CONTRACT"), (plugins, "_LOADED"),
                         (plugins, "_DIGESTS")):
        monkeypatch.setattr(module, name, dict(getattr(module, name)))
    # set, then removed: monkeypatch then restores the variable's absence after the test,
    # when the run under test set it (a --plugin run does, for its child processes)
    monkeypatch.setenv(plugins.PLUGINS_ENV, "")
    monkeypatch.delenv(plugins.PLUGINS_ENV)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run_cli(capsys, *args: object) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err.strip().splitlines()


def test_the_readme_example_registers_and_keeps_the_contract() -> None:
    assert registry.load_plugins([EXAMPLE]) == ["elu-linear"]
    impl = registry.get("elu-linear")
    assert impl.approximate and registry.reference_contract(impl) is None
    assert len(EXAMPLE.read_text().splitlines()) <= 30
    # the contract it teaches: reference(q, k, v, mask, rows=None, **params)
    kinds = [p.kind for p in inspect.signature(impl.reference).parameters.values()]
    assert kinds[-1] is inspect.Parameter.VAR_KEYWORD


def test_the_readme_example_runs_first_time(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    code, err = run_cli(capsys, "run", EXAMPLE_SUITE, "--plugin", EXAMPLE, "--out", out,
                        "--passes", "1", "--budget-s", "0.02", "--no-progress", "--no-table")
    assert code == 0, err
    assert "4 ok" in err[-1]  # elu-linear and sdpa at two sizes, all agreeing


@pytest.mark.parametrize(("text", "message"), [
    (None, "no such file"),
    ("def broken(:\n    pass\n", "syntax error at line 1"),
    ("x = 1\n", "registers no implementation"),
    ("raise RuntimeError('needs a GPU')\n", "RuntimeError: needs a GPU"),
])
def test_a_bad_file_is_one_line_and_exit_2(tmp_path: Path, capsys, text, message) -> None:
    path = tmp_path / "plugin.py"
    if text is not None:
        path.write_text(text)
    code, err = run_cli(capsys, "run", "--plugin", path, "--out", tmp_path / "out")
    assert code == 2 and len(err) == 1
    assert str(path) in err[0] and message in err[0]
    assert not (tmp_path / "out").exists()  # refused before any work


def test_two_files_registering_one_name_are_both_named(tmp_path: Path, capsys) -> None:
    first = write(tmp_path, "first.py", EXACT.format(name="twin"))
    second = write(tmp_path, "second.py", EXACT.format(name="twin"))
    code, err = run_cli(capsys, "run", "--plugin", first, "--plugin", second)
    assert code == 2 and len(err) == 1
    assert "registered twice" in err[0] and str(first) in err[0] and str(second) in err[0]


def test_a_builtin_name_taken_again_names_the_builtin(tmp_path: Path, capsys) -> None:
    clash = write(tmp_path, "clash.py", EXACT.format(name="sdpa"))
    code, err = run_cli(capsys, "run", "--plugin", clash)
    assert code == 2 and len(err) == 1 and "implementations/" in err[0] and str(clash) in err[0]


def test_a_reference_without_rows_is_refused_at_registration(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, "norows.py", APPROX.format(rows="", cast=""))
    code, err = run_cli(capsys, "run", "--plugin", path)
    assert code == 2 and len(err) == 1 and "must accept rows=" in err[0]


def test_a_reference_that_casts_to_float64_is_told_once(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, "cast.py", APPROX.format(rows=", rows=None", cast=".double()"))
    code, err = run_cli(capsys, "run", "--plugin", path)
    assert code == 2 and len(err) == 1
    assert "relu-attn" in err[0] and "torch.float64 for float32 inputs" in err[0]
    assert "in its inputs' dtype" in err[0]


def test_a_reference_that_ignores_rows_is_told(tmp_path: Path) -> None:
    path = write(tmp_path, "ignores.py", APPROX.format(rows=", rows=None", cast=""))
    wanted = r"\(1, 2, 16, 16\) \(rows=\[0, 7, 15\]\); want .* len\(rows\)"
    with pytest.raises(plugins.PluginError, match=wanted):
        registry.load_plugins([path])


def test_the_environment_variable_loads_plugins_for_every_command(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    path = write(tmp_path, "env_plugin.py", EXACT.format(name="from-env"))
    monkeypatch.setenv(plugins.PLUGINS_ENV, str(path))
    monkeypatch.setattr(registry, "_loaded", False)
    code = main(["list"])
    assert code == 0 and "from-env" in capsys.readouterr().out


def test_loaded_files_are_passed_on_to_child_processes(tmp_path: Path) -> None:
    path = write(tmp_path, "child.py", EXACT.format(name="for-children"))
    registry.load_plugins([path])
    assert plugins.env_files() == [path.resolve()]
    assert registry.load_plugins([path]) == ["for-children"]  # loaded once, not twice
