#!/usr/bin/env bash
# Installs the Debian packages EvenEP builds with, when any is missing (needs root or sudo), then the pinned CUTLASS
# headers (scripts/fetch-cutlass.sh: pip download, hence python3-pip).
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev googletest libbenchmark-dev libcli11-dev
      nlohmann-json3-dev libfmt-dev coinor-libcbc-dev python3 python3-venv
      python3-dev python3-pip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The pinned CUTLASS headers of the CUDA grouped GEMMs (.deps/, git-ignored; nothing to do when present).
"$(dirname "$0")/fetch-cutlass.sh"
