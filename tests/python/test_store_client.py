"""kvdock.StoreClient against a real daemon: the operator's answers agree
with what a linker stored and with the kvdock CLI's own --json."""

import json
import os
import time

import pytest
import torch

import kvdock

PAGE = 4
LAYERS = 2


def _offload_chain(lk, pool, bufs, tokens):
    keys = kvdock.page_keys(tokens, PAGE)
    n = len(keys) * PAGE
    for b in bufs:
        b[:n].copy_(torch.arange(n * b.shape[1], dtype=torch.float32).reshape(n, -1))
    ack = lk.offload([kvdock.Transfer(pool, keys, indices=range(n))])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = lk.pop_completed_offloads()
        if done:
            assert done == [(ack, True)]
            return keys
        time.sleep(0.005)
    pytest.fail("the offload did not complete in 30 s")


@pytest.fixture
def stored(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="sc")
    bufs = [torch.zeros(64, 8) for _ in range(LAYERS)]
    pool = lk.register_pool("kv", {i: [bufs[i]] for i in range(LAYERS)}, page_size=PAGE)
    keys = _offload_chain(lk, pool, bufs, list(range(100, 116)))  # 4 pages
    return pool, keys


def test_health_and_stats(daemon, stored):
    pool, _ = stored
    with kvdock.StoreClient(socket_path=daemon.socket) as c:
        assert c.health() == {"state": "ready", "pool_bytes": 256 << 20}
        st = c.stats()
        cli = json.loads(daemon.cli("stats", "--json").stdout)
        assert st["memory"]["pool_bytes"] == 256 << 20
        ns = [n for n in st["namespaces"] if n["name"] == pool.namespace]
        assert len(ns) == 1
        assert ns[0]["object_bytes"] == PAGE * 8 * 4 * LAYERS
        cli_ns = [n for n in cli["namespaces"] if n["name"] == pool.namespace]
        assert ns[0]["objects_ready"] == cli_ns[0]["objects_ready"] == 4


def test_prefixes_and_lookup(daemon, stored):
    pool, keys = stored
    with kvdock.StoreClient(socket_path=daemon.socket) as c:
        pref = c.prefixes(namespace=pool.namespace)
        assert len(pref) == 1 and pref[0]["pages"] == 4
        assert pref[0]["root"] == keys[0].hex()
        assert c.lookup(pool.namespace, keys) == [1, 2, 3, 4]
        other = kvdock.page_keys(range(200, 208), PAGE)
        assert c.lookup([pool.namespace], other) == []
        with pytest.raises(kvdock.NotFoundError) as e:
            c.lookup("no/such/namespace", keys)
        assert "no/such/namespace" in e.value.message


def test_errors(tmp_path, daemon):
    with pytest.raises(kvdock.UnavailableError) as e:
        kvdock.StoreClient(socket_path=str(tmp_path / "nobody.sock"), timeout_ms=2000)
    assert e.value.status == -15
    c = kvdock.StoreClient(socket_path=daemon.socket)
    c.close()
    c.close()  # idempotent
    with pytest.raises(kvdock.ClosedError):
        c.stats()


def test_token_refused(tmp_path, daemon_factory):
    token = tmp_path / "token"
    token.write_text("s3cret-token-of-the-daemon\n")
    os.chmod(token, 0o600)
    d = daemon_factory("--auth-token-file", str(token), "--allow-uid", "4242")
    wrong = tmp_path / "wrong"
    wrong.write_text("another-token-entirely\n")
    with pytest.raises(kvdock.AuthError):
        kvdock.StoreClient(socket_path=d.socket, auth_token_file=str(wrong))
    with kvdock.StoreClient(socket_path=d.socket, auth_token_file=str(token)) as c:
        assert c.health()["state"] == "ready"
