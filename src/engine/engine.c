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
    o->step_graphs = 1;
}

static ls_status wrap(ls_engine *e, const ls_wmat *m, ls_bweight *out, ls_error *err)
{
    size_t bytes = (size_t)m->rows * (size_t)m->cols * (size_t)ls_wtype_bytes(m->wtype);
    size_t sb = sizeof(float) * (size_t)LS_FP8_BLOCKS(m->rows) * (size_t)LS_FP8_BLOCKS(m->cols);
    const int f8 = ls_wtype_is_f8(m->wtype);
    out->scale = NULL;
    if (!m->data && m->gen && e->be->wrap_generated) {
        /* a synthetic model's matrix: the backend generates this row range
         * (scales included), the bytes of the written checkpoint there */
        LS_TRY(e->be->wrap_generated(e->be, m->gen, m->gen_row0, m->rows, m->cols, m->wtype,
                                     &out->buf, f8 ? &out->scale : NULL, err));
    } else {
        LS_TRY(e->be->wrap_weights(e->be, m->data, bytes, m->wtype, &out->buf, err));
        if (f8) LS_TRY(e->be->wrap_weights(e->be, m->scale, sb, LS_WTYPE_F32, &out->scale, err));
    }
    e->weight_bytes += bytes + (f8 ? sb : 0);
    out->off_bytes = 0;
    out->wtype = m->wtype;
    out->rows = m->rows;
    out->cols = m->cols;
    /* the model binds FP8 matrices dequantised; w8a8 is the engine's choice */
    if (f8) out->wtype = e->o.fp8_w8a8 ? LS_WTYPE_F8_W8A8 : LS_WTYPE_F8_DEQUANT;
    return LS_OK;
}

/* Tensor parallelism: rows r0 .. r0 + n - 1 of a projection, borrowed from
 * the model's matrix (no copy: a row range of a row-major matrix is
 * contiguous, and so are its FP8 scale rows when the range starts a 128-row
 * scale block or lies inside one, checked in ls_engine_check_tp). */
static ls_status wrap_range(ls_engine *e, const ls_wmat *m, long r0, long n, ls_bweight *out,
                            ls_error *err)
{
    ls_wmat s = *m;
    s.rows = n;
    if (m->data)
        s.data = (const unsigned char *)m->data + (size_t)r0 * (size_t)m->cols * (size_t)ls_wtype_bytes(m->wtype);
    s.gen_row0 = m->gen_row0 + r0; /* a generated matrix: the same rows of the whole */
    if (ls_wtype_is_f8(m->wtype) && m->scale)
        s.scale = m->scale + (size_t)(r0 / LS_FP8_BLOCK) * (size_t)LS_FP8_BLOCKS(m->cols);
    return wrap(e, &s, out, err);
}

/* This rank's rows tp_rank * N/tp .. of a projection of N rows; without TP
 * the whole matrix. */
static ls_status wrap_rows(ls_engine *e, const ls_wmat *m, ls_bweight *out, ls_error *err)
{
    if (!e->tp) return wrap(e, m, out, err);
    long n = m->rows / e->tp;
    return wrap_range(e, m, (long)e->tp_rank * n, n, out, err);
}

/* k_proj, v_proj: the rows of this rank's KV heads kv_head0 .. (e->c holds
 * their count), which ranks share when num_key_value_heads < tp. */
static ls_status wrap_kv(ls_engine *e, const ls_wmat *m, ls_bweight *out, ls_error *err)
{
    if (!e->tp) return wrap(e, m, out, err);
    long d = e->c.head_dim;
    return wrap_range(e, m, e->kv_head0 * d, e->c.n_kv_heads * d, out, err);
}

/* The conv weight [conv_dim, K] of this rank's channels: its key heads' q
 * and k channels and its value heads' v channels, three row ranges of the
 * full weight copied into one host matrix the engine keeps (e->conv_w[l];
 * the weight is a few KB per layer). */
static ls_status conv_rows(ls_engine *e, const ls_wmat *m, long l, ls_bweight *out, ls_error *err)
{
    const ls_model_config *c = &e->c; /* this rank's heads */
    long qk = c->lin_k_heads * c->lin_k_dim, vv = c->lin_v_heads * c->lin_v_dim, r = e->tp_rank;
    size_t row = (size_t)m->cols * (size_t)ls_wtype_bytes(m->wtype);
    unsigned char *dst = malloc(row * (size_t)(2 * qk + vv));
    if (!dst) return ls_fail_nomem(err, row * (size_t)(2 * qk + vv), "engine: conv weight of layer %ld", l);
    e->conv_w[l] = dst;
    const unsigned char *src = m->data;
    long from[3] = {r * qk, e->tp * qk + r * qk, 2 * e->tp * qk + r * vv}, len[3] = {qk, qk, vv};
    for (int i = 0; i < 3; i++) {
        if (src) memcpy(dst, src + (size_t)from[i] * row, (size_t)len[i] * row);
        else if (m->gen) /* a synthetic model's conv weight (bf16): generated on the host */
            LS_TRY(m->gen->fill(m->gen, m->gen_row0 + from[i], len[i], m->cols, dst, NULL, err));
        else
            return ls_fail(err, LS_E_UNSUPPORTED, "engine: the conv weight of layer %ld has no "
                           "data and no generator", l);
        dst += (size_t)len[i] * row;
    }
    ls_wmat s = *m;
    s.data = e->conv_w[l];
    s.rows = 2 * qk + vv;
    return wrap(e, &s, out, err);
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
    free(e->h_in), free(e->h_lp), free(e->h_lps), free(e->graphs[0].have), free(e->graphs[0].dig);
    ls_sha256 *runs = e->banks[0].lg_run;
    for (long r = 0; runs && r < 2 * e->T; r++) ls_sha256_discard(&runs[r]); /* a failed step's */
    free(runs);
    free(e->h_tmp), free(e->h_bytes), free(e->layers), free(e->slot_of), free(e->banks[0].dig);
    free(e->banks[0].have), free(e->sample_ids), free(e->banks[0].recs), free(e->banks[0].rec_dig);
    free(e->jobs), free(e->sg), free(e->row_seq), free(e->dump_data), free(e->dumps);
    free(e->dump_elems), free(e->dump_dtype), free(e->rec_dumps);
    free(e->free_pages), free(e->h_pt), free(e->pt_dirty), free(e->kpool), free(e->vpool);
    free(e->h_ids), free(e->h_pairs), free(e->h_rows), free(e->h_all), free(e->ep_bytes);
    free(e->ep_base), free(e->h_tp_a), free(e->h_tp_b), free(e->h_afd), free(e->afd_ns);
    for (long l = 0; e->conv_w && l < e->c.n_layers; l++) free(e->conv_w[l]);
    free(e->conv_w);
    free(e);
}

const ls_trace_layer *ls_engine_layers(const ls_engine *e, int *n)
{
    *n = e->n_tl;
    return e->layers;
}

