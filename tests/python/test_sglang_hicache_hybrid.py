"""The v2 path of the SGLang HiCache backend for hybrid models: a KV pool with
a mamba pool (one state slot per node, under the hash of the node's last
page, TRAILING_PAGES 1) and an SWA pool (the window's last pages,
TRAILING_PAGES N), driven in the hybrid controller's order; restores
checked byte by byte against the host pools' contents."""

import pytest
import torch

from kvdock.sglang.hicache import KvdockHiCacheStorage, PoolHitPolicy, PoolName, PoolTransfer

from sglang_hicache_engine import (HybridDriver, MambaHostPool, MHAHostPool, MLAHostPool,
                                   page_hashes, storage_config)

PS = 4  # tokens per page


def tokens(n, base=0):
    return [(base * 104729 + i * 17 + 3) % 60000 for i in range(n)]


class Model:
    """One rank of a hybrid model: its host pools and its backend."""

    def __init__(self, daemon, seed, mla=False, tp_rank=0, tp_size=1):
        g = torch.Generator().manual_seed(seed)
        if mla:
            self.kv = MLAHostPool(2, 64, PS, kv_dim=16, layout="page_first")
        else:
            self.kv = MHAHostPool(2, 64, PS, head_num=2, head_dim=4, layout="page_first")
        self.swa = MHAHostPool(2, 64, PS, head_num=1, head_dim=8, layout="page_first")
        self.mamba = MambaHostPool(3, 32, temporal_shape=(2, 4), conv_shapes=[(3, 2), (1, 5)])
        for p in (self.kv, self.swa, self.mamba):
            p.fill_random(g)
        self.be = KvdockHiCacheStorage(
            storage_config(daemon.socket, mla=mla, tp_rank=tp_rank, tp_size=tp_size,
                           layout="page_first"), {})
        # what HybridCacheController.attach_storage_backend does
        self.be.register_mem_pool_host(self.kv)
        for name, pool in ((PoolName.KV, self.kv), (PoolName.MAMBA, self.mamba),
                           (PoolName.SWA, self.swa)):
            self.be.register_mem_host_pool_v2(pool, name)
        self.drv = HybridDriver(self.be, self.kv)

    def close(self):
        self.be.close()


@pytest.fixture
def models():
    made = []

    def make(*a, **kw):
        m = Model(*a, **kw)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def mamba_at(m, hashes, boundary):
    """A PoolTransfer storing a fresh slot's state as the state at boundary
    (under the hash of page boundary-1); and the slot."""
    slot = m.mamba.alloc(1)
    return PoolTransfer(name=PoolName.MAMBA, keys=[hashes[boundary - 1]], host_indices=slot,
                        hit_policy=PoolHitPolicy.TRAILING_PAGES), int(slot[0])


def swa_pages(m, hashes, first, n):
    """A PoolTransfer storing SWA pages first..first+n-1 from fresh host
    slots; and those slots."""
    idx = m.swa.alloc(n * PS)
    return PoolTransfer(name=PoolName.SWA, keys=hashes[first:first + n], host_indices=idx,
                        hit_policy=PoolHitPolicy.TRAILING_PAGES), idx


def same_mamba(m, src_slot, dst_slot):
    return m.mamba.slot_bytes(src_slot) == m.mamba.slot_bytes(dst_slot)


def same_swa(m, src_idx, dst_idx, n):
    return all(m.swa.page_bytes(int(src_idx[p * PS])) == m.swa.page_bytes(int(dst_idx[p * PS]))
               for p in range(n))


