/* lockstep — the engine's state and step API; see engine.h. The forward and
 * its digest queue are in engine_forward.c; the rollout, replay and
 * continuous-batching drivers are in the run layer (src/run/drive.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

static const char *const op_names[LS_PERTURB_COUNT] = {
    "none", "gdn", "conv", "attention", "router", "experts", "combine", "norm", "lm_head"};

const char *ls_perturb_op_name(ls_perturb_op op)
{
    return op < LS_PERTURB_COUNT ? op_names[op] : "?";
}

int ls_perturb_op_in_layer(const ls_model_config *c, ls_perturb_op op, long layer)
{
    if (layer < 0 || layer >= c->n_layers) return 0;
    int att = c->is_attention[layer];
    switch (op) {
    case LS_PERTURB_ATTENTION: return att;
    case LS_PERTURB_GDN:
    case LS_PERTURB_CONV: return !att;
    case LS_PERTURB_ROUTER:
    case LS_PERTURB_EXPERTS:
    case LS_PERTURB_COMBINE:
    case LS_PERTURB_NORM: return 1;
    default: return 0; /* none, lm_head (no decoder layer's), out of range */
    }
}

void ls_engine_opts_default(ls_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->act_bf16 = 1;
    o->max_rows = 256;
    o->state_digest_every = 64;
    o->perturb_layer = -1;
    o->perturb_op = LS_PERTURB_NONE;
}

static ls_status wrap(ls_engine *e, const ls_wmat *m, ls_bweight *out, ls_error *err)
{
    size_t bytes = (size_t)m->rows * (size_t)m->cols * (size_t)ls_wtype_bytes(m->wtype);
    LS_TRY(e->be->wrap_weights(e->be, m->data, bytes, m->wtype, &out->buf, err));
    out->off_bytes = 0;
    out->wtype = m->wtype;
    out->rows = m->rows;
    out->cols = m->cols;
    out->scale = NULL;
    if (ls_wtype_is_f8(m->wtype)) {
        /* the model binds FP8 matrices dequantised; w8a8 is the engine's choice */
        size_t sb = sizeof(float) * (size_t)LS_FP8_BLOCKS(m->rows) * (size_t)LS_FP8_BLOCKS(m->cols);
        LS_TRY(e->be->wrap_weights(e->be, m->scale, sb, LS_WTYPE_F32, &out->scale, err));
        out->wtype = e->o.fp8_w8a8 ? LS_WTYPE_F8_W8A8 : LS_WTYPE_F8_DEQUANT;
    }
    return LS_OK;
}

/* Small parameters, rounded to bf16 in bf16 mode (the reference casts every
 * parameter to the model dtype, docs/model.md §2.4). */
