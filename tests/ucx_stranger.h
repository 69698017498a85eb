/*
 * ucx_stranger.h - the UCP context and worker of a test's attacker: a
 * stranger that reaches a kvdock UCX worker (the daemon's UCX server, a
 * linker's transport) with a UCX of its own, RMA and active messages both,
 * speaking only what it defines itself. Header-only: the tests that use it
 * link UCX and nothing else of each other.
 */
#ifndef KVD_TEST_UCX_STRANGER_H
#define KVD_TEST_UCX_STRANGER_H

#include <stddef.h>
#include <ucp/api/ucp.h>

/* A context (UCP_FEATURE_RMA | UCP_FEATURE_AM; UCX_TLS as tls when not
 * NULL, else the environment's) and a single-threaded worker on it.
 * Returns 0, or -1 with what was made left in *ctx / *worker (NULL where
 * nothing was) for the caller to clean up. */
static inline int ucx_stranger_open(const char *tls, ucp_context_h *ctx,
                                    ucp_worker_h *worker)
{
    *ctx = NULL;
    *worker = NULL;
    ucp_config_t *cfg = NULL;
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK)
        return -1;
    ucs_status_t st = tls != NULL ? ucp_config_modify(cfg, "TLS", tls) : UCS_OK;
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_RMA | UCP_FEATURE_AM};
    if (st == UCS_OK)
        st = ucp_init(&p, cfg, ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        *ctx = NULL;
        return -1;
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if (ucp_worker_create(*ctx, &wp, worker) != UCS_OK) {
        *worker = NULL;
        return -1;
    }
    return 0;
}

#endif
