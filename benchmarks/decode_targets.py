"""The decode targets (a KV-cached step is O(n), no cache O(n²)), measured through the harness.

Runs ``suites/decode-cpu.toml`` with ``attnbench run`` (or reads an existing run directory) and
fits log-log slopes of per-token time and cache bytes over the context length n:

- ``cache="full"``: per-token time exponent over n = 1k..4k at most 1.2;
- ``cache="none"``: at least 1.5; and at n = 4k the cache is at least 20x faster per token;
- ``cache="rolling"``: per-token time and cache bytes flat (exponent <= 0.15) for n > window;
- every cache's measured bytes within 10% of the analytic 2·layers·B·H_kv·slots·D·bytes;
- on CUDA: the full-cache step at the largest n <= 32k moves its bytes at 80% of the measured
  copy bandwidth at least (``bw_fraction >= 0.8``: step_bytes / time / bandwidth), for each
  core judged: ``sdpa`` (SDPA's decode path) and ``flash-tiled`` (on CUDA the fused split-KV
  decode kernels) by default.

Usage::

    python benchmarks/decode_targets.py                       # run the suite into /tmp, then judge
    python benchmarks/decode_targets.py --repeat 3            # 3 runs, fastest median per point
    python benchmarks/decode_targets.py --run-dir /tmp/dec    # judge rows already measured
    python benchmarks/decode_targets.py --direct 3 --threads 1  # interleaved rounds, no CLI
    python benchmarks/decode_targets.py --suite suites/decode-gpu.toml   # on a GPU machine
    python benchmarks/decode_targets.py --direct 1 --suite suites/gpu-smoke-decode.toml \
        --add-impl flash-tiled       # a GPU: SDPA's and the split-KV kernels' cached steps

On a shared machine another process's load inflates whichever points it overlaps; with several
runs (``--repeat`` or several ``--run-dir``) each point keeps its fastest run's row.
``--direct R`` calls :func:`harness.execute.runner.run_point` on the suite's points round-robin R
times
(agreement check off, short timing budget), so a burst of load hits every point alike;
``--add-impl NAME`` adds a copy of every point of the suite for that core (the GPU smoke suite
times ``sdpa`` alone: ``--add-impl flash-tiled`` times the split-KV kernels beside it).

Exit status 1 when a target of a judged core (``--impl``, default sdpa and flash-tiled where
they have rows) is missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from harness.execute.runner import run_point
from harness.measure.device import get_device
from harness.measure.timing import TimingConfig
from harness.results import load_rows
from harness.scenarios.interface import cost_of, point_from_row
from harness.sweep.suite import MeasureConfig, load_suite

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "suites" / "decode-cpu.toml"
FULL_MAX, NONE_MIN, SPEEDUP_MIN, FLAT_MAX, BYTES_TOL = 1.2, 1.5, 20.0, 0.15, 0.10
BW_MIN, FLOOR_AT = 0.8, 32768  # GPU: bw_fraction of the cached step, at context <= FLOOR_AT


def slope(n: pd.Series, y: pd.Series) -> float:
    """Least-squares slope of log(y) against log(n)."""
    return float(np.polyfit(np.log(n.to_numpy(float)), np.log(y.to_numpy(float)), 1)[0])


def _mha(df: pd.DataFrame) -> pd.DataFrame:
    """Multi-head rows only (kv_heads unset or equal to heads)."""
    kv = df["kv_heads"].fillna(df["heads"])
    return df[kv == df["heads"]]


def judge(df: pd.DataFrame, impl: str) -> list[tuple[str, float, bool | None]]:
    """(target, measured figure, met) for the rows of one core; met None = for information."""
    ok = df[(df["status"] == "ok") & (df["impl"] == impl)]
    mha = _mha(ok).sort_values("seq_len")
    plain = mha[mha["window_left"].isna()]
    full, none = plain[plain["cache"] == "full"], plain[plain["cache"] == "none"]
    out = []
    if len(full) >= 2:
        e = slope(full["seq_len"], full["time_median_s"])
        out.append(("full-cache time exponent <= 1.2", e, e <= FULL_MAX))
    if len(none) >= 2:
        e = slope(none["seq_len"], none["time_median_s"])
        out.append(("no-cache time exponent >= 1.5", e, e >= NONE_MIN))
        # what the executed FLOPs alone predict (projections + FFN are O(n) of the recompute)
        rows = none.to_dict("records")
        flops = [cost_of(point_from_row(r)).executed_flops for r in rows]
        e = slope(none["seq_len"], pd.Series(flops))
        out.append(("no-cache FLOP-model exponent (causal pairs + linear layers)", e, None))
    both = full.merge(none, on="seq_len", suffixes=("_full", "_none"))
    if len(both):
        last = both.iloc[-1]
        ratio = last["time_median_s_none"] / last["time_median_s_full"]
        out.append((f"cache speed-up at n={last['seq_len']} >= 20x", ratio, ratio >= SPEEDUP_MIN))
    rolling = mha[mha["cache"] == "rolling"]
    rolling = rolling[rolling["seq_len"] > rolling["window_left"] + 1]  # past the window
    if len(rolling) >= 2:
        for col, what in (("time_median_s", "time"), ("cache_bytes", "cache bytes")):
            e = slope(rolling["seq_len"], rolling[col])
            out.append((f"rolling {what} |exponent| <= 0.15", e, abs(e) <= FLAT_MAX))
    if "bw_fraction" in full and full["bw_fraction"].notna().any():
        last = full[full["seq_len"] <= FLOOR_AT].dropna(subset=["bw_fraction"]).iloc[-1:]
        for _, row in last.iterrows():
            met = row["bw_fraction"] >= BW_MIN if row["device"] == "cuda" else None
            what = (f"bw_fraction of the cached step at n={row['seq_len']} "
                    f"({row.get('decode_graph')}) >= {BW_MIN}")
            out.append((what, row["bw_fraction"], met))
    cached = ok[ok["cache"] != "none"]
    if len(cached):
        err = (cached["cache_bytes"] / cached["cache_bytes_analytic"] - 1).abs().max()
        out.append(("cache bytes within 10% of analytic (worst)", err, err <= BYTES_TOL))
    return out


def table(df: pd.DataFrame) -> str:
    """Per-token time (ms), speed-up and cache MiB per core and cache over n."""
    ok = df[df["status"] == "ok"].copy()
    ok["kv"] = ok["kv_heads"].fillna(ok["heads"]).astype(int)
    ok["ms/token"] = ok["time_median_s"] * 1e3
    ok["prefill ms"] = ok["prefill_s"] * 1e3
    ok["cache MiB"] = ok["cache_bytes"] / 2**20
    cols = ["impl", "cache", "kv", "seq_len", "ms/token", "prefill ms", "cache MiB", "agree"]
    cols += [c for c in ("decode_graph", "bw_fraction") if c in ok]
    return ok[cols].sort_values(cols[:4]).to_string(index=False, float_format="%.3f")


def fastest(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per point: the run with the smallest per-token median (least disturbed)."""
    df = pd.concat(frames, ignore_index=True)
    df["_t"] = df["time_median_s"].fillna(float("inf"))
    return df.sort_values("_t").drop_duplicates("point_id").drop(columns="_t")


