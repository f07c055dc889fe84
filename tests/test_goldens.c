/* Goldens: lockstep's CPU reference against Hugging Face transformers on the
 * committed checkpoints (goldens/README.md), and lockstep's own bitwise
 * goldens of the strict path (goldens/<name>/lockstep-strict.json,
 * goldens/synth-tiny-strict.json).
 *
 *   Qwen3.5 layouts: the fused release layout and the per-expert layout of
 *     the same weights give identical records, every run, every bit.
 *
 *   fp32 activations vs transformers fp32: max |Δ logprob| <= 1e-4 over every
 *     next-token logprob and top-5 logprob, top-5 ids equal (a swap of two ids
 *     only where transformers' own two logprobs are within 1e-5), greedy
 *     tokens from the stored prompts identical; the same with the
 *     chunk-aligned GDN form (docs/numerics.md §5.1).
 *   bf16 activations vs transformers: measured against transformers' own
 *     fp32-vs-bf16 gap on the same golden (see BF16_* below, docs/numerics.md
 *     §8 and goldens/README.md for the reasoning).
 *   strict goldens: every record of every run, bit for bit.
 *
 * `test_goldens --update-strict` rewrites the strict golden files instead of
 * checking them (harness/goldens/update_strict). */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "engine/engine.h"
#include "run/run.h"
#include "fingerprint/sha256.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "model/model.h"
#include "synth/synth.h"
#include "gpu/engine_records.h"
#include "testutil.h"

#define FP32_TOL 1e-4
#define SWAP_TOL 1e-5
/* bf16: lockstep-bf16 must be closer to transformers-bf16 than
 * transformers-bf16 is to transformers-fp32 (at most BF16_SAME times at the
 * median and p90: the same rounding points, so mostly the same roundings);
 * lockstep-bf16 vs transformers-fp32 may be at most BF16_K times
 * transformers' own bf16-vs-fp32 gap at the median and at p90; its top-1
 * disagreements with transformers-fp32 at most transformers-bf16's own plus
 * BF16_TOP1_SLACK, each at a position whose transformers-fp32 margin (top-1
 * minus the token lockstep chose) is at most BF16_K times the largest margin
 * transformers-bf16 itself flips (docs/numerics.md §8). */
#define BF16_K 1.5
#define BF16_SAME 0.75
#define BF16_TOP1_SLACK 2

#define GEN_STEPS 16
#define SYNTH_SEED 20240611u

/* Qwen3-Next (make_goldens.py), then Qwen3.5 MoE (make_goldens_qwen35.py:
 * the fused release layout here, the same weights per expert in per_expert/),
 * then the FP8 block-quantised Qwen3.5 ones (make_goldens_fp8.py: fp32 runs
 * of transformers' dequantize=True path only, compared with lockstep's
 * dequant mode; the strict goldens hold both FP8 modes). */
static const char *const GOLDENS[] = {"qwen3next_tiny_a", "qwen3next_tiny_b", "qwen3next_tiny_c",
                                      "qwen35moe_tiny_a", "qwen35moe_tiny_b", "qwen35moe_tiny_c",
                                      "qwen35moe_fp8_a",  "qwen35moe_fp8_b"};
#define N_GOLDENS 6      /* with bf16 runs of transformers */
#define N_ALL_GOLDENS 8  /* with fp32 runs */
#define FIRST_QWEN35 3

/* ---- records ----------------------------------------------------------------------- */

static float f32_of(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint32_t hexbits(const json_t *s)
{
    ck_assert_msg(json_is_string(s), "expected a hex string");
    return (uint32_t)strtoul(json_string_value(s), NULL, 16);
}

/* ---- a loaded model ------------------------------------------------------------------ */

typedef struct loaded {
    char name[64];
    ls_checkpoint *ck;
    ls_model *m;
    json_t *exp;     /* expected.json, NULL for synth */
} loaded;

static void load_dir(loaded *L, const char *name, const char *dir)
{
    ls_error err;
    snprintf(L->name, sizeof L->name, "%s", name);
    ck_assert_msg(ls_checkpoint_open(dir, &L->ck, &err) == LS_OK, "%s: %s", name, err.msg);
    ck_assert_msg(ls_model_open(L->ck, &L->m, &err) == LS_OK, "%s: %s", name, err.msg);
}

static void load_golden(loaded *L, const char *name)
{
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/goldens/%s", LS_SOURCE_DIR, name);
    load_dir(L, name, dir);
    snprintf(path, sizeof path, "%s/expected.json.zst", dir);
    size_t zlen;
    char *z = ls_test_read(path, &zlen);
    ck_assert_ptr_nonnull(z);
    unsigned long long n = ZSTD_getFrameContentSize(z, zlen);
    ck_assert_msg(n != ZSTD_CONTENTSIZE_ERROR && n != ZSTD_CONTENTSIZE_UNKNOWN, "%s: bad zstd frame", path);
    char *raw = malloc((size_t)n);
    size_t got = ZSTD_decompress(raw, (size_t)n, z, zlen);
    ck_assert_msg(!ZSTD_isError(got) && got == n, "%s: zstd: %s", path, ZSTD_getErrorName(got));
    ls_error err;
    ck_assert_msg(ls_json_load_buf(path, raw, (size_t)n, &L->exp, &err) == LS_OK, "%s", err.msg);
    free(raw);
    free(z);
}

static void unload(loaded *L)
{
    if (L->exp) json_decref(L->exp);
    ls_model_close(L->m);
    ls_checkpoint_close(L->ck);
    memset(L, 0, sizeof *L);
}

/* The run of the given kind, dtype and seq in expected.json. */
static const json_t *find_run(const loaded *L, const char *kind, const char *dtype, int seq)
{
    const json_t *runs = json_object_get(L->exp, "runs");
    size_t i;
    const json_t *r;
    json_array_foreach(runs, i, r) {
        if (strcmp(json_string_value(json_object_get(r, "kind")), kind) == 0 &&
            strcmp(json_string_value(json_object_get(r, "dtype")), dtype) == 0 &&
            json_integer_value(json_object_get(r, "seq")) == seq)
            return r;
    }
    ck_abort_msg("%s: no %s %s run for seq %d", L->name, kind, dtype, seq);
    return NULL;
}

static int32_t *json_tokens(const json_t *a, long *n)
{
    *n = (long)json_array_size(a);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)(*n + 1));
    for (long i = 0; i < *n; i++) t[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return t;
}

