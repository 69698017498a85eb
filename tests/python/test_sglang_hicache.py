"""The SGLang HiCache storage backend (kvdock.sglang.hicache): its interface
against SGLang's (restated in sglang_hicache_iface.py), and restores
driven in the HiCache controller's order (sglang_hicache_engine.py) through
a real kvdockd, checked byte by byte against what the host pool held."""

import hashlib
import os
import time

import pytest
import torch

import kvdock
from kvdock import engine
from kvdock.sglang import hicache
from kvdock.sglang.hicache import KvdockHiCacheStorage

import sglang_hicache_iface as iface
from sglang_hicache_engine import (MHAHostPool, MLAHostPool, HiCacheDriver, get_hash_str,
                                   page_hashes, storage_config)

LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


@pytest.fixture
def backends():
    made = []

    def make(daemon, pool=None, **kw):
        be = KvdockHiCacheStorage(storage_config(daemon.socket, **kw), {})
        made.append(be)
        if pool is not None:
            be.register_mem_pool_host(pool)
        return be

    yield make
    for be in made:
        be.close()


def make_pool(kind, layout, n_pages=640, page_size=4, layers=3, attr="k_buffer"):
    if kind == "mha":
        return MHAHostPool(layers, n_pages, page_size, head_num=2, head_dim=8, layout=layout)
    return MLAHostPool(layers, n_pages, page_size, kv_dim=24, layout=layout, attr=attr)


def tokens(n, base=0):
    return [(base * 7919 + i * 31 + 5) % 50000 for i in range(n)]


def same_pages(pool, src_idx, dst_idx, n_pages):
    """Page p at src_idx equals page p at dst_idx, byte for byte."""
    ps = pool.page_size
    for p in range(n_pages):
        a = pool.page_bytes(int(src_idx[p * ps]))
        b = pool.page_bytes(int(dst_idx[p * ps]))
        if a != b:
            return "page %d differs" % p
    return None


# ------------------------------------------------------------- interface

def test_methods_match_sglang_abc():
    assert iface.interface_mismatches(KvdockHiCacheStorage) == []
    assert issubclass(KvdockHiCacheStorage, hicache.HiCacheStorage)
    assert not getattr(KvdockHiCacheStorage, "__abstractmethods__", set())
    for name in iface.ABSTRACT:
        assert name in vars(KvdockHiCacheStorage), name


def test_interface_check_catches_drift():
    # the checker itself: a missing method and changed parameters are found
    missing = type("Missing", (), {k: v for k, v in vars(KvdockHiCacheStorage).items()
                                   if k != "batch_exists"})
    assert any(m.startswith("batch_exists:") for m in iface.interface_mismatches(missing))

    class Renamed(KvdockHiCacheStorage):
        def batch_get_v1(self, keys, host_indices, info=None):
            return []

    assert any(m.startswith("batch_get_v1:") for m in iface.interface_mismatches(Renamed))


def test_dataclasses_and_enums_match_sglang():
    for name in iface.FIELDS:
        assert iface.field_mismatches(getattr(hicache, name), name) == []
    assert {m.name: m.value for m in hicache.PoolName} == iface.POOL_NAMES
    assert {m.name: m.value for m in hicache.PoolHitPolicy} == iface.HIT_POLICIES
    assert hicache.SGLANG_COMMIT == iface.SGLANG_COMMIT


@pytest.mark.parametrize("module_path", ["kvdock.sglang.hicache", "kvdock.sglang"])
def test_dynamic_loader_builds_it(daemon, module_path):
    sc = storage_config(daemon.socket, module_path=module_path)
    be = iface.create_dynamic_backend(sc.extra_config, sc, hicache.HiCacheStorage)
    try:
        assert isinstance(be, KvdockHiCacheStorage)
        be.register_mem_pool_host(make_pool("mha", "layer_first", n_pages=8))
        assert be.batch_exists(page_hashes(tokens(16), 4)) == 0
    finally:
        be.close()


def test_page_hashes_are_kvdock_page_keys():
    toks = tokens(64)
    assert [bytes.fromhex(h) for h in page_hashes(toks, 16)] == kvdock.page_keys(toks, 16)
    h = get_hash_str(toks[:16])
    assert hicache.page_key(h) == bytes.fromhex(h)
    # keys that are not hex digests are hashed, and stay distinct
    a, b = hicache.page_key("x-1"), hicache.page_key("x-2")
    assert len(a) == 32 and a != b and a == hicache.page_key("x-1")


def test_backend_is_built_on_kvdock_engine():
    # one key policy, one completion queue, one log for every adapter: the
    # backend keeps no copies of its own
    assert hicache.page_key is engine.page_key
    assert hicache.Completions is engine.Completions
    assert hicache.RateLimitedLog is engine.RateLimitedLog
    for own in ("page_key_bytes", "_Completions", "_RateLimitedLog"):
        assert not hasattr(hicache, own), own


