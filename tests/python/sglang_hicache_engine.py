"""A small HiCache in Python: SGLang's host pools as torch CPU tensors, their
allocator, and the cache controller's calls into a storage backend, in its
order. The tests drive the kvdock backend through it as SGLang would.

The host pools follow SGLang's (mem_cache/pool_host/{mha,mla,mamba}.py and
the older memory_pool_host.py): the same tensor shapes per layout, the
same flat-page format (get_data_page / set_from_flat_data_page), the same
page-aligned allocator. The controller follows managers/cache_controller.py
and mem_cache/hybrid_cache/hybrid_cache_controller.py: page hashes by
get_hash_str, batches of STORAGE_BATCH_SIZE, a prefetch that asks
batch_exists first and then loads into freshly allocated host indices,
counting the leading successes; backup through batch_set_v1 (and the v2
calls for the hybrid pools).

Nothing here uses the adapter's code: the tests compare what the backend
restored against the bytes the pools held when they were stored.
"""

import hashlib

import torch

STORAGE_BATCH_SIZE = 128


def get_hash_str(token_ids, prior_hash=None):
    """SGLang's page hash: SHA-256 over the prior page's digest (raw bytes)
    and the page's token ids as uint32 little-endian; hex."""
    h = hashlib.sha256()
    if prior_hash:
        h.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        h.update(int(t).to_bytes(4, byteorder="little", signed=False))
    return h.hexdigest()


def page_hashes(token_ids, page_size, prior_hash=None):
    out = []
    last = prior_hash
    for s in range(0, len(token_ids) - len(token_ids) % page_size, page_size):
        last = get_hash_str(token_ids[s:s + page_size], last)
        out.append(last)
    return out


class HostPoolBase:
    """Allocation as SGLang's HostKVCache does it: page-aligned token slots
    handed out from a free list."""

    def _init_alloc(self):
        self.free_slots = torch.arange(self.size, dtype=torch.int64)

    def alloc(self, need):
        assert need % self.page_size == 0
        if need > len(self.free_slots):
            return None
        out, self.free_slots = self.free_slots[:need], self.free_slots[need:]
        return out

    def free(self, idx):
        self.free_slots = torch.cat([self.free_slots, idx.cpu()])

    def fill_random(self, gen):
        for t in self.tensors():
            if t.dtype.is_floating_point:
                t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype))
            else:
                t.copy_(torch.randint(0, 255, t.shape, generator=gen, dtype=torch.int64)
                        .to(t.dtype))

    def page_bytes(self, index):
        """The page at token index ``index`` as bytes (flat page format)."""
        return self.get_data_page(index, flat=True).contiguous().view(torch.uint8).numpy().tobytes()


