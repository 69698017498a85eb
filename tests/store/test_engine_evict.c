/*
 * Description: eviction and the allocator of the store engine (DESIGN.md
 * section 4, kvd_store.h "engine"): READY unpinned objects go least recently
 * used first and, among those, the deepest page of a chain before its
 * parent; a chain published in one batch has its root most recently used;
 * the watermarks evict from evict_high down to evict_low; pinned and
 * WRITING objects never go, so a pool full of them answers NO_SPACE;
 * kvd_store_evict_key / kvd_store_evict_ns; fragmentation figures and the
 * merging of free neighbours.
 *
 * Expectations are worked by hand from the contracts. Where an expectation
 * depends on where the allocator put objects (fragmentation), it is derived
 * from the locations Reserve returned, never from the engine's own figures.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd_store.h"
#include "engine_util.h"

#define PAGE    4096u
#define OWNER_A 1u
#define OWNER_B 2u

/* ----------------------------------------------------------- helpers */

static kvd_store_t *mk_store(uint64_t pages, double high, double low)
{
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, pages * PAGE);
    cfg.evict_high = high;
    cfg.evict_low = low;
    kvd_store_t *s = NULL;
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_OK);
    return s;
}

/* The key of page `depth` of chain `chain`. */
static uint32_t ck(uint32_t chain, uint32_t depth)
{
    return chain * 1000 + depth;
}

/* Reserves the n keys k[] as one batch (parent/depth as given, parent_k
 * UINT32_MAX for none); returns the lease, results and locs out. */
static uint64_t reserve_batch(kvd_store_t *s, uint64_t owner, uint32_t ns,
                              const uint32_t *k, const uint32_t *parent_k,
                              const uint32_t *depth, size_t n, uint8_t *res,
                              kvd_loc_t *locs)
{
    key_t32 *keys = calloc(n, sizeof(key_t32));
    key_t32 *parents = calloc(n, sizeof(key_t32));
    kvd_put_t *items = calloc(n, sizeof(kvd_put_t));
    assert_non_null(keys);
    assert_non_null(parents);
    assert_non_null(items);
    for (size_t i = 0; i < n; i++) {
        mkkey(keys[i], k[i]);
        bool has_parent = parent_k && parent_k[i] != UINT32_MAX;
        if (has_parent)
            mkkey(parents[i], parent_k[i]);
        items[i] = (kvd_put_t){.key = keys[i],
                               .parent = has_parent ? parents[i] : NULL,
                               .depth = depth ? depth[i] : 0};
    }
    uint64_t lease = 0;
    assert_int_equal(kvd_store_reserve(s, owner, ns, items, n, 0, &lease, res, locs),
                     KVD_OK);
    check_ok(s);
    free(keys);
    free(parents);
    free(items);
    return lease;
}

/* Reserves and publishes one unrelated key (depth 0); returns its loc. */
static kvd_loc_t put_one(kvd_store_t *s, uint32_t ns, uint32_t k)
{
    uint8_t res;
    kvd_loc_t loc;
    uint64_t lease = reserve_batch(s, OWNER_A, ns, &k, NULL, NULL, 1, &res, &loc);
    assert_int_equal(res, KVD_RESERVE_ALLOCATED);
    assert_int_equal(kvd_store_publish(s, OWNER_A, lease, NULL, 0), KVD_OK);
    check_ok(s);
    return loc;
}

/* Reserves and publishes pages from..to-1 of a chain as one batch, in the
 * given order (root first unless leaf_first). */
static void put_chain(kvd_store_t *s, uint32_t ns, uint32_t chain, uint32_t from,
                      uint32_t to, bool leaf_first)
{
    uint32_t n = to - from, k[64] = {0}, p[64] = {0}, d[64] = {0};
    uint8_t res[64];
    kvd_loc_t locs[64];
    assert_true(n <= 64);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t depth = leaf_first ? to - 1 - i : from + i;
        k[i] = ck(chain, depth);
        p[i] = depth ? ck(chain, depth - 1) : UINT32_MAX;
        d[i] = depth;
    }
    uint64_t lease = reserve_batch(s, OWNER_A, ns, k, p, d, n, res, locs);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(res[i], KVD_RESERVE_ALLOCATED);
    assert_int_equal(kvd_store_publish(s, OWNER_A, lease, NULL, 0), KVD_OK);
    check_ok(s);
}

static int acquire(kvd_store_t *s, uint64_t owner, uint32_t ns, const uint32_t *k,
                   size_t n, uint64_t *lease)
{
    key_t32 keys[64];
    kvd_loc_t locs[64];
    size_t bad;
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++)
        mkkey(keys[i], k[i]);
    int rc = kvd_store_acquire(s, owner, ns, (const uint8_t(*)[KVD_KEY_BYTES])keys, n, 0,
                               lease, locs, &bad);
    check_ok(s);
    return rc;
}

/* Touches pages from..to-1 of a chain: acquire (root first) and release. */
static void touch_chain(kvd_store_t *s, uint32_t ns, uint32_t chain, uint32_t from,
                        uint32_t to)
{
    uint32_t k[64];
    for (uint32_t i = from; i < to; i++)
        k[i - from] = ck(chain, i);
    uint64_t lease;
    assert_int_equal(acquire(s, OWNER_B, ns, k, to - from, &lease), KVD_OK);
    assert_int_equal(kvd_store_release(s, OWNER_B, lease), KVD_OK);
    check_ok(s);
}

static bool present(const kvd_store_t *s, uint32_t ns, uint32_t k)
{
    key_t32 key;
    kvd_obj_info_t info;
    mkkey(key, k);
    return kvd_store_inspect(s, ns, key, &info) == KVD_OK;
}

/* Of the chain's pages 0..n-1, the set that is absent as a bit mask. */
static uint64_t absent_mask(const kvd_store_t *s, uint32_t ns, uint32_t chain, uint32_t n)
{
    uint64_t m = 0;
    for (uint32_t d = 0; d < n; d++)
        if (!present(s, ns, ck(chain, d)))
            m |= 1ull << d;
    return m;
}

/* Reserves one new key (ALLOCATED expected) and publishes it. */
static void push_new(kvd_store_t *s, uint32_t ns, uint32_t k)
{
    put_one(s, ns, k);
}

/* ------------------------------------------------------- eviction order */

/* Compares the chains' absent masks with *masks (updated): exactly one
 * page went, and it was the deepest present page of its chain: a leaf,
 * never a page with a present descendant. Returns chain * 1000 + depth. */
static uint32_t one_leaf_evicted(const kvd_store_t *s, uint32_t ns, uint64_t *masks,
                                 uint32_t n_chains, uint32_t len)
{
    uint32_t gone = UINT32_MAX, n_gone = 0;
    for (uint32_t c = 0; c < n_chains; c++) {
        uint64_t now = absent_mask(s, ns, c, len);
        assert_int_equal(now & masks[c], masks[c]); /* nothing came back */
        uint64_t diff = now & ~masks[c];
        for (uint32_t d = 0; d < len; d++) {
            if (!(diff >> d & 1))
                continue;
            n_gone++;
            gone = ck(c, d);
            uint64_t deeper = ((1ull << len) - 1) & ~((2ull << d) - 1);
            if ((now & deeper) != deeper)
                print_error("page %u of chain %u evicted while a deeper page is present "
                            "(absent mask 0x%llx)\n",
                            d, c, (unsigned long long)now);
            assert_int_equal(now & deeper, deeper);
        }
        masks[c] = now;
    }
    assert_int_equal(n_gone, 1);
    return gone;
}

