"""Claims files and verdicts: parsing errors, and each verdict on synthetic rows."""

from __future__ import annotations

import argparse
import json
import tomllib

import numpy as np
import pandas as pd
import pytest

from harness.analysis import claims as cl
from harness.analysis.verdicts import evaluate, judge
from harness.cli import claims as claims_cli
from harness.errors import CliError
from harness.results import RowWriter, write_env
from harness.scenarios.interface import Point

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

NS = (512, 1024, 2048, 4096)


def make_rows(impl, metric_fn, ns=NS, noise=0.0, status="ok", seed=0, **fields):
    """Rows of ``impl`` over ``ns``: peak_mem_bytes/time_median_s from metric_fn(n), samples."""
    rng = np.random.default_rng(seed)
    out = []
    for n in ns:
        point = Point.of(impl, seq_len=n, **fields)
        value = metric_fn(point)
        samples = list(value * np.exp(rng.normal(0, noise, 20))) if noise else [value] * 5
        out.append(
            {
                **point.columns(),
                "status": status,
                "time_median_s": float(np.median(samples)),
                "time_samples_s": samples,
                "peak_mem_bytes": value * 1e9,
            }
        )
    return out


def claim(**kw) -> cl.Claim:
    base = {"id": "c", "impl": "full", "metric": "peak_mem_bytes", "over": "seq_len"}
    return cl.parse_claims({"claim": [{**base, **kw}]})[0]


QUADRATIC = pd.DataFrame(make_rows("full", lambda p: 1e-3 + 1e-8 * p.seq_len**2))


def test_seed_claims_file_parses_with_the_required_claims():
    claims = cl.load_claims(cl.DEFAULT_CLAIMS)
    ids = {c.id for c in claims}
    assert {
        "full-memory-n2",
        "flash-memory-n1",
        "false-full-memory-n1",
        "flash-speedup-2-4x",
        "flash-memory-5-20pct",
        "multihead-flat",
        "kv-cache-step-n1",
        "local-time-n1",
        "layer-recurrent-n1",
        "layer-conv-n1",
        "attention-cheaper-than-recurrent-below-d",
    } <= ids
    kinds = {c.kind for c in claims}
    assert kinds == {"exponent", "ratio", "trend", "crossover", "bound"}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"colour": "red"}, "claim[0] (c).colour = 'red': unknown key"),
        ({"expect_exponent": "two"}, "expect_exponent = 'two': must be int or float"),
        ({"expect_exponent": 1, "expect_ratio_min": 2}, "set exactly one of"),
        ({"expect_ratio_min": 2}, "baseline = None: ratio and crossover claims need a baseline"),
        ({"expect_exponent": 1, "model": "cubic"}, "model = 'cubic': must be one of"),
        ({"expect_exponent": 1, "range": [10, 1]}, "range = [10, 1]: must be [low, high]"),
        ({"expect_exponent": 1, "tolerance": 0}, "tolerance = 0: must be > 0"),
        # each key takes the types of its Claim field: tuples as arrays, floats from integers
        ({"expect_exponent": 1, "hold": "heads"}, "hold = 'heads': must be list"),
        ({"expect_exponent": 1, "min_points": 2.5}, "min_points = 2.5: must be int"),
        ({"expect_exponent": 1, "where": ["impl"]}, "where = ['impl']: must be dict"),
        ({"expect_exponent": 1, "source": 3}, "source = 3: must be str"),
    ],
)
def test_parse_errors_name_the_file_claim_key_and_value(entry, message):
    doc = {"claim": [{"id": "c", "metric": "m", "over": "seq_len", **entry}]}
    with pytest.raises(CliError, match=r"^f\.toml: ") as info:
        cl.parse_claims(doc, "f.toml")
    assert message in str(info.value)


