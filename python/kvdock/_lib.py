"""ctypes declarations of libkvdock's C ABI (linker/kvdock.h), and where the
library is found.

ctypes releases the GIL around every foreign call, so another Python thread
runs while a call waits on the daemon or on a layer; a Python callback
(free_indices) takes the GIL back for its own run. One library for every
host: nothing here is compiled at install time.

The library is looked for, in order: $KVDOCK_LIBRARY (a path), the build
tree named by $KVDOCK_BUILD (<build>/linker/libkvdock.so), the library
directory the build installed this package beside (_paths.py, written at
install), then the dynamic loader's own search (libkvdock.so.0).
"""

import ctypes
import os
import threading

KVD_PAGE_KEY_BYTES = 32
KVD_MAX_POOLS = 16
KVD_MAX_POOL_BUFFERS = 8

KVD_ADDR_PAGED = 1
KVD_ADDR_SLOT = 2
KVD_MEM_HOST = 1
KVD_MEM_HIP = 2
KVD_MEM_CUDA = 3

c_u8_p = ctypes.POINTER(ctypes.c_uint8)
c_i64_p = ctypes.POINTER(ctypes.c_int64)
c_u32_p = ctypes.POINTER(ctypes.c_uint32)


class LinkerConfig(ctypes.Structure):
    _fields_ = [
        ("socket_path", ctypes.c_char_p),
        ("connect", ctypes.c_char_p),
        ("client_name", ctypes.c_char_p),
        ("model_id", ctypes.c_char_p),
        ("tp_rank", ctypes.c_int), ("tp_size", ctypes.c_int),
        ("pp_rank", ctypes.c_int), ("pp_size", ctypes.c_int),
        ("cp_rank", ctypes.c_int), ("cp_size", ctypes.c_int),
        ("layer_group_size", ctypes.c_int),
        ("timeout_ms", ctypes.c_int),
        ("spin_us", ctypes.c_int),
        ("lazy_pool_mapping", ctypes.c_bool),
        ("read_only", ctypes.c_bool),
        ("transport", ctypes.c_char_p),
        ("ucx_mode", ctypes.c_char_p),
        ("auth_token_file", ctypes.c_char_p),
    ]


class PoolBuffer(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("row_stride", ctypes.c_uint64),
                ("bytes_per_row", ctypes.c_uint64)]


class PoolLayer(ctypes.Structure):
    _fields_ = [("layer_id", ctypes.c_uint32), ("n_buffers", ctypes.c_uint32),
                ("buffers", PoolBuffer * KVD_MAX_POOL_BUFFERS)]


FREE_INDICES_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, c_i64_p, ctypes.c_size_t)


class PoolDesc(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("addressing", ctypes.c_int),
        ("page_size", ctypes.c_uint32),
        ("n_rows", ctypes.c_uint64),
        ("trailing_pages", ctypes.c_uint32),
        ("rank_replicated", ctypes.c_bool),
        ("memory", ctypes.c_int),
        ("n_layers", ctypes.c_uint32),
        ("layers", ctypes.POINTER(PoolLayer)),
        ("free_indices", FREE_INDICES_FN),
        ("free_ctx", ctypes.c_void_p),
    ]


class Transfer(ctypes.Structure):
    # keys and prior_key are const uint8_t * in C; declared char * here so
    # that a bytes object is stored as a pointer to its own buffer (no copy,
    # no cast per call: lookups of many keys take this path)
    _fields_ = [
        ("pool_id", ctypes.c_uint32),
        ("keys", ctypes.c_char_p),
        ("n_keys", ctypes.c_size_t),
        ("device_indices", c_i64_p),
        ("n_indices", ctypes.c_size_t),
        ("first_depth", ctypes.c_uint32),
        ("depths", c_u32_p),
        ("prior_key", ctypes.c_char_p),
    ]


class CommitPool(ctypes.Structure):
    _fields_ = [("adopted_begin", ctypes.c_uint32), ("adopted_end", ctypes.c_uint32),
                ("mamba_exist", ctypes.c_bool)]


class Completion(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("success", ctypes.c_bool)]


class PoolStats(ctypes.Structure):
    _fields_ = [("lookup_hit_pages", ctypes.c_uint64), ("load_bytes", ctypes.c_uint64),
                ("offload_bytes", ctypes.c_uint64), ("load_failures", ctypes.c_uint64),
                ("offload_failures", ctypes.c_uint64), ("memory", ctypes.c_int),
                ("pinned", ctypes.c_bool), ("dma_bytes", ctypes.c_uint64),
                ("bounce_bytes", ctypes.c_uint64)]


class StoreConfig(ctypes.Structure):
    _fields_ = [
        ("socket_path", ctypes.c_char_p),
        ("connect", ctypes.c_char_p),
        ("client_name", ctypes.c_char_p),
        ("auth_token_file", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int),
    ]


