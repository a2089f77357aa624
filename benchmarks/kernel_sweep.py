"""Every candidate config of the fused kernels timed on one GPU, beside SDPA and compiled Flex.

Groups, 3 shapes each, bf16 (:data:`CASES`, :data:`GROUPS`):

- ``fwd``: ``band_fwd`` on dense masks, B4 H16 n 8192: D 128 and 64 not causal, D 128 causal;
- ``dq``, ``dkdv``: the backward's two kernels on those shapes;
- ``band``: ``band_fwd`` on a causal window of 256 keys, B4 H16: D 64 at 16k and 64k, D 128 at 16k;
- ``decode``: ``band_fwd_split`` + ``split_combine``, one query row, B1, 32 query heads of D 128
  over 8 K/V heads (32k and 128k keys) or 32 (32k).

Each config of the GPU's class (``autotune.SHAPES``) and each candidate
(``autotune.CANDIDATES``) runs with that config forced: the call's launches are recorded
once (``kernel_launch.watching``) and replayed (no autotuning), timed by the harness's timer
(:func:`harness.measure.timing.measure`: CUDA events, median, the L2 flushed before each call,
time budgets in ms: Triton's benchmark helper's rules) and compared with the class
default's output (``rel_err``: relative Frobenius distance; a config above ``TOLERANCE`` fails).
Then, per shape and in the same process, the peers: ``sdpa`` (torch's default backend; its row
names the backend that ran and cuDNN's version), ``sdpa-flash`` (FlashAttention-2) and ``flex``
(``torch.compile(flex_attention)`` with a block mask); the backward shapes add each peer's
backward and ours (delta + dK/dV + dQ at their defaults) as group ``bwd``, with ``sdpa-cudnn``
(SDPA's cuDNN backend by name) and, on sm_90, ours with dQ's and dK/dV's first TMA candidates
(``flash-tiled-tma``) and first warp-specialized ones (``flash-tiled-ws``), timed with the
candidates.

Columns: ``tflops`` from the kept pairs (FlashAttention's convention: 4·D per pair forward, a
whole backward 2.5x; the dQ kernel's own three matmuls 6·D, dK/dV's four 8·D: ``flops_rule``),
``bytes`` (compulsory: each tensor the kernel must read or write, once) and ``bw_fraction``,
bytes / time over the copy bandwidth measured here (the figure for memory-bound shapes: band
and decode).

Budget: ``--minutes`` (4) from the start: first the compiles (every config at once, on the CPU's
cores through ``triton.AsyncCompileMode``), then the listed configs shape by shape, then SDPA and
our backward, then the candidates (a new path that faulted the device would cost the least
there), then Flex (its compiles are the dearest). What does not fit is a row ``skipped``
with the reason, and the summary counts it.

    python benchmarks/kernel_sweep.py --out DIR [--minutes 4] [--groups fwd dq dkdv band decode]
    python benchmarks/kernel_sweep.py --list     # what it would time and compile; no GPU needed

The decode shapes also time the default config with the split count's rule aimed at the other
targets of 1, 2, 4 and 8 programs per SM (``plan_tables.DECODE_WAVES`` is 2, this sweep's
choice on an H100, 2026-11-26): rows ``waves=W``, with the ``splits`` they gave.

``--configs N`` times the first N configs per kernel and shape (the default first); ``--cases``
and ``--peers`` pick shapes and peers. ``--smoke`` runs small copies of the shapes (B1 H2,
n 97; decode 301 keys in chunks of 64 at least), on the CPU under ``TRITON_INTERPRET=1`` too
(timed by the clock): the CPU test of every path.

Writes ``DIR/rows.jsonl`` (a row per line, flushed as it goes), ``DIR/sweep.md`` and
``DIR/rows.csv`` (rewritten after each shape), and prints the winners: per group and shape the
fastest config, and whether it is the current default. Exit 2 with one line without a CUDA GPU
or Triton; 1 when a config of ours errors or disagrees with the default; 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

try:
    import triton

    from implementations.triton_kernels import (
        attention_launches,
        autotune,
        band_plan,
        kernel_launch,
        plan_tables,
    )
except Exception as exc:  # no Triton, or kernels that do not import: nothing to sweep
    print(f"kernel_sweep: needs Triton and the fused kernels ({type(exc).__name__}: {exc})",
          file=sys.stderr)
    sys.exit(2)

from harness.cost.components import attention_tensor_bytes, bandwidth_fraction
from harness.masks import MaskSpec, kept_pairs
from harness.measure import calibrate
from harness.measure.device import get_device
from harness.measure.timing import TimingConfig
from harness.measure.timing import measure as time_call
from harness.render.page import markdown_table
from harness.spec import Problem

TOLERANCE = 2e-2  # rel. Frobenius distance from the default's output (bf16 outputs, fp32 sums)
WINDOW = MaskSpec(causal=True, window=(255, 0))
RESERVE_S = 5.0  # kept back for the last tables
EST_CONFIG_S = 0.4  # one config: its timing (warm-up, repeats, L2 flushes) and the check
EST_COMPILE_S = 3.0  # one Triton compile of these kernels on the GPU machine's CPU
EST_PEER_S = {"sdpa": 1.0, "sdpa-flash": 0.6, "flex": 20.0, "flash-tiled": 0.6,
              "flash-tiled-tma": 0.6 + 2 * EST_COMPILE_S, "flash-tiled-ws": 0.6 + 2 * EST_COMPILE_S,
              "sdpa-cudnn": 1.0}
EST_FLEX_BWD_S = 40.0
COMPILE_SHARE = 0.4  # of the budget, at most, compiling ahead (the rest compile at first run)
SPLIT_WAVES = (1, 2, 4, 8)  # decode: the split count's target, programs per SM, also timed


@dataclass(frozen=True)
class Case:
    """One shape: q (batch, heads, n_q, D), k/v (batch, kv_heads, n_k, D), bf16, a mask; the
    launches of a forward (and of a backward) call are recorded on it."""

    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_k: int
    head_dim: int
    mask: MaskSpec
    backward: bool = False

    @property
    def label(self) -> str:
        kv = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        n = f"n{self.n_k}" if self.n_q == self.n_k else f"q{self.n_q} k{self.n_k}"
        return f"B{self.batch} H{self.heads}{kv} {n} D{self.head_dim} {self.mask.describe()}"

    def problem(self, backward: bool = False) -> Problem:
        return Problem(self.batch, self.heads, self.n_q, self.n_k, self.head_dim,
                       dtype=torch.bfloat16, mask=self.mask, backward=backward,
                       kv_heads=self.kv_heads)

    def small(self) -> Case:
        """The smoke copy: B1, 2 query heads (1 K/V head when grouped), n 97 (decode: 301
        keys), the same head dim and mask."""
        n_k = 301 if self.n_q == 1 else 97
        return Case(1, 2, 1 if self.kv_heads != self.heads else 2, min(self.n_q, 97), n_k,
                    self.head_dim, self.mask, self.backward)

    @property
    def pairs(self) -> int:
        """Kept (query, key) pairs per (batch, head), exact."""
        return kept_pairs(self.mask, self.n_q, self.n_k)


CASES: dict[str, Case] = {
    "d128": Case(4, 16, 16, 8192, 8192, 128, MaskSpec(), backward=True),
    "d64": Case(4, 16, 16, 8192, 8192, 64, MaskSpec(), backward=True),
    "d128-causal": Case(4, 16, 16, 8192, 8192, 128, MaskSpec(causal=True), backward=True),
    "w256-16k": Case(4, 16, 16, 16384, 16384, 64, WINDOW),
    "w256-64k": Case(4, 16, 16, 65536, 65536, 64, WINDOW),
    "w256-16k-d128": Case(4, 16, 16, 16384, 16384, 128, WINDOW),
    "decode-32k": Case(1, 32, 8, 1, 32768, 128, MaskSpec(causal=True)),
    "decode-128k": Case(1, 32, 8, 1, 131072, 128, MaskSpec(causal=True)),
    "decode-32k-mha": Case(1, 32, 32, 1, 32768, 128, MaskSpec(causal=True)),
}
DENSE = ("d128", "d64", "d128-causal")
# group -> (kernel timed, its cases, FLOPs per kept pair per head-dim unit, the rule's name)
GROUPS: dict[str, tuple[str, tuple[str, ...], int, str]] = {
    "fwd": ("band_fwd", DENSE, 4, "4·D per kept pair (FA forward)"),
    "dq": ("band_dq", DENSE, 6, "6·D per kept pair (the dQ kernel's 3 matmuls)"),
    "dkdv": ("band_dkdv", DENSE, 8, "8·D per kept pair (the dK/dV kernel's 4 matmuls)"),
    "band": ("band_fwd", ("w256-16k", "w256-64k", "w256-16k-d128"), 4,
             "4·D per kept pair (FA forward)"),
    "decode": ("band_fwd_split", ("decode-32k", "decode-128k", "decode-32k-mha"), 4,
               "4·D per kept pair (FA forward)"),
}
BWD_RULE = "10·D per kept pair (FA backward: 2.5x forward)"
PEERS = ("sdpa", "sdpa-flash", "flex")
# our whole backward (delta, dK/dV, dQ) with the Hopper candidates of dQ and dK/dV: the first
# TMA one of each (``-tma``), the first warp-specialized one (``-ws``); timed with the
# candidates, after the peers. Beside them SDPA's cuDNN backward by name (SDPA's default is it
# on an H100 with torch 2.11, the row says which ran)
HOPPER_BACKWARD = {"flash-tiled-tma": False, "flash-tiled-ws": True}
BACKWARD_PEERS = ("flash-tiled", *HOPPER_BACKWARD, "sdpa", "sdpa-cudnn", "sdpa-flash", "flex")
CAPABILITY = [(9, 0)]  # the GPU class the run lists and times for (--capability, or the GPU's)
DEVICE = ["cuda"]  # where the run's tensors live: cuda, or cpu for a --smoke run
OUTPUTS = {"band_fwd": (3,), "band_dq": (4,), "band_dkdv": (4, 5)}  # launch args it writes


def sweep_configs(kernel: str, case: Case, capability: tuple[int, int]) -> list[tuple]:
    """(config, is the class default, is a candidate) of ``kernel`` on ``case``: the class's
    list (its default first), then the candidates."""
    flags = band_plan.band_plan(case.mask, case.n_q, case.n_k).flags
    d = plan_tables.block_d(case.head_dim)
    listed = autotune.class_configs(kernel, d, capability, flags)
    return ([(c, i == 0, False) for i, c in enumerate(listed)]
            + [(c, False, True) for c in autotune.candidate_configs(kernel, d, capability)])


def schedule(groups: list[str], capability: tuple[int, int]) -> list[dict]:
    """Every row the sweep would write, before running anything (``--list``)."""
    rows = []
    for group in groups:
        kernel, names, _, _ = GROUPS[group]
        for name in names:
            case = CASES[name]
            for config, default, candidate in sweep_configs(kernel, case, capability):
                rows.append({"group": group, "case": name, "shape": case.label,
                             "impl": "flash-tiled", "kernel": kernel,
                             "config": autotune.config_label(config), "default": default,
                             "candidate": candidate})
    for group, name, kernel, peers in peer_items(groups):
        case = CASES[name]
        rows += [{"group": group, "case": name, "shape": case.label, "impl": peer,
                  "kernel": kernel, "config": peer_config(peer, case, capability),
                  "default": None, "candidate": None} for peer in peers
                 if peer not in HOPPER_BACKWARD  # off Hopper: none to time
                 or hopper_backward(case, HOPPER_BACKWARD[peer], capability)]
    return rows


def peer_items(groups: list[str]) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(group, case, "forward" | "backward", implementations) of the peers: each forward
    group's shapes forward; the dense shapes' backward (group ``bwd``, ours among them) when
    ``dq`` or ``dkdv`` runs."""
    items = [(g, name, "forward", PEERS) for g in ("fwd", "band", "decode") if g in groups
             for name in GROUPS[g][1]]
    if {"dq", "dkdv"} & set(groups):
        items += [("bwd", name, "backward", BACKWARD_PEERS) for name in DENSE
                  if name in GROUPS["dq"][1]]
    return items


