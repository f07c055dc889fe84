/* lockstep — CPU reference of the Gated DeltaNet recurrent step (the kernel of
 * kernels/ops_gdn.cu) and of the chunk-aligned form (kernels/ops_gdn_chunked.cu);
 * see cpu_ops.h and docs/numerics.md. */
#include "backend/cpu_ops.h"

#include <string.h>

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

void ls_cpu_gdn_recurrent(const float *q, const float *k, const float *v, const float *alpha,
                          const float *beta, float *state, float *o, long T, long Hk, long Hv,
                          long dk, long dv, float *scratch, int act_bf16, ls_order order)
{
    ls_cpu_gdn_recurrent_heads(q, k, v, alpha, beta, state, o, T, Hk, Hv, dk, dv, 0, Hv, scratch,
                               act_bf16, order);
}

void ls_cpu_gdn_recurrent_heads(const float *q, const float *k, const float *v,
                                const float *alpha, const float *beta, float *state, float *o,
                                long T, long Hk, long Hv, long dk, long dv, long h0, long h1,
                                float *scratch, int act_bf16, ls_order order)
{
    float *P = scratch;                     /* [32, dv] lane partials */
    float *m = scratch + LS_LANES * dv;     /* [dv] */
    float *u = m + dv;                      /* [dv] */
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

/* ---- chunk-aligned form (docs/numerics.md §5.1) ----------------------------------------
 * The chunk area after S [Hv, dk, dv]: the rows of the current chunk so far,
 * k [Hv, C, dk] (each value head's key row), u [Hv, C, dv] (the delta-rule
 * corrections), alpha [Hv, C]. Row r of a chunk sits at position nC + r. */
static long chunk_k(long Hv, long dk, long dv, long h)
{
    return Hv * dk * dv + h * LS_GDN_CHUNK * dk;
}

static long chunk_u(long Hv, long dk, long dv, long h)
{
    return Hv * dk * dv + Hv * LS_GDN_CHUNK * dk + h * LS_GDN_CHUNK * dv;
}

static long chunk_alpha(long Hv, long dk, long dv, long h)
{
    return Hv * dk * dv + Hv * LS_GDN_CHUNK * (dk + dv) + h * LS_GDN_CHUNK;
}

/* The decays from row s to row r: d[s] = α_{s+1} ··· α_r (d[r] = 1), the
 * product taken from r downwards; returns P = d[0] α_0 = α_0 ··· α_r. */
static float chunk_decays(const float *al /* [C] */, long r, float *d /* [C] */)
{
    d[r] = 1.0f;
    for (long s = r - 1; s >= 0; s--) d[s] = d[s + 1] * al[s + 1];
    return d[0] * al[0];
}

/* S_r = P S_0 + Σ_{s ≤ r, ascending} (d[s] k_s) ⊗ u_s into out (which may be S0). */
static void chunk_fold(const float *S0 /* [dk, dv] */, const float *kb /* [C, dk] */,
                       const float *ub /* [C, dv] */, const float *d, float P, long r, long dk, long dv,
                       float *out /* [dk, dv] */)
{
    for (long e = 0; e < dk * dv; e++) out[e] = P * S0[e];
    for (long s = 0; s <= r; s++)
        for (long i = 0; i < dk; i++) {
            float ki = d[s] * kb[s * dk + i];
            float *oi = out + i * dv;
            for (long j = 0; j < dv; j++) {
                float prod = ki * ub[s * dv + j];
                oi[j] = oi[j] + prod;
            }
        }
}

void ls_cpu_gdn_chunked_heads(const float *q, const float *k, const float *v, const float *alpha,
                              const float *beta, float *state, float *o, long T, long pos0, long Hk,
                              long Hv, long dk, long dv, long h0, long h1, float *scratch, int act_bf16,
                              ls_order order)
{
    const long C = LS_GDN_CHUNK;
    float *P = scratch;                 /* [32, dv] lane partials */
    float *m0 = P + LS_LANES * dv;      /* [dv] S_0ᵀ k_r */
    float *mq = m0 + dv;                /* [dv] S_0ᵀ q_r */
    float *d = mq + dv;                 /* [C] decays to row r */
    for (long t = 0; t < T; t++) {
        long r = (pos0 + t) % C;
        for (long h = h0; h < h1; h++) {
            long kh = h * Hk / Hv;
            const float *qt = q + (t * Hk + kh) * dk; /* [dk] */
            const float *kt = k + (t * Hk + kh) * dk; /* [dk] */
            const float *vt = v + (t * Hv + h) * dv;  /* [dv] */
            float b = beta[t * Hv + h];
            float *S0 = state + h * dk * dv;          /* [dk, dv] the state at the chunk's start */
            float *kb = state + chunk_k(Hv, dk, dv, h), *ub = state + chunk_u(Hv, dk, dv, h);
            float *al = state + chunk_alpha(Hv, dk, dv, h);
            /* row r joins the chunk first: every sum below runs over rows <= r */
            memcpy(kb + r * dk, kt, sizeof(float) * (size_t)dk);
            al[r] = alpha[t * Hv + h];
            float Pr = chunk_decays(al, r, d);
            col_dots(S0, kt, dk, dv, m0, P, order);
            col_dots(S0, qt, dk, dv, mq, P, order);
            /* u_r = β (v − P m0) − Σ_{s<r} A_rs u_s,  A_rs = β (k_r · k_s) d[s] */
            float *ur = ub + r * dv;
            for (long j = 0; j < dv; j++) {
                float pm = Pr * m0[j];
                float diff = vt[j] - pm;
                ur[j] = diff * b;
            }
            for (long s = 0; s < r; s++) {
                float kk = ls_dot32_f32(kt, kb + s * dk, dk);
                float a = kk * d[s];
                float A = b * a;
                const float *us = ub + s * dv;
                for (long j = 0; j < dv; j++) {
                    float prod = A * us[j];
                    ur[j] = ur[j] - prod;
                }
            }
            /* o_r = P mq + Σ_{s<=r} (q_r · k_s) d[s] u_s */
            float *ot = o + (t * Hv + h) * dv; /* [dv] */
            for (long j = 0; j < dv; j++) ot[j] = Pr * mq[j];
            for (long s = 0; s <= r; s++) {
                float qk = ls_dot32_f32(qt, kb + s * dk, dk);
                float w = qk * d[s];
                const float *us = ub + s * dv;
                for (long j = 0; j < dv; j++) {
                    float prod = w * us[j];
                    ot[j] = ot[j] + prod;
                }
            }
            for (long j = 0; j < dv; j++) ot[j] = ls_act(ot[j], act_bf16);
            /* the chunk's last row: its rows fold into the state at the next boundary */
            if (r == C - 1) chunk_fold(S0, kb, ub, d, Pr, r, dk, dv, S0);
        }
    }
}

void ls_cpu_gdn_chunked_state_heads(const float *state, long pos, long Hv, long dk, long dv, long h0, long h1,
                                    float *s_out, float *scratch)
{
    float *d = scratch; /* [C] */
    long r = pos % LS_GDN_CHUNK;
    for (long h = h0; h < h1; h++) {
        const float *S0 = state + h * dk * dv;
        float *out = s_out + h * dk * dv;
        if (r == LS_GDN_CHUNK - 1) { /* folded at the boundary already */
            memcpy(out, S0, sizeof(float) * (size_t)(dk * dv));
            continue;
        }
        float Pr = chunk_decays(state + chunk_alpha(Hv, dk, dv, h), r, d);
        chunk_fold(S0, state + chunk_k(Hv, dk, dv, h), state + chunk_u(Hv, dk, dv, h), d, Pr, r, dk, dv, out);
    }
}
