#!/usr/bin/env bash
# The GPU proof in one command, from a bare CUDA machine to a summary inside a time budget:
#
#   bash benchmarks/gpu_proof.sh OUT_DIR [--minutes M] [--archive FILE]
#   bash benchmarks/gpu_proof.sh --dry-run     # list the tests it would run (no GPU needed)
#
# Steps, in order, each under a time cap taken from the --minutes budget (default 8; the caps
# scale with it) and ending with one line that gives its elapsed time:
#   setup           pip install -e . (no deps, no network), the device, `attnbench list` timed
#   tests-parallel  every test marked `cuda` but not `gpu_alone`, on pytest-xdist workers
#                   (-n auto; serially where xdist is missing), kernels at their pinned default
#                   configs (FlexAttention on CUDA is in them: the agreement test and the smoke;
#                   tests/implementations/test_flex.py is CPU work, CI's)
#   tests-serial    the `cuda and gpu_alone` tests (timing, NVML: they need the GPU to themselves)
#   smoke           suites/gpu-smoke.toml and suites/gpu-smoke-decode.toml (CUDA-graph decode)
#   decode-targets  benchmarks/decode_targets.py on the decode smoke rows
#   profile         every claims suite for a GPU, one pass at a short budget, the fused
#                   kernels at their pinned default configs (ATTNBENCH_AUTOTUNE=off, recorded
#                   in env.json): a quick profile, the rows of the points that fit, partial
#                   runs kept
#   verdicts        attnbench claims and attnbench report on the profile rows
# and, with --also (a comma-separated list), measurements for the same lease:
#   linear          benchmarks/linear_targets.py (the linear family's GPU targets)
#   sweep           benchmarks/kernel_sweep.py (every config of the fused kernels, with peers)
# which share the same --minutes budget (give it more: 10 minutes for both).
# Everything is written under OUT_DIR as it goes (steps.tsv: one line per finished step);
# --archive FILE re-packs OUT_DIR into FILE (a .tar.gz, replaced atomically) after every step,
# so a lease that ends early still returns the finished steps. summary.txt says what ran, what
# failed and what did not fit.
#
# Python: $PYTHON, else the checkout's .venv/bin/python (README's set-up), else python3.
# Exit status: 0 when every step ran and passed; 1 when a step failed or did not fit; 2 on a
# machine without a CUDA GPU, a Python without torch or pytest, or bad arguments (one line on
# stderr).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
export PYTHONUNBUFFERED=1

usage() {
  echo "usage: bash benchmarks/gpu_proof.sh OUT_DIR [--minutes M] [--archive FILE]" \
    "[--also linear,sweep] | --dry-run" >&2
  exit 2
}

OUT="" MINUTES=8 ARCHIVE="" DRY=0 ALSO=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --minutes) [ $# -ge 2 ] || usage; MINUTES=$2; shift ;;
    --archive) [ $# -ge 2 ] || usage; ARCHIVE=$2; shift ;;
    --also) [ $# -ge 2 ] || usage; ALSO=$2; shift ;;
    -*) usage ;;
    *) [ -z "$OUT" ] || usage; OUT=$1 ;;
  esac
  shift
done
for extra in ${ALSO//,/ }; do
  case "$extra" in
    linear | sweep) ;;
    *) echo "gpu_proof: --also $extra: not one of linear, sweep" >&2; exit 2 ;;
  esac
done
case "$MINUTES" in
  '' | *[!0-9.]* | *.*.*)
    echo "gpu_proof: --minutes $MINUTES: not a number of minutes" >&2; exit 2 ;;
esac

# The project's Python, found the way README sets it up; say why one cannot be used.
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python
else PY=$(command -v python3 || command -v python || echo python3)
fi
why=$("$PY" -c 'import torch, pytest' 2>&1) || {
  echo "gpu_proof: $PY cannot run the proof (${why##*$'\n'});" \
    "set PYTHON= or set up .venv as README.md says" >&2
  exit 2
}

