/* The paged KV cache on the strict CUDA engine: rollouts, replays and a
 * GRPO group with prefix reuse and preemption, with pages of 16, 17 and 100
 * positions, equal bit for bit (tokens, logprob bits, top-5, every digest)
 * the contiguous CUDA run and the CPU engine's contiguous run, on the synth
 * `tiny` and `qwen3.5-tiny` checkpoints in bf16 and fp32 activations. The
 * prompt lengths sit at the ceil-division boundaries of each page size
 * (lengths = 0, 1, page - 1 mod page; sequences ending on a page); several
 * sequences per step run the batched kernels (kv_append_batch,
 * attention_batch), a single sequence the per-sequence path (copy_blocks
 * runs, attention). LS_GPU_QUICK=1 (the sanitizer runs) keeps the
 * checks but on `tiny` in bf16 with the page of 17 (which divides no
 * prompt length) and max_rows 7 only. */
#include "gpu_testutil.h"

#include "engine_records.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "run/run.h"
#include "synth/synth.h"
#include "synth_models.h"
#include "testutil.h"

#define CAP 112
#define MAX_NEW 4

static ls_checkpoint *g_ck[2];
static ls_model *g_m[2];

static void setup(void)
{
    if (g_m[0]) return;
    static const char *const presets[2] = {"tiny", "qwen3.5-tiny"};
    static const uint64_t seeds[2] = {51, 52};
    ls_test_open_synth_models("gpu_paged", 2, presets, seeds, g_ck, g_m);
}

static ls_engine *engine(const ls_model *m, const char *backend, int act_bf16, long slots, long max_rows,
                         long page)
{
    ls_error err;
    ls_error_clear(&err);
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.act_bf16 = act_bf16;
    o.state_digest_every = 3;
    o.max_rows = max_rows;
    o.kv_page = page;
    ls_engine *e = NULL;
    ck_assert_msg(ls_gpu_engine_open(m, backend, &o, slots, CAP, &e, &err) == LS_OK, "%s", err.msg);
    return e;
}

static const long lens[] = {15, 16, 17, 33, 34, 63, 64, 65, 99, 100, 101};
#define N_PROMPTS ((long)(sizeof lens / sizeof lens[0]))

static void make_prompts(const ls_model *m, int32_t t[][101], ls_sequence *pr)
{
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (long s = 0; s < N_PROMPTS; s++) {
        for (long i = 0; i < lens[s]; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            t[s][i] = (int32_t)((x >> 33) % (uint64_t)m->cfg.vocab);
        }
        pr[s] = (ls_sequence){(uint32_t)(7 + s), t[s], lens[s], lens[s]};
    }
}

static void check(const char *what, int model, int act, const recs *want, recs *got)
{
    recs_sort(got);
    char msg[512];
    int d = recs_diff(want, got, 0, msg, sizeof msg);
    printf("  %s %s, model %d, %s: %s\n", d ? "MISMATCH" : "ok", what, model, act ? "bf16" : "fp32", msg);
    fflush(stdout);
    ck_assert_msg(want->n > 0 && want->n == got->n, "%s: %ld records vs %ld", what, want->n, got->n);
    ck_assert_msg(d == 0, "%s, model %d, %s: %s", what, model, act ? "bf16" : "fp32", msg);
}

static const long pages[] = {16, 17, 100};
static int g_quick;
#define PAGE_FIRST (g_quick ? 1 : 0) /* quick: the page of 17 alone */
#define PAGE_END (g_quick ? 2 : 3)

