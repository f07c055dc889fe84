/* Engine on the synthetic tiny checkpoint: rollout = replay bitwise, any
 * chunking, any packing and order, thread counts, sampling reproducibility,
 * perturbation detection at the right layer, fail-closed configuration. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_cuda.h"
#include "backend/cpu_ops.h"
#include "engine/engine.h"
#include "run/run.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "model/model.h"
#include "synth_models.h"
#include "gpu/engine_records.h"
#include "testutil.h"

/* ---- in-memory trace ------------------------------------------------------------ */

static const recs_item *find_rec(const recs *t, uint32_t seq, uint32_t pos)
{
    for (long i = 0; i < t->n; i++)
        if (t->v[i].r.seq == seq && t->v[i].r.pos == pos) return &t->v[i];
    return NULL;
}

/* First difference in (seq, pos, layer, kind) order; returns 0 when equal,
 * else fills the layer of the first drift at the earliest position. */
static int diff(const recs *a, const recs *b, char *msg, size_t msz, int *drift_layer,
                uint32_t *drift_pos)
{
    *drift_layer = -1;
    if (a->n != b->n) {
        snprintf(msg, msz, "record counts %ld vs %ld", a->n, b->n);
        return 1;
    }
    uint32_t best_pos = UINT32_MAX;
    int found = 0;
    for (long i = 0; i < a->n; i++) {
        const recs_item *x = &a->v[i], *y = find_rec(b, x->r.seq, x->r.pos);
        if (!y) {
            snprintf(msg, msz, "seq %u pos %u missing", x->r.seq, x->r.pos);
            return 1;
        }
        int layer = -1;
        uint32_t nd = x->r.n_digests < y->r.n_digests ? x->r.n_digests : y->r.n_digests;
        for (uint32_t k = 0; k < nd && layer < 0; k++)
            if (x->d[k].layer != y->d[k].layer || x->d[k].kind != y->d[k].kind ||
                !ls_digest_equal(&x->d[k].digest, &y->d[k].digest))
                layer = x->d[k].layer;
        int other = x->r.token != y->r.token || x->r.next_token != y->r.next_token ||
                    x->r.logprob_bits != y->r.logprob_bits || x->r.n_digests != y->r.n_digests ||
                    memcmp(x->r.topk_ids, y->r.topk_ids, sizeof x->r.topk_ids) ||
                    memcmp(x->r.topk_logprob_bits, y->r.topk_logprob_bits, sizeof x->r.topk_logprob_bits);
        if ((layer >= 0 || other) && (!found || x->r.pos < best_pos)) {
            found = 1;
            best_pos = x->r.pos;
            *drift_layer = layer;
            *drift_pos = x->r.pos;
            snprintf(msg, msz, "seq %u pos %u: layer %d, token %d/%d next %d/%d logprob 0x%08x/0x%08x",
                     x->r.seq, x->r.pos, layer, x->r.token, y->r.token, x->r.next_token,
                     y->r.next_token, x->r.logprob_bits, y->r.logprob_bits);
        }
    }
    return found;
}


/* ---- fixture ---------------------------------------------------------------------- */

static char *g_dir;
static ls_checkpoint *g_ck;
static ls_model *g_model;

static void setup(void)
{
    if (g_model) return;
    g_dir = ls_test_tmpdir("engine");
    char path[4200];
    snprintf(path, sizeof path, "%s/tiny", g_dir);
    ls_test_write_synth("tiny", 7, path);
    ls_test_open_model(path, &g_ck, &g_model);
}

static int32_t *prompt(long n, uint32_t salt)
{
    int32_t *p = malloc(sizeof(int32_t) * (size_t)n);
    uint64_t x = 0x1234567ull + salt * 7919ull;
    for (long i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (int32_t)((x >> 33) % (uint64_t)g_model->cfg.vocab);
    }
    return p;
}

static ls_engine *mk(int threads, int act, int pl, ls_perturb_op op, long max_seqs, long max_rows)
{
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.act_bf16 = act;
    o.perturb_layer = pl;
    o.perturb_op = op;
    o.max_rows = max_rows;
    o.state_digest_every = 1; /* every kind at every position */
    ls_engine *e;
    ls_error err;
    ck_assert_msg(ls_run_engine_open(g_model, "cpu", threads, &o, max_seqs, 256, &e, &err) == LS_OK, "%s", err.msg);
    return e;
}

static ls_sampling greedy(void)
{
    ls_sampling s = {LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};
    return s;
}

/* Rollout of n prompts; returns the trace and the full sequences (prompt + completion). */
static void rollout(ls_engine *e, const ls_sequence *ps, long n, long max_new, const ls_sampling *s,
                    recs *tr, ls_sequence *full)
{
    ls_error err;
    int32_t *comp = malloc(sizeof(int32_t) * (size_t)(n * max_new));
    ck_assert_msg(ls_run_rollout(e, ps, n, max_new, s, comp, recs_sink, tr, &err) == LS_OK, "%s", err.msg);
    for (long i = 0; full && i < n; i++) {
        int32_t *t = malloc(sizeof(int32_t) * (size_t)(ps[i].n_tokens + max_new));
        memcpy(t, ps[i].tokens, sizeof(int32_t) * (size_t)ps[i].n_tokens);
        memcpy(t + ps[i].n_tokens, comp + i * max_new, sizeof(int32_t) * (size_t)max_new);
        full[i] = (ls_sequence){ps[i].id, t, ps[i].n_tokens + max_new, ps[i].n_tokens};
    }
    free(comp);
}

