#!/usr/bin/env bash
# The GPU proof in one command, from a bare CUDA machine to verdicts inside a time budget.
# It measures first: the lease's time goes to the claims, not to compiling (docs/lease.md).
#
#   bash lease/proof.sh OUT_DIR [--minutes M] [--archive FILE]
#   bash lease/proof.sh --dry-run [--minutes M] [--schedule-json]
#
# --dry-run lists the CUDA tests the proof would run; --schedule-json prints the plan instead (a
# JSON list of {"step", "kind", "cap_s"}; no GPU, torch or pytest needed). The steps, in shares
# of the budget B = 60·M s (M default 10): setup 6%, `attnbench verdicts --device cuda` 75%, the
# CUDA tests <= 15% (at most 90 s), the kernel sweep the rest less 15 s for the harvest and the
# summary. Everything lands under OUT_DIR as it goes; --archive FILE re-packs it after every
# step and puts report.html, verdicts.md, summary.txt and triton-harvest.tar.gz beside FILE.
# Exit status: 0 every step ran and passed (the kernel sweep may be skipped); 1 a step failed or
# did not fit; 2 no CUDA GPU, a Python without torch or pytest, or bad arguments (one line).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LEASE=$ROOT/lease
cd "$ROOT" || exit 2
export PYTHONUNBUFFERED=1

usage() {
  echo "usage: bash lease/proof.sh OUT_DIR [--minutes M] [--archive FILE]" \
    "| --dry-run [--minutes M] [--schedule-json]" >&2
  exit 2
}

OUT="" MINUTES=10 ARCHIVE="" DRY=0 PLAN_JSON=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --schedule-json) PLAN_JSON=1 ;;
    --minutes) [ $# -ge 2 ] || usage; MINUTES=$2; shift ;;
    --archive) [ $# -ge 2 ] || usage; ARCHIVE=$2; shift ;;
    -*) usage ;;
    *) [ -z "$OUT" ] || usage; OUT=$1 ;;
  esac
  shift
done
case "$MINUTES" in
  '' | *[!0-9.]* | *.*.* | .)
    echo "proof: --minutes $MINUTES: not a number of minutes" >&2; exit 2 ;;
esac
if [ "$PLAN_JSON" -eq 1 ] && [ "$DRY" -eq 0 ]; then
  echo "proof: --schedule-json goes with --dry-run" >&2; exit 2
fi
[ "$DRY" -eq 1 ] || [ -n "$OUT" ] || usage  # before any work: no Python started

TESTS_MAX_S=90      # the CUDA tests' target on an H100, whatever the budget
FINAL_RESERVE_S=15  # after the kernel sweep: the Triton harvest and the summary

# plan: "step kind cap_s" lines for a budget of $1 seconds (integers, in the order they run;
# the caps sum to at most the budget; the verdicts >= 60% of it)
plan() {
  awk -v budget="$1" -v tests_max="$TESTS_MAX_S" -v reserve="$FINAL_RESERVE_S" 'BEGIN {
    setup = int(budget * 0.06); verdicts = int(budget * 0.75)
    tests = int(budget * 0.15); if (tests > tests_max) tests = tests_max
    kernels = budget - setup - verdicts - tests - reserve
    if (kernels < 0) kernels = 0
    verdicts += budget - setup - verdicts - tests - reserve - kernels  # leftover whole seconds
    print "setup setup " setup
    print "verdicts verdicts " verdicts
    print "tests-parallel tests " int(tests * 0.75)
    print "tests-serial tests " tests - int(tests * 0.75)
    print "kernel-sweep kernels " int(kernels)
  }'
}
BUDGET=$(awk -v m="$MINUTES" 'BEGIN { print int(m * 60) }')

if [ "$DRY" -eq 1 ] && [ "$PLAN_JSON" -eq 1 ]; then
  plan "$BUDGET" | awk 'BEGIN { printf "[" }
    { printf "%s\n  {\"step\": \"%s\", \"kind\": \"%s\", \"cap_s\": %d}", (NR > 1 ? "," : ""),
      $1, $2, $3 }
    END { print "\n]" }'
  exit 0
fi

# The project's Python, found the way README sets it up; say why one cannot be used.
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python
else PY=$(command -v python3 || command -v python || echo python3)
fi
# What the proof needs to know of that Python, asked in one start (each start imports torch:
# seconds of CPU): torch and pytest import, pytest-benchmark and pytest-xdist (>= 3.2 for work
# stealing) are there or not, and whether torch sees a CUDA GPU. Its last line carries them.
facts=$("$PY" - 2>&1 <<'PY'
import importlib

import pytest  # noqa: F401  (the proof runs pytest)
import torch


def present(name):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


xdist = present("xdist")
try:
    steal = xdist is not None and tuple(map(int, xdist.__version__.split(".")[:2])) >= (3, 2)
except ValueError:
    steal = False
print("proof-facts", int(present("pytest_benchmark") is not None), int(xdist is not None),
      int(steal), int(torch.cuda.is_available()), torch.__version__)
PY
) || {
  echo "proof: $PY cannot run the proof (${facts##*$'\n'});" \
    "set PYTHON= or set up .venv as README.md says" >&2
  exit 2
}
read -r tag HAS_BENCH HAS_XDIST HAS_STEAL HAS_CUDA TORCH_VERSION <<<"${facts##*$'\n'}"
[ "$tag" = proof-facts ] || {
  echo "proof: $PY cannot run the proof (it answered: ${facts##*$'\n'})" >&2; exit 2; }

