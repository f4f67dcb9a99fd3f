#!/usr/bin/env bash
# Issue 34's tables in one device call (docs/benchmarks.md "CUTLASS kernels and FP8" and "The FP8 layer"; docs/fp8.md):
#   1. build the `evenep` CLI, the Python extension, grouped_gemm_test and the FP8 tests (CUTLASS on, the tuning
#      candidates for the anchors and `fp8_wgrad`), run grouped_gemm_fp8_test and gpu_moe_layer_fp8_test;
#   2. the GEMM table: `evenep bench gemm` at the MoonEP point (the planner's rows at maxvio 0.2 and 20, Zipf 1.0)
#      and the K3-like point (R = 64), bf16 fwd/dgrad/wgrad (and wgrad_set: dW = x^T dy written without reading,
#      the like-for-like row for torch._grouped_mm's fresh output) with the hand-written and CUTLASS kernels, FP8
#      fwd/dgrad (block-scaled, beside the same kernel with EvenEP's overlapped consumer loop, a candidate, and
#      CUTLASS's unscaled anchor) and the FP8 wgrad, then torch._grouped_mm and dense on the same offsets
#      (gemm_anchor.py);
#   3. the CUTLASS raster order: grouped_gemm_test's CUTLASS cases and the bf16 CUTLASS rows with a group's tiles
#      walked N-fastest (EVENEP_CUTLASS_RASTER=n) beside the default M-fastest rows of step 2; the fp32-output
#      dgrad (the layer's), hand-written against CUTLASS's candidate; then the wgrad with four micro-batches' rows
#      in one call (S x 4: the deferred-wgrad measurement);
#   4. the FP8 layer table: `bench layer --fp8` at both points, maxvio 0.2 and 20, M = 4 micro-batches a step;
#   5. the dispatch, bf16 and FP8, at the MoonEP point;
#   6. accuracy: `evenep demo --fp8 --backend cuda` and the 200-step `train_moe.py --compare-fp8` on CUDA.
# Each step gets what is left of BUDGET seconds (default 570) and is skipped when too little is left; summary.txt
# holds every table, logs.tgz the logs and JSON (the device returns 8 files).
#
# On the device machine, from the repository root (carry .devdeps and .deps):
#   source .devdeps/unpack.sh && scripts/device/issue34.sh
# Environment: BUILD (default build-gpu), BUDGET, SKIP (space-separated step names to skip: tests gemm k3 raster
# f32 defer layer dispatch accuracy; without accuracy the Python extension is not built), OPS (the bench gemm ops of
# the gemm and k3 steps instead of all of them), ANCHOR_OPS (the ops the torch anchors time; default the bf16 ones
# among OPS), TESTS (the test binaries of step 1), GG_TEST=0 (grouped_gemm_test not built: the raster and f32 steps
# only time), MOON_ROWS (the row sets of the gemm step, default "--maxvio 0.2 20 --zipf 1.0"), NCCL (ON: the NCCL
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
T=${TESTS-grouped_gemm_fp8_test gpu_moe_layer_fp8_test}
GG=grouped_gemm_test  # the raster and f32 steps' correctness runs (GG_TEST=0: not built, those runs skipped)
[ "${GG_TEST:-1}" = 0 ] && GG=
PY=evenep_python  # the Python extension: only the accuracy step's train_moe.py needs it
[[ " ${SKIP:-} " == *" accuracy "* ]] && PY=
{
  cmake -S . -B "$B" -G Ninja ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH=$DEPS_PREFIX} -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DEVENEP_NCCL="${NCCL:-OFF}" -DEVENEP_BUILD_BENCH=OFF -DEVENEP_BUILD_EXAMPLES=OFF \
    -DEVENEP_CUTLASS=ON -DEVENEP_CUTLASS_CANDIDATES=ON -DEVENEP_BUILD_PYTHON=ON \
    "-DPython_EXECUTABLE=$(command -v python3)" &&
  cmake --build "$B" -j "$(nproc)" --target evenep $PY $T $GG
} > "$L/build.log" 2>&1 || { tail -40 "$L/build.log"; exit 1; }
grep -E "EvenEP: CUTLASS" "$L/build.log"
echo "build $(el) s"
find "$B" -name "_C*.so" -exec cp {} python/evenep/ \;