static void replay(ls_engine *e, const ls_sequence *fs, long n, long chunk, recs *tr)
{
    ls_error err;
    ck_assert_msg(ls_run_replay(e, fs, n, chunk, recs_sink, tr, &err) == LS_OK, "%s", err.msg);
}

static void expect_equal(const char *what, const recs *a, const recs *b)
{
    char msg[512];
    int layer;
    uint32_t pos;
    if (diff(a, b, msg, sizeof msg, &layer, &pos)) ck_abort_msg("%s: first difference %s", what, msg);
}

/* ---- tests ---------------------------------------------------------------------------- */

START_TEST(test_rollout_equals_replay)
{
    setup();
    long lens[] = {1, 63, 64, 65, 130};
    long news[] = {40, 9, 1, 17, 5};
    for (int act = 1; act >= 0; act--)
        for (int i = 0; i < 5; i++) {
            ls_engine *e = mk(2, act, -1, LS_PERTURB_NONE, 1, 256);
            int32_t *p = prompt(lens[i], (uint32_t)i);
            ls_sequence s = {(uint32_t)(10 + i), p, lens[i], 0}, full;
            recs ro = {0}, rp = {0};
            ls_sampling g = greedy();
            rollout(e, &s, 1, news[i], &g, &ro, &full);
            ck_assert_int_eq(ro.n, lens[i] + news[i] - 1);
            replay(e, &full, 1, 64, &rp);
            char what[64];
            snprintf(what, sizeof what, "prompt %ld + %ld act_bf16=%d", lens[i], news[i], act);
            expect_equal(what, &ro, &rp);
            /* Digests are present for every kind at every position. */
            uint32_t want = 3 + 3 * (uint32_t)g_model->cfg.n_layers;
            for (long l = 0; l < g_model->cfg.n_layers; l++) want += g_model->cfg.is_attention[l] ? 1 : 2;
            ck_assert_uint_eq(ro.v[0].r.n_digests, want);
            recs_free(&ro), recs_free(&rp);
            free(p), free((void *)full.tokens);
            ls_engine_destroy(e);
        }
}
END_TEST

START_TEST(test_chunkings_and_packing)
{
    setup();
    ls_engine *e = mk(2, 1, -1, LS_PERTURB_NONE, 8, 256);
    long lens[8] = {5, 70, 1, 33, 129, 2, 64, 17};
    ls_sequence full[8];
    for (int i = 0; i < 8; i++) {
        int32_t *t = prompt(lens[i] + 3, (uint32_t)(100 + i));
        full[i] = (ls_sequence){(uint32_t)i, t, lens[i] + 3, lens[i]};
    }
    recs ref = {0};
    replay(e, &full[4], 1, 1000, &ref); /* whole sequence in one chunk */
    long chunks[] = {1, 3, 64, 100};
    for (int c = 0; c < 4; c++) {
        recs t = {0};
        replay(e, &full[4], 1, chunks[c], &t);
        expect_equal("chunking", &ref, &t);
        recs_free(&t);
    }
    /* Packed with 1..7 others, in different orders; small row budgets too. */
    for (int k = 1; k <= 7; k++) {
        ls_sequence batch[8];
        int n = 0;
        for (int j = 0; j < 8 && n < k + 1; j++) {
            int idx = (j * 5 + k) % 8;
            int dup = 0;
            for (int q = 0; q < n; q++) dup |= batch[q].id == (uint32_t)idx;
            if (!dup) batch[n++] = full[idx];
        }
        int have4 = 0;
        for (int q = 0; q < n; q++) have4 |= batch[q].id == 4;
        if (!have4) batch[n - 1] = full[4];
        ls_engine *e2 = mk(1 + (k % 2), 1, -1, LS_PERTURB_NONE, 8, k % 3 == 0 ? 37 : 256);
        recs t = {0}, only = {0};
        replay(e2, batch, n, 1 + k * 13, &t);
        for (long i = 0; i < t.n; i++)
            if (t.v[i].r.seq == 4) {
                ls_trace_record rr = t.v[i].r;
                rr.digests = t.v[i].d;
                ck_assert_int_eq(recs_sink(&only, LS_FRAME_CHUNK, &rr, 1, NULL), LS_OK);
            }
        expect_equal("packed", &ref, &only);
        recs_free(&t), recs_free(&only);
        ls_engine_destroy(e2);
    }
    recs_free(&ref);
    for (int i = 0; i < 8; i++) free((void *)full[i].tokens);
    ls_engine_destroy(e);
}
END_TEST

