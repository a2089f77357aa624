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

Decode points are :mod:`harness.cost.decode`'s model; parameter counts, per-token FLOPs and
activations of the block's parts are :mod:`harness.cost.components`.
"""

from __future__ import annotations

from harness import registry
from harness.cost.components import (
    LSTM_FLOPS_PER_D2,
    activation_bytes,
    attention_params,
    attention_workspace,
    conv_params,
    ffn_flops,
    ffn_params,
    kv_dim,
    lstm_params,
    projection_flops,
)
from harness.cost.decode import (
    decode_call_bytes,
    decode_flops_per_token,
    decode_step_bytes,
    predict_decode_peak_bytes,
)
from harness.dtypes import itemsize
from harness.masks import kept_pairs
from harness.spec import Problem
from harness.sweep.point import Point

BACKWARD_FACTOR = 2.5  # attention backward / forward FLOPs (FlashAttention benchmark convention)
LINEAR_BACKWARD_FACTOR = 2.0  # dX and dW, each as costly as the forward matmul


def attention_pairs(problem: Problem) -> int:
    """Exact kept (query, key) pairs of one head."""
    return kept_pairs(problem.mask, problem.n_q, problem.n_k)


def attention_flops(problem: Problem, backward: bool | None = None) -> float:
    """Useful FLOPs of one attention call: 4·B·H·D·kept_pairs forward, x3.5 with backward."""
    fwd = 4.0 * problem.batch * problem.heads * problem.head_dim * attention_pairs(problem)
    backward = problem.backward if backward is None else backward
    return fwd * (1 + BACKWARD_FACTOR) if backward else fwd


def linear_flops_per_token(point: Point) -> float:
    """Forward FLOPs per token of a block's dense layers (mixer weights + FFN), no core."""
    d = point.d_model
    if point.mixer == "lstm":
        mixer = LSTM_FLOPS_PER_D2 * d * d
    elif point.mixer == "conv":
        mixer = 2 * point.conv_kernel * d * d
    else:  # W_Q, W_O: d x d; W_K, W_V: d x d_kv
        mixer = projection_flops(d, kv_dim(point))
    return float(mixer + ffn_flops(d, point.ffn))


def block_flops(point: Point) -> float:
    """Useful FLOPs of one block call over B·n tokens (forward, or forward+backward)."""
    linear = linear_flops_per_token(point) * point.batch * point.seq_len
    core = attention_flops(point.problem(), backward=False) if point.mixer == "attention" else 0.0
    if point.backward:
        return linear * (1 + LINEAR_BACKWARD_FACTOR) + core * (1 + BACKWARD_FACTOR)
    return linear + core


def useful_flops(point: Point) -> float:
    """Useful FLOPs of the timed call of ``point`` (per generated token for ``decode``)."""
    if point.scenario.startswith("attention"):
        return attention_flops(point.problem())
    if point.scenario.startswith("block"):
        return block_flops(point)
    if point.scenario == "decode":
        return decode_flops_per_token(point)
    raise ValueError(f"no FLOP model for scenario {point.scenario!r}")


def executed_flops(point: Point) -> float:
    """FLOPs really executed where the algorithm does more than the useful work: a decode step
    without a cache recomputes the prefix; attention uses the implementation's own pair count."""
    if point.scenario == "decode":
        return decode_flops_per_token(point, executed=True)
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
    size = itemsize(problem.dtype)
    q = problem.batch * problem.heads * problem.n_q * problem.head_dim
    kv = 2 * problem.batch * problem.n_kv_heads * problem.n_k * problem.head_dim
    return (q + kv) * size, q * size


def compulsory_bytes(point: Point) -> float:
    """Bytes any implementation must move at least once (read inputs/weights, write outputs):
    the denominator of arithmetic intensity in a roofline."""
    size = itemsize(point.dtype)
    if point.scenario.startswith("attention"):
        inputs, out = attention_io_bytes(point.problem())
        return float((inputs + out) * (3 if point.backward else 1))
    if point.scenario == "decode":  # the decode scenario's step_bytes
        return float(decode_step_bytes(point))
    weights = block_weight_bytes(point)
    acts = 2 * point.batch * point.seq_len * point.d_model * size
    return float((weights + acts) * (3 if point.backward else 1))


def block_weight_bytes(point: Point) -> int:
    """Parameter bytes of one block: mixer + FFN + norms (+ a learned position table)."""
    d = point.d_model
    if point.mixer == "lstm":
        mixer = lstm_params(d)
    elif point.mixer == "conv":
        mixer = conv_params(d, point.conv_kernel)
    else:  # W_Q, W_O (d x d) and W_K, W_V (d x d_kv), with biases
        mixer = attention_params(d, kv_dim(point))
    pos = point.seq_len * d if point.pos == "learned" else 0
    return (mixer + ffn_params(d, point.ffn) + 4 * d + pos) * itemsize(point.dtype)


# --- predicted peak memory -----------------------------------------------------------------


def predict_call_bytes(point: Point) -> int:
    """Predicted peak bytes allocated *by the timed call* (beyond its live inputs): what the
    runner's ``peak_mem_bytes`` measures. Backward doubles the workspace (saved + recomputed
    tensors) and adds gradients the size of the inputs plus the upstream gradient."""
    size = itemsize(point.dtype)
    if point.scenario.startswith("attention"):
        inputs, out = attention_io_bytes(point.problem())
        work = attention_workspace(point)
        return out + work if not point.backward else 2 * out + inputs + 2 * work
    if point.scenario == "decode":  # caches live outside the call; one layer's activations
        return decode_call_bytes(point)
    tokens = point.batch * point.seq_len
    d = point.d_model
    acts = activation_bytes(tokens, d, point.ffn, size)  # live at once (inference)
    work = attention_workspace(point) if point.mixer == "attention" else 4 * tokens * d * size
    if point.backward:  # every activation is saved for the backward pass, then gradients
        return 2 * (acts + work) + block_weight_bytes(point)
    return acts + work


def predict_peak_bytes(point: Point) -> int:
    """Predicted peak bytes of the point in total: inputs (and weights/cache) plus the call's own
    allocations; the runner compares this with a memory budget before running the point."""
    size = itemsize(point.dtype)
    if point.scenario.startswith("attention"):
        inputs, _ = attention_io_bytes(point.problem())
        return inputs + predict_call_bytes(point)
    if point.scenario == "decode":
        return int(predict_decode_peak_bytes(point))
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
    d, size = point.d_model, itemsize(point.dtype)
    weights = lstm_params(d) if point.mixer == "lstm" else conv_params(d, point.conv_kernel)
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
