"""The shapes and the analytic cost of a ``decode`` point: a context of ``seq_len`` tokens
prefilled through ``layers`` causal blocks, then one generated token's step timed at position
seq_len.

Shapes (:class:`harness.spec.Problem`, bottom-right aligned: one query at the newest position
sees the last keys): :func:`prefill_problem` (seq_len queries over seq_len keys, causal),
:func:`step_problem` (one layer's call in the timed step: its cache kind says which,
:meth:`.caches.LayerCache.step_call`) and :func:`sequence_problem` (all seq_len + gen_tokens
tokens in one causal call: the recomputation the check compares the cached steps with).

Cost (:class:`DecodeCost`): FLOPs of one step (useful: the new token's layers and the keys its
query keeps; executed: what the step's call really runs, the whole prefix again without a
cache), the bytes one step must move (``step_bytes``: the roofline floor of a decode step), what
the step allocates and the peak of the whole point, prefill and check included. Weights are
one block's parameters as :meth:`harness.model.transformer.BlockConfig.of` builds it
(a learned position table of seq_len + gen_tokens rows).
"""

from __future__ import annotations

from functools import cached_property

from harness import registry
from harness.cost.components import (
    activation_bytes,
    attention_flops,
    attention_linear_flops,
    attention_params,
    attention_workspace,
    block_params,
    kv_dim,
)
from harness.scenarios.case import full_check_fits
from harness.scenarios.decode.caches import CACHES
from harness.scenarios.interface import Point, PointCost
from harness.spec import Problem, itemsize

REFERENCE_CHUNK = 256  # query rows per chunk of harness.oracle.reference (its default)


def prefill_problem(point: Point) -> Problem:
    """The attention call of the (parallel) prefill: seq_len queries and keys, causal."""
    return point.attention_call(point.seq_len, point.seq_len, point.mask)


def sequence_problem(point: Point) -> Problem:
    """All seq_len + gen_tokens tokens in one causal call (a recomputation without a cache)."""
    total = point.seq_len + point.settings.gen_tokens
    return point.attention_call(total, total, point.mask)


def stepwise(point: Point, impl) -> bool:
    """A cache kind that can fill token by token does so when the core ``impl`` (an
    :class:`harness.registry.Implementation`) cannot apply the model's mask to a parallel
    prefill (exact either way; O(n·W) with more overhead)."""
    return CACHES[point.settings.cache].fills_by_steps and bool(
        impl.not_supported(prefill_problem(point))
    )


def step_problem(point: Point) -> Problem:
    """One layer's attention call in the timed step at position seq_len: what support and the
    FLOPs of a decode point are judged on."""
    return point.attention_call(*CACHES[point.settings.cache].step_call(point.seq_len, point.mask))


