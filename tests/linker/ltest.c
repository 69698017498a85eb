/*
 * ltest.c - see ltest.h.
 */
#include "ltest.h"
#include "dtest.h"
#include "harness.h"

#include <signal.h>
#include <time.h>

bool lt_wait_done(kvd_linker_t *l, bool loads, uint64_t id, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        kvd_completion_t c[4];
        size_t n = 0;
        if (loads)
            kvd_pop_completed_loads(l, c, 4, &n);
        else
            kvd_pop_completed_offloads(l, c, 4, &n);
        for (size_t j = 0; j < n; j++)
            if (c[j].id == id)
                return c[j].success;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return false;
}

bool lt_wait_ready(kvd_linker_t *l, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        kvd_linker_health_t h = 0;
        if (kvd_linker_health(l, &h, NULL) == KVD_OK && h == KVD_LINKER_HEALTH_READY)
            return true;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return false;
}

int lt_load_all(kvd_linker_t *l, uint64_t rid, const kvd_transfer_t *t, uint32_t adopted)
{
    kvd_commit_pool_t cp = {.adopted_begin = 0, .adopted_end = adopted};
    uint32_t counter = 0;
    int rc = kvd_load(l, rid, t, 1);
    if (rc == 0)
        rc = kvd_load_prepare(l, rid);
    if (rc == 0)
        rc = kvd_load_commit(l, rid, &cp, 1);
    if (rc == 0)
        rc = kvd_start_layer_wise_loading(l, &counter);
    if (rc == 0)
        rc = kvd_wait_layer(l, counter, 0);
    return rc;
}

int lt_register_kv(kvd_linker_t *l, const char *name, uint8_t *k, uint8_t *v,
                   uint32_t bytes_per_row, uint32_t page_size, uint64_t rows,
                   kvd_free_indices_fn free_indices, uint32_t *pool_id)
{
    kvd_pool_layer_t layer = {.layer_id = 0,
                              .n_buffers = 2,
                              .buffers = {{k, bytes_per_row, bytes_per_row},
                                          {v, bytes_per_row, bytes_per_row}}};
    kvd_pool_desc_t d = {.name = name,
                         .addressing = KVD_ADDR_PAGED,
                         .page_size = page_size,
                         .n_rows = rows,
                         .memory = KVD_MEM_HOST,
                         .n_layers = 1,
                         .layers = &layer,
                         .free_indices = free_indices};
    return kvd_register_pool(l, &d, pool_id);
}

int lt_main(const char *name, void (*run)(const char *socket))
{
    kvd_test_daemon_t d;
    const char *args[] = {"--pool-size", "64M", "--usage-interval", "0", NULL};
    if (kvd_test_daemon_start(&d, args, true, 30000) != 0)
        return 1;
    run(d.socket);
    int st = 0;
    DT_CHECK(kvd_test_daemon_stop(&d, SIGTERM, 10000, &st) == 0,
             "kvdockd did not exit on SIGTERM");
    return dt_exit_status(name);
}
