#!/usr/bin/env bash
# The GPU proof in one command, for a CUDA machine whose Python already has CUDA torch, triton,
# pandas, scipy, matplotlib, rich, pytest, hypothesis (see docs / FACTS):
#
#   bash benchmarks/gpu_proof.sh OUT_DIR
#   bash benchmarks/gpu_proof.sh --dry-run     # list the tests it would run (no GPU needed)
#
# 1. installs attnbench in place (pip install --no-deps --no-build-isolation -e .);
# 2. runs the CUDA tests -> OUT_DIR/pytest-<selection>.txt, .xml: every test marked `cuda`
#    (tests/cuda, the fused Triton kernels forward and backward, the GPU cases of the timing and
#    NVML tests) and the FlexAttention tests;
# 3. runs the GPU smoke suites (attention, and the CUDA-graph decode points) -> OUT_DIR/<suite>/;
# 4. judges the decode rows (benchmarks/decode_targets.py) and prints a short summary
#    -> OUT_DIR/summary.txt.
# Exit status: 0 when every selected test ran and passed (at least one per selection; a skip is
# listed with its reason) and every suite row is ok or skipped; 1 otherwise; 2 on a machine
# without a CUDA GPU or with bad arguments (one line on stderr).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
cd "$ROOT" || exit 2
SELECTIONS=(cuda flex)  # what each selection runs: selection_args below

selection_args() {
  case "$1" in
    cuda) echo "-m cuda tests" ;;
    flex) echo "tests/implementations/test_flex.py" ;;
  esac
}

# pyproject's addopts carry --benchmark-disable, which pytest rejects (exit 4, nothing run)
# where pytest-benchmark is not installed: replace them, and disable the plugin only if present
PYTEST_OPTS=(-o "addopts=-p no:cacheprovider" -p no:randomly)
if "$PY" -c "import pytest_benchmark" >/dev/null 2>&1; then
  PYTEST_OPTS+=(--benchmark-disable)
fi

if [ "${1:-}" = "--dry-run" ]; then
  for sel in "${SELECTIONS[@]}"; do
    # shellcheck disable=SC2046
    "$PY" -m pytest --collect-only -q "${PYTEST_OPTS[@]}" $(selection_args "$sel") 2>&1 \
      | grep '::' | sed "s/^/$sel: /"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_proof: collecting '$sel' failed" >&2; exit 1; }
  done
  exit 0
fi
case "${1:-}" in
  "" | -*) echo "usage: bash benchmarks/gpu_proof.sh OUT_DIR | --dry-run" >&2; exit 2 ;;
esac
OUT=$1

why=$("$PY" - 2>&1 <<'PY'
import sys
try:
    import torch
except Exception as exc:
    print(f"cannot import torch ({type(exc).__name__}: {exc})")
    sys.exit(2)
if not torch.cuda.is_available():
    print(f"no CUDA GPU here (torch {torch.__version__}: torch.cuda.is_available() is False); "
          "nothing to prove (--dry-run lists the tests)")
    sys.exit(2)
PY
) || { echo "gpu_proof: ${why##*$'\n'}" >&2; exit 2; }

mkdir -p "$OUT" || { echo "gpu_proof: cannot create $OUT" >&2; exit 2; }
"$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.txt" 2>&1 \
  || { echo "gpu_proof: pip install failed (see $OUT/pip.txt)"; exit 1; }
"$PY" - <<'PY' | tee "$OUT/device.txt"
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"device: {torch.cuda.get_device_name()}")
PY

tests_rc=0
for sel in "${SELECTIONS[@]}"; do
  start=$(date +%s)
  # shellcheck disable=SC2046
  "$PY" -m pytest -q -rs "${PYTEST_OPTS[@]}" --junitxml="$OUT/pytest-$sel.xml" \
    $(selection_args "$sel") >"$OUT/pytest-$sel.txt" 2>&1 || tests_rc=1
  echo "$(( $(date +%s) - start ))" >"$OUT/pytest-$sel.seconds"
done

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

"$PY" - "$OUT" "${SELECTIONS[@]}" <<'PY' | tee "$OUT/summary.txt"
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.results import load_rows

out, selections = Path(sys.argv[1]), sys.argv[2:]
bad = 0
for sel in selections:
    xml = out / f"pytest-{sel}.xml"
    if not xml.exists():
        print(f"pytest {sel}: no report (see {out / f'pytest-{sel}.txt'})")
        bad += 1
        continue
    suites = ET.parse(xml).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    seconds = (out / f"pytest-{sel}.seconds").read_text().strip()
    print(f"pytest {sel}: {passed} passed, {n['failures']} failed, {n['errors']} errors, "
          f"{n['skipped']} skipped of {n['tests']} in {seconds} s")
    if passed == 0 or n["failures"] or n["errors"]:
        bad += 1
    for case in suite.iter("testcase"):
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                print(f"  {tag} {case.get('classname')}::{case.get('name')}: "
                      f"{(node.get('message') or '')[:160]}")
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
