import numpy as np
import pytest

import sparq
from refs import assert_matmul_close, prune_nm_reference


def correlated_inputs(rng, n, k):
    # correlated columns (a random mixing of iid ones), where SparseGPT's error compensation
    # pays off, with scales spread over columns as real activations' are, where Wanda's input
    # norms do
    mix = rng.standard_normal((k, k)) / np.sqrt(k)
    scale = np.exp(rng.standard_normal(k))
    return ((rng.standard_normal((n, k)) @ (np.eye(k) + mix)) * scale).astype(np.float32)


def test_magnitude_2_4_matches_reference(rng):
    w = rng.standard_normal((32, 64)).astype(np.float32)
    before = w.copy()
    pw, mask, report = sparq.prune(w, "2:4", method="magnitude")
    np.testing.assert_array_equal(w, before)  # the input is not modified
    np.testing.assert_array_equal(pw, prune_nm_reference(w, 2, 4))
    assert mask.dtype == np.bool_
    np.testing.assert_array_equal(mask, pw != 0)
    assert report["method"] == "magnitude" and report["pattern"] == "2:4"
    assert report["sparsity"] == pytest.approx(0.5)
    assert report["rel_error"] is None  # no calibration data: no error to report


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_methods_keep_the_pattern(rng, method):
    w = rng.standard_normal((32, 64)).astype(np.float32)
    x = correlated_inputs(rng, 256, 64)
    r = sparq.prune(w, "2:4", method=method, inputs=x)
    groups = r.mask.reshape(32, 16, 4).sum(axis=2)
    assert np.all(groups <= 2)  # every group of 4 keeps at most 2
    assert r.report["shape"] == [32, 64]
    assert 0 <= r.report["rel_error"] < 1
    if method == "wanda":  # Wanda only masks: kept weights are w's
        np.testing.assert_array_equal(r.weight[r.mask], w[r.mask])


def test_sparsegpt_beats_wanda_beats_magnitude(rng):
    w = rng.standard_normal((64, 128)).astype(np.float32)
    x = correlated_inputs(rng, 1024, 128)
    err = {}
    for method in ["magnitude", "wanda", "sparsegpt"]:
        err[method] = sparq.prune(w, "2:4", method=method, inputs=x).report["rel_error"]
    assert err["sparsegpt"] < err["wanda"] <= err["magnitude"], err


def test_hessian_gives_the_same_result_as_inputs(rng):
    w = rng.standard_normal((16, 32)).astype(np.float32)
    x = correlated_inputs(rng, 200, 32)
    by_x = sparq.prune(w, "2:4", method="sparsegpt", inputs=x)
    h = x.astype(np.float64).T @ x.astype(np.float64) / len(x)
    by_h = sparq.prune(w, "2:4", method="sparsegpt", hessian=h)
    np.testing.assert_array_equal(by_x.mask, by_h.mask)
    np.testing.assert_allclose(by_x.weight, by_h.weight, rtol=1e-4, atol=1e-5)


def test_acceptance_sparsegpt_2_4_then_multiply(rng):
    # issue 29's acceptance: prune a random layer with SparseGPT to 2:4 and multiply with it,
    # matching NumPy on the stored weights within the f32 accumulation bound
    m, k = 96, 160
    w = rng.standard_normal((m, k)).astype(np.float32)
    calib = correlated_inputs(rng, 512, k)
    pw, mask, _ = sparq.prune(w, sparq.Pattern("2:4"), method="sparsegpt", inputs=calib)
    s = sparq.SparseMatrix.from_dense(pw, pattern="2:4")
    assert s.format == "nm" and s.density <= 0.5
    x = rng.standard_normal((k, 9)).astype(np.float32)
    assert_matmul_close(s @ x, s.to_dense(), x)
    lin = sparq.Linear(s)
    xt = x.T.copy()
    np.testing.assert_array_equal(lin(xt), (s @ x).T)


def test_unstructured_fraction(rng):
    w = rng.standard_normal((20, 50)).astype(np.float32)
    r = sparq.prune(w, "unstructured:0.7", method="magnitude")
    assert np.count_nonzero(r.weight) == round(0.3 * w.size)
    s = sparq.SparseMatrix.from_dense(r.weight, pattern="unstructured:0.7")
    assert s.format == "csr"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="wanda"), "needs inputs"),
        (dict(method="obs"), "obs"),
        (dict(method="sparsegpt", inputs=np.zeros((5, 31), np.float32)),
         r"inputs must be \[N, 32\]"),
        (dict(method="sparsegpt", inputs=np.zeros((5, 32), np.float64)), "inputs: dtype"),
        (dict(method="sparsegpt", inputs=np.zeros((0, 32), np.float32)), "no rows"),
        (dict(method="sparsegpt", hessian=np.eye(31)), r"hessian must be \[32, 32\]"),
        (dict(method="sparsegpt", hessian=np.eye(32, dtype=np.float32)), "hessian: dtype"),
        (dict(method="sparsegpt", inputs=np.zeros((4, 32), np.float32), hessian=np.eye(32)),
         "not both"),
        (dict(pattern="2:64"), "2:64"),
        (dict(pattern=None), "pattern is required"),
    ],
)
def test_bad_input_raises_value_error(rng, kwargs, match):
    w = rng.standard_normal((8, 32)).astype(np.float32)
    kwargs.setdefault("pattern", "2:4")
    with pytest.raises(ValueError, match=match):
        sparq.prune(w, **kwargs)


def test_nan_in_inputs_or_weight_is_named(rng):
    w = rng.standard_normal((8, 32)).astype(np.float32)
    x = rng.standard_normal((10, 32)).astype(np.float32)
    x[3, 7] = np.nan
    with pytest.raises(ValueError, match="inputs"):
        sparq.prune(w, "2:4", method="sparsegpt", inputs=x)
    w[1, 2] = np.inf
    with pytest.raises(ValueError):
        sparq.prune(w, "2:4", method="magnitude")


def test_bad_hessian_is_named(rng):
    w = rng.standard_normal((8, 32)).astype(np.float32)
    h = np.eye(32)
    h[3, 4] = 1.0  # not symmetric
    with pytest.raises(ValueError, match="symmetric"):
        sparq.prune(w, "2:4", method="sparsegpt", hessian=h)
    h = np.eye(32)
    h[5, 5] = np.nan
    with pytest.raises(ValueError):
        sparq.prune(w, "2:4", method="sparsegpt", hessian=h)