/* Four chains of 16 pages fill a 64-page pool; touched (acquire + release
 * of the whole chain) in the order C2, C0, C3, C1. The next key evicts the
 * least recently used chain's leaf, C2 page 15 (plain LRU would be just as
 * happy with any page of C2; the leaf rule picks 15). Then 31 more: every
 * eviction takes a leaf, and C1, the most recently used, loses nothing
 * while 48 pages are colder than it. */
static void test_lru_then_leaf_first(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(64, 1.0, 1.0);
    uint32_t ns = reg(s, "kv", PAGE);
    for (uint32_t c = 0; c < 4; c++)
        put_chain(s, ns, c, 0, 16, false);
    assert_int_equal(stats(s).free_bytes, 0);
    const uint32_t order[4] = {2, 0, 3, 1};
    for (int i = 0; i < 4; i++)
        touch_chain(s, ns, order[i], 0, 16);

    uint64_t masks[4] = {0};
    push_new(s, ns, ck(9, 0));
    assert_int_equal(one_leaf_evicted(s, ns, masks, 4, 16), ck(2, 15));
    for (uint32_t j = 1; j < 32; j++) {
        push_new(s, ns, ck(9, j));
        one_leaf_evicted(s, ns, masks, 4, 16);
        assert_int_equal(masks[1], 0);
        assert_int_equal(stats(s).evictions, j + 1);
    }
    kvd_ns_info_t ni;
    kvd_store_ns_info(s, ns, &ni);
    assert_int_equal(ni.evictions, 32);
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.evictions, 32);
    assert_int_equal(st.evicted_bytes, 32 * PAGE);
    assert_int_equal(st.objects_ready, 64);
    kvd_store_destroy(s);
}

/* Pages published one batch each, root first, so each chain's root is its
 * least recently used page: still the leaf of the older chain goes first
 * (plain LRU would take chain 0's root), and every eviction is a leaf. */
static void test_leaf_before_parent_separate_batches(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(8, 1.0, 1.0);
    uint32_t ns = reg(s, "kv", PAGE);
    for (uint32_t d = 0; d < 4; d++)
        put_chain(s, ns, 0, d, d + 1, false); /* root first, one page a batch */
    for (uint32_t d = 0; d < 4; d++)
        put_chain(s, ns, 1, d, d + 1, false);
    uint64_t masks[2] = {0};
    push_new(s, ns, ck(9, 0));
    assert_int_equal(one_leaf_evicted(s, ns, masks, 2, 4), ck(0, 3));
    for (uint32_t j = 1; j < 8; j++) {
        push_new(s, ns, ck(9, j));
        one_leaf_evicted(s, ns, masks, 2, 4);
    }
    assert_int_equal(masks[0], 0xf);
    assert_int_equal(masks[1], 0xf);
    kvd_store_destroy(s);
}

/* A chain of 16 published in one batch (root first, as an engine offloads
 * a node) fills the pool; new keys evict it strictly leaf first, which is
 * only possible if its root is its most recently used page. */
static void test_publish_batch_root_most_recent(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(16, 1.0, 1.0);
    uint32_t ns = reg(s, "kv", PAGE);
    put_chain(s, ns, 0, 0, 16, false);
    for (uint32_t j = 0; j < 16; j++) {
        push_new(s, ns, ck(9, j));
        uint64_t want = ((1ull << 16) - 1) & ~((1ull << (15 - j)) - 1);
        assert_int_equal(absent_mask(s, ns, 0, 16), want);
    }
    kvd_store_destroy(s);
}

/*
 * A batch enters the LRU by depth, not in the order it was listed: a chain
 * published in one batch listed leaf first still has its root most recent,
 * so the first eviction takes its leaf (page 15), never a middle page.
 */
static void test_publish_batch_leaf_first_listed(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(16, 1.0, 1.0);
    uint32_t ns = reg(s, "kv", PAGE);
    put_chain(s, ns, 0, 0, 16, true);
    push_new(s, ns, ck(9, 0));
    uint64_t gone = absent_mask(s, ns, 0, 16);
    kvd_store_destroy(s);
    if (gone != 1ull << 15)
        print_error("batch listed leaf first: evicted mask 0x%llx, expected "
                    "0x8000 (the leaf)\n",
                    (unsigned long long)gone);
    assert_int_equal(gone, 1ull << 15);
}

/*
 * A chain extended in a later turn: its old prefix is colder than its new
 * suffix, so the cold end of the LRU holds the end of the prefix, a middle
 * page of the chain. Eviction takes leaves only (pages no stored page names
 * as parent), so the first page to go is still the chain's end (page 15):
 * evicting a middle page would strand everything after it (DESIGN.md 4).
 */
static void test_chain_extended_later_cut_at_its_end(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(16, 1.0, 1.0);
    uint32_t ns = reg(s, "kv", PAGE);
    put_chain(s, ns, 0, 0, 8, false);
    touch_chain(s, ns, 0, 0, 8);
    put_chain(s, ns, 0, 8, 16, false);
    push_new(s, ns, ck(9, 0));
    uint64_t gone = absent_mask(s, ns, 0, 16);
    kvd_store_destroy(s);
    if (gone != 1ull << 15)
        print_error("chain extended later: evicted mask 0x%llx, expected 0x8000 "
                    "(the leaf)\n",
                    (unsigned long long)gone);
    assert_int_equal(gone, 1ull << 15);
}

/* ------------------------------------------------------------ watermarks */

/* evict_high 0.5, evict_low 0.25 of 64 pages: 32 used is not over the high
 * mark; the 33rd page is, and the store evicts the least recently used
 * READY objects until at most 16 pages are used: 17 of them. */
static void test_watermarks(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(64, 0.5, 0.25);
    uint32_t ns = reg(s, "kv", PAGE);
    for (uint32_t k = 0; k < 32; k++)
        put_one(s, ns, k); /* one batch each: key 0 oldest */
    assert_int_equal(stats(s).evictions, 0);
    assert_int_equal(stats(s).objects_ready, 32);
    uint32_t hot[4] = {0, 1, 2, 3};
    uint64_t r;
    assert_int_equal(acquire(s, OWNER_B, ns, hot, 4, &r), KVD_OK);
    assert_int_equal(kvd_store_release(s, OWNER_B, r), KVD_OK);

    uint8_t res;
    kvd_loc_t loc;
    uint32_t nk = 100;
    uint64_t w = reserve_batch(s, OWNER_A, ns, &nk, NULL, NULL, 1, &res, &loc);
    assert_int_equal(res, KVD_RESERVE_ALLOCATED);
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.evictions, 17);
    assert_int_equal(st.objects_ready, 15);
    assert_int_equal(st.objects_writing, 1);
    assert_int_equal(st.free_bytes, 48 * PAGE);
    assert_true(st.ready_bytes + st.writing_bytes <= 16 * PAGE);
    for (uint32_t k = 0; k < 32; k++)
        assert_int_equal(present(s, ns, k), k < 4 || k > 20);
    assert_true(present(s, ns, 100));

    /* 17 used is under the high mark: no eviction */
    assert_int_equal(kvd_store_publish(s, OWNER_A, w, NULL, 0), KVD_OK);
    put_one(s, ns, 101);
    assert_int_equal(stats(s).evictions, 17);
    kvd_store_destroy(s);
}

