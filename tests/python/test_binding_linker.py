"""The binding, call by call, against real kvdockd daemons: open and close,
health, pools of each layout (namespaces and object sizes spelled out
here), page keys against a hashlib chain, lookup boundaries, the load
protocol with the bytes restored checked row by row against bytes derived
from each page's key, the completion queues, offload, per-pool counters.
"""

import re

import numpy as np
import pytest
import torch

import kvdock
from binding_util import (BUFFER_KINDS, PagedPool, SlotPool, load_all, namespace,
                          offload_and_wait, pop_until, sha_chain, tokens_of)

MIB = 1 << 20


# ------------------------------------------------------------- basics

def test_version_and_constants():
    assert re.fullmatch(r"\d+\.\d+\.\d+", kvdock.version())
    assert kvdock.PAGE_KEY_BYTES == 32
    assert kvdock.PAGED == "paged" and kvdock.SLOT == "slot"
    assert kvdock.strerror(-4) and kvdock.strerror(-4) != kvdock.strerror(-1)


@pytest.mark.parametrize("page_size", [1, 4, 64])
@pytest.mark.parametrize("source", ["list", "range", "np_uint32", "np_int64", "torch_int64",
                                    "torch_int32"])
def test_page_keys_match_an_independent_sha256_chain(page_size, source):
    toks = tokens_of(page_size, 3 * page_size + page_size // 2)  # a partial last page
    toks = [t & 0x7FFFFFFF for t in toks] if source.endswith("int32") else toks
    if source == "range":
        toks = list(range(1000, 1000 + len(toks)))
    given = {"list": lambda: toks, "range": lambda: range(1000, 1000 + len(toks)),
             "np_uint32": lambda: np.array(toks, np.uint32),
             "np_int64": lambda: np.array(toks, np.int64),
             "torch_int64": lambda: torch.tensor(toks, dtype=torch.int64),
             "torch_int32": lambda: torch.tensor(toks, dtype=torch.int32)}[source]()
    keys = kvdock.page_keys(given, page_size)
    assert keys == sha_chain(toks, page_size)
    assert len(keys) == 3 and all(isinstance(k, bytes) and len(k) == 32 for k in keys)


def test_page_keys_with_prior_continue_the_chain():
    toks = tokens_of(7, 6 * 4)
    whole = sha_chain(toks, 4)
    assert kvdock.page_keys(toks[8:], 4, prior=whole[1]) == whole[2:]
    anchor = bytes(range(32))
    assert kvdock.page_keys(toks, 4, prior=anchor) == sha_chain(toks, 4, prior=anchor)
    assert kvdock.page_keys(toks, 4, prior=bytearray(anchor)) == sha_chain(toks, 4, prior=anchor)
    assert kvdock.page_keys(toks, 4, prior=anchor) != whole
    assert kvdock.page_keys([], 4) == []
    assert kvdock.page_keys(toks[:3], 4) == []


@pytest.mark.parametrize("bad", [dict(page_size=0), dict(prior=b"short"),
                                 dict(tokens=[-1, 2, 3, 4]), dict(tokens=[1 << 32, 2, 3, 4])])
def test_page_keys_refuse_bad_arguments(bad):
    args = dict(tokens=[1, 2, 3, 4], page_size=4, prior=None)
    args.update(bad)
    with pytest.raises(kvdock.InvalidError) as ei:
        kvdock.page_keys(**args)
    assert ei.value.status == -1


def test_open_health_close_and_context_manager(daemon):
    with kvdock.Linker(socket_path=daemon.socket, model_id="m", timeout_ms=10000) as lk:
        assert not lk.closed
        state, pool_bytes = lk.health()
        assert state == "ready" and pool_bytes == 256 * MIB
    assert lk.closed
    lk.close()  # idempotent
    lk.close()
    assert lk.closed


def _every_call(lk, pool):
    keys = sha_chain(range(4), 4)
    t = kvdock.Transfer(pool, keys, indices=range(4))
    return {
        "health": lambda: lk.health(),
        "register_pool": lambda: lk.register_pool("x", {0: [np.zeros((8, 8), np.uint8)]}),
        "lookup": lambda: lk.lookup(1, [t]),
        "load": lambda: lk.load(1, [t]),
        "prepare": lambda: lk.prepare(1),
        "commit": lambda: lk.commit(1, [(0, 1)]),
        "abort": lambda: lk.abort(1),
        "start_layer_wise_loading": lambda: lk.start_layer_wise_loading(),
        "wait_layer": lambda: lk.wait_layer(1, 0),
        "pop_completed_loads": lambda: lk.pop_completed_loads(),
        "offload": lambda: lk.offload([t]),
        "pop_completed_offloads": lambda: lk.pop_completed_offloads(),
        "pool_stats": lambda: lk.pool_stats(pool),
        "Pool.stats": lambda: pool.stats(),
    }


def test_every_call_on_a_closed_linker_raises_closed_error(daemon):
    lk = kvdock.Linker(socket_path=daemon.socket, model_id="m", timeout_ms=10000)
    pool = PagedPool(lk).pool
    calls = _every_call(lk, pool)
    lk.close()
    for name, call in calls.items():
        with pytest.raises(kvdock.ClosedError) as ei:
            call()
        assert ei.value.status == -11, name
        assert ei.value.message, name


def test_with_block_closes_on_an_exception(daemon):
    with pytest.raises(RuntimeError):
        with kvdock.Linker(socket_path=daemon.socket, timeout_ms=10000) as lk:
            raise RuntimeError("the engine failed")
    assert lk.closed
    with pytest.raises(kvdock.ClosedError):
        lk.health()


# -------------------------------------------------- pools and namespaces

def test_pool_namespace_and_object_bytes_mha(daemon, linker_factory):
    # 3 layers, K and V of [rows, 8 heads, 128] bf16: 2 KiB a token row
    lk = linker_factory(daemon, model_id="llama")
    rows, ps = 256, 64
    k = [torch.zeros(rows, 8, 128, dtype=torch.bfloat16) for _ in range(3)]
    v = [torch.zeros(rows, 8, 128, dtype=torch.bfloat16) for _ in range(3)]
    pool = lk.register_pool("kv", {i: [k[i], v[i]] for i in range(3)}, page_size=ps)
    assert pool.object_bytes == ps * 3 * 2 * 8 * 128 * 2
    assert pool.namespace == namespace("llama", "kv", tp_rank=0) == "llama/kv/tp0"
    assert (pool.id, pool.name, pool.addressing, pool.page_size, pool.n_rows) == (
        0, "kv", kvdock.PAGED, ps, rows)
    assert pool.trailing_pages == 0 and pool.rank_replicated is False
    assert pool.layer_ids == [0, 1, 2]
    assert lk.pools == [pool]


def test_pool_namespace_and_object_bytes_mla_rank_replicated(daemon, linker_factory):
    # 4 layers of one 576-wide latent buffer (bf16), the same on every TP rank
    lk = linker_factory(daemon, model_id="dsv3", tp_rank=1, tp_size=4)
    kv = torch.zeros(4, 128, 1, 576, dtype=torch.bfloat16)  # [layers, rows, 1, 576]
    pool = lk.register_pool("kv", [(i, [kv[i]]) for i in range(4)], page_size=16,
                            rank_replicated=True)
    assert pool.object_bytes == 16 * 4 * 576 * 2
    assert pool.namespace == namespace("dsv3", "kv", replicated=True) == "dsv3/kv/rep"
    assert pool.rank_replicated is True


def test_pool_namespace_and_object_bytes_hybrid_mamba(daemon, linker_factory):
    # full-attention KV plus a mamba pool: per layer a temporal state
    # [slots, 4 heads, 16, 16] fp32 and a conv state [slots, 64, 3] bf16
    lk = linker_factory(daemon, model_id="qwen-next", tp_rank=1, tp_size=2)
    kv = lk.register_pool("kv", {0: [torch.zeros(64, 2, 16, dtype=torch.float16)]}, page_size=8)
    temporal = [torch.zeros(10, 4, 16, 16) for _ in range(3)]
    conv = [torch.zeros(10, 64, 3, dtype=torch.bfloat16) for _ in range(3)]
    mamba = lk.register_pool("mamba", {2 * i + 1: [temporal[i], conv[i]] for i in range(3)},
                             addressing=kvdock.SLOT, trailing_pages=1)
    assert kv.object_bytes == 8 * 2 * 16 * 2 and kv.namespace == "qwen-next/kv/tp1"
    assert mamba.object_bytes == 3 * (4 * 16 * 16 * 4 + 64 * 3 * 2)
    assert mamba.namespace == namespace("qwen-next", "mamba", tp_rank=1)
    assert (mamba.addressing, mamba.n_rows, mamba.trailing_pages) == (kvdock.SLOT, 10, 1)
    assert [p.id for p in lk.pools] == [kv.id, mamba.id] and kv.id != mamba.id


def test_pool_namespace_carries_cp_and_pp_ranks(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m", tp_rank=1, tp_size=2, cp_rank=1, cp_size=2,
                        pp_rank=2, pp_size=4)
    a = lk.register_pool("kv", {0: [np.zeros((8, 16), np.uint8)]})
    b = lk.register_pool("idx", {0: [np.zeros((8, 16), np.uint8)]}, rank_replicated=True)
    assert a.namespace == namespace("m", "kv", tp_rank=1, cp=1, pp=2) == "m/kv/tp1.cp1.pp2"
    assert b.namespace == namespace("m", "idx", replicated=True, cp=1, pp=2)


def test_register_pool_takes_layers_as_a_list_and_explicit_n_rows(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    a, b = np.zeros((32, 16), np.uint8), np.zeros((40, 16), np.uint8)
    pool = lk.register_pool("kv", [(5, [a]), (9, (b,))], page_size=2, n_rows=32)
    assert pool.n_rows == 32 and pool.layer_ids == [5, 9]
    assert pool.object_bytes == 2 * (16 + 16)
    one = lk.register_pool("single", {3: a})  # one buffer, not in a list
    assert one.object_bytes == 16 and one.page_size == 1


# -------------------------------------------------- the load protocol

@pytest.mark.parametrize("kind", BUFFER_KINDS)
def test_offload_lookup_load_restores_every_byte(daemon, linker_factory, kind):
    lk = linker_factory(daemon, model_id="rt-" + kind)
    kv = PagedPool(lk, kind=kind, layers=2, n_buf=2, n_rows=64, bpr=32, ps=4)
    st = SlotPool(lk, kind=kind, layers=1, n_slots=8)
    toks = tokens_of(1, 16)
    keys = sha_chain(toks, 4)
    # the prefill wrote the prompt's pages into rows 8..23, its state into slot 3
    kv.fill_pages(keys, 8)
    st.fill_slot(keys[-1], 3)
    assert offload_and_wait(lk, [kvdock.Transfer(kv.pool, keys, indices=kv.indices(8, 4)),
                                 kvdock.Transfer(st.pool, keys[-1:], indices=[3],
                                                 first_depth=3)]) is True
    kv.wipe()
    st.wipe()
    # every boundary restorable in both pools: the state exists at page 4 only
    assert lk.lookup(7, [kvdock.Transfer(kv.pool, keys), kvdock.Transfer(st.pool, keys)]) == [4]
    assert lk.lookup(8, [kvdock.Transfer(kv.pool, keys)]) == [1, 2, 3, 4]
    # back into other rows (32..47) and slot 6
    assert load_all(lk, 7, [kvdock.Transfer(kv.pool, keys, indices=kv.indices(32, 4)),
                            kvdock.Transfer(st.pool, keys[-1:], indices=[6])],
                    [kvdock.Commit(0, 4), kvdock.Commit()], [0, 1, 2]) is True
    kv.check_pages(keys, lambda i: 32 + 4 * i)
    st.check_slot(keys[-1], 6)
    kv.check_zero([r for r in range(64) if not 32 <= r < 48])
    st.check_zero([s for s in range(8) if s != 6])
    assert kv.freed == [] and st.freed == []  # all adopted: nothing handed back
    obj = kv.object_bytes()
    assert kv.pool.stats() == dict(lookup_hit_pages=8, load_bytes=4 * obj, offload_bytes=4 * obj,
                                   load_failures=0, offload_failures=0, memory="host",
                                   pinned=False, dma_bytes=0, bounce_bytes=0)
    s = lk.pool_stats(st.pool)
    assert s["load_bytes"] == st.object_bytes() == s["offload_bytes"]
    assert s["lookup_hit_pages"] > 0 and s["load_failures"] == 0


def test_lookup_reports_every_boundary_of_the_stored_prefix(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=1, n_buf=1, n_rows=64, bpr=16, ps=4)
    keys = sha_chain(tokens_of(2, 32), 4)  # 8 pages
    kv.fill_pages(keys[:6], 0)
    # two offloads of one chain: pages 0..2, then 3..5 after prior keys[2]
    assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys[:3], indices=kv.indices(0, 3)))
    assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys[3:6], indices=kv.indices(12, 3),
                                                first_depth=3, prior_key=keys[2]))
    assert lk.lookup(1, [kvdock.Transfer(kv.pool, keys)]) == [1, 2, 3, 4, 5, 6]
    assert lk.lookup(2, [kvdock.Transfer(kv.pool, keys[:2])]) == [1, 2]
    # a page missing in the middle cuts every boundary after it (ALL_PAGES)
    holed = keys[:2] + [bytes(32)] + keys[3:]
    assert lk.lookup(3, [kvdock.Transfer(kv.pool, holed)]) == [1, 2]
    assert lk.lookup(4, [kvdock.Transfer(kv.pool, sha_chain(tokens_of(3, 8), 4))]) == []
    # keys as one block of n*32 bytes and as an (n, 32) uint8 array
    assert lk.lookup(5, [kvdock.Transfer(kv.pool, b"".join(keys))]) == [1, 2, 3, 4, 5, 6]
    arr = np.frombuffer(b"".join(keys), np.uint8).reshape(-1, 32)
    assert lk.lookup(6, kvdock.Transfer(kv.pool, arr)) == [1, 2, 3, 4, 5, 6]
    assert lk.lookup(7, kvdock.Transfer(kv.pool.id, torch.from_numpy(arr.copy()))) == [
        1, 2, 3, 4, 5, 6]
    # a tuple, a generator, bytearrays and 32-byte numpy rows
    assert lk.lookup(8, [kvdock.Transfer(kv.pool, tuple(keys))]) == [1, 2, 3, 4, 5, 6]
    assert lk.lookup(9, [kvdock.Transfer(kv.pool, (k for k in keys))]) == [1, 2, 3, 4, 5, 6]
    assert lk.lookup(10, [kvdock.Transfer(kv.pool, [bytearray(k) for k in keys])]) == [
        1, 2, 3, 4, 5, 6]
    assert lk.lookup(11, [kvdock.Transfer(kv.pool, list(arr))]) == [1, 2, 3, 4, 5, 6]
    assert kv.pool.stats()["lookup_hit_pages"] == 6 + 2 + 2 + 0 + 6 * 7


