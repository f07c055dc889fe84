/* lockstep — status codes and error messages.
 *
 * Every library function that can fail returns an ls_status and, on failure,
 * fills an ls_error with one line saying what went wrong, where (file, field,
 * tensor, byte offset) and, where useful, a hint. Only main() turns a status
 * into a process exit code (see ls_status_exit_code). A difference found by a
 * comparison is a result, not an error: it is reported through out-parameters.
 */
#ifndef LS_CORE_STATUS_H
#define LS_CORE_STATUS_H

#include <stddef.h>

typedef enum ls_status {
    LS_OK = 0,
    LS_E_USAGE,       /* bad command line or API misuse */
    LS_E_INPUT,       /* malformed input: safetensors, config, manifest, trace, JSONL */
    LS_E_UNSUPPORTED, /* well-formed but outside what lockstep implements (fail closed) */
    LS_E_IO,          /* open/read/write/rename/mmap failure */
    LS_E_NOMEM,       /* allocation failure */
    LS_E_DEVICE,      /* CUDA / cuBLAS / NCCL failure; a communicator's (dist/comm.h) */
    LS_E_CRYPTO,      /* OpenSSL failure */
    LS_E_INTERNAL     /* a bug in lockstep */
} ls_status;

#define LS_ERROR_MSG_BYTES 1024

typedef struct ls_error {
    ls_status status;              /* LS_OK until the first failure is recorded */
    char msg[LS_ERROR_MSG_BYTES];  /* one line, no trailing newline */
} ls_error;

/* Clears err (status LS_OK, empty message). err may be NULL. */
void ls_error_clear(ls_error *err);

/* Records a failure in err (printf-style message) and returns st, so callers
 * can write `return ls_fail(err, LS_E_INPUT, "%s: ...", path);`.
 * err may be NULL, in which case only st is returned. */
ls_status ls_fail(ls_error *err, ls_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records LS_E_NOMEM as "<what>: out of memory (N bytes asked)", where what
 * is the printf-style rest: every allocation failure says how much was asked
 * (use ls_bytes_mul for count x size, so an overflowing product reads as the
 * largest size_t rather than a small wrapped number). Returns LS_E_NOMEM. */
ls_status ls_fail_nomem(ls_error *err, size_t bytes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* a * b, or SIZE_MAX when the product overflows. */
static inline size_t ls_bytes_mul(size_t a, size_t b)
{
    return b && a > (size_t)-1 / b ? (size_t)-1 : a * b;
}

/* Prepends "prefix: " to an already recorded message (for adding context such
 * as the file being read). Returns err->status. */
ls_status ls_error_prefix(ls_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Short stable name of a status ("input", "unsupported", ...). */
const char *ls_status_name(ls_status st);

/* Exit code for a status: 0 for LS_OK, 2 for every failure (could not do the
 * job). Exit code 1 ("difference found") is decided by the command, not here. */
int ls_status_exit_code(ls_status st);

/* Propagates a failure: evaluates expr once and returns its status if not LS_OK. */
#define LS_TRY(expr)                                  \
    do {                                              \
        ls_status ls_try_status_ = (expr);            \
        if (ls_try_status_ != LS_OK) return ls_try_status_; \
    } while (0)

#endif
