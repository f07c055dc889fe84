/* A synthetic model (ls_model_synthetic) runs on the CPU backend with the
 * weights `lockstep synth` writes for the same preset and seed, generated
 * there (wrap_generated), so its records are the written checkpoint's: for
 * Qwen3-Next tiny, Qwen3.5 tiny (fused experts in the checkpoint) and
 * Qwen3.5 tiny FP8, a seeded rollout and its replay in chunks of 3 give
 * every record (token, logprob, top-5, every digest) bit for bit, on one
 * engine and on CPU ranks as threads that each generate only their share
 * (EP2: their experts; TP2: their row ranges, FP8 scale blocks included;
 * AFD 1:1: the mixers on one rank, the MoE on the other), against the
 * checkpoint's plain run. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/thread.h"
#include "dist/comm.h"
#include "gpu/engine_records.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "run/drive.h"
#include "run/run.h"
#include "synth/synth.h"
#include "testutil.h"

#define N_MODELS 3
#define CAP 64
#define N_SEQS 4
#define MAX_NEW 6

static ls_checkpoint *g_ck[N_MODELS];
static ls_model *g_ref[N_MODELS];   /* ls_model_open of the written checkpoint */
static ls_model *g_syn[N_MODELS];   /* ls_model_synthetic of its config, the same seed */
static const char *const g_name[N_MODELS] = {"tiny", "qwen3.5-tiny", "qwen3.5-tiny fp8"};

