#!/usr/bin/env bash
# The CUTLASS group scheduler's raster order, measured (EVENEP_CUTLASS_RASTER=m|n; grouped_gemm_cutlass.hpp, launch):
# builds the CLI and grouped_gemm_test (CUTLASS on), runs the CUTLASS cases of grouped_gemm_test with the N-fastest
# order (the results must not change: every tile is computed the same way, only the order differs), then the bf16
# GEMM rows at the K3-like point (R = 64: the rows where the hand-written kernel beat CUTLASS's M-fastest order by
# 3.6-10.7%, docs/benchmarks.md) and the MoonEP point with both orders (the hand-written kernel beside the M-fastest
# run). Fits one short device call (~270 s from a cold machine); summary.txt, logs and JSON in $OUT.
#
# On the device machine, from the repository root (carry .devdeps and .deps):
#   source .devdeps/unpack.sh && scripts/device/cutlass_raster.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/summary.txt") 2>&1
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
B=build-gpu
cmake -S . -B "$B" -G Ninja ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH=$DEPS_PREFIX} -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DEVENEP_NCCL=OFF -DEVENEP_BUILD_BENCH=OFF -DEVENEP_BUILD_EXAMPLES=OFF \
  -DEVENEP_CUTLASS=ON -DEVENEP_CUTLASS_CANDIDATES=OFF -DEVENEP_BUILD_PYTHON=OFF > "$OUT/cfg.log" 2>&1 || tail -20 "$OUT/cfg.log"
cmake --build "$B" -j "$(nproc)" --target evenep grouped_gemm_test > "$OUT/build.log" 2>&1 || tail -30 "$OUT/build.log"
echo "build $(el) s"
E=$B/tools/evenep/evenep
EVENEP_CUTLASS_RASTER=n timeout 40 $B/tests/grouped_gemm_test --gtest_brief=1 --gtest_filter='*cutlass*' > "$OUT/t.log" 2>&1
echo "test (raster n) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/t.log" | tr '\n' ' ') ($(el) s)"
K3="--R 64 --E 896 --K 16 --H 3584 --maxvio 0.2 20 --zipf 0"
MOON="--maxvio 0.2 20 --zipf 1.0"
for pt in k3 moon; do
  [ $pt = k3 ] && args=$K3 || args=$MOON
  for r in m n; do
    [ $r = m ] && ks="wgmma cutlass" || ks="cutlass"
    left=$(( 275 - $(el) )); [ $left -lt 5 ] && break 2
    EVENEP_CUTLASS_RASTER=$r timeout $left $E bench gemm $args --ops fwd dgrad wgrad --kernels $ks --iters 5 \
      --json "$OUT/${pt}_$r.json" > "$OUT/${pt}_$r.log" 2>&1
    echo "== $pt raster $r rc=$? ($(el) s)"
    grep -E "load_aware" "$OUT/${pt}_$r.log" | awk '{print $1, $2, $3, $4, $7}'
  done
done
