"""sparq.torch (PyTorch interop). Every test but the first carries the `torch` marker: conftest.py
deselects them when torch is not importable (never skips them).

References are the masked dense modules run in float64 by torch; a sparse f32 run must stay
within an error bound propagated through the layers (see `linear_err`): each linear layer adds
its f32 accumulation bound (refs.matmul_tolerance's k * 2^-23 * |W| |x|) and carries the error of
its input through |W|; ReLU passes errors unchanged, SiLU multiplies them by at most 1.1 (its
largest slope) and adds its own rounding.
"""

import copy
import os
import subprocess
import sys

import numpy as np
import pytest

import sparq
from conftest import SEED
from refs import assert_matmul_close, matmul_tolerance, prune_nm_reference

try:
    import torch
    from torch import nn
except ImportError:  # the torch-marked tests are deselected (conftest.py)
    torch = None

tm = pytest.mark.torch
U = 2.0**-24  # unit roundoff of float32


def test_import_sparq_does_not_import_torch():
    code = ("import sys, sparq, numpy as np\n"
            "sparq.Linear(np.eye(4, dtype=np.float32))(np.ones((2, 4), np.float32))\n"
            "assert 'torch' not in sys.modules, 'import sparq imported torch'\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


# ---- helpers ------------------------------------------------------------------------------------

def f64(t):
    return t.detach().to(torch.float64).numpy()


def linear_err(w, b, x, ex):
    """Bound on |y - y_ref| per output of one f32 linear layer y = x W^T + b whose input x
    (float64 array of the reference's input) is off by at most ex: the input error through |W|,
    the f32 accumulation of length k on inputs up to |x| + ex (refs.matmul_tolerance), one
    rounding of the bias add."""
    aw = np.abs(w.astype(np.float64))
    k = w.shape[1]
    ax = np.abs(x) + ex
    mag = ax @ aw.T
    err = ex @ aw.T + k * 2.0**-23 * mag + 1e-30
    if b is not None:
        err += 2 * U * (mag + 2 * np.abs(b.astype(np.float64)))
    return err


def assert_within(y, ref, err):
    y = f64(y) if torch is not None and isinstance(y, torch.Tensor) else y
    d = np.abs(y - ref)
    assert y.shape == ref.shape
    assert np.all(d <= err), f"max err {d.max()} vs bound {err.flat[np.argmax(d - err)]}"


def is_24(w):
    g = (np.asarray(w) != 0).reshape(w.shape[0], -1, 4).sum(axis=2)
    return bool(np.all(g <= 2))


def mlp(k=64, h=96, o=40):
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(k, h), nn.ReLU(), nn.Linear(h, o))


def mlp_reference_and_bound(sparse, x):
    """Masked dense module (the sparse one's weights, densified) in float64, and the bound."""
    l1, l2 = sparse[0], sparse[2]
    w1, b1 = l1.to_dense().numpy(), l1.bias.numpy()
    w2, b2 = l2.to_dense().numpy(), l2.bias.numpy()
    x = f64(x).reshape(-1, w1.shape[1])
    a1 = np.maximum(x @ w1.T.astype(np.float64) + b1, 0)
    e1 = linear_err(w1, b1, x, np.zeros_like(x))
    ref = a1 @ w2.T.astype(np.float64) + b2
    return ref, linear_err(w2, b2, a1, e1)


if torch is not None:
    class LlamaMLP(nn.Module):
        """Hugging Face's LlamaMLP: down(silu(gate(x)) * up(x)), no biases."""

        def __init__(self, hidden=64, inter=128):
            super().__init__()
            self.gate_proj = nn.Linear(hidden, inter, bias=False)
            self.up_proj = nn.Linear(hidden, inter, bias=False)
            self.down_proj = nn.Linear(inter, hidden, bias=False)
            self.act_fn = nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = LlamaMLP()

        def forward(self, x):
            return x + self.mlp(x)