class DecodeCost(PointCost):
    """One generated token's step at context seq_len; see the module docstring."""

    @cached_property
    def step(self) -> Problem:
        return step_problem(self.point)

    @cached_property
    def linear_flops_per_token(self) -> float:
        """W_Q/K/V/O and the FFN for one token of one layer."""
        p = self.point
        d_kv = kv_dim(p.heads, p.kv_heads, p.head_dim)
        return float(attention_linear_flops(p.d_model, d_kv, p.settings.ffn))

    def _step_flops(self, problem: Problem) -> float:
        """Every layer's dense layers over ``problem.n_q`` tokens plus its attention call."""
        p = self.point
        core = attention_flops(p.impl, problem)
        return p.settings.layers * (self.linear_flops_per_token * p.batch * problem.n_q + core)

    @cached_property
    def useful_flops(self) -> float:
        """One token through every layer: its query keeps the keys the mask lets it see (a
        recurrent state: the core's own formula for the one-token step, O(1) in n)."""
        p = self.point
        if CACHES[p.settings.cache].recurrent:
            return self.executed_flops
        return self._step_flops(p.attention_call(1, p.seq_len + 1, p.mask))

    @cached_property
    def executed_flops(self) -> float:
        """What the step's call runs: one token over its keys, or (recomputing) every token."""
        return self._step_flops(self.step)

    @cached_property
    def predicted_flops(self) -> float:
        """The prefill and gen_tokens steps (what the point computes beside the timing)."""
        prefill = self._step_flops(prefill_problem(self.point))
        return prefill + self.point.settings.gen_tokens * self.executed_flops

    def setup_calls(self, first: bool = True) -> int:
        """A prefill filled token by token (:func:`stepwise`) is seq_len steps of every layer,
        made three times in a first pass (the case, the check's fresh stack, the timed prefill
        of ``prefill_s``) and once in a later pass (the case built again)."""
        p = self.point
        if not stepwise(p, registry.get(p.impl)):
            return 0
        return (3 if first else 1) * p.seq_len * p.settings.layers

    @cached_property
    def weight_bytes(self) -> int:
        """Parameter bytes of one block (weights, biases, norms, a learned position table of
        seq_len + gen_tokens rows)."""
        p = self.point
        rows = p.seq_len + p.settings.gen_tokens if p.settings.pos == "learned" else 0
        mixer = attention_params(p.d_model, kv_dim(p.heads, p.kv_heads, p.head_dim))
        return block_params(p.d_model, mixer, p.settings.ffn, rows) * itemsize(p.dtype)

    @cached_property
    def cache_bytes(self) -> int:
        """Every layer's store, as its cache kind counts it (K/V caches: 2 · B · H_kv · slots
        · D · bytes per layer; a recurrent state: the core's ``recurrence.state_bytes``)."""
        return self.point.settings.layers * self.layer_store_bytes

    @cached_property
    def layer_store_bytes(self) -> int:
        """One layer's store: its K/V slots, or the core's recurrent state."""
        p = self.point
        capacity = p.seq_len + p.settings.gen_tokens
        kind = CACHES[p.settings.cache]
        if kind.recurrent:
            return registry.get(p.impl).recurrence.state_bytes(self.step)
        size = itemsize(p.dtype)
        return kind.layer_bytes(p.batch, p.kv_heads or p.heads, p.head_dim, capacity, p.mask, size)

    @cached_property
    def compulsory_bytes(self) -> float:
        return float(self.step_bytes)

    @cached_property
    def step_bytes(self) -> int:
        """Bytes one step must move at least: every layer's weights (one row of a learned
        position table, not all of it), the K/V it reads (the step's keys; recomputing, the
        token embeddings of the prefix instead), the new token's K/V it writes, and the hidden
        state in and out."""
        p = self.point
        d, size = p.d_model, itemsize(p.dtype)
        table = (p.seq_len + p.settings.gen_tokens) * d * size if p.settings.pos == "learned" else 0
        weights = self.weight_bytes - table + (d * size if table else 0)
        kv_row = 2 * p.batch * kv_dim(p.heads, p.kv_heads, p.head_dim) * size  # one position
        read_write = CACHES[p.settings.cache].step_traffic(kv_row, self.step.n_k)
        if CACHES[p.settings.cache].recurrent:  # the state read and written back
            read_write = 2 * self.layer_store_bytes
        inputs = p.batch * self.step.n_q * d * size  # the new token, or the whole prefix again
        return p.settings.layers * (weights + read_write) + inputs + p.batch * d * size

    @cached_property
    def call_bytes(self) -> int:
        """The caches live outside the call: one layer's activations over the step's tokens."""
        p = self.point
        tokens = p.batch * self.step.n_q
        return activation_bytes(tokens, p.d_model, p.settings.ffn, itemsize(p.dtype))

    def _forward_bytes(self, tokens: int) -> int:
        """Live activations of one block over ``tokens`` tokens plus the core's workspace."""
        p = self.point
        acts = activation_bytes(p.batch * tokens, p.d_model, p.settings.ffn, itemsize(p.dtype))
        return acts + attention_workspace(p.impl, p.attention_call(tokens, tokens, p.mask))

    @cached_property
    def peak_bytes(self) -> int:
        """Weights, inputs and caches, plus the largest of the prefill, the step and the
        agreement check (``auto`` check: a second set of caches, a same-dtype recomputation of
        all seq_len + gen_tokens tokens, a float64 copy of the stack up to
        FULL_CHECK_MAX_PAIRS or where the core cannot recompute)."""
        p = self.point
        size = itemsize(p.dtype)
        total = p.seq_len + p.settings.gen_tokens
        weights = p.settings.layers * self.weight_bytes
        copies = 2 if CACHES[p.settings.cache].recomputes else 1  # the kept token embeddings
        inputs = p.batch * total * p.d_model * size * copies
        prefill = self._forward_bytes(p.seq_len)
        step = self._forward_bytes(self.step.n_q) if self.step.n_q > 1 else 0
        can_recompute = not registry.get(p.impl).not_supported(sequence_problem(p))
        check = self.cache_bytes + (self._forward_bytes(total) if can_recompute else 0)
        if full_check_fits(p.seq_len, p.seq_len) or not can_recompute:
            # float64 weights, rows, scores
            check += weights // size * 8 + p.batch * total * 8 * (
                10 * p.d_model + 2 * p.heads * REFERENCE_CHUNK
            )
        return weights + inputs + self.cache_bytes + max(prefill, step, check)
