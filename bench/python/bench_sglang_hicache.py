#!/usr/bin/python3
"""The SGLang HiCache backend's own cost per page, for SGLang's 128-page
batches (STORAGE_BATCH_SIZE).

For each layout below it times, on one kvdockd started here:
  adapter  KvdockHiCacheStorage.batch_set_v1 / batch_get_v1 of 128 pages
           (hex page hashes, SGLang's host indices, everything the call does
           until it returns);
  raw      the same kvdock calls for the same bytes made directly through
           the binding (offload + its ack; load, prepare, commit, start,
           wait every layer, the completion), from bytes keys and int64
           indices made beforehand: what libkvdock costs;
and prints the medians per page and their difference, the adapter's
overhead. Each repetition uses fresh keys (a store writes, a load reads
what was just stored); adapter and raw take turns so that the machine's
noise falls on both. It measures and prints; it asserts nothing.

    KVDOCK_BUILD=build PYTHONPATH=python /usr/bin/python3 \\
        bench/python/bench_sglang_hicache.py [--reps 30] [--pool 1G]
"""

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import kvdock
from kvdock.sglang.hicache import HiCacheStorageConfig, KvdockHiCacheStorage

BATCH = 128

# name, layers, K/V buffers, heads, head_dim, page tokens, layout
LAYOUTS = [
    ("mha-small", 4, 2, 2, 64, 16, "layer_first"),     # 32 KiB a page
    ("mha", 8, 2, 8, 128, 16, "layer_first"),          # 512 KiB a page
    ("mha-pf", 8, 2, 8, 128, 16, "page_first"),        # 512 KiB, strided rows
    ("mla", 16, 1, 1, 576, 16, "page_first_direct"),   # 288 KiB, page rows
]


class HostPool:
    """The parts of an SGLang host pool the backend reads."""

    def __init__(self, layers, bufs, heads, dim, page, layout, pages):
        self.page_size, self.layout = page, layout
        size = pages * page
        if layout == "layer_first":
            shape = (layers, size, heads, dim)
        elif layout == "page_first":
            shape = (size, layers, heads, dim)
        else:
            shape = (pages, layers, page, heads, dim)
        self.k_buffer = torch.randn(shape).to(torch.bfloat16)
        if bufs == 2:
            self.v_buffer = torch.randn(shape).to(torch.bfloat16)