def run_direct(rounds: int, threads: int | None, budget_s: float, suite: Path,
               add_impls: tuple[str, ...] = ()) -> pd.DataFrame:
    """The suite's points (and a copy of each for every core of ``add_impls``) through
    run_point, interleaved over ``rounds``; fastest row each."""
    if threads:
        torch.set_num_threads(threads)
    loaded = load_suite(suite)
    points = list(loaded.points)
    points += [dataclasses.replace(p, impl=impl) for impl in add_impls for p in loaded.points
               if p.impl != impl]
    timing = TimingConfig(budget_s=budget_s, min_samples=3, warmup_calls=1)
    config = MeasureConfig(timing=timing, check="none", cuda_graph=loaded.measure.cuda_graph,
                           options=loaded.measure.options)
    devices = {kind: get_device(kind, False) for kind in {p.device for p in points}}
    rows = [run_point(p, config, devices[p.device]) for _ in range(rounds) for p in points]
    return fastest([pd.DataFrame(rows)])


def run_suite(out: Path, suite: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "harness.cli",
        "run",
        str(suite),
        "--out",
        str(out),
        "--no-progress",
        "--no-table",
    ]
    subprocess.run(cmd, check=True, cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, nargs="+", help="judge these runs (no new run)")
    parser.add_argument("--repeat", type=int, default=1, help="suite runs when running it")
    parser.add_argument("--direct", type=int, metavar="ROUNDS", help="interleaved run_point rounds")
    parser.add_argument("--threads", type=int, help="CPU threads for --direct")
    parser.add_argument("--budget-s", type=float, default=0.5, help="timing budget for --direct")
    parser.add_argument("--impl", nargs="+", default=["sdpa", "flash-tiled"],
                        help="cores whose targets set the exit status (those with rows)")
    parser.add_argument("--add-impl", nargs="+", default=[],
                        help="with --direct: also time every suite point with these cores")
    parser.add_argument("--suite", type=Path, default=SUITE, help="decode suite to run")
    args = parser.parse_args(argv)
    if args.direct:
        df = run_direct(args.direct, args.threads, args.budget_s, args.suite,
                        tuple(args.add_impl))
        print(f"{args.direct} interleaved rounds, threads={torch.get_num_threads()}")
    else:
        run_dirs = args.run_dir
        if run_dirs is None:
            run_dirs = [
                Path(tempfile.mkdtemp(prefix="decode-targets-")) for _ in range(args.repeat)
            ]
            for run_dir in run_dirs:
                run_suite(run_dir, args.suite)
        df = fastest([load_rows(d) for d in run_dirs])
        print(f"rows: {' '.join(map(str, run_dirs))}")
    print(f"{table(df)}\n")
    bad = df[df["status"] != "ok"]
    for _, row in bad.iterrows():
        print(
            f"not ok: {row['impl']} {row['cache']} n={row['seq_len']}: {row['status']} "
            f"{row.get('reason')}"
        )
    missed = False
    for impl in sorted(df["impl"].unique()):
        print(f"\n{impl}:")
        for name, value, met in judge(df, impl):
            print(f"  {({True: 'PASS', False: 'MISS'}).get(met, 'INFO')}  {name}: {value:.3f}")
            missed |= impl in args.impl and met is False
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