def llama_reference_and_bound(m, x):
    wg, wu, wd = (d.to_dense().numpy() for d in (m.gate_proj, m.up_proj, m.down_proj))
    x = f64(x).reshape(-1, wg.shape[1])
    z = np.zeros_like(x)
    g, u = x @ wg.T.astype(np.float64), x @ wu.T.astype(np.float64)
    eg, eu = linear_err(wg, None, x, z), linear_err(wu, None, x, z)
    s = g / (1 + np.exp(-g))
    # silu in f32: slope <= 1.1, plus its own rounding (a few ulps: 8 allowed)
    es = 1.1 * eg + 8 * U * (np.abs(s) + 1.1 * eg)
    h = s * u
    eh = np.abs(s) * eu + np.abs(u) * es + es * eu + U * (np.abs(h) + np.abs(s) * eu +
                                                          np.abs(u) * es + es * eu)
    return h @ wd.T.astype(np.float64), linear_err(wd, None, h, eh)


def batches(rng, n, shape):
    return [torch.from_numpy(rng.standard_normal(shape).astype(np.float32)) for _ in range(n)]


def collect_inputs(module, names, calib):
    """Each named Linear's inputs, as sparsify_ should see them (an independent hook)."""
    got = {n: [] for n in names}
    hooks = [module.get_submodule(n).register_forward_hook(
        lambda mod, a, out, n=n: got[n].append(a[0].reshape(-1, a[0].shape[-1]).numpy().copy()))
        for n in names]
    with torch.no_grad():
        for b in calib:
            module(b)
    for h in hooks:
        h.remove()
    return {n: np.concatenate(v) for n, v in got.items()}


# ---- sparsify_ ----------------------------------------------------------------------------------

@tm
@pytest.mark.parametrize("method", ["magnitude", "wanda", "sparsegpt"])
def test_sparsify_sequential_mlp(rng, method):
    from sparq.torch import SparseLinear, sparsify_

    dense = mlp()
    calib = batches(rng, 3, (16, 64))
    xs = collect_inputs(dense, ["0", "2"], calib)
    model = copy.deepcopy(dense)
    assert sparsify_(model, "2:4", method=method,
                     calib=None if method == "magnitude" else calib) is model
    for name in ["0", "2"]:
        sl = model.get_submodule(name)
        assert isinstance(sl, SparseLinear) and sl.format.startswith("nm 2:4")
        w = dense.get_submodule(name).weight.detach().numpy()
        got = sl.to_dense().numpy()
        assert is_24(got)
        if method == "magnitude":
            want = prune_nm_reference(w, 2, 4)
        else:  # what sparq.prune gives on the inputs the layer saw in the dense module
            want = sparq.prune(w, "2:4", method=method, inputs=xs[name]).weight
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(sl.bias.numpy(), dense.get_submodule(name).bias.detach())
        assert sl.prune_report["method"] == method
    x = torch.from_numpy(rng.standard_normal((3, 5, 64)).astype(np.float32))
    with torch.no_grad():
        y = model(x)
    assert y.shape == (3, 5, 40) and y.dtype == torch.float32
    ref, err = mlp_reference_and_bound(model, x)
    assert_within(y.reshape(-1, 40), ref, err)


@tm
@pytest.mark.parametrize("method", ["magnitude", "wanda", "sparsegpt"])
def test_sparsify_llama_mlp(rng, method):
    from sparq.torch import SparseLinear, sparsify_

    torch.manual_seed(SEED)
    block = Block()
    calib = torch.from_numpy(rng.standard_normal((4, 16, 64)).astype(np.float32))
    sparsify_(block, "2:4", method=method, calib=calib)
    m = block.mlp
    assert all(isinstance(getattr(m, n), SparseLinear) for n in ("gate_proj", "up_proj",
                                                                  "down_proj"))
    assert all(is_24(getattr(m, n).to_dense().numpy()) for n in ("gate_proj", "up_proj",
                                                                  "down_proj"))
    x = torch.from_numpy(rng.standard_normal((2, 7, 64)).astype(np.float32))
    with torch.inference_mode():
        y = m(x)
    ref, err = llama_reference_and_bound(m, x)
    assert_within(y.reshape(-1, 64), ref, err)


