"""flashc.forward / flashc.backward on numpy arrays with the CPU backend: dtypes, shapes,
causal modes, GQA/MQA and strided views, against the float64 reference of
attention_reference.py and against the library's own "reference" backend."""

import threading

import numpy as np
import pytest

import flashc
from flashc import _numpy as flashc_numpy

import attention_reference as ref

ml_dtypes = pytest.importorskip("ml_dtypes")

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
SHAPES = [
    (1, 1, 1, 1, 1, 1),
    (2, 17, 17, 4, 4, 32),
    (1, 100, 100, 2, 2, 64),
    (2, 17, 100, 4, 2, 80),      # GQA, fewer queries than keys
    (1, 100, 17, 3, 1, 128),     # MQA, more queries than keys: bottom-right leaves rows empty
    (2, 1, 100, 2, 2, 64),       # one query (decoding)
    (1, 17, 1, 2, 1, 32),        # one key
]

CAUSAL_MODES = [None, "bottom_right", "top_left"]


def random_inputs(shape, dtype, seed=0):
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = shape
    rng = np.random.default_rng(seed)

    def make(*dims):
        return rng.standard_normal(dims).astype(DTYPES[dtype])

    q = make(batch, seqlen_q, heads_q, head_dim)
    k = make(batch, seqlen_k, heads_kv, head_dim)
    v = make(batch, seqlen_k, heads_kv, head_dim)
    dout = make(batch, seqlen_q, heads_q, head_dim)
    return q, k, v, dout


def causal_kwargs(mode):
    return {"causal": mode is not None, "causal_mode": mode or "bottom_right"}


def check_lse(lse, lse_ref, dtype, case, suite):
    assert lse.dtype == np.float32
    assert lse.shape == lse_ref.shape
    # Rows that see no key: LSE exactly -inf, never NaN.
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    assert not np.isnan(lse).any()
    error = ref.relative_error(lse, lse_ref)
    ref.record(suite, dtype, "lse", error, case)
    assert error <= max(ref.TOLERANCE[dtype], 1e-5), (case, error)


def check_close(name, x, x_ref, dtype, case, suite):
    assert np.isfinite(np.asarray(x, np.float64)).all(), (name, case)
    error = ref.relative_error(x, x_ref)
    ref.record(suite, dtype, name, error, case)
    assert error <= ref.TOLERANCE[dtype], "%s %s: relative error %.3e > %.0e" % (
        name, case, error, ref.TOLERANCE[dtype])


def test_version_and_backends():
    assert flashc.__version__.count(".") == 2
    backends = flashc.backends()
    assert "cpu" in backends and "reference" in backends
    assert set(backends) <= {"cpu", "cuda", "reference"}


@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=lambda m: m or "full")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b%d_sq%d_sk%d_hq%d_hkv%d_d%d" % s)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_against_float64(dtype, shape, mode):
    q, k, v, dout = random_inputs(shape, dtype)
    kwargs = causal_kwargs(mode)
    case = "%s %s" % ("b%d_sq%d_sk%d_hq%d_hkv%d_d%d" % shape, mode or "full")

    out, lse = flashc.forward(q, k, v, **kwargs)
    assert out.dtype == q.dtype and out.shape == q.shape
    out_ref, lse_ref = ref.forward(q, k, v, causal=mode)
    check_close("out", out, out_ref, dtype, case, "cpu vs float64")
    check_lse(lse, lse_ref, dtype, case, "cpu vs float64")

    dq, dk, dv = flashc.backward(dout, q, k, v, out, lse, **kwargs)
    for name, grad, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        assert grad.dtype == like.dtype and grad.shape == like.shape, name
    grads_ref = ref.backward(dout, q, k, v, causal=mode)
    for name, grad, grad_ref in zip(("dq", "dk", "dv"), (dq, dk, dv), grads_ref):
        check_close(name, grad, grad_ref, dtype, case, "cpu vs float64")


