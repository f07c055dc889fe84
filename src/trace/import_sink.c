/* lockstep — the importers' common sink: sequence ids, prompt lengths,
 * record positions, the top-k from rank fields, run_params, and the two
 * passes (measure, then write) that every format runs (import_internal.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/util.h"
#include "trace/import_internal.h"

#define IMPORT_FRAME_RECORDS 4096
#define IMPORT_MAX_NOTES 8

typedef struct seq_meta {
    char *request_id;           /* owned copy (NUL-free), or NULL */
    int64_t choice, row;
    int64_t prompt_len;
    int64_t n_gen;
    int tokens_known;           /* prompt and generated ids both given */
} seq_meta;

struct ls_imp {
    ls_import_format fmt;
    const char *label;
    const ls_import_opts *o;
    int pass;                   /* 0: measure, 1: write */
    /* sequences */
    uint32_t n_seqs;            /* begun so far in this pass */
    seq_meta *meta; size_t n_meta, meta_cap;   /* one per sequence ended in pass 0 */
    int in_seq;
    ls_imp_seq cur;             /* the open sequence (borrowed arrays) */
    int64_t last_tok_pos;       /* of the open sequence, 0 before the first */
    int64_t gen_positions;      /* generated positions added to the open sequence */
    /* pass 0 facts */
    int min_prefix;             /* smallest complete rank prefix over positions with entries; -1 none */
    uint64_t records, prompt_records;
    char *notes[IMPORT_MAX_NOTES];
    int n_notes;
    /* pass 1 output */
    int topk;
    ls_trace_writer *w;
    uint32_t in_frame;
    ls_outfile tokens;
    int tokens_open;
};

const char *ls_imp_label(const ls_imp *im) { return im->label; }
const ls_import_opts *ls_imp_opts(const ls_imp *im) { return im->o; }

void ls_imp_note(ls_imp *im, const char *note)
{
    if (im->pass != 0 || im->n_notes == IMPORT_MAX_NOTES) return;
    for (int i = 0; i < im->n_notes; i++)
        if (!strcmp(im->notes[i], note)) return;
    char *c = strdup(note);
    if (c) im->notes[im->n_notes++] = c;
}

/* "sequence 3 (request 'cmpl-9', choice 1)" for messages. */
static void seq_name(const ls_imp *im, char *buf, size_t n)
{
    size_t l = (size_t)snprintf(buf, n, "sequence %u", im->n_seqs - 1);
    const ls_imp_seq *s = &im->cur;
    if (l < n && s->request_id)
        l += (size_t)snprintf(buf + l, n - l, " (request '%.*s'%s", (int)(s->request_id_len > 80 ? 80 : s->request_id_len),
                              s->request_id, s->choice >= 0 ? "" : ")");
    if (l < n && s->choice >= 0)
        l += (size_t)snprintf(buf + l, n - l, "%schoice %" PRId64 ")", s->request_id ? ", " : " (", s->choice);
    if (l < n && s->row >= 0) snprintf(buf + l, n - l, " (batch row %" PRId64 ")", s->row);
}

static ls_status fail_seq(ls_imp *im, int64_t at, ls_error *err, const char *what)
{
    char name[200];
    seq_name(im, name, sizeof name);
    if (at >= 0)
        return ls_fail(err, LS_E_INPUT, "%s: byte offset %" PRId64 ": %s: %s", im->label, at, name, what);
    return ls_fail(err, LS_E_INPUT, "%s: %s: %s", im->label, name, what);
}

ls_status ls_imp_seq_begin(ls_imp *im, const ls_imp_seq *s, ls_error *err)
{
    if (im->in_seq) return ls_fail(err, LS_E_INTERNAL, "%s: import: sequence begun twice", im->label);
    if (im->n_seqs == UINT32_MAX) return ls_fail(err, LS_E_INPUT, "%s: more than 4294967295 sequences", im->label);
    im->cur = *s;
    im->in_seq = 1;
    im->n_seqs++;
    im->last_tok_pos = 0;
    im->gen_positions = 0;
    if (im->cur.prompt_len < 0 && im->o->prompt_len > 0) im->cur.prompt_len = im->o->prompt_len;
    if (im->cur.prompt_len < 1)
        return fail_seq(im, -1, err, im->cur.prompt_len == 0 ? "the prompt is empty (a trace position needs a "
                                                               "prompt token before it)"
                                                             : "the file gives no prompt length; state it with the "
                                                               "prompt_len option");
    if (s->request_id && memchr(s->request_id, 0, s->request_id_len))
        return fail_seq(im, -1, err, "the request id holds a NUL character");
    return LS_OK;
}

