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
 *
 * Trust (issue 11): any peer that reaches the child's UCX worker is a
 * stranger until the parent vouches for it.
 *   - The child opens only transports that hold a peer to what it
 *     registered: RDMA rc/dc (and self). UCT's tcp transport serves a raw
 *     PUT request (src/uct/tcp/tcp_ep.c, uct_tcp_ep_handle_put_req: the
 *     peer's bytes at the peer's address, whatever UCP's features), and
 *     UD's software put does the same (src/uct/ib/ud/base/ud_ep.c,
 *     uct_ud_ep_rx_put): those only with --ucx-tcp (allow_tcp), which
 *     hands the child's memory to every host that reaches it. UCX's
 *     shared-memory transports never: a peer claiming this host makes the
 *     child attach what its address names (posix: /proc/PID/fd/FD; cma:
 *     process_vm_* on PID), and 1.13's cannot report a dead peer.
 *   - One-sided RMA is offered (an rkey in the Hello reply) only when every
 *     transport the child's context opened enforces the registration in
 *     the NIC (kvd_ucx_rma_enforced: rc/dc); elsewhere the context has no
 *     UCP_FEATURE_RMA, so UCP's software get/put is not served at all, and
 *     the pool is not registered for remote access.
 *   - The message mode serves a request only with a capability the parent
 *     granted for a connection's Hello (kvd_ucxd_grant), within the grant's
 *     range, writes only when not read-only; the grant goes when the
 *     connection closes (kvd_ucxd_revoke). A restarted child has none: its
 *     workers, whose endpoints to the old child failed, say Hello again.
 *   - The child's network devices are the ones --listen names
 *     (kvd_ucxd_net_devices): loopback without it.
 * What it cannot hold against (UCX 1.13, no NIC to test on here): with
 * --ucx-tcp, a peer that speaks UCT directly (see above); where RMA is on,
 * UCP's software RMA handlers are installed on every interface, rc's and
 * dc's included (harmless while those are the only ones: their puts are
 * the NIC's). Against such a peer the only defence is that it cannot
 * reach the child: the device restriction above, and a network where
 * UCX's ports are the operator's.
 */
#ifndef KVD_DAEMON_UCXD_H
#define KVD_DAEMON_UCXD_H

#include "kvd_common.h"
#include "kvd_transport.h" /* kvd_ucx_range_t */

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct kvd_ucxd kvd_ucxd_t;

typedef struct kvd_ucxd_opts {
    int pool_fd;
    uint64_t pool_bytes;
    const char *net_devices; /* the UCX_NET_DEVICES it opens (NULL, "": UCX's own) */
    bool allow_tcp;          /* --ucx-tcp: TCP and UD as well as rc/dc */
    int timeout_ms;          /* for its description */
    bool no_sandbox;         /* --no-ucx-sandbox: no seccomp filter (sandbox.h) */
} kvd_ucxd_opts_t;

/*
 * Starts the child on the pool and waits up to timeout_ms for its address
 * (and rkey, where it offers RMA). KVD_ERR_UNSUPPORTED when none of the
 * transports UCX would open may be served (see above): what was left out
 * ("tcp/lo") into refused; KVD_ERR_UNAVAILABLE when UCX cannot start there
 * (the child says why in the log), KVD_ERR_TIMEOUT, or the errno of
 * fork/exec.
 */
int kvd_ucxd_start(const kvd_ucxd_opts_t *o, kvd_ucxd_t **out, char *refused,
                   size_t refused_cap);

/* What a restarted child refused to serve on (then no other is started),
 * or NULL. */
const char *kvd_ucxd_refused(const kvd_ucxd_t *x);

/*
 * The UCX_NET_DEVICES for a daemon that listens on `listen` (--listen
 * HOST:PORT; "" none), given the operator's UCX_NET_DEVICES (env_value,
 * NULL unset) and the RDMA ports found (rdma_ports, "mlx5_0:1,...", may be
 * ""): the network interfaces are those holding HOST (all for 0.0.0.0 or
 * ::), or the loopback ones without --listen; RDMA ports are the
 * operator's where it set UCX_NET_DEVICES (its DEVICE:PORT entries; its
 * interfaces --listen does not name are dropped, with a warning), else
 * every active one found.
 * out "" means "leave UCX's own" (a wildcard HOST). KVD_ERR_INVALID when
 * HOST is on no interface here, KVD_ERR_TOO_LARGE when out is too small.
 */
