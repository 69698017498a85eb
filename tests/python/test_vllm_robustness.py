"""The vLLM connector where things go wrong: what it must never do even then.

(H1) a model of several KV cache groups on a vLLM whose scheduler recovers
     failed loads of one group only (vllm_engine's recovery="one_group"
     raises as vLLM's does): the connector never claims a hit there, and
     still stores; kvdock_multi_group_loads turns loads on for a vLLM that
     recovers every group; the installed vLLM's recovery is read from its
     source.
(H3) store-client lookups of more namespaces than one call may name (TP 8 x
     3 groups) and of more keys than the daemon's batch.
(H4) a failing daemon: the store client stays open, lookups back off 1 s,
     2 s, ... 30 s; a hung daemon stalls a lookup for kvdock_lookup_timeout_ms
     at most.
(M1) a failed start_layer_wise_loading is tried again; the rows of a load or
     an offload go back to vLLM only once its completion came, even when it
     comes later than the connector's old bound (2 x timeout).
"""

import os
import signal
import sys
import time
import types

import pytest

import kvdock
import kvdock.engine
from kvdock.vllm import connector as conn

from vllm_engine import Engine, Request

from test_vllm_connector import BS, PROMPT, REACHABLE, _engine, _serve  # noqa: E402


def _evict_all_after_the_lookup(daemon, engine):
    evicted = []

    def evict(e, meta):
        if meta.loads and not evicted:
            evicted.append(daemon.cli("evict", "--all", "--json").stdout.decode())

    engine.after_meta = evict
    return evicted


# ------------------------------------------------------------------- H1

HYBRIDS = {
    "kv+mamba": dict(n_attn=2, n_mamba=2, layout="hma", prefill_chunk=48),
    "kv+swa": dict(n_attn=2, n_swa=2, window=40),
}


@pytest.mark.parametrize("model", sorted(HYBRIDS))
def test_one_group_vllm_never_gets_a_hit_of_several_groups(daemon, model):
    kw = HYBRIDS[model]
    a = _engine(daemon, recovery="one_group", **kw)
    b = _engine(daemon, recovery="one_group", **kw)
    try:
        _serve(a, "a1")
        # still stored, every group
        assert a.workers[0].kvdock_stats["offloads_ok"] >= 2
        keys = kvdock.page_keys(PROMPT[:REACHABLE], BS)
        model_id = a.workers[0]._settings.model_id
        with kvdock.StoreClient(socket_path=daemon.socket) as c:
            for p in a.workers[0]._settings.plans:
                ns = conn.namespace_name(model_id, p.pool_name)
                assert c.lookup(ns, keys, trailing=[p.trailing_pages]), ns
        # the load would fail (evicted after the lookup): vLLM would raise
        # in its recovery; the connector claimed nothing, so nothing fails
        evicted = _evict_all_after_the_lookup(daemon, b)
        _serve(b, "b1")
        assert b.claims["b1"] == [(0, False)]
        assert evicted == [] and not any(b.invalid_seen) and b.violations == []
        assert b.workers[0].kvdock_stats["loads"] == 0
        assert "one group" in b.sched._scheduler.no_loads
    finally:
        a.shutdown()
        b.shutdown()


def test_multi_group_loads_override_turns_loads_on(daemon):
    kw = dict(HYBRIDS["kv+mamba"], recovery="one_group",
              extra={"kvdock_multi_group_loads": "true"})
    a = _engine(daemon, **kw)
    b = _engine(daemon, **kw)
    c = _engine(daemon, **kw)
    try:
        _serve(a, "a1")
        _serve(b, "b1")  # claimed and loaded: nothing failed
        assert b.claims["b1"] == [(REACHABLE, False)] and b.violations == []
        assert b.workers[0].kvdock_stats["loads_ok"] == 1
        # and why it is off by default: a failed load crashes such a scheduler
        _evict_all_after_the_lookup(daemon, c)
        with pytest.raises(ValueError):
            _serve(c, "c1")
    finally:
        a.shutdown()
        b.shutdown()
        c.shutdown()


ONE_GROUP_SOURCE = '''
    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids):
        for request in requests:
            (req_block_ids,) = self.kv_cache_manager.get_block_ids(request.request_id)
            for block_id in req_block_ids:
                pass
'''

EVERY_GROUP_SOURCE = '''
    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids):
        for request in requests:
            groups = self.kv_cache_manager.get_block_ids(request.request_id)
            for block_ids in groups:
                pass
'''


