#!/usr/bin/env bash
# Configures and builds EvenEP in ./build. Extra arguments go to cmake; BUILD_TARGET=name builds one target only.
# The CUDA backend is built when nvcc is found (PATH or /usr/local/cuda/bin), NCCL support when NCCL >= 2.28 is found.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build --parallel "$(nproc)" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