int kvd_ucxd_net_devices(const char *listen, const char *env_value,
                         const char *rdma_ports, char *out, size_t cap);

/* The control socket to watch for reading: it fires when the child dies. */
int kvd_ucxd_fd(const kvd_ucxd_t *x);

/* True while a child serves; its peer description for Hello replies
 * (rkey NULL, length 0 and base 0 where it offers no RMA). */
bool kvd_ucxd_up(const kvd_ucxd_t *x);
bool kvd_ucxd_rma(const kvd_ucxd_t *x);
void kvd_ucxd_peer(const kvd_ucxd_t *x, const uint8_t **addr, size_t *addr_len,
                   const uint8_t **rkey, size_t *rkey_len, uint64_t *base);

#define KVD_UCXD_CAP_BYTES 16 /* = KVD_UCX_CAP_BYTES (transport/) */

/*
 * Grants a connection message-mode access to [offset, offset+length) of
 * the pool, writes unless read_only: a fresh capability (getrandom) into
 * cap, which the child knows once this returns (the grant is in its
 * socket before the Hello reply that carries cap is even queued), and the
 * child's generation into *gen, for the revoke. KVD_ERR_UNAVAILABLE when no
 * child serves, KVD_ERR_BUSY when its socket is full, KVD_ERR_IO when no
 * random bytes could be had.
 */
int kvd_ucxd_grant(kvd_ucxd_t *x, uint64_t conn_id, bool read_only, uint64_t offset,
                   uint64_t length, uint8_t cap[KVD_UCXD_CAP_BYTES], uint64_t *gen);

/* Revokes a grant of generation gen (nothing when that child is gone). A
 * revoke the socket cannot take now is kept and sent on the next tick; a
 * child that lets too many pile up is restarted. */
void kvd_ucxd_revoke(kvd_ucxd_t *x, uint64_t gen, const uint8_t cap[KVD_UCXD_CAP_BYTES]);

/* Opens write windows for lease `lease` of the grant (gen, cap): the
 * extents a Reserve allocated, so that the connection's UCX writes land
 * only in what it reserved (every grant of this server is windowed). The
 * child knows them once this returns, as for a grant. KVD_OK,
 * KVD_ERR_UNAVAILABLE (that child is gone), KVD_ERR_BUSY (its socket is
 * full, or closes wait to be sent): the caller then undoes the Reserve
 * and closes the lease's windows, some of which may have gone in. */
int kvd_ucxd_window_open(kvd_ucxd_t *x, uint64_t gen,
                         const uint8_t cap[KVD_UCXD_CAP_BYTES], uint64_t lease,
                         const kvd_ucx_range_t *r, size_t n);

/* Closes the windows of lease `lease` (published, revoked, expired): as a
 * revoke, kept back and sent on the next tick when the socket is full. */
void kvd_ucxd_window_close(kvd_ucxd_t *x, uint64_t gen,
                           const uint8_t cap[KVD_UCXD_CAP_BYTES], uint64_t lease);

/* The pool is populated: the child (and every later one) maps its pages
 * in, at its own pace, so that writes through it do not fault. */
void kvd_ucxd_pool_ready(kvd_ucxd_t *x);

/* The control socket fired: a restarted child's description (it serves
 * from now on), or a dead child, reaped with how it died. Returns true
 * when the socket is gone (closed; watch kvd_ucxd_fd again after a tick
 * restarts it). Never waits for a living child. */
bool kvd_ucxd_on_event(kvd_ucxd_t *x);

/* Called every tick: sends revokes kept back; starts a new child (without
 * waiting for it: its description arrives on the new socket) when the
 * last one died, at most once a second, and stops a new child that said
 * nothing within the timeout. Returns 1 when it started one now (watch
 * kvd_ucxd_fd), -1 when it stopped one (its socket is gone), 0 otherwise. */
int kvd_ucxd_tick(kvd_ucxd_t *x, uint64_t now_ns);

/* Stops the child (closing its socket, then SIGKILL past 2 s), frees x. */
void kvd_ucxd_stop(kvd_ucxd_t *x);

/* The child's main: kvdockd --ucx-serve POOL_FD CONTROL_FD BYTES DEVICES
 * POLICY (DEVICES "-": UCX's own; POLICY "rdma", or "tcp" for --ucx-tcp). */
int kvd_ucxd_main(int argc, char **argv);

#endif
