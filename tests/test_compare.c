/* Comparator: equal traces, planted differences at every kind (reported at
 * exactly that location, nothing earlier), rollout vs replay framings, and
 * the CLI exit codes. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/compare.h"
#include "testutil.h"
#include "trace_synth.h"

static char *dir;
static char pa[4200], pb[4200];

static void setup(void)
{
    dir = ls_test_tmpdir("compare");
    snprintf(pa, sizeof pa, "%s/a.trace", dir);
    snprintf(pb, sizeof pb, "%s/b.trace", dir);
}
static void teardown(void) { ls_test_rm_tmpdir(dir); }

static void run(ls_compare_result *r, int expect_equal)
{
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_compare_files(pa, pb, NULL, r, &err) == LS_OK, "%s", err.msg);
    if (r->equal != expect_equal && r->first_seq >= 0)
        fprintf(stderr, "unexpected verdict; first drift: %s\n", r->seqs[r->first_seq].first.message);
    ck_assert_int_eq(r->equal, expect_equal);
}

START_TEST(test_equal_and_framings)
{
    syn_opts a = {.n_seqs = 3, .prompt_len = 7, .gen_len = 9};
    ck_assert_int_eq(syn_write(pa, &a), 0);
    static const int chunks[] = {0, 3, 64, 16};
    for (int i = 0; i < 4; i++) {
        syn_opts b = a;
        b.chunk = chunks[i];
        ck_assert_int_eq(syn_write(pb, &b), 0);
        for (int swap = 0; swap < 2; swap++) {
            ls_compare_result r;
            if (swap) { char t[4200]; strcpy(t, pa); strcpy(pa, pb); strcpy(pb, t); }
            run(&r, 1);
            ck_assert_uint_eq(r.n_seqs, 3);
            for (size_t s = 0; s < 3; s++) {
                ck_assert_uint_eq(r.seqs[s].positions_compared, 16);
                ck_assert_uint_eq(r.seqs[s].tokens_equal, 16);
                ck_assert_uint_eq(r.seqs[s].topk_set_equal, 16);
                ck_assert(r.seqs[s].pass);
                ck_assert(r.seqs[s].max_abs_dlogprob == 0.0);
            }
            ck_assert_int_eq(r.first_seq, -1);
            ls_compare_result_free(&r);
            if (swap) { char t[4200]; strcpy(t, pa); strcpy(pa, pb); strcpy(pb, t); }
        }
    }
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "compare '%s' '%s'", pa, pb), 0);
    ck_assert_msg(strstr(out, "PASS") && strstr(out, "16/16"), "%s", out);
    free(out);
}
END_TEST

typedef struct plant_case {
    syn_plant plant;
    ls_drift_what what;
} plant_case;

static const plant_case cases[] = {
    {{SYN_TOKEN, 1, 6, -1, 0, 0}, LS_DRIFT_TOKEN},
    {{SYN_NEXT_TOKEN, 1, 6, -1, 0, 0}, LS_DRIFT_NEXT_TOKEN},
    {{SYN_LOGPROB, 1, 6, -1, 0, 0}, LS_DRIFT_LOGPROB},
    {{SYN_TOPK_ORDER, 1, 6, -1, 0, 0}, LS_DRIFT_TOPK_ORDER},
    {{SYN_TOPK_SET, 1, 6, -1, 0, 0}, LS_DRIFT_TOPK_SET},
    {{SYN_DIGEST, 1, 6, 3, LS_DIGEST_HIDDEN, 0}, LS_DRIFT_DIGEST},
    {{SYN_DIGEST, 1, 6, 1, LS_DIGEST_GDN_STATE, 0}, LS_DRIFT_DIGEST},
    {{SYN_DIGEST, 1, 6, 1, LS_DIGEST_CONV_STATE, 0}, LS_DRIFT_DIGEST},
    {{SYN_DIGEST, 1, 6, 3, LS_DIGEST_KV, 0}, LS_DRIFT_DIGEST},
    {{SYN_DIGEST, 1, 6, 4, LS_DIGEST_ROUTER, 0}, LS_DRIFT_DIGEST},
    {{SYN_DIGEST, 1, 6, 6, LS_DIGEST_HIDDEN, 0}, LS_DRIFT_DIGEST},
};

START_TEST(test_planted)
{
    const plant_case *c = &cases[_i / 2];
    int b_chunk = (_i % 2) ? 3 : 0; /* B rollout-shaped or replay-shaped */
    syn_opts a = {.n_seqs = 3, .prompt_len = 4, .gen_len = 8};
    ck_assert_int_eq(syn_write(pa, &a), 0);
    syn_opts b = a;
    b.chunk = b_chunk;
    b.plant = c->plant;
    ck_assert_int_eq(syn_write(pb, &b), 0);
    ls_compare_result r;
    run(&r, 0);
    ck_assert_int_ge(r.first_seq, 0);
    const ls_compare_seq *s = &r.seqs[r.first_seq];
    const ls_compare_drift *d = &s->first;
    ck_assert_msg(d->what == c->what && d->seq == 1 && d->pos == 6, "case %d: got %s at seq %u pos %u: %s", _i / 2,
                  ls_drift_what_name(d->what), d->seq, d->pos, d->message);
    if (c->what == LS_DRIFT_DIGEST) {
        ck_assert_int_eq(d->layer, c->plant.layer);
        ck_assert_int_eq(d->kind, c->plant.kind);
        ck_assert_int_eq(d->family, syn_layers[c->plant.layer].family);
    } else {
        ck_assert_int_eq(d->layer, -1);
    }
    for (size_t i = 0; i < r.n_seqs; i++) ck_assert_int_eq(r.seqs[i].pass, r.seqs[i].seq != 1);
    ck_assert_uint_eq(s->positions_compared, 12);
    ls_compare_result_free(&r);
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "compare '%s' '%s'", pa, pb), 1);
    ck_assert_msg(strstr(out, "seq 1 pos 6") && strstr(out, "FAIL"), "%s", out);
    free(out);
}
END_TEST

