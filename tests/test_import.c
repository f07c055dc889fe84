/* Importers of engine outputs (trace/import.h, docs/import.md): exact fp32
 * bits from the text, every non-finite spelling, ranks from the rank field,
 * vLLM's clamp and sampled-first maps, SGLang's lists, verl tensors padded by
 * mask, request ids and prompt lengths in run_params, the replay tokens file,
 * and errors that name the byte offset. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "testutil.h"
#include "trace/import.h"
#include "trace/trace.h"

#define FP "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

static char *dir;
static char out_path[4200], tokens_path[4200];

static void setup(void)
{
    dir = ls_test_tmpdir("import");
    snprintf(out_path, sizeof out_path, "%s/out.trace", dir);
    snprintf(tokens_path, sizeof tokens_path, "%s/tokens.jsonl", dir);
}
static void teardown(void) { ls_test_rm_tmpdir(dir); }

/* A record as read back, with the header facts the tests check. */
typedef struct rec {
    uint32_t seq, pos;
    int32_t token, next;
    uint32_t lp;
    int32_t ids[8];
    uint32_t bits[8];
} rec;

typedef struct got {
    int n;
    rec r[64];
    int topk;
    char mode[16], engine[32];
    char params[4096];
} got;

static void read_trace(const char *path, got *g)
{
    memset(g, 0, sizeof *g);
    ls_error err;
    ls_trace_reader *r;
    ck_assert_msg(ls_trace_reader_open(path, &r, &err) == LS_OK, "%s", err.msg);
    const ls_trace_header *h = ls_trace_reader_header(r);
    g->topk = h->topk;
    snprintf(g->mode, sizeof g->mode, "%s", h->mode);
    snprintf(g->engine, sizeof g->engine, "%s", h->engine);
    snprintf(g->params, sizeof g->params, "%s", h->run_params_json);
    const ls_trace_record *x;
    while (ls_trace_reader_next(r, &x, &err) == LS_OK && x) {
        ck_assert_int_lt(g->n, 64);
        rec *o = &g->r[g->n++];
        o->seq = x->seq;
        o->pos = x->pos;
        o->token = x->token;
        o->next = x->next_token;
        o->lp = x->logprob_bits;
        for (int k = 0; k < 8 && k < h->topk; k++) {
            o->ids[k] = x->topk_ids[k];
            o->bits[k] = x->topk_logprob_bits[k];
        }
    }
    ck_assert_msg(ls_trace_reader_complete(r), "%s: incomplete trace", path);
    ls_trace_reader_close(r);
}

/* Imports text; returns the status, err filled. */
static ls_status import(ls_import_format fmt, const char *text, const ls_import_opts *extra, ls_error *err)
{
    ls_import_opts o = {.model_fingerprint = FP};
    if (extra) {
        o = *extra;
        o.model_fingerprint = FP;
    }
    ls_error_clear(err);
    return ls_import_mem(fmt, "in.json", text, strlen(text), &o, out_path, NULL, err);
}

static void import_ok(ls_import_format fmt, const char *text, const ls_import_opts *extra, got *g)
{
    ls_error err;
    ck_assert_msg(import(fmt, text, extra, &err) == LS_OK, "import failed: %s", err.msg);
    read_trace(out_path, g);
}

static void expect_bits(const char *what, int i, uint32_t got_bits, uint32_t want)
{
    ck_assert_msg(got_bits == want, "%s %d: got 0x%08x, want 0x%08x", what, i, got_bits, want);
}

/* ---- numbers --------------------------------------------------------------------------- */

/* An offline RequestOutput whose generated positions have the logprob texts given. */
static void offline_doc(char *buf, size_t n, const char *const *texts, int count)
{
    size_t l = (size_t)snprintf(buf, n, "{\"request_id\":\"0\",\"prompt_token_ids\":[1,2],\"prompt_logprobs\":null,"
                                        "\"outputs\":[{\"index\":0,\"token_ids\":[");
    for (int i = 0; i < count; i++) l += (size_t)snprintf(buf + l, n - l, "%s%d", i ? "," : "", 10 + i);
    l += (size_t)snprintf(buf + l, n - l, "],\"logprobs\":[");
    for (int i = 0; i < count; i++)
        l += (size_t)snprintf(buf + l, n - l, "%s{\"%d\":{\"logprob\":%s,\"rank\":1,\"decoded_token\":\"x\"}}",
                              i ? "," : "", 10 + i, texts[i]);
    snprintf(buf + l, n - l, "]}]}\n");
}