static ls_status small(ls_engine *e, const float *v, long n, ls_buf **out, ls_error *err)
{
    LS_TRY(e->be->alloc(e->be, (size_t)n * 4, out, err));
    float *tmp = malloc((size_t)n * 4);
    if (!tmp) return ls_fail_nomem(err, (size_t)n * 4, "engine: a parameter vector of %ld floats", n);
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
    while (e->snaps) {
        ls_engine_snapshot *s = e->snaps;
        e->snaps = s->next;
        free(s->conv), free(s->gdn), free(s->kc), free(s->vc), free(s);
    }
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
    ls_backend *be = e->be;
    if (!be->digest)
        return ls_fail(err, LS_E_UNSUPPORTED, "backend %s has no digest op: lockstep records "
                       "every digest through it and will not run without it", be->name);
    LS_TRY(wrap(e, &m->embed, &e->embed, err));
    LS_TRY(wrap(e, &m->lm_head, &e->lm_head, err));
    LS_TRY(small(e, m->final_norm, D, &e->final_norm, err));
    e->lw = calloc((size_t)L, sizeof *e->lw);
    if (!e->lw) return ls_fail_nomem(err, (size_t)L * sizeof *e->lw, "engine: weights of %ld layers", (long)L);
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
            if (c->arch == LS_MODEL_QWEN3_5_MOE) {
                LS_TRY(wrap(e, &ml->in_qkv, &w->in_qkv, err));
                LS_TRY(wrap(e, &ml->in_z, &w->in_z, err));
                LS_TRY(wrap(e, &ml->in_b, &w->in_b, err));
                LS_TRY(wrap(e, &ml->in_a, &w->in_a, err));
            } else {
                LS_TRY(wrap(e, &ml->qkvz, &w->qkvz, err));
                LS_TRY(wrap(e, &ml->ba, &w->ba, err));
            }
            LS_TRY(wrap(e, &ml->conv, &w->conv, err));
            LS_TRY(wrap(e, &ml->out_proj, &w->out_proj, err));
            LS_TRY(small(e, ml->A_log, Hv, &w->A_log, err));
            LS_TRY(small(e, ml->dt_bias, Hv, &w->dt_bias, err));
            LS_TRY(small(e, ml->gnorm, dv, &w->gnorm, err));
        }
        LS_TRY(wrap(e, &ml->router, &w->router, err));
        w->experts = calloc((size_t)(3 * E), sizeof(ls_bweight));
        if (!w->experts) return ls_fail_nomem(err, (size_t)(3 * E) * sizeof(ls_bweight), "engine: expert table of %ld experts", (long)E);
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
    if (!e->ss) return ls_fail_nomem(err, (size_t)e->max_seqs * sizeof *e->ss, "engine: state of %ld sequences", (long)e->max_seqs);
    for (long s = 0; s < e->max_seqs; s++) {
        seq_state *q = &e->ss[s];
        q->conv = calloc((size_t)L, sizeof(ls_buf *));
        q->gdn = calloc((size_t)L, sizeof(ls_buf *));
        q->kc = calloc((size_t)L, sizeof(ls_buf *));
        q->vc = calloc((size_t)L, sizeof(ls_buf *));
        if (!q->conv || !q->gdn || !q->kc || !q->vc)
            return ls_fail_nomem(err, 4 * (size_t)L * sizeof(ls_buf *), "engine: state tables of sequence %ld", (long)s);
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
    /* the fused projections' outputs, before the split (Qwen3-Next only:
     * Qwen3.5's projections write X, Z, Bv and Av directly) */
    int fused = c->arch == LS_MODEL_QWEN3_NEXT;
    LS_TRY(buf(e, fused ? T * e->wqkvz : 1, &e->P, err));
    LS_TRY(buf(e, fused ? T * 2 * Hv : 1, &e->BA, err));
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
    if (!e->layers || !e->slot_of)
        return ls_fail_nomem(err, (size_t)e->n_tl * (sizeof *e->layers + sizeof(int) * N_KINDS),
                             "engine: tables of %d trace layers", e->n_tl);
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
    /* The sum of the allocations below, for the message should one fail. */
    size_t host_bytes = 2 * sizeof(int32_t) * (size_t)T + 2 * sizeof(float) * (size_t)(T * (R / 2) + 1) +
                        sizeof(float) * (size_t)(T * V) + 8 * tmp + (size_t)(T * ns) * (sizeof *e->dig + 1 + sizeof *e->rec_dig) +
                        sizeof(int32_t) * (size_t)V + (size_t)T * (sizeof *e->recs + sizeof *e->sg + sizeof *e->row_seq) +
                        (size_t)(4 * T + 16) * sizeof *e->jobs;
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
        return ls_fail_nomem(err, host_bytes, "engine: host buffers for %ld rows", T);
    if (e->o.dump_decoder_layers) {
        for (long l = 0; l < L; l++) e->dumping |= e->o.dump_decoder_layers[l] != 0;
    }
    if (e->dumping) {
        e->dump_bytes = (4 * tmp + 3) & ~(size_t)3;
        size_t cells = (size_t)(T * ns);
        if (cells * e->dump_bytes > ((size_t)1 << 32))
            return ls_fail(err, LS_E_USAGE, "engine: layer dumps need %zu bytes of buffers for %ld rows; "
                           "lower max_rows", cells * e->dump_bytes, T);
        e->dump_data = malloc(cells * e->dump_bytes);
        e->dumps = calloc(cells, sizeof *e->dumps);
        e->dump_elems = calloc(cells, sizeof *e->dump_elems);
        e->dump_dtype = calloc(cells, 1);
        e->rec_dumps = calloc(cells, sizeof *e->rec_dumps);
        if (!e->dump_data || !e->dumps || !e->dump_elems || !e->dump_dtype || !e->rec_dumps)
            return ls_fail_nomem(err, cells * (e->dump_bytes + sizeof *e->dumps + sizeof *e->dump_elems + 1 +
                                               sizeof *e->rec_dumps), "engine: layer dump buffers for %zu cells", cells);
    }
    return LS_OK;
}

