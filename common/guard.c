/*
 * guard.c - keeps a process alive when a shared pool file it maps is cut
 * short under it (kvd_common.h, "pool guard").
 *
 * The named pool file cannot be sealed (only memfds can), so any holder of
 * its read-write descriptor (every same-host writer) can ftruncate it. A
 * process that then touches a page past the new end through its mapping
 * takes a SIGBUS, which by default kills it: the daemon while it checksums
 * a spill, its UCX server while it answers a get, another engine while it
 * loads. The handler here, for a fault inside a guarded mapping, gives the
 * file its size back (ftruncate through a descriptor of its own, where it
 * is writable) or waits, bounded, for the daemon to do it (a read-only
 * holder cannot), and returns: the access is made again and finds a page
 * (of zeros: those bytes are lost, and the daemon drops the objects that
 * were there, see kvd_pool_damage_check). Faults elsewhere go to the
 * handler that was there before, or to the default action.
 *
 * Everything the handler reads is in a fixed table of atomics; it calls
 * only async-signal-safe functions (fstat, ftruncate, nanosleep,
 * sigaction). An entry is removed by clearing its base and waiting until
 * no handler is inside it, so that its descriptor is never used after it
 * was closed (a reused descriptor number could name another file).
 */
#include "kvd_common.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#define GUARD_SLOTS 16
/* how long a holder that cannot regrow the file waits for the daemon: its
 * watch of the pool file answers within milliseconds (server.c) */
#define GUARD_WAIT_MS 3000
/* faults of a file that is whole already (the daemon regrew it first, or
 * no memory behind a hole: a full tmpfs, no free hugepage) retried, 1 ms
 * apart, within one second, before the fault is taken as what it is */
#define GUARD_SPURIOUS_MAX 1000

typedef struct guard_slot {
    _Atomic uintptr_t base; /* 0: not in use by a mapping */
    _Atomic uint64_t bytes;
    _Atomic int fd1;            /* our own duplicate + 1; 0: the slot is free */
    _Atomic int inside;         /* handlers using this slot now */
    _Atomic unsigned spurious;  /* faults this second that found the file whole */
    _Atomic int64_t spurious_s; /* which second (CLOCK_MONOTONIC) */
    bool owner;                 /* the daemon's own mapping: regrow at once */
    _Atomic uint64_t cut;       /* the smallest size an owner's handler saw */
} guard_slot_t;

static guard_slot_t slots[GUARD_SLOTS];
static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction previous;
static bool installed; /* under slots_mu; the handler never reads it */
static _Atomic uint64_t repairs;

static void sleep_ms(void)
{
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
}

/* Hands the signal to what was there before us (or the default action:
 * reset, and the access that faults again is fatal as it always was). */