def test_file_level_errors(tmp_path):
    with pytest.raises(CliError, match="not found"):
        cl.load_claims(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[claim]\n")
    with pytest.raises(CliError, match="cannot read claims"):
        cl.load_claims(bad)
    with pytest.raises(CliError, match="missing"):
        cl.parse_claims({"claim": [{"id": "c", "over": "seq_len", "expect_exponent": 1}]})
    twice = {"id": "c", "metric": "m", "over": "n", "expect_exponent": 1}
    with pytest.raises(CliError, match="duplicate id"):
        cl.parse_claims({"claim": [twice, twice]})


def test_judge_interval_against_band():
    assert judge(1.9, 2.1, (1.8, 2.2))[0] == "confirmed"
    assert judge(1.9, 2.1, (0.8, 1.2))[0] == "refuted"
    assert judge(1.0, 1.3, (0.8, 1.2)) == (
        "inconclusive",
        "interval spans the claim (straddles an edge of the claimed band)",
    )
    wide = "interval spans the claim (wider than the claimed band)"
    assert judge(0.5, 1.5, (0.8, 1.2))[1] == wide
    assert judge(float("nan"), float("nan"), (0.8, 1.2))[0] == "inconclusive"


def test_exponent_confirmed_and_the_false_claim_refuted():
    true = evaluate(claim(expect_exponent=2.0, model="power+const"), QUADRATIC)
    assert true.verdict == "confirmed"
    assert true.ci_low <= true.measured <= true.ci_high and abs(true.measured - 2) < 0.05
    false = evaluate(claim(expect_exponent=1.0, model="power+const"), QUADRATIC)
    assert false.verdict == "refuted" and false.measured == true.measured


def test_upper_bound_claims():
    assert evaluate(claim(expect_exponent=2.5, bound="upper"), QUADRATIC).verdict == "confirmed"
    assert evaluate(claim(expect_exponent=1.0, bound="upper"), QUADRATIC).verdict == "refuted"


def test_inconclusive_when_too_few_points():
    rows = pd.DataFrame(make_rows("full", lambda p: 1e-8 * p.seq_len**2, ns=(512, 1024)))
    verdict = evaluate(claim(expect_exponent=2.0), rows)
    assert verdict.verdict == "inconclusive" and verdict.reason.startswith(
        "thin data (2 points: seq_len 512, 1024; a power fit needs 3)")


def test_inconclusive_when_the_interval_is_too_wide():
    noisy = pd.DataFrame(
        make_rows("full", lambda p: 1e-9 * p.seq_len**2, noise=0.8, seed=3, ns=(512, 724, 1024))
    )
    # 80 % noise: the achieved rate wobbles too, so a wide plateau band lets the time be fitted
    wide = claim(expect_exponent=2.0, metric="time_median_s", tolerance=0.1, plateau=0.9)
    verdict = evaluate(wide, noisy)
    assert verdict.verdict == "inconclusive" and verdict.regime == "plateau"
    assert verdict.ci_high - verdict.ci_low > 0.2
    strict = evaluate(claim(expect_exponent=2.0, metric="time_median_s", tolerance=0.1), noisy)
    assert strict.verdict == "inconclusive" and strict.reason.startswith("no time verdict")


def test_inconclusive_when_rows_are_missing_or_failed():
    verdict = evaluate(claim(impl="local", expect_exponent=1.0), QUADRATIC)
    assert verdict.verdict == "inconclusive" and verdict.reason.startswith("missing rows")
    failed = pd.DataFrame(make_rows("full", lambda p: 1.0, status="oom"))
    failed["reason"] = "out of memory"
    verdict = evaluate(claim(expect_exponent=2.0), failed)
    assert verdict.verdict == "inconclusive" and "oom" in verdict.reason
    assert evaluate(claim(expect_exponent=2.0), pd.DataFrame()).verdict == "inconclusive"


def test_groups_that_decide_and_disagree_are_mixed_and_each_is_listed():
    rows = make_rows("full", lambda p: 1e-8 * p.seq_len**2) + make_rows(
        "full", lambda p: 1e-8 * p.seq_len, causal=True
    )
    verdict = evaluate(claim(expect_exponent=2.0), pd.DataFrame(rows))
    assert verdict.verdict == "mixed" and "causal=True" in verdict.group  # the refuted one leads
    assert "groups disagree: causal=False: confirmed 2 [" in verdict.reason
    assert "causal=True: refuted 1 [" in verdict.reason
    assert len(verdict.groups) == 2


def ratio_rows(speedups: dict[int, float]) -> pd.DataFrame:
    base = make_rows("full", lambda p: 1e-9 * p.seq_len**2, noise=0.01, seed=1)
    fast = make_rows(
        "sdpa-flash", lambda p: 1e-9 * p.seq_len**2 / speedups[p.seq_len], noise=0.01, seed=2
    )
    return pd.DataFrame(base + fast)


@pytest.mark.parametrize(
    ("speedups", "expected"),
    [
        ({n: 3.0 for n in NS}, "confirmed"),
        ({n: 10.0 for n in NS}, "refuted"),
        ({512: 3.0, 1024: 3.0, 2048: 5.0, 4096: 6.0}, "holds in part"),
        ({n: 4.0 for n in NS}, "inconclusive"),  # every interval on the band's upper edge
    ],
)
def test_ratio_claims(speedups, expected):
    c = claim(
        impl="sdpa-flash",
        baseline="full",
        metric="time_median_s",
        ratio="baseline/impl",
        expect_ratio_min=2.0,
        expect_ratio_max=4.0,
    )
    verdict = evaluate(c, ratio_rows(speedups))
    assert verdict.verdict == expected
    assert verdict.ci_low <= verdict.measured <= verdict.ci_high
    assert verdict.n_points == len(NS)


@pytest.mark.parametrize(("power", "expected"), [(1, "confirmed"), (2, "refuted"), (0, "refuted")])
def test_a_ratio_in_units_of_its_axis(power, expected):
    """``relative_to = over``: each point's ratio is divided by its axis value, so a subject
    that costs x times the baseline at axis value x confirms [0.8, 1.25] x over, and one that
    costs x² (or the same) times refutes it."""
    ns = (2, 4, 8, 16)
    base = make_rows("full", lambda p: 1e-3 * p.seq_len, ns=ns, noise=0.01, seed=1)
    padded = make_rows("sdpa", lambda p: 1e-3 * p.seq_len ** (1 + power), ns=ns, noise=0.01,
                       seed=2)
    c = claim(impl="sdpa", baseline="full", metric="time_median_s", relative_to="seq_len",
              expect_ratio_min=0.8, expect_ratio_max=1.25)
    verdict = evaluate(c, pd.DataFrame(base + padded))
    assert verdict.verdict == expected, verdict.reason
    assert verdict.measured == pytest.approx(np.exp(np.mean(np.log(ns) * (power - 1))), rel=0.05)
    assert c.expected() == "[0.8, 1.25] x seq_len"


@pytest.mark.parametrize(
    ("power", "speed", "expected"),
    [(1, 1.0, "confirmed"), (1, 0.7, "confirmed"), (2, 1.0, "refuted"), (0, 0.7, "refuted")],
)
def test_a_trend_is_the_exponent_of_the_ratio_whatever_its_level(power, speed, expected):
    """An exponent with a baseline: the ratio's exponent along the axis. A subject that costs
    ``speed``·x times the baseline at axis value x grows as x^1 whether or not the two are
    equal at x = 1 (a band in units of the axis would refute speed 0.7); x² or a constant
    ratio refutes it."""
    ns = (1, 2, 3, 4, 6, 8)
    base = make_rows("full", lambda p: 1e-3 * p.seq_len, ns=ns, noise=0.01, seed=1)
    padded = make_rows("sdpa", lambda p: speed * 1e-3 * p.seq_len ** (1 + power), ns=ns,
                       noise=0.01, seed=2)
    c = claim(impl="sdpa", baseline="full", metric="time_median_s", expect_exponent=1.0,
              tolerance=0.25)
    assert c.kind == "trend" and c.expected() == "1 ±0.25 (sdpa/full)"
    verdict = evaluate(c, pd.DataFrame(base + padded))
    assert verdict.verdict == expected, verdict.reason
    assert verdict.measured == pytest.approx(power, abs=0.03)
    assert verdict.ci_low <= verdict.measured <= verdict.ci_high
    assert "impl/baseline ∝ seq_len^" in verdict.reason and "1:" in verdict.reason
    flipped = evaluate(claim(impl="sdpa", baseline="full", metric="time_median_s",
                             expect_exponent=-1.0, tolerance=0.25, ratio="baseline/impl"),
                       pd.DataFrame(base + padded))
    assert flipped.measured == pytest.approx(-verdict.measured)
    assert flipped.verdict == expected


def test_a_trend_with_noisy_ratios_or_too_few_points_is_not_decided():
    """Ratios that scatter by 30 % at each of six points leave the exponent's interval wider
    than a ±0.1 band; two matched points are no trend at all."""
    ns = (1, 2, 3, 4, 6, 8)
    scatter = dict(zip(ns, (1.0, 1.3, 0.75, 1.3, 0.8, 1.25), strict=True))
    base = make_rows("full", lambda p: 1e-3 * p.seq_len, ns=ns, noise=0.01, seed=1)
    noisy = make_rows("sdpa", lambda p: 1e-3 * p.seq_len**2 * scatter[p.seq_len], ns=ns,
                      noise=0.01, seed=2)
    c = claim(impl="sdpa", baseline="full", metric="time_median_s", expect_exponent=1.0,
              tolerance=0.1)
    verdict = evaluate(c, pd.DataFrame(base + noisy))
    assert verdict.verdict == "inconclusive", verdict.reason
    assert verdict.ci_high - verdict.ci_low > 0.2
    two = evaluate(c, pd.DataFrame([r for r in base + noisy if r["seq_len"] in (1, 8)]))
    assert two.verdict == "inconclusive" and "thin data (2 points" in two.reason


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"model": "power+const"}, "a trend (an exponent with a baseline) fits the ratio as a "
                                   "power law"),
        ({"concerns": "work"}, "a trend (an exponent with a baseline) has no work verdict"),
    ],
)
def test_a_trend_takes_a_power_law_and_no_work_verdict(entry, message):
    with pytest.raises(CliError) as info:
        cl.parse_claims({"claim": [{"id": "c", "metric": "time_median_s", "over": "seq_len",
                                    "impl": "sdpa", "baseline": "full",
                                    "expect_exponent": 1, **entry}]})
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"expect_ratio_min": 1, "baseline": "sdpa", "relative_to": "d_model"},
         "relative_to = 'd_model': a ratio claim's band is in units of its axis: must be over"),
        ({"expect_exponent": 1, "relative_to": "seq_len"},
         "relative_to = 'seq_len': only crossover and ratio claims take this key"),
        ({"expect_ratio_min": 1, "baseline": "sdpa", "cheaper": "above"},
         "cheaper = 'above': only crossover claims take this key"),
    ],
)
def test_relative_to_is_the_axis_of_a_ratio_claim(entry, message):
    with pytest.raises(CliError) as info:
        cl.parse_claims({"claim": [{"id": "c", "metric": "m", "over": "seq_len", **entry}]})
    assert message in str(info.value)


