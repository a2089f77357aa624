"""The shared cost formulas every scenario's cost model adds up: the attention core (FLOPs from
the exact kept-pair count, bytes in and out, the implementation's own workspace) and the parts
of a transformer block (parameter counts, per-token FLOPs, live activations). The block
scenario's LSTM and convolution baselines keep their own formulas beside their modules
(:mod:`harness.scenarios.block.mixers`).

FLOPs count a multiply-add as 2. Attention forward is ``4·B·H·D`` per kept (query, key) pair
(QKᵀ and PV, 2·D each), from the exact kept-pair count of :func:`harness.masks.kept_pairs`
(causal n=4 keeps 10 pairs, not 8); softmax is not counted (FlashAttention's convention). An
implementation whose work is not the kept pairs (a linear-complexity approximation) declares its
own forward count (:attr:`harness.spec.Cost.flops`), which replaces it. Backward is 2.5x forward
(FlashAttention's benchmarks: 2 matmuls recomputed + 3 gradients over the 2 of forward), so a
timed forward + backward counts 3.5x. Linear layers (projections, FFN) count
2·in·out per token forward, 2x that backward.

Widths as :class:`harness.model.transformer.BlockConfig` builds them (``d = heads · head_dim``,
``d_kv = kv_heads · head_dim``); counts are elements unless a name says bytes.
"""

from __future__ import annotations

from harness import registry
from harness.cost import memory_law
from harness.masks import kept_pairs
from harness.spec import Problem, itemsize

BACKWARD_FACTOR = 2.5  # attention backward / forward FLOPs (FlashAttention benchmark convention)
LINEAR_BACKWARD_FACTOR = 2.0  # dX and dW, each as costly as the forward matmul
FFN_MULT = 4  # hidden = 4·d for relu/gelu; SwiGLU uses 2/3 of that in three matrices

# --- the attention core --------------------------------------------------------------------


def attention_pairs(problem: Problem) -> int:
    """Exact kept (query, key) pairs of one head."""
    return kept_pairs(problem.mask, problem.n_q, problem.n_k)


def attention_flops(impl: str, problem: Problem, backward: bool | None = None) -> float:
    """Useful FLOPs of one call of ``impl``'s core: its own declared forward count, else
    4·B·H·D·kept_pairs; x3.5 with backward (``backward`` None: the problem's own)."""
    own = registry.get(impl).cost.flops
    if own is not None:
        fwd = float(own(problem))
    else:
        fwd = 4.0 * problem.batch * problem.heads * problem.head_dim * attention_pairs(problem)
    backward = problem.backward if backward is None else backward
    return fwd * (1 + BACKWARD_FACTOR) if backward else fwd


def executed_attention_flops(impl: str, problem: Problem) -> float:
    """FLOPs ``impl`` really executes for ``problem``: its declared pair count at block
    granularity (``Cost.executed_pairs``) at the useful FLOPs per pair; else the useful FLOPs."""
    useful = attention_flops(impl, problem)
    cost = registry.get(impl).cost
    if cost.executed_pairs is None or cost.flops is not None:
        return useful
    return useful / max(attention_pairs(problem), 1) * cost.executed_pairs(problem)


def attention_io_bytes(impl: str, problem: Problem) -> tuple[int, int]:
    """(inputs, output) bytes of one attention call: q, k, v (B, H[_kv], n, D) plus what the
    method itself must read (``Cost.io_bytes``: e.g. projection matrices), and out."""
    size = itemsize(problem.dtype)
    q = problem.batch * problem.heads * problem.n_q * problem.head_dim
    kv = 2 * problem.batch * problem.n_kv_heads * problem.n_k * problem.head_dim
    own = registry.get(impl).cost.io_bytes
    extra = int(own(problem)) if own is not None else 0
    return (q + kv) * size + extra, q * size


LSE_BYTES = 4  # the per-row log-sum-exp a backward reads: fp32


def attention_tensor_bytes(problem: Problem) -> dict[str, int]:
    """Bytes of each tensor of one attention call: ``q`` and ``out`` (B, H, n_q, D), ``k`` and
    ``v`` (B, H_kv, n_k, D) in the problem's dtype (their gradients and ``dout`` are the same
    sizes), and ``lse``, the fp32 row log-sum-exp (B, H, n_q) that a backward reads."""
    size = itemsize(problem.dtype)
    rows = problem.batch * problem.heads * problem.n_q
    kv = problem.batch * problem.n_kv_heads * problem.n_k * problem.head_dim * size
    return {"q": rows * problem.head_dim * size, "k": kv, "v": kv,
            "out": rows * problem.head_dim * size, "lse": rows * LSE_BYTES}


