/* lockstep — GitHub Actions output: workflow-command annotations (one
 * ::error per failing sequence, so the drift shows on the run's page) and a
 * Markdown step summary. JUnit (report_junit.c) stays the format for GitLab
 * and Jenkins. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "report/report.h"

/* GitHub shows at most 10 error annotations per step. */
#define MAX_ANNOTATIONS 10
/* Passing sequences listed in the summary's table before the rest are only counted. */
#define MAX_PASSING_ROWS 50

/* Workflow-command escaping: data escape %, CR and LF; property values
 * also ':' and ','. */
static void gh_escape(FILE *f, const char *s, int property)
{
    for (; *s; s++) {
        switch (*s) {
        case '%': fputs("%25", f); break;
        case '\r': fputs("%0D", f); break;
        case '\n': fputs("%0A", f); break;
        case ':': fputs(property ? "%3A" : ":", f); break;
        case ',': fputs(property ? "%2C" : ",", f); break;
        default: fputc(*s, f);
        }
    }
}

/* A Markdown table cell: '|' escaped, line breaks and control characters as spaces. */
static void md_cell(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '|') fputs("\\|", f);
        else if ((unsigned char)*s < 0x20) fputc(' ', f);
        else fputc(*s, f);
    }
}

void ls_report_write_github_annotations(FILE *out, const ls_compare_result *r)
{
    size_t n_fail = 0, shown = 0;
    for (size_t i = 0; i < r->n_seqs; i++) n_fail += !r->seqs[i].pass;
    if (!n_fail) {
        fprintf(out, "::notice title=lockstep compare::PASS: %zu/%zu sequences bitwise equal\n", r->n_seqs, r->n_seqs);
        return;
    }
    /* the first drift overall first, then the other failing sequences in order */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < r->n_seqs && shown < MAX_ANNOTATIONS - (n_fail > MAX_ANNOTATIONS); i++) {
            const ls_compare_seq *s = &r->seqs[i];
            if (s->pass || (pass == 0) != ((int)i == r->first_seq)) continue;
            char title[64];
            snprintf(title, sizeof title, "lockstep compare: seq %u drifts", s->seq);
            fputs("::error title=", out);
            gh_escape(out, title, 1);
            fputs("::", out);
            gh_escape(out, s->first.message, 0);
            if (s->first_token_divergence >= 0) fprintf(out, " (tokens diverge from pos %" PRId64 ")", s->first_token_divergence);
            fputc('\n', out);
            shown++;
        }
    if (shown < n_fail)
        fprintf(out, "::error title=lockstep compare::%zu more failing sequences (%zu of %zu fail); see the step summary\n",
                n_fail - shown, n_fail, r->n_seqs);
}

static void md_stats(FILE *f, const ls_compare_result *r)
{
    const ls_compare_stats *s = &r->stats;
    fprintf(f, "\n**Drift statistics** (the verdict stays bitwise): tokens agree %" PRIu64 "/%" PRIu64
               "; |Δ logprob| mean %.4g, p50 %.4g, p99 %.4g, max %.4g; completion mean \\|old_log_probs − rollout_log_probs\\| "
               "%.4g over %" PRIu64 " positions; top-%d overlap mean %.4g; KL(top-k) mean %.4g, max %.4g\n",
            s->tokens_agree, s->steps, s->dlogprob.mean, s->dlogprob.p50, s->dlogprob.p99, s->dlogprob.max,
            s->completion_mean_abs_dlogprob, s->completion_n, r->topk_compared, s->topk_overlap_mean, s->kl_topk.mean,
            s->kl_topk.max);
    int first = -1;
    for (int l = 0; r->layer_stats && l < r->n_layers && first < 0; l++)
        if (r->layer_stats[l].digests_differ) first = l;
    if (first >= 0)
        fprintf(f, "\nThe first layer with differing digests is layer %d (%s).\n", first,
                ls_layer_family_name(r->layers[first].family));
}

ls_status ls_report_write_github_summary(const char *path, const ls_compare_result *r, ls_error *err)
{
    /* GitHub collects a step's summary by appending to this file: it is
     * appended to, not replaced through a temporary name. */
    FILE *f = fopen(path, "a");
    if (!f) return ls_fail(err, LS_E_IO, "%s: cannot open the step summary: %s", path, strerror(errno));
    size_t n_pass = 0;
    for (size_t i = 0; i < r->n_seqs; i++) n_pass += r->seqs[i].pass;
    fprintf(f, "### lockstep compare: %s\n\n", r->equal ? "PASS" : "FAIL");
    fputs("A: `", f);
    md_cell(f, r->a.path);
    fprintf(f, "` (%s, engine ", r->a.mode);
    md_cell(f, r->a.engine);
    fputs(") · B: `", f);
    md_cell(f, r->b.path);
    fprintf(f, "` (%s, engine ", r->b.mode);
    md_cell(f, r->b.engine);
    fprintf(f, ")\n\n%zu/%zu sequences bitwise equal; compared %s, top-%d.\n", n_pass, r->n_seqs,
            r->kinds_compared ? "every digest kind both traces carry" : "tokens and logprobs (no digests)",
            r->topk_compared);
    if (r->note[0]) {
        fputs("\nNote: ", f);
        md_cell(f, r->note);
        fputc('\n', f);
    }
    fputs("\n| seq | result | positions | tokens equal | top-k sets equal | max \\|Δ logprob\\| | first drift |\n"
          "|---:|---|---:|---:|---:|---:|---|\n", f);
    size_t passing_rows = 0;
    for (size_t i = 0; i < r->n_seqs; i++) {
        const ls_compare_seq *s = &r->seqs[i];
        if (s->pass && passing_rows++ >= MAX_PASSING_ROWS) continue;
        fprintf(f, "| %u | %s | %" PRIu64 " | %" PRIu64 " | %" PRIu64 " | %.6g | ", s->seq, s->pass ? "PASS" : "**FAIL**",
                s->positions_compared, s->tokens_equal, s->topk_set_equal, s->max_abs_dlogprob);
        if (!s->pass) md_cell(f, s->first.message);
        fputs(" |\n", f);
    }
    if (passing_rows > MAX_PASSING_ROWS)
        fprintf(f, "\n%zu more passing sequences not listed.\n", passing_rows - MAX_PASSING_ROWS);
    if (r->has_stats) md_stats(f, r);
    fputc('\n', f);
    if (fclose(f) != 0) return ls_fail(err, LS_E_IO, "%s: cannot write the step summary: %s", path, strerror(errno));
    return LS_OK;
}
