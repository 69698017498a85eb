"""KvdockConnector: kvdock as a vLLM KV connector (v1).

Written against vLLM's main branch, ``vllm/distributed/kv_transfer/
kv_connector/v1/base.py`` at commit 003df2961dd8830c317a61f9745ccd557da9fa06
(KVConnectorBase_V1 built as ``(vllm_config, role, kv_cache_config)``,
``get_num_new_matched_tokens`` returning ``(num_tokens, load_async)``,
``SupportsHMA.request_finished_all_groups``, ``get_block_ids_with_load_errors``,
``handle_preemptions``) and its ``kv_connector/factory.py`` (a class not
registered by name is ``getattr(import_module(kv_connector_module_path),
kv_connector)``, built with kv_cache_config when its ``__init__`` takes one).
Without vLLM installed, the base classes come from ``_base.py``, which
restates them at that commit.

Loaded with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvdockConnector",
        "kv_connector_module_path": "kvdock.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"kvdock_socket": "/run/kvdock/kvdockd.sock"}}'

vLLM builds the class twice: once in the scheduler process (role SCHEDULER)
and once in every worker process (role WORKER). They share nothing but the
metadata the scheduler side builds each step.

How vLLM's notions map onto kvdock's
------------------------------------
* A kvdock page is one vLLM block (``block_size`` tokens). Page keys are
  kvdock's SGLang-compatible chain (``kvdock.page_keys``) over the request's
  token ids per ``block_size`` tokens, so a key names the whole prefix up to
  the end of its block; a request with a LoRA adapter, a cache salt or
  multimodal inputs starts its chain from a digest of them (chain_anchor),
  and prompts given as embeddings are neither stored nor restored.
* Each KV cache group of ``kv_cache_config`` is one kvdock pool: full
  attention (and MLA) ``kv<g>`` (hit policy ALL_PAGES; MLA rank-replicated),
  sliding window ``swa<g>`` (TRAILING_PAGES of the window), mamba
  ``mamba<g>`` (slot-addressed, one state per block id, TRAILING_PAGES(1)).
  A pool's namespace is ``<model_id>/<pool>/tp<r>`` (``rep`` for MLA, and
  ``.cp<r>`` / ``.pp<r>`` suffixes as the linker names them).
* A worker registers each layer's cache as the rows of its pool. A
  paged KV buffer is a per-layer tensor of blocks in one of vLLM's layouts
  ([2, num_blocks, ...] with K and V apart, [num_blocks, ...] with a block's
  K and V together, MLA [num_blocks, block_size, dim], HND memory seen as
  NHD, a view over kernel blocks smaller than the manager's block, HMA pages
  shared with mamba state and padded): the connector finds the block
  dimension, checks that each block is one dense run of bytes, and
  registers rows = token slots (block b's rows are b*block_size ..
  (b+1)*block_size-1) when blocks lie back to back, rows = the tensor's
  (kernel) blocks otherwise. Either way a page is exactly block b's bytes, layer by layer.
  A mamba layer's states (a list of tensors [num_blocks, ...]) are the
  buffers of a slot-addressed pool whose slot is the block id.

Loads (scheduler side, then worker side)
----------------------------------------
``get_num_new_matched_tokens`` asks the store (libkvdock's store client, or
read-only linkers with lookup-only pools: ``kvdock_lookup``) for every
restorable boundary of the request's uncached tail, in the namespaces of
every TP/PP rank at once (a hit every rank can load),
probing at most ``(num_tokens - 1) // block_size`` pages (a request keeps
one token to forward) and only boundaries on the alignment of all groups.
With a mamba group the mamba pool is part of the lookup (TRAILING_PAGES(1)),
so a boundary without its recurrent state is never claimed: restored KV
without the matching state is unusable, and vLLM's align-mode cache expects
the state in the block that ends the hit. ``update_state_after_alloc``
records which blocks of each group receive which pages; the block that ends
a hit in a mamba group (index hit_pages - 1, where vLLM's mamba manager puts
the state of an externally computed prefix) receives the state; a load whose
blocks are not there (a null block) is sent as unrestorable and reported as
failed, never served.

The worker LOADs (pins), PREPAREs and COMMITs each request's transfers in
``start_load_kv``, then starts layer-wise loading; ``wait_for_layer_load``
waits per layer (a failure is recorded, never raised through the forward
pass). vLLM's mamba layers do not call ``wait_for_layer_load``, so the
mamba layers of a batch are waited for in ``start_load_kv``. At the end of
the step (``get_finished`` / ``get_block_ids_with_load_errors``) each load's
completion decides: a load that failed (objects evicted between the
scheduler's lookup and the worker's LOAD, the daemon gone, a copy failed)
has every block it was writing reported by ``get_block_ids_with_load_errors``
in that same step, so vLLM recomputes them. With ``kvdock_load_async`` the
hit is loaded between steps instead (``load_async`` True; the request is
reported in ``get_finished``'s receiving set, its failed blocks in the same
pass).

vLLM at the commit above recovers failed blocks of a single KV cache group
only (its ``_update_requests_with_invalid_blocks`` unpacks one group and
raises for more). A load can always fail, so for a model of several groups
the connector claims no hit (and still stores) unless the installed vLLM's
scheduler source shows a recovery of every group, or
``kvdock_multi_group_loads`` says so; it then reports the failed blocks of
every group.

The blocks of a load or an offload go back to vLLM only once the linker's
completion for it came (``kvdock.engine.Completions``; each wait bounded by
``completion_bound_s(kvdock_timeout_ms)``, past which libkvdock broke its
bound); a failed ``start_layer_wise_loading`` is tried again.

Saves
-----
The scheduler side puts, per step, each request's blocks that became full
in that step in the metadata (keys, depth in the chain, block ids per group,
and for a mamba group the state block when the step ended on a block
boundary). The worker offloads them in ``wait_for_save``, after the forward
pass wrote them: full-attention pages asynchronously (the request owns its
blocks; a finished request's blocks are kept until ``get_finished`` reports
its saves done), sliding-window and mamba pages waited for there (vLLM
frees those blocks while the request runs). ``handle_preemptions`` waits for
the saves of preempted requests before their blocks are reused.

kv_connector_extra_config keys
------------------------------
``kvdock_socket`` (daemon's Unix socket; default $KVDOCK_SOCKET, else the
library's default), ``kvdock_connect`` ("HOST:PORT" instead of a socket),
``kvdock_auth_token_file``, ``kvdock_transport``, ``kvdock_model_id``
(default: derived from the model, dtypes, TP/PP sizes and the KV cache
groups' specs, the same in every process), ``kvdock_timeout_ms`` (the
linker's bound on every call, default 5000), ``kvdock_lookup_timeout_ms``
(the bound on a scheduler lookup, default 1000), ``kvdock_multi_group_loads``
(loads for a model of several KV cache groups; default: whether the
installed vLLM recovers every group), ``kvdock_load_async`` (default false),
``kvdock_layer_group_size``, ``kvdock_lookup`` (how the scheduler asks the
store: "store" through libkvdock's store client, by namespace name; "linker"
through read-only linkers, one per TP rank, whose lookup-only pools take the
object sizes of kv_cache_config; "auto", the default: the store client where
the library has one; lookups by name go at most 16 namespaces and the
daemon's batch of keys a call; while the store fails they pause 1 s, 2 s,
... at most 30 s), and for tests and tools without vLLM's parallel state
``kvdock_tp_rank`` / ``kvdock_pp_rank``.
"""

