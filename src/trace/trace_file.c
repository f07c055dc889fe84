/* lockstep — read-only access to a trace file through pread() into caller
 * buffers.
 *
 * Traces are read, never mapped. A mapped file that another process
 * truncates faults (SIGBUS) on the first page past the new end, and no
 * reader can turn a signal into an error naming the file without a
 * process-wide handler; pread() reports the same event as a short read, which
 * becomes "<path>: offset N: ... file shrank while open". The copy costs
 * little next to decompressing and hashing the payload (harness/bench_compare
 * measured both; docs/trace-format.md gives the figures). The size is fixed at
 * open, so a file still being appended to (a running writer's temporary file)
 * reads as the prefix that existed then. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "trace/trace_internal.h"

ls_status ls_trace_file_open(const char *path, int sequential, ls_trace_file *f, ls_error *err)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = path;
    struct stat sb;
    LS_TRY(ls_file_open_regular(path, &f->fd, &sb, err));
    f->bytes = (uint64_t)sb.st_size;
    /* advice only: the reader walks the file once, front to back */
    if (sequential) (void)posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    return LS_OK;
}

/* pread of exactly len bytes at off into dst; a short read means the file
 * shrank since open (its size then was checked by the caller). */
static ls_status read_exact(ls_trace_file *f, uint64_t off, size_t len, uint8_t *dst, ls_error *err)
{
    for (size_t got = 0; got < len;) {
        ssize_t k = pread(f->fd, dst + got, len - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0)
            return ls_fail(err, LS_E_IO, "%s: offset %" PRIu64 ": read failed: %s", f->path, off + got,
                           strerror(errno));
        if (k == 0)
            return ls_fail(err, LS_E_IO, "%s: offset %" PRIu64 ": file shrank while open (%" PRIu64
                           " bytes at open; another process truncated it)", f->path, off + got, f->bytes);
        got += (size_t)k;
    }
    return LS_OK;
}

ls_status ls_trace_file_view(ls_trace_file *f, uint64_t off, size_t len, uint8_t **buf, size_t *cap,
                             const uint8_t **out, ls_error *err)
{
    *out = NULL;
    if (off > f->bytes || len > f->bytes - off)
        return ls_fail(err, LS_E_INTERNAL, "%s: offset %" PRIu64 ": read of %zu bytes past the end", f->path, off, len);
    if (len > LS_TRACE_FILE_SMALL_VIEW_BYTES) {
        LS_TRY(ls_trace_grow_payload(buf, cap, len, err));
        LS_TRY(read_exact(f, off, len, *buf, err));
        *out = *buf;
        return LS_OK;
    }
    if (off < f->win_off || off + len > f->win_off + f->win_len) {
        if (!f->win && !(f->win = malloc(LS_TRACE_FILE_WINDOW_BYTES)))
            return ls_fail_nomem(err, LS_TRACE_FILE_WINDOW_BYTES, "%s: read-ahead window", f->path);
        uint64_t left = f->bytes - off;
        size_t want = left < LS_TRACE_FILE_WINDOW_BYTES ? (size_t)left : LS_TRACE_FILE_WINDOW_BYTES;
        f->win_len = 0;
        LS_TRY(read_exact(f, off, want, f->win, err));
        f->win_off = off;
        f->win_len = want;
    }
    *out = f->win + (off - f->win_off);
    return LS_OK;
}

void ls_trace_file_close(ls_trace_file *f)
{
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    free(f->win);
    f->win = NULL;
    f->win_len = 0;
}
