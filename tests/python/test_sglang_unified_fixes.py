"""kvdock.sglang.unified: the review's findings, one test each.

* H2: a load that fails after COMMIT is never returned as completed by
  pop_completed_load (SGLang's wrapper at the adapter's commit takes
  every rid it returns as loaded); it is held until the engine lets the
  request go (cancel_queued_load answers True, the wrapper drops its
  lock), logged at error level and counted in pool_stats. Driven by
  mini_engine.SGLangWrapperFlow, SGLang's own wrapper order.
* L1: the calls SGLang's scheduler makes answer False / [] instead of
  raising (closed adapter, a pool never registered, a load in the wrong
  state, an allocator raising inside a cancel).
* L2: an offload completion arriving after reset() is dropped, not kept.
* D1: page keys follow kvdock.engine.page_key (a key that is not 64 hex
  digits is hashed, and bytes of the same key meet it).
* D6: a dead daemon's lookups log one warning per interval, not one each.
"""

import logging
import time

from kvdock import engine
from kvdock.sglang.unified import KvdockUnifiedCacheLinker, PoolName, PoolTransfer
from mini_engine import MiniEngine, SGLangWrapperFlow, UnifiedLinkerFlow, tokens
from test_sglang_unified import assert_clean, store

from sglang_unified_fixtures import unified_factory  # noqa: E402,F401  (a fixture)

LOGGER = "kvdock.sglang.unified"




def errors_about(caplog, text):
    return [r for r in caplog.records
            if r.name == LOGGER and r.levelno >= logging.ERROR and text in r.getMessage()]


# ---------------------------------------------------------------------- H2


def test_wrapper_order_a_failed_load_is_never_popped_as_loaded(unified_factory, daemon,
                                                               caplog):
    e = MiniEngine("AA", page_size=4)
    a, f = unified_factory(e, timeout_ms=3000)
    w = SGLangWrapperFlow(e, a)
    p1, p2, p3 = tokens(31, 25), tokens(32, 25), tokens(33, 25)
    for p in (p1, p2, p3):
        store(e, f, p)
    # a load that succeeds: popped, its lock dropped, its bytes right
    r1 = f.new_request(p1)
    assert f.match(r1) == 6
    assert w.load_back(r1)
    assert w.run_batch() == [r1.rid]
    assert w.pending_loads == {}
    assert_clean(e)
    # two loads committed and queued; the request of r3 is let go while its
    # load is in flight (a committed load is not called off); the daemon dies
    r2, r3 = f.new_request(p2), f.new_request(p3)
    assert f.match(r2) == 6 and f.match(r3) == 6
    assert w.load_back(r2) and w.load_back(r3)
    assert w.release_request(r3.rid) is False
    daemon.kill()
    caplog.set_level(logging.INFO, logger=LOGGER)
    popped = w.run_batch()
    # r2 failed: not popped, so the wrapper still holds its lock and never
    # takes its KV as loaded; r3 failed too, but its request is gone: popped
    # so the wrapper drops the lock it still held
    assert popped == [r3.rid]
    assert set(w.pending_loads) == {r2.rid}
    assert errors_about(caplog, r2.rid) or errors_about(caplog, "failed after COMMIT")
    assert a.pool_stats()["kv"]["failed_loads"] == 2
    # the engine lets r2 go: the adapter answers True, the wrapper drops its
    # lock; asked again, nothing is held any more
    assert w.release_request(r2.rid) is True
    assert w.pending_loads == {}
    assert a.cancel_queued_load(r2.rid) is False
    # what the engine inserted for the failed loads it drops and recomputes
    e.undo_insert(r2.insert)
    e.undo_insert(r3.insert)
    assert e.check_invariants() == []
    e.drop_device()
    assert e.check_all_free() == []


def test_status_call_still_reports_failures(unified_factory, daemon):
    """pop_completed_load_status (kvdock's call) gives every rid with its
    outcome and holds nothing back."""
    e = MiniEngine("AA", page_size=4)
    a, f = unified_factory(e, timeout_ms=3000)
    toks = tokens(34, 25)
    store(e, f, toks)
    r = f.new_request(toks)
    assert f.match(r) == 6
    assert f.begin(r)
    f.prepare(r)
    f.insert(r)
    f.commit(r)
    daemon.kill()
    got, _ = f.run_batch([r])
    assert got == {r.rid: False}
    assert a.cancel_queued_load(r.rid) is False  # nothing held for it
    e.undo_insert(r.insert)
    e.drop_device()
    assert e.check_all_free() == []


# ---------------------------------------------------------------------- L1


def test_sglang_calls_answer_instead_of_raising(unified_factory, caplog):
    e = MiniEngine("AA", page_size=4)
    a, f = unified_factory(e)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    toks = tokens(35, 25)
    store(e, f, toks)
    # a pool never registered: the caller's bug, logged at error level
    swa = PoolTransfer(name=PoolName.SWA, keys=["00" * 32], device_indices=[0, 1, 2, 3])
    assert a.lookup("r-swa", [swa]) == []
    assert a.load("r-swa", [swa]) is False
    assert errors_about(caplog, "lookup of rid r-swa refused")
    assert errors_about(caplog, "load of rid r-swa refused")
    # indices that do not match the keys
    bad = PoolTransfer(name=PoolName.KV, keys=["11" * 32], device_indices=[0, 1])
    assert a.load("r-bad", [bad]) is False
    # load() of a rid pinned by begin_load but not committed: StateError inside
    r = f.new_request(toks)
    assert f.match(r) == 6
    assert f.begin(r)
    assert a.load(r.rid, r.transfers) is False
    assert errors_about(caplog, "StateError")
    assert a.cancel_queued_load(r.rid) is True  # ABORTed, indices back
    # the adapter closed: load() answers False (ClosedError inside)
    a.close()
    r2 = f.new_request(toks)
    f.match(r2)
    f.alloc(r2)
    assert a.load(r2.rid, r2.transfers) is False
    for u in r2.units["kv"]:
        e.pools["kv"].free(u)
    assert e.check_invariants() == []


