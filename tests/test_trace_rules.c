/* The reader holds each rule of docs/trace-format.md that an independent
 * implementation found unchecked or misreported: a file that breaks exactly
 * one rule (every checksum recomputed by trace_raw.h) is refused with a
 * message naming that rule, and a file the rules allow is read. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "testutil.h"
#include "trace_raw.h"
#include "trace_synth.h"

static char *dir;
static char good[4200], bad[4200];
static raw_trace t;

/* Record layout with K = 5 (section 5): the digest array starts at byte 68. */
#define REC_DIGESTS 68

static void setup(void)
{
    dir = ls_test_tmpdir("rules");
    snprintf(good, sizeof good, "%s/good.trace", dir);
    snprintf(bad, sizeof bad, "%s/bad.trace", dir);
    syn_opts o = {.n_seqs = 2, .prompt_len = 3, .gen_len = 3, .dumps = 1};
    ck_assert_int_eq(syn_write(good, &o), 0);
    ck_assert_int_eq(raw_load(good, &t), 0);
    ck_assert_int_eq(t.n_frames, 4);
    ck_assert(t.trailer);
}

/* The last 600 characters of a command's output (Check limits message sizes). */
static const char *tail(const char *out)
{
    if (!out) return "";
    size_t n = strlen(out);
    return n > 600 ? out + n - 600 : out;
}

static void teardown(void)
{
    raw_free(&t);
    ls_test_rm_tmpdir(dir);
}

/* Saves t to bad; 'trace dump' and 'compare' (as A and as B) must exit 2
 * naming `want`. */
static void expect_refused(const char *want)
{
    ck_assert_int_eq(raw_save(bad, &t), 0);
    char *out = NULL;
    int rc = ls_test_cli(&out, "trace dump '%s'", bad);
    ck_assert_msg(rc == 2 && out && strstr(out, want), "dump rc %d, wanted '%s' in: %s", rc, want, tail(out));
    free(out);
    rc = ls_test_cli(&out, "compare '%s' '%s'", good, bad);
    ck_assert_msg(rc == 2 && out && strstr(out, want), "compare(B) rc %d, wanted '%s' in: %s", rc, want, tail(out));
    free(out);
    rc = ls_test_cli(&out, "compare '%s' '%s'", bad, good);
    ck_assert_msg(rc == 2 && out && strstr(out, want), "compare(A) rc %d, wanted '%s' in: %s", rc, want, tail(out));
    free(out);
}

/* Saves t to bad; it must compare bitwise equal with good. */
static void expect_equal_to_good(void)
{
    ck_assert_int_eq(raw_save(bad, &t), 0);
    char *out = NULL;
    int rc = ls_test_cli(&out, "compare '%s' '%s'", good, bad);
    ck_assert_msg(rc == 0, "compare rc %d: %s", rc, tail(out));
    free(out);
}

/* The helper itself: a trace taken apart and saved again is the same trace. */
START_TEST(test_raw_round_trip)
{
    expect_equal_to_good();
    char *out = NULL;
    int rc = ls_test_cli(&out, "trace dump '%s'", bad);
    ck_assert_msg(rc == 0 && strstr(out, "complete"), "dump rc %d: %s", rc, tail(out));
    free(out);
}
END_TEST

/* The reserved-bytes rule (top of the document): a frame's flags (byte 5)
 * and reserved bytes (6..7) are zero, and a nonzero one is named, as the
 * digest pad byte and the trailer's reserved bytes are. */
START_TEST(test_frame_reserved_named)
{
    t.fr[1].flags = 0x01;
    expect_refused("frame header corrupted: flags (byte 5) are 0x01, must be 0");
    t.fr[1].flags = 0;
    t.fr[1].reserved = 0x0100;
    expect_refused("frame header corrupted: reserved bytes 6..7 are 0x0100, must be 0");
    t.fr[1].reserved = 0;
    expect_equal_to_good();
}
END_TEST

/* A digest entry's byte 3 is reserved (0); a nonzero one is named as such,
 * not as an unknown kind. */