START_TEST(test_tensor_and_router_detail)
{
    syn_opts a = {.n_seqs = 2, .prompt_len = 3, .gen_len = 4, .dumps = 1};
    ck_assert_int_eq(syn_write(pa, &a), 0);
    syn_opts b = a;
    b.chunk = 2;
    b.plant = (syn_plant){SYN_DIGEST, 0, 4, 1, LS_DIGEST_HIDDEN, 5};
    ck_assert_int_eq(syn_write(pb, &b), 0);
    ls_compare_result r;
    run(&r, 0);
    const ls_compare_drift *d = &r.seqs[r.first_seq].first;
    ck_assert_int_eq(d->pos, 4);
    ck_assert(d->tensor.present);
    ck_assert_int_eq(d->tensor.first_index, 5);
    ck_assert_uint_eq(d->tensor.ulp, 3);
    ck_assert_uint_eq(d->tensor.n_differ, 1);
    ck_assert_uint_eq(d->tensor.b_bits - d->tensor.a_bits, 3);
    ck_assert(d->tensor.max_abs > 0 && d->tensor.mean_abs > 0);
    ls_compare_result_free(&r);

    b.plant = (syn_plant){SYN_DIGEST, 1, 2, 2, LS_DIGEST_ROUTER, 0};
    ck_assert_int_eq(syn_write(pb, &b), 0);
    run(&r, 0);
    d = &r.seqs[r.first_seq].first;
    ck_assert_int_eq(d->layer, 2);
    ck_assert(d->tensor.present && d->tensor.router_order_differs && !d->tensor.router_set_differs);
    ck_assert_uint_eq(r.router_differ_per_layer[2], 1);
    ls_compare_result_free(&r);
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "compare '%s' '%s'", pa, pb), 1);
    ck_assert_msg(strstr(out, "router top-4 ids") && strstr(out, "order differs") && strstr(out, "router differences"), "%s", out);
    free(out);
}
END_TEST

/* Digest accounting does not depend on which path compared a record: equal
 * raw bytes, equal digest arrays behind a differing logprob, or the
 * per-digest walk (traces carrying different digest kinds). */
