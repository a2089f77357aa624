"""pytest-benchmark benchmarks of the registered implementations: opt-in only.

The plain ``pytest`` run (pyproject's addopts pass ``--benchmark-disable``) skips everything
here, so a failed ``--benchmark-compare-fail`` (which ends in a traceback and no "N passed"
line) can never leak into it. Run them with ``--benchmark-enable`` (plus ``--benchmark-only``
to run nothing else), or set ``ATTNBENCH_BENCHMARKS=1`` (then, under ``--benchmark-disable``,
each runs once: a functional check). See docs/pytest-benchmark.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent.resolve()
ENV_SWITCH = "ATTNBENCH_BENCHMARKS"
# checks of benchmark scripts at tiny CPU sizes, not benchmarks: they run by default
SCRIPT_CHECKS = {"test_linear_scripts.py"}


def benchmarks_enabled(config: pytest.Config) -> bool:
    """True when the user asked for benchmarks (a pytest-benchmark flag or the env switch)."""
    if not config.pluginmanager.hasplugin("benchmark"):
        return False
    if os.environ.get(ENV_SWITCH, "") not in ("", "0"):
        return True
    option = lambda name: bool(config.getoption(name, default=False))
    return option("benchmark_only") or option("benchmark_enable") or not option("benchmark_disable")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if benchmarks_enabled(config):
        return
    skip = pytest.mark.skip(reason=f"benchmarks: pass --benchmark-enable (or set {ENV_SWITCH}=1)")
    for item in items:  # this hook sees the whole session's items: touch only ours
        path = Path(item.path).resolve()
        if HERE in path.parents and path.name not in SCRIPT_CHECKS:
            item.add_marker(skip)
