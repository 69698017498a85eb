/*
 * namespace.c - who uses which namespace (kvd_store.h "namespaces"): per
 * owner (a connection) a bit per namespace slot, in a hash by owner. A
 * namespace's users count is the number of owners whose bit is set; when
 * an owner goes, each namespace it used loses a user and is removed once it
 * has neither users nor objects. 512 bytes per owner keeps both registering
 * (dedup) and an owner's going O(1) per namespace, whatever the count.
 */
#include "store_int.h"

#include <string.h>

static ns_owner_t **bucket(kvd_store_t *s, uint64_t owner)
{
    uint64_t h = owner * 0x9e3779b97f4a7c15ull;
    return &s->owners[(h >> 32) & (NS_OWNER_BUCKETS - 1)];
}

bool ns_use(kvd_store_t *s, uint64_t owner, uint32_t slot)
{
    ns_owner_t **b = bucket(s, owner), *o = *b;
    while (o != NULL && o->owner != owner)
        o = o->next;
    if (o == NULL) {
        o = kvd_mem_calloc(KVD_MEM_INDEX, 1, sizeof(*o));
        if (o == NULL)
            return false;
        s->owners_bytes += sizeof(*o);
        o->owner = owner;
        o->next = *b;
        *b = o;
    }
    uint64_t bit = 1ull << (slot % 64);
    if ((o->bits[slot / 64] & bit) == 0) {
        o->bits[slot / 64] |= bit;
        s->ns[slot].info.users++;
    }
    return true;
}

void ns_owner_gone(kvd_store_t *s, uint64_t owner)
{
    ns_owner_t **b = bucket(s, owner);
    while (*b != NULL && (*b)->owner != owner)
        b = &(*b)->next;
    ns_owner_t *o = *b;
    if (o == NULL)
        return;
    *b = o->next;
    for (uint32_t w = 0; w < KVD_ARRAY_SIZE(o->bits); w++) {
        for (uint64_t bits = o->bits[w]; bits != 0; bits &= bits - 1) {
            uint32_t slot = w * 64 + (uint32_t)__builtin_ctzll(bits);
            s->ns[slot].info.users--;
            ns_maybe_remove(s, slot);
        }
    }
    s->owners_bytes -= sizeof(*o);
    kvd_mem_free(KVD_MEM_INDEX, o, sizeof(*o));
}

void ns_owners_free(kvd_store_t *s)
{
    for (uint32_t i = 0; i < NS_OWNER_BUCKETS; i++) {
        while (s->owners[i] != NULL) {
            ns_owner_t *o = s->owners[i];
            s->owners[i] = o->next;
            kvd_mem_free(KVD_MEM_INDEX, o, sizeof(*o));
        }
    }
    s->owners_bytes = 0;
}
