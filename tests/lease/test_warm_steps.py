"""lease/warm_cache.py --steps: the launches of the proof's kernel sweep are warmed
too.

The kernel sweep (``kernel_sweep.py``: every listed config and candidate of the band kernels
and the backward's, the decode split kernels) launches kernels the suites never do. Here,
without a compile: the job list holds every config the sweep's own schedule (``--list``) times, a
candidate added to ``autotune.CANDIDATES`` is warmed without another edit (and the check below
would catch one that is not), the suites' fused calls are the GPU claims suites', and the
stand-in CUDA device leaves nothing behind.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]

from tests.lease.test_warm_cache import _load, warm_cache  # noqa: E402 (after the skip)


@pytest.fixture(scope="module")
def sweep_jobs() -> list[dict]:
    return warm_cache.compile_jobs("sm_90", steps=("kernel-sweep",))


def _sweep():
    return importlib.import_module("kernel_sweep")  # as warm_cache imports it


def _missing(jobs: list[dict]) -> list[tuple]:
    """The (kernel, head dim, config) that the sweep times on sm_90 (its own ``--list`` schedule)
    or that ``autotune.CANDIDATES`` holds for an sm_90 class, and no job compiles."""
    from implementations.triton_kernels import autotune

    ks = _sweep()
    have = {(j["kernel"], j["head_dim"], j["config"]) for j in jobs}
    want = {(r["kernel"], ks.CASES[r["case"]].head_dim, r["config"])
            for r in ks.schedule(list(ks.GROUPS), (9, 0))
            if r["impl"] == "flash-tiled" and r["kernel"] != "backward"}  # --list's count
    for kernel in autotune.CANDIDATES:
        for d in (64, 128):  # the sm_90 classes: sm90-d64, sm90-d128
            want |= {(kernel, d, autotune.config_label(c))
                     for c in autotune.candidate_configs(kernel, d, (9, 0))}
    return sorted(want - have)


def test_every_config_and_candidate_the_sweep_times_is_warmed(sweep_jobs):
    assert _missing(sweep_jobs) == []
    assert all(job["step"] == "kernel-sweep" for job in sweep_jobs)
    kernels = {job["kernel"] for job in sweep_jobs}
    # the sweep's groups' kernels and what their recorded calls launch beside them
    assert kernels == {"band_fwd", "band_dq", "band_dkdv", "delta_kernel", "band_fwd_split",
                       "split_combine"}
    labels = {job["config"] for job in sweep_jobs}
    assert any("tma" in label and "ws" in label for label in labels)  # warp-specialized
    assert json.loads(json.dumps(sweep_jobs)) == sweep_jobs  # carried to the compile as JSON


def test_every_candidate_kernel_is_one_the_sweep_times():
    from implementations.triton_kernels import autotune

    swept = {kernel for kernel, *_ in _sweep().GROUPS.values()}
    assert set(autotune.CANDIDATES) <= swept, "a candidate no step launches is never warmed"


def test_a_new_candidate_is_caught_then_warmed(sweep_jobs, monkeypatch):
    from implementations.triton_kernels import autotune

    planted = (64, 32, 2, 1, frozenset({"sm90-d64"}), {})  # a tile no list has
    monkeypatch.setitem(autotune.CANDIDATES, "band_dq",
                        [*autotune.CANDIDATES["band_dq"], planted])
    assert _missing(sweep_jobs) == [("band_dq", 64, "64x32 w2 s1")]  # the check sees it
    assert _missing(warm_cache.compile_jobs("sm_90", steps=("kernel-sweep",))) == []


def test_the_decode_cases_are_warmed_at_every_split_target(sweep_jobs, monkeypatch):
    """The rows ``waves=W`` record a decode call again with another split count: a split
    count divisible by 16 (or not) is another specialization, so the targets add compiles."""
    def split(jobs: list[dict]) -> int:
        return sum(job["kernel"] in ("band_fwd_split", "split_combine") for job in jobs)

    monkeypatch.setattr(_sweep(), "SPLIT_WAVES", ())
    without = warm_cache.compile_jobs("sm_90", steps=("kernel-sweep",))
    assert split(sweep_jobs) > split(without) > 0


def _key(job: dict) -> tuple:
    kernel = getattr(importlib.import_module(job["module"]), job["kernel"])
    return warm_cache.compile_key(kernel, job["kernel"], job["config"], job["args"],
                                  job["kwargs"])


def test_the_steps_share_a_launch_once():
    jobs = warm_cache.compile_jobs("sm_90", suites=("claims-linear-gpu-fla", "gpu-smoke"),
                                   steps=("kernel-sweep", "suites"))
    keys = [_key(j) for j in jobs]
    assert len(keys) == len(set(keys))
    with pytest.raises(ValueError, match="not steps of the proof"):
        warm_cache.compile_jobs("sm_90", steps=("tests",))


def test_the_stand_in_device_leaves_nothing_behind(sweep_jobs):
    """After recording: torch.cuda is torch's again, and a cache the calls filled (FAVOR+'s
    random features) holds no fake tensor."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    from implementations import performer

    with warm_cache.lease_device("sm_90"):
        stand_in = torch.cuda.get_device_capability
        w = performer.orthogonal_features(256, 64, 12345)
        assert isinstance(w, FakeTensor)
    assert torch.cuda.get_device_capability is not stand_in
    assert not isinstance(performer.orthogonal_features(256, 64, 12345), FakeTensor)


