"""What the binding accepts as memory, indices and keys, turned into what
the C ABI takes (pointers, strides, contiguous arrays).

A pool buffer is an array whose first dimension is the row (a token slot
or a state slot) and whose rows are each contiguous: torch tensors (any
view, e.g. one layer of a layer-interleaved host pool), numpy arrays,
objects with ``__cuda_array_interface__`` or ``__array_interface__``, or a
RawBuffer. Index lists are torch tensors, numpy arrays or sequences of
ints; keys are 32-byte ``bytes``, one ``bytes`` of n * 32, or an (n, 32)
uint8 array or tensor.
"""

import ctypes

import numpy as np

from . import _lib
from .errors import InvalidError, UnsupportedError

KEY_BYTES = _lib.KVD_PAGE_KEY_BYTES


class RawBuffer:
    """Memory given as integers: ``ptr`` the address of row 0, ``n_rows``
    rows of ``bytes_per_row`` bytes, ``row_stride`` apart (default:
    bytes_per_row). ``memory`` is "host", "cuda" or "hip". ``owner`` (any
    object) is kept alive as long as the buffer is registered."""

    __slots__ = ("ptr", "n_rows", "row_stride", "bytes_per_row", "memory", "owner")

    def __init__(self, ptr, n_rows, bytes_per_row, row_stride=None, memory="host", owner=None):
        self.ptr = int(ptr)
        self.n_rows = int(n_rows)
        self.bytes_per_row = int(bytes_per_row)
        self.row_stride = int(row_stride) if row_stride is not None else self.bytes_per_row
        self.memory = memory
        self.owner = owner

    def __repr__(self):
        return "RawBuffer(ptr=0x%x, n_rows=%d, bytes_per_row=%d, row_stride=%d, memory=%r)" % (
            self.ptr, self.n_rows, self.bytes_per_row, self.row_stride, self.memory)


class BufferInfo:
    """One pool buffer as the C ABI needs it, and what keeps it alive."""

    __slots__ = ("ptr", "n_rows", "row_stride", "bytes_per_row", "memory", "keep")

    def __init__(self, ptr, n_rows, row_stride, bytes_per_row, memory, keep):
        self.ptr, self.n_rows, self.row_stride = ptr, n_rows, row_stride
        self.bytes_per_row, self.memory, self.keep = bytes_per_row, memory, keep


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _from_interface(obj, iface, memory):
    shape = tuple(iface["shape"])
    if len(shape) == 0:
        raise InvalidError(message="a pool buffer needs a row dimension (shape %r)" % (shape,))
    ptr = iface["data"][0] if isinstance(iface["data"], tuple) else iface["data"]
    if iface.get("data") is None or ptr is None:
        raise InvalidError(message="the buffer's array interface has no data pointer")
    if isinstance(iface["data"], tuple) and iface["data"][1]:
        raise InvalidError(message="a pool buffer must be writable (the array is read-only)")
    itemsize = np.dtype(iface["typestr"]).itemsize
    strides = iface.get("strides")
    if strides is None:  # C-contiguous
        strides = []
        acc = itemsize
        for dim in reversed(shape):
            strides.append(acc)
            acc *= dim
        strides = tuple(reversed(strides))
    _check_row_contiguous(shape, strides, itemsize)
    row_elems = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return BufferInfo(int(ptr), shape[0], strides[0], row_elems * itemsize, memory, obj)


def _check_row_contiguous(shape, strides, itemsize):
    expect = itemsize
    for dim, st in zip(reversed(shape[1:]), reversed(strides[1:])):
        if dim != 1 and st != expect:
            raise InvalidError(message="each row of a pool buffer must be contiguous (shape %r, "
                               "strides %r bytes)" % (tuple(shape), tuple(strides)))
        expect *= dim


def buffer_info(obj):
    """The BufferInfo of one accepted buffer object; InvalidError for
    anything else, no rows, a row that is not contiguous, or rows that
    overlap or run backwards (a stride below the row's size: the library
    takes strides as unsigned)."""
    info = _buffer_info(obj)
    if info.n_rows <= 0 or info.bytes_per_row <= 0:
        raise InvalidError(message="a pool buffer needs rows of at least one byte (%d rows of "
                           "%d bytes)" % (info.n_rows, info.bytes_per_row))
    if info.n_rows == 1:
        info.row_stride = max(info.row_stride, info.bytes_per_row)  # one row: no stride
    if info.row_stride < info.bytes_per_row:
        raise InvalidError(message="rows %d bytes apart cannot hold %d bytes each (a negative, "
                           "zero or overlapping row stride)" % (info.row_stride,
                                                                info.bytes_per_row))
    return info


