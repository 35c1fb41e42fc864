#!/usr/bin/env python3
"""llama.cpp's own prefill and decode speed on a GGUF, as one JSON row for `sparq bench model`.

    .venv/bin/pip install llama-cpp-python
    # a -march=native build that dies with SIGILL: bench/peers/build_llama_cpp.sh (docs/model.md),
    # whose libraries this script then loads by itself (LLAMA_CPP_LIB_PATH overrides)
    .venv/bin/python bench/peers/llama_cpp_bench.py MODEL.gguf [--threads 2] [--prompt 512] [--decode 32] \
        [--repeats 3] [--ppl-ids IDS.txt [--ctx 512]] [--json]

Same protocol as sparq's MeasureSpeed: prefill a --prompt-token prompt in one batch, then
--decode single-token steps (greedy), each timed; medians over --repeats. llama.cpp computes
with the file's own quantized weights (Q4_1 here): this row is the bar for sparq's quantized
kernels, not a dense-f32 comparison.

--ppl-ids: token ids, one per line (sparq bench model writes its own tokenization of --ppl-text,
so both runtimes score the same ids), scored as sparq's Perplexity does: non-overlapping windows
of --ctx tokens (the last, shorter one too if it has >= 2), each token after a window's first
predicted from those before it; the key `perplexity` is exp(mean negative log-likelihood).
"""
import argparse
import json
import math
import os
import statistics
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ppl-ids", default="")
    ap.add_argument("--ctx", type=int, default=512)
    a = ap.parse_args()
    # bench/peers/build_llama_cpp.sh's libraries (the CPU backend built for this CPU) when they
    # exist and the caller chose none: `sparq bench model --llama-cpp` then needs no setup.
    cache = os.environ.get("SPARQ_CACHE") or os.path.expanduser("~/.cache/sparq")
    built = os.path.join(cache, "llama_cpp", "lib")
    if "LLAMA_CPP_LIB_PATH" not in os.environ and os.path.isfile(os.path.join(built, "libllama.so")):
        os.environ["LLAMA_CPP_LIB_PATH"] = built
    from llama_cpp import Llama
    llm = Llama(model_path=a.model, n_ctx=a.prompt + a.decode + 8, n_batch=a.prompt,
                n_ubatch=a.prompt, n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    # The same synthetic prompt as `sparq bench model` without --text.
    prompt = [100 + 37 * i % 20000 for i in range(a.prompt)]
    n_vocab = llm.n_vocab()

    def last_argmax():
        # Without logits_all, Llama.eval() no longer copies logits into llm.scores (it stays 0,
        # so argmax would always be token 0): read the last row straight from the context.
        row = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
        return int(row.argmax())

    pre, dec = [], []
    for _ in range(a.repeats):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        for _ in range(a.decode):
            llm.eval([last_argmax()])
        t2 = time.perf_counter()
        pre.append(a.prompt / (t1 - t0))
        dec.append(a.decode / (t2 - t1))
    row = {"model": "llama.cpp " + os.path.basename(a.model), "runtime": "llama.cpp",
           "decode_tok_s": statistics.median(dec), "prefill_tok_s": statistics.median(pre),
           "weight_bytes": os.path.getsize(a.model), "threads": a.threads,
           "prompt_tokens": a.prompt, "decode_tokens": a.decode}
    if a.ppl_ids:
        ids = [int(t) for t in open(a.ppl_ids).read().split()]
        row["perplexity"], row["ppl_tokens"] = perplexity(a, ids)
    if a.json:
        print(json.dumps(row))
    else:
        print(f"llama.cpp: prefill {row['prefill_tok_s']:.1f} tok/s, decode "
              f"{row['decode_tok_s']:.1f} tok/s, {a.threads} threads")


def perplexity(a, ids):
    from llama_cpp import Llama
    llm = Llama(model_path=a.model, n_ctx=a.ctx, n_batch=a.ctx, n_ubatch=a.ctx, logits_all=True,
                n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    n_vocab = llm.n_vocab()
    nll, count = 0.0, 0
    for begin in range(0, len(ids), a.ctx):
        win = ids[begin:begin + a.ctx]
        if len(win) < 2:
            break
        llm.reset()
        llm.eval(win)
        logits = np.array(llm.scores[:len(win)], dtype=np.float64).reshape(len(win), n_vocab)
        mx = logits.max(axis=1)
        lse = np.log(np.exp(logits - mx[:, None]).sum(axis=1)) + mx
        for i in range(len(win) - 1):
            nll += lse[i] - logits[i, win[i + 1]]
            count += 1
    return math.exp(nll / max(1, count)), count


if __name__ == "__main__":
    main()
