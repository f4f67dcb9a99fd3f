#!/usr/bin/env bash
# Builds the CUDA build with the NCCL team, runs the one-GPU NCCL team test, the multi-GPU tests (one process per
# GPU) and the multi-process benchmark — one call on a machine with two or more GPUs. Logs and JSON go to $OUT
# (build.log tests.log bench.log bench.json).
#
# On the device machine (no network), from the repository root, with the Debian dev packages carried in .devdeps:
#   source .devdeps/unpack.sh && scripts/device/multi_gpu.sh [--no-tests] [--no-bench] [--quick] [--ranks N]
# NCCL: the system NCCL of the device image (2.28.3) rejects ncclDevCommCreate; the script builds and runs against
# PyTorch's copy (python3 -c "import nvidia.nccl; print(nvidia.nccl.__path__[0])") unless EVENEP_NCCL_ROOT is set.
# --quick benchmarks maxvio 1 and 20 only, with 10 iterations. TEST_TIMEOUT / BENCH_TIMEOUT bound the steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
BUILD=${BUILD:-build-mgpu}
JOBS=${JOBS:-$(nproc)}
TEST_TIMEOUT=${TEST_TIMEOUT:-500}    # seconds per test binary
BENCH_TIMEOUT=${BENCH_TIMEOUT:-540}  # seconds for the benchmark
mkdir -p "$OUT"
run_tests=1 run_bench=1 quick=0 ranks=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) run_tests=0 ;;
    --no-bench) run_bench=0 ;;
    --quick) quick=1 ;;
    --ranks) shift; ranks=$1 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
# NVLink multicast stays off everywhere (shared hosts): never unset these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NCCL_ROOT_DIR=${EVENEP_NCCL_ROOT:-$(python3 -c "import nvidia.nccl; print(nvidia.nccl.__path__[0])" 2>/dev/null)}
if [ -n "$NCCL_ROOT_DIR" ]; then export LD_LIBRARY_PATH="$NCCL_ROOT_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
# EVENEP_NCCL_INCLUDE: headers of the same NCCL version to use with that library when its prefix ships none.
nccl_args=()
if [ -n "${EVENEP_NCCL_INCLUDE:-}" ]; then
  nccl_args=(-DEVENEP_NCCL_INCLUDE_DIR="$EVENEP_NCCL_INCLUDE" -DEVENEP_NCCL_LIBRARY="$NCCL_ROOT_DIR/lib/libnccl.so.2")
elif [ -n "$NCCL_ROOT_DIR" ]; then
  nccl_args=(-DEVENEP_NCCL_ROOT="$NCCL_ROOT_DIR")
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
ranks=${ranks:-$(( gpus < 8 ? gpus : 8 ))}
status=0
t0=$(date +%s)

# ---- build ----
{
  nvidia-smi -L || true
  nvidia-smi topo -m || true
  echo "NCCL root: ${NCCL_ROOT_DIR:-<none>}"; ls "$NCCL_ROOT_DIR"/include "$NCCL_ROOT_DIR"/lib 2>/dev/null
  grep -m1 "define NCCL_VERSION_CODE" "$NCCL_ROOT_DIR/include/nccl.h" "${EVENEP_NCCL_INCLUDE:-/none}/nccl.h" 2>/dev/null
  strings "$NCCL_ROOT_DIR/lib/libnccl.so.2" 2>/dev/null | grep -m1 -E "^NCCL version [0-9]"
  cmake -S . -B "$BUILD" -G Ninja ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH=$DEPS_PREFIX} -DCMAKE_BUILD_TYPE=Release \
    -DEVENEP_WERROR=${EVENEP_WERROR:-OFF} -DCMAKE_CUDA_ARCHITECTURES=90a -DEVENEP_BUILD_BENCH=OFF \
    -DEVENEP_BUILD_EXAMPLES=OFF -DEVENEP_NCCL=ON "${nccl_args[@]}" &&
  cmake --build "$BUILD" -j "$JOBS" --target evenep nccl_team_test nccl_ep_test
} > "$OUT/build.log" 2>&1
build_rc=$?
echo "build rc=$build_rc ($(( $(date +%s) - t0 )) s), $gpus GPUs, $ranks ranks"
grep -E "EvenEP:" "$OUT/build.log"
if [ $build_rc -ne 0 ]; then tail -60 "$OUT/build.log"; exit 1; fi

# ---- tests: the one-rank communicator, then the multi-GPU cases (each re-runs itself as $ranks processes) ----
if [ $run_tests -eq 1 ]; then
  : > "$OUT/tests.log"
  for t in nccl_team_test nccl_ep_test; do
    echo "=== $t" >> "$OUT/tests.log"
    EVENEP_MGPU_RANKS=$ranks timeout "$TEST_TIMEOUT" "$BUILD/tests/$t" >> "$OUT/tests.log" 2>&1
    rc=$?
    echo "=== $t rc=$rc" >> "$OUT/tests.log"
    [ $rc -ne 0 ] && status=1
  done
  echo "tests ($(( $(date +%s) - t0 )) s):"
  grep -E "^=== |^\[  PASSED|^\[  FAILED|^\[  SKIPPED \] [0-9]|tests ran|expected error" "$OUT/tests.log" | head -40
  grep -E "^\[  FAILED  \] .*\.|Failure|error:" "$OUT/tests.log" | head -20
fi

# ---- benchmark: the MoonEP point scaled to $ranks ranks (E = 48 * ranks) ----
if [ $run_bench -eq 1 ] && [ "$ranks" -ge 2 ]; then
  extra=()
  [ $quick -eq 1 ] && extra=(--maxvio 1 20 --iters 10)
  timeout "$BENCH_TIMEOUT" "$BUILD/tools/evenep/evenep" launch -n "$ranks" --timeout $(( BENCH_TIMEOUT - 10 )) -- \
    "$BUILD/tools/evenep/evenep" bench multi --check --json "$OUT/bench.json" "${extra[@]}" > "$OUT/bench.log" 2>&1 ||
    status=1
  echo "bench ($(( $(date +%s) - t0 )) s):"
  cat "$OUT/bench.log" | tail -60
fi
echo "done in $(( $(date +%s) - t0 )) s, status $status"
exit $status