import hashlib
import inspect
import itertools
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field

import numpy as np

from .. import engine
from ..buffers import int64_array
from ._base import HAVE_VLLM, KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, SupportsHMA

logger = logging.getLogger("kvdock.vllm")

VLLM_BASE_COMMIT = "003df2961dd8830c317a61f9745ccd557da9fa06"

# vLLM's block pool keeps block 0 as its null block: a placeholder in a
# group's block list (skipped sliding-window blocks, mamba blocks between
# states) that holds nothing.
NULL_BLOCK_ID = 0

_KINDS_UNSUPPORTED = ("ChunkedLocal", "CrossAttention", "EncoderOnly")


def _kvdock():
    import kvdock  # the core binding (its library is loaded at the first call into it)

    return kvdock


def _load_library():
    """libkvdock, loaded now: a connector without it fails when vLLM
    builds it, not at the first request."""
    try:
        _kvdock()._lib.lib()
    except OSError as e:
        raise RuntimeError("kvdock: the vLLM connector needs libkvdock (the library of the "
                           "kvdock package; set KVDOCK_LIBRARY to its path): %s" % e) from e


# ------------------------------------------- vLLM's recovery of failed loads

# vLLM's scheduler recovers a failed load in _update_requests_with_invalid_blocks;
# at the commit above it unpacks the block ids of one KV cache group there
# (``(req_block_ids,) = self.kv_cache_manager.get_block_ids(req_id)``),
# which raises for a model of more groups.
_ONE_GROUP_RECOVERY = (
    re.compile(r"\(\s*\w+\s*,\s*\)\s*=\s*self\.kv_cache_manager\.get_block_ids\("),
    re.compile(r"self\.kv_cache_manager\.get_block_ids\([^)]*\)\s*\[\s*0\s*\]"),
)


def scheduler_recovery_source():
    """The source of the installed vLLM's _update_requests_with_invalid_blocks:
    None when vLLM or its source cannot be read, "" when its scheduler has
    no such method (no recovery of failed loads at all)."""
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except Exception:  # no vLLM here, or one that fails to import
        return None
    fn = getattr(Scheduler, "_update_requests_with_invalid_blocks", None)
    if fn is None:
        return ""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return None


def recovers_every_group(source):
    """(whether a vLLM scheduler of this recovery source recomputes failed
    blocks of every KV cache group, why not)."""
    if source is None:
        return False, ("no vLLM scheduler whose source can be read: taken to recover failed "
                       "loads of one group only")
    if not source:
        return False, "the installed vLLM's scheduler recovers no failed load"
    if any(p.search(source) for p in _ONE_GROUP_RECOVERY):
        return False, ("the installed vLLM's _update_requests_with_invalid_blocks recovers one KV "
                       "cache group only")
    return True, ""


def multi_group_loads(extra, n_groups, source=None):
    """Why loads are off for this model (None: they are on). A load can
    always fail (its pages evicted between the lookup and the LOAD), and a
    vLLM that recovers one group only raises on a failed load of a model
    of more: loads of such a model are off unless kv_connector_extra_config
    says ``kvdock_multi_group_loads`` (for a vLLM that recovers them all).
    source: the scheduler's recovery source (None: read the installed
    vLLM's)."""
    if n_groups <= 1:
        return None
    override = extra.get("kvdock_multi_group_loads")
    if override is not None:
        return None if _as_bool(override) else "kvdock_multi_group_loads is false"
    ok, why = recovers_every_group(source if source is not None else scheduler_recovery_source())
    return None if ok else why


# ---------------------------------------------------------------- config


def _extra_config(vllm_config):
    ktc = getattr(vllm_config, "kv_transfer_config", None)
    extra = getattr(ktc, "kv_connector_extra_config", None) if ktc is not None else None
    return dict(extra or {})


def _as_bool(value):
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _cdiv(a, b):
    return -(-a // b)


@dataclass(frozen=True)
class GroupPlan:
    """One KV cache group of vLLM and the kvdock pool it becomes."""

    index: int
    kind: str  # "kv", "swa", "mamba" or "unsupported"
    block_size: int
    trailing_pages: int  # 0: ALL_PAGES; n: TRAILING_PAGES(n)
    rank_replicated: bool
    layer_names: tuple  # () when the config names none: every layer
    spec_repr: str
    mamba_cache_mode: str = ""
    object_bytes: int = 0  # one stored object (a page of every layer); 0: unknown

    @property
    def pool_name(self):
        return "%s%d" % (self.kind, self.index)

    @property
    def paged(self):
        return self.kind in ("kv", "swa")


def _dtype_size(dtype):
    try:
        import torch

        if isinstance(dtype, torch.dtype):
            return torch.empty(0, dtype=dtype).element_size()
    except ImportError:
        pass
    return np.dtype(dtype).itemsize


def spec_page_bytes(spec):
    """The bytes one block of one layer holds in a spec's cache, padding
    left out (what the worker registers of it); 0 when the spec says not."""
    if hasattr(spec, "shapes") and hasattr(spec, "dtypes"):
        return sum(int(np.prod(shape)) * _dtype_size(dt)
                   for shape, dt in zip(spec.shapes, spec.dtypes))
    for attr in ("real_page_size_bytes", "page_size_bytes"):
        try:
            value = getattr(spec, attr)
        except Exception:  # a property a partial spec cannot answer
            continue
        if value:
            return int(value)
    return 0


def plan_groups(vllm_config, kv_cache_config):
    """The GroupPlan of every KV cache group (one "kv0" group of every
    layer when kv_cache_config names no groups)."""
    cache = getattr(vllm_config, "cache_config", None)
    model = getattr(vllm_config, "model_config", None)
    use_mla = bool(getattr(model, "use_mla", False))
    default_bs = int(getattr(cache, "block_size", 16) or 16)
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if not groups:
        return [GroupPlan(0, "kv", default_bs, 0, use_mla, (), "default")]
    plans = []
    for i, group in enumerate(groups):
        spec = group.kv_cache_spec
        name = type(spec).__name__
        bs = int(getattr(spec, "block_size", default_bs))
        names = tuple(getattr(group, "layer_names", ()) or ())
        rep = use_mla or "MLA" in name
        obj = spec_page_bytes(spec) * len(names)
        if hasattr(spec, "shapes") and hasattr(spec, "dtypes") or "Mamba" in name:
            mode = (getattr(spec, "mamba_cache_mode", None)
                    or getattr(cache, "mamba_cache_mode", None))
            plans.append(GroupPlan(i, "mamba", bs, 1, False, names, repr(spec), str(mode or "none"),
                                   obj))
        elif "SlidingWindow" in name:
            window = int(getattr(spec, "sliding_window", 0) or 0)
            trailing = max(1, _cdiv(max(window - 1, 1), bs))
            plans.append(GroupPlan(i, "swa", bs, trailing, rep, names, repr(spec), "", obj))
        elif any(k in name for k in _KINDS_UNSUPPORTED):
            plans.append(GroupPlan(i, "unsupported", bs, 0, False, names, repr(spec)))
        else:
            plans.append(GroupPlan(i, "kv", bs, 0, rep, names, repr(spec), "", obj))
    return plans


def restore_problem(plans):
    """Why these groups cannot be restored from kvdock (None when they
    can): a group kind kvdock does not store, groups of different block
    sizes (one key chain serves every group), or a mamba group whose cache
    mode keeps no state per block."""
    if any(p.kind == "unsupported" for p in plans):
        return "a KV cache group kvdock does not store (%s)" % ", ".join(
            p.spec_repr.split("(")[0] for p in plans if p.kind == "unsupported")
    if len({p.block_size for p in plans}) != 1:
        return "KV cache groups of different block sizes %s" % sorted({p.block_size for p in plans})
    for p in plans:
        if p.kind == "mamba" and p.mamba_cache_mode not in ("align", "all"):
            return ("mamba cache mode %r keeps no state per block (use "
                    "--mamba-cache-mode align)" % p.mamba_cache_mode)
    return None


def default_model_id(vllm_config, plans):
    """A model id the scheduler and every worker derive alike: the model's
    short name and a digest of what fixes the stored bytes (model, dtypes,
    parallel sizes, every KV cache group's spec)."""
    model = getattr(vllm_config, "model_config", None)
    cache = getattr(vllm_config, "cache_config", None)
    par = getattr(vllm_config, "parallel_config", None)
    name = str(getattr(model, "model", "model") or "model")
    parts = [
        name, str(getattr(model, "dtype", "")), str(getattr(cache, "cache_dtype", "")),
        "tp%s" % getattr(par, "tensor_parallel_size", 1),
        "pp%s" % getattr(par, "pipeline_parallel_size", 1),
    ] + ["%d:%s:%d:%s" % (p.index, p.kind, p.block_size, p.spec_repr) for p in plans]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    short = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(name.rstrip("/")) or "model")[:48]
    return "vllm.%s.%s" % (short, digest)


