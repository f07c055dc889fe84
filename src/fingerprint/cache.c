/* lockstep — fingerprint cache entries: encode, strict decode, atomic store
 * (format in fingerprint/cache.h). */
#include "fingerprint/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"

#define DIGEST_BYTES 32u
/* The smallest record: 1-byte name, 1-byte dtype, a scalar. */
#define RECORD_MIN_BYTES (4u + 1u + 1u + 1u + 1u + 8u + 8u + 1u + 32u + 8u)

void ls_fpcache_entry_free(ls_fpcache_entry *e)
{
    if (!e) return;
    for (size_t i = 0; i < e->count; i++) free(e->tensors[i].name);
    free(e->tensors);
    free(e->path);
    memset(e, 0, sizeof *e);
}

ls_status ls_fpcache_entry_path(const char *cache_dir, const char *canonical_path, char **out,
                                ls_error *err)
{
    *out = NULL;
    ls_digest d;
    LS_TRY(ls_sha256_buf(canonical_path, strlen(canonical_path), &d, err));
    char hex[65];
    ls_digest_to_hex(&d, hex);
    size_t n = strlen(cache_dir) + sizeof "/fingerprint/" + 64 + sizeof ".fpc";
    char *p = malloc(n);
    if (!p) return ls_fail_nomem(err, n, "fingerprint cache: entry path");
    snprintf(p, n, "%s/fingerprint/%s.fpc", cache_dir, hex);
    *out = p;
    return LS_OK;
}

int64_t ls_fpcache_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int ls_fpcache_racy(const ls_file_identity *id, int64_t hashed_at_ns)
{
    int64_t granularity_ns = id->ctime_ns % 1000000000 == 0 ? 2000000000 : 1;
    return id->ctime_ns > hashed_at_ns - granularity_ns;
}

/* ---- encode ------------------------------------------------------------------ */

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
    int oom;
} wbuf;

static void w_bytes(wbuf *w, const void *src, size_t n)
{
    if (w->oom) return;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->len + n) cap *= 2;
        uint8_t *np = realloc(w->p, cap);
        if (!np) {
            w->oom = 1;
            return;
        }
        w->p = np;
        w->cap = cap;
    }
    memcpy(w->p + w->len, src, n);
    w->len += n;
}