@tm
def test_sparsify_filter_fn_values_and_iterable_calib(rng):
    from sparq.torch import SparseLinear, sparsify_

    torch.manual_seed(SEED)
    block = Block()
    seen = []

    def only_gate_up(mod, fqn):
        seen.append(fqn)
        return not fqn.endswith("down_proj")

    calib = [(b,) for b in batches(rng, 2, (8, 64))] + [{"x": batches(rng, 1, (8, 64))[0]}]
    sparsify_(block, "4:8", method="wanda", calib=calib, filter_fn=only_gate_up, values="bf16")
    assert sorted(seen) == ["mlp.down_proj", "mlp.gate_proj", "mlp.up_proj"]
    assert isinstance(block.mlp.gate_proj, SparseLinear)
    assert isinstance(block.mlp.down_proj, nn.Linear)
    assert block.mlp.up_proj.matrix.values == "bf16"


@tm
def test_bf16_input_and_layouts(rng):
    from sparq.torch import SparseLinear

    w = prune_nm_reference(rng.standard_normal((24, 32)).astype(np.float32), 2, 4)
    sl = SparseLinear(torch.from_numpy(w), pattern="2:4")
    x = torch.from_numpy(rng.standard_normal((6, 32)).astype(np.float32))
    with torch.no_grad():
        y32 = sl(x)
        xb = x.to(torch.bfloat16)
        yb = sl(xb)  # widened exactly, multiplied in f32, rounded back to bf16
        assert yb.dtype == torch.bfloat16
        assert torch.equal(yb, sl(xb.float()).to(torch.bfloat16))
        # non-contiguous views give the same bits as their contiguous copies
        xt = torch.from_numpy(rng.standard_normal((32, 6)).astype(np.float32)).t()
        assert torch.equal(sl(xt), sl(xt.contiguous()))
        wide = torch.from_numpy(rng.standard_normal((6, 40)).astype(np.float32))
        assert torch.equal(sl(wide[:, :32]), sl(wide[:, :32].contiguous()))
        assert sl(torch.zeros(0, 32)).shape == (0, 24)
    ref = f64(x) @ w.T.astype(np.float64)
    assert_within(y32, ref, linear_err(w, None, f64(x), np.zeros((6, 32))))


# ---- from_torch_prune ---------------------------------------------------------------------------

@tm
def test_from_torch_prune_keeps_torch_mask_bit_for_bit(rng):
    import torch.nn.utils.prune as tprune
    from sparq.torch import SparseLinear, from_torch_prune

    model = mlp(k=50, h=30, o=20)
    tprune.l1_unstructured(model[0], "weight", amount=0.6)
    tprune.l1_unstructured(model[2], "weight", amount=0.3)
    with torch.no_grad():  # a kept weight that is exactly 0 must stay a kept position
        i, j = torch.nonzero(model[0].weight_mask)[0].tolist()
        model[0].weight_orig[i, j] = 0.0
    masks = [model[n].weight_mask.clone() for n in (0, 2)]
    # torch's weight is weight_orig * mask (-0.0 where a negative weight was pruned); sparq's
    # dense form has +0.0 there: kept positions are compared bit for bit, pruned ones are +0.0
    weights = [torch.where(model[n].weight_mask.bool(), model[n].weight_orig, 0.0).detach()
               for n in (0, 2)]
    x = torch.from_numpy(rng.standard_normal((9, 50)).astype(np.float32))
    from_torch_prune(model)
    for n, mask, w in zip((0, 2), masks, weights):
        sl = model[n]
        assert isinstance(sl, SparseLinear) and sl.format.startswith("csr")
        assert torch.equal(sl.mask, mask.bool())
        dense = sl.to_dense()
        assert torch.equal(dense.view(torch.int32), w.view(torch.int32))  # bit for bit
        assert sl.density == pytest.approx((dense != 0).float().mean().item())
    with torch.no_grad():
        y = model(x)
    ref, err = mlp_reference_and_bound(model, x)
    assert_within(y, ref, err)


# ---- state_dict -----------------------------------------------------------------------------------

