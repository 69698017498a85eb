/*
 * Description: the linker's lock-order check (linker/lock.c). Taking its
 * locks in the order linker_int.h writes down works, also with a
 * condition wait in between; taking one that ranks before a lock the
 * thread holds aborts at once in a debug build (in a child process, which
 * must die of SIGABRT), and so does taking a second data-path lock. A
 * release build has no check: the test skips, saying so.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "linker_int.h"

static lk_mutex_t connect_m, dp_a, dp_b, state_m, lock_m;

static int setup(void **state)
{
    (void)state;
    lk_mutex_init(&connect_m, LK_RANK_CONNECT);
    lk_mutex_init(&dp_a, LK_RANK_DP);
    lk_mutex_init(&dp_b, LK_RANK_DP);
    lk_mutex_init(&state_m, LK_RANK_STATE);
    lk_mutex_init(&lock_m, LK_RANK_LOCK);
    return 0;
}

static void test_in_order_works(void **state)
{
    (void)state;
    lk_lock(&connect_m);
    lk_lock(&dp_a);
    lk_lock(&state_m);
    lk_lock(&lock_m);
    lk_unlock(&lock_m);
    lk_unlock(&state_m);
    lk_unlock(&dp_a);
    /* a later lock again after the earlier ones are gone */
    lk_lock(&lock_m);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    assert_false(lk_cond_timedwait(&c, &lock_m, &now)); /* gives it up and back */
    lk_unlock(&lock_m);
    lk_unlock(&connect_m);
    /* and each alone, in any sequence */
    lk_lock(&lock_m);
    lk_unlock(&lock_m);
    lk_lock(&connect_m);
    lk_unlock(&connect_m);
}

/* Runs fn in a child; returns its wait status. */
static int in_child(void (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        fn();
        _exit(0);
    }
    int st = 0;
    assert_true(pid > 0);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return st;
}

static void wrong_order(void)
{
    lk_lock(&lock_m);
    lk_lock(&connect_m); /* ranks before lock: must abort */
}

static void two_data_paths(void)
{
    lk_lock(&dp_a);
    lk_lock(&dp_b); /* never two at once */
}

static void test_wrong_order_aborts(void **state)
{
    (void)state;
    int st = in_child(wrong_order);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGABRT);
    st = in_child(two_data_paths);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGABRT);
}

int main(void)
{
#ifdef NDEBUG
    const bool checked = false;
#else
    const bool checked = true;
#endif
    if (!checked) {
        printf("SKIP: a release build (NDEBUG) has no lock-order check\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_order_works),
        cmocka_unit_test(test_wrong_order_aborts),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
