/*
 * Description: the fake GPU runtimes (tests/gpu/fake/) behave as a device
 * does where the linker's GPU path depends on it, and are strict where a
 * device only sometimes punishes a mistake. Run once per fake (the
 * runtime KVDOCK_TEST_GPU names); on a real runtime the cases that state a
 * device's behaviour run too, and those of the fake's knobs skip.
 *
 * A device's behaviour: async copies land in stream order and only when
 * their stream gets to them (a gate, a host function the test holds,
 * stops the stream deterministically); an event is not ready before its
 * stream reaches it and ready after; a stream that waits for another's
 * event holds its copies until then; the CPU touching device memory dies
 * of SIGSEGV; a thread with no context bound is refused (CUDA); a pointer
 * the runtime does not know has memory type 0 (CUDA) or is an error (HIP);
 * a batch of copies (CUDA 13's cuMemcpyBatchAsync_v2) lands in stream
 * order.
 * The fake's own: FAKEGPU_COPY_DELAY_US delays each copy; a copy that
 * leaves its allocation or whose host side is device memory is refused
 * and the stream stays in error; FAKEGPU_FAIL_COPY fails a copy while it
 * runs; FAKEGPU_REGISTER_FAIL and FAKEGPU_REGISTER_MAX fail registration;
 * copies are counted as pinned or pageable by their host side; a batch
 * (CUDA) runs whole or is refused whole, and reads a DURING_API_CALL
 * source in the call; a freed allocation's addresses are refused; a copy
 * into read-only registered memory fails.
 */
#include "gpu_test.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROW 4096

/* The runtimes' codes the cases expect (the same numbers in both). */
enum { ERR_INVALID_VALUE = 1, ERR_OUT_OF_MEMORY = 2, ERR_ILLEGAL_ADDRESS = 700 };

#define SKIP_UNLESS_FAKE()                                                         \
    do {                                                                           \
        if (!gt_is_fake()) {                                                       \
            print_message("skipped: a knob of the fake, not on a real runtime\n"); \
            skip();                                                                \
        }                                                                          \
    } while (0)

static unsigned char *filled(size_t n, int byte)
{
    unsigned char *p = malloc(n);
    assert_non_null(p);
    memset(p, byte, n);
    return p;
}

/* Whether the n bytes at p all equal byte. */
static bool all(const unsigned char *p, size_t n, int byte)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)byte)
            return false;
    return true;
}

/* Whether device memory dev holds n bytes of byte (a synchronous read,
 * which waits for no stream). */
static bool dev_all(const void *dev, size_t n, int byte)
{
    unsigned char *h = filled(n, 0x5a);
    gt_read(h, dev, n);
    bool r = all(h, n, byte);
    free(h);
    return r;
}

/* Copies on one stream run in the order they were queued, and only when the
 * stream gets to them. */
static void test_stream_order(void **state)
{
    (void)state;
    unsigned char *dev = gt_alloc(ROW);
    void *s = gt_stream_create();
    void *e = gt_event_create();
    unsigned char *a = filled(ROW, 0xa1), *b = filled(ROW, 0xb2);
    unsigned char *seen_a = filled(ROW, 0), *seen_b = filled(ROW, 0);

    gt_gate_t *gate = gt_gate(s);
    gt_write_async(dev, a, ROW, s);
    gt_read_async(seen_a, dev, ROW, s);
    gt_write_async(dev, b, ROW, s);
    gt_read_async(seen_b, dev, ROW, s);
    gt_event_record(e, s);
    /* the gate holds the stream: nothing of it has run */
    assert_false(gt_event_done(e));
    assert_true(dev_all(dev, ROW, 0));
    assert_true(all(seen_a, ROW, 0));
    gt_gate_open(gate);
    gt_event_sync(e);
    assert_true(gt_event_done(e));
    assert_true(all(seen_a, ROW, 0xa1));
    assert_true(all(seen_b, ROW, 0xb2));
    assert_true(dev_all(dev, ROW, 0xb2));

    gt_event_destroy(e);
    gt_stream_destroy(s);
    gt_free(dev);
    free(a);
    free(b);
    free(seen_a);
    free(seen_b);
}

