"""What an implementation declares about itself: capabilities, claimed cost, problem shapes.

This module and :mod:`harness.masks` and :mod:`harness.registry` are the public surface that
implementation plug-ins import; nothing here touches a device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from harness.masks import MaskSpec

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
"""The floating-point dtypes a point may use, by the name suites and rows spell."""
FLOAT_DTYPES = frozenset(DTYPES.values())
HALF_DTYPES = frozenset({torch.float16, torch.bfloat16})


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a name from :data:`DTYPES` (a torch dtype passes through)."""
    return DTYPES[dtype] if isinstance(dtype, str) else dtype


def itemsize(dtype: str | torch.dtype) -> int:
    """Bytes per element of a dtype name (``"bfloat16"`` -> 2) or torch dtype."""
    return torch_dtype(dtype).itemsize


AttnFn = Callable[[Tensor, Tensor, Tensor], Tensor]
"""A prepared attention call: (q, k, v) -> out, the mask already bound."""

MASK_FEATURES = frozenset(
    {
        "causal",
        "window",
        "dilation",
        "global",  # global tokens (the first g positions, or named positions)
        "global_positions",  # global tokens at named positions, not just the first g
        "block_sparse",
        "documents",  # packed documents (block-diagonal)
        "prefix",  # prefix-LM: a bidirectional prefix
        # plug-in predicate features (mask_features.predicate): the path evaluates the whole
        # dense rule per element in its partial blocks, so an extra AND clause reaches it
        "predicate",
    }
)
ParamValue = int | float