def test_non_hex_keys_are_stored_under_engine_page_key(daemon, backends, linker_factory):
    # a key that is not a hex digest lands where every other kvdock adapter
    # looks for that string: SHA-256 of it
    pool = make_pool("mha", "layer_first", n_pages=16, layers=2)
    be = backends(daemon, pool)
    keys = ["lora7-page-%d" % i for i in range(3)]
    assert be.batch_set_v1(keys, pool.alloc(3 * 4)) == [True] * 3
    raw = [hashlib.sha256(k.encode()).digest() for k in keys]
    assert be._present(be._kv, raw)[0] == 3
    assert be.batch_exists(keys) == 3


# ---------------------------------------------------------------- restore

@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_backup_then_prefetch_restores_bytes(daemon, backends, kind, layout):
    pool = make_pool(kind, layout)
    pool.fill_random(torch.Generator().manual_seed(11))
    be = backends(daemon, pool, mla=kind == "mla", layout=layout)
    drv = HiCacheDriver(be, pool)
    n_pages = 300  # three storage batches: 128, 128, 44
    toks = tokens(n_pages * pool.page_size)
    src = pool.alloc(len(toks))
    assert drv.backup(src, toks) == n_pages
    # a second backup of the same pages writes nothing new: all exist
    assert be.batch_exists(page_hashes(toks, pool.page_size)[:128]) == 128

    got, dst = drv.prefetch(toks)
    assert got == n_pages
    assert set(dst.tolist()).isdisjoint(src.tolist())  # fresh host slots
    assert same_pages(pool, src, dst, n_pages) is None


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_older_mla_buffer_name_and_object_size(daemon, backends, kind):
    # older SGLang names the MLA buffer kv_buffer; the object is one page of
    # every layer and component
    pool = make_pool(kind, "layer_first", n_pages=16, attr="kv_buffer")
    pool.fill_random(torch.Generator().manual_seed(3))
    be = backends(daemon, pool, mla=kind == "mla")
    elem = 2 * 2 * 8 if kind == "mha" else 24  # K and V of 2 heads x 8, or 24
    assert be.pool_stats()["kv"]["load_bytes"] == 0
    assert be._kv.pool.object_bytes == 3 * pool.page_size * elem * 2  # layers, tokens, bf16
    drv = HiCacheDriver(be, pool)
    toks = tokens(8 * pool.page_size, base=1)
    src = pool.alloc(len(toks))
    assert drv.backup(src, toks) == 8
    got, dst = drv.prefetch(toks)
    assert got == 8 and same_pages(pool, src, dst, 8) is None
    assert be.pool_stats()["kv"]["load_bytes"] == 8 * be._kv.pool.object_bytes


def test_partial_hit_is_the_stored_prefix(daemon, backends):
    pool = make_pool("mha", "page_first")
    pool.fill_random(torch.Generator().manual_seed(5))
    be = backends(daemon, pool)
    drv = HiCacheDriver(be, pool)
    ps = pool.page_size
    stored = tokens(10 * ps, base=2)
    src = pool.alloc(len(stored))
    assert drv.backup(src, stored) == 10
    # the same prefix, then 6 pages never stored
    longer = stored + tokens(6 * ps, base=3)
    assert be.batch_exists(page_hashes(longer, ps)) == 10
    got, dst = drv.prefetch(longer)
    assert got == 10 and same_pages(pool, src, dst, 10) is None
    # an unknown first page: nothing, whatever follows
    assert be.batch_exists(page_hashes(tokens(4 * ps, base=9) + stored, ps)) == 0


