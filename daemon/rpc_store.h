/*
 * rpc_store.h - the store's RPC methods: request validation, the call into
 * the store engine, the reply. Private to daemon/.
 */
#ifndef KVD_DAEMON_RPC_STORE_H
#define KVD_DAEMON_RPC_STORE_H

#include "kvd_proto.h"
#include "kvd_store.h"
#include "options.h"

/* Serves one store request of connection `owner`; fills rep (an error reply
 * on failure). rep's variable parts live in rep's arena. */
void kvd_rpc_store_serve(kvd_store_t *store, const kvd_opts_t *opts, uint64_t owner,
                         const kvd_msg_t *req, kvd_msg_t *rep);

/* Registers the namespaces of a Hello or RegisterNamespace request; fills
 * ids (n entries). Returns KVD_OK or an error with rep set to it. */
int kvd_rpc_register(kvd_store_t *store, const kvd_ns_spec_t *specs, size_t n,
                     uint32_t *ids, const kvd_msg_t *req, kvd_msg_t *rep);

/* The namespaces table of Stats and the inspection replies. */
int kvd_rpc_ns_table(kvd_store_t *store, kvd_msg_t *rep, kvd_ns_msg_t **out, size_t *n);

/* Copies engine statistics into their wire form. */
void kvd_rpc_store_stats(const kvd_store_stats_t *in, kvd_store_stats_msg_t *out);

#endif
