/* lockstep — a timing decorator over the CUDA backend; see bench_backend_timing.h. */
#include "bench_backend_timing.h"

#include "core/util.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One timed op (op i: events 2 i before it, 2 i + 1 after it). */
typedef struct op_rec {
    ls_bench_op op;
    long rows, cols;           /* bucket shape (see ls_bench_bucket) */
    uint64_t t0, host_ns;      /* the host clock after the first event; the host's time in the op */
} op_rec;

typedef struct timing {
    ls_backend *in;            /* the decorated backend; owned */
    int recording, census;
    int no_digests;            /* digest ops skipped (their outs zeroed) */
    op_rec *ops;               /* [cap_ops] recorded since the last collect */
    size_t n_ops, cap_ops;
    cudaEvent_t *ev;           /* [cap_ev] events 2 i and 2 i + 1 are op i's */
    size_t n_ev_made, cap_ev;  /* created on first use */
    ls_bench_bucket *bk;       /* [cap_bk] */
    size_t n_bk, cap_bk;
    int *distinct;             /* [cap_distinct] census: distinct experts per router call */
    size_t n_distinct, cap_distinct;
    int32_t *ids;              /* [cap_ids] census download buffer */
    size_t cap_ids;
    unsigned char *seen;       /* [cap_seen] census: expert seen in this call */
    size_t cap_seen;
} timing;

#define TM(be) ((timing *)(be)->impl)
#define IN(be) (TM(be)->in)

#define CU_TRY(call, err)                                                                    \
    do {                                                                                     \
        cudaError_t c_ = (call);                                                             \
        if (c_ != cudaSuccess)                                                               \
            return ls_fail((err), LS_E_DEVICE, "timing decorator: %s: %s", #call,           \
                           cudaGetErrorString(c_));                                          \
    } while (0)

static const char *const op_names[LS_BENCH_OP_COUNT] = {
    "(device idle between ops)", "upload", "download", "zero", "copy_blocks", "embed", "linear",
    "rmsnorm", "gated_rmsnorm", "conv_silu", "gdn_gates", "l2norm_scale", "gdn_recurrent",
    "rope_apply", "attention", "sigmoid_gate", "router", "moe", "logprobs",
    "conv_silu_batch", "gdn_recurrent_batch", "kv_append_batch", "attention_batch", "digest", "digest_wait",
    "lp_summary", "residual_rmsnorm"};

const char *ls_bench_op_name(ls_bench_op op)
{
    return op < LS_BENCH_OP_COUNT ? op_names[op] : "?";
}

/* ---- events ----------------------------------------------------------------------- */

/* p (elements of elem bytes, capacity *cap) grown to hold need, doubling;
 * NULL when out of memory (p is still valid then). */
static void *grow(void *p, size_t elem, size_t *cap, size_t need)
{
    if (need <= *cap) return p;
    size_t n = *cap ? 2 * *cap : 256;
    if (n < need) n = need;
    void *q = realloc(p, elem * n);
    if (q) *cap = n;
    return q;
}

#define GROW(a, cap, need, err)                                                              \
    do {                                                                                     \
        void *g_ = grow((a), sizeof *(a), &(cap), (need));                                   \
        if (!g_) return ls_fail((err), LS_E_NOMEM, "timing decorator: out of memory");      \
        (a) = g_;                                                                            \
    } while (0)

static ls_status event_at(timing *t, size_t i, ls_error *err)
{
    GROW(t->ev, t->cap_ev, i + 1, err);
    while (t->n_ev_made <= i) {
        CU_TRY(cudaEventCreate(&t->ev[t->n_ev_made]), err);
        t->n_ev_made++;
    }
    CU_TRY(cudaEventRecord(t->ev[i], 0), err);
    return LS_OK;
}

/* Before an op: its record and its first event. */
static ls_status op_begin(ls_backend *be, ls_bench_op op, long rows, long cols, ls_error *err)
{
    timing *t = TM(be);
    if (!t->recording) return LS_OK;
    GROW(t->ops, t->cap_ops, t->n_ops + 1, err);
    t->ops[t->n_ops] = (op_rec){op, rows, cols, 0, 0};
    LS_TRY(event_at(t, 2 * t->n_ops, err));
    t->ops[t->n_ops].t0 = ls_now_ns();
    return LS_OK;
}

