/* lockstep — portable strict Gated DeltaNet recurrent scan (see ops.h).
 *
 * One warp = LS_GDN_CPW value columns j0.. of one value head of one sequence;
 * lane l holds key rows i = l, l+32, l+64, l+96 (< dk) of those columns in
 * registers for all T tokens. For each column the key-dim DOT32 is the
 * canonical one: lane l's partial accumulates its rows i ≡ l (mod 32) in
 * ascending i, then the butterfly (ls_warp_tree: the LS_DOT32 tree) — the
 * CPU's col_dots, column by column. A token's columns are independent, so the
 * warp works on LS_GDN_CPW butterflies at once, and the next token's q, k, v,
 * α, β are loaded while the current one is computed. The state is read from
 * device memory once before the first token (each lane: 32 bytes of each of
 * its rows, whole sectors) and written once after the last: a call with T
 * tokens and T calls with one token give the same bits. The batched entry
 * runs many sequences in one launch (blockIdx.z = sequence), each with its
 * own state and rows.
 *
 * A decode step (every sequence of the call one token) runs
 * ls_gdn_decode_kernel instead: one warp per 32 value columns of one head of
 * one sequence, thread t = column j0+t. The state slice is staged in shared
 * memory by whole 16-byte copies (cp.async, coalesced rows); thread t then
 * forms, for each lane class l, the partial over rows l, l+32, l+64, l+96 in
 * ascending order and reduces the 32 partials by the same pairing as the
 * butterfly (P[l] += P[l+s], s = 16 .. 1, exact by commutativity), and
 * writes the new state row by row (128-byte stores). Same operations, same
 * order, same bits as the scan kernel; only the memory traffic differs. */
#include "ops.h"
#include "ops_common.cuh"

#include <cuda_pipeline.h>

#define LS_GDN_CPW 8                               /* value columns per warp */
#define LS_GDN_WPB 4                               /* warps per block */
#define LS_GDN_RPL (LS_CUDA_GDN_MAX_DK / LS_WARP)  /* key rows per lane */

__device__ __forceinline__ void ls_gdn_tree8(float *p)
{
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1)
#pragma unroll
        for (int c = 0; c < LS_GDN_CPW; c++) {
            float other = __shfl_xor_sync(LS_FULL_MASK, p[c], s);
            p[c] = p[c] + other;
        }
}

/* q, k of one token for this lane's rows; v of the warp's columns; α, β. */
typedef struct ls_gdn_tok {
    float q[LS_GDN_RPL], k[LS_GDN_RPL], v[LS_GDN_CPW], a, b;
} ls_gdn_tok;

__device__ __forceinline__ void ls_gdn_load(ls_gdn_tok *x, const float *q, const float *k,
                                            const float *v, const float *alpha, const float *beta,
                                            long t, long h, long kh, long Hk, long Hv, long dk,
                                            long dv, long j0, int lane)
{
    const float *qt = q + (t * Hk + kh) * dk; /* [dk] */
    const float *kt = k + (t * Hk + kh) * dk; /* [dk] */
    const float *vt = v + (t * Hv + h) * dv;  /* [dv] */
#pragma unroll
    for (int r = 0; r < LS_GDN_RPL; r++) {
        long i = lane + (long)r * LS_WARP;
        x->q[r] = i < dk ? qt[i] : 0.0f;
        x->k[r] = i < dk ? kt[i] : 0.0f;
    }
#pragma unroll
    for (int c = 0; c < LS_GDN_CPW; c++) x->v[c] = j0 + c < dv ? vt[j0 + c] : 0.0f;
    x->a = alpha[t * Hv + h];
    x->b = beta[t * Hv + h];
}

