"""kvdock.Linker: the worker side of kvdock (libkvdock's linker) in Python.

One Linker is one connection of a serving worker to its node's kvdockd:
register the engine's pools, look prompts up, load stored prefixes into the
pools layer by layer (LOAD / PREPARE / COMMIT / ABORT), offload finished
nodes, and pop the completed-load and completed-offload queues. Every
method maps to one call of linker/kvdock.h, whose comments are the contract
(what each status means, what is copied, what stays the engine's); the GIL
is released while the C call runs.
"""

import ctypes
import threading

import numpy as np

from . import _lib
from .buffers import KEY_BYTES, buffer_info, int64_array, key_block, ptr_of, uint32_array
from .errors import CallbackError, ClosedError, InvalidError, StateError, UnsupportedError

PAGED = "paged"
SLOT = "slot"
_ADDRESSING = {PAGED: _lib.KVD_ADDR_PAGED, SLOT: _lib.KVD_ADDR_SLOT}
_MEMORY = {"host": _lib.KVD_MEM_HOST, "hip": _lib.KVD_MEM_HIP, "cuda": _lib.KVD_MEM_CUDA}
_MEMORY_NAME = {v: k for k, v in _MEMORY.items()}
_HEALTH = {1: "starting", 2: "ready", 3: "draining"}


# kvdock.h's KVD_STREAM_LEGACY: the legacy default stream, handle 0, which
# a NULL argument cannot name (it means none)
_STREAM_LEGACY = 1


def _handle(obj, attr):
    """A raw device handle (an int, or None for none) from a torch.cuda
    stream or event (its ``attr``), or the int itself. A stream's handle 0
    (the legacy default stream, where engines such as vLLM compute) is
    passed as KVD_STREAM_LEGACY, never as none."""
    if obj is None:
        return None
    raw = getattr(obj, attr, obj)
    if not isinstance(raw, int):
        raise InvalidError(message="expected a %s or an int handle, got %r" % (attr, obj))
    if raw == 0:
        if attr == "cuda_stream":
            return _STREAM_LEGACY
        raise InvalidError(message="an event handle of 0 names no event")
    return raw


def _cstr(s):
    return None if s is None else str(s).encode("utf-8")


class Commit:
    """What the tree adopted of one transfer of a load (kvd_commit_pool_t):
    pages [adopted_begin, adopted_end) of a paged transfer; mamba_exist for a
    slot transfer whose node already had a state."""

    __slots__ = ("adopted_begin", "adopted_end", "mamba_exist")

    def __init__(self, adopted_begin=0, adopted_end=0, mamba_exist=False):
        self.adopted_begin = int(adopted_begin)
        self.adopted_end = int(adopted_end)
        self.mamba_exist = bool(mamba_exist)

    def __repr__(self):
        return "Commit(%d, %d, mamba_exist=%r)" % (self.adopted_begin, self.adopted_end,
                                                    self.mamba_exist)


class Pool:
    """A registered pool: ``id`` names it in transfers; ``object_bytes`` is
    the size of one stored object (one page, or one slot, across all of the
    pool's layers); ``namespace`` the daemon's namespace for it."""

    def __init__(self, linker, pool_id, name, addressing, page_size, n_rows, trailing_pages,
                 rank_replicated, layer_ids, keep):
        self._linker = linker
        self.id = pool_id
        self.name = name
        self.addressing = addressing
        self.page_size = page_size
        self.n_rows = n_rows
        self.trailing_pages = trailing_pages
        self.rank_replicated = rank_replicated
        self.layer_ids = layer_ids
        self._keep = keep  # the buffers and the callback: alive while registered
        nbytes = ctypes.c_uint64()
        ns = ctypes.create_string_buffer(256)
        linker._call("kvd_pool_info", ctypes.c_uint32(pool_id), ctypes.byref(nbytes), ns,
                     ctypes.sizeof(ns))
        self.object_bytes = nbytes.value
        self.namespace = ns.value.decode("utf-8", "replace")

    def stats(self):
        return self._linker.pool_stats(self)

    def __repr__(self):
        return "Pool(id=%d, name=%r, %s, object_bytes=%d, namespace=%r)" % (
            self.id, self.name, self.addressing, self.object_bytes, self.namespace)


