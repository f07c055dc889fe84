/* lockstep — rollout and replay over the operator table; see engine.h. */
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/backend_cuda.h"
#include "fingerprint/sha256.h"

static const char *const op_names[LS_PERTURB_COUNT] = {
    "none", "gdn", "conv", "attention", "router", "experts", "combine", "norm", "lm_head"};

const char *ls_perturb_op_name(ls_perturb_op op)
{
    return op < LS_PERTURB_COUNT ? op_names[op] : "?";
}

ls_status ls_perturb_parse(const char *spec, int *layer, ls_perturb_op *op, ls_error *err)
{
    char opname[32];
    int l, used = 0;
    if (sscanf(spec, "layer=%d,op=%31[a-z_]%n", &l, opname, &used) != 2 || spec[used] != '\0' ||
        l < 0)
        return ls_fail(err, LS_E_USAGE, "--perturb '%s': expected layer=L,op=OP", spec);
    for (int i = 1; i < LS_PERTURB_COUNT; i++)
        if (strcmp(opname, op_names[i]) == 0) {
            *layer = l;
            *op = (ls_perturb_op)i;
            return LS_OK;
        }
    return ls_fail(err, LS_E_USAGE, "--perturb: unknown op '%s' (gdn, conv, attention, router, "
                   "experts, combine, norm, lm_head)", opname);
}

void ls_engine_opts_default(ls_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->act_bf16 = 1;
    o->n_threads = 1;
    o->max_rows = 256;
    o->state_digest_every = 64;
    o->perturb_layer = -1;
    o->perturb_op = LS_PERTURB_NONE;
}

/* ---- state ----------------------------------------------------------------------- */

typedef struct layer_w {
    ls_buf *in_norm, *post_norm;          /* [D] */
    ls_bweight qkvz, ba, conv, out_proj;  /* gdn */
    ls_buf *A_log, *dt_bias, *gnorm;      /* [Hv], [Hv], [dv] */
    ls_bweight q, k, v, o;                /* attention */
    ls_buf *q_norm, *k_norm;              /* [d] */
    ls_bweight router;
    ls_bweight *experts;                  /* [3E]: gate, up, down */
    ls_bweight shg, shu, shd, shw;
    ls_bmoe moe;
} layer_w;

typedef struct seq_state {
    int active;                           /* joined */
    uint32_t id;                          /* sequence id */
    long prompt_len;                      /* 0 = unknown */
    long len;                             /* tokens processed */
    ls_buf **conv, **gdn;                 /* [L] (NULL for attention layers): [C, K], [Hv, dk, dv] */
    ls_buf **kc, **vc;                    /* [L] (NULL for gdn layers): [Hkv, cap, d] each */
} seq_state;

typedef struct seg {
    long slot;                            /* sequence slot */
    const int32_t *tokens;                /* [n] */
    long n;
    long row0;                            /* first packed row */
    long pos0;                            /* position of the first token */
    int last;                             /* the last token is the sequence's last position */
} seg;

#define N_KINDS LS_DIGEST_COUNT

struct ls_engine {
    const ls_model *m;
    ls_model_config c;
    ls_engine_opts o;
    ls_backend *be;
    long max_seqs, cap, T;                /* T = max rows per forward */
    long conv_dim, wqkvz;
    ls_bweight embed, lm_head;
    ls_buf *final_norm;
    layer_w *lw;                          /* [L] */
    seq_state *ss;                        /* [max_seqs] */
    /* work buffers, [T, ...] */
    ls_buf *tok, *pos, *cosb, *sinb, *H, *XN, *A, *P, *BA, *X, *Z, *Bv, *Av, *Y, *Q, *K, *V;
    ls_buf *beta, *alpha, *O, *QG, *G, *probs, *ids, *wts, *logits, *lp;
    /* host */
    int32_t *h_tok, *h_pos;               /* [T] */
    float *h_cos, *h_sin;                 /* [T, R/2] */
    float *h_lp;                          /* [T, V] */
    float *h_tmp;                         /* [max tensor] download scratch */
    unsigned char *h_bytes;               /* [4 * max tensor] canonical bytes */
    size_t tmp_elems;
    int n_tl;                             /* trace layers */
    ls_trace_layer *layers;               /* [n_tl] */
    int *slot_of;                         /* [n_tl * N_KINDS] digest slot or -1 */
    int n_slots;
    ls_trace_digest *dig;                 /* [T, n_slots] */
    unsigned char *have;                  /* [T, n_slots] */
    int32_t *sample_ids;                  /* [V] */
    ls_trace_record *recs;                /* [T] */
    ls_trace_digest *rec_dig;             /* [T, n_slots] compacted */
    /* digest queue: jobs wait until a buffer they read is about to change */
    ls_digest_job *jobs;                  /* [jobs_cap] */
    long n_jobs, jobs_cap;
    /* the last step */
    seg *sg;                              /* [T] segments */
    long step_rows;
    int32_t *row_seq;                     /* [T] sequence id of each row */
    /* dumps (--dump-layers) */
    int dumping;
    unsigned char *dump_data;             /* [T, n_slots, dump_bytes] canonical bytes */
    size_t dump_bytes;
    ls_trace_dump *dumps;                 /* [T, n_slots] */
    uint32_t *dump_elems;                 /* [T, n_slots] 0 = none */
    uint8_t *dump_dtype;                  /* [T, n_slots] */
    ls_trace_dump *rec_dumps;             /* [T, n_slots] compacted */
};

#define BEV(b) ((ls_view){(b), 0})
#define AT(b, off) ((ls_view){(b), (size_t)(off)})

static ls_order ord(const ls_engine *e, long layer, ls_perturb_op op)
{
    if (e->o.perturb_op != op) return LS_ORDER_CANONICAL;
    if (op == LS_PERTURB_LM_HEAD || e->o.perturb_layer == layer) return LS_ORDER_REVERSED;
    return LS_ORDER_CANONICAL;
}

static ls_status wrap(ls_engine *e, const ls_wmat *m, ls_bweight *out, ls_error *err)
{
    size_t bytes = (size_t)m->rows * (size_t)m->cols * (m->wtype == LS_WTYPE_BF16 ? 2 : 4);
    LS_TRY(e->be->wrap_weights(e->be, m->data, bytes, &out->buf, err));
    out->off_bytes = 0;
    out->wtype = m->wtype;
    out->rows = m->rows;
    out->cols = m->cols;
    return LS_OK;
}

/* Small parameters, rounded to bf16 in bf16 mode (the reference casts every
 * parameter to the model dtype, spec §2.4). */
static ls_status small(ls_engine *e, const float *v, long n, ls_buf **out, ls_error *err)
{
    LS_TRY(e->be->alloc(e->be, (size_t)n * 4, out, err));
    float *tmp = malloc((size_t)n * 4);
    if (!tmp) return ls_fail(err, LS_E_NOMEM, "engine: out of memory");
    for (long i = 0; i < n; i++) tmp[i] = ls_act(v[i], e->o.act_bf16);
    ls_status st = e->be->upload(e->be, BEV(*out), tmp, (size_t)n * 4, err);
    free(tmp);
    return st;
}

static ls_status buf(ls_engine *e, long elems, ls_buf **out, ls_error *err)
{
    return e->be->alloc(e->be, (size_t)(elems > 0 ? elems : 1) * 4, out, err);
}

