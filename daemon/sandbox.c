/*
 * sandbox.c - the UCX server child's seccomp filter (see sandbox.h): a
 * classic BPF program over struct seccomp_data, built at entry because
 * some checks compare an argument with this process's pid.
 *
 * Each refused call is two instructions, "nr == N ? next : skip one" and
 * "return EPERM", so no jump needs more than the 8-bit offsets classic BPF
 * has, however long the list grows.
 */
#include "sandbox.h"
#include "kvd_common.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdbool.h>
#include <stdlib.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/sched.h>

#if defined(__x86_64__)
#define SANDBOX_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SANDBOX_ARCH AUDIT_ARCH_AARCH64
#endif

#ifndef SECCOMP_RET_KILL_PROCESS
#define SECCOMP_RET_KILL_PROCESS 0x80000000U /* Linux 4.14 */
#endif
#ifndef SECCOMP_FILTER_FLAG_TSYNC
#define SECCOMP_FILTER_FLAG_TSYNC 1
#endif

#ifdef SANDBOX_ARCH

#define SANDBOX_MAX 512 /* instructions; the program below uses about 250 */

typedef struct prog {
    struct sock_filter insn[SANDBOX_MAX];
    unsigned n;
    bool full;
} prog_t;

static void emit(prog_t *p, uint16_t code, uint8_t jt, uint8_t jf, uint32_t k)
{
    if (p->n == SANDBOX_MAX) {
        p->full = true;
        return;
    }
    p->insn[p->n++] = (struct sock_filter){code, jt, jf, k};
}

#define LD_NR(p) \
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, offsetof(struct seccomp_data, nr))
#define LD_ARG(p, i)                                                        \
    /* the low 32 bits (little-endian): every argument checked is an int */ \
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, offsetof(struct seccomp_data, args[i]))
#define RET(p, v)    emit(p, BPF_RET | BPF_K, 0, 0, v)
#define RET_ERRNO(e) (SECCOMP_RET_ERRNO | ((uint32_t)(e)&SECCOMP_RET_DATA))

/* nr refused with err. */
static void deny(prog_t *p, long nr, int err)
{
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, 1, (uint32_t)nr);
    RET(p, RET_ERRNO(err));
}

/* nr allowed only when argument `arg` is `value` (or `alt`): refused
 * with EPERM otherwise. Reloads the number after. */
static void allow_if_arg(prog_t *p, long nr, int arg, uint32_t value, uint32_t alt)
{
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, 5, (uint32_t)nr);
    LD_ARG(p, arg);
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 2, 0, value);
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 1, 0, alt);
    RET(p, RET_ERRNO(EPERM));
    RET(p, SECCOMP_RET_ALLOW);
}

/* nr refused with EPERM when argument `arg` matches k: test BPF_JEQ (it
 * is k) or BPF_JSET (it has any bit of k); allowed otherwise. */
static void deny_when(prog_t *p, long nr, int arg, uint16_t test, uint32_t k)
{
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, 4, (uint32_t)nr);
    LD_ARG(p, arg);
    emit(p, BPF_JMP | test | BPF_K, 0, 1, k);
    RET(p, RET_ERRNO(EPERM));
    RET(p, SECCOMP_RET_ALLOW);
}

/* An open that could change a file: for writing, creating, truncating
 * or appending (O_TMPFILE is refused by the kernel without O_WRONLY or
 * O_RDWR, so it is in here too). */
#define OPEN_WRITES ((uint32_t)(O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND))

