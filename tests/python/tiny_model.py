"""A tiny Llama model written as a Hugging Face folder by NumPy alone (no sparq code), for the
model tests: config.json, a byte-level BPE tokenizer.json and model.safetensors with seeded random
f32 weights. It loads in milliseconds and runs any text (every byte is a token)."""

import json
import os
import struct

import numpy as np

# Shapes chosen so that every linear layer's k (64, 128) is a multiple of 4 and 8 (2:4, 4:8) and
# of the 16-column N:M windows, yet a whole prune runs in a second.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 260,  # 256 bytes, <|endoftext|>, <|im_start|>, <|im_end|>, one unused id
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "rope_scaling": None,
    "torch_dtype": "float32",
}


def _bytes_to_unicode():
    """GPT-2's byte -> printable character map (what a ByteLevel pre-tokenizer emits)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _tokenizer_json():
    vocab = {ch: b for b, ch in sorted(_bytes_to_unicode().items())}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = []
    for i, s in enumerate(specials):
        vocab[s] = 256 + i
        added.append({"id": 256 + i, "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []},
    }


def _tensors(seed):
    c = CONFIG
    rng = np.random.default_rng(seed)
    d, ff, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = d // c["num_attention_heads"] * c["num_key_value_heads"]

    def w(m, k):  # ~unit-variance outputs for unit-variance inputs
        return (rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32)

    # Small embeddings: the tied head then gives logits of std ~1 (a perplexity in the hundreds).
    t = {"model.embed_tokens.weight": (0.1 * rng.standard_normal((v, d))).astype(np.float32),
         "model.norm.weight": np.ones(d, np.float32)}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        t[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(d)).astype(
            np.float32)
        t[p + "self_attn.q_proj.weight"] = w(d, d)
        t[p + "self_attn.k_proj.weight"] = w(kv, d)
        t[p + "self_attn.v_proj.weight"] = w(kv, d)
        t[p + "self_attn.o_proj.weight"] = w(d, d)
        t[p + "mlp.gate_proj.weight"] = w(ff, d)
        t[p + "mlp.up_proj.weight"] = w(ff, d)
        t[p + "mlp.down_proj.weight"] = w(d, ff)
    return t


def write_safetensors(path, tensors):
    """The safetensors layout: u64 header length, JSON header, then the raw little-endian data."""
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    """{name: array} of a safetensors file's F32 / BF16 / F16 tensors (others are skipped)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        if e["dtype"] == "F32":
            x = np.frombuffer(raw, "<f4")
        elif e["dtype"] == "F16":
            x = np.frombuffer(raw, "<f2").astype(np.float32)
        elif e["dtype"] == "BF16":
            x = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            continue
        out[name] = x.reshape(e["shape"])
    return out


def write_tiny_model(folder, seed=29, chat_template=None):
    """Writes the tiny model's Hugging Face folder into `folder` (created) and returns it; with
    `chat_template` (Jinja text), a tokenizer_config.json that carries it."""
    os.makedirs(folder, exist_ok=True)
    if chat_template is not None:
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump({"chat_template": chat_template}, f)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(_tokenizer_json(), f, ensure_ascii=False)
    write_safetensors(os.path.join(folder, "model.safetensors"), _tensors(seed))
    return folder
