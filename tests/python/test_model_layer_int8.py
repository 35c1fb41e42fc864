"""sparq.load(..., int8_activations=...) and Model.layer(name) (issue 29). References: the flag-off
load (where no kernel rounds X, on must not change a bit), the flag-off model's perplexity (flag on
stays close), the
`sparq convert --format dense` densification of the checkpoint (a layer's values) and NumPy
products in double (a layer's products)."""

import gc
import pathlib

import numpy as np
import pytest

import sparq
from conftest import require_file, smollm2_path
from test_model import CALIB, THREADS, run_cli
from tiny_model import read_safetensors

INT4_LAYER = "blk.0.ffn_down.weight"


@pytest.fixture(scope="module")
def text(sherlock):
    with open(sherlock, "rb") as f:
        data = f.read(6000)
    return data[:data.rfind(b"\n") + 1].decode()


def _prune(src, text, out, values, permute=False):
    return sparq.prune_model(src, "2:4", method="sparsegpt", calib=text, values=values,
                             out=out, calib_samples=4, calib_len=64, permute=permute,
                             threads=THREADS)


@pytest.fixture(scope="module")
def int4_path(tiny_model_dir, text, tmp_path_factory):
    """The tiny model pruned 2:4 with int4:g64 values: the layout the int8-X kernel serves."""
    out = tmp_path_factory.mktemp("int4") / "int4.sparq"
    _prune(tiny_model_dir, text, out, "int4:g64")
    return out


@pytest.fixture(scope="module")
def f32_path(tiny_model_dir, text, tmp_path_factory):
    out = tmp_path_factory.mktemp("f32") / "f32.sparq"
    _prune(tiny_model_dir, text, out, "f32")
    return out


def _has_vnni():
    return "AVX3_DL" in sparq.supported_isas()


# ---- int8_activations --------------------------------------------------------------------------

def test_int8_activations_on_is_the_default_and_off_keeps_f32_bits(tiny_model_dir, int4_path,
                                                                    text):
    """The default is the command line's (--activations int8): on. On a dense f32 model no
    kernel rounds X, so the default and off give the same bits and report f32."""
    for path in (tiny_model_dir, int4_path):
        default = sparq.load(path, threads=THREADS)
        on = sparq.load(path, threads=THREADS, int8_activations=True)
        off = sparq.load(path, threads=THREADS, int8_activations=False)
        assert default.int8_activations is True and off.int8_activations is False
        ids = default.tokenize(text[:200])
        # One token at a time: the decode products the flag changes.
        a = default.eval(text, ctx=64, max_tokens=200, step=1)
        b = on.eval(text, ctx=64, max_tokens=200, step=1)
        c = off.eval(text, ctx=64, max_tokens=200, step=1)
        assert a["perplexity"] == b["perplexity"]
        assert (a["step"], a["int8_activations"], c["int8_activations"]) == (1, True, False)
        assert off.bench(prompt=8, decode=2, repeats=1)["activations"] == "f32"
        if path == tiny_model_dir:
            assert np.array_equal(default.logits(ids), off.logits(ids))
            assert a["perplexity"] == c["perplexity"]
            assert default.bench(prompt=8, decode=2, repeats=1)["activations"] == "f32"


def test_int8_activations_on_reports_int8_and_changes_only_what_it_serves(tiny_model_dir,
                                                                          int4_path, text):
    on = sparq.load(int4_path, threads=THREADS, int8_activations=True)
    assert on.int8_activations is True
    assert on.bench(prompt=8, decode=2, repeats=1)["activations"] == "int8"
    assert on.eval(text, ctx=64, max_tokens=100)["int8_activations"] is True
    if _has_vnni():  # the int8-X decode row exists only on AVX-512 VNNI + VBMI
        assert "_x8_" in on.layer(INT4_LAYER).kernel_name(1)
    assert "_x8_" not in sparq.load(int4_path, threads=THREADS,
                                    int8_activations=False).layer(INT4_LAYER).kernel_name(1)
    # Prefill (whole windows) runs no int8 kernel: the same bits as flag off.
    off = sparq.load(int4_path, threads=THREADS, int8_activations=False)
    ids = on.tokenize(text[:200])
    assert np.array_equal(on.logits(ids), off.logits(ids))
    # A dense f32 model has no int8-X kernel: decode unchanged too.
    d_on = sparq.load(tiny_model_dir, threads=THREADS, int8_activations=True)
    d_off = sparq.load(tiny_model_dir, threads=THREADS, int8_activations=False)
    assert d_on.eval(text, ctx=64, max_tokens=200, step=1)["perplexity"] == \
        d_off.eval(text, ctx=64, max_tokens=200, step=1)["perplexity"]
    # A Model argument passes the flag on to prune_model's result.
    p = sparq.prune_model(d_on, "2:4", method="magnitude", calib=text, calib_samples=4,
                          calib_len=64)
    assert p.int8_activations is True
    with pytest.raises(ValueError, match="int8_activations"):
        sparq.load(int4_path, int8_activations="yes")


