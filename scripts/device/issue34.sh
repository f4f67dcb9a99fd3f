#!/usr/bin/env bash
# Issue 34's tables in one device call (docs/benchmarks.md "CUTLASS kernels and FP8" and "The FP8 layer"; docs/fp8.md):
#   1. build the `evenep` CLI, the Python extension and the GEMM and layer tests (CUTLASS on, the tuning candidates
#      for the anchors and `fp8_wgrad`), run them, each binary in 8 gtest shards at once (the host references are
#      the slow part);
#   2. the GEMM table: `evenep bench gemm` at the MoonEP point (the planner's rows at maxvio 0.2 and 20, Zipf 1.0)
#      and the K3-like point (R = 64), bf16 fwd/dgrad/wgrad (and wgrad_set: dW = x^T dy written without reading,
#      the like-for-like row for torch._grouped_mm's fresh output) with the hand-written and CUTLASS kernels, FP8
#      fwd/dgrad (block-scaled with CUTLASS's and with EvenEP's overlapped consumer loop, and CUTLASS's unscaled
#      anchor), the fp32-output dgrad (the layer's) and the FP8 wgrad, then torch._grouped_mm and dense on the same
#      offsets (gemm_anchor.py);
#   3. the CUTLASS raster order: the CUTLASS rows of step 2 again with the order the rule does not pick
#      (EVENEP_CUTLASS_RASTER=m at the K3 point, where the rule walks N-fastest; =n at the MoonEP point), side by
#      side; then the wgrad with four micro-batches' rows in one call (S x 4: the deferred-wgrad measurement);
#   4. the FP8 layer table: `bench layer --fp8` at both points, maxvio 0.2 and 20, M = 4 micro-batches a step;
#   5. the dispatch, bf16 and FP8, at the MoonEP point;
#   6. accuracy: `evenep demo --fp8 --backend cuda` and the 200-step `train_moe.py --compare-fp8` on CUDA;
#   7. prof: ncu's speed-of-light, compute and memory sections of the FP8 dgrad kernels (both consumer loops and the
#      unscaled anchor) at the MoonEP point.
# Each step gets what is left of BUDGET seconds (default 570) and is skipped when too little is left; summary.txt
# holds every table, logs.tgz the logs and JSON (the device returns 8 files).
#
# On the device machine, from the repository root (carry .devdeps and .deps):
#   source .devdeps/unpack.sh && scripts/device/issue34.sh
# Environment: BUILD (default build-gpu), BUDGET, SKIP (space-separated step names to skip: tests gemm k3 raster
# defer layer dispatch accuracy prof; without accuracy the Python extension is not built), OPS (the bench gemm ops of
# the gemm and k3 steps instead of all of them), ANCHOR_OPS (the ops the torch anchors time; default the bf16 ones
# among OPS but dgrad_f32), TESTS (the test binaries of step 1), RASTER_PTS (the points of the raster step, default
# "k3 gemm"), MOON_ROWS (the row sets of the gemm step, default "--maxvio 0.2 20 --zipf 1.0"), NCCL (ON: the NCCL
# team too, against torch's NCCL, so that run_checks.sh with the same settings reuses the build).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-$PWD/device-out}
L=$OUT/logs
mkdir -p "$L"
exec > >(tee "$OUT/summary.txt") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONDONTWRITEBYTECODE=1
nccl_root=$(python3 -c "import nvidia.nccl; print(nvidia.nccl.__path__[0])" 2>/dev/null)
[ -n "$nccl_root" ] && export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
BUDGET=${BUDGET:-570}
# left N: N seconds, or what is left of the budget when that is less (at least 1)
left() { local l=$(( BUDGET - $(el) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 1 ? l : 1 )); }
# want STEP NEED: the step is not skipped and NEED seconds are left
want() { [[ " ${SKIP:-} " != *" $1 "* ]] && [ $(( BUDGET - $(el) )) -ge $2 ]; }
B=${BUILD:-build-gpu}
E=$B/tools/evenep/evenep
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
T=${TESTS-grouped_gemm_test grouped_gemm_fp8_test gpu_moe_layer_test gpu_moe_layer_fp8_test perf_rank_compute_test}
PY=evenep_python  # the Python extension: only the accuracy step's train_moe.py needs it
[[ " ${SKIP:-} " == *" accuracy "* ]] && PY=
{
  cmake -S . -B "$B" -G Ninja ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH=$DEPS_PREFIX} -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DEVENEP_NCCL="${NCCL:-OFF}" -DEVENEP_BUILD_BENCH=OFF -DEVENEP_BUILD_EXAMPLES=OFF \
    -DEVENEP_CUTLASS=ON -DEVENEP_CUTLASS_CANDIDATES=ON -DEVENEP_BUILD_PYTHON=ON \
    "-DPython_EXECUTABLE=$(command -v python3)" &&
  cmake --build "$B" -j "$(nproc)" --target evenep $PY $T
} > "$L/build.log" 2>&1 || { tail -40 "$L/build.log"; exit 1; }
grep -E "EvenEP: CUTLASS" "$L/build.log"
echo "build $(el) s"
find "$B" -name "_C*.so" -exec cp {} python/evenep/ \;

