/* The gate's JSON report on results a passing gate never produces: a
 * perturbed replay drifting in a layer digest, a strict replay drifting in
 * a token (no layer) with a non-finite max |d logprob|. Every row is
 * written, a drift outside a layer says so (layer and decoder_layer -1,
 * family ""), a non-finite number is null, and the document validates
 * against docs/gate-json.schema.json (tests/python/test_gate_json.py
 * checks real gates against it). */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"
#include "testutil.h"

static void fill(ls_gate_result *r)
{
    memset(r, 0, sizeof *r);
    memset(r->merkle_root, 'a', 64);
    memset(r->manifest_digest, 'b', 64);
    r->rollout_positions = 30;
    r->rollout_seconds = 0.25;
    r->n_rows = 3;
    ls_gate_row *w = &r->rows[0];
    snprintf(w->name, sizeof w->name, "chunk 1");
    w->equal = 1;
    w->positions = w->positions_total = w->tokens_equal = w->topk_equal = 30;
    w->layer = -1;
    w->seconds = 0.5;
    w = &r->rows[1];
    snprintf(w->name, sizeof w->name, "chunk 3, perturbed gdn L2");
    w->perturbed = 1;
    w->positions = w->positions_total = w->tokens_equal = w->topk_equal = 30;
    w->max_dlogprob = 0.0078125;
    w->has_drift = 1;
    snprintf(w->first, sizeof w->first, "seq 0 pos 3 layer 5 (gdn, decoder layer 2): gdn_state digest differs");
    w->pos = 3;
    w->layer = 5;
    w->family = LS_FAMILY_GDN;
    w->decoder_layer = 2;
    w->digest_drift = 1;
    w->seconds = 0.125;
    w = &r->rows[2];
    snprintf(w->name, sizeof w->name, "whole sequence");
    w->positions = w->positions_total = 30;
    w->tokens_equal = 29;
    w->topk_equal = 29;
    w->max_dlogprob = INFINITY;
    w->has_drift = 1;
    snprintf(w->first, sizeof w->first, "seq 7 pos 9: next_token differs");
    w->seq = 7;
    w->pos = 9;
    w->layer = -1;
    w->family = LS_FAMILY_EMBED; /* what the comparator leaves in a drift without a layer */
    w->decoder_layer = 0;
    w->seconds = 0.0625;
}

START_TEST(test_gate_json_drift_rows)
{
    char *dir = ls_test_tmpdir("gate-report");
    char path[4300];
    snprintf(path, sizeof path, "%s/gate.json", dir);
    ls_gate_result r;
    fill(&r);
    r.rows[2].max_dlogprob = _i ? INFINITY : NAN;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_report_write_gate_json(path, "cpu", 5, &r, &err) == LS_OK, "%s", err.msg);
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    ck_assert_msg(doc, "%s: %s", path, je.text);
    ck_assert_str_eq(json_string_value(json_object_get(doc, "schema")), "lockstep-gate/1");
    ck_assert(json_is_false(json_object_get(doc, "pass")));
    json_t *rows = json_object_get(doc, "replays");
    ck_assert_int_eq(json_array_size(rows), 3);
    ck_assert_ptr_null(json_object_get(json_array_get(rows, 0), "first_drift"));
    json_t *d1 = json_object_get(json_array_get(rows, 1), "first_drift");
    ck_assert_int_eq(json_integer_value(json_object_get(d1, "layer")), 5);
    ck_assert_str_eq(json_string_value(json_object_get(d1, "family")), "gdn");
    ck_assert_int_eq(json_integer_value(json_object_get(d1, "decoder_layer")), 2);
    json_t *row2 = json_array_get(rows, 2);
    ck_assert_msg(json_is_null(json_object_get(row2, "max_abs_dlogprob")), "a non-finite max_abs_dlogprob is not null");
    json_t *d2 = json_object_get(row2, "first_drift");
    ck_assert_int_eq(json_integer_value(json_object_get(d2, "seq")), 7);
    ck_assert_int_eq(json_integer_value(json_object_get(d2, "layer")), -1);
    ck_assert_str_eq(json_string_value(json_object_get(d2, "family")), "");
    ck_assert_int_eq(json_integer_value(json_object_get(d2, "decoder_layer")), -1);
    json_decref(doc);
    char *out = NULL;
    int rc = ls_test_sh(&out, "/usr/bin/python3 -c 'import json, sys, jsonschema; "
                              "jsonschema.validate(json.load(open(sys.argv[1])), json.load(open(sys.argv[2])))' "
                              "'%s' '%s/docs/gate-json.schema.json'", path, LS_SOURCE_DIR);
    ck_assert_msg(rc == 0, "the report does not validate against the schema:\n%s", out ? out : "");
    free(out);
    ls_test_rm_tmpdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gate_report");
    TCase *tc = tcase_create("gate_report");
    tcase_add_loop_test(tc, test_gate_json_drift_rows, 0, 2);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