START_TEST(test_exact_bits_and_spellings)
{
    static const char *const texts[] = {
        "-0.1",                                  /* nearest fp32 of -0.1 */
        "-1.000000059604644775390625000001",     /* just past a midpoint: strtof rounds up; via double it
                                                    would round to the midpoint, then to even (-1.0) */
        "-0.10000000149011612",                  /* Python's repr of fp32 -0.1 widened to double */
        "NaN", "Infinity", "-Infinity", "nan", "-inf", "inf", "INF",
        "\"-nan\"", "\"-Infinity\"", "\"-0x1.8p+1\"", "null", "-1e-45", "-3.4028235e38",
    };
    static const uint32_t want[] = {
        0xbdcccccdu, 0xbf800001u, 0xbdcccccdu,
        0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xff800000u, 0x7f800000u, 0x7f800000u,
        0xffc00000u, 0xff800000u, 0xc0400000u, 0xff800000u, 0x80000001u, 0xff7fffffu,
    };
    int n = (int)(sizeof want / sizeof want[0]);
    char doc[8192];
    offline_doc(doc, sizeof doc, texts, n);
    got *g = malloc(sizeof *g);
    import_ok(LS_IMPORT_VLLM_OFFLINE, doc, NULL, g);
    ck_assert_int_eq(g->n, n);
    for (int i = 0; i < n; i++) {
        ck_assert_uint_eq(g->r[i].pos, 1 + (uint32_t)i); /* prompt of 2: step i is the record at 2 + i - 1 */
        ck_assert_int_eq(g->r[i].next, 10 + i);
        expect_bits(texts[i], i, g->r[i].lp, want[i]);
        expect_bits("top-1 slot", i, g->r[i].bits[0], want[i]);
    }
    /* input tokens are known: prompt then generated */
    ck_assert_int_eq(g->r[0].token, 2);
    ck_assert_int_eq(g->r[1].token, 10);
    free(g);
}
END_TEST

START_TEST(test_jsonl_nonfinite)
{
    /* Python's json writes -inf as -Infinity: the jsonl importer reads it, as value and in skipped keys */
    const char *doc = "{\"seq\":0,\"pos\":3,\"token\":5,\"logprob\":-Infinity,\"extra\":[NaN,Infinity],"
                      "\"top_logprobs\":{\"6\":-0.5,\"5\":-inf,\"7\":NaN}}\n";
    got *g = malloc(sizeof *g);
    ls_import_opts o = {.topk = 3};
    import_ok(LS_IMPORT_JSONL, doc, &o, g);
    ck_assert_int_eq(g->n, 1);
    expect_bits("-Infinity", 0, g->r[0].lp, 0xff800000u);
    expect_bits("-inf", 1, g->r[0].bits[1], 0xff800000u);
    expect_bits("NaN", 2, g->r[0].bits[2], 0x7fc00000u);
    /* a NUL byte is no digit */
    ls_error err;
    ls_error_clear(&err);
    o.model_fingerprint = FP;
    ck_assert_int_eq(ls_import_mem(LS_IMPORT_JSONL, "in.jsonl", "{\"seq\":0,\"pos\":1,\"token\":1,\"logprob\":-1\0}", 41,
                                   &o, out_path, NULL, &err), LS_E_INPUT);
    free(g);
}
END_TEST

/* ---- ranks ---------------------------------------------------------------------------- */

