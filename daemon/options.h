/*
 * options.h - kvdockd's configuration: flags and config file (same keys).
 * Private to daemon/.
 */
#ifndef KVD_DAEMON_OPTIONS_H
#define KVD_DAEMON_OPTIONS_H

#include "kvd_common.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kvd_opts {
    char instance[64];
    char socket_path[108];
    char listen[128];         /* "" = no TCP listener */
    char metrics_listen[128]; /* "" = no metrics endpoint */
    char ucx[8];              /* "auto", "on", "off" */
    bool ucx_tcp;             /* --ucx-tcp: UCX over TCP (and UD) too */
    bool no_ucx_sandbox;      /* --no-ucx-sandbox: no seccomp filter there */
    uint64_t pool_size_bytes; /* 0 = not given */
    double mem_fraction;      /* 0 = not given */
    uint64_t reserve_bytes;
    uint64_t object_bytes;
    uint64_t populate_rate_bps;
    bool hugepages;
    bool mlock;
    char shm_dir[256];       /* the pool file, its journal and lock live here */
    char hugepages_dir[256]; /* with --hugepages: the pool file's hugetlbfs; "" = find one
                              */
    bool fresh;              /* start empty: remove the old pool file and journal */
    bool no_persist;         /* an anonymous pool that dies with the daemon */
    uint64_t journal_compact_bytes; /* compact past this and twice a snapshot */
    /* the SSD tier (kvd_store.h); ssd_path "" = none */
    char ssd_path[256];
    uint64_t ssd_size_bytes;
    uint64_t ssd_segment_bytes;
    char ssd_io[16];   /* "auto", "io_uring", "psync" */
    char ssd_spill[8]; /* "all", "hit" */
    char ssd_sync[4];  /* "on", "off": kvd_tier_opts_t.no_sync */
    uint64_t ssd_queue_depth;
    bool ssd_no_fixed_buffers;
    uint64_t ssd_fail_read_every; /* tests: every n-th read fails with EIO */
    uint64_t max_frame_bytes;
    uint64_t max_batch;
    uint64_t max_connections;
    uint64_t hello_timeout_ms;      /* 0 = none */
    uint64_t frame_timeout_ms;      /* 0 = none */
    uint64_t max_conn_buffer_bytes; /* all connections' buffers together */
    uint64_t usage_interval_s;      /* 0 = no usage line */
    uint64_t drain_timeout_ms;
    double evict_high; /* evict above this fraction of the pool used */
    double evict_low;  /* ... down to this one */
    uint64_t lease_ttl_ms;
    kvd_log_level_t log_level;
    char meminfo_root[256]; /* tests: read /proc and /sys below this */
    /* who may connect (auth.h); "" = not given */
    char auth_token_file[256];
    char auth_config[256];
    char allow_uid[256];
    char allow_gid[256];
    bool insecure_no_auth;
    /* the cluster (cluster.h); cluster_etcd "" = a single-node store */
    char cluster_etcd[512];       /* etcd endpoints, comma-separated URLs */
    char advertise[128];          /* HOST:PORT peers reach this daemon at */
    char node_id[64];             /* "" = the advertise address */
    char cluster_name[64];        /* etcd keys under /kvdock/NAME/ */
    char cluster_token_file[256]; /* the token daemons present to each other */
    uint64_t cluster_ttl_s;       /* the member lease's TTL */
    uint64_t cluster_cache_ms;    /* how long a lookup's answer from owners is kept */
    char cluster_once[256];       /* rank-replicated namespaces stored once per cluster */
} kvd_opts_t;

typedef enum kvd_opts_result {
    KVD_OPTS_RUN = 0,   /* start the daemon */
    KVD_OPTS_EXIT_OK,   /* --help or --version was printed */
    KVD_OPTS_ERROR,     /* a message was printed; exit 2 */
    KVD_OPTS_LIST_NICS, /* --list-nics: list the RDMA devices and exit */
} kvd_opts_result_t;

/* Fills defaults, then the config file (if --config), then the flags. */
kvd_opts_result_t kvd_opts_parse(int argc, char **argv, kvd_opts_t *out);

#endif
