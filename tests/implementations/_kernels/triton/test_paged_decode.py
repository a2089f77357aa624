"""The paged split-KV decode kernel against a float64 reference written here (gather each
sequence's pages, mask, softmax), on ragged batches at odd sizes.

The pool is built to catch stray reads: pages in shuffled physical order, spare pages and the
unused slots of each last page full of NaN, and block table entries past a sequence's last page
naming a NaN page. Without CUDA the kernels run in Triton's interpreter (``tests/conftest.py``)
with the interpreter's pinned config (16 keys a block); one test forces GPU tile sizes.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
import triton

from harness.oracle.agreement import output_agreement
from implementations._kernels.triton import kernel_launch, paged_decode, plan_tables
from implementations._kernels.triton.paged_attention import (
    LARGEST_BLOCK_N,
    paged_decode_attention,
    split_pages,
)

pytestmark = pytest.mark.cuda
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def paged_batch(
    lens: list[int],
    heads: int,
    kv_heads: int,
    q_len: int,
    d: int,
    page: int,
    dtype: torch.dtype,
    seed: int,
    spare: int = 2,
) -> dict:
    """A ragged batch: q (B, H, q_len, D), the pools (pages, page, H_kv, D) in shuffled order
    with ``spare`` NaN pages, the block table (a column more than the longest sequence needs,
    entries past each last page naming a NaN page), context lengths."""
    g = torch.Generator().manual_seed(seed)
    n_pages = [-(-n // page) for n in lens]
    total = sum(n_pages) + spare
    order = torch.randperm(total, generator=g).tolist()
    pools = [torch.full((total, page, kv_heads, d), math.nan, dtype=dtype) for _ in range(2)]
    table = torch.full((len(lens), max(n_pages) + 1), order[-1], dtype=torch.int32)  # NaN page
    taken = 0
    for b, n in enumerate(lens):
        for pool in pools:
            keys = torch.randn(n, kv_heads, d, generator=g).to(dtype)
            for lp in range(n_pages[b]):
                chunk = keys[lp * page : (lp + 1) * page]
                pool[order[taken + lp], : len(chunk)] = chunk
        table[b, : n_pages[b]] = torch.tensor(order[taken : taken + n_pages[b]])
        taken += n_pages[b]
    q = torch.randn(len(lens), heads, q_len, d, generator=g).to(dtype)
    return {
        "q": q,
        "k_pages": pools[0],
        "v_pages": pools[1],
        "block_table": table,
        "context_lens": torch.tensor(lens, dtype=torch.int32),
    }


def reference(batch: dict, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """softmax(q kᵀ/√D + mask) v per sequence over its gathered pages, in ``dtype``: query t
    at position n - q_len + t keeps keys j <= it; a row with no key gives zeros."""
    q, table, lens = batch["q"], batch["block_table"], batch["context_lens"]
    page, h_kv, d = batch["k_pages"].shape[1:]
    b, h, q_len, _ = q.shape
    out = torch.zeros(q.shape, dtype=dtype)
    for i in range(b):
        n = int(lens[i])
        pages = table[i, : -(-n // page)].long()
        k, v = (
            batch[name][pages]
            .reshape(-1, h_kv, d)[:n]
            .to(dtype)
            .transpose(0, 1)
            .repeat_interleave(h // h_kv, 0)
            for name in ("k_pages", "v_pages")
        )  # (H, n, D)
        scores = q[i].to(dtype) @ k.transpose(-1, -2) * d**-0.5  # (H, q_len, n)
        keep = torch.arange(n)[None, :] <= (n - q_len + torch.arange(q_len))[:, None]
        weights = torch.softmax(scores.masked_fill(~keep, -math.inf), -1).nan_to_num(0.0)
        out[i] = weights @ v
    return out


def run(batch: dict) -> torch.Tensor:
    return paged_decode_attention(
        *(batch[k].to(DEVICE) for k in ("q", "k_pages", "v_pages", "block_table", "context_lens"))
    ).cpu()


def agreement(out: torch.Tensor, batch: dict) -> dict:
    dtype = batch["q"].dtype
    return output_agreement(out, reference(batch), dtype, naive=reference(batch, dtype))


# id -> (lengths, H, H_kv, q_len, D, page, dtype)
CASES = {
    "ragged-gqa4-q1-d59-p16": ([1, 2, 97, 513], 8, 2, 1, 59, 16, torch.float32),
    "ragged-mqa-q3-p64": ([97, 2, 513, 3], 4, 1, 3, 64, 64, torch.float32),
    "under-a-page-gqa4-q3-d59-p64": ([3, 63, 1, 40], 8, 2, 3, 59, 64, torch.float32),
    "empty-and-short-mqa-q3-p16": ([0, 97, 2, 17], 3, 1, 3, 59, 16, torch.float32),
    "ragged-gqa4-bf16-p16": ([513, 1, 97], 8, 2, 1, 64, 16, torch.bfloat16),
}


@pytest.mark.parametrize("case", list(CASES))
def test_paged_decode_matches_float64(case, monkeypatch):
    """Ragged lengths split over programs (chunks of 128 keys at least, where calls keep 512:
    the longest sequence takes several splits, the short ones one), the pages shuffled."""
    monkeypatch.setattr(plan_tables, "MIN_SPLIT_KEYS", 128)
    lens, h, h_kv, q_len, d, page, dtype = CASES[case]
    batch = paged_batch(lens, h, h_kv, q_len, d, page, dtype, seed=sum(lens) + d)
    launched = []
    with kernel_launch.watching(launched.append):
        out = run(batch)
    result = agreement(out, batch)
    assert result["agree"], result
    grid = next(r.grid for r in launched if r.name == "paged_decode")
    assert grid[1] == len(lens) * h_kv  # one program per K/V head: each page read once
    if max(lens) > 256:
        assert grid[0] > 1
    if 0 in lens:  # zeros, not NaN
        assert torch.equal(out[lens.index(0)], torch.zeros_like(out[0]))
    short = [i for i, n in enumerate(lens) if 0 < n < q_len]
    for i in short:  # rows before the first key see none
        assert torch.equal(
            out[i, :, : q_len - lens[i]],
            torch.zeros_like(out[i, :, :1]).expand(-1, q_len - lens[i], -1),
        )


def as_hnd(pool: torch.Tensor) -> torch.Tensor:
    """The same pages held as HND: storage (P, H_kv, page, D), given as its (P, page, H_kv, D)
    view (``kv_layout = "HND"``, harness.scenarios.decode.ragged.KVPool)."""
    return pool.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("case", ["ragged-gqa4-q1-d59-p16", "under-a-page-gqa4-q3-d59-p64"])
def test_hnd_pages_are_read_through_their_strides(case, monkeypatch):
    """The pool held as HND (a page's keys of one head contiguous): the kernel reads it through
    the pages' strides and gives the NHD pool's output, which agrees with float64."""
    monkeypatch.setattr(plan_tables, "MIN_SPLIT_KEYS", 128)
    lens, h, h_kv, q_len, d, page, dtype = CASES[case]
    batch = paged_batch(lens, h, h_kv, q_len, d, page, dtype, seed=sum(lens) + d)
    hnd = dict(batch, k_pages=as_hnd(batch["k_pages"]), v_pages=as_hnd(batch["v_pages"]))
    assert not hnd["k_pages"].is_contiguous() and hnd["k_pages"].stride(2) == page * d
    out = run(hnd)
    assert agreement(out, batch)["agree"]
    assert torch.allclose(out, run(batch), rtol=1e-5, atol=1e-6)


def test_a_wrong_block_table_entry_fails_the_comparison():
    """One entry of the longest sequence pointed at another sequence's page (finite keys): the
    comparison the test above makes fails (that test can fail)."""
    lens, h, h_kv, q_len, d, page, dtype = CASES["ragged-gqa4-q1-d59-p16"]
    batch = paged_batch(lens, h, h_kv, q_len, d, page, dtype, seed=sum(lens) + d)
    planted = dict(batch, block_table=batch["block_table"].clone())
    planted["block_table"][3, 5] = batch["block_table"][2, 1]
    result = agreement(run(planted), batch)
    assert not result["agree"] and result["max_abs_err"] > 1e-2, result


@pytest.mark.parametrize("block_n", [64, 128])
def test_gpu_key_blocks_read_several_pages_each(block_n, monkeypatch):
    """The GPU's key blocks (64 and 128 keys over 16-token pages: 4 and 8 pages a block, each
    key through its own table entry), forced; the split length then a multiple of the block."""
    if DEVICE == "cuda":
        pytest.skip("the GPU runs its own tiles")
    monkeypatch.setattr(plan_tables, "MIN_SPLIT_KEYS", 128)
    batch = paged_batch([701, 1, 130, 517], 8, 2, 2, 64, 16, torch.float32, seed=block_n)
    config = triton.Config({"BLOCK_N": block_n}, num_warps=4, num_stages=1)
    launched = []
    with kernel_launch.forced({"paged_decode": config}), kernel_launch.watching(launched.append):
        out = run(batch)
    result = agreement(out, batch)
    assert result["agree"], result
    split = next(r for r in launched if r.name == "paged_decode")
    assert split.config.kwargs["BLOCK_N"] == block_n and split.grid[0] > 1


def test_a_program_past_its_sequences_pages_writes_nothing(monkeypatch):
    """No padded work: after the call, the split launch is replayed on partial buffers full of
    NaN; every split past a sequence's last page is still NaN (its program exited at once),
    every split a sequence uses is written, and the combine reads only those."""
    monkeypatch.setattr(plan_tables, "MIN_SPLIT_KEYS", 128)
    lens = [300, 1, 0, 100]
    batch = paged_batch(lens, 4, 2, 1, 16, 16, torch.float32, seed=3)
    launched = []
    with kernel_launch.watching(launched.append):
        run(batch)
    split, combine = launched
    named = dict(zip(split.kernel.arg_names, split.args, strict=False))
    split_keys, part_ml = named["split_keys"], named["PART_ML"]
    part_ml.fill_(math.nan)
    split.replay()
    written = ~torch.isnan(part_ml[..., 1]).reshape(split.grid[0], len(lens), -1)  # (split, B, ·)
    used = [-(-n // split_keys) for n in lens]  # the splits of each sequence's keys
    assert split.grid[0] == max(used) > 1 and used[2] == 0
    for b, n_used in enumerate(used):
        assert written[:n_used, b].all() and not written[n_used:, b].any(), (b, n_used)
    combine.replay()  # the unused splits' NaN never reach the output
    out = dict(zip(combine.kernel.arg_names, combine.args, strict=False))["Out"]
    assert torch.isfinite(out).all() and not out[2].any()


def test_split_pages_cover_the_table_in_whole_blocks():
    """Every split is whole pages and whole largest key blocks; the splits cover the longest
    sequence; one split when the (sequence, K/V head) programs already fill the SMs."""
    for pairs, max_pages, page in [
        (8, 2048, 16),
        (16, 500, 64),
        (4, 33, 16),
        (1, 1, 16),
        (2048, 4096, 16),
        (8, 7, 64),
    ]:
        pps, n_split = split_pages(pairs, max_pages, page, "cpu")
        assert (pps * page) % LARGEST_BLOCK_N == 0  # pages of 16 and 64 tokens
        assert n_split * pps >= max_pages > (n_split - 1) * pps
    assert split_pages(2048, 4096, 16, "cpu")[1] == 1
    assert split_pages(8, 2048, 16, "cpu")[1] > 1  # 32k keys over 8 pairs: many splits


def test_bad_arguments_are_one_line_errors():
    batch = paged_batch([5, 9], 4, 2, 1, 16, 16, torch.float32, seed=1)

    def error(**changes) -> str:
        with pytest.raises(ValueError) as raised:
            paged_decode_attention(**{**batch, **changes})
        assert "\n" not in str(raised.value)
        return str(raised.value)

    assert "q_len" in error(q=torch.zeros(2, 4, 17, 16))
    assert "multiple" in error(q=torch.zeros(2, 3, 1, 16))
    assert "head dim" in error(q=torch.zeros(2, 4, 1, 8))
    assert "int32" in error(block_table=batch["block_table"].long())
    assert "context_lens" in error(context_lens=torch.tensor([5], dtype=torch.int32))
    assert "block_table" in error(block_table=batch["block_table"][:1])
    assert "dtypes" in error(q=batch["q"].double())
    assert "float64" in error(**{k: batch[k].double() for k in ("q", "k_pages", "v_pages")})
    assert "v_pages" in error(v_pages=batch["v_pages"][:, :8])


def test_module_names_its_kernels_for_the_aot_check():
    assert paged_decode.paged_decode.fn.arg_names[0] == "Q"  # the prune reads Q's device


def test_the_kernels_import_where_only_triton_is():
    """The warm cache compiles in a Python with Triton alone, behind a torch stand-in
    (``benchmarks/triton_cache.py``): the kernel module imports there (no numpy, no harness
    at import time)."""
    code = (
        "import sys, types\n"
        "stub = types.ModuleType('torch'); stub.Tensor = type('Tensor', (), {})\n"
        "sys.modules.update(torch=stub, numpy=None, pandas=None)\n"
        "from implementations.triton_kernels import import_jit_modules\n"
        "import_jit_modules(('paged_decode',))\n"
    )
    root = Path(__file__).resolve().parents[4]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={**env, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
