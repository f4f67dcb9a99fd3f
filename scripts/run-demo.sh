#!/usr/bin/env bash
# The main job: install dependencies, build, and run one MoE layer step on virtual ranks (`evenep demo`).
# Extra arguments go to `evenep demo` (see `evenep demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD_TARGET=evenep scripts/build.sh
exec ./build/tools/evenep/evenep demo "$@"
