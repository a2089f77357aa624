"""The cache kinds of the decode scenario: how a step holds the context between the projections
and the attention core. A point's ``cache`` names one class of :data:`CACHES`; adding a kind
(the recurrent ``state``, say) is adding a class here.

Each kind says what a point with it is, before any tensor exists: why a model cannot use it
(:meth:`LayerCache.reasons`), the bytes one layer holds (:meth:`LayerCache.layer_bytes`), the
attention call of one step (:meth:`LayerCache.step_call`) and the bytes that step reads and
writes (:meth:`LayerCache.step_traffic`); and, per layer at run time, how a step stores and
attends (:meth:`LayerCache.attend`, :meth:`LayerCache.attend_at`).

- :class:`NoCache` (``none``): nothing is kept but the token embeddings; every step recomputes
  the whole prefix through every layer: the O(n²)-per-token baseline.
- :class:`FullCache` (``full``, gpt-fast's ``KVCache``): static ``(B, H_kv, capacity, D)``
  buffers allocated once and written in place at absolute positions. A step reads a *view* of
  the first ``pos + 1`` slots: no re-concatenation, so a step costs O(n) reads, not O(n) copies.
- :class:`RollingCache` (``rolling``, Mistral's rolling buffer): ``window`` slots; position
  ``p`` lives in slot ``p % window``, overwriting ``p - window``, which the causal sliding
  window of ``window`` keys (``MaskSpec(window=(window - 1, 0))``) no longer lets anyone see.
  Memory O(window).
- :class:`StateCache` (``state``): no K/V at all; the core's recurrent state
  (:class:`harness.spec.RecurrentState`, linear attention's ``[S | z]``) absorbs every token,
  so a step is O(1) in the context, time and memory. Only for cores that declare a
  ``recurrence`` (``linear``, ``performer``) in a plain causal model.

K/V caches hold K/V *after* RoPE, rotated at their absolute positions, so a cached key never
needs re-rotating and the order of the slots does not matter to softmax.
``update(pos, k, v)`` stores the new K/V and returns ``(keys, values, mask)``: what the new
queries attend to and the mask the core must apply there (bottom-right aligned), in its
simplest form (:func:`harness.masks.reduced`: one query under plain causal is the dense mask).
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

from harness.masks import MaskSpec, reduced
from harness.spec import RecurrentState

AttendFn = Callable[[Tensor, Tensor, Tensor, MaskSpec], Tensor]
"""(q (B, H, n_q, D), k/v (B, H_kv, n_k, D), mask) -> (B, H, n_q, D), bottom-right aligned."""


class LayerCache:
    """A cache kind: class-level facts about points that use it, and one layer's store."""

    kind = ""  # the point's `cache` word
    recomputes = False  # no store per layer: a step runs the whole prefix again
    recurrent = False  # the core's recurrent state instead of K/V (sized by the core)
    fills_by_steps = False  # may prefill token by token when the core lacks the prefill's mask

    @staticmethod
    def reasons(mask: MaskSpec) -> list[str]:
        """Why a model with ``mask`` cannot use this kind (empty = it can)."""
        return []

    @staticmethod
    def layer_bytes(
        batch: int, kv_heads: int, head_dim: int, capacity: int, mask: MaskSpec, size: int
    ) -> int:
        """Bytes one layer holds for a generation of ``capacity`` positions (``size`` bytes an
        element): the analytic figure the measured cache bytes are checked against."""
        raise NotImplementedError

    @staticmethod
    def step_call(pos: int, mask: MaskSpec) -> tuple[int, int, MaskSpec]:
        """(queries, keys, mask) of one layer's attention call at the step at ``pos``."""
        raise NotImplementedError

    @staticmethod
    def step_traffic(kv_row: int, keys: int) -> int:
        """Bytes one layer's store is read and written by a step over ``keys`` keys
        (``kv_row``: the bytes of one position's K and V)."""
        return kv_row * (keys + 1)  # read the held keys, write the new one

    @classmethod
    def for_layer(cls, batch: int, kv_heads: int, head_dim: int, capacity: int, mask: MaskSpec,
                  dtype: torch.dtype, device: str | torch.device) -> LayerCache:  # fmt: skip
        """One layer's store of this kind for a model with ``mask``."""
        raise NotImplementedError

    def update(self, pos: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, MaskSpec]:
        raise NotImplementedError

    def write_at(
        self, index: Tensor, k: Tensor, v: Tensor, n_keys: int
    ) -> tuple[Tensor, Tensor, MaskSpec]:
        raise NotImplementedError

    def keys_at(self, pos: int) -> int:
        """Keys the step at ``pos`` attends to."""
        return pos + 1

    def tensors(self) -> list[Tensor]:
        return []

    def attend(self, attend: AttendFn, q: Tensor, k: Tensor, v: Tensor, pos: int) -> Tensor:
        """Store this layer's new k/v (B, H_kv, n_new, D) at ``pos`` and attend q
        (B, H, n_new, D) to what is held -> (B, H, n_new, D)."""
        keys, values, mask = self.update(pos, k, v)
        return attend(q, keys, values, mask)

    def attend_at(
        self, attend: AttendFn, q: Tensor, k: Tensor, v: Tensor, index: Tensor, n_keys: int
    ) -> Tensor:
        """:meth:`attend` for one token at the position held in ``index`` (1,) long."""
        keys, values, mask = self.write_at(index, k, v, n_keys)
        return attend(q, keys, values, mask)