def namespace_name(model_id, pool_name, tp_rank=0, rank_replicated=False, cp_rank=0, cp_size=1,
                   pp_rank=0, pp_size=1):
    """The namespace the linker registers for a pool (its ns_name_of):
    ``model/pool/tp<r>`` or ``model/pool/rep``, then ``.cp<r>`` when
    cp_size > 1 and ``.pp<r>`` when pp_size > 1."""
    suffix = "rep" if rank_replicated else "tp%d" % tp_rank
    if cp_size > 1:
        suffix += ".cp%d" % cp_rank
    if pp_size > 1:
        suffix += ".pp%d" % pp_rank
    return "%s/%s/%s" % (model_id, pool_name, suffix)


class _Settings:
    """What both roles read from vllm_config."""

    def __init__(self, vllm_config, kv_cache_config):
        extra = _extra_config(vllm_config)
        ktc = vllm_config.kv_transfer_config
        par = getattr(vllm_config, "parallel_config", None)
        self.plans = plan_groups(vllm_config, kv_cache_config)
        self.problem = restore_problem(self.plans)
        self.block_size = self.plans[0].block_size
        self.alignment = 1
        for p in self.plans:
            self.alignment = self.alignment * p.block_size // math.gcd(self.alignment, p.block_size)
        self.model_id = str(extra.get("kvdock_model_id")
                            or default_model_id(vllm_config, self.plans))
        self.socket_path = extra.get("kvdock_socket") or os.environ.get("KVDOCK_SOCKET") or None
        self.connect = extra.get("kvdock_connect") or None
        self.auth_token_file = extra.get("kvdock_auth_token_file") or None
        self.transport = extra.get("kvdock_transport") or None
        self.timeout_ms = int(extra.get("kvdock_timeout_ms", 5000))
        # the scheduler's lookups: a hung daemon stalls the scheduler this long at most
        self.lookup_timeout_ms = int(extra.get("kvdock_lookup_timeout_ms", 1000))
        self.extra = extra
        self.load_async = _as_bool(extra.get("kvdock_load_async", False))
        self.layer_group_size = int(extra.get("kvdock_layer_group_size", 0))
        self.lookup_via = str(extra.get("kvdock_lookup", "auto"))  # "auto", "store", "linker"
        self.tp_size = int(getattr(par, "tensor_parallel_size", 1) or 1)
        self.pp_size = int(getattr(par, "pipeline_parallel_size", 1) or 1)
        self.tp_rank_override = extra.get("kvdock_tp_rank")
        self.pp_rank_override = extra.get("kvdock_pp_rank")
        role = getattr(ktc, "kv_role", "kv_both")
        producer = getattr(ktc, "is_kv_producer", None)
        consumer = getattr(ktc, "is_kv_consumer", None)
        self.stores = bool(producer) if producer is not None else role in ("kv_both", "kv_producer")
        self.loads = bool(consumer) if consumer is not None else role in ("kv_both", "kv_consumer")
        # a wait for one completion: past it libkvdock broke its own bound
        self.wait_s = engine.completion_bound_s(self.timeout_ms)

    def all_namespaces(self, plan):
        """The namespaces of one pool on every TP and PP rank."""
        tps = [0] if plan.rank_replicated else range(self.tp_size)
        return [namespace_name(self.model_id, plan.pool_name, tp, plan.rank_replicated,
                               pp_rank=pp, pp_size=self.pp_size)
                for pp in range(self.pp_size) for tp in tps]


# -------------------------------------------------------------- metadata


@dataclass
class PoolPart:
    """Pages of one group of one request: keys[i] is the page first_page + i
    (or, for a mamba group, the page that ends the state's node), held by
    block_ids[i]."""

    group: int
    first_page: int
    keys: list
    block_ids: list
    prior_key: bytes = None


@dataclass
class LoadSpec:
    req_id: str
    parts: list  # PoolPart per group (loads: one per group)
    block_ids: list  # every block the load writes: reported when it fails
    restorable: bool = True
    why: str = ""


@dataclass
class StoreSpec:
    req_id: str
    parts: list  # PoolPart, one per run of consecutive pages


@dataclass
class KvdockConnectorMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)
    stores: list = field(default_factory=list)
    preempted: set = field(default_factory=set)


# ------------------------------------------------------------ helpers


def _block_ids_of(blocks):
    """KVCacheBlocks (or a tuple of lists) as one list of block ids per
    group."""
    if blocks is None:
        return None
    get = getattr(blocks, "get_block_ids", None)
    ids = get() if callable(get) else blocks
    return [list(g) for g in ids]


def _tokens(request, end):
    ids = getattr(request, "all_token_ids", None)
    if ids is None:
        ids = getattr(request, "prompt_token_ids", None) or []
    return list(ids[:end])


def _num_tokens(request):
    n = getattr(request, "num_tokens", None)
    if n is None:
        ids = getattr(request, "all_token_ids", None) or getattr(request, "prompt_token_ids", [])
        n = len(ids)
    return int(n)


def chain_anchor(request):
    """The digest a request's key chain starts from: None (the plain
    SGLang-compatible chain) for a request of token ids alone; for one whose
    KV also depends on something else — a LoRA adapter, a cache salt,
    multimodal inputs (identified by vLLM's hashes of them) — a digest of
    that, so its pages never meet those of the same tokens without it."""
    parts = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        parts.append("lora:%s:%s" % (getattr(lora, "lora_name", ""),
                                     getattr(lora, "lora_int_id", "")))
    salt = getattr(request, "cache_salt", None)
    if salt:
        parts.append("salt:%s" % salt)
    for f in getattr(request, "mm_features", None) or ():
        parts.append("mm:%s" % getattr(f, "identifier", f))
    if not parts:
        return None
    # a string, not a page key: kvdock's one key policy hashes it (SHA-256)
    return engine.page_key("kvdock.vllm\n" + "\n".join(parts))


def cacheable(request):
    """Whether a request's KV follows from its token ids (and its anchor):
    not for prompts given as embeddings."""
    return getattr(request, "prompt_embeds", None) is None


