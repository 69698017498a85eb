"""kvdock as SGLang's unified-cache linker: ``KvdockUnifiedCacheLinker``.

SGLang's ``UnifiedRadixCache`` can link its device pools straight to an
external KV store (no host tier between them) through a backend that
implements ``UnifiedCacheLinker``. This module is that backend over
libkvdock: the store is the node's kvdockd, the bytes move between the
engine's pools and the daemon's pool without a copy in between.

Interface followed: ``UnifiedCacheLinker`` in
python/sglang/srt/mem_cache/unified_cache/unified_cache_linker.py of
sgl-project/sglang at commit 2c62dc66f5b22ff8e01b0d6cda668bf9b376306a (the
commit that documents out-of-tree linkers and their constructor; the
abstract class is the same at 03205d1574b6972f31914c2e93abb39c4b862c4e),
and ``PoolName`` / ``PoolHitPolicy`` / ``PoolTransfer`` of
mem_cache/hicache_storage.py there. SGLang loads an out-of-tree linker with

    --unified-cache-external-linker-config '{"linker": "KvdockUnifiedCacheLinker",
        "linker_module_path": "kvdock.sglang", "linker_extra_config": {...}}'

and builds it in each worker as ``cls(server_args, params, components=...,
extra_config=...)``. Without SGLang installed this module still imports: the
base class and the transfer types fall back to restatements below, with the
same names and signatures.

The load of one request, in the engine's order (DESIGN.md section 6 and the
hybrid-mamba pitfalls of the seed document):

    lookup(rid, transfers)        -> every restorable boundary, in pages
    (the engine allocates device indices for the chosen boundary)
    begin_load(rid, transfers)    LOAD: re-validate and pin; False when an
                                  object went missing since the lookup (the
                                  load stays recorded: ABORT it)
    prepare_load(rid)             PREPARE
    (the engine inserts the prefix into its radix tree)
    commit_load(rid, adopted, mamba_exist=...)
                                  COMMIT: paged transfers cut to the pages the
                                  tree adopted (the others' device indices go
                                  back through the pool's free_indices); a
                                  slot-addressed (mamba) transfer is never
                                  page-sliced: kept whole, or dropped WITHOUT
                                  freeing when the tree already had a state at
                                  that node (mamba_exist: the tree freed it)
    or abort_load(rid)            ABORT: only for a load that never reached
                                  the insert: pins released, every device
                                  index handed back through free_indices
    load(rid, transfers)          SGLang's call, queue only (nothing copies
                                  before start_layer_wise_loading)
    start_layer_wise_loading()    -> the batch's counter index;
    layer_done_counter.set_consumer(index) / .wait_until(layer)
    num_completed_loads() / pop_completed_load()   (the batch's rids whose
                                  loads succeeded: a failed one is held back,
                                  see below), or
    pop_completed_load_status()   [(rid, success)]: a failed rid's KV is not
                                  usable, the engine recomputes it

A failed load (the copy or the release failed after COMMIT, e.g. the
daemon died): SGLang's pop_completed_load at SGLANG_COMMIT returns rids
only, and its wrapper takes every rid returned as loaded. So a failed rid
is never returned there: it is logged at error level, counted in
pool_stats()'s ``failed_loads``, and held until the engine lets the
request go, when cancel_queued_load(rid) answers True (the wrapper's
release_request then drops the lock it holds for the load). A request let
go while its committed load was in flight (cancel_queued_load answered
False) gets its rid returned whatever the outcome: the wrapper then only
drops its lock.

SGLang's own wrapper at that commit does its COMMIT before it calls load()
and hands load() the transfers already cut to what the tree adopted; load()
of a rid with no begin_load() runs LOAD, PREPARE and a whole COMMIT itself.
That order pins after the insert, so an object evicted since the lookup
makes load() return False with the slots already in the tree (SGLang then
raises); begin_load() before the insert is what lets the engine ABORT and
recompute instead.

Offloads: offload(transfers) queues them (the device rows must stay as
they are until the completion comes back), num_completed_offloads() /
pop_completed_offload() report them in the order they were queued. A
PoolTransfer may carry ``first_depth`` (the chain depth of keys[0]) and
``prior_key`` (the key before keys[0]) as extra attributes; the store uses
them for inspection and leaf-first eviction.

Keys follow kvdock.engine.page_key: SGLang's page hashes (64-character hex
SHA-256 chains, the same chain as kvdock.page_keys) decoded, 32-byte
``bytes`` as they are, any other string SHA-256'd. Request ids are strings on
SGLang's side and uint64 on libkvdock's: each load gets a fresh number
while it is recorded (a counter, never a hash, so two rids never collide).

The calls SGLang's scheduler makes never raise into it: lookup answers []
and load / offload / cancel_queued_load False, with the store's transient
errors (kvdock.engine.TRANSIENT) logged as warnings and anything else (a
caller's bad arguments, a call in the wrong state) at error level, each
kind at most once per interval (kvdock.engine.RateLimitedLog).

Threading: the scheduler's thread calls in; the completion queues and the
layer waits may be called from other threads. State is under one lock that
is never held across a round trip to the daemon.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import hashlib
import itertools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import kvdock
from kvdock import engine as _engine
from kvdock import errors as _errors
from kvdock.buffers import int64_array

logger = logging.getLogger(__name__)

SGLANG_COMMIT = "2c62dc66f5b22ff8e01b0d6cda668bf9b376306a"

# --------------------------------------------------------------- SGLang's types

try:  # the engine's own classes when it is installed
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import (  # type: ignore
        UnifiedCacheLinker,
    )
except ImportError:

    class UnifiedCacheLinker(ABC):  # type: ignore[no-redef]
        """Restatement of SGLang's ``UnifiedCacheLinker`` (at SGLANG_COMMIT):
        the same abstract methods with the same signatures, so that this
        module imports without SGLang."""

        layer_done_counter: object

        @abstractmethod
        def lookup(self, rid: str, transfers: list) -> list[int]:
            """Every prefix length (pages) restorable in all pools."""

        @abstractmethod
        def load(self, rid: str, transfers: list) -> bool:
            """Queue a load; it runs at the next start_layer_wise_loading."""

        @abstractmethod
        def start_layer_wise_loading(self) -> int:
            """Start queued loads; the layer-counter consumer index."""

        @abstractmethod
        def cancel_queued_load(self, rid: str) -> bool:
            """Cancel a load that has not started yet."""

        @abstractmethod
        def num_completed_loads(self) -> int:
            """Completed load batches waiting to be consumed."""

        @abstractmethod
        def pop_completed_load(self) -> list[str]:
            """The oldest completed load batch's request ids."""

        @abstractmethod
        def offload(self, transfers: list) -> bool:
            """Queue every transfer for atomic persistence."""

        @abstractmethod
        def num_completed_offloads(self) -> int:
            """Completed offloads waiting to be consumed."""

        @abstractmethod
        def pop_completed_offload(self) -> bool:
            """The oldest completed offload's result."""

        @abstractmethod
        def reset(self) -> None:
            """Quiesce all transfers and reset backend state."""

        @abstractmethod
        def close(self) -> None:
            """Quiesce all transfers and release backend resources."""


