"""The SGLang HiCache backend when things go wrong: a daemon killed, hung or
killed in the middle of the engine's calls, bad arguments. SGLang's storage
threads die on an exception and treat None as "tier off for good", so every
call must answer (False per key, 0, None for a page) within its bound and
work again once the daemon is back. The time bounds below are generous
upper limits only, never what a test measures."""

import os
import signal
import threading
import time

import pytest
import torch

from kvdock.sglang.hicache import (KvdockHiCacheStorage, PoolHitPolicy, PoolName, PoolTransfer,
                                   StorageMetrics)

from sglang_hicache_engine import (HiCacheDriver, MambaHostPool, MHAHostPool, page_hashes,
                                   storage_config)

PS = 4
BOUND_S = 60.0  # far above any call's timeout_ms below


def tokens(n, base=0):
    return [(base * 7907 + i * 13 + 1) % 40000 for i in range(n)]


def backend(daemon, timeout_ms=2000, **kw):
    pool = MHAHostPool(2, 512, PS, head_num=2, head_dim=4, layout="layer_first")
    pool.fill_random(torch.Generator().manual_seed(kw.pop("seed", 1)))
    be = KvdockHiCacheStorage(storage_config(daemon.socket, timeout_ms=timeout_ms, **kw), {})
    be.register_mem_pool_host(pool)
    mamba = MambaHostPool(2, 16, temporal_shape=(2, 2), conv_shapes=[(2, 2)])
    be.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    return be, pool, mamba


def every_call(be, pool, mamba, hashes):
    """Each of the engine's calls once; what each answered."""
    n = len(hashes)
    out = {
        "exists": be.batch_exists(hashes),
        "exists1": be.exists(hashes[0]),
        "get_v1": be.batch_get_v1(hashes, pool.alloc(n * PS)),
        "set_v1": be.batch_set_v1(hashes, pool.alloc(n * PS)),
        "exists_v2": be.batch_exists_v2(hashes, [PoolTransfer(
            name=PoolName.MAMBA, keys=[None], hit_policy=PoolHitPolicy.TRAILING_PAGES)]),
        "get_v2": be.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, keys=hashes[-1:],
                                                host_indices=mamba.alloc(1))]),
        "set_v2": be.batch_set_v2([PoolTransfer(name=PoolName.MAMBA, keys=hashes[-1:],
                                                host_indices=mamba.alloc(1))]),
        "get": be.get(hashes[0], pool.get_dummy_flat_data_page()),
        "set": be.set(hashes[0], pool.get_data_page(0)),
        "batch_get": be.batch_get(hashes[:2], None),
        "batch_set": be.batch_set(hashes[:2], [pool.get_data_page(0), pool.get_data_page(PS)]),
    }
    return out


def assert_all_failed(out, n):
    assert out["exists"] == 0 and out["exists1"] is False
    assert out["get_v1"] == [False] * n and out["set_v1"] == [False] * n
    assert out["exists_v2"].kv_hit_pages == 0
    assert out["get_v2"] == {PoolName.MAMBA: [False]}
    assert out["set_v2"] == {PoolName.MAMBA: [False]}
    assert out["get"] is None and out["set"] is False
    assert out["batch_get"] == [None, None] and out["batch_set"] is False


def test_daemon_killed_every_call_fails_cleanly_then_recovers(daemon):
    be, pool, mamba = backend(daemon)
    try:
        drv = HiCacheDriver(be, pool)
        toks = tokens(6 * PS)
        assert drv.backup(pool.alloc(len(toks)), toks) == 6
        daemon.kill()
        t0 = time.monotonic()
        out = every_call(be, pool, mamba, page_hashes(toks, PS))
        assert time.monotonic() - t0 < BOUND_S
        assert_all_failed(out, 6)

        # back: the same backend stores and restores again, on a daemon
        # started empty (one restarted on its pool file would still hold
        # the first backup's bytes under these keys)
        daemon.start(fresh=True)
        src = pool.alloc(len(toks))
        deadline = time.monotonic() + BOUND_S
        while drv.backup(src, toks) != 6:  # the first calls may meet the reconnect
            assert time.monotonic() < deadline, "no recovery after the restart"
            time.sleep(0.2)
        got, dst = drv.prefetch(toks)
        assert got == 6
        assert all(pool.page_bytes(int(src[p * PS])) == pool.page_bytes(int(dst[p * PS]))
                   for p in range(6))
    finally:
        be.close()


