#!/usr/bin/env bash
# Install dependencies, build with warnings as errors, run every test (GPU tests skip without a device).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DEVENEP_WERROR=ON
cd build
ctest --output-on-failure --parallel "$(nproc)" "$@"