def start_daemon(pool_size):
    build = os.environ.get("KVDOCK_BUILD", "build")
    d = tempfile.mkdtemp(prefix="kvdock-bench-py-")
    sock = os.path.join(d, "kvdockd.sock")
    log = open(os.path.join(d, "kvdockd.log"), "wb")
    proc = subprocess.Popen([os.path.join(build, "daemon", "kvdockd"), "--socket", sock,
                             "--instance", "bench-py-%d" % os.getpid(), "--pool-size", pool_size],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    cli = os.path.join(build, "cli", "kvdock")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("kvdockd exited; see %s" % log.name)
        if subprocess.run([cli, "--socket", sock, "health"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0:
            return proc, sock, d
        time.sleep(0.1)
    proc.kill()
    sys.exit("kvdockd not ready")


def fresh_keys(tag, rep):
    """BATCH page hashes nobody stored: hex (SGLang's) and raw bytes."""
    raw = [hashlib.sha256(b"%s/%d/%d" % (tag.encode(), rep, i)).digest() for i in range(BATCH)]
    return [k.hex() for k in raw], raw


def wait_ids(pop, want):
    """Polls for one completion as the adapter does (yield for 5 ms, then
    sleeps of up to 1 ms): on 2 vCPUs a poller that only yields takes CPU
    from the linker's copying thread, and the raw figure would include it."""
    got = None
    t0 = time.monotonic()
    while got is None:
        for cid, ok in pop(64):
            if cid == want:
                got = ok
        if got is None:
            waited = time.monotonic() - t0
            time.sleep(0 if waited < 0.005 else min(0.001, waited / 20))
    return got


def raw_set(lk, pool, keys, idx):
    ack = lk.offload([kvdock.Transfer(pool, keys, indices=idx)])
    return wait_ids(lk.pop_completed_offloads, ack)


def raw_get(lk, pool, keys, idx, rid, layers):
    lk.load(rid, [kvdock.Transfer(pool, keys, indices=idx)])
    lk.prepare(rid)
    lk.commit(rid, [(0, len(keys))])
    c = lk.start_layer_wise_loading()
    for layer in layers:
        lk.wait_layer(c, layer)
    return wait_ids(lk.pop_completed_loads, rid)


def bench_layout(sock, spec, reps):
    name, layers, bufs, heads, dim, page, layout = spec
    host = HostPool(layers, bufs, heads, dim, page, layout, pages=2 * BATCH)
    sc = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                              attn_cp_size=1, is_mla_model=bufs == 1,
                              enable_storage_metrics=False,
                              is_page_first_layout=layout == "page_first",
                              model_name="bench-" + name,
                              extra_config={"interface_v1": 1, "socket_path": sock})
    be = KvdockHiCacheStorage(sc, {})
    be.register_mem_pool_host(host)
    view = be._kv
    # the raw side: the same tensors, its own linker and namespace
    lk = kvdock.Linker(socket_path=sock, model_id="raw-" + name, layer_group_size=1024)
    pool = lk.register_pool("kv", view.layers, page_size=view.kvdock_page_size,
                            rank_replicated=bufs == 1)
    src = torch.arange(0, BATCH * page, dtype=torch.int64)        # SGLang's host indices
    dst = torch.arange(BATCH * page, 2 * BATCH * page, dtype=torch.int64)
    src_raw, dst_raw = view.kvdock_indices(src), view.kvdock_indices(dst)
    t = {"a_set": [], "r_set": [], "a_get": [], "r_get": []}
    rid = 1 << 40
    for rep in range(reps + 1):  # rep 0 warms the pool's memory up
        hex_a, _ = fresh_keys("a-" + name, rep)
        _, raw_r = fresh_keys("r-" + name, rep)
        order = ("a", "r") if rep % 2 else ("r", "a")
        for who in order:
            t0 = time.perf_counter()
            if who == "a":
                ok = all(be.batch_set_v1(hex_a, src))
            else:
                ok = raw_set(lk, pool, raw_r, src_raw)
            dt = time.perf_counter() - t0
            assert ok, "%s set failed" % who
            if rep:
                t[who + "_set"].append(dt)
        for who in order:
            t0 = time.perf_counter()
            if who == "a":
                ok = all(be.batch_get_v1(hex_a, dst))
            else:
                rid += 1
                ok = raw_get(lk, pool, raw_r, dst_raw, rid, view.layer_ids)
            dt = time.perf_counter() - t0
            assert ok, "%s get failed" % who
            if rep:
                t[who + "_get"].append(dt)
    obj = view.pool.object_bytes
    be.close()
    lk.close()
    us = 1e6 / BATCH  # seconds a batch -> us a page
    med = {k: statistics.median(v) * us for k, v in t.items()}
    # the overhead: the median of each repetition's adapter - raw (the two
    # ran back to back, so a slow minute of the machine cancels out)
    for op in ("set", "get"):
        med[op + "_diff"] = statistics.median(
            a - r for a, r in zip(t["a_" + op], t["r_" + op])) * us
    return name, layout, obj, med


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--pool", default="1G", help="the daemon's --pool-size")
    args = ap.parse_args()
    proc, sock, d = start_daemon(args.pool)
    try:
        print("SGLang HiCache backend, %d-page batches, %d repetitions (medians), libkvdock %s"
              % (BATCH, args.reps, kvdock.version()))
        print("us per page: adapter = KvdockHiCacheStorage call, raw = the same kvdock calls "
              "through the binding")
        print("%-10s %-18s %9s | %9s %9s %9s | %9s %9s %9s" % (
            "layout", "host layout", "KiB/page", "set adpt", "set raw", "overhead",
            "get adpt", "get raw", "overhead"))
        for spec in LAYOUTS:
            name, layout, obj, m = bench_layout(sock, spec, args.reps)
            print("%-10s %-18s %9.0f | %9.1f %9.1f %9.1f | %9.1f %9.1f %9.1f" % (
                name, layout, obj / 1024, m["a_set"], m["r_set"], m["set_diff"],
                m["a_get"], m["r_get"], m["get_diff"]))
            sys.stdout.flush()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
