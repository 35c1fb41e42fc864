#!/usr/bin/env python3
"""Reference data for tests/model: an independent NumPy Llama forward pass over the SmolLM2 GGUF.

    pip install gguf numpy tokenizers
    python3 tests/model/make_reference.py [MODEL.gguf] [--wikitext wikitext-2-raw-test.txt] \
        > tests/model/data/smollm2_reference.json

Independent of sparq: weights are read and dequantized by the `gguf` package (the reader
llama.cpp publishes), token ids come from Hugging Face `tokenizers` built from the GGUF vocabulary
with SmolLM2's pre-tokenizer (individual digits + byte-level), and the forward pass below follows
llama.cpp's LLM_ARCH_LLAMA graph (RMSNorm, NORM rope on adjacent pairs, GQA, SwiGLU, tied head)
in float64.
"""
import json
import os
import sys
from types import SimpleNamespace

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import Tokenizer, models, pre_tokenizers

PROMPTS = [
    "The capital of France is",
    " = Valkyria Chronicles III = \n\n Senjō no Valkyria 3 : Unrecorded Chronicles ( Japanese : "
    "戦場のヴァルキュリア3 , lit . Valkyria of the Battlefield 3 ) , commonly referred to as 1,234.5",
]
TOP = 16
# The perplexity case (--wikitext): the first PPL_TOKENS tokens of the first PPL_BYTES bytes of the
# text, in non-overlapping windows of PPL_CTX, as tests/model/llama_test.cc evaluates them.
PPL_BYTES, PPL_TOKENS, PPL_CTX = 40000, 2048, 512


def field(r, key):
    return r.fields[key].contents()


def load_gguf(path, dtype=np.float64):
    """Config, a weight reader W(name) -> row-major [m, k] array of `dtype`, and the tokenizer
    (Hugging Face `tokenizers` from the GGUF vocabulary, SmolLM2's pre-tokenizer). Also used by
    bench/peers/prune_reference.py."""
    r = GGUFReader(path)
    tensors = {t.name: t for t in r.tensors}

    def W(name):
        t = tensors[name]
        a = dequantize(t.data, t.tensor_type).astype(dtype)
        return a.reshape([int(x) for x in reversed(t.shape)])  # row-major [m, k]

    d = field(r, "llama.embedding_length")
    nh = field(r, "llama.attention.head_count")
    toks = field(r, "tokenizer.ggml.tokens")
    vocab = {t: i for i, t in reversed(list(enumerate(toks)))}
    merges = [tuple(m.split(" ", 1)) for m in field(r, "tokenizer.ggml.merges")]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return SimpleNamespace(
        W=W, tk=tk, n_layer=field(r, "llama.block_count"), d=d, nh=nh,
        nkv=field(r, "llama.attention.head_count_kv"), theta=field(r, "llama.rope.freq_base"),
        eps=field(r, "llama.attention.layer_norm_rms_epsilon"), hd=d // nh)


def load_weights(g):
    """Embedding, per-block weight dicts (GGUF names without the blk.N. prefix) and final norm."""
    blocks = []
    for l in range(g.n_layer):
        p = f"blk.{l}."
        blocks.append({k: g.W(p + k + ".weight") for k in [
            "attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
            "ffn_up", "ffn_down"]})
    return g.W("token_embd.weight"), blocks, g.W("output_norm.weight")


def forward(g, weights, ids):
    """Logits [n, vocab] of token ids, in the dtype of the weights (float64 by default). Also used
    by tests/model/make_hf_folder.py."""
    emb, blocks, out_norm = weights
    d, nh, nkv, theta, eps, hd = g.d, g.nh, g.nkv, g.theta, g.eps, g.hd

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x, heads):  # x [n, heads*hd], adjacent pairs
        n = x.shape[0]
        x = x.reshape(n, heads, hd // 2, 2)
        pos = np.arange(n)[:, None]
        ang = pos * theta ** (-2.0 * np.arange(hd // 2) / hd)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0], x[..., 1]
        return np.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1).reshape(n, heads * hd)

    x = emb[ids]
    n = len(ids)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for b in blocks:
        h = rms(x, b["attn_norm"])
        q = rope(h @ b["attn_q"].T, nh).reshape(n, nh, hd)
        k = rope(h @ b["attn_k"].T, nkv).reshape(n, nkv, hd)
        v = (h @ b["attn_v"].T).reshape(n, nkv, hd)
        att = np.zeros((n, nh, hd))
        for i in range(nh):
            gi = i // (nh // nkv)
            s = q[:, i, :] @ k[:, gi, :].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            att[:, i, :] = s @ v[:, gi, :]
        x = x + att.reshape(n, d) @ b["attn_output"].T
        h = rms(x, b["ffn_norm"])
        gt = h @ b["ffn_gate"].T
        x = x + ((gt / (1 + np.exp(-gt))) * (h @ b["ffn_up"].T)) @ b["ffn_down"].T
    return rms(x, out_norm) @ emb.T


def perplexity_case(g, weights, text_path):
    """Mean next-token NLL over non-overlapping windows (each window of c tokens predicts c - 1)."""
    with open(text_path, "rb") as f:
        text = f.read()[:PPL_BYTES].decode("utf-8", errors="ignore")
    ids = g.tk.encode(text, add_special_tokens=False).ids[:PPL_TOKENS]
    nll, count = 0.0, 0
    for w0 in range(0, len(ids), PPL_CTX):
        win = ids[w0:w0 + PPL_CTX]
        if len(win) < 2:
            break
        logits = forward(g, weights, win)
        for i in range(len(win) - 1):
            row = logits[i]
            mx = row.max()
            nll += float(np.log(np.sum(np.exp(row - mx))) + mx - row[win[i + 1]])
            count += 1
    return {"text": os.path.basename(text_path), "text_bytes": PPL_BYTES, "ctx": PPL_CTX,
            "ids": [int(t) for t in ids], "tokens": count, "mean_nll": nll / count,
            "perplexity": float(np.exp(nll / count))}


def main():
    args = sys.argv[1:]
    wikitext = None
    if "--wikitext" in args:
        i = args.index("--wikitext")
        wikitext = args[i + 1]
        del args[i:i + 2]
    path = args[0] if args else os.path.join(
        os.environ.get("SPARQ_CACHE", os.path.expanduser("~/.cache/sparq")), "models",
        "SmolLM2-135M-Instruct.Q4_1.gguf")
    g = load_gguf(path)
    weights = load_weights(g)
    cases = []
    for text in PROMPTS:
        ids = g.tk.encode(text, add_special_tokens=False).ids
        logits = forward(g, weights, ids)
        rows = []
        for i in range(len(ids)):
            top = np.argsort(-logits[i], kind="stable")[:TOP]
            lse = float(np.log(np.sum(np.exp(logits[i] - logits[i].max()))) + logits[i].max())
            rows.append({"top_ids": [int(t) for t in top],
                         "top_logits": [float(logits[i][t]) for t in top], "logsumexp": lse})
        cases.append({"text": text, "ids": [int(t) for t in ids], "positions": rows})
    out = {"model": os.path.basename(path), "cases": cases}
    if wikitext:
        out["perplexity"] = perplexity_case(g, weights, wikitext)
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
