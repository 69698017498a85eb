"""kvdock: Python over libkvdock, the worker library of the kvdock KV-cache
store, and the adapters that put kvdock inside serving engines.

    import kvdock
    with kvdock.Linker(model_id="llama-3-8b", tp_rank=0, tp_size=1) as lk:
        kv = lk.register_pool("kv", {i: [k[i], v[i]] for i in range(n_layers)},
                              page_size=64, free_indices=allocator.free)
        keys = kvdock.page_keys(token_ids, 64)
        boundaries = lk.lookup(rid, [kvdock.Transfer(kv, keys)])

Adapters: kvdock.sglang (HiCache storage backend, unified-cache linker),
kvdock.vllm (KV connector v1). The C contract is linker/kvdock.h.
"""

from . import _lib
from .buffers import RawBuffer
from .client import StoreClient
from .errors import *  # noqa: F401,F403  (the exception classes)
from .errors import __all__ as _errors_all
from .linker import PAGED, SLOT, Commit, Linker, Pool, Transfer, page_keys

PAGE_KEY_BYTES = _lib.KVD_PAGE_KEY_BYTES
__version__ = "0.1.0"


def version():
    """The loaded libkvdock's version ("MAJOR.MINOR.PATCH")."""
    return _lib.lib().kvd_version().decode()


def strerror(status):
    """libkvdock's description of a kvd_status_t."""
    return _lib.strerror(status)


__all__ = ["Linker", "Pool", "Transfer", "Commit", "RawBuffer", "StoreClient", "page_keys",
           "version", "strerror", "PAGED", "SLOT", "PAGE_KEY_BYTES"] + list(_errors_all)
