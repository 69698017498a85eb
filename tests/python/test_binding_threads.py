"""Threads and callbacks: the GIL is released while a call waits (a second
Python thread makes counted progress while the main thread is inside a
load or lookup on a SIGSTOPped daemon, and inside wait_layer while the
linker's copy is held by a userfaultfd), engine threads share a linker and
each gets its own error's reason, and a free_indices callback that raises
reaches the caller as CallbackError after the C side finished its work.
"""

import ctypes
import mmap
import os
import select
import signal
import threading
import time

import numpy as np
import pytest

import kvdock
from binding_util import (BOUND_S, PagedPool, SlotPool, bounded, offload_and_wait, pop_until,
                          row_bytes, sha_chain, tokens_of)

STEPS = 200  # counted steps the second thread makes while the main thread waits


class Progress(threading.Thread):
    """Once `inside` is set (the main thread is about to enter the call),
    counts STEPS steps (each gives the GIL up, so that the main thread
    reaches the call), noting for each whether the call had returned yet;
    then runs `release` (what lets the call finish)."""

    def __init__(self, release):
        super().__init__(daemon=True)
        self.release = release
        self.inside = threading.Event()
        self.returned = threading.Event()
        self.steps_while_inside = 0
        self.error = None

    def run(self):
        try:
            assert self.inside.wait(BOUND_S)
            for _ in range(STEPS):
                time.sleep(0.001)
                if not self.returned.is_set():
                    self.steps_while_inside += 1
        except BaseException as e:  # noqa: B902 (reported by the test)
            self.error = e
        finally:
            self.release()


def test_the_library_is_called_without_the_gil():
    lib = kvdock._lib.lib()
    assert type(lib) is ctypes.CDLL and not isinstance(lib, ctypes.PyDLL)
    for name in ("kvd_linker_open", "kvd_lookup", "kvd_load", "kvd_wait_layer", "kvd_offload",
                 "kvd_load_commit", "kvd_load_abort", "kvd_linker_close"):
        assert not getattr(lib, name)._flags_ & ctypes._FUNCFLAG_PYTHONAPI, name


@pytest.mark.parametrize("call", ["load", "lookup", "health"])
def test_another_thread_runs_while_a_call_waits_on_a_stopped_daemon(daemon, linker_factory,
                                                                    call):
    lk = linker_factory(daemon, model_id="m", timeout_ms=int(BOUND_S * 1000))
    kv = PagedPool(lk, layers=1, n_buf=1, bpr=16, ps=4)
    keys = sha_chain(tokens_of(30, 8), 4)
    kv.fill_pages(keys, 0)
    assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys, indices=kv.indices(0, 2)))
    kv.wipe()
    fn = {"load": lambda: lk.load(1, kvdock.Transfer(kv.pool, keys, indices=kv.indices(8, 2))),
          "lookup": lambda: lk.lookup(1, [kvdock.Transfer(kv.pool, keys)]),
          "health": lk.health}[call]
    progress = Progress(lambda: os.kill(daemon.pid, signal.SIGCONT))
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        progress.start()
        progress.inside.set()
        result = fn()  # answers only once the other thread let the daemon go on
        progress.returned.set()
    finally:
        progress.join(BOUND_S)
        os.kill(daemon.pid, signal.SIGCONT)
    assert progress.error is None and not progress.is_alive()
    assert progress.steps_while_inside == STEPS
    if call == "lookup":
        assert result == [1, 2]
    if call == "load":
        lk.commit(1, [(0, 2)])
        counter = lk.start_layer_wise_loading()
        lk.wait_layer(counter, 0)
        assert pop_until(lk.pop_completed_loads, [1]) == {1: True}
        kv.check_pages(keys, lambda i: 8 + 4 * i)


# userfaultfd(2): the pages of a mapping fault into this process's handler,
# so the linker's copy into them waits until the test lets it go on.
_NR_USERFAULTFD = {"x86_64": 323, "aarch64": 282}.get(os.uname().machine)
_UFFDIO_API = 0xC018AA3F
_UFFDIO_REGISTER = 0xC020AA00
_UFFDIO_UNREGISTER = 0x8010AA01
_UFFDIO_REGISTER_MODE_MISSING = 1
_UFFD_EVENT_PAGEFAULT = 0x12


