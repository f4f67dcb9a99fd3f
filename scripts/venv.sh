#!/usr/bin/env bash
# Creates the Python environment of the tests when missing: $EVENEP_VENV (default .venv at the repository root,
# git-ignored) with torch, pytest, numpy, scikit-build-core and ninja from PyPI; prints nothing else when it is
# already complete. The first run downloads torch: the default PyPI wheel of Linux x86-64 is a CUDA build (torch
# 2.15: ~5.4 GiB installed with its nvidia-* wheels, about 2.5 min here); with pip's cache warm a fresh environment
# takes well under a minute. Offline machines with a system torch (e.g. the GPU machine): EVENEP_VENV_SYSTEM=1
# creates it with --system-site-packages, so nothing is downloaded when those packages are there.
# Used by scripts/run-tests.sh (in the background, while the C++ build runs) and scripts/run-python-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EVENEP_VENV:-$PWD/.venv}
python=${PYTHON:-python3}

if [[ ! -x $venv/bin/python ]]; then
    echo "venv: creating $venv"
    "$python" -m venv ${EVENEP_VENV_SYSTEM:+--system-site-packages} "$venv"
fi
py=$venv/bin/python
if ! "$py" -c "import torch, pytest, numpy, scikit_build_core" 2>/dev/null; then
    echo "venv: installing torch, pytest, numpy, scikit-build-core, ninja (first run: large download)"
    start=$(date +%s)
    "$py" -m pip install --quiet --upgrade pip
    "$py" -m pip install --quiet torch pytest numpy scikit-build-core ninja
    echo "venv: installed in $(( $(date +%s) - start )) s"
fi
