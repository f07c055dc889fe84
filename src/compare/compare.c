/* lockstep — comparator (see compare.h for the walk order and memory bound). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/compare.h"
#include "compare/compare_stats.h"
#include "core/util.h"
#include "core/bytes.h"
#include "core/u32map.h"

#include <jansson.h>

static const char *const what_names[] = {"none", "token", "digest", "next_token", "logprob",
                                         "topk_set", "topk_order", "topk_logprob", "missing"};
const char *ls_drift_what_name(ls_drift_what w)
{
    return (unsigned)w <= LS_DRIFT_MISSING ? what_names[w] : "?";
}

static float bits_to_float(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

double ls_compare_dump_value(const ls_trace_dump *d, uint32_t i, uint32_t *bits)
{
    const uint8_t *p = d->data;
    uint32_t b;
    if (d->dtype == LS_DUMP_BF16) {
        b = ls_rd16(p + 2 * (size_t)i);
        if (bits) *bits = b;
        return bits_to_float(b << 16);
    }
    b = ls_rd32(p + 4 * (size_t)i);
    if (bits) *bits = b;
    if (d->dtype == LS_DUMP_ROUTER && i < d->n_elems / 2) return (double)(int32_t)b;
    return bits_to_float(b);
}

/* Monotone integer image of a float's bits, so |a - b| counts ULPs. */
static int64_t ordered(uint32_t bits, int width)
{
    uint32_t sign = width == 16 ? 0x8000u : 0x80000000u;
    int64_t mag = bits & (sign - 1);
    return (bits & sign) ? -mag : mag;
}

static void tensor_diff(const ls_trace_record *a, const ls_trace_record *b, int layer, int kind, ls_tensor_diff *t)
{
    memset(t, 0, sizeof *t);
    t->first_index = -1;
    const ls_trace_dump *da = NULL, *db = NULL;
    for (uint32_t i = 0; i < a->n_dumps; i++)
        if (a->dumps[i].layer == layer && a->dumps[i].kind == kind) da = &a->dumps[i];
    for (uint32_t i = 0; i < b->n_dumps; i++)
        if (b->dumps[i].layer == layer && b->dumps[i].kind == kind) db = &b->dumps[i];
    if (!da || !db || da->dtype != db->dtype || da->n_elems != db->n_elems) return;
    t->present = 1;
    t->dtype = da->dtype;
    t->n_elems = da->n_elems;
    uint32_t start = 0;
    if (da->dtype == LS_DUMP_ROUTER) {
        int k = (int)(da->n_elems / 2);
        t->router_k = k > LS_TRACE_TOPK_MAX ? LS_TRACE_TOPK_MAX : k;
        for (int i = 0; i < t->router_k; i++) {
            t->router_a[i] = (int32_t)ls_rd32((const uint8_t *)da->data + 4 * i);
            t->router_b[i] = (int32_t)ls_rd32((const uint8_t *)db->data + 4 * i);
            if (t->router_a[i] != t->router_b[i]) t->router_order_differs = 1;
        }
        for (int i = 0; i < t->router_k; i++) {
            int found = 0;
            for (int j = 0; j < t->router_k; j++) found |= t->router_a[i] == t->router_b[j];
            if (!found) t->router_set_differs = 1;
        }
        if (t->router_set_differs) t->router_order_differs = 0;
    }
    double sum = 0;
    uint32_t n_val = 0;
    for (uint32_t i = 0; i < da->n_elems; i++) {
        uint32_t ba, bb;
        double va = ls_compare_dump_value(da, i, &ba), vb = ls_compare_dump_value(db, i, &bb);
        int is_id = da->dtype == LS_DUMP_ROUTER && i < da->n_elems / 2;
        if (ba != bb) {
            t->n_differ++;
            if (t->first_index < 0) {
                t->first_index = i;
                t->a_bits = ba;
                t->b_bits = bb;
                t->a_value = va;
                t->b_value = vb;
                if (!is_id) {
                    int w = da->dtype == LS_DUMP_BF16 ? 16 : 32;
                    int64_t d = ordered(ba, w) - ordered(bb, w);
                    t->ulp = (uint64_t)(d < 0 ? -d : d);
                }
            }
        }
        if (is_id || i < start) continue;
        double d = fabs(va - vb);
        if (d == d) {
            sum += d;
            if (d > t->max_abs) t->max_abs = d;
        }
        n_val++;
    }
    t->mean_abs = n_val ? sum / n_val : 0;
}

/* ---- per-sequence state -------------------------------------------------------------- */
typedef struct walk {
    ls_compare_result *r;
    ls_trace_index *ix;          /* B */
    ls_u32map map;               /* seq -> index in r->seqs */
    size_t seqs_cap;
    int64_t *last_pos;           /* [seqs_cap] last A position compared/visited, -1 */
    int rows;                    /* n_layers + 3 */
    int max_cols;
    uint64_t first_order;        /* drift discovery counter */
    uint64_t *drift_order;       /* [seqs_cap] order of each seq's first drift (0 = none) */
    int skip_token;              /* an imported trace has no input tokens */
    int a_import, b_import;      /* the trace is an import: it holds positions from its engine's first on */
    uint64_t *outside;           /* [seqs_cap] a_import: B positions before A's first */
    uint64_t outside_a;          /* b_import: A positions before B's first, over all sequences */
    uint64_t topk_positions;     /* positions whose top-k was compared */
    uint64_t topk_used_a, topk_used_b; /* of those: positions where A's (B's) slot 0 holds a token */
    int logprobs_only;           /* token ids and selected logprobs only */
    int same_layout;             /* same top-k width and digest kinds: equal raw bytes mean equal records */
    ls_trace_reader *ra;         /* A, lazy */
    ls_stats *stats;             /* drift statistics, NULL when not asked for */
    ls_u32map prompt_len;        /* seq -> prompt length from run_params.batch */
} walk;

