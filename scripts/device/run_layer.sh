#!/usr/bin/env bash
# The MoE layer step against conventional EP and EPLB-style replication (issue 12, `evenep bench layer`) in one
# device call on one GPU: build `evenep` only, run `bench layer --quick` (the MoonEP point at maxvio 1 and 20), then
# the full grid (MoonEP + K3-like at R = 8, 16, 64; maxvio 0.2 1 5 10 20) with what is left of the time budget
# (points that would not fit it are refused up front by the benchmark's own estimate). Three files in $OUT:
#   build.log   the configure and build
#   layer.log   both runs' tables (quick first)
#   layer.json  evenep.layer_step/1 (scripts/plots.py --layer): the full grid's points when it measured more
#               points than the quick run, else the quick run's
#
# On the device machine, from the repository root (with the Debian dev packages carried in .devdeps if needed):
#   [source .devdeps/unpack.sh &&] scripts/device/run_layer.sh [--quick-only] [extra `evenep bench layer` args...]
# TOTAL (default 540) bounds the whole script in seconds, build included; QUICK_TIMEOUT (default 200) the quick run.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
TOTAL=${TOTAL:-540}
QUICK_TIMEOUT=${QUICK_TIMEOUT:-200}
mkdir -p "$OUT"
full=1
args=()
for a in "$@"; do
  case "$a" in
    --quick-only) full=0 ;;
    *) args+=("$a") ;;
  esac
done
t0=$(date +%s)
left() { echo $(( TOTAL - ($(date +%s) - t0) )); }
source scripts/device/build_cli.sh
build_cli

q=$(( $(left) < QUICK_TIMEOUT ? $(left) : QUICK_TIMEOUT ))
echo "=== bench layer --quick --check (timeout ${q} s)" > "$OUT/layer.log"
timeout "$q" "$EVENEP" bench layer --quick --check --json "$OUT/layer.json" "${args[@]}" >> "$OUT/layer.log" 2>&1
rc=$?
echo "=== quick rc=$rc ($(( $(date +%s) - t0 )) s)" >> "$OUT/layer.log"
status=$rc
cat "$OUT/layer.log"

if [ $full -eq 1 ] && [ "$(left)" -gt 60 ]; then
  budget=$(( $(left) - 20 ))
  tmp=$(mktemp -d)
  echo "=== bench layer (full grid, --max-seconds $(( budget - 30 )), timeout ${budget} s)" | tee -a "$OUT/layer.log"
  timeout "$budget" "$EVENEP" bench layer --max-seconds $(( budget - 30 )) --json "$tmp/full.json" "${args[@]}" \
    > "$tmp/full.log" 2>&1
  rc=$?
  cat "$tmp/full.log" >> "$OUT/layer.log"
  echo "=== full rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/layer.log"
  tail -60 "$tmp/full.log"
  # The full grid's JSON is rewritten after every point; keep it when it holds more points than the quick run's.
  if [ -s "$tmp/full.json" ] && python3 - "$tmp/full.json" "$OUT/layer.json" <<'PY'
import json, sys
def n(p):
    try:
        return len(json.load(open(p))["points"])
    except Exception:
        return 0
sys.exit(0 if n(sys.argv[1]) > n(sys.argv[2]) else 1)
PY
  then cp "$tmp/full.json" "$OUT/layer.json" && echo "layer.json: the full grid's points"; fi
  rm -rf "$tmp"
fi
echo "done in $(( $(date +%s) - t0 )) s, status $status"
exit $status
