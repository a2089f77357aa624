#!/usr/bin/env bash
# The GPU proof in one command, for a CUDA machine whose Python already has CUDA torch, triton,
# pandas, scipy, matplotlib, rich, pytest, hypothesis (see docs / FACTS):
#
#   bash benchmarks/gpu_proof.sh OUT_DIR
#
# 1. installs attnbench in place (pip install --no-deps --no-build-isolation -e .);
# 2. runs the CUDA tests (pytest -m cuda) -> OUT_DIR/pytest-cuda.txt, .xml;
# 3. runs the GPU smoke suites (attention, and the CUDA-graph decode points) -> OUT_DIR/<suite>/;
# 4. judges the decode rows (benchmarks/decode_targets.py) and prints a short summary
#    -> OUT_DIR/summary.txt.
# Exit status: 0 when the CUDA tests pass and every suite row is ok or skipped; 1 otherwise.
set -uo pipefail

OUT=${1:?usage: bash benchmarks/gpu_proof.sh OUT_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
mkdir -p "$OUT"
cd "$ROOT" || exit 1

"$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.txt" 2>&1 \
  || { echo "gpu_proof: pip install failed (see $OUT/pip.txt)"; exit 1; }
"$PY" - <<'PY' | tee "$OUT/device.txt"
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"device: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
PY

start=$(date +%s)
"$PY" -m pytest -m cuda -q -rs -p no:randomly --junitxml="$OUT/pytest-cuda.xml" \
  >"$OUT/pytest-cuda.txt" 2>&1
tests_rc=$?
tests_s=$(( $(date +%s) - start ))

suites_rc=0
for suite in suites/gpu-smoke.toml suites/gpu-smoke-decode.toml; do
  name=$(basename "$suite" .toml)
  rm -rf "${OUT:?}/$name"
  start=$(date +%s)
  "$PY" -m harness.cli run "$suite" --out "$OUT/$name" --no-progress >"$OUT/$name.txt" 2>&1 \
    || suites_rc=1
  echo "$(( $(date +%s) - start ))" >"$OUT/$name.seconds"
done
"$PY" benchmarks/decode_targets.py --run-dir "$OUT/gpu-smoke-decode" \
  >"$OUT/decode-targets.txt" 2>&1

"$PY" - "$OUT" "$tests_rc" "$tests_s" <<'PY' | tee "$OUT/summary.txt"
import sys
from pathlib import Path

from harness.results import load_rows

out, tests_rc, tests_s = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
tail = (out / "pytest-cuda.txt").read_text().strip().splitlines()
print(f"pytest -m cuda: exit {tests_rc} in {tests_s} s: {tail[-1] if tail else 'no output'}")
bad = 0
for name in ("gpu-smoke", "gpu-smoke-decode"):
    if not (out / name / "rows.jsonl").exists():
        print(f"{name}: no rows (see {out / (name + '.txt')})")
        bad += 1
        continue
    rows = load_rows(out / name)
    seconds = (out / f"{name}.seconds").read_text().strip()
    counts = rows["status"].value_counts().to_dict()
    print(f"{name}: {len(rows)} rows in {seconds} s: {counts}")
    for _, r in rows[~rows["status"].isin(["ok", "skipped"])].iterrows():
        bad += 1
        print(f"  NOT OK {r['impl']} n={r['seq_len']} causal={r['causal']}: "
              f"{r['status']}: {r['reason']}")
    for _, r in rows[rows["status"] == "skipped"].iterrows():
        print(f"  skipped {r['impl']} n={r['seq_len']}: {r['reason']}")
    if name == "gpu-smoke":
        ok = rows[rows["status"] == "ok"]
        big = ok[(ok["seq_len"] == ok["seq_len"].max()) & ok["causal"]]
        for _, r in big.sort_values("time_median_s").iterrows():
            print(f"  {r['impl']:>15} n={r['seq_len']} causal: {r['time_median_s'] * 1e3:8.3f} ms"
                  f"  {r['tflops_per_s'] or 0:7.1f} TFLOP/s  agree={r['agree']}")
    else:
        for _, r in rows[rows["status"] == "ok"].iterrows():
            print(f"  decode n={r['seq_len']} {r['decode_graph']}: "
                  f"{r['time_median_s'] * 1e3:.3f} ms/token, step {r['step_bytes'] / 2**20:.0f} MiB,"
                  f" {r['bw_fraction']:.2f} of measured bandwidth "
                  f"(time/floor {1 / r['bw_fraction']:.2f}, target <= 2 at 32k)"
                  + (f" [{r['decode_graph_reason']}]" if r.get("decode_graph_reason") else ""))
print("decode targets:", *(out / "decode-targets.txt").read_text().splitlines()[-6:], sep="\n  ")
sys.exit(1 if bad else 0)
PY
summary_rc=$?
[ "$tests_rc" -eq 0 ] && [ "$suites_rc" -eq 0 ] && [ "$summary_rc" -eq 0 ]
