import numpy as np
import pytest

import sparq
from refs import assert_matmul_close, matmul_tolerance, prune_nm_reference


def weight(rng, m=48, k=72):
    return prune_nm_reference(rng.standard_normal((m, k)).astype(np.float32), 2, 4)


@pytest.mark.parametrize("lead", [(1,), (5,), (2, 3), (33,), ()])
def test_shapes_and_values(rng, lead):
    w = weight(rng)
    b = rng.standard_normal(48).astype(np.float32)
    lin = sparq.Linear(sparq.SparseMatrix.from_dense(w, pattern="2:4"), bias=b)
    x = rng.standard_normal(lead + (72,)).astype(np.float32)
    y = lin(x)
    assert y.shape == lead + (48,) and y.dtype == np.float32
    x2 = x.reshape(-1, 72).astype(np.float64)
    ref = x2 @ w.T.astype(np.float64) + b
    # the product's bound (refs.matmul_tolerance), plus one rounding of the bias add
    tol = matmul_tolerance(w, x2.T).T + 2.0**-23 * (np.abs(ref) + np.abs(b))
    assert np.all(np.abs(y.reshape(-1, 48) - ref) <= tol)


def test_dense_array_weight_and_formats(rng):
    w = weight(rng)
    x = rng.standard_normal((7, 72)).astype(np.float32)
    for lin in [sparq.Linear(w), sparq.Linear(sparq.SparseMatrix.from_dense(w, format="csr"))]:
        assert_matmul_close(lin(x).T, w, x.T)
    assert sparq.Linear(w).format.startswith("dense")
    assert sparq.Linear(sparq.SparseMatrix.from_dense(w, pattern="2:4")).format.startswith("nm 2:4")


def test_threads_do_not_change_bits(rng):
    w = weight(rng, m=256, k=128)
    s = sparq.SparseMatrix.from_dense(w, pattern="2:4")
    x = rng.standard_normal((40, 128)).astype(np.float32)
    y1 = sparq.Linear(s, threads=1)(x)
    y2 = sparq.Linear(s, threads=np.int64(2))
    assert y2.threads == 2
    np.testing.assert_array_equal(y1, y2(x))
    np.testing.assert_array_equal(y2(x), y2(x))  # same call twice: same bits


def test_strided_and_non_contiguous_x(rng):
    w = weight(rng)
    lin = sparq.Linear(w, threads=1)
    base = rng.standard_normal((6, 100)).astype(np.float32)
    rows = base[:, :72]  # padded rows, read in place
    np.testing.assert_array_equal(lin(rows), lin(np.ascontiguousarray(rows)))
    cols = np.asfortranarray(base[:, :72])  # columns contiguous: copied
    np.testing.assert_array_equal(lin(cols), lin(np.ascontiguousarray(rows)))
    np.testing.assert_array_equal(lin(base[::2, :72]), lin(np.ascontiguousarray(base[::2, :72])))
    # Negative row stride: the same bits as the same rows copied. (Not compared with the unreversed
    # batch: a dense f32 row's bits may depend on its place in the batch, as OpenBLAS's edge tiles
    # sum in another order, e.g. its Haswell kernels for tokens 5-6 of 6.)
    np.testing.assert_array_equal(lin(rows[::-1]), lin(np.ascontiguousarray(rows[::-1])))


def test_concurrent_calls_from_python_threads(rng):
    from concurrent.futures import ThreadPoolExecutor

    lin = sparq.Linear(weight(rng, m=128, k=256), threads=2)
    xs = [rng.standard_normal((16, 256)).astype(np.float32) for _ in range(8)]
    expected = [lin(x) for x in xs]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lin, xs * 4))
    for i, y in enumerate(got):
        np.testing.assert_array_equal(y, expected[i % 8])


def test_empty_batch(rng):
    lin = sparq.Linear(weight(rng))
    assert lin(np.zeros((0, 72), np.float32)).shape == (0, 48)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda w: sparq.Linear(w)(np.zeros((3, 71), np.float32)), "x has 71 columns"),
        (lambda w: sparq.Linear(w)(np.zeros((3, 72), np.float64)), "dtype must be float32"),
        (lambda w: sparq.Linear(w)(np.float32(1)), "scalar"),
        (lambda w: sparq.Linear(w, bias=np.zeros(47, np.float32)), "bias has 47 entries"),
        (lambda w: sparq.Linear(w, bias=np.zeros(48, np.float64)), "bias: dtype"),
        (lambda w: sparq.Linear(w, bias=np.full(48, np.nan, np.float32)),
         r"bias: element \[0, 0\]"),
        (lambda w: sparq.Linear(w, threads=0), "threads"),
        (lambda w: sparq.Linear(w, threads=1.5), "threads"),
        (lambda w: sparq.Linear(w, threads=True), "threads"),
        (lambda w: sparq.Linear(w.astype(np.float16)), "dtype must be float32"),
    ],
)
def test_bad_input_raises_value_error(rng, make, match):
    with pytest.raises(ValueError, match=match):
        make(weight(rng))


def test_nan_in_x_stays_in_its_row(rng):
    # x is not scanned (it would cost a pass per call); a NaN never crashes and never reaches
    # another row's output (what it does to its own row depends on which weights are kept)
    for w in [weight(rng), rng.standard_normal((48, 72)).astype(np.float32)]:
        lin = sparq.Linear(w, threads=2)
        x = rng.standard_normal((9, 72)).astype(np.float32)
        clean = lin(x)
        x[4, 10] = np.nan
        y = lin(x)
        np.testing.assert_array_equal(np.delete(y, 4, axis=0), np.delete(clean, 4, axis=0))


@pytest.mark.parametrize("m, k", [(0, 8), (6, 0), (0, 0)])
def test_empty_weights(m, k):
    w = np.zeros((m, k), np.float32)
    b = np.arange(m, dtype=np.float32)
    for fmt in ["dense", "csr", "coo"]:
        s = sparq.SparseMatrix.from_dense(w, format=fmt)
        y = sparq.Linear(s, bias=b)(np.ones((3, 2, k), np.float32))
        np.testing.assert_array_equal(y, np.broadcast_to(b, (3, 2, m)))
        assert (s @ np.ones((k, 4), np.float32)).shape == (m, 4)


@pytest.mark.parametrize("isa", sparq.supported_isas())
@pytest.mark.parametrize("pattern, values", [("2:4", "f32"), ("2:4", "bf16"),
                                             ("unstructured:0.7", "f32"), (None, "bf16")])
def test_every_target_the_cpu_runs(rng, isa, pattern, values):
    # as the C++ tests do: every compiled target, not just the one this machine picks
    w = rng.standard_normal((40, 100)).astype(np.float32)
    if pattern == "2:4":
        w = prune_nm_reference(w, 2, 4)
    elif pattern:
        w = sparq.prune(w, pattern, method="magnitude").weight
    s = sparq.SparseMatrix.from_dense(w, pattern=pattern, values=values)
    lin = sparq.Linear(s, isa=isa, threads=2)
    assert lin.isa == isa
    for n in [1, 5, 70]:
        x = rng.standard_normal((n, 100)).astype(np.float32)
        assert_matmul_close(lin(x).T, s.to_dense(), x.T)


def test_unknown_isa():
    assert sparq.supported_isas()  # best first, at least one
    with pytest.raises(ValueError, match="NEON"):
        sparq.Linear(np.zeros((4, 8), np.float32), isa="NEON")
