/* lockstep ablate — which operator families drift when their order changes
 * (run/ablate.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/util.h"
#include "run/ablate.h"
#include "run/run.h"

static const char usage_text[] =
    "usage: lockstep ablate --checkpoint DIR --prompts FILE --max-new-tokens N [options]\n"
    "\n"
    "Runs the strict run once and once more as a control (it must be bitwise equal),\n"
    "then, for each operator family (norm, conv, gdn, attention, router, experts,\n"
    "combine, lm_head) and each chosen decoder layer where the family exists, the\n"
    "same run with that family's reduction order changed in that layer, and compares\n"
    "each with the strict run: does it drift, where first (sequence, position, trace\n"
    "layer, what differed), max / p50 / p99 |d logprob| over the positions whose\n"
    "context is still the same, and whether (and after how many tokens) greedy\n"
    "decoding picks another token.\n"
    "\n"
    "What replaces a family's strict order is --perturb's (docs/numerics.md section\n"
    "7): on the cpu backend the planted reversed order; on cuda the family's fast\n"
    "twin, what a serving engine runs in its place (attention split over the keys by\n"
    "the call's size, gdn chunked from each call's start, combine by atomic adds on\n"
    "the tc tier; docs/ablate.md). A family the backend has no such change for is\n"
    "reported as not ablatable on that backend.\n"
    "\n"
    "options:\n"
    "  --checkpoint DIR          the checkpoint (required; or synth:PRESET,seed=N,..., as for run)\n"
    "  --prompts FILE            JSONL, one {\"id\": N, \"tokens\": [...]} per line (required)\n"
    "  --max-new-tokens N        tokens generated per prompt, greedy (required)\n"
    "  --mode rollout|replay     compare rollouts (default), or replays of the strict\n"
    "                            rollout's sequences, teacher-forced and whole\n"
    "  --layers sample|all|L,... decoder layers to ablate each family in (default sample:\n"
    "                            the first, middle and last layer where the family\n"
    "                            exists; all: every one; a list: those where it exists).\n"
    "                            lm_head is ablated once whatever the choice\n"
    "  --backend cpu|cuda        operator backend (default cpu)\n"
    "  --gpu N                   --backend cuda only: the CUDA device (default 0)\n"
    "  --tier portable|tc        --backend cuda only: the strict run's tier (default\n"
    "                            portable; tc also ablates the combine)\n"
    "  --threads N               CPU worker threads (default 1)\n"
    "  --fp8 dequant|w8a8        FP8 checkpoints only: as for run\n"
    "  --json FILE|-             JSON report (schema docs/ablate-json.schema.json; identical\n"
    "                            between runs except the wall times)\n"
    "  --markdown FILE|-         Markdown report (the per-family summary and the matrix)\n"
    "  --checkpoint-cache use|off|refresh  as for run\n"
    "  --workdir DIR             keep every trace in DIR (default: a temporary directory,\n"
    "                            each ablated trace removed once compared)\n"
    "\n"
    "Progress goes to stderr, one line per run; the matrix to stdout (not with --quiet).\n"
    "A run costs about as much as `lockstep run`: 2 + one per ablated layer and family\n"
    "(replay: one more, the rollout it recomputes).\n"
    "\n"
    "exit status: 0 report written (families drifting is the expected finding), 1 the\n"
    "control drifted (the strict run is not deterministic; the report is still written),\n"
    "2 could not run (usage, bad input, no GPU, I/O)\n";

/* The command line for the reports: "lockstep ablate ARG...", an argument
 * holding a space or a quote single-quoted. */
static char *command_line(int argc, char **argv)
{
    size_t n = 32;
    for (int i = 1; i < argc; i++) n += 4 * strlen(argv[i]) + 3;
    char *s = malloc(n), *p = s;
    if (!s) return NULL;
    p += sprintf(p, "lockstep ablate");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int quote = a[0] == '\0' || strpbrk(a, " \t'\"$\\`*?") != NULL;
        *p++ = ' ';
        if (!quote) {
            p += sprintf(p, "%s", a);
            continue;
        }
        *p++ = '\'';
        for (; *a; a++) {
            if (*a == '\'') p += sprintf(p, "'\\''");
            else *p++ = *a;
        }
        *p++ = '\'';
    }
    *p = '\0';
    return s;
}

