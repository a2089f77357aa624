"""Analytic cost of a ``decode`` point (:mod:`harness.scenarios.decode`): a context of
``seq_len`` tokens prefilled through ``layers`` causal attention blocks, then one generated
token's step timed at position seq_len.

- :func:`decode_flops_per_token`: useful FLOPs of one step (or, without a cache, what it
  executes: the whole prefix again);
- :func:`decode_step_bytes`: the bytes one step must move (the roofline floor, ``step_bytes``);
- :func:`decode_call_bytes`: what the timed step allocates (``peak_mem_bytes``);
- :func:`predict_decode_peak_bytes`: the peak of the whole point, prefill and check included.

Weights are one block's parameters as :func:`harness.scenarios.decode.block_config` builds it
(a learned position table of seq_len + gen_tokens rows); bytes per element from
:func:`harness.dtypes.itemsize`.
"""

from __future__ import annotations

from harness import registry
from harness.cost.cache import analytic_cache_bytes
from harness.cost.checksize import full_check_fits
from harness.cost.components import (
    activation_bytes,
    attention_params,
    attention_workspace,
    ffn_flops,
    ffn_params,
    kv_dim,
    projection_flops,
)
from harness.dtypes import itemsize
from harness.masks import kept_pairs
from harness.sweep.problems import decode_problem, sequence_problem, step_problem

REFERENCE_CHUNK = 256  # query rows per chunk of harness.oracle.reference (its default)


def decode_flops_per_token(point, executed: bool = False) -> float:
    """FLOPs of one generated token at context ``seq_len`` through ``layers`` blocks: the linear
    layers for one token plus 4·B·H·D per key the new query keeps. ``executed`` with
    ``cache="none"``: what the step really runs, all seq_len + 1 tokens again (causal)."""
    n = point.seq_len + 1
    tokens, pairs = 1, kept_pairs(point.mask, 1, n)
    if executed and point.cache == "none":
        tokens, pairs = n, kept_pairs(point.mask, n, n)
    core = 4.0 * point.batch * point.heads * point.head_dim * pairs
    d = point.d_model
    linear = float(projection_flops(d, kv_dim(point)) + ffn_flops(d, point.ffn))
    return point.layers * (linear * point.batch * tokens + core)


def decode_weight_bytes(point) -> int:
    """Parameter bytes of one block (weights, biases, norms, a learned position table of
    seq_len + gen_tokens rows)."""
    d = point.d_model
    pos = (point.seq_len + point.gen_tokens) * d if point.pos == "learned" else 0
    params = attention_params(d, kv_dim(point)) + ffn_params(d, point.ffn) + 4 * d + pos
    return params * itemsize(point.dtype)


def decode_step_bytes(point) -> int:
    """Bytes one generated token's step must move through memory at least: every layer's
    weights (one row of a learned position table, not all of it), the K/V it reads (the
    step's keys; without a cache the token embeddings it recomputes from), the new token's K/V
    it writes, and the hidden state in and out. The roofline floor of a decode step."""
    d, size = point.d_model, itemsize(point.dtype)
    table = (point.seq_len + point.gen_tokens) * d * size if point.pos == "learned" else 0
    weights = decode_weight_bytes(point) - table + (d * size if table else 0)
    keys = step_problem(point).n_k
    kv_row = 2 * point.batch * kv_dim(point) * size  # one position's K and V
    if point.cache == "none":
        per_layer = weights
        inputs = point.batch * keys * d * size  # the embeddings of the whole prefix
    else:
        per_layer = weights + kv_row * (keys + 1)  # read the held keys, write the new one
        inputs = point.batch * d * size
    return point.layers * per_layer + inputs + point.batch * d * size


def decode_call_bytes(point) -> int:
    """Bytes the timed step allocates: the caches live outside the call, so one layer's
    activations over the step's tokens (1 per sequence, seq_len + 1 without a cache)."""
    step_tokens = point.batch * (point.seq_len + 1 if point.cache == "none" else 1)
    return activation_bytes(step_tokens, point.d_model, point.ffn, itemsize(point.dtype))


def _forward_bytes(point, tokens: int, size: int) -> int:
    """Live activations of one block over ``tokens`` tokens plus the core's workspace."""
    acts = activation_bytes(point.batch * tokens, point.d_model, point.ffn, size)
    return acts + attention_workspace(point, decode_problem(point, tokens, tokens, point.mask))


def predict_decode_peak_bytes(point) -> int:
    """Predicted peak bytes of a decode point: weights, inputs and caches, plus the largest of
    the prefill, the step and the agreement check (``auto`` plan: a second set of caches, a
    same-dtype recomputation of all seq_len + gen_tokens tokens, a float64 copy of the stack
    up to FULL_CHECK_MAX_PAIRS or where the core cannot recompute)."""
    size = itemsize(point.dtype)
    total = point.seq_len + point.gen_tokens
    weights = point.layers * decode_weight_bytes(point)
    inputs = point.batch * total * point.d_model * size * (2 if point.cache == "none" else 1)
    cache = analytic_cache_bytes(point)
    prefill = _forward_bytes(point, point.seq_len, size)
    step = _forward_bytes(point, point.seq_len + 1, size) if point.cache == "none" else 0
    can_recompute = not registry.get(point.impl).not_supported(sequence_problem(point))
    check = cache + (_forward_bytes(point, total, size) if can_recompute else 0)
    if full_check_fits(point) or not can_recompute:  # float64 weights, rows, scores
        check += weights // size * 8 + point.batch * total * 8 * (
            10 * point.d_model + 2 * point.heads * REFERENCE_CHUNK
        )
    return weights + inputs + cache + max(prefill, step, check)