/* The watermarks take only READY unpinned objects: with 20 of 32 pinned,
 * the 12 others go and eviction stops above the low mark. */
static void test_watermarks_spare_pinned(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(64, 0.5, 0.25);
    uint32_t ns = reg(s, "kv", PAGE);
    for (uint32_t k = 0; k < 32; k++)
        put_one(s, ns, k);
    uint32_t pin[20];
    for (uint32_t k = 0; k < 20; k++)
        pin[k] = k;
    uint64_t r;
    assert_int_equal(acquire(s, OWNER_B, ns, pin, 20, &r), KVD_OK);
    uint8_t res;
    kvd_loc_t loc;
    uint32_t nk = 100;
    reserve_batch(s, OWNER_A, ns, &nk, NULL, NULL, 1, &res, &loc);
    assert_int_equal(res, KVD_RESERVE_ALLOCATED);
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.evictions, 12);
    assert_int_equal(st.objects_ready, 20);
    assert_int_equal(st.objects_pinned, 20);
    assert_int_equal(st.free_bytes, 43 * PAGE);
    for (uint32_t k = 0; k < 32; k++)
        assert_int_equal(present(s, ns, k), k < 20);
    kvd_store_destroy(s);
}

/* ------------------------------------------------ pinned, WRITING: kept */

static void assert_no_space_for(kvd_store_t *s, uint32_t ns, uint64_t owner, uint32_t k)
{
    kvd_store_stats_t before = stats(s);
    uint8_t res = 0xee;
    kvd_loc_t loc;
    uint64_t lease = reserve_batch(s, owner, ns, &k, NULL, NULL, 1, &res, &loc);
    assert_int_equal(res, KVD_RESERVE_NO_SPACE);
    assert_int_equal(lease, 0);
    kvd_store_stats_t after = stats(s);
    assert_int_equal(after.free_bytes, before.free_bytes);
    assert_int_equal(after.evictions, before.evictions);
    assert_int_equal(after.leases, before.leases);
    assert_int_equal(after.objects_ready, before.objects_ready);
    assert_int_equal(after.objects_writing, before.objects_writing);
    assert_int_equal(after.reserve_no_space, before.reserve_no_space + 1);
    assert_false(present(s, ns, k));
}

static void test_pinned_and_writing_never_evicted(void **state)
{
    (void)state;
    uint32_t k[16];
    for (uint32_t i = 0; i < 16; i++)
        k[i] = i;

    /* without watermarks: a pool full of pinned objects */
    kvd_store_t *s = mk_store(16, 1.0, 1.0);
    uint32_t ns = reg(s, "kv", PAGE);
    for (uint32_t i = 0; i < 16; i++)
        put_one(s, ns, i);
    uint64_t r;
    assert_int_equal(acquire(s, OWNER_B, ns, k, 16, &r), KVD_OK);
    assert_no_space_for(s, ns, OWNER_A, 100);
    assert_no_space_for(s, ns, OWNER_B, 101);
    for (uint32_t i = 0; i < 16; i++)
        assert_true(present(s, ns, i));
    /* a batch: the present keys EXISTS, the new ones NO_SPACE, no lease */
    {
        uint32_t b[3] = {3, 102, 4};
        uint8_t res[3];
        kvd_loc_t locs[3];
        assert_int_equal(reserve_batch(s, OWNER_A, ns, b, NULL, NULL, 3, res, locs), 0);
        assert_int_equal(res[0], KVD_RESERVE_EXISTS);
        assert_int_equal(res[1], KVD_RESERVE_NO_SPACE);
        assert_int_equal(res[2], KVD_RESERVE_EXISTS);
    }
    /* released: the least recently used goes (depth 0 everywhere, so the
     * leaf rule does not apply; the pins were released together) */
    assert_int_equal(kvd_store_release(s, OWNER_B, r), KVD_OK);
    check_ok(s);
    push_new(s, ns, 100);
    assert_int_equal(stats(s).evictions, 1);
    kvd_store_destroy(s);

    /* a pool full of reservations */
    s = mk_store(16, 1.0, 1.0);
    ns = reg(s, "kv", PAGE);
    uint8_t res[16];
    kvd_loc_t locs[16];
    uint64_t w = reserve_batch(s, OWNER_A, ns, k, NULL, NULL, 16, res, locs);
    assert_no_space_for(s, ns, OWNER_B, 100);
    assert_no_space_for(s, ns, OWNER_A, 100);
    assert_int_equal(kvd_store_revoke(s, OWNER_A, w, NULL, 0), KVD_OK);
    check_ok(s);
    kvd_store_destroy(s);

    /* half pinned, half being written; then a batch that fits in part */
    s = mk_store(16, 1.0, 1.0);
    ns = reg(s, "kv", PAGE);
    for (uint32_t i = 0; i < 8; i++)
        put_one(s, ns, i);
    assert_int_equal(acquire(s, OWNER_B, ns, k, 8, &r), KVD_OK);
    uint32_t wk[6] = {8, 9, 10, 11, 12, 13};
    w = reserve_batch(s, OWNER_A, ns, wk, NULL, NULL, 6, res, locs);
    assert_true(w != 0);
    uint32_t more[4] = {20, 21, 22, 23};
    uint64_t w2 = reserve_batch(s, OWNER_B, ns, more, NULL, NULL, 4, res, locs);
    assert_int_equal(res[0], KVD_RESERVE_ALLOCATED);
    assert_int_equal(res[1], KVD_RESERVE_ALLOCATED);
    assert_int_equal(res[2], KVD_RESERVE_NO_SPACE);
    assert_int_equal(res[3], KVD_RESERVE_NO_SPACE);
    assert_true(w2 != 0);
    assert_int_equal(stats(s).evictions, 0);
    assert_no_space_for(s, ns, OWNER_A, 99);
    assert_int_equal(kvd_store_owner_gone(s, OWNER_B), 2);
    assert_int_equal(kvd_store_owner_gone(s, OWNER_A), 1);
    check_ok(s);
    kvd_store_expire(s, UINT64_MAX / 2); /* past the dead writers' grace */
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.free_bytes, 8 * PAGE);
    assert_int_equal(st.objects_ready, 8);
    kvd_store_destroy(s);
}

/* ------------------------------------------------- evict_key, evict_ns */

