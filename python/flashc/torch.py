"""flashc for PyTorch: CPU and CUDA tensors, autograd, torch.compile and CUDA graphs.

    from flashc.torch import flash_attn_func, scaled_dot_product_attention
    out = flash_attn_func(q, k, v, causal=True)                   # [batch, seqlen, heads, dim]
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k)  # [total, heads, dim]
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens)  # decoding
    out = scaled_dot_product_attention(q, k, v, is_causal=True)   # [batch, heads, seqlen, dim]

The library is called through ctypes on the tensors' memory, so nothing is compiled against
PyTorch. The two kernels are registered as opaque custom ops, flashc::attention_forward and
flashc::attention_backward (torch.library.custom_op, with fake implementations and an
autograd formula), so torch.compile traces through them without graph breaks. On CUDA they
run on the current stream, allocate only through PyTorch's allocator (the backward workspace
is a uint8 tensor) and never synchronize the host, so they can be captured in CUDA graphs
once a first call outside the capture has set up the backend.

The log-sum-exp returned by flash_attn_func(return_attn_probs=True) is not differentiable:
gradients flow through the attention output only.
"""

import math
from typing import Optional

import torch

from . import _lib
from ._lib import Causal, DType, FlashcError, Status

__all__ = ["FlashAttnFunction", "flash_attn_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache", "scaled_dot_product_attention"]

_DTYPE_CODES = {torch.float32: DType.F32, torch.float16: DType.F16, torch.bfloat16: DType.BF16}


# -------------------------------------------------------------------------------------------
# Describing tensors and picking the backend
# -------------------------------------------------------------------------------------------


def _describe(name, tensor):
    """A flashc_tensor view of a torch tensor (element strides, as torch counts them)."""
    code = _DTYPE_CODES.get(tensor.dtype)
    if code is None:
        raise FlashcError(Status.ERROR_INVALID_DTYPE,
                          "%s: dtype %s is not supported; use torch.float16, torch.bfloat16 or "
                          "(CPU) torch.float32" % (name, tensor.dtype))
    shape = tuple(tensor.shape)
    # A dimension of size 1 is never stepped along; its stride can be anything in torch.
    strides = [0 if size == 1 else stride for size, stride in zip(shape, tensor.stride())]
    if shape and shape[-1] == 1:
        strides[-1] = 1
    return _lib.make_tensor(tensor.data_ptr(), code, shape, strides)


def _readable(tensor):
    """The tensor, or a contiguous copy where the library could not read it in place: the C
    API needs a unit stride for head_dim (a gradient that autograd expanded from a scalar
    has 0), and the CUDA kernels' 16-byte vector loads need 16-byte aligned rows (pointer,
    and strides of the dimensions longer than 1 in multiples of 8 elements)."""
    if tensor.dim() == 0:
        return tensor
    if tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        return tensor.contiguous()
    if tensor.is_cuda:
        misaligned = tensor.data_ptr() % 16 != 0 or any(
            size > 1 and stride % 8 != 0
            for size, stride in zip(tensor.shape[:-1], tensor.stride()[:-1]))
        # A contiguous copy is only aligned when head_dim is a multiple of 8; otherwise the
        # library's own message about head_dim is the better one.
        if misaligned and tensor.shape[-1] % 8 == 0:
            # contiguous() would return a contiguous but misaligned tensor unchanged: clone
            # into fresh (allocator-aligned) memory instead
            return tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def _check_attention_tensors(named_tensors, kernel=True):
    """Types, ndim, and one device for all. With kernel (in the kernels, not the front ends,
    so that meta tensors reach the fake implementations), also that it is a CPU or CUDA
    device."""
    first_name, first = named_tensors[0]
    for name, tensor in named_tensors:
        if not isinstance(tensor, torch.Tensor):
            raise FlashcError(Status.ERROR_INVALID_PARAM,
                              "%s: must be a torch.Tensor, not %s" % (name, type(tensor).__name__))
        if tensor.dim() != 4:
            raise FlashcError(Status.ERROR_INVALID_SIZE,
                              "%s: ndim is %d; attention tensors are 4-d [batch, seqlen, heads, "
                              "head_dim]" % (name, tensor.dim()))
        # The library sees raw pointers only: a tensor on another device than q would be read
        # as memory of the wrong kind.
        if tensor.device != first.device:
            raise FlashcError(Status.ERROR_INVALID_POINTER,
                              "%s: is on %s but %s is on %s" % (name, tensor.device, first_name,
                                                               first.device))
    if kernel and first.device.type not in ("cpu", "cuda"):
        raise FlashcError(Status.ERROR_INVALID_POINTER,
                          "%s: tensors on %s are not supported; use CPU or CUDA tensors"
                          % (first_name, first.device))