__global__ void __launch_bounds__(LS_GDN_WPB * LS_WARP)
ls_gdn_recurrent_kernel(const float *q, const float *k, const float *v, const float *alpha,
                        const float *beta, ls_cuda_seqs sq, float *o, long Hk, long Hv, long dk,
                        long dv, int act)
{
    ls_pdl_entry();
    int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    int sidx = (int)blockIdx.z;
    long T = sq.len[sidx], row0 = sq.row0[sidx];
    long h = blockIdx.y;
    long j0 = ((long)blockIdx.x * LS_GDN_WPB + warp) * LS_GDN_CPW;
    if (T <= 0 || j0 >= dv) return; /* whole warp */
    long kh = h * Hk / Hv;
    float *Sh = sq.state[sidx] + h * dk * dv; /* [dk, dv] */
    float S[LS_GDN_RPL][LS_GDN_CPW];
    int vec = j0 + LS_GDN_CPW <= dv && dv % 4 == 0 && ((uintptr_t)Sh & 15u) == 0;
#pragma unroll
    for (int r = 0; r < LS_GDN_RPL; r++) {
        long i = lane + (long)r * LS_WARP;
        if (i < dk && vec) {
            const float4 *src = (const float4 *)(Sh + i * dv + j0);
            float4 a = src[0], b = src[1];
            S[r][0] = a.x, S[r][1] = a.y, S[r][2] = a.z, S[r][3] = a.w;
            S[r][4] = b.x, S[r][5] = b.y, S[r][6] = b.z, S[r][7] = b.w;
        } else {
#pragma unroll
            for (int c = 0; c < LS_GDN_CPW; c++)
                S[r][c] = i < dk && j0 + c < dv ? Sh[i * dv + j0 + c] : 0.0f;
        }
    }
    ls_gdn_tok cur, nxt;
    ls_gdn_load(&cur, q, k, v, alpha, beta, row0, h, kh, Hk, Hv, dk, dv, j0, lane);
    for (long t = row0; t < row0 + T; t++) {
        if (t + 1 < row0 + T)
            ls_gdn_load(&nxt, q, k, v, alpha, beta, t + 1, h, kh, Hk, Hv, dk, dv, j0, lane);
        /* S' = α S, then m_j = DOT32_i(S'[i][j], k_i). */
        float p[LS_GDN_CPW];
#pragma unroll
        for (int c = 0; c < LS_GDN_CPW; c++) p[c] = 0.0f;
#pragma unroll
        for (int r = 0; r < LS_GDN_RPL; r++) {
            if (lane + r * LS_WARP < dk) {
#pragma unroll
                for (int c = 0; c < LS_GDN_CPW; c++) {
                    float sp = cur.a * S[r][c];
                    S[r][c] = sp;
                    float prod = sp * cur.k[r];
                    p[c] = p[c] + prod;
                }
            }
        }
        ls_gdn_tree8(p);
        float u[LS_GDN_CPW];
#pragma unroll
        for (int c = 0; c < LS_GDN_CPW; c++) {
            float diff = cur.v[c] - p[c];
            u[c] = diff * cur.b;
            p[c] = 0.0f;
        }
        /* S = S' + k ⊗ u, then o_j = act(DOT32_i(S[i][j], q_i)). */
#pragma unroll
        for (int r = 0; r < LS_GDN_RPL; r++) {
            if (lane + r * LS_WARP < dk) {
#pragma unroll
                for (int c = 0; c < LS_GDN_CPW; c++) {
                    float prod = cur.k[r] * u[c];
                    float sn = S[r][c] + prod;
                    S[r][c] = sn;
                    float prod2 = sn * cur.q[r];
                    p[c] = p[c] + prod2;
                }
            }
        }
        ls_gdn_tree8(p);
        float *ot = o + (t * Hv + h) * dv + j0;
#pragma unroll
        for (int c = 0; c < LS_GDN_CPW; c++)
            if (lane == c && j0 + c < dv) ot[c] = ls_act_d(p[c], act);
        cur = nxt;
    }
#pragma unroll
    for (int r = 0; r < LS_GDN_RPL; r++) {
        long i = lane + (long)r * LS_WARP;
        if (i < dk && vec) {
            float4 *dst = (float4 *)(Sh + i * dv + j0);
            dst[0] = make_float4(S[r][0], S[r][1], S[r][2], S[r][3]);
            dst[1] = make_float4(S[r][4], S[r][5], S[r][6], S[r][7]);
        } else {
#pragma unroll
            for (int c = 0; c < LS_GDN_CPW; c++)
                if (i < dk && j0 + c < dv) Sh[i * dv + j0 + c] = S[r][c];
        }
    }
}