static void test_evict_key(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(16, 1.0, 1.0);
    uint32_t ns = reg(s, "kv", 2 * PAGE);
    put_one(s, ns, 1);
    put_one(s, ns, 2);
    uint8_t res;
    kvd_loc_t loc;
    uint32_t three = 3;
    reserve_batch(s, OWNER_A, ns, &three, NULL, NULL, 1, &res, &loc);
    uint32_t two = 2;
    uint64_t r;
    assert_int_equal(acquire(s, OWNER_B, ns, &two, 1, &r), KVD_OK);

    kvd_store_stats_t before = stats(s);
    key_t32 key;
    mkkey(key, 2);
    assert_int_equal(kvd_store_evict_key(s, ns, key), KVD_ERR_BUSY); /* pinned */
    mkkey(key, 3);
    assert_int_equal(kvd_store_evict_key(s, ns, key), KVD_ERR_BUSY); /* WRITING */
    mkkey(key, 4);
    assert_int_equal(kvd_store_evict_key(s, ns, key), KVD_ERR_NOT_FOUND);
    check_ok(s);
    kvd_store_stats_t after = stats(s);
    assert_int_equal(after.free_bytes, before.free_bytes);
    assert_int_equal(after.evictions, 0);

    mkkey(key, 1);
    assert_int_equal(kvd_store_evict_key(s, ns, key), KVD_OK);
    check_ok(s);
    assert_false(present(s, ns, 1));
    after = stats(s);
    assert_int_equal(after.evictions, 1);
    assert_int_equal(after.evicted_bytes, 2 * PAGE);
    assert_int_equal(after.free_bytes, before.free_bytes + 2 * PAGE);
    assert_int_equal(after.objects_ready, 1);
    kvd_ns_info_t ni;
    kvd_store_ns_info(s, ns, &ni);
    assert_int_equal(ni.evictions, 1);
    assert_int_equal(ni.objects_ready, 1);
    assert_int_equal(kvd_store_evict_key(s, ns, key), KVD_ERR_NOT_FOUND);
    kvd_store_destroy(s);
}

/* evict_ns: every READY unpinned object of the namespace goes; pinned and
 * WRITING objects stay and are counted as skipped; other namespaces are
 * untouched. UINT32_MAX: all namespaces. */
static void test_evict_ns(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(64, 1.0, 1.0);
    uint32_t a = reg(s, "a", PAGE), b = reg(s, "b", 2 * PAGE);
    for (uint32_t k = 0; k < 7; k++)
        put_one(s, a, k);
    for (uint32_t k = 0; k < 4; k++)
        put_one(s, b, k);
    uint32_t pin[2] = {5, 6};
    uint64_t r1, r2;
    assert_int_equal(acquire(s, OWNER_B, a, pin, 2, &r1), KVD_OK);
    assert_int_equal(acquire(s, OWNER_B, a, pin, 1, &r2), KVD_OK); /* 5 pinned twice */
    uint32_t wk[3] = {10, 11, 12};
    uint8_t res[3];
    kvd_loc_t locs[3];
    uint64_t w = reserve_batch(s, OWNER_A, a, wk, NULL, NULL, 3, res, locs);
    uint64_t free0 = stats(s).free_bytes;

    uint64_t ev = 99, sk = 99;
    assert_int_equal(kvd_store_evict_ns(s, a, &ev, &sk), KVD_OK);
    check_ok(s);
    assert_int_equal(ev, 5);
    assert_int_equal(sk, 5); /* 2 pinned objects + 3 being written */
    for (uint32_t k = 0; k < 5; k++)
        assert_false(present(s, a, k));
    assert_true(present(s, a, 5));
    assert_true(present(s, a, 6));
    for (uint32_t k = 0; k < 4; k++)
        assert_true(present(s, b, k));
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.free_bytes, free0 + 5 * PAGE);
    assert_int_equal(st.evictions, 5);
    assert_int_equal(st.pins, 3);
    kvd_ns_info_t ni;
    kvd_store_ns_info(s, a, &ni);
    assert_int_equal(ni.evictions, 5);
    kvd_store_ns_info(s, b, &ni);
    assert_int_equal(ni.evictions, 0);

    assert_int_equal(kvd_store_evict_ns(s, a, &ev, &sk), KVD_OK);
    assert_int_equal(ev, 0);
    assert_int_equal(sk, 5);

    assert_int_equal(kvd_store_evict_ns(s, UINT32_MAX, &ev, &sk), KVD_OK);
    check_ok(s);
    assert_int_equal(ev, 4);
    assert_int_equal(sk, 5);
    for (uint32_t k = 0; k < 4; k++)
        assert_false(present(s, b, k));

    assert_int_equal(kvd_store_release(s, OWNER_B, r1), KVD_OK);
    assert_int_equal(kvd_store_release(s, OWNER_B, r2), KVD_OK);
    assert_int_equal(kvd_store_publish(s, OWNER_A, w, NULL, 0), KVD_OK);
    assert_int_equal(kvd_store_evict_ns(s, UINT32_MAX, &ev, &sk), KVD_OK);
    check_ok(s);
    assert_int_equal(ev, 5);
    assert_int_equal(sk, 0);
    st = stats(s);
    assert_int_equal(st.free_bytes, st.pool_bytes);
    assert_int_equal(st.free_extents, 1);
    kvd_store_destroy(s);
}

/* ------------------------------------------------------ fragmentation */

#define FRAG_PAGES 64u

typedef struct live {
    uint32_t ns, key;
    uint64_t off_pages, pages;
    bool alive;
} live_t;

/* The free runs of the pool given the live objects: count and largest. */
static void free_runs(const live_t *objs, size_t n, uint64_t *runs, uint64_t *largest,
                      uint64_t *free_pages)
{
    uint8_t used[FRAG_PAGES] = {0};
    for (size_t i = 0; i < n; i++)
        if (objs[i].alive)
            for (uint64_t p = 0; p < objs[i].pages; p++) {
                assert_true(objs[i].off_pages + p < FRAG_PAGES);
                assert_int_equal(used[objs[i].off_pages + p], 0); /* no overlap */
                used[objs[i].off_pages + p] = 1;
            }
    *runs = *largest = *free_pages = 0;
    uint64_t run = 0;
    for (uint32_t p = 0; p <= FRAG_PAGES; p++) {
        if (p < FRAG_PAGES && !used[p]) {
            run++;
            (*free_pages)++;
            continue;
        }
        if (run) {
            (*runs)++;
            if (run > *largest)
                *largest = run;
        }
        run = 0;
    }
}

static void assert_frag(const kvd_store_t *s, const live_t *objs, size_t n)
{
    uint64_t runs, largest, fp;
    free_runs(objs, n, &runs, &largest, &fp);
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.free_bytes, fp * PAGE);
    assert_int_equal(st.free_extents, runs);
    assert_int_equal(st.largest_free_bytes, largest * PAGE);
    if (fp) {
        double want = 1.0 - (double)largest / (double)fp;
        assert_true(st.fragmentation > want - 1e-12 && st.fragmentation < want + 1e-12);
    }
}

static void evict_obj(kvd_store_t *s, live_t *o)
{
    key_t32 key;
    mkkey(key, o->key);
    assert_int_equal(kvd_store_evict_key(s, o->ns, key), KVD_OK);
    check_ok(s);
    o->alive = false;
}