class _Chain:
    """The page keys of one request, computed as far as needed."""

    def __init__(self, block_size, anchor=None):
        self.block_size = block_size
        self.anchor = anchor
        self.keys = []

    def upto(self, request, n_pages):
        if n_pages > len(self.keys):
            start = len(self.keys)
            toks = _tokens(request, n_pages * self.block_size)[start * self.block_size:]
            if len(toks) < (n_pages - start) * self.block_size:
                n_pages = start + len(toks) // self.block_size
                toks = toks[:(n_pages - start) * self.block_size]
            if n_pages > start:
                prior = self.keys[-1] if self.keys else self.anchor
                self.keys.extend(_kvdock().page_keys(np.asarray(toks, dtype=np.uint32),
                                                     self.block_size, prior=prior))
        return self.keys[:n_pages]


# ====================================================== scheduler side


class _ReqState:
    def __init__(self, request, block_size):
        self.request = request
        self.chain = _Chain(block_size, chain_anchor(request))
        self.cacheable = cacheable(request)
        self.block_ids = None  # one list per group
        self.next_store_page = 0
        self.lookup = None  # (num_local_computed_tokens, hit tokens)
        self.stored = False


class _StoreView:
    """Lookups through libkvdock's store client, by namespace name: at most
    KVD_MAX_POOLS namespaces a call (every rank's namespaces in as few
    calls as that allows, their boundaries intersected) and at most the
    daemon's batch of keys (its --max-batch, from its Hello; on a
    TOO_LARGE, as from a daemon restarted with a smaller one, asked
    again). The client stays open: its handle opens its connection again
    by itself after the daemon closed it."""

    MAX_KEYS = 4096  # kvdockd's default --max-batch, until the daemon says

    def __init__(self, settings, namespaces, trailing, log):
        kv = _kvdock()
        self.namespaces, self.trailing, self.log = namespaces, trailing, log
        self.max_ns = kv._lib.KVD_MAX_POOLS
        self.client = kv.StoreClient(socket_path=settings.socket_path, connect=settings.connect,
                                     auth_token_file=settings.auth_token_file,
                                     timeout_ms=settings.lookup_timeout_ms,
                                     client_name="vllm-scheduler")
        self.max_keys = self._daemon_batch() or self.MAX_KEYS

    def lookup(self, keys):
        common = None
        for i in range(0, len(self.namespaces), self.max_ns):
            got = self._lookup(self.namespaces[i:i + self.max_ns],
                               self.trailing[i:i + self.max_ns], keys)
            common = set(got) if common is None else common & set(got)
            if not common:
                return []
        return sorted(common or ())

    def _lookup(self, namespaces, trailing, keys):
        kv = _kvdock()
        for _ in range(32):  # each turn halves the keys: bounded
            probe = keys[:self.max_keys]
            try:
                res = self.client.lookup(namespaces, probe, trailing=trailing)
            except kv.NotFoundError:
                return []  # a namespace no worker registered yet: nothing stored
            except kv.TooLargeError as e:
                if len(probe) <= 1:
                    self.log.error("too-large", "a lookup of one key is too large: %s", e)
                    return []
                # the daemon's batch is smaller: its Hello says (else halved)
                n = self._daemon_batch() or len(probe) // 2
                self.max_keys = max(1, min(len(probe) - 1, n))
                continue
            except kv.InvalidError as e:
                # the lookup itself is wrong (a bug): no hit, the store is fine
                self.log.error("invalid", "lookup refused as invalid: %s", e)
                return []
            return list(res.get("boundaries", []) if isinstance(res, dict) else res)
        return []

    def _daemon_batch(self):
        try:
            return self.client.limits()["max_batch"]
        except (_kvdock().KvdockError, AttributeError):
            return 0  # an older library, or no daemon now

    def close(self):
        self.client.close()


class _LinkerView:
    """Lookups through read-only linkers, one per TP rank, each with a
    lookup-only pool per group: a pool's namespace is fixed by its name and
    object size, which the scheduler knows from kv_cache_config (the
    workers register the same). The pools' one row of memory is reserved,
    never written (a read-only linker loads nothing)."""

    def __init__(self, settings):
        kv = _kvdock()
        if settings.pp_size > 1:
            raise kv.UnsupportedError(message="lookups of several pipeline stages need the "
                                      "store client (their object sizes differ)")
        unknown = [p.pool_name for p in settings.plans if not p.object_bytes]
        if unknown:
            raise kv.UnsupportedError(message="no object size known for %s" % ", ".join(unknown))
        self.linkers = []  # (linker, [pool, ...])
        self.rids = itertools.count(1)
        self.row = np.empty(max(p.object_bytes for p in settings.plans), dtype=np.uint8)
        try:
            for tp in range(settings.tp_size):
                lk = kv.Linker(socket_path=settings.socket_path, connect=settings.connect,
                               client_name="vllm-scheduler-tp%d" % tp, model_id=settings.model_id,
                               tp_rank=tp, tp_size=settings.tp_size,
                               timeout_ms=settings.lookup_timeout_ms, lazy_pool_mapping=True,
                               read_only=True, transport=settings.transport,
                               auth_token_file=settings.auth_token_file)
                self.linkers.append((lk, []))
                for plan in settings.plans:
                    if plan.rank_replicated and tp > 0:
                        continue  # one namespace for every rank
                    buf = kv.RawBuffer(self.row.ctypes.data, n_rows=1,
                                       bytes_per_row=plan.object_bytes, owner=self.row)
                    pool = lk.register_pool(plan.pool_name, {0: [buf]},
                                            addressing="paged" if plan.paged else "slot",
                                            page_size=1, n_rows=1,
                                            trailing_pages=plan.trailing_pages,
                                            rank_replicated=plan.rank_replicated)
                    self.linkers[-1][1].append(pool)
        except BaseException:
            self.close()
            raise

    def lookup(self, keys):
        kv = _kvdock()
        common = None
        for lk, pools in self.linkers:
            got = set(lk.lookup(next(self.rids), [kv.Transfer(p, keys) for p in pools]))
            common = got if common is None else common & got
            if not common:
                return []
        return sorted(common or ())

    def close(self):
        for lk, _ in self.linkers:
            lk.close()
        self.linkers = []