def test_lookup_with_a_trailing_window_pool(daemon, linker_factory):
    # a sliding-window pool (trailing 2 pages) holding only pages 2..5, and
    # mamba states at pages 3 and 6 (a node ends there)
    lk = linker_factory(daemon, model_id="m")
    full = PagedPool(lk, layers=1, n_buf=1, bpr=16, ps=4, name="kv")
    swa = PagedPool(lk, layers=1, n_buf=1, bpr=16, ps=4, name="swa", layer_ids=[1],
                    trailing_pages=2)
    st = SlotPool(lk, n_slots=4, layer_ids=[3])
    keys = sha_chain(tokens_of(4, 24), 4)  # 6 pages
    full.fill_pages(keys, 0)
    swa.fill_pages(keys[2:], 0)
    st.fill_slot(keys[2], 0)
    st.fill_slot(keys[5], 1)
    assert offload_and_wait(lk, [
        kvdock.Transfer(full.pool, keys, indices=full.indices(0, 6)),
        kvdock.Transfer(swa.pool, keys[2:], indices=swa.indices(0, 4), first_depth=2,
                        prior_key=keys[1]),
        kvdock.Transfer(st.pool, [keys[2], keys[5]], indices=[0, 1], depths=[2, 5])])
    t = lambda p: kvdock.Transfer(p, keys)  # noqa: E731
    assert lk.lookup(1, [t(full.pool)]) == [1, 2, 3, 4, 5, 6]
    # b restorable for swa when pages b-2, b-1 are stored: b = 4, 5, 6
    assert lk.lookup(2, [t(swa.pool)]) == [4, 5, 6]
    assert lk.lookup(3, [t(st.pool)]) == [3, 6]
    assert lk.lookup(4, [t(full.pool), t(swa.pool), t(st.pool)]) == [6]
    assert lk.lookup(5, [t(full.pool), t(st.pool)]) == [3, 6]