@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=lambda m: m or "full")
@pytest.mark.parametrize("shape", [SHAPES[3], SHAPES[4]], ids=["gqa", "mqa"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_against_reference_backend(dtype, shape, mode):
    """The CPU backend and the library's float64 reference backend agree, and the reference
    backend agrees with this file's float64 reference."""
    q, k, v, dout = random_inputs(shape, dtype, seed=1)
    kwargs = causal_kwargs(mode)
    case = "%s %s" % ("b%d_sq%d_sk%d_hq%d_hkv%d_d%d" % shape, mode or "full")
    out, lse = flashc.forward(q, k, v, **kwargs)
    out_r, lse_r = flashc.forward(q, k, v, backend="reference", **kwargs)
    check_close("out", out, out_r, dtype, case, "cpu vs reference")
    check_lse(lse, lse_r, dtype, case, "cpu vs reference")
    out_ref, lse_ref = ref.forward(q, k, v, causal=mode)
    check_close("out", out_r, out_ref, dtype, case, "reference vs float64")
    check_lse(lse_r, lse_ref, dtype, case, "reference vs float64")

    grads = flashc.backward(dout, q, k, v, out, lse, **kwargs)
    grads_r = flashc.backward(dout, q, k, v, out_r, lse_r, backend="reference", **kwargs)
    grads_ref = ref.backward(dout, q, k, v, causal=mode)
    for name, grad, grad_r, grad_ref in zip(("dq", "dk", "dv"), grads, grads_r, grads_ref):
        check_close(name, grad, grad_r, dtype, case, "cpu vs reference")
        check_close(name, grad_r, grad_ref, dtype, case, "reference vs float64")


def test_softmax_scale():
    q, k, v, dout = random_inputs((1, 17, 33, 2, 1, 64), "float32")
    out, lse = flashc.forward(q, k, v, softmax_scale=0.3, causal=True)
    out_ref, lse_ref = ref.forward(q, k, v, scale=0.3, causal="bottom_right")
    assert ref.relative_error(out, out_ref) <= 1e-5
    assert ref.relative_error(lse, lse_ref) <= 1e-5
    grads = flashc.backward(dout, q, k, v, out, lse, softmax_scale=0.3, causal=True)
    for grad, grad_ref in zip(grads, ref.backward(dout, q, k, v, scale=0.3, causal="bottom_right")):
        assert ref.relative_error(grad, grad_ref) <= 1e-5


def test_rows_without_keys_are_zero_and_finite():
    # Bottom-right alignment with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k queries
    # see no key at all.
    q, k, v, dout = random_inputs((1, 10, 4, 2, 2, 16), "float32")
    out, lse = flashc.forward(q, k, v, causal=True)
    assert (out[:, :6] == 0).all()
    assert np.isneginf(lse[:, :, :6]).all() and np.isfinite(lse[:, :, 6:]).all()
    dq, dk, dv = flashc.backward(dout, q, k, v, out, lse, causal=True)
    assert (dq[:, :6] == 0).all()
    assert all(np.isfinite(g).all() for g in (dq, dk, dv))


# -------------------------------------------------------------------------------------------
# Strides
# -------------------------------------------------------------------------------------------


def test_sdpa_layout_views_are_read_in_place():
    rng = np.random.default_rng(2)
    # [batch, heads, seqlen, head_dim] buffers, viewed as [batch, seqlen, heads, head_dim].
    q_bhsd = rng.standard_normal((2, 4, 17, 32)).astype(np.float32)
    k_bhsd = rng.standard_normal((2, 2, 23, 32)).astype(np.float32)
    v_bhsd = rng.standard_normal((2, 2, 23, 32)).astype(np.float32)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q_bhsd, k_bhsd, v_bhsd))
    for view in (q, k, v):
        assert not view.flags.c_contiguous
        assert flashc_numpy.element_strides(view, True) is not None  # no copy made
    out, lse = flashc.forward(q, k, v, causal=True, causal_mode="top_left")
    out_ref, lse_ref = ref.forward(q, k, v, causal="top_left")
    assert ref.relative_error(out, out_ref) <= 1e-5
    assert ref.relative_error(lse, lse_ref) <= 1e-5
    # Outputs written in place into an SDPA-layout buffer, too.
    out_bhsd = np.full((2, 4, 17, 32), 7.0, np.float32)
    out_view = out_bhsd.transpose(0, 2, 1, 3)
    returned, _ = flashc.forward(q, k, v, causal=True, causal_mode="top_left", out=out_view)
    assert returned is out_view
    np.testing.assert_array_equal(out_bhsd.transpose(0, 2, 1, 3), out)
    dout = rng.standard_normal((2, 4, 17, 32)).astype(np.float32).transpose(0, 2, 1, 3)
    grads = flashc.backward(dout, q, k, v, out, lse, causal=True, causal_mode="top_left")
    for grad, grad_ref in zip(grads, ref.backward(dout, q, k, v, causal="top_left")):
        assert ref.relative_error(grad, grad_ref) <= 1e-5


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_sliced_views(dtype):
    rng = np.random.default_rng(3)
    big = rng.standard_normal((3, 40, 6, 96)).astype(DTYPES[dtype])
    q = big[:2, ::2, 1:5, :64]        # every other position, 4 of 6 heads, 64 of 96 dims
    k = big[1:, 3:30:3, 0:2, 32:]     # another window of the same buffer
    v = big[1:, 4:31:3, 4:6, 16:80]
    for view in (q, k, v):
        assert flashc_numpy.element_strides(view, True) is not None
    out, lse = flashc.forward(q, k, v)
    out_ref, lse_ref = ref.forward(q, k, v)
    assert ref.relative_error(out, out_ref) <= ref.TOLERANCE[dtype]
    dout = big[:2, 1::2, :4, 32:]
    grads = flashc.backward(dout, q, k, v, out, lse)
    for grad, grad_ref in zip(grads, ref.backward(dout, q, k, v)):
        assert ref.relative_error(grad, grad_ref) <= ref.TOLERANCE[dtype]