static ls_status check_opts(const ls_model *m, const ls_engine_opts *o, long max_seqs, long max_len,
                            ls_error *err)
{
    if (max_seqs < 1 || max_len < 1)
        return ls_fail(err, LS_E_USAGE, "engine: need at least one sequence of one token");
    if (max_len > m->cfg.max_positions)
        return ls_fail(err, LS_E_UNSUPPORTED, "engine: sequences of %ld tokens exceed "
                       "max_position_embeddings (%ld)", max_len, m->cfg.max_positions);
    if (o->max_rows < 1 || o->state_digest_every < 1)
        return ls_fail(err, LS_E_USAGE, "engine: max_rows and state_digest_every must be >= 1");
    if (o->perturb_op != LS_PERTURB_NONE && o->perturb_op != LS_PERTURB_LM_HEAD) {
        long l = o->perturb_layer;
        if (l < 0 || l >= m->cfg.n_layers)
            return ls_fail(err, LS_E_USAGE, "engine: perturbation layer %ld is outside 0..%ld", l,
                           m->cfg.n_layers - 1);
        if (!ls_perturb_op_in_layer(&m->cfg, o->perturb_op, l))
            return ls_fail(err, LS_E_USAGE, "engine: perturbation op %s does not exist in layer %ld "
                           "(a %s layer)", ls_perturb_op_name(o->perturb_op), l,
                           m->cfg.is_attention[l] ? "full attention" : "gated DeltaNet");
    }
    return LS_OK;
}

ls_status ls_engine_create(const ls_model *m, ls_backend *be, const ls_engine_opts *o,
                           long max_seqs, long max_len, ls_engine **out, ls_error *err)
{
    *out = NULL;
    if (!be) return ls_fail(err, LS_E_USAGE, "engine: no backend");
    ls_status st = check_opts(m, o, max_seqs, max_len, err);
    ls_engine *e = st == LS_OK ? calloc(1, sizeof *e) : NULL;
    if (st == LS_OK && !e) st = ls_fail_nomem(err, sizeof *e, "engine");
    if (st != LS_OK) {
        be->destroy(be); /* the engine owns the backend from here on */
        return st;
    }
    e->be = be;
    e->m = m;
    e->c = m->cfg;
    e->o = *o;
    e->max_seqs = max_seqs;
    e->cap = max_len;
    e->T = o->max_rows;
    st = create_inner(e, err);
    if (st != LS_OK) {
        ls_engine_destroy(e);
        return st;
    }
    *out = e;
    return LS_OK;
}

long ls_engine_max_rows(const ls_engine *e)
{
    return e->T;
}

long ls_engine_max_seqs(const ls_engine *e)
{
    return e->max_seqs;
}

long ls_engine_capacity(const ls_engine *e)
{
    return e->cap;
}

long ls_engine_vocab(const ls_engine *e)
{
    return e->c.vocab;
}

const char *ls_engine_backend_name(const ls_engine *e)
{
    return e->be->name;
}

/* ---- step API ------------------------------------------------------------------------ */

/* Zeroes a slot's carried state: the state of a sequence at position 0. */
static ls_status slot_zero(ls_engine *e, seq_state *q, ls_error *err)
{
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
    return LS_OK;
}

static ls_status free_slot(const ls_engine *e, long slot, const char *what, ls_error *err)
{
    if (slot < 0 || slot >= e->max_seqs)
        return ls_fail(err, LS_E_USAGE, "engine %s: slot %ld is outside 0..%ld", what, slot, e->max_seqs - 1);
    if (e->ss[slot].active)
        return ls_fail(err, LS_E_USAGE, "engine %s: slot %ld is taken by sequence %u", what, slot,
                       e->ss[slot].id);
    return LS_OK;
}

ls_status ls_engine_join(ls_engine *e, long slot, uint32_t seq_id, long prompt_len, ls_error *err)
{
    LS_TRY(free_slot(e, slot, "join", err));
    seq_state *q = &e->ss[slot];
    LS_TRY(slot_zero(e, q, err));
    q->len = 0;
    q->id = seq_id;
    q->prompt_len = prompt_len > 0 ? prompt_len : 0;
    q->active = 1;
    return LS_OK;
}

/* Copies len positions of carried state: the whole conv and GDN states and,
 * per attention layer and KV head, rows 0..len-1 ([Hkv, cap, d] caches of
 * dst_cap and src_cap positions). */
