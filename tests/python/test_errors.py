"""Every way flashc.forward / flashc.backward can be called wrongly from numpy raises
flashc.FlashcError with the right status and a message naming the argument, and writes
nothing."""

import contextlib

import numpy as np
import pytest

import flashc
from flashc import Status


def arrays(batch=1, seqlen_q=8, seqlen_k=8, heads_q=2, heads_kv=2, head_dim=16,
           dtype=np.float32):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch, seqlen_q, heads_q, head_dim)).astype(dtype)
    k = rng.standard_normal((batch, seqlen_k, heads_kv, head_dim)).astype(dtype)
    v = rng.standard_normal((batch, seqlen_k, heads_kv, head_dim)).astype(dtype)
    return q, k, v


@contextlib.contextmanager
def raises(status, *fragments):
    """Checks the FlashcError raised in the with-block: its status, and fragments of its
    message."""
    with pytest.raises(flashc.FlashcError) as info:
        yield
    error = info.value
    assert error.status == status, "expected %s, got %r" % (status.name, error)
    assert isinstance(error.status, Status)
    assert str(error).startswith("FLASHC_" + status.name), str(error)
    for fragment in fragments:
        assert fragment in error.message, (fragment, error.message)


def test_error_is_a_runtime_error_carrying_the_library_message():
    q, k, v = arrays()
    with pytest.raises(RuntimeError) as info:
        flashc.forward(q, k[..., :8], v)
    error = info.value
    assert isinstance(error, flashc.FlashcError)
    assert error.status == Status.ERROR_SHAPE_MISMATCH
    assert error.message.endswith("k: shape[3] (head_dim) is 8 but q has 16")
    assert error.message in str(error)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.complex64])
def test_unsupported_dtype(dtype):
    q, k, v = arrays()
    with raises(Status.ERROR_INVALID_DTYPE, "q:", np.dtype(dtype).name):
        flashc.forward(q.astype(dtype), k, v)


def test_dtype_mismatch():
    q, k, v = arrays()
    with raises(Status.ERROR_DTYPE_MISMATCH, "k"):
        flashc.forward(q, k.astype(np.float16), v)
    out, lse = flashc.forward(q, k, v)
    with raises(Status.ERROR_DTYPE_MISMATCH, "lse"):
        flashc.forward(q, k, v, lse=np.zeros(lse.shape, np.float16))
    with raises(Status.ERROR_DTYPE_MISMATCH, "out"):
        flashc.forward(q, k, v, out=np.zeros(q.shape, np.float16))
    with raises(Status.ERROR_DTYPE_MISMATCH, "lse"):
        flashc.backward(out, q, k, v, out, lse.astype(np.float16))


def test_shape_mismatches():
    q, k, v = arrays(batch=2)
    with raises(Status.ERROR_SHAPE_MISMATCH, "k:", "head_dim"):
        flashc.forward(q, k[..., :8], v)
    with raises(Status.ERROR_SHAPE_MISMATCH, "k:"):
        flashc.forward(q, k[:1], v)
    with raises(Status.ERROR_SHAPE_MISMATCH, "v:"):
        flashc.forward(q, k, v[:, :4])
    with raises(Status.ERROR_SHAPE_MISMATCH, "v:"):
        flashc.forward(q, k, v[:, :, :1])
    with raises(Status.ERROR_SHAPE_MISMATCH, "out:"):
        flashc.forward(q, k, v, out=np.zeros((2, 8, 2, 8), np.float32))
    with raises(Status.ERROR_SHAPE_MISMATCH, "lse:"):
        flashc.forward(q, k, v, lse=np.zeros((2, 2, 7), np.float32))


def test_backward_shape_mismatches():
    q, k, v = arrays(batch=2)
    out, lse = flashc.forward(q, k, v)
    with raises(Status.ERROR_SHAPE_MISMATCH, "dout:"):
        flashc.backward(out[:, :4], q, k, v, out, lse)
    with raises(Status.ERROR_SHAPE_MISMATCH, "out:"):
        flashc.backward(out, q, k, v, out[:1], lse)
    with raises(Status.ERROR_SHAPE_MISMATCH, "lse:"):
        flashc.backward(out, q, k, v, out, lse[:, :1])
    with raises(Status.ERROR_SHAPE_MISMATCH, "dk:"):
        flashc.backward(out, q, k, v, out, lse, dk=np.zeros_like(q[:, :4]))


def test_heads_not_a_multiple():
    q, k, v = arrays(heads_q=3, heads_kv=2)
    with raises(Status.ERROR_INVALID_HEADS):
        flashc.forward(q, k, v)