/* After an op that returned st: its second event; returns st. */
static ls_status op_end(ls_backend *be, ls_status st, ls_error *err)
{
    timing *t = TM(be);
    if (!t->recording || st != LS_OK) return st;
    t->ops[t->n_ops].host_ns = ls_now_ns() - t->ops[t->n_ops].t0;
    LS_TRY(event_at(t, 2 * t->n_ops + 1, err));
    t->n_ops++;
    return LS_OK;
}

static ls_status add_span(timing *t, const op_rec *r, float ms, ls_error *err)
{
    size_t b = 0;
    while (b < t->n_bk && !(t->bk[b].op == r->op && t->bk[b].rows == r->rows &&
                            t->bk[b].cols == r->cols))
        b++;
    if (b == t->n_bk) {
        GROW(t->bk, t->cap_bk, t->n_bk + 1, err);
        ls_bench_bucket *n = &t->bk[t->n_bk++];
        memset(n, 0, sizeof *n);
        n->op = r->op;
        n->rows = r->rows;
        n->cols = r->cols;
        if (r->op == LS_BENCH_OP_LINEAR)
            snprintf(n->name, sizeof n->name, "linear [%ld x %ld]", r->rows, r->cols);
        else if (r->op == LS_BENCH_OP_RMSNORM)
            snprintf(n->name, sizeof n->name, "rmsnorm [n %ld]", r->cols);
        else
            snprintf(n->name, sizeof n->name, "%s", ls_bench_op_name(r->op));
    }
    t->bk[b].ms += ms;
    t->bk[b].host_ms += r->host_ns * 1e-6;
    t->bk[b].calls++;
    return LS_OK;
}

ls_status ls_bench_timing_collect(ls_backend *tb, ls_error *err)
{
    timing *t = TM(tb);
    size_t n = t->n_ops;
    t->n_ops = 0;
    if (n == 0) return LS_OK;
    CU_TRY(cudaEventSynchronize(t->ev[2 * n - 1]), err);
    static const op_rec idle = {LS_BENCH_OP_IDLE, 0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        float ms;
        CU_TRY(cudaEventElapsedTime(&ms, t->ev[2 * i], t->ev[2 * i + 1]), err);
        LS_TRY(add_span(t, &t->ops[i], ms, err));
        if (i == 0) continue;
        CU_TRY(cudaEventElapsedTime(&ms, t->ev[2 * i - 1], t->ev[2 * i]), err);
        LS_TRY(add_span(t, &idle, ms, err));
    }
    return LS_OK;
}

void ls_bench_timing_record(ls_backend *tb, int on)
{
    TM(tb)->recording = on;
}

const ls_bench_bucket *ls_bench_timing_buckets(const ls_backend *tb, int *n)
{
    *n = (int)TM(tb)->n_bk;
    return TM(tb)->bk;
}

void ls_bench_timing_clear(ls_backend *tb)
{
    TM(tb)->n_bk = 0;
}

/* ---- routing census ------------------------------------------------------------------ */

void ls_bench_timing_census(ls_backend *tb, int on)
{
    TM(tb)->census = on;
    if (on) TM(tb)->n_distinct = 0;
}

void ls_bench_timing_no_digests(ls_backend *tb, int on)
{
    TM(tb)->no_digests = on;
}

const int *ls_bench_timing_distinct(const ls_backend *tb, long *n)
{
    *n = (long)TM(tb)->n_distinct;
    return TM(tb)->distinct;
}

/* Counts the distinct ids among the T k routed by one router call. */
static ls_status census_add(ls_backend *be, const ls_bweight *w, ls_view ids, long T, long k,
                            ls_error *err)
{
    timing *t = TM(be);
    size_t n = (size_t)(T * k), E = (size_t)w->rows;
    GROW(t->ids, t->cap_ids, n, err);
    GROW(t->seen, t->cap_seen, E, err);
    GROW(t->distinct, t->cap_distinct, t->n_distinct + 1, err);
    LS_TRY(t->in->download(t->in, t->ids, ids, n * 4, err));
    memset(t->seen, 0, E);
    int d = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->ids[i];
        if (id < 0 || (size_t)id >= E)
            return ls_fail(err, LS_E_INTERNAL, "timing decorator: router id %d outside 0..%zu "
                           "at %zu", id, E - 1, i);
        d += !t->seen[id];
        t->seen[id] = 1;
    }
    t->distinct[t->n_distinct++] = d;
    return LS_OK;
}

