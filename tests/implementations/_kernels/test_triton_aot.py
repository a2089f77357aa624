"""The fused kernels compiled ahead of time for sm_90 (H100) and sm_80 (A100), on this CPU.

One subprocess compiles, through the real launch code (meta tensors, bf16, D = 64 and 128),
the config each kernel starts from before autotuning (``benchmarks/aot_kernels.py --ci``: one
mask per family, the prefix-with-dilation defaults nearest the register limit, and on sm_90 the
forward's first candidate of each Hopper path), with ``TRITON_CACHE_DIR`` in this run's
temporary directory. The checks: every kernel compiles for both targets at both head dims;
shared memory within each target's limit; no default config spills (so each kernel and head
dim has a spill-free config); the prefill kernels run on Hopper's ``wgmma``; a default's masked
loop is at most 1.5x the unmasked one in SASS instructions; the forward at 128x64 tiles, 8
warps, D = 64 uses at most 168 registers on sm_90; the Hopper candidates issue ``wgmma`` and
bulk tensor copies (TMA) and spill nothing, the warp-specialized one re-balances registers
between its warp groups, and no default (sm_80's path included) uses TMA.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton.backends.nvidia") is None
    or not (BIN / "ptxas").exists() or not (BIN / "cuobjdump").exists(),
    reason="Triton's NVIDIA backend (ptxas, cuobjdump) is not installed",
)
KERNELS = {"band_fwd", "band_dq", "band_dkdv", "delta_kernel", "band_fwd_split",
           "split_combine", "blocks_fwd", "blocks_dq", "blocks_dkdv"}
PREFILL = {"band_fwd", "band_dq", "band_dkdv", "blocks_fwd", "blocks_dq", "blocks_dkdv"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> list[dict]:
    work = tmp_path_factory.mktemp("aot")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(work / "triton-cache"), PYTHONPATH=str(ROOT),
               TRITON_DEFAULT_FP_FUSION="1")
    result = subprocess.run(
        [sys.executable, "benchmarks/aot_kernels.py", "--ci", "--json", str(work / "aot.json")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    rows = json.loads((work / "aot.json").read_text())["rows"] if result.returncode in (0, 1) \
        else None
    assert rows is not None, result.stderr[-2000:]
    return rows


def test_every_kernel_compiles_for_both_targets_and_head_dims(compiled):
    errors = [r for r in compiled if r.get("error")]
    assert errors == []
    seen = {(r["kernel"], r["head_dim"], r["target"]) for r in compiled}
    assert seen == {(k, d, t) for k in KERNELS for d in (64, 128) for t in ("sm_90", "sm_80")}


def test_shared_memory_fits_each_target(compiled):
    assert all(r["smem_bytes"] <= r["smem_limit"] for r in compiled)


def test_no_default_config_spills(compiled):
    spilling = [(r["kernel"], r["config"], r["head_dim"], r["target"], r["spill_bytes"])
                for r in compiled if r["default"] and r["spill_bytes"]]
    assert spilling == []


def test_prefix_with_dilation_defaults_are_checked(compiled):
    """The kernels with a prefix and dilation that spilled at the plain band's defaults."""
    gathered = {(r["kernel"], r["head_dim"], r["target"]) for r in compiled
                if r["workload"] == "band-dilated-prefix" and r["default"]}
    assert gathered == {("band_fwd", 128, "sm_90"), ("band_dq", 64, "sm_80"),
                        ("band_dkdv", 64, "sm_80"), ("band_dkdv", 128, "sm_80")}


def test_prefill_kernels_run_on_wgmma_on_hopper(compiled):
    """Decode tiles are 16 rows (a few query rows): mma.sync there, as wgmma needs 64."""
    kinds = {(r["kernel"], r["head_dim"]): r["mma"] for r in compiled if r["target"] == "sm_90"}
    assert {k: v for k, v in kinds.items() if k[0] in PREFILL and v != "wgmma"} == {}
    assert {v for k, v in kinds.items() if k[0] == "band_fwd_split"} == {"mma.sync"}


def test_masked_loops_cost_at_most_one_and_a_half_unmasked(compiled):
    ratios = {(r["kernel"], r["head_dim"], r["target"]): r["masked_ratio"]
              for r in compiled if r["masked_ratio"] is not None and not r["candidate"]}
    assert {k[0] for k in ratios} >= PREFILL | {"band_fwd_split"}
    assert {k: v for k, v in ratios.items() if v > 1.5} == {}


def test_forward_registers_at_128x64_8_warps_d64_on_hopper(compiled):
    row = next(r for r in compiled if r["kernel"] == "band_fwd" and r["head_dim"] == 64
               and r["target"] == "sm_90" and r["default"])
    assert row["config"] == "128x64 w8 s3" and row["regs"] <= 168


def test_hopper_candidates_issue_wgmma_and_tma_and_spill_nothing(compiled):
    """The forward's TMA path and its warp-specialized loop, on sm_90 at both head dims: bulk
    tensor copies in SASS and PTX, wgmma, no spill; the defaults keep today's pointer loads."""
    hopper = [r for r in compiled if r["candidate"]]
    assert {(r["head_dim"], "ws" in r["config"].split()) for r in hopper} == {
        (64, False), (64, True), (128, False), (128, True)}
    for r in hopper:
        assert (r["kernel"], r["target"], r["mma"]) == ("band_fwd", "sm_90", "wgmma"), r
        assert r["tma"] > 0 and r["bulk_tensor"] > 0 and r["spill_bytes"] == 0, r
        assert r["smem_bytes"] <= r["smem_limit"]
        assert (r["setmaxnreg"] > 0) == ("ws" in r["config"].split()), r
    assert all(r["tma"] == 0 and r["bulk_tensor"] == 0 for r in compiled if not r["candidate"])


def test_prune_takes_the_dilated_prefix_lists_from_the_launch_flags(monkeypatch):
    """The autotuner's prune (GPU runs, no compile): a launch with both PREFIX and DILATED keeps
    GATHERED_SHAPES' configs of its class, any other launch SHAPES' (here sm_90, D 128)."""
    from implementations._kernels import triton_autotune as tune

    monkeypatch.setattr(tune, "interpreted", lambda: False)
    every = tune.configs("band_fwd")
    keep = tune.prune("band_fwd")
    nargs = {"Q": torch.empty(0)}  # a CPU tensor: the default class, sm_90

    def kept(**flags) -> list[tuple]:
        return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
                for c in keep(every, nargs, BLOCK_D=128, **flags)]

    plain = [(128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 4, 2), (64, 32, 4, 2)]
    assert kept(PREFIX=True, DILATED=False) == plain
    assert kept(PREFIX=False, DILATED=True, GLOBAL=True) == plain
    assert kept(PREFIX=True, DILATED=True, GLOBAL=True) == [(128, 32, 8, 3), (64, 32, 4, 2)]
