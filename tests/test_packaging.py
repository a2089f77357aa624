"""The wheel a user installs carries the bundled suites and claims.toml, and an installed
attnbench finds them through importlib.resources (not through the checkout). CI (.ci/run)
installs the wheel into a fresh venv and runs ``attnbench run`` and ``attnbench claims``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out, source = tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("src") / "attnbench"
    # a copy of what the build reads, so the build's own folders stay out of the checkout
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", ".venv")
    for name in ("harness", "implementations", "suites"):
        shutil.copytree(ROOT / name, source / name, ignore=skip)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(source)],
        check=True, capture_output=True, cwd=out,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    (path,) = out.glob("attnbench-*.whl")
    return path


def test_the_wheel_ships_every_bundled_suite_and_the_claims(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    bundled = {f"harness/suites/{p.name}" for p in (ROOT / "suites").glob("*.toml")}
    assert {"harness/suites/smoke.toml", "harness/suites/claims.toml"} <= bundled <= names
    assert not any(n.startswith("suites/") for n in names)  # no top-level "suites" package


def test_the_wheel_ships_every_module_of_the_code(wheel: Path) -> None:
    """Every module of harness/ and implementations/ is in the wheel: a subpackage that
    setup.py's ``find_packages`` misses (no ``__init__.py``) would import from a checkout and
    fail from an install (the kernel families' folders, implementations/_kernels/*/)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    code = {
        path.relative_to(ROOT).as_posix()
        for package in ("harness", "implementations")
        for path in (ROOT / package).rglob("*.py")
    }
    assert "implementations/_kernels/triton/masked_attention.py" in code
    assert sorted(code - names) == []


def test_an_installed_attnbench_reads_its_own_copies(wheel: Path, tmp_path: Path) -> None:
    """The wheel unpacked as pip installs it, imported from elsewhere: the default suite and
    claims come from the installed package, and they parse."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import harness, harness.cli.run as run, harness.analysis.claims as claims\n"
        "from harness.sweep.suite import load_suite\n"
        "print(harness.__file__); print(run.default_suite()); print(claims.DEFAULT_CLAIMS)\n"
        "suite = load_suite(run.default_suite())\n"
        "judged = claims.load_claims(claims.DEFAULT_CLAIMS)\n"
        "print(len(suite.points), len(judged))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    package, suite, claims, counts = result.stdout.strip().splitlines()
    for path in (package, suite, claims):
        assert Path(path).is_relative_to(site), path
    assert suite.endswith("harness/suites/smoke.toml")
    assert claims.endswith("harness/suites/claims.toml")
    points, judged = map(int, counts.split())
    assert points == 48 and judged > 0


def test_the_readme_gives_a_newcomer_two_commands_and_ci_runs_the_second() -> None:
    """README's first section: one command installs and runs the main job, one installs and
    runs the tests, and .ci/run installs and tests exactly so (the commands stay true)."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Two commands on a fresh machine")
    section = readme[start : readme.index("\n#", start + 1)]
    commands = re.findall(r"```sh\n(.*?)\n```", section, re.S)
    assert len(commands) == 2, commands
    main_job, tests = commands
    assert main_job.startswith("python3 -m venv .venv && ") and main_job.endswith(
        ".venv/bin/attnbench run")
    pytest_command = tests.split(" && ")[-1]
    assert pytest_command.startswith(".venv/bin/python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    install = tests.split(" && ")[1]
    assert f"\n{install.replace(' torch', ' -q torch', 1)}\n" in ci
    assert f"\n{pytest_command.replace(' pytest', ' pytest -q', 1)}\n" in ci
    assert "ETA" in section and "minutes on 2 cores" in section


def test_the_readme_gate_recipe_is_what_ci_runs() -> None:
    """README's three-line CI recipe and .ci/run gate alike: plain ``compare`` (no --time-gate,
    no --confirm), the same arguments after ``compare`` and after ``run --out``."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("**Regression gate.**")
    recipe = re.search(r"```sh\n(.*?)\n```", readme[start:], re.S).group(1).splitlines()
    assert len(recipe) == 3
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for word in ("run --out", "compare"):
        (ours,) = [line for line in recipe if f"attnbench {word}" in line]
        theirs = [line for line in ci if f'"$AB" {word}' in line and "run2" not in line]
        tail = ours.split(f"attnbench {word}", 1)[1].split("#")[0].strip()
        assert theirs and all(tail in line for line in theirs), (ours, theirs)
    gate = " ".join(line for line in ci if '"$AB" compare' in line)
    assert "--time-gate" not in gate and "--confirm" not in gate and "--strict" not in gate


def test_the_readme_examples_run_as_typed_without_an_activated_venv() -> None:
    """The 30-second example names the venv's attnbench: typed after the set-up command (which
    does not activate the venv), every line finds it."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## 30-second example")
    block = re.search(r"```sh\n(.*?)\n```", readme[start:], re.S).group(1)
    assert all(line.startswith(".venv/bin/attnbench ") for line in block.splitlines())


def test_the_readme_error_example_is_the_real_message() -> None:
    """README's direct-call example prints, in its comment, the error the call really raises
    (a comment that drifted from the message misleads whoever searches for it)."""
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)\n```", readme, re.S)
                 if "NotSupportedError" in b)
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# harness.registry."))
    said = " ".join(line.removeprefix("# ") for line in lines[start:])
    namespace: dict = {}
    exec("\n".join(lines[: start - 1]), namespace)
    try:
        exec(lines[start - 1], namespace)
    except Exception as exc:  # the call the comment is about
        raised = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    else:
        raised = "no error"
    assert said == raised
