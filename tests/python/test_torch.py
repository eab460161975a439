"""flashc.torch on CPU tensors: forward and gradients against torch's own SDPA in float64,
flash_attn_func's bottom-right causal convention, SDPA's top-left one, GQA, views, the
custom ops under torch.library.opcheck and torch.compile, and the errors. Skipped when torch
is not installed."""

import math

import pytest

torch = pytest.importorskip("torch")

import flashc  # noqa: E402
import flashc.torch as ft  # noqa: E402

import attention_reference as ref  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def relative_error(x, reference):
    return ref.relative_error(x.detach().double().numpy(), reference.detach().double().numpy())


def sdpa_inputs(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def make(*shape):
        return torch.randn(*shape, generator=generator).to(DTYPES[dtype]).requires_grad_()

    q = make(batch, heads_q, seqlen_q, head_dim)
    k = make(batch, heads_kv, seqlen_k, head_dim)
    v = make(batch, heads_kv, seqlen_k, head_dim)
    dout = torch.randn(batch, heads_q, seqlen_q, head_dim, generator=generator).to(DTYPES[dtype])
    return q, k, v, dout


def float64_sdpa(q, k, v, dout, **kwargs):
    """torch SDPA in float64 on the same (rounded) inputs: output and input gradients."""
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, **kwargs)
    grads = torch.autograd.grad(out, (q64, k64, v64), dout.double())
    return out, grads


# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim)
SDPA_SHAPES = [
    (2, 4, 4, 17, 17, 32),
    (1, 4, 2, 17, 100, 64),   # GQA, fewer queries than keys
    (2, 3, 1, 40, 17, 80),    # MQA, more queries than keys (top-left: every row sees a key)
    (1, 2, 2, 1, 33, 128),
]


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SDPA_SHAPES, ids=lambda s: "b%d_hq%d_hkv%d_sq%d_sk%d_d%d" % s)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_sdpa_against_torch_float64(dtype, shape, is_causal):
    q, k, v, dout = sdpa_inputs(*shape, dtype)
    gqa = shape[1] != shape[2]
    out = ft.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=gqa)
    assert out.shape == q.shape and out.dtype == q.dtype
    grads = torch.autograd.grad(out, (q, k, v), dout)
    out_ref, grads_ref = float64_sdpa(q, k, v, dout, is_causal=is_causal, enable_gqa=gqa)
    case = "b%d_hq%d_hkv%d_sq%d_sk%d_d%d %s" % (shape + ("causal" if is_causal else "full",))
    for name, x, x_ref in zip(("out", "dq", "dk", "dv"), (out,) + grads, (out_ref,) + grads_ref):
        assert x.shape == x_ref.shape and x.dtype == DTYPES[dtype], name
        error = relative_error(x, x_ref)
        ref.record("torch cpu vs SDPA f64", dtype, name, error, case)
        assert error <= ref.TOLERANCE[dtype], (name, case, error)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_flash_attn_func_bottom_right_causal(dtype):
    # flash_attn layout [b, s, h, d]; causal aligned to the bottom-right corner.
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 23, 4, 64, generator=generator).to(DTYPES[dtype]).requires_grad_()
    k = torch.randn(2, 57, 2, 64, generator=generator).to(DTYPES[dtype]).requires_grad_()
    v = torch.randn(2, 57, 2, 64, generator=generator).to(DTYPES[dtype]).requires_grad_()
    dout = torch.randn(2, 23, 4, 64, generator=generator).to(DTYPES[dtype])
    out = ft.flash_attn_func(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    allowed = torch.from_numpy(ref.causal_allowed(23, 57, "bottom_right"))
    to_bhsd = lambda x: x.transpose(1, 2)  # noqa: E731
    out_ref, grads_ref = float64_sdpa(to_bhsd(q), to_bhsd(k), to_bhsd(v), to_bhsd(dout),
                                      attn_mask=allowed, enable_gqa=True)
    assert relative_error(out, to_bhsd(out_ref)) <= ref.TOLERANCE[dtype]
    for grad, grad_ref in zip(grads, grads_ref):
        assert relative_error(grad, to_bhsd(grad_ref)) <= ref.TOLERANCE[dtype]


def test_flash_attn_func_top_left_mode_and_scale():
    q, k, v, dout = sdpa_inputs(1, 2, 2, 30, 12, 32, "float32", seed=2)
    to_bshd = lambda x: x.transpose(1, 2)  # noqa: E731
    out = ft.flash_attn_func(to_bshd(q), to_bshd(k), to_bshd(v), softmax_scale=0.2, causal=True,
                             causal_mode="top_left")
    out_ref, _ = float64_sdpa(q, k, v, dout, is_causal=True, scale=0.2)
    assert relative_error(out, to_bshd(out_ref)) <= 1e-5


def test_return_attn_probs_gives_lse():
    q, k, v, _ = sdpa_inputs(1, 2, 2, 9, 9, 16, "float32", seed=3)
    to_bshd = lambda x: x.transpose(1, 2)  # noqa: E731
    out, lse, probabilities = ft.flash_attn_func(to_bshd(q), to_bshd(k), to_bshd(v),
                                                 return_attn_probs=True)
    assert probabilities is None
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(16)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, dim=-1), rtol=1e-5, atol=1e-5)


