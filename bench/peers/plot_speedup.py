#!/usr/bin/env python3
"""Speedup vs sparsity per token count from `sparq bench kernels --json` rows (dense peer = 1).

usage: plot_speedup.py ROWS.json OUT.png|OUT.svg
Uses the first shape, the largest thread count and f32 values; one line per n, markers per pattern family.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def sparsity(p):
    if p.startswith("unstructured:"):
        return float(p.split(":")[1])
    if p.startswith("block:"):
        return float(p.split(":")[2]) if p.count(":") == 2 else 0.5
    parts = p.split(":")
    if p.startswith("vnm:"):
        return 1 - int(parts[2]) / int(parts[3])
    return 1 - int(parts[0]) / int(parts[1])


def main():
    rows = json.load(open(sys.argv[1]))
    rows = [r for r in rows if r["values"] == "f32" and r.get("speedup")]
    if not rows:
        sys.exit("no f32 rows to plot")
    tmax = max(r["threads"] for r in rows)
    shape = (rows[0]["m"], rows[0]["k"])  # one shape per plot: the first in the run
    rows = [r for r in rows if r["threads"] == tmax and (r["m"], r["k"]) == shape]
    fams = {"unstructured": "o-", "block": "s", "vnm": "^", "nm": "D"}
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=90)
    ns = sorted({r["n"] for r in rows})
    for i, n in enumerate(ns):
        color = plt.cm.viridis(i / max(1, len(ns) - 1))
        for fam, style in fams.items():
            pts = sorted((sparsity(r["pattern"]), r["speedup"]) for r in rows if r["n"] == n and
                         (r["pattern"].startswith(fam) or (fam == "nm" and r["pattern"][0].isdigit())))
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.plot(xs, ys, style, color=color, ms=4,
                    label=f"n={n}" if fam == "unstructured" or not any(
                        r["pattern"].startswith("unstructured") for r in rows) else None)
    ax.axhline(1.0, color="gray", lw=1, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("sparsity (o unstructured, s block, ^ V:N:M, D N:M)")
    ax.set_ylabel("speedup vs best dense library")
    r0 = rows[0]
    ax.set_title(f"sparq, W {shape[0]}x{shape[1]}, {tmax} threads; measured peak {r0['peak_fma_gflops']:.0f} GFLOP/s, "
                 f"{r0['read_gbps']:.0f} GB/s", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    # Drawn to a temporary file beside the target, then renamed: never a half-written image.
    root, ext = os.path.splitext(sys.argv[2])
    tmp = f"{root}.tmp{os.getpid()}{ext}"
    try:
        fig.savefig(tmp)
        os.replace(tmp, sys.argv[2])
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


if __name__ == "__main__":
    main()
