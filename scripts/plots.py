#!/usr/bin/env python3
"""Pictures for docs/benchmarks.md from the JSON of the runs (matplotlib).

Inputs (each optional, at least one):
  --simulate FILE   `evenep simulate --json FILE` (schema evenep.simulate/1) ->
                      scale_model.png    planner time, copies, copy traffic, buffers, link bytes, imbalance vs R
                      rows_per_rank.png  per-rank rows of conventional EP, EPLB-style and EvenEP at one point
  --layer FILE      a GPU layer-step run (schema evenep.layer_step/1, below) ->
                      step_time_vs_maxvio.png  step time vs maxvio, three systems, each shape
  --workload-run FILE...  `evenep simulate --workload W | --trace F --json FILE` (schema evenep.workload_run/1) ->
                      workload_<name>_R<R>.png  step time over the steps, every system (one picture per file);
                      `evenep bench layer --workload W | --trace F --json FILE` (the same schema with "shape") ->
                      workload_<name>_<shape>.png

evenep.layer_step/1 (written by the GPU layer benchmark):
  {"schema": "evenep.layer_step/1",
   "points": [{"shape": "moonep" | "k3" | any name, "R": 8, "E": 384, "K": 8, "S": 8192, "H": 7168,
               "ffn_hidden": 2048,
               "system": "evenep" | "conventional" | "eplb",
               "replica_sync": "ring" | "star" | "none",   # eplb only: one line per model in the run
               "maxvio": 10.0,                  # target maxvio of the routing
               "step_ms_overlapped": 3.1,       # step estimate, prefetch || dispatch, shared expert || comm
               "step_ms_no_overlap": 4.0,       # every phase back to back
               "per_rank_compute_ms": [..R..]}  # expert forward+backward of each rank, alone on the GPU
              , ...]}
  Unknown keys are ignored.

Usage:
  python3 -m venv .venv && .venv/bin/pip install matplotlib
  .venv/bin/python scripts/plots.py --simulate build/simulate.json [--layer layer.json] --out docs/img
"""
import argparse
import json
import math
import os
import sys

SYSTEMS = [("conventional", "conventional EP", "tab:red"), ("eplb", "EPLB-style", "tab:orange"),
           ("evenep", "EvenEP", "tab:blue")]


def need_matplotlib():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        sys.stderr.write("plots.py: matplotlib is not installed for {} — install it in a venv:\n"
                         "  python3 -m venv .venv && .venv/bin/pip install matplotlib\n"
                         "  .venv/bin/python scripts/plots.py ...\n".format(sys.executable))
        sys.exit(2)


def load(path, schema):
    with open(path) as f:
        data = json.load(f)
    if data.get("schema") != schema:
        sys.stderr.write("plots.py: {}: schema is {!r}, expected {!r}\n".format(path, data.get("schema"), schema))
        sys.exit(2)
    if not data.get("points"):
        sys.stderr.write("plots.py: {}: no points\n".format(path))
        sys.exit(2)
    return data["points"]


def gib(b):
    return b / 2**30


def by_maxvio(points):
    out = {}
    for p in points:
        out.setdefault(p["target_maxvio"], []).append(p)
    for v in out.values():
        v.sort(key=lambda p: p["R"])
    return dict(sorted(out.items()))


