"""GPU figures for the efficient attention families next to compiled FlexAttention and SDPA.

One process, CUDA only. Table 1 (the sparse families): bf16, B=4, H=16, D=64, causal window of
256 keys ``(255, 0)``, n in ``--sizes``: ``local``, ``dilated`` (d=2), ``longformer`` (16 global
tokens), ``bigbird`` (block 64, window 3 blocks back, 2 random, 64 global, as
``suites/sparse-gpu.toml``), ``flex-local`` and
``flex-blocksparse`` through the registry, a plain compiled FlexAttention
(``create_block_mask`` on ``(q >= k) & (q - k <= 255)`` with Python constants) and dense causal
``sdpa-flash``. Table 2: ``flash-tiled`` against ``sdpa-flash`` (FlashAttention-2) at
n = 4096/8192/16384, D = 64/128, causal and not, forward and forward+backward.

Times: ``triton.testing.do_bench`` medians. TFLOP/s useful = 4·B·H·D·kept pairs / time
(forward+backward: 3.5x the forward's FLOPs). ``agree``: each output on 256 sampled query rows
of (batch 0, heads 0-1) against the float64 reference (``harness.oracle.agreement`` tolerance).

Run: ``python benchmarks/gpu_sparse.py --out gpu_sparse.csv [--sizes 4096 16384 65536 131072]``
"""

from __future__ import annotations

import argparse
import math
import sys

import pandas as pd
import torch

from harness import registry
from harness.masks import MaskSpec, kept_pairs, mask_rows
from harness.oracle.agreement import output_agreement
from harness.oracle.reference import reference_attention
from harness.render.page import markdown_table
from harness.spec import Problem

B, H, D = 4, 16, 64
WINDOW = (255, 0)
# the BigBird layout of suites/sparse-gpu.toml: window 3 blocks back, 2 random, 64 global
BIGBIRD = MaskSpec(causal=True, window=(3, 0), block_size=64, random_blocks=2, global_tokens=64)
SPARSE = {  # label -> (implementation, mask)
    "local": ("local", MaskSpec(causal=True, window=WINDOW)),
    "dilated d=2": ("dilated", MaskSpec(causal=True, window=WINDOW, dilation=2)),
    "longformer g=16": ("longformer", MaskSpec(causal=True, window=WINDOW, global_tokens=16)),
    "bigbird": ("bigbird", BIGBIRD),
    "flex-local": ("flex-local", MaskSpec(causal=True, window=WINDOW)),
    "flex-blocksparse": ("flex-blocksparse", BIGBIRD),
}


def kept(mask: MaskSpec, n: int) -> int:
    """Exact kept pairs; block layouts counted on the GPU in row chunks (fast at n = 128k)."""
    if mask.block_size is None:
        return kept_pairs(mask, n, n)
    return sum(
        int(mask_rows(mask, n, n, s, min(s + 2048, n), device="cuda").sum())
        for s in range(0, n, 2048)
    )


