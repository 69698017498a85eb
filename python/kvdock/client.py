"""kvdock.StoreClient: what an operator (or a test) asks a running kvdockd,
through libkvdock's store client: health, stats, stored prefixes, lookups.
The answers are the `kvdock` CLI's --json objects, parsed."""

import ctypes
import json
import threading

from . import _lib
from .buffers import key_block, uint32_array
from .errors import ClosedError, UnsupportedError
from .linker import _HEALTH, _cstr


class StoreClient:
    """One connection to a kvdockd (kvd_store_open): over its Unix socket
    (socket_path; None: the default instance's) or TCP (connect
    "HOST:PORT"), with a token file where the daemon wants one. Calls are
    serialised; each is bounded by timeout_ms."""

    def __init__(self, socket_path=None, connect=None, auth_token_file=None, timeout_ms=5000,
                 client_name=None):
        self._lib = _lib.lib()
        if not _lib.has("kvd_store_open"):
            raise UnsupportedError(message="this libkvdock has no store client")
        self._lock = threading.Lock()
        self._handle = None
        cfg = _lib.StoreConfig(socket_path=_cstr(socket_path), connect=_cstr(connect),
                               client_name=_cstr(client_name or "kvdock-python"),
                               auth_token_file=_cstr(auth_token_file),
                               timeout_ms=int(timeout_ms))
        h = ctypes.c_void_p()
        _lib.check(self._lib.kvd_store_open(ctypes.byref(cfg), ctypes.byref(h)))
        self._handle = h.value

    def close(self):
        with self._lock:
            h, self._handle = self._handle, None
        if h is not None:
            self._lib.kvd_store_close(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _json(self, name, *args):
        out = ctypes.c_void_p()
        with self._lock:
            if self._handle is None:
                raise ClosedError(message="the store client is closed")
            _lib.check(getattr(self._lib, name)(self._handle, *args, ctypes.byref(out)))
        try:
            return json.loads(ctypes.string_at(out.value).decode("utf-8"))
        finally:
            self._lib.kvd_free(out)

    def health(self):
        """{"state": "starting" | "ready" | "draining", "pool_bytes": N}"""
        st = ctypes.c_int()
        nb = ctypes.c_uint64()
        with self._lock:
            if self._handle is None:
                raise ClosedError(message="the store client is closed")
            _lib.check(self._lib.kvd_store_health(self._handle, ctypes.byref(st),
                                                  ctypes.byref(nb)))
        return {"state": _HEALTH.get(st.value, str(st.value)), "pool_bytes": nb.value}

    def stats(self):
        """The daemon's Stats (`kvdock stats --json`)."""
        return self._json("kvd_store_stats_json")

    def prefixes(self, namespace=None, limit=0):
        """Stored prefixes (the "prefixes" of `kvdock prefixes --json`), of
        one namespace or all; limit 0: the library's default (100)."""
        return self._json("kvd_store_prefixes_json", _cstr(namespace), int(limit))["prefixes"]

    def lookup(self, namespaces, keys, trailing=None):
        """The restorable boundaries (in pages, increasing) of these page
        keys in the namespaces (those of `kvdock lookup --json`); trailing:
        each namespace's hit policy (0 = every page, n = the last n pages)."""
        if isinstance(namespaces, str):
            namespaces = [namespaces]
        names = (ctypes.c_char_p * len(namespaces))(*[_cstr(n) for n in namespaces])
        tr = uint32_array(trailing if trailing is not None else [0] * len(namespaces))
        blob, n = key_block(keys)
        kb = ctypes.create_string_buffer(blob, max(1, len(blob)))
        return self._json("kvd_store_lookup_json", names,
                          tr.ctypes.data_as(_lib.c_u32_p), len(namespaces),
                          ctypes.cast(kb, _lib.c_u8_p), n)["boundaries"]
