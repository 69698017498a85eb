/*
 * Description: strings a client chose cannot forge or garble the daemon's
 * log. Issue 11: a Hello whose client_name held a newline wrote a second,
 * forged line into the log. Here a Hello names itself
 * "w1\n<timestamp> error server: forged" and another
 * "tty\x1b[2J\\x0a" (a terminal escape, a backslash); the daemon's log,
 * captured by the harness, has no line that starts with the forged
 * timestamp, no ESC byte, and shows both names escaped (\x0a, \x1b, and
 * the backslash doubled, so the escaped forms tell the bytes apart).
 */
#include "dtest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FORGED_TS "2031-01-01T00:00:00.000Z"

int main(void)
{
    kvd_test_daemon_t d;
    if (dt_start(&d, NULL) == 0) {
        const char *names[] = {"w1\n" FORGED_TS " error server: forged",
                               "tty\x1b[2J\\x0a"};
        for (size_t i = 0; i < KVD_ARRAY_SIZE(names); i++) {
            kvd_client_t *c = dt_connect(d.socket, false);
            if (c == NULL)
                continue;
            kvd_hello_rep_t h;
            int rc = dt_hello(c, names[i], &h, 10000);
            DT_CHECK(rc == KVD_OK, "hello %zu: %s", i, kvd_status_str(rc));
            kvd_client_close(c);
        }
        /* the hello lines are written before the replies go out: a
         * Health round trip after them finds them in the log */
        DT_CHECK(dt_health_fresh(d.socket, NULL) == KVD_HEALTH_READY, "health");
        char *log = dt_read_file(d.log);
        if (DT_CHECK(log != NULL, "cannot read the log %s", d.log)) {
            for (char *line = log; line != NULL && *line;) {
                DT_CHECK(strncmp(line, FORGED_TS, strlen(FORGED_TS)) != 0,
                         "a forged log line: %.80s", line);
                char *nl = strchr(line, '\n');
                line = nl ? nl + 1 : NULL;
            }
            DT_CHECK(strchr(log, '\x1b') == NULL, "an ESC byte reached the log");
            DT_CHECK(strstr(log, "hello from 'w1\\x0a" FORGED_TS
                                 " error server: forged'") != NULL,
                     "the log should show the first name escaped:\n%s", log);
            DT_CHECK(strstr(log, "hello from 'tty\\x1b[2J\\\\x0a'") != NULL,
                     "the log should show the second name escaped:\n%s", log);
            free(log);
        }
    }
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/log_escape");
}
