/*
 * queue.c - the completed-loads and completed-offloads queues: growable
 * arrays of (id, success) whose room is promised before the work that
 * completes into them starts, so that a completion is never lost. The
 * caller holds the linker's lock.
 */
#include "linker_int.h"

#include <stdlib.h>
#include <string.h>

int lk_queue_reserve(lqueue_t *q, size_t more)
{
    size_t want = q->n + q->reserved + more;
    if (want > q->cap) {
        size_t cap = q->cap ? q->cap : 64;
        while (cap < want)
            cap *= 2;
        kvd_completion_t *n = realloc(q->items, cap * sizeof(*n));
        if (n == NULL)
            return KVD_ERR_NOMEM;
        q->items = n;
        q->cap = cap;
    }
    q->reserved += more;
    return KVD_OK;
}

/* Room was reserved when the load was committed or the offload queued. */
void lk_queue_push(lqueue_t *q, uint64_t id, bool success)
{
    if (q->reserved > 0)
        q->reserved--;
    if (q->n < q->cap)
        q->items[q->n++] = (kvd_completion_t){.id = id, .success = success};
}

size_t lk_queue_pop(lqueue_t *q, kvd_completion_t *out, size_t max)
{
    size_t k = KVD_MIN(max, q->n);
    if (k > 0) {
        memcpy(out, q->items, k * sizeof(*out));
        memmove(q->items, q->items + k, (q->n - k) * sizeof(*out));
        q->n -= k;
    }
    return k;
}

void lk_queue_free(lqueue_t *q)
{
    free(q->items);
    *q = (lqueue_t){0};
}

/* ------------------------------------------------------------ public */

static int pop(kvd_linker_t *l, lqueue_t *q, kvd_completion_t *out, size_t max, size_t *n)
{
    if (l == NULL || (out == NULL && max > 0) || n == NULL)
        return KVD_ERR_INVALID;
    lk_lock(&l->lock);
    size_t k = lk_queue_pop(q, out, max);
    lk_unlock(&l->lock);
    *n = k;
    return KVD_OK;
}

KVD_API int kvd_pop_completed_loads(kvd_linker_t *l, kvd_completion_t *out, size_t max,
                                    size_t *n)
{
    lk_clear_last_error();
    return pop(l, &l->done_loads, out, max, n);
}

KVD_API int kvd_pop_completed_offloads(kvd_linker_t *l, kvd_completion_t *out, size_t max,
                                       size_t *n)
{
    lk_clear_last_error();
    return pop(l, &l->done_offloads, out, max, n);
}
