"""Packing claims: rows carry ``document_len`` (the token-weighted mean document length), claims
fit over it at a fixed n, and the bundled ``packing-time-l1`` / ``packing-dense-l0`` claims are
judged end to end from a tiny packing suite run through the CLI in this process. Only the work
verdicts (analytic counts) are asserted: tests never time."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from harness.analysis import claims as cl
from harness.analysis.frames import group_keys, with_derived
from harness.analysis.verdicts import evaluate
from harness.cli import main
from harness.masks import MaskSpec, kept_pairs
from harness.results import load_rows
from harness.scenarios import packing
from harness.scenarios.interface import Point

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

N = 192  # the tiny suite's n: divisible by every document length it packs
LENGTHS = (12, 24, 48, 96, 192)
TINY = f"""
name = "packing-tiny"
scenario = "attention"
implementations = ["local", "masked-dense"]
[fixed]
seq_len = {N}
heads = 2
head_dim = 16
causal = false
[sweep]
documents = {json.dumps([f"uniform:{n}" for n in LENGTHS])}
[measure]
budget_s = 0.01
min_samples = 3
passes = 1
"""


@pytest.mark.parametrize(
    "documents",
    ["uniform:64", "uniform:100", "lognormal:mean=40,sigma=1,seed=2", (100, 1, 155)],
)
def test_document_len_is_the_token_weighted_mean_and_gives_n_l_kept_pairs(documents):
    """document_len = Σ l² / n, so a packed mask without causal keeps n·document_len pairs."""
    point = Point.of("masked-dense", seq_len=256, documents=documents)
    lengths = point.document_lengths
    columns = point.columns()
    assert columns["document_len"] == pytest.approx(sum(x * x for x in lengths) / 256)
    mask = MaskSpec(documents=lengths)
    assert kept_pairs(mask, 256, 256) == pytest.approx(256 * columns["document_len"])


def test_document_len_of_equal_documents_is_their_length_and_null_without_documents():
    assert Point.of("local", seq_len=1024, documents="uniform:256").columns()["document_len"] == 256
    assert packing.document_len((512,)) == 512  # one document: the sequence
    assert "document_len" not in Point.of("local", seq_len=1024).columns()


def test_rows_written_before_the_column_get_it_from_their_lengths():
    old = pd.DataFrame({"document_lengths": [[100, 300], None], "seq_len": [400, 400]})
    assert with_derived(old)["document_len"].iloc[0] == pytest.approx((100**2 + 300**2) / 400)
    assert np.isnan(with_derived(old)["document_len"].iloc[1])
    new = old.assign(document_len=[250.0, np.nan])  # a stored value is kept as written
    assert with_derived(new)["document_len"].iloc[0] == 250.0


def _rows(impl: str, time_of) -> list[dict]:
    """Synthetic ok rows of a documents sweep at n = 4096 (time from ``time_of(l)``)."""
    out = []
    for length in (128, 256, 512, 1024, 2048):
        point = Point.of(impl, seq_len=4096, documents=f"uniform:{length}")
        t = time_of(length)
        out.append(
            {**point.columns(), "status": "ok", "time_median_s": t, "time_samples_s": [t] * 5}
        )
    return out


def test_a_documents_sweep_is_one_fit_over_document_len():
    """The documents spec moves with document_len: it must not split the sweep into groups."""
    rows = with_derived(pd.DataFrame(_rows("local", lambda length: 1e-6 * length)))
    assert "documents" not in group_keys(rows, "document_len")
    assert "documents" in group_keys(rows, "seq_len")  # another axis: the spec tells fits apart

    def claim(impl: str, exponent: float) -> cl.Claim:
        return cl.parse_claims(
            {
                "claim": [
                    {
                        "id": "c",
                        "impl": impl,
                        "metric": "time_median_s",
                        "over": "document_len",
                        "expect_exponent": exponent,
                    }
                ]
            }
        )[0]

    linear = evaluate(claim("local", 1.0), pd.DataFrame(_rows("local", lambda x: 1e-6 * x)))
    assert linear.verdict == "confirmed" and linear.n_points == 5
    assert linear.measured == pytest.approx(1.0, abs=1e-6) and linear.work_verdict == "confirmed"
    dense = pd.DataFrame(_rows("masked-dense", lambda x: 0.1))  # n² work whatever the documents
    flat = evaluate(claim("masked-dense", 0.0), dense)
    assert flat.verdict == "confirmed" and flat.measured == pytest.approx(0.0, abs=1e-6)
    assert evaluate(claim("masked-dense", 1.0), dense).verdict == "refuted"
    # local's work grows as l: a flat time is a device filling up, not a verdict
    busy = evaluate(claim("local", 1.0), pd.DataFrame(_rows("local", lambda x: 0.1)))
    assert busy.verdict == "inconclusive" and busy.regime == "rising"
    assert "changes with document_len (exponent 1.00" in busy.reason


def test_packing_claims_end_to_end_from_a_tiny_suite(tmp_path, capsys):
    """run -> claims --json with the bundled claims file: the work verdicts of the two packing
    claims are exact (local executes Σ l² = n·l pairs, masked-dense n² whatever the documents);
    the time verdicts exist (their values are the device's, not asserted)."""
    suite = tmp_path / "packing-tiny.toml"
    suite.write_text(TINY)
    out = tmp_path / "run"
    assert main(["run", str(suite), "--out", str(out), "--no-progress", "--no-table"]) == 0
    capsys.readouterr()
    rows = load_rows(out)
    assert set(rows["status"]) == {"ok"} and rows["agree"].all()
    assert sorted(rows["document_len"].unique()) == list(LENGTHS)

    assert main(["claims", str(out), "--json"]) == 0
    verdicts = {v["claim"]: v for v in json.loads(capsys.readouterr().out)}
    local, dense = verdicts["packing-time-l1"], verdicts["packing-dense-l0"]
    assert local["over"] == dense["over"] == "document_len"
    assert local["work_verdict"] == "confirmed"
    assert local["work_measured"] == pytest.approx(1.0, abs=1e-9)
    assert f"over document_len {LENGTHS[0]}..{LENGTHS[-1]}" in local["work_reason"]
    assert dense["work_verdict"] == "confirmed"
    assert dense["work_measured"] == pytest.approx(0.0, abs=1e-9)
    for verdict in (local, dense):
        assert verdict["verdict"] in cl.VERDICTS and verdict["rows_seen"] == len(LENGTHS)


def test_the_report_fits_time_over_document_len():
    from harness.render.scaling import OVERS, fit_panels

    rows = pd.DataFrame(_rows("local", lambda x: 1e-6 * x) + _rows("masked-dense", lambda x: 0.1))
    panels, records = fit_panels(rows, "document_len", "time_median_s")
    assert "document_len" in OVERS and len(panels) == 1
    exponents = {r["impl"]: r["exponent"] for r in records}
    assert exponents == pytest.approx({"local": 1.0, "masked-dense": 0.0}, abs=1e-6)