def test_commit_of_an_adopted_range_frees_the_rest_and_copies_only_it(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=2, n_buf=2, n_rows=64, bpr=32, ps=4)
    keys = sha_chain(tokens_of(5, 16), 4)
    kv.fill_pages(keys, 0)
    assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys, indices=kv.indices(0, 4)))
    kv.wipe()
    # the tree already had pages 0 and 3: it adopted [1, 3)
    dst = kv.indices(40, 4)
    assert load_all(lk, 11, kvdock.Transfer(kv.pool, keys, indices=dst), [(1, 3)], [0, 2])
    assert sorted(kv.freed) == dst[0:4] + dst[12:16]
    kv.check_pages(keys[1:3], lambda i: 44 + 4 * i)
    kv.check_zero(list(range(40, 44)) + list(range(52, 56)))
    assert kv.pool.stats()["load_bytes"] == 2 * kv.object_bytes()


def test_commit_with_mamba_exist_drops_the_slot_without_freeing_it(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=1, n_buf=2, bpr=16, ps=4)
    st = SlotPool(lk, n_slots=4, layer_ids=[1])
    keys = sha_chain(tokens_of(6, 8), 4)
    kv.fill_pages(keys, 0)
    st.fill_slot(keys[1], 0)
    assert offload_and_wait(lk, [kvdock.Transfer(kv.pool, keys, indices=kv.indices(0, 2)),
                                 kvdock.Transfer(st.pool, keys[1:], indices=[0], first_depth=1)])
    kv.wipe()
    st.wipe()
    ok = load_all(lk, 12, [kvdock.Transfer(kv.pool, keys, indices=kv.indices(16, 2)),
                           kvdock.Transfer(st.pool, keys[1:], indices=[2])],
                  [(0, 2), (0, 0, True)], [0, 1])
    assert ok is True
    kv.check_pages(keys, lambda i: 16 + 4 * i)
    st.check_zero(range(4))  # the tree's own state stays as it is
    assert st.freed == [] and kv.freed == []  # the tree owns slot 2: no double free
    assert st.pool.stats()["load_bytes"] == 0


