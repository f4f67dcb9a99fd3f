#!/usr/bin/env bash
# The Python package on the GPU machine, in one call: builds and installs evenep (CUDA ops and the NCCL team
# included, against torch's NCCL) into a virtual environment that uses the preinstalled torch, builds the C++
# `evenep` CLI from the same build directory (for the benchmark's C++ columns), runs the group= check under
# `torchrun --nproc-per-node 1`, pytest (the GPU tests included) and the benchmarks: `python -m evenep.bench` at
# the MoonEP point (data-path ops, Python vs the C++ `evenep bench` of the same call, eager and graph replay) and at
# the default point (the MoE layer vs the plain PyTorch MoE). Logs go to $OUT: build.log, torchrun.log,
# pytest.log, bench_moonep.log (+ bench_moonep.json), bench.log (+ bench.json; 30 steps of examples/train_moe.py on
# the GPU, both back-ends, appended).
#
# On the device machine (no network), from the repository root, with the Debian dev packages carried in .devdeps:
#   source .devdeps/unpack.sh && scripts/device/run_python.sh [--no-tests] [--no-bench] [--quick]
# --quick: pytest without the tests marked slow, a smaller benchmark, no MoonEP point.
# Needs: python3 with torch (CUDA), numpy, pytest and scikit-build-core; cmake >= 3.24, ninja, nvcc.
# Exit status: 0 when the build, the tests and the benchmarks all succeeded.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
OUT=${OUT:-$root/device-out}
mkdir -p "$OUT"
run_tests=1 run_bench=1 quick=0
for a in "$@"; do
  case "$a" in
    --no-tests) run_tests=0 ;;
    --no-bench) run_bench=0 ;;
    --quick) quick=1 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