START_TEST(test_digest_pad_byte)
{
    uint8_t *r = raw_record(&t.fr[0], 1);
    ck_assert_uint_eq(r[REC_DIGESTS + 2], LS_DIGEST_HIDDEN);
    r[REC_DIGESTS + 3] = 7;
    expect_refused("digest 0: reserved byte 3 is 0x07, must be 0");
}
END_TEST

/* A trailer whose byte count is off names the byte counts it compared. */
START_TEST(test_trailer_bytes_count)
{
    uint64_t bytes = 0;
    for (int i = 0; i < t.n_frames; i++) bytes += t.fr[i].len;
    t.trailer_bytes_delta = 1;
    char want[160];
    snprintf(want, sizeof want, "trailer says %" PRIu64 " uncompressed payload bytes, the frames hold %" PRIu64,
             bytes + 1, bytes);
    expect_refused(want);
    t.trailer_bytes_delta = 0;
    t.trailer_reserved = 1;
    expect_refused("trailer reserved bytes 4..7 are 0x00000001, must be 0");
}
END_TEST

/* Section 5: a dump's data are the canonical bytes of its kind, so their
 * SHA-256 is the record's digest of the same (layer, kind). */
START_TEST(test_dump_matches_digest)
{
    /* record 0 of the prefill frame: dumps of layer 1 hidden, layer 2 hidden and router */
    uint8_t *r = raw_record(&t.fr[0], 0);
    uint16_t nd = (uint16_t)(r[64] | r[65] << 8), nm = (uint16_t)(r[66] | r[67] << 8);
    ck_assert_uint_eq(nm, 3);
    uint8_t *dump = r + REC_DIGESTS + 36 * (size_t)nd;
    ck_assert_uint_eq(dump[0], 1);
    ck_assert_uint_eq(dump[2], LS_DIGEST_HIDDEN);
    dump[8 + 5] ^= 0x01;
    expect_refused("dump 0 (layer 1, hidden): the SHA-256 of its data is not the record's hidden digest of layer 1");
    dump[8 + 5] ^= 0x01;
    expect_equal_to_good();
    /* a dump whose digest the record does not carry: digest 1 is layer 1's hidden */
    ck_assert_uint_eq(r[REC_DIGESTS + 36], 1);
    ck_assert_uint_eq(r[REC_DIGESTS + 36 + 2], LS_DIGEST_HIDDEN);
    r = raw_splice(&t.fr[0], 0, REC_DIGESTS + 36, 36, NULL, 0);
    r[64] = (uint8_t)(nd - 1);
    expect_refused("dump 0 (layer 1, hidden): the record carries no hidden digest of layer 1");
}
END_TEST

/* The writer refuses what the reader would refuse. */
START_TEST(test_writer_dump_digest)
{
    char model[65];
    memset(model, 'a', 64);
    model[64] = 0;
    ls_trace_header h = {.mode = "rollout", .engine = "test", .model_fingerprint = model, .manifest_digest = "",
                         .run_params_json = "{}", .topk = 5, .digest_kinds_mask = 1u << LS_DIGEST_HIDDEN,
                         .state_digest_every = 1, .n_layers = SYN_N_LAYERS, .layers = syn_layers};
    ls_error err;
    ls_error_clear(&err);
    ls_trace_writer *w;
    ck_assert_msg(ls_trace_writer_open(bad, &h, &w, &err) == LS_OK, "%s", err.msg);
    ck_assert(ls_trace_writer_begin_frame(w, LS_FRAME_PREFILL, &err) == LS_OK);
    uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ls_trace_digest dg[SYN_N_LAYERS];
    for (int l = 0; l < SYN_N_LAYERS; l++) {
        dg[l] = (ls_trace_digest){(uint16_t)l, LS_DIGEST_HIDDEN, {{0}}};
        ls_sha256_buf(data, sizeof data, &dg[l].digest, NULL);
    }
    dg[3].digest.bytes[0] ^= 1;
    ls_trace_dump dm[2] = {{1, LS_DIGEST_HIDDEN, LS_DUMP_BF16, 4, data}, {3, LS_DIGEST_HIDDEN, LS_DUMP_BF16, 4, data}};
    ls_trace_record rec = {.seq = 0, .pos = 0, .token = 1, .next_token = -1, .logprob_bits = 0x7fc00000u,
                           .n_digests = SYN_N_LAYERS, .digests = dg, .n_dumps = 1, .dumps = dm};
    for (int k = 0; k < 5; k++) rec.topk_ids[k] = -1, rec.topk_logprob_bits[k] = 0x7fc00000u;
    ck_assert_msg(ls_trace_writer_add(w, &rec, &err) == LS_OK, "%s", err.msg);
    rec.pos = 1;
    rec.n_dumps = 2; /* layer 3's digest is not the SHA-256 of its dump */
    ck_assert(ls_trace_writer_add(w, &rec, &err) == LS_E_USAGE);
    ck_assert_msg(strstr(err.msg, "dump 1 (layer 3, hidden): the SHA-256 of its data is not the record's hidden digest"),
                  "%s", err.msg);
    rec.n_digests = 0;
    rec.n_dumps = 1;
    ck_assert(ls_trace_writer_add(w, &rec, &err) == LS_E_USAGE);
    ck_assert_msg(strstr(err.msg, "dump 0 (layer 1, hidden): the record carries no hidden digest of layer 1"), "%s",
                  err.msg);
    ls_trace_writer_abort(w);
}
END_TEST