try:
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        PoolHitPolicy,
        PoolName,
        PoolTransfer,
    )
except ImportError:

    class PoolName(str, enum.Enum):  # type: ignore[no-redef]
        """Restatement of SGLang's pool names (the ones kvdock uses)."""

        KV = "kv"
        MAMBA = "mamba"
        SWA = "swa"
        INDEXER = "indexer"

        def __str__(self) -> str:
            return self.value

    class PoolHitPolicy(str, enum.Enum):  # type: ignore[no-redef]
        ALL_PAGES = "all_pages"
        TRAILING_PAGES = "trailing_pages"

    @dataclasses.dataclass
    class PoolTransfer:  # type: ignore[no-redef]
        """Restatement of SGLang's per-pool transfer descriptor."""

        name: Any
        host_indices: Optional[Any] = None
        device_indices: Optional[Any] = None
        keys: Optional[List[str]] = None
        hit_policy: Any = PoolHitPolicy.ALL_PAGES
        nodes_to_load: Optional[List[Any]] = None
        indices_from_pool: Optional[Any] = None


# ------------------------------------------------------------ device pools


@dataclasses.dataclass
class DevicePool:
    """One device pool of the engine, as the linker registers it.

    ``name``: the PoolName value ("kv", "swa", "mamba", ...), which transfers
    name. ``layers``: {layer_id: [buffer, ...]} (kvdock.Linker.register_pool:
    K and V, one MLA buffer, or a mamba layer's temporal then conv
    buffers). ``addressing``: "paged" (token slots, ``page_size`` tokens a
    page) or "slot" (one state per tree node). ``trailing_pages``: the hit
    policy, 0 = every page (full attention), n = the last n pages (sliding
    window: its window; mamba: 1). ``free_indices(indices)``: the engine's
    allocator, which COMMIT (pages the tree did not adopt) and ABORT (every
    index of the load) hand device indices back to; None when the engine
    frees its own (SGLang's components do)."""

    name: str
    layers: Any
    addressing: str = kvdock.PAGED
    page_size: int = 1
    trailing_pages: int = 0
    rank_replicated: bool = False
    free_indices: Optional[Callable[[Any], None]] = None
    n_rows: Optional[int] = None


def _pool_name(name) -> str:
    return str(getattr(name, "value", name))


def device_pools_from_sglang(params, components=None) -> List[DevicePool]:
    """The device pools of SGLang's CacheInitParams at SGLANG_COMMIT: the
    full-attention KV pool (MHA: K and V per layer; MLA: one buffer per
    layer, identical on every TP rank). Other layouts (SWA, hybrid mamba,
    DSA) are not derived here: pass ``device_pools`` for them."""
    kvcache = params.token_to_kv_pool_allocator.get_kvcache()
    names = {getattr(c, "name", str(c)) for c in (components or ())}
    extra = names - {"FULL"}
    if extra:
        raise kvdock.UnsupportedError(
            message="kvdock derives only the full-attention pool from SGLang's params; "
            "components %s need device_pools=" % sorted(extra))
    start = int(getattr(kvcache, "start_layer", 0) or 0)
    if hasattr(kvcache, "k_buffer") and hasattr(kvcache, "v_buffer"):
        layers = {start + i: [k, v] for i, (k, v) in enumerate(zip(kvcache.k_buffer,
                                                                   kvcache.v_buffer))}
        replicated = False
    elif hasattr(kvcache, "kv_buffer"):
        layers = {start + i: [kv] for i, kv in enumerate(kvcache.kv_buffer)}
        replicated = True
    else:
        raise kvdock.UnsupportedError(
            message="%s: not an MHA or MLA KV pool; pass device_pools="
            % type(kvcache).__name__)
    return [DevicePool(name="kv", layers=layers, page_size=int(params.page_size),
                       rank_replicated=replicated)]


