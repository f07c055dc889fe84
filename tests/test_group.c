/* GRPO groups, prefix reuse and preemption (run/drive.h) on the CPU: each
 * run's records equal, bit for bit (tokens, logprobs, top-5, every digest),
 * those of the plain rollout of the same sequences, on the synth `tiny`
 * (Qwen3-Next) and `qwen3.5-tiny` checkpoints; the engine's snapshots refuse
 * a snapshot of another model or numerics and a prefix as long as the
 * prompt, naming the field. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/engine_records.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "model/model.h"
#include "run/run.h"
#include "synth/synth.h"
#include "synth_models.h"
#include "testutil.h"

#define N_MODELS 2

static ls_checkpoint *g_ck[N_MODELS];
static ls_model *g_m[N_MODELS];

static void setup(void)
{
    if (g_m[0]) return;
    static const char *const presets[N_MODELS] = {"tiny", "qwen3.5-tiny"};
    static const uint64_t seeds[N_MODELS] = {11, 12};
    ls_test_open_synth_models("group", N_MODELS, presets, seeds, g_ck, g_m);
}

static ls_engine *mk(const ls_model *m, int act_bf16, long slots, long max_rows, long every)
{
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.act_bf16 = act_bf16;
    o.max_rows = max_rows;
    o.state_digest_every = every;
    ls_engine *e = NULL;
    ls_error err;
    ck_assert_msg(ls_run_engine_open(m, "cpu", 2, &o, slots, 96, &e, &err) == LS_OK, "%s", err.msg);
    return e;
}

/* An engine whose numerics differ from mk(m, 1, ...)'s in one field: FP8
 * mode (fp8 1: w8a8, which a model without FP8 matrices records all the
 * same) or a perturbation (perturb_layer >= 0, op router). */
static ls_engine *mk_numerics(const ls_model *m, int fp8, int perturb_layer)
{
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = 64;
    o.fp8_w8a8 = fp8;
    if (perturb_layer >= 0) {
        o.perturb_layer = perturb_layer;
        o.perturb_op = LS_PERTURB_ROUTER;
    }
    ls_engine *e = NULL;
    ls_error err;
    ck_assert_msg(ls_run_engine_open(m, "cpu", 2, &o, 2, 96, &e, &err) == LS_OK, "%s", err.msg);
    return e;
}

/* The plain rollout of the group's sequences (each prompt n times, sample ids). */
static void plain(const ls_model *m, const ls_sequence *pr, long np, long n, long max_new, const ls_sampling *s,
                  long every, recs *out, int32_t *comp)
{
    ls_sequence *seqs = malloc(sizeof *seqs * (size_t)(np * n));
    ls_error err;
    ck_assert_msg(ls_run_group_sequences(pr, np, n, seqs, &err) == LS_OK, "%s", err.msg);
    ls_engine *e = mk(m, 1, np * n, 64, every);
    ck_assert_msg(ls_run_rollout(e, seqs, np * n, max_new, s, comp, recs_sink, out, &err) == LS_OK, "%s",
                  err.msg);
    ls_engine_destroy(e);
    free(seqs);
    recs_sort(out);
}

static void group(const ls_model *m, const ls_sequence *pr, long np, long max_new, const ls_sampling *s,
                  const ls_rollout_opts *o, long max_rows, long every, recs *out, int32_t *comp)
{
    ls_engine *e = mk(m, 1, ls_run_group_slots(np, o), max_rows, every);
    ls_error err;
    ck_assert_msg(ls_run_rollout_group(e, pr, np, max_new, s, o, comp, recs_sink, out, &err) == LS_OK, "%s",
                  err.msg);
    ls_engine_destroy(e);
    recs_sort(out);
}

static void expect_same(const char *what, const recs *a, const recs *b, const int32_t *ca, const int32_t *cb,
                        long n)
{
    char msg[512];
    int d = recs_diff(a, b, 0, msg, sizeof msg);
    ck_assert_msg(d == 0, "%s: first difference: %s", what, msg);
    for (long i = 0; i < n; i++)
        ck_assert_msg(ca[i] == cb[i], "%s: completion token %ld: %d vs %d", what, i, ca[i], cb[i]);
}

