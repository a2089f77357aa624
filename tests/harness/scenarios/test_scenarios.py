"""The scenario interface: a scenario is a folder (found by looking), a Point is shape + mask +
settings + method parameters with ids that never change for points that could be written
before, and the point fields added since (documents, prefix_len, qk_std, method parameters)
reach the suite, the mask, the inputs, the call and the row."""

from __future__ import annotations

import ast
import json
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path
from statistics import NormalDist

import pytest
import torch

from harness import registry, scenarios
from harness.analysis import claims, frames, regime
from harness.cli import main
from harness.errors import SuiteError
from harness.execute.runner import run_point
from harness.masks import mask_rows
from harness.measure.device import CpuDevice
from harness.measure.timing import TimingConfig
from harness.oracle.reference import reference_attention
from harness.render import table
from harness.scenarios import interface, packing
from harness.scenarios.attention.attention_case import make_inputs
from harness.scenarios.interface import Point, point_from_row, scenario_of
from harness.spec import Capabilities, Cost, Param
from harness.sweep.suite import MeasureConfig, parse_suite
from tests.conftest import calibration_prelude

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

ROOT = Path(__file__).resolve().parents[3]
BASELINE = ROOT / "results" / "baselines" / "cpu-amd-epyc-t1" / "smoke" / "rows.jsonl"
FAST = MeasureConfig(
    timing=TimingConfig(budget_s=0.02, min_samples=2, warmup_calls=1), passes=1, check="full"
)
BASE = {"name": "t", "scenario": "attention", "implementations": ["full"]}

# --- a scenario is a folder -------------------------------------------------------------------

TOY_SUITE = """
name = "toy"
scenario = "toy"
implementations = ["sdpa"]
[fixed]
batch = 1
heads = 2
head_dim = 16
repeat = 3
[sweep]
seq_len = [48, 96]
[measure]
budget_s = 0.02
passes = 1
min_samples = 2
toy_order = "reversed"
"""