/* Two namespaces (1-page and 3-page objects) interleaved fill the pool.
 * Evicting every 3-page object leaves holes between the 1-page ones; the
 * figures follow from the locations: free extents = maximal free runs,
 * fragmentation = 1 - largest / free. A 4-page object then needs
 * contiguous room and gets it, by eviction if need be. */
static void test_fragmentation(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(FRAG_PAGES, 1.0, 1.0);
    uint32_t a = reg(s, "one", PAGE), b = reg(s, "three", 3 * PAGE);
    live_t objs[32];
    size_t n = 0;
    for (uint32_t i = 0; i < 16; i++) {
        kvd_loc_t la = put_one(s, a, i);
        objs[n++] = (live_t){a, i, la.offset / PAGE, 1, true};
        kvd_loc_t lb = put_one(s, b, i);
        objs[n++] = (live_t){b, i, lb.offset / PAGE, 3, true};
    }
    assert_int_equal(stats(s).free_bytes, 0);
    assert_int_equal(stats(s).evictions, 0);
    assert_frag(s, objs, n);

    for (size_t i = 0; i < n; i++)
        if (objs[i].ns == b)
            evict_obj(s, &objs[i]);
    assert_frag(s, objs, n);
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.free_bytes, 48 * PAGE);
    print_message("interleaved, 3-page objects evicted: %llu free extents, largest "
                  "%llu pages, fragmentation %.4f\n",
                  (unsigned long long)st.free_extents,
                  (unsigned long long)(st.largest_free_bytes / PAGE), st.fragmentation);

    /* a 3-page object fits a 3-page hole: no eviction needed */
    uint64_t ev0 = st.evictions;
    kvd_loc_t l3 = put_one(s, b, 100);
    assert_int_equal(stats(s).evictions, ev0);
    live_t extra = {b, 100, l3.offset / PAGE, 3, true};
    live_t all[33];
    memcpy(all, objs, sizeof(objs));
    all[32] = extra;
    assert_frag(s, all, 33);
    evict_obj(s, &all[32]);
    assert_frag(s, objs, n);

    /* a 4-page object needs contiguous room: granted (by eviction if need
     * be) and placed on free pages */
    uint32_t c = reg(s, "four", 4 * PAGE);
    kvd_loc_t l4 = put_one(s, c, 7);
    assert_int_equal(l4.offset % PAGE, 0);
    for (size_t i = 0; i < n; i++) /* evicted objects are gone for good */
        if (objs[i].alive && !present(s, objs[i].ns, objs[i].key))
            objs[i].alive = false;
    live_t all2[33];
    memcpy(all2, objs, sizeof(objs));
    all2[32] = (live_t){c, 7, l4.offset / PAGE, 4, true};
    assert_frag(s, all2, 33);

    /* everything gone: one free extent, the whole pool */
    uint64_t ev, sk;
    assert_int_equal(kvd_store_evict_ns(s, UINT32_MAX, &ev, &sk), KVD_OK);
    check_ok(s);
    st = stats(s);
    assert_int_equal(st.free_bytes, FRAG_PAGES * PAGE);
    assert_int_equal(st.free_extents, 1);
    assert_int_equal(st.largest_free_bytes, FRAG_PAGES * PAGE);
    assert_true(st.fragmentation == 0.0);
    kvd_store_destroy(s);
}

/* Freeing merges free neighbours: 1-page objects fill a 16-page pool; the
 * objects at pages 5, 6, 7 and 4 (found by their locations) are evicted in
 * that order: 1 extent (5), 2 (5 | 7), 1 of 3 pages (5..7), 1 of 4 (4..7). */
static void test_free_neighbours_merge(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(16, 1.0, 1.0);
    uint32_t ns = reg(s, "one", PAGE);
    live_t at[16];
    memset(at, 0, sizeof(at));
    for (uint32_t i = 0; i < 16; i++) {
        kvd_loc_t l = put_one(s, ns, i);
        assert_true(l.offset / PAGE < 16);
        assert_false(at[l.offset / PAGE].alive);
        at[l.offset / PAGE] = (live_t){ns, i, l.offset / PAGE, 1, true};
    }
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.free_bytes, 0);
    assert_int_equal(st.free_extents, 0);
    assert_int_equal(st.largest_free_bytes, 0);
    const uint32_t order[4] = {5, 7, 6, 4};
    const uint64_t extents[4] = {1, 2, 1, 1}, largest[4] = {1, 1, 3, 4};
    for (int i = 0; i < 4; i++) {
        evict_obj(s, &at[order[i]]);
        st = stats(s);
        assert_int_equal(st.free_extents, extents[i]);
        assert_int_equal(st.largest_free_bytes, largest[i] * PAGE);
        assert_int_equal(st.free_bytes, (uint64_t)(i + 1) * PAGE);
        double want = 1.0 - (double)largest[i] / (double)(i + 1);
        assert_true(st.fragmentation > want - 1e-12 && st.fragmentation < want + 1e-12);
    }
    /* the hole 4..7 and a new one at 10: 2 extents, fragmentation 1 - 4/5 */
    evict_obj(s, &at[10]);
    st = stats(s);
    assert_int_equal(st.free_extents, 2);
    assert_true(st.fragmentation > 0.2 - 1e-12 && st.fragmentation < 0.2 + 1e-12);
    /* a 4-page hole takes a 4-page object without eviction */
    uint32_t four = reg(s, "four", 4 * PAGE);
    kvd_loc_t l4 = put_one(s, four, 1);
    assert_int_equal(l4.offset, 4 * PAGE);
    assert_int_equal(stats(s).evictions, 5);
    kvd_store_destroy(s);
}

/*
 * An object of 33 pages (not a multiple of its size class's step) fits an
 * exact-size hole: in an empty 33-page pool, and into the hole another
 * object of its namespace left, without evicting more than needed.
 */
static void test_exact_fit_of_odd_large_object(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(33, 1.0, 1.0);
    uint32_t ns = reg(s, "odd", 33 * PAGE);
    uint8_t res;
    kvd_loc_t loc;
    uint32_t k = 1;
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.largest_free_bytes, 33 * PAGE);
    uint64_t w = reserve_batch(s, OWNER_A, ns, &k, NULL, NULL, 1, &res, &loc);
    if (res != KVD_RESERVE_ALLOCATED)
        print_error("33-page object in an empty 33-page pool: %s\n",
                    reserve_result_name(res));
    bool ok1 = res == KVD_RESERVE_ALLOCATED && w != 0 && loc.offset == 0;
    kvd_store_destroy(s);

    s = mk_store(4 * 33, 1.0, 1.0);
    ns = reg(s, "odd", 33 * PAGE);
    for (uint32_t i = 0; i < 4; i++) {
        uint64_t l = reserve_batch(s, OWNER_A, ns, &i, NULL, NULL, 1, &res, &loc);
        assert_int_equal(res, KVD_RESERVE_ALLOCATED);
        assert_int_equal(kvd_store_publish(s, OWNER_A, l, NULL, 0), KVD_OK);
    }
    kvd_store_stats_t st2 = stats(s);
    if (st2.evictions != 0)
        print_error("four 33-page objects in a 132-page pool: %llu evictions, "
                    "%llu free pages, expected 0 and 0\n",
                    (unsigned long long)st2.evictions,
                    (unsigned long long)(st2.free_bytes / PAGE));
    kvd_store_destroy(s);
    assert_true(ok1);
    assert_int_equal(st2.evictions, 0);
    assert_int_equal(st2.free_bytes, 0);
}