/* ---- GRPO ------------------------------------------------------------------------------ */

START_TEST(test_grpo_equals_plain)
{
    setup();
    const ls_model *m = g_m[_i];
    static int32_t toks[3][17];
    static const long lens[3] = {1, 6, 17};
    ls_sequence pr[3];
    for (int i = 0; i < 3; i++) {
        ls_test_fill_tokens(m, toks[i], lens[i], (uint64_t)i);
        pr[i] = (ls_sequence){(uint32_t)(3 * i + 2), toks[i], lens[i], lens[i]};
    }
    const long N = 4, MAX_NEW = 7;
    ls_sampling s = ls_test_seeded(99);
    long rows[2] = {64, 5}; /* whole prompts per step; prompts split across steps */
    long every[2] = {3, 64};
    for (int v = 0; v < 2; v++) {
        recs a = {0}, b = {0};
        int32_t ca[3 * 4 * 7], cb[3 * 4 * 7];
        plain(m, pr, 3, N, MAX_NEW, &s, every[v], &a, ca);
        ls_rollout_opts o;
        ls_rollout_opts_default(&o);
        o.samples_per_prompt = N;
        ls_rollout_stats st;
        o.stats = &st;
        group(m, pr, 3, MAX_NEW, &s, &o, rows[v], every[v], &b, cb);
        char what[64];
        snprintf(what, sizeof what, "model %d, max_rows %ld", _i, rows[v]);
        expect_same(what, &a, &b, ca, cb, 3 * N * MAX_NEW);
        ck_assert_int_eq(st.forks, 3 * (N - 1));
        /* one prefill per prompt: the samples' prompt positions are not recomputed */
        ck_assert_int_eq(st.positions_computed, 1 + 6 + 17 + 3 * N * (MAX_NEW - 1));
        /* the samples of a prompt differ (else the fork copied nothing worth testing) */
        int differ = 0;
        for (long k = 1; k < N; k++) differ |= memcmp(cb + 2 * N * MAX_NEW, cb + (2 * N + k) * MAX_NEW,
                                                      sizeof(int32_t) * MAX_NEW) != 0;
        ck_assert_msg(differ, "the 4 samples of prompt 2 drew the same tokens");
        recs_free(&a);
        recs_free(&b);
    }
}
END_TEST

/* ---- prefix reuse ---------------------------------------------------------------------- */