void ls_engine_destroy(ls_engine *e)
{
    if (!e) return;
    if (e->be) e->be->destroy(e->be);
    if (e->lw)
        for (long l = 0; l < e->c.n_layers; l++) free(e->lw[l].experts);
    free(e->lw);
    if (e->ss)
        for (long s = 0; s < e->max_seqs; s++) {
            free(e->ss[s].conv);
            free(e->ss[s].gdn);
            free(e->ss[s].kc);
            free(e->ss[s].vc);
        }
    free(e->ss);
    free(e->h_tok), free(e->h_pos), free(e->h_cos), free(e->h_sin), free(e->h_lp);
    free(e->h_tmp), free(e->h_bytes), free(e->layers), free(e->slot_of), free(e->dig);
    free(e->have), free(e->sample_ids), free(e->recs), free(e->rec_dig);
    free(e->jobs), free(e->sg), free(e->row_seq), free(e->dump_data), free(e->dumps);
    free(e->dump_elems), free(e->dump_dtype), free(e->rec_dumps);
    free(e);
}

const ls_trace_layer *ls_engine_layers(const ls_engine *e, int *n)
{
    *n = e->n_tl;
    return e->layers;
}

static ls_status create_inner(ls_engine *e, ls_error *err)
{
    const ls_model_config *c = &e->c;
    const ls_model *m = e->m;
    long D = c->hidden, L = c->n_layers, V = c->vocab, T = e->T;
    long Hq = c->n_heads, Hkv = c->n_kv_heads, d = c->head_dim, R = c->rotary_dims;
    long Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    long K = c->conv_kernel, E = c->n_experts, k = c->topk;
    e->conv_dim = 2 * Hk * dk + Hv * dv;
    e->wqkvz = 2 * Hk * dk + 2 * Hv * dv;
    const char *bn = e->o.backend ? e->o.backend : "cpu";
    if (strcmp(bn, "cpu") == 0) {
        LS_TRY(ls_backend_cpu_create(e->o.n_threads, &e->be, err));
    } else if (strcmp(bn, "cuda") == 0) {
        ls_error inner;
        ls_error_clear(&inner);
        ls_status st = ls_backend_cuda_create(0, &e->be, &inner);
        if (st != LS_OK)
            return ls_fail(err, st == LS_E_NOMEM ? st : LS_E_UNSUPPORTED,
                           "--backend cuda is not available: %s", inner.msg);
        if (e->o.perturb_op != LS_PERTURB_NONE)
            return ls_fail(err, LS_E_UNSUPPORTED, "--perturb is implemented on the cpu backend "
                           "only (the cuda backend has no reversed-order kernels)");
    } else {
        return ls_fail(err, LS_E_USAGE, "--backend '%s': expected cpu or cuda", bn);
    }
    ls_backend *be = e->be;
    if (!be->digest)
        return ls_fail(err, LS_E_UNSUPPORTED, "backend %s has no digest op: lockstep records "
                       "every digest through it and will not run without it", be->name);
    LS_TRY(wrap(e, &m->embed, &e->embed, err));
    LS_TRY(wrap(e, &m->lm_head, &e->lm_head, err));
    LS_TRY(small(e, m->final_norm, D, &e->final_norm, err));
    e->lw = calloc((size_t)L, sizeof *e->lw);
    if (!e->lw) return ls_fail(err, LS_E_NOMEM, "engine: out of memory");
    for (long l = 0; l < L; l++) {
        const ls_model_layer *ml = &m->layers[l];
        layer_w *w = &e->lw[l];
        LS_TRY(small(e, ml->in_norm, D, &w->in_norm, err));
        LS_TRY(small(e, ml->post_norm, D, &w->post_norm, err));
        if (ml->attention) {
            LS_TRY(wrap(e, &ml->q_proj, &w->q, err));
            LS_TRY(wrap(e, &ml->k_proj, &w->k, err));
            LS_TRY(wrap(e, &ml->v_proj, &w->v, err));
            LS_TRY(wrap(e, &ml->o_proj, &w->o, err));
            LS_TRY(small(e, ml->q_norm, d, &w->q_norm, err));
            LS_TRY(small(e, ml->k_norm, d, &w->k_norm, err));
        } else {
            LS_TRY(wrap(e, &ml->qkvz, &w->qkvz, err));
            LS_TRY(wrap(e, &ml->ba, &w->ba, err));
            LS_TRY(wrap(e, &ml->conv, &w->conv, err));
            LS_TRY(wrap(e, &ml->out_proj, &w->out_proj, err));
            LS_TRY(small(e, ml->A_log, Hv, &w->A_log, err));
            LS_TRY(small(e, ml->dt_bias, Hv, &w->dt_bias, err));
            LS_TRY(small(e, ml->gnorm, dv, &w->gnorm, err));
        }
        LS_TRY(wrap(e, &ml->router, &w->router, err));
        w->experts = calloc((size_t)(3 * E), sizeof(ls_bweight));
        if (!w->experts) return ls_fail(err, LS_E_NOMEM, "engine: out of memory");
        for (long x = 0; x < E; x++) {
            LS_TRY(wrap(e, &ml->exp_gate[x], &w->experts[x], err));
            LS_TRY(wrap(e, &ml->exp_up[x], &w->experts[E + x], err));
            LS_TRY(wrap(e, &ml->exp_down[x], &w->experts[2 * E + x], err));
        }
        LS_TRY(wrap(e, &ml->sh_gate, &w->shg, err));
        LS_TRY(wrap(e, &ml->sh_up, &w->shu, err));
        LS_TRY(wrap(e, &ml->sh_down, &w->shd, err));
        LS_TRY(wrap(e, &ml->sh_gate_w, &w->shw, err));
        w->moe = (ls_bmoe){E, D, c->moe_inter, c->shared_inter, w->experts, w->experts + E,
                           w->experts + 2 * E, &w->shg, &w->shu, &w->shd, &w->shw};
    }
    e->ss = calloc((size_t)e->max_seqs, sizeof *e->ss);
    if (!e->ss) return ls_fail(err, LS_E_NOMEM, "engine: out of memory");
    for (long s = 0; s < e->max_seqs; s++) {
        seq_state *q = &e->ss[s];
        q->conv = calloc((size_t)L, sizeof(ls_buf *));
        q->gdn = calloc((size_t)L, sizeof(ls_buf *));
        q->kc = calloc((size_t)L, sizeof(ls_buf *));
        q->vc = calloc((size_t)L, sizeof(ls_buf *));
        if (!q->conv || !q->gdn || !q->kc || !q->vc)
            return ls_fail(err, LS_E_NOMEM, "engine: out of memory");
        for (long l = 0; l < L; l++) {
            if (c->is_attention[l]) {
                LS_TRY(buf(e, Hkv * e->cap * d, &q->kc[l], err));
                LS_TRY(buf(e, Hkv * e->cap * d, &q->vc[l], err));
            } else {
                LS_TRY(buf(e, e->conv_dim * K, &q->conv[l], err));
                LS_TRY(buf(e, Hv * dk * dv, &q->gdn[l], err));
            }
        }
    }
    long Wq = Hq * 2 * d;
    LS_TRY(buf(e, T, &e->tok, err));
    LS_TRY(buf(e, T, &e->pos, err));
    LS_TRY(buf(e, T * (R / 2), &e->cosb, err));
    LS_TRY(buf(e, T * (R / 2), &e->sinb, err));
    LS_TRY(buf(e, T * D, &e->H, err));
    LS_TRY(buf(e, T * D, &e->XN, err));
    LS_TRY(buf(e, T * D, &e->A, err));
    LS_TRY(buf(e, T * e->wqkvz, &e->P, err));
    LS_TRY(buf(e, T * 2 * Hv, &e->BA, err));
    LS_TRY(buf(e, T * e->conv_dim, &e->X, err));
    LS_TRY(buf(e, T * Hv * dv, &e->Z, err));
    LS_TRY(buf(e, T * Hv, &e->Bv, err));
    LS_TRY(buf(e, T * Hv, &e->Av, err));
    LS_TRY(buf(e, T * e->conv_dim, &e->Y, err));
    long qk = Hk * dk > Hq * d ? Hk * dk : Hq * d;
    long kv = Hk * dk > Hkv * d ? Hk * dk : Hkv * d;
    long vv = Hv * dv > Hkv * d ? Hv * dv : Hkv * d;
    LS_TRY(buf(e, T * qk, &e->Q, err));
    LS_TRY(buf(e, T * kv, &e->K, err));
    LS_TRY(buf(e, T * vv, &e->V, err));
    LS_TRY(buf(e, T * Hv, &e->beta, err));
    LS_TRY(buf(e, T * Hv, &e->alpha, err));
    LS_TRY(buf(e, T * (Hv * dv > Hq * d ? Hv * dv : Hq * d), &e->O, err));
    LS_TRY(buf(e, T * Wq, &e->QG, err));
    LS_TRY(buf(e, T * Hq * d, &e->G, err));
    LS_TRY(buf(e, T * E, &e->probs, err));
    LS_TRY(buf(e, T * k, &e->ids, err));
    LS_TRY(buf(e, T * k, &e->wts, err));
    LS_TRY(buf(e, T * V, &e->logits, err));
    LS_TRY(buf(e, T * V, &e->lp, err));

    /* Trace layers and digest slots. */
    e->n_tl = (int)(3 + 2 * L);
    e->layers = calloc((size_t)e->n_tl, sizeof *e->layers);
    e->slot_of = malloc(sizeof(int) * (size_t)e->n_tl * N_KINDS);
    if (!e->layers || !e->slot_of) return ls_fail(err, LS_E_NOMEM, "engine: out of memory");
    for (int i = 0; i < e->n_tl * N_KINDS; i++) e->slot_of[i] = -1;
    int ns = 0;
    for (int i = 0; i < e->n_tl; i++) {
        ls_trace_layer *tl = &e->layers[i];
        tl->index = i;
        tl->decoder_layer = -1;
        if (i == 0) tl->family = LS_FAMILY_EMBED;
        else if (i == e->n_tl - 2) tl->family = LS_FAMILY_NORM;
        else if (i == e->n_tl - 1) tl->family = LS_FAMILY_LM_HEAD;
        else {
            tl->decoder_layer = (i - 1) / 2;
            if ((i - 1) % 2 == 1) tl->family = LS_FAMILY_MOE;
            else tl->family = c->is_attention[tl->decoder_layer] ? LS_FAMILY_ATTENTION : LS_FAMILY_GDN;
        }
        e->slot_of[i * N_KINDS + LS_DIGEST_HIDDEN] = ns++;
        if (tl->family == LS_FAMILY_GDN) {
            e->slot_of[i * N_KINDS + LS_DIGEST_GDN_STATE] = ns++;
            e->slot_of[i * N_KINDS + LS_DIGEST_CONV_STATE] = ns++;
        } else if (tl->family == LS_FAMILY_ATTENTION) {
            e->slot_of[i * N_KINDS + LS_DIGEST_KV] = ns++;
        } else if (tl->family == LS_FAMILY_MOE) {
            e->slot_of[i * N_KINDS + LS_DIGEST_ROUTER] = ns++;
        }
    }
    e->n_slots = ns;
    size_t tmp = (size_t)(V > D ? V : D);
    size_t st = (size_t)(Hv * dk * dv), cv = (size_t)(e->conv_dim * K), kvr = (size_t)(2 * Hkv * d);
    if (st > tmp) tmp = st;
    if (cv > tmp) tmp = cv;
    if (kvr > tmp) tmp = kvr;
    if ((size_t)(2 * k) > tmp) tmp = (size_t)(2 * k);
    e->tmp_elems = tmp;
    e->h_tok = malloc(sizeof(int32_t) * (size_t)T);
    e->h_pos = malloc(sizeof(int32_t) * (size_t)T);
    e->h_cos = malloc(sizeof(float) * (size_t)(T * (R / 2) + 1));
    e->h_sin = malloc(sizeof(float) * (size_t)(T * (R / 2) + 1));
    e->h_lp = malloc(sizeof(float) * (size_t)(T * V));
    e->h_tmp = malloc(sizeof(float) * tmp);
    e->h_bytes = malloc(4 * tmp);
    e->dig = calloc((size_t)(T * ns), sizeof *e->dig);
    e->have = calloc((size_t)(T * ns), 1);
    e->sample_ids = malloc(sizeof(int32_t) * (size_t)V);
    e->recs = calloc((size_t)T, sizeof *e->recs);
    e->rec_dig = calloc((size_t)(T * ns), sizeof *e->rec_dig);
    e->jobs_cap = 4 * T + 16;
    e->jobs = calloc((size_t)e->jobs_cap, sizeof *e->jobs);
    e->sg = calloc((size_t)T, sizeof *e->sg);
    e->row_seq = calloc((size_t)T, sizeof *e->row_seq);
    if (!e->h_tok || !e->h_pos || !e->h_cos || !e->h_sin || !e->h_lp || !e->h_tmp ||
        !e->h_bytes || !e->dig || !e->have || !e->sample_ids || !e->recs || !e->rec_dig ||
        !e->jobs || !e->sg || !e->row_seq)
        return ls_fail(err, LS_E_NOMEM, "engine: out of memory");
    if (e->o.dump_decoder_layers) {
        for (long l = 0; l < L; l++) e->dumping |= e->o.dump_decoder_layers[l] != 0;
    }
    if (e->dumping) {
        e->dump_bytes = (4 * tmp + 3) & ~(size_t)3;
        size_t cells = (size_t)(T * ns);
        if (cells * e->dump_bytes > ((size_t)1 << 32))
            return ls_fail(err, LS_E_USAGE, "--dump-layers: %zu bytes of dump buffers for %ld rows; "
                           "lower --max-rows", cells * e->dump_bytes, T);
        e->dump_data = malloc(cells * e->dump_bytes);
        e->dumps = calloc(cells, sizeof *e->dumps);
        e->dump_elems = calloc(cells, sizeof *e->dump_elems);
        e->dump_dtype = calloc(cells, 1);
        e->rec_dumps = calloc(cells, sizeof *e->rec_dumps);
        if (!e->dump_data || !e->dumps || !e->dump_elems || !e->dump_dtype || !e->rec_dumps)
            return ls_fail(err, LS_E_NOMEM, "engine: out of memory for --dump-layers buffers");
    }
    return LS_OK;
}