/* 1 while a test runs the chunk-aligned GDN form (docs/numerics.md §5.1). */
static int g_gdn_chunked;

/* An engine on the CPU; FP8 models in dequant mode unless w8a8. */
static ls_engine *mk_engine_fp8(const loaded *L, int act_bf16, int w8a8)
{
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.act_bf16 = act_bf16;
    o.fp8_w8a8 = w8a8;
    o.gdn_chunked = g_gdn_chunked;
    ls_engine *e;
    ls_error err;
    ck_assert_msg(ls_run_engine_open(L->m, "cpu", 2, &o, 1, 256, &e, &err) == LS_OK, "%s", err.msg);
    return e;
}

static ls_engine *mk_engine(const loaded *L, int act_bf16)
{
    return mk_engine_fp8(L, act_bf16, 0);
}

/* Teacher-forced replay of tokens[0..n-1]: one record per position 0..n-1
 * (a dummy target token 0 is appended so that the last position, and a
 * length-1 sequence, get their top-5 too). */
static void run_replay(ls_engine *e, uint32_t id, const int32_t *tokens, long n, recs *out)
{
    int32_t *t = malloc(sizeof(int32_t) * (size_t)(n + 1));
    memcpy(t, tokens, sizeof(int32_t) * (size_t)n);
    t[n] = 0;
    ls_sequence s = {id, t, n + 1, n + 1}; /* all of it is prompt */
    ls_error err;
    ck_assert_msg(ls_run_replay(e, &s, 1, 64, recs_sink, out, &err) == LS_OK, "%s", err.msg);
    ck_assert_int_eq(out->n, n);
    for (long p = 0; p < n; p++) ck_assert_uint_eq(out->v[p].r.pos, (uint32_t)p);
    free(t);
}

static void run_greedy(ls_engine *e, uint32_t id, const int32_t *prompt, long n, int32_t *gen,
                       recs *out)
{
    ls_sequence s = {id, prompt, n, n};
    ls_sampling g = {LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};
    ls_error err;
    ck_assert_msg(ls_run_rollout(e, &s, 1, GEN_STEPS, &g, gen, recs_sink, out, &err) == LS_OK,
                  "%s", err.msg);
    ck_assert_int_eq(out->n, n + GEN_STEPS - 1);
}

/* ---- fp32 vs transformers fp32 ------------------------------------------------------------ */

typedef struct fp32_stats {
    double max_next, max_top5;
    long positions, swaps;
} fp32_stats;

/* Compares one record's top-5 with transformers' (ids array, logprob array). */
static void check_top5(const char *where, long p, const ls_trace_record *r, const json_t *ids,
                       const json_t *lps, fp32_stats *st)
{
    for (int j = 0; j < 5; j++) {
        int k_used = j;
        int32_t hid = (int32_t)json_integer_value(json_array_get(ids, (size_t)j));
        float hlp = f32_of(hexbits(json_array_get(lps, (size_t)j)));
        float llp = f32_of(r->topk_logprob_bits[j]);
        if (r->topk_ids[j] != hid) {
            /* allowed only as a swap with a transformers near-tie */
            int k = -1;
            for (int q = 0; q < 5; q++)
                if ((int32_t)json_integer_value(json_array_get(ids, (size_t)q)) == r->topk_ids[j]) k = q;
            float hk = k >= 0 ? f32_of(hexbits(json_array_get(lps, (size_t)k))) : NAN;
            ck_assert_msg(k >= 0 && fabs((double)hk - (double)hlp) <= SWAP_TOL,
                          "%s pos %ld top-5 slot %d: lockstep id %d (logprob 0x%08x %.9g), "
                          "transformers id %d (logprob 0x%08x %.9g); not a transformers near-tie",
                          where, p, j, r->topk_ids[j], r->topk_logprob_bits[j], (double)llp, hid,
                          hexbits(json_array_get(lps, (size_t)j)), (double)hlp);
            st->swaps++;
            printf("  %s pos %ld: top-5 slot %d swap %d<->%d (transformers logprobs differ by %.3g)\n",
                   where, p, j, r->topk_ids[j], hid, fabs((double)hk - (double)hlp));
            hlp = hk;
            k_used = k;
        }
        double d = fabs((double)llp - (double)hlp);
        if (d > st->max_top5) st->max_top5 = d;
        ck_assert_msg(d <= FP32_TOL, "%s pos %ld top-5 slot %d (id %d): lockstep 0x%08x %.9g vs "
                      "transformers 0x%08x %.9g, |diff| %.3g > %g", where, p, j, hid,
                      r->topk_logprob_bits[j], (double)llp, hexbits(json_array_get(lps, (size_t)(k_used))),
                      (double)hlp, d, FP32_TOL);
    }
}

