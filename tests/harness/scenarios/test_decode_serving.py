"""The decode scenario's serving form (``step = "attention"``): ragged contexts, the paged and
contiguous pools, every path with a paged form against float64, a planted wrong page, the
row's columns and bad input."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from harness import registry
from harness.cli import main
from harness.execute.runner import run_point
from harness.measure.device import get_device
from harness.measure.timing import TimingConfig
from harness.scenarios.case import CaseOptions, launch_case
from harness.scenarios.decode import ragged
from harness.scenarios.interface import Point, cost_of, scenario_of
from harness.sweep.suite import MeasureConfig

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

CPU = get_device("cpu", False)
ODD = "1,2,97,513"  # a one-token sequence, shorter than a page, odd lengths
CUDA_ONLY = ("flash-tiled", "flash-attn", "flashinfer", "varlen-attn")
PATHS = [i.name for i in registry.all_implementations() if i.paged is not None]


def _point(impl: str = "full", contexts: str = ODD, cache: str = "paged", **kw) -> Point:
    lens = ragged.parse(contexts)[1] if contexts[0].isdigit() else None
    base = dict(
        impl=impl, scenario="decode", step="attention", contexts=contexts, cache=cache,
        batch=len(lens) if lens else 4, seq_len=round(sum(lens) / len(lens)) if lens else 64,
        heads=8, kv_heads=2, head_dim=59, causal=True,
    )  # fmt: skip
    return Point.of(**{**base, **kw})


def _checked(point: Point) -> dict:
    case = scenario_of(point).build_case(point, CPU, CaseOptions("auto"))
    launch_case(case, None, CPU.kind)
    case.run()
    return case.check()


def test_lognormal_contexts_have_the_mean_exactly_scale_and_repeat():
    a = ragged.lengths("lognormal:sigma=1,seed=3", 1000, 16)
    assert sum(a) == 16 * 1000 and len(a) == 16 and min(a) >= 1
    assert ragged.lengths("lognormal:sigma=1,seed=3", 1000, 16) == a  # no state between calls
    doubled = ragged.lengths("lognormal:sigma=1,seed=3", 2000, 16)
    # lengths scaled, up to rounding (the remainder of B roundings goes to the longest)
    assert all(abs(d - 2 * x) <= 16 for d, x in zip(doubled, a, strict=True))
    skewed = ragged.lengths("lognormal:sigma=1.5,seed=3", 1000, 16)
    assert max(skewed) > max(a) > max(ragged.lengths("lognormal:sigma=0.5,seed=3", 1000, 16))
    # pinned: the draws of packing's documents (random.Random + NormalDist), every machine
    assert ragged.lengths("lognormal:sigma=1,seed=0", 100, 4) == (180, 132, 54, 34)
    assert ragged.lengths("uniform", 7, 3) == (7, 7, 7)


def test_paged_pool_holds_exact_pages_in_shuffled_order_and_appends():
    keys = torch.randn(1 + 16 + 40, 2, 4)  # the sequences end to end
    pool = ragged.fill_pool(keys, keys, (1, 16, 40), 1, True, 16, seed=5)
    assert pool.k.shape[0] == ragged.pages_of((1, 16, 40), 16) == 1 + 1 + 3
    assert pool.context_lens.tolist() == [1, 16, 40]
    used = sorted(p for row in pool.block_table.tolist() for p in row if p >= 0)
    assert used == list(range(5))
    assert pool.block_table.tolist() != [[0, -1, -1], [1, -1, -1], [2, 3, 4]]  # shuffled
    # the step appends into the last page and takes a new one when it fills
    full = ragged.KVPool.allocate(3, 4, 1, 2, 4, torch.float32, "cpu", 0)
    full.append(0, keys[:4], keys[:4])
    assert len(full.tables[0]) == 1
    full.append(0, keys[4:5], keys[4:5])
    assert len(full.tables[0]) == 2 and len(full.free) == 1
    with pytest.raises(ValueError, match="needs 2 more pages of 4; the pool has 1 free"):
        full.append(0, keys[5:13], keys[5:13])  # a context longer than the pool
    with pytest.raises(ValueError, match="page_size >= 1"):
        ragged.KVPool.allocate(3, 0, 1, 2, 4, torch.float32, "cpu", 0)


def _agrees(point: Point) -> None:
    """Float32 and float64 against the float64 check, or the path's reasons are the CUDA-only
    form's or a dtype it does not take (flex: no float64 kernels)."""
    for dtype in ("float32", "float64"):
        typed = dataclasses.replace(point, dtype=dtype)
        reasons = scenario_of(typed).support(typed)
        if reasons:
            assert (point.impl in CUDA_ONLY and "cuda" in reasons[0].lower()) or (
                reasons[0].startswith("dtype float64")
            ), reasons
            continue
        result = _checked(typed)
        assert result["agree"] is True, result


