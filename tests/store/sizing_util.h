/*
 * Description: helpers shared by the pool sizing tests (test_sizing.c,
 * test_sizing_advice.c, test_cgroup_v2.c): the path of a fixture host
 * directory, and finding a value suggested in a refusal's text.
 */
#ifndef KVD_TEST_SIZING_UTIL_H
#define KVD_TEST_SIZING_UTIL_H

#include <stdbool.h>
#include <stddef.h>

/* The path of fixture directory name, under $KVD_FIXTURES when set, else
 * under KVD_FIXTURES_DIR; a static buffer, valid until the next call. */
const char *fixture(const char *name);

/* Finds "<flag> <number>" in text; false when the flag is not followed by a
 * number. When suffix is not NULL, *suffix gets the character after the
 * number. */
bool find_suggestion(const char *text, const char *flag, char *number, size_t number_len,
                     char *suffix);

#endif