static void check_next(const char *where, long p, const ls_trace_record *r, int32_t want_tok,
                       uint32_t hbits, fp32_stats *st)
{
    ck_assert_msg(r->next_token == want_tok, "%s pos %ld: next token %d, expected %d", where, p,
                  r->next_token, want_tok);
    double d = fabs((double)f32_of(r->logprob_bits) - (double)f32_of(hbits));
    if (d > st->max_next) st->max_next = d;
    ck_assert_msg(d <= FP32_TOL, "%s pos %ld: next-token (%d) logprob lockstep 0x%08x %.9g vs "
                  "transformers 0x%08x %.9g, |diff| %.3g > %g", where, p, want_tok, r->logprob_bits,
                  (double)f32_of(r->logprob_bits), hbits, (double)f32_of(hbits), d, FP32_TOL);
    st->positions++;
}

static void fp32_vs_transformers(int golden)
{
    loaded L = {0};
    load_golden(&L, GOLDENS[golden]);
    ls_engine *e = mk_engine(&L, 0);
    fp32_stats st = {0};
    char where[128];
    for (int s = 0; s < 4; s++) {
        const json_t *run = find_run(&L, "teacher_forced", "float32", s);
        long n;
        int32_t *tok = json_tokens(json_object_get(run, "tokens"), &n);
        recs out = {0};
        run_replay(e, (uint32_t)s, tok, n, &out);
        snprintf(where, sizeof where, "%s fp32 replay seq %d", L.name, s);
        const json_t *nl = json_object_get(run, "next_logprob");
        for (long p = 0; p < n; p++) {
            const ls_trace_record *r = &out.v[p].r;
            ck_assert_int_eq(r->token, tok[p]);
            if (p + 1 < n) check_next(where, p, r, tok[p + 1], hexbits(json_array_get(nl, (size_t)p)), &st);
            check_top5(where, p, r, json_array_get(json_object_get(run, "top5_ids"), (size_t)p),
                       json_array_get(json_object_get(run, "top5_logprobs"), (size_t)p), &st);
        }
        recs_free(&out);
        free(tok);
    }
    long n_gen_equal = 0;
    for (int s = 1; s <= 2; s++) {
        const json_t *run = find_run(&L, "greedy", "float32", s);
        long n;
        int32_t *pr = json_tokens(json_object_get(run, "prompt"), &n);
        int32_t gen[GEN_STEPS];
        recs out = {0};
        run_greedy(e, (uint32_t)s, pr, n, gen, &out);
        const json_t *hg = json_object_get(run, "generated");
        snprintf(where, sizeof where, "%s fp32 greedy seq %d", L.name, s);
        for (int k = 0; k < GEN_STEPS; k++) {
            int32_t want = (int32_t)json_integer_value(json_array_get(hg, (size_t)k));
            ck_assert_msg(gen[k] == want, "%s step %d: lockstep generated %d, transformers %d",
                          where, k, gen[k], want);
            const ls_trace_record *r = &out.v[n - 1 + k].r;
            check_next(where, n - 1 + k, r, want, hexbits(json_array_get(json_object_get(run, "logprob"), (size_t)k)), &st);
            check_top5(where, n - 1 + k, r, json_array_get(json_object_get(run, "top5_ids"), (size_t)k),
                       json_array_get(json_object_get(run, "top5_logprobs"), (size_t)k), &st);
        }
        n_gen_equal++;
        recs_free(&out);
        free(pr);
    }
    printf("%s fp32%s vs transformers fp32: %ld logprobs, max |d next| %.3g, max |d top-5| %.3g, "
           "top-5 swaps at near-ties %ld, greedy tokens equal %ld/2 prompts x %d steps\n",
           L.name, g_gdn_chunked ? " (chunk-aligned GDN)" : "", st.positions, st.max_next, st.max_top5, st.swaps,
           n_gen_equal, GEN_STEPS);
    fflush(stdout);
    ls_engine_destroy(e);
    unload(&L);
}

START_TEST(test_fp32_vs_transformers)
{
    g_gdn_chunked = 0;
    fp32_vs_transformers(_i);
}
END_TEST

/* The chunk-aligned GDN form is the same model to rounding: the same
 * tolerances against transformers (sequences of up to 130 tokens cross two
 * chunk boundaries). */
START_TEST(test_fp32_vs_transformers_chunk_aligned)
{
    g_gdn_chunked = 1;
    fp32_vs_transformers(_i);
    g_gdn_chunked = 0;
}
END_TEST

/* ---- bf16 vs transformers --------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct dist {
    double max, median, p90;
} dist;

/* Sorted-index statistics as make_goldens.py computes them: median =
 * sorted[n/2], p90 = sorted[9n/10]. */
static dist stats(double *v, long n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    dist d = {v[n - 1], v[n / 2], v[(n * 9) / 10]};
    return d;
}

/* HF-fp32's logprob margin between its top-1 and token `tok` (0 when tok is
 * its top-1; +inf when tok is outside its top-5). */
static double fp32_margin(const json_t *ids, const json_t *lps, int32_t tok)
{
    for (int q = 0; q < 5; q++)
        if ((int32_t)json_integer_value(json_array_get(ids, (size_t)q)) == tok)
            return (double)f32_of(hexbits(json_array_get(lps, 0))) -
                   (double)f32_of(hexbits(json_array_get(lps, (size_t)q)));
    return INFINITY;
}