if want tests 60; then
  for t in $T; do
    tl=$(left 150)
    rc=0
    for i in 0 1 2 3 4 5 6 7; do
      GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout "$tl" "$B/tests/$t" --gtest_brief=1 > "$L/t_${t}_$i.log" 2>&1 &
    done
    for j in $(jobs -p); do wait "$j" || rc=$?; done
    cat "$L"/t_"${t}"_?.log > "$L/t_$t.log"
    n() { grep -hE "^\[  $1 *\] [0-9]+ test" "$L/t_$t.log" | awk '{s += $4} END {print s + 0}'; }
    echo "$t rc=$rc passed $(n PASSED) failed $(n FAILED) skipped $(n SKIPPED) ($(el) s)"
    grep -E "^\[  FAILED  \]" "$L/t_$t.log" | head -8
    # A failing (or hanging) FP8 GEMM would only burn the rest of the call in the FP8 benchmarks: leave them out.
    if [ "$t" = grouped_gemm_fp8_test ] && [ $rc -ne 0 ]; then
      echo "FP8 GEMM test failed: the fp8 ops and the FP8 layer are skipped"
      OPS=$(for o in ${OPS:-fwd dgrad wgrad wgrad_set}; do [[ $o == fp8_* ]] || echo -n "$o "; done)
      SKIP="${SKIP:-} layer"
    fi
  done
fi

# The torch anchors time the bf16 ops among OPS (ANCHOR_OPS, even empty, overrides).
AOPS=$(for o in ${OPS:-fwd dgrad wgrad wgrad_set}; do [[ $o == fp8_* || $o == dgrad_f32 ]] || echo -n "$o "; done)
AOPS=${ANCHOR_OPS-$AOPS}
# gemm NAME NEED ARGS...: one bench gemm row set and its torch anchors
gemm() {
  local name=$1 need=$2
  shift 2
  want "$name" "$need" || { echo "== $name skipped ($(el) s)"; return; }
  echo "== gemm $name ($(el) s)"
  timeout "$(left 150)" "$E" bench gemm "$@" --iters 10 --json "$L/$name.json" --offsets-json "$L/${name}_off.json" \
    > "$L/$name.log" 2>&1
  echo "bench rc=$? ($(el) s)"
  timeout "$(left 120)" python3 scripts/device/gemm_anchor.py --offsets "$L/${name}_off.json" --evenep "$L/$name.json" \
    --ops $AOPS --json "$L/${name}_anchor.json" > "$L/${name}_anchor.log" 2>&1
  echo "anchor rc=$? ($(el) s)"
  sed -n '/^dist /,$p' "$L/${name}_anchor.log"
}
gemm gemm 150 ${MOON_ROWS:---maxvio 0.2 20 --zipf 1.0} \
  --ops ${OPS:-fwd dgrad dgrad_f32 wgrad wgrad_set fp8_fwd fp8_dgrad fp8_wgrad} --kernels wgmma cutlass --check
gemm k3 60 --R 64 --E 896 --K 16 --H 3584 --maxvio 0.2 20 --zipf 0 \
  --ops ${OPS:-fwd dgrad dgrad_f32 wgrad wgrad_set fp8_fwd fp8_dgrad} --kernels wgmma cutlass
# dgrad_f32 (the layer's dgrads: fp32 output), hand-written against CUTLASS, from the two steps' JSON
for pt in gemm k3; do
  [ -f "$L/$pt.json" ] && python3 - "$L/$pt.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["op"] == "dgrad_f32" and "load_aware" in r["schedule"]]
t = {(r["dist"], r["proj"], r["schedule"]): r["tflops"] for r in rows}
for d, p in sorted({(r["dist"], r["proj"]) for r in rows}):
    w, c = t.get((d, p, "wgmma/load_aware"), float("nan")), t.get((d, p, "cutlass/load_aware"), float("nan"))
    print(f"dgrad_f32 {d:<20} {p:<8} wgmma {w:7.1f} cutlass {c:7.1f} cutlass/wgmma {c / w:5.2f}")
PY
done

