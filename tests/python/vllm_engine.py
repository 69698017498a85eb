"""A small vLLM-like engine that drives a KV connector v1 the way vLLM's
scheduler and model runner do, for the kvdock connector's tests.

One Engine is one "vLLM instance": a scheduler-side connector and one
worker-side connector per TP rank, each built by a restatement of vLLM's
KVConnectorFactory from a kv-transfer config, over paged KV caches (one
torch CPU tensor per layer, in one of vLLM's layouts) and mamba states (a
list of tensors per mamba layer), a block pool whose block 0 is the null
block, and a scheduler loop that calls the connector in vLLM's order:

  scheduler: get_num_new_matched_tokens -> (allocate) -> update_state_after_alloc
             -> build_connector_meta
  worker:    bind_connector_metadata -> handle_preemptions -> start_load_kv
             -> per layer: wait_for_layer_load, (attention), save_kv_layer
             -> wait_for_save -> get_finished -> get_block_ids_with_load_errors
             -> clear_connector_metadata
  scheduler: invalid blocks rewind the request (recompute), finished requests
             go through request_finished_all_groups, their blocks are freed
             once every worker reported their saves finished.

The "model" is deterministic: the K and V that layer l of rank r writes for
position p, and the mamba state after position p, are functions of (l, r,
the token prefix up to p). Every forward pass checks what it reads (the KV
of every earlier position of the request, the mamba state it starts from)
against those functions; a request that read wrong bytes in a step whose
invalid blocks did not cover it is a *violation* (a failed load served as a
hit). The tests assert there are none, and compare stored bytes across two
engines byte by byte.
"""

import importlib
import inspect
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch

from kvdock.vllm._base import KVConnectorRole, supports_hma

MASK64 = (1 << 64) - 1


# ----------------------------------------------- vLLM's config objects


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    @property
    def real_page_size_bytes(self):
        return 2 * self.block_size * self.num_kv_heads * self.head_size * \
            torch.empty(0, dtype=self.dtype).element_size()

    @property
    def page_size_bytes(self):
        return self.real_page_size_bytes


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    @property
    def real_page_size_bytes(self):
        return self.block_size * self.num_kv_heads * self.head_size * \
            torch.empty(0, dtype=self.dtype).element_size()


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    sliding_window: int = 0


@dataclass(frozen=True)
class MambaSpec:
    block_size: int
    shapes: tuple
    dtypes: tuple
    mamba_cache_mode: str = "align"

    @property
    def page_size_bytes(self):
        return sum(int(np.prod(s)) * torch.empty(0, dtype=d).element_size()
                   for s, d in zip(self.shapes, self.dtypes))


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: object


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list


@dataclass
class KVTransferConfig:
    kv_connector: str
    kv_connector_module_path: str
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict = field(default_factory=dict)
    engine_id: str = "engine"

    @property
    def is_kv_producer(self):
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self):
        return self.kv_role in ("kv_consumer", "kv_both")

    def get_from_extra_config(self, key, default):
        return self.kv_connector_extra_config.get(key, default)


def supports_kw(cls, name):
    params = inspect.signature(cls).parameters
    return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def create_connector(vllm_config, role, kv_cache_config):
    """What vLLM's KVConnectorFactory does for a connector it has no name
    registered for: the class named kv_connector in the module
    kv_connector_module_path, refused when HMA is on and the class does not
    support it, built with kv_cache_config when its __init__ takes one."""
    ktc = vllm_config.kv_transfer_config
    cls = getattr(importlib.import_module(ktc.kv_connector_module_path), ktc.kv_connector)
    if not vllm_config.scheduler_config.disable_hybrid_kv_cache_manager and not supports_hma(cls):
        raise ValueError("%s does not support HMA" % cls.__name__)
    if supports_kw(cls, "kv_cache_config"):
        return cls(vllm_config, role, kv_cache_config)
    return cls(vllm_config, role)


# ---------------------------------------------- vLLM's scheduler output


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    block_ids: tuple
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: list = field(default_factory=list)
    resumed_req_ids: set = field(default_factory=set)
    new_token_ids: list = field(default_factory=list)
    all_token_ids: dict = field(default_factory=dict)
    new_block_ids: list = field(default_factory=list)
    num_computed_tokens: list = field(default_factory=list)
    num_output_tokens: list = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    finished_req_ids: set
    preempted_req_ids: set = None
    kv_connector_metadata: object = None


