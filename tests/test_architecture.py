"""The package structure, checked from the source: every package imports only the packages
its row of :data:`ALLOWED_IMPORTS` names, that table has no cycle, no module cycle exists, and
no import hides in a function body. Module and function sizes are reported, not limited: code
is split by meaning, not by line count (``python tests/test_architecture.py`` prints the
largest).

A module belongs to the most specific key of the table that contains it (``harness.schema`` is
its own row; ``harness.masks`` is in the ``harness`` core).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# fmt: off
# package -> the packages its modules may import (besides itself)
ALLOWED_IMPORTS: dict[str, set[str]] = {
    # the mask's geometry, one module per feature: below everything, even the public core
    "harness.mask_features": set(),
    # public core: errors, dtypes, masks, spec, registry, columns, fmt, markdown
    "harness": {"harness.mask_features"},
    # the attention implementations (plug-ins of the registry)
    "implementations": {"harness"},
    # devices and memory, timing, calibration, env, NVML, contention
    "harness.measure": {"harness"},
    # the shared cost formulas every scenario's cost model adds up
    "harness.cost": {"harness"},
    # the transformer block the block and decode scenarios time
    "harness.model": {"harness"},
    # float64 reference, agreement rule and tolerance table
    "harness.oracle": {"harness"},
    # Point, the Scenario interface, one folder per scenario
    "harness.scenarios": {"harness", "harness.measure", "harness.cost", "harness.model",
                          "harness.oracle"},
    # every row column, the scenarios' included (their folders' light declarations)
    "harness.schema": {"harness", "harness.scenarios"},
    # run directories: rows.jsonl and env.json
    "harness.results": {"harness", "harness.schema"},
    # what to run: suite files parsed into points
    "harness.sweep": {"harness", "harness.measure", "harness.scenarios"},
    # the runner (passes, resume), process isolation, maxlen
    "harness.execute": {"harness", "harness.measure", "harness.cost", "harness.scenarios",
                        "harness.schema", "harness.results", "harness.sweep"},
    # frames, fits, claims, verdicts
    "harness.analysis": {"harness", "harness.measure", "harness.cost", "harness.scenarios",
                         "harness.schema", "harness.results"},
    # run vs baseline: thresholds, noise, findings, baselines
    "harness.compare": {"harness", "harness.measure", "harness.cost", "harness.scenarios",
                        "harness.schema", "harness.results", "harness.analysis"},
    # text and markdown tables, plots, panels, the HTML report
    "harness.render": {"harness", "harness.measure", "harness.cost", "harness.scenarios",
                       "harness.schema", "harness.results", "harness.analysis",
                       "harness.compare"},
    # shards, launchers (ray, Slurm) and merging
    "harness.distributed": {"harness", "harness.measure", "harness.scenarios", "harness.schema",
                            "harness.results", "harness.sweep", "harness.execute"},
    # argparse for every verb
    "harness.cli": {"harness", "harness.measure", "harness.cost", "harness.scenarios",
                    "harness.schema", "harness.results", "harness.sweep", "harness.execute",
                    "harness.analysis", "harness.compare", "harness.render",
                    "harness.distributed"},
}
# fmt: on
# the mask features are the public core's geometry: whoever may import the core may import them
for _allowed in ALLOWED_IMPORTS.values():
    if "harness" in _allowed:
        _allowed.add("harness.mask_features")
# the only modules a function body may import: dependencies that may be absent
OPTIONAL = ("ray", "submitit", "xformers", "flash_attn", "triton", "pynvml", "fla", "flashinfer")
# torch modules that pull in torch._dynamo (3.8 s of `attnbench list` on the H100 of
# 2026-11-26): imported where a causal bias or a FlexAttention mask is made, not at load
DEFERRED = (
    "torch.nn.attention.bias",
    "torch.nn.attention.flex_attention",
    "torch.nn.attention.experimental._paged_attention",
    "torch.nn.attention.varlen",  # varlen-attn's kernel: imported at its first CUDA call
)
REPORTED = 12  # how many of the largest modules and functions the size report lists


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


def package_of(module: str) -> str:
    """The most specific key of ALLOWED_IMPORTS that contains ``module``."""
    keys = [k for k in ALLOWED_IMPORTS if module == k or module.startswith(k + ".")]
    return max(keys, key=len)


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


def test_the_table_names_real_packages_and_every_package_has_a_row():
    for package in ALLOWED_IMPORTS:
        assert package in MODULES, f"{package} is in ALLOWED_IMPORTS but is not a module"
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    missing = {p for p in packages if p.startswith("harness.") and p.count(".") == 1} - set(
        ALLOWED_IMPORTS
    )
    assert missing == set(), f"packages without a row in ALLOWED_IMPORTS: {sorted(missing)}"


def test_the_allowed_imports_have_no_cycle():
    graph = {k: set(v) for k, v in ALLOWED_IMPORTS.items()}
    assert cycles(graph) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_every_package_imports_only_what_its_row_allows():
    forbidden = [
        f"{src} ({package_of(src)}) imports {dst} ({package_of(dst)})"
        for src, targets in import_graph().items()
        for dst in sorted(targets)
        if package_of(dst) != package_of(src)
        and package_of(dst) not in ALLOWED_IMPORTS[package_of(src)]
    ]
    assert forbidden == []


def test_no_imports_inside_functions_except_optional_dependencies():
    hidden = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    roots = [a.name.split(".")[0] for a in node.names if a.name not in DEFERRED]
                elif isinstance(node, ast.ImportFrom):
                    if node.module in DEFERRED:
                        continue
                    roots = [(node.module or "").split(".")[0] if not node.level else "."]
                else:
                    continue
                hidden += [f"{name}.{fn.name}: {r}" for r in roots if r not in OPTIONAL]
    assert sorted(set(hidden)) == []


def sizes() -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(module lines, module), (function lines, module.function), each largest first."""
    mods, funcs = [], []
    for name, path in MODULES.items():
        text = path.read_text()
        mods.append((len(text.splitlines()), name))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                funcs.append((node.end_lineno - first + 1, f"{name}.{node.name}"))
    return sorted(mods, reverse=True), sorted(funcs, reverse=True)