static ls_status seq_slot(walk *w, uint32_t seq, ls_compare_seq **out, size_t *idx, ls_error *err)
{
    uint32_t i;
    if (ls_u32map_get(&w->map, seq, &i)) {
        *out = &w->r->seqs[i];
        *idx = i;
        return LS_OK;
    }
    ls_compare_result *r = w->r;
    if (r->n_seqs == w->seqs_cap) {
        size_t nc = w->seqs_cap ? w->seqs_cap * 2 : 16;
        ls_compare_seq *q = realloc(r->seqs, nc * sizeof *q);
        if (!q) return ls_fail_nomem(err, nc * sizeof *q, "compare: table of %zu sequences", nc);
        r->seqs = q;
        int64_t *lp = realloc(w->last_pos, nc * sizeof *lp);
        if (!lp) return ls_fail_nomem(err, nc * sizeof *lp, "compare: table of %zu sequences", nc);
        w->last_pos = lp;
        uint64_t *dor = realloc(w->drift_order, nc * sizeof *dor);
        if (!dor) return ls_fail_nomem(err, nc * sizeof *dor, "compare: table of %zu sequences", nc);
        w->drift_order = dor;
        uint64_t *os = realloc(w->outside, nc * sizeof *os);
        if (!os) return ls_fail(err, LS_E_NOMEM, "out of memory");
        w->outside = os;
        w->seqs_cap = nc;
    }
    i = (uint32_t)r->n_seqs++;
    ls_compare_seq *s = &r->seqs[i];
    memset(s, 0, sizeof *s);
    s->seq = seq;
    s->pass = 1;
    s->first_token_divergence = -1;
    w->last_pos[i] = -1;
    w->drift_order[i] = 0;
    w->outside[i] = 0;
    s->pos_end = ls_trace_index_seq_end(w->ix, seq);
    uint32_t pl;
    if (ls_u32map_get(&w->prompt_len, seq, &pl)) s->prompt_len = pl;
    if (s->pos_end) {
        s->cols = s->pos_end < (uint32_t)w->max_cols ? s->pos_end : (uint32_t)w->max_cols;
        s->pos_per_col = (s->pos_end + s->cols - 1) / s->cols;
        s->cols = (s->pos_end + s->pos_per_col - 1) / s->pos_per_col;
        s->cells = calloc((size_t)w->rows * s->cols, 1);
        s->dlogprob = calloc(s->cols, sizeof *s->dlogprob);
        if (!s->cells || !s->dlogprob)
            return ls_fail_nomem(err, (size_t)w->rows * s->cols + s->cols * sizeof *s->dlogprob,
                                 "compare: heat map of %zu x %zu cells", (size_t)w->rows, (size_t)s->cols);
    }
    LS_TRY(ls_u32map_put(&w->map, seq, i, err));
    *out = s;
    *idx = i;
    return LS_OK;
}

static void cell(const walk *w, ls_compare_seq *s, int row, uint32_t pos, uint8_t v)
{
    if (!s->cells || pos >= s->pos_end) return;
    uint8_t *c = &s->cells[(size_t)row * s->cols + pos / s->pos_per_col];
    (void)w;
    if (*c < v) *c = v;
}

/* One side of a top-k set difference: "unused", "13 (not in B)" or "13". */
static void topk_side(char *buf, size_t n, int64_t id, int missing, char other)
{
    if (id < 0) snprintf(buf, n, "unused");
    else if (missing) snprintf(buf, n, "%" PRId64 " (not in %c)", id, other);
    else snprintf(buf, n, "%" PRId64, id);
}

