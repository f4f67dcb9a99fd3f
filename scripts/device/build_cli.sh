# Sourced by the device scripts (run_layer.sh, run_workloads.sh): configures $BUILD (Release, sm_90a, no NCCL, no
# google-benchmark, no examples) and builds the `evenep` CLI only, the log in $OUT/build.log; sets EVENEP to the
# binary, or prints the log's tail and exits 1. Needs OUT, BUILD, JOBS and t0 (the script's start, date +%s).
build_cli() {
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
    cmake -S . -B "$BUILD" -G Ninja ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH=$DEPS_PREFIX} -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DEVENEP_NCCL=OFF -DEVENEP_BUILD_BENCH=OFF -DEVENEP_BUILD_EXAMPLES=OFF &&
    cmake --build "$BUILD" -j "$JOBS" --target evenep
  } > "$OUT/build.log" 2>&1
  local rc=$?
  echo "build rc=$rc ($(( $(date +%s) - t0 )) s)"
  if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; exit 1; fi
  EVENEP="$BUILD/tools/evenep/evenep"
}