START_TEST(test_digest_accounting)
{
    ls_compare_result r;
    syn_opts a = {.n_seqs = 3, .prompt_len = 4, .gen_len = 8};
    ck_assert_int_eq(syn_write(pa, &a), 0);
    syn_opts b = a;
    b.chunk = 3;
    ck_assert_int_eq(syn_write(pb, &b), 0);
    run(&r, 1);
    uint64_t all = r.seqs[1].digests_compared;
    ck_assert_uint_gt(all, 12);
    ls_compare_result_free(&r);
    /* a differing logprob: the digests are still all compared, all equal */
    b.plant = (syn_plant){SYN_LOGPROB, 1, 6, 0, 0, 0};
    ck_assert_int_eq(syn_write(pb, &b), 0);
    run(&r, 0);
    const ls_compare_seq *s = &r.seqs[1];
    ck_assert_int_eq(s->first.what, LS_DRIFT_LOGPROB);
    ck_assert_uint_eq(s->digests_compared, all);
    ck_assert_uint_eq(s->digests_differ, 0);
    ck_assert_uint_eq(s->pos_per_col, 1);
    for (int l = 0; l < r.n_layers; l++)
        ck_assert_msg(s->cells[(size_t)(1 + l) * s->cols + 6] == LS_CELL_EQUAL, "layer %d cell %u", l,
                      s->cells[(size_t)(1 + l) * s->cols + 6]);
    ck_assert_uint_eq(s->cells[(size_t)(r.n_layers + 1) * s->cols + 6], LS_CELL_FIRST);
    ls_compare_result_free(&r);
    /* B carries hidden and router digests only: those are compared, walked record by record */
    uint32_t sub = (1u << LS_DIGEST_HIDDEN) | (1u << LS_DIGEST_ROUTER);
    b.plant = (syn_plant){SYN_NONE, 0, 0, 0, 0, 0};
    b.kinds_mask = (int)sub;
    ck_assert_int_eq(syn_write(pb, &b), 0);
    run(&r, 1);
    ck_assert_uint_eq(r.kinds_compared, sub);
    uint64_t shared = r.seqs[1].digests_compared;
    ck_assert(shared > 0 && shared < all);
    ls_compare_result_free(&r);
    syn_opts a2 = a;
    a2.kinds_mask = (int)sub;
    ck_assert_int_eq(syn_write(pa, &a2), 0);
    run(&r, 1);
    ck_assert_uint_eq(r.seqs[1].digests_compared, shared);
    ls_compare_result_free(&r);
    /* and a digest drift among the shared kinds is found at its layer */
    ck_assert_int_eq(syn_write(pa, &a), 0);
    b.plant = (syn_plant){SYN_DIGEST, 1, 6, 4, LS_DIGEST_ROUTER, 0};
    ck_assert_int_eq(syn_write(pb, &b), 0);
    run(&r, 0);
    s = &r.seqs[1];
    ck_assert_int_eq(s->first.what, LS_DRIFT_DIGEST);
    ck_assert_int_eq(s->first.layer, 4);
    ck_assert_int_eq(s->first.kind, LS_DIGEST_ROUTER);
    ck_assert_uint_eq(s->digests_differ, 1);
    ls_compare_result_free(&r);
}
END_TEST