START_TEST(test_decode_batch_and_sampling)
{
    setup();
    ls_sequence ps[8];
    for (int i = 0; i < 8; i++) {
        long n = 3 + i * 9;
        ps[i] = (ls_sequence){(uint32_t)(50 + i), prompt(n, (uint32_t)(200 + i)), n, 0};
    }
    ls_sampling modes[2] = {greedy(), {LS_SAMPLING_SEEDED, 42, 0.8f, 20, 0.9f}};
    for (int m = 0; m < 2; m++) {
        /* batch 8 (2 threads) vs each alone (1 thread), and again (reproducible). */
        ls_engine *e8 = mk(2, 1, -1, LS_PERTURB_NONE, 8, 256);
        recs all = {0};
        ls_sequence full8[8];
        rollout(e8, ps, 8, 12, &modes[m], &all, full8);
        recs again = {0};
        rollout(e8, ps, 8, 12, &modes[m], &again, NULL);
        expect_equal("rollout reproduces", &all, &again);
        ls_engine *e1 = mk(1, 1, -1, LS_PERTURB_NONE, 1, 256);
        for (int i = 0; i < 8; i++) {
            recs one = {0}, sub = {0};
            ls_sequence full1;
            rollout(e1, &ps[i], 1, 12, &modes[m], &one, &full1);
            ck_assert_mem_eq(full1.tokens, full8[i].tokens, sizeof(int32_t) * (size_t)full1.n_tokens);
            for (long r = 0; r < all.n; r++)
                if (all.v[r].r.seq == ps[i].id) {
                    ls_trace_record rr = all.v[r].r;
                    rr.digests = all.v[r].d;
                    ck_assert_int_eq(recs_sink(&sub, LS_FRAME_DECODE, &rr, 1, NULL), LS_OK);
                }
            expect_equal("batch 8 = batch 1", &one, &sub);
            recs_free(&one), recs_free(&sub);
            free((void *)full1.tokens), free((void *)full8[i].tokens);
        }
        recs_free(&all), recs_free(&again);
        ls_engine_destroy(e8);
        ls_engine_destroy(e1);
    }
    for (int i = 0; i < 8; i++) free((void *)ps[i].tokens);
}
END_TEST

START_TEST(test_perturbation_detected)
{
    setup();
    const ls_model_config *c = &g_model->cfg;
    int32_t *p = prompt(20, 9);
    ls_sequence s = {1, p, 20, 0}, full;
    ls_engine *e = mk(2, 1, -1, LS_PERTURB_NONE, 1, 256);
    recs ref = {0};
    ls_sampling g = greedy();
    rollout(e, &s, 1, 8, &g, &ref, &full);
    ls_engine_destroy(e);
    for (int op = LS_PERTURB_GDN; op < LS_PERTURB_COUNT; op++)
        for (int l = 0; l < c->n_layers; l++) {
            int att = c->is_attention[l];
            if ((op == LS_PERTURB_ATTENTION && !att) || ((op == LS_PERTURB_GDN || op == LS_PERTURB_CONV) && att))
                continue;
            if (op == LS_PERTURB_LM_HEAD && l > 0) continue;
            ls_engine *ep = mk(2, 1, l, (ls_perturb_op)op, 1, 256);
            recs t = {0};
            replay(ep, &full, 1, 64, &t);
            char msg[512];
            int layer;
            uint32_t pos;
            int d = diff(&ref, &t, msg, sizeof msg, &layer, &pos);
            ck_assert_msg(d, "perturbation %s at layer %d not detected", ls_perturb_op_name(op), l);
            int want;
            if (op == LS_PERTURB_LM_HEAD) want = 2 + 2 * (int)c->n_layers;
            else if (op == LS_PERTURB_ROUTER || op == LS_PERTURB_EXPERTS || op == LS_PERTURB_COMBINE)
                want = 2 + 2 * l;
            else want = 1 + 2 * l; /* gdn, conv, attention; norm shows at the layer's mixer */
            ck_assert_msg(layer == want, "perturbation %s at layer %d: first drift at trace layer %d, "
                          "expected %d (%s)", ls_perturb_op_name(op), l, layer, want, msg);
            recs_free(&t);
            ls_engine_destroy(ep);
        }
    recs_free(&ref);
    free(p), free((void *)full.tokens);
}
END_TEST

/* Continuous batching (ls_run_serve over the step API): sequences join and
 * leave slots between steps, prefill chunks of some share steps with decode
 * tokens of others; each sequence's records equal those of its rollout alone. */
typedef struct cb_seq {
    uint32_t id;
    int32_t *tok;              /* [prompt + max_new] prompt, then generated */
    long prompt, max_new;
} cb_seq;

typedef struct cb_sink {
    recs *all;
    const cb_seq *q;
    long n, mixed_steps, steps;
} cb_sink;

/* Collects every record and counts the steps that mix prompt and decode rows. */
static ls_status cb_collect(void *ctx, ls_frame_kind kind, const ls_trace_record *recs, long n,
                            ls_error *err)
{
    cb_sink *c = ctx;
    long pre = 0, dec = 0;
    for (long r = 0; r < n; r++)
        for (long i = 0; i < c->n; i++)
            if (c->q[i].id == recs[r].seq) {
                if (recs[r].pos < (uint32_t)c->q[i].prompt) pre++;
                else dec++;
            }
    ck_assert_int_eq(kind, dec ? LS_FRAME_DECODE : LS_FRAME_PREFILL);
    c->mixed_steps += pre > 0 && dec > 0;
    c->steps++;
    return recs_sink(c->all, kind, recs, n, err);
}