static ls_status state_copy(ls_engine *e, ls_buf *const *dconv, ls_buf *const *dgdn, ls_buf *const *dkc,
                            ls_buf *const *dvc, long dst_cap, ls_buf *const *sconv, ls_buf *const *sgdn,
                            ls_buf *const *skc, ls_buf *const *svc, long src_cap, long len, ls_error *err)
{
    const ls_model_config *c = &e->c;
    long d = c->head_dim, Hkv = c->n_kv_heads;
    long nconv = e->conv_dim * c->conv_kernel, ngdn = c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
    /* one block per KV head: its first len rows of d */
    ls_copy_shape kv = {1, Hkv, len * d, 0, dst_cap * d, 0, src_cap * d};
    for (long l = 0; l < c->n_layers; l++) {
        if (c->is_attention[l]) {
            if (len == 0) continue;
            LS_TRY(e->be->copy_blocks(e->be, BEV(dkc[l]), BEV(skc[l]), &kv, err));
            LS_TRY(e->be->copy_blocks(e->be, BEV(dvc[l]), BEV(svc[l]), &kv, err));
        } else {
            LS_TRY(ls_copy_rows(e->be, BEV(dconv[l]), nconv, BEV(sconv[l]), nconv, 1, nconv, err));
            LS_TRY(ls_copy_rows(e->be, BEV(dgdn[l]), ngdn, BEV(sgdn[l]), ngdn, 1, ngdn, err));
        }
    }
    return LS_OK;
}

ls_status ls_engine_fork(ls_engine *e, long src, long dst, uint32_t seq_id, ls_error *err)
{
    if (src < 0 || src >= e->max_seqs || !e->ss[src].active)
        return ls_fail(err, LS_E_USAGE, "engine fork: slot %ld holds no sequence", src);
    LS_TRY(free_slot(e, dst, "fork", err));
    seq_state *q = &e->ss[dst];
    const seq_state *p = &e->ss[src];
    LS_TRY(slot_zero(e, q, err));
    LS_TRY(state_copy(e, q->conv, q->gdn, q->kc, q->vc, e->cap, p->conv, p->gdn, p->kc, p->vc, e->cap,
                      p->len, err));
    q->len = p->len;
    q->prompt_len = p->prompt_len;
    q->id = seq_id;
    q->active = 1;
    return LS_OK;
}

/* ---- snapshots ----------------------------------------------------------------------- */

/* A pooled snapshot whose KV buffers hold len positions, or a new one. */
static ls_status snap_get(ls_engine *e, long len, ls_engine_snapshot **out, ls_error *err)
{
    for (ls_engine_snapshot *s = e->snaps; s; s = s->next)
        if (!s->in_use && s->kv_cap >= len) {
            *out = s;
            return LS_OK;
        }
    const ls_model_config *c = &e->c;
    long L = c->n_layers, kv_cap = len > 0 ? len : 1;
    ls_engine_snapshot *s = calloc(1, sizeof *s);
    if (!s) return ls_fail_nomem(err, sizeof *s, "engine: a snapshot");
    s->conv = calloc((size_t)L, sizeof(ls_buf *));
    s->gdn = calloc((size_t)L, sizeof(ls_buf *));
    s->kc = calloc((size_t)L, sizeof(ls_buf *));
    s->vc = calloc((size_t)L, sizeof(ls_buf *));
    s->next = e->snaps; /* listed at once: ls_engine_destroy frees it whatever happens next */
    e->snaps = s;
    if (!s->conv || !s->gdn || !s->kc || !s->vc)
        return ls_fail_nomem(err, 4 * (size_t)L * sizeof(ls_buf *), "engine: snapshot tables");
    s->kv_cap = kv_cap;
    s->in_use = 1; /* not pooled until its buffers exist */
    for (long l = 0; l < L; l++) {
        if (c->is_attention[l]) {
            LS_TRY(buf(e, c->n_kv_heads * kv_cap * c->head_dim, &s->kc[l], err));
            LS_TRY(buf(e, c->n_kv_heads * kv_cap * c->head_dim, &s->vc[l], err));
        } else {
            LS_TRY(buf(e, e->conv_dim * c->conv_kernel, &s->conv[l], err));
            LS_TRY(buf(e, c->lin_v_heads * c->lin_k_dim * c->lin_v_dim, &s->gdn[l], err));
        }
    }
    *out = s;
    return LS_OK;
}

ls_status ls_engine_snapshot_take(ls_engine *e, long slot, ls_engine_snapshot **out, ls_error *err)
{
    *out = NULL;
    if (slot < 0 || slot >= e->max_seqs || !e->ss[slot].active)
        return ls_fail(err, LS_E_USAGE, "engine snapshot: slot %ld holds no sequence", slot);
    const seq_state *q = &e->ss[slot];
    ls_engine_snapshot *s = NULL;
    LS_TRY(snap_get(e, q->len, &s, err));
    s->in_use = 1;
    ls_status st = state_copy(e, s->conv, s->gdn, s->kc, s->vc, s->kv_cap, q->conv, q->gdn, q->kc, q->vc,
                              e->cap, q->len, err);
    if (st != LS_OK) {
        s->in_use = 0;
        return st;
    }
    s->owner = e;
    s->model = e->m;
    s->act_bf16 = e->o.act_bf16;
    s->fp8_w8a8 = e->o.fp8_w8a8;
    s->perturb_layer = e->o.perturb_layer;
    s->perturb_op = e->o.perturb_op;
    s->id = q->id;
    s->len = q->len;
    s->prompt_len = q->prompt_len;
    *out = s;
    return LS_OK;
}