ls_status ls_engine_create(const ls_model *m, const ls_engine_opts *o, long max_seqs,
                           long max_len, ls_engine **out, ls_error *err)
{
    if (max_seqs < 1 || max_len < 1)
        return ls_fail(err, LS_E_USAGE, "engine: need at least one sequence of one token");
    if (max_len > m->cfg.max_positions)
        return ls_fail(err, LS_E_UNSUPPORTED, "engine: sequences of %ld tokens exceed "
                       "max_position_embeddings (%ld)", max_len, m->cfg.max_positions);
    if (o->max_rows < 1 || o->state_digest_every < 1 || o->n_threads < 1)
        return ls_fail(err, LS_E_USAGE, "engine: max_rows, state_digest_every and threads must be >= 1");
    if (o->perturb_op != LS_PERTURB_NONE && o->perturb_op != LS_PERTURB_LM_HEAD) {
        long l = o->perturb_layer;
        if (l < 0 || l >= m->cfg.n_layers)
            return ls_fail(err, LS_E_USAGE, "--perturb: layer %ld is outside 0..%ld", l,
                           m->cfg.n_layers - 1);
        int att = m->cfg.is_attention[l];
        if ((o->perturb_op == LS_PERTURB_ATTENTION && !att) ||
            ((o->perturb_op == LS_PERTURB_GDN || o->perturb_op == LS_PERTURB_CONV) && att))
            return ls_fail(err, LS_E_USAGE, "--perturb: op %s does not exist in layer %ld (a %s "
                           "layer)", ls_perturb_op_name(o->perturb_op), l,
                           att ? "full attention" : "gated DeltaNet");
    }
    ls_engine *e = calloc(1, sizeof *e);
    if (!e) return ls_fail(err, LS_E_NOMEM, "engine: out of memory");
    e->m = m;
    e->c = m->cfg;
    e->o = *o;
    e->max_seqs = max_seqs;
    e->cap = max_len;
    e->T = o->max_rows;
    ls_status st = create_inner(e, err);
    if (st != LS_OK) {
        ls_engine_destroy(e);
        return st;
    }
    *out = e;
    return LS_OK;
}