/* ---- memory (forwarded; the step's transfers timed) ------------------------------------- */

static ls_status t_alloc(ls_backend *be, size_t bytes, ls_buf **out, ls_error *err)
{
    return IN(be)->alloc(IN(be), bytes, out, err);
}

static ls_status t_wrap_weights(ls_backend *be, const void *host, size_t bytes, ls_wtype wtype,
                                ls_buf **out, ls_error *err)
{
    return IN(be)->wrap_weights(IN(be), host, bytes, wtype, out, err);
}

static ls_status t_upload(ls_backend *be, ls_view dst, const void *src, size_t bytes, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_UPLOAD, 0, 0, err));
    return op_end(be, IN(be)->upload(IN(be), dst, src, bytes, err), err);
}

static ls_status t_download(ls_backend *be, void *dst, ls_view src, size_t bytes, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_DOWNLOAD, 0, 0, err));
    return op_end(be, IN(be)->download(IN(be), dst, src, bytes, err), err);
}

static ls_status t_zero(ls_backend *be, ls_view dst, size_t n, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_ZERO, 0, 0, err));
    return op_end(be, IN(be)->zero(IN(be), dst, n, err), err);
}

static ls_status t_copy_blocks(ls_backend *be, const ls_copy_job *jobs, int n, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_COPY_BLOCKS, 0, 0, err));
    return op_end(be, IN(be)->copy_blocks(IN(be), jobs, n, err), err);
}

static void t_destroy(ls_backend *be)
{
    if (!be) return;
    timing *t = TM(be);
    if (t) {
        if (t->in) t->in->destroy(t->in);
        for (size_t i = 0; i < t->n_ev_made; i++) (void)cudaEventDestroy(t->ev[i]);
        free(t->ev), free(t->ops), free(t->bk), free(t->distinct), free(t->ids), free(t->seen);
        free(t);
    }
    free(be);
}

/* ---- operators (forwarded, timed) ------------------------------------------------------ */

static ls_status t_embed(ls_backend *be, const ls_bweight *emb, ls_view tokens, long T, ls_view h,
                         int act_bf16, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_EMBED, 0, 0, err));
    return op_end(be, IN(be)->embed(IN(be), emb, tokens, T, h, act_bf16, err), err);
}

static ls_status t_prepare_linear(ls_backend *be, const ls_bweight *w, long max_rows, ls_error *err)
{
    return IN(be)->prepare_linear(IN(be), w, max_rows, err); /* before the run: not timed */
}

static ls_status t_linear(ls_backend *be, const ls_bweight *w, ls_view x, ls_view y, long T,
                          int act_bf16, ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_LINEAR, w->rows, w->cols, err));
    return op_end(be, IN(be)->linear(IN(be), w, x, y, T, act_bf16, order, err), err);
}

static ls_status t_rmsnorm(ls_backend *be, ls_view x, ls_view w, ls_view y, long R, long n,
                           int act_bf16, ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_RMSNORM, 0, n, err));
    return op_end(be, IN(be)->rmsnorm(IN(be), x, w, y, R, n, act_bf16, order, err), err);
}

static ls_status t_gated_rmsnorm(ls_backend *be, ls_view x, ls_view z, ls_view w, ls_view y, long R,
                                 long n, int act_bf16, ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_GATED_RMSNORM, 0, 0, err));
    return op_end(be, IN(be)->gated_rmsnorm(IN(be), x, z, w, y, R, n, act_bf16, order, err), err);
}

static ls_status t_conv_silu(ls_backend *be, ls_view x, long x_stride, const ls_bweight *w,
                             ls_view state, ls_view y, long y_stride, long T, long C, long K,
                             int act_bf16, ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_CONV_SILU, 0, 0, err));
    return op_end(be, IN(be)->conv_silu(IN(be), x, x_stride, w, state, y, y_stride, T, C, K,
                                        act_bf16, order, err), err);
}