def test_a_scenario_is_a_folder(tmp_path):
    """Copy the package tree, add the toy folder to its scenarios, and run a two-point suite of
    the new scenario with nothing else edited: discovery, settings, columns, its own
    ``[measure]`` option, the runner, and its panel in the report."""
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "harness", tree / "harness", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(
        Path(__file__).parent / "toy_scenario",
        tree / "harness" / "scenarios" / "toy",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    suite = tmp_path / "toy.toml"
    suite.write_text(TOY_SUITE)
    bad = tmp_path / "bad.toml"
    bad.write_text(TOY_SUITE.replace("repeat = 3", "repeat = 0"))
    env = {"PYTHONPATH": f"{tree}:{ROOT}", "PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1",
           "ATTNBENCH_CACHE_DIR": str(tmp_path / "cache")}  # probe outcomes: not the user's
    script = calibration_prelude() + f"""
import json, sys
from harness.cli import main
from harness import schema
from harness.scenarios import interface
assert interface.get("toy").settings().repeat == 2
assert "repeat" in schema.POINT_COLUMNS and "toy_calls" in schema.NAMES
from harness.render.table import _why_empty
assert _why_empty("toy_calls") == "recorded for toy rows only", _why_empty("toy_calls")
bad = main(["run", {str(bad)!r}, "--out", {str(tmp_path / "bad")!r}, "--no-progress"])
rc = main(["run", {str(suite)!r}, "--out", {str(tmp_path / "run")!r}, "--no-progress",
           "--no-table"])
shown = main(["report", {str(tmp_path / "run")!r}, "--out", {str(tmp_path / "report")!r}])
print(json.dumps([bad, rc, shown]))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [2, 0, 0]
    assert "repeat = 0" in done.stderr and "must be >= 1" in done.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "rows.jsonl").open()]
    (row,) = [r for r in rows if r["seq_len"] == 48]
    assert all(r["status"] == "ok" and r["agree"] is True for r in rows), rows
    assert row["scenario"] == "toy" and row["repeat"] == 3 and row["toy_calls"] == 3
    assert row["toy_order"] == "reversed"  # its own [measure] option, through CaseOptions
    assert row["useful_flops"] == 3 * 4 * 1 * 2 * 16 * 48 * 48
    page = (tmp_path / "report" / "index.html").read_text()
    assert '<section id="toy-time">' in page and "Toy: repeated calls against n" in page
    assert (tmp_path / "report" / "plots" / "toy-time.png").is_file()  # its panel, drawn


def test_the_readers_of_rows_name_no_column_of_a_scenario():
    """Render, analysis and the runner learn a scenario's columns from their declarations
    (titles, timed metrics, table columns, panels): no string in their code is one of them."""
    own = {c.name for c in scenarios.declared_columns()}
    sources = [*(ROOT / "harness" / "render").rglob("*.py"),
               *(ROOT / "harness" / "analysis").rglob("*.py"),
               ROOT / "harness" / "execute" / "runner.py"]  # fmt: skip
    named = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}"
        for path in sources
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in own
    ]
    assert named == []


def test_a_scenarios_declarations_reach_the_readers_of_rows():
    assert "mixer_time_s" in claims.TIMED_METRICS and regime.TIMED["mixer_time_s"] == "mixer_time_s"
    assert "prefill_s" not in claims.TIMED_METRICS  # a time, but not one claims judge as such
    assert table.WHEN_PRESENT == ("approx_err", "cache_bytes")
    assert table.TITLES["mixer_time_s"] == "mixer time" and frames.IMPL_FIELDS == ("mixer",)
    assert [p.key for p in interface.get("block+backward").panels] == ["layers"]


def test_scenarios_are_found_in_folder_order():
    assert interface.names() == (
        "attention",
        "attention+backward",
        "block",
        "block+backward",
        "decode",
    )
    with pytest.raises(interface.UnknownScenario, match="unknown scenario 'training'"):
        interface.get("training")


def test_the_backward_pair_of_a_forward_scenario_comes_from_its_variants():
    assert interface.backward_pair("attention") == "attention+backward"
    assert interface.backward_pair("block") == "block+backward"
    assert interface.backward_pair("decode") is None  # decode has no backward variant
    assert interface.backward_pair("block+backward") is None
    assert interface.backward_pair("training") is None


# --- points and their ids -----------------------------------------------------------------


def test_every_committed_baseline_row_rebuilds_to_its_own_id():
    rows = [json.loads(line) for line in BASELINE.read_text().splitlines() if line]
    assert len(rows) == 48
    for row in rows:
        assert point_from_row(row).point_id == row["point_id"]


def test_added_fields_enter_the_id_only_away_from_their_default():
    base = Point("full", seq_len=256)
    same = Point.of("full", seq_len=256, qk_std=1.0, prefix_len=0)
    assert same.point_id == base.point_id and same.fields() == base.fields()
    for changed in (
        Point.of("full", seq_len=256, qk_std=0.25),
        Point.of("full", seq_len=256, prefix_len=16),
        Point.of("full", seq_len=256, documents="uniform:64"),
    ):
        assert changed.point_id != base.point_id
    columns = base.columns()  # rows carry every field, defaults included
    assert columns["qk_std"] == 1.0 and columns["prefix_len"] == 0 and columns["documents"] is None


def test_settings_a_scenario_lacks_hash_as_they_always_did():
    """A block point hashes the decode settings at the values every point had before
    (layers 2, cache full, gen_tokens 8), and a decode point the block's mixer and kernel."""
    block, decode = Point("sdpa", "block"), Point.of("sdpa", "decode", causal=True)
    assert not hasattr(block.settings, "cache") and block.fields()["cache"] == "full"
    assert not hasattr(decode.settings, "mixer") and decode.fields()["mixer"] == "attention"
    assert Point("lstm", "block").settings.mixer == "lstm"  # a baseline is its own mixer


def test_a_row_rebuilds_the_point_it_came_from():
    points = [
        Point.of("sdpa", "decode", causal=True, cache="rolling", window_left=15, window_right=0),
        Point.of("conv", "block+backward", conv_kernel=5, ffn="swiglu"),
        Point.of("full", seq_len=96, global_tokens=(0, 95), qk_std=0.5),
        Point.of("full", seq_len=96, documents=(40, 56), prefix_len=8),
    ]
    for point in points:
        assert point_from_row(point.columns()) == point
        assert point_from_row(json.loads(json.dumps(point.columns()))) == point


def test_point_of_refuses_a_setting_of_another_scenario():
    with pytest.raises(TypeError, match="cache"):
        Point.of("sdpa", "block", cache="rolling")


# --- packed documents -------------------------------------------------------------------------


def test_uniform_documents_fill_the_sequence_with_a_shorter_last_one():
    assert packing.lengths("uniform:256", 1024) == (256,) * 4
    assert packing.lengths("uniform:300", 1024) == (300, 300, 300, 124)


def test_lognormal_documents_follow_the_documented_rule():
    """The rule of harness.scenarios.packing, written out again: same seed, same lengths."""
    got = packing.lengths("lognormal:mean=512,sigma=1,seed=3", 8192)
    rng, mu, total, expected = random.Random(3), math.log(512) - 0.5, 0, []
    while total < 8192:
        u = rng.random()
        length = min(max(1, round(math.exp(mu + NormalDist().inv_cdf(u)))), 8192 - total)
        expected.append(length)
        total += length
    assert got == tuple(expected) and sum(got) == 8192 and min(got) >= 1
    assert packing.lengths("lognormal:mean=512,sigma=1,seed=4", 8192) != got
    many = packing.lengths("lognormal:mean=256,sigma=0.5,seed=0", 2**20)
    assert 230 < sum(many) / len(many) < 280  # the mean is the mean


@pytest.mark.parametrize(
    ("documents", "expected"),
    [
        ("uniform:0", "uniform:L needs"),
        ("lognormal:sigma=1", "needs mean"),
        ("lognormal:mean=8,scale=2", "not 'scale'"),
        ("zipf:3", "unknown documents kind"),
        ([100, 0, 156], "lengths >= 1"),  # a zero-length document
        ([100, 100], "sum to 200, not the sequence length 256"),
    ],
)
def test_bad_documents_are_one_line_suite_errors(documents, expected):
    doc = {**BASE, "fixed": {"seq_len": 256, "documents": documents}}
    with pytest.raises(SuiteError) as info:
        parse_suite(doc, "docs.toml")
    message = str(info.value)
    assert message.startswith("docs.toml: ") and "\n" not in message and expected in message


def test_documents_need_as_many_queries_as_keys():
    doc = {**BASE, "fixed": {"seq_len": 256, "q_len": 128, "documents": "uniform:64"}}
    with pytest.raises(SuiteError, match="documents need n_q == n_k"):
        parse_suite(doc, "docs.toml")


def test_a_documents_axis_sweeps_specs_and_rows_record_both_columns(chunked):
    doc = {
        **BASE,
        "implementations": ["test-chunked"],
        "fixed": {"seq_len": 96, "heads": 2, "head_dim": 8, "causal": True},
        "sweep": {"documents": ["uniform:32", "lognormal:mean=30,sigma=1,seed=1", [40, 56]]},
    }
    points = parse_suite(doc, "docs.toml").points
    assert [p.masking.documents for p in points] == [
        "uniform:32",
        "lognormal:mean=30,sigma=1,seed=1",
        (40, 56),
    ]
    row = run_point(points[2], FAST, CpuDevice())
    assert row["status"] == "ok" and row["agree"] is True, row.get("reason")
    assert row["documents"] == "40,56" and row["document_lengths"] == [40, 56]
    pairs = 40 * 41 // 2 + 56 * 57 // 2  # causal inside each document only
    assert row["useful_flops"] == 4 * 2 * 8 * pairs


@pytest.mark.parametrize(
    ("fixed", "expected"),
    [
        ({"prefix_len": 300}, "prefix_len = 300: names positions 0..299, past the end of the seq"),
        ({"global_tokens": [0, 256]}, "global position 256 is outside"),
        ({"global_tokens": [0, 1, 17], "block_size": 16}, "whole blocks"),
        ({"global_tokens": 3, "block_size": 16}, "multiple of block_size=16"),
        ({"global_tokens": -1}, "must be >= 0"),
    ],
)
def test_bad_prefix_and_global_positions_are_one_line_suite_errors(fixed, expected):
    doc = {**BASE, "fixed": {"seq_len": 256, **fixed}}
    with pytest.raises(SuiteError) as info:
        parse_suite(doc, "mask.toml")
    assert "\n" not in str(info.value) and expected in str(info.value)


def test_global_positions_are_a_value_in_fixed_and_a_list_of_lists_in_sweep():
    fixed = {**BASE, "fixed": {"seq_len": 64, "global_tokens": [0, 63]}}
    (point,) = parse_suite(fixed, "g.toml").points
    assert point.mask.global_tokens == (0, 63) and point.columns()["global_tokens"] == "0,63"
    swept = {**BASE, "fixed": {"seq_len": 64}, "sweep": {"global_tokens": [[0, 63], 4]}}
    assert [p.mask.global_tokens for p in parse_suite(swept, "g.toml").points] == [(0, 63), 4]
    assert point.mask.global_positions(64) == (0, 63)


def test_prefix_len_reaches_the_mask():
    (point,) = parse_suite({**BASE, "fixed": {"seq_len": 64, "prefix_len": 8}}).points
    assert point.mask.prefix_len == 8 and point.columns()["prefix_len"] == 8


# --- qk_std ---------------------------------------------------------------------------------


def test_qk_std_scales_q_and_k_for_every_implementation_and_the_reference():
    wide, narrow = (
        Point.of("sdpa", seq_len=33, heads=2, head_dim=8),
        Point.of("sdpa", seq_len=33, heads=2, head_dim=8, qk_std=0.25),
    )
    q1, k1, v1 = make_inputs(wide, "cpu")
    q2, k2, v2 = make_inputs(narrow, "cpu")
    torch.testing.assert_close(q2, 0.25 * q1, rtol=0, atol=0)
    torch.testing.assert_close(k2, 0.25 * k1, rtol=0, atol=0)
    assert torch.equal(v2, v1)
    row = run_point(narrow, FAST, CpuDevice())
    assert row["status"] == "ok" and row["agree"] is True and row["qk_std"] == 0.25
    ref = reference_attention(q2, k2, v2, narrow.mask)
    assert not torch.allclose(ref.float(), reference_attention(q1, k1, v1, wide.mask).float())


def test_qk_std_is_an_attention_setting_only():
    with pytest.raises(SuiteError, match="unknown key"):
        parse_suite(
            {**BASE, "scenario": "block", "fixed": {"qk_std": 0.5}, "implementations": ["sdpa"]}
        )
    with pytest.raises(SuiteError, match=r"must be > 0\.0"):
        parse_suite({**BASE, "fixed": {"qk_std": 0.0}})


# --- method parameters ----------------------------------------------------------------------


MASKS = {"causal", "window", "global", "global_positions", "documents", "prefix"}


@pytest.fixture
def chunked():
    """A registered test implementation with one declared parameter, ``chunk`` (query rows
    per chunk, 1..64, default 16); it records every chunk it was called with."""
    seen: list[int] = []

    def chunked_attention(q, k, v, mask, scale=None, chunk=16):
        seen.append(chunk)
        return torch.cat([_chunk(q, k, v, mask, s, chunk) for s in range(0, q.shape[2], chunk)], 2)

    registry.register(
        "test-chunked",
        family="test",
        caps=Capabilities(mask_features=MASKS, devices={"cpu"}),
        cost=Cost(2, 2),
        params={"chunk": Param(16, "query rows per chunk", minimum=1, maximum=64)},
    )(chunked_attention)
    yield seen
    registry._REGISTRY.pop("test-chunked", None)


def _chunk(q, k, v, mask, start, size):
    """Rows start..start+size of dense masked attention (bottom-right aligned)."""
    n_q, n_k = q.shape[2], k.shape[2]
    keep = mask_rows(mask, n_q, n_k, start, min(start + size, n_q))
    scores = q[:, :, start : start + size] @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1) @ v