class NoCache(LayerCache):
    """``none``: only the token embeddings are kept; a step recomputes every position."""

    kind = "none"
    recomputes = True

    @staticmethod
    def layer_bytes(batch, kv_heads, head_dim, capacity, mask, size) -> int:
        return 0

    @staticmethod
    def step_call(pos: int, mask: MaskSpec) -> tuple[int, int, MaskSpec]:
        return pos + 1, pos + 1, mask

    @staticmethod
    def step_traffic(kv_row: int, keys: int) -> int:
        return 0  # the prefix is read again as token embeddings: the step's inputs


class FullCache(LayerCache):
    """Preallocated K/V for ``capacity`` positions; k/v buffers (B, H_kv, capacity, D)."""

    kind = "full"

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

    @staticmethod
    def layer_bytes(batch, kv_heads, head_dim, capacity, mask, size) -> int:
        """K and V, (B, H_kv, capacity, D) each."""
        return 2 * batch * kv_heads * capacity * head_dim * size

    @staticmethod
    def step_call(pos: int, mask: MaskSpec) -> tuple[int, int, MaskSpec]:
        return 1, pos + 1, reduced(mask, 1, pos + 1)

    @classmethod
    def for_layer(cls, batch, kv_heads, head_dim, capacity, mask, dtype, device) -> FullCache:
        return cls(batch, kv_heads, capacity, head_dim, mask, dtype, device)

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
        return self.k[:, :, :end], self.v[:, :, :end], reduced(self.mask, k.shape[2], end)

    def write_at(
        self, index: Tensor, k: Tensor, v: Tensor, n_keys: int
    ) -> tuple[Tensor, Tensor, MaskSpec]:
        """One token's k/v (B, H_kv, 1, D) written at the position held in ``index`` (1,) long;
        views of the first ``n_keys`` slots (index + 1 of them for a causal step)."""
        self.k.index_copy_(2, index, k)
        self.v.index_copy_(2, index, v)
        return self.k[:, :, :n_keys], self.v[:, :, :n_keys], reduced(self.mask, 1, n_keys)

    def tensors(self) -> list[Tensor]:
        return [self.k, self.v]


class RollingCache(LayerCache):
    """A ring of ``window`` K/V slots (B, H_kv, window, D); position p lives in slot p % window.

    Takes a prefill from position 0 (any length) and then one token at a time: that is how a
    decoder uses it, and it keeps the slot arithmetic to one line.
    """

    kind = "rolling"
    fills_by_steps = True  # through the ring: O(n·W), exact, with more overhead

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

    @staticmethod
    def reasons(mask: MaskSpec) -> list[str]:
        if mask.left is None or not mask.causal:
            return ["a rolling cache needs a causal sliding window: window = [W - 1, 0]"]
        return []

    @staticmethod
    def layer_bytes(batch, kv_heads, head_dim, capacity, mask, size) -> int:
        """K and V over the window's W slots (fewer when the generation is shorter)."""
        if mask.left is None:
            raise ValueError("a rolling cache needs a finite causal window: window = [W - 1, 0]")
        return 2 * batch * kv_heads * min(mask.left + 1, capacity) * head_dim * size

    @staticmethod
    def step_call(pos: int, mask: MaskSpec) -> tuple[int, int, MaskSpec]:
        # every held slot is in the window: no mask on the ring
        return 1, min(pos + 1, mask.left + 1), MaskSpec()

    @classmethod
    def for_layer(cls, batch, kv_heads, head_dim, capacity, mask, dtype, device) -> RollingCache:
        return cls(batch, kv_heads, mask.left + 1, head_dim, dtype, device, capacity)

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

    def keys_at(self, pos: int) -> int:
        return min(pos + 1, self.k.shape[2])

    def tensors(self) -> list[Tensor]:
        return [self.k, self.v]


