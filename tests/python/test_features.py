"""The attention features from Python: sliding window, softcap, ALiBi, dropout and
variable-length batches, through flashc.forward/backward (numpy) and flashc.torch
(flash_attn_func, flash_attn_varlen_func), against a float64 torch autograd reference
written from flashc.h's definitions. The dropout mask of the reference comes from a numpy
Philox4x32-10 written here from the documented bit layout, so the test also pins that
layout. Skipped when torch is not installed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashc  # noqa: E402
import flashc.torch as ft  # noqa: E402

import attention_reference as ref  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MASK32 = 0xFFFFFFFF


def philox4x32_10(c, key):
    """Philox4x32-10 on uint64 arrays holding 32-bit words (Salmon et al., Random123)."""
    c0, c1, c2, c3 = (np.asarray(x, np.uint64) for x in c)
    k0, k1 = (np.uint64(x) for x in key)
    for r in range(10):
        if r:
            k0 = (k0 + np.uint64(0x9E3779B9)) & np.uint64(MASK32)
            k1 = (k1 + np.uint64(0xBB67AE85)) & np.uint64(MASK32)
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & np.uint64(MASK32),
                          (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & np.uint64(MASK32))
    return c0, c1, c2, c3


def test_philox_known_answers():
    out = philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0))
    assert [int(x) for x in out] == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def dropout_factors(seed, offset, p, heads_q, b, h, nq, nk):
    """[nq, nk] float64: 0 or 1/(1-p), from flashc.h's layout."""
    i = np.arange(nq, dtype=np.uint64)[:, None] + np.zeros((1, nk), np.uint64)
    j = np.arange(nk, dtype=np.uint64)[None, :] + np.zeros((nq, 1), np.uint64)
    w = (offset + b * heads_q + h) & 0xFFFFFFFFFFFFFFFF
    words = philox4x32_10((j >> np.uint64(2), i, np.uint64(w & MASK32), np.uint64(w >> 32)),
                          (seed & MASK32, (seed >> 32) & MASK32))
    r = np.choose((j & np.uint64(3)).astype(np.int64), words)
    threshold = int(np.float64(np.float32(p)) * 2.0 ** 32)
    return np.where(r >= threshold, 1.0 / (1.0 - np.float64(np.float32(p))), 0.0)


