"""What every engine adapter of kvdock needs, in one place: the engines'
page keys as kvdock keys, waiting for a linker's completions by id from
several threads, loading a whole transfer set in one go, which failures
an engine treats as a miss, and a log that a dead daemon cannot flood.

The adapters (kvdock.sglang, kvdock.vllm) are built on these; the rules
they carry are the C contract's (linker/kvdock.h): every committed load
and every offload completes exactly once, within the linker's own bounds,
and until it has, the engine's rows it names are the linker's.
"""

import hashlib
import logging
import threading
import time

from . import _lib
from .errors import (BusyError, ClosedError, DrainingError, IoError, KvdockError,
                     NoSpaceError, ProtocolError, TimeoutError, UnavailableError)
from .linker import Commit

logger = logging.getLogger("kvdock")

KEY_BYTES = _lib.KVD_PAGE_KEY_BYTES

# Failures of the store, not of the caller: an engine answers them as a miss
# (or a failed transfer) and goes on; anything else is a bug to surface.
TRANSIENT = (TimeoutError, ClosedError, UnavailableError, DrainingError, BusyError,
             ProtocolError, IoError, NoSpaceError)


def page_key(key):
    """One engine page key as kvdock's 32 raw bytes: 32 bytes as they are;
    64 hex digits (SGLang's get_hash_str, a SHA-256 hex digest) decoded;
    any other string (a prefixed or derived key) hashed with SHA-256, which
    keeps distinct strings distinct."""
    if isinstance(key, (bytes, bytearray)):
        if len(key) == KEY_BYTES:
            return bytes(key)
        key = bytes(key).hex()
    s = key if isinstance(key, str) else str(key)
    if len(s) == 2 * KEY_BYTES:
        try:
            return bytes.fromhex(s)
        except ValueError:
            pass
    return hashlib.sha256(s.encode("utf-8")).digest()


def page_key_block(keys):
    """page_key of every key, joined into one block of n * 32 bytes (one
    hex pass when every key is 64 hex digits, as SGLang's are)."""
    keys = list(keys)
    if keys and all(isinstance(k, str) and len(k) == 2 * KEY_BYTES for k in keys):
        try:
            return bytes.fromhex("".join(keys))
        except ValueError:
            pass
    return b"".join(page_key(k) for k in keys)


class RateLimitedLog:
    """One warning per kind of message per interval, with the count held
    back since: a daemon that is down must not flood the engine's log."""

    def __init__(self, log=None, interval_s=10.0):
        self._log = log or logger
        self._interval = interval_s
        self._last = {}
        self._held = {}
        self._lock = threading.Lock()

    def warn(self, kind, fmt, *args, level=logging.WARNING):
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -1e18) < self._interval:
                self._held[kind] = self._held.get(kind, 0) + 1
                return
            held = self._held.pop(kind, 0)
            self._last[kind] = now
        if held:
            fmt += " (%d more like it since the last)"
            args = args + (held,)
        self._log.log(level, "kvdock: " + fmt, *args)

    def error(self, kind, fmt, *args):
        self.warn(kind, fmt, *args, level=logging.ERROR)


def completion_bound_s(timeout_ms):
    """How long a waiter waits for one completion before it takes the
    linker for broken: every step of a load or an offload (its copies, its
    release or publish round trip, a reconnection) is bounded by
    timeout_ms, so a completion never takes four of them; the margin is
    for a loaded machine."""
    return 4 * timeout_ms / 1000.0 + 1.0


class Completions:
    """One completion queue of a linker (``pop`` is its
    pop_completed_loads or pop_completed_offloads) shared by the threads
    that wait on it: whoever polls files every id popped, each waiter takes
    its own, and ids nobody waits for any more are dropped when they come.

    A waiter that stops waiting before its id came back must not give the
    rows the load or offload names back to its engine: the library may
    still copy into (or out of) them. wait() therefore waits up to
    completion_bound_s, past which libkvdock broke its own bound (logged as
    an error); and when the linker is closed, everything pending failed."""

    def __init__(self, pop, log=None):
        self._pop = pop
        self._log = log or RateLimitedLog()
        self._lock = threading.Lock()
        self._done = {}
        self._abandoned = set()
        self._closed = False

    def _poll_locked(self):
        if self._closed:
            return
        try:
            popped = self._pop(256)
        except ClosedError:
            self._closed = True  # close() failed every pending one
            return
        except KvdockError as e:
            self._log.warn("pop", "popping completions failed: %s", e)
            return
        for cid, ok in popped:
            if cid in self._abandoned:
                self._abandoned.discard(cid)
            else:
                self._done[cid] = ok

    def poll(self):
        """Files what the queue has now; {id: success} of every id back
        and not taken yet (taken by this call)."""
        with self._lock:
            self._poll_locked()
            done, self._done = self._done, {}
        return done

    def take(self, ids):
        """{id: success} of those of ids that are back now (taken), without
        waiting."""
        with self._lock:
            self._poll_locked()
            got = {}
            for cid in ids:
                if cid in self._done:
                    got[cid] = self._done.pop(cid)
            return got

    def wait(self, ids, timeout_s):
        """{id: success} for every id: those back within timeout_s as
        they came; the others (the linker closed, or past its bound)
        False, and forgotten when they come back late."""
        want = set(ids)
        got = {}
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        while want:
            with self._lock:
                self._poll_locked()
                for cid in list(want):
                    if cid in self._done:
                        got[cid] = self._done.pop(cid)
                        want.discard(cid)
                if want and (self._closed or time.monotonic() >= deadline):
                    if not self._closed:
                        self._log.error("bound", "%d completions did not come back within "
                                        "%.1f s: libkvdock broke its bound; their rows may "
                                        "still be copied", len(want), timeout_s)
                    self._abandoned |= want
                    for cid in want:
                        got[cid] = False
                    return got
            if want:
                # a completion follows the copies within a round trip (the
                # release or publish): yield first, then sleep a little
                # longer each time, at most 1 ms
                waited = time.monotonic() - t0
                time.sleep(0 if waited < 0.005 else min(0.001, waited / 20))
        return got

    def forget(self, ids):
        """Nobody waits for these any more (a reset): drop them when they
        come."""
        with self._lock:
            for cid in ids:
                if self._done.pop(cid, None) is None:
                    self._abandoned.add(cid)

    def reset(self):
        with self._lock:
            self._done.clear()
            self._abandoned.clear()


def load_whole(linker, rid, transfers):
    """LOAD, PREPARE and COMMIT of rid with every page of every transfer
    adopted (an engine whose rows were allocated for this load alone, with
    no tree between). On a LOAD that fails, the load is ABORTed (its
    device indices go back through the pools' free_indices) and the LOAD's
    error raised. The copies start at the next start_layer_wise_loading."""
    transfers = list(transfers)
    try:
        linker.load(rid, transfers)
    except KvdockError:
        try:
            linker.abort(rid)
        except KvdockError:
            pass  # nothing recorded (an invalid load), or gone with the connection
        raise
    linker.prepare(rid)
    linker.commit(rid, [Commit(0, t.n_keys) for t in transfers])
