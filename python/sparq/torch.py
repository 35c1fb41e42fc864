"""sparq.torch: PyTorch interop (CPU inference through sparq's kernels).

``import sparq`` never imports this module (nor torch); ``import sparq.torch`` needs PyTorch.

- :class:`SparseLinear`: an ``nn.Module`` computing ``y = x @ W.T + bias`` with a sparq
  :class:`sparq.Linear` for ``x`` of shape ``[..., in_features]`` (CPU, float32; bfloat16 is
  widened to float32 exactly, multiplied in float32, and the result rounded back to bfloat16).
- :func:`sparsify_`: prunes every selected ``nn.Linear`` of a module (magnitude, Wanda or
  SparseGPT with calibration inputs collected by forward hooks) and swaps it for a SparseLinear,
  in place, in the spirit of torchao's ``sparsify_``.
- :func:`from_torch_prune`: swaps the ``nn.Linear`` layers pruned with ``torch.nn.utils.prune``
  (``weight_orig`` / ``weight_mask``) for SparseLinear layers holding exactly torch's mask.
- :func:`to_state_dict`: the module's ``state_dict`` with every SparseLinear written as the dense
  ``weight`` (zeros where pruned) and ``bias`` of an ``nn.Linear``: it loads into the original
  architecture. ``module.state_dict()`` gives the same.

There is no backward: sparq's backward kernels (issue 28, the C++ train room) are not exposed
to Python, so a forward whose input requires grad (with grad enabled) raises NotImplementedError.
"""

from __future__ import annotations

from typing import Callable, Optional

try:
    import torch
    from torch import nn
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sparq.torch needs PyTorch (import torch failed: " + str(e) + "); the rest of sparq "
        "(import sparq) works without it. See docs/python.md, 'Running the torch tests'.") from e

import numpy as np

from . import Linear, PatternLike, SparseMatrix, _pattern, prune

__all__ = ["SparseLinear", "sparsify_", "from_torch_prune", "to_state_dict"]

_F32, _BF16 = torch.float32, torch.bfloat16

class _SparseLinearFn(torch.autograd.Function):
    """y = x W^T + b with the gradient to x: dx = dy W, by sparq's forward kernel on W^T (packed
    once, on the first backward; `sparq bench grad` times that product against a dense sgemm).
    The layer holds no parameters, so x is the only input with a gradient."""

    @staticmethod
    def forward(ctx, x, layer):
        ctx.layer = layer
        with torch.no_grad():
            return layer._infer(x)

    @staticmethod
    def backward(ctx, gy):
        return ctx.layer._input_grad(gy), None


def _weight_f32(t, name: str) -> np.ndarray:
    """A CPU float32 (or bfloat16, widened exactly) tensor / array as a float32 NumPy array."""
    if isinstance(t, np.ndarray):
        return t
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or a NumPy array, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: sparq runs on the CPU, the tensor is on {t.device} "
                         "(move the module with .cpu() first)")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    if t.dtype != torch.float32:
        raise ValueError(f"{name}: dtype must be torch.float32 (or bfloat16), got {t.dtype}")
    return t.numpy()


