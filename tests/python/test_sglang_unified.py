"""kvdock.sglang.unified.KvdockUnifiedCacheLinker: SGLang's unified-cache
linker over libkvdock, driven by tests/python/mini_engine.py in the
engine's call order against a real kvdockd, restores checked byte by byte.

The seed document's failure cases each have a test: mamba_exist at
COMMIT, adopted ranges (part of the prefix already in the tree), ABORT of
a failed LOAD (an object evicted between lookup and load with the kvdock
CLI), a slot-addressed transfer never page-sliced, the reachable-prefix
limit; then two TP ranks as two processes, a daemon killed mid-load, and
SGLang's interface restated (sglang_unified_iface.py) against the
adapter's signatures.
"""

import inspect
import json
import multiprocessing
import queue

import pytest
import torch

import kvdock
import sglang_unified_iface as iface
from kvdock.sglang import unified
from kvdock.sglang.unified import DevicePool, KvdockUnifiedCacheLinker, PoolName, PoolTransfer
from mini_engine import MiniEngine, UnifiedLinkerFlow, tokens
from sglang_unified_fixtures import unified_factory  # noqa: F401  (a fixture)




def object_bytes(e, name):
    """One stored object of a pool, from the engine's own layout: every
    layer's buffers, one unit's rows."""
    p = e.pools[name]
    return len(p.layer_ids) * sum(p.bpr) * p.rows_per_unit


def assert_clean(e):
    assert e.verify_tree() == []
    assert e.check_invariants() == []
    assert e.check_poison() == []


def store(e, f, toks, grid_states=False):
    """Prefills toks (with a state at every grid point when asked),
    offloads the tree, drops the device cache."""
    if grid_states:
        for n in range(e.grid, len(toks) + 1, e.grid):
            e.prefill(toks[:n])
    e.prefill(toks)
    units = f.offload_tree()
    e.drop_device()
    assert e.check_all_free() == []
    return units


def evict(daemon, pool, key):
    r = daemon.cli("evict", "--key", key.hex(), "--namespace", pool.namespace, "--json")
    return json.loads(r.stdout.decode())["evicted"]


# ------------------------------------------------------- the interface


def test_interface_matches_sglang_restatement():
    cls = KvdockUnifiedCacheLinker
    bad = []
    for name in iface.UNIFIED_CACHE_LINKER:
        bad += iface.check_method(cls, name)
    assert bad == []
    assert issubclass(cls, unified.UnifiedCacheLinker)
    assert not inspect.isabstract(cls)
    # the base class (SGLang's, or the adapter's fallback) asks for exactly
    # the methods written out from SGLang's source
    assert set(unified.UnifiedCacheLinker.__abstractmethods__) == set(iface.UNIFIED_CACHE_LINKER)
    # SGLang's factory call binds to the constructor
    inspect.signature(cls).bind(object(), object(), components=set(), extra_config={})
    for m in iface.LAYER_DONE_COUNTER_METHODS:
        fn = getattr(unified.KvdockLayerDoneCounter, m)
        assert len(inspect.signature(fn).parameters) == 2, m  # self and one argument


def test_interface_check_catches_a_renamed_method():
    class Renamed(KvdockUnifiedCacheLinker):
        def pop_completed_load(self, max_batches) -> list[str]:  # SGLang's takes none
            return []

    assert iface.check_method(Renamed, "pop_completed_load") != []

    class Missing:
        pass

    assert iface.check_method(Missing, "lookup") == ["lookup: missing"]


def test_factory_call_opens_its_own_linker(daemon):
    e = MiniEngine("AA", page_size=4)

    class Args:
        model_path = "org/model-from-server-args"
        tp_size = 1

    class Params:
        page_size = 4
        pp_rank, pp_size = 0, 1

    a = iface.factory_call(
        lambda *args, **kw: KvdockUnifiedCacheLinker(*args, device_pools=e.device_pools(),
                                                     **kw),
        Args(), Params(), set(), {"socket_path": daemon.socket, "timeout_ms": 10000})
    try:
        assert a.linker.model_id == "org/model-from-server-args"
        assert "model-from-server-args" in a.pools["kv"].namespace
        f = UnifiedLinkerFlow(e, a)
        toks = tokens(3, 17)
        store(e, f, toks)
        restored, r = f.load_back(toks)
        assert restored == 4 and r.success
        assert_clean(e)
    finally:
        a.close()
    assert a.linker.closed  # it opened the linker: it closes it
    with pytest.raises(ValueError):
        KvdockUnifiedCacheLinker(None, None, extra_config={"socket_path": daemon.socket,
                                                           "no_such_option": 1})