START_TEST(test_models_and_coverage)
{
    char other[65];
    memset(other, 'c', 64);
    other[64] = 0;
    syn_opts a = {.n_seqs = 2, .prompt_len = 3, .gen_len = 3};
    ck_assert_int_eq(syn_write(pa, &a), 0);
    syn_opts b = a;
    b.model = other;
    ck_assert_int_eq(syn_write(pb, &b), 0);
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "compare '%s' '%s'", pa, pb), 2);
    ck_assert_msg(strstr(out, "different models"), "%s", out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "compare --allow-different-model '%s' '%s'", pa, pb), 0);
    free(out);
    /* B has one more decode step: positions only in B are a drift */
    b = a;
    b.gen_len = 4;
    ck_assert_int_eq(syn_write(pb, &b), 0);
    ls_compare_result r;
    run(&r, 0);
    /* A's last position has no next token; B's does */
    ck_assert_int_eq(r.seqs[0].first.what, LS_DRIFT_NEXT_TOKEN);
    ck_assert_uint_eq(r.seqs[0].first.pos, 5);
    ck_assert_uint_eq(r.seqs[0].positions_only_b, 1);
    ls_compare_result_free(&r);
    /* digest-free B: compares tokens, logprobs and top-k only and says so */
    b = a;
    b.kinds_mask = -1;
    ck_assert_int_eq(syn_write(pb, &b), 0);
    ck_assert_int_eq(ls_test_cli(&out, "compare '%s' '%s'", pa, pb), 0);
    ck_assert_msg(strstr(out, "no digests") && strstr(out, "digest kinds: none"), "%s", out);
    free(out);
    /* A missing a position in the middle: reported as present only in B */
    b = a;
    b.prompt_len = 2;
    b.gen_len = 4;
    ck_assert_int_eq(syn_write(pb, &b), 0);
    ck_assert_int_eq(ls_test_cli(&out, "compare --help"), 0);
    ck_assert(strstr(out, "exit status"));
    free(out);
}
END_TEST

START_TEST(test_import_jsonl)
{
    char ja[4200], jb[4200], jc[4200];
    snprintf(ja, sizeof ja, "%s/a.jsonl", dir);
    snprintf(jb, sizeof jb, "%s/b.jsonl", dir);
    snprintf(jc, sizeof jc, "%s/c.jsonl", dir);
    const char *fp = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    /* -0.1 as text must give fp32 0xbdcccccd (nearest float), not the double-rounded value */
    const char *la = "{\"seq\":0,\"pos\":3,\"token\":5,\"logprob\":-0.1,\"top_logprobs\":{\"5\":-0.1,\"9\":\"-0x1.8p+1\"}}\n"
                     "{\"seq\":0,\"pos\":4,\"token\":6,\"logprob\":-2.5,\"top_logprobs\":{\"6\":-2.5}}\n";
    /* B: the second logprob one ULP away (-2.5000002) */
    const char *lb = "{\"seq\":0,\"pos\":3,\"token\":5,\"logprob\":-0.1,\"top_logprobs\":{\"5\":-0.1,\"9\":-3}}\n"
                     "{\"seq\":0,\"pos\":4,\"token\":6,\"logprob\":-2.5000002,\"top_logprobs\":{\"6\":-2.5}}\n";
    ls_test_write(ja, la, strlen(la));
    ls_test_write(jb, lb, strlen(lb));
    ls_test_write(jc, "{\"seq\":0,\"pos\":3,\"token\":5,\"logprob\":-1}\n{\"seq\":0,\"pos\":x}\n", 59);
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "import jsonl '%s' -o '%s' --model-fingerprint %s", ja, pa, fp), 0);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "import jsonl '%s' -o '%s' --model-fingerprint %s", jb, pb, fp), 0);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "trace dump '%s'", pa), 0);
    ck_assert_msg(strstr(out, "seq 0 pos 2: token -1 -> next 5 logprob 0xbdcccccd") && strstr(out, "9:-3"), "%s", out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "compare '%s' '%s'", pa, pb), 1);
    ck_assert_msg(strstr(out, "seq 0 pos 3: selected-token logprob bits differ: A 0xc0200000") &&
                  strstr(out, "no digests") && strstr(out, "input tokens not compared"), "%s", out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "import jsonl '%s' -o '%s' --model-fingerprint %s", jc, pb, fp), 2);
    ck_assert_msg(strstr(out, "line 2, byte offset 56: expected a number"), "%s", out);
    free(out);
}
END_TEST

/* An imported trace of a synthetic run: positions [first, end) of every
 * sequence but skip_seq, without skip_pos of seq 1; no input tokens, no
 * digests (as an engine import has). */