class SparseLinear(nn.Module):
    """``y = x @ W.T + bias`` through sparq's kernels, as a drop-in for ``nn.Linear`` at inference.

    weight: float32 (or bfloat16) ``[out_features, in_features]`` tensor or array, already pruned.
    bias: ``[out_features]`` or None. pattern: the structure the weight has ("2:4", ...; a weight
    that does not satisfy it raises ValueError); mask: bool ``[out, in]``, 1 = keep (the weight is
    ``weight * mask``, stored as CSR holding exactly the masked positions when no pattern is
    given). format / values: as :meth:`sparq.SparseMatrix.from_dense` ("f32", "bf16", "f16").
    threads (None: every hardware thread) and isa: as :class:`sparq.Linear`.

    Gradients flow to ``x`` (``dx = dy W`` by sparq's kernel on the transposed weight, packed on
    the first backward), so the layer can sit frozen inside a model whose other parts train.
    The layer holds no ``nn.Parameter``: its weight lives packed in sparq. ``state_dict()`` writes
    it dense (zeros where pruned) under ``weight`` / ``bias``, like ``nn.Linear``; loading one
    re-encodes the given weight with this layer's pattern / mask.
    """

    def __init__(self, weight, bias=None, *, pattern: Optional[PatternLike] = None, mask=None,
                 format: str = "auto", values: str = "f32", threads: Optional[int] = None,
                 isa: Optional[str] = None):
        super().__init__()
        self._pattern = _pattern(pattern)
        self._format, self._values, self._threads, self._isa = format, values, threads, isa
        self._mask = None
        if mask is not None:
            if isinstance(mask, torch.Tensor):
                mask = mask.detach().cpu().numpy()
            mask = np.asarray(mask)
            if mask.dtype != np.bool_:
                mask = mask != 0
            self._mask = np.ascontiguousarray(mask)
        self._build(weight, bias)

    def _build(self, weight, bias) -> None:
        w = _weight_f32(weight, "weight")
        b = None if bias is None else _weight_f32(bias, "bias")
        matrix = SparseMatrix.from_dense(w, pattern=self._pattern, mask=self._mask,
                                         format=self._format, values=self._values)
        lin = Linear(matrix, bias=b, threads=self._threads, isa=self._isa)
        self._matrix, self._lin = matrix, lin
        self._lin_t = None  # W^T for the input gradient, packed on the first backward
        self.out_features, self.in_features = matrix.shape
        self._bias = None if b is None else np.array(b, dtype=np.float32)  # a copy, for export

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs) -> "SparseLinear":
        """A SparseLinear with ``linear``'s weight and bias as they are (prune them first)."""
        return cls(linear.weight, linear.bias, **kwargs)

    # ---- inference ----------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"SparseLinear: x must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_cpu:
            raise ValueError(f"SparseLinear: x is on {x.device}; sparq runs on the CPU only "
                             "(x.cpu(), and the module on the CPU)")
        if x.requires_grad and torch.is_grad_enabled():
            return _SparseLinearFn.apply(x, self)
        return self._infer(x)

    def _infer(self, x: torch.Tensor) -> torch.Tensor:
        grad = x.requires_grad
        dtype = x.dtype
        if dtype is not _F32:
            if dtype is not _BF16:
                raise ValueError(f"SparseLinear: x must be torch.float32 or bfloat16, got {dtype} "
                                 "(convert with x.float())")
            x = x.to(_F32)  # exact; the f32 result is rounded back to bf16 below
        shape = x.shape
        if not shape or shape[-1] != self.in_features:
            raise ValueError(f"SparseLinear: x must have shape [..., {self.in_features}], got "
                             f"{tuple(shape)}")
        # .numpy() of a CPU float32 tensor is a view (no copy); sparq.Linear reads contiguous
        # (and row-padded 2-D) views in place and copies other layouts once. The result array
        # becomes a tensor without a copy.
        xn = x.detach().numpy() if grad else x.numpy()
        if len(shape) == 2 and xn.flags.c_contiguous:
            y = self._lin._lin.forward(xn)  # the common case, without sparq.Linear's checks
        else:
            y = self._lin(xn)
        y = torch.from_numpy(y)
        return y if dtype is _F32 else y.to(dtype)

    def _input_grad(self, gy: torch.Tensor) -> torch.Tensor:
        """dy [..., out] -> dy W [..., in] (float32; bf16 back to bf16), W the stored weight (its
        rounded values for bf16 / f16): exactly the gradient of what forward computes."""
        if self._lin_t is None:
            # W^T is not 2:4 (its groups of four run along the other axis): a CSR holding
            # exactly the kept positions of the transposed mask.
            w = self._matrix.to_dense()
            mt = np.ascontiguousarray((self._mask if self._mask is not None else w != 0).T)
            wt = np.ascontiguousarray(w.T)
            self._lin_t = Linear(SparseMatrix.from_dense(wt, mask=mt), threads=self._threads,
                                 isa=self._isa)
        dtype = gy.dtype
        g = gy.detach().to(_F32).reshape(-1, self.out_features).contiguous()
        dx = torch.from_numpy(self._lin_t(g.numpy())).reshape(*gy.shape[:-1], self.in_features)
        return dx if dtype is _F32 else dx.to(dtype)

    # ---- what it holds ------------------------------------------------------------------------

    def to_dense(self) -> torch.Tensor:
        """The weight as a float32 ``[out, in]`` tensor, zeros where pruned (bf16 / f16 values:
        the rounded values)."""
        return torch.from_numpy(self._matrix.to_dense())

    @property
    def bias(self) -> Optional[torch.Tensor]:
        return None if self._bias is None else torch.from_numpy(self._bias.copy())

    @property
    def mask(self) -> torch.Tensor:
        """bool ``[out, in]``: the mask given at construction, else ``to_dense() != 0``."""
        if self._mask is not None:
            return torch.from_numpy(self._mask.copy())
        return self.to_dense() != 0

    def to_linear(self) -> nn.Linear:
        """An ``nn.Linear`` (float32) with the dense weight, zeros where pruned."""
        lin = nn.Linear(self.in_features, self.out_features, bias=self._bias is not None)
        with torch.no_grad():
            lin.weight.copy_(self.to_dense())
            if self._bias is not None:
                lin.bias.copy_(torch.from_numpy(self._bias))
        return lin

    @property
    def matrix(self) -> SparseMatrix:
        return self._matrix

    @property
    def format(self) -> str:
        """How the weight is stored for compute, e.g. 'nm 2:4 f32'."""
        return self._lin.format

    @property
    def density(self) -> float:
        return self._matrix.density

    @property
    def nbytes(self) -> int:
        return self._matrix.nbytes

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self._bias is not None}, format='{self.format}', "
                f"density={self.density:.4f}")

    # ---- state_dict: dense with zeros, as nn.Linear --------------------------------------------

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.to_dense()
        if self._bias is not None:
            destination[prefix + "bias"] = torch.from_numpy(self._bias.copy())

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        wk, bk = prefix + "weight", prefix + "bias"
        if wk not in state_dict:
            missing_keys.append(wk)
            return
        if self._bias is not None and bk not in state_dict:
            missing_keys.append(bk)
            return
        bias = state_dict.get(bk) if self._bias is not None else None
        try:
            self._build(state_dict[wk], bias)
        except (ValueError, TypeError) as e:
            error_msgs.append(f"while loading {wk} into a SparseLinear: {e}")


