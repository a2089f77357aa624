"""KV caches for decoding: where K and V live between the projections and the attention core.

Both caches are per layer and hold K/V *after* RoPE, rotated at their absolute positions, so a
cached key never needs re-rotating and the order of the slots does not matter to softmax.

- :class:`FullCache` (gpt-fast's ``KVCache``): static ``(B, H_kv, capacity, D)`` buffers
  allocated once and written in place at absolute positions. A step reads a *view* of the
  first ``pos + 1`` slots: no re-concatenation, so a step costs O(n) reads, not O(n) copies.
- :class:`RollingCache` (Mistral's rolling buffer): ``window`` slots; position ``p`` lives in
  slot ``p % window``, overwriting ``p - window``, which the causal sliding window of ``window``
  keys (``MaskSpec(window=(window - 1, 0))``) no longer lets anyone see. Memory O(window).

``update(pos, k, v)`` stores the new K/V and returns ``(keys, values, mask)``: what the new
queries attend to and the mask the core must apply there (bottom-right aligned).
``write_at(index, k, v, n_keys)`` is the same for one token whose position is a (1,) long tensor
on the device: the write happens in place at an index read on the device (no host sync), so a
step captured in a CUDA graph writes wherever the position tensor points when it is replayed.
The number of keys returned is a Python int: a graph holds one key count (a full cache's grows
by one per step; a full rolling ring's stays ``window``, so one rolling graph serves every step).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from harness.masks import MaskSpec
from harness.model.transformer import TransformerBlock
from harness.sweep.problems import single_query_mask


class FullCache:
    """Preallocated K/V for ``capacity`` positions; k/v buffers (B, H_kv, capacity, D)."""

    def __init__(
        self,
        batch: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        mask: MaskSpec,
        dtype: torch.dtype,
        device: str | torch.device,
    ):
        shape = (batch, kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.mask = mask  # the model's mask (causal, maybe a window): the core applies it

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def update(self, pos: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, MaskSpec]:
        """Write k/v (B, H_kv, n_new, D) at positions pos..pos+n_new-1; return views of all
        keys/values so far, (B, H_kv, pos + n_new, D), and the mask to apply to them."""
        end = pos + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"position {end - 1} beyond the cache capacity {self.capacity}")
        self.k[:, :, pos:end] = k  # in place: the buffer never moves or grows
        self.v[:, :, pos:end] = v
        mask = single_query_mask(self.mask) if k.shape[2] == 1 else self.mask
        return self.k[:, :, :end], self.v[:, :, :end], mask

    def write_at(
        self, index: Tensor, k: Tensor, v: Tensor, n_keys: int
    ) -> tuple[Tensor, Tensor, MaskSpec]:
        """One token's k/v (B, H_kv, 1, D) written at the position held in ``index`` (1,) long;
        views of the first ``n_keys`` slots (index + 1 of them for a causal step)."""
        self.k.index_copy_(2, index, k)
        self.v.index_copy_(2, index, v)
        return self.k[:, :, :n_keys], self.v[:, :, :n_keys], single_query_mask(self.mask)

    def tensors(self) -> list[Tensor]:
        return [self.k, self.v]


class RollingCache:
    """A ring of ``window`` K/V slots (B, H_kv, window, D); position p lives in slot p % window.

    Takes a prefill from position 0 (any length) and then one token at a time: that is how a
    decoder uses it, and it keeps the slot arithmetic to one line.
    """

    def __init__(
        self,
        batch: int,
        kv_heads: int,
        window: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
        capacity: int | None = None,
    ):
        # a generation shorter than the window never fills it: allocate only what it can use
        slots = window if capacity is None else min(window, capacity)
        shape = (batch, kv_heads, slots, head_dim)
        self.window = window
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def mask(self) -> MaskSpec:
        """The model this cache serves: causal sliding window of ``window`` keys."""
        return MaskSpec(causal=True, window=(self.window - 1, 0))

    def update(self, pos: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, MaskSpec]:
        """Store k/v (B, H_kv, n_new, D). A prefill (pos 0, n_new > 1) attends to its own k/v
        under the sliding-window mask and keeps the last ``window`` of them; a single token
        attends to the held slots, all of which are inside its window: no mask."""
        n = k.shape[2]
        if n > 1 and pos != 0:
            raise ValueError("a rolling cache takes a prefill at position 0, then single tokens")
        if n == 1:
            if pos >= self.k.shape[2] < self.window:  # a short ring is sized for its capacity
                raise ValueError(f"position {pos} beyond the cache capacity {self.k.shape[2]}")
            slot = pos % self.window
            self.k[:, :, slot : slot + 1] = k
            self.v[:, :, slot : slot + 1] = v
            held = min(pos + 1, self.k.shape[2])  # before the ring is full, slots 0..pos
            return self.k[:, :, :held], self.v[:, :, :held], MaskSpec()
        keep = min(n, self.k.shape[2])
        slots = torch.arange(n - keep, n, device=k.device) % self.window
        self.k.index_copy_(2, slots, k[:, :, n - keep :])
        self.v.index_copy_(2, slots, v[:, :, n - keep :])
        return k, v, self.mask

    def write_at(
        self, index: Tensor, k: Tensor, v: Tensor, n_keys: int
    ) -> tuple[Tensor, Tensor, MaskSpec]:
        """One token at the position held in ``index`` (1,) long: slot ``index % window`` is
        computed on the device; the ``n_keys`` held slots are all inside the window: no mask."""
        slot = torch.remainder(index, self.window)
        self.k.index_copy_(2, slot, k)
        self.v.index_copy_(2, slot, v)
        return self.k[:, :, :n_keys], self.v[:, :, :n_keys], MaskSpec()

    def tensors(self) -> list[Tensor]:
        return [self.k, self.v]


KVCache = FullCache | RollingCache


def cache_nbytes(caches: list[KVCache]) -> int:
    """Bytes of the storage the caches really hold (measured from the tensors, not a formula)."""
    return sum(t.untyped_storage().nbytes() for c in caches for t in c.tensors())


AttendFn = Callable[[Tensor, Tensor, Tensor, MaskSpec], Tensor]
"""(q (B, H, n_q, D), k/v (B, H_kv, n_k, D), mask) -> (B, H, n_q, D), bottom-right aligned."""


class DecoderStack:
    """``layers`` causal blocks with one cache per layer between projection and core.

    x: (B, N, d_model) token embeddings in, final hidden states (B, N, d_model) out.
    ``cache="none"`` keeps only the embeddings seen so far (the token ids of a real model) and
    recomputes the whole prefix at every step: the O(n²)-per-token baseline. Sinusoidal or
    learned encodings are added at every block's input (as :class:`TransformerBlock` does), the
    same way in every path, so cached and recomputed outputs are one function.
    """

    def __init__(
        self,
        blocks: list[TransformerBlock],
        attend: AttendFn,
        mask: MaskSpec,
        cache: str,
        batch: int,
        capacity: int,
        stepwise_prefill: bool = False,
    ):
        if cache == "rolling" and (mask.left is None or not mask.causal):
            raise ValueError("a rolling cache needs a causal sliding window: window = [W - 1, 0]")
        self.blocks, self.attend, self.mask = blocks, attend, mask
        self.cache, self.batch, self.capacity = cache, batch, capacity
        self.stepwise_prefill = stepwise_prefill  # rolling cache with a core lacking windows
        self.caches: list[KVCache] = self.new_caches()
        self.tokens: Tensor | None = None  # (B, capacity, d_model), cache="none" only

    def new_caches(self) -> list[KVCache]:
        """One freshly allocated cache per layer (an empty list without a cache)."""
        if self.cache == "none":
            return []
        c, p = self.blocks[0].cfg, next(self.blocks[0].parameters())
        if self.cache == "full":
            return [
                FullCache(
                    self.batch,
                    c.n_kv_heads,
                    self.capacity,
                    c.head_dim,
                    self.mask,
                    p.dtype,
                    p.device,
                )
                for _ in self.blocks
            ]
        window = self.mask.left + 1
        return [
            RollingCache(
                self.batch, c.n_kv_heads, window, c.head_dim, p.dtype, p.device, self.capacity
            )
            for _ in self.blocks
        ]

    def fresh(self) -> DecoderStack:
        """The same blocks and core with new, empty caches (a second generation)."""
        return DecoderStack(
            self.blocks,
            self.attend,
            self.mask,
            self.cache,
            self.batch,
            self.capacity,
            self.stepwise_prefill,
        )

    def forward(self, x: Tensor, offset: int = 0, caches: list[KVCache] | None = None) -> Tensor:
        """x at positions offset..offset+N-1 through every block; with ``caches``, each layer's
        K/V go through its cache, otherwise x is the whole sequence (offset 0)."""
        for layer, block in enumerate(self.blocks):
            x = block(x, self._core(caches[layer] if caches else None, offset), offset)
        return x

    def _core(self, cache: KVCache | None, pos: int | Tensor, n_keys: int | None = None):
        def core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            if cache is None:
                return self.attend(q, k, v, self.mask)
            if isinstance(pos, Tensor):
                keys, values, mask = cache.write_at(pos, k, v, n_keys)
            else:
                keys, values, mask = cache.update(pos, k, v)
            return self.attend(q, keys, values, mask)

        return core

    def prefill(self, x: Tensor) -> Tensor:
        """Fill the caches from a context x: (B, n, d) at positions 0..n-1 -> (B, n, d)."""
        if self.cache == "none":
            if self.tokens is None:  # kept across prefills: a captured step reads this buffer
                self.tokens = x.new_zeros(self.batch, self.capacity, x.shape[2])
            self.tokens[:, : x.shape[1]] = x
            return self.forward(x)
        self.caches = self.caches or self.new_caches()
        if self.stepwise_prefill:  # O(n·W) through the ring, one token at a time
            return torch.cat([self.step(x[:, t : t + 1], t) for t in range(x.shape[1])], dim=1)
        return self.forward(x, 0, self.caches)

    def step(self, x: Tensor, pos: int) -> Tensor:
        """One token x: (B, 1, d) at position ``pos`` -> its output (B, 1, d). Writing at a
        given position (not a moving pointer) makes a repeated step idempotent: the timed
        loop re-runs the step at the same position without growing the cache."""
        if self.cache == "none":
            self.tokens[:, pos : pos + 1] = x
            return self.forward(self.tokens[:, : pos + 1])[:, -1:]
        return self.forward(x, pos, self.caches)

    def step_keys(self, pos: int) -> int:
        """Keys (tokens without a cache) the step at ``pos`` attends to."""
        if self.cache == "rolling":
            return min(pos + 1, self.caches[0].k.shape[2])
        return pos + 1

    def static_step(self, x: Tensor, index: Tensor, n_keys: int) -> Tensor:
        """:meth:`step` on static buffers for CUDA graphs and ``reduce-overhead`` compilation:
        x (B, 1, d), the position in ``index`` (1,) long on the device, ``n_keys`` =
        :meth:`step_keys` of that position; every write is in place -> (B, 1, d)."""
        if self.cache == "none":
            self.tokens.index_copy_(1, index, x)
            return self.forward(self.tokens[:, :n_keys])[:, -1:]
        for layer, block in enumerate(self.blocks):
            x = block(x, self._core(self.caches[layer], index, n_keys), index)
        return x
