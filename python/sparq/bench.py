"""python -m sparq.bench: sparq.torch.SparseLinear (2:4, f32) beside what PyTorch offers for the
same pruned weight on this CPU, in one run, with the same threads.

Each layer row times, on the same x and the same 2:4-pruned weight: SparseLinear; torch.nn.Linear
dense f32 (zeros kept) and dense bf16 (weight and x in bf16); the weight as a torch CSR tensor
(`to_sparse_csr`, times x^T); and torch's semi-structured 2:4 tensor where this torch builds one
on the CPU (its kernels are CUDA-only so far: the column then says n/a). The peers run
interleaved with SparseLinear (a slow phase of a shared machine hits all), medians, and each
ratio is peer time / SparseLinear time (> 1: sparq is faster). `sparq.Linear` on the NumPy view
of x gives the torch wrapper's overhead. MLP rows time a Llama MLP block (gate, up, SiLU, down)
dense in torch against the same module after `sparq.torch.sparsify_(..., "2:4")`. Needs torch.
A benchmark: it decides nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

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


def _timed(fns: dict, repeats: int, target_s: float) -> dict:
    """Median seconds per call of each fn, timed in interleaved blocks."""
    iters = {name: _iters_for(fn, target_s) for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(repeats):  # interleaved
        for name, fn in fns.items():
            times[name].append(_time_block(fn, iters[name]))
    return {name: statistics.median(v) for name, v in times.items()}


def _semi_structured(w_t):
    """torch's semi-structured 2:4 tensor of w_t, or the reason there is none on this CPU."""
    try:
        from torch.sparse import to_sparse_semi_structured
        return to_sparse_semi_structured(w_t), ""
    except Exception as e:  # CUDA-only kernels, or a torch without it
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


PEERS = ("f32", "bf16", "csr", "semi")


def bench_row(m: int, k: int, n: int, threads: int, repeats: int, target_s: float, seed: int,
              peers=PEERS):
    import torch
    import sparq
    from sparq.torch import SparseLinear

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k)).astype(np.float32)
    w = sparq.prune(w, "2:4", method="magnitude", threads=threads).weight
    x = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
    sl = SparseLinear(w, pattern="2:4", threads=threads)
    w_t = torch.from_numpy(w)
    xn = x.numpy()
    fns = {"sparse": lambda: sl(x), "sparq_numpy": lambda: sl._lin(xn)}
    semi_note = ""
    if "f32" in peers:
        dense = torch.nn.Linear(k, m, bias=False)
        with torch.no_grad():
            dense.weight.copy_(w_t)
        fns["f32"] = lambda: dense(x)
    if "bf16" in peers:
        dense16 = torch.nn.Linear(k, m, bias=False).to(torch.bfloat16)
        with torch.no_grad():
            dense16.weight.copy_(w_t.to(torch.bfloat16))
        x16 = x.to(torch.bfloat16)
        fns["bf16"] = lambda: dense16(x16)
    if "csr" in peers:
        with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
            warnings.simplefilter("ignore", UserWarning)
            w_csr = w_t.to_sparse_csr()
        x_t = x.t().contiguous()
        fns["csr"] = lambda: w_csr @ x_t  # [m, n]: the product itself, Y^T, no transpose back
    if "semi" in peers:
        w_semi, semi_note = _semi_structured(w_t)
        if w_semi is not None:
            try:
                with torch.inference_mode():
                    w_semi @ x.t()
                fns["semi"] = lambda: w_semi @ x.t()
            except Exception as e:
                semi_note = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    with torch.inference_mode():
        med = _timed(fns, repeats, target_s)
    row = {
        "kind": "linear", "m": m, "k": k, "tokens": n, "threads": threads, "repeats": repeats,
        "sparse_format": sl.format, "isa": sl._lin.isa,
        "sparse_us": med["sparse"] * 1e6,
        "sparq_numpy_us": med["sparq_numpy"] * 1e6,
        "wrapper_overhead_us": (med["sparse"] - med["sparq_numpy"]) * 1e6,
    }
    for peer in peers:
        row[f"{peer}_us"] = med[peer] * 1e6 if peer in med else None
        row[f"{peer}_over_sparse"] = med[peer] / med["sparse"] if peer in med else None
    if "semi" in peers and "semi" not in med:
        row["semi_note"] = semi_note
    # the key of the first version of this benchmark
    if "f32" in med:
        row["dense_us"] = row["f32_us"]
        row["ratio_dense_over_sparse"] = row["f32_over_sparse"]
    return row