/* ---- digests ------------------------------------------------------------------------
 * Every digest goes through the backend's digest op. Jobs are queued and run
 * in one call just before a buffer they read changes (before each residual
 * add, before a carried state advances past a digested position, at the end
 * of the forward), so one call covers a layer's rows. */

const char *ls_engine_backend(const ls_engine *e)
{
    return e->o.backend && strcmp(e->o.backend, "cuda") == 0 ? "cuda" : "cpu";
}

const char *ls_engine_trace_name(const ls_engine *e)
{
    return strcmp(ls_engine_backend(e), "cuda") == 0 ? "lockstep-cuda" : "lockstep-cpu";
}

static ls_digest_span span(ls_view v, long rows, long len, long stride, int bf16)
{
    ls_digest_span s = {v, rows, len, stride, bf16};
    return s;
}

static const ls_digest_span no_span = {{NULL, 0}, 0, 0, 0, 0};

static ls_status dq_flush(ls_engine *e, ls_error *err)
{
    long n = e->n_jobs;
    e->n_jobs = 0;
    return n > 0 ? e->be->digest(e->be, e->jobs, n, err) : LS_OK;
}

/* Canonical bytes of one span, downloaded, appended at out (dumps only). */
static ls_status span_bytes(ls_engine *e, const ls_digest_span *sp, unsigned char *out, size_t *len,
                            ls_error *err)
{
    for (long r = 0; r < sp->rows; r++) {
        LS_TRY(e->be->download(e->be, e->h_tmp, ls_view_at(sp->src, (size_t)(r * sp->stride)),
                               (size_t)sp->len * 4, err));
        for (long i = 0; i < sp->len; i++) {
            if (sp->bf16) {
                uint16_t h = ls_f32_to_bf16(e->h_tmp[i]);
                out[(*len)++] = (unsigned char)(h & 0xff);
                out[(*len)++] = (unsigned char)(h >> 8);
            } else {
                uint32_t u = ls_f32_bits(e->h_tmp[i]);
                for (int b = 0; b < 4; b++) out[(*len)++] = (unsigned char)(u >> (8 * b));
            }
        }
    }
    return LS_OK;
}

/* Queues the digest of (row, trace layer, kind) over spans a then b; copies the
 * canonical bytes into the row's dumps when the layer is dumped. */
static ls_status dq_push(ls_engine *e, long row, int tl, ls_digest_kind kind, ls_digest_span a,
                         ls_digest_span b, ls_error *err)
{
    if (e->n_jobs == e->jobs_cap) LS_TRY(dq_flush(e, err));
    int s = e->slot_of[tl * N_KINDS + kind];
    long cell = row * e->n_slots + s;
    e->have[cell] = 1;
    ls_trace_digest *d = &e->dig[cell];
    d->layer = (uint16_t)tl;
    d->kind = (uint8_t)kind;
    ls_digest_job *j = &e->jobs[e->n_jobs++];
    j->span[0] = a;
    j->span[1] = b;
    j->out = &d->digest;
    int dl = e->layers[tl].decoder_layer;
    if (e->dumping && dl >= 0 && e->o.dump_decoder_layers[dl]) {
        unsigned char *out = e->dump_data + (size_t)cell * e->dump_bytes;
        size_t len = 0;
        LS_TRY(span_bytes(e, &a, out, &len, err));
        LS_TRY(span_bytes(e, &b, out, &len, err));
        long elems = a.rows * a.len + b.rows * b.len;
        e->dump_elems[cell] = (uint32_t)elems;
        e->dump_dtype[cell] = kind == LS_DIGEST_ROUTER ? LS_DUMP_ROUTER
                              : a.bf16 ? LS_DUMP_BF16 : LS_DUMP_FP32;
    }
    return LS_OK;
}

/* HIDDEN digests of T rows of width `width` (act dtype, or fp32 when f32). */
static ls_status dq_rows(ls_engine *e, ls_buf *b, long width, long T, int tl, int f32, ls_error *err)
{
    int bf = f32 ? 0 : e->o.act_bf16;
    for (long r = 0; r < T; r++)
        LS_TRY(dq_push(e, r, tl, LS_DIGEST_HIDDEN, span(AT(b, r * width), 1, width, width, bf),
                       no_span, err));
    return LS_OK;
}

/* ---- forward ------------------------------------------------------------------------- */

/* Carried-state digests: p % N == N - 1, the last prompt position, and the
 * sequence's last position (docs/trace-format.md §3). */
static int state_due(const ls_engine *e, const seg *sg, long j)
{
    long p = sg->pos0 + j, N = e->o.state_digest_every;
    long prompt = e->ss[sg->slot].prompt_len;
    return p % N == N - 1 || (prompt > 0 && p == prompt - 1) || (sg->last && j == sg->n - 1);
}

/* 1 when no sequence's rows need a carried-state digest before its last row:
 * each sequence then runs its mixer in one call, and the backend's batched
 * mixer ops can run all sequences in one launch with the same bits. */
static int single_runs(const ls_engine *e, const seg *sg, long nseg)
{
    for (long s = 0; s < nseg; s++)
        for (long j = 0; j < sg[s].n - 1; j++)
            if (state_due(e, &sg[s], j)) return 0;
    return 1;
}

/* Per-sequence row spans and state buffers for the batched mixer ops. */
typedef struct batch_args {
    long *row0, *len, *pos0;
    ls_buf **st, **st2;
} batch_args;

static void batch_free(batch_args *b)
{
    free(b->row0);
    free(b->len);
    free(b->pos0);
    free(b->st);
    free(b->st2);
}

static ls_status batch_init(const seg *sg, long nseg, batch_args *b, ls_error *err)
{
    size_t n = (size_t)(nseg > 0 ? nseg : 1);
    b->row0 = malloc(n * sizeof(long));
    b->len = malloc(n * sizeof(long));
    b->pos0 = malloc(n * sizeof(long));
    b->st = malloc(n * sizeof(ls_buf *));
    b->st2 = malloc(n * sizeof(ls_buf *));
    if (!b->row0 || !b->len || !b->pos0 || !b->st || !b->st2) {
        batch_free(b);
        return ls_fail(err, LS_E_NOMEM, "engine: batch tables for %ld sequences", nseg);
    }
    for (long s = 0; s < nseg; s++) {
        b->row0[s] = sg[s].row0;
        b->len[s] = sg[s].n;
        b->pos0[s] = sg[s].pos0;
    }
    return LS_OK;
}

/* Trace layer of decoder layer l's mixer (its MoE is the next one). */
static int mixer_tl(long l)
{
    return (int)(1 + 2 * l);
}

/* Carried-state op of layer l on rows row .. row+n-1 of the packed batch. */
typedef ls_status (*state_op)(ls_engine *e, long l, long row, long n, ls_buf *state,
                              ls_error *err);

static ls_status conv_op(ls_engine *e, long l, long row, long n, ls_buf *cs, ls_error *err)
{
    long C = e->conv_dim;
    return e->be->conv_silu(e->be, AT(e->X, row * C), C, &e->lw[l].conv, BEV(cs),
                            AT(e->Y, row * C), C, n, C, e->c.conv_kernel, e->o.act_bf16,
                            ord(e, l, LS_PERTURB_CONV), err);
}