START_TEST(test_rank_field_not_key_order)
{
    /* keys in scrambled order; the sampled token (7) first with rank 3; prompt logprobs too */
    const char *doc =
        "{\"request_id\":\"req-A\",\"prompt_token_ids\":[4,5],"
        "\"prompt_logprobs\":[null,{\"5\":{\"logprob\":-9.5,\"rank\":40,\"decoded_token\":null},"
        "\"8\":{\"logprob\":-0.25,\"rank\":1,\"decoded_token\":null},\"6\":{\"logprob\":-1.5,\"rank\":2}}],"
        "\"outputs\":[{\"index\":0,\"token_ids\":[7],\"logprobs\":[{\"7\":{\"logprob\":-2.0,\"rank\":3},"
        "\"9\":{\"logprob\":-3.0,\"rank\":4},\"3\":{\"logprob\":-0.5,\"rank\":1},\"1\":[-1.0,2,\"x\"]}]}]}";
    got *g = malloc(sizeof *g);
    import_ok(LS_IMPORT_VLLM_OFFLINE, doc, NULL, g);
    ck_assert_int_eq(g->n, 2);
    ck_assert_int_eq(g->topk, 2); /* the prompt position fills ranks 1..2 only */
    /* prompt position: record 0, next = prompt token 5 at rank 40 (not in the top-2) */
    ck_assert_int_eq(g->r[0].pos, 0);
    ck_assert_int_eq(g->r[0].next, 5);
    ck_assert_int_eq(g->r[0].ids[0], 8);
    ck_assert_int_eq(g->r[0].ids[1], 6);
    ck_assert_int_eq(g->r[1].pos, 1);
    ck_assert_int_eq(g->r[1].next, 7);
    ck_assert_int_eq(g->r[1].ids[0], 3);
    ck_assert_int_eq(g->r[1].ids[1], 1);
    expect_bits("rank 2", 0, g->r[1].bits[1], 0xbf800000u);
    ck_assert_msg(strstr(g->params, "\"request_id\":\"req-A\"") && strstr(g->params, "\"prompt_len\":2") &&
                      strstr(g->params, "\"n_tokens\":3") && strstr(g->params, "\"format\":\"vllm-offline\""),
                  "%s", g->params);
    /* --topk 4 asked: ranks 3 and 4 fill the slots; missing ranks stay unused */
    ls_import_opts o = {.topk = 4};
    import_ok(LS_IMPORT_VLLM_OFFLINE, doc, &o, g);
    ck_assert_int_eq(g->topk, 4);
    ck_assert_int_eq(g->r[1].ids[2], 7);
    ck_assert_int_eq(g->r[1].ids[3], 9);
    ck_assert_int_eq(g->r[0].ids[2], -1);
    expect_bits("unused slot", 2, g->r[0].bits[2], 0x7fc00000u);
    /* two entries claiming one rank */
    ls_error err;
    const char *dup = "{\"prompt_token_ids\":[4],\"outputs\":[{\"token_ids\":[7],\"logprobs\":[{\"7\":{\"logprob\":-2,"
                      "\"rank\":1},\"9\":{\"logprob\":-3,\"rank\":1}}]}]}";
    ck_assert_int_eq(import(LS_IMPORT_VLLM_OFFLINE, dup, NULL, &err), LS_E_INPUT);
    ck_assert_msg(strstr(err.msg, "two entries have rank 1") && strstr(err.msg, "byte offset 64: sequence 0 (choice 0): token position 1"), "%s", err.msg);
    free(g);
}
END_TEST

/* ---- vLLM OpenAI server ------------------------------------------------------------------ */

