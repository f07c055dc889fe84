/* lockstep — the CPU reference backend: the operator table of backend.h over
 * host buffers, each op a call of its cpu_ops.h function. Threads split
 * independent outputs only (output rows of a linear, heads of the GDN step
 * and of attention, expert slots of the MoE), so any thread count gives the
 * same bits. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/pool.h"
#include "core/util.h"
#include "numerics/reduce.h"

struct ls_buf {
    void *ptr;                 /* host memory; arena-owned or borrowed */
    size_t bytes;
};

typedef struct cpu_impl {
    ls_arena arena;            /* every buffer and ls_buf struct */
    ls_pool *pool;
    float **scratch;           /* [n_threads] per-thread scratch: what an op needs per worker
                                  lives here, never on a worker's stack (pool.h) */
    size_t *scratch_cap;       /* [n_threads] elements */
    float *slots;              /* MoE slot outputs [T, k + 1, D] */
    size_t slots_cap;
    float *xq;                 /* w8a8 linear: quantised input rows [T, in] + scales
                                  [T, LS_FP8_BLOCKS(in)] */
    size_t xq_cap;
} cpu_impl;

#define IMPL(be) ((cpu_impl *)(be)->impl)

static float *F(ls_view v)
{
    return (float *)v.buf->ptr + v.off;
}

static int32_t *I32(ls_view v)
{
    return (int32_t *)v.buf->ptr + v.off;
}

static ls_wmat wm(const ls_bweight *w)
{
    ls_wmat m = {(const char *)w->buf->ptr + w->off_bytes, w->wtype, w->rows, w->cols,
                 w->scale ? (const float *)w->scale->ptr : NULL, NULL, 0};
    return m;
}

/* Fails closed on an FP8 matrix for an op whose contract has no FP8 form. */
static ls_status require_plain(const ls_bweight *w, const char *op, ls_error *err)
{
    if (ls_wtype_is_f8(w->wtype))
        return ls_fail(err, LS_E_UNSUPPORTED, "cpu %s: FP8 weights [%ld, %ld] are not supported "
                       "here (bf16 or fp32 only)", op, w->rows, w->cols);
    return LS_OK;
}

static ls_status grow(float **p, size_t *cap, size_t need, ls_error *err)
{
    if (*cap >= need) return LS_OK;
    float *n = realloc(*p, need * sizeof(float));
    if (!n) return ls_fail_nomem(err, ls_bytes_mul(need, sizeof(float)), "cpu backend: scratch of %zu floats", need);
    *p = n;
    *cap = need;
    return LS_OK;
}

/* Every worker's scratch holds at least `need` floats. */
static ls_status grow_all(cpu_impl *im, size_t need, ls_error *err)
{
    int n = ls_pool_threads(im->pool);
    for (int i = 0; i < n; i++) LS_TRY(grow(&im->scratch[i], &im->scratch_cap[i], need, err));
    return LS_OK;
}

/* ---- memory -------------------------------------------------------------------- */

static ls_status cpu_alloc(ls_backend *be, size_t bytes, ls_buf **out, ls_error *err)
{
    ls_buf *b = ls_arena_alloc(&IMPL(be)->arena, sizeof *b, err);
    if (!b) return err ? err->status : LS_E_NOMEM;
    b->ptr = ls_arena_alloc(&IMPL(be)->arena, bytes ? bytes : 1, err);
    if (!b->ptr) return err ? err->status : LS_E_NOMEM;
    b->bytes = bytes;
    *out = b;
    return LS_OK;
}

static ls_status cpu_wrap(ls_backend *be, const void *host, size_t bytes, ls_wtype wtype,
                          ls_buf **out, ls_error *err)
{
    (void)wtype; /* the ops read the element type from ls_bweight */
    if (!host)
        return ls_fail(err, LS_E_UNSUPPORTED, "cpu backend: a weight matrix of %zu bytes has no "
                       "data and no generator: the CPU reference computes from weights in host "
                       "memory, or generates a synthetic model's (wrap_generated)", bytes);
    ls_buf *b = ls_arena_alloc(&IMPL(be)->arena, sizeof *b, err);
    if (!b) return err ? err->status : LS_E_NOMEM;
    b->ptr = (void *)(uintptr_t)host; /* borrowed, never written through */
    b->bytes = bytes;
    *out = b;
    return LS_OK;
}

/* A synthetic matrix's rows, generated into the arena (the backend owns
 * them, as it owns every buffer it allocates). */
