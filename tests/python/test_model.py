"""sparq.load / Model / prune_model against the `sparq` command line as the independent reference:
the same model and options through the CLI's --json output must give the same numbers (eval),
the same text (generate) and byte-identical checkpoints (prune). The tiny model is a Hugging Face
folder written by NumPy (tiny_model.py); the SmolLM2 test is in the slow tier (-m slow)."""

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import sparq
from conftest import require_file, smollm2_path
from tiny_model import CONFIG, read_safetensors, write_tiny_model

THREADS = 2
# Calibration small enough for a sub-second prune of the tiny model.
CALIB = ["--calib-samples", "4", "--calib-len", "64"]


def run_cli(cli, *args):
    """stdout of `sparq ARGS` (bytes); a failure shows its stderr."""
    r = subprocess.run([cli, *map(str, args)], capture_output=True)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout


@pytest.fixture(scope="module")
def text_file(sherlock, tmp_path_factory):
    """The first 6000 bytes of the Sherlock Holmes text (UTF-8, a line boundary), in a file."""
    with open(sherlock, "rb") as f:
        data = f.read(6000)
    data = data[:data.rfind(b"\n") + 1]
    p = tmp_path_factory.mktemp("text") / "text.txt"
    p.write_bytes(data)
    return p


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return sparq.load(tiny_model_dir, threads=THREADS)


def test_load_gives_the_architecture_and_sizes(model, tiny_model_dir):
    c = CONFIG
    d, ff, v, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    kv = d // c["num_attention_heads"] * c["num_key_value_heads"]
    assert (model.n_layers, model.hidden, model.vocab) == (L, d, v)
    assert model.config["n_head_kv"] == c["num_key_value_heads"]
    per_block = 2 * d * d + 2 * kv * d + 3 * ff * d
    assert model.n_params == v * d + d * (2 * L + 1) + L * per_block  # tied head: counted once
    layers = model.layers
    assert len(layers) == 7 * L + 1
    assert layers["blk.1.ffn_down.weight"]["shape"] == (d, ff)
    assert layers["blk.0.attn_k.weight"]["shape"] == (kv, d)
    assert {e["values"] for e in layers.values()} == {"f32"}
    # f32 dense: 4 bytes per weight of every linear layer (head included), embedding, norms.
    assert model.weight_bytes == 4 * (L * per_block + 2 * v * d + d * (2 * L + 1))
    assert model.values == "f32"
    assert model.threads == THREADS
    assert model.path == tiny_model_dir
    assert "layers=2" in repr(model)


def test_eval_equals_the_cli(model, tiny_model_dir, text_file, sparq_cli):
    for ctx, max_tokens in [(128, None), (100, 1000)]:
        args = ["eval", tiny_model_dir, "--text", text_file, "--ctx", ctx, "--threads", THREADS,
                "--json"]
        if max_tokens:
            args += ["--max-tokens", max_tokens]
        ref = json.loads(run_cli(sparq_cli, *args))
        got = model.eval(pathlib.Path(text_file), ctx=ctx, max_tokens=max_tokens)
        # The same library call on the same ids: bitwise the same (nlohmann prints doubles
        # round-trip exact), whatever the thread count.
        assert got["perplexity"] == ref["perplexity"]
        for key in ("tokens", "ctx", "windows", "threads", "isa", "attention_isa"):
            assert got[key] == ref[key], key
    # With an f16 KV cache, as `sparq --kv-cache f16 eval`.
    f16 = sparq.load(tiny_model_dir, threads=THREADS, kv_cache="f16")
    assert f16.kv_cache == "f16" and model.kv_cache == "f32"
    ref = json.loads(run_cli(sparq_cli, "--kv-cache", "f16", "eval", tiny_model_dir, "--text",
                             text_file, "--ctx", 128, "--threads", THREADS, "--json"))
    got = f16.eval(pathlib.Path(text_file), ctx=128)
    assert got["perplexity"] == ref["perplexity"] and got["kv_cache"] == ref["kv_cache"] == "f16"
    with pytest.raises(ValueError, match="kv_cache"):
        sparq.load(tiny_model_dir, kv_cache="bf16")
    # The text itself (a str) is the same as its file.
    text = pathlib.Path(text_file).read_bytes().decode()
    assert model.eval(text, ctx=128)["perplexity"] == model.eval(pathlib.Path(text_file),
                                                                  ctx=128)["perplexity"]
    assert model.eval(text, ctx=128, max_tokens=500)["tokens"] == 500 - 500 // 128 - 1


