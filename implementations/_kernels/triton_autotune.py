"""Autotuning configurations of the fused attention kernels, per kernel, head dim and GPU.

Each config is listed with the (architecture, head dim) classes where it compiles without
spilling registers: ``sm90`` (Hopper) or ``sm80`` (Ampere and Ada), head dim ``d64``
(BLOCK_D <= 64) or ``d128`` (larger). The autotuner prunes a config outside the running GPU's
class before timing any (``early_config_prune``), and the first config of a class is the one
assumed before autotuning (executed pairs). Every class was checked ahead of time on sm_90 and
sm_80 at D = 64 and 128 with each mask clause (``benchmarks/aot_kernels.py``; the CPU tests
recheck each kernel's default); configs that spilled were taken out (a 128x64 forward at 4
warps, 128x128 tiles, 32x128 dK/dV at 4 warps). A kernel compiled with both a prefix and
dilation (``PREFIX`` and ``DILATED``: the gathered prefix segment) holds more registers and
takes its lists from ``GATHERED_SHAPES`` where that has one (checked ahead of time with the
``*-dilated-prefix`` workloads; their ``MODE_KEY`` holds both clauses, so they tune apart);
every other kernel's lists are ``SHAPES``' alone.

Under ``TRITON_INTERPRET=1`` (CPU tests) a single small configuration runs: the interpreter's
time goes into every extra config, and small tiles exercise more block edges on small inputs
(tests swap in GPU-sized tiles with ``triton_launch.interpreter_tiles``). The autotuner's key
is ``(n_bucket, q_bucket, BLOCK_D, MODE_KEY)`` plus the tensors' dtypes (Triton adds those).

``ATTNBENCH_AUTOTUNE=off`` (:func:`autotuning`) turns autotuning off: each launch runs its
kernel's class default, the config the AOT check compiles, and times no other
(:mod:`.triton_run`). The tests set it: on a GPU every autotuned launch otherwise compiles and
times every config of its class for every mask mode it meets.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import torch
import triton

TUNE_KEY = ["n_bucket", "q_bucket", "BLOCK_D", "MODE_KEY"]  # plus the dtypes, Triton adds them
TUNING_ENV = "ATTNBENCH_AUTOTUNE"
_TUNING = {"on": True, "1": True, "true": True, "yes": True,
           "off": False, "0": False, "false": False, "no": False}
INTERPRET_BLOCK_M = 32
INTERPRET_BLOCK_N = 16
ALL = frozenset({"sm90-d64", "sm90-d128", "sm80-d64", "sm80-d128"})
D64 = frozenset({"sm90-d64", "sm80-d64"})

# kernel -> [(BLOCK_M, BLOCK_N, warps, stages, classes)]; BLOCK_M of dK/dV is the query rows
# per step, BLOCK_N the keys a program holds; the decode kernel tunes BLOCK_N only (0 = unset)
SHAPES: dict[str, list[tuple[int, int, int, int, frozenset[str]]]] = {
    "band_fwd": [
        (128, 64, 8, 3, frozenset({"sm90-d64", "sm80-d64", "sm90-d128"})),
        (128, 32, 4, 4, D64),
        (64, 64, 4, 3, frozenset({"sm90-d64"})),
        (64, 64, 4, 4, frozenset({"sm90-d64"})),
        (128, 32, 8, 3, frozenset({"sm90-d128"})),
        (64, 64, 4, 2, frozenset({"sm90-d128"})),
        (64, 32, 4, 2, ALL),
    ],
    "band_dq": [
        (128, 64, 8, 2, frozenset({"sm90-d64", "sm80-d64", "sm90-d128"})),
        (64, 64, 8, 2, frozenset({"sm90-d128", "sm80-d128"})),
        (64, 64, 4, 3, D64),
        (128, 32, 4, 3, D64),
        (64, 32, 4, 3, frozenset({"sm90-d128", "sm80-d128"})),
        (64, 32, 4, 2, ALL),
        (32, 32, 4, 2, ALL),
    ],
    "band_dkdv": [
        (64, 128, 8, 2, frozenset({"sm90-d64"})),
        (32, 128, 8, 2, frozenset({"sm90-d128"})),
        (64, 64, 8, 2, frozenset({"sm90-d128", "sm80-d128"})),
        (32, 64, 4, 2, D64),
        (32, 64, 8, 2, frozenset({"sm90-d128", "sm80-d128"})),
        (64, 64, 4, 3, frozenset({"sm90-d64"})),
        (16, 128, 8, 2, frozenset({"sm90-d128", "sm80-d128"})),
        (16, 32, 4, 2, ALL),
    ],
    "band_fwd_split": [
        (0, 64, 4, 2, ALL),
        (0, 128, 4, 2, ALL),
        (0, 64, 4, 3, frozenset({"sm90-d64", "sm80-d64", "sm80-d128"})),
        (0, 128, 8, 2, ALL),
    ],
    # block-list kernels: the tile is the layout block, only the pipeline is tuned
    "blocks_fwd": [(0, 0, w, s, ALL) for w in (4, 8) for s in (2, 3)],
    "blocks_dq": [(0, 0, w, s, ALL) for w in (4, 8) for s in (2, 3)],
    "blocks_dkdv": [(0, 0, 8, 2, ALL), (0, 0, 8, 3, ALL), (0, 0, 4, 2, D64), (0, 0, 4, 3, D64)],
}
# the band kernels compiled with PREFIX and DILATED both on (the gathered prefix segment holds
# more registers): SHAPES' lists less the configs that spill there (128x64 forward and 64x64
# at D128 on sm_90, dQ at 128x64/64x64/128x32 on sm_80 D64, 64x64 and 16x128 dK/dV at D128,
# 64x64/4w dK/dV on sm_90 D64, 32x64/4w dK/dV on sm_80 D64, the decode's 128 keys/4w at D128),
# plus three that do not spill there: on sm_80 D64, 64x64/8w dQ, 32x64/8w and 16x64/4w dK/dV
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

# candidates: configs a GPU measurement has not yet chosen (``benchmarks/kernel_sweep.py`` times
# them beside SHAPES'; the autotuner and the pin never run them): kernel -> [(BLOCK_M, BLOCK_N,
# warps, stages, classes, extra compile-time arguments)]. The forward's Hopper paths: ``TMA``,
# Q/K/V tiles loaded and O stored through tensor descriptors (masks without clauses); ``WS``,
# its key loop warp-specialized (one masked loop; Triton 3.6 specializes it at 4 warps only).
# Each compiles on sm_90 without spilling (Triton 3.6.0 and 3.9.0, aot_kernels.py --candidates).
SM90 = frozenset({"sm90-d64", "sm90-d128"})
TMA = {"TMA": True}
TMA_WS = {"TMA": True, "WS": True}
CANDIDATES: dict[str, list[tuple[int, int, int, int, frozenset[str], dict]]] = {
    "band_fwd": [
        (128, 64, 8, 3, SM90, TMA),
        (128, 64, 4, 3, frozenset({"sm90-d64"}), TMA_WS),
        (128, 64, 4, 2, frozenset({"sm90-d128"}), TMA_WS),
        (128, 128, 8, 2, SM90, TMA),
        (128, 128, 4, 2, frozenset({"sm90-d64"}), TMA_WS),
        (128, 64, 8, 2, frozenset({"sm90-d128"}), TMA),
        (128, 32, 4, 3, frozenset({"sm90-d128"}), TMA_WS),
    ],
}


def interpreted() -> bool:
    """Whether Triton kernels run in the NumPy interpreter (set before the kernels import)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def gpu_class(block_d: int, capability: tuple[int, int]) -> str:
    """The class a (BLOCK_D, compute capability) falls in (Blackwell and later: sm90's)."""
    return f"sm{90 if capability[0] >= 9 else 80}-d{64 if block_d <= 64 else 128}"


