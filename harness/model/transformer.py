"""The common transformer block every attention core is plugged into.

``x + Mixer(LN(x))`` then ``x + FFN(LN(x))`` (pre-LN, Xiong et al. 2020), or
``LN(x + Mixer(x))`` then ``LN(x + FFN(x))`` (post-LN, Vaswani et al. 2017). The mixer is
multi-head attention with a pluggable core ``(q, k, v) -> out`` on (B, H, N, D) tensors, or a
module a caller gives in its place (the block scenario's LSTM / convolution baselines,
:mod:`harness.scenarios.block.mixers`).
Positional encodings: sinusoidal or learned (added to the input), or RoPE (rotating q and k).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.model import FFNS, NORMS, POSITIONS
from harness.spec import AttnFn


@dataclass(frozen=True)
class BlockConfig:
    """Block hyper-parameters; ``d_model = heads * head_dim``."""

    heads: int
    head_dim: int
    kv_heads: int | None = None
    norm: str = "pre"
    ffn: str = "gelu"
    pos: str = "rope"
    causal: bool = False
    max_len: int = 4096
    ffn_mult: int = 4

    @classmethod
    def of(cls, point, *, causal: bool, max_len: int) -> BlockConfig:
        """A block of ``point``'s shape (its ``heads``, ``head_dim``, ``kv_heads``) laid out as
        its ``settings`` say: every settings field that is a BlockConfig field (the block and
        decode scenarios' ``norm``, ``ffn``, ``pos``)."""
        layout = {
            f.name: getattr(point.settings, f.name)
            for f in fields(cls)
            if hasattr(point.settings, f.name)
        }
        return cls(
            heads=point.heads,
            head_dim=point.head_dim,
            kv_heads=point.kv_heads,
            causal=causal,
            max_len=max_len,
            **layout,
        )

    @property
    def d_model(self) -> int:
        return self.heads * self.head_dim

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn_hidden(self) -> int:
        """SwiGLU keeps the parameter count of a 4x MLP: hidden = 2/3 * 4d (LLaMA)."""
        hidden = self.ffn_mult * self.d_model
        return int(2 * hidden / 3) if self.ffn == "swiglu" else hidden


def sinusoidal_table(n: int, d: int) -> Tensor:
    """(n, d) sin/cos table of Vaswani et al. (2017), section 3.5."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(10000.0) / d))
    table = torch.zeros(n, d, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : d // 2]
    return table


def rope(x: Tensor, positions: Tensor) -> Tensor:
    """Rotary embedding (Su et al. 2021), rotate-half form. x: (B, H, N, D), positions: (N,)."""
    d = x.shape[-1]
    half = d // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (N, half)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


class MultiHeadAttention(nn.Module):
    """W_Q, W_K, W_V, W_O around a pluggable core; K/V may have fewer heads (GQA/MQA)."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
        self.wq, self.wk, self.wv = nn.Linear(d, d), nn.Linear(d, kv), nn.Linear(d, kv)
        self.wo = nn.Linear(d, d)

    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, N, d_model) -> q (B, H, N, D), k and v (B, H_kv, N, D); RoPE applied if set."""
        b, n, _ = x.shape
        c = self.cfg
        q = self.wq(x).view(b, n, c.heads, c.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, n, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, n, c.n_kv_heads, c.head_dim).transpose(1, 2)
        if c.pos == "rope":
            q, k = rope(q, positions), rope(k, positions)
        return q, k, v

    def merge(self, out: Tensor) -> Tensor:
        """(B, H, N, D) -> (B, N, d_model) through W_O."""
        b, _, n, _ = out.shape
        return self.wo(out.transpose(1, 2).reshape(b, n, self.cfg.d_model))

    def forward(self, x: Tensor, core: AttnFn, positions: Tensor) -> Tensor:
        q, k, v = self.project(x, positions)
        return self.merge(core(q, k, v))


class FeedForward(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.kind = cfg.ffn
        d, h = cfg.d_model, cfg.ffn_hidden
        self.up = nn.Linear(d, 2 * h if cfg.ffn == "swiglu" else h)
        self.down = nn.Linear(h, d)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)
        if self.kind == "swiglu":
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        else:
            h = F.relu(h) if self.kind == "relu" else F.gelu(h)
        return self.down(h)


MixerFactory = Callable[[BlockConfig], nn.Module]  # cfg -> a module x (B, N, d) -> (B, N, d)


class TransformerBlock(nn.Module):
    """One block; ``forward(x, core)`` with x: (B, N, d_model) -> (B, N, d_model). The mixer is
    multi-head attention around ``core``, or what ``mixer`` builds (it takes x alone)."""

    def __init__(self, cfg: BlockConfig, mixer: MixerFactory | None = None):
        super().__init__()
        for value, allowed in ((cfg.norm, NORMS), (cfg.ffn, FFNS), (cfg.pos, POSITIONS)):
            if value not in allowed:
                raise ValueError(f"{value!r} not one of {allowed}")
        self.cfg = cfg
        d = cfg.d_model
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attends = mixer is None
        self.mixer: nn.Module = MultiHeadAttention(cfg) if mixer is None else mixer(cfg)
        self.ffn = FeedForward(cfg)
        if cfg.pos == "learned":
            self.pos_table = nn.Parameter(torch.randn(cfg.max_len, d) * 0.02)
        elif cfg.pos == "sinusoidal":
            self.register_buffer(
                "pos_table", sinusoidal_table(cfg.max_len, d).float(), persistent=False
            )

    def embed(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Add an absolute positional encoding (sinusoidal/learned); RoPE acts inside attention.
        ``positions`` (N,) on the device, when given, replaces ``offset`` (CUDA-graph safe)."""
        if self.cfg.pos == "rope":
            return x
        if positions is not None:  # no bounds check: it would read the device (a host sync)
            return x + self.pos_table.index_select(0, positions).to(x.dtype)
        n = x.shape[1]
        if offset + n > self.pos_table.shape[0]:
            raise ValueError(f"sequence of {offset + n} exceeds max_len={self.pos_table.shape[0]}")
        return x + self.pos_table[offset : offset + n].to(x.dtype)

    def mix(self, x: Tensor, core: AttnFn | None, positions: Tensor) -> Tensor:
        return self.mixer(x, core, positions) if self.attends else self.mixer(x)

    def forward(self, x: Tensor, core: AttnFn | None = None, offset: int | Tensor = 0) -> Tensor:
        """``offset``: the first token's position, a Python int or a (1,) long tensor on the
        device (read there, so a captured CUDA graph can replay at a new position)."""
        if isinstance(offset, Tensor):
            positions = offset + torch.arange(x.shape[1], device=x.device)
            x = self.embed(x, positions=positions)
        else:
            positions = torch.arange(offset, offset + x.shape[1], device=x.device)
            x = self.embed(x, offset)
        if self.cfg.norm == "pre":
            x = x + self.mix(self.ln1(x), core, positions)
            return x + self.ffn(self.ln2(x))
        x = self.ln1(x + self.mix(x, core, positions))
        return self.ln2(x + self.ffn(x))


def build_block(
    cfg: BlockConfig,
    seed: int,
    device: str,
    dtype: torch.dtype,
    mixer: MixerFactory | None = None,
) -> TransformerBlock:
    """A block with seeded weights (same seed -> same weights on every device)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = TransformerBlock(cfg, mixer)
    return block.to(device=device, dtype=dtype)
