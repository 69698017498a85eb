/*
 * linker.c - libkvdock's connection to the daemon.
 *
 * A linker holds one RPC client. Calls are serialised by a mutex, so engine
 * threads may share a handle.
 */
#include "kvdock.h"
#include "kvd_common.h"
#include "kvd_proto.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvd_linker {
    pthread_mutex_t lock;
    kvd_client_t *client;
    int timeout_ms;
    kvd_hello_rep_t hello;
};

KVD_API int kvd_linker_open(const kvd_linker_config_t *config, kvd_linker_t **out)
{
    if (config == NULL || out == NULL)
        return KVD_ERR_INVALID;
    int timeout = config->timeout_ms > 0 ? config->timeout_ms : 5000;
    kvd_client_t *client = NULL;
    int rc;
    if (config->connect != NULL) {
        rc = kvd_client_connect_tcp(config->connect, timeout, &client);
    } else {
        char path[108];
        if (config->socket_path != NULL)
            kvd_strlcpy(path, config->socket_path, sizeof(path));
        else
            kvd_default_socket_path("default", path, sizeof(path));
        rc = kvd_client_connect_unix(path, timeout, &client);
    }
    if (rc != KVD_OK)
        return rc;
    kvd_linker_t *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        kvd_client_close(client);
        return KVD_ERR_NOMEM;
    }
    pthread_mutex_init(&l->lock, NULL);
    l->client = client;
    l->timeout_ms = timeout;
    rc = kvd_client_hello(client, config->client_name ? config->client_name : "libkvdock",
                          &l->hello, timeout);
    if (rc != KVD_OK) {
        kvd_linker_close(l);
        return rc;
    }
    *out = l;
    return KVD_OK;
}

KVD_API void kvd_linker_close(kvd_linker_t *linker)
{
    if (linker == NULL)
        return;
    kvd_client_close(linker->client);
    pthread_mutex_destroy(&linker->lock);
    free(linker);
}

KVD_API int kvd_linker_health(kvd_linker_t *linker, kvd_linker_health_t *state,
                              uint64_t *pool_bytes)
{
    if (linker == NULL)
        return KVD_ERR_INVALID;
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HEALTH);
    pthread_mutex_lock(&linker->lock);
    int rc = kvd_client_call(linker->client, &req, &rep, linker->timeout_ms);
    pthread_mutex_unlock(&linker->lock);
    if (rc != KVD_OK)
        return rc;
    if (rep.status != KVD_OK)
        return rep.status;
    if (state)
        *state = (kvd_linker_health_t)rep.body.health_rep.state;
    if (pool_bytes)
        *pool_bytes = rep.body.health_rep.pool_bytes;
    return KVD_OK;
}

KVD_API int kvd_page_keys(const uint32_t *tokens, size_t n_tokens, size_t page_size,
                          const uint8_t *prior, uint8_t (*keys)[KVD_PAGE_KEY_BYTES],
                          size_t *n_keys)
{
    return kvd_key_chain(tokens, n_tokens, page_size, prior, keys, n_keys);
}

KVD_API const char *kvd_strerror(int status)
{
    return kvd_status_str(status);
}

KVD_API const char *kvd_version(void)
{
    return KVD_VERSION;
}
