#!/usr/bin/env python3
"""Reference token ids for tests/model/tokenizer_test.cc, from Hugging Face `tokenizers` (Rust,
independent of sparq) built from the GGUF vocabulary and merges with SmolLM2's pre-tokenizer
(Digits(individual_digits) then ByteLevel, as in SmolLM2's tokenizer.json).

    pip install gguf tokenizers
    python3 tests/model/make_tokenizer_reference.py [MODEL.gguf] > tests/model/data/tokenizer_reference.json

bench/peers/llama_cpp_reference.py checks the same ids (and the whole WikiText-2 test text)
against llama.cpp's own tokenizer.
"""
import hashlib
import json
import os
import random
import sys

from gguf import GGUFReader
from tokenizers import Tokenizer, models, pre_tokenizers

WIKITEXT_BYTES = 30000  # cut at the last newline before this many bytes
# The repository's own copy of the texts (data/text/SOURCES.md says where they come from).
DATA_TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "text")


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def make_tokenizer(path):
    r = GGUFReader(path)
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    vocab = {t: i for i, t in reversed(list(enumerate(toks)))}
    merges = [tuple(m.split(" ", 1)) for m in r.fields["tokenizer.ggml.merges"].contents()]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return tk


def stress_text(seed, n):
    pool = list("aZ09 '\t\n\r.,!?-_\"()") + [
        "'s", "'ll", "'re", "'ve", "'d", "'m", "'t", "  ", "   ", "\u00e9", "\u00df", "\u4e2d",
        "\u0416", "\u0661", "\u00b2", "\u2160", "\u00a0", "\u3000", "\u2028", "\U0001F600",
        "\u0300", "\u200b", "\u0085", "\u00bd", "\u0e01", "\u05d0", "\ufffd", "\u2003", "\u00ff",
        "\u0100", "\x00", "\x7f", "Hello", " world", "2024", " 3.14"]
    rnd = random.Random(seed)
    return "".join(rnd.choice(pool) for _ in range(n))


def fnv1a64(ids):
    """FNV-1a over the ids as little-endian u32 (tokenizer_slowtest.cc computes the same)."""
    h = 0xcbf29ce484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.environ.get("SPARQ_CACHE", os.path.expanduser("~/.cache/sparq")), "models",
        "SmolLM2-135M-Instruct.Q4_1.gguf")
    tk = make_tokenizer(path)
    raw = open(os.path.join(DATA_TEXT, "wikitext-2-raw-test.txt"), "rb").read()
    cut = raw.rfind(b"\n", 0, WIKITEXT_BYTES) + 1
    wiki = raw[:cut].decode("utf-8")
    texts = ["", " ", "Hello world", "Hello  world", "hello\n\nworld", "  leading", "trailing  ",
             "I'm you're we've they'll she'd it's don't", "x=1234567, y=3.14159", "\t\ttab",
             "caf\u00e9 na\u00efve \u00fcber", "\u4e2d\u6587\u6d4b\u8bd5", "emoji \U0001F600!",
             "<|im_start|>user\nHi<|im_end|>", "a\r\nb\r\n\r\nc", "   \n   \n",
             stress_text(1, 400), stress_text(2, 400), stress_text(3, 2000)]
    full = {}
    for name in ["wikitext-2-raw-test.txt", "sherlock-holmes-pg1661.txt"]:
        ids = tk.encode(open(os.path.join(DATA_TEXT, name), "rb").read().decode("utf-8"),
                        add_special_tokens=False).ids
        full[name] = {"count": len(ids), "fnv1a64": fnv1a64(ids)}
    out = {"model": os.path.basename(path), "model_sha256": sha256_of(path), "wikitext_bytes": cut, "full_texts": full,
           "wikitext_ids": tk.encode(wiki, add_special_tokens=False).ids,
           "cases": [{"text": t, "ids": tk.encode(t, add_special_tokens=False).ids}
                     for t in texts]}
    json.dump(out, sys.stdout, ensure_ascii=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
