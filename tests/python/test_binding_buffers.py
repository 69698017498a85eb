"""What the binding takes as memory, indices and keys: buffers of every
accepted kind in one pool (restored byte for byte), what it refuses
(rows that are not contiguous, read-only memory, 0-d arrays, device
memory it has no backend for), index lists of every kind, and lifetime: a
buffer the engine dropped stays alive while registered, and goes after
close.
"""

import ctypes
import gc
import os
import time
import weakref

import numpy as np
import pytest
import torch

import kvdock
from binding_util import (ArrayInterface, Mem, PagedPool, SlotPool, load_all, offload_and_wait,
                          pop_until, row_bytes, sha_chain, tokens_of)
from conftest import Daemon


def raises(cls, fn):
    with pytest.raises(kvdock.KvdockError) as ei:
        fn()
    assert type(ei.value) is cls, "%s: %s" % (type(ei.value).__name__, ei.value)
    assert ei.value.status == cls.status
    return ei.value


def test_one_pool_of_buffers_of_every_kind(daemon, linker_factory):
    # layer 0: numpy K, torch V; layer 2: a raw buffer and a view of a
    # layer-interleaved tensor; layer 4: an __array_interface__ object
    lk = linker_factory(daemon, model_id="m")
    n_rows, bpr, ps = 32, 64, 4
    mems = {(0, 0): Mem("numpy", n_rows, bpr), (0, 1): Mem("torch", n_rows, bpr),
            (2, 0): Mem("raw", n_rows, bpr), (2, 1): Mem("torch_view", n_rows, bpr),
            (4, 0): Mem("array_interface_view", n_rows, bpr), (4, 1): Mem("numpy_view", n_rows,
                                                                           bpr)}
    pool = lk.register_pool("kv", {l: [mems[(l, 0)].reg, mems[(l, 1)].reg] for l in (0, 2, 4)},
                            page_size=ps)
    assert pool.object_bytes == ps * 6 * bpr and pool.n_rows == n_rows
    keys = sha_chain(tokens_of(80, 12), ps)
    tag = lambda l, b, r: "mixed/%d/%d/%d" % (l, b, r)  # noqa: E731
    for i, k in enumerate(keys):
        for (l, b), m in mems.items():
            for r in range(ps):
                m.rows[i * ps + r] = row_bytes(k, tag(l, b, r), bpr)
    assert offload_and_wait(lk, kvdock.Transfer(pool, keys, indices=range(12)))
    for m in mems.values():
        m.wipe()
    assert load_all(lk, 1, kvdock.Transfer(pool, keys, indices=range(16, 28)), [(0, 3)],
                    [0, 2, 4])
    for i, k in enumerate(keys):
        for (l, b), m in mems.items():
            for r in range(ps):
                assert np.array_equal(m.rows[16 + i * ps + r], row_bytes(k, tag(l, b, r), bpr)), (
                    m.kind, i, r)
            assert not m.rows[:16].any() and not m.rows[28:].any(), m.kind


def test_a_float_state_buffer_of_several_dims(daemon, linker_factory):
    # mamba-like state [slots, heads, k, v] fp32: each slot's 4 KiB row whole
    lk = linker_factory(daemon, model_id="m")
    temporal = torch.zeros(4, 4, 16, 16)
    conv = np.zeros((4, 32, 4), np.float16)
    pool = lk.register_pool("mamba", {1: [temporal, conv]}, addressing=kvdock.SLOT,
                            trailing_pages=1)
    assert pool.object_bytes == 4 * 16 * 16 * 4 + 32 * 4 * 2
    key = sha_chain(tokens_of(81, 4), 4)[0]
    temporal[1] = torch.from_numpy(row_bytes(key, "t", 4096).view(np.float32).reshape(4, 16, 16)
                                   .copy())
    conv[1] = row_bytes(key, "c", 256).view(np.float16).reshape(32, 4)
    assert offload_and_wait(lk, kvdock.Transfer(pool, [key], indices=[1]))
    temporal.zero_()
    conv[...] = 0
    assert load_all(lk, 2, kvdock.Transfer(pool, [key], indices=[3]), [(0, 0, False)], [1])
    assert temporal[3].numpy().tobytes() == row_bytes(key, "t", 4096).tobytes()
    assert conv[3].tobytes() == row_bytes(key, "c", 256).tobytes()
    assert not temporal[:3].any() and not conv[:3].any()