START_TEST(test_step_continuous_batching)
{
    setup();
    const long NS = 6, every = 5;
    long prompts[6] = {23, 4, 41, 1, 17, 9}, news[6] = {10, 7, 3, 12, 6, 8}, joins[6] = {2, 0, 0, 3, 5, 9};
    long chunks[6] = {5, 1, 9, 3, 7, 2};
    cb_seq q[6];
    ls_run_request req[6];
    for (int i = 0; i < NS; i++) {
        q[i] = (cb_seq){(uint32_t)(70 + i), malloc(sizeof(int32_t) * (size_t)(prompts[i] + news[i])),
                        prompts[i], news[i]};
        int32_t *p = prompt(prompts[i], (uint32_t)(300 + i));
        memcpy(q[i].tok, p, sizeof(int32_t) * (size_t)prompts[i]);
        free(p);
        req[i] = (ls_run_request){q[i].id, q[i].tok, prompts[i], news[i], joins[i], chunks[i],
                                  q[i].tok + prompts[i]};
    }
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = 16;
    o.state_digest_every = every;
    ls_engine *e;
    ls_error err;
    ck_assert_msg(ls_run_engine_open(g_model, "cpu", 2, &o, 3, 128, &e, &err) == LS_OK, "%s", err.msg);
    ls_sampling g = greedy();
    recs all = {0};
    cb_sink cs = {&all, q, NS, 0, 0};
    ck_assert_msg(ls_run_serve(e, req, NS, &g, cb_collect, &cs, &err) == LS_OK, "%s", err.msg);
    for (long sl = 0; sl < 3; sl++) ck_assert_int_eq(ls_engine_join(e, sl, 1, 1, &err), LS_OK); /* all left */
    long mixed_steps = cs.mixed_steps;
    long positions = 0;
    for (int i = 0; i < NS; i++) positions += prompts[i] + news[i] - 1;
    ck_assert_int_eq(all.n, positions);
    ck_assert_msg(mixed_steps > 0, "no step mixed prefill and decode");
    ls_engine_destroy(e);
    /* Each sequence alone, through the rollout driver. */
    ck_assert_msg(ls_run_engine_open(g_model, "cpu", 2, &o, 1, 128, &e, &err) == LS_OK, "%s", err.msg);
    int gdn_tl = -1;
    for (long l = 0; l < g_model->cfg.n_layers && gdn_tl < 0; l++)
        if (!g_model->cfg.is_attention[l]) gdn_tl = (int)(1 + 2 * l);
    for (int i = 0; i < NS; i++) {
        ls_sequence s = {q[i].id, q[i].tok, q[i].prompt, 0}, full;
        recs one = {0}, sub = {0};
        rollout(e, &s, 1, q[i].max_new, &g, &one, &full);
        ck_assert_mem_eq(full.tokens, q[i].tok, sizeof(int32_t) * (size_t)full.n_tokens);
        for (long r = 0; r < all.n; r++)
            if (all.v[r].r.seq == q[i].id) {
                ls_trace_record rr = all.v[r].r;
                rr.digests = all.v[r].d;
                ck_assert_int_eq(recs_sink(&sub, LS_FRAME_DECODE, &rr, 1, NULL), LS_OK);
            }
        char what[96];
        snprintf(what, sizeof what, "sequence %u amid joins/leaves = alone", q[i].id);
        expect_equal(what, &one, &sub);
        /* Carried-state cadence: p % 5 == 4, the last prompt position, the last position. */
        long last = q[i].prompt + q[i].max_new - 2;
        for (long r = 0; r < one.n; r++) {
            long p = one.v[r].r.pos;
            int want = p % every == every - 1 || p == q[i].prompt - 1 || p == last, have = 0;
            for (uint32_t k = 0; k < one.v[r].r.n_digests; k++)
                have |= one.v[r].d[k].layer == gdn_tl && one.v[r].d[k].kind == LS_DIGEST_GDN_STATE;
            ck_assert_msg(have == want, "seq %u pos %ld: gdn_state digest %s (prompt %ld, last %ld)",
                          q[i].id, p, have ? "present" : "missing", q[i].prompt, last);
        }
        recs_free(&one), recs_free(&sub);
        free((void *)full.tokens);
    }
    ls_engine_destroy(e);
    recs_free(&all);
    for (int i = 0; i < NS; i++) free(q[i].tok);
}
END_TEST

/* A step's records come from its summary (top-5, the known next token's
 * logprob) while the rows stay with the backend; each equals what the whole
 * row gives, for a next token the step knew, one of the top 5, one of
 * neither (a transfer of its own) and none, and the greedy sample is the
 * scan's. Rows 0..4: an item whose following token is known; rows 5..8: one
 * whose last row's next token is to be sampled. */
