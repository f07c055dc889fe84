/* lockstep — CPU reference operators; see cpu_ops.h and docs/numerics.md. */
#include "backend/cpu_ops.h"

#include <math.h>
#include <string.h>

#include "numerics/lsmath.h"

/* ---- reductions ------------------------------------------------------------ */

float ls_cpu_dot(const float *a, const float *b, long n, ls_order order)
{
    if (order == LS_ORDER_CANONICAL) return ls_dot32_f32(a, b, n);
    float s = 0.0f;
    for (long k = n - 1; k >= 0; k--) {
        float prod = a[k] * b[k];
        s = ls_round_bf16(s + prod);
    }
    return s;
}

float ls_cpu_dot_wrow(const ls_wmat *w, long r, const float *x, ls_order order)
{
    long n = w->cols;
    if (w->wtype == LS_WTYPE_BF16) {
        const uint16_t *row = (const uint16_t *)w->data + r * n; /* [n] */
        if (order == LS_ORDER_CANONICAL) return ls_dot32_bf16(row, x, n);
        float s = 0.0f;
        for (long k = n - 1; k >= 0; k--) {
            float prod = ls_bf16_to_f32(row[k]) * x[k];
            s = ls_round_bf16(s + prod);
        }
        return s;
    }
    return ls_cpu_dot((const float *)w->data + r * n, x, n, order);
}

float ls_cpu_sum(const float *a, long n, ls_order order)
{
    if (order == LS_ORDER_CANONICAL) return ls_sum32(a, n);
    float s = 0.0f;
    for (long k = n - 1; k >= 0; k--) s = ls_round_bf16(s + a[k]);
    return s;
}

/* ---- elementwise / rows ---------------------------------------------------- */

void ls_cpu_embed(const ls_wmat *emb, const int32_t *tokens, long T, float *h, int act_bf16)
{
    long D = emb->cols;
    for (long t = 0; t < T; t++)
        for (long i = 0; i < D; i++) h[t * D + i] = ls_act(ls_wmat_at(emb, tokens[t], i), act_bf16);
}

void ls_cpu_linear(const ls_wmat *w, const float *x, float *y, long T, long o0, long o1,
                   int act_bf16, ls_order order)
{
    long in = w->cols, out = w->rows;
    for (long t = 0; t < T; t++)
        for (long o = o0; o < o1; o++)
            y[t * out + o] = ls_act(ls_cpu_dot_wrow(w, o, x + t * in, order), act_bf16);
}

static float rms_factor(const float *x, long n, ls_order order)
{
    float ss = ls_cpu_dot(x, x, n, order);
    float ms = ss / (float)n;
    return ls_rsqrtf(ms + 1e-6f);
}

void ls_cpu_rmsnorm(const float *x, const float *w, float *y, long R, long n, int act_bf16,
                    ls_order order)
{
    for (long r = 0; r < R; r++) {
        const float *xr = x + r * n; /* [n] */
        float *yr = y + r * n;       /* [n] */
        float f = rms_factor(xr, n, order);
        for (long i = 0; i < n; i++) {
            float onew = 1.0f + w[i];
            float xn = xr[i] * f;
            yr[i] = ls_act(xn * onew, act_bf16);
        }
    }
}

void ls_cpu_gated_rmsnorm(const float *x, const float *z, const float *w, float *y, long R, long n,
                          int act_bf16, ls_order order)
{
    for (long r = 0; r < R; r++) {
        const float *xr = x + r * n; /* [n] */
        const float *zr = z + r * n; /* [n] */
        float *yr = y + r * n;       /* [n] */
        float f = rms_factor(xr, n, order);
        for (long i = 0; i < n; i++) {
            float nn = ls_act(xr[i] * f, act_bf16);
            float p = ls_act(w[i] * nn, act_bf16);
            yr[i] = ls_act(p * ls_siluf(zr[i]), act_bf16);
        }
    }
}