# --- running ----------------------------------------------------------------------------------


class Budget:
    """Seconds left before ``--minutes`` run out (less :data:`RESERVE_S`)."""

    def __init__(self, minutes: float):
        self.start = time.monotonic()
        self.end = self.start + minutes * 60 - RESERVE_S

    def left(self) -> float:
        return self.end - time.monotonic()

    def fits(self, seconds: float) -> bool:
        return self.left() >= seconds

    def skip(self, seconds: float) -> str:
        return f"skipped: budget (needs ~{seconds:.0f} s, {max(self.left(), 0):.0f} s left)"


class Prepared:
    """A case's inputs on the device and its recorded launches (not yet run: :meth:`fill`)."""

    def __init__(self, name: str, case: Case, device: str, inputs: tuple | None = None):
        self.name, self.case = name, case
        gen = torch.Generator(device=device).manual_seed(len(name))
        shape_q = (case.batch, case.heads, case.n_q, case.head_dim)
        shape_kv = (case.batch, case.kv_heads, case.n_k, case.head_dim)
        rand = lambda s: torch.randn(s, generator=gen, device=device, dtype=torch.bfloat16)
        if inputs is None:
            inputs = (rand(shape_q), rand(shape_kv), rand(shape_kv),
                      rand(shape_q) if case.backward else None)
        self.q, self.k, self.v, self.dout = inputs
        self.launches: list[kernel_launch.Launch] = []
        scale = case.head_dim**-0.5
        with kernel_launch.watching(self.launches.append, execute=False):
            out, lse = attention_launches.attention_forward(self.q, self.k, self.v, case.mask,
                                                            scale)
            if case.backward:
                attention_launches.attention_backward(self.q, self.k, self.v, out, lse,
                                                      self.dout, case.mask, scale)
        self.by_name = {launch.name: launch for launch in self.launches}
        split = self.by_name.get("band_fwd_split")
        self.splits = split.grid[0] if split is not None else None  # decode: key chunks

    def fill(self) -> None:
        """Run every recorded launch once, in order, with its own (pinned) config: the forward's
        output and lse, delta and the gradients are then real."""
        for launch in self.launches:
            launch.replay()

    def timed(self, kernel: str, config) -> tuple:
        """(the zero-argument call that runs ``kernel`` with ``config``, its output tensors)."""
        launch = self.by_name[kernel]
        if kernel == "band_fwd_split":
            combine = self.by_name["split_combine"]
            return (lambda: (launch.replay(config), combine.replay())), (combine.args[2],)
        return (lambda: launch.replay(config)), tuple(launch.args[i] for i in OUTPUTS[kernel])

    def backward_call(self, configs: dict | None = None):
        """Our backward: delta, dK/dV, dQ, at their defaults or with ``configs`` (kernel name
        -> config)."""
        recorded = [(self.by_name[n], (configs or {}).get(n))
                    for n in ("delta_kernel", "band_dkdv", "band_dq")]
        return lambda: [launch.replay(config) for launch, config in recorded]