class _SchedulerSide:
    """Lookups against the store, the blocks each load and save touches."""

    # while the store fails, lookups claim no hit and ask it again after
    # BACKOFF_MIN_S, twice as long after each failure, at most BACKOFF_MAX_S
    BACKOFF_MIN_S = 1.0
    BACKOFF_MAX_S = 30.0

    def __init__(self, settings, recovery_source=None):
        self.s = settings
        self.log = engine.RateLimitedLog(logger)
        self.reqs = {}
        self.loads = []
        self.view = None
        self.retry_at = 0.0
        self.backoff = 0.0
        self.failed_lookups = 0
        self.views_opened = 0
        if settings.problem:
            logger.warning("kvdock: nothing is restored or stored for this model: %s",
                           settings.problem)
        # loads of a model of several KV cache groups only where vLLM recovers them
        self.no_loads = None if settings.problem or not settings.loads else \
            multi_group_loads(settings.extra, len(settings.plans), recovery_source)
        if self.no_loads:
            logger.warning("kvdock: %d KV cache groups (%s): nothing is loaded, pages are still "
                           "stored: %s (set kvdock_multi_group_loads for a vLLM that recovers "
                           "failed loads of every group)", len(settings.plans),
                           ", ".join(p.pool_name for p in settings.plans), self.no_loads)
        self.namespaces = [ns for p in settings.plans for ns in settings.all_namespaces(p)]
        self.trailing = [p.trailing_pages for p in settings.plans
                         for _ in settings.all_namespaces(p)]

    def state(self, request):
        st = self.reqs.get(request.request_id)
        if st is None:
            st = self.reqs[request.request_id] = _ReqState(request, self.s.block_size)
        st.request = request
        return st

    # -- the store
    def _view(self):
        if self.view is None:
            from kvdock import _lib

            via = self.s.lookup_via
            self.views_opened += 1
            if via == "store" or via == "auto" and _lib.has("kvd_store_open"):
                self.view = _StoreView(self.s, self.namespaces, self.trailing, self.log)
            else:
                self.view = _LinkerView(self.s)
        return self.view

    def lookup(self, keys):
        """Every boundary (pages from keys[0]) restorable on every rank;
        [] when the store cannot say (and, while it keeps failing, not
        asked again for 1 s, 2 s, 4 s ... 30 s). The view stays open."""
        kv = _kvdock()
        now = time.monotonic()
        if now < self.retry_at:
            return []
        try:
            got = self._view().lookup(keys)
        except kv.KvdockError as e:
            self.failed_lookups += 1
            self.backoff = min(self.BACKOFF_MAX_S, max(self.BACKOFF_MIN_S, 2 * self.backoff))
            self.retry_at = time.monotonic() + self.backoff
            if isinstance(e, engine.TRANSIENT):
                self.log.warn("lookup", "lookup failed, no hit claimed for %.0f s: %s",
                              self.backoff, e)
            else:
                self.log.error("lookup", "lookup failed, no hit claimed for %.0f s: %s",
                               self.backoff, e)
            return []
        self.backoff = 0.0
        return got

    def close(self):
        if self.view is not None:
            try:
                self.view.close()
            except Exception:  # closing a broken connection: nothing to save
                pass
            self.view = None

    # -- vLLM's calls
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if self.s.problem or not self.s.loads or self.no_loads:
            return 0, False
        bs = self.s.block_size
        st = self.state(request)
        st.lookup = None
        if num_computed_tokens % bs or not st.cacheable:
            return 0, False
        start = num_computed_tokens // bs
        max_pages = (_num_tokens(request) - 1) // bs  # keep a token to forward
        if max_pages <= start:
            return 0, False
        keys = st.chain.upto(request, max_pages)[start:]
        if not keys:
            return 0, False
        best = 0
        for b in self.lookup(keys):
            if 0 < b <= len(keys) and ((start + b) * bs) % self.s.alignment == 0:
                best = max(best, b)
        if best == 0:
            return 0, False
        st.lookup = (num_computed_tokens, best * bs)
        return best * bs, self.s.load_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        st = self.state(request)
        ids = _block_ids_of(blocks)
        if ids is not None:
            st.block_ids = ids
        if num_external_tokens <= 0:
            return
        local = st.lookup[0] if st.lookup else int(getattr(request, "num_computed_tokens", 0))
        st.lookup = None
        self.loads.append(self._load_spec(st, local, num_external_tokens))

    def _load_spec(self, st, local, n_external):
        bs = self.s.block_size
        start, end = local // bs, (local + n_external) // bs
        keys = st.chain.upto(st.request, end)
        spec = LoadSpec(st.request.request_id, [], [])
        ids = st.block_ids or []

        def fail(why):
            spec.restorable, spec.why = False, why

        if len(keys) < end or (local + n_external) % bs or local % bs:
            fail("the hit does not end on a block, or its tokens are not known")
            spec.block_ids = sorted({b for g in ids for b in g[start:end + 1]
                                     if b != NULL_BLOCK_ID})
            return spec
        for plan in self.s.plans:
            g = ids[plan.index] if plan.index < len(ids) else []
            if plan.kind == "mamba":
                bid = g[end - 1] if end - 1 < len(g) else NULL_BLOCK_ID
                if bid == NULL_BLOCK_ID:
                    fail("no block for the mamba state of group %d" % plan.index)
                    continue
                spec.parts.append(PoolPart(plan.index, end - 1, [keys[end - 1]], [bid]))
                spec.block_ids.append(bid)
                continue
            first = start if plan.kind == "kv" else max(start, end - plan.trailing_pages)
            pages = g[first:end]
            spec.block_ids.extend(b for b in g[start:end] if b != NULL_BLOCK_ID)
            if len(pages) != end - first or NULL_BLOCK_ID in pages:
                fail("group %d lacks blocks for pages %d..%d" % (plan.index, first, end - 1))
                continue
            spec.parts.append(PoolPart(plan.index, first, keys[first:end], list(pages)))
        st.next_store_page = max(st.next_store_page, end)  # those pages are stored already
        return spec

    def build_connector_meta(self, scheduler_output):
        meta = KvdockConnectorMetadata(loads=self.loads)
        self.loads = []
        meta.preempted = set(getattr(scheduler_output, "preempted_req_ids", None) or ())
        n_sched = getattr(scheduler_output, "num_scheduled_tokens", {}) or {}
        for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
            st = self.reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = [list(g) for g in new.block_ids]
            self._plan_store(meta, st, new.num_computed_tokens + n_sched.get(new.req_id, 0))
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is not None:
            resumed = getattr(cached, "resumed_req_ids", None)
            flags = getattr(cached, "resumed_from_preemption", None)  # older vLLM
            for i, req_id in enumerate(cached.req_ids):
                st = self.reqs.get(req_id)
                if st is None:
                    continue
                new_ids = cached.new_block_ids[i]
                if resumed is not None:
                    was_resumed = req_id in resumed
                else:
                    was_resumed = bool(flags and flags[i])
                if was_resumed and new_ids is not None:
                    st.block_ids = [list(g) for g in new_ids]
                elif new_ids is not None:
                    if st.block_ids is None:
                        st.block_ids = [[] for _ in new_ids]
                    for g, extra in enumerate(new_ids):
                        st.block_ids[g].extend(extra)
                self._plan_store(meta, st, cached.num_computed_tokens[i] + n_sched.get(req_id, 0))
        return meta

    def _plan_store(self, meta, st, total):
        """Puts in meta the pages of st that become full with this step's
        tokens (total computed after it)."""
        if self.s.problem or not self.s.stores or st.block_ids is None or not st.cacheable:
            return
        bs = self.s.block_size
        total = min(total, _num_tokens(st.request))
        n_full = total // bs
        if n_full <= st.next_store_page:
            return
        keys = st.chain.upto(st.request, n_full)
        if len(keys) < n_full:
            return
        spec = StoreSpec(st.request.request_id, [])
        for plan in self.s.plans:
            ids = st.block_ids[plan.index] if plan.index < len(st.block_ids) else []
            if plan.kind == "mamba":
                # the state that ends this step, where it ends a block
                on_block = total == n_full * bs and n_full - 1 < len(ids)
                if on_block and ids[n_full - 1] != NULL_BLOCK_ID:
                    p = n_full - 1
                    spec.parts.append(PoolPart(plan.index, p, [keys[p]], [ids[p]],
                                               keys[p - 1] if p > 0 else None))
                continue
            run = []
            for p in range(st.next_store_page, n_full):
                bid = ids[p] if p < len(ids) else NULL_BLOCK_ID
                if bid != NULL_BLOCK_ID:
                    run.append((p, bid))
                if run and (bid == NULL_BLOCK_ID or p == n_full - 1):
                    first = run[0][0]
                    spec.parts.append(PoolPart(plan.index, first,
                                               keys[first:first + len(run)], [b for _, b in run],
                                               keys[first - 1] if first > 0 else None))
                    run = []
        st.next_store_page = n_full
        if spec.parts:
            meta.stores.append(spec)
            st.stored = True

    def request_finished(self, request, block_ids):
        st = self.reqs.pop(request.request_id, None)
        return bool(st is not None and st.stored), None


