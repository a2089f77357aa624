"""The package structure, checked from the source: layers import only downwards, no import
cycles, no imports hidden in function bodies, small modules and functions.

The layers, lowest first (a module may import its own layer and those below it):

====  ================  =====================================================================
rank  package           what lives there
====  ================  =====================================================================
0     ``harness``       public core: errors, masks, spec, registry, results, schema, fmt,
                        markdown, dtypes
1     implementations   the attention implementations (plug-ins of the registry)
2     measure           devices and memory, timing, calibration, env, NVML, contention
3     sweep             what to run: suite files parsed into plain-data Points
4     cost              analytic FLOPs, bytes and memory of every scenario
5     model             the transformer block and KV caches the scenarios build
6     oracle            float64 reference, agreement rule and tolerance table
7     scenarios         Point -> timed Case
8     execute           the runner (passes, resume), process isolation, maxlen
9     analysis          frames, fits, claims, verdicts
10    compare           run vs baseline: thresholds, noise, findings, baselines
11    render            text and markdown tables, plots, panels, the HTML report
12    distributed       shards, launchers (ray, Slurm) and merging
13    cli               argparse for every verb
====  ================  =====================================================================
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = (
    "harness",
    "implementations",
    "harness.measure",
    "harness.sweep",
    "harness.cost",
    "harness.model",
    "harness.oracle",
    "harness.scenarios",
    "harness.execute",
    "harness.analysis",
    "harness.compare",
    "harness.render",
    "harness.distributed",
    "harness.cli",
)
# the only modules a function body may import: dependencies that may be absent
OPTIONAL = ("ray", "submitit", "xformers", "flash_attn", "triton", "pynvml", "fla")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 300, 60
WAIVER = "# size:"  # "# size: <why>" in a module's head or above a def waives its limit


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's two packages."""
    found = {}
    for package in ("harness", "implementations"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts).removesuffix(".__init__")
            found[name] = path
    return found


MODULES = modules()


def layer_of(module: str) -> int:
    """Rank of the deepest layer package that contains ``module``."""
    ranks = [i for i, pkg in enumerate(LAYERS) if module == pkg or module.startswith(pkg + ".")]
    return max(ranks)


def imported(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """Project modules an import statement names (``from pkg import mod`` names ``pkg.mod``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: resolve against this module's package
            package = module.rsplit(".", node.level)[0]
            base = f"{package}.{base}" if base else package
        names = [f"{base}.{a.name}" for a in node.names]
        names = [n if n in MODULES else base for n in names]
    return sorted({n for n in names if n in MODULES})


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {
            target
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for target in imported(node, name)
            if target != name
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_layer_table_names_real_packages():
    for package in LAYERS:
        assert package in MODULES, f"{package} is in LAYERS but is not a package"


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_layer_imports_a_higher_one():
    upward = [
        f"{src} ({LAYERS[layer_of(src)]}) imports {dst} ({LAYERS[layer_of(dst)]})"
        for src, targets in import_graph().items()
        for dst in sorted(targets)
        if layer_of(dst) > layer_of(src)
    ]
    assert upward == []


def test_no_imports_inside_functions_except_optional_dependencies():
    hidden = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    roots = [a.name.split(".")[0] for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    roots = [(node.module or "").split(".")[0] if not node.level else "."]
                else:
                    continue
                hidden += [f"{name}.{fn.name}: {r}" for r in roots if r not in OPTIONAL]
    assert sorted(set(hidden)) == []


def _waived(lines: list[str], at: int) -> bool:
    """Is there a ``# size:`` comment on the line above ``at`` (0-based), decorators skipped?"""
    i = at - 1
    while i >= 0 and lines[i].lstrip().startswith("@"):
        i -= 1
    return i >= 0 and lines[i].strip().startswith(WAIVER)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_and_functions_are_small(name):
    text = MODULES[name].read_text()
    lines = text.splitlines()
    if len(lines) > MAX_MODULE_LINES:
        assert any(line.startswith(WAIVER) for line in lines[:40]), (
            f"{len(lines)} lines > {MAX_MODULE_LINES}: split it, or say why in a '{WAIVER}' line"
        )
    long = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = node.end_lineno - first + 1
            if length > MAX_FUNCTION_LINES and not _waived(lines, first - 1):
                long.append(f"{node.name} ({length} lines)")
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: {long}"