def test_a_parameter_is_a_point_field_of_the_implementations_that_declare_it(chunked):
    doc = {
        **BASE,
        "implementations": ["test-chunked", "sdpa"],
        "fixed": {"seq_len": 40, "heads": 2, "head_dim": 8, "causal": True},
        "sweep": {"chunk": [8, 16, 64]},
    }
    points = parse_suite(doc, "p.toml").points
    mine = [p for p in points if p.impl == "test-chunked"]
    assert [dict(p.params).get("chunk") for p in mine] == [8, None, 64]  # 16 is the default
    (sdpa,) = [p for p in points if p.impl == "sdpa"]  # no chunk: one point, not three
    assert sdpa.params == () and "chunk" not in sdpa.columns()
    assert mine[1].point_id == Point.of("test-chunked", seq_len=40, heads=2, head_dim=8,
                                        causal=True).point_id  # fmt: skip
    assert scenario_of(mine[0]).problem(mine[0]).params == (("chunk", 8),)
    rows = [run_point(p, FAST, CpuDevice()) for p in mine]
    assert [r["chunk"] for r in rows] == [8, 16, 64]
    assert all(r["status"] == "ok" and r["agree"] is True for r in rows), rows
    assert {8, 16, 64} <= set(chunked)
    assert point_from_row(rows[0]) == mine[0]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"fixed": {"chunk": 0}}, ["chunk", "0", "below its minimum 1"]),
        ({"fixed": {"chunk": 65}}, ["chunk", "65", "above its maximum 64"]),
        ({"fixed": {"chunk": 2.5}}, ["chunk", "whole number"]),
        ({"fixed": {"chunk": "8"}}, ["fixed.chunk", "must be a number"]),
        ({"variant": [{"implementation": "sdpa", "chunk": 8}]}, ["sdpa declares no parameter"]),
    ],
)
def test_bad_parameters_are_one_line_suite_errors(chunked, extra, expected):
    doc = {**BASE, "implementations": ["test-chunked", "sdpa"], **extra}
    with pytest.raises(SuiteError) as info:
        parse_suite(doc, "p.toml")
    message = str(info.value)
    assert message.startswith("p.toml: ") and "\n" not in message
    assert all(part in message for part in expected), message


def test_a_parameter_no_implementation_of_the_suite_declares_is_an_unknown_key(chunked):
    with pytest.raises(SuiteError, match=r"fixed\.chunk = 8: unknown key"):
        parse_suite({**BASE, "implementations": ["sdpa"], "fixed": {"chunk": 8}}, "p.toml")


def test_the_cli_exits_2_on_a_bad_parameter(chunked, tmp_path, capsys):
    suite = tmp_path / "p.toml"
    suite.write_text(
        'name = "p"\nscenario = "attention"\nimplementations = ["test-chunked"]\n'
        "[fixed]\nchunk = 0\n"
    )
    assert main(["run", str(suite), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "chunk" in err and "below its minimum" in err
