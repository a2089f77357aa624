"""A ragged batch as a serving engine holds it: the B context lengths a point's ``contexts``
spells, and the KV pool that holds them, paged or contiguous (the layout of
:mod:`harness.paged`).

``contexts`` (rows keep the spelling; ``context_lengths`` the lengths):

- ``"uniform"`` (the default): every sequence ``seq_len`` tokens;
- ``"lognormal:sigma=S,seed=K"``: B lengths whose logarithms have standard deviation S (sigma
  defaults to 1, seed to 0) and whose mean is ``seq_len`` exactly. The rule: the first B draws
  ``z`` of :func:`harness.scenarios.packing.normal_draws` (the draws packed documents take:
  the same on every machine) give weights ``exp(S·z)``; each length is
  ``max(1, round(B·seq_len · w / Σw))`` and the rounding remainder goes to the longest, so the
  lengths sum to B·seq_len and scale with seq_len at a fixed seed;
- an explicit list of B lengths, comma-joined (``"1,2,97,513"``); ``seq_len`` must then be
  their mean, rounded.

A length is the sequence's keys *at the timed step*, the step's ``q_per_step`` tokens
included (a kernel's ``context_lens``): the prefill writes the first ``l - q_per_step``, the
step appends the rest.

The pool (:class:`KVPool`): ``paged`` holds each sequence in pages of ``page_size`` tokens from
one shuffled free list (a real allocator's fragmentation, seeded), exactly
Σ ⌈lᵢ / page_size⌉ pages; a prefill reserves the pages its tokens fill and the step's append
writes into the last page, taking a new one when it is full. ``contiguous`` is the padded
form: one page of ``max lᵢ`` slots per sequence (B·max slots, the padding masked).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from harness.scenarios import packing

CONTEXT_KINDS = ("uniform", "lognormal")
LAYOUTS = ("NHD", "HND")  # how a pool's pages lie in memory (KVPool.allocate; FlashInfer's names)
LOGNORMAL_KEYS = {"sigma": float, "seed": int}


def parse(contexts: str) -> tuple[str, dict | tuple[int, ...]]:
    """(kind, arguments) of a ``contexts`` spelling: ("uniform", {}), ("lognormal", {sigma,
    seed}) or ("list", lengths); raises ValueError naming the problem."""
    if contexts == "uniform":
        return "uniform", {}
    kind, sep, args = contexts.partition(":")
    if kind == "lognormal":
        given: dict = {"sigma": 1.0, "seed": 0}
        for part in filter(None, args.split(",")):
            key, _, raw = (x.strip() for x in part.partition("="))
            if key not in LOGNORMAL_KEYS:
                raise ValueError(f"lognormal contexts take sigma and seed, not {key!r}")
            try:
                given[key] = LOGNORMAL_KEYS[key](raw)
            except ValueError:
                raise ValueError(f"lognormal {key}={raw!r} is not a number") from None
        if not (math.isfinite(given["sigma"]) and given["sigma"] >= 0) or given["seed"] < 0:
            raise ValueError("lognormal contexts need a finite sigma >= 0 and a seed >= 0")
        return "lognormal", given
    parts = [x.strip() for x in contexts.split(",")]
    if sep or not all(x.isdigit() for x in parts):
        raise ValueError(
            f"contexts {contexts!r}: 'uniform', 'lognormal:sigma=S,seed=K' or B lengths "
            "joined by commas ('1,2,97,513')"
        )
    lengths = tuple(int(x) for x in parts)
    if min(lengths) < 1:
        raise ValueError("every context length must be at least 1")
    return "list", lengths


@lru_cache(maxsize=256)
def lengths(contexts: str, seq_len: int, batch: int) -> tuple[int, ...]:
    """The B context lengths of the module docstring (a list as given: :func:`problems` says
    whether it fits the point)."""
    kind, args = parse(contexts)
    if kind == "uniform":
        return (seq_len,) * batch
    if kind == "list":
        return args
    draws = packing.normal_draws(args["seed"])
    weights = [math.exp(args["sigma"] * next(draws)) for _ in range(batch)]
    total, scale = batch * seq_len, batch * seq_len / sum(weights)
    out = [max(1, round(w * scale)) for w in weights]
    longest = max(range(batch), key=out.__getitem__)
    out[longest] += total - sum(out)  # the rounding remainder (the longest stays >= 1)
    return tuple(out)


def problems(contexts: str, seq_len: int, batch: int, q_per_step: int) -> list[str]:
    """Why ``contexts`` does not fit a point (empty = it does): a bad spelling, a list whose size
    is not the batch or whose mean is not seq_len, a context shorter than the step."""
    try:
        kind, args = parse(contexts)
    except ValueError as exc:
        return [str(exc)]
    if kind == "list":
        if len(args) != batch:
            return [f"{len(args)} context lengths for a batch of {batch}"]
        mean = (sum(args) + batch // 2) // batch
        if mean != seq_len:
            return [f"seq_len must be the lengths' mean, {mean} (got {seq_len})"]
    shortest = min(lengths(contexts, seq_len, batch))
    if q_per_step > shortest:
        return [
            f"q_per_step = {q_per_step} is larger than a context of {shortest} tokens "
            "(a length counts the step's tokens)"
        ]
    return []


def pages_of(lengths_: tuple[int, ...], page_size: int) -> int:
    """Σ ⌈lᵢ / page_size⌉: the pages a paged pool holds for these lengths."""
    return sum(-(-n // page_size) for n in lengths_)


@dataclass
class KVPool:
    """K/V of a ragged batch in the layout of :mod:`harness.paged`: ``k``/``v`` (P, page_size,
    H_kv, D), ``block_table`` (B, max_pages) int32 (-1 past a sequence's pages),
    ``context_lens`` (B,) int32 (the keys written so far), ``lengths`` on the host."""

    k: Tensor
    v: Tensor
    block_table: Tensor
    context_lens: Tensor
    tables: list[list[int]]
    free: list[int]

    @property
    def page_size(self) -> int:
        return self.k.shape[1]

    @classmethod
    def allocate(cls, pages: int, page_size: int, batch: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: str, seed: int,
                 layout: str = "NHD") -> KVPool:  # fmt: skip
        """An empty pool of ``pages`` pages whose free list is a seeded shuffle of them.
        ``layout``: how a page lies in memory, "NHD" (page, H_kv, D) or "HND" (H_kv, page,
        D); ``k``/``v`` are (P, page, H_kv, D) either way, views of the storage for HND."""
        if page_size < 1 or pages < 1:
            raise ValueError(
                f"a KV pool needs page_size >= 1 and pages >= 1 (got {page_size}, {pages})"
            )
        if layout not in LAYOUTS:
            raise ValueError(f"a KV pool's layout is {' or '.join(LAYOUTS)} (got {layout!r})")
        gen = torch.Generator().manual_seed(seed)
        free = torch.randperm(pages, generator=gen).tolist()

        def storage() -> Tensor:
            if layout == "NHD":
                shape = (pages, page_size, kv_heads, head_dim)
                return torch.zeros(shape, dtype=dtype, device=device)
            shape = (pages, kv_heads, page_size, head_dim)
            return torch.zeros(shape, dtype=dtype, device=device).transpose(1, 2)

        table = torch.full((batch, 1), -1, dtype=torch.int32, device=device)
        lens = torch.zeros(batch, dtype=torch.int32, device=device)
        return cls(storage(), storage(), table, lens, [[] for _ in range(batch)], free[::-1])

    def append(self, seq: int, k: Tensor, v: Tensor) -> None:
        """Write k/v (t, H_kv, D) after sequence ``seq``'s keys, taking a page from the free
        list whenever its last page is full; ValueError when the pool has none left."""
        start, page = int(self.context_lens[seq]), self.page_size
        end, table = start + k.shape[0], self.tables[seq]
        need = -(-end // page) - len(table)
        if need > len(self.free):
            raise ValueError(
                f"a context of {end} tokens needs {need} more pages of {page}; the "
                f"pool has {len(self.free)} free"
            )
        table += [self.free.pop() for _ in range(need)]
        if end == start:
            return
        pos = torch.arange(start, end)
        index = torch.tensor(table, dtype=torch.long, device=self.k.device)[pos // page]
        slot = (pos % page).to(self.k.device)
        self.k[index, slot] = k
        self.v[index, slot] = v
        self.context_lens[seq] = end

    def publish(self) -> None:
        """Refresh ``block_table`` from the host tables (after appends, before a step)."""
        width = max(1, max(len(t) for t in self.tables))
        rows = [t + [-1] * (width - len(t)) for t in self.tables]
        self.block_table = torch.tensor(rows, dtype=torch.int32, device=self.k.device)

    def tensors(self) -> list[Tensor]:
        """The pool's storage (what ``cache_bytes`` measures)."""
        return [self.k, self.v]


def offsets(lens: tuple[int, ...]) -> list[int]:
    """Where each sequence starts in keys packed end to end: (B + 1,) running sums of lens."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def fill_pool(keys: Tensor, values: Tensor, lens: tuple[int, ...], q_per_step: int, paged: bool,
              page_size: int, seed: int, layout: str = "NHD") -> KVPool:  # fmt: skip
    """A pool holding the B sequences of keys/values packed end to end (Σ lens, H_kv, D):
    the prefill (all but the last ``q_per_step`` of each), then the step's append. ``paged``:
    pages of ``page_size`` from a shuffled free list; else one page of max(lens) slots per
    sequence (the padded contiguous form: for HND, (B, H_kv, max, D) in memory). ``layout``:
    :meth:`KVPool.allocate`."""
    batch, (_, kv_heads, head_dim) = len(lens), keys.shape
    size = page_size if paged else max(lens)
    pool = KVPool.allocate(pages_of(lens, size), size, batch, kv_heads, head_dim, keys.dtype,
                           str(keys.device), seed, layout)  # fmt: skip
    if not paged:  # the contiguous form: sequence b owns page b
        pool.tables, pool.free = [[b] for b in range(batch)], []
    starts = offsets(lens)
    for b, n in enumerate(lens):
        first = slice(starts[b], starts[b] + n - q_per_step)
        pool.append(b, keys[first], values[first])
    for b, n in enumerate(lens):
        step = slice(starts[b] + n - q_per_step, starts[b] + n)
        pool.append(b, keys[step], values[step])
    pool.publish()
    return pool
