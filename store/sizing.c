/*
 * sizing.c - the pool sizing rule of DESIGN.md section 9 and the reader of
 * the host's memory figures (/proc/meminfo, cgroup v1 and v2).
 *
 * The rule is pure: kvd_sizing_compute() sees only a kvd_host_mem_t, so the
 * tests drive it with fixture directories shaped like / on a real host.
 */
#include "kvd_store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads one "Key:   N kB" line of a meminfo file. */
static int meminfo_field(const char *text, const char *key, uint64_t *out)
{
    size_t klen = strlen(key);
    for (const char *p = text; p != NULL && *p; p = strchr(p, '\n')) {
        if (*p == '\n')
            p++;
        if (strncmp(p, key, klen) == 0 && p[klen] == ':') {
            char *end;
            unsigned long long kib = strtoull(p + klen + 1, &end, 10);
            if (end == p + klen + 1)
                return KVD_ERR_INVALID;
            *out = kib * 1024ull;
            return KVD_OK;
        }
    }
    return KVD_ERR_NOT_FOUND;
}

/* Reads a whole small file into buf; returns its length or a status. */
static int read_small(const char *root, const char *path, char *buf, size_t len)
{
    char full[1024];
    snprintf(full, sizeof(full), "%s%s", root, path);
    FILE *f = fopen(full, "r");
    if (f == NULL) {
        int err = errno;
        /* a file that is not there is an answer (no cgroup v1 here, ...);
         * anything else is worth its reason */
        if (err != ENOENT)
            KVD_WARN("sizing", "cannot read %s: %s", full, strerror(err));
        return kvd_status_from_errno(err);
    }
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = '\0';
    return (int)n;
}

/* Reads a cgroup number file: "max" (v2) and huge values (v1's "no limit",
 * 0x7ffffffffffff000) mean unlimited. */
