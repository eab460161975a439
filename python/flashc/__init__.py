"""flashc: exact FlashAttention-2 forward and backward, from Python.

A ctypes binding of the flashc C library: no compile step against numpy or PyTorch, so one
build serves every Python and PyTorch version.

    import flashc
    out, lse = flashc.forward(q, k, v, causal=True)          # numpy, [batch, seqlen, heads, dim]
    dq, dk, dv = flashc.backward(dout, q, k, v, out, lse, causal=True)
    out, lse = flashc.forward_kvcache(q, k_cache, v_cache, cache_seqlens, k=k_new, v=v_new)

PyTorch (CPU and CUDA tensors, autograd, torch.compile) lives in flashc.torch, imported on
demand so that numpy users never import torch.
"""

from ._lib import (
    Backend,
    Causal,
    DType,
    FlashcError,
    Status,
    backends,
    get_backend,
    library_path,
    version,
)
from ._numpy import backward, forward, forward_kvcache

__version__ = version()

__all__ = [
    "Backend",
    "Causal",
    "DType",
    "FlashcError",
    "Status",
    "__version__",
    "backends",
    "backward",
    "forward",
    "forward_kvcache",
    "get_backend",
    "library_path",
]