def bench_mlp(hidden: int, ff: int, n: int, threads: int, repeats: int, target_s: float,
              seed: int):
    """A Llama MLP block (down(silu(gate x) * up x)), dense f32 in torch against the same module
    sparsified to 2:4 (magnitude) by sparq.torch.sparsify_."""
    import copy
    import torch
    from torch import nn
    from sparq.torch import sparsify_

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(hidden, ff, bias=False)
            self.up_proj = nn.Linear(hidden, ff, bias=False)
            self.down_proj = nn.Linear(ff, hidden, bias=False)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    torch.manual_seed(seed)
    dense = Mlp()
    sparse = copy.deepcopy(dense)
    sparsify_(sparse, "2:4", method="magnitude")
    # the dense side runs the pruned weights (zeros kept): the same products
    with torch.no_grad():
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(dense, name).weight.copy_(getattr(sparse, name).to_dense())
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        med = _timed({"sparse": lambda: sparse(x), "f32": lambda: dense(x)}, repeats, target_s)
    return {"kind": "mlp", "m": ff, "k": hidden, "tokens": n, "threads": threads,
            "repeats": repeats, "sparse_us": med["sparse"] * 1e6, "f32_us": med["f32"] * 1e6,
            "f32_over_sparse": med["f32"] / med["sparse"]}


def _fmt_us(v):
    return "n/a" if v is None else (f"{v:.1f}" if v < 1e4 else f"{v:.0f}")


def _fmt_ratio(v):
    return "" if v is None else f"({v:.2f}x)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sparq.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="576x576,4096x4096,11008x4096",
                   help="comma-separated MxK weight shapes (default: %(default)s)")
    p.add_argument("--tokens", default="1,512", help="comma-separated token counts (default: "
                   "%(default)s)")
    p.add_argument("--mlp", default="576x1536,4096x11008",
                   help="comma-separated HIDDENxFF Llama MLP blocks ('' for none; default: "
                   "%(default)s: SmolLM2's and Llama-7B's)")
    p.add_argument("--peers", default=",".join(PEERS),
                   help="torch peers of the layer rows (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads of both sides (default: every hardware thread)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved repeats (median)")
    p.add_argument("--target-ms", type=float, default=20.0,
                   help="time of one timed block of calls, ms")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    a = p.parse_args(argv)
    peers = tuple(v for v in a.peers.split(",") if v)
    unknown = [v for v in peers if v not in PEERS]
    if unknown:
        p.error(f"--peers: unknown {', '.join(unknown)} (known: {', '.join(PEERS)})")
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

    def dims(text):
        return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]

    tokens = [int(t) for t in a.tokens.split(",")]
    meta = {"cpu_model": _cpu_model(), "torch": torch.__version__, "omp_wait_policy": omp_policy}
    if not a.json:
        print(f"# CPU: {_cpu_model() or 'unknown'}; threads {threads} (sparq and torch); torch "
              f"{torch.__version__}; OMP_WAIT_POLICY={omp_policy}; medians of {a.repeats} "
              f"interleaved repeats, seed {a.seed}; microseconds per call, (peer / SparseLinear)")
        head = "".join(f" {'torch ' + peer:>22}" for peer in peers)
        print(f"{'shape':>11} {'tokens':>6} {'SparseLinear 2:4':>16}{head} {'wrapper':>8}")
    semi_notes = set()
    for m, k in dims(a.shapes):
        for n in tokens:
            r = bench_row(m, k, n, threads, a.repeats, a.target_ms / 1e3, a.seed, peers)
            r.update(meta)
            if a.json:
                print(json.dumps(r), flush=True)
                continue
            cols = "".join(f" {_fmt_us(r[peer + '_us']) + ' ' + _fmt_ratio(r[peer + '_over_sparse']):>22}"
                           for peer in peers)
            print(f"{m:>5}x{k:<5} {n:>6} {_fmt_us(r['sparse_us']):>16}{cols} "
                  f"{r['wrapper_overhead_us']:>8.1f}", flush=True)
            if r.get("semi_note"):
                semi_notes.add(r["semi_note"])
    for note in sorted(semi_notes):
        print(f"# torch semi: n/a here ({note})")
    mlps = dims(a.mlp)
    if mlps and not a.json:
        print(f"{'MLP h x ff':>11} {'tokens':>6} {'sparsify_ 2:4':>16} {'torch dense f32':>22}")
    for hidden, ff in mlps:
        for n in tokens:
            r = bench_mlp(hidden, ff, n, threads, a.repeats, a.target_ms / 1e3, a.seed)
            r.update(meta)
            if a.json:
                print(json.dumps(r), flush=True)
                continue
            print(f"{hidden:>5}x{ff:<5} {n:>6} {_fmt_us(r['sparse_us']):>16} "
                  f"{_fmt_us(r['f32_us']) + ' ' + _fmt_ratio(r['f32_over_sparse']):>22}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
