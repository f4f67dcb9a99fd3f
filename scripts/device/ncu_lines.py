#!/usr/bin/env python3
"""Warp-stall samples of one kernel by CUDA source line (the header that a line comes from included), from an ncu
report's SASS source page and the line table of the same binary (issue 13: "profile first, say where the time went").

  ncu ... --section SourceCounters --warp-sampling-interval 0 -o prof <cmd>
  ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv
  cuobjdump -xelf all build/src/CMakeFiles/evenep_cuda.dir/cuda/kernels/plan.cu.o && nvdisasm -g -c plan.*.cubin > dis.txt
  python3 ncu_lines.py sass.csv dis.txt plan_only_kernelILi512ELb1 [--top 45]

ncu's own CUDA source page attributes inlined code only to the kernel's file; nvdisasm -g gives every instruction its
innermost file:line, so samples of the planner's inlined headers (plan_fill.cuh, plan_block.cuh, ...) land on their
own lines. Samples after a barrier are counted on the instruction after it ("barrier": warps waiting there).
"""
import argparse
import collections
import csv
import io
import re


def line_table(path, kernel):
    """Instruction offset -> (file name, line) of the first .text section whose name contains `kernel`."""
    table, cur, inside = {}, None, False
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith(".text.") or line.startswith("//---------------------"):
                inside = line.startswith(".text.") and kernel in line
                continue
            if not inside:
                continue
            m = re.search(r'//## File "([^"]+)", line (\d+)', line)
            if m:
                cur = (m.group(1).split("/")[-1], int(m.group(2)))
                continue
            m = re.match(r"\s+/\*([0-9a-f]{4,})\*/", line)
            if m and cur:
                table[int(m.group(1), 16)] = cur
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass_csv")
    ap.add_argument("disasm")
    ap.add_argument("kernel", help="a substring of the kernel's mangled name")
    ap.add_argument("--top", type=int, default=45)
    a = ap.parse_args()
    table = line_table(a.disasm, a.kernel)
    if not table:
        raise SystemExit(f"ncu_lines: no .text section with '{a.kernel}' in {a.disasm}")
    lines = open(a.sass_csv, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if "Sampling (All" in l), None)
    if start is None:
        raise SystemExit(f"ncu_lines: no 'Warp Stall Sampling (All Samples)' column in {a.sass_csv}")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    hdr = rows[0]
    i_all = next(i for i, h in enumerate(hdr) if "Sampling (All" in h)
    i_addr = hdr.index("Address")
    i_reasons = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    samples = collections.defaultdict(float)
    reasons = collections.defaultdict(lambda: collections.defaultdict(float))
    base, total = None, 0.0
    for r in rows[1:]:
        try:
            addr, v = int(r[i_addr], 16), float(r[i_all].replace(",", "") or 0)
        except (ValueError, IndexError):
            continue
        base = addr if base is None else base
        key = table.get(addr - base, ("?", 0))
        samples[key] += v
        total += v
        for i in i_reasons:
            try:
                x = float(r[i].replace(",", "") or 0)
            except (ValueError, IndexError):
                continue
            if x:
                reasons[key][hdr[i][len("stall_"):]] += x
    total = total or 1.0
    by_file = collections.defaultdict(float)
    for (name, _), v in samples.items():
        by_file[name] += v
    print(f"{a.kernel}: {int(total)} samples, {len(table)} instructions mapped")
    print("by file: " + ", ".join(f"{n} {100 * v / total:.1f}%" for n, v in sorted(by_file.items(), key=lambda x: -x[1])))
    for (name, ln), v in sorted(samples.items(), key=lambda x: -x[1])[: a.top]:
        top = sorted(reasons[(name, ln)].items(), key=lambda x: -x[1])[:3]
        print(f"{100 * v / total:5.1f}%  {name}:{ln:<5} " + ", ".join(f"{k} {100 * x / total:.1f}" for k, x in top))


if __name__ == "__main__":
    main()
