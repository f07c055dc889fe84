/* lockstep CLI — shared helpers for subcommands. */
#ifndef LS_CLI_CLI_H
#define LS_CLI_CLI_H

#include <stddef.h>

#include "cli/opts.h"
#include "core/status.h"

#define LS_COMMAND(name, fn, summary) int fn(int argc, char **argv);
#include "cli/commands.def"
#undef LS_COMMAND

/* Prints "lockstep CMD: <message>" on stderr as one line (a usage error ends
 * with "(see 'lockstep CMD --help')") and returns the exit code for the
 * status (2). cmd may be NULL (lockstep's own options). */
int ls_cli_report(const char *cmd, const ls_error *err);

/* True when argv[i] is -h or --help. */
int ls_cli_is_help(const char *arg);

/* Parses a decimal option value into [lo, hi]; the error names opt. */
ls_status ls_cli_parse_long(const char *opt, const char *v, long lo, long hi, long *out, ls_error *err);

/* --kv-page N: a page of N >= 1 positions. 0 is refused: a page that holds
 * nothing is a mistake, not a request for a contiguous cache (that is the
 * default, with the option left out); the run checks the upper bound. */
ls_status ls_cli_parse_kv_page(const char *opt, const char *v, long *out, ls_error *err);
/* --afd A:F: attention and FFN ranks, each an integer >= 1 (which shapes
 * run is the run layer's to say). */
ls_status ls_cli_parse_afd(const char *opt, const char *v, int *attention, int *ffn, ls_error *err);

/* --gpu N: a CUDA device ordinal (any int: one the machine lacks is refused
 * by the run with the devices it has). */
ls_status ls_cli_parse_gpu(const char *opt, const char *v, int *out, ls_error *err);

/* Refuses --gpu with a backend other than cuda (given: --gpu was on the
 * command line, whatever its value). */
ls_status ls_cli_check_gpu(const char *backend, int given, ls_error *err);

/* Copies a library message with option field names (allow_incomplete,
 * max_rows, ...) replaced by the flags that set them. */
void ls_cli_flag_names(const char *msg, char *out, size_t out_size);

#endif
