/* lockstep — CPU reference of the router and the MoE block (the kernels of
 * kernels/ops_moe.cu); see cpu_ops.h and docs/numerics.md §3. */
#include "backend/cpu_ops.h"

#include <math.h>

#include "numerics/lsmath.h"

/* ---- router -------------------------------------------------------------- */

void ls_cpu_router(const ls_wmat *w, const float *x, long T, long k, int norm_topk, float *probs,
                   int32_t *ids, float *weights, int act_bf16, ls_order order)
{
    long E = w->rows, D = w->cols;
    for (long t = 0; t < T; t++) {
        float *pr = probs + t * E; /* [E] */
        ls_cpu_linear(w, x + t * D, pr, 1, 0, E, act_bf16, order);
        float m = -INFINITY;
        for (long e = 0; e < E; e++)
            if (pr[e] > m) m = pr[e];
        for (long e = 0; e < E; e++) pr[e] = ls_expf(pr[e] - m);
        float sum = ls_cpu_sum(pr, E, order);
        for (long e = 0; e < E; e++) pr[e] = pr[e] / sum;
        int32_t *id = ids + t * k; /* [k] */
        float *wt = weights + t * k; /* [k] */
        ls_cpu_topk(pr, E, k, id, wt);
        if (norm_topk) {
            float s = 0.0f;
            if (order == LS_ORDER_CANONICAL)
                for (long i = 0; i < k; i++) s = s + wt[i];
            else
                for (long i = k - 1; i >= 0; i--) s = ls_round_bf16(s + wt[i]);
            for (long i = 0; i < k; i++) wt[i] = ls_act(wt[i] / s, act_bf16);
        } else {
            for (long i = 0; i < k; i++) wt[i] = ls_act(wt[i], act_bf16);
        }
    }
}

/* ---- experts and combine ------------------------------------------------- */

/* y = act(W x) for one token, W of any weight type: a w8a8 matrix meets x's
 * quantised row (q, xs), quantised on first use (*have). */
static void expert_linear(const ls_wmat *w, const float *x, float *q, float *xs, int *have,
                          float *y, int act_bf16, ls_order order)
{
    if (w->wtype != LS_WTYPE_F8_W8A8) {
        ls_cpu_linear(w, x, y, 1, 0, w->rows, act_bf16, order);
        return;
    }
    if (!*have) ls_cpu_fp8_quant_act(x, 1, w->cols, q, xs);
    *have = 1;
    ls_cpu_linear_q(w, q, xs, y, 1, 0, w->rows, act_bf16, order);
}

void ls_cpu_expert(const ls_wmat *wg, const ls_wmat *wu, const ls_wmat *wd, const float *x,
                   float *y, float *scratch, int act_bf16, ls_order order)
{
    long I = wg->rows, D = wg->cols;
    float *g = scratch;                    /* [I] */
    float *u = g + I;                      /* [I] */
    float *xq = u + I;                     /* [D] x quantised (w8a8) */
    float *xs = xq + D;                    /* [LS_FP8_BLOCKS(D)] */
    float *mq = xs + LS_FP8_BLOCKS(D);     /* [I] m quantised (w8a8) */
    float *ms = mq + I;                    /* [LS_FP8_BLOCKS(I)] */
    int have_x = 0, have_m = 0;
    expert_linear(wg, x, xq, xs, &have_x, g, act_bf16, order);
    expert_linear(wu, x, xq, xs, &have_x, u, act_bf16, order);
    for (long i = 0; i < I; i++) {
        float sg = ls_act(ls_siluf(g[i]), act_bf16);
        g[i] = ls_act(sg * u[i], act_bf16);
    }
    expert_linear(wd, g, mq, ms, &have_m, y, act_bf16, order);
}

void ls_cpu_moe_slot(const ls_moe_weights *mw, const float *x, const int32_t *ids,
                     const float *weights, long k, long t, long i, float *c, float *scratch,
                     int act_bf16, ls_order order_experts)
{
    long D = mw->D;
    const float *xt = x + t * D; /* [D] */
    if (i < k) {
        long e = ids[t * k + i];
        float w = weights[t * k + i];
        ls_cpu_expert(&mw->gate[e], &mw->up[e], &mw->down[e], xt, c, scratch, act_bf16,
                      order_experts);
        for (long j = 0; j < D; j++) c[j] = ls_act(c[j] * w, act_bf16);
        return;
    }
    ls_cpu_expert(mw->sh_gate, mw->sh_up, mw->sh_down, xt, c, scratch, act_bf16, order_experts);
    float gl = ls_act(ls_cpu_dot_wrow(mw->sh_gate_w, 0, xt, order_experts), act_bf16);
    float gamma = ls_act(ls_sigmoidf(gl), act_bf16);
    for (long j = 0; j < D; j++) c[j] = ls_act(gamma * c[j], act_bf16);
}

void ls_cpu_moe_combine(const float *c, long k, long D, int has_shared, float *out, int act_bf16,
                        ls_order order_combine)
{
    for (long j = 0; j < D; j++) {
        float s = 0.0f;
        if (order_combine == LS_ORDER_REVERSED) {
            /* Perturbed: one fp32 sum from the shared expert down to the first
             * routed slot, rounded once (with k = 2 a mere reordering of the
             * routed sum could not change a bit). */
            if (has_shared) s = c[k * D + j];
            for (long i = k - 1; i >= 0; i--) s = s + c[i * D + j];
            out[j] = ls_act(s, act_bf16);
            continue;
        }
        for (long i = 0; i < k; i++) s = s + c[i * D + j];
        float routed = ls_act(s, act_bf16);
        out[j] = has_shared ? ls_act(routed + c[k * D + j], act_bf16) : routed;
    }
}

void ls_cpu_moe(const ls_moe_weights *mw, const float *x, const int32_t *ids, const float *weights,
                long k, float *out, long t0, long t1, float *scratch, int act_bf16,
                ls_order order_experts, ls_order order_combine)
{
    long D = mw->D;
    float *c = scratch;                  /* [k + 1, D] slot outputs */
    float *tmp = scratch + (k + 1) * D;  /* [2 max(I, Is)] */
    int has_shared = mw->sh_gate != NULL;
    for (long t = t0; t < t1; t++) {
        for (long i = 0; i < k + has_shared; i++)
            ls_cpu_moe_slot(mw, x, ids, weights, k, t, i, c + i * D, tmp, act_bf16,
                            order_experts);
        ls_cpu_moe_combine(c, k, D, has_shared, out + t * D, act_bf16, order_combine);
    }
}