class MHAHostPool(HostPoolBase):
    """MHATokenToKVPoolHost's tensors: kv_buffer (2, ...) with K at [0] and
    V at [1]; layer_first (2, L, size, H, D), page_first (2, size, L, H, D),
    page_first_direct (2, pages, L, page_size, H, D)."""

    def __init__(self, layer_num, n_pages, page_size, head_num, head_dim, layout,
                 dtype=torch.bfloat16):
        self.layer_num, self.page_size, self.layout = layer_num, page_size, layout
        self.head_num, self.head_dim, self.dtype = head_num, head_dim, dtype
        self.page_num = n_pages
        self.size = n_pages * page_size
        if layout == "layer_first":
            dims = (2, layer_num, self.size, head_num, head_dim)
        elif layout == "page_first":
            dims = (2, self.size, layer_num, head_num, head_dim)
        elif layout == "page_first_direct":
            dims = (2, n_pages, layer_num, page_size, head_num, head_dim)
        else:
            raise ValueError(layout)
        self.kv_buffer = torch.zeros(dims, dtype=dtype)
        self._init_alloc()

    @property
    def k_buffer(self):
        return self.kv_buffer[0]

    @property
    def v_buffer(self):
        return self.kv_buffer[1]

    def tensors(self):
        return [self.kv_buffer]

    def get_size_per_token(self):
        itemsize = torch.empty(0, dtype=self.dtype).element_size()
        return self.head_dim * self.head_num * self.layer_num * itemsize * 2

    def get_data_page(self, index, flat=True):
        ps = self.page_size
        if self.layout == "layer_first":
            page = self.kv_buffer[:, :, index:index + ps]
        elif self.layout == "page_first":
            page = self.kv_buffer[:, index:index + ps]
        else:
            p = index // ps
            page = self.kv_buffer[:, p:p + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros(2 * self.layer_num * self.page_size * self.head_num * self.head_dim,
                           dtype=self.dtype)

    def set_from_flat_data_page(self, index, data_page):
        dst = self.get_data_page(index, flat=False)
        dst.copy_(data_page.reshape(dst.shape))


class MLAHostPool(HostPoolBase):
    """MLATokenToKVPoolHost's tensor: one buffer (L, size, 1, D)
    layer_first, (size, L, 1, D) page_first, (pages, L, page_size, 1, D)
    page_first_direct; named k_buffer (newer SGLang) or kv_buffer
    (older)."""

    def __init__(self, layer_num, n_pages, page_size, kv_dim, layout, dtype=torch.bfloat16,
                 attr="k_buffer"):
        self.layer_num, self.page_size, self.layout, self.dtype = layer_num, page_size, layout, \
            dtype
        self.kv_dim = kv_dim
        self.page_num = n_pages
        self.size = n_pages * page_size
        if layout == "layer_first":
            dims = (layer_num, self.size, 1, kv_dim)
        elif layout == "page_first":
            dims = (self.size, layer_num, 1, kv_dim)
        elif layout == "page_first_direct":
            dims = (n_pages, layer_num, page_size, 1, kv_dim)
        else:
            raise ValueError(layout)
        setattr(self, attr, torch.zeros(dims, dtype=dtype))
        self._attr = attr
        self._init_alloc()

    def buf(self):
        return getattr(self, self._attr)

    def tensors(self):
        return [self.buf()]

    def get_data_page(self, index, flat=True):
        ps, b = self.page_size, self.buf()
        if self.layout == "layer_first":
            page = b[:, index:index + ps]
        elif self.layout == "page_first":
            page = b[index:index + ps]
        else:
            p = index // ps
            page = b[p:p + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.layer_num * self.page_size * self.kv_dim, dtype=self.dtype)

    def set_from_flat_data_page(self, index, data_page):
        dst = self.get_data_page(index, flat=False)
        dst.copy_(data_page.reshape(dst.shape))


class MambaHostPool(HostPoolBase):
    """MambaPoolHost's tensors, page_first: temporal (slots, L, 1, *shape)
    in float32, each conv state (slots, L, 1, *shape) in the conv dtype;
    page_size 1 (one slot per node)."""

    def __init__(self, n_mamba_layers, n_slots, temporal_shape, conv_shapes,
                 conv_dtype=torch.bfloat16):
        self.page_size = 1
        self.layout = "page_first"
        self.num_mamba_layers = n_mamba_layers
        self.size = n_slots
        self.temporal_buffer = torch.zeros((n_slots, n_mamba_layers, 1) + tuple(temporal_shape),
                                           dtype=torch.float32)
        self.conv_buffer = [torch.zeros((n_slots, n_mamba_layers, 1) + tuple(s),
                                        dtype=conv_dtype) for s in conv_shapes]
        self._init_alloc()

    def tensors(self):
        return [self.temporal_buffer] + self.conv_buffer

    def slot_bytes(self, slot):
        return b"".join(t[slot].contiguous().view(torch.uint8).numpy().tobytes()
                        for t in self.tensors())


class HiCacheDriver:
    """The controller's side of a storage backend for one host KV pool (and,
    for hybrid models, its sidecar pools)."""

    def __init__(self, backend, kv_pool, sidecars=None):
        self.backend = backend
        self.kv = kv_pool
        self.page_size = kv_pool.page_size
        self.sidecars = sidecars or {}

    # -- backup (write to storage)

    def backup(self, host_indices, token_ids, prior_hash=None):
        """The pages of token_ids held at host_indices go to storage, batch
        by batch: ask which are there, write the rest. The number of pages
        stored (a prefix)."""
        hashes = page_hashes(token_ids, self.page_size, prior_hash)
        ps = self.page_size
        done = 0
        for s in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[s:s + STORAGE_BATCH_SIZE]
            have = self.backend.batch_exists(batch)
            assert isinstance(have, int) and 0 <= have <= len(batch)
            if have < len(batch):
                idx = host_indices[(s + have) * ps:(s + len(batch)) * ps]
                res = self.backend.batch_set_v1(batch[have:], idx)
                assert isinstance(res, list) and len(res) == len(batch) - have, res
                if not all(res):
                    return done + have + _leading(res)
            done += len(batch)
        return done

    # -- prefetch (read from storage)

    def hit_query(self, token_ids, prior_hash=None):
        """batch_exists per batch until a short one: the hit hashes."""
        hashes = page_hashes(token_ids, self.page_size, prior_hash)
        hit = []
        for s in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[s:s + STORAGE_BATCH_SIZE]
            n = self.backend.batch_exists(batch)
            assert isinstance(n, int) and 0 <= n <= len(batch)
            hit += batch[:n]
            if n < len(batch):
                break
        return hit

    def prefetch(self, token_ids, prior_hash=None):
        """(pages loaded, host indices allocated for them): the hit part is
        read into freshly allocated host indices, batch by batch, counting
        the leading Trues of each batch_get_v1; a short batch ends it. The
        indices past the loaded pages are freed."""
        hit = self.hit_query(token_ids, prior_hash)
        ps = self.page_size
        if not hit:
            return 0, torch.empty(0, dtype=torch.int64)
        host = self.kv.alloc(len(hit) * ps)
        assert host is not None, "host pool exhausted"
        done = 0
        for s in range(0, len(hit), STORAGE_BATCH_SIZE):
            batch = hit[s:s + STORAGE_BATCH_SIZE]
            res = self.backend.batch_get_v1(batch, host[s * ps:(s + len(batch)) * ps])
            assert isinstance(res, list) and len(res) == len(batch), res
            assert all(isinstance(r, bool) for r in res)
            n = _leading(res)
            done += n
            if n < len(batch):
                break
        if done < len(hit):
            self.kv.free(host[done * ps:])
            host = host[:done * ps]
        return done, host


def _leading(results):
    n = 0
    for r in results:
        if not r:
            break
        n += 1
    return n


def storage_config(socket, model="test-model", tp_rank=0, tp_size=1, mla=False, layout="",
                   **extra):
    """The HiCacheStorageConfig the controller builds (_generate_storage_config),
    with the extra config of --hicache-storage-backend-extra-config."""
    from kvdock.sglang.hicache import HiCacheStorageConfig

    cfg = {"backend_name": "kvdock", "module_path": "kvdock.sglang.hicache",
           "class_name": "KvdockHiCacheStorage", "interface_v1": 1, "socket_path": socket,
           "timeout_ms": 10000}
    cfg.update(extra)
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=True,
        is_page_first_layout=layout == "page_first", model_name=model, extra_config=cfg)


