/* lockstep CLI — option value parsing shared by the subcommands. */
#include <errno.h>
#include <stdlib.h>

#include "cli/cli.h"

ls_status ls_cli_parse_long(const char *opt, const char *v, long lo, long hi, long *out, ls_error *err)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return ls_fail(err, LS_E_USAGE, "%s '%s': expected an integer in %ld..%ld", opt, v, lo, hi);
    *out = x;
    return LS_OK;
}