def rel_err(got: tuple, want: tuple) -> float:
    """The largest relative Frobenius distance over the outputs (NaN: infinite)."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        g, w = g.float(), w.float()
        err = float(torch.linalg.vector_norm(g - w) / torch.linalg.vector_norm(w).clamp_min(1e-30))
        worst = max(worst, err if err == err else float("inf"))
    return worst


def kernel_bytes(group: str, case: Case) -> int:
    """Compulsory bytes of one call of the group's kernel (each tensor read or written once):
    forward q, k, v, out; dQ q, k, v, dout, lse, delta and dq; dK/dV the same reads and dk, dv;
    a whole backward q, k, v, out, dout, lse and dq, dk, dv."""
    t = attention_tensor_bytes(case.problem())
    qkv = t["q"] + t["k"] + t["v"]
    reads = qkv + t["out"] + 2 * t["lse"]  # q, k, v, dout (out's size), lse, delta
    return {"dq": reads + t["q"], "dkdv": reads + t["k"] + t["v"],
            "bwd": qkv + 2 * t["out"] + t["lse"] + qkv}.get(group, qkv + t["out"])


def measure(fn, rep_ms: int) -> float:
    """Median ms of ``fn`` by the harness's timer (:func:`harness.measure.timing.measure`): on
    a GPU CUDA events with the L2 flushed before each call, for ``rep_ms`` after warm-up; off
    one (the smoke run) the clock, 1 sample after the first call (an interpreted call takes
    seconds and its time means nothing: the smoke run checks that each path runs)."""
    cuda = torch.cuda.is_available()
    if DEVICE[0] not in _DEVICES:
        _DEVICES[DEVICE[0]] = get_device(DEVICE[0], flush_l2=cuda)
    config = TimingConfig(budget_s=rep_ms / 1e3, min_samples=10 if cuda else 1,
                          warmup_calls=2 if cuda else 0)
    return time_call(fn, _DEVICES[DEVICE[0]], config).median * 1e3


_DEVICES: dict = {}  # device kind -> the harness's Device (one L2 flush buffer a run)


class Skip(Exception):
    """A peer that cannot run this case (the message says why)."""


def sdpa_choice(p: Prepared) -> str:
    """The backend torch says it picks for the case (``torch._fused_sdp_choice``, private)."""
    case = p.case
    try:
        index = torch._fused_sdp_choice(p.q, p.k, p.v, is_causal=case.mask.causal and case.n_q > 1,
                                        enable_gqa=case.kv_heads != case.heads)
        return next(n for n, m in SDPBackend.__members__.items() if int(m.value) == index)
    except Exception as exc:  # a private API: its absence is a note, not a failure
        return f"? ({type(exc).__name__})"


def sdpa_backend(call) -> str:
    """Which SDPA backend a call ran, from the kernel one call spends most device time in,
    with cuDNN's version."""
    activity = torch.profiler.ProfilerActivity
    with torch.profiler.profile(activities=[activity.CUDA if torch.cuda.is_available()
                                            else activity.CPU]) as prof:
        call()
        synchronize()
    names = [(e.time_range.elapsed_us(), e.name) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA]  # the kernels
    if not names:  # no GPU: the op that spent the most time itself
        names = [(e.self_cpu_time_total, e.key) for e in prof.key_averages()]
    top = max(names)[1] if names else "?"
    kind = next((k for k, words in SDPA_KERNELS if any(w in top.lower() for w in words)), "?")
    return f"{kind} (cuDNN {torch.backends.cudnn.version()}; kernel {top[:60]})"


