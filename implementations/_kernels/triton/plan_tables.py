"""The plan on the device, without Triton: the index tables per (spec, n_q, n_k, device),
cached, and the autotuner's key of a problem.

The tables are the plans of :mod:`.band_plan` and :mod:`.blocklist_plan` as int32 tensors on the
device; building them is the part of a first call that :func:`.masked_attention.prepare_tables`
moves out of the timed region. The cache is keyed by :func:`device_key`, so that preparing on
``"cuda"`` and calling with tensors on ``cuda:0`` find the same tables.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import torch
from torch import Tensor

from harness.mask_features import documents, predicate
from harness.masks import MaskSpec
from implementations._kernels.triton.band_plan import BandPlan, band_plan
from implementations._kernels.triton.blocklist_plan import BlockPlan, block_plan, block_tile

DECODE_MAX_ROWS = 16  # n_q up to this runs the split-KV decode kernels
DEFAULT_SMS = 132  # an H100's SM count: the split count off a GPU (the interpreter)
# split-KV decode: programs per SM a call aims at, 2: the fastest of 1, 2, 4 and 8 on an H100
# at every decode shape of the kernel sweep (one row, 32 query heads of D 128, bf16; with
# MIN_SPLIT_KEYS = 512), 1.12-1.21x faster than 4: 0.080 vs 0.090 ms at 32k keys over 8 K/V
# heads (33 splits vs 64), 0.204 vs 0.247 at 128k (33 vs 66), 0.197 vs 0.221 at 32k over 32
# (9 vs 17) (docs/results/h100/2026-11-26-second-lease/kernel-sweep.csv, 2026-11-26); and
# keys per split at least (4 blocks of 128 keys: a program's fixed work, q and its partial
# state, stays a few % of its K/V reads)
DECODE_WAVES = 2
PREDICATE_KEY = 64  # added to the mode key of a mask with a predicate feature
MIN_SPLIT_KEYS = 512


def triton_next_pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1)."""
    return 1 << max(x - 1, 0).bit_length()


def block_d(head_dim: int) -> int:
    """BLOCK_D of the kernels: the head dim padded to a power of two, at least 16."""
    return max(16, triton_next_pow2(head_dim))


def device_key(device: torch.device | str) -> str:
    """One spelling per device: ``cuda`` means the current CUDA device, as a tensor made on
    ``"cuda"`` lands there (``cuda:0`` unless another is current)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return str(dev)


def mask_key(mask: MaskSpec) -> int:
    """Autotuning bucket of the mask's iteration space (each clause its own bucket; with a
    predicate feature ``PREDICATE_KEY`` more: its kernels are other kernels, and the sum stays
    apart from ``autotune.UNADDRESSABLE``'s, which adds 32 to at most 23)."""
    if mask.block_size is not None:
        return 5
    if predicate.predicates(mask):
        return PREDICATE_KEY + mask_key(replace(mask, extra=()))
    bits = ("global", "dilation", "documents", "prefix")
    extra = sum(1 << i for i, name in enumerate(bits) if name in mask.features)
    if extra:
        return 8 + extra
    if mask.window not in (None, (None, None)):
        return 2
    return int(mask.causal)


def tune_key(mask: MaskSpec, n_q: int, n_k: int, head_dim: int, dtype: torch.dtype) -> tuple:
    """(mode, length bucket, query-rows bucket, BLOCK_D, dtype): the autotuner's key of a
    problem (the kernels' ``MASK_KEY``, ``n_bucket``, ``q_bucket`` and ``BLOCK_D`` arguments,
    and the dtype Triton adds). Decode (a few query rows) and prefill tune apart."""
    return (mask_key(mask), triton_next_pow2(max(n_q, n_k)), triton_next_pow2(n_q),
            block_d(head_dim), dtype)


def is_decode(n_q: int) -> bool:
    """Whether ``n_q`` query rows take the split-KV decode kernels (band masks)."""
    return n_q <= DECODE_MAX_ROWS