def test_abort_hands_every_index_back(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=1, n_buf=1, bpr=16, ps=4)
    st = SlotPool(lk, n_slots=4, layer_ids=[1])
    keys = sha_chain(tokens_of(7, 8), 4)
    kv.fill_pages(keys, 0)
    st.fill_slot(keys[1], 1)
    assert offload_and_wait(lk, [kvdock.Transfer(kv.pool, keys, indices=kv.indices(0, 2)),
                                 kvdock.Transfer(st.pool, keys[1:], indices=[1], first_depth=1)])
    kv.wipe()
    st.wipe()
    lk.load(13, [kvdock.Transfer(kv.pool, keys, indices=kv.indices(24, 2)),
                 kvdock.Transfer(st.pool, keys[1:], indices=[3])])
    lk.prepare(13)
    lk.abort(13)
    assert sorted(kv.freed) == kv.indices(24, 2) and st.freed == [3]
    kv.check_zero(range(64))
    counter = lk.start_layer_wise_loading()  # nothing committed: an empty batch
    lk.wait_layer(counter, 0)
    assert lk.pop_completed_loads() == []  # an aborted load never completes


def test_both_completion_queues_return_each_id_once(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=1, n_buf=2, n_rows=128, bpr=16, ps=4)
    prompts = [sha_chain(tokens_of(100 + i, 8), 4) for i in range(4)]
    for i, keys in enumerate(prompts):
        kv.fill_pages(keys, 8 * i)
    acks = [lk.offload(kvdock.Transfer(kv.pool, keys, indices=kv.indices(8 * i, 2)))
            for i, keys in enumerate(prompts)]
    assert len(set(acks)) == 4 and all(isinstance(a, int) for a in acks)
    assert pop_until(lambda: lk.pop_completed_offloads(max=1), acks) == {a: True for a in acks}
    assert lk.pop_completed_offloads() == [] and lk.pop_completed_offloads(max=0) == []
    kv.wipe()
    rids = [2 ** 63 + 5, 0, 17, 2 ** 64 - 1]  # rids are uint64
    for i, (rid, keys) in enumerate(zip(rids, prompts)):
        lk.load(rid, kvdock.Transfer(kv.pool, keys, indices=kv.indices(64 + 8 * i, 2)))
        lk.commit(rid, [kvdock.Commit(0, 2)])
    counter = lk.start_layer_wise_loading()
    lk.wait_layer(counter, 0)
    assert pop_until(lambda: lk.pop_completed_loads(max=3), rids) == {r: True for r in rids}
    assert lk.pop_completed_loads() == [] and lk.pop_completed_loads(max=0) == []
    for i, keys in enumerate(prompts):
        kv.check_pages(keys, lambda p, i=i: 64 + 8 * i + 4 * p)


