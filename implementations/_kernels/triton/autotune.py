"""Autotuning configurations of the fused attention kernels, per kernel, head dim and GPU.

Each config is listed with the (architecture, head dim) classes where it compiles without
spilling registers: ``sm90`` (Hopper) or ``sm80`` (Ampere and Ada), head dim ``d64``
(BLOCK_D <= 64) or ``d128`` (larger). The autotuner prunes a config outside the running GPU's
class before timing any (``early_config_prune``), and the first config of a class is the one
assumed before autotuning (executed pairs). Every class was checked ahead of time on sm_90 and
sm_80 at D = 64 and 128 with each mask clause (``benchmarks/aot_kernels.py``; the CPU tests
recheck each kernel's default); configs that spilled were taken out (a 128x64 forward at 4
warps, 128x128 tiles, 32x128 dK/dV at 4 warps). A kernel compiled with both a prefix and
dilation (``PREFIX`` and ``DILATED``: the gathered prefix span) holds more registers and
takes its lists from ``GATHERED_SHAPES`` where that has one (checked ahead of time with the
``*-dilated-prefix`` workloads; their ``MASK_KEY`` holds both clauses, so they tune apart);
every other kernel's lists are ``SHAPES``' alone.

A default changes only on a GPU measurement. The sm_90 defaults of the band kernels are the
ones the H100 kernel sweep of 2026-11-26 chose or kept (``MEASURED`` records each with its
committed rows; tests check both against ``SHAPES``); the sm_80 ones have no measurement yet.
One listed config sets a Hopper flag: the forward's ``TMA`` config at sm90-d64, which a launch
takes only where :func:`tma_allowed` (the prune drops it elsewhere, and a launch whose rows a
descriptor cannot address tunes under its own ``MASK_KEY``: :func:`tma_key`).

Under ``TRITON_INTERPRET=1`` (CPU tests) a single small configuration runs: the interpreter's
time goes into every extra config, and small tiles exercise more block edges on small inputs
(tests swap in GPU-sized tiles with ``launches.interpreter_tiles``). The autotuner's key
is ``(n_bucket, q_bucket, BLOCK_D, MASK_KEY)`` plus the tensors' dtypes (Triton adds those).

``ATTNBENCH_AUTOTUNE=off`` (:func:`autotuning`) turns autotuning off: each launch runs its
kernel's class default, the config the AOT check compiles, and times no other
(:mod:`.kernel_launch`). The tests set it: on a GPU every autotuned launch otherwise compiles and
times every config of its class for every mask mode it meets.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import triton

TUNE_KEY = ["n_bucket", "q_bucket", "BLOCK_D", "MASK_KEY"]  # plus the dtypes, Triton adds them
TUNING_ENV = "ATTNBENCH_AUTOTUNE"
_TUNING = {"on": True, "1": True, "true": True, "yes": True,
           "off": False, "0": False, "false": False, "no": False}
INTERPRET_BLOCK_M = 32
INTERPRET_BLOCK_N = 16
KEY_BLOCK_ONLY = ("band_fwd_split", "paged_decode")  # decode kernels: BLOCK_N tuned, not BLOCK_M
ALL = frozenset({"sm90-d64", "sm90-d128", "sm80-d64", "sm80-d128"})
D64 = frozenset({"sm90-d64", "sm80-d64"})

# the Hopper paths of the forward, dQ and dK/dV, compile-time flags of a config (see
# CANDIDATES below)
TMA = {"TMA": True}
TMA_WS = {"TMA": True, "WS": True}
SM90 = frozenset({"sm90-d64", "sm90-d128"})
SWEEP_H100 = "docs/results/h100/2026-11-26-second-lease/kernel-sweep.csv"

# kernel -> [(BLOCK_M, BLOCK_N, warps, stages, classes[, flags])]; BLOCK_M of dK/dV is the
# query rows per step, BLOCK_N the keys a program holds; the decode kernel tunes BLOCK_N only
# (0 = unset). A class's first config is its default; the order of the rest is only the order
# the autotuner times them in. The sm_90 defaults come from the H100 kernel sweep of 2026-11-26
# (SWEEP_H100: do_bench medians, B4 H16 n 8192 bf16; band: causal window of 256 keys; see
# MEASURED); sm_80 has no GPU measurement and keeps the defaults the AOT check chose.
SHAPES: dict[str, list[tuple]] = {
    "band_fwd": [
        # sm90-d64: 64x64 w4 s3, the fastest listed config on the dense D64 forward (2.720 ms)
        # and on the band at 16k and 64k (0.361, 1.521 ms), where 128x64 w8 s3 took 3.168 and
        # 0.544, 2.181 ms
        (64, 64, 4, 3, frozenset({"sm90-d64"})),
        # sm90-d128 (the fastest on dense and causal D128: 4.462, 2.414 ms) and sm80-d64
        (128, 64, 8, 3, frozenset({"sm90-d64", "sm80-d64", "sm90-d128"})),
        # sm90-d64 through tensor descriptors: the fastest of all on the dense D64 forward
        # (2.614 ms, same output as the default), slower than 64x64 on the band (0.493, 1.914
        # ms), so listed, not the default; a launch that cannot take TMA runs it without
        # (masks with clauses, rows a descriptor cannot address: tma_allowed)
        (128, 64, 8, 3, frozenset({"sm90-d64"}), TMA),
        (128, 32, 4, 4, D64),
        (64, 64, 4, 4, frozenset({"sm90-d64"})),
        (128, 32, 8, 3, frozenset({"sm90-d128"})),
        (64, 64, 4, 2, frozenset({"sm90-d128"})),
        (64, 32, 4, 2, ALL),  # sm80-d128's default; the fastest on the band at D128 (0.654 ms)
    ],
    "band_dq": [
        # sm90-d64: 128x32 w4 s3, the fastest on the dense D64 dQ (3.233 ms; 128x64 w8 s2:
        # 4.263). Its masked loop is 1.70x the unmasked one in SASS, over the AOT check's 1.5x
        # proxy: the measurement supersedes the proxy (MEASURED)
        (128, 32, 4, 3, frozenset({"sm90-d64"})),
        # sm90-d128 (the fastest on dense and causal D128: 6.419, 3.325 ms) and sm80-d64
        (128, 64, 8, 2, frozenset({"sm90-d64", "sm80-d64", "sm90-d128"})),
        (64, 64, 8, 2, frozenset({"sm90-d128", "sm80-d128"})),
        (64, 64, 4, 3, D64),
        (128, 32, 4, 3, frozenset({"sm80-d64"})),
        (64, 32, 4, 3, frozenset({"sm90-d128", "sm80-d128"})),
        (64, 32, 4, 2, ALL),
        (32, 32, 4, 2, ALL),
    ],
    "band_dkdv": [
        # sm90-d64: 64x64 w4 s3, the fastest on the dense D64 dK/dV (5.184 ms; 64x128 w8 s2:
        # 6.079)
        (64, 64, 4, 3, frozenset({"sm90-d64"})),
        (64, 128, 8, 2, frozenset({"sm90-d64"})),
        # sm90-d128: the fastest on dense and causal D128 (11.174, 5.555 ms)
        (32, 128, 8, 2, frozenset({"sm90-d128"})),
        (64, 64, 8, 2, frozenset({"sm90-d128", "sm80-d128"})),
        (32, 64, 4, 2, D64),
        (32, 64, 8, 2, frozenset({"sm90-d128", "sm80-d128"})),
        (16, 128, 8, 2, frozenset({"sm90-d128", "sm80-d128"})),
        (16, 32, 4, 2, ALL),
    ],
    # decode: 64 keys / 4 warps is not a measured choice. At 4 programs per SM it was the
    # fastest at 32k with 8 K/V heads (0.090 ms; 128 keys: 0.099) and not at 128k (0.247;
    # 128 keys / 4 warps: 0.229) nor at 32k with 32 (0.221; 0.210); at the 2 programs per SM
    # the split count now aims at (plan_tables.DECODE_WAVES) only it was timed
    "band_fwd_split": [
        (0, 64, 4, 2, ALL),
        (0, 128, 4, 2, ALL),
        (0, 64, 4, 3, frozenset({"sm90-d64", "sm80-d64", "sm80-d128"})),
        (0, 128, 8, 2, ALL),
    ],
    # paged decode (paged_decode.py): keys per block, over 16- and 64-token pages (a block of
    # 64 keys over 16-token pages reads 4 pages); not measured on a GPU: the split-KV decode's
    # list, each checked spill-free ahead of time (aot_kernels.py --workloads paged-*)
    "paged_decode": [
        (0, 64, 4, 2, ALL),
        (0, 128, 4, 2, ALL),
        (0, 64, 4, 3, ALL),
        (0, 128, 8, 2, ALL),
    ],
    # block-list kernels: the tile is the layout block, only the pipeline is tuned
    "blocks_fwd": [(0, 0, w, s, ALL) for w in (4, 8) for s in (2, 3)],
    "blocks_dq": [(0, 0, w, s, ALL) for w in (4, 8) for s in (2, 3)],
    "blocks_dkdv": [(0, 0, 8, 2, ALL), (0, 0, 8, 3, ALL), (0, 0, 4, 2, D64), (0, 0, 4, 3, D64)],
}
# the band kernels compiled with PREFIX and DILATED both on (the gathered prefix span holds
# more registers): SHAPES' lists less the configs that spill there (128x64 forward and 64x64
# at D128 on sm_90, dQ at 128x64/64x64/128x32 on sm_80 D64, 64x64 and 16x128 dK/dV at D128,
# 64x64/4w dK/dV on sm_90 D64, 32x64/4w dK/dV on sm_80 D64, the decode's 128 keys/4w at D128),
# plus three that do not spill there: on sm_80 D64, 64x64/8w dQ, 32x64/8w and 16x64/4w dK/dV
# (not measured on a GPU, the sweep's masks having no clauses: their defaults stay the AOT
# check's)
GATHERED_SHAPES: dict[str, list[tuple[int, int, int, int, frozenset[str]]]] = {
    "band_fwd": [
        (128, 64, 8, 3, D64),
        (128, 32, 4, 4, D64),
        (64, 64, 4, 3, frozenset({"sm90-d64"})),
        (64, 64, 4, 4, frozenset({"sm90-d64"})),
        (128, 32, 8, 3, frozenset({"sm90-d128"})),
        (64, 32, 4, 2, ALL),
    ],
    "band_dq": [
        (128, 64, 8, 2, frozenset({"sm90-d64", "sm90-d128"})),
        (64, 64, 8, 2, frozenset({"sm80-d64", "sm90-d128", "sm80-d128"})),
        (64, 64, 4, 3, frozenset({"sm90-d64"})),
        (128, 32, 4, 3, frozenset({"sm90-d64"})),
        (64, 32, 4, 3, frozenset({"sm90-d128", "sm80-d128"})),
        (64, 32, 4, 2, ALL),
        (32, 32, 4, 2, ALL),
    ],
    "band_dkdv": [
        (64, 128, 8, 2, frozenset({"sm90-d64"})),
        (32, 128, 8, 2, frozenset({"sm90-d128"})),
        (32, 64, 8, 2, frozenset({"sm80-d64", "sm90-d128", "sm80-d128"})),
        (32, 64, 4, 2, frozenset({"sm90-d64"})),
        (16, 64, 4, 2, frozenset({"sm80-d64"})),
        (16, 128, 8, 2, frozenset({"sm90-d128"})),
        (16, 32, 4, 2, ALL),
    ],
    "band_fwd_split": [
        (0, 64, 4, 2, ALL),
        (0, 128, 4, 2, D64),
        (0, 64, 4, 3, frozenset({"sm90-d64", "sm80-d64", "sm80-d128"})),
        (0, 128, 8, 2, ALL),
    ],
}

# candidates: configs a GPU measurement has not chosen (``benchmarks/kernel_sweep.py`` times them
# beside SHAPES'; the autotuner and the pin never run them): kernel -> [(BLOCK_M, BLOCK_N,
# warps, stages, classes, extra compile-time arguments)]. The forward's Hopper paths: ``TMA``,
# Q/K/V tiles loaded and O stored through tensor descriptors (masks without clauses); ``WS``,
# its key loop warp-specialized (one masked loop; Triton 3.6 specializes it at 4 warps only).
# Each compiles on sm_90 without spilling (Triton 3.6.0 and 3.9.0, aot_kernels.py --candidates).
# Measured on the H100 (SWEEP_H100, 2026-11-26; ms on dense / causal D128 or dense D64, then
# the band): every plain TMA config agreed with the default's output and none beat the class
# default where listed here; the warp-specialized ones at 3 stages gave WRONG outputs (rel_err inf
# against the default's, on every shape they ran), those at 2 stages right ones, slower. No
# WS config may be listed in SHAPES (a test holds it) until a fix is measured right.
CANDIDATES: dict[str, list[tuple[int, int, int, int, frozenset[str], dict]]] = {
    "band_fwd": [
        (128, 64, 8, 3, frozenset({"sm90-d128"}), TMA),  # 4.940 / 2.656, band 0.970 (4.462 /
        # 2.414 / 0.758 default); listed at D64 (SHAPES)
        (128, 64, 4, 3, frozenset({"sm90-d64"}), TMA_WS),  # wrong on the H100: rel_err inf
        (128, 64, 4, 2, frozenset({"sm90-d128"}), TMA_WS),  # 4.975 / 2.722, band 0.844
        (128, 128, 8, 2, SM90, TMA),  # D128 4.697 / 2.581, band 0.962; D64 3.496, 0.803, 3.172
        (128, 128, 4, 2, frozenset({"sm90-d64"}), TMA_WS),  # 3.685, band 0.718, 2.840
        (128, 64, 8, 2, frozenset({"sm90-d128"}), TMA),  # 5.259 / 2.881, band 1.002
        (128, 32, 4, 3, frozenset({"sm90-d128"}), TMA_WS),  # wrong on the H100: rel_err inf
        (128, 128, 8, 3, frozenset({"sm90-d128"}), TMA),  # a larger D128 tile, 3 stages (not
        # yet measured)
    ],
    # the backward's Hopper paths (no GPU measurement yet): dQ and dK/dV tiles through tensor
    # descriptors, the listed defaults' tiles and larger ones; "ws": one masked loop,
    # warp-specialized (dK/dV: over every query head of the group). Each compiles for sm_90
    # without spilling (Triton 3.6.0 and 3.9.0; docs/kernels.md "The backward's Hopper paths")
    "band_dq": [
        (128, 32, 4, 3, frozenset({"sm90-d64"}), TMA),  # the D64 default's tiles
        (128, 64, 8, 2, SM90, TMA),  # the D128 default's tiles (128x128 spills at D128 under
        # Triton 3.6: 8 bytes)
        (64, 64, 4, 2, SM90, TMA_WS),
    ],
    "band_dkdv": [
        (64, 64, 4, 3, frozenset({"sm90-d64"}), TMA),  # the D64 default's tiles
        (32, 128, 8, 2, frozenset({"sm90-d128"}), TMA),  # the D128 default's tiles
        (64, 128, 8, 2, frozenset({"sm90-d64"}), TMA),  # FA3's tile: 128 keys, 64 rows a step
        (64, 64, 8, 2, frozenset({"sm90-d128"}), TMA),  # 64 rows a step (64x128 spills there)
        (64, 64, 4, 2, frozenset({"sm90-d64"}), TMA_WS),
        (32, 64, 4, 2, SM90, TMA_WS),
    ],
}
# the candidates whose outputs were wrong on the H100 (SWEEP_H100, rel_err inf on every shape)
WRONG_ON_H100 = frozenset({"128x64 w4 s3 tma ws", "128x32 w4 s3 tma ws"})


@dataclass(frozen=True)
class Measured:
    """A class default a GPU measurement chose (or kept): its label, the committed rows it
    came from (a path in the repository), the sweep's cases it was the fastest listed config
    on, and the figures. The AOT check reports the masked-loop ratio of these defaults rather
    than gating it: the ratio is a proxy of speed, and the speed was measured."""

    config: str
    source: str
    cases: tuple[str, ...]
    why: str


# (kernel, class) -> the measurement behind its default (the sweep's listed configs only: the
# candidates were not eligible); tests check each against SHAPES' first entry and the rows
MEASURED: dict[tuple[str, str], Measured] = {
    ("band_fwd", "sm90-d64"): Measured(
        "64x64 w4 s3", SWEEP_H100, ("d64", "w256-16k", "w256-64k"),
        "H100 2026-11-26: 2.720 ms dense, 0.361 / 1.521 ms band 16k / 64k (was 128x64 w8 s3: "
        "3.168, 0.544 / 2.181)"),
    ("band_fwd", "sm90-d128"): Measured(
        "128x64 w8 s3", SWEEP_H100, ("d128", "d128-causal"),
        "H100 2026-11-26: 4.462 ms dense, 2.414 ms causal (kept; on the band at D128 64x32 w4 "
        "s2 is faster, 0.654 vs 0.758 ms)"),
    ("band_dq", "sm90-d64"): Measured(
        "128x32 w4 s3", SWEEP_H100, ("d64",),
        "H100 2026-11-26: 3.233 ms dense (was 128x64 w8 s2: 4.263)"),
    ("band_dq", "sm90-d128"): Measured(
        "128x64 w8 s2", SWEEP_H100, ("d128", "d128-causal"),
        "H100 2026-11-26: 6.419 ms dense, 3.325 ms causal (kept)"),
    ("band_dkdv", "sm90-d64"): Measured(
        "64x64 w4 s3", SWEEP_H100, ("d64",),
        "H100 2026-11-26: 5.184 ms dense (was 64x128 w8 s2: 6.079)"),
    ("band_dkdv", "sm90-d128"): Measured(
        "32x128 w8 s2", SWEEP_H100, ("d128", "d128-causal"),
        "H100 2026-11-26: 11.174 ms dense, 5.555 ms causal (kept)"),
}


def measured(kernel: str, block_d: int, capability: tuple[int, int], label: str,
             flags: Mapping[str, object] | None = None) -> Measured | None:
    """The measurement behind ``label`` when it is the class default a GPU measurement chose
    for this kernel, for a launch of ``flags``' clauses (the sweep's masks had none: a kernel
    compiled with a clause is another kernel, not measured)."""
    if any((flags or {}).get(c) for c in CLAUSES):
        return None
    found = MEASURED.get((kernel, gpu_class(block_d, capability)))
    return found if found is not None and found.config == label else None


def interpreted() -> bool:
    """Whether Triton kernels run in the NumPy interpreter (set before the kernels import)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def gpu_class(block_d: int, capability: tuple[int, int]) -> str:
    """The class a (BLOCK_D, compute capability) falls in (Blackwell and later: sm90's)."""
    return f"sm{90 if capability[0] >= 9 else 80}-d{64 if block_d <= 64 else 128}"


