#!/usr/bin/env python3
"""The issue-32 workload table from `evenep bench layer --workload W --json F` outputs (evenep.workload_run/1).

    python3 scripts/device/workload_table.py OUT/workloads/*.json > OUT/workloads.md

One row per (workload, shape): evenep_exact's and evenep_auto's median and p90 step (ms), the best baseline by
median and by p90 (conventional, eplb/*, lplb, llep) and the ratios best baseline / EvenEP (>= 1: EvenEP at least as
fast; the issue's targets: >= 0.98 on the median everywhere, >= 1.3 on the p90 of rotating, burst and
microbatch_noise at k3_R64). evenep_auto is planned under the auto policy (docs/auto.md); a file that still carries
a "note" on it (an older run, where it was evenep_exact's numbers) is flagged.
"""
import json
import sys


def main(paths):
    rows = []
    notes = set()
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        if d.get("schema") != "evenep.workload_run/1":
            sys.stderr.write(f"workload_table.py: {path}: not evenep.workload_run/1, skipped\n")
            continue
        by = {s["label"]: s for s in d["systems"]}
        base = [s for s in d["systems"] if not s["name"].startswith("evenep")]
        med = {k: s["summary"]["median_ms"] for k, s in by.items()}  # the CLI's own summary (one definition)
        p90 = {k: s["summary"]["p90_ms"] for k, s in by.items()}
        bm = min(base, key=lambda s: med[s["label"]])["label"]
        bp = min(base, key=lambda s: p90[s["label"]])["label"]
        if "note" in by.get("evenep_auto", {}):
            notes.add(by["evenep_auto"]["note"])
        rows.append((d.get("workload") or d.get("trace"), d.get("shape", f"R{d['R']}"), d["steps"], med, p90, bm, bp))
    print("| workload | shape | T | exact median ms | auto median ms | best baseline (median) | ratio vs exact | "
          "ratio vs auto | exact p90 ms | best baseline (p90) | p90 ratio vs exact | p90 ratio vs auto |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, shape, T, med, p90, bm, bp in sorted(rows, key=lambda r: (r[1], r[0])):
        print(f"| {name} | {shape} | {T} | {med['evenep_exact']:.2f} | {med['evenep_auto']:.2f} | {bm} "
              f"{med[bm]:.2f} | {med[bm] / med['evenep_exact']:.3f} | {med[bm] / med['evenep_auto']:.3f} | "
              f"{p90['evenep_exact']:.2f} | {bp} {p90[bp]:.2f} | {p90[bp] / p90['evenep_exact']:.3f} | "
              f"{p90[bp] / p90['evenep_auto']:.3f} |")
    for n in sorted(notes):
        print(f"\nevenep_auto: {n}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: workload_table.py FILE.json...")
    main(sys.argv[1:])