class KVCacheBlocks:
    def __init__(self, ids):
        self._ids = tuple(list(g) for g in ids)

    def get_block_ids(self):
        return self._ids


class Request:
    def __init__(self, request_id, prompt, max_tokens=4):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt)
        self.output_token_ids = []
        self.max_tokens = max_tokens
        self.num_computed_tokens = 0
        self.status = "waiting"

    @property
    def all_token_ids(self):
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self):
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self):
        return len(self.prompt_token_ids)


# ------------------------------------------------------------ the model


def prefix_hashes(tokens, rank):
    """h[p]: a 64-bit digest of (rank, tokens[0..p])."""
    out = np.empty(len(tokens), dtype=np.uint64)
    h = (0xCBF29CE484222325 ^ (rank * 0x9E3779B97F4A7C15)) & MASK64
    for i, t in enumerate(tokens):
        h = ((h ^ int(t)) * 0x100000001B3) & MASK64
        h ^= h >> 29
        out[i] = h
    return out


def pattern(hashes, salt, n):
    """n 16-bit words per hash: what a layer stores for those positions."""
    with np.errstate(over="ignore"):
        idx = np.arange(1, n + 1, dtype=np.uint64)
        x = hashes[:, None] * np.uint64(0x9E3779B97F4A7C15) + idx[None, :] * np.uint64(
            0xBF58476D1CE4E5B9 + salt * 2)
        x ^= x >> np.uint64(31)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(29)
    return (x & np.uint64(0xFFFF)).astype(np.uint16).view(np.int16)


def next_token(h):
    return int((int(h) >> 20) % 5000) + 1


# ------------------------------------------------------------- layouts


