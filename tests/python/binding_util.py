"""Helpers of the binding's tests (tests/python/test_binding*.py).

Everything here is written independently of the code under test, so that
what the tests expect is never what the binding computed:

* the page-key chain is recomputed with hashlib (key[i] = SHA-256(key[i-1]
  || page i's tokens as uint32 little-endian));
* the bytes of a page's rows are derived from the page's key (SHAKE-256 of
  the key and the row's place), so that a restored row proves it came from
  the right page, layer, buffer and row;
* namespaces and object sizes are spelled out from the layout
  (DESIGN.md section 3: model/pool/rank suffix; one page of all layers).

Engine memory of every kind the binding accepts is built by Mem: the object
handed to register_pool, and a uint8 view [rows, bytes_per_row] of the same
memory for the test to write and read. Every wait is bounded.
"""

import ctypes
import hashlib
import struct
import threading
import time

import numpy as np

import kvdock

KEY = 32
BOUND_S = 60.0  # a generous bound on anything that should take milliseconds


# ----------------------------------------------------------------- keys

def sha_chain(tokens, page_size, prior=None):
    """The page-key chain of tokens, computed here with hashlib."""
    tokens = [int(t) for t in tokens]
    keys = []
    prev = prior
    for p in range(len(tokens) // page_size):
        h = hashlib.sha256()
        if prev is not None:
            h.update(prev)
        h.update(struct.pack("<%dI" % page_size, *tokens[p * page_size:(p + 1) * page_size]))
        prev = h.digest()
        keys.append(prev)
    return keys


def tokens_of(seed, n):
    """n token ids (uint32) that depend on seed only."""
    raw = hashlib.shake_256(b"tokens %d" % seed).digest(4 * n)
    return list(struct.unpack("<%dI" % n, raw))


def row_bytes(key, tag, n):
    """The n bytes a row holds: derived from the key of its page (or node)
    and the row's place (tag)."""
    return np.frombuffer(hashlib.shake_256(key + b"|" + tag.encode()).digest(n), dtype=np.uint8)


# --------------------------------------------------------------- memory

BUFFER_KINDS = ["numpy", "numpy_view", "torch", "torch_view", "array_interface",
                "array_interface_view", "raw"]


class ArrayInterface:
    """A foreign object exposing only __array_interface__ (what a library
    other than numpy and torch hands over)."""

    def __init__(self, arr):
        self._arr = arr  # keeps the memory alive
        self.__array_interface__ = dict(arr.__array_interface__)


class Mem:
    """One buffer of engine memory: ``reg`` is what register_pool gets,
    ``rows`` a writable uint8 view [n_rows, bytes_per_row] of the same
    memory. kind: one of BUFFER_KINDS. The views ("*_view") are one layer
    of a layer-interleaved buffer [rows, layers, ...]: dim 0 not
    contiguous (row_stride > bytes_per_row)."""

    def __init__(self, kind, n_rows, bytes_per_row, layers_around=3):
        assert bytes_per_row % 4 == 0
        self.kind = kind
        self.n_rows = n_rows
        self.bpr = bytes_per_row
        half = bytes_per_row // 2  # 16-bit elements, as bf16 / fp16 KV
        heads, dim = (2, half // 2) if half % 2 == 0 else (1, half)
        if kind == "numpy":
            base = np.zeros((n_rows, heads, dim), np.float16)
            self.reg, self.rows = base, base.reshape(n_rows, -1).view(np.uint8)
        elif kind == "numpy_view":
            big = np.zeros((n_rows, layers_around, heads, dim), np.float16)
            self.reg = big[:, 1]
            self.rows = self.reg.reshape(n_rows, -1).view(np.uint8)
        elif kind in ("torch", "torch_view"):
            import torch

            if kind == "torch":
                t = torch.zeros(n_rows, heads, dim, dtype=torch.bfloat16)
                self.reg = t
                self.rows = t.view(torch.int16).numpy().reshape(n_rows, -1).view(np.uint8)
            else:
                big = torch.zeros(n_rows, layers_around, heads, dim, dtype=torch.bfloat16)
                self.reg = big[:, 1]
                self.rows = big.view(torch.int16).numpy()[:, 1].reshape(n_rows, -1).view(np.uint8)
        elif kind == "array_interface":
            base = np.zeros((n_rows, bytes_per_row), np.uint8)
            self.reg, self.rows = ArrayInterface(base), base
        elif kind == "array_interface_view":
            big = np.zeros((n_rows, layers_around, bytes_per_row), np.uint8)
            self.reg, self.rows = ArrayInterface(big[:, 2]), big[:, 2]
        elif kind == "raw":
            stride = bytes_per_row + 64  # rows apart, as in a padded allocation
            self._c = (ctypes.c_uint8 * (n_rows * stride))()
            self.reg = kvdock.RawBuffer(ctypes.addressof(self._c), n_rows, bytes_per_row,
                                        row_stride=stride, owner=self._c)
            self.rows = np.ctypeslib.as_array(self._c).reshape(n_rows, stride)[:, :bytes_per_row]
        else:
            raise ValueError(kind)
        assert self.rows.shape == (n_rows, bytes_per_row), (kind, self.rows.shape)
        # the test's view is the registered memory itself, never a copy
        assert np.shares_memory(self.rows, self._memory()), kind

    def _memory(self):
        if self.kind == "raw":
            return np.ctypeslib.as_array(self._c)
        if self.kind.startswith("torch"):
            import torch

            return self.reg.view(torch.int16).numpy()
        if self.kind.startswith("array_interface"):
            return self.reg._arr
        return self.reg

    def wipe(self):
        self.rows[...] = 0


# ---------------------------------------------------------------- waits

def pop_until(pop, want, timeout=BOUND_S):
    """Pops a completion queue (pop(max) -> [(id, success)]) until every id
    of `want` came back; returns {id: success}. Fails on an id twice or an
    id not asked for, and past the bound."""
    want = set(want)
    got = {}
    deadline = time.monotonic() + timeout
    while set(got) != want:
        assert time.monotonic() < deadline, "completions %s of %s after %.0f s" % (
            sorted(got), sorted(want), timeout)
        for cid, ok in pop():
            assert cid in want, "completion of %r, not asked for (%s)" % (cid, sorted(want))
            assert cid not in got, "completion of %r twice" % (cid,)
            got[cid] = ok
        if set(got) != want:
            time.sleep(0.005)
    return got


def offload_and_wait(lk, transfers):
    """Offloads and waits for the ack's completion: its success."""
    ack = lk.offload(transfers)
    return pop_until(lk.pop_completed_offloads, [ack])[ack]


def bounded(fn, timeout=BOUND_S):
    """Runs fn() on a thread; returns ("ok", result) or ("raised", exc);
    fails the test when fn has not returned within timeout (the thread is
    a daemon thread: a hung call does not hang the suite)."""
    out = {}

    def run():
        try:
            out["r"] = ("ok", fn())
        except BaseException as e:  # noqa: B902 (reported to the test)
            out["r"] = ("raised", e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), "the call has not returned within %.0f s" % timeout
    return out["r"]


# --------------------------------------------------------------- layouts

def namespace(model, pool, tp_rank=0, replicated=False, cp=None, pp=None):
    """The namespace DESIGN.md section 3 names: model/pool/rank suffix
    (tp{r}, or rep for a rank-replicated pool; .cp{r} and .pp{r} where
    that parallelism is used)."""
    suffix = "rep" if replicated else "tp%d" % tp_rank
    if cp is not None:
        suffix += ".cp%d" % cp
    if pp is not None:
        suffix += ".pp%d" % pp
    return "%s/%s/%s" % (model, pool, suffix)


class PagedPool:
    """A paged pool of the test engine: `layers` layers of `n_buf` buffers
    (K, V; or one MLA latent), each of `n_rows` rows of `bpr` bytes, in
    memory of `kind`; pages of `ps` tokens."""

    def __init__(self, lk, kind="numpy", layers=2, n_buf=2, n_rows=64, bpr=32, ps=4, name="kv",
                 layer_ids=None, free_indices=None, **kw):
        self.ps, self.bpr, self.n_rows, self.name = ps, bpr, n_rows, name
        self.layer_ids = list(layer_ids) if layer_ids is not None else [2 * i for i in range(layers)]
        self.mem = {(l, b): Mem(kind, n_rows, bpr) for l in self.layer_ids for b in range(n_buf)}
        self.n_buf = n_buf
        self.freed = []
        cb = free_indices if free_indices is not None else self.freed.extend
        self.pool = lk.register_pool(
            name, {l: [self.mem[(l, b)].reg for b in range(n_buf)] for l in self.layer_ids},
            page_size=ps, free_indices=cb, **kw)

    def object_bytes(self):
        return self.ps * len(self.layer_ids) * self.n_buf * self.bpr

    def tag(self, l, b, r):
        return "%s/L%d/B%d/r%d" % (self.name, l, b, r)

    def fill_pages(self, keys, first_row):
        """Writes page i of keys into rows first_row + i*ps ..."""
        for i, k in enumerate(keys):
            for (l, b), m in self.mem.items():
                for r in range(self.ps):
                    m.rows[first_row + i * self.ps + r] = row_bytes(k, self.tag(l, b, r), self.bpr)

    def check_pages(self, keys, rows_of_page):
        """Asserts each page i of keys is at rows rows_of_page(i), byte for
        byte, in every layer and buffer."""
        for i, k in enumerate(keys):
            for (l, b), m in self.mem.items():
                for r in range(self.ps):
                    row = rows_of_page(i) + r
                    want = row_bytes(k, self.tag(l, b, r), self.bpr)
                    assert np.array_equal(m.rows[row], want), (
                        "page %d (row %d), layer %d buffer %d, token %d: not restored"
                        % (i, row, l, b, r))

    def check_zero(self, rows):
        for (l, b), m in self.mem.items():
            for row in rows:
                assert not m.rows[row].any(), "row %d of layer %d buffer %d was written" % (
                    row, l, b)

    def wipe(self):
        for m in self.mem.values():
            m.wipe()

    def indices(self, first_row, n_pages):
        return list(range(first_row, first_row + n_pages * self.ps))


class SlotPool:
    """A slot-addressed (mamba) pool: `layers` layers each with a temporal
    state buffer (bpr_a bytes a slot) and a conv buffer (bpr_b)."""

    def __init__(self, lk, kind="numpy", layers=1, n_slots=8, bpr_a=96, bpr_b=16, name="mamba",
                 layer_ids=None, free_indices=None, **kw):
        self.layer_ids = list(layer_ids) if layer_ids is not None else [2 * i + 1
                                                                          for i in range(layers)]
        self.bprs = [bpr_a, bpr_b]
        self.name = name
        self.mem = {(l, b): Mem(kind, n_slots, self.bprs[b]) for l in self.layer_ids
                    for b in range(2)}
        self.freed = []
        cb = free_indices if free_indices is not None else self.freed.extend
        kw.setdefault("trailing_pages", 1)
        self.pool = lk.register_pool(
            name, {l: [self.mem[(l, b)].reg for b in range(2)] for l in self.layer_ids},
            addressing=kvdock.SLOT, free_indices=cb, **kw)

    def object_bytes(self):
        return len(self.layer_ids) * sum(self.bprs)

    def tag(self, l, b):
        return "%s/L%d/B%d" % (self.name, l, b)

    def fill_slot(self, key, slot):
        for (l, b), m in self.mem.items():
            m.rows[slot] = row_bytes(key, self.tag(l, b), self.bprs[b])

    def check_slot(self, key, slot):
        for (l, b), m in self.mem.items():
            assert np.array_equal(m.rows[slot], row_bytes(key, self.tag(l, b), self.bprs[b])), (
                "slot %d, layer %d buffer %d: not restored" % (slot, l, b))

    def check_zero(self, slots):
        for (l, b), m in self.mem.items():
            for s in slots:
                assert not m.rows[s].any(), "slot %d of layer %d buffer %d was written" % (s, l, b)

    def wipe(self):
        for m in self.mem.values():
            m.wipe()


def load_all(lk, rid, transfers, commits, layers):
    """LOAD, PREPARE, COMMIT, start, a wait per layer, and the load's
    completion: its success."""
    lk.load(rid, transfers)
    lk.prepare(rid)
    lk.commit(rid, commits)
    counter = lk.start_layer_wise_loading()
    for layer in layers:
        lk.wait_layer(counter, layer)
    return pop_until(lk.pop_completed_loads, [rid])[rid]