/* Section 3: run_params is opaque. Numbers no parser holds in an int64 or a
 * double, and a NUL character, leave the trace readable; the reader hands
 * the text back byte for byte, and ls_trace_run_params_parse keeps the
 * numbers as strings holding their text. */
static const char odd_params[] =
    "{\"seed\":18446744073709551615,\"huge\":1e400,\"name\":\"a\\u0000b\",\n"
    " \"nested\": {\"x\": [1, 2.5e-400, -9223372036854775809, true, null]}}";

START_TEST(test_run_params_opaque)
{
    /* through the raw file: the header JSON as another writer would write it */
    char with[512];
    snprintf(with, sizeof with, "\"run_params\":%s", odd_params);
    ck_assert_int_eq(raw_replace_json(&t, "\"run_params\":{\"temperature\":0}", with), 0);
    expect_equal_to_good();
    char *out = NULL;
    int rc = ls_test_cli(&out, "trace dump --json '%s'", bad);
    ck_assert_msg(rc == 0 && strstr(out, "\"seed\":\"18446744073709551615\"") && strstr(out, "\"huge\":\"1e400\"") &&
                  strstr(out, "-9223372036854775809"), "rc %d: %s", rc, tail(out));
    free(out);
    ls_error err;
    ls_error_clear(&err);
    ls_trace_reader *r;
    ck_assert_msg(ls_trace_reader_open(bad, &r, &err) == LS_OK, "%s", err.msg);
    const ls_trace_header *h = ls_trace_reader_header(r);
    ck_assert_str_eq(h->run_params_json, odd_params);
    json_t *p = ls_trace_run_params_parse(h->run_params_json, &err);
    ck_assert_msg(p, "%s", err.msg);
    ck_assert_str_eq(json_string_value(json_object_get(p, "seed")), "18446744073709551615");
    ck_assert_str_eq(json_string_value(json_object_get(p, "huge")), "1e400");
    ck_assert_uint_eq(json_string_length(json_object_get(p, "name")), 3);
    json_t *x = json_object_get(json_object_get(p, "nested"), "x");
    ck_assert_int_eq(json_integer_value(json_array_get(x, 0)), 1);
    ck_assert(json_is_real(json_array_get(x, 1)));
    ck_assert_str_eq(json_string_value(json_array_get(x, 2)), "-9223372036854775809");
    json_decref(p);
    /* the C writer takes the same text and writes it unchanged */
    ls_trace_header h2 = *h;
    ls_trace_writer *w;
    char copy[4200];
    snprintf(copy, sizeof copy, "%s/copy.trace", dir);
    ck_assert_msg(ls_trace_writer_open(copy, &h2, &w, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_trace_writer_close(w, &err) == LS_OK, "%s", err.msg);
    ls_trace_reader *r2;
    ck_assert_msg(ls_trace_reader_open(copy, &r2, &err) == LS_OK, "%s", err.msg);
    ck_assert_str_eq(ls_trace_reader_header(r2)->run_params_json, odd_params);
    ls_trace_reader_close(r2);
    /* what stays refused: run_params that is not an object, or not JSON */
    h2.run_params_json = "[1]";
    ck_assert(ls_trace_writer_open(copy, &h2, &w, &err) == LS_E_USAGE);
    ck_assert_msg(strstr(err.msg, "run_params"), "%s", err.msg);
    h2.run_params_json = "{\"a\":01}";
    ck_assert(ls_trace_writer_open(copy, &h2, &w, &err) == LS_E_USAGE);
    ck_assert_msg(strstr(err.msg, "run_params"), "%s", err.msg);
    ls_trace_reader_close(r);
    ck_assert_int_eq(raw_replace_json(&t, "\"seed\":18446744073709551615", "\"seed\":18446744073709551615,"), 0);
    expect_refused("header JSON: expected a string (a key) at JSON byte");
}
END_TEST

/* A number within range stays a number however many characters it is
 * written with: only an integer outside int64 or a real beyond double range
 * becomes a string (found by fuzz_run_params: a finite real of 64 characters
 * or more came back as a string, unlike the strict parse). */
START_TEST(test_run_params_long_numbers)
{
    static const char text[] =
        "{\"long_real\":666666666666666666666666666666666666666666666666666666666666666666666.666666666667,"
        "\"long_fraction\":0.000000000000000000000000000000000000000000000000000000000000000000001,"
        "\"huge_int\":12345678901234567890123456789012345678901234567890123456789012345678901234567890}";
    ls_error err;
    ls_error_clear(&err);
    json_t *p = ls_trace_run_params_parse(text, &err);
    ck_assert_msg(p, "%s", err.msg);
    json_t *v = json_object_get(p, "long_real");
    ck_assert_msg(json_is_real(v), "long_real: %s, expected a real", json_is_string(v) ? json_string_value(v) : "?");
    ck_assert(json_real_value(v) > 6.6e68 && json_real_value(v) < 6.7e68);
    ck_assert_msg(json_is_real(json_object_get(p, "long_fraction")), "long_fraction is not a real");
    ck_assert_msg(json_is_string(json_object_get(p, "huge_int")), "huge_int is not kept as its text");
    json_decref(p);
}
END_TEST

/* Offset in record r of the digest entry (layer, kind), or 0 when absent. */
static size_t digest_at(const uint8_t *r, int layer, int kind)
{
    uint16_t nd = (uint16_t)(r[64] | r[65] << 8);
    for (size_t i = 0; i < nd; i++) {
        const uint8_t *e = r + REC_DIGESTS + 36 * i;
        if ((e[0] | e[1] << 8) == layer && e[2] == kind) return REC_DIGESTS + 36 * i;
    }
    return 0;
}

/* Removes digest (layer, kind) from record i of frame f (its count too). */
static void cut_digest(int f, uint32_t i, int layer, int kind)
{
    uint8_t *r = raw_record(&t.fr[f], i);
    size_t at = digest_at(r, layer, kind);
    ck_assert_msg(at, "record has no digest (%d, %d)", layer, kind);
    uint16_t nd = (uint16_t)(r[64] | r[65] << 8);
    r = raw_splice(&t.fr[f], i, at, 36, NULL, 0);
    r[64] = (uint8_t)(nd - 1), r[65] = (uint8_t)((nd - 1) >> 8);
}

/* Section 6: which kinds a layer of each family carries. */
START_TEST(test_kind_family)
{
    /* make layer 0 (embed) claim a kv digest */
    uint8_t *r = raw_record(&t.fr[0], 1);
    size_t at = digest_at(r, 0, LS_DIGEST_HIDDEN);
    r[at + 2] = LS_DIGEST_KV;
    expect_refused("digest 0: layer 0 is embed, which has no kv digest (section 6)");
}
END_TEST

/* "May omit kinds" means: a writer leaves a kind out of digest_kinds. A kind
 * it lists appears at every position for every layer of a family that has
 * it (carried-state kinds: at the positions state_digest_every names, here
 * every position). */
START_TEST(test_kinds_complete)
{
    cut_digest(1, 0, 3, LS_DIGEST_KV); /* frame 1: decode step at pos 3 */
    expect_refused("seq 0 pos 3 lacks the kv digest of layer 3 (attention)");
    raw_free(&t);
    ck_assert_int_eq(raw_load(good, &t), 0);
    cut_digest(2, 1, 1, LS_DIGEST_GDN_STATE);
    expect_refused("seq 1 pos 4 lacks the gdn_state digest of layer 1 (gdn)");
    raw_free(&t);
    /* state_digest_every 4: positions 3, 7, ... must carry the state kinds; others may not */
    syn_opts o = {.n_seqs = 1, .prompt_len = 3, .gen_len = 3};
    ck_assert_int_eq(syn_write(good, &o), 0);
    ck_assert_int_eq(raw_load(good, &t), 0);
    ck_assert_int_eq(raw_replace_json(&t, "\"state_digest_every\":1", "\"state_digest_every\":4"), 0);
    cut_digest(0, 0, 1, LS_DIGEST_GDN_STATE);
    cut_digest(0, 0, 1, LS_DIGEST_CONV_STATE);
    ck_assert_int_eq(raw_save(bad, &t), 0);
    char *out = NULL;
    int rc = ls_test_cli(&out, "trace dump '%s'", bad);
    ck_assert_msg(rc == 0, "pos 0 without state digests: rc %d: %s", rc, tail(out));
    free(out);
    cut_digest(1, 0, 1, LS_DIGEST_CONV_STATE); /* pos 3 */
    expect_refused("seq 0 pos 3 lacks the conv_state digest of layer 1 (gdn)");
}
END_TEST

/* Section 4: the frame kind follows the header's mode. */
START_TEST(test_frame_kind_mode)
{
    t.fr[1].kind = LS_FRAME_CHUNK;
    expect_refused("frame 1: kind 2 (chunk) in a rollout trace, which holds prefill and decode frames");
    t.fr[1].kind = LS_FRAME_DECODE;
    ck_assert_int_eq(raw_replace_json(&t, "\"mode\":\"rollout\"", "\"mode\":\"replay\""), 0);
    expect_refused("frame 0: kind 0 (prefill) in a replay trace, which holds chunk frames");
    /* the writer refuses it too */
    char model[65];
    memset(model, 'a', 64);
    model[64] = 0;
    ls_trace_header h = {.mode = "import", .engine = "test", .model_fingerprint = model, .manifest_digest = "",
                         .run_params_json = "{}", .topk = 5, .state_digest_every = 1};
    ls_error err;
    ls_error_clear(&err);
    ls_trace_writer *w;
    ck_assert_msg(ls_trace_writer_open(bad, &h, &w, &err) == LS_OK, "%s", err.msg);
    ck_assert(ls_trace_writer_begin_frame(w, LS_FRAME_DECODE, &err) == LS_E_USAGE);
    ck_assert_msg(strstr(err.msg, "kind 1 (decode) in an import trace, which holds import frames"), "%s", err.msg);
    ck_assert(ls_trace_writer_begin_frame(w, LS_FRAME_IMPORT, &err) == LS_OK);
    ls_trace_writer_abort(w);
}
END_TEST

/* Section 5: unused top-k slots follow the used ones and hold id -1 and the
 * bits 0x7fc00000; used ids are distinct and not negative. */
START_TEST(test_topk_slots)
{
    static const struct {
        int slot;
        int32_t id;
        uint32_t bits;
        const char *want;
    } cases[] = {
        {4, -1, 0xbf800000u, "top-k slot 4 is unused (id -1) but its logprob bits are 0xbf800000, not 0x7fc00000"},
        {2, -1, 0x7fc00000u, "top-k slot 3 is used after the unused slot 2"},
        {3, 0, 0, "top-k slots 0 and 3 hold the same id"},
        {0, -7, 0xbf800000u, "top-k slot 0: id -7"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        raw_free(&t);
        ck_assert_int_eq(raw_load(good, &t), 0);
        uint8_t *r = raw_record(&t.fr[2], 0);
        int32_t id = cases[c].id;
        if (c == 2) id = (int32_t)raw_rd32(r + 24); /* slot 0's id */
        raw_wr32(r + 24 + 8 * cases[c].slot, (uint32_t)id);
        if (c != 2) raw_wr32(r + 28 + 8 * cases[c].slot, cases[c].bits);
        expect_refused(cases[c].want);
    }
    /* trailing unused slots are fine */
    raw_free(&t);
    ck_assert_int_eq(raw_load(good, &t), 0);
    for (uint32_t i = 0; i < t.fr[1].n_records; i++) {
        uint8_t *r = raw_record(&t.fr[1], i);
        for (int k = 3; k < 5; k++) raw_wr32(r + 24 + 8 * k, 0xffffffffu), raw_wr32(r + 28 + 8 * k, 0x7fc00000u);
    }
    ck_assert_int_eq(raw_save(bad, &t), 0);
    char *out = NULL;
    int rc = ls_test_cli(&out, "trace dump '%s'", bad);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, tail(out));
    free(out);
}
END_TEST

/* Section 5: a dump's padding (to a multiple of 4 bytes) is zero, like every
 * reserved byte, so that equal records have equal bytes. */
START_TEST(test_dump_padding)
{
    char model[65];
    memset(model, 'a', 64);
    model[64] = 0;
    ls_trace_header h = {.mode = "rollout", .engine = "test", .model_fingerprint = model, .manifest_digest = "",
                         .run_params_json = "{}", .topk = 5, .digest_kinds_mask = 1u << LS_DIGEST_HIDDEN,
                         .state_digest_every = 1, .n_layers = SYN_N_LAYERS, .layers = syn_layers};
    ls_error err;
    ls_error_clear(&err);
    ls_trace_writer *w;
    ck_assert_msg(ls_trace_writer_open(good, &h, &w, &err) == LS_OK, "%s", err.msg);
    ck_assert(ls_trace_writer_begin_frame(w, LS_FRAME_PREFILL, &err) == LS_OK);
    uint8_t data[6] = {1, 2, 3, 4, 5, 6}; /* 3 bf16 elements: 2 bytes of padding */
    ls_trace_digest dg[SYN_N_LAYERS];
    for (int l = 0; l < SYN_N_LAYERS; l++) {
        dg[l] = (ls_trace_digest){(uint16_t)l, LS_DIGEST_HIDDEN, {{0}}};
        ls_sha256_buf(data, sizeof data, &dg[l].digest, NULL);
    }
    ls_trace_dump dm = {5, LS_DIGEST_HIDDEN, LS_DUMP_BF16, 3, data};
    ls_trace_record rec = {.seq = 0, .pos = 0, .token = 1, .next_token = -1, .logprob_bits = 0x7fc00000u,
                           .n_digests = SYN_N_LAYERS, .digests = dg, .n_dumps = 1, .dumps = &dm};
    for (int k = 0; k < 5; k++) rec.topk_ids[k] = -1, rec.topk_logprob_bits[k] = 0x7fc00000u;
    ck_assert_msg(ls_trace_writer_add(w, &rec, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_trace_writer_close(w, &err) == LS_OK, "%s", err.msg);
    raw_free(&t);
    ck_assert_int_eq(raw_load(good, &t), 0);
    expect_equal_to_good();
    uint8_t *r = raw_record(&t.fr[0], 0);
    r[REC_DIGESTS + 36 * SYN_N_LAYERS + 8 + 6 + 1] = 0x5a;
    expect_refused("dump 0: padding byte 1 is 0x5a, must be 0");
}
END_TEST

/* Positions of seq `seq` in `path` whose records carry a gdn_state digest, as a bit mask. */
static uint32_t state_positions(const char *path, uint32_t seq)
{
    ls_error err;
    ls_error_clear(&err);
    ls_trace_reader *r;
    ck_assert_msg(ls_trace_reader_open(path, &r, &err) == LS_OK, "%s", err.msg);
    uint32_t mask = 0;
    const ls_trace_record *x;
    while (ls_trace_reader_next(r, &x, &err) == LS_OK && x)
        for (uint32_t i = 0; x->seq == seq && x->pos < 32 && i < x->n_digests; i++)
            if (x->digests[i].kind == LS_DIGEST_GDN_STATE) mask |= 1u << x->pos;
    ls_trace_reader_close(r);
    return mask;
}

/* Section 3, run_params.batch, as `run --from` reads it from another
 * writer's rollout: entries whose id is not a sequence of the trace (an id
 * beyond u32 included) or whose prompt_len is out of range are ignored, and
 * keys the reader does not know (a u64 seed) leave the trace replayable. */
START_TEST(test_batch_schema)
{
    char *out = NULL;
    int rc = ls_test_cli(&out, "--quiet synth --preset tiny --seed 1 --out '%s/ck'", dir);
    ck_assert_msg(rc == 0, "%s", tail(out));
    free(out);
    ls_test_write_text(dir, "p.jsonl", "{\"id\":0,\"tokens\":[1,2,3,4,5]}\n{\"id\":1,\"tokens\":[9,8,7]}\n");
    rc = ls_test_cli(&out, "--quiet run --checkpoint '%s/ck' --mode rollout --prompts '%s/p.jsonl' --max-new-tokens 3 "
                     "-o '%s/ro.trace'", dir, dir, dir);
    ck_assert_msg(rc == 0, "%s", tail(out));
    free(out);
    char ro[4300];
    snprintf(ro, sizeof ro, "%s/ro.trace", dir);
    raw_free(&t);
    ck_assert_int_eq(raw_load(ro, &t), 0);
    ck_assert_int_eq(raw_replace_json(&t, "{\"id\":1,\"n_tokens\":3,\"prompt_len\":3}],",
                                      "{\"id\":1,\"n_tokens\":3,\"prompt_len\":3},{\"id\":4294967296,\"prompt_len\":2},"
                                      "{\"id\":-4294967296,\"prompt_len\":2},{\"id\":1,\"prompt_len\":99},"
                                      "{\"id\":\"0\",\"prompt_len\":2}],\"seed\":18446744073709551615,"), 0);
    ck_assert_int_eq(raw_save(bad, &t), 0);
    rc = ls_test_cli(&out, "--quiet run --checkpoint '%s/ck' --mode replay --from '%s' --chunk 2 -o '%s/rp.trace'", dir, bad,
                     dir);
    ck_assert_msg(rc == 0, "%s", tail(out));
    free(out);
    rc = ls_test_cli(&out, "--quiet run --checkpoint '%s/ck' --mode replay --from '%s' --chunk 2 -o '%s/rp0.trace'", dir, ro,
                     dir);
    ck_assert_msg(rc == 0, "%s", tail(out));
    free(out);
    char rp[4300], rp0[4300];
    snprintf(rp, sizeof rp, "%s/rp.trace", dir);
    snprintf(rp0, sizeof rp0, "%s/rp0.trace", dir);
    /* seq 0: prompt of 5, 8 tokens: carried states at the boundary (pos 4) and the last position (6) only */
    uint32_t m = state_positions(rp, 0);
    ck_assert_msg(m == state_positions(rp0, 0) && m == (1u << 4 | 1u << 6),
                  "seq 0 carries gdn_state at positions mask 0x%x (the rollout's batch alone: 0x%x, want 0x50)", m,
                  state_positions(rp0, 0));
    m = state_positions(rp, 1);
    ck_assert_msg(m == (1u << 2 | 1u << 4), "seq 1 carries gdn_state at positions mask 0x%x, want 0x14", m);
    rc = ls_test_cli(&out, "compare '%s' '%s'", rp0, rp);
    ck_assert_msg(rc == 0, "%s", tail(out));
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trace_rules");
    TCase *tc = tcase_create("trace_rules");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_raw_round_trip);
    tcase_add_test(tc, test_digest_pad_byte);
    tcase_add_test(tc, test_frame_reserved_named);
    tcase_add_test(tc, test_trailer_bytes_count);
    tcase_add_test(tc, test_dump_matches_digest);
    tcase_add_test(tc, test_writer_dump_digest);
    tcase_add_test(tc, test_run_params_opaque);
    tcase_add_test(tc, test_run_params_long_numbers);
    tcase_add_test(tc, test_kind_family);
    tcase_add_test(tc, test_kinds_complete);
    tcase_add_test(tc, test_frame_kind_mode);
    tcase_add_test(tc, test_topk_slots);
    tcase_add_test(tc, test_dump_padding);
    tcase_add_test(tc, test_batch_schema);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
