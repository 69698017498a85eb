"""kvdock's exceptions: one class per kvd_status_t of kvd_status.h.

Every failed call of the binding raises a subclass of KvdockError named
after the C status, carrying the status (``.status``, the negative C value)
and the reason in words (``.message``: the daemon's own text where it gave
one, else the status' description).
"""

import builtins


class KvdockError(Exception):
    """A libkvdock call failed: ``status`` is the kvd_status_t, ``message``
    the reason."""

    status = 0
    c_name = "KVD_ERR"

    def __init__(self, status=None, message=""):
        if status is None:
            status = type(self).status
        self.status = int(status)
        self.message = message or ""
        super().__init__(self.message if self.message else self.c_name)

    def __str__(self):
        return "%s (%s)" % (self.message, self.c_name) if self.message else self.c_name


def _make(name, status, c_name, doc, *bases):
    cls = type(name, (KvdockError,) + bases, {"status": status, "c_name": c_name, "__doc__": doc})
    return cls


InvalidError = _make("InvalidError", -1, "KVD_ERR_INVALID", "bad argument or malformed input", ValueError)
NoMemError = _make("NoMemError", -2, "KVD_ERR_NOMEM", "an allocation failed", MemoryError)
IoError = _make("IoError", -3, "KVD_ERR_IO", "a system call failed", OSError)
NotFoundError = _make("NotFoundError", -4, "KVD_ERR_NOT_FOUND", "no such key, namespace or file", LookupError)
ExistsError = _make("ExistsError", -5, "KVD_ERR_EXISTS", "already there")
BusyError = _make("BusyError", -6, "KVD_ERR_BUSY", "held by someone else (in flight)")
NoSpaceError = _make("NoSpaceError", -7, "KVD_ERR_NO_SPACE", "the pool or a table is full")
TimeoutError = _make("TimeoutError", -8, "KVD_ERR_TIMEOUT", "a bounded wait ran out", builtins.TimeoutError)
ProtocolError = _make("ProtocolError", -9, "KVD_ERR_PROTOCOL", "a frame or message broke the protocol")
UnsupportedError = _make("UnsupportedError", -10, "KVD_ERR_UNSUPPORTED", "not built in or not available here")
ClosedError = _make("ClosedError", -11, "KVD_ERR_CLOSED", "the peer closed the connection (or the handle is closed)")
TooLargeError = _make("TooLargeError", -12, "KVD_ERR_TOO_LARGE", "over a configured limit")
StateError = _make("StateError", -13, "KVD_ERR_STATE", "not allowed in the current state")
PermissionDeniedError = _make("PermissionDeniedError", -14, "KVD_ERR_PERMISSION", "the OS said no", builtins.PermissionError)
UnavailableError = _make("UnavailableError", -15, "KVD_ERR_UNAVAILABLE", "the daemon is not there or not ready")
UnknownMethodError = _make("UnknownMethodError", -16, "KVD_ERR_UNKNOWN_METHOD", "an RPC method the daemon does not know")
DrainingError = _make("DrainingError", -17, "KVD_ERR_DRAINING", "the daemon is shutting down")
AuthError = _make("AuthError", -18, "KVD_ERR_AUTH", "no credential, or one the daemon refuses")
QuotaError = _make("QuotaError", -19, "KVD_ERR_QUOTA", "over the tenant's quota")
CorruptError = _make("CorruptError", -20, "KVD_ERR_CORRUPT", "stored bytes failed their checksum")
NoDeviceError = _make("NoDeviceError", -21, "KVD_ERR_NO_DEVICE", "the memory kind's runtime or device is not here")
NotDeviceError = _make("NotDeviceError", -22, "KVD_ERR_NOT_DEVICE", "memory declared of a device kind is not")
DeviceError = _make("DeviceError", -23, "KVD_ERR_DEVICE", "a device runtime call failed")


class CallbackError(KvdockError):
    """A Python callback the library ran (a pool's free_indices) raised.
    The call that ran it finished its own work first; ``__cause__`` is the
    callback's exception."""

    c_name = "callback raised"


_BY_STATUS = {c.status: c for c in (
    InvalidError, NoMemError, IoError, NotFoundError, ExistsError, BusyError, NoSpaceError,
    TimeoutError, ProtocolError, UnsupportedError, ClosedError, TooLargeError, StateError,
    PermissionDeniedError, UnavailableError, UnknownMethodError, DrainingError, AuthError,
    QuotaError, CorruptError, NoDeviceError, NotDeviceError, DeviceError)}


def error_class(status):
    """The KvdockError subclass of a kvd_status_t (KvdockError itself for a
    code this package does not know)."""
    return _BY_STATUS.get(int(status), KvdockError)


__all__ = ["KvdockError", "CallbackError", "error_class"] + [c.__name__ for c in _BY_STATUS.values()]