def _config(kernel: str, m: int, n: int, w: int, s: int, extra: dict | None = None
            ) -> triton.Config:
    tiles = {} if kernel.startswith("blocks") else (
        {"BLOCK_N": n} if kernel in KEY_BLOCK_ONLY else {"BLOCK_M": m, "BLOCK_N": n})
    return triton.Config({**tiles, **(extra or {})}, num_warps=w, num_stages=s)


def config_label(cfg: triton.Config) -> str:
    """``BLOCK_MxBLOCK_N wW sS`` (``-`` for a kernel without tile sizes), then any further
    compile-time argument a candidate sets, lower case (``tma``; ``name=value`` unless True)."""
    tiles = "x".join(str(cfg.kwargs[k]) for k in ("BLOCK_M", "BLOCK_N") if k in cfg.kwargs)
    extra = [k.lower() if v is True else f"{k.lower()}={v}" for k, v in cfg.kwargs.items()
             if k not in ("BLOCK_M", "BLOCK_N")]
    return " ".join([f"{tiles or '-'} w{cfg.num_warps} s{cfg.num_stages}", *extra])


def gathered(flags: Mapping[str, object]) -> bool:
    """Whether a launch's compile-time mask clauses (``PREFIX``, ``DILATED``, ...) select
    ``GATHERED_SHAPES``: a prefix walked as a gathered span under dilation."""
    return bool(flags.get("PREFIX")) and bool(flags.get("DILATED"))