# ========================================================= worker side


def _layer_order_key(name):
    return tuple(int(x) for x in re.findall(r"\d+", name)), name


def _memory_of(t):
    if t.device.type == "cpu":
        return "host"
    if t.device.type == "cuda":
        import torch

        return "hip" if getattr(torch.version, "hip", None) else "cuda"
    return t.device.type


def _dense_block(v):
    """Whether every v[b] is one dense run of bytes (in any dim order)."""
    dims = sorted((st, sz) for st, sz in zip(v.stride()[1:], v.shape[1:]) if sz != 1)
    expect = 1
    for st, sz in dims:
        if st != expect:
            return False
        expect *= sz
    return True


def block_views(t, num_blocks):
    """The tensors of one layer's paged cache whose dim 0 is the block
    (each block one dense run of bytes): [t] or its K and V halves."""
    shape = tuple(t.shape)
    if len(shape) >= 2 and shape[0] >= num_blocks:
        views = [t]
    elif len(shape) >= 3 and shape[0] == 2 and shape[1] >= num_blocks:
        moved = t.movedim(1, 0)
        views = [moved] if _dense_block(moved) else [t[0], t[1]]
    else:
        raise ValueError("a KV cache of shape %s has no dimension of %d blocks"
                         % (shape, num_blocks))
    for v in views:
        if not _dense_block(v):
            raise ValueError("a block of the KV cache (shape %s, strides %s) is not one dense "
                             "run of bytes" % (tuple(v.shape), tuple(v.stride())))
    return views


def paged_buffers(tensors, num_blocks, block_size):
    """RawBuffers of a paged pool over the layers' caches (one list per
    layer) and its rows per block: block_size (rows = token slots) when
    every buffer's blocks lie back to back, else the kernel blocks per
    block (rows = the tensor's blocks)."""
    kv = _kvdock()
    per_layer = [[v for t in ts for v in block_views(t, num_blocks)] for ts in tensors]
    token_rows = True
    for views in per_layer:
        for v in views:
            k = v.shape[0] // num_blocks
            block_bytes = v[0].numel() * v.element_size()
            if v.stride(0) * v.element_size() != block_bytes or (k * block_bytes) % block_size:
                token_rows = False
    rows = block_size if token_rows else None
    out = []
    for views in per_layer:
        bufs = []
        for v in views:
            k = v.shape[0] // num_blocks
            block_bytes = v[0].numel() * v.element_size()
            if token_rows:
                row = k * block_bytes // block_size
                bufs.append(kv.RawBuffer(v.data_ptr(), n_rows=num_blocks * block_size,
                                         bytes_per_row=row, row_stride=row,
                                         memory=_memory_of(v), owner=v))
            else:
                if rows is None:
                    rows = k
                elif rows != k:
                    raise ValueError("layers of one group with different kernel blocks per block")
                bufs.append(kv.RawBuffer(v.data_ptr(), n_rows=num_blocks * k,
                                         bytes_per_row=block_bytes,
                                         row_stride=v.stride(0) * v.element_size(),
                                         memory=_memory_of(v), owner=v))
        out.append(bufs)
    return out, rows


def state_buffers(states):
    """RawBuffers of one mamba layer's states (dim 0: the block id)."""
    kv = _kvdock()
    bufs = []
    for v in states:
        if not _dense_block(v):
            raise ValueError("a mamba state row (shape %s, strides %s) is not dense"
                             % (tuple(v.shape), tuple(v.stride())))
        bufs.append(kv.RawBuffer(v.data_ptr(), n_rows=v.shape[0],
                                 bytes_per_row=v[0].numel() * v.element_size(),
                                 row_stride=v.stride(0) * v.element_size(),
                                 memory=_memory_of(v), owner=v))
    return bufs


class _PoolInfo:
    def __init__(self, plan, pool, rows_per_block, layer_ids):
        self.plan, self.pool, self.rows, self.layer_ids = plan, pool, rows_per_block, layer_ids

    def indices(self, block_ids):
        b = int64_array(block_ids, "block ids")
        if not self.plan.paged:
            return b
        return (b[:, None] * self.rows + np.arange(self.rows, dtype=np.int64)[None, :]).reshape(-1)


class _LoadRec:
    """A committed load whose completion has not been taken: until it has,
    the blocks it writes are the linker's."""

    def __init__(self, rid, req_id, block_ids, since):
        self.rid, self.req_id, self.block_ids, self.since = rid, req_id, block_ids, since
        self.bad = None  # why its bytes are not trusted whatever its completion says


