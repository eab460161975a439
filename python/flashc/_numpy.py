"""flashc on numpy arrays: forward() and backward() in host memory (the "cpu" and
"reference" backends).

Arrays are [batch, seqlen, heads, head_dim] with any strides the C API accepts; they are
described to the library as views (numpy's byte strides turned into element strides) and
copied only when the library could not read them in place: a last dimension that is not
contiguous, a negative stride, or a stride that is not a whole number of elements.
"""

import numpy as np

from . import _lib
from ._lib import DType, FlashcError, Status

try:  # bfloat16 arrays come from ml_dtypes; without it, float32 and float16 still work
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BFLOAT16 = None

_ATTENTION_DIMS = "[batch, seqlen, heads, head_dim]"


def dtype_code(name, dtype):
    """The flashc_dtype of a numpy dtype; FlashcError for one flashc has no kernels for."""
    if dtype == np.float32:
        return DType.F32
    if dtype == np.float16:
        return DType.F16
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return DType.BF16
    supported = "float32, float16" + (", bfloat16" if BFLOAT16 is not None else
                                      " (bfloat16 needs the ml_dtypes package)")
    raise FlashcError(Status.ERROR_INVALID_DTYPE,
                      "%s: dtype %s is not supported; use %s" % (name, dtype, supported))