# The CUTLASS group scheduler's raster order (GemmKernel in include/evenep/cuda/grouped_gemm.hpp: N-fastest where
# the rows per group outnumber the output's columns, so at the K3 point; M-fastest at the MoonEP point): the CUTLASS
# rows of the gemm / k3 steps again with the other order forced (EVENEP_CUTLASS_RASTER), printed side by side.
for pt in ${RASTER_PTS:-k3 gemm}; do
  want raster 40 || break
  if [ $pt = k3 ]; then
    args="--R 64 --E 896 --K 16 --H 3584 --maxvio 0.2 20 --zipf 0" order=m
  else
    args="--maxvio 0.2 20 --zipf 1.0" order=n
  fi
  echo "== CUTLASS raster forced to $order at $pt ($(el) s)"
  EVENEP_CUTLASS_RASTER=$order timeout "$(left 90)" "$E" bench gemm $args --ops fwd dgrad dgrad_f32 fp8_fwd fp8_dgrad \
    --kernels cutlass --iters 10 --json "$L/${pt}_raster_$order.json" > "$L/${pt}_raster_$order.log" 2>&1
  echo "bench $pt raster $order rc=$? ($(el) s)"
  python3 - "$L/$pt.json" "$L/${pt}_raster_$order.json" <<'PY'
import json, sys
def rows(f):
    try:
        return {(r["dist"], r["proj"], r["op"], r["schedule"]): r["tflops"] for r in json.load(open(f))["rows"]
                if r["schedule"].startswith("cutlass") and r["schedule"].endswith("load_aware")}
    except (OSError, ValueError, KeyError):
        return {}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
print(f"{'dist':<20} {'proj':<8} {'op':<9} {'kernel':<32} {'rule':>7} {'forced':>7} {'rule/f':>6}")
for k in sorted(b):
    x = a.get(k, float("nan"))
    print(f"{k[0]:<20} {k[1]:<8} {k[2]:<9} {k[3]:<32} {x:7.1f} {b[k]:7.1f} {x / b[k]:6.2f}")
PY
done

if want defer 30; then
  echo "== wgrad over four micro-batches' rows (S x 4) ($(el) s)"
  timeout "$(left 90)" "$E" bench gemm --S 32768 --maxvio 0.2 --zipf 0 --ops wgrad fp8_wgrad --kernels wgmma cutlass \
    --iters 5 --json "$L/defer.json" > "$L/defer.log" 2>&1
  echo "defer rc=$? ($(el) s)"
  grep -E "wgrad" "$L/defer.log"
fi

if want layer 100; then
  echo "== FP8 layer ($(el) s)"
  timeout "$(left 240)" "$E" bench layer --fp8 --points moonep k3 --k3-R 64 --maxvio 0.2 20 --micro-batches 4 \
    --json "$L/layer.json" > "$L/layer.log" 2>&1
  echo "layer rc=$? ($(el) s)"
  sed -n '/^shape/,$p' "$L/layer.log"
fi

if want dispatch 20; then
  for f in "" --fp8; do
    echo "== dispatch $f ($(el) s)"
    timeout "$(left 60)" "$E" bench dispatch --R 8 --E 384 --K 8 --S 8192 --H 7168 --ffn-hidden 2048 --tp 128 \
      --policy exact --iters 10 --maxvio 1 $f > "$L/dispatch$f.log" 2>&1
    echo "dispatch rc=$? ($(el) s)"
    grep -E "^(op|copy|dispatch)" "$L/dispatch$f.log"
  done
fi

if want accuracy 40; then
  echo "== demo --fp8 --backend cuda ($(el) s)"
  timeout "$(left 120)" "$E" demo --fp8 --backend cuda > "$L/demo_fp8.log" 2>&1
  echo "demo rc=$? ($(el) s)"
  grep -iE "fp8|rel|PASS|FAIL" "$L/demo_fp8.log" | head -20
  echo "== train_moe --compare-fp8 on CUDA ($(el) s)"
  PYTHONPATH=$PWD/python timeout "$(left 150)" python3 examples/train_moe.py --compare-fp8 --device cuda --hidden 128 \
    --ffn 256 --steps 200 --quiet > "$L/train.log" 2>&1
  echo "train rc=$? ($(el) s)"
  tail -2 "$L/train.log"
fi
# Where the FP8 block-scaled kernel's time goes: ncu's speed-of-light, compute and memory sections for CUTLASS's and
# EvenEP's consumer loop and the unscaled anchor, at the MoonEP point's dgrad (gate_up: N = 7168, where EvenEP's loop
# wins; down: N = 2048, where it does not). Kernels are CUTLASS's device_kernel launches in bench gemm's order, the first
# one the warm-up call.
if want prof 60 && command -v ncu > /dev/null; then
  echo "== ncu: FP8 dgrad kernels ($(el) s)"
  timeout "$(left 120)" ncu -k regex:device_kernel --launch-count 7 --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis "$E" bench gemm --maxvio 0.2 --zipf 0 \
    --ops fp8_dgrad --iters 1 --warmup 0 --warm-seconds 0 > "$L/ncu_fp8.log" 2>&1
  echo "ncu rc=$? ($(el) s)"
  grep -E "device_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|DRAM Throughput|Executed Ipc Active|Issue Slots Busy|Mem Busy|Max Bandwidth|L2 Hit Rate" \
    "$L/ncu_fp8.log" | sed -E 's/void cutlass::device_kernel<([^<]{0,60}).*/device_kernel<\1.../' | head -80
fi
echo "done $(el) s"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