class _DeviceCall:
    """The backend, stream and device guard for tensors on `device`: "cpu" for CPU tensors,
    "cuda" for CUDA ones, unless backend_name names another."""

    def __init__(self, device, backend_name):
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.backend = _lib.get_backend(backend_name or "cuda", 0, index)
            self.stream = torch.cuda.current_stream(device).cuda_stream
            self.guard = torch.cuda.device(index)
        else:
            self.backend = _lib.get_backend(backend_name or "cpu", 0)
            self.stream = None
            self.guard = None
        # The library sees raw pointers: host memory must go to a host backend and device
        # memory to a device one, or the kernels would read memory of the wrong kind.
        if self.backend.uses_device_memory != (device.type == "cuda"):
            raise FlashcError(Status.ERROR_INVALID_POINTER,
                              "backend %r cannot read tensors on %s" % (self.backend.name, device))

    def __enter__(self):
        if self.guard is not None:
            self.guard.__enter__()
        return self

    def __exit__(self, *exc):
        if self.guard is not None:
            self.guard.__exit__(*exc)
        return False


# -------------------------------------------------------------------------------------------
# The kernels, as plain functions (these become the custom ops' implementations)
# -------------------------------------------------------------------------------------------


def _feature_keywords(q, alibi_slopes, dropout_p, dropout_seed, dropout_offset, cu_seqlens_q,
                      cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """make_params keywords for the features, and the tensors they point into (which must
    live through the call). The pointers are handed to the library as they are: host
    backends read them, a backend that lacks the feature refuses it before reading."""
    keywords = dict(dropout_p=float(dropout_p), dropout_seed=int(dropout_seed),
                    dropout_offset=int(dropout_offset))
    keep = []
    batch, _, heads_q, _ = q.shape
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise FlashcError(Status.ERROR_NULL_POINTER,
                              "cu_seqlens_q and cu_seqlens_k: a variable-length batch needs both")
        cu_q, cu_k = (t.to(torch.int32).contiguous() for t in (cu_seqlens_q, cu_seqlens_k))
        if cu_q.dim() != 1 or cu_q.shape != cu_k.shape or cu_q.numel() < 2:
            raise FlashcError(Status.ERROR_SHAPE_MISMATCH,
                              "cu_seqlens_q/cu_seqlens_k: must be 1-d with the same num_seqs + 1"
                              " >= 2 entries (shapes %s and %s)"
                              % (tuple(cu_q.shape), tuple(cu_k.shape)))
        batch = cu_q.numel() - 1
        keep += [cu_q, cu_k]
        keywords.update(cu_seqlens_q=cu_q.data_ptr(), cu_seqlens_k=cu_k.data_ptr(),
                        num_seqs=batch, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(torch.float32).contiguous()
        if tuple(slopes.shape) == (heads_q,):
            stride = 0
        elif tuple(slopes.shape) == (batch, heads_q):
            stride = heads_q
        else:
            raise FlashcError(Status.ERROR_SHAPE_MISMATCH,
                              "alibi_slopes: shape %s; use [heads_q] = [%d] or [batch, heads_q]"
                              " = [%d, %d]" % (tuple(slopes.shape), heads_q, batch, heads_q))
        keep.append(slopes)
        keywords.update(alibi_slopes=slopes.data_ptr(), alibi_slopes_batch_stride=stride)
    return keywords, keep


def _attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
                       causal_mode: int, window_left: int, window_right: int, softcap: float,
                       deterministic: bool, backend: str,
                       alibi_slopes: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                       dropout_seed: int = 0, dropout_offset: int = 0,
                       cu_seqlens_q: Optional[torch.Tensor] = None,
                       cu_seqlens_k: Optional[torch.Tensor] = None, max_seqlen_q: int = 0,
                       max_seqlen_k: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """out [b, sq, hq, d] (contiguous) and lse [b, hq, sq] float32 for q [b, sq, hq, d] and
    k, v [b, sk, hkv, d]; a varlen batch comes as b = 1 with cu_seqlens_q/k. deterministic
    is unused here; it rides along for the backward."""
    _check_attention_tensors((("q", q), ("k", k), ("v", v)))
    q, k, v = (_readable(t) for t in (q, k, v))
    batch, seqlen_q, heads_q, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=q.device)
    features, keep = _feature_keywords(q, alibi_slopes, dropout_p, dropout_seed, dropout_offset,
                                       cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    with _DeviceCall(q.device, backend) as call:
        params = _lib.make_params(softmax_scale, causal_mode, window_left, window_right, softcap,
                                  stream=call.stream, **features)
        _lib.forward(call.backend, params, _describe("q", q), _describe("k", k),
                     _describe("v", v), _describe("out", out), _describe("lse", lse))
    del keep
    return out, lse


def _attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        out: torch.Tensor, lse: torch.Tensor, softmax_scale: float,
                        causal_mode: int, window_left: int, window_right: int, softcap: float,
                        deterministic: bool, backend: str,
                        alibi_slopes: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                        dropout_seed: int = 0, dropout_offset: int = 0,
                        cu_seqlens_q: Optional[torch.Tensor] = None,
                        cu_seqlens_k: Optional[torch.Tensor] = None, max_seqlen_q: int = 0,
                        max_seqlen_k: int = 0
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (contiguous, shaped like q, k, v) for the forward's inputs and results."""
    _check_attention_tensors((("q", q), ("dout", dout), ("k", k), ("v", v), ("out", out)))
    dout, q, k, v, out = (_readable(t) for t in (dout, q, k, v, out))
    if lse.device != q.device:
        raise FlashcError(Status.ERROR_INVALID_POINTER,
                          "lse: is on %s but q is on %s" % (lse.device, q.device))
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    features, keep = _feature_keywords(q, alibi_slopes, dropout_p, dropout_seed, dropout_offset,
                                       cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    with _DeviceCall(q.device, backend) as call:
        params = _lib.make_params(softmax_scale, causal_mode, window_left, window_right, softcap,
                                  deterministic=deterministic, stream=call.stream, **features)
        q_t, k_t = _describe("q", q), _describe("k", k)
        # The scratch comes from torch's allocator (stream-ordered, and from the graph's pool
        # under CUDA graph capture) rather than from an allocation inside the library.
        workspace_bytes = _lib.backward_workspace_size(call.backend, params, q_t, k_t)
        workspace = None
        if workspace_bytes:
            workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device)
            params.workspace = workspace.data_ptr()
            params.workspace_size = workspace_bytes
        _lib.backward(call.backend, params, _describe("dout", dout), q_t, k_t,
                      _describe("v", v), _describe("out", out), _describe("lse", lse),
                      _describe("dq", dq), _describe("dk", dk), _describe("dv", dv))
        del workspace
    del keep
    return dq, dk, dv


# -------------------------------------------------------------------------------------------
# Custom ops (torch >= 2.4) and the autograd.Function
# -------------------------------------------------------------------------------------------

HAS_CUSTOM_OPS = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd")


def _save_for_backward(ctx, q, k, v, out, lse, options):
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = options


if HAS_CUSTOM_OPS:
    attention_forward_op = torch.library.custom_op("flashc::attention_forward",
                                                   mutates_args=())(_attention_forward)
    attention_backward_op = torch.library.custom_op("flashc::attention_backward",
                                                    mutates_args=())(_attention_backward)

    @attention_forward_op.register_fake
    def _attention_forward_fake(q, k, v, softmax_scale, causal_mode, window_left, window_right,
                                softcap, deterministic, backend, alibi_slopes=None,
                                dropout_p=0.0, dropout_seed=0, dropout_offset=0,
                                cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
                                max_seqlen_k=0):
        batch, seqlen_q, heads_q, _ = q.shape
        return (q.new_empty(q.shape),
                q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32))

    @attention_backward_op.register_fake
    def _attention_backward_fake(dout, q, k, v, out, lse, softmax_scale, causal_mode,
                                 window_left, window_right, softcap, deterministic, backend,
                                 alibi_slopes=None, dropout_p=0.0, dropout_seed=0,
                                 dropout_offset=0, cu_seqlens_q=None, cu_seqlens_k=None,
                                 max_seqlen_q=0, max_seqlen_k=0):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def _setup_context(ctx, inputs, output):
        q, k, v = inputs[:3]
        out, lse = output
        _save_for_backward(ctx, q, k, v, out, lse, tuple(inputs[3:]))

    def _op_backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward_op(dout, q, k, v, out, lse, *ctx.options)
        return (dq, dk, dv) + (None,) * len(ctx.options)

    torch.library.register_autograd("flashc::attention_forward", _op_backward,
                                    setup_context=_setup_context)
    _forward_kernel, _backward_kernel = attention_forward_op, attention_backward_op
else:  # older torch: plain calls, differentiable through FlashAttnFunction, not compilable
    _forward_kernel, _backward_kernel = _attention_forward, _attention_backward


class FlashAttnFunction(torch.autograd.Function):
    """Attention as an autograd.Function over the two kernels:
    FlashAttnFunction.apply(q, k, v, softmax_scale, causal_mode, window_left, window_right,
    softcap, deterministic, backend[, alibi_slopes, dropout_p, dropout_seed, dropout_offset,
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k]) -> (out, lse), in flash_attn's
    [b, s, h, d] layout. flash_attn_func uses the custom op's own autograd formula instead
    where torch has custom ops; both compute the same thing."""

    @staticmethod
    def forward(ctx, q, k, v, *options):
        out, lse = _forward_kernel(q, k, v, *options)
        _save_for_backward(ctx, q, k, v, out, lse, options)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward_kernel(dout, q, k, v, out, lse, *ctx.options)
        return (dq, dk, dv) + (None,) * len(ctx.options)


_attention = attention_forward_op if HAS_CUSTOM_OPS else FlashAttnFunction.apply


# -------------------------------------------------------------------------------------------
# Drop-in front ends
# -------------------------------------------------------------------------------------------


def _unsupported(message):
    return FlashcError(Status.ERROR_UNSUPPORTED, message)


def _autocast(tensors):
    """Under torch.autocast, the tensors cast to the autocast dtype, as SDPA (on autocast's
    lower-precision list) does; otherwise the tensors as they are. A model under autocast
    hands attention float32 queries where rotary embeddings promoted them."""
    device_type = tensors[0].device.type
    if device_type not in ("cpu", "cuda"):
        return tensors
    try:
        enabled = torch.is_autocast_enabled(device_type)
        dtype = torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError):  # torch < 2.4 has only the CUDA form
        enabled = device_type == "cuda" and torch.is_autocast_enabled()
        dtype = torch.get_autocast_gpu_dtype() if enabled else None
    if not enabled:
        return tensors
    return [t.to(dtype) if t.dtype in (torch.float32, torch.float16, torch.bfloat16) else t
            for t in tensors]


