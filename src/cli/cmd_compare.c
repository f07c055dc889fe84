/* lockstep compare A B — bitwise comparison of two traces. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "compare/compare.h"
#include "core/util.h"
#include "report/report.h"
#include "trace/trace.h"

static const char usage_text[] =
    "usage: lockstep compare A.trace B.trace [options]\n"
    "\n"
    "Aligns two traces by (sequence, position) and compares them bitwise: input\n"
    "tokens, every per-layer digest both traces carry (layers in order), the\n"
    "selected next token and its logprob bits, and the top-k ids, order and\n"
    "logprob bits. Prints, per sequence, positions compared, token and top-k set\n"
    "equality, max |d logprob| and PASS/FAIL, then the first drift of each failing\n"
    "sequence (position, layer, family, digest kind; element-level detail where\n"
    "both traces dumped the tensor). |d logprob| and KL are diagnostics only: the\n"
    "verdict is bitwise. Trace A is walked in its execution order; B is indexed,\n"
    "so the two may be framed differently (rollout vs chunked replay). An imported\n"
    "trace ('lockstep import') holds the positions its engine scored: against a\n"
    "rollout, a replay or another engine's import, the positions both hold are\n"
    "compared and the other trace's earlier (prompt) positions are counted as not\n"
    "compared, not as drifts.\n"
    "\n"
    "options:\n"
    "  --json FILE|-              write the JSON report (docs/compare-json.schema.json)\n"
    "  --junit FILE               write a JUnit XML report (one testcase per sequence)\n"
    "  --html FILE                write a self-contained HTML page: every sequence in an overview,\n"
    "                             failing ones in full (layers x positions heat map, |d logprob|)\n"
    "  --github                   GitHub Actions: an ::error annotation per failing sequence (on\n"
    "                             stdout, or stderr when a report goes there) and a Markdown step\n"
    "                             summary appended to $GITHUB_STEP_SUMMARY when it is set\n"
    "  --allow-different-model    compare traces whose model fingerprints differ\n"
    "  --allow-incomplete         compare traces without a trailer (killed runs)\n"
    "  --heatmap-cols N           heat-map columns per sequence (default 256)\n"
    "  --logprobs-only            compare token ids and selected-token logprob bits only\n"
    "                             (no digests, no top-k: engines that return no top-k)\n"
    "  --stats                    drift statistics in every report: |d logprob| mean/p50/p99/max\n"
    "                             per sequence and overall, token agreement, top-k overlap, KL\n"
    "                             over the top-k, the completion's mean |old - rollout logprob|,\n"
    "                             and per layer the digests that differ and, where both traces\n"
    "                             dumped a layer, max |d|, relative error and cosine similarity;\n"
    "                             the verdict and exit status stay bitwise\n"
    "  --no-color                 never colour the text report (as 'lockstep --color=never')\n"
    "\n"
    "\n"
    "The text report goes to stdout (to stderr when a report is written to '-');\n"
    "'lockstep --quiet compare' writes none and only the asked-for reports.\n"
    "exit status: 0 bitwise equal, 1 drift found, 2 could not compare\n";

int ls_cmd_compare(int argc, char **argv)
{
    enum { OPT_JSON = LS_CLI_LONG, OPT_JUNIT, OPT_HTML, OPT_DIFFERENT_MODEL, OPT_INCOMPLETE, OPT_HEATMAP_COLS, OPT_NO_COLOR,
           OPT_LOGPROBS_ONLY, OPT_STATS, OPT_GITHUB };
    static const ls_cli_opt opts[] = {
        {"json", OPT_JSON, 1},
        {"junit", OPT_JUNIT, 1},
        {"html", OPT_HTML, 1},
        {"allow-different-model", OPT_DIFFERENT_MODEL, 0},
        {"allow-incomplete", OPT_INCOMPLETE, 0},
        {"heatmap-cols", OPT_HEATMAP_COLS, 1},
        {"no-color", OPT_NO_COLOR, 0},
        {"logprobs-only", OPT_LOGPROBS_ONLY, 0},
        {"stats", OPT_STATS, 0},
        {"github", OPT_GITHUB, 0},
        {NULL, 0, 0},
    };
    const char *paths[2] = {NULL, NULL}, *json = NULL, *junit = NULL, *html = NULL;
    int n_paths = 0, no_color = 0, github = 0;
    ls_compare_opts opts_c = {0};
    ls_compare_diag diag = {0};
    ls_cli_args a = {.cmd = "compare", .usage = usage_text, .opts = opts, .argc = argc, .argv = argv};
    for (int c; (c = ls_cli_next(&a)) != LS_CLI_END;) {
        switch (c) {
        case LS_CLI_EXIT: return a.exit_code;
        case OPT_DIFFERENT_MODEL: opts_c.allow_different_model = 1; break;
        case OPT_INCOMPLETE: opts_c.allow_incomplete = 1; break;
        case OPT_NO_COLOR: no_color = 1; break;
        case OPT_LOGPROBS_ONLY: diag.logprobs_only = 1; break;
        case OPT_STATS: diag.stats = 1; break;
        case OPT_GITHUB: github = 1; break;
        case OPT_JSON: json = a.arg; break;
        case OPT_JUNIT: junit = a.arg; break;
        case OPT_HTML: html = a.arg; break;
        case OPT_HEATMAP_COLS:
            if ((opts_c.heatmap_max_cols = atoi(a.arg)) < 1 || opts_c.heatmap_max_cols > 4096)
                return ls_cli_usage_error("compare", "--heatmap-cols must be 1..4096");
            break;
        case LS_CLI_OPERAND:
            if (n_paths == 2) return ls_cli_usage_error("compare", "expected two trace files");
            paths[n_paths++] = a.arg;
            break;
        }
    }
    if (n_paths != 2) return ls_cli_usage_error("compare", "expected two trace files");
    ls_error err;
    ls_error_clear(&err);
    /* report paths that cannot be written are refused before the comparison */
    const char *reports[] = {json, junit, html};
    for (int i = 0; i < 3; i++)
        if (reports[i] && strcmp(reports[i], "-") && ls_output_path_check(reports[i], &err) != LS_OK)
            return ls_cli_report("compare", &err);
    ls_compare_result r;
    ls_status st = ls_compare_files_diag(paths[0], paths[1], &opts_c, &diag, &r, &err);
    if (st) {
        ls_compare_result_free(&r);
        return ls_cli_report("compare", &err);
    }
    /* the comparator's note names option fields; the user typed flags */
    char note[sizeof r.note];
    ls_cli_flag_names(r.note, note, sizeof note);
    snprintf(r.note, sizeof r.note, "%s", note);
    /* The text report goes to stdout unless a report was asked for there;
     * under --quiet it is not written at all (the exit code is the verdict). */
    int stdout_taken = (json && !strcmp(json, "-")) || (junit && !strcmp(junit, "-")) || (html && !strcmp(html, "-"));
    FILE *text = stdout_taken ? stderr : stdout;
    if (!ls_log_quiet()) {
        ls_report_write_text(text, &r, !no_color && ls_color_enabled(text));
    }
    if (!st && json) st = ls_report_write_json(json, &r, &err);
    if (!st && junit) st = ls_report_write_junit(junit, &r, &err);
    if (!st && html) st = ls_report_write_html(html, &r, &err);
    if (!st && github) {
        /* annotations are read from the step's output, whatever --quiet says */
        ls_report_write_github_annotations(stdout_taken ? stderr : stdout, &r);
        const char *summary = getenv("GITHUB_STEP_SUMMARY");
        if (summary && summary[0]) st = ls_report_write_github_summary(summary, &r, &err);
    }
    int equal = r.equal;
    ls_compare_result_free(&r);
    if (st) return ls_cli_report("compare", &err);
    return equal ? 0 : 1;
}