def test_int8_activations_perplexity_within_2_percent(int4_path, text):
    """Token by token (step=1: the decode products the flag rounds), on the 2:4 int4 model."""
    off = sparq.load(int4_path, threads=THREADS, int8_activations=False).eval(text, ctx=128,
                                                                              step=1)
    on = sparq.load(int4_path, threads=THREADS, int8_activations=True).eval(text, ctx=128, step=1)
    rel = abs(on["perplexity"] / off["perplexity"] - 1)
    print(f"perplexity f32 X {off['perplexity']:.4f}, int8 X {on['perplexity']:.4f} ({rel:+.4%})")
    assert rel < 0.02
    if _has_vnni():
        assert on["perplexity"] != off["perplexity"]  # the int8 kernel did run


@pytest.mark.slow
def test_smollm2_int4_int8_activations_perplexity(tmp_path):
    """The CLI's measurement (+0.21% on SmolLM2 2:4 int4), here on the first 512 tokens."""
    gguf = require_file(smollm2_path(), "SmolLM2-135M-Instruct: run scripts/fetch_model.sh or "
                                        "set SPARQ_MODEL to its path")
    wiki = require_file(pathlib.Path(__file__).parents[2] / "data" / "text" /
                        "wikitext-2-raw-test.txt", "data/text: git checkout")
    text = pathlib.Path(wiki).read_text(encoding="utf-8")[:200000]
    out = tmp_path / "s.sparq"
    # SparseGPT + GPTQ as the CLI's measurement (magnitude + RTN wrecks the model: perplexity in
    # the thousands, where a 2% bar means nothing).
    sparq.prune_model(gguf, "2:4", method="sparsegpt", calib=text, values="int4:g64",
                      out=out, calib_samples=8, calib_len=128, threads=THREADS)
    off = sparq.load(out, threads=THREADS, int8_activations=False).eval(text, ctx=256,
                                                                        max_tokens=512, step=1)
    on = sparq.load(out, threads=THREADS, int8_activations=True).eval(text, ctx=256,
                                                                      max_tokens=512, step=1)
    print(f"SmolLM2 2:4 int4 perplexity f32 X {off['perplexity']:.4f}, int8 X "
          f"{on['perplexity']:.4f}")
    # A working model, not a wrecked one: within 10x of the dense model's perplexity.
    dense = sparq.load(gguf, threads=THREADS).eval(text, ctx=256, max_tokens=512)["perplexity"]
    assert off["perplexity"] < 10 * dense
    assert abs(on["perplexity"] / off["perplexity"] - 1) < 0.02


# ---- Model.layer -------------------------------------------------------------------------------

def _check_products(layer, rng):
    """layer @ x against NumPy's to_dense() @ x in double. Any f32 summation order of k products
    (FMA or not) is within gamma_k * sum_j |w_ij x_j| of the exact sum, gamma_k = k u / (1 - k u),
    u = 2^-24 (Higham, Accuracy and Stability, 3.1); the reference itself is exact to ~1e-16."""
    w = layer.to_dense().astype(np.float64)
    m, k = w.shape
    u = 2.0 ** -24
    gamma = k * u / (1 - k * u)
    for n in (1, 3, 40):
        x = rng.standard_normal((k, n)).astype(np.float32)
        got = layer @ x
        ref = w @ x.astype(np.float64)
        bound = gamma * (np.abs(w) @ np.abs(x.astype(np.float64)))
        assert got.shape == (m, n)
        assert np.all(np.abs(got - ref) <= bound), f"n={n}: {np.max(np.abs(got - ref) - bound)}"
    x1 = rng.standard_normal(k).astype(np.float32)
    assert np.array_equal(layer @ x1, (layer @ x1[:, None])[:, 0])


def test_layer_equals_the_cli_densified_checkpoint(f32_path, tmp_path, sparq_cli, rng):
    model = sparq.load(f32_path, threads=THREADS)
    dense = tmp_path / "dense.safetensors"
    run_cli(sparq_cli, "convert", f32_path, dense, "--format", "dense")
    tensors = read_safetensors(dense)
    for name in ("blk.0.attn_q.weight", "blk.1.attn_k.weight", INT4_LAYER):
        layer = model.layer(name)
        info = model.layers[name]
        w = layer.to_dense()
        assert w.dtype == np.float32 and w.shape == info["shape"] == layer.shape
        assert np.array_equal(w, tensors[name]), name  # f32 values: exact
        assert layer.format == info["format"].split()[0] == "nm"
        assert layer.values == info["values"] and layer.nbytes == info["nbytes"]
        assert layer.density == np.count_nonzero(tensors[name]) / w.size
        _check_products(layer, rng)
    # The head of the unpruned tiny model: dense f32, the tied embedding.
    head = model.layer("output.weight")
    assert head.format == "dense" and head.density == 1.0
    assert "SparseMatrix(shape=(260, 64), format='dense'" in repr(head)