def make_attention_cache(layout, nb, bs, heads, hd, dtype=torch.float16):
    """(what vLLM hands the connector, a logical view [2, nb, bs, heads, hd]
    (MLA: [1, nb, bs, 1, hd]) of the same memory)."""
    if layout == "flash":  # K and V apart: [2, num_blocks, block_size, heads, head_dim]
        phys = torch.zeros(2, nb, bs, heads, hd, dtype=dtype)
        return phys, phys
    if layout == "flashinfer":  # a block's K and V together: [num_blocks, 2, ...]
        phys = torch.zeros(nb, 2, bs, heads, hd, dtype=dtype)
        return phys, phys.transpose(0, 1)
    if layout == "hnd":  # memory [2, nb, heads, bs, hd], seen as NHD
        raw = torch.zeros(2, nb, heads, bs, hd, dtype=dtype)
        view = raw.permute(0, 1, 3, 2, 4)
        return view, view
    if layout == "kernel":  # kernel blocks of bs/2 tokens: [2, 2*nb, bs/2, heads, hd]
        phys = torch.zeros(2, 2 * nb, bs // 2, heads, hd, dtype=dtype)
        return phys, phys.view(2, nb, bs, heads, hd)
    if layout == "padded":  # hybrid pages padded past K+V, a block's K and V together
        page = 2 * bs * heads * hd + 3 * hd  # elements: padding at the end of each page
        raw = torch.zeros(nb * page, dtype=dtype)
        hsz = bs * heads * hd
        view = torch.as_strided(raw, (2, nb, bs, heads, hd), (hsz, page, heads * hd, hd, 1))
        return view, view
    if layout == "mla":  # [num_blocks, block_size, kv_lora + rope]
        phys = torch.zeros(nb, bs, hd, dtype=dtype)
        return phys, phys.view(1, nb, bs, 1, hd)
    raise ValueError(layout)


MAMBA_SHAPES = ((3, 4), (2, 2, 5))
MAMBA_DTYPES = (torch.float16, torch.float32)


def make_mamba_states(nb):
    """One mamba layer's states as vLLM's HMA lays them out: views of one
    raw page per block (conv state, then the temporal state)."""
    sizes = [int(np.prod(s)) * torch.empty(0, dtype=d).element_size()
             for s, d in zip(MAMBA_SHAPES, MAMBA_DTYPES)]
    page = sum(sizes) + 16  # a padded page
    raw = torch.zeros(nb * page, dtype=torch.uint8)
    states, off = [], 0
    for shape, dtype, size in zip(MAMBA_SHAPES, MAMBA_DTYPES, sizes):
        el = torch.empty(0, dtype=dtype).element_size()
        inner = torch.empty((nb,) + shape).stride()[1:]
        states.append(torch.as_strided(raw.view(dtype), (nb,) + shape, (page // el,) + inner,
                                       off // el))
        off += size
    return states


def make_hma_pair(nb, bs, heads, hd):
    """An attention layer and a mamba layer over one raw tensor, as vLLM's
    hybrid allocator lays them out: one page per block id, the attention
    view [2, nb, bs, heads, hd] with a block's K and V together in its page
    and the mamba states at the start of theirs (block ids are global, so
    a block id is used by one group at a time)."""
    attn_bytes = 2 * bs * heads * hd * 2
    mamba_bytes = sum(int(np.prod(s)) * torch.empty(0, dtype=d).element_size()
                      for s, d in zip(MAMBA_SHAPES, MAMBA_DTYPES))
    page = max(attn_bytes, mamba_bytes)
    raw = torch.zeros(nb * page, dtype=torch.uint8)
    hsz = bs * heads * hd
    attn = torch.as_strided(raw.view(torch.float16), (2, nb, bs, heads, hd),
                            (hsz, page // 2, heads * hd, hd, 1))
    states, off = [], 0
    for shape, dtype in zip(MAMBA_SHAPES, MAMBA_DTYPES):
        el = torch.empty(0, dtype=dtype).element_size()
        inner = torch.empty((nb,) + shape).stride()[1:]
        states.append(torch.as_strided(raw.view(dtype), (nb,) + shape, (page // el,) + inner,
                                       off // el))
        off += int(np.prod(shape)) * el
    return attn, states


# -------------------------------------------------------------- engine


class Engine:
    """One vLLM-like instance (see the module docstring)."""

    def __init__(self, socket, *, layout="flash", n_attn=3, n_mamba=0, heads=2, head_dim=8,
                 block_size=16, num_blocks=96, model="tiny-llama", tp_size=1,
                 load_async=False, timeout_ms=3000, prefill_chunk=None, extra=None,
                 module_path="kvdock.vllm", kv_role="kv_both", drop_state_block=False,
                 n_swa=0, window=40, recovery="every_group"):
        self.bs = block_size
        # how the scheduler recovers failed blocks: "every_group" (what a
        # hybrid-aware scheduler does), or "one_group" as vLLM at the commit
        # the connector names does: it unpacks the block ids of a single
        # group, which raises ValueError for a model of more
        assert recovery in ("every_group", "one_group")
        self.recovery = recovery
        self.drop_state_block = drop_state_block  # hits get no block for their mamba state
        self.after_meta = None  # hook(engine, meta): between the scheduler and the workers
        self.before_layers = None  # hook(engine, rank): after start_load_kv, before layer 0
        self.history = {}  # rid -> its block ids when it finished
        self.to_preempt = set()  # rids to preempt at the start of the next step
        self.resumable = set()  # preempted rids: scheduled again as resumed
        self.delays = {}  # rid -> what request_finished_all_groups answered
        self.all_finished = set()
        self.nb = num_blocks
        self.prefill_chunk = prefill_chunk
        self.hybrid = n_mamba > 0
        self.window = window
        mla = layout == "mla"
        if mla:
            heads = 1
        # layer names in model order: full attention, sliding window and
        # mamba layers taking turns
        self.attn_layers, self.swa_layers, self.mamba_layers, self.order = [], [], [], []
        left = {"attn": n_attn, "swa": n_swa, "mamba": n_mamba}
        while any(left.values()):
            for kind, names in (("attn", self.attn_layers), ("swa", self.swa_layers),
                                ("mamba", self.mamba_layers)):
                if left[kind]:
                    left[kind] -= 1
                    i = len(self.order)
                    name = ("model.layers.%d.mixer" if kind == "mamba" else
                            "model.layers.%d.self_attn.attn") % i
                    names.append(name)
                    self.order.append(name)
        spec_cls = MLAAttentionSpec if mla else FullAttentionSpec
        groups = [KVCacheGroupSpec(list(self.attn_layers),
                                   spec_cls(block_size, heads, head_dim, torch.float16))]
        self.g_swa = self.g_mamba = None
        if n_swa:
            self.g_swa = len(groups)
            groups.append(KVCacheGroupSpec(list(self.swa_layers), SlidingWindowSpec(
                block_size, heads, head_dim, torch.float16, sliding_window=window)))
        if n_mamba:
            self.g_mamba = len(groups)
            groups.append(KVCacheGroupSpec(list(self.mamba_layers),
                                           MambaSpec(block_size, MAMBA_SHAPES, MAMBA_DTYPES)))
        self.group_of = {n: 0 for n in self.attn_layers}
        self.group_of.update({n: self.g_swa for n in self.swa_layers})
        self.kv_cache_config = KVCacheConfig(num_blocks, [], groups)
        self.n_groups = len(groups)
        self.tp_size = tp_size
        extra = dict(extra or {})
        extra.setdefault("kvdock_socket", socket)
        extra.setdefault("kvdock_timeout_ms", timeout_ms)
        extra.setdefault("kvdock_load_async", load_async)
        # the machine running the tests is slow and shared: lookups get the
        # linker's bound unless a test says otherwise
        extra.setdefault("kvdock_lookup_timeout_ms", timeout_ms)
        if recovery == "every_group" and len(groups) > 1:
            extra.setdefault("kvdock_multi_group_loads", True)  # this scheduler recovers them
        self.load_async = load_async

        def config(rank):
            ex = dict(extra)
            if rank is not None:
                ex["kvdock_tp_rank"] = rank
            return SimpleNamespace(
                kv_transfer_config=KVTransferConfig("KvdockConnector", module_path, kv_role, ex),
                cache_config=SimpleNamespace(block_size=block_size, cache_dtype="auto",
                                             mamba_cache_mode="align", enable_prefix_caching=True),
                model_config=SimpleNamespace(model=model, dtype="float16", use_mla=mla),
                parallel_config=SimpleNamespace(tensor_parallel_size=tp_size,
                                                pipeline_parallel_size=1),
                scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False))

        # the workers first (vLLM initialises the KV caches before it builds
        # the scheduler), each with its own caches
        self.workers, self.caches, self.logical, self.states = [], [], [], []
        for r in range(tp_size):
            caches, logical, states = {}, {}, {}
            paged = self.attn_layers + self.swa_layers
            for j, name in enumerate(paged):
                if layout == "hma" and j < len(self.mamba_layers):
                    m = self.mamba_layers[j]  # shares its memory with this layer
                    caches[name], caches[m] = make_hma_pair(num_blocks, block_size, heads,
                                                            head_dim)
                    logical[name], states[m] = caches[name], caches[m]
                else:
                    caches[name], logical[name] = make_attention_cache(
                        "flash" if layout == "hma" else layout, num_blocks, block_size, heads,
                        head_dim)
            for name in self.mamba_layers:
                if name not in caches:
                    caches[name] = states[name] = make_mamba_states(num_blocks)
            w = create_connector(config(r), KVConnectorRole.WORKER, self.kv_cache_config)
            w.register_kv_caches(caches)
            self.workers.append(w)
            self.caches.append(caches)
            self.logical.append(logical)
            self.states.append(states)
        self.sched = create_connector(config(None), KVConnectorRole.SCHEDULER, self.kv_cache_config)
        self.free = list(range(num_blocks - 1, 0, -1))  # block 0: the null block
        self.waiting, self.running, self.remote = [], [], []
        self.blocks = {}  # rid -> [block ids per group]
        self.state_block = {}  # rid -> mamba block holding its current state
        self.delayed = {}  # rid -> workers that reported its saves finished
        self.finished, self.finished_since = [], set()
        self.violations = []  # (rid, step, what)
        self.claims = {}  # rid -> [(external tokens, load_async), ...]
        self.invalid_seen = []  # every step's reported invalid blocks (union of workers)
        self.corrupt = set()
        self.steps = 0
        self.hashes = {}

    # -- blocks
    def _alloc(self):
        if not self.free:
            raise RuntimeError("the test's block pool is too small")
        return self.free.pop()

    def _free_request(self, rid):
        for g in self.blocks.pop(rid, []):
            self.free.extend(b for b in g if b != 0)
        self.state_block.pop(rid, None)

    def _grow(self, rid, total, ext=0):
        """Blocks for `total` tokens; returns the new ids per group. A
        sliding-window group's blocks wholly before the window of an
        external hit of `ext` tokens are null blocks. Mamba (align mode):
        null blocks, and one block where the state of the step's end goes;
        an external hit gets its state block at index ext/bs - 1."""
        ids = self.blocks.setdefault(rid, [[] for _ in range(self.n_groups)])
        new = [[] for _ in range(self.n_groups)]
        need = -(-total // self.bs)
        for g in (0, self.g_swa):
            if g is None:
                continue
            lst = ids[g]
            if g == self.g_swa and ext and not lst:
                skipped = max(0, ext - self.window + 1) // self.bs
                lst.extend([0] * skipped)
                new[g].extend([0] * skipped)
            while len(lst) < need:
                b = self._alloc()
                lst.append(b)
                new[g].append(b)
        if self.g_mamba is not None:
            gm = self.g_mamba
            m = ids[gm]
            if ext and not m:
                m.extend([0] * (ext // self.bs - 1))
                m.append(0 if self.drop_state_block else self._alloc())
                new[gm].extend(m)
                self.state_block[rid] = m[-1]
            if len(m) < need:
                pad = [0] * (need - 1 - len(m))
                m.extend(pad)
                m.append(self._alloc())
                new[gm].extend(pad + [m[-1]])
        return new

    # -- the loop
    def add(self, request):
        self.waiting.append(request)
        self.claims.setdefault(request.request_id, [])

    def step(self):
        self.steps += 1
        so = SchedulerOutput([], CachedRequestData(), {}, 0, self.finished_since, set())
        self.finished_since = set()
        work = []  # (request, start, n)
        for r in [r for r in self.running if r.request_id in self.to_preempt]:
            # vLLM's preemption: the blocks go back, the request waits again
            self.to_preempt.discard(r.request_id)
            self.running.remove(r)
            self._free_request(r.request_id)
            r.num_computed_tokens = 0
            r.status = "waiting"
            self.waiting.insert(0, r)
            self.resumable.add(r.request_id)
            so.preempted_req_ids.add(r.request_id)
        for r in self.running:
            n = r.num_tokens - r.num_computed_tokens
            n = self._chunk(r, n)
            new = self._grow(r.request_id, r.num_computed_tokens + n)
            c = so.scheduled_cached_reqs
            c.req_ids.append(r.request_id)
            c.new_block_ids.append(tuple(new))
            c.num_computed_tokens.append(r.num_computed_tokens)
            c.num_output_tokens.append(len(r.output_token_ids))
            so.num_scheduled_tokens[r.request_id] = n
            work.append((r, r.num_computed_tokens, n))
        for r in list(self.remote):  # async loads that landed
            if r.status != "loaded":
                continue
            self.remote.remove(r)
            self.sched.update_state_after_alloc(r, KVCacheBlocks(self.blocks[r.request_id]), 0)
            self._schedule_new(so, work, r)
        for r in list(self.waiting):
            if so.preempted_req_ids:
                break  # vLLM schedules no waiting request in a step that preempted
            self.waiting.remove(r)
            ext, load_async = self.sched.get_num_new_matched_tokens(r, 0)
            self.claims[r.request_id].append((ext, load_async))
            assert isinstance(ext, int) and isinstance(load_async, bool)
            assert ext % self.bs == 0 and ext < r.num_tokens
            assert not (ext == 0 and load_async)
            self._grow(r.request_id, r.num_tokens if ext and load_async else
                       ext + self._chunk(r, r.num_tokens - ext, ext), ext)
            self.sched.update_state_after_alloc(r, KVCacheBlocks(self.blocks[r.request_id]), ext)
            r.num_computed_tokens = ext
            if load_async:
                r.status = "remote"
                self.remote.append(r)
                continue
            self._schedule_new(so, work, r)
        so.total_num_scheduled_tokens = sum(so.num_scheduled_tokens.values())
        meta = self.sched.build_connector_meta(so)
        so.kv_connector_metadata = meta
        if self.after_meta is not None:
            self.after_meta(self, meta)

        # the workers
        invalid, sending, recving = set(), [], []
        for rank, w in enumerate(self.workers):
            w.bind_connector_metadata(meta)
            w.handle_preemptions(meta)
            w.start_load_kv(SimpleNamespace(attn_metadata={}))
            if self.before_layers is not None:
                self.before_layers(self, rank)
            self._forward(rank, w, work)
            w.wait_for_save()
            s, rv = w.get_finished(set(so.finished_req_ids))
            invalid |= w.get_block_ids_with_load_errors()
            w.clear_connector_metadata()
            sending.append(s or set())
            recving.append(rv or set())
        self.invalid_seen.append(set(invalid))

        # the scheduler's update from the output
        for s in sending:  # vLLM: only ids it gave get_finished as finished
            assert s <= self.all_finished, (s, self.all_finished)
        for rid in set().union(*sending) if sending else ():
            self.delayed.setdefault(rid, set()).update(
                i for i, s in enumerate(sending) if rid in s)
            if len(self.delayed[rid]) == len(self.workers):
                del self.delayed[rid]
                self._free_request(rid)
        done_recv = set.intersection(*recving) if recving else set()
        for r in self.remote:
            if r.request_id in done_recv:
                if self._affected(r, invalid, r.num_computed_tokens):
                    self._rewind(r)
                r.status = "loaded"
        for r, start, n in work:
            affected = self._affected(r, invalid, start)
            if affected:
                self._rewind(r)  # recompute: this step's output is dropped
                self.corrupt.discard(r.request_id)
                continue
            if r.request_id in self.corrupt:
                self.violations.append((r.request_id, self.steps, "read bytes nobody reported"))
                self.corrupt.discard(r.request_id)
            r.num_computed_tokens = start + n
            if r.num_computed_tokens == r.num_tokens:
                h = self._hashes(r, 0)[-1]
                if len(r.output_token_ids) >= r.max_tokens:
                    self._finish(r)
                else:
                    r.output_token_ids.append(next_token(h))
        return meta

    def _schedule_new(self, so, work, r):
        n = self._chunk(r, r.num_tokens - r.num_computed_tokens, r.num_computed_tokens)
        ids = tuple(list(g) for g in self.blocks[r.request_id])
        if r.request_id in self.resumable:  # a resumed request: all its block ids anew
            self.resumable.discard(r.request_id)
            c = so.scheduled_cached_reqs
            c.req_ids.append(r.request_id)
            c.resumed_req_ids.add(r.request_id)
            c.new_block_ids.append(ids)
            c.num_computed_tokens.append(r.num_computed_tokens)
            c.num_output_tokens.append(len(r.output_token_ids))
            c.all_token_ids[r.request_id] = list(r.all_token_ids)
        else:
            so.scheduled_new_reqs.append(NewRequestData(
                r.request_id, list(r.prompt_token_ids), ids, r.num_computed_tokens))
        so.num_scheduled_tokens[r.request_id] = n
        work.append((r, r.num_computed_tokens, n))
        r.status = "running"
        self.running.append(r)

    def _chunk(self, r, n, start=None):
        start = r.num_computed_tokens if start is None else start
        if self.prefill_chunk is None or n <= 1:
            return n
        c = min(n, self.prefill_chunk)
        if self.hybrid and c < n:  # align mode: a chunk ends on a block
            c = max(self.bs, (start + c) // self.bs * self.bs - start)
        return c

    def _affected(self, r, invalid, computed):
        if not invalid:
            return False
        ids = self.blocks.get(r.request_id, [])
        if self.recovery == "one_group":
            (req_block_ids,) = ids  # vLLM's unpack: ValueError for 2 groups or more
            return any(b in invalid for b in req_block_ids)
        return any(b in invalid for g in ids for b in g)

    def _rewind(self, r):
        ids = self.blocks[r.request_id][0]
        bad = [i for i, b in enumerate(ids) if b in self.invalid_seen[-1]]
        first = bad[0] if bad else 0
        # a hybrid model has no state at an earlier block, a sliding window
        # no KV before its window: from the start
        partial = self.hybrid or self.g_swa is not None
        r.num_computed_tokens = 0 if partial else min(r.num_computed_tokens, first * self.bs)
        if self.hybrid:
            self.state_block.pop(r.request_id, None)

    def _finish(self, r):
        self.running.remove(r)
        self.finished.append(r)
        self.finished_since.add(r.request_id)
        self.all_finished.add(r.request_id)
        self.history[r.request_id] = [list(g) for g in self.blocks[r.request_id]]
        delay, _ = self.sched.request_finished_all_groups(
            r, tuple(list(g) for g in self.blocks[r.request_id]))
        self.delays[r.request_id] = delay
        if delay:
            self.delayed.setdefault(r.request_id, set())
        else:
            self._free_request(r.request_id)

    def _hashes(self, r, rank):
        key = (r.request_id, rank)
        toks = r.all_token_ids
        h = self.hashes.get(key)
        if h is None or len(h) < len(toks):
            h = self.hashes[key] = prefix_hashes(toks, rank)
        return h[:len(toks)]

    # -- the forward pass of one rank
    def _slots(self, r, start, end, group=0):
        ids = np.asarray(self.blocks[r.request_id][group], dtype=np.int64)
        p = np.arange(start, end)
        return ids[p // self.bs], p % self.bs

    def _forward(self, rank, w, work):
        for name in self.order:
            lid = self.order.index(name)
            if name in self.mamba_layers:
                for r, start, n in work:
                    self._mamba(rank, name, lid, r, start, n)
                continue
            w.wait_for_layer_load(name)
            g = self.group_of[name]
            view = self.logical[rank][name]
            bits = view.view(torch.int16)
            per = view.shape[3] * view.shape[4]
            for r, start, n in work:
                h = self._hashes(r, rank)
                first = max(0, start - self.window + 1) if g == self.g_swa else 0
                if start > first:  # what attention reads: every earlier position (its window)
                    blk, off = self._slots(r, first, start, g)
                    for kv in range(view.shape[0]):
                        got = bits[kv][blk, off].reshape(start - first, per).numpy()
                        if not np.array_equal(got, pattern(h[first:start], lid * 2 + kv, per)):
                            self.corrupt.add(r.request_id)
                blk, off = self._slots(r, start, start + n, g)
                for kv in range(view.shape[0]):
                    vals = torch.from_numpy(pattern(h[start:start + n], lid * 2 + kv, per))
                    bits[kv][blk, off] = vals.reshape(n, view.shape[3], view.shape[4])
            w.save_kv_layer(name, self.caches[rank][name], None)

    def _state_words(self, h, lid, k, t):
        n = t.numel() * t.element_size() // 2
        return pattern(np.asarray([h], dtype=np.uint64), 1000 + lid * 8 + k, n)[0]

    def _mamba(self, rank, name, lid, r, start, n):
        h = self._hashes(r, rank)
        states = self.states[rank][name]
        if start:
            src = self.state_block.get(r.request_id, 0)
            for k, t in enumerate(states):
                got = t[src].contiguous().view(torch.int16).reshape(-1).numpy()
                want = self._state_words(h[start - 1], lid, k, t[0])
                if src == 0 or not np.array_equal(got, want):
                    self.corrupt.add(r.request_id)
        m = self.blocks[r.request_id][self.g_mamba]
        dst = m[-(-(start + n) // self.bs) - 1]
        for k, t in enumerate(states):
            words = torch.from_numpy(self._state_words(h[start + n - 1], lid, k, t[0]).copy())
            t[dst].view(torch.int16).copy_(words.view(t[dst].view(torch.int16).shape))
        if rank == self.tp_size - 1 and name == self.mamba_layers[-1]:
            self.state_block[r.request_id] = dst

    # -- helpers for the tests
    def run(self, max_steps=200, idle_s=120.0):
        """Steps until every request finished and was freed: at most
        max_steps steps with work, and while only requests whose loads are
        in flight (remote) or finished requests waiting for their saves are
        left, idle steps a few ms apart for at most idle_s (as vLLM's loop
        goes on stepping; a load's time is its own, bounded by the
        connector's timeout, not a number of steps: counted as steps, a
        busy machine ran out of them before a load landed)."""
        steps, idle_until = 0, None
        while self.waiting or self.running or self.remote or self.delayed:
            if self.waiting or self.running:
                steps += 1
                idle_until = None
                if steps > max_steps:
                    break
            else:
                idle_until = idle_until or time.monotonic() + idle_s
                if time.monotonic() > idle_until:
                    break
                time.sleep(0.005)
            self.step()
        else:
            return
        raise AssertionError("requests not done after %d steps: waiting %s running %s remote %s "
                             "delayed %s" % (max_steps, [r.request_id for r in self.waiting],
                                             [r.request_id for r in self.running],
                                             [r.request_id for r in self.remote],
                                             sorted(self.delayed)))

    def block_bytes(self, rank, name, block):
        """The bytes block `block` of layer `name` holds (K then V)."""
        if name in self.mamba_layers:
            return b"".join(t[block].contiguous().numpy().tobytes()
                            for t in self.states[rank][name])
        v = self.logical[rank][name]
        return b"".join(v[kv][block].contiguous().numpy().tobytes() for kv in range(v.shape[0]))

    def shutdown(self):
        for w in self.workers:
            w.shutdown()
        self.sched.shutdown()
