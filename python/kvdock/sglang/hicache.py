"""kvdock as SGLang's HiCache storage backend (its L3 tier).

SGLang loads it with

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvdock",
        "module_path": "kvdock.sglang", "class_name": "KvdockHiCacheStorage",
        "interface_v1": 1, "socket_path": "/run/kvdock/kvdockd.sock"}'

and builds it as ``KvdockHiCacheStorage(storage_config, kwargs)`` (the
factory's dynamic path), then hands it the host KV pool
(``register_mem_pool_host``) and, for hybrid models, every other host pool
(``register_mem_host_pool_v2``: mamba, SWA, indexer, ...).

Written against SGLang's own sources (no SGLang code is copied), at commit
001067fffe33427bee0ed2f007fb7551a1d76b44 of sgl-project/sglang:
``python/sglang/srt/mem_cache/hicache_storage.py`` (the HiCacheStorage ABC,
HiCacheStorageConfig, HiCacheStorageExtraInfo, PoolName, PoolHitPolicy,
PoolTransfer, PoolTransferResult), ``mem_cache/storage/backend_factory.py``
(the dynamic loader), ``managers/cache_controller.py`` and
``mem_cache/hybrid_cache/hybrid_cache_controller.py`` (the call order),
``mem_cache/pool_host/{mha,mla,mamba}.py`` (the host pools' tensors and
layouts, read at 0047d999, c7631876 and 02f0c2a0: the layouts are those of
the older ``memory_pool_host.py``) and ``mem_cache/storage/mooncake_store``
(another zero-copy backend). Where SGLang is importable its classes are
used; otherwise the restatements below (same names, same signatures) stand
in, so the module imports without SGLang installed.

How the engine's calls map onto kvdock
--------------------------------------
The host pool's tensors are, for kvdock, the "device" pool (memory kind
host): each host pool becomes one kvdock pool whose layers are the host
pool's layers and whose buffers are its component tensors (K and V; the one
MLA buffer; a mamba layer's temporal state then its conv states), so a
stored object is one page (one mamba slot) across all layers, and the bytes
move straight between the host pool and kvdockd's shared pool (no staging)
on the v1/v2 paths.

* ``batch_exists(keys)``: one lookup; the number of leading keys present
  (SGLang's prefix semantics: a page hash names a whole prefix, so a hole
  ends the usable prefix).
* ``batch_get_v1(keys, host_indices)``: LOAD, PREPARE, COMMIT (everything
  adopted), start, wait every layer, and this request's completion: the
  bytes are in the host pool when it returns. When a page went missing since
  batch_exists (evicted), the load is aborted and the present prefix loaded
  instead; the answer is True for that prefix and False after it (SGLang
  counts leading Trues).
* ``batch_set_v1(keys, host_indices)``: one offload; returns when its ack
  came back, so the host rows may change again. A failed ack answers, per
  key, whether the key is stored now.
* ``batch_exists_v2`` / ``batch_get_v2`` / ``batch_set_v2``: the same per
  PoolTransfer. Every restorable boundary is computed per pool by its hit
  policy (ALL_PAGES: every page up to it; TRAILING_PAGES: the last
  len(transfer.keys) pages before it) and the pools' sets are intersected,
  so a boundary is reported only where every pool can supply its part.
* ``get`` / ``set`` / ``batch_get`` / ``batch_set`` / ``exists``: SGLang's
  generic page path (used when ``interface_v1`` is not set): flat pages
  (``get_data_page``'s format) go through a small staging copy of the host
  pool's layout, registered under the same namespace, so both paths read
  and write the same objects.
* None of these raise into the engine or return None: a failure (daemon
  gone, timeout, bad arguments) is logged and answered False (per key) or
  0; every call is bounded by ``timeout_ms``. Failures of the store
  (kvdock.engine.TRANSIENT) are logged as warnings, anything else (a bad
  argument) as an error, each kind at most once per 10 s. A committed load
  whose start keeps failing (the library out of memory) is never left to
  copy into rows SGLang reuses: the connection is closed after the bound
  (everything pending fails; the backend answers nothing from then on).

Namespaces: ``model_id`` (default: SGLang's model name, plus ``@tp<size>``
for a model whose KV is split across TP ranks) / pool name / ``tp<rank>`` or,
for MLA (``is_mla_model``: identical on every TP rank), ``rep``: stored
once. Mamba state stays per rank even in an MLA model. PP and attention-CP
ranks are part of the namespace when their sizes are above 1.

Options (the extra-config JSON; the constructor's ``kwargs`` dict overrides
it):

=================== =========================================================
backend_name,        SGLang's (required by its dynamic loader).
module_path,
class_name
interface_v1        SGLang's: 1 makes it call batch_get_v1/batch_set_v1
                    (zero copy). Without it SGLang uses get/set with a copy
                    per page through the staging buffer: slower.
hicache_storage_    SGLang's: true passes each batch's preceding page
pass_prefix_keys    hashes (extra_info.prefix_keys), so kvdock records each
                    page's depth and parent across the 128-page batches (its
                    eviction takes the deepest pages first); without it each
                    batch starts a chain of its own.
socket_path         kvdockd's Unix socket (default: the default instance's,
                    as libkvdock finds it).
connect             "HOST:PORT" of a kvdockd TCP listener, instead of the
                    socket (bytes then move over UCX; needs a token).
auth_token_file     file holding the token the daemon expects (required
                    over TCP; optional on the socket). Default:
                    $KVDOCK_AUTH_TOKEN_FILE.
timeout_ms          bound on every kvdock call (default 5000). A backend
                    call makes a few of them and waits for its copies
                    (and acks) until they came, at most 4 x timeout_ms +
                    1 s (kvdock.engine.completion_bound_s; a hung daemon):
                    until then the host rows are the library's, so no call
                    returns early. A daemon that is gone, or close(), fails
                    them at once.
connect_wait_s      how long the constructor waits for a daemon that is not
                    up or not ready yet (default 30); then it raises.
model_id            the stored KV's identity, replacing the default above;
                    set it when two deployments share a model name but not
                    the KV (another dtype, another quantisation).
client_name         the name in the daemon's log (default
                    "sglang-hicache-tp<rank>").
transport, ucx_mode libkvdock's (default: $KVDOCK_TRANSPORT / auto).
layer_group_size    layers copied per step of a load (default: all layers
                    of the pool in one step; the host tier does not overlap
                    loads with compute).
spin_us             libkvdock's spin before sleeping (default: its own).
staging_mb          size of each of the two staging buffers of the generic
                    path (default 64; at least one page).
clear_evicts        whether clear() drops this backend's namespaces from
                    the daemon (default true).
=================== =========================================================
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from typing import Any, Dict, List, Optional

import numpy as np

try:
    import torch
except ImportError:  # the engine always has it; the module still imports
    torch = None

import kvdock
from kvdock import KvdockError, NoMemError, InvalidError, NotFoundError
from kvdock.buffers import int64_array
from kvdock.engine import (TRANSIENT, Completions, RateLimitedLog, completion_bound_s,
                           load_whole, page_key)

logger = logging.getLogger(__name__)

SGLANG_COMMIT = "001067fffe33427bee0ed2f007fb7551a1d76b44"

# ----------------------------------------------------------------------------
# SGLang's interface: its own classes where importable, else restatements
# (same names, fields and signatures as at SGLANG_COMMIT).

try:
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
        PoolHitPolicy,
        PoolName,
        PoolTransfer,
        PoolTransferResult,
    )

    SGLANG_PRESENT = True
except Exception:  # not installed (or another layout): the restatements
    SGLANG_PRESENT = False

    @dataclass
    class HiCacheStorageConfig:
        tp_rank: int
        tp_size: int
        pp_rank: int
        pp_size: int
        attn_cp_rank: int
        attn_cp_size: int
        is_mla_model: bool
        enable_storage_metrics: bool
        is_page_first_layout: bool
        model_name: Optional[str]
        dp_rank: int = 0
        dp_size: int = 1
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        extra_config: Optional[dict] = None

    @dataclass
    class HiCacheStorageExtraInfo:
        prefix_keys: Optional[List[str]] = None
        extra_info: Optional[dict] = None

    class PoolName(str, Enum):
        KV = "kv"
        MAMBA = "mamba"
        SWA = "swa"
        INDEXER = "indexer"
        DEEPSEEK_V4_C4 = "deepseek_v4_c4"
        DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
        DEEPSEEK_V4_C128 = "deepseek_v4_c128"
        DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
        DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
        DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
        DRAFT = "draft"
        DRAFT_INDEXER = "draft_indexer"
        DRAFT_SWA = "draft_swa"

        def __str__(self) -> str:
            return self.value

    class PoolHitPolicy(str, Enum):
        ALL_PAGES = "all_pages"
        TRAILING_PAGES = "trailing_pages"

    @dataclass
    class PoolTransfer:
        name: PoolName
        host_indices: Optional[Any] = None
        device_indices: Optional[Any] = None
        keys: Optional[List[str]] = None
        hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
        nodes_to_load: Optional[List[Any]] = None
        indices_from_pool: Optional[PoolName] = None

    @dataclass
    class PoolTransferResult:
        kv_hit_pages: int
        extra_pool_hit_pages: dict

        @classmethod
        def empty(cls) -> "PoolTransferResult":
            return cls(0, {})

    class HiCacheStorage(ABC):
        """The method names and signatures of SGLang's HiCacheStorage."""

        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool, host_pool_name):
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
            raise NotImplementedError()

        def batch_get_v2(self, transfers, extra_info=None):
            raise NotImplementedError()

        def batch_set_v2(self, transfers, extra_info=None):
            raise NotImplementedError()

        def batch_get_v1(self, keys, host_indices, extra_info=None):
            raise NotImplementedError()

        def batch_set_v1(self, keys, host_indices, extra_info=None):
            raise NotImplementedError()

        @abstractmethod
        def get(self, key, target_location=None, target_sizes=None):
            pass

        @abstractmethod
        def batch_get(self, keys, target_locations=None, target_sizes=None):
            pass

        @abstractmethod
        def set(self, key, value=None, target_location=None, target_sizes=None):
            pass

        @abstractmethod
        def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
            pass

        @abstractmethod
        def exists(self, key):
            pass

        def batch_exists(self, keys, extra_info=None):
            for i in range(len(keys)):
                if not self.exists(keys[i]):
                    return i
            return len(keys)

        def clear(self) -> None:
            pass

        def get_stats(self):
            return None