START_TEST(test_records_from_summary)
{
    setup();
    ls_engine *e = mk(2, 1, -1, LS_PERTURB_NONE, 2, 16);
    ls_error err;
    long V = g_model->cfg.vocab;
    int32_t *p = prompt(12, 5);
    ck_assert_int_eq(ls_engine_join(e, 0, 1, 12, &err), LS_OK);
    ck_assert_int_eq(ls_engine_join(e, 1, 2, 12, &err), LS_OK);
    ls_engine_item it[2] = {{0, p, 5, 0, 1}, {1, p + 2, 4, 0, 0}};
    ck_assert_msg(ls_engine_step(e, it, 2, &err) == LS_OK, "%s", err.msg);
    ls_sampling g = greedy();
    enum { ROWS = 9, NEXTS = 5 };
    ls_trace_record got[ROWS][NEXTS];
    int32_t next[ROWS][NEXTS], sampled[ROWS];
    for (long r = 0; r < ROWS; r++) {
        const ls_trace_record *rec;
        ck_assert_int_eq(ls_engine_sample(e, r, &g, 1, 1, &sampled[r], &err), LS_OK);
        ck_assert_int_eq(ls_engine_record(e, r, -1, &rec, &err), LS_OK);
        int32_t known = r < 5 ? p[r + 1] : r < 8 ? p[r - 5 + 3] : sampled[r];
        int32_t cands[NEXTS] = {known, rec->topk_ids[3], 0, (int32_t)(V - 1), -1};
        for (int j = 0; j < NEXTS; j++) {
            next[r][j] = cands[j];
            ck_assert_int_eq(ls_engine_record(e, r, cands[j], &rec, &err), LS_OK);
            got[r][j] = *rec;
        }
    }
    ck_assert_int_eq(ls_engine_record(e, ROWS, 0, &(const ls_trace_record *){NULL}, &err), LS_E_USAGE);
    for (long r = 0; r < ROWS; r++) {
        const float *lp;
        ck_assert_int_eq(ls_engine_logprobs(e, r, &lp, &err), LS_OK);
        int32_t want_ids[5], tok;
        float want_vals[5];
        ls_cpu_topk(lp, V, 5, want_ids, want_vals);
        ck_assert_int_eq(ls_sample_select(&g, lp, V, 1, 1, NULL, &tok, &err), LS_OK);
        ck_assert_int_eq(sampled[r], tok);
        for (int j = 0; j < NEXTS; j++) {
            const ls_trace_record *x = &got[r][j];
            uint32_t want = next[r][j] >= 0 ? ls_f32_bits(lp[next[r][j]]) : 0x7fc00000u;
            ck_assert_msg(x->logprob_bits == want, "row %ld next %d: logprob 0x%08x, the row says 0x%08x",
                          r, next[r][j], x->logprob_bits, want);
            for (int i = 0; i < 5; i++) {
                ck_assert_int_eq(x->topk_ids[i], want_ids[i]);
                ck_assert_uint_eq(x->topk_logprob_bits[i], ls_f32_bits(want_vals[i]));
            }
        }
    }
    ls_engine_destroy(e);
    free(p);
}
END_TEST

/* The step in two halves (ls_engine_step_begin / _end): a step's records,
 * built before the next step begins and handed on after it, carry the same
 * digests and logprobs as ls_engine_step's; ls_engine_step while a begun step
 * is not ended, a third begin and an end with nothing begun are refused and
 * change nothing. */
static void pipeline_records(ls_engine *e, const ls_engine_item *it, const ls_trace_record **rec0)
{
    ls_error err;
    for (long j = 0; j < it->n; j++) {
        const ls_trace_record *rec;
        ck_assert_msg(ls_engine_record(e, j, it->tokens[j + 1], &rec, &err) == LS_OK, "%s", err.msg);
        if (j == 0) *rec0 = rec;
    }
}

static ls_status failing_sink(void *ctx, ls_frame_kind kind, const ls_trace_record *recs, long n,
                              ls_error *err)
{
    (void)kind, (void)recs, (void)n;
    return ++*(int *)ctx == 2 ? ls_fail(err, LS_E_IO, "test sink: full") : LS_OK;
}