# pyproject's addopts carry --benchmark-disable, which pytest rejects (exit 4, nothing run)
# where pytest-benchmark is not installed: replace them, and disable the plugin only if present
PYTEST_OPTS=(-o "addopts=-p no:cacheprovider" -p no:randomly)
"$PY" -c "import pytest_benchmark" >/dev/null 2>&1 && PYTEST_OPTS+=(--benchmark-disable)
XDIST=()
"$PY" -c "import xdist" >/dev/null 2>&1 && XDIST=(-n auto)
# work stealing (pytest-xdist >= 3.2): an idle worker takes queued tests from a busy one; with
# the compile-heavy tests first (tests/conftest.py) the run does not wait on one worker's queue
"$PY" -c "import xdist, sys; sys.exit(tuple(map(int, xdist.__version__.split('.')[:2])) < (3, 2))" \
  >/dev/null 2>&1 && XDIST+=(--dist worksteal)
PARALLEL=(-m "cuda and not gpu_alone" tests)
SERIAL=(-m "cuda and gpu_alone" tests)

collect() {  # collect NAME ARGS...: print "NAME: test id" lines, or the cause of a failure
  local name=$1; shift
  local log
  log=$("$PY" -m pytest --collect-only -q "${PYTEST_OPTS[@]}" "$@" 2>&1)
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then  # 5: nothing collected (no test has that marker)
    echo "gpu_proof: collecting '$name' failed (pytest exit $rc):" >&2
    grep -E "Error|error:" <<<"$log" | head -n 5 >&2
    return 1
  fi
  grep '::' <<<"$log" | sed "s/^/$name: /"
  return 0  # a selection with no test (grep's 1) is not a failure
}

if [ "$DRY" -eq 1 ]; then
  collect cuda "${PARALLEL[@]}" || exit 1
  collect cuda-alone "${SERIAL[@]}" || exit 1
  exit 0
fi
[ -n "$OUT" ] || usage

why=$("$PY" - 2>&1 <<'PY'
import torch
if not torch.cuda.is_available():
    raise SystemExit(f"no CUDA GPU here (torch {torch.__version__}: torch.cuda.is_available() "
                     "is False); nothing to prove (--dry-run lists the tests)")
PY
) || { echo "gpu_proof: ${why##*$'\n'}" >&2; exit 2; }
mkdir -p "$OUT" || { echo "gpu_proof: cannot create $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)

START=$(date +%s)
BUDGET=$("$PY" -c "print(int(float('$MINUTES') * 60))")
# the --also measurements take fixed shares (EXTRA_S); the proof's steps scale with the rest
EXTRA_S=0
case ",$ALSO," in *,linear,*) EXTRA_S=$(( EXTRA_S + 60 )) ;; esac
case ",$ALSO," in *,sweep,*) EXTRA_S=$(( EXTRA_S + 150 )) ;; esac
SCALE=$("$PY" -c "print(max(float('$MINUTES') * 60 - $EXTRA_S, 30) / 480)")
printf 'step\tstatus\tseconds\tcap_s\tnote\n' >"$OUT/steps.tsv"

archive() {
  [ -n "$ARCHIVE" ] || return 0
  tar -czf "$ARCHIVE.tmp" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null \
    && mv -f "$ARCHIVE.tmp" "$ARCHIVE"
}

cap_for() {  # cap_for NOMINAL_S MIN_S RESERVE_S: the step's cap (its nominal share, scaled,
  # at least MIN_S, within what is left less RESERVE_S for the steps after it and the --also
  # measurements' shares), or 0 when under MIN_S; NOMINAL_S 0: all that is left (the profile
  # takes what the steps before it did not use)
  "$PY" - "$1" "$2" "$3" "$SCALE" "$BUDGET" "$(( $(date +%s) - START ))" "$EXTRA_S" <<'PY'
import sys
nominal, minimum, reserve, scale, budget, used, extra = map(float, sys.argv[1:])
left = budget - used - reserve * min(scale, 1.0) - extra
cap = left if nominal == 0 else min(max(nominal * scale, minimum), left)
print(int(cap) if cap >= minimum else 0)
PY
}

