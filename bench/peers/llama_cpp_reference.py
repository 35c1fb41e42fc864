#!/usr/bin/env python3
"""sparq vs llama.cpp on the same GGUF: token ids, perplexity, greedy next-token agreement.

    .venv/bin/pip install llama-cpp-python   # builds llama.cpp from source (slow on 2 cores)
    # a -march=native build that dies with SIGILL: bench/peers/build_llama_cpp.sh (docs/model.md)
    .venv/bin/python bench/peers/llama_cpp_reference.py MODEL.gguf --sparq build/release/sparq \
        --text data/text/wikitext-2-raw-test.txt [--ctx 512] [--max-tokens 16384] \
        [--threads 2] [--f32]

Temporary files (the --f32 GGUF, token ids) go to ${SPARQ_CACHE:-~/.cache/sparq}/tmp.

1. Token ids: llama.cpp's tokenizer (add_bos=False, special=False) on the whole text vs
   `sparq eval --tokens-out` (also on the whole text): must be identical.
2. Perplexity: the same non-overlapping windows of --ctx tokens over the first --max-tokens
   tokens (0: all), every token after the first of a window predicted; llama.cpp's logits
   (logits_all) vs `sparq eval --json`. Target: within 1 %.
3. Greedy agreement: at every predicted position, argmax of llama.cpp's logits vs sparq's
   (`sparq eval --argmax-out`). Target: >= 99 %.
llama.cpp multiplies Q4_1 weights with activations quantized to 8 bits (Q8_1; Q8_0 for the Q8_0
lm_head) and keeps K/V in f16, sparq multiplies the dequantized f32 weights with f32 activations,
so small differences are expected. Measured on SmolLM2-135M Q4_1 (docs/model.md): perplexity
+0.5 %, greedy agreement ~96 %; the disagreements are near-ties of the logits, and a numpy model
that only rounds activations the way llama.cpp does disagrees with exact f32 as often. The JSON
therefore also gives, at the positions where the two argmaxes differ, llama.cpp's logit gap
between its own choice and sparq's (`disagree_gap_*`), and llama.cpp's top-1/top-2 margin.
With --f32, llama.cpp runs instead on an F32 GGUF of the same weights (every tensor dequantized
by the `gguf` package, written to a temporary file) with f32 K/V: then it does sparq's arithmetic
(f32 weights times f32 activations) up to summation order, and the agreement measures the two
runtimes rather than llama.cpp's 8-bit activation rounding. sparq still reads the original GGUF
(its dense model is those dequantized weights).
Prints one JSON object last.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--sparq", required=True, help="path of the sparq binary")
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--f32", action="store_true",
                    help="run llama.cpp on an F32 GGUF of the same weights, with f32 K/V")
    a = ap.parse_args()

    cache = os.environ.get("SPARQ_CACHE") or os.path.expanduser("~/.cache/sparq")
    # As llama_cpp_bench.py: build_llama_cpp.sh's libraries unless the caller chose others.
    built = os.path.join(cache, "llama_cpp", "lib")
    if "LLAMA_CPP_LIB_PATH" not in os.environ and os.path.isfile(os.path.join(built, "libllama.so")):
        os.environ["LLAMA_CPP_LIB_PATH"] = built
    from llama_cpp import Llama
    os.makedirs(os.path.join(cache, "tmp"), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="llama_cpp_reference.", dir=os.path.join(cache, "tmp"))
    try:
        ref_model, kv = a.model, {}
        if a.f32:
            ref_model = os.path.join(tmp, "f32.gguf")
            write_f32_gguf(a.model, ref_model)
            kv = {"type_k": 0, "type_v": 0}  # GGML_TYPE_F32
        llm = Llama(model_path=ref_model, n_ctx=a.ctx, n_batch=a.ctx, n_ubatch=a.ctx,
                    logits_all=True, n_threads=a.threads, n_threads_batch=a.threads,
                    verbose=False, **kv)
        raw = open(a.text, "rb").read()
        ref_ids = llm.tokenize(raw, add_bos=False, special=False)
        run(a, llm, ref_ids, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_f32_gguf(src, dst):
    """`src` with every tensor dequantized to F32 (gguf.quants) and general.file_type ALL_F32."""
    import gguf
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue  # written by the writer itself
        val = f.contents()
        if f.name == "general.file_type":
            val = int(gguf.LlamaFileType.ALL_F32)
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, val, f.types[0], sub_type=sub)
    for t in r.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        shape = [int(d) for d in reversed(t.shape)]  # GGUF lists ne0 first; numpy wants rows first
        w.add_tensor(t.name, np.ascontiguousarray(data.reshape(shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run(a, llm, ref_ids, tmp):
    sparq_ids = sparq_tokens(a.sparq, a.model, a.text, tmp)
    first_diff = next((i for i, (x, y) in enumerate(zip(ref_ids, sparq_ids)) if x != y), None)
    ids_equal = len(ref_ids) == len(sparq_ids) and first_diff is None
    print(f"tokens: llama.cpp {len(ref_ids)}, sparq {len(sparq_ids)}, identical: {ids_equal}"
          + ("" if ids_equal else f", first difference at {first_diff}"), file=sys.stderr)

    ids = ref_ids if a.max_tokens <= 0 else ref_ids[:a.max_tokens]
    am_path = os.path.join(tmp, "argmax.txt")
    out = subprocess.run([a.sparq, "eval", a.model, "--text", a.text, "--ctx", str(a.ctx),
                          "--max-tokens", str(len(ids)), "--json", "--threads", str(a.threads),
                          "--argmax-out", am_path], check=True, capture_output=True, text=True)
    sq = json.loads(out.stdout.strip().splitlines()[-1])
    sq_argmax = [int(x) for x in open(am_path)]
    predicted = sum(max(0, min(a.ctx, len(ids) - b) - 1) for b in range(0, len(ids), a.ctx))
    if len(sq_argmax) != predicted:
        raise SystemExit(f"sparq gave {len(sq_argmax)} argmax positions, expected {predicted}")
    n_vocab = llm.n_vocab()
    nll, count, argmax = 0.0, 0, []
    gaps, margins = [], []  # llama.cpp: top-1 logit - logit of sparq's choice; top-1 - top-2
    t0 = time.time()
    for begin in range(0, len(ids), a.ctx):
        win = ids[begin:begin + a.ctx]
        if len(win) < 2:
            break
        llm.reset()
        llm.eval(win)
        logits = np.array(llm.scores[:len(win)], dtype=np.float64).reshape(len(win), n_vocab)
        mx = logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp(logits - mx).sum(axis=1)) + mx[:, 0]
        for i in range(len(win) - 1):
            nll += lse[i] - logits[i, win[i + 1]]
            count += 1
        argmax.extend(int(t) for t in logits[:-1].argmax(axis=1))
        top2 = np.partition(logits[:-1], -2, axis=1)[:, -2:]
        margins.append(top2[:, 1] - top2[:, 0])
        sq_win = np.array(sq_argmax[count - (len(win) - 1):count])
        gaps.append(top2[:, 1] - logits[np.arange(len(sq_win)), sq_win])
    ref_ppl = math.exp(nll / count)
    ref_s = time.time() - t0
    agree = sum(1 for x, y in zip(argmax, sq_argmax) if x == y) / max(1, len(argmax))
    margins, gaps = np.concatenate(margins), np.concatenate(gaps)
    dis = np.array(argmax) != np.array(sq_argmax)
    g = gaps[dis] if dis.any() else np.zeros(1)

    result = {
        "tokens_identical": ids_equal, "text_tokens": len(ref_ids),
        "eval_tokens": count, "ctx": a.ctx,
        "perplexity_llama_cpp": ref_ppl, "perplexity_sparq": sq["perplexity"],
        "perplexity_rel_diff": sq["perplexity"] / ref_ppl - 1.0,
        "greedy_agreement": agree, "disagreements": int(dis.sum()),
        "disagree_gap_median": float(np.median(g)), "disagree_gap_p90": float(np.percentile(g, 90)),
        "margin_median_all": float(np.median(margins)),
        "margin_median_at_disagreements": float(np.median(margins[dis])) if dis.any() else None,
        "llama_cpp_seconds": ref_s, "sparq_seconds": sq["seconds"],
        "threads": a.threads, "llama_cpp_weights": "f32" if a.f32 else "as stored",
    }
    print(json.dumps(result))


def sparq_tokens(sparq, model, text, tmp):
    """All of sparq's token ids for `text` (`sparq eval --tokenize-only --tokens-out`)."""
    path = os.path.join(tmp, "all_ids.txt")
    subprocess.run([sparq, "eval", model, "--text", text, "--tokenize-only", "--tokens-out", path],
                   check=True, stdout=subprocess.DEVNULL)
    return [int(x) for x in open(path)]


if __name__ == "__main__":
    main()