START_TEST(test_vllm_completions)
{
    /* logprobs=2. Position 0: the sampled token (11) is outside the top-2, so the map has 3
     * entries, sampled first; position 1: it is inside (rank 2), 2 entries. -9999.0 is the
     * server's clamp of -inf. Two choices of one request with return_token_ids. */
    const char *doc =
        "{\"id\":\"cmpl-xyz\",\"object\":\"text_completion\",\"choices\":["
        "{\"index\":0,\"text\":\"\",\"logprobs\":{\"text_offset\":[0,11],\"tokens\":[\"token_id:11\",\"token_id:12\"],"
        "\"token_logprobs\":[-3.0,-0.75],\"top_logprobs\":[{\"token_id:11\":-3.0,\"token_id:20\":-0.5,\"token_id:21\":-1.25},"
        "{\"token_id:12\":-0.75,\"token_id:22\":-0.25}]},\"prompt_token_ids\":[1,2,3],\"token_ids\":[11,12]},"
        "{\"index\":1,\"text\":\"\",\"logprobs\":{\"tokens\":[\"token_id:13\"],\"token_logprobs\":[-9999.0],"
        "\"top_logprobs\":[{\"token_id:13\":-9999.0,\"token_id:30\":-0.1}]},\"prompt_token_ids\":[1,2],\"token_ids\":[13]}],"
        "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}";
    got *g = malloc(sizeof *g);
    ls_import_opts o = {.tokens_out = tokens_path};
    import_ok(LS_IMPORT_VLLM, doc, &o, g);
    ck_assert_int_eq(g->topk, 2); /* the smallest map (2 entries) */
    ck_assert_str_eq(g->mode, "import");
    ck_assert_str_eq(g->engine, "vllm");
    ck_assert_int_eq(g->n, 3);
    ck_assert_int_eq(g->r[0].seq, 0);
    ck_assert_int_eq(g->r[0].pos, 2);
    ck_assert_int_eq(g->r[0].token, 3);
    ck_assert_int_eq(g->r[0].ids[0], 20);
    ck_assert_int_eq(g->r[0].ids[1], 21); /* 11 ranks third: dropped */
    ck_assert_int_eq(g->r[1].pos, 3);
    ck_assert_int_eq(g->r[1].ids[0], 22);
    ck_assert_int_eq(g->r[1].ids[1], 12);
    ck_assert_int_eq(g->r[2].seq, 1);
    ck_assert_int_eq(g->r[2].pos, 1);
    expect_bits("clamped -9999", 0, g->r[2].lp, 0xff800000u);
    ck_assert_int_eq(g->r[2].ids[0], 30);
    ck_assert_int_eq(g->r[2].ids[1], 13);
    expect_bits("clamped -9999 in top", 1, g->r[2].bits[1], 0xff800000u);
    ck_assert_msg(strstr(g->params, "{\"choice\":1,\"id\":1,\"n_tokens\":3,\"prompt_len\":2,\"request_id\":\"cmpl-xyz\"}"),
                  "%s", g->params);
    char *t = ls_test_read(tokens_path, NULL);
    ck_assert_str_eq(t, "{\"id\":0,\"tokens\":[1,2,3,11,12],\"prompt_len\":3}\n"
                        "{\"id\":1,\"tokens\":[1,2,13],\"prompt_len\":2}\n");
    free(t);
    /* text tokens instead of token ids: the error says what to ask vLLM for */
    ls_error err;
    const char *text_keys = "{\"choices\":[{\"logprobs\":{\"tokens\":[\"token_id:5\"],\"token_logprobs\":[-1.0],"
                            "\"top_logprobs\":[{\"Hello\":-1.0}]}}],\"usage\":{\"prompt_tokens\":4}}";
    ck_assert_int_eq(import(LS_IMPORT_VLLM, text_keys, NULL, &err), LS_E_INPUT);
    ck_assert_msg(strstr(err.msg, "key 'Hello' is not \"token_id:N\"") && strstr(err.msg, "return_tokens_as_token_ids") &&
                      strstr(err.msg, "line 1, byte offset 90"),
                  "%s", err.msg);
    /* no prompt length anywhere: asked for, and given by the option */
    const char *no_len = "{\"id\":\"c\",\"choices\":[{\"logprobs\":{\"tokens\":[\"token_id:5\"],\"token_logprobs\":[-1.0],"
                         "\"top_logprobs\":null}},{\"logprobs\":{\"tokens\":[\"token_id:6\"],\"token_logprobs\":[-1.0]}}]}";
    ck_assert_int_eq(import(LS_IMPORT_VLLM, no_len, NULL, &err), LS_E_INPUT);
    ck_assert_msg(strstr(err.msg, "sequence 0 (request 'c', choice 0): the file gives no prompt length") &&
                      strstr(err.msg, "prompt_len option"),
                  "%s", err.msg);
    o = (ls_import_opts){.prompt_len = 7};
    import_ok(LS_IMPORT_VLLM, no_len, &o, g);
    ck_assert_int_eq(g->n, 2);
    ck_assert_int_eq(g->r[0].pos, 6);
    ck_assert_int_eq(g->topk, 1); /* no top-k in the file: one unused slot */
    ck_assert_int_eq(g->r[0].ids[0], -1);
    ck_assert_msg(strstr(g->params, "no top-k in the file"), "%s", g->params);
    free(g);
}
END_TEST

