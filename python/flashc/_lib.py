"""ctypes binding of libflashc: finding the shared library, the C structs, the function
prototypes, status codes, the FlashcError exception, and the cache of backend handles.

Everything here mirrors include/flashc.h; the numpy and torch front ends build flashc_tensor
descriptors with make_tensor() and call the library through call().
"""

import ctypes
import enum
import os
import sys
import threading

# -------------------------------------------------------------------------------------------
# Locating the shared library
# -------------------------------------------------------------------------------------------

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

if sys.platform == "darwin":
    _LIBRARY_FILE = "libflashc.dylib"
elif sys.platform == "win32":
    _LIBRARY_FILE = "flashc.dll"
else:
    _LIBRARY_FILE = "libflashc.so"


def _candidate_paths():
    """Where libflashc may be, in the order searched: FLASHC_LIBRARY overrides everything;
    then the copy an installed wheel ships inside the package; then the CMake build folder
    of a source checkout (python/flashc/ sits two levels below the repository root)."""
    override = os.environ.get("FLASHC_LIBRARY")
    if override:
        return [override]
    candidates = [os.path.join(_PACKAGE_DIR, _LIBRARY_FILE)]
    repo_root = os.path.dirname(os.path.dirname(_PACKAGE_DIR))
    if os.path.exists(os.path.join(repo_root, "CMakeLists.txt")):  # a source checkout
        build_dir = os.environ.get("FLASHC_BUILD_DIR", os.path.join(repo_root, "build"))
        candidates.append(os.path.join(build_dir, _LIBRARY_FILE))
    return candidates


def _load_library():
    tried = []
    for path in _candidate_paths():
        if not os.path.exists(path):
            tried.append(path + " (not found)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as exc:
            tried.append("%s (%s)" % (path, exc))
    raise ImportError(
        "flashc: cannot load the flashc shared library; tried:\n  "
        + "\n  ".join(tried)
        + "\nBuild it with `cmake -S . -B build && cmake --build build` in the repository, "
        "install the package with `pip install ./python`, or point FLASHC_LIBRARY at it."
    )


lib, library_path = _load_library()

# -------------------------------------------------------------------------------------------
# Enumerations
# -------------------------------------------------------------------------------------------


class Status(enum.IntEnum):
    """flashc_status."""

    OK = 0
    ERROR_NULL_POINTER = 1
    ERROR_INVALID_DTYPE = 2
    ERROR_DTYPE_MISMATCH = 3
    ERROR_SHAPE_MISMATCH = 4
    ERROR_INVALID_HEAD_DIM = 5
    ERROR_INVALID_HEADS = 6
    ERROR_INVALID_STRIDE = 7
    ERROR_INVALID_SIZE = 8
    ERROR_ALIASING = 9
    ERROR_INVALID_PARAM = 10
    ERROR_UNSUPPORTED = 11
    ERROR_BACKEND_UNAVAILABLE = 12
    ERROR_OUT_OF_MEMORY = 13
    ERROR_DEVICE = 14
    ERROR_INVALID_POINTER = 15
    ERROR_WORKSPACE_TOO_SMALL = 16
    ERROR_INTERNAL = 17


class DType(enum.IntEnum):
    """flashc_dtype."""

    F32 = 1
    F16 = 2
    BF16 = 3


class Causal(enum.IntEnum):
    """flashc_causal."""

    NONE = 0
    BOTTOM_RIGHT = 1
    TOP_LEFT = 2


# -------------------------------------------------------------------------------------------
# Structs (field for field as in flashc.h)
# -------------------------------------------------------------------------------------------


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
    ]


