# Type stubs of the sparq package (the runtime is __init__.py over the C++ module _sparq).
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

class Pattern:
    """A sparsity pattern: dense | unstructured:0.9 | unstructured-row:0.9 | rows:0.3 | cols:0.3 |
    2:4 | 4:8 | block:16x16 | block:32x32:0.9 | vnm:8:2:4. A bad spec raises ValueError."""
    def __init__(self, spec: str) -> None: ...
    @property
    def n(self) -> int: ...
    @property
    def m(self) -> int: ...
    @property
    def fraction(self) -> float: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

PatternLike = Union[Pattern, str]
F32Array = npt.NDArray[np.float32]

class SparseMatrix:
    """A weight W [m, k] in one of sparq's formats; W @ x for x [k] or [k, n] float32."""
    @classmethod
    def from_dense(
        cls,
        w: F32Array,
        pattern: Optional[PatternLike] = None,
        mask: Optional[npt.NDArray[Union[np.bool_, np.uint8]]] = None,
        format: str = "auto",
        values: str = "f32",
    ) -> SparseMatrix: ...
    def to_dense(self) -> F32Array: ...
    @property
    def shape(self) -> Tuple[int, int]: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def format(self) -> str: ...
    @property
    def values(self) -> str: ...
    @property
    def density(self) -> float: ...
    def kernel_name(self, n: int = 1) -> str: ...
    def __matmul__(self, x: F32Array) -> F32Array: ...

class Linear:
    """y = x @ W.T + bias for x float32 [..., k]."""
    shape: Tuple[int, int]
    def __init__(
        self,
        weight: Union[SparseMatrix, F32Array],
        bias: Optional[F32Array] = None,
        threads: Optional[int] = None,
        isa: Optional[str] = None,
    ) -> None: ...
    @property
    def threads(self) -> int: ...
    @property
    def format(self) -> str: ...
    @property
    def isa(self) -> str: ...
    def kernel_name(self, n: int = 1) -> str: ...
    def __call__(self, x: F32Array) -> F32Array: ...

def supported_isas() -> List[str]:
    """The kernel targets this CPU runs, best first (names for Linear's isa)."""

class PruneResult:
    weight: F32Array
    mask: npt.NDArray[np.bool_]
    report: dict
    def __iter__(self) -> Iterator: ...

def prune(
    w: F32Array,
    pattern: PatternLike,
    method: str = "sparsegpt",
    inputs: Optional[F32Array] = None,
    hessian: Optional[npt.NDArray[np.float64]] = None,
    damp: float = 0.01,
    blocksize: int = 128,
    threads: Optional[int] = None,
) -> PruneResult: ...

TextLike = Union[str, os.PathLike[str]]
PathLike = Union[str, os.PathLike[str]]

class Model:
    """A Llama-architecture model (GGUF, Hugging Face folder or .sparq) loaded by sparq.load."""
    prune_report: Optional[Dict[str, Any]]
    @property
    def path(self) -> str: ...
    @property
    def config(self) -> Dict[str, Any]: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def vocab(self) -> int: ...
    @property
    def n_params(self) -> int: ...
    @property
    def weight_bytes(self) -> int: ...
    @property
    def values(self) -> str: ...
    @property
    def layers(self) -> Dict[str, Dict[str, Any]]: ...
    @property
    def threads(self) -> int: ...
    @property
    def isa(self) -> str: ...
    @property
    def int8_activations(self) -> bool: ...
    def layer(self, name: str) -> SparseMatrix:
        """The named linear layer, sharing the model's packed weight; ValueError if unknown."""
    def tokenize(self, text: str) -> List[int]: ...
    def logits(self, tokens: Sequence[int]) -> F32Array: ...
    def eval(self, text: TextLike, ctx: int = 512, max_tokens: Optional[int] = None,
             step: int = 0) -> Dict[str, Any]: ...
    def generate(self, prompt: str, max_new: int = 64, temperature: float = 0.0, top_k: int = 40,
                 top_p: float = 1.0, seed: int = 42, raw: bool = False) -> str: ...
    def bench(self, prompt: int = 512, decode: int = 32, repeats: int = 3) -> Dict[str, Any]: ...
    def save(self, path: PathLike, values: Optional[str] = None) -> None: ...

def load(path: PathLike, threads: Optional[int] = None, gguf_values: str = "as-stored",
         int8_activations: bool = False) -> Model:
    """A .gguf, a .sparq or a Hugging Face Llama folder; OSError / ValueError on bad files."""

def prune_model(
    model: Union[Model, PathLike],
    pattern: PatternLike = "2:4",
    method: str = "sparsegpt",
    calib: Optional[TextLike] = None,
    values: str = "f32",
    out: Optional[PathLike] = None,
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
    """`sparq prune` from Python: the pruned model (its .sparq at `out`, or a temporary file)."""
