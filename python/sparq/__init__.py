"""sparq: sparse weights, their kernels and one-shot pruning, from NumPy.

Shapes follow sparq's convention: a weight ``W`` has shape ``[m, k]`` (m outputs, k inputs) and a
layer computes ``y = x @ W.T (+ bias)`` for ``x`` of shape ``[..., k]``. N:M groups run along k.

Arrays are float32 (masks: bool or uint8). Another dtype raises ``ValueError`` rather than being
converted silently; C-contiguous arrays are passed to the C++ core without a copy, others are
copied once. Errors from the core (bad pattern, shape, NaN, ...) raise ``ValueError`` with the
same message the ``sparq`` command line prints. Kernels and pruning release the GIL.

See docs/python.md for an example.
"""

from __future__ import annotations

import json
import operator
from typing import Optional, Union

import numpy as np

from . import _sparq
from ._sparq import Pattern, supported_isas

__all__ = ["Pattern", "SparseMatrix", "Linear", "prune", "PruneResult", "supported_isas"]
__version__ = "0.1.0"

PatternLike = Union[Pattern, str]


def _pattern(p: Optional[PatternLike]) -> Optional[Pattern]:
    if p is None or isinstance(p, Pattern):
        return p
    if isinstance(p, str):
        return Pattern(p)
    raise ValueError(
        f"pattern must be a sparq.Pattern or a string such as '2:4', got {type(p).__name__}")


def _f32(a, name: str, ndim: Optional[int] = None) -> np.ndarray:
    """`a` as a C-contiguous float32 array: no copy when it already is one."""
    a = np.asarray(a)
    if a.dtype != np.float32:
        raise ValueError(
            f"{name}: dtype must be float32, got {a.dtype} (convert with .astype(np.float32))")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name}: must be {ndim}-D, got shape {a.shape}")
    return np.ascontiguousarray(a)


def _threads(threads) -> int:
    """None: every hardware thread; else a positive integer (NumPy integers too)."""
    if threads is None:
        return _sparq.hardware_threads()
    try:
        n = operator.index(threads)
    except TypeError:
        n = 0
    if isinstance(threads, bool) or n < 1:
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    return n


class SparseMatrix:
    """A weight ``W [m, k]`` stored in one of sparq's formats (dense, coo, csr, bsr, nm, vnm).

    Build one with :meth:`from_dense`. ``W @ x`` multiplies with ``x`` of shape ``[k]`` (giving
    ``[m]``) or ``[k, n]`` (giving ``[m, n]``) through sparq's kernels; the weight is packed for
    them on the first product and reused after.
    """

    __slots__ = ("_m", "_lin")

    def __init__(self, _m):
        self._m = _m
        self._lin = None

    @classmethod
    def from_dense(
        cls,
        w,
        pattern: Optional[PatternLike] = None,
        mask=None,
        format: str = "auto",
        values: str = "f32",
    ) -> "SparseMatrix":
        """Encodes ``w`` (float32 ``[m, k]``) without pruning it.

        pattern: the structure ``w`` already has (``"2:4"``, ``"block:16x16"``, ...); a ``w`` that
            does not satisfy it raises ValueError (prune it first with :func:`prune`).
        mask: bool/uint8 ``[m, k]``, 1 = keep: the weight is ``w * mask``. Without a pattern it is
            stored as CSR holding exactly the kept positions (zeros included).
        format: ``"auto"`` (nm for N:M, vnm for V:N:M, bsr for blocks, csr for a mask or an
            unstructured pattern, dense otherwise) or one of dense, coo, csr, bsr, nm, vnm.
        values: ``"f32"``, ``"bf16"`` or ``"f16"`` (rounded to nearest even; ``to_dense`` then
            returns the rounded values).
        """
        w = _f32(w, "w", ndim=2)
        if mask is not None:
            mask = np.asarray(mask)
            if mask.dtype == np.bool_:
                mask = mask.view(np.uint8)
            elif mask.dtype != np.uint8:
                raise ValueError(f"mask: dtype must be bool or uint8, got {mask.dtype}")
            if mask.ndim != 2:
                raise ValueError(f"mask: must be 2-D, got shape {mask.shape}")
            mask = np.ascontiguousarray(mask)
        return cls(_sparq._Matrix.from_dense(w, _pattern(pattern), mask, format, values))

    def to_dense(self) -> np.ndarray:
        """The matrix as float32 ``[m, k]`` (a new array; bit-exact for f32 values)."""
        return self._m.to_dense()

    @property
    def shape(self) -> tuple:
        return (self._m.rows, self._m.cols)

    @property
    def nbytes(self) -> int:
        """Bytes of every stored part (values, indices, metadata)."""
        return self._m.nbytes

    @property
    def format(self) -> str:
        return self._m.format

    @property
    def values(self) -> str:
        return self._m.values

    @property
    def density(self) -> float:
        """Nonzero entries / (m * k)."""
        return self._m.density

    def __repr__(self) -> str:
        m, k = self.shape
        return (f"SparseMatrix(shape=({m}, {k}), format='{self.format}', values='{self.values}', "
                f"density={self.density:.4f}, nbytes={self.nbytes})")

    def __matmul__(self, x) -> np.ndarray:
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"x: dtype must be float32, got {x.dtype}")
        if x.ndim in (1, 2) and x.shape[0] != self._m.cols:
            raise ValueError(f"x: W is {self.shape}, so x must be [{self._m.cols}] or "
                             f"[{self._m.cols}, n], got shape {x.shape}")
        if self._lin is None:
            self._lin = Linear(self)
        if x.ndim == 1:
            return self._lin._lin.forward(_f32(x, "x")[None, :])[0]
        if x.ndim == 2:
            # W @ x = (x.T @ W.T).T: the kernel reads x.T [n, k] row-major, which is x itself when
            # x is Fortran-ordered (no copy); the result [n, m] is returned as its transpose view.
            return self._lin._lin.forward(np.ascontiguousarray(x.T)).T
        raise ValueError(f"x: must be [k] or [k, n], got shape {x.shape}")


