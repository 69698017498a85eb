/*
 * extent.c - the records of the store and the extent allocator over the
 * pool: a two-level segregated fit (TLSF) with its metadata outside the
 * pool, in page units.
 *
 * Allocation first looks at a few blocks of the request's own size class (an
 * exact-size hole left by an object of the same namespace is there), then
 * rounds the request up to the next class, where any block fits: O(1)
 * through two bitmaps.
 * Freeing merges with free neighbours (found through phys_prev/phys_next),
 * so no two free extents are ever adjacent. Records come from chunks of
 * 64 Ki; spare records are recycled through a list.
 */
#include "store_int.h"

#include <stdlib.h>
#include <string.h>

/* How many blocks of a request's own size class are looked at for one that
 * fits before the O(1) search of the classes above. */
#define EXACT_FIT_SCAN 16

/* ------------------------------------------------------------ records */

int rec_init(kvd_store_t *s)
{
    /* chunk 0 holds NIL at index 0 */
    s->chunks[0] = kvd_mem_calloc(KVD_MEM_INDEX, REC_CHUNK, sizeof(rec_t));
    if (s->chunks[0] == NULL)
        return KVD_ERR_NOMEM;
    s->n_chunks = 1;
    s->rec_high = 0;
    s->spare = NIL;
    return KVD_OK;
}

void rec_fini(kvd_store_t *s)
{
    for (uint32_t c = 0; c < s->n_chunks; c++)
        kvd_mem_free(KVD_MEM_INDEX, s->chunks[c], REC_CHUNK * sizeof(rec_t));
    s->n_chunks = 0;
}

/* A zeroed record, or NIL when 2^32 records or memory ran out. */
uint32_t rec_new(kvd_store_t *s)
{
    uint32_t i = s->spare;
    if (i != NIL) {
        s->spare = R(s, i)->link_next;
    } else {
        if (s->rec_high == UINT32_MAX)
            return NIL;
        i = s->rec_high + 1;
        uint32_t chunk = i >> REC_CHUNK_SHIFT;
        if (chunk >= s->n_chunks) {
            s->chunks[chunk] = kvd_mem_calloc(KVD_MEM_INDEX, REC_CHUNK, sizeof(rec_t));
            if (s->chunks[chunk] == NULL)
                return NIL;
            s->n_chunks++;
        }
        s->rec_high = i;
    }
    memset(R(s, i), 0, sizeof(rec_t));
    return i;
}

void rec_put(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    memset(r, 0, sizeof(*r));
    r->state = REC_UNUSED;
    r->link_next = s->spare;
    s->spare = i;
}

/* --------------------------------------------------------------- TLSF */

static uint32_t fls32(uint32_t v)
{
    return 31u - (uint32_t)__builtin_clz(v);
}

/* The class a free block of `pages` belongs to. */
static void mapping_insert(uint32_t pages, uint32_t *fl, uint32_t *sl)
{
    if (pages < TLSF_SL_COUNT) {
        *fl = 0;
        *sl = pages;
        return;
    }
    uint32_t f = fls32(pages);
    *sl = (pages >> (f - TLSF_SL_LOG2)) ^ TLSF_SL_COUNT;
    *fl = f - TLSF_SL_LOG2 + 1;
}

/* The smallest class whose every block holds `pages`. */
static void mapping_search(uint32_t pages, uint32_t *fl, uint32_t *sl)
{
    uint64_t p = pages;
    if (p >= TLSF_SL_COUNT)
        p += (1ull << (fls32(pages) - TLSF_SL_LOG2)) - 1;
    if (p > UINT32_MAX) {
        *fl = TLSF_FL_COUNT; /* nothing that large exists */
        *sl = 0;
        return;
    }
    mapping_insert((uint32_t)p, fl, sl);
}

static void free_list_insert(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    uint32_t fl, sl;
    mapping_insert(r->size_pages, &fl, &sl);
    uint32_t head = s->free_heads[fl][sl];
    r->state = REC_FREE;
    r->link_prev = NIL;
    r->link_next = head;
    if (head != NIL)
        R(s, head)->link_prev = i;
    s->free_heads[fl][sl] = i;
    s->fl_bitmap |= 1u << fl;
    s->sl_bitmap[fl] |= 1u << sl;
    s->free_pages += r->size_pages;
    s->free_extents++;
}