class Transfer:
    """What moves for one pool of one request (kvd_transfer_t).

    paged: ``keys[i]`` is page i's key; ``indices`` one token slot per token
    (n_keys * page_size, each page's slots consecutive, from a multiple of
    page_size). slot: ``keys[i]`` the key of the page ending node i,
    ``indices`` one slot id per key. Lookups read keys only. For offloads,
    ``first_depth`` (or ``depths``, one per key) is the page's index in its
    chain and ``prior_key`` the key before keys[0] (None at a chain's start).
    The arrays are copied as the call is made."""

    __slots__ = ("pool", "keys", "n_keys", "indices", "first_depth", "depths", "prior_key", "_c")

    def __init__(self, pool, keys, indices=None, first_depth=0, depths=None, prior_key=None):
        put = object.__setattr__  # (not through __setattr__ below: this is per call)
        put(self, "_c", None)
        put(self, "pool", pool)
        blob, n = key_block(keys)
        put(self, "keys", blob)
        put(self, "n_keys", n)
        put(self, "indices", int64_array(indices))
        put(self, "first_depth", int(first_depth))
        put(self, "depths", None if depths is None else uint32_array(depths))
        if prior_key is not None:
            prior_key = bytes(prior_key)
            if len(prior_key) != KEY_BYTES:
                raise InvalidError(message="prior_key is %d bytes, not %d"
                                   % (len(prior_key), KEY_BYTES))
        put(self, "prior_key", prior_key)

    def __setattr__(self, name, value):
        # a field set anew: the kvd_transfer_t built from the old ones goes
        object.__setattr__(self, name, value)
        if name != "_c":
            object.__setattr__(self, "_c", None)


def _c_transfer(t):
    """t's kvd_transfer_t, built at its first call and kept (it points into
    t's keys and arrays, which t keeps alive)."""
    c = t._c
    if c is None:
        idx, depths, prior = t.indices, t.depths, t.prior_key
        if depths is not None and depths.size != t.n_keys:
            raise InvalidError(message="%d depths for %d keys" % (depths.size, t.n_keys))
        c = _lib.Transfer(
            _pool_id(t.pool), t.keys if t.n_keys else None, t.n_keys,
            ptr_of(idx, ctypes.c_int64) if idx is not None else None,
            idx.size if idx is not None else 0, t.first_depth,
            ptr_of(depths, ctypes.c_uint32) if depths is not None else None, prior)
        t._c = c
    return c


def _pool_id(p):
    return p.id if isinstance(p, Pool) else int(p)


def _c_transfers(transfers):
    """The kvd_transfer_t of the transfers (one struct, or an array of
    them), their count, and what must stay alive while the call runs (the
    Transfers: the structs point into their keys and arrays). Nothing is
    copied or rebuilt for a Transfer given again (this is on the path of
    every lookup)."""
    if isinstance(transfers, Transfer):
        return _c_transfer(transfers), 1, [transfers]
    if not isinstance(transfers, list):
        transfers = list(transfers)
    for t in transfers:
        if not isinstance(t, Transfer):
            raise InvalidError(message="a transfer is a kvdock.Transfer, not %s"
                               % type(t).__name__)
    n = len(transfers)
    if n == 1:
        return _c_transfer(transfers[0]), 1, transfers
    arr = (_lib.Transfer * max(1, n))(*[_c_transfer(t) for t in transfers])
    return arr, n, transfers


def page_keys(tokens, page_size, prior=None):
    """The SGLang-compatible page-key chain of tokens: one 32-byte key per
    full page (key[i] = SHA256(key[i-1] || page i's tokens as uint32 LE),
    key[-1] = prior or nothing)."""
    toks = uint32_array(tokens)
    page_size = int(page_size)
    if page_size <= 0:
        raise InvalidError(message="page_size must be positive")
    n = toks.size // page_size
    out = ctypes.create_string_buffer(max(1, n) * KEY_BYTES)
    n_keys = ctypes.c_size_t()
    pr = None
    if prior is not None:
        prior = bytes(prior)
        if len(prior) != KEY_BYTES:
            raise InvalidError(message="prior is %d bytes, not %d" % (len(prior), KEY_BYTES))
        pr = ctypes.cast(ctypes.create_string_buffer(prior, KEY_BYTES), _lib.c_u8_p)
    lib = _lib.lib()
    _lib.check(lib.kvd_page_keys(ptr_of(toks, ctypes.c_uint32), toks.size, page_size, pr,
                                 ctypes.cast(out, _lib.c_u8_p), ctypes.byref(n_keys)))
    raw = out.raw
    return [raw[i * KEY_BYTES:(i + 1) * KEY_BYTES] for i in range(n_keys.value)]


