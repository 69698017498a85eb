#!/usr/bin/python3
"""bench_binding.py - what the kvdock Python binding costs over libkvdock's
C calls, measured in one run against the C figures of the same run.

1. Lookup of 256 stored page keys (one paged pool, ALL_PAGES), back to
   back: p50 and p99 of the call from Python (kvdock.Linker.lookup, the
   Transfer built in the call as an engine does, and reused) against the
   same kvd_lookup from C (a small C program built here against the same
   libkvdock, on the same daemon, the two taking turns in rounds), and the
   bare ctypes call with its arguments prepared once (the floor of any
   ctypes binding). Goal: Python p50 within 1.3 x C.

2. Load GB/s for the layouts of `kvdock-bench linker` (bench_linker.c:
   page 64, bf16; mha 32 layers of K and V 8 x 128; mla 61 layers of one
   576-wide latent, rank-replicated; hybrid 12 attention layers as mha
   plus 36 mamba layers of 64 KiB + 8 KiB state, a node every 8 pages),
   32 pages, the same run structure (offload fresh keys, wait, wipe the
   device buffers, then load: LOAD, PREPARE, COMMIT all adopted,
   layer-wise loading, a wait per layer, the completed-loads queue),
   device buffers as torch tensors. The C bench runs first in the same
   invocation (`kvdock-bench linker`, which starts its own daemon with
   the same settings as the one started here: --pool-size 3G
   --usage-interval 0 --populate-rate 0). Goal: Python best load GB/s
   within 0.9 x C's best.

Usage (Debian's interpreter; a release build tree):
  meson setup build-bench --buildtype=release -Dtests=disabled && ninja -C build-bench -j2
  /usr/bin/python3 bench/python/bench_binding.py --build build-bench [--rounds 2]
      [--pages 32] [--runs 5] [--lookups 2000] [--pool 3G] [--profile]

--profile prints where Python's time goes (cProfile) in the lookup loop
and in one load. Benchmarks measure; they assert nothing.
"""

import argparse
import cProfile
import ctypes
import os
import pstats
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

PAGE = 64
LAYOUTS = {  # name: attn layers, attn buffers, attn row bytes, replicated, mamba layers, a, b, pages/node
    "mha": (32, 2, 8 * 128 * 2, False, 0, 0, 0, 0),
    "mla": (61, 1, 576 * 2, True, 0, 0, 0, 0),
    "hybrid": (12, 2, 8 * 128 * 2, False, 36, 64 * 1024, 8 * 1024, 8),
}

LOOKUP_C = r"""
/* kvd_lookup of the keys in a file, back to back: p50 p99 mean (us). */
#include "kvdock.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static uint64_t now_ns(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b; return (x > y) - (x < y);
}
int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: socket model keys n_keys iters rounds\n"); return 2; }
    size_t nk = strtoul(argv[4], 0, 10), iters = strtoul(argv[5], 0, 10);
    int rounds = atoi(argv[6]);
    uint8_t (*keys)[KVD_PAGE_KEY_BYTES] = malloc(nk * KVD_PAGE_KEY_BYTES);
    FILE *f = fopen(argv[3], "rb");
    if (!f || fread(keys, KVD_PAGE_KEY_BYTES, nk, f) != nk) { perror("keys"); return 1; }
    fclose(f);
    kvd_linker_config_t cfg = {.socket_path = argv[1], .model_id = argv[2], .timeout_ms = 30000};
    kvd_linker_t *lk = NULL;
    int rc = kvd_linker_open(&cfg, &lk);
    if (rc) { fprintf(stderr, "open: %s\n", kvd_strerror(rc)); return 1; }
    static uint8_t rows[PAGE_ROWS * 16];
    kvd_pool_layer_t layer = {.layer_id = 0, .n_buffers = 1, .buffers = {{rows, 16, 16}}};
    kvd_pool_desc_t d = {.name = "kv", .addressing = KVD_ADDR_PAGED, .page_size = PAGE,
                         .n_rows = PAGE_ROWS, .memory = KVD_MEM_HOST, .n_layers = 1,
                         .layers = &layer};
    uint32_t pid;
    if ((rc = kvd_register_pool(lk, &d, &pid))) { fprintf(stderr, "register: %s\n", kvd_strerror(rc)); return 1; }
    kvd_transfer_t t = {.pool_id = pid, .keys = (const uint8_t (*)[KVD_PAGE_KEY_BYTES])keys, .n_keys = nk};
    uint32_t *b = malloc((nk + 1) * sizeof(uint32_t));
    uint64_t *lat = malloc(iters * sizeof(uint64_t));
    size_t nb;
    char line[64];
    for (int r = 0; r < rounds; r++) {
        /* each round waits for a line on stdin: the caller takes turns */
        if (!fgets(line, sizeof(line), stdin)) break;
        for (size_t i = 0; i < 50; i++) kvd_lookup(lk, i, &t, 1, b, &nb); /* warm-up */
        double sum = 0;
        for (size_t i = 0; i < iters; i++) {
            uint64_t t0 = now_ns();
            rc = kvd_lookup(lk, i, &t, 1, b, &nb);
            lat[i] = now_ns() - t0;
            sum += (double)lat[i];
            if (rc || nb != nk) { fprintf(stderr, "lookup: %d, %zu boundaries\n", rc, nb); return 1; }
        }
        for (size_t i = 0; i < iters; i++) printf("%llu\n", (unsigned long long)lat[i]);
        printf("end\n");
        fflush(stdout);
    }
    kvd_linker_close(lk);
    return 0;
}
"""


