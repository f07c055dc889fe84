/* The paged KV cache (engine.h kv_page) on the CPU: rollouts, replays,
 * GRPO groups, prefix reuse, preemption and continuous batching with pages
 * of 16, 17, 64 and 100 positions equal, bit for bit (tokens, logprobs,
 * top-5, every digest), the same runs with the contiguous cache, on the
 * synth `tiny` (Qwen3-Next) and `qwen3.5-tiny` checkpoints. Prompt lengths
 * sit at the ceil-division boundaries of every page size: lengths = 0, 1
 * and page - 1 (mod page), sequences ending exactly on a page, prefill
 * chunks crossing pages. Pages go back to the pool when sequences leave; a
 * full pool and bad sizes are refused naming the field. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/engine_records.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "run/run.h"
#include "synth/synth.h"
#include "synth_models.h"
#include "testutil.h"

#define N_MODELS 2
#define CAP 112

static ls_checkpoint *g_ck[N_MODELS];
static ls_model *g_m[N_MODELS];

static void setup(void)
{
    if (g_m[0]) return;
    static const char *const presets[N_MODELS] = {"tiny", "qwen3.5-tiny"};
    static const uint64_t seeds[N_MODELS] = {31, 32};
    ls_test_open_synth_models("paged", N_MODELS, presets, seeds, g_ck, g_m);
}

static ls_engine *mk_pool(const ls_model *m, long slots, long max_rows, long every, long page, long pool)
{
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = max_rows;
    o.state_digest_every = every;
    o.kv_page = page;
    o.kv_pool_pages = pool;
    ls_engine *e = NULL;
    ls_error err;
    ck_assert_msg(ls_run_engine_open(m, "cpu", 2, &o, slots, CAP, &e, &err) == LS_OK, "%s", err.msg);
    ck_assert_int_eq(ls_engine_kv_page(e), page);
    return e;
}

static ls_engine *mk(const ls_model *m, long slots, long max_rows, long every, long page)
{
    return mk_pool(m, slots, max_rows, every, page, 0);
}

static void expect_same(const char *what, const recs *a, const recs *b, const int32_t *ca, const int32_t *cb,
                        long n)
{
    char msg[512];
    ck_assert_msg(a->n > 0 && a->n == b->n, "%s: %ld records vs %ld", what, a->n, b->n);
    int d = recs_diff(a, b, 0, msg, sizeof msg);
    ck_assert_msg(d == 0, "%s: first difference: %s", what, msg);
    for (long i = 0; ca && i < n; i++)
        ck_assert_msg(ca[i] == cb[i], "%s: completion token %ld: %d vs %d", what, i, ca[i], cb[i]);
}

/* The sanitizer build runs whole models ~8x slower: there two page sizes,
 * one that divides none of the prompt lengths below but 17 and 34, and one
 * longer than most prompts; the paged rollouts only in prefill chunks of 7
 * (which start and end anywhere in a page) and the replays only whole and
 * in chunks of 17 (across every page boundary of both sizes). */
#if LS_TEST_ASAN
static const long pages[] = {17, 100};
static const long rollout_rows[] = {7};
static const long replay_chunks[] = {1000, 17};
#else
static const long pages[] = {16, 17, 64, 100};
static const long rollout_rows[] = {128, 7};       /* whole prompts per step; chunks of 7 */
static const long replay_chunks[] = {1000, 5, 17}; /* whole sequences; chunks across pages */
#endif
#define N_PAGES ((int)(sizeof pages / sizeof pages[0]))

/* Prompt lengths at the boundaries of every page size above: 16k + {0, 1,
 * 15}, 17k + {0, 1, 16}, 64 + {0, 1, -1}, 100 + {0, 1, -1}; decoding 4 more
 * tokens moves each across its next boundary. */
static const long lens[] = {1, 15, 16, 17, 33, 34, 63, 64, 65, 99, 100, 101};
#define N_PROMPTS ((long)(sizeof lens / sizeof lens[0]))
static int32_t toks[N_PROMPTS][101];

static void prompts(const ls_model *m, ls_sequence *pr)
{
    for (long i = 0; i < N_PROMPTS; i++) {
        ls_test_fill_tokens(m, toks[i], lens[i], 40 + (uint64_t)i);
        pr[i] = (ls_sequence){(uint32_t)(5 + i), toks[i], lens[i], lens[i]};
    }
}

