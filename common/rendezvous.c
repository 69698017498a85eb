/*
 * rendezvous.c - the hashes that place the cluster's directory entries on
 * members (kvd_common.h, "cluster"). FNV-1a over the names, then the
 * splitmix64 finaliser over the pair: FNV alone spreads poorly in its high
 * bits for short ids, and the finaliser makes every input bit count.
 */
#include "kvd_common.h"

#include <string.h>

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME  0x100000001b3ull

static uint64_t fnv1a(uint64_t h, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

uint64_t kvd_dir_hash(const char *tenant, const char *ns,
                      const uint8_t key[KVD_KEY_BYTES])
{
    /* the NULs keep ("ab","c") and ("a","bc") apart */
    uint64_t h = fnv1a(FNV_OFFSET, tenant, strlen(tenant) + 1);
    h = fnv1a(h, ns, strlen(ns) + 1);
    return kvd_mix64(fnv1a(h, key, KVD_KEY_BYTES));
}

uint64_t kvd_node_hash(const char *node_id)
{
    return kvd_mix64(fnv1a(FNV_OFFSET, node_id, strlen(node_id)));
}

uint64_t kvd_rendezvous_score(uint64_t dir_hash, uint64_t node_hash)
{
    return kvd_mix64(dir_hash ^ (node_hash * 0x9e3779b97f4a7c15ull));
}

uint64_t kvd_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

size_t kvd_rendezvous_owner(uint64_t dir_hash, const uint64_t *node_hashes, size_t n)
{
    size_t best = SIZE_MAX;
    uint64_t best_score = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t sc = kvd_rendezvous_score(dir_hash, node_hashes[i]);
        if (best == SIZE_MAX || sc > best_score) {
            best = i;
            best_score = sc;
        }
    }
    return best;
}