try:  # what SGLang's storage metrics collector asserts get_stats returns
    from sglang.srt.metrics.collector import StorageMetrics  # type: ignore
except Exception:

    @dataclass
    class StorageMetrics:
        prefetch_pgs: List[int] = field(default_factory=list)
        backup_pgs: List[int] = field(default_factory=list)
        prefetch_bandwidth: List[float] = field(default_factory=list)
        backup_bandwidth: List[float] = field(default_factory=list)


# ----------------------------------------------------------------------------
# Keys

# kvdock.engine.page_key: SGLang's page hash (the hex of a SHA-256 digest,
# get_hash_str) decoded; any other key hashed with SHA-256.


def _pool_key(name) -> str:
    """A PoolName (or its string) as the plain string the backend files
    pools under."""
    return name.value if isinstance(name, Enum) else str(name)


# ----------------------------------------------------------------------------
# Host pools as kvdock pools

LAYOUTS = ("layer_first", "page_first", "page_first_direct")


class HostPoolView:
    """One SGLang host pool as kvdock sees it.

    ``comps`` are the pool's component tensors in object order (K, V; the
    MLA buffer; mamba temporal then conv). By layout, a component tensor is
    (layers, tokens, ...) for layer_first, (tokens, layers, ...) for
    page_first and (pages, layers, page_size, ...) for page_first_direct
    (mamba: slots for tokens, page_size 1). Each layer of a component is a
    kvdock buffer whose rows are tokens (slots), or whole pages for
    page_first_direct, where a page's tokens are contiguous per layer but
    the pages are layers apart: kvdock then addresses pages (its page_size
    1), and the object it stores has the same bytes as for the other
    layouts (layer by layer, component by component, the page's token
    rows), so a page stored from one layout restores into another."""

    def __init__(self, name: str, host_pool, comps, kind: str, layout: str, page_size: int):
        if layout not in LAYOUTS:
            raise ValueError("kvdock: host pool %r has layout %r; supported: %s"
                             % (name, layout, ", ".join(LAYOUTS)))
        if not comps or not all(torch is not None and isinstance(t, torch.Tensor) for t in comps):
            raise ValueError("kvdock: host pool %r exposes no tensors to register" % name)
        if any(t.device.type != "cpu" for t in comps):
            raise ValueError("kvdock: host pool %r is not in host memory" % name)
        self.name = name
        self.host_pool = host_pool
        self.comps = list(comps)
        self.kind = kind  # kvdock.PAGED or kvdock.SLOT
        self.layout = layout
        self.page_size = int(page_size)  # tokens per key in the host pool's indices
        # page_first_direct pages are rows of their own; mamba slots are rows
        self.pages_as_rows = layout == "page_first_direct" and kind == kvdock.PAGED \
            and self.page_size > 1
        self.layers = self._layer_buffers()
        self.layer_ids = sorted(self.layers)
        self.pool = None  # the kvdock.Pool once registered

    # -- registration

    def _layer_axis(self) -> int:
        return 0 if self.layout == "layer_first" else 1

    def _layer_buffers(self) -> Dict[int, list]:
        axis = self._layer_axis()
        n_layers = {int(t.shape[axis]) for t in self.comps}
        if len(n_layers) != 1:
            raise ValueError("kvdock: host pool %r: components with %s layers"
                             % (self.name, sorted(n_layers)))
        n = n_layers.pop()
        if n == 0:
            raise ValueError("kvdock: host pool %r has no layers" % self.name)
        return {layer: [t.select(axis, layer) for t in self.comps] for layer in range(n)}

    @property
    def kvdock_page_size(self) -> int:
        if self.kind == kvdock.SLOT or self.pages_as_rows:
            return 1
        return self.page_size

    def register(self, lk, rank_replicated: bool, trailing_pages: int):
        self.pool = lk.register_pool(self.name, self.layers, addressing=self.kind,
                                     page_size=self.kvdock_page_size,
                                     trailing_pages=trailing_pages,
                                     rank_replicated=rank_replicated)
        return self.pool

    # -- indices

    def n_index_for(self, n_keys: int) -> int:
        """host_indices entries SGLang passes for n_keys keys."""
        return n_keys * (1 if self.kind == kvdock.SLOT else self.page_size)

    def kvdock_indices(self, host_indices) -> np.ndarray:
        """SGLang's host indices (one per token, or per slot) as the
        transfer's indices (page ids for page_first_direct)."""
        idx = int64_array(host_indices, "host indices")
        if self.pages_as_rows:
            # a page's tokens must be its own consecutive, aligned slots, or
            # the page id would name another page's rows
            ps = self.page_size
            pages = idx.reshape(-1, ps)
            if (pages[:, 0] % ps).any() or (pages - pages[:, :1] != np.arange(ps)).any():
                raise ValueError("host indices are not whole, aligned pages")
            idx = pages[:, 0] // ps
        return np.ascontiguousarray(idx, dtype=np.int64)

    # -- flat pages (the generic path)

    def page_views(self, index: int) -> list:
        """Each component's view of the page at host token index ``index``,
        in the order (and shape) get_data_page flattens them."""
        ps = self.page_size if self.kind == kvdock.PAGED else 1
        if self.layout == "layer_first":
            return [t[:, index:index + ps] for t in self.comps]
        if self.layout == "page_first" or not self.pages_as_rows:
            return [t[index:index + ps] for t in self.comps]
        p = index // ps
        return [t[p:p + 1] for t in self.comps]

    def page_elems(self) -> int:
        return sum(v.numel() for v in self.page_views(0))

    def page_bytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.page_views(0))

    def mirror(self, n_pages: int) -> "HostPoolView":
        """A pool of n_pages pages with this one's layout, dtypes and
        shapes (the generic path's staging), zero-filled."""
        ps = self.page_size if self.kind == kvdock.PAGED else 1
        comps = []
        for t in self.comps:
            shape = list(t.shape)
            if self.layout == "layer_first":
                shape[1] = n_pages * ps
            elif self.pages_as_rows:
                shape[0] = n_pages
            else:
                shape[0] = n_pages * ps
            comps.append(torch.zeros(shape, dtype=t.dtype))
        return HostPoolView(self.name, None, comps, self.kind, self.layout, self.page_size)