static ls_status t_gdn_gates(ls_backend *be, ls_view b, ls_view a, ls_view A_log, ls_view dt_bias,
                             ls_view beta, ls_view alpha, long T, long H, int act_bf16,
                             ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_GDN_GATES, 0, 0, err));
    return op_end(be, IN(be)->gdn_gates(IN(be), b, a, A_log, dt_bias, beta, alpha, T, H, act_bf16,
                                        err), err);
}

static ls_status t_l2norm_scale(ls_backend *be, ls_view x, long R, long d, float scale,
                                ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_L2NORM_SCALE, 0, 0, err));
    return op_end(be, IN(be)->l2norm_scale(IN(be), x, R, d, scale, order, err), err);
}

static ls_status t_gdn_recurrent(ls_backend *be, ls_view q, ls_view k, ls_view v, ls_view alpha,
                                 ls_view beta, ls_view state, ls_view o, long T, long Hk, long Hv,
                                 long dk, long dv, int act_bf16, ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_GDN_RECURRENT, 0, 0, err));
    return op_end(be, IN(be)->gdn_recurrent(IN(be), q, k, v, alpha, beta, state, o, T, Hk, Hv, dk,
                                            dv, act_bf16, order, err), err);
}

static ls_status t_rope_apply(ls_backend *be, ls_view x, ls_view cos_t, ls_view sin_t, long T,
                              long H, long d, long R, int act_bf16, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_ROPE_APPLY, 0, 0, err));
    return op_end(be, IN(be)->rope_apply(IN(be), x, cos_t, sin_t, T, H, d, R, act_bf16, err), err);
}

static ls_status t_attention(ls_backend *be, ls_view q, ls_view kc, ls_view vc, ls_view pt,
                             long page, long cap, ls_view pos, ls_view o, long T, long Hq, long Hkv,
                             long d, int act_bf16, ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_ATTENTION, 0, 0, err));
    return op_end(be, IN(be)->attention(IN(be), q, kc, vc, pt, page, cap, pos, o, T, Hq, Hkv, d,
                                        act_bf16, order, err), err);
}

static ls_status t_sigmoid_gate(ls_backend *be, ls_view o, ls_view gate, long n, int act_bf16,
                                ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_SIGMOID_GATE, 0, 0, err));
    return op_end(be, IN(be)->sigmoid_gate(IN(be), o, gate, n, act_bf16, err), err);
}

static ls_status t_router(ls_backend *be, const ls_bweight *w, ls_view x, long T, long k,
                          int norm_topk, ls_view probs, ls_view ids, ls_view weights, int act_bf16,
                          ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_ROUTER, 0, 0, err));
    LS_TRY(op_end(be, IN(be)->router(IN(be), w, x, T, k, norm_topk, probs, ids, weights, act_bf16,
                                     order, err), err));
    return TM(be)->census ? census_add(be, w, ids, T, k, err) : LS_OK;
}

static ls_status t_moe(ls_backend *be, const ls_bmoe *mw, ls_view x, ls_view ids, ls_view weights,
                       long k, ls_view out, long T, int act_bf16, ls_order order_experts,
                       ls_order order_combine, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_MOE, 0, 0, err));
    return op_end(be, IN(be)->moe(IN(be), mw, x, ids, weights, k, out, T, act_bf16, order_experts,
                                  order_combine, err), err);
}

static ls_status t_residual_rmsnorm(ls_backend *be, ls_view h, ls_view a, ls_view out, ls_view w, ls_view y,
                                    long R, long n, int act_bf16, ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_RESIDUAL_RMSNORM, 0, 0, err));
    return op_end(be, IN(be)->residual_rmsnorm(IN(be), h, a, out, w, y, R, n, act_bf16, order, err), err);
}

static ls_status t_logprobs(ls_backend *be, ls_view logits, ls_view lp, long R, long V,
                            ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_LOGPROBS, 0, 0, err));
    return op_end(be, IN(be)->logprobs(IN(be), logits, lp, R, V, order, err), err);
}