static ls_status cpu_wrap_generated(ls_backend *be, const ls_wgen *gen, long r0, long rows,
                                    long cols, ls_wtype wtype, ls_buf **out, ls_buf **scale_out,
                                    ls_error *err)
{
    size_t bytes = (size_t)rows * (size_t)cols * (size_t)ls_wtype_bytes(wtype);
    ls_buf *b = NULL, *s = NULL;
    LS_TRY(cpu_alloc(be, bytes, &b, err));
    if (ls_wtype_is_f8(wtype))
        LS_TRY(cpu_alloc(be, sizeof(float) * (size_t)LS_FP8_BLOCKS(rows) *
                         (size_t)LS_FP8_BLOCKS(cols), &s, err));
    LS_TRY(gen->fill(gen, r0, rows, cols, b->ptr, s ? (float *)s->ptr : NULL, err));
    *out = b;
    if (scale_out) *scale_out = s;
    return LS_OK;
}

static ls_status check_range(ls_view v, size_t bytes, const char *what, ls_error *err)
{
    if (v.off * 4 > v.buf->bytes || bytes > v.buf->bytes - v.off * 4)
        return ls_fail(err, LS_E_INTERNAL, "cpu backend: %s of %zu bytes at element %zu is "
                       "outside a %zu-byte buffer", what, bytes, v.off, v.buf->bytes);
    return LS_OK;
}

static ls_status cpu_upload(ls_backend *be, ls_view dst, const void *src, size_t bytes,
                            ls_error *err)
{
    (void)be;
    LS_TRY(check_range(dst, bytes, "upload", err));
    memcpy(F(dst), src, bytes);
    return LS_OK;
}

static ls_status cpu_download(ls_backend *be, void *dst, ls_view src, size_t bytes, ls_error *err)
{
    (void)be;
    LS_TRY(check_range(src, bytes, "download", err));
    memcpy(dst, F(src), bytes);
    return LS_OK;
}

static ls_status cpu_zero(ls_backend *be, ls_view dst, size_t n, ls_error *err)
{
    (void)be;
    LS_TRY(check_range(dst, n * 4, "zero", err));
    memset(F(dst), 0, n * 4);
    return LS_OK;
}

static ls_status cpu_copy_blocks(ls_backend *be, const ls_copy_job *jobs, int n, ls_error *err)
{
    (void)be;
    if (n < 1 || n > LS_COPY_JOBS_MAX)
        return ls_fail(err, LS_E_USAGE, "cpu copy_blocks: %d jobs (1..%d)", n, LS_COPY_JOBS_MAX);
    for (int j = 0; j < n; j++) {
        const ls_copy_shape *sh = &jobs[j].sh;
        float *d = F(jobs[j].dst);
        const float *s = F(jobs[j].src);
        for (long r = 0; r < sh->rows; r++)
            for (long g = 0; g < sh->groups; g++)
                memcpy(d + r * sh->dst_stride + g * sh->dst_step, s + r * sh->src_stride + g * sh->src_step,
                       (size_t)sh->len * sizeof(float));
    }
    return LS_OK;
}

static void cpu_destroy(ls_backend *be)
{
    if (!be) return;
    cpu_impl *im = IMPL(be);
    if (im) {
        if (im->pool) {
            int n = ls_pool_threads(im->pool);
            for (int i = 0; i < n; i++) free(im->scratch[i]);
            ls_pool_destroy(im->pool);
        }
        free(im->scratch);
        free(im->scratch_cap);
        free(im->slots);
        free(im->xq);
        ls_arena_free(&im->arena);
        free(im);
    }
    free(be);
}

/* ---- operators ------------------------------------------------------------------- */

static ls_status cpu_embed(ls_backend *be, const ls_bweight *emb, ls_view tokens, long T, ls_view h,
                           int act_bf16, ls_error *err)
{
    (void)be;
    LS_TRY(require_plain(emb, "embed", err));
    ls_wmat m = wm(emb);
    const int32_t *tok = I32(tokens);
    for (long t = 0; t < T; t++)
        if (tok[t] < 0 || tok[t] >= m.rows)
            return ls_fail(err, LS_E_INPUT, "token id %d at row %ld is outside the vocabulary "
                           "(0..%ld)", tok[t], t, m.rows - 1);
    ls_cpu_embed(&m, tok, T, F(h), act_bf16);
    return LS_OK;
}

