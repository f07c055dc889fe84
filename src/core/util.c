#include "core/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- logging ------------------------------------------------------------ */

int ls_log_level = 1;

static void log_v(int min_level, const char *prefix, const char *fmt, va_list ap)
{
    if (ls_log_level < min_level) return;
    fputs(prefix, stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void ls_log_info(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_v(1, "", fmt, ap);
    va_end(ap);
}

void ls_log_verbose(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_v(2, "", fmt, ap);
    va_end(ap);
}

void ls_log_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_v(0, "lockstep: warning: ", fmt, ap);
    va_end(ap);
}

/* ---- time / tty --------------------------------------------------------- */

uint64_t ls_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int ls_isatty(FILE *f)
{
    return isatty(fileno(f));
}

/* ---- progress ----------------------------------------------------------- */

static void progress_draw(ls_progress *p, uint64_t done)
{
    double frac = p->total ? (double)done / (double)p->total : 1.0;
    if (frac > 1.0) frac = 1.0;
    int filled = (int)(frac * 30.0);
    char bar[31];
    for (int i = 0; i < 30; i++) bar[i] = i < filled ? '#' : '.';
    bar[30] = '\0';
    if (p->unit && strcmp(p->unit, "B") == 0)
        fprintf(stderr, "\r%-16s [%s] %5.1f%%  %.2f / %.2f GB", p->label, bar, frac * 100.0,
                (double)done / 1e9, (double)p->total / 1e9);
    else
        fprintf(stderr, "\r%-16s [%s] %5.1f%%  %llu / %llu %s", p->label, bar, frac * 100.0,
                (unsigned long long)done, (unsigned long long)p->total, p->unit ? p->unit : "");
    fflush(stderr);
}

void ls_progress_begin(ls_progress *p, const char *label, uint64_t total, const char *unit)
{
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->unit = unit;
    p->enabled = ls_log_level >= 1 && ls_isatty(stderr);
}

void ls_progress_add(ls_progress *p, uint64_t n)
{
    uint64_t done = __atomic_add_fetch(&p->done, n, __ATOMIC_RELAXED);
    if (!p->enabled) return;
    uint64_t now = ls_now_ns();
    uint64_t last = __atomic_load_n(&p->last_draw_ns, __ATOMIC_RELAXED);
    if (now - last < 100000000u && done < p->total) return; /* at most 10 redraws/s */
    if (!__atomic_compare_exchange_n(&p->last_draw_ns, &last, now, 0, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return; /* another thread is drawing */
    progress_draw(p, done);
}

void ls_progress_end(ls_progress *p)
{
    if (!p->enabled) return;
    progress_draw(p, __atomic_load_n(&p->done, __ATOMIC_RELAXED));
    fputc('\n', stderr);
}

/* ---- arena -------------------------------------------------------------- */

struct ls_arena_block {
    ls_arena_block *next;
    size_t bytes;
    _Alignas(64) unsigned char data[];
};

void ls_arena_init(ls_arena *a)
{
    a->head = NULL;
    a->bytes_total = 0;
}

void *ls_arena_alloc(ls_arena *a, size_t bytes, ls_error *err)
{
    /* One block per allocation keeps the arena trivial; runs allocate a few
     * hundred buffers at most, so the bookkeeping cost is irrelevant. */
    size_t rounded = (bytes + 63u) & ~(size_t)63u;
    ls_arena_block *b = NULL;
    if (posix_memalign((void **)&b, 64, sizeof *b + rounded) != 0 || !b) {
        ls_fail(err, LS_E_NOMEM, "out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    memset(b->data, 0, rounded);
    b->bytes = rounded;
    b->next = a->head;
    a->head = b;
    a->bytes_total += rounded;
    return b->data;
}

void ls_arena_free(ls_arena *a)
{
    ls_arena_block *b = a->head;
    while (b) {
        ls_arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->bytes_total = 0;
}

/* ---- atomic output ------------------------------------------------------ */

ls_status ls_outfile_open(ls_outfile *o, const char *path, ls_error *err)
{
    memset(o, 0, sizeof *o);
    if (strlen(path) >= sizeof o->path)
        return ls_fail(err, LS_E_USAGE, "%s: path too long", path);
    snprintf(o->path, sizeof o->path, "%s", path);
    if (strcmp(path, "-") == 0) {
        o->fp = stdout;
        return LS_OK;
    }
    snprintf(o->tmp_path, sizeof o->tmp_path, "%s.tmp.%ld", path, (long)getpid());
    o->fp = fopen(o->tmp_path, "wb");
    if (!o->fp)
        return ls_fail(err, LS_E_IO, "%s: cannot create: %s", o->tmp_path, strerror(errno));
    return LS_OK;
}

ls_status ls_outfile_commit(ls_outfile *o, ls_error *err)
{
    if (o->fp == stdout) {
        fflush(stdout);
        o->fp = NULL;
        return LS_OK;
    }
    int bad = ferror(o->fp) || fflush(o->fp) != 0 || fsync(fileno(o->fp)) != 0;
    int saved = errno;
    if (fclose(o->fp) != 0) bad = 1;
    o->fp = NULL;
    if (bad) {
        unlink(o->tmp_path);
        return ls_fail(err, LS_E_IO, "%s: write failed: %s", o->path, strerror(saved));
    }
    if (rename(o->tmp_path, o->path) != 0) {
        saved = errno;
        unlink(o->tmp_path);
        return ls_fail(err, LS_E_IO, "%s: cannot rename into place: %s", o->path, strerror(saved));
    }
    return LS_OK;
}

void ls_outfile_abort(ls_outfile *o)
{
    if (!o->fp) return;
    if (o->fp != stdout) {
        fclose(o->fp);
        unlink(o->tmp_path);
    }
    o->fp = NULL;
}

ls_status ls_write_file_atomic(const char *path, const void *data, size_t len, ls_error *err)
{
    ls_outfile o;
    LS_TRY(ls_outfile_open(&o, path, err));
    if (len && fwrite(data, 1, len, o.fp) != len) {
        ls_outfile_abort(&o);
        return ls_fail(err, LS_E_IO, "%s: write failed: %s", path, strerror(errno));
    }
    return ls_outfile_commit(&o, err);
}

ls_status ls_read_file(const char *path, char **out, size_t *len, ls_error *err)
{
    *out = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return ls_fail(err, LS_E_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return ls_fail(err, LS_E_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return ls_fail(err, LS_E_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return ls_fail(err, LS_E_IO, "%s: read failed", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return LS_OK;
}
