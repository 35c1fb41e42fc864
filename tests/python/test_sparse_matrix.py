import numpy as np
import pytest

import sparq
from refs import assert_matmul_close, bf16_round, prune_nm_reference


def nm_weight(rng, m=24, k=52, n=2, mm=4):
    # k = 52: 13 groups of 4, not a multiple of the kernels' 8- and 16-column tiles
    return prune_nm_reference(rng.standard_normal((m, k)).astype(np.float32), n, mm)


@pytest.mark.parametrize("fmt", ["auto", "dense", "coo", "csr", "nm"])
def test_round_trip_bit_exact_and_properties(rng, fmt):
    w = nm_weight(rng)
    s = sparq.SparseMatrix.from_dense(w, pattern="2:4", format=fmt)
    assert s.format == ("nm" if fmt == "auto" else fmt)
    assert s.shape == w.shape
    assert s.values == "f32"
    assert s.density == pytest.approx(np.count_nonzero(w) / w.size)
    assert s.nbytes > 0
    d = s.to_dense()
    assert d.dtype == np.float32 and d.flags.c_contiguous
    np.testing.assert_array_equal(d.view(np.uint32), w.view(np.uint32))


def test_nbytes_of_nm_and_dense(rng):
    w = nm_weight(rng, m=16, k=64)
    dense = sparq.SparseMatrix.from_dense(w, format="dense")
    nm = sparq.SparseMatrix.from_dense(w, pattern="2:4")
    assert dense.nbytes == 16 * 64 * 4
    # 2:4 f32: half the values plus 2 bits of index per kept value
    assert nm.nbytes == 16 * 32 * 4 + 16 * 32 * 2 // 8


def test_block_and_vnm_formats(rng):
    w = rng.standard_normal((32, 64)).astype(np.float32)
    w.reshape(4, 8, 4, 16)[:, :, 1::2, :] = 0  # half of the 8x16 blocks zero
    s = sparq.SparseMatrix.from_dense(w, pattern="block:8x16")
    assert s.format == "bsr"
    np.testing.assert_array_equal(s.to_dense(), w)
    x = rng.standard_normal((64, 3)).astype(np.float32)
    assert_matmul_close(s @ x, w, x)


def test_bf16_values_round_to_nearest_even(rng):
    w = nm_weight(rng)
    s = sparq.SparseMatrix.from_dense(w, pattern="2:4", values="bf16")
    assert s.values == "bf16"
    np.testing.assert_array_equal(s.to_dense(), bf16_round(w))
    x = rng.standard_normal((w.shape[1], 5)).astype(np.float32)
    assert_matmul_close(s @ x, s.to_dense(), x)


@pytest.mark.parametrize("n", [1, 3, 17])
@pytest.mark.parametrize("values", ["f32", "bf16"])
def test_matmul_matrix_and_vector(rng, n, values):
    w = nm_weight(rng, m=40, k=100)
    s = sparq.SparseMatrix.from_dense(w, pattern="2:4", values=values)
    wd = s.to_dense()
    x = rng.standard_normal((100, n)).astype(np.float32)
    y = s @ x
    assert y.shape == (40, n) and y.dtype == np.float32
    assert_matmul_close(y, wd, x)
    # a Fortran-ordered x is read in place; a C-ordered one is copied: same numbers
    np.testing.assert_array_equal(s @ np.asfortranarray(x), y)
    v = s @ x[:, 0].copy()
    assert v.shape == (40,)
    assert_matmul_close(v[:, None], wd, x[:, :1])


def test_mask_is_kept_exactly(rng):
    w = rng.standard_normal((20, 30)).astype(np.float32)
    mask = rng.random((20, 30)) < 0.3
    w[0, :] = 0  # kept zeros stay stored: the mask survives whatever the kept values are
    s = sparq.SparseMatrix.from_dense(w, mask=mask)
    assert s.format == "csr"
    np.testing.assert_array_equal(s.to_dense(), np.where(mask, w, 0))
    # the stored positions are the mask's: nnz from nbytes (i64 row_ptr, u16 col_idx, f32 values)
    nnz = (s.nbytes - 21 * 8) // 6
    assert nnz == np.count_nonzero(mask)
    s8 = sparq.SparseMatrix.from_dense(w, mask=mask.astype(np.uint8))
    np.testing.assert_array_equal(s8.to_dense(), s.to_dense())


def test_mask_with_pattern_encodes_the_pattern(rng):
    w = rng.standard_normal((8, 16)).astype(np.float32)
    mask = prune_nm_reference(w, 2, 4) != 0
    s = sparq.SparseMatrix.from_dense(w, pattern="2:4", mask=mask)
    assert s.format == "nm"
    np.testing.assert_array_equal(s.to_dense(), np.where(mask, w, 0))


def test_unpruned_weight_does_not_satisfy_pattern(rng):
    w = rng.standard_normal((8, 16)).astype(np.float32)
    with pytest.raises(ValueError, match=r"does not satisfy pattern 2:4"):
        sparq.SparseMatrix.from_dense(w, pattern="2:4")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(w=np.zeros((4, 8), np.float64)), "dtype must be float32"),
        (dict(w=np.zeros((4, 8, 2), np.float32)), "must be 2-D"),
        (dict(w=np.zeros((4, 8), np.float32), format="ell"), "format 'ell'"),
        (dict(w=np.zeros((4, 8), np.float32), values="fp8"), "fp8"),
        (dict(w=np.zeros((4, 8), np.float32), values="int4:g64"), "quantized values"),
        (dict(w=np.zeros((4, 8), np.float32), mask=np.ones((4, 7), bool)), "mask has shape"),
        (dict(w=np.zeros((4, 8), np.float32), mask=np.ones((4, 8), np.int32)), "mask: dtype"),
        (dict(w=np.zeros((4, 8), np.float32), format="nm"), "nm needs an N:M pattern"),
        (dict(w=np.zeros((4, 2), np.float32), pattern="2:4"), "2:4"),
        (dict(w=np.zeros((4, 8), np.float32), pattern="2:5:x"), "2:5:x"),
    ],
)
def test_bad_input_raises_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sparq.SparseMatrix.from_dense(**kwargs)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weight_is_named(bad):
    w = np.zeros((4, 8), np.float32)
    w[2, 5] = bad
    with pytest.raises(ValueError, match=r"w: element \[2, 5\]"):
        sparq.SparseMatrix.from_dense(w)


def test_matmul_errors(rng):
    s = sparq.SparseMatrix.from_dense(nm_weight(rng, m=8, k=16), pattern="2:4")
    with pytest.raises(ValueError, match=r"x must be \[16\] or \[16, n\], got shape \(15, 2\)"):
        s @ np.zeros((15, 2), np.float32)
    with pytest.raises(ValueError, match="dtype must be float32"):
        s @ np.zeros((16, 2), np.float64)
    with pytest.raises(ValueError, match=r"must be \[k\] or \[k, n\]"):
        s @ np.zeros((16, 2, 2), np.float32)


def test_non_contiguous_weight_is_copied(rng):
    w = nm_weight(rng, m=8, k=32)
    wide = np.zeros((8, 64), np.float32)
    wide[:, ::2] = w
    s = sparq.SparseMatrix.from_dense(wide[:, ::2], pattern="2:4")
    np.testing.assert_array_equal(s.to_dense(), w)
