/* Whole-model strict CUDA engine = CPU reference engine, bit for bit: the
 * synth `tiny` checkpoint and every committed golden checkpoint (Qwen3-Next,
 * Qwen3.5 MoE, and FP8 block-quantised Qwen3.5 in both --fp8 modes), bf16 and
 * fp32 activations, greedy and seeded rollouts (tokens, logprob bits, top-5,
 * every digest), and replay at several chunkings on CUDA against the CPU's
 * whole-sequence replay. The same for the chunk-aligned GDN form
 * (docs/numerics.md §5.1) on prompts and rollouts that cross a chunk
 * boundary (positions 64) in prefill, decode and every replay chunking.
 * And one-token steps through step graphs, against the CPU and the CUDA
 * engine without them. (CUDA engines as ranks of several:
 * test_ranks_cuda.c.) */
#include "gpu_testutil.h"

#include "engine_records.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "run/run.h"
#include "synth_models.h"
#include "testutil.h"

#define N_SEQS 3
#define MAX_NEW 6
#define MAX_PROMPT 80

static const char *g_dirs[16];
static int g_n_dirs;

static void setup_models(void)
{
    if (g_n_dirs) return;
    char *tmp = ls_test_tmpdir("gpu_engine");
    static char tiny[4096];
    snprintf(tiny, sizeof tiny, "%s/tiny", tmp);
    ls_test_write_synth("tiny", 7, tiny);
    g_dirs[g_n_dirs++] = tiny;
    static char gold[8][4096];
    const char *names[8] = {"qwen3next_tiny_a", "qwen3next_tiny_b", "qwen3next_tiny_c", "qwen35moe_tiny_a",
                            "qwen35moe_tiny_b", "qwen35moe_tiny_c", "qwen35moe_fp8_a",  "qwen35moe_fp8_b"};
    for (int i = 0; i < 8; i++) {
        snprintf(gold[i], sizeof gold[i], "%s/goldens/%s", LS_SOURCE_DIR, names[i]);
        g_dirs[g_n_dirs++] = gold[i];
    }
}

typedef struct run_cfg {
    const char *backend;
    int act_bf16;
    int w8a8; /* FP8 checkpoints: 1 for --fp8 w8a8, 0 for dequant */
    const ls_sampling *sampling;
    int gdn_chunked; /* the chunk-aligned GDN form, on prompts that cross position 64 */
} run_cfg;

static void make_prompts(const ls_model *m, int gdn_chunked, int32_t toks[N_SEQS][MAX_PROMPT], ls_sequence *seqs)
{
    static const long short_lens[N_SEQS] = {5, 11, 17}, crossing_lens[N_SEQS] = {30, 61, 70};
    const long *lens = gdn_chunked ? crossing_lens : short_lens;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int s = 0; s < N_SEQS; s++) {
        for (long i = 0; i < lens[s]; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            toks[s][i] = (int32_t)((x >> 33) % (uint64_t)m->cfg.vocab);
        }
        seqs[s].id = (uint32_t)(10 + s);
        seqs[s].tokens = toks[s];
        seqs[s].n_tokens = lens[s];
        seqs[s].prompt_len = lens[s];
    }
}

static ls_engine *engine(const ls_model *m, const run_cfg *rc)
{
    ls_error err;
    ls_error_clear(&err);
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.act_bf16 = rc->act_bf16;
    o.fp8_w8a8 = rc->w8a8;
    o.gdn_chunked = rc->gdn_chunked;
    o.state_digest_every = 3; /* carried-state digests at many positions */
    o.max_rows = 64;
    ls_engine *e = NULL;
    ck_assert_msg(ls_gpu_engine_open(m, rc->backend, &o, N_SEQS, rc->gdn_chunked ? 128 : 64, &e, &err) == LS_OK,
                  "%s", err.msg);
    return e;
}

static void rollout(const ls_model *m, const run_cfg *rc, recs *out, int32_t comp[N_SEQS][MAX_NEW])
{
    ls_error err;
    ls_error_clear(&err);
    int32_t toks[N_SEQS][MAX_PROMPT];
    ls_sequence seqs[N_SEQS];
    make_prompts(m, rc->gdn_chunked, toks, seqs);
    ls_engine *e = engine(m, rc);
    ck_assert_msg(ls_run_rollout(e, seqs, N_SEQS, MAX_NEW, rc->sampling, &comp[0][0], recs_sink, out,
                                    &err) == LS_OK, "%s rollout: %s", rc->backend, err.msg);
    ls_engine_destroy(e);
    recs_sort(out);
}