SDPA_KERNELS = (("cuDNN", ("cudnn", "sm90_xmma", "fmha_sm90")), ("FLASH", ("flash",)),
                ("EFFICIENT", ("fmha_cutlass", "efficient", "mem_eff")), ("MATH", ("gemm",)))


def hopper_backward(case: Case, ws: bool, capability: tuple[int, int]) -> dict:
    """dQ's and dK/dV's first Hopper candidate (TMA; ``ws``: warp-specialized) for the case's
    GPU class: kernel name -> config (empty off Hopper)."""
    d = plan_tables.block_d(case.head_dim)
    found = {}
    for kernel in ("band_dq", "band_dkdv"):
        picks = [c for c in autotune.candidate_configs(kernel, d, capability)
                 if c.kwargs.get("TMA") and bool(c.kwargs.get("WS")) == ws]
        found.update({kernel: picks[0]} if picks else {})
    return found if len(found) == 2 else {}


def peer_config(peer: str, case: Case, capability: tuple[int, int]) -> str:
    """The config column of a peer's row: ours at its defaults, or the Hopper candidates."""
    if peer in HOPPER_BACKWARD:
        picked = hopper_backward(case, HOPPER_BACKWARD[peer], capability)
        return " + ".join(f"{k.removeprefix('band_')} {autotune.config_label(c)}"
                          for k, c in picked.items())
    return "default" if peer == "flash-tiled" else ""