def test_generate_equals_the_cli_greedy_and_sampled(model, tiny_model_dir, sparq_cli):
    prompt = "It was a dark and stormy night"
    for temp, seed in [(0.0, 42), (0.9, 7)]:
        ref = run_cli(sparq_cli, "generate", tiny_model_dir, "--prompt", prompt, "--max-new", 24,
                      "--temperature", temp, "--seed", seed, "--threads", THREADS)
        got = model.generate(prompt, max_new=24, temperature=temp, seed=seed)
        # The command prints the new tokens, then a newline; byte-level tokens of a random model
        # can split UTF-8 sequences, so both sides decode with replacement.
        assert got == ref[:-1].decode("utf-8", errors="replace")
        # Byte for byte too (the module's raw result, before Python's decoding).
        raw, _, new_ids = model._m.generate(prompt, 24, temp, 40, 1.0, seed, False)
        assert raw == ref[:-1] and len(new_ids) == 24
        assert got == model.generate(prompt, max_new=24, temperature=temp, seed=seed)
    assert model.generate(prompt, max_new=24, temperature=0.9, seed=8) != \
        model.generate(prompt, max_new=24, temperature=0.9, seed=7)
    assert model.generate(prompt, max_new=0) == ""


def _chat_reference():
    """SmolLM2's chat template and its jinja2 rendering of one user message (repo data)."""
    path = os.path.join(os.path.dirname(__file__), "..", "model", "data", "chat_reference.json")
    with open(path, encoding="utf-8") as f:
        t = next(t for t in json.load(f)["templates"] if t["name"] == "smollm2")
    case = next(c for c in t["cases"] if len(c["messages"]) == 1 and c["add_generation_prompt"])
    return t["template"], case["messages"][0]["content"], case["text"]


def _ids_of(text):
    """The tiny vocabulary's ids of a rendered chat text: markers are their special ids, the rest
    its UTF-8 bytes."""
    specials = {"<|im_start|>": 257, "<|im_end|>": 258}
    ids, i = [], 0
    while i < len(text):
        hit = next((s for s in specials if text.startswith(s, i)), None)
        if hit:
            ids.append(specials[hit])
            i += len(hit)
        else:
            ids.extend(text[i].encode())
            i += 1
    return ids


def test_generate_applies_the_chat_template_as_the_cli(tmp_path, sparq_cli):
    template, prompt, rendered = _chat_reference()
    folder = write_tiny_model(str(tmp_path / "chat"), chat_template=template)
    m = sparq.load(folder, threads=THREADS)
    for raw in (False, True):
        flags = ["--raw"] if raw else []
        ref = run_cli(sparq_cli, "generate", folder, "--prompt", prompt, "--max-new", 12,
                      "--threads", THREADS, *flags)
        text, prompt_ids, _ = m._m.generate(prompt, 12, 0.0, 40, 1.0, 42, raw)
        assert text == ref[:-1]
        # jinja2's rendering (the reference file), tokenized with the markers as special ids.
        assert prompt_ids == (list(prompt.encode()) if raw else _ids_of(rendered))
    # A template sparq does not recognise: the raw prompt, and the command's warning as a
    # UserWarning.
    odd = write_tiny_model(str(tmp_path / "odd"), chat_template="{% set x = 1 %}{{ x }}")
    r = subprocess.run([sparq_cli, "generate", odd, "--prompt", prompt, "--max-new", "4"],
                       capture_output=True)
    assert r.returncode == 0
    warning = r.stderr.decode().split("sparq: warning: ")[1].splitlines()[0]
    with pytest.warns(UserWarning) as w:
        got = sparq.load(odd).generate(prompt, max_new=4)
    assert str(w[0].message) == warning
    assert got == r.stdout[:-1].decode("utf-8", errors="replace")