START_TEST(test_vllm_echo_and_chat)
{
    /* echo: the prompt's positions come first, the first with a null logprob */
    const char *echo =
        "{\"id\":\"e\",\"choices\":[{\"logprobs\":{\"tokens\":[\"token_id:1\",\"token_id:2\",\"token_id:9\"],"
        "\"token_logprobs\":[null,-4.5,-0.5],\"top_logprobs\":[null,{\"token_id:2\":-4.5,\"token_id:3\":-0.125},"
        "{\"token_id:9\":-0.5}]},\"prompt_token_ids\":[1,2],\"token_ids\":[9]}]}";
    got *g = malloc(sizeof *g);
    import_ok(LS_IMPORT_VLLM, echo, NULL, g);
    ck_assert_int_eq(g->n, 2);
    ck_assert_int_eq(g->r[0].pos, 0);
    ck_assert_int_eq(g->r[0].next, 2);
    ck_assert_int_eq(g->r[0].ids[0], 3);
    ck_assert_int_eq(g->r[1].pos, 1);
    ck_assert_int_eq(g->r[1].next, 9);
    ck_assert_int_eq(g->topk, 1);
    /* chat: the list is the first n entries of the sampled-first map: only n-1 ranks are certain */
    const char *chat =
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"content\":\"\"},"
        "\"logprobs\":{\"content\":["
        "{\"token\":\"token_id:40\",\"logprob\":-2.5,\"top_logprobs\":[{\"token\":\"token_id:40\",\"logprob\":-2.5},"
        "{\"token\":\"token_id:41\",\"logprob\":-0.5},{\"token\":\"token_id:42\",\"logprob\":-1.0}]},"
        "{\"token\":\"token_id:43\",\"logprob\":-0.25,\"top_logprobs\":[{\"token\":\"token_id:43\",\"logprob\":-0.25},"
        "{\"token\":\"token_id:44\",\"logprob\":-2.0},{\"token\":\"token_id:45\",\"logprob\":-2.25}]}]}}],"
        "\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2,\"total_tokens\":6}}\n";
    import_ok(LS_IMPORT_VLLM, chat, NULL, g);
    ck_assert_int_eq(g->topk, 2);
    ck_assert_int_eq(g->n, 2);
    ck_assert_int_eq(g->r[0].pos, 3);
    ck_assert_int_eq(g->r[0].ids[0], 41);
    ck_assert_int_eq(g->r[0].ids[1], 42);
    ck_assert_int_eq(g->r[1].ids[0], 43);
    ck_assert_int_eq(g->r[1].ids[1], 44);
    ck_assert_int_eq(g->r[0].token, -1); /* no prompt ids in the file */
    free(g);
}
END_TEST

/* ---- SGLang ------------------------------------------------------------------------------- */

START_TEST(test_sglang)
{
    /* a batch of two: the first with input logprobs from position 0 (null first), the second
     * with logprob_start_len 2 (input list covers the last 2 of 4 prompt tokens); null as -inf */
    const char *doc =
        "[{\"text\":\"\",\"meta_info\":{\"id\":\"9f2c\",\"prompt_tokens\":3,\"completion_tokens\":2,"
        "\"input_token_logprobs\":[[null,1,null],[-2.5,2,null],[-1.5,3,null]],"
        "\"input_top_logprobs\":[null,[[-0.5,7,null]],[[-1.5,3,null]]],"
        "\"output_token_logprobs\":[[-0.25,8,null],[null,9,null]],"
        "\"output_top_logprobs\":[[[-0.25,8,null],[-2.0,4,null]],[[-0.5,6,null],[-0.75,5,null]]]}},"
        "{\"text\":\"\",\"meta_info\":{\"id\":\"77aa\",\"prompt_tokens\":4,"
        "\"input_token_logprobs\":[[null,3,null],[-1.25,4,null]],\"output_token_logprobs\":[[-0.5,5,null]]}}]";
    got *g = malloc(sizeof *g);
    import_ok(LS_IMPORT_SGLANG, doc, NULL, g);
    ck_assert_int_eq(g->n, 6);
    ck_assert_int_eq(g->topk, 1); /* the input positions carry one entry */
    int want_pos[] = {0, 1, 2, 3, 2, 3}, want_next[] = {2, 3, 8, 9, 4, 5};
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(g->r[i].pos, want_pos[i]);
        ck_assert_int_eq(g->r[i].next, want_next[i]);
    }
    expect_bits("null output logprob", 3, g->r[3].lp, 0xff800000u);
    ck_assert_int_eq(g->r[0].ids[0], 7);
    ck_assert_int_eq(g->r[3].ids[0], 6);
    ck_assert_int_eq(g->r[0].token, 1);
    ck_assert_int_eq(g->r[4].token, -1); /* the second's prompt ids are partly unknown */
    ck_assert_msg(strstr(g->params, "\"request_id\":\"77aa\"") && strstr(g->params, "\"prompt_len\":4"), "%s",
                  g->params);
    /* the replay tokens need every prompt id */
    ls_import_opts o = {.tokens_out = tokens_path};
    ls_error err;
    ck_assert_int_eq(import(LS_IMPORT_SGLANG, doc, &o, &err), LS_E_INPUT);
    ck_assert_msg(strstr(err.msg, "sequence 1 (request '77aa'): the file does not list the prompt token ids"), "%s",
                  err.msg);
    /* malformed JSON: line and byte offset */
    ck_assert_int_eq(import(LS_IMPORT_SGLANG, "{\"meta_info\":{\"prompt_tokens\":1,\"output_token_logprobs\":[[-1,5,null]]}}\n"
                                                   "{\"meta_info\": [1,]}", NULL, &err), LS_E_INPUT);
    ck_assert_msg(strstr(err.msg, "invalid JSON at line 2, byte offset 89: expected a value"), "%s", err.msg);
    free(g);
}
END_TEST