# capped FLAG CAP COMMAND...: run COMMAND (a function too) in its own process group; at CAP
# seconds the group gets SIGINT (the harness keeps finished rows, pytest writes its report),
# 15 s later SIGKILL, and FLAG is created
capped() {
  local flag=$1 cap=$2; shift 2
  rm -f "$flag"
  set -m
  "$@" &
  local pid=$!
  (sleep "$cap"; touch "$flag"; kill -INT -- "-$pid"; sleep 15; kill -KILL -- "-$pid") \
    >/dev/null 2>&1 &
  local watchdog=$!
  set +m
  wait "$pid"
  local rc=$?
  kill -- "-$watchdog" 2>/dev/null
  return $rc
}

# step NAME NOMINAL_S MIN_S RESERVE_S COMMAND...: run COMMAND under the step's cap, log it,
# record it in steps.tsv, print one line, archive. A COMMAND that caps its own parts (the
# profile) reads the cap from STEP_CAP and runs without the step's watchdog (process groups do
# not nest).
step() {
  local name=$1 nominal=$2 minimum=$3 reserve=$4; shift 4
  local cap t0 rc status left
  cap=$(cap_for "$nominal" "$minimum" "$reserve")
  export STEP_CAP=$cap
  if [ "$cap" -eq 0 ]; then
    left=$(( BUDGET - $(date +%s) + START ))
    printf '%s\tnot run\t0\t0\tdid not fit: %s s left of %s\n' "$name" "$left" "$BUDGET" \
      >>"$OUT/steps.tsv"
    echo "gpu_proof: $name did not fit ($left s left)"
    archive
    return 1
  fi
  t0=$(date +%s)
  if [ "$1" = profile ]; then "$@" >"$OUT/$name.log" 2>&1
  else capped "$OUT/.capped" "$cap" "$@" >"$OUT/$name.log" 2>&1
  fi
  rc=$?
  if [ -e "$OUT/.capped" ]; then status="stopped at its cap"; rc=1
  elif [ $rc -eq 0 ]; then status=ok
  else status="failed (exit $rc)"
  fi
  rm -f "$OUT/.capped"
  printf '%s\t%s\t%s\t%s\t\n' "$name" "$status" "$(( $(date +%s) - t0 ))" "$cap" \
    >>"$OUT/steps.tsv"
  echo "gpu_proof: $name $status in $(( $(date +%s) - t0 )) s" \
    "(cap $cap s; $(( $(date +%s) - START )) s of $BUDGET)"
  archive
  return $rc
}

setup() {
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . || return 1
  "$PY" - <<'PY'
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
      f"{torch.backends.cudnn.version()}, device: {torch.cuda.get_device_name()}")
PY
  local t0=$SECONDS
  "$PY" -m harness.cli list >"$OUT/list.txt" 2>&1 || return 1
  echo "attnbench list: $(( SECONDS - t0 )) s"
}

tests() {  # tests NAME PYTEST-ARGS...: JUnit XML beside the log; exit 5 (none selected) is ok
  local name=$1; shift
  "$PY" -m pytest -q -rs "${PYTEST_OPTS[@]}" --junitxml="$OUT/$name.xml" "$@"
  local rc=$?
  [ $rc -eq 5 ] && return 0
  return $rc
}

smoke() {
  local rc=0 suite name
  # the decode smoke first: it is short, and the CUDA-graph step is what a CPU cannot test
  for suite in suites/gpu-smoke-decode.toml suites/gpu-smoke.toml; do
    name=$(basename "$suite" .toml)
    rm -rf "${OUT:?}/$name"
    "$PY" -m harness.cli run "$suite" --out "$OUT/$name" --no-progress || rc=1
  done
  return $rc
}

