/* lockstep — portable strict partial RoPE and attention (see ops.h,
 * docs/numerics.md §4). */
#include "ops.h"
#include "ops_common.cuh"

/* ---- RoPE --------------------------------------------------------------------- */

/* One thread per rotation pair (i, i + R/2) of one (token, head): it reads
 * both inputs before writing both outputs, so the update in place is safe. */
__global__ void ls_rope_kernel(float *x, const float *cos_t, const float *sin_t, long T, long H,
                               long d, long R, int act)
{
    long half = R / 2;
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= T * H * half) return;
    long i = e % half, th = e / half, t = th / H;
    float *xr = x + th * d; /* [d] */
    float c = cos_t[t * half + i], s = sin_t[t * half + i];
    float x0 = xr[i], x1 = xr[i + half];
    /* i < half: rot = −x_{i+half}; i + half: rot = x_i; both use frequency i. */
    float a0 = ls_act_d(x0 * c, act);
    float b0 = ls_act_d(-x1 * s, act);
    float a1 = ls_act_d(x1 * c, act);
    float b1 = ls_act_d(x0 * s, act);
    xr[i] = ls_act_d(a0 + b0, act);
    xr[i + half] = ls_act_d(a1 + b1, act);
}

extern "C" ls_status ls_cuda_rope_apply(float *x, const float *cos_t, const float *sin_t, long T,
                                        long H, long d, long R, int act_bf16, void *stream,
                                        ls_error *err)
{
    LS_CUDA_REQUIRE(R >= 2 && R % 2 == 0 && R <= d, err,
                    "cuda portable rope_apply: rotary dims %ld must be even and <= head dim %ld", R, d);
    if (T <= 0 || H <= 0) return LS_OK;
    ls_rope_kernel<<<ls_blocks_for(T * H * (R / 2), 256), 256, 0, (cudaStream_t)stream>>>(
        x, cos_t, sin_t, T, H, d, R, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_rope_kernel", err);
    return LS_OK;
}

/* ---- attention ---------------------------------------------------------------- */

#define LS_ATT_WARPS 4                          /* (query, head) pairs per block */
#define LS_ATT_DR (LS_CUDA_ATT_MAX_D / LS_WARP) /* head dims per lane: d = lane + 32 r */

/* Per block of 32 keys (lane = key within the block):
 *   s_j  = DOT32(q, k_j) · scale        (warp DOT32 per key; lane j keeps s_j)
 *   M'   = max(M, max_j s_j);  c = M == −inf ? 0 : exp(M − M');  p_j = exp(s_j − M')
 *   l    = l·c + DOT32_lanes(p, 1);  acc_d = acc_d·c + DOT32_lanes(p, v[·][d])
 * exactly ls_cpu_attention's operations; lane (d mod 32) owns acc_d. */
__global__ void __launch_bounds__(LS_ATT_WARPS * LS_WARP)
ls_attention_kernel(const float *q, const float *kc, const float *vc, long cap, const int32_t *pos,
                    float *o, long T, long Hq, long Hkv, long d, float scale, int act)
{
    int lane = (int)(threadIdx.x & 31u);
    long pair = (long)blockIdx.x * LS_ATT_WARPS + (threadIdx.x >> 5);
    if (pair >= T * Hq) return; /* whole warp */
    long t = pair / Hq, n = pair % Hq;
    long kvh = n * Hkv / Hq;
    long last = pos[t];
    if (last > cap - 1) last = cap - 1; /* never read past the cache (checked by the engine) */
    const float *qv = q + pair * d;            /* [d] */
    const float *K = kc + kvh * cap * d;       /* [cap, d] */
    const float *V = vc + kvh * cap * d;       /* [cap, d] */
    float qr[LS_ATT_DR], acc[LS_ATT_DR];
#pragma unroll
    for (int r = 0; r < LS_ATT_DR; r++) {
        long dd = lane + (long)r * LS_WARP;
        qr[r] = dd < d ? qv[dd] : 0.0f;
        acc[r] = 0.0f;
    }
    float M = -INFINITY, l = 0.0f;
    for (long b0 = 0; b0 <= last; b0 += LS_WARP) {
        long nb = last - b0 + 1;
        if (nb > LS_WARP) nb = LS_WARP;
        float my_s = -INFINITY;
        for (long j = 0; j < nb; j++) {
            const float *kj = K + (b0 + j) * d; /* [d] */
            float p = 0.0f;
#pragma unroll
            for (int r = 0; r < LS_ATT_DR; r++) {
                long dd = lane + (long)r * LS_WARP;
                if (dd < d) {
                    float prod = qr[r] * kj[dd];
                    p = p + prod;
                }
            }
            float sj = ls_warp_tree(p) * scale;
            if (lane == j) my_s = sj;
        }
        float bm = ls_warp_max_first(my_s, lane < nb ? (long)lane : -1L);
        float Mn = M > bm ? M : bm;
        float c = (M == -INFINITY) ? 0.0f : ls_expf(M - Mn);
        float pj = lane < nb ? ls_expf(my_s - Mn) : 0.0f;
        float lc = l * c;
        float pone = 0.0f;
        if (lane < nb) {
            float prod = pj * 1.0f;
            pone = pone + prod;
        }
        l = lc + ls_warp_tree(pone);
        const float *vrow = V + (b0 + (lane < nb ? lane : 0)) * d; /* [d], key of this lane */
#pragma unroll
        for (int r = 0; r < LS_ATT_DR; r++) {
            if ((long)r * LS_WARP >= d) break; /* uniform */
            for (int jj = 0; jj < LS_WARP; jj++) {
                long dd = (long)r * LS_WARP + jj;
                if (dd >= d) break; /* uniform */
                float pv = 0.0f;
                if (lane < nb) {
                    float prod = pj * vrow[dd];
                    pv = pv + prod;
                }
                float sum = ls_warp_tree(pv);
                if (lane == jj) {
                    float ac = acc[r] * c;
                    acc[r] = ac + sum;
                }
            }
        }
        M = Mn;
    }
    float *ov = o + pair * d; /* [d] */
#pragma unroll
    for (int r = 0; r < LS_ATT_DR; r++) {
        long dd = lane + (long)r * LS_WARP;
        if (dd < d) ov[dd] = ls_act_d(acc[r] / l, act);
    }
}

extern "C" ls_status ls_cuda_attention(const float *q, const float *kc, const float *vc, long cap,
                                       const int32_t *pos, float *o, long T, long Hq, long Hkv,
                                       long d, int act_bf16, int order, void *stream, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "attention");
    LS_CUDA_REQUIRE(d >= 1 && d <= LS_CUDA_ATT_MAX_D && Hq >= 1 && Hkv >= 1 && cap >= 1, err,
                    "cuda portable attention: head dim %ld (max %d), heads %ld/%ld, cache %ld "
                    "not supported", d, LS_CUDA_ATT_MAX_D, Hq, Hkv, cap);
    if (T <= 0) return LS_OK;
    /* fp32(1/sqrt(d)) computed in double and rounded once (ls_cpu_inv_sqrt_scale). */
    float scale = (float)(1.0 / sqrt((double)d));
    ls_attention_kernel<<<ls_blocks_for(T * Hq, LS_ATT_WARPS), LS_ATT_WARPS * LS_WARP, 0,
                          (cudaStream_t)stream>>>(q, kc, vc, cap, pos, o, T, Hq, Hkv, d, scale,
                                                  act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_attention_kernel", err);
    return LS_OK;
}
