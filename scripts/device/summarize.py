#!/usr/bin/env python3
"""Summarises `evenep bench gpu-suite --json` and torch_anchor.py output into the markdown tables of the issue."""
import json
import sys


def main():
    bench = json.load(open(sys.argv[1]))
    torch_rows = json.load(open(sys.argv[2]))["rows"] if len(sys.argv) > 2 else []
    rows = bench["rows"]
    copy = bench.get("copy_gbps", 0)
    print(f"device: {bench.get('device', '?')}")
    print(f"copy anchor: {copy:.0f} GB/s (read + write)\n")
    for r in rows:
        if r["op"].startswith("copy_"):
            print(f"- {r['op']}: {r['median_us']:.1f} us, {r['gbps']:.0f} GB/s")
    print()
    torch_by = {(t["shape_name"], t["target_maxvio"]): t for t in torch_rows}
    points = []
    for r in rows:
        key = (r.get("shape_name"), r.get("target_maxvio"))
        if key[0] and key not in points:
            points.append(key)
    ops = ["plan_rank", "plan_fused", "dispatch", "combine_pull", "combine_push", "combine_pull_weighted", "prefetch",
           "reduce"]
    print("| shape | maxvio | plan 1 rank us | plan fused us | dispatch us (%copy) | combine pull us (%copy) | "
          "combine push us (%copy) | prefetch %copy | reduce %copy | torch permute us | torch unpermute us | wrong |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    by = {}
    for r in rows:
        by[(r.get("shape_name"), r.get("target_maxvio"), r["op"])] = r
    for (shape, mv) in points:
        g = lambda op: by.get((shape, mv, op))
        def t(op):
            r = g(op)
            return f"{r['median_us']:.1f}" if r else "-"
        def tc(op):
            r = g(op)
            return f"{r['median_us']:.0f} ({100 * r['frac_copy']:.0f}%)" if r else "-"
        def c(op):
            r = g(op)
            return f"{100 * r['frac_copy']:.0f}%" if r else "-"
        achieved = next((by[k]["maxvio"] for k in by if k[0] == shape and k[1] == mv), mv)
        tr = torch_by.get((shape, mv))
        wrong = sum(max(0, by[k]["wrong"]) for k in by if k[0] == shape and k[1] == mv)
        print(f"| {shape} | {achieved:.2f} | {t('plan_rank')} | {t('plan_fused')} | {tc('dispatch')} | "
              f"{tc('combine_pull')} | {tc('combine_push')} | {c('prefetch')} | {c('reduce')} | "
              f"{tr['permute_median_us']:.0f} | {tr['unpermute_median_us']:.0f} | {wrong} |" if tr else
              f"| {shape} | {achieved:.2f} | {t('plan_rank')} | {t('plan_fused')} | {tc('dispatch')} | "
              f"{tc('combine_pull')} | {tc('combine_push')} | {c('prefetch')} | {c('reduce')} | - | - | {wrong} |")
    print()
    for shape in sorted({p[0] for p in points}):
        for op in ["dispatch", "combine_pull", "combine_push"]:
            ts = [by[(shape, mv, op)]["median_us"] for (s, mv) in points if s == shape and (s, mv, op) in by]
            if ts:
                print(f"- {shape} {op}: max/min over maxvio = {max(ts) / min(ts):.3f}")
    R = {"moonep": 8, "k3": 8}
    print("\nPer-rank-equivalent times (one launch moves all R virtual ranks' data; divided by R) vs PyTorch on one "
          "rank-sized batch:")
    for (shape, mv) in points:
        tr = torch_by.get((shape, mv))
        d, c = by.get((shape, mv, "dispatch")), by.get((shape, mv, "combine_pull_weighted"))
        if tr and d and c:
            r = R.get(shape, 8)
            print(f"- {shape} maxvio {mv}: dispatch {d['median_us'] / r:.0f} us vs permute {tr['permute_median_us']:.0f} us"
                  f" ({tr['permute_median_us'] / (d['median_us'] / r):.1f}x); weighted combine {c['median_us'] / r:.0f} us"
                  f" vs unpermute {tr['unpermute_median_us']:.0f} us ({tr['unpermute_median_us'] / (c['median_us'] / r):.1f}x)")


if __name__ == "__main__":
    main()
