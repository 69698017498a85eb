"""mini_engine.py - a small serving engine in Python, host memory only, for
driving kvdock's engine adapters the way a serving engine drives them.

What it has (the parts an engine's cache has):

* Device pools as torch CPU tensors. A model is a layer string such as
  "AMAMS": A full attention (paged pool "kv": a K and a V buffer per
  layer), M mamba (slot pool "mamba": a temporal and a conv buffer per
  layer, one slot per tree node), S sliding window (paged pool "swa": K and
  V); layer i of the string has global layer id i. Every buffer is a typed
  view (float16, float32, bfloat16) of a uint8 tensor whose rows are
  ``row_stride = bytes_per_row + PAD_BYTES`` apart: the pad bytes hold PAD
  for the life of the pool, so a write past a row's end shows.
* Allocators: paged pools allocate whole pages (page_size consecutive token
  slots from a multiple of page_size), the slot pool one slot. Every unit
  is FREE, REQ (held by a request or a load in flight) or TREE (held by the
  radix tree). A free of a FREE unit (double free), of a TREE unit, of a
  unit out of range or of a partial page is counted, never performed;
  ``free_indices`` (what the linker calls on COMMIT and ABORT) goes through
  the same accounting. Freed units are poisoned (POISON) and checked to
  stay poisoned, so a copy into a slot nobody owns shows.
* A radix tree over page keys (one node per page, children by the page's
  key, which names the whole prefix): each node holds its page's kv unit,
  optionally a sliding-window unit, and optionally a mamba state (the
  checkpoint at the boundary after that page). Insert reports, per paged
  pool, the pages it adopted ([begin, end), absolute) and ``mamba_exist``
  (the node already had a state: the tree frees the new slot itself).
* Content: every row the "forward pass" writes is a deterministic function
  of (page key, pool, layer, buffer, row within the page, TP rank); a mamba
  state of (key of the page that ends its node, layer, buffer, rank).
  verify_tree() recomputes every page and state the tree holds, so a
  misplaced, stale, unwritten or other rank's byte shows.
* The idle-pool invariant (check_invariants): free list = FREE units, each
  once; TREE units = the units the tree references, each once; FREE + REQ
  + TREE = total; no double, tree-owned or malformed free; quiescent: no
  REQ unit. check_all_free(): after drop_device, every unit is free once.

The engine's flows against SGLang's unified-cache linker interface
(``UnifiedLinkerFlow``: match -> LOAD -> PREPARE -> insert -> COMMIT or
ABORT -> load -> layer-wise loading -> completed loads; offload of tree
nodes) are below the engine. Other adapters can drive the same pools, tree
and checks with flows of their own.

Threading: the tree and requests belong to the test's thread; the
allocators are locked, since the linker calls free_indices on the thread
that commits or aborts.
"""

import collections
import hashlib
import math
import threading
import time

import numpy as np
import torch

import kvdock

FREE, REQ, TREE = 0, 1, 2
POISON = 0xEE
PAD = 0x5A
PAD_BYTES = 16
WAIT_S = 60.0  # bound on every wait for completions (never a timing assertion)

# (dtype, row shape) of each buffer of a layer, per pool kind
_LAYOUT = {
    "kv": [(torch.float16, (2, 8)), (torch.float16, (2, 8))],        # K, V: 32 B/row
    "swa": [(torch.bfloat16, (1, 8)), (torch.bfloat16, (1, 8))],     # K, V: 16 B/row
    "mamba": [(torch.float32, (4, 4)), (torch.bfloat16, (3, 8))],    # temporal, conv
}


def tokens(seed, n):
    """n deterministic token ids from seed (different seeds differ at once)."""
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(1, 50000, size=n)]


def _row_bytes(shape, dtype):
    return int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()


