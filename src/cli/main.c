/* lockstep — command-line entry point: dispatches to subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/build_info.h"
#include "core/util.h"

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
            "usage: lockstep [--quiet|--verbose] <command> [options]\n\n"
            "commands:\n",
            LS_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(out,
            "\n'lockstep <command> --help' describes a command.\n"
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
    fprintf(stderr, "lockstep %s: %s\n", cmd, msg);
    if (err->status == LS_E_USAGE) fprintf(stderr, "(see 'lockstep %s --help')\n", cmd);
    return ls_status_exit_code(err->status == LS_OK ? LS_E_INTERNAL : err->status);
}

int ls_cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("lockstep %s\nsource %s\ncompiler %s\nflags %s\n", LS_VERSION, LS_SOURCE_REVISION,
           LS_C_COMPILER, LS_C_FLAGS_STRING);
#ifdef LOCKSTEP_HAVE_CUDA
    printf("cuda %s\n", LS_CUDA_COMPILER);
#else
    printf("cuda not built\n");
#endif
    return 0;
}

int main(int argc, char **argv)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--quiet") == 0 || strcmp(argv[i], "-q") == 0)
            ls_log_level = 0;
        else if (strcmp(argv[i], "--verbose") == 0 || strcmp(argv[i], "-v") == 0)
            ls_log_level = 2;
        else if (ls_cli_is_help(argv[i])) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            return ls_cmd_version(0, NULL);
        } else {
            fprintf(stderr, "lockstep: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++)
        if (strcmp(argv[i], commands[c].name) == 0) return commands[c].fn(argc - i, argv + i);
    fprintf(stderr, "lockstep: unknown command '%s'\n", argv[i]);
    usage(stderr);
    return 2;
}