static void describe(const ls_compare_result *r, ls_compare_drift *d)
{
    char where[160];
    if (d->layer >= 0 && d->decoder_layer >= 0)
        snprintf(where, sizeof where, "seq %u pos %u layer %d (%s, decoder layer %d)", d->seq, d->pos, d->layer,
                 ls_layer_family_name(d->family), d->decoder_layer);
    else if (d->layer >= 0)
        snprintf(where, sizeof where, "seq %u pos %u layer %d (%s)", d->seq, d->pos, d->layer,
                 ls_layer_family_name(d->family));
    else
        snprintf(where, sizeof where, "seq %u pos %u", d->seq, d->pos);
    switch (d->what) {
    case LS_DRIFT_TOKEN:
        snprintf(d->message, sizeof d->message, "%s: input token differs: A %" PRId64 ", B %" PRId64, where, d->a_value,
                 d->b_value);
        break;
    case LS_DRIFT_DIGEST:
        snprintf(d->message, sizeof d->message, "%s: %s digest differs", where, ls_digest_kind_name(d->kind));
        break;
    case LS_DRIFT_NEXT_TOKEN:
        snprintf(d->message, sizeof d->message, "%s: selected next token differs: A %" PRId64 ", B %" PRId64, where,
                 d->a_value, d->b_value);
        break;
    case LS_DRIFT_LOGPROB:
        snprintf(d->message, sizeof d->message, "%s: selected-token logprob bits differ: A 0x%08" PRIx64 " (%.9g), B 0x%08" PRIx64 " (%.9g)",
                 where, d->a_value, bits_to_float((uint32_t)d->a_value), d->b_value, bits_to_float((uint32_t)d->b_value));
        break;
    case LS_DRIFT_TOPK_SET: {
        char sa[48], sb[48];
        topk_side(sa, sizeof sa, d->a_value, d->topk_a_missing, 'B');
        topk_side(sb, sizeof sb, d->b_value, d->topk_b_missing, 'A');
        snprintf(d->message, sizeof d->message, "%s: top-%d token sets differ at slot %d: A %s, B %s", where,
                 r->topk_compared, d->topk_slot, sa, sb);
        break;
    }
    case LS_DRIFT_TOPK_ORDER:
        snprintf(d->message, sizeof d->message, "%s: top-%d order differs (slot %d: A %" PRId64 ", B %" PRId64 ")", where,
                 r->topk_compared, d->topk_slot, d->a_value, d->b_value);
        break;
    case LS_DRIFT_TOPK_LOGPROB:
        snprintf(d->message, sizeof d->message, "%s: top-%d logprob bits differ at slot %d: A 0x%08" PRIx64 ", B 0x%08" PRIx64,
                 where, r->topk_compared, d->topk_slot, d->a_value, d->b_value);
        break;
    case LS_DRIFT_MISSING:
        snprintf(d->message, sizeof d->message, "%s: position present only in trace %s", where, d->a_value ? "A" : "B");
        break;
    default:
        d->message[0] = 0;
    }
}

static void set_first(walk *w, ls_compare_seq *s, size_t si, const ls_compare_drift *d)
{
    if (!s->pass && s->first.what != LS_DRIFT_NONE) return;
    s->pass = 0;
    s->first = *d;
    s->first.layer = d->layer;
    describe(w->r, &s->first);
    w->drift_order[si] = ++w->first_order;
    if (d->layer >= 0) cell(w, s, 1 + d->layer, d->pos, LS_CELL_FIRST);
}

static void mark_missing(walk *w, ls_compare_seq *s, size_t si, uint32_t pos, int in_a)
{
    ls_compare_drift d = {0};
    d.what = LS_DRIFT_MISSING;
    d.seq = s->seq;
    d.pos = pos;
    d.layer = -1;
    d.topk_slot = -1;
    d.a_value = in_a != 0;
    d.b_value = in_a == 0;
    set_first(w, s, si, &d);
}

/* Counts every digest of a record as compared and equal, and marks the heat
 * map, reading each digest's layer from the record's encoded bytes so a
 * lazily decoded record needs no digest copies. */
static void mark_digests_equal(const walk *w, ls_compare_seq *s, const ls_trace_record *a)
{
    s->digests_compared += a->n_digests;
    if (w->r->layer_stats)
        for (uint32_t i = 0; i < a->n_digests; i++) w->r->layer_stats[ls_trace_record_digest_layer(a, i)].digests_compared++;
    if (!s->cells || a->pos >= s->pos_end) return;
    uint8_t *col = s->cells + a->pos / s->pos_per_col;
    int last = -1;
    /* digests are ordered by layer: one heat-map cell per run of a layer */
    for (uint32_t i = 0; i < a->n_digests; i++) {
        int layer = ls_trace_record_digest_layer(a, i);
        if (layer == last) continue;
        last = layer;
        uint8_t *c = col + (size_t)(1 + layer) * s->cols;
        if (*c < LS_CELL_EQUAL) *c = LS_CELL_EQUAL;
    }
}

/* Hands one position to the drift statistics, with both records' dumps
 * decoded when either carries any. */
static ls_status position_stats(walk *w, const ls_compare_seq *s, size_t si, const ls_trace_record *a,
                                const ls_trace_record *b, ls_error *err)
{
    if (a->n_dumps || b->n_dumps) {
        LS_TRY(ls_trace_reader_load_digests(w->ra, err));
        LS_TRY(ls_trace_index_load_digests(w->ix, err));
    }
    return ls_stats_position(w->stats, si, s->prompt_len, a, b, w->r->topk_compared, w->r->layer_stats, err);
}

/* Prompt lengths from run_params.batch (docs/trace-format.md, section 3):
 * A's entries first, B's where A has none. */
static ls_status read_prompt_lengths(walk *w, const ls_trace_header *h, ls_error *err)
{
    json_t *p = ls_trace_run_params_parse(h->run_params_json, NULL);
    json_t *batch = p ? json_object_get(p, "batch") : NULL;
    ls_status st = LS_OK;
    for (size_t i = 0; st == LS_OK && json_is_array(batch) && i < json_array_size(batch); i++) {
        json_t *e = json_array_get(batch, i), *id = json_object_get(e, "id"), *pl = json_object_get(e, "prompt_len");
        uint32_t have;
        if (!json_is_integer(id) || !json_is_integer(pl) || json_integer_value(id) < 0 ||
            json_integer_value(id) > UINT32_MAX || json_integer_value(pl) < 1 || json_integer_value(pl) > UINT32_MAX ||
            ls_u32map_get(&w->prompt_len, (uint32_t)json_integer_value(id), &have))
            continue;
        st = ls_u32map_put(&w->prompt_len, (uint32_t)json_integer_value(id), (uint32_t)json_integer_value(pl), err);
    }
    json_decref(p);
    return st;
}