@pytest.mark.parametrize("head_dim", [257, 512])
def test_head_dim_too_large(head_dim):
    q, k, v = arrays(head_dim=head_dim, seqlen_q=2, seqlen_k=2)
    with raises(Status.ERROR_INVALID_HEAD_DIM, "q:"):
        flashc.forward(q, k, v)


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_wrong_ndim(name):
    tensors = dict(zip("qkv", arrays()))
    tensors[name] = tensors[name][0]
    with raises(Status.ERROR_INVALID_SIZE, name + ":", "ndim is 3"):
        flashc.forward(tensors["q"], tensors["k"], tensors["v"])


def test_wrong_ndim_in_backward():
    q, k, v = arrays()
    out, lse = flashc.forward(q, k, v)
    with raises(Status.ERROR_INVALID_SIZE, "dout:"):
        flashc.backward(out[0], q, k, v, out, lse)
    with raises(Status.ERROR_INVALID_SIZE, "lse:"):
        flashc.backward(out, q, k, v, out, lse[0])


def test_empty_sizes():
    q, k, v = arrays()
    with raises(Status.ERROR_INVALID_SIZE, "q:"):
        flashc.forward(q[:, :0], k, v)
    with raises(Status.ERROR_INVALID_SIZE, "k:"):
        flashc.forward(q, k[:, :0], v[:, :0])


def test_invalid_params():
    q, k, v = arrays()
    with raises(Status.ERROR_INVALID_PARAM, "causal_mode"):
        flashc.forward(q, k, v, causal=True, causal_mode="diagonal")
    with raises(Status.ERROR_INVALID_PARAM, "causal"):
        flashc.forward(q, k, v, causal=True, causal_mode=7)
    with raises(Status.ERROR_INVALID_PARAM, "softmax_scale"):
        flashc.forward(q, k, v, softmax_scale=float("nan"))
    with raises(Status.ERROR_INVALID_PARAM, "softmax_scale"):
        flashc.forward(q, k, v, softmax_scale=float("inf"))
    with raises(Status.ERROR_INVALID_PARAM, "softmax_scale", "None"):
        flashc.forward(q, k, v, softmax_scale=0.0)
    # values past a C field's range are refused, not wrapped (2**32 would become 0)
    with raises(Status.ERROR_INVALID_PARAM, "causal_mode"):
        flashc.forward(q, k, v, causal=True, causal_mode=2**32 + 2)
    with raises(Status.ERROR_INVALID_PARAM, "window_left"):
        flashc.forward(q, k, v, window_size=(2**32, -1))


def test_unknown_and_unavailable_backends():
    q, k, v = arrays()
    with raises(Status.ERROR_BACKEND_UNAVAILABLE, "tpu"):
        flashc.forward(q, k, v, backend="tpu")
    if "cuda" not in flashc.backends():
        with raises(Status.ERROR_BACKEND_UNAVAILABLE, "cuda"):
            flashc.forward(q, k, v, backend="cuda")


def test_aliasing_outputs():
    q, k, v = arrays()
    with raises(Status.ERROR_ALIASING, "out"):
        flashc.forward(q, k, v, out=q)
    out, lse = flashc.forward(q, k, v)
    with raises(Status.ERROR_ALIASING):
        flashc.backward(out, q, k, v, out, lse, dq=q)
    grads = np.zeros((2,) + q.shape, np.float32)
    with raises(Status.ERROR_ALIASING):
        flashc.backward(out, q, k, v, out, lse, dq=grads[0], dk=grads[0])


def test_output_overlapping_itself():
    q, k, v = arrays()
    # Every position of this "out" is the same memory: stride 0 along seqlen.
    storage = np.zeros((1, 1, 2, 16), np.float32)
    overlapping = np.lib.stride_tricks.as_strided(storage, shape=q.shape,
                                                  strides=(0, 0, 64, 4), writeable=True)
    with raises(Status.ERROR_INVALID_STRIDE, "out"):
        flashc.forward(q, k, v, out=overlapping)
    assert (storage == 0).all()


def test_read_only_and_non_array_outputs():
    q, k, v = arrays()
    frozen = np.zeros_like(q)
    frozen.flags.writeable = False
    with raises(Status.ERROR_INVALID_PARAM, "out", "read-only"):
        flashc.forward(q, k, v, out=frozen)
    with raises(Status.ERROR_INVALID_PARAM, "out", "numpy array"):
        flashc.forward(q, k, v, out=[0.0])


def test_nothing_written_on_error():
    q, k, v = arrays()
    out = np.full_like(q, 3.0)
    lse = np.full((1, 2, 8), 3.0, np.float32)
    with pytest.raises(flashc.FlashcError):
        flashc.forward(q, k[..., :8], v[..., :8], out=out, lse=lse)
    assert (out == 3.0).all() and (lse == 3.0).all()
