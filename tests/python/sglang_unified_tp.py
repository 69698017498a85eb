"""One TP rank of test_sglang_unified.py's two-rank test, run in its own
process (multiprocessing, spawn): its own MiniEngine with rank-specific
bytes, its own kvdock.Linker (tp_rank, tp_size 2) under its own
KvdockUnifiedCacheLinker. It prefills and offloads ``store_tokens`` tokens
of the prompt, drops its device cache, then loads the prompt back with the
boundaries every rank shares (its own sent to the parent, the parent's
intersection received), and reports what it restored and every error of
its checks."""

import os
import sys
import traceback


def rank_main(rank, socket, prompt, store_tokens, to_parent, from_parent):
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "..", "..", "python"))
        sys.path.insert(0, here)
        import kvdock
        from kvdock.sglang.unified import KvdockUnifiedCacheLinker
        from mini_engine import MiniEngine, UnifiedLinkerFlow

        e = MiniEngine("AAA", page_size=4, rank=rank)
        with kvdock.Linker(socket_path=socket, model_id="tp-model", tp_rank=rank, tp_size=2,
                           timeout_ms=10000) as lk:
            a = KvdockUnifiedCacheLinker(device_pools=e.device_pools(), linker=lk)

            def sync(boundaries):
                to_parent.put(("boundaries", rank, list(boundaries)))
                return from_parent.get(timeout=60)

            f = UnifiedLinkerFlow(e, a, sync=sync)
            e.prefill(prompt[:store_tokens])
            f.offload_tree()
            e.drop_device()
            restored, r = f.load_back(prompt)
            errors = e.verify_tree() + e.check_invariants() + e.check_poison()
            e.drop_device()
            errors += e.check_all_free()
            stats = a.pool_stats()["kv"]
            a.close()
            to_parent.put(("done", rank, {
                "restored": restored, "success": r.success, "boundaries": r.boundaries,
                "errors": errors, "namespace": a.pools["kv"].namespace,
                "load_bytes": stats["load_bytes"], "object_bytes": a.pools["kv"].object_bytes}))
    except BaseException:
        to_parent.put(("error", rank, traceback.format_exc()))