static ls_status gdn_op(ls_engine *e, long l, long row, long n, ls_buf *gs, ls_error *err)
{
    const ls_model_config *c = &e->c;
    long Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    return e->be->gdn_recurrent(e->be, AT(e->Q, row * Hk * dk), AT(e->K, row * Hk * dk),
                                AT(e->V, row * Hv * dv), AT(e->alpha, row * Hv),
                                AT(e->beta, row * Hv), BEV(gs), AT(e->O, row * Hv * dv), n, Hk,
                                Hv, dk, dv, e->o.act_bf16, ord(e, l, LS_PERTURB_GDN), err);
}

/* The digested part of a carried state: conv, [conv_dim, W-1] = columns
 * 1..W-1 of the [C, W] state in the activation dtype; GDN, the fp32 state. */
static ls_digest_span state_span(const ls_engine *e, ls_digest_kind kind, ls_buf *st)
{
    const ls_model_config *c = &e->c;
    long K = c->conv_kernel, SN = c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
    if (kind == LS_DIGEST_CONV_STATE)
        return span(AT(st, 1), e->conv_dim, K - 1, K, e->o.act_bf16);
    return span(BEV(st), 1, SN, SN, 0);
}

/* After a batched op ran every sequence in one call (single_runs): the state
 * digest of each sequence whose last row is due. */
static ls_status last_state_digests(ls_engine *e, long l, const seg *sg, long nseg,
                                   ls_buf *const *st, ls_digest_kind kind, ls_error *err)
{
    for (long s = 0; s < nseg; s++)
        if (state_due(e, &sg[s], sg[s].n - 1))
            LS_TRY(dq_push(e, sg[s].row0 + sg[s].n - 1, mixer_tl(l), kind,
                           state_span(e, kind, st[s]), no_span, err));
    return LS_OK;
}

/* Sequence q through a carried-state op in runs that end where a state
 * digest is due; the digest is queued after its run and flushed before the
 * next run advances the state. */
static ls_status state_runs(ls_engine *e, long l, const seg *q, ls_buf *st, ls_digest_kind kind,
                            state_op op, ls_error *err)
{
    int pending = 0;
    for (long i = 0; i < q->n;) {
        long j = i;
        while (j < q->n - 1 && !state_due(e, q, j)) j++;
        if (pending) LS_TRY(dq_flush(e, err));
        LS_TRY(op(e, l, q->row0 + i, j - i + 1, st, err));
        pending = state_due(e, q, j);
        if (pending)
            LS_TRY(dq_push(e, q->row0 + j, mixer_tl(l), kind, state_span(e, kind, st),
                           no_span, err));
        i = j + 1;
    }
    return LS_OK;
}

static ls_status gdn_layer(ls_engine *e, long l, const seg *sg, long nseg, long T, ls_error *err)
{
    ls_backend *be = e->be;
    const ls_model_config *c = &e->c;
    layer_w *w = &e->lw[l];
    int act = e->o.act_bf16;
    long Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    long K = c->conv_kernel, C = e->conv_dim, Wp = e->wqkvz, r = Hv / Hk;
    LS_TRY(be->linear(be, &w->qkvz, BEV(e->XN), BEV(e->P), T, act, LS_ORDER_CANONICAL, err));
    LS_TRY(be->linear(be, &w->ba, BEV(e->XN), BEV(e->BA), T, act, LS_ORDER_CANONICAL, err));
    /* De-interleave per key-head group (spec §2.3): group g of a row holds
     * q, k (dk each), v, z (r dv each), and of the ba row b, a (r each). */
    long gw = 2 * dk + 2 * r * dv;
    const struct {
        ls_view dst, src;
        ls_copy_shape sh;
    } split[6] = {
        {AT(e->X, 0), AT(e->P, 0), {T, Hk, dk, C, dk, Wp, gw}},
        {AT(e->X, Hk * dk), AT(e->P, dk), {T, Hk, dk, C, dk, Wp, gw}},
        {AT(e->X, 2 * Hk * dk), AT(e->P, 2 * dk), {T, Hk, r * dv, C, r * dv, Wp, gw}},
        {AT(e->Z, 0), AT(e->P, 2 * dk + r * dv), {T, Hk, r * dv, Hv * dv, r * dv, Wp, gw}},
        {AT(e->Bv, 0), AT(e->BA, 0), {T, Hk, r, Hv, r, 2 * Hv, 2 * r}},
        {AT(e->Av, 0), AT(e->BA, r), {T, Hk, r, Hv, r, 2 * Hv, 2 * r}},
    };
    for (int i = 0; i < 6; i++)
        LS_TRY(be->copy_blocks(be, split[i].dst, split[i].src, &split[i].sh, err));
    ls_order oc = ord(e, l, LS_PERTURB_CONV), og = ord(e, l, LS_PERTURB_GDN);
    int batched = be->conv_silu_batch && be->gdn_recurrent_batch && nseg > 1 &&
                  single_runs(e, sg, nseg);
    batch_args ba = {0};
    if (batched) {
        LS_TRY(batch_init(sg, nseg, &ba, err));
        for (long s = 0; s < nseg; s++) ba.st[s] = e->ss[sg[s].slot].conv[l];
        ls_status st = be->conv_silu_batch(be, BEV(e->X), C, &w->conv, ba.st, ba.row0, ba.len, nseg,
                                           BEV(e->Y), C, C, K, act, oc, err);
        if (st == LS_OK) st = last_state_digests(e, l, sg, nseg, ba.st, LS_DIGEST_CONV_STATE, err);
        if (st != LS_OK) {
            batch_free(&ba);
            return st;
        }
    }
    for (long s = 0; s < nseg && !batched; s++)
        LS_TRY(state_runs(e, l, &sg[s], e->ss[sg[s].slot].conv[l], LS_DIGEST_CONV_STATE, conv_op,
                          err));
    LS_TRY(ls_copy_rows(be, BEV(e->Q), Hk * dk, AT(e->Y, 0), C, T, Hk * dk, err));
    LS_TRY(ls_copy_rows(be, BEV(e->K), Hk * dk, AT(e->Y, Hk * dk), C, T, Hk * dk, err));
    LS_TRY(ls_copy_rows(be, BEV(e->V), Hv * dv, AT(e->Y, 2 * Hk * dk), C, T, Hv * dv, err));
    LS_TRY(be->l2norm_scale(be, BEV(e->Q), T * Hk, dk, ls_cpu_inv_sqrt_scale(dk), og, err));
    LS_TRY(be->l2norm_scale(be, BEV(e->K), T * Hk, dk, 1.0f, og, err));
    LS_TRY(be->gdn_gates(be, BEV(e->Bv), BEV(e->Av), BEV(w->A_log), BEV(w->dt_bias), BEV(e->beta),
                         BEV(e->alpha), T, Hv, act, err));
    if (batched) {
        for (long s = 0; s < nseg; s++) ba.st[s] = e->ss[sg[s].slot].gdn[l];
        ls_status st = be->gdn_recurrent_batch(be, BEV(e->Q), BEV(e->K), BEV(e->V), BEV(e->alpha),
                                               BEV(e->beta), ba.st, ba.row0, ba.len, nseg, BEV(e->O),
                                               Hk, Hv, dk, dv, act, og, err);
        if (st == LS_OK) st = last_state_digests(e, l, sg, nseg, ba.st, LS_DIGEST_GDN_STATE, err);
        batch_free(&ba);
        LS_TRY(st);
    }
    for (long s = 0; s < nseg && !batched; s++)
        LS_TRY(state_runs(e, l, &sg[s], e->ss[sg[s].slot].gdn[l], LS_DIGEST_GDN_STATE, gdn_op, err));
    LS_TRY(be->gated_rmsnorm(be, BEV(e->O), BEV(e->Z), BEV(w->gnorm), BEV(e->O), T * Hv, dv, act,
                             LS_ORDER_CANONICAL, err));
    return be->linear(be, &w->out_proj, BEV(e->O), BEV(e->A), T, act, LS_ORDER_CANONICAL, err);
}

