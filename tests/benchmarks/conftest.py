"""pytest-benchmark benchmarks of the registered implementations: opt-in only.

The plain ``pytest`` run (pyproject's addopts pass ``--benchmark-disable``) skips every test
here that takes the ``benchmark`` fixture, so a failed ``--benchmark-compare-fail`` (which ends
in a traceback and no "N passed" line) can never leak into it; the tests of the benchmark
scripts themselves (``test_gpu_scripts.py``) are ordinary tests and run. Run the benchmarks
with ``--benchmark-enable`` (plus ``--benchmark-only`` to run nothing else), or set
``ATTNBENCH_BENCHMARKS=1`` (then, under ``--benchmark-disable``, each runs once: a functional
check). See docs/pytest-benchmark.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent.resolve()
ENV_SWITCH = "ATTNBENCH_BENCHMARKS"
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
    for item in items:  # this hook sees the whole session's items: touch only ours, and of
        # ours only the timed ones (the scripts' own tests are ordinary tests)
        timed = "benchmark" in getattr(item, "fixturenames", ())
        if timed and HERE in Path(item.path).resolve().parents:
            item.add_marker(skip)
