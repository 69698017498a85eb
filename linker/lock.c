/*
 * lock.c - the linker's mutexes with their rank (linker_int.h lists the
 * order). Debug builds keep, per thread, the ranks held, and assert that
 * each lock taken ranks after every lock the thread holds: a wrong order
 * fails the first test that runs it, not a deadlock in production.
 */
#include "linker_int.h"

#include <assert.h>
#include <errno.h>

#ifndef NDEBUG
static _Thread_local unsigned held; /* bit r: a lock of rank r is held */

static void note_lock(const lk_mutex_t *m)
{
    /* nothing of this rank or a later one may be held */
    assert((held >> m->rank) == 0 && "linker lock order (see linker_int.h)");
    held |= 1u << m->rank;
}

static void note_unlock(const lk_mutex_t *m)
{
    assert((held & (1u << m->rank)) != 0);
    held &= ~(1u << m->rank);
}
#else
static void note_lock(const lk_mutex_t *m)
{
    (void)m;
}

static void note_unlock(const lk_mutex_t *m)
{
    (void)m;
}
#endif

void lk_mutex_init(lk_mutex_t *m, enum lk_rank rank)
{
    pthread_mutex_init(&m->m, NULL);
    m->rank = rank;
}

void lk_mutex_destroy(lk_mutex_t *m)
{
    pthread_mutex_destroy(&m->m);
}

void lk_lock(lk_mutex_t *m)
{
    note_lock(m);
    pthread_mutex_lock(&m->m);
}

bool lk_lock_until(lk_mutex_t *m, uint64_t deadline_ns)
{
    note_lock(m); /* the order is asserted before waiting, as for lk_lock */
    if (kvd_mutex_lock_until(&m->m, deadline_ns))
        return true;
    note_unlock(m);
    return false;
}

void lk_unlock(lk_mutex_t *m)
{
    pthread_mutex_unlock(&m->m);
    note_unlock(m);
}

/* A wait gives m up and takes it back: the held set is the same after. */
void lk_cond_wait(pthread_cond_t *c, lk_mutex_t *m)
{
    pthread_cond_wait(c, &m->m);
}

bool lk_cond_timedwait(pthread_cond_t *c, lk_mutex_t *m, const struct timespec *until)
{
    return pthread_cond_timedwait(c, &m->m, until) != ETIMEDOUT;
}