def attention_bytes(impl: str, problem: Problem, backward: bool | None = None) -> int:
    """Compulsory bytes of one call of ``impl``'s core (the memory roofline's floor): forward
    reads q, k, v (and what the method itself must read, ``Cost.io_bytes``) once and writes out.
    With backward the forward also writes the row lse, and the backward reads q, k, v, out, dout
    and lse once and writes dq, dk, dv (FlashAttention's two passes; ``backward`` None: the
    problem's own)."""
    inputs, out = attention_io_bytes(impl, problem)
    backward = problem.backward if backward is None else backward
    if not backward:
        return inputs + out
    t = attention_tensor_bytes(problem)
    qkv = t["q"] + t["k"] + t["v"]
    return inputs + out + t["lse"] + (qkv + 2 * t["out"] + t["lse"]) + qkv


def bandwidth_fraction(nbytes: float, seconds: float, bandwidth: float) -> float:
    """Bytes moved per second as a fraction of a bandwidth (bytes/s): the memory roofline's
    utilization of a call that moves ``nbytes`` in ``seconds``."""
    return nbytes / seconds / bandwidth


def attention_workspace(impl: str, problem: Problem) -> int:
    """The implementation's workspace in bytes for ``problem``: its ``memory_model``, else its
    declared memory exponent calibrated on a measured short call where one may be made, else 0
    (:mod:`harness.cost.memory_law`, which also says how: ``mem_prediction``)."""
    return memory_law.workspace(impl, problem).nbytes


# --- the parts of a block ------------------------------------------------------------------


def ffn_hidden(d_model: int, ffn: str) -> int:
    """FFN hidden width as ``harness.model.transformer.BlockConfig`` builds it: 4·d; SwiGLU
    int(2/3·4·d)."""
    hidden = FFN_MULT * d_model
    return int(2 * hidden / 3) if ffn == "swiglu" else hidden


def ffn_up_width(d_model: int, ffn: str) -> int:
    """Outputs of the FFN's first matrix: the hidden width, twice for SwiGLU (gate and value)."""
    hidden = ffn_hidden(d_model, ffn)
    return 2 * hidden if ffn == "swiglu" else hidden


def kv_dim(heads: int, kv_heads: int | None, head_dim: int) -> int:
    """Width of K (and of V): H_kv · D (H_kv = heads without grouped K/V)."""
    return (kv_heads or heads) * head_dim


def attention_params(d_model: int, d_kv: int) -> int:
    """W_Q, W_O (d x d) and W_K, W_V (d x d_kv), with biases."""
    return 2 * d_model * d_model + 2 * d_model * d_kv + 2 * d_model + 2 * d_kv


def ffn_params(d_model: int, ffn: str) -> int:
    """The FFN's two matrices and biases (SwiGLU: gate and value in one up matrix)."""
    hidden, up = ffn_hidden(d_model, ffn), ffn_up_width(d_model, ffn)
    return d_model * up + up + hidden * d_model + d_model


def block_params(d_model: int, mixer_params: int, ffn: str, position_rows: int = 0) -> int:
    """One block's parameters: its mixer's, the FFN's, two LayerNorms (weight and bias: 4·d)
    and a learned position table of ``position_rows`` rows (0: sinusoidal or RoPE)."""
    return mixer_params + ffn_params(d_model, ffn) + 4 * d_model + position_rows * d_model


def attention_linear_flops(d_model: int, d_kv: int, ffn: str) -> int:
    """Forward FLOPs per token of an attention block's linear layers: W_Q/K/V/O and the FFN."""
    return projection_flops(d_model, d_kv) + ffn_flops(d_model, ffn)


def projection_flops(d_model: int, d_kv: int) -> int:
    """Forward FLOPs per token of W_Q, W_O (d x d) and W_K, W_V (d x d_kv)."""
    return 2 * d_model * (2 * d_model + 2 * d_kv)


def ffn_flops(d_model: int, ffn: str) -> int:
    """Forward FLOPs per token of the FFN: 2·d·hidden per matrix, three matrices for SwiGLU."""
    return 2 * d_model * ffn_hidden(d_model, ffn) * (3 if ffn == "swiglu" else 2)


def activation_bytes(tokens: int, d_model: int, ffn: str, size: int) -> int:
    """Activations of one block live at once in inference over ``tokens`` tokens of ``size``
    bytes: residual + normed input + q/k/v + mixer out (6·d), or the FFN hidden (2·up)."""
    return tokens * size * (6 * d_model + 2 * ffn_up_width(d_model, ffn))
