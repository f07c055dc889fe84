/* Comparator defects an independent implementation of docs/trace-format.md
 * found: unused top-k slots (id -1) compared as tokens, a position only in B
 * reported with b = 0, differences between the traces' headers (activation
 * dtype, manifest, run parameters) missing from the reports. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "compare/compare.h"
#include "testutil.h"
#include "trace_synth.h"

static char *dir;
static char pa[4200], pb[4200];

static void setup(void)
{
    dir = ls_test_tmpdir("compare_rules");
    snprintf(pa, sizeof pa, "%s/a.trace", dir);
    snprintf(pb, sizeof pb, "%s/b.trace", dir);
}
static void teardown(void) { ls_test_rm_tmpdir(dir); }

static const char *tail(const char *out)
{
    if (!out) return "";
    size_t n = strlen(out);
    return n > 600 ? out + n - 600 : out;
}

static uint32_t f32(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

/* One sequence of 3 positions whose top-5 is `ids` (-1 = unused slot) with
 * logprobs -0.5, -1.5, ... on the used slots. hidden: 1 writes the hidden
 * digest of every layer (so records differ from a digest-free trace's in
 * more than their top-k, and the comparator cannot take its equal-bytes
 * path). */
static void write_topk(const char *path, const int32_t ids[5], int hidden)
{
    char model[65];
    memset(model, 'a', 64);
    model[64] = 0;
    ls_trace_header h = {.mode = "rollout", .engine = "test", .model_fingerprint = model, .manifest_digest = "",
                         .run_params_json = "{}", .topk = 5,
                         .digest_kinds_mask = hidden ? 1u << LS_DIGEST_HIDDEN : 0, .state_digest_every = 1,
                         .n_layers = SYN_N_LAYERS, .layers = syn_layers};
    ls_error err;
    ls_error_clear(&err);
    ls_trace_writer *w;
    ck_assert_msg(ls_trace_writer_open(path, &h, &w, &err) == LS_OK, "%s", err.msg);
    ck_assert(ls_trace_writer_begin_frame(w, LS_FRAME_PREFILL, &err) == LS_OK);
    for (uint32_t p = 0; p < 3; p++) {
        ls_trace_digest dg[SYN_N_LAYERS];
        ls_trace_record r = {.seq = 0, .pos = p, .token = 10 + (int32_t)p, .next_token = p < 2 ? 11 + (int32_t)p : -1,
                             .logprob_bits = p < 2 ? f32(-0.5f) : 0x7fc00000u};
        for (int k = 0; k < 5; k++) {
            r.topk_ids[k] = ids[k];
            r.topk_logprob_bits[k] = ids[k] >= 0 ? f32(-0.5f - (float)k) : 0x7fc00000u;
        }
        for (int l = 0; hidden && l < SYN_N_LAYERS; l++) {
            uint32_t seed[2] = {p, (uint32_t)l};
            dg[l].layer = (uint16_t)l;
            dg[l].kind = LS_DIGEST_HIDDEN;
            ls_sha256_buf(seed, sizeof seed, &dg[l].digest, NULL);
        }
        r.n_digests = hidden ? SYN_N_LAYERS : 0;
        r.digests = dg;
        ck_assert_msg(ls_trace_writer_add(w, &r, &err) == LS_OK, "%s", err.msg);
    }
    ck_assert(ls_trace_writer_end_frame(w, &err) == LS_OK);
    ck_assert_msg(ls_trace_writer_close(w, &err) == LS_OK, "%s", err.msg);
}

static void compare(ls_compare_result *r)
{
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_compare_files(pa, pb, NULL, r, &err) == LS_OK, "%s", err.msg);
}

/* Unused slots are not tokens: equal lists with unused slots are equal
 * whatever else differs between the records; a slot used in one list and
 * unused in the other is a set difference, named at that slot. */