/* Slot of id among the first k top-k entries of r, or -1. */
static int topk_find(const ls_trace_record *r, int k, int32_t id)
{
    for (int i = 0; i < k; i++)
        if (r->topk_ids[i] == id) return i;
    return -1;
}

/* Counts, for the note on a trace without top-k, whether each side's top-k
 * holds a token at this position. */
static void topk_count(walk *w, int k, const ls_trace_record *a, const ls_trace_record *b)
{
    if (k <= 0) return;
    w->topk_positions++;
    w->topk_used_a += a->topk_ids[0] >= 0;
    w->topk_used_b += b->topk_ids[0] >= 0;
}

/* Compares one position present in both traces. Returns an error only when
 * decoding a record's digests fails (out of memory). */
static ls_status compare_pair(walk *w, ls_compare_seq *s, size_t si, const ls_trace_record *a, const ls_trace_record *b,
                              ls_error *err)
{
    ls_compare_result *r = w->r;
    int k = r->topk_compared;
    int n_layers = r->n_layers;
    uint32_t pos = a->pos;
    s->positions_compared++;
    int fast = w->same_layout && ls_trace_record_bytes_equal(a, b);
    if (fast) {
        s->tokens_equal++;
        s->topk_set_equal++;
        if (a->next_token >= 0) s->steps++;
        cell(w, s, 0, pos, LS_CELL_EQUAL);
        if (!w->logprobs_only) mark_digests_equal(w, s, a);
        cell(w, s, n_layers + 1, pos, LS_CELL_EQUAL);
        cell(w, s, n_layers + 2, pos, LS_CELL_EQUAL);
        topk_count(w, k, a, b);
        return w->stats ? position_stats(w, s, si, a, b, err) : LS_OK;
    }
    ls_compare_drift d = {0};
    d.seq = a->seq;
    d.pos = pos;
    d.layer = -1;
    d.topk_slot = -1;
    int found = 0;
    /* 1. input token */
    if (a->token != b->token && !w->skip_token) {
        d.what = LS_DRIFT_TOKEN;
        d.a_value = a->token;
        d.b_value = b->token;
        found = 1;
        cell(w, s, 0, pos, LS_CELL_DIFFERS);
        if (s->first_token_divergence < 0) s->first_token_divergence = pos;
    } else {
        cell(w, s, 0, pos, LS_CELL_EQUAL);
    }
    /* 2. layers in order, kinds in order. Equal digest arrays (same (layer,
     * kind) list, same digests: one memcmp) are all equal; otherwise walk them
     * to find the first differing one. */
    uint32_t i = 0, j = 0;
    if (w->logprobs_only) {
        i = a->n_digests; /* not compared */
    } else if (ls_trace_record_digests_equal(a, b)) {
        /* every kind present in both records is in both headers: all are compared */
        mark_digests_equal(w, s, a);
        i = a->n_digests; /* skip the walk */
    } else {
        ls_status st = ls_trace_reader_load_digests(w->ra, err);
        if (!st) st = ls_trace_index_load_digests(w->ix, err);
        if (st) return st;
    }
    while (i < a->n_digests && j < b->n_digests) {
        const ls_trace_digest *x = &a->digests[i], *y = &b->digests[j];
        int kx = x->layer * LS_DIGEST_COUNT + x->kind, ky = y->layer * LS_DIGEST_COUNT + y->kind;
        if (kx < ky) { i++; continue; }
        if (ky < kx) { j++; continue; }
        i++, j++;
        if (!(r->kinds_compared & (1u << x->kind))) continue;
        s->digests_compared++;
        if (r->layer_stats) r->layer_stats[x->layer].digests_compared++;
        if (ls_digest_equal(&x->digest, &y->digest)) {
            cell(w, s, 1 + x->layer, pos, LS_CELL_EQUAL);
            continue;
        }
        s->digests_differ++;
        if (r->layer_stats) r->layer_stats[x->layer].digests_differ++;
        if (x->kind == LS_DIGEST_ROUTER) {
            s->router_differ++;
            r->router_differ_per_layer[x->layer]++;
        }
        cell(w, s, 1 + x->layer, pos, LS_CELL_DIFFERS);
        /* Within a layer the causal order is conv_state, gdn_state, kv, router, hidden. */
        static const int rank[LS_DIGEST_COUNT] = {4, 1, 0, 2, 3};
        if (!found || (d.what == LS_DRIFT_DIGEST && d.layer == x->layer && rank[x->kind] < rank[d.kind])) {
            found = 1;
            d.what = LS_DRIFT_DIGEST;
            d.layer = x->layer;
            d.family = r->layers[x->layer].family;
            d.decoder_layer = r->layers[x->layer].decoder_layer;
            d.kind = (ls_digest_kind)x->kind;
            d.a_digest = x->digest;
            d.b_digest = y->digest;
            if (s->pass) tensor_diff(a, b, x->layer, x->kind, &d.tensor);
        }
    }
    /* 3. selected next token and its logprob */
    int out_differs = 0;
    if (a->next_token != b->next_token) {
        out_differs = 1;
        if (s->first_token_divergence < 0) s->first_token_divergence = pos;
        if (!found) {
            found = 1;
            d.what = LS_DRIFT_NEXT_TOKEN;
            d.a_value = a->next_token;
            d.b_value = b->next_token;
        }
    } else if (a->logprob_bits != b->logprob_bits) {
        out_differs = 1;
        if (!found) {
            found = 1;
            d.what = LS_DRIFT_LOGPROB;
            d.a_value = a->logprob_bits;
            d.b_value = b->logprob_bits;
        }
    }
    double dl = 0;
    if (a->next_token == b->next_token && a->next_token >= 0) {
        double x = bits_to_float(a->logprob_bits), y = bits_to_float(b->logprob_bits);
        if (x == x && y == y) dl = fabs(x - y);
    }
    if (a->next_token >= 0 && b->next_token >= 0) s->steps++;
    if ((a->token == b->token || w->skip_token) && a->next_token == b->next_token) s->tokens_equal++;
    cell(w, s, n_layers + 1, pos, out_differs ? LS_CELL_DIFFERS : LS_CELL_EQUAL);
    /* 4. top-k: set, order, logprob bits. Unused slots (id -1, section 5 of
     * docs/trace-format.md) hold no token: they are never looked up in the
     * other list, and a slot used on one side only is a set difference. */
    int set_eq = 1, order_slot = -1, bits_slot = -1, set_slot = -1;
    double pa_sum = 0, pb_sum = 0, kl = 0;
    topk_count(w, k, a, b);
    for (int x = 0; x < k; x++) {
        int32_t ia = a->topk_ids[x], ib = b->topk_ids[x];
        int m = ia >= 0 ? topk_find(b, k, ia) : -1;
        if ((ia >= 0 && m < 0) || (ib >= 0 && topk_find(a, k, ib) < 0) || ((ia < 0) != (ib < 0))) {
            set_eq = 0;
            if (set_slot < 0) set_slot = x;
        }
        if (ia != ib && order_slot < 0) order_slot = x;
        if (ia == ib && a->topk_logprob_bits[x] != b->topk_logprob_bits[x] && bits_slot < 0) bits_slot = x;
        if (m < 0) continue;
        double la = bits_to_float(a->topk_logprob_bits[x]), lb = bits_to_float(b->topk_logprob_bits[m]);
        if (la == la && lb == lb) {
            if (fabs(la - lb) > dl) dl = fabs(la - lb);
            pa_sum += exp(la);
            pb_sum += exp(lb);
        }
    }
    if (pa_sum > 0 && pb_sum > 0) {
        for (int x = 0; x < k; x++) {
            int y = a->topk_ids[x] >= 0 ? topk_find(b, k, a->topk_ids[x]) : -1;
            if (y < 0) continue;
            double la = bits_to_float(a->topk_logprob_bits[x]), lb = bits_to_float(b->topk_logprob_bits[y]);
            if (la != la || lb != lb) continue;
            double pa = exp(la) / pa_sum, pb = exp(lb) / pb_sum;
            if (pa > 0 && pb > 0) kl += pa * log(pa / pb);
        }
    }
    if (kl > s->max_kl_topk) s->max_kl_topk = kl;
    if (dl > s->max_abs_dlogprob) s->max_abs_dlogprob = dl;
    if (s->dlogprob && pos < s->pos_end) {
        float *c = &s->dlogprob[pos / s->pos_per_col];
        if (dl > *c) *c = (float)dl;
    }
    if (set_eq) s->topk_set_equal++;
    int topk_differs = !set_eq || order_slot >= 0 || bits_slot >= 0;
    cell(w, s, n_layers + 2, pos, topk_differs ? LS_CELL_DIFFERS : LS_CELL_EQUAL);
    if (!found && topk_differs) {
        found = 1;
        int slot = !set_eq ? set_slot : order_slot >= 0 ? order_slot : bits_slot;
        d.what = !set_eq ? LS_DRIFT_TOPK_SET : order_slot >= 0 ? LS_DRIFT_TOPK_ORDER : LS_DRIFT_TOPK_LOGPROB;
        d.topk_slot = slot;
        d.a_value = d.what == LS_DRIFT_TOPK_LOGPROB ? (int64_t)a->topk_logprob_bits[slot] : (int64_t)a->topk_ids[slot];
        d.b_value = d.what == LS_DRIFT_TOPK_LOGPROB ? (int64_t)b->topk_logprob_bits[slot] : (int64_t)b->topk_ids[slot];
        if (d.what == LS_DRIFT_TOPK_SET) {
            d.topk_a_missing = a->topk_ids[slot] >= 0 && topk_find(b, k, a->topk_ids[slot]) < 0;
            d.topk_b_missing = b->topk_ids[slot] >= 0 && topk_find(a, k, b->topk_ids[slot]) < 0;
        }
    }
    if (found && s->pass) {
        set_first(w, s, si, &d);
        int row = d.what == LS_DRIFT_TOKEN ? 0 : d.what == LS_DRIFT_DIGEST ? -1
                  : (d.what == LS_DRIFT_NEXT_TOKEN || d.what == LS_DRIFT_LOGPROB) ? n_layers + 1 : n_layers + 2;
        if (row >= 0) cell(w, s, row, pos, LS_CELL_FIRST);
    }
    return w->stats ? position_stats(w, s, si, a, b, err) : LS_OK;
}