typedef struct linear_job {
    ls_wmat w;
    const float *x;
    const float *q, *xs;       /* w8a8: x quantised [T, in], its group scales */
    float *y;
    long T;
    int act;
    ls_order order;
} linear_job;

static void linear_part(void *ctx, int thread, long b, long e)
{
    (void)thread;
    linear_job *j = ctx;
    if (j->q) ls_cpu_linear_q(&j->w, j->q, j->xs, j->y, j->T, b, e, j->act, j->order);
    else ls_cpu_linear(&j->w, j->x, j->y, j->T, b, e, j->act, j->order);
}

static ls_status cpu_linear(ls_backend *be, const ls_bweight *w, ls_view x, ls_view y, long T,
                            int act_bf16, ls_order order, ls_error *err)
{
    cpu_impl *im = IMPL(be);
    linear_job j = {wm(w), F(x), NULL, NULL, F(y), T, act_bf16, order};
    if (w->wtype == LS_WTYPE_F8_W8A8) {
        /* every output row meets the same quantised input rows: quantise once */
        size_t nb = (size_t)LS_FP8_BLOCKS(w->cols);
        LS_TRY(grow(&im->xq, &im->xq_cap, (size_t)T * ((size_t)w->cols + nb), err));
        ls_cpu_fp8_quant_act(F(x), T, w->cols, im->xq, im->xq + (size_t)T * (size_t)w->cols);
        j.q = im->xq;
        j.xs = im->xq + (size_t)T * (size_t)w->cols;
    }
    ls_pool_run(im->pool, w->rows, linear_part, &j);
    return LS_OK;
}

static ls_status cpu_rmsnorm(ls_backend *be, ls_view x, ls_view w, ls_view y, long R, long n,
                             int act_bf16, ls_order order, ls_error *err)
{
    (void)be;
    (void)err;
    ls_cpu_rmsnorm(F(x), F(w), F(y), R, n, act_bf16, order);
    return LS_OK;
}

static ls_status cpu_gated_rmsnorm(ls_backend *be, ls_view x, ls_view z, ls_view w, ls_view y,
                                   long R, long n, int act_bf16, ls_order order, ls_error *err)
{
    (void)be;
    (void)err;
    ls_cpu_gated_rmsnorm(F(x), F(z), F(w), F(y), R, n, act_bf16, order);
    return LS_OK;
}

static ls_status cpu_conv_silu(ls_backend *be, ls_view x, long x_stride, const ls_bweight *w,
                               ls_view state, ls_view y, long y_stride, long T, long C, long K,
                               int act_bf16, ls_order order, ls_error *err)
{
    (void)be;
    LS_TRY(require_plain(w, "conv_silu", err));
    ls_wmat m = wm(w);
    ls_cpu_conv_silu(F(x), x_stride, &m, F(state), F(y), y_stride, T, C, K, act_bf16, order);
    return LS_OK;
}

static ls_status cpu_gdn_gates(ls_backend *be, ls_view b, ls_view a, ls_view A_log,
                               ls_view dt_bias, ls_view beta, ls_view alpha, long T, long H,
                               int act_bf16, ls_error *err)
{
    (void)be;
    (void)err;
    ls_cpu_gdn_gates(F(b), F(a), F(A_log), F(dt_bias), F(beta), F(alpha), T, H, act_bf16);
    return LS_OK;
}

static ls_status cpu_l2norm_scale(ls_backend *be, ls_view x, long R, long d, float scale,
                                  ls_order order, ls_error *err)
{
    (void)be;
    (void)err;
    ls_cpu_l2norm_scale(F(x), R, d, scale, order);
    return LS_OK;
}

typedef struct gdn_job {
    const float *q, *k, *v, *alpha, *beta;
    float *state, *o;
    long T, Hk, Hv, dk, dv;
    float *const *scratch;     /* [n_threads] */
    int act;
    ls_order order;
} gdn_job;

static void gdn_part(void *ctx, int thread, long b, long e)
{
    gdn_job *j = ctx;
    ls_cpu_gdn_recurrent_heads(j->q, j->k, j->v, j->alpha, j->beta, j->state, j->o, j->T, j->Hk,
                               j->Hv, j->dk, j->dv, b, e, j->scratch[thread], j->act, j->order);
}