/* What no thread of the UCX server may call once it serves (sandbox.h). */
static const long denied[] = {
    /* running anything */
    SYS_execve,
    SYS_execveat,
#ifdef SYS_fork
    SYS_fork,
    SYS_vfork,
#endif
    /* other processes of this user */
    SYS_ptrace,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_kcmp,
    SYS_move_pages,
    SYS_migrate_pages,
    SYS_tkill,
    SYS_rt_sigqueueinfo,
    SYS_rt_tgsigqueueinfo,
#ifdef SYS_pidfd_getfd
    SYS_pidfd_getfd,
#endif
#ifdef SYS_pidfd_send_signal
    SYS_pidfd_send_signal,
#endif
#ifdef SYS_process_madvise
    SYS_process_madvise,
#endif
/* files */
#ifdef SYS_open
    SYS_creat,
    SYS_link,
    SYS_symlink,
    SYS_unlink,
    SYS_rename,
    SYS_mkdir,
    SYS_rmdir,
    SYS_mknod,
    SYS_chmod,
    SYS_chown,
    SYS_lchown,
#endif
    SYS_linkat,
    SYS_symlinkat,
    SYS_unlinkat,
    SYS_renameat,
    SYS_mkdirat,
    SYS_mknodat,
    SYS_fchmod,
    SYS_fchmodat,
    SYS_fchown,
    SYS_fchownat,
    SYS_truncate,
    SYS_open_by_handle_at,
    SYS_name_to_handle_at,
#ifdef SYS_renameat2
    SYS_renameat2,
#endif
    /* what seccomp cannot look into, or the kernel's own surface */
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
    SYS_bpf,
    SYS_perf_event_open,
    SYS_userfaultfd,
    SYS_keyctl,
    SYS_add_key,
    SYS_request_key,
    SYS_fanotify_init,
    /* the system */
    SYS_unshare,
    SYS_setns,
    SYS_mount,
    SYS_umount2,
    SYS_pivot_root,
    SYS_chroot,
    SYS_init_module,
    SYS_finit_module,
    SYS_delete_module,
    SYS_kexec_load,
#ifdef SYS_kexec_file_load
    SYS_kexec_file_load,
#endif
    SYS_reboot,
    SYS_swapon,
    SYS_swapoff,
    SYS_acct,
    SYS_quotactl,
    SYS_settimeofday,
    SYS_clock_settime,
    SYS_clock_adjtime,
    SYS_adjtimex,
    SYS_sethostname,
    SYS_setdomainname,
    SYS_syslog,
    SYS_vhangup,
    SYS_personality,
    SYS_setpriority,
    SYS_ioprio_set,
#ifdef SYS_iopl
    SYS_iopl,
    SYS_ioperm,
#endif
#ifdef SYS_fsopen
    SYS_fsopen,
    SYS_fsmount,
    SYS_move_mount,
    SYS_open_tree,
#endif
    /* who it is */
    SYS_setuid,
    SYS_setgid,
    SYS_setreuid,
    SYS_setregid,
    SYS_setresuid,
    SYS_setresgid,
    SYS_setfsuid,
    SYS_setfsgid,
    SYS_setgroups,
    SYS_capset,
};

static void build(prog_t *p, uint32_t self)
{
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, offsetof(struct seccomp_data, arch));
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 1, 0, SANDBOX_ARCH);
    RET(p, SECCOMP_RET_KILL_PROCESS);
    LD_NR(p);
#ifdef __x86_64__
    /* x32's numbers are x86_64's with this bit: none of them is served */
    emit(p, BPF_JMP | BPF_JSET | BPF_K, 0, 1, 0x40000000u);
    RET(p, SECCOMP_RET_KILL_PROCESS);
#endif
    for (size_t i = 0; i < sizeof(denied) / sizeof(denied[0]); i++)
        deny(p, denied[i], EPERM);
    /* clone3's flags are behind a pointer: ENOSYS makes glibc use clone */
    deny(p, SYS_clone3, ENOSYS);
#ifdef SYS_openat2
    /* its flags too; glibc does not use it */
    deny(p, SYS_openat2, ENOSYS);
#endif
    /* opens: for reading only (UCX's TCP transport reads /proc/net/route
     * whenever it queries its interface, endpoint creation included) */
#ifdef SYS_open
    deny_when(p, SYS_open, 1, BPF_JSET, OPEN_WRITES);