# ------------------------------------------------------------ happy paths


def test_mha_restores_the_probe_range_byte_exact(unified_factory):
    e = MiniEngine("AAAA", page_size=4)
    a, f = unified_factory(e)
    toks = tokens(1, 41)  # 10 full pages + 1 token; probe floor(40/4) = 10
    assert store(e, f, toks) == {"kv": 10}
    restored, r = f.load_back(toks)
    assert r.boundaries == list(range(1, 11))
    assert restored == 10 and r.success
    assert_clean(e)
    st = a.pool_stats()["kv"]
    assert st["load_bytes"] == 10 * object_bytes(e, "kv")
    assert st["lookup_hit_pages"] >= 10 and st["load_failures"] == 0
    # all on the device now: the next match finds nothing to load
    again, r2 = f.load_back(toks)
    assert again == 0 and r2.b == r2.cached == 10
    e.drop_device()
    assert e.check_all_free() == []


@pytest.mark.parametrize("layers", ["AMAM", "AMAMS"])
def test_hybrid_restores_kv_state_and_window(unified_factory, layers):
    e = MiniEngine(layers, page_size=4, mamba_chunk=8, swa_window=2)
    a, f = unified_factory(e)
    toks = tokens(2, 49)  # 12 pages; states at every grid point (8 tokens)
    units = store(e, f, toks, grid_states=True)
    assert units["kv"] == 12 and units["mamba"] == 6
    # every restorable boundary: the mamba filter keeps the grid points only
    tail = e.page_keys(toks, 12)
    look = [f._pool_transfer(n, tail) for n in e.pool_order()]
    assert a.lookup("probe", look) == [2, 4, 6, 8, 10, 12]
    assert a.lookup("probe", look[:1]) == list(range(1, 13))
    restored, r = f.load_back(toks)
    assert restored == 12 and r.success
    assert_clean(e)
    st = a.pool_stats()
    assert st["kv"]["load_bytes"] == 12 * object_bytes(e, "kv")
    assert st["mamba"]["load_bytes"] == object_bytes(e, "mamba")  # one state: at 12
    assert st["mamba"]["lookup_hit_pages"] > 0
    if "swa" in e.pools:
        assert st["swa"]["load_bytes"] == 2 * object_bytes(e, "swa")  # the window


def test_sglang_wrapper_order_load_after_insert(unified_factory, daemon):
    """SGLang's own wrapper (at the adapter's commit) inserts first and hands
    load() the transfers the tree adopted: load() runs LOAD, PREPARE and a
    whole COMMIT; an evicted object makes it return False and frees
    nothing (the tree holds those indices)."""
    e = MiniEngine("AA", page_size=4)
    a, f = unified_factory(e)
    toks = tokens(4, 25)
    store(e, f, toks)
    for evicted in (False, True):
        r = f.new_request(toks)
        f.match(r)
        assert r.b == 6
        f.alloc(r)
        f.insert(r)
        freed = e.pools["kv"].linker_freed
        if evicted:
            assert evict(daemon, a.pools["kv"], r.keys[3]) == 1
            assert a.load(r.rid, r.transfers) is False
            assert e.pools["kv"].linker_freed == freed
            assert a.cancel_queued_load(r.rid) is False  # nothing recorded any more
            e.drop_device()
            assert e.check_all_free() == []
            continue
        assert a.load(r.rid, r.transfers) is True
        r.state = "queued"
        got, _ = f.run_batch([r])
        assert got == {r.rid: True}
        assert e.pools["kv"].linker_freed == freed
        assert_clean(e)
        e.drop_device()


# -------------------------------------------------- the seed's failure cases