static ls_status cpu_gdn_recurrent(ls_backend *be, ls_view q, ls_view k, ls_view v, ls_view alpha,
                                   ls_view beta, ls_view state, ls_view o, long T, long Hk,
                                   long Hv, long dk, long dv, int act_bf16, ls_order order,
                                   ls_error *err)
{
    if (dv > 1024 || dk > 4096)
        return ls_fail(err, LS_E_UNSUPPORTED, "cpu gdn_recurrent: d_v %ld > 1024", dv);
    cpu_impl *im = IMPL(be);
    LS_TRY(grow_all(im, LS_CPU_GDN_SCRATCH_FLOATS(dv), err));
    gdn_job j = {F(q), F(k), F(v), F(alpha), F(beta), F(state), F(o), T, Hk, Hv, dk, dv,
                 im->scratch, act_bf16, order};
    ls_pool_run(im->pool, Hv, gdn_part, &j);
    return LS_OK;
}

typedef struct gdn_chunked_job {
    gdn_job g;
    long pos0;
} gdn_chunked_job;

static void gdn_chunked_part(void *ctx, int thread, long b, long e)
{
    gdn_chunked_job *c = ctx;
    gdn_job *j = &c->g;
    ls_cpu_gdn_chunked_heads(j->q, j->k, j->v, j->alpha, j->beta, j->state, j->o, j->T, c->pos0, j->Hk, j->Hv,
                             j->dk, j->dv, b, e, j->scratch[thread], j->act, j->order);
}

static ls_status cpu_gdn_chunked(ls_backend *be, ls_view q, ls_view k, ls_view v, ls_view alpha, ls_view beta,
                                 ls_view state, ls_view o, long T, long pos0, long Hk, long Hv, long dk, long dv,
                                 int act_bf16, ls_order order, ls_error *err)
{
    if (dv > 1024 || dk > 4096)
        return ls_fail(err, LS_E_UNSUPPORTED, "cpu gdn_chunked: d_v %ld > 1024", dv);
    cpu_impl *im = IMPL(be);
    LS_TRY(grow_all(im, LS_CPU_GDN_CHUNK_SCRATCH_FLOATS(dv), err));
    gdn_chunked_job j = {{F(q), F(k), F(v), F(alpha), F(beta), F(state), F(o), T, Hk, Hv, dk, dv, im->scratch,
                          act_bf16, order},
                         pos0};
    ls_pool_run(im->pool, Hv, gdn_chunked_part, &j);
    return LS_OK;
}

typedef struct gdn_state_job {
    const float *state;
    float *out;
    long pos, Hv, dk, dv;
    float *const *scratch;
} gdn_state_job;

static void gdn_state_part(void *ctx, int thread, long b, long e)
{
    gdn_state_job *j = ctx;
    ls_cpu_gdn_chunked_state_heads(j->state, j->pos, j->Hv, j->dk, j->dv, b, e, j->out, j->scratch[thread]);
}

static ls_status cpu_gdn_chunked_state(ls_backend *be, ls_view state, long pos, ls_view s_out, long Hv, long dk,
                                       long dv, ls_error *err)
{
    cpu_impl *im = IMPL(be);
    LS_TRY(grow_all(im, LS_GDN_CHUNK, err));
    gdn_state_job j = {F(state), F(s_out), pos, Hv, dk, dv, im->scratch};
    ls_pool_run(im->pool, Hv, gdn_state_part, &j);
    return LS_OK;
}

static ls_status cpu_rope_apply(ls_backend *be, ls_view x, ls_view cos_t, ls_view sin_t, long T,
                                long H, long d, long R, int act_bf16, ls_error *err)
{
    cpu_impl *im = IMPL(be);
    if (R > 1024 || R > d || R % 2)
        return ls_fail(err, LS_E_UNSUPPORTED, "cpu rope: rotary dims %ld (head dim %ld)", R, d);
    LS_TRY(grow(&im->scratch[0], &im->scratch_cap[0], (size_t)R, err));
    ls_cpu_rope_apply(F(x), F(cos_t), F(sin_t), T, H, d, R, im->scratch[0], act_bf16);
    return LS_OK;
}

typedef struct att_job {
    const float *q, *kc, *vc;
    const int32_t *pt;         /* NULL: identity */
    long page, cap;
    const int32_t *pos;
    float *o;
    long T, Hq, Hkv, d;
    float *const *scratch;     /* [n_threads] */
    int act;
    ls_order order;
} att_job;