/* Hands the backend every weight the forward passes to linear (lin() and
 * the TP projection parts of engine_forward.c), before the first step, when
 * it chooses kernels per shape (backend.h prepare_linear). */
static ls_status prepare_linears(ls_engine *e, ls_error *err)
{
    ls_backend *be = e->be;
    if (!be->prepare_linear) return LS_OK;
    if (e->lm_head.buf) LS_TRY(be->prepare_linear(be, &e->lm_head, e->T, err));
    for (long l = 0; l < e->c.n_layers; l++) {
        layer_w *w = &e->lw[l];
        const ls_bweight *ws[] = {&w->qkvz, &w->ba, &w->out_proj, &w->in_qkv, &w->in_z, &w->in_b,
                                  &w->in_a, &w->in_k, &w->in_v, &w->q, &w->k, &w->v, &w->o};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            if (ws[i]->buf) LS_TRY(be->prepare_linear(be, ws[i], e->T, err));
    }
    return LS_OK;
}

/* Makes bank b the one a step's digests and records use. */
static void use_bank(ls_engine *e, int b)
{
    const struct ls_engine_bank *k = &e->banks[b];
    e->bank = b;
    e->dig = k->dig, e->have = k->have, e->recs = k->recs, e->rec_dig = k->rec_dig, e->lg_run = k->lg_run;
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
    e->gdn_floats = !e->o.gdn_chunked        ? Hv * dk * dv
                    : be->gdn_chunked_floats ? (long)be->gdn_chunked_floats(be, Hv, dk, dv)
                                             : (long)LS_GDN_CHUNK_STATE_FLOATS(Hv, dk, dv);
    if (e->o.gdn_chunked && (!be->gdn_chunked || !be->gdn_chunked_state))
        return ls_fail(err, LS_E_UNSUPPORTED, "engine: the chunk-aligned GDN form (gdn_chunked): backend %s "
                       "has no kernel for it", be->name);
    if (!be->digest)
        return ls_fail(err, LS_E_UNSUPPORTED, "backend %s has no digest op: lockstep records "
                       "every digest through it and will not run without it", be->name);
    if (e->tp && e->moe_comm && (!be->moe_slots || !be->moe_combine))
        return ls_fail(err, LS_E_UNSUPPORTED, "backend %s has no expert-parallel ops (moe_slots, "
                       "moe_combine): it cannot run as one rank of %d tensor-parallel ranks (the "
                       "MoE of a tensor-parallel group runs expert-parallel)", be->name, e->tp);
    if (e->ep && (!be->moe_slots || !be->moe_combine))
        return ls_fail(err, LS_E_UNSUPPORTED, "backend %s has no expert-parallel ops (moe_slots, "
                       "moe_combine): it cannot run as one rank of %d expert-parallel ranks",
                       be->name, e->ep);
    /* AFD: the mixer rank holds no router or expert, the FFN rank nothing else */
    int mixers = !e->afd || e->afd_rank < e->afd_att, ffn = !e->afd || e->afd_rank >= e->afd_att;
    if (mixers) {
        LS_TRY(wrap(e, &m->embed, &e->embed, err));
        LS_TRY(wrap_rows(e, &m->lm_head, &e->lm_head, err));
    }
    LS_TRY(small(e, m->final_norm, D, &e->final_norm, err));
    e->conv_w = calloc((size_t)L, sizeof *e->conv_w);
    if (!e->conv_w) return ls_fail_nomem(err, (size_t)L * sizeof *e->conv_w, "engine: conv table");
    e->lw = calloc((size_t)L, sizeof *e->lw);
    if (!e->lw) return ls_fail_nomem(err, (size_t)L * sizeof *e->lw, "engine: weights of %ld layers", (long)L);
    for (long l = 0; l < L; l++) {
        const ls_model_layer *ml = &m->layers[l];
        layer_w *w = &e->lw[l];
        LS_TRY(small(e, ml->in_norm, D, &w->in_norm, err));
        LS_TRY(small(e, ml->post_norm, D, &w->post_norm, err));
        if (!mixers) {
            /* the FFN rank of AFD: no mixer weights */
        } else if (ml->attention) {
            LS_TRY(wrap_rows(e, &ml->q_proj, &w->q, err));
            LS_TRY(wrap_kv(e, &ml->k_proj, &w->k, err));
            LS_TRY(wrap_kv(e, &ml->v_proj, &w->v, err));
            LS_TRY(wrap_rows(e, &ml->o_proj, &w->o, err));
            LS_TRY(small(e, ml->q_norm, d, &w->q_norm, err));
            LS_TRY(small(e, ml->k_norm, d, &w->k_norm, err));
        } else {
            if (c->arch == LS_MODEL_QWEN3_5_MOE && e->tp) {
                /* this rank's heads' rows of the q, k and v sections */
                const ls_wmat *qkv = &ml->in_qkv;
                long r = e->tp_rank;
                LS_TRY(wrap_range(e, qkv, r * Hk * dk, Hk * dk, &w->in_qkv, err));
                LS_TRY(wrap_range(e, qkv, e->tp * Hk * dk + r * Hk * dk, Hk * dk, &w->in_k, err));
                LS_TRY(wrap_range(e, qkv, 2 * e->tp * Hk * dk + r * Hv * dv, Hv * dv, &w->in_v, err));
                LS_TRY(wrap_rows(e, &ml->in_z, &w->in_z, err));
                LS_TRY(wrap_rows(e, &ml->in_b, &w->in_b, err));
                LS_TRY(wrap_rows(e, &ml->in_a, &w->in_a, err));
            } else if (c->arch == LS_MODEL_QWEN3_5_MOE) {
                LS_TRY(wrap_rows(e, &ml->in_qkv, &w->in_qkv, err));
                LS_TRY(wrap_rows(e, &ml->in_z, &w->in_z, err));
                LS_TRY(wrap_rows(e, &ml->in_b, &w->in_b, err));
                LS_TRY(wrap_rows(e, &ml->in_a, &w->in_a, err));
            } else {
                LS_TRY(wrap_rows(e, &ml->qkvz, &w->qkvz, err));
                LS_TRY(wrap_rows(e, &ml->ba, &w->ba, err));
            }
            if (e->tp) LS_TRY(conv_rows(e, &ml->conv, l, &w->conv, err));
            else LS_TRY(wrap(e, &ml->conv, &w->conv, err));
            LS_TRY(wrap_rows(e, &ml->out_proj, &w->out_proj, err));
            /* this rank's value heads (all of them without TP) */
            LS_TRY(small(e, ml->A_log + e->tp_rank * Hv, Hv, &w->A_log, err));
            LS_TRY(small(e, ml->dt_bias + e->tp_rank * Hv, Hv, &w->dt_bias, err));
            LS_TRY(small(e, ml->gnorm, dv, &w->gnorm, err));
        }
        if (ffn) LS_TRY(wrap(e, &ml->router, &w->router, err));
        w->experts = calloc((size_t)(3 * E), sizeof(ls_bweight));
        if (!w->experts) return ls_fail_nomem(err, (size_t)(3 * E) * sizeof(ls_bweight), "engine: expert table of %ld experts", (long)E);
        for (long x = 0; x < E; x++) {
            if (!ffn || (e->ep && x / e->ep_per != e->ep_rank)) continue; /* another rank's expert */
            LS_TRY(wrap(e, &ml->exp_gate[x], &w->experts[x], err));
            LS_TRY(wrap(e, &ml->exp_up[x], &w->experts[E + x], err));
            LS_TRY(wrap(e, &ml->exp_down[x], &w->experts[2 * E + x], err));
        }
        if (ffn) {
            LS_TRY(wrap(e, &ml->sh_gate, &w->shg, err));
            LS_TRY(wrap(e, &ml->sh_up, &w->shu, err));
            LS_TRY(wrap(e, &ml->sh_down, &w->shd, err));
            LS_TRY(wrap(e, &ml->sh_gate_w, &w->shw, err));
        }
        w->moe = (ls_bmoe){E, D, c->moe_inter, c->shared_inter, w->experts, w->experts + E,
                           w->experts + 2 * E, &w->shg, &w->shu, &w->shd, &w->shw};
    }
    LS_TRY(prepare_linears(e, err));
    e->ss = calloc((size_t)e->max_seqs, sizeof *e->ss);
    if (!e->ss) return ls_fail_nomem(err, (size_t)e->max_seqs * sizeof *e->ss, "engine: state of %ld sequences", (long)e->max_seqs);
    if (e->paged) {
        /* One K and one V pool per attention layer, [pool_pages, Hkv, page, d];
         * a pool page id names the same page of every layer's pools. */
        e->kpool = calloc((size_t)L, sizeof(ls_buf *));
        e->vpool = calloc((size_t)L, sizeof(ls_buf *));
        e->free_pages = malloc(sizeof(int32_t) * (size_t)e->pool_pages);
        e->h_pt = calloc((size_t)(e->max_seqs * e->max_pages), sizeof(int32_t));
        e->pt_dirty = calloc((size_t)e->max_seqs, 1);
        if (!e->kpool || !e->vpool || !e->free_pages || !e->h_pt || !e->pt_dirty)
            return ls_fail_nomem(err, 2 * (size_t)L * sizeof(ls_buf *) + sizeof(int32_t) *
                                 (size_t)(e->pool_pages + e->max_seqs * e->max_pages) + (size_t)e->max_seqs,
                                 "engine: KV page tables (%ld pages)", e->pool_pages);
        /* popped from the top: page 0 first */
        for (long i = 0; i < e->pool_pages; i++) e->free_pages[i] = (int32_t)(e->pool_pages - 1 - i);
        e->n_free = e->pool_pages;
        LS_TRY(buf(e, e->max_seqs * e->max_pages, &e->pt, err));
        for (long l = 0; l < L; l++)
            if (c->is_attention[l]) {
                LS_TRY(buf(e, e->pool_pages * Hkv * e->page * d, &e->kpool[l], err));
                LS_TRY(buf(e, e->pool_pages * Hkv * e->page * d, &e->vpool[l], err));
            }
    }
    for (long s = 0; s < e->max_seqs; s++) {
        seq_state *q = &e->ss[s];
        q->conv = calloc((size_t)L, sizeof(ls_buf *));
        q->gdn = calloc((size_t)L, sizeof(ls_buf *));
        q->kc = calloc((size_t)L, sizeof(ls_buf *));
        q->vc = calloc((size_t)L, sizeof(ls_buf *));
        if (!q->conv || !q->gdn || !q->kc || !q->vc)
            return ls_fail_nomem(err, 4 * (size_t)L * sizeof(ls_buf *), "engine: state tables of sequence %ld", (long)s);
        for (long l = 0; l < L; l++) {
            if (c->is_attention[l] && e->paged) {
                q->kc[l] = e->kpool[l];
                q->vc[l] = e->vpool[l];
            } else if (c->is_attention[l]) {
                LS_TRY(buf(e, Hkv * e->cap * d, &q->kc[l], err));
                LS_TRY(buf(e, Hkv * e->cap * d, &q->vc[l], err));
            } else {
                LS_TRY(buf(e, e->conv_dim * K, &q->conv[l], err));
                LS_TRY(buf(e, e->gdn_floats, &q->gdn[l], err));
            }
        }
    }
    if (e->o.gdn_chunked) LS_TRY(buf(e, Hv * dk * dv, &e->gdn_mat, err));
    long Wq = Hq * 2 * d;
    LS_TRY(buf(e, 3 * T + T * R, &e->inb, err));
    LS_TRY(buf(e, T * D, &e->H, err));
    LS_TRY(buf(e, T * D, &e->H_next, err));
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
    e->lp_k = V < LS_LP_SUMMARY_KMAX ? V : LS_LP_SUMMARY_KMAX;
    LS_TRY(buf(e, T * LS_LP_SUMMARY_WORDS(e->lp_k), &e->lps, err));
    if (e->afd) {
        e->h_afd = malloc(sizeof(float) * (size_t)(T * (D + 2 * k)));
        e->afd_ns = calloc((size_t)(2 * e->c.n_layers), sizeof(uint64_t));
        if (!e->h_afd || !e->afd_ns)
            return ls_fail_nomem(err, sizeof(float) * (size_t)(T * (D + 2 * k)) +
                                          sizeof(uint64_t) * (size_t)(2 * e->c.n_layers),
                                 "engine: attention-FFN buffers for %ld rows", T);
    }
    if (e->tp) {
        long n = e->tp_max_n;
        LS_TRY(buf(e, T * (n / e->tp), &e->tp_out, err));
        /* attention split by head: the gathered mixer output [T, Hq d] for
         * o_proj, and the full K and V rows [T, Hkv d] for the KV digests */
        const ls_model_config *mc = &m->cfg;
        long hvd = mc->lin_v_heads * mc->lin_v_dim, hqd = mc->n_heads * mc->head_dim;
        LS_TRY(buf(e, T * (hvd > hqd ? hvd : hqd), &e->tp_in, err));
        /* a full GDN state [Hv, dk, dv] and conv state [conv_dim, K] for their digests */
        long cfull = 2 * mc->lin_k_heads * mc->lin_k_dim + hvd;
        LS_TRY(buf(e, hvd * mc->lin_k_dim, &e->gdn_full, err));
        LS_TRY(buf(e, cfull * K, &e->conv_full, err));
        LS_TRY(buf(e, T * mc->n_kv_heads * mc->head_dim, &e->k_full, err));
        LS_TRY(buf(e, T * mc->n_kv_heads * mc->head_dim, &e->v_full, err));
        long st = m->cfg.lin_v_heads * m->cfg.lin_v_dim * m->cfg.lin_k_dim;
        long cv = (2 * m->cfg.lin_k_heads * m->cfg.lin_k_dim + m->cfg.lin_v_heads * m->cfg.lin_v_dim) * K;
        if (T * n < st) n = (st + T - 1) / T;
        if (T * n < cv) n = (cv + T - 1) / T;
        e->h_tp_a = malloc(sizeof(float) * (size_t)(T * n));
        e->h_tp_b = malloc(sizeof(float) * (size_t)(T * n));
        if (!e->h_tp_a || !e->h_tp_b)
            return ls_fail_nomem(err, 2 * sizeof(float) * (size_t)(T * n),
                                 "engine: tensor-parallel buffers for %ld rows", T);
    }
    if (e->ep) {
        long P = T * (k + 1); /* (token, slot) pairs of a step, the shared slot included */
        LS_TRY(buf(e, 2 * P, &e->ep_pairs, err));
        LS_TRY(buf(e, P * D, &e->ep_rows, err));
        LS_TRY(buf(e, P * D, &e->ep_all, err));
        e->h_ids = malloc(sizeof(int32_t) * (size_t)(T * k));
        e->h_pairs = malloc(sizeof(int32_t) * (size_t)(2 * P));
        e->h_rows = malloc(sizeof(float) * (size_t)(P * D));
        e->h_all = malloc(sizeof(float) * (size_t)(P * D));
        e->ep_bytes = calloc((size_t)e->ep, sizeof(size_t));
        e->ep_base = calloc((size_t)e->ep, sizeof(long));
        if (!e->h_ids || !e->h_pairs || !e->h_rows || !e->h_all || !e->ep_bytes || !e->ep_base)
            return ls_fail_nomem(err, sizeof(float) * (size_t)(2 * P * D + 3 * P) +
                                 (size_t)e->ep * (sizeof(size_t) + sizeof(long)),
                                 "engine: expert-parallel buffers for %ld rows", T);
    }

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
    size_t host_bytes = 4 * (size_t)(3 * T + T * R) + 4 * (size_t)(T * LS_LP_SUMMARY_WORDS(e->lp_k)) +
                        sizeof(float) * (size_t)(T * V) + 8 * tmp + 2 * (size_t)(T * ns) * (sizeof *e->dig + 1 + sizeof *e->rec_dig) +
                        sizeof(int32_t) * (size_t)V + (size_t)T * (2 * sizeof *e->recs + sizeof *e->sg + sizeof *e->row_seq) +
                        (size_t)(4 * T + 16) * sizeof *e->jobs + 2 * (size_t)T * sizeof *e->lg_run;
    e->h_in = malloc(4 * (size_t)(3 * T + T * R));
    e->h_lp = malloc(sizeof(float) * (size_t)(T * V));
    e->h_lps = malloc(4 * (size_t)(T * LS_LP_SUMMARY_WORDS(e->lp_k)));
    e->h_tmp = malloc(sizeof(float) * tmp);
    e->h_bytes = malloc(4 * tmp);
    struct ls_engine_bank *b0 = &e->banks[0], *b1 = &e->banks[1];
    b0->dig = calloc(2 * (size_t)(T * ns), sizeof *b0->dig);
    b0->have = calloc(2 * (size_t)(T * ns), 1);
    e->sample_ids = malloc(sizeof(int32_t) * (size_t)V);
    b0->recs = calloc(2 * (size_t)T, sizeof *b0->recs);
    b0->rec_dig = calloc(2 * (size_t)(T * ns), sizeof *b0->rec_dig);
    e->jobs_cap = 4 * T + 16;
    e->jobs = calloc((size_t)e->jobs_cap, sizeof *e->jobs);
    b0->lg_run = calloc(2 * (size_t)T, sizeof *b0->lg_run);
    e->sg = calloc((size_t)T, sizeof *e->sg);
    e->row_seq = calloc((size_t)T, sizeof *e->row_seq);
    if (!e->h_in || !e->h_lp || !e->h_lps || !e->h_tmp ||
        !e->h_bytes || !b0->dig || !b0->have || !e->sample_ids || !b0->recs || !b0->rec_dig ||
        !e->jobs || !b0->lg_run || !e->sg || !e->row_seq)
        return ls_fail_nomem(err, host_bytes, "engine: host buffers for %ld rows", T);
    *b1 = (struct ls_engine_bank){b0->dig + T * ns, b0->have + T * ns, b0->recs + T, b0->rec_dig + T * ns,
                                  b0->lg_run + T, 0, 0, 0};
    use_bank(e, 0);
    e->graphs[0].have = calloc(2 * (size_t)ns, 1);
    e->graphs[0].dig = calloc(2 * (size_t)ns, sizeof *e->graphs[0].dig);
    if (!e->graphs[0].have || !e->graphs[0].dig)
        return ls_fail_nomem(err, 2 * (size_t)ns * (1 + sizeof *e->graphs[0].dig), "engine: step graph rows");
    e->graphs[1].have = e->graphs[0].have + ns;
    e->graphs[1].dig = e->graphs[0].dig + ns;
    e->graphs[0].slot = e->graphs[1].slot = -1;
    e->graphs_on = e->o.step_graphs;
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

/* The TP degree must divide what the group splits (docs/parallel.md §3.3):
 * the heads (the order-preserving form splits projection rows, which the
 * head counts divide; the head-split mixers will need it), the hidden size
 * (o_proj, out_proj), the vocabulary (lm_head) and, when the MoE runs
 * expert-parallel over this group, the experts. KV heads fewer than tp are
 * kept whole; more must divide. An FP8 matrix split by rows must keep its
 * 128-row scale blocks: rows per rank a multiple or a divisor of 128. */
ls_status ls_engine_check_tp(const ls_model *m, int tp, int ep_elsewhere, ls_error *err)
{
    const ls_model_config *c = &m->cfg;
    struct {
        const char *field;
        long v;
    } div[] = {{"num_attention_heads", c->n_heads}, {"linear_num_key_heads", c->lin_k_heads},
               {"linear_num_value_heads", c->lin_v_heads}, {"hidden_size", c->hidden},
               {"vocab_size", c->vocab}, {"num_experts", ep_elsewhere ? tp : c->n_experts}};
    int has_attn = 0, has_gdn = 0;
    for (long l = 0; l < c->n_layers; l++) {
        has_attn |= c->is_attention[l] != 0;
        has_gdn |= c->is_attention[l] == 0;
    }
    for (size_t i = 0; i < sizeof div / sizeof div[0]; i++) {
        if (i == 0 && !has_attn) continue;
        if ((i == 1 || i == 2) && !has_gdn) continue;
        if (div[i].v % tp != 0)
            return ls_fail(err, LS_E_UNSUPPORTED, "engine: %s %ld is not a multiple of tp %d",
                           div[i].field, div[i].v, tp);
    }
    long kv = c->n_kv_heads;
    if (has_attn && kv % tp != 0 && tp % kv != 0)
        return ls_fail(err, LS_E_UNSUPPORTED, "engine: num_key_value_heads %ld is neither a multiple "
                       "nor a divisor of tp %d", kv, tp);
    long kvn = kv % tp == 0 ? kv / tp : 1, share = kv % tp == 0 ? 1 : tp / kv; /* KV heads per rank */
    long Hk = c->lin_k_heads, dk = c->lin_k_dim, Hv = c->lin_v_heads, dv = c->lin_v_dim;
    for (long l = 0; l < c->n_layers; l++) {
        const ls_model_layer *ml = &m->layers[l];
        const struct {
            const char *name;
            const ls_wmat *w;
        } mats[] = {{"q_proj", &ml->q_proj}, {"k_proj", &ml->k_proj}, {"v_proj", &ml->v_proj},
                    {"o_proj", &ml->o_proj}, {"in_proj_qkvz", &ml->qkvz}, {"in_proj_ba", &ml->ba},
                    {"in_proj_qkv", &ml->in_qkv}, {"in_proj_z", &ml->in_z}, {"in_proj_b", &ml->in_b},
                    {"in_proj_a", &ml->in_a}, {"out_proj", &ml->out_proj}, {"lm_head", &m->lm_head}};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            const ls_wmat *w = mats[i].w;
            if ((!w->data && !w->gen) || !ls_wtype_is_f8(w->wtype) || (i == 11 && l > 0)) continue;
            for (long r = 0; r < tp; r++) {
                /* the row ranges rank r wraps: its KV heads; Qwen3.5's q, k
                 * and v sections of its heads; else rows r*N/tp.. */
                long start[3], n[3], np = 1;
                if (i == 1 || i == 2) {
                    n[0] = kvn * c->head_dim;
                    start[0] = (r / share) * n[0];
                } else if (i == 6) {
                    np = 3;
                    n[0] = n[1] = Hk / tp * dk;
                    n[2] = Hv / tp * dv;
                    start[0] = r * n[0];
                    start[1] = Hk * dk + r * n[1];
                    start[2] = 2 * Hk * dk + r * n[2];
                } else {
                    n[0] = w->rows / tp;
                    start[0] = r * n[0];
                }
                for (long p = 0; p < np; p++) {
                    if (start[p] % LS_FP8_BLOCK == 0 || start[p] / LS_FP8_BLOCK == (start[p] + n[p] - 1) / LS_FP8_BLOCK)
                        continue;
                    char where[64];
                    if (i == 11) snprintf(where, sizeof where, "lm_head");
                    else snprintf(where, sizeof where, "layer %ld %s", l, mats[i].name);
                    return ls_fail(err, LS_E_UNSUPPORTED, "engine: %s is FP8: rows %ld..%ld of rank %ld at "
                                   "tp %d split its %d-row scale blocks", where, start[p], start[p] + n[p] - 1,
                                   r, tp, LS_FP8_BLOCK);
                }
            }
        }
        if (!c->is_attention[l] && tp > 1 && (ml->conv.data || ml->conv.gen) && ls_wtype_is_f8(ml->conv.wtype))
            return ls_fail(err, LS_E_UNSUPPORTED, "engine: layer %ld conv1d is FP8: a tensor-parallel "
                           "rank copies its channels, which lockstep does for bf16 and fp32 only", l);
    }
    return LS_OK;
}