#endif
    deny_when(p, SYS_openat, 2, BPF_JSET, OPEN_WRITES);
    /* clone: threads only (flags are the first argument on both ABIs) */
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, 4, SYS_clone);
    LD_ARG(p, 0);
    emit(p, BPF_JMP | BPF_JSET | BPF_K, 1, 0, CLONE_THREAD);
    RET(p, RET_ERRNO(EPERM));
    RET(p, SECCOMP_RET_ALLOW);
    /* signals and limits: this process only (0 is itself where it means
     * the caller; for kill it means the process group: refused) */
    allow_if_arg(p, SYS_kill, 0, self, self);
    allow_if_arg(p, SYS_tgkill, 0, self, self);
    allow_if_arg(p, SYS_prlimit64, 0, self, 0);
    allow_if_arg(p, SYS_sched_setaffinity, 0, self, 0);
    allow_if_arg(p, SYS_sched_setscheduler, 0, self, 0);
    allow_if_arg(p, SYS_sched_setparam, 0, self, 0);
    allow_if_arg(p, SYS_sched_setattr, 0, self, 0);
    deny_when(p, SYS_socket, 0, BPF_JEQ, AF_UNIX);
    deny_when(p, SYS_socketpair, 0, BPF_JEQ, AF_UNIX);
    RET(p, SECCOMP_RET_ALLOW);
}

int kvd_sandbox_enter(char *why, size_t cap)
{
    /* glibc loads libgcc_s the first time a thread exits or is
     * cancelled (its unwinder): loaded now, while the files it searches
     * can still be opened; kept (RTLD_NODELETE) so the later load finds
     * it in memory. Absent, a static build does without it. */
    (void)dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_NODELETE);
    static prog_t p; /* 4 KiB: kept off the stack; one entry per process */
    memset(&p, 0, sizeof(p));
    build(&p, (uint32_t)getpid());
    if (p.full) {
        snprintf(why, cap, "the filter does not fit in %d instructions", SANDBOX_MAX);
        return KVD_ERR_TOO_LARGE;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        int err = errno;
        snprintf(why, cap, "prctl(PR_SET_NO_NEW_PRIVS): %s", strerror(err));
        return kvd_status_from_errno(err);
    }
    struct sock_fprog fp = {.len = (unsigned short)p.n, .filter = p.insn};
    long r =
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &fp);
    if (r > 0) {
        /* TSYNC's answer: the id of a thread that could not take it */
        snprintf(why, cap, "seccomp(TSYNC): thread %ld has a filter of its own", r);
        return KVD_ERR_STATE;
    }
    if (r != 0) {
        int err = errno;
        snprintf(why, cap, "seccomp(SET_MODE_FILTER, TSYNC): %s",
                 err == ENOSYS || err == EINVAL ? "not supported by this kernel"
                                                : strerror(err));
        return err == ENOSYS || err == EINVAL ? KVD_ERR_UNSUPPORTED
                                              : kvd_status_from_errno(err);
    }
    return KVD_OK;
}

#else /* no SANDBOX_ARCH */

int kvd_sandbox_enter(char *why, size_t cap)
{
    snprintf(why, cap, "no seccomp filter is built for this architecture");
    return KVD_ERR_UNSUPPORTED;
}

#endif

/* ---- the file system (Landlock): what the server may open at all */