profile() {  # every claims suite for a GPU, one pass at a short budget, in order, each in an
  # equal share of what is left of the step's cap (STEP_CAP) but at least MIN_SHARE seconds:
  # when less is left, the rest did not fit
  local suites=(suites/claims-gpu.toml suites/claims-linear-gpu.toml suites/claims-gpu-local.toml
    suites/claims-gpu-decode.toml suites/claims-linear-gpu-decode.toml
    suites/claims-gpu-heads.toml suites/claims-gpu-block.toml)
  local rc=0 suite name share left i=0 MIN_SHARE=15
  local end=$(( $(date +%s) + STEP_CAP ))
  for suite in "${suites[@]}"; do
    name=profile-$(basename "$suite" .toml)
    left=$(( end - $(date +%s) ))
    share=$(( left / (${#suites[@]} - i) ))
    i=$(( i + 1 ))
    [ "$share" -ge "$MIN_SHARE" ] || share=$MIN_SHARE
    [ "$left" -ge "$MIN_SHARE" ] || { echo "$name: did not fit"; rc=1; continue; }
    rm -rf "${OUT:?}/$name"
    ATTNBENCH_AUTOTUNE=off capped "$OUT/.capped-profile" "$share" \
      "$PY" -m harness.cli run "$suite" --out "$OUT/$name" --no-progress --no-table \
      --passes 1 --budget-s 0.05
    local code=$?
    if [ -e "$OUT/.capped-profile" ]; then
      echo "$name: stopped at its share of $share s (finished rows kept)"; rc=1
    elif [ $code -eq 0 ]; then echo "$name: finished"
    else echo "$name: failed (exit $code)"; rc=1
    fi
    rm -f "$OUT/.capped-profile"
    archive
  done
  return $rc
}

verdicts() {
  local runs=() dir
  for dir in "$OUT"/profile-*; do [ -s "$dir/rows.jsonl" ] && runs+=("$dir"); done
  [ ${#runs[@]} -gt 0 ] || { echo "no profile rows to judge"; return 1; }
  "$PY" -m harness.cli claims "${runs[@]}" >"$OUT/claims.txt" 2>&1
  "$PY" -m harness.cli claims "${runs[@]}" --json >"$OUT/claims.json" 2>/dev/null
  "$PY" -m harness.cli report "${runs[@]}" --out "$OUT/report" >/dev/null
}

linear_targets() {  # the linear family's targets, rows written as they finish
  "$PY" benchmarks/linear_targets.py "$OUT/linear-targets.json" \
    --deadline-s "$(( STEP_CAP > 30 ? STEP_CAP - 20 : 10 ))"
}

kernel_sweep() {  # the fused kernels' configs beside the peers, within the step's cap
  "$PY" benchmarks/kernel_sweep.py --out "$OUT/kernel-sweep" \
    --minutes "$("$PY" -c "print(max($STEP_CAP - 10, 30) / 60)")"
}

# name, nominal cap at the default 8 minutes, least worth starting, reserve for the later steps'
# least. Nominal caps from the H100's third lease of 2026-11-26 (docs/gpu.md): setup 22 s; the
# parallel tests 142 of their 165 in 210 s (16 workers, before work stealing and the
# compile-heavy tests first); the serial ones 24 s; both smokes 130 s; the decode targets 6 s
step setup 25 15 90 setup || rc=1
step tests-parallel 230 30 75 tests tests-parallel "${XDIST[@]}" "${PARALLEL[@]}" || rc=1
step tests-serial 25 10 65 tests tests-serial "${SERIAL[@]}" || rc=1
step smoke 135 30 35 smoke || rc=1
step decode-targets 8 5 30 "$PY" benchmarks/decode_targets.py --run-dir "$OUT/gpu-smoke-decode" \
  || rc=1
step profile 0 20 35 profile || rc=1  # all that is left, less the verdicts' reserve
step verdicts 30 8 0 verdicts || rc=1
SCALE=1 EXTRA_S=0  # the measurements' caps are their own, within what is left
case ",$ALSO," in *,linear,*) step linear-targets 60 30 0 linear_targets || rc=1 ;; esac
case ",$ALSO," in *,sweep,*) step kernel-sweep 150 60 0 kernel_sweep || rc=1 ;; esac

"$PY" benchmarks/gpu_proof_summary.py "$OUT" | tee "$OUT/summary.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
archive
exit $rc