static void att_part(void *ctx, int thread, long b, long e)
{
    att_job *j = ctx;
    ls_cpu_attention_heads(j->q, j->kc, j->vc, j->pt, j->page, j->cap, j->pos, j->o, j->T, j->Hq,
                           j->Hkv, j->d, b, e, j->scratch[thread], j->act, j->order);
}

static ls_status cpu_attention(ls_backend *be, ls_view q, ls_view kc, ls_view vc, ls_view pt,
                               long page, long cap, ls_view pos, ls_view o, long T, long Hq,
                               long Hkv, long d, int act_bf16, ls_order order, ls_error *err)
{
    if (d > 1024) return ls_fail(err, LS_E_UNSUPPORTED, "cpu attention: head dim %ld > 1024", d);
    if (page < 1 || cap < 1 || cap % page)
        return ls_fail(err, LS_E_USAGE, "cpu attention: page %ld, cap %ld (a multiple of the page)",
                       page, cap);
    cpu_impl *im = IMPL(be);
    LS_TRY(grow_all(im, (size_t)d, err));
    att_job j = {F(q), F(kc), F(vc), pt.buf ? I32(pt) : NULL, page, cap, I32(pos), F(o), T, Hq, Hkv, d,
                 im->scratch, act_bf16, order};
    ls_pool_run(im->pool, Hq, att_part, &j);
    return LS_OK;
}

static ls_status cpu_sigmoid_gate(ls_backend *be, ls_view o, ls_view gate, long n, int act_bf16,
                                  ls_error *err)
{
    (void)be;
    (void)err;
    ls_cpu_sigmoid_gate(F(o), F(gate), n, act_bf16);
    return LS_OK;
}

static ls_status cpu_router(ls_backend *be, const ls_bweight *w, ls_view x, long T, long k,
                            int norm_topk, ls_view probs, ls_view ids, ls_view weights,
                            int act_bf16, ls_order order, ls_error *err)
{
    (void)be;
    /* the router's logits stay a plain DOT32 of a bf16/fp32 gate (the FP8
     * releases leave mlp.gate unconverted; the model refuses an FP8 one) */
    LS_TRY(require_plain(w, "router", err));
    ls_wmat m = wm(w);
    ls_cpu_router(&m, F(x), T, k, norm_topk, F(probs), I32(ids), F(weights), act_bf16, order);
    return LS_OK;
}

typedef struct moe_job {
    ls_moe_weights mw;
    const float *x;
    const int32_t *ids;
    const float *weights;
    long k, slots;             /* k routed + shared */
    float *c;                  /* [T, slots, D] */
    cpu_impl *im;
    int act;
    ls_order order;
} moe_job;

static void moe_part(void *ctx, int thread, long b, long e)
{
    moe_job *j = ctx;
    for (long it = b; it < e; it++) {
        long t = it / j->slots, i = it % j->slots;
        ls_cpu_moe_slot(&j->mw, j->x, j->ids, j->weights, j->k, t, i, j->c + it * j->mw.D,
                        j->im->scratch[thread], j->act, j->order);
    }
}

/* The ls_moe_weights of a backend MoE; mats [3E + 4] holds the matrices.
 * An expert whose weights are absent (an expert-parallel rank holds its own
 * only) gets an empty matrix (no data): moe_slots refuses a pair naming it. */
static void moe_table(const ls_bmoe *bm, ls_wmat *mats, ls_moe_weights *mw)
{
    static const ls_wmat none = {0};
    *mw = (ls_moe_weights){bm->E, bm->D, bm->I, bm->Is, mats, mats + bm->E, mats + 2 * bm->E,
                           NULL, NULL, NULL, NULL};
    for (long e = 0; e < bm->E; e++) {
        int have = bm->gate[e].buf && bm->up[e].buf && bm->down[e].buf;
        mats[e] = have ? wm(&bm->gate[e]) : none;
        mats[bm->E + e] = have ? wm(&bm->up[e]) : none;
        mats[2 * bm->E + e] = have ? wm(&bm->down[e]) : none;
    }
    if (bm->sh_gate) {
        ls_wmat *sh = mats + 3 * bm->E;
        sh[0] = wm(bm->sh_gate);
        sh[1] = wm(bm->sh_up);
        sh[2] = wm(bm->sh_down);
        sh[3] = wm(bm->sh_gate_w);
        mw->sh_gate = &sh[0];
        mw->sh_up = &sh[1];
        mw->sh_down = &sh[2];
        mw->sh_gate_w = &sh[3];
    }
}

