"""The vLLM KV connector v1 (kvdock.vllm.KvdockConnector).

(a) its interface against vLLM's, restated in vllm_interface.py;
(b) a vLLM-like engine (vllm_engine.py) offloads in one instance and
    restores in another, checked byte by byte, for each KV cache layout vLLM
    hands a connector, synchronous and asynchronous loads, two TP ranks;
(c) objects evicted between the scheduler's lookup and the worker's load:
    the blocks are reported by get_block_ids_with_load_errors and
    recomputed, never served;
(d) a hybrid model (attention + mamba groups): no hit where the mamba state
    is missing, the longest boundary that has one otherwise;
(e) the daemon killed: lookups claim nothing, loads are reported failed,
    finished requests are still released, nothing hangs.

Every engine checks what each forward pass reads; `violations` lists the
requests that read wrong bytes without the connector reporting them.
"""

import inspect
import os
import subprocess
import sys
import time

import pytest

import kvdock
import kvdock.vllm
from kvdock.vllm import _base
from kvdock.vllm.connector import KvdockConnector, namespace_name

import vllm_interface as iface
from vllm_engine import Engine, Request, supports_kw

BS = 16
PROMPT = [(i * 37 + 11) % 4999 + 1 for i in range(100)]
# a request keeps one token to forward: at most floor((L - 1) / bs) pages
REACHABLE = (len(PROMPT) - 1) // BS * BS  # 96


def _engine(daemon, **kw):
    kw.setdefault("timeout_ms", 3000)
    return Engine(daemon.socket, block_size=BS, **kw)


def _serve(engine, rid, prompt=PROMPT, max_tokens=3):
    engine.add(Request(rid, prompt, max_tokens))
    engine.run()
    return engine.history[rid]


def _same_blocks(a, b, rid_a, rid_b, pages, rank=0):
    """Layer by layer, the first `pages` blocks of two requests hold the
    same bytes (attention), and so does the state block of a hybrid."""
    ga, gb = a.history[rid_a], b.history[rid_b]
    for name in a.attn_layers:
        for i in range(pages):
            assert a.block_bytes(rank, name, ga[0][i]) == b.block_bytes(rank, name, gb[0][i]), \
                (name, i)


# ------------------------------------------------------------ (a) interface


def test_interface_matches_vllm_base():
    assert iface.check(KvdockConnector, iface.KVConnectorBase_V1) == []
    assert iface.check(KvdockConnector, iface.SupportsHMA) == []
    assert issubclass(KvdockConnector, _base.KVConnectorBase_V1)
    assert issubclass(KvdockConnector, _base.SupportsHMA)
    assert _base.supports_hma(KvdockConnector)
    assert not inspect.isabstract(KvdockConnector)
    for name in iface.ABSTRACT:  # the abstract methods are the connector's own
        assert name in vars(KvdockConnector), name
    assert {m.name: m.value for m in _base.KVConnectorRole} == iface.ROLES
    # the fallback restatement itself matches vLLM's interface
    assert iface.check(_base.KVConnectorBase_V1, iface.KVConnectorBase_V1) == []
    assert iface.check(_base.SupportsHMA, iface.SupportsHMA) == []
    assert kvdock.vllm.VLLM_BASE_COMMIT == iface.VLLM_COMMIT
    assert iface.VLLM_COMMIT in _base.__doc__ and iface.VLLM_COMMIT in kvdock.vllm.connector.__doc__


def test_interface_check_catches_renames_and_missing_methods():
    class Renamed(KvdockConnector):
        def get_num_new_matched_tokens(self, request, num_computed):  # vLLM: num_computed_tokens
            return 0, False

    class Defaulted(KvdockConnector):
        def update_state_after_alloc(self, request, blocks, num_external_tokens=0):
            pass

    class Gone(KvdockConnector):
        pass

    Gone.get_block_ids_with_load_errors = property(lambda self: set())
    assert [p.split(":")[0] for p in iface.check(Renamed, iface.KVConnectorBase_V1)] == \
        ["get_num_new_matched_tokens"]
    assert [p.split(":")[0] for p in iface.check(Defaulted, iface.KVConnectorBase_V1)] == \
        ["update_state_after_alloc"]
    assert iface.check(Gone, iface.KVConnectorBase_V1) == \
        ["get_block_ids_with_load_errors: not a plain method"]

    class Bare:
        pass

    missing = iface.check(Bare, iface.SupportsHMA)
    assert missing == ["request_finished_all_groups: missing"]


