/* lockstep — command-line entry point: dispatches to subcommands. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/build_info.h"
#include "core/util.h"
#include "fingerprint/sha256.h"

typedef struct ls_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} ls_command;

static const ls_command commands[] = {
#define LS_COMMAND(name, fn, summary) {name, fn, summary},
#include "cli/commands.def"
#undef LS_COMMAND
};

static void usage(FILE *out)
{
    fprintf(out,
            "lockstep %s — deterministic train-rollout consistency verifier\n\n"
            "usage: lockstep [-q|--quiet] [-v|--verbose] [--color=WHEN] <command> [options]\n\n"
            "commands:\n",
            LS_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(out,
            "\n"
            "options (before the command):\n"
            "  -q, --quiet       like cmp -s: nothing on stdout and no progress, information\n"
            "                    or warnings on stderr; the exit code alone gives the result.\n"
            "                    Output asked for by name is still written (--json, --junit,\n"
            "                    --html, -o, also to '-'), and an error that ends the command\n"
            "                    with exit code 2 still prints its one line on stderr.\n"
            "                    --help and version print as usual\n"
            "  -v, --verbose     more detail (e.g. every manifest difference)\n"
            "  --color=WHEN      colour the text output: auto (default: only on a terminal,\n"
            "                    when NO_COLOR is unset or empty and TERM is not dumb),\n"
            "                    always or never\n"
            "  -h, --help        this text;  --version  the version and build identity\n"
            "\n"
            "Options take their value as '--opt VALUE' or '--opt=VALUE'. On a terminal long\n"
            "work draws a progress bar on stderr; otherwise work that lasts longer than 5 s\n"
            "writes a plain progress line every 5 s and one at the end\n"
            "(LOCKSTEP_PROGRESS_SECONDS=N changes the interval; 0: every update).\n"
            "The CPU's hot loops run an AVX2 or AVX-512 build of themselves where the CPU\n"
            "has it (the same bits); LOCKSTEP_CPU_ISA=baseline keeps them to the baseline one.\n"
            "'lockstep <command> --help' describes a command.\n"
            "exit codes: 0 ok / equal, 1 difference found, 2 could not do the job\n");
}

int ls_cli_is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

int ls_cli_report(const char *cmd, const ls_error *err)
{
    char msg[sizeof err->msg + 256];
    ls_cli_flag_names(err->msg[0] ? err->msg : ls_status_name(err->status), msg, sizeof msg);
    const char *sep = cmd ? " " : "";
    if (!cmd) cmd = "";
    /* Formatted on the stack and written with write(2): when memory ran out,
     * stdio may fail to allocate and the one line that says why would be lost. */
    char line[sizeof msg + 128];
    int n = err->status == LS_E_USAGE
                ? snprintf(line, sizeof line, "lockstep%s%s: %s (see 'lockstep%s%s --help')\n", sep, cmd, msg,
                           sep, cmd)
                : snprintf(line, sizeof line, "lockstep%s%s: %s\n", sep, cmd, msg);
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    fflush(stderr);
    for (int off = 0; n > 0 && off < n;) {
        ssize_t k = write(2, line + off, (size_t)(n - off));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        off += (int)k;
    }
    return ls_status_exit_code(err->status == LS_OK ? LS_E_INTERNAL : err->status);
}

int ls_cmd_version(int argc, char **argv)
{
    static const ls_cli_opt opts[] = {{NULL, 0, 0}};
    ls_cli_args a = {.cmd = "version", .usage = "usage: lockstep version\n\n"
                     "Prints the version, the source revision, the compiler and flags, and the CUDA\n"
                     "compiler (or 'cuda not built'). Printed under --quiet too, as --help is.\n",
                     .opts = opts, .argc = argc, .argv = argv};
    for (int c; argc > 0 && (c = ls_cli_next(&a)) != LS_CLI_END;) {
        if (c == LS_CLI_EXIT) return a.exit_code;
        return ls_cli_usage_error("version", "unexpected argument '%s'", a.arg);
    }
    printf("lockstep %s\nsource %s\ncompiler %s\nflags %s\n", LS_VERSION, LS_SOURCE_REVISION,
           LS_C_COMPILER, LS_C_FLAGS_STRING);
#ifdef LOCKSTEP_HAVE_CUDA
    printf("cuda %s\n", LS_CUDA_COMPILER);
#else
    printf("cuda not built\n");
#endif
    return 0;
}

/* Parses lockstep's own options and runs the command; returns its exit code. */
static int dispatch(int argc, char **argv)
{
    enum { OPT_VERSION = LS_CLI_LONG, OPT_COLOR };
    static const ls_cli_opt opts[] = {
        {"quiet", 'q', 0},
        {"verbose", 'v', 0},
        {"help", 'h', 0},
        {"version", OPT_VERSION, 0},
        {"color", OPT_COLOR, 1},
        {NULL, 0, 0},
    };
    /* Global options end at the command's name; what follows is the command's. */
    ls_cli_args a = {.cmd = NULL, .opts = opts, .argc = argc, .argv = argv, .stop_at_operand = 1};
    for (int c; (c = ls_cli_next(&a)) != LS_CLI_END;) {
        switch (c) {
        case LS_CLI_EXIT: return a.exit_code;
        case 'q': ls_log_level = 0; break;
        case 'v': ls_log_level = 2; break;
        case 'h': usage(stdout); return 0;
        case OPT_VERSION: return ls_cmd_version(0, NULL);
        case OPT_COLOR:
            if (ls_color_parse(a.arg, &ls_color_setting) != 0)
                return ls_cli_usage_error(NULL, "--color '%s': expected auto, always or never", a.arg);
            break;
        }
    }
    if (a.index >= argc) {
        if (ls_log_quiet()) return ls_cli_usage_error(NULL, "a command is required");
        usage(stderr);
        return 2;
    }
    const char *name = argv[a.index];
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++)
        if (strcmp(name, commands[c].name) == 0) return commands[c].fn(argc - a.index, argv + a.index);
    return ls_cli_usage_error(NULL, "unknown command '%s'", name);
}

int main(int argc, char **argv)
{
    /* Temporary outputs are removed on SIGTERM/SIGINT/SIGHUP/SIGPIPE, and the
     * file size limit is a write error, not a silent death (core/util.h). */
    ls_signals_install();
    ls_error err;
    ls_error_clear(&err);
    if (ls_sha256_prepare(&err) != LS_OK) return ls_cli_report(NULL, &err);
    int rc = dispatch(argc, argv);
    /* Whatever the command printed is output too: a failed write or flush of
     * stdout (full disk, /dev/full) ends with exit code 2, said once. A
     * command that already failed (2) has said why. */
    if (ls_stdout_close(&err) != LS_OK && rc != 2) rc = ls_cli_report(NULL, &err);
    return rc;
}