def test_mamba_exist_at_commit_drops_without_freeing(unified_factory):
    """Two requests load the same prefix; the first inserts it with its
    state; at the second's insert the node has a state already: the tree
    frees the second's slot itself (mamba_exist) and COMMIT must drop the
    transfer without freeing it again. Its KV pages were not adopted: COMMIT
    frees them through free_indices, once."""
    e = MiniEngine("AMAM", page_size=4, mamba_chunk=8)
    a, f = unified_factory(e)
    toks = tokens(5, 33)
    store(e, f, toks)
    ra, rb = f.new_request(toks), f.new_request(toks)
    for r in (ra, rb):
        assert f.match(r) == 8
        assert f.begin(r)
        f.prepare(r)
    f.insert(ra)
    f.commit(ra)
    mamba, kv = e.pools["mamba"], e.pools["kv"]
    mamba_free, kv_freed = mamba.count(0), kv.linker_freed
    ins = f.insert(rb)
    assert ins.mamba_exist and ins.adopted["kv"] == (0, 0)
    assert mamba.count(0) == mamba_free + 1  # the tree freed rb's slot
    remaining = f.commit(rb)
    assert remaining == []  # nothing left of rb to copy
    assert mamba.count(0) == mamba_free + 1 and mamba.linker_freed == 0
    assert kv.linker_freed - kv_freed == 8
    got, _ = f.run_batch([ra, rb])
    assert got == {ra.rid: True}
    assert_clean(e)
    assert a.pool_stats()["mamba"]["load_bytes"] == object_bytes(e, "mamba")
    e.drop_device()
    assert e.check_all_free() == []


def test_mamba_exist_ignored_is_caught(unified_factory):
    """Control: the checks see the pitfall. Committing the second load as
    if its slot were still its own copies a state into a slot the tree
    freed: the poison check shows the write."""
    e = MiniEngine("AMAM", page_size=4, mamba_chunk=8)
    a, f = unified_factory(e)
    toks = tokens(6, 33)
    store(e, f, toks)
    ra, rb = f.new_request(toks), f.new_request(toks)
    for r in (ra, rb):
        f.match(r)
        assert f.begin(r)
        f.prepare(r)
    f.insert(ra)
    f.commit(ra)
    f.insert(rb)
    rb.remaining = a.commit_load(rb.rid, f.adopted_ranges(rb), mamba_exist=False)
    assert [str(t.name) for t in rb.remaining] == ["mamba"]
    assert a.load(rb.rid, rb.remaining)
    rb.state = "queued"
    f.run_batch([ra, rb])
    assert any("mamba free unit" in x for x in e.check_poison())


@pytest.mark.parametrize("layers", ["AAAA", "ASAS"])
def test_adopted_ranges_free_the_rest_once(unified_factory, layers):
    """Between one request's LOAD and its insert another request computes
    the first 3 pages into the tree: the insert adopts pages 3..8, COMMIT
    frees the load's indices of pages 0..3 through free_indices (once) and
    copies the rest."""
    e = MiniEngine(layers, page_size=4, swa_window=2)
    a, f = unified_factory(e)
    toks = tokens(7, 33)
    store(e, f, toks)
    r = f.new_request(toks)
    assert f.match(r) == 8
    assert f.begin(r)
    f.prepare(r)
    e.prefill(toks[:12])  # the other request
    kv = e.pools["kv"]
    freed, calls = kv.linker_freed, kv.linker_free_calls
    ins = f.insert(r)
    assert ins.adopted["kv"] == (3, 8)
    remaining = f.commit(r)
    assert kv.linker_freed - freed == 3 and kv.linker_free_calls > calls
    kv_left = [t for t in remaining if str(t.name) == "kv"][0]
    assert len(kv_left.keys) == 5 and kv_left.device_indices.numel() == 5 * 4
    got, _ = f.run_batch([r], verify_layers=True)
    assert got == {r.rid: True}
    assert_clean(e)
    st = a.pool_stats()
    assert st["kv"]["load_bytes"] == 5 * object_bytes(e, "kv")
    if "swa" in e.pools:
        assert st["swa"]["load_bytes"] == 2 * object_bytes(e, "swa")
    e.drop_device()
    assert e.check_all_free() == []