def size_report(count: int = REPORTED) -> str:
    """The largest modules and functions, for a reader deciding what to split by meaning."""
    mods, funcs = sizes()
    lines = [f"largest modules (of {len(mods)}):"]
    lines += [f"  {n:5d}  {name}" for n, name in mods[:count]]
    lines += [f"largest functions (of {len(funcs)}):"]
    lines += [f"  {n:5d}  {name}" for n, name in funcs[:count]]
    return "\n".join(lines)


def test_the_size_report_counts_every_module(capsys):
    mods, funcs = sizes()
    assert {name for _, name in mods} == set(MODULES)
    assert [n for n, _ in mods] == sorted((n for n, _ in mods), reverse=True)
    assert max(funcs)[0] >= 1
    print("\n" + size_report())  # shown with pytest -s; not a limit



SHORTEST = 40  # lines: a module shorter than this holds a piece of some other module's job


def test_no_module_is_a_fragment():
    """Split by meaning, not by line count: no module under 40 lines except package files
    (``__init__``, ``__main__``), errors.py, the exceptions every layer raises, and the mask
    features (one clause of the mask each, attention-gym style: a feature is a module however
    short, so that adding one is adding a file)."""
    short = [
        (name, n)
        for n, name in sizes()[0]
        if n < SHORTEST
        and MODULES[name].stem not in ("__init__", "__main__", "errors")
        and not name.startswith("harness.mask_features.")
    ]
    assert not short, f"modules under {SHORTEST} lines: {short}"


def test_module_names_say_one_job_each():
    """Outside cli/ (one module per verb) no two modules share a name."""
    stems: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        if path.stem.startswith("__") or ".cli." in f".{name}.":
            continue
        stems.setdefault(path.stem, []).append(name)
    assert not {s: n for s, n in stems.items() if len(n) > 1}


def test_the_tests_mirror_the_package_tree():
    """tests/harness and tests/implementations follow the code: every folder is a package of
    the code (besides test data and the toy scenario a test installs), and a test file directly
    under a package's folder tests a module of that package."""
    for package in ("harness", "implementations"):
        for folder in sorted((ROOT / "tests" / package).rglob("*")):
            relative = folder.relative_to(ROOT / "tests")
            if not folder.is_dir() or {"data", "toy_scenario", "__pycache__"} & set(relative.parts):
                continue
            assert (ROOT / relative / "__init__.py").is_file(), f"tests/{relative}: no such package"
    for test in (ROOT / "tests" / "harness").glob("test_*.py"):
        module = test.stem.removeprefix("test_")
        assert (ROOT / "harness" / f"{module}.py").is_file(), f"{test.name}: no harness/{module}.py"

if __name__ == "__main__":
    print(size_report())
