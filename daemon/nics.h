/*
 * nics.h - RDMA NIC discovery for kvdockd: which ports this host has, what
 * state they are in, and which of them UCX should use. Private to daemon/.
 *
 * Discovery goes through libibverbs (KVD_HAVE_VERBS) and sysfs
 * (/sys/class/infiniband) for what verbs does not say: the NUMA node and the
 * netdev. A device sysfs lists but verbs cannot open (ib_uverbs not loaded,
 * no /dev/infiniband in a container) still gets a row per port, filled from
 * sysfs and marked verbs_ok = false.
 *
 * Threading: a list belongs to its caller; the functions keep no state.
 */
#ifndef KVD_DAEMON_NICS_H
#define KVD_DAEMON_NICS_H

#include "kvd_common.h"
#include "kvd_proto.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* One port of one RDMA device. Text fields are "" when unknown. */
typedef struct kvd_nic {
    char device[KVD_NIC_NAME_BYTES];     /* "mlx5_0" */
    uint32_t port;                       /* 1-based */
    char state[KVD_NIC_STATE_BYTES];     /* ibv_port_state_str(): "active", ... */
    bool active;                         /* the port is ACTIVE */
    bool verbs_ok;                       /* opened and queried through libibverbs */
    char link_layer[KVD_NIC_LINK_BYTES]; /* "InfiniBand", "Ethernet", "unknown" */
    uint32_t active_mtu_bytes;           /* 0 = unknown */
    char rate[32];                       /* "200 Gb/s (4x HDR)" */
    char gid[KVD_NIC_GID_BYTES];         /* GID index 0, IPv6 text form */
    int numa_node;                       /* -1 = unknown */
    char netdev[KVD_NIC_NETDEV_BYTES];   /* "ib0", "enp1s0f0np0" */
} kvd_nic_t;

/* An owned array of ports, in discovery order (device, then port). */
typedef struct kvd_nic_list {
    kvd_nic_t *nics;
    size_t n;
    size_t cap;
} kvd_nic_list_t;

/*
 * Fills *out (which it first sets empty) with every port of every RDMA
 * device on this host. Returns KVD_OK, also when there are none (n = 0);
 * KVD_ERR_UNSUPPORTED when built without libibverbs; KVD_ERR_NOMEM (the
 * list is then freed). A port that cannot be queried is listed with state
 * "unknown" and a warning is logged.
 */
int kvd_nics_discover(kvd_nic_list_t *out);

/* Frees the array and empties the list. Safe on a zeroed list. */
void kvd_nics_free(kvd_nic_list_t *l);

/*
 * Writes the suggested UCX_NET_DEVICES value into buf: "DEVICE:PORT" of each
 * port that is active and that verbs could open, in list order, separated by
 * commas ("mlx5_0:1,mlx5_1:1"). Returns how many ports it named (0 leaves
 * buf ""), KVD_ERR_TOO_LARGE when buf is too small (buf is then ""), or
 * KVD_ERR_INVALID when buf_len is 0.
 */
int kvd_nics_ucx_devices(const kvd_nic_t *nics, size_t n, char *buf, size_t buf_len);

/*
 * Copies the list into a Stats reply's arena as kvd_nic_msg_t (*out NULL
 * and *n 0 for an empty list). Returns KVD_OK or KVD_ERR_NOMEM.
 */
int kvd_nics_to_msg(const kvd_nic_list_t *l, kvd_msg_t *m, kvd_nic_msg_t **out,
                    size_t *n);

/*
 * Prints the table of the ports (a header, a row per port, a note per port
 * verbs could not open) and the suggested "UCX_NET_DEVICES=..." line, or
 * that no port is active; for an empty list, that there are no RDMA devices
 * and UCX will use TCP and shared memory. Returns KVD_OK or KVD_ERR_NOMEM.
 */
int kvd_nics_print(FILE *f, const kvd_nic_list_t *l);

/*
 * `kvdockd --list-nics`: discovers, prints the table and the suggested
 * UCX_NET_DEVICES line to f (or that there are no RDMA devices). Returns
 * the process exit status: 0 listed (also when none), 1 built without
 * libibverbs or discovery failed.
 */
int kvd_nics_list_main(FILE *f);

#endif