static ls_status t_lp_summary(ls_backend *be, ls_view lp, ls_view next, long R, long V, long k,
                              ls_view out, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_LP_SUMMARY, 0, 0, err));
    return op_end(be, IN(be)->lp_summary(IN(be), lp, next, R, V, k, out, err), err);
}

static ls_status t_conv_silu_batch(ls_backend *be, ls_view x, long x_stride, const ls_bweight *w,
                                   ls_buf *const *states, const long *row0, const long *len,
                                   long nseq, ls_view y, long y_stride, long C, long K,
                                   int act_bf16, ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_CONV_SILU_BATCH, 0, 0, err));
    return op_end(be, IN(be)->conv_silu_batch(IN(be), x, x_stride, w, states, row0, len, nseq, y,
                                              y_stride, C, K, act_bf16, order, err), err);
}

static ls_status t_gdn_recurrent_batch(ls_backend *be, ls_view q, ls_view k, ls_view v,
                                       ls_view alpha, ls_view beta, ls_buf *const *states,
                                       const long *row0, const long *len, long nseq, ls_view o,
                                       long Hk, long Hv, long dk, long dv, int act_bf16,
                                       ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_GDN_RECURRENT_BATCH, 0, 0, err));
    return op_end(be, IN(be)->gdn_recurrent_batch(IN(be), q, k, v, alpha, beta, states, row0, len,
                                                  nseq, o, Hk, Hv, dk, dv, act_bf16, order, err),
                  err);
}

static ls_status t_kv_append_batch(ls_backend *be, ls_view k, ls_view v, ls_buf *const *kcs,
                                   ls_buf *const *vcs, const ls_view *pts, long page, long cap,
                                   const long *row0, const long *len, const long *pos0, ls_view pos,
                                   long nseq, long Hkv, long d, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_KV_APPEND_BATCH, 0, 0, err));
    return op_end(be, IN(be)->kv_append_batch(IN(be), k, v, kcs, vcs, pts, page, cap, row0, len,
                                              pos0, pos, nseq, Hkv, d, err), err);
}

static ls_status t_attention_batch(ls_backend *be, ls_view q, ls_buf *const *kcs,
                                   ls_buf *const *vcs, const ls_view *pts, long page, long cap,
                                   const long *row0, const long *len, long nseq, ls_view pos,
                                   ls_view o, long Hq, long Hkv, long d, int act_bf16,
                                   ls_order order, ls_error *err)
{
    LS_TRY(op_begin(be, LS_BENCH_OP_ATTENTION_BATCH, 0, 0, err));
    return op_end(be, IN(be)->attention_batch(IN(be), q, kcs, vcs, pts, page, cap, row0, len, nseq,
                                              pos, o, Hq, Hkv, d, act_bf16, order, err), err);
}

typedef ls_status (*digest_fn)(ls_backend *, const ls_digest_job *, long, ls_error *);

/* A digest call through the inner backend's fn (digest or digest_early). */
static ls_status timed_digest(ls_backend *be, digest_fn fn, const ls_digest_job *jobs, long n_jobs,
                              ls_error *err)
{
    if (TM(be)->no_digests) {
        for (long j = 0; j < n_jobs; j++)
            if (jobs[j].out) memset(jobs[j].out, 0, sizeof *jobs[j].out);
        return LS_OK;
    }
    LS_TRY(op_begin(be, LS_BENCH_OP_DIGEST, 0, 0, err));
    return op_end(be, fn(IN(be), jobs, n_jobs, err), err);
}

static ls_status t_digest(ls_backend *be, const ls_digest_job *jobs, long n_jobs, ls_error *err)
{
    return timed_digest(be, IN(be)->digest, jobs, n_jobs, err);
}

static ls_status t_digest_early(ls_backend *be, const ls_digest_job *jobs, long n_jobs, ls_error *err)
{
    return timed_digest(be, IN(be)->digest_early, jobs, n_jobs, err);
}

static ls_status t_digest_fence(ls_backend *be, ls_error *err)
{
    return IN(be)->digest_fence(IN(be), err);
}