START_TEST(test_prefix_equals_recompute)
{
    setup();
    const ls_model *m = g_m[_i];
    /* p0: 21 tokens; p1 shares 13 with p0; p2 = p0 and 4 more (shares 21);
     * p3 shares 17 with p2 (so 16 of p0 reach it through p2's source); p4
     * shares nothing; p5 = p1 exactly (prompt fully shared) */
    static int32_t t[6][32];
    long lens[6] = {21, 19, 25, 22, 7, 19};
    ls_test_fill_tokens(m, t[0], 25, 1);
    memcpy(t[2], t[0], sizeof(int32_t) * 25);
    memcpy(t[1], t[0], sizeof(int32_t) * 13);
    ls_test_fill_tokens(m, t[1] + 13, 6, 2);
    t[1][13] = (t[0][13] + 1) % (int32_t)m->cfg.vocab;
    memcpy(t[3], t[0], sizeof(int32_t) * 17);
    ls_test_fill_tokens(m, t[3] + 17, 5, 3);
    t[3][17] = (t[0][17] + 1) % (int32_t)m->cfg.vocab;
    ls_test_fill_tokens(m, t[4], 7, 4);
    t[4][0] = (t[0][0] + 1) % (int32_t)m->cfg.vocab;
    memcpy(t[5], t[1], sizeof(int32_t) * 19);
    ls_sequence pr[6];
    for (int i = 0; i < 6; i++) pr[i] = (ls_sequence){(uint32_t)(10 + i), t[i], lens[i], lens[i]};
    ls_sampling s = ls_test_seeded(7);
    const long MAX_NEW = 4;
    struct {
        ls_prefix_cache pc;
        long block, rows, n;
    } cases[] = {{LS_PREFIX_CACHE_ANY, 0, 64, 1}, {LS_PREFIX_CACHE_ALIGNED, 4, 64, 1},
                 {LS_PREFIX_CACHE_ALIGNED, 8, 3, 1}, {LS_PREFIX_CACHE_ANY, 0, 5, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        long N = cases[c].n;
        recs a = {0}, b = {0};
        int32_t ca[6 * 3 * 4], cb[6 * 3 * 4];
        plain(m, pr, 6, N, MAX_NEW, &s, 4, &a, ca);
        ls_rollout_opts o;
        ls_rollout_opts_default(&o);
        o.samples_per_prompt = N;
        o.prefix_cache = cases[c].pc;
        if (cases[c].block) o.prefix_block = cases[c].block;
        ls_rollout_stats st;
        o.stats = &st;
        group(m, pr, 6, MAX_NEW, &s, &o, cases[c].rows, 4, &b, cb);
        char what[96];
        snprintf(what, sizeof what, "model %d, prefix cache %s block %ld, max_rows %ld, %ld samples", _i,
                 ls_prefix_cache_name(o.prefix_cache), o.prefix_block, cases[c].rows, N);
        expect_same(what, &a, &b, ca, cb, 6 * N * MAX_NEW);
        /* any: p1 12, p2 20, p3 16, p5 18 (k - 1 each); aligned 4: 12, 20, 16, 16;
         * aligned 8: 8, 16, 16, 16 */
        long want = cases[c].pc == LS_PREFIX_CACHE_ANY ? 12 + 20 + 16 + 18
                    : cases[c].block == 4              ? 12 + 20 + 16 + 16
                                                       : 8 + 16 + 16 + 16;
        ck_assert_msg(st.positions_reused == want, "%s: %ld positions reused, expected %ld", what,
                      st.positions_reused, want);
        recs_free(&a);
        recs_free(&b);
    }
}
END_TEST

/* ---- preemption ------------------------------------------------------------------------ */

START_TEST(test_preemption_equals_uninterrupted)
{
    setup();
    const ls_model *m = g_m[_i];
    static int32_t t[3][12];
    long lens[3] = {12, 3, 9};
    ls_sequence pr[3];
    for (int i = 0; i < 3; i++) {
        ls_test_fill_tokens(m, t[i], lens[i], 20 + (uint64_t)i);
        pr[i] = (ls_sequence){(uint32_t)i, t[i], lens[i], lens[i]};
    }
    ls_sampling s = ls_test_seeded(3);
    const long MAX_NEW = 9, N = 2;
    /* forced: both resume kinds, back-to-back, a sequence evicted twice, and
     * several at the same step */
    ls_run_eviction forced[] = {{0, 1, 2, LS_RESUME_RECOMPUTE}, {0, 2, 5, LS_RESUME_SNAPSHOT},
                                {3, 2, 8, LS_RESUME_SNAPSHOT},  {5, 2, 3, LS_RESUME_RECOMPUTE},
                                {1, 7, 8, LS_RESUME_RECOMPUTE}, {4, 1, 8, LS_RESUME_SNAPSHOT}};
    ls_run_eviction *plan = NULL;
    long n_plan = 0;
    ls_error err;
    ck_assert_msg(ls_run_preempt_plan(12345, 3 * N, MAX_NEW, &plan, &n_plan, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(n_plan > 2, "the seeded plan evicts %ld times", n_plan);
    recs a = {0};
    int32_t ca[3 * 2 * 9];
    plain(m, pr, 3, N, MAX_NEW, &s, 2, &a, ca);
    for (int v = 0; v < 2; v++) {
        recs b = {0};
        int32_t cb[3 * 2 * 9];
        ls_rollout_opts o;
        ls_rollout_opts_default(&o);
        o.samples_per_prompt = N;
        o.evictions = v ? plan : forced;
        o.n_evictions = v ? n_plan : (long)(sizeof forced / sizeof forced[0]);
        ls_rollout_stats st;
        o.stats = &st;
        group(m, pr, 3, MAX_NEW, &s, &o, 4, 2, &b, cb);
        expect_same(v ? "seeded preemption" : "forced preemption", &a, &b, ca, cb, 3 * N * MAX_NEW);
        ck_assert_int_eq(st.evictions, o.n_evictions);
        ck_assert_int_eq(st.recomputed + st.restored, o.n_evictions);
        if (!v) ck_assert(st.recomputed == 3 && st.restored == 3);
        recs_free(&b);
    }
    recs_free(&a);
    free(plan);
}
END_TEST

/* ---- refusals ---------------------------------------------------------------------------- */

static void expect_fail(ls_status st, const ls_error *err, const char *needle)
{
    ck_assert_msg(st == LS_E_USAGE, "expected a usage error naming %s, got %d: %s", needle, (int)st, err->msg);
    ck_assert_msg(strstr(err->msg, needle), "'%s' does not name %s", err->msg, needle);
}

START_TEST(test_refusals)
{
    setup();
    ls_engine *e = mk(g_m[0], 1, 2, 64, 64);
    ls_engine *f32 = mk(g_m[0], 0, 2, 64, 64);
    ls_engine *other = mk(g_m[1], 1, 2, 64, 64);
    int32_t tok[8];
    ls_test_fill_tokens(g_m[0], tok, 8, 5);
    ls_error err;
    ls_engine_item it = {0, tok, 8, 0, 0};
    ck_assert_msg(ls_engine_join(e, 0, 1, 8, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_engine_step(e, &it, 1, &err) == LS_OK, "%s", err.msg);
    ls_engine_snapshot *sn = NULL;
    ck_assert_msg(ls_engine_snapshot_take(e, 0, &sn, &err) == LS_OK, "%s", err.msg);
    ck_assert_int_eq(ls_engine_snapshot_len(sn), 8);
    expect_fail(ls_engine_snapshot_restore(other, sn, 0, 2, 12, &err), &err, "model");
    expect_fail(ls_engine_snapshot_restore(f32, sn, 0, 2, 12, &err), &err, "act_bf16");
    /* another numerics: FP8 mode, a perturbation (even where the engine is
     * otherwise the same), and the same numerics on another engine */
    ls_engine *w8 = mk_numerics(g_m[0], 1, -1), *pert = mk_numerics(g_m[0], 0, 1), *twin = mk_numerics(g_m[0], 0, -1);
    expect_fail(ls_engine_snapshot_restore(w8, sn, 0, 2, 12, &err), &err, "fp8");
    expect_fail(ls_engine_snapshot_restore(pert, sn, 0, 2, 12, &err), &err, "perturbation");
    expect_fail(ls_engine_snapshot_restore(twin, sn, 0, 2, 12, &err), &err, "another engine");
    ls_engine_destroy(w8);
    ls_engine_destroy(pert);
    ls_engine_destroy(twin);
    expect_fail(ls_engine_snapshot_restore(e, sn, 1, 2, 8, &err), &err, "prefix_len");
    expect_fail(ls_engine_snapshot_restore(e, sn, 0, 2, 12, &err), &err, "slot 0 is taken");
    expect_fail(ls_engine_fork(e, 1, 0, 3, &err), &err, "holds no sequence");
    /* the sequence itself, resumed: any length */
    ls_engine_leave(e, 0);
    ck_assert_msg(ls_engine_snapshot_restore(e, sn, 1, 1, 8, &err) == LS_OK, "%s", err.msg);
    ck_assert_int_eq(ls_engine_slot_len(e, 1), 8);
    ls_engine_snapshot_free(e, sn);
    ls_engine_leave(e, 1);

    ls_sequence pr = {7, tok, 8, 8};
    ls_sampling s = ls_test_seeded(1), g = {LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};
    (void)g;
    ls_rollout_opts o;
    ls_rollout_opts_default(&o);
    o.samples_per_prompt = 0;
    expect_fail(ls_run_rollout_group(e, &pr, 1, 2, &s, &o, NULL, recs_sink, NULL, &err), &err,
                "samples_per_prompt");
    o.samples_per_prompt = 1;
    o.prefix_cache = LS_PREFIX_CACHE_ALIGNED;
    o.prefix_block = 0;
    expect_fail(ls_run_rollout_group(e, &pr, 1, 2, &s, &o, NULL, recs_sink, NULL, &err), &err, "prefix_block");
    ls_rollout_opts_default(&o);
    ls_run_eviction bad = {0, 2, 2, LS_RESUME_SNAPSHOT};
    o.evictions = &bad;
    o.n_evictions = 1;
    expect_fail(ls_run_rollout_group(e, &pr, 1, 4, &s, &o, NULL, recs_sink, NULL, &err), &err, "preemption");
    ls_sequence big = {0x40000000u, tok, 8, 8};
    ls_sequence out[4];
    expect_fail(ls_run_group_sequences(&big, 1, 4, out, &err), &err, "samples_per_prompt");
    ls_engine_destroy(e);
    ls_engine_destroy(f32);
    ls_engine_destroy(other);
}
END_TEST

/* ---- the command line -------------------------------------------------------------------- */

START_TEST(test_cli_group_equals_plain)
{
    char *dir = ls_test_tmpdir("group-cli");
    char *o = NULL;
    int rc = ls_test_cli(&o, "synth --preset qwen3.5-tiny --seed 5 --out %s/ck", dir);
    ck_assert_msg(rc == 0, "synth: %s", o ? o : "");
    free(o);
    ls_test_write_text(dir, "p.jsonl", "{\"id\": 1, \"tokens\": [3, 1, 4, 1, 5, 9, 2, 6, 5]}\n"
                                       "{\"id\": 4, \"tokens\": [3, 1, 4, 1, 5, 9, 7]}\n");
    ls_test_write_text(dir, "plain.jsonl", "{\"id\": 2, \"tokens\": [3, 1, 4, 1, 5, 9, 2, 6, 5]}\n"
                                           "{\"id\": 3, \"tokens\": [3, 1, 4, 1, 5, 9, 2, 6, 5]}\n"
                                           "{\"id\": 8, \"tokens\": [3, 1, 4, 1, 5, 9, 7]}\n"
                                           "{\"id\": 9, \"tokens\": [3, 1, 4, 1, 5, 9, 7]}\n");
    const char *common = "--mode rollout --sampling seeded --seed 6 --max-new-tokens 5 --state-digest-every 2";
    rc = ls_test_cli(&o, "run --checkpoint %s/ck --prompts %s/p.jsonl %s --samples-per-prompt 2 --prefix-cache "
                     "aligned --prefix-block 2 --preempt seeded:3 -o %s/g.trace", dir, dir, common, dir);
    ck_assert_msg(rc == 0, "group rollout: %s", o ? o : "");
    free(o);
    rc = ls_test_cli(&o, "run --checkpoint %s/ck --prompts %s/plain.jsonl %s -o %s/p.trace", dir, dir, common, dir);
    ck_assert_msg(rc == 0, "plain rollout: %s", o ? o : "");
    free(o);
    rc = ls_test_cli(&o, "compare %s/g.trace %s/p.trace", dir, dir);
    ck_assert_msg(rc == 0, "group vs plain: exit %d:\n%s", rc, o ? o : "");
    /* the manifests the runs pinned differ in their serving section only,
     * which is informational: one manifest digest */
    ck_assert_msg(o && !strstr(o, "manifest digests differ") && strstr(o, "manifest:"),
                  "group vs plain: the manifest digests differ:\n%s", o ? o : "");
    free(o);
    rc = ls_test_cli(&o, "trace dump %s/g.trace", dir);
    ck_assert_msg(rc == 0 && o && strstr(o, "samples_per_prompt") && strstr(o, "prefix_cache") &&
                  strstr(o, "preemption"), "run_params do not record the group options:\n%s", o ? o : "");
    free(o);
    static const struct {
        const char *args, *needle;
    } bad[] = {{"--samples-per-prompt 0", "samples_per_prompt (--samples-per-prompt)"},
               {"--samples-per-prompt 2 --prefix-cache some", "prefix_cache (--prefix-cache)"},
               {"--prefix-cache any --prefix-block 4", "prefix_block (--prefix-block)"},
               {"--preempt seeded:x", "preempt (--preempt)"},
               {"--preempt seeded:18446744073709551616", "preempt (--preempt)"},
               {"--preempt seeded:+3", "preempt (--preempt)"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = ls_test_cli(&o, "run --checkpoint %s/ck --prompts %s/p.jsonl %s %s -o %s/x.trace", dir, dir, common,
                         bad[i].args, dir);
        ck_assert_msg(rc == 2 && o && strstr(o, bad[i].needle), "%s: exit %d, expected 2 naming %s:\n%s",
                      bad[i].args, rc, bad[i].needle, o ? o : "");
        free(o);
    }
    rc = ls_test_cli(&o, "run --checkpoint %s/ck --prompts %s/p.jsonl --mode rollout --samples-per-prompt 2 -o "
                     "%s/x.trace", dir, dir, dir);
    ck_assert_msg(rc == 2 && o && strstr(o, "seeded"), "greedy GRPO: exit %d:\n%s", rc, o ? o : "");
    free(o);
    /* the gate runs the configuration as served (a GRPO group with prefix
     * reuse and preemption, paged) against plain replays of every sample */
    rc = ls_test_cli(&o, "gate --checkpoint %s/ck --prompts %s/p.jsonl --max-new-tokens 4 --seed 6 "
                     "--samples-per-prompt 2 --prefix-cache aligned --prefix-block 2 --preempt seeded:3 --kv-page 5 "
                     "--json %s/gate.json", dir, dir, dir);
    ck_assert_msg(rc == 0 && o && strstr(o, "PASS: 5/5"), "gate on a group rollout: exit %d:\n%s", rc, o ? o : "");
    free(o);
    json_t *gj = NULL;
    ls_error gerr;
    char gpath[4400];
    snprintf(gpath, sizeof gpath, "%s/gate.json", dir);
    ck_assert_msg(ls_json_load_file(gpath, &gj, &gerr) == LS_OK, "%s", gerr.msg);
    /* every replay recomputed the 4 samples (2 prompts x 2) in full: 2 x (9 + 3) + 2 x (7 + 3) positions */
    json_t *reps = json_object_get(gj, "replays");
    ck_assert_int_eq(json_array_size(reps), 5);
    for (size_t i = 0; i < json_array_size(reps); i++)
        ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(reps, i), "positions")), 44);
    json_decref(gj);
    rc = ls_test_cli(&o, "gate --checkpoint %s/ck --prompts %s/p.jsonl --samples-per-prompt 2", dir, dir);
    ck_assert_msg(rc == 2 && o && strstr(o, "--samples-per-prompt") && strstr(o, "--seed"),
                  "greedy GRPO gate: exit %d:\n%s", rc, o ? o : "");
    free(o);
    ls_test_rm_tmpdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("group");
    TCase *tc = tcase_create("group");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_grpo_equals_plain, 0, N_MODELS);
    tcase_add_loop_test(tc, test_prefix_equals_recompute, 0, N_MODELS);
    tcase_add_loop_test(tc, test_preemption_equals_uninterrupted, 0, N_MODELS);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_cli_group_equals_plain);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}
