/* lockstep — importers of the JSON engine formats: vLLM's OpenAI-compatible
 * server (completions and chat), vLLM's offline RequestOutput, and SGLang's
 * /generate meta_info. Each walks the document and feeds the sink
 * (import_internal.h); docs/import.md gives every field rule with an example. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace/import_internal.h"

#define NAN_BITS 0x7fc00000u
#define NEG_INF_BITS 0xff800000u

/* ---- shared helpers ------------------------------------------------------------------ */

typedef struct walk {
    ls_imp *im;
    ls_jparse *j;
    ls_error *err;
    /* per-sequence scratch, reused */
    int32_t *prompt_ids; size_t prompt_cap;
    int32_t *gen_ids; size_t gen_cap;
    ls_imp_entry *top; size_t top_cap;
} walk;

static ls_status jfail(walk *w, const ls_jv *v, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ls_status jfail(walk *w, const ls_jv *v, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    uint64_t at = v ? v->at : 0;
    return ls_fail(w->err, LS_E_INPUT, "%s: line %" PRIu64 ", byte offset %" PRIu64 ": %s",
                   ls_jparse_label(w->j), ls_jparse_line(w->j, at), at, what);
}

static ls_status grow(void **p, size_t *cap, size_t need, size_t elem, ls_error *err)
{
    if (need <= *cap) return LS_OK;
    size_t n = *cap ? *cap : 256;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q) return ls_fail(err, LS_E_NOMEM, "out of memory");
    *p = q;
    *cap = n;
    return LS_OK;
}

static int is_array(const ls_jv *v) { return v && v->type == LS_JV_ARRAY; }
static int is_null(const ls_jv *v) { return !v || v->type == LS_JV_NULL; }

/* An array of token ids into *dst (grown); *n its length. */
static ls_status id_array(walk *w, const ls_jv *a, const char *field, int32_t **dst, size_t *cap, size_t *n)
{
    if (!is_array(a)) return jfail(w, a, "%s: expected an array of token ids", field);
    LS_TRY(grow((void **)dst, cap, a->n + 1, sizeof **dst, w->err));
    for (uint32_t i = 0; i < a->n; i++)
        if (ls_jv_token_id(&a->kids[i], 0, &(*dst)[i]))
            return jfail(w, &a->kids[i], "%s[%u]: expected a token id (an integer in 0..2147483647)", field, i);
    *n = a->n;
    return LS_OK;
}

/* Sorts entries by logprob, most likely first; NaN last; equal values keep
 * their file order. Then ranks them 1, 2, ... (rank holds the file index
 * while sorting, so the order is total and qsort's result stable.) */
