"""Ahead-of-time compilation of the fused kernels for GPUs this machine does not have.

The real launch code (:mod:`.attention_launches`) runs on ``meta`` tensors with its launches
recorded and not run (:func:`.kernel_launch.watching`), so each kernel is compiled with exactly the
arguments, specializations and compile-time constants a CUDA call of that shape would give it.
Triton then compiles each recorded launch for a target (``sm_90``: Hopper, ``sm_80``: Ampere)
through a stand-in driver that names the target; ``ptxas`` (bundled with Triton) produces the
cubin, ``cuobjdump`` reads its registers and stack (spilled registers), ``nvdisasm`` its SASS
(:mod:`.cubin`; :func:`run_jobs` disassembles the cubins of a target in a few batches, after
the compiles: an ``nvdisasm`` start costs more than a kernel's disassembly). From the SASS:
the tensor-core instruction kind (``HGMMA``: wgmma, ``HMMA``: mma.sync) and the size of each
innermost loop that holds one, so a masked loop can be compared with the unmasked one.

:func:`verdicts` holds the gates: compiles, no spill, shared memory within the target's, a
default's masked loop within ``MASKED_RATIO_LIMIT`` of the unmasked one (reported, not gated,
for a default a GPU measurement chose: ``autotune.MEASURED``), the forward's default
within its register target (``FORWARD_REGS``).

Needs Triton with its NVIDIA backend and no ``TRITON_INTERPRET`` when the kernels were
imported (then they are interpreted functions). Used by ``benchmarks/aot_kernels.py`` (the full
table) and the CPU tests (one config per kernel).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from dataclasses import asdict, dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.cache import get_cache_manager, triton_key

from harness.masks import MaskSpec
from implementations._kernels.triton import (
    attention_launches,
    backward,
    backward_blocks,
    cubin,
    decode_split_kv,
    feature_attention,
    feature_kernels,
    forward,
    kernel_launch,
    linear_chunk,
    nystrom_kernels,
    nystrom_path,
    paged_attention,
    paged_decode,
)
from implementations._kernels.triton.autotune import (
    candidate_configs,
    class_configs,
    config_label,
    measured,
    usable,
)
from implementations._kernels.triton.kernel_launch import Launch

TARGETS = {"sm_90": 90, "sm_80": 80}
SMEM_LIMIT = {90: 232448, 80: 166912}  # opt-in shared memory per block: H100, A100 (bytes)
# a masked band loop's SASS instructions over the unmasked loop's: the CI's proxy of what the
# masked blocks cost. It gates every default but those a GPU measurement chose (``measured``:
# their ratio is reported, the measured speed being what the proxy stands for)
MASKED_RATIO_LIMIT = 1.5
# the CI's register target of the forward's default on sm_90 at D 64 (64x64, 4 warps): at most
# 168 registers a thread keeps 3 programs of 128 threads resident on an SM (3 x 128 x 168 =
# 64512 of 65536 registers); their shared memory (56 KiB each) would allow 4
FORWARD_REGS = {("band_fwd", 64, "64x64 w4 s3"): 168}
KERNELS = (  # (module, name): every kernel the launches use
    (forward, "band_fwd"), (forward, "blocks_fwd"), (decode_split_kv, "band_fwd_split"),
    (decode_split_kv, "split_combine"), (backward, "delta_kernel"), (backward, "band_dq"),
    (backward, "band_dkdv"), (backward_blocks, "blocks_dq"),
    (backward_blocks, "blocks_dkdv"), (feature_kernels, "feature_state"),
    (feature_kernels, "feature_combine"), (feature_kernels, "feature_output"),
    (linear_chunk, "feature_scan"), (linear_chunk, "feature_chunk"),
    (nystrom_kernels, "nys_landmarks"), (nystrom_kernels, "nys_key_pass"),
    (nystrom_kernels, "nys_pinv"), (nystrom_kernels, "nys_output"),
    (paged_decode, "paged_decode"), (paged_decode, "paged_combine"),
)
BIGBIRD = MaskSpec(causal=True, window=(3, 0), block_size=64, random_blocks=2, global_tokens=64)
# workload -> (mask, n_q, n_k, H, H_kv, backward); the first mask of each family is the CI one
WORKLOADS: dict[str, tuple[MaskSpec, int, int, int, int, bool]] = {
    "band": (MaskSpec(causal=True, window=(255, 0)), 4096, 4096, 16, 16, True),
    "band-longformer": (MaskSpec(causal=True, window=(255, 0), dilation=2,
                                 global_tokens=(0, 1000)), 4096, 4096, 16, 16, True),
    "band-documents": (MaskSpec(causal=True, prefix_len=64, documents=(1000, 3000, 96)),
                       4096, 4096, 16, 16, True),
    "band-dilated-prefix": (MaskSpec(causal=True, window=(255, 0), dilation=2, prefix_len=512,
                                     global_tokens=(0, 1000)), 4096, 4096, 16, 16, True),
    "decode": (MaskSpec(causal=True), 1, 8192, 32, 8, False),
    "decode-window": (MaskSpec(causal=True, window=(1023, 0), global_tokens=4), 4, 8192, 32, 8,
                      False),
    "decode-dilated-prefix": (MaskSpec(causal=True, window=(1023, 0), dilation=2,
                                       prefix_len=64, global_tokens=4), 4, 8192, 32, 8, False),
    "blocks": (BIGBIRD, 4096, 4096, 16, 16, True),
}
# workload -> (random features m, or 0 for φ = elu + 1; n; H; H_kv): the fused non-causal
# feature-map attention (``feature_attention``; ``-causal``: ``linear``'s causal chunk kernel,
# ``chunk_attention``), B1 as the GPU targets
FEATURE_WORKLOADS: dict[str, tuple[int, int, int, int]] = {
    "feature-linear": (0, 65536, 16, 16),
    "feature-performer": (256, 65536, 16, 16),
    "feature-linear-causal": (0, 65536, 16, 16),
    "feature-performer-causal": (256, 65536, 16, 16),
    "feature-linear-combine": (0, 65536, 16, 16),
    "feature-performer-combine": (256, 65536, 16, 16),
    "nystrom": (64, 65536, 16, 16),  # m = 64 landmarks: the fused Nyström's four kernels
}
# not in the CI's compiles: FAVOR+'s causal chunk kernel spills 8 bytes on sm_80 (none on
# sm_90; docs/linear_attention.md), a candidate until a spill-free sm_80 tile is found;
# ``--workloads feature-performer-causal`` compiles it
CI_LEFT_OUT = ("feature-performer-causal",)
# workload -> (page size, dtype): the paged decode (``paged_decode_attention``) of the issue's
# GPU serving suite, Llama-3-8B attention (``PAGED_SHAPE``); the CI compiles bf16 at every
# target, head dim and page size, and the fp16 split kernel at ``PAGED_CI_EXTRA`` (each page
# size and target once)
PAGED_WORKLOADS: dict[str, tuple[int, torch.dtype]] = {
    "paged-16": (16, torch.bfloat16),
    "paged-64": (64, torch.bfloat16),
    "paged-16-fp16": (16, torch.float16),
    "paged-64-fp16": (64, torch.float16),
}
PAGED_SHAPE = (16, 32, 8, 1, 32768)  # batch, H, H_kv, q_len, the longest context
PAGED_CI = ("paged-16", "paged-64")
PAGED_CI_EXTRA = (("paged-16-fp16", 128, "sm_90"), ("paged-64-fp16", 64, "sm_80"))
ALL_WORKLOADS = (*WORKLOADS, *FEATURE_WORKLOADS, *PAGED_WORKLOADS)
CI_WORKLOADS = ("band", "decode", "blocks")
# the kernels with Hopper paths (TMA, warp-specialized): the CI compiles the first of each at
# the widest head dim (HOPPER_HEAD_DIM: the widest accumulators, where a spill shows first;
# wgmma, bulk tensor copies and USETMAXREG are each path's at any D), and a listed Hopper
# config (one the GPU's autotuner runs) at every head dim
HOPPER_KERNELS = ("band_fwd", "band_dq", "band_dkdv")
HOPPER_HEAD_DIM = 128
# the CI's further defaults: the prefix-with-dilation kernels nearest the register limit
# (they spilled at SHAPES' defaults): (workload, kernel, head dim, target)
CI_EXTRA = (
    ("band-dilated-prefix", "band_fwd", 128, "sm_90"),
    ("band-dilated-prefix", "band_dq", 64, "sm_80"),
    ("band-dilated-prefix", "band_dkdv", 64, "sm_80"),
    ("band-dilated-prefix", "band_dkdv", 128, "sm_80"),
)


@dataclass(frozen=True)
class Compiled:
    """What one (kernel, config, head dim, target) compiled to."""

    kernel: str
    workload: str
    config: str
    default: bool  # the config assumed before autotuning (the list's first)
    candidate: bool  # a candidate (autotune.CANDIDATES): swept, not yet autotuned
    measured: str | None  # a default a GPU measurement chose: its source (autotune.MEASURED)
    head_dim: int
    target: str
    regs: int
    spill_bytes: int  # stack frame: registers spilled to local memory
    smem_bytes: int
    smem_limit: int
    mma: str  # wgmma | mma.sync | none
    sass: int  # instructions in the kernel
    loops: tuple[int, ...]  # instructions of each innermost loop holding an MMA, in order
    spans: int  # the first loops walk partners outside the band: global positions, and
    # a dilated prefix (class slots of a dilation with a prefix)
    tma: int  # SASS bulk tensor copies (UTMALDG loads, UTMASTG stores): the TMA path
    bulk_tensor: int  # PTX cp.async.bulk.tensor instructions
    setmaxnreg: int  # SASS USETMAXREG: warp groups re-balancing registers (warp-specialized)
    seconds: float
    cache_entry: str  # its folder in Triton's cache (TRITON_CACHE_DIR): a key of what compiled

    @property
    def masked_ratio(self) -> float | None:
        """The masked band loop over the unmasked one: the largest and the smallest MMA loop,
        the spans' (a second interval, gathers) left out."""
        band = self.loops[self.spans:]
        return max(band) / min(band) if len(band) >= 2 else None

    @property
    def cross_ratio(self) -> float | None:
        """The largest span loop (global positions, a dilated prefix) over the unmasked
        one."""
        spans, band = self.loops[:self.spans], self.loops[self.spans:]
        return max(spans) / min(band) if spans and band else None

    @property
    def ratio_gated(self) -> bool:
        """Whether the masked-loop proxy gates this row: a default no GPU measurement chose."""
        return self.default and self.measured is None

    def row(self) -> dict:
        return {**asdict(self), "masked_ratio": self.masked_ratio,
                "cross_ratio": self.cross_ratio, "ratio_gated": self.ratio_gated}


