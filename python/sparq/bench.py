"""python -m sparq.bench: sparq.torch.SparseLinear (2:4, f32) beside torch.nn.Linear (dense f32)
on this CPU, in one run, with the same threads.

Each row times both layers on the same x (the same 2:4-pruned weight; torch's is dense with
zeros), interleaved (sparse, dense, sparse, dense, ...) so a slow phase of a shared machine hits
both, and reports medians and the ratio dense time / sparse time (> 1: sparq is faster). A
third column times sparq.Linear on the NumPy view of the same x: SparseLinear's time minus it is
the torch wrapper's overhead. Needs torch. A benchmark: it decides nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def _time_block(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def _iters_for(fn, target_s: float) -> int:
    fn()  # warm up (packing, caches, thread pools)
    t = _time_block(fn, 1)
    return max(1, min(10_000, int(target_s / max(t, 1e-7))))


def bench_row(m: int, k: int, n: int, threads: int, repeats: int, target_s: float, seed: int):
    import torch
    import sparq
    from sparq.torch import SparseLinear

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k)).astype(np.float32)
    w = sparq.prune(w, "2:4", method="magnitude", threads=threads).weight
    x = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
    sl = SparseLinear(w, pattern="2:4", threads=threads)
    dense = torch.nn.Linear(k, m, bias=False)
    with torch.no_grad():
        dense.weight.copy_(torch.from_numpy(w))
    xn = x.numpy()
    with torch.inference_mode():
        fns = {"sparse": lambda: sl(x), "dense": lambda: dense(x),
               "sparq_numpy": lambda: sl._lin(xn)}
        iters = {name: _iters_for(fn, target_s) for name, fn in fns.items()}
        times = {name: [] for name in fns}
        for _ in range(repeats):  # interleaved
            for name, fn in fns.items():
                times[name].append(_time_block(fn, iters[name]))
    med = {name: statistics.median(v) for name, v in times.items()}
    return {
        "m": m, "k": k, "tokens": n, "threads": threads, "repeats": repeats,
        "sparse_format": sl.format, "isa": sl._lin.isa,
        "sparse_us": med["sparse"] * 1e6, "dense_us": med["dense"] * 1e6,
        "sparq_numpy_us": med["sparq_numpy"] * 1e6,
        "wrapper_overhead_us": (med["sparse"] - med["sparq_numpy"]) * 1e6,
        "ratio_dense_over_sparse": med["dense"] / med["sparse"],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sparq.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="576x576,4096x4096",
                   help="comma-separated MxK weight shapes (default: %(default)s)")
    p.add_argument("--tokens", default="1,512", help="comma-separated token counts (default: "
                   "%(default)s)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads of both sides (default: every hardware thread)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved repeats (median)")
    p.add_argument("--target-ms", type=float, default=20.0,
                   help="time of one timed block of calls, ms")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    a = p.parse_args(argv)
    # torch's OpenMP workers spin after each call (libgomp's active wait policy) and take the
    # cores sparq's pool needs next: with 2 threads on 2 vCPUs that made a 576x576 1-token
    # nn.Linear 300x slower. Passive waiting (set before torch starts its runtime) is fair to both.
    omp_policy = os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch
    except ImportError:
        print("python -m sparq.bench needs torch (docs/python.md, 'Running the torch tests')",
              file=sys.stderr)
        return 2
    import sparq
    from sparq import _cpu_model, _threads

    threads = _threads(a.threads)
    torch.set_num_threads(threads)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in a.shapes.split(",")]
    tokens = [int(t) for t in a.tokens.split(",")]
    if not a.json:
        print(f"# CPU: {_cpu_model() or 'unknown'}; threads {threads} (sparq and torch); torch "
              f"{torch.__version__}; OMP_WAIT_POLICY={omp_policy}; medians of {a.repeats} interleaved "
              f"repeats, seed {a.seed}")
        print(f"{'shape':>11} {'tokens':>6} {'SparseLinear 2:4 us':>20} {'nn.Linear f32 us':>17} "
              f"{'sparq.Linear us':>16} {'wrapper us':>10} {'dense/sparse':>12}")
    for m, k in shapes:
        for n in tokens:
            r = bench_row(m, k, n, threads, a.repeats, a.target_ms / 1e3, a.seed)
            r["cpu_model"], r["torch"], r["omp_wait_policy"] = (_cpu_model(), torch.__version__,
                                                                omp_policy)
            if a.json:
                print(json.dumps(r), flush=True)
            else:
                print(f"{m:>5}x{k:<5} {n:>6} {r['sparse_us']:>20.1f} {r['dense_us']:>17.1f} "
                      f"{r['sparq_numpy_us']:>16.1f} {r['wrapper_overhead_us']:>10.1f} "
                      f"{r['ratio_dense_over_sparse']:>11.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
