#!/usr/bin/env python3
"""Sparse peers for `sparq bench kernels`: scipy.sparse and torch.sparse CSR times for
Y = X W^T on the same shapes / patterns / token counts (2:4 and unstructured rows only).

Prints a JSON list of {m, k, n, threads, pattern, peer, median_s} on stdout; progress on stderr.
Weights are seeded uniform [-1, 1) pruned by magnitude to the pattern, like the C++ side.
scipy is single-threaded (its row for 2 threads repeats the 1-thread time); torch uses
torch.set_num_threads. Calls longer than 0.5 s are timed once. Rows with n <= 16 cycle through
copies of the weight totalling --rotate-bytes (the C++ side passes its own figure, twice the
last-level cache), so that the weights come from memory as a model's layers do.
"""
import argparse
import json
import sys
import time

import numpy as np


def prune(w, pattern):
    if pattern == "2:4":
        g = np.abs(w).reshape(w.shape[0], -1, 4)
        order = np.argsort(g, axis=2)
        mask = np.ones_like(g, dtype=bool)
        np.put_along_axis(mask, order[:, :, :2], False, axis=2)
        return (w.reshape(g.shape) * mask).reshape(w.shape)
    if pattern.startswith("unstructured:"):
        f = float(pattern.split(":")[1])
        if f <= 0:
            return w
        thr = np.quantile(np.abs(w), f)
        return np.where(np.abs(w) > thr, w, 0).astype(np.float32)
    return None


class Rotation:
    """Calls fn(copy) on the next of `copies` in turn (the position persists across calls)."""

    def __init__(self, copies):
        self.copies, self.i = copies, 0

    def __call__(self, fn):
        c = self.copies[self.i % len(self.copies)]
        self.i += 1
        return fn(c)


def median_time(fn, reps):
    fn()
    t0 = time.perf_counter()
    fn()
    once = time.perf_counter() - t0
    reps = 1 if once > 0.5 else reps
    ts = []
    for _ in range(reps):
        inner = max(1, int(2e-3 / max(once, 1e-9)))
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        ts.append((time.perf_counter() - t0) / inner)
    return float(np.median(ts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--n", required=True)
    ap.add_argument("--patterns", required=True)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rotate-bytes", type=int, default=0)
    a = ap.parse_args()
    try:
        import scipy.sparse as sp
    except ImportError:
        sp = None
    try:
        import torch
    except ImportError:
        torch = None
    missing = [name for name, mod in (("scipy", sp), ("torch", torch)) if mod is None]
    if missing:
        print(f"sparse peers: {', '.join(missing)} not installed, no rows for "
              f"{' or '.join(missing)} (.venv/bin/pip install {' '.join(missing)})", file=sys.stderr)
    rows = []
    rng = np.random.default_rng(42)
    for shape in a.shapes.split(","):
        m, k = (int(v) for v in shape.split("x"))
        w0 = rng.uniform(-1, 1, size=(m, k)).astype(np.float32)
        nmax = max(int(v) for v in a.n.split(","))
        x = rng.uniform(-1, 1, size=(nmax, k)).astype(np.float32)
        for pattern in a.patterns.split(","):
            w = prune(w0, pattern)
            if w is None:
                continue
            nnz = int(np.count_nonzero(w))
            # CSR bytes: a 4-byte value and a 4-byte (scipy) or 8-byte (torch) index per nonzero.
            copies = 1 if a.rotate_bytes <= 0 else max(1, -(-a.rotate_bytes // (nnz * 8 + 4 * m)))
            ws = [sp.csr_matrix(w) for _ in range(copies)] if sp else None
            wt = [torch.from_numpy(w).to_sparse_csr() for _ in range(copies)] if torch else None
            for n in (int(v) for v in a.n.split(",")):
                xt = np.ascontiguousarray(x[:n].T)
                rot = slice(None) if n <= 16 else slice(0, 1)
                scipy_s = None
                for t in (int(v) for v in a.threads.split(",")):
                    if ws is not None:
                        if scipy_s is None:
                            r = Rotation(ws[rot])
                            scipy_s = median_time(lambda: r(lambda c: c @ xt), a.repeats)
                        rows.append(dict(m=m, k=k, n=n, threads=t, pattern=pattern, peer="scipy",
                                         median_s=scipy_s))
                    if wt is not None:
                        torch.set_num_threads(t)
                        xtt = torch.from_numpy(xt)
                        r = Rotation(wt[rot])
                        s = median_time(lambda: r(lambda c: torch.sparse.mm(c, xtt)), a.repeats)
                        rows.append(dict(m=m, k=k, n=n, threads=t, pattern=pattern, peer="torch",
                                         median_s=s))
                    print(f"{m}x{k} {pattern} n={n} t={t} done", file=sys.stderr)
    json.dump(rows, sys.stdout)


if __name__ == "__main__":
    main()