def _buffer_info(obj):
    if isinstance(obj, RawBuffer):
        if obj.ptr == 0 or obj.n_rows <= 0 or obj.bytes_per_row <= 0:
            raise InvalidError(message="%r: a NULL pointer, no rows or empty rows" % (obj,))
        return BufferInfo(obj.ptr, obj.n_rows, obj.row_stride, obj.bytes_per_row, obj.memory,
                          obj.owner)
    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.dim() == 0:
            raise InvalidError(message="a pool buffer needs a row dimension (a 0-d tensor)")
        if obj.device.type == "cpu":
            memory = "host"
        elif obj.device.type == "cuda":
            memory = "hip" if getattr(torch.version, "hip", None) else "cuda"
        else:
            raise UnsupportedError(message="tensors on %s are not supported" % obj.device)
        itemsize = obj.element_size()
        strides = tuple(s * itemsize for s in obj.stride())
        _check_row_contiguous(tuple(obj.shape), strides, itemsize)
        row_elems = 1
        for d in obj.shape[1:]:
            row_elems *= d
        return BufferInfo(obj.data_ptr(), obj.shape[0], strides[0], row_elems * itemsize,
                          memory, obj)
    if isinstance(obj, np.ndarray):
        if obj.ndim == 0:
            raise InvalidError(message="a pool buffer needs a row dimension (a 0-d array)")
        if not obj.flags.writeable:
            raise InvalidError(message="a pool buffer must be writable (the array is read-only)")
        _check_row_contiguous(obj.shape, obj.strides, obj.itemsize)
        return BufferInfo(obj.ctypes.data, obj.shape[0], obj.strides[0],
                          int(np.prod(obj.shape[1:])) * obj.itemsize, "host", obj)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_interface(obj, cai, "cuda")
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        return _from_interface(obj, ai, "host")
    raise InvalidError(message="not a pool buffer: %s (a torch tensor, numpy array, an object "
                       "with __cuda_array_interface__ or __array_interface__, or a "
                       "kvdock.RawBuffer)" % type(obj).__name__)


def int64_array(values, what="indices"):
    """values as a C-contiguous int64 numpy array (a tensor on the device is
    copied to the host)."""
    if values is None:
        return None
    torch = _torch()
    if torch is not None and isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.int64).contiguous().numpy()
    arr = np.ascontiguousarray(values, dtype=np.int64)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    return arr


def uint32_array(values):
    torch = _torch()
    if torch is not None and isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.int64).contiguous().numpy()
    arr = np.asarray(values)
    if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
        raise InvalidError(message="values outside uint32")
    return np.ascontiguousarray(arr, dtype=np.uint32).reshape(-1)


def key_block(keys):
    """keys as one bytes object of n * 32 bytes, and n."""
    if isinstance(keys, (list, tuple)):  # the common case first: no per-key Python loop
        return _key_list(keys)
    if isinstance(keys, (bytes, bytearray, memoryview)):
        blob = bytes(keys)
        if len(blob) % KEY_BYTES:
            raise InvalidError(message="a key block of %d bytes is not a multiple of %d"
                               % (len(blob), KEY_BYTES))
        return blob, len(blob) // KEY_BYTES
    torch = _torch()
    if torch is not None and isinstance(keys, torch.Tensor):
        keys = keys.detach().cpu().numpy()
    if isinstance(keys, np.ndarray):
        if keys.dtype != np.uint8 or keys.ndim != 2 or keys.shape[1] != KEY_BYTES:
            raise InvalidError(message="a key array must be uint8 of shape (n, %d), not %s %r"
                               % (KEY_BYTES, keys.dtype, keys.shape))
        return np.ascontiguousarray(keys).tobytes(), keys.shape[0]
    return _key_list(list(keys))


def _key_list(keys):
    """A list of 32-byte keys joined (bytes, bytearray or any object of 32
    bytes that bytes.join takes). Checked as a whole: the block must hold
    32 bytes per key, which refuses a key of any other length unless
    another key's length makes up for it exactly. Checking each key's
    length took 5-10 us of a 256-key lookup's ~50 (bench_binding.py); the
    C side reads exactly 32 bytes per key from the block either way."""
    n = len(keys)
    try:
        blob = b"".join(keys)
    except TypeError:
        blob = None
    if blob is None or len(blob) != n * KEY_BYTES:
        bad = next((k for k in keys if not isinstance(k, (bytes, bytearray))
                    or len(k) != KEY_BYTES), keys)
        raise InvalidError(message="a page key is %d bytes, not %r" % (KEY_BYTES, bad))
    return blob, n


def ptr_of(arr, ctype):
    """A ctypes pointer to a numpy array's data (None for None/empty)."""
    if arr is None or arr.size == 0:
        return None
    return arr.ctypes.data_as(ctypes.POINTER(ctype))