def test_page_evicted_after_exists_loads_the_prefix_before_it(daemon, backends):
    pool = make_pool("mha", "layer_first")
    pool.fill_random(torch.Generator().manual_seed(6))
    be = backends(daemon, pool)
    drv = HiCacheDriver(be, pool)
    ps = pool.page_size
    toks = tokens(10 * ps, base=4)
    src = pool.alloc(len(toks))
    assert drv.backup(src, toks) == 10
    hashes = page_hashes(toks, ps)
    assert be.batch_exists(hashes) == 10
    # page 6 goes between the engine's exists and its get
    daemon.cli("evict", "--key", hashes[6], "--namespace", be.namespaces()[0])
    dst = pool.alloc(10 * ps)
    res = be.batch_get_v1(hashes, dst)
    assert res == [True] * 6 + [False] * 4
    assert same_pages(pool, src, dst, 6) is None
    # prefix semantics: the pages after the hole do not count
    assert be.batch_exists(hashes) == 6


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_a_page_restores_into_another_layout(daemon, backends, kind):
    # the stored object is layout-free: layer_first in, page_first_direct out
    a = make_pool(kind, "layer_first", n_pages=32)
    a.fill_random(torch.Generator().manual_seed(8))
    b = make_pool(kind, "page_first_direct", n_pages=32)
    be_a = backends(daemon, a, mla=kind == "mla")
    be_b = backends(daemon, b, mla=kind == "mla")
    ps = a.page_size
    toks = tokens(12 * ps, base=5)
    src = a.alloc(len(toks))
    assert HiCacheDriver(be_a, a).backup(src, toks) == 12
    got, dst = HiCacheDriver(be_b, b).prefetch(toks)
    assert got == 12
    comps_a = [a.kv_buffer[0], a.kv_buffer[1]] if kind == "mha" else [a.buf()]
    comps_b = [b.kv_buffer[0], b.kv_buffer[1]] if kind == "mha" else [b.buf()]
    for p in range(12):
        s, d = int(src[p * ps]), int(dst[p * ps]) // ps
        for ca, cb in zip(comps_a, comps_b):
            for layer in range(a.layer_num):
                assert torch.equal(ca[layer, s:s + ps], cb[d, layer]), (p, layer)


def test_mla_is_stored_once_across_tp_ranks(daemon, backends):
    r0, r1 = make_pool("mla", "page_first"), make_pool("mla", "page_first")
    r0.fill_random(torch.Generator().manual_seed(9))
    be0 = backends(daemon, r0, mla=True, tp_rank=0, tp_size=2)
    be1 = backends(daemon, r1, mla=True, tp_rank=1, tp_size=2)
    assert be0.namespaces() == be1.namespaces() == ["test-model/kv/rep"]
    ps = r0.page_size
    toks = tokens(20 * ps, base=6)
    src = r0.alloc(len(toks))
    assert HiCacheDriver(be0, r0).backup(src, toks) == 20  # TP0 backs MLA up alone
    got, dst = HiCacheDriver(be1, r1).prefetch(toks)
    assert got == 20
    for p in range(20):
        assert r0.page_bytes(int(src[p * ps])) == r1.page_bytes(int(dst[p * ps])), p


def test_mha_ranks_keep_their_own_pages(daemon, backends):
    r0, r1 = make_pool("mha", "page_first"), make_pool("mha", "page_first")
    r0.fill_random(torch.Generator().manual_seed(10))
    be0 = backends(daemon, r0, tp_rank=0, tp_size=2)
    be1 = backends(daemon, r1, tp_rank=1, tp_size=2)
    assert be0.namespaces() == ["test-model@tp2/kv/tp0"]
    assert be1.namespaces() == ["test-model@tp2/kv/tp1"]
    toks = tokens(5 * r0.page_size, base=7)
    assert HiCacheDriver(be0, r0).backup(r0.alloc(len(toks)), toks) == 5
    assert be1.batch_exists(page_hashes(toks, r0.page_size)) == 0


# ------------------------------------------------ the generic page path

def test_generic_path_reads_and_writes_the_same_objects(daemon, backends):
    pool = make_pool("mha", "page_first", n_pages=600)
    pool.fill_random(torch.Generator().manual_seed(12))
    # a staging buffer of 3 pages: batches go through it in chunks
    be = backends(daemon, pool, staging_mb=3 * pool.get_size_per_token() * pool.page_size
                  / (1 << 20))
    ps = pool.page_size
    toks = tokens(7 * ps, base=8)
    hashes = page_hashes(toks, ps)
    src = pool.alloc(len(toks))
    # written as flat pages (the controller's _generic_page_set)...
    pages = [pool.get_data_page(int(src[i * ps])) for i in range(7)]
    assert be.batch_set(hashes, pages) is True
    assert be.exists(hashes[6]) and be.batch_exists(hashes) == 7
    # ...read zero-copy
    dst = pool.alloc(len(toks))
    assert be.batch_get_v1(hashes, dst) == [True] * 7
    assert same_pages(pool, src, dst, 7) is None

    # written zero-copy, read as flat pages (_generic_page_get)
    toks2 = tokens(5 * ps, base=9)
    h2 = page_hashes(toks2, ps)
    src2 = pool.alloc(len(toks2))
    assert be.batch_set_v1(h2, src2) == [True] * 5
    dummies = [pool.get_dummy_flat_data_page() for _ in range(6)]
    got = be.batch_get(h2 + [get_hash_str(tokens(ps, base=99))], dummies)
    assert got[5] is None
    dst2 = pool.alloc(5 * ps)
    for i in range(5):
        assert got[i] is dummies[i]
        pool.set_from_flat_data_page(int(dst2[i * ps]), got[i])
    assert same_pages(pool, src2, dst2, 5) is None
    # one key at a time
    one = be.get(h2[0])
    assert torch.equal(one, pool.get_data_page(int(src2[0])))
    assert be.set(get_hash_str(tokens(ps, base=50)), pool.get_data_page(int(src2[1])))
    assert be.get(get_hash_str(tokens(ps, base=51))) is None
    assert be.set(get_hash_str(tokens(ps, base=52)), torch.zeros(3)) is False  # not a page