def _shapes(kernel: str, gathered_prefix: bool) -> list[tuple]:
    if gathered_prefix and kernel in GATHERED_SHAPES:
        return GATHERED_SHAPES[kernel]
    return SHAPES[kernel]


def _flags(shape: tuple) -> dict:
    """A listed shape's compile-time flags (``TMA``): its sixth element, if any."""
    return shape[5] if len(shape) > 5 else {}


def configs(kernel: str) -> list[triton.Config]:
    """Every config of ``kernel`` (the autotuner's list, ``SHAPES``' then the further ones of
    ``GATHERED_SHAPES``; its prune keeps a class's)."""
    if interpreted():
        if kernel.startswith("blocks"):
            return [triton.Config({}, num_warps=4, num_stages=1)]
        m, n = INTERPRET_BLOCK_M, INTERPRET_BLOCK_N
        if kernel == "band_dkdv":
            m, n = n, m  # rows per step x keys per program
        return [_config(kernel, m, n, 4, 1)]
    found: list[triton.Config] = []
    for shape in [*SHAPES[kernel], *GATHERED_SHAPES.get(kernel, ())]:
        config = _config(kernel, *shape[:4], _flags(shape))
        if not any(_same(config, c) for c in found):
            found.append(config)
    return found


def class_configs(kernel: str, block_d: int, capability: tuple[int, int],
                  flags: Mapping[str, object] | None = None) -> list[triton.Config]:
    """The configs of ``kernel`` that run on a GPU of this class, the default first (whether
    or not the kernels are interpreted here); ``flags``: the launch's mask clauses (``PREFIX``
    with ``DILATED``: ``GATHERED_SHAPES``). A ``TMA`` config is listed whatever the launch:
    :func:`usable` says which a launch may take."""
    where = gpu_class(block_d, capability)
    shapes = _shapes(kernel, gathered(flags or {}))
    return [_config(kernel, *shape[:4], _flags(shape)) for shape in shapes if where in shape[4]]