def test_sdpa_reads_views_and_returns_one():
    q, k, v, dout = sdpa_inputs(2, 4, 4, 17, 17, 32, "float32", seed=4)
    out = ft.scaled_dot_product_attention(q, k, v)
    # The kernel's [b, s, h, d] result, transposed: a view, as SDPA's own flash backend gives.
    assert out.transpose(1, 2).is_contiguous()
    # Inputs that are themselves views of a [b, s, h, d] buffer (what a model's projections
    # give after .view(b, s, h, d).transpose(1, 2)).
    packed = torch.randn(2, 17, 3, 4, 32)
    q2, k2, v2 = (packed[:, :, i].transpose(1, 2) for i in range(3))
    out2 = ft.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
    reference = torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
    torch.testing.assert_close(out2, reference, rtol=1e-5, atol=1e-5)


def test_sdpa_three_dimensional_inputs():
    q, k, v = (torch.randn(3, 11, 16) for _ in range(3))
    out = ft.scaled_dot_product_attention(q, k, v, is_causal=True)
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


def test_gradient_through_a_broadcast_output_gradient():
    # out.sum() hands the backward a gradient expanded from a scalar: every stride is 0.
    q, k, v, _ = sdpa_inputs(1, 2, 2, 8, 8, 16, "float32", seed=5)
    ft.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=True).sum().backward()
    for x, x64 in zip((q, k, v), (q64, k64, v64)):
        assert relative_error(x.grad, x64.grad) <= 1e-5


def test_autograd_function_matches_the_custom_op():
    q, k, v, dout = sdpa_inputs(1, 4, 2, 13, 21, 32, "float32", seed=6)
    views = [x.transpose(1, 2) for x in (q, k, v)]
    scale = 1.0 / math.sqrt(32)
    out, lse = ft.FlashAttnFunction.apply(*views, scale, int(flashc.Causal.BOTTOM_RIGHT), -1, -1,
                                          0.0, False, "")
    grads = torch.autograd.grad(out, (q, k, v), dout.transpose(1, 2))
    out2 = ft.flash_attn_func(*views, causal=True)
    grads2 = torch.autograd.grad(out2, (q, k, v), dout.transpose(1, 2))
    torch.testing.assert_close(out, out2, rtol=0, atol=0)
    for a, b in zip(grads, grads2):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.skipif(not ft.HAS_CUSTOM_OPS, reason="torch.library.custom_op needs torch >= 2.4")
def test_meta_tensors_give_shapes():
    # Models are often built and traced on the meta device first.
    q = torch.empty(2, 4, 9, 32, device="meta")
    k = torch.empty(2, 2, 5, 32, device="meta")
    out = ft.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
    assert out.device.type == "meta" and out.shape == (2, 4, 9, 32)


def test_reference_backend_through_torch():
    q, k, v, _ = sdpa_inputs(1, 2, 1, 10, 14, 32, "float32", seed=7)
    out = ft.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                          backend="reference")
    expected = ft.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not ft.HAS_CUSTOM_OPS, reason="torch.library.custom_op needs torch >= 2.4")
def test_custom_ops_pass_opcheck():
    q, k, v, dout = sdpa_inputs(1, 4, 2, 9, 12, 16, "float32", seed=8)
    views = [x.transpose(1, 2) for x in (q, k, v)]
    options = (0.25, int(flashc.Causal.TOP_LEFT), -1, -1, 0.0, False, "")
    torch.library.opcheck(torch.ops.flashc.attention_forward.default, (*views, *options))
    out, lse = torch.ops.flashc.attention_forward(*views, *options)
    detached = [x.detach() for x in views]
    torch.library.opcheck(torch.ops.flashc.attention_backward.default,
                          (dout.transpose(1, 2), *detached, out.detach(), lse.detach(), *options))


