#!/usr/bin/env python3
"""Sums an Nsight Compute CSV per kernel: the per-kernel table of
reports/perf-h200.md.

The CSV comes from a bench run whose batch-1 decode steps are the only
thing inside the profiler's range (bench_gpu --profile-decode), e.g.

  ncu --profile-from-start off --clock-control none --cache-control none \\
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \\
      --csv --print-units base --log-file ncu.csv \\
      build-gpu/bench_gpu --layers 12 --prefill 256 --reps 1 --profile-decode
  harness/ncu_kernels.py ncu.csv --steps 4

Each line: a kernel (with --by-grid, a kernel and grid size), its launches
per step, its time per step and per launch (gpu__time_duration: the kernel
alone, as Nsight Compute serialises launches, so the sum exceeds a step that
overlaps them) and the DRAM bytes it read over that time. Sorted by time.
"""
import argparse
import collections
import csv
import re
import sys


def fail(msg):
    """Bad input: one line naming the file or field, exit 2."""
    print(f"ncu_kernels: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu --csv --print-units base output")
    ap.add_argument("--steps", type=int, default=1, help="decode steps inside the range (default 1)")
    ap.add_argument("--by-grid", action="store_true", help="one line per kernel and grid size")
    a = ap.parse_args()
    if a.steps < 1:
        fail("--steps must be at least 1")
    try:
        with open(a.csv, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        fail(f"{a.csv}: {e.strerror}")
    head = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if head is None:
        fail(f"{a.csv}: no header row starting with \"ID\" (not ncu --csv output)")
    col = {name: i for i, name in enumerate(rows[head])}
    for need in ("ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Value"):
        if need not in col:
            fail(f"{a.csv}: no column \"{need}\"")
    launches = {}
    for r in rows[head + 1:]:
        if len(r) < len(col):
            continue
        key = (r[col["ID"]], r[col["Kernel Name"]], r[col["Grid Size"]])
        try:
            launches.setdefault(key, {})[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
        except ValueError:
            fail(f"{a.csv}: launch {key[0]}: metric value \"{r[col['Metric Value']]}\" is not a number "
                 "(use --print-units base)")
    total = collections.defaultdict(lambda: [0, 0.0, 0.0])
    ns = dram = 0.0
    for (_, name, grid), m in launches.items():
        base = re.sub(r"^void ", "", re.sub(r"\(.*", "", name))
        t = total[(base, grid) if a.by_grid else (base, "")]
        t[0] += 1
        t[1] += m.get("gpu__time_duration.sum", 0.0)
        t[2] += m.get("dram__bytes_read.sum", 0.0)
        ns += m.get("gpu__time_duration.sum", 0.0)
        dram += m.get("dram__bytes_read.sum", 0.0)
    s = a.steps
    print(f"{len(launches)} launches in {s} steps: {ns / 1e3 / s:.1f} us of kernels and "
          f"{dram / 1e6 / s:.1f} MB read from DRAM per step")
    for (name, grid), (n, t, b) in sorted(total.items(), key=lambda kv: -kv[1][1]):
        label = f"{name} {grid}" if grid else name
        print(f"  {label[:56]:56s} {n / s:6.1f}/step {t / 1e3 / s:8.1f} us/step {t / n / 1e3:7.2f} us each "
              f"{b / t if t else 0:7.1f} GB/s")


if __name__ == "__main__":
    main()
