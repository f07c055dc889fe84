#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
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

/* ---- reading inputs ------------------------------------------------------ */

const char *ls_file_kind(mode_t mode)
{
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "not a regular file";
}

static ls_status not_regular(const char *path, mode_t mode, ls_error *err)
{
    const char *kind = ls_file_kind(mode);
    if (strcmp(kind, "not a regular file") == 0) return ls_fail(err, LS_E_IO, "%s: not a regular file", path);
    return ls_fail(err, LS_E_IO, "%s: is %s, not a regular file", path, kind);
}

ls_status ls_file_open_regular(const char *path, int *fd, struct stat *sb, ls_error *err)
{
    *fd = -1;
    struct stat s;
    /* stat before open: a device is refused without being opened at all
     * (opening one can act: a tape rewinds, a serial line raises DTR). */
    if (stat(path, &s) != 0) return ls_fail(err, LS_E_IO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(s.st_mode)) return not_regular(path, s.st_mode, err);
    /* O_NONBLOCK: should the path become a FIFO after the stat, open returns
     * at once instead of waiting for a writer, and fstat below refuses it. */
    int d = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (d < 0) return ls_fail(err, LS_E_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(d, &s) != 0) {
        int e = errno;
        close(d);
        return ls_fail(err, LS_E_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(s.st_mode)) {
        close(d);
        return not_regular(path, s.st_mode, err);
    }
    int fl = fcntl(d, F_GETFL);
    if (fl < 0 || fcntl(d, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(d);
        return ls_fail(err, LS_E_IO, "%s: cannot clear O_NONBLOCK: %s", path, strerror(e));
    }
    *fd = d;
    if (sb) *sb = s;
    return LS_OK;
}

static ls_status too_big(const char *path, uint64_t bytes, uint64_t max_bytes, ls_error *err)
{
    return ls_fail(err, LS_E_INPUT, "%s: %llu bytes, more than the limit of %llu bytes (%llu MiB) for this input",
                   path, (unsigned long long)bytes, (unsigned long long)max_bytes,
                   (unsigned long long)(max_bytes >> 20));
}

ls_status ls_read_file_max(const char *path, uint64_t max_bytes, char **out, size_t *len,
                           ls_error *err)
{
    *out = NULL;
    if (len) *len = 0;
    if (max_bytes > SIZE_MAX - 2) max_bytes = SIZE_MAX - 2;
    int fd;
    struct stat sb;
    LS_TRY(ls_file_open_regular(path, &fd, &sb, err));
    if ((uint64_t)sb.st_size > max_bytes) {
        close(fd);
        return too_big(path, (uint64_t)sb.st_size, max_bytes, err);
    }
    /* The size at open, plus room to see EOF (or growth) without a realloc;
     * files that report 0 bytes but have content (procfs) grow the buffer. */
    size_t cap = (size_t)sb.st_size + 1 < 4096 ? 4096 : (size_t)sb.st_size + 2;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return ls_fail_nomem(err, cap, "%s", path);
    }
    size_t n = 0;
    ls_status st = LS_OK;
    for (;;) {
        if (n + 1 == cap) {
            size_t ncap = cap > (size_t)max_bytes / 2 ? (size_t)max_bytes + 2 : cap * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                st = ls_fail_nomem(err, ncap, "%s", path);
                break;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t got = read(fd, buf + n, cap - 1 - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            st = ls_fail(err, LS_E_IO, "%s: read failed at byte offset %zu: %s", path, n, strerror(errno));
            break;
        }
        if (got == 0) break;
        n += (size_t)got;
        if (n > max_bytes) { /* grew past the limit while being read */
            st = too_big(path, n, max_bytes, err);
            break;
        }
    }
    close(fd);
    if (st != LS_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return LS_OK;
}

ls_status ls_read_file(const char *path, char **out, size_t *len, ls_error *err)
{
    return ls_read_file_max(path, LS_READ_JSON_MAX_BYTES, out, len, err);
}