class FaultGate:
    """An anonymous mapping whose missing pages block whoever touches them
    (userfaultfd, missing mode) until open() unregisters it."""

    def __init__(self, size):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long
        self.libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
        self.fd = -1
        if _NR_USERFAULTFD is None:
            pytest.skip("userfaultfd: no syscall number for %s here" % os.uname().machine)
        fd = self.libc.syscall(_NR_USERFAULTFD, os.O_CLOEXEC | os.O_NONBLOCK)
        if fd < 0:
            pytest.skip("userfaultfd is not available to this process: %s"
                        % os.strerror(ctypes.get_errno()))
        self.fd = fd
        api = (ctypes.c_uint64 * 3)(0xAA, 0, 0)
        self._ioctl(_UFFDIO_API, api)
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.size = size
        self._ioctl(_UFFDIO_REGISTER, (ctypes.c_uint64 * 4)(self.addr, size,
                                                           _UFFDIO_REGISTER_MODE_MISSING, 0))
        self.closed = False

    def _ioctl(self, req, arg):
        if self.libc.ioctl(self.fd, req, ctypes.addressof(arg)) != 0:
            err = ctypes.get_errno()
            self.close()
            pytest.skip("userfaultfd ioctl 0x%x: %s" % (req, os.strerror(err)))

    def wait_fault(self, timeout):
        """The faulting address once someone touched a missing page."""
        r, _, _ = select.select([self.fd], [], [], timeout)
        assert r, "nothing touched the gated pages within %.0f s" % timeout
        msg = os.read(self.fd, 32)
        assert msg[0] == _UFFD_EVENT_PAGEFAULT
        return int.from_bytes(msg[16:24], "little")

    def open(self):
        """Unregisters the range: blocked faults retry and get zero pages."""
        if not self.closed:
            rng = (ctypes.c_uint64 * 2)(self.addr, self.size)
            self.libc.ioctl(self.fd, _UFFDIO_UNREGISTER, ctypes.addressof(rng))
            self.closed = True

    def close(self):
        self.open()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def test_another_thread_runs_while_wait_layer_waits_for_the_copy(daemon, linker_factory):
    rows, bpr, ps = 64, 4096, 4
    writer = linker_factory(daemon, model_id="m", timeout_ms=int(BOUND_S * 1000))
    src = PagedPool(writer, layers=1, n_buf=1, n_rows=rows, bpr=bpr, ps=ps)
    keys = sha_chain(tokens_of(31, 16), ps)
    src.fill_pages(keys, 0)
    assert offload_and_wait(writer, kvdock.Transfer(src.pool, keys, indices=src.indices(0, 4)))
    gate = FaultGate(rows * bpr)
    try:
        # the reader's pool is the gated mapping: its copy blocks in a fault
        lk = linker_factory(daemon, model_id="m", timeout_ms=int(BOUND_S * 1000))
        buf = kvdock.RawBuffer(gate.addr, rows, bpr, owner=gate.map)
        pool = lk.register_pool("kv", {0: [buf]}, page_size=ps)
        lk.load(1, kvdock.Transfer(pool, keys, indices=range(16)))
        lk.commit(1, [(0, 4)])
        counter = lk.start_layer_wise_loading()
        fault = gate.wait_fault(BOUND_S)  # the copy is held now
        assert gate.addr <= fault < gate.addr + rows * bpr
        progress = Progress(gate.open)
        progress.start()
        progress.inside.set()
        lk.wait_layer(counter, 0)  # returns only once the other thread opened the gate
        progress.returned.set()
        progress.join(BOUND_S)
        assert progress.error is None and not progress.is_alive()
        assert progress.steps_while_inside == STEPS
        assert pop_until(lk.pop_completed_loads, [1]) == {1: True}
        got = np.frombuffer(gate.map, np.uint8).reshape(rows, bpr)
        for i, k in enumerate(keys):
            for r in range(ps):
                assert np.array_equal(got[i * ps + r], row_bytes(k, src.tag(0, 0, r), bpr))
        lk.close()
    finally:
        gate.close()  # never leave the linker's thread in a fault