static void setup(void)
{
    if (g_ref[0]) return;
    char *dir = ls_test_tmpdir("synthetic_runs");
    static const char *const presets[N_MODELS] = {"tiny", "qwen3.5-tiny", "qwen3.5-tiny"};
    for (int i = 0; i < N_MODELS; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/m%d", dir, i);
        ls_error err;
        ls_error_clear(&err);
        ls_synth_config cfg;
        ck_assert_msg(ls_synth_preset(presets[i], &cfg, &err) == LS_OK, "%s", err.msg);
        if (i == 2) {
            cfg.fp8 = 1;
            cfg.fused_experts = 0;
        }
        uint64_t seed = 31 + (uint64_t)i;
        ls_synth_options opt = ls_synth_options_default();
        ck_assert_msg(ls_synth_write(&cfg, seed, path, &opt, &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(ls_checkpoint_open(path, &g_ck[i], &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(ls_model_open(g_ck[i], &g_ref[i], &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(ls_model_synthetic(&g_ref[i]->cfg, seed, &g_syn[i], &err) == LS_OK, "%s",
                      err.msg);
    }
    ls_test_rm_tmpdir(dir);
}

/* Prompts of lengths 1, 7, 12, 19 (several prefill steps at 16 rows). */
static void prompts(const ls_model *m, int32_t tok[N_SEQS][CAP], ls_sequence *pr)
{
    static const long lens[N_SEQS] = {1, 7, 12, 19};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int s = 0; s < N_SEQS; s++) {
        for (long i = 0; i < lens[s]; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            tok[s][i] = (int32_t)((x >> 33) % (uint64_t)m->cfg.vocab);
        }
        pr[s] = (ls_sequence){(uint32_t)(3 + s), tok[s], lens[s], lens[s]};
    }
}

/* One engine's run (a rank's, or a plain one): a seeded rollout, then the
 * replay of its sequences (prompt + completion) in chunks of 3. */
typedef struct run_ctx {
    const ls_model *m;
    ls_comm *tp, *ep, *afd;               /* all NULL: a plain engine */
    recs ro, rp;
    int32_t tok[N_SEQS][CAP];
    int32_t done[N_SEQS * MAX_NEW];
    int32_t full[N_SEQS][CAP];
    ls_status st;
    char msg[LS_ERROR_MSG_BYTES];
} run_ctx;

static void *run_main(void *arg)
{
    run_ctx *x = arg;
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = 16;
    o.state_digest_every = 4;
    o.tp_comm = x->tp;
    o.ep_comm = x->ep;
    o.afd_comm = x->afd;
    o.afd_attention = x->afd ? 1 : 0;
    ls_engine *e = NULL;
    ls_error err;
    ls_error_clear(&err);
    ls_sequence pr[N_SEQS], rs[N_SEQS];
    prompts(x->m, x->tok, pr);
    ls_sampling s = {LS_SAMPLING_SEEDED, 17, 1.0f, 0, 1.0f};
    x->st = ls_run_engine_open(x->m, "cpu", 1, &o, N_SEQS, CAP, &e, &err);
    if (x->st == LS_OK)
        x->st = ls_run_rollout(e, pr, N_SEQS, MAX_NEW, &s, x->done, recs_sink, &x->ro, &err);
    for (int q = 0; q < N_SEQS && x->st == LS_OK; q++) {
        memcpy(x->full[q], pr[q].tokens, sizeof(int32_t) * (size_t)pr[q].n_tokens);
        memcpy(x->full[q] + pr[q].n_tokens, x->done + q * MAX_NEW, sizeof(int32_t) * MAX_NEW);
        rs[q] = (ls_sequence){pr[q].id, x->full[q], pr[q].n_tokens + MAX_NEW, pr[q].n_tokens};
    }
    if (x->st == LS_OK) x->st = ls_run_replay(e, rs, N_SEQS, 3, recs_sink, &x->rp, &err);
    if (x->st != LS_OK) snprintf(x->msg, sizeof x->msg, "%s", err.msg);
    ls_engine_destroy(e);
    recs_sort(&x->ro);
    recs_sort(&x->rp);
    return NULL;
}

/* x's records and completions equal the checkpoint's plain run p's. */
static void expect_same(const run_ctx *p, const run_ctx *x, const char *what, int model)
{
    char msg[512];
    ck_assert_msg(x->st == LS_OK, "%s %s: %s", g_name[model], what, x->msg);
    ck_assert_msg(x->ro.n == p->ro.n && x->rp.n == p->rp.n, "%s %s: %ld + %ld records, the "
                  "checkpoint's %ld + %ld", g_name[model], what, x->ro.n, x->rp.n, p->ro.n, p->rp.n);
    ck_assert_msg(recs_diff(&p->ro, &x->ro, 0, msg, sizeof msg) == 0,
                  "%s %s rollout: first difference from the checkpoint's: %s", g_name[model], what, msg);
    ck_assert_msg(recs_diff(&p->rp, &x->rp, 0, msg, sizeof msg) == 0,
                  "%s %s replay: first difference from the checkpoint's: %s", g_name[model], what, msg);
    ck_assert_msg(memcmp(p->done, x->done, sizeof p->done) == 0, "%s %s: completions differ",
                  g_name[model], what);
}

static run_ctx g_plain[N_MODELS]; /* the checkpoint's plain run, once per model */

static const run_ctx *plain(int model)
{
    run_ctx *p = &g_plain[model];
    if (p->ro.n == 0) {
        p->m = g_ref[model];
        run_main(p);
        ck_assert_msg(p->st == LS_OK, "%s checkpoint: %s", g_name[model], p->msg);
        ck_assert_int_gt(p->ro.n, 0);
        ck_assert_int_gt(p->rp.n, 0);
    }
    return p;
}

START_TEST(test_plain_equals_checkpoint)
{
    setup();
    int model = _i;
    const run_ctx *p = plain(model);
    run_ctx *x = calloc(1, sizeof *x);
    x->m = g_syn[model];
    run_main(x);
    expect_same(p, x, "synthetic", model);
    recs_free(&x->ro);
    recs_free(&x->rp);
    free(x);
}
END_TEST

/* Two thread ranks of the synthetic model; kind 0: EP2, 1: TP2, 2: AFD 1:1. */
START_TEST(test_ranks_equal_checkpoint)
{
    setup();
    int model = _i % N_MODELS, kind = _i / N_MODELS;
    static const char *const kinds[3] = {"EP2", "TP2", "AFD 1:1"};
    const run_ctx *p = plain(model);
    ls_comm *comms[2];
    ls_error err;
    ls_comm_opts co = {60000};
    ck_assert_msg(ls_comm_cpu_world(2, &co, comms, &err) == LS_OK, "%s", err.msg);
    run_ctx *x = calloc(2, sizeof *x);
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        x[r].m = g_syn[model];
        *(kind == 0 ? &x[r].ep : kind == 1 ? &x[r].tp : &x[r].afd) = comms[r];
        ck_assert_int_eq(ls_thread_start(&t[r], run_main, &x[r]), 0);
    }
    for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
    for (int r = 0; r < 2; r++) ls_comm_destroy(comms[r]);
    for (int r = 0; r < 2; r++) {
        char what[64];
        snprintf(what, sizeof what, "synthetic %s rank %d", kinds[kind], r);
        expect_same(p, &x[r], what, model);
        recs_free(&x[r].ro);
        recs_free(&x[r].rp);
    }
    free(x);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("synthetic_runs");
    TCase *tc = tcase_create("synthetic_runs");
    tcase_set_timeout(tc, 1200);
    tcase_add_loop_test(tc, test_plain_equals_checkpoint, 0, N_MODELS);
    tcase_add_loop_test(tc, test_ranks_equal_checkpoint, 0, 3 * N_MODELS);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 1) ? EXIT_FAILURE : EXIT_SUCCESS; /* models opened once */
}