def _candidates():
    env = os.environ.get("KVDOCK_LIBRARY")
    if env:
        yield env
        return
    build = os.environ.get("KVDOCK_BUILD")
    if build:
        yield os.path.join(build, "linker", "libkvdock.so")
        return
    try:
        from . import _paths  # written by the build at install

        yield os.path.join(_paths.LIBDIR, "libkvdock.so.0")
    except ImportError:
        pass
    yield "libkvdock.so.0"
    yield "libkvdock.so"


_lock = threading.Lock()
_lib = None


def _declare(lib):
    I, V, P, S = ctypes.c_int, None, ctypes.c_void_p, ctypes.c_size_t
    sigs = {
        "kvd_linker_open": (I, [ctypes.POINTER(LinkerConfig), ctypes.POINTER(P)]),
        "kvd_linker_close": (V, [P]),
        "kvd_linker_health": (I, [P, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64)]),
        "kvd_register_pool": (I, [P, ctypes.POINTER(PoolDesc), ctypes.POINTER(ctypes.c_uint32)]),
        "kvd_pool_info": (I, [P, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, S]),
        "kvd_page_keys": (I, [c_u32_p, S, S, c_u8_p, c_u8_p, ctypes.POINTER(S)]),
        "kvd_lookup": (I, [P, ctypes.c_uint64, ctypes.POINTER(Transfer), S, c_u32_p, ctypes.POINTER(S)]),
        "kvd_load": (I, [P, ctypes.c_uint64, ctypes.POINTER(Transfer), S]),
        "kvd_load_prepare": (I, [P, ctypes.c_uint64]),
        "kvd_load_commit": (I, [P, ctypes.c_uint64, ctypes.POINTER(CommitPool), S]),
        "kvd_load_abort": (I, [P, ctypes.c_uint64]),
        "kvd_start_layer_wise_loading": (I, [P, c_u32_p]),
        "kvd_wait_layer": (I, [P, ctypes.c_uint32, ctypes.c_uint32]),
        "kvd_stream_wait_layer": (I, [P, ctypes.c_uint32, ctypes.c_uint32, P]),
        "kvd_pop_completed_loads": (I, [P, ctypes.POINTER(Completion), S, ctypes.POINTER(S)]),
        "kvd_offload": (I, [P, ctypes.POINTER(Transfer), S, ctypes.POINTER(ctypes.c_uint64)]),
        "kvd_offload_after": (I, [P, ctypes.POINTER(Transfer), S, P, P, ctypes.POINTER(ctypes.c_uint64)]),
        "kvd_pop_completed_offloads": (I, [P, ctypes.POINTER(Completion), S, ctypes.POINTER(S)]),
        "kvd_stats": (I, [P, ctypes.c_uint32, ctypes.POINTER(PoolStats)]),
        "kvd_strerror": (ctypes.c_char_p, [I]),
        "kvd_last_error": (ctypes.c_char_p, []),
        "kvd_version": (ctypes.c_char_p, []),
        # the store client (operators and tests)
        "kvd_store_open": (I, [ctypes.POINTER(StoreConfig), ctypes.POINTER(P)]),
        "kvd_store_close": (V, [P]),
        "kvd_store_health": (I, [P, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64)]),
        "kvd_store_stats_json": (I, [P, ctypes.POINTER(P)]),
        "kvd_store_prefixes_json": (I, [P, ctypes.c_char_p, S, ctypes.POINTER(P)]),
        "kvd_store_lookup_json": (I, [P, ctypes.POINTER(ctypes.c_char_p), c_u32_p, S, c_u8_p, S,
                                      ctypes.POINTER(P)]),
        "kvd_store_limits": (I, [P, ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32)]),
        "kvd_store_evict": (I, [P, ctypes.c_char_p, c_u8_p, ctypes.c_bool,
                                ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]),
        "kvd_free": (V, [P]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name, None)
        if fn is None:
            continue  # an older library: the Python call that needs it says so
        fn.restype = res
        fn.argtypes = args


def lib():
    """The loaded libkvdock (loaded on first use; OSError naming every
    place looked at when none loads)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            tried = []
            for path in _candidates():
                try:
                    handle = ctypes.CDLL(path)
                except OSError as e:
                    tried.append("%s (%s)" % (path, e))
                    continue
                _declare(handle)
                _lib = handle
                break
            else:
                raise OSError("libkvdock not found; set KVDOCK_LIBRARY to its path. Tried: "
                              + "; ".join(tried))
    return _lib


def has(name):
    return getattr(lib(), name, None) is not None


def last_error():
    """This thread's reason for its last failed call ("" when none)."""
    fn = getattr(lib(), "kvd_last_error", None)
    if fn is None:
        return ""  # a library older than the call
    raw = fn()
    return raw.decode("utf-8", "replace") if raw else ""


def strerror(status):
    return lib().kvd_strerror(int(status)).decode("utf-8", "replace")


def check(rc):
    """Raises the KvdockError subclass of a negative status, with this
    thread's reason; returns rc otherwise. Call it on the thread that made
    the call, before any other libkvdock call."""
    if rc >= 0:
        return rc
    from .errors import error_class

    msg = last_error() or strerror(rc)
    raise error_class(rc)(rc, msg)