/* ---- verl --------------------------------------------------------------------------------- */

static void write_verl(const char *path, ls_dtype lp_dtype, const char *lp_name)
{
    /* B = 2, P = 3, R = 4. Row 0: prompt [5 6] (left pad 1), response [7 8 9] (+1 pad);
     * row 1: prompt [1 2 3], response [4] (+3 pad). Row 0's second logprob is exactly -1.0:
     * a real value, kept; the pad -1.0s are not records. */
    static const float lp[8] = {-0.5f, -1.0f, -2.25f, -1.0f, -0.125f, -1.0f, -1.0f, -1.0f};
    static const int64_t resp[8] = {7, 8, 9, 0, 4, 0, 0, 0};
    static const int64_t ids[14] = {0, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 0, 0, 0};
    static const int64_t mask[14] = {0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0};
    uint16_t lp16[8];
    for (int i = 0; i < 8; i++) {
        uint32_t b;
        memcpy(&b, &lp[i], 4);
        lp16[i] = (uint16_t)(b >> 16);
    }
    ls_error err;
    ls_safetensors_writer *w;
    int64_t s24[2] = {2, 4}, s27[2] = {2, 7};
    ck_assert(ls_safetensors_writer_new(&w, &err) == LS_OK);
    ck_assert(ls_safetensors_writer_add(w, lp_name, lp_dtype, 2, s24, lp_dtype == LS_DTYPE_BF16 ? (const void *)lp16
                                                                                                : (const void *)lp,
                                        &err) == LS_OK);
    ck_assert(ls_safetensors_writer_add(w, "responses", LS_DTYPE_I64, 2, s24, resp, &err) == LS_OK);
    ck_assert(ls_safetensors_writer_add(w, "input_ids", LS_DTYPE_I64, 2, s27, ids, &err) == LS_OK);
    ck_assert(ls_safetensors_writer_add(w, "attention_mask", LS_DTYPE_I64, 2, s27, mask, &err) == LS_OK);
    ck_assert_msg(ls_safetensors_writer_write(w, path, &err) == LS_OK, "%s", err.msg);
    ls_safetensors_writer_free(w);
}

