"""Analytic KV-cache size of a decode point: the formula the measured cache bytes are checked
against (:func:`harness.model.kvcache.cache_nbytes` measures the tensors themselves).

A layer's cache holds K and V, each (B, H_kv, slots, D): slots = seq_len + gen_tokens for a
``full`` cache, at most the window for a ``rolling`` one, none without a cache.
"""

from __future__ import annotations

from harness.cost.components import kv_dim
from harness.dtypes import itemsize


def cache_slots(cache: str, seq_len: int, gen_tokens: int, window: int | None) -> int:
    """Positions a layer's cache holds: context + generated tokens (full), at most ``window``
    (rolling), none without a cache."""
    if cache == "none":
        return 0
    capacity = seq_len + gen_tokens
    if cache == "rolling":
        if window is None:
            raise ValueError("a rolling cache needs a finite causal window: window = [W - 1, 0]")
        return min(window, capacity)
    if cache != "full":
        raise ValueError(f"cache must be none | full | rolling, got {cache!r}")
    return capacity


def rolling_window(point) -> int | None:
    """Keys a causal sliding window of ``point`` keeps (W for window (W - 1, 0)); None = all."""
    return None if point.window_left is None else point.window_left + 1


def analytic_cache_bytes(point) -> int:
    """2 · layers · B · H_kv · slots · D · bytes: slots = seq_len + gen_tokens (full), at most
    the window (rolling), 0 without a cache."""
    slots = cache_slots(point.cache, point.seq_len, point.gen_tokens, rolling_window(point))
    return 2 * point.layers * point.batch * slots * kv_dim(point) * itemsize(point.dtype)
