"""Every error path of the binding that a test can provoke: each raises the
KvdockError subclass named after the C status (kvd_status.h, read here),
with .status the C value and, where the daemon refused, .message its
reason. Daemons that stop, hang, drain or refuse this process's
credential; every call bounded.
"""

import builtins
import os
import re
import signal
import time

import numpy as np
import pytest

import kvdock
from binding_util import (PagedPool, SlotPool, bounded, namespace, offload_and_wait, pop_until,
                          sha_chain, tokens_of)
from conftest import REPO

# The Python class each C status is named after (the binding's documented
# surface), and what kvd_status.h says its value is.
CLASS_OF = {
    "INVALID": "InvalidError", "NOMEM": "NoMemError", "IO": "IoError",
    "NOT_FOUND": "NotFoundError", "EXISTS": "ExistsError", "BUSY": "BusyError",
    "NO_SPACE": "NoSpaceError", "TIMEOUT": "TimeoutError", "PROTOCOL": "ProtocolError",
    "UNSUPPORTED": "UnsupportedError", "CLOSED": "ClosedError", "TOO_LARGE": "TooLargeError",
    "STATE": "StateError", "PERMISSION": "PermissionDeniedError",
    "UNAVAILABLE": "UnavailableError", "UNKNOWN_METHOD": "UnknownMethodError",
    "DRAINING": "DrainingError", "AUTH": "AuthError", "QUOTA": "QuotaError",
    "CORRUPT": "CorruptError",
    "NO_DEVICE": "NoDeviceError",
    "NOT_DEVICE": "NotDeviceError",
    "DEVICE": "DeviceError",
}


def c_statuses():
    with open(os.path.join(REPO, "common", "kvd_status.h")) as f:
        text = f.read()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"KVD_ERR_(\w+)\s*=\s*(-\d+)", text)}


def raises(cls, fn):
    """fn() raises exactly cls (a KvdockError subclass) with its C status;
    returns the exception."""
    with pytest.raises(kvdock.KvdockError) as ei:
        fn()
    e = ei.value
    assert type(e) is cls, "%s, not %s: %s" % (type(e).__name__, cls.__name__, e)
    assert e.status == cls.status and isinstance(e.message, str) and e.message
    return e


# ------------------------------------------------------ the status table

def test_every_c_status_has_its_class():
    st = c_statuses()
    assert set(st) == set(CLASS_OF), "kvd_status.h and the binding's classes differ"
    for c_name, value in st.items():
        cls = getattr(kvdock, CLASS_OF[c_name])
        assert issubclass(cls, kvdock.KvdockError)
        assert cls.status == value and cls.c_name == "KVD_ERR_" + c_name
        assert kvdock.error_class(value) is cls
        e = cls(value, "why")
        assert (e.status, e.message) == (value, "why") and "why" in str(e)
        assert kvdock.strerror(value) not in ("", "unknown status")
    assert kvdock.error_class(-1000) is kvdock.KvdockError
    assert issubclass(kvdock.TimeoutError, builtins.TimeoutError)
    assert kvdock.TimeoutError is not builtins.TimeoutError
    assert issubclass(kvdock.CallbackError, kvdock.KvdockError)


# ------------------------------------------------------------- opening

def test_open_without_a_daemon_is_unavailable(tmp_path):
    e = raises(kvdock.UnavailableError,
               lambda: kvdock.Linker(socket_path=str(tmp_path / "none.sock"), timeout_ms=5000))
    assert e.status == -15


@pytest.mark.parametrize("cfg", [dict(tp_rank=2, tp_size=2), dict(tp_rank=-1),
                                 dict(pp_rank=1, pp_size=1), dict(cp_rank=3, cp_size=2),
                                 dict(transport="carrier-pigeon"), dict(ucx_mode="smoke")])
def test_open_with_a_bad_config_is_invalid(daemon, cfg):
    raises(kvdock.InvalidError, lambda: kvdock.Linker(socket_path=daemon.socket, **cfg))


def test_open_with_a_missing_token_file(daemon, tmp_path):
    raises(kvdock.NotFoundError, lambda: kvdock.Linker(
        socket_path=daemon.socket, auth_token_file=str(tmp_path / "absent")))


def test_ucx_to_a_daemon_serving_no_ucx_is_unsupported(daemon):
    raises(kvdock.UnsupportedError,
           lambda: kvdock.Linker(socket_path=daemon.socket, transport="ucx", timeout_ms=10000))