ls_status ls_engine_snapshot_restore(ls_engine *e, const ls_engine_snapshot *s, long slot,
                                     uint32_t seq_id, long prompt_len, ls_error *err)
{
    if (!s || !s->in_use) return ls_fail(err, LS_E_USAGE, "engine restore: no snapshot (freed?)");
    /* The fields that change carried-state bits first: a message that names
     * the difference helps more than "another engine". */
    if (s->model != e->m)
        return ls_fail(err, LS_E_USAGE, "snapshot of sequence %u: model: taken on another checkpoint "
                       "(its state is another model's)", s->id);
    if (s->act_bf16 != e->o.act_bf16)
        return ls_fail(err, LS_E_USAGE, "snapshot of sequence %u: act_bf16: taken with %s activations, "
                       "the engine runs %s", s->id, s->act_bf16 ? "bf16" : "fp32", e->o.act_bf16 ? "bf16" : "fp32");
    if (s->fp8_w8a8 != e->o.fp8_w8a8)
        return ls_fail(err, LS_E_USAGE, "snapshot of sequence %u: fp8: taken in %s mode, the engine runs %s",
                       s->id, s->fp8_w8a8 ? "w8a8" : "dequant", e->o.fp8_w8a8 ? "w8a8" : "dequant");
    if (s->perturb_op != e->o.perturb_op || (s->perturb_op != LS_PERTURB_NONE && s->perturb_layer != e->o.perturb_layer))
        return ls_fail(err, LS_E_USAGE, "snapshot of sequence %u: perturbation: taken with op %s layer %d, "
                       "the engine runs op %s layer %d", s->id, ls_perturb_op_name(s->perturb_op),
                       s->perturb_layer, ls_perturb_op_name(e->o.perturb_op), e->o.perturb_layer);
    if (s->owner != e)
        return ls_fail(err, LS_E_USAGE, "snapshot of sequence %u: backend: its buffers belong to another "
                       "engine", s->id);
    if (s->len > e->cap)
        return ls_fail(err, LS_E_USAGE, "snapshot of sequence %u: len %ld exceeds the capacity %ld", s->id,
                       s->len, e->cap);
    if (prompt_len < 1) return ls_fail(err, LS_E_USAGE, "engine restore: prompt_len must be >= 1");
    /* Restored for another sequence, the snapshot is a prefix of its prompt,
     * and the prompt's last token must still be computed (its logprobs
     * select the first generated token). */
    if ((seq_id != s->id || prompt_len != s->prompt_len) && s->len >= prompt_len)
        return ls_fail(err, LS_E_USAGE, "snapshot of sequence %u: prefix_len %ld is not shorter than the "
                       "prompt of sequence %u (%ld tokens)", s->id, s->len, seq_id, prompt_len);
    LS_TRY(free_slot(e, slot, "restore", err));
    seq_state *q = &e->ss[slot];
    LS_TRY(slot_zero(e, q, err));
    LS_TRY(state_copy(e, q->conv, q->gdn, q->kc, q->vc, e->cap, s->conv, s->gdn, s->kc, s->vc, s->kv_cap,
                      s->len, err));
    q->len = s->len;
    q->prompt_len = prompt_len;
    q->id = seq_id;
    q->active = 1;
    return LS_OK;
}

long ls_engine_snapshot_len(const ls_engine_snapshot *s)
{
    return s ? s->len : -1;
}

uint32_t ls_engine_snapshot_seq(const ls_engine_snapshot *s)
{
    return s ? s->id : 0;
}

void ls_engine_snapshot_free(ls_engine *e, ls_engine_snapshot *s)
{
    (void)e;
    if (s) s->in_use = 0; /* pooled: the buffers are the backend's until the engine goes */
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
            return ls_fail(err, LS_E_USAGE, "engine step: more than %ld tokens (max_rows)", e->T);
        e->sg[i] = (seg){it->slot, it->tokens, it->n, rows, e->ss[it->slot].len, it->last != 0};
        rows += it->n;
    }
    return ls_engine_forward(e, e->sg, n_items, err);
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
