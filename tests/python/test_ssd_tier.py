"""The SSD tier through a real kvdockd and the linker: a working set twice
the pool goes out (offloads spill past the watermark) and every page comes
back byte-exact through loads that wait for their objects' promotion; the
tier's objects survive a SIGKILL of the daemon with the pool file removed
(a reboot); the daemon's Stats count spills and promotions."""
import os
import shutil

import kvdock
from binding_util import PagedPool, load_all, offload_and_wait, sha_chain, tokens_of

PAGES_PER_CHAIN = 8
CHAINS = 16  # 128 pages of 64 KiB: twice a 4 MiB pool


def tier_args(d):
    return ["--ssd-path", os.path.join(d, "tier"), "--ssd-size", "24M",
            "--ssd-segment-size", "2M", "--evict-high", "0.8", "--evict-low", "0.6"]


def wait_spilled(daemon):
    """Waits until no object is being spilled: a spill is acknowledged only
    once its record is synced (the group commit: a round of fdatasyncs,
    tens of ms on some disks), and the next chain's Reserves would else
    find the pool full and drop the coldest objects on demand."""
    import time
    for _ in range(2000):
        if store_stats(daemon)["spilling_bytes"] == 0:
            return
        time.sleep(0.005)
    raise AssertionError("spills still in flight after 2000 polls")


def offload_chains(lk, kv, daemon):
    chains = []
    for c in range(CHAINS):
        keys = sha_chain(tokens_of(100 + c, PAGES_PER_CHAIN * kv.ps), kv.ps)
        kv.fill_pages(keys, 0)
        assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys,
                                                    indices=kv.indices(0, PAGES_PER_CHAIN)))
        chains.append(keys)
        wait_spilled(daemon)
    return chains


def load_chain(lk, kv, rid, keys):
    assert lk.lookup(rid, [kvdock.Transfer(kv.pool, keys)]) == list(range(1, len(keys) + 1))
    ok = load_all(lk, rid, [kvdock.Transfer(kv.pool, keys, indices=kv.indices(0, len(keys)))],
                  [kvdock.Commit(0, len(keys))], [0, 1])
    assert ok is True
    kv.check_pages(keys, lambda i: i * kv.ps)
    kv.wipe()


def store_stats(daemon):
    with kvdock.StoreClient(socket_path=daemon.socket) as sc:
        return sc.stats()["store"]


def test_twice_the_pool_round_trips_through_the_tier(daemon_factory, linker_factory, tmp_path):
    d = daemon_factory(*tier_args(str(tmp_path)), pool_size="4M")
    lk = linker_factory(d, model_id="ssd")
    kv = PagedPool(lk, layers=2, n_buf=2, n_rows=PAGES_PER_CHAIN * 16, bpr=1024, ps=16)
    assert kv.object_bytes() == 64 << 10
    chains = offload_chains(lk, kv, d)
    st = store_stats(d)
    assert st["spills"] > 0 and st["ssd_objects"] > 0
    assert st["evictions"] == 0  # moved to the tier, none dropped
    for rid, keys in enumerate(chains):
        load_chain(lk, kv, 1000 + rid, keys)
    st = store_stats(d)
    assert st["promotions"] > 0
    assert st["promote_failures"] == 0 and st["ssd_checksum_failures"] == 0


def test_tier_survives_sigkill_and_the_pool_gone(daemon_factory, linker_factory, tmp_path):
    d = daemon_factory(*tier_args(str(tmp_path)), pool_size="4M")
    lk = linker_factory(d, model_id="ssd")
    kv = PagedPool(lk, layers=2, n_buf=2, n_rows=PAGES_PER_CHAIN * 16, bpr=1024, ps=16)
    chains = offload_chains(lk, kv, d)
    on_ssd = store_stats(d)["ssd_objects"]
    assert on_ssd > 0
    d.kill()
    # a reboot: the pool file and its journal are gone, the tier is not
    for name in os.listdir(d.dir):
        if name.startswith("kvdock-"):
            os.unlink(os.path.join(d.dir, name))
    d.start()
    st = store_stats(d)
    assert st["ssd_objects"] >= on_ssd and st["objects_ready"] == 0
    lk2 = linker_factory(d, model_id="ssd")
    kv2 = PagedPool(lk2, layers=2, n_buf=2, n_rows=PAGES_PER_CHAIN * 16, bpr=1024, ps=16)
    # the chains whose every page was on the tier come back whole
    whole = 0
    for rid, keys in enumerate(chains):
        b = lk2.lookup(2000 + rid, [kvdock.Transfer(kv2.pool, keys)])
        if b and b[-1] == len(keys):
            load_chain(lk2, kv2, 3000 + rid, keys)
            whole += 1
    assert whole > 0
    shutil.rmtree(os.path.join(str(tmp_path), "tier"), ignore_errors=True)


def test_operator_evict_of_tier_objects_lasts_across_sigkill(daemon_factory, linker_factory,
                                                             tmp_path):
    """An operator's Evict of every object, many of them on the tier, then
    SIGKILL and a reboot (pool gone): none comes back. The reply came after
    the tombstones' fdatasync (kvd_store_tier_sync_dead); what this test
    sees is the kill, not a power loss, so it checks the path end to end,
    not the sync's durability."""
    d = daemon_factory(*tier_args(str(tmp_path)), pool_size="4M")
    lk = linker_factory(d, model_id="ssd")
    kv = PagedPool(lk, layers=2, n_buf=2, n_rows=PAGES_PER_CHAIN * 16, bpr=1024, ps=16)
    offload_chains(lk, kv, d)
    on_ssd = store_stats(d)["ssd_objects"]
    assert on_ssd > 0
    with kvdock.StoreClient(socket_path=d.socket) as sc:
        evicted = 0
        for _ in range(1000):
            rep = sc.evict(all=True)
            evicted += rep["evicted"]
            if rep["evicted"] == 0:
                break
    assert evicted >= on_ssd
    assert store_stats(d)["ssd_objects"] == 0
    d.kill()
    for name in os.listdir(d.dir):
        if name.startswith("kvdock-"):
            os.unlink(os.path.join(d.dir, name))
    d.start()
    st = store_stats(d)
    assert st["ssd_objects"] == 0 and st["objects_ready"] == 0
    shutil.rmtree(os.path.join(str(tmp_path), "tier"), ignore_errors=True)