class _WorkerSide:
    """The linker of one worker: its pools, loads and offloads."""

    START_TRIES = 5  # start_layer_wise_loading fails only on NOMEM or INVALID: tried again

    def __init__(self, settings):
        self.s = settings
        self.log = engine.RateLimitedLog(logger)
        self.linker = None
        self.load_done = None  # engine.Completions of the linker's loads
        self.offload_done = None  # and of its offloads
        self.pools = {}  # group index -> _PoolInfo
        self.layer_ids = {}  # layer name -> layer id
        self.mamba_layer_ids = []
        self.rids = itertools.count(1)
        self.inflight = {}  # rid -> _LoadRec (committed, completion not taken)
        self.batch = None  # (counter, [rid, ...]) of this step, for the layer waits (sync loads)
        self.must = []  # this step's rids (sync loads): waited for at the end of the step
        self.unstarted = False  # committed loads whose start failed
        self.load_errors = set()
        self.finished_recving = set()
        self.acks = {}  # ack -> (req_id, when queued)
        self.pending = {}  # req_id -> offloads not acknowledged
        self.stored = set()  # req ids that had saves scheduled
        self.finishing = set()  # finished req ids waiting for their saves
        self.stats = {"loads": 0, "loads_ok": 0, "loads_failed": 0, "offloads": 0,
                      "offloads_ok": 0, "offloads_failed": 0}
        self.tp_rank, self.pp_rank = self._ranks()

    def _ranks(self):
        tp = self.s.tp_rank_override
        pp = self.s.pp_rank_override
        if tp is None or pp is None:
            try:  # vLLM's parallel state, in a real worker
                from vllm.distributed.parallel_state import get_pp_group, get_tp_group

                tp = get_tp_group().rank_in_group if tp is None else tp
                pp = get_pp_group().rank_in_group if pp is None else pp
            except Exception:  # no vLLM, or its groups are not set up: one rank
                tp = 0 if tp is None else tp
                pp = 0 if pp is None else pp
        return int(tp), int(pp)

    # -- registration
    def register_kv_caches(self, kv_caches, num_blocks):
        if self.s.problem:
            return
        kv = _kvdock()
        names = sorted(kv_caches, key=_layer_order_key)
        self.layer_ids = {n: i for i, n in enumerate(names)}
        try:
            self.linker = kv.Linker(
                socket_path=self.s.socket_path, connect=self.s.connect,
                client_name="vllm-worker-tp%d-pp%d" % (self.tp_rank, self.pp_rank),
                model_id=self.s.model_id, tp_rank=self.tp_rank, tp_size=self.s.tp_size,
                pp_rank=self.pp_rank, pp_size=self.s.pp_size,
                layer_group_size=self.s.layer_group_size, timeout_ms=self.s.timeout_ms,
                transport=self.s.transport, auth_token_file=self.s.auth_token_file)
        except kv.KvdockError as e:
            logger.error("kvdock: no linker, nothing is loaded or stored: %s", e)
            return
        self.load_done = engine.Completions(self.linker.pop_completed_loads, self.log)
        self.offload_done = engine.Completions(self.linker.pop_completed_offloads, self.log)
        for plan in self.s.plans:
            layer_names = [n for n in names if not plan.layer_names or n in plan.layer_names]
            seen, layers = set(), []
            for n in layer_names:
                t = kv_caches[n]
                ts = list(t) if isinstance(t, (list, tuple)) else [t]
                ptrs = tuple(x.data_ptr() for x in ts)
                if ptrs in seen:  # a layer sharing another layer's cache
                    continue
                seen.add(ptrs)
                layers.append((self.layer_ids[n], ts))
            if not layers:
                continue
            try:
                self._register(plan, layers, num_blocks)
            except (kv.KvdockError, ValueError) as e:
                logger.error("kvdock: group %d (%s) not registered, its loads fail: %s",
                             plan.index, plan.pool_name, e)

    def _register(self, plan, layers, num_blocks):
        if plan.kind == "mamba":
            bufs = {lid: state_buffers(ts) for lid, ts in layers}
            n_rows = min(b.n_rows for bl in bufs.values() for b in bl)
            pool = self.linker.register_pool(plan.pool_name, bufs, addressing="slot", n_rows=n_rows,
                                             trailing_pages=1, rank_replicated=False)
            self.mamba_layer_ids.extend(lid for lid, _ in layers)
            rows = 1
        else:
            bufs, rows = paged_buffers([ts for _, ts in layers], num_blocks, plan.block_size)
            pool = self.linker.register_pool(
                plan.pool_name, {lid: b for (lid, _), b in zip(layers, bufs)}, addressing="paged",
                page_size=rows, n_rows=num_blocks * rows, trailing_pages=plan.trailing_pages,
                rank_replicated=plan.rank_replicated)
        expect = namespace_name(self.s.model_id, plan.pool_name, self.tp_rank, plan.rank_replicated,
                                pp_rank=self.pp_rank, pp_size=self.s.pp_size)
        if getattr(pool, "namespace", expect) != expect:
            logger.warning("kvdock: pool %s has namespace %r, the scheduler looks in %r",
                           plan.pool_name, pool.namespace, expect)
        if plan.object_bytes and pool.object_bytes != plan.object_bytes:
            logger.warning("kvdock: pool %s holds %d bytes a page, its KV cache spec says %d: the "
                           "scheduler's lookups will not find its pages", plan.pool_name,
                           pool.object_bytes, plan.object_bytes)
        self.pools[plan.index] = _PoolInfo(plan, pool, rows, [lid for lid, _ in layers])

    # -- loads
    def _fail(self, block_ids, why, req_id, level=logging.WARNING):
        self.stats["loads_failed"] += 1
        self.load_errors.update(block_ids)
        self.log.warn("load-failed", "load of %s failed (%s): %d blocks reported for recompute",
                      req_id, why, len(block_ids), level=level)

    def _start(self):
        """start_layer_wise_loading, tried again where it fails (it fails
        only on NOMEM or INVALID): the batch's counter, or None (the
        committed loads then start at the next try, in reap_loads or the
        next step)."""
        kv = _kvdock()
        for i in range(self.START_TRIES):
            try:
                counter = self.linker.start_layer_wise_loading()
            except kv.ClosedError:
                self.unstarted = False  # closed: every committed load completed as failed
                return None
            except kv.KvdockError as e:
                self.log.error("start", "starting the committed loads failed (try %d of %d): %s",
                               i + 1, self.START_TRIES, e)
                time.sleep(0.001 * (1 << i))
                continue
            self.unstarted = False
            return counter
        self.unstarted = True
        return None

    def start_load(self, meta):
        if meta is None or not meta.loads:
            return
        kv = _kvdock()
        batch, with_mamba = [], False
        for spec in meta.loads:
            self.stats["loads"] += 1
            if not spec.restorable:
                self._fail(spec.block_ids, spec.why, spec.req_id)
                self._done_recving(spec.req_id)
                continue
            if self.linker is None or any(p.group not in self.pools for p in spec.parts):
                self._fail(spec.block_ids, "no pool registered for it", spec.req_id)
                self._done_recving(spec.req_id)
                continue
            transfers = []
            for part in spec.parts:
                info = self.pools[part.group]
                transfers.append(kv.Transfer(info.pool, part.keys, info.indices(part.block_ids)))
                with_mamba |= not info.plan.paged
            rid = next(self.rids)
            try:
                engine.load_whole(self.linker, rid, transfers)
            except kv.KvdockError as e:
                try:  # a PREPARE or COMMIT that failed: nothing of it may copy
                    self.linker.abort(rid)
                except kv.KvdockError:
                    pass  # aborted already (its LOAD failed), or gone with the connection
                expected = isinstance(e, engine.TRANSIENT + (kv.NotFoundError,))
                self._fail(spec.block_ids, e, spec.req_id,
                           logging.WARNING if expected else logging.ERROR)
                self._done_recving(spec.req_id)
                continue
            self.inflight[rid] = _LoadRec(rid, spec.req_id, spec.block_ids, time.monotonic())
            batch.append(rid)
        if not batch:
            return
        counter = self._start()
        if self.s.load_async:
            return  # taken in once back (get_finished)
        self.must.extend(batch)
        if counter is None:
            # not copied before this forward pass: failed, whatever comes
            # back; their blocks stay the linker's until it has
            for rid in batch:
                self.inflight[rid].bad = "its copies could not be started"
            return
        self.batch = (counter, batch)
        if with_mamba:  # vLLM's mamba layers wait for no layer: wait now
            for lid in self.mamba_layer_ids:
                self.wait_layer_id(lid)

    def wait_layer_id(self, lid):
        if self.batch is None:
            return
        kv = _kvdock()
        counter, rids = self.batch
        try:
            self.linker.wait_layer(counter, lid)
        except kv.KvdockError as e:
            # the batch failed: its bytes are not trusted; the forward pass
            # goes on, the loads' completions are still waited for
            for rid in rids:
                rec = self.inflight.get(rid)
                if rec is not None and rec.bad is None:
                    rec.bad = "layer %d: %s" % (lid, e)
            self.batch = None

    def wait_layer(self, layer_name):
        lid = self.layer_ids.get(layer_name)
        if lid is not None:
            self.wait_layer_id(lid)
        elif self.batch is not None:
            # a layer this connector was not given: it may read any pool's
            # bytes, so wait for every layer of the batch
            for lid in sorted(self.layer_ids.values()):
                self.wait_layer_id(lid)

    def _done_recving(self, req_id):
        if self.s.load_async:
            self.finished_recving.add(req_id)

    def _late(self, since):
        """Of {id: time queued}, those older than the completion bound."""
        now = time.monotonic()
        return [i for i, t in since.items() if now - t > self.s.wait_s]

    def reap_loads(self):
        """Takes in the loads that came back. This step's loads (sync
        mode) are waited for until their completions came: their blocks
        are handed back to vLLM only then (or once the linker closed or
        broke its bound); an async load is taken in when back."""
        self.batch = None
        must, self.must = self.must, []
        if self.load_done is None:
            return
        if self.unstarted:
            self._start()
        got = self.load_done.wait(must, self.s.wait_s) if must else {}
        got.update(self.load_done.poll())
        late = self._late({r: rec.since for r, rec in self.inflight.items() if r not in got})
        if late:  # past the bound: the linker broke it (logged by wait)
            got.update(self.load_done.wait(late, 0))
        for rid, ok in got.items():
            rec = self.inflight.pop(rid, None)
            if rec is None:
                continue
            if ok and rec.bad is None:
                self.stats["loads_ok"] += 1
            else:
                self._fail(rec.block_ids, rec.bad or "its copy failed", rec.req_id)
            self._done_recving(rec.req_id)

    # -- saves
    def note_stores(self, meta):
        """Every request with saves in meta is reported in get_finished's
        sending set once finished (what request_finished promised)."""
        for spec in getattr(meta, "stores", ()) or ():
            self.stored.add(spec.req_id)

    def save(self, meta):
        if meta is None:
            return
        self.note_stores(meta)
        if self.linker is None:
            return  # nothing pending: reported finished at once
        kv = _kvdock()
        wait_for = []
        for spec in meta.stores:
            for part in spec.parts:
                info = self.pools.get(part.group)
                if info is None:
                    continue
                t = kv.Transfer(info.pool, part.keys, info.indices(part.block_ids),
                                first_depth=part.first_page, prior_key=part.prior_key)
                self.stats["offloads"] += 1
                try:
                    ack = self.linker.offload([t])
                except kv.KvdockError as e:
                    self.stats["offloads_failed"] += 1
                    self.log.warn("offload", "offload of %s not queued: %s", spec.req_id, e,
                                  level=logging.WARNING if isinstance(e, engine.TRANSIENT)
                                  else logging.ERROR)
                    continue
                self.acks[ack] = (spec.req_id, time.monotonic())
                self.pending[spec.req_id] = self.pending.get(spec.req_id, 0) + 1
                if info.plan.kind != "kv":  # vLLM frees these blocks while the request runs
                    wait_for.append(ack)
        if wait_for:
            # read until their completions came: only then are the blocks vLLM's again
            self._offloads_back(self.offload_done.wait(wait_for, self.s.wait_s))

    def _offloads_back(self, got):
        for ack, ok in got.items():
            rec = self.acks.pop(ack, None)
            if rec is None:
                continue
            req_id = rec[0]
            self.stats["offloads_ok" if ok else "offloads_failed"] += 1
            left = self.pending.get(req_id, 1) - 1
            if left > 0:
                self.pending[req_id] = left
            else:
                self.pending.pop(req_id, None)

    def _reap_offloads(self):
        if self.offload_done is None:
            return
        got = self.offload_done.poll()
        late = self._late({a: t for a, (_, t) in self.acks.items() if a not in got})
        if late:  # past the bound: the linker broke it (logged by wait)
            got.update(self.offload_done.wait(late, 0))
        self._offloads_back(got)

    def preempted(self, req_ids):
        """A preempted request's blocks go back to vLLM: its saves are
        waited for until their completions came."""
        if req_ids and self.offload_done is not None:
            acks = [a for a, (r, _) in self.acks.items() if r in req_ids]
            if acks:
                self._offloads_back(self.offload_done.wait(acks, self.s.wait_s))

    def get_finished(self, finished_req_ids):
        self.reap_loads()
        self._reap_offloads()
        self.finishing |= set(finished_req_ids or ()) & self.stored
        sending = {r for r in self.finishing if not self.pending.get(r)}
        self.finishing -= sending
        self.stored -= sending
        recving, self.finished_recving = self.finished_recving, set()
        return (sending or None), (recving or None)

    def take_load_errors(self):
        self.reap_loads()
        out, self.load_errors = self.load_errors, set()
        return out

    def close(self):
        if self.linker is not None:
            try:
                self.linker.close()
            finally:
                self.linker = None


