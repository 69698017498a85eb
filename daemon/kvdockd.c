/*
 * kvdockd.c - the daemon's entry point: options, the sizing decision, the
 * pool, then the event loop until SIGTERM/SIGINT. The same binary, started
 * with --ucx-serve, is the UCX server process (ucxd.h).
 *
 * Exit status: 0 after a clean drain; 1 when a runtime failure stops it (the
 * pool cannot be populated, another daemon holds the instance, the loop
 * fails); 2 for bad options, a pool that does not fit (the message says
 * which value would), or a pool file or journal there of another size,
 * layout or version (the message names --fresh). --list-nics
 * exits 0 once it listed the RDMA ports (also when there are none), 1 when
 * built without libibverbs or discovery failed.
 */
#include "kvd_common.h"
#include "kvd_store.h"
#include "nics.h"
#include "options.h"
#include "ucxd.h"
#include "server.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Every connection is a descriptor: raise the soft limit to the hard one,
 * and keep --max-connections below what it allows (a few descriptors are the
 * daemon's own: pool, epoll, signals, timer, listeners, metrics). */
static void raise_fd_limit(kvd_opts_t *opts)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    uint64_t room = rl.rlim_cur > 96 ? (uint64_t)rl.rlim_cur - 64 : 32;
    if (opts->max_connections > room) {
        KVD_WARN("kvdockd",
                 "--max-connections %llu is over what %llu descriptors allow; "
                 "using %llu",
                 (unsigned long long)opts->max_connections,
                 (unsigned long long)rl.rlim_cur, (unsigned long long)room);
        opts->max_connections = room;
    }
}

/* The first hugetlbfs mount of 2 MiB pages (from /proc/mounts) into dir;
 * false when there is none. */
static bool find_hugetlbfs(char *dir, size_t len)
{
    FILE *f = fopen("/proc/mounts", "r");
    if (f == NULL)
        return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f) != NULL) {
        char dev[256], mnt[512], type[64], mopts[256];
        if (sscanf(line, "%255s %511s %63s %255s", dev, mnt, type, mopts) != 4 ||
            strcmp(type, "hugetlbfs") != 0)
            continue;
        /* the default page size unless the mount names another */
        bool two_mib = strstr(mopts, "pagesize=") == NULL || strstr(mopts, "pagesize=2M");
        if (two_mib && strlen(mnt) < len) {
            kvd_strlcpy(dir, mnt, len);
            found = true;
        }
    }
    fclose(f);
    return found;
}

/* The bytes an existing pool file of the instance has allocated (0 when
 * there is none, or it is not ours): a restart attaches to them, so the
 * sizing counts them as the host's to give. */
static uint64_t pool_file_held(const char *dir, const char *instance,
                               uint64_t *size_bytes)
{
    *size_bytes = 0;
    if (dir == NULL)
        return 0;
    char path[600];
    snprintf(path, sizeof(path), "%s/kvdock-%s.pool", dir, instance);
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
        return 0;
    *size_bytes = (uint64_t)st.st_size;
    return (uint64_t)st.st_blocks * 512;
}

/* The space the journal may still take beside the pool: its bound for a
 * pool of pool_bytes, less what a journal of the instance (moved in, or
 * there already) has allocated. */
static uint64_t journal_space(const kvd_opts_t *o, const char *legacy_dir,
                              uint64_t pool_bytes)
{
    uint64_t bound = kvd_store_journal_bound_bytes(pool_bytes, o->object_bytes,
                                                   o->journal_compact_bytes);
    uint64_t have = 0;
    const char *dirs[2] = {o->shm_dir, legacy_dir};
    for (int i = 0; i < (strcmp(dirs[0], dirs[1]) == 0 ? 1 : 2) && !o->fresh; i++) {
        char path[600];
        snprintf(path, sizeof(path), "%s/kvdock-%s.journal", dirs[i], o->instance);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid())
            have += (uint64_t)st.st_blocks * 512;
    }
    return bound > have ? bound - have : 0;
}