def peer_call(peer: str, p: Prepared, backward: bool):
    """(the zero-argument call of ``peer`` on the case, a note); Skip where it cannot run."""
    case = p.case
    if peer == "flash-tiled":
        return p.backward_call(), "delta + dK/dV + dQ at their defaults"
    if peer in HOPPER_BACKWARD:
        picked = hopper_backward(case, HOPPER_BACKWARD[peer], CAPABILITY[0])
        if not picked:
            raise Skip(f"no Hopper candidate of dQ and dK/dV for sm_{CAPABILITY[0][0]}0")
        return (p.backward_call(picked), "delta + dK/dV + dQ, Hopper candidates (each one's "
                "rel_err against the default: its dq / dkdv row)")
    gqa = case.kv_heads != case.heads
    q, k, v = (t.detach().requires_grad_(backward) for t in (p.q, p.k, p.v))
    if peer.startswith("sdpa"):
        if case.mask.window not in (None, (None, None)):
            raise Skip("SDPA has no sliding window without an n x n attn_mask")
        causal = case.mask.causal and case.n_q > 1  # one row over its cache sees every key
        if peer == "sdpa-cudnn" and not torch.cuda.is_available():
            raise Skip("cuDNN attention is CUDA's")
        backends = {"sdpa-flash": [SDPBackend.FLASH_ATTENTION],
                    "sdpa-cudnn": [SDPBackend.CUDNN_ATTENTION]}.get(peer)

        def forward():
            if backends is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            with sdpa_kernel(backends):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    else:
        block_mask = flex_block_mask(case)
        compiled = compiled_flex()

        def forward():
            return compiled(q, k, v, block_mask=block_mask, enable_gqa=gqa)
    if not backward:
        return forward, ""
    out = forward()
    return (lambda: torch.autograd.grad(out, (q, k, v), p.dout, retain_graph=True)), ""


_FLEX: list = []


def compiled_flex():
    """``torch.compile(flex_attention)``, one per process (recompiles per shape and mask)."""
    if not _FLEX:
        torch._dynamo.config.cache_size_limit = 64  # past the limit dynamo falls back to eager
        _FLEX.append(torch.compile(flex_attention, dynamic=False))
    return _FLEX[0]


def flex_block_mask(case: Case):
    """The case's mask as a Flex block mask (constants in the mask function: a captured tensor
    read per element is many times slower); None for a dense one."""
    mask, off = case.mask, case.n_k - case.n_q
    if not mask.causal:
        return None
    left = mask.window[0] if mask.window not in (None, (None, None)) else None
    if left is None:
        mod = lambda b, h, i, j: i + off >= j
    else:
        mod = lambda b, h, i, j: (i + off >= j) & (i + off - j <= left)
    return create_block_mask(mod, None, None, case.n_q, case.n_k, device=DEVICE[0])


class Writer:
    """Rows to ``rows.jsonl`` as they come (flushed), tables rewritten on :meth:`tables`."""

    COLUMNS = ("group", "case", "impl", "kernel", "config", "default", "candidate", "status",
               "ms", "tflops", "bw_fraction", "gbps", "rel_err", "splits", "backend", "shape",
               "bytes",
               "flops", "flops_rule", "note")

    def __init__(self, out: Path):
        self.out, self.rows = out, []
        self.jsonl = (out / "rows.jsonl").open("w")

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()
        ms = f"{row['ms']:.3f} ms" if row.get("ms") else row["status"]
        print(f"  {row['group']:6} {row['case']:14} {row['impl']:11} {row['config'] or '':24} "
              f"{ms}", file=sys.stderr)

    def tables(self) -> pd.DataFrame:
        table = pd.DataFrame(self.rows).reindex(columns=list(self.COLUMNS))
        table.to_csv(self.out / "rows.csv", index=False)
        shown = table.drop(columns=["shape", "bytes", "flops", "flops_rule"])
        for col, digits in (("ms", 3), ("tflops", 1), ("bw_fraction", 2), ("gbps", 0)):
            shown[col] = shown[col].map(lambda x, d=digits: "" if x != x or x is None
                                        else f"{x:.{d}f}")
        shown["rel_err"] = shown["rel_err"].map(lambda x: "" if x != x or x is None
                                                else f"{x:.1e}")
        (self.out / "sweep.md").write_text(markdown_table(shown.astype(object).fillna("")) + "\n")
        return table


def row_of(group: str, name: str, impl: str, kernel: str, config: str = "", **more) -> dict:
    case = CASES[name]
    return {"group": group, "case": name, "shape": case.label, "impl": impl, "kernel": kernel,
            "config": config, "default": None, "candidate": None, "status": "ok", **more}


def rates(row: dict, flops: float, nbytes: int, bandwidth: float) -> dict:
    """The row with its ms turned into TFLOP/s, GB/s and the fraction of the copy bandwidth."""
    seconds = row["ms"] / 1e3
    return {**row, "flops": flops, "bytes": nbytes, "tflops": flops / seconds / 1e12,
            "gbps": nbytes / seconds / 1e9,
            "bw_fraction": bandwidth_fraction(nbytes, seconds, bandwidth)}


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def cuda_alive() -> bool:
    """Whether the CUDA context still works (a device-side fault poisons it for good)."""
    try:
        synchronize()
        return True
    except Exception:
        return False