void ls_cpu_conv_silu(const float *x, long x_stride, const ls_wmat *w, float *state, float *y,
                      long y_stride, long T, long C, long K, int act_bf16, ls_order order)
{
    for (long t = 0; t < T; t++) {
        for (long c = 0; c < C; c++) {
            float *st = state + c * K; /* [K] */
            float xt = x[t * x_stride + c];
            float s = 0.0f;
            if (order == LS_ORDER_CANONICAL) {
                for (long j = 0; j < K; j++) {
                    float win = (j == K - 1) ? xt : st[j + 1];
                    float prod = ls_wmat_at(w, c, j) * win;
                    s = s + prod;
                }
            } else {
                for (long j = K - 1; j >= 0; j--) {
                    float win = (j == K - 1) ? xt : st[j + 1];
                    float prod = ls_wmat_at(w, c, j) * win;
                    s = ls_round_bf16(s + prod);
                }
            }
            for (long j = 0; j + 1 < K; j++) st[j] = st[j + 1];
            st[K - 1] = xt;
            y[t * y_stride + c] = ls_act(ls_siluf(ls_act(s, act_bf16)), act_bf16);
        }
    }
}

void ls_cpu_gdn_gates(const float *b, const float *a, const float *A_log, const float *dt_bias,
                      float *beta, float *alpha, long T, long H, int act_bf16)
{
    for (long t = 0; t < T; t++)
        for (long h = 0; h < H; h++) {
            beta[t * H + h] = ls_act(ls_sigmoidf(b[t * H + h]), act_bf16);
            float sp = ls_softplusf(a[t * H + h] + dt_bias[h]);
            float g = -ls_expf(A_log[h]) * sp;
            alpha[t * H + h] = ls_expf(g);
        }
}

void ls_cpu_l2norm_scale(float *x, long R, long d, float scale, ls_order order)
{
    for (long r = 0; r < R; r++) {
        float *xr = x + r * d; /* [d] */
        float f = ls_rsqrtf(ls_cpu_dot(xr, xr, d, order) + 1e-6f);
        for (long i = 0; i < d; i++) {
            float v = xr[i] * f;
            xr[i] = v * scale;
        }
    }
}

float ls_cpu_inv_sqrt_scale(long d)
{
    return (float)(1.0 / sqrt((double)d));
}

/* Column dot products DOT32_i(S[i][j], vec_i) for all j at once: lane
 * partials P[l][j] accumulate rows i ≡ l (mod 32) in ascending i, then the
 * butterfly per column, which is LS_DOT32 for every column (same operations
 * in the same order, just interleaved across columns). */
static void col_dots(const float *S /* [dk, dv] */, const float *vec /* [dk] */, long dk, long dv,
                     float *out /* [dv] */, float *P /* [32, dv] */, ls_order order)
{
    if (order == LS_ORDER_REVERSED) {
        for (long j = 0; j < dv; j++) out[j] = 0.0f;
        for (long i = dk - 1; i >= 0; i--)
            for (long j = 0; j < dv; j++) {
                float prod = S[i * dv + j] * vec[i];
                out[j] = ls_round_bf16(out[j] + prod);
            }
        return;
    }
    memset(P, 0, sizeof(float) * LS_LANES * (size_t)dv);
    for (long i = 0; i < dk; i++) {
        float *p = P + (i % LS_LANES) * dv;
        const float *s = S + i * dv;
        float vi = vec[i];
        for (long j = 0; j < dv; j++) {
            float prod = s[j] * vi;
            p[j] = p[j] + prod;
        }
    }
    for (long s = LS_LANES / 2; s >= 1; s >>= 1)
        for (long l = 0; l < s; l++)
            for (long j = 0; j < dv; j++) P[l * dv + j] = P[l * dv + j] + P[(l + s) * dv + j];
    for (long j = 0; j < dv; j++) out[j] = P[j];
}

#define LS_GDN_MAX_DV 1024

void ls_cpu_gdn_recurrent(const float *q, const float *k, const float *v, const float *alpha,
                          const float *beta, float *state, float *o, long T, long Hk, long Hv,
                          long dk, long dv, int act_bf16, ls_order order)
{
    ls_cpu_gdn_recurrent_heads(q, k, v, alpha, beta, state, o, T, Hk, Hv, dk, dv, 0, Hv, act_bf16,
                               order);
}