static void replay(const ls_model *m, const run_cfg *rc, int32_t comp[N_SEQS][MAX_NEW], long chunk, recs *out)
{
    ls_error err;
    ls_error_clear(&err);
    int32_t toks[N_SEQS][MAX_PROMPT], full[N_SEQS][MAX_PROMPT + MAX_NEW];
    ls_sequence seqs[N_SEQS];
    make_prompts(m, rc->gdn_chunked, toks, seqs);
    for (int s = 0; s < N_SEQS; s++) {
        memcpy(full[s], toks[s], sizeof(int32_t) * (size_t)seqs[s].n_tokens);
        memcpy(full[s] + seqs[s].n_tokens, comp[s], sizeof(int32_t) * MAX_NEW);
        seqs[s].tokens = full[s];
        seqs[s].n_tokens += MAX_NEW;
    }
    ls_engine *e = engine(m, rc);
    ck_assert_msg(ls_run_replay(e, seqs, N_SEQS, chunk, recs_sink, out, &err) == LS_OK, "%s replay: %s",
                  rc->backend, err.msg);
    ls_engine_destroy(e);
    recs_sort(out);
}

/* Every record and digest of the CUDA engine equals the CPU engine's:
 * rollouts (greedy and seeded), then CUDA replays at several chunkings
 * against the CPU's. */
static void check_model(const char *dir, int gdn_chunked)
{
    ls_checkpoint *ck = NULL;
    ls_model *m = NULL;
    ls_test_open_model(dir, &ck, &m);
    ls_sampling greedy = {LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};
    ls_sampling seeded = {LS_SAMPLING_SEEDED, 1234, 0.8f, 40, 0.95f};
    const ls_sampling *samp[2] = {&greedy, &seeded};
    const char *base = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    for (int w8a8 = 0; w8a8 <= m->cfg.fp8; w8a8++)
    for (int act = 1; act >= 0; act--)
        for (int si = 0; si < 2; si++) {
            char msg[512], what[160];
            snprintf(what, sizeof what, "%s %s %s%s%s", base, act ? "bf16" : "fp32", si ? "seeded" : "greedy",
                     !m->cfg.fp8 ? "" : w8a8 ? " fp8-w8a8" : " fp8-dequant", gdn_chunked ? " chunk-aligned" : "");
            recs cpu = {0}, gpu = {0};
            int32_t comp_c[N_SEQS][MAX_NEW], comp_g[N_SEQS][MAX_NEW];
            run_cfg rc = {"cpu", act, w8a8, samp[si], gdn_chunked}, rg = {"cuda", act, w8a8, samp[si], gdn_chunked};
            rollout(m, &rc, &cpu, comp_c);
            rollout(m, &rg, &gpu, comp_g);
            int d = recs_diff(&cpu, &gpu, 0, msg, sizeof msg);
            printf("%s %s rollout cuda vs cpu: %s\n", d ? "MISMATCH" : "  ok", what, msg);
            ck_assert_msg(!d, "%s rollout: %s", what, msg);
            ck_assert_mem_eq(comp_c, comp_g, sizeof comp_c);
            recs_free(&gpu);
            /* replay: CPU whole-sequence vs CUDA at several chunkings */
            recs rep_cpu = {0};
            replay(m, &rc, comp_c, 64, &rep_cpu);
            static const long chunks[] = {1, 4, 7, 64};
            for (int c = 0; c < 4; c++) {
                recs rep = {0};
                replay(m, &rg, comp_c, chunks[c], &rep);
                d = recs_diff(&rep_cpu, &rep, 0, msg, sizeof msg);
                printf("%s %s replay chunk %ld cuda vs cpu: %s\n", d ? "MISMATCH" : "  ok", what, chunks[c], msg);
                ck_assert_msg(!d, "%s replay chunk %ld: %s", what, chunks[c], msg);
                recs_free(&rep);
            }
            recs_free(&rep_cpu);
            recs_free(&cpu);
            fflush(stdout);
        }
    ls_model_close(m);
    ls_checkpoint_close(ck);
}

/* Step graphs (docs/architecture.md, "Step graphs"): one sequence replayed
 * a token a step (pipelined steps of one row, as a rollout's decode),
 * recorded and replayed as graphs, gives every record and digest of the CPU
 * engine and of the CUDA engine without graphs; carried-state digests every
 * 5 positions make some steps run as they are in between. The tokens are
 * pseudo-random, none a vision placeholder. */
#define GRAPH_TOKENS 40
static void graph_replay(const ls_model *m, const char *backend, int graphs, recs *out, long *launches)
{
    ls_error err;
    ls_error_clear(&err);
    int32_t toks[GRAPH_TOKENS];
    const ls_model_config *c = &m->cfg;
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (long i = 0; i < GRAPH_TOKENS;) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int32_t t = (int32_t)((x >> 33) % (uint64_t)c->vocab);
        if (ls_model_vision_token(c, t) < 0) toks[i++] = t;
    }
    ls_sequence seq = {.id = 7, .tokens = toks, .n_tokens = GRAPH_TOKENS, .prompt_len = GRAPH_TOKENS};
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.state_digest_every = 5;
    o.max_rows = 64;
    o.step_graphs = graphs;
    ls_engine *e = NULL;
    ck_assert_msg(ls_gpu_engine_open(m, backend, &o, 1, 64, &e, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_run_replay(e, &seq, 1, 1, recs_sink, out, &err) == LS_OK, "%s replay: %s", backend, err.msg);
    long records;
    const char *off;
    ls_engine_step_graph_stats(e, &records, launches, &off);
    ck_assert_msg(off == NULL, "a step graph's recording failed: %s", off);
    ls_engine_destroy(e);
    recs_sort(out);
}