def _config(kernel: str, m: int, n: int, w: int, s: int, extra: dict | None = None
            ) -> triton.Config:
    tiles = {} if kernel.startswith("blocks") else (
        {"BLOCK_N": n} if kernel == "band_fwd_split" else {"BLOCK_M": m, "BLOCK_N": n})
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
    ``GATHERED_SHAPES``: a prefix walked as a gathered segment under dilation."""
    return bool(flags.get("PREFIX")) and bool(flags.get("DILATED"))


def _shapes(kernel: str, gathered_prefix: bool) -> list[tuple]:
    if gathered_prefix and kernel in GATHERED_SHAPES:
        return GATHERED_SHAPES[kernel]
    return SHAPES[kernel]


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
    shapes = [shape[:4] for shape in SHAPES[kernel]]
    for shape in GATHERED_SHAPES.get(kernel, ()):
        if shape[:4] not in shapes:
            shapes.append(shape[:4])
    return [_config(kernel, *shape) for shape in shapes]


def class_configs(kernel: str, block_d: int, capability: tuple[int, int],
                  flags: Mapping[str, object] | None = None) -> list[triton.Config]:
    """The configs of ``kernel`` that run on a GPU of this class, the default first (whether
    or not the kernels are interpreted here); ``flags``: the launch's mask clauses (``PREFIX``
    with ``DILATED``: ``GATHERED_SHAPES``)."""
    where = gpu_class(block_d, capability)
    shapes = _shapes(kernel, gathered(flags or {}))
    return [_config(kernel, *shape[:4]) for shape in shapes if where in shape[4]]


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


TMA_TENSORS = ("Q", "K", "V", "Out")  # what a TMA config reads and writes by descriptor
CLAUSES = ("GLOBAL", "DILATED", "DOCS", "PREFIX")


def tma_allowed(named_args: Mapping[str, object], flags: Mapping[str, object]) -> bool:
    """Whether a launch may take a ``TMA`` config: a mask without clauses (one slot of rows in
    order, keys in order) and Q, K, V, Out whose rows a tensor descriptor can address: unit
    last stride, the other strides and the base 16-byte aligned (D = 59 in bf16 is not)."""
    if any(flags.get(c) for c in CLAUSES):
        return False
    for name in TMA_TENSORS:
        t = named_args.get(name)
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


def prune(kernel: str) -> Callable:
    """``early_config_prune`` of ``kernel``: the configs of the launch's GPU class (a ``TMA``
    one only where :func:`tma_allowed`)."""

    def keep(all_configs: list, named_args: dict, **kwargs) -> list:
        device = named_args["Q"].device
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else (9, 0)
        wanted = configs_for(kernel, kwargs["BLOCK_D"], capability, kwargs)
        if not tma_allowed(named_args, kwargs):
            wanted = [w for w in wanted if not w.kwargs.get("TMA")]
        return [c for c in all_configs if any(_same(c, w) for w in wanted)]

    return keep


def current_capability() -> tuple[int, int]:
    """The current CUDA device's compute capability ((9, 0) without one: the default class)."""
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0)
