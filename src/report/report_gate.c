/* lockstep — the gate's combined reports (JUnit XML, JSON); see report.h. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "io/json.h"
#include "report/report.h"

ls_status ls_report_write_gate_junit(const char *path, const ls_gate_result *r, ls_error *err)
{
    ls_outfile f;
    LS_TRY(ls_outfile_open(&f, path, err));
    int failures = 0;
    for (int i = 0; i < r->n_rows; i++) failures += !r->rows[i].equal && !r->rows[i].perturbed;
    fprintf(f.fp, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"lockstep gate\" tests=\"%d\" "
            "failures=\"%d\">\n", r->n_rows, failures);
    for (int i = 0; i < r->n_rows; i++) {
        const ls_gate_row *w = &r->rows[i];
        int fail = w->perturbed ? w->equal : !w->equal;
        fprintf(f.fp, "  <testsuite name=\"rollout vs replay ");
        ls_report_xml_escape(f.fp, w->name);
        fprintf(f.fp, "\" tests=\"1\" failures=\"%d\" time=\"%.3f\">\n    <testcase classname=\"lockstep.gate\" "
                "name=\"", fail, w->seconds);
        ls_report_xml_escape(f.fp, w->name);
        fprintf(f.fp, "\" time=\"%.3f\">", w->seconds);
        if (fail) {
            fputs("\n      <failure message=\"", f.fp);
            ls_report_xml_escape(f.fp, w->perturbed ? "perturbed replay was not detected" : w->first);
            fputs("\"/>\n    ", f.fp);
        }
        fprintf(f.fp, "</testcase>\n  </testsuite>\n");
    }
    fputs("</testsuites>\n", f.fp);
    return ls_outfile_commit(&f, err);
}

/* A diagnostic double, or null when it is not finite (JSON has no NaN or
 * infinity; jansson refuses them, which would drop the whole row). */
static json_t *finite_or_null(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

/* Schema: docs/gate-json.schema.json. Every field is a function of the
 * inputs except the wall-clock timings (rollout_seconds, per-replay
 * seconds), which the schema marks run-dependent. */
ls_status ls_report_write_gate_json(const char *path, const char *backend, long max_new,
                                    const ls_gate_result *r, ls_error *err)
{
    json_t *rows = json_array();
    int ok = rows != NULL;
    for (int i = 0; ok && i < r->n_rows; i++) {
        const ls_gate_row *w = &r->rows[i];
        json_t *row = json_pack("{s:s, s:b, s:b, s:I, s:I, s:I, s:I, s:o, s:f}", "replay", w->name, "perturbed",
                                w->perturbed, "equal", w->equal, "positions", (json_int_t)w->positions,
                                "positions_total", (json_int_t)w->positions_total, "tokens_equal",
                                (json_int_t)w->tokens_equal, "topk_sets_equal", (json_int_t)w->topk_equal,
                                "max_abs_dlogprob", finite_or_null(w->max_dlogprob), "seconds", w->seconds);
        if (!row) {
            ok = 0;
            break;
        }
        if (w->has_drift) {
            int in_layer = w->layer >= 0;
            json_t *d = json_pack("{s:s, s:I, s:I, s:i, s:s, s:i}", "message", w->first, "seq",
                                  (json_int_t)w->seq, "pos", (json_int_t)w->pos, "layer",
                                  in_layer ? w->layer : -1, "family",
                                  in_layer ? ls_layer_family_name(w->family) : "", "decoder_layer",
                                  in_layer ? w->decoder_layer : -1);
            ok = d && json_object_set_new(row, "first_drift", d) == 0;
        }
        if (json_array_append_new(rows, row) != 0) ok = 0; /* steals row, also on failure */
    }
    json_t *doc = NULL;
    if (ok)
        doc = json_pack("{s:s, s:s, s:b, s:s, s:s, s:s, s:I, s:I, s:f, s:o}", "schema", "lockstep-gate/1", "gate",
                        "lockstep rollout-replay", "pass", r->all_equal, "model_fingerprint", r->merkle_root,
                        "manifest_digest", r->manifest_digest, "backend", backend, "max_new_tokens",
                        (json_int_t)max_new, "rollout_positions", (json_int_t)r->rollout_positions,
                        "rollout_seconds", r->rollout_seconds, "replays", rows);
    else
        json_decref(rows);
    return ls_json_write_doc(path, doc, "gate report", err);
}
