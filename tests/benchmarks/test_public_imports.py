"""The benchmark scripts and the lease's tools reach the implementations through public names
only: no module or name that starts with ``_`` (the kernels through
:mod:`implementations.triton_kernels`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted([*BENCHMARKS.glob("*.py"), *(ROOT / "lease").rglob("*.py")])  # and the lease's


def private_imports(path: Path) -> list[str]:
    """``path``'s imports from harness/ or implementations/ that name a ``_``-private module
    or name, as ``line: what``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(a.name for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        if names[0].split(".")[0] not in ("harness", "implementations"):
            continue
        parts = [p for name in names for p in name.split(".")]
        out += [f"{node.lineno}: {p}" for p in parts if p.startswith("_") and p != "__future__"]
    return out


def test_the_rule_sees_a_private_import(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text("import os\nfrom implementations._flex_masks import BLOCK\n"
                      "from implementations.triton_kernels import _hidden\n")
    assert private_imports(script) == ["2: _flex_masks", "3: _hidden"]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_imports_no_private_name(path: Path) -> None:
    assert private_imports(path) == []


def test_the_public_face_lists_modules_that_exist() -> None:
    from implementations import triton_kernels

    folder = Path(triton_kernels.__file__).parent / "_kernels" / "triton"
    for name in (*triton_kernels.MODULES, *triton_kernels.JIT_MODULES):
        assert (folder / f"{name}.py").is_file(), name
