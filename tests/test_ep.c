/* Expert parallelism on CPU ranks (engine.h ep_comm, docs/parallel.md §3.1):
 * ranks as threads, each with its own CPU backend holding only its own
 * experts' weights, joined by the CPU communicator. On synthetic checkpoints
 * (Qwen3-Next tiny, Qwen3.5 tiny, Qwen3.5 tiny in FP8 with w8a8 experts),
 * EP1 through the expert-parallel path, EP2 and EP4 give every record of the
 * plain engine bit for bit (tokens, logprobs, top-5, every digest), on every
 * rank, for a seeded rollout and for its replay in chunks of 3. A topology
 * that does not divide the experts, a backend without the ops, and a rank
 * whose step fails are refused or reported on every rank, naming the cause. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/comm.h"
#include "core/thread.h"
#include "gpu/engine_records.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "run/drive.h"
#include "run/run.h"
#include "synth/synth.h"
#include "testutil.h"

#define N_MODELS 3
#define CAP 64
#define N_SEQS 5
#define MAX_NEW 6

static ls_checkpoint *g_ck[N_MODELS];
static ls_model *g_m[N_MODELS];
static const char *const g_name[N_MODELS] = {"tiny", "qwen3.5-tiny", "qwen3.5-tiny fp8 w8a8"};

static void setup(void)
{
    if (g_m[0]) return;
    char *dir = ls_test_tmpdir("ep");
    static const char *const presets[N_MODELS] = {"tiny", "qwen3.5-tiny", "qwen3.5-tiny"};
    for (int i = 0; i < N_MODELS; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/m%d", dir, i);
        ls_error err;
        ls_synth_config cfg;
        ck_assert_msg(ls_synth_preset(presets[i], &cfg, &err) == LS_OK, "%s", err.msg);
        if (i == 2) {
            cfg.fp8 = 1;
            cfg.fused_experts = 0;
        }
        ls_synth_options opt = ls_synth_options_default();
        ck_assert_msg(ls_synth_write(&cfg, 70 + (uint64_t)i, path, &opt, &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(ls_checkpoint_open(path, &g_ck[i], &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(ls_model_open(g_ck[i], &g_m[i], &err) == LS_OK, "%s", err.msg);
    }
    ls_test_rm_tmpdir(dir);
}

static ls_engine_opts opts(int model, ls_comm *comm)
{
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = 24; /* the prompts take several prefill steps */
    o.state_digest_every = 4;
    o.fp8_w8a8 = model == 2;
    o.ep_comm = comm;
    return o;
}

/* Prompts of lengths 1, 7, 12, 19, 30 (several steps at 24 rows). */
static int32_t g_tok[N_SEQS][CAP];
static void prompts(const ls_model *m, ls_sequence *pr)
{
    static const long lens[N_SEQS] = {1, 7, 12, 19, 30};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int s = 0; s < N_SEQS; s++) {
        for (long i = 0; i < lens[s]; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            g_tok[s][i] = (int32_t)((x >> 33) % (uint64_t)m->cfg.vocab);
        }
        pr[s] = (ls_sequence){(uint32_t)(3 + s), g_tok[s], lens[s], lens[s]};
    }
}

/* One rank's (or the plain engine's) run: a seeded rollout, then the replay
 * of its sequences (prompt + completion) in chunks of 3. */
typedef struct run_ctx {
    int model;
    ls_comm *comm;                        /* NULL: the plain engine */
    recs ro, rp;
    int32_t done[N_SEQS * MAX_NEW];
    int32_t full[N_SEQS][CAP];            /* the replayed sequences */
    ls_status st;
    char msg[LS_ERROR_MSG_BYTES];
} run_ctx;