def test_hung_daemon_calls_return_within_their_timeout(daemon):
    be, pool, mamba = backend(daemon, timeout_ms=1000)
    try:
        toks = tokens(4 * PS, base=1)
        hashes = page_hashes(toks, PS)
        assert be.batch_set_v1(hashes, pool.alloc(len(toks))) == [True] * 4
        os.kill(daemon.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            out = every_call(be, pool, mamba, hashes)
            assert time.monotonic() - t0 < BOUND_S
        finally:
            os.kill(daemon.pid, signal.SIGCONT)
        # a stopped daemon answers nothing: the pages count as absent
        assert_all_failed(out, 4)
        deadline = time.monotonic() + BOUND_S
        while be.batch_exists(hashes) != 4:
            assert time.monotonic() < deadline, "no recovery after SIGCONT"
            time.sleep(0.2)
    finally:
        be.close()


def test_daemon_killed_mid_operation_nothing_hangs(daemon):
    be, pool, mamba = backend(daemon, timeout_ms=2000)
    results, errors = [], []
    first_done, killed = threading.Event(), threading.Event()
    src, dst = pool.alloc(16 * PS), pool.alloc(16 * PS)

    def engine_thread():
        # the backup and prefetch threads' calls, back to back, until a load
        # failed after the kill (bounded)
        try:
            for i in range(5000):
                h = page_hashes(tokens(16 * PS, base=100 + i), PS)
                results.append(("set", be.batch_set_v1(h, src)))
                got = be.batch_get_v1(h, dst)
                results.append(("get", got))
                results.append(("exists", be.batch_exists(h)))
                first_done.set()
                if killed.is_set() and not all(got):
                    break
        except BaseException as e:  # what would kill SGLang's storage thread
            errors.append(e)
        finally:
            first_done.set()

    try:
        th = threading.Thread(target=engine_thread, daemon=True)
        th.start()
        assert first_done.wait(BOUND_S)
        daemon.kill()
        killed.set()
        th.join(BOUND_S)
        assert not th.is_alive(), "a backend call hung after the daemon died"
        assert errors == []
        for kind, r in results:
            if kind == "exists":
                assert isinstance(r, int) and 0 <= r <= 16
            else:
                assert isinstance(r, list) and len(r) == 16
                assert all(isinstance(x, bool) for x in r)
        assert results[0] == ("set", [True] * 16)  # before the kill
        assert results[-2] == ("get", [False] * 16)  # after it
    finally:
        be.close()


def test_bad_arguments_are_false_not_exceptions(daemon):
    be, pool, mamba = backend(daemon)
    try:
        toks = tokens(3 * PS, base=2)
        h = page_hashes(toks, PS)
        assert be.batch_set_v1(h, pool.alloc(2 * PS)) == [False] * 3  # too few indices
        assert be.batch_get_v1(h, pool.alloc(4 * PS)) == [False] * 3  # too many
        assert be.batch_get_v1(h, None) == [False] * 3
        assert be.batch_set_v1([], pool.alloc(0)) == [] and be.batch_exists([]) == 0
        # indices the pool does not have
        assert be.batch_set_v1(h, torch.arange(10**6, 10**6 + 3 * PS)) == [False] * 3
        # a pool that was never registered
        assert be.batch_get_v2([PoolTransfer(name=PoolName.SWA, keys=h,
                                             host_indices=pool.alloc(3 * PS))]) == \
            {PoolName.SWA: [False] * 3}
        st = be.get_stats()
        assert isinstance(st, StorageMetrics) and st.backup_pgs == [] and st.prefetch_pgs == []
    finally:
        be.close()


def test_a_backend_before_register_mem_pool_host_answers_nothing(daemon):
    be = KvdockHiCacheStorage(storage_config(daemon.socket), {})
    try:
        h = page_hashes(tokens(2 * PS), PS)
        assert be.batch_exists(h) == 0
        assert be.batch_get_v1(h, torch.arange(2 * PS)) == [False, False]
        assert be.batch_set_v1(h, torch.arange(2 * PS)) == [False, False]
    finally:
        be.close()


def test_no_daemon_at_construction_raises_after_its_wait(tmp_path):
    sock = str(tmp_path / "nobody.sock")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="no kvdockd"):
        KvdockHiCacheStorage(storage_config(sock, connect_wait_s=0.5), {})
    assert time.monotonic() - t0 < BOUND_S


def test_host_pool_kvdock_cannot_use_is_refused_at_registration(daemon):
    be = KvdockHiCacheStorage(storage_config(daemon.socket), {})
    try:
        class Logical:  # a logical anchor: indices, no tensors
            layout, page_size, kv_buffer = "layer_first", 4, None

        with pytest.raises(ValueError, match="no tensors"):
            be.register_mem_pool_host(Logical())
        pool = MHAHostPool(2, 8, PS, head_num=1, head_dim=4, layout="layer_first")
        pool.layout = "page_head"
        with pytest.raises(ValueError, match="layout"):
            be.register_mem_pool_host(pool)
    finally:
        be.close()


def test_page_first_direct_refuses_indices_that_are_not_whole_pages(daemon):
    pool = MHAHostPool(2, 16, PS, head_num=1, head_dim=4, layout="page_first_direct")
    be = KvdockHiCacheStorage(storage_config(daemon.socket), {})
    try:
        be.register_mem_pool_host(pool)
        h = page_hashes(tokens(2 * PS, base=3), PS)
        good = torch.arange(2 * PS, 4 * PS)
        assert be.batch_set_v1(h, good) == [True, True]
        shifted = good + 1  # each page starts one slot late
        assert be.batch_get_v1(h, shifted) == [False, False]
        assert be.batch_get_v1(h, good.flip(0)) == [False, False]
        assert be.batch_get_v1(h, torch.arange(8 * PS, 10 * PS)) == [True, True]
    finally:
        be.close()
