#!/usr/bin/env bash
# Builds and installs the Python package (evenep, python/) into a virtual environment and runs its tests
# (tests/python, pytest; GPU tests skip without a device). Exits 0 only when tests ran and all passed.
#
#   scripts/run-python-tests.sh [pytest args...]
#
# The environment: $EVENEP_VENV (default .venv at the repository root, git-ignored), created when missing, with
# torch, pytest, numpy, scikit-build-core and ninja from PyPI. The first run downloads torch: the default PyPI
# wheel of Linux x86-64 is a CUDA build (torch 2.15: ~5.4 GiB installed with its nvidia-* wheels, about 2.5 min
# here); pip's cache makes a fresh environment later take well under a minute. Later runs reuse the environment,
# and the package is rebuilt (incrementally, in build/python/) and reinstalled only when its sources changed.
# Offline machines with a system torch (e.g. the GPU machine): EVENEP_VENV_SYSTEM=1 creates the environment with
# --system-site-packages, so nothing is downloaded when torch, pytest, numpy and scikit-build-core are there.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${EVENEP_VENV:-$root/.venv}
python=${PYTHON:-python3}

if [[ ! -x $venv/bin/python ]]; then
    echo "run-python-tests: creating $venv"
    "$python" -m venv ${EVENEP_VENV_SYSTEM:+--system-site-packages} "$venv"
fi
py=$venv/bin/python
if ! "$py" -c "import torch, pytest, numpy, scikit_build_core" 2>/dev/null; then
    echo "run-python-tests: installing torch, pytest, numpy, scikit-build-core, ninja (first run: large download)"
    start=$(date +%s)
    "$py" -m pip install --quiet --upgrade pip
    "$py" -m pip install --quiet torch pytest numpy scikit-build-core ninja
    echo "run-python-tests: installed in $(( $(date +%s) - start )) s"
fi

# Reinstall the package when any source it is built from changed (or it is missing).
stamp=$venv/.evenep-source-hash
hash=$(cat pyproject.toml CMakeLists.txt $(git ls-files -co --exclude-standard src include python | sort) \
       2>/dev/null | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$hash" ]] || ! (cd /tmp && "$py" -c "import evenep._C") 2>/dev/null; then
    echo "run-python-tests: building and installing the evenep package"
    start=$(date +%s)
    # No build isolation: the build uses this environment's torch (no second torch download).
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
        "$py" -m pip install --quiet --no-build-isolation --no-deps .
    echo "$hash" > "$stamp"
    echo "run-python-tests: package built and installed in $(( $(date +%s) - start )) s"
fi

# Run from the repository root: `import evenep` is the installed package (the sources live in python/evenep).
set +e
"$py" -m pytest -p no:cacheprovider -q tests/python "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
    echo "run-python-tests: no test ran (pytest exit 5): failure" >&2
    exit 1
fi
exit $rc
