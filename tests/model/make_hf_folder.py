#!/usr/bin/env python3
"""Writes the SmolLM2 GGUF as a Hugging Face Llama folder and checks it with transformers.

    pip install gguf numpy tokenizers safetensors transformers torch
    python3 tests/model/make_hf_folder.py OUT_DIR [--model MODEL.gguf] [--sparq build/release/sparq]

Run by hand once (not in CI: transformers and torch are heavy); results are in docs/model.md.
Independent of sparq's C++: weights come from the `gguf` package (dequantized to f32), the
tokenizer is Hugging Face `tokenizers` built from the GGUF vocabulary (as make_reference.py does),
and q_proj/k_proj rows are put back in Hugging Face order by undoing llama.cpp's converter
permutation (convert_hf_to_gguf.py, LlamaModel.permute:
w.reshape(n_head, 2, hd/2, k).swapaxes(1, 2)) with numpy. Then:

  1. transformers' LlamaForCausalLM loads OUT_DIR (HF order, rotate-half RoPE) and its logits on
     a WikiText slice are compared with make_reference.forward on the GGUF weights (GGUF order,
     adjacent-pair RoPE, float64): agreement here shows the un-permutation is the converter's
     inverse, i.e. the folder is the GGUF's model.
  2. transformers' perplexity over the first 4096 WikiText-2 tokens (windows of 512, as
     `sparq eval` counts them) is printed; with --sparq, `sparq eval OUT_DIR` and
     `sparq eval MODEL.gguf` run on the same tokens and their perplexities are printed beside it.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import torch
from safetensors.numpy import save_file
from tokenizers import AddedToken, decoders

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import forward, load_gguf, load_weights  # noqa: E402

# The repository's own copy of the texts (data/text/SOURCES.md says where they come from).
DATA_TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "text")
CHECK_TOKENS = 512
PPL_TOKENS, PPL_CTX = 4096, 512


def hf_rows(w, n_head):
    """GGUF q/k rows -> HF rows: the inverse of w.reshape(n_head, 2, hd/2, k).swapaxes(1, 2)."""
    m, k = w.shape
    return w.reshape(n_head, m // n_head // 2, 2, k).swapaxes(1, 2).reshape(m, k)


def write_folder(g, out, gguf_path):
    os.makedirs(out, exist_ok=True)
    from gguf import GGUFReader
    r = GGUFReader(gguf_path)
    f = lambda k: r.fields[k].contents()  # noqa: E731
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": int(f("llama.vocab_size")), "hidden_size": g.d,
        "num_hidden_layers": g.n_layer, "num_attention_heads": g.nh,
        "num_key_value_heads": g.nkv, "intermediate_size": int(f("llama.feed_forward_length")),
        "max_position_embeddings": int(f("llama.context_length")), "rope_theta": float(g.theta),
        "rms_norm_eps": float(g.eps), "tie_word_embeddings": True, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "rope_scaling": None,
        "bos_token_id": int(f("tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(f("tokenizer.ggml.eos_token_id")), "torch_dtype": "float32"}
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(config, fh, indent=1)

    tk = g.tk
    toks, types = f("tokenizer.ggml.tokens"), f("tokenizer.ggml.token_type")
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(toks, types) if ty == 3])
    tk.decoder = decoders.ByteLevel()
    tk.save(os.path.join(out, "tokenizer.json"))

    t = {"model.embed_tokens.weight": g.W("token_embd.weight"),
         "model.norm.weight": g.W("output_norm.weight")}
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
             "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    for l in range(g.n_layer):
        for gg, hf in names.items():
            w = g.W(f"blk.{l}.{gg}.weight")
            if gg == "attn_q":
                w = hf_rows(w, g.nh)
            elif gg == "attn_k":
                w = hf_rows(w, g.nkv)
            t[f"model.layers.{l}.{hf}.weight"] = np.ascontiguousarray(w, dtype=np.float32)
    save_file(t, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def windows_nll(logits_fn, ids):
    """Mean NLL and perplexity over non-overlapping windows of PPL_CTX (sparq's Perplexity)."""
    total, count = 0.0, 0
    for s in range(0, len(ids), PPL_CTX):
        w = ids[s:s + PPL_CTX]
        if len(w) < 2:
            break
        lg = logits_fn(w).astype(np.float64)
        lse = np.log(np.exp(lg - lg.max(axis=1, keepdims=True)).sum(axis=1)) + lg.max(axis=1)
        total += float(np.sum(lse[:-1] - lg[np.arange(len(w) - 1), w[1:]]))
        count += len(w) - 1
    return total / count, float(np.exp(total / count)), count


def sparq_eval(sparq, model, text):
    out = subprocess.run([sparq, "eval", model, "--text", text, "--max-tokens", str(PPL_TOKENS),
                          "--ctx", str(PPL_CTX), "--json"], check=True, capture_output=True,
                         text=True, env={**os.environ, "OPENBLAS_CORETYPE": "SkylakeX"}).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default=os.path.join(
        os.environ.get("SPARQ_CACHE", os.path.expanduser("~/.cache/sparq")), "models",
        "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--sparq", help="sparq binary: also run `sparq eval` on the folder and GGUF")
    a = ap.parse_args()
    torch.set_num_threads(2)

    g = load_gguf(a.model, np.float32)
    write_folder(g, a.out, a.model)
    sha = hashlib.sha256(open(a.model, "rb").read()).hexdigest()
    print(f"wrote {a.out} from {os.path.basename(a.model)} (sha256 {sha})")

    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM
    text_path = os.path.join(DATA_TEXT, "wikitext-2-raw-test.txt")
    text = open(text_path, "rb").read().decode("utf-8")
    ids = Tokenizer.from_file(os.path.join(a.out, "tokenizer.json")).encode(
        text, add_special_tokens=False).ids
    ref_ids = g.tk.encode(text, add_special_tokens=False).ids
    print(f"tokenizer.json ids == GGUF-vocabulary tokenizer ids on WikiText-2 "
          f"({len(ids)} tokens): {ids == ref_ids}")

    model = LlamaForCausalLM.from_pretrained(a.out, dtype=torch.float32).eval()

    def hf_logits(w):
        with torch.no_grad():
            return model(torch.tensor([w])).logits[0].numpy()

    check = ids[:CHECK_TOKENS]
    got = hf_logits(check).astype(np.float64)
    g64 = load_gguf(a.model)  # float64 weights for the reference
    want = forward(g64, load_weights(g64), check)
    err = np.abs(got - want)
    agree = float(np.mean(got.argmax(1) == want.argmax(1)))
    print(f"transformers (HF folder, f32) vs NumPy float64 reference (GGUF), {CHECK_TOKENS} "
          f"tokens: max |d logit| {err.max():.5f}, mean {err.mean():.6f}, "
          f"greedy agreement {agree:.4f}")

    nll, ppl, n = windows_nll(hf_logits, ids[:PPL_TOKENS])
    print(f"transformers perplexity, first {PPL_TOKENS} tokens, ctx {PPL_CTX}: {ppl:.4f} "
          f"(mean NLL {nll:.5f} over {n} predictions)")
    if a.sparq:
        for m in [a.out, a.model]:
            r = sparq_eval(a.sparq, m, text_path)
            print(f"sparq eval {m}: perplexity {r['perplexity']:.4f} over {r['tokens']} "
                  f"predictions")


if __name__ == "__main__":
    main()