def test_views_the_library_cannot_take_are_copied():
    rng = np.random.default_rng(4)
    base = rng.standard_normal((2, 12, 2, 64)).astype(np.float32)
    strided_last = base[..., ::2]            # head_dim not contiguous
    reversed_seq = base[:, ::-1, :, :32]     # negative stride
    broadcast = np.broadcast_to(base[:1, :, :, :32], (2, 12, 2, 32))  # stride 0 on batch
    assert flashc_numpy.element_strides(strided_last, True) is None
    assert flashc_numpy.element_strides(reversed_seq, True) is None
    assert flashc_numpy.element_strides(broadcast, True) is not None
    for q, k, v in ((strided_last, reversed_seq, broadcast), (broadcast, broadcast, reversed_seq)):
        out, lse = flashc.forward(q, k, v, causal=True)
        out_ref, lse_ref = ref.forward(q, k, v, causal="bottom_right")
        assert ref.relative_error(out, out_ref) <= 1e-5
        dout = np.ones_like(out)[:, ::-1]
        grads = flashc.backward(dout, q, k, v, out, lse, causal=True)
        for grad, grad_ref in zip(grads, ref.backward(dout, q, k, v, causal="bottom_right")):
            assert ref.relative_error(grad, grad_ref) <= 1e-5


def test_outputs_into_caller_arrays():
    q, k, v, dout = random_inputs((1, 9, 9, 2, 2, 16), "float32", seed=5)
    # out into a window of a larger buffer: only the window is written.
    out_buffer = np.full((1, 9, 3, 16), 5.0, np.float32)
    lse_buffer = np.full((1, 2, 18), 5.0, np.float32)
    out, lse = flashc.forward(q, k, v, out=out_buffer[:, :, 1:], lse=lse_buffer[:, :, ::2])
    out_ref, lse_ref = ref.forward(q, k, v)
    assert ref.relative_error(out_buffer[:, :, 1:], out_ref) <= 1e-5
    assert ref.relative_error(lse_buffer[:, :, ::2], lse_ref) <= 1e-5
    assert (out_buffer[:, :, 0] == 5.0).all() and (lse_buffer[:, :, 1::2] == 5.0).all()
    # A caller array that the library cannot write in place is filled through a temporary.
    dq_buffer = np.zeros((1, 9, 2, 32), np.float32)
    dk = np.zeros_like(k)
    dq, dk_returned, dv = flashc.backward(dout, q, k, v, out, lse, dq=dq_buffer[..., ::2], dk=dk)
    assert dk_returned is dk
    dq_ref, dk_ref, dv_ref = ref.backward(dout, q, k, v)
    assert ref.relative_error(dq_buffer[..., ::2], dq_ref) <= 1e-5
    assert (dq_buffer[..., 1::2] == 0).all()
    assert ref.relative_error(dk, dk_ref) <= 1e-5


# -------------------------------------------------------------------------------------------
# Backends and threads
# -------------------------------------------------------------------------------------------


def test_backend_handles_are_cached():
    assert flashc.get_backend("cpu") is flashc.get_backend("cpu")
    one_thread = flashc.get_backend("cpu", num_threads=1)
    assert one_thread is flashc.get_backend("cpu", num_threads=1)
    assert one_thread is not flashc.get_backend("cpu")
    assert one_thread.name == "cpu" and "1 thread" in one_thread.describe()
    assert flashc.get_backend("reference").name == "reference"
    assert not one_thread.uses_device_memory


def test_thread_counts_and_determinism():
    q, k, v, dout = random_inputs((2, 100, 100, 4, 2, 64), "float32", seed=6)
    out1, lse1 = flashc.forward(q, k, v, causal=True, num_threads=1)
    out2, lse2 = flashc.forward(q, k, v, causal=True, num_threads=2)
    np.testing.assert_allclose(out1, out2, rtol=1e-5, atol=1e-6)
    first = flashc.backward(dout, q, k, v, out1, lse1, causal=True, deterministic=True)
    second = flashc.backward(dout, q, k, v, out1, lse1, causal=True, deterministic=True)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_concurrent_calls_from_python_threads():
    q, k, v, _ = random_inputs((1, 64, 64, 2, 2, 32), "float32", seed=7)
    expected, _ = flashc.forward(q, k, v)
    results, errors = [], []

    def work():
        for _ in range(5):
            results.append(flashc.forward(q, k, v)[0])
            try:  # each thread reads its own last error
                flashc.forward(q, k[..., :16], v)
            except flashc.FlashcError as error:
                errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 20 and len(errors) == 20
    for result in results:
        np.testing.assert_array_equal(result, expected)
    for error in errors:
        assert error.status == flashc.Status.ERROR_SHAPE_MISMATCH and "k:" in error.message