START_TEST(test_bf16_vs_transformers)
{
    loaded L = {0};
    load_golden(&L, GOLDENS[_i]);
    ls_engine *e = mk_engine(&L, 1);
    double d_ls_hf32[512], d_ls_hf16[512], d_hf[512];
    double max_margin_ls = 0, max_margin_hf = 0;
    long n_next = 0, n_pos = 0, top1_ls = 0, top1_hf = 0, top1_ls_hf16 = 0;
    for (int s = 0; s < 4; s++) {
        const json_t *r32 = find_run(&L, "teacher_forced", "float32", s);
        const json_t *r16 = find_run(&L, "teacher_forced", "bfloat16", s);
        long n;
        int32_t *tok = json_tokens(json_object_get(r32, "tokens"), &n);
        recs out = {0};
        run_replay(e, (uint32_t)s, tok, n, &out);
        for (long p = 0; p < n; p++) {
            const ls_trace_record *r = &out.v[p].r;
            int32_t t32 = (int32_t)json_integer_value(json_array_get(json_array_get(json_object_get(r32, "top5_ids"), (size_t)p), 0));
            int32_t t16 = (int32_t)json_integer_value(json_array_get(json_array_get(json_object_get(r16, "top5_ids"), (size_t)p), 0));
            top1_ls += r->topk_ids[0] == t32;
            top1_hf += t16 == t32;
            const json_t *ids32 = json_array_get(json_object_get(r32, "top5_ids"), (size_t)p);
            const json_t *lp32 = json_array_get(json_object_get(r32, "top5_logprobs"), (size_t)p);
            double mls = fp32_margin(ids32, lp32, r->topk_ids[0]), mhf = fp32_margin(ids32, lp32, t16);
            if (mls > max_margin_ls) max_margin_ls = mls;
            if (mhf > max_margin_hf) max_margin_hf = mhf;
            top1_ls_hf16 += r->topk_ids[0] == t16;
            n_pos++;
            if (p + 1 >= n) continue;
            ck_assert_int_eq(r->next_token, tok[p + 1]);
            double ls = f32_of(r->logprob_bits);
            double h32 = f32_of(hexbits(json_array_get(json_object_get(r32, "next_logprob"), (size_t)p)));
            double h16 = f32_of(hexbits(json_array_get(json_object_get(r16, "next_logprob"), (size_t)p)));
            ck_assert_msg(isfinite(ls), "%s bf16 seq %d pos %ld: logprob 0x%08x not finite", L.name, s, p,
                          r->logprob_bits);
            ck_assert_int_lt(n_next, 512);
            d_ls_hf32[n_next] = fabs(ls - h32);
            d_ls_hf16[n_next] = fabs(ls - h16);
            d_hf[n_next] = fabs(h16 - h32);
            n_next++;
        }
        recs_free(&out);
        free(tok);
    }
    /* Greedy in bf16: reported only (transformers' own bf16 greedy differs from
     * its fp32 greedy on tiny_a), as the number of leading steps equal. */
    int lead32[2], lead16[2];
    for (int s = 1; s <= 2; s++) {
        const json_t *g32 = json_object_get(find_run(&L, "greedy", "float32", s), "generated");
        const json_t *g16 = json_object_get(find_run(&L, "greedy", "bfloat16", s), "generated");
        long n;
        int32_t *pr = json_tokens(json_object_get(find_run(&L, "greedy", "bfloat16", s), "prompt"), &n);
        int32_t gen[GEN_STEPS];
        recs out = {0};
        run_greedy(e, (uint32_t)(10 + s), pr, n, gen, &out);
        int k32 = 0, k16 = 0;
        while (k32 < GEN_STEPS && gen[k32] == json_integer_value(json_array_get(g32, (size_t)k32))) k32++;
        while (k16 < GEN_STEPS && gen[k16] == json_integer_value(json_array_get(g16, (size_t)k16))) k16++;
        lead32[s - 1] = k32, lead16[s - 1] = k16;
        recs_free(&out);
        free(pr);
    }
    printf("%s bf16 greedy (2 prompts x %d steps), leading steps equal: to HF-fp32 %d, %d; to "
           "HF-bf16 %d, %d\n", L.name, GEN_STEPS, lead32[0], lead32[1], lead16[0], lead16[1]);
    dist a = stats(d_ls_hf32, n_next), b = stats(d_ls_hf16, n_next), h = stats(d_hf, n_next);
    /* Our recomputation of transformers' own gap must equal the stored summary. */
    const json_t *gap = json_object_get(L.exp, "fp32_vs_bf16");
    ck_assert_msg(fabs(h.median - json_number_value(json_object_get(gap, "median_abs_dlogprob_next"))) < 1e-6 &&
                  fabs(h.p90 - json_number_value(json_object_get(gap, "p90_abs_dlogprob_next"))) < 1e-6 &&
                  top1_hf == json_integer_value(json_object_get(gap, "top1_agree")),
                  "%s: recomputed transformers gap (median %.6g p90 %.6g top-1 %ld) differs from the "
                  "stored summary", L.name, h.median, h.p90, top1_hf);
    printf("%s bf16 over %ld next-token logprobs / %ld positions:\n"
           "  lockstep-bf16 vs HF-fp32: max %.4g median %.4g p90 %.4g, top-1 = HF-fp32 %ld/%ld\n"
           "  lockstep-bf16 vs HF-bf16: max %.4g median %.4g p90 %.4g, top-1 = HF-bf16 %ld/%ld\n"
           "  HF-bf16 vs HF-fp32:       max %.4g median %.4g p90 %.4g, top-1 = HF-fp32 %ld/%ld\n"
           "  ratios vs HF's own gap: median %.3f p90 %.3f (bound %.2f); to HF-bf16: median %.3f "
           "p90 %.3f (bound %.2f)\n"
           "  largest HF-fp32 top-1 margin flipped: lockstep-bf16 %.4g, HF-bf16 %.4g\n",
           L.name, n_next, n_pos, a.max, a.median, a.p90, top1_ls, n_pos, b.max, b.median, b.p90,
           top1_ls_hf16, n_pos, h.max, h.median, h.p90, top1_hf, n_pos, a.median / h.median,
           a.p90 / h.p90, BF16_K, b.median / h.median, b.p90 / h.p90, BF16_SAME, max_margin_ls,
           max_margin_hf);
    fflush(stdout);
    ck_assert_msg(a.median <= BF16_K * h.median, "%s: bf16 median |d| vs HF-fp32 %.4g > %.1f x HF's "
                  "own %.4g", L.name, a.median, BF16_K, h.median);
    ck_assert_msg(a.p90 <= BF16_K * h.p90, "%s: bf16 p90 |d| vs HF-fp32 %.4g > %.1f x HF's own %.4g",
                  L.name, a.p90, BF16_K, h.p90);
    ck_assert_msg(b.median <= BF16_SAME * h.median && b.p90 <= BF16_SAME * h.p90, "%s: lockstep-bf16 "
                  "vs HF-bf16 (median %.4g, p90 %.4g) is not within %.2f x HF-bf16 vs HF-fp32 (%.4g, "
                  "%.4g): bf16 rounding points differ from the reference's", L.name, b.median, b.p90,
                  BF16_SAME, h.median, h.p90);
    ck_assert_msg(n_pos - top1_ls <= n_pos - top1_hf + BF16_TOP1_SLACK, "%s: bf16 top-1 "
                  "disagreements with HF-fp32 %ld/%ld > HF-bf16's own %ld + %d", L.name,
                  n_pos - top1_ls, n_pos, n_pos - top1_hf, BF16_TOP1_SLACK);
    /* The Qwen3.5 goldens also record the reference's bf16 through its other
     * experts path (eager: bf16 combine in expert order); a top-1 flip it
     * makes is as much the reference's own bf16 behaviour as one of
     * grouped_mm's. */
    const json_t *eager = json_object_get(gap, "bf16_eager_experts");
    if (eager) {
        double em = json_number_value(json_object_get(eager, "max_flip_margin_vs_fp32"));
        printf("  largest HF-fp32 top-1 margin flipped by HF-bf16 with eager experts: %.4g\n", em);
        if (em > max_margin_hf) max_margin_hf = em;
    }
    ck_assert_msg(max_margin_ls <= BF16_K * max_margin_hf, "%s: lockstep-bf16 flips an HF-fp32 top-1 "
                  "with margin %.4g > %.1f x the largest HF-bf16 flips (%.4g)", L.name, max_margin_ls,
                  BF16_K, max_margin_hf);
    ls_engine_destroy(e);
    unload(&L);
}
END_TEST