def inputs(n: int, d: int, grad: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(n + d)
    return tuple(
        torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_(
            grad
        )
        for _ in range(3)
    )


def agreement(out: torch.Tensor, q, k, v, mask: MaskSpec) -> bool:
    rows = torch.randperm(q.shape[2], generator=torch.Generator().manual_seed(0))[:256].sort()[0]
    ref = reference_attention(q[:1, :2], k[:1, :2], v[:1, :2], mask, rows=rows)
    return bool(output_agreement(out[:1, :2, rows.cuda()], ref, torch.bfloat16)["agree"])


def time_call(fn, q, k, v, backward: bool) -> float:
    """Median ms of fn(q, k, v) (and its backward) with triton.testing.do_bench."""
    from triton.testing import do_bench

    if not backward:
        with torch.no_grad():
            return do_bench(lambda: fn(q, k, v), return_mode="median")
    dout = torch.randn_like(q)

    def step():
        fn(q, k, v).backward(dout)

    return do_bench(step, grad_to_none=[q, k, v], return_mode="median")


def row(label, n, d, mask, fn, backward=False) -> dict:
    """Time one (implementation, n) point and check its agreement."""
    q, k, v = inputs(n, d, backward)
    try:
        with torch.no_grad():
            out = fn(q, k, v)
        agree = agreement(out, q, k, v, mask)
        ms = time_call(fn, q, k, v, backward)
        status = "ok"
    except Exception as exc:  # one failing point is that point's status; the table goes on
        ms, agree, status = math.nan, False, f"error: {type(exc).__name__}: {exc}"[:120]
    flops = 4 * B * H * d * kept(mask, n) * (3.5 if backward else 1.0)
    return {
        "case": label,
        "n": n,
        "head_dim": d,
        "causal": mask.causal,
        "pass": "fwd+bwd" if backward else "fwd",
        "ms": round(ms, 4),
        "tflops_useful": round(flops / (ms * 1e-3) / 1e12, 1) if ms == ms else math.nan,
        "agree": agree,
        "status": status,
    }


def skipped_row(label: str, n: int, d: int, mask: MaskSpec, backward: bool, exc) -> dict:
    """The row of a point that could not be prepared (unsupported here, or failing)."""
    return {"case": label, "n": n, "head_dim": d, "causal": mask.causal,
            "pass": "fwd+bwd" if backward else "fwd", "ms": math.nan,
            "tflops_useful": math.nan, "agree": False, "status": f"skipped: {exc}"[:120]}


def registry_fn(name: str, mask: MaskSpec, n: int, d: int, backward: bool = False):
    problem = Problem(
        B, H, n, n, d, dtype=torch.bfloat16, device="cuda", mask=mask, backward=backward
    )
    reasons = registry.get(name).not_supported(problem)
    if reasons:
        raise RuntimeError("; ".join(reasons))
    return registry.get(name).prepare(problem)


def plain_flex(n: int):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= 255)

    block_mask = create_block_mask(sliding, None, None, n, n, device="cuda")
    compiled = torch.compile(flex_attention, dynamic=False)  # as implementations/flex.py
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def sdpa_flash(causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def sparse_table(sizes: list[int], backward: bool) -> list[dict]:
    rows = []
    for n in sizes:
        first = len(rows)
        for label, (name, mask) in SPARSE.items():
            for bwd in (False, True) if backward else (False,):
                try:
                    fn = registry_fn(name, mask, n, D, bwd)
                except Exception as exc:
                    rows.append(skipped_row(label, n, D, mask, bwd, exc))
                    continue
                rows.append(row(label, n, D, mask, fn, bwd))
        local_mask = SPARSE["local"][1]
        rows.append(row("plain compiled flex", n, D, local_mask, plain_flex(n)))
        causal = MaskSpec(causal=True)
        rows.append(row("sdpa-flash dense causal", n, D, causal, sdpa_flash(True)))
        print(markdown_table(pd.DataFrame(rows[first:])), flush=True)
    return rows


def flash_table(sizes: list[int]) -> list[dict]:
    rows = []
    for n in sizes:
        for d in (64, 128):
            for causal in (False, True):
                mask = MaskSpec(causal=causal)
                for bwd in (False, True):
                    try:
                        fn = registry_fn("flash-tiled", mask, n, d, bwd)
                        rows.append(row("flash-tiled", n, d, mask, fn, bwd))
                    except Exception as exc:  # unsupported here: its row says so, table goes on
                        rows.append(skipped_row("flash-tiled", n, d, mask, bwd, exc))
                    rows.append(row("sdpa-flash", n, d, mask, sdpa_flash(causal), bwd))
                    ours, ref = rows[-2].get("tflops_useful"), rows[-1].get("tflops_useful")
                    rows[-2]["vs_sdpa_flash"] = round(ours / ref, 3) if ours and ref else math.nan
        print(markdown_table(pd.DataFrame(rows[-16:])), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--flash-sizes", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--sparse-backward", action="store_true", help="also time fwd+bwd")
    parser.add_argument("--out", default=None, help="CSV path for all rows")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_sparse: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16 B={B} H={H}")
    rows = sparse_table(args.sizes, args.sparse_backward) + flash_table(args.flash_sizes)
    table = pd.DataFrame(rows)
    print("\n" + markdown_table(table))
    if args.out:
        table.to_csv(args.out, index=False)
        print(f"wrote {args.out}")
    bad = table[(table["status"] == "ok") & ~table["agree"].astype(bool)]
    if len(bad):
        print(f"gpu_sparse: {len(bad)} rows disagree with the reference", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