class StateCache(LayerCache):
    """The core's recurrent state (``[S | z]`` for linear attention, (B·H_kv, F, D + 1)): a
    prefill at position 0 starts a fresh state and advances it over the context; a step
    advances it by one token, O(F·D) whatever the context length.

    A state cannot be written "at a position" as a K/V cache can, so a step is made repeatable
    by an undo copy: stepping at the next position saves the state first (one in-place copy of
    its tensors, O(1)) and commits; stepping again at the position just taken restores that copy
    and advances again. So the timed loop redoes the same step on the same state, and every
    step, committed or redone, costs one copy plus one advance. The copy is the harness's, not
    the model's: :meth:`tensors` (``cache_bytes``, ``state_bytes``) is the state alone.
    """

    kind = "state"
    recurrent = True

    def __init__(self, new_state: Callable[[], RecurrentState]):
        self.new_state = new_state
        self.state = new_state()
        self.position = 0  # tokens the state holds
        self.saved: list[Tensor] | None = None  # the state before the last committed step

    @staticmethod
    def reasons(mask: MaskSpec) -> list[str]:
        if mask.features != {"causal"}:
            return ["a recurrent state serves a plain causal model: causal = true, no window"]
        return []

    @staticmethod
    def step_call(pos: int, mask: MaskSpec) -> tuple[int, int, MaskSpec]:
        return 1, 1, MaskSpec()  # the new token's query and key, beside the state

    def update(self, pos: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, MaskSpec]:
        raise TypeError("a recurrent state is advanced by attend, not read as keys")

    def attend(self, attend: AttendFn, q: Tensor, k: Tensor, v: Tensor, pos: int) -> Tensor:
        """A prefill at ``pos`` 0 (any length) or one token at ``pos``: the next position
        (committed) or the position just taken (redone): q (B, H, t, D) -> (B, H, t, D)."""
        t = k.shape[2]
        if pos == 0:
            self.state, self.position, self.saved = self.new_state(), t, None
        elif t != 1:
            raise ValueError("a recurrent state takes a prefill at position 0, then single tokens")
        elif pos == self.position:
            self._save()
            self.position += 1
        elif pos == self.position - 1 and self.saved is not None:
            self._restore()
        else:
            raise ValueError(f"a step at position {pos}: the state holds {self.position} tokens")
        return self.state.advance(q, k, v)

    def attend_at(
        self, attend: AttendFn, q: Tensor, k: Tensor, v: Tensor, index: Tensor, n_keys: int
    ) -> Tensor:
        """The static (captured) step: always the step after the context, redone on replay."""
        if self.saved is None:
            self._save()
            self.position += 1
        else:
            self._restore()
        return self.state.advance(q, k, v)

    def _save(self) -> None:
        if self.saved is None:
            self.saved = [t.detach().clone() for t in self.state.tensors()]
        else:
            for copy, t in zip(self.saved, self.state.tensors(), strict=True):
                copy.copy_(t)

    def _restore(self) -> None:
        for t, copy in zip(self.state.tensors(), self.saved, strict=True):
            t.copy_(copy)

    def keys_at(self, pos: int) -> int:
        return 1

    def tensors(self) -> list[Tensor]:
        return list(self.state.tensors())


CACHES: dict[str, type[LayerCache]] = {
    c.kind: c for c in (NoCache, FullCache, RollingCache, StateCache)
}


def cache_nbytes(caches: list[LayerCache]) -> int:
    """Bytes of the storage the caches really hold (measured from the tensors, not a formula)."""
    return sum(t.untyped_storage().nbytes() for c in caches for t in c.tensors())
