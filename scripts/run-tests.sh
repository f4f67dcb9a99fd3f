#!/usr/bin/env bash
# Install dependencies, build with warnings as errors, run every test (GPU tests skip without a device): the C++
# tests (ctest; extra arguments go to ctest), then the Python package's tests (pytest).
#
# One build tree (build/) for both, each source compiled once: the C++ libraries (the CUDA backend too where nvcc
# is found, GPU or not) are built position-independent for ctest while scripts/venv.sh creates .venv in the
# background (torch from PyPI); then the same tree is reconfigured with the Python extension (EVENEP_BUILD_PYTHON,
# the venv's Python), which links the libraries already built, and pytest imports the package from build/python
# (scripts/run-python-tests.sh with EVENEP_PYTHON_BUILD=build). `pip install .` stays the users' way.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
venv=${EVENEP_VENV:-$PWD/.venv}
mkdir -p build
step() { echo "run-tests: $1 ($(( $(date +%s) - t0 )) s)"; }
t0=$(date +%s)

scripts/venv.sh > build/venv.log 2>&1 &
venv_job=$!
trap 'kill $venv_job 2>/dev/null || true' EXIT
# -UEVENEP_CUDA: the CUDA backend by detection (nvcc), whatever scripts/run-demo.sh chose for this tree.
scripts/build.sh -UEVENEP_CUDA -DEVENEP_WERROR=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON
step "C++ build done"
if ! wait $venv_job; then
    cat build/venv.log >&2
    echo "run-tests: creating the Python environment $venv failed" >&2
    exit 1
fi
trap - EXIT
step "Python environment ready"
scripts/build.sh -DEVENEP_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$venv/bin/python"
step "Python extension built"
(cd build && ctest --output-on-failure --parallel "$(nproc)" "$@")
step "ctest done"
EVENEP_PYTHON_BUILD=build scripts/run-python-tests.sh
step "pytest done"