/* The butterfly of 32 lane partials in one thread: P[l] += P[l + s] for
 * s = 16, 8, 4, 2, 1 (each level's bound a constant, so p stays in registers). */
template <int S> __device__ __forceinline__ void ls_gdn_fold(float *p)
{
#pragma unroll
    for (int l = 0; l < S; l++) p[l] = p[l] + p[l + S];
}

__device__ __forceinline__ void ls_gdn_fold32(float *p)
{
    ls_gdn_fold<16>(p);
    ls_gdn_fold<8>(p);
    ls_gdn_fold<4>(p);
    ls_gdn_fold<2>(p);
    ls_gdn_fold<1>(p);
}

#define LS_GDND_RPT ((LS_CUDA_GDN_MAX_DK + LS_WARP - 1) / LS_WARP) /* rows per lane class */

/* One column's DOT32 over dk key rows in one thread: lane class l's partial
 * Σ term(i) over i = l, l + 32, ... ascending from +0.0, then the butterfly. */
template <typename F> __device__ __forceinline__ float ls_gdn_col_dot32(long dk, F term)
{
    float p[LS_WARP];
#pragma unroll
    for (int l = 0; l < LS_WARP; l++) {
        float acc = 0.0f;
#pragma unroll
        for (int r = 0; r < LS_GDND_RPT; r++) {
            int i = l + r * LS_WARP;
            if (i < dk) acc = acc + term(i);
        }
        p[l] = acc;
    }
    ls_gdn_fold32(p);
    return p[0];
}

__global__ void __launch_bounds__(LS_WARP)
ls_gdn_decode_kernel(const float *q, const float *k, const float *v, const float *alpha,
                     const float *beta, ls_cuda_seqs sq, float *o, long Hk, long Hv, long dk,
                     long dv, int act)
{
    ls_pdl_entry();
    __shared__ __align__(16) float sS[LS_CUDA_GDN_MAX_DK][LS_WARP]; /* S[i][j0 + t] */
    __shared__ float sqk[2][LS_CUDA_GDN_MAX_DK];                   /* q, k of the token */
    int t = (int)threadIdx.x, sidx = (int)blockIdx.z;
    if (sq.len[sidx] <= 0) return; /* whole block */
    long row = sq.row0[sidx], h = blockIdx.y, j0 = (long)blockIdx.x * LS_WARP, j = j0 + t;
    long kh = h * Hk / Hv;
    float *Sh = sq.state[sidx] + h * dk * dv; /* [dk, dv] */
    int full = j0 + LS_WARP <= dv, vec = full && dv % 4 == 0 && ((uintptr_t)Sh & 15u) == 0;
    if (vec) {
        for (long e = t; e < dk * (LS_WARP / 4); e += LS_WARP) {
            long i = e / (LS_WARP / 4), c = 4 * (e % (LS_WARP / 4));
            __pipeline_memcpy_async(&sS[i][c], Sh + i * dv + j0 + c, 16);
        }
        __pipeline_commit();
    } else {
        for (long i = 0; i < dk; i++) sS[i][t] = j < dv ? Sh[i * dv + j] : 0.0f;
    }
    for (long i = t; i < dk; i += LS_WARP) {
        sqk[0][i] = q[(row * Hk + kh) * dk + i];
        sqk[1][i] = k[(row * Hk + kh) * dk + i];
    }
    float a = alpha[row * Hv + h], b = beta[row * Hv + h];
    float vj = j < dv ? v[(row * Hv + h) * dv + j] : 0.0f;
    if (vec) __pipeline_wait_prior(0);
    __syncthreads();
    /* S' = α S, then m_j = DOT32_i(S'[i][j], k_i). */
    float m = ls_gdn_col_dot32(dk, [&](int i) {
        float sp = a * sS[i][t];
        sS[i][t] = sp;
        return sp * sqk[1][i];
    });
    float diff = vj - m;
    float u = diff * b;
    /* S = S' + k ⊗ u, then o_j = act(DOT32_i(S[i][j], q_i)). */
    float y = ls_gdn_col_dot32(dk, [&](int i) {
        float prod = sqk[1][i] * u;
        float sn = sS[i][t] + prod;
        if (j < dv) Sh[i * dv + j] = sn;
        return sn * sqk[0][i];
    });
    if (j < dv) o[(row * Hv + h) * dv + j] = ls_act_d(y, act);
}