def test_engine_threads_share_a_linker_and_each_gets_its_own_reason(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=1, n_buf=1, n_rows=256, bpr=16, ps=4)
    prompts = [sha_chain(tokens_of(40 + i, 8), 4) for i in range(8)]
    for i, keys in enumerate(prompts):
        if i % 2 == 0:  # even prompts are stored, odd ones are not
            kv.fill_pages(keys, 8 * i)
            assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys,
                                                        indices=kv.indices(8 * i, 2)))
    results = {}
    go = threading.Barrier(len(prompts))

    def engine(i):
        keys = prompts[i]
        go.wait(BOUND_S)
        out = []
        for _ in range(20):
            out.append(lk.lookup(100 + i, [kvdock.Transfer(kv.pool, keys)]))
            try:
                lk.load(100 + i, kvdock.Transfer(kv.pool, keys, indices=kv.indices(128 + 8 * i,
                                                                                    2)))
                out.append("loaded")
            except kvdock.NotFoundError as e:
                out.append(e.message)
            lk.abort(100 + i)
        results[i] = out

    threads = [threading.Thread(target=engine, args=(i,), daemon=True)
               for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND_S)
        assert not t.is_alive()
    for i, keys in enumerate(prompts):
        out = results[i]
        assert out[0::2] == [[1, 2] if i % 2 == 0 else []] * 20
        if i % 2 == 0:
            assert out[1::2] == ["loaded"] * 20
        else:  # the reason names this thread's missing key, never another's
            assert all(keys[0].hex()[:16] in m for m in out[1::2]), out[1]


# ---------------------------------------------------- callbacks that raise

class Boom(Exception):
    pass


def test_free_indices_raising_in_abort(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    seen = []

    def free(idx):
        seen.append(idx)
        raise Boom("the allocator is gone")

    kv = PagedPool(lk, layers=1, n_buf=1, bpr=16, ps=4, free_indices=free)
    keys = sha_chain(tokens_of(50, 8), 4)
    with pytest.raises(kvdock.NotFoundError):  # nothing is stored
        lk.load(5, kvdock.Transfer(kv.pool, keys, indices=kv.indices(8, 2)))
    with pytest.raises(kvdock.CallbackError) as ei:
        lk.abort(5)
    assert isinstance(ei.value.__cause__, Boom) and "allocator is gone" in str(ei.value)
    assert "Boom" in ei.value.message
    # the callback got its indices (a numpy int64 copy) and ABORT finished
    assert len(seen) == 1 and seen[0].dtype == np.int64 and list(seen[0]) == kv.indices(8, 2)
    with pytest.raises(kvdock.NotFoundError):
        lk.abort(5)
    # the error is not left behind for the next call
    assert lk.health()[0] == "ready"
    assert lk.lookup(6, [kvdock.Transfer(kv.pool, keys)]) == []


def test_free_indices_raising_in_commit(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    seen = []

    def free(idx):
        seen.append(list(idx))
        raise KeyError("slot table")

    kv = PagedPool(lk, layers=2, n_buf=2, bpr=16, ps=4, free_indices=free)
    keys = sha_chain(tokens_of(51, 12), 4)
    kv.fill_pages(keys, 0)
    assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys, indices=kv.indices(0, 3)))
    kv.wipe()
    dst = kv.indices(32, 3)
    lk.load(6, kvdock.Transfer(kv.pool, keys, indices=dst))
    lk.prepare(6)
    with pytest.raises(kvdock.CallbackError) as ei:
        lk.commit(6, [(1, 3)])  # page 0 was the tree's: its rows go back
    assert isinstance(ei.value.__cause__, KeyError)
    assert sorted(sum(seen, [])) == dst[:4]
    # COMMIT was done: not again, not abortable, and its copy runs
    with pytest.raises(kvdock.StateError):
        lk.commit(6, [(1, 3)])
    with pytest.raises(kvdock.StateError):
        lk.abort(6)
    counter = lk.start_layer_wise_loading()
    lk.wait_layer(counter, 0)
    lk.wait_layer(counter, 2)
    assert pop_until(lk.pop_completed_loads, [6]) == {6: True}
    kv.check_pages(keys[1:], lambda i: 36 + 4 * i)
    kv.check_zero(range(32, 36))