class _Target:
    """A stand-in for Triton's CUDA driver that only names a compile target."""

    def __init__(self, capability: int):
        self.target = GPUTarget("cuda", capability, 32)
        self.capability = capability

    def get_current_device(self) -> int:
        return self.capability  # one binder cache per target in each JITFunction

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return self.target

    def is_active(self) -> bool:
        return True


def record(workload: str, head_dim: int, batch: int = 2, shape: tuple | None = None,
           dtype: torch.dtype = torch.bfloat16) -> list[Launch]:
    """The launches a CUDA call of ``workload`` at ``head_dim`` (``dtype``) makes, recorded from
    the real launch code on meta tensors (:func:`.kernel_launch.watching`, not executed): the
    forward, then (when it has one) the backward.
    ``shape``: a workload not in the tables, as ``WORKLOADS`` (6 fields) or
    ``FEATURE_WORKLOADS`` (4, and n_q when it is not n) spell one
    (``lease/warm_cache.py``: a suite's points). A ``PAGED_WORKLOADS`` one is
    :func:`record_paged`'s at ``PAGED_SHAPE``."""
    if workload in PAGED_WORKLOADS and shape is None:
        page, dtype = PAGED_WORKLOADS[workload]
        return record_paged(workload, head_dim, (page, *PAGED_SHAPE), dtype)
    seen: list[Launch] = []
    shape = shape or FEATURE_WORKLOADS.get(workload) or WORKLOADS[workload]
    if len(shape) < 6:  # the feature-map attention
        features, n, heads, kv_heads, *rows = shape
        mask, n_q, n_k, with_backward = None, rows[0] if rows else n, n, False
    else:
        mask, n_q, n_k, heads, kv_heads, with_backward = shape
    meta = dict(device="meta", dtype=dtype)
    q = torch.empty(batch, heads, n_q, head_dim, **meta)
    k, v = (torch.empty(batch, kv_heads, n_k, head_dim, **meta) for _ in range(2))
    with kernel_launch.watching(seen.append, execute=False):
        if mask is None:  # the feature-map attention: three launches
            w = torch.empty(2, features, head_dim, device="meta") if features else None
            if workload == "nystrom":
                nystrom_path.nystrom_path(q, k, v, features, 6, head_dim**-0.5)
            elif workload.endswith("-causal"):
                feature_attention.chunk_attention(q, k, v, w, head_dim**-0.5)
            else:  # ``-combine``: the two-launch candidate (fused = 2)
                feature_attention.feature_attention(q, k, v, w, head_dim**-0.5,
                                                    combine=workload.endswith("-combine"))
            return seen
        out, lse = attention_launches.attention_forward(q, k, v, mask, head_dim**-0.5)
        if with_backward:
            attention_launches.attention_backward(q, k, v, out, lse, out, mask, head_dim**-0.5)
    return seen