# pyproject's addopts carry --benchmark-disable, which pytest rejects (exit 4, nothing run)
# where pytest-benchmark is not installed: replace them, and disable the plugin only if present
PYTEST_OPTS=(-o "addopts=-p no:cacheprovider" -p no:randomly)
[ "$HAS_BENCH" = 1 ] && PYTEST_OPTS+=(--benchmark-disable)
XDIST=()
[ "$HAS_XDIST" = 1 ] && XDIST=(-n auto)
# work stealing (pytest-xdist >= 3.2): an idle worker takes queued tests from a busy one; with
# the compile-heavy tests first (tests/conftest.py) the run does not wait on one worker's queue
[ "$HAS_STEAL" = 1 ] && XDIST+=(--dist worksteal)
PARALLEL=(-m "cuda and not gpu_alone" tests)
SERIAL=(-m "cuda and gpu_alone" tests)

# the dry run's list: one collection of -m cuda, each test named by the selection of the two
# above that holds it (gpu_alone or not): half the time of collecting each (~200 test modules)
LIST_SELECTIONS='import sys, pytest
class Lister:
    def pytest_collection_finish(self, session):
        for item in session.items:
            alone = item.get_closest_marker("gpu_alone") is not None
            print("selection", "cuda-alone:" if alone else "cuda:", item.nodeid)
sys.exit(pytest.main(sys.argv[1:], plugins=[Lister()]))'

if [ "$DRY" -eq 1 ]; then
  log=$("$PY" -c "$LIST_SELECTIONS" --collect-only -q "${PYTEST_OPTS[@]}" -m cuda tests 2>&1)
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then  # 5: nothing collected (no test has that marker)
    echo "proof: collecting 'cuda' failed (pytest exit $rc):" >&2
    grep -E "Error|error:" <<<"$log" | head -n 5 >&2
    exit 1
  fi
  grep '^selection ' <<<"$log" | sed 's/^selection //'
  exit 0
fi