/* Landlock's ABI (linux/landlock.h), spelled out here so that older
 * kernel headers build too: the calls then answer ENOSYS. Its numbers are
 * the same on every architecture. */
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule       445
#define SYS_landlock_restrict_self  446
#endif
#define LANDLOCK_CREATE_RULESET_VERSION_ (1U << 0)
#define LANDLOCK_RULE_PATH_BENEATH_      1
#define LANDLOCK_ACCESS_FS_EXECUTE_      (1ULL << 0)
#define LANDLOCK_ACCESS_FS_WRITE_FILE_   (1ULL << 1)
#define LANDLOCK_ACCESS_FS_READ_FILE_    (1ULL << 2)
#define LANDLOCK_ACCESS_FS_READ_DIR_     (1ULL << 3)
#define LANDLOCK_ACCESS_FS_REFER_        (1ULL << 13) /* ABI 2 */
#define LANDLOCK_ACCESS_FS_TRUNCATE_     (1ULL << 14) /* ABI 3 */
#define LANDLOCK_ACCESS_FS_IOCTL_DEV_    (1ULL << 15) /* ABI 5 */
/* rights a rule on a file (not a directory) may name */
#define LL_FILE_RIGHTS                                              \
    (LANDLOCK_ACCESS_FS_EXECUTE_ | LANDLOCK_ACCESS_FS_WRITE_FILE_ | \
     LANDLOCK_ACCESS_FS_READ_FILE_ | LANDLOCK_ACCESS_FS_TRUNCATE_ | \
     LANDLOCK_ACCESS_FS_IOCTL_DEV_)

struct ll_ruleset_attr {
    uint64_t handled_access_fs;
};
struct ll_path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

#define LL_READ                                                     \
    (LANDLOCK_ACCESS_FS_READ_FILE_ | LANDLOCK_ACCESS_FS_READ_DIR_ | \
     LANDLOCK_ACCESS_FS_EXECUTE_)
#define LL_DEVICE                                                     \
    (LANDLOCK_ACCESS_FS_READ_FILE_ | LANDLOCK_ACCESS_FS_WRITE_FILE_ | \
     LANDLOCK_ACCESS_FS_IOCTL_DEV_)

/* What the server reads once it runs (from strace of the tcp transport:
 * /proc/net/route on every interface query, which is /proc/self/net) and
 * while UCX starts (its modules and their libraries, the loader's cache,
 * UCX's, rdma-core's and libibverbs' configuration, cpu, memory and NUMA
 * facts, the kernel's somaxconn and yama settings), and the RDMA devices.
 * Beside these it reads nothing: not the daemon's journal (in --shm-dir
 * under /dev/shm), not its --auth-config or token files, not any other
 * process under /proc (the daemon's /proc/PID/mem included). */
static const struct {
    const char *path;
    uint64_t access;
} ll_rules[] = {
    {"/usr", LL_READ},
    {"/lib", LL_READ},
    {"/lib64", LL_READ},
    {"/lib32", LL_READ},
    {"/etc/ld.so.cache", LL_READ},
    {"/etc/ucx", LL_READ},
    {"/etc/libibverbs.d", LL_READ},
    {"/etc/rdma", LL_READ},
    {"/etc/libnl", LL_READ},
    {"/proc/self", LL_READ}, /* opened through the link: this process's /proc/PID */
    {"/proc/sys", LL_READ},
    {"/proc/cpuinfo", LL_READ},
    {"/proc/meminfo", LL_READ},
    {"/proc/stat", LL_READ},
    {"/sys", LL_READ},
    {"/dev/infiniband", LL_DEVICE},
    {"/dev/null", LL_DEVICE},
    {"/dev/zero", LL_DEVICE},
    {"/dev/urandom", LL_DEVICE},
};

/* Allows access beneath path (a file: only the file rights of it). A path
 * that is not here is left out. keep: the descriptor stays open for the
 * process's life, for a procfs directory whose inode must not be made
 * again by a later lookup (a rule names an inode). */
static int ll_allow(int rs, const char *path, uint64_t access, uint64_t handled,
                    bool keep, char *why, size_t cap)
{
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0)
        return KVD_OK;
    struct stat st;
    access &= handled;
    if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode))
        access &= LL_FILE_RIGHTS;
    struct ll_path_beneath_attr pb = {.allowed_access = access, .parent_fd = fd};
    int rc = KVD_OK;
    if (syscall(SYS_landlock_add_rule, rs, LANDLOCK_RULE_PATH_BENEATH_, &pb, 0) != 0) {
        int err = errno;
        snprintf(why, cap, "landlock_add_rule(%s): %s", path, strerror(err));
        rc = kvd_status_from_errno(err);
    }
    if (!keep || rc != KVD_OK)
        close(fd);
    return rc;
}

