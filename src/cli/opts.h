/* lockstep CLI — option parsing shared by every subcommand: getopt_long with
 * lockstep's conventions, so `--opt value`, `--opt=value`, `-o value`,
 * `-ovalue`, unambiguous prefixes (`--check`) and `--` work the same in every
 * command, and every bad option gives the same one-line message and exit 2.
 *
 * A command lists its options once and loops:
 *
 *     enum { OPT_JSON = LS_CLI_LONG, OPT_THREADS };
 *     static const ls_cli_opt opts[] = {
 *         {"json", OPT_JSON, 1},      // --json FILE | --json=FILE
 *         {"output", 'o', 1},         // -o FILE | --output FILE | --output=FILE
 *         {"threads", OPT_THREADS, 1},
 *         {"force", 'f', 0},          // a flag: -f | --force
 *         {NULL, 0, 0},
 *     };
 *     ls_cli_args a = {.cmd = "run", .usage = usage_text, .opts = opts, .argc = argc, .argv = argv};
 *     for (int c; (c = ls_cli_next(&a)) != LS_CLI_END;) {
 *         switch (c) {
 *         case LS_CLI_EXIT: return a.exit_code;       // after --help (0) or a bad option (2)
 *         case OPT_JSON: json = a.arg; break;
 *         case LS_CLI_OPERAND: path = a.arg; break;   // positional, in command-line order
 *         ...
 *         }
 *     }
 *
 * -h/--help is built in when .usage is set: the usage text goes to stdout and
 * ls_cli_next returns LS_CLI_EXIT with exit_code 0. Unknown, ambiguous or
 * value-less options print "lockstep CMD: unknown option '--x' (see 'lockstep
 * CMD --help')" on stderr and return LS_CLI_EXIT with exit_code 2.
 *
 * Options and positional arguments may be interleaved (`compare A --json r.json
 * B`); operands come back in command-line order whatever POSIXLY_CORRECT says,
 * and everything after `--` is an operand. With .stop_at_operand (lockstep's
 * global options) parsing stops at the first operand instead: LS_CLI_END is
 * returned and .index names it.
 *
 * getopt keeps global state; ls_cli_next resets it (optind = 0, which glibc
 * documents as "reinitialise", so the ordering mode of the previous parse does
 * not leak into the next) the first time it is called for an ls_cli_args, so
 * commands may parse one after another (main, then the subcommand). */
#ifndef LS_CLI_OPTS_H
#define LS_CLI_OPTS_H

#include <getopt.h>

#include "core/status.h"

enum {
    LS_CLI_END = -1,      /* every argument has been returned */
    LS_CLI_EXIT = -2,     /* stop now and return .exit_code (0 after --help, 2 after a bad option) */
    LS_CLI_OPERAND = 1,   /* a positional argument, in .arg */
    LS_CLI_LONG = 256,    /* first key for options that have no one-letter form */
};

/* One option of a command. */
typedef struct ls_cli_opt {
    const char *name;     /* long name without the dashes, e.g. "checkpoint" */
    int key;              /* returned by ls_cli_next; a letter (not 'h') also gives -L;
                           * long-only options use keys >= LS_CLI_LONG */
    int takes_value;      /* 1: needs a value (--name V, --name=V, -L V, -LV); 0: a flag */
} ls_cli_opt;

#define LS_CLI_MAX_OPTS 48 /* per command, -h/--help not counted */

/* The parse of one command line. Set the public fields (designated
 * initialiser, the rest zero), then call ls_cli_next until LS_CLI_END. */
typedef struct ls_cli_args {
    /* set by the caller */
    const char *cmd;              /* command named in messages ("compare"); NULL for lockstep itself */
    const char *usage;            /* printed on stdout by -h/--help; NULL: no built-in help */
    const ls_cli_opt *opts;       /* ends with {NULL, 0, 0}; borrowed */
    int argc;
    char **argv;                  /* argv[0] (the command's name) is skipped; borrowed */
    int stop_at_operand;          /* 1: stop at the first operand (see above) */
    /* filled by ls_cli_next */
    const char *arg;              /* the value of the option just returned, or the operand; NULL for a flag */
    const char *opt;              /* the option just returned as "--name" or "-L" (for messages) */
    int exit_code;                /* with LS_CLI_EXIT */
    int index;                    /* with LS_CLI_END and stop_at_operand: argv index of the first operand */
    /* private */
    int state_;
    char opt_buf_[80];
    char optstring_[3 * LS_CLI_MAX_OPTS + 8];
    struct option longopts_[LS_CLI_MAX_OPTS + 2];
} ls_cli_args;

/* Returns the key of the next option (its value in .arg), LS_CLI_OPERAND,
 * LS_CLI_END, or LS_CLI_EXIT (help printed or error reported). */
int ls_cli_next(ls_cli_args *a);

/* Reports a usage error on stderr as one line, "lockstep CMD: MESSAGE (see
 * 'lockstep CMD --help')", and returns the exit code 2. cmd may be NULL. */
int ls_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