def test_bench_gives_the_cli_row_keys(model, tiny_model_dir, sparq_cli):
    ref = json.loads(run_cli(sparq_cli, "bench", "model", tiny_model_dir, "--prompt", 16,
                             "--decode", 4, "--repeats", 1, "--threads", THREADS,
                             "--no-dense-bf16", "--text", tiny_model_dir + "/config.json",
                             "--json"))[0]
    row = model.bench(prompt=16, decode=4, repeats=2)
    assert set(row) == set(ref)
    for key in ("model", "variant", "runtime", "activations", "kv_cache", "weight_bytes",
                "block_linear_bytes",
                "weight_bytes_per_token", "values", "file_bytes", "bits_per_weight", "threads",
                "prompt_tokens", "decode_tokens", "cpu_model", "isa", "perplexity"):
        assert row[key] == ref[key], key
    assert row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0


def test_logits_are_the_models_next_token_scores(model):
    text = "To Sherlock Holmes she is always the woman. Übrigens"
    ids = model.tokenize(text)
    assert ids == list(text.encode())  # byte-level, no merges: the ids are the UTF-8 bytes
    logits = model.logits(ids)
    assert logits.shape == (len(ids), model.vocab) and logits.dtype == np.float32
    # Causal: a prefix's logits do not depend on what follows it (up to reassociation).
    np.testing.assert_allclose(model.logits(ids[:10]), logits[:10], rtol=1e-5, atol=1e-5)


def test_eval_releases_the_gil(model, sherlock):
    """While one thread evaluates, another keeps running Python: the longest pause the main loop
    sees is a small part of the eval (holding the GIL, it would be the whole eval)."""
    import threading
    import time
    with open(sherlock, "rb") as f:
        book = f.read().decode("utf-8")
    # Long enough to time (>= 0.3 s) on a fast machine too.
    n = 20_000
    while n < len(book) and model.eval(book[:n], ctx=128)["seconds"] < 0.3:
        n *= 2
    text = book[:n]
    took = []
    t = threading.Thread(target=lambda: took.append(model.eval(text, ctx=128)["seconds"]))
    last, longest = time.perf_counter(), 0.0
    t.start()
    while t.is_alive():
        time.sleep(0.002)  # leaves the cores to the eval; waking up needs the GIL
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    t.join()
    assert took and took[0] > 0.2, f"eval too short to tell ({took})"
    assert longest < 0.5 * took[0], f"main thread stalled {longest:.3f} s of {took[0]:.3f} s"


