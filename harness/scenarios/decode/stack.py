"""The decoder the decode scenario times: ``layers`` causal transformer blocks with one cache per
layer between the projections and the attention core (:mod:`.caches`).

x: (B, N, d_model) token embeddings in, final hidden states (B, N, d_model) out. With a cache
kind that recomputes (``none``) the stack keeps only the embeddings seen so far (the token ids of
a real model) and runs the whole prefix again at every step. Sinusoidal or learned encodings are
added at every block's input (as :class:`harness.model.transformer.TransformerBlock` does), the
same way in every path, so cached and recomputed outputs are one function.
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.masks import MaskSpec
from harness.model.transformer import TransformerBlock
from harness.scenarios.decode.caches import CACHES, AttendFn, LayerCache


class DecoderStack:
    """``layers`` causal blocks; ``cache`` names a kind of :data:`CACHES`."""

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
        self.kind = CACHES[cache]
        reasons = self.kind.reasons(mask)
        if reasons:
            raise ValueError("; ".join(reasons))
        self.blocks, self.attend, self.mask = blocks, attend, mask
        self.cache, self.batch, self.capacity = cache, batch, capacity
        self.stepwise_prefill = stepwise_prefill  # a cache filled token by token (see caches)
        self.caches: list[LayerCache] = self.new_caches()
        self.tokens: Tensor | None = None  # (B, capacity, d_model), recomputing kinds only

    def new_caches(self) -> list[LayerCache]:
        """One freshly allocated cache per layer (an empty list when the kind recomputes)."""
        if self.kind.recomputes:
            return []
        if self.kind.recurrent:  # the core sizes its own state
            return [self.kind(self.attend.new_state) for _ in self.blocks]
        c, p = self.blocks[0].cfg, next(self.blocks[0].parameters())
        return [
            self.kind.for_layer(
                self.batch, c.n_kv_heads, c.head_dim, self.capacity, self.mask, p.dtype, p.device
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

    def forward(self, x: Tensor, offset: int = 0, caches: list[LayerCache] | None = None) -> Tensor:
        """x at positions offset..offset+N-1 through every block; with ``caches``, each layer's
        K/V go through its cache, otherwise x is the whole sequence (offset 0)."""
        for layer, block in enumerate(self.blocks):
            x = block(x, self._core(caches[layer] if caches else None, offset), offset)
        return x

    def _core(self, cache: LayerCache | None, pos: int | Tensor, n_keys: int | None = None):
        def core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            if cache is None:
                return self.attend(q, k, v, self.mask)
            if isinstance(pos, Tensor):
                return cache.attend_at(self.attend, q, k, v, pos, n_keys)
            return cache.attend(self.attend, q, k, v, pos)

        return core

    def prefill(self, x: Tensor) -> Tensor:
        """Fill the caches from a context x: (B, n, d) at positions 0..n-1 -> (B, n, d)."""
        if self.kind.recomputes:
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
        if self.kind.recomputes:
            self.tokens[:, pos : pos + 1] = x
            return self.forward(self.tokens[:, : pos + 1])[:, -1:]
        return self.forward(x, pos, self.caches)

    def step_keys(self, pos: int) -> int:
        """Keys (tokens without a cache) the step at ``pos`` attends to."""
        return self.caches[0].keys_at(pos) if self.caches else pos + 1

    def static_step(self, x: Tensor, index: Tensor, n_keys: int) -> Tensor:
        """:meth:`step` on static buffers for CUDA graphs and ``reduce-overhead`` compilation:
        x (B, 1, d), the position in ``index`` (1,) long on the device, ``n_keys`` =
        :meth:`step_keys` of that position; every write is in place -> (B, 1, d)."""
        if self.kind.recomputes:
            self.tokens.index_copy_(1, index, x)
            return self.forward(self.tokens[:, :n_keys])[:, -1:]
        for layer, block in enumerate(self.blocks):
            x = block(x, self._core(self.caches[layer], index, n_keys), index)
        return x