def mixer_rows(cross_at: float, d_model: int = 256) -> pd.DataFrame:
    """Attention time ∝ n², LSTM time ∝ n, equal at n = cross_at·d."""
    ns = (64, 128, 256, 512, 1024, 2048)
    fields = {"scenario": "block", "heads": 4, "head_dim": d_model // 4}
    att = make_rows("sdpa", lambda p: 1e-6 * p.seq_len**2, ns=ns, noise=0.02, **fields)
    lstm = make_rows(
        "lstm",
        lambda p: 1e-6 * cross_at * d_model * p.seq_len,
        ns=ns,
        noise=0.02,
        seed=5,
        mixer="lstm",
        **fields,
    )
    return pd.DataFrame(att + lstm)


@pytest.mark.parametrize(("cross_at", "expected"), [(2.0, "confirmed"), (0.5, "refuted")])
def test_crossover_claims(cross_at, expected):
    c = claim(
        impl="sdpa",
        baseline="lstm",
        metric="time_median_s",
        scenario="block",
        relative_to="d_model",
        expect_crossover_min=1.0,
    )
    verdict = evaluate(c, mixer_rows(cross_at))
    assert verdict.verdict == expected
    assert verdict.measured == pytest.approx(cross_at, rel=0.1)


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    claims_cli.add_cli(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_json_output(tmp_path, capsys):
    writer = RowWriter(tmp_path / "run")
    for row in QUADRATIC.to_dict("records"):
        writer.write(row)
    write_env(tmp_path / "run", {"run_id": "x"})
    claims_file = tmp_path / "claims.toml"
    claims_file.write_text(
        '[[claim]]\nid = "mem"\nimpl = "full"\nmetric = "peak_mem_bytes"\nover = "seq_len"\n'
        'expect_exponent = 2.0\nmodel = "power+const"\n'
        '[[claim]]\nid = "false"\nimpl = "full"\nmetric = "peak_mem_bytes"\nover = "seq_len"\n'
        "expect_exponent = 1.0\n"
    )
    tomllib.loads(claims_file.read_text())
    assert run_cli(["claims", str(tmp_path / "run"), "--claims", str(claims_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["claim"] for o in out] == ["mem", "false"]
    assert [o["verdict"] for o in out] == ["confirmed", "refuted"]
    assert all({"measured", "ci_low", "ci_high"} <= set(o) for o in out)
    assert run_cli(["claims", str(tmp_path / "run"), "--claims", str(claims_file)]) == 0
    assert "1 confirmed, 1 refuted, 0 inconclusive" in capsys.readouterr().out
    with pytest.raises(CliError, match="no such results file"):
        run_cli(["claims", str(tmp_path / "nowhere"), "--claims", str(claims_file)])


def test_groups_that_do_not_sweep_the_variable_are_ignored():
    single = make_rows("full", lambda p: 1.0, ns=(8192,), causal=True)
    verdict = evaluate(
        claim(expect_exponent=2.0, model="power+const"),
        pd.DataFrame([*QUADRATIC.to_dict("records"), *single]),
    )
    assert verdict.verdict == "confirmed" and len(verdict.groups) == 1


def approx_rows(cross_at: float) -> pd.DataFrame:
    """FlashAttention-like time ∝ n² (``sdpa``) and an approximate method ∝ n (``local``) that
    cost the same at n = cross_at: the FlashAttention paper's crossover."""
    ns = (256, 362, 512, 724, 1024, 1448, 2048, 4096)
    exact = make_rows("sdpa", lambda p: 1e-9 * p.seq_len**2, ns=ns, noise=0.02, seed=11)
    approx = make_rows("local", lambda p: 1e-9 * cross_at * p.seq_len, ns=ns, noise=0.02, seed=12)
    return pd.DataFrame(exact + approx)


def absolute_crossover(**kw) -> cl.Claim:
    entry = {"impl": "local", "baseline": "sdpa", "metric": "time_median_s",
             "expect_crossover_min": 512, "expect_crossover_max": 1024, "cheaper": "above", **kw}
    return claim(**entry)


@pytest.mark.parametrize(
    ("cross_at", "expected"), [(700.0, "confirmed"), (2000.0, "refuted"), (300.0, "refuted")]
)
def test_crossover_stated_as_an_absolute_range_of_the_axis(cross_at, expected):
    verdict = evaluate(absolute_crossover(), approx_rows(cross_at))
    assert verdict.verdict == expected, verdict.reason
    assert verdict.measured == pytest.approx(cross_at, rel=0.05)  # in units of seq_len itself
    assert verdict.ci_low <= verdict.measured <= verdict.ci_high
    assert verdict.expected == "[512, 1024] seq_len (local cheaper above)"
    assert f"crossover at seq_len {verdict.measured:.0f}," in verdict.reason  # plain: 695
    # the same statement from the other side: sdpa is the cheaper one below the crossover
    mirrored = evaluate(absolute_crossover(impl="sdpa", baseline="local", cheaper="below"),
                        approx_rows(cross_at))
    assert mirrored.verdict == expected
    assert mirrored.measured == pytest.approx(verdict.measured, rel=1e-6)


def test_an_absolute_crossover_outside_the_sweep_is_a_censored_bound():
    early = evaluate(absolute_crossover(), approx_rows(100.0))  # local cheaper everywhere
    assert early.verdict == "refuted" and early.measured == 256
    assert "local cheaper at every point: an upper bound" in early.reason
    late = evaluate(absolute_crossover(), approx_rows(10000.0))  # local never cheaper
    assert late.verdict == "refuted" and late.measured == 4096
    assert "local never cheaper: a lower bound" in late.reason


def test_crossover_keys_are_validated():
    with pytest.raises(CliError, match="cheaper = 'sideways': must be one of"):
        absolute_crossover(cheaper="sideways")
    with pytest.raises(CliError, match="cheaper = 'above': only crossover claims"):
        claim(expect_exponent=1.0, cheaper="above")
    with pytest.raises(CliError, match="relative_to = 'd_model': only crossover and ratio claims"):
        claim(expect_exponent=1.0, relative_to="d_model")
    assert absolute_crossover().relative_to is None and absolute_crossover().kind == "crossover"


def shifting_rows(impl: str, seconds, seed: int, ns=NS) -> list[dict]:
    """Rows of ``impl`` over ``ns`` timed in 3 passes on a machine whose speed shifts from pass
    to pass (x0.7 to x1.6, fresh per point and pass, as another tenant on the core's sibling
    does): every sample of a pass and the reference kernel's time in it scale alike."""
    rng = np.random.default_rng(seed)
    out = []
    for n in ns:
        point = Point.of(impl, seq_len=n)
        speed = rng.uniform(0.7, 1.6, 3)
        passes = [list(seconds(n) * m * np.exp(rng.normal(0, 0.01, 8))) for m in speed]
        flat = [s for p in passes for s in p]
        out.append({**point.columns(), "status": "ok", "time_median_s": float(np.median(flat)),
                    "time_samples_s": flat, "pass_samples": [8, 8, 8],
                    "pass_ref_kernel_s": list(2e-3 * speed)})
    return out


def test_normalized_time_cancels_a_machine_whose_speed_shifts_between_passes():
    """The same rows judged in both time bases: absolute time carries the shifts (intervals
    too wide to decide, at every point of the exponent's fit and at some of the ratio's),
    time / the pass's reference kernel does not (decided, at every point)."""
    quadratic = pd.DataFrame(shifting_rows("full", lambda n: 1e-9 * n**2, seed=3))
    slower = pd.DataFrame(shifting_rows("full", lambda n: 1.5e-9 * n**2, seed=4)
                          + shifting_rows("sdpa", lambda n: 1e-9 * n**2, seed=5))
    exponent = {"metric": "time_median_s", "expect_exponent": 2.0, "tolerance": 0.1}
    ratio = {"metric": "time_median_s", "baseline": "sdpa", "expect_ratio_max": 1.1}
    assert evaluate(claim(**exponent), quadratic).verdict == "inconclusive"
    normalized = evaluate(claim(**exponent, time_basis="normalized"), quadratic)
    assert normalized.verdict == "confirmed" and abs(normalized.measured - 2) < 0.02
    assert "straddles" in {r["where"] for r in evaluate(claim(**ratio), slower).regions}
    normalized = evaluate(claim(**ratio, time_basis="normalized"), slower)
    assert normalized.verdict == "refuted" and abs(normalized.measured - 1.5) < 0.05
    assert {r["where"] for r in normalized.regions} == {"above"}


def test_normalized_time_is_for_the_median_time_and_needs_the_reference_times():
    with pytest.raises(cl.ClaimsError, match="normalized time is for metric"):
        claim(metric="peak_mem_bytes", expect_exponent=1.0, time_basis="normalized")
    with pytest.raises(cl.ClaimsError, match="must be one of"):
        claim(metric="time_median_s", expect_exponent=1.0, time_basis="relative")
    rows = pd.DataFrame(shifting_rows("full", lambda n: 1e-6 * n, seed=3)).drop(
        columns="pass_ref_kernel_s")
    verdict = evaluate(claim(metric="time_median_s", expect_exponent=1.0,
                             time_basis="normalized"), rows)
    assert verdict.verdict == "inconclusive" and verdict.n_points == 0
