#!/usr/bin/env python3
"""Writes a GGUF of random K-quant tensors (Q2_K .. Q6_K) and, beside each tensor NAME, an F32
tensor NAME.ref holding gguf-py's own dequantization of it: an independent reference for sparq's
K-quant reader (tests/io/gguf_kquant_test.cc compares the two bit for bit).

Blocks are random bytes (every scale, min, high-bit and quant pattern is possible) with the f16
super-block scales d / dmin replaced by finite random f16 values of either sign, subnormals and
zero included. Needs numpy and gguf (llama.cpp's gguf-py).

  python scripts/make_kquant_gguf.py OUT.gguf [--seed N]
"""
import argparse

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.quants import dequantize

# type -> (bytes per 256-element super-block, byte offsets of the f16 scales d / dmin)
LAYOUT = {T.Q2_K: (84, [80, 82]), T.Q3_K: (110, [108]), T.Q4_K: (144, [0, 2]),
          T.Q5_K: (176, [0, 2]), T.Q6_K: (210, [208])}
SHAPES = [(3, 512), (256,), (2, 1, 768)]  # numpy order (rows first): 6, 1 and 6 super-blocks


def random_f16(rng, n):
    # Normal-range values of both signs plus a few exact zeros and subnormals (d = 0 is legal).
    v = (rng.standard_normal(n) * 2.0 ** rng.integers(-14, 4, n)).astype(np.float16)
    v[rng.random(n) < 0.05] = 0
    sub = rng.random(n) < 0.05
    v[sub] = (rng.integers(1, 1024, sub.sum()).astype(np.uint16)).view(np.float16)
    assert np.isfinite(v).all()
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=27)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    w = GGUFWriter(args.out, arch="kquant_test")
    for qtype, (nbytes, scale_at) in LAYOUT.items():
        for k, shape in enumerate(SHAPES):
            n = int(np.prod(shape)) // 256
            blocks = rng.integers(0, 256, (n, nbytes), dtype=np.uint8)
            for off in scale_at:
                blocks[:, off:off + 2] = random_f16(rng, n).view(np.uint8).reshape(n, 2)
            ref = dequantize(blocks.reshape(-1), qtype).astype(np.float32).reshape(shape)
            assert np.isfinite(ref).all()
            name = f"{qtype.name.lower()}_{k}"
            raw = blocks.reshape(shape[:-1] + (shape[-1] // 256 * nbytes,))
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
            w.add_tensor(name + ".ref", ref)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"seed {args.seed}: wrote {len(LAYOUT) * len(SHAPES) * 2} tensors to {args.out}")


if __name__ == "__main__":
    main()
