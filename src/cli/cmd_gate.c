/* lockstep gate — the CI gate: one rollout, several replays (chunkings and a
 * reordered batch), each compared bitwise against the rollout. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "run/gate.h"
#include "run/run.h"
#include "compare/compare.h"
#include "core/util.h"
#include "report/report.h"

static const char usage_text[] =
    "usage: lockstep gate --checkpoint DIR --prompts FILE [options]\n"
    "\n"
    "Rolls the prompts out (prefill + decode), then replays the full sequences\n"
    "teacher-forced at chunk 1, 3, 64 and whole-sequence, and once more with the\n"
    "batch packed in reverse order, and compares each replay with the rollout\n"
    "bitwise (tokens, top-5 ids/order/logprob bits, selected logprob bits, every\n"
    "per-layer digest). Prints one row per replay: positions, exact tokens, top-5\n"
    "set equality, max |d logprob|, PASS/FAIL; then the first drift of a failure.\n"
    "\n"
    "options:\n"
    "  --max-new-tokens N     tokens generated per prompt (default 16)\n"
    "  --backend cpu|cuda     operator backend (default cpu)\n"
    "  --threads N            CPU worker threads (default 1)\n"
    "  --junit FILE           JUnit XML: one testsuite per replay, holding one testcase (that\n"
    "                         replay vs the rollout; a failure carries its first drift)\n"
    "  --json FILE            JSON summary (per replay: verdict, counts, first drift)\n"
    "  --workdir DIR          keep the traces and per-replay compare reports in DIR\n"
    "                         (default: a temporary directory, removed afterwards)\n"
    "\n"
    "exit status: 0 every replay bitwise equal to the rollout, 1 a drift, 2 could not run\n";

int ls_cmd_gate(int argc, char **argv)
{
    ls_gate_opts o;
    memset(&o, 0, sizeof o);
    o.max_new = 16;
    o.backend = "cpu";
    o.threads = 1;
    ls_error err;
    ls_error_clear(&err);
    ls_status st = LS_OK;
    long v;
    for (int i = 1; st == LS_OK && i < argc; i++) {
        const char *a = argv[i];
        if (ls_cli_is_help(a)) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (a[0] != '-' || i + 1 >= argc) {
            st = ls_fail(&err, LS_E_USAGE, "unexpected argument or missing value: %s", a);
            break;
        }
        const char *x = argv[++i];
        if (!strcmp(a, "--checkpoint")) o.checkpoint = x;
        else if (!strcmp(a, "--prompts")) o.prompts = x;
        else if (!strcmp(a, "--max-new-tokens")) st = ls_cli_parse_long(a, x, 1, 1L << 24, &o.max_new, &err);
        else if (!strcmp(a, "--backend")) o.backend = x;
        else if (!strcmp(a, "--threads")) {
            st = ls_cli_parse_long(a, x, 1, 1024, &v, &err);
            o.threads = (int)v;
        } else if (!strcmp(a, "--junit")) o.junit = x;
        else if (!strcmp(a, "--json")) o.json = x;
        else if (!strcmp(a, "--workdir")) o.workdir = x;
        else st = ls_fail(&err, LS_E_USAGE, "unknown option: %s", a);
    }
    if (st == LS_OK && (!o.checkpoint || !o.prompts))
        st = ls_fail(&err, LS_E_USAGE, "--checkpoint DIR and --prompts FILE are required");
    if (st == LS_OK && strcmp(o.backend, "cpu") && strcmp(o.backend, "cuda"))
        st = ls_fail(&err, LS_E_USAGE, "--backend '%s': expected cpu or cuda", o.backend);
    if (st != LS_OK) return ls_cli_report("gate", &err);
    ls_run_batch b;
    st = ls_run_load_prompts(o.prompts, 0, &b, &err);
    if (st != LS_OK) return ls_cli_report("gate", &err);
    ls_gate_result r;
    st = ls_gate_run(&o, &b, stdout, &r, &err);
    ls_run_batch_free(&b);
    if (st != LS_OK) return ls_cli_report("gate", &err);
    return r.all_equal ? 0 : 1;
}