static ls_status gdn_check(long Hk, long Hv, long dk, long dv, int order, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "gdn_recurrent");
    LS_CUDA_REQUIRE(dk >= 1 && dk <= LS_CUDA_GDN_MAX_DK && dv >= 1 && Hk >= 1 && Hv >= 1 &&
                        Hv <= 65535,
                    err,
                    "cuda portable gdn_recurrent: shape Hk %ld Hv %ld dk %ld dv %ld not supported "
                    "(needs 1 <= dk <= %d, Hv <= 65535)",
                    Hk, Hv, dk, dv, LS_CUDA_GDN_MAX_DK);
    return LS_OK;
}

extern "C" ls_status ls_cuda_gdn_recurrent_batch(const float *q, const float *k, const float *v,
                                                 const float *alpha, const float *beta,
                                                 float *const *states, const long *row0,
                                                 const long *len, long nseq, float *o, long Hk,
                                                 long Hv, long dk, long dv, int act_bf16,
                                                 int order, void *stream, ls_error *err)
{
    ls_status st = gdn_check(Hk, Hv, dk, dv, order, err);
    if (st != LS_OK) return st;
    for (long s0 = 0; s0 < nseq; s0 += LS_CUDA_SEQ_CHUNK) {
        long n = nseq - s0 < LS_CUDA_SEQ_CHUNK ? nseq - s0 : LS_CUDA_SEQ_CHUNK;
        ls_cuda_seqs sq;
        long maxlen = ls_cuda_seqs_fill(&sq, states, row0, len, s0, n);
        if (maxlen <= 0) continue;
        if (maxlen == 1) { /* a decode step */
            dim3 grid(ls_blocks_for(dv, LS_WARP), (unsigned)Hv, (unsigned)n);
            ls_launch(ls_gdn_decode_kernel, grid, LS_WARP, 0, (cudaStream_t)stream, q, k, v, alpha, beta, sq,
                      o, Hk, Hv, dk, dv, act_bf16);
            LS_CUDA_CHECK_LAUNCH("ls_gdn_decode_kernel", err);
            continue;
        }
        dim3 grid(ls_blocks_for(dv, LS_GDN_CPW * LS_GDN_WPB), (unsigned)Hv, (unsigned)n);
        ls_launch(ls_gdn_recurrent_kernel, grid, LS_GDN_WPB * LS_WARP, 0, (cudaStream_t)stream, q, k, v,
                  alpha, beta, sq, o, Hk, Hv, dk, dv, act_bf16);
        LS_CUDA_CHECK_LAUNCH("ls_gdn_recurrent_kernel", err);
    }
    return LS_OK;
}

extern "C" ls_status ls_cuda_gdn_recurrent(const float *q, const float *k, const float *v,
                                           const float *alpha, const float *beta, float *state,
                                           float *o, long T, long Hk, long Hv, long dk, long dv,
                                           int act_bf16, int order, void *stream, ls_error *err)
{
    ls_status st = gdn_check(Hk, Hv, dk, dv, order, err);
    if (st != LS_OK) return st;
    if (T <= 0) return LS_OK;
    long row0 = 0;
    return ls_cuda_gdn_recurrent_batch(q, k, v, alpha, beta, &state, &row0, &T, 1, o, Hk, Hv, dk,
                                       dv, act_bf16, order, stream, err);
}
