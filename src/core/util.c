#include "core/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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

/* ---- temporary paths and signals ----------------------------------------- */

/* A fixed table, so the signal handler reads it without locks or malloc.
 * Slot states: 0 free, 1 being filled or emptied by its owner, 2 registered,
 * 3 taken by the handler (the process is about to die; never freed again). */
#define LS_TEMP_PATH_BYTES 4224
static struct {
    int state;
    int kind;
    char path[LS_TEMP_PATH_BYTES];
} temp_slots[LS_TEMP_MAX];

void ls_temp_register(const char *path, ls_temp_kind kind)
{
    size_t n = strlen(path);
    if (n >= LS_TEMP_PATH_BYTES) return;
    for (int i = 0; i < LS_TEMP_MAX; i++) {
        int expect = 0;
        if (!__atomic_compare_exchange_n(&temp_slots[i].state, &expect, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            continue;
        memcpy(temp_slots[i].path, path, n + 1);
        temp_slots[i].kind = (int)kind;
        __atomic_store_n(&temp_slots[i].state, 2, __ATOMIC_RELEASE);
        return;
    }
}

void ls_temp_unregister(const char *path)
{
    for (int i = 0; i < LS_TEMP_MAX; i++) {
        if (__atomic_load_n(&temp_slots[i].state, __ATOMIC_ACQUIRE) != 2) continue;
        if (strcmp(temp_slots[i].path, path) != 0) continue;
        int expect = 2;
        if (!__atomic_compare_exchange_n(&temp_slots[i].state, &expect, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            continue; /* the handler has it, or another thread changed it */
        if (strcmp(temp_slots[i].path, path) != 0) { /* reused meanwhile: not ours */
            __atomic_store_n(&temp_slots[i].state, 2, __ATOMIC_RELEASE);
            continue;
        }
        __atomic_store_n(&temp_slots[i].state, 0, __ATOMIC_RELEASE);
        return;
    }
}

/* Removes the entries of the open directory fd (and, depth permitting, of its
 * subdirectories), using only async-signal-safe calls: getdents64 through
 * syscall(2), unlinkat, openat, close. Used by the signal handler and by the
 * stale sweep alike. */
struct ls_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static void remove_dir_entries(int fd, int depth)
{
    /* Two passes: entries removed while reading may hide others from the
     * first one. */
    for (int pass = 0; pass < 2; pass++) {
        char buf[2048];
        lseek(fd, 0, SEEK_SET);
        for (;;) {
            long got = syscall(SYS_getdents64, fd, buf, sizeof buf);
            if (got <= 0) break;
            for (long off = 0; off < got;) {
                struct ls_dirent64 *de = (struct ls_dirent64 *)(void *)(buf + off);
                off += de->d_reclen;
                const char *nm = de->d_name;
                if (nm[0] == '.' && (nm[1] == '\0' || (nm[1] == '.' && nm[2] == '\0'))) continue;
                if (unlinkat(fd, nm, 0) == 0 || depth <= 0) continue;
                int sub = openat(fd, nm, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (sub < 0) continue;
                remove_dir_entries(sub, depth - 1);
                close(sub);
                unlinkat(fd, nm, AT_REMOVEDIR);
            }
        }
    }
}

static void remove_path(const char *path, int kind)
{
    if (kind == LS_TEMP_FILE) {
        unlink(path);
        return;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    remove_dir_entries(fd, 2);
    close(fd);
    rmdir(path);
}

static const int cleanup_signals[] = {SIGTERM, SIGINT, SIGHUP, SIGPIPE};

/* Removes every registered temporary; async-signal-safe. A slot taken here is
 * never freed again (the process is about to die). */
static void remove_temporaries(void)
{
    /* Files first: a registered directory may hold registered files. */
    for (int kind = LS_TEMP_FILE; kind <= LS_TEMP_DIR; kind++)
        for (int i = 0; i < LS_TEMP_MAX; i++) {
            if (temp_slots[i].kind != kind) continue;
            int expect = 2;
            if (__atomic_compare_exchange_n(&temp_slots[i].state, &expect, 3, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
                remove_path(temp_slots[i].path, kind);
        }
}

static void on_fatal_signal(int sig)
{
    remove_temporaries();
    /* Die of the same signal, as without the handler (the shell reports
     * 128 + sig): it is blocked while the handler runs, so it is delivered
     * on return, with the default action. */
    signal(sig, SIG_DFL);
    raise(sig);
}

/* ---- mapped inputs (SIGBUS) ---- */

/* Slot states: 0 free, 1 being filled or emptied by its owner, 2 registered.
 * The handler reads only slots in state 2; base, len and label are written
 * before the release store that makes a slot 2. */
static struct {
    int state;
    uintptr_t base;
    size_t len;
    const char *label;
} map_slots[LS_MAP_MAX];
static size_t map_page_bytes = 4096; /* set by ls_signals_install (sysconf is not signal-safe) */

int ls_map_register(const char *label, const void *base, size_t len)
{
    if (!label || !base || len == 0) return -1;
    for (int i = 0; i < LS_MAP_MAX; i++) {
        int expect = 0;
        if (!__atomic_compare_exchange_n(&map_slots[i].state, &expect, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            continue;
        map_slots[i].base = (uintptr_t)base;
        map_slots[i].len = len;
        map_slots[i].label = label;
        __atomic_store_n(&map_slots[i].state, 2, __ATOMIC_RELEASE);
        return i;
    }
    return -1;
}

void ls_map_unregister(int slot)
{
    if (slot < 0 || slot >= LS_MAP_MAX) return;
    __atomic_store_n(&map_slots[slot].state, 1, __ATOMIC_RELEASE);
    map_slots[slot].label = NULL;
    __atomic_store_n(&map_slots[slot].state, 0, __ATOMIC_RELEASE);
}

/* Appends s to buf[*n..cap) (truncating); async-signal-safe. */
static void sig_append(char *buf, size_t cap, size_t *n, const char *s)
{
    while (*s && *n + 1 < cap) buf[(*n)++] = *s++;
}

static void sig_append_u64(char *buf, size_t cap, size_t *n, uint64_t v)
{
    char digits[24];
    int k = 0;
    do {
        digits[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (k > 0 && *n + 1 < cap) buf[(*n)++] = digits[--k];
}

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    const char *label = NULL;
    uint64_t page_off = 0;
    /* si_code > 0: raised by the kernel for a fault, so si_addr is the
     * address touched (kill and raise give SI_USER, SI_TKILL, <= 0). */
    if (si && si->si_code > 0) {
        uintptr_t a = (uintptr_t)si->si_addr;
        for (int i = 0; i < LS_MAP_MAX && !label; i++) {
            if (__atomic_load_n(&map_slots[i].state, __ATOMIC_ACQUIRE) != 2) continue;
            if (a >= map_slots[i].base && a - map_slots[i].base < map_slots[i].len) {
                label = map_slots[i].label;
                page_off = (uint64_t)((a - map_slots[i].base) & ~(uintptr_t)(map_page_bytes - 1));
            }
        }
    }
    remove_temporaries();
    if (!label) {
        /* Not a mapping of ours: die of SIGBUS as without the handler. It is
         * blocked while the handler runs; a fault re-raises on return too. */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    char line[4096 + 256];
    size_t n = 0;
    sig_append(line, sizeof line, &n, "lockstep: ");
    sig_append(line, sizeof line, &n, label);
    sig_append(line, sizeof line, &n, ": the file shrank while it was being read (mapped page at byte offset ");
    sig_append_u64(line, sizeof line, &n, page_off);
    sig_append(line, sizeof line, &n, " is gone); was it modified during the run?");
    line[n++] = '\n';
    for (size_t off = 0; off < n;) {
        ssize_t k = write(2, line + off, n - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        off += (size_t)k;
    }
    _exit(2);
}

void ls_signals_install(void)
{
    signal(SIGXFSZ, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof cleanup_signals[0]; i++)
        sigaddset(&sa.sa_mask, cleanup_signals[i]); /* a second signal waits for the cleanup */
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof cleanup_signals[0]; i++) {
        struct sigaction old;
        if (sigaction(cleanup_signals[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        sigaction(cleanup_signals[i], &sa, NULL);
    }
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0 && (page & (page - 1)) == 0) map_page_bytes = (size_t)page;
    /* SIGBUS from a fault cannot be ignored, so it is installed whatever the
     * caller's disposition was. */
    struct sigaction sb;
    memset(&sb, 0, sizeof sb);
    sb.sa_sigaction = on_sigbus;
    sb.sa_flags = SA_SIGINFO;
    sb.sa_mask = sa.sa_mask; /* no TERM cleanup while this one runs */
    sigaction(SIGBUS, &sb, NULL);
}

/* The pid of "<base>.tmp.<pid>" or "<base>.tmp.<pid>.<x>", or 0. */
static long stale_pid(const char *entry, const char *base, size_t blen)
{
    if (strncmp(entry, base, blen) != 0 || strncmp(entry + blen, ".tmp.", 5) != 0) return 0;
    const char *p = entry + blen + 5;
    long pid = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (pid > 100000000) return 0;
        pid = pid * 10 + (*p - '0');
    }
    if (p == entry + blen + 5 || (*p != '\0' && *p != '.')) return 0;
    return pid;
}

void ls_temp_sweep_stale(const char *name)
{
    char dir[4096];
    const char *slash = strrchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    size_t blen = strlen(base);
    if (blen == 0) return;
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == name) snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - name) < sizeof dir) snprintf(dir, sizeof dir, "%.*s", (int)(slash - name), name);
    else return;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char path[8400];
    while ((de = readdir(d)) != NULL) {
        long pid = stale_pid(de->d_name, base, blen);
        if (pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* running, or not ours to judge */
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (lstat(path, &sb) != 0) continue;
        if (S_ISREG(sb.st_mode)) remove_path(path, LS_TEMP_FILE);
        else if (S_ISDIR(sb.st_mode)) remove_path(path, LS_TEMP_DIR);
        else continue;
        ls_log_verbose("removed %s, left by process %ld, which no longer runs", path, pid);
    }
    closedir(d);
}

/* ---- atomic output ------------------------------------------------------ */

const char *ls_file_kind_name(unsigned mode)
{
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "not a regular file";
}

ls_status ls_output_path_check(const char *path, ls_error *err)
{
    /* Temp-and-rename would replace the node itself (as root, /dev/full
     * became a regular file), and writing into it directly is not atomic:
     * outputs go to regular files only. */
    struct stat sb;
    if (stat(path, &sb) != 0 || S_ISREG(sb.st_mode)) return LS_OK;
    return ls_fail(err, LS_E_USAGE, "%s: exists and is %s; an output replaces a regular file only "
                   "(give a new path, or '-' for stdout where the option allows it)", path, ls_file_kind_name(sb.st_mode));
}

ls_status ls_fsync_parent_dir(const char *path, ls_error *err)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) < sizeof dir) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else return ls_fail(err, LS_E_USAGE, "%s: path too long", path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ls_fail(err, LS_E_IO, "%s: cannot open the directory to sync it: %s", dir, strerror(errno));
    int bad = fsync(fd) != 0 && errno != EINVAL;
    int e = errno;
    close(fd);
    if (bad) return ls_fail(err, LS_E_IO, "%s: cannot sync the directory (after writing %s): %s", dir, path, strerror(e));
    return LS_OK;
}

ls_status ls_fail_write(ls_error *err, const char *path, int e)
{
    if (e == EFBIG)
        return ls_fail(err, LS_E_IO, "%s: write failed: %s (the file size limit, ulimit -f, is reached)", path,
                       strerror(e));
    if (e == 0) return ls_fail(err, LS_E_IO, "%s: write failed", path);
    return ls_fail(err, LS_E_IO, "%s: write failed: %s", path, strerror(e));
}

/* errno of the first failed ls_stdout_puts: a large write bypasses stdio's
 * buffer, so a later flush has nothing to retry and cannot say why. */
static int stdout_errno;

ls_status ls_stdout_puts(const char *s, ls_error *err)
{
    errno = 0;
    if (fputs(s, stdout) != EOF && fputc('\n', stdout) != EOF) return LS_OK;
    if (!stdout_errno) stdout_errno = errno ? errno : EIO;
    return ls_fail(err, LS_E_IO, "stdout: %s", strerror(stdout_errno));
}

ls_status ls_stdout_check(ls_error *err)
{
    /* glibc keeps the unwritten bytes of a failed buffered write, so flushing
     * again fails again and says why; an error flag with nothing left to
     * flush says why only when ls_stdout_puts saw it. */
    errno = 0;
    int e = fflush(stdout) != 0 ? errno : 0;
    if (!e && !ferror(stdout)) return LS_OK;
    if (!e) e = stdout_errno;
    return ls_fail(err, LS_E_IO, "stdout: %s", e ? strerror(e) : "write error");
}

ls_status ls_stdout_close(ls_error *err)
{
    ls_status st = ls_stdout_check(err);
    errno = 0;
    if (fclose(stdout) != 0 && st == LS_OK)
        st = ls_fail(err, LS_E_IO, "stdout: %s", errno ? strerror(errno) : "write error");
    return st;
}

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
    LS_TRY(ls_output_path_check(path, err));
    ls_temp_sweep_stale(path);
    snprintf(o->tmp_path, sizeof o->tmp_path, "%s.tmp.%ld", path, (long)getpid());
    ls_temp_register(o->tmp_path, LS_TEMP_FILE);
    o->fp = fopen(o->tmp_path, "wb");
    if (!o->fp) {
        int e = errno;
        ls_temp_unregister(o->tmp_path);
        return ls_fail(err, LS_E_IO, "%s: cannot create: %s", o->tmp_path, strerror(e));
    }
    return LS_OK;
}

ls_status ls_outfile_write(ls_outfile *o, const void *data, size_t n, ls_error *err)
{
    if (n == 0 || fwrite(data, 1, n, o->fp) == n) return LS_OK;
    if (!o->err_no) o->err_no = errno ? errno : EIO;
    if (o->fp == stdout) return ls_fail(err, LS_E_IO, "stdout: %s", strerror(o->err_no));
    return ls_fail_write(err, o->path, o->err_no);
}

ls_status ls_outfile_commit(ls_outfile *o, ls_error *err)
{
    if (o->fp == stdout) {
        o->fp = NULL;
        ls_status st = ls_stdout_check(err);
        /* reported here; main's final check need not say it again */
        if (st) clearerr(stdout);
        return st;
    }
    /* fflush first: after a failed write it fails again and sets errno */
    errno = 0;
    int e = fflush(o->fp) != 0 ? errno : 0;
    if (!e && (ferror(o->fp) || o->err_no)) e = o->err_no ? o->err_no : EIO;
    if (!e && fsync(fileno(o->fp)) != 0) e = errno;
    if (fclose(o->fp) != 0 && !e) e = errno ? errno : EIO;
    o->fp = NULL;
    ls_status st = e ? ls_fail_write(err, o->path, e) : LS_OK;
    /* the path may have been replaced by a device or FIFO since open */
    if (!st) st = ls_output_path_check(o->path, err);
    if (!st && rename(o->tmp_path, o->path) != 0) {
        e = errno;
        st = ls_fail(err, LS_E_IO, "%s: cannot rename into place: %s", o->path, strerror(e));
    }
    if (st) unlink(o->tmp_path);
    ls_temp_unregister(o->tmp_path);
    if (!st) st = ls_fsync_parent_dir(o->path, err);
    return st;
}

void ls_outfile_abort(ls_outfile *o)
{
    if (!o->fp) return;
    if (o->fp != stdout) {
        fclose(o->fp);
        unlink(o->tmp_path);
        ls_temp_unregister(o->tmp_path);
    }
    o->fp = NULL;
}

ls_status ls_write_file_atomic(const char *path, const void *data, size_t len, ls_error *err)
{
    ls_outfile o;
    LS_TRY(ls_outfile_open(&o, path, err));
    ls_status st = ls_outfile_write(&o, data, len, err);
    if (st) {
        ls_outfile_abort(&o);
        return st;
    }
    return ls_outfile_commit(&o, err);
}

/* ---- reading inputs ------------------------------------------------------ */

static ls_status not_regular(const char *path, mode_t mode, ls_error *err)
{
    const char *kind = ls_file_kind_name(mode);
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