def record_paged(workload: str, head_dim: int, shape: tuple[int, ...],
                 dtype: torch.dtype) -> list[Launch]:
    """The two launches of a paged decode call (``paged_attention.paged_decode_attention``) of
    ``shape`` = (page size, batch, H, H_kv, q_len, longest context), on meta tensors: a block
    table as wide as the longest context needs (the split count reads its width only)."""
    page, batch, heads, kv_heads, q_len, context = shape
    pages = -(-context // page)
    meta = dict(device="meta", dtype=dtype)
    q = torch.empty(batch, heads, q_len, head_dim, **meta)
    k, v = (torch.empty(batch * pages, page, kv_heads, head_dim, **meta) for _ in range(2))
    table = torch.empty(batch, pages, device="meta", dtype=torch.int32)
    lens = torch.empty(batch, device="meta", dtype=torch.int32)
    seen: list[Launch] = []
    with kernel_launch.watching(seen.append, execute=False):
        paged_attention.paged_decode_attention(q, k, v, table, lens, head_dim**-0.5)
    return seen


def configs(launch: Launch, target: str) -> list[triton.Config]:
    """The configs a launch may run on ``target``: the autotuned kernel's for that GPU class
    (its default first) then its candidates (a TMA one where the launch allows it), or the
    launch's own options."""
    if hasattr(launch.kernel, "configs"):
        return listed(launch, target) + candidates(launch, target)
    return [triton.Config({}, num_warps=launch.kwargs.get("num_warps", 4),
                          num_stages=launch.kwargs.get("num_stages", 3))]


def listed(launch: Launch, target: str) -> list[triton.Config]:
    """The autotuned kernel's configs for ``target``'s GPU class (empty for another kernel)."""
    if not hasattr(launch.kernel, "configs"):
        return []
    capability = divmod(TARGETS[target], 10)
    found = class_configs(launch.name, launch.kwargs["BLOCK_D"], capability, launch.kwargs)
    return usable(found, _named(launch), launch.kwargs)  # a TMA one where the launch allows it


def candidates(launch: Launch, target: str) -> list[triton.Config]:
    """The kernel's candidates for ``target``'s class that this launch may take."""
    if not hasattr(launch.kernel, "configs"):
        return []
    found = candidate_configs(launch.name, launch.kwargs["BLOCK_D"], divmod(TARGETS[target], 10))
    return usable(found, _named(launch), launch.kwargs)


def _named(launch: Launch) -> dict:
    return dict(zip(launch.kernel.arg_names, launch.args, strict=False))


def _compile(launch: Launch, index: int, target: str, workload: str) -> tuple[dict, bytes]:
    """Compile config ``index`` of ``launch`` for ``target``: the row's fields that the SASS does
    not give, and the kernel's code section (disassembled later, many at once)."""
    cfg = configs(launch, target)[index]
    capability = TARGETS[target]
    fn = launch.kernel.fn if hasattr(launch.kernel, "configs") else launch.kernel  # autotuned
    kwargs = {**launch.kwargs, **cfg.kwargs, "num_warps": cfg.num_warps,
              "num_stages": cfg.num_stages}
    start = time.perf_counter()
    saved = getattr(driver, "_active", None)  # reset_active() would load the real driver
    driver.set_active(_Target(capability))
    try:
        kernel = fn.warmup(*launch.args, grid=(1,), **kwargs)
    finally:
        driver._active = saved
    regs, stack = cubin.resources(kernel.asm["cubin"])
    label = config_label(cfg)
    found = measured(launch.name, launch.kwargs.get("BLOCK_D", 0), divmod(capability, 10), label,
                     launch.kwargs) if index == 0 and hasattr(launch.kernel, "configs") else None
    fields = dict(
        kernel=launch.name, workload=workload, config=label, default=index == 0,
        candidate=index >= max(len(listed(launch, target)), 1), measured=found and found.source,
        head_dim=launch.kwargs.get("D", 0), target=target, regs=regs, spill_bytes=stack,
        smem_bytes=int(kernel.metadata.shared), smem_limit=SMEM_LIMIT[capability],
        bulk_tensor=kernel.asm["ptx"].count("cp.async.bulk.tensor"),
        seconds=round(time.perf_counter() - start, 2),
        cache_entry=os.path.basename(get_cache_manager(kernel.hash).cache_dir),
    )
    return fields, cubin.code_section(kernel.asm["cubin"])


def _compiled(fields: dict, sass: list[tuple[int, str]], launch: Launch) -> Compiled:
    """The row of a compile (:func:`_compile`'s fields) with what its SASS gives."""
    count = lambda word: sum(word in text for _, text in sass)
    return Compiled(**fields, mma=mma_kind(sass), sass=len(sass), loops=mma_loops(sass),
                    spans=_spans(launch, sass), tma=count("UTMALDG") + count("UTMASTG"),
                    setmaxnreg=count("USETMAXREG"))


def _spans(launch: Launch, sass: list[tuple[int, str]]) -> int:
    """:func:`spans` of a band kernel; every loop of a feature-map kernel (no band: no
    masked/unmasked pair to compare)."""
    if launch.name.startswith("feature_"):
        return len(mma_loops(sass))
    return spans(launch.kwargs)


def spans(flags: dict) -> int:
    """How many loops a band kernel runs before its band: the global positions' span, and
    a dilated prefix's."""
    return int(bool(flags.get("GLOBAL"))) + int(bool(flags.get("PREFIX") and flags.get("DILATED")))


def mma_kind(sass: list[tuple[int, str]]) -> str:
    ops = {text.split()[0].lstrip("@!P0123456789T ").split(".")[0] for _, text in sass if text}
    if any("HGMMA" in text for _, text in sass):
        return "wgmma"
    return "mma.sync" if any("HMMA" in op for op in ops) else "none"


def mma_loops(sass: list[tuple[int, str]]) -> tuple[int, ...]:
    """Instructions of each innermost loop (a backward branch's span) that holds an MMA."""
    spans = []
    for addr, text in sass:
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            spans.append((int(target.group(1), 16), addr))
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    sizes = []
    for lo, hi in sorted(inner):
        body = [text for addr, text in sass if lo <= addr <= hi]
        if any("GMMA" in t or "HMMA" in t for t in body):
            sizes.append(len(body))
    return tuple(sizes)


Job = tuple[str, int, str, int, int]  # (workload, head dim, target, launch index, config index)


def jobs(workloads: tuple[str, ...], head_dims: tuple[int, ...], targets: tuple[str, ...],
         all_configs: bool, with_candidates: bool = False) -> list[Job]:
    """Every (workload, D, target, launch, config) to compile; ``all_configs`` False: the
    default config of each launch only; ``with_candidates``: the candidates too. Kernels
    shared by workloads (delta) compile once."""
    out, done = [], set()
    for workload in workloads:
        for d in head_dims:
            for i, launch in enumerate(record(workload, d)):
                for target in targets:
                    count = max(len(listed(launch, target)), 1) if all_configs else 1
                    if with_candidates:
                        count = len(configs(launch, target))
                    for c in range(count):
                        key = (launch.name, d, target, c, _flags(launch))
                        if key not in done:
                            done.add(key)
                            out.append((workload, d, target, i, c))
    return out


def ci_jobs(head_dims: tuple[int, ...], targets: tuple[str, ...]) -> list[Job]:
    """The CI's compiles: the default config of each launch of ``CI_WORKLOADS``,
    ``FEATURE_WORKLOADS`` (the feature-map attention's pinned tiles) and ``PAGED_CI`` (and
    the fp16 ``PAGED_CI_EXTRA``), then the
    ``CI_EXTRA`` defaults, then on sm_90 the first config of each Hopper path (TMA; TMA with a
    warp-specialized loop) of the forward, dQ and dK/dV (``HOPPER_KERNELS``), a listed one
    before the candidates, at ``HOPPER_HEAD_DIM`` (the largest of ``head_dims`` without it),
    and at the other head dims where that first config is a listed one, within ``head_dims``
    and ``targets``."""
    out = jobs(CI_WORKLOADS, head_dims, targets, False)
    out += jobs(tuple(w for w in FEATURE_WORKLOADS if w not in CI_LEFT_OUT), head_dims,
                targets, False)
    out += jobs(PAGED_CI, head_dims, targets, False)
    for workload, d, target in PAGED_CI_EXTRA:  # the split kernel (the combine stores fp16 alike)
        if d in head_dims and target in targets:
            out.append((workload, d, target, 0, 0))
    for workload, kernel, d, target in CI_EXTRA:
        if d in head_dims and target in targets:
            names = [launch.name for launch in record(workload, d)]
            out.append((workload, d, target, names.index(kernel), 0))
    widest = HOPPER_HEAD_DIM if HOPPER_HEAD_DIM in head_dims else max(head_dims, default=0)
    for d in head_dims if "sm_90" in targets else ():
        recorded = record("band", d)
        for kernel in HOPPER_KERNELS:
            i = [launch.name for launch in recorded].index(kernel)
            every = configs(recorded[i], "sm_90")
            n_listed = len(listed(recorded[i], "sm_90"))
            for ws in (False, True):
                picks = [c for c, cfg in enumerate(every)
                         if cfg.kwargs.get("TMA") and bool(cfg.kwargs.get("WS")) == ws]
                if picks and (d == widest or picks[0] < n_listed):
                    out.append(("band", d, "sm_90", i, picks[0]))
    return out


def _flags(launch: Launch) -> tuple:
    """What makes two launches of a kernel one compile: its constexpr flags with the kernel's
    defaults filled in (a flag a launch leaves out is its default: ``linear``'s causal key pass
    is the non-causal one's ``feature_state``), its launch options, and how each other
    argument specializes (a tensor's dtype; an int's being 1 or a multiple of 16)."""
    fn = launch.kernel.fn if hasattr(launch.kernel, "configs") else launch.kernel
    params = getattr(fn, "params", ())
    flags = {p.name: p.default for p in params if p.is_constexpr and p.has_default}
    flags.update((k, v) for k, v in launch.kwargs.items() if k.isupper())
    options = tuple((k, launch.kwargs.get(k)) for k in ("num_warps", "num_stages"))
    args = tuple(_specialized(a) for a in launch.args)
    return tuple(sorted((k, v) for k, v in flags.items() if k.isupper())), options, args


def _specialized(arg: object) -> object:
    if isinstance(arg, torch.Tensor):
        return str(arg.dtype)
    if isinstance(arg, bool) or not isinstance(arg, int):
        return arg if arg is None or isinstance(arg, bool) else type(arg).__name__
    return (arg == 1, arg % 16 == 0)


def _compile_job(job: Job) -> tuple[dict, bytes] | dict:
    """:func:`_compile` of one job, or its row when the compile fails."""
    workload, d, target, i, c = job
    launch = record(workload, d)[i]
    try:
        return _compile(launch, c, target, workload)
    except Exception as exc:  # one failing compile is its row; the table goes on
        return _error_row(job, launch, exc)


def _finish(job: Job, fields: dict, sass: list[tuple[int, str]] | str) -> dict:
    """The row of a compiled job from its fields and its code section's SASS (a str: why the
    disassembly failed)."""
    workload, d, _, i, _ = job
    launch = record(workload, d)[i]
    try:
        if isinstance(sass, str):
            raise RuntimeError(f"nvdisasm: {sass}")
        return _compiled(fields, sass, launch).row()
    except Exception as exc:  # as a compile's
        return _error_row(job, launch, exc)


def _error_row(job: Job, launch: Launch, exc: Exception) -> dict:
    workload, d, target, _, c = job
    return {"kernel": launch.name, "workload": workload, "head_dim": d, "target": target,
            "config": config_label(configs(launch, target)[c]), "default": c == 0,
            "candidate": c >= max(len(listed(launch, target)), 1), "measured": None,
            "ratio_gated": c == 0,
            "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"}


def _disassemble(batch: tuple[int, list[bytes]]) -> list[list[tuple[int, str]]] | str:
    """:func:`cubin.sass_of_many` of (capability, code sections), or why it failed."""
    try:
        return cubin.sass_of_many(batch[1], batch[0])
    except Exception as exc:  # each job of the batch gets it as its error
        return f"{type(exc).__name__}: {str(exc).strip()[:200]}"


def run_jobs(todo: list[Job], workers: int) -> list[dict]:
    """Compile ``todo`` over ``workers`` processes (fork: the kernels are already imported),
    then disassemble the cubins of each target in ``workers`` batches (one ``nvdisasm`` each:
    its start costs more than a kernel's disassembly)."""
    if workers <= 1:
        compiled = [_compile_job(job) for job in todo]
    else:
        triton_key()  # the compiles' cache key hashes libtriton (~1 CPU-s): once, before the fork
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            compiled = pool.map(_compile_job, todo, chunksize=1)
    batches: list[tuple[int, list[int]]] = []  # (capability, indexes of its jobs)
    for target, capability in TARGETS.items():
        mine = [n for n, (job, c) in enumerate(zip(todo, compiled, strict=True))
                if job[2] == target and not isinstance(c, dict)]
        size = -(-len(mine) // max(workers, 1)) or 1
        batches += [(capability, mine[k:k + size]) for k in range(0, len(mine), size)]
    work = [(capability, [compiled[n][1] for n in jobs]) for capability, jobs in batches]
    if workers <= 1:
        listings = [_disassemble(b) for b in work]
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            listings = pool.map(_disassemble, work, chunksize=1)
    sass: dict[int, list[tuple[int, str]] | str] = {}
    for (_, jobs), listing in zip(batches, listings, strict=True):
        sass.update(zip(jobs, listing if isinstance(listing, list) else [listing] * len(jobs),
                        strict=True))
    return [c if isinstance(c, dict) else _finish(job, c[0], sass[n])  # dict: an error row
            for n, (job, c) in enumerate(zip(todo, compiled, strict=True))]


def verdicts(rows: list[dict]) -> tuple[list[str], list[str]]:
    """(failures, notes) of compiled rows: a failure is a compile error, shared memory over the
    target's limit, a spill, a default whose masked loop is over ``MASKED_RATIO_LIMIT`` x the
    unmasked one (a default no GPU measurement chose: ``ratio_gated``), or the forward over
    its register target (``FORWARD_REGS``); a note, a default a measurement chose that is over
    the proxy (reported, not gated: the measured speed is what the proxy stands for)."""
    failures, notes = [], []
    for r in rows:
        name = f"{r['kernel']} {r['config']} D={r['head_dim']} {r['target']}"
        if r.get("error"):
            failures.append(f"{name}: {r['error']}")
            continue
        if r["smem_bytes"] > r["smem_limit"] or r["spill_bytes"]:
            failures.append(f"{name}: spills {r['spill_bytes']} bytes or exceeds shared memory")
        ratio = r.get("masked_ratio")
        if r["default"] and ratio is not None and ratio > MASKED_RATIO_LIMIT:
            if r["ratio_gated"]:
                failures.append(f"{name}: masked loop {ratio:.2f}x the unmasked one "
                                f"(limit {MASKED_RATIO_LIMIT}x)")
            else:
                notes.append(f"{name}: masked loop {ratio:.2f}x the unmasked one, over the "
                             f"{MASKED_RATIO_LIMIT}x proxy; reported, not gated: a default "
                             f"measured on a GPU ({r['measured']})")
        target = FORWARD_REGS.get((r["kernel"], r["head_dim"], r["config"]))
        if r["default"] and r["target"] == "sm_90" and target and r["regs"] > target:
            failures.append(f"{name}: {r['regs']} registers (target {target})")
    return failures, notes