class Linker:
    """A connection of this worker to its node's kvdockd (kvd_linker_open).

    Arguments are those of kvd_linker_config_t (None or 0: the library's
    default, which also reads KVDOCK_TRANSPORT, KVDOCK_UCX_MODE and
    KVDOCK_AUTH_TOKEN_FILE). Thread-safe: engine threads call in while the
    library's load thread copies and its offload thread stores. close()
    (or leaving the ``with`` block) waits for calls in flight, each bounded
    by timeout_ms, then frees the handle."""

    def __init__(self, socket_path=None, connect=None, client_name=None, model_id=None,
                 tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, cp_rank=0, cp_size=1,
                 layer_group_size=0, timeout_ms=0, spin_us=0, lazy_pool_mapping=False,
                 read_only=False, transport=None, ucx_mode=None, auth_token_file=None):
        self._lib = _lib.lib()
        self._handle = None
        # calls in flight, counted under a plain lock (C-level enter/exit: on
        # the path of every call); close() waits on the condition
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._inflight = 0
        self._closing = False
        self._pools = {}
        self._cb_errors = threading.local()  # .depth, .pending: this thread's calls
        self._kept = {}  # pool id -> what C points into, until close
        self.timeout_ms = int(timeout_ms) or 5000
        strs = [_cstr(x) for x in (socket_path, connect, client_name or "kvdock-python",
                                   model_id, transport, ucx_mode, auth_token_file)]
        cfg = _lib.LinkerConfig(
            socket_path=strs[0], connect=strs[1], client_name=strs[2], model_id=strs[3],
            tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size,
            cp_rank=cp_rank, cp_size=cp_size, layer_group_size=layer_group_size,
            timeout_ms=timeout_ms, spin_us=spin_us, lazy_pool_mapping=lazy_pool_mapping,
            read_only=read_only, transport=strs[4], ucx_mode=strs[5], auth_token_file=strs[6])
        h = ctypes.c_void_p()
        _lib.check(self._lib.kvd_linker_open(ctypes.byref(cfg), ctypes.byref(h)))
        self._handle = h.value
        self.model_id = model_id
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.read_only = read_only

    # ------------------------------------------------------------ plumbing

    def _enter(self):
        with self._lock:
            if self._handle is None or self._closing:
                raise ClosedError(message="the linker is closed")
            self._inflight += 1
            return self._handle

    def _leave(self):
        with self._lock:
            self._inflight -= 1
            if self._inflight == 0 and self._closing:
                self._cond.notify_all()

    def _call(self, name, *args):
        h = self._enter()
        tls = self._cb_errors
        depth = getattr(tls, "depth", 0)
        if depth == 0:
            tls.pending = []  # a nested call (from a callback) keeps the outer's
        tls.depth = depth + 1
        try:
            try:
                fn = getattr(self._lib, name)
            except AttributeError:
                raise UnsupportedError(message="this libkvdock has no %s" % name) from None
            rc = fn(h, *args)
            if rc < 0:
                _lib.check(rc)
            if depth == 0 and tls.pending:
                first = tls.pending[0]
                tls.pending = []
                if not isinstance(first, Exception):
                    raise first  # KeyboardInterrupt, SystemExit: as they are
                raise CallbackError(message="a free_indices callback raised %s: %s"
                                    % (type(first).__name__, first)) from first
            return rc
        finally:
            tls.depth = depth
            self._leave()

    def close(self):
        """Stops the transfer threads (pending loads and offloads complete
        as failed), closes the connection and frees the handle. Idempotent."""
        if getattr(self._cb_errors, "depth", 0):
            raise StateError(message="close() from inside a callback of this linker's own "
                             "call would wait for that call forever")
        with self._cond:
            if self._handle is None or self._closing:
                return
            self._closing = True
            while self._inflight:
                self._cond.wait()
            h, self._handle = self._handle, None
        self._lib.kvd_linker_close(h)
        self._pools.clear()  # the buffers may go now
        self._kept.clear()

    @property
    def closed(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -------------------------------------------------------------- calls

    def health(self):
        """(state, pool_bytes): "starting", "ready" or "draining", and the
        daemon's pool size."""
        st = ctypes.c_int()
        nb = ctypes.c_uint64()
        self._call("kvd_linker_health", ctypes.byref(st), ctypes.byref(nb))
        return _HEALTH.get(st.value, str(st.value)), nb.value

    def register_pool(self, name, layers, addressing=PAGED, page_size=1, n_rows=None,
                      trailing_pages=0, rank_replicated=False, free_indices=None):
        """Registers a pool of the engine (kvd_register_pool) and returns its
        Pool. ``layers``: {layer_id: [buffer, ...]} or [(layer_id,
        [buffer, ...]), ...], a buffer as kvdock.buffers accepts. The
        buffers are kept alive until close. ``free_indices(indices)`` gets
        the device indices COMMIT and ABORT hand back (an int64 numpy
        array); should it raise, the call that ran it raises CallbackError
        after finishing its work."""
        if addressing not in _ADDRESSING:
            raise InvalidError(message="addressing is 'paged' or 'slot', not %r" % (addressing,))
        items = list(layers.items()) if isinstance(layers, dict) else list(layers)
        if not items:
            raise InvalidError(message="a pool needs at least one layer")
        c_layers = (_lib.PoolLayer * len(items))()
        keep = []
        rows = set()
        memory = None
        layer_ids = []
        for i, item in enumerate(items):
            try:
                layer_id, bufs = item
            except (TypeError, ValueError):
                raise InvalidError(message="a layer is (layer_id, [buffers]), not %r"
                                   % (item,)) from None
            if not isinstance(bufs, (list, tuple)):
                bufs = [bufs]
            if not 1 <= len(bufs) <= _lib.KVD_MAX_POOL_BUFFERS:
                raise InvalidError(message="layer %r has %d buffers (1 to %d)"
                                   % (layer_id, len(bufs), _lib.KVD_MAX_POOL_BUFFERS))
            c_layers[i].layer_id = int(layer_id)
            c_layers[i].n_buffers = len(bufs)
            layer_ids.append(int(layer_id))
            for j, b in enumerate(bufs):
                info = buffer_info(b)
                if info.memory not in _MEMORY:
                    raise UnsupportedError(message="%s memory is not built into this "
                                           "libkvdock (host only until the GPU backends)"
                                           % info.memory)
                if memory is not None and info.memory != memory:
                    raise InvalidError(message="one pool's buffers are all of one memory kind "
                                       "(%s and %s)" % (memory, info.memory))
                memory = info.memory
                rows.add(info.n_rows)
                c_layers[i].buffers[j].base = info.ptr
                c_layers[i].buffers[j].row_stride = info.row_stride
                c_layers[i].buffers[j].bytes_per_row = info.bytes_per_row
                keep.append(info.keep)
        if n_rows is None:
            if len(rows) != 1:
                raise InvalidError(message="the buffers have different row counts %s: give "
                                   "n_rows" % sorted(rows))
            n_rows = rows.pop()
        elif any(r < n_rows for r in rows):
            raise InvalidError(message="n_rows %d is more than a buffer holds (%d)"
                               % (n_rows, min(rows)))
        cb = None
        if free_indices is not None:
            if not callable(free_indices):
                raise InvalidError(message="free_indices must be callable")
            cb = _lib.FREE_INDICES_FN(self._trampoline(free_indices))
            keep.append(cb)
        desc = _lib.PoolDesc(
            name=_cstr(name), addressing=_ADDRESSING[addressing], page_size=int(page_size),
            n_rows=int(n_rows), trailing_pages=int(trailing_pages),
            rank_replicated=bool(rank_replicated), memory=_MEMORY[memory],
            n_layers=len(items), layers=ctypes.cast(c_layers, ctypes.POINTER(_lib.PoolLayer)))
        if cb is not None:
            desc.free_indices = cb
        pid = ctypes.c_uint32()
        self._call("kvd_register_pool", ctypes.byref(desc), ctypes.byref(pid))
        # the library holds the buffers and the callback from now on, even
        # should building the Pool fail
        self._kept[pid.value] = keep
        pool = Pool(self, pid.value, name, addressing, int(page_size), int(n_rows),
                    int(trailing_pages), bool(rank_replicated), layer_ids, keep)
        self._pools[pool.id] = pool
        return pool

    def _trampoline(self, fn):
        errors = self._cb_errors

        def run(_ctx, ptr, n):
            try:
                idx = np.ctypeslib.as_array(ptr, shape=(n,)).copy() if n else \
                    np.empty(0, dtype=np.int64)
                fn(idx)
            except BaseException as e:  # never into C: kept for the caller
                pending = getattr(errors, "pending", None)
                if pending is None:
                    errors.pending = pending = []
                pending.append(e)
        return run

    @property
    def pools(self):
        return list(self._pools.values())

    def _lookup(self, rid, c, n, out, nb):
        """kvd_lookup of the prepared transfers c (n of them) into out;
        the boundaries. No callback bookkeeping: a lookup runs none."""
        lock = self._lock
        with lock:
            h = self._handle
            if h is None or self._closing:
                raise ClosedError(message="the linker is closed")
            self._inflight += 1
        try:
            rc = self._lib.kvd_lookup(h, rid, c, n, out, ctypes.byref(nb))
            if rc < 0:
                _lib.check(rc)  # on this thread, before any other libkvdock call
        finally:
            with lock:
                self._inflight -= 1
                if self._inflight == 0 and self._closing:
                    self._cond.notify_all()
        return memoryview(out).cast("B").cast("I")[:nb.value].tolist()

    def lookup(self, rid, transfers):
        """Every boundary (in pages from keys[0], increasing) restorable in
        all the pools given, by each pool's hit policy."""
        # the engine's most frequent call: its Python side is kept to the
        # least (nothing converted twice; measured in
        # bench/python/bench_binding.py)
        if type(transfers) is list and len(transfers) == 1 and type(transfers[0]) is Transfer:
            keep = transfers  # the usual call: one pool
            t = keep[0]
            c, n, cap = t._c or _c_transfer(t), 1, t.n_keys + 1
        else:
            c, n, keep = _c_transfers(transfers)
            cap = (min([t.n_keys for t in keep]) if n else 0) + 1
        got = self._lookup(rid, c, n, (ctypes.c_uint32 * cap)(), ctypes.c_size_t())
        del keep  # (alive until here: c points into the transfers)
        return got

    def lookup_keys(self, rid, pool, keys):
        """lookup(rid, [Transfer(pool, keys)]) for one pool and keys given
        as one block of n * 32 bytes, without building a Transfer: the
        engine's per-request call, its Python side at its least (one
        kvd_transfer_t and one answer array kept per thread and reused)."""
        if type(keys) is not bytes:
            keys = key_block(keys)[0]
        n_keys, rem = divmod(len(keys), KEY_BYTES)
        if rem:
            raise InvalidError(message="a key block of %d bytes is not a multiple of %d"
                               % (len(keys), KEY_BYTES))
        tls = self._cb_errors
        scratch = getattr(tls, "lookup", None)
        if scratch is None or len(scratch[1]) <= n_keys:
            scratch = tls.lookup = (_lib.Transfer(), (ctypes.c_uint32 * (n_keys + 1))(),
                                    ctypes.c_size_t())
        c, out, nb = scratch
        c.pool_id = pool.id if type(pool) is Pool else int(pool)
        c.keys = keys if n_keys else None
        c.n_keys = n_keys
        try:
            return self._lookup(rid, c, 1, out, nb)
        finally:
            c.keys = None  # the block is the caller's: not kept past the call

    def load(self, rid, transfers):
        """LOAD: pins the stored objects of every transfer (all or nothing)
        and records the load of rid (NotFoundError when something is gone
        now: the load stays recorded, ABORT it)."""
        arr, n, keep = _c_transfers(transfers)
        self._call("kvd_load", ctypes.c_uint64(rid), arr, n)
        del keep

    def prepare(self, rid):
        """PREPARE: the fix-ups before the engine's tree insert."""
        self._call("kvd_load_prepare", ctypes.c_uint64(rid))

    def commit(self, rid, pools):
        """COMMIT: what the tree adopted, one Commit (or (begin, end[,
        mamba_exist])) per transfer of the load, in its order."""
        pools = list(pools)
        arr = (_lib.CommitPool * max(1, len(pools)))()
        for i, c in enumerate(pools):
            if not isinstance(c, Commit):
                c = Commit(*c)
            arr[i].adopted_begin = c.adopted_begin
            arr[i].adopted_end = c.adopted_end
            arr[i].mamba_exist = c.mamba_exist
        self._call("kvd_load_commit", ctypes.c_uint64(rid), arr, len(pools))

    def abort(self, rid):
        """ABORT: for a load that never reached the insert: its pins go and
        every device index of it goes back through free_indices."""
        self._call("kvd_load_abort", ctypes.c_uint64(rid))

    def start_layer_wise_loading(self):
        """Starts copying every committed load not started yet; returns the
        batch's counter for wait_layer."""
        c = ctypes.c_uint32()
        self._call("kvd_start_layer_wise_loading", ctypes.byref(c))
        return c.value

    def wait_layer(self, counter, layer_id):
        """Waits until layer_id's bytes of batch ``counter`` are in place;
        raises the batch's error (or TimeoutError)."""
        self._call("kvd_wait_layer", ctypes.c_uint32(counter), ctypes.c_uint32(layer_id))

    def wait_layer_on_stream(self, counter, layer_id, stream):
        """Makes ``stream`` (a torch.cuda.Stream, or a raw cudaStream_t /
        hipStream_t as an int) wait on the device until layer_id's bytes of
        batch ``counter`` are in place, and returns once that wait is
        queued: the forward pass overlaps with the load. For a batch of
        host pools it waits as wait_layer does."""
        self._call("kvd_stream_wait_layer", ctypes.c_uint32(counter),
                   ctypes.c_uint32(layer_id), ctypes.c_void_p(_handle(stream, "cuda_stream")))

    def _pop(self, name, max):
        max = int(max)
        if max <= 0:
            return []
        out = (_lib.Completion * max)()
        n = ctypes.c_size_t()
        self._call(name, out, max, ctypes.byref(n))
        return [(out[i].id, bool(out[i].success)) for i in range(n.value)]

    def pop_completed_loads(self, max=1024):
        """Finished loads, [(rid, success)], each committed load exactly once.
        Never blocks."""
        return self._pop("kvd_pop_completed_loads", max)

    def offload(self, transfers, stream=None, event=None):
        """Queues the transfers' device rows for storing; returns the ack
        that pop_completed_offloads will report. The rows must stay as they
        are until then. With ``event`` (a torch.cuda.Event or a raw handle)
        or ``stream`` (a torch.cuda.Stream or a raw handle), the copies
        wait on the device for that event as recorded now, or for what the
        stream holds now, so the engine need not synchronize first;
        without either, the rows must be final when this is called. The
        legacy default stream (handle 0, torch's default stream) is
        waited for as any other."""
        arr, n, keep = _c_transfers(transfers)
        ack = ctypes.c_uint64()
        if stream is None and event is None:
            self._call("kvd_offload", arr, n, ctypes.byref(ack))
        else:
            self._call("kvd_offload_after", arr, n,
                       ctypes.c_void_p(_handle(stream, "cuda_stream")),
                       ctypes.c_void_p(_handle(event, "cuda_event")), ctypes.byref(ack))
        del keep
        return ack.value

    def pop_completed_offloads(self, max=1024):
        """Finished offloads, [(ack, success)], each exactly once. Never
        blocks."""
        return self._pop("kvd_pop_completed_offloads", max)

    def pool_stats(self, pool):
        """A pool's counters: lookup_hit_pages, load_bytes, offload_bytes,
        load_failures, offload_failures; memory ("host", "cuda", "hip"),
        pinned (the store's pool registered with the device for DMA),
        dma_bytes and bounce_bytes (copied through the pinned bounce ring
        while it is not)."""
        st = _lib.PoolStats()
        self._call("kvd_stats", ctypes.c_uint32(_pool_id(pool)), ctypes.byref(st))
        out = {f: getattr(st, f) for f, _ in _lib.PoolStats._fields_}
        out["memory"] = _MEMORY_NAME.get(out["memory"], out["memory"])
        return out