def test_recovery_of_the_installed_vllm_is_read_from_its_source(tmp_path, monkeypatch):
    assert conn.recovers_every_group(ONE_GROUP_SOURCE)[0] is False
    assert conn.recovers_every_group(ONE_GROUP_SOURCE.replace(
        "(req_block_ids,) = self.kv_cache_manager.get_block_ids(request.request_id)",
        "req_block_ids = self.kv_cache_manager.get_block_ids(request.request_id)[0]"))[0] is False
    assert conn.recovers_every_group(EVERY_GROUP_SOURCE) == (True, "")
    assert conn.recovers_every_group("")[0] is False  # a scheduler without recovery
    assert conn.recovers_every_group(None)[0] is False  # cannot tell: safe
    assert conn.multi_group_loads({}, 1, ONE_GROUP_SOURCE) is None  # one group: always on
    assert conn.multi_group_loads({}, 2, EVERY_GROUP_SOURCE) is None
    assert conn.multi_group_loads({}, 2, ONE_GROUP_SOURCE)
    assert conn.multi_group_loads({"kvdock_multi_group_loads": True}, 2, ONE_GROUP_SOURCE) is None
    assert conn.multi_group_loads({"kvdock_multi_group_loads": "false"}, 2, EVERY_GROUP_SOURCE)

    # an importable vLLM: its scheduler's source is what decides
    assert conn.scheduler_recovery_source() is None  # none installed here
    for source, ok in ((ONE_GROUP_SOURCE, False), (EVERY_GROUP_SOURCE, True)):
        path = tmp_path / ("sched_%s.py" % ok)
        path.write_text("class Scheduler:\n" + source)
        mods = {}
        for name in ("vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched"):
            mods[name] = types.ModuleType(name)
        import importlib.util

        spec = importlib.util.spec_from_file_location("vllm.v1.core.sched.scheduler", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mods["vllm.v1.core.sched.scheduler"] = mod
        mods["vllm.v1.core.sched"].scheduler = mod
        with monkeypatch.context() as m:
            for name, mo in mods.items():
                m.setitem(sys.modules, name, mo)
            got = conn.scheduler_recovery_source()
            assert "_update_requests_with_invalid_blocks" in got
            assert conn.recovers_every_group(got)[0] is ok
            assert (conn.multi_group_loads({}, 3) is None) is ok


# ------------------------------------------------------------------- H3


@pytest.mark.skipif(not kvdock._lib.has("kvd_store_open"), reason="no store client")
def test_store_lookups_of_more_namespaces_than_one_call_names(daemon):
    # TP 8 x (kv, swa, mamba): 24 namespaces; one call names 16 at most
    kw = dict(tp_size=8, n_attn=1, n_swa=1, n_mamba=1, window=40, prefill_chunk=48,
              extra={"kvdock_lookup": "store"})
    a = _engine(daemon, **kw)
    b = _engine(daemon, **kw)
    try:
        assert len(b.sched._scheduler.namespaces) == 24
        _serve(a, "a1", max_tokens=1)
        _serve(b, "b1", max_tokens=1)
        assert b.claims["b1"] == [(REACHABLE, False)] and b.violations == []
        assert all(w.kvdock_stats["loads_ok"] == 1 for w in b.workers)
        assert b.sched._scheduler.failed_lookups == 0
    finally:
        a.shutdown()
        b.shutdown()


class _FakeClient:
    """A store client answering from {namespace: boundaries}, as the C
    side checks its arguments."""

    def __init__(self, stored, max_batch, says_batch=True):
        self.stored, self.max_batch, self.calls = stored, max_batch, []
        self.says_batch = says_batch  # the library tells the daemon's --max-batch

    def limits(self):
        if not self.says_batch:  # an older library
            raise AttributeError("limits")
        return {"max_batch": self.max_batch, "max_frame_bytes": 1 << 20}

    def lookup(self, namespaces, keys, trailing=None):
        self.calls.append((len(namespaces), len(keys)))
        if len(namespaces) > kvdock._lib.KVD_MAX_POOLS:
            raise kvdock.InvalidError(message="a lookup names 1 to 16 namespaces")
        if len(keys) > self.max_batch:
            raise kvdock.TooLargeError(message="too large")
        common = set(range(1, len(keys) + 1))
        for ns in namespaces:
            common &= set(self.stored[ns])
        return sorted(common)


def test_store_view_chunks_namespaces_and_learns_the_batch():
    view = conn._StoreView.__new__(conn._StoreView)
    view.namespaces = ["ns%d" % i for i in range(40)]
    view.trailing = [0] * 40
    view.log = kvdock.engine.RateLimitedLog()
    view.max_ns = kvdock._lib.KVD_MAX_POOLS
    view.max_keys = conn._StoreView.MAX_KEYS
    stored = {ns: range(1, 6000) for ns in view.namespaces}
    stored["ns33"] = [b for b in range(1, 6000) if b != 3000]  # one namespace lacks one
    view.client = _FakeClient(stored, max_batch=1000)
    keys = [bytes(32)] * 5000
    got = view.lookup(keys)
    assert got == [b for b in range(1, 1001)]  # capped at the daemon's batch, learnt
    assert all(n <= 16 for n, _ in view.client.calls)
    assert view.max_keys == 1000
    view.max_keys = conn._StoreView.MAX_KEYS
    view.client = _FakeClient(stored, max_batch=700, says_batch=False)
    assert view.lookup(keys) == [b for b in range(1, 513)]  # halved until it fits
    view.client.calls.clear()
    view.client.max_batch = 5000
    view.max_keys = conn._StoreView.MAX_KEYS
    got = view.lookup(keys)
    assert got == [b for b in range(1, 4097) if b != 3000]  # 4096: the default batch
    assert max(k for _, k in view.client.calls) == 4096
    assert sorted(n for n, _ in view.client.calls) == [8, 16, 16]


@pytest.mark.skipif(not kvdock._lib.has("kvd_store_open"), reason="no store client")
def test_store_lookups_past_the_daemons_batch(daemon_factory):
    d = daemon_factory("--max-batch", "64")
    prompt = [(i * 53 + 7) % 4999 + 1 for i in range(80 * BS + 1)]  # 80 pages reachable
    a = Engine(d.socket, block_size=BS, timeout_ms=3000, num_blocks=200,
               extra={"kvdock_lookup": "store"})
    b = Engine(d.socket, block_size=BS, timeout_ms=3000, num_blocks=200,
               extra={"kvdock_lookup": "store"})
    try:
        _serve(a, "a1", prompt, 1)
        _serve(b, "b1", prompt, 1)
        # the lookup probes the daemon's batch of keys at most: 64 pages
        assert b.claims["b1"] == [(64 * BS, False)] and b.violations == []
        assert b.workers[0].kvdock_stats["loads_ok"] == 1
        assert b.sched._scheduler.failed_lookups == 0
    finally:
        a.shutdown()
        b.shutdown()


# ------------------------------------------------------------------- H4


class _Clock:
    """time for the connector's modules: the real clock plus an offset a
    test moves on."""

    def __init__(self):
        self.offset = 0.0
        self.sleep = time.sleep

    def monotonic(self):
        return time.monotonic() + self.offset


@pytest.mark.skipif(not kvdock._lib.has("kvd_store_open"), reason="no store client")
def test_lookups_back_off_and_keep_the_store_client_open(daemon, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(conn, "time", clock)
    a = _engine(daemon, extra={"kvdock_lookup": "store"})
    try:
        _serve(a, "a1", max_tokens=1)
        s = a.sched._scheduler
        assert a.sched.get_num_new_matched_tokens(Request("hit", PROMPT), 0) == (REACHABLE, False)
        view = s.view
        daemon.kill()

        def ask(rid):
            assert a.sched.get_num_new_matched_tokens(Request(rid, PROMPT), 0) == (0, False)
            return s.failed_lookups

        assert ask("q0") == 1
        for i, backoff in enumerate([1, 2, 4, 8, 16, 30, 30]):
            # not asked again before the backoff is over, asked right after
            clock.offset += backoff / 2
            assert ask("early%d" % i) == i + 1
            clock.offset += backoff / 2 + 0.5
            assert ask("late%d" % i) == i + 2
            assert s.view is view  # never closed
        assert s.views_opened == 1  # nor opened again
        daemon.restart(fresh=True)
        # the same client, its handle reconnected: the daemon, started
        # empty, knows no namespace yet (nothing stored), which is no
        # failure
        assert a.sched.get_num_new_matched_tokens(Request("after", PROMPT), 0) == (0, False)
        clock.offset += 31
        assert a.sched.get_num_new_matched_tokens(Request("after", PROMPT), 0) == (0, False)
        assert s.failed_lookups == 8 and s.backoff == 0 and s.view is view
    finally:
        a.shutdown()


@pytest.mark.skipif(not kvdock._lib.has("kvd_store_open"), reason="no store client")
def test_hung_daemon_stalls_a_lookup_for_its_lookup_timeout_only(daemon):
    a = _engine(daemon, timeout_ms=40000,
                extra={"kvdock_lookup": "store", "kvdock_lookup_timeout_ms": 500})
    stopped = False
    try:
        _serve(a, "a1", max_tokens=1)
        os.kill(daemon.pid, signal.SIGSTOP)
        stopped = True
        t0 = time.monotonic()
        assert a.sched.get_num_new_matched_tokens(Request("q", PROMPT), 0) == (0, False)
        assert time.monotonic() - t0 < 20  # a bound: the linker's 40 s would be past it
        assert a.sched._scheduler.failed_lookups == 1
    finally:
        if stopped:
            os.kill(daemon.pid, signal.SIGCONT)
        a.shutdown()


# ------------------------------------------------------------------- M1


def test_a_failed_start_is_tried_again(daemon):
    a = _engine(daemon)
    b = _engine(daemon)
    try:
        _serve(a, "a1")
        lk = b.workers[0]._worker.linker
        real, fails = lk.start_layer_wise_loading, []

        def start():
            if not fails:
                fails.append(1)
                raise kvdock.NoMemError(message="injected")
            return real()

        lk.start_layer_wise_loading = start
        _serve(b, "b1")
        assert fails and b.claims["b1"] == [(REACHABLE, False)]
        st = b.workers[0].kvdock_stats
        assert st["loads_ok"] == 1 and st["loads_failed"] == 0
        assert not any(b.invalid_seen) and b.violations == []
    finally:
        a.shutdown()
        b.shutdown()


def _late_completions(monkeypatch, method, linkers, late_s):
    """Linker.<method> of `linkers` hands back nothing at its first call and
    moves the connector's clock on by late_s there: its completions come
    back late_s after the waiter began. Returns the ids handed back."""
    clock = _Clock()
    monkeypatch.setattr(conn, "time", clock)
    monkeypatch.setattr(kvdock.engine, "time", clock)
    real = getattr(kvdock.Linker, method)
    state = {"held": [], "armed": False, "back": set()}

    def pop(self, max=1024):
        got = real(self, max)
        if self not in linkers():
            return got
        if not state["armed"]:
            state["armed"] = True
            clock.offset += late_s
            state["held"].extend(got)
            return []
        got = state["held"] + got
        state["held"] = []
        state["back"].update(i for i, _ in got)
        return got

    monkeypatch.setattr(kvdock.Linker, method, pop)
    return state


def test_a_load_is_waited_for_until_its_completion_came(daemon, monkeypatch):
    a = _engine(daemon)
    _serve(a, "a1")
    made = []
    state = _late_completions(monkeypatch, "pop_completed_loads",
                              lambda: {w._worker.linker for e in made for w in e.workers}, 9.0)
    b = _engine(daemon)  # the connector's old bound: 2 x 3 s; its completion takes 9
    made.append(b)
    try:
        _serve(b, "b1")
        assert state["armed"] and state["back"]
        st = b.workers[0].kvdock_stats
        assert st["loads_ok"] == 1 and st["loads_failed"] == 0
        assert not any(b.invalid_seen) and b.violations == []
    finally:
        a.shutdown()
        b.shutdown()


def test_an_offload_is_waited_for_until_its_completion_came(daemon, monkeypatch):
    # sliding-window blocks are freed while the request runs: wait_for_save
    # waits for their offloads; it must not return before they came back
    queued, early, made = [], [], []
    real_offload = kvdock.Linker.offload

    def offload(self, transfers):
        ack = real_offload(self, transfers)
        queued.append((ack, transfers[0].pool.name))
        return ack

    monkeypatch.setattr(kvdock.Linker, "offload", offload)
    state = _late_completions(monkeypatch, "pop_completed_offloads",
                              lambda: {w._worker.linker for e in made for w in e.workers}, 9.0)
    a = _engine(daemon, n_attn=1, n_swa=1, window=40)
    made.append(a)
    w = a.workers[0]
    real_wait = w.wait_for_save

    def wait_for_save():
        real_wait()
        early.extend(ack for ack, pool in queued if pool.startswith("swa")
                     and ack not in state["back"])

    w.wait_for_save = wait_for_save
    try:
        _serve(a, "a1")
        assert state["armed"] and any(p.startswith("swa") for _, p in queued)
        assert early == []  # every window offload came back before its blocks went
        st = w.kvdock_stats
        assert st["offloads_ok"] == st["offloads"] and st["offloads_failed"] == 0
    finally:
        a.shutdown()