@lru_cache(maxsize=8)
def sm_count(device: str) -> int:
    """Streaming multiprocessors of a CUDA device (``DEFAULT_SMS`` off a GPU)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return DEFAULT_SMS
    return torch.cuda.get_device_properties(dev).multi_processor_count


def split_count(batch_kv_heads: int, slots: int, keys: int, device: str) -> int:
    """Key chunks per (K/V head, slot) of a decode call over ``keys`` keys: enough programs
    for ``DECODE_WAVES`` per SM of the device (at batch 1 the K/V heads alone leave most SMs
    idle: 8 programs on 132), as long as each chunk keeps ``MIN_SPLIT_KEYS`` keys; 1 when the
    (K/V head, slot) programs already fill the SMs or the cache is short."""
    programs = max(batch_kv_heads * slots, 1)
    wanted = -(-DECODE_WAVES * sm_count(device) // programs)
    return max(1, min(wanted, keys // MIN_SPLIT_KEYS))


def decode_tiles(n_rows: int, group: int) -> tuple[int, int]:
    """(ROWS, BLOCK_M) of the decode kernel: rows per query head padded to a power of two, and
    the tile of GROUP heads' rows (at least 16, ``tl.dot``'s minimum)."""
    rows = triton_next_pow2(max(n_rows, 1))
    return rows, max(16, triton_next_pow2(group) * rows)


@dataclass(frozen=True)
class BandTables:
    """A band plan's tables on one device (int32): slots and key slots (flat rows of
    ``SLOT_FIELDS``), per direction (row slots; key slots: ``*_t``) the global positions
    ``gpos`` (:meth:`BandPlan.gpos`: the partners, then the owns where they differ) and their
    prefix counts ``gidx`` likewise (each ``n_k - gbase + 2`` long: ``gidx[x - gbase]`` =
    positions below x, for x from ``plan.gbase`` to n_k + 1), the document edges ``ds``/``de``
    of each position (one dummy entry without documents)."""

    plan: BandPlan
    slots: Tensor
    key_slots: Tensor
    gpos: Tensor
    gidx: Tensor
    gpos_t: Tensor
    gidx_t: Tensor
    ds: Tensor
    de: Tensor

    @property
    def pointers(self) -> tuple[Tensor, ...]:
        """The row slots' mask tables in the kernels' argument order: GPOS, GIDX, DS, DE."""
        return self.gpos, self.gidx, self.ds, self.de

    @property
    def key_pointers(self) -> tuple[Tensor, ...]:
        """The key slots' mask tables (dK/dV), in the same order."""
        return self.gpos_t, self.gidx_t, self.ds, self.de


def _global_tables(plan: BandPlan, keys: bool) -> tuple[Tensor, Tensor]:
    """(gpos, gidx) of one direction, int64: its partners (then owns, where they differ) and
    their counts likewise."""
    partners, owns = plan.partner_owns(keys)
    counts = []
    for positions in (partners, owns) if plan.apart else (partners,):
        marks = torch.zeros(plan.n_k - plan.gbase + 2, dtype=torch.int64)
        if positions:
            marks[torch.tensor(positions, dtype=torch.int64) - plan.gbase + 1] = 1
        counts.append(torch.cumsum(marks, 0))
    return torch.tensor(plan.gpos(keys) or (0,), dtype=torch.int64), torch.cat(counts)


@lru_cache(maxsize=64)
def _band_tables(mask: MaskSpec, n_q: int, n_k: int, device: str) -> BandTables:
    plan = band_plan(mask, n_q, n_k)
    as_t = lambda x: torch.as_tensor(x, dtype=torch.int32).reshape(-1).to(device)
    gpos, gidx = _global_tables(plan, keys=False)
    gpos_t, gidx_t = _global_tables(plan, keys=True)
    if plan.documents is None:
        ds = de = torch.zeros(1, dtype=torch.int64)
    else:
        ds, de = documents.edges(plan.documents, torch.arange(n_k))
    return BandTables(plan, as_t(plan.slots), as_t(plan.key_slots), as_t(gpos), as_t(gidx),
                      as_t(gpos_t), as_t(gidx_t), as_t(ds), as_t(de))


def band_tables(mask: MaskSpec, n_q: int, n_k: int, device: torch.device | str) -> BandTables:
    """The band plan's tables on ``device``, built once per (mask, n_q, n_k, device)."""
    return _band_tables(mask, n_q, n_k, device_key(device))


@lru_cache(maxsize=32)
def _block_tables(mask: MaskSpec, n_q: int, n_k: int, device: str) -> BlockPlan:
    assert mask.block_size is not None
    return block_plan(mask, n_q, n_k, block_tile(mask.block_size)).to(device)


def block_tables(mask: MaskSpec, n_q: int, n_k: int, device: torch.device | str) -> BlockPlan:
    """The CSR block lists of a block-sparse mask (``mask.block_size`` set) on ``device``."""
    return _block_tables(mask, n_q, n_k, device_key(device))