def test_factory_loads_it_by_module_path(daemon):
    # what vLLM's factory does with kv_connector + kv_connector_module_path
    assert getattr(kvdock.vllm, "KvdockConnector") is KvdockConnector
    assert supports_kw(KvdockConnector, "kv_cache_config")
    e = _engine(daemon, n_attn=2)
    try:
        assert type(e.sched) is KvdockConnector and type(e.workers[0]) is KvdockConnector
        assert e.sched.role == _base.KVConnectorRole.SCHEDULER
        assert e.workers[0].role == _base.KVConnectorRole.WORKER
        assert e.sched.requires_kv_delivery is False
    finally:
        e.shutdown()


def test_imports_without_vllm_or_libkvdock(tmp_path):
    # a fresh interpreter where `import vllm` fails and no libkvdock loads:
    # the package imports; building a connector (vLLM does it at startup,
    # in either role) fails right there, saying what is missing, and not at
    # the first request (L3)
    code = (
        "import sys, types\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'vllm' or name.startswith('vllm.'):\n"
        "            raise ImportError('no vllm here')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import kvdock.vllm as v\n"
        "from types import SimpleNamespace as NS\n"
        "assert not v.HAVE_VLLM\n"
        "print('imported', v.KvdockConnector.__mro__[1].__module__)\n"
        "cfg = NS(kv_transfer_config=NS(kv_role='kv_both', kv_connector_extra_config={}),\n"
        "         cache_config=NS(block_size=16), model_config=NS(model='m'),\n"
        "         parallel_config=NS(tensor_parallel_size=1, pipeline_parallel_size=1))\n"
        "for role in (v.connector.KVConnectorRole.SCHEDULER, v.connector.KVConnectorRole.WORKER):\n"
        "    try:\n"
        "        v.KvdockConnector(cfg, role, None)\n"
        "    except RuntimeError as e:\n"
        "        print('refused', 'libkvdock' in str(e) and 'KVDOCK_LIBRARY' in str(e))\n")
    env = dict(os.environ, KVDOCK_LIBRARY=str(tmp_path / "no-libkvdock.so"))
    env.pop("KVDOCK_BUILD", None)
    env["PYTHONPATH"] = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    r = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().split() == ["imported", "kvdock.vllm._base", "refused", "True",
                                         "refused", "True"]


# --------------------------------------------------- (b) offload and restore