def log2_axis(ax, ranks):
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks)
    ax.set_xticklabels([str(r) for r in ranks], rotation=60, fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("R (ranks)")
    ax.grid(True, alpha=0.3)


def scale_model(plt, points, out):
    groups = by_maxvio(points)
    ranks = sorted({p["R"] for p in points})
    first = points[0]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    ax = axes[0][0]
    for i, (mv, pts) in enumerate(groups.items()):
        ax.plot([p["R"] for p in pts], [p["plan_ms_cpu"] for p in pts], "o-", color=colors[i], label=f"CPU, maxvio {mv:g}")
        gpu = [(p["R"], p["plan_ms_gpu"]) for p in pts if p.get("plan_ms_gpu") is not None]
        if gpu:
            ax.plot(*zip(*gpu), "s--", color=colors[i], label=f"GPU, maxvio {mv:g}")
    ax.set_yscale("log")
    ax.set_ylabel("planner time (ms)")
    ax.set_title("planner (all ranks' plan)")
    log2_axis(ax, ranks)
    ax.legend(fontsize=7)

    ax = axes[0][1]
    for i, (mv, pts) in enumerate(groups.items()):
        ax.plot([p["R"] for p in pts], [p["copies"]["max_rank"] for p in pts], "o-", color=colors[i],
                label=f"max per rank, maxvio {mv:g}")
    ref = groups[next(iter(groups))]
    ax.plot([p["R"] for p in ref], [p["copies"]["bound"] for p in ref], "k--", label="bound epn = E/R")
    ax.plot([p["R"] for p in ref], [p["copies"]["theorem2_need"] for p in ref], "k:",
            label="worst-case need ceil(E(R-1)/R²)")
    ax.set_yscale("log")
    ax.set_ylabel("remote experts on one rank")
    ax.set_title("copies")
    log2_axis(ax, ranks)
    ax.legend(fontsize=7)

    ax = axes[0][2]
    for i, (mv, pts) in enumerate(groups.items()):
        ax.plot([p["R"] for p in pts], [gib(p["copies"]["max_rank_copy_traffic_bytes"]) for p in pts], "o-",
                color=colors[i], label=f"maxvio {mv:g}")
    ax.set_ylabel("GiB (bf16 weights)")
    ax.set_title("busiest rank's copy traffic (received + pushed)")
    log2_axis(ax, ranks)
    ax.legend(fontsize=7)

    ax = axes[1][0]
    ax.plot([p["R"] for p in ref], [gib(p["buffers"]["evenep_comm_total"]) for p in ref], "o-", color="tab:blue",
            label="EvenEP communication buffer")
    ax.plot([p["R"] for p in ref], [gib(p["buffers"]["evenep_pool_total"]) for p in ref], "o:", color="tab:blue",
            label="EvenEP expert pool (all layers)")
    ax.plot([p["R"] for p in ref], [gib(p["buffers"]["deepep_recv_x"]) for p in ref], "o-", color="tab:gray",
            label="DeepEP-style worst case R·S·H·2")
    ax.set_yscale("log")
    ax.set_ylabel("GiB per rank")
    ax.set_title("buffers per rank")
    log2_axis(ax, ranks)
    ax.legend(fontsize=7)

    ax = axes[1][1]
    mv_link = 10.0 if 10.0 in groups else list(groups)[-1]
    for key, label, color in SYSTEMS:
        pts = groups[mv_link]
        ax.plot([p["R"] for p in pts], [gib(p["link_bytes"][key]["max_rank_bytes"]) for p in pts], "o-", color=color,
                label=label)
    ax.set_ylabel("GiB, busiest rank")
    ax.set_title(f"link bytes of one training step (maxvio {mv_link:g})")
    log2_axis(ax, ranks)
    ax.legend(fontsize=7)

    ax = axes[1][2]
    styles = ["-", "--", "-.", ":"]
    for i, (mv, pts) in enumerate(groups.items()):
        for key, label, color in SYSTEMS:
            ax.plot([p["R"] for p in pts], [p["imbalance"][key] for p in pts], styles[i % 4], marker="o", ms=3,
                    color=color, label=f"{label}, maxvio {mv:g}")
    ax.set_ylabel("max / mean of per-rank rows")
    ax.set_title("compute imbalance")
    log2_axis(ax, ranks)
    ax.legend(fontsize=6, ncol=2)

    fig.suptitle(f"EvenEP scale model (CPU): E={first['E']} K={first['K']} S={first['S']} H={first['H']} "
                 f"H'={first['ffn_hidden']}; EPLB with epn redundant slots per rank, planned on the previous step "
                 f"(drift {first['eplb']['drift']:g})", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def rows_per_rank(plt, points, out, want_R, want_mv):
    pick = [p for p in points if p["R"] == want_R and p["target_maxvio"] == want_mv]
    p = pick[0] if pick else max(points, key=lambda q: (q["R"], q["target_maxvio"]))
    R = p["R"]
    mean = p["total_entries"] / R
    fig, axes = plt.subplots(3, 1, figsize=(12, 7.5), sharex=True, sharey=True)
    for ax, (key, label, color) in zip(axes, SYSTEMS):
        rows = [v / mean for v in p["rows"][key]]
        ax.bar(range(R), rows, color=color, width=0.85)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("rows / mean")
        ax.set_title(f"{label}: max/mean {p['imbalance'][key]:.3f}", fontsize=9, loc="left")
        ax.grid(True, axis="y", alpha=0.3)
    axes[-1].set_xlabel("rank")
    fig.suptitle(f"per-rank rows (token, expert entries) at R={R} E={p['E']} K={p['K']} S={p['S']}, maxvio "
                 f"{p['maxvio']:.2f}; EPLB placed on the previous step (drift {p['eplb']['drift']:g})", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


EPLB_SYNC_COLORS = {"ring": "tab:orange", "star": "tab:brown", "none": "goldenrod"}


def layer_series(points):
    """(system, (replica_sync, redundant_slots), label, color) of every line of the step-time plot: conventional EP,
    one EPLB line per (replica synchronisation model, redundant slots) in the run (older runs have one, without the
    keys), EvenEP."""
    series = []
    for key, label, color in SYSTEMS:
        if key != "eplb":
            series.append((key, None, label, color))
            continue
        variants = []
        for p in points:
            v = (p.get("replica_sync"), p.get("redundant_slots"))
            if p["system"] == "eplb" and v not in variants:
                variants.append(v)
        one_count = len({slots for _, slots in variants}) == 1
        palette = ["tab:orange", "tab:brown", "goldenrod", "tab:purple", "tab:pink", "tab:olive", "tab:cyan"]
        for i, (sync, slots) in enumerate(variants):
            parts = [f"{sync} sync"] if sync is not None else []
            if slots is not None and not one_count:
                parts.append(f"{slots} redundant/rank")
            name = f"{label} ({', '.join(parts)})" if parts else label
            c = EPLB_SYNC_COLORS.get(sync, color) if one_count else palette[i % len(palette)]
            series.append((key, (sync, slots), name, c))
    return series


def step_time(plt, points, out):
    shapes = sorted({p["shape"] for p in points})
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.5), squeeze=False)
    series = layer_series(points)
    for ax, shape in zip(axes[0], shapes):
        for key, variant, label, color in series:
            pts = sorted((p for p in points if p["shape"] == shape and p["system"] == key and
                          (variant is None or (p.get("replica_sync"), p.get("redundant_slots")) == variant)),
                         key=lambda p: p["maxvio"])
            if not pts:
                continue
            x = [p["maxvio"] for p in pts]
            if key == "eplb" and "redundant_slots" in pts[0] and "redundant/rank" not in label:
                label = f"{label}, {pts[0]['redundant_slots']} redundant/rank"
            ax.plot(x, [p["step_ms_overlapped"] for p in pts], "o-", color=color, label=f"{label}, overlapped")
            ax.plot(x, [p["step_ms_no_overlap"] for p in pts], "o--", color=color, alpha=0.6,
                    label=f"{label}, no overlap")
        sample = next(p for p in points if p["shape"] == shape)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("maxvio")
        ax.set_ylabel("layer step (ms)")
        ax.set_title(f"{shape}: R={sample.get('R')} E={sample.get('E')} K={sample.get('K')}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def workload_run(plt, path, out_dir):
    with open(path) as f:
        data = json.load(f)
    if data.get("schema") != "evenep.workload_run/1" or not data.get("systems"):
        sys.stderr.write("plots.py: {}: schema is {!r}, expected 'evenep.workload_run/1' with systems\n".format(
            path, data.get("schema")))
        sys.exit(2)
    name = data.get("workload") or os.path.splitext(os.path.basename(data.get("trace") or "trace"))[0]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for system in data["systems"]:
        steps = range(len(system["step_ms"]))
        ours = system["name"].startswith("evenep")
        ax.plot(steps, system["step_ms"], "-" if ours else "--", linewidth=2 if ours else 1,
                label=system.get("label", system["name"]))
    ax.set_xlabel("step")
    # bench layer (it names the shape): measured compute, modelled link phases; simulate: the step model
    ax.set_ylabel("step (ms): measured compute + modelled links" if data.get("shape") else "modelled step (ms)")
    ax.set_title("{}: R={} E={} K={} S={}, {} micro-batch(es), {} layer(s)".format(
        name, data.get("R"), data.get("E"), data.get("K"), data.get("S"), data.get("micro_batches"),
        data.get("layers")), fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    tag = data.get("shape") or "R{}".format(data.get("R"))
    out = os.path.join(out_dir, "workload_{}_{}.png".format(name, tag))
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return os.path.basename(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--simulate", help="evenep simulate --json output (evenep.simulate/1)")
    ap.add_argument("--layer", help="GPU layer-step JSON (evenep.layer_step/1); the step-time plot needs it")
    ap.add_argument("--workload-run", nargs="+", default=[],
                    help="evenep simulate / bench layer --workload|--trace --json outputs (evenep.workload_run/1)")
    ap.add_argument("--out", default="docs/img", help="output folder (default docs/img)")
    ap.add_argument("--rows-R", type=int, default=64, help="R of the per-rank rows plot (default 64)")
    ap.add_argument("--rows-maxvio", type=float, default=10.0, help="maxvio of the per-rank rows plot (default 10)")
    args = ap.parse_args()
    if not args.simulate and not args.layer and not args.workload_run:
        ap.error("give --simulate FILE, --layer FILE and/or --workload-run FILE...")
    plt = need_matplotlib()
    os.makedirs(args.out, exist_ok=True)
    written = []
    if args.simulate:
        points = load(args.simulate, "evenep.simulate/1")
        scale_model(plt, points, os.path.join(args.out, "scale_model.png"))
        rows_per_rank(plt, points, os.path.join(args.out, "rows_per_rank.png"), args.rows_R, args.rows_maxvio)
        written += ["scale_model.png", "rows_per_rank.png"]
    if args.layer:
        step_time(plt, load(args.layer, "evenep.layer_step/1"), os.path.join(args.out, "step_time_vs_maxvio.png"))
        written.append("step_time_vs_maxvio.png")
    for path in args.workload_run:
        written.append(workload_run(plt, path, args.out))
    print("wrote " + ", ".join(os.path.join(args.out, w) for w in written))


if __name__ == "__main__":
    main()
