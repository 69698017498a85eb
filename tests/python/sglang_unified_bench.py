"""The unified-cache adapter's own cost per page, for SGLang's 128-page
batches: the same lookup and the same load (LOAD, PREPARE, COMMIT, start,
every layer's wait, the completion) through KvdockUnifiedCacheLinker and
through the bare kvdock.Linker, on one kvdockd; prints the median of each
and the difference per page. A measurement, not a test (run it by hand:
KVDOCK_BUILD=build /usr/bin/python3 tests/python/sglang_unified_bench.py).
"""

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import conftest  # noqa: E402  (sets the package path and finds the build)
import kvdock  # noqa: E402
from kvdock.sglang.unified import KvdockUnifiedCacheLinker  # noqa: E402
from mini_engine import MiniEngine, UnifiedLinkerFlow, tokens  # noqa: E402

PAGES = 128
ROUNDS = int(os.environ.get("ROUNDS", "30"))


def median_us(fn):
    samples = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def main():
    d = conftest.Daemon(pool_size="256M")
    try:
        e = MiniEngine("AAAA", page_size=16, kv_pages=2 * PAGES + 8)
        lk = kvdock.Linker(socket_path=d.socket, model_id="bench", timeout_ms=10000)
        a = KvdockUnifiedCacheLinker(device_pools=e.device_pools(), linker=lk)
        f = UnifiedLinkerFlow(e, a)
        toks = tokens(1, PAGES * 16 + 1)
        e.prefill(toks)
        f.offload_tree()
        e.drop_device()
        keys = e.page_keys(toks, PAGES)
        pool = a.pools["kv"]
        kv = e.pools["kv"]
        units = [kv.alloc() for _ in range(PAGES)]
        idx = kv.indices(units)
        look = [f._pool_transfer("kv", keys)]
        seq = iter(range(1, 10 ** 9))

        def raw_lookup():
            lk.lookup(1, [kvdock.Transfer(pool, keys)])

        def adapter_lookup():
            a.lookup("r", look)

        def raw_load():
            rid = next(seq) + (1 << 40)
            lk.load(rid, [kvdock.Transfer(pool, keys, idx)])
            lk.prepare(rid)
            lk.commit(rid, [kvdock.Commit(0, PAGES)])
            c = lk.start_layer_wise_loading()
            for layer in range(e.n_layers):
                lk.wait_layer(c, layer)
            while not lk.pop_completed_loads():
                time.sleep(0)

        t = [f._pool_transfer("kv", keys, idx)]  # the engine's, built once

        def adapter_load():
            rid = "b%d" % next(seq)
            assert a.begin_load(rid, t)
            a.prepare_load(rid)
            rest = a.commit_load(rid)
            a.load(rid, rest)
            c = a.start_layer_wise_loading()
            a.layer_done_counter.set_consumer(c)
            for layer in range(e.n_layers):
                a.layer_done_counter.wait_until(layer)
            while not a.num_completed_loads():
                time.sleep(0)
            a.pop_completed_load()

        for fn in (raw_lookup, adapter_lookup, raw_load, adapter_load):
            fn()  # warm
        rl, al = median_us(raw_lookup), median_us(adapter_lookup)
        rd, ad = median_us(raw_load), median_us(adapter_load)
        print("%d-page batch, %d rounds, median:" % (PAGES, ROUNDS))
        print("  lookup: binding %.0f us, adapter %.0f us: +%.2f us/page"
              % (rl, al, (al - rl) / PAGES))
        print("  load:   binding %.0f us, adapter %.0f us: +%.2f us/page"
              % (rd, ad, (ad - rd) / PAGES))
        a.close()
        lk.close()
    finally:
        d.cleanup()


if __name__ == "__main__":
    main()