@pytest.mark.parametrize("impl", [p for p in PATHS if p != "flex-local"])
@pytest.mark.parametrize(
    "contexts, q_per_step, kv_heads, cache",
    [
        (ODD, 1, 2, "paged"),  # GQA 4:1
        (ODD, 1, 1, "full"),  # MQA, the padded contiguous form
        ("3,5,97,513", 3, 2, "paged"),  # three tokens a step: n_q != n_k, causal within
        ("lognormal:sigma=1.5,seed=1", 3, 8, "paged"),
    ],
)
def test_every_path_agrees_with_float64(impl, contexts, q_per_step, kv_heads, cache):
    _agrees(_point(impl, contexts, cache, q_per_step=q_per_step, kv_heads=kv_heads))


HND_PATHS = [i.name for i in registry.all_implementations()
             if i.paged is not None and "HND" in i.paged.layouts]


@pytest.mark.parametrize("impl", [p for p in HND_PATHS if p not in CUDA_ONLY])
@pytest.mark.parametrize("cache", ["paged", "full"])
def test_hnd_pools_agree_with_float64(impl, cache, monkeypatch):
    """``kv_layout = "HND"``: every page (or the contiguous cache, (B, H_kv, max, D)) holds one
    head's keys together; the paths that read views of it agree with float64 on the odd
    batch, GQA 4:1 and three tokens a step."""
    allocate, layouts = ragged.KVPool.allocate.__func__, []

    def spied(cls, *args, **kwargs):
        pool = allocate(cls, *args, **kwargs)
        layouts.append("NHD" if pool.k.is_contiguous() else "HND")
        return pool

    monkeypatch.setattr(ragged.KVPool, "allocate", classmethod(spied))
    _agrees(_point(impl, ODD, cache, kv_layout="HND"))
    _agrees(_point(impl, "3,5,97,513", cache, kv_layout="HND", q_per_step=3))
    assert "HND" in layouts  # the timed pools were HND (the reference's one-page pools: NHD)


def test_an_hnd_pool_holds_each_heads_slots_together_and_the_same_bytes():
    keys = torch.randn(1 + 16 + 40, 2, 4)
    nhd = ragged.fill_pool(keys, keys, (1, 16, 40), 1, True, 16, seed=5)
    hnd = ragged.fill_pool(keys, keys, (1, 16, 40), 1, True, 16, seed=5, layout="HND")
    assert hnd.k.shape == nhd.k.shape and torch.equal(hnd.k, nhd.k)  # the same pages, as seen
    assert hnd.k.stride() == (16 * 2 * 4, 4, 16 * 4, 1)  # (P, page, H_kv, D) seen, HND held
    assert hnd.k.untyped_storage().nbytes() == nhd.k.untyped_storage().nbytes()
    contiguous = ragged.fill_pool(keys, keys, (1, 16, 40), 1, False, 16, seed=5, layout="HND")
    assert contiguous.k.transpose(1, 2).is_contiguous()  # (B, H_kv, max, D) in memory
    with pytest.raises(ValueError, match="layout is NHD or HND"):
        ragged.KVPool.allocate(3, 4, 1, 2, 4, torch.float32, "cpu", 0, layout="NDH")


def test_paths_that_need_nhd_memory_say_so():
    """A form that views the pool as one NHD block (flex) or hands it to a library in NHD
    refuses an HND pool with the reason, before anything runs."""
    point = _point("flex-local", kv_layout="HND")
    assert scenario_of(point).support(point) == ["its paged form reads NHD pages, not HND"]
    assert "HND" in registry.get("sdpa").paged.layouts
    assert registry.get("flashinfer").paged.layouts == ("NHD",)


