/* GRPO groups, prefix reuse and preemption on the strict CUDA engine: the
 * carried-state copies (fork, snapshots) go through the CUDA backend's zero
 * and copy_blocks, and each group run's records equal, bit for bit, the CPU
 * engine's plain rollout of the same sequences (tokens, logprob bits, top-5,
 * every digest), on the synth `tiny` and `qwen3.5-tiny` checkpoints, in
 * bf16 and fp32 activations. */
#include "gpu_testutil.h"

#include "engine_records.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "run/run.h"
#include "synth/synth.h"
#include "synth_models.h"
#include "testutil.h"

#define N_PROMPTS 4
#define N_SAMPLES 8
#define MAX_NEW 6

static ls_checkpoint *g_ck[2];
static ls_model *g_m[2];

static void setup(void)
{
    if (g_m[0]) return;
    static const char *const presets[2] = {"tiny", "qwen3.5-tiny"};
    static const uint64_t seeds[2] = {21, 22};
    ls_test_open_synth_models("gpu_group", 2, presets, seeds, g_ck, g_m);
}

static ls_engine *engine(const ls_model *m, const char *backend, int act_bf16, long slots, long max_rows)
{
    ls_error err;
    ls_error_clear(&err);
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.act_bf16 = act_bf16;
    o.state_digest_every = 3;
    o.max_rows = max_rows;
    ls_engine *e = NULL;
    ck_assert_msg(ls_gpu_engine_open(m, backend, &o, slots, 64, &e, &err) == LS_OK, "%s", err.msg);
    return e;
}

/* Prompts 1 and 2 share 9 and 13 tokens with prompt 0; prompt 3 shares none. */
static void make_prompts(const ls_model *m, int32_t t[N_PROMPTS][24], ls_sequence *pr)
{
    static const long lens[N_PROMPTS] = {17, 12, 20, 5};
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int s = 0; s < N_PROMPTS; s++)
        for (long i = 0; i < 24; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            t[s][i] = (int32_t)((x >> 33) % (uint64_t)m->cfg.vocab);
        }
    memcpy(t[1], t[0], sizeof(int32_t) * 9);
    t[1][9] = (t[0][9] + 1) % (int32_t)m->cfg.vocab;
    memcpy(t[2], t[0], sizeof(int32_t) * 13);
    t[2][13] = (t[0][13] + 1) % (int32_t)m->cfg.vocab;
    t[3][0] = (t[0][0] + 1) % (int32_t)m->cfg.vocab;
    for (int s = 0; s < N_PROMPTS; s++) pr[s] = (ls_sequence){(uint32_t)(40 + s), t[s], lens[s], lens[s]};
}

START_TEST(test_group_cuda_equals_cpu_plain)
{
    setup();
    const ls_model *m = g_m[_i / 2];
    int act = _i % 2 == 0;
    int32_t t[N_PROMPTS][24];
    ls_sequence pr[N_PROMPTS], seqs[N_PROMPTS * N_SAMPLES];
    make_prompts(m, t, pr);
    ls_error err;
    ls_error_clear(&err);
    ls_sampling s = {LS_SAMPLING_SEEDED, 5, 1.0f, 0, 1.0f};
    ck_assert_msg(ls_run_group_sequences(pr, N_PROMPTS, N_SAMPLES, seqs, &err) == LS_OK, "%s", err.msg);
    recs want = {0};
    ls_engine *cpu = engine(m, "cpu", act, N_PROMPTS * N_SAMPLES, 64);
    ck_assert_msg(ls_run_rollout(cpu, seqs, N_PROMPTS * N_SAMPLES, MAX_NEW, &s, NULL, recs_sink, &want, &err) == LS_OK,
                  "%s", err.msg);
    ls_engine_destroy(cpu);
    recs_sort(&want);
    ls_run_eviction *plan = NULL;
    long n_plan = 0;
    ck_assert_msg(ls_run_preempt_plan(77, N_PROMPTS * N_SAMPLES, MAX_NEW, &plan, &n_plan, &err) == LS_OK, "%s",
                  err.msg);
    struct {
        const char *name;
        ls_prefix_cache pc;
        long block;
        int preempt;
        long rows;
    } cases[] = {{"GRPO n=8", LS_PREFIX_CACHE_OFF, 64, 0, 64},
                 {"GRPO n=8, prefix any", LS_PREFIX_CACHE_ANY, 64, 0, 7},
                 {"GRPO n=8, prefix aligned 4", LS_PREFIX_CACHE_ALIGNED, 4, 0, 64},
                 {"GRPO n=8, seeded preemption", LS_PREFIX_CACHE_OFF, 64, 1, 16}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ls_rollout_opts o;
        ls_rollout_opts_default(&o);
        o.samples_per_prompt = N_SAMPLES;
        o.prefix_cache = cases[c].pc;
        o.prefix_block = cases[c].block;
        if (cases[c].preempt) {
            o.evictions = plan;
            o.n_evictions = n_plan;
        }
        ls_rollout_stats st;
        o.stats = &st;
        recs got = {0};
        ls_engine *gpu = engine(m, "cuda", act, ls_run_group_slots(N_PROMPTS, &o), cases[c].rows);
        ck_assert_msg(ls_run_rollout_group(gpu, pr, N_PROMPTS, MAX_NEW, &s, &o, NULL, recs_sink, &got, &err) == LS_OK,
                      "%s: %s", cases[c].name, err.msg);
        ls_engine_destroy(gpu);
        recs_sort(&got);
        char msg[512];
        int d = recs_diff(&want, &got, 0, msg, sizeof msg);
        printf("  %s %s, model %d, %s: %s (forks %ld, reused %ld, evictions %ld)\n", d ? "MISMATCH" : "ok",
               cases[c].name, _i / 2, act ? "bf16" : "fp32", msg, st.forks, st.positions_reused, st.evictions);
        fflush(stdout);
        ck_assert_msg(d == 0, "%s, model %d, %s: cuda group vs cpu plain: %s", cases[c].name, _i / 2,
                      act ? "bf16" : "fp32", msg);
        recs_free(&got);
    }
    free(plan);
    recs_free(&want);
}
END_TEST

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
    Suite *s = suite_create("gpu_group");
    TCase *tc = tcase_create("group");
    tcase_set_timeout(tc, 900);
    /* 2 models x bf16, fp32; LS_GPU_QUICK=1 (the sanitizer runs): tiny in bf16 */
    tcase_add_loop_test(tc, test_group_cuda_equals_cpu_plain, 0, getenv("LS_GPU_QUICK") ? 1 : 4);
    suite_add_tcase(s, tc);
    return ls_gpu_run_suite(s);
}