def candidate_configs(kernel: str, block_d: int, capability: tuple[int, int]
                      ) -> list[triton.Config]:
    """The candidates of ``kernel`` for a GPU of this class (not autotuned, not pinned)."""
    where = gpu_class(block_d, capability)
    return [_config(kernel, *c[:4], c[5]) for c in CANDIDATES.get(kernel, ()) if where in c[4]]


def configs_for(kernel: str, block_d: int, capability: tuple[int, int],
                flags: Mapping[str, object] | None = None) -> list[triton.Config]:
    """The configs ``kernel`` runs here for this GPU class, the default first: the
    interpreter's one under ``TRITON_INTERPRET``, else :func:`class_configs`."""
    if interpreted():
        return configs(kernel)
    return class_configs(kernel, block_d, capability, flags)


def autotuning() -> bool:
    """Whether launches autotune: ``ATTNBENCH_AUTOTUNE`` unset or ``on`` (the default); ``off``:
    each launch runs its kernel's class default and times no other config. Read at each launch,
    so a test or a run may set it at any time."""
    value = os.environ.get(TUNING_ENV, "on").strip().lower()
    if value not in _TUNING:
        raise ValueError(f"{TUNING_ENV}={value!r}: use on or off")
    return _TUNING[value]


def _same(a: triton.Config, b: triton.Config) -> bool:
    return (a.kwargs, a.num_warps, a.num_stages) == (b.kwargs, b.num_warps, b.num_stages)