/* ---- lockstep's own bitwise goldens ------------------------------------------------------- */

static void put_u32(ls_sha256 *h, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    ls_error err;
    ck_assert(ls_sha256_update(h, b, 4, &err) == LS_OK);
}

static void put_digest(ls_sha256 *h, const ls_trace_digest *d)
{
    uint8_t b[3] = {(uint8_t)d->layer, (uint8_t)(d->layer >> 8), d->kind};
    ls_error err;
    ck_assert(ls_sha256_update(h, b, 3, &err) == LS_OK);
    ck_assert(ls_sha256_update(h, d->digest.bytes, 32, &err) == LS_OK);
}

/* Canonical bytes of a record (little-endian): pos, token, next token,
 * logprob bits, top-5 ids, top-5 logprob bits, n_digests, then every digest
 * as (layer u16, kind u8, 32 bytes) in record order. */
static void put_record(ls_sha256 *h, const ls_trace_record *r)
{
    put_u32(h, r->pos);
    put_u32(h, (uint32_t)r->token);
    put_u32(h, (uint32_t)r->next_token);
    put_u32(h, r->logprob_bits);
    for (int j = 0; j < 5; j++) put_u32(h, (uint32_t)r->topk_ids[j]);
    for (int j = 0; j < 5; j++) put_u32(h, r->topk_logprob_bits[j]);
    put_u32(h, r->n_digests);
    for (uint32_t k = 0; k < r->n_digests; k++) put_digest(h, &r->digests[k]);
}

static void hash8(ls_sha256 *h, char out[9])
{
    ls_digest d;
    ls_error err;
    ck_assert(ls_sha256_final(h, &d, &err) == LS_OK);
    char hex[65];
    ls_digest_to_hex(&d, hex);
    memcpy(out, hex, 8);
    out[8] = 0;
}

/* One line per record: "pos token next logprob-bits top5-hash L0 L1 ...",
 * the hashes being the first 32 bits of SHA-256 over the top-5 (ids, bits)
 * and over each trace layer's digests. */
