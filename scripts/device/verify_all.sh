#!/usr/bin/env bash
# The whole tree on one GPU in one device call (at most ~600 s): an NCCL-ON build (torch's NCCL) of the library, the
# CLI and every one-GPU test binary; the tests (the NCCL team on one rank included); memcheck and racecheck on the
# fused planner; `bench gpu-plan` at the MoonEP point and the K3 shape for R = 8 … 224, `bench prefetch|reduce`;
# then scripts/device/run_python.sh (package, torchrun one-process group= check, pytest, benchmarks) with the time
# that is left. Logs: $OUT/cpp.tgz (build, tests, sanitizers, benches + JSON) and run_python.sh's files.
#
# On the device machine, from the repository root, with the Debian dev packages carried in .devdeps:
#   source .devdeps/unpack.sh && scripts/device/verify_all.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s); el() { echo "$(( $(date +%s) - t0 ))s"; }
NR=$(python3 -c "import nvidia.nccl; print(nvidia.nccl.__path__[0])")
export LD_LIBRARY_PATH="$NR/lib:${LD_LIBRARY_PATH:-}"
B=build-fin
cmake -S . -B $B -G Ninja ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH=$DEPS_PREFIX} -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DEVENEP_NCCL=ON -DEVENEP_NCCL_ROOT=$NR -DEVENEP_BUILD_BENCH=OFF -DEVENEP_BUILD_EXAMPLES=OFF > $OUT/build.log 2>&1 &&
  cmake --build $B -j16 --target evenep gpu_team_test gpu_planner_test gpu_datapath_test gpu_experts_test \
    gpu_backward_test gpu_moe_layer_test nccl_team_test cpu_demo_test cli_input_test window_registry_test >> $OUT/build.log 2>&1 \
  || { grep -E "error" -A3 $OUT/build.log | head -40; exit 1; }
echo "build $(el)"
: > $OUT/tests.log
for t in gpu_planner_test gpu_team_test gpu_datapath_test gpu_experts_test gpu_backward_test gpu_moe_layer_test nccl_team_test cpu_demo_test cli_input_test; do
  echo "=== $t" >> $OUT/tests.log; timeout 200 $B/tests/$t --gtest_brief=1 >> $OUT/tests.log 2>&1; echo "=== $t rc=$?" >> $OUT/tests.log
done
echo "tests $(el)"; grep -E "^=== .*rc=|PASSED|FAILED|SKIPPED \] [0-9]" $OUT/tests.log
grep -E "^\[  FAILED  \] .*\.|Failure" $OUT/tests.log | head -20
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 99 $B/tests/gpu_planner_test \
    --gtest_filter='Routings/FusedPlanTest.FusedPathMatchesCpu/lognormal_sigma2' --gtest_brief=1 > $OUT/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" $OUT/san_$tool.log)"
done
E=$B/tools/evenep/evenep
{
$E bench gpu-plan --R 8 --E 384 --K 8 --maxvio 0.2 1 10 20 --check --json $OUT/plan8.json
$E bench prefetch --maxvio 1 --check; $E bench reduce --maxvio 1 --check
for R in 8 16 32 56 64 112 128 224; do
  timeout 60 $E bench gpu-plan --R $R --E 896 --K 16 --S 8192 --H 256 --ffn-hidden 256 --maxvio 0.2 1 10 20 --warmup 2 --iters 5 \
    --json $OUT/plan$R.json
done
} > $OUT/bench.log 2>&1; echo "bench $(el)"
grep -E "^plan_rank |^plan_fused |^prefetch|^reduce|wrong|projection" $OUT/bench.log | cut -c1-200 | head -30
cd $OUT && tar czf cpp.tgz *.log *.json && rm -f *.log *.json && cd - > /dev/null
left=$(( 585 - $(date +%s) + t0 ))
echo "python budget ${left}s"
BUDGET_S=$left scripts/device/run_python.sh ${PYARGS:-}
echo "done $(el)"