def test_cancel_with_a_raising_allocator_answers(daemon, linker_factory, caplog):
    """free_indices raising inside the ABORT of a cancel: the load is called
    off (True), the allocator's error logged, nothing raised into SGLang."""
    e = MiniEngine("AA", page_size=4)
    specs = e.device_pools()
    real = specs[0].free_indices

    def flaky(indices):
        real(indices)
        raise RuntimeError("allocator says no")

    specs[0].free_indices = flaky
    a = KvdockUnifiedCacheLinker(device_pools=specs,
                                 linker=linker_factory(daemon, model_id="cancel-cb"))
    try:
        caplog.set_level(logging.WARNING, logger=LOGGER)
        f = UnifiedLinkerFlow(e, a)
        toks = tokens(36, 25)
        specs[0].free_indices = real  # the offload's tree is built cleanly
        store(e, f, toks)
        r = f.new_request(toks)
        assert f.match(r) == 6
        assert f.begin(r)
        assert a.cancel_queued_load(r.rid) is True
        assert errors_about(caplog, "allocator says no")
        assert e.check_invariants() == []
    finally:
        a.close()


# ---------------------------------------------------------------------- L2


class _StubPool:
    def __init__(self, name, spec_kwargs):
        self.id = 1
        self.name = name
        self.namespace = "stub/" + name
        self.object_bytes = 64
        self.page_size = spec_kwargs.get("page_size", 1)


class _StubLinker:
    """The kvdock.Linker calls the adapter makes, with completions the test
    hands out itself (a completion late past every bound, which a real
    daemon cannot be made to do on cue)."""

    timeout_ms = 1  # completion bound: about one second
    closed = False

    def __init__(self):
        self.acks = 0
        self.offload_done = []

    def register_pool(self, name, layers, **kw):
        return _StubPool(name, kw)

    def offload(self, transfers):
        self.acks += 1
        return self.acks

    def pop_completed_offloads(self, max=1024):
        out, self.offload_done = self.offload_done[:max], self.offload_done[max:]
        return out

    def pop_completed_loads(self, max=1024):
        return []

    def pool_stats(self, pool):
        return {}

    def close(self):
        self.closed = True


def test_offload_completion_after_reset_is_dropped(caplog):
    e = MiniEngine("AA", page_size=4)
    lk = _StubLinker()
    a = KvdockUnifiedCacheLinker(device_pools=e.device_pools(), linker=lk)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    t = PoolTransfer(name=PoolName.KV, keys=["22" * 32], device_indices=[0, 1, 2, 3])
    assert a.offload([t])
    a.reset()  # the completion never came within the bound: forgotten
    lk.offload_done.append((1, True))  # ... and comes now
    assert a.num_completed_offloads() == 0
    assert a._offload_done == {}  # not kept: nobody waits for it
    assert errors_about(caplog, "did not come back")
    assert a.offload([t])
    lk.offload_done.append((2, True))
    assert a.num_completed_offloads() == 1
    assert a.pop_completed_offload() is True
    assert a._offload_done == {}
    a.close()


# ---------------------------------------------------------------------- D1, D6


def test_page_keys_follow_the_engine_policy(unified_factory):
    e = MiniEngine("AA", page_size=4)
    a, f = unified_factory(e)
    u = e.pools["kv"].alloc()
    name = "lora-7:page-0"  # a derived key, not 64 hex digits
    t = PoolTransfer(name=PoolName.KV, keys=[name], device_indices=e.pools["kv"].indices([u]))
    assert a.offload([t])
    results = []
    deadline = time.monotonic() + 30
    while not results and time.monotonic() < deadline:
        if a.num_completed_offloads():
            results.append(a.pop_completed_offload())
        else:
            time.sleep(0.005)
    assert results == [True]
    e.pools["kv"].free(u)
    assert a.lookup("r", [PoolTransfer(name=PoolName.KV, keys=[name])]) == [1]
    raw = engine.page_key(name)
    assert a.lookup("r", [PoolTransfer(name=PoolName.KV, keys=[raw])]) == [1]
    assert a.lookup("r", [PoolTransfer(name=PoolName.KV, keys=[raw.hex()])]) == [1]
    assert a.lookup("r", [PoolTransfer(name=PoolName.KV, keys=[name + "x"])]) == []


def test_dead_daemon_lookups_log_once_per_interval(unified_factory, daemon, caplog):
    e = MiniEngine("AA", page_size=4)
    a, f = unified_factory(e, timeout_ms=3000)
    daemon.kill()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    t = PoolTransfer(name=PoolName.KV, keys=["33" * 32])
    for i in range(5):
        assert a.lookup("r%d" % i, [t]) == []
    misses = [r for r in caplog.records
              if r.name == LOGGER and "treated as a miss" in r.getMessage()]
    assert len(misses) == 1
