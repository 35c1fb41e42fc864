#!/usr/bin/env python3
"""Reference facts about a GGUF file from an independent reader (the `gguf` pip package that
llama.cpp publishes; `pip install gguf numpy`), for sparq's tests.

Prints (or writes with --out) a JSON document: tensor count, a few metadata values, every
tensor's row-major shape, and for a few tensors the mean / standard deviation (float64 over the
float32 dequantized values) and the first 8 dequantized values (exact).

  python3 scripts/gguf_reference_stats.py ~/.cache/sparq/models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --out tests/io/smollm2_reference.json

tests/io/smollm2_test.cc compares sparq's reader with the checked-in numbers, and re-runs this
script to compare with the live package when python3 + gguf are available.
"""
import argparse
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

STAT_TENSORS = [
    "token_embd.weight",        # Q8_0
    "blk.0.attn_q.weight",      # Q4_1
    "blk.0.attn_norm.weight",   # F32
    "blk.15.ffn_gate.weight",   # Q4_1
    "blk.29.ffn_down.weight",   # Q4_1
    "output_norm.weight",       # F32
]
META_KEYS = [
    "llama.embedding_length", "llama.block_count", "llama.vocab_size",
    "llama.feed_forward_length", "llama.attention.head_count", "llama.attention.head_count_kv",
]


def field_value(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]].tolist()[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out")
    ap.add_argument("--tensors", nargs="*", default=STAT_TENSORS)
    args = ap.parse_args()
    r = GGUFReader(args.model)
    doc = {
        "tool": "gguf-py " + getattr(__import__("gguf"), "__version__", "?"),
        "tensor_count": len(r.tensors),
        "metadata": {k: field_value(r, k) for k in META_KEYS if k in r.fields},
        # GGUFReader's shape is ggml's ne order; sparq's is reversed (row-major).
        "shapes": {t.name: [int(d) for d in reversed(t.shape.tolist())] for t in r.tensors},
        "types": {t.name: t.tensor_type.name for t in r.tensors},
        "stats": {},
    }
    try:
        import importlib.metadata as md
        doc["tool"] = "gguf " + md.version("gguf")
    except Exception:
        pass
    by_name = {t.name: t for t in r.tensors}
    for name in args.tensors:
        t = by_name[name]
        x = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        xd = x.astype(np.float64)
        doc["stats"][name] = {
            "mean": float(xd.mean()),
            "std": float(xd.std()),
            "min": float(x.min()),
            "max": float(x.max()),
            "first": [float(v) for v in x[:8]],
        }
    text = json.dumps(doc, indent=1, sort_keys=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    sys.exit(main())