static char *position_line(const ls_trace_record *r, int n_tl)
{
    size_t cap = 64 + 9 * (size_t)(n_tl + 1);
    char *line = malloc(cap), h8[9];
    ls_sha256 h;
    ls_error err;
    ck_assert(ls_sha256_init(&h, &err) == LS_OK);
    for (int j = 0; j < 5; j++) put_u32(&h, (uint32_t)r->topk_ids[j]);
    for (int j = 0; j < 5; j++) put_u32(&h, r->topk_logprob_bits[j]);
    hash8(&h, h8);
    int off = snprintf(line, cap, "%u %d %d %08x %s", r->pos, r->token, r->next_token,
                       r->logprob_bits, h8);
    for (int l = 0; l < n_tl; l++) {
        ck_assert(ls_sha256_init(&h, &err) == LS_OK);
        for (uint32_t k = 0; k < r->n_digests; k++)
            if (r->digests[k].layer == l) put_digest(&h, &r->digests[k]);
        hash8(&h, h8);
        off += snprintf(line + off, cap - (size_t)off, " %s", h8);
    }
    return line;
}

static json_t *strict_run(ls_engine *e, const char *act, const char *mode, int seq, const recs *t,
                          const int32_t *gen)
{
    int n_tl;
    const ls_trace_layer *tl = ls_engine_layers(e, &n_tl);
    (void)tl;
    json_t *run = json_object();
    char name[96];
    snprintf(name, sizeof name, "%s %s seq %d", act, mode, seq);
    json_object_set_new(run, "run", json_string(name));
    json_object_set_new(run, "records", json_integer(t->n));
    if (gen) {
        json_t *g = json_array();
        for (int k = 0; k < GEN_STEPS; k++) json_array_append_new(g, json_integer(gen[k]));
        json_object_set_new(run, "generated", g);
    }
    ls_sha256 h;
    ls_error err;
    ck_assert(ls_sha256_init(&h, &err) == LS_OK);
    json_t *lines = json_array();
    for (long i = 0; i < t->n; i++) {
        put_record(&h, &t->v[i].r);
        char *line = position_line(&t->v[i].r, n_tl);
        json_array_append_new(lines, json_string(line));
        free(line);
    }
    ls_digest d;
    ck_assert(ls_sha256_final(&h, &d, &err) == LS_OK);
    char hex[65];
    ls_digest_to_hex(&d, hex);
    json_object_set_new(run, "sha256", json_string(hex));
    json_t *last = json_array();
    const ls_trace_record *r = &t->v[t->n - 1].r;
    for (uint32_t k = 0; k < r->n_digests; k++) {
        char item[128];
        ls_digest_to_hex(&r->digests[k].digest, hex);
        snprintf(item, sizeof item, "%u %s %s", r->digests[k].layer,
                 ls_digest_kind_name((ls_digest_kind)r->digests[k].kind), hex);
        json_array_append_new(last, json_string(item));
    }
    json_object_set_new(run, "last_position_digests", last);
    json_object_set_new(run, "positions", lines);
    return run;
}

/* Runs every strict run of a model: for bf16 then fp32 activations, replay
 * of each sequence, then greedy rollout (GEN_STEPS) from prompts 1 and 2. */
static json_t *strict_doc(const loaded *L, int32_t *const *seqs, const long *lens, int n_seqs)
{
    json_t *doc = json_object();
    json_object_set_new(doc, "format", json_string("lockstep-strict-goldens"));
    json_object_set_new(doc, "version", json_integer(1));
    json_object_set_new(doc, "model", json_string(L->name));
    json_object_set_new(doc, "about", json_string(
        "lockstep CPU strict-path results, bit for bit; checked by tests/test_goldens.c, "
        "regenerated by harness/goldens/update_strict (see goldens/README.md)"));
    json_t *runs = json_array(), *layers = json_array();
    /* an FP8 model: every run in dequant, then in w8a8 mode */
    int fp8 = L->m->cfg.fp8;
    for (int mode = 0; mode < (fp8 ? 4 : 2); mode++) {
        int act = !(mode & 1), w8a8 = mode >= 2;
        ls_engine *e = mk_engine_fp8(L, act, w8a8);
        if (mode == 0) {
            int n_tl;
            const ls_trace_layer *tl = ls_engine_layers(e, &n_tl);
            for (int l = 0; l < n_tl; l++) {
                char nm[64];
                if (tl[l].decoder_layer >= 0)
                    snprintf(nm, sizeof nm, "%s %d", ls_layer_family_name(tl[l].family), tl[l].decoder_layer);
                else
                    snprintf(nm, sizeof nm, "%s", ls_layer_family_name(tl[l].family));
                json_array_append_new(layers, json_string(nm));
            }
        }
        char an[32];
        snprintf(an, sizeof an, "%s%s", act ? "bf16" : "fp32",
                 !fp8 ? "" : w8a8 ? " fp8-w8a8" : " fp8-dequant");
        for (int s = 0; s < n_seqs; s++) {
            recs t = {0};
            run_replay(e, (uint32_t)s, seqs[s], lens[s], &t);
            json_array_append_new(runs, strict_run(e, an, "replay", s, &t, NULL));
            recs_free(&t);
        }
        for (int s = 1; s <= 2; s++) {
            recs t = {0};
            int32_t gen[GEN_STEPS];
            run_greedy(e, (uint32_t)s, seqs[s], lens[s], gen, &t);
            json_array_append_new(runs, strict_run(e, an, "greedy", s, &t, gen));
            recs_free(&t);
        }
        ls_engine_destroy(e);
    }
    json_object_set_new(doc, "trace_layers", layers);
    json_object_set_new(doc, "runs", runs);
    return doc;
}

/* Compares a recomputed strict document with the committed one; returns 1
 * and a message naming the first run, record and trace layer (or record
 * field) that changed, 0 when equal. */