if want tests 60; then
  for t in $T; do
    timeout "$(left 90)" "$B/tests/$t" --gtest_brief=1 > "$L/t_$t.log" 2>&1
    rc=$?
    echo "$t rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$L/t_$t.log" | tr '\n' ' ') ($(el) s)"
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
AOPS=$(for o in ${OPS:-fwd dgrad wgrad wgrad_set}; do [[ $o == fp8_* ]] || echo -n "$o "; done)
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
gemm gemm 150 ${MOON_ROWS:---maxvio 0.2 20 --zipf 1.0} --ops ${OPS:-fwd dgrad wgrad wgrad_set fp8_fwd fp8_dgrad fp8_wgrad} \
  --kernels wgmma cutlass --check
gemm k3 60 --R 64 --E 896 --K 16 --H 3584 --maxvio 0.2 20 --zipf 0 --ops ${OPS:-fwd dgrad wgrad wgrad_set fp8_fwd fp8_dgrad} \
  --kernels wgmma cutlass

# The CUTLASS group scheduler's raster order (EVENEP_CUTLASS_RASTER=n: a group's tiles N-fastest; the default walks
# them M-fastest): the CUTLASS cases of grouped_gemm_test with it (same results: only the order differs), then the
# bf16 CUTLASS rows of both points again, printed beside the M-fastest rows of the gemm / k3 steps above.
if want raster 60; then
  echo "== CUTLASS raster N-fastest ($(el) s)"
  if [ -n "$GG" ]; then
    EVENEP_CUTLASS_RASTER=n timeout "$(left 60)" "$B/tests/grouped_gemm_test" --gtest_brief=1 \
      --gtest_filter='*utlass*' > "$L/t_raster.log" 2>&1
    echo "grouped_gemm_test (raster n) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/t_raster.log" | tr '\n' ' ')"
  fi
  for pt in k3 gemm; do
    [ $pt = k3 ] && args="--R 64 --E 896 --K 16 --H 3584 --maxvio 0.2 20 --zipf 0" || args="--maxvio 0.2 20 --zipf 1.0"
    want raster 30 || break
    EVENEP_CUTLASS_RASTER=n timeout "$(left 90)" "$E" bench gemm $args --ops fwd dgrad wgrad --kernels cutlass \
      --iters 10 --json "$L/${pt}_raster_n.json" > "$L/${pt}_raster_n.log" 2>&1
    echo "bench $pt raster n rc=$? ($(el) s)"
    python3 - "$L/$pt.json" "$L/${pt}_raster_n.json" <<'PY'
import json, sys
def rows(f):
    try:
        return {(r["dist"], r["proj"], r["op"]): r["tflops"] for r in json.load(open(f))["rows"]
                if r["schedule"] == "cutlass/load_aware"}
    except (OSError, ValueError, KeyError):
        return {}
m, n = rows(sys.argv[1]), rows(sys.argv[2])
print(f"{'dist':<20} {'proj':<8} {'op':<6} {'M-fast':>7} {'N-fast':>7} {'N/M':>5}")
for k in sorted(n):
    a = m.get(k, float("nan"))
    print(f"{k[0]:<20} {k[1]:<8} {k[2]:<6} {a:7.1f} {n[k]:7.1f} {n[k] / a:5.2f}")
PY
  done
fi

# The layer's fp32-output dgrads: the hand-written kernel (what kAuto runs) against CUTLASS's fp32 dgrad (a tuning
# candidate), and grouped_gemm_test's fp32 cases.
if want f32 40; then
  echo "== dgrad with fp32 output ($(el) s)"
  if [ -n "$GG" ]; then
    timeout "$(left 60)" "$B/tests/grouped_gemm_test" --gtest_brief=1 --gtest_filter='*_f32_*' > "$L/t_f32.log" 2>&1
    echo "grouped_gemm_test (f32) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/t_f32.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED  \]" "$L/t_f32.log" | head -8
  fi
  for pt in moon k3; do
    [ $pt = k3 ] && args="--R 64 --E 896 --K 16 --H 3584 --maxvio 0.2 20 --zipf 0" || args="--maxvio 0.2 20 --zipf 1.0"
    want f32 20 || break
    timeout "$(left 90)" "$E" bench gemm $args --ops dgrad_f32 --kernels wgmma cutlass --iters 10 \
      --json "$L/${pt}_f32.json" > "$L/${pt}_f32.log" 2>&1
    echo "bench $pt dgrad_f32 rc=$? ($(el) s)"
    grep -E "load_aware" "$L/${pt}_f32.log" | awk '{print $1, $2, $3, $4, $7}'
  done
fi

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
echo "done $(el) s"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
