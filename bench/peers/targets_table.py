#!/usr/bin/env python3
"""The kernel targets table from `sparq bench kernels --json` rows (one or more files).

usage: targets_table.py ROWS.json [MORE.json ...] [--threads 2]

Prints a markdown table: target, shape, the achieved ratio against the best dense peer (or our
bf16 dense where the target says so), the machine limits measured in the same run, and the
kernel's fraction of its binding limit; the verdict last. A row is "met" when the ratio reaches the
bar, "limit" when it does not but the kernel runs at >= 85% of the binding limit (the bar is then
beyond what this machine allows), and "NO" otherwise.

The binding limit is the largest lower bound on the kernel's time among what it must do:
  read: its weight bytes at the measured read bandwidth (every row: the weights are streamed);
  fma:  its useful FMAs at the peak FMA rate;
  ldfma: its useful FMAs at the rate with one L1 load per FMA, for kernels whose every FMA needs a
         load of its own (the row kernels: N:M, CSR, bit mask; rows that share columns reuse loads).
The JSON key `bound` (when the benchmark gives it) names which of fma / ldfma applies; otherwise it
is inferred from the kernel's name.
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

LIMIT_FRACTION = 0.85  # a miss is accepted only at >= 85% of the binding limit


def compute_bound(r):
    """'fma' or 'ldfma' for the compute side of row r."""
    if r.get("bound") in ("fma", "ldfma"):
        return r["bound"]
    name = r.get("kernel", "").lower()
    shares_loads = any(s in name for s in ("rowgroup", "scg", "bsr", "vnm", "dense"))
    return "fma" if shares_loads and "csr" not in name else "ldfma"


def binding(r):
    """(limit name, seconds at that limit) for row r, from the machine limits of its run."""
    flops = 2.0 * r["n"] * r["nnz"]
    bounds = {"read": r["weight_bytes"] / (r["read_gbps"] * 1e9)}
    key = compute_bound(r)
    rate = r["load_fma_gflops"] if key == "ldfma" else r["peak_fma_gflops"]
    bounds[key] = flops / (rate * 1e9)
    name = max(bounds, key=bounds.get)
    return name, bounds[name]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    rows = []
    for f in a.files:
        rows += json.load(open(f))
    machine = next((r for r in rows if r["threads"] == a.threads), None)
    if machine:
        print(f"CPU: {machine.get('cpu_model', '?')}, ISA {machine.get('isa', '?')}, "
              f"{a.threads} thread(s); limits of the same run: peak FMA "
              f"{machine['peak_fma_gflops']:.0f} GFLOP/s, with one L1 load per FMA "
              f"{machine['load_fma_gflops']:.0f}, read bandwidth {machine['read_gbps']:.1f} GB/s\n")
    print("| n | pattern | values | shape | target | sparq ms | peer | peer ms | achieved "
          "| binding limit | fraction of it | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    met = limit = total = 0
    for n, pat, val, key, bar, label in TARGETS:
        for r in rows:
            if (r["n"], r["pattern"], r["values"], r["threads"]) != (n, pat, val, a.threads):
                continue
            if key not in r:
                continue
            ach = r[key]
            ok = ach >= bar if bar > 1 else ach > bar
            bname, bsec = binding(r)
            frac = bsec / r["median_s"]
            verdict = "met" if ok else ("limit" if frac >= LIMIT_FRACTION else "NO")
            met += ok
            limit += (not ok) and frac >= LIMIT_FRACTION
            total += 1
            peer = "our bf16 dense" if key == "speedup_vs_bf16_dense" else r["peer"]
            peer_s = r["bf16_dense_median_s"] if key == "speedup_vs_bf16_dense" else r["peer_median_s"]
            print(f"| {n} | {pat} | {val} | {r['m']}x{r['k']} | {label} | {r['median_s']*1e3:.2f} | "
                  f"{peer} | {peer_s*1e3:.2f} | **{ach:.2f}x** | {bname} | {frac*100:.0f}% | "
                  f"{verdict} |")
    print(f"\ntargets met: {met} / {total}; missed at >= {LIMIT_FRACTION:.0%} of the binding limit: "
          f"{limit}; missed: {total - met - limit}")


if __name__ == "__main__":
    main()
