/*
 * ucxd.h - the daemon's UCX server: a child process of kvdockd that maps
 * the pool's shared-memory file and serves it to UCX workers: one-sided
 * RMA into the registered pool (RDMA, or UCX's emulation over TCP or shared
 * memory), and the active messages of the message mode, which it checks
 * against the pool before it copies. Private to daemon/.
 *
 * Why a process of its own: UCX handles a peer that dies in the middle of
 * its connection set-up with an assertion in some versions (1.13 here: a
 * worker SIGKILLed while its endpoint wires up aborts the serving
 * process). The store must not go down with it, so UCX runs beside it:
 * when the child dies, kvdockd logs it, starts a new one (at most once a
 * second), and workers reconnect (the next Hello carries the new address);
 * the pool's contents are kvdockd's and are not touched.
 *
 * The child is kvdockd itself, exec'd with --ucx-serve; it inherits the
 * environment (UCX_TLS, UCX_NET_DEVICES) and dies with its parent.
 */
#ifndef KVD_DAEMON_UCXD_H
#define KVD_DAEMON_UCXD_H

#include "kvd_common.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct kvd_ucxd kvd_ucxd_t;

/*
 * Starts the child on the pool (its fd and size) and waits up to
 * timeout_ms for its address and rkey. KVD_ERR_UNAVAILABLE when UCX cannot
 * start there (the child says why in the log), KVD_ERR_TIMEOUT, or the
 * errno of fork/exec.
 */
int kvd_ucxd_start(int pool_fd, uint64_t pool_bytes, int timeout_ms, kvd_ucxd_t **out);

/* The control socket to watch for reading: it fires when the child dies. */
int kvd_ucxd_fd(const kvd_ucxd_t *x);

/* True while a child serves; its peer description for Hello replies. */
bool kvd_ucxd_up(const kvd_ucxd_t *x);
void kvd_ucxd_peer(const kvd_ucxd_t *x, const uint8_t **addr, size_t *addr_len,
                   const uint8_t **rkey, size_t *rkey_len, uint64_t *base);

/* The pool is populated: the child (and every later one) maps its pages
 * in, at its own pace, so that writes through it do not fault. */
void kvd_ucxd_pool_ready(kvd_ucxd_t *x);

/* The control socket fired: a restarted child's description (it serves
 * from now on), or a dead child, reaped with how it died. Returns true
 * when the socket is gone (closed; watch kvd_ucxd_fd again after a tick
 * restarts it). Never waits for a living child. */
bool kvd_ucxd_on_event(kvd_ucxd_t *x);

/* Called every tick: starts a new child (without waiting for it: its
 * description arrives on the new socket) when the last one died, at most
 * once a second, and stops a new child that said nothing within the
 * timeout. Returns 1 when it started one now (watch kvd_ucxd_fd), -1 when
 * it stopped one (its socket is gone), 0 otherwise. */
int kvd_ucxd_tick(kvd_ucxd_t *x, uint64_t now_ns);

/* Stops the child (closing its socket, then SIGKILL past 2 s), frees x. */
void kvd_ucxd_stop(kvd_ucxd_t *x);

/* The child's main: kvdockd --ucx-serve POOL_FD CONTROL_FD BYTES. */
int kvd_ucxd_main(int argc, char **argv);

#endif
