"""Costs of a block's components, the pieces every scenario's model adds up: parameter counts
and per-token FLOPs of the dense layers, live activations, and the attention core's workspace.

Widths as :class:`harness.model.transformer.BlockConfig` builds them (``d = heads · head_dim``,
``d_kv = kv_heads · head_dim``); FLOPs count a multiply-add as 2; counts are elements, not bytes.
"""

from __future__ import annotations

from harness import registry
from harness.spec import Problem

LSTM_FLOPS_PER_D2 = 16  # per token: 4 gates x (W_ih x + W_hh h) x 2 FLOPs
FFN_MULT = 4  # hidden = 4·d for relu/gelu; SwiGLU uses 2/3 of that in three matrices


def ffn_hidden(d_model: int, ffn: str) -> int:
    """FFN hidden width as ``harness.model.transformer.BlockConfig`` builds it: 4·d; SwiGLU
    int(2/3·4·d)."""
    hidden = FFN_MULT * d_model
    return int(2 * hidden / 3) if ffn == "swiglu" else hidden


def ffn_up_width(d_model: int, ffn: str) -> int:
    """Outputs of the FFN's first matrix: the hidden width, twice for SwiGLU (gate and value)."""
    hidden = ffn_hidden(d_model, ffn)
    return 2 * hidden if ffn == "swiglu" else hidden


def kv_dim(point) -> int:
    """Width of K (and of V): H_kv · D (H_kv = heads without grouped K/V)."""
    return (point.kv_heads or point.heads) * point.head_dim


def attention_params(d_model: int, d_kv: int) -> int:
    """W_Q, W_O (d x d) and W_K, W_V (d x d_kv), with biases."""
    return 2 * d_model * d_model + 2 * d_model * d_kv + 2 * d_model + 2 * d_kv


def lstm_params(d_model: int) -> int:
    """An LSTM layer d -> d: 4 gates x (W_ih, W_hh) plus their biases."""
    return 8 * d_model * d_model + 8 * d_model


def conv_params(d_model: int, kernel: int) -> int:
    """A Conv1d d -> d with ``kernel`` taps, with bias."""
    return kernel * d_model * d_model + d_model


def ffn_params(d_model: int, ffn: str) -> int:
    """The FFN's two matrices and biases (SwiGLU: gate and value in one up matrix)."""
    hidden, up = ffn_hidden(d_model, ffn), ffn_up_width(d_model, ffn)
    return d_model * up + up + hidden * d_model + d_model


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


def attention_workspace(point, problem: Problem | None = None) -> int:
    """The implementation's own ``memory_model`` workspace in bytes for ``problem`` (the
    point's own call by default); 0 when it declares none."""
    problem = problem or point.problem()
    model = registry.get(point.impl).cost.memory_model
    return int(model(problem)) if model is not None else 0