/* AFD's attention ranks A (afd_attention; 0 means 1). */
static int afd_attention_ranks(const ls_engine_opts *o)
{
    return o->afd_attention > 0 ? o->afd_attention : 1;
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
    if (o->kv_page < 0)
        return ls_fail(err, LS_E_USAGE, "engine: kv_page must be >= 0 (0 = contiguous; got %ld)", o->kv_page);
    if (o->kv_pool_pages < 0 || (o->kv_pool_pages > 0 && o->kv_page == 0))
        return ls_fail(err, LS_E_USAGE, "engine: kv_pool_pages %ld needs kv_page > 0 (and must be >= 0)",
                       o->kv_pool_pages);
    if (o->kv_page > 0) {
        /* the pool's elements must be addressable: pages x Hkv x page x d */
        long pages = o->kv_pool_pages ? o->kv_pool_pages : max_seqs * ((max_len + o->kv_page - 1) / o->kv_page);
        double elems = (double)pages * (double)o->kv_page * (double)m->cfg.n_kv_heads * (double)m->cfg.head_dim;
        if (o->kv_page > ((long)1 << 30) || pages > INT32_MAX || elems > 4e18)
            return ls_fail(err, LS_E_USAGE, "engine: kv_page %ld with %ld pages: a pool of %.3g elements "
                           "per layer is beyond what lockstep addresses", o->kv_page, pages, elems);
    }
    if (o->afd_comm) {
        /* A attention ranks and F FFN ranks; with A > 1 the attention ranks
         * split the mixers over tp_comm (their own A), with F > 1 the FFN
         * ranks the experts over ep_comm (their own F) */
        int n = ls_comm_size(o->afd_comm), r = ls_comm_rank(o->afd_comm);
        int A = afd_attention_ranks(o), F = n - A;
        int ok = F >= 1;
        if (ok && r < A)
            ok = !o->ep_comm && (A == 1 ? !o->tp_comm : o->tp_comm && ls_comm_size(o->tp_comm) == A);
        else if (ok)
            ok = !o->tp_comm && (F == 1 ? !o->ep_comm : o->ep_comm && ls_comm_size(o->ep_comm) == F);
        if (!ok)
            return ls_fail(err, LS_E_UNSUPPORTED, "engine: attention-FFN disaggregation runs on A + F ranks (A %d "
                           "attention, F FFN; the communicator has %d): with A > 1 each attention rank needs "
                           "tp_comm over the A attention ranks, with F > 1 each FFN rank ep_comm over the F FFN "
                           "ranks, and nothing else", A, n);
        /* the attention group's MoE is remote: its TP shapes only */
        if (r < A && A > 1) LS_TRY(ls_engine_check_tp(m, A, 1, err));
    } else if (o->tp_comm) {
        LS_TRY(ls_engine_check_tp(m, ls_comm_size(o->tp_comm), o->ep_comm != NULL, err));
    }
    if (o->ep_comm) {
        int ep = ls_comm_size(o->ep_comm);
        if (m->cfg.n_experts % ep != 0)
            return ls_fail(err, LS_E_UNSUPPORTED, "engine: num_experts %ld is not a multiple of the "
                           "%d expert-parallel ranks", (long)m->cfg.n_experts, ep);
    }
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
    if (st == LS_OK && o->perturb_fast && o->perturb_op != LS_PERTURB_NONE && !be->fast_twins)
        st = ls_fail(err, LS_E_UNSUPPORTED, "engine: backend %s has no fast twins (a fast-twin perturbation)",
                     be->name);
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
    e->paged = o->kv_page > 0;
    e->page = e->paged ? o->kv_page : max_len;
    e->max_pages = (max_len + e->page - 1) / e->page;
    e->kv_cap = e->max_pages * e->page;
    e->pool_pages = !e->paged ? 0 : o->kv_pool_pages ? o->kv_pool_pages : max_seqs * e->max_pages;
    if (o->afd_comm) {
        e->afd = ls_comm_size(o->afd_comm);
        e->afd_rank = ls_comm_rank(o->afd_comm);
        e->afd_att = afd_attention_ranks(o);
    }
    /* an attention rank of AFD has no MoE of its own */
    e->moe_comm = e->afd && e->afd_rank < e->afd_att ? NULL : o->ep_comm ? o->ep_comm : o->tp_comm;
    if (e->moe_comm) {
        e->ep = ls_comm_size(e->moe_comm);
        e->ep_rank = ls_comm_rank(e->moe_comm);
        e->ep_per = m->cfg.n_experts / e->ep;
    }
    if (o->tp_comm) {
        const ls_model_config *c = &m->cfg;
        e->tp = ls_comm_size(o->tp_comm);
        e->tp_rank = ls_comm_rank(o->tp_comm);
        long hv = c->lin_v_heads, hk = c->lin_k_heads;
        long widths[] = {c->vocab, c->hidden, c->n_heads * 2 * c->head_dim, c->n_kv_heads * c->head_dim,
                         2 * hk * c->lin_k_dim + 2 * hv * c->lin_v_dim, 2 * hv};
        for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
            if (widths[i] > e->tp_max_n) e->tp_max_n = widths[i];
        /* Attention is split by head: the engine's config holds this rank's
         * query heads and KV heads, so its caches and ops are the rank's.
         * KV heads fewer than tp: each rank holds the one its query heads
         * read, shared by tp / Hkv consecutive ranks (§3.3). */
        long hkv = c->n_kv_heads;
        e->c.n_heads = c->n_heads / e->tp;
        e->kv_share = hkv < 1 || hkv % e->tp == 0 ? 1 : e->tp / (int)hkv;
        e->c.n_kv_heads = hkv % e->tp == 0 ? hkv / e->tp : 1;
        e->kv_head0 = (e->tp_rank / e->kv_share) * e->c.n_kv_heads;
        /* gated DeltaNet split by head likewise: this rank's key heads and
         * the value heads of their groups */
        e->c.lin_k_heads = c->lin_k_heads / e->tp;
        e->c.lin_v_heads = c->lin_v_heads / e->tp;
    }
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

size_t ls_engine_weight_bytes(const ls_engine *e)
{
    return e->weight_bytes;
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

long ls_engine_kv_page(const ls_engine *e)
{
    return e->paged ? e->page : 0;
}

long ls_engine_kv_pool_pages(const ls_engine *e)
{
    return e->pool_pages;
}

long ls_engine_kv_pages_used(const ls_engine *e)
{
    return e->pool_pages - e->n_free;
}

const char *ls_engine_backend_name(const ls_engine *e)
{
    return e->be->name;
}

const ls_backend *ls_engine_backend(const ls_engine *e)
{
    return e->be;
}

/* ---- step API ------------------------------------------------------------------------ */

/* ---- KV pages ------------------------------------------------------------------------
 * Paged (kv_page > 0): a slot holds npages pool pages, its table's first
 * entries, enough for every position it has written or is about to. A page
 * is zeroed when taken (the rows a fresh sequence has not written are zero,
 * as in a contiguous cache) and goes back to the pool when the slot's
 * sequence leaves; its bits never reach another sequence, because attention
 * reads positions 0..pos only and each of them was written by its owner. */

/* Gives the slot pool pages until it holds enough for `positions`, all or
 * none. */
static ls_status pages_take(ls_engine *e, long slot, long positions, ls_error *err)
{
    seq_state *q = &e->ss[slot];
    long need = (positions + e->page - 1) / e->page;
    if (!e->paged || need <= q->npages) return LS_OK;
    if (need > e->max_pages)
        return ls_fail(err, LS_E_USAGE, "engine: sequence %u needs positions up to %ld (capacity %ld)", q->id,
                       positions, e->cap);
    if (need - q->npages > e->n_free)
        return ls_fail(err, LS_E_USAGE, "engine: the KV page pool is full (kv_pool_pages %ld of kv_page %ld "
                       "positions, %ld free): sequence %u needs %ld more for %ld positions; raise kv_pool_pages "
                       "or run fewer sequences at once", e->pool_pages, e->page, e->n_free, q->id,
                       need - q->npages, positions);
    const ls_model_config *c = &e->c;
    size_t per = (size_t)(c->n_kv_heads * e->page * c->head_dim); /* elements of a page */
    int32_t *pt = e->h_pt + slot * e->max_pages;
    for (; q->npages < need; q->npages++) {
        int32_t pg = e->free_pages[--e->n_free];
        pt[q->npages] = pg;
        for (long l = 0; l < c->n_layers; l++)
            if (c->is_attention[l]) {
                LS_TRY(e->be->zero(e->be, AT(e->kpool[l], (size_t)pg * per), per, err));
                LS_TRY(e->be->zero(e->be, AT(e->vpool[l], (size_t)pg * per), per, err));
            }
    }
    e->pt_dirty[slot] = 1;
    return LS_OK;
}

/* Returns the slot's pages to the pool. */
static void pages_release(ls_engine *e, long slot)
{
    seq_state *q = &e->ss[slot];
    if (!e->paged) return;
    const int32_t *pt = e->h_pt + slot * e->max_pages;
    while (q->npages > 0) e->free_pages[e->n_free++] = pt[--q->npages];
}

/* Uploads the page tables changed since the last step. */
static ls_status pages_upload(ls_engine *e, ls_error *err)
{
    for (long s = 0; e->paged && s < e->max_seqs; s++)
        if (e->pt_dirty[s]) {
            LS_TRY(e->be->upload(e->be, ls_engine_slot_pt(e, s), e->h_pt + s * e->max_pages,
                                 sizeof(int32_t) * (size_t)e->max_pages, err));
            e->pt_dirty[s] = 0;
        }
    return LS_OK;
}

/* Zeroes a slot's carried state: the state of a sequence at position 0 (a
 * paged slot holds no pages then: they are zeroed when taken). */
static ls_status slot_zero(ls_engine *e, seq_state *q, ls_error *err)
{
    const ls_model_config *c = &e->c;
    for (long l = 0; l < c->n_layers; l++) {
        if (c->is_attention[l] && e->paged) {
            continue;
        } else if (c->is_attention[l]) {
            size_t n = (size_t)(c->n_kv_heads * e->cap * c->head_dim);
            LS_TRY(e->be->zero(e->be, BEV(q->kc[l]), n, err));
            LS_TRY(e->be->zero(e->be, BEV(q->vc[l]), n, err));
        } else {
            LS_TRY(e->be->zero(e->be, BEV(q->conv[l]), (size_t)(e->conv_dim * c->conv_kernel), err));
            LS_TRY(e->be->zero(e->be, BEV(q->gdn[l]), (size_t)e->gdn_floats, err));
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
    pages_release(e, slot);
    LS_TRY(slot_zero(e, q, err));
    q->len = 0;
    q->id = seq_id;
    q->prompt_len = prompt_len > 0 ? prompt_len : 0;
    q->active = 1;
    return LS_OK;
}

/* Where a sequence's KV rows are: per-layer buffers and their layout
 * (ls_cpu_kv_row; pt NULL = contiguous, page = its capacity). */
typedef struct kv_at {
    ls_buf *const *kc, *const *vc;        /* [L] */
    const int32_t *pt;                    /* host page table or NULL */
    long page;
} kv_at;

static kv_at slot_kv(const ls_engine *e, long slot)
{
    const seq_state *q = &e->ss[slot];
    kv_at a = {q->kc, q->vc, e->paged ? e->h_pt + slot * e->max_pages : NULL, e->page};
    return a;
}

/* Copies len positions of carried state: the whole conv and GDN states and,
 * per attention layer and KV head, rows 0..len-1, in runs that stay within
 * one page of each side (a contiguous side is one page). */
static ls_status state_copy(ls_engine *e, ls_buf *const *dconv, ls_buf *const *dgdn, kv_at dst,
                            ls_buf *const *sconv, ls_buf *const *sgdn, kv_at src, long len,
                            ls_error *err)
{
    const ls_model_config *c = &e->c;
    long d = c->head_dim, Hkv = c->n_kv_heads;
    long nconv = e->conv_dim * c->conv_kernel, ngdn = e->gdn_floats;
    for (long l = 0; l < c->n_layers; l++) {
        if (c->is_attention[l]) {
            for (long p = 0; p < len;) {
                long n = len - p, rd = dst.page - p % dst.page, rs = src.page - p % src.page;
                if (n > rd) n = rd;
                if (n > rs) n = rs;
                /* one block per KV head: its n rows of d from position p (head h's
                 * rows are h pages of rows after head 0's in either layout) */
                ls_copy_shape kv = {1, Hkv, n * d, 0, dst.page * d, 0, src.page * d};
                size_t da = (size_t)(ls_cpu_kv_row(dst.pt, dst.page, Hkv, 0, p) * d);
                size_t sa = (size_t)(ls_cpu_kv_row(src.pt, src.page, Hkv, 0, p) * d);
                const ls_copy_job jobs[2] = {{AT(dst.kc[l], da), AT(src.kc[l], sa), kv},
                                             {AT(dst.vc[l], da), AT(src.vc[l], sa), kv}};
                LS_TRY(e->be->copy_blocks(e->be, jobs, 2, err));
                p += n;
            }
        } else {
            const ls_copy_job jobs[2] = {ls_copy_rows_job(BEV(dconv[l]), nconv, BEV(sconv[l]), nconv, 1, nconv),
                                         ls_copy_rows_job(BEV(dgdn[l]), ngdn, BEV(sgdn[l]), ngdn, 1, ngdn)};
            LS_TRY(e->be->copy_blocks(e->be, jobs, 2, err));
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
    pages_release(e, dst);
    LS_TRY(slot_zero(e, q, err));
    q->id = seq_id; /* named by a full pool's message */
    LS_TRY(pages_take(e, dst, p->len, err));
    LS_TRY(state_copy(e, q->conv, q->gdn, slot_kv(e, dst), p->conv, p->gdn, slot_kv(e, src), p->len,
                      err));
    q->len = p->len;
    q->prompt_len = p->prompt_len;
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
            LS_TRY(buf(e, e->gdn_floats, &s->gdn[l], err));
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
    kv_at to = {s->kc, s->vc, NULL, s->kv_cap};
    ls_status st = state_copy(e, s->conv, s->gdn, to, q->conv, q->gdn, slot_kv(e, slot), q->len, err);
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
    pages_release(e, slot);
    LS_TRY(slot_zero(e, q, err));
    q->id = seq_id; /* named by a full pool's message */
    LS_TRY(pages_take(e, slot, s->len, err));
    kv_at from = {s->kc, s->vc, NULL, s->kv_cap};
    LS_TRY(state_copy(e, q->conv, q->gdn, slot_kv(e, slot), s->conv, s->gdn, from, s->len, err));
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
    if (slot < 0 || slot >= e->max_seqs) return;
    e->ss[slot].active = 0;
    pages_release(e, slot);
}

long ls_engine_slot_len(const ls_engine *e, long slot)
{
    return slot >= 0 && slot < e->max_seqs ? e->ss[slot].len : -1;
}

static ls_status step(ls_engine *e, const ls_engine_item *items, long n_items, ls_error *err)
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
        e->sg[i] = (seg){it->slot, it->tokens, it->n, rows, e->ss[it->slot].len, it->last != 0,
                         it->follows != 0};
        rows += it->n;
    }
    /* Pages for the positions this step writes (past the capacity the
     * forward refuses the step). */
    for (long i = 0; i < n_items; i++) {
        long end = e->ss[items[i].slot].len + items[i].n;
        if (end <= e->cap) LS_TRY(pages_take(e, items[i].slot, end, err));
    }
    LS_TRY(pages_upload(e, err));
    return ls_engine_forward(e, e->sg, n_items, err);
}

/* One rank of an expert- or tensor-parallel group that fails tells the
 * others, which would otherwise wait for its rows until their deadline. */
static ls_status step_failed(ls_engine *e, ls_status st, const ls_error *err)
{
    ls_comm *comms[3] = {e->o.ep_comm, e->o.tp_comm, e->o.afd_comm};
    for (int i = 0; i < 3; i++)
        if (comms[i]) ls_comm_abort(comms[i], "%s", err && err->msg[0] ? err->msg : ls_status_name(st));
    return st;
}

ls_status ls_engine_step_begin(ls_engine *e, const ls_engine_item *items, long n_items, ls_error *err)
{
    int b = e->bank ^ 1;
    if (e->banks[b].pending)
        return ls_fail(err, LS_E_USAGE, "engine step: two steps are begun and not ended (ls_engine_step_end "
                       "ends the older)");
    use_bank(e, b);
    ls_status st = step(e, items, n_items, err);
    if (st != LS_OK) return step_failed(e, st, err);
    struct ls_engine_bank *k = &e->banks[b];
    k->pending = 1;
    k->rows = e->step_rows;
    k->mark = e->be->digest_mark ? e->be->digest_mark(e->be) : 0;
    return LS_OK;
}

/* Row r's digests in bank b into its record (what the row recorded, in slot
 * order). */
static void record_digests(ls_engine *e, int b, long r)
{
    const struct ls_engine_bank *k = &e->banks[b];
    long base = r * e->n_slots;
    ls_trace_digest *out = k->rec_dig + base;
    uint32_t n = 0;
    for (int s = 0; s < e->n_slots; s++)
        if (k->have[base + s]) out[n++] = k->dig[base + s];
    k->recs[r].n_digests = n;
    k->recs[r].digests = out;
}

ls_status ls_engine_step_end(ls_engine *e, ls_error *err)
{
    int b = e->banks[e->bank ^ 1].pending ? e->bank ^ 1 : e->bank;
    struct ls_engine_bank *k = &e->banks[b];
    if (!k->pending) return ls_fail(err, LS_E_USAGE, "engine: no step to end (none begun since the last end)");
    k->pending = 0;
    if (e->be->digest_wait) {
        ls_status st = e->be->digest_wait(e->be, k->mark, err);
        if (st != LS_OK) return step_failed(e, st, err);
    }
    for (long r = 0; r < k->rows; r++) record_digests(e, b, r);
    return LS_OK;
}

int ls_engine_pipelines(const ls_engine *e)
{
    return !e->dumping;
}

ls_status ls_engine_set_step_graphs(ls_engine *e, int on, ls_error *err)
{
    if (e->banks[0].pending || e->banks[1].pending)
        return ls_fail(err, LS_E_USAGE, "engine: step graphs switched while a begun step is not ended");
    for (int b = 0; b < 2; b++) {
        if (e->graphs[b].g && e->be->graph_free) e->be->graph_free(e->be, e->graphs[b].g);
        e->graphs[b].g = NULL;
        e->graphs[b].slot = -1;
    }
    e->graphs_on = on != 0;
    e->graph_warm = 0;
    e->graph_off[0] = '\0';
    return LS_OK;
}

void ls_engine_step_graph_stats(const ls_engine *e, long *records, long *launches, const char **off)
{
    *records = e->graph_records;
    *launches = e->graph_launches;
    *off = e->graph_off[0] ? e->graph_off : NULL;
}

ls_status ls_engine_step(ls_engine *e, const ls_engine_item *items, long n_items, ls_error *err)
{
    if (e->banks[0].pending || e->banks[1].pending)
        return ls_fail(err, LS_E_USAGE, "engine step: a step begun by ls_engine_step_begin is not ended");
    e->step_alone = 1;
    ls_status st = ls_engine_step_begin(e, items, n_items, err);
    e->step_alone = 0;
    return st == LS_OK ? ls_engine_step_end(e, err) : st;
}

long ls_engine_step_rows(const ls_engine *e)
{
    return e->step_rows;
}

ls_status ls_engine_lp_rows(ls_engine *e, ls_error *err)
{
    if (e->lp_full) return LS_OK;
    LS_TRY(e->be->download(e->be, e->h_lp, BEV(e->lp), sizeof(float) * (size_t)(e->step_rows * e->c.vocab),
                           err));
    e->lp_full = 1;
    return LS_OK;
}

static ls_status step_row(const ls_engine *e, long row, ls_error *err)
{
    if (row >= 0 && row < e->step_rows) return LS_OK;
    return ls_fail(err, LS_E_USAGE, "engine: row %ld of a step of %ld rows", row, e->step_rows);
}

/* Row's summary (ls_cpu_lp_summary's layout). */
static const uint32_t *lp_summary_row(const ls_engine *e, long row)
{
    return e->h_lps + row * LS_LP_SUMMARY_WORDS(e->lp_k);
}

ls_status ls_engine_logprobs(ls_engine *e, long row, const float **lp, ls_error *err)
{
    LS_TRY(step_row(e, row, err));
    LS_TRY(ls_engine_lp_rows(e, err));
    *lp = e->h_lp + row * e->c.vocab;
    return LS_OK;
}

ls_status ls_engine_sample(ls_engine *e, long row, const ls_sampling *s, uint32_t seq, uint32_t pos,
                           int32_t *token, ls_error *err)
{
    LS_TRY(step_row(e, row, err));
    const uint32_t *sm = lp_summary_row(e, row);
    if (s->kind == LS_SAMPLING_GREEDY && !sm[2 * e->lp_k + 1]) {
        *token = (int32_t)sm[0];
        return LS_OK;
    }
    const float *lp;
    LS_TRY(ls_engine_logprobs(e, row, &lp, err));
    return ls_sample_select(s, lp, e->c.vocab, seq, pos, e->sample_ids, token, err);
}

/* The bits of row's logprob of token next (0..V-1): from the rows when on the
 * host, else from the summary (the known next token, the top entries), else
 * one value's transfer. */
static ls_status lp_bits(ls_engine *e, long r, int32_t next, uint32_t *bits, ls_error *err)
{
    const uint32_t *sm = lp_summary_row(e, r);
    long k = e->lp_k;
    if (e->lp_full) {
        *bits = ls_f32_bits(e->h_lp[r * e->c.vocab + next]);
        return LS_OK;
    }
    if (next == e->h_next[r]) {
        *bits = sm[2 * k];
        return LS_OK;
    }
    for (long i = 0; i < k; i++)
        if (sm[i] == (uint32_t)next) {
            *bits = sm[k + i];
            return LS_OK;
        }
    return e->be->download(e->be, bits, AT(e->lp, r * e->c.vocab + next), 4, err);
}

ls_status ls_engine_record(ls_engine *e, long r, int32_t next, const ls_trace_record **rec_out,
                           ls_error *err)
{
    LS_TRY(step_row(e, r, err));
    ls_trace_record *rec = &e->recs[r];
    long V = e->c.vocab, k = e->lp_k;
    const uint32_t *sm = lp_summary_row(e, r);
    memset(rec, 0, sizeof *rec);
    rec->seq = (uint32_t)e->row_seq[r];
    rec->pos = (uint32_t)e->h_pos[r];
    rec->token = e->h_tok[r];
    rec->next_token = next;
    for (int i = 0; i < LS_TRACE_TOPK_MAX; i++) {
        rec->topk_ids[i] = -1;
        rec->topk_logprob_bits[i] = 0x7fc00000u;
    }
    if (sm[2 * k + 1]) { /* a NaN in the row: the CPU scan over the whole row */
        LS_TRY(ls_engine_lp_rows(e, err));
        float vals[LS_LP_SUMMARY_KMAX];
        ls_cpu_topk(e->h_lp + r * V, V, k, rec->topk_ids, vals);
        for (long i = 0; i < k; i++) rec->topk_logprob_bits[i] = ls_f32_bits(vals[i]);
    } else {
        for (long i = 0; i < k; i++) {
            rec->topk_ids[i] = (int32_t)sm[i];
            rec->topk_logprob_bits[i] = sm[k + i];
        }
    }
    rec->logprob_bits = 0x7fc00000u;
    if (next >= 0 && next < V) LS_TRY(lp_bits(e, r, next, &rec->logprob_bits, err));
    /* a step not ended yet gets its digests from ls_engine_step_end */
    if (!e->banks[e->bank].pending) record_digests(e, e->bank, r);
    long base = r * e->n_slots;
    uint32_t nd = 0;
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
    *rec_out = rec;
    return LS_OK;
}