# ---- swapping layers ----------------------------------------------------------------------------

def _set_child(root: nn.Module, fqn: str, new: nn.Module) -> None:
    parent_name, _, child = fqn.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def _run_calibration(module: nn.Module, calib) -> None:
    """Feeds ``calib`` to ``module``: a tensor, or an iterable of batches (a tensor, a tuple /
    list of positional arguments, or a dict of keyword arguments)."""
    with torch.no_grad():
        if isinstance(calib, torch.Tensor):
            module(calib)
            return
        n = 0
        for batch in calib:
            if isinstance(batch, dict):
                module(**batch)
            elif isinstance(batch, (tuple, list)):
                module(*batch)
            else:
                module(batch)
            n += 1
        if n == 0:
            raise ValueError("sparsify_: calib holds no batch")


def sparsify_(
    module: nn.Module,
    pattern: PatternLike = "2:4",
    method: str = "magnitude",
    calib=None,
    filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
    values: str = "f32",
    *,
    threads: Optional[int] = None,
    damp: float = 0.01,
    blocksize: int = 128,
) -> nn.Module:
    """Prunes each selected ``nn.Linear`` of ``module`` to ``pattern`` and replaces it, in place,
    with a :class:`SparseLinear`; returns ``module``.

    method: "magnitude" (no calibration), "wanda" or "sparsegpt": these feed ``calib`` (a tensor,
        or an iterable of batches: tensors, tuples of arguments or dicts of keyword arguments)
        through the unpruned module once, collect every selected layer's inputs with forward
        pre-hooks (all of them, as float32 [tokens, in_features]), then prune each layer with
        ``sparq.prune(w, pattern, method=method, inputs=X)``. The layers see the dense model's
        activations (not those of the already pruned layers before them).
    filter_fn(mod, fqn) -> bool: which ``nn.Linear`` layers to sparsify (default: all of them).
    values: stored values ("f32", "bf16", "f16"). The weights must be on the CPU, float32 or
    bfloat16. ``module`` itself cannot be an ``nn.Linear`` (wrap it).
    Each SparseLinear keeps the report of its pruning in ``.prune_report``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"sparsify_: module must be an nn.Module, got {type(module).__name__}")
    if isinstance(module, nn.Linear):
        raise ValueError("sparsify_: module is itself an nn.Linear, which cannot be replaced in "
                         "place; wrap it (nn.Sequential(linear)) or use SparseLinear directly")
    if method not in ("magnitude", "wanda", "sparsegpt"):
        raise ValueError(f"sparsify_: method must be magnitude, wanda or sparsegpt, got {method!r}")
    pat = _pattern(pattern)
    targets = [(fqn, m) for fqn, m in module.named_modules()
               if isinstance(m, nn.Linear) and not isinstance(m, SparseLinear)
               and (filter_fn is None or filter_fn(m, fqn))]
    for fqn, m in targets:  # check before any calibration runs
        _weight_f32(m.weight, f"{fqn}.weight")

    inputs = {}
    if method != "magnitude":
        if calib is None:
            raise ValueError(f"sparsify_: method {method!r} needs calib (the module's inputs)")
        chunks = {fqn: [] for fqn, _ in targets}
        hooks = []
        for fqn, m in targets:
            def hook(mod, args, fqn=fqn):
                x = args[0].detach().to(torch.float32)
                chunks[fqn].append(x.reshape(-1, x.shape[-1]).cpu().numpy().copy())
            hooks.append(m.register_forward_pre_hook(hook))
        try:
            _run_calibration(module, calib)
        finally:
            for h in hooks:
                h.remove()
        for fqn, _ in targets:
            if not chunks[fqn]:
                raise ValueError(f"sparsify_: calib never reached layer {fqn}")
            inputs[fqn] = np.concatenate(chunks[fqn], axis=0)
            chunks[fqn] = None

    for fqn, m in targets:
        w = _weight_f32(m.weight, f"{fqn}.weight")
        try:
            r = prune(w, pat, method=method, inputs=inputs.pop(fqn, None), damp=damp,
                      blocksize=blocksize, threads=threads)
            sl = SparseLinear(r.weight, m.bias, pattern=pat, values=values, threads=threads)
        except ValueError as e:
            raise ValueError(f"sparsify_: layer {fqn}: {e}") from e
        sl.prune_report = r.report
        _set_child(module, fqn, sl)
    return module


def from_torch_prune(module: nn.Module, values: str = "f32",
                     threads: Optional[int] = None) -> nn.Module:
    """Replaces, in place, every ``nn.Linear`` pruned with ``torch.nn.utils.prune`` (it has
    ``weight_orig`` and ``weight_mask``) by a :class:`SparseLinear` whose weight is
    ``weight_orig * weight_mask`` stored as CSR at exactly torch's mask (``.mask`` gives it
    back); returns ``module``. Other layers and unpruned Linears are left as they are.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"from_torch_prune: module must be an nn.Module, got "
                        f"{type(module).__name__}")
    if isinstance(module, nn.Linear):
        raise ValueError("from_torch_prune: module is itself an nn.Linear, which cannot be "
                         "replaced in place; wrap it (nn.Sequential(linear))")
    targets = [(fqn, m) for fqn, m in module.named_modules()
               if isinstance(m, nn.Linear) and hasattr(m, "weight_orig")
               and hasattr(m, "weight_mask")]
    for fqn, m in targets:
        mask = m.weight_mask.detach()
        w = m.weight_orig.detach()
        if w.device.type != "cpu":
            raise ValueError(f"from_torch_prune: layer {fqn} is on {w.device} (sparq runs on the "
                             "CPU: move the module with .cpu() first)")
        w = w.to(torch.float32) if w.dtype == torch.bfloat16 else w
        try:
            sl = SparseLinear(w * mask.to(w.dtype), m.bias, mask=mask != 0, values=values,
                              threads=threads)
        except ValueError as e:
            raise ValueError(f"from_torch_prune: layer {fqn}: {e}") from e
        _set_child(module, fqn, sl)
    return module


def to_state_dict(module: nn.Module) -> dict:
    """``module.state_dict()`` with every SparseLinear as the ``weight`` (float32, zeros where
    pruned) and ``bias`` of an ``nn.Linear``, every tensor detached and copied: it loads into
    the original architecture (``dense_model.load_state_dict(...)``) for fine-tuning or serving
    elsewhere."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}
