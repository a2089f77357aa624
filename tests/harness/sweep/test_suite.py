"""Suite loading: valid files expand into points; every bad file is one SuiteError line that
names the file, the key and the value; random documents never raise anything else."""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import registry
from harness.errors import SuiteError
from harness.sweep.expand import MAX_POINTS
from harness.sweep.suite import MEASURE_KEYS, TOP_KEYS, load_suite, parse_suite
from harness.sweep.validate import SHAPE_AXES

SUITES = Path(__file__).resolve().parents[3] / "suites"

BASE = {"name": "t", "scenario": "attention", "implementations": ["full"]}


def doc(**extra) -> dict:
    return {**BASE, **extra}


def test_a_valid_suite_expands_into_points(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text("""
name = "ok"
scenario = "attention"
implementations = ["full", "sdpa"]
[fixed]
heads = 4
d_model = 64
[sweep]
seq_len = [64, 128]
causal = [false, true]
[[variant]]
implementation = "full"
window = [[15, 0], [31, 0]]
[[variant]]
implementation = "full"
window = [[-1, 0]]
[measure]
budget_s = 0.5
point_timeout_s = 30
""")
    suite = load_suite(path)
    assert suite.name == "ok" and len(suite.sha256) == 64
    assert {p.head_dim for p in suite.points} == {16}
    sdpa = [p for p in suite.points if p.impl == "sdpa"]
    full = [p for p in suite.points if p.impl == "full"]
    assert len(sdpa) == 4  # 2 lengths x 2 causal
    assert len(full) == 12  # both variants add up: (2 + 1 windows) x 2 lengths x 2 causal
    assert {p.mask.window for p in full} == {(15, 0), (31, 0), (None, 0)}
    assert suite.measure.point_timeout_s == 30


BAD = [
    (doc(bogus=1), ["bogus", "unknown key"]),
    (doc(implementations=["full", "nope"]), ["'nope'", "unknown implementation", "sdpa"]),
    (doc(fixed={"heads": 3, "d_model": 64}), ["d_model", "64", "heads=3"]),
    (doc(sweep={"seq_len": [-5, 64]}), ["sweep.seq_len", "-5", "> 0"]),
    (doc(fixed={"seq_len": 0}), ["fixed.seq_len", "0"]),
    (doc(fixed={"heads": 8, "kv_heads": 3}), ["kv_heads", "3"]),
    (doc(fixed={"dtype": "float8"}), ["fixed.dtype", "float8", "float32"]),
    (doc(device="tpu"), ["device", "tpu", "cuda"]),
    (doc(fixed={"window": [-2, 0]}), ["fixed.window", "[-2, 0]", ">= -1"]),
    (doc(fixed={"window_left": -3}), ["fixed.window_left", "-3"]),
    (doc(fixed={"seq_len": "1024"}), ["fixed.seq_len", "'1024'", "int"]),
    (doc(fixed={"causal": 1}), ["fixed.causal", "bool"]),
    (doc(fixed={"heads": True}), ["fixed.heads", "True", "int"]),
    (doc(sweep={"seq_len": 64}), ["sweep.seq_len", "must be lists"]),
    (doc(fixed={"seq_len": [64]}), ["fixed.seq_len", "single value"]),
    (doc(sweep={"seq_len": []}), ["sweep.seq_len", "empty"]),
    (doc(fixed={"sequence": 64}), ["fixed.sequence", "unknown key"]),
    (doc(name="../../etc/x"), ["name", "../../etc/x"]),
    (doc(scenario="training"), ["scenario", "training"]),
    (doc(measure={"budget_s": math.nan}), ["measure.budget_s", "nan", "finite"]),
    (doc(measure={"budget_s": 0.0}), ["measure.budget_s", "> 0"]),
    (doc(measure={"point_timeout_s": -1}), ["measure.point_timeout_s", "-1"]),
    (doc(measure={"threads": 0}), ["measure.threads", "0"]),
    (doc(measure={"check": "most"}), ["measure.check", "most"]),
    (doc(measure={"sample": 3}), ["measure.sample", "unknown key"]),
    (doc(scenario="block", fixed={"q_len": 3}), ["q_len", "attention scenarios"]),
    (doc(implementations=["lstm"]), ["lstm", "block scenario"]),
    (doc(fixed={"block_size": 16, "global_tokens": 3}), ["global_tokens=3"]),
    (doc(variant=[{"window": [[1, 0]]}]), ["variant[0].implementation"]),
    (doc(implementations=[], variant=[]), ["implementations", "no implementation"]),
    (
        doc(
            sweep={k: list(range(1, 12)) for k in ("seq_len", "batch", "heads", "head_dim", "seed")}
        ),
        ["sweep", f"more than {MAX_POINTS}"],
    ),
    (doc(implementations=["full", "full"]), ["same point twice"]),
    ({"scenario": "attention", "implementations": ["full"]}, ["name", "required"]),
]


@pytest.mark.parametrize(("bad", "expected"), BAD, ids=[e[0] for _, e in BAD])
def test_each_bad_suite_is_one_line_naming_key_and_value(bad, expected):
    with pytest.raises(SuiteError) as info:
        parse_suite(bad, "bad.toml")
    message = str(info.value)
    assert message.startswith("bad.toml: ") and "\n" not in message
    for part in expected:
        assert part in message, (part, message)


def test_syntax_errors_name_the_line(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('name = "x"\nscenario = "attention"\nimplementations = ["full"\n[fixed]\n')
    with pytest.raises(SuiteError, match=r"broken\.toml: invalid TOML: .*line 4"):
        load_suite(path)


def test_unreadable_suites_are_suite_errors(tmp_path):
    with pytest.raises(SuiteError, match="not found"):
        load_suite(tmp_path / "missing.toml")
    with pytest.raises(SuiteError, match="cannot read"):
        load_suite(tmp_path)  # a directory
    (tmp_path / "latin1.toml").write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(SuiteError, match="UTF-8"):
        load_suite(tmp_path / "latin1.toml")


def test_a_claims_file_given_as_a_suite_says_what_reads_it():
    """``attnbench run suites/claims.toml`` once answered ``claim = [...]: unknown key``."""
    from harness import bundled

    path = bundled("claims.toml")
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    assert str(info.value) == (f"{path}: a claims file ([[claim]] entries), not a suite; judge "
                               f"runs with it: attnbench claims RUN_DIR --claims {path}")


def test_messages_stay_one_line_whatever_the_key():
    with pytest.raises(SuiteError) as info:
        parse_suite(doc(**{"evil\nkey": "x\ny" * 500}), "bad.toml")
    assert "\n" not in str(info.value) and len(str(info.value)) <= 600


def test_names_in_a_suite_are_looked_up_never_imported():
    for name in ("antigravity", "os.system", "harness.cli:main", "__import__('os')"):
        with pytest.raises(SuiteError, match="unknown implementation"):
            parse_suite(doc(implementations=[name]))
    assert "antigravity" not in sys.modules


# --- fuzzing ---------------------------------------------------------------------------------

NAMES = ["full", "sdpa", "local", "nope", "lstm"]
WORDS = [
    "float32",
    "float16",
    "cpu",
    "cuda",
    "auto",
    "attention",
    "block",
    "decode",
    "pre",
    "gelu",
    "rope",
    "full",
    "none",
    "rolling",
    "x",
]
scalars = st.one_of(
    st.integers(-3, 300),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.text(max_size=6),
    st.sampled_from(WORDS + NAMES),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=2)
    ),
    max_leaves=6,
)
# the point fields plus some scenario settings (each suite accepts its own scenario's)
AXES = SHAPE_AXES | {"norm", "ffn", "pos", "conv_kernel", "layers", "cache", "gen_tokens", "qk_std"}
axis_keys = st.sampled_from(sorted(AXES)) | st.text(max_size=6)
tables = st.dictionaries(axis_keys, values, max_size=4)
sweeps = st.dictionaries(axis_keys, st.lists(scalars, max_size=3) | values, max_size=3)
variants = st.lists(
    st.dictionaries(
        axis_keys | st.just("implementation"), values | st.sampled_from(NAMES), max_size=3
    ),
    max_size=2,
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["s", "a b", ""]) | st.text(max_size=5) | values,
        "scenario": st.sampled_from(["attention", "block", "decode", "attention+backward"])
        | values,
        "implementations": st.lists(st.sampled_from(NAMES), max_size=3) | values,
        "device": st.sampled_from(["cpu", "auto", "gpu"]) | values,
        "description": values,
        "fixed": tables | values,
        "sweep": sweeps | values,
        "variant": variants | values,
        "measure": st.dictionaries(
            st.sampled_from(sorted(MEASURE_KEYS)) | st.text(max_size=4), scalars, max_size=3
        )
        | values,
        "extra": values,
    },
)


