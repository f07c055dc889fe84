/* lockstep — JUnit XML report: one testsuite per comparison, one testcase per
 * sequence; a failing sequence carries its first drift as the failure. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/util.h"
#include "report/report.h"
#include "report/report_internal.h"

void ls_report_xml_escape(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if ((unsigned char)*s < 0x20 && *s != '\n' && *s != '\t') fputc('?', f);
            else fputc(*s, f);
        }
    }
}

static void prop(FILE *f, const char *name, const char *value)
{
    fprintf(f, "      <property name=\"%s\" value=\"", name);
    ls_report_xml_escape(f, value);
    fputs("\"/>\n", f);
}

ls_status ls_report_write_junit(const char *path, const ls_compare_result *r, ls_error *err)
{
    ls_outfile o;
    LS_TRY(ls_outfile_open(&o, path, err));
    FILE *f = o.fp;
    size_t fails = 0;
    for (size_t i = 0; i < r->n_seqs; i++) fails += !r->seqs[i].pass;
    double secs = (double)r->elapsed_ns / 1e9;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<testsuites name=\"lockstep compare\" tests=\"%zu\" failures=\"%zu\" errors=\"0\" time=\"%.3f\">\n",
            r->n_seqs, fails, secs);
    fputs("  <testsuite name=\"", f);
    ls_report_xml_escape(f, r->a.path);
    fputs(" vs ", f);
    ls_report_xml_escape(f, r->b.path);
    fprintf(f, "\" tests=\"%zu\" failures=\"%zu\" errors=\"0\" skipped=\"0\" time=\"%.3f\">\n", r->n_seqs, fails, secs);
    fputs("    <properties>\n", f);
    prop(f, "model_fingerprint_a", r->a.model_fingerprint);
    prop(f, "model_fingerprint_b", r->b.model_fingerprint);
    prop(f, "manifest_digest_a", r->a.manifest_digest);
    prop(f, "manifest_digest_b", r->b.manifest_digest);
    prop(f, "mode_a", r->a.mode);
    prop(f, "mode_b", r->b.mode);
    prop(f, "engine_a", r->a.engine);
    prop(f, "engine_b", r->b.engine);
    prop(f, "activation_dtype_a", r->a.activation_dtype);
    prop(f, "activation_dtype_b", r->b.activation_dtype);
    for (int i = 0; i < r->n_param_diffs; i++) {
        char name[64];
        snprintf(name, sizeof name, "run_params.%s_a", r->param_diffs[i].key);
        prop(f, name, r->param_diffs[i].a);
        snprintf(name, sizeof name, "run_params.%s_b", r->param_diffs[i].key);
        prop(f, name, r->param_diffs[i].b);
    }
    if (r->note[0]) prop(f, "note", r->note);
    fputs("    </properties>\n", f);
    for (size_t i = 0; i < r->n_seqs; i++) {
        const ls_compare_seq *s = &r->seqs[i];
        fprintf(f, "    <testcase classname=\"lockstep.compare\" name=\"seq %u\" time=\"0\"", s->seq);
        if (s->pass) {
            fputs("/>\n", f);
            continue;
        }
        fputs(">\n      <failure type=\"drift\" message=\"first drift: ", f);
        ls_report_xml_escape(f, s->first.message);
        fputs("\">", f);
        char line[1024];
        fprintf(f, "positions compared %" PRIu64 ", tokens equal %" PRIu64 ", top-k sets equal %" PRIu64
                   ", max |d logprob| %.6g\n", s->positions_compared, s->tokens_equal, s->topk_set_equal,
                s->max_abs_dlogprob);
        ls_report_tensor_line(&s->first.tensor, line, sizeof line);
        if (line[0]) {
            ls_report_xml_escape(f, line);
            fputc('\n', f);
        }
        fputs("</failure>\n    </testcase>\n", f);
    }
    fputs("  </testsuite>\n</testsuites>\n", f);
    return ls_outfile_commit(&o, err);
}
