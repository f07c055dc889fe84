/* Trace writer/reader: round trip of every field, index lookups, versioning. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "trace_synth.h"

static void expect_same(const ls_trace_record *got, const ls_trace_record *want)
{
    ck_assert_uint_eq(got->seq, want->seq);
    ck_assert_uint_eq(got->pos, want->pos);
    ck_assert_int_eq(got->token, want->token);
    ck_assert_int_eq(got->next_token, want->next_token);
    ck_assert_msg(got->logprob_bits == want->logprob_bits, "seq %u pos %u: logprob 0x%08x != 0x%08x", want->seq,
                  want->pos, got->logprob_bits, want->logprob_bits);
    for (int k = 0; k < 5; k++) {
        ck_assert_int_eq(got->topk_ids[k], want->topk_ids[k]);
        ck_assert_uint_eq(got->topk_logprob_bits[k], want->topk_logprob_bits[k]);
    }
    ck_assert_uint_eq(got->n_digests, want->n_digests);
    for (uint32_t i = 0; i < want->n_digests; i++) {
        ck_assert_uint_eq(got->digests[i].layer, want->digests[i].layer);
        ck_assert_uint_eq(got->digests[i].kind, want->digests[i].kind);
        ck_assert_msg(ls_digest_equal(&got->digests[i].digest, &want->digests[i].digest), "digest %u differs", i);
    }
    ck_assert_uint_eq(got->n_dumps, want->n_dumps);
    for (uint32_t i = 0; i < want->n_dumps; i++) {
        const ls_trace_dump *a = &got->dumps[i], *b = &want->dumps[i];
        ck_assert_uint_eq(a->layer, b->layer);
        ck_assert_uint_eq(a->kind, b->kind);
        ck_assert_uint_eq(a->dtype, b->dtype);
        ck_assert_uint_eq(a->n_elems, b->n_elems);
        ck_assert(memcmp(a->data, b->data, a->n_elems * ls_dump_dtype_size(a->dtype)) == 0);
    }
}

START_TEST(test_round_trip)
{
    char *dir = ls_test_tmpdir("trace");
    char path[4200];
    snprintf(path, sizeof path, "%s/a.trace", dir);
    syn_opts o = {.n_seqs = 3, .prompt_len = 5, .gen_len = 7, .chunk = _i ? 4 : 0, .dumps = 1};
    ck_assert_int_eq(syn_write(path, &o), 0);
    ls_error err;
    ls_error_clear(&err);
    ls_trace_reader *r;
    ck_assert_msg(ls_trace_reader_open(path, &r, &err) == LS_OK, "%s", err.msg);
    const ls_trace_header *h = ls_trace_reader_header(r);
    ck_assert_str_eq(h->mode, _i ? "replay" : "rollout");
    ck_assert_str_eq(h->engine, "synthetic");
    ck_assert_int_eq(h->topk, 5);
    ck_assert_uint_eq(h->digest_kinds_mask, 0x1f);
    ck_assert_uint_eq(h->version_major, LS_TRACE_VERSION_MAJOR);
    ck_assert_int_eq(h->n_layers, SYN_N_LAYERS);
    ck_assert_str_eq(h->activation_dtype, "bf16");
    for (int i = 0; i < SYN_N_LAYERS; i++) {
        ck_assert_int_eq(h->layers[i].family, syn_layers[i].family);
        ck_assert_int_eq(h->layers[i].decoder_layer, syn_layers[i].decoder_layer);
    }
    ck_assert(strstr(h->run_params_json, _i ? "\"chunk\"" : "\"temperature\"") != NULL);
    ls_trace_digest dg[64];
    ls_trace_dump dm[16];
    uint8_t data[16][SYN_D * 4];
    ls_trace_record want;
    int n = 0;
    const ls_trace_record *rec;
    for (;;) {
        ck_assert_msg(ls_trace_reader_next(r, &rec, &err) == LS_OK, "%s", err.msg);
        if (!rec) break;
        syn_record(&o, rec->seq, rec->pos, &want, dg, dm, data);
        expect_same(rec, &want);
        n++;
    }
    ck_assert_int_eq(n, 3 * 12);
    ck_assert_int_eq(ls_trace_reader_complete(r), 1);
    ck_assert_uint_eq(ls_trace_reader_records(r), 36);
    ls_trace_reader_close(r);

    ls_trace_index *ix;
    ck_assert_msg(ls_trace_index_open(path, &ix, &err) == LS_OK, "%s", err.msg);
    ck_assert_uint_eq(ls_trace_index_n_seqs(ix), 3);
    ck_assert_uint_eq(ls_trace_index_seq_positions(ix, 2), 12);
    ck_assert_uint_eq(ls_trace_index_seq_end(ix, 1), 12);
    for (uint32_t s = 0; s < 4; s++)
        for (uint32_t p = 0; p < 13; p++) {
            ck_assert_msg(ls_trace_index_find(ix, s, p, &rec, &err) == LS_OK, "%s", err.msg);
            if (s == 3 || p == 12) {
                ck_assert_ptr_null(rec);
                continue;
            }
            ck_assert_ptr_nonnull(rec);
            syn_record(&o, s, p, &want, dg, dm, data);
            expect_same(rec, &want);
        }
    ls_trace_index_close(ix);
    ls_test_rm_tmpdir(dir);
}
END_TEST

START_TEST(test_writer_rejects)
{
    char *dir = ls_test_tmpdir("trace");
    char path[4200];
    snprintf(path, sizeof path, "%s/b.trace", dir);
    char model[65];
    memset(model, 'b', 64);
    model[64] = 0;
    ls_trace_header h = {.mode = "rollout", .model_fingerprint = model, .topk = 5, .digest_kinds_mask = 0,
                         .n_layers = SYN_N_LAYERS, .layers = syn_layers};
    ls_error err;
    ls_trace_writer *w;
    ck_assert_int_eq(ls_trace_writer_open(path, &h, &w, &err), LS_OK);
    ck_assert_int_eq(ls_trace_writer_begin_frame(w, LS_FRAME_PREFILL, &err), LS_OK);
    ls_trace_record rec = {.seq = 0, .pos = 4};
    for (int k = 0; k < 5; k++) rec.topk_ids[k] = -1, rec.topk_logprob_bits[k] = 0x7fc00000u; /* unused slots */
    ck_assert_int_eq(ls_trace_writer_add(w, &rec, &err), LS_OK);
    rec.pos = 4; /* repeat */
    ck_assert_int_eq(ls_trace_writer_add(w, &rec, &err), LS_E_USAGE);
    ck_assert(strstr(err.msg, "positions must increase"));
    ls_trace_digest d = {.layer = 0, .kind = LS_DIGEST_ROUTER};
    rec.pos = 5;
    rec.n_digests = 1;
    rec.digests = &d;
    ck_assert_int_eq(ls_trace_writer_add(w, &rec, &err), LS_E_USAGE); /* kind not in header */
    ck_assert_int_eq(ls_trace_writer_end_frame(w, &err), LS_OK);
    ck_assert_int_eq(ls_trace_writer_close(w, &err), LS_OK);
    h.topk = 0;
    ck_assert_int_eq(ls_trace_writer_open(path, &h, &w, &err), LS_E_USAGE);
    ls_test_rm_tmpdir(dir);
}
END_TEST

START_TEST(test_unknown_major)
{
    char *dir = ls_test_tmpdir("trace");
    char path[4200];
    snprintf(path, sizeof path, "%s/c.trace", dir);
    syn_opts o = {.n_seqs = 1, .prompt_len = 2, .gen_len = 1};
    ck_assert_int_eq(syn_write(path, &o), 0);
    size_t len;
    char *b = ls_test_read(path, &len);
    b[8] = 2; /* major version 2 */
    ls_test_write(path, b, len);
    free(b);
    ls_error err;
    ls_trace_reader *r;
    ck_assert_int_eq(ls_trace_reader_open(path, &r, &err), LS_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "offset 8") && strstr(err.msg, "version 2.0"), "%s", err.msg);
    ls_test_rm_tmpdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("trace");
    tcase_add_loop_test(tc, test_round_trip, 0, 2);
    tcase_add_test(tc, test_writer_rejects);
    tcase_add_test(tc, test_unknown_major);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
