/* Pinned cuBLASLt GEMM algorithms (kernels/tc/gemm_pin.h): qualification of
 * every candidate for batch invariance on two weight shapes (reduced under
 * LS_GPU_QUICK=1, one small shape and four candidates under a sanitizer
 * (LS_GPU_SANITIZER), the Qwen3-Next linears otherwise), at least one qualified
 * per shape, the fastest pinned as a record that survives its canonical
 * text and rebuilds into the same bits as the qualification run (the whole
 * reference output at M = max_rows, and row 0 at M = 1); records naming
 * split-K, a reduction scheme, another cuBLASLt version, an unqualified or
 * untried configuration refused; rows beyond the qualified M refused. Prints
 * each shape's table (the default heuristic per M, then every candidate). */
#include "gpu_testutil.h"

#ifdef LOCKSTEP_HAVE_CUDA
#include "tc/gemm_pin.h"

#define WORKSPACE_BYTES ((size_t)32 << 20)

static ls_gemm_lt *lt;

static void expect_refused(ls_status st, const ls_error *err, const char *what, const char *needle)
{
    ck_assert_msg(st == LS_E_UNSUPPORTED, "%s: expected a refusal (unsupported), got status %d: %s",
                  what, (int)st, err->msg);
    ck_assert_msg(strstr(err->msg, needle) != NULL, "%s: the refusal should name \"%s\": %s", what,
                  needle, err->msg);
    printf("refused as it should (%s): %s\n", what, err->msg);
}