def test_a_refused_hello_carries_the_daemons_reason(daemon):
    e = raises(kvdock.UnsupportedError,
               lambda: kvdock.Linker(socket_path=daemon.socket, transport="ucx", timeout_ms=10000))
    assert "ucx" in e.message.lower() and e.message != kvdock.strerror(e.status)


# ----------------------------------------------------------- auth, quota

def _token(path, text):
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def token_daemon(daemon_factory, tmp_path, monkeypatch):
    """A daemon that serves only a token's holder (and uid 12345): not this
    process's uid. The fixture's readiness probe (the CLI) shows the token."""
    good = _token(tmp_path / "good", "a-token-of-forty-bytes-0123456789abcdef")
    monkeypatch.setenv("KVDOCK_AUTH_TOKEN_FILE", good)
    d = daemon_factory("--allow-uid", "12345", "--auth-token-file", good)
    monkeypatch.delenv("KVDOCK_AUTH_TOKEN_FILE")  # libkvdock reads it at open too
    assert os.getuid() != 12345
    d.good = good
    d.bad = _token(tmp_path / "bad", "another-token")
    return d


def test_a_daemon_refusing_this_uid_raises_auth_error(token_daemon):
    e = raises(kvdock.AuthError, lambda: kvdock.Linker(socket_path=token_daemon.socket,
                                                        timeout_ms=10000))
    assert e.status == -18
    raises(kvdock.AuthError, lambda: kvdock.Linker(socket_path=token_daemon.socket,
                                                   auth_token_file=token_daemon.bad,
                                                   timeout_ms=10000))
    with kvdock.Linker(socket_path=token_daemon.socket, auth_token_file=token_daemon.good,
                       timeout_ms=10000) as lk:
        assert lk.health()[0] == "ready"


def test_the_token_may_come_from_the_environment(token_daemon, monkeypatch):
    monkeypatch.setenv("KVDOCK_AUTH_TOKEN_FILE", token_daemon.good)
    with kvdock.Linker(socket_path=token_daemon.socket, timeout_ms=10000) as lk:
        assert lk.health()[0] == "ready"
    monkeypatch.setenv("KVDOCK_AUTH_TOKEN_FILE", token_daemon.bad)
    raises(kvdock.AuthError, lambda: kvdock.Linker(socket_path=token_daemon.socket,
                                                   timeout_ms=10000))


def test_an_auth_error_carries_the_daemons_reason(token_daemon):
    e = raises(kvdock.AuthError, lambda: kvdock.Linker(socket_path=token_daemon.socket,
                                                        timeout_ms=10000))
    assert "uid" in e.message and e.message != kvdock.strerror(e.status)


def test_a_tenants_namespace_quota_raises_quota_error(daemon_factory, linker_factory, tmp_path):
    conf = tmp_path / "auth.conf"
    conf.write_text("tenant small max-namespaces=1\nuid small %d\n" % os.getuid())
    d = daemon_factory("--auth-config", str(conf))
    lk = linker_factory(d, model_id="q")
    lk.register_pool("kv", {0: [np.zeros((16, 16), np.uint8)]})
    e = raises(kvdock.QuotaError,
               lambda: lk.register_pool("swa", {1: [np.zeros((16, 16), np.uint8)]}))
    assert e.status == -19 and "small" in e.message  # the daemon's reason names the tenant
    assert e.message != kvdock.strerror(e.status)
    assert len(lk.pools) == 1


# ------------------------------------------------------- the daemon refuses

def test_a_namespace_re_registered_with_another_size(daemon, linker_factory):
    a = linker_factory(daemon, model_id="m")
    b = linker_factory(daemon, model_id="m")
    a.register_pool("kv", {0: [np.zeros((16, 32), np.uint8)]}, page_size=4)  # 128-byte objects
    # libkvdock's header names EXISTS as the example; the daemon answers INVALID
    # (daemon/rpc_store.c, tests/daemon/test_store_errors.c)
    e = raises(kvdock.InvalidError,
               lambda: b.register_pool("kv", {0: [np.zeros((16, 64), np.uint8)]}, page_size=4))
    assert namespace("m", "kv") in e.message and "128" in e.message and "256" in e.message
    assert b.pools == []
    same = b.register_pool("kv", {0: [np.zeros((16, 32), np.uint8)]}, page_size=4)
    assert same.object_bytes == 128


