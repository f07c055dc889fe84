/* lockstep — run inputs: prompts and tokens JSONL, and the sequences of a
 * rollout trace for its replay; see load.h. */
#include "run/load.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "io/json.h"
#include "manifest/manifest.h"
#include "run/run.h"

void ls_run_batch_free(ls_run_batch *b)
{
    if (!b) return;
    for (long i = 0; i < b->n; i++) free((void *)b->seqs[i].tokens);
    free(b->seqs);
    b->seqs = NULL;
    b->n = 0;
}

/* ---- inputs ------------------------------------------------------------------------ */

static ls_status batch_add(ls_run_batch *b, long *cap, ls_sequence s, ls_error *err)
{
    if (b->n == *cap) {
        long nc = *cap ? 2 * *cap : 16;
        ls_sequence *n = realloc(b->seqs, sizeof *n * (size_t)nc);
        if (!n) return ls_fail_nomem(err, sizeof *n * (size_t)nc, "table of %ld sequences", nc);
        b->seqs = n;
        *cap = nc;
    }
    b->seqs[b->n++] = s;
    return LS_OK;
}

/* Parses JSONL text; full = 1 for the replay tokens file (prompt_len
 * required). path names the input in messages. */
static ls_status parse_jsonl(const char *path, const char *text, size_t len, long vocab, int full,
                             ls_run_batch *out, ls_error *err)
{
    memset(out, 0, sizeof *out);
    long cap = 0, line = 0;
    ls_status st = LS_OK;
    const char *p = text;
    while (st == LS_OK && p < text + len) {
        const char *nl = memchr(p, '\n', (size_t)(text + len - p));
        size_t ll = nl ? (size_t)(nl - p) : (size_t)(text + len - p);
        line++;
        const char *q = p;
        p += ll + (nl ? 1 : 0);
        size_t k = 0;
        while (k < ll && (q[k] == ' ' || q[k] == '\t' || q[k] == '\r')) k++;
        if (k == ll) continue;
        json_error_t je;
        size_t nomem = 0;
        json_t *o = ls_json_loadb(q, ll, JSON_REJECT_DUPLICATES, &je, &nomem);
        if (!o && nomem) {
            st = ls_fail_nomem(err, nomem, "%s:%ld: parsing %zu bytes of JSON", path, line, ll);
            break;
        }
        if (!o) {
            st = ls_fail(err, LS_E_INPUT, "%s:%ld: invalid JSON at column %d: %s", path, line, je.column,
                         je.text);
            break;
        }
        json_t *id = json_object_get(o, "id"), *tk = json_object_get(o, "tokens");
        json_t *pl = json_object_get(o, "prompt_len");
        if (!json_is_object(o)) st = ls_fail(err, LS_E_INPUT, "%s:%ld: expected a JSON object", path, line);
        else if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > 0xffffffffLL)
            st = ls_fail(err, LS_E_INPUT, "%s:%ld: field id: expected an integer in 0..4294967295", path, line);
        else if (!json_is_array(tk) || json_array_size(tk) < (size_t)(full ? 2 : 1))
            st = ls_fail(err, LS_E_INPUT, "%s:%ld: field tokens: expected an array of at least %d token "
                         "ids", path, line, full ? 2 : 1);
        else if (full && (!json_is_integer(pl) || json_integer_value(pl) < 1 ||
                          json_integer_value(pl) >= (json_int_t)json_array_size(tk)))
            st = ls_fail(err, LS_E_INPUT, "%s:%ld: field prompt_len: expected an integer in 1..%zu", path,
                         line, json_array_size(tk) - 1);
        for (long i = 0; st == LS_OK && i < out->n; i++)
            if (out->seqs[i].id == (uint32_t)json_integer_value(id))
                st = ls_fail(err, LS_E_INPUT, "%s:%ld: field id: %lld repeats an earlier line", path, line,
                             (long long)json_integer_value(id));
        long n = st == LS_OK ? (long)json_array_size(tk) : 0;
        int32_t *t = st == LS_OK ? malloc(sizeof(int32_t) * (size_t)n) : NULL;
        if (st == LS_OK && !t) st = ls_fail_nomem(err, sizeof(int32_t) * (size_t)n, "%s:%ld: %ld tokens", path, line, n);
        for (long i = 0; st == LS_OK && i < n; i++) {
            json_t *v = json_array_get(tk, (size_t)i);
            json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
            if (!json_is_integer(v) || x < 0 || (vocab > 0 && x >= vocab) || x > 0x7fffffff)
                st = ls_fail(err, LS_E_INPUT, "%s:%ld: field tokens[%ld]: expected a token id in 0..%ld",
                             path, line, i, vocab > 0 ? vocab - 1 : 0x7fffffffL);
            else t[i] = (int32_t)x;
        }
        if (st == LS_OK) {
            ls_sequence s = {(uint32_t)json_integer_value(id), t, n, full ? (long)json_integer_value(pl) : n};
            st = batch_add(out, &cap, s, err);
            if (st != LS_OK) free(t);
        } else {
            free(t);
        }
        json_decref(o);
    }
    if (st == LS_OK && out->n == 0) st = ls_fail(err, LS_E_INPUT, "%s: no sequences (empty file)", path);
    if (st != LS_OK) ls_run_batch_free(out);
    return st;
}