# what a TMA config reads and writes by descriptor: the forward's Q, K, V, Out; the backward's
# Q, K, V, DO and DQ (dQ) or DK, DV (dK/dV). Q, K, V are every kernel's
TMA_TENSORS = ("Q", "K", "V", "Out", "DO", "DQ", "DK", "DV")
UNADDRESSABLE = 32  # added to MASK_KEY (at most 23) by a launch a descriptor cannot address
CLAUSES = ("GLOBAL", "DILATED", "DOCS", "PREFIX", "PRED")  # PRED: a predicate feature


def tma_allowed(named_args: Mapping[str, object], flags: Mapping[str, object]) -> bool:
    """Whether a launch may take a ``TMA`` config: a mask without clauses (one slot of rows in
    order, keys in order) and Q, K, V, Out whose rows a tensor descriptor can address: unit
    last stride, the other strides and the base 16-byte aligned (D = 59 in bf16 is not).
    Each of ``TMA_TENSORS`` the launch passes is checked, Q, K and V at least."""
    if any(flags.get(c) for c in CLAUSES):
        return False
    for name in TMA_TENSORS:
        t = named_args.get(name)
        if t is None and name not in ("Q", "K", "V"):
            continue  # another kernel's tensor
        if not isinstance(t, torch.Tensor) or t.stride(-1) != 1:
            return False
        size = t.element_size()
        if any(st * size % 16 for st in t.stride()[:-1]):
            return False
        if t.device.type != "meta" and t.data_ptr() % 16:
            return False
    return True


