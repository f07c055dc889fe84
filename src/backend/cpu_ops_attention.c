/* lockstep — CPU reference of partial RoPE and attention (the kernels of
 * kernels/ops_attention.cu); see cpu_ops.h and docs/numerics.md §4. */
#include "backend/cpu_ops.h"

#include <math.h>
#include <string.h>

#include "numerics/lsmath.h"

/* ---- RoPE ---------------------------------------------------------------- */

void ls_cpu_rope_apply(float *x, const float *cos_t, const float *sin_t, long T, long H, long d,
                       long R, float *scratch, int act_bf16)
{
    long half = R / 2;
    float *tmp = scratch; /* [R] */
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

/* ---- attention ----------------------------------------------------------- */

float ls_cpu_inv_sqrt_scale(long d)
{
    return (float)(1.0 / sqrt((double)d));
}

#define LS_ATT_BLOCK 32

void ls_cpu_attention(const float *q, const float *kc, const float *vc, long cap,
                      const int32_t *pos, float *o, long T, long Hq, long Hkv, long d, float *scratch,
                      int act_bf16, ls_order order)
{
    ls_cpu_attention_heads(q, kc, vc, NULL, cap, cap, pos, o, T, Hq, Hkv, d, 0, Hq, scratch, act_bf16,
                           order);
}

void ls_cpu_attention_heads(const float *q, const float *kc, const float *vc, const int32_t *pt,
                            long page, long cap, const int32_t *pos, float *o, long T, long Hq,
                            long Hkv, long d, long n0, long n1, float *scratch, int act_bf16,
                            ls_order order)
{
    float *acc = scratch;                  /* [d] */
    float pv[LS_ATT_BLOCK];                /* [32] lane values */
    float p[LS_ATT_BLOCK];                 /* [32] block probabilities */
    float s[LS_ATT_BLOCK];                 /* [32] block scores */
    const float *kr[LS_ATT_BLOCK];         /* [32] key rows of the block */
    const float *vr[LS_ATT_BLOCK];         /* [32] value rows of the block */
    float scale = ls_cpu_inv_sqrt_scale(d);
    for (long t = 0; t < T; t++) {
        long last = pos[t];
        if (last > cap - 1) last = cap - 1; /* never past the table (the engine checks) */
        for (long n = n0; n < n1; n++) {
            long kvh = n * Hkv / Hq;
            const float *qv = q + (t * Hq + n) * d;   /* [d] */
            float M = -INFINITY, l = 0.0f;
            for (long i = 0; i < d; i++) acc[i] = 0.0f;
            /* Blocks of 32 logical positions whatever the pages: a block may
             * span pages, its keys are still keys b0 .. b0+nb-1 in order. */
            for (long b0 = 0; b0 <= last; b0 += LS_ATT_BLOCK) {
                long nb = last - b0 + 1;
                if (nb > LS_ATT_BLOCK) nb = LS_ATT_BLOCK;
                for (long j = 0; j < nb; j++) {
                    long row = ls_cpu_kv_row(pt, page, Hkv, kvh, b0 + j) * d;
                    kr[j] = kc + row;
                    vr[j] = vc + row;
                }
                float bm = -INFINITY;
                for (long j = 0; j < nb; j++) {
                    s[j] = ls_cpu_dot(qv, kr[j], d, order) * scale;
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
                    for (long j = 0; j < nb; j++) pv[j] = vr[j][i];
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