@tm
def test_state_dict_round_trip(rng):
    from sparq.torch import sparsify_, to_state_dict

    dense = mlp()
    model = sparsify_(copy.deepcopy(dense), "2:4")
    sd = to_state_dict(model)
    assert list(sd) == list(dense.state_dict())
    assert sd["0.weight"].dtype == torch.float32 and is_24(sd["0.weight"].numpy())
    fresh = mlp()
    fresh.load_state_dict(sd)  # strict: the original architecture's keys exactly
    assert torch.equal(fresh[0].weight, model[0].to_dense())
    assert torch.equal(fresh[2].bias, model[2].bias)
    x = torch.from_numpy(rng.standard_normal((4, 64)).astype(np.float32))
    with torch.no_grad():
        y = model(x)
    ref, err = mlp_reference_and_bound(model, x)
    assert_within(fresh(x).detach(), ref, err)
    assert_within(y, ref, err)
    # back into a sparse module: re-encoded with its pattern (2:4), same bits
    other = sparsify_(mlp(k=64, h=96, o=40), "2:4")
    other.load_state_dict(sd)
    assert torch.equal(other[0].to_dense(), model[0].to_dense())
    with torch.no_grad():
        assert torch.equal(other(x), y)
    lin = model[2].to_linear()
    assert isinstance(lin, nn.Linear) and torch.equal(lin.weight, model[2].to_dense())
    # a weight that breaks the pattern is refused
    bad = dict(sd)
    bad["0.weight"] = dense[0].weight.detach().clone()
    with pytest.raises(RuntimeError, match="2:4"):
        other.load_state_dict(bad)


# ---- bad input ----------------------------------------------------------------------------------

