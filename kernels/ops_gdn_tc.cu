/* lockstep — the chunk-aligned Gated DeltaNet on tensor cores (see ops.h,
 * docs/tensor-core-tier.md §3).
 *
 * Chunks of C = 64 positions sit at absolute multiples of C. Within a chunk
 * every quantity of row r is a function of rows <= r computed by the same
 * code whether the rows came in one call or one at a time, so a token's bits
 * do not depend on how its chunk was split between calls:
 *   Γ_r = Γ_{r−1} + log α_r                         (one thread, Γ_{−1} = 0)
 *   A_rs = (β_r · dot(k_r, k_s)) · e^{Γ_r − Γ_s}     (s < r, warp dots)
 *   W_r = (β_r e^{Γ_r}) k_r − Σ_{s<r asc} A_rs W_s   (forward substitution,
 *   U_r = β_r v_r − Σ_{s<r asc} A_rs U_s              a thread per column)
 *   V_r = U_r − (W S0)_r,  I_r = e^{Γ_r} (q S0)_r    (WMMA tf32 over dk)
 *   o_r = act(I_r + Σ_{s<=r asc} (dot(q_r, k_s) · e^{Γ_r − Γ_s}) V_s)
 * and a full chunk folds into S0 ← e^{Γ_63} S0 + K̃ᵀ V (WMMA tf32 over the
 * chunk's 64 rows, K̃_s = e^{Γ_63 − Γ_s} k_s). A tensor-core output element
 * is a fixed-order function of one row of A and one column of B, so row r
 * of W S0 and q S0 has the same bits in a tile of 16 rows whatever the other
 * rows hold; rows outside the call are read as +0.0 by selection. The dots
 * are LS_DOT32-shaped: lane l sums elements l, l + 32, … in order (fmaf),
 * then the butterfly. FMA is explicit (fmaf); the tier is GPU-deterministic,
 * not CPU-equal.
 *
 * A call runs in pieces of at most LS_GDNT_PIECE chunks, each three
 * launches: ls_gdnt_rows_kernel (Γ, the key rows, W and U; a block per chunk
 * and head), ls_gdnt_state_kernel (V, I, the fold; a block per head and 32
 * value columns, the piece's chunks in order, S0's columns in shared memory)
 * and ls_gdnt_out_kernel (o; a block per chunk and head). Chunk 0 of a piece
 * keeps its rows in the state's chunk area, the others in the scratch; the
 * call's last chunk, when in the scratch, is copied into the state's area.
 * Rows a chunk has not run are +0.0 there (its first call zeroes them), so
 * the whole state after a call depends on the positions run, not on the
 * calls. */
#include "ops.h"
#include "ops_common.cuh"

#include <mma.h>

#define LS_GDNT_C LS_CUDA_GDN_CHUNK       /* rows per chunk */
#define LS_GDNT_PIECE 16                  /* chunks per piece */
#define LS_GDNT_COLS 32                   /* value columns per state block */
#define LS_GDNT_LDS (LS_GDNT_COLS + 8)    /* shared leading dimension of 32-column tiles */
#define LS_GDNT_MAXD LS_CUDA_GDN_MAX_DK
#define LS_GDNT_LOG_MIN (-200.0f)         /* log α of α = 0: e^{−200} is 0 in fp32 */

/* A piece: n rows of a call that started at position pos0, from position
 * p0 on; its chunk i (of nch) starts at position cs0 + i·C. */
typedef struct ls_gdnt_piece {
    long n, p0, cs0, pos0;
    int nch;
} ls_gdnt_piece;

/* Rows [ra, rb) of chunk i are the call's. */
__device__ __forceinline__ void ls_gdnt_rows(const ls_gdnt_piece &pc, int i, int *ra, int *rb)
{
    long cs = pc.cs0 + (long)i * LS_GDNT_C, end = pc.p0 + pc.n;
    *ra = i == 0 ? (int)(pc.p0 - pc.cs0) : 0;
    *rb = (int)(end - cs < LS_GDNT_C ? end - cs : LS_GDNT_C);
}

/* Head h's rows of chunk i: k [C, dk], W [C, dk], U [C, dv], V [C, dv], Γ [C].
 * Rows not run yet are +0.0: a chunk's first call zeroes them, so the area
 * after a call is a function of the positions run, not of the calls. */
typedef struct ls_gdnt_area {
    float *k, *w, *u, *v, *g;
} ls_gdnt_area;

