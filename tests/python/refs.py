"""Independent NumPy references and tolerances for the Python tests."""

import numpy as np


def matmul_tolerance(w, x):
    """Bound on |fl32(W x) - W x| per output for W [m, k], x [k, n], both float32 exact inputs.

    A float32 dot product of length k, summed in any order (the kernels tile and reassociate),
    errs by at most gamma_k * sum_j |w_ij x_j| with gamma_k = k u / (1 - k u), u = 2^-24; we allow
    k * 2^-23 (2 k u) for the fused multiply-adds' and the blocking's extra roundings, plus a tiny
    absolute term for outputs whose terms cancel to ~0.
    """
    k = w.shape[1]
    mag = np.abs(w.astype(np.float64)) @ np.abs(x.astype(np.float64))
    return k * 2.0**-23 * mag + 1e-30


def assert_matmul_close(y, w, x):
    """y ~ W x within matmul_tolerance, against a float64 reference."""
    ref = w.astype(np.float64) @ x.astype(np.float64)
    tol = matmul_tolerance(w, x)
    assert y.shape == ref.shape
    err = np.abs(y.astype(np.float64) - ref)
    assert np.all(err <= tol), f"max err {err.max()} vs tol {tol.flat[np.argmax(err - tol)]}"


def bf16_round(a):
    """float32 -> bfloat16 -> float32 with round-to-nearest-even (finite inputs)."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def prune_nm_reference(w, n, m):
    """Magnitude N:M along each row: keep the n largest |w| of every group of m (ties: lower
    index), independently of sparq."""
    rows, k = w.shape
    out = np.zeros_like(w)
    for g in range(0, k, m):
        block = w[:, g:g + m]
        # stable argsort of -|w|: among equal magnitudes the lower index comes first
        order = np.argsort(-np.abs(block), axis=1, kind="stable")[:, :min(n, block.shape[1])]
        np.put_along_axis(out[:, g:g + m], order, np.take_along_axis(block, order, axis=1), axis=1)
    return out