@tm
def test_bad_input_raises(rng):
    from sparq.torch import SparseLinear, from_torch_prune, sparsify_

    w = prune_nm_reference(rng.standard_normal((8, 16)).astype(np.float32), 2, 4)
    sl = SparseLinear(torch.from_numpy(w), torch.zeros(8), pattern="2:4")
    with pytest.raises(ValueError, match="float32 or bfloat16, got torch.float64"):
        sl(torch.zeros(2, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="float32 or bfloat16, got torch.int64"):
        sl(torch.zeros(2, 16, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"shape \[\.\.\., 16\], got \(2, 15\)"):
        sl(torch.zeros(2, 15))
    with pytest.raises(ValueError, match="shape"):
        sl(torch.tensor(1.0))
    with pytest.raises(ValueError, match="CPU"):  # no CUDA here: the meta device stands in
        sl(torch.zeros(2, 16, device="meta"))
    with pytest.raises(TypeError, match="torch.Tensor"):
        sl(np.zeros((2, 16), np.float32))
    x = torch.zeros(2, 16, requires_grad=True)
    with torch.no_grad():
        assert sl(x).shape == (2, 8)  # no graph wanted: runs
    nan_w = torch.from_numpy(w.copy())
    nan_w[3, 0] = float("nan")
    with pytest.raises(ValueError, match=r"w: element \[3, 0\]"):
        SparseLinear(nan_w, pattern="2:4")
    with pytest.raises(ValueError, match="does not satisfy pattern 2:4"):
        SparseLinear(torch.ones(8, 16), pattern="2:4")
    with pytest.raises(ValueError, match="dtype must be torch.float32"):
        SparseLinear(torch.ones(8, 16, dtype=torch.float64))
    model = mlp()
    with torch.no_grad():
        model[2].weight[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"layer 2: .*non-finite weight at \(1, 2\)"):
        sparsify_(model, "2:4")
    assert isinstance(model[2], nn.Linear)
    with pytest.raises(ValueError, match="needs calib"):
        sparsify_(mlp(), "2:4", method="sparsegpt")
    with pytest.raises(ValueError, match="method"):
        sparsify_(mlp(), "2:4", method="obs")
    with pytest.raises(ValueError):
        sparsify_(mlp(), "3:2")
    with pytest.raises(ValueError, match="nn.Linear"):
        sparsify_(nn.Linear(8, 8), "2:4")
    with pytest.raises(ValueError, match="dtype must be torch.float32"):
        sparsify_(mlp().double(), "2:4")
    with pytest.raises(ValueError, match="nn.Linear"):
        from_torch_prune(nn.Linear(8, 8))


# ---- python -m sparq.bench ----------------------------------------------------------------------

@tm
def test_bench_runs():
    # a smoke run: the benchmark decides nothing, it only has to print its rows
    import json as _json
    out = subprocess.run([sys.executable, "-m", "sparq.bench", "--shapes", "16x32", "--tokens",
                          "1,3", "--mlp", "16x32", "--repeats", "1", "--target-ms", "1",
                          "--threads", "1", "--json"], check=True, capture_output=True, text=True,
                         env=dict(os.environ)).stdout
    rows = [_json.loads(line) for line in out.splitlines()]
    assert [(r["kind"], r["m"], r["k"], r["tokens"]) for r in rows] == [
        ("linear", 16, 32, 1), ("linear", 16, 32, 3), ("mlp", 32, 16, 1), ("mlp", 32, 16, 3)]
    layers = rows[:2]
    assert all(r["ratio_dense_over_sparse"] > 0 and r["sparse_format"].startswith("nm 2:4")
               for r in layers)
    for r in layers:
        for peer in ("f32", "bf16", "csr"):
            assert r[peer + "_us"] > 0 and r[peer + "_over_sparse"] > 0
        # torch's semi-structured 2:4 runs on CUDA only: a time, or the reason it has none
        assert (r["semi_us"] or 0) > 0 or r["semi_note"]
    assert all(r["sparse_us"] > 0 and r["f32_over_sparse"] > 0 for r in rows[2:])


@tm
@pytest.mark.parametrize("pattern, dtype", [("2:4", "float32"), ("unstructured:0.5", "float32"),
                                            ("2:4", "bfloat16")])
def test_the_gradient_to_x_is_dy_times_the_stored_weight(pattern, dtype):
    """x.grad after y = sl(x) equals dy W on the stored weight, within the f32 accumulation bound
    of that product (dy W is a product of length out_features); the weight gets none (the layer
    has no parameters), and a frozen SparseLinear passes gradients to the layers before it."""
    from sparq.torch import SparseLinear
    rng = np.random.default_rng(SEED)
    w = rng.standard_normal((48, 64)).astype(np.float32)
    pat = sparq.Pattern(pattern)
    mask = None
    if pattern == "2:4":
        w = prune_nm_reference(w, 2, 4)
    else:
        mask = rng.random(w.shape) < 0.5
        w = w * mask
    sl = SparseLinear(torch.from_numpy(w), torch.zeros(48), pattern=pat if mask is None else None,
                      mask=mask)
    dt = getattr(torch, dtype)
    x = torch.from_numpy(rng.standard_normal((3, 5, 64)).astype(np.float32)).to(dt)
    x.requires_grad_(True)
    y = sl(x)
    assert y.dtype == dt and y.requires_grad
    gy = torch.from_numpy(rng.standard_normal((3, 5, 48)).astype(np.float32)).to(dt)
    y.backward(gy)
    assert x.grad.dtype == dt and x.grad.shape == x.shape
    ws = sl.to_dense().numpy()  # the stored values: what forward multiplies by
    g2 = gy.float().numpy().reshape(-1, 48)
    got = x.grad.float().numpy().reshape(-1, 64)
    if dtype == "float32":
        assert_matmul_close(got.T, ws.T, g2.T)
    else:  # one bf16 rounding of the f32 result: half a bf16 step relative, plus the f32 bound
        ref = g2.astype(np.float64) @ ws.astype(np.float64)
        tol = matmul_tolerance(ws.T, g2.T).T + 2.0**-8 * np.abs(ref)
        assert np.all(np.abs(got - ref) <= tol)
    # A trainable layer before a frozen sparse one: its gradient is built from sparq's dx.
    torch.manual_seed(SEED)
    pre = nn.Linear(64, 64)
    a = torch.from_numpy(rng.standard_normal((4, 64)).astype(np.float32))
    h = pre(a)
    h.retain_grad()
    y2 = sl(h)
    y2.square().sum().backward()
    dy2 = (2 * y2.detach()).numpy()  # the loss's gradient, exact in f32
    assert_matmul_close(h.grad.numpy().T, ws.T, dy2.T)
    assert torch.equal(pre.weight.grad, h.grad.T @ a)