__device__ __forceinline__ ls_gdnt_area ls_gdnt_area_of(float *state, float *scratch, int i, long h, long Hv,
                                                        int dk, int dv)
{
    const long rows = LS_GDNT_C * (long)LS_CUDA_GDN_TC_ROW_FLOATS(dk, dv);
    float *base = i == 0 ? state + Hv * dk * dv : scratch + (long)(i - 1) * Hv * rows;
    ls_gdnt_area a;
    a.k = base + h * rows;
    a.w = a.k + LS_GDNT_C * dk;
    a.u = a.w + LS_GDNT_C * dk;
    a.v = a.u + LS_GDNT_C * dv;
    a.g = a.v + LS_GDNT_C * dv;
    return a;
}

namespace wmma = nvcuda::wmma;
typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> ls_gdnt_acc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> ls_gdnt_a_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> ls_gdnt_a_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> ls_gdnt_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> ls_gdnt_b_col;

template <typename F> __device__ __forceinline__ void ls_gdnt_tf32(F &f)
{
#pragma unroll
    for (int x = 0; x < f.num_elements; x++) f.x[x] = wmma::__float_to_tf32(f.x[x]);
}

/* Out[16 i .., 16 j ..] = X[16 i ..] · Y[16 j ..]ᵀ over d columns (X, Y
 * [C, ld] row-major in shared memory), for the tiles j <= i of the row
 * tiles i0 .. i1, a warp per tile in turn: row r of the product reads rows
 * r of X and the rows of Y only. */
__device__ __forceinline__ void ls_gdnt_xyt(const float *X, const float *Y, int ld, int d, float *Out, int ldo,
                                            int i0, int i1, int warp, int nw)
{
    int njobs = 0;
    for (int i = i0; i <= i1; i++) njobs += i + 1;
    for (int jb = warp; jb < njobs; jb += nw) {
        int i = i0, j = jb;
        while (j > i) j -= ++i;
        ls_gdnt_acc acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < d; kk += 8) {
            ls_gdnt_a_row fa;
            ls_gdnt_b_col fb;
            wmma::load_matrix_sync(fa, X + i * 16 * ld + kk, (unsigned)ld);
            wmma::load_matrix_sync(fb, Y + j * 16 * ld + kk, (unsigned)ld);
            ls_gdnt_tf32(fa);
            ls_gdnt_tf32(fb);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(Out + i * 16 * ldo + j * 16, acc, (unsigned)ldo, wmma::mem_row_major);
    }
}

#define LS_GDNT_LDA (LS_GDNT_C + 8) /* leading dimension of the C x C products */
#define LS_GDNT_T 256               /* threads of the rows and output blocks */

/* ---- 1. Γ, the key rows, W and U ----------------------------------------------------- */

/* Block (chunk i, head h). Shared (dynamic): A [C, LDA], then Ks [C, dk + 8]
 * the chunk's key rows (+0.0 beyond the call), which X [C, dk + dv] (the
 * rows of W | U) later overwrites. Thread c runs column c of W | U. */