static void *run_main(void *arg)
{
    run_ctx *x = arg;
    const ls_model *m = g_m[x->model];
    ls_engine_opts o = opts(x->model, x->comm);
    ls_engine *e = NULL;
    ls_error err;
    ls_error_clear(&err);
    ls_sequence pr[N_SEQS];
    prompts(m, pr);
    ls_sampling s = {LS_SAMPLING_SEEDED, 17, 1.0f, 0, 1.0f};
    x->st = ls_run_engine_open(m, "cpu", 1, &o, N_SEQS, CAP, &e, &err);
    if (x->st == LS_OK)
        x->st = ls_run_rollout(e, pr, N_SEQS, MAX_NEW, &s, x->done, recs_sink, &x->ro, &err);
    ls_sequence rs[N_SEQS];
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

/* The plain engine's records of a model (computed once). */
static run_ctx g_plain[N_MODELS];
static const run_ctx *plain(int model)
{
    run_ctx *x = &g_plain[model];
    if (x->ro.n == 0) {
        x->model = model;
        run_main(x);
        ck_assert_msg(x->st == LS_OK, "%s: plain run: %s", g_name[model], x->msg);
        ck_assert_int_gt(x->ro.n, 0);
        ck_assert_int_gt(x->rp.n, 0);
    }
    return x;
}

/* Runs the model on ep thread ranks; every rank's records must equal the
 * plain engine's. */
static void expect_ep_equal(int model, int ep)
{
    const run_ctx *p = plain(model);
    ls_comm *comms[4];
    ls_error err;
    ls_comm_opts co = {60000};
    ck_assert_msg(ls_comm_cpu_world(ep, &co, comms, &err) == LS_OK, "%s", err.msg);
    run_ctx *x = calloc((size_t)ep, sizeof *x);
    pthread_t t[4];
    for (int r = 0; r < ep; r++) {
        x[r].model = model;
        x[r].comm = comms[r];
        ck_assert_int_eq(ls_thread_start(&t[r], run_main, &x[r]), 0);
    }
    for (int r = 0; r < ep; r++) pthread_join(t[r], NULL);
    for (int r = 0; r < ep; r++) ls_comm_destroy(comms[r]);
    for (int r = 0; r < ep; r++) {
        ck_assert_msg(x[r].st == LS_OK, "%s EP%d rank %d: %s", g_name[model], ep, r, x[r].msg);
        char msg[512];
        ck_assert_msg(recs_diff(&p->ro, &x[r].ro, 0, msg, sizeof msg) == 0,
                      "%s EP%d rank %d rollout: first difference: %s", g_name[model], ep, r, msg);
        ck_assert_msg(recs_diff(&p->rp, &x[r].rp, 0, msg, sizeof msg) == 0,
                      "%s EP%d rank %d replay: first difference: %s", g_name[model], ep, r, msg);
        ck_assert_msg(memcmp(p->done, x[r].done, sizeof p->done) == 0, "%s EP%d rank %d: completions differ",
                      g_name[model], ep, r);
        recs_free(&x[r].ro);
        recs_free(&x[r].rp);
    }
    free(x);
}

START_TEST(test_ep_equals_plain)
{
    setup();
    int model = _i;
    /* EP1 runs the expert-parallel path (slots, gather, combine) on one rank */
    static const int eps[] = {1, 2, 4};
    for (int i = 0; i < 3; i++) expect_ep_equal(model, eps[i]);
}
END_TEST

/* ---- refusals and failures --------------------------------------------------------------- */

START_TEST(test_ep_refusals)
{
    setup();
    ls_comm *comms[3];
    ls_error err;
    ck_assert_int_eq(ls_comm_cpu_world(3, NULL, comms, &err), LS_OK);
    ls_engine_opts o = opts(0, comms[0]);
    ls_engine *e = NULL;
    ck_assert_int_eq(ls_run_engine_open(g_m[0], "cpu", 1, &o, 2, CAP, &e, &err), LS_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "num_experts 8 is not a multiple of the 3 expert-parallel ranks"), "%s",
                  err.msg);
    for (int r = 0; r < 3; r++) ls_comm_destroy(comms[r]);
    /* a backend without moe_slots / moe_combine */
    ck_assert_int_eq(ls_comm_cpu_world(2, NULL, comms, &err), LS_OK);
    o = opts(0, comms[0]);
    ls_backend *be = NULL;
    ck_assert_int_eq(ls_backend_cpu_create(1, &be, &err), LS_OK);
    be->moe_slots = NULL;
    ck_assert_int_eq(ls_engine_create(g_m[0], be, &o, 2, CAP, &e, &err), LS_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "backend cpu has no expert-parallel ops"), "%s", err.msg);
    for (int r = 0; r < 2; r++) ls_comm_destroy(comms[r]);
}
END_TEST

/* Rank 1's prompt holds a token outside the vocabulary: its step fails, and
 * rank 0's step fails naming rank 1 and the cause, well before the deadline. */
typedef struct fail_ctx {
    ls_comm *comm;
    int bad;
    ls_status st;
    char msg[LS_ERROR_MSG_BYTES];
    double secs;
} fail_ctx;

static void *fail_main(void *arg)
{
    fail_ctx *x = arg;
    const ls_model *m = g_m[0];
    ls_engine_opts o = opts(0, x->comm);
    ls_engine *e = NULL;
    ls_error err;
    int32_t tok[4] = {1, 2, 3, x->bad ? (int32_t)m->cfg.vocab : 4};
    ls_sequence pr = {9, tok, 4, 4};
    ls_sampling s = {LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    x->st = ls_run_engine_open(m, "cpu", 1, &o, 1, CAP, &e, &err);
    recs r = {0};
    if (x->st == LS_OK) x->st = ls_run_rollout(e, &pr, 1, 2, &s, NULL, recs_sink, &r, &err);
    clock_gettime(CLOCK_MONOTONIC, &b);
    x->secs = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    snprintf(x->msg, sizeof x->msg, "%s", x->st == LS_OK ? "" : err.msg);
    recs_free(&r);
    ls_engine_destroy(e);
    return NULL;
}

START_TEST(test_ep_rank_failure)
{
    setup();
    ls_comm *comms[2];
    ls_error err;
    ls_comm_opts co = {30000};
    ck_assert_int_eq(ls_comm_cpu_world(2, &co, comms, &err), LS_OK);
    fail_ctx x[2] = {{comms[0], 0, LS_OK, "", 0}, {comms[1], 1, LS_OK, "", 0}};
    pthread_t t[2];
    for (int r = 0; r < 2; r++) ck_assert_int_eq(ls_thread_start(&t[r], fail_main, &x[r]), 0);
    for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
    for (int r = 0; r < 2; r++) ls_comm_destroy(comms[r]);
    ck_assert_int_eq(x[1].st, LS_E_INPUT);
    ck_assert_msg(strstr(x[1].msg, "is outside the vocabulary"), "%s", x[1].msg);
    ck_assert_int_eq(x[0].st, LS_E_DEVICE);
    ck_assert_msg(strstr(x[0].msg, "rank 1 failed: sequence 9: token id") &&
                  strstr(x[0].msg, "is outside the vocabulary"), "%s", x[0].msg);
    ck_assert_msg(x[0].secs < 15.0, "rank 0 took %.1f s to fail (deadline 30 s)", x[0].secs);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ep");
    TCase *tc = tcase_create("ep");
    tcase_set_timeout(tc, 1200);
    tcase_add_loop_test(tc, test_ep_equals_plain, 0, N_MODELS);
    tcase_add_test(tc, test_ep_refusals);
    tcase_add_test(tc, test_ep_rank_failure);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* the models are opened once for every test */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
