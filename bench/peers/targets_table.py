#!/usr/bin/env python3
"""Issue 3's targets table from `sparq bench kernels --json` rows (one or more files).

usage: targets_table.py ROWS.json [MORE.json ...] [--threads 2]
Prints a markdown table: target, shape, achieved speedup vs the best dense peer (and vs our
bf16 dense where the target says so), vs the best sparse peer, and met / missed; the ratio last.
"""
import argparse
import json

TARGETS = [  # (n, pattern, values, key, bar, label)
    (1, "2:4", "f32", "speedup", 1.7, ">= 1.7x (ideal by bytes 1.88x)"),
    (1, "2:4", "bf16", "speedup_vs_bf16_dense", 1.6, ">= 1.6x vs our bf16 dense"),
    (1, "2:4", "bf16", "speedup", 3.2, ">= 3.2x vs f32 dense"),
    (1, "unstructured:0.9", "bf16", "speedup", 7.0, ">= 7x vs f32 dense (bf16 + u16)"),
    (512, "2:4", "f32", "speedup", 1.5, ">= 1.5x (ideal by FMAs 2x)"),
    (512, "vnm:16:2:4", "f32", "speedup", 1.75, ">= 1.75x"),
    (512, "vnm:32:2:4", "f32", "speedup", 1.75, ">= 1.75x"),
    (512, "block:32x32:0.9", "f32", "speedup", 6.0, ">= 6x"),
    (512, "unstructured:0.9", "f32", "speedup", 4.0, ">= 4x"),
    (512, "unstructured:0.99", "f32", "speedup", 20.0, ">= 20x"),
    (1, "unstructured:0.5", "f32", "speedup", 1.0, "> 1x (break-even)"),
    (512, "unstructured:0.5", "f32", "speedup", 1.0, "> 1x (break-even)"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    rows = []
    for f in a.files:
        rows += json.load(open(f))
    print("| n | pattern | values | shape | target | sparq ms | best dense peer | peer ms | achieved "
          "| vs best sparse peer | met |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    met = total = 0
    for n, pat, val, key, bar, label in TARGETS:
        for r in rows:
            if (r["n"], r["pattern"], r["values"], r["threads"]) != (n, pat, val, a.threads):
                continue
            if key not in r:
                continue
            ach = r[key]
            sp = r.get("speedup_vs_sparse_peer")
            sp_txt = f"{sp:.1f}x ({r['sparse_peer']})" if sp else "-"
            ok = ach >= bar if bar > 1 else ach > bar
            met += ok
            total += 1
            peer = "our bf16 dense" if key == "speedup_vs_bf16_dense" else r["peer"]
            peer_s = r["bf16_dense_median_s"] if key == "speedup_vs_bf16_dense" else r["peer_median_s"]
            print(f"| {n} | {pat} | {val} | {r['m']}x{r['k']} | {label} | {r['median_s']*1e3:.2f} | "
                  f"{peer} | {peer_s*1e3:.2f} | **{ach:.2f}x** | {sp_txt} | {'yes' if ok else 'NO'} |")
    print(f"\ntargets met: {met} / {total}")


if __name__ == "__main__":
    main()