/* ---- rollout ------------------------------------------------------------------------- */

START_TEST(test_rollout_paged_equals_contiguous)
{
    setup();
    const ls_model *m = g_m[_i];
    ls_sequence pr[N_PROMPTS];
    prompts(m, pr);
    const long MAX_NEW = 4;
    ls_sampling s = ls_test_seeded(21);
    ls_error err;
    recs a = {0};
    static int32_t ca[N_PROMPTS * 4], cb[N_PROMPTS * 4];
    ls_engine *e = mk(m, N_PROMPTS, 128, 3, 0);
    ck_assert_msg(ls_run_rollout(e, pr, N_PROMPTS, MAX_NEW, &s, ca, recs_sink, &a, &err) == LS_OK, "%s", err.msg);
    ls_engine_destroy(e);
    recs_sort(&a);
    for (int p = 0; p < N_PAGES; p++)
        for (size_t r = 0; r < sizeof rollout_rows / sizeof rollout_rows[0]; r++) {
            recs b = {0};
            e = mk(m, N_PROMPTS, rollout_rows[r], 3, pages[p]);
            ck_assert_msg(ls_run_rollout(e, pr, N_PROMPTS, MAX_NEW, &s, cb, recs_sink, &b, &err) == LS_OK,
                          "%s", err.msg);
            /* every page went back to the pool as its sequence left */
            ck_assert_msg(ls_engine_kv_pages_used(e) == 0, "page %ld: %ld pages still held", pages[p],
                          ls_engine_kv_pages_used(e));
            ck_assert_int_eq(ls_engine_kv_pool_pages(e), N_PROMPTS * ((CAP + pages[p] - 1) / pages[p]));
            ls_engine_destroy(e);
            recs_sort(&b);
            char what[96];
            snprintf(what, sizeof what, "model %d, rollout, page %ld, max_rows %ld", _i, pages[p],
                     rollout_rows[r]);
            expect_same(what, &a, &b, ca, cb, N_PROMPTS * MAX_NEW);
            recs_free(&b);
        }
    recs_free(&a);
}
END_TEST

/* ---- replay --------------------------------------------------------------------------- */

START_TEST(test_replay_paged_equals_contiguous)
{
    setup();
    const ls_model *m = g_m[_i];
    ls_sequence pr[N_PROMPTS];
    prompts(m, pr);
    /* the prompts replayed as full sequences with a prompt of half their length */
    ls_sequence sq[N_PROMPTS - 1]; /* not the one-token prompt: a replay needs a completion */
    for (long i = 0; i < N_PROMPTS - 1; i++) {
        sq[i] = pr[i + 1];
        sq[i].prompt_len = lens[i + 1] / 2;
    }
    ls_error err;
    for (size_t c = 0; c < sizeof replay_chunks / sizeof replay_chunks[0]; c++) {
        long chunk = replay_chunks[c];
        recs a = {0};
        ls_engine *e = mk(m, N_PROMPTS, 64, 4, 0);
        ck_assert_msg(ls_run_replay(e, sq, N_PROMPTS - 1, chunk, recs_sink, &a, &err) == LS_OK, "%s", err.msg);
        ls_engine_destroy(e);
        recs_sort(&a);
        for (int p = 0; p < N_PAGES; p++) {
            recs b = {0};
            e = mk(m, N_PROMPTS, 64, 4, pages[p]);
            ck_assert_msg(ls_run_replay(e, sq, N_PROMPTS - 1, chunk, recs_sink, &b, &err) == LS_OK, "%s",
                          err.msg);
            ls_engine_destroy(e);
            recs_sort(&b);
            char what[96];
            snprintf(what, sizeof what, "model %d, replay chunk %ld, page %ld", _i, chunk, pages[p]);
            expect_same(what, &a, &b, NULL, NULL, 0);
            recs_free(&b);
        }
        recs_free(&a);
    }
}
END_TEST

/* ---- GRPO, prefix reuse, preemption ------------------------------------------------------ */