@pytest.mark.parametrize(
    "contexts, q_per_step, kv_heads, cache",
    [("3,5,97,513", 3, 1, "paged"), (ODD, 1, 2, "full")],  # each compiles (~35 s on 2 cores)
)
def test_flex_with_torch_paged_block_mask_agrees_with_float64(contexts, q_per_step, kv_heads,
                                                              cache):  # fmt: skip
    _agrees(_point("flex-local", contexts, cache, q_per_step=q_per_step, kv_heads=kv_heads))


@pytest.mark.parametrize("impl", ["full", "sdpa"])
def test_a_planted_wrong_block_table_entry_fails_the_check(impl, monkeypatch):
    publish = ragged.KVPool.publish

    def wrong(pool):
        publish(pool)
        if pool.page_size == 16:  # the timed pool, not the reference's contiguous one
            pool.block_table[3, 5] = pool.block_table[2, 0]  # the long sequence: another's page

    monkeypatch.setattr(ragged.KVPool, "publish", wrong)
    result = _checked(_point(impl))
    assert result["agree"] is False and result["max_abs_err"] > 1e-3


def test_the_row_counts_real_tokens_pages_and_padding():
    config = MeasureConfig(timing=TimingConfig(budget_s=0.05, min_samples=3, warmup_calls=1))
    row = run_point(_point("full", page_size=16), config, CPU)
    assert row["status"] == "ok", row.get("reason")
    lens = [1, 2, 97, 513]
    kv_row = 2 * 2 * 59 * 4  # K and V, 2 heads of 59, float32
    assert row["context_lengths"] == lens and row["context_tokens"] == 613
    assert row["context_max"] == 513 and row["padded_tokens"] == 4 * 513
    assert row["padding_waste"] == pytest.approx(1 - 613 / (4 * 513))
    assert row["pages"] == 1 + 1 + 7 + 33 and row["page_size"] == 16
    assert row["cache_bytes"] == row["cache_bytes_analytic"] == 42 * 16 * kv_row
    assert row["padded_cache_bytes"] == 4 * 513 * kv_row
    assert row["step_bytes"] == 613 * kv_row + 2 * 4 * 8 * 59 * 4  # no padding; q in, out
    assert row["check"] == "float64" and row["agree"] is True and 0 < row["bw_fraction"] < 2
    contiguous = run_point(_point("full", cache="full"), config, CPU)
    assert contiguous["pages"] == 4 and contiguous["cache_bytes"] == 4 * 513 * kv_row


def test_executed_work_follows_the_real_tokens_or_the_padded_batch():
    ragged_, padded = cost_of(_point("full")), cost_of(_point("sdpa"))
    assert ragged_.executed_flops == 4 * 8 * 59 * 613
    assert padded.executed_flops == 4 * 8 * 59 * 4 * 513
    assert ragged_.useful_flops == padded.useful_flops == ragged_.executed_flops
    # the bytes a call moves follow its keys alike (its roofline); step_bytes stays the real
    # tokens' for both (FlashInfer's bandwidth)
    q_bytes = 2 * 4 * 8 * 59 * 4
    kv_row = 2 * ragged_.point.kv_heads * 59 * 4
    assert ragged_.executed_bytes == ragged_.step_bytes == kv_row * 613 + q_bytes
    assert padded.executed_bytes == kv_row * 4 * 513 + q_bytes
    assert padded.step_bytes == ragged_.step_bytes
    assert padded.timed_work("time_median_s", "bytes") == padded.executed_bytes


def test_fused_and_plugin_paths_say_why_they_cannot_run_here():
    reasons = scenario_of(_point("flash-tiled")).support(_point("flash-tiled"))
    assert reasons == ["the paged form runs on cuda only"]
    flash_attn = scenario_of(_point("flash-attn")).support(_point("flash-attn"))
    assert flash_attn[0].startswith("unavailable: needs a CUDA GPU")
    assert "no paged decode form" in scenario_of(_point("local")).support(_point("local"))[0]