def reference(q, k, v, causal_mode=None, window=(-1, -1), softcap=0.0, slopes=None,
              dropout=None, scale=None):
    """float64 torch attention of one fixed-length batch [b, s, h, d], as flashc.h defines
    it. slopes: [b, hq] or None; dropout: (p, seed, offset) or None. Returns out and lse;
    gradients come from autograd on out."""
    b, nq, hq, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    kx = k.repeat_interleave(hq // hkv, dim=2)
    vx = v.repeat_interleave(hq // hkv, dim=2)
    x = scale * torch.einsum("bihd,bjhd->bhij", q, kx)
    if softcap:
        x = softcap * torch.tanh(x / softcap)
    off = 0 if causal_mode == "top_left" else nk - nq
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    if slopes is not None:
        x = x - torch.as_tensor(slopes, dtype=torch.float64)[:, :, None, None] * \
            (i + off - j).abs().double()
    allowed = torch.ones(nq, nk, dtype=torch.bool)
    if causal_mode is not None:
        allowed &= j <= i + off
    if window[0] >= 0:
        allowed &= j >= i + off - window[0]
    if window[1] >= 0:
        allowed &= j <= i + off + window[1]
    x = x.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(x, dim=-1)
    p = torch.where(torch.isfinite(lse)[..., None], torch.exp(x - lse[..., None].nan_to_num(
        neginf=0.0)), torch.zeros_like(x))
    if dropout is not None:
        dp, seed, offset = dropout
        factors = torch.stack([torch.stack([torch.from_numpy(
            dropout_factors(seed, offset, dp, hq, bb, hh, nq, nk)) for hh in range(hq)])
            for bb in range(b)])
        p = p * factors
    return torch.einsum("bhij,bjhd->bihd", p, vx), lse


def make(shape, dtype, generator, std=1.0):
    return (std * torch.randn(*shape, generator=generator)).to(DTYPES[dtype]).requires_grad_()


def check(name, x, x_ref, dtype, case, bound=None):
    error = ref.relative_error(x.detach().double().numpy(), x_ref.detach().double().numpy())
    ref.record("features torch cpu", dtype, name, error, case)
    assert error <= (bound or ref.TOLERANCE[dtype]), (name, case, error)


# (label, batch, nq, nk, hq, hkv, d, causal_mode, window, softcap, alibi, dropout_p)
CASES = [
    ("window", 2, 17, 40, 2, 2, 32, None, (4, 3), 0.0, False, 0.0),
    ("window+causal", 1, 70, 90, 4, 2, 64, "bottom_right", (20, -1), 0.0, False, 0.0),
    ("window_masked_rows", 1, 40, 17, 2, 1, 32, None, (0, 0), 0.0, False, 0.0),
    ("softcap", 2, 33, 33, 2, 2, 64, None, (-1, -1), 5.0, False, 0.0),
    ("alibi", 2, 40, 17, 4, 2, 32, "top_left", (-1, -1), 0.0, True, 0.0),
    ("dropout", 1, 70, 70, 2, 2, 32, "bottom_right", (-1, -1), 0.0, False, 0.3),
    ("everything", 2, 70, 100, 4, 2, 64, "bottom_right", (30, 0), 8.0, True, 0.2),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_flash_attn_func_features(dtype, case):
    label, b, nq, nk, hq, hkv, d, mode, window, softcap, alibi, dropout_p = case
    g = torch.Generator().manual_seed(CASES.index(case))
    q, k, v = make((b, nq, hq, d), dtype, g), make((b, nk, hkv, d), dtype, g), \
        make((b, nk, hkv, d), dtype, g)
    dout = torch.randn(b, nq, hq, d, generator=g).to(DTYPES[dtype])
    slopes = torch.rand(b, hq, generator=g) if alibi else None
    seed, offset = 1234567, 89
    out = ft.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=mode is not None,
                             window_size=window, softcap=softcap, alibi_slopes=slopes,
                             causal_mode=mode or "bottom_right", dropout_seed=seed,
                             dropout_offset=offset)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    out_ref, _ = reference(q64, k64, v64, mode, window, softcap,
                           None if slopes is None else slopes.double(),
                           (dropout_p, seed, offset) if dropout_p else None)
    grads_ref = torch.autograd.grad(out_ref, (q64, k64, v64), dout.double())
    for name, x, x_ref in zip(("out", "dq", "dk", "dv"), (out,) + grads, (out_ref,) + grads_ref):
        check(name, x, x_ref, dtype, label)


def test_numpy_front_end_features():
    g = torch.Generator().manual_seed(3)
    q, k, v = (make(s, "float32", g) for s in ((1, 50, 2, 32), (1, 60, 1, 32), (1, 60, 1, 32)))
    dout = torch.randn(1, 50, 2, 32, generator=g)
    slopes = np.array([0.5, 0.125], np.float32)
    kwargs = dict(causal=True, window_size=(12, -1), softcap=4.0, alibi_slopes=slopes,
                  dropout_p=0.25, dropout_seed=77, dropout_offset=5)
    qn, kn, vn = (x.detach().numpy() for x in (q, k, v))
    out, lse = flashc.forward(qn, kn, vn, **kwargs)
    dq, dk, dv = flashc.backward(dout.numpy(), qn, kn, vn, out, lse, **kwargs)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    out_ref, lse_ref = reference(q64, k64, v64, "bottom_right", (12, -1), 4.0,
                                 torch.from_numpy(np.tile(slopes, (1, 1))).double(),
                                 (0.25, 77, 5))
    grads_ref = torch.autograd.grad(out_ref, (q64, k64, v64), dout.double())
    for name, x, x_ref in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv),
                              (out_ref,) + grads_ref):
        check(name, torch.from_numpy(np.asarray(x)), x_ref, "float32", "numpy all features")
    check("lse", torch.from_numpy(lse), lse_ref, "float32", "numpy all features")


