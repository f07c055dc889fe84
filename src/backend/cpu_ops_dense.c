/* lockstep — CPU reference operators of the dense family (the kernels of
 * kernels/ops_dense.cu): reductions, embedding, linear, norms, elementwise
 * ops, causal conv, GDN gates, logprobs and top-k, plus the host RoPE table;
 * see cpu_ops.h and docs/numerics.md. */
#include "backend/cpu_ops.h"

#include <math.h>

#include "core/isa.h"
#include "numerics/lsmath.h"

/* ---- reductions ---------------------------------------------------------- */

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

/* The canonical dot products are most of a CPU run's time: the row
 * functions below have a baseline and an AVX2 instance (core/isa.h), the
 * LS_DOT32 lanes of reduce.h and fp8.h 8 at a time. */
LS_ISA_BODY float dot_wrow(const ls_wmat *w, long r, const float *x, ls_order order)
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
    if (ls_wtype_is_f8(w->wtype)) {
        /* dequantised (docs/numerics.md §9); a w8a8 matrix reaches here only
         * through a caller that has no quantised activations, which is a bug
         * the operators below rule out (they call ls_cpu_dot_wrow_q) */
        const uint8_t *row = (const uint8_t *)w->data + r * n; /* [n] */
        const float *srow = ls_wmat_scale_row(w, r);           /* [LS_FP8_BLOCKS(n)] */
        if (order == LS_ORDER_CANONICAL) return ls_dot32_f8(row, srow, x, n);
        float s = 0.0f;
        for (long k = n - 1; k >= 0; k--) {
            float prod = ls_fp8_dequant(row[k], srow[k / LS_FP8_BLOCK]) * x[k];
            s = ls_round_bf16(s + prod);
        }
        return s;
    }
    return ls_cpu_dot((const float *)w->data + r * n, x, n, order);
}

static float dot_wrow_baseline(const ls_wmat *w, long r, const float *x, ls_order order)
{
    return dot_wrow(w, r, x, order);
}

LS_TARGET_AVX2 static float dot_wrow_avx2(const ls_wmat *w, long r, const float *x, ls_order order)
{
    return dot_wrow(w, r, x, order);
}

float ls_cpu_dot_wrow(const ls_wmat *w, long r, const float *x, ls_order order)
{
    return (ls_cpu_has_avx2() ? dot_wrow_avx2 : dot_wrow_baseline)(w, r, x, order);
}

float ls_cpu_dot_wrow_q(const ls_wmat *w, long r, const float *q, const float *xs, ls_order order)
{
    long n = w->cols;
    const uint8_t *row = (const uint8_t *)w->data + r * n; /* [n] */
    const float *srow = ls_wmat_scale_row(w, r);           /* [LS_FP8_BLOCKS(n)] */
    if (order == LS_ORDER_CANONICAL) return ls_dot_w8a8(row, srow, q, xs, n);
    /* perturbed: blocks from the last, each a reversed sequential sum, every
     * addition (inside and across blocks) rounded to bf16 */
    float acc = 0.0f;
    for (long b = LS_FP8_BLOCKS(n) - 1; b >= 0; b--) {
        long k0 = b * LS_FP8_BLOCK, k1 = k0 + LS_FP8_BLOCK < n ? k0 + LS_FP8_BLOCK : n;
        float d = 0.0f;
        for (long k = k1 - 1; k >= k0; k--) {
            float prod = ls_e4m3_to_f32(row[k]) * q[k];
            d = ls_round_bf16(d + prod);
        }
        float sc = xs[b] * srow[b];
        float part = d * sc;
        acc = ls_round_bf16(acc + part);
    }
    return acc;
}

void ls_cpu_fp8_quant_act(const float *x, long T, long n, float *q, float *s)
{
    long nb = LS_FP8_BLOCKS(n);
    for (long t = 0; t < T; t++) ls_fp8_quant_row(x + t * n, n, q + t * n, s + t * nb);
}

float ls_cpu_sum(const float *a, long n, ls_order order)
{
    if (order == LS_ORDER_CANONICAL) return ls_sum32(a, n);
    float s = 0.0f;
    for (long k = n - 1; k >= 0; k--) s = ls_round_bf16(s + a[k]);
    return s;
}

/* ---- embedding and linear ------------------------------------------------ */

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

void ls_cpu_linear_q(const ls_wmat *w, const float *q, const float *xs, float *y, long T, long o0,
                     long o1, int act_bf16, ls_order order)
{
    long in = w->cols, out = w->rows, nb = LS_FP8_BLOCKS(in);
    for (long t = 0; t < T; t++)
        for (long o = o0; o < o1; o++)
            y[t * out + o] =
                ls_act(ls_cpu_dot_wrow_q(w, o, q + t * in, xs + t * nb, order), act_bf16);
}

/* ---- norms --------------------------------------------------------------- */

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

/* ---- elementwise --------------------------------------------------------- */

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

void ls_cpu_sigmoid_gate(float *o, const float *gate, long n, int act_bf16)
{
    for (long i = 0; i < n; i++) {
        float g = ls_act(ls_sigmoidf(gate[i]), act_bf16);
        o[i] = ls_act(o[i] * g, act_bf16);
    }
}

void ls_cpu_residual(float *out, const float *h, const float *a, long n, int act_bf16)
{
    for (long i = 0; i < n; i++) out[i] = ls_act(h[i] + a[i], act_bf16);
}

/* ---- causal conv + SiLU -------------------------------------------------- */

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

/* ---- logprobs and top-k -------------------------------------------------- */

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

/* ---- logprob summary ----------------------------------------------------- */

void ls_cpu_lp_summary(const float *lp, const int32_t *next, long R, long V, long k, uint32_t *out)
{
    for (long r = 0; r < R; r++) {
        const float *x = lp + r * V; /* [V] */
        uint32_t *o = out + r * LS_LP_SUMMARY_WORDS(k);
        int nan = 0;
        for (long v = 0; v < V && !nan; v++) nan = isnan(x[v]);
        int32_t ids[LS_LP_SUMMARY_KMAX];
        float vals[LS_LP_SUMMARY_KMAX];
        if (!nan) ls_cpu_topk(x, V, k, ids, vals);
        for (long i = 0; i < k; i++) {
            o[i] = nan ? 0xffffffffu : (uint32_t)ids[i];
            o[k + i] = nan ? 0x7fc00000u : ls_f32_bits(vals[i]);
        }
        o[2 * k] = next[r] >= 0 && next[r] < V ? ls_f32_bits(x[next[r]]) : 0x7fc00000u;
        o[2 * k + 1] = (uint32_t)nan;
    }
}

/* ---- RoPE table (host) --------------------------------------------------- */

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
