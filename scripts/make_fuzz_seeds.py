#!/usr/bin/env python3
"""Writes the hand-built seed corpora for the io fuzzers (fuzz/corpus/{safetensors,gguf,
checkpoint,train_state}): small valid files of each kind plus a few broken ones. Standard library only.
The checkpoint seeds come from `sparq convert` (pass the CLI path) on the safetensors seeds.

  python3 scripts/make_fuzz_seeds.py [path/to/sparq]
"""
import json
import os
import struct
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus")


def st(tensors, metadata=None, pad=True):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    if pad:
        h += b" " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors, version=3, alignment=32):
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, vtype, payload in kvs:
        out += gguf_str(key) + struct.pack("<I", vtype) + payload
    offs, nxt = [], 0
    for name, ne, ttype, raw in tensors:
        offs.append(nxt)
        nxt = (nxt + len(raw) + alignment - 1) // alignment * alignment
        out += gguf_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", ttype, offs[-1])
    out += b"\0" * (-len(out) % alignment)
    data = bytearray()
    for (name, ne, ttype, raw), off in zip(tensors, offs):
        data += b"\0" * (off - len(data)) + raw
    return out + bytes(data)


def write(kind, name, data):
    os.makedirs(os.path.join(ROOT, kind), exist_ok=True)
    with open(os.path.join(ROOT, kind, name), "wb") as f:
        f.write(data)