def test_dropout_is_seeded_and_regenerated():
    g = torch.Generator().manual_seed(4)
    q = make((1, 40, 2, 16), "float32", g)
    a = ft.flash_attn_func(q, q, q, dropout_p=0.5, dropout_seed=1)
    b = ft.flash_attn_func(q, q, q, dropout_p=0.5, dropout_seed=1)
    c = ft.flash_attn_func(q, q, q, dropout_p=0.5, dropout_seed=2)
    d = ft.flash_attn_func(q, q, q, dropout_p=0.5, dropout_seed=1, dropout_offset=2)
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, d)
    torch.manual_seed(0)
    e = ft.flash_attn_func(q, q, q, dropout_p=0.5)
    torch.manual_seed(0)
    f = ft.flash_attn_func(q, q, q, dropout_p=0.5)
    assert torch.equal(e, f)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_varlen_matches_each_sequence(dtype):
    # Lengths with an empty sequence, a sequence of one token and several blocks; GQA.
    lens_q, lens_k = [5, 0, 1, 70, 33], [5, 3, 1, 90, 33]
    g = torch.Generator().manual_seed(5)
    hq, hkv, d = 4, 2, 64
    q = make((sum(lens_q), hq, d), dtype, g)
    k = make((sum(lens_k), hkv, d), dtype, g)
    v = make((sum(lens_k), hkv, d), dtype, g)
    dout = torch.randn(sum(lens_q), hq, d, generator=g).to(DTYPES[dtype])
    cu_q = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32)
    slopes = torch.rand(len(lens_q), hq, generator=g)
    options = dict(causal=True, window_size=(25, -1), softcap=6.0)
    out, lse, _ = ft.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                            alibi_slopes=slopes, return_attn_probs=True,
                                            **options)
    assert out.shape == q.shape and lse.shape == (hq, sum(lens_q))
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    outs, lses = [], []
    for s in range(len(lens_q)):
        qs, ks, vs = (x[c[s]:c[s + 1]][None] for x, c in ((q64, cu_q), (k64, cu_k), (v64, cu_k)))
        if lens_q[s] == 0:
            continue
        o, l_ = reference(qs, ks, vs, "bottom_right", (25, -1), 6.0, slopes[s:s + 1].double())
        outs.append(o[0])
        lses.append(l_[0])
    out_ref = torch.cat(outs)
    grads_ref = torch.autograd.grad(out_ref, (q64, k64, v64), dout.double())
    for name, x, x_ref in zip(("out", "dq", "dk", "dv"), (out,) + grads, (out_ref,) + grads_ref):
        check(name, x, x_ref, dtype, "varlen")
    lse_ref = torch.cat(lses, dim=1)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref))


def test_feature_errors():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(flashc.FlashcError) as info:
        ft.flash_attn_func(q, q, q, alibi_slopes=torch.ones(3))
    assert info.value.status == flashc.Status.ERROR_SHAPE_MISMATCH
    assert "alibi_slopes" in info.value.message
    with pytest.raises(flashc.FlashcError) as info:
        ft.flash_attn_func(q, q, q, window_size=(-2, 0))
    assert info.value.status == flashc.Status.ERROR_INVALID_PARAM
    assert "window" in info.value.message
    qv = q[0]
    bad = torch.tensor([0, 5, 3], dtype=torch.int32)
    with pytest.raises(flashc.FlashcError) as info:
        ft.flash_attn_varlen_func(qv, qv, qv, bad, bad)
    assert info.value.status == flashc.Status.ERROR_INVALID_PARAM
    assert "cu_seqlens_q" in info.value.message
    with pytest.raises(flashc.FlashcError) as info:
        flashc.forward(qv.numpy(), qv.numpy(), qv.numpy(), cu_seqlens_q=[0, 8])
    assert info.value.status == flashc.Status.ERROR_NULL_POINTER