@pytest.mark.parametrize("layout, rows", [
    ("flash", BS),  # [2, nb, bs, h, d]: K and V apart, token rows
    ("flashinfer", BS),  # [nb, 2, bs, h, d]
    ("hnd", BS),  # memory [2, nb, h, bs, d]: a block is still one run
    ("kernel", BS),  # kernel blocks of bs/2 tokens
    ("padded", 1),  # pages padded past K+V: rows are the blocks
    ("mla", BS),  # [nb, bs, d], stored once for every TP rank
])
def test_offload_in_one_engine_restore_in_another(daemon, layout, rows):
    a = _engine(daemon, layout=layout)
    b = _engine(daemon, layout=layout)
    try:
        pool = a.workers[0]._worker.pools[0]
        assert pool.rows == rows and pool.pool.page_size == rows
        heads = 1 if layout == "mla" else 2
        per_layer = (1 if layout == "mla" else 2) * BS * heads * 8 * 2  # K(+V) bytes of a block
        assert pool.pool.object_bytes == 3 * per_layer
        suffix = "rep" if layout == "mla" else "tp0"
        want_ns = "%s/kv0/%s" % (a.workers[0]._settings.model_id, suffix)
        assert pool.pool.namespace == want_ns

        _serve(a, "a1")
        assert a.claims["a1"] == [(0, False)]  # nothing stored before
        assert a.workers[0].kvdock_stats["offloads_ok"] >= 1
        _serve(b, "b1")
        assert b.claims["b1"] == [(REACHABLE, False)]
        assert b.violations == [] and a.violations == []
        assert all(not s for s in b.invalid_seen)
        st = b.workers[0].kvdock_stats
        assert st["loads"] == 1 and st["loads_ok"] == 1 and st["loads_failed"] == 0
        assert b.workers[0]._worker.linker.pool_stats(
            b.workers[0]._worker.pools[0].pool)["load_bytes"] == (REACHABLE // BS) * 3 * per_layer
        _same_blocks(a, b, "a1", "b1", REACHABLE // BS)
    finally:
        a.shutdown()
        b.shutdown()


def test_restore_asynchronously_between_steps(daemon):
    a = _engine(daemon)
    b = _engine(daemon, load_async=True)
    try:
        _serve(a, "a1")
        _serve(b, "b1")
        assert b.claims["b1"] == [(REACHABLE, True)]
        assert b.violations == []
        assert b.workers[0].kvdock_stats["loads_ok"] == 1
        _same_blocks(a, b, "a1", "b1", REACHABLE // BS)
    finally:
        a.shutdown()
        b.shutdown()


def test_blocks_of_decode_steps_are_stored_too(daemon):
    # 100 prompt tokens + 20 generated: block 6 (tokens 96..111) fills while decoding
    a = _engine(daemon)
    b = _engine(daemon)
    try:
        a.add(Request("a1", PROMPT, max_tokens=20))
        a.run()
        generated = a.finished[0].all_token_ids
        longer = generated[:113]  # 7 full blocks reachable
        b.add(Request("b1", longer, max_tokens=1))
        b.run()
        assert b.claims["b1"] == [(112, False)]
        assert b.violations == []
        _same_blocks(a, b, "a1", "b1", 7)
    finally:
        a.shutdown()
        b.shutdown()


def test_lora_salt_and_images_keep_their_pages_apart(daemon):
    from types import SimpleNamespace as NS

    a = _engine(daemon)
    b = _engine(daemon)
    try:
        plain, lora = Request("plain", PROMPT, 1), Request("lora", PROMPT, 1)
        lora.lora_request = NS(lora_name="adapter-x", lora_int_id=1)
        for r in (plain, lora):
            a.add(r)
        a.run()
        asked = []
        for rid, attrs in [("b-plain", {}), ("b-lora", {"lora_request": lora.lora_request}),
                           ("b-other", {"lora_request": NS(lora_name="adapter-y", lora_int_id=2)}),
                           ("b-salt", {"cache_salt": "tenant-2"}),
                           ("b-image", {"mm_features": [NS(identifier="img-9f2")]}),
                           ("b-embeds", {"prompt_embeds": object()})]:
            r = Request(rid, PROMPT, 1)
            for k, v in attrs.items():
                setattr(r, k, v)
            asked.append((rid, b.sched.get_num_new_matched_tokens(r, 0)))
        assert asked == [("b-plain", (REACHABLE, False)), ("b-lora", (REACHABLE, False)),
                         ("b-other", (0, False)), ("b-salt", (0, False)),
                         ("b-image", (0, False)), ("b-embeds", (0, False))]
        # the plain chain is SGLang's: its keys are kvdock.page_keys of the tokens
        keys = kvdock.page_keys(PROMPT[:REACHABLE], BS)
        model_id = a.workers[0]._settings.model_id
        assert _kv_boundaries(daemon, model_id, keys)[-1] == REACHABLE // BS
    finally:
        a.shutdown()
        b.shutdown()


def test_kv_roles_producer_only_stores_consumer_only_loads(daemon):
    producer = _engine(daemon, kv_role="kv_producer")
    consumer = _engine(daemon, kv_role="kv_consumer")
    try:
        _serve(producer, "p1")
        assert producer.claims["p1"] == [(0, False)]
        assert producer.workers[0].kvdock_stats["offloads_ok"] >= 1
        _serve(producer, "p2")  # a producer never loads, even what it stored
        assert producer.claims["p2"] == [(0, False)]
        _serve(consumer, "c1")
        assert consumer.claims["c1"] == [(REACHABLE, False)] and consumer.violations == []
        consumer.add(Request("c2", PROMPT[::-1], 2))
        consumer.run()
        assert consumer.workers[0].kvdock_stats["offloads"] == 0
        assert consumer.delays == {"c1": False, "c2": False}
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_two_tp_ranks_restore_together_or_not_at_all(daemon):
    a = _engine(daemon, tp_size=2)
    b = _engine(daemon, tp_size=2)
    c = _engine(daemon, tp_size=2)
    try:
        _serve(a, "a1")
        _serve(b, "b1")
        assert b.claims["b1"] == [(REACHABLE, False)]
        assert b.violations == []
        for rank in (0, 1):
            _same_blocks(a, b, "a1", "b1", REACHABLE // BS, rank=rank)
        # rank 1's pages gone: a hit rank 0 alone could load is not claimed
        model_id = a.workers[1]._settings.model_id
        ns1 = namespace_name(model_id, "kv0", tp_rank=1)
        assert a.workers[1]._worker.pools[0].pool.namespace == ns1
        daemon.cli("evict", "--namespace", ns1)
        _serve(c, "c1")
        assert c.claims["c1"] == [(0, False)]
        assert c.violations == []
    finally:
        a.shutdown()
        b.shutdown()
        c.shutdown()


def test_saved_requests_keep_their_blocks_until_the_saves_are_done(daemon):
    a = _engine(daemon)
    try:
        a.add(Request("long", PROMPT, 2))
        a.add(Request("short", PROMPT[:10], 2))  # not one full block: nothing to save
        a.run()
        assert a.delays == {"long": True, "short": False}
        assert not a.delayed and "long" not in a.blocks  # freed once every worker said so
    finally:
        a.shutdown()


def test_preempted_request_resumes_from_its_own_saved_blocks(daemon):
    a = _engine(daemon)
    try:
        a.add(Request("p1", PROMPT, 6))
        a.step()  # the prompt: 6 blocks saved
        a.step()  # a decode step
        a.to_preempt.add("p1")
        meta = a.step()  # preempted: its blocks go back
        assert meta.preempted == {"p1"}
        a.run()
        # resumed: 100 prompt + 2 generated tokens, its saved 6 blocks restored
        assert a.claims["p1"] == [(0, False), ((len(PROMPT) + 2 - 1) // BS * BS, False)]
        assert a.violations == [] and a.workers[0].kvdock_stats["loads_ok"] == 1
        assert [r.request_id for r in a.finished] == ["p1"]
    finally:
        a.shutdown()


# ------------------------------------------------ (c) evicted before the load


def test_evicted_between_lookup_and_load_is_reported_not_served(daemon):
    a = _engine(daemon)
    b = _engine(daemon)
    try:
        _serve(a, "a1")
        evicted = []

        def evict(engine, meta):
            if meta.loads and not evicted:
                r = daemon.cli("evict", "--all", "--json")
                evicted.append(r.stdout.decode())

        b.after_meta = evict
        b.add(Request("b1", PROMPT, 3))
        b.run()
        assert evicted and '"evicted":0,' not in evicted[0]
        assert b.claims["b1"] == [(REACHABLE, False)]  # the scheduler saw the pages
        reported = [s for s in b.invalid_seen if s]
        blocks = b.history["b1"][0][:REACHABLE // BS]
        assert reported and set(blocks) <= reported[0]
        st = b.workers[0].kvdock_stats
        assert st["loads_failed"] == 1 and st["loads_ok"] == 0
        assert b.violations == []  # what the failed load left was never trusted
        _same_blocks(a, b, "a1", "b1", REACHABLE // BS)  # recomputed: the same bytes
    finally:
        a.shutdown()
        b.shutdown()


# ------------------------------------------------------------- (d) hybrid


def _kv_boundaries(daemon, model_id, keys):
    r = daemon.cli("lookup", "--json", "--namespace", "%s/kv0/tp0" % model_id,
                   *[k.hex() for k in keys])
    import json

    return json.loads(r.stdout.decode())["boundaries"]


def test_hybrid_restores_kv_and_mamba_state(daemon):
    a = _engine(daemon, n_attn=2, n_mamba=2, layout="hma", prefill_chunk=48)
    b = _engine(daemon, n_attn=2, n_mamba=2, layout="hma", prefill_chunk=48)
    try:
        assert [p.kind for p in a.workers[0]._settings.plans] == ["kv", "mamba"]
        _serve(a, "a1")
        _serve(b, "b1")
        assert b.claims["b1"] == [(REACHABLE, False)]
        assert b.violations == []
        st = b.workers[0].kvdock_stats
        assert st["loads_ok"] == 1 and st["loads_failed"] == 0
        w = b.workers[0]._worker
        assert w.linker.pool_stats(w.pools[1].pool)["load_bytes"] == 2 * (24 + 80)
        _same_blocks(a, b, "a1", "b1", REACHABLE // BS)
        sa = a.history["a1"][1][REACHABLE // BS - 1]
        sb = b.history["b1"][1][REACHABLE // BS - 1]
        for name in a.mamba_layers:
            assert a.block_bytes(0, name, sa) == b.block_bytes(0, name, sb)
    finally:
        a.shutdown()
        b.shutdown()


def test_hybrid_claims_no_hit_without_mamba_state(daemon):
    # one prefill step of 100 tokens ends on no block: KV pages are stored,
    # no state at any boundary
    a = _engine(daemon, n_attn=2, n_mamba=2, layout="hma")
    b = _engine(daemon, n_attn=2, n_mamba=2, layout="hma")
    try:
        _serve(a, "a1")
        keys = kvdock.page_keys(PROMPT[:REACHABLE], BS)
        assert _kv_boundaries(daemon, a.workers[0]._settings.model_id, keys)[-1] == REACHABLE // BS
        _serve(b, "b1")
        assert b.claims["b1"] == [(0, False)]
        assert b.violations == [] and b.workers[0].kvdock_stats["loads"] == 0
    finally:
        a.shutdown()
        b.shutdown()


def test_hybrid_claims_the_longest_boundary_with_a_state(daemon):
    a = _engine(daemon, n_attn=2, n_mamba=2, layout="hma", prefill_chunk=48)  # states at 48 and 96
    b = _engine(daemon, n_attn=2, n_mamba=2, layout="hma")
    try:
        _serve(a, "a1")
        model_id = a.workers[0]._settings.model_id
        keys = kvdock.page_keys(PROMPT[:REACHABLE], BS)
        daemon.cli("evict", "--key", keys[-1].hex(), "--namespace", "%s/mamba1/tp0" % model_id)
        _serve(b, "b1")
        assert b.claims["b1"] == [(48, False)]
        assert b.violations == []
        _same_blocks(a, b, "a1", "b1", 3)
    finally:
        a.shutdown()
        b.shutdown()


def test_hybrid_hit_without_a_state_block_is_reported(daemon):
    a = _engine(daemon, n_attn=2, n_mamba=2, layout="hma", prefill_chunk=48)
    b = _engine(daemon, n_attn=2, n_mamba=2, layout="hma", drop_state_block=True)
    try:
        _serve(a, "a1")
        _serve(b, "b1")
        assert b.claims["b1"] == [(REACHABLE, False)]
        assert any(b.invalid_seen) and b.violations == []
        assert b.workers[0].kvdock_stats["loads_failed"] == 1
    finally:
        a.shutdown()
        b.shutdown()


def test_sliding_window_group_needs_only_its_window(daemon):
    # window 40: a boundary needs the last cdiv(39, 16) = 3 pages of the window group
    kw = dict(n_attn=2, n_swa=2, window=40)
    a, b, c, d = (_engine(daemon, **kw) for _ in range(4))
    try:
        plans = a.workers[0]._settings.plans
        assert [(p.kind, p.trailing_pages) for p in plans] == [("kv", 0), ("swa", 3)]
        _serve(a, "a1")
        _serve(b, "b1")
        assert b.claims["b1"] == [(REACHABLE, False)]
        assert b.violations == []
        # b's window group holds null blocks before the window; the window's 3 pages came in
        gb, ga = b.history["b1"][1], a.history["a1"][1]
        assert gb[:3] == [0, 0, 0]
        for name in a.swa_layers:
            for i in range(3, REACHABLE // BS):
                assert a.block_bytes(0, name, ga[i]) == b.block_bytes(0, name, gb[i])
        _same_blocks(a, b, "a1", "b1", REACHABLE // BS)
        ns = "%s/swa1/tp0" % a.workers[0]._settings.model_id
        keys = kvdock.page_keys(PROMPT[:REACHABLE], BS)
        for k in keys[:2]:  # pages before every window that matters
            daemon.cli("evict", "--key", k.hex(), "--namespace", ns)
        _serve(c, "c1")
        assert c.claims["c1"] == [(REACHABLE, False)] and c.violations == []
        daemon.cli("evict", "--key", keys[5].hex(), "--namespace", ns)
        _serve(d, "d1")  # boundary 5 needs pages 2, 3, 4 of the window group
        assert d.claims["d1"] == [(5 * BS, False)] and d.violations == []
    finally:
        for e in (a, b, c, d):
            e.shutdown()


@pytest.mark.parametrize("via", ["linker", "store"])
def test_scheduler_lookups_by_linker_or_store_client(daemon, via):
    if via == "store" and not kvdock._lib.has("kvd_store_open"):
        pytest.skip("this libkvdock has no store client (kvd_store_open)")
    a = _engine(daemon, tp_size=2, n_attn=2, n_mamba=2, layout="hma", prefill_chunk=48,
                extra={"kvdock_lookup": via})
    b = _engine(daemon, tp_size=2, n_attn=2, n_mamba=2, layout="hma",
                extra={"kvdock_lookup": via})
    try:
        _serve(a, "a1")
        _serve(b, "b1")
        assert b.claims["b1"] == [(REACHABLE, False)] and b.violations == []
        kind = type(b.sched._scheduler.view).__name__
        assert kind == {"linker": "_LinkerView", "store": "_StoreView"}[via]
    finally:
        a.shutdown()
        b.shutdown()


# -------------------------------------------------------- (e) daemon killed


def test_daemon_killed_before_the_load(daemon):
    a = _engine(daemon)
    b = _engine(daemon)
    try:
        _serve(a, "a1")

        def kill(engine, meta):
            if meta.loads and daemon.proc is not None:
                daemon.kill()

        b.after_meta = kill
        t0 = time.monotonic()
        b.add(Request("b1", PROMPT, 3))
        b.add(Request("b2", PROMPT[:50], 3))  # its first 3 blocks are stored too
        b.run()
        assert time.monotonic() - t0 < 120  # a bound, not a measurement
        assert b.claims["b1"] == [(REACHABLE, False)]
        assert b.claims["b2"] == [((50 - 1) // BS * BS, False)]
        assert b.workers[0].kvdock_stats["loads_failed"] == 2
        assert any(b.invalid_seen) and b.violations == []
        assert sorted(r.request_id for r in b.finished) == ["b1", "b2"]
        assert not b.delayed  # saves that could not happen still released the blocks
        _same_blocks(a, b, "a1", "b1", REACHABLE // BS)
    finally:
        a.shutdown()
        b.shutdown()


def test_daemon_killed_mid_load(daemon):
    a = _engine(daemon)
    b = _engine(daemon)
    try:
        _serve(a, "a1")

        def kill(engine, rank):
            if daemon.proc is not None and engine.workers[rank]._worker.inflight:
                daemon.kill()

        b.before_layers = kill
        b.add(Request("b1", PROMPT, 3))
        b.run()
        st = b.workers[0].kvdock_stats
        assert st["loads"] == 1 and st["loads_ok"] + st["loads_failed"] == 1
        assert b.violations == []  # loaded whole, or reported
        assert [r.request_id for r in b.finished] == ["b1"] and not b.delayed
        _same_blocks(a, b, "a1", "b1", REACHABLE // BS)
    finally:
        a.shutdown()
        b.shutdown()


def test_daemon_killed_while_saving_and_gone_for_lookups(daemon):
    a = _engine(daemon)
    try:
        steps = []

        def kill(engine, meta):
            steps.append(len(meta.stores))
            if len(steps) == 2:
                daemon.kill()  # after the first step queued its offloads

        a.after_meta = kill
        a.add(Request("a1", PROMPT, 4))
        a.add(Request("a2", PROMPT[::-1], 4))
        a.run()
        assert steps[0] == 2  # both prompts' blocks were to be saved
        assert sorted(r.request_id for r in a.finished) == ["a1", "a2"]
        assert not a.delayed  # their saves were reported finished: blocks freed
        # the scheduler asks a dead daemon: no hit, and no wait
        a.add(Request("a3", PROMPT, 1))
        t0 = time.monotonic()
        a.run()
        assert a.claims["a3"] == [(0, False)] and a.violations == []
        assert time.monotonic() - t0 < 60  # a bound only
    finally:
        a.shutdown()