START_TEST(test_topk_unused_slots)
{
    static const int32_t two[5] = {11, 12, -1, -1, -1}, three[5] = {11, 12, 13, -1, -1},
                         swapped[5] = {12, 11, -1, -1, -1}, none[5] = {-1, -1, -1, -1, -1};
    ls_compare_result r;
    /* same lists; A has digests, B none: the records differ in bytes only */
    write_topk(pa, two, 1);
    write_topk(pb, two, 0);
    compare(&r);
    ck_assert_msg(r.equal, "equal top-k lists with unused slots: %s", r.first_seq >= 0 ? r.seqs[r.first_seq].first.message : "");
    ck_assert_uint_eq(r.seqs[0].topk_set_equal, 3);
    ls_compare_result_free(&r);
    write_topk(pa, none, 1);
    write_topk(pb, none, 0);
    compare(&r);
    ck_assert_msg(r.equal, "all slots unused: %s", r.first_seq >= 0 ? r.seqs[r.first_seq].first.message : "");
    ls_compare_result_free(&r);
    /* B has a third entry: the sets differ at slot 2 (A unused, B 13) */
    for (int swap = 0; swap < 2; swap++) {
        write_topk(pa, swap ? three : two, 1);
        write_topk(pb, swap ? two : three, 0);
        compare(&r);
        ck_assert(!r.equal);
        const ls_compare_drift *d = &r.seqs[0].first;
        ck_assert_msg(d->what == LS_DRIFT_TOPK_SET && d->pos == 0 && d->topk_slot == 2, "got %s slot %d: %s",
                      ls_drift_what_name(d->what), d->topk_slot, d->message);
        ck_assert_int_eq(d->a_value, (swap ? 13 : -1));
        ck_assert_int_eq(d->b_value, (swap ? -1 : 13));
        const char *want = swap ? "top-5 token sets differ at slot 2: A 13 (not in B), B unused"
                                : "top-5 token sets differ at slot 2: A unused, B 13 (not in A)";
        ck_assert_msg(strstr(d->message, want), "wanted '%s' in: %s", want, d->message);
        ck_assert_uint_eq(r.seqs[0].topk_set_equal, 0);
        ls_compare_result_free(&r);
    }
    /* same set, another order */
    write_topk(pa, two, 1);
    write_topk(pb, swapped, 0);
    compare(&r);
    const ls_compare_drift *d = &r.seqs[0].first;
    ck_assert_msg(d->what == LS_DRIFT_TOPK_ORDER && d->topk_slot == 0 && d->a_value == 11 && d->b_value == 12,
                  "got %s slot %d: %s", ls_drift_what_name(d->what), d->topk_slot, d->message);
    ck_assert_uint_eq(r.seqs[0].topk_set_equal, 3);
    ls_compare_result_free(&r);
}
END_TEST

/* A position only in trace B says so in the JSON report: a 0, b 1. */
START_TEST(test_missing_in_json)
{
    syn_opts a = {.n_seqs = 2, .prompt_len = 3, .gen_len = 2};
    ck_assert_int_eq(syn_write(pa, &a), 0);
    syn_opts b = a;
    b.n_seqs = 3;
    ck_assert_int_eq(syn_write(pb, &b), 0);
    for (int swap = 0; swap < 2; swap++) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "--quiet compare '%s' '%s' --json -", swap ? pb : pa, swap ? pa : pb);
        ck_assert_msg(rc == 1, "rc %d: %s", rc, tail(out));
        json_error_t je;
        json_t *doc = json_loads(out, 0, &je);
        ck_assert_msg(doc, "%s: %s", je.text, tail(out));
        json_t *fd = json_object_get(doc, "first_drift");
        ck_assert_str_eq(json_string_value(json_object_get(fd, "what")), "missing");
        ck_assert_int_eq(json_integer_value(json_object_get(fd, "seq")), 2);
        ck_assert_int_eq(json_integer_value(json_object_get(fd, "a")), (swap ? 1 : 0));
        ck_assert_int_eq(json_integer_value(json_object_get(fd, "b")), (swap ? 0 : 1));
        ck_assert_msg(strstr(json_string_value(json_object_get(fd, "message")), swap ? "only in trace A" : "only in trace B"),
                      "%s", json_string_value(json_object_get(fd, "message")));
        json_decref(doc);
        free(out);
    }
}
END_TEST

/* A trace of one sequence (3 positions, no digests) with the given header facts. */
static void write_header(const char *path, const char *act, const char *manifest, const char *params)
{
    char model[65];
    memset(model, 'a', 64);
    model[64] = 0;
    ls_trace_header h = {.mode = "rollout", .engine = "test", .model_fingerprint = model, .manifest_digest = manifest,
                         .run_params_json = params, .topk = 5, .state_digest_every = 1, .activation_dtype = act,
                         .n_layers = SYN_N_LAYERS, .layers = syn_layers};
    ls_error err;
    ls_error_clear(&err);
    ls_trace_writer *w;
    ck_assert_msg(ls_trace_writer_open(path, &h, &w, &err) == LS_OK, "%s", err.msg);
    ck_assert(ls_trace_writer_begin_frame(w, LS_FRAME_PREFILL, &err) == LS_OK);
    for (uint32_t p = 0; p < 3; p++) {
        ls_trace_record r = {.seq = 0, .pos = p, .token = 7, .next_token = p < 2 ? 8 : -1,
                             .logprob_bits = p < 2 ? f32(-0.25f) : 0x7fc00000u};
        for (int k = 0; k < 5; k++) r.topk_ids[k] = 20 + k, r.topk_logprob_bits[k] = f32(-1.0f - (float)k);
        ck_assert_msg(ls_trace_writer_add(w, &r, &err) == LS_OK, "%s", err.msg);
    }
    ck_assert(ls_trace_writer_end_frame(w, &err) == LS_OK);
    ck_assert_msg(ls_trace_writer_close(w, &err) == LS_OK, "%s", err.msg);
}