# ----------------------------------------------------------- refusals

class CudaArray:
    """Device memory as another library hands it over."""

    def __init__(self):
        self.__cuda_array_interface__ = {"shape": (16, 64), "typestr": "|u1",
                                         "data": (0x7F0000000000, False), "version": 3,
                                         "strides": None}


REFUSED = {
    "numpy: rows not contiguous": lambda: np.zeros((16, 8, 4), np.float16)[:, :, ::2],
    "numpy: dims swapped": lambda: np.zeros((16, 8, 4), np.float16).transpose(0, 2, 1),
    "numpy: column-major": lambda: np.asfortranarray(np.zeros((16, 8), np.float16)),
    "numpy: read-only": lambda: _read_only(np.zeros((16, 8), np.uint8)),
    "numpy: 0-d": lambda: np.array(3.0),
    "torch: rows not contiguous": lambda: torch.zeros(16, 8, 4)[:, :, ::2],
    "torch: dims swapped": lambda: torch.zeros(16, 8, 4).transpose(1, 2),
    "torch: 0-d": lambda: torch.tensor(1.0),
    "interface: rows not contiguous": lambda: ArrayInterface(np.zeros((16, 8), np.uint8)[:, ::2]),
    "interface: read-only": lambda: ArrayInterface(_read_only(np.zeros((16, 8), np.uint8))),
    "interface: 0-d": lambda: ArrayInterface(np.array(7, np.uint8)),
    "raw: NULL": lambda: kvdock.RawBuffer(0, 16, 64),
    "raw: no rows": lambda: kvdock.RawBuffer(0x1000, 0, 64),
    "a list": lambda: [[0] * 8] * 16,
    "bytes": lambda: bytes(128),
}


def _read_only(a):
    a.setflags(write=False)
    return a


@pytest.fixture(scope="module")
def one_linker():
    """One daemon and linker for the refusals (none reaches the daemon)."""
    d = Daemon(pool_size="64M")
    try:
        with kvdock.Linker(socket_path=d.socket, model_id="m", timeout_ms=10000) as lk:
            yield lk
    finally:
        d.cleanup()


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_a_buffer_the_binding_cannot_use_is_refused(one_linker, what):
    lk = one_linker
    e = raises(kvdock.InvalidError, lambda: lk.register_pool("kv", {0: [REFUSED[what]()]}))
    assert e.message
    assert lk.pools == []