class Pool:
    """One device pool: per layer, its buffers (typed views registered with
    the linker) over padded uint8 rows; its allocator and its counters."""

    def __init__(self, name, layer_ids, n_units, page_size, rank=0):
        self.name = name
        self.slot = name == "mamba"
        self.rows_per_unit = 1 if self.slot else page_size
        self.page_size = page_size
        self.n_units = n_units
        self.n_rows = n_units * self.rows_per_unit
        self.rank = rank
        self.layer_ids = list(layer_ids)
        self.bases = {}   # layer -> [uint8 tensor (n_rows, stride)]
        self.views = {}   # layer -> [typed view registered with the linker]
        self.bpr = []     # bytes per row of each buffer
        for dtype, shape in _LAYOUT[name]:
            self.bpr.append(_row_bytes(shape, dtype))
        for layer in self.layer_ids:
            bases, views = [], []
            for (dtype, shape), bpr in zip(_LAYOUT[name], self.bpr):
                base = torch.full((self.n_rows, bpr + PAD_BYTES), PAD, dtype=torch.uint8)
                base[:, :bpr] = POISON
                view = base[:, :bpr].view(dtype).view(self.n_rows, *shape)
                bases.append(base)
                views.append(view)
            self.bases[layer] = bases
            self.views[layer] = views
        self.lock = threading.Lock()
        self.state = [FREE] * n_units
        self.free_list = collections.deque(range(n_units))
        self.linker_freed = 0      # units handed back through free_indices
        self.linker_free_calls = 0
        self.double_frees = 0
        self.tree_frees = 0
        self.bad_frees = 0

    # ------------------------------------------------------------ allocator

    def alloc(self):
        with self.lock:
            if not self.free_list:
                raise RuntimeError("pool %s exhausted" % self.name)
            u = self.free_list.popleft()
            assert self.state[u] == FREE
            self.state[u] = REQ
            return u

    def _free_locked(self, u):
        if not 0 <= u < self.n_units:
            self.bad_frees += 1
        elif self.state[u] == FREE:
            self.double_frees += 1
        elif self.state[u] == TREE:
            self.tree_frees += 1
        else:
            self.state[u] = FREE
            self.free_list.append(u)
            self._poison(u)
            return True
        return False

    def free(self, u):
        """The engine's own free of a unit it holds (REQ -> FREE)."""
        with self.lock:
            self._free_locked(int(u))

    def free_indices(self, indices):
        """What the linker calls (COMMIT: pages not adopted; ABORT: every
        index of the load): token slots of whole pages (paged) or slot ids."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        with self.lock:
            self.linker_free_calls += 1
            if self.slot:
                units = [int(x) for x in idx]
            else:
                ps = self.page_size
                if idx.size % ps:
                    self.bad_frees += 1
                    return
                units = []
                for k in range(0, idx.size, ps):
                    page = idx[k:k + ps]
                    if page[0] % ps or not np.array_equal(page, np.arange(page[0], page[0] + ps)):
                        self.bad_frees += 1
                        continue
                    units.append(int(page[0]) // ps)
            for u in units:
                if self._free_locked(u):
                    self.linker_freed += 1

    def adopt(self, u):
        """REQ -> TREE (the tree takes the unit)."""
        with self.lock:
            assert self.state[u] == REQ, "adopt of unit %d in state %d" % (u, self.state[u])
            self.state[u] = TREE

    def release(self, u):
        """TREE -> FREE (the tree drops the unit)."""
        with self.lock:
            assert self.state[u] == TREE, "release of unit %d in state %d" % (u, self.state[u])
            self.state[u] = REQ
            self._free_locked(u)

    def count(self, st):
        with self.lock:
            return sum(1 for s in self.state if s == st)

    def indices(self, units):
        """Device indices of units: token slots (paged) or slot ids."""
        if self.slot:
            return torch.tensor(list(units), dtype=torch.int64)
        ps = self.page_size
        return torch.tensor([u * ps + j for u in units for j in range(ps)], dtype=torch.int64)

    # -------------------------------------------------------------- bytes

    def _rows(self, u):
        r = u * self.rows_per_unit
        return slice(r, r + self.rows_per_unit)

    def _poison(self, u):
        rows = self._rows(u)
        for layer in self.layer_ids:
            for base, bpr in zip(self.bases[layer], self.bpr):
                base[rows, :bpr] = POISON

    def expected(self, tag, layer, b):
        n = self.rows_per_unit * self.bpr[b]
        h = hashlib.shake_256(b"%s|%s|%d|%d|%d" % (tag, self.name.encode(), layer, b,
                                                   self.rank))
        return torch.frombuffer(bytearray(h.digest(n)), dtype=torch.uint8).view(
            self.rows_per_unit, self.bpr[b])

    def fill(self, u, tag):
        """The forward pass: unit u's rows of every layer from tag."""
        rows = self._rows(u)
        for layer in self.layer_ids:
            for b, (base, bpr) in enumerate(zip(self.bases[layer], self.bpr)):
                base[rows, :bpr] = self.expected(tag, layer, b)

    def check(self, u, tag, layer=None):
        """Errors (strings) for unit u's rows that are not tag's."""
        bad = []
        rows = self._rows(u)
        for lid in self.layer_ids if layer is None else [layer]:
            if lid not in self.bases:
                continue
            for b, (base, bpr) in enumerate(zip(self.bases[lid], self.bpr)):
                got = base[rows]
                if not torch.equal(got[:, :bpr], self.expected(tag, lid, b)):
                    wrong = int((got[:, :bpr] != self.expected(tag, lid, b)).sum())
                    bad.append("%s unit %d layer %d buffer %d: %d wrong bytes"
                               % (self.name, u, lid, b, wrong))
                if not bool((got[:, bpr:] == PAD).all()):
                    bad.append("%s unit %d layer %d buffer %d: pad overwritten"
                               % (self.name, u, lid, b))
        return bad

    def check_poison(self):
        bad = []
        with self.lock:
            free = [u for u in range(self.n_units) if self.state[u] == FREE]
        for layer in self.layer_ids:
            for b, (base, bpr) in enumerate(zip(self.bases[layer], self.bpr)):
                if not bool((base[:, bpr:] == PAD).all()):
                    bad.append("%s layer %d buffer %d: pad overwritten" % (self.name, layer, b))
                for u in free:
                    if not bool((base[self._rows(u), :bpr] == POISON).all()):
                        bad.append("%s free unit %d layer %d buffer %d written"
                                   % (self.name, u, layer, b))
        return bad


