#!/usr/bin/env bash
# Install dependencies, build with warnings as errors, run every test (GPU tests skip without a device):
# the C++ tests (ctest; extra arguments go to ctest), then the Python package's tests (scripts/run-python-tests.sh:
# a virtual environment in .venv with torch from PyPI, the package built and installed there, pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DEVENEP_WERROR=ON
(cd build && ctest --output-on-failure --parallel "$(nproc)" "$@")
scripts/run-python-tests.sh