def compile_all(jobs: list[tuple], workers: int, budget: Budget) -> tuple[int, float]:
    """Compile the (launch, config) jobs in order, ``2·workers`` at a time on ``workers``
    threads, until :data:`COMPILE_SHARE` of the budget is spent (the rest compile when first
    run); (jobs compiled, seconds). A compile that fails raises again when its config first
    runs (its row's error)."""
    start = time.monotonic()
    if autotune.interpreted():  # nothing compiles
        return 0, 0.0
    stop = start + COMPILE_SHARE * (budget.end - budget.start)
    done = 0
    with ThreadPoolExecutor(workers) as pool:
        while done < len(jobs) and time.monotonic() < stop:
            chunk = jobs[done:done + 2 * workers]
            with triton.AsyncCompileMode(pool, ignore_errors=True):
                for launch, config in chunk:
                    with contextlib.suppress(Exception):  # its row says so later
                        launch.compile(config)
            done += len(chunk)
    return done, time.monotonic() - start


def sweep_case(group: str, p: Prepared, capability, args, budget: Budget, bandwidth: float,
               writer: Writer, candidates: bool = False) -> int:
    """Time the configs of the group's kernel on one case: the class's list (``candidates``
    False), or the candidates (decode: the default config at other split counts), each checked
    against the default's output; the count of failed configs."""
    kernel, _, per_pair, rule = GROUPS[group]
    case, failed, reference = p.case, 0, None
    work = (per_pair * case.batch * case.heads * case.head_dim * case.pairs,
            kernel_bytes(group, case), bandwidth)
    every = sweep_configs(kernel, case, capability)
    default = every[0][0]
    # (config, is the default, the split rule's target: None but for decode's extra rows)
    todo = [(c, d, None) for c, d, cand in every if cand == candidates]
    todo = todo if candidates else todo[:args.configs]
    if kernel == "band_fwd_split" and candidates:
        todo += [(default, False, waves) for waves in SPLIT_WAVES
                 if waves != plan_tables.DECODE_WAVES]
    if not todo or not budget.fits(EST_CONFIG_S):
        for config, is_default, _ in todo:
            label = autotune.config_label(config)
            writer.add({**row_of(group, p.name, "flash-tiled", kernel, label,
                                 default=is_default, candidate=candidates),
                        "status": budget.skip(EST_CONFIG_S)})
        return 0
    p.fill()
    if candidates:  # the default's output, the reference of every candidate
        call, outputs = p.timed(kernel, default)
        call()
        reference = tuple(t.clone() for t in outputs)
    for config, is_default, waves in todo:
        ran, label, cost = p, autotune.config_label(config), EST_CONFIG_S
        if waves is not None:  # another split count's rule: the call recorded again
            label, cost = f"{label} waves={waves}", EST_CONFIG_S + EST_COMPILE_S
        row = row_of(group, p.name, "flash-tiled", kernel, label, default=is_default,
                     candidate=candidates, flops_rule=rule, splits=p.splits)
        if not budget.fits(cost):
            writer.add({**row, "status": budget.skip(cost)})
            continue
        if cost > EST_CONFIG_S:
            with split_waves(waves):
                ran = Prepared(p.name, case, p.q.device.type, (p.q, p.k, p.v, p.dout))
            ran.fill()
            row.update(splits=ran.splits,
                       note=f"DECODE_WAVES={waves} (the rule's: {plan_tables.DECODE_WAVES})")
        row, got = timed_row(row, ran, kernel, config, reference, work, args.rep_ms)
        if is_default and got is not None:
            reference, row["rel_err"] = got, 0.0
        failed += row["status"] != "ok"
        writer.add(row)
    return failed


@contextlib.contextmanager
def split_waves(waves: int):
    """Decode calls aim at ``waves`` programs per SM for the duration."""
    saved = plan_tables.DECODE_WAVES
    plan_tables.DECODE_WAVES = waves
    try:
        yield
    finally:
        plan_tables.DECODE_WAVES = saved


def timed_row(row: dict, p: Prepared, kernel: str, config, reference: tuple | None,
              work: tuple[float, int, float], rep_ms: int) -> tuple[dict, tuple | None]:
    """The row of one config: its median, its distance from the default's output
    (``reference``; the mismatch beyond ``TOLERANCE``) and rates from ``work`` (FLOPs, bytes,
    bandwidth); an error is the row's status. Returns (row, the config's outputs)."""
    try:
        call, outputs = p.timed(kernel, config)
        call()
        synchronize()
        got = tuple(t.clone() for t in outputs)
        row["ms"] = measure(call, rep_ms)
        row["rel_err"] = rel_err(got, reference) if reference is not None else None
        if row["rel_err"] is not None and not row["rel_err"] <= TOLERANCE:
            row["status"] = f"mismatch: rel_err {row['rel_err']:.1e}"
        return rates(row, *work), got
    except Exception as exc:  # one config's failure is its row; the sweep goes on
        row["status"] = f"error: {type(exc).__name__}: {str(exc)[:160]}"
        if not cuda_alive():
            raise
        return row, None


