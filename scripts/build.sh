#!/usr/bin/env bash
# Configures and builds EvenEP in ./build (extra arguments go to cmake). The CUDA backend is built when nvcc is found.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build --parallel "$(nproc)"
