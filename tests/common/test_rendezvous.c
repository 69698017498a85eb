/*
 * Description: the properties of the cluster directory's rendezvous hash
 * (kvd_dir_hash, kvd_node_hash, kvd_rendezvous_owner) that the cluster
 * relies on, over 64 members and 10^5 synthetic keys:
 *   - a member leaving moves only the entries it owned, and each of them
 *     to the member that scored second for it;
 *   - a member joining takes entries and moves no other;
 *   - each member's share is within a bound of 1/N;
 *   - the owner is the same member whatever order the list is given in,
 *     as long as no two scores tie (the tie rule: the lower index wins);
 *   - the names that make an entry are kept apart ("ab"+"c" vs "a"+"bc").
 * Owners are compared by member (id), never by index, since a leaver or a
 * joiner shifts the indices of the members behind it.
 *
 * The bound on the shares: with K keys and N members a share is binomial,
 * mean K/N, sd sqrt(K/N (1 - 1/N)) ~ 39.5 at K = 10^5, N = 64; the test
 * allows 6 sd (+-15%), which a fair placement breaks with a probability
 * of about 10^-7 over the 64 members and a biased one (a member with a
 * share off by a sixth) does not pass.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd_common.h"

#define N_MEMBERS 64
#define N_KEYS    100000
#define N_NS      3

typedef struct member {
    char id[32];
    uint64_t hash;
} member_t;

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int member_cmp(const void *a, const void *b)
{
    return strcmp(((const member_t *)a)->id, ((const member_t *)b)->id);
}

static member_t members[N_MEMBERS + 1];
static uint64_t dir[N_KEYS];

/* Members with ids as daemons name themselves (their advertise address),
 * sorted by id; keys in a few namespaces. Fixed seed: the test is the same
 * every run. */
static int setup(void **state)
{
    (void)state;
    rng_state = 15;
    for (size_t i = 0; i < N_MEMBERS; i++) {
        snprintf(members[i].id, sizeof(members[i].id), "10.1.%zu.%zu:7400", i / 10,
                 i % 10);
        members[i].hash = kvd_node_hash(members[i].id);
    }
    qsort(members, N_MEMBERS, sizeof(member_t), member_cmp);
    static const char *const ns[N_NS] = {"m/kv/tp0", "m/kv/tp1", "m/mamba/tp0"};
    for (size_t k = 0; k < N_KEYS; k++) {
        uint8_t key[KVD_KEY_BYTES];
        for (size_t j = 0; j < KVD_KEY_BYTES; j += 8) {
            uint64_t r = rnd();
            memcpy(key + j, &r, 8);
        }
        dir[k] = kvd_dir_hash("default", ns[k % N_NS], key);
    }
    return 0;
}

/* The owner of key k among m[0..n), as a pointer to its id. */
static const char *owner(size_t k, const member_t *m, size_t n)
{
    uint64_t h[N_MEMBERS + 1];
    for (size_t i = 0; i < n; i++)
        h[i] = m[i].hash;
    size_t o = kvd_rendezvous_owner(dir[k], h, n);
    assert_true(o < n);
    return m[o].id;
}

/* The member with the second-highest score for key k (by the score
 * itself, computed here from kvd_rendezvous_score). */
static const char *runner_up(size_t k, const member_t *m, size_t n)
{
    size_t best = SIZE_MAX, second = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        uint64_t s = kvd_rendezvous_score(dir[k], m[i].hash);
        if (best == SIZE_MAX || s > kvd_rendezvous_score(dir[k], m[best].hash)) {
            second = best;
            best = i;
        } else if (second == SIZE_MAX ||
                   s > kvd_rendezvous_score(dir[k], m[second].hash)) {
            second = i;
        }
    }
    return m[second].id;
}

static void test_shares_near_one_over_n(void **state)
{
    (void)state;
    static unsigned count[N_MEMBERS];
    memset(count, 0, sizeof(count));
    for (size_t k = 0; k < N_KEYS; k++) {
        const char *o = owner(k, members, N_MEMBERS);
        count[(const member_t *)(o - offsetof(member_t, id)) - members]++;
    }
    double mean = (double)N_KEYS / N_MEMBERS;
    double sd = sqrt(mean * (1.0 - 1.0 / N_MEMBERS));
    for (size_t i = 0; i < N_MEMBERS; i++) {
        if (fabs((double)count[i] - mean) > 6.0 * sd)
            fail_msg("member %s owns %u of %d keys; 1/N is %.0f (bound +-%.0f)",
                     members[i].id, count[i], N_KEYS, mean, 6.0 * sd);
    }
}