static int write_import(const char *path, const syn_opts *o, int first, int skip_seq, int skip_pos)
{
    ls_trace_header h = {0};
    h.mode = "import";
    h.engine = "engine";
    h.model_fingerprint = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    h.manifest_digest = "";
    h.run_params_json = "{}";
    h.topk = 5;
    h.state_digest_every = 1;
    ls_error err;
    ls_trace_writer *w;
    if (ls_trace_writer_open(path, &h, &w, &err)) return 1;
    ls_trace_digest dg[64];
    ls_trace_dump dm[16];
    uint8_t data[16][SYN_D * 4];
    ls_trace_record rec;
    if (ls_trace_writer_begin_frame(w, LS_FRAME_IMPORT, &err)) goto fail;
    for (int q = 0; q < o->n_seqs; q++)
        for (int p = first; p < o->prompt_len + o->gen_len && q != skip_seq; p++) {
            if (q == 1 && p == skip_pos) continue;
            syn_record(o, (uint32_t)q, (uint32_t)p, &rec, dg, dm, data);
            rec.token = -1;
            rec.n_digests = rec.n_dumps = 0;
            if (ls_trace_writer_add(w, &rec, &err)) goto fail;
        }
    if (ls_trace_writer_end_frame(w, &err) || ls_trace_writer_close(w, &err)) return 1;
    return 0;
fail:
    ls_trace_writer_abort(w);
    return 1;
}

START_TEST(test_import_positions)
{
    /* B: a full rollout (prompt 4, 5 generated); A: an import from the last prompt position on */
    syn_opts full = {.n_seqs = 2, .prompt_len = 4, .gen_len = 5};
    ck_assert_int_eq(syn_write(pb, &full), 0);
    ck_assert_int_eq(write_import(pa, &full, 3, -1, -1), 0);
    for (int swap = 0; swap < 2; swap++) {
        ls_compare_result r;
        if (swap) { char t[4200]; strcpy(t, pa); strcpy(pa, pb); strcpy(pb, t); }
        run(&r, 1);
        ck_assert_uint_eq(r.positions_outside_import, 6);
        for (size_t i = 0; i < r.n_seqs; i++) {
            ck_assert_uint_eq(r.seqs[i].positions_compared, 6);
            ck_assert_uint_eq(swap ? r.seqs[i].positions_only_a : r.seqs[i].positions_only_b, 3);
        }
        ck_assert_msg(strstr(r.note, swap ? "trace B is an import" : "trace A is an import") &&
                          strstr(r.note, swap ? "6 positions of trace A before" : "6 positions of trace B before"),
                      "%s", r.note);
        ls_compare_result_free(&r);
        char *out = NULL;
        ck_assert_int_eq(ls_test_cli(&out, "compare '%s' '%s'", pa, pb), 0);
        ck_assert_msg(strstr(out, "6/9") && strstr(out, "(prompt) not compared"), "%s", out);
        free(out);
        if (swap) { char t[4200]; strcpy(t, pa); strcpy(pa, pb); strcpy(pb, t); }
    }
    /* a hole inside the import is still a drift, in either direction */
    ck_assert_int_eq(write_import(pa, &full, 3, -1, 6), 0);
    for (int swap = 0; swap < 2; swap++) {
        ls_compare_result r;
        if (swap) { char t[4200]; strcpy(t, pa); strcpy(pa, pb); strcpy(pb, t); }
        run(&r, 0);
        const ls_compare_seq *s = &r.seqs[1];
        ck_assert_msg(!s->pass && s->first.what == LS_DRIFT_MISSING && s->first.pos == 6, "%s", s->first.message);
        ck_assert(r.seqs[0].pass);
        ls_compare_result_free(&r);
        if (swap) { char t[4200]; strcpy(t, pa); strcpy(pa, pb); strcpy(pb, t); }
    }
    /* a sequence the import lacks fails */
    ck_assert_int_eq(write_import(pa, &full, 3, 1, -1), 0);
    ls_compare_result r;
    run(&r, 0);
    ck_assert_msg(!r.seqs[1].pass && r.seqs[1].first.what == LS_DRIFT_MISSING && r.seqs[1].first.pos == 0, "%s",
                  r.seqs[1].first.message);
    ls_compare_result_free(&r);
    /* the imported positions are compared: a changed logprob is named */
    syn_opts planted = full;
    planted.plant = (syn_plant){SYN_LOGPROB, 0, 5, -1, 0, 0};
    ck_assert_int_eq(write_import(pa, &planted, 3, -1, -1), 0);
    run(&r, 0);
    ck_assert_msg(r.seqs[0].first.what == LS_DRIFT_LOGPROB && r.seqs[0].first.pos == 5, "%s", r.seqs[0].first.message);
    ls_compare_result_free(&r);
}
END_TEST