__global__ void __launch_bounds__(LS_GDNT_T)
ls_gdnt_rows_kernel(const float *k, const float *v, const float *alpha, const float *beta, float *state,
                    float *scratch, ls_gdnt_piece pc, long Hk, long Hv, int dk, int dv)
{
    extern __shared__ __align__(128) float smr[];
    __shared__ float gam[LS_GDNT_C], bet[LS_GDNT_C];
    float *A = smr, *Ks = A + LS_GDNT_C * LS_GDNT_LDA, *X = Ks;
    const int i = blockIdx.x, tid = threadIdx.x, lane = tid % LS_WARP, warp = tid / LS_WARP;
    const int nw = LS_GDNT_T / LS_WARP, ldk = dk + 8, ld = dk + dv;
    const long h = blockIdx.y, kh = h * Hk / Hv, cs = pc.cs0 + (long)i * LS_GDNT_C;
    int ra, rb;
    ls_gdnt_rows(pc, i, &ra, &rb);
    ls_gdnt_area a = ls_gdnt_area_of(state, scratch, i, h, Hv, dk, dv);
    if (tid == 0) {
        float g = ra > 0 ? a.g[ra - 1] : 0.0f;
        for (int r = 0; r < ra; r++) gam[r] = a.g[r];
        for (int r = ra; r < rb; r++) {
            long t = cs + r - pc.pos0;
            float al = alpha[t * Hv + h];
            float lg = al > 0.0f ? fmaxf(logf(al), LS_GDNT_LOG_MIN) : LS_GDNT_LOG_MIN;
            g = g + lg;
            gam[r] = g;
            a.g[r] = g;
            bet[r] = beta[t * Hv + h];
        }
    }
    /* the key rows: cached, the call's (into the area too), +0.0 beyond */
    for (int r = warp; r < LS_GDNT_C; r += nw) {
        const float *src = r < ra ? a.k + r * dk : k + ((cs + r - pc.pos0) * Hk + kh) * dk;
        for (int c = lane; c < dk; c += LS_WARP) {
            float x = r < rb ? src[c] : 0.0f;
            Ks[r * ldk + c] = x;
            if (r >= ra && (r < rb || ra == 0)) a.k[r * dk + c] = x;
        }
    }
    if (ra == 0) /* the chunk's first call: the rows beyond it start at +0.0 */
        for (int r = rb + warp; r < LS_GDNT_C; r += nw) {
            for (int c = lane; c < dk; c += LS_WARP) a.w[r * dk + c] = 0.0f;
            for (int c = lane; c < dv; c += LS_WARP) a.u[r * dv + c] = a.v[r * dv + c] = 0.0f;
            if (lane == 0) a.g[r] = 0.0f;
        }
    __syncthreads();
    /* k_r · k_s on tensor cores, then A_rs = (β_r kk) e^{Γ_r − Γ_s} for s < r, +0.0 otherwise */
    ls_gdnt_xyt(Ks, Ks, ldk, dk, A, LS_GDNT_LDA, ra / 16, (rb - 1) / 16, warp, nw);
    __syncthreads();
    for (int r = ra + warp; r < rb; r += nw)
        for (int s = lane; s < LS_GDNT_C; s += LS_WARP)
            A[r * LS_GDNT_LDA + s] = s < r ? (bet[r] * A[r * LS_GDNT_LDA + s]) * expf(gam[r] - gam[s]) : 0.0f;
    __syncthreads();
    /* forward substitution, column c of W | U, rows ascending (X over Ks) */
    if (tid < ld) {
        const int c = tid;
        for (int r = 0; r < ra; r++) X[r * ld + c] = c < dk ? a.w[r * dk + c] : a.u[r * dv + c - dk];
        for (int r = ra; r < rb; r++) {
            long t = cs + r - pc.pos0;
            float x = c < dk ? (bet[r] * expf(gam[r])) * a.k[r * dk + c] : bet[r] * v[(t * Hv + h) * dv + c - dk];
            const float *Ar = A + r * LS_GDNT_LDA;
#pragma unroll 8
            for (int s = 0; s < r; s++) x = fmaf(-Ar[s], X[s * ld + c], x);
            X[r * ld + c] = x;
            if (c < dk)
                a.w[r * dk + c] = x;
            else
                a.u[r * dv + c - dk] = x;
        }
    }
}

/* ---- 2. V, I and the fold, the piece's chunks in order -------------------------------- */

#define LS_GDNT_SW 4 /* warps of the state block */

/* Block (32 value columns, head h). Shared (dynamic): S [dk, LDS] the state's
 * columns; M [2, C, dk + 8] the chunk's W and q rows (later K̃); R [2, C, LDS]
 * the products W S0 and q S0; Vs [C, LDS] the chunk's V columns. */