START_TEST(test_step_pipeline)
{
    setup();
    int32_t *p = prompt(8, 11);
    const ls_engine_item steps[3] = {{0, p, 5, 0, 1}, {0, p + 5, 1, 0, 1}, {0, p + 6, 1, 1, 1}};
    recs ref = {0}, got = {0};
    ls_error err;
    const ls_trace_record *r0 = NULL, *r1 = NULL, *r2 = NULL;
    ls_engine *e = mk(2, 1, -1, LS_PERTURB_NONE, 1, 16);
    ck_assert_int_eq(ls_engine_join(e, 0, 9, 8, &err), LS_OK);
    for (int s = 0; s < 3; s++) {
        ck_assert_msg(ls_engine_step(e, &steps[s], 1, &err) == LS_OK, "%s", err.msg);
        pipeline_records(e, &steps[s], &r0);
        ck_assert_int_eq(recs_sink(&ref, LS_FRAME_CHUNK, r0, steps[s].n, NULL), LS_OK);
    }
    ls_engine_destroy(e);
    e = mk(2, 1, -1, LS_PERTURB_NONE, 1, 16);
    ck_assert(ls_engine_pipelines(e));
    ck_assert_int_eq(ls_engine_join(e, 0, 9, 8, &err), LS_OK);
    ck_assert_int_eq(ls_engine_step_end(e, &err), LS_E_USAGE);
    ck_assert_msg(ls_engine_step_begin(e, &steps[0], 1, &err) == LS_OK, "%s", err.msg);
    pipeline_records(e, &steps[0], &r0);
    ck_assert_int_eq(ls_engine_step(e, &steps[1], 1, &err), LS_E_USAGE);
    ck_assert_msg(strstr(err.msg, "not ended"), "%s", err.msg);
    ck_assert_msg(ls_engine_step_begin(e, &steps[1], 1, &err) == LS_OK, "%s", err.msg);
    pipeline_records(e, &steps[1], &r1);
    ck_assert_int_eq(ls_engine_step_begin(e, &steps[2], 1, &err), LS_E_USAGE);
    /* step graphs are not switched under a begun step; a backend without
     * graph ops (the CPU's) records none */
    ck_assert_int_eq(ls_engine_set_step_graphs(e, 0, &err), LS_E_USAGE);
    long graph_records = -1, graph_launches = -1;
    const char *graph_off = "";
    ls_engine_step_graph_stats(e, &graph_records, &graph_launches, &graph_off);
    ck_assert(graph_records == 0 && graph_launches == 0 && graph_off == NULL);
    ck_assert_int_eq(ls_engine_slot_len(e, 0), 6);
    ck_assert_msg(ls_engine_step_end(e, &err) == LS_OK, "%s", err.msg);
    /* step 0's, read after step 1 ran */
    ck_assert_int_eq(recs_sink(&got, LS_FRAME_CHUNK, r0, steps[0].n, NULL), LS_OK);
    ck_assert_msg(ls_engine_step_begin(e, &steps[2], 1, &err) == LS_OK, "%s", err.msg);
    pipeline_records(e, &steps[2], &r2);
    ck_assert_msg(ls_engine_step_end(e, &err) == LS_OK, "%s", err.msg);
    ck_assert_int_eq(recs_sink(&got, LS_FRAME_CHUNK, r1, steps[1].n, NULL), LS_OK);
    ck_assert_msg(ls_engine_step_end(e, &err) == LS_OK, "%s", err.msg);
    ck_assert_int_eq(recs_sink(&got, LS_FRAME_CHUNK, r2, steps[2].n, NULL), LS_OK);
    ck_assert_int_eq(ls_engine_step_end(e, &err), LS_E_USAGE);
    ck_assert_int_eq(ls_engine_set_step_graphs(e, 1, &err), LS_OK);
    ck_assert_int_eq(got.n, 7);
    expect_equal("pipelined steps = ls_engine_step", &ref, &got);
    /* A sink that fails mid-rollout: the driver returns its failure and
     * leaves no step begun, so the engine steps again. */
    ls_engine_leave(e, 0);
    ls_sequence s = {9, p, 4, 0};
    ls_sampling g = greedy();
    int calls = 0;
    ck_assert_int_eq(ls_run_rollout(e, &s, 1, 6, &g, NULL, failing_sink, &calls, &err), LS_E_IO);
    ck_assert_int_eq(calls, 2);
    ck_assert_int_eq(ls_engine_step_end(e, &err), LS_E_USAGE);
    ck_assert_int_eq(ls_engine_join(e, 0, 9, 8, &err), LS_OK);
    ck_assert_msg(ls_engine_step(e, &steps[0], 1, &err) == LS_OK, "%s", err.msg);
    ls_engine_destroy(e);
    recs_free(&ref), recs_free(&got);
    free(p);
}
END_TEST

static void expect_config_rejected(const char *key, const char *value_json, const char *needle)
{
    setup();
    json_t *cfg = json_deep_copy(ls_checkpoint_config_json(g_ck));
    json_error_t je;
    json_t *v = json_loads(value_json, JSON_DECODE_ANY, &je);
    ck_assert_ptr_nonnull(v);
    json_object_set_new(cfg, key, v);
    ls_model_config mc;
    ls_error err;
    ls_error_clear(&err);
    ls_status st = ls_model_parse_config(cfg, &mc, &err);
    ck_assert_msg(st == LS_E_UNSUPPORTED || st == LS_E_INPUT, "%s=%s accepted", key, value_json);
    ck_assert_msg(strstr(err.msg, needle), "%s=%s: message '%s' does not name '%s'", key, value_json,
                  err.msg, needle);
    json_decref(cfg);
}

/* The config with key set to value_json parses. */
static void expect_config_accepted(const char *key, const char *value_json)
{
    setup();
    json_t *cfg = json_deep_copy(ls_checkpoint_config_json(g_ck));
    json_error_t je;
    json_t *v = json_loads(value_json, JSON_DECODE_ANY, &je);
    ck_assert_ptr_nonnull(v);
    json_object_set_new(cfg, key, v);
    ls_model_config mc;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_model_parse_config(cfg, &mc, &err) == LS_OK, "%s=%s refused: %s", key,
                  value_json, err.msg);
    json_decref(cfg);
}