def _tensor(x):
    return x if torch is not None and isinstance(x, torch.Tensor) else None


def describe_host_pool(name: str, host_pool) -> HostPoolView:
    """The HostPoolView of one SGLang host pool, found by what it holds:
    mamba state (temporal_buffer, conv_buffer: slot-addressed), K and V
    buffers (MHA), one buffer (MLA: k_buffer, or kv_buffer in older
    versions). ValueError for a pool with nothing kvdock can register
    (e.g. a logical anchor without tensors, or the page_head layout)."""
    layout = getattr(host_pool, "layout", None)
    if hasattr(host_pool, "conv_buffer") or hasattr(host_pool, "temporal_buffer"):
        temporal = _tensor(getattr(host_pool, "temporal_buffer", None))
        comps = [temporal] if temporal is not None and temporal.numel() > 0 else []
        comps += [c for c in (getattr(host_pool, "conv_buffer", None) or [])]
        return HostPoolView(name, host_pool, comps, kvdock.SLOT, layout, 1)
    page_size = int(getattr(host_pool, "page_size", 1) or 1)
    k = _tensor(getattr(host_pool, "k_buffer", None))
    v = _tensor(getattr(host_pool, "v_buffer", None))
    if k is not None and v is not None:
        comps = [k, v]
    elif k is not None:
        comps = [k]
    else:
        kv = getattr(host_pool, "kv_buffer", None)
        if _tensor(kv) is not None:
            comps = [kv]
        elif isinstance(kv, (list, tuple)) and len(kv) == 2 and all(_tensor(x) is not None
                                                                    for x in kv):
            comps = list(kv)  # (K, V) kept apart (K and V of different widths)
        else:
            raise ValueError("kvdock: host pool %r (%s) holds no tensors kvdock can register "
                             "(a logical anchor pool, or per-layer lists)"
                             % (name, type(host_pool).__name__))
    return HostPoolView(name, host_pool, comps, kvdock.PAGED, layout, page_size)