def train_state_seeds():
    """A one-layer train state (sparq/train_loop.h) of d 4, one 2:4 slot, and two broken ones."""
    f32 = lambda v: struct.pack("<%df" % len(v), *v)
    cfg = {"architecture": "llama", "n_vocab": 4, "n_embd": 4, "n_layer": 1, "n_head": 1,
           "n_head_kv": 1, "n_ff": 4, "n_ctx_train": 8, "rope_dim": 2, "rope_theta": 10000.0,
           "rms_eps": 1e-05, "tied_output": True}
    train = {"step": 3, "seed": 7, "seq_len": 4, "accum": 2, "checkpoint_every": 2, "data_tokens": 40,
             "data_hash": 12345, "loss": {"ce_weight": 1.0, "kl_weight": 0.5, "tau": 2.0},
             "lr": {"peak": 0.001, "warmup_steps": 1, "total_steps": 10, "min_ratio": 0.1},
             "adamw": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-08, "weight_decay": 0.01, "max_grad_norm": 1.0}}
    meta = {"sparq.train_state": "1", "sparq.model": json.dumps(cfg), "sparq.train": json.dumps(train)}
    kept = [0, 1, 4, 5, 8, 9, 12, 13]  # 2:4 along k of attn_q [4, 4]
    t = {}
    names = ["token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"]
    sizes = [16, 4, 4, 4]
    for slot in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]:
        names.append("blk.0.%s.weight" % slot)
        sizes.append(16)
    for i, (n, size) in enumerate(zip(names, sizes)):
        w = [((j * 7 + i) % 5 - 2) * 0.25 + (1.0 if size == 4 else 0.0) for j in range(size)]
        train_n = size
        if n == "blk.0.attn_q.weight":
            w = [x if j in kept else 0.0 for j, x in enumerate(w)]
            train_n = len(kept)
            t["mask." + n] = ("I64", [len(kept)], struct.pack("<%dq" % len(kept), *kept))
        t[n] = ("F32", [size] if size == 4 else [4, 4], f32(w))
        t["adamw.m." + n] = ("F32", [train_n], f32([0.01 * (j % 3 - 1) for j in range(train_n)]))
        t["adamw.v." + n] = ("F32", [train_n], f32([0.001 * (j % 4) for j in range(train_n)]))
    good = st(t, meta)
    write("train_state", "one_layer_24.safetensors", good)
    write("train_state", "broken_truncated.safetensors", good[: len(good) * 3 // 4])
    bad = dict(t)
    bad["blk.0.attn_q.weight"] = ("F32", [4, 4], f32([1.0] * 16))  # pruned entries not 0
    write("train_state", "broken_mask_mismatch.safetensors", st(bad, meta))


def main():
    f32 = lambda *v: struct.pack("<%df" % len(v), *v)
    w = f32(*[((i * 37) % 11 - 5) * 0.25 for i in range(8 * 12)])
    model = st({"blk.0.attn_q.weight": ("F32", [8, 12], w), "norm": ("F32", [4], f32(1, 2, 3, 4)),
                "ids": ("I64", [2], struct.pack("<2q", 7, -1)), "h": ("F16", [2], b"\x00\x3c\x00\xc0"),
                "b": ("BF16", [1, 2], b"\x80\x3f\x00\x40"), "e": ("U8", [0, 3], b"")},
               {"config": "{\"hidden\": 12}"})
    write("safetensors", "model.safetensors", model)
    train_state_seeds()
    write("safetensors", "empty.safetensors", st({}))
    write("safetensors", "unpadded_misaligned.safetensors",
          st({"u": ("U8", [3], b"abc"), "f": ("F32", [1], f32(1.5))}, pad=False))
    overlap = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()
    write("safetensors", "broken_overlap.safetensors", struct.pack("<Q", len(overlap)) + overlap + b"\0" * 12)
    write("safetensors", "broken_truncated.safetensors", model[: len(model) // 2])

    arr_u32 = struct.pack("<IQ", 4, 3) + struct.pack("<3I", 1, 2, 3)
    arr_str = struct.pack("<IQ", 8, 2) + gguf_str("a") + gguf_str("bc")
    nested = struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 3, 2) + struct.pack("<2h", -1, 5)
    kvs = [("general.architecture", 8, gguf_str("llama")), ("u8", 0, b"\x07"), ("i8", 1, b"\xff"),
           ("u16", 2, struct.pack("<H", 9)), ("i16", 3, struct.pack("<h", -9)),
           ("u32", 4, struct.pack("<I", 576)), ("i32", 5, struct.pack("<i", -3)),
           ("f32", 6, struct.pack("<f", 1e-5)), ("bool", 7, b"\x01"), ("arr", 9, arr_u32),
           ("strs", 9, arr_str), ("nested", 9, nested), ("u64", 10, struct.pack("<Q", 2**40)),
           ("i64", 11, struct.pack("<q", -2**40)), ("f64", 12, struct.pack("<d", 0.5))]
    q8 = struct.pack("<H", 0x3800) + bytes((i * 7) % 256 for i in range(32))
    q4_0 = struct.pack("<H", 0x4000) + bytes(range(16))
    q4_1 = struct.pack("<HH", 0x3400, 0xBC00) + bytes(range(16, 32))
    tensors = [("q8", [32, 2], 8, q8 * 2), ("q4_0", [32], 2, q4_0), ("q4_1", [32], 3, q4_1),
               ("f32", [3, 2], 0, f32(1, 2, 3, 4, 5, 6)), ("f16", [2], 1, b"\x00\x3c\x00\xc0"),
               ("bf16", [2], 30, b"\x80\x3f\x00\x40"), ("q4k", [256], 12, bytes(144))]
    g = gguf(kvs, tensors)
    write("gguf", "all_types_v3.gguf", g)
    write("gguf", "v2.gguf", gguf(kvs[:3], tensors[:2], version=2))
    write("gguf", "align64.gguf", gguf([("general.alignment", 4, struct.pack("<I", 64))], tensors[:4], alignment=64))
    write("gguf", "broken_truncated.gguf", g[: len(g) * 2 // 3])
    write("gguf", "broken_bad_alignment.gguf", gguf([("general.alignment", 4, struct.pack("<I", 3))], []))

    # K-quants: each type's super-block with patterned bytes and its f16 scales (d, dmin) set to
    # finite values; one file of all five (2 super-blocks each) and one with a NaN d.
    kq = {10: (84, [80, 82]), 11: (110, [108]), 12: (144, [0, 2]), 13: (176, [0, 2]), 14: (210, [208])}
    kq_tensors = []
    for ttype, (nbytes, scale_at) in kq.items():
        blk = bytearray((i * 29 + ttype * 13) % 256 for i in range(2 * nbytes))
        for b0 in (0, nbytes):
            for k, off in enumerate(scale_at):
                blk[b0 + off:b0 + off + 2] = struct.pack("<H", (0x2E66, 0x9C00)[k])  # 0.1, -0.00391
        kq_tensors.append((f"k{ttype}", [256, 2], ttype, bytes(blk)))
    write("gguf", "kquants.gguf", gguf(kvs[:1], kq_tensors))
    nan = bytearray(kq_tensors[2][3])
    nan[144:146] = struct.pack("<H", 0x7E00)  # Q4_K super-block 1: d = NaN
    write("gguf", "broken_kquant_nan_scale.gguf", gguf(kvs[:1], [("k12", [256, 2], 12, bytes(nan))]))

    # Quantized dense checkpoints (no CLI flag makes them): codes, f16 scales (and mins) as parts.
    def dense_quant(spec, rows, cols, scale=0x2E66, min_=0xBC00):
        i8, groups = spec.startswith("int8"), (cols + 31) // 32
        row_bytes = cols if i8 else (cols + 1) // 2
        codes = bytes(((i * 37 + 3) % 255 - 127) % 256 if i8 else (i * 7 + 1) % 256
                      for i in range(rows * row_bytes))
        parts = {"w.values": ("I8" if i8 else "U8", [rows, row_bytes], codes),
                 "w.scales": ("F16", [rows, groups], struct.pack("<H", scale) * (rows * groups))}
        if spec == "int4:g32":
            parts["w.mins"] = ("F16", [rows, groups], struct.pack("<H", min_) * (rows * groups))
        entry = {"format": "dense", "pattern": "dense", "shape": [rows, cols],
                 "dtype": "i8" if i8 else "u8", "values": spec}
        return st(parts, {"sparq": json.dumps({"format_version": 2, "tensors": {"w": entry}})})
    write("checkpoint", "dense_int8_g32.sparq", dense_quant("int8:g32", 3, 40))
    write("checkpoint", "dense_int4_g32.sparq", dense_quant("int4:g32", 4, 40))
    write("checkpoint", "dense_int4_g32_sym.sparq", dense_quant("int4:g32:sym", 2, 64, scale=0xAE66))
    write("checkpoint", "broken_dense_nan_scale.sparq", dense_quant("int8:g32", 2, 32, scale=0x7E00))

    # Quantized CSR checkpoints: row_ptr, col_idx and codes of every other column (row r starts
    # at column r % 2), f16 scales (and mins) per group of G dense columns of a row.
    def csr_quant(spec, rows, cols, scale=0x2E66, min_=0xBC00, mask=False):
        g = int(spec.split(":")[1][1:])
        i8, groups = spec.startswith("int8"), (cols + g - 1) // g
        col_idx = [c for r in range(rows) for c in range(r % 2, cols, 2)]
        row_ptr, n = [0], 0
        for r in range(rows):
            n += len(range(r % 2, cols, 2))
            row_ptr.append(n)
        nnz = len(col_idx)
        if i8:
            codes = bytes(((i * 37 + 3) % 255 - 127) % 256 for i in range(nnz))
        else:
            lo = 1 if spec.endswith(":sym") else 0
            nib = [lo + (i * 7 + 1) % (16 - lo) for i in range(nnz)] + [0]
            codes = bytes(nib[2 * i] | (nib[2 * i + 1] << 4) for i in range((nnz + 1) // 2))
        if mask:  # format version 3: the index as a bit mask, LSB first, u8 [rows, ceil(cols/8)]
            rb = (cols + 7) // 8
            bits = bytearray(rows * rb)
            for r in range(rows):
                for c in range(r % 2, cols, 2):
                    bits[r * rb + c // 8] |= 1 << (c % 8)
            parts = {"w.mask": ("U8", [rows, rb], bytes(bits))}
        else:
            parts = {"w.row_ptr": ("I64", [rows + 1], struct.pack(f"<{rows + 1}q", *row_ptr)),
                     "w.col_idx": ("U16", [nnz], struct.pack(f"<{nnz}H", *col_idx))}
        parts |= {"w.values": ("I8" if i8 else "U8", [len(codes)], codes),
                 "w.scales": ("F16", [rows, groups], struct.pack("<H", scale) * (rows * groups))}
        if spec == "int4:g32":
            parts["w.mins"] = ("F16", [rows, groups], struct.pack("<H", min_) * (rows * groups))
        entry = {"format": "csr", "pattern": "unstructured:0.5", "shape": [rows, cols],
                 "dtype": "i8" if i8 else "u8", "values": spec}
        if mask:
            entry["index"] = "mask"
        version = 3 if mask else 2
        return st(parts, {"sparq": json.dumps({"format_version": version, "tensors": {"w": entry}})})
    write("checkpoint", "csr_int8_g32.sparq", csr_quant("int8:g32", 3, 40))
    write("checkpoint", "csr_int4_g32.sparq", csr_quant("int4:g32", 4, 41))
    write("checkpoint", "csr_int4_g64_sym.sparq", csr_quant("int4:g64:sym", 2, 64))
    write("checkpoint", "broken_csr_nan_scale.sparq", csr_quant("int8:g32", 2, 32, scale=0x7E00))
    write("checkpoint", "csr_int4_g32_mask.sparq", csr_quant("int4:g32", 4, 41, mask=True))
    write("checkpoint", "csr_int8_g32_mask.sparq", csr_quant("int8:g32", 3, 40, mask=True))

    # Quantized V:N:M checkpoints: slabs of 2 rows, every 2:4 group keeping its columns 0 and 1
    # (indices 0 and 1: the nibble 0b0100), codes like N:M's [rows, groups * 2], f16 scales (and
    # mins) per group of G kept values of a row.
    def vnm_quant(spec, rows, cols, scale=0x2E66, min_=0xBC00):
        g = int(spec.split(":")[1][1:])
        i8, per_row = spec.startswith("int8"), cols // 4 * 2
        qg, slabs, mrow = (per_row + g - 1) // g, (rows + 1) // 2, cols // 8
        if i8:
            codes = bytes(((i * 37 + 3) % 255 - 127) % 256 for i in range(rows * per_row))
        else:
            lo = 1 if spec.endswith(":sym") else 0
            codes = bytes((lo + (i * 7 + 1) % (16 - lo)) | ((lo + (i * 5 + 2) % (16 - lo)) << 4)
                          for i in range(rows * per_row // 2))
        parts = {"w.values": ("I8" if i8 else "U8", [rows, len(codes) // rows], codes),
                 "w.meta": ("U8", [slabs, mrow], b"\x44" * (slabs * mrow)),
                 "w.scales": ("F16", [rows, qg], struct.pack("<H", scale) * (rows * qg))}
        if spec.startswith("int4") and not spec.endswith(":sym"):
            parts["w.mins"] = ("F16", [rows, qg], struct.pack("<H", min_) * (rows * qg))
        entry = {"format": "vnm", "pattern": "vnm:2:2:4", "shape": [rows, cols],
                 "dtype": "i8" if i8 else "u8", "values": spec, "v": 2, "n": 2, "m": 4}
        return st(parts, {"sparq": json.dumps({"format_version": 4, "tensors": {"w": entry}})})
    write("checkpoint", "vnm_int8_g32.sparq", vnm_quant("int8:g32", 3, 40))
    write("checkpoint", "vnm_int4_g64.sparq", vnm_quant("int4:g64", 4, 136))
    write("checkpoint", "broken_vnm_nan_scale.sparq", vnm_quant("int4:g32:sym", 2, 64, scale=0x7E00))

    # Quantized BSR checkpoints: blocks of 2 x 4 on the diagonal block columns (block row b keeps
    # block columns b and b + 2), codes [nblocks, 2, bw or bw / 2], f16 scales (and mins) per
    # group of G dense columns of a row; the last block row is half padding when rows is odd.
    def bsr_quant(spec, rows, cols, scale=0x2E66, min_=0xBC00):
        g = int(spec.split(":")[1][1:])
        i8, brows, bcols = spec.startswith("int8"), (rows + 1) // 2, cols // 4
        cols_of = [sorted({b % bcols, (b + 2) % bcols}) for b in range(brows)]
        row_ptr, col_idx = [0], []
        for c in cols_of:
            col_idx += c
            row_ptr.append(len(col_idx))
        nb, rb, lo = len(col_idx), 4 if i8 else 2, 1 if spec.endswith(":sym") else 0
        codes = bytearray()
        for b in range(brows):
            for _ in cols_of[b]:
                for i in range(2):
                    real = b * 2 + i < rows
                    if i8:
                        codes += bytes((((b * 7 + i * 3 + j) % 255 - 127) % 256) if real else 0 for j in range(4))
                    else:
                        nib = [(lo + (b * 5 + i * 3 + j) % (16 - lo)) if real else 0 for j in range(4)]
                        codes += bytes([nib[0] | nib[1] << 4, nib[2] | nib[3] << 4])
        groups = (cols + g - 1) // g
        parts = {"w.row_ptr": ("I64", [brows + 1], struct.pack(f"<{brows + 1}q", *row_ptr)),
                 "w.col_idx": ("U16", [nb], struct.pack(f"<{nb}H", *col_idx)),
                 "w.values": ("I8" if i8 else "U8", [nb, 2, rb], bytes(codes)),
                 "w.scales": ("F16", [rows, groups], struct.pack("<H", scale) * (rows * groups))}
        if spec.startswith("int4") and not spec.endswith(":sym"):
            parts["w.mins"] = ("F16", [rows, groups], struct.pack("<H", min_) * (rows * groups))
        entry = {"format": "bsr", "pattern": "block:2x4:0.5", "shape": [rows, cols],
                 "dtype": "i8" if i8 else "u8", "values": spec, "bh": 2, "bw": 4}
        return st(parts, {"sparq": json.dumps({"format_version": 4, "tensors": {"w": entry}})})
    write("checkpoint", "bsr_int8_g32.sparq", bsr_quant("int8:g32", 5, 40))
    write("checkpoint", "bsr_int4_g64.sparq", bsr_quant("int4:g64", 4, 136))
    write("checkpoint", "broken_bsr_nan_scale.sparq", bsr_quant("int4:g32:sym", 2, 64, scale=0x7E00))

    # N:M / V:N:M meta as ranks (format version 4): per group the rank of its ascending indices
    # among the C(m, n) subsets, in colex order (= ascending as bit sets), ceil(log2 C) bits LSB
    # first; the groups cycle through every rank; one broken seed holds a rank C(m, n).
    def nm_rank(n, m, rows, cols, v=1, bad_rank=None):
        sets = [s for s in range(1 << m) if bin(s).count("1") == n]
        rbits, groups, slabs = (len(sets) - 1).bit_length(), (cols + m - 1) // m, (rows + v - 1) // v
        rrow = (groups * rbits + 7) // 8
        ranks, bits = bytearray(slabs * rrow), []
        for sl in range(slabs):
            for g in range(groups):
                r = (sl * 5 + g) % len(sets)
                tail = cols - g * m
                if tail < m:  # the tail group: its real columns first, then the padding
                    r = sets.index(sum(1 << j for j in range(n))) if tail >= n else 0
                if bad_rank is not None and sl == 0 and g == 0:
                    r = bad_rank
                for b in range(rbits):
                    ranks[sl * rrow + (g * rbits + b) // 8] |= ((r >> b) & 1) << ((g * rbits + b) % 8)
        vals = f32(*[0.25 * ((i % 7) - 3) + 0.5 for i in range(rows * groups * n)])
        if cols % m and cols % m < n:  # padding positions of the tail must hold +0
            vb = bytearray(vals)
            for row in range(rows):
                for j in range(cols % m, n):
                    o = (row * groups * n + (groups - 1) * n + j) * 4
                    vb[o:o + 4] = f32(0.0)
            vals = bytes(vb)
        parts = {"w.values": ("F32", [rows, groups * n], vals),
                 "w.meta_rank": ("U8", [slabs, rrow], bytes(ranks))}
        entry = {"format": "nm" if v == 1 else "vnm", "pattern": f"{n}:{m}" if v == 1 else f"vnm:{v}:{n}:{m}",
                 "shape": [rows, cols], "dtype": "f32", "n": n, "m": m, "meta": "rank"}
        if v > 1:
            entry["v"] = v
        return st(parts, {"sparq": json.dumps({"format_version": 4, "tensors": {"w": entry}})})
    write("checkpoint", "nm_2_4_rank.sparq", nm_rank(2, 4, 3, 30))
    write("checkpoint", "nm_4_8_rank.sparq", nm_rank(4, 8, 2, 37))
    write("checkpoint", "vnm_2_2_4_rank.sparq", nm_rank(2, 4, 5, 33, v=2))
    write("checkpoint", "broken_nm_rank_too_big.sparq", nm_rank(2, 4, 2, 30, bad_rank=6))

    if len(sys.argv) > 1:
        cli, tmp = sys.argv[1], os.path.join(ROOT, "..", "..", "build", "seed_tmp")
        os.makedirs(tmp, exist_ok=True)
        src = os.path.join(tmp, "m.safetensors")
        with open(src, "wb") as f:
            f.write(model)
        for pat, fmt, values in [("2:4", "auto", "bf16"), ("vnm:2:2:4", "auto", "bf16"),
                                 ("block:2x4:0.5", "auto", "bf16"), ("unstructured:0.5", "csr", "f32"),
                                 ("unstructured:0.5", "coo", "f32"), ("2:4", "nm", "int4:g32"),
                                 ("2:4", "nm", "int8:g32"), ("vnm:2:2:4", "auto", "int4:g32"),
                                 ("block:2x4:0.5", "auto", "int4:g32"),
                                 ("1:4", "dense", "f32")]:
            out = os.path.join(tmp, "c.sparq")
            subprocess.run([cli, "convert", src, out, "--pattern", pat, "--format", fmt,
                            "--include", "blk.*", "--values", values],
                           check=True, stdout=subprocess.DEVNULL)
            with open(out, "rb") as f:
                data = f.read()
            safe = pat.replace(":", "_").replace(".", "")
            name = f"{safe}_{fmt}" + ("_" + values.replace(":", "_") if values.startswith("int") else "")
            write("checkpoint", f"{name}.sparq", data)
        write("checkpoint", "broken_truncated.sparq", data[: len(data) - 3])


if __name__ == "__main__":
    main()
