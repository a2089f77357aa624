"""The block scenario's baselines: an LSTM or a 1-D convolution in the attention mixer's place
(the per-layer cost table of Vaswani et al. 2017, Table 1), as modules and as cost formulas.

Per token, with the constants made explicit: the self-attention core 4·n·d (non-causal),
recurrent (LSTM) 16·d² (4 gates x (W_ih + W_hh)), convolution 2·k·d² (Conv1d d -> d, kernel k):
hence n < d is where attention's O(n²·d) beats recurrence's O(n·d²) up to constants;
:func:`flop_crossover` gives the exact n. FLOPs count a multiply-add as 2.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from harness.model.transformer import BlockConfig

LSTM_FLOPS_PER_D2 = 16  # per token: 4 gates x (W_ih x + W_hh h) x 2 FLOPs


class LSTMMixer(nn.Module):
    """One LSTM layer d -> d over the sequence: O(n·d²), sequential in n."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.lstm = nn.LSTM(cfg.d_model, cfg.d_model, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, N, d) -> (B, N, d), the hidden states."""
        return self.lstm(x)[0]


class ConvMixer(nn.Module):
    """Conv1d(d, d, k): O(k·n·d²). Causal (left-padded) when the block is causal."""

    def __init__(self, cfg: BlockConfig, kernel: int):
        super().__init__()
        self.causal, self.k = cfg.causal, kernel
        self.conv = nn.Conv1d(cfg.d_model, cfg.d_model, kernel)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, N, d) -> (B, N, d)."""
        pad = (self.k - 1, 0) if self.causal else ((self.k - 1) // 2, self.k // 2)
        return self.conv(F.pad(x.transpose(1, 2), pad)).transpose(1, 2)


def mixer_factory(mixer: str, conv_kernel: int) -> Callable[[BlockConfig], nn.Module] | None:
    """What builds the block's mixer: None for attention (the block's own), else the baseline."""
    if mixer == "lstm":
        return LSTMMixer
    if mixer == "conv":
        return lambda cfg: ConvMixer(cfg, conv_kernel)
    return None


def lstm_params(d_model: int) -> int:
    """An LSTM layer d -> d: 4 gates x (W_ih, W_hh) plus their biases."""
    return 8 * d_model * d_model + 8 * d_model


def conv_params(d_model: int, kernel: int) -> int:
    """A Conv1d d -> d with ``kernel`` taps, with bias."""
    return kernel * d_model * d_model + d_model


def lstm_flops(d_model: int) -> int:
    """Forward FLOPs per token of an LSTM layer d -> d."""
    return LSTM_FLOPS_PER_D2 * d_model * d_model


def conv_flops(d_model: int, kernel: int) -> int:
    """Forward FLOPs per token of a Conv1d d -> d with ``kernel`` taps."""
    return 2 * kernel * d_model * d_model


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
    other = lstm_flops(d_model) if mixer == "lstm" else conv_flops(d_model, kernel)
    proj = 8 * d * d if projections else 0.0
    per_key = (2 if causal else 4) * d
    return max((other - proj) / per_key, 0.0)