/* The record alone: canonical text, strict parsing. */
START_TEST(test_record_text)
{
    ls_error err;
    ls_error_clear(&err);
    ls_gemm_pin p, r;
    memset(&p, 0, sizeof p);
    p.n = 2048;
    p.k = 4096;
    p.cfg.algo_id = 66;
    p.cfg.tile = 20;
    p.cfg.stages = 35;
    p.cfg.splitk = 1;
    p.cfg.swizzle = 1;
    p.cfg.custom = 3;
    p.cfg.cluster_shape = 2;
    p.cublaslt_version = 130100;
    p.cc_major = 9;
    p.cc_minor = 0;
    p.qualified_rows = 1024;
    char a[512], b[512];
    ck_assert_msg(ls_gemm_pin_format(&p, a, sizeof a, &err) == LS_OK, "%s", err.msg);
    printf("record: %s\n", a);
    ck_assert_msg(ls_gemm_pin_parse(a, &r, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_gemm_pin_format(&r, b, sizeof b, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(strcmp(a, b) == 0, "round trip changed the record:\n%s\n%s", a, b);
    ck_assert(ls_gemm_config_equal(&p.cfg, &r.cfg) && r.n == p.n && r.k == p.k &&
              r.cublaslt_version == p.cublaslt_version && r.qualified_rows == p.qualified_rows &&
              r.cc_major == 9 && r.cc_minor == 0);
    /* a buffer one byte short */
    ck_assert(ls_gemm_pin_format(&p, b, strlen(a), &err) == LS_E_USAGE);

    ls_gemm_pin s = p;
    s.cfg.splitk = 4;
    ck_assert_msg(ls_gemm_pin_format(&s, b, sizeof b, &err) == LS_OK, "%s", err.msg);
    expect_refused(ls_gemm_pin_parse(b, &r, &err), &err, "parse, split-K 4", "split-K 4");
    s = p;
    s.cfg.reduction = 2;
    ck_assert_msg(ls_gemm_pin_format(&s, b, sizeof b, &err) == LS_OK, "%s", err.msg);
    expect_refused(ls_gemm_pin_parse(b, &r, &err), &err, "parse, reduction scheme 2",
                   "reduction scheme 2");
    s = p;
    s.qualified_rows = 0;
    ck_assert_msg(ls_gemm_pin_format(&s, b, sizeof b, &err) == LS_OK, "%s", err.msg);
    expect_refused(ls_gemm_pin_parse(b, &r, &err), &err, "parse, never qualified", "never qualified");

    /* malformed records: each names what is wrong */
    char c[700];
    static const char *const bad[][3] = {
        /* from, to (in the canonical text), what the message names */
        {"\"n\":2048,", "", "key \"n\" is missing"},
        {"linear_bf16_f32_tn", "linear_fp8_f32_tn", "\"kind\" must be"},
        {"\"tile\":20,", "\"tile\":\"20\",", "\"tile\" must be an integer"},
        {"\"cc\":\"9.0\"", "\"cc\":\" 9.0\"", "\"cc\" must be"},
        {"\"custom\":3", "\"custom\":-3", "\"custom\" is -3"},
        {"{", "{\"extra\":1,", "unknown key \"extra\""},
        {"{", "[", "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *at = strstr(a, bad[i][0]);
        ck_assert_msg(at != NULL, "case %zu: %s not in %s", i, bad[i][0], a);
        snprintf(c, sizeof c, "%.*s%s%s", (int)(at - a), a, bad[i][1], at + strlen(bad[i][0]));
        ls_status st = ls_gemm_pin_parse(c, &r, &err);
        ck_assert_msg(st == LS_E_INPUT && strstr(err.msg, bad[i][2]),
                      "parse of %s: status %d, message %s (should name %s)", c, (int)st, err.msg,
                      bad[i][2]);
    }
    ck_assert_msg(ls_gemm_pin_parse("[1]", &r, &err) == LS_E_INPUT &&
                  strstr(err.msg, "not a JSON object"), "%s", err.msg);
}
END_TEST

static void qualify_shape(int64_t n, int64_t k, int64_t max_rows, int max_candidates)
{
    ls_error err;
    ls_error_clear(&err);
    ls_gemm_qualify_opts o;
    ls_gemm_qualify_opts_default(&o);
    o.n = n;
    o.k = k;
    o.max_rows = max_rows;
    o.max_candidates = max_candidates;
    o.time_reps = 5;
    ls_gemm_qual q;
    ls_status st = ls_gemm_qualify(lt, &o, &q, stdout, &err);
    ck_assert_msg(st == LS_OK, "qualification of [%lld x %lld]: %s", (long long)n, (long long)k,
                  err.msg);
    ls_gemm_qual_write_markdown(&q, stdout);
    int n_ok = 0;
    for (int i = 0; i < q.n_cand; i++) n_ok += q.cand[i].qualified;
    printf("[%lld x %lld]: %d of %d candidates qualified; default heuristic: %d distinct picks over "
           "%d Ms, %d with split-K or a reduction, row 0 first differs from M = 1 at M = %lld "
           "(-1: never)\n", (long long)n, (long long)k, n_ok, q.n_cand, q.heur_n_configs, q.n_ms,
           q.heur_splitk_ms, (long long)q.heur_first_row0_change);
    fflush(stdout);
    ck_assert_msg(q.n_cand > 0, "[%lld x %lld]: no candidate at all", (long long)n, (long long)k);
    ck_assert_msg(q.best >= 0, "[%lld x %lld]: none of %d candidates qualified", (long long)n,
                  (long long)k, q.n_cand);

    /* pin the fastest, through its canonical text */
    ls_gemm_pin pin, back;
    char text[512], text2[512];
    ck_assert_msg(ls_gemm_qual_pin(&q, q.best, &pin, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_gemm_pin_format(&pin, text, sizeof text, &err) == LS_OK, "%s", err.msg);
    printf("pinned: %s\n", text);
    ck_assert_msg(ls_gemm_pin_parse(text, &back, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_gemm_pin_format(&back, text2, sizeof text2, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(strcmp(text, text2) == 0, "record text changed:\n%s\n%s", text, text2);
    ck_assert_msg(ls_gemm_qual_admits(&q, &back, &err) == LS_OK, "%s", err.msg);

    /* rebuild and replay: the same bits as the qualification run */
    ls_gemm_plan *plan = NULL;
    ck_assert_msg(ls_gemm_pin_rebuild(lt, &back, &plan, &err) == LS_OK, "rebuild: %s", err.msg);
    float *y = NULL;
    ck_assert_msg(ls_cuda_malloc((void **)&y, sizeof(float) * (size_t)(max_rows * n), &err) == LS_OK,
                  "%s", err.msg);
    uint64_t h = 0;
    ck_assert_msg(ls_gemm_plan_run(plan, q.w_dev, q.x_dev, y, max_rows, NULL, &err) == LS_OK, "%s",
                  err.msg);
    ck_assert_msg(ls_gemm_hash_f32(y, max_rows * n, &h, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(h == q.cand[q.best].ref_hash,
                  "[%lld x %lld]: the rebuilt plan at M = %lld gives output hash %016llx, the "
                  "qualification run %016llx", (long long)n, (long long)k, (long long)max_rows,
                  (unsigned long long)h, (unsigned long long)q.cand[q.best].ref_hash);
    ck_assert_msg(ls_gemm_plan_run(plan, q.w_dev, q.x_dev, y, 1, NULL, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_gemm_hash_f32(y, n, &h, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(h == q.cand[q.best].row0_hash,
                  "[%lld x %lld]: the rebuilt plan at M = 1 gives row-0 hash %016llx, the "
                  "qualification run %016llx", (long long)n, (long long)k, (unsigned long long)h,
                  (unsigned long long)q.cand[q.best].row0_hash);
    printf("[%lld x %lld]: rebuilt record replays the qualification bits (M = %lld and M = 1)\n",
           (long long)n, (long long)k, (long long)max_rows);
    expect_refused(ls_gemm_plan_run(plan, q.w_dev, q.x_dev, y, max_rows + 1, NULL, &err), &err,
                   "more rows than qualified", "the qualification covered");
    ls_gemm_plan_destroy(plan);
    ls_cuda_free(y);

    /* refusals */
    ls_gemm_pin bad = back;
    bad.cfg.splitk = 2;
    plan = NULL;
    expect_refused(ls_gemm_pin_rebuild(lt, &bad, &plan, &err), &err, "rebuild, split-K 2",
                   "split-K 2");
    ck_assert(plan == NULL);
    bad = back;
    bad.cfg.reduction = 1;
    expect_refused(ls_gemm_pin_rebuild(lt, &bad, &plan, &err), &err, "rebuild, reduction scheme",
                   "reduction scheme 1");
    bad = back;
    bad.cublaslt_version = back.cublaslt_version + 1;
    expect_refused(ls_gemm_pin_rebuild(lt, &bad, &plan, &err), &err, "rebuild, another cuBLASLt",
                   "requalify");
    bad = back;
    bad.cfg.custom = 100000; /* beyond every algorithm's custom options */
    expect_refused(ls_gemm_pin_rebuild(lt, &bad, &plan, &err), &err, "rebuild, custom option 100000",
                   "not among them");
    expect_refused(ls_gemm_qual_admits(&q, &bad, &err), &err, "admit, untried configuration",
                   "did not try");
    ck_assert(plan == NULL);
    int unq = -1;
    for (int i = 0; i < q.n_cand && unq < 0; i++)
        if (!q.cand[i].qualified) unq = i;
    if (unq >= 0) {
        ls_gemm_pin p2;
        expect_refused(ls_gemm_qual_pin(&q, unq, &p2, &err), &err, "pin, unqualified candidate",
                       "not pinned");
        bad = back;
        bad.cfg = q.cand[unq].cfg;
        expect_refused(ls_gemm_qual_admits(&q, &bad, &err), &err,
                       "admit, a record naming an unqualified candidate", "unqualified");
    } else {
        printf("[%lld x %lld]: every one of the %d candidates qualified (the untried configuration "
               "above stands for the unqualified one)\n", (long long)n, (long long)k, q.n_cand);
    }
    ls_gemm_qual_free(&q);
}

START_TEST(test_qualify)
{
    int quick = getenv("LS_GPU_QUICK") != NULL;
    if (getenv("LS_GPU_SANITIZER")) {
        /* under a tool every cuBLASLt launch is instrumented: one shape,
         * M = 1 .. 34, four candidates */
        qualify_shape(512, 1024, 34, 4);
    } else if (quick) {
        qualify_shape(512, 1024, 130, 24);
        qualify_shape(1024, 256, 130, 24);
    } else {
        /* Qwen3-Next linears (docs/model.md): the attention output
         * projection [2048 x 4096], GDN's in_proj_qkvz [12288 x 2048], an
         * expert's gate or up projection [512 x 2048] */
        qualify_shape(2048, 4096, 1024, 512);
        qualify_shape(12288, 2048, 1024, 512);
        qualify_shape(512, 2048, 1024, 512);
    }
}
END_TEST

static void setup(void)
{
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_gemm_lt_create(WORKSPACE_BYTES, &lt, &err) == LS_OK, "%s", err.msg);
    printf("cuBLASLt version %lld\n", (long long)ls_gemm_lt_version());
}

static void teardown(void)
{
    ls_gemm_lt_destroy(lt);
    lt = NULL;
}
#endif

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
#ifdef LOCKSTEP_HAVE_CUDA
    Suite *s = suite_create("gpu_gemm_pin");
    TCase *tc = tcase_create("gemm_pin");
    tcase_set_timeout(tc, 1200);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_record_text);
    tcase_add_test(tc, test_qualify);
    suite_add_tcase(s, tc);
    return ls_gpu_run_suite(s);
#else
    return LS_GPU_SKIP;
#endif
}