def _resolve_scale(softmax_scale, head_dim):
    # Resolved here rather than left to the library's "0 means default", so the value the
    # op records (and a traced graph shows) is the one used.
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)


def _dropout_seed(dropout_p, dropout_seed):
    """The Philox seed: the caller's, or one drawn from torch's default generator (so that
    torch.manual_seed makes a run reproducible). The backward reuses it from the saved
    options, which is how it regenerates the same mask."""
    if not dropout_p or dropout_seed is not None:
        return int(dropout_seed or 0)
    return int(torch.randint(0, 2 ** 62, (1,), dtype=torch.int64).item())


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, causal_mode="bottom_right", backend=None,
                    dropout_seed=None, dropout_offset=0):
    """flash_attn.flash_attn_func's signature and layout, computed by flashc.

    q: [batch, seqlen_q, heads_q, head_dim]; k, v: [batch, seqlen_k, heads_kv, head_dim],
    heads_q a multiple of heads_kv. Causal masking aligns to the bottom-right corner when
    seqlen_q != seqlen_k, as in flash_attn >= 2.1 (causal_mode="top_left" for SDPA's
    convention). window_size (left, right; -1 unbounded), softcap and alibi_slopes
    (float32 [heads_q] or [batch, heads_q]) follow flash_attn's conventions (flashc.h gives
    them exactly); the backend refuses what it does not implement.
    dropout_p: dropout on the attention probabilities, from a counter-based generator keyed
    by dropout_seed (None: drawn from torch's default generator) and dropout_offset, so the
    backward regenerates the mask; the mask is flashc's own, not flash_attn's.
    backend: None for the tensors' device ("cpu" or "cuda"), or "reference".
    Returns out [batch, seqlen_q, heads_q, head_dim]; with return_attn_probs,
    (out, softmax_lse [batch, heads_q, seqlen_q], None): flashc never forms the
    probabilities.
    """
    _check_attention_tensors((("q", q), ("k", k), ("v", v)), kernel=False)
    q, k, v = _autocast([q, k, v])
    window_left, window_right = (int(w) for w in window_size)
    out, lse = _attention(q, k, v, _resolve_scale(softmax_scale, q.shape[-1]),
                          int(_lib.causal_mode_of(causal, causal_mode)), window_left,
                          window_right, float(softcap), bool(deterministic), backend or "",
                          alibi_slopes, float(dropout_p), _dropout_seed(dropout_p, dropout_seed),
                          int(dropout_offset))
    if return_attn_probs:
        return out, lse, None
    return out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                           max_seqlen_k=None, dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, *,
                           causal_mode="bottom_right", backend=None, dropout_seed=None,
                           dropout_offset=0):
    """flash_attn.flash_attn_varlen_func's signature, computed by flashc.

    q: [total_q, heads_q, head_dim]; k, v: [total_k, heads_kv, head_dim], the sequences of
    the batch packed one after another; cu_seqlens_q, cu_seqlens_k: int32 [batch + 1] prefix
    sums of their lengths (host memory for the CPU backend). Sequences of length 0 are
    allowed. Causal masks, windows and ALiBi apply per sequence (bottom-right aligned per
    sequence unless causal_mode="top_left"); alibi_slopes [batch, heads_q] is per sequence.
    max_seqlen_q/k are optional upper bounds (checked). The other options are
    flash_attn_func's. Returns out [total_q, heads_q, head_dim]; with return_attn_probs,
    (out, softmax_lse [heads_q, total_q], None).
    """
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 3:
            raise FlashcError(Status.ERROR_INVALID_SIZE,
                              "%s: must be a 3-d [total_tokens, heads, head_dim] tensor" % name)
    q, k, v = _autocast([q, k, v])
    q4, k4, v4 = (t.unsqueeze(0) for t in (q, k, v))
    _check_attention_tensors((("q", q4), ("k", k4), ("v", v4)), kernel=False)
    window_left, window_right = (int(w) for w in window_size)
    out, lse = _attention(q4, k4, v4, _resolve_scale(softmax_scale, q.shape[-1]),
                          int(_lib.causal_mode_of(causal, causal_mode)), window_left,
                          window_right, float(softcap), bool(deterministic), backend or "",
                          alibi_slopes, float(dropout_p), _dropout_seed(dropout_p, dropout_seed),
                          int(dropout_offset), cu_seqlens_q, cu_seqlens_k,
                          int(max_seqlen_q or 0), int(max_seqlen_k or 0))
    out, lse = out.squeeze(0), lse.squeeze(0)
    if return_attn_probs:
        return out, lse, None
    return out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *,
                                 backend=None):
    """torch.nn.functional.scaled_dot_product_attention's signature and answer, computed by
    flashc.

    query: [batch, heads_q, seqlen_q, head_dim]; key, value: [batch, heads_kv, seqlen_k,
    head_dim] (3-d [batch, seqlen, head_dim] too). The tensors are read in place as
    [batch, seqlen, heads, head_dim] views, and the result is such a view transposed back.
    is_causal aligns the mask to the top-left corner, as SDPA does when seqlen_q !=
    seqlen_k. heads_q != heads_kv needs enable_gqa=True, as in SDPA. attn_mask and dropout
    are not implemented.
    """
    if attn_mask is not None:
        raise _unsupported("attn_mask: explicit attention masks are not implemented in flashc; "
                           "pass is_causal=True for a causal mask")
    if dropout_p:
        raise _unsupported("dropout_p=%r: attention dropout is not implemented in flashc yet; "
                           "pass dropout_p=0.0" % (dropout_p,))
    tensors = [query, key, value]
    for name, tensor in zip(("query", "key", "value"), tensors):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() not in (3, 4):
            raise FlashcError(Status.ERROR_INVALID_SIZE,
                              "%s: must be a 4-d [batch, heads, seqlen, head_dim] (or 3-d) "
                              "tensor" % name)
    no_head_dim = query.dim() == 3
    if no_head_dim:
        tensors = [t.unsqueeze(1) for t in tensors]
    query, key, value = _autocast(tensors)
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise FlashcError(Status.ERROR_INVALID_HEADS,
                          "query has %d heads but key has %d; pass enable_gqa=True for "
                          "grouped-query attention" % (query.shape[1], key.shape[1]))
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    _check_attention_tensors((("query", q), ("key", k), ("value", v)), kernel=False)
    causal_mode = int(Causal.TOP_LEFT if is_causal else Causal.NONE)
    out, _ = _attention(q, k, v, _resolve_scale(scale, q.shape[-1]), causal_mode, -1, -1, 0.0,
                        False, backend or "")
    out = out.transpose(1, 2)
    return out.squeeze(1) if no_head_dim else out