def _cuda_runtime_here():
    try:
        ctypes.CDLL(os.environ.get("KVDOCK_CUDA_LIBRARY") or "libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_cuda_runtime_here(), reason="a CUDA driver is here: the pool would load it")
def test_device_memory_without_its_runtime_is_no_device(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    e = raises(kvdock.NoDeviceError, lambda: lk.register_pool("kv", {0: [CudaArray()]}))
    assert "libcuda" in e.message
    e = raises(kvdock.NoDeviceError, lambda: lk.register_pool(
        "kv", {0: [kvdock.RawBuffer(0x7F0000000000, 16, 64, memory="cuda")]}))
    assert "libcuda" in e.message
    assert lk.pools == []


def test_memory_no_backend_knows_is_unsupported(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    meta = torch.empty(16, 64, device="meta")
    e = raises(kvdock.UnsupportedError, lambda: lk.register_pool("kv", {0: [meta]}))
    assert "meta" in e.message
    assert lk.pools == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_a_cuda_tensor_round_trips_on_the_device(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    k = torch.zeros(64, 256, dtype=torch.uint8, device="cuda")
    pool = lk.register_pool("kv", {0: [k]}, page_size=4)
    keys = kvdock.page_keys(list(range(16)), 4)
    want = torch.randint(0, 256, (16, 256), dtype=torch.uint8, device="cuda")
    k[8:24] = want
    ev = torch.cuda.Event()
    ev.record()
    ack = lk.offload([kvdock.Transfer(pool, keys, indices=list(range(8, 24)))], event=ev)
    for _ in range(1000):
        done = lk.pop_completed_offloads()
        if done:
            break
        time.sleep(0.01)
    assert done == [(ack, True)]
    k.zero_()
    torch.cuda.synchronize()
    t = kvdock.Transfer(pool, keys, indices=list(range(32, 48)))
    lk.load(5, [t])
    lk.prepare(5)
    lk.commit(5, [kvdock.Commit(0, 4)])
    c = lk.start_layer_wise_loading()
    s = torch.cuda.current_stream()
    lk.wait_layer_on_stream(c, 0, s)
    got = k[32:48].clone()  # on s, after the wait
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    st = lk.pool_stats(pool)
    assert st["memory"] in ("cuda", "hip") and st["dma_bytes"] + st["bounce_bytes"] > 0


def test_one_pool_mixing_host_and_device_memory_is_refused(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    with pytest.raises(kvdock.KvdockError) as ei:
        lk.register_pool("kv", {0: [np.zeros((16, 64), np.uint8), CudaArray()]})
    assert type(ei.value) in (kvdock.InvalidError, kvdock.UnsupportedError)
    assert lk.pools == []


# ------------------------------------------------------- index lists

INDEX_KINDS = {
    "list": lambda r: list(r),
    "tuple": lambda r: tuple(r),
    "range": lambda r: r,
    "numpy int64": lambda r: np.array(list(r), np.int64),
    "numpy int32": lambda r: np.array(list(r), np.int32),
    "numpy 2-d (pages x tokens)": lambda r: np.array(list(r), np.int64).reshape(
        -1, 4 if len(r) % 4 == 0 else 1),
    "numpy strided": lambda r: np.array([x for x in r for _ in (0, 1)], np.int64)[::2],
    "torch int64": lambda r: torch.tensor(list(r), dtype=torch.int64),
    "torch int32": lambda r: torch.tensor(list(r), dtype=torch.int32),
    "torch strided view": lambda r: torch.tensor([x for x in r for _ in (0, 1)])[::2],
}


@pytest.mark.parametrize("kind", sorted(INDEX_KINDS))
def test_indices_of_every_kind(daemon, linker_factory, kind):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=1, n_buf=1, n_rows=64, bpr=16, ps=4)
    st = SlotPool(lk, n_slots=8, layer_ids=[1])
    keys = sha_chain(tokens_of(82, 12), 4)
    make = INDEX_KINDS[kind]
    kv.fill_pages(keys, 4)
    st.fill_slot(keys[2], 5)
    assert offload_and_wait(lk, [kvdock.Transfer(kv.pool, keys, indices=make(range(4, 16))),
                                 kvdock.Transfer(st.pool, keys[2:], indices=make(range(5, 6)),
                                                 depths=make(range(2, 3)))])
    kv.wipe()
    st.wipe()
    assert load_all(lk, 3, [kvdock.Transfer(kv.pool, keys, indices=make(range(40, 52))),
                            kvdock.Transfer(st.pool, keys[2:], indices=make(range(7, 8)))],
                    [(0, 3), (0, 0)], [0, 1])
    kv.check_pages(keys, lambda i: 40 + 4 * i)
    st.check_slot(keys[2], 7)


def test_indices_are_copied_as_the_call_is_made(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=1, n_buf=1, n_rows=64, bpr=16, ps=4)
    keys = sha_chain(tokens_of(83, 8), 4)
    kv.fill_pages(keys, 0)
    idx = np.arange(0, 8, dtype=np.int64)
    ack = lk.offload(kvdock.Transfer(kv.pool, keys, indices=idx))
    idx[:] = 63  # the engine reuses its array at once
    assert pop_until(lk.pop_completed_offloads, [ack]) == {ack: True}
    kv.wipe()
    dst = np.arange(16, 24, dtype=np.int64)
    lk.load(4, kvdock.Transfer(kv.pool, keys, indices=dst))
    dst[:] = 0  # after LOAD: the copy goes where LOAD was told
    lk.commit(4, [(0, 2)])
    counter = lk.start_layer_wise_loading()
    lk.wait_layer(counter, 0)
    assert pop_until(lk.pop_completed_loads, [4]) == {4: True}
    kv.check_pages(keys, lambda i: 16 + 4 * i)


# ------------------------------------------------------------ lifetime

def _roundtrip_into(lk, pool, keys, rows_view_of, tag, bpr, dst_first):
    """Loads keys (stored already) into rows dst_first.. of pool, checks
    through rows_view_of() (the memory read back after the engine dropped
    its reference)."""
    assert load_all(lk, 9, kvdock.Transfer(pool, keys, indices=range(dst_first, dst_first + 4 *
                                                                        len(keys))),
                    [(0, len(keys))], [0])
    rows = rows_view_of()
    for i, k in enumerate(keys):
        for r in range(4):
            assert np.array_equal(rows[dst_first + 4 * i + r], row_bytes(k, tag(r), bpr))


def _store(lk, keys, bpr, tag, model_pool="kv"):
    src = np.zeros((32, bpr), np.uint8)
    pool = lk.register_pool(model_pool, {0: [src]}, page_size=4)
    for i, k in enumerate(keys):
        for r in range(4):
            src[4 * i + r] = row_bytes(k, tag(r), bpr)
    assert offload_and_wait(lk, kvdock.Transfer(pool, keys, indices=range(4 * len(keys))))


@pytest.mark.parametrize("kind", ["torch", "numpy", "torch_view"])
def test_a_buffer_the_engine_dropped_lives_until_close(daemon, linker_factory, kind):
    bpr = 64
    tag = lambda r: "life/%d" % r  # noqa: E731
    keys = sha_chain(tokens_of(84, 8), 4)
    writer = linker_factory(daemon, model_id="m")
    _store(writer, keys, bpr, tag)
    lk = linker_factory(daemon, model_id="m")
    if kind == "torch":
        buf = torch.zeros(32, bpr, dtype=torch.uint8)
        ref = weakref.ref(buf)
    elif kind == "numpy":
        buf = np.zeros((32, bpr), np.uint8)
        ref = weakref.ref(buf)
    else:  # one layer of a layer-interleaved tensor: the view and its base
        base = torch.zeros(32, 3, bpr, dtype=torch.uint8)
        buf = base[:, 1]
        ref = weakref.ref(base)
        del base
    pool = lk.register_pool("kv", {0: [buf]}, page_size=4)
    del buf  # the engine lets go of its last reference
    gc.collect()
    assert ref() is not None, "a registered buffer was freed"
    # the load writes into it, and it is read back through the weakref
    view = (lambda: ref().numpy()) if kind == "torch" else (
        (lambda: ref()) if kind == "numpy" else (lambda: ref().numpy()[:, 1]))
    _roundtrip_into(lk, pool, keys, view, tag, bpr, 8)
    gc.collect()
    assert ref() is not None
    lk.close()
    del pool, view
    gc.collect()
    assert ref() is None, "the linker kept its buffer past close"


def test_a_raw_buffers_owner_lives_until_close(daemon, linker_factory):
    bpr = 32
    tag = lambda r: "raw/%d" % r  # noqa: E731
    keys = sha_chain(tokens_of(85, 4), 4)
    writer = linker_factory(daemon, model_id="m")
    _store(writer, keys, bpr, tag)

    class Owner:
        def __init__(self):
            self.mem = (ctypes.c_uint8 * (16 * bpr))()

    lk = linker_factory(daemon, model_id="m")
    owner = Owner()
    ref = weakref.ref(owner)
    raw = kvdock.RawBuffer(ctypes.addressof(owner.mem), 16, bpr, owner=owner)
    pool = lk.register_pool("kv", {0: [raw]}, page_size=4)
    del owner, raw
    gc.collect()
    assert ref() is not None
    _roundtrip_into(lk, pool, keys, lambda: np.ctypeslib.as_array(ref().mem).reshape(16, bpr),
                    tag, bpr, 4)
    lk.close()
    del pool
    gc.collect()
    assert ref() is None


def test_a_callback_lives_until_close(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    got = []

    class Allocator:
        def free(self, idx):
            got.extend(idx.tolist())

    alloc = Allocator()
    ref = weakref.ref(alloc)
    pool = lk.register_pool("kv", {0: [np.zeros((16, 16), np.uint8)]}, page_size=4,
                            free_indices=alloc.free)
    del alloc
    gc.collect()
    assert ref() is not None
    with pytest.raises(kvdock.NotFoundError):
        lk.load(1, kvdock.Transfer(pool, [bytes(32)], indices=range(4, 8)))
    lk.abort(1)
    assert got == [4, 5, 6, 7]
    lk.close()
    del pool
    gc.collect()
    assert ref() is None