/* The weight table and scratch for T tokens of slots each. */
static ls_status moe_prepare(cpu_impl *im, const ls_bmoe *bm, long T, long k, ls_wmat **mats,
                             ls_moe_weights *mw, ls_error *err)
{
    if (bm->sh_gate) LS_TRY(require_plain(bm->sh_gate_w, "moe (shared_expert_gate)", err));
    *mats = malloc(sizeof(ls_wmat) * (size_t)(3 * bm->E + 4));
    if (!*mats) return ls_fail_nomem(err, sizeof(ls_wmat) * (size_t)(3 * bm->E + 4), "cpu moe: weight table of %ld experts", bm->E);
    moe_table(bm, *mats, mw);
    size_t width = (size_t)(bm->I > bm->Is ? bm->I : bm->Is);
    ls_status st = grow(&im->slots, &im->slots_cap, (size_t)(T * (k + 1) * bm->D), err);
    if (st == LS_OK) st = grow_all(im, LS_CPU_EXPERT_SCRATCH((size_t)bm->D, width), err);
    if (st != LS_OK) {
        free(*mats);
        *mats = NULL;
    }
    return st;
}

static ls_status cpu_moe(ls_backend *be, const ls_bmoe *bm, ls_view x, ls_view ids,
                         ls_view weights, long k, ls_view out, long T, int act_bf16,
                         ls_order order_experts, ls_order order_combine, ls_error *err)
{
    cpu_impl *im = IMPL(be);
    ls_wmat *mats;
    ls_moe_weights mw;
    LS_TRY(moe_prepare(im, bm, T, k, &mats, &mw, err));
    long slots = k + (bm->sh_gate ? 1 : 0);
    moe_job j = {mw, F(x), I32(ids), F(weights), k, slots, im->slots, im, act_bf16, order_experts};
    ls_pool_run(im->pool, T * slots, moe_part, &j);
    for (long t = 0; t < T; t++)
        ls_cpu_moe_combine(im->slots + t * slots * bm->D, k, bm->D, bm->sh_gate != NULL,
                           F(out) + t * bm->D, act_bf16, order_combine);
    free(mats);
    return LS_OK;
}

typedef struct slots_job {
    ls_moe_weights mw;
    const float *x;
    const int32_t *ids, *pairs;           /* [T, k], [n, 2] */
    const float *weights;
    long k;
    float *c;                             /* [n, D] */
    cpu_impl *im;
    int act;
    ls_order order;
} slots_job;

static void slots_part(void *ctx, int thread, long b, long e)
{
    slots_job *j = ctx;
    for (long p = b; p < e; p++)
        ls_cpu_moe_slot(&j->mw, j->x, j->ids, j->weights, j->k, j->pairs[2 * p], j->pairs[2 * p + 1],
                        j->c + p * j->mw.D, j->im->scratch[thread], j->act, j->order);
}

static ls_status cpu_moe_slots(ls_backend *be, const ls_bmoe *bm, ls_view x, ls_view ids,
                               ls_view weights, long k, long T, ls_view pairs, long n, ls_view c,
                               int act_bf16, ls_order order_experts, ls_error *err)
{
    cpu_impl *im = IMPL(be);
    const int32_t *pr = I32(pairs), *id = I32(ids);
    long slots = k + (bm->sh_gate ? 1 : 0);
    for (long p = 0; p < n; p++) {
        long t = pr[2 * p], i = pr[2 * p + 1];
        if (t < 0 || t >= T || i < 0 || i >= slots)
            return ls_fail(err, LS_E_INTERNAL, "cpu moe_slots: pair %ld is (token %ld, slot %ld), "
                           "outside %ld tokens of %ld slots", p, t, i, T, slots);
        long e = i < k ? id[t * k + i] : -1;
        if (i < k && (e < 0 || e >= bm->E || !bm->gate[e].buf || !bm->up[e].buf || !bm->down[e].buf))
            return ls_fail(err, LS_E_INTERNAL, "cpu moe_slots: pair %ld (token %ld, slot %ld) names "
                           "expert %ld, whose weights this backend does not hold", p, t, i, e);
    }
    ls_wmat *mats;
    ls_moe_weights mw;
    LS_TRY(moe_prepare(im, bm, 0, k, &mats, &mw, err));
    slots_job j = {mw, F(x), id, pr, F(weights), k, F(c), im, act_bf16, order_experts};
    ls_pool_run(im->pool, n, slots_part, &j);
    free(mats);
    return LS_OK;
}