def to_toml(document: dict) -> str:
    """A TOML text for ``document`` (inline tables/arrays; every key quoted)."""

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            return (
                "nan"
                if math.isnan(v)
                else ("inf" if v > 0 else "-inf")
                if math.isinf(v)
                else repr(v)
            )
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"

    return "".join(f"{json.dumps(k)} = {value(v)}\n" for k, v in document.items())


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(documents)
def test_random_documents_load_or_raise_suite_error(document):
    registry.names()  # loaded once, outside what is being fuzzed
    try:
        suite = parse_suite(document, "fuzz.toml")
    except SuiteError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz.toml: ")
        return
    assert set(document) <= TOP_KEYS and 0 < len(suite.points) <= MAX_POINTS


@settings(FUZZ, max_examples=100)
@given(documents, st.integers(0, 40), st.text(max_size=8))
def test_random_toml_text_loads_or_raises_suite_error(tmp_path_factory, document, cut, noise):
    text = to_toml(document)
    path = tmp_path_factory.mktemp("fuzz") / "suite.toml"
    for variant in (text, text[: len(text) - cut] + noise):
        path.write_text(variant, encoding="utf-8", errors="surrogatepass")
        try:
            load_suite(path)
        except SuiteError as exc:
            assert "\n" not in str(exc)


@settings(FUZZ, max_examples=100)
@given(st.binary(max_size=200))
def test_random_bytes_load_or_raise_suite_error(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("bytes") / "suite.toml"
    path.write_bytes(blob)
    try:
        load_suite(path)
    except SuiteError as exc:
        assert "\n" not in str(exc)


WALL_TIME = re.compile(r"(?i)\b(run time|wall time|runs? in|takes?|about|under|a few)\b"
                       r"(?:[^.]|\.\d){0,60}?\b(seconds?|minutes?|min|hours?)\b")


@pytest.mark.parametrize("path", sorted(p.name for p in SUITES.glob("*.toml")
                                        if p.name != "claims.toml"))
def test_every_bundled_suite_says_how_long_it_takes(path):
    """A user picks a suite by its header: it says the expected wall time (sparse-cpu.toml
    once ran 15 minutes without a row and without a word of warning)."""
    lines = (SUITES / path).read_text().splitlines()
    leading = itertools.takewhile(lambda line: line.startswith("#"), lines)
    header = " ".join(line.lstrip("# ") for line in leading)
    assert WALL_TIME.search(header), f"{path}: no expected wall time in the header"