/* ------------------------------------------------- pool bytes lost */

/* Acquire of one key by OWNER_B, released again at once: KVD_OK, or the
 * status (a lost object is KVD_ERR_NOT_FOUND even while pinned). */
static int acquire_probe(kvd_store_t *s, uint32_t ns, uint32_t k)
{
    uint64_t lease = 0;
    int rc = acquire(s, OWNER_B, ns, &k, 1, &lease);
    if (rc == KVD_OK)
        assert_int_equal(kvd_store_release(s, OWNER_B, lease), KVD_OK);
    check_ok(s);
    return rc;
}

/* The figures two stores that lost the same bytes must agree on. */
static void assert_same_loss(const kvd_store_t *a, const kvd_store_t *b)
{
    kvd_store_stats_t x = stats(a), y = stats(b);
    assert_int_equal(x.pool_lost_ranges, y.pool_lost_ranges);
    assert_int_equal(x.pool_lost_objects, y.pool_lost_objects);
    assert_int_equal(x.objects_ready, y.objects_ready);
    assert_int_equal(x.free_bytes, y.free_bytes);
    assert_int_equal(x.ready_bytes, y.ready_bytes);
    assert_int_equal(x.free_extents, y.free_extents);
    assert_int_equal(x.pins, y.pins);
    assert_int_equal(x.evictions, y.evictions);
}

/* Whether a range of bytes loses pages [*first, *last] of a pool of
 * pool_pages: not when empty or at or past the pool's end. */
static bool range_pages(kvd_pool_range_t r, uint64_t pool_pages, uint64_t *first,
                        uint64_t *last)
{
    if (r.bytes == 0 || r.offset >= pool_pages * PAGE)
        return false;
    uint64_t end =
        r.offset + r.bytes < pool_pages * PAGE ? r.offset + r.bytes : pool_pages * PAGE;
    *first = r.offset / PAGE;
    *last = (end - 1) / PAGE;
    return true;
}

#define LOST_PAGES 32u
#define LOST_OBJS  12u

/* Stores of 32 pages with twelve 2-page objects (keys 1..12) published in
 * that order, the one that ended up at pages 18..19 evicted, the one at
 * 14..15 pinned by OWNER_B (its lease in *pin); by_page[i] is the key of
 * the i-th object by offset. */
static kvd_store_t *lost_store(uint32_t *ns, uint32_t by_page[LOST_OBJS],
                               kvd_loc_t locs[LOST_OBJS], uint64_t *pin)
{
    kvd_store_t *s = mk_store(LOST_PAGES, 1.0, 1.0);
    *ns = reg(s, "two", 2 * PAGE);
    for (uint32_t k = 1; k <= LOST_OBJS; k++)
        locs[k - 1] = put_one(s, *ns, k);
    for (uint32_t i = 0; i < LOST_OBJS; i++)
        by_page[i] = UINT32_MAX;
    for (uint32_t k = 0; k < LOST_OBJS; k++) {
        /* laid end to end from offset 0: the ranges below depend on it */
        assert_int_equal(locs[k].offset % (2 * PAGE), 0);
        uint64_t i = locs[k].offset / (2 * PAGE);
        assert_true(i < LOST_OBJS);
        assert_int_equal(by_page[i], UINT32_MAX);
        by_page[i] = k + 1;
    }
    key_t32 key;
    mkkey(key, by_page[9]);
    assert_int_equal(kvd_store_evict_key(s, *ns, key), KVD_OK);
    assert_int_equal(acquire(s, OWNER_B, *ns, &by_page[7], 1, pin), KVD_OK);
    check_ok(s);
    return s;
}

/*
 * kvd_store_pool_lost_ranges of many ranges in one call does what
 * kvd_store_pool_lost of each does (issue 14, a writer that punched many
 * holes): two stores built alike lose the same ranges, one call per range
 * on A, one call for all on B. The ranges, ascending, over twelve 2-page
 * objects o0..o11 laid end to end (o9 evicted, o7 pinned), then the free
 * tail and past the end:
 *   r0  100 bytes inside o0's first page       o0
 *   r1  8 bytes of o0's second page            (o0 again: nothing more)
 *   r2  across the o1 | o2 boundary            o1, o2
 *   r3  o3's last page, ending where o4 starts o3
 *   r4  one byte inside o4                     o4
 *   r5  ends inside o5                         o5
 *   r6  starts inside o6                       o6
 *   r7  all of o7, pinned                      o7 (absent, dropped at release)
 *       (o8 untouched)
 *   r8  the free extent o9 left                nothing
 *   r9  0 bytes inside o10                     ignored, not counted
 *   r10 o11's last byte and the free tail      o11
 *   r11 across the pool's end                  nothing (counted)
 *   r12, r13 past the pool's end               ignored, not counted
 * Expected: 11 ranges counted, 9 objects lost; o8 and o10 intact.
 */