/* Appends one clause to the result's note ("; "-separated). */
static void note_add(ls_compare_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_add(ls_compare_result *r, const char *fmt, ...)
{
    size_t n = strlen(r->note);
    if (n + 3 >= sizeof r->note) return;
    if (n) {
        memcpy(r->note + n, "; ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->note + n, sizeof r->note - n, fmt, ap);
    va_end(ap);
}

/* A run parameter's value for a report: a string as itself, another value
 * as compact JSON, "none" when absent or null. */
static void param_text(const json_t *v, char *buf, size_t n)
{
    if (!v || json_is_null(v)) {
        snprintf(buf, n, "none");
    } else if (json_is_string(v)) {
        snprintf(buf, n, "%s", json_string_value(v));
    } else {
        char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
        snprintf(buf, n, "%s", t ? t : "?");
        free(t);
    }
}

/* Header facts that differ between the traces: informational (the verdict
 * stays bitwise), but they often explain a drift before it is read. */
static void note_header_differences(ls_compare_result *r, const ls_trace_header *ha, const ls_trace_header *hb)
{
    if (strcmp(r->a.activation_dtype, r->b.activation_dtype) != 0) {
        r->activation_differs = 1;
        note_add(r, "activation dtypes differ (A %s, B %s): hidden, conv_state and kv digests cannot be equal",
                 r->a.activation_dtype, r->b.activation_dtype);
    }
    if (strcmp(r->a.manifest_digest, r->b.manifest_digest) != 0) {
        r->manifest_differs = 1;
        note_add(r, "manifest digests differ (A %.16s%s, B %.16s%s)", r->a.manifest_digest[0] ? r->a.manifest_digest : "none",
                 r->a.manifest_digest[0] ? "..." : "", r->b.manifest_digest[0] ? r->b.manifest_digest : "none",
                 r->b.manifest_digest[0] ? "..." : "");
    }
    static const char *const keys[LS_COMPARE_PARAM_KEYS] = {"perturbation", "backend"};
    json_t *pa = ls_trace_run_params_parse(ha->run_params_json, NULL), *pb = ls_trace_run_params_parse(hb->run_params_json, NULL);
    for (int k = 0; pa && pb && k < LS_COMPARE_PARAM_KEYS; k++) {
        json_t *a = json_object_get(pa, keys[k]), *b = json_object_get(pb, keys[k]);
        if (a && json_is_null(a)) a = NULL; /* absent and null both mean "none" */
        if (b && json_is_null(b)) b = NULL;
        if ((!a && !b) || (a && b && json_equal(a, b))) continue;
        ls_compare_param_diff *d = &r->param_diffs[r->n_param_diffs++];
        snprintf(d->key, sizeof d->key, "%s", keys[k]);
        param_text(a, d->a, sizeof d->a);
        param_text(b, d->b, sizeof d->b);
    }
    json_decref(pa);
    json_decref(pb);
    if (r->n_param_diffs) {
        char buf[600];
        size_t n = 0;
        for (int i = 0; i < r->n_param_diffs && n < sizeof buf; i++)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s A %s, B %s", i ? "; " : "", r->param_diffs[i].key,
                                  r->param_diffs[i].a, r->param_diffs[i].b);
        note_add(r, "run parameters differ: %s", buf);
    }
}

static void fill_side(ls_compare_side *s, const char *path, const ls_trace_header *h)
{
    snprintf(s->path, sizeof s->path, "%s", path);
    snprintf(s->mode, sizeof s->mode, "%s", h->mode);
    snprintf(s->engine, sizeof s->engine, "%s", h->engine);
    snprintf(s->model_fingerprint, sizeof s->model_fingerprint, "%s", h->model_fingerprint);
    snprintf(s->manifest_digest, sizeof s->manifest_digest, "%s", h->manifest_digest);
    s->kinds_mask = h->digest_kinds_mask;
    s->topk = h->topk;
    snprintf(s->activation_dtype, sizeof s->activation_dtype, "%s", h->activation_dtype ? h->activation_dtype : "bf16");
}

static int cmp_seq(const void *x, const void *y)
{
    const ls_compare_seq *a = x, *b = y;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

ls_status ls_compare_files(const char *path_a, const char *path_b, const ls_compare_opts *opts,
                           ls_compare_result *r, ls_error *err)
{
    return ls_compare_files_diag(path_a, path_b, opts, NULL, r, err);
}

ls_status ls_compare_files_diag(const char *path_a, const char *path_b, const ls_compare_opts *opts,
                                const ls_compare_diag *diag, ls_compare_result *r, ls_error *err)
{
    int logprobs_only = diag && diag->logprobs_only;
    static const ls_compare_opts defaults = {0};
    if (!opts) opts = &defaults;
    memset(r, 0, sizeof *r);
    r->first_seq = -1;
    uint64_t t0 = ls_now_ns();
    ls_trace_reader *ra = NULL;
    walk w = {0};
    w.r = r;
    w.max_cols = opts->heatmap_max_cols > 0 ? opts->heatmap_max_cols : 256;
    ls_status st = ls_trace_reader_open(path_a, &ra, err);
    if (!st) st = ls_trace_index_open(path_b, &w.ix, err);
    if (st) goto out;
    const ls_trace_header *ha = ls_trace_reader_header(ra), *hb = ls_trace_index_header(w.ix);
    fill_side(&r->a, path_a, ha);
    fill_side(&r->b, path_b, hb);
    r->b.complete = ls_trace_index_complete(w.ix);
    r->b.records = ls_trace_index_records(w.ix);
    if (strcmp(ha->model_fingerprint, hb->model_fingerprint) != 0) {
        r->model_differs = 1;
        if (!opts->allow_different_model) {
            st = ls_fail(err, LS_E_INPUT,
                         "traces are of different models (A %.16s..., B %.16s...); allow_different_model compares them anyway",
                         ha->model_fingerprint, hb->model_fingerprint);
            goto out;
        }
    }
    if (!r->b.complete && !opts->allow_incomplete) {
        st = ls_fail(err, LS_E_INPUT, "%s: trace is incomplete (no trailer: the run stopped after %" PRIu64
                     " records); allow_incomplete compares the records present", path_b, r->b.records);
        goto out;
    }
    int same_layers = ha->n_layers == hb->n_layers;
    for (int i = 0; same_layers && i < ha->n_layers; i++)
        same_layers = ha->layers[i].family == hb->layers[i].family &&
                      ha->layers[i].decoder_layer == hb->layers[i].decoder_layer;
    r->kinds_compared = logprobs_only ? 0 : ha->digest_kinds_mask & hb->digest_kinds_mask;
    w.logprobs_only = logprobs_only;
    if (!same_layers) {
        if (r->kinds_compared) {
            st = ls_fail(err, LS_E_INPUT, "layer tables differ (A %d layers, B %d layers): digests cannot be aligned",
                         ha->n_layers, hb->n_layers);
            goto out;
        }
    }
    r->topk_compared = logprobs_only ? 0 : ha->topk < hb->topk ? ha->topk : hb->topk;
    r->n_layers = same_layers ? ha->n_layers : 0;
    w.rows = r->n_layers + 3;
    r->layers = calloc(r->n_layers ? r->n_layers : 1, sizeof *r->layers);
    r->router_differ_per_layer = calloc(r->n_layers ? r->n_layers : 1, sizeof *r->router_differ_per_layer);
    if (!r->layers || !r->router_differ_per_layer) {
        st = ls_fail_nomem(err, (r->n_layers ? r->n_layers : 1) * (sizeof *r->layers + sizeof *r->router_differ_per_layer),
                           "compare: tables of %zu layers", (size_t)r->n_layers);
        goto out;
    }
    if (r->n_layers) memcpy(r->layers, ha->layers, (size_t)r->n_layers * sizeof *r->layers);
    if (diag && diag->stats) {
        r->layer_stats = calloc(r->n_layers ? r->n_layers : 1, sizeof *r->layer_stats);
        if (!r->layer_stats) {
            st = ls_fail(err, LS_E_NOMEM, "out of memory");
            goto out;
        }
        if ((st = ls_stats_create(&w.stats, err))) goto out;
    }
    if ((st = read_prompt_lengths(&w, ha, err)) || (st = read_prompt_lengths(&w, hb, err))) goto out;
    if (logprobs_only)
        note_add(r, "logprobs only: compared token ids and selected-token logprob bits; digests and top-k "
                 "not compared");
    else if (!ha->digest_kinds_mask || !hb->digest_kinds_mask)
        note_add(r, "trace %s has no digests: compared tokens, logprobs and top-%d only",
                 !ha->digest_kinds_mask ? "A" : "B", r->topk_compared);
    else if (ha->digest_kinds_mask != hb->digest_kinds_mask)
        note_add(r, "digest kinds differ between the traces: compared only the kinds both carry");
    w.skip_token = !strcmp(ha->mode, "import") || !strcmp(hb->mode, "import");
    w.a_import = !strcmp(ha->mode, "import");
    w.b_import = !strcmp(hb->mode, "import");
    w.same_layout = ha->topk == hb->topk && ha->digest_kinds_mask == hb->digest_kinds_mask;
    w.ra = ra;
    ls_trace_reader_set_lazy(ra, 1);
    ls_trace_index_set_lazy(w.ix, 1);
    if (w.skip_token) note_add(r, "imported trace: input tokens not compared");
    if (ha->topk != hb->topk && !logprobs_only)
        note_add(r, "top-k widths differ (%d vs %d): compared the first %d", ha->topk, hb->topk, r->topk_compared);
    note_header_differences(r, ha, hb);
    /* heat maps for every sequence of B */
    for (size_t i = 0; i < ls_trace_index_n_seqs(w.ix); i++) {
        ls_compare_seq *s;
        size_t si;
        if ((st = seq_slot(&w, ls_trace_index_seq(w.ix, i), &s, &si, err))) goto out;
    }
    for (;;) {
        const ls_trace_record *a, *b;
        if ((st = ls_trace_reader_next(ra, &a, err))) goto out;
        if (!a) break;
        ls_compare_seq *s;
        size_t si;
        if ((st = seq_slot(&w, a->seq, &s, &si, err))) goto out;
        if (w.a_import && w.last_pos[si] < 0) {
            /* A's first position of an imported sequence: B's positions before it are outside the import */
            for (int64_t q = ls_trace_index_next_pos(w.ix, a->seq, 0); q >= 0 && q < (int64_t)a->pos;
                 q = ls_trace_index_next_pos(w.ix, a->seq, (uint32_t)q + 1))
                w.outside[si]++;
        } else if (s->pass) {
            /* a position of B skipped by A is a drift before this one */
            int64_t q = ls_trace_index_next_pos(w.ix, a->seq, (uint32_t)(w.last_pos[si] + 1));
            if (q >= 0 && q < (int64_t)a->pos) mark_missing(&w, s, si, (uint32_t)q, 0);
        }
        w.last_pos[si] = a->pos;
        if ((st = ls_trace_index_find(w.ix, a->seq, a->pos, &b, err))) goto out;
        if (!b) {
            s->positions_only_a++;
            int64_t b_first = w.b_import ? ls_trace_index_next_pos(w.ix, a->seq, 0) : -1;
            if (b_first > (int64_t)a->pos) w.outside_a++; /* before B's imported sequence */
            else if (s->pass) mark_missing(&w, s, si, a->pos, 1);
            continue;
        }
        if ((st = compare_pair(&w, s, si, a, b, err))) goto out;
    }
    r->a.complete = ls_trace_reader_complete(ra);
    r->a.records = ls_trace_reader_records(ra);
    r->a.frames = ls_trace_reader_frames(ra);
    r->bytes_compared = ls_trace_reader_bytes(ra);
    if (!r->a.complete && !opts->allow_incomplete) {
        st = ls_fail(err, LS_E_INPUT, "%s: trace is incomplete (no trailer: the run stopped after %" PRIu64
                     " records); allow_incomplete compares the records present", path_a, r->a.records);
        goto out;
    }
    if ((st = ls_trace_index_verify(w.ix, err))) goto out;
    r->equal = 1;
    for (size_t i = 0; i < r->n_seqs; i++) {
        ls_compare_seq *s = &r->seqs[i];
        uint64_t in_b = ls_trace_index_seq_positions(w.ix, s->seq);
        s->positions_only_b = in_b - s->positions_compared;
        if (s->positions_only_b > w.outside[i] && s->pass) {
            int64_t q = ls_trace_index_next_pos(w.ix, s->seq, (uint32_t)(w.last_pos[i] + 1));
            mark_missing(&w, s, i, q >= 0 ? (uint32_t)q : (uint32_t)(w.last_pos[i] + 1), 0);
        }
        if (!s->pass) r->equal = 0;
    }
    if (w.stats && (st = ls_stats_finish(w.stats, r, err))) goto out; /* before the sort: indexes are walk order */
    uint64_t best = 0;
    uint32_t first_seq_id = 0;
    for (size_t i = 0; i < r->n_seqs; i++)
        if (w.drift_order[i] && (!best || w.drift_order[i] < best)) {
            best = w.drift_order[i];
            first_seq_id = r->seqs[i].seq;
        }
    if (r->n_seqs) qsort(r->seqs, r->n_seqs, sizeof *r->seqs, cmp_seq); /* seqs is NULL when empty */
    for (size_t i = 0; best && i < r->n_seqs; i++)
        if (r->seqs[i].seq == first_seq_id) r->first_seq = (int)i;
    /* A trace whose engine returned no top-k (all slots unused) fails on
     * every position where the other has entries: say why, and what to ask. */
    if (w.topk_positions && (!w.topk_used_a) != (!w.topk_used_b))
        note_add(r, "trace %s holds no top-k entry at any position compared (its engine returned none): "
                 "the logprobs_only option compares token ids and logprobs alone", w.topk_used_a ? "B" : "A");
    /* Both traces may be imports (two engines): each side's earlier positions are outside the other. */
    uint64_t outside_b = 0;
    for (size_t i = 0; i < r->n_seqs; i++) outside_b += w.outside[i];
    r->positions_outside_import = outside_b + w.outside_a;
    for (int side = 0; side < 2; side++) {
        uint64_t n = side ? w.outside_a : outside_b;
        if (n)
            note_add(r, "trace %s is an import (the positions its engine scored): %" PRIu64 " positions of trace "
                     "%s before its sequences' first positions (prompt) not compared", side ? "B" : "A", n,
                     side ? "A" : "B");
    }
out:
    free(w.last_pos);
    free(w.drift_order);
    free(w.outside);
    ls_stats_free(w.stats);
    ls_u32map_free(&w.prompt_len);
    ls_u32map_free(&w.map);
    ls_trace_reader_close(ra);
    ls_trace_index_close(w.ix);
    r->elapsed_ns = ls_now_ns() - t0;
    return st;
}

void ls_compare_result_free(ls_compare_result *r)
{
    for (size_t i = 0; i < r->n_seqs; i++) {
        free(r->seqs[i].cells);
        free(r->seqs[i].dlogprob);
    }
    free(r->seqs);
    free(r->layers);
    free(r->router_differ_per_layer);
    free(r->layer_stats);
    memset(r, 0, sizeof *r);
}