def _slice_indices(indices, begin, end):
    """indices[begin:end] of a tensor, array or sequence (a view where the
    type has views)."""
    if hasattr(indices, "reshape"):
        return indices.reshape(-1)[begin:end]
    return int64_array(indices)[begin:end]


# ------------------------------------------------------------- bookkeeping

_PINNING, _PINNED, _FAILED, _PREPARED, _COMMITTED, _STARTED = (
    "pinning", "pinned", "failed", "prepared", "committed", "started")
_UNCOMMITTED = (_PINNED, _FAILED, _PREPARED)

# errors that mean "the store cannot answer now", not a caller's mistake
_TRANSIENT = _engine.TRANSIENT
# what a caller's bad arguments raise (logged at error level, never raised
# into SGLang's scheduler from the calls it makes)
_CALLER_ERRORS = (ValueError, TypeError, IndexError, _errors.KvdockError)


class _Entry:
    """A registered DevicePool and its kvdock.Pool."""

    __slots__ = ("spec", "pool", "slot", "page_size")

    def __init__(self, spec: DevicePool, pool):
        self.spec = spec
        self.pool = pool
        self.slot = spec.addressing == kvdock.SLOT
        self.page_size = 1 if self.slot else int(spec.page_size)


class _Load:
    """One request's load as this adapter tracks it."""

    __slots__ = ("rid", "uid", "entries", "transfers", "kv_transfers", "state", "queued",
                 "batch")

    def __init__(self, rid, uid, entries, transfers, kv_transfers):
        self.rid = rid
        self.uid = uid
        self.entries = entries          # _Entry per transfer
        self.transfers = transfers      # the caller's PoolTransfers
        self.kv_transfers = kv_transfers  # the kvdock.Transfers given to LOAD
        self.state = _PINNING
        self.queued = False  # reported back through pop_completed_load
        self.batch = None


class _Batch:
    __slots__ = ("index", "waiting", "results", "wait_error")

    def __init__(self, index):
        self.index = index
        self.waiting = set()  # uids not come back yet
        self.results = []     # (rid, success) of the queued loads, start order
        self.wait_error = None


class KvdockLayerDoneCounter:
    """The layer-wait hook SGLang's KV pool calls during the forward pass:
    ``set_consumer(index)`` with start_layer_wise_loading's index, then
    ``wait_until(layer)`` before each layer reads its KV. A failed copy
    never raises through the forward pass: the wait returns, the failure
    is logged, and the request's completion says it failed."""

    def __init__(self, owner: "KvdockUnifiedCacheLinker", layer_offset: int = 0):
        self._owner = owner
        self.layer_offset = int(layer_offset)
        self.consumer_index = -1

    def set_consumer(self, index: int) -> None:
        self.consumer_index = int(index)

    def wait_until(self, threshold: int) -> None:
        self._owner._wait_layer(self.consumer_index, self.layer_offset + int(threshold))

    def reset(self) -> None:
        self.consumer_index = -1


def _linker_kwargs(server_args, params, cfg: Dict[str, Any]) -> Dict[str, Any]:
    """kvdock.Linker arguments: extra_config's, else what SGLang's
    arguments say (model path, parallel ranks)."""
    keys = ("socket_path", "connect", "client_name", "model_id", "tp_rank", "tp_size",
            "pp_rank", "pp_size", "cp_rank", "cp_size", "layer_group_size", "timeout_ms",
            "spin_us", "lazy_pool_mapping", "read_only", "transport", "ucx_mode",
            "auth_token_file")
    unknown = set(cfg) - set(keys) - {"layer_offset"}
    if unknown:
        raise ValueError("kvdock linker_extra_config: unknown keys %s" % sorted(unknown))
    kw = {k: cfg[k] for k in keys if k in cfg}
    kw.setdefault("client_name", "sglang-unified")
    if "model_id" not in kw and server_args is not None:
        model = getattr(server_args, "served_model_name", None) or getattr(
            server_args, "model_path", None)
        if model:
            kw["model_id"] = str(model)
    if server_args is not None and "tp_size" not in kw:
        kw["tp_size"] = int(getattr(server_args, "tp_size", 1) or 1)
    if "tp_rank" not in kw and params is not None:
        rank = getattr(params, "tp_rank", None)
        if rank is None:
            try:
                import torch

                if torch.distributed.is_available() and torch.distributed.is_initialized():
                    rank = torch.distributed.get_rank(
                        group=getattr(params, "tp_cache_group", None))
            except Exception:  # no process group: a single rank
                rank = None
        if rank is not None:
            kw["tp_rank"] = int(rank)
    for ours, theirs in (("pp_rank", "pp_rank"), ("pp_size", "pp_size"),
                         ("cp_rank", "attn_cp_rank"), ("cp_size", "attn_cp_size")):
        if ours not in kw and params is not None and getattr(params, theirs, None) is not None:
            kw[ours] = int(getattr(params, theirs))
    return kw