static ls_status attn_layer(ls_engine *e, long l, const seg *sg, long nseg, long T, ls_error *err)
{
    ls_backend *be = e->be;
    const ls_model_config *c = &e->c;
    layer_w *w = &e->lw[l];
    int act = e->o.act_bf16;
    long Hq = c->n_heads, Hkv = c->n_kv_heads, d = c->head_dim;
    int tl = mixer_tl(l);
    LS_TRY(be->linear(be, &w->q, BEV(e->XN), BEV(e->QG), T, act, LS_ORDER_CANONICAL, err));
    LS_TRY(be->linear(be, &w->k, BEV(e->XN), BEV(e->K), T, act, LS_ORDER_CANONICAL, err));
    LS_TRY(be->linear(be, &w->v, BEV(e->XN), BEV(e->V), T, act, LS_ORDER_CANONICAL, err));
    /* Per head: d query values, then d gate values (spec §3.3 step 1). */
    ls_copy_shape heads = {T, Hq, d, Hq * d, d, Hq * 2 * d, 2 * d};
    LS_TRY(be->copy_blocks(be, BEV(e->Q), AT(e->QG, 0), &heads, err));
    LS_TRY(be->copy_blocks(be, BEV(e->G), AT(e->QG, d), &heads, err));
    ls_order on = LS_ORDER_CANONICAL;
    LS_TRY(be->rmsnorm(be, BEV(e->Q), BEV(w->q_norm), BEV(e->Q), T * Hq, d, act, on, err));
    LS_TRY(be->rmsnorm(be, BEV(e->K), BEV(w->k_norm), BEV(e->K), T * Hkv, d, act, on, err));
    LS_TRY(be->rope_apply(be, BEV(e->Q), BEV(e->cosb), BEV(e->sinb), T, Hq, d, c->rotary_dims, act, err));
    LS_TRY(be->rope_apply(be, BEV(e->K), BEV(e->cosb), BEV(e->sinb), T, Hkv, d, c->rotary_dims, act, err));
    ls_order oa = ord(e, l, LS_PERTURB_ATTENTION);
    int batched = be->kv_append_batch && be->attention_batch && nseg > 1;
    if (batched) {
        batch_args ba = {0};
        LS_TRY(batch_init(sg, nseg, &ba, err));
        for (long s = 0; s < nseg; s++) {
            ba.st[s] = e->ss[sg[s].slot].kc[l];
            ba.st2[s] = e->ss[sg[s].slot].vc[l];
        }
        ls_status st = be->kv_append_batch(be, BEV(e->K), BEV(e->V), ba.st, ba.st2, e->cap, ba.row0,
                                           ba.len, ba.pos0, nseg, Hkv, d, err);
        if (st == LS_OK)
            st = be->attention_batch(be, BEV(e->Q), ba.st, ba.st2, e->cap, ba.row0, ba.len, nseg,
                                     BEV(e->pos), BEV(e->O), Hq, Hkv, d, act, oa, err);
        batch_free(&ba);
        LS_TRY(st);
    }
    for (long s = 0; s < nseg && !batched; s++) {
        seq_state *q = &e->ss[sg[s].slot];
        long r0 = sg[s].row0, n = sg[s].n;
        /* rows [n, Hkv, d] to positions pos0.. of the [Hkv, cap, d] caches */
        ls_copy_shape kv = {n, Hkv, d, d, e->cap * d, Hkv * d, d};
        size_t at = (size_t)(sg[s].pos0 * d);
        LS_TRY(be->copy_blocks(be, AT(q->kc[l], at), AT(e->K, r0 * Hkv * d), &kv, err));
        LS_TRY(be->copy_blocks(be, AT(q->vc[l], at), AT(e->V, r0 * Hkv * d), &kv, err));
        LS_TRY(be->attention(be, AT(e->Q, r0 * Hq * d), BEV(q->kc[l]), BEV(q->vc[l]), e->cap,
                             AT(e->pos, r0), AT(e->O, r0 * Hq * d), n, Hq, Hkv, d, act, oa, err));
    }
    /* KV digests: the K row then the V row written at each position. */
    long W = Hkv * d;
    for (long r = 0; r < T; r++)
        LS_TRY(dq_push(e, r, tl, LS_DIGEST_KV, span(AT(e->K, r * W), 1, W, W, act),
                       span(AT(e->V, r * W), 1, W, W, act), err));
    LS_TRY(be->sigmoid_gate(be, BEV(e->O), BEV(e->G), T * Hq * d, act, err));
    return be->linear(be, &w->o, BEV(e->O), BEV(e->A), T, act, LS_ORDER_CANONICAL, err);
}

static ls_status forward(ls_engine *e, const seg *sg, long nseg, ls_error *err)
{
    ls_backend *be = e->be;
    const ls_model_config *c = &e->c;
    int act = e->o.act_bf16;
    long D = c->hidden, V = c->vocab, k = c->topk, L = c->n_layers, T = 0;
    for (long s = 0; s < nseg; s++) {
        seq_state *q = &e->ss[sg[s].slot];
        if (sg[s].pos0 != q->len || q->len + sg[s].n > e->cap)
            return ls_fail(err, LS_E_USAGE, "engine: sequence %u needs positions up to %ld "
                           "(capacity %ld)", q->id, q->len + sg[s].n, e->cap);
        for (long i = 0; i < sg[s].n; i++) {
            e->h_tok[T] = sg[s].tokens[i];
            e->h_pos[T] = (int32_t)(sg[s].pos0 + i);
            e->row_seq[T] = (int32_t)q->id;
            if (sg[s].tokens[i] < 0 || sg[s].tokens[i] >= V)
                return ls_fail(err, LS_E_INPUT, "sequence %u: token id %d at position %ld is outside "
                               "the vocabulary (0..%ld)", q->id, sg[s].tokens[i], sg[s].pos0 + i, V - 1);
            T++;
        }
    }
    e->step_rows = 0;
    e->n_jobs = 0;
    memset(e->have, 0, (size_t)(T * e->n_slots));
    if (e->dumping) memset(e->dump_elems, 0, sizeof(uint32_t) * (size_t)(T * e->n_slots));
    long half = c->rotary_dims / 2;
    ls_cpu_rope_table(e->h_pos, T, c->rotary_dims, c->rope_theta, e->h_cos, e->h_sin, act);
    LS_TRY(be->upload(be, BEV(e->tok), e->h_tok, (size_t)T * 4, err));
    LS_TRY(be->upload(be, BEV(e->pos), e->h_pos, (size_t)T * 4, err));
    LS_TRY(be->upload(be, BEV(e->cosb), e->h_cos, (size_t)(T * half) * 4, err));
    LS_TRY(be->upload(be, BEV(e->sinb), e->h_sin, (size_t)(T * half) * 4, err));
    LS_TRY(be->embed(be, &e->embed, BEV(e->tok), T, BEV(e->H), act, err));
    LS_TRY(dq_rows(e, e->H, D, T, 0, 0, err));
    for (long l = 0; l < L; l++) {
        layer_w *w = &e->lw[l];
        ls_order on = ord(e, l, LS_PERTURB_NORM);
        LS_TRY(be->rmsnorm(be, BEV(e->H), BEV(w->in_norm), BEV(e->XN), T, D, act, on, err));
        if (c->is_attention[l]) LS_TRY(attn_layer(e, l, sg, nseg, T, err));
        else LS_TRY(gdn_layer(e, l, sg, nseg, T, err));
        LS_TRY(dq_flush(e, err)); /* H changes next: previous hidden rows, states, KV */
        LS_TRY(be->residual(be, BEV(e->H), BEV(e->A), T * D, act, err));
        LS_TRY(dq_rows(e, e->H, D, T, mixer_tl(l), 0, err));
        LS_TRY(be->rmsnorm(be, BEV(e->H), BEV(w->post_norm), BEV(e->XN), T, D, act, on, err));
        LS_TRY(be->router(be, &w->router, BEV(e->XN), T, k, c->norm_topk_prob, BEV(e->probs),
                          BEV(e->ids), BEV(e->wts), act, ord(e, l, LS_PERTURB_ROUTER), err));
        LS_TRY(be->moe(be, &w->moe, BEV(e->XN), BEV(e->ids), BEV(e->wts), k, BEV(e->A), T, act,
                       ord(e, l, LS_PERTURB_EXPERTS), ord(e, l, LS_PERTURB_COMBINE), err));
        int tl = mixer_tl(l) + 1;
        /* ids are int32 and weights fp32, both hashed as raw 4 bytes little-endian. */
        for (long r = 0; r < T; r++)
            LS_TRY(dq_push(e, r, tl, LS_DIGEST_ROUTER, span(AT(e->ids, r * k), 1, k, k, 0),
                           span(AT(e->wts, r * k), 1, k, k, 0), err));
        LS_TRY(dq_flush(e, err)); /* H changes next: mixer hidden rows, router */
        LS_TRY(be->residual(be, BEV(e->H), BEV(e->A), T * D, act, err));
        LS_TRY(dq_rows(e, e->H, D, T, tl, 0, err));
    }
    LS_TRY(be->rmsnorm(be, BEV(e->H), BEV(e->final_norm), BEV(e->XN), T, D, act,
                       ord(e, L, LS_PERTURB_NORM), err));
    LS_TRY(dq_rows(e, e->XN, D, T, e->n_tl - 2, 0, err));
    LS_TRY(be->linear(be, &e->lm_head, BEV(e->XN), BEV(e->logits), T, act,
                      ord(e, -1, LS_PERTURB_LM_HEAD), err));
    LS_TRY(dq_rows(e, e->logits, V, T, e->n_tl - 1, 1, err));
    LS_TRY(dq_flush(e, err));
    LS_TRY(be->logprobs(be, BEV(e->logits), BEV(e->lp), T, V, LS_ORDER_CANONICAL, err));
    LS_TRY(be->download(be, e->h_lp, BEV(e->lp), (size_t)(T * V) * 4, err));
    for (long s = 0; s < nseg; s++) e->ss[sg[s].slot].len += sg[s].n;
    e->step_rows = T;
    return LS_OK;
}

