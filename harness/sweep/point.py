"""A sweep point: one implementation in one scenario at one shape. Frozen, hashable, stable id.

Every field here is a result-row column with the same name; :meth:`Point.key` is the identity
that compare, resume, shard and merge match on (never the position in a file).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

import torch

from harness.dtypes import DTYPES
from harness.masks import MaskSpec
from harness.spec import Problem
from harness.sweep.problems import step_problem

SCENARIOS = ("attention", "attention+backward", "block", "block+backward", "decode")


@dataclass(frozen=True)
class Point:
    """One sweep point.

    q: (batch, heads, q_len or seq_len, head_dim); k/v: (batch, kv_heads, seq_len, head_dim).
    """

    impl: str
    scenario: str = "attention"
    device: str = "cpu"
    dtype: str = "float32"
    batch: int = 1
    seq_len: int = 1024
    q_len: int | None = None  # queries when != seq_len (keys); attention scenarios only
    heads: int = 8
    kv_heads: int | None = None  # grouped/multi-query K/V; None = heads
    head_dim: int = 64
    causal: bool = False
    window_left: int | None = None  # None = unbounded (no window on that side)
    window_right: int | None = None
    dilation: int = 1
    global_tokens: int = 0
    block_size: int | None = None
    random_blocks: int = 0
    seed: int = 0
    # block scenario
    norm: str = "pre"  # pre | post
    ffn: str = "gelu"  # relu | gelu | swiglu
    pos: str = "rope"  # sinusoidal | learned | rope
    mixer: str = "attention"  # attention | lstm | conv
    conv_kernel: int = 3
    # decode scenario
    layers: int = 2
    cache: str = "full"  # none | full | rolling
    gen_tokens: int = 8

    @property
    def d_model(self) -> int:
        return self.heads * self.head_dim

    @property
    def n_q(self) -> int:
        return self.seq_len if self.q_len is None else self.q_len

    @property
    def backward(self) -> bool:
        return self.scenario.endswith("+backward")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def mask(self) -> MaskSpec:
        window = None
        if self.window_left is not None or self.window_right is not None:
            window = (self.window_left, self.window_right)
        return MaskSpec(
            causal=self.causal,
            window=window,
            dilation=self.dilation,
            global_tokens=self.global_tokens,
            block_size=self.block_size,
            random_blocks=self.random_blocks,
            seed=self.seed,
        )

    def problem(self) -> Problem:
        """The attention call this point makes (per layer, for block/decode scenarios).

        For ``decode`` that is one timed generation step (n_q = 1 over the cached keys, or the
        whole prefix when ``cache = "none"``).
        """
        if self.scenario == "decode":
            return step_problem(self)
        return Problem(
            batch=self.batch,
            heads=self.heads,
            n_q=self.n_q,
            n_k=self.seq_len,
            head_dim=self.head_dim,
            dtype=self.torch_dtype,
            device=self.device,
            mask=self.mask,
            backward=self.backward,
            kv_heads=self.kv_heads,
        )

    def key(self) -> tuple:
        """Identity for matching rows across runs: every field, in declaration order."""
        return tuple(getattr(self, f.name) for f in fields(self))

    @property
    def point_id(self) -> str:
        """A short stable hash of :meth:`key` (same point -> same id on every machine)."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:12]

    def columns(self) -> dict:
        """The point's row columns (fields plus derived d_model)."""
        return {**asdict(self), "d_model": self.d_model, "point_id": self.point_id}

    def label(self) -> str:
        """Short human label for progress bars and logs."""
        mask = self.mask.describe()
        return (
            f"{self.impl} {self.scenario} n={self.seq_len} B={self.batch} H={self.heads} "
            f"D={self.head_dim} {self.dtype} {mask}"
        )


POINT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Point))


def point_from_row(row: dict) -> Point:
    """Rebuild a Point from a result row (extra columns ignored, NaN -> None)."""
    values = {}
    for name in POINT_FIELDS:
        if name not in row:
            continue
        value = row[name]
        if isinstance(value, float) and value != value:  # NaN from pandas
            value = None
        values[name] = value
    for name in ("q_len", "kv_heads", "window_left", "window_right", "block_size"):
        if values.get(name) is not None:
            values[name] = int(values[name])
    for name in (
        "batch",
        "seq_len",
        "heads",
        "head_dim",
        "dilation",
        "global_tokens",
        "random_blocks",
        "seed",
        "conv_kernel",
        "layers",
        "gen_tokens",
    ):
        if values.get(name) is not None:
            values[name] = int(values[name])
    if "causal" in values:
        values["causal"] = bool(values["causal"])
    return Point(**values)