def sweep_peer(group: str, name: str, kernel: str, peer: str, p: Prepared, args,
               budget: Budget, bandwidth: float, writer: Writer) -> None:
    """Time one peer on one case (forward, or backward for group ``bwd``)."""
    case, backward = p.case, kernel == "backward"
    flops = (10 if backward else 4) * case.batch * case.heads * case.head_dim * case.pairs
    row = row_of(group, name, peer, kernel, peer_config(peer, case, CAPABILITY[0]),
                 flops_rule=BWD_RULE if backward else GROUPS["fwd"][3])
    cost = EST_FLEX_BWD_S if peer == "flex" and backward else EST_PEER_S[peer]
    if not budget.fits(cost):
        writer.add({**row, "status": budget.skip(cost)})
        return
    try:
        call, note = peer_call(peer, p, backward)
        call()
        synchronize()
        row["ms"] = measure(call, args.rep_ms)
        row["note"] = note
        if peer == "sdpa" and not backward:
            row["backend"] = f"{sdpa_backend(call)}; torch's choice {sdpa_choice(p)}"
        row = rates(row, flops, kernel_bytes("bwd" if backward else group, case), bandwidth)
    except Skip as why:
        row["status"] = f"skipped: {why}"
    except Exception as exc:  # a peer's failure is its row
        row["status"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        if not cuda_alive():
            writer.add(row)
            raise
    writer.add(row)


def environment(bandwidth: float, peak: float | None) -> dict:
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        device, sms, capability = (props.name, props.multi_processor_count,
                                   list(torch.cuda.get_device_capability()))
    else:
        device, sms, capability = "cpu (Triton's interpreter)", 0, None
    return {"device": device, "sms": sms, "capability": capability, "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "triton": triton.__version__, "copy_bandwidth_bytes_per_s": bandwidth,
            "bf16_matmul_flops_per_s": peak}


def summary(table: pd.DataFrame) -> list[str]:
    """Per group and case: the fastest config of ours against the default, and the peers."""
    lines = []
    ours = table[(table["impl"] == "flash-tiled") & (table["status"] == "ok")
                 & (table["kernel"] != "backward")]
    for (group, case), rows in ours.groupby(["group", "case"], sort=False):
        best = rows.loc[rows["ms"].idxmin()]
        default = rows[rows["default"] == True]  # noqa: E712 (a column of bools and None)
        verdict = "the default"
        if not default.empty and best["config"] != default.iloc[0]["config"]:
            kind = "candidate" if best["candidate"] else "listed config"
            verdict = (f"a {kind}, {default.iloc[0]['ms'] / best['ms']:.2f}x the default "
                       f"{default.iloc[0]['config']} ({default.iloc[0]['ms']:.3f} ms)")
        bw = f", {best['bw_fraction']:.2f} of bandwidth" if group in ("band", "decode") else ""
        lines.append(f"{group:6} {case:14} best {best['config']:26} {best['ms']:8.3f} ms "
                     f"{best['tflops']:6.1f} TFLOP/s{bw}: {verdict}")
    peers = table[(table["impl"] != "flash-tiled") | (table["kernel"] == "backward")]
    for (group, case), rows in peers.groupby(["group", "case"], sort=False):
        shown = [f"{r['impl']} {r['ms']:.3f} ms" + (f" {r['tflops']:.0f} TF" if r["tflops"] else "")
                 if r["status"] == "ok" else f"{r['impl']} {r['status'][:40]}"
                 for _, r in rows.iterrows()]
        lines.append(f"{group:6} {case:14} peers: " + "; ".join(shown))
    backends = table["backend"].dropna().unique()
    lines += [f"sdpa's default backend: {b}" for b in backends]
    return lines


def run(args, capability: tuple[int, int]) -> int:
    """The sweep on this GPU; the exit status."""
    budget = Budget(args.minutes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = DEVICE[0]
    bandwidth = calibrate.measure_bandwidth(device)
    peak = calibrate.measure_matmul_peak(device, torch.bfloat16, budget_s=0.3) if (
        device == "cuda") else None
    env = environment(bandwidth, peak)
    (out / "env.json").write_text(json.dumps(env, indent=1))
    print(f"kernel_sweep: {env['device']} ({env['sms']} SMs), torch {env['torch']}, triton "
          f"{env['triton']}, cuDNN {env['cudnn']}; copy {bandwidth / 1e12:.2f} TB/s, bf16 "
          f"matmul {(peak or 0) / 1e12:.0f} TFLOP/s", file=sys.stderr)
    writer = Writer(out)
    names = list(dict.fromkeys(n for g in args.groups for n in GROUPS[g][1]))
    prepared = {name: Prepared(name, CASES[name], device) for name in names}
    # the recorded launches' own configs, then the listed ones, then the candidates
    jobs = [(launch, launch.config) for p in prepared.values() for launch in p.launches]
    for candidates in (False, True):
        for group in args.groups:
            kernel = GROUPS[group][0]
            for name in GROUPS[group][1]:
                every = sweep_configs(kernel, CASES[name], capability)
                picked = [c for c, _, cand in every if cand == candidates]
                jobs += [(prepared[name].by_name[kernel], config)
                         for config in (picked if candidates else picked[:args.configs])]
    workers = min(32, os.cpu_count() or 1)
    done, seconds = compile_all(jobs, workers, budget)
    print(f"kernel_sweep: {done} of {len(jobs)} compiles in {seconds:.1f} s on {workers} "
          f"threads (the rest when first run); {budget.left():.0f} s left", file=sys.stderr)
    failed = 0
    try:
        # the class's configs, the peers but Flex, the candidates and our backward with the
        # Hopper ones (a new path that faults the device costs the least there), then Flex
        # (its compiles are the dearest)
        for phase in ("listed", "peers", "candidates", "flex"):
            if phase in ("listed", "candidates"):
                for group in args.groups:
                    for name in GROUPS[group][1]:
                        failed += sweep_case(group, prepared[name], capability, args, budget,
                                             bandwidth, writer, phase == "candidates")
                        writer.tables()
            if phase == "listed":
                continue
            for group, name, kernel, peers in peer_items(args.groups):
                for peer in [x for x in peers if x in args.peers and peer_phase(x) == phase]:
                    sweep_peer(group, name, kernel, peer, prepared[name], args, budget,
                               bandwidth, writer)
                writer.tables()
    except Exception as exc:  # the CUDA context is gone: what ran is written
        print(f"kernel_sweep: stopped, the CUDA context failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        failed += 1
    table = writer.tables()
    skipped = table["status"].str.startswith("skipped: budget").sum()
    print("\n".join(summary(table)))
    print(f"kernel_sweep: {len(table)} rows in {time.monotonic() - budget.start:.0f} s "
          f"({skipped} skipped for the budget, {failed} failed); {out}/sweep.md")
    return 1 if failed else 0


def peer_phase(peer: str) -> str:
    """When a peer is timed: Flex last (its compiles are the dearest), our backward with the
    Hopper candidates with the candidates, the others right after our listed configs."""
    return "flex" if peer == "flex" else "candidates" if peer in HOPPER_BACKWARD else "peers"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="kernel-sweep", help="folder for rows and tables")
    parser.add_argument("--minutes", type=float, default=4.0, help="the whole sweep's budget")
    parser.add_argument("--groups", nargs="+", choices=list(GROUPS), default=list(GROUPS))
    parser.add_argument("--rep-ms", type=int, default=100,
                        help="timing budget per config after warm-up (ms)")
    parser.add_argument("--cases", nargs="+", choices=list(CASES),
                        help="only these shapes (default: each group's three)")
    parser.add_argument("--configs", type=int, default=None,
                        help="time the first N configs per kernel and shape (default: all)")
    every_peer = list(dict.fromkeys([*BACKWARD_PEERS, *PEERS]))
    parser.add_argument("--peers", nargs="*", choices=every_peer, default=every_peer,
                        help="the peers to time")
    parser.add_argument("--smoke", action="store_true",
                        help="small copies of the shapes (the CPU test, under the interpreter)")
    parser.add_argument("--list", "--dry-run", action="store_true", dest="list",
                        help="print what would run (no GPU needed)")
    parser.add_argument("--capability", default=None,
                        help="with --list: the GPU class to list for, e.g. 9.0 (default: this "
                             "GPU's, else 9.0)")
    args = parser.parse_args()
    if args.minutes <= 0 or args.rep_ms <= 0 or (args.configs is not None and args.configs < 1):
        print("kernel_sweep: --minutes, --rep-ms and --configs must be positive",
              file=sys.stderr)
        return 2
    if args.smoke:
        CASES.update({name: case.small() for name, case in CASES.items()})
        plan_tables.MIN_SPLIT_KEYS = 64  # the small decode caches still split
    if args.cases:
        for group, (kernel, names, per_pair, rule) in list(GROUPS.items()):
            GROUPS[group] = (kernel, tuple(n for n in names if n in args.cases), per_pair, rule)
        args.groups = [g for g in args.groups if GROUPS[g][1]]
    has_cuda = torch.cuda.is_available()
    if args.capability:
        capability = tuple(int(x) for x in args.capability.split("."))
    else:
        capability = torch.cuda.get_device_capability() if has_cuda else (9, 0)
    CAPABILITY[0] = capability
    if args.list:
        rows = schedule(args.groups, capability)
        table = pd.DataFrame(rows).drop(columns=["shape"])
        print(markdown_table(table.astype(object).fillna("")))
        compiles = sum(1 for r in rows if r["impl"] == "flash-tiled" and r["kernel"] != "backward")
        print(f"\n{len(rows)} rows: {compiles} kernel configs (each compiled once, about "
              f"{EST_COMPILE_S:.0f} s of CPU each), "
              f"{len(rows) - compiles} peer timings, for sm_{capability[0]}{capability[1]}")
        return 0
    if not has_cuda and not (args.smoke and autotune.interpreted()):
        print(f"kernel_sweep: no CUDA GPU here (torch {torch.__version__}: "
              "torch.cuda.is_available() is False); nothing to time (--list shows the schedule)",
              file=sys.stderr)
        return 2
    if autotune.interpreted() and not args.smoke:
        print("kernel_sweep: unset TRITON_INTERPRET (interpreted kernels time nothing)",
              file=sys.stderr)
        return 2
    DEVICE[0] = "cuda" if has_cuda else "cpu"
    os.environ[autotune.TUNING_ENV] = "off"  # the recorded launches run their class defaults
    return run(args, capability)


if __name__ == "__main__":
    sys.exit(main())