# ------------------------------------------------------ stats and clear

def test_get_stats_counts_pages_and_drains(daemon, backends):
    pool = make_pool("mla", "layer_first")
    pool.fill_random(torch.Generator().manual_seed(13))
    be = backends(daemon, pool, mla=True)
    assert be.get_stats().prefetch_pgs == []
    drv = HiCacheDriver(be, pool)
    toks = tokens(150 * pool.page_size, base=10)
    assert drv.backup(pool.alloc(len(toks)), toks) == 150
    assert drv.prefetch(toks)[0] == 150
    st = be.get_stats()
    assert isinstance(st, hicache.StorageMetrics)
    assert sorted(st.backup_pgs) == [22, 128] and sorted(st.prefetch_pgs) == [22, 128]
    assert len(st.prefetch_bandwidth) == 2 and all(b > 0 for b in st.prefetch_bandwidth)
    again = be.get_stats()
    assert again.prefetch_pgs == [] and again.backup_pgs == []
    ps = be.pool_stats()["kv"]
    assert ps["offload_bytes"] == ps["load_bytes"] == 150 * be._kv.pool.object_bytes


def test_clear_drops_what_this_backend_stored(daemon, backends):
    pool = make_pool("mha", "layer_first")
    pool.fill_random(torch.Generator().manual_seed(14))
    cli = os.path.join(os.environ["KVDOCK_BUILD"], "cli", "kvdock")
    be = backends(daemon, pool, kvdock_cli=cli)
    other_pool = make_pool("mha", "layer_first")
    other = backends(daemon, other_pool, model="other-model")
    drv, odrv = HiCacheDriver(be, pool), HiCacheDriver(other, other_pool)
    toks = tokens(9 * pool.page_size, base=11)
    assert drv.backup(pool.alloc(len(toks)), toks) == 9
    assert odrv.backup(other_pool.alloc(len(toks)), toks) == 9
    assert be.clear() is True
    hashes = page_hashes(toks, pool.page_size)
    assert be.batch_exists(hashes) == 0
    assert other.batch_exists(hashes) == 9  # another model's pages stay
    assert drv.backup(pool.alloc(len(toks)), toks) == 9  # and it stores again


def test_objects_are_kvdock_objects_any_client_reads(daemon, backends, linker_factory):
    # what the backend stores is kvdock's object (layer by layer, K then V,
    # the page's token rows): a plain linker of the same model and rank,
    # with its own layer_first tensors, loads it
    pool = make_pool("mha", "page_first", n_pages=16)
    pool.fill_random(torch.Generator().manual_seed(15))
    be = backends(daemon, pool)
    ps = pool.page_size
    toks = tokens(3 * ps, base=12)
    src = pool.alloc(len(toks))
    assert HiCacheDriver(be, pool).backup(src, toks) == 3

    k = torch.zeros(3, 8 * ps, 2, 8, dtype=torch.bfloat16)  # layers, tokens, heads, dim
    v = torch.zeros_like(k)
    lk = linker_factory(daemon, model_id="test-model@tp1")
    kv = lk.register_pool("kv", {layer: [k[layer], v[layer]] for layer in range(3)},
                          page_size=ps)
    keys = kvdock.page_keys(toks, ps)
    dst = torch.arange(2 * ps, 5 * ps)
    lk.load(1, [kvdock.Transfer(kv, keys, indices=dst)])
    lk.prepare(1)
    lk.commit(1, [(0, 3)])
    counter = lk.start_layer_wise_loading()
    for layer in range(3):
        lk.wait_layer(counter, layer)
    deadline = time.monotonic() + 60
    done = lk.pop_completed_loads()
    while not done and time.monotonic() < deadline:
        time.sleep(0.001)
        done = lk.pop_completed_loads()
    assert done == [(1, True)]
    for p in range(3):
        s = int(src[p * ps])
        for layer in range(3):
            assert torch.equal(k[layer, (2 + p) * ps:(3 + p) * ps],
                               pool.kv_buffer[0, s:s + ps, layer]), (p, layer)
            assert torch.equal(v[layer, (2 + p) * ps:(3 + p) * ps],
                               pool.kv_buffer[1, s:s + ps, layer]), (p, layer)