def _check_nm(w, n, m, name):
    rows, k = w.shape
    nonzeros = (w.reshape(rows, k // m, m) != 0).sum(axis=2)
    assert nonzeros.max() <= n, f"{name}: a group of {m} along k holds {nonzeros.max()} nonzeros"
    assert (w != 0).mean() > 0.45, f"{name}: pruned more than {n}:{m} asks"


def test_prune_model_equals_the_cli_and_keeps_the_pattern(tiny_model_dir, text_file, sparq_cli,
                                                          tmp_path):
    ref = tmp_path / "cli.sparq"
    run_cli(sparq_cli, "prune", tiny_model_dir, "--pattern", "2:4", "--method", "sparsegpt",
            "--calib", text_file, *CALIB, "--threads", THREADS, "-o", ref)
    out = tmp_path / "py.sparq"
    pruned = sparq.prune_model(tiny_model_dir, "2:4", method="sparsegpt",
                               calib=pathlib.Path(text_file), out=out, calib_samples=4,
                               calib_len=64, threads=THREADS)
    # The same driver, options and inputs: a byte-identical checkpoint.
    assert out.read_bytes() == ref.read_bytes()
    assert pruned.path == str(out)
    assert len(pruned.prune_report["layers"]) == 14
    blocks = {k: v for k, v in pruned.layers.items() if k.startswith("blk.")}
    assert all(v["format"].startswith("nm 2:4") for v in blocks.values()), blocks
    # The weights as stored, densified by the command line: every 4 along k keep <= 2.
    dense = tmp_path / "dense.safetensors"
    run_cli(sparq_cli, "convert", out, dense, "--format", "dense")
    tensors = read_safetensors(dense)
    names = [k for k in tensors if k.startswith("blk.") and tensors[k].ndim == 2]
    assert len(names) == 14
    for name in names:
        _check_nm(tensors[name], 2, 4, name)
    # Pruning costs the model something, but it still runs: perplexity finite and worse.
    text = pathlib.Path(text_file).read_bytes().decode()
    dense_model = sparq.load(tiny_model_dir, threads=THREADS)
    assert pruned.eval(text, ctx=128)["perplexity"] != dense_model.eval(text, ctx=128)["perplexity"]
    assert np.isfinite(pruned.eval(text, ctx=128)["perplexity"])


def test_act_order_equals_the_cli_and_needs_sparsegpt(tiny_model_dir, text_file, sparq_cli,
                                                      tmp_path):
    ref = tmp_path / "cli.sparq"
    run_cli(sparq_cli, "quantize", tiny_model_dir, "--values", "int4:g64", "--act-order",
            "--calib", text_file, *CALIB, "--threads", THREADS, "-o", ref)
    out = tmp_path / "py.sparq"
    q = sparq.prune_model(tiny_model_dir, "dense", calib=pathlib.Path(text_file), values="int4:g64",
                          act_order=True, out=out, calib_samples=4, calib_len=64, threads=THREADS)
    assert out.read_bytes() == ref.read_bytes()
    # The default runs it where it applies (the command line's too); False turns it off.
    default = sparq.prune_model(tiny_model_dir, "dense", calib=pathlib.Path(text_file),
                                values="int4:g64", calib_samples=4, calib_len=64, threads=THREADS)
    with open(default.path, "rb") as f:
        assert f.read() == out.read_bytes()
    plain = sparq.prune_model(tiny_model_dir, "dense", calib=pathlib.Path(text_file),
                              values="int4:g64", act_order=False, calib_samples=4, calib_len=64,
                              threads=THREADS)
    with open(plain.path, "rb") as f:
        assert f.read() != out.read_bytes()  # the order changes the codes
    cli_plain = tmp_path / "cli_plain.sparq"
    run_cli(sparq_cli, "quantize", tiny_model_dir, "--values", "int4:g64", "--no-act-order",
            "--calib", text_file, *CALIB, "--threads", THREADS, "-o", cli_plain)
    with open(plain.path, "rb") as f:
        assert f.read() == cli_plain.read_bytes()
    assert q.prune_report["layers"][0]["format"] == "dense"
    with pytest.raises(ValueError, match="--method sparsegpt, not wanda"):
        sparq.prune_model(tiny_model_dir, "2:4", method="wanda", calib=pathlib.Path(text_file),
                          values="int4:g64", act_order=True, calib_samples=4, calib_len=64,
                          threads=THREADS)


def test_embedding_int8_rows_equals_the_cli(tiny_model_dir, text_file, sparq_cli, tmp_path):
    ref = tmp_path / "cli_rows.sparq"
    run_cli(sparq_cli, "quantize", tiny_model_dir, "--values", "int4:g64", "--embedding-values",
            "int4:g64", "--embedding-int8-rows", "8", "--calib", text_file, *CALIB, "--threads",
            THREADS, "-o", ref)
    out = tmp_path / "py_rows.sparq"
    q = sparq.prune_model(tiny_model_dir, "dense", calib=pathlib.Path(text_file), values="int4:g64",
                          embedding_values="int4:g64", embedding_int8_rows=8, out=out,
                          calib_samples=4, calib_len=64, threads=THREADS)
    assert out.read_bytes() == ref.read_bytes()
    assert b"token_embd.rows.ids" in out.read_bytes()
    assert np.all(np.isfinite(q.logits(q.tokenize("the rows apart"))))
    with pytest.raises(ValueError, match="--embedding-int8-rows 8"):
        sparq.prune_model(tiny_model_dir, "dense", calib=pathlib.Path(text_file),
                          values="int4:g64", embedding_int8_rows=8, calib_samples=4,
                          calib_len=64, threads=THREADS)


def test_prune_model_methods_values_and_a_model_argument(model, text_file, tmp_path):
    text = pathlib.Path(text_file).read_bytes().decode()
    # A Model argument prunes its file with its threads; text given as a str.
    p = sparq.prune_model(model, "4:8", method="wanda", calib=text, values="bf16",
                          calib_samples=4, calib_len=64)
    assert p.threads == model.threads
    assert {v["values"] for k, v in p.layers.items() if k.startswith("blk.")} == {"bf16"}
    assert p.values == "bf16"
    m = sparq.prune_model(model, "unstructured:0.5", method="magnitude", calib=text,
                          calib_samples=4, calib_len=64, blocks=1)
    fmts = m.layers
    assert fmts["blk.0.attn_q.weight"]["format"] != "dense f32"
    assert fmts["blk.1.attn_q.weight"]["format"] == "dense f32"  # blocks=1: only block 0
    assert len(m.prune_report["layers"]) == 7


def test_save_load_round_trip(tiny_model_dir, text_file, tmp_path, sparq_cli):
    text = pathlib.Path(text_file).read_bytes().decode()
    pruned = sparq.prune_model(tiny_model_dir, "2:4", method="sparsegpt", calib=text,
                               values="int4:g64", calib_samples=4, calib_len=64, threads=THREADS)
    saved = tmp_path / "saved.sparq"
    pruned.save(saved)
    with open(pruned.path, "rb") as f:
        assert saved.read_bytes() == f.read()
    again = sparq.load(saved, threads=THREADS)
    ids = pruned.tokenize(text[:64])
    assert np.array_equal(again.logits(ids), pruned.logits(ids))
    assert again.eval(text, ctx=128)["perplexity"] == pruned.eval(text, ctx=128)["perplexity"]
    assert again.layers == pruned.layers
    # The command line reads it and gets the same perplexity.
    ref = json.loads(run_cli(sparq_cli, "eval", saved, "--text", text_file, "--ctx", 128,
                             "--threads", THREADS, "--json"))
    assert ref["perplexity"] == again.eval(pathlib.Path(text_file), ctx=128)["perplexity"]
    # The temporary checkpoint goes with the model.
    tmp = pruned.path
    del pruned
    import gc
    gc.collect()
    assert not os.path.exists(tmp)


def test_a_hugging_face_model_saves_as_loaded(model, text_file, tmp_path, sparq_cli):
    text = pathlib.Path(text_file).read_bytes().decode()[:2000]
    ids = model.tokenize(text[:64])
    saved = tmp_path / "hf.sparq"
    model.save(saved)  # f32 weights: the same bits
    again = sparq.load(saved, threads=THREADS)
    assert np.array_equal(again.logits(ids), model.logits(ids))
    assert again.config == model.config
    assert again.tokenize(text) == model.tokenize(text)
    ref = json.loads(run_cli(sparq_cli, "eval", saved, "--text", text_file, "--ctx", 128,
                             "--max-tokens", 512, "--threads", THREADS, "--json"))
    assert ref["perplexity"] == again.eval(pathlib.Path(text_file), ctx=128,
                                           max_tokens=512)["perplexity"]
    # bf16: the layers stored in bf16 (each weight rounded: the C++ test checks the bits), half
    # the bytes of the f32 file but the metadata.
    half = tmp_path / "hf16.sparq"
    model.save(half, values="bf16")
    h = sparq.load(half, threads=THREADS)
    assert h.values == "bf16"
    assert h.layers.keys() == model.layers.keys()
    assert half.stat().st_size < 0.6 * saved.stat().st_size
    # A .sparq model is copied as loaded: values does not apply.
    with pytest.raises(ValueError, match="values applies"):
        again.save(tmp_path / "x.sparq", values="bf16")


def test_save_into_a_missing_folder_raises_and_writes_nothing(model, tiny_model_dir, text_file,
                                                              tmp_path):
    text = pathlib.Path(text_file).read_bytes().decode()
    pruned = sparq.prune_model(model, "2:4", method="magnitude", calib=text, calib_samples=4,
                               calib_len=64)
    missing = tmp_path / "no-such-dir"
    with pytest.raises(OSError, match="no-such-dir"):
        pruned.save(missing / "x.sparq")
    with pytest.raises(OSError, match="no-such-dir"):
        model.save(missing / "y.sparq")  # a Hugging Face model (SaveLlamaCheckpoint)
    # An atomic write's temporary file sits beside the target: neither was created.
    assert list(tmp_path.iterdir()) == []


def test_errors_name_the_file_and_the_problem(model, tiny_model_dir, tmp_path):
    missing = str(tmp_path / "nope.gguf")
    with pytest.raises(OSError, match="nope.gguf"):
        sparq.load(missing)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    with pytest.raises(ValueError, match="bad.gguf"):
        sparq.load(bad)
    junk = tmp_path / "junk.sparq"
    junk.write_bytes(b"\x00" * 5)
    with pytest.raises((ValueError, OSError), match="junk.sparq"):
        sparq.load(junk)
    with pytest.raises(ValueError, match="gguf_values"):
        sparq.load(tiny_model_dir, gguf_values="q8")
    with pytest.raises(ValueError, match="threads"):
        sparq.load(tiny_model_dir, threads=0)
    with pytest.raises(ValueError, match="values must be"):
        model.save(tmp_path / "x.sparq", values="int8")
    assert not (tmp_path / "x.sparq").exists()
    with pytest.raises(ValueError, match="calib is required"):
        sparq.prune_model(model, "2:4")
    with pytest.raises(ValueError, match="pattern"):
        sparq.prune_model(model, "3:2", calib="some text")
    with pytest.raises(ValueError, match="method"):
        sparq.prune_model(model, "2:4", method="obs", calib="some text")
    with pytest.raises(OSError, match="no-such.txt"):
        sparq.prune_model(model, "2:4", calib=pathlib.Path(tmp_path / "no-such.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty.txt"):
        model.eval(empty)
    with pytest.raises(ValueError, match="ctx"):
        model.eval("some text", ctx=1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate("hi", temperature=-1)
    with pytest.raises(ValueError, match="max_new"):
        model.generate("hi", max_new=-1)
    with pytest.raises(ValueError, match="seed"):
        model.generate("hi", seed=-1)
    with pytest.raises(ValueError, match="top-p"):
        model.generate("hi", temperature=0.5, top_p=0.0)
    with pytest.raises(ValueError, match="token"):
        model.logits([model.vocab])  # out of range
    with pytest.raises(ValueError, match="str"):
        model.eval(b"bytes")
    assert not list(tmp_path.glob("x.sparq*"))  # a failed save leaves nothing behind


@pytest.mark.slow
def test_smollm2_eval_and_generate_equal_the_cli(sparq_cli, tmp_path):
    gguf = require_file(smollm2_path(), "SmolLM2-135M-Instruct: run scripts/fetch_model.sh or "
                                        "set SPARQ_MODEL to its path")
    wiki = require_file(os.path.join(os.path.dirname(__file__), "..", "..", "data", "text",
                                     "wikitext-2-raw-test.txt"), "data/text: git checkout")
    m = sparq.load(gguf, threads=THREADS)
    ref = json.loads(run_cli(sparq_cli, "eval", gguf, "--text", wiki, "--max-tokens", 1024,
                             "--threads", THREADS, "--json"))
    got = m.eval(pathlib.Path(wiki), max_tokens=1024)
    assert got["perplexity"] == ref["perplexity"]
    # The model's chat template (chatml) is applied as the command applies it.
    out = run_cli(sparq_cli, "generate", gguf, "--prompt", "What is the capital of France?",
                  "--max-new", 16, "--threads", THREADS)
    assert m.generate("What is the capital of France?", max_new=16) == out[:-1].decode()
