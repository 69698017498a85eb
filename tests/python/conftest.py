"""Fixtures of the Python suite: kvdockd daemons started on temporary Unix
sockets (stopped by their pid at teardown), and linkers closed at teardown.

The build tree is $KVDOCK_BUILD (default: <repo>/build); the package is the
source tree's python/ (put first on sys.path here), so the suite tests what
was just built. Binaries: $KVDOCKD and $KVDOCK, else the build tree's.
"""

import ctypes
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
os.environ.setdefault("KVDOCK_BUILD", os.path.join(REPO, "build"))
BUILD = os.environ["KVDOCK_BUILD"]
KVDOCKD = os.environ.get("KVDOCKD") or os.path.join(BUILD, "daemon", "kvdockd")
KVDOCK = os.environ.get("KVDOCK") or os.path.join(BUILD, "cli", "kvdock")

import kvdock  # noqa: E402  (after the path is set)

_seq = itertools.count()
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    # a test run that dies does not leave its daemons behind
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Daemon:
    """One kvdockd of a test: ``socket``, ``pid``, ``log`` (its output),
    ``dir``; stop(), kill() (SIGKILL), restart() (same socket and args)."""

    def __init__(self, *extra_args, pool_size="256M", ready_timeout=60.0):
        # the pool file, its journal and lock go here too (--shm-dir), in
        # /dev/shm where there is one: restart() finds the same objects,
        # cleanup() removes them
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = tempfile.mkdtemp(prefix="kvdock-py-", dir=shm)
        self.socket = os.path.join(self.dir, "kvdockd.sock")
        self.log = os.path.join(self.dir, "kvdockd.log")
        self.instance = "py-%d-%d" % (os.getpid(), next(_seq))
        self.args = [KVDOCKD, "--socket", self.socket, "--instance", self.instance,
                     "--shm-dir", self.dir,
                     "--pool-size", pool_size] + [str(a) for a in extra_args]
        env_args = os.environ.get("KVDOCK_TEST_DAEMON_ARGS", "").split()
        self.args += env_args
        self.proc = None
        self.ready_timeout = ready_timeout
        self.start()

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def start(self, wait_ready=True, fresh=False):
        """Starts the daemon (again: on its pool file and journal, so what
        was published is back, unless fresh)."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args + (["--fresh"] if fresh else []), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        if wait_ready:
            self.wait_ready()

    def wait_ready(self):
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kvdockd exited (%s) before it was ready:\n%s"
                                   % (self.proc.returncode, self.read_log()))
            r = subprocess.run([KVDOCK, "--socket", self.socket, "--timeout", "2000"]
                               + self._token_args() + ["health"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError("kvdockd not ready after %.0f s:\n%s" % (self.ready_timeout,
                                                                   self.read_log()))

    def _token_args(self):
        # a daemon that wants a token answers Health only with it
        if "--auth-token-file" in self.args:
            return ["--token-file", self.args[self.args.index("--auth-token-file") + 1]]
        return []

    def read_log(self):
        try:
            with open(self.log, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def cli(self, *args, check=True):
        """Runs the kvdock CLI against this daemon; its CompletedProcess."""
        r = subprocess.run([KVDOCK, "--socket", self.socket] + self._token_args()
                           + [str(a) for a in args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        if check and r.returncode != 0:
            raise RuntimeError("kvdock %s: exit %d: %s" % (" ".join(map(str, args)), r.returncode,
                                                           r.stderr.decode()))
        return r

    def stop(self, sig=signal.SIGTERM, timeout=30.0):
        """Signals the daemon and waits for it (SIGKILL past timeout);
        its exit status, or None when it was not running."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        rc, self.proc = self.proc.returncode, None
        return rc

    def kill(self):
        return self.stop(signal.SIGKILL)

    def restart(self, wait_ready=True, fresh=False):
        self.stop()
        self.start(wait_ready, fresh)

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def daemon_factory():
    made = []

    def make(*extra_args, **kw):
        d = Daemon(*extra_args, **kw)
        made.append(d)
        return d

    yield make
    for d in made:
        d.cleanup()


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory()


@pytest.fixture
def linker_factory():
    made = []

    def make(daemon, **cfg):
        cfg.setdefault("timeout_ms", 10000)
        lk = kvdock.Linker(socket_path=daemon.socket, **cfg)
        made.append(lk)
        return lk

    yield make
    for lk in made:
        lk.close()
