"""The SGLang HiCache backend never hands host rows back to SGLang while
libkvdock may still copy into them: a committed load is started even when
starting fails (retried), a call waits for its completions whatever went
wrong on the way (or until the linker is closed, which fails them all at
once), and no completion of a call that gave up is kept forever.

Faults are injected by wrapping the backend's linker methods (the same
instance, so the rest of the library runs as it does in SGLang)."""

import logging

import torch

import kvdock
from kvdock.sglang.hicache import KvdockHiCacheStorage

from sglang_hicache_engine import MHAHostPool, page_hashes, storage_config

PS = 4


def tokens(n, base=0):
    return [(base * 6007 + i * 17 + 3) % 30000 for i in range(n)]


def backend(daemon, timeout_ms=2000):
    pool = MHAHostPool(2, 256, PS, head_num=2, head_dim=4, layout="layer_first")
    pool.fill_random(torch.Generator().manual_seed(5))
    be = KvdockHiCacheStorage(storage_config(daemon.socket, timeout_ms=timeout_ms), {})
    be.register_mem_pool_host(pool)
    return be, pool


def stored(be, pool, n_pages, base):
    """n_pages stored from fresh rows: (hashes, their source rows)."""
    h = page_hashes(tokens(n_pages * PS, base=base), PS)
    src = pool.alloc(n_pages * PS)
    assert be.batch_set_v1(h, src) == [True] * n_pages
    return h, src


def pages(pool, idx, n_pages):
    return [pool.page_bytes(int(idx[p * PS])) for p in range(n_pages)]


def kvdock_records(caplog):
    return [r for r in caplog.records if r.name.startswith("kvdock")
            and r.levelno >= logging.WARNING]


def test_a_failed_start_is_retried_and_the_load_lands(daemon):
    be, pool = backend(daemon)
    try:
        h, src = stored(be, pool, 4, base=1)
        real = be.lk.start_layer_wise_loading
        calls = []

        def start_failing_once():
            calls.append(1)
            if len(calls) == 1:
                raise kvdock.NoMemError(message="injected")
            return real()

        be.lk.start_layer_wise_loading = start_failing_once
        dst = pool.alloc(4 * PS)
        assert be.batch_get_v1(h, dst) == [True] * 4
        assert len(calls) == 2
        assert pages(pool, dst, 4) == pages(pool, src, 4)
    finally:
        be.close()


def test_a_start_that_keeps_failing_closes_instead_of_copying_later(daemon):
    # committed loads that never start must not be left for a later start
    # to copy into rows SGLang took back: the connection goes
    be, pool = backend(daemon, timeout_ms=300)
    try:
        h, src = stored(be, pool, 3, base=2)

        def start_failing():
            raise kvdock.NoMemError(message="injected")

        be.lk.start_layer_wise_loading = start_failing
        dst = pool.alloc(3 * PS)
        before = pages(pool, dst, 3)
        assert be.batch_get_v1(h, dst) == [False] * 3
        assert be.lk.closed
        assert pages(pool, dst, 3) == before
        assert be.batch_get_v1(h, dst) == [False] * 3 and be.batch_exists(h) == 0
        assert pages(pool, dst, 3) == before
    finally:
        be.close()


def test_close_during_a_load_fails_it_at_once_without_flooding_the_log(daemon, caplog):
    be, pool = backend(daemon)
    try:
        h, _ = stored(be, pool, 4, base=3)
        real_wait = be.lk.wait_layer

        def close_then_wait(counter, layer_id):
            be.close()  # SGLang detaching the backend while a prefetch runs
            return real_wait(counter, layer_id)

        be.lk.wait_layer = close_then_wait
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kvdock"):
            assert be.batch_get_v1(h, pool.alloc(4 * PS)) == [False] * 4
            assert be.batch_get_v1(h, pool.alloc(4 * PS)) == [False] * 4
            assert be.batch_set_v1(h, pool.alloc(4 * PS)) == [False] * 4
        # one line per kind of failure, not one per poll of a closed queue
        assert len(kvdock_records(caplog)) <= 6, [r.getMessage() for r in caplog.records]
    finally:
        be.close()


def test_an_unexpected_error_after_start_keeps_no_completion(daemon):
    be, pool = backend(daemon)
    try:
        h, src = stored(be, pool, 4, base=4)
        real_wait = be.lk.wait_layer

        def broken_wait(counter, layer_id):
            raise RuntimeError("injected: not a kvdock error")

        be.lk.wait_layer = broken_wait
        dst = pool.alloc(4 * PS)
        assert be.batch_get_v1(h, dst) == [False] * 4
        # the call still waited for the load it had started: it completed
        # (the copies ran), so the rows hold the loaded pages
        assert pages(pool, dst, 4) == pages(pool, src, 4)

        be.lk.wait_layer = real_wait
        h2, src2 = stored(be, pool, 2, base=5)
        dst2 = pool.alloc(2 * PS)
        assert be.batch_get_v1(h2, dst2) == [True] * 2
        assert pages(pool, dst2, 2) == pages(pool, src2, 2)
        # nothing of the first call is held (nor awaited) any more
        assert be._loads.poll() == {}
        assert not be._loads._abandoned
    finally:
        be.close()


def test_an_unexpected_error_between_offloads_waits_for_the_first(daemon):
    be, pool = backend(daemon)
    try:
        h = page_hashes(tokens(4 * PS, base=6), PS)
        src = pool.alloc(4 * PS)
        item = be._item(be._kv, h, src)
        real_offload = be.lk.offload
        calls = []

        def offload_then_break(transfers):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("injected: not a kvdock error")
            return real_offload(transfers)

        be.lk.offload = offload_then_break
        try:
            be._offload([item, item])
        except RuntimeError:
            pass
        else:
            raise AssertionError("the injected error was swallowed")
        # the first offload's ack was waited for, not left behind
        assert be._offloads.poll() == {}
        assert not be._offloads._abandoned
        be.lk.offload = real_offload
        assert be.batch_exists(h) == 4
    finally:
        be.close()