/* Complete rank prefix of a position: the largest m with ranks 1..m all present. */
static int rank_prefix(const ls_imp_pos *p)
{
    uint64_t seen = 0;
    for (int i = 0; i < p->n_top; i++)
        if (p->top[i].rank >= 1 && p->top[i].rank <= LS_TRACE_TOPK_MAX) seen |= 1ull << (p->top[i].rank - 1);
    int m = 0;
    while (m < LS_TRACE_TOPK_MAX && (seen >> m & 1)) m++;
    return m;
}

ls_status ls_imp_add(ls_imp *im, const ls_imp_pos *p, ls_error *err)
{
    char msg[256];
    const ls_imp_seq *s = &im->cur;
    if (!im->in_seq) return ls_fail(err, LS_E_INTERNAL, "%s: import: position outside a sequence", im->label);
    if (p->tok_pos < 1 || p->tok_pos > (int64_t)UINT32_MAX) {
        snprintf(msg, sizeof msg, "token position %" PRId64 " out of range", p->tok_pos);
        return fail_seq(im, p->at, err, msg);
    }
    if (p->tok_pos <= im->last_tok_pos) {
        snprintf(msg, sizeof msg, "token position %" PRId64 " after %" PRId64 ": positions must increase",
                 p->tok_pos, im->last_tok_pos);
        return fail_seq(im, p->at, err, msg);
    }
    im->last_tok_pos = p->tok_pos;
    int64_t plen = s->prompt_len;
    if (p->tok_pos >= plen) im->gen_positions++;
    /* the token at tok_pos, where the file gives the sequence's ids, must be the scored one */
    int32_t known = -1;
    if (p->tok_pos < plen && s->prompt_ids) known = s->prompt_ids[p->tok_pos];
    if (p->tok_pos >= plen && s->gen_ids && p->tok_pos - plen < s->n_gen) known = s->gen_ids[p->tok_pos - plen];
    if (known >= 0 && known != p->token) {
        snprintf(msg, sizeof msg, "the logprob at token position %" PRId64 " is of token %d, but the sequence's "
                 "token there is %d", p->tok_pos, p->token, known);
        return fail_seq(im, p->at, err, msg);
    }
    uint64_t seen = 0;
    for (int i = 0; i < p->n_top; i++) {
        int r = p->top[i].rank;
        if (r < 1 || r > LS_TRACE_TOPK_MAX) continue;
        if (seen >> (r - 1) & 1) {
            snprintf(msg, sizeof msg, "token position %" PRId64 ": two entries have rank %d", p->tok_pos, r);
            return fail_seq(im, p->at, err, msg);
        }
        seen |= 1ull << (r - 1);
    }
    if (im->pass == 0) {
        if (p->n_top) {
            int m = rank_prefix(p);
            if (im->min_prefix < 0 || m < im->min_prefix) im->min_prefix = m;
        }
        im->records++;
        im->prompt_records += p->tok_pos < plen;
        return LS_OK;
    }
    ls_trace_record r;
    memset(&r, 0, sizeof r);
    r.seq = im->n_seqs - 1;
    r.pos = (uint32_t)(p->tok_pos - 1);
    int64_t in = r.pos; /* the input token at the record's position */
    r.token = -1;
    if (in < plen && s->prompt_ids) r.token = s->prompt_ids[in];
    if (in >= plen && s->gen_ids && in - plen < s->n_gen) r.token = s->gen_ids[in - plen];
    r.next_token = p->token;
    r.logprob_bits = p->logprob_bits;
    for (int k = 0; k < LS_TRACE_TOPK_MAX; k++) {
        r.topk_ids[k] = -1;
        r.topk_logprob_bits[k] = 0x7fc00000u;
    }
    for (int i = 0; i < p->n_top; i++) {
        int rk = p->top[i].rank;
        if (rk < 1 || rk > im->topk) continue;
        r.topk_ids[rk - 1] = p->top[i].id;
        r.topk_logprob_bits[rk - 1] = p->top[i].bits;
    }
    if (im->in_frame == 0) LS_TRY(ls_trace_writer_begin_frame(im->w, LS_FRAME_IMPORT, err));
    LS_TRY(ls_trace_writer_add(im->w, &r, err));
    if (++im->in_frame == IMPORT_FRAME_RECORDS) {
        im->in_frame = 0;
        LS_TRY(ls_trace_writer_end_frame(im->w, err));
    }
    return LS_OK;
}

