#!/usr/bin/env bash
# Grouped GEMM (issues 5, 34) in one device call: build grouped_gemm_test, grouped_gemm_fp8_test and evenep, run the
# GPU tests, `evenep bench gemm` and the PyTorch anchors (scripts/device/gemm_anchor.py) on the same offsets. Logs
# go to $OUT: build.log gemm_test.log gemm_fp8_test.log gemm_bench.log gemm_bench.json gemm_offsets.json
# gemm_anchor.json gemm_anchor.log.
#
# The CUTLASS kernels (issue 34) are built when the pinned headers are in .deps/ (scripts/fetch-cutlass.sh; the
# device machine has no network: carry .deps with .devdeps); the bench then has their rows (--kernels).
# CANDIDATES=ON also builds the CUTLASS tuning candidates (EVENEP_CUTLASS_CANDIDATES: the FP8 wgrad, bench op
# fp8_wgrad), which the tests and the bench then cover.
# On the device machine, from the repository root, with the Debian dev packages carried in .devdeps:
#   source .devdeps/unpack.sh && scripts/device/run_gemm.sh [--no-bench] [--no-test] [--calibrate]
#                                                          [extra `evenep bench gemm` args...]
# --calibrate also fits the scheduler's cost model (`evenep bench gemm --calibrate`) and writes
# $OUT/gemm_cost_model.inc (copy it to src/cuda/kernels/ to check it in) and $OUT/gemm_calibration.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
run_bench=1
run_test=1
calibrate=0
bench_args=()
for a in "$@"; do
  case "$a" in
    --no-bench) run_bench=0 ;;
    --no-test) run_test=0 ;;
    --calibrate) calibrate=1 ;;
    *) bench_args+=("$a") ;;
  esac
done
status=0
t0=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv || true
  cmake -S . -B "$BUILD" -G Ninja ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH=$DEPS_PREFIX} -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DEVENEP_NCCL=OFF -DEVENEP_BUILD_BENCH=OFF -DEVENEP_BUILD_EXAMPLES=OFF \
    -DEVENEP_CUTLASS_CANDIDATES="${CANDIDATES:-OFF}" &&
  cmake --build "$BUILD" -j "$JOBS" --target grouped_gemm_test grouped_gemm_fp8_test evenep
} > "$OUT/build.log" 2>&1
grep -E "EvenEP: CUTLASS" "$OUT/build.log"
rc=$?
echo "build rc=$rc ($(( $(date +%s) - t0 )) s)"
if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; exit 1; fi

if [ $run_test -eq 1 ]; then
  timeout 300 "$BUILD/tests/grouped_gemm_test" --gtest_brief=1 > "$OUT/gemm_test.log" 2>&1 || status=1
  timeout 120 "$BUILD/tests/grouped_gemm_fp8_test" --gtest_brief=1 > "$OUT/gemm_fp8_test.log" 2>&1 || status=1
  echo "test ($(( $(date +%s) - t0 )) s):"
  grep -E "PASSED|FAILED|SKIPPED \]|tests ran|Failure|got" "$OUT/gemm_test.log" "$OUT/gemm_fp8_test.log" | head -40
fi

if [ $calibrate -eq 1 ]; then
  timeout 300 "$BUILD/tools/evenep/evenep" bench gemm --calibrate --write-model "$OUT/gemm_cost_model.inc" \
    --json "$OUT/gemm_calibration.json" > "$OUT/gemm_calibration.log" 2>&1 || status=1
  echo "calibration ($(( $(date +%s) - t0 )) s):"
  cat "$OUT/gemm_calibration.log"
fi

if [ $run_bench -eq 1 ]; then
  "$BUILD/tools/evenep/evenep" bench gemm --check --json "$OUT/gemm_bench.json" \
    --offsets-json "$OUT/gemm_offsets.json" "${bench_args[@]}" > "$OUT/gemm_bench.log" 2>&1 || status=1
  echo "bench ($(( $(date +%s) - t0 )) s)"
  cat "$OUT/gemm_bench.log"
  if [ -f "$OUT/gemm_offsets.json" ] && [ -f "$OUT/gemm_bench.json" ]; then
    PYTHONUNBUFFERED=1 timeout 300 python3 scripts/device/gemm_anchor.py --offsets "$OUT/gemm_offsets.json" \
      --evenep "$OUT/gemm_bench.json" --json "$OUT/gemm_anchor.json" > "$OUT/gemm_anchor.log" 2>&1 || status=1
    echo "anchor ($(( $(date +%s) - t0 )) s)"
    sed -n '/^dist /,$p' "$OUT/gemm_anchor.log"
    grep -E "Traceback|Error" "$OUT/gemm_anchor.log" | head -5
  fi
fi
echo "done in $(( $(date +%s) - t0 )) s, status $status"
exit $status