START_TEST(test_group_paged_equals_plain)
{
    setup();
    const ls_model *m = g_m[_i];
    /* p0 33 tokens; p1 shares 17 with p0 (a prefix ending one past a page
     * of 16, on a page of 17); p2 = p0 and 3 more; p3 unrelated, 16 tokens */
    static int32_t t[4][40];
    long ln[4] = {33, 20, 36, 16};
    ls_test_fill_tokens(m, t[0], 36, 1);
    memcpy(t[2], t[0], sizeof(int32_t) * 36);
    memcpy(t[1], t[0], sizeof(int32_t) * 17);
    ls_test_fill_tokens(m, t[1] + 17, 3, 2);
    t[1][17] = (t[0][17] + 1) % (int32_t)m->cfg.vocab;
    ls_test_fill_tokens(m, t[3], 16, 3);
    t[3][0] = (t[0][0] + 1) % (int32_t)m->cfg.vocab;
    ls_sequence pr[4];
    for (int i = 0; i < 4; i++) pr[i] = (ls_sequence){(uint32_t)(2 + i), t[i], ln[i], ln[i]};
    const long N = 3, MAX_NEW = 6;
    ls_sampling s = ls_test_seeded(5);
    ls_error err;
    /* the plain rollout: each prompt N times, contiguous */
    ls_sequence seqs[12];
    ck_assert_msg(ls_run_group_sequences(pr, 4, N, seqs, &err) == LS_OK, "%s", err.msg);
    recs a = {0};
    int32_t ca[12 * 6], cb[12 * 6];
    ls_engine *e = mk(m, 12, 64, 4, 0);
    ck_assert_msg(ls_run_rollout(e, seqs, 12, MAX_NEW, &s, ca, recs_sink, &a, &err) == LS_OK, "%s", err.msg);
    ls_engine_destroy(e);
    recs_sort(&a);
    ls_run_eviction *plan = NULL;
    long n_plan = 0;
    ck_assert_msg(ls_run_preempt_plan(77, 12, MAX_NEW, &plan, &n_plan, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(n_plan > 2, "the seeded plan evicts %ld times", n_plan);
    struct {
        ls_prefix_cache pc;
        long block;
        int preempt;
    } cases[] = {{LS_PREFIX_CACHE_OFF, 0, 0}, {LS_PREFIX_CACHE_ANY, 0, 1}, {LS_PREFIX_CACHE_ALIGNED, 16, 1},
                 {LS_PREFIX_CACHE_ALIGNED, 17, 0}};
    for (int p = 0; p < N_PAGES; p++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            ls_rollout_opts o;
            ls_rollout_opts_default(&o);
            o.samples_per_prompt = N;
            o.prefix_cache = cases[c].pc;
            if (cases[c].block) o.prefix_block = cases[c].block;
            if (cases[c].preempt) {
                o.evictions = plan;
                o.n_evictions = n_plan;
            }
            ls_rollout_stats st;
            o.stats = &st;
            recs b = {0};
            e = mk(m, ls_run_group_slots(4, &o), 5, 4, pages[p]);
            ck_assert_msg(ls_run_rollout_group(e, pr, 4, MAX_NEW, &s, &o, cb, recs_sink, &b, &err) == LS_OK,
                          "%s", err.msg);
            ck_assert_msg(ls_engine_kv_pages_used(e) == 0, "%ld pages still held", ls_engine_kv_pages_used(e));
            ls_engine_destroy(e);
            recs_sort(&b);
            char what[128];
            snprintf(what, sizeof what, "model %d, page %ld, GRPO %ld, prefix %s block %ld, preemption %d", _i,
                     pages[p], N, ls_prefix_cache_name(o.prefix_cache), o.prefix_block, cases[c].preempt);
            expect_same(what, &a, &b, ca, cb, 12 * MAX_NEW);
            ck_assert_int_eq(st.forks, 4 * (N - 1));
            if (cases[c].pc != LS_PREFIX_CACHE_OFF) ck_assert_msg(st.positions_reused > 0, "%s: no reuse", what);
            if (cases[c].preempt) ck_assert_int_eq(st.evictions, n_plan);
            recs_free(&b);
        }
    free(plan);
    recs_free(&a);
}
END_TEST

/* ---- the pool ---------------------------------------------------------------------------- */

/* Continuous batching through 2 slots: 5 requests share a pool that holds
 * only what two of them need at once, so later requests run in pages the
 * earlier ones gave back. */
START_TEST(test_pool_reuse_and_full)
{
    setup();
    const ls_model *m = g_m[0];
    static int32_t t[5][40];
    static const long pl[5] = {31, 17, 34, 16, 40};
    ls_run_request rq[5];
    static int32_t comp[2][5][5];
    for (int run = 0; run < 2; run++)
        for (int i = 0; i < 5; i++) {
            ls_test_fill_tokens(m, t[i], pl[i], 60 + (uint64_t)i);
            rq[i] = (ls_run_request){(uint32_t)i, t[i], pl[i], 5, i, 6, comp[run][i]};
        }
    ls_sampling s = ls_test_seeded(8);
    ls_error err;
    recs a = {0}, b = {0};
    ls_engine *e = mk(m, 2, 16, 4, 0);
    for (int i = 0; i < 5; i++) rq[i].completion = comp[0][i];
    ck_assert_msg(ls_run_serve(e, rq, 5, &s, recs_sink, &a, &err) == LS_OK, "%s", err.msg);
    ls_engine_destroy(e);
    /* 40 + 5 - 1 = 44 positions: 3 pages of 16 each, two at once */
    e = mk_pool(m, 2, 16, 4, 16, 6);
    for (int i = 0; i < 5; i++) rq[i].completion = comp[1][i];
    ck_assert_msg(ls_run_serve(e, rq, 5, &s, recs_sink, &b, &err) == LS_OK, "%s", err.msg);
    ck_assert_int_eq(ls_engine_kv_pool_pages(e), 6);
    ck_assert_int_eq(ls_engine_kv_pages_used(e), 0);
    ls_engine_destroy(e);
    recs_sort(&a);
    recs_sort(&b);
    expect_same("serve, page 16, a pool of 6 pages", &a, &b, &comp[0][0][0], &comp[1][0][0], 25);
    recs_free(&a);
    recs_free(&b);

    /* A pool too small for one sequence: refused at the step, naming the field. */
    e = mk_pool(m, 2, 64, 4, 16, 2);
    int32_t tok[40];
    ls_test_fill_tokens(m, tok, 40, 9);
    ck_assert_msg(ls_engine_join(e, 0, 1, 40, &err) == LS_OK, "%s", err.msg);
    ls_engine_item it = {0, tok, 40, 0, 0};
    ls_status st = ls_engine_step(e, &it, 1, &err);
    ck_assert_msg(st == LS_E_USAGE && strstr(err.msg, "kv_pool_pages") && strstr(err.msg, "full"),
                  "a full pool: %d %s", (int)st, err.msg);
    /* all or none: the failed step took no page, and 32 positions fit */
    ck_assert_int_eq(ls_engine_kv_pages_used(e), 0);
    it.n = 32;
    ck_assert_msg(ls_engine_step(e, &it, 1, &err) == LS_OK, "%s", err.msg);
    ck_assert_int_eq(ls_engine_kv_pages_used(e), 2);
    /* a fork needs two more pages: refused, the source keeps its own */
    st = ls_engine_fork(e, 0, 1, 2, &err);
    ck_assert_msg(st == LS_E_USAGE && strstr(err.msg, "kv_pool_pages"), "a fork into a full pool: %d %s",
                  (int)st, err.msg);
    ck_assert_int_eq(ls_engine_kv_pages_used(e), 2);
    ls_engine_leave(e, 0);
    ck_assert_int_eq(ls_engine_kv_pages_used(e), 0);
    ls_engine_destroy(e);
}
END_TEST

START_TEST(test_refusals)
{
    setup();
    ls_engine_opts o;
    ls_error err;
    ls_engine *e = NULL;
    ls_engine_opts_default(&o);
    o.kv_page = -1;
    ls_status st = ls_run_engine_open(g_m[0], "cpu", 1, &o, 2, 32, &e, &err);
    ck_assert_msg(st == LS_E_USAGE && strstr(err.msg, "kv_page"), "kv_page -1: %d %s", (int)st, err.msg);
    ls_engine_opts_default(&o);
    o.kv_pool_pages = 4;
    st = ls_run_engine_open(g_m[0], "cpu", 1, &o, 2, 32, &e, &err);
    ck_assert_msg(st == LS_E_USAGE && strstr(err.msg, "kv_pool_pages"), "a pool without pages: %d %s", (int)st,
                  err.msg);
    ls_engine_opts_default(&o);
    o.kv_page = 1L << 40;
    st = ls_run_engine_open(g_m[0], "cpu", 1, &o, 2, 32, &e, &err);
    ck_assert_msg(st == LS_E_USAGE && strstr(err.msg, "kv_page"), "kv_page 2^40: %d %s", (int)st, err.msg);
    /* contiguous is page 0 */
    e = mk(g_m[0], 1, 8, 4, 0);
    ck_assert_int_eq(ls_engine_kv_page(e), 0);
    ck_assert_int_eq(ls_engine_kv_pool_pages(e), 0);
    ls_engine_destroy(e);
}
END_TEST

/* ---- the command line ------------------------------------------------------------------ */

START_TEST(test_cli_kv_page)
{
    char *dir = ls_test_tmpdir("paged-cli");
    char *o = NULL;
    int rc = ls_test_cli(&o, "synth --preset qwen3.5-tiny --seed 5 --out %s/ck", dir);
    ck_assert_msg(rc == 0, "synth: %s", o ? o : "");
    free(o);
    ls_test_write_text(dir, "p.jsonl", "{\"id\": 1, \"tokens\": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]}\n"
                                       "{\"id\": 4, \"tokens\": [3, 1, 4, 1, 5, 9, 7]}\n"
                                       "{\"id\": 6, \"tokens\": [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2]}\n");
    const char *common = "--mode rollout --sampling seeded --seed 6 --max-new-tokens 5 --state-digest-every 2";
    /* hashed in full both times: run_params records what the digest cache did */
    rc = ls_test_cli(&o, "run --checkpoint %s/ck --prompts %s/p.jsonl %s --checkpoint-cache off -o %s/plain.trace",
                     dir, dir, common, dir);
    ck_assert_msg(rc == 0, "plain rollout: %s", o ? o : "");
    free(o);
    /* a page of 0 positions is refused, naming the flag (the contiguous cache is the
     * default, with the option left out) */
    rc = ls_test_cli(&o, "run --checkpoint %s/ck --prompts %s/p.jsonl %s --checkpoint-cache off --kv-page 0 -o "
                     "%s/zero.trace", dir, dir, common, dir);
    ck_assert_msg(rc == 2 && o && strstr(o, "--kv-page 0: a page holds at least 1 position"), "--kv-page 0: rc %d: %s",
                  rc, o ? o : "");
    free(o);
    rc = ls_test_sh(&o, "test ! -e %s/zero.trace", dir);
    ck_assert_msg(rc == 0, "--kv-page 0 left a trace");
    free(o);
    static const long pg[] = {16, 17, 64, 100};
    for (int i = 0; i < 4; i++) {
        rc = ls_test_cli(&o, "run --checkpoint %s/ck --prompts %s/p.jsonl %s --kv-page %ld -o %s/p%ld.trace", dir,
                         dir, common, pg[i], dir, pg[i]);
        ck_assert_msg(rc == 0, "--kv-page %ld: %s", pg[i], o ? o : "");
        free(o);
        rc = ls_test_cli(&o, "compare %s/p%ld.trace %s/plain.trace", dir, pg[i], dir);
        ck_assert_msg(rc == 0, "paged %ld vs plain: exit %d:\n%s", pg[i], rc, o ? o : "");
        /* kv_page is in the manifest's serving section: informational, one digest */
        ck_assert_msg(o && !strstr(o, "manifest digests differ"), "paged %ld vs plain: the manifest digests "
                      "differ:\n%s", pg[i], o ? o : "");
        free(o);
        /* a paged replay of the contiguous rollout, in chunks that cross pages */
        rc = ls_test_cli(&o, "run --checkpoint %s/ck --mode replay --from %s/plain.trace --chunk 3 --kv-page %ld "
                         "-o %s/r%ld.trace", dir, dir, pg[i], dir, pg[i]);
        ck_assert_msg(rc == 0, "paged replay %ld: %s", pg[i], o ? o : "");
        free(o);
        rc = ls_test_cli(&o, "compare %s/plain.trace %s/r%ld.trace", dir, dir, pg[i]);
        ck_assert_msg(rc == 0, "plain rollout vs paged replay %ld: exit %d:\n%s", pg[i], rc, o ? o : "");
        free(o);
    }
    rc = ls_test_cli(&o, "trace dump %s/p17.trace", dir);
    ck_assert_msg(rc == 0 && o && strstr(o, "\"kv_page\":17,"), "run_params do not record kv_page:\n%.600s",
                  o ? o : "");
    free(o);
    rc = ls_test_cli(&o, "trace dump %s/plain.trace", dir);
    ck_assert_msg(rc == 0 && o && !strstr(o, "kv_page"), "a contiguous run records kv_page:\n%.600s",
                  o ? o : "");
    free(o);
    /* GRPO + prefix reuse + preemption, paged, against the plain rollout */
    ls_test_write_text(dir, "g.jsonl", "{\"id\": 1, \"tokens\": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]}\n"
                                       "{\"id\": 4, \"tokens\": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 7, 1]}\n");
    ls_test_write_text(dir, "gp.jsonl", "{\"id\": 2, \"tokens\": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]}\n"
                                        "{\"id\": 3, \"tokens\": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]}\n"
                                        "{\"id\": 8, \"tokens\": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 7, 1]}\n"
                                        "{\"id\": 9, \"tokens\": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 7, 1]}\n");
    rc = ls_test_cli(&o, "run --checkpoint %s/ck --prompts %s/g.jsonl %s --samples-per-prompt 2 --prefix-cache any "
                     "--preempt seeded:3 --kv-page 16 -o %s/g.trace", dir, dir, common, dir);
    ck_assert_msg(rc == 0, "paged group rollout: %s", o ? o : "");
    free(o);
    rc = ls_test_cli(&o, "run --checkpoint %s/ck --prompts %s/gp.jsonl %s -o %s/gp.trace", dir, dir, common, dir);
    ck_assert_msg(rc == 0, "plain rollout: %s", o ? o : "");
    free(o);
    rc = ls_test_cli(&o, "compare %s/g.trace %s/gp.trace", dir, dir);
    ck_assert_msg(rc == 0, "paged group vs plain: exit %d:\n%s", rc, o ? o : "");
    free(o);
    /* the gate: a paged rollout against plain (contiguous) replays */
    rc = ls_test_cli(&o, "gate --checkpoint %s/ck --prompts %s/p.jsonl --max-new-tokens 4 --kv-page 17", dir, dir);
    ck_assert_msg(rc == 0, "gate --kv-page 17: exit %d:\n%s", rc, o ? o : "");
    free(o);
    /* bad sizes: exit 2 naming the flag */
    static const char *const bad[] = {"-1", "2000000", "x", "99999999999999999999"};
    for (int i = 0; i < 4; i++) {
        rc = ls_test_cli(&o, "run --checkpoint %s/ck --prompts %s/p.jsonl %s --kv-page %s -o %s/x.trace", dir, dir,
                         common, bad[i], dir);
        ck_assert_msg(rc == 2 && o && strstr(o, "--kv-page"), "--kv-page %s: exit %d, expected 2 naming "
                      "--kv-page:\n%s", bad[i], rc, o ? o : "");
        free(o);
        rc = ls_test_cli(&o, "gate --checkpoint %s/ck --prompts %s/p.jsonl --kv-page %s", dir, dir, bad[i]);
        ck_assert_msg(rc == 2 && o && strstr(o, "--kv-page"), "gate --kv-page %s: exit %d, expected 2 naming "
                      "--kv-page:\n%s", bad[i], rc, o ? o : "");
        free(o);
    }
    ls_test_rm_tmpdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("paged");
    TCase *tc = tcase_create("paged");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, test_rollout_paged_equals_contiguous, 0, N_MODELS);
    tcase_add_loop_test(tc, test_replay_paged_equals_contiguous, 0, N_MODELS);
    tcase_add_loop_test(tc, test_group_paged_equals_plain, 0, N_MODELS);
    tcase_add_test(tc, test_pool_reuse_and_full);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_cli_kv_page);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}
