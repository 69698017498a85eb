"""SGLang's HiCache storage interface, restated for the tests.

Written out from sgl-project/sglang at commit
001067fffe33427bee0ed2f007fb7551a1d76b44 (the commit the adapter's
docstring names): python/sglang/srt/mem_cache/hicache_storage.py (the
HiCacheStorage ABC: each method's name, parameters and defaults; the
dataclasses' fields) and mem_cache/storage/backend_factory.py (how the
``dynamic`` backend is loaded and built). SGLang is not installable here, so
the adapter is checked against this text: a method renamed, removed or
given other parameters on either side fails a test. Bodies are omitted:
only the signatures matter.
"""

import dataclasses
import importlib
import inspect
from typing import Any, List, Optional

SGLANG_COMMIT = "001067fffe33427bee0ed2f007fb7551a1d76b44"


class HiCacheStorageAt001067f:
    """The methods of HiCacheStorage at SGLANG_COMMIT, as declared there."""

    def register_mem_pool_host(self, mem_pool_host): ...

    def register_mem_host_pool_v2(self, host_pool, host_pool_name): ...

    def batch_exists_v2(self, keys: List[str], pool_transfers=None, extra_info=None): ...

    def batch_get_v2(self, transfers, extra_info=None): ...

    def batch_set_v2(self, transfers, extra_info=None): ...

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None): ...

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None): ...

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None): ...

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None): ...

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None): ...

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None): ...

    def exists(self, key: str): ...

    def batch_exists(self, keys: List[str], extra_info=None): ...

    def clear(self): ...

    def get_stats(self): ...


# The abstract methods there (a backend that lacks one cannot be built).
ABSTRACT = ("get", "batch_get", "set", "batch_set", "exists")

# The dataclasses' fields at SGLANG_COMMIT, in order, with their defaults
# (dataclasses.MISSING: none).
M = dataclasses.MISSING
FIELDS = {
    "HiCacheStorageConfig": [
        ("tp_rank", M), ("tp_size", M), ("pp_rank", M), ("pp_size", M),
        ("attn_cp_rank", M), ("attn_cp_size", M), ("is_mla_model", M),
        ("enable_storage_metrics", M), ("is_page_first_layout", M), ("model_name", M),
        ("dp_rank", 0), ("dp_size", 1), ("tp_lcm_size", None), ("should_split_heads", False),
        ("extra_config", None)],
    "HiCacheStorageExtraInfo": [("prefix_keys", None), ("extra_info", None)],
    "PoolTransfer": [("name", M), ("host_indices", None), ("device_indices", None),
                     ("keys", None), ("hit_policy", "all_pages"), ("nodes_to_load", None),
                     ("indices_from_pool", None)],
    "PoolTransferResult": [("kv_hit_pages", M), ("extra_pool_hit_pages", M)],
}

POOL_NAMES = {"KV": "kv", "MAMBA": "mamba", "SWA": "swa", "INDEXER": "indexer",
              "DEEPSEEK_V4_C4": "deepseek_v4_c4",
              "DEEPSEEK_V4_C4_INDEXER": "deepseek_v4_c4_indexer",
              "DEEPSEEK_V4_C128": "deepseek_v4_c128",
              "DEEPSEEK_V4_C4_STATE": "deepseek_v4_c4_state",
              "DEEPSEEK_V4_C4_INDEXER_STATE": "deepseek_v4_c4_indexer_state",
              "DEEPSEEK_V4_C128_STATE": "deepseek_v4_c128_state",
              "DRAFT": "draft", "DRAFT_INDEXER": "draft_indexer", "DRAFT_SWA": "draft_swa"}
HIT_POLICIES = {"ALL_PAGES": "all_pages", "TRAILING_PAGES": "trailing_pages"}


def _params(fn):
    """(name, kind, default) of each parameter after self."""
    sig = inspect.signature(fn)
    out = []
    for p in list(sig.parameters.values())[1:]:
        out.append((p.name, p.kind, p.default))
    return out


def interface_mismatches(cls, spec=HiCacheStorageAt001067f):
    """What in cls differs from the restated interface: every method of
    spec must be a public function of cls with the same parameter names,
    kinds and defaults (annotations aside: they are strings or types
    depending on `from __future__ import annotations`). [] when it
    matches."""
    bad = []
    for name, fn in inspect.getmembers(spec, inspect.isfunction):
        if name.startswith("_"):
            continue
        have = getattr(cls, name, None)
        if have is None or not callable(have):
            bad.append("%s: missing" % name)
            continue
        if getattr(have, "__isabstractmethod__", False):
            bad.append("%s: still abstract" % name)
            continue
        want, got = _params(fn), _params(have)
        if want != got:
            bad.append("%s: parameters %s, SGLang's are %s" % (name, got, want))
    return bad


def field_mismatches(cls, name):
    """How the dataclass cls differs from the restated fields of name."""
    want = FIELDS[name]
    got = []
    for f in dataclasses.fields(cls):
        d = f.default
        if isinstance(d, str) or hasattr(d, "value"):  # a str Enum default
            d = getattr(d, "value", d)
        got.append((f.name, d))
    return [] if got == want else ["%s fields %s, SGLang's are %s" % (name, got, want)]


def create_dynamic_backend(extra_config, storage_config, base_class, **kwargs):
    """What StorageBackendFactory._create_dynamic_backend does at
    SGLANG_COMMIT for --hicache-storage-backend dynamic: the three required
    fields, import module_path, take class_name, require a HiCacheStorage
    subclass, and build it as backend_class(storage_config, kwargs)."""
    for f in ("backend_name", "module_path", "class_name"):
        if f not in extra_config:
            raise ValueError("Missing required field '%s' in backend config for 'dynamic' "
                             "backend" % f)
    module = importlib.import_module(extra_config["module_path"])
    backend_class = getattr(module, extra_config["class_name"])
    if not issubclass(backend_class, base_class):
        raise TypeError("Backend class %s must inherit from HiCacheStorage"
                        % extra_config["class_name"])
    return backend_class(storage_config, kwargs)