def test_steps_on_the_command_line_are_checked():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "lease" / "warm_cache.py"),
                           "--out", "unused", "--steps", "tests"], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 2 and "invalid choice: 'tests'" in done.stderr


def test_the_suites_step_warms_every_gpu_claims_suite_and_the_smokes():
    """Every claims suite for a CUDA device (what ``attnbench verdicts --device cuda``, the
    proof's verdicts step, measures) and the smokes; the linear family's B1 points of
    ``claims-linear-gpu-fla`` launch the causal chunk kernel of both paths."""
    from harness.sweep.suite import load_suite

    suites = warm_cache.proof_suites()
    gpu = {p.stem for p in (ROOT / "suites").glob("claims-*.toml")
           if load_suite(p).points[0].device == "cuda"}
    assert "claims-linear-gpu-scaling" in gpu and "claims-gpu-backward" in gpu
    assert set(suites) == gpu | set(warm_cache.SMOKES)
    kernels = {j["kernel"] for j in warm_cache.compile_jobs(
        "sm_90", suites=("claims-linear-gpu-fla",))}
    assert {"feature_state", "feature_output", "feature_chunk", "feature_scan"} <= kernels


@pytest.mark.parametrize("name", ["d64", "decode-32k"])
def test_a_sweep_case_on_the_stand_in_device_launches_as_on_meta_tensors(name):
    """The sweep's case recorded on fake CUDA tensors (its own ``Prepared``) and the same
    shape recorded by the AOT check on meta tensors: the same kernels, compile-time arguments
    and argument specializations."""
    import torch

    from implementations.triton_kernels import aot_check

    ks = _sweep()
    case = ks.CASES[name]
    with warm_cache.lease_device("sm_90"), warm_cache._tuning_off():
        fake = warm_cache._prepared(ks, name, case).launches
    shape = (case.mask, case.n_q, case.n_k, case.heads, case.kv_heads, case.backward)
    meta = aot_check.record(name, case.head_dim, case.batch, shape, torch.bfloat16)

    def keys(launches) -> list[tuple]:
        return [warm_cache.compile_key(x.kernel, x.name, "", [warm_cache._encode(a)
                                                              for a in x.args], x.kwargs)
                for x in launches]

    assert keys(fake) == keys(meta) and len(fake) >= 1


def test_the_proof_summary_counts_hits_apart_from_misses(tmp_path):
    """On a warm lease the listener logs a line per disk hit too: the summary's count is the
    misses (a line without ``hit``, or unreadable, is one), the hits beside them."""
    summary = _load("summary", ROOT / "lease" / "summary.py")
    folder = tmp_path / "triton-misses"
    folder.mkdir()
    (folder / "kernel-sweep.jsonl").write_text(
        '{"kernel": "band_fwd", "hit": true}\n' * 3 + '{"kernel": "band_dq", "hit": false}\n')
    (folder / "verdicts.jsonl").write_text('{"k": 1}\nnot json\n')
    (line,) = summary.triton_misses(tmp_path)
    assert line.endswith("kernel-sweep 1 (3 hits), verdicts 2"), line


def test_the_proof_counts_the_sweeps_compiles():
    text = (ROOT / "lease" / "proof.sh").read_text()
    body = text[text.index("kernel_sweep() {"):text.index("\n}\n", text.index("kernel_sweep() {"))]
    assert 'ATTNBENCH_TRITON_MISSES="$OUT/triton-misses/kernel-sweep.jsonl"' in body
