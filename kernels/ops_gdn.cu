/* lockstep — portable strict Gated DeltaNet recurrent scan (see ops.h).
 *
 * Block = (32 value columns, value head h); 4 warps of 8 columns each. Lane l
 * keeps state rows i = l, l+32, l+64, l+96 (key dim, i ≡ l mod 32) of its
 * warp's 8 columns in registers for all T tokens, so each column's DOT32 over
 * the key dim is: lane partial over its rows in ascending i, then the warp
 * butterfly — the CPU's col_dots, column by column. The state is read from
 * device memory once before the first token and written once after the last:
 * a call with T tokens and T calls with one token give the same bits. */
#include "ops.h"
#include "ops_common.cuh"

#define LS_GDN_ROWS (LS_CUDA_GDN_MAX_DK / LS_WARP) /* 4 rows per lane */
#define LS_GDN_COLS 8                              /* value columns per warp */
#define LS_GDN_WARPS 4                             /* warps per block */

__global__ void __launch_bounds__(LS_GDN_WARPS * LS_WARP)
ls_gdn_recurrent_kernel(const float *q, const float *k, const float *v, const float *alpha,
                        const float *beta, float *state, float *o, long T, long Hk, long Hv,
                        long dk, long dv, int act)
{
    int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    long h = blockIdx.y;
    long kh = h * Hk / Hv;
    long j0 = (long)blockIdx.x * (LS_GDN_WARPS * LS_GDN_COLS) + (long)warp * LS_GDN_COLS;
    float *Sh = state + h * dk * dv; /* [dk, dv] */
    float S[LS_GDN_ROWS][LS_GDN_COLS];
#pragma unroll
    for (int r = 0; r < LS_GDN_ROWS; r++) {
        long i = lane + (long)r * LS_WARP;
#pragma unroll
        for (int c = 0; c < LS_GDN_COLS; c++)
            S[r][c] = (i < dk && j0 + c < dv) ? Sh[i * dv + j0 + c] : 0.0f;
    }
    for (long t = 0; t < T; t++) {
        const float *qt = q + (t * Hk + kh) * dk; /* [dk] */
        const float *kt = k + (t * Hk + kh) * dk; /* [dk] */
        const float *vt = v + (t * Hv + h) * dv;  /* [dv] */
        float a = alpha[t * Hv + h], b = beta[t * Hv + h];
        float kr[LS_GDN_ROWS], qr[LS_GDN_ROWS];
#pragma unroll
        for (int r = 0; r < LS_GDN_ROWS; r++) {
            long i = lane + (long)r * LS_WARP;
            kr[r] = i < dk ? kt[i] : 0.0f;
            qr[r] = i < dk ? qt[i] : 0.0f;
        }
#pragma unroll
        for (int c = 0; c < LS_GDN_COLS; c++) {
            long j = j0 + c;
            /* S' = α S, then m_j = DOT32_i(S'[i][j], k_i). */
            float p = 0.0f;
#pragma unroll
            for (int r = 0; r < LS_GDN_ROWS; r++) {
                S[r][c] = a * S[r][c];
                if (lane + r * LS_WARP < dk) {
                    float prod = S[r][c] * kr[r];
                    p = p + prod;
                }
            }
            float m = ls_warp_tree(p);
            float vj = j < dv ? vt[j] : 0.0f;
            float diff = vj - m;
            float u = diff * b;
            /* S = S' + k ⊗ u, then o_j = act(DOT32_i(S[i][j], q_i)). */
            float po = 0.0f;
#pragma unroll
            for (int r = 0; r < LS_GDN_ROWS; r++) {
                float prod = kr[r] * u;
                S[r][c] = S[r][c] + prod;
                if (lane + r * LS_WARP < dk) {
                    float prod2 = S[r][c] * qr[r];
                    po = po + prod2;
                }
            }
            float oj = ls_warp_tree(po);
            if (lane == 0 && j < dv) o[(t * Hv + h) * dv + j] = ls_act_d(oj, act);
        }
    }
#pragma unroll
    for (int r = 0; r < LS_GDN_ROWS; r++) {
        long i = lane + (long)r * LS_WARP;
#pragma unroll
        for (int c = 0; c < LS_GDN_COLS; c++)
            if (i < dk && j0 + c < dv) Sh[i * dv + j0 + c] = S[r][c];
    }
}

extern "C" ls_status ls_cuda_gdn_recurrent(const float *q, const float *k, const float *v,
                                           const float *alpha, const float *beta, float *state,
                                           float *o, long T, long Hk, long Hv, long dk, long dv,
                                           int act_bf16, int order, void *stream, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "gdn_recurrent");
    LS_CUDA_REQUIRE(dk >= 1 && dk <= LS_CUDA_GDN_MAX_DK && dv >= 1 && Hk >= 1 && Hv >= 1 &&
                        Hv <= 65535,
                    err,
                    "cuda portable gdn_recurrent: shape Hk %ld Hv %ld dk %ld dv %ld not supported "
                    "(needs 1 <= dk <= %d, Hv <= 65535)",
                    Hk, Hv, dk, dv, LS_CUDA_GDN_MAX_DK);
    if (T <= 0) return LS_OK;
    dim3 grid(ls_blocks_for(dv, LS_GDN_WARPS * LS_GDN_COLS), (unsigned)Hv);
    ls_gdn_recurrent_kernel<<<grid, LS_GDN_WARPS * LS_WARP, 0, (cudaStream_t)stream>>>(
        q, k, v, alpha, beta, state, o, T, Hk, Hv, dk, dv, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_gdn_recurrent_kernel", err);
    return LS_OK;
}