class HybridDriver(HiCacheDriver):
    """The hybrid controller's order (HybridCacheController): sidecar pools
    (mamba: one slot per node under the hash of the node's last page; SWA:
    the window's last pages) go through the v2 calls, KV through v1."""

    def backup_node(self, kv_host, token_ids, extra):
        """Stores a node: the sidecars of ``extra`` (PoolTransfers with keys
        and host indices) with batch_set_v2, then KV with batch_set_v1.
        (the v2 results, the KV pages stored)."""
        res = self.backend.batch_set_v2(extra) if extra else {}
        for t in extra:
            r = res.get(t.name)
            assert isinstance(r, list) and len(r) == len(t.keys), res
        return res, self.backup(kv_host, token_ids)

    def prefetch_hybrid(self, token_ids, trailing):
        """Prefetch with sidecars: ``trailing`` maps a pool name to (host
        pool, window pages N). batch_exists_v2 over every hash, the KV hit
        read with batch_get_v1, then each sidecar's keys re-aligned to the
        hit (the last N hashes before it) and read with batch_get_v2 into
        freshly allocated indices. (result of exists, KV pages loaded, KV
        host indices, {name: (v2 results, host indices)})."""
        from kvdock.sglang.hicache import PoolHitPolicy, PoolTransfer

        hashes = page_hashes(token_ids, self.page_size)
        probe = [PoolTransfer(name=name, keys=[None] * n, hit_policy=PoolHitPolicy.TRAILING_PAGES)
                 for name, (_, n) in trailing.items()]
        result = self.backend.batch_exists_v2(hashes, probe)
        hit = result.kv_hit_pages
        assert isinstance(hit, int) and 0 <= hit <= len(hashes)
        ps = self.page_size
        kv_host = self.kv.alloc(hit * ps) if hit else torch.empty(0, dtype=torch.int64)
        loaded = 0
        for s in range(0, hit, STORAGE_BATCH_SIZE):
            batch = hashes[s:min(hit, s + STORAGE_BATCH_SIZE)]
            r = self.backend.batch_get_v1(batch, kv_host[s * ps:(s + len(batch)) * ps])
            loaded += _leading(r)
            if _leading(r) < len(batch):
                break
        side = {}
        if hit and loaded == hit:
            transfers = []
            for name, (pool, n) in trailing.items():
                keys = hashes[max(0, hit - n):hit]
                host = pool.alloc(len(keys) * pool.page_size)
                transfers.append(PoolTransfer(name=name, keys=keys, host_indices=host,
                                              hit_policy=PoolHitPolicy.TRAILING_PAGES))
            res = self.backend.batch_get_v2(transfers)
            for t in transfers:
                side[t.name] = (res.get(t.name), t.host_indices)
        return result, loaded, kv_host, side