@dataclass(frozen=True)
class Param:
    """A method parameter an implementation declares (Performer's random features, Linformer's
    projected length, a chunk size): its default, its bounds and a one-line doc. Suites set and
    sweep it by name; rows carry it as a column of that name."""

    default: ParamValue
    doc: str
    minimum: ParamValue | None = None
    maximum: ParamValue | None = None
    integer: bool = True

    def reasons(self, name: str, value: object) -> list[str]:
        """Why ``value`` is not a valid value of this parameter (empty = it is)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return [f"{name} must be a number, got {value!r}"]
        if self.integer and not float(value).is_integer():
            return [f"{name} must be a whole number, got {value!r}"]
        if self.minimum is not None and value < self.minimum:
            return [f"{name} = {value} is below its minimum {self.minimum}"]
        if self.maximum is not None and value > self.maximum:
            return [f"{name} = {value} is above its maximum {self.maximum}"]
        return []


@dataclass(frozen=True)
class Problem:
    """One attention call's shapes.

    q: (batch, heads, n_q, head_dim), k/v: (batch, kv_heads, n_k, head_dim).
    """

    batch: int
    heads: int
    n_q: int
    n_k: int
    head_dim: int
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    mask: MaskSpec = field(default_factory=MaskSpec)
    backward: bool = False
    kv_heads: int | None = None
    params: tuple[tuple[str, ParamValue], ...] = ()  # method parameters, sorted by name

    @property
    def n_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def device_type(self) -> str:
        return torch.device(self.device).type

    def param(self, name: str, default: ParamValue | None = None) -> ParamValue | None:
        """The value of method parameter ``name`` in this call (``default`` when unset)."""
        return dict(self.params).get(name, default)


@dataclass(frozen=True)
class Capabilities:
    """What an implementation can run; checked before a point runs (xformers ``fmha`` style)."""

    devices: frozenset[str] = frozenset({"cpu", "cuda"})
    dtypes: frozenset[torch.dtype] = FLOAT_DTYPES
    mask_features: frozenset[str] = frozenset({"causal"})
    unequal_lengths: bool = True  # n_q != n_k with bottom-right alignment
    backward: bool = True
    grouped_kv: bool = False  # kv_heads < heads without the caller repeating K/V
    max_head_dim: int | None = None
    head_dim_multiple: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", frozenset(self.devices))
        object.__setattr__(self, "dtypes", frozenset(self.dtypes))
        unknown = set(self.mask_features) - MASK_FEATURES
        if unknown:
            raise ValueError(
                f"unknown mask features {sorted(unknown)}; known: {sorted(MASK_FEATURES)}"
            )
        object.__setattr__(self, "mask_features", frozenset(self.mask_features))

    def reasons(self, problem: Problem) -> list[str]:
        """Readable reasons why ``problem`` is outside these capabilities (empty = supported)."""
        out = []
        if problem.device_type not in self.devices:
            out.append(f"device {problem.device_type} not in {sorted(self.devices)}")
        if problem.dtype not in self.dtypes:
            names = sorted(str(d).removeprefix("torch.") for d in self.dtypes)
            out.append(f"dtype {str(problem.dtype).removeprefix('torch.')} not in {names}")
        missing = problem.mask.features - self.mask_features
        # a plug-in feature runs where the capability it rides on does (mask_features.visible_runs)
        needs = problem.mask.plugin_needs
        missing -= {name for name, need in needs.items() if need in self.mask_features}
        if missing:
            out.append(f"mask features {sorted(missing)} not supported")
        if problem.n_q != problem.n_k and not self.unequal_lengths:
            out.append("n_q != n_k not supported")
        if problem.backward and not self.backward:
            out.append("no backward pass")
        if problem.n_kv_heads != problem.heads and not self.grouped_kv:
            out.append("grouped/multi-query K/V not supported")
        if self.max_head_dim is not None and problem.head_dim > self.max_head_dim:
            out.append(f"head_dim {problem.head_dim} > max {self.max_head_dim}")
        if problem.head_dim % self.head_dim_multiple:
            out.append(f"head_dim {problem.head_dim} not a multiple of {self.head_dim_multiple}")
        return out


@dataclass(frozen=True)
class Cost:
    """Claimed asymptotic cost in n (sequence length) at fixed window/heads/head_dim.

    ``memory_model(problem) -> bytes`` predicts the extra peak memory of one call beyond its
    inputs and output (the workspace); used to skip points over a memory budget. Every model
    here must be closed-form or O(number of blocks) in n, never O(n²): predictions run before
    a point, for any n.

    ``flops(problem) -> FLOPs`` is the method's own forward FLOP count of one call, for methods
    whose work is not 4·B·H·D per kept (query, key) pair (linear-complexity approximations);
    None = the kept-pair count. ``io_bytes(problem) -> bytes`` likewise for the compulsory
    bytes beyond q, k, v and the output (e.g. Linformer's projection matrices); None = 0.
    """

    time_exponent: float
    memory_exponent: float
    memory_model: Callable[[Problem], int] | None = None
    executed_pairs: Callable[[Problem], int] | None = (
        None  # pairs really computed (block granularity)
    )
    flops: Callable[[Problem], float] | None = None
    io_bytes: Callable[[Problem], int] | None = None


class RecurrentState(Protocol):
    """The fixed-size state of a recurrent attention (linear attention's ``[S | z]``) for one
    batch of sequences: ``advance`` reads and extends it, so decoding needs no KV cache."""

    def advance(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The next t tokens: q (B, H, t, D), k/v (B, H_kv, t, D), causal among themselves and
        after every token advanced so far -> their outputs (B, H, t, D). Updates the state in
        place; costs O(t), not O(tokens so far)."""
        ...

    def tensors(self) -> list[Tensor]:
        """The tensors that make up the state (their storage is the state's memory)."""
        ...


@dataclass(frozen=True)
class Recurrence:
    """A causal implementation's recurrent form (``cache = "state"`` decoding): a state of fixed
    size replaces the KV cache, so a decode step is O(1) in the context length.

    ``new_state(problem, **params)``: an empty state for the problem's batch, heads, kv_heads,
    head_dim, dtype and device (``mask.seed`` seeds random features; ``params`` are the
    implementation's method parameters, defaults filled). ``state_bytes(problem)``: its size
    in bytes, closed-form (what ``tensors()`` hold).
    """

    new_state: Callable[..., RecurrentState]
    state_bytes: Callable[[Problem], int]


PagedFn = Callable[..., Tensor]
"""``fn(q, k_pages, v_pages, block_table, context_lens, scale=None) -> out``: one decode step of
a batch of sequences of different lengths over a paged KV cache, in the layout of
:mod:`harness.paged` (q (B, H, q_len, D); pages (P, page_size, H_kv, D); block_table (B,
max_pages) int32; context_lens (B,) int32 including the step's q_len tokens) -> (B, H, q_len,
D), causal within the step, bottom-right aligned per sequence."""


@dataclass(frozen=True)
class Paged:
    """An implementation's decode step over a paged KV cache (the decode scenario's ``cache =
    "paged"``, and a contiguous cache of a ragged batch, held as one page per sequence).

    ``fn``: :data:`PagedFn`. ``padded``: it computes every sequence padded to the longest
    (B·max keys, a mask hiding the padding) rather than over the real keys (Σ lengths).
    ``devices``: where this form runs when narrower than the implementation's (a fused kernel:
    ``{"cuda"}``). ``availability()``: why it cannot run here (None: it can), beside the
    implementation's own. ``caps``: the form's own capabilities when they differ from the
    implementation's (a kernel that is GQA-aware where the core is not); ``page_multiple``:
    page sizes it takes (flash-attn's paged KV: multiples of 256); ``max_q_len``: the most
    tokens a step may hold per sequence (None: any); ``layouts``: the pools it reads
    (``kv_layout``: "NHD", pages (P, page, H_kv, D) in memory, and "HND", (P, H_kv, page, D),
    given to it as (P, page, H_kv, D) views either way: a form that reads strides or views
    takes both, one that needs NHD memory only "NHD").
    """

    fn: PagedFn
    padded: bool = False
    devices: frozenset[str] | None = None
    availability: Callable[[], str | None] | None = None
    caps: Capabilities | None = None
    page_multiple: int = 1
    max_q_len: int | None = None
    layouts: tuple[str, ...] = ("NHD",)

    def reasons(self, device_type: str) -> list[str]:
        """Why this form cannot run on ``device_type`` here (empty = it can)."""
        if self.devices is not None and device_type not in self.devices:
            return [f"the paged form runs on {', '.join(sorted(self.devices))} only"]
        why = self.availability() if self.availability is not None else None
        return [f"unavailable: {why}"] if why else []