START_TEST(test_engine_cuda_step_graphs)
{
    setup_models();
    ls_checkpoint *ck = NULL;
    ls_model *m = NULL;
    const char *dir = g_dirs[_i < g_n_dirs ? _i : 0];
    ls_test_open_model(dir, &ck, &m);
    recs cpu = {0}, on = {0}, off = {0};
    long n_cpu = 0, n_on = 0, n_off = 0;
    graph_replay(m, "cpu", 1, &cpu, &n_cpu);
    graph_replay(m, "cuda", 1, &on, &n_on);
    graph_replay(m, "cuda", 0, &off, &n_off);
    char msg[512];
    const char *base = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    int d = recs_diff(&cpu, &on, 0, msg, sizeof msg);
    printf("%s %s one-token steps, cuda with step graphs (%ld steps launched) vs cpu: %s\n",
           d ? "MISMATCH" : "  ok", base, n_on, msg);
    ck_assert_msg(!d, "%s with step graphs: %s", base, msg);
    d = recs_diff(&off, &on, 0, msg, sizeof msg);
    printf("%s %s one-token steps, cuda with step graphs vs without: %s\n", d ? "MISMATCH" : "  ok", base, msg);
    ck_assert_msg(!d, "%s with step graphs vs without: %s", base, msg);
    /* every fifth position has a state digest: most steps are replays */
    ck_assert_msg(n_on >= GRAPH_TOKENS / 2, "only %ld of %d steps launched as graphs", n_on, GRAPH_TOKENS);
    ck_assert_int_eq(n_cpu, 0);
    ck_assert_int_eq(n_off, 0);
    recs_free(&cpu);
    recs_free(&on);
    recs_free(&off);
    ls_model_close(m);
    ls_checkpoint_close(ck);
}
END_TEST

START_TEST(test_engine_cuda_equals_cpu)
{
    setup_models();
    check_model(g_dirs[_i < g_n_dirs ? _i : 0], 0);
}
END_TEST

/* The chunk-aligned form: the synth model, a Qwen3-Next and a Qwen3.5 golden. */
START_TEST(test_engine_cuda_chunk_aligned_equals_cpu)
{
    setup_models();
    static const int pick[3] = {0, 1, 4};
    check_model(g_dirs[pick[_i]], 1);
}
END_TEST

START_TEST(test_engine_cuda_fails_closed_on_perturb)
{
    setup_models();
    ls_error err;
    ls_error_clear(&err);
    ls_checkpoint *ck = NULL;
    ls_model *m = NULL;
    ls_test_open_model(g_dirs[0], &ck, &m);
    /* The run layer refuses the spec ... */
    ls_run_batch b = {0, NULL};
    const char *jsonl = "{\"id\": 1, \"tokens\": [1, 2, 3]}\n";
    ck_assert_int_eq(ls_run_parse_prompts("prompts", jsonl, strlen(jsonl), 0, &b, &err), LS_OK);
    ls_run_spec spec;
    ls_run_spec_default(&spec);
    spec.checkpoint = g_dirs[0];
    spec.mode = "rollout";
    spec.max_new = 2;
    spec.backend = "cuda";
    spec.batch = &b;
    spec.out = "unused.trace";
    spec.perturb = "layer=0,op=gdn";
    ck_assert_int_eq(ls_run_spec_validate(&spec, &err), LS_E_UNSUPPORTED);
    printf("  ok perturbation on cuda refused by the run layer: %s\n", err.msg);
    /* ... and the CUDA kernels refuse a reversed order if an engine is made anyway. */
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.perturb_layer = 0;
    o.perturb_op = LS_PERTURB_GDN;
    ls_engine *e = NULL;
    ck_assert_msg(ls_gpu_engine_open(m, "cuda", &o, 1, 16, &e, &err) == LS_OK, "%s", err.msg);
    ls_sampling g = {LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};
    recs got;
    memset(&got, 0, sizeof got);
    ck_assert_int_eq(ls_run_rollout(e, b.seqs, 1, 2, &g, NULL, recs_sink, &got, &err), LS_E_UNSUPPORTED);
    recs_free(&got);
    printf("  ok perturbation on cuda fails closed in the kernels: %s\n", err.msg);
    ls_engine_destroy(e);
    ls_run_batch_free(&b);
    ls_model_close(m);
    ls_checkpoint_close(ck);
}
END_TEST

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
    Suite *s = suite_create("gpu_engine");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 900);
    int n = getenv("LS_GPU_QUICK") ? 1 : 9; /* tiny synth + eight goldens */
    tcase_add_loop_test(tc, test_engine_cuda_equals_cpu, 0, n);
    tcase_add_loop_test(tc, test_engine_cuda_chunk_aligned_equals_cpu, 0, getenv("LS_GPU_QUICK") ? 1 : 3);
    tcase_add_test(tc, test_engine_cuda_fails_closed_on_perturb);
    tcase_add_loop_test(tc, test_engine_cuda_step_graphs, 0, n);
    suite_add_tcase(s, tc);
    return ls_gpu_run_suite(s);
}
