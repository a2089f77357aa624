"""The fused kernels compiled ahead of time for sm_90 (H100) and sm_80 (A100), on this CPU.

One subprocess compiles, through the real launch code (meta tensors, bf16, D = 64 and 128), the
config each kernel starts from before autotuning (``benchmarks/aot_kernels.py --ci``: one mask
per family, the prefix-with-dilation defaults nearest the register limit, and on sm_90 the first
config of each Hopper path of the forward, dQ and dK/dV, listed or candidate, at D = 128, and
the listed one at D = 64), with ``TRITON_CACHE_DIR`` in pytest's cache of the checkout
(:func:`triton_cache`: a rerun compiles only the kernels that changed; ``--cache-clear``
compiles all); the paged decode at pages of 16 and 64 tokens, bf16, and two fp16 compiles. The
checks: every kernel compiles for both targets at both head dims; shared memory within each
target's limit; no default config spills (so each kernel and head dim has a spill-free config);
the prefill kernels run on Hopper's ``wgmma``; a default's masked loop is at most 1.5x the
unmasked one in SASS instructions, except a default a GPU measurement chose
(``autotune.MEASURED``), whose ratio is reported and not gated (the ratio is a proxy of speed;
the speed was measured); the forward's default at D = 64 on sm_90 within its register target;
the Hopper paths issue ``wgmma`` and bulk tensor copies (TMA) and spill nothing, the warp-
specialized one re-balances registers between its warp groups, and no default (sm_80's path
included) uses TMA.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from implementations._kernels.triton import autotune  # noqa: E402

ROOT = Path(__file__).resolve().parents[4]
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton.backends.nvidia") is None
    or not all((BIN / tool).exists() for tool in ("ptxas", "cuobjdump", "nvdisasm")),
    reason="Triton's NVIDIA backend (ptxas, cuobjdump, nvdisasm) is not installed",
)
KERNELS = {"band_fwd", "band_dq", "band_dkdv", "delta_kernel", "band_fwd_split",
           "split_combine", "blocks_fwd", "blocks_dq", "blocks_dkdv", "feature_state",
           "feature_combine", "feature_output", "feature_scan", "feature_chunk",
           "nys_landmarks", "nys_key_pass", "nys_pinv", "nys_output", "paged_decode",
           "paged_combine"}
PREFILL = {"band_fwd", "band_dq", "band_dkdv", "blocks_fwd", "blocks_dq", "blocks_dkdv"}


def triton_cache(config: pytest.Config, scratch: Path) -> Path:
    """Where the compiles keep Triton's cache: pytest's cache of this checkout
    (``.pytest_cache/d/triton-aot``), so a rerun reuses the artifacts of the kernels that did
    not change. Triton keys an entry by the kernel's source and every function it calls, its
    specializations and constants, the compile options, the target and Triton's own build: a
    hit is the same compile (measured 2026-11-29: the 117 rows equal, 12 s against 119 s). A
    fresh clone, ``--cache-clear`` or ``-p no:cacheprovider`` compile every kernel."""
    cache = getattr(config, "cache", None)
    return cache.mkdir("triton-aot") if cache is not None else scratch / "triton-cache"


def prune(cache: Path, rows: list[dict], since: float) -> None:
    """Remove the entries of ``cache`` that no row used and nothing wrote since ``since`` (a
    run at the same time keeps its own): the cache holds one run's kernels, not every
    version since the checkout was made."""
    used = {r.get("cache_entry") for r in rows}
    for entry in cache.iterdir():
        if entry.is_dir() and entry.name not in used and entry.stat().st_mtime < since:
            shutil.rmtree(entry, ignore_errors=True)


@pytest.fixture(scope="module")
def aot_cache(request, tmp_path_factory) -> Path:
    return triton_cache(request.config, tmp_path_factory.mktemp("aot-cache"))


@pytest.fixture(scope="module")
def compiled(aot_cache, tmp_path_factory) -> list[dict]:
    work = tmp_path_factory.mktemp("aot")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(aot_cache), PYTHONPATH=str(ROOT),
               TRITON_DEFAULT_FP_FUSION="1")
    since = time.time()
    result = subprocess.run(
        [sys.executable, "benchmarks/aot_kernels.py", "--ci", "--json", str(work / "aot.json")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    rows = json.loads((work / "aot.json").read_text())["rows"] if result.returncode in (0, 1) \
        else None
    assert rows is not None, result.stderr[-2000:]
    prune(aot_cache, rows, since)
    return rows


def test_the_cache_holds_exactly_the_compiles_of_this_run(compiled, aot_cache):
    """Every row names its entry of Triton's cache, and the entries of kernels that changed
    since an earlier run are gone (each kernel and target has one)."""
    entries = {r["cache_entry"] for r in compiled}
    assert len(entries) == len(compiled)
    assert {p.name for p in aot_cache.iterdir() if p.is_dir()} == entries


def test_prune_keeps_what_was_used_or_written_since_and_removes_the_rest(tmp_path):
    for name in ("used", "stale", "new"):
        (tmp_path / name).mkdir()
    os.utime(tmp_path / "used", (0, 0))
    os.utime(tmp_path / "stale", (0, 0))
    prune(tmp_path, [{"cache_entry": "used"}], since=100.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "used"]


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
    assert {v for k, v in kinds.items() if k[0] in ("band_fwd_split", "paged_decode")} == {
        "mma.sync"}


def test_paged_decode_compiles_at_each_page_size_and_dtype(compiled):
    """The paged decode's default (a decode tile: 16 rows) at pages of 16 and 64 tokens, bf16
    at every target and head dim, fp16 once per page size and target; spill-free."""
    paged = [r for r in compiled if r["kernel"] == "paged_decode"]
    assert {(r["workload"], r["head_dim"], r["target"]) for r in paged} == {
        *((w, d, t) for w in ("paged-16", "paged-64") for d in (64, 128)
          for t in ("sm_90", "sm_80")),
        ("paged-16-fp16", 128, "sm_90"), ("paged-64-fp16", 64, "sm_80")}
    assert all(r["default"] and r["spill_bytes"] == 0 and r["mma"] == "mma.sync" for r in paged)


def _aot():
    from implementations._kernels.triton import aot_check  # imports Triton's NVIDIA backend

    return aot_check


def test_masked_loops_cost_at_most_one_and_a_half_unmasked(compiled):
    """Every default's ratio is computed; it is gated unless a GPU measurement chose the
    default, and those are exactly MEASURED's sm_90 defaults of masks without clauses."""
    limit = _aot().MASKED_RATIO_LIMIT
    defaults = [r for r in compiled if r["default"] and r["masked_ratio"] is not None]
    assert {r["kernel"] for r in defaults} >= PREFILL | {"band_fwd_split"}
    gated = {(r["kernel"], r["head_dim"], r["target"], r["workload"]): r["masked_ratio"]
             for r in defaults if r["ratio_gated"]}
    assert {k: v for k, v in gated.items() if v > limit} == {}
    waived = {(r["kernel"], r["head_dim"], r["target"], r["workload"], r["config"])
              for r in defaults if not r["ratio_gated"]}
    assert waived == {(kernel, 64 if where.endswith("d64") else 128, "sm_90", "band", m.config)
                      for (kernel, where), m in autotune.MEASURED.items()}
    assert all(r["measured"] == autotune.SWEEP_H100 for r in defaults
               if not r["ratio_gated"])