static int strict_diff(const char *path, const json_t *want, const json_t *got, char *msg, size_t msz)
{
    const json_t *wr = json_object_get(want, "runs"), *gr = json_object_get(got, "runs");
    const json_t *names = json_object_get(got, "trace_layers");
    if (json_array_size(wr) != json_array_size(gr)) {
        snprintf(msg, msz, "%s: %zu runs stored, %zu computed", path, json_array_size(wr),
                 json_array_size(gr));
        return 1;
    }
    for (size_t i = 0; i < json_array_size(gr); i++) {
        const json_t *a = json_array_get(wr, i), *b = json_array_get(gr, i);
        const char *run = json_string_value(json_object_get(b, "run"));
        if (!json_equal(json_object_get(a, "run"), json_object_get(b, "run"))) {
            snprintf(msg, msz, "%s: run %zu is '%s', stored '%s'", path, i, run,
                     json_string_value(json_object_get(a, "run")));
            return 1;
        }
        if (json_equal(a, b)) continue;
        const json_t *pa = json_object_get(a, "positions"), *pb = json_object_get(b, "positions");
        for (size_t k = 0; k < json_array_size(pb) && k < json_array_size(pa); k++) {
            const char *la = json_string_value(json_array_get(pa, k));
            const char *lb = json_string_value(json_array_get(pb, k));
            if (!la || !lb || strcmp(la, lb) == 0) continue;
            /* fields: pos token next logprob top5 L0 L1 ... */
            char *ca = strdup(la), *cb = strdup(lb), *sa, *sb;
            char *fa = strtok_r(ca, " ", &sa), *fb = strtok_r(cb, " ", &sb);
            int f = 0;
            while (fa && fb && strcmp(fa, fb) == 0) {
                fa = strtok_r(NULL, " ", &sa), fb = strtok_r(NULL, " ", &sb);
                f++;
            }
            static const char *const fields[] = {"position", "token", "next token", "logprob bits",
                                                 "top-5 (ids, logprob bits)"};
            char what[160];
            if (f < 5)
                snprintf(what, sizeof what, "%s", fields[f]);
            else
                snprintf(what, sizeof what, "trace layer %d (%s) digests", f - 5,
                         json_string_value(json_array_get(names, (size_t)(f - 5))));
            snprintf(msg, msz, "%s: run '%s', record %zu (position %lu): first change in %s: "
                     "stored '%s', now '%s' (stored line '%s', now '%s')", path, run, k,
                     strtoul(lb, NULL, 10), what, fa ? fa : "", fb ? fb : "", la, lb);
            free(ca), free(cb);
            return 1;
        }
        const json_t *da = json_object_get(a, "last_position_digests"), *db = json_object_get(b, "last_position_digests");
        for (size_t k = 0; k < json_array_size(db); k++)
            if (!json_equal(json_array_get(da, k), json_array_get(db, k))) {
                snprintf(msg, msz, "%s: run '%s' last position digest %zu: stored '%s', now '%s'",
                         path, run, k, json_string_value(json_array_get(da, k)),
                         json_string_value(json_array_get(db, k)));
                return 1;
            }
        snprintf(msg, msz, "%s: run '%s' differs (sha256 stored %s, now %s; records %lld vs %lld)",
                 path, run, json_string_value(json_object_get(a, "sha256")),
                 json_string_value(json_object_get(b, "sha256")),
                 (long long)json_integer_value(json_object_get(a, "records")),
                 (long long)json_integer_value(json_object_get(b, "records")));
        return 1;
    }
    return 0;
}

/* The comparator names a planted change: one trace layer's digest hash, then
 * the logprob bits, of one record of one run. */
static void strict_diff_selftest(const json_t *doc)
{
    static const int field[2] = {5 + 3, 3};
    static const char *const want[2] = {"trace layer 3 (", "logprob bits"};
    for (int c = 0; c < 2; c++) {
        json_t *mut = json_deep_copy(doc);
        json_t *run = json_array_get(json_object_get(mut, "runs"), 2);
        json_t *lines = json_object_get(run, "positions");
        char *line = strdup(json_string_value(json_array_get(lines, 10)));
        char *p = line;
        for (int f = 0; f < field[c]; f++) p = strchr(p, ' ') + 1;
        *p = *p == '0' ? '1' : '0'; /* one hex digit of that field */
        json_array_set_new(lines, 10, json_string(line));
        char msg[2048];
        ck_assert_msg(strict_diff("selftest", doc, mut, msg, sizeof msg), "planted change not found");
        ck_assert_msg(strstr(msg, "record 10 ") && strstr(msg, want[c]) &&
                      strstr(msg, json_string_value(json_object_get(run, "run"))),
                      "planted change in '%s' of record 10 reported as: %s", want[c], msg);
        free(line);
        json_decref(mut);
    }
}

static int g_update;

static void strict_check_or_update(const char *path, const json_t *got)
{
    if (g_update) {
        ck_assert_msg(json_dump_file(got, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER) == 0,
                      "cannot write %s", path);
        printf("wrote %s\n", path);
        return;
    }
    json_t *want;
    ls_error err;
    ck_assert_msg(ls_json_load_file(path, &want, &err) == LS_OK, "%s (regenerate with "
                  "harness/goldens/update_strict)", err.msg);
    char msg[2048];
    if (strict_diff(path, want, got, msg, sizeof msg)) ck_abort_msg("%s", msg);
    printf("%s: %zu runs bit-identical\n", path, json_array_size(json_object_get(got, "runs")));
    fflush(stdout);
    json_decref(want);
}