static void chain(int sig, siginfo_t *info, void *uctx)
{
    if ((previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction != NULL) {
        previous.sa_sigaction(sig, info, uctx);
        return;
    }
    if (!(previous.sa_flags & SA_SIGINFO) && previous.sa_handler != SIG_DFL &&
        previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
        return;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    /* a fault comes again when the access is retried; a signal that was
     * sent (kill, raise) would be lost: it is sent again */
    if (info->si_code <= 0)
        raise(sig);
}

/* 1: the file behind g's descriptor was short and covers the fault again;
 * 0: it was whole already; -1: it stayed short. Only the daemon's own
 * mapping (the owner) grows it back at once, keeping the size it saw for
 * kvd_pool_guard_take_cut: the daemon must see the cut, as a cut, to drop
 * what was there (a file grown back by someone else shows holes, and the
 * pages read meanwhile fill them with zeros the daemon cannot tell from
 * data). Others wait for the daemon, and grow it themselves only when it
 * does not come (stopped, or gone). */
static int regrow(guard_slot_t *g, uint64_t need)
{
    int fd = atomic_load(&g->fd1) - 1;
    uint64_t bytes = atomic_load(&g->bytes);
    struct stat st;
    for (int waited = 0; waited <= GUARD_WAIT_MS; waited++) {
        if (fstat(fd, &st) != 0)
            return -1;
        if ((uint64_t)st.st_size >= need)
            return waited > 0;
        if (g->owner || waited == GUARD_WAIT_MS) {
            uint64_t seen = atomic_load(&g->cut);
            while ((uint64_t)st.st_size < seen &&
                   !atomic_compare_exchange_weak(&g->cut, &seen, (uint64_t)st.st_size)) {
            }
            /* only ever grows it (the size was compared first) */
            if (ftruncate(fd, (off_t)bytes) == 0)
                return 1;
        }
        sleep_ms(); /* the daemon grows it back; a read-only holder cannot */
    }
    return -1;
}

static void on_sigbus(int sig, siginfo_t *info, void *uctx)
{
    int saved = errno;
    uintptr_t a = (uintptr_t)info->si_addr;
    /* only an access past the file's end (BUS_ADRERR); a SIGBUS sent by
     * kill or raise, or a memory error (BUS_MCEERR_*), is not ours */
    for (int k = 0; k < GUARD_SLOTS && info->si_code == BUS_ADRERR; k++) {
        guard_slot_t *g = &slots[k];
        uintptr_t base = atomic_load(&g->base);
        if (base == 0 || a < base || a - base >= atomic_load(&g->bytes))
            continue;
        atomic_fetch_add(&g->inside, 1);
        int r = -1;
        if (atomic_load(&g->base) == base) /* still that mapping */
            r = regrow(g, (uint64_t)(a - base) + 1);
        if (r == 0) {
            /* counted per second: races with the daemon's regrowth do not
             * add up over a process's life */
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (atomic_exchange(&g->spurious_s, (int64_t)now.tv_sec) !=
                (int64_t)now.tv_sec)
                atomic_store(&g->spurious, 0);
        }
        if (r == 0 && atomic_fetch_add(&g->spurious, 1) < GUARD_SPURIOUS_MAX) {
            sleep_ms();
            r = 1;
        } else if (r == 1) {
            atomic_store(&g->spurious, 0);
            atomic_fetch_add(&repairs, 1);
        }
        atomic_fetch_sub(&g->inside, 1);
        if (r == 1) {
            errno = saved;
            return; /* the access is made again, and finds a page */
        }
        break;
    }
    errno = saved;
    chain(sig, info, uctx);
}

/* Puts the handler in place, once: what was there before is chained to.
 * It is not taken back from a handler installed after it (one that chains
 * to its predecessor would then chain to itself through us). */
static int install_locked(void)
{
    if (installed)
        return KVD_OK;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &previous) != 0)
        return kvd_status_from_errno(errno);
    installed = true;
    return KVD_OK;
}

int kvd_pool_guard_add(void *base, uint64_t bytes, int fd, bool owner)
{
    if (base == NULL || bytes == 0 || fd < 0)
        return KVD_ERR_INVALID;
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (own < 0)
        return kvd_status_from_errno(errno);
    pthread_mutex_lock(&slots_mu);
    int rc = install_locked();
    int k = 0;
    while (rc == KVD_OK && k < GUARD_SLOTS && atomic_load(&slots[k].fd1) != 0)
        k++;
    if (rc == KVD_OK && k == GUARD_SLOTS)
        rc = KVD_ERR_NO_SPACE;
    if (rc == KVD_OK) {
        atomic_store(&slots[k].bytes, bytes);
        atomic_store(&slots[k].spurious, 0);
        atomic_store(&slots[k].cut, UINT64_MAX);
        slots[k].owner = owner;
        atomic_store(&slots[k].fd1, own + 1);
        atomic_store(&slots[k].base, (uintptr_t)base); /* last: the slot is whole */
    }
    pthread_mutex_unlock(&slots_mu);
    if (rc != KVD_OK)
        close(own);
    return rc;
}

void kvd_pool_guard_remove(void *base)
{
    if (base == NULL)
        return;
    guard_slot_t *g = NULL;
    pthread_mutex_lock(&slots_mu);
    for (int k = 0; k < GUARD_SLOTS && g == NULL; k++)
        if (atomic_load(&slots[k].base) == (uintptr_t)base) {
            g = &slots[k];
            atomic_store(&g->base, 0); /* no new handler enters it */
        }
    pthread_mutex_unlock(&slots_mu);
    if (g == NULL)
        return;
    /* a handler that entered before may still regrow through the
     * descriptor (GUARD_WAIT_MS at most); the slot stays taken (fd1) until
     * it is closed, so no add reuses it meanwhile */
    while (atomic_load(&g->inside) != 0)
        sched_yield();
    close(atomic_load(&g->fd1) - 1);
    atomic_store(&g->fd1, 0);
}

uint64_t kvd_pool_guard_repairs(void)
{
    return atomic_load(&repairs);
}

uint64_t kvd_pool_guard_take_cut(void *base)
{
    uint64_t cut = UINT64_MAX;
    pthread_mutex_lock(&slots_mu);
    for (int k = 0; k < GUARD_SLOTS; k++)
        if (atomic_load(&slots[k].base) == (uintptr_t)base)
            cut = atomic_exchange(&slots[k].cut, UINT64_MAX);
    pthread_mutex_unlock(&slots_mu);
    return cut;
}
