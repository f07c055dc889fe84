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
 * complete, so a reader never sees a half-written file. */
typedef struct ls_outfile {
    FILE *fp;                /* write here */
    char path[4096];         /* final name */
    char tmp_path[4200];     /* temporary name */
} ls_outfile;

/* Opens a temporary file next to path. path "-" means stdout (no rename). */
ls_status ls_outfile_open(ls_outfile *o, const char *path, ls_error *err);
/* Flushes, fsyncs and renames into place; closes in every case. */
ls_status ls_outfile_commit(ls_outfile *o, ls_error *err);
/* Closes and removes the temporary file (on any failure path). */
void ls_outfile_abort(ls_outfile *o);
/* Convenience: writes len bytes atomically. */
ls_status ls_write_file_atomic(const char *path, const void *data, size_t len, ls_error *err);

/* ---- reading inputs -------------------------------------------------------
 * Every input lockstep reads (config.json, indexes, shards, manifests, prompt
 * and token files, traces, engine output) must be a regular file. Anything
 * else is refused before a byte is read, naming what it is: a FIFO would block
 * the reader until some writer appears, /dev/zero would feed it until memory
 * runs out, a directory has no bytes. Files read whole are bounded in size,
 * checked against the size at open and again while reading (a file may grow). */
#define LS_READ_JSON_MAX_BYTES (64ull << 20)  /* config.json, indexes, manifests, synth configs */
#define LS_READ_JSONL_MAX_BYTES (4ull << 30)  /* prompts / tokens JSONL, engine output to import */

/* "a FIFO", "a character device", "a block device", "a directory", "a socket",
 * "a symbolic link", or "not a regular file" for anything else. */
const char *ls_file_kind(mode_t mode);

/* Opens path read-only as a regular file. A path that is anything else fails
 * with LS_E_IO "<path>: is a FIFO, not a regular file" (the kind from
 * ls_file_kind) without being opened, so no device sees an open() and no FIFO
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