class Node:
    """One page of the radix tree: its key, its units, its children."""

    __slots__ = ("key", "parent", "children", "depth", "kv", "swa", "mamba")

    def __init__(self, key, parent, depth):
        self.key = key
        self.parent = parent
        self.children = {}
        self.depth = depth  # page index: the page ends at (depth + 1) pages
        self.kv = -1
        self.swa = -1
        self.mamba = -1


class InsertResult:
    """What an insert did: per paged pool the absolute pages [begin, end)
    adopted (begin == end: none), mamba_exist, and the nodes it created."""

    def __init__(self):
        self.adopted = {}
        self.mamba_exist = False
        self.mamba_adopted = False
        self.new_nodes = []
        self.swa_adopted_nodes = []
        self.mamba_node = None


class MiniEngine:
    """Pools, allocators, the radix tree and the checks (see the module).

    ``layers``: the model's layer string; ``page_size`` tokens a page;
    ``mamba_chunk``: mamba checkpoints land on multiples of lcm(chunk,
    page_size) (the grid; 0: page_size); ``swa_window``: the sliding window
    in pages; ``kv_pages`` / ``mamba_slots``: device units; ``rank``: the TP
    rank (part of every byte)."""

    def __init__(self, layers="AAAA", page_size=4, kv_pages=96, mamba_slots=24, mamba_chunk=0,
                 swa_window=2, rank=0):
        self.layers = layers
        self.ps = page_size
        self.rank = rank
        self.n_layers = len(layers)
        self.pools = {}
        ids = {k: [i for i, c in enumerate(layers) if c == ch]
               for k, ch in (("kv", "A"), ("mamba", "M"), ("swa", "S"))}
        if not ids["kv"]:
            raise ValueError("a model needs full-attention layers")
        self.pools["kv"] = Pool("kv", ids["kv"], kv_pages, page_size, rank)
        if ids["swa"]:
            self.pools["swa"] = Pool("swa", ids["swa"], kv_pages, page_size, rank)
        if ids["mamba"]:
            self.pools["mamba"] = Pool("mamba", ids["mamba"], mamba_slots, page_size, rank)
        self.swa_window = swa_window
        chunk = mamba_chunk or page_size
        self.grid = (chunk * page_size // math.gcd(chunk, page_size)
                     if "mamba" in self.pools else page_size)
        self.root = Node(None, None, -1)

    @property
    def has_mamba(self):
        return "mamba" in self.pools

    @property
    def has_swa(self):
        return "swa" in self.pools

    def pool_order(self):
        """The pools in the order transfers list them (kv first)."""
        return [n for n in ("kv", "swa", "mamba") if n in self.pools]

    # ---------------------------------------------------------------- keys

    def page_keys(self, toks, n_pages):
        return kvdock.page_keys(toks[:n_pages * self.ps], self.ps) if n_pages else []

    @staticmethod
    def state_tag(end_key):
        return b"state|" + end_key

    # ---------------------------------------------------------------- tree

    def path(self, keys):
        """The tree nodes of keys' longest stored prefix."""
        out, node = [], self.root
        for k in keys:
            node = node.children.get(k)
            if node is None:
                break
            out.append(node)
        return out

    def cached_pages(self, keys):
        """The engine's usable device prefix in pages: the longest matched
        p on the grid where (mamba) the node ending at p has a state and
        (swa) the window's pages before p hold window units; 0 always."""
        nodes = self.path(keys)
        best = 0
        for p in range(1, len(nodes) + 1):
            if self.has_mamba and nodes[p - 1].mamba < 0:
                continue
            if self.has_swa and any(n.swa < 0 for n in nodes[max(0, p - self.swa_window):p]):
                continue
            if (p * self.ps) % self.grid == 0:
                best = p
        return best

    def insert(self, keys, first, kv_units, swa_units=None, mamba=-1):
        """Inserts keys' pages; pages [0, first) must be in the tree already.
        kv_units[i] / swa_units[i] hold page first + i (swa -1: none),
        ``mamba`` the state at the end (-1: none). Adopted units go TREE;
        when the end node has a state already the tree frees ``mamba``
        itself (mamba_exist). Nothing else is freed: the caller (or the
        linker's COMMIT) frees the units of pages not adopted."""
        res = InsertResult()
        adopted = {"kv": [], "swa": []}
        node = self.root
        for q, k in enumerate(keys):
            child = node.children.get(k)
            if child is None:
                if q < first:
                    raise AssertionError("insert: page %d below first %d is missing" % (q, first))
                child = Node(k, node, q)
                node.children[k] = child
                child.kv = kv_units[q - first]
                self.pools["kv"].adopt(child.kv)
                adopted["kv"].append(q)
                res.new_nodes.append(child)
            if (swa_units is not None and q >= first and swa_units[q - first] >= 0
                    and child.swa < 0):
                child.swa = swa_units[q - first]
                self.pools["swa"].adopt(child.swa)
                adopted["swa"].append(q)
                res.swa_adopted_nodes.append(child)
            node = child
        if mamba >= 0:
            if node.mamba >= 0:
                res.mamba_exist = True
                self.pools["mamba"].free(mamba)
            else:
                node.mamba = mamba
                self.pools["mamba"].adopt(mamba)
                res.mamba_adopted = True
                res.mamba_node = node
        for name, qs in adopted.items():
            if qs:
                assert qs == list(range(qs[0], qs[-1] + 1)), "adopted pages have a hole"
                res.adopted[name] = (qs[0], qs[-1] + 1)
            else:
                res.adopted[name] = (0, 0)
        return res

    def undo_insert(self, res):
        """Drops what an insert adopted (a load whose copy failed: its
        pages hold no usable bytes)."""
        if res.mamba_adopted:
            self.pools["mamba"].release(res.mamba_node.mamba)
            res.mamba_node.mamba = -1
        for n in res.swa_adopted_nodes:
            if n.swa >= 0:
                self.pools["swa"].release(n.swa)
                n.swa = -1
        for n in reversed(res.new_nodes):
            assert not n.children, "undo_insert: a node got children meanwhile"
            self._release_node(n)
            del n.parent.children[n.key]

    def _release_node(self, n):
        self.pools["kv"].release(n.kv)
        if n.swa >= 0:
            self.pools["swa"].release(n.swa)
        if n.mamba >= 0:
            self.pools["mamba"].release(n.mamba)

    def nodes(self):
        """Every node, parents before children."""
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def drop_device(self):
        """Evicts the whole tree from the device (every unit freed)."""
        for n in reversed(self.nodes()):
            self._release_node(n)
        self.root.children.clear()

    def drop_mamba(self):
        for n in self.nodes():
            if n.mamba >= 0:
                self.pools["mamba"].release(n.mamba)
                n.mamba = -1

    def tree_units(self, name):
        return sum(1 for n in self.nodes() if getattr(n, name) >= 0)

    # ------------------------------------------------------------- prefill

    def prefill(self, toks):
        """Computes the prompt from the usable device prefix on: writes the
        bytes of every full page (and the state at the last grid point,
        with mamba), inserts them into the tree and frees what the tree did
        not adopt. Returns the pages the tree holds for the prompt."""
        n_full = len(toks) // self.ps
        probe = (len(toks) - 1) // self.ps
        keys = self.page_keys(toks, n_full)
        c = self.cached_pages(keys[:probe])
        g = (len(toks) // self.grid * self.grid) // self.ps if self.has_mamba else n_full
        steps = [(c, g, True), (max(c, g), n_full, False)]
        for lo, hi, with_state in steps:
            if hi <= lo:
                continue
            kv = [self.pools["kv"].alloc() for _ in range(lo, hi)]
            for i, u in enumerate(kv):
                self.pools["kv"].fill(u, keys[lo + i])
            swa = None
            if self.has_swa:
                swa = [self.pools["swa"].alloc() for _ in range(lo, hi)]
                for i, u in enumerate(swa):
                    self.pools["swa"].fill(u, keys[lo + i])
            mamba = -1
            if with_state and self.has_mamba:
                mamba = self.pools["mamba"].alloc()
                self.pools["mamba"].fill(mamba, self.state_tag(keys[hi - 1]))
            res = self.insert(keys[:hi], lo, kv, swa, mamba)
            for i in range(hi - lo):
                q = lo + i
                b, e = res.adopted["kv"]
                if not b <= q < e:
                    self.pools["kv"].free(kv[i])
                if swa is not None:
                    b, e = res.adopted["swa"]
                    if not b <= q < e:
                        self.pools["swa"].free(swa[i])
        return len(self.path(keys))

    # -------------------------------------------------------------- checks

    def verify_tree(self, layer=None):
        """Errors for every page and state of the tree whose bytes are not
        its key's (only ``layer``'s when given)."""
        bad = []
        for n in self.nodes():
            bad += self.pools["kv"].check(n.kv, n.key, layer)
            if n.swa >= 0:
                bad += self.pools["swa"].check(n.swa, n.key, layer)
            if n.mamba >= 0:
                bad += self.pools["mamba"].check(n.mamba, self.state_tag(n.key), layer)
        return bad

    def check_invariants(self, quiescent=True):
        """The idle-pool invariant of every pool (see the module); errors."""
        bad = []
        refs = collections.Counter()
        for n in self.nodes():
            refs[("kv", n.kv)] += 1
            if n.swa >= 0:
                refs[("swa", n.swa)] += 1
            if n.mamba >= 0:
                refs[("mamba", n.mamba)] += 1
        for name, p in self.pools.items():
            with p.lock:
                states = list(p.state)
                free_list = list(p.free_list)
                errs = (p.double_frees, p.tree_frees, p.bad_frees)
            counts = collections.Counter(states)
            if sorted(free_list) != [u for u, s in enumerate(states) if s == FREE]:
                bad.append("%s: free list %d entries, %d FREE units (or a unit twice)"
                           % (name, len(free_list), counts[FREE]))
            tree_units = {u for u, s in enumerate(states) if s == TREE}
            held = {u for (pn, u), c in refs.items() if pn == name}
            if tree_units != held:
                bad.append("%s: %d TREE units, the tree references %d" % (name, len(tree_units),
                                                                          len(held)))
            twice = [u for (pn, u), c in refs.items() if pn == name and c > 1]
            if twice:
                bad.append("%s: units %s held by two tree nodes" % (name, twice))
            if counts[FREE] + counts[REQ] + counts[TREE] != p.n_units:
                bad.append("%s: free + in use + cached != total" % name)
            if any(errs):
                bad.append("%s: %d double frees, %d frees of tree units, %d bad frees" % ((name,)
                                                                                         + errs))
            if quiescent and counts[REQ]:
                bad.append("%s: %d units still held by requests" % (name, counts[REQ]))
        return bad

    def check_all_free(self):
        """With the tree dropped and nothing in flight: every unit free,
        exactly once, and the invariant."""
        bad = self.check_invariants(quiescent=True)
        for name, p in self.pools.items():
            with p.lock:
                if sorted(p.free_list) != list(range(p.n_units)):
                    bad.append("%s: %d of %d units free" % (name, len(p.free_list), p.n_units))
        return bad

    def check_poison(self):
        bad = []
        for p in self.pools.values():
            bad += p.check_poison()
        return bad

    # ---------------------------------------------------- for the adapters

    def device_pools(self):
        """The pools as kvdock.sglang.unified.DevicePool specs (free_indices:
        the allocators)."""
        from kvdock.sglang.unified import DevicePool

        specs = []
        for name in self.pool_order():
            p = self.pools[name]
            trailing = {"kv": 0, "swa": self.swa_window, "mamba": 1}[name]
            specs.append(DevicePool(
                name=name, layers={lid: p.views[lid] for lid in p.layer_ids},
                addressing=kvdock.SLOT if p.slot else kvdock.PAGED, page_size=self.ps,
                trailing_pages=trailing, free_indices=p.free_indices))
        return specs


# --------------------------------------------------------------------------
# The flow of SGLang's unified-cache linker (UnifiedCacheLinker), in the
# engine's order, with the LOAD / PREPARE / COMMIT / ABORT phases of the
# load: the tree-side part of SGLang's UnifiedCacheLinkerWrapper.


class Request:
    """One request's load through the flow."""

    def __init__(self, rid, toks):
        self.rid = rid
        self.tokens = toks
        self.n_probe = 0
        self.keys = []          # page keys of the probe range
        self.cached = 0         # usable device prefix, pages
        self.boundaries = []    # absolute pages the linker can restore (after sync)
        self.b = 0              # chosen boundary, absolute pages
        self.transfers = []     # the LOAD's PoolTransfers (kv, swa, mamba order)
        self.units = {}         # pool -> units of the load
        self.swa_first = 0
        self.loaded = False     # LOAD pinned everything
        self.insert = None
        self.remaining = []     # what COMMIT kept
        self.state = "new"
        self.success = None


class UnifiedLinkerFlow:
    """Drives an object with SGLang's UnifiedCacheLinker interface (and
    kvdock's begin_load / prepare_load / commit_load / abort_load) for one
    MiniEngine. ``sync(boundaries)`` turns a rank's restorable boundaries
    (absolute pages) into those every rank shares (TP: the intersection);
    default: this rank's."""

    def __init__(self, engine, linker, sync=None):
        self.e = engine
        self.lk = linker
        self.sync = sync
        self._seq = 0
        self.rid_prefix = "req-r%d-" % engine.rank

    def new_request(self, toks):
        self._seq += 1
        return Request("%s%d" % (self.rid_prefix, self._seq), toks)

    def _pool_transfer(self, name, keys, indices=None, **extra):
        from kvdock.sglang.unified import PoolHitPolicy, PoolName, PoolTransfer

        policy = PoolHitPolicy.ALL_PAGES if name == "kv" else PoolHitPolicy.TRAILING_PAGES
        t = PoolTransfer(name=PoolName(name), device_indices=indices,
                         keys=[k.hex() for k in keys], hit_policy=policy)
        for k, v in extra.items():
            setattr(t, k, v)
        return t

    # -------------------------------------------------------------- match

    def match(self, r):
        """LOOKUP: the probe range (one token short of the prompt), the
        usable device prefix, the linker's boundaries over the uncached
        tail, and the chosen boundary r.b (the largest on the grid)."""
        e = self.e
        r.n_probe = (len(r.tokens) - 1) // e.ps if r.tokens else 0
        r.keys = e.page_keys(r.tokens, r.n_probe)
        r.cached = e.cached_pages(r.keys)
        r.b = r.cached
        r.state = "looked-up"
        if r.cached >= r.n_probe:
            return r.b
        tail = r.keys[r.cached:]
        transfers = [self._pool_transfer(n, tail) for n in e.pool_order()]
        found = self.lk.lookup(r.rid, transfers)
        bnd = [r.cached + int(x) for x in found]
        assert bnd == sorted(set(bnd)) and all(r.cached < x <= r.n_probe for x in bnd), (
            "lookup boundaries %s out of order or range (%d keys)" % (found, len(tail)))
        if self.sync is not None:
            bnd = sorted(self.sync(bnd))
        r.boundaries = bnd
        for x in bnd:
            if (x * e.ps) % e.grid == 0:
                r.b = x
        return r.b

    # -------------------------------------------------------------- load

    def alloc(self, r):
        """Device units for [cached, b): kv pages, the window's swa pages,
        one mamba slot; the LOAD's transfers over them."""
        e = self.e
        n = r.b - r.cached
        r.units = {"kv": [e.pools["kv"].alloc() for _ in range(n)]}
        r.transfers = [self._pool_transfer("kv", r.keys[r.cached:r.b],
                                           e.pools["kv"].indices(r.units["kv"]))]
        if e.has_swa:
            r.swa_first = max(r.cached, r.b - e.swa_window)
            r.units["swa"] = [e.pools["swa"].alloc() for _ in range(r.swa_first, r.b)]
            r.transfers.append(self._pool_transfer("swa", r.keys[r.swa_first:r.b],
                                                   e.pools["swa"].indices(r.units["swa"])))
        if e.has_mamba:
            r.units["mamba"] = [e.pools["mamba"].alloc()]
            r.transfers.append(self._pool_transfer("mamba", [r.keys[r.b - 1]],
                                                   e.pools["mamba"].indices(r.units["mamba"])))

    def begin(self, r):
        """Allocation and LOAD; True when pinned."""
        self.alloc(r)
        r.loaded = self.lk.begin_load(r.rid, r.transfers)
        r.state = "loaded" if r.loaded else "load-failed"
        return r.loaded

    def abort(self, r):
        """ABORT: every unit of the load comes back through free_indices,
        once; returns the units freed per pool."""
        before = {n: p.linker_freed for n, p in self.e.pools.items()}
        assert self.lk.abort_load(r.rid)
        r.state = "aborted"
        return {n: p.linker_freed - before[n] for n, p in self.e.pools.items()}

    def prepare(self, r):
        self.lk.prepare_load(r.rid)
        r.state = "prepared"

    def insert(self, r):
        """The tree insert of [0, b) with the load's units."""
        e = self.e
        swa = None
        if e.has_swa:
            swa = [-1] * (r.b - r.cached)
            for i, u in enumerate(r.units["swa"]):
                swa[r.swa_first - r.cached + i] = u
        mamba = r.units["mamba"][0] if e.has_mamba else -1
        r.insert = e.insert(r.keys[:r.b], r.cached, r.units["kv"], swa, mamba)
        r.state = "inserted"
        return r.insert

    def adopted_ranges(self, r):
        """The insert's adopted pages, relative to each paged transfer (what
        commit_load takes); the mamba pool gets none (never page-sliced)."""
        out = {}
        for name, first in (("kv", r.cached), ("swa", r.swa_first)):
            if name not in self.e.pools:
                continue
            b, e = r.insert.adopted[name]
            out[name] = (b - first, e - first) if e > b else (0, 0)
        return out

    def commit(self, r, adopted=None):
        """COMMIT (what the tree adopted, mamba_exist) and SGLang's load()
        of what is left to copy."""
        r.remaining = self.lk.commit_load(
            r.rid, self.adopted_ranges(r) if adopted is None else adopted,
            mamba_exist=r.insert.mamba_exist)
        r.state = "committed"
        if r.remaining:
            assert self.lk.load(r.rid, r.remaining)
            r.state = "queued"
        return r.remaining

    def run_batch(self, reqs, verify_layers=False):
        """start_layer_wise_loading, the forward pass's layer waits (each
        layer's bytes checked right after its wait when verify_layers), then
        the completions of every queued request (bounded wait). Returns
        {rid: success} and the per-layer errors."""
        counter = self.lk.layer_done_counter
        index = self.lk.start_layer_wise_loading()
        counter.set_consumer(index)
        layer_errors = []
        for layer in range(self.e.n_layers):
            counter.wait_until(layer)
            if verify_layers:
                layer_errors += self.e.verify_tree(layer)
        want = {r.rid for r in reqs if r.state == "queued"}
        got = {}
        deadline = time.monotonic() + WAIT_S
        while want - set(got) and time.monotonic() < deadline:
            if self.lk.num_completed_loads() == 0:
                time.sleep(0.002)
                continue
            for rid, ok in self.lk.pop_completed_load_status():
                assert rid in want and rid not in got, "completion of %s unexpected" % rid
                got[rid] = ok
        for r in reqs:
            if r.rid in got:
                r.success = got[r.rid]
                r.state = "done" if r.success else "failed"
        return got, layer_errors

    def load_back(self, toks):
        """The whole flow for one prompt: the pages restored (the engine
        recomputes the rest, and everything when the load fails) and the
        request."""
        r = self.new_request(toks)
        self.match(r)
        if r.b <= r.cached:
            self.e.prefill(toks)
            return 0, r
        if not self.begin(r):
            self.abort(r)
            self.e.prefill(toks)  # recomputed
            return 0, r
        self.prepare(r)
        self.insert(r)
        self.commit(r)
        if r.remaining:
            got, _ = self.run_batch([r])
            assert r.rid in got, "the load of %s never completed" % r.rid
            if not got[r.rid]:
                self.e.undo_insert(r.insert)
                self.e.prefill(toks)
                return 0, r
        self.e.prefill(toks)  # the part past b
        return (r.b - r.cached), r

    # ------------------------------------------------------------ offload

    def _segments(self):
        """The tree as SGLang's nodes: runs of pages ending at a state, a
        branch or a leaf (each node's pages, its state at its end)."""
        segs = []
        stack = [(self.e.root, c) for c in self.e.root.children.values()]
        while stack:
            parent, n = stack.pop()
            run = [n]
            while n.mamba < 0 and len(n.children) == 1:
                n = next(iter(n.children.values()))
                run.append(n)
            segs.append((parent, run))
            stack.extend((n, c) for c in n.children.values())
        return segs

    def offload_tree(self, pools=None):
        """Offloads every node of the tree through the adapter (pools:
        names to include, default all), chain depth and prior key given;
        waits (bounded) for every completion. Returns the units offloaded
        per pool; raises when one failed or never came back."""
        e = self.e
        pools = set(pools or e.pools)
        units = collections.Counter()
        queued = 0
        for parent, run in self._segments():
            prior = parent.key
            calls = []
            t = []
            if "kv" in pools:
                t.append(self._pool_transfer("kv", [n.key for n in run],
                                             e.pools["kv"].indices([n.kv for n in run]),
                                             first_depth=run[0].depth, prior_key=prior))
                units["kv"] += len(run)
            if e.has_swa and "swa" in pools:
                i = 0
                while i < len(run):  # runs of pages holding window units
                    while i < len(run) and run[i].swa < 0:
                        i += 1
                    j = i
                    while j < len(run) and run[j].swa >= 0:
                        j += 1
                    if j > i:
                        st = self._pool_transfer(
                            "swa", [n.key for n in run[i:j]],
                            e.pools["swa"].indices([n.swa for n in run[i:j]]),
                            first_depth=run[i].depth, prior_key=run[i].parent.key)
                        units["swa"] += j - i
                        if not any(x.name == "swa" for x in t):
                            t.append(st)
                        else:
                            calls.append([st])
                    i = j
            end = run[-1]
            if e.has_mamba and "mamba" in pools and end.mamba >= 0:
                t.append(self._pool_transfer("mamba", [end.key],
                                             e.pools["mamba"].indices([end.mamba]),
                                             first_depth=end.depth, prior_key=end.parent.key))
                units["mamba"] += 1
            if t:
                calls.insert(0, t)
            for c in calls:
                assert self.lk.offload(c), "offload not queued"
                queued += 1
        results = []
        deadline = time.monotonic() + WAIT_S
        while len(results) < queued and time.monotonic() < deadline:
            n = self.lk.num_completed_offloads()
            if n == 0:
                time.sleep(0.002)
            for _ in range(n):
                results.append(self.lk.pop_completed_offload())
        if len(results) != queued or not all(results):
            raise AssertionError("%d offloads queued, %d came back, %d failed"
                                 % (queued, len(results), results.count(False)))
        return dict(units)