static ls_status cpu_moe_combine(ls_backend *be, ls_view c, long k, long D, int has_shared,
                                 ls_view out, long T, int act_bf16, ls_order order_combine,
                                 ls_error *err)
{
    (void)be;
    (void)err;
    long slots = k + (has_shared ? 1 : 0);
    for (long t = 0; t < T; t++)
        ls_cpu_moe_combine(F(c) + t * slots * D, k, D, has_shared, F(out) + t * D, act_bf16,
                           order_combine);
    return LS_OK;
}

static ls_status cpu_residual_rmsnorm(ls_backend *be, ls_view h, ls_view a, ls_view out, ls_view w,
                                      ls_view y, long R, long n, int act_bf16, ls_order order, ls_error *err)
{
    (void)be;
    (void)err;
    ls_cpu_residual(F(out), F(h), F(a), R * n, act_bf16);
    ls_cpu_rmsnorm(F(out), F(w), F(y), R, n, act_bf16, order);
    return LS_OK;
}

static ls_status cpu_logprobs(ls_backend *be, ls_view logits, ls_view lp, long R, long V,
                              ls_order order, ls_error *err)
{
    cpu_impl *im = IMPL(be);
    LS_TRY(grow(&im->scratch[0], &im->scratch_cap[0], (size_t)V, err));
    ls_cpu_logprobs(F(logits), F(lp), R, V, im->scratch[0], order);
    return LS_OK;
}

static ls_status cpu_lp_summary(ls_backend *be, ls_view lp, ls_view next, long R, long V, long k,
                                ls_view out, ls_error *err)
{
    (void)be;
    if (k < 1 || k > LS_LP_SUMMARY_KMAX || k > V)
        return ls_fail(err, LS_E_USAGE, "cpu lp_summary: k %ld not in 1..min(%d, V = %ld)", k,
                       LS_LP_SUMMARY_KMAX, V);
    ls_cpu_lp_summary(F(lp), I32(next), R, V, k, (uint32_t *)I32(out));
    return LS_OK;
}

/* ---- digests ---------------------------------------------------------------------- */

#define LS_DIGEST_BUF_BYTES 4096

typedef struct digest_ctx {
    const ls_digest_job *jobs;
    ls_status *st;             /* [n_jobs] */
    float *const *scratch;     /* [n_threads], each >= LS_DIGEST_BUF_BYTES */
} digest_ctx;

/* Hashes one span row by row, converting through buf (the worker's scratch). */
static ls_status digest_span(ls_sha256 *h, const ls_digest_span *sp, unsigned char *buf)
{
    const size_t buf_bytes = LS_DIGEST_BUF_BYTES;
    for (long r = 0; r < sp->rows; r++) {
        const float *row = F(sp->src) + r * sp->stride;
        for (long i = 0; i < sp->len;) {
            long n = 0;
            size_t len = 0;
            if (sp->bf16) {
                for (; i < sp->len && n < (long)buf_bytes / 2; i++, n++) {
                    uint16_t b = ls_f32_to_bf16(row[i]);
                    buf[len++] = (unsigned char)(b & 0xff);
                    buf[len++] = (unsigned char)(b >> 8);
                }
            } else {
                for (; i < sp->len && n < (long)buf_bytes / 4; i++, n++) {
                    uint32_t u;
                    memcpy(&u, &row[i], 4);
                    for (int k = 0; k < 4; k++) buf[len++] = (unsigned char)(u >> (8 * k));
                }
            }
            ls_status st = ls_sha256_update(h, buf, len, NULL);
            if (st != LS_OK) return st;
        }
    }
    return LS_OK;
}

static void digest_part(void *ctx, int thread, long b, long e)
{
    digest_ctx *c = ctx;
    unsigned char *buf = (unsigned char *)c->scratch[thread];
    for (long j = b; j < e; j++) {
        const ls_digest_job *job = &c->jobs[j];
        ls_sha256 whole = {NULL}, *h = job->run ? job->run : &whole;
        ls_status st = ls_sha256_resume(h, !job->run || job->first, NULL);
        for (int s = 0; st == LS_OK && s < 2; s++) st = digest_span(h, &job->span[s], buf);
        if (st != LS_OK) ls_sha256_discard(h);
        else if (job->out) st = ls_sha256_final(h, job->out, NULL);
        c->st[j] = st;
    }
}