__global__ void __launch_bounds__(LS_GDNT_SW * LS_WARP)
ls_gdnt_state_kernel(const float *q, float *state, float *scratch, float *o, ls_gdnt_piece pc, long Hk,
                     long Hv, int dk, int dv)
{
    extern __shared__ __align__(128) float sms[];
    const int ldm = dk + 8, c0 = blockIdx.x * LS_GDNT_COLS, tid = threadIdx.x, lane = tid % LS_WARP;
    const int warp = tid / LS_WARP;
    const long h = blockIdx.y, kh = h * Hk / Hv;
    float *S = sms, *M = S + dk * LS_GDNT_LDS, *R = M + 2 * LS_GDNT_C * ldm, *Vs = R + 2 * LS_GDNT_C * LS_GDNT_LDS;
    float *S0 = state + h * dk * dv;
    for (int r = warp; r < dk; r += LS_GDNT_SW) S[r * LS_GDNT_LDS + lane] = S0[(long)r * dv + c0 + lane];
    for (int i = 0; i < pc.nch; i++) {
        int ra, rb;
        ls_gdnt_rows(pc, i, &ra, &rb);
        const long cs = pc.cs0 + (long)i * LS_GDNT_C;
        ls_gdnt_area a = ls_gdnt_area_of(state, scratch, i, h, Hv, dk, dv);
        const int tr0 = ra / 16, tr1 = (rb - 1) / 16, full = rb == LS_GDNT_C;
        /* the W and q rows of the row tiles that hold the call's rows, +0.0 outside them */
        for (int r = tr0 * 16 + warp; r < tr1 * 16 + 16; r += LS_GDNT_SW) {
            const int in = r >= ra && r < rb;
            const float *qr = q + ((cs + r - pc.pos0) * Hk + kh) * dk;
#pragma unroll 4
            for (int c = lane; c < dk; c += LS_WARP) {
                M[r * ldm + c] = in ? a.w[r * dk + c] : 0.0f;
                M[(LS_GDNT_C + r) * ldm + c] = in ? qr[c] : 0.0f;
            }
        }
        __syncthreads();
        /* jobs (row tile, column tile, W or q), a warp each in turn */
        for (int j = warp; j < (tr1 - tr0 + 1) * 4; j += LS_GDNT_SW) {
            const int tr = tr0 + j / 4, ct = (j / 2) % 2, wq = j % 2;
            ls_gdnt_acc acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < dk; kk += 8) {
                ls_gdnt_a_row fa;
                ls_gdnt_b_row fb;
                wmma::load_matrix_sync(fa, M + (wq * LS_GDNT_C + tr * 16) * ldm + kk, (unsigned)ldm);
                wmma::load_matrix_sync(fb, S + kk * LS_GDNT_LDS + ct * 16, LS_GDNT_LDS);
                ls_gdnt_tf32(fa);
                ls_gdnt_tf32(fb);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(R + (wq * LS_GDNT_C + tr * 16) * LS_GDNT_LDS + ct * 16, acc, LS_GDNT_LDS,
                                    wmma::mem_row_major);
        }
        __syncthreads();
        /* V_r = U_r − (W S0)_r and I_r = e^{Γ_r} (q S0)_r, a lane per column; the fold needs every row's V */
        for (int r = (full ? 0 : ra) + warp; r < rb; r += LS_GDNT_SW) {
            if (r < ra) {
                Vs[r * LS_GDNT_LDS + lane] = a.v[r * dv + c0 + lane];
                continue;
            }
            float vr = a.u[r * dv + c0 + lane] - R[r * LS_GDNT_LDS + lane];
            Vs[r * LS_GDNT_LDS + lane] = vr;
            a.v[r * dv + c0 + lane] = vr;
            o[((cs + r - pc.pos0) * Hv + h) * dv + c0 + lane] = expf(a.g[r]) * R[(LS_GDNT_C + r) * LS_GDNT_LDS + lane];
        }
        if (!full) continue; /* the last chunk of the call; the next chunk's staging writes M only */
        /* the fold: K̃_s = e^{Γ_63 − Γ_s} k_s into M, then S ← e^{Γ_63} S + K̃ᵀ V per 16x16 tile */
        const float g63 = a.g[LS_GDNT_C - 1], e63 = expf(g63);
        for (int s = warp; s < LS_GDNT_C; s += LS_GDNT_SW) {
            const float d = expf(g63 - a.g[s]);
#pragma unroll 4
            for (int c = lane; c < dk; c += LS_WARP) M[s * ldm + c] = d * a.k[s * dk + c];
        }
        __syncthreads();
        for (int j = warp; j < (dk / 16) * 2; j += LS_GDNT_SW) {
            const int ti = j / 2, ct = j % 2;
            float *St = S + ti * 16 * LS_GDNT_LDS + ct * 16;
            ls_gdnt_acc acc;
            wmma::load_matrix_sync(acc, St, LS_GDNT_LDS, wmma::mem_row_major);
#pragma unroll
            for (int x = 0; x < acc.num_elements; x++) acc.x[x] = e63 * acc.x[x];
            for (int ks = 0; ks < LS_GDNT_C; ks += 8) {
                ls_gdnt_a_col fa;
                ls_gdnt_b_row fb;
                wmma::load_matrix_sync(fa, M + ks * ldm + ti * 16, (unsigned)ldm);
                wmma::load_matrix_sync(fb, Vs + ks * LS_GDNT_LDS + ct * 16, LS_GDNT_LDS);
                ls_gdnt_tf32(fa);
                ls_gdnt_tf32(fb);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(St, acc, LS_GDNT_LDS, wmma::mem_row_major);
        }
        __syncthreads();
    }
    for (int r = warp; r < dk; r += LS_GDNT_SW) S0[(long)r * dv + c0 + lane] = S[r * LS_GDNT_LDS + lane];
}

/* ---- 3. the outputs ---------------------------------------------------------------- */

#define LS_GDNT_OC (LS_CUDA_GDN_MAX_DK / LS_WARP) /* output columns per lane */

/* Block (chunk i, head h). Shared (dynamic): P [C, LDA]; Qs, Ks [C, dk + 8]
 * the call's q rows and the chunk's key rows (+0.0 elsewhere), which Vs
 * [C, dv] (the chunk's V rows) later overwrites. P_rs = (q_r · k_s) e^{Γ_r −
 * Γ_s} for s <= r (+0.0 otherwise), then o_r = act(I_r + Σ_{s<=r asc} P_rs
 * V_s): a warp per row, a lane per column (LS_GDNT_OC of them). */
__global__ void __launch_bounds__(LS_GDNT_T)
ls_gdnt_out_kernel(const float *q, float *state, float *scratch, float *o, ls_gdnt_piece pc, long Hk, long Hv,
                   int dk, int dv, int act)
{
    extern __shared__ __align__(128) float smo[];
    __shared__ float gam[LS_GDNT_C];
    const int ldk = dk + 8;
    float *P = smo, *Qs = P + LS_GDNT_C * LS_GDNT_LDA, *Ks = Qs + LS_GDNT_C * ldk, *Vs = Qs;
    const int i = blockIdx.x, tid = threadIdx.x, lane = tid % LS_WARP, warp = tid / LS_WARP;
    const int nw = LS_GDNT_T / LS_WARP;
    const long h = blockIdx.y, kh = h * Hk / Hv, cs = pc.cs0 + (long)i * LS_GDNT_C;
    int ra, rb;
    ls_gdnt_rows(pc, i, &ra, &rb);
    ls_gdnt_area a = ls_gdnt_area_of(state, scratch, i, h, Hv, dk, dv);
    if (tid < LS_GDNT_C) gam[tid] = a.g[tid];
    for (int r = warp; r < LS_GDNT_C; r += nw) {
        const float *qr = q + ((cs + r - pc.pos0) * Hk + kh) * dk;
        for (int c = lane; c < dk; c += LS_WARP) {
            Qs[r * ldk + c] = r >= ra && r < rb ? qr[c] : 0.0f;
            Ks[r * ldk + c] = r < rb ? a.k[r * dk + c] : 0.0f;
        }
    }
    __syncthreads();
    ls_gdnt_xyt(Qs, Ks, ldk, dk, P, LS_GDNT_LDA, ra / 16, (rb - 1) / 16, warp, nw);
    __syncthreads();
    for (int r = ra + warp; r < rb; r += nw)
        for (int s = lane; s < LS_GDNT_C; s += LS_WARP)
            P[r * LS_GDNT_LDA + s] = s <= r ? P[r * LS_GDNT_LDA + s] * expf(gam[r] - gam[s]) : 0.0f;
    __syncthreads(); /* Vs over Qs and Ks, read by the products above */
    for (int r = warp; r < rb; r += nw)
        for (int c = lane; c < dv; c += LS_WARP) Vs[r * dv + c] = a.v[r * dv + c];
    __syncthreads();
    for (int r = ra + warp; r < rb; r += nw) {
        float *orow = o + ((cs + r - pc.pos0) * Hv + h) * dv;
        float x[LS_GDNT_OC];
#pragma unroll
        for (int m = 0; m < LS_GDNT_OC; m++) x[m] = lane + m * LS_WARP < dv ? orow[lane + m * LS_WARP] : 0.0f;
        const float *Pr = P + r * LS_GDNT_LDA;
        for (int s = 0; s <= r; s++) {
            const float p = Pr[s];
#pragma unroll
            for (int m = 0; m < LS_GDNT_OC; m++)
                if (lane + m * LS_WARP < dv) x[m] = fmaf(p, Vs[s * dv + lane + m * LS_WARP], x[m]);
        }
#pragma unroll
        for (int m = 0; m < LS_GDNT_OC; m++)
            if (lane + m * LS_WARP < dv) orow[lane + m * LS_WARP] = ls_act_d(x[m], act);
    }
}

/* ---- the state after a position, for a digest ------------------------------------------ */

__global__ void __launch_bounds__(256)
ls_gdnt_mat_kernel(const float *state, long pos, float *s_out, long Hv, int dk, int dv)
{
    __shared__ float d[LS_GDNT_C];
    const long h = blockIdx.y;
    const int r = (int)(pos % LS_GDNT_C);
    ls_gdnt_area a = ls_gdnt_area_of((float *)state, NULL, 0, h, Hv, dk, dv);
    const float *S0 = state + h * dk * dv;
    if ((int)threadIdx.x <= r) d[threadIdx.x] = expf(a.g[r] - a.g[threadIdx.x]);
    __syncthreads();
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= dk * dv) return;
    if (r == LS_GDNT_C - 1) { /* folded at the boundary already */
        s_out[h * dk * dv + e] = S0[e];
        return;
    }
    int ii = e / dv, j = e % dv;
    float x = expf(a.g[r]) * S0[e];
    for (int s = 0; s <= r; s++) x = fmaf(d[s] * a.k[s * dk + ii], a.v[s * dv + j], x);
    s_out[h * dk * dv + e] = x;
}

