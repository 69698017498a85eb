/*
 * rpc_store.h - the store's RPC methods: request validation, the call into
 * the store engine, the reply. Private to daemon/.
 */
#ifndef KVD_DAEMON_RPC_STORE_H
#define KVD_DAEMON_RPC_STORE_H

#include "kvd_proto.h"
#include "kvd_store.h"
#include "options.h"

/* Who a request comes from: its connection, and the principal its
 * credential maps to (set at Hello; see auth.h). */
typedef struct kvd_rpc_ctx {
    uint64_t conn_id; /* the owner of every lease taken on its behalf */
    uint32_t tenant;  /* the store's tenant id; 0 is the default tenant */
    bool is_operator; /* may act across tenants (evict --all, list all) */
    bool read_only;   /* may look up and load, not write or evict */
    bool is_peer;     /* another daemon of the cluster: the directory's methods */
    /* the process writing through it (same host: SO_PEERCRED's pid, its
     * start time, the Hello's writer_token); pid 0 unknown (TCP): its
     * reservations get the lease TTL rule */
    kvd_writer_t writer;
} kvd_rpc_ctx_t;

/* Serves one store request of the connection ctx describes; fills rep (an
 * error reply on failure). rep's variable parts live in rep's arena. */
void kvd_rpc_store_serve(kvd_store_t *store, const kvd_opts_t *opts,
                         const kvd_rpc_ctx_t *ctx, const kvd_msg_t *req, kvd_msg_t *rep);

/* Registers the namespaces of a Hello or RegisterNamespace request for
 * ctx's tenant; fills ids (n entries). Returns KVD_OK or an error with rep
 * set to it. */
int kvd_rpc_register(kvd_store_t *store, const kvd_rpc_ctx_t *ctx,
                     const kvd_ns_spec_t *specs, size_t n, uint32_t *ids,
                     const kvd_msg_t *req, kvd_msg_t *rep);

/* The namespaces table of Stats and the inspection replies: those of ctx's
 * tenant, every tenant's for an operator or a NULL ctx (the daemon's own
 * views: /metrics). */
int kvd_rpc_ns_table(kvd_store_t *store, const kvd_rpc_ctx_t *ctx, kvd_msg_t *rep,
                     kvd_ns_msg_t **out, size_t *n);

/* The tenants table of Stats: ctx's tenant, every one for an operator or a
 * NULL ctx. */
int kvd_rpc_tenant_table(kvd_store_t *store, const kvd_rpc_ctx_t *ctx, kvd_msg_t *rep,
                         kvd_tenant_msg_t **out, size_t *n);

/* Copies engine statistics into their wire form. */
void kvd_rpc_store_stats(const kvd_store_stats_t *in, kvd_store_stats_msg_t *out);

#endif