static ls_status cpu_digest(ls_backend *be, const ls_digest_job *jobs, long n_jobs, ls_error *err)
{
    if (n_jobs <= 0) return LS_OK;
    for (long j = 0; j < n_jobs; j++) {
        if (!jobs[j].out && !jobs[j].run)
            return ls_fail(err, LS_E_INTERNAL, "cpu backend: digest job %ld has no destination", j);
        for (int s = 0; s < 2; s++) {
            const ls_digest_span *sp = &jobs[j].span[s];
            if (sp->rows == 0) continue;
            if (sp->rows < 0 || sp->len < 0 || sp->stride < sp->len)
                return ls_fail(err, LS_E_INTERNAL, "cpu backend: digest job %ld span %d has rows %ld, "
                               "len %ld, stride %ld", j, s, sp->rows, sp->len, sp->stride);
            size_t last = (size_t)((sp->rows - 1) * sp->stride + sp->len) * 4;
            LS_TRY(check_range(sp->src, last, "digest", err));
        }
    }
    cpu_impl *im = IMPL(be);
    LS_TRY(grow_all(im, LS_DIGEST_BUF_BYTES / sizeof(float), err));
    ls_status *st = calloc((size_t)n_jobs, sizeof *st);
    if (!st) return ls_fail_nomem(err, (size_t)n_jobs * sizeof *st, "cpu backend: status of %ld digest jobs", n_jobs);
    digest_ctx c = {jobs, st, im->scratch};
    ls_pool_run(im->pool, n_jobs, digest_part, &c);
    for (long j = 0; j < n_jobs; j++)
        if (st[j] != LS_OK) {
            ls_status s = st[j];
            free(st);
            return ls_fail(err, s, "cpu backend: SHA-256 of digest job %ld failed (OpenSSL)", j);
        }
    free(st);
    return LS_OK;
}

ls_status ls_backend_cpu_create(int n_threads, ls_backend **out, ls_error *err)
{
    ls_backend *be = calloc(1, sizeof *be);
    cpu_impl *im = calloc(1, sizeof *im);
    if (!be || !im) {
        free(be);
        free(im);
        return ls_fail_nomem(err, sizeof *be + sizeof *im, "cpu backend");
    }
    be->impl = im;
    be->destroy = cpu_destroy;
    ls_arena_init(&im->arena);
    ls_status st = ls_pool_create(n_threads, &im->pool, err);
    if (st != LS_OK) {
        im->pool = NULL;
        cpu_destroy(be);
        return st;
    }
    im->scratch = calloc((size_t)n_threads, sizeof(float *));
    im->scratch_cap = calloc((size_t)n_threads, sizeof(size_t));
    if (!im->scratch || !im->scratch_cap) {
        cpu_destroy(be);
        return ls_fail_nomem(err, (size_t)n_threads * (sizeof(float *) + sizeof(size_t)),
                             "cpu backend: scratch table of %d threads", n_threads);
    }
    be->name = "cpu";
    be->linear_by_column = 1;
    be->alloc = cpu_alloc;
    be->wrap_weights = cpu_wrap;
    be->wrap_generated = cpu_wrap_generated;
    be->upload = cpu_upload;
    be->download = cpu_download;
    be->zero = cpu_zero;
    be->copy_blocks = cpu_copy_blocks;
    be->embed = cpu_embed;
    be->linear = cpu_linear;
    be->rmsnorm = cpu_rmsnorm;
    be->gated_rmsnorm = cpu_gated_rmsnorm;
    be->conv_silu = cpu_conv_silu;
    be->gdn_gates = cpu_gdn_gates;
    be->l2norm_scale = cpu_l2norm_scale;
    be->gdn_recurrent = cpu_gdn_recurrent;
    be->gdn_chunked = cpu_gdn_chunked;
    be->gdn_chunked_state = cpu_gdn_chunked_state;
    be->rope_apply = cpu_rope_apply;
    be->attention = cpu_attention;
    be->sigmoid_gate = cpu_sigmoid_gate;
    be->router = cpu_router;
    be->moe = cpu_moe;
    be->moe_slots = cpu_moe_slots;
    be->moe_combine = cpu_moe_combine;
    be->residual_rmsnorm = cpu_residual_rmsnorm;
    be->logprobs = cpu_logprobs;
    be->lp_summary = cpu_lp_summary;
    be->digest = cpu_digest;
    *out = be;
    return LS_OK;
}
