#!/usr/bin/env bash
# Fetches the pinned CUTLASS C++ headers (issue 34) into .deps/cutlass-<version>/ (git-ignored) when missing: the
# nvidia-cutlass wheel from PyPI (6.4 MB, `pip download --no-deps`), of which only the header trees are unpacked
# (include/ = cutlass_library/source/include, util/include/ = cutlass_library/source/tools/util/include; ~27 MB).
# Prints nothing when they are already there. CMake finds them there (EVENEP_CUTLASS; CUTLASS_DIR overrides the
# path). Offline machines (the GPU machine): carry .deps/ from a machine that ran this. A failed download is not
# fatal: the build then goes without the CUTLASS kernels and CMake says so.
# Used by scripts/install-deps.sh (so by both README commands).
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.2.0.0
dest=.deps/cutlass-$version
[[ -f $dest/include/cutlass/cutlass.h && -f $dest/util/include/cutlass/util/packed_stride.hpp ]] && exit 0
python=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-cutlass: downloading nvidia-cutlass==$version (C++ headers) into $dest"
if ! "$python" -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "nvidia-cutlass==$version" >&2; then
    echo "fetch-cutlass: could not download nvidia-cutlass==$version; building without the CUTLASS kernels" >&2
    exit 0
fi
rm -rf "$dest.partial"
"$python" - "$tmp" "$dest.partial" <<'PY'
import glob, os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
trees = {"cutlass_library/source/include/": "include/", "cutlass_library/source/tools/util/include/": "util/include/"}
with zipfile.ZipFile(glob.glob(os.path.join(src, "*.whl"))[0]) as z:
    for name in z.namelist():
        for prefix, to in trees.items():
            if name.startswith(prefix) and not name.endswith("/"):
                out = os.path.join(dst, to, name[len(prefix):])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with z.open(name) as f, open(out, "wb") as g:
                    g.write(f.read())
PY
mv "$dest.partial" "$dest"