class KvdockUnifiedCacheLinker(UnifiedCacheLinker):
    """SGLang's UnifiedCacheLinker over libkvdock (see the module's text).

    ``server_args``, ``params``, ``components``, ``extra_config``: what
    SGLang passes (extra_config: kvdock.Linker's arguments by name, e.g.
    socket_path, model_id, timeout_ms, layer_group_size, and
    ``layer_offset``, added to wait_until's layer to make the registered
    layer id). ``device_pools``: the pools to register (DevicePool list);
    without it they are derived from ``params`` (full-attention KV only).
    ``linker``: an open kvdock.Linker to use instead of opening one (this
    adapter then does not close it)."""

    def __init__(self, server_args=None, params=None, *, components=None, extra_config=None,
                 device_pools: Optional[Sequence[DevicePool]] = None, linker=None):
        cfg = dict(extra_config or {})
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._uids = itertools.count(1)
        self._loads: Dict[str, _Load] = {}
        self._by_uid: Dict[int, _Load] = {}
        self._batches: Dict[int, _Batch] = {}
        self._completed: deque = deque()  # [(rid, success)] per completed batch
        self._offloads: deque = deque()  # acks, in the order queued
        self._offload_done: Dict[int, bool] = {}  # outstanding acks come back
        # failed loads SGLang's pop_completed_load must not report as done:
        # held until the engine lets the request go (cancel_queued_load)
        self._held_failed: set = set()
        # rids the engine let go (cancel_queued_load answered False) while
        # their committed load was in flight or not popped yet
        self._released: set = set()
        self._failed_loads: Dict[str, int] = {}  # pool name -> loads failed after COMMIT
        self._log = _engine.RateLimitedLog(logger)
        self._closed = False
        self._owns_linker = linker is None
        if linker is None:
            linker = kvdock.Linker(**_linker_kwargs(server_args, params, cfg))
        self._lk = linker
        self._load_q = _engine.Completions(linker.pop_completed_loads, self._log)
        self._offload_q = _engine.Completions(linker.pop_completed_offloads, self._log)
        self.timeout_ms = int(getattr(linker, "timeout_ms", 0) or 5000)
        self.layer_done_counter = KvdockLayerDoneCounter(self, cfg.get("layer_offset", 0))
        try:
            if device_pools is None:
                if params is None:
                    raise ValueError("give device_pools, or SGLang's params to derive them")
                device_pools = device_pools_from_sglang(params, components)
            self._pools: Dict[str, _Entry] = {}
            for spec in device_pools:
                self._register(spec)
        except BaseException:
            if self._owns_linker:
                linker.close()
            raise

    # ----------------------------------------------------------- set up

    def _register(self, spec: DevicePool) -> None:
        name = _pool_name(spec.name)
        if name in self._pools:
            raise ValueError("device pool %r twice" % name)
        free = None
        if spec.free_indices is not None:
            user_free = spec.free_indices

            def free(indices, _user=user_free):
                # a load SGLang's tree already holds hands nothing back
                if not getattr(self._tls, "keep_indices", False):
                    _user(indices)
        pool = self._lk.register_pool(
            name, spec.layers, addressing=spec.addressing,
            page_size=1 if spec.addressing == kvdock.SLOT else spec.page_size,
            n_rows=spec.n_rows, trailing_pages=spec.trailing_pages,
            rank_replicated=spec.rank_replicated, free_indices=free)
        self._pools[name] = _Entry(dataclasses.replace(spec, name=name), pool)

    @property
    def linker(self):
        """The kvdock.Linker underneath."""
        return self._lk

    @property
    def pools(self) -> Dict[str, Any]:
        """{pool name: kvdock.Pool} of the registered device pools."""
        return {name: e.pool for name, e in self._pools.items()}

    def pool_stats(self) -> Dict[str, Dict[str, int]]:
        """Every pool's counters (lookup hits in pages, load and offload
        bytes, failures). Mamba hits with no mamba load bytes is the bug no
        token count shows. ``failed_loads``: this adapter's count of the
        pool's loads that failed after COMMIT (their KV was not usable)."""
        out = {}
        for name, e in self._pools.items():
            st = dict(self._lk.pool_stats(e.pool))
            with self._lock:
                st["failed_loads"] = self._failed_loads.get(name, 0)
            out[name] = st
        return out

    # ------------------------------------------------------- conversions

    def _entry(self, transfer) -> _Entry:
        name = _pool_name(transfer.name)
        e = self._pools.get(name)
        if e is None:
            raise ValueError("no device pool %r registered with kvdock (have %s)"
                             % (name, sorted(self._pools)))
        return e

    def _kv_transfer(self, e: _Entry, t, *, indices: bool):
        keys = _engine.page_key_block(t.keys or ())
        if not indices:
            return kvdock.Transfer(e.pool, keys)
        idx = t.device_indices if t.device_indices is not None else t.host_indices
        if idx is None:
            raise ValueError("transfer of pool %r has no device indices" % e.spec.name)
        idx = int64_array(idx)
        n, n_keys = idx.size, len(keys) // kvdock.PAGE_KEY_BYTES
        if n != n_keys * e.page_size:
            what = ("one slot id per key (a slot-addressed pool is never page-sliced)"
                    if e.slot else "%d token slots per page" % e.page_size)
            raise ValueError("transfer of pool %r: %d indices for %d keys; it takes %s"
                             % (e.spec.name, n, n_keys, what))
        prior = getattr(t, "prior_key", None)
        return kvdock.Transfer(e.pool, keys, idx, first_depth=int(getattr(t, "first_depth", 0)),
                               prior_key=None if prior is None else _engine.page_key(prior))

    def _lookup_uid(self, rid: str) -> int:
        rec = self._loads.get(rid)
        if rec is not None:
            return rec.uid
        # informational on the C side: a stable number for the daemon's log
        return int.from_bytes(hashlib.blake2b(str(rid).encode(), digest_size=8).digest(),
                              "little") >> 1

    # ------------------------------------------------------- the lookup

    def lookup(self, rid: str, transfers: list[PoolTransfer]) -> list[int]:
        """Every boundary (pages from the first key, increasing) at which
        all the pools given are restorable by their hit policies; [] when
        the daemon cannot answer (a miss, never an error in the scheduler).
        A transfer without keys takes the full-attention transfer's."""
        try:
            transfers = list(transfers or ())
            if not transfers:
                return []
            default_keys = next((t.keys for t in transfers if t.keys), None)
            if not default_keys:
                return []
            kts = []
            for t in transfers:
                e = self._entry(t)
                if not t.keys:
                    t = copy.copy(t)
                    t.keys = default_keys
                kts.append(self._kv_transfer(e, t, indices=False))
            return self._lk.lookup(self._lookup_uid(rid), kts)
        except _TRANSIENT as err:
            self._log.warn("lookup", "lookup of rid %s: %s; treated as a miss", rid, err)
            return []
        except _CALLER_ERRORS as err:
            self._log.error("lookup-bad-" + type(err).__name__,
                            "lookup of rid %s refused: %s: %s; treated as a miss",
                            rid, type(err).__name__, err)
            return []

    # --------------------------------------------- LOAD / PREPARE / COMMIT / ABORT

    def begin_load(self, rid: str, transfers: list[PoolTransfer]) -> bool:
        """LOAD: re-validates and pins what the transfers need (the engine
        allocated their device indices). True when everything is pinned;
        False when an object went missing since the lookup (or the daemon
        went away): the load stays recorded and ``abort_load(rid)`` hands
        its device indices back. A bad transfer raises ValueError and
        records nothing."""
        transfers = list(transfers)
        if not transfers:
            raise ValueError("a load needs at least one transfer")
        rec = self._new_load(rid, transfers)
        try:
            self._lk.load(rec.uid, rec.kv_transfers)
        except (_errors.InvalidError, _errors.ExistsError):
            self._forget(rec)  # nothing recorded on the C side
            raise
        except _errors.KvdockError as err:
            self._log.warn("load", "LOAD of rid %s failed: %s (ABORT it)", rid, err,
                           level=logging.INFO)
            rec.state = _FAILED
            return False
        except BaseException:
            rec.state = _FAILED
            raise
        rec.state = _PINNED
        return True

    def prepare_load(self, rid: str) -> None:
        """PREPARE: the fix-ups before the engine's tree insert."""
        rec = self._record(rid)
        if rec.state != _PINNED:
            raise _errors.StateError(message="PREPARE of rid %r in state %s" % (rid, rec.state))
        self._lk.prepare(rec.uid)
        rec.state = _PREPARED

    def commit_load(self, rid: str, adopted: Optional[Mapping[str, Sequence[int]]] = None,
                    *, mamba_exist: Any = False) -> list:
        """COMMIT, after the engine's insert. ``adopted``: {pool name:
        (begin, end)}, the pages of each paged transfer (counted from its
        first key) that the tree adopted; None: all of them. The device
        indices of the other pages go back through the pool's free_indices.
        Slot-addressed transfers are never page-sliced and take no adopted
        range (one given is ignored: SGLang's tree records adopted ranges
        for paged components only): each is kept whole, or dropped without
        freeing its slot when ``mamba_exist`` (a bool, or {pool name:
        bool}) says the tree already had a state at that node. Returns the
        transfers as cut (what the next start_layer_wise_loading copies;
        SGLang hands them to load())."""
        rec = self._record(rid)
        if rec.state == _PINNED:
            self.prepare_load(rid)
        elif rec.state != _PREPARED:
            raise _errors.StateError(message="COMMIT of rid %r in state %s" % (rid, rec.state))
        commits, kept = [], []
        for e, t, kt in zip(rec.entries, rec.transfers, rec.kv_transfers):
            name = e.spec.name
            if e.slot:
                exist = (bool(mamba_exist.get(name, False)) if isinstance(mamba_exist, Mapping)
                         else bool(mamba_exist))
                commits.append(kvdock.Commit(0, kt.n_keys, mamba_exist=exist))
                if not exist:
                    kept.append(t)
                continue
            if adopted is None:
                begin, end = 0, kt.n_keys
            else:
                if name not in adopted:
                    raise ValueError("commit of rid %r: no adopted range for pool %r"
                                     % (rid, name))
                begin, end = (int(x) for x in adopted[name])
                if not 0 <= begin <= end <= kt.n_keys:
                    raise ValueError("commit of rid %r: adopted pages %d..%d outside the "
                                     "transfer's %d" % (rid, begin, end, kt.n_keys))
            commits.append(kvdock.Commit(begin, end))
            if end > begin:
                if (begin, end) == (0, kt.n_keys):
                    kept.append(t)
                else:
                    cut = copy.copy(t)
                    cut.keys = list(t.keys)[begin:end]
                    idx = t.device_indices if t.device_indices is not None else t.host_indices
                    cut.device_indices = _slice_indices(idx, begin * e.page_size,
                                                        end * e.page_size)
                    cut.host_indices = None
                    kept.append(cut)
        with self._lock:
            try:
                self._lk.commit(rec.uid, commits)
            except _errors.CallbackError:
                # the commit itself went through: the engine's allocator raised
                rec.state, rec.queued = _COMMITTED, bool(kept)
                raise
            rec.state, rec.queued = _COMMITTED, bool(kept)
        return kept

    def abort_load(self, rid: str) -> bool:
        """ABORT: only for a load that never reached the insert (a failed
        LOAD, or one the engine calls off): its pins go and every device
        index of it goes back through free_indices, exactly once. True when
        a load was aborted; False when rid has none."""
        with self._lock:
            rec = self._loads.get(rid)
            if rec is None:
                return False
            if rec.state not in _UNCOMMITTED:
                raise _errors.StateError(
                    message="ABORT of rid %r in state %s: ABORT is only for a load that never "
                    "reached the insert" % (rid, rec.state))
            rec.state = "aborting"
        try:
            self._lk.abort(rec.uid)
        except _errors.NotFoundError:
            # libkvdock holds no record (its LOAD failed before recording):
            # the indices are still the engine's, hand them back here
            self._free_all(rec)
        finally:
            self._forget(rec)
        return True

    def _free_all(self, rec: _Load) -> None:
        if getattr(self._tls, "keep_indices", False):
            return
        for e, kt in zip(rec.entries, rec.kv_transfers):
            if e.spec.free_indices is not None and kt.indices is not None and kt.indices.size:
                e.spec.free_indices(kt.indices.copy())

    def _new_load(self, rid: str, transfers) -> _Load:
        """Records a load of rid over transfers (their kvdock transfers
        built first: a bad one raises ValueError and records nothing)."""
        entries = [self._entry(t) for t in transfers]
        kts = [self._kv_transfer(e, t, indices=True) for e, t in zip(entries, transfers)]
        with self._lock:
            self._check_open()
            if rid in self._loads:
                raise ValueError("rid %r has a load recorded already" % (rid,))
            rec = _Load(rid, next(self._uids), entries, transfers, kts)
            self._loads[rid] = rec
            self._by_uid[rec.uid] = rec
        return rec

    def _record(self, rid: str) -> _Load:
        rec = self._loads.get(rid)
        if rec is None:
            raise _errors.NotFoundError(message="no load of rid %r recorded" % (rid,))
        return rec

    def _forget(self, rec: _Load) -> None:
        with self._lock:
            if self._loads.get(rec.rid) is rec:
                del self._loads[rec.rid]
            self._by_uid.pop(rec.uid, None)

    # ---------------------------------------------------- SGLang's calls

    def load(self, rid: str, transfers: list[PoolTransfer]) -> bool:
        """Queues the load of rid; it copies at the next
        start_layer_wise_loading, not here. After commit_load(rid) this
        only confirms it. Without begin_load (SGLang's wrapper at
        SGLANG_COMMIT, whose tree adopted these exact transfers already) it
        runs LOAD, PREPARE and a whole COMMIT (kvdock.engine.load_whole).
        False when nothing was queued: LOAD failed (the pins are released;
        the indices stay with the tree that holds them), the linker is
        closed, or the call itself was wrong (logged at error level);
        never raises into the scheduler."""
        try:
            return self._load(rid, transfers)
        except _TRANSIENT as err:
            self._log.warn("load", "load of rid %s not queued: %s", rid, err)
            return False
        except _CALLER_ERRORS as err:
            self._log.error("load-bad-" + type(err).__name__, "load of rid %s refused: %s: %s",
                            rid, type(err).__name__, err)
            return False

    def _load(self, rid: str, transfers) -> bool:
        with self._lock:
            rec = self._loads.get(rid)
            if rec is not None:
                if rec.state == _COMMITTED:
                    rec.queued = True
                    return True
                raise _errors.StateError(message="load() of rid %r in state %s: COMMIT it "
                                         "first" % (rid, rec.state))
        transfers = [t for t in (transfers or ()) if t.keys]
        if not transfers:
            return False
        rec = self._new_load(rid, transfers)
        # the tree holds every index of these transfers: an ABORT (a failed
        # LOAD) hands none back
        self._tls.keep_indices = True
        try:
            _engine.load_whole(self._lk, rec.uid, rec.kv_transfers)
        except _errors.KvdockError as err:
            try:
                self._lk.abort(rec.uid)  # PREPARE or COMMIT failed after the LOAD
            except _errors.KvdockError:
                pass  # load_whole aborted it (a failed LOAD), or nothing is recorded
            self._forget(rec)
            self._log.warn("load", "LOAD of rid %s failed: %s; nothing queued", rid, err)
            return False
        except BaseException:
            self._forget(rec)
            raise
        finally:
            self._tls.keep_indices = False
        with self._lock:
            rec.state, rec.queued = _COMMITTED, True
        return True

    def start_layer_wise_loading(self) -> int:
        """Starts every committed load; the batch's index for
        layer_done_counter.set_consumer, or -1 when nothing is queued."""
        with self._lock:
            self._check_open()
            recs = [r for r in self._loads.values() if r.state == _COMMITTED]
            if not recs:
                return -1
            index = self._lk.start_layer_wise_loading()
            batch = _Batch(index)
            for r in recs:
                r.state, r.batch = _STARTED, index
                batch.waiting.add(r.uid)
            self._batches[index] = batch
            visible = any(r.queued for r in recs)
        return index if visible else -1

    def cancel_queued_load(self, rid: str) -> bool:
        """Calls off a load that never reached COMMIT (it is ABORTed: its
        device indices go back through free_indices): True. A committed
        load is not called off (the tree has published its indices:
        dropping the copy would leave it a hit over unwritten slots):
        False, and the load, once it completes, is reported through
        pop_completed_load whatever its outcome (SGLang's wrapper then only
        drops its lock; the request is gone). A load that failed and was
        held out of pop_completed_load: True (SGLang's wrapper then drops
        the lock it held for it). Never raises into the scheduler."""
        try:
            with self._lock:
                if rid in self._held_failed:
                    self._held_failed.discard(rid)
                    return True
                rec = self._loads.get(rid)
                if rec is None:
                    if any(r == rid for b in self._completed for r, _ in b):
                        self._released.add(rid)
                    return False
                if rec.state not in _UNCOMMITTED:
                    self._released.add(rid)
                    return False
            return self.abort_load(rid)
        except _errors.CallbackError as err:
            # the ABORT went through; the engine's allocator raised
            self._log.error("cancel-cb", "cancel of rid %s: the load is called off, but "
                            "free_indices raised: %r", rid, err.__cause__)
            return True
        except _CALLER_ERRORS as err:
            self._log.error("cancel-" + type(err).__name__, "cancel of rid %s failed: %s: %s", rid,
                            type(err).__name__, err)
            return False

    def _poll_loads(self) -> None:
        done = self._load_q.poll()
        if not done:
            return
        with self._lock:
            for uid, ok in done.items():
                rec = self._by_uid.pop(uid, None)
                if rec is None:
                    self._log.warn("unknown-load", "a completed load of unknown id %d", uid)
                    continue
                if self._loads.get(rec.rid) is rec:
                    del self._loads[rec.rid]
                batch = self._batches.get(rec.batch)
                if batch is None:
                    continue
                batch.waiting.discard(uid)
                if not ok:
                    for e in rec.entries:
                        self._failed_loads[e.spec.name] = self._failed_loads.get(
                            e.spec.name, 0) + 1
                    self._log.error("load-failed", "the load of rid %s failed after COMMIT: "
                                    "its KV is not usable (not reported as completed)",
                                    rec.rid)
                if rec.queued:
                    batch.results.append((rec.rid, bool(ok)))
                if not batch.waiting:
                    del self._batches[rec.batch]
                    if batch.results:
                        self._completed.append(batch.results)

    def num_completed_loads(self) -> int:
        """Completed load batches waiting to be popped."""
        self._poll_loads()
        with self._lock:
            return len(self._completed)

    def pop_completed_load(self) -> list[str]:
        """The request ids of the oldest completed batch whose loads
        succeeded ([] when none). SGLang's call carries no success flag
        and its wrapper takes every rid returned as loaded, so a failed
        rid is held out of it (logged at error level, counted in
        pool_stats' failed_loads) until the engine lets the request go:
        cancel_queued_load(rid) then answers True. A failed rid whose
        request was let go already is returned (the wrapper only drops
        its lock). pop_completed_load_status reports every rid with its
        outcome."""
        batch = self._pop_batch()
        rids = []
        with self._lock:
            for rid, ok in batch:
                released = rid in self._released
                self._released.discard(rid)
                if ok or released:
                    rids.append(rid)
                else:
                    self._held_failed.add(rid)
        return rids

    def pop_completed_load_status(self) -> list:
        """[(rid, success)] of the oldest completed batch ([] when none): a
        rid that failed has no usable KV, the engine recomputes it."""
        batch = self._pop_batch()
        with self._lock:
            for rid, _ in batch:
                self._released.discard(rid)
        return batch

    def _pop_batch(self) -> list:
        self._poll_loads()
        with self._lock:
            return list(self._completed.popleft()) if self._completed else []

    def _wait_layer(self, index: int, layer_id: int) -> None:
        if index < 0:
            return
        try:
            self._lk.wait_layer(index, layer_id)
        except _errors.KvdockError as err:
            with self._lock:
                batch = self._batches.get(index)
                first = batch is not None and batch.wait_error is None
                if batch is not None:
                    batch.wait_error = err
            if first or batch is None:
                self._log.warn("layer", "layer %d of load batch %d: %s (its loads complete "
                               "as failed)", layer_id, index, err)

    # ------------------------------------------------------------ offload

    def offload(self, transfers: list[PoolTransfer]) -> bool:
        """Queues every transfer's device rows for storing (reserve, write,
        publish on the linker's offload thread); the rows must stay as they
        are until its completion is popped. False when nothing was queued
        (never raises into the scheduler)."""
        try:
            transfers = [t for t in (transfers or ()) if t.keys]
            if not transfers:
                return False
            kts = [self._kv_transfer(self._entry(t), t, indices=True) for t in transfers]
            with self._lock:
                self._check_open()
                ack = self._lk.offload(kts)
                self._offloads.append(ack)
            return True
        except _TRANSIENT as err:
            self._log.warn("offload", "offload not queued: %s", err)
            return False
        except _CALLER_ERRORS as err:
            self._log.error("offload-bad-" + type(err).__name__, "offload refused: %s: %s",
                            type(err).__name__, err)
            return False

    def _poll_offloads(self) -> None:
        with self._lock:
            want = [a for a in self._offloads if a not in self._offload_done]
            if want:
                self._offload_done.update(self._offload_q.take(want))

    def num_completed_offloads(self) -> int:
        """Offloads completed, counted in the order they were queued (a
        later one done before an earlier one waits for it)."""
        self._poll_offloads()
        with self._lock:
            n = 0
            for ack in self._offloads:
                if ack not in self._offload_done:
                    break
                n += 1
            return n

    def pop_completed_offload(self) -> bool:
        """The oldest queued offload's result, once it completed (False
        when it has not)."""
        self._poll_offloads()
        with self._lock:
            if not self._offloads or self._offloads[0] not in self._offload_done:
                return False
            return self._offload_done.pop(self._offloads.popleft())

    # ------------------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise _errors.ClosedError(message="the kvdock unified-cache linker is closed")

    def _quiesce(self) -> None:
        """Aborts the loads that never reached COMMIT, starts the committed
        ones, and waits for every load and offload to come back, up to
        kvdock.engine.completion_bound_s (past it libkvdock broke its own
        bound: what is still out is forgotten, its completion dropped when
        it comes)."""
        with self._lock:
            uncommitted = [r.rid for r in self._loads.values() if r.state in _UNCOMMITTED]
        for rid in uncommitted:
            try:
                self.abort_load(rid)
            except _errors.KvdockError as err:
                self._log.warn("reset-abort", "reset: ABORT of rid %s: %s", rid, err)
        with self._lock:
            if any(r.state == _COMMITTED for r in self._loads.values()):
                self.start_layer_wise_loading()
        deadline = time.monotonic() + _engine.completion_bound_s(self.timeout_ms)
        while True:
            self._poll_loads()
            self._poll_offloads()
            with self._lock:
                loads = list(self._by_uid)
                acks = [a for a in self._offloads if a not in self._offload_done]
            if not loads and not acks:
                return
            if self._lk.closed:
                return  # closing failed every pending one
            if time.monotonic() >= deadline:
                break
            time.sleep(0.002)
        self._load_q.forget(loads)
        self._offload_q.forget(acks)
        self._log.error("reset-bound", "reset: %d loads and %d offloads did not come back "
                        "within %.1f s: libkvdock broke its bound; forgetting them",
                        len(loads), len(acks), _engine.completion_bound_s(self.timeout_ms))

    def reset(self) -> None:
        """Quiesces every transfer (see _quiesce) and forgets all state:
        completions not popped are dropped, and so is any that comes back
        after this."""
        with self._lock:
            self._check_open()
        self._quiesce()
        with self._lock:
            self._load_q.forget(list(self._by_uid))
            self._offload_q.forget([a for a in self._offloads if a not in self._offload_done])
            self._loads.clear()
            self._by_uid.clear()
            self._batches.clear()
            self._completed.clear()
            self._offloads.clear()
            self._offload_done.clear()
            self._held_failed.clear()
            self._released.clear()
            self.layer_done_counter.reset()

    def close(self) -> None:
        """Quiesces every transfer and closes the linker (when this adapter
        opened it). Idempotent."""
        with self._lock:
            if self._closed:
                return
        try:
            if not self._lk.closed:
                self.reset()
        finally:
            with self._lock:
                self._closed = True
            if self._owns_linker:
                self._lk.close()


__all__ = ["KvdockUnifiedCacheLinker", "KvdockLayerDoneCounter", "DevicePool",
           "device_pools_from_sglang", "UnifiedCacheLinker", "PoolName", "PoolHitPolicy",
           "PoolTransfer", "SGLANG_COMMIT"]