void ls_cpu_gdn_recurrent_heads(const float *q, const float *k, const float *v,
                                const float *alpha, const float *beta, float *state, float *o,
                                long T, long Hk, long Hv, long dk, long dv, long h0, long h1,
                                int act_bf16, ls_order order)
{
    static _Thread_local float P[LS_LANES * LS_GDN_MAX_DV]; /* [32, dv] lane partials */
    float m[LS_GDN_MAX_DV];                                 /* [dv] */
    float u[LS_GDN_MAX_DV];                                 /* [dv] */
    if (dv > LS_GDN_MAX_DV) return; /* the model rejects such shapes */
    for (long t = 0; t < T; t++) {
        for (long h = h0; h < h1; h++) {
            long kh = h * Hk / Hv;
            const float *qt = q + (t * Hk + kh) * dk; /* [dk] */
            const float *kt = k + (t * Hk + kh) * dk; /* [dk] */
            const float *vt = v + (t * Hv + h) * dv;  /* [dv] */
            float a = alpha[t * Hv + h], b = beta[t * Hv + h];
            float *S = state + h * dk * dv;           /* [dk, dv] */
            for (long e = 0; e < dk * dv; e++) S[e] = a * S[e];
            col_dots(S, kt, dk, dv, m, P, order);
            for (long j = 0; j < dv; j++) {
                float diff = vt[j] - m[j];
                u[j] = diff * b;
            }
            for (long i = 0; i < dk; i++) {
                float ki = kt[i];
                float *Si = S + i * dv;
                for (long j = 0; j < dv; j++) {
                    float prod = ki * u[j];
                    Si[j] = Si[j] + prod;
                }
            }
            float *ot = o + (t * Hv + h) * dv; /* [dv] */
            col_dots(S, qt, dk, dv, ot, P, order);
            for (long j = 0; j < dv; j++) ot[j] = ls_act(ot[j], act_bf16);
        }
    }
}

void ls_cpu_rope_table(const int32_t *pos, long T, long R, double theta, float *cos_t,
                       float *sin_t, int act_bf16)
{
    long H = R / 2;
    for (long j = 0; j < H; j++) {
        float inv_freq = (float)pow(theta, -2.0 * (double)j / (double)R);
        for (long t = 0; t < T; t++) {
            float a = (float)pos[t] * inv_freq;
            cos_t[t * H + j] = ls_act((float)cos((double)a), act_bf16);
            sin_t[t * H + j] = ls_act((float)sin((double)a), act_bf16);
        }
    }
}

void ls_cpu_rope_apply(float *x, const float *cos_t, const float *sin_t, long T, long H, long d,
                       long R, int act_bf16)
{
    long half = R / 2;
    float tmp[1024]; /* [R]; the model rejects R > 1024 */
    if (R > 1024) return;
    for (long t = 0; t < T; t++)
        for (long hd = 0; hd < H; hd++) {
            float *xr = x + (t * H + hd) * d; /* [d] */
            const float *c = cos_t + t * half, *s = sin_t + t * half;
            for (long i = 0; i < R; i++) {
                float rot = i < half ? -xr[i + half] : xr[i - half];
                long j = i % half;
                float a = ls_act(xr[i] * c[j], act_bf16);
                float b = ls_act(rot * s[j], act_bf16);
                tmp[i] = ls_act(a + b, act_bf16);
            }
            memcpy(xr, tmp, sizeof(float) * (size_t)R);
        }
}

#define LS_ATT_BLOCK 32
#define LS_ATT_MAX_D 1024

void ls_cpu_attention(const float *q, const float *kc, const float *vc, long cap,
                      const int32_t *pos, float *o, long T, long Hq, long Hkv, long d, int act_bf16,
                      ls_order order)
{
    ls_cpu_attention_heads(q, kc, vc, cap, pos, o, T, Hq, Hkv, d, 0, Hq, act_bf16, order);
}