START_TEST(test_paged_cuda_equals_contiguous_and_cpu)
{
    setup();
    const ls_model *m = g_m[_i / 2];
    int act = _i % 2 == 0;
    static int32_t t[N_PROMPTS][101];
    ls_sequence pr[N_PROMPTS];
    make_prompts(m, t, pr);
    ls_error err;
    ls_error_clear(&err);
    ls_sampling s = {LS_SAMPLING_SEEDED, 9, 1.0f, 0, 1.0f};
    char what[128];

    /* rollout: CPU contiguous is the reference */
    recs want = {0};
    ls_engine *e = engine(m, "cpu", act, N_PROMPTS, 128, 0);
    ck_assert_msg(ls_run_rollout(e, pr, N_PROMPTS, MAX_NEW, &s, NULL, recs_sink, &want, &err) == LS_OK, "%s",
                  err.msg);
    ls_engine_destroy(e);
    recs_sort(&want);
    for (int p = g_quick ? PAGE_FIRST : -1; p < PAGE_END; p++)
        for (int r = g_quick; r < 2; r++) {
            long page = p < 0 ? 0 : pages[p], rows = r ? 7 : 128;
            recs got = {0};
            e = engine(m, "cuda", act, N_PROMPTS, rows, page);
            ck_assert_msg(ls_run_rollout(e, pr, N_PROMPTS, MAX_NEW, &s, NULL, recs_sink, &got, &err) == LS_OK,
                          "%s", err.msg);
            ck_assert_int_eq(ls_engine_kv_pages_used(e), 0);
            ls_engine_destroy(e);
            snprintf(what, sizeof what, "cuda rollout, page %ld, max_rows %ld vs cpu contiguous", page, rows);
            check(what, _i / 2, act, &want, &got);
            recs_free(&got);
        }
    recs_free(&want);

    /* one sequence alone: the per-sequence path (no batched op) */
    want = (recs){0};
    e = engine(m, "cpu", act, 1, 9, 0);
    ck_assert_msg(ls_run_rollout(e, &pr[10], 1, MAX_NEW, &s, NULL, recs_sink, &want, &err) == LS_OK, "%s",
                  err.msg);
    ls_engine_destroy(e);
    recs_sort(&want);
    for (int p = PAGE_FIRST; p < PAGE_END; p++) {
        recs got = {0};
        e = engine(m, "cuda", act, 1, 9, pages[p]);
        ck_assert_msg(ls_run_rollout(e, &pr[10], 1, MAX_NEW, &s, NULL, recs_sink, &got, &err) == LS_OK, "%s",
                      err.msg);
        ls_engine_destroy(e);
        snprintf(what, sizeof what, "cuda single sequence, page %ld, chunks of 9", pages[p]);
        check(what, _i / 2, act, &want, &got);
        recs_free(&got);
    }
    recs_free(&want);

    /* replay in chunks of 5 (crossing pages), prompts of half the length */
    ls_sequence rp[N_PROMPTS];
    for (long i = 0; i < N_PROMPTS; i++) {
        rp[i] = pr[i];
        rp[i].prompt_len = lens[i] / 2;
    }
    want = (recs){0};
    e = engine(m, "cpu", act, N_PROMPTS, 64, 0);
    ck_assert_msg(ls_run_replay(e, rp, N_PROMPTS, 5, recs_sink, &want, &err) == LS_OK, "%s", err.msg);
    ls_engine_destroy(e);
    recs_sort(&want);
    for (int p = PAGE_FIRST; p < PAGE_END; p++) {
        recs got = {0};
        e = engine(m, "cuda", act, N_PROMPTS, 64, pages[p]);
        ck_assert_msg(ls_run_replay(e, rp, N_PROMPTS, 5, recs_sink, &got, &err) == LS_OK, "%s", err.msg);
        ls_engine_destroy(e);
        snprintf(what, sizeof what, "cuda replay chunk 5, page %ld vs cpu contiguous", pages[p]);
        check(what, _i / 2, act, &want, &got);
        recs_free(&got);
    }
    recs_free(&want);

    /* GRPO n=8 over prompts 1 and 2 (16 and 17 tokens; the second made to
     * share 12 with the first), prefix reuse and seeded preemption, paged,
     * against the CPU plain rollout */
    ls_sequence gp[2] = {pr[1], pr[2]}, seqs[16];
    memcpy(t[2], t[1], sizeof(int32_t) * 12); /* prompt 2 shares 12 tokens with prompt 1 */
    t[2][12] = (t[1][12] + 1) % (int32_t)m->cfg.vocab;
    ck_assert_msg(ls_run_group_sequences(gp, 2, 8, seqs, &err) == LS_OK, "%s", err.msg);
    want = (recs){0};
    e = engine(m, "cpu", act, 16, 64, 0);
    ck_assert_msg(ls_run_rollout(e, seqs, 16, MAX_NEW, &s, NULL, recs_sink, &want, &err) == LS_OK, "%s", err.msg);
    ls_engine_destroy(e);
    recs_sort(&want);
    ls_run_eviction *plan = NULL;
    long n_plan = 0;
    ck_assert_msg(ls_run_preempt_plan(31, 16, MAX_NEW, &plan, &n_plan, &err) == LS_OK, "%s", err.msg);
    for (int p = PAGE_FIRST; p < PAGE_END; p++) {
        ls_rollout_opts o;
        ls_rollout_opts_default(&o);
        o.samples_per_prompt = 8;
        o.prefix_cache = LS_PREFIX_CACHE_ANY;
        o.evictions = plan;
        o.n_evictions = n_plan;
        recs got = {0};
        e = engine(m, "cuda", act, ls_run_group_slots(2, &o), 7, pages[p]);
        ck_assert_msg(ls_run_rollout_group(e, gp, 2, MAX_NEW, &s, &o, NULL, recs_sink, &got, &err) == LS_OK, "%s",
                      err.msg);
        ck_assert_int_eq(ls_engine_kv_pages_used(e), 0);
        ls_engine_destroy(e);
        snprintf(what, sizeof what, "cuda GRPO n=8, prefix any, seeded preemption, page %ld", pages[p]);
        check(what, _i / 2, act, &want, &got);
        recs_free(&got);
    }
    free(plan);
    recs_free(&want);
}
END_TEST

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
    Suite *s = suite_create("gpu_paged");
    TCase *tc = tcase_create("paged");
    tcase_set_timeout(tc, 900);
    g_quick = getenv("LS_GPU_QUICK") != NULL;
    /* 2 models x bf16, fp32; quick: tiny in bf16 */
    tcase_add_loop_test(tc, test_paged_cuda_equals_contiguous_and_cpu, 0, g_quick ? 1 : 4);
    suite_add_tcase(s, tc);
    return ls_gpu_run_suite(s);
}
