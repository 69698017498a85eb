/*
 * sandbox.h - the UCX server child's seccomp filter. Private to daemon/.
 *
 * The UCX server process (ucxd.h) is the part of kvdockd that parses what
 * any host reaching its port sends (UCX's own wire-up, active messages),
 * with the pool mapped read-write. Should a flaw in that parsing give a
 * peer control of the process, what it can do next is bounded here: once
 * UCX has started (its files are open, its threads run), the process
 * enters a filter, on every thread, that refuses (EPERM, or ENOSYS for
 * clone3 so that thread creation falls back to clone):
 *   - running anything: execve, execveat, fork, vfork, clone without
 *     CLONE_THREAD (threads still start);
 *   - reaching other processes of its user (the engines, the daemon):
 *     ptrace, process_vm_readv/writev, pidfd_getfd, kcmp, process_madvise,
 *     move_pages and migrate_pages, and signals to anyone but itself
 *     (kill, tgkill only for its own pid; tkill, rt_sigqueueinfo and
 *     pidfd_send_signal not at all);
 *   - changing files: an open (open, openat) for writing, creating,
 *     truncating or appending (/proc/<pid>/mem of another process
 *     included), openat2 (ENOSYS: its flags are behind a pointer), creat,
 *     the link, rename, mkdir, mknod, chmod, chown and truncate families,
 *     open_by_handle_at. Opens for reading stay: UCX's TCP transport reads
 *     /proc/net/route each time it queries its interface (endpoint
 *     creation included), and seccomp cannot see a path (which files may
 *     be read at all is kvd_sandbox_confine_files' part, below);
 *   - Unix sockets (socket and socketpair of AF_UNIX: the daemon's RPC
 *     socket would otherwise take it as a local client of the daemon's
 *     uid); TCP, UDP and netlink sockets stay, as UCX needs them;
 *   - io_uring (whose operations seccomp does not see), bpf,
 *     perf_event_open, userfaultfd, keyrings, namespaces and mounts,
 *     modules, kexec, reboot, swap, clocks, host names, ids and
 *     capabilities, personality, iopl and ioperm;
 *   - and, for the architecture check, every system call of another ABI
 *     (x32, i386) kills the process.
 * It is a deny list, not an allow list: UCX's transports (TCP here, verbs
 * where there is a NIC) make system calls that differ by version and
 * device, and a call refused by mistake would break transfers in a way
 * no test here could see. What it refuses is what a compromised server
 * would use to leave its process. PR_SET_NO_NEW_PRIVS comes with it.
 *
 * Built for x86_64 and aarch64; elsewhere kvd_sandbox_enter answers
 * KVD_ERR_UNSUPPORTED and the child runs without it (logged).
 */
#ifndef KVD_DAEMON_SANDBOX_H
#define KVD_DAEMON_SANDBOX_H

#include <stddef.h>

/* Enters the filter on every thread of the calling process (seccomp's
 * TSYNC). KVD_OK, or KVD_ERR_UNSUPPORTED (another architecture, a kernel
 * without seccomp filters) or the errno of prctl/seccomp, with the reason
 * in why (cap bytes). Not undone: the process keeps it until it exits. */
int kvd_sandbox_enter(char *why, size_t cap);

/*
 * Confines what the calling process may open from then on (Landlock), for
 * the files seccomp cannot tell apart: reading stays allowed only under
 * the system's libraries and configuration of UCX, rdma-core and the
 * loader, this process's own /proc/PID, /proc/sys and a few /proc and
 * /sys facts, and the RDMA devices (read and write); everything else (the
 * daemon's journal and auth files, other processes' /proc entries, home
 * directories) is refused with EACCES. Readable too: the directories of
 * the objects loaded (dl_iterate_phdr) and of LD_LIBRARY_PATH, where UCX's modules
 * and rdma-core's providers may live outside /usr. Landlock has no TSYNC:
 * called while the process has one thread (before UCX starts), so that
 * every thread it makes later is confined too (a TSan build's runtime
 * thread, made at exec, is not). KVD_OK, KVD_ERR_UNSUPPORTED (a kernel
 * without Landlock, or with it disabled) or the errno of a call, with the
 * reason in why. Not undone.
 */
int kvd_sandbox_confine_files(char *why, size_t cap);

#endif