static void free_list_remove(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    uint32_t fl, sl;
    mapping_insert(r->size_pages, &fl, &sl);
    if (r->link_prev != NIL)
        R(s, r->link_prev)->link_next = r->link_next;
    else
        s->free_heads[fl][sl] = r->link_next;
    if (r->link_next != NIL)
        R(s, r->link_next)->link_prev = r->link_prev;
    if (s->free_heads[fl][sl] == NIL) {
        s->sl_bitmap[fl] &= ~(1u << sl);
        if (s->sl_bitmap[fl] == 0)
            s->fl_bitmap &= ~(1u << fl);
    }
    r->link_prev = r->link_next = NIL;
    s->free_pages -= r->size_pages;
    s->free_extents--;
}

/* The head of the first non-empty class at or above (fl, sl), or NIL. */
static uint32_t find_suitable(const kvd_store_t *s, uint32_t fl, uint32_t sl)
{
    if (fl >= TLSF_FL_COUNT)
        return NIL;
    uint32_t sl_map = s->sl_bitmap[fl] & (sl < 32 ? ~0u << sl : 0);
    if (sl_map == 0) {
        uint32_t fl_map = fl + 1 < 32 ? s->fl_bitmap & (~0u << (fl + 1)) : 0;
        if (fl_map == 0)
            return NIL;
        fl = (uint32_t)__builtin_ctz(fl_map);
        sl_map = s->sl_bitmap[fl];
    }
    sl = (uint32_t)__builtin_ctz(sl_map);
    return s->free_heads[fl][sl];
}

/* A block of pages' own class that holds it, looking at the first few of the
 * class's list: a namespace's objects all have one size, so the hole one of
 * them left is exactly the size of the next, yet the rounded-up search of
 * TLSF starts one class higher and would never see it. */
static uint32_t find_in_own_class(const kvd_store_t *s, uint32_t pages)
{
    uint32_t fl, sl;
    mapping_insert(pages, &fl, &sl);
    uint32_t i = s->free_heads[fl][sl];
    for (int n = 0; n < EXACT_FIT_SCAN && i != NIL; n++, i = R(s, i)->link_next)
        if (R(s, i)->size_pages >= pages)
            return i;
    return NIL;
}

uint32_t extent_alloc(kvd_store_t *s, uint32_t pages)
{
    if (pages == 0)
        return NIL;
    uint32_t i = find_in_own_class(s, pages);
    if (i == NIL) {
        uint32_t fl, sl;
        mapping_search(pages, &fl, &sl);
        i = find_suitable(s, fl, sl);
    }
    if (i == NIL)
        return NIL;
    free_list_remove(s, i);
    rec_t *r = R(s, i);
    if (r->size_pages > pages) {
        uint32_t j = rec_new(s);
        if (j == NIL) {
            free_list_insert(s, i); /* no record for the rest: fail cleanly */
            return NIL;
        }
        r = R(s, i); /* rec_new may have added a chunk; r stays valid anyway */
        rec_t *rest = R(s, j);
        rest->off_pages = r->off_pages + pages;
        rest->size_pages = r->size_pages - pages;
        rest->ns = r->ns; /* the scrub tag: the rest held what the whole did */
        rest->phys_prev = i;
        rest->phys_next = r->phys_next;
        if (r->phys_next != NIL)
            R(s, r->phys_next)->phys_prev = j;
        r->phys_next = j;
        r->size_pages = pages;
        free_list_insert(s, j);
    }
    r->state = REC_WRITING;
    return i;
}

/* Splits free-list-less record i at `pages`: i keeps the first pages, a new
 * record (returned, NIL out of memory) the rest, with i's scrub tag and
 * state. */
static uint32_t split_after(kvd_store_t *s, uint32_t i, uint32_t pages)
{
    uint32_t j = rec_new(s);
    if (j == NIL)
        return NIL;
    rec_t *r = R(s, i), *rest = R(s, j);
    rest->off_pages = r->off_pages + pages;
    rest->size_pages = r->size_pages - pages;
    rest->ns = r->ns;
    rest->phys_prev = i;
    rest->phys_next = r->phys_next;
    if (r->phys_next != NIL)
        R(s, r->phys_next)->phys_prev = j;
    r->phys_next = j;
    r->size_pages = pages;
    return j;
}