START_TEST(test_strict_goldens)
{
    loaded L = {0};
    load_golden(&L, GOLDENS[_i]);
    int32_t *seqs[4];
    long lens[4];
    for (int s = 0; s < 4; s++)
        seqs[s] = json_tokens(json_object_get(find_run(&L, "teacher_forced", "float32", s), "tokens"), &lens[s]);
    json_t *doc = strict_doc(&L, seqs, lens, 4);
    char path[4200];
    snprintf(path, sizeof path, "%s/goldens/%s/lockstep-strict.json", LS_SOURCE_DIR, L.name);
    strict_check_or_update(path, doc);
    if (_i == 0) strict_diff_selftest(doc);
    json_decref(doc);
    for (int s = 0; s < 4; s++) free(seqs[s]);
    unload(&L);
}
END_TEST

/* The same Qwen3.5 weights in the fused release layout (goldens/<name>/) and
 * per expert (goldens/<name>/per_expert/, as save_pretrained writes them,
 * sharded for tiny_b): every strict run gives the same records, bit for bit
 * (only the fingerprint, which hashes the files, differs). */
START_TEST(test_qwen35_layouts_identical)
{
    const char *name = GOLDENS[FIRST_QWEN35 + _i];
    loaded F = {0}, P = {0};
    load_golden(&F, name);
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/goldens/%s/per_expert", LS_SOURCE_DIR, name);
    load_dir(&P, name, dir);
    ck_assert_msg(ls_checkpoint_count(F.ck) < ls_checkpoint_count(P.ck),
                  "%s: per_expert/ (%zu tensors) is not the per-expert layout of the fused one (%zu)",
                  name, ls_checkpoint_count(P.ck), ls_checkpoint_count(F.ck));
    int32_t *seqs[4];
    long lens[4];
    for (int s = 0; s < 4; s++)
        seqs[s] = json_tokens(json_object_get(find_run(&F, "teacher_forced", "float32", s), "tokens"), &lens[s]);
    json_t *a = strict_doc(&F, seqs, lens, 4), *b = strict_doc(&P, seqs, lens, 4);
    char msg[2048];
    if (strict_diff(dir, a, b, msg, sizeof msg)) ck_abort_msg("fused vs per-expert: %s", msg);
    printf("%s: fused and per-expert layouts give identical records (%zu runs)\n", name,
           json_array_size(json_object_get(a, "runs")));
    fflush(stdout);
    json_decref(a);
    json_decref(b);
    for (int s = 0; s < 4; s++) free(seqs[s]);
    unload(&F);
    unload(&P);
}
END_TEST

START_TEST(test_strict_synth_tiny)
{
    ls_synth_config cfg;
    ls_error err;
    ck_assert_msg(ls_synth_preset("tiny", &cfg, &err) == LS_OK, "%s", err.msg);
    char *tmp = ls_test_tmpdir("goldens"), dir[4200];
    snprintf(dir, sizeof dir, "%s/tiny", tmp);
    ls_synth_options opt = ls_synth_options_default();
    ck_assert_msg(ls_synth_write(&cfg, SYNTH_SEED, dir, &opt, &err) == LS_OK, "%s", err.msg);
    loaded L = {0};
    load_dir(&L, "synth-tiny", dir);
    long lens[4] = {1, 7, 65, 130};
    int32_t *seqs[4];
    uint64_t x = 0x5eed5eedull;
    for (int s = 0; s < 4; s++) {
        seqs[s] = malloc(sizeof(int32_t) * (size_t)lens[s]);
        for (long i = 0; i < lens[s]; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            seqs[s][i] = (int32_t)((x >> 33) % (uint64_t)L.m->cfg.vocab);
        }
    }
    json_t *doc = strict_doc(&L, seqs, lens, 4);
    json_object_set_new(doc, "synth", json_pack("{s:s, s:I}", "preset", "tiny", "seed", (json_int_t)SYNTH_SEED));
    char path[4200];
    snprintf(path, sizeof path, "%s/goldens/synth-tiny-strict.json", LS_SOURCE_DIR);
    strict_check_or_update(path, doc);
    json_decref(doc);
    for (int s = 0; s < 4; s++) free(seqs[s]);
    unload(&L);
    char *out = NULL;
    ls_test_sh(&out, "rm -rf '%s'", tmp);
    free(out);
    free(tmp);
}
END_TEST

int main(int argc, char **argv)
{
    g_update = argc == 2 && strcmp(argv[1], "--update-strict") == 0;
    if (argc > 1 && !g_update) {
        fprintf(stderr, "usage: test_goldens [--update-strict]\n");
        return 2;
    }
    Suite *s = suite_create("goldens");
    TCase *tc = tcase_create("goldens");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_strict_goldens, 0, N_ALL_GOLDENS);
    tcase_add_test(tc, test_strict_synth_tiny);
    suite_add_tcase(s, tc);
    if (g_update) {
        /* only the strict goldens, in this process (no fork) so a failure stops */
        return ls_test_run_suite(s, 1) ? 1 : 0;
    }
    tcase_add_loop_test(tc, test_qwen35_layouts_identical, 0, N_GOLDENS - FIRST_QWEN35);
    tcase_add_loop_test(tc, test_fp32_vs_transformers, 0, N_ALL_GOLDENS);
    tcase_add_loop_test(tc, test_fp32_vs_transformers_chunk_aligned, 0, N_ALL_GOLDENS);
    tcase_add_loop_test(tc, test_bf16_vs_transformers, 0, N_GOLDENS);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