def test_a_load_of_a_missing_key_is_not_found_and_stays_recorded(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=1, n_buf=1, bpr=16, ps=4)
    keys = sha_chain(tokens_of(20, 12), 4)
    kv.fill_pages(keys[:1], 0)
    assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys[:1], indices=kv.indices(0, 1)))
    e = raises(kvdock.NotFoundError,
               lambda: lk.load(4, kvdock.Transfer(kv.pool, keys, indices=kv.indices(16, 3))))
    # the daemon's reason: the first key missing (the second page's), in hex
    assert keys[1].hex()[:16] in e.message and e.message != kvdock.strerror(-4)
    assert kv.pool.stats()["load_failures"] == 1
    # a failed load cannot be prepared or committed; ABORT hands its indices back
    raises(kvdock.StateError, lambda: lk.prepare(4))
    raises(kvdock.StateError, lambda: lk.commit(4, [(0, 3)]))
    assert kv.freed == []
    lk.abort(4)
    assert sorted(kv.freed) == kv.indices(16, 3)
    raises(kvdock.NotFoundError, lambda: lk.abort(4))
    # nothing stayed pinned: the stored page loads again under the same rid
    lk.load(4, kvdock.Transfer(kv.pool, keys[:1], indices=kv.indices(32, 1)))
    lk.abort(4)


def test_unknown_rids_and_counters_are_not_found(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    PagedPool(lk)
    raises(kvdock.NotFoundError, lambda: lk.prepare(4242))
    raises(kvdock.NotFoundError, lambda: lk.commit(4242, [(0, 1)]))
    raises(kvdock.NotFoundError, lambda: lk.abort(4242))
    raises(kvdock.NotFoundError, lambda: lk.wait_layer(987654, 0))


def test_the_protocols_order_is_enforced(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=1, n_buf=1, bpr=16, ps=4)
    keys = sha_chain(tokens_of(21, 8), 4)
    kv.fill_pages(keys, 0)
    assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys, indices=kv.indices(0, 2)))
    t = kvdock.Transfer(kv.pool, keys, indices=kv.indices(8, 2))
    lk.load(9, t)
    raises(kvdock.ExistsError, lambda: lk.load(9, t))  # one load per rid
    lk.prepare(9)
    raises(kvdock.StateError, lambda: lk.prepare(9))
    raises(kvdock.InvalidError, lambda: lk.commit(9, [(0, 2), (0, 0)]))  # not the load's count
    raises(kvdock.InvalidError, lambda: lk.commit(9, [(0, 3)]))  # past the transfer
    raises(kvdock.InvalidError, lambda: lk.commit(9, [(2, 1)]))
    lk.commit(9, [(0, 2)])
    raises(kvdock.StateError, lambda: lk.commit(9, [(0, 2)]))
    raises(kvdock.StateError, lambda: lk.abort(9))
    counter = lk.start_layer_wise_loading()
    lk.wait_layer(counter, 0)
    assert pop_until(lk.pop_completed_loads, [9]) == {9: True}
    raises(kvdock.NotFoundError, lambda: lk.abort(9))  # done and gone
    kv.check_pages(keys, lambda i: 8 + 4 * i)


def test_bad_transfers_are_invalid(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk, layers=1, n_buf=1, n_rows=64, bpr=16, ps=4)
    st = SlotPool(lk, n_slots=4, layer_ids=[1])
    keys = sha_chain(tokens_of(22, 8), 4)
    T = kvdock.Transfer
    bad_loads = {
        "too few indices": [T(kv.pool, keys, indices=range(7))],
        "too many indices": [T(kv.pool, keys, indices=range(9))],
        "a page not at a multiple of the page size": [T(kv.pool, keys, indices=range(2, 10))],
        "a page's slots not consecutive": [T(kv.pool, keys, indices=[0, 1, 2, 3, 8, 9, 11, 10])],
        "rows past the pool": [T(kv.pool, keys, indices=range(60, 68))],
        "negative rows": [T(kv.pool, keys, indices=range(-8, 0))],
        "two pages on one page's rows": [T(kv.pool, keys, indices=[4, 5, 6, 7] * 2)],
        "one pool in two transfers": [T(kv.pool, keys[:1], indices=range(4)),
                                      T(kv.pool, keys[1:], indices=range(4, 8))],
        "a slot past the pool": [T(st.pool, keys[1:], indices=[4])],
        "two slots for one key": [T(st.pool, keys[1:], indices=[0, 1])],
        "an unknown pool id": [T(7, keys, indices=range(8))],
        "no transfer": [],
    }
    for what, transfers in bad_loads.items():
        try:
            lk.load(30, transfers)
        except kvdock.KvdockError as e:
            assert type(e) is kvdock.InvalidError and e.status == -1, (what, e)
        else:
            pytest.fail("a load with %s was accepted" % what)
    raises(kvdock.NotFoundError, lambda: lk.abort(30))  # invalid loads record nothing
    raises(kvdock.InvalidError, lambda: lk.lookup(1, [T(7, keys)]))
    raises(kvdock.InvalidError, lambda: lk.lookup(1, []))
    raises(kvdock.InvalidError, lambda: lk.offload([T(7, keys, indices=range(8))]))
    raises(kvdock.InvalidError, lambda: lk.offload([T(kv.pool, keys, indices=range(5))]))
    raises(kvdock.InvalidError, lambda: lk.pool_stats(7))
    assert lk.pop_completed_offloads() == []  # nothing was queued