static void w_uint(wbuf *w, uint64_t v, int bytes)
{
    uint8_t b[8];
    for (int i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
    w_bytes(w, b, (size_t)bytes);
}

ls_status ls_fpcache_encode(const ls_fpcache_entry *e, uint8_t **out, size_t *len, ls_error *err)
{
    *out = NULL;
    *len = 0;
    size_t plen = e->path ? strlen(e->path) : 0;
    if (plen == 0 || plen > LS_FPCACHE_PATH_MAX_BYTES)
        return ls_fail(err, LS_E_USAGE, "fingerprint cache: path of %zu bytes cannot be stored "
                       "(1 .. %u)", plen, LS_FPCACHE_PATH_MAX_BYTES);
    wbuf w = {0};
    w_bytes(&w, LS_FPCACHE_MAGIC, 8);
    w_uint(&w, LS_FPCACHE_VERSION, 4);
    w_uint(&w, 0, 4);
    w_uint(&w, e->identity.dev, 8);
    w_uint(&w, e->identity.ino, 8);
    w_uint(&w, e->identity.size_bytes, 8);
    w_uint(&w, (uint64_t)e->identity.mtime_ns, 8);
    w_uint(&w, (uint64_t)e->identity.ctime_ns, 8);
    w_uint(&w, (uint64_t)e->hashed_at_ns, 8);
    w_uint(&w, plen, 4);
    w_bytes(&w, e->path, plen);
    w_uint(&w, e->count, 8);
    static const uint8_t zeros[DIGEST_BYTES];
    for (size_t i = 0; i < e->count; i++) {
        const ls_fpcache_tensor *t = &e->tensors[i];
        size_t nlen = strlen(t->name);
        const char *dt = ls_dtype_name(t->dtype);
        if (nlen == 0 || nlen > LS_FPCACHE_NAME_MAX_BYTES || t->ndim < 0 ||
            t->ndim > LS_TENSOR_MAX_DIMS) {
            free(w.p);
            return ls_fail(err, LS_E_USAGE, "fingerprint cache: tensor %zu ('%.300s') cannot be "
                           "stored (name of %zu bytes, ndim %d)", i, t->name, nlen, t->ndim);
        }
        w_uint(&w, nlen, 4);
        w_bytes(&w, t->name, nlen);
        w_uint(&w, strlen(dt), 1);
        w_bytes(&w, dt, strlen(dt));
        w_uint(&w, (uint64_t)t->ndim, 1);
        for (int d = 0; d < t->ndim; d++) w_uint(&w, (uint64_t)t->shape[d], 8);
        w_uint(&w, t->size_bytes, 8);
        w_uint(&w, t->file_offset_bytes, 8);
        w_uint(&w, t->has_digest ? 1 : 0, 1);
        w_bytes(&w, t->has_digest ? t->digest.bytes : zeros, DIGEST_BYTES);
        w_uint(&w, t->has_digest ? t->first_nonfinite : LS_FPCACHE_ALL_FINITE, 8);
    }
    if (w.oom) {
        free(w.p);
        return ls_fail(err, LS_E_NOMEM, "fingerprint cache: out of memory encoding %zu tensors",
                       e->count);
    }
    ls_digest sum;
    ls_status st = ls_sha256_buf(w.p, w.len, &sum, err);
    if (st == LS_OK) w_bytes(&w, sum.bytes, DIGEST_BYTES);
    if (st == LS_OK && w.oom) st = ls_fail(err, LS_E_NOMEM, "fingerprint cache: out of memory");
    if (st != LS_OK) {
        free(w.p);
        return st;
    }
    *out = w.p;
    *len = w.len;
    return LS_OK;
}

/* ---- decode ------------------------------------------------------------------ */

typedef struct rbuf {
    const uint8_t *p;
    size_t len, pos;
    const char *label;
    ls_error *err;
} rbuf;

static ls_status __attribute__((format(printf, 3, 4)))
bad(rbuf *r, size_t off, const char *fmt, ...)
{
    char what[LS_ERROR_MSG_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ls_fail(r->err, LS_E_INPUT, "%s: %s (byte offset %zu)", r->label, what, off);
}

/* Fails unless n more bytes are there; `field` names what was being read. */
static ls_status need(rbuf *r, size_t n, const char *field)
{
    if (r->len - r->pos >= n) return LS_OK;
    return bad(r, r->pos, "truncated: %s needs %zu bytes but the %zu-byte entry ends first", field,
               n, r->len);
}

static uint64_t get_uint(rbuf *r, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)r->p[r->pos + (size_t)i] << (8 * i);
    r->pos += (size_t)bytes;
    return v;
}

static ls_status read_uint(rbuf *r, int bytes, const char *field, uint64_t *v)
{
    LS_TRY(need(r, (size_t)bytes, field));
    *v = get_uint(r, bytes);
    return LS_OK;
}

/* A length-prefixed string of 1..max bytes without NUL; *out is malloc'd. */
static ls_status read_str(rbuf *r, int len_bytes, uint64_t max, const char *field, char **out)
{
    size_t at = r->pos;
    uint64_t n;
    LS_TRY(read_uint(r, len_bytes, field, &n));
    if (n == 0 || n > max)
        return bad(r, at, "%s length %llu out of range (1 .. %llu)", field, (unsigned long long)n,
                   (unsigned long long)max);
    LS_TRY(need(r, (size_t)n, field));
    if (memchr(r->p + r->pos, 0, (size_t)n))
        return bad(r, (size_t)((const uint8_t *)memchr(r->p + r->pos, 0, (size_t)n) - r->p),
                   "%s holds a NUL byte", field);
    char *s = malloc((size_t)n + 1);
    if (!s) return ls_fail_nomem(r->err, (size_t)n + 1, "%s: %s", r->label, field);
    memcpy(s, r->p + r->pos, (size_t)n);
    s[n] = '\0';
    r->pos += (size_t)n;
    *out = s;
    return LS_OK;
}

static ls_status read_tensor(rbuf *r, size_t i, ls_fpcache_tensor *t)
{
    LS_TRY(read_str(r, 4, LS_FPCACHE_NAME_MAX_BYTES, "tensor name", &t->name));
    size_t at = r->pos;
    char *dt = NULL;
    LS_TRY(read_str(r, 1, 15, "dtype", &dt));
    int ok = ls_dtype_parse(dt, &t->dtype) == 0;
    if (!ok) bad(r, at, "tensor %zu ('%.300s'): unknown dtype '%s'", i, t->name, dt);
    free(dt);
    if (!ok) return LS_E_INPUT;
    at = r->pos;
    uint64_t v;
    LS_TRY(read_uint(r, 1, "ndim", &v));
    if (v > LS_TENSOR_MAX_DIMS)
        return bad(r, at, "tensor %zu ('%.300s'): ndim %llu, at most %d", i, t->name,
                   (unsigned long long)v, LS_TENSOR_MAX_DIMS);
    t->ndim = (int)v;
    for (int d = 0; d < t->ndim; d++) {
        at = r->pos;
        LS_TRY(read_uint(r, 8, "shape", &v));
        if (v > (uint64_t)INT64_MAX)
            return bad(r, at, "tensor %zu ('%.300s'): shape[%d] = %llu exceeds INT64_MAX", i,
                       t->name, d, (unsigned long long)v);
        t->shape[d] = (int64_t)v;
    }
    LS_TRY(read_uint(r, 8, "size_bytes", &t->size_bytes));
    LS_TRY(read_uint(r, 8, "file_offset_bytes", &t->file_offset_bytes));
    at = r->pos;
    LS_TRY(read_uint(r, 1, "has_digest", &v));
    if (v > 1) return bad(r, at, "tensor %zu ('%.300s'): has_digest is %llu, expected 0 or 1", i,
                          t->name, (unsigned long long)v);
    t->has_digest = (int)v;
    at = r->pos;
    LS_TRY(need(r, DIGEST_BYTES, "tensor digest"));
    memcpy(t->digest.bytes, r->p + r->pos, DIGEST_BYTES);
    r->pos += DIGEST_BYTES;
    if (!t->has_digest) {
        for (size_t k = 0; k < DIGEST_BYTES; k++)
            if (t->digest.bytes[k] != 0)
                return bad(r, at + k, "tensor %zu ('%.300s'): has no digest but its digest bytes "
                           "are not zero", i, t->name);
    }
    at = r->pos;
    LS_TRY(read_uint(r, 8, "first_nonfinite", &t->first_nonfinite));
    if (t->first_nonfinite != LS_FPCACHE_ALL_FINITE) {
        /* Only a hashed tensor of a floating dtype can have one, and only
         * inside it. */
        uint64_t numel = t->size_bytes / ls_dtype_size(t->dtype);
        int floating = ls_dtype_nonfinite_mask(t->dtype) != 0;
        if (!t->has_digest || !floating || t->first_nonfinite >= numel)
            return bad(r, at, "tensor %zu ('%.300s'): first_nonfinite %llu is impossible (%s)", i,
                       t->name, (unsigned long long)t->first_nonfinite,
                       !t->has_digest ? "the tensor has no digest"
                       : !floating    ? "its dtype has no NaN or infinity"
                                      : "past its last element");
    }
    return LS_OK;
}

static ls_status decode(rbuf *r, ls_fpcache_entry *e)
{
    LS_TRY(need(r, 8, "magic"));
    if (memcmp(r->p, LS_FPCACHE_MAGIC, 8) != 0)
        return bad(r, 0, "not a lockstep fingerprint cache entry (magic is not \"%s\")",
                   LS_FPCACHE_MAGIC);
    r->pos = 8;
    uint64_t v;
    LS_TRY(read_uint(r, 4, "version", &v));
    if (v != LS_FPCACHE_VERSION)
        return bad(r, 8, "version %llu, this lockstep reads version %u", (unsigned long long)v,
                   LS_FPCACHE_VERSION);
    LS_TRY(read_uint(r, 4, "flags", &v));
    if (v != 0) return bad(r, 12, "reserved flags 0x%llx set", (unsigned long long)v);
    LS_TRY(read_uint(r, 8, "st_dev", &e->identity.dev));
    LS_TRY(read_uint(r, 8, "st_ino", &e->identity.ino));
    LS_TRY(read_uint(r, 8, "st_size", &e->identity.size_bytes));
    LS_TRY(read_uint(r, 8, "mtime", &v));
    e->identity.mtime_ns = (int64_t)v;
    LS_TRY(read_uint(r, 8, "ctime", &v));
    e->identity.ctime_ns = (int64_t)v;
    LS_TRY(read_uint(r, 8, "hashed_at", &v));
    e->hashed_at_ns = (int64_t)v;
    LS_TRY(read_str(r, 4, LS_FPCACHE_PATH_MAX_BYTES, "path", &e->path));
    if (e->path[0] != '/')
        return bad(r, LS_FPCACHE_PATH_OFFSET + 4, "path '%.300s' is not absolute", e->path);
    size_t at = r->pos;
    LS_TRY(read_uint(r, 8, "tensor count", &v));
    /* Bound the allocation by what the remaining bytes could hold. */
    size_t room = r->len - r->pos;
    if (v > room / RECORD_MIN_BYTES)
        return bad(r, at, "tensor count %llu cannot fit in the %zu bytes that follow",
                   (unsigned long long)v, room);
    e->tensors = calloc(v ? (size_t)v : 1, sizeof *e->tensors);
    if (!e->tensors)
        return ls_fail_nomem(r->err, (v ? (size_t)v : 1) * sizeof *e->tensors, "%s: %llu tensors", r->label,
                             (unsigned long long)v);
    for (size_t i = 0; i < (size_t)v; i++) {
        e->count = i + 1; /* so entry_free releases what was read */
        LS_TRY(read_tensor(r, i, &e->tensors[i]));
    }
    e->count = (size_t)v;
    LS_TRY(need(r, DIGEST_BYTES, "checksum"));
    if (r->len - r->pos != DIGEST_BYTES)
        return bad(r, r->pos + DIGEST_BYTES, "%zu bytes after the checksum",
                   r->len - r->pos - DIGEST_BYTES);
    ls_digest sum;
    LS_TRY(ls_sha256_buf(r->p, r->pos, &sum, r->err));
    if (memcmp(sum.bytes, r->p + r->pos, DIGEST_BYTES) != 0)
        return bad(r, r->pos, "checksum mismatch: the entry was altered or not completely written");
    return LS_OK;
}

ls_status ls_fpcache_decode(const char *label, const uint8_t *buf, size_t len,
                            ls_fpcache_entry *out, ls_error *err)
{
    memset(out, 0, sizeof *out);
    rbuf r = {buf, len, 0, label, err};
    ls_status st = decode(&r, out);
    if (st != LS_OK) ls_fpcache_entry_free(out);
    return st;
}

/* ---- files -------------------------------------------------------------------- */

/* 1 when buf starts like an entry of an earlier format version. */
static int is_older_version(const uint8_t *buf, size_t n)
{
    if (n < 12 || memcmp(buf, LS_FPCACHE_MAGIC, 8) != 0) return 0;
    uint32_t v = (uint32_t)buf[8] | (uint32_t)buf[9] << 8 | (uint32_t)buf[10] << 16 |
                 (uint32_t)buf[11] << 24;
    return v >= 1 && v < LS_FPCACHE_VERSION;
}

ls_status ls_fpcache_load(const char *entry_path, ls_fpcache_entry *out, int *found,
                          ls_error *err)
{
    memset(out, 0, sizeof *out);
    *found = 0;
    /* O_NOFOLLOW: a symlink planted in the cache directory is not an entry.
     * O_NONBLOCK: nor is a FIFO, which must not block the open (fstat below
     * refuses it; reads of a regular file ignore the flag). */
    int fd = open(entry_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        /* ENOTDIR: the cache directory is not there as a directory; no
         * entry either way (storing will say why, once). */
        if (e == ENOENT || e == ENOTDIR) return LS_OK;
        return ls_fail(err, e == ELOOP ? LS_E_INPUT : LS_E_IO,
                       "%s: cannot open: %s (byte offset 0)", entry_path,
                       e == ELOOP ? "is a symbolic link" : strerror(e));
    }
    struct stat sb;
    ls_status st = LS_OK;
    if (fstat(fd, &sb) != 0)
        st = ls_fail(err, LS_E_IO, "%s: cannot stat: %s (byte offset 0)", entry_path,
                     strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = ls_fail(err, LS_E_INPUT, "%s: is %s, not a regular file (byte offset 0)", entry_path,
                     ls_file_kind_name(sb.st_mode));
    else if (sb.st_uid != geteuid())
        st = ls_fail(err, LS_E_INPUT, "%s: owned by uid %ld, not by the user running lockstep "
                     "(byte offset 0)", entry_path, (long)sb.st_uid);
    else if ((uint64_t)sb.st_size > LS_FPCACHE_ENTRY_MAX_BYTES)
        st = ls_fail(err, LS_E_INPUT, "%s: %lld bytes, more than an entry can be (byte offset %zu)",
                     entry_path, (long long)sb.st_size, LS_FPCACHE_ENTRY_MAX_BYTES);
    if (st != LS_OK) {
        close(fd);
        return st;
    }
    size_t cap = (size_t)sb.st_size, n = 0;
    uint8_t *buf = malloc(cap ? cap : 1);
    if (!buf) {
        close(fd);
        return ls_fail_nomem(err, cap ? cap : 1, "%s", entry_path);
    }
    /* Read what fstat promised; a file that grows meanwhile fails the parse. */
    while (n < cap) {
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            st = ls_fail(err, LS_E_IO, "%s: read failed: %s (byte offset %zu)", entry_path,
                         strerror(errno), n);
            break;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    close(fd);
    if (st == LS_OK && is_older_version(buf, n)) {
        free(buf);
        return LS_OK; /* absent: an earlier format, replaced when the shard is hashed */
    }
    if (st == LS_OK) st = ls_fpcache_decode(entry_path, buf, n, out, err);
    free(buf);
    if (st == LS_OK) *found = 1;
    return st;
}

/* mkdir -p for the directory part of path (everything before the last '/'). */
static ls_status make_parent_dirs(const char *path, ls_error *err)
{
    char *dir = strdup(path);
    if (!dir) return ls_fail_nomem(err, strlen(path) + 1, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) {
        free(dir);
        return LS_OK;
    }
    *slash = '\0';
    ls_status st = LS_OK;
    for (char *p = dir + 1; st == LS_OK; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            st = ls_fail(err, LS_E_IO, "%s: cannot create directory: %s", dir, strerror(errno));
        *p = c;
        if (c == '\0') break;
    }
    if (st == LS_OK) {
        struct stat sb;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            st = ls_fail(err, LS_E_IO, "%s: not a directory", dir);
    }
    free(dir);
    return st;
}

ls_status ls_fpcache_store(const char *entry_path, const ls_fpcache_entry *e, ls_error *err)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    LS_TRY(ls_fpcache_encode(e, &buf, &len, err));
    ls_status st = make_parent_dirs(entry_path, err);
    /* Never replace a node that is not a regular file (a FIFO planted there
     * would otherwise become an entry). */
    if (st == LS_OK) st = ls_output_path_check(entry_path, err);
    if (st == LS_OK) ls_temp_sweep_stale(entry_path);
    /* A unique temporary name per writer, "<path>.tmp.<pid>.<n>" (created
     * with O_EXCL): two threads of one process may store the same entry at
     * once, and the pid says whose it was if a kill leaves it behind. */
    static unsigned store_counter;
    size_t tn = strlen(entry_path) + sizeof ".tmp.-9223372036854775807.4294967295";
    char *tmp = st == LS_OK ? malloc(tn) : NULL;
    if (st == LS_OK && !tmp) st = ls_fail_nomem(err, tn, "%s: temporary name", entry_path);
    int fd = -1;
    if (st == LS_OK && tmp) {
        unsigned n = __atomic_add_fetch(&store_counter, 1, __ATOMIC_RELAXED);
        snprintf(tmp, tn, "%s.tmp.%ld.%u", entry_path, (long)getpid(), n);
        ls_temp_register(tmp, LS_TEMP_FILE);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
            st = ls_fail(err, LS_E_IO, "%s: cannot create: %s", tmp, strerror(errno));
            ls_temp_unregister(tmp);
        }
    }
    for (size_t n = 0; st == LS_OK && n < len;) {
        ssize_t put = write(fd, buf + n, len - n);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) st = ls_fail_write(err, tmp, put < 0 ? errno : ENOSPC);
        else n += (size_t)put;
    }
    if (fd >= 0 && close(fd) != 0 && st == LS_OK)
        st = ls_fail(err, LS_E_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (st == LS_OK && rename(tmp, entry_path) != 0)
        st = ls_fail(err, LS_E_IO, "%s: cannot rename into place: %s", entry_path, strerror(errno));
    if (fd >= 0) {
        if (st != LS_OK) unlink(tmp);
        ls_temp_unregister(tmp);
    }
    free(tmp);
    free(buf);
    return st;
}