uint32_t extent_carve(kvd_store_t *s, uint32_t f, uint32_t off, uint32_t pages)
{
    rec_t *r = R(s, f);
    if (r->state != REC_FREE || pages == 0 || off < r->off_pages ||
        (uint64_t)off + pages > (uint64_t)r->off_pages + r->size_pages)
        return NIL;
    free_list_remove(s, f);
    uint32_t i = f;
    if (R(s, f)->off_pages < off) {
        /* a free part in front stays free */
        i = split_after(s, f, off - R(s, f)->off_pages);
        free_list_insert(s, f);
        if (i == NIL)
            return NIL;
    }
    if (R(s, i)->size_pages > pages) {
        uint32_t rest = split_after(s, i, pages);
        if (rest == NIL)
            return NIL;
        free_list_insert(s, rest);
    }
    R(s, i)->state = REC_WRITING;
    return i;
}

/* The scrub tag of two extents merged: clean space takes the other's tag,
 * two tenants' bytes make it mixed. */
static uint16_t tag_merge(uint16_t a, uint16_t b)
{
    return a == b || b == SCRUB_CLEAN ? a : a == SCRUB_CLEAN ? b : SCRUB_MIXED;
}

/* Unlinks record b (right after a) from the address order and recycles it,
 * giving its pages (and its scrub tag) to a. */
static void absorb_next(kvd_store_t *s, uint32_t a, uint32_t b)
{
    rec_t *ra = R(s, a), *rb = R(s, b);
    ra->ns = tag_merge(ra->ns, rb->ns);
    ra->size_pages += rb->size_pages;
    ra->phys_next = rb->phys_next;
    if (rb->phys_next != NIL)
        R(s, rb->phys_next)->phys_prev = a;
    rec_put(s, b);
}

void extent_free(kvd_store_t *s, uint32_t i, uint16_t tag)
{
    rec_t *r = R(s, i);
    uint32_t prev = r->phys_prev, next = r->phys_next;
    /* keep only the extent fields: the object's metadata is gone */
    uint32_t off = r->off_pages, size = r->size_pages;
    memset(r, 0, sizeof(*r));
    r->off_pages = off;
    r->size_pages = size;
    r->phys_prev = prev;
    r->phys_next = next;
    r->ns = tag;
    if (next != NIL && R(s, next)->state == REC_FREE) {
        free_list_remove(s, next);
        absorb_next(s, i, next);
    }
    if (prev != NIL && R(s, prev)->state == REC_FREE) {
        free_list_remove(s, prev);
        absorb_next(s, prev, i);
        i = prev;
    }
    free_list_insert(s, i);
}

uint64_t extent_largest_free(const kvd_store_t *s)
{
    if (s->fl_bitmap == 0)
        return 0;
    uint32_t fl = fls32(s->fl_bitmap);
    uint32_t sl = fls32(s->sl_bitmap[fl]);
    uint64_t largest = 0;
    for (uint32_t i = s->free_heads[fl][sl]; i != NIL; i = R(s, i)->link_next)
        largest = KVD_MAX(largest, (uint64_t)R(s, i)->size_pages);
    return largest;
}

const char *extent_check_lists(const kvd_store_t *s, uint64_t *free_records)
{
    uint64_t n = 0;
    for (uint32_t fl = 0; fl < TLSF_FL_COUNT; fl++) {
        for (uint32_t sl = 0; sl < TLSF_SL_COUNT; sl++) {
            uint32_t head = s->free_heads[fl][sl];
            bool bit = (s->sl_bitmap[fl] >> sl) & 1u;
            if ((head != NIL) != bit)
                return "a free-list bitmap bit disagrees with its list";
            uint32_t prev = NIL;
            for (uint32_t i = head; i != NIL; i = R(s, i)->link_next) {
                const rec_t *r = R(s, i);
                uint32_t f, l;
                mapping_insert(r->size_pages, &f, &l);
                if (r->state != REC_FREE || f != fl || l != sl || r->link_prev != prev)
                    return "a free list holds a record of the wrong state or class";
                prev = i;
                if (++n > s->rec_high)
                    return "a free list loops";
            }
        }
        if (((s->fl_bitmap >> fl) & 1u) != (s->sl_bitmap[fl] != 0))
            return "the first-level bitmap disagrees with the second level";
    }
    *free_records = n;
    return NULL;
}