[ -n "${DEPS_PREFIX:-}" ] && export CMAKE_PREFIX_PATH=$DEPS_PREFIX${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}
# NCCL: torch's (the image's system NCCL 2.28.3 rejects ncclDevCommCreate): first on the loader's path.
nccl_root=$(python3 -c "import nvidia.nccl; print(nvidia.nccl.__path__[0])" 2>/dev/null)
[ -n "$nccl_root" ] && export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
venv=${EVENEP_VENV:-/tmp/evenep-venv}
site=/tmp/evenep-site
status=0
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }
# One device call may run 600 s: every step after the build gets at most what is left of BUDGET_S (default 570 s);
# a step that needs more than is left is skipped (and says so) rather than killed midway.
budget=${BUDGET_S:-570}
left() { echo $(( budget - ($(date +%s) - t0) )); }
# limit N: N seconds, or what is left when less; fails (skip the step) when less than MIN_S (default 30) is left.
limit() { local l; l=$(left); [ "$l" -lt "${2:-30}" ] && return 1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
skip() { echo "$1: SKIPPED, $(left) s left of the ${budget} s budget"; status=1; }

# Where the package goes: a venv over the system site-packages (the preinstalled torch), or, where python3 cannot
# make one (no venv module), pip --target into $site on PYTHONPATH.
py=$venv/bin/python
pip_target=()
if ! { [ -x "$py" ] || python3 -m venv --system-site-packages "$venv" > /dev/null 2>&1; } ||
   ! "$py" -c "import torch, scikit_build_core" > /dev/null 2>&1; then
  py=python3
  pip_target=(--target "$site" --upgrade)
  export PYTHONPATH=$site
fi

# ---- build and install (a subshell: its exit is the build's status) ----
(
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  nvcc --version | tail -1; cmake --version | head -1; ninja --version
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'device', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
  "$py" -c "import torch, pytest, numpy, scikit_build_core; print('$py ok: scikit-build-core', scikit_build_core.__version__)"
  echo "pip install into ${pip_target[*]:-$venv}"
  # The extension builds against this torch (no build isolation, nothing downloaded); CUDA ops: nvcc + CUDA torch.
  "$py" -m pip install --no-build-isolation --no-deps --no-index -v "${pip_target[@]}" \
    --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a --config-settings=cmake.define.EVENEP_WERROR=OFF . \
    2>&1 | grep -vE "^  (copying|adding)"
  rc=${PIPESTATUS[0]}
  echo "pip install rc=$rc ($(elapsed))"
  exit "$rc"
) > "$OUT/build.log" 2>&1
build_rc=$?
if [ $build_rc -ne 0 ]; then
  # Fallback: the CMake build directly, the module copied next to the sources, PYTHONPATH=python.
  echo "pip install failed (rc=$build_rc): building with CMake directly" | tee -a "$OUT/build.log"
  {
    cmake -S . -B build/pydev -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVENEP_BUILD_PYTHON=ON -DEVENEP_BUILD_TESTS=OFF \
      -DEVENEP_BUILD_BENCH=OFF -DEVENEP_BUILD_EXAMPLES=OFF -DEVENEP_BUILD_TOOLS=OFF \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DPython_EXECUTABLE="$(command -v python3)" &&
    cmake --build build/pydev --target evenep_python &&
    cp build/pydev/python/_C*.so python/evenep/
  } >> "$OUT/build.log" 2>&1
  build_rc=$?
  py=python3
  export PYTHONPATH=$root/python
fi
echo "build rc=$build_rc ($(elapsed))"
grep -E "EvenEP:|pip install rc" "$OUT/build.log" | head -8
if [ $build_rc -ne 0 ]; then tail -40 "$OUT/build.log"; exit 1; fi
(cd /tmp && "$py" -c "import evenep, torch; print('evenep', evenep.__version__, 'cuda ops', evenep.cuda_built(), 'nccl team', evenep.cuda_built() and torch.ops.evenep.nccl_built(), evenep.__file__)") \
  2>&1 | tee -a "$OUT/build.log"

# The C++ CLI from the package's build directory (the CUDA backend is compiled once): the benchmark's C++ columns.
cli=""
bd=$(ls -d build/python/*/ 2>/dev/null | head -1)
[ -z "$bd" ] && bd=build/pydev
if [ $run_bench -eq 1 ]; then
  { cmake -S . -B "$bd" -DEVENEP_BUILD_TOOLS=ON && cmake --build "$bd" --target evenep; } >> "$OUT/build.log" 2>&1 &&
    cli=$root/${bd%/}/tools/evenep/evenep
  echo "C++ CLI: ${cli:-not built (see build.log)} ($(elapsed))"
fi

# ---- group=: one process over EvenEP's NCCL team (torchrun), against virtual_ranks=1 ----
if [ $run_tests -eq 1 ]; then
  if ! t=$(limit 150 60); then skip "torchrun"; else
    timeout "$t" "$py" -m torch.distributed.run --standalone --nproc-per-node 1 tests/python/group_worker.py \
      > "$OUT/torchrun.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    echo "torchrun --nproc-per-node 1 tests/python/group_worker.py rc=$rc ($(elapsed)):"
    grep -E "group= check|Error|error" "$OUT/torchrun.log" | head -8
  fi
fi

# ---- pytest (CPU and GPU tests) ----
if [ $run_tests -eq 1 ]; then
  if ! t=$(limit 300 90); then skip "pytest"; else
    marks=()
    [ $quick -eq 1 ] && marks=(-m "not slow")
    timeout "$t" "$py" -m pytest -p no:cacheprovider -q -rs --durations=8 "${marks[@]}" tests/python > "$OUT/pytest.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    echo "pytest rc=$rc ($(elapsed)):"
    grep -E "passed|failed|error" "$OUT/pytest.log" | tail -3
    grep -E "^(FAILED|ERROR) " "$OUT/pytest.log" | head -20
  fi
fi

# ---- benchmark at the MoonEP point: the data-path ops, Python vs the C++ figure of the same call ----
if [ $run_bench -eq 1 ] && [ $quick -eq 0 ]; then
  if ! t=$(limit 240 90); then skip "bench --moonep"; else
    timeout "$t" "$py" -m evenep.bench --device cuda --moonep --cpp "${cli:-none}" --json "$OUT/bench_moonep.json" \
      > "$OUT/bench_moonep.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    echo "bench --moonep rc=$rc ($(elapsed)):"
    tail -20 "$OUT/bench_moonep.log"
  fi
fi

# ---- benchmark (CUDA, virtual ranks on one GPU): the MoE layer vs the plain PyTorch MoE ----
if [ $run_bench -eq 1 ]; then
  if ! t=$(limit 120 40); then skip "bench"; else
    args=(--device cuda)
    [ $quick -eq 1 ] && args+=(--tokens 256 --iters 10)
    timeout "$t" "$py" -m evenep.bench "${args[@]}" --cpp none --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    # The example LM on the GPU, both back-ends from the same weights (loss curves agree within bf16 noise).
    for b in evenep reference; do
      if ! t=$(limit 90 40); then echo "# examples/train_moe.py --backend $b: skipped, $(left) s left" >> "$OUT/bench.log"; continue; fi
      echo "# examples/train_moe.py --device cuda --backend $b --steps 30" >> "$OUT/bench.log"
      timeout "$t" "$py" examples/train_moe.py --device cuda --backend $b --steps 30 >> "$OUT/bench.log" 2>&1 || status=1
    done
    echo "bench rc=$rc ($(elapsed)):"
    head -40 "$OUT/bench.log"
  fi
fi
echo "total $(elapsed), status $status"
exit $status