@pytest.mark.parametrize("layers,evicted_pool", [("AAAA", "kv"), ("AMAMS", "mamba")])
def test_abort_of_a_load_whose_object_was_evicted(unified_factory, daemon, layers,
                                                  evicted_pool):
    """An object evicted between lookup and LOAD (the kvdock CLI): LOAD
    fails, ABORT hands every index of the load back through free_indices
    exactly once, the engine recomputes, the tree is byte-exact."""
    e = MiniEngine(layers, page_size=4, mamba_chunk=8, swa_window=2)
    a, f = unified_factory(e)
    toks = tokens(8, 33)
    store(e, f, toks)
    r = f.new_request(toks)
    assert f.match(r) == 8
    key = r.keys[5] if evicted_pool == "kv" else r.keys[7]
    assert evict(daemon, a.pools[evicted_pool], key) == 1
    assert f.begin(r) is False
    freed = f.abort(r)
    want = {"kv": 8, "swa": 2, "mamba": 1}
    assert freed == {n: want[n] for n in e.pools}
    assert a.abort_load(r.rid) is False  # once only
    for p in e.pools.values():
        assert p.double_frees == 0
    e.prefill(toks)  # recomputed
    assert_clean(e)
    assert a.pool_stats()[evicted_pool]["load_failures"] >= 1
    # the next lookup no longer offers what needs the evicted object
    e.drop_device()
    r2 = f.new_request(toks)
    f.match(r2)
    assert r2.b == (5 if evicted_pool == "kv" else 0)
    assert e.check_all_free() == []


