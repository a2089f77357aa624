"""The warmed-cache tools a CUDA verdicts session loads by path are where it looks for them."""

from __future__ import annotations

from harness.execute import kernel_cache


def test_the_cache_tools_are_where_the_session_loads_them():
    """In a checkout, both tools load (a move of benchmarks/ that the session did not follow
    would make every CUDA session compile uncounted, saying only that the tools are absent)."""
    tools = kernel_cache._load(kernel_cache.TOOLS / "triton_cache.py", "_test_triton_cache")
    misses = kernel_cache._load(kernel_cache.TOOLS / "triton_listen" / "triton_misses.py",
                                "_test_triton_misses")
    assert tools is not None and misses is not None
    assert callable(tools.install) and callable(misses.record)