void ls_cpu_attention_heads(const float *q, const float *kc, const float *vc, long cap,
                            const int32_t *pos, float *o, long T, long Hq, long Hkv, long d,
                            long n0, long n1, int act_bf16, ls_order order)
{
    float acc[LS_ATT_MAX_D];               /* [d] */
    float pv[LS_ATT_BLOCK];                /* [32] lane values */
    float p[LS_ATT_BLOCK];                 /* [32] block probabilities */
    float s[LS_ATT_BLOCK];                 /* [32] block scores */
    if (d > LS_ATT_MAX_D) return;
    float scale = ls_cpu_inv_sqrt_scale(d);
    for (long t = 0; t < T; t++) {
        long last = pos[t];
        for (long n = n0; n < n1; n++) {
            long kvh = n * Hkv / Hq;
            const float *qv = q + (t * Hq + n) * d;   /* [d] */
            const float *K = kc + kvh * cap * d;      /* [cap, d] */
            const float *V = vc + kvh * cap * d;      /* [cap, d] */
            float M = -INFINITY, l = 0.0f;
            for (long i = 0; i < d; i++) acc[i] = 0.0f;
            for (long b0 = 0; b0 <= last; b0 += LS_ATT_BLOCK) {
                long nb = last - b0 + 1;
                if (nb > LS_ATT_BLOCK) nb = LS_ATT_BLOCK;
                float bm = -INFINITY;
                for (long j = 0; j < nb; j++) {
                    s[j] = ls_cpu_dot(qv, K + (b0 + j) * d, d, order) * scale;
                    if (s[j] > bm) bm = s[j];
                }
                float Mn = M > bm ? M : bm;
                float c = (M == -INFINITY) ? 0.0f : ls_expf(M - Mn);
                for (long j = 0; j < LS_ATT_BLOCK; j++) p[j] = j < nb ? ls_expf(s[j] - Mn) : 0.0f;
                float ones[LS_ATT_BLOCK];
                for (long j = 0; j < LS_ATT_BLOCK; j++) ones[j] = 1.0f;
                float lc = l * c;
                l = lc + ls_cpu_dot(p, ones, nb, order);
                for (long i = 0; i < d; i++) {
                    for (long j = 0; j < nb; j++) pv[j] = V[(b0 + j) * d + i];
                    float ac = acc[i] * c;
                    acc[i] = ac + ls_cpu_dot(p, pv, nb, order);
                }
                M = Mn;
            }
            float *ov = o + (t * Hq + n) * d; /* [d] */
            for (long i = 0; i < d; i++) ov[i] = ls_act(acc[i] / l, act_bf16);
        }
    }
}

void ls_cpu_sigmoid_gate(float *o, const float *gate, long n, int act_bf16)
{
    for (long i = 0; i < n; i++) {
        float g = ls_act(ls_sigmoidf(gate[i]), act_bf16);
        o[i] = ls_act(o[i] * g, act_bf16);
    }
}

void ls_cpu_topk(const float *x, long n, long k, int32_t *ids, float *vals)
{
    for (long i = 0; i < k; i++) {
        long best = -1;
        for (long e = 0; e < n; e++) {
            int taken = 0;
            for (long j = 0; j < i; j++)
                if (ids[j] == e) { taken = 1; break; }
            if (taken) continue;
            /* Strictly greater keeps the lower index on ties. */
            if (best < 0 || x[e] > x[best]) best = e;
        }
        ids[i] = (int32_t)best;
        vals[i] = x[best];
    }
}

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

void ls_cpu_expert(const ls_wmat *wg, const ls_wmat *wu, const ls_wmat *wd, const float *x,
                   float *y, float *scratch, int act_bf16, ls_order order)
{
    long I = wg->rows;
    float *g = scratch;     /* [I] */
    float *u = scratch + I; /* [I] */
    ls_cpu_linear(wg, x, g, 1, 0, I, act_bf16, order);
    ls_cpu_linear(wu, x, u, 1, 0, I, act_bf16, order);
    for (long i = 0; i < I; i++) {
        float sg = ls_act(ls_siluf(g[i]), act_bf16);
        g[i] = ls_act(sg * u[i], act_bf16);
    }
    ls_cpu_linear(wd, g, y, 1, 0, wd->rows, act_bf16, order);
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

void ls_cpu_residual(float *h, const float *a, long n, int act_bf16)
{
    for (long i = 0; i < n; i++) h[i] = ls_act(h[i] + a[i], act_bf16);
}

void ls_cpu_logprobs(const float *logits, float *lp, long R, long V, float *scratch,
                     ls_order order)
{
    for (long r = 0; r < R; r++) {
        const float *l = logits + r * V; /* [V] */
        float *o = lp + r * V;           /* [V] */
        float m = -INFINITY;
        for (long v = 0; v < V; v++)
            if (l[v] > m) m = l[v];
        for (long v = 0; v < V; v++) scratch[v] = ls_expf(l[v] - m);
        float lse = m + ls_logf(ls_cpu_sum(scratch, V, order));
        for (long v = 0; v < V; v++) o[v] = l[v] - lse;
    }
}