@pytest.mark.skipif(not ft.HAS_CUSTOM_OPS, reason="torch.library.custom_op needs torch >= 2.4")
def test_torch_compile_forward_and_backward():
    def block(q, k, v):
        # A little arithmetic around the op, so the compiled graph is more than the op alone.
        out = ft.scaled_dot_product_attention(q * 1.5, k, v, is_causal=True, enable_gqa=True)
        return (out.float() ** 2).sum()

    compiled = torch.compile(block, fullgraph=True)
    q, k, v, _ = sdpa_inputs(2, 4, 2, 16, 16, 32, "float32", seed=9)
    loss = compiled(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    loss_eager = block(q, k, v)
    grads_eager = torch.autograd.grad(loss_eager, (q, k, v))
    torch.testing.assert_close(loss, loss_eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, grads_eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# -------------------------------------------------------------------------------------------
# Errors
# -------------------------------------------------------------------------------------------


def expect_error(status, fragment, function, *args, **kwargs):
    with pytest.raises(flashc.FlashcError) as info:
        function(*args, **kwargs)
    assert info.value.status == status, repr(info.value)
    assert fragment in info.value.message, info.value.message


def test_unsupported_options_are_refused():
    q, k, v, _ = sdpa_inputs(1, 2, 2, 8, 8, 16, "float32")
    unsupported = flashc.Status.ERROR_UNSUPPORTED
    expect_error(unsupported, "dropout_p", ft.scaled_dot_product_attention, q, k, v, dropout_p=0.5)
    expect_error(unsupported, "attn_mask", ft.scaled_dot_product_attention, q, k, v,
                 attn_mask=torch.ones(8, 8, dtype=torch.bool))


def test_sliding_window_goes_to_the_library():
    # The window is the library's to implement: it either computes it or refuses it.
    q, k, v, dout = sdpa_inputs(1, 2, 2, 16, 16, 16, "float32")
    bshd = [x.transpose(1, 2) for x in (q, k, v)]
    try:
        out = ft.flash_attn_func(*bshd, causal=True, window_size=(3, 0))
    except flashc.FlashcError as error:
        assert error.status == flashc.Status.ERROR_UNSUPPORTED, repr(error)
        return
    i = torch.arange(16)[:, None]
    j = torch.arange(16)[None, :]
    allowed = (j <= i) & (j >= i - 3)
    out_ref, _ = float64_sdpa(q, k, v, dout, attn_mask=allowed)
    assert relative_error(out, out_ref.transpose(1, 2)) <= 1e-5


def test_bad_tensors():
    q, k, v, _ = sdpa_inputs(1, 4, 2, 8, 8, 16, "float32")
    Status = flashc.Status
    expect_error(Status.ERROR_INVALID_HEADS, "enable_gqa", ft.scaled_dot_product_attention, q, k, v)
    expect_error(Status.ERROR_INVALID_DTYPE, "float64", ft.scaled_dot_product_attention,
                 q.double(), k.double(), v.double(), enable_gqa=True)
    expect_error(Status.ERROR_DTYPE_MISMATCH, "", ft.scaled_dot_product_attention,
                 q, k.half(), v, enable_gqa=True)
    expect_error(Status.ERROR_SHAPE_MISMATCH, "head_dim", ft.scaled_dot_product_attention,
                 q, k[..., :8], v, enable_gqa=True)
    expect_error(Status.ERROR_INVALID_SIZE, "4-d", ft.flash_attn_func, q[0], k, v)
    expect_error(Status.ERROR_INVALID_SIZE, "query", ft.scaled_dot_product_attention, q[0, 0, 0],
                 k, v)
    expect_error(Status.ERROR_INVALID_POINTER, "meta", ft.scaled_dot_product_attention, q,
                 k.to("meta"), v, enable_gqa=True)
    if ft.HAS_CUSTOM_OPS:  # the kernels refuse other devices; meta reaches the fake kernels
        expect_error(Status.ERROR_INVALID_POINTER, "meta", ft._attention_forward,
                     *(torch.empty(1, 8, 2, 16, device="meta"),) * 3, 0.25, 0, -1, -1, 0.0,
                     False, "")
    expect_error(Status.ERROR_INVALID_PARAM, "softmax_scale", ft.scaled_dot_product_attention,
                 q, k, v, scale=0.0, enable_gqa=True)
    expect_error(Status.ERROR_BACKEND_UNAVAILABLE, "tpu", ft.scaled_dot_product_attention,
                 q, k, v, enable_gqa=True, backend="tpu")


def test_autocast_casts_like_sdpa():
    q, k, v, _ = sdpa_inputs(1, 2, 2, 12, 12, 32, "float32", seed=10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ft.scaled_dot_product_attention(q, k, v, is_causal=True)
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == expected.dtype == torch.bfloat16
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32
    assert relative_error(out, expected) <= 1e-2