static int by_value(const void *x, const void *y)
{
    const ls_imp_entry *a = x, *b = y;
    float fa, fb;
    memcpy(&fa, &a->bits, 4);
    memcpy(&fb, &b->bits, 4);
    int na = fa != fa, nb = fb != fb;
    if (na != nb) return na - nb;
    if (!na && fa != fb) return fa > fb ? -1 : 1;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

static void rank_by_value(ls_imp_entry *e, int n)
{
    for (int i = 0; i < n; i++) e[i].rank = i;
    if (n > 1) qsort(e, (size_t)n, sizeof *e, by_value);
    for (int i = 0; i < n; i++) e[i].rank = i + 1;
}

/* Runs `one` on every top-level value, and on every element of a top-level array. */
typedef ls_status (*value_fn)(walk *w, const ls_jv *v);

static ls_status walk_document(ls_imp *im, void *ctx, value_fn one, ls_error *err)
{
    const ls_imp_text *t = ctx;
    walk w = {.im = im, .err = err};
    ls_status st = ls_jparse_new(ls_imp_label(im), t->data, t->len, &w.j, err);
    const ls_jv *v;
    while (!st && !(st = ls_jparse_next(w.j, &v, err)) && v) {
        if (v->type == LS_JV_ARRAY)
            for (uint32_t i = 0; !st && i < v->n; i++) st = one(&w, &v->kids[i]);
        else
            st = one(&w, v);
    }
    ls_jparse_free(w.j);
    free(w.prompt_ids);
    free(w.gen_ids);
    free(w.top);
    return st;
}

/* ---- vLLM, OpenAI-compatible server ----------------------------------------------------
 * The server writes max(logprob, -9999.0) (serving_completion.py,
 * serving_chat.py: JSON has no -inf), so -9999.0 reads as -inf. */

static uint32_t vllm_unclamp(uint32_t bits)
{
    const float clamp = -9999.0f;
    uint32_t c;
    memcpy(&c, &clamp, 4);
    return bits == c ? NEG_INF_BITS : bits;
}

static ls_status vllm_logprob(walk *w, const ls_jv *v, const char *field, uint32_t *bits)
{
    if (ls_jv_f32(v, bits)) return jfail(w, v, "%s: expected a logprob (a number)", field);
    *bits = vllm_unclamp(*bits);
    return LS_OK;
}

/* A completions top_logprobs map {"token_id:N": logprob} into w->top, ranked by value. */
static ls_status vllm_top_map(walk *w, const ls_jv *m, uint32_t e, int *n_top)
{
    *n_top = 0;
    if (is_null(m)) return LS_OK;
    if (m->type != LS_JV_OBJECT) return jfail(w, m, "top_logprobs[%u]: expected an object or null", e);
    LS_TRY(grow((void **)&w->top, &w->top_cap, m->n + 1, sizeof *w->top, w->err));
    for (uint32_t i = 0; i < m->n; i++) {
        ls_imp_entry *x = &w->top[i];
        if (ls_jv_token_id(&m->kids[2 * i], 1, &x->id))
            return jfail(w, &m->kids[2 * i], "top_logprobs[%u]: key '%.*s' is not \"token_id:N\" (ask vLLM for token "
                         "ids: request field return_tokens_as_token_ids)", e, (int)(m->kids[2 * i].n > 40 ? 40 : m->kids[2 * i].n),
                         m->kids[2 * i].s);
        LS_TRY(vllm_logprob(w, &m->kids[2 * i + 1], "top_logprobs", &x->bits));
    }
    rank_by_value(w->top, (int)m->n);
    *n_top = (int)m->n;
    return LS_OK;
}

/* A chat top_logprobs list [{token, logprob, bytes}] into w->top, ranked by
 * value. vLLM builds it from the position's map, whose first entry is the
 * selected token, cut to the requested length n: when the selected token is
 * outside the top n the list holds ranks 1..n-1 only, and when it is inside,
 * all of 1..n. Only the first n-1 ranks are certain either way, so the last
 * entry is dropped whenever the selected token is in the list. */
static ls_status vllm_top_list(walk *w, const ls_jv *l, uint32_t e, int32_t selected, int *n_top)
{
    *n_top = 0;
    if (is_null(l)) return LS_OK;
    if (!is_array(l)) return jfail(w, l, "content[%u].top_logprobs: expected an array or null", e);
    LS_TRY(grow((void **)&w->top, &w->top_cap, l->n + 1, sizeof *w->top, w->err));
    int has_selected = 0;
    for (uint32_t i = 0; i < l->n; i++) {
        const ls_jv *o = &l->kids[i];
        ls_imp_entry *x = &w->top[i];
        if (ls_jv_token_id(ls_jv_get(o, "token"), 1, &x->id))
            return jfail(w, o, "content[%u].top_logprobs[%u].token: expected \"token_id:N\" (ask vLLM for token ids: "
                         "request field return_tokens_as_token_ids)", e, i);
        LS_TRY(vllm_logprob(w, ls_jv_get(o, "logprob"), "top_logprobs logprob", &x->bits));
        has_selected |= x->id == selected;
    }
    rank_by_value(w->top, (int)l->n);
    *n_top = (int)l->n - (has_selected && l->n > 0);
    return LS_OK;
}

/* vLLM's Logprob as dumped: {"logprob": x, "rank": r, "decoded_token": t}
 * (or the tuple [x, r, t]). A null logprob reads as -inf (orjson and
 * pydantic write non-finite floats as null). */
static ls_status logprob_obj(walk *w, const ls_jv *v, uint32_t *bits, int32_t *rank, int unclamp)
{
    const ls_jv *lp, *rk;
    if (v && v->type == LS_JV_OBJECT) {
        lp = ls_jv_get(v, "logprob");
        rk = ls_jv_get(v, "rank");
    } else if (is_array(v) && v->n >= 2) {
        lp = &v->kids[0];
        rk = &v->kids[1];
    } else {
        return jfail(w, v, "expected a Logprob: {\"logprob\": x, \"rank\": r, \"decoded_token\": t}");
    }
    if (lp && lp->type == LS_JV_NULL) *bits = NEG_INF_BITS;
    else if (ls_jv_f32(lp, bits)) return jfail(w, lp ? lp : v, "Logprob: logprob is not a number");
    if (unclamp) *bits = vllm_unclamp(*bits);
    int64_t r = 0;
    if (!is_null(rk) && ls_jv_int(rk, 1, INT32_MAX, &r)) return jfail(w, rk, "Logprob: rank is not an integer >= 1");
    *rank = (int32_t)r;
    return LS_OK;
}

/* One position's map {"<id>": Logprob} (vLLM's dict[int, Logprob]): the
 * selected token's logprob, and every entry with its rank field. */
static ls_status logprob_map(walk *w, const ls_jv *m, int32_t selected, const char *field, uint32_t i,
                             ls_imp_pos *p, int unclamp)
{
    if (!m || m->type != LS_JV_OBJECT) return jfail(w, m, "%s[%u]: expected an object {token id: Logprob}", field, i);
    LS_TRY(grow((void **)&w->top, &w->top_cap, m->n + 1, sizeof *w->top, w->err));
    int found = 0;
    for (uint32_t k = 0; k < m->n; k++) {
        ls_imp_entry *x = &w->top[k];
        const ls_jv *key = &m->kids[2 * k];
        if (ls_jv_token_id(key, 0, &x->id))
            return jfail(w, key, "%s[%u]: key '%.*s' is not a token id", field, i, (int)(key->n > 40 ? 40 : key->n),
                         key->s);
        LS_TRY(logprob_obj(w, &m->kids[2 * k + 1], &x->bits, &x->rank, unclamp));
        if (x->id == selected) {
            found = 1;
            p->logprob_bits = x->bits;
        }
    }
    if (!found) return jfail(w, m, "%s[%u]: no entry for the position's token %d", field, i, selected);
    p->top = w->top;
    p->n_top = (int)m->n;
    return LS_OK;
}

static ls_status vllm_choice(walk *w, const ls_jv *resp, const ls_jv *c, uint32_t ci, uint32_t n_choices)
{
    ls_imp_seq s = {.choice = ci, .row = -1, .prompt_len = -1, .n_gen = -1};
    const ls_jv *rid = ls_jv_get(resp, "id");
    if (rid && rid->type == LS_JV_STRING) {
        s.request_id = rid->s;
        s.request_id_len = rid->n;
    }
    int64_t idx;
    if (!ls_jv_int(ls_jv_get(c, "index"), 0, INT32_MAX, &idx)) s.choice = idx;

    /* prompt and generated ids: return_token_ids puts them on the choice (chat: the prompt's on the response) */
    const ls_jv *pids = ls_jv_get(c, "prompt_token_ids");
    if (is_null(pids)) pids = ls_jv_get(resp, "prompt_token_ids");
    size_t n_prompt = 0, n_gen = 0;
    int prompt_given = !is_null(pids);
    if (prompt_given) {
        LS_TRY(id_array(w, pids, "prompt_token_ids", &w->prompt_ids, &w->prompt_cap, &n_prompt));
        s.prompt_len = (int64_t)n_prompt;
    }
    const ls_jv *gids = ls_jv_get(c, "token_ids");
    int gen_given = !is_null(gids);
    if (gen_given) LS_TRY(id_array(w, gids, "token_ids", &w->gen_ids, &w->gen_cap, &n_gen));
    /* chat: logprobs.content (a list per token); completions: logprobs.tokens ... */
    const ls_jv *lp = ls_jv_get(c, "logprobs");
    int chat = ls_jv_get(lp, "content") != NULL || ls_jv_get(c, "message") != NULL;
    int64_t pt;
    /* usage.prompt_tokens is the prompt length of a chat request, and of a
     * completions request with one choice (a list of prompts sums them) */
    if (s.prompt_len < 0 && (chat || n_choices == 1) &&
        !ls_jv_int(ls_jv_get(ls_jv_get(resp, "usage"), "prompt_tokens"), 0, INT32_MAX, &pt))
        s.prompt_len = pt;
    if (s.prompt_len < 0 && ls_imp_opts(w->im)->prompt_len > 0) s.prompt_len = ls_imp_opts(w->im)->prompt_len;
    if (!lp || lp->type != LS_JV_OBJECT)
        return jfail(w, c, "choices[%u]: no logprobs (request field logprobs%s)", ci, chat ? " / top_logprobs" : "");
    const ls_jv *content = ls_jv_get(lp, "content");
    uint32_t n;
    const ls_jv *tokens = NULL, *tlp = NULL, *tops = NULL;
    if (chat) {
        if (!is_array(content)) return jfail(w, lp, "choices[%u].logprobs.content: expected an array", ci);
        n = content->n;
    } else {
        tokens = ls_jv_get(lp, "tokens");
        tlp = ls_jv_get(lp, "token_logprobs");
        tops = ls_jv_get(lp, "top_logprobs");
        if (!is_array(tokens) || !is_array(tlp) || tokens->n != tlp->n)
            return jfail(w, lp, "choices[%u].logprobs: expected arrays tokens and token_logprobs of equal length", ci);
        if (!is_null(tops) && (!is_array(tops) || tops->n != tlp->n))
            return jfail(w, tops, "choices[%u].logprobs.top_logprobs: expected an array as long as token_logprobs", ci);
        n = tlp->n;
    }
    /* echo: the prompt's positions come first (the first with a null logprob) */
    int echo;
    if (gen_given && s.prompt_len >= 0) echo = (int64_t)n == s.prompt_len + (int64_t)n_gen && s.prompt_len > 0;
    else echo = !chat && n > 0 && is_null(&tlp->kids[0]);
    if (echo && s.prompt_len < 0)
        return jfail(w, c, "choices[%u]: an echoed prompt of unknown length (request field return_token_ids gives "
                           "the prompt's token ids)", ci);
    uint32_t first_gen = echo ? (uint32_t)s.prompt_len : 0;
    if (echo && s.prompt_len > (int64_t)n) return jfail(w, c, "choices[%u]: echoed prompt longer than the logprobs", ci);
    if (gen_given && n - first_gen != n_gen)
        return jfail(w, c, "choices[%u]: token_ids has %zu tokens but logprobs has %u positions", ci, n_gen,
                     n - first_gen);
    /* The selected ids: token_ids, else the "token_id:N" strings. */
    LS_TRY(grow((void **)&w->gen_ids, &w->gen_cap, n + 1, sizeof *w->gen_ids, w->err));
    LS_TRY(grow((void **)&w->prompt_ids, &w->prompt_cap, n + 1, sizeof *w->prompt_ids, w->err));
    for (uint32_t e = 0; e < n; e++) {
        const ls_jv *tok = chat ? ls_jv_get(&content->kids[e], "token") : &tokens->kids[e];
        int32_t id;
        if (ls_jv_token_id(tok, 1, &id)) {
            if (e >= first_gen && gen_given) continue;
            if (e < first_gen && prompt_given) continue;
            return jfail(w, tok ? tok : &content->kids[e], "choices[%u]: token %u is text, not \"token_id:N\" (ask "
                         "vLLM for token ids: request field return_tokens_as_token_ids, or return_token_ids)", ci, e);
        }
        if (e >= first_gen) {
            if (gen_given && w->gen_ids[e - first_gen] != id)
                return jfail(w, tok, "choices[%u]: token %u is %d but token_ids says %d", ci, e, id,
                             w->gen_ids[e - first_gen]);
            w->gen_ids[e - first_gen] = id;
        } else {
            if (prompt_given && w->prompt_ids[e] != id)
                return jfail(w, tok, "choices[%u]: echoed prompt token %u is %d but prompt_token_ids says %d", ci, e,
                             id, w->prompt_ids[e]);
            w->prompt_ids[e] = id;
        }
    }
    if (echo || prompt_given) s.prompt_ids = w->prompt_ids;
    s.gen_ids = w->gen_ids;
    s.n_gen = n - first_gen;
    LS_TRY(ls_imp_seq_begin(w->im, &s, w->err));
    /* prompt positions: echoed, or the choice's prompt_logprobs (vLLM's own
     * Logprob objects, ranks given) */
    const ls_jv *plp = ls_jv_get(c, "prompt_logprobs");
    if (is_null(plp)) plp = ls_jv_get(resp, "prompt_logprobs");
    if (!echo && is_array(plp)) {
        if (!s.prompt_ids) {
            ls_imp_note(w->im, "prompt_logprobs not imported: the file lacks the prompt token ids (request field "
                               "return_token_ids)");
        } else {
            if ((int64_t)plp->n != s.prompt_len)
                return jfail(w, plp, "choices[%u].prompt_logprobs: %u entries for a %" PRId64 "-token prompt", ci,
                             plp->n, s.prompt_len);
            for (uint32_t t = 1; t < plp->n; t++) {
                ls_imp_pos p = {.tok_pos = t, .token = s.prompt_ids[t], .at = (int64_t)plp->kids[t].at};
                LS_TRY(logprob_map(w, &plp->kids[t], p.token, "prompt_logprobs", t, &p, 1));
                LS_TRY(ls_imp_add(w->im, &p, w->err));
            }
        }
    }
    for (uint32_t e = echo ? 1 : 0; e < n; e++) {
        ls_imp_pos p = {.tok_pos = e < first_gen ? e : s.prompt_len + (e - first_gen)};
        p.token = e < first_gen ? w->prompt_ids[e] : w->gen_ids[e - first_gen];
        if (chat) {
            const ls_jv *o = &content->kids[e];
            p.at = (int64_t)o->at;
            LS_TRY(vllm_logprob(w, ls_jv_get(o, "logprob"), "content logprob", &p.logprob_bits));
            LS_TRY(vllm_top_list(w, ls_jv_get(o, "top_logprobs"), e, p.token, &p.n_top));
        } else {
            p.at = (int64_t)tlp->kids[e].at;
            if (is_null(&tlp->kids[e]))
                return jfail(w, &tlp->kids[e], "choices[%u].logprobs.token_logprobs[%u] is null", ci, e);
            LS_TRY(vllm_logprob(w, &tlp->kids[e], "token_logprobs", &p.logprob_bits));
            LS_TRY(vllm_top_map(w, is_null(tops) ? NULL : &tops->kids[e], e, &p.n_top));
        }
        p.top = w->top;
        LS_TRY(ls_imp_add(w->im, &p, w->err));
    }
    return ls_imp_seq_end(w->im, w->err);
}

static ls_status vllm_one(walk *w, const ls_jv *v)
{
    const ls_jv *choices = ls_jv_get(v, "choices");
    if (!is_array(choices))
        return jfail(w, v, "expected a vLLM completions or chat response (an object with \"choices\")");
    for (uint32_t i = 0; i < choices->n; i++) LS_TRY(vllm_choice(w, v, &choices->kids[i], i, choices->n));
    return LS_OK;
}

ls_status ls_imp_walk_vllm(ls_imp *im, void *ctx, ls_error *err)
{
    return walk_document(im, ctx, vllm_one, err);
}

/* ---- vLLM offline RequestOutput ------------------------------------------------------------ */

static ls_status offline_one(walk *w, const ls_jv *v)
{
    const ls_jv *outs = ls_jv_get(v, "outputs");
    if (!is_array(outs)) return jfail(w, v, "expected a vLLM RequestOutput (an object with \"outputs\")");
    size_t n_prompt = 0;
    LS_TRY(id_array(w, ls_jv_get(v, "prompt_token_ids"), "prompt_token_ids", &w->prompt_ids, &w->prompt_cap,
                    &n_prompt));
    const ls_jv *rid = ls_jv_get(v, "request_id");
    const ls_jv *plp = ls_jv_get(v, "prompt_logprobs");
    if (!is_null(plp) && (!is_array(plp) || plp->n != n_prompt))
        return jfail(w, plp, "prompt_logprobs: expected null or an array of %zu entries (one per prompt token)",
                     n_prompt);
    for (uint32_t oi = 0; oi < outs->n; oi++) {
        const ls_jv *o = &outs->kids[oi];
        ls_imp_seq s = {.choice = oi, .row = -1, .prompt_len = (int64_t)n_prompt, .prompt_ids = w->prompt_ids};
        if (rid && (rid->type == LS_JV_STRING || rid->type == LS_JV_NUMBER)) {
            s.request_id = rid->s;
            s.request_id_len = rid->n;
        }
        int64_t idx;
        if (!ls_jv_int(ls_jv_get(o, "index"), 0, INT32_MAX, &idx)) s.choice = idx;
        size_t n_gen = 0;
        LS_TRY(id_array(w, ls_jv_get(o, "token_ids"), "outputs[].token_ids", &w->gen_ids, &w->gen_cap, &n_gen));
        s.gen_ids = w->gen_ids;
        s.n_gen = (int64_t)n_gen;
        const ls_jv *lps = ls_jv_get(o, "logprobs");
        if (!is_array(lps)) return jfail(w, o, "outputs[%u]: no logprobs (SamplingParams logprobs)", oi);
        if (lps->n != n_gen)
            return jfail(w, lps, "outputs[%u].logprobs: %u positions for %zu generated tokens", oi, lps->n, n_gen);
        LS_TRY(ls_imp_seq_begin(w->im, &s, w->err));
        for (uint32_t t = 1; is_array(plp) && t < plp->n; t++) {
            ls_imp_pos p = {.tok_pos = t, .token = w->prompt_ids[t], .at = (int64_t)plp->kids[t].at};
            LS_TRY(logprob_map(w, &plp->kids[t], p.token, "prompt_logprobs", t, &p, 0));
            LS_TRY(ls_imp_add(w->im, &p, w->err));
        }
        for (uint32_t t = 0; t < lps->n; t++) {
            ls_imp_pos p = {.tok_pos = (int64_t)n_prompt + t, .token = w->gen_ids[t], .at = (int64_t)lps->kids[t].at};
            LS_TRY(logprob_map(w, &lps->kids[t], p.token, "logprobs", t, &p, 0));
            LS_TRY(ls_imp_add(w->im, &p, w->err));
        }
        LS_TRY(ls_imp_seq_end(w->im, w->err));
    }
    return LS_OK;
}

ls_status ls_imp_walk_vllm_offline(ls_imp *im, void *ctx, ls_error *err)
{
    return walk_document(im, ctx, offline_one, err);
}

/* ---- SGLang meta_info ------------------------------------------------------------------------ */

/* [logprob, token_id, text]; a null logprob reads as -inf (SGLang's server
 * writes JSON with orjson, which spells every non-finite float null). */
static ls_status sglang_triple(walk *w, const ls_jv *t, const char *field, uint32_t i, uint32_t *bits, int32_t *id,
                               int *null_lp)
{
    if (!is_array(t) || t->n < 2) return jfail(w, t, "%s[%u]: expected [logprob, token_id, text]", field, i);
    *null_lp = t->kids[0].type == LS_JV_NULL;
    if (*null_lp) *bits = NEG_INF_BITS;
    else if (ls_jv_f32(&t->kids[0], bits)) return jfail(w, &t->kids[0], "%s[%u]: logprob is not a number", field, i);
    if (ls_jv_token_id(&t->kids[1], 0, id)) return jfail(w, &t->kids[1], "%s[%u]: token_id is not a token id", field, i);
    return LS_OK;
}

/* A top list [[logprob, token_id, text], ...] in rank order (torch.topk). */
static ls_status sglang_top(walk *w, const ls_jv *l, const char *field, uint32_t i, int *n_top)
{
    *n_top = 0;
    if (is_null(l)) return LS_OK;
    if (!is_array(l)) return jfail(w, l, "%s[%u]: expected a list or null", field, i);
    LS_TRY(grow((void **)&w->top, &w->top_cap, l->n + 1, sizeof *w->top, w->err));
    for (uint32_t k = 0; k < l->n; k++) {
        int null_lp;
        LS_TRY(sglang_triple(w, &l->kids[k], field, i, &w->top[k].bits, &w->top[k].id, &null_lp));
        w->top[k].rank = (int32_t)k + 1;
    }
    *n_top = (int)l->n;
    return LS_OK;
}

static ls_status sglang_one(walk *w, const ls_jv *v)
{
    const ls_jv *mi = ls_jv_get(v, "meta_info");
    if (!mi) mi = v;
    const ls_jv *out = ls_jv_get(mi, "output_token_logprobs");
    if (!is_array(out))
        return jfail(w, v, "expected an SGLang response with meta_info.output_token_logprobs (request fields "
                           "return_logprob, top_logprobs_num)");
    const ls_jv *in = ls_jv_get(mi, "input_token_logprobs"), *in_top = ls_jv_get(mi, "input_top_logprobs");
    const ls_jv *out_top = ls_jv_get(mi, "output_top_logprobs");
    if (!is_null(in) && !is_array(in)) return jfail(w, in, "input_token_logprobs: expected a list");
    if (!is_null(in_top) && (!is_array(in_top) || !is_array(in) || in_top->n != in->n))
        return jfail(w, in_top, "input_top_logprobs: expected a list as long as input_token_logprobs");
    if (!is_null(out_top) && (!is_array(out_top) || out_top->n != out->n))
        return jfail(w, out_top, "output_top_logprobs: expected a list as long as output_token_logprobs");
    ls_imp_seq s = {.choice = -1, .row = -1, .prompt_len = -1};
    const ls_jv *rid = ls_jv_get(mi, "id");
    if (rid && rid->type == LS_JV_STRING) {
        s.request_id = rid->s;
        s.request_id_len = rid->n;
    }
    uint32_t n_in = is_array(in) ? in->n : 0;
    int64_t pt;
    if (!ls_jv_int(ls_jv_get(mi, "prompt_tokens"), 0, INT32_MAX, &pt)) s.prompt_len = pt;
    else if (n_in) s.prompt_len = n_in; /* without prompt_tokens, the input list is taken as the whole prompt */
    if (s.prompt_len < 0 && ls_imp_opts(w->im)->prompt_len > 0) s.prompt_len = ls_imp_opts(w->im)->prompt_len;
    /* input logprobs start at logprob_start_len: the list covers the prompt's last n_in tokens */
    int64_t start = s.prompt_len - n_in;
    if (s.prompt_len >= 0 && start < 0)
        return jfail(w, in, "input_token_logprobs: %u entries for a %" PRId64 "-token prompt", n_in, s.prompt_len);
    LS_TRY(grow((void **)&w->gen_ids, &w->gen_cap, out->n + 1, sizeof *w->gen_ids, w->err));
    LS_TRY(grow((void **)&w->prompt_ids, &w->prompt_cap, n_in + 1, sizeof *w->prompt_ids, w->err));
    uint32_t bits;
    int null_lp;
    for (uint32_t t = 0; t < out->n; t++)
        LS_TRY(sglang_triple(w, &out->kids[t], "output_token_logprobs", t, &bits, &w->gen_ids[t], &null_lp));
    for (uint32_t t = 0; t < n_in; t++)
        LS_TRY(sglang_triple(w, &in->kids[t], "input_token_logprobs", t, &bits, &w->prompt_ids[t], &null_lp));
    s.gen_ids = w->gen_ids;
    s.n_gen = out->n;
    if (start == 0 && n_in) s.prompt_ids = w->prompt_ids;
    LS_TRY(ls_imp_seq_begin(w->im, &s, w->err));
    for (uint32_t t = 0; t < n_in; t++) {
        ls_imp_pos p = {.tok_pos = start + t, .at = (int64_t)in->kids[t].at};
        LS_TRY(sglang_triple(w, &in->kids[t], "input_token_logprobs", t, &p.logprob_bits, &p.token, &null_lp));
        /* the first listed input token has no logprob (null): nothing was read before it */
        if (p.tok_pos == 0 || (t == 0 && null_lp)) continue;
        LS_TRY(sglang_top(w, is_null(in_top) ? NULL : &in_top->kids[t], "input_top_logprobs", t, &p.n_top));
        p.top = w->top;
        LS_TRY(ls_imp_add(w->im, &p, w->err));
    }
    for (uint32_t t = 0; t < out->n; t++) {
        ls_imp_pos p = {.tok_pos = s.prompt_len + t, .at = (int64_t)out->kids[t].at};
        LS_TRY(sglang_triple(w, &out->kids[t], "output_token_logprobs", t, &p.logprob_bits, &p.token, &null_lp));
        LS_TRY(sglang_top(w, is_null(out_top) ? NULL : &out_top->kids[t], "output_top_logprobs", t, &p.n_top));
        p.top = w->top;
        LS_TRY(ls_imp_add(w->im, &p, w->err));
    }
    return ls_imp_seq_end(w->im, w->err);
}

ls_status ls_imp_walk_sglang(ls_imp *im, void *ctx, ls_error *err)
{
    return walk_document(im, ctx, sglang_one, err);
}