def test_layer_wise_waits_with_layer_groups(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m", layer_group_size=2, spin_us=-1)
    kv = PagedPool(lk, layers=5, n_buf=2, n_rows=32, bpr=64, ps=4)
    keys = sha_chain(tokens_of(9, 12), 4)
    kv.fill_pages(keys, 0)
    assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys, indices=kv.indices(0, 3)))
    kv.wipe()
    lk.load(3, kvdock.Transfer(kv.pool, keys, indices=kv.indices(16, 3)))
    lk.commit(3, [(0, 3)])
    counter = lk.start_layer_wise_loading()
    for layer in reversed(range(10)):  # any order; odd ids are in no pool: at once
        lk.wait_layer(counter, layer)
    assert pop_until(lk.pop_completed_loads, [3]) == {3: True}
    kv.check_pages(keys, lambda i: 16 + 4 * i)
    # an empty batch: every wait returns at once
    empty = lk.start_layer_wise_loading()
    assert empty != counter
    lk.wait_layer(empty, 0)


def test_lazy_pool_mapping_still_restores(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m", lazy_pool_mapping=True, client_name="lazy")
    kv = PagedPool(lk, layers=1, n_buf=1, bpr=128, ps=8)
    keys = sha_chain(tokens_of(10, 16), 8)
    kv.fill_pages(keys, 0)
    assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys, indices=kv.indices(0, 2)))
    kv.wipe()
    assert load_all(lk, 1, kvdock.Transfer(kv.pool, keys, indices=kv.indices(32, 2)), [(0, 2)],
                    [0])
    kv.check_pages(keys, lambda i: 32 + 8 * i)