def test_boundary_is_where_every_pool_agrees(daemon, models):
    m = models(daemon, seed=1)
    toks = tokens(8 * PS)
    h = page_hashes(toks, PS)
    kv_src = m.kv.alloc(len(toks))
    # mamba states at boundaries 4 and 8; SWA (window 2) pages 2-5
    t4, slot4 = mamba_at(m, h, 4)
    t8, slot8 = mamba_at(m, h, 8)
    s23, swa23 = swa_pages(m, h, 2, 2)
    s45, swa45 = swa_pages(m, h, 4, 2)
    res, kv_pages = m.drv.backup_node(kv_src, toks, [t4, s23])
    assert res == {PoolName.MAMBA: [True], PoolName.SWA: [True, True]} and kv_pages == 8
    m.drv.backup_node(kv_src, toks, [t8, s45])

    # mamba can restore at {4, 8}, SWA at {4, 5, 6}: only 4 is both
    result, loaded, kv_dst, side = m.drv.prefetch_hybrid(
        toks, {PoolName.MAMBA: (m.mamba, 1), PoolName.SWA: (m.swa, 2)})
    assert result.kv_hit_pages == 4
    assert dict(result.extra_pool_hit_pages) == {"kv": 8, "mamba": 8, "swa": 6}
    assert loaded == 4
    assert all(m.kv.page_bytes(int(kv_src[p * PS])) == m.kv.page_bytes(int(kv_dst[p * PS]))
               for p in range(4))
    mres, mdst = side[PoolName.MAMBA]
    sres, sdst = side[PoolName.SWA]
    assert mres == [True] and same_mamba(m, slot4, int(mdst[0]))
    assert sres == [True, True] and same_swa(m, swa23, sdst, 2)

    # SWA pages 6-7 too: now 8 works for every pool
    s67, swa67 = swa_pages(m, h, 6, 2)
    assert m.be.batch_set_v2([s67]) == {PoolName.SWA: [True, True]}
    result, loaded, kv_dst, side = m.drv.prefetch_hybrid(
        toks, {PoolName.MAMBA: (m.mamba, 1), PoolName.SWA: (m.swa, 2)})
    assert result.kv_hit_pages == 8 and loaded == 8
    mres, mdst = side[PoolName.MAMBA]
    sres, sdst = side[PoolName.SWA]
    assert mres == [True] and same_mamba(m, slot8, int(mdst[0]))
    assert sres == [True, True] and same_swa(m, swa67, sdst, 2)


