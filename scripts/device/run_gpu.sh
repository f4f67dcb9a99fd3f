#!/usr/bin/env bash
# Builds the CUDA build, runs every GPU test, the sanitizers on a small configuration and the GPU benchmarks with
# their anchors (copy bandwidth, PyTorch) — one call on the device machine. Logs and JSON go to $OUT (at most 8
# files: build.log tests.log sanitizer.log bench.log bench.json torch.json summary.md).
#
# On the device machine (no network), from the repository root, with the Debian dev packages carried in .devdeps:
#   source .devdeps/unpack.sh && scripts/device/run_gpu.sh [--no-tests] [--no-sanitizer] [--no-bench] [--quick]
# --quick runs the benchmarks at the MoonEP point only, maxvio 1 and 20.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
run_tests=1 run_sanitizer=1 run_bench=1 quick=0
for a in "$@"; do
  case "$a" in
    --no-tests) run_tests=0 ;;
    --no-sanitizer) run_sanitizer=0 ;;
    --no-bench) run_bench=0 ;;
    --quick) quick=1 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
status=0
t0=$(date +%s)

# ---- build ----
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv || true
  nvcc --version | tail -2
  cmake --version | head -1
  cmake -S . -B "$BUILD" -G Ninja ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH=$DEPS_PREFIX} -DCMAKE_BUILD_TYPE=Release \
    -DEVENEP_WERROR=${EVENEP_WERROR:-OFF} -DCMAKE_CUDA_ARCHITECTURES=90a -DEVENEP_NCCL=OFF -DEVENEP_BUILD_BENCH=OFF -DEVENEP_BUILD_EXAMPLES=OFF &&
  cmake --build "$BUILD" -j "$JOBS" --target evenep gpu_team_test gpu_planner_test gpu_datapath_test gpu_experts_test \
    gpu_backward_test grouped_gemm_test gpu_moe_layer_test cpu_demo_test
} > "$OUT/build.log" 2>&1
build_rc=$?
echo "build rc=$build_rc ($(( $(date +%s) - t0 )) s)"
if [ $build_rc -ne 0 ]; then tail -60 "$OUT/build.log"; exit 1; fi

# ---- GPU tests: every binary, one process each (gtest summary lines give the counts) ----
if [ $run_tests -eq 1 ]; then
  : > "$OUT/tests.log"
  for t in gpu_team_test gpu_planner_test gpu_experts_test gpu_datapath_test gpu_backward_test grouped_gemm_test \
           gpu_moe_layer_test cpu_demo_test; do
    echo "=== $t" >> "$OUT/tests.log"
    timeout 420 "$BUILD/tests/$t" --gtest_brief=1 >> "$OUT/tests.log" 2>&1
    rc=$?
    echo "=== $t rc=$rc" >> "$OUT/tests.log"
    [ $rc -ne 0 ] && status=1
  done
  echo "tests ($(( $(date +%s) - t0 )) s):"
  grep -E "^=== |PASSED|FAILED|SKIPPED \]|tests ran" "$OUT/tests.log" | grep -vE "^\[  FAILED  \] .*\..*" | head -40
  grep -E "^\[  FAILED  \] .*\." "$OUT/tests.log" | head -20
fi

# ---- sanitizers on a small configuration ----
if [ $run_sanitizer -eq 1 ]; then
  : > "$OUT/sanitizer.log"
  small_dp='Routings/DatapathTest.MatchesOracle/R4E32K4tp8_lognormal_sigma2:Routings/DatapathTest.MatchesOracle/R2E8K6tp128_masked'
  for tool in memcheck racecheck; do
    for spec in "gpu_datapath_test:$small_dp" "gpu_team_test:Ranks/BarrierTest.OrdersWritesAcrossRanks/R8_budget1" \
                "gpu_experts_test:Shapes/ExpertsTest.PrefetchAndReduce/R4_E16_P3_small" \
                "gpu_planner_test:Routings/FusedPlanTest.FusedPathMatchesCpu/lognormal_sigma2" \
                "grouped_gemm_test:Shapes/GroupedGemmTest.MatchesReference/ragged_in200_out72_fwd_bf16_loadaware:Shapes/GroupedGemmTest.MatchesReference/empty_dgrad_f32_fixed:Shapes/GroupedWgradTest.MatchesReference/skewed_in264_out392_loadaware" \
                "gpu_moe_layer_test:GpuMoeLayer/MatchesCpu.ForwardBackward/R4_E16_K4_H128_masked_optimized"; do
      bin=${spec%%:*} filter=${spec#*:}
      echo "=== $tool $bin $filter" >> "$OUT/sanitizer.log"
      timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 99 "$BUILD/tests/$bin" --gtest_filter="$filter" \
        --gtest_brief=1 >> "$OUT/sanitizer.log" 2>&1
      rc=$?
      echo "=== $tool $bin rc=$rc" >> "$OUT/sanitizer.log"
      [ $rc -ne 0 ] && status=1
    done
  done
  echo "sanitizers ($(( $(date +%s) - t0 )) s):"
  grep -E "^=== .* rc=|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitizer.log"
fi

# ---- benchmarks + anchors ----
if [ $run_bench -eq 1 ]; then
  npy=/tmp/evenep-npy
  mkdir -p "$npy"
  if [ $quick -eq 1 ]; then
    "$BUILD/tools/evenep/evenep" bench gpu-suite --check --maxvio 1 20 --json "$OUT/bench.json" --npy-dir "$npy" \
      > "$OUT/bench.log" 2>&1 || status=1
  else
    "$BUILD/tools/evenep/evenep" bench gpu-suite --check --json "$OUT/bench.json" --npy-dir "$npy" \
      > "$OUT/bench.log" 2>&1 || status=1
  fi
  # Planner time at the K3 shape with R=64 (one rank's plan; no rows).
  "$BUILD/tools/evenep/evenep" bench gpu-plan --R 64 --E 896 --K 16 --S 8192 --check --maxvio 1 20 \
    >> "$OUT/bench.log" 2>&1 || status=1
  echo "bench ($(( $(date +%s) - t0 )) s)"
  PYTHONUNBUFFERED=1 python3 scripts/device/torch_anchor.py --npy-dir "$npy" --json "$OUT/torch.json" \
    >> "$OUT/bench.log" 2>&1 || status=1
  python3 scripts/device/summarize.py "$OUT/bench.json" "$OUT/torch.json" > "$OUT/summary.md" 2>&1 || status=1
  cat "$OUT/summary.md"
  grep -E "^evenep: error|Traceback|Error" "$OUT/bench.log" | head -10
fi
echo "done in $(( $(date +%s) - t0 )) s, status $status"
exit $status