_METRICS_CAP = 4096  # entries kept per metric between two get_stats calls


def _true_prefix(n_ok: int, n: int) -> List[bool]:
    return [True] * n_ok + [False] * (n - n_ok)


class _Item:
    """One pool's part of a load: its view, raw keys and kvdock indices."""

    __slots__ = ("view", "keys", "indices")

    def __init__(self, view, keys, indices):
        self.view, self.keys, self.indices = view, keys, indices


# ----------------------------------------------------------------------------
# The backend

class KvdockHiCacheStorage(HiCacheStorage):
    """SGLang's HiCache storage backend over kvdock (see the module's
    docstring for the options and how each call maps onto kvdock)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        cfg = dict(getattr(storage_config, "extra_config", None) or {})
        if isinstance(kwargs, dict):
            cfg.update(kwargs)
        self.config = cfg
        self.storage_config = storage_config
        self.tp_rank = int(getattr(storage_config, "tp_rank", 0) or 0)
        self.tp_size = int(getattr(storage_config, "tp_size", 1) or 1)
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self.timeout_ms = int(cfg.get("timeout_ms", 5000))
        if self.timeout_ms <= 0:
            raise ValueError("kvdock: timeout_ms must be positive")
        self.model_id = str(cfg.get("model_id") or self._default_model_id(storage_config))
        self.layer_group_size = int(cfg.get("layer_group_size", 0) or 0)
        self.staging_bytes = max(1, int(float(cfg.get("staging_mb", 64)) * (1 << 20)))
        self.clear_evicts = bool(cfg.get("clear_evicts", True))
        if not cfg.get("interface_v1"):
            logger.warning("kvdock: the extra config has no \"interface_v1\": 1; SGLang will use "
                           "the generic page path (a copy per page) instead of batch_get_v1/"
                           "batch_set_v1")
        self._log = RateLimitedLog(logger)
        self._rids = itertools.count(1)
        self._load_lock = threading.Lock()
        self._views: Dict[str, HostPoolView] = {}  # pool name -> view (registered)
        self._kv: Optional[HostPoolView] = None
        self._stage_get = None  # (view, lock) of the generic path, made on first use
        self._stage_set = None
        self._stage_make_lock = threading.Lock()
        self._metrics_lock = threading.Lock()
        self._metrics = StorageMetrics()
        self.lk = self._open(cfg, storage_config)
        # every wait on a completion lasts until it came (or the linker
        # closed, or broke its own bound): until then the host rows it names
        # are the linker's, not SGLang's
        self._bound_s = completion_bound_s(self.timeout_ms)
        self._loads = Completions(self.lk.pop_completed_loads, self._log)
        self._offloads = Completions(self.lk.pop_completed_offloads, self._log)

    # -------------------------------------------------------------- setup

    def _default_model_id(self, sc) -> str:
        name = getattr(sc, "model_name", None) or "model"
        # KV split across TP ranks differs by TP size; MLA KV does not
        return name if self.is_mla else "%s@tp%d" % (name, self.tp_size)

    def _open(self, cfg, sc):
        pp_size = int(getattr(sc, "pp_size", 1) or 1)
        cp_size = int(getattr(sc, "attn_cp_size", 1) or 1)
        group = self.layer_group_size
        args = dict(
            socket_path=cfg.get("socket_path"), connect=cfg.get("connect"),
            client_name=cfg.get("client_name") or "sglang-hicache-tp%d" % self.tp_rank,
            model_id=self.model_id, tp_rank=self.tp_rank, tp_size=self.tp_size,
            pp_rank=int(getattr(sc, "pp_rank", 0) or 0), pp_size=pp_size,
            cp_rank=int(getattr(sc, "attn_cp_rank", 0) or 0), cp_size=cp_size,
            layer_group_size=group if group > 0 else 1024, timeout_ms=self.timeout_ms,
            spin_us=int(cfg.get("spin_us", 0) or 0), transport=cfg.get("transport"),
            ucx_mode=cfg.get("ucx_mode"), auth_token_file=cfg.get("auth_token_file"))
        wait_s = float(cfg.get("connect_wait_s", 30))
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            try:
                return kvdock.Linker(**args)
            except (kvdock.UnavailableError, kvdock.TimeoutError, kvdock.ClosedError) as e:
                if time.monotonic() >= deadline:
                    raise RuntimeError("kvdock: no kvdockd ready at %s within %.0f s: %s"
                                       % (cfg.get("connect") or cfg.get("socket_path")
                                          or "the default socket", wait_s, e)) from e
                time.sleep(0.2)

    def _register_view(self, view: HostPoolView, trailing: int):
        # MLA KV (and its indexer) is the same on every TP rank; mamba state
        # is split across ranks even in an MLA model
        replicated = self.is_mla and view.kind == kvdock.PAGED
        view.register(self.lk, replicated, trailing)
        logger.info("kvdock: host pool %r (%s, %s, %d layers) is namespace %s, %d bytes an "
                    "object", view.name, view.layout, view.kind, len(view.layer_ids),
                    view.pool.namespace, view.pool.object_bytes)

    def register_mem_pool_host(self, mem_pool_host):
        """The host KV pool (HiCache's anchor): registered as kvdock pool
        "kv" (ALL_PAGES). Raises for a pool kvdock cannot register."""
        super().register_mem_pool_host(mem_pool_host)
        if self._kv is not None:
            if self._kv.host_pool is mem_pool_host:
                return
            raise ValueError("kvdock: a second host KV pool; one backend serves one")
        view = describe_host_pool(_pool_key(PoolName.KV), mem_pool_host)
        self._register_view(view, trailing=0)
        self._kv = view
        self._views[view.name] = view

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """Another host pool of a hybrid model (mamba, SWA, indexer, ...),
        registered under its PoolName. Sidecar pools are registered with a
        one-page trailing policy, so that a lookup tells which of their
        pages are present; each call's hit policy is then applied here."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = _pool_key(host_pool_name)
        have = self._views.get(name)
        if have is not None:
            if have.host_pool is host_pool:
                return
            raise ValueError("kvdock: host pool %r registered twice with different pools" % name)
        if name == _pool_key(PoolName.KV):
            self.register_mem_pool_host(host_pool)
            return
        view = describe_host_pool(name, host_pool)
        self._register_view(view, trailing=1)
        self._views[name] = view

    def close(self):
        """Closes the connection (SGLang calls it when it detaches the
        backend). Idempotent."""
        self.lk.close()

    # ------------------------------------------------------------- helpers

    def _present(self, view: HostPoolView, keys: List[bytes]):
        """(leading, present): how many keys from keys[0] are stored, and
        for a sidecar (registered with a one-page trailing policy) the set
        of indices of every stored key (None for the KV pool, whose lookup
        answers the leading run only)."""
        if not keys:
            return 0, set()
        b = self.lk.lookup_keys(next(self._rids), view.pool, keys)
        if view.pool.trailing_pages == 0:
            return (b[-1] if b else 0), None
        present = {x - 1 for x in b}
        lead = 0
        while lead in present:
            lead += 1
        return lead, present

    def _abort(self, rid: int):
        try:
            self.lk.abort(rid)
        except KvdockError:
            pass  # nothing recorded, or aborted already

    def _warn(self, kind: str, e: Exception, fmt: str, *args):
        """A failed kvdock call, rate-limited: the store's failures
        (engine.TRANSIENT) as warnings, anything else (a bad argument, a
        bug) as an error."""
        log = self._log.warn if isinstance(e, TRANSIENT) else self._log.error
        log(kind, fmt + ": %s", *(args + (e,)))

    def _load_one(self, item: _Item):
        """LOAD + PREPARE + COMMIT of one pool's part; (rid, n_keys loaded)
        or (None, 0). When a page is missing now, the present prefix."""
        keys, idx = item.keys, item.indices
        per_key = len(idx) // len(keys)
        for attempt in range(2):
            rid = next(self._rids)
            try:
                load_whole(self.lk, rid, [kvdock.Transfer(item.view.pool, keys, indices=idx)])
            except NotFoundError:
                # a page evicted since batch_exists (load_whole aborted the load)
                if attempt:
                    return None, 0
                try:
                    lead, _ = self._present(item.view, keys)
                except KvdockError:
                    return None, 0
                if lead == 0:
                    return None, 0
                keys, idx = keys[:lead], idx[:lead * per_key]
                continue
            except KvdockError as e:
                self._abort(rid)  # PREPARE or COMMIT failed (after a LOAD's: a no-op)
                self._warn("load", e, "load of %d pages of pool %r failed", len(keys),
                           item.view.name)
                return None, 0
            return rid, len(keys)
        return None, 0

    def _start_loads(self):
        """start_layer_wise_loading of the committed loads: its counter, or
        None when they are not started (the linker is closed or broken:
        their completions say failed). It fails only on NOMEM or INVALID,
        and a committed load cannot be called off, so it is retried; should
        it keep failing for the completion bound, the linker is closed (its
        pending loads complete as failed), since a load started later would
        copy into host rows SGLang has taken back by then."""
        deadline = time.monotonic() + self._bound_s
        pause = 0.001
        while True:
            try:
                return self.lk.start_layer_wise_loading()
            except (NoMemError, InvalidError) as e:
                if time.monotonic() >= deadline:
                    self._log.error("start", "starting committed loads kept failing for "
                                    "%.1f s (%s): closing the connection, so that they never "
                                    "copy into reused host rows; this backend stores and loads "
                                    "nothing from now on", self._bound_s, e)
                    self.lk.close()
                    return None
                self._log.warn("start", "starting committed loads failed, retrying: %s", e)
                time.sleep(pause)
                pause = min(0.1, pause * 2)
            except KvdockError as e:
                self._warn("start", e, "starting loads failed")
                return None

    def _load(self, items: List[_Item]) -> List[int]:
        """Loads every item into its pool, blocking until the bytes are in
        place: the number of leading keys loaded per item. It never returns
        (nor raises) before every committed load's completion came (or the
        linker closed, or broke its bound): until then the library may copy
        into the host rows."""
        started = []  # (item index, rid, n)
        done = None
        try:
            counter = None
            with self._load_lock:
                try:
                    for i, item in enumerate(items):
                        if item.keys:
                            rid, n = self._load_one(item)
                            if rid is not None:
                                started.append((i, rid, n))
                finally:
                    # a committed load cannot be called off: it is started
                    # (and waited for) whatever happened to the others
                    if started:
                        counter = self._start_loads()
            if counter is not None:
                layers = sorted({lid for i, _, _ in started for lid in items[i].view.layer_ids})
                for lid in layers:
                    try:
                        self.lk.wait_layer(counter, lid)
                    except KvdockError as e:
                        # the completions below say which load failed
                        self._warn("wait", e, "a load batch failed")
                        break
            done = self._loads.wait([rid for _, rid, _ in started], self._bound_s)
        finally:
            if done is None and started:
                self._settle(self._loads, [rid for _, rid, _ in started])
        out = [0] * len(items)
        for i, rid, n in started:
            out[i] = n if done.get(rid) else 0
        return out

    def _settle(self, completions: Completions, ids):
        """On the way out of a call that raised: waits for ids all the same
        (the rows they name are the linker's until then); ids still owed
        when even that is cut short are forgotten, so that they are dropped
        when they come."""
        try:
            completions.wait(ids, self._bound_s)
        except BaseException:
            completions.forget(ids)
            raise

    def _offload(self, items: List[_Item], prefix_keys=None) -> List[bool]:
        """Offloads every item, blocking until each ack is back (or the
        linker closed, or broke its bound): success per item."""
        acks = []
        done = None
        try:
            for i, item in enumerate(items):
                if not item.keys:
                    continue
                depth, prior = 0, None
                if prefix_keys and item.view is self._kv:
                    depth, prior = len(prefix_keys), page_key(prefix_keys[-1])
                try:
                    acks.append((i, self.lk.offload([kvdock.Transfer(
                        item.view.pool, item.keys, indices=item.indices, first_depth=depth,
                        prior_key=prior)])))
                except KvdockError as e:
                    self._warn("offload", e, "offload of %d pages of pool %r failed",
                               len(item.keys), item.view.name)
            done = self._offloads.wait([a for _, a in acks], self._bound_s)
        finally:
            if done is None and acks:
                self._settle(self._offloads, [a for _, a in acks])
        ok = [not item.keys for item in items]
        for i, ack in acks:
            ok[i] = bool(done.get(ack))
        return ok

    def _stored_now(self, view: HostPoolView, keys: List[bytes]) -> List[bool]:
        """Per key, whether it is stored (after a failed offload)."""
        try:
            lead, present = self._present(view, keys)
        except KvdockError:
            return [False] * len(keys)
        if present is None:
            return _true_prefix(lead, len(keys))
        return [i in present for i in range(len(keys))]

    def _item(self, view: HostPoolView, keys, host_indices) -> Optional[_Item]:
        """The item for keys and SGLang's host indices; None when they
        disagree in length."""
        if host_indices is None or len(keys) == 0:
            return None
        n_idx = host_indices.numel() if _tensor(host_indices) is not None else len(host_indices)
        if n_idx != view.n_index_for(len(keys)):
            self._log.warn("indices", "pool %r: %d host indices for %d keys (want %d)",
                           view.name, n_idx, len(keys), view.n_index_for(len(keys)))
            return None
        return _Item(view, [page_key(k) for k in keys], view.kvdock_indices(host_indices))

    def _record(self, what: str, pages: int, nbytes: int, seconds: float):
        if pages <= 0:
            return
        with self._metrics_lock:
            m = self._metrics
            pgs, bw = (m.prefetch_pgs, m.prefetch_bandwidth) if what == "get" else \
                (m.backup_pgs, m.backup_bandwidth)
            if len(pgs) < _METRICS_CAP:
                pgs.append(pages)
                bw.append(nbytes / max(seconds, 1e-9) / 1e9)

    # ------------------------------------------------------ the v1 path

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many of keys, from keys[0], are stored (0 on any failure)."""
        if self._kv is None or not keys:
            return 0
        try:
            lead, _ = self._present(self._kv, [page_key(k) for k in keys])
            return lead
        except Exception as e:
            self._warn("exists", e, "lookup of %d keys failed", len(keys))
            return 0

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_get_v1(self, keys: List[str], host_indices,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Loads the pages of keys into the host pool at host_indices (one
        per token); True for each leading page in place on return."""
        n = len(keys)
        try:
            if self._kv is None:
                return [False] * n
            item = self._item(self._kv, keys, host_indices)
            if item is None:
                return [False] * n
            t0 = time.monotonic()
            got = self._load([item])[0]
            self._record("get", got, got * self._kv.pool.object_bytes, time.monotonic() - t0)
            return _true_prefix(got, n)
        except Exception as e:
            self._warn("get", e, "batch_get_v1 of %d keys failed", n)
            return [False] * n

    def batch_set_v1(self, keys: List[str], host_indices,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Stores the host pool's pages at host_indices under keys; returns
        when the store acknowledged (the rows may change again)."""
        n = len(keys)
        try:
            if self._kv is None:
                return [False] * n
            item = self._item(self._kv, keys, host_indices)
            if item is None:
                return [False] * n
            prefix = getattr(extra_info, "prefix_keys", None) if extra_info else None
            t0 = time.monotonic()
            ok = self._offload([item], prefix_keys=prefix)[0]
            if ok:
                self._record("set", n, n * self._kv.pool.object_bytes, time.monotonic() - t0)
                return [True] * n
            return self._stored_now(self._kv, item.keys)
        except Exception as e:
            self._warn("set", e, "batch_set_v1 of %d keys failed", n)
            return [False] * n

    # ------------------------------------------------------ the v2 path

    @staticmethod
    def _make_result(final: int, hits: dict, restorable: List[int]):
        """A PoolTransferResult of whichever SGLang is loaded: the KV hit and
        the per-pool hits first; a later field about restorable boundaries
        (newer versions list them all) gets the sorted list; any other
        field without a default gets None."""
        args = {}
        for i, f in enumerate(fields(PoolTransferResult)):
            if i == 0:
                args[f.name] = final
            elif i == 1:
                args[f.name] = hits
            elif "restor" in f.name:
                args[f.name] = restorable
            elif f.default is MISSING and f.default_factory is MISSING:
                args[f.name] = None
        return PoolTransferResult(**args)

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None):
        """The longest prefix of keys restorable in the KV pool and every
        pool of pool_transfers by its hit policy; extra_pool_hit_pages has
        each pool's own longest boundary."""
        try:
            kv_pages = self.batch_exists(keys, extra_info)
            hits = {PoolName.KV: kv_pages} if kv_pages else {}
            restorable = set(range(1, kv_pages + 1))
            raw = None
            for t in pool_transfers or []:
                if not restorable:
                    break
                name = _pool_key(t.name)
                if name == _pool_key(PoolName.KV):
                    continue
                view = self._views.get(name)
                pool_ok = set()  # this pool's own restorable boundaries
                if view is not None:
                    if raw is None:
                        raw = [page_key(k) for k in keys[:kv_pages]]
                    lead, present = self._present(view, raw)
                    if t.hit_policy == PoolHitPolicy.TRAILING_PAGES and present is not None:
                        n_tr = max(1, len(t.keys) if t.keys else 1)
                        pool_ok = {b for b in range(1, kv_pages + 1)
                                   if all(i in present for i in range(max(0, b - n_tr), b))}
                    else:  # ALL_PAGES, or no per-page answer: the leading run
                        pool_ok = set(range(1, min(lead, kv_pages) + 1))
                if pool_ok:
                    hits[t.name] = max(pool_ok)
                restorable &= pool_ok
            final = max(restorable) if restorable else 0
            return self._make_result(final, hits, sorted(restorable))
        except Exception as e:
            self._warn("exists", e, "batch_exists_v2 of %d keys failed", len(keys))
            return self._make_result(0, {}, [])

    def _v2_items(self, transfers):
        """(name, n_keys, item or None) per transfer."""
        out = []
        for t in transfers or []:
            keys = t.keys or []
            view = self._views.get(_pool_key(t.name))
            item = self._item(view, keys, t.host_indices) if view is not None else None
            if view is None and keys:
                self._log.warn("pool", "no host pool %r registered", _pool_key(t.name))
            out.append((t.name, len(keys), item))
        return out

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        """Loads each transfer's pages (slots) into its host pool; per pool
        name, True for each leading key in place on return."""
        results: dict = {}
        try:
            parts = self._v2_items(transfers)
            items = [it for _, _, it in parts if it is not None]
            t0 = time.monotonic()
            loaded = iter(self._load(items)) if items else iter(())
            nbytes = pages = 0
            for name, n, item in parts:
                got = next(loaded) if item is not None else 0
                results.setdefault(name, []).extend(_true_prefix(got, n))
                if item is not None:
                    pages += got
                    nbytes += got * item.view.pool.object_bytes
            self._record("get", pages, nbytes, time.monotonic() - t0)
            return results
        except Exception as e:
            self._warn("get", e, "batch_get_v2 failed")
            return {t.name: [False] * len(t.keys or []) for t in transfers or []}

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        """Stores each transfer's pages (slots) from its host pool; per pool
        name, whether each key is stored on return."""
        results: dict = {}
        try:
            parts = self._v2_items(transfers)
            items = [it for _, _, it in parts if it is not None]
            t0 = time.monotonic()
            oks = iter(self._offload(items)) if items else iter(())
            nbytes = pages = 0
            for name, n, item in parts:
                if item is None:
                    res = [False] * n
                elif next(oks):
                    res = [True] * n
                    pages += n
                    nbytes += n * item.view.pool.object_bytes
                else:
                    res = self._stored_now(item.view, item.keys)
                results.setdefault(name, []).extend(res)
            self._record("set", pages, nbytes, time.monotonic() - t0)
            return results
        except Exception as e:
            self._warn("set", e, "batch_set_v2 failed")
            return {t.name: [False] * len(t.keys or []) for t in transfers or []}

    # -------------------------------------------- the generic page path

    def _staging(self, which: str):
        """(view, lock) of the get or set staging pool: a copy of the KV
        host pool's layout, registered under the same namespace."""
        attr = "_stage_get" if which == "get" else "_stage_set"
        st = getattr(self, attr)
        if st is not None:
            return st
        with self._stage_make_lock:
            st = getattr(self, attr)
            if st is None:
                n_pages = max(1, min(128, self.staging_bytes // max(1, self._kv.page_bytes())))
                view = self._kv.mirror(n_pages)
                self._register_view(view, trailing=0)
                st = (view, threading.Lock(), n_pages)
                setattr(self, attr, st)
        return st

    def _stage_rows(self, view: HostPoolView, n: int) -> np.ndarray:
        """kvdock indices of staging pages 0..n-1."""
        if view.pages_as_rows or view.kind == kvdock.SLOT:
            return np.arange(n, dtype=np.int64)
        return np.arange(n * view.page_size, dtype=np.int64)

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None):
        """Flat pages (get_data_page's format) of keys, into
        target_locations where given; None from the first page not
        loaded on."""
        n = len(keys)
        out: List[Any] = [None] * n
        try:
            if self._kv is None or n == 0:
                return out
            view, lock, cap = self._staging("get")
            t0 = time.monotonic()
            done = 0
            with lock:
                while done < n:
                    chunk = list(keys[done:done + cap])
                    item = _Item(view, [page_key(k) for k in chunk],
                                 self._stage_rows(view, len(chunk)))
                    got = self._load([item])[0]
                    for j in range(got):
                        tgt = target_locations[done + j] if target_locations else None
                        out[done + j] = self._flat_from(view, j, tgt)
                    done += got
                    if got < len(chunk):
                        break
            self._record("get", done, done * view.pool.object_bytes, time.monotonic() - t0)
            return out
        except Exception as e:
            self._warn("get", e, "batch_get of %d keys failed", n)
            return out

    def _flat_from(self, view: HostPoolView, page: int, target):
        ps = view.page_size if view.kind == kvdock.PAGED else 1
        parts = [v.reshape(-1) for v in view.page_views(page * ps)]
        if target is None:
            target = torch.empty(sum(p.numel() for p in parts), dtype=parts[0].dtype)
        flat = target.reshape(-1)
        off = 0
        for p in parts:
            flat[off:off + p.numel()].copy_(p)
            off += p.numel()
        return target

    def _flat_to(self, view: HostPoolView, page: int, value) -> bool:
        ps = view.page_size if view.kind == kvdock.PAGED else 1
        dst = view.page_views(page * ps)
        flat = value.reshape(-1)
        if flat.numel() != sum(v.numel() for v in dst):
            return False
        off = 0
        for v in dst:
            v.copy_(flat[off:off + v.numel()].view(v.shape))
            off += v.numel()
        return True

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None):
        return self.batch_get([key], [target_location] if target_location is not None
                              else None)[0]

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Stores flat pages (get_data_page's format) under keys; True when
        every one is stored."""
        n = len(keys)
        try:
            if self._kv is None or values is None or len(values) != n:
                return False
            if n == 0:
                return True
            view, lock, cap = self._staging("set")
            t0 = time.monotonic()
            with lock:
                for s in range(0, n, cap):
                    chunk = list(keys[s:s + cap])
                    for j, val in enumerate(values[s:s + cap]):
                        if not self._flat_to(view, j, val):
                            self._log.warn("set", "a page of %d elements, not %d", val.numel(),
                                           view.page_elems())
                            return False
                    item = _Item(view, [page_key(k) for k in chunk],
                                 self._stage_rows(view, len(chunk)))
                    if not self._offload([item])[0] and not all(
                            self._stored_now(view, item.keys)):
                        return False
            self._record("set", n, n * view.pool.object_bytes, time.monotonic() - t0)
            return True
        except Exception as e:
            self._warn("set", e, "batch_set of %d keys failed", n)
            return False

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    # ---------------------------------------------------------- the rest

    def get_stats(self):
        """StorageMetrics of the calls since the last get_stats (pages per
        batch and GB/s, for loads and stores); SGLang logs them when
        --enable-storage-metrics is on."""
        with self._metrics_lock:
            m, self._metrics = self._metrics, StorageMetrics()
        return m

    def pool_stats(self) -> Dict[str, dict]:
        """libkvdock's counters per registered pool (lookup hits, load and
        offload bytes, failures); {} when the linker is gone."""
        out = {}
        for name, view in self._views.items():
            try:
                out[name] = self.lk.pool_stats(view.pool)
            except KvdockError:
                pass
        return out

    def namespaces(self) -> List[str]:
        return sorted({v.pool.namespace for v in self._views.values() if v.pool is not None})

    def clear(self) -> bool:
        """Drops this backend's namespaces from the daemon (with
        clear_evicts, through kvdock.StoreClient.evict: objects being read
        or written stay) and its local metrics. True when every namespace was
        evicted (or eviction is off)."""
        with self._metrics_lock:
            self._metrics = StorageMetrics()
        if not self.clear_evicts:
            return True
        ok = True
        try:
            client = kvdock.StoreClient(socket_path=self.config.get("socket_path"),
                                        connect=self.config.get("connect"),
                                        auth_token_file=self.config.get("auth_token_file"),
                                        timeout_ms=self.timeout_ms,
                                        client_name="sglang-hicache-clear")
        except kvdock.KvdockError as e:
            logger.warning("kvdock: clear(): cannot reach the daemon: %s", e)
            return False
        with client:
            for ns in self.namespaces():
                try:
                    client.evict(namespace=ns)
                except kvdock.NotFoundError:
                    pass  # nothing was ever stored there
                except kvdock.KvdockError as e:
                    logger.warning("kvdock: clear(): evicting %s failed: %s", ns, e)
                    ok = False
        return ok
