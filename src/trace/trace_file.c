/* lockstep — read-only access to a trace file: the whole file mapped, or
 * pread() into caller buffers where mapping fails or is disabled.
 *
 * Mapping saves copying every payload out of the kernel (the largest single
 * cost of 'lockstep compare' when reading). The size is fixed at open, so a
 * file still being appended to (a running writer's temporary file) reads as
 * the prefix that existed then, exactly as with read(). Mapped pages are page
 * cache, not heap: the kernel reclaims them under pressure, so the heap bound
 * of the reader and the index (a few frames) holds whatever the file size. A
 * file truncated by another process while mapped would fault (SIGBUS) where
 * read() reports a short read: LOCKSTEP_TRACE_NO_MMAP=1 selects read() for
 * files that may shrink under the reader. Only regular files are opened
 * (ls_file_open_regular): a FIFO would block the open. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "trace/trace_internal.h"

ls_status ls_trace_file_open(const char *path, int sequential, ls_trace_file *f, ls_error *err)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = path;
    struct stat stt;
    LS_TRY(ls_file_open_regular(path, &f->fd, &stt, err));
    f->bytes = (uint64_t)stt.st_size;
    const char *no_map = getenv("LOCKSTEP_TRACE_NO_MMAP");
    if (f->bytes && f->bytes <= SIZE_MAX && !(no_map && no_map[0] && strcmp(no_map, "0"))) {
        void *m = mmap(NULL, (size_t)f->bytes, PROT_READ, MAP_PRIVATE, f->fd, 0);
        if (m != MAP_FAILED) {
            f->map = m;
            /* advice only: the reader walks the file once, front to back */
            if (sequential) (void)madvise(m, (size_t)f->bytes, MADV_SEQUENTIAL);
        }
    }
    return LS_OK;
}

ls_status ls_trace_file_view(ls_trace_file *f, uint64_t off, size_t len, uint8_t **buf, size_t *cap,
                             const uint8_t **out, ls_error *err)
{
    *out = NULL;
    if (off > f->bytes || len > f->bytes - off)
        return ls_fail(err, LS_E_INTERNAL, "%s: offset %" PRIu64 ": read of %zu bytes past the end", f->path, off, len);
    if (f->map) {
        *out = f->map + off;
        return LS_OK;
    }
    if (len > *cap) {
        size_t n = *cap ? *cap : 64;
        while (n < len) n *= 2;
        uint8_t *q = realloc(*buf, n);
        if (!q) return ls_fail(err, LS_E_NOMEM, "out of memory (%zu bytes)", n);
        *buf = q;
        *cap = n;
    }
    for (size_t got = 0; got < len;) {
        ssize_t k = pread(f->fd, *buf + got, len - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return ls_fail(err, LS_E_IO, "%s: offset %" PRIu64 ": read failed: %s", f->path, off,
                           k < 0 ? strerror(errno) : "file shrank while open");
        got += (size_t)k;
    }
    *out = *buf;
    return LS_OK;
}

void ls_trace_file_close(ls_trace_file *f)
{
    if (f->map) munmap((void *)f->map, (size_t)f->bytes);
    if (f->fd >= 0) close(f->fd);
    f->map = NULL;
    f->fd = -1;
}