/* An event never recorded is ready; recorded, it is not until its stream
 * reaches it; after, it is, and stays so. */
static void test_event_query(void **state)
{
    (void)state;
    void *s = gt_stream_create();
    void *e = gt_event_create();
    assert_true(gt_event_done(e));
    gt_gate_t *gate = gt_gate(s);
    gt_event_record(e, s);
    assert_false(gt_event_done(e));
    assert_false(gt_event_done(e));
    gt_gate_open(gate);
    gt_stream_sync(s);
    assert_true(gt_event_done(e));
    gt_event_sync(e);
    assert_true(gt_event_done(e));
    gt_event_destroy(e);
    gt_stream_destroy(s);
}

/* A stream that waits for an event of another stream holds its copies until
 * that stream has reached the event; a wait for an event never recorded
 * holds nothing. */
static void test_stream_wait(void **state)
{
    (void)state;
    unsigned char *dev = gt_alloc(ROW);
    void *s1 = gt_stream_create(), *s2 = gt_stream_create();
    void *e1 = gt_event_create(), *e2 = gt_event_create(), *never = gt_event_create();
    unsigned char *c = filled(ROW, 0xc3);

    gt_stream_wait_event(s2, never);
    gt_gate_t *gate = gt_gate(s1);
    gt_event_record(e1, s1);
    gt_stream_wait_event(s2, e1);
    gt_write_async(dev, c, ROW, s2);
    gt_event_record(e2, s2);
    assert_false(gt_event_done(e2));
    assert_true(dev_all(dev, ROW, 0));
    gt_gate_open(gate);
    gt_event_sync(e2);
    assert_true(gt_event_done(e1));
    assert_true(dev_all(dev, ROW, 0xc3));

    gt_event_destroy(e1);
    gt_event_destroy(e2);
    gt_event_destroy(never);
    gt_stream_destroy(s1);
    gt_stream_destroy(s2);
    gt_free(dev);
    free(c);
}

/* In a child: the default action for SIGSEGV (a sanitizer's handler would
 * report and exit instead of dying of the signal) and no core file, then
 * a read (write: a write) of p. */
static void touch_in_child(volatile unsigned char *p, bool write)
{
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &dfl, NULL);
    if (write)
        p[ROW / 2] = 1;
    else
        (void)p[0];
    _exit(0);
}

/* The CPU reading or writing device memory dies of SIGSEGV. */
static void test_cpu_touch_segv(void **state)
{
    (void)state;
    unsigned char *dev = gt_alloc(ROW);
    for (int write = 0; write <= 1; write++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            touch_in_child(dev, write);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!WIFSIGNALED(status))
            print_message("child exited %d instead of dying of a signal\n",
                          WEXITSTATUS(status));
        assert_true(WIFSIGNALED(status));
        assert_int_equal(WTERMSIG(status), SIGSEGV);
    }
    gt_free(dev);
}

static void *alloc_unbound(void *arg)
{
    (void)arg;
    int (*mem_alloc)(unsigned long long *, size_t) = gt_symbol("cuMemAlloc_v2");
    unsigned long long d = 0;
    gt_unbind();
    return (void *)(intptr_t)mem_alloc(&d, ROW);
}

/* CUDA: a thread with no context current is refused (a library thread that
 * forgot to bind). */
static void test_unbound_thread(void **state)
{
    (void)state;
    if (gt_runtime() != GT_CUDA) {
        print_message("skipped: HIP has no contexts to bind\n");
        skip();
    }
    pthread_t t;
    void *r;
    assert_int_equal(pthread_create(&t, NULL, alloc_unbound, NULL), 0);
    assert_int_equal(pthread_join(t, &r), 0);
    enum { CUDA_ERROR_INVALID_CONTEXT = 201 };
    assert_int_equal((int)(intptr_t)r, CUDA_ERROR_INVALID_CONTEXT);
}