static int cgroup_number(const char *root, const char *path, uint64_t *out)
{
    char buf[64];
    int n = read_small(root, path, buf, sizeof(buf));
    if (n < 0)
        return n;
    if (strncmp(buf, "max", 3) == 0) {
        *out = UINT64_MAX;
        return KVD_OK;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (end == buf || errno != 0)
        return KVD_ERR_INVALID;
    *out = v >= (1ull << 62) ? UINT64_MAX : v;
    return KVD_OK;
}

/*
 * Walks from the cgroup `rel` (relative to the hierarchy mounted at `mount`)
 * up to its root, keeping the tightest limit and the usage where it was
 * found. A path missing below the mount (a cgroup namespace shows "/") is
 * skipped.
 */
static void cgroup_walk(const char *root, const char *mount, const char *rel,
                        const char *limit_file, const char *usage_file,
                        kvd_host_mem_t *out)
{
    char dir[512];
    kvd_strlcpy(dir, rel, sizeof(dir));
    for (;;) {
        size_t dl = strlen(dir);
        while (dl > 0 && dir[dl - 1] == '/')
            dir[--dl] = '\0';
        char path[1024];
        uint64_t limit, usage = 0;
        snprintf(path, sizeof(path), "%s%s/%s", mount, dir, limit_file);
        if (cgroup_number(root, path, &limit) == KVD_OK) {
            if (out->cgroup_version == 0)
                out->cgroup_version = strcmp(limit_file, "memory.max") == 0 ? 2 : 1;
            snprintf(path, sizeof(path), "%s%s/%s", mount, dir, usage_file);
            cgroup_number(root, path, &usage);
            if (limit < out->cgroup_limit_bytes) {
                out->cgroup_limit_bytes = limit;
                out->cgroup_usage_bytes = usage;
            }
        }
        char *slash = strrchr(dir, '/');
        if (dl == 0)
            break;
        if (slash == NULL)
            dir[0] = '\0';
        else
            *slash = '\0';
    }
}

int kvd_host_mem_probe(const char *root, kvd_host_mem_t *out)
{
    if (root == NULL || strcmp(root, "/") == 0)
        root = "";
    char buf[16384];
    int n = read_small(root, "/proc/meminfo", buf, sizeof(buf));
    if (n < 0)
        return n;
    kvd_host_mem_t m = {.cgroup_limit_bytes = UINT64_MAX};
    int rc = meminfo_field(buf, "MemTotal", &m.mem_total_bytes);
    if (rc != KVD_OK)
        return rc;
    if (meminfo_field(buf, "MemAvailable", &m.mem_available_bytes) != KVD_OK)
        m.mem_available_bytes = m.mem_total_bytes;

    /* /proc/self/cgroup: "0::/path" for v2, "N:memory:/path" for v1 */
    n = read_small(root, "/proc/self/cgroup", buf, sizeof(buf));
    if (n > 0) {
        char *save = NULL;
        for (char *line = strtok_r(buf, "\n", &save); line != NULL;
             line = strtok_r(NULL, "\n", &save)) {
            char *c1 = strchr(line, ':');
            char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (c2 == NULL)
                continue;
            *c1 = '\0'; /* line = hierarchy id */
            *c2 = '\0'; /* controllers end here */
            const char *controllers = c1 + 1, *rel = c2 + 1;
            if (strcmp(line, "0") == 0 && *controllers == '\0') {
                cgroup_walk(root, "/sys/fs/cgroup", rel, "memory.max", "memory.current",
                            &m);
                /* hybrid hosts mount v2 at /sys/fs/cgroup/unified */
                cgroup_walk(root, "/sys/fs/cgroup/unified", rel, "memory.max",
                            "memory.current", &m);
            } else {
                char ctl[256];
                kvd_strlcpy(ctl, controllers, sizeof(ctl));
                char *save2 = NULL;
                for (char *tok = strtok_r(ctl, ",", &save2); tok != NULL;
                     tok = strtok_r(NULL, ",", &save2)) {
                    if (strcmp(tok, "memory") == 0)
                        cgroup_walk(root, "/sys/fs/cgroup/memory", rel,
                                    "memory.limit_in_bytes", "memory.usage_in_bytes", &m);
                }
            }
        }
    }
    *out = m;
    return KVD_OK;
}

static void why_set(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void why_set(char *why, size_t why_len, const char *fmt, ...)
{
    if (why == NULL || why_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}

/* The smallest pool worth starting: one page and one object. */
static uint64_t min_budget(const kvd_sizing_req_t *req, uint64_t align)
{
    return KVD_MAX(align, kvd_align_up(req->object_bytes, align));
}

/*
 * Says which values would fit, naming only values that really do: the
 * largest --pool-size, and the largest --mem-fraction printed with three
 * decimals (floored) whose budget is still at least one object. When not
 * even one object fits beside the reserve, says that instead.
 */
static void sizing_advice(const kvd_sizing_t *s, const kvd_sizing_req_t *req,
                          uint64_t align, char *buf, size_t len)
{
    char a[32], b[32];
    uint64_t least = min_budget(req, align);
    if (s->max_budget_bytes < least) {
        snprintf(buf, len,
                 "not even %s fits beside the reserve: lower --reserve (now %s) "
                 "or free memory",
                 kvd_size_format(least, a, sizeof(a)),
                 kvd_size_format(req->reserve_bytes, b, sizeof(b)));
        return;
    }
    int n = snprintf(buf, len, "--pool-size %lluK would fit",
                     (unsigned long long)(s->max_budget_bytes / 1024));
    double frac = (double)(uint64_t)(s->max_fraction * 1000.0) / 1000.0;
    double share = frac * (double)s->limit_bytes;
    uint64_t budget = share > (double)req->reserve_bytes
                          ? kvd_align_down((uint64_t)share - req->reserve_bytes, align)
                          : 0;
    if (n > 0 && (size_t)n < len && frac > 0 && budget >= least)
        snprintf(buf + n, len - (size_t)n, ", and so would --mem-fraction %.3f", frac);
}

int kvd_sizing_compute(const kvd_host_mem_t *host, const kvd_sizing_req_t *req,
                       kvd_sizing_t *out, char *why, size_t why_len)
{
    char a[32], b[32], c[32], d[32];
    bool by_size = req->pool_size_bytes > 0, by_fraction = req->mem_fraction > 0;
    if (by_size == by_fraction) {
        why_set(why, why_len, "give exactly one of --pool-size and --mem-fraction");
        return KVD_ERR_INVALID;
    }
    if (by_fraction && req->mem_fraction > 1.0) {
        why_set(why, why_len, "--mem-fraction must be in (0, 1]");
        return KVD_ERR_INVALID;
    }
    uint64_t align = req->align_bytes ? req->align_bytes : 4096;

    kvd_sizing_t s = {0};
    s.limit_bytes = KVD_MIN(host->mem_total_bytes, host->cgroup_limit_bytes);
    s.can_give_bytes = host->mem_available_bytes + req->held_bytes;
    if (host->cgroup_limit_bytes != UINT64_MAX) {
        uint64_t room = host->cgroup_limit_bytes > host->cgroup_usage_bytes
                            ? host->cgroup_limit_bytes - host->cgroup_usage_bytes
                            : 0;
        s.can_give_bytes = KVD_MIN(s.can_give_bytes, room + req->held_bytes);
    }
    s.max_budget_bytes =
        s.can_give_bytes > req->reserve_bytes
            ? kvd_align_down(s.can_give_bytes - req->reserve_bytes, align)
            : 0;
    s.max_fraction = s.limit_bytes ? (double)(s.max_budget_bytes + req->reserve_bytes) /
                                         (double)s.limit_bytes
                                   : 0.0;
    if (s.max_fraction > 1.0)
        s.max_fraction = 1.0;

    if (by_size) {
        s.source = "pool-size";
        s.budget_bytes = kvd_align_down(req->pool_size_bytes, align);
    } else {
        s.source = "mem-fraction";
        double share = req->mem_fraction * (double)s.limit_bytes;
        uint64_t share_bytes = (uint64_t)share;
        s.budget_bytes = share_bytes > req->reserve_bytes
                             ? kvd_align_down(share_bytes - req->reserve_bytes, align)
                             : 0;
    }
    uint64_t object = req->object_bytes ? req->object_bytes : 1;
    s.objects_fit = s.budget_bytes / object;

    if (s.budget_bytes < align || s.budget_bytes < req->object_bytes) {
        why_set(why, why_len,
                "the pool budget %s is smaller than one %s (page %s); "
                "raise %s",
                kvd_size_format(s.budget_bytes, a, sizeof(a)),
                s.budget_bytes < align ? "page" : "object",
                kvd_size_format(align, b, sizeof(b)),
                by_size ? "--pool-size" : "--mem-fraction or lower --reserve");
        *out = s;
        return KVD_ERR_INVALID;
    }
    if (s.budget_bytes > s.max_budget_bytes) {
        char advice[160];
        sizing_advice(&s, req, align, advice, sizeof(advice));
        why_set(why, why_len,
                "a pool of %s plus the reserve of %s does not fit in the %s "
                "this host can give now (limit %s); %s",
                kvd_size_format(s.budget_bytes, a, sizeof(a)),
                kvd_size_format(req->reserve_bytes, b, sizeof(b)),
                kvd_size_format(s.can_give_bytes, c, sizeof(c)),
                kvd_size_format(s.limit_bytes, d, sizeof(d)), advice);
        *out = s;
        return KVD_ERR_NO_SPACE;
    }
    *out = s;
    return KVD_OK;
}

void kvd_sizing_format(const kvd_host_mem_t *host, const kvd_sizing_req_t *req,
                       const kvd_sizing_t *s, char *buf, size_t buf_len)
{
    char total[32], avail[32], cg[32], cgu[32], limit[32], give[32], res[32], budget[32],
        obj[32], align[32];
    if (host->cgroup_limit_bytes == UINT64_MAX)
        snprintf(cg, sizeof(cg), "none");
    else
        kvd_size_format(host->cgroup_limit_bytes, cg, sizeof(cg));
    char fraction[32];
    if (req->mem_fraction > 0)
        snprintf(fraction, sizeof(fraction), "%.3f", req->mem_fraction);
    else
        snprintf(fraction, sizeof(fraction), "-");
    snprintf(buf, buf_len,
             "sizing: source=%s mem_total=%s mem_available=%s cgroup_v%d_limit=%s "
             "cgroup_usage=%s limit=%s can_give=%s fraction=%s reserve=%s "
             "budget=%s (%llu bytes) page=%s object=%s objects_fit=%llu "
             "max_fitting=%.3f",
             s->source, kvd_size_format(host->mem_total_bytes, total, sizeof(total)),
             kvd_size_format(host->mem_available_bytes, avail, sizeof(avail)),
             host->cgroup_version, cg,
             kvd_size_format(host->cgroup_usage_bytes, cgu, sizeof(cgu)),
             kvd_size_format(s->limit_bytes, limit, sizeof(limit)),
             kvd_size_format(s->can_give_bytes, give, sizeof(give)), fraction,
             kvd_size_format(req->reserve_bytes, res, sizeof(res)),
             kvd_size_format(s->budget_bytes, budget, sizeof(budget)),
             (unsigned long long)s->budget_bytes,
             kvd_size_format(req->align_bytes, align, sizeof(align)),
             kvd_size_format(req->object_bytes, obj, sizeof(obj)),
             (unsigned long long)s->objects_fit, s->max_fraction);
    size_t n = strlen(buf);
    if (req->held_bytes > 0 && n < buf_len)
        snprintf(buf + n, buf_len - n, " held=%s",
                 kvd_size_format(req->held_bytes, give, sizeof(give)));
}
