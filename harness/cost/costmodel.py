"""Analytic cost of a point: useful FLOPs, compulsory bytes and predicted peak memory.

FLOPs count a multiply-add as 2. Attention forward is ``4·B·H·D`` per kept (query, key) pair
(QKᵀ and PV, 2·D each), from the exact kept-pair count of :func:`harness.masks.kept_pairs`
(causal n=4 keeps 10 pairs, not 8); softmax is not counted (FlashAttention's convention).
Backward is 2.5x forward (FlashAttention's benchmarks: 2 matmuls recomputed + 3 gradients over
the 2 of forward); a ``+backward`` scenario times forward and backward, so it counts 3.5x.
Linear layers (projections, FFN, LSTM, conv) count 2·in·out per token forward, 2x that backward.

Per-layer costs (Vaswani et al. 2017, Table 1, constants made explicit), per token:
self-attention core 4·n·d (non-causal), recurrent (LSTM) 16·d² (4 gates x (W_ih + W_hh)),
convolution 2·k·d² (Conv1d d -> d, kernel k): hence n < d is where attention's O(n²·d) beats
recurrence's O(n·d²) up to constants; :func:`flop_crossover` gives the exact n.
"""

from __future__ import annotations

import torch

from harness import registry
from harness.masks import kept_pairs
from harness.spec import Problem
from harness.sweep.point import Point

BACKWARD_FACTOR = 2.5  # attention backward / forward FLOPs (FlashAttention benchmark convention)
LINEAR_BACKWARD_FACTOR = 2.0  # dX and dW, each as costly as the forward matmul
LSTM_FLOPS_PER_D2 = 16  # per token: 4 gates x (W_ih x + W_hh h) x 2 FLOPs
FFN_MULT = 4  # hidden = 4·d for relu/gelu; SwiGLU uses 2/3 of that in three matrices


def dtype_bytes(dtype: str | torch.dtype) -> int:
    """Bytes per element of a dtype name (``"float32"``) or torch dtype."""
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return torch.finfo(dt).bits // 8


def ffn_hidden(d_model: int, ffn: str) -> int:
    """FFN hidden width as ``harness.model.transformer.BlockConfig`` builds it: 4·d; SwiGLU
    int(2/3·4·d)."""
    hidden = FFN_MULT * d_model
    return int(2 * hidden / 3) if ffn == "swiglu" else hidden


def attention_pairs(problem: Problem) -> int:
    """Exact kept (query, key) pairs of one head."""
    return kept_pairs(problem.mask, problem.n_q, problem.n_k)


def attention_flops(problem: Problem, backward: bool | None = None) -> float:
    """Useful FLOPs of one attention call: 4·B·H·D·kept_pairs forward, x3.5 with backward."""
    fwd = 4.0 * problem.batch * problem.heads * problem.head_dim * attention_pairs(problem)
    backward = problem.backward if backward is None else backward
    return fwd * (1 + BACKWARD_FACTOR) if backward else fwd


def _kv_dim(point: Point) -> int:
    return (point.kv_heads or point.heads) * point.head_dim


def linear_flops_per_token(point: Point) -> float:
    """Forward FLOPs per token of a block's dense layers (mixer weights + FFN), no core."""
    d = point.d_model
    if point.mixer == "lstm":
        mixer = LSTM_FLOPS_PER_D2 * d * d
    elif point.mixer == "conv":
        mixer = 2 * point.conv_kernel * d * d
    else:  # W_Q, W_O: d x d; W_K, W_V: d x d_kv
        mixer = 2 * d * (2 * d + 2 * _kv_dim(point))
    hidden = ffn_hidden(d, point.ffn)
    ffn = 2 * d * hidden * (3 if point.ffn == "swiglu" else 2)
    return float(mixer + ffn)


def block_flops(point: Point) -> float:
    """Useful FLOPs of one block call over B·n tokens (forward, or forward+backward)."""
    linear = linear_flops_per_token(point) * point.batch * point.seq_len
    core = attention_flops(point.problem(), backward=False) if point.mixer == "attention" else 0.0
    if point.backward:
        return linear * (1 + LINEAR_BACKWARD_FACTOR) + core * (1 + BACKWARD_FACTOR)
    return linear + core


def _decode():
    """The decode scenario's own cost model (issue 4 owns it; one source of truth)."""
    from harness.scenarios import decode

    return decode


