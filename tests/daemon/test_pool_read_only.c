/*
 * Description: a connection that says Hello with read_only gets the pool's
 * descriptor read-only (issue 11 item 4): a PROT_WRITE mapping, mprotect to
 * writable, write(), fallocate(PUNCH_HOLE) and ftruncate through it all
 * fail, and a published object stays byte-exact while it reads it. A
 * writer's connection, beside it, still gets the read-write descriptor, and
 * the read-only connection is refused Reserve and Evict.
 */
#include "test_store_util.h"

#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SALT 0x726fu

/* Hello with read_only and want_pool_fd; the descriptor in *fd. */
static kvd_client_t *hello_ro(const char *socket, int *fd, bool *ro_said)
{
    kvd_client_t *c = NULL;
    *fd = -1;
    if (!DT_CHECK(kvd_client_connect_unix(socket, TS_RPC_TIMEOUT_MS, &c) == KVD_OK,
                  "connect %s", socket))
        return NULL;
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    kvd_hello_req_t *h = &req.body.hello_req;
    kvd_strlcpy(h->client_name, "read-only-test", sizeof(h->client_name));
    h->pid = (uint32_t)getpid();
    h->protocol_version = KVD_PROTOCOL_VERSION;
    h->n_namespaces = 1;
    h->namespaces = &spec;
    h->want_pool_fd = true;
    h->read_only = true;
    int rc = kvd_client_call(c, &req, &rep, TS_RPC_TIMEOUT_MS);
    bool ok = DT_CHECK(rc == KVD_OK && rep.status == KVD_OK, "read-only Hello: %s (%s)",
                       kvd_status_str(rc ? rc : rep.status), rc ? "" : rep.error);
    *ro_said = ok && rep.body.hello_rep.read_only;
    kvd_msg_clear(&rep);
    *fd = kvd_client_take_fd(c);
    return c;
}

static void run(kvd_test_daemon_t *d)
{
    /* a writer stores one object */
    ts_client_t w;
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    if (ts_open(&w, d->socket, &spec, 1, true) != 0)
        return;
    DT_CHECK(w.pool_fd >= 0 && (fcntl(w.pool_fd, F_GETFL) & O_ACCMODE) == O_RDWR,
             "the writer's descriptor should be read-write");
    kvd_key_t key;
    ts_make_keys(7, 1, 64, &key);
    kvd_put_item_t item;
    ts_chain_items(&key, 1, NULL, 0, &item);
    uint64_t lease = 0, off = 0;
    uint8_t res = 0;
    ts_err_t e;
    int st = ts_reserve(w.c, w.ns[0], TS_KV_BYTES, &item, 1, &lease, &res, &off, &e);
    if (!DT_CHECK(st == KVD_OK && res == KVD_RESERVE_ALLOCATED, "reserve: %s (%s)",
                  kvd_status_str(st), e.text))
        goto out_w;
    ts_fill(w.pool + off, TS_KV_BYTES, key, SALT);
    st = ts_publish(w.c, lease, NULL, 0, &e);
    DT_CHECK(st == KVD_OK, "publish: %s (%s)", kvd_status_str(st), e.text);

    int fd;
    bool ro_said = false;
    kvd_client_t *r = hello_ro(d->socket, &fd, &ro_said);
    if (r == NULL)
        goto out_w;
    DT_CHECK(ro_said, "the Hello reply should say read_only");
    if (!DT_CHECK(fd >= 0, "no pool descriptor came with the read-only Hello"))
        goto out_r;
    DT_CHECK((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY,
             "the descriptor is open %s, want O_RDONLY",
             (fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDWR ? "O_RDWR" : "otherwise");

    /* no writable mapping */
    void *m = mmap(NULL, w.pool_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    DT_CHECK(m == MAP_FAILED && errno == EACCES,
             "mmap PROT_WRITE of the read-only descriptor: %s",
             m == MAP_FAILED ? strerror(errno) : "succeeded");
    if (m != MAP_FAILED)
        munmap(m, w.pool_bytes);
    /* a read mapping reads the object, and cannot be made writable */
    uint8_t *ro = mmap(NULL, w.pool_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (DT_CHECK(ro != MAP_FAILED, "mmap PROT_READ: %s", strerror(errno))) {
        DT_CHECK(ts_verify(ro + off, TS_KV_BYTES, key, SALT) == SIZE_MAX,
                 "the object reads wrong through the read-only mapping");
        errno = 0;
        DT_CHECK(mprotect(ro, 4096, PROT_READ | PROT_WRITE) != 0 && errno == EACCES,
                 "mprotect to writable: %s", errno ? strerror(errno) : "succeeded");
        munmap(ro, w.pool_bytes);
    }
    /* no write, no hole punching, no resizing */
    uint8_t zeros[64] = {0};
    errno = 0;
    DT_CHECK(pwrite(fd, zeros, sizeof(zeros), (off_t)off) < 0 && errno == EBADF,
             "pwrite through it: %s", errno ? strerror(errno) : "succeeded");
    errno = 0;
    DT_CHECK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                       TS_KV_BYTES) != 0 &&
                 errno == EBADF,
             "fallocate(PUNCH_HOLE) through it: %s",
             errno ? strerror(errno) : "succeeded");
    errno = 0;
    DT_CHECK(ftruncate(fd, 0) != 0, "ftruncate through it succeeded");
    /* reopening it read-write through /proc: refused to other uids by the
     * file's mode (the daemon's own uid, or root, is no boundary) */
    if (geteuid() != 0) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        int rw = open(path, O_RDWR);
        DT_CHECK(rw < 0 && errno == EACCES, "reopening it O_RDWR: %s",
                 rw < 0 ? strerror(errno) : "succeeded");
        if (rw >= 0)
            close(rw);
    }
    /* the object is intact */
    DT_CHECK(ts_verify(w.pool + off, TS_KV_BYTES, key, SALT) == SIZE_MAX,
             "the published object changed");
    /* the connection itself may not write */
    kvd_msg_t req, rep;
    kvd_put_item_t item2;
    kvd_key_t key2;
    ts_make_keys(8, 1, 64, &key2);
    ts_chain_items(&key2, 1, NULL, 0, &item2);
    kvd_msg_request(&req, 0, KVD_METHOD_RESERVE);
    req.body.reserve_req = (kvd_reserve_req_t){.ns = w.ns[0], .n = 1, .items = &item2};
    st = kvd_client_call(r, &req, &rep, TS_RPC_TIMEOUT_MS);
    DT_CHECK(st == KVD_OK && rep.status == KVD_ERR_PERMISSION,
             "Reserve on the read-only connection: %s, want permission denied",
             kvd_status_str(st ? st : rep.status));
    kvd_msg_clear(&rep);
    close(fd);
out_r:
    kvd_client_close(r);
out_w:
    ts_close(&w);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/pool_read_only");
}