static ls_status tokens_line(ls_imp *im, ls_error *err)
{
    const ls_imp_seq *s = &im->cur;
    FILE *f = im->tokens.fp;
    fprintf(f, "{\"id\":%u,\"tokens\":[", im->n_seqs - 1);
    for (int64_t i = 0; i < s->prompt_len; i++) fprintf(f, "%s%d", i ? "," : "", s->prompt_ids[i]);
    for (int64_t i = 0; i < s->n_gen; i++) fprintf(f, ",%d", s->gen_ids[i]);
    fprintf(f, "],\"prompt_len\":%" PRId64 "}\n", s->prompt_len);
    if (ferror(f)) return ls_fail(err, LS_E_IO, "%s: write failed", im->tokens.tmp_path);
    return LS_OK;
}

ls_status ls_imp_seq_end(ls_imp *im, ls_error *err)
{
    if (!im->in_seq) return ls_fail(err, LS_E_INTERNAL, "%s: import: sequence ended twice", im->label);
    im->in_seq = 0;
    ls_imp_seq *s = &im->cur;
    if (s->n_gen < 0) s->n_gen = im->gen_positions;
    if (im->pass == 1) {
        if (im->tokens_open) {
            if (!s->prompt_ids || !s->gen_ids)
                return fail_seq(im, -1, err, s->prompt_ids ? "the file does not list the generated token ids "
                                                             "(needed for the tokens file)"
                                                           : "the file does not list the prompt token ids (needed "
                                                             "for the tokens file)");
            LS_TRY(tokens_line(im, err));
        }
        return LS_OK;
    }
    if (im->n_meta == im->meta_cap) {
        size_t nc = im->meta_cap ? 2 * im->meta_cap : 64;
        seq_meta *m = realloc(im->meta, nc * sizeof *m);
        if (!m) return ls_fail(err, LS_E_NOMEM, "out of memory");
        im->meta = m;
        im->meta_cap = nc;
    }
    seq_meta *m = &im->meta[im->n_meta++];
    memset(m, 0, sizeof *m);
    if (s->request_id) {
        m->request_id = malloc(s->request_id_len + 1);
        if (!m->request_id) return ls_fail(err, LS_E_NOMEM, "out of memory");
        memcpy(m->request_id, s->request_id, s->request_id_len);
        m->request_id[s->request_id_len] = 0;
    }
    m->choice = s->choice;
    m->row = s->row;
    m->prompt_len = s->prompt_len;
    m->n_gen = s->n_gen;
    m->tokens_known = s->prompt_ids && s->gen_ids;
    return LS_OK;
}

/* run_params of the imported trace: where it came from and, per sequence,
 * the engine's request id and the prompt length (run_params.batch has the
 * schema a rollout writes: id, prompt_len, n_tokens). */
static char *run_params_json(const ls_imp *im, ls_error *err)
{
    json_t *batch = json_array(), *notes = json_array();
    const char *base = strrchr(im->label, '/');
    base = base ? base + 1 : im->label;
    for (uint32_t i = 0; batch && i < im->n_meta; i++) {
        const seq_meta *m = &im->meta[i];
        json_t *e = json_pack("{s:I, s:I, s:I}", "id", (json_int_t)i, "prompt_len", (json_int_t)m->prompt_len,
                              "n_tokens", (json_int_t)(m->prompt_len + m->n_gen));
        if (e && m->request_id) {
            json_t *rid = json_string(m->request_id);
            if (!rid) {
                json_decref(e);
                json_decref(batch);
                json_decref(notes);
                ls_fail(err, LS_E_INPUT, "%s: the request id of sequence %u is not valid UTF-8", im->label, i);
                return NULL;
            }
            json_object_set_new(e, "request_id", rid);
        }
        if (e && m->choice >= 0) json_object_set_new(e, "choice", json_integer(m->choice));
        if (e && m->row >= 0) json_object_set_new(e, "row", json_integer(m->row));
        json_array_append_new(batch, e);
    }
    for (int i = 0; notes && i < im->n_notes; i++) json_array_append_new(notes, json_string(im->notes[i]));
    json_t *imp = json_pack("{s:s, s:s, s:I, s:I, s:o}", "format", ls_import_format_name(im->fmt), "source", base,
                            "records", (json_int_t)im->records, "prompt_records", (json_int_t)im->prompt_records,
                            "notes", notes);
    if (imp && im->fmt == LS_IMPORT_VERL)
        json_object_set_new(imp, "logprobs_key",
                            json_string(im->o->logprobs_key ? im->o->logprobs_key : "rollout_log_probs"));
    json_t *root = json_pack("{s:s, s:o, s:o}", "mode", "import", "import", imp, "batch", batch);
    char *text = root ? json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    if (!text) ls_fail(err, LS_E_NOMEM, "%s: out of memory (run_params)", im->label);
    return text;
}