class Params(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("alibi_slopes", ctypes.c_void_p),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("max_seqlen_q", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int32),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("deterministic", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_size", ctypes.c_size_t),
        ("num_seqs", ctypes.c_int32),
        ("alibi_slopes_batch_stride", ctypes.c_int64),
    ]


class KvcacheParams(ctypes.Structure):
    """flashc_kvcache_params."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("cache_seqlens", ctypes.c_void_p),
        ("block_table", ctypes.c_void_p),
        ("max_pages_per_seq", ctypes.c_int32),
        ("block_table_stride", ctypes.c_int64),
        ("num_splits", ctypes.c_int32),
    ]


class BackendConfig(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("num_threads", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("cpu_isa", ctypes.c_char_p),
    ]


# -------------------------------------------------------------------------------------------
# Prototypes
# -------------------------------------------------------------------------------------------

_TensorP = ctypes.POINTER(Tensor)
_ParamsP = ctypes.POINTER(Params)
_BackendP = ctypes.c_void_p  # opaque flashc_backend *


def _prototype(name, restype, *argtypes):
    function = getattr(lib, name)
    function.restype = restype
    function.argtypes = list(argtypes)
    return function


flashc_status_string = _prototype("flashc_status_string", ctypes.c_char_p, ctypes.c_int)
flashc_last_error = _prototype("flashc_last_error", ctypes.c_char_p)
flashc_version = _prototype("flashc_version", ctypes.c_char_p)
flashc_dtype_size = _prototype("flashc_dtype_size", ctypes.c_size_t, ctypes.c_int)
_params_init_sized = _prototype("flashc_params_init_sized", None, _ParamsP, ctypes.c_size_t)
_backend_config_init_sized = _prototype(
    "flashc_backend_config_init_sized", None, ctypes.POINTER(BackendConfig), ctypes.c_size_t
)


def flashc_params_init(pointer):
    """The C macro flashc_params_init: the defaults, for this binding's struct size."""
    _params_init_sized(pointer, ctypes.sizeof(Params))


def flashc_backend_config_init(pointer):
    """The C macro flashc_backend_config_init, for this binding's struct size."""
    _backend_config_init_sized(pointer, ctypes.sizeof(BackendConfig))
flashc_backend_create = _prototype(
    "flashc_backend_create",
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.POINTER(BackendConfig),
    ctypes.POINTER(_BackendP),
)
flashc_backend_destroy = _prototype("flashc_backend_destroy", None, _BackendP)
flashc_backend_name = _prototype("flashc_backend_name", ctypes.c_char_p, _BackendP)
flashc_backend_uses_device_memory = _prototype(
    "flashc_backend_uses_device_memory", ctypes.c_int, _BackendP
)
flashc_backend_available = _prototype("flashc_backend_available", ctypes.c_int, ctypes.c_char_p)
flashc_backend_describe = _prototype("flashc_backend_describe", ctypes.c_char_p, _BackendP)
flashc_forward = _prototype(
    "flashc_forward", ctypes.c_int, _BackendP, _ParamsP, _TensorP, _TensorP, _TensorP, _TensorP,
    _TensorP,
)
flashc_backward = _prototype(
    "flashc_backward", ctypes.c_int, _BackendP, _ParamsP, _TensorP, _TensorP, _TensorP, _TensorP,
    _TensorP, _TensorP, _TensorP, _TensorP, _TensorP,
)
flashc_backward_workspace_size = _prototype(
    "flashc_backward_workspace_size", ctypes.c_int, _BackendP, _ParamsP, _TensorP, _TensorP,
    ctypes.POINTER(ctypes.c_size_t),
)

_kvcache_params_init_sized = _prototype(
    "flashc_kvcache_params_init_sized", None, ctypes.POINTER(KvcacheParams), ctypes.c_size_t
)
flashc_forward_kvcache = _prototype(
    "flashc_forward_kvcache", ctypes.c_int, _BackendP, _ParamsP, ctypes.POINTER(KvcacheParams),
    _TensorP, _TensorP, _TensorP, _TensorP, _TensorP, _TensorP, _TensorP,
)
flashc_kvcache_workspace_size = _prototype(
    "flashc_kvcache_workspace_size", ctypes.c_int, _BackendP, _ParamsP,
    ctypes.POINTER(KvcacheParams), _TensorP, _TensorP, _TensorP, _TensorP, _TensorP, _TensorP,
    _TensorP, ctypes.POINTER(ctypes.c_size_t),
)

# -------------------------------------------------------------------------------------------
# Errors
# -------------------------------------------------------------------------------------------


def _decode(raw):
    return raw.decode("utf-8", "replace") if raw else ""


class FlashcError(RuntimeError):
    """An error reported by flashc.

    status: a Status (the library's flashc_status);
    message: the detail, naming the argument ("k: shape[3] (head_dim) is 80 but q has 64").
    str() gives the status name followed by the message.
    """

    def __init__(self, status, message):
        self.status = Status(status)
        self.message = message
        name = _decode(flashc_status_string(int(status))) or self.status.name
        super().__init__("%s: %s" % (name, message) if message else name)


def check(status):
    """Raises FlashcError for a non-zero flashc_status. The message is read right after the
    failing call, on the same thread, as flashc_last_error() is per thread."""
    if status != Status.OK:
        raise FlashcError(status, _decode(flashc_last_error()))


def version():
    return _decode(flashc_version())


def backends():
    """The backends usable on this machine, among "cpu", "cuda" and "reference"."""
    return [name for name in ("cpu", "cuda", "reference") if flashc_backend_available(name.encode())]


# -------------------------------------------------------------------------------------------
# Backend handles
# -------------------------------------------------------------------------------------------


class Backend:
    """An open flashc_backend handle. Handles are made once per (name, threads, device) by
    get_backend() and kept for the life of the process: a CPU handle owns a thread pool, a
    CUDA one its device state, and both are costly to make per call."""

    def __init__(self, name, num_threads=0, device=-1):
        config = BackendConfig()
        flashc_backend_config_init(ctypes.byref(config))
        config.num_threads = int(num_threads)
        config.device = int(device)
        handle = _BackendP()
        check(flashc_backend_create(name.encode(), ctypes.byref(config), ctypes.byref(handle)))
        self.handle = handle
        self.name = _decode(flashc_backend_name(handle))
        self.uses_device_memory = bool(flashc_backend_uses_device_memory(handle))

    def describe(self):
        return _decode(flashc_backend_describe(self.handle))

    def __repr__(self):
        return "<flashc.Backend %s>" % self.describe()


_backend_cache = {}
_backend_cache_lock = threading.Lock()


def get_backend(name=None, num_threads=None, device=-1):
    """The cached handle for backend `name` ("auto" or None, "cpu", "cuda", "reference").
    num_threads None or 0: the library's default (FLASHC_NUM_THREADS or all cores)."""
    key = (name or "auto", int(num_threads or 0), int(device))
    backend = _backend_cache.get(key)
    if backend is None:
        with _backend_cache_lock:
            backend = _backend_cache.get(key)
            if backend is None:
                backend = Backend(*key)
                _backend_cache[key] = backend
    return backend


# -------------------------------------------------------------------------------------------
# Call helpers
# -------------------------------------------------------------------------------------------


def make_tensor(data_pointer, dtype, shape, strides):
    """A flashc_tensor over memory at data_pointer; strides in elements."""
    tensor = Tensor()
    tensor.data = data_pointer
    tensor.dtype = int(dtype)
    tensor.ndim = len(shape)
    for i, (size, stride) in enumerate(zip(shape, strides)):
        tensor.shape[i] = int(size)
        tensor.stride[i] = int(stride)
    return tensor


def make_params(softmax_scale=None, causal_mode=Causal.NONE, window_left=-1, window_right=-1,
                softcap=0.0, deterministic=False, stream=None, workspace=None, workspace_size=0,
                alibi_slopes=None, alibi_slopes_batch_stride=0, dropout_p=0.0, dropout_seed=0,
                dropout_offset=0, cu_seqlens_q=None, cu_seqlens_k=None, num_seqs=0,
                max_seqlen_q=0, max_seqlen_k=0):
    """A flashc_params. The pointer arguments (alibi_slopes: float32, cu_seqlens_q/k: int32)
    are addresses; the caller keeps the memory alive through the call."""
    params = Params()
    flashc_params_init(ctypes.byref(params))
    if softmax_scale is not None:
        # The C API reads 0 as "1/sqrt(head_dim)", so an explicit 0 would silently change
        # meaning: refuse it rather than compute something else than was asked.
        if float(softmax_scale) == 0.0:
            raise FlashcError(
                Status.ERROR_INVALID_PARAM,
                "softmax_scale: 0 is not supported (pass None for 1/sqrt(head_dim))",
            )
        params.softmax_scale = float(softmax_scale)
    params.causal = _int32("causal_mode", causal_mode)
    params.window_left = _int32("window_left", window_left)
    params.window_right = _int32("window_right", window_right)
    params.softcap = float(softcap)
    params.deterministic = 1 if deterministic else 0
    params.stream = stream
    params.workspace = workspace
    params.workspace_size = _in_range("workspace_size", workspace_size, 0, 2**64 - 1)
    params.alibi_slopes = alibi_slopes
    params.alibi_slopes_batch_stride = _in_range(
        "alibi_slopes_batch_stride", alibi_slopes_batch_stride, -2**63, 2**63 - 1)
    params.dropout_p = float(dropout_p)
    # the seed and offset are unsigned 64-bit in C; Python ints of either sign wrap
    params.dropout_seed = int(dropout_seed) & 0xFFFFFFFFFFFFFFFF
    params.dropout_offset = int(dropout_offset) & 0xFFFFFFFFFFFFFFFF
    params.cu_seqlens_q = cu_seqlens_q
    params.cu_seqlens_k = cu_seqlens_k
    params.num_seqs = _int32("num_seqs", num_seqs)
    params.max_seqlen_q = _int32("max_seqlen_q", max_seqlen_q or 0)
    params.max_seqlen_k = _int32("max_seqlen_k", max_seqlen_k or 0)
    return params


def _in_range(name, value, lo, hi):
    """int(value), refused when outside [lo, hi]: ctypes would silently wrap it into the C
    field, turning e.g. a window of 2**32 into a window of 0."""
    v = int(value)
    if not lo <= v <= hi:
        raise FlashcError(Status.ERROR_INVALID_PARAM,
                          "%s: %d does not fit the C field (%d..%d)" % (name, v, lo, hi))
    return v


def _int32(name, value):
    return _in_range(name, value, -2**31, 2**31 - 1)


def causal_mode_of(causal, causal_mode):
    """The flashc_causal for the Python arguments causal (bool) and causal_mode
    ("bottom_right", "top_left", or a Causal value)."""
    if not causal:
        return Causal.NONE
    if isinstance(causal_mode, str):
        try:
            return {"bottom_right": Causal.BOTTOM_RIGHT, "top_left": Causal.TOP_LEFT}[causal_mode]
        except KeyError:
            raise FlashcError(
                Status.ERROR_INVALID_PARAM,
                "causal_mode: %r is not 'bottom_right' or 'top_left'" % (causal_mode,),
            ) from None
    # An integer is passed through as is, so that the library judges (and names) a mode it
    # does not know.
    return int(causal_mode)


def forward(backend, params, q, k, v, out, lse):
    ref = ctypes.byref
    check(flashc_forward(backend.handle, ref(params), ref(q), ref(k), ref(v), ref(out), ref(lse)))


def backward(backend, params, dout, q, k, v, out, lse, dq, dk, dv):
    ref = ctypes.byref
    check(flashc_backward(backend.handle, ref(params), ref(dout), ref(q), ref(k), ref(v),
                          ref(out), ref(lse), ref(dq), ref(dk), ref(dv)))


def backward_workspace_size(backend, params, q, k):
    size = ctypes.c_size_t(0)
    check(flashc_backward_workspace_size(backend.handle, ctypes.byref(params), ctypes.byref(q),
                                         ctypes.byref(k), ctypes.byref(size)))
    return size.value


def make_kvcache_params(cache_seqlens, block_table=None, max_pages_per_seq=0,
                        block_table_stride=0, num_splits=0):
    """A flashc_kvcache_params; cache_seqlens and block_table are addresses of int32 arrays
    that the caller keeps alive through the call."""
    kv = KvcacheParams()
    _kvcache_params_init_sized(ctypes.byref(kv), ctypes.sizeof(KvcacheParams))
    kv.cache_seqlens = cache_seqlens
    kv.block_table = block_table
    kv.max_pages_per_seq = int(max_pages_per_seq)
    kv.block_table_stride = int(block_table_stride)
    kv.num_splits = int(num_splits)
    return kv


def _kvcache_args(backend, params, kv, q, k_cache, v_cache, k_new, v_new, out, lse):
    ref = ctypes.byref
    return (backend.handle, ref(params), ref(kv), ref(q), ref(k_cache), ref(v_cache),
            ref(k_new) if k_new is not None else None,
            ref(v_new) if v_new is not None else None, ref(out), ref(lse))


def forward_kvcache(backend, params, kv, q, k_cache, v_cache, k_new, v_new, out, lse):
    """flashc_forward_kvcache; k_new and v_new may be None (no append)."""
    check(flashc_forward_kvcache(*_kvcache_args(backend, params, kv, q, k_cache, v_cache, k_new,
                                                v_new, out, lse)))


def kvcache_workspace_size(backend, params, kv, q, k_cache, v_cache, k_new, v_new, out, lse):
    """flashc_kvcache_workspace_size: bytes of params.workspace the same call would use."""
    size = ctypes.c_size_t(0)
    check(flashc_kvcache_workspace_size(*_kvcache_args(backend, params, kv, q, k_cache, v_cache,
                                                       k_new, v_new, out, lse),
                                        ctypes.byref(size)))
    return size.value