[ "$HAS_CUDA" = 1 ] || {
  echo "proof: no CUDA GPU here (torch $TORCH_VERSION: torch.cuda.is_available() is False);" \
    "nothing to prove (--dry-run lists the tests)" >&2
  exit 2
}
mkdir -p "$OUT" || { echo "proof: cannot create $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
BESIDE=""  # where the files a reader opens first go: beside the archive
if [ -n "$ARCHIVE" ]; then
  mkdir -p "$(dirname "$ARCHIVE")" && BESIDE=$(cd "$(dirname "$ARCHIVE")" && pwd)
fi

START=$(date +%s)
printf 'step\tstatus\tseconds\tcap_s\tnote\n' >"$OUT/steps.tsv"
plan "$BUDGET" >"$OUT/plan.txt"
planned() { awk -v s="$1" '$1 == s { print $3 }' "$OUT/plan.txt"; }

archive() {
  [ -n "$ARCHIVE" ] || return 0
  tar -czf "$ARCHIVE.tmp" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null \
    && mv -f "$ARCHIVE.tmp" "$ARCHIVE"
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

# step NAME CAP GRACE COMMAND...: run COMMAND with STEP_CAP=CAP under a watchdog at CAP + GRACE
# seconds (a command that stops itself at its cap, as `run --time-limit` does, gets the grace
# to finish cleanly); log it, record it in steps.tsv, print one line, archive.
step() {
  local name=$1 cap=$2 grace=$3; shift 3
  local t0 rc status left
  export STEP_CAP=$cap
  if [ "$cap" -lt 5 ]; then
    left=$(( BUDGET - $(date +%s) + START ))
    printf '%s\tnot run\t0\t%s\tdid not fit: %s s left of %s\n' "$name" "$cap" "$left" \
      "$BUDGET" >>"$OUT/steps.tsv"
    echo "proof: $name did not fit ($left s left)"
    archive
    return 1
  fi
  t0=$(date +%s)
  capped "$OUT/.capped" $(( cap + grace )) "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  if [ -e "$OUT/.capped" ]; then status="stopped at its cap"; rc=1
  elif [ $rc -eq 0 ]; then status=ok
  else status="failed (exit $rc)"
  fi
  rm -f "$OUT/.capped"
  printf '%s\t%s\t%s\t%s\t\n' "$name" "$status" "$(( $(date +%s) - t0 ))" "$cap" \
    >>"$OUT/steps.tsv"
  echo "proof: $name $status in $(( $(date +%s) - t0 )) s" \
    "(cap $cap s; $(( $(date +%s) - START )) s of $BUDGET)"
  archive
  return $rc
}

# Kernels arrive compiled (warm_cache.py): Triton's cache at a fixed absolute path
# (its group files name their children by absolute path), and Triton's own ptxas named, so
# Inductor does not pick another (the cache key holds `ptxas --version`)
export TRITON_CACHE_DIR=/tmp/attnbench-triton-cache
ptxas=$("$PY" - 2>/dev/null <<'PY'
import pathlib, triton
path = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"
print(path if path.is_file() else "")
PY
)
[ -n "$ptxas" ] && export TRITON_PTXAS_PATH=$ptxas
# each step counts Triton's compiles (cache misses) into its own file, through the
# sitecustomize in triton_listen/
export PYTHONPATH="$LEASE/triton_listen${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT/triton-misses"

setup() {
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . || return 1
  if [ -d .triton-cache ]; then
    "$PY" "$LEASE/warm_cache.py" --install .triton-cache || echo "warm cache: not installed"
  else
    echo "warm cache: none carried (.triton-cache/ absent)"
  fi
  "$PY" - <<'PY'
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
      f"{torch.backends.cudnn.version()}, device: {torch.cuda.get_device_name()}")
PY
  local t0=$SECONDS
  "$PY" -m harness.cli list >"$OUT/list.txt" 2>&1 || return 1
  echo "attnbench list: $(( SECONDS - t0 )) s"
}

verdicts() {  # every GPU claims suite under one deadline and every claim judged, kernels at
  # their pinned defaults (exponents, not peak speeds: no autotuning on the lease's clock)
  ATTNBENCH_AUTOTUNE=off ATTNBENCH_TRITON_MISSES="$OUT/triton-misses/verdicts.jsonl" \
    "$PY" -m harness.cli verdicts --device cuda --out "$OUT/verdicts" \
    --minutes "$(awk -v c="$STEP_CAP" 'BEGIN { printf "%.2f", (c > 60 ? c - 30 : c / 2) / 60 }')"
}

tests() {  # tests NAME PYTEST-ARGS...: JUnit XML beside the log; exit 5 (none selected) is ok
  local name=$1; shift
  "$PY" -m pytest -q -rs "${PYTEST_OPTS[@]}" --junitxml="$OUT/$name.xml" "$@"
  local rc=$?
  [ $rc -eq 5 ] && return 0
  return $rc
}

kernel_sweep() {  # the fused kernels' configs beside the peers, within the step's cap; its
  # Triton compiles counted as the verdicts step's are (warm_cache.py warms them too)
  ATTNBENCH_TRITON_MISSES="$OUT/triton-misses/kernel-sweep.jsonl" \
    "$PY" "$ROOT/benchmarks/kernel_sweep.py" --out "$OUT/kernel-sweep" \
    --minutes "$(awk -v c="$STEP_CAP" 'BEGIN { print (c > 40 ? c - 10 : 30) / 60 }')"
}

rc=0
step setup "$(planned setup)" 10 setup || rc=1
# the verb stops itself at its --minutes (30 s under the cap) with its finished rows judged
step verdicts "$(planned verdicts)" 20 verdicts || rc=1
step tests-parallel "$(planned tests-parallel)" 15 \
  tests tests-parallel "${XDIST[@]}" "${PARALLEL[@]}" || rc=1
step tests-serial "$(planned tests-serial)" 10 tests tests-serial "${SERIAL[@]}" || rc=1
# the kernel sweep: whatever is left (its planned cap, or more when the steps before were
# quick), if that is worth starting (its configs compile first: 40 s at least)
left=$(( BUDGET - FINAL_RESERVE_S - 10 - $(date +%s) + START ))
if [ "$left" -ge 40 ]; then
  step kernel-sweep "$left" 10 kernel_sweep || rc=1
else  # by design at short budgets: the claims came first (not a failure)
  printf 'kernel-sweep\tskipped\t0\t%s\tless than 40 s left\n' "$(( left > 0 ? left : 0 ))" \
    >>"$OUT/steps.tsv"
  echo "proof: kernel-sweep skipped ($left s left; it needs 40)"
fi

"$PY" "$LEASE/summary.py" "$OUT" | tee "$OUT/summary.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
archive
if [ -n "$BESIDE" ]; then  # what a reader opens first, beside the archive (no sub-folders)
  html=$(ls "$OUT"/verdicts/*.html "$OUT"/verdicts/*/index.html 2>/dev/null | head -n 1)
  [ -n "$html" ] && cp -f "$html" "$BESIDE/report.html"
  for f in verdicts/verdicts.md summary.txt; do
    [ -f "$OUT/$f" ] && cp -f "$OUT/$f" "$BESIDE/$(basename "$f")"
  done
  # what the next lease can reuse: the launcher .so, autotune json, Inductor's cache
  timeout 60 "$PY" "$LEASE/warm_cache.py" --harvest "$BESIDE/triton-harvest.tar.gz" \
    >"$OUT/harvest.log" 2>&1 || echo "proof: harvest failed (harvest.log)"
  archive
fi
exit $rc