def test_a_callback_raising_base_exceptions_and_one_of_two_pools(daemon, linker_factory):
    # a slot pool's callback raises SystemExit; the paged pool's works: both
    # ran, ABORT finished, and the caller gets the SystemExit itself (not
    # wrapped: an exit or an interrupt is not a callback's error to handle)
    lk = linker_factory(daemon, model_id="m")
    ok_freed = []
    kv = PagedPool(lk, layers=1, n_buf=1, bpr=16, ps=4, free_indices=ok_freed.extend)

    def bad(idx):
        raise SystemExit(3)

    st = SlotPool(lk, n_slots=4, layer_ids=[1], free_indices=bad)
    keys = sha_chain(tokens_of(52, 8), 4)
    with pytest.raises(kvdock.NotFoundError):
        lk.load(7, [kvdock.Transfer(kv.pool, keys, indices=kv.indices(0, 2)),
                    kvdock.Transfer(st.pool, keys[1:], indices=[2])])
    with pytest.raises(SystemExit) as ei:
        lk.abort(7)
    assert ei.value.code == 3
    assert sorted(ok_freed) == kv.indices(0, 2)
    with pytest.raises(kvdock.NotFoundError):
        lk.abort(7)


def test_callbacks_from_many_threads_stay_with_their_caller(daemon, linker_factory):
    # thread i's callback raises only for its own rows: each thread's ABORT
    # raises its own callback's error, never another thread's
    lk = linker_factory(daemon, model_id="m")
    n = 6

    def free(idx):
        if int(idx[0]) // 8 % 2 == 1:
            raise ValueError("rows from %d" % int(idx[0]))

    kv = PagedPool(lk, layers=1, n_buf=1, n_rows=8 * n, bpr=16, ps=4, free_indices=free)
    outcome = {}
    go = threading.Barrier(n)

    def engine(i):
        keys = sha_chain(tokens_of(60 + i, 8), 4)
        go.wait(BOUND_S)
        res = []
        for round_ in range(10):
            rid = 1000 * i + round_
            try:
                lk.load(rid, kvdock.Transfer(kv.pool, keys, indices=kv.indices(8 * i, 2)))
            except kvdock.NotFoundError:
                pass
            try:
                lk.abort(rid)
                res.append("ok")
            except kvdock.CallbackError as e:
                res.append(str(e.__cause__))
        outcome[i] = res

    threads = [threading.Thread(target=engine, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND_S)
        assert not t.is_alive()
    for i in range(n):
        want = "rows from %d" % (8 * i) if i % 2 else "ok"
        assert outcome[i] == [want] * 10, (i, outcome[i])


def test_a_linker_closed_by_another_thread_while_calls_wait(daemon, linker_factory):
    # close() waits for calls in flight (each bounded by timeout_ms); calls
    # after it raise ClosedError; nothing hangs
    lk = linker_factory(daemon, model_id="m", timeout_ms=3000)
    kv = PagedPool(lk, layers=1, n_buf=1, bpr=16, ps=4)
    keys = sha_chain(tokens_of(70, 8), 4)
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        started = threading.Event()
        out = {}

        def waiter():
            started.set()
            try:
                out["r"] = lk.lookup(1, [kvdock.Transfer(kv.pool, keys)])
            except kvdock.KvdockError as e:
                out["r"] = e

        th = threading.Thread(target=waiter, daemon=True)
        th.start()
        assert started.wait(BOUND_S)
        time.sleep(0.2)  # most likely inside the lookup by now (either way is fine)
        how, _ = bounded(lk.close)
        assert how == "ok" and lk.closed
        th.join(BOUND_S)
        assert not th.is_alive()
        assert isinstance(out["r"], (kvdock.TimeoutError, kvdock.ClosedError, list)), out["r"]
        with pytest.raises(kvdock.ClosedError):
            lk.lookup(2, [kvdock.Transfer(kv.pool, keys)])
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
