#!/usr/bin/env bash
# Runs the Python package's tests (tests/python, pytest; GPU tests skip without a device) in the environment of
# scripts/venv.sh ($EVENEP_VENV, default .venv; created when missing). Exits 0 only when tests ran and all passed.
#
#   scripts/run-python-tests.sh [pytest args...]
#
# Which evenep is tested:
#   EVENEP_PYTHON_BUILD=DIR   the package in a CMake build tree configured with -DEVENEP_BUILD_PYTHON=ON and the
#                             environment's Python (scripts/run-tests.sh does this): DIR/python/evenep holds links
#                             to python/evenep's sources and the extension built there from the same static
#                             libraries as the C++ tests; nothing is compiled or installed here.
#   unset                     the package as users install it: `pip install .` into the environment (built in
#                             build/python/, incrementally), redone only when one of its sources changed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/venv.sh
venv=${EVENEP_VENV:-$PWD/.venv}
py=$venv/bin/python

if [[ -n ${EVENEP_PYTHON_BUILD:-} ]]; then
    pkg=$(cd "$EVENEP_PYTHON_BUILD" && pwd)/python
    if ! (cd /tmp && PYTHONPATH=$pkg "$py" -c "import evenep._C") ; then
        echo "run-python-tests: cannot import evenep._C from $pkg (build it: cmake -DEVENEP_BUILD_PYTHON=ON" \
             "-DPython_EXECUTABLE=$py, target evenep_python)" >&2
        exit 1
    fi
    export PYTHONPATH=$pkg${PYTHONPATH:+:$PYTHONPATH}
else
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
fi

# Run from the repository root: `import evenep` is the build tree's or the installed package (the sources live in
# python/evenep, which is not on the path).
set +e
"$py" -m pytest -p no:cacheprovider -q tests/python "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
    echo "run-python-tests: no test ran (pytest exit 5): failure" >&2
    exit 1
fi
exit $rc