START_TEST(test_config_fail_closed)
{
    char last[96];
    setup();
    snprintf(last, sizeof last, "[0, %ld]", g_model->cfg.vocab - 1);
    expect_config_accepted("eos_token_id", last);
    expect_config_accepted("eos_token_id", "null");
    expect_config_accepted("bos_token_id", "0");
    expect_config_accepted("quantization_config", "null");

    expect_config_rejected("hidden_act", "\"gelu\"", "hidden_act");
    expect_config_rejected("attention_bias", "true", "attention_bias");
    expect_config_rejected("rope_scaling", "{\"type\":\"yarn\",\"factor\":4}", "rope_scaling");
    expect_config_rejected("rope_parameters", "{\"rope_type\":\"yarn\"}", "rope_type");
    expect_config_rejected("decoder_sparse_step", "2", "decoder_sparse_step");
    expect_config_rejected("mlp_only_layers", "[1]", "mlp_only_layers");
    expect_config_rejected("tie_word_embeddings", "true", "tie_word_embeddings");
    expect_config_rejected("model_type", "\"qwen3_5_moe\"", "model_type");
    expect_config_rejected("rms_norm_eps", "1e-5", "rms_norm_eps");
    expect_config_rejected("layer_types", "[\"linear_attention\",\"sliding\",\"linear_attention\",\"full_attention\"]",
                           "layer_types");
    expect_config_rejected("hidden_size", "\"128\"", "hidden_size");
    expect_config_rejected("num_experts_per_tok", "99", "num_experts_per_tok");
    expect_config_rejected("partial_rotary_factor", "0.3", "partial_rotary_factor");
    expect_config_rejected("linear_num_value_heads", "3", "linear_num_value_heads");
    /* Token ids must lie in the vocabulary (an int or a list of ints). */
    char v[96];
    snprintf(v, sizeof v, "%ld", g_model->cfg.vocab);
    expect_config_rejected("eos_token_id", v, "eos_token_id");
    snprintf(v, sizeof v, "[0, %ld]", g_model->cfg.vocab);
    expect_config_rejected("eos_token_id", v, "eos_token_id[1]");
    expect_config_rejected("eos_token_id", "-1", "eos_token_id");
    expect_config_rejected("eos_token_id", "\"2\"", "eos_token_id");
    expect_config_rejected("bos_token_id", v, "bos_token_id[1]");
    /* FP8 block quantisation is the one quantised form read; others are
     * refused, not ignored (tests/test_fp8.c covers the FP8 fields). */
    expect_config_rejected("quantization_config", "{\"quant_method\":\"awq\"}",
                           "quantization_config.quant_method");
}
END_TEST

/* ---- digest_early's contract ---------------------------------------------
 * A backend whose digest_early reads its spans at the next digest_fence, the
 * latest the contract allows (the CUDA backend's branch of a step graph may
 * read them any time in between): the CPU backend with the jobs held until
 * the fence. The engine must write none of the spans in between, so its
 * records equal the plain backend's. */
typedef struct late_be {
    ls_backend be;      /* the inner backend's ops and impl; digest_early, digest_fence, destroy ours */
    ls_backend *inner;
    ls_digest_job *jobs; /* held until the fence */
    long n, cap, early_calls, held_over_ops;
} late_be;

static ls_status late_early(ls_backend *be, const ls_digest_job *jobs, long n, ls_error *err)
{
    late_be *l = (late_be *)be;
    if (l->n + n > l->cap) {
        long cap = 2 * (l->n + n);
        ls_digest_job *j = realloc(l->jobs, sizeof *j * (size_t)cap);
        if (!j) return ls_fail(err, LS_E_NOMEM, "late digests: %ld jobs", cap);
        l->jobs = j;
        l->cap = cap;
    }
    memcpy(l->jobs + l->n, jobs, sizeof *jobs * (size_t)n);
    l->n += n;
    l->early_calls++;
    return LS_OK;
}

static ls_status late_fence(ls_backend *be, ls_error *err)
{
    late_be *l = (late_be *)be;
    long n = l->n;
    l->n = 0;
    if (n == 0) return LS_OK;
    l->held_over_ops++;
    return l->inner->digest(l->inner, l->jobs, n, err);
}

static void late_destroy(ls_backend *be)
{
    late_be *l = (late_be *)be;
    l->inner->destroy(l->inner);
    free(l->jobs);
    free(l);
}

