"""Float64 numpy attention, forward and backward, written from the definition (the test
oracle for flashc), and the relative-error bookkeeping the tests report."""

import numpy as np

# Relative error bounds ||x - ref|| / ||ref|| against float64, by storage dtype.
TOLERANCE = {"float32": 1e-5, "float16": 5e-4, "bfloat16": 5e-3}

# (suite, dtype, tensor) -> (largest error, bound, case): filled by record(), printed by
# conftest at the end of the run.
MEASURED = {}


def causal_allowed(seqlen_q, seqlen_k, mode):
    """[seqlen_q, seqlen_k] bool: which keys each query sees. mode None, "bottom_right" or
    "top_left"."""
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    if mode is None:
        return np.ones((seqlen_q, seqlen_k), bool)
    if mode == "bottom_right":
        return j <= i + seqlen_k - seqlen_q
    if mode == "top_left":
        return j <= i
    raise ValueError(mode)


def _expand_kv(x, heads_q):
    # [b, s, hkv, d] -> [b, s, hq, d]: query head h reads key head h // (hq / hkv).
    return np.repeat(x, heads_q // x.shape[2], axis=2)


def forward(q, k, v, scale=None, causal=None):
    """out [b, sq, hq, d] and lse [b, hq, sq], float64. A row with no key: out 0, lse -inf."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    heads_q, head_dim = q.shape[2], q.shape[3]
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    k, v = _expand_kv(k, heads_q), _expand_kv(v, heads_q)
    scores = scale * np.einsum("bihd,bjhd->bhij", q, k)
    allowed = causal_allowed(q.shape[1], k.shape[1], causal)
    scores = np.where(allowed, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(scores - row_max)
    total = weights.sum(axis=-1, keepdims=True)
    p = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    out = np.einsum("bhij,bjhd->bihd", p, v)
    with np.errstate(divide="ignore"):
        lse = np.log(total[..., 0]) + row_max[..., 0]
    return out, lse


def backward(dout, q, k, v, scale=None, causal=None):
    """dq, dk, dv in float64; dk and dv summed over the query heads that share a key head."""
    dout, q, k, v = (np.asarray(x, np.float64) for x in (dout, q, k, v))
    heads_q, heads_kv, head_dim = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    out, lse = forward(q, k, v, scale, causal)
    k_full, v_full = _expand_kv(k, heads_q), _expand_kv(v, heads_q)
    scores = scale * np.einsum("bihd,bjhd->bhij", q, k_full)
    finite_lse = np.where(np.isfinite(lse), lse, 0.0)[..., None]
    allowed = causal_allowed(q.shape[1], k.shape[1], causal)
    p = np.where(allowed & np.isfinite(lse)[..., None], np.exp(scores - finite_lse), 0.0)
    dv_full = np.einsum("bhij,bihd->bjhd", p, dout)
    dp = np.einsum("bihd,bjhd->bhij", dout, v_full)
    delta = np.einsum("bihd,bihd->bhi", dout, out)[..., None]
    ds = p * (dp - delta)
    dq = scale * np.einsum("bhij,bjhd->bihd", ds, k_full)
    dk_full = scale * np.einsum("bhij,bihd->bjhd", ds, q)
    group = heads_q // heads_kv

    def fold(x):
        b, s, _, d = x.shape
        return x.reshape(b, s, heads_kv, group, d).sum(axis=3)

    return dq, fold(dk_full), fold(dv_full)


def relative_error(x, ref):
    """||x - ref|| / ||ref|| over the finite entries of ref (an LSE's -inf entries must match
    exactly, which the caller checks). A reference that is zero up to float64 rounding (dq
    when every query sees a single key) is compared by the root-mean-square of the
    difference instead, the test data being of unit scale."""
    x = np.asarray(x, np.float64)
    ref = np.asarray(ref, np.float64)
    finite = np.isfinite(ref)
    difference = np.linalg.norm(x[finite] - ref[finite])
    norm = np.linalg.norm(ref[finite])
    count = np.sqrt(max(finite.sum(), 1))
    if norm <= 1e-9 * count:
        return difference / count
    return difference / norm


def record(suite, dtype, tensor, error, case):
    key = (suite, str(dtype), tensor)
    bound = TOLERANCE[str(dtype)]
    if key not in MEASURED or error > MEASURED[key][0]:
        MEASURED[key] = (error, bound, case)
