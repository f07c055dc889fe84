/* Drift statistics (compare --stats): two traces built with known
 * differences — selected-token logprobs apart by 0, 2^-10 and 2^-4, one
 * next token and one top-k entry that differ, a dumped layer with one
 * element apart — give exactly the figures computed here by hand, and the
 * verdict and exit status stay those of the bitwise comparison. */
#include <check.h>
#include <math.h>
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
    dir = ls_test_tmpdir("compare_stats");
    snprintf(pa, sizeof pa, "%s/a.trace", dir);
    snprintf(pb, sizeof pb, "%s/b.trace", dir);
}
static void teardown(void) { ls_test_rm_tmpdir(dir); }

static uint32_t f32(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

#define N_POS 5            /* positions 0..4; 4 has no next token */
#define DUMP_LAYER 5       /* norm */

/* Trace A (b = 0) or B (b = 1): one sequence, prompt length 2, hidden
 * digests of every layer, the norm layer's hidden row dumped as fp32 [3, 4]
 * (B: [3, 4.5] at position 1). */
static void write_trace(const char *path, int b)
{
    char model[65];
    memset(model, 'a', 64);
    model[64] = 0;
    ls_trace_header h = {.mode = b ? "replay" : "rollout", .engine = "test", .model_fingerprint = model,
                         .manifest_digest = "", .run_params_json = "{\"batch\":[{\"id\":0,\"prompt_len\":2,\"n_tokens\":2}]}",
                         .topk = 5, .digest_kinds_mask = 1u << LS_DIGEST_HIDDEN, .state_digest_every = 1,
                         .activation_dtype = "fp32", .n_layers = SYN_N_LAYERS, .layers = syn_layers};
    ls_error err;
    ls_error_clear(&err);
    ls_trace_writer *w;
    ck_assert_msg(ls_trace_writer_open(path, &h, &w, &err) == LS_OK, "%s", err.msg);
    ck_assert(ls_trace_writer_begin_frame(w, b ? LS_FRAME_CHUNK : LS_FRAME_PREFILL, &err) == LS_OK);
    static const float delta[N_POS] = {0, 0x1p-10f, 0x1p-4f, 0, 0};
    for (uint32_t p = 0; p < N_POS; p++) {
        ls_trace_record r = {.seq = 0, .pos = p, .token = 9 + (int32_t)p};
        r.next_token = p + 1 < N_POS ? 10 + (int32_t)p : -1;
        if (b && p == 3) r.next_token = 99;
        r.logprob_bits = r.next_token >= 0 ? f32(-1.0f + (b ? delta[p] : 0.0f)) : 0x7fc00000u;
        static const int32_t ids[5] = {1, 2, 3, -1, -1};
        float lps[3] = {-0.5f, -1.5f, -2.5f};
        if (b && p == 1) lps[1] = -1.25f;
        for (int k = 0; k < 5; k++) {
            r.topk_ids[k] = ids[k];
            r.topk_logprob_bits[k] = k < 3 ? f32(lps[k]) : 0x7fc00000u;
        }
        if (b && p == 2) r.topk_ids[2] = 4;
        float row[2] = {3.0f, b && p == 1 ? 4.5f : 4.0f};
        ls_trace_digest dg[SYN_N_LAYERS];
        for (int l = 0; l < SYN_N_LAYERS; l++) {
            dg[l].layer = (uint16_t)l;
            dg[l].kind = LS_DIGEST_HIDDEN;
            uint32_t seed[2] = {p, (uint32_t)l};
            if (l == DUMP_LAYER) ls_sha256_buf(row, sizeof row, &dg[l].digest, NULL);
            else ls_sha256_buf(seed, sizeof seed, &dg[l].digest, NULL);
        }
        ls_trace_dump dm = {DUMP_LAYER, LS_DIGEST_HIDDEN, LS_DUMP_FP32, 2, row};
        r.n_digests = SYN_N_LAYERS;
        r.digests = dg;
        r.n_dumps = 1;
        r.dumps = &dm;
        ck_assert_msg(ls_trace_writer_add(w, &r, &err) == LS_OK, "%s", err.msg);
    }
    ck_assert(ls_trace_writer_end_frame(w, &err) == LS_OK);
    ck_assert_msg(ls_trace_writer_close(w, &err) == LS_OK, "%s", err.msg);
}

/* Exact equality, printing both values' bits on failure. */
static void eq(const char *what, double got, double want)
{
    uint64_t g, x;
    memcpy(&g, &got, 8);
    memcpy(&x, &want, 8);
    ck_assert_msg(got == want, "%s: got %.17g (0x%016llx), want %.17g (0x%016llx)", what, got, (unsigned long long)g, want,
                  (unsigned long long)x);
}

/* Equality to a few ULPs, for sums taken in another order. */
static void near(const char *what, double got, double want)
{
    ck_assert_msg(fabs(got - want) <= 4e-16 * fabs(want), "%s: got %.17g, want %.17g", what, got, want);
}

START_TEST(test_stats_known)
{
    write_trace(pa, 0);
    write_trace(pb, 1);
    ls_compare_result r, plain;
    ls_error err;
    ls_error_clear(&err);
    ls_compare_diag diag = {.stats = 1};
    ck_assert_msg(ls_compare_files_diag(pa, pb, NULL, &diag, &r, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_compare_files(pa, pb, NULL, &plain, &err) == LS_OK, "%s", err.msg);
    /* the verdict is the bitwise one, with or without statistics */
    ck_assert(!r.equal && !plain.equal && !plain.has_stats && r.has_stats);
    ck_assert_str_eq(r.seqs[0].first.message, plain.seqs[0].first.message);
    ls_compare_result_free(&plain);

    const ls_compare_stats *s = &r.seqs[0].stats;
    ck_assert_uint_eq(s->steps, 4);
    ck_assert_uint_eq(s->tokens_agree, 3);
    ck_assert_uint_eq(s->dlogprob.n, 3);
    eq("dlogprob mean", s->dlogprob.mean, (0x1p-10 + 0x1p-4) / 3);
    eq("dlogprob p50", s->dlogprob.p50, 0x1p-10);
    eq("dlogprob p99", s->dlogprob.p99, 0x1p-4);
    eq("dlogprob max", s->dlogprob.max, 0x1p-4);
    double dp1 = fabs(exp(-1.0) - exp(-1.0 + 0x1p-10)), dp2 = fabs(exp(-1.0) - exp(-1.0 + 0x1p-4));
    near("dprob mean", s->dprob_mean, (dp1 + dp2) / 3);
    eq("dprob max", s->dprob_max, dp2);
    /* the completion: positions 1 and 2 (prompt length 2; position 3's tokens differ) */
    ck_assert_uint_eq(s->completion_n, 2);
    eq("completion mean |dlogprob|", s->completion_mean_abs_dlogprob, (0x1p-10 + 0x1p-4) / 2);
    near("completion mean |dprob|", s->completion_mean_abs_dprob, (dp1 + dp2) / 2);
    eq("completion max |dprob|", s->completion_max_abs_dprob, dp2);
    double m = (dp1 + dp2) / 2;
    near("completion std |dprob|", s->completion_std_dprob, sqrt((dp1 * dp1 + dp2 * dp2) / 2 - m * m));
    /* top-k: position 2 shares 2 of 3 ids; position 1's second logprob differs */
    ck_assert_uint_eq(s->topk_positions, N_POS);
    near("top-k overlap mean", s->topk_overlap_mean, (4 + 2.0 / 3) / N_POS);
    eq("top-k overlap min", s->topk_overlap_min, 2.0 / 3);
    double pa_[3] = {exp(-0.5), exp(-1.5), exp(-2.5)}, pb_[3] = {exp(-0.5), exp(-1.25), exp(-2.5)}, sa = 0, sb = 0, kl = 0;
    for (int i = 0; i < 3; i++) sa += pa_[i], sb += pb_[i];
    for (int i = 0; i < 3; i++) kl += pa_[i] / sa * log((pa_[i] / sa) / (pb_[i] / sb));
    ck_assert_uint_eq(s->kl_topk.n, N_POS);
    /* per-position samples are kept as floats (compare_stats.h) */
    eq("KL max", s->kl_topk.max, (float)kl);
    near("KL mean", s->kl_topk.mean, (double)(float)kl / N_POS);
    eq("KL p50", s->kl_topk.p50, 0);
    /* one sequence: the overall figures are the sequence's */
    ck_assert(memcmp(&r.stats.dlogprob, &s->dlogprob, sizeof s->dlogprob) == 0);
    /* per layer: the norm layer's digest differs at position 1, its dump by 0.5 in one element */
    for (int l = 0; l < SYN_N_LAYERS; l++) {
        ck_assert_uint_eq(r.layer_stats[l].digests_compared, N_POS);
        ck_assert_uint_eq(r.layer_stats[l].digests_differ, l == DUMP_LAYER);
    }
    const ls_compare_dump_stats *d = &r.layer_stats[DUMP_LAYER].dumps[LS_DIGEST_HIDDEN];
    ck_assert_uint_eq(d->positions, N_POS);
    eq("dump max |d|", d->max_abs, 0.5);
    eq("dump rel err", d->rel_err, sqrt(0.25 / (25.0 * N_POS)));
    double c1 = 27.0 / sqrt(25.0 * 29.25);
    eq("dump cos min", d->cos_min, c1);
    near("dump cos mean", d->cos_mean, (N_POS - 1 + c1) / N_POS);
    ls_compare_result_free(&r);
}
END_TEST

/* Equal traces, framed differently (records compared on their bytes): every
 * figure is that of no difference, the dumps included. */
START_TEST(test_stats_equal)
{
    syn_opts a = {.n_seqs = 3, .prompt_len = 4, .gen_len = 5, .dumps = 1};
    ck_assert_int_eq(syn_write(pa, &a), 0);
    syn_opts b = a;
    b.chunk = 3;
    ck_assert_int_eq(syn_write(pb, &b), 0);
    ls_compare_result r;
    ls_error err;
    ls_error_clear(&err);
    ls_compare_diag diag = {.stats = 1};
    ck_assert_msg(ls_compare_files_diag(pa, pb, NULL, &diag, &r, &err) == LS_OK, "%s", err.msg);
    ck_assert(r.equal && r.has_stats);
    ck_assert_uint_eq(r.stats.steps, 3 * 8);
    ck_assert_uint_eq(r.stats.tokens_agree, 3 * 8);
    ck_assert_uint_eq(r.stats.dlogprob.n, 3 * 8);
    eq("max |dlogprob|", r.stats.dlogprob.max, 0);
    eq("top-k overlap min", r.stats.topk_overlap_min, 1);
    for (int l = 1; l <= 2; l++) {
        const ls_compare_dump_stats *d = &r.layer_stats[l].dumps[LS_DIGEST_HIDDEN];
        ck_assert_uint_eq(d->positions, 3 * 9);
        eq("dump max |d|", d->max_abs, 0);
        eq("dump rel err", d->rel_err, 0);
        eq("dump cos min", d->cos_min, 1);
        ck_assert_uint_eq(r.layer_stats[l].digests_differ, 0);
        ck_assert_uint_gt(r.layer_stats[l].digests_compared, 0);
    }
    ck_assert_uint_eq(r.layer_stats[2].dumps[LS_DIGEST_ROUTER].positions, 3 * 9);
    ls_compare_result_free(&r);
}
END_TEST

START_TEST(test_stats_cli)
{
    write_trace(pa, 0);
    write_trace(pb, 1);
    char *out = NULL;
    /* exit status 1 (a drift) with or without statistics; 0 for equal traces */
    ck_assert_int_eq(ls_test_cli(&out, "compare '%s' '%s'", pa, pb), 1);
    ck_assert(!strstr(out, "drift statistics"));
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "compare --stats '%s' '%s'", pa, pb), 1);
    ck_assert_msg(strstr(out, "drift statistics") && strstr(out, "tokens agree: 3/4 (75%)") &&
                  strstr(out, "mean |old_log_probs - rollout_log_probs| 0.0317383") &&
                  strstr(out, "hidden     dumps at 5 positions: max |d| 0.5"), "%s", out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "compare --stats '%s' '%s'", pa, pa), 0);
    ck_assert_msg(strstr(out, "mean 0, p50 0, p99 0, max 0"), "%s", out);
    free(out);
    char js[4300];
    snprintf(js, sizeof js, "%s/r.json", dir);
    ck_assert_int_eq(ls_test_cli(&out, "--quiet compare --stats '%s' '%s' --json '%s'", pa, pb, js), 1);
    free(out);
    json_error_t je;
    json_t *doc = json_load_file(js, 0, &je);
    ck_assert_msg(doc, "%s", je.text);
    json_t *st = json_object_get(doc, "stats");
    ck_assert(json_real_value(json_object_get(json_object_get(st, "dlogprob"), "max")) == 0x1p-4);
    ck_assert(json_real_value(json_object_get(json_object_get(st, "completion"), "mean_abs_logprob_diff")) ==
              (0x1p-10 + 0x1p-4) / 2);
    json_t *l5 = json_array_get(json_object_get(st, "layers"), DUMP_LAYER);
    ck_assert_int_eq(json_integer_value(json_object_get(l5, "digests_differ")), 1);
    ck_assert(json_real_value(json_object_get(json_array_get(json_object_get(l5, "dumps"), 0), "max_abs")) == 0.5);
    ck_assert(json_is_object(json_object_get(json_array_get(json_object_get(doc, "sequences"), 0), "stats")));
    json_decref(doc);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("compare_stats");
    TCase *tc = tcase_create("compare_stats");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_stats_known);
    tcase_add_test(tc, test_stats_equal);
    tcase_add_test(tc, test_stats_cli);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