static ls_engine *mk_late(late_be **out)
{
    ls_error err;
    ls_backend *inner = NULL;
    ck_assert_msg(ls_backend_cpu_create(2, &inner, &err) == LS_OK, "%s", err.msg);
    late_be *l = calloc(1, sizeof *l);
    ck_assert_ptr_nonnull(l);
    ck_assert_ptr_null(inner->digest_early); /* the CPU backend digests at the call */
    l->be = *inner;
    l->inner = inner;
    l->be.digest_early = late_early;
    l->be.digest_fence = late_fence;
    l->be.destroy = late_destroy;
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.act_bf16 = 1;
    o.perturb_layer = -1;
    o.perturb_op = LS_PERTURB_NONE;
    o.max_rows = 256;
    o.state_digest_every = 1; /* every kind at every position, as mk */
    ls_engine *e = NULL;
    ck_assert_msg(ls_engine_create(g_model, &l->be, &o, 2, 256, &e, &err) == LS_OK, "%s", err.msg);
    *out = l;
    return e;
}

START_TEST(test_digest_early_read_at_fence)
{
    setup();
    int32_t *p0 = prompt(9, 31), *p1 = prompt(70, 32);
    ls_sequence s[2] = {{1, p0, 9, 0}, {2, p1, 70, 0}}, full[2];
    ls_sampling g = greedy();
    recs ref = {0}, got = {0}, rref = {0}, rgot = {0};
    ls_engine *e = mk(2, 1, -1, LS_PERTURB_NONE, 2, 256);
    rollout(e, s, 2, 6, &g, &ref, full);
    replay(e, full, 2, 7, &rref);
    ls_engine_destroy(e);
    late_be *l = NULL;
    e = mk_late(&l);
    rollout(e, s, 2, 6, &g, &got, NULL);
    replay(e, full, 2, 7, &rgot);
    ck_assert_msg(l->early_calls > 0 && l->held_over_ops > 0 && l->n == 0,
                  "digest_early calls %ld, held over ops %ld, left unfenced %ld", l->early_calls,
                  l->held_over_ops, l->n);
    ls_engine_destroy(e);
    expect_equal("rollout, spans read at the fence", &ref, &got);
    expect_equal("replay in chunks of 7, spans read at the fence", &rref, &rgot);
    recs_free(&ref), recs_free(&got), recs_free(&rref), recs_free(&rgot);
    for (int i = 0; i < 2; i++) free((void *)full[i].tokens);
    free(p0), free(p1);
}
END_TEST

/* The CUDA arena's usage is 0 of 0 for a backend that is not CUDA's (what
 * harness/long_context prints as "—" on the CPU). */
START_TEST(test_arena_usage_of_cpu_backend)
{
    ls_error err;
    ls_error_clear(&err);
    ls_backend *be = NULL;
    ck_assert_msg(ls_backend_cpu_create(1, &be, &err) == LS_OK, "%s", err.msg);
    size_t used = 1, cap = 1;
    ls_backend_cuda_arena_usage(be, &used, &cap);
    ck_assert_msg(used == 0 && cap == 0, "cpu backend: arena usage %zu of %zu, expected 0 of 0", used, cap);
    used = cap = 1;
    ls_backend_cuda_arena_usage(NULL, &used, &cap);
    ck_assert_msg(used == 0 && cap == 0, "no backend: arena usage %zu of %zu, expected 0 of 0", used, cap);
    be->destroy(be);
}
END_TEST

/* ls_run_engine_open_tier: the portable tier opens what ls_run_engine_open
 * opens; the tc tier is refused, before any device is touched, on the cpu
 * backend and above LS_RUN_TC_ROWS rows per call (tests/gpu/test_tier_tc.c
 * opens it on a GPU). */
START_TEST(test_open_tier_refusals)
{
    setup();
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = 16;
    ls_engine *e = NULL;
    ls_error err;
    ck_assert_msg(ls_run_engine_open_tier(g_model, "cpu", 1, 0, LS_TIER_PORTABLE, &o, 1, 32, &e, &err) == LS_OK, "%s",
                  err.msg);
    ck_assert_ptr_nonnull(e);
    ls_engine_destroy(e);
    ls_status st = ls_run_engine_open_tier(g_model, "cpu", 1, 0, LS_TIER_TC, &o, 1, 32, &e, &err);
    ck_assert_msg(st == LS_E_USAGE && strstr(err.msg, "cuda backend only") && !e, "tc on cpu: %d %s", (int)st,
                  err.msg);
    o.max_rows = LS_RUN_TC_ROWS + 1;
    st = ls_run_engine_open_tier(g_model, "cuda", 1, 0, LS_TIER_TC, &o, 1, 32, &e, &err);
    ck_assert_msg(st == LS_E_USAGE && strstr(err.msg, "rows per call") && !e, "tc above %d rows: %d %s",
                  LS_RUN_TC_ROWS, (int)st, err.msg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_records_from_summary);
    tcase_add_test(tc, test_step_pipeline);
    tcase_add_test(tc, test_digest_early_read_at_fence);
    tcase_add_test(tc, test_config_fail_closed);
    tcase_add_test(tc, test_arena_usage_of_cpu_backend);
    tcase_add_test(tc, test_open_tier_refusals);
    tcase_add_test(tc, test_rollout_equals_replay);
    tcase_add_test(tc, test_chunkings_and_packing);
    tcase_add_test(tc, test_decode_batch_and_sampling);
    tcase_add_test(tc, test_perturbation_detected);
    tcase_add_test(tc, test_step_continuous_batching);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
