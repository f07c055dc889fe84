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
    log_v(1, "lockstep: warning: ", fmt, ap); /* --quiet silences warnings too (like cmp -s) */
    va_end(ap);
}

int ls_log_quiet(void)
{
    return ls_log_level <= 0;
}

/* ---- colour ------------------------------------------------------------- */

ls_color_mode ls_color_setting = LS_COLOR_AUTO;

int ls_color_parse(const char *s, ls_color_mode *out)
{
    static const struct {
        const char *name;
        ls_color_mode mode;
    } modes[] = {{"auto", LS_COLOR_AUTO}, {"always", LS_COLOR_ALWAYS}, {"never", LS_COLOR_NEVER}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (strcmp(s, modes[i].name) == 0) {
            *out = modes[i].mode;
            return 0;
        }
    return -1;
}

int ls_color_enabled(FILE *f)
{
    if (ls_color_setting != LS_COLOR_AUTO) return ls_color_setting == LS_COLOR_ALWAYS;
    const char *no_color = getenv("NO_COLOR"), *term = getenv("TERM");
    if (no_color && no_color[0]) return 0; /* no-color.org: any non-empty value */
    if (term && strcmp(term, "dumb") == 0) return 0;
    return ls_isatty(f);
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

#define LS_PROGRESS_DEFAULT_SECONDS 5.0

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

/* One plain line for a log (stderr not a terminal), written with a single
 * fprintf so lines from concurrent callers do not interleave. */
static void progress_line(const ls_progress *p, uint64_t done, uint64_t now, int final)
{
    double secs = (double)(now - p->start_ns) / 1e9;
    double pct = p->total ? 100.0 * (double)done / (double)p->total : 100.0;
    if (pct > 100.0) pct = 100.0;
    double rate = secs > 0 ? (double)done / secs : 0.0;
    const char *tail = final ? " (done)" : "";
    if (p->unit && strcmp(p->unit, "B") == 0) {
        /* one scale for done, total and rate, chosen by the total */
        double scale = p->total >= 1000000000u ? 1e9 : p->total >= 1000000u ? 1e6 : p->total >= 1000u ? 1e3 : 1.0;
        const char *u = scale == 1e9 ? "GB" : scale == 1e6 ? "MB" : scale == 1e3 ? "kB" : "B";
        fprintf(stderr, "%s: %.2f/%.2f %s (%.1f%%), %.2f %s/s, %.1f s elapsed%s\n", p->label,
                (double)done / scale, (double)p->total / scale, u, pct, rate / scale, u, secs, tail);
    } else {
        const char *u = p->unit ? p->unit : "";
        fprintf(stderr, "%s: %llu/%llu %s (%.1f%%), %.1f %s/s, %.1f s elapsed%s\n", p->label,
                (unsigned long long)done, (unsigned long long)p->total, u, pct, rate, u, secs, tail);
    }
    fflush(stderr);
}

/* LOCKSTEP_PROGRESS_SECONDS (a non-negative number) or the default. */
static uint64_t progress_interval_ns(void)
{
    double s = LS_PROGRESS_DEFAULT_SECONDS;
    const char *env = getenv("LOCKSTEP_PROGRESS_SECONDS");
    if (env && *env) {
        char *end;
        double v = strtod(env, &end);
        if (*end == '\0' && v >= 0.0 && v <= 86400.0) s = v;
    }
    return (uint64_t)(s * 1e9);
}

void ls_progress_begin(ls_progress *p, const char *label, uint64_t total, const char *unit)
{
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->unit = unit;
    p->start_ns = ls_now_ns();
    p->interval_ns = progress_interval_ns();
    p->enabled = ls_log_level < 1 ? 0 : ls_isatty(stderr) ? 1 : 2;
    /* a bar appears at once; the first plain line only after one interval */
    p->last_draw_ns = p->enabled == 2 ? p->start_ns : 0;
}

void ls_progress_add(ls_progress *p, uint64_t n)
{
    uint64_t done = __atomic_add_fetch(&p->done, n, __ATOMIC_RELAXED);
    if (!p->enabled) return;
    uint64_t now = ls_now_ns();
    uint64_t last = __atomic_load_n(&p->last_draw_ns, __ATOMIC_RELAXED);
    if (p->enabled == 1) {
        if (now - last < 100000000u && done < p->total) return; /* at most 10 redraws/s */
    } else if (now - last < p->interval_ns) {
        return; /* the last line is recent; ls_progress_end writes the final one */
    }
    if (!__atomic_compare_exchange_n(&p->last_draw_ns, &last, now, 0, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return; /* another thread is drawing */
    if (p->enabled == 1) progress_draw(p, done);
    else progress_line(p, done, now, 0);
}

void ls_progress_end(ls_progress *p)
{
    if (!p->enabled) return;
    uint64_t done = __atomic_load_n(&p->done, __ATOMIC_RELAXED);
    if (p->enabled == 2) {
        /* Work done within one interval printed no line and needs no final
         * one: logs stay quiet, and `cmd --json 2>&1` of a quick run stays
         * pure JSON. */
        uint64_t now = ls_now_ns();
        uint64_t last = __atomic_load_n(&p->last_draw_ns, __ATOMIC_RELAXED);
        if (last != p->start_ns || now - p->start_ns >= p->interval_ns) progress_line(p, done, now, 1);
        return;
    }
    progress_draw(p, done);
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