static void test_leaver_moves_only_its_share(void **state)
{
    (void)state;
    for (size_t leaver = 0; leaver < N_MEMBERS; leaver += 21) {
        member_t rest[N_MEMBERS];
        for (size_t i = 0, j = 0; i < N_MEMBERS; i++)
            if (i != leaver)
                rest[j++] = members[i];
        size_t moved = 0, owned = 0;
        for (size_t k = 0; k < N_KEYS; k++) {
            const char *before = owner(k, members, N_MEMBERS);
            const char *after = owner(k, rest, N_MEMBERS - 1);
            bool was_leavers = strcmp(before, members[leaver].id) == 0;
            owned += was_leavers;
            if (strcmp(before, after) == 0)
                continue;
            moved++;
            if (!was_leavers)
                fail_msg("key %zu moved from %s to %s when %s left", k, before, after,
                         members[leaver].id);
            assert_string_equal(after, runner_up(k, members, N_MEMBERS));
        }
        /* every entry of the leaver moved (none stayed with a member that
         * is gone) */
        assert_int_equal(moved, owned);
        assert_true(owned > 0);
    }
}

static void test_joiner_takes_and_moves_nothing_else(void **state)
{
    (void)state;
    /* an id that sorts in the middle of the list, shifting half the
     * indices */
    member_t all[N_MEMBERS + 1];
    memcpy(all, members, sizeof(member_t) * N_MEMBERS);
    snprintf(all[N_MEMBERS].id, sizeof(all[N_MEMBERS].id), "10.1.3.55:7400");
    all[N_MEMBERS].hash = kvd_node_hash(all[N_MEMBERS].id);
    qsort(all, N_MEMBERS + 1, sizeof(member_t), member_cmp);
    assert_string_not_equal(all[0].id, "10.1.3.55:7400");
    assert_string_not_equal(all[N_MEMBERS].id, "10.1.3.55:7400");
    size_t taken = 0;
    bool from[N_MEMBERS] = {false};
    for (size_t k = 0; k < N_KEYS; k++) {
        const char *before = owner(k, members, N_MEMBERS);
        const char *after = owner(k, all, N_MEMBERS + 1);
        if (strcmp(before, after) == 0)
            continue;
        if (strcmp(after, "10.1.3.55:7400") != 0)
            fail_msg("key %zu moved from %s to %s, not to the joiner", k, before, after);
        taken++;
        from[(const member_t *)(before - offsetof(member_t, id)) - members] = true;
    }
    /* its share is near 1/(N+1), the same bound as for the others */
    double mean = (double)N_KEYS / (N_MEMBERS + 1);
    double sd = sqrt(mean * (1.0 - 1.0 / (N_MEMBERS + 1)));
    if (fabs((double)taken - mean) > 6.0 * sd)
        fail_msg("the joiner took %zu of %d keys; 1/(N+1) is %.0f", taken, N_KEYS, mean);
    /* and it takes from every member, not from its neighbours in id order */
    for (size_t i = 0; i < N_MEMBERS; i++)
        if (!from[i])
            fail_msg("the joiner took nothing from %s", members[i].id);
}

static void test_owner_independent_of_order(void **state)
{
    (void)state;
    member_t shuffled[N_MEMBERS];
    memcpy(shuffled, members, sizeof(shuffled));
    for (int round = 0; round < 3; round++) {
        for (size_t i = N_MEMBERS - 1; i > 0; i--) {
            size_t j = (size_t)(rnd() % (i + 1));
            member_t t = shuffled[i];
            shuffled[i] = shuffled[j];
            shuffled[j] = t;
        }
        for (size_t k = 0; k < N_KEYS; k += 7)
            assert_string_equal(owner(k, members, N_MEMBERS),
                                owner(k, shuffled, N_MEMBERS));
    }
}

static void test_ties_and_edges(void **state)
{
    (void)state;
    /* the same member twice scores the same: the lower index wins */
    uint64_t h[3] = {kvd_node_hash("b"), kvd_node_hash("a"), kvd_node_hash("a")};
    uint64_t d = dir[0];
    size_t o = kvd_rendezvous_owner(d, h, 3);
    if (o != 0)
        assert_int_equal(o, 1);
    assert_int_equal(kvd_rendezvous_owner(d, h, 0), SIZE_MAX);
    assert_int_equal(kvd_rendezvous_owner(d, h, 1), 0);
    /* names are kept apart: tenant/namespace boundaries and the key */
    uint8_t key[KVD_KEY_BYTES] = {0};
    assert_true(kvd_dir_hash("ab", "c", key) != kvd_dir_hash("a", "bc", key));
    assert_true(kvd_dir_hash("t", "n1", key) != kvd_dir_hash("t", "n2", key));
    uint8_t key2[KVD_KEY_BYTES] = {0};
    key2[KVD_KEY_BYTES - 1] = 1;
    assert_true(kvd_dir_hash("t", "n", key) != kvd_dir_hash("t", "n", key2));
    /* ids one byte apart score differently for the same entry */
    assert_true(kvd_rendezvous_score(d, kvd_node_hash("10.1.0.1:7400")) !=
                kvd_rendezvous_score(d, kvd_node_hash("10.1.0.2:7400")));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shares_near_one_over_n),
        cmocka_unit_test(test_leaver_moves_only_its_share),
        cmocka_unit_test(test_joiner_takes_and_moves_nothing_else),
        cmocka_unit_test(test_owner_independent_of_order),
        cmocka_unit_test(test_ties_and_edges),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