static void imp_free(ls_imp *im)
{
    for (size_t i = 0; i < im->n_meta; i++) free(im->meta[i].request_id);
    for (int i = 0; i < im->n_notes; i++) free(im->notes[i]);
    free(im->meta);
}

ls_status ls_imp_run(ls_import_format fmt, const char *label, ls_imp_walk_fn walk, void *ctx,
                     const ls_import_opts *o, const char *out_path, ls_import_summary *sum, ls_error *err)
{
    ls_imp im;
    memset(&im, 0, sizeof im);
    im.fmt = fmt;
    im.label = label;
    im.o = o;
    im.min_prefix = -1;
    if (!o->model_fingerprint) return ls_fail(err, LS_E_USAGE, "import: a model fingerprint is required");
    if (o->topk < 0 || o->topk > LS_TRACE_TOPK_MAX)
        return ls_fail(err, LS_E_USAGE, "import: topk must be 0..%d", LS_TRACE_TOPK_MAX);
    /* pass 0: measure */
    ls_status st = walk(&im, ctx, err);
    uint32_t n_seqs = im.n_seqs;
    if (!st && im.in_seq) st = ls_fail(err, LS_E_INTERNAL, "%s: import: a sequence was left open", label);
    if (!st && im.records == 0)
        st = ls_fail(err, LS_E_INPUT, "%s: no logprobs found (%u sequences; ask the engine for logprobs)", label,
                     n_seqs);
    im.topk = o->topk ? o->topk : im.min_prefix > 0 ? im.min_prefix : 1;
    if (!st && !o->topk && im.min_prefix < 0) ls_imp_note(&im, "no top-k in the file: top-k slots unused");
    char *params = st ? NULL : run_params_json(&im, err);
    if (!st && !params) st = err ? err->status : LS_E_NOMEM;
    if (!st) {
        ls_trace_header h = {0};
        h.mode = "import";
        h.engine = o->engine ? o->engine : ls_import_format_name(fmt);
        h.model_fingerprint = o->model_fingerprint;
        h.manifest_digest = o->manifest_digest ? o->manifest_digest : "";
        h.run_params_json = params;
        h.topk = im.topk;
        h.state_digest_every = 1;
        st = ls_trace_writer_open(out_path, &h, &im.w, err);
    }
    free(params);
    if (!st && o->tokens_out) {
        st = ls_outfile_open(&im.tokens, o->tokens_out, err);
        im.tokens_open = !st;
    }
    /* pass 1: write */
    if (!st) {
        for (size_t i = 0; i < im.n_meta; i++) free(im.meta[i].request_id);
        im.n_meta = 0;
        im.pass = 1;
        im.n_seqs = 0;
        st = walk(&im, ctx, err);
        if (!st && im.n_seqs != n_seqs)
            st = ls_fail(err, LS_E_INTERNAL, "%s: import: the second pass saw %u sequences, the first %u", label,
                         im.n_seqs, n_seqs);
    }
    if (!st && im.in_frame) st = ls_trace_writer_end_frame(im.w, err);
    if (!st) {
        st = ls_trace_writer_close(im.w, err);
        im.w = NULL;
    }
    if (!st && im.tokens_open) {
        st = ls_outfile_commit(&im.tokens, err);
        im.tokens_open = 0;
    }
    if (im.w) ls_trace_writer_abort(im.w);
    if (im.tokens_open) ls_outfile_abort(&im.tokens);
    if (!st && sum) {
        sum->records = im.records;
        sum->sequences = n_seqs;
        sum->prompt_records = im.prompt_records;
        sum->topk = im.topk;
        sum->no_topk = im.min_prefix < 0;
    }
    imp_free(&im);
    return st;
}