/* Waits also without digests: a step begun before them may still be hashing. */
static ls_status t_digest_wait(ls_backend *be, uint64_t mark, ls_error *err)
{
    if (TM(be)->no_digests) return IN(be)->digest_wait(IN(be), mark, err);
    LS_TRY(op_begin(be, LS_BENCH_OP_DIGEST_WAIT, 0, 0, err));
    return op_end(be, IN(be)->digest_wait(IN(be), mark, err), err);
}

static uint64_t t_digest_mark(ls_backend *be)
{
    return IN(be)->digest_mark(IN(be));
}

/* Step graphs pass through; an instrumented step is not recorded (its
 * events would join the recording). */
static ls_status t_graph_begin(ls_backend *be, ls_graph **g, ls_error *err)
{
    if (TM(be)->recording)
        return ls_fail(err, LS_E_UNSUPPORTED, "timing decorator: a step graph is not recorded while ops are timed");
    return IN(be)->graph_begin(IN(be), g, err);
}

static ls_status t_graph_end(ls_backend *be, ls_graph *g, int keep, ls_error *err)
{
    return IN(be)->graph_end(IN(be), g, keep, err);
}

static ls_status t_graph_launch(ls_backend *be, ls_graph *g, ls_error *err)
{
    return IN(be)->graph_launch(IN(be), g, err);
}

static void t_graph_free(ls_backend *be, ls_graph *g)
{
    IN(be)->graph_free(IN(be), g);
}

/* ---- creation --------------------------------------------------------------------------- */

ls_status ls_bench_timing_create(ls_backend *inner, ls_backend **out, ls_error *err)
{
    *out = NULL;
    ls_backend *be = calloc(1, sizeof *be);
    timing *t = calloc(1, sizeof *t);
    if (!be || !t) {
        free(be);
        free(t);
        inner->destroy(inner);
        return ls_fail(err, LS_E_NOMEM, "timing decorator");
    }
    t->in = inner;
    be->impl = t;
    be->name = inner->name; /* the engine reports the backend it runs on */
    be->linear_by_column = inner->linear_by_column;
    be->alloc = t_alloc;
    be->wrap_weights = t_wrap_weights;
    be->upload = t_upload;
    be->download = t_download;
    be->zero = t_zero;
    be->copy_blocks = t_copy_blocks;
    be->destroy = t_destroy;
    be->embed = t_embed;
    be->linear = t_linear;
    if (inner->prepare_linear) be->prepare_linear = t_prepare_linear;
    be->rmsnorm = t_rmsnorm;
    be->gated_rmsnorm = t_gated_rmsnorm;
    be->conv_silu = t_conv_silu;
    be->gdn_gates = t_gdn_gates;
    be->l2norm_scale = t_l2norm_scale;
    be->gdn_recurrent = t_gdn_recurrent;
    be->rope_apply = t_rope_apply;
    be->attention = t_attention;
    be->sigmoid_gate = t_sigmoid_gate;
    be->router = t_router;
    be->moe = t_moe;
    be->residual_rmsnorm = t_residual_rmsnorm;
    be->logprobs = t_logprobs;
    be->lp_summary = t_lp_summary;
    /* Optional ops stay absent where the inner backend lacks them, so the
     * engine takes the same path through the decorator as without it. */
    be->conv_silu_batch = inner->conv_silu_batch ? t_conv_silu_batch : NULL;
    be->gdn_recurrent_batch = inner->gdn_recurrent_batch ? t_gdn_recurrent_batch : NULL;
    be->kv_append_batch = inner->kv_append_batch ? t_kv_append_batch : NULL;
    be->attention_batch = inner->attention_batch ? t_attention_batch : NULL;
    be->digest = inner->digest ? t_digest : NULL;
    be->digest_wait = inner->digest_wait ? t_digest_wait : NULL;
    be->digest_mark = inner->digest_mark ? t_digest_mark : NULL;
    be->digest_early = inner->digest_early ? t_digest_early : NULL;
    be->digest_fence = inner->digest_fence ? t_digest_fence : NULL;
    if (inner->graph_begin) {
        be->graph_begin = t_graph_begin;
        be->graph_end = t_graph_end;
        be->graph_launch = t_graph_launch;
        be->graph_free = t_graph_free;
    }
    *out = be;
    return LS_OK;
}
