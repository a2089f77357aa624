"""The report's summary: sentences computed from the rows (fastest per band of sizes, ties,
speedups, memory, agreement, verdicts), agreement in numbers, numeric order, the load."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.render import efficiency, pivot, summary
from harness.render.report import environment_table
from harness.scenarios.interface import Point

NS = (256, 512, 1024, 2048)


def rows(times: dict[str, callable], agree=True, **extra) -> pd.DataFrame:
    """One ok row per implementation, seq_len and causal; time from ``times[impl](n)``."""
    out = []
    for impl, time in times.items():
        for n in NS:
            for causal in (False, True):
                t = time(n)
                out.append({
                    **Point.of(impl, seq_len=n, causal=causal).columns(),
                    "run_id": "r1", "status": "ok", "time_median_s": t,
                    "time_ci_low_s": t * 0.98, "time_ci_high_s": t * 1.02,
                    "peak_mem_bytes": (4.0 * n * n if impl == "full" else 64.0 * n) + 1e5,
                    "max_abs_err": 1e-7, "rel_err": 1e-7, "tolerance": 1e-6,
                    "rel_tolerance": 1e-6, "agree": agree if callable(agree) is False
                    else agree(impl, n, causal), "load_avg_1m": 0.5 + n / 1024, **extra,
                })
    return pd.DataFrame(out)


def test_the_fastest_per_band_of_sizes_with_its_lead_and_ties_called_ties():
    frame = rows({
        "full": lambda n: 1e-9 * n * n,                  # fastest below 1000
        "sdpa": lambda n: 4e-7 * n + 1e-4,
        "flash-tiled": lambda n: 1e-9 * n * n * 1.02,    # level with full (2%)
    })
    first = summary.sentences(frame, "sdpa", None)[0]
    assert first.startswith("attention: flash-tiled and full are level (within 5%) at seq_len "
                            "256–512, 1.14–3.03x ahead of sdpa; ")
    assert "; sdpa is fastest at seq_len 1024–2048, 2.06–4.56x ahead of full" in first
    assert "(geometric mean time over causal)." in first


def test_speedups_memory_and_agreement_in_words_and_numbers():
    frame = rows({"sdpa": lambda n: 1e-6 * n, "full": lambda n: 2e-6 * n})
    got = summary.sentences(frame, "sdpa", None)
    assert "speedup against sdpa" in got[1] and "full 0.5x" in got[1]
    assert got[2] == "attention, peak memory at seq_len 2048: lowest sdpa 226 KiB, highest " \
        "full 16 MiB (73x)."
    assert got[3] == ("All 16 measured rows agree with the float64 reference within tolerance "
                      "(the largest error is 0.1 of its bound).")
    bad = rows({"sdpa": lambda n: 1e-6 * n, "full": lambda n: 2e-6 * n},
               agree=lambda impl, n, causal: not (impl == "full" and n == 1024 and causal))
    line = summary.agreement(bad)
    assert line == ("1 of 16 measured rows disagree with the float64 reference: full "
                    "(scenario=attention, seq_len=1024, causal=True, dtype=float32).")
    table = summary.agreement_table(bad).set_index("impl")
    assert table.loc["full", "rows"] == 8 and table.loc["full", "agree"] == 7
    assert table.loc["sdpa", "agree"] == 8
    assert np.isclose(table.loc["sdpa", "worst_over_bound"], 0.1)


def test_the_speedup_table_and_pivots_sort_sizes_as_numbers():
    frame = rows({"sdpa": lambda n: 1e-6 * n, "full": lambda n: 2e-6 * n}).sample(
        frac=1.0, random_state=0)
    long, _ = efficiency.speedup(frame.reset_index(drop=True), "sdpa")
    assert [int(v) for v in long["seq_len"]] == list(NS) * 2  # causal False, then True
    wide = efficiency.speedup_by_point(long)
    assert [int(v) for v in wide["seq_len"]] == list(NS) * 2
    assert wide.shape[0] == 8 and wide["full"].iloc[0].startswith("0.5 [")
    part = frame.reset_index(drop=True)
    table = pivot.time_pivot(part, pivot.layout(part), "time_median_s")
    assert [int(v) for v in table.index.get_level_values("seq_len")] == list(NS) * 2


def test_the_environment_shows_the_load():
    frame = rows({"sdpa": lambda n: 1e-6 * n}, contended=False)
    frame.loc[0, "contended"] = True
    env = environment_table({"r1": {"suite": "s", "loadavg_start": [0.25, 0.5, 1.0]}}, frame)
    got = dict(zip(env["field"], env["r1"], strict=True))
    assert got["load at start (1/5/15 min)"] == "0.25 / 0.5 / 1"
    assert got["load during points (1 min)"] == "0.75–2.5"
    assert got["points measured under contention"] == "1 of 8"


def test_at_most_six_sentences_with_several_scenarios_each_fastest_kept():
    from tests.harness.render.test_report import synthetic_rows

    frame = pd.DataFrame(synthetic_rows())
    many = pd.concat([frame, frame.assign(scenario="decode"), frame.assign(scenario="other")])
    got = summary.sentences(many, "sdpa", None)
    assert len(got) == summary.MOST
    firsts = [s for s in got if "fastest" in s or "level (within" in s]
    assert [s.split(":")[0] for s in firsts] == ["attention", "block", "decode", "other"]