/* The memory type, device and range of a device pointer; a host pointer the
 * runtime does not know: CUDA says type 0, HIP an error. */
static void test_pointer_attributes(void **state)
{
    (void)state;
    unsigned char *dev = gt_alloc(3 * ROW);
    unsigned char *host = filled(ROW, 0);
    if (gt_runtime() == GT_CUDA) {
        int (*attrs)(unsigned, int *, void **, unsigned long long) =
            gt_symbol("cuPointerGetAttributes");
        assert_non_null(attrs);
        /* MEMORY_TYPE, DEVICE_ORDINAL, RANGE_START_ADDR, RANGE_SIZE */
        int which[] = {2, 9, 11, 12};
        unsigned type = 99;
        int ordinal = 99;
        unsigned long long start = 1;
        size_t size = 1;
        void *data[] = {&type, &ordinal, &start, &size};
        assert_int_equal(attrs(4, which, data, (uintptr_t)(dev + ROW + 5)), 0);
        assert_int_equal(type, 2); /* CU_MEMORYTYPE_DEVICE */
        assert_int_equal(ordinal, 0);
        assert_true(start == (uintptr_t)dev);
        assert_true(size >= 3 * ROW);
        type = 99;
        assert_int_equal(attrs(1, which, data, (uintptr_t)host), 0);
        assert_int_equal(type, 0);
    } else {
        int (*attr)(void *, int, void *) = gt_symbol("hipPointerGetAttribute");
        assert_non_null(attr);
        /* HIP_POINTER_ATTRIBUTE_MEMORY_TYPE 2, _RANGE_START_ADDR 11 */
        unsigned type = 99;
        void *start = NULL;
        assert_int_equal(attr(&type, 2, dev + ROW + 5), 0);
        assert_int_equal(type, 1); /* ROCm 5.2's hipMemoryTypeDevice */
        assert_int_equal(attr(&start, 11, dev + ROW + 5), 0);
        assert_ptr_equal(start, dev);
        assert_int_equal(attr(&type, 2, host), ERR_INVALID_VALUE);
    }
    free(host);
    gt_free(dev);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* FAKEGPU_COPY_DELAY_US: each async copy sleeps that long first. Only the
 * lower bound is checked (a sleep cannot be shorter), never an upper one. */
static void test_copy_delay(void **state)
{
    (void)state;
    SKIP_UNLESS_FAKE();
    unsigned char *dev = gt_alloc(ROW);
    void *s = gt_stream_create();
    unsigned char *d = filled(ROW, 0xd4);
    gt_fake_set("FAKEGPU_COPY_DELAY_US", 100000);
    double t0 = now_s();
    gt_write_async(dev, d, ROW, s);
    gt_write_async(dev, d, ROW, s);
    gt_fake_set("FAKEGPU_COPY_DELAY_US", 0);
    gt_stream_sync(s);
    assert_true(now_s() - t0 >= 0.2);
    assert_true(dev_all(dev, ROW, 0xd4));
    gt_stream_destroy(s);
    gt_free(dev);
    free(d);
}

/* A copy that leaves its allocation is refused, and so is every later call
 * on its stream; a copy whose host side is device memory too. Other streams
 * go on. */
static void test_refused_copy_sticks(void **state)
{
    (void)state;
    SKIP_UNLESS_FAKE();
    unsigned char *dev = gt_alloc(ROW), *dev2 = gt_alloc(ROW);
    unsigned char *h = filled(2 * ROW, 0xe5);
    void *s = gt_stream_create(), *ok = gt_stream_create();
    fakegpu_stats_t before, after;
    gt_fake_stats(&before);

    assert_int_equal(gt_try_write_async(dev + ROW - 100, h, 200, s), ERR_INVALID_VALUE);
    assert_int_equal(gt_try_write_async(dev, h, 16, s), ERR_INVALID_VALUE);
    assert_int_equal(gt_try_stream_sync(s), ERR_INVALID_VALUE);
    gt_fake_stats(&after);
    assert_true(after.errors >= before.errors + 3);
    assert_int_equal(after.async_copies, before.async_copies);

    assert_int_equal(gt_try_write_async(dev, dev2, 16, ok), ERR_INVALID_VALUE);
    void *fresh = gt_stream_create();
    gt_write_async(dev, h, ROW, fresh);
    gt_stream_sync(fresh);
    assert_true(dev_all(dev, ROW, 0xe5));

    gt_stream_destroy(s);
    gt_stream_destroy(ok);
    gt_stream_destroy(fresh);
    gt_free(dev);
    gt_free(dev2);
    free(h);
}

/* FAKEGPU_FAIL_COPY=N: the Nth async copy fails when it runs; the stream
 * then reports the error, and its later copies do not run. */
static void test_fail_copy(void **state)
{
    (void)state;
    SKIP_UNLESS_FAKE();
    unsigned char *dev = gt_alloc(2 * ROW);
    unsigned char *f = filled(ROW, 0xf6);
    void *s = gt_stream_create();
    void *e = gt_event_create();
    fakegpu_stats_t st;
    gt_fake_stats(&st);
    gt_fake_set("FAKEGPU_FAIL_COPY", st.async_copies + 2);
    gt_gate_t *gate = gt_gate(s);
    gt_write_async(dev, f, ROW, s);
    gt_write_async(dev + ROW, f, ROW, s); /* fails */
    gt_fake_set("FAKEGPU_FAIL_COPY", 0);
    gt_write_async(dev, f, 1, s);
    gt_event_record(e, s);
    gt_gate_open(gate);
    assert_int_equal(gt_try_stream_sync(s), ERR_ILLEGAL_ADDRESS);
    assert_true(dev_all(dev, ROW, 0xf6));
    assert_true(dev_all(dev + ROW, ROW, 0));
    assert_int_equal(gt_try_write_async(dev, f, 1, s), ERR_ILLEGAL_ADDRESS);
    gt_event_destroy(e);
    gt_stream_destroy(s);
    gt_free(dev);
    free(f);
}

/* Registration: FAKEGPU_REGISTER_FAIL and FAKEGPU_REGISTER_MAX make it fail
 * out of memory; a range registered twice is refused; the registered bytes
 * are counted while registered. */
static void test_register_knobs(void **state)
{
    (void)state;
    SKIP_UNLESS_FAKE();
    size_t n = 4 * ROW;
    unsigned char *h = filled(n, 0);
    fakegpu_stats_t st;
    gt_fake_stats(&st);
    uint64_t base = st.registered_bytes;

    gt_fake_set("FAKEGPU_REGISTER_FAIL", 1);
    assert_int_equal(gt_host_register(h, n), ERR_OUT_OF_MEMORY);
    gt_fake_set("FAKEGPU_REGISTER_FAIL", 0);
    gt_fake_set("FAKEGPU_REGISTER_MAX", 8192);
    assert_int_equal(gt_host_register(h, n), ERR_OUT_OF_MEMORY);
    assert_int_equal(gt_host_register(h, 8192), 0);
    assert_int_equal(gt_host_unregister(h), 0);
    gt_fake_set("FAKEGPU_REGISTER_MAX", (512ULL << 30) - 1);

    assert_int_equal(gt_host_register(h, n), 0);
    gt_fake_stats(&st);
    assert_int_equal(st.registered_bytes, base + n);
    assert_int_not_equal(gt_host_register(h + ROW, ROW), 0);
    assert_int_equal(gt_host_unregister(h), 0);
    assert_int_not_equal(gt_host_unregister(h), 0);
    gt_fake_stats(&st);
    assert_int_equal(st.registered_bytes, base);
    free(h);
}

/* Copies count as pinned when their host side lies in registered memory,
 * pageable otherwise; their bytes count once they have run. */
static void test_pinned_pageable_counters(void **state)
{
    (void)state;
    SKIP_UNLESS_FAKE();
    unsigned char *dev = gt_alloc(ROW);
    unsigned char *pageable = filled(ROW, 0x11), *pinned = filled(2 * ROW, 0x22);
    void *s = gt_stream_create();
    assert_int_equal(gt_host_register(pinned, 2 * ROW), 0);
    gt_fake_stats_reset();

    gt_write_async(dev, pageable, ROW, s);
    gt_write_async(dev, pinned, ROW, s);
    gt_read_async(pinned + ROW, dev, ROW, s);
    /* into ordinary memory: pageable */
    gt_read_async(pageable, dev, 100, s);
    gt_stream_sync(s);
    fakegpu_stats_t st;
    gt_fake_stats(&st);
    assert_int_equal(st.async_copies, 4);
    assert_int_equal(st.async_copies_pinned, 2);
    assert_int_equal(st.async_copies_pageable, 2);
    assert_int_equal(st.bytes_h2d, 2 * ROW);
    assert_int_equal(st.bytes_d2h, ROW + 100);
    assert_true(all(pinned + ROW, ROW, 0x22));

    assert_int_equal(gt_host_unregister(pinned), 0);
    gt_stream_destroy(s);
    gt_free(dev);
    free(pageable);
    free(pinned);
}

/* CUDA's cuMemcpyBatchAsync_v2 (CUDA 13): the batch runs in stream order as a
 * whole; a copy whose attribute says DURING_API_CALL has read its source
 * by the time the call returns, so the caller may reuse it at once. */
typedef struct batch_attr {
    int src_access_order; /* CU_MEMCPY_SRC_ACCESS_ORDER_* */
    struct {
        int type, id;
    } src_hint, dst_hint; /* CUmemLocation */
    unsigned flags;
} batch_attr_t;
typedef int (*batch_fn)(unsigned long long *dsts, unsigned long long *srcs, size_t *sizes,
                        size_t count, batch_attr_t *attrs, size_t *attr_idxs,
                        size_t num_attrs, void *stream);

static void test_batch(void **state)
{
    (void)state;
    if (gt_runtime() != GT_CUDA) {
        print_message("skipped: cuMemcpyBatchAsync is CUDA's\n");
        skip();
    }
    batch_fn batch = (batch_fn)gt_symbol("cuMemcpyBatchAsync_v2");
    if (batch == NULL) {
        print_message(
            "skipped: the driver has no cuMemcpyBatchAsync_v2 (before CUDA 13)\n");
        skip();
    }
    /* cuGetProcAddress finds the same entry point for a CUDA 13 caller */
    int (*proc)(const char *, void **, int, unsigned long long, int *) =
        gt_symbol("cuGetProcAddress_v2");
    assert_non_null(proc);
    void *found = NULL;
    int found_status = -1;
    assert_int_equal(proc("cuMemcpyBatchAsync", &found, 13000, 0, &found_status), 0);
    assert_int_equal(found_status, 0);
    assert_non_null(found);
    if (gt_is_fake())
        assert_ptr_equal(found, (void *)batch);
    unsigned char *dev = gt_alloc(3 * ROW);
    unsigned char *a = filled(ROW, 0xa1), *b = filled(ROW, 0xb2), *out = filled(ROW, 0);
    unsigned char *c = filled(ROW, 0x33);
    gt_write(dev + 2 * ROW, c, ROW);
    void *s = gt_stream_create();
    fakegpu_stats_t before, after;
    gt_fake_stats(&before);

    unsigned long long dsts[] = {(uintptr_t)dev, (uintptr_t)(dev + ROW), (uintptr_t)out};
    unsigned long long srcs[] = {(uintptr_t)a, (uintptr_t)b, (uintptr_t)(dev + 2 * ROW)};
    size_t sizes[] = {ROW, ROW, ROW};
    /* copy 0 in stream order, copy 1 read during the call, copy 2 in order */
    batch_attr_t attrs[3] = {
        {.src_access_order = 1}, {.src_access_order = 2}, {.src_access_order = 1}};
    size_t idxs[] = {0, 1, 2};
    gt_gate_t *gate = gt_gate(s);
    assert_int_equal(batch(dsts, srcs, sizes, 3, attrs, idxs, 3, s), 0);
    memset(b, 0, ROW); /* allowed: copy 1 has read it */
    assert_true(dev_all(dev, ROW, 0));
    gt_gate_open(gate);
    gt_stream_sync(s);
    assert_true(dev_all(dev, ROW, 0xa1));
    assert_true(dev_all(dev + ROW, ROW, 0xb2));
    assert_true(all(out, ROW, 0x33));
    if (gt_fake_stats(&after)) {
        assert_int_equal(after.batch_calls, before.batch_calls + 1);
        assert_int_equal(after.async_copies, before.async_copies + 3);
        /* the legacy stream is refused, as the driver documents */
        assert_int_equal(batch(dsts, srcs, sizes, 3, attrs, idxs, 3, NULL),
                         ERR_INVALID_VALUE);
        /* one copy past its allocation refuses the whole batch */
        sizes[1] = 2 * ROW + 1;
        void *s2 = gt_stream_create();
        assert_int_equal(batch(dsts, srcs, sizes, 3, attrs, idxs, 3, s2),
                         ERR_INVALID_VALUE);
        gt_fake_stats(&before);
        assert_int_equal(before.async_copies, after.async_copies);
        gt_stream_destroy(s2);
    }
    gt_stream_destroy(s);
    gt_free(dev);
    free(a);
    free(b);
    free(c);
    free(out);
}

/* A freed allocation's addresses stay out of use: a copy to one is refused
 * as not device memory. */
static void test_use_after_free(void **state)
{
    (void)state;
    SKIP_UNLESS_FAKE();
    unsigned char *dev = gt_alloc(ROW);
    unsigned char *h = filled(ROW, 0x77);
    gt_free(dev);
    void *s = gt_stream_create();
    assert_int_equal(gt_try_write_async(dev, h, ROW, s), ERR_INVALID_VALUE);
    gt_stream_destroy(s);
    free(h);
}

/* Host memory registered read-only: the device may read it, and a copy into
 * it fails when it runs (as the device's write would fault). */
static void test_read_only_registration(void **state)
{
    (void)state;
    SKIP_UNLESS_FAKE();
    enum { REGISTER_READ_ONLY = 0x8 }; /* CU_MEMHOSTREGISTER_READ_ONLY; ROCm 6's too */
    int (*reg)(void *, size_t, unsigned) =
        gt_symbol(gt_runtime() == GT_CUDA ? "cuMemHostRegister_v2" : "hipHostRegister");
    assert_non_null(reg);
    unsigned char *dev = gt_alloc(ROW);
    unsigned char *ro = filled(ROW, 0x99);
    assert_int_equal(reg(ro, ROW, REGISTER_READ_ONLY), 0);
    void *s = gt_stream_create();
    gt_write_async(dev, ro, ROW, s);
    gt_stream_sync(s);
    assert_true(dev_all(dev, ROW, 0x99));
    gt_read_async(ro, dev, ROW, s);
    assert_int_equal(gt_try_stream_sync(s), ERR_ILLEGAL_ADDRESS);
    assert_int_equal(gt_host_unregister(ro), 0);
    gt_stream_destroy(s);
    gt_free(dev);
    free(ro);
}

int main(void)
{
    int r = gt_open();
    if (r != 0)
        return r;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_order),
        cmocka_unit_test(test_event_query),
        cmocka_unit_test(test_stream_wait),
        cmocka_unit_test(test_cpu_touch_segv),
        cmocka_unit_test(test_unbound_thread),
        cmocka_unit_test(test_pointer_attributes),
        cmocka_unit_test(test_copy_delay),
        cmocka_unit_test(test_refused_copy_sticks),
        cmocka_unit_test(test_fail_copy),
        cmocka_unit_test(test_register_knobs),
        cmocka_unit_test(test_pinned_pageable_counters),
        cmocka_unit_test(test_batch),
        cmocka_unit_test(test_use_after_free),
        cmocka_unit_test(test_read_only_registration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
