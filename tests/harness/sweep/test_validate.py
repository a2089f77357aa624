"""The one rule for mask settings at a point (docs/masks.md, "What a suite may ask for"), the
same from a suite file and from ``attnbench maxlen``; typos name the nearest key."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.errors import SuiteError
from harness.masks import MaskError, MaskSpec
from harness.scenarios.suite_mask import PointMask
from harness.sweep.suite import load_suite, parse_suite
from harness.sweep.validate import assignment, check_mask, shortest_length

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

N = 256


def suite_file(tmp_path, fixed: str, impl: str = "full") -> str:
    path = tmp_path / "masks.toml"
    path.write_text(
        f'name = "m"\nscenario = "attention"\nimplementations = ["{impl}"]\n'
        f"[fixed]\nseq_len = {N}\nheads = 2\nhead_dim = 16\n{fixed}\n"
    )
    return str(path)


# (the [fixed] lines, the words the refusal must hold): every case of the issue, and the
# analogous ones the same rule covers
REFUSED = [
    ("causal = true\nwindow = [63, 5]", ["window = [63, 5]", "causal", "[63, 0]"]),
    ("causal = true\nwindow = [-1, 1]", ["window = [-1, 1]", "[-1, 0]"]),
    ("global_tokens = 999", ["global_tokens = 999", "0..998", "(256 tokens)"]),
    ("global_tokens = 257", ["global_tokens = 257", "(256 tokens)"]),
    ('documents = "uniform:300"', ["documents = 'uniform:300'", "300 tokens", "longer"]),
    ('documents = "lognormal:mean=400"', ["lognormal:mean=400", "400 tokens", "longer"]),
    ("prefix_len = 1000", ["prefix_len = 1000", "0..999", "(256 tokens)"]),
    ("documents = [100, 100]", ["documents sum to 200", "256"]),
    ('documents = "uniform:64"\nprefix_len = 65', ["prefix_len = 65", "longest document"]),
    ('documents = "uniform:64"\nglobal_tokens = 100', ["global_tokens = 100", "longest doc"]),
    ("global_tokens = [0, 300]", ["global position 300"]),
]
ACCEPTED = [
    "causal = true\nwindow = [63, 0]",
    "causal = true\nwindow = [63, -1]",  # -1: no bound on that side
    "window = [63, 5]",  # no causal: a right side is keys after the query
    "causal = true\nwindow = [1000, 0]",  # a side longer than the sequence bounds nothing
    "global_tokens = 256",  # every position global
    'documents = "uniform:256"',
    'documents = "uniform:100"',  # 100, 100, 56: the last one shorter
    "prefix_len = 256",
    'documents = "uniform:64"\nprefix_len = 64\nglobal_tokens = 64',
]


@pytest.mark.parametrize(("fixed", "words"), REFUSED, ids=[f for f, _ in REFUSED])
def test_an_unhonourable_mask_is_one_line_from_a_suite_file(tmp_path, fixed, words):
    path = suite_file(tmp_path, fixed)
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    message = str(info.value)
    assert message.startswith(f"{path}: point(full, ") and "\n" not in message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("fixed", ACCEPTED)
def test_an_honourable_mask_is_accepted(tmp_path, fixed):
    (point,) = load_suite(suite_file(tmp_path, fixed)).points
    assert point.seq_len == N


def test_the_command_line_refuses_a_suite_file_in_one_line(tmp_path, capsys):
    path = suite_file(tmp_path, "causal = true\nwindow = [63, 5]")
    assert main(["run", path, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "window = [63, 5]" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # before any work


def test_causal_right_windows_are_refused_in_sweeps_and_variants_too():
    doc = {"name": "s", "scenario": "attention", "implementations": ["full"],
           "sweep": {"causal": [False, True]},
           "variant": [{"implementation": "full", "window": [[-1, 7]]}]}  # fmt: skip
    with pytest.raises(SuiteError, match=r"window = \[-1, 7\] with causal"):
        parse_suite(doc)


# ---- maxlen reads its point the same way -------------------------------------------------


def maxlen(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["maxlen", *args, "--budget", "64MiB", "--no-verify"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["full", "--causal", "--window", "63", "5"], ["window = [63, 5]", "[63, 0]"]),
        (["full", "--set", "causal=true", "--set", "window=[63,5]"], ["window = [63, 5]"]),
        (["full", "--set", "documents=[100,100]"], ["list of lengths", "uniform:512"]),
        (["full", "--set", "documents=100,156"], ["list of lengths"]),
        (["full", "--set", "random_blocks=2"], ["random_blocks needs block_size"]),
        (["full", "--set", "globl_tokens=3"], ["did you mean 'global_tokens'?"]),
        (["full", "--set", "prefix_len=-1"], ["prefix_len = -1", ">= 0"]),
        (["full", "--set", "seq_len=512"], ["seq_len"]),
        (["full", "--set", "causal"], ["KEY=VALUE"]),
        (["full", "--heads", "2", "--set", "heads=4"], ["heads is already set"]),
    ],
)
def test_maxlen_refuses_masks_as_a_suite_does(capsys, args, words):
    code, _, err = maxlen(capsys, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for word in words:
        assert word in err, (word, err)


@pytest.mark.parametrize(
    ("sets", "shortest", "field", "value"),
    [
        (["global_tokens=999"], 1024, "global_tokens", 999),  # searched from where it fits
        (["documents=uniform:300", "causal=true"], 320, "documents", "uniform:300"),
        (["prefix_len=100", "causal=true", "window=[63,0]"], 128, "prefix_len", 100),
        (["prefix_len=1000", "causal=true"], 1024, "prefix_len", 1000),
        (['documents="lognormal:mean=200,seed=3"'], 256, "documents", "lognormal:mean=200,seed=3"),
    ],
)
def test_maxlen_takes_every_mask_setting_of_a_suite(capsys, sets, shortest, field, value):
    args = [a for s in sets for a in ("--set", s)]
    code, out, err = maxlen(capsys, "full", "--heads", "2", "--head-dim", "16", *args, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["point"][field] == value
    assert result["shortest_seq_len"] == shortest
    assert result["predicted_max_seq_len"] >= shortest
    assert result["budget"] == "64 MiB"


# ---- the rule itself ------------------------------------------------------------------------

MASKS = [
    PointMask(MaskSpec(global_tokens=999)),
    PointMask(MaskSpec(causal=True, prefix_len=77)),
    PointMask(MaskSpec(global_tokens=(3, 130))),
    PointMask(MaskSpec(causal=True), "uniform:300"),
    PointMask(MaskSpec(prefix_len=5), "lognormal:mean=40.5,seed=1"),
    PointMask(MaskSpec(window=(5000, 0))),
]


@pytest.mark.parametrize("masking", MASKS, ids=lambda m: m.spec.describe())
def test_the_shortest_length_is_where_the_rule_starts_to_hold(masking):
    n = shortest_length(masking)
    check_mask(masking, n, n)
    if n > 1:
        with pytest.raises(MaskError):
            check_mask(masking, n - 1, n - 1)


def test_assignments_read_toml_values():
    assert assignment("window=[255, 0]") == ("window", [255, 0])
    assert assignment("causal = true") == ("causal", True)
    assert assignment("documents=uniform:512") == ("documents", "uniform:512")
    assert assignment('documents="uniform:512"') == ("documents", "uniform:512")
    assert assignment("qk_std=0.5") == ("qk_std", 0.5)
    for bad in ("causal", "=1", "a b=1"):
        with pytest.raises(SuiteError, match="KEY=VALUE"):
            assignment(bad)


# ---- typos -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "nearest"),
    [
        ({"scenaro": "attention"}, "'scenario'"),
        ({"fixed": {"global_token": 4}}, "'global_tokens'"),
        ({"fixed": {"prefix_length": 4}}, "'prefix_len'"),
        ({"sweep": {"seqlen": [64]}}, "'seq_len'"),
        ({"measure": {"budget_sec": 1.0}}, "'budget_s'"),
        ({"variant": [{"implementation": "full", "windw": [[1, 0]]}]}, "'window'"),
    ],
)
def test_a_typo_names_the_nearest_key_and_lists_the_rest(doc, nearest):
    base = {"name": "t", "scenario": "attention", "implementations": ["full"]}
    with pytest.raises(SuiteError) as info:
        parse_suite({**base, **doc}, "t.toml")
    message = str(info.value)
    assert f"did you mean {nearest}?" in message and "\n" not in message
    assert "unknown key" in message and "[" in message  # the allowed keys follow


def test_a_key_like_no_other_lists_the_allowed_keys_only():
    base = {"name": "t", "scenario": "attention", "implementations": ["full"]}
    with pytest.raises(SuiteError) as info:
        parse_suite({**base, "fixed": {"zzzzzz": 1}}, "t.toml")
    assert "did you mean" not in str(info.value) and "'seq_len'" in str(info.value)


@pytest.mark.parametrize(
    ("scenario", "key", "owners"),
    [("attention", "cache", "decode"), ("attention", "norm", "block and decode"),
     ("decode", "qk_std", "attention")],
)  # fmt: skip
def test_another_scenarios_setting_is_named_as_such_not_as_a_typo(scenario, key, owners):
    doc = {"name": "t", "scenario": scenario, "implementations": ["full"], "fixed": {key: 1}}
    with pytest.raises(SuiteError) as info:
        parse_suite(doc, "t.toml")
    assert f"a setting of {owners} suites only" in str(info.value)
    assert "did you mean" not in str(info.value)