static void test_pool_lost_ranges_as_one_by_one(void **state)
{
    (void)state;
    uint32_t ns_a, ns_b, at[LOST_OBJS], at_b[LOST_OBJS];
    kvd_loc_t locs_a[LOST_OBJS], locs_b[LOST_OBJS];
    uint64_t pin_a, pin_b;
    kvd_store_t *a = lost_store(&ns_a, at, locs_a, &pin_a);
    kvd_store_t *b = lost_store(&ns_b, at_b, locs_b, &pin_b);
    /* built alike: the same namespace, the same offsets */
    assert_int_equal(ns_a, ns_b);
    for (uint32_t k = 0; k < LOST_OBJS; k++) {
        assert_int_equal(locs_a[k].offset, locs_b[k].offset);
        assert_int_equal(at[k], at_b[k]);
    }
    assert_same_loss(a, b);
    const uint64_t P = PAGE, POOL_B = (uint64_t)LOST_PAGES * PAGE;
#define O(i) (2 * PAGE * (uint64_t)(i))
    const kvd_pool_range_t r[] = {
        {O(0) + 100, 200}, {O(0) + P + 8, 8},   {O(2) - 10, 20},    {O(3) + P, P},
        {O(4) + 10, 1},    {O(5) + 3000, 2000}, {O(6) + P + 5, 10}, {O(7), 2 * P},
        {O(9), 2 * P},     {O(10) + 100, 0},    {O(12) - 1, 2 * P}, {POOL_B - 10, 100},
        {POOL_B + 90, P},  {POOL_B + 5 * P, 1},
    };
#undef O
    const uint64_t each[] = {1, 0, 2, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0};
    const size_t n = sizeof(r) / sizeof(r[0]);
    assert_int_equal(sizeof(each) / sizeof(each[0]), n);
    for (size_t i = 1; i < n; i++) /* ascending, not overlapping */
        assert_true(r[i].offset >= r[i - 1].offset + r[i - 1].bytes);
    const uint64_t ready0 = stats(a).objects_ready;
    assert_int_equal(ready0, LOST_OBJS - 1);

    uint64_t sum_a = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t got = kvd_store_pool_lost(a, r[i].offset, r[i].bytes);
        if (got != each[i])
            print_error("range %zu (%llu +%llu) lost %llu objects, want %llu\n", i,
                        (unsigned long long)r[i].offset, (unsigned long long)r[i].bytes,
                        (unsigned long long)got, (unsigned long long)each[i]);
        assert_int_equal(got, each[i]);
        sum_a += got;
        check_ok(a);
    }
    uint64_t sum_b = kvd_store_pool_lost_ranges(b, r, n);
    check_ok(b);
    assert_int_equal(sum_a, 9);
    assert_int_equal(sum_b, sum_a);
    assert_same_loss(a, b);
    kvd_store_stats_t st = stats(b);
    assert_int_equal(st.pool_lost_ranges, 11);
    assert_int_equal(st.pool_lost_objects, 9);
    /* the pinned o7 is still READY under its pin: 11 - 8 dropped */
    assert_int_equal(st.objects_ready, ready0 - 8);
    assert_int_equal(st.pins, 1);

    kvd_store_t *both[2] = {a, b};
    for (int j = 0; j < 2; j++) {
        kvd_store_t *s = both[j];
        for (uint32_t i = 0; i < LOST_OBJS; i++) {
            int want = i == 8 || i == 10 ? KVD_OK : KVD_ERR_NOT_FOUND;
            int got = acquire_probe(s, ns_a, at[i]);
            if (got != want)
                print_error("store %c: o%u (key %u) acquire %s, want %s\n", "AB"[j], i,
                            at[i], kvd_status_str(got), kvd_status_str(want));
            assert_int_equal(got, want);
            /* in the index: the untouched and the pinned one */
            assert_int_equal(present(s, ns_a, at[i]), i == 7 || i == 8 || i == 10);
        }
    }
    /* the pinned one goes at its release */
    assert_int_equal(kvd_store_release(a, OWNER_B, pin_a), KVD_OK);
    assert_int_equal(kvd_store_release(b, OWNER_B, pin_b), KVD_OK);
    check_ok(a);
    check_ok(b);
    assert_same_loss(a, b);
    st = stats(b);
    assert_int_equal(st.objects_ready, 2);
    assert_int_equal(st.pins, 0);
    assert_int_equal(st.pool_lost_objects, 9); /* counted when marked */
    assert_int_equal(st.free_bytes, (uint64_t)(LOST_PAGES - 4) * PAGE);
    assert_false(present(a, ns_a, at[7]));
    assert_false(present(b, ns_a, at[7]));

    /* the same ranges again: nothing more to lose, the ranges counted */
    sum_a = 0;
    for (size_t i = 0; i < n; i++)
        sum_a += kvd_store_pool_lost(a, r[i].offset, r[i].bytes);
    assert_int_equal(sum_a, 0);
    assert_int_equal(kvd_store_pool_lost_ranges(b, r, n), 0);
    assert_same_loss(a, b);
    assert_int_equal(stats(b).pool_lost_ranges, 22);
    /* only empty ranges and ranges past the end, or none: nothing counted */
    const kvd_pool_range_t none[] = {r[9], {POOL_B, P}, r[12], r[13]};
    assert_int_equal(kvd_store_pool_lost_ranges(b, none, 4), 0);
    assert_int_equal(kvd_store_pool_lost_ranges(b, none, 0), 0);
    assert_int_equal(kvd_store_pool_lost(b, POOL_B, 1), 0);
    assert_int_equal(kvd_store_pool_lost(b, 0, 0), 0);
    assert_int_equal(stats(b).pool_lost_ranges, 22);
    assert_int_equal(stats(b).pool_lost_objects, 9);
    check_ok(b);
    assert_int_equal(acquire_probe(b, ns_a, at[8]), KVD_OK);
    assert_int_equal(acquire_probe(b, ns_a, at[10]), KVD_OK);
    kvd_store_destroy(a);
    kvd_store_destroy(b);
}

#define RL_PAGES 64u
#define RL_OBJS  20u
#define RL_MAXR  96u

static uint64_t rl_state;

/* A small deterministic generator (xorshift64*): the same seed, the same
 * stores and ranges. */
static uint64_t rl_next(uint64_t bound)
{
    rl_state ^= rl_state >> 12;
    rl_state ^= rl_state << 25;
    rl_state ^= rl_state >> 27;
    return (rl_state * 2685821657736338717ull >> 11) % bound;
}

typedef struct rl_obj {
    uint32_t ns, key;
    uint64_t off_pages, pages;
    uint64_t pin; /* the lease pinning it, 0 when none */
    bool evicted;
} rl_obj_t;

/* A store of RL_PAGES pages with RL_OBJS objects of 1 to 3 pages (sizes
 * of the generator's choosing from seed), some evicted, some pinned by
 * OWNER_B. Built alike for the same seed. */
static kvd_store_t *rl_store(uint64_t seed, rl_obj_t objs[RL_OBJS])
{
    rl_state = seed;
    kvd_store_t *s = mk_store(RL_PAGES, 1.0, 1.0);
    const uint64_t bytes[4] = {PAGE, 2 * PAGE, 5000, 3 * PAGE - 100};
    const uint64_t pages[4] = {1, 2, 2, 3};
    uint32_t ns[4];
    ns[0] = reg(s, "p1", bytes[0]);
    ns[1] = reg(s, "p2", bytes[1]);
    ns[2] = reg(s, "p2odd", bytes[2]);
    ns[3] = reg(s, "p3odd", bytes[3]);
    for (uint32_t k = 0; k < RL_OBJS; k++) { /* at most 60 pages: no eviction */
        uint32_t c = (uint32_t)rl_next(4);
        kvd_loc_t loc = put_one(s, ns[c], 100 + k);
        assert_int_equal(loc.offset % PAGE, 0);
        objs[k] = (rl_obj_t){.ns = ns[c],
                             .key = 100 + k,
                             .off_pages = loc.offset / PAGE,
                             .pages = pages[c]};
    }
    assert_int_equal(stats(s).evictions, 0);
    for (uint32_t k = 0; k < RL_OBJS; k++) {
        uint64_t roll = rl_next(6);
        if (roll == 0) {
            key_t32 key;
            mkkey(key, objs[k].key);
            assert_int_equal(kvd_store_evict_key(s, objs[k].ns, key), KVD_OK);
            objs[k].evicted = true;
        } else if (roll == 1) {
            assert_int_equal(
                acquire(s, OWNER_B, objs[k].ns, &objs[k].key, 1, &objs[k].pin), KVD_OK);
        }
    }
    check_ok(s);
    return s;
}

/* Ascending, non-overlapping ranges from the generator: sub-page and
 * multi-page, empty ones, ranges that share a page with the one before,
 * gaps of free or object pages, and some at or past the pool's end. */
