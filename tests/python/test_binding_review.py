"""The binding's answers to what review found: strides the library would
misread, a callback that calls back in or closes its linker, errors that
are not Exceptions, a symbol an older library lacks."""

import numpy as np
import pytest
import torch

import kvdock
from kvdock import engine

PAGE = 4


def _pool(lk, rows, freed=None, free=None):
    return lk.register_pool("kv", {0: [rows]}, page_size=PAGE,
                            free_indices=free or (lambda idx: freed.extend(idx.tolist())))


def _load_missing(lk, pool, rid, first_row):
    keys = kvdock.page_keys(range(1000 + rid * 8, 1008 + rid * 8), PAGE)
    with pytest.raises(kvdock.NotFoundError):
        lk.load(rid, [kvdock.Transfer(pool, keys, indices=range(first_row, first_row + 8))])


@pytest.mark.parametrize("make", [
    lambda: np.zeros((16, 8), dtype=np.uint8)[::-1],           # rows backwards
    lambda: np.broadcast_to(np.zeros(8, dtype=np.uint8), (16, 8)).copy()[:0],  # no rows
    lambda: torch.zeros(8, dtype=torch.uint8).expand(16, 8),  # every row the same bytes
])
def test_strides_the_library_would_misread_are_refused(daemon, linker_factory, make):
    lk = linker_factory(daemon, model_id="strides")
    buf = make()
    with pytest.raises(kvdock.InvalidError) as e:
        lk.register_pool("kv", {0: [buf]}, page_size=PAGE)
    assert "row" in e.value.message


def test_one_row_needs_no_stride(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="onerow")
    pool = lk.register_pool("mamba", {0: [np.zeros((1, 64), dtype=np.uint8)[::-1]]},
                            addressing="slot")
    assert pool.n_rows == 1 and pool.object_bytes == 64


def test_a_callback_that_calls_back_in_keeps_its_own_error(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="nested")
    rows = torch.zeros(32, 8, dtype=torch.uint8)
    seen = []

    def free(idx):
        seen.append(lk.pool_stats(0))  # a nested call, succeeding
        raise RuntimeError("allocator refused %d rows" % len(idx))

    pool = _pool(lk, rows, free=free)
    _load_missing(lk, pool, 1, 0)
    with pytest.raises(kvdock.CallbackError) as e:
        lk.abort(1)
    assert isinstance(e.value.__cause__, RuntimeError)
    assert len(seen) == 1 and set(seen[0]) >= {"load_bytes", "load_failures"}
    with pytest.raises(kvdock.NotFoundError):
        lk.abort(1)  # the C side finished the abort


def test_close_from_a_callback_is_refused_not_a_deadlock(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="closecb")
    rows = torch.zeros(32, 8, dtype=torch.uint8)
    pool = _pool(lk, rows, free=lambda idx: lk.close())
    _load_missing(lk, pool, 2, 8)
    with pytest.raises(kvdock.CallbackError) as e:
        lk.abort(2)
    assert isinstance(e.value.__cause__, kvdock.StateError)
    assert not lk.closed
    lk.close()
    assert lk.closed


def test_keyboard_interrupt_in_a_callback_stays_itself(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="kbint")
    rows = torch.zeros(32, 8, dtype=torch.uint8)

    def free(idx):
        raise KeyboardInterrupt()

    pool = _pool(lk, rows, free=free)
    _load_missing(lk, pool, 3, 16)
    with pytest.raises(KeyboardInterrupt):
        lk.abort(3)


def test_a_symbol_the_library_lacks_is_unsupported(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="sym")
    with pytest.raises(kvdock.UnsupportedError) as e:
        lk._call("kvd_no_such_function")
    assert "kvd_no_such_function" in e.value.message


def test_prior_key_of_the_wrong_size_names_both_sizes(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="prior")
    pool = _pool(lk, torch.zeros(8, 8, dtype=torch.uint8), freed=[])
    with pytest.raises(kvdock.InvalidError) as e:
        kvdock.Transfer(pool, kvdock.page_keys(range(4), PAGE), prior_key=b"x" * 31)
    assert e.value.message == "prior_key is 31 bytes, not 32"


def test_lookup_keys_answers_as_lookup(daemon, linker_factory):
    lk = linker_factory(daemon, model_id="lkeys")
    rows = torch.zeros(16, 8, dtype=torch.uint8)
    pool = _pool(lk, rows, freed=[])
    keys = kvdock.page_keys(range(16), PAGE)
    rows[:16] = 7
    ack = lk.offload([kvdock.Transfer(pool, keys[:3], indices=range(12))])
    assert engine.Completions(lk.pop_completed_offloads).wait([ack], 60) == {ack: True}
    blob = b"".join(keys)
    assert lk.lookup_keys(1, pool, blob) == lk.lookup(1, [kvdock.Transfer(pool, keys)]) \
        == [1, 2, 3]
    assert lk.lookup_keys(2, pool, keys) == [1, 2, 3]  # a list is joined
    assert lk.lookup_keys(3, pool, blob * 40) == [1, 2, 3]  # a longer block: a new answer array
    assert lk.lookup_keys(4, pool, b"") == []
    with pytest.raises(kvdock.InvalidError):
        lk.lookup_keys(5, pool, blob[:-1])
    with pytest.raises(kvdock.InvalidError):
        lk.lookup_keys(6, 9, blob)  # no such pool
