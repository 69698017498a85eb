/*
 * daemon_testing.h - calls into daemon/ that only its tests make: entry
 * points below the daemon's own calls, so that a test can drive them with a
 * hand-made input. Production code does not include this header (daemon/
 * itself includes it where it defines them).
 */
#ifndef KVD_DAEMON_TESTING_H
#define KVD_DAEMON_TESTING_H

#include "nics.h"

/*
 * Fills *out with every port below `root` (a /sys/class/infiniband tree)
 * from sysfs alone: verbs_ok false, MTU unknown, state from ports/<p>/state
 * ("4: ACTIVE" -> "active"): what kvd_nics_discover does for a device verbs
 * cannot open, here on a tree a test made. Returns KVD_OK (n = 0 when root
 * does not exist) or KVD_ERR_NOMEM. Built with or without verbs.
 */
int kvd_nics_discover_sysfs(const char *root, kvd_nic_list_t *out);

#endif