def useful_flops(point: Point) -> float:
    """Useful FLOPs of the timed call of ``point`` (per generated token for ``decode``)."""
    if point.scenario.startswith("attention"):
        return attention_flops(point.problem())
    if point.scenario.startswith("block"):
        return block_flops(point)
    if point.scenario == "decode":
        return _decode().decode_flops_per_token(point)
    raise ValueError(f"no FLOP model for scenario {point.scenario!r}")


def executed_flops(point: Point) -> float:
    """FLOPs really executed where the algorithm does more than the useful work: a decode step
    without a cache recomputes the prefix; attention uses the implementation's own pair count."""
    if point.scenario == "decode":
        return _decode().decode_flops_per_token(point, executed=True)
    if point.scenario.startswith("attention"):
        problem = point.problem()
        count = registry.get(point.impl).cost.executed_pairs
        if count is not None:
            scale = attention_flops(problem) / max(attention_pairs(problem), 1)
            return scale * count(problem)
    return useful_flops(point)


def flop_crossover(
    d_model: int,
    mixer: str = "lstm",
    *,
    kernel: int = 3,
    causal: bool = False,
    projections: bool = False,
) -> float:
    """Sequence length n where a self-attention layer's FLOPs equal the ``mixer`` layer's.

    Per token: attention core 4·n·d (2·n·d causal) plus, with ``projections``, 8·d² for Q/K/V/O;
    LSTM 16·d²; conv 2·k·d². Returns 0 when attention costs more at every n. The textbook
    "self-attention is cheaper when n < d" drops these constants."""
    d = float(d_model)
    other = LSTM_FLOPS_PER_D2 * d * d if mixer == "lstm" else 2 * kernel * d * d
    proj = 8 * d * d if projections else 0.0
    per_key = (2 if causal else 4) * d
    return max((other - proj) / per_key, 0.0)


# --- bytes ---------------------------------------------------------------------------------


def attention_io_bytes(problem: Problem) -> tuple[int, int]:
    """(inputs, output) bytes of one attention call: q, k, v and out (B, H[_kv], n, D)."""
    size = dtype_bytes(problem.dtype)
    q = problem.batch * problem.heads * problem.n_q * problem.head_dim
    kv = 2 * problem.batch * problem.n_kv_heads * problem.n_k * problem.head_dim
    return (q + kv) * size, q * size


def compulsory_bytes(point: Point) -> float:
    """Bytes any implementation must move at least once (read inputs/weights, write outputs):
    the denominator of arithmetic intensity in a roofline."""
    size = dtype_bytes(point.dtype)
    if point.scenario.startswith("attention"):
        inputs, out = attention_io_bytes(point.problem())
        return float((inputs + out) * (3 if point.backward else 1))
    if point.scenario == "decode":  # the decode scenario's own byte model (step_bytes)
        return float(_decode().decode_step_bytes(point))
    weights = block_weight_bytes(point)
    acts = 2 * point.batch * point.seq_len * point.d_model * size
    return float((weights + acts) * (3 if point.backward else 1))


def block_weight_bytes(point: Point) -> int:
    """Parameter bytes of one block: mixer + FFN + norms (+ a learned position table)."""
    d = point.d_model
    if point.mixer == "lstm":
        mixer = 8 * d * d + 8 * d
    elif point.mixer == "conv":
        mixer = point.conv_kernel * d * d + d
    else:  # W_Q, W_O (d x d) and W_K, W_V (d x d_kv), with biases
        kv = _kv_dim(point)
        mixer = 2 * d * d + 2 * d * kv + 2 * d + 2 * kv
    hidden = ffn_hidden(d, point.ffn)
    up = 2 * hidden if point.ffn == "swiglu" else hidden  # SwiGLU: gate and value in one matrix
    ffn = d * up + up + hidden * d + d
    pos = point.seq_len * d if point.pos == "learned" else 0
    return (mixer + ffn + 4 * d + pos) * dtype_bytes(point.dtype)


def cache_bytes(point: Point) -> int:
    """Analytic KV-cache bytes 2·layers·B·H_kv·slots·D·bytes (:mod:`harness.model.kvcache`)."""
    from harness.model.kvcache import analytic_cache_bytes

    return analytic_cache_bytes(point)


# --- predicted peak memory -----------------------------------------------------------------