def test_ranks_share_a_rank_replicated_pool_and_not_a_per_rank_one(daemon, linker_factory):
    r0 = linker_factory(daemon, model_id="m", tp_rank=0, tp_size=2)
    r1 = linker_factory(daemon, model_id="m", tp_rank=1, tp_size=2)
    mla0 = PagedPool(r0, layers=2, n_buf=1, bpr=32, ps=4, name="mla", rank_replicated=True)
    mha0 = PagedPool(r0, layers=2, n_buf=2, bpr=32, ps=4, name="mha")
    mla1 = PagedPool(r1, layers=2, n_buf=1, bpr=32, ps=4, name="mla", rank_replicated=True)
    mha1 = PagedPool(r1, layers=2, n_buf=2, bpr=32, ps=4, name="mha")
    assert mla0.pool.namespace == mla1.pool.namespace == "m/mla/rep"
    assert (mha0.pool.namespace, mha1.pool.namespace) == ("m/mha/tp0", "m/mha/tp1")
    keys = sha_chain(tokens_of(11, 12), 4)
    mla0.fill_pages(keys, 0)
    mha0.fill_pages(keys, 0)
    assert offload_and_wait(r0, [kvdock.Transfer(mla0.pool, keys, indices=mla0.indices(0, 3)),
                                 kvdock.Transfer(mha0.pool, keys, indices=mha0.indices(0, 3))])
    assert r1.lookup(1, [kvdock.Transfer(mla1.pool, keys)]) == [1, 2, 3]
    assert r1.lookup(1, [kvdock.Transfer(mha1.pool, keys)]) == []
    # rank 1 loads what rank 0 stored, byte for byte
    assert load_all(r1, 1, kvdock.Transfer(mla1.pool, keys, indices=mla1.indices(20, 3)),
                    [(0, 3)], [0, 2])
    mla1.check_pages(keys, lambda i: 20 + 4 * i)