# -------------------------------------------------------------------------------------------
# Decoding from a KV cache
# -------------------------------------------------------------------------------------------


def _index_tensor(name, values, device, ndim):
    """An int32 contiguous tensor on `device` (the library reads it there) from a tensor, a
    sequence or an int."""
    tensor = values if isinstance(values, torch.Tensor) else torch.as_tensor(values)
    tensor = tensor.to(device=device, dtype=torch.int32).contiguous()
    if tensor.dim() != ndim:
        raise FlashcError(Status.ERROR_INVALID_SIZE,
                          "%s: ndim is %d, expected %d" % (name, tensor.dim(), ndim))
    return tensor


@torch.no_grad()
def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, backend=None):
    """flash_attn.flash_attn_with_kvcache's signature, computed by flashc (no autograd: a
    decoding step).

    q: [batch, seqlen_q, heads_q, head_dim]. k_cache, v_cache: [batch, capacity, heads_kv,
    head_dim], or with block_table (int32 [batch, max_pages_per_seq]) a paged pool
    [num_pages, page_size, heads_kv, head_dim], page_size a power of two >= 16. They are read,
    and with k, v ([batch, seqlen_new, heads_kv, head_dim]) written, in place: k and v are
    appended at positions cache_seqlens[b] .. of each sequence before the attention, and
    cache_seqlens (int or int32 [batch]; None: the whole capacity, without an append) is not
    advanced. Causal aligns bottom-right to each sequence's cache_seqlens[b] + seqlen_new
    keys; window_size, softcap and alibi_slopes as in flash_attn_func. num_splits: 0 lets
    flashc pick the split-KV count. Not implemented: rotary embeddings, cache_batch_idx,
    cache_leftpad. Returns out, or (out, softmax_lse [batch, heads_q, seqlen_q]) with
    return_softmax_lse.
    """
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                        ("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if value is not None:
            raise _unsupported("%s: not implemented by flashc's flash_attn_with_kvcache; apply "
                               "rotary embeddings to q and k first, and index the cache "
                               "yourself" % name)
    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)]
    if (k is None) != (v is None):
        raise FlashcError(Status.ERROR_NULL_POINTER, "k and v: an append needs both")
    if k is not None:
        named += [("k", k), ("v", v)]
    _check_attention_tensors(named)
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache)):
        # The caches are written in place: a copy would lose the appended keys.
        if tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
            raise FlashcError(Status.ERROR_INVALID_STRIDE,
                              "%s: head_dim must be contiguous (stride 1) to be used in place"
                              % name)
    q = _readable(q)
    batch, seqlen_q, heads_q, head_dim = q.shape
    device = q.device
    if cache_seqlens is None:
        if k is not None or block_table is not None:
            raise FlashcError(Status.ERROR_NULL_POINTER,
                              "cache_seqlens: needed with k/v (the append position) and with "
                              "block_table")
        cache_seqlens = k_cache.shape[1]
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32)
    seqlens = _index_tensor("cache_seqlens", cache_seqlens, device, 1)
    keep = [seqlens]
    table_ptr, max_pages = None, 0
    if block_table is not None:
        table = _index_tensor("block_table", block_table, device, 2)
        keep.append(table)
        table_ptr, max_pages = table.data_ptr(), table.shape[1]
    k_t = v_t = None
    if k is not None:
        k, v = _readable(k), _readable(v)
        keep += [k, v]
        k_t, v_t = _describe("k", k), _describe("v", v)
    features, feature_keep = _feature_keywords(q, alibi_slopes, 0.0, 0, 0, None, None, 0, 0)
    keep += feature_keep
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=device)
    window_left, window_right = (int(w) for w in window_size)
    with _DeviceCall(device, backend) as call:
        params = _lib.make_params(_resolve_scale(softmax_scale, head_dim),
                                  _lib.causal_mode_of(causal, "bottom_right"), window_left,
                                  window_right, float(softcap), stream=call.stream, **features)
        kv = _lib.make_kvcache_params(seqlens.data_ptr(), table_ptr, max_pages, 0,
                                      int(num_splits))
        args = (call.backend, params, kv, _describe("q", q), _describe("k_cache", k_cache),
                _describe("v_cache", v_cache), k_t, v_t, _describe("out", out),
                _describe("lse", lse))
        # The split-KV partial results in memory from PyTorch's allocator (CUDA), so that a
        # captured graph of decode steps holds only flashc's kernels.
        workspace_bytes = _lib.kvcache_workspace_size(*args) if device.type == "cuda" else 0
        if workspace_bytes:
            workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=device)
            keep.append(workspace)
            params.workspace = workspace.data_ptr()
            params.workspace_size = workspace_bytes
        _lib.forward_kvcache(*args)
    del keep
    return (out, lse) if return_softmax_lse else out