/* ---- host entry points -------------------------------------------------------------- */

static size_t gdnt_area_bytes(long Hv, long dk, long dv)
{
    return sizeof(float) * (size_t)Hv * LS_GDNT_C * LS_CUDA_GDN_TC_ROW_FLOATS(dk, dv);
}

/* Chunks a call of T rows may touch (from row C − 1 of a chunk on), at most a piece's. */
static long gdnt_chunks(long T)
{
    long n = (T + LS_GDNT_C - 2) / LS_GDNT_C + 1;
    return n < LS_GDNT_PIECE ? n : LS_GDNT_PIECE;
}

extern "C" size_t ls_cuda_gdn_tc_scratch_bytes(long T, long Hv, long dk, long dv)
{
    return T <= 0 ? 0 : (size_t)(gdnt_chunks(T) - 1) * gdnt_area_bytes(Hv, dk, dv);
}

static ls_status gdnt_check(const char *op, long Hk, long Hv, long dk, long dv, ls_error *err)
{
    LS_CUDA_REQUIRE(Hk >= 1 && Hv >= 1 && Hv <= 65535 && dk >= 16 && dk <= LS_GDNT_MAXD && dk % 16 == 0 &&
                        dv >= LS_GDNT_COLS && dv <= LS_GDNT_MAXD && dv % LS_GDNT_COLS == 0,
                    err,
                    "cuda tensor-core %s: shape Hk %ld Hv %ld dk %ld dv %ld not supported (needs dk a multiple "
                    "of 16 and dv of %d, both <= %d, Hv <= 65535)",
                    op, Hk, Hv, dk, dv, LS_GDNT_COLS, LS_GDNT_MAXD);
    return LS_OK;
}