/* ---- step API ------------------------------------------------------------------------ */

ls_status ls_engine_join(ls_engine *e, long slot, uint32_t seq_id, long prompt_len, ls_error *err)
{
    if (slot < 0 || slot >= e->max_seqs)
        return ls_fail(err, LS_E_USAGE, "engine: slot %ld is outside 0..%ld", slot, e->max_seqs - 1);
    if (e->ss[slot].active)
        return ls_fail(err, LS_E_USAGE, "engine: slot %ld is taken by sequence %u", slot,
                       e->ss[slot].id);
    seq_state *q = &e->ss[slot];
    const ls_model_config *c = &e->c;
    for (long l = 0; l < c->n_layers; l++) {
        if (c->is_attention[l]) {
            size_t n = (size_t)(c->n_kv_heads * e->cap * c->head_dim);
            LS_TRY(e->be->zero(e->be, BEV(q->kc[l]), n, err));
            LS_TRY(e->be->zero(e->be, BEV(q->vc[l]), n, err));
        } else {
            LS_TRY(e->be->zero(e->be, BEV(q->conv[l]), (size_t)(e->conv_dim * c->conv_kernel), err));
            LS_TRY(e->be->zero(e->be, BEV(q->gdn[l]),
                               (size_t)(c->lin_v_heads * c->lin_k_dim * c->lin_v_dim), err));
        }
    }
    q->len = 0;
    q->id = seq_id;
    q->prompt_len = prompt_len > 0 ? prompt_len : 0;
    q->active = 1;
    return LS_OK;
}

void ls_engine_leave(ls_engine *e, long slot)
{
    if (slot >= 0 && slot < e->max_seqs) e->ss[slot].active = 0;
}

long ls_engine_slot_len(const ls_engine *e, long slot)
{
    return slot >= 0 && slot < e->max_seqs ? e->ss[slot].len : -1;
}

ls_status ls_engine_step(ls_engine *e, const ls_engine_item *items, long n_items, ls_error *err)
{
    e->step_rows = 0;
    if (n_items < 1 || n_items > e->T)
        return ls_fail(err, LS_E_USAGE, "engine step: %ld items (1..%ld)", n_items, e->T);
    long rows = 0;
    for (long i = 0; i < n_items; i++) {
        const ls_engine_item *it = &items[i];
        if (it->slot < 0 || it->slot >= e->max_seqs || !e->ss[it->slot].active)
            return ls_fail(err, LS_E_USAGE, "engine step: item %ld names slot %ld, which holds no "
                           "sequence", i, it->slot);
        if (it->n < 1 || !it->tokens)
            return ls_fail(err, LS_E_USAGE, "engine step: item %ld has no tokens", i);
        for (long j = 0; j < i; j++)
            if (items[j].slot == it->slot)
                return ls_fail(err, LS_E_USAGE, "engine step: slot %ld appears twice", it->slot);
        if (it->n > e->T - rows)
            return ls_fail(err, LS_E_USAGE, "engine step: more than %ld tokens (--max-rows)", e->T);
        e->sg[i] = (seg){it->slot, it->tokens, it->n, rows, e->ss[it->slot].len, it->last != 0};
        rows += it->n;
    }
    return forward(e, e->sg, n_items, err);
}

long ls_engine_step_rows(const ls_engine *e)
{
    return e->step_rows;
}

const float *ls_engine_logprobs(const ls_engine *e, long row)
{
    return row >= 0 && row < e->step_rows ? e->h_lp + row * e->c.vocab : NULL;
}

const ls_trace_record *ls_engine_record(ls_engine *e, long r, int32_t next)
{
    if (r < 0 || r >= e->step_rows) return NULL;
    ls_trace_record *rec = &e->recs[r];
    long V = e->c.vocab;
    const float *lp = e->h_lp + r * V;
    memset(rec, 0, sizeof *rec);
    rec->seq = (uint32_t)e->row_seq[r];
    rec->pos = (uint32_t)e->h_pos[r];
    rec->token = e->h_tok[r];
    rec->next_token = next;
    rec->logprob_bits = next >= 0 && next < V ? ls_f32_bits(lp[next]) : 0x7fc00000u;
    long kk = V < 5 ? V : 5;
    float vals[5];
    for (int i = 0; i < LS_TRACE_TOPK_MAX; i++) {
        rec->topk_ids[i] = -1;
        rec->topk_logprob_bits[i] = 0x7fc00000u;
    }
    ls_cpu_topk(lp, V, kk, rec->topk_ids, vals);
    for (long i = 0; i < kk; i++) rec->topk_logprob_bits[i] = ls_f32_bits(vals[i]);
    long base = r * e->n_slots;
    ls_trace_digest *out = e->rec_dig + base;
    uint32_t n = 0, nd = 0;
    for (int s = 0; s < e->n_slots; s++)
        if (e->have[base + s]) out[n++] = e->dig[base + s];
    rec->n_digests = n;
    rec->digests = out;
    if (e->dumping) {
        ls_trace_dump *du = e->rec_dumps + base;
        for (int s = 0; s < e->n_slots; s++)
            if (e->have[base + s] && e->dump_elems[base + s]) {
                du[nd].layer = e->dig[base + s].layer;
                du[nd].kind = e->dig[base + s].kind;
                du[nd].dtype = e->dump_dtype[base + s];
                du[nd].n_elems = e->dump_elems[base + s];
                du[nd].data = e->dump_data + (size_t)(base + s) * e->dump_bytes;
                nd++;
            }
        rec->n_dumps = nd;
        rec->dumps = du;
    }
    return rec;
}

