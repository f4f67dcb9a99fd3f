#!/usr/bin/env bash
# Every workload of `evenep workloads` through `evenep bench layer --workload W` (issue 32 item 5) in one device call
# on one GPU: build `evenep` only, then for each workload one run over the MoonEP point (R=8 E=384 K=8 S=8192 H=7168
# H'=2048) and the K3-like point at R = 8, 16, 64 (E=896 K=16 H=3584 H'=2048), STEPS steps each: evenep_auto,
# evenep_exact, conventional, eplb at 1, 2, 4 and epn redundant slots, lplb, llep on the same routings, each unit's
# busiest rank timed on the GPU (forward + backward), link phases modelled. Files in $OUT:
#   build.log                 the configure and build
#   workloads.log             every run's tables
#   workloads/<W>_<shape>.json  evenep.workload_run/1 (one per workload and shape)
#   workloads.md              the summary table (scripts/device/workload_table.py): best baseline / EvenEP
#   img/workload_<W>_<shape>.png  step time over the steps (scripts/plots.py --workload-run; needs matplotlib: where the
#                             device has none, run the same command here on the JSON files)
#
# Time: the build (~2-3 min on 16 cores from a clean tree), then per workload ~4 shapes x (~1.5 s setup + STEPS x
# 9 systems x ~70 ms; evenep_auto is timed as its own): ~30-35 s per workload at STEPS=10, ~5-6 min for the 10
# workloads; TOTAL (default 470 s) bounds the whole script, build included: a workload that would start with less
# than 30 s left is skipped (listed in the log), and each run's own --max-seconds refuses shapes past what is left.
# Most telling workloads run first.
#
# On the device machine, from the repository root (with the Debian dev packages carried in .devdeps if needed):
#   [source .devdeps/unpack.sh &&] scripts/device/run_workloads.sh [extra `evenep bench layer` args...]
# Environment: STEPS (10), EPLB_INTERVAL (2), EPLB_WINDOW (4), TOTAL (470), WORKLOADS (space-separated, default all).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
TOTAL=${TOTAL:-470}
STEPS=${STEPS:-10}
EPLB_INTERVAL=${EPLB_INTERVAL:-2}
EPLB_WINDOW=${EPLB_WINDOW:-4}
mkdir -p "$OUT/workloads" "$OUT/img"
t0=$(date +%s)
left() { echo $(( TOTAL - ($(date +%s) - t0) )); }
source scripts/device/build_cli.sh
build_cli

# The issue's p90 targets first (rotating, burst, micro-batch noise), then the rest of `evenep workloads`.
if [ -z "${WORKLOADS:-}" ]; then
  WORKLOADS="rotating burst microbatch_noise"
  for w in $("$EVENEP" workloads | awk '{print $1}'); do
    case " $WORKLOADS " in *" $w "*) ;; *) WORKLOADS="$WORKLOADS $w" ;; esac
  done
fi
status=0
: > "$OUT/workloads.log"
for w in $WORKLOADS; do
  l=$(left)
  if [ "$l" -lt 30 ]; then
    echo "=== $w skipped: ${l} s left of TOTAL $TOTAL" | tee -a "$OUT/workloads.log"
    status=3
    continue
  fi
  echo "=== $w (timeout $(( l - 5 )) s, $(( $(date +%s) - t0 )) s so far)" | tee -a "$OUT/workloads.log"
  timeout $(( l - 5 )) "$EVENEP" bench layer --workload "$w" --steps "$STEPS" --points moonep k3 --k3-R 8 16 64 \
    --warmup 1 --iters 1 --warm-seconds 0.3 --eplb-interval "$EPLB_INTERVAL" --eplb-window "$EPLB_WINDOW" \
    --max-seconds $(( l - 10 )) --json "$OUT/workloads/$w.json" "$@" >> "$OUT/workloads.log" 2>&1
  rc=$?
  echo "=== $w rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/workloads.log"
  grep -E "^best baseline" "$OUT/workloads.log" | tail -4
  [ $rc -ne 0 ] && status=$rc
done
python3 scripts/device/workload_table.py "$OUT"/workloads/*.json > "$OUT/workloads.md" && cat "$OUT/workloads.md"
python3 scripts/plots.py --workload-run "$OUT"/workloads/*.json --out "$OUT/img" ||
  echo "plots: not drawn here (matplotlib?); run: python3 scripts/plots.py --workload-run OUT/workloads/*.json --out docs/img"
# The device machine returns at most eight files from $OUT: everything in one archive as well.
tar czf "$OUT/workloads.tgz" -C "$OUT" workloads img workloads.md workloads.log 2>/dev/null
echo "done in $(( $(date +%s) - t0 )) s, status $status"
exit $status
