"""kvdock inside SGLang.

* HiCache storage backend (``--hicache-storage-backend dynamic``, module
  ``kvdock.sglang``, class ``KvdockHiCacheStorage``): hicache.py.
* The unified-cache linker (``KvdockUnifiedCacheLinker``): unified.py.

Both import without SGLang installed; the names load on first use.
"""

_LAZY = {"KvdockHiCacheStorage": ".hicache", "KvdockUnifiedCacheLinker": ".unified",
         "DevicePool": ".unified"}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError("module 'kvdock.sglang' has no attribute %r" % name)
    import importlib

    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value
    return value


__all__ = list(_LAZY)