def test_slot_transfer_is_never_page_sliced(unified_factory):
    """page_size 4 and a partial KV adoption: the mamba transfer (one slot
    id, not a page of token slots) stays whole at COMMIT, whatever adopted
    range is given for it (SGLang's tree records none for mamba: an
    adopted-range test would drop every state), and its state arrives."""
    e = MiniEngine("AMAM", page_size=4, mamba_chunk=4)
    a, f = unified_factory(e)
    toks = tokens(9, 25)
    store(e, f, toks)
    r = f.new_request(toks)
    assert f.match(r) == 6
    assert f.begin(r)
    f.prepare(r)
    e.prefill(toks[:8])  # two pages (and a state at 2) computed meanwhile
    f.insert(r)
    adopted = f.adopted_ranges(r)
    assert adopted["kv"] == (2, 6)
    adopted["mamba"] = (0, 0)  # what an adopted-range test would say
    remaining = f.commit(r, adopted=adopted)
    mamba_left = [t for t in remaining if str(t.name) == "mamba"]
    assert len(mamba_left) == 1 and mamba_left[0].device_indices.numel() == 1
    got, _ = f.run_batch([r])
    assert got == {r.rid: True}
    assert_clean(e)
    assert a.pool_stats()["mamba"]["load_bytes"] == object_bytes(e, "mamba")
    # a slot transfer given a page of indices per key is refused, nothing recorded
    bad = f._pool_transfer("mamba", [r.keys[0]], torch.arange(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="never page-sliced"):
        a.begin_load("bad", [bad])
    assert a.cancel_queued_load("bad") is False


def test_reachable_prefix_limit(unified_factory):
    """grid = lcm(mamba chunk 8, page 4) = 8; the probe stops one token
    short of the prompt. A prompt replayed at exactly its stored length
    restores nothing (its only state is one grid step past the probe); one
    token more restores it all; with states at every grid point a prompt of
    L tokens restores floor((L-1)/8)*8 of them."""
    e = MiniEngine("AMAM", page_size=4, mamba_chunk=8)
    a, f = unified_factory(e)
    toks = tokens(10, 100)
    store(e, f, toks[:32])  # its only state at 32
    r = f.new_request(toks[:32])
    f.match(r)
    assert r.n_probe == 7 and r.boundaries == [] and r.b == 0
    kv_only = a.lookup("kv-only", [f._pool_transfer("kv", r.keys)])
    assert kv_only == list(range(1, 8))  # the veto is the state's
    restored, _ = f.load_back(toks[:33])
    assert restored * e.ps == 32
    assert_clean(e)
    e.drop_device()

    store(e, f, toks[:64], grid_states=True)
    for n in (20, 32, 33, 40, 41, 57, 64, 65, 100):
        restored, r = f.load_back(toks[:n])
        assert restored * e.ps == min((n - 1) // 8 * 8, 64), n
        assert_clean(e)
        e.drop_device()
    assert e.check_all_free() == []


# ---------------------------------------------- cancel, reset, completions


def test_cancel_and_reset(unified_factory):
    e = MiniEngine("AA", page_size=4)
    a, f = unified_factory(e)
    toks, other = tokens(11, 25), tokens(12, 25)
    e.prefill(other)
    store(e, f, toks)
    kv = e.pools["kv"]
    r = f.new_request(toks)
    f.match(r)
    assert f.begin(r)
    before = kv.linker_freed
    assert a.cancel_queued_load(r.rid) is True  # never committed: ABORTed
    assert kv.linker_freed - before == 6
    # a committed load is not called off; reset starts it and waits for it
    r2 = f.new_request(toks)
    f.match(r2)
    assert f.begin(r2)
    f.prepare(r2)
    f.insert(r2)
    f.commit(r2)
    assert a.cancel_queued_load(r2.rid) is False
    r3 = f.new_request(other)  # pinned, uncommitted: reset aborts it
    f.match(r3)
    assert r3.b == 6 and f.begin(r3)
    before = kv.linker_freed
    a.reset()
    assert kv.linker_freed - before == 6
    assert a.num_completed_loads() == 0 and a.start_layer_wise_loading() == -1
    assert_clean(e)  # r2's pages arrived before reset returned
    e.drop_device()
    assert e.check_all_free() == []


def test_empty_and_unknown(unified_factory):
    e = MiniEngine("AA", page_size=4)
    a, f = unified_factory(e)
    assert a.lookup("x", []) == []
    assert a.start_layer_wise_loading() == -1
    a.layer_done_counter.set_consumer(-1)
    a.layer_done_counter.wait_until(0)  # nothing started: returns
    assert a.num_completed_loads() == 0 and a.pop_completed_load() == []
    assert a.num_completed_offloads() == 0 and a.pop_completed_offload() is False
    assert a.offload([]) is False
    # SGLang's scheduler calls these: a pool never registered is the
    # caller's bug (logged), a key that is not hex is hashed; both a miss
    assert a.lookup("x", [PoolTransfer(name=PoolName.SWA, keys=["00" * 32])]) == []
    assert a.lookup("x", [PoolTransfer(name=PoolName.KV, keys=["zz"])]) == []


# ----------------------------------------------------- TP ranks, daemon death


def test_two_tp_ranks_restore_their_own_bytes(daemon):
    """Two ranks, two processes, each its own linker (tp_rank 0/1): rank 0
    stores 10 pages, rank 1 only 6; the boundaries both share are 1..6
    (the engine intersects the ranks' sets), each restores 6 pages of its
    own bytes (the rank is part of every byte) into its own namespace."""
    ctx = multiprocessing.get_context("spawn")
    import sglang_unified_tp as tp

    prompt = tokens(13, 41)
    to_parent = ctx.Queue()
    to_child = [ctx.Queue(), ctx.Queue()]
    procs = [ctx.Process(target=tp.rank_main,
                         args=(rank, daemon.socket, prompt, n, to_parent, to_child[rank]))
             for rank, n in ((0, 40), (1, 24))]
    for p in procs:
        p.start()
    results, bnd = {}, {}
    try:
        while len(results) < 2:
            kind, rank, payload = to_parent.get(timeout=120)
            if kind == "error":
                pytest.fail("rank %d: %s" % (rank, payload))
            if kind == "boundaries":
                bnd[rank] = payload
                if len(bnd) == 2:
                    common = sorted(set(bnd[0]) & set(bnd[1]))
                    for q in to_child:
                        q.put(common)
            else:
                results[rank] = payload
    except queue.Empty:
        pytest.fail("a rank did not report within 120 s")
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    assert bnd[0] == list(range(1, 11)) and bnd[1] == list(range(1, 7))
    for rank in (0, 1):
        res = results[rank]
        assert res["errors"] == [], (rank, res["errors"])
        assert res["restored"] == 6 and res["success"], (rank, res)
        assert res["load_bytes"] == 6 * res["object_bytes"]
    assert results[0]["namespace"] != results[1]["namespace"]
    assert all(p.exitcode == 0 for p in procs)


def test_daemon_killed_mid_load(unified_factory, daemon):
    """SIGKILL between COMMIT and the copy: the load completes as failed
    (bounded), nothing hangs, the engine drops what it inserted and
    recomputes, and the invariant holds; lookups with no daemon are
    misses."""
    e = MiniEngine("AMAM", page_size=4, mamba_chunk=8)
    a, f = unified_factory(e, timeout_ms=3000)
    toks = tokens(14, 33)
    store(e, f, toks)
    r = f.new_request(toks)
    assert f.match(r) == 8
    assert f.begin(r)
    f.prepare(r)
    f.insert(r)
    f.commit(r)
    daemon.kill()
    got, _ = f.run_batch([r])
    assert got == {r.rid: False}
    e.undo_insert(r.insert)
    assert e.check_invariants() == []
    e.prefill(toks)  # recomputed
    assert_clean(e)
    # the daemon is gone: the next prompt is a miss and is computed
    restored, r2 = f.load_back(tokens(15, 33))
    assert restored == 0 and r2.boundaries == []
    assert_clean(e)
    a.close()
    e.drop_device()
    assert e.check_all_free() == []


def test_device_pool_spec_defaults():
    p = DevicePool(name=PoolName.MAMBA, layers={0: []}, addressing=kvdock.SLOT)
    assert unified._pool_name(p.name) == "mamba"
    assert unified.SGLANG_COMMIT in unified.__doc__


def test_checks_see_one_wrong_byte(unified_factory):
    """Control: a restore with a single wrong byte (or another rank's
    bytes) fails verify_tree."""
    e = MiniEngine("AA", page_size=4)
    a, f = unified_factory(e)
    toks = tokens(16, 17)
    store(e, f, toks)
    restored, _ = f.load_back(toks)
    assert restored == 4 and e.verify_tree() == []
    node = e.path(e.page_keys(toks, 4))[2]
    kv = e.pools["kv"]
    base = kv.bases[1][1]  # layer 1, V
    base[node.kv * 4 + 3, 5] ^= 1
    assert len(e.verify_tree()) == 1
    base[node.kv * 4 + 3, 5] ^= 1
    other = MiniEngine("AA", page_size=4, rank=1)
    other.prefill(toks)
    for lid in kv.layer_ids:  # rank 1's bytes in rank 0's tree
        for b in range(2):
            kv.bases[lid][b].copy_(other.pools["kv"].bases[lid][b])
    assert e.verify_tree() != []
    e.drop_device()


def test_free_indices_that_raises_reaches_the_committer(daemon, linker_factory):
    """The engine's allocator raising inside COMMIT: commit_load raises
    kvdock.CallbackError after the commit went through; the load still
    copies and completes."""
    e = MiniEngine("AA", page_size=4)
    specs = e.device_pools()
    real = specs[0].free_indices

    def flaky(indices):
        real(indices)
        raise RuntimeError("allocator says no")

    specs[0].free_indices = flaky
    a = KvdockUnifiedCacheLinker(device_pools=specs,
                                 linker=linker_factory(daemon, model_id="cb-test"))
    try:
        f = UnifiedLinkerFlow(e, a)
        toks = tokens(17, 33)
        store(e, f, toks)
        r = f.new_request(toks)
        f.match(r)
        assert f.begin(r)
        with pytest.raises(ValueError, match="recorded already"):  # one load per rid
            a.begin_load(r.rid, r.transfers)
        f.prepare(r)
        e.prefill(toks[:8])
        f.insert(r)
        with pytest.raises(kvdock.CallbackError) as info:
            f.commit(r)
        assert isinstance(info.value.__cause__, RuntimeError)
        assert a.load(r.rid, [])  # committed: load() confirms it
        r.state = "queued"
        got, _ = f.run_batch([r])
        assert got == {r.rid: True}
        assert_clean(e)
    finally:
        a.close()
