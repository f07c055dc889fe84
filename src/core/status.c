#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void ls_error_clear(ls_error *err)
{
    if (!err) return;
    err->status = LS_OK;
    err->msg[0] = '\0';
}

ls_status ls_fail(ls_error *err, ls_status st, const char *fmt, ...)
{
    if (!err) return st;
    err->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    /* Messages are one line: fold any newline a caller's data brought in. */
    for (char *p = err->msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return st;
}

ls_status ls_fail_nomem(ls_error *err, size_t bytes, const char *fmt, ...)
{
    if (!err) return LS_E_NOMEM;
    char what[LS_ERROR_MSG_BYTES - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ls_fail(err, LS_E_NOMEM, "%s: out of memory (%zu bytes asked)", what, bytes);
}

ls_status ls_error_prefix(ls_error *err, const char *fmt, ...)
{
    if (!err) return LS_E_INTERNAL;
    char prefix[LS_ERROR_MSG_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Join by hand: snprintf("%s: %s") trips -Wformat-truncation, and
     * truncation of an over-long message is intended. */
    char joined[LS_ERROR_MSG_BYTES];
    size_t n = strlen(prefix);
    if (n > sizeof joined - 3) n = sizeof joined - 3;
    memcpy(joined, prefix, n);
    joined[n++] = ':';
    joined[n++] = ' ';
    size_t rest = strlen(err->msg);
    if (rest > sizeof joined - 1 - n) rest = sizeof joined - 1 - n;
    memcpy(joined + n, err->msg, rest);
    joined[n + rest] = '\0';
    memcpy(err->msg, joined, sizeof joined);
    return err->status;
}

const char *ls_status_name(ls_status st)
{
    switch (st) {
    case LS_OK: return "ok";
    case LS_E_USAGE: return "usage";
    case LS_E_INPUT: return "input";
    case LS_E_UNSUPPORTED: return "unsupported";
    case LS_E_IO: return "io";
    case LS_E_NOMEM: return "nomem";
    case LS_E_DEVICE: return "device";
    case LS_E_CRYPTO: return "crypto";
    case LS_E_INTERNAL: return "internal";
    }
    return "unknown";
}

int ls_status_exit_code(ls_status st)
{
    return st == LS_OK ? 0 : 2;
}