int main(int argc, char **argv)
{
    kvd_opts_t opts;
    if (argc > 1 && strcmp(argv[1], "--ucx-serve") == 0)
        return kvd_ucxd_main(argc, argv); /* the UCX server process (ucxd.h) */
    switch (kvd_opts_parse(argc, argv, &opts)) {
    case KVD_OPTS_EXIT_OK: return 0;
    case KVD_OPTS_ERROR: return 2;
    case KVD_OPTS_LIST_NICS: return kvd_nics_list_main(stdout);
    case KVD_OPTS_RUN: break;
    }
    kvd_log_set_level(opts.log_level);

    /* the credentials before anything big: a daemon that would serve
     * anyone by mistake does not start (exit 2, as for a bad option) */
    kvd_auth_opts_t aopts = {.token_file = opts.auth_token_file,
                             .allow_uid = opts.allow_uid,
                             .allow_gid = opts.allow_gid,
                             .config_file = opts.auth_config,
                             .peer_token_file = opts.cluster_token_file,
                             .insecure_no_auth = opts.insecure_no_auth,
                             .tcp = opts.listen[0] != '\0',
                             .self_uid = getuid()};
    kvd_auth_t *auth = NULL;
    char auth_why[768];
    if (kvd_auth_create(&aopts, &auth, auth_why, sizeof(auth_why)) != KVD_OK) {
        KVD_ERROR("kvdockd", "refusing to start: %s", auth_why);
        return 2;
    }
    if (opts.listen[0] && opts.insecure_no_auth)
        KVD_WARN("kvdockd",
                 "--insecure-no-auth: TCP clients without a token are served as the "
                 "default tenant's operator; anyone reaching %s may read, write and "
                 "evict",
                 opts.listen);

    /* Block the signals the loop reads through a signalfd before any thread
     * starts, so that none of them takes the default action. */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    pthread_sigmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);

    raise_fd_limit(&opts);

    kvd_host_mem_t host;
    int rc = kvd_host_mem_probe(opts.meminfo_root, &host);
    if (rc != KVD_OK) {
        KVD_ERROR("kvdockd",
                  "cannot read the host's memory figures from %s/proc/meminfo: %s",
                  opts.meminfo_root, kvd_status_str(rc));
        kvd_auth_destroy(auth);
        return 1;
    }
    /* the pool is a file that outlives the daemon (its journal beside it),
     * unless --no-persist */
    char huge_dir[sizeof(opts.hugepages_dir)];
    kvd_strlcpy(huge_dir, opts.hugepages_dir, sizeof(huge_dir));
    if (opts.hugepages && !opts.no_persist && huge_dir[0] == '\0' &&
        !find_hugetlbfs(huge_dir, sizeof(huge_dir)))
        kvd_strlcpy(huge_dir, "/dev/hugepages", sizeof(huge_dir)); /* refused, clearly */
    /* the files go into directories private to this user: in a shared
     * /dev/shm any local user could squat their names (kvd_private_dir);
     * an older daemon's files there are moved in by the pool */
    char legacy_shm[sizeof(opts.shm_dir)], legacy_huge[sizeof(huge_dir)];
    kvd_strlcpy(legacy_shm, opts.shm_dir, sizeof(legacy_shm));
    kvd_strlcpy(legacy_huge, huge_dir, sizeof(legacy_huge));
    if (!opts.no_persist) {
        rc = kvd_private_dir(legacy_shm, opts.shm_dir, sizeof(opts.shm_dir));
        /* a missing hugetlbfs mount is refused by the pool, naming the fix */
        struct stat hst;
        if (rc == KVD_OK && opts.hugepages && stat(legacy_huge, &hst) == 0)
            rc = kvd_private_dir(legacy_huge, huge_dir, sizeof(huge_dir));
        if (rc != KVD_OK) {
            KVD_ERROR("kvdockd",
                      "refusing to start: no private directory for the pool file (%s)",
                      kvd_status_str(rc));
            kvd_auth_destroy(auth);
            return 2;
        }
    }
    const char *pool_dir = opts.no_persist  ? NULL
                           : opts.hugepages ? huge_dir
                                            : opts.shm_dir;
    const char *legacy_dir = pool_dir == NULL || strcmp(legacy_shm, opts.shm_dir) == 0
                                 ? NULL
                             : opts.hugepages ? legacy_huge
                                              : legacy_shm;
    uint64_t file_bytes = 0; /* the size of the pool file there, 0 none */
    uint64_t held_bytes = pool_file_held(pool_dir, opts.instance, &file_bytes);
    if (file_bytes == 0 && legacy_dir != NULL) /* one the pool will move in */
        held_bytes = pool_file_held(legacy_dir, opts.instance, &file_bytes);
    kvd_sizing_req_t req = {
        .pool_size_bytes = opts.pool_size_bytes,
        .held_bytes = opts.fresh ? 0 : held_bytes,
        .mem_fraction = opts.mem_fraction,
        .reserve_bytes = opts.reserve_bytes,
        .object_bytes = opts.object_bytes,
        .align_bytes = opts.hugepages ? 2 * KVD_MiB : (uint64_t)sysconf(_SC_PAGESIZE),
    };
    kvd_sizing_t sizing;
    char why[512], line[1024];
    rc = kvd_sizing_compute(&host, &req, &sizing, why, sizeof(why));
    kvd_sizing_format(&host, &req, &sizing, line, sizeof(line));
    KVD_INFO("kvdockd", "kvdockd %s instance %s pid %d; %s", KVD_VERSION, opts.instance,
             (int)getpid(), line);
    if (rc != KVD_OK) {
        KVD_ERROR("kvdockd", "refusing to start: %s", why);
        kvd_auth_destroy(auth);
        return 2;
    }

    /* --mem-fraction gives a size that moves with the memory free at each
     * start: a pool file that fits within it is kept at its own size, so
     * a restart keeps the cache (a larger one is refused by the pool,
     * naming the --pool-size that keeps it and --fresh) */
    uint64_t pool_bytes = sizing.budget_bytes;
    if (opts.mem_fraction > 0 && !opts.fresh && file_bytes > 0 &&
        file_bytes < sizing.budget_bytes && file_bytes % req.align_bytes == 0) {
        char have[32], could[32];
        KVD_INFO(
            "kvdockd",
            "--mem-fraction: the pool file holds a pool of %s, within the %s this start "
            "could give: kept at its size (--fresh starts one of the new size)",
            kvd_size_format(file_bytes, have, sizeof(have)),
            kvd_size_format(sizing.budget_bytes, could, sizeof(could)));
        pool_bytes = file_bytes;
    }
    kvd_pool_opts_t popts = {
        .instance = opts.instance,
        .size_bytes = pool_bytes,
        .hugepages = opts.hugepages,
        .mlock = opts.mlock,
        .populate_rate_bps = opts.populate_rate_bps,
        .dir = pool_dir,
        .lock_dir = opts.shm_dir,
        .fresh = opts.fresh,
        .legacy_dir = legacy_dir,
        .legacy_lock_dir = legacy_shm,
        /* the journal shares the pool's file system unless on hugetlbfs */
        .beside_bytes = pool_dir == NULL || opts.hugepages
                            ? 0
                            : journal_space(&opts, legacy_shm, pool_bytes),
    };
    kvd_pool_t *pool = NULL;
    rc = kvd_pool_create(&popts, &pool);
    if (rc != KVD_OK) {
        KVD_ERROR("kvdockd", "cannot create the pool: %s", kvd_status_str(rc));
        kvd_auth_destroy(auth);
        /* a pool file of another size, or one that does not fit: as a bad
         * option; another daemon of the instance, or a system error: 1 */
        return rc == KVD_ERR_STATE || rc == KVD_ERR_NO_SPACE ? 2 : 1;
    }
    if (kvd_pool_persistent(pool))
        KVD_INFO("kvdockd", "pool file %s (%s)%s", kvd_pool_path(pool),
                 kvd_pool_created(pool) ? "created" : "attached: its bytes are kept",
                 opts.fresh ? ", --fresh: the old one removed" : "");
    kvd_server_t *server = NULL;
    rc = kvd_server_create(&opts, pool, auth, &server);
    if (rc != KVD_OK) {
        KVD_ERROR("kvdockd", "cannot start serving: %s", kvd_status_str(rc));
        kvd_pool_destroy(pool);
        return rc == KVD_ERR_STATE ? 2 : 1; /* a journal of another pool: as options */
    }
    rc = kvd_pool_populate_start(pool);
    int status = 1;
    if (rc == KVD_OK)
        status = kvd_server_run(server);
    else
        KVD_ERROR("kvdockd", "cannot start populating the pool: %s", kvd_status_str(rc));
    kvd_server_destroy(server);
    kvd_pool_destroy(pool);
    KVD_INFO("kvdockd", "exiting with status %d", status);
    return status;
}