@pytest.mark.parametrize("bad", [
    lambda p: kvdock.Transfer(p, [b"short"]),
    lambda p: kvdock.Transfer(p, b"x" * 33),
    lambda p: kvdock.Transfer(p, np.zeros((2, 31), np.uint8)),
    lambda p: kvdock.Transfer(p, np.zeros((2, 32), np.int32)),
    lambda p: kvdock.Transfer(p, [bytes(32)], prior_key=b"x" * 31),
    lambda p: kvdock.Transfer(p, [bytes(32)], depths=[-1]),
    lambda p: kvdock.Transfer(p, [b"x" * 32, b"y" * 33]),
    lambda p: kvdock.Transfer(p, [bytes(32), 7]),
    lambda p: kvdock.Transfer(p, [bytes(32), "a str of thirty-two characters.."]),
    lambda p: kvdock.Transfer(p, [np.zeros(32, np.int16)]),
], ids=["short key", "ragged block", "narrow array", "not uint8", "short prior",
        "negative depth", "a 33-byte key", "an int", "a str", "32 int16s"])
def test_malformed_transfers_are_refused_as_made(daemon, linker_factory, bad):
    lk = linker_factory(daemon, model_id="m")
    pool = PagedPool(lk).pool
    raises(kvdock.InvalidError, lambda: bad(pool))


