/* lockstep — small process-wide services: logging, progress display,
 * arena allocation, atomic file output. */
#ifndef LS_CORE_UTIL_H
#define LS_CORE_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "core/status.h"

/* ---- logging --------------------------------------------------------------
 * Messages go to stderr. Level 0 = --quiet: no info, warnings or progress on
 * stderr, and commands print nothing on stdout but output the user asked for
 * by name (--json, -o -); only hard errors (exit 2) are still reported.
 * 1 = normal, 2 = verbose (--verbose). */
extern int ls_log_level;
void ls_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ls_log_verbose(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ls_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* True under --quiet (ls_log_level 0): print only asked-for output. */
int ls_log_quiet(void);

/* ---- colour ---------------------------------------------------------------
 * Every place that colours asks ls_color_enabled. auto (the default) colours
 * only a terminal, and only when NO_COLOR is unset or empty (no-color.org) and
 * TERM is not "dumb"; always / never (--color=WHEN) override all three. */
typedef enum ls_color_mode {
    LS_COLOR_AUTO,
    LS_COLOR_ALWAYS,
    LS_COLOR_NEVER,
} ls_color_mode;
extern ls_color_mode ls_color_setting;

/* Parses "auto", "always" or "never"; returns 0, or -1 for anything else. */
int ls_color_parse(const char *s, ls_color_mode *out);
/* 1 when ANSI colour may be written to f. */
int ls_color_enabled(FILE *f);

/* ---- progress -------------------------------------------------------------
 * Progress of long work on stderr, nothing under --quiet. On a terminal, a
 * one-line bar redrawn in place (at most 10 times a second). Otherwise (a log
 * file, CI) a plain line, no carriage return or escape, at most every 5 s
 * (environment LOCKSTEP_PROGRESS_SECONDS overrides; 0 = every update):
 *   "fingerprint: 1.20/4.00 GB (30.0%), 0.85 GB/s, 1.4 s elapsed"
 * and a last one, ending "(done)", from ls_progress_end; work that ends
 * within the first interval prints no line at all. Thread-safe: workers may
 * call ls_progress_add concurrently. */
typedef struct ls_progress {
    char label[48];          /* what is being done, e.g. "fingerprint" */
    uint64_t total;          /* units of work expected (bytes, tokens ...) */
    uint64_t done;           /* units completed; updated atomically */
    uint64_t start_ns;       /* monotonic time of ls_progress_begin */
    uint64_t last_draw_ns;   /* monotonic time of the last redraw / line */
    uint64_t interval_ns;    /* least time between two plain lines */
    int enabled;             /* 0 off, 1 bar on a terminal, 2 plain lines */
    const char *unit;        /* "B" for bytes (scaled to kB/MB/GB), else a word */
} ls_progress;

void ls_progress_begin(ls_progress *p, const char *label, uint64_t total, const char *unit);
void ls_progress_add(ls_progress *p, uint64_t n);
void ls_progress_end(ls_progress *p);

/* Monotonic clock in nanoseconds. */
uint64_t ls_now_ns(void);

/* ---- arena ----------------------------------------------------------------
 * A run's host buffers come from one arena and are freed together. Blocks are
 * 64-byte aligned and zero-filled. */
typedef struct ls_arena_block ls_arena_block;
typedef struct ls_arena {
    ls_arena_block *head;    /* most recent block; owned */
    size_t bytes_total;      /* bytes handed out so far */
} ls_arena;

void ls_arena_init(ls_arena *a);
/* Returns zeroed, 64-byte aligned memory owned by the arena, or NULL (and
 * fills err) when out of memory. */
void *ls_arena_alloc(ls_arena *a, size_t bytes, ls_error *err);
void ls_arena_free(ls_arena *a);

/* ---- atomic output --------------------------------------------------------
 * Outputs are written to "<path>.tmp.<pid>" and renamed over path only when
 * complete, so a reader never sees a half-written file; the file and then its
 * directory are fsynced, so a power loss keeps either the old output or the
 * whole new one. Only a regular file is ever replaced: a path that exists and
 * is a directory, device, FIFO or socket is refused (LS_E_USAGE, naming what
 * it is) before anything is written, and again before the rename; "-" means
 * stdout. While in flight the temporary name is registered (see "temporary
 * paths" below); opening also removes the stale temporaries of the same
 * output left by processes that no longer exist. */
typedef struct ls_outfile {
    FILE *fp;                /* write here */
    char path[4096];         /* final name */
    char tmp_path[4200];     /* temporary name */
    int err_no;              /* errno of the first failed ls_outfile_write, 0 if none */
} ls_outfile;

/* Opens a temporary file next to path. path "-" means stdout (no rename). */
ls_status ls_outfile_open(ls_outfile *o, const char *path, ls_error *err);
/* Writes n bytes; on failure fills err ("PATH: write failed: <reason>") and
 * leaves the file open for ls_outfile_abort. Callers may also write to o->fp
 * directly: ls_outfile_commit checks the stream's error flag. */
ls_status ls_outfile_write(ls_outfile *o, const void *data, size_t n, ls_error *err);
/* Flushes, fsyncs and renames into place, then fsyncs the directory; closes
 * in every case and removes the temporary file on failure. For stdout: flushes
 * and reports a write error ("stdout: <reason>"). */
ls_status ls_outfile_commit(ls_outfile *o, ls_error *err);
/* Closes and removes the temporary file (on any failure path). */
void ls_outfile_abort(ls_outfile *o);
/* Convenience: writes len bytes atomically ("-": to stdout). */
ls_status ls_write_file_atomic(const char *path, const void *data, size_t len, ls_error *err);

/* Fills err with "PATH: write failed: <strerror(e)>" (naming the file size
 * limit for EFBIG) and returns LS_E_IO. */
ls_status ls_fail_write(ls_error *err, const char *path, int e);

/* LS_OK when path does not exist or is a regular file (or a link to one);
 * otherwise LS_E_USAGE: "PATH: exists and is a FIFO; ...". Every writer of a
 * named output asks this first. */
ls_status ls_output_path_check(const char *path, ls_error *err);
/* What a stat mode is, for messages: "a directory", "a FIFO", ... */
const char *ls_file_kind_name(unsigned mode);
/* fsyncs the directory that holds path (after a rename into it). Filesystems
 * that cannot sync a directory (EINVAL) count as success. */
ls_status ls_fsync_parent_dir(const char *path, ls_error *err);

/* ---- stdout ---------------------------------------------------------------
 * Results printed on stdout are output too: a command whose stdout cannot be
 * written (a full disk, /dev/full, a closed pipe with SIGPIPE ignored) must
 * fail. ls_stdout_check flushes and returns "stdout: <reason>" on any error
 * so far (a long printer calls it to stop early); ls_stdout_close also closes
 * it (main, once, before returning its exit code). */
ls_status ls_stdout_check(ls_error *err);
/* puts(s) (s and a newline) that records why it failed, for the final check. */
ls_status ls_stdout_puts(const char *s, ls_error *err);
ls_status ls_stdout_close(ls_error *err);

/* ---- temporary paths and signals ------------------------------------------
 * Every temporary output is named "NAME.tmp.<pid>" (or "NAME.tmp.<pid>.<x>"
 * where one process makes several: work directories, cache entries), NAME
 * being the output it becomes, so one left behind by a killed process says
 * whose it was. While it exists it is registered here; ls_signals_install
 * (the CLI's main) makes SIGTERM, SIGINT, SIGHUP and SIGPIPE remove every
 * registered path (a directory with its contents) before the process dies of
 * the signal as before, and ignores SIGXFSZ so that exceeding the file size
 * limit (ulimit -f) is a write error (EFBIG) reported like any other.
 * A SIGKILL leaves the temporary behind: ls_temp_sweep_stale removes those of
 * one output whose process no longer runs on this host. */
typedef enum ls_temp_kind {
    LS_TEMP_FILE,            /* unlinked */
    LS_TEMP_DIR,             /* removed with its contents (three levels at most) */
} ls_temp_kind;

/* Registers path (before creating it, so no instant leaves it unregistered).
 * At most LS_TEMP_MAX paths are registered at once; beyond that, or for a
 * path longer than 4223 bytes, nothing is recorded (the path then survives a
 * signal, as before). */
#define LS_TEMP_MAX 64
void ls_temp_register(const char *path, ls_temp_kind kind);
/* Forgets path (after renaming it into place or removing it). */
void ls_temp_unregister(const char *path);
/* Removes "NAME.tmp.<pid>" and "NAME.tmp.<pid>.<x>" next to name (a file, or
 * a directory with its contents) whose pid is not this process and names no
 * running process. Best effort; says what it removed at --verbose. A process
 * of another host (a shared filesystem) or PID namespace looks dead: its
 * temporary would be removed and its rename then fails (exit 2), never a
 * partial output. */
void ls_temp_sweep_stale(const char *name);
/* ---- mapped inputs and SIGBUS ----------------------------------------------
 * Checkpoint shards are mapped (io/checkpoint.h), and a mapped file that
 * another process truncates does not fail a read: the first access to a page
 * past its new end raises SIGBUS. Every such mapping is registered here while
 * it exists (file name, base, length), in a fixed table the SIGBUS handler
 * reads without locks or malloc. The handler (installed by ls_signals_install
 * with the others) looks the faulting address up: inside a registered range
 * it writes one line, "lockstep: <file>: the file shrank while it was being
 * read (mapped page at byte offset N is gone); was it modified during the
 * run?", with write(2), removes the registered temporaries as the SIGTERM
 * handler does, and ends the process with _exit(2). A SIGBUS anywhere else (or
 * one sent with kill) removes the temporaries and kills the process with the
 * default action, as without the handler.
 * The library registers its mappings but installs no handler: a signal's
 * disposition belongs to the program (the CLI's main calls
 * ls_signals_install). Up to LS_MAP_MAX mappings are registered at once; one
 * beyond that is not (its SIGBUS then kills the process as before). */
#define LS_MAP_MAX 4096
/* Registers [base, base + len) as a mapping of the file `label`. label is
 * borrowed: it must stay valid and unchanged until ls_map_unregister. Returns
 * the slot to pass to ls_map_unregister, or -1 when the table is full. */
int ls_map_register(const char *label, const void *base, size_t len);
/* Forgets a slot from ls_map_register (before unmapping); -1 is a no-op. */
void ls_map_unregister(int slot);

/* Installs the handlers described above (temporaries and SIGBUS). Signals
 * ignored when the process started (nohup) stay ignored. */
void ls_signals_install(void);

/* ---- reading inputs -------------------------------------------------------
 * Every input lockstep reads (config.json, indexes, shards, manifests, prompt
 * and token files, traces, engine output) must be a regular file. Anything
 * else is refused before a byte is read, naming what it is: a FIFO would block
 * the reader until some writer appears, /dev/zero would feed it until memory
 * runs out, a directory has no bytes. Files read whole are bounded in size,
 * checked against the size at open and again while reading (a file may grow). */
#define LS_READ_JSON_MAX_BYTES (64ull << 20)  /* config.json, indexes, manifests, synth configs */
#define LS_READ_JSONL_MAX_BYTES (4ull << 30)  /* prompts / tokens JSONL, engine output to import */

/* Opens path read-only as a regular file. A path that is anything else fails
 * with LS_E_IO "<path>: is a FIFO, not a regular file" (the kind from
 * ls_file_kind_name) without being opened, so no device sees an open() and no FIFO
 * blocks; a path swapped for a FIFO between the check and the open is caught
 * by fstat on the descriptor. A missing or unreadable path is LS_E_IO
 * "<path>: cannot open: <errno text>". On success *fd is a blocking descriptor
 * the caller closes, and *sb (may be NULL) its fstat. */
ls_status ls_file_open_regular(const char *path, int *fd, struct stat *sb, ls_error *err);

/* Reads a whole regular file into a malloc'd buffer (NUL-terminated; *len
 * excludes the NUL). Caller frees *out. A file larger than max_bytes fails
 * with LS_E_INPUT "<path>: N bytes, more than the limit of M bytes (K MiB) for
 * this input", before anything is allocated; an allocation failure is
 * LS_E_NOMEM "<path>: out of memory (N bytes asked)". */
ls_status ls_read_file_max(const char *path, uint64_t max_bytes, char **out, size_t *len,
                           ls_error *err);

/* ls_read_file_max with LS_READ_JSON_MAX_BYTES. */
ls_status ls_read_file(const char *path, char **out, size_t *len, ls_error *err);

/* True when the stream is a terminal (the progress bar is drawn only then;
 * colour asks ls_color_enabled). */
int ls_isatty(FILE *f);

#endif