/* The directories the loaded objects came from (a UCX or rdma-core under
 * /opt, a spack or conda tree): their modules and providers are loaded
 * from beside them. */
typedef struct ll_dirs {
    int rs;
    uint64_t handled;
    int rc;
    char *why;
    size_t cap;
} ll_dirs_t;

static int ll_object_dir(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    ll_dirs_t *d = arg;
    if (d->rc != KVD_OK || info->dlpi_name == NULL || info->dlpi_name[0] != '/')
        return 0;
    char dir[PATH_MAX];
    kvd_strlcpy(dir, info->dlpi_name, sizeof(dir));
    char *slash = strrchr(dir, '/');
    if (slash != NULL && slash != dir) {
        *slash = '\0';
        d->rc = ll_allow(d->rs, dir, LL_READ, d->handled, false, d->why, d->cap);
    }
    return 0;
}

int kvd_sandbox_confine_files(char *why, size_t cap)
{
    long abi =
        syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION_);
    if (abi < 1) {
        int err = errno;
        snprintf(why, cap, "Landlock: %s",
                 err == ENOSYS       ? "not in this kernel (5.13 or later has it)"
                 : err == EOPNOTSUPP ? "not enabled in this kernel (lsm= at boot)"
                                     : strerror(err));
        return err == ENOSYS || err == EOPNOTSUPP ? KVD_ERR_UNSUPPORTED
                                                  : kvd_status_from_errno(err);
    }
    /* every right this kernel knows: a right left unhandled is allowed */
    uint64_t handled = (LANDLOCK_ACCESS_FS_REFER_ << 1) - 1; /* ABI 1 and 2 */
    if (abi < 2)
        handled &= ~LANDLOCK_ACCESS_FS_REFER_;
    if (abi >= 3)
        handled |= LANDLOCK_ACCESS_FS_TRUNCATE_;
    if (abi >= 5)
        handled |= LANDLOCK_ACCESS_FS_IOCTL_DEV_;
    struct ll_ruleset_attr attr = {.handled_access_fs = handled};
    int rs = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof(attr), 0);
    if (rs < 0) {
        int err = errno;
        snprintf(why, cap, "landlock_create_ruleset: %s", strerror(err));
        return kvd_status_from_errno(err);
    }
    int rc = KVD_OK;
    for (size_t i = 0; rc == KVD_OK && i < KVD_ARRAY_SIZE(ll_rules); i++)
        rc = ll_allow(rs, ll_rules[i].path, ll_rules[i].access, handled,
                      strcmp(ll_rules[i].path, "/proc/self") == 0, why, cap);
    ll_dirs_t d = {.rs = rs, .handled = handled, .rc = rc, .why = why, .cap = cap};
    if (rc == KVD_OK)
        dl_iterate_phdr(ll_object_dir, &d);
    rc = d.rc;
    /* and where the loader was told to look */
    const char *ld = getenv("LD_LIBRARY_PATH");
    char paths[4096];
    kvd_strlcpy(paths, ld ? ld : "", sizeof(paths));
    char *save = NULL;
    for (char *p = strtok_r(paths, ":", &save); rc == KVD_OK && p != NULL;
         p = strtok_r(NULL, ":", &save))
        if (p[0] == '/')
            rc = ll_allow(rs, p, LL_READ, handled, false, why, cap);
    if (rc == KVD_OK && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        int err = errno;
        snprintf(why, cap, "prctl(PR_SET_NO_NEW_PRIVS): %s", strerror(err));
        rc = kvd_status_from_errno(err);
    }
    if (rc == KVD_OK && syscall(SYS_landlock_restrict_self, rs, 0) != 0) {
        int err = errno;
        snprintf(why, cap, "landlock_restrict_self: %s", strerror(err));
        rc = kvd_status_from_errno(err);
    }
    close(rs);
    return rc;
}