# ============================================================ connector


class KvdockConnector(KVConnectorBase_V1, SupportsHMA):
    """kvdock's KV connector for vLLM (see the module docstring)."""

    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        _load_library()  # fails here, at startup, without libkvdock
        self._settings = _Settings(vllm_config, kv_cache_config)
        self._num_blocks = getattr(kv_cache_config, "num_blocks", None)
        self._scheduler = None
        self._worker = None
        if role == KVConnectorRole.SCHEDULER or getattr(role, "name", None) == "SCHEDULER":
            self._scheduler = _SchedulerSide(self._settings)
        else:
            self._worker = _WorkerSide(self._settings)

    @property
    def requires_kv_delivery(self):
        return False  # a cache: a save that is lost is a later miss

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None  # any layout: blocks are copied as they lie

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return not _as_bool((extra_config or {}).get("kvdock_load_async", False))

    # ------------------------------------------------------ worker side

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and connector_metadata is not None:
            self._worker.note_stores(connector_metadata)

    def register_kv_caches(self, kv_caches):
        if self._worker is None:
            return
        num_blocks = self._num_blocks
        if not num_blocks:
            first = next(iter(kv_caches.values()))
            first = first[0] if isinstance(first, (list, tuple)) else first
            kv_apart = first.shape[0] == 2 and first.dim() >= 3
            num_blocks = first.shape[1] if kv_apart else first.shape[0]
        self._worker.register_kv_caches(kv_caches, int(num_blocks))

    def start_load_kv(self, forward_context, **kwargs):
        if self._worker is not None and self.has_connector_metadata():
            self._worker.start_load(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name):
        if self._worker is not None:
            self._worker.wait_layer(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        # a kvdock object holds a page of every layer: pages are offloaded
        # once the forward pass wrote all layers (wait_for_save)
        return

    def wait_for_save(self):
        if self._worker is not None and self.has_connector_metadata():
            self._worker.save(self._get_connector_metadata())

    def handle_preemptions(self, kv_connector_metadata):
        if self._worker is not None and kv_connector_metadata is not None:
            self._worker.preempted(set(getattr(kv_connector_metadata, "preempted", ()) or ()))

    def get_finished(self, finished_req_ids):
        if self._worker is None:
            return None, None
        return self._worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self):
        if self._worker is None:
            return set()
        return self._worker.take_load_errors()

    def shutdown(self):
        if self._worker is not None:
            self._worker.close()
        if self._scheduler is not None:
            self._scheduler.close()

    # --------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if self._scheduler is None:
            return 0, False
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if self._scheduler is not None:
            self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        if self._scheduler is None:
            return KvdockConnectorMetadata()
        return self._scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request, block_ids):
        if self._scheduler is None:
            return False, None
        return self._scheduler.request_finished(request, [block_ids])

    def request_finished_all_groups(self, request, block_ids):
        if self._scheduler is None:
            return False, None
        return self._scheduler.request_finished(request, block_ids)

    # ------------------------------------------------------- for tools

    @property
    def kvdock_stats(self):
        """The worker's load and offload counts (empty on the scheduler)."""
        return dict(self._worker.stats) if self._worker is not None else {}


__all__ = ["KvdockConnector", "KvdockConnectorMetadata", "LoadSpec", "StoreSpec", "PoolPart",
           "GroupPlan", "plan_groups", "restore_problem", "default_model_id", "namespace_name",
           "chain_anchor", "cacheable",
           "block_views", "paged_buffers", "HAVE_VLLM", "VLLM_BASE_COMMIT"]
