/* lockstep — CPU reference of the Gated DeltaNet recurrent step (the kernel of
 * kernels/ops_gdn.cu); see cpu_ops.h and docs/numerics.md. */
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