def percentile(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[k]


def mix_tokens(seed, n):
    """n token ids from seed (deterministic, fresh per run)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32)


class Daemon:
    """A kvdockd with the C bench's settings on a temporary socket."""

    def __init__(self, kvdockd, pool_size):
        self.dir = tempfile.mkdtemp(prefix="kvdock-pybench-")
        self.socket = os.path.join(self.dir, "kvdockd.sock")
        self.log = open(os.path.join(self.dir, "kvdockd.log"), "wb")
        self.proc = subprocess.Popen(
            [kvdockd, "--socket", self.socket, "--instance", "pybench-%d" % os.getpid(),
             "--pool-size", pool_size, "--usage-interval", "0", "--populate-rate", "0"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        import kvdock

        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("kvdockd exited: see %s" % self.log.name)
            try:
                with kvdock.Linker(socket_path=self.socket, timeout_ms=2000) as lk:
                    if lk.health()[0] == "ready":
                        return
            except kvdock.KvdockError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("kvdockd not ready after 120 s")
            time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def pop_one(pop, want, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pop(1)
        if got:
            return got[0][0] == want and got[0][1]
        time.sleep(20e-6)
    return False


# -------------------------------------------------------------- lookup

def bench_lookup(args, daemon, build):
    import numpy as np

    import kvdock

    n_keys, iters = 256, args.lookups
    lk = kvdock.Linker(socket_path=daemon.socket, model_id="lookup", timeout_ms=30000)
    rows = np.zeros((n_keys * PAGE, 16), np.uint8)
    pool = lk.register_pool("kv", {0: [rows]}, page_size=PAGE)
    keys = kvdock.page_keys(mix_tokens(7, n_keys * PAGE), PAGE)
    ack = lk.offload(kvdock.Transfer(pool, keys, indices=np.arange(n_keys * PAGE)))
    if not pop_one(lk.pop_completed_offloads, ack):
        raise RuntimeError("the lookup bench's offload failed")
    assert lk.lookup(0, [kvdock.Transfer(pool, keys)]) == list(range(1, n_keys + 1))

    # the C reference, built here against the same libkvdock
    tmp = tempfile.mkdtemp(prefix="kvdock-pybench-c-")
    keyfile = os.path.join(tmp, "keys")
    with open(keyfile, "wb") as f:
        f.write(b"".join(keys))
    src, exe = os.path.join(tmp, "lookup.c"), os.path.join(tmp, "lookup")
    with open(src, "w") as f:
        f.write(LOOKUP_C)
    libdir = os.path.join(build, "linker")
    cc = subprocess.run(["cc", "-O2", "-DPAGE=%d" % PAGE, "-DPAGE_ROWS=%d" % (n_keys * PAGE),
                         "-I", os.path.join(REPO, "linker"), "-I", os.path.join(REPO, "common"),
                         src, "-o", exe, "-L", libdir, "-lkvdock", "-Wl,-rpath," + libdir],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if cc.returncode != 0:
        raise RuntimeError("cannot build the C lookup reference:\n" + cc.stdout.decode())
    cproc = subprocess.Popen([exe, daemon.socket, "lookup", keyfile, str(n_keys), str(iters),
                              str(args.lookup_rounds * 2)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)

    def c_round():
        cproc.stdin.write("go\n")
        cproc.stdin.flush()
        out = []
        for line in cproc.stdout:
            if line.strip() == "end":
                return out
            out.append(int(line) / 1000.0)
        raise RuntimeError("the C lookup reference stopped")

    blob = b"".join(keys)

    def py_round(how):
        out = []
        t_reused = kvdock.Transfer(pool, keys)
        for i in range(50):
            lk.lookup(i, [t_reused])
        clock = time.perf_counter_ns
        for i in range(iters):
            if how == "list":
                t0 = clock()
                b = lk.lookup(i, [kvdock.Transfer(pool, keys)])
                dt = clock() - t0
            elif how == "block":
                t0 = clock()
                b = lk.lookup(i, [kvdock.Transfer(pool, blob)])
                dt = clock() - t0
            elif how == "lookup_keys":
                t0 = clock()
                b = lk.lookup_keys(i, pool, blob)
                dt = clock() - t0
            else:
                t0 = clock()
                b = lk.lookup(i, [t_reused])
                dt = clock() - t0
            out.append(dt / 1000.0)
        assert len(b) == n_keys
        return out

    def raw_round():
        # ctypes with everything prepared once: the floor of a ctypes binding
        lib = kvdock._lib.lib()
        blob = b"".join(keys)
        field = dict(kvdock._lib.Transfer._fields_)["keys"]  # char * (or uint8_t * before)
        t = kvdock._lib.Transfer(pool_id=pool.id, n_keys=n_keys,
                                 keys=blob if field is ctypes.c_char_p else ctypes.cast(blob, field))
        outb = (ctypes.c_uint32 * (n_keys + 1))()
        nb = ctypes.c_size_t()
        h = ctypes.c_void_p(lk._handle)
        tp, nbp = ctypes.byref(t), ctypes.byref(nb)
        fn = lib.kvd_lookup
        out = []
        clock = time.perf_counter_ns
        for i in range(iters):
            t0 = clock()
            fn(h, i, tp, 1, outb, nbp)
            out.append((clock() - t0) / 1000.0)
        assert nb.value == n_keys
        return out

    methods = [("Python, Transfer of a key list", lambda: py_round("list")),
               ("Python, Transfer of a key block", lambda: py_round("block")),
               ("Python, Transfer reused", lambda: py_round("reused")),
               ("Python, lookup_keys of a block", lambda: py_round("lookup_keys")),
               ("ctypes, arguments prepared once", raw_round)]
    res = {"C kvd_lookup": []}
    res.update({name: [] for name, _ in methods})
    turn_ratio = {name: [] for name, _ in methods}  # each turn's p50 / the C turns' around it
    for _ in range(args.lookup_rounds):
        before = c_round()
        got = {name: fn() for name, fn in methods}
        after = c_round()
        c_p50 = (statistics.median(before) + statistics.median(after)) / 2
        res["C kvd_lookup"] += before + after
        for name, vals in got.items():
            res[name] += vals
            turn_ratio[name].append(statistics.median(vals) / c_p50)
    cproc.stdin.close()
    cproc.wait(30)
    shutil.rmtree(tmp, ignore_errors=True)

    print("\nLookup of %d stored keys, %d calls per method and turn, %d turns (C twice "
          "a turn, around the Python ones):" % (n_keys, iters, args.lookup_rounds))
    print("%-34s %8s %8s %8s %8s %8s %16s" % ("method", "p50 us", "p99 us", "mean us",
                                              "p50/C", "p99/C", "turns' p50/C"))
    c_sorted = sorted(res["C kvd_lookup"])
    c50, c99 = percentile(c_sorted, 0.5), percentile(c_sorted, 0.99)
    summary = {}
    for name, vals in res.items():
        s = sorted(vals)
        p50, p99 = percentile(s, 0.5), percentile(s, 0.99)
        summary[name] = (p50, p99)
        tr = sorted(turn_ratio.get(name, []))
        spread = "%.2f (%.2f-%.2f)" % (statistics.median(tr), tr[0], tr[-1]) if tr else ""
        print("%-34s %8.1f %8.1f %8.1f %8.2f %8.2f %16s" % (
            name, p50, p99, statistics.fmean(vals), p50 / c50, p99 / c99, spread))
    if args.profile:
        print("\ncProfile of %d Python lookups (a Transfer of the key list per call):" % iters)
        prof = cProfile.Profile()
        prof.enable()
        for i in range(iters):
            lk.lookup(i, [kvdock.Transfer(pool, keys)])
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    lk.close()
    return summary


# ---------------------------------------------------------------- load

class Device:
    """A layout's device buffers as torch tensors (host memory standing in
    for the GPU's), as bench_linker.c allocates them."""

    def __init__(self, layout, pages):
        import torch

        # fills on this thread alone, as the C bench's memset: torch's
        # OpenMP workers keep spinning after a parallel fill and took the
        # CPU from the linker's copy that follows
        torch.set_num_threads(1)

        (self.attn_layers, self.attn_bufs, self.attn_row, self.replicated, self.mamba_layers,
         self.mamba_a, self.mamba_b, self.ppn) = LAYOUTS[layout]
        self.pages = pages
        self.nodes = pages // self.ppn if self.ppn else 0
        rows = pages * PAGE
        elems = self.attn_row // 2
        self.attn = [[torch.full((rows, elems), 3, dtype=torch.bfloat16)
                      for _ in range(self.attn_bufs)] for _ in range(self.attn_layers)]
        self.mamba = [[torch.zeros(self.nodes, self.mamba_a // 4, dtype=torch.float32),
                       torch.zeros(self.nodes, self.mamba_b // 2, dtype=torch.bfloat16)]
                      for _ in range(self.mamba_layers)]
        self.bytes = (self.attn_layers * self.attn_bufs * rows * self.attn_row +
                      self.mamba_layers * self.nodes * (self.mamba_a + self.mamba_b))

    def register(self, lk):
        import kvdock

        attn = lk.register_pool("kv", {2 * l: self.attn[l] for l in range(self.attn_layers)},
                                page_size=PAGE, rank_replicated=self.replicated)
        mamba = None
        if self.mamba_layers:
            mamba = lk.register_pool("mamba", {2 * l + 1: self.mamba[l]
                                               for l in range(self.mamba_layers)},
                                     addressing=kvdock.SLOT, trailing_pages=1)
        return attn, mamba

    def fill(self, value):
        for bufs in self.attn:
            for t in bufs:
                t.fill_(value)
        for bufs in self.mamba:
            for t in bufs:
                t.fill_(value)


def one_load(lk, dev, attn, mamba, seed, profile=None):
    """One offload and load of fresh pages (as bench_linker.c's one_run);
    (load GB/s, first layer ms, offload GB/s)."""
    import numpy as np

    import kvdock

    pages, rows = dev.pages, dev.pages * PAGE
    keys = kvdock.page_keys(mix_tokens(seed, rows), PAGE)
    idx = np.arange(rows, dtype=np.int64)
    node_keys = [keys[(n + 1) * dev.ppn - 1] for n in range(dev.nodes)]
    slots = np.arange(dev.nodes, dtype=np.int64)
    depths = [(n + 1) * dev.ppn - 1 for n in range(dev.nodes)]
    dev.fill(float(seed % 61 + 1))
    t = [kvdock.Transfer(attn, keys, indices=idx)]
    if mamba is not None:
        t.append(kvdock.Transfer(mamba, node_keys, indices=slots, depths=depths))
    t0 = time.perf_counter()
    ack = lk.offload(t)
    if not pop_one(lk.pop_completed_offloads, ack):
        raise RuntimeError("offload failed")
    off_s = time.perf_counter() - t0
    dev.fill(0.0)
    rid = seed
    top = 2 * max(dev.attn_layers, dev.mamba_layers)
    if profile is not None:
        profile.enable()
    t0 = time.perf_counter()
    tr = [kvdock.Transfer(attn, keys, indices=idx)]
    commits = [(0, pages)]
    if mamba is not None:
        tr.append(kvdock.Transfer(mamba, node_keys, indices=slots))
        commits.append((0, 0))
    lk.load(rid, tr)
    lk.prepare(rid)
    lk.commit(rid, commits)
    counter = lk.start_layer_wise_loading()
    lk.wait_layer(counter, 0)
    first = time.perf_counter() - t0
    for layer in range(top):
        lk.wait_layer(counter, layer)
    ok = pop_one(lk.pop_completed_loads, rid)
    load_s = time.perf_counter() - t0
    if profile is not None:
        profile.disable()
    if not ok:
        raise RuntimeError("load failed")
    return dev.bytes / load_s / 1e9, first * 1e3, dev.bytes / off_s / 1e9


def bench_load_python(args, daemon, round_no):
    import kvdock

    out = {}
    for i, layout in enumerate(LAYOUTS):
        dev = Device(layout, args.pages)
        lk = kvdock.Linker(socket_path=daemon.socket, model_id=layout, timeout_ms=30000)
        attn, mamba = dev.register(lk)
        runs = [one_load(lk, dev, attn, mamba, 100000 * (round_no + 1) + 1000 * (i + 1) + r)
                for r in range(args.runs)]
        best = max(runs, key=lambda x: x[0])
        first = statistics.median(r[1] for r in runs)
        out[layout] = (dev.bytes, best[0], first, best[2])
        if args.profile and round_no == 0:
            prof = cProfile.Profile()
            one_load(lk, dev, attn, mamba, 777 + i, profile=prof)
            print("\ncProfile of one %s load from Python:" % layout)
            pstats.Stats(prof).sort_stats("tottime").print_stats(8)
        lk.close()
        del dev
    return out


def bench_load_c(args, build):
    """Runs `kvdock-bench linker` with the same pages, runs and pool; its
    rows as {layout: (bytes, offload, load GB/s, first ms, memcpy GB/s)}."""
    exe = os.path.join(build, "bench", "kvdock-bench")
    cmd = [exe, "linker", "--kvdockd", os.path.join(build, "daemon", "kvdockd"), "--pages",
           str(args.pages), "--runs", str(args.runs), "--pool", args.pool]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600)
    if r.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (" ".join(cmd), r.stdout))
    out = {}
    for line in r.stdout.splitlines():
        m = re.match(r"(mha|mla|hybrid)\s+([\d.]+ \w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+"
                     r"([\d.]+)", line)
        if m:
            out[m.group(1)] = (m.group(2), float(m.group(3)), float(m.group(4)),
                               float(m.group(5)), float(m.group(6)))
    return out, " ".join(os.path.relpath(c, REPO) if c.startswith(REPO) else c for c in cmd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build-bench"),
                    help="a release build tree (default: build-bench)")
    ap.add_argument("--pages", type=int, default=32)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="C then Python, this many times")
    ap.add_argument("--lookups", type=int, default=500,
                    help="lookups per method and turn (default 500)")
    ap.add_argument("--lookup-rounds", type=int, default=10,
                    help="turns of the lookup methods (default 10)")
    ap.add_argument("--pool", default="3G")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--skip-load", action="store_true")
    ap.add_argument("--skip-lookup", action="store_true")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    os.environ["KVDOCK_LIBRARY"] = os.path.join(build, "linker", "libkvdock.so")
    sys.path.insert(0, os.path.join(REPO, "python"))
    import kvdock

    print("kvdock %s from %s, Python %s" % (kvdock.version(), os.environ["KVDOCK_LIBRARY"],
                                           sys.version.split()[0]))
    kvdockd = os.path.join(build, "daemon", "kvdockd")
    if not args.skip_lookup:
        d = Daemon(kvdockd, args.pool)
        try:
            bench_lookup(args, d, build)
        finally:
            d.stop()
    if args.skip_load:
        return
    print("\nLoad, %d pages, best of %d runs; C (kvdock-bench linker) then Python, %d rounds:"
          % (args.pages, args.runs, args.rounds))
    print("%-5s %-6s %10s %11s %12s %7s %10s %11s %12s" % (
        "round", "layout", "bytes", "C load GB/s", "Py load GB/s", "Py / C", "C first ms",
        "Py first ms", "memcpy GB/s"))
    ratios = {k: [] for k in LAYOUTS}
    for rnd in range(args.rounds):
        c, cmd = bench_load_c(args, build)
        if rnd == 0:
            print("(C: %s)" % cmd)
        d = Daemon(kvdockd, args.pool)
        try:
            py = bench_load_python(args, d, rnd)
        finally:
            d.stop()
        for layout in LAYOUTS:
            cb, coff, cload, cfirst, cpy = c[layout]
            nbytes, pload, pfirst, _ = py[layout]
            ratios[layout].append(pload / cload)
            print("%-5d %-6s %10s %11.2f %12.2f %7.2f %10.2f %11.2f %12.2f" % (
                rnd, layout, cb, cload, pload, pload / cload, cfirst, pfirst, cpy))
    print("\nPython / C best load, per layout over the rounds: " + ", ".join(
        "%s %s" % (k, " ".join("%.2f" % r for r in v)) for k, v in ratios.items()))


if __name__ == "__main__":
    main()