static size_t rl_ranges(kvd_pool_range_t *r)
{
    const uint64_t pool = (uint64_t)RL_PAGES * PAGE;
    size_t n = 0;
    uint64_t pos = rl_next(2 * PAGE);
    while (n < RL_MAXR && pos < pool + 2 * PAGE) {
        uint64_t len;
        switch (rl_next(6)) {
        case 0: len = 0; break;
        case 1: len = 1 + rl_next(64); break;
        case 2: len = 1 + rl_next(PAGE); break;
        case 3: len = PAGE * (1 + rl_next(3)); break;
        case 4: len = PAGE - pos % PAGE; break; /* ends on a page boundary */
        default: len = 1 + rl_next(6 * PAGE); break;
        }
        r[n++] = (kvd_pool_range_t){pos, len};
        uint64_t gap = rl_next(3) == 0 ? 0 : rl_next(3 * PAGE);
        pos += len + gap;
    }
    return n;
}

/* Checks store s after the loss against the oracle lost[]: lost objects
 * absent for Acquire (in the index still while pinned), the others there;
 * the figures as counted. */
static void rl_check(kvd_store_t *s, const rl_obj_t *objs, const bool *lost,
                     uint64_t want_ranges, uint64_t want_lost, uint64_t seed, char which)
{
    kvd_store_stats_t st = stats(s);
    if (st.pool_lost_ranges != want_ranges || st.pool_lost_objects != want_lost)
        print_error("seed %llu, store %c: %llu ranges and %llu objects lost, want %llu "
                    "and %llu\n",
                    (unsigned long long)seed, which,
                    (unsigned long long)st.pool_lost_ranges,
                    (unsigned long long)st.pool_lost_objects,
                    (unsigned long long)want_ranges, (unsigned long long)want_lost);
    assert_int_equal(st.pool_lost_ranges, want_ranges);
    assert_int_equal(st.pool_lost_objects, want_lost);
    for (uint32_t k = 0; k < RL_OBJS; k++) {
        const rl_obj_t *o = &objs[k];
        int want = o->evicted || lost[k] ? KVD_ERR_NOT_FOUND : KVD_OK;
        int got = acquire_probe(s, o->ns, o->key);
        if (got != want)
            print_error("seed %llu, store %c: key %u at pages %llu..%llu: acquire %s, "
                        "want %s\n",
                        (unsigned long long)seed, which, o->key,
                        (unsigned long long)o->off_pages,
                        (unsigned long long)(o->off_pages + o->pages - 1),
                        kvd_status_str(got), kvd_status_str(want));
        assert_int_equal(got, want);
        assert_int_equal(present(s, o->ns, o->key), !o->evicted && (!lost[k] || o->pin));
    }
}

/* Many generated layouts and range lists: one call for all ranges loses
 * what one call per range loses, and what the pages say (an object is
 * lost when a non-empty range in the pool shares a page with it); a lost
 * pinned object goes at its release. */
static void test_pool_lost_ranges_generated(void **state)
{
    (void)state;
    uint64_t total_ranges = 0, total_lost = 0;
    for (uint64_t seed = 1; seed <= 400; seed++) {
        rl_obj_t oa[RL_OBJS], ob[RL_OBJS];
        kvd_store_t *a = rl_store(seed * 0x9e3779b97f4a7c15ull, oa);
        kvd_store_t *b = rl_store(seed * 0x9e3779b97f4a7c15ull, ob);
        for (uint32_t k = 0; k < RL_OBJS; k++) {
            assert_int_equal(oa[k].off_pages, ob[k].off_pages);
            assert_int_equal(oa[k].evicted, ob[k].evicted);
            assert_int_equal(oa[k].pin != 0, ob[k].pin != 0);
        }
        kvd_pool_range_t r[RL_MAXR];
        size_t n = rl_ranges(r);

        /* the oracle, from pages alone */
        bool lost[RL_OBJS] = {false};
        uint64_t want_lost = 0, want_ranges = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t first, last;
            if (!range_pages(r[i], RL_PAGES, &first, &last))
                continue;
            want_ranges++;
            for (uint32_t k = 0; k < RL_OBJS; k++) {
                const rl_obj_t *o = &oa[k];
                bool hit = o->off_pages <= last && o->off_pages + o->pages > first;
                if (hit && !o->evicted && !lost[k]) {
                    lost[k] = true;
                    want_lost++;
                }
            }
        }
        uint64_t sum_a = 0;
        for (size_t i = 0; i < n; i++) {
            sum_a += kvd_store_pool_lost(a, r[i].offset, r[i].bytes);
            check_ok(a);
        }
        uint64_t sum_b = kvd_store_pool_lost_ranges(b, r, n);
        check_ok(b);
        if (sum_a != want_lost || sum_b != want_lost)
            print_error("seed %llu: %zu ranges lose %llu objects one by one and %llu in "
                        "one call, want %llu\n",
                        (unsigned long long)seed, n, (unsigned long long)sum_a,
                        (unsigned long long)sum_b, (unsigned long long)want_lost);
        assert_int_equal(sum_a, want_lost);
        assert_int_equal(sum_b, want_lost);
        assert_same_loss(a, b);
        rl_check(a, oa, lost, want_ranges, want_lost, seed, 'A');
        rl_check(b, ob, lost, want_ranges, want_lost, seed, 'B');
        /* the pins released: the lost ones under them go, the stores agree */
        for (uint32_t k = 0; k < RL_OBJS; k++) {
            if (oa[k].pin != 0)
                assert_int_equal(kvd_store_release(a, OWNER_B, oa[k].pin), KVD_OK);
            if (ob[k].pin != 0)
                assert_int_equal(kvd_store_release(b, OWNER_B, ob[k].pin), KVD_OK);
            oa[k].pin = ob[k].pin = 0;
        }
        check_ok(a);
        check_ok(b);
        assert_same_loss(a, b);
        rl_check(a, oa, lost, want_ranges, want_lost, seed, 'A');
        rl_check(b, ob, lost, want_ranges, want_lost, seed, 'B');
        assert_int_equal(stats(b).pins, 0);
        total_ranges += want_ranges;
        total_lost += want_lost;
        kvd_store_destroy(a);
        kvd_store_destroy(b);
    }
    print_message("400 layouts: %llu ranges, %llu objects lost, one call agreeing with "
                  "one call per range\n",
                  (unsigned long long)total_ranges, (unsigned long long)total_lost);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lru_then_leaf_first),
        cmocka_unit_test(test_leaf_before_parent_separate_batches),
        cmocka_unit_test(test_publish_batch_root_most_recent),
        cmocka_unit_test(test_watermarks),
        cmocka_unit_test(test_watermarks_spare_pinned),
        cmocka_unit_test(test_pinned_and_writing_never_evicted),
        cmocka_unit_test(test_evict_key),
        cmocka_unit_test(test_evict_ns),
        cmocka_unit_test(test_fragmentation),
        cmocka_unit_test(test_free_neighbours_merge),
        cmocka_unit_test(test_publish_batch_leaf_first_listed),
        cmocka_unit_test(test_chain_extended_later_cut_at_its_end),
        cmocka_unit_test(test_exact_fit_of_odd_large_object),
        cmocka_unit_test(test_pool_lost_ranges_as_one_by_one),
        cmocka_unit_test(test_pool_lost_ranges_generated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