@pytest.mark.parametrize(
    "fixed, message",
    [
        ({"contexts": "1,2,97"}, "3 context lengths for a batch of 4"),
        ({"contexts": ODD, "seq_len": 100}, "seq_len must be the lengths' mean, 153"),
        ({"contexts": ODD, "q_per_step": 2}, "q_per_step = 2 is larger than a context of 1"),
        ({"contexts": "lognormal:sigma=x"}, "is not a number"),
        ({"page_size": 0}, "page_size"),
        ({"batch": 0}, "batch"),
        ({"step": "block", "cache": "paged"}, 'needs step = "attention"'),
        ({"step": "block", "kv_layout": "HND"}, 'needs step = "attention"'),
        ({"kv_layout": "NDH"}, "kv_layout"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, fixed, message):
    base = {"batch": 4, "seq_len": 153, "heads": 2, "head_dim": 8, "causal": True,
            "step": "attention", "cache": "paged"}  # fmt: skip
    lines = [f"{k} = {v!r}".replace("'", '"').replace("True", "true") for k, v in
             {**base, **fixed}.items()]  # fmt: skip
    suite = tmp_path / "bad.toml"
    suite.write_text('name = "bad"\nscenario = "decode"\nimplementations = ["full"]\n'
                     "[fixed]\n" + "\n".join(lines) + "\n")  # fmt: skip
    assert main(["run", str(suite), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert message in err, err
    assert not (tmp_path / "out").exists()  # refused at validation: nothing ran


def test_bad_input_exits_2_from_the_command_line(tmp_path):
    suite = tmp_path / "bad.toml"
    suite.write_text('name = "bad"\nscenario = "decode"\nimplementations = ["full"]\n[fixed]\n'
                     'batch = 2\nseq_len = 5\ncausal = true\nstep = "attention"\n'
                     'contexts = "4,5,6"\n')  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "3 context lengths for a batch of 2" in done.stderr


def test_the_serving_claims_plan_their_points_along_the_ragged_columns():
    """A claim fitted along ``context_tokens`` or ``padded_tokens`` (columns the attention step
    derives from the lengths) finds its points before they run, so a time-limited run or
    ``attnbench verdicts`` measures them: the skew at a fixed Σ is one group of 9 values of
    B·max, and Σ lengths at a fixed skew one of 8 values per page size (the skew's points,
    one Σ, make no group of their own); the padded/ragged trend pairs the two paths' points
    along padding_factor."""
    from harness import SUITES_DIR
    from harness.analysis.claims import load_claims
    from harness.analysis.groups import judged_groups
    from harness.sweep.suite import load_suite

    suite = load_suite(SUITES_DIR / "decode-serving-cpu.toml")
    claims = {c.id: c for c in load_claims(SUITES_DIR / "claims.toml")}
    wanted = ["padded-step-time-bmax1", "ragged-step-time-flat-in-bmax", "ragged-step-time-sum1"]
    groups = judged_groups(suite.points, [claims[c] for c in wanted])
    by_claim: dict[str, list] = {}
    for g in groups:
        by_claim.setdefault(g.claim, []).append(g)
    for claim in wanted[:2]:
        (skew,) = by_claim[claim]
        xs = [x for x, _ in skew.units]
        assert skew.axis == "padded_tokens" and len(xs) == 9 and xs[0] == 8 * 2048
    sums = by_claim["ragged-step-time-sum1"]
    assert sorted(len(g.units) for g in sums) == [5, 8]  # pages of 64, pages of 16
    assert all(g.axis == "context_tokens" and g.units[0][0] == 8 * 1024 for g in sums)
    # the padded/ragged trend: one group along padding_factor, SDPA's padded point and the
    # plain path's paged one at each value (their contexts move with the axis: no group each)
    (trend,) = judged_groups(suite.points, [claims["padded-over-ragged-tracks-bmax"]])
    assert trend.axis == "padding_factor" and len(trend.units) == 9
    assert trend.units[0][0] == 1.0 and all(len(ids) == 2 for _, ids in trend.units)
    # on a GPU: SDPA's padded step against the fused kernel's paged one, 5 skews at seq_len 4096
    gpu = load_suite(SUITES_DIR / "decode-serving-gpu.toml")
    (fused,) = judged_groups(gpu.points, [claims["fused-padded-over-ragged-tracks-bmax"]])
    assert len(fused.units) == 5 and all(len(ids) == 2 for _, ids in fused.units)
    assert fused.units[0][0] == 1.0 and fused.units[-1][0] > 5
