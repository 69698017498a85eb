/*
 * tenant.c - the store's tenants (kvd_store.h): a fixed table of names and
 * limits, filled at start from the daemon's auth config. Tenant 0 is the
 * default tenant, there from creation.
 */
#include "store_int.h"

#include <string.h>

void tenant_init(kvd_store_t *s)
{
    memset(&s->tenants[0], 0, sizeof(s->tenants[0]));
    memcpy(s->tenants[0].name, "default", sizeof("default"));
    s->n_tenants = 1;
}

int kvd_store_tenant_find(const kvd_store_t *s, const char *name, uint32_t *id)
{
    for (uint32_t i = 0; i < s->n_tenants; i++) {
        if (strcmp(s->tenants[i].name, name) == 0) {
            *id = i;
            return KVD_OK;
        }
    }
    return KVD_ERR_NOT_FOUND;
}

int kvd_store_tenant_add(kvd_store_t *s, const char *name, const kvd_tenant_limits_t *lim,
                         uint32_t *id)
{
    size_t len = strlen(name);
    if (len == 0 || len >= KVD_TENANT_NAME_MAX)
        return KVD_ERR_INVALID;
    uint32_t have;
    if (kvd_store_tenant_find(s, name, &have) == KVD_OK)
        return KVD_ERR_EXISTS;
    if (s->n_tenants >= KVD_TENANTS_MAX)
        return KVD_ERR_NO_SPACE;
    tenant_t *t = &s->tenants[s->n_tenants];
    memset(t, 0, sizeof(*t));
    memcpy(t->name, name, len + 1);
    if (lim != NULL)
        t->lim = *lim;
    *id = s->n_tenants++;
    return KVD_OK;
}

const char *kvd_store_tenant_name(const kvd_store_t *s, uint32_t id)
{
    return id < s->n_tenants ? s->tenants[id].name : NULL;
}

uint32_t kvd_store_tenant_count(const kvd_store_t *s)
{
    return s->n_tenants;
}

int kvd_store_tenant_usage(const kvd_store_t *s, uint32_t id, kvd_tenant_limits_t *lim,
                           kvd_tenant_usage_t *use)
{
    if (id >= s->n_tenants)
        return KVD_ERR_NOT_FOUND;
    if (lim != NULL)
        *lim = s->tenants[id].lim;
    if (use != NULL)
        *use = s->tenants[id].use;
    return KVD_OK;
}