def attention_workspace(point: Point, problem: Problem | None = None) -> int:
    """The implementation's own ``memory_model`` workspace (0 when it declares none)."""
    problem = problem or point.problem()
    model = registry.get(point.impl).cost.memory_model
    return int(model(problem)) if model is not None else 0


def predict_call_bytes(point: Point) -> int:
    """Predicted peak bytes allocated *by the timed call* (beyond its live inputs): what the
    runner's ``peak_mem_bytes`` measures. Backward doubles the workspace (saved + recomputed
    tensors) and adds gradients the size of the inputs plus the upstream gradient."""
    size = dtype_bytes(point.dtype)
    if point.scenario.startswith("attention"):
        inputs, out = attention_io_bytes(point.problem())
        work = attention_workspace(point)
        return out + work if not point.backward else 2 * out + inputs + 2 * work
    tokens = point.batch * point.seq_len
    d = point.d_model
    hidden = ffn_hidden(d, point.ffn) * (2 if point.ffn == "swiglu" else 1)
    if point.scenario == "decode":  # caches live outside the call; one layer's activations
        step_tokens = point.batch * (point.seq_len + 1 if point.cache == "none" else 1)
        return step_tokens * size * (6 * d + 2 * hidden)
    # live at once (inference): residual + normed input + q/k/v + mixer out, or the FFN hidden
    acts = tokens * size * (6 * d + 2 * hidden)
    work = attention_workspace(point) if point.mixer == "attention" else 4 * tokens * d * size
    if point.backward:  # every activation is saved for the backward pass, then gradients
        return 2 * (acts + work) + block_weight_bytes(point)
    return acts + work


def predict_peak_bytes(point: Point) -> int:
    """Predicted peak bytes of the point in total: inputs (and weights/cache) plus the call's own
    allocations; the runner compares this with a memory budget before running the point."""
    size = dtype_bytes(point.dtype)
    if point.scenario.startswith("attention"):
        inputs, _ = attention_io_bytes(point.problem())
        return inputs + predict_call_bytes(point)
    if point.scenario == "decode":
        return int(_decode().predict_decode_peak_bytes(point))
    x = point.batch * point.seq_len * point.d_model * size
    return block_weight_bytes(point) + x + predict_call_bytes(point)


# --- the work a timed metric measures (for work verdicts and utilization) ------------------


def mixer_flops(point: Point) -> float:
    """Useful FLOPs of the block's mixer alone (what ``mixer_time_s`` times): the attention core
    (its projections run outside the timed call), or the LSTM / conv layer over B·n tokens."""
    if point.mixer == "attention":
        return attention_flops(point.problem())
    d, tokens = point.d_model, point.batch * point.seq_len
    kernel = point.conv_kernel
    per_token = LSTM_FLOPS_PER_D2 * d * d if point.mixer == "lstm" else 2 * kernel * d * d
    return float(per_token * tokens * (1 + LINEAR_BACKWARD_FACTOR if point.backward else 1))


def mixer_bytes(point: Point) -> float:
    """Compulsory bytes of the mixer alone: q, k, v, out for the attention core; the layer's
    weights plus its input and output activations for an LSTM or conv."""
    if point.mixer == "attention":
        inputs, out = attention_io_bytes(point.problem())
        return float((inputs + out) * (3 if point.backward else 1))
    d, size = point.d_model, dtype_bytes(point.dtype)
    weights = (8 * d * d + 8 * d) if point.mixer == "lstm" else (point.conv_kernel * d * d + d)
    acts = 2 * point.batch * point.seq_len * d
    return float((weights + acts) * size * (3 if point.backward else 1))


def metric_work(point: Point, metric: str, kind: str = "flops") -> float:
    """The analytic work behind a row's ``metric``: FLOPs (``kind="flops"``: what the timed call
    executes) or compulsory bytes (``"bytes"``) of the timed call, and for ``peak_mem_bytes``
    the predicted bytes of the call. Raises ValueError for a metric with no model."""
    if metric == "peak_mem_bytes":
        return float(predict_call_bytes(point))
    mixer = metric == "mixer_time_s"
    if metric not in ("time_median_s", "mixer_time_s", "tokens_per_s", "tflops_per_s"):
        raise ValueError(f"no work model for metric {metric!r}")
    if kind == "bytes":
        return mixer_bytes(point) if mixer else compulsory_bytes(point)
    return mixer_flops(point) if mixer else executed_flops(point)
