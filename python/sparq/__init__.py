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
import os
import operator
import tempfile
import weakref
from typing import Optional, Union

import numpy as np


def _fix_openblas_core() -> None:
    """Sets OPENBLAS_CORETYPE as the ``sparq`` command does, before OpenBLAS loads with _sparq.

    Debian's OpenBLAS mis-detects CPUs newer than itself and runs its SSE3 kernels (dense f32 3-5x
    slower, and other bits than the command line's). It reads OPENBLAS_CORETYPE once, when it
    loads; the command line restarts itself with it set, Python asks a child process that loads
    _sparq (about 0.1 s, once per import). A value the user set, or SPARQ_KEEP_BLAS_CORE=1, is
    kept.
    """
    if os.environ.get("OPENBLAS_CORETYPE") or os.environ.get("SPARQ_KEEP_BLAS_CORE"):
        return
    import importlib.util
    import subprocess
    import sys
    spec = importlib.util.find_spec("sparq._sparq")
    if spec is None or not spec.origin:
        return
    child = ("import importlib.machinery as m, importlib.util as u, sys\n"
             "l = m.ExtensionFileLoader('sparq._sparq', sys.argv[1])\n"
             "s = u.spec_from_file_location('sparq._sparq', sys.argv[1], loader=l)\n"
             "mod = u.module_from_spec(s); l.exec_module(mod)\n"
             "print(mod._suggested_blas_core())\n")
    env = dict(os.environ, SPARQ_KEEP_BLAS_CORE="1")
    try:
        out = subprocess.run([sys.executable, "-c", child, spec.origin], env=env,
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return  # OpenBLAS keeps its own choice: slower, never wrong
    core = out.strip()
    if core.isalnum():
        os.environ["OPENBLAS_CORETYPE"] = core


_fix_openblas_core()

from . import _sparq  # noqa: E402  (after OPENBLAS_CORETYPE is set)
from ._sparq import Pattern, supported_isas  # noqa: E402

__all__ = ["Pattern", "SparseMatrix", "Linear", "prune", "PruneResult", "supported_isas", "Model",
           "load", "prune_model"]
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

    Build one with :meth:`from_dense`, or take a loaded model's layer with :meth:`Model.layer`.
    ``W @ x`` multiplies with ``x`` of shape ``[k]`` (giving ``[m]``) or ``[k, n]`` (giving
    ``[m, n]``) through sparq's kernels; the weight is packed for them on the first product and
    reused after (a model's layer is already packed: it runs on the model's own weight).
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
        """The matrix as float32 ``[m, k]`` (a new array; bit-exact for f32 values; a model
        layer's quantized values dequantized as its kernels read them)."""
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

    def kernel_name(self, n: int = 1) -> str:
        """The kernel a product with n columns of x runs (the weight is packed for it first)."""
        return self._core().kernel_name(operator.index(n))

    def _core(self):
        """What runs the products: a model layer's own packed weight, else a Linear's."""
        if self._lin is None:
            self._lin = self._m if isinstance(self._m, _sparq._ModelLayer) else Linear(self)._lin
        return self._lin

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
        if x.ndim == 1:
            return self._core().forward(_f32(x, "x")[None, :])[0]
        if x.ndim == 2:
            # W @ x = (x.T @ W.T).T: the kernel reads x.T [n, k] row-major, which is x itself when
            # x is Fortran-ordered (no copy); the result [n, m] is returned as its transpose view.
            return self._core().forward(np.ascontiguousarray(x.T)).T
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
        if isinstance(weight._m, _sparq._ModelLayer):
            raise ValueError(
                f"Linear: {weight._m.name} is a model's layer, already packed with the model's "
                "kernel config: multiply with it directly (layer @ x), or repack a copy with "
                "SparseMatrix.from_dense(layer.to_dense(), ...)")
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


# ---- whole models ----------------------------------------------------------------------------

TextLike = Union[str, "os.PathLike[str]"]


def _text(text, name: str) -> str:
    """A str is the text itself; a path object (pathlib.Path) names a UTF-8 file, read and checked
    as the command line reads --text / --calib (an empty or non-UTF-8 file raises, naming it)."""
    if isinstance(text, os.PathLike):
        return _sparq.read_text_file(os.fspath(text)).decode("utf-8")
    if isinstance(text, str):
        return text
    raise ValueError(f"{name} must be a str (the text) or a path object (a text file), "
                     f"got {type(text).__name__}")


def _cpu_model() -> str:
    """/proc/cpuinfo's "model name", as `sparq bench model` reports it ("" if unknown)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _file_bytes(path: str) -> int:
    """Bytes of a model file, or of the files directly in a model folder (as `sparq bench`)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())