def test_a_read_only_linker_loads_and_its_offloads_fail(daemon, linker_factory):
    rw = linker_factory(daemon, model_id="m")
    ro = linker_factory(daemon, model_id="m", read_only=True)
    a = PagedPool(rw, layers=1, n_buf=1, bpr=16, ps=4)
    b = PagedPool(ro, layers=1, n_buf=1, bpr=16, ps=4)
    keys = sha_chain(tokens_of(12, 8), 4)
    a.fill_pages(keys, 0)
    assert offload_and_wait(rw, kvdock.Transfer(a.pool, keys, indices=a.indices(0, 2)))
    assert load_all(ro, 5, kvdock.Transfer(b.pool, keys, indices=b.indices(8, 2)), [(0, 2)], [0])
    b.check_pages(keys, lambda i: 8 + 4 * i)
    other = sha_chain(tokens_of(13, 8), 4)
    b.fill_pages(other, 0)
    assert offload_and_wait(ro, kvdock.Transfer(b.pool, other, indices=b.indices(0, 2))) is False
    assert b.pool.stats()["offload_failures"] == 1
    assert rw.lookup(1, [kvdock.Transfer(a.pool, other)]) == []


def test_pool_stats_by_pool_and_by_id(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=1, n_buf=1, bpr=16, ps=4)
    zero = dict(lookup_hit_pages=0, load_bytes=0, offload_bytes=0, load_failures=0,
                offload_failures=0, memory="host", pinned=False, dma_bytes=0, bounce_bytes=0)
    assert lk.pool_stats(kv.pool) == lk.pool_stats(kv.pool.id) == kv.pool.stats() == zero
    keys = sha_chain(tokens_of(14, 8), 4)
    kv.fill_pages(keys, 0)
    assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys, indices=kv.indices(0, 2)))
    assert lk.pool_stats(kv.pool.id)["offload_bytes"] == 2 * kv.object_bytes()


def test_a_transfer_given_again_and_one_changed_between_calls(daemon, linker_factory):
    # the binding keeps each Transfer's C struct between calls: a field set
    # anew must be what the next call sees
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=1, n_buf=1, n_rows=64, bpr=16, ps=4)
    stored = sha_chain(tokens_of(15, 8), 4)
    other = sha_chain(tokens_of(16, 8), 4)
    kv.fill_pages(stored, 0)
    assert offload_and_wait(lk, kvdock.Transfer(kv.pool, stored, indices=kv.indices(0, 2)))
    t = kvdock.Transfer(kv.pool, stored)
    assert [lk.lookup(i, [t]) for i in range(3)] == [[1, 2]] * 3
    t.keys = b"".join(other)
    assert lk.lookup(4, [t]) == [] and lk.lookup(5, t) == []
    t.keys = b"".join(stored)
    assert lk.lookup(6, [t, kvdock.Transfer(kv.pool, stored)]) == [1, 2]  # in an array of two
    kv.wipe()
    load = kvdock.Transfer(kv.pool, stored, indices=kv.indices(40, 2))
    load.indices = np.array(kv.indices(24, 2), np.int64)  # the engine chose other rows
    assert load_all(lk, 7, load, [(0, 2)], [0])
    kv.check_pages(stored, lambda i: 24 + 4 * i)
    kv.check_zero(range(40, 48))