/* ---- rollout ---------------------------------------------------------------------------- */

ls_status ls_engine_rollout(ls_engine *e, const ls_sequence *seqs, long n_seqs, long max_new,
                            const ls_sampling *sampling, int32_t *completion,
                            ls_engine_sink sink, void *ctx, ls_error *err)
{
    if (n_seqs < 1 || n_seqs > e->max_seqs)
        return ls_fail(err, LS_E_USAGE, "rollout: %ld sequences (engine holds %ld)", n_seqs, e->max_seqs);
    if (max_new < 1) return ls_fail(err, LS_E_USAGE, "rollout: --max-new-tokens must be >= 1");
    for (long i = 0; i < n_seqs; i++) {
        if (seqs[i].n_tokens < 1)
            return ls_fail(err, LS_E_INPUT, "rollout: sequence %u has an empty prompt", seqs[i].id);
        if (seqs[i].n_tokens + max_new - 1 > e->cap)
            return ls_fail(err, LS_E_USAGE, "rollout: sequence %u needs %ld positions (capacity %ld)",
                           seqs[i].id, seqs[i].n_tokens + max_new - 1, e->cap);
    }
    for (long i = 0; i < e->max_seqs; i++) ls_engine_leave(e, i);
    for (long i = 0; i < n_seqs; i++) LS_TRY(ls_engine_join(e, i, seqs[i].id, seqs[i].n_tokens, err));
    int32_t *gen = calloc((size_t)(n_seqs * max_new), sizeof(int32_t)); /* [n_seqs, max_new] */
    long *done = calloc((size_t)n_seqs, sizeof(long));
    ls_engine_item *it = calloc((size_t)e->T, sizeof *it);
    if (!gen || !done || !it) {
        free(gen), free(done), free(it);
        return ls_fail(err, LS_E_NOMEM, "rollout: out of memory");
    }
    ls_status st = LS_OK;
    long V = e->c.vocab;
    /* Prefill, packed, at most T rows per step. */
    while (st == LS_OK) {
        long n = 0, rows = 0;
        for (long i = 0; i < n_seqs && rows < e->T; i++) {
            long left = seqs[i].n_tokens - done[i];
            if (left <= 0) continue;
            long take = left < e->T - rows ? left : e->T - rows;
            it[n++] = (ls_engine_item){i, seqs[i].tokens + done[i], take,
                                       max_new == 1 && take == left};
            rows += take;
        }
        if (n == 0) break;
        st = ls_engine_step(e, it, n, err);
        for (long s = 0, r = 0; st == LS_OK && s < n; s++) {
            long i = it[s].slot;
            for (long j = 0; st == LS_OK && j < it[s].n; j++, r++) {
                long p = done[i] + j;
                int32_t next;
                if (p + 1 < seqs[i].n_tokens) next = seqs[i].tokens[p + 1];
                else {
                    st = ls_sample_select(sampling, ls_engine_logprobs(e, r), V, seqs[i].id,
                                          (uint32_t)(p + 1), e->sample_ids, &next, err);
                    gen[i * max_new] = next;
                }
                ls_engine_record(e, r, next);
            }
            done[i] += it[s].n;
        }
        if (st == LS_OK) st = sink(ctx, LS_FRAME_PREFILL, e->recs, rows, err);
    }
    /* Decode: one token per sequence per step. */
    for (long step = 1; st == LS_OK && step < max_new; step++) {
        for (long b0 = 0; st == LS_OK && b0 < n_seqs; b0 += e->T) {
            long nb = n_seqs - b0 < e->T ? n_seqs - b0 : e->T;
            for (long s = 0; s < nb; s++) {
                long i = b0 + s;
                it[s] = (ls_engine_item){i, &gen[i * max_new + step - 1], 1, step == max_new - 1};
            }
            st = ls_engine_step(e, it, nb, err);
            for (long s = 0; st == LS_OK && s < nb; s++) {
                long i = b0 + s;
                int32_t next;
                st = ls_sample_select(sampling, ls_engine_logprobs(e, s), V, seqs[i].id,
                                      (uint32_t)(e->h_pos[s] + 1), e->sample_ids, &next, err);
                gen[i * max_new + step] = next;
                ls_engine_record(e, s, next);
            }
            if (st == LS_OK) st = sink(ctx, LS_FRAME_DECODE, e->recs, nb, err);
        }
    }
    if (st == LS_OK && completion) memcpy(completion, gen, sizeof(int32_t) * (size_t)(n_seqs * max_new));
    for (long i = 0; i < n_seqs; i++) ls_engine_leave(e, i);
    free(done), free(gen), free(it);
    return st;
}

/* ---- replay ------------------------------------------------------------------------------ */

ls_status ls_engine_replay(ls_engine *e, const ls_sequence *seqs, long n_seqs, long chunk,
                           ls_engine_sink sink, void *ctx, ls_error *err)
{
    if (n_seqs < 1 || n_seqs > e->max_seqs)
        return ls_fail(err, LS_E_USAGE, "replay: %ld sequences (engine holds %ld)", n_seqs, e->max_seqs);
    if (chunk < 1) return ls_fail(err, LS_E_USAGE, "replay: --chunk must be >= 1");
    for (long i = 0; i < n_seqs; i++) {
        if (seqs[i].n_tokens < 2)
            return ls_fail(err, LS_E_INPUT, "replay: sequence %u has %ld tokens (need a prompt and "
                           "at least one completion token)", seqs[i].id, seqs[i].n_tokens);
        if (seqs[i].n_tokens - 1 > e->cap)
            return ls_fail(err, LS_E_USAGE, "replay: sequence %u needs %ld positions (capacity %ld)",
                           seqs[i].id, seqs[i].n_tokens - 1, e->cap);
    }
    for (long i = 0; i < e->max_seqs; i++) ls_engine_leave(e, i);
    for (long i = 0; i < n_seqs; i++) LS_TRY(ls_engine_join(e, i, seqs[i].id, seqs[i].prompt_len, err));
    ls_engine_item *it = calloc((size_t)e->T, sizeof *it);
    long *done = calloc((size_t)n_seqs, sizeof(long));
    if (!it || !done) {
        free(it), free(done);
        return ls_fail(err, LS_E_NOMEM, "replay: out of memory");
    }
    ls_status st = LS_OK;
    long start = 0; /* rotate which sequence gets rows first when the budget is short */
    while (st == LS_OK) {
        long n = 0, rows = 0;
        for (long o = 0; o < n_seqs && rows < e->T; o++) {
            long i = (start + o) % n_seqs;
            long left = seqs[i].n_tokens - 1 - done[i];
            if (left <= 0) continue;
            long take = left < chunk ? left : chunk;
            if (take > e->T - rows) take = e->T - rows;
            it[n++] = (ls_engine_item){i, seqs[i].tokens + done[i], take, take == left};
            rows += take;
        }
        if (n == 0) break;
        start++;
        st = ls_engine_step(e, it, n, err);
        for (long s = 0, r = 0; st == LS_OK && s < n; s++) {
            long i = it[s].slot;
            for (long j = 0; j < it[s].n; j++, r++) ls_engine_record(e, r, seqs[i].tokens[done[i] + j + 1]);
            done[i] += it[s].n;
        }
        if (st == LS_OK) st = sink(ctx, LS_FRAME_CHUNK, e->recs, rows, err);
    }
    for (long i = 0; i < n_seqs; i++) ls_engine_leave(e, i);
    free(it), free(done);
    return st;
}