def element_strides(array, last_contiguous):
    """numpy's byte strides as element strides, or None when the C API cannot take them.
    Dimensions of size 1 get stride 0, the head_dim one 1: they are never stepped along, and
    numpy leaves arbitrary (even negative) values there."""
    itemsize = array.itemsize
    if array.size == 0:  # nothing is read; the library reports the empty size itself
        return [0] * (array.ndim - 1) + [1] if array.ndim else []
    strides = []
    for size, stride in zip(array.shape, array.strides):
        if size == 1:
            strides.append(0)
        elif stride < 0 or stride % itemsize:
            return None
        else:
            strides.append(stride // itemsize)
    if last_contiguous and strides:
        if array.shape[-1] == 1:
            strides[-1] = 1
        elif strides[-1] != 1:
            return None
    return strides


def _check_attention_ndim(name, array):
    if array.ndim != 4:
        raise FlashcError(Status.ERROR_INVALID_SIZE,
                          "%s: ndim is %d; attention tensors are 4-d %s"
                          % (name, array.ndim, _ATTENTION_DIMS))


def _input(name, array, last_contiguous=True):
    """(array, flashc_tensor) for an input; array is the one described, a copy if needed,
    and must stay alive through the call."""
    array = np.asarray(array)
    code = dtype_code(name, array.dtype)
    strides = element_strides(array, last_contiguous)
    if strides is None:
        array = np.ascontiguousarray(array)
        strides = element_strides(array, last_contiguous)
    return array, _lib.make_tensor(array.ctypes.data, code, array.shape, strides)


class _Output:
    """An output array: the caller's if given, else a new contiguous one. A caller's array
    that the library cannot write in place is computed into a temporary and copied back."""

    def __init__(self, name, given, shape, dtype, last_contiguous=True):
        if given is None:
            self.result = np.empty(shape, dtype)
        else:
            if not isinstance(given, np.ndarray):
                raise FlashcError(Status.ERROR_INVALID_PARAM,
                                  "%s: must be a numpy array, not %s" % (name, type(given).__name__))
            if not given.flags.writeable:
                raise FlashcError(Status.ERROR_INVALID_PARAM, "%s: array is read-only" % name)
            self.result = given
        code = dtype_code(name, self.result.dtype)
        strides = element_strides(self.result, last_contiguous)
        self.target = self.result
        if strides is None:
            self.target = np.empty(self.result.shape, self.result.dtype)
            strides = element_strides(self.target, last_contiguous)
        self.tensor = _lib.make_tensor(self.target.ctypes.data, code, self.target.shape, strides)

    def finish(self):
        if self.target is not self.result:
            self.result[...] = self.target
        return self.result


def _host_backend(backend, num_threads):
    if not isinstance(backend, _lib.Backend):
        backend = _lib.get_backend(backend or "cpu", num_threads)
    if backend.uses_device_memory:
        raise FlashcError(Status.ERROR_INVALID_POINTER,
                          "backend %r reads device memory, and numpy arrays live in host memory; "
                          "use backend 'cpu' or 'reference' (or flashc.torch with CUDA tensors)"
                          % backend.name)
    return backend


class _Features:
    """The feature arguments shared by forward() and backward(), turned into make_params
    keywords; the arrays it makes must outlive the call, so it holds them."""

    def __init__(self, batch, heads_q, window_size, softcap, alibi_slopes, dropout_p,
                 dropout_seed, dropout_offset, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k):
        window_left, window_right = (int(w) for w in window_size)
        self.keywords = dict(window_left=window_left, window_right=window_right,
                             softcap=float(softcap), dropout_p=float(dropout_p),
                             dropout_seed=int(dropout_seed), dropout_offset=int(dropout_offset))
        self.varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
        self._keep = []
        if self.varlen:
            if cu_seqlens_q is None or cu_seqlens_k is None:
                raise FlashcError(Status.ERROR_NULL_POINTER,
                                  "cu_seqlens_q and cu_seqlens_k: a variable-length batch "
                                  "needs both")
            cu_q = self._contiguous(cu_seqlens_q, np.int32, "cu_seqlens_q")
            cu_k = self._contiguous(cu_seqlens_k, np.int32, "cu_seqlens_k")
            if cu_q.ndim != 1 or cu_q.shape != cu_k.shape or cu_q.size < 2:
                raise FlashcError(Status.ERROR_SHAPE_MISMATCH,
                                  "cu_seqlens_q/cu_seqlens_k: must be 1-d with the same "
                                  "num_seqs + 1 >= 2 entries (shapes %s and %s)"
                                  % (cu_q.shape, cu_k.shape))
            batch = cu_q.size - 1
            self.keywords.update(cu_seqlens_q=cu_q.ctypes.data, cu_seqlens_k=cu_k.ctypes.data,
                                 num_seqs=batch, max_seqlen_q=max_seqlen_q or 0,
                                 max_seqlen_k=max_seqlen_k or 0)
        if alibi_slopes is not None:
            slopes = self._contiguous(alibi_slopes, np.float32, "alibi_slopes")
            if slopes.shape == (heads_q,):
                stride = 0
            elif slopes.shape == (batch, heads_q):
                stride = heads_q
            else:
                raise FlashcError(Status.ERROR_SHAPE_MISMATCH,
                                  "alibi_slopes: shape %s; use [heads_q] = [%d] or [batch, "
                                  "heads_q] = [%d, %d]" % (slopes.shape, heads_q, batch, heads_q))
            self.keywords.update(alibi_slopes=slopes.ctypes.data,
                                 alibi_slopes_batch_stride=stride)

    def _contiguous(self, array, dtype, name):
        array = np.ascontiguousarray(np.asarray(array), dtype=dtype)
        self._keep.append(array)
        return array


def _packed(name, array, varlen):
    """A varlen tensor [total, heads, head_dim] as the library's [1, total, heads, head_dim]."""
    array = np.asarray(array)
    if varlen:
        if array.ndim != 3:
            raise FlashcError(Status.ERROR_INVALID_SIZE,
                              "%s: ndim is %d; a variable-length batch is 3-d [total_tokens, "
                              "heads, head_dim]" % (name, array.ndim))
        return array[None]
    _check_attention_ndim(name, array)
    return array


_FEATURE_DOC = """
    Features (flashc.h defines them exactly):
    window_size: (left, right) sliding window around the diagonal, -1 = unbounded.
    softcap: logit softcap, softcap * tanh(scaled score / softcap); 0 = off.
    alibi_slopes: float32 [heads_q] or [batch, heads_q]; adds -slope * |i + off - j|.
    dropout_p, dropout_seed, dropout_offset: dropout on P with the Philox generator; the
        backward must get the same three values to regenerate the mask.
    cu_seqlens_q, cu_seqlens_k: int32 [batch + 1] prefix sums of the sequence lengths for a
        variable-length batch; q, k, v (and dout, out) are then 3-d [total_tokens, heads,
        head_dim] and lse is [heads_q, total_q]. max_seqlen_q/k: optional upper bounds.
"""


def forward(q, k, v, causal=False, softmax_scale=None, causal_mode="bottom_right", backend=None,
            num_threads=None, out=None, lse=None, window_size=(-1, -1), softcap=0.0,
            alibi_slopes=None, dropout_p=0.0, dropout_seed=0, dropout_offset=0,
            cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """Attention forward on numpy arrays.

    q: [batch, seqlen_q, heads_q, head_dim]; k, v: [batch, seqlen_k, heads_kv, head_dim] with
    heads_q a multiple of heads_kv (GQA, MQA); float32, float16 or bfloat16, all one dtype.
    causal: mask keys after the query; causal_mode "bottom_right" (flash_attn's convention
    when seqlen_q != seqlen_k) or "top_left" (PyTorch SDPA's is_causal).
    softmax_scale: None for 1/sqrt(head_dim).
    backend: "cpu" (the default), "reference" (float64, slow, exact) or a flashc.Backend.
    num_threads: CPU worker threads (None: FLASHC_NUM_THREADS or all cores).
    out, lse: optional arrays to write into.
    Returns (out, lse): out like q, lse float32 [batch, heads_q, seqlen_q] (natural log).
    Raises FlashcError on invalid input. The features are listed below.
    """
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    q, k, v = (_packed(name, x, varlen) for name, x in (("q", q), ("k", k), ("v", v)))
    q, q_t = _input("q", q)
    k, k_t = _input("k", k)
    v, v_t = _input("v", v)
    batch, seqlen_q, heads_q, _ = q.shape
    features = _Features(batch, heads_q, window_size, softcap, alibi_slopes, dropout_p,
                         dropout_seed, dropout_offset, cu_seqlens_q, cu_seqlens_k,
                         max_seqlen_q, max_seqlen_k)
    if out is not None and varlen:
        out = np.asarray(out)[None]
    if lse is not None and varlen:
        lse = np.asarray(lse)[None]
    out_o = _Output("out", out, q.shape, q.dtype)
    lse_o = _Output("lse", lse, (batch, heads_q, seqlen_q), np.float32, last_contiguous=False)
    params = _lib.make_params(softmax_scale, _lib.causal_mode_of(causal, causal_mode),
                              **features.keywords)
    _lib.forward(_host_backend(backend, num_threads), params, q_t, k_t, v_t, out_o.tensor,
                 lse_o.tensor)
    result, lse_result = out_o.finish(), lse_o.finish()
    return (result[0], lse_result[0]) if varlen else (result, lse_result)


def backward(dout, q, k, v, out, lse, causal=False, softmax_scale=None,
             causal_mode="bottom_right", backend=None, num_threads=None, deterministic=False,
             dq=None, dk=None, dv=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
             dropout_p=0.0, dropout_seed=0, dropout_offset=0, cu_seqlens_q=None,
             cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """Attention backward on numpy arrays.

    dout: the gradient of out; q, k, v, out, lse: the forward's inputs and results; causal,
    causal_mode, softmax_scale and the features must be those of the forward.
    Returns (dq, dk, dv), shaped and typed like q, k and v; for GQA dk and dv are summed over
    the query heads sharing a key head. dq, dk, dv: optional arrays to write into.
    """
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    dout, q, k, v, out = (_packed(name, x, varlen) for name, x in
                          (("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out)))
    if varlen:
        lse = np.asarray(lse)[None]
        dq, dk, dv = (None if x is None else np.asarray(x)[None] for x in (dq, dk, dv))
    dout, dout_t = _input("dout", dout)
    q, q_t = _input("q", q)
    k, k_t = _input("k", k)
    v, v_t = _input("v", v)
    out, out_t = _input("out", out)
    lse, lse_t = _input("lse", lse, last_contiguous=False)
    features = _Features(q.shape[0], q.shape[2], window_size, softcap, alibi_slopes, dropout_p,
                         dropout_seed, dropout_offset, cu_seqlens_q, cu_seqlens_k,
                         max_seqlen_q, max_seqlen_k)
    dq_o = _Output("dq", dq, q.shape, q.dtype)
    dk_o = _Output("dk", dk, k.shape, k.dtype)
    dv_o = _Output("dv", dv, v.shape, v.dtype)
    params = _lib.make_params(softmax_scale, _lib.causal_mode_of(causal, causal_mode),
                              deterministic=deterministic, **features.keywords)
    _lib.backward(_host_backend(backend, num_threads), params, dout_t, q_t, k_t, v_t, out_t,
                  lse_t, dq_o.tensor, dk_o.tensor, dv_o.tensor)
    grads = dq_o.finish(), dk_o.finish(), dv_o.finish()
    return tuple(g[0] for g in grads) if varlen else grads


forward.__doc__ += _FEATURE_DOC
backward.__doc__ += _FEATURE_DOC


def _cache_array(name, array, writable):
    """(array, flashc_tensor) for a KV cache, described in place and never copied: the append
    writes into it, so a copy would lose the new keys."""
    if not isinstance(array, np.ndarray):
        raise FlashcError(Status.ERROR_INVALID_PARAM,
                          "%s: must be a numpy array, not %s" % (name, type(array).__name__))
    _check_attention_ndim(name, array)
    if writable and not array.flags.writeable:
        raise FlashcError(Status.ERROR_INVALID_PARAM,
                          "%s: array is read-only, and k/v are appended into it" % name)
    code = dtype_code(name, array.dtype)
    strides = element_strides(array, True)
    if strides is None:
        raise FlashcError(Status.ERROR_INVALID_STRIDE,
                          "%s: strides %s cannot be described without a copy (head_dim must be "
                          "contiguous, strides non-negative)" % (name, array.strides))
    return array, _lib.make_tensor(array.ctypes.data, code, array.shape, strides)


def _int32_array(name, values, ndim):
    array = np.ascontiguousarray(np.asarray(values), dtype=np.int32)
    if array.ndim != ndim:
        raise FlashcError(Status.ERROR_INVALID_SIZE,
                          "%s: ndim is %d, expected %d" % (name, array.ndim, ndim))
    return array


def forward_kvcache(q, k_cache, v_cache, cache_seqlens, k=None, v=None, block_table=None,
                    causal=False, softmax_scale=None, causal_mode="bottom_right",
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, num_splits=0,
                    backend=None, num_threads=None, out=None, lse=None):
    """Decoding: attention of a few new queries against each sequence's KV cache (numpy).

    q: [batch, seqlen_q, heads_q, head_dim].
    k_cache, v_cache: [batch, capacity, heads_kv, head_dim], or with block_table a paged pool
        [num_pages, page_size, heads_kv, head_dim] (page_size a power of two >= 16); block_table
        int32 [batch, max_pages_per_seq]. Read in place, never copied.
    cache_seqlens: int32 [batch] (or an int for all): tokens already cached per sequence.
    k, v: optional [batch, seqlen_new, heads_kv, head_dim], written into k_cache / v_cache at
        positions cache_seqlens[b] .. before the attention (the caches are modified in place;
        cache_seqlens is not: advance it yourself).
    Sequence b then has cache_seqlens[b] + seqlen_new keys; causal aligns bottom-right to it.
    num_splits: 0 lets flashc choose the split-KV count, n > 0 forces n.
    Returns (out, lse) like forward(). flashc.h (flashc_forward_kvcache) states every rule.
    """
    q, q_t = _input("q", q)
    _check_attention_ndim("q", q)
    append = k is not None or v is not None
    if append and (k is None or v is None):
        raise FlashcError(Status.ERROR_NULL_POINTER, "k and v: an append needs both")
    k_cache, kc_t = _cache_array("k_cache", k_cache, append)
    v_cache, vc_t = _cache_array("v_cache", v_cache, append)
    batch, seqlen_q, heads_q, _ = q.shape
    if np.isscalar(cache_seqlens) or np.asarray(cache_seqlens).ndim == 0:
        cache_seqlens = np.full((batch,), int(cache_seqlens), dtype=np.int32)
    seqlens = _int32_array("cache_seqlens", cache_seqlens, 1)
    if seqlens.shape[0] != batch:
        raise FlashcError(Status.ERROR_SHAPE_MISMATCH,
                          "cache_seqlens: %d entries but q has batch %d" % (seqlens.shape[0], batch))
    keep = [seqlens]
    table_ptr, max_pages = None, 0
    if block_table is not None:
        table = _int32_array("block_table", block_table, 2)
        if table.shape[0] != batch:
            raise FlashcError(Status.ERROR_SHAPE_MISMATCH,
                              "block_table: %d rows but q has batch %d" % (table.shape[0], batch))
        keep.append(table)
        table_ptr, max_pages = table.ctypes.data, table.shape[1]
    k_t = v_t = None
    if append:
        _check_attention_ndim("k", np.asarray(k))
        _check_attention_ndim("v", np.asarray(v))
        k, k_t = _input("k", k)
        v, v_t = _input("v", v)
        keep += [k, v]
    features = _Features(batch, heads_q, window_size, softcap, alibi_slopes, 0.0, 0, 0, None,
                         None, None, None)
    out_o = _Output("out", out, q.shape, q.dtype)
    lse_o = _Output("lse", lse, (batch, heads_q, seqlen_q), np.float32, last_contiguous=False)
    params = _lib.make_params(softmax_scale, _lib.causal_mode_of(causal, causal_mode),
                              **features.keywords)
    kv = _lib.make_kvcache_params(seqlens.ctypes.data, table_ptr, max_pages, 0, num_splits)
    _lib.forward_kvcache(_host_backend(backend, num_threads), params, kv, q_t, kc_t, vc_t, k_t,
                         v_t, out_o.tensor, lse_o.tensor)
    del keep
    return out_o.finish(), lse_o.finish()


forward_kvcache.__doc__ += _FEATURE_DOC.split("    dropout_p")[0]