def test_kv_without_its_state_is_not_a_hit(daemon, models):
    m = models(daemon, seed=2)
    toks = tokens(6 * PS, base=1)
    h = page_hashes(toks, PS)
    kv_src = m.kv.alloc(len(toks))
    # KV for 6 pages; no mamba state anywhere: nothing is restorable
    m.drv.backup_node(kv_src, toks, [])
    probe = [PoolTransfer(name=PoolName.MAMBA, keys=[None],
                          hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    assert m.be.batch_exists(h) == 6
    assert m.be.batch_exists_v2(h, probe).kv_hit_pages == 0
    # a state at 3 only: 3, though KV reaches 6
    t3, slot3 = mamba_at(m, h, 3)
    assert m.be.batch_set_v2([t3]) == {PoolName.MAMBA: [True]}
    result, loaded, kv_dst, side = m.drv.prefetch_hybrid(toks, {PoolName.MAMBA: (m.mamba, 1)})
    assert result.kv_hit_pages == 3 and loaded == 3
    mres, mdst = side[PoolName.MAMBA]
    assert mres == [True] and same_mamba(m, slot3, int(mdst[0]))


def test_all_pages_policy_of_a_sidecar(daemon, models):
    # an SWA-like pool asked for ALL_PAGES: a hole ends its prefix
    m = models(daemon, seed=3)
    toks = tokens(6 * PS, base=2)
    h = page_hashes(toks, PS)
    m.drv.backup_node(m.kv.alloc(len(toks)), toks, [swa_pages(m, h, 0, 2)[0]])
    assert m.be.batch_set_v2([swa_pages(m, h, 3, 3)[0]]) == {PoolName.SWA: [True] * 3}
    probe = [PoolTransfer(name=PoolName.SWA, keys=h, hit_policy=PoolHitPolicy.ALL_PAGES)]
    assert m.be.batch_exists_v2(h, probe).kv_hit_pages == 2
    trailing = [PoolTransfer(name=PoolName.SWA, keys=[None] * 3,
                             hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    assert m.be.batch_exists_v2(h, trailing).kv_hit_pages == 6


def test_get_v2_answers_per_pool_and_leading(daemon, models):
    m = models(daemon, seed=4)
    toks = tokens(5 * PS, base=3)
    h = page_hashes(toks, PS)
    s01, swa01 = swa_pages(m, h, 0, 2)
    assert m.be.batch_set_v2([s01]) == {PoolName.SWA: [True, True]}
    # pages 0, 1 stored, 2 not: the answer is the leading run; the mamba key
    # was never stored; a length mismatch is refused
    dst = m.swa.alloc(3 * PS)
    got = m.be.batch_get_v2([
        PoolTransfer(name=PoolName.SWA, keys=h[:3], host_indices=dst),
        PoolTransfer(name=PoolName.MAMBA, keys=[h[4]], host_indices=m.mamba.alloc(1)),
        PoolTransfer(name=PoolName.INDEXER, keys=h[:1], host_indices=m.kv.alloc(PS))])
    assert got == {PoolName.SWA: [True, True, False], PoolName.MAMBA: [False],
                   PoolName.INDEXER: [False]}
    assert same_swa(m, swa01, dst, 2)
    bad = m.be.batch_get_v2([PoolTransfer(name=PoolName.SWA, keys=h[:2],
                                          host_indices=m.swa.alloc(PS))])
    assert bad == {PoolName.SWA: [False, False]}


def test_mla_kv_once_mamba_per_rank(daemon, models):
    # MLA + mamba at TP 2: the controller backs MLA KV up on rank 0 only
    # (backup_skip) but the mamba state on every rank, each its own
    r0 = models(daemon, seed=5, mla=True, tp_rank=0, tp_size=2)
    r1 = models(daemon, seed=6, mla=True, tp_rank=1, tp_size=2)
    toks = tokens(4 * PS, base=4)
    h = page_hashes(toks, PS)
    kv0 = r0.kv.alloc(len(toks))
    t0, slot0 = mamba_at(r0, h, 4)
    t1, slot1 = mamba_at(r1, h, 4)
    r0.drv.backup_node(kv0, toks, [t0])
    assert r1.be.batch_set_v2([t1]) == {PoolName.MAMBA: [True]}  # no KV from rank 1
    assert r0.mamba.slot_bytes(slot0) != r1.mamba.slot_bytes(slot1)

    result, loaded, kv_dst, side = r1.drv.prefetch_hybrid(toks, {PoolName.MAMBA: (r1.mamba, 1)})
    assert result.kv_hit_pages == 4 and loaded == 4
    assert all(r0.kv.page_bytes(int(kv0[p * PS])) == r1.kv.page_bytes(int(kv_dst[p * PS]))
               for p in range(4))
    mres, mdst = side[PoolName.MAMBA]
    assert mres == [True] and same_mamba(r1, slot1, int(mdst[0]))  # rank 1's own state
    ns = sorted(r1.be.namespaces())
    assert ns == ["test-model/kv/rep", "test-model/mamba/tp1", "test-model/swa/rep"]


def test_exists_v2_fills_a_newer_result_with_every_boundary(daemon, models, monkeypatch):
    # newer SGLang adds restorable_prefix_pages (every boundary, for the
    # ranks to intersect) to PoolTransferResult
    from dataclasses import dataclass
    from typing import Optional

    from kvdock.sglang import hicache

    @dataclass
    class NewerResult:
        kv_hit_pages: int
        extra_pool_hit_pages: dict
        restorable_prefix_pages: Optional[list] = None

    monkeypatch.setattr(hicache, "PoolTransferResult", NewerResult)
    m = models(daemon, seed=7)
    toks = tokens(6 * PS, base=5)
    h = page_hashes(toks, PS)
    m.drv.backup_node(m.kv.alloc(len(toks)), toks, [mamba_at(m, h, 2)[0]])
    assert m.be.batch_set_v2([mamba_at(m, h, 5)[0]]) == {PoolName.MAMBA: [True]}
    r = m.be.batch_exists_v2(h, [PoolTransfer(name=PoolName.MAMBA, keys=[None],
                                              hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert isinstance(r, NewerResult)
    assert r.kv_hit_pages == 5 and r.restorable_prefix_pages == [2, 5]