START_TEST(test_logprobs_only)
{
    syn_opts a = {.n_seqs = 2, .prompt_len = 3, .gen_len = 4};
    ck_assert_int_eq(syn_write(pa, &a), 0);
    static const syn_plant ignored[] = {{SYN_TOPK_SET, 1, 4, -1, 0, 0}, {SYN_TOPK_ORDER, 0, 2, -1, 0, 0},
                                        {SYN_DIGEST, 1, 2, 3, LS_DIGEST_HIDDEN, 0}};
    ls_error err;
    ls_compare_result r;
    const ls_compare_diag lpo = {.logprobs_only = 1};
    for (int i = 0; i < 3; i++) {
        syn_opts b = a;
        b.chunk = 2;
        b.plant = ignored[i];
        ck_assert_int_eq(syn_write(pb, &b), 0);
        ck_assert(ls_compare_files(pa, pb, NULL, &r, &err) == LS_OK);
        ck_assert_int_eq(r.equal, 0); /* everything compared: found */
        ls_compare_result_free(&r);
        ck_assert_msg(ls_compare_files_diag(pa, pb, NULL, &lpo, &r, &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(r.equal, "plant %d: %s", i, r.first_seq >= 0 ? r.seqs[r.first_seq].first.message : "");
        ck_assert_int_eq(r.topk_compared, 0);
        ck_assert_uint_eq(r.kinds_compared, 0);
        ck_assert_uint_eq(r.seqs[0].digests_compared, 0);
        ck_assert_msg(strstr(r.note, "logprobs only"), "%s", r.note);
        ls_compare_result_free(&r);
    }
    syn_opts b = a;
    b.plant = (syn_plant){SYN_LOGPROB, 1, 4, -1, 0, 0};
    ck_assert_int_eq(syn_write(pb, &b), 0);
    ck_assert(ls_compare_files_diag(pa, pb, NULL, &lpo, &r, &err) == LS_OK);
    ck_assert_int_eq(r.equal, 0);
    ck_assert_msg(r.seqs[1].first.what == LS_DRIFT_LOGPROB && r.seqs[1].first.pos == 4, "%s", r.seqs[1].first.message);
    ls_compare_result_free(&r);
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "compare --logprobs-only '%s' '%s' --json '%s/r.json'", pa, pb, dir), 1);
    ck_assert_msg(strstr(out, "tokens and selected logprob bits (no top-k)") &&
                      strstr(out, "seq 1 pos 4: selected-token logprob bits differ"),
                  "%s", out);
    free(out);
    /* the JSON report still meets its schema (topk_compared 0) */
    int rc = ls_test_sh(&out, "/usr/bin/python3 -c 'import json,sys,jsonschema; "
                        "r=json.load(open(sys.argv[2])); assert r[\"topk_compared\"]==0; "
                        "jsonschema.Draft202012Validator(json.load(open(sys.argv[1]))).validate(r); print(\"ok\")' "
                        "'%s/docs/compare-json.schema.json' '%s/r.json'", LS_SOURCE_DIR, dir);
    ck_assert_msg(rc == 0 && !strcmp(out, "ok\n"), "%s", out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("compare");
    TCase *tc = tcase_create("compare");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_equal_and_framings);
    tcase_add_loop_test(tc, test_planted, 0, 2 * (int)(sizeof cases / sizeof cases[0]));
    tcase_add_test(tc, test_tensor_and_router_detail);
    tcase_add_test(tc, test_digest_accounting);
    tcase_add_test(tc, test_models_and_coverage);
    tcase_add_test(tc, test_import_jsonl);
    tcase_add_test(tc, test_import_positions);
    tcase_add_test(tc, test_logprobs_only);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