int ls_cmd_ablate(int argc, char **argv)
{
    ls_ablate_opts o;
    memset(&o, 0, sizeof o);
    o.backend = "cpu";
    o.threads = 1;
    const char *json = NULL, *markdown = NULL;
    int given_gpu = 0, given_max_new = 0, given_tier = 0;
    long v;
    ls_error err;
    ls_error_clear(&err);
    ls_status st = LS_OK;
    enum { O_CK = LS_CLI_LONG, O_PROMPTS, O_MAXNEW, O_MODE, O_LAYERS, O_BACKEND, O_GPU, O_TIER, O_THREADS,
           O_FP8, O_JSON, O_MD, O_CACHE, O_WORKDIR };
    static const ls_cli_opt opts[] = {
        {"checkpoint", O_CK, 1}, {"prompts", O_PROMPTS, 1}, {"max-new-tokens", O_MAXNEW, 1},
        {"mode", O_MODE, 1}, {"layers", O_LAYERS, 1}, {"backend", O_BACKEND, 1}, {"gpu", O_GPU, 1},
        {"tier", O_TIER, 1},
        {"threads", O_THREADS, 1}, {"fp8", O_FP8, 1}, {"json", O_JSON, 1}, {"markdown", O_MD, 1},
        {"checkpoint-cache", O_CACHE, 1}, {"workdir", O_WORKDIR, 1}, {NULL, 0, 0}};
    ls_cli_args ca = {.cmd = "ablate", .usage = usage_text, .opts = opts, .argc = argc, .argv = argv};
    for (int c; st == LS_OK && (c = ls_cli_next(&ca)) != LS_CLI_END;) {
        const char *x = ca.arg;
        switch (c) {
        case LS_CLI_EXIT: return ca.exit_code;
        case LS_CLI_OPERAND: st = ls_fail(&err, LS_E_USAGE, "unexpected argument: %s", x); break;
        case O_CK: o.checkpoint = x; break;
        case O_PROMPTS: o.prompts = x; break;
        case O_MAXNEW:
            given_max_new = 1;
            st = ls_cli_parse_long(ca.opt, x, 1, 1L << 24, &o.max_new, &err);
            break;
        case O_MODE:
            o.mode = x;
            if (strcmp(x, "rollout") && strcmp(x, "replay"))
                st = ls_fail(&err, LS_E_USAGE, "--mode '%s': expected rollout or replay", x);
            break;
        case O_LAYERS:
            o.layers = x;
            st = ls_ablate_layers_check(x, &err);
            break;
        case O_BACKEND: o.backend = x; break;
        case O_GPU:
            given_gpu = 1;
            st = ls_cli_parse_gpu(ca.opt, x, &o.gpu, &err);
            break;
        case O_TIER:
            given_tier = 1;
            st = ls_run_parse_tier("--tier", x, &o.tier, &err);
            if (st == LS_OK && o.tier == LS_TIER_FAST)
                st = ls_fail(&err, LS_E_USAGE, "--tier fast: the strict run's tier is portable or tc");
            break;
        case O_THREADS:
            st = ls_cli_parse_long(ca.opt, x, 1, 1024, &v, &err);
            o.threads = (int)v;
            break;
        case O_FP8:
            o.fp8 = x;
            if (strcmp(x, "dequant") && strcmp(x, "w8a8"))
                st = ls_fail(&err, LS_E_USAGE, "--fp8 '%s': expected dequant or w8a8", x);
            break;
        case O_JSON: json = x; break;
        case O_MD: markdown = x; break;
        case O_CACHE: st = ls_run_parse_hash_cache(x, &o.hash_cache, &err); break;
        case O_WORKDIR: o.workdir = x; break;
        }
    }
    if (st == LS_OK && (!o.checkpoint || !o.prompts || !given_max_new))
        st = ls_fail(&err, LS_E_USAGE, "--checkpoint DIR, --prompts FILE and --max-new-tokens N are required");
    if (st == LS_OK && strcmp(o.backend, "cpu") && strcmp(o.backend, "cuda"))
        st = ls_fail(&err, LS_E_USAGE, "--backend '%s': expected cpu or cuda", o.backend);
    if (st == LS_OK) st = ls_cli_check_gpu(o.backend, given_gpu, &err);
    if (st == LS_OK && given_tier && strcmp(o.backend, "cuda"))
        st = ls_fail(&err, LS_E_USAGE, "--tier applies to --backend cuda");
    if (st == LS_OK && json && markdown && strcmp(json, "-") == 0 && strcmp(markdown, "-") == 0)
        st = ls_fail(&err, LS_E_USAGE, "--json - and --markdown - cannot both go to stdout");
    /* a report path that cannot be written is refused before the runs */
    if (st == LS_OK && json && strcmp(json, "-")) st = ls_output_path_check(json, &err);
    if (st == LS_OK && markdown && strcmp(markdown, "-")) st = ls_output_path_check(markdown, &err);
    if (st != LS_OK) return ls_cli_report("ablate", &err);

    ls_run_batch b;
    st = ls_run_load_prompts(o.prompts, 0, &b, &err);
    if (st != LS_OK) return ls_cli_report("ablate", &err);
    char *cmd = command_line(argc, argv);
    o.command = cmd;
    o.progress = !ls_log_quiet();
    ls_ablate_result r;
    st = ls_ablate_run(&o, &b, &r, &err);
    int to_stdout = (json && !strcmp(json, "-")) || (markdown && !strcmp(markdown, "-"));
    if (st == LS_OK && !ls_log_quiet() && !to_stdout) ls_ablate_print(stdout, &o, &r);
    if (st == LS_OK && json) st = ls_ablate_write_json(json, &o, &r, &err);
    if (st == LS_OK && markdown) st = ls_ablate_write_markdown(markdown, &o, &r, &err);
    int control_equal = r.control.outcome == LS_ABLATE_NO_DRIFT;
    ls_ablate_result_free(&r);
    ls_run_batch_free(&b);
    free(cmd);
    if (st != LS_OK) return ls_cli_report("ablate", &err);
    if (!control_equal) {
        fprintf(stderr, "lockstep ablate: the control (the strict run again) drifted: the strict run is not "
                        "deterministic here\n");
        return 1;
    }
    return 0;
}
