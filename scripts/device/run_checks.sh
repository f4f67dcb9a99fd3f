#!/usr/bin/env bash
# The GPU checks in one device call, from one build tree: the C++ GPU tests and the Python suite (GPU tests
# included), each source compiled once. Configures $BUILD (default build-gpu: Release, sm_90a, NCCL off, CUTLASS
# as $CUTLASS, default OFF) with the Python extension, builds the `evenep` CLI (test_trace replays with it), the
# extension and the test binaries $TESTS, runs each binary (--gtest_brief=1), copies the extension next to the
# package sources and runs `pytest -m "not slow" tests/python` with PYTHONPATH=python (the preinstalled torch).
# Logs in $OUT: build.log, t_<binary>.log, pytest.log, and all of them in logs.tgz (the device returns 8 files).
#
# On the device machine, from the repository root:
#   source .devdeps/unpack.sh && scripts/device/run_checks.sh
# Environment: BUILD, CUTLASS (ON needs .deps carried), CANDIDATES (ON: also the CUTLASS tuning candidates), NCCL (ON: the NCCL team against torch's NCCL, so that
# tests/python/test_group.py runs), TESTS (space-separated binaries), PYTESTS (pytest paths),
# BUDGET (seconds for the whole script, default 585), TEST_TIMEOUT (seconds per binary, default 90), GTEST_FILTER
# (given to every binary, e.g. -*_mma* to leave out the portable GEMM kernel's slow cases).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
t0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONDONTWRITEBYTECODE=1
nccl_root=$(python3 -c "import nvidia.nccl; print(nvidia.nccl.__path__[0])" 2>/dev/null)
[ -n "$nccl_root" ] && export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=${BUILD:-build-gpu}
T="${TESTS:-gpu_expert_ops_test gpu_fp8_experts_test gpu_datapath_test gpu_backward_test gpu_fp8_dispatch_test gpu_moe_layer_test gpu_experts_test gpu_planner_test fp8_cast_test}"
{
  cmake -S . -B "$B" -G Ninja ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH=$DEPS_PREFIX} -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DEVENEP_NCCL="${NCCL:-OFF}" -DEVENEP_BUILD_BENCH=OFF -DEVENEP_BUILD_EXAMPLES=OFF \
    -DEVENEP_CUTLASS="${CUTLASS:-OFF}" -DEVENEP_CUTLASS_CANDIDATES="${CANDIDATES:-OFF}" -DEVENEP_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$(command -v python3)" &&
  cmake --build "$B" -j "$(nproc)" --target evenep evenep_python $T
} > "$OUT/build.log" 2>&1 || tail -40 "$OUT/build.log"
echo "build $(( $(date +%s) - t0 )) s"
find "$B" -name "_C*.so" -exec cp {} python/evenep/ \;
status=0
for t in $T; do
  f=$(find "$B/tests" -name "$t" -type f | head -1)
  timeout "${TEST_TIMEOUT:-90}" "$f" --gtest_brief=1 ${GTEST_FILTER:+"--gtest_filter=$GTEST_FILTER"} > "$OUT/t_$t.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "$t rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/t_$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" "$OUT/t_$t.log" | head -5
done
echo "C++ GPU tests done $(( $(date +%s) - t0 )) s"
left=$(( ${BUDGET:-585} - ($(date +%s) - t0) ))
PYTHONPATH=$PWD/python timeout "$left" python3 -m pytest -p no:cacheprovider -q -rs -m "not slow" \
  ${PYTESTS:-tests/python} > "$OUT/pytest.log" 2>&1
rc=$?
[ $rc -ne 0 ] && status=1
echo "pytest rc=$rc $(( $(date +%s) - t0 )) s"
grep -E "passed|failed" "$OUT/pytest.log" | tail -2
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) 2>/dev/null
exit $status