static size_t gdnt_rows_smem(long dk, long dv)
{
    return sizeof(float) * LS_GDNT_C * (size_t)(LS_GDNT_LDA + dk + dv);
}

static size_t gdnt_out_smem(long dk, long dv)
{
    size_t qk = 2 * (size_t)(dk + 8);
    return sizeof(float) * LS_GDNT_C * (LS_GDNT_LDA + (qk > (size_t)dv ? qk : (size_t)dv));
}

static size_t gdnt_state_smem(long dk)
{
    return sizeof(float) * ((size_t)dk * LS_GDNT_LDS + 2 * LS_GDNT_C * (size_t)(dk + 8) +
                            3 * LS_GDNT_C * LS_GDNT_LDS);
}

extern "C" ls_status ls_cuda_gdn_chunked_tc(const float *q, const float *k, const float *v, const float *alpha,
                                            const float *beta, float *state, float *o, long T, long pos0, long Hk,
                                            long Hv, long dk, long dv, int act_bf16, void *scratch,
                                            size_t scratch_bytes, void *stream, ls_error *err)
{
    ls_status st = gdnt_check("gdn_chunked", Hk, Hv, dk, dv, err);
    if (st != LS_OK) return st;
    LS_CUDA_REQUIRE(pos0 >= 0, err, "cuda tensor-core gdn_chunked: position %ld < 0", pos0);
    if (T <= 0) return LS_OK;
    size_t need = ls_cuda_gdn_tc_scratch_bytes(T, Hv, dk, dv);
    if (scratch_bytes < need)
        return ls_fail(err, LS_E_INTERNAL, "cuda tensor-core gdn_chunked: scratch of %zu bytes, %zu needed",
                       scratch_bytes, need);
    cudaStream_t s = (cudaStream_t)stream;
    const size_t rows_smem = gdnt_rows_smem(dk, dv), state_smem = gdnt_state_smem(dk),
                 out_smem = gdnt_out_smem(dk, dv);
    LS_CUDA_CHECK(cudaFuncSetAttribute(ls_gdnt_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)rows_smem),
                  err, "the GDN rows kernel's shared memory");
    LS_CUDA_CHECK(cudaFuncSetAttribute(ls_gdnt_state_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)state_smem),
                  err, "the GDN state kernel's shared memory");
    LS_CUDA_CHECK(cudaFuncSetAttribute(ls_gdnt_out_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)out_smem),
                  err, "the GDN output kernel's shared memory");
    float *scr = (float *)scratch;
    const int idk = (int)dk, idv = (int)dv;
    ls_gdnt_piece pc = {0, 0, 0, pos0, 0};
    for (long t0 = 0; t0 < T; t0 += pc.n) {
        pc.p0 = pos0 + t0;
        pc.cs0 = pc.p0 - pc.p0 % LS_GDNT_C;
        long room = LS_GDNT_PIECE * LS_GDNT_C - (pc.p0 - pc.cs0);
        pc.n = T - t0 < room ? T - t0 : room;
        pc.nch = (int)((pc.p0 - pc.cs0 + pc.n + LS_GDNT_C - 1) / LS_GDNT_C);
        dim3 chunks((unsigned)pc.nch, (unsigned)Hv);
        ls_gdnt_rows_kernel<<<chunks, LS_GDNT_T, rows_smem, s>>>(k, v, alpha, beta, state, scr, pc, Hk, Hv, idk,
                                                                 idv);
        LS_CUDA_CHECK_LAUNCH("ls_gdnt_rows_kernel", err);
        ls_gdnt_state_kernel<<<dim3((unsigned)(dv / LS_GDNT_COLS), (unsigned)Hv), LS_GDNT_SW * LS_WARP,
                               state_smem, s>>>(q, state, scr, o, pc, Hk, Hv, idk, idv);
        LS_CUDA_CHECK_LAUNCH("ls_gdnt_state_kernel", err);
        ls_gdnt_out_kernel<<<chunks, LS_GDNT_T, out_smem, s>>>(q, state, scr, o, pc, Hk, Hv, idk, idv, act_bf16);
        LS_CUDA_CHECK_LAUNCH("ls_gdnt_out_kernel", err);
    }
    /* the last chunk's rows into the state's area when they are in the
     * scratch: the area then holds the rows of the last position's chunk
     * whatever the calls were */
    if (pc.nch > 1) {
        size_t area = gdnt_area_bytes(Hv, dk, dv);
        LS_CUDA_CHECK(cudaMemcpyAsync(state + Hv * dk * dv, (char *)scratch + (size_t)(pc.nch - 2) * area, area,
                                      cudaMemcpyDeviceToDevice, s),
                      err, "the GDN chunk rows' copy");
    }
    return LS_OK;
}

extern "C" ls_status ls_cuda_gdn_chunked_tc_state(const float *state, long pos, float *s_out, long Hv, long dk,
                                                  long dv, void *stream, ls_error *err)
{
    ls_status st = gdnt_check("gdn_chunked_state", 1, Hv, dk, dv, err);
    if (st != LS_OK) return st;
    LS_CUDA_REQUIRE(pos >= 0, err, "cuda tensor-core gdn_chunked_state: position %ld < 0", pos);
    dim3 grid(ls_blocks_for(dk * dv, 256), (unsigned)Hv);
    ls_gdnt_mat_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>(state, pos, s_out, Hv, (int)dk, (int)dv);
    LS_CUDA_CHECK_LAUNCH("ls_gdnt_mat_kernel", err);
    return LS_OK;
}
