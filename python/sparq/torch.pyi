# Type stubs of sparq.torch (PyTorch interop; needs torch, which `import sparq` never imports).
from typing import Any, Callable, Dict, Iterable, Optional, Union

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from . import Pattern, SparseMatrix

PatternLike = Union[Pattern, str]
WeightLike = Union[torch.Tensor, npt.NDArray[np.float32]]

class SparseLinear(nn.Module):
    """y = x @ W.T + bias through sparq's kernels (CPU inference; float32, bf16 converted)."""
    in_features: int
    out_features: int
    prune_report: Dict[str, Any]  # set by sparsify_
    def __init__(
        self,
        weight: WeightLike,
        bias: Optional[WeightLike] = None,
        *,
        pattern: Optional[PatternLike] = None,
        mask: Optional[Union[torch.Tensor, npt.NDArray[Any]]] = None,
        format: str = "auto",
        values: str = "f32",
        threads: Optional[int] = None,
        isa: Optional[str] = None,
    ) -> None: ...
    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs: Any) -> SparseLinear: ...
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...
    def to_dense(self) -> torch.Tensor: ...
    def to_linear(self) -> nn.Linear: ...
    @property
    def bias(self) -> Optional[torch.Tensor]: ...
    @property
    def mask(self) -> torch.Tensor: ...
    @property
    def matrix(self) -> SparseMatrix: ...
    @property
    def format(self) -> str: ...
    @property
    def density(self) -> float: ...
    @property
    def nbytes(self) -> int: ...

def sparsify_(
    module: nn.Module,
    pattern: PatternLike = "2:4",
    method: str = "magnitude",
    calib: Optional[Union[torch.Tensor, Iterable[Any]]] = None,
    filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
    values: str = "f32",
    *,
    threads: Optional[int] = None,
    damp: float = 0.01,
    blocksize: int = 128,
) -> nn.Module: ...
def from_torch_prune(module: nn.Module, values: str = "f32",
                     threads: Optional[int] = None) -> nn.Module: ...
def to_state_dict(module: nn.Module) -> Dict[str, torch.Tensor]: ...
