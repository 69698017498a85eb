/*
 * Description: helpers shared by the pool sizing tests; see sizing_util.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sizing_util.h"

const char *fixture(const char *name)
{
    static char path[1024];
    const char *dir = getenv("KVD_FIXTURES");
    if (dir == NULL || *dir == '\0')
        dir = KVD_FIXTURES_DIR;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return path;
}

bool find_suggestion(const char *text, const char *flag, char *number, size_t number_len,
                     char *suffix)
{
    size_t flen = strlen(flag);
    for (const char *p = strstr(text, flag); p != NULL; p = strstr(p + 1, flag)) {
        const char *q = p + flen;
        if (*q != ' ')
            continue;
        q++;
        size_t n = 0;
        while ((q[n] >= '0' && q[n] <= '9') || q[n] == '.')
            n++;
        if (n == 0 || n >= number_len)
            continue;
        memcpy(number, q, n);
        number[n] = '\0';
        if (suffix != NULL)
            *suffix = q[n];
        return true;
    }
    return false;
}
