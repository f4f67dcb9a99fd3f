#!/usr/bin/env bash
# The main job: install dependencies, build the CLI, and run one MoE layer step on virtual ranks (`evenep demo`).
# Extra arguments go to `evenep demo` (see `evenep demo --help`).
#
# Only what the demo needs is built: the `evenep` target, with the CUDA backend only when the demo can use it — a
# GPU is visible (`nvidia-smi -L` lists one) and nvcc is found, unless `--backend cpu` — or when it is asked for
# (`--backend cuda`; EVENEP_CUDA=0|1 in the environment decides instead). Without a GPU the CUDA sources are not
# compiled, which makes a fresh clone's first run several minutes shorter.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"

backend=auto
prev=""
for a in "$@"; do
    case $a in
        --backend=*) backend=${a#--backend=} ;;
        *) [[ $prev == --backend ]] && backend=$a ;;
    esac
    prev=$a
done
gpu_visible() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }
if [[ -n ${EVENEP_CUDA:-} ]]; then
    case $EVENEP_CUDA in 0|OFF|off) cuda=OFF ;; *) cuda=ON ;; esac
elif [[ $backend == cuda ]] || { [[ $backend != cpu ]] && gpu_visible; }; then
    cuda=ON
else
    cuda=OFF
fi
# A CUDA build without nvcc would fail at configure time; `evenep demo --backend cuda` then says why instead.
[[ $cuda == ON ]] && ! command -v nvcc >/dev/null && cuda=OFF
echo "run-demo: building evenep (CUDA backend: $cuda)"
BUILD_TARGET=evenep scripts/build.sh "-DEVENEP_CUDA=$cuda"
exec ./build/tools/evenep/evenep demo "$@"