ls_status ls_run_parse_prompts(const char *label, const char *text, size_t len, long vocab,
                               ls_run_batch *out, ls_error *err)
{
    return parse_jsonl(label, text, len, vocab, 0, out, err);
}

ls_status ls_run_parse_tokens(const char *label, const char *text, size_t len, long vocab,
                              ls_run_batch *out, ls_error *err)
{
    return parse_jsonl(label, text, len, vocab, 1, out, err);
}

static ls_status load_jsonl(const char *path, long vocab, int full, ls_run_batch *out, ls_error *err)
{
    char *text;
    size_t len;
    memset(out, 0, sizeof *out);
    LS_TRY(ls_read_file_max(path, LS_READ_JSONL_MAX_BYTES, &text, &len, err));
    ls_status st = parse_jsonl(path, text, len, vocab, full, out, err);
    free(text);
    return st;
}

ls_status ls_run_load_prompts(const char *path, long vocab, ls_run_batch *out, ls_error *err)
{
    return load_jsonl(path, vocab, 0, out, err);
}

ls_status ls_run_load_tokens(const char *path, long vocab, ls_run_batch *out, ls_error *err)
{
    return load_jsonl(path, vocab, 1, out, err);
}

ls_status ls_run_load_rollout(const char *trace_path, ls_run_batch *out, ls_run_rollout_info *info,
                              ls_error *err)
{
    memset(out, 0, sizeof *out);
    memset(info, 0, sizeof *info);
    ls_trace_reader *r;
    LS_TRY(ls_trace_reader_open(trace_path, &r, err));
    const ls_trace_header *h = ls_trace_reader_header(r);
    ls_status st = LS_OK;
    json_t *params = NULL;
    if (strcmp(h->mode, "rollout") != 0)
        st = ls_fail(err, LS_E_INPUT, "%s: header field mode is '%s'; replay --from needs a rollout trace",
                     trace_path, h->mode);
    info->act_bf16 = !h->activation_dtype || strcmp(h->activation_dtype, "fp32") != 0;
    info->state_digest_every = h->state_digest_every;
    snprintf(info->model_fingerprint, sizeof info->model_fingerprint, "%s",
             h->model_fingerprint ? h->model_fingerprint : "");
    if (st == LS_OK) {
        params = ls_trace_run_params_parse(h->run_params_json ? h->run_params_json : "{}", NULL);
        if (!json_is_object(params))
            st = ls_fail(err, LS_E_INPUT, "%s: header field run_params is not a JSON object", trace_path);
    }
    if (st == LS_OK) {
        json_t *mn = json_object_get(params, "max_new_tokens");
        if (json_is_integer(mn)) info->max_new = (long)json_integer_value(mn);
        json_t *f8 = json_object_get(params, "fp8");
        if (f8 && (!json_is_string(f8) || (strcmp(json_string_value(f8), "dequant") &&
                                           strcmp(json_string_value(f8), "w8a8"))))
            st = ls_fail(err, LS_E_INPUT, "%s: header field run_params.fp8 must be \"dequant\" or "
                         "\"w8a8\"", trace_path);
        else if (f8)
            snprintf(info->fp8, sizeof info->fp8, "%s", json_string_value(f8));
        json_t *gf = json_object_get(params, "gdn_form");
        if (st == LS_OK && gf && (!json_is_string(gf) || strcmp(json_string_value(gf), LS_MANIFEST_GDN_CHUNKED)))
            st = ls_fail(err, LS_E_INPUT, "%s: header field run_params.gdn_form must be \"%s\" (absent: the "
                         "recurrent form)", trace_path, LS_MANIFEST_GDN_CHUNKED);
        info->gdn_chunked = gf != NULL;
        json_t *tier = json_object_get(params, "tier");
        info->tier = LS_TIER_PORTABLE;
        ls_error ignored;
        if (st == LS_OK && tier &&
            (!json_is_string(tier) || !strcmp(json_string_value(tier), "portable") ||
             ls_run_parse_tier("run_params.tier", json_string_value(tier), &info->tier, &ignored) != LS_OK))
            st = ls_fail(err, LS_E_INPUT, "%s: header field run_params.tier must be \"tc\" or \"fast\" (absent: "
                         "the portable tier)", trace_path);
    }
    /* Tokens per sequence, appended in position order. */
    long cap = 0;
    long *tcap = NULL;
    const ls_trace_record *rec;
    while (st == LS_OK && (st = ls_trace_reader_next(r, &rec, err)) == LS_OK && rec) {
        long i = 0;
        while (i < out->n && out->seqs[i].id != rec->seq) i++;
        if (i == out->n) {
            if (rec->pos != 0) {
                st = ls_fail(err, LS_E_INPUT, "%s: sequence %u starts at position %u (frame at byte %llu)",
                             trace_path, rec->seq, rec->pos, (unsigned long long)rec->frame_offset);
                break;
            }
            long oldcap = cap;
            st = batch_add(out, &cap, (ls_sequence){rec->seq, NULL, 0, 0}, err);
            if (st != LS_OK) break;
            if (cap != oldcap) {
                long *n = realloc(tcap, sizeof(long) * (size_t)cap);
                if (!n) {
                    st = ls_fail_nomem(err, sizeof(long) * (size_t)cap, "%s: table of %ld sequences", trace_path, cap);
                    break;
                }
                tcap = n;
            }
            tcap[i] = 0;
        }
        ls_sequence *s = &out->seqs[i];
        if ((long)rec->pos != s->n_tokens) {
            st = ls_fail(err, LS_E_INPUT, "%s: sequence %u jumps to position %u (frame at byte %llu)",
                         trace_path, rec->seq, rec->pos, (unsigned long long)rec->frame_offset);
            break;
        }
        if (s->n_tokens + 2 > tcap[i]) {
            long nc = tcap[i] ? 2 * tcap[i] : 64;
            int32_t *n = realloc((void *)s->tokens, sizeof(int32_t) * (size_t)nc);
            if (!n) {
                st = ls_fail_nomem(err, sizeof(int32_t) * (size_t)nc, "%s: %ld tokens of one sequence", trace_path, nc);
                break;
            }
            s->tokens = n;
            tcap[i] = nc;
        }
        int32_t *t = (int32_t *)s->tokens;
        t[s->n_tokens] = rec->token;
        t[s->n_tokens + 1] = rec->next_token; /* overwritten by the next position's token */
        s->n_tokens++;
    }
    if (st == LS_OK && !ls_trace_reader_complete(r))
        st = ls_fail(err, LS_E_INPUT, "%s: the trace has no trailer (the rollout did not finish)", trace_path);
    ls_trace_reader_close(r);
    free(tcap);
    for (long i = 0; st == LS_OK && i < out->n; i++) {
        ls_sequence *s = &out->seqs[i];
        if (s->tokens[s->n_tokens] < 0) {
            st = ls_fail(err, LS_E_INPUT, "%s: sequence %u has no next token at its last position %ld",
                         trace_path, s->id, s->n_tokens - 1);
            break;
        }
        s->n_tokens++; /* include the last sampled token as the final target */
    }
    /* Prompt lengths from run_params.batch. */
    json_t *b = params ? json_object_get(params, "batch") : NULL;
    for (size_t k = 0; st == LS_OK && json_is_array(b) && k < json_array_size(b); k++) {
        json_t *e = json_array_get(b, k);
        json_t *id = json_object_get(e, "id"), *pl = json_object_get(e, "prompt_len");
        /* an id beyond u32 names no sequence (docs/trace-format.md section 3): never truncate it onto one */
        if (!json_is_integer(id) || !json_is_integer(pl) || json_integer_value(id) < 0 ||
            json_integer_value(id) > (json_int_t)UINT32_MAX)
            continue;
        for (long i = 0; i < out->n; i++)
            if (out->seqs[i].id == (uint32_t)json_integer_value(id)) {
                long p = (long)json_integer_value(pl);
                if (p >= 1 && p < out->seqs[i].n_tokens) out->seqs[i].prompt_len = p;
            }
    }
    json_decref(params);
    if (st == LS_OK && out->n == 0) st = ls_fail(err, LS_E_INPUT, "%s: the trace holds no records", trace_path);
    if (st != LS_OK) ls_run_batch_free(out);
    return st;
}