def test_the_aot_verdicts_gate_unmeasured_defaults_and_report_measured_ones(compiled):
    """aot_kernels.py's exit status: a spill always fails; a ratio over the limit fails an
    unmeasured default and is a note for a measured one (band_dq 128x32 / 4 warps at D 64 on
    sm_90: 1.70 with Triton 3.9.0, the H100's fastest dQ)."""
    aot = _aot()
    failures, notes = aot.verdicts(compiled)
    assert failures == []
    limit = aot.MASKED_RATIO_LIMIT
    over = [r for r in compiled if r["default"] and (r["masked_ratio"] or 0) > limit]
    assert len(notes) == len(over) and all(not r["ratio_gated"] for r in over)
    row = next(r for r in compiled if r["default"] and r["measured"])
    assert len(aot.verdicts([{**row, "masked_ratio": 9.0, "ratio_gated": True}])[0]) == 1
    failures, notes = aot.verdicts([{**row, "masked_ratio": 9.0}])
    assert failures == [] and len(notes) == 1 and row["measured"] in notes[0]
    assert len(aot.verdicts([{**row, "spill_bytes": 8}])[0]) == 1  # measured or not


def test_forward_register_target_on_hopper(compiled):
    """The forward's default at D 64 on sm_90 (64x64 / 4 warps, the H100 sweep's choice)."""
    (key, target), = _aot().FORWARD_REGS.items()
    row = next(r for r in compiled if r["kernel"] == key[0] and r["head_dim"] == key[1]
               and r["target"] == "sm_90" and r["default"] and r["workload"] == "band")
    assert row["config"] == key[2] and row["regs"] <= target


def test_hopper_paths_issue_wgmma_and_tma_and_spill_nothing(compiled):
    """The TMA path and its warp-specialized loop of the forward, dQ and dK/dV, on sm_90 at
    D 128 (the widest accumulators: where a spill shows first; each path issues its wgmma,
    bulk tensor copies and register hand-over at any D), and the forward's TMA path at D 64,
    a listed config (the rest are candidates): bulk tensor copies in SASS (UTMALDG/UTMASTG)
    and PTX, wgmma, no spill; the defaults keep today's pointer loads, and sm_80 never uses
    TMA."""
    hopper = [r for r in compiled if "tma" in r["config"].split()]
    assert {(r["kernel"], r["head_dim"], "ws" in r["config"].split(), r["candidate"])
            for r in hopper} == {
        ("band_fwd", 64, False, False),
        *((k, 128, ws, True) for k in ("band_fwd", "band_dq", "band_dkdv")
          for ws in (False, True))}
    for r in hopper:
        assert (r["target"], r["mma"]) == ("sm_90", "wgmma"), r
        assert r["tma"] > 0 and r["bulk_tensor"] > 0 and r["spill_bytes"] == 0, r
        assert r["smem_bytes"] <= r["smem_limit"] and not r["default"]
        assert (r["setmaxnreg"] > 0) == ("ws" in r["config"].split()), r
    assert all(r["tma"] == 0 and r["bulk_tensor"] == 0 for r in compiled if r not in hopper)


def test_prune_takes_the_dilated_prefix_lists_from_the_launch_flags(monkeypatch):
    """The autotuner's prune (GPU runs, no compile): a launch with both PREFIX and DILATED keeps
    GATHERED_SHAPES' configs of its class, any other launch SHAPES' (here sm_90, D 128)."""
    from implementations._kernels.triton import autotune as tune

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