class Model:
    """A Llama-architecture model loaded by :func:`load` (GGUF, Hugging Face folder or .sparq).

    Every linear layer is packed once for this machine's best kernels. Methods run with the GIL
    released; calls on one model from several Python threads run one at a time.
    """

    __slots__ = ("_m", "_path", "_tmpdir", "prune_report", "__weakref__")

    def __init__(self, _m, path: str, _tmpdir=None, prune_report=None):
        self._m = _m
        self._path = path
        self._tmpdir = _tmpdir  # a prune_model result's temporary folder, removed with the model
        #: prune_model's report (``sparq prune --json``), None for a loaded model.
        self.prune_report = prune_report

    @property
    def path(self) -> str:
        """The file or folder the model was loaded from."""
        return self._path

    @property
    def config(self) -> dict:
        """The architecture: n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, ..."""
        return self._m.config

    @property
    def n_layers(self) -> int:
        return self._m.config["n_layer"]

    @property
    def hidden(self) -> int:
        return self._m.config["n_embd"]

    @property
    def vocab(self) -> int:
        return self._m.config["n_vocab"]

    @property
    def n_params(self) -> int:
        """Parameters: linear layers, the head when untied, embedding, norms (as `sparq bench`)."""
        return int(self._m.n_params)

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights as stored for compute (layers packed, head, embedding, norms)."""
        return self._m.weight_bytes

    @property
    def values(self) -> str:
        """What the blocks' linear layers store: "f32", "bf16", "int4:g64", "bf16+f32", ..."""
        return self._m.values

    @property
    def layers(self) -> dict:
        """{name: {"format", "values", "shape", "nbytes"}} for every linear layer as stored for
        compute, in GGUF names ("blk.0.attn_q.weight", ..., "output.weight")."""
        return self._m.layers

    @property
    def threads(self) -> int:
        return self._m.threads

    @property
    def isa(self) -> str:
        """The SIMD target the kernels run (Highway's name: "AVX3", "AVX2", ...)."""
        return self._m.isa

    @property
    def int8_activations(self) -> bool:
        """Whether decode rounds activations to int8 where a kernel for it exists (see
        :func:`load`)."""
        return self._m.int8_activations

    @property
    def kv_cache(self) -> str:
        """The values of the KV cache eval, generate, logits and bench run on: "f32" or "f16"
        (see :func:`load`)."""
        return self._m.kv_cache

    def layer(self, name: str) -> SparseMatrix:
        """The linear layer ``name`` (a key of :attr:`layers`, e.g. "blk.0.attn_q.weight") as a
        :class:`SparseMatrix` ``[m, k]`` that shares the model's packed weight (no copy; it keeps
        the model alive). ``layer @ x`` runs the model's own kernels (with its threads, and with
        int8 activations for one column of x where :attr:`int8_activations` applies);
        ``to_dense()`` gives the values the kernels multiply with (quantized ones dequantized),
        in the model's input-column order (a layer pruned with ``permute`` is un-permuted, and
        ``@`` gathers x as the model does). ``format``/``values`` are those of :attr:`layers`
        (its "format"'s first word); ``density`` densifies once. Cannot be repacked into a
        :class:`Linear` (use ``to_dense()``). An unknown name raises ValueError."""
        if not isinstance(name, str):
            raise ValueError(f"layer name must be a str, got {type(name).__name__}")
        return SparseMatrix(self._m.layer(name))

    def tokenize(self, text: str) -> list:
        """Token ids of ``text`` (no BOS), as `sparq eval` tokenizes its text."""
        return self._m.tokenize(_text(text, "text"))

    def logits(self, tokens) -> np.ndarray:
        """float32 [len(tokens), vocab]: the next-token logits at every position of ``tokens``
        (ids), run from an empty context."""
        return self._m.logits([operator.index(t) for t in tokens])

    def eval(self, text: TextLike, ctx: int = 512, max_tokens: Optional[int] = None,
             step: int = 0) -> dict:
        """Perplexity over non-overlapping windows of ``ctx`` tokens, as ``sparq eval MODEL
        --text FILE --ctx CTX --max-tokens N --step S --json`` computes it (the same library call).

        text: the text (str) or a path object naming a UTF-8 file. max_tokens: use only the
        first N tokens (None: all). step: feed each window ``step`` tokens per forward pass
        through the KV cache (1: token by token, the products generation decodes with, e.g. the
        int8 ones of ``int8_activations``; 0: the whole window at once). Returns the command's
        JSON object: perplexity, tokens (the predicted ones), ctx, windows, seconds, model,
        threads, isa, attention_isa, step, int8_activations.
        """
        max_tokens = 0 if max_tokens is None else operator.index(max_tokens)
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 or None, got {max_tokens}")
        r = self._m.eval(_text(text, "text"), operator.index(ctx), max_tokens,
                         operator.index(step))
        r["model"] = self._path
        return r

    def generate(self, prompt: str, max_new: int = 64, temperature: float = 0.0,
                 top_k: int = 40, top_p: float = 1.0, seed: int = 42, raw: bool = False) -> str:
        """The text ``sparq generate MODEL --prompt PROMPT`` prints with the same options (without
        its final newline): greedy at temperature 0, else sampled from the top_k / top_p
        tokens with ``seed``. The prompt goes in the model's chat template unless ``raw`` (an
        unrecognised template: the raw prompt and a UserWarning, as the command warns)."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
        seed = operator.index(seed)
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        text, _, _ = self._m.generate(prompt, operator.index(max_new), float(temperature),
                                      operator.index(top_k), float(top_p), seed, bool(raw))
        return text.decode("utf-8", errors="replace")

    def bench(self, prompt: int = 512, decode: int = 32, repeats: int = 3) -> dict:
        """Prefill and decode speed as ``sparq bench model MODEL --json --threads T`` measures it
        (medians of ``repeats`` runs: a ``prompt``-token prefill, then ``decode`` greedy steps),
        as a dict with that command's row keys (docs/bench-json.md), variant "as_stored".
        The prompt is the command's synthetic id sequence (taken modulo a vocabulary smaller than
        20,100 ids); perplexity is None (use :meth:`eval`)."""
        prompt, decode, repeats = (operator.index(v) for v in (prompt, decode, repeats))
        pre, dec = self._m.bench(prompt, decode, repeats)
        fb = _file_bytes(self._path)
        return {
            "model": os.path.basename(os.path.normpath(self._path)),
            "variant": "as_stored",
            "runtime": "sparq",
            # As the command: "int8" where decode rounds X (int8_activations and a kernel for
            # the model's weights), else "f32".
            "activations": "int8" if self._m.decode_rounds_x else "f32",
            "kv_cache": self._m.kv_cache,
            "decode_tok_s": dec,
            "prefill_tok_s": pre,
            "weight_bytes": self._m.weight_bytes,
            "block_linear_bytes": self._m.block_linear_bytes,
            "weight_bytes_per_token": self._m.weight_bytes_per_token,
            "values": self._m.values,
            "file_bytes": fb,
            "bits_per_weight": 8.0 * fb / self._m.n_params,
            "perplexity": None,
            "threads": self._m.threads,
            "prompt_tokens": prompt,
            "decode_tokens": decode,
            "cpu_model": _cpu_model(),
            "isa": self._m.isa,
        }

    def save(self, path: Union[str, "os.PathLike[str]"], values: Optional[str] = None) -> None:
        """Writes the model as a .sparq checkpoint every sparq command reads (atomically), as
        loaded. A model loaded from a .sparq file (or made by :func:`prune_model`): a byte copy
        of that file. One loaded from a GGUF file or a Hugging Face folder: its configuration,
        tokenizer and weights, GGUF layers run as stored (``gguf_values="as-stored"``: Q4_0 /
        Q4_1 / Q8_0) keeping their codes and scales (the same model bit for bit, about the
        GGUF's size), f32 weights stored as ``values``: "f32" (default, bit for bit), "bf16" or
        "f16" (rounded; f16 refuses a weight beyond its range). ``values`` on a .sparq model, or
        another name, raises ValueError; OSError where the file cannot be written (a missing
        folder, say); nothing is left behind then."""
        self._m.save(os.fspath(path), values)

    def __repr__(self) -> str:
        c = self._m.config
        return (f"Model('{self._path}', layers={c['n_layer']}, hidden={c['n_embd']}, "
                f"vocab={c['n_vocab']}, values='{self._m.values}', "
                f"weight_bytes={self._m.weight_bytes})")


def load(path: Union[str, "os.PathLike[str]"], threads: Optional[int] = None,
         gguf_values: str = "as-stored", int8_activations: bool = True,
         kv_cache: str = "f32") -> Model:
    """Loads a model: a .gguf file, a .sparq checkpoint or a Hugging Face Llama folder.

    threads: None uses every hardware thread. gguf_values: "as-stored" (the command line's
    default: a GGUF's Q4_0 / Q4_1 / Q8_0 linear layers run as stored) or "f32" (dequantized).
    int8_activations: the command line's ``--activations int8`` (True, the default, as there)
    or ``f32`` (False): decode (a few tokens per
    product) rounds activations to int8 per 32 columns, as llama.cpp does, where a kernel for
    it exists: 2:4 int4 layers with groups of 64 or more and dense int8 / int4 layers and heads
    (a GGUF's Q8_0 / Q4_0 / Q4_1 as stored), on AVX-512 VNNI + VBMI CPUs (Highway's "AVX3_DL" in
    :func:`supported_isas`) and on AVX2: up to 2-4x the speed at ~0.5% relative error per
    product. Elsewhere, and for prefill, it changes nothing; off, every product has the f32
    product's bits.
    kv_cache: the command line's ``--kv-cache``: "f32", or "f16" (keys and values rounded to f16
    as they are written, as llama.cpp's default cache: half the bytes decode attention reads).
    A tied head stored quantized (a GGUF's Q8_0 head as stored, a .sparq's int8 / int4
    embedding) is also the embedding lookup: no f32 copy of the table is kept (the same bits).
    A missing file raises OSError, a malformed one ValueError, with the command line's message.
    """
    path = os.fspath(path)
    if not isinstance(int8_activations, (bool, np.bool_)):
        raise ValueError(f"int8_activations must be a bool, got {int8_activations!r}")
    return Model(_sparq._Model.load(path, _threads(threads), gguf_values, bool(int8_activations),
                                    str(kv_cache)), path)


def prune_model(
    model: Union[Model, str, "os.PathLike[str]"],
    pattern: PatternLike = "2:4",
    method: str = "sparsegpt",
    calib: TextLike = None,
    values: str = "f32",
    out: Union[str, "os.PathLike[str]", None] = None,
    *,
    calib_samples: int = 64,
    calib_len: int = 512,
    blocks: Optional[int] = None,
    damp: float = 0.01,
    seed: int = 0,
    include: Optional[str] = None,
    permute: bool = False,
    embedding_values: Optional[str] = None,
    quant_method: str = "gptq",
    act_order: Optional[bool] = None,
    threads: Optional[int] = None,
    embedding_int8_rows: int = 0,
) -> Model:
    """Calibrates and prunes a whole model, as ``sparq prune MODEL --pattern P --method M
    --calib TEXT --values V -o OUT`` does (the same library call, byte-identical output).

    model: a :class:`Model` (its file is pruned: a dense GGUF / Hugging Face model) or a path.
    calib: the calibration text (str) or a path object naming a UTF-8 file; required.
    out: where the .sparq goes; None writes it to a temporary file that lives as long as the
    returned model (:meth:`Model.save` copies it). The other options are the command's flags
    (``blocks``: prune only the first N blocks; ``include``: regex over layer names;
    ``act_order``: GPTQ's act-order, as the command line: None (default) runs it wherever it
    applies (int8 / int4 ``values``, ``quant_method="gptq"``, no ``permute``, SparseGPT or
    ``pattern="dense"``), True insists (ValueError where it cannot run), False turns it off).
    Returns the pruned model, loaded with the same threads (and a Model argument's
    ``int8_activations`` and ``kv_cache``); its ``prune_report`` is the command's JSON report.
    """
    int8, kv_cache = True, "f32"  # load's defaults
    if isinstance(model, Model):
        src = model.path
        int8, kv_cache = model.int8_activations, model.kv_cache
        if threads is None:
            threads = model.threads
    else:
        src = os.fspath(model)
    if calib is None:
        raise ValueError("prune_model: calib is required (a text, or a pathlib.Path to one)")
    text = _text(calib, "calib")
    tmpdir = None
    if out is None:
        tmpdir = tempfile.TemporaryDirectory(prefix="sparq-prune-")
        out = os.path.join(tmpdir.name, "pruned.sparq")
    out = os.fspath(out)
    n = _threads(threads)
    report = _sparq.prune_model(
        src, text, out, str(_pattern(pattern)), method, values, embedding_values or "",
        quant_method, operator.index(calib_samples), operator.index(calib_len),
        -1 if blocks is None else operator.index(blocks), float(damp), operator.index(seed),
        include or "", bool(permute), None if act_order is None else bool(act_order), n,
        operator.index(embedding_int8_rows))
    pruned = Model(_sparq._Model.load(out, n, "as-stored", int8, kv_cache), out, tmpdir,
                   json.loads(report))
    return pruned
