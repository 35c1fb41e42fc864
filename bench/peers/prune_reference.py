#!/usr/bin/env python3
"""An independent NumPy implementation of sequential one-shot pruning of the SmolLM2 GGUF, to check
`sparq prune` + `sparq eval` end to end (not only layer by layer).

    .venv/bin/pip install tokenizers        # gguf and numpy: scripts/install_deps.sh
    .venv/bin/python bench/peers/prune_reference.py MODEL.gguf --method wanda|sparsegpt|dense \
        --calib data/text/sherlock-holmes-pg1661.txt --calib-samples 16 --calib-len 512 \
        --text data/text/wikitext-2-raw-test.txt --ctx 512 --max-tokens 4096

Nothing here comes from sparq: weights are dequantized by the `gguf` package, token ids come from
Hugging Face `tokenizers`, the forward pass is written from llama.cpp's LLM_ARCH_LLAMA graph (as in
tests/model/make_reference.py) and the pruning methods from their papers:
- Wanda (Sun et al. 2024): score |W_ij| * ||X_j||_2, the lowest half of each output row pruned.
- SparseGPT (Frantar & Alistarh 2023): H = X^T X + 1% mean(diag) I, U the upper Cholesky factor of
  H^-1, columns in blocks of 128; each block's mask keeps the largest w^2 / U_jj^2 over the whole
  block, each column's error is spread over the remaining columns, all in float64.
Calibration follows the same procedure as sparq's (so that the two perplexities are comparable):
the same calibration windows (std::mt19937_64(seed) offsets, reproduced below), the inputs of
q/k/v, attn_output, gate/up and ffn_down collected from the dense block, then the block's outputs
recomputed with the pruned weights for the next block. Prints one JSON line.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "model"))
from make_reference import load_gguf  # noqa: E402  (GGUF weights/config/tokenizer, no sparq)

SLOTS = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
SLOT_INPUT = {"attn_q": 0, "attn_k": 0, "attn_v": 0, "attn_output": 1, "ffn_gate": 2,
              "ffn_up": 2, "ffn_down": 3}


class Mt19937_64:
    """std::mt19937_64 (the C++ standard's 64-bit Mersenne Twister), for the calibration offsets."""
    N, M, MASK = 312, 156, (1 << 64) - 1

    def __init__(self, seed):
        self.mt = [0] * self.N
        self.mt[0] = seed & self.MASK
        for i in range(1, self.N):
            prev = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & self.MASK
        self.i = self.N

    def __call__(self):
        if self.i >= self.N:
            upper, lower = 0xFFFFFFFF80000000, 0x7FFFFFFF
            for j in range(self.N):
                x = (self.mt[j] & upper) | (self.mt[(j + 1) % self.N] & lower)
                xa = x >> 1
                if x & 1:
                    xa ^= 0xB5026F5AA96619E9
                self.mt[j] = self.mt[(j + self.M) % self.N] ^ xa
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEB8F0000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & self.MASK


def wanda(w, h_diag, sparsity):
    score = np.abs(w) * np.sqrt(h_diag)[None, :]
    n_prune = int(round(w.shape[1] * sparsity))
    order = np.argsort(score, axis=1, kind="stable")[:, :n_prune]
    out = w.copy()
    np.put_along_axis(out, order, 0.0, axis=1)
    return out


def sparsegpt(w, h, sparsity, blocksize=128, percdamp=0.01):
    w = w.astype(np.float64).copy()
    h = h.copy()
    k = w.shape[1]
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += percdamp * np.mean(np.diag(h)) * np.eye(k)
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # H^-1 = U^T U, U upper
    for i1 in range(0, k, blocksize):
        i2 = min(k, i1 + blocksize)
        w1 = w[:, i1:i2].copy()
        u1 = u[i1:i2, i1:i2]
        score = w1 ** 2 / np.diag(u1)[None, :] ** 2
        n_prune = int(score.size * sparsity)
        flat = np.argsort(score, axis=None, kind="stable")[:n_prune]
        prune = np.zeros(score.size, dtype=bool)
        prune[flat] = True
        prune = prune.reshape(score.shape)
        err1 = np.zeros_like(w1)
        for j in range(i2 - i1):
            col = w1[:, j]
            q = np.where(prune[:, j], 0.0, col)
            err = (col - q) / u1[j, j]
            w1[:, j:] -= np.outer(err, u1[j, j:])
            w1[:, j] = q
            err1[:, j] = err
        w[:, i1:i2] = w1
        w[:, i2:] -= err1 @ u[i1:i2, i2:]
    return w.astype(np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--method", choices=["dense", "wanda", "sparsegpt"], default="sparsegpt")
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--calib", required=True)
    ap.add_argument("--calib-samples", type=int, default=16)
    ap.add_argument("--calib-len", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=4096)
    a = ap.parse_args()
    t0 = time.time()

    g = load_gguf(a.model, np.float32)
    W, tk = g.W, g.tk
    n_layer, d, nh, nkv, theta, eps, hd = g.n_layer, g.d, g.nh, g.nkv, g.theta, g.eps, g.hd

    emb = W("token_embd.weight")
    blocks = []
    for l in range(n_layer):
        p = f"blk.{l}."
        blocks.append({k: W(p + k + ".weight") for k in ["attn_norm", "ffn_norm"] + SLOTS})
    out_norm = W("output_norm.weight")

    def rms(x, w):
        x64 = x.astype(np.float64)
        return (x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)).astype(
            np.float32) * w

    def rope(x, heads):
        n = x.shape[0]
        x = x.reshape(n, heads, hd // 2, 2)
        ang = np.arange(n)[:, None] * theta ** (-2.0 * np.arange(hd // 2) / hd)
        c = np.cos(ang)[:, None, :].astype(np.float32)
        s = np.sin(ang)[:, None, :].astype(np.float32)
        x0, x1 = x[..., 0], x[..., 1]
        return np.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1).reshape(n, heads * hd)

    def block(b, x, taps=None):
        n = x.shape[0]
        mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
        h = rms(x, b["attn_norm"])
        q = rope(h @ b["attn_q"].T, nh).reshape(n, nh, hd)
        k = rope(h @ b["attn_k"].T, nkv).reshape(n, nkv, hd)
        v = (h @ b["attn_v"].T).reshape(n, nkv, hd)
        att = np.zeros((n, nh, hd), dtype=np.float32)
        for i in range(nh):
            g = i // (nh // nkv)
            s = q[:, i, :] @ k[:, g, :].T / np.float32(np.sqrt(hd)) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            att[:, i, :] = s @ v[:, g, :]
        att = att.reshape(n, d)
        x = x + att @ b["attn_output"].T
        f = rms(x, b["ffn_norm"])
        g = f @ b["ffn_gate"].T
        act = (g / (1 + np.exp(-g))) * (f @ b["ffn_up"].T)
        if taps is not None:
            for i, t in enumerate((h, att, f, act)):
                t64 = t.astype(np.float64)
                taps[i] += t64.T @ t64
        return x + act @ b["ffn_down"].T

    if a.method != "dense":
        with open(a.calib, encoding="utf-8") as fh:
            cal = tk.encode(fh.read(), add_special_tokens=False).ids
        rng = Mt19937_64(a.seed)
        L = a.calib_len
        starts = [rng() % (len(cal) - L) for _ in range(a.calib_samples)]
        xs = [emb[cal[s:s + L]] for s in starts]
        for l, b in enumerate(blocks):
            taps = [np.zeros((d, d)), np.zeros((d, d)), np.zeros((d, d)),
                    np.zeros((b["ffn_down"].shape[1],) * 2)]
            for x in xs:
                block(b, x, taps)
            for s in SLOTS:
                hs = taps[SLOT_INPUT[s]]
                if a.method == "wanda":
                    b[s] = wanda(b[s], np.diag(hs), a.sparsity)
                else:
                    b[s] = sparsegpt(b[s], hs, a.sparsity)
            xs = [block(b, x) for x in xs]
            print(f"block {l} pruned, {time.time() - t0:.0f} s", file=sys.stderr)

    with open(a.text, encoding="utf-8") as fh:
        ids = tk.encode(fh.read(), add_special_tokens=False).ids[:a.max_tokens]
    nll, count = 0.0, 0
    for w0 in range(0, len(ids), a.ctx):
        win = ids[w0:w0 + a.ctx]
        if len(win) < 2:
            break
        x = emb[win]
        for b in blocks:
            x = block(b, x)
        logits = (rms(x, out_norm) @ emb.T).astype(np.float64)
        mx = logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp(logits - mx).sum(axis=1)) + mx[:, 0]
        tgt = np.array(win[1:])
        nll += float(np.sum(lse[:-1] - logits[np.arange(len(win) - 1), tgt]))
        count += len(win) - 1
    print(json.dumps({"method": a.method, "sparsity": a.sparsity, "perplexity": float(np.exp(nll / count)),
                      "tokens": count, "ctx": a.ctx, "calib_tokens": a.calib_samples * a.calib_len,
                      "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