class Linear:
    """``y = x @ W.T + bias`` through sparq's kernels, for ``x`` float32 ``[..., k]``.

    weight: a :class:`SparseMatrix` or a dense float32 ``[m, k]`` array (stored dense f32).
    bias: float32 ``[m]`` or None. threads: kernel threads (None: every hardware thread); the
    result does not depend on it. isa: cap on the kernels' instruction set (one of
    :func:`supported_isas`, e.g. ``"AVX2"`` on an AVX-512 machine; None: the best this CPU
    runs). The weight is packed once, here. Calls from several Python
    threads on one Linear run one at a time (each uses all of its threads).
    """

    __slots__ = ("_lin", "shape")

    def __init__(self, weight, bias=None, threads: Optional[int] = None,
                 isa: Optional[str] = None):
        if not isinstance(weight, SparseMatrix):
            weight = SparseMatrix.from_dense(weight, format="dense")
        if bias is not None:
            bias = _f32(bias, "bias", ndim=1)
        self._lin = _sparq._Linear(weight._m, bias, _threads(threads), isa or "")
        self.shape = weight.shape

    @property
    def threads(self) -> int:
        return self._lin.threads

    @property
    def format(self) -> str:
        """How the weight is stored for compute, e.g. 'nm 2:4 f32'."""
        return self._lin.format

    @property
    def isa(self) -> str:
        """The instruction set the kernels run ('AVX3_DL', 'AVX2', ...)."""
        return self._lin.isa

    def kernel_name(self, n: int = 1) -> str:
        """The kernel a call with n rows of x runs."""
        return self._lin.kernel_name(n)

    def __call__(self, x) -> np.ndarray:
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"x: dtype must be float32, got {x.dtype}")
        if x.ndim == 0:
            raise ValueError("x: must have shape [..., k], got a scalar")
        k = x.shape[-1]
        if x.ndim == 2 and x.strides[1] == 4 and x.strides[0] >= 4 * k:
            # Rows of a 2-D x may be padded (a slice of a wider array): no copy.
            return self._lin.forward(x)
        rows = int(np.prod(x.shape[:-1], dtype=np.int64))  # reshape(-1, k) fails for k = 0
        y = self._lin.forward(np.ascontiguousarray(x).reshape(rows, k))
        return y.reshape(x.shape[:-1] + (y.shape[1],))

    def __repr__(self) -> str:
        return (f"Linear(shape={self.shape}, format='{self.format}', isa='{self.isa}', "
                f"threads={self.threads})")


class PruneResult:
    """What :func:`prune` returns: ``weight`` (float32 [m, k]), ``mask`` (bool [m, k], True =
    nonzero in ``weight``) and ``report`` (the dict ``sparq prune-layer --report`` writes)."""

    __slots__ = ("weight", "mask", "report")

    def __init__(self, weight, mask, report):
        self.weight, self.mask, self.report = weight, mask, report

    def __iter__(self):  # w, mask, report = sparq.prune(...)
        return iter((self.weight, self.mask, self.report))

    def __repr__(self) -> str:
        r = self.report
        err = r.get("rel_error")
        err = "None" if err is None else f"{err:.4g}"
        return (f"PruneResult(method='{r['method']}', pattern='{r['pattern']}', "
                f"sparsity={r['sparsity']:.4f}, rel_error={err})")


def prune(
    w,
    pattern: PatternLike,
    method: str = "sparsegpt",
    inputs=None,
    hessian=None,
    damp: float = 0.01,
    blocksize: int = 128,
    threads: Optional[int] = None,
) -> PruneResult:
    """Prunes one layer's weight ``w`` (float32 ``[m, k]``; not modified) to ``pattern``.

    method: ``"magnitude"`` (needs no calibration data), ``"wanda"`` or ``"sparsegpt"``, the
        latter two with ``inputs`` (the layer's inputs X, float32 ``[N, k]``, rows = tokens) or
        ``hessian`` (H = X^T X / N, float64 ``[k, k]``).
    damp, blocksize: SparseGPT's dampening fraction and column block.
    Returns a :class:`PruneResult` (unpacks as ``weight, mask, report``); ``report['rel_error']``
    is the layer's relative reconstruction error, None without calibration data.
    """
    if pattern is None:
        raise ValueError("prune: pattern is required (e.g. '2:4', 'unstructured:0.5')")
    w = _f32(w, "w", ndim=2)
    if inputs is not None:
        inputs = _f32(inputs, "inputs", ndim=2)
    if hessian is not None:
        hessian = np.asarray(hessian)
        if hessian.dtype != np.float64:
            raise ValueError(f"hessian: dtype must be float64, got {hessian.dtype}")
        if hessian.ndim != 2:
            raise ValueError(f"hessian: must be 2-D, got shape {hessian.shape}")
        hessian = np.ascontiguousarray(hessian)
    pw, mask, report = _sparq.prune(w, _pattern(pattern), method, inputs, hessian, float(damp),
                                    int(blocksize), _threads(threads))
    return PruneResult(pw, mask.view(np.bool_), json.loads(report))