/* Runs compare with every report; returns the JSON document (caller frees)
 * and leaves the text output, JUnit XML and HTML in *text, *junit, *html. */
static json_t *reports(int want_rc, char **text, char **junit, char **html)
{
    char js[4300], ju[4300], ht[4300];
    snprintf(js, sizeof js, "%s/r.json", dir);
    snprintf(ju, sizeof ju, "%s/r.xml", dir);
    snprintf(ht, sizeof ht, "%s/r.html", dir);
    int rc = ls_test_cli(text, "compare '%s' '%s' --json '%s' --junit '%s' --html '%s'", pa, pb, js, ju, ht);
    ck_assert_msg(rc == want_rc, "rc %d: %s", rc, tail(*text));
    json_error_t je;
    json_t *doc = json_load_file(js, 0, &je);
    ck_assert_msg(doc, "%s", je.text);
    *junit = ls_test_read(ju, NULL);
    *html = ls_test_read(ht, NULL);
    return doc;
}

/* Header facts that differ between the traces are stated in every report:
 * activation dtype, manifest digest, and the run parameters that make a
 * trace perturbed or of another backend (absent and null are the same). */
START_TEST(test_header_differences_reported)
{
    static const char man[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    write_header(pa, "bf16", "", "{\"perturbation\":null,\"backend\":\"cpu\"}");
    write_header(pb, "bf16", "", "{\"backend\":\"cpu\"}");
    char *text, *junit, *html;
    json_t *doc = reports(0, &text, &junit, &html);
    ck_assert_msg(!strstr(text, "run parameters differ") && !strstr(text, "none, B none"), "%s", tail(text));
    ck_assert_msg(!strstr(json_string_value(json_object_get(doc, "note")), "differ"), "%s",
                  json_string_value(json_object_get(doc, "note")));
    ck_assert_uint_eq(json_array_size(json_object_get(doc, "run_params_differ")), 0);
    json_decref(doc);
    free(text), free(junit), free(html);

    write_header(pa, "bf16", "", "{\"perturbation\":\"gdn_gate:3\",\"backend\":\"cpu\"}");
    write_header(pb, "fp32", man, "{\"perturbation\":{\"layer\":3},\"backend\":\"cuda\"}");
    doc = reports(0, &text, &junit, &html);
    const char *note = json_string_value(json_object_get(doc, "note"));
    static const char *const want[] = {
        "activation dtypes differ (A bf16, B fp32)",
        "manifest digests differ (A none, B 0123456789abcdef...)",
        "run parameters differ: perturbation A gdn_gate:3, B {\"layer\":3}; backend A cpu, B cuda",
    };
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(strstr(note, want[i]), "JSON note lacks '%s': %s", want[i], note);
        ck_assert_msg(strstr(text, want[i]), "text lacks '%s': %s", want[i], tail(text));
        ck_assert_msg(strstr(junit, want[i]) || i == 2, "JUnit lacks '%s'", want[i]);
        ck_assert_msg(strstr(html, want[i]) || i == 2, "HTML lacks '%s'", want[i]);
    }
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "a"), "activation_dtype")), "bf16");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "b"), "activation_dtype")), "fp32");
    json_t *pd = json_object_get(doc, "run_params_differ");
    ck_assert_uint_eq(json_array_size(pd), 2);
    json_t *p0 = json_array_get(pd, 0);
    ck_assert_str_eq(json_string_value(json_object_get(p0, "key")), "perturbation");
    ck_assert_str_eq(json_string_value(json_object_get(p0, "a")), "gdn_gate:3");
    ck_assert_str_eq(json_string_value(json_object_get(p0, "b")), "{\"layer\":3}");
    ck_assert_msg(strstr(junit, "name=\"activation_dtype_b\" value=\"fp32\""), "%s", junit);
    json_decref(doc);
    free(text), free(junit), free(html);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("compare_rules");
    TCase *tc = tcase_create("compare_rules");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_topk_unused_slots);
    tcase_add_test(tc, test_missing_in_json);
    tcase_add_test(tc, test_header_differences_reported);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