START_TEST(test_verl)
{
    char st[4300];
    snprintf(st, sizeof st, "%s/batch.safetensors", dir);
    write_verl(st, LS_DTYPE_F32, "rollout_log_probs");
    ls_error err;
    ls_import_opts o = {.model_fingerprint = FP, .tokens_out = tokens_path};
    ls_import_summary sum;
    ck_assert_msg(ls_import_file(LS_IMPORT_VERL, st, &o, out_path, &sum, &err) == LS_OK, "%s", err.msg);
    ck_assert_int_eq(sum.records, 4);
    got *g = malloc(sizeof *g);
    read_trace(out_path, g);
    ck_assert_int_eq(g->n, 4);
    int want_seq[] = {0, 0, 0, 1}, want_pos[] = {1, 2, 3, 2}, want_next[] = {7, 8, 9, 4};
    uint32_t want_lp[] = {0xbf000000u, 0xbf800000u, 0xc0100000u, 0xbe000000u};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(g->r[i].seq, want_seq[i]);
        ck_assert_int_eq(g->r[i].pos, want_pos[i]);
        ck_assert_int_eq(g->r[i].next, want_next[i]);
        expect_bits("verl logprob", i, g->r[i].lp, want_lp[i]);
    }
    ck_assert_msg(strstr(g->params, "{\"id\":0,\"n_tokens\":5,\"prompt_len\":2,\"row\":0}") &&
                      strstr(g->params, "\"logprobs_key\":\"rollout_log_probs\""),
                  "%s", g->params);
    char *t = ls_test_read(tokens_path, NULL);
    ck_assert_str_eq(t, "{\"id\":0,\"tokens\":[5,6,7,8,9],\"prompt_len\":2}\n{\"id\":1,\"tokens\":[1,2,3,4],\"prompt_len\":3}\n");
    free(t);
    /* old_log_probs in BF16: widened exactly */
    write_verl(st, LS_DTYPE_BF16, "old_log_probs");
    o = (ls_import_opts){.model_fingerprint = FP, .logprobs_key = "old_log_probs"};
    ck_assert_msg(ls_import_file(LS_IMPORT_VERL, st, &o, out_path, NULL, &err) == LS_OK, "%s", err.msg);
    read_trace(out_path, g);
    expect_bits("bf16 widened", 2, g->r[2].lp, 0xc0100000u);
    /* F64 would need rounding: refused; a missing tensor is named */
    write_verl(st, LS_DTYPE_F32, "old_log_probs");
    o = (ls_import_opts){.model_fingerprint = FP};
    ck_assert_int_eq(ls_import_file(LS_IMPORT_VERL, st, &o, out_path, NULL, &err), LS_E_INPUT);
    ck_assert_msg(strstr(err.msg, "no tensor 'rollout_log_probs'"), "%s", err.msg);
    free(g);
}
END_TEST

/* ---- CLI ----------------------------------------------------------------------------------- */

/* Whether needle occurs in [line, end). */
static int in_line(const char *line, const char *needle, const char *end)
{
    const char *p = strstr(line, needle);
    return p && p < end;
}

START_TEST(test_cli)
{
    char in[4300], *out = NULL;
    snprintf(in, sizeof in, "%s/resp.json", dir);
    ls_test_write_text(dir, "resp.json", "{\"id\":\"c\",\"choices\":[{\"logprobs\":{\"tokens\":[\"token_id:5\"],"
                                         "\"token_logprobs\":[-1.0]}},{\"logprobs\":{\"tokens\":[\"token_id:6\"],"
                                         "\"token_logprobs\":[-1.0]}}]}");
    ck_assert_int_eq(ls_test_cli(&out, "import vllm '%s' -o '%s' --model-fingerprint %s", in, out_path, FP), 2);
    ck_assert_msg(strstr(out, "state it with --prompt-len"), "%s", out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "import vllm '%s' -o '%s' --model-fingerprint %s --prompt-len=3", in, out_path,
                                 FP), 0);
    ck_assert_msg(strstr(out, "2 sequences, 2 records"), "%s", out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "import vllm-offline '%s' -o '%s' --model-fingerprint %s --prompt-len 3", in,
                                 out_path, FP), 2);
    ck_assert_msg(strstr(out, "gives every prompt length itself"), "%s", out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "import vllm2 '%s'", in), 2);
    ck_assert_msg(strstr(out, "unknown format 'vllm2'"), "%s", out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "import --help"), 0);
    ck_assert_msg(strstr(out, "vllm-offline") && strstr(out, "--tokens-out") && strstr(out, "--logprobs-key"), "%s",
                  out);
    free(out);
    /* the command list names the formats */
    ck_assert_int_eq(ls_test_cli(&out, "--help"), 0);
    const char *line = strstr(out, "\n  import ");
    ck_assert_msg(line, "%s", out);
    const char *end = strchr(line + 1, '\n');
    ck_assert_msg(end && in_line(line, "vLLM", end) && in_line(line, "SGLang", end) && in_line(line, "verl", end) &&
                  in_line(line, "JSONL", end), "the import line of 'lockstep --help': %.*s", (int)(end ? end - line : 80), line);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("import");
    TCase *tc = tcase_create("import");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_exact_bits_and_spellings);
    tcase_add_test(tc, test_jsonl_nonfinite);
    tcase_add_test(tc, test_rank_field_not_key_order);
    tcase_add_test(tc, test_vllm_completions);
    tcase_add_test(tc, test_vllm_echo_and_chat);
    tcase_add_test(tc, test_sglang);
    tcase_add_test(tc, test_verl);
    tcase_add_test(tc, test_cli);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