def test_layer_of_an_int4_model_dequantizes_as_the_cli(int4_path, tmp_path, sparq_cli, rng):
    model = sparq.load(int4_path, threads=THREADS, int8_activations=True)
    dense = tmp_path / "dense.safetensors"
    run_cli(sparq_cli, "convert", int4_path, dense, "--format", "dense", "--dtype", "f32")
    ref = read_safetensors(dense)[INT4_LAYER]
    layer = model.layer(INT4_LAYER)
    assert layer.values == "int4:g64"
    # Each value is the kernel's dequantization times 1 plus zeros: the stored value within one
    # f32 rounding of |w| (scale * code + min may be fused or not).
    w = layer.to_dense()
    assert np.all(np.abs(w - ref) <= 2.0 ** -23 * np.abs(ref)), np.max(np.abs(w - ref))
    assert np.array_equal(w != 0, ref != 0)
    # Without int8 X, products are f32 sums of the dequantized values.
    f32_x = sparq.load(int4_path, threads=THREADS, int8_activations=False)
    _check_products(f32_x.layer(INT4_LAYER), rng)


def test_layer_of_a_permuted_model_is_in_the_models_input_order(tiny_model_dir, text, rng):
    """Magnitude pruning keeps original values: a permuted layer's nonzeros must sit where the
    NumPy-written weight has those very values (the wrong column order would not match)."""
    model = sparq.prune_model(tiny_model_dir, "2:4", method="magnitude", calib=text,
                              calib_samples=4, calib_len=64, permute=True, threads=THREADS)
    assert all(e["permuted"] for e in model.prune_report["layers"])
    orig = read_safetensors(pathlib.Path(tiny_model_dir) / "model.safetensors")
    layer = model.layer(INT4_LAYER)
    w = layer.to_dense()
    kept = w != 0
    assert np.array_equal(w[kept], orig["model.layers.0.mlp.down_proj.weight"][kept])
    assert abs(layer.density - 0.5) < 0.01
    _check_products(layer, rng)  # @ gathers x as the model does, to_dense scatters the columns


def test_layer_keeps_the_model_alive_and_rejects_bad_input(tiny_model_dir, rng):
    layer = sparq.load(tiny_model_dir, threads=THREADS).layer("blk.1.ffn_up.weight")
    gc.collect()
    x = rng.standard_normal(64).astype(np.float32)
    assert np.allclose(layer @ x, layer.to_dense() @ x, rtol=1e-5, atol=1e-5)
    model = sparq.load(tiny_model_dir, threads=THREADS)
    assert set(model.layers) >= {"blk.0.attn_q.weight", "output.weight"}
    for name in model.layers:
        assert model.layer(name).shape == model.layers[name]["shape"]
    with pytest.raises(ValueError, match="blk.9.attn_q.weight"):
        model.layer("blk.9.attn_q.weight")
    with pytest.raises(ValueError, match="'token_embd.weight'"):
        model.layer("token_embd.weight")
    with pytest.raises(ValueError, match="str"):
        model.layer(0)
    with pytest.raises(ValueError, match="must be"):
        layer @ np.ones(63, np.float32)
    with pytest.raises(ValueError, match="float32"):
        layer @ np.ones(64)
    with pytest.raises(ValueError, match="model's layer"):
        sparq.Linear(layer)
    # kernel_name of a from_dense matrix works as well (it packs a Linear).
    m = sparq.SparseMatrix.from_dense(np.ones((4, 8), np.float32))
    assert isinstance(m.kernel_name(1), str) and m.kernel_name(1)


@pytest.mark.slow
def test_smollm2_q4_1_layer_dequantizes_as_the_f32_load(rng):
    """A GGUF Q4_1 layer run as stored against the same file dequantized to f32 by the loader
    (GgufValues::kF32: the same values bit for bit, model.h)."""
    gguf = require_file(smollm2_path(), "SmolLM2-135M-Instruct: run scripts/fetch_model.sh or "
                                        "set SPARQ_MODEL to its path")
    q = sparq.load(gguf, threads=THREADS).layer("blk.0.attn_q.weight")
    f = sparq.load(gguf, threads=THREADS, gguf_values="f32").layer("blk.0.attn_q.weight")
    assert (q.format, q.values, f.format, f.values) == ("dense", "int4:g32", "dense", "f32")
    ref = f.to_dense()
    w = q.to_dense()
    # One f32 rounding of |w| at most (scale * code + min fused or not in the kernel).
    assert np.all(np.abs(w - ref) <= 2.0 ** -23 * np.abs(ref)), np.max(np.abs(w - ref))
    _check_products(q, rng)
