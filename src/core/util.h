/* lockstep — small process-wide services: logging, progress display,
 * arena allocation, atomic file output. */
#ifndef LS_CORE_UTIL_H
#define LS_CORE_UTIL_H

#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

/* ---- logging --------------------------------------------------------------
 * Messages go to stderr. Level 0 = errors only (--quiet), 1 = normal,
 * 2 = verbose (--verbose). */
extern int ls_log_level;
void ls_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ls_log_verbose(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ls_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- progress -------------------------------------------------------------
 * A one-line progress bar on stderr, drawn only when stderr is a terminal and
 * the log level is >= 1; otherwise every call is a no-op. Thread-safe: workers
 * may call ls_progress_add concurrently. */
typedef struct ls_progress {
    char label[48];          /* what is being done, e.g. "fingerprint" */
    uint64_t total;          /* units of work expected (bytes, tokens ...) */
    uint64_t done;           /* units completed; updated atomically */
    uint64_t last_draw_ns;   /* monotonic time of the last redraw */
    int enabled;             /* 1 when drawing to a terminal */
    const char *unit;        /* "B" for bytes (scaled to MB/GB), else a word */
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

/* Reads a whole file into a malloc'd buffer (NUL-terminated; *len excludes the
 * NUL). Caller frees *out. */
ls_status ls_read_file(const char *path, char **out, size_t *len, ls_error *err);

/* True when the stream is a terminal (colour and progress are enabled only then). */
int ls_isatty(FILE *f);

#endif