def without_tma(config: triton.Config) -> triton.Config:
    """The config with its pointer loads: ``TMA`` and ``WS`` dropped."""
    kwargs = {k: v for k, v in config.kwargs.items() if k not in ("TMA", "WS")}
    return triton.Config(kwargs, num_warps=config.num_warps, num_stages=config.num_stages)


def usable(found: list[triton.Config], named_args: Mapping[str, object],
           flags: Mapping[str, object]) -> list[triton.Config]:
    """``found`` less the ``TMA`` configs a launch of these arguments and mask clauses cannot
    take (:func:`tma_allowed`), as the autotuner's prune keeps them."""
    if tma_allowed(named_args, flags):
        return list(found)
    return [c for c in found if not c.kwargs.get("TMA")]


def tma_key(mask_key: int, named_args: Mapping[str, object]) -> int:
    """The ``MASK_KEY`` a forward launch passes: ``mask_key``, plus ``UNADDRESSABLE`` when a
    tensor descriptor cannot address its rows. Triton's autotuner keys its pick by the key
    arguments and dtypes only, so a D = 59 launch (rows of 118 bytes) sharing every key with a
    D = 64 one would otherwise be handed the TMA config the D = 64 launch tuned to."""
    return mask_key if tma_allowed(named_args, {}) else mask_key + UNADDRESSABLE


def prune(kernel: str) -> Callable:
    """``early_config_prune`` of ``kernel``: the configs of the launch's GPU class (a ``TMA``
    one only where :func:`tma_allowed`)."""

    def keep(all_configs: list, named_args: dict, **kwargs) -> list:
        device = named_args["Q"].device
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else (9, 0)
        wanted = usable(configs_for(kernel, kwargs["BLOCK_D"], capability, kwargs), named_args,
                        kwargs)
        return [c for c in all_configs if any(_same(c, w) for w in wanted)]

    return keep


def current_capability() -> tuple[int, int]:
    """The current CUDA device's compute capability ((9, 0) without one: the default class)."""
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0)
