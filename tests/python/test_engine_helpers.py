"""kvdock.engine, the pieces the engine adapters share: the key policy,
the shared completion queue (its rules on ids given up and a closed
linker), whole loads with ABORT on failure, the rate-limited log."""

import hashlib
import logging
import threading
import time

import pytest
import torch

import kvdock
from kvdock import engine


def test_page_key_policy():
    digest = hashlib.sha256(b"prefix").digest()
    assert engine.page_key(digest) == digest
    assert engine.page_key(digest.hex()) == digest
    assert engine.page_key(digest.hex().upper()) == digest
    # not 64 hex digits: hashed, and distinct strings stay distinct
    assert engine.page_key("p:" + digest.hex()) == hashlib.sha256(
        ("p:" + digest.hex()).encode()).digest()
    assert engine.page_key("z" * 64) == hashlib.sha256(b"z" * 64).digest()
    assert engine.page_key("a") != engine.page_key("b")
    keys = [digest.hex(), "other", hashlib.sha256(b"2").hexdigest()]
    assert engine.page_key_block(keys) == b"".join(engine.page_key(k) for k in keys)
    assert engine.page_key_block([]) == b""


class FakeQueue:
    """A completion queue filled by the test."""

    def __init__(self):
        self.items = []
        self.lock = threading.Lock()
        self.closed = False

    def put(self, cid, ok=True):
        with self.lock:
            self.items.append((cid, ok))

    def pop(self, max):
        if self.closed:
            raise kvdock.ClosedError(message="closed")
        with self.lock:
            out, self.items = self.items[:max], self.items[max:]
        return out


def test_completions_dispatch_by_id_between_threads():
    q = FakeQueue()
    c = engine.Completions(q.pop)
    results = {}

    def waiter(ids):
        results[tuple(ids)] = c.wait(ids, 30)

    a = threading.Thread(target=waiter, args=([1, 3],))
    b = threading.Thread(target=waiter, args=([2],))
    a.start()
    b.start()
    for cid, ok in ((3, True), (2, False), (1, True)):
        q.put(cid, ok)
    a.join(30)
    b.join(30)
    assert results == {(1, 3): {1: True, 3: True}, (2,): {2: False}}


def test_completions_given_up_ids_are_dropped_when_late(caplog):
    q = FakeQueue()
    c = engine.Completions(q.pop)
    with caplog.at_level(logging.ERROR, logger="kvdock"):
        assert c.wait([7], 0.05) == {7: False}
    assert "broke its bound" in caplog.text
    q.put(7, True)  # comes back late
    q.put(8, True)
    assert c.poll() == {8: True}  # 7 is not handed to anyone
    assert c.take([7, 8]) == {}


def test_completions_closed_linker_fails_pending_at_once():
    q = FakeQueue()
    c = engine.Completions(q.pop)
    q.closed = True
    t0 = time.monotonic()
    assert c.wait([1, 2], 600) == {1: False, 2: False}
    assert time.monotonic() - t0 < 60  # a bound, not a measurement


def test_completions_forget():
    q = FakeQueue()
    c = engine.Completions(q.pop)
    q.put(5)
    assert c.take([9]) == {}  # files 5
    c.forget([5, 6])  # 5 is dropped now, 6 when it comes
    q.put(6)
    assert c.poll() == {}


def test_rate_limited_log_counts_what_it_held(caplog):
    log = engine.RateLimitedLog(interval_s=3600)
    with caplog.at_level(logging.WARNING, logger="kvdock"):
        for i in range(5):
            log.warn("down", "daemon down (%d)", i)
        log.warn("other", "another kind")
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["kvdock: daemon down (0)", "kvdock: another kind"]
    log._interval = 0  # the interval passed
    with caplog.at_level(logging.WARNING, logger="kvdock"):
        log.warn("down", "daemon down (%d)", 9)
    assert caplog.records[-1].getMessage() == \
        "kvdock: daemon down (9) (4 more like it since the last)"


def _wait_offload(lk, ack):
    done = engine.Completions(lk.pop_completed_offloads).wait([ack], 60)
    assert done == {ack: True}


def test_load_whole_restores_and_aborts_a_failed_load(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="eng")
    rows = torch.zeros(32, 16, dtype=torch.uint8)
    freed = []
    pool = lk.register_pool("kv", {0: [rows]}, page_size=4,
                            free_indices=lambda idx: freed.extend(idx.tolist()))
    keys = kvdock.page_keys(range(8), 4)
    rows[:8] = torch.arange(8 * 16, dtype=torch.int64).reshape(8, 16).to(torch.uint8)
    _wait_offload(lk, lk.offload([kvdock.Transfer(pool, keys, indices=range(8))]))

    engine.load_whole(lk, 1, [kvdock.Transfer(pool, keys, indices=range(16, 24))])
    batch = lk.start_layer_wise_loading()
    lk.wait_layer(batch, 0)
    assert engine.Completions(lk.pop_completed_loads).wait([1], 60) == {1: True}
    assert torch.equal(rows[16:24], rows[:8])
    assert freed == []  # everything adopted: nothing handed back

    missing = kvdock.page_keys(range(100, 108), 4)
    with pytest.raises(kvdock.NotFoundError):
        engine.load_whole(lk, 2, [kvdock.Transfer(pool, missing, indices=range(24, 32))])
    assert sorted(freed) == list(range(24, 32))  # ABORT handed the rows back
    with pytest.raises(kvdock.NotFoundError):
        lk.abort(2)  # and the load is gone
