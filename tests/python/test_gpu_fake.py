"""The binding's device-memory calls on the fake CUDA driver of
tests/gpu/fake (host memory standing in for a GPU; its device memory
faults on any CPU access): a pool of raw CUDA buffers, an offload that
waits on the device for the engine's event, a load the engine's stream
waits for, and the pool's device stats. Each scenario runs in a child
interpreter of its own, because libkvdock loads a GPU runtime once per
process and the rest of the suite runs without one."""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import BUILD, REPO

FAKE = os.path.join(BUILD, "tests", "gpu", "fake", "libfakecuda.so.1")

CHILD = textwrap.dedent(r'''
    import ctypes, os, sys, time
    sys.path.insert(0, os.environ["KVD_TEST_PY"])
    import conftest  # sets up the package path and the daemon helper
    import kvdock

    cu = ctypes.CDLL(os.environ["KVDOCK_CUDA_LIBRARY"])
    def ok(rc, what):
        assert rc == 0, "%s: %d" % (what, rc)
    ok(cu.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    ok(cu.cuCtxSetCurrent(ctx), "set current")
    ROWS, BPR, PS = 64, 256, 4
    buf = ctypes.c_uint64()
    ok(cu.cuMemAlloc_v2(ctypes.byref(buf), ROWS * BPR), "cuMemAlloc")
    def write(row, data):
        ok(cu.cuMemcpyHtoD_v2(ctypes.c_uint64(buf.value + row * BPR), data, len(data)), "HtoD")
    def read(row, n):
        out = ctypes.create_string_buffer(n * BPR)
        ok(cu.cuMemcpyDtoH_v2(out, ctypes.c_uint64(buf.value + row * BPR), n * BPR), "DtoH")
        return out.raw
    stream, event = ctypes.c_void_p(), ctypes.c_void_p()
    ok(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    ok(cu.cuEventCreate(ctypes.byref(event), 2), "event")

    d = conftest.Daemon()
    try:
        lk = kvdock.Linker(socket_path=d.socket, model_id="pyfake", timeout_ms=10000)
        pool = lk.register_pool("kv", {0: [kvdock.RawBuffer(buf.value, ROWS, BPR,
                                                           memory="cuda")]}, page_size=PS)
        keys = kvdock.page_keys(list(range(16)), PS)
        want = bytes((i * 7 + 3) & 0xFF for i in range(16 * BPR))
        write(8, want)
        ok(cu.cuEventRecord(event, stream), "record")
        ack = lk.offload([kvdock.Transfer(pool, keys, indices=list(range(8, 24)))],
                         event=event.value)
        for _ in range(1000):
            done = lk.pop_completed_offloads()
            if done:
                break
            time.sleep(0.01)
        assert done == [(ack, True)], done
        lk.load(5, [kvdock.Transfer(pool, keys, indices=list(range(32, 48)))])
        lk.prepare(5)
        lk.commit(5, [kvdock.Commit(0, 4)])
        c = lk.start_layer_wise_loading()
        lk.wait_layer_on_stream(c, 0, stream.value)
        got = ctypes.create_string_buffer(16 * BPR)
        ok(cu.cuMemcpyDtoHAsync_v2(got, ctypes.c_uint64(buf.value + 32 * BPR), 16 * BPR,
                                   stream), "DtoHAsync")
        ok(cu.cuStreamSynchronize(stream), "sync")
        assert got.raw == want, "the stream read the rows before the load put them there"
        st = lk.pool_stats(pool)
        assert st["memory"] == "cuda", st
        assert st["dma_bytes"] + st["bounce_bytes"] == st["load_bytes"] + st["offload_bytes"] > 0
        # a host pool has nothing on a device to wait for
        import numpy
        host = lk.register_pool("host", {0: [numpy.zeros((ROWS, BPR), numpy.uint8)]},
                                page_size=PS)
        try:
            lk.offload([kvdock.Transfer(host, keys[:1], indices=[0, 1, 2, 3])],
                       stream=stream.value)
            raise AssertionError("offload after a stream on a host pool was taken")
        except kvdock.InvalidError:
            pass
        lk.close()
    finally:
        d.cleanup()
    print("child ok")
''')


@pytest.mark.skipif(not os.path.exists(FAKE), reason="the fake CUDA driver is not built "
                    "(no cuda.h at build time)")
def test_device_pool_calls_on_the_fake_cuda_driver():
    env = dict(os.environ, KVDOCK_CUDA_LIBRARY=FAKE, FAKEGPU_COPY_DELAY_US="5000",
               KVD_TEST_PY=os.path.join(REPO, "tests", "python"))
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "child ok" in r.stdout, r.stdout + r.stderr