def test_a_transfer_list_of_something_else_is_invalid(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    kv = PagedPool(lk)
    raises(kvdock.InvalidError, lambda: lk.lookup(1, [("kv", [bytes(32)])]))
    t = kvdock.Transfer(kv.pool, [bytes(32)] * 2, depths=[0, 1, 2], indices=range(8))
    raises(kvdock.InvalidError, lambda: lk.offload(t))  # 3 depths for 2 keys


def test_bad_pool_descriptions(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m")
    buf = lambda rows=16: np.zeros((rows, 16), np.uint8)  # noqa: E731
    raises(kvdock.InvalidError, lambda: lk.register_pool("kv", {}))
    raises(kvdock.InvalidError, lambda: lk.register_pool("kv", [(0, [buf()]), (0, [buf()])]))
    raises(kvdock.InvalidError, lambda: lk.register_pool("kv", {0: [buf() for _ in range(9)]}))
    raises(kvdock.InvalidError, lambda: lk.register_pool("kv", {0: []}))
    raises(kvdock.InvalidError, lambda: lk.register_pool("kv", {0: [buf(16), buf(8)]}))
    raises(kvdock.InvalidError, lambda: lk.register_pool("kv", {0: [buf(8)]}, n_rows=9))
    raises(kvdock.InvalidError, lambda: lk.register_pool("kv", {0: [buf()]}, addressing="tree"))
    raises(kvdock.InvalidError, lambda: lk.register_pool("kv", {0: [buf()]}, page_size=0))
    raises(kvdock.InvalidError, lambda: lk.register_pool("", {0: [buf()]}))
    raises(kvdock.InvalidError, lambda: lk.register_pool("kv", {0: [buf()]}, free_indices=3))
    raises(kvdock.InvalidError, lambda: lk.register_pool("kv", [0, 1]))
    assert lk.pools == []
    pools = [lk.register_pool("p%d" % i, {0: [buf()]}) for i in range(16)]
    assert [p.id for p in pools] == list(range(16))
    e = raises(kvdock.NoSpaceError, lambda: lk.register_pool("p16", {0: [buf()]}))
    assert e.status == -7


# ------------------------------------------------- daemons that go away

def _calls_that_ask_the_daemon(lk, kv, keys):
    return {
        "health": lambda: lk.health(),
        "lookup": lambda: lk.lookup(1, [kvdock.Transfer(kv.pool, keys)]),
        "load": lambda: lk.load(2, [kvdock.Transfer(kv.pool, keys, indices=kv.indices(16, 2))]),
        "register_pool": lambda: lk.register_pool("late", {9: [np.zeros((16, 16), np.uint8)]}),
    }


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_calls_after_the_daemon_stopped_fail_and_never_hang(daemon, linker_factory, sig):
    lk = linker_factory(daemon, model_id="m", timeout_ms=5000)
    kv = PagedPool(lk, layers=1, n_buf=1, bpr=16, ps=4)
    keys = sha_chain(tokens_of(23, 8), 4)
    kv.fill_pages(keys, 0)
    assert offload_and_wait(lk, kvdock.Transfer(kv.pool, keys, indices=kv.indices(0, 2)))
    daemon.stop(sig)
    for name, call in _calls_that_ask_the_daemon(lk, kv, keys).items():
        how, what = bounded(call)
        assert how == "raised" and isinstance(what, kvdock.KvdockError), (name, how, what)
        assert type(what) in (kvdock.ClosedError, kvdock.UnavailableError), (name, what)
        assert what.status in (-11, -15) and what.message
    # an offload is queued and fails, or fails at once: never a hang
    how, what = bounded(lambda: lk.offload(kvdock.Transfer(kv.pool, keys,
                                                          indices=kv.indices(0, 2))))
    if how == "ok":
        assert pop_until(lk.pop_completed_offloads, [what]) == {what: False}
    else:
        assert isinstance(what, kvdock.KvdockError)
    # a daemon back on the socket: the next call reconnects
    daemon.start()
    deadline = time.monotonic() + 60
    while True:
        how, what = bounded(lk.health)
        if how == "ok":
            break
        assert isinstance(what, kvdock.KvdockError)
        assert time.monotonic() < deadline, "no reconnection within 60 s: %s" % what
        time.sleep(0.1)
    assert what[0] == "ready"
    bounded(lambda: lk.lookup(3, [kvdock.Transfer(kv.pool, keys)]))


def test_a_hung_daemon_times_out_within_the_bound(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="m", timeout_ms=1000)
    kv = PagedPool(lk, layers=1, n_buf=1, bpr=16, ps=4)
    keys = sha_chain(tokens_of(24, 4), 4)
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        how, e = bounded(lk.health, timeout=30)
        assert how == "raised" and type(e) is kvdock.TimeoutError, e
        assert isinstance(e, builtins.TimeoutError) and e.status == -8
        assert time.monotonic() - t0 >= 0.9  # it waited for its timeout, not less
        # once hung, calls fail at once for a while (never wait again)
        how, e = bounded(lambda: lk.lookup(1, [kvdock.Transfer(kv.pool, keys)]), timeout=30)
        assert how == "raised" and type(e) is kvdock.TimeoutError
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    deadline = time.monotonic() + 60
    while bounded(lk.health)[0] != "ok":
        assert time.monotonic() < deadline, "the linker did not come back within 60 s"
        time.sleep(0.1)


def test_a_draining_daemon_says_so(daemon_factory, linker_factory):
    d = daemon_factory("--drain-timeout", "30000")
    lk = linker_factory(d, model_id="m")
    assert lk.health()[0] == "ready"
    os.kill(d.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while lk.health()[0] != "draining":
        assert time.monotonic() < deadline, "the daemon never said it drains"
        time.sleep(0.02)
    how, e = bounded(lambda: kvdock.Linker(socket_path=d.socket, timeout_ms=5000))
    assert how == "raised" and type(e) in (kvdock.UnavailableError, kvdock.DrainingError), e
    lk.close()


def test_an_unreadable_token_file_says_why(daemon, tmp_path):
    with pytest.raises(kvdock.NotFoundError) as e:
        kvdock.Linker(socket_path=daemon.socket, auth_token_file=str(tmp_path / "absent"))
    assert "auth_token_file" in e.value.message and "absent" in e.value.message
