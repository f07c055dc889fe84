/* lockstep — the chunk-aligned Gated DeltaNet on tensor cores (see ops.h,
 * docs/tensor-core-tier.md §3.6).
 *
 * Chunks of C = 64 positions sit at absolute multiples of C. Within a chunk
 * every quantity of row r is a function of rows <= r computed by the same
 * code whether the rows came in one call or one at a time, so a token's bits
 * do not depend on how its chunk was split between calls. Per value head
 * (key head h·Hk/Hv), S_n the state at the chunk's start:
 *   Γ_r  = Γ_{r−1} + max(log α_r, −200)           (one thread; Γ_{−1} = 0)
 *   A_rs = (β_r (K Kᵀ)_rs) e^{Γ_r − Γ_s}, s < r     (K Kᵀ on tensor cores)
 *   W_r  = (β_r e^{Γ_r}) k_r − Σ_{s<r asc} A_rs W_s (forward substitution on
 *   U_r  = β_r v_r − Σ_{s<r asc} A_rs U_s            CUDA cores, fmaf)
 *   V_r  = U_r − (W S_n)_r                           (tensor cores over dk)
 *   P_rs = (Q Kᵀ)_rs e^{Γ_r − Γ_s}, s <= r          (Q Kᵀ on tensor cores)
 *   O_r  = e^{Γ_r} (Q S_n)_r, then O_r += Σ P_rs V_s over the 16-row tiles
 *          before row r's own (tensor cores), then
 *   o_r  = act(O_r + Σ_{s in r's tile, s <= r, asc} P_rs V_s) (CUDA cores)
 * and a full chunk folds: S_{n+1} = e^{Γ_63} S_n + Kᵀ Ṽ (tensor cores over
 * the 64 rows, Ṽ_s = e^{Γ_63 − Γ_s} V_s). Every product is 16x16 tiles of
 * PTX mma.m16n8k4 with tf32 operands (rounded from fp32) and fp32
 * accumulation, k-steps of 4 ascending: on sm_90 what WMMA 16x16x8 tf32
 * compiles to. A tensor-core output element is a fixed-order function of one
 * row of its A operand and one column of its B operand, so row r of a product
 * has the same bits in a tile of 16 rows whatever the other rows hold: rows
 * outside the call are +0.0 by selection, entries s > r of A and P are +0.0
 * by selection, and no sum over s meets an s > r (the P V sums on tensor
 * cores stop before row r's tile). The tier is GPU-deterministic, not
 * CPU-equal.
 *
 * A call runs in pieces of at most LS_GDNT_PIECE chunks, three launches
 * each: ls_gdnt_rows_kernel (Γ, the key rows, W and U; a block per chunk
 * and head), ls_gdnt_state_kernel (V and the folds; a block per head and 32
 * value columns, the piece's chunks in order, S_n's columns in shared
 * memory, the next chunk's inputs copied while one runs, each chunk's start
 * state left in the scratch) and ls_gdnt_out_kernel (o; a block per chunk
 * and head, its value columns up to 128). Chunk 0 of a piece keeps its rows
 * in the state's chunk area, the others in the scratch; the call's last
 * chunk, when in the scratch, is copied into the state's area. Rows a chunk has not run
 * are +0.0 there (its first call zeroes them), so the whole state after a
 * call depends on the positions run, not on the calls. A decode step of
 * many sequences (ls_cuda_gdn_chunked_tc_decode) is one launch of each
 * kernel, block z taking sequence z's state and the piece its own
 * one-position call would have (ls_gdnt_seq). */
#include "ops.h"
#include "ops_common.cuh"

#include <cuda_pipeline.h>

#define LS_GDNT_C LS_CUDA_GDN_CHUNK       /* rows per chunk */
#define LS_GDNT_PIECE 16                  /* chunks per piece */
#define LS_GDNT_COLS 32                   /* value columns per state block */
/* Shared-memory leading dimensions (floats), chosen against bank conflicts
 * of the tensor-core fragment loads: one load instruction reads 8 rows x 4
 * columns of a row-major A (or column-major B) tile, so those rows sit 4
 * banks apart (ld = 4 mod 32: LS_GDNT_LDR); it reads 4 rows x 8 columns of a
 * row-major B, a column-major A or an accumulator, so those sit 8 apart
 * (ld = 8 mod 32: LS_GDNT_LDS and LS_GDNT_LDB). Layout only: no bit changes. */
#define LS_GDNT_LDS (LS_GDNT_COLS + 8)    /* 32-column tiles (B row-major, accumulators) */
#define LS_GDNT_LDR(d) ((d) + 4)          /* rows of d columns read as A row-major / B column-major */
#define LS_GDNT_LDB(d) ((d) + 8)          /* rows of d columns read as A column-major */
#define LS_GDNT_MAXD LS_CUDA_GDN_MAX_DK
#define LS_GDNT_LOG_MIN (-200.0f)         /* log α of α = 0: e^{−200} is 0 in fp32 */

/* A piece: n rows of a call that started at position pos0, from position
 * p0 on; its chunk i (of nch) starts at position cs0 + i·C. The chunks'
 * start states lie at scratch + states (floats). */
typedef struct ls_gdnt_piece {
    long n, p0, cs0, pos0, states;
    int nch;
} ls_gdnt_piece;

/* A batched decode step (ls_cuda_gdn_chunked_tc_decode): sequence z of the
 * launch (blockIdx.z) runs one position pos[z], its inputs at row row[z] of
 * the packed rows, with its own state and scratch; n 0 in a plain call. */
typedef struct ls_gdnt_seqs {
    float *state[LS_CUDA_SEQ_CHUNK], *scratch[LS_CUDA_SEQ_CHUNK];
    long row[LS_CUDA_SEQ_CHUNK], pos[LS_CUDA_SEQ_CHUNK];
    int n;
} ls_gdnt_seqs;

/* Sequence z's state, scratch and piece: exactly a one-position call's
 * (its row reached through pos0), so its bits are that call's. */
__device__ __forceinline__ void ls_gdnt_seq(const ls_gdnt_seqs &sq, int z, float *&state, float *&scratch,
                                            ls_gdnt_piece &pc)
{
    const long p = sq.pos[z];
    state = sq.state[z];
    scratch = sq.scratch[z];
    pc.n = 1;
    pc.p0 = p;
    pc.cs0 = p - p % LS_GDNT_C;
    pc.pos0 = p - sq.row[z];
    pc.states = 0;
    pc.nch = 1;
}

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

/* ---- tensor-core tiles ------------------------------------------------------------- */

/* A 16x16 fp32 tile of a product accumulates over k in steps of 4, each
 * step two PTX mma.m16n8k4 with tf32 operands (rounded from fp32, to nearest,
 * ties away) and fp32 accumulation: output columns 0-7, then 8-15. These are
 * the instructions WMMA 16x16x8 tf32 compiles to on sm_90 (its k-step of 8 is
 * two of these steps), written out so that the operands' shared-memory loads
 * are plain loads at constant offsets. Fragments in PTX's layouts, g = lane / 4
 * and t = lane % 4: A (rows m, k) holds (g, t) (g + 8, t) (g, t + 4)
 * (g + 8, t + 4) of a k-step of 8; B (k, columns n) holds (t, g) (t + 4, g)
 * (t, g + 8) (t + 4, g + 8); the accumulator holds (g, 2t) (g, 2t + 1)
 * (g + 8, 2t) (g + 8, 2t + 1), then the same at columns + 8. */
typedef struct ls_gdnt_fa {
    unsigned x[4];
} ls_gdnt_fa;
typedef struct ls_gdnt_fb {
    unsigned x[4];
} ls_gdnt_fb;
typedef struct ls_gdnt_acc {
    float x[8];
} ls_gdnt_acc;

__device__ __forceinline__ unsigned ls_gdnt_tf32(float v)
{
    unsigned u;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(v));
    return u;
}

__device__ __forceinline__ float ls_gdnt_round(float v)
{
    return __uint_as_float(ls_gdnt_tf32(v));
}

/* An operand's register: v rounded to tf32, or v as it is where it was
 * rounded when stored (ls_gdnt_round): the tensor cores read the same bits. */
__device__ __forceinline__ unsigned ls_gdnt_op(float v, bool rounded)
{
    return rounded ? __float_as_uint(v) : ls_gdnt_tf32(v);
}

/* A's k-step of 8 from p: element (m, k) at p[m·rs + k·cs] (row-major: rs = ld, cs = 1). */
__device__ __forceinline__ void ls_gdnt_lda(ls_gdnt_fa &f, const float *p, int rs, int cs, bool rounded = false)
{
    const int l = threadIdx.x % LS_WARP;
    p += l / 4 * rs + l % 4 * cs;
    f.x[0] = ls_gdnt_op(p[0], rounded);
    f.x[1] = ls_gdnt_op(p[8 * rs], rounded);
    f.x[2] = ls_gdnt_op(p[4 * cs], rounded);
    f.x[3] = ls_gdnt_op(p[8 * rs + 4 * cs], rounded);
}

/* B's k-step of 8 from p: element (k, n) at p[k·ks + n·ns] (row-major: ks = ld, ns = 1). */
__device__ __forceinline__ void ls_gdnt_ldb(ls_gdnt_fb &f, const float *p, int ks, int ns, bool rounded = false)
{
    const int l = threadIdx.x % LS_WARP;
    p += l % 4 * ks + l / 4 * ns;
    f.x[0] = ls_gdnt_op(p[0], rounded);
    f.x[1] = ls_gdnt_op(p[4 * ks], rounded);
    f.x[2] = ls_gdnt_op(p[8 * ns], rounded);
    f.x[3] = ls_gdnt_op(p[4 * ks + 8 * ns], rounded);
}

/* The accumulator tile, row-major at p (ld even, p 8-byte aligned). */
__device__ __forceinline__ void ls_gdnt_ldc(ls_gdnt_acc &f, const float *p, int ld)
{
    const int l = threadIdx.x % LS_WARP;
    p += l / 4 * ld + l % 4 * 2;
    float2 v = *(const float2 *)p;
    f.x[0] = v.x, f.x[1] = v.y;
    v = *(const float2 *)(p + 8 * ld);
    f.x[2] = v.x, f.x[3] = v.y;
    v = *(const float2 *)(p + 8);
    f.x[4] = v.x, f.x[5] = v.y;
    v = *(const float2 *)(p + 8 * ld + 8);
    f.x[6] = v.x, f.x[7] = v.y;
}

__device__ __forceinline__ void ls_gdnt_stc(float *p, const ls_gdnt_acc &f, int ld)
{
    const int l = threadIdx.x % LS_WARP;
    p += l / 4 * ld + l % 4 * 2;
    *(float2 *)p = make_float2(f.x[0], f.x[1]);
    *(float2 *)(p + 8 * ld) = make_float2(f.x[2], f.x[3]);
    *(float2 *)(p + 8) = make_float2(f.x[4], f.x[5]);
    *(float2 *)(p + 8 * ld + 8) = make_float2(f.x[6], f.x[7]);
}

__device__ __forceinline__ void ls_gdnt_zero(ls_gdnt_acc &f)
{
#pragma unroll
    for (int x = 0; x < 8; x++) f.x[x] = 0.0f;
}

/* c += one k-step of 4 over 8 output columns (volatile: a warp-wide instruction stays where the warp is converged) */
__device__ __forceinline__ void ls_gdnt_mma4(float *c, unsigned a0, unsigned a1, unsigned b)
{
    asm volatile("mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(b));
}

/* c += a b over a k-step of 8: its first 4 then its last 4, each column half in turn */
__device__ __forceinline__ void ls_gdnt_mma(ls_gdnt_acc &c, const ls_gdnt_fa &a, const ls_gdnt_fb &b)
{
    ls_gdnt_mma4(c.x, a.x[0], a.x[1], b.x[0]);
    ls_gdnt_mma4(c.x, a.x[2], a.x[3], b.x[1]);
    ls_gdnt_mma4(c.x + 4, a.x[0], a.x[1], b.x[2]);
    ls_gdnt_mma4(c.x + 4, a.x[2], a.x[3], b.x[3]);
}

/* Out[16 i .., 16 j ..] = X[16 i ..] · Y[16 j ..]ᵀ over d columns (X, Y
 * [C, ld] row-major in shared memory, rounded to tf32 already if rounded),
 * for the tiles j <= i of the row tiles i0 .. i1: a warp per row tile i and
 * column tiles j, j + 1 (j even; j + 1 if <= i) in turn, the pair sharing
 * X's loads, their chains side by side. Row r of the product reads rows r
 * of X and the rows of Y only. */
__device__ __forceinline__ void ls_gdnt_xyt(const float *X, const float *Y, int ld, int d, float *Out, int ldo,
                                            int i0, int i1, int warp, int nw, bool rounded)
{
    int nitems = 0;
    for (int i = i0; i <= i1; i++) nitems += (i + 2) / 2;
    for (int it = warp; it < nitems; it += nw) {
        int i = i0, q = it;
        while (q >= (i + 2) / 2) q -= (i++ + 2) / 2;
        const int j = 2 * q, nj = j + 1 <= i ? 2 : 1;
        ls_gdnt_acc acc[2];
#pragma unroll
        for (int t = 0; t < 2; t++) ls_gdnt_zero(acc[t]);
        for (int kk = 0; kk < d; kk += 8) {
            ls_gdnt_fa fa;
            ls_gdnt_lda(fa, X + i * 16 * ld + kk, ld, 1, rounded);
#pragma unroll
            for (int t = 0; t < 2; t++) {
                if (t >= nj) continue;
                ls_gdnt_fb fb;
                ls_gdnt_ldb(fb, Y + (j + t) * 16 * ld + kk, 1, ld, rounded);
                ls_gdnt_mma(acc[t], fa, fb);
            }
        }
#pragma unroll
        for (int t = 0; t < 2; t++)
            if (t < nj) ls_gdnt_stc(Out + i * 16 * ldo + (j + t) * 16, acc[t], ldo);
    }
}

#define LS_GDNT_LDA LS_GDNT_LDR(LS_GDNT_C) /* the C x C products (read as A row-major) */
#define LS_GDNT_T 256               /* threads of a rows block */
#define LS_GDNT_OT 512              /* threads of an output block */
#define LS_GDNT_G 8                 /* rows of a group of the forward substitution */
#define LS_GDNT_RPW (LS_GDNT_C / (LS_GDNT_T / LS_WARP)) /* rows per warp of a rows block */
#define LS_GDNT_CPL (2 * LS_GDNT_MAXD / LS_WARP)        /* columns of W | U per lane, at most */

/* ---- 1. Γ, the key rows, W and U ----------------------------------------------------- */

/* Copies n floats (a multiple of 4, both 16-byte aligned) into shared memory, cp.async. */
__device__ __forceinline__ void ls_gdnt_row_async(float *dst, const float *src, int n, int lane)
{
    for (int c = 4 * lane; c < n; c += 4 * LS_WARP) __pipeline_memcpy_async(dst + c, src + c, 16);
}

__device__ __forceinline__ void ls_gdnt_row_zero(float *dst, int n, int lane)
{
    for (int c = 4 * lane; c < n; c += 4 * LS_WARP) *(float4 *)(dst + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/* Rounds to tf32 in place the floats of a row this lane copied (ls_gdnt_row_async, after its wait) or zeroed. */
__device__ __forceinline__ void ls_gdnt_row_round(float *dst, int n, int lane)
{
    for (int c = 4 * lane; c < n; c += 4 * LS_WARP) {
        float4 x = *(float4 *)(dst + c);
        *(float4 *)(dst + c) =
            make_float4(ls_gdnt_round(x.x), ls_gdnt_round(x.y), ls_gdnt_round(x.z), ls_gdnt_round(x.w));
    }
}

/* Block (chunk i, head h). Shared (dynamic): A [C, LDA], then Ks [C, LDR(dk)]
 * the chunk's key rows (+0.0 beyond the call), which X [C, dk + dv] (the
 * rows of W | U) later overwrites. Thread c runs column c of W | U. */
template <int DK, int DV>
__global__ void __launch_bounds__(LS_GDNT_T, 2)
ls_gdnt_rows_kernel(const float *k, const float *v, const float *alpha, const float *beta, float *state,
                    float *scratch, ls_gdnt_piece pc, const ls_gdnt_seqs sq, long Hk, long Hv, int dk_, int dv_)
{
    const int dk = DK ? DK : dk_, dv = DV ? DV : dv_;
    ls_pdl_entry();
    if (sq.n) ls_gdnt_seq(sq, (int)blockIdx.z, state, scratch, pc);
    extern __shared__ __align__(128) float smr[];
    __shared__ float gam[LS_GDNT_C], bet[LS_GDNT_C], bge[LS_GDNT_C];
    float *A = smr, *Ks = A + LS_GDNT_C * LS_GDNT_LDA, *X = Ks;
    const int i = blockIdx.x, tid = threadIdx.x, lane = tid % LS_WARP, warp = tid / LS_WARP;
    const int nw = LS_GDNT_T / LS_WARP, ldk = LS_GDNT_LDR(dk), ld = dk + dv;
    const long h = blockIdx.y, kh = h * Hk / Hv, cs = pc.cs0 + (long)i * LS_GDNT_C;
    int ra, rb;
    ls_gdnt_rows(pc, i, &ra, &rb);
    ls_gdnt_area a = ls_gdnt_area_of(state, scratch, i, h, Hv, dk, dv);
    /* the key rows: cached, the call's, +0.0 beyond (copies in flight while Γ is summed) */
    for (int r = warp; r < LS_GDNT_C; r += nw) {
        if (r < rb)
            ls_gdnt_row_async(Ks + r * ldk, r < ra ? a.k + r * dk : k + ((cs + r - pc.pos0) * Hk + kh) * dk, dk, lane);
        else
            ls_gdnt_row_zero(Ks + r * ldk, dk, lane);
    }
    __pipeline_commit();
    /* log α and β of every row at once, then the running sum from the chunk's start */
    if (tid < LS_GDNT_C) {
        const int r = tid;
        if (r < ra) {
            gam[r] = a.g[r];
        } else if (r < rb) {
            long t = cs + r - pc.pos0;
            float al = alpha[t * Hv + h];
            gam[r] = al > 0.0f ? fmaxf(logf(al), LS_GDNT_LOG_MIN) : LS_GDNT_LOG_MIN;
            bet[r] = beta[t * Hv + h];
        }
    }
    __syncthreads();
    if (tid == 0) {
        float g = ra > 0 ? gam[ra - 1] : 0.0f;
        for (int r = ra; r < rb; r++) {
            g = g + gam[r];
            gam[r] = g;
            bge[r] = bet[r] * expf(g);
        }
    }
    __pipeline_wait_prior(0);
    __syncthreads();
    /* the area: the call's Γ and key rows; the rows beyond start at +0.0 in a chunk's first call */
    if (tid >= ra && tid < rb) a.g[tid] = gam[tid];
    for (int r = ra + warp; r < (ra == 0 ? LS_GDNT_C : rb); r += nw) {
        for (int c = lane; c < dk; c += LS_WARP) a.k[r * dk + c] = Ks[r * ldk + c];
        if (r < rb) continue;
        for (int c = lane; c < dk; c += LS_WARP) a.w[r * dk + c] = 0.0f;
        for (int c = lane; c < dv; c += LS_WARP) a.u[r * dv + c] = a.v[r * dv + c] = 0.0f;
        if (lane == 0) a.g[r] = 0.0f;
    }
    /* k_r · k_s on tensor cores, then A_rs = (β_r kk) e^{Γ_r − Γ_s} for s < r, +0.0 otherwise */
    ls_gdnt_xyt(Ks, Ks, ldk, dk, A, LS_GDNT_LDA, ra / 16, (rb - 1) / 16, warp, nw, false);
    __syncthreads();
    for (int r = ra + warp; r < rb; r += nw)
        for (int s = lane; s < LS_GDNT_C; s += LS_WARP)
            A[r * LS_GDNT_LDA + s] = s < r ? (bet[r] * A[r * LS_GDNT_LDA + s]) * expf(gam[r] - gam[s]) : 0.0f;
    __syncthreads();
    /* the seeds β_r e^{Γ_r} k_r | β_r v_r (the cached rows' W | U) into X over Ks,
     * half a warp's rows at a time: every load issued, then every store */
#pragma unroll
    for (int j0 = 0; j0 < LS_GDNT_RPW; j0 += LS_GDNT_RPW / 2) {
        float x[LS_GDNT_RPW / 2][LS_GDNT_CPL];
#pragma unroll
        for (int j = 0; j < LS_GDNT_RPW / 2; j++) {
            const int r = warp + (j0 + j) * nw;
            const float *vr = v + ((cs + r - pc.pos0) * Hv + h) * dv;
#pragma unroll
            for (int m = 0; m < LS_GDNT_CPL; m++) {
                const int c = lane + m * LS_WARP;
                x[j][m] = r >= rb || c >= ld ? 0.0f
                          : r < ra           ? (c < dk ? a.w[r * dk + c] : a.u[r * dv + c - dk])
                                             : (c < dk ? bge[r] * a.k[r * dk + c] : bet[r] * vr[c - dk]);
            }
        }
#pragma unroll
        for (int j = 0; j < LS_GDNT_RPW / 2; j++) {
            const int r = warp + (j0 + j) * nw;
#pragma unroll
            for (int m = 0; m < LS_GDNT_CPL; m++)
                if (r < rb && lane + m * LS_WARP < ld) X[r * ld + lane + m * LS_WARP] = x[j][m];
        }
    }
    __syncthreads();
    /* forward substitution, column c of W | U: rows in groups of LS_GDNT_G at
     * multiples of LS_GDNT_G, sharing the loads of the rows before the group
     * (each row's terms still in ascending s, one fmaf each: the order of the
     * row-by-row loop), then the group's own rows in order. A group's cached
     * rows (r < ra) take back their W | U before the group's rows read them;
     * its rows from rb on are dropped. */
    if (tid < ld) {
        const int c = tid;
        for (int r0 = ra / LS_GDNT_G * LS_GDNT_G; r0 < rb; r0 += LS_GDNT_G) {
            const float *Ar = A + r0 * LS_GDNT_LDA;
            float x[LS_GDNT_G];
#pragma unroll
            for (int g = 0; g < LS_GDNT_G; g++) x[g] = X[(r0 + g) * ld + c];
            for (int s = 0; s < r0; s += 4) {
                const float x0 = X[s * ld + c], x1 = X[(s + 1) * ld + c], x2 = X[(s + 2) * ld + c],
                            x3 = X[(s + 3) * ld + c];
#pragma unroll
                for (int g = 0; g < LS_GDNT_G; g++) {
                    const float4 a4 = *(const float4 *)(Ar + g * LS_GDNT_LDA + s);
                    x[g] = fmaf(-a4.x, x0, x[g]);
                    x[g] = fmaf(-a4.y, x1, x[g]);
                    x[g] = fmaf(-a4.z, x2, x[g]);
                    x[g] = fmaf(-a4.w, x3, x[g]);
                }
            }
#pragma unroll
            for (int g = 0; g < LS_GDNT_G; g++) {
                const int r = r0 + g;
                if (r < ra) {
                    x[g] = X[r * ld + c];
                    continue;
                }
                if (r >= rb) break;
#pragma unroll
                for (int e = 0; e < g; e++) x[g] = fmaf(-Ar[g * LS_GDNT_LDA + r0 + e], x[e], x[g]);
                X[r * ld + c] = x[g];
                if (c < dk)
                    a.w[r * dk + c] = x[g];
                else
                    a.u[r * dv + c - dk] = x[g];
            }
        }
    }
}

/* ---- 2. V and the fold, the piece's chunks in order ----------------------------------- */

#define LS_GDNT_SW 8 /* warps of the state block */
static_assert(LS_GDNT_SW % 2 == 0, "a state warp's two fold tiles share their columns");

/* The chunk-start states of a piece's chunks [Hv, dk, dv] follow its areas
 * in the scratch; chunk 0's is the state's S0 unless chunk 0 folds. */
__device__ __forceinline__ float *ls_gdnt_start(float *state, float *scratch, const ls_gdnt_piece &pc, int i,
                                                long h, long Hv, int dk, int dv)
{
    int ra, rb;
    ls_gdnt_rows(pc, 0, &ra, &rb);
    if (i == 0 && rb < LS_GDNT_C) return state + h * dk * dv;
    return scratch + pc.states + ((long)i * Hv + h) * dk * dv;
}

/* One chunk's inputs in shared memory: W rows [C, LDR(dk)] (+0.0 outside the
 * call's rows, in the row tiles that hold them), key rows [C, LDB(dk)] (a full
 * chunk: the fold's), U and cached V columns [C, LDS], Γ [C]. */
typedef struct ls_gdnt_buf {
    float *w, *k, *u, *g;
} ls_gdnt_buf;

/* Buffer n (0 or 1) of those from p: computed, not read from an array in
 * local memory, where its pointers would be generic. */
__device__ __forceinline__ ls_gdnt_buf ls_gdnt_buf_at(float *p, int n, int dk)
{
    ls_gdnt_buf b;
    b.w = p + n * LS_GDNT_C * (LS_GDNT_LDR(dk) + LS_GDNT_LDB(dk) + LS_GDNT_LDS + 1);
    b.k = b.w + LS_GDNT_C * LS_GDNT_LDR(dk);
    b.u = b.k + LS_GDNT_C * LS_GDNT_LDB(dk);
    b.g = b.u + LS_GDNT_C * LS_GDNT_LDS;
    return b;
}

/* Starts the copies of chunk i's inputs into b (cp.async, committed by the caller). */
__device__ void ls_gdnt_prefetch(const ls_gdnt_piece &pc, int i, const ls_gdnt_area &a, const ls_gdnt_buf &b,
                                 int dk, int dv, int c0, int warp, int nw, int lane)
{
    int ra, rb;
    ls_gdnt_rows(pc, i, &ra, &rb);
    const int ldw = LS_GDNT_LDR(dk), ldk = LS_GDNT_LDB(dk), full = rb == LS_GDNT_C;
    for (int r = ra / 16 * 16 + warp; r < (rb - 1) / 16 * 16 + 16; r += nw) {
        if (r >= ra && r < rb)
            ls_gdnt_row_async(b.w + r * ldw, a.w + r * dk, dk, lane);
        else
            ls_gdnt_row_zero(b.w + r * ldw, dk, lane);
    }
    for (int r = warp; full && r < LS_GDNT_C; r += nw) ls_gdnt_row_async(b.k + r * ldk, a.k + r * dk, dk, lane);
    /* U of the call's rows, V of the cached ones (a full chunk folds them too) */
    for (int r = warp; r < rb; r += nw) {
        if (r >= ra)
            ls_gdnt_row_async(b.u + r * LS_GDNT_LDS, a.u + r * dv + c0, LS_GDNT_COLS, lane);
        else if (full)
            ls_gdnt_row_async(b.u + r * LS_GDNT_LDS, a.v + r * dv + c0, LS_GDNT_COLS, lane);
    }
    if (warp == 0) ls_gdnt_row_async(b.g, a.g, LS_GDNT_C, lane);
}

/* Block (32 value columns, head h), the piece's chunks in order, the next
 * chunk's inputs copied while this one runs. Shared (dynamic): S [dk, LDS]
 * the state's columns, Sr [dk, LDS] the same rounded to tf32 (the B operand
 * of W S0), R [C, LDS] the product W S0, two ls_gdnt_bufs. Per chunk: its
 * start state out (ls_gdnt_start), V_r = U_r − (W S0)_r for the call's rows,
 * and a full chunk's fold, its Ṽ rounded to tf32 as it is stored. The
 * operands rounded once where stored give the tensor cores the bits they
 * would read rounded at every load. */
template <int DK, int DV>
__global__ void __launch_bounds__(LS_GDNT_SW * LS_WARP, 1)
ls_gdnt_state_kernel(float *state, float *scratch, ls_gdnt_piece pc, const ls_gdnt_seqs sq, long Hv, int dk_,
                     int dv_)
{
    const int dk = DK ? DK : dk_, dv = DV ? DV : dv_;
    ls_pdl_entry();
    if (sq.n) ls_gdnt_seq(sq, (int)blockIdx.z, state, scratch, pc);
    extern __shared__ __align__(128) float sms[];
    const int ldw = LS_GDNT_LDR(dk), ldk = LS_GDNT_LDB(dk), c0 = blockIdx.x * LS_GDNT_COLS, tid = threadIdx.x;
    const int lane = tid % LS_WARP;
    const int warp = tid / LS_WARP;
    const long h = blockIdx.y;
    float *S = sms, *Sr = S + dk * LS_GDNT_LDS, *R = Sr + dk * LS_GDNT_LDS, *p = R + LS_GDNT_C * LS_GDNT_LDS;
    float *S0 = state + h * dk * dv;
    for (int r = warp; r < dk; r += LS_GDNT_SW) {
        const float x = S0[(long)r * dv + c0 + lane];
        S[r * LS_GDNT_LDS + lane] = x;
        Sr[r * LS_GDNT_LDS + lane] = ls_gdnt_round(x);
    }
    ls_gdnt_prefetch(pc, 0, ls_gdnt_area_of(state, scratch, 0, h, Hv, dk, dv), ls_gdnt_buf_at(p, 0, dk), dk, dv,
                     c0, warp, LS_GDNT_SW, lane);
    __pipeline_commit();
    for (int i = 0; i < pc.nch; i++) {
        int ra, rb;
        ls_gdnt_rows(pc, i, &ra, &rb);
        ls_gdnt_area a = ls_gdnt_area_of(state, scratch, i, h, Hv, dk, dv);
        const ls_gdnt_buf b = ls_gdnt_buf_at(p, i % 2, dk);
        if (i + 1 < pc.nch) {
            ls_gdnt_prefetch(pc, i + 1, ls_gdnt_area_of(state, scratch, i + 1, h, Hv, dk, dv),
                             ls_gdnt_buf_at(p, (i + 1) % 2, dk), dk, dv, c0, warp, LS_GDNT_SW, lane);
            __pipeline_commit();
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads();
        const int tr0 = ra / 16, tr1 = (rb - 1) / 16, full = rb == LS_GDNT_C;
        float *start = ls_gdnt_start(state, scratch, pc, i, h, Hv, dk, dv);
        if (start != S0)
            for (int r = warp; r < dk; r += LS_GDNT_SW) start[(long)r * dv + c0 + lane] = S[r * LS_GDNT_LDS + lane];
        /* R = W S0 over the row tiles of the call's rows, a warp per (row tile, column tile) */
        for (int j = warp; j < (tr1 - tr0 + 1) * 2; j += LS_GDNT_SW) {
            const int tr = tr0 + j / 2, ct = j % 2;
            ls_gdnt_acc acc;
            ls_gdnt_zero(acc);
            for (int kk = 0; kk < dk; kk += 8) {
                ls_gdnt_fa fa;
                ls_gdnt_fb fb;
                ls_gdnt_lda(fa, b.w + tr * 16 * ldw + kk, ldw, 1);
                ls_gdnt_ldb(fb, Sr + kk * LS_GDNT_LDS + ct * 16, LS_GDNT_LDS, 1, true);
                ls_gdnt_mma(acc, fa, fb);
            }
            ls_gdnt_stc(R + tr * 16 * LS_GDNT_LDS + ct * 16, acc, LS_GDNT_LDS);
        }
        __syncthreads();
        /* V_r = U_r − R_r into the area, and into the buffer (over U): a full chunk
         * folds, so there Ṽ_s = e^{Γ_63 − Γ_s} V_s, the cached rows' V included */
        const float g63 = full ? b.g[LS_GDNT_C - 1] : 0.0f;
        for (int r = warp; r < rb; r += LS_GDNT_SW) {
            float vr = b.u[r * LS_GDNT_LDS + lane];
            if (r >= ra) {
                vr = vr - R[r * LS_GDNT_LDS + lane];
                a.v[r * dv + c0 + lane] = vr;
            }
            if (full) b.u[r * LS_GDNT_LDS + lane] = ls_gdnt_round(expf(g63 - b.g[r]) * vr);
        }
        if (!full) continue; /* the call's last chunk */
        /* the fold: S ← e^{Γ_63} S + Kᵀ Ṽ per 16x16 tile; a warp's tiles j and
         * j + SW (the same columns) in one pass, sharing Ṽ's loads, their
         * chains of products side by side (each tile's own order unchanged) */
        const float e63 = expf(g63);
        const int nft = (dk / 16) * 2;
        __syncthreads();
        for (int j = warp; j < nft; j += 2 * LS_GDNT_SW) {
            const int ct = j % 2, nt = j + LS_GDNT_SW < nft ? 2 : 1;
            float *St[2];
            ls_gdnt_acc acc[2];
#pragma unroll
            for (int t = 0; t < 2; t++) {
                St[t] = S + (j + t * LS_GDNT_SW) / 2 * 16 * LS_GDNT_LDS + ct * 16;
                if (t >= nt) continue;
                ls_gdnt_ldc(acc[t], St[t], LS_GDNT_LDS);
#pragma unroll
                for (int x = 0; x < 8; x++) acc[t].x[x] = e63 * acc[t].x[x];
            }
            for (int ks = 0; ks < LS_GDNT_C; ks += 8) {
                ls_gdnt_fb fb;
                ls_gdnt_ldb(fb, b.u + ks * LS_GDNT_LDS + ct * 16, LS_GDNT_LDS, 1, true);
#pragma unroll
                for (int t = 0; t < 2; t++) {
                    if (t >= nt) continue;
                    ls_gdnt_fa fa;
                    ls_gdnt_lda(fa, b.k + ks * ldk + (j + t * LS_GDNT_SW) / 2 * 16, 1, ldk);
                    ls_gdnt_mma(acc[t], fa, fb);
                }
            }
#pragma unroll
            for (int t = 0; t < 2; t++) {
                if (t >= nt) continue;
                ls_gdnt_stc(St[t], acc[t], LS_GDNT_LDS);
#pragma unroll
                for (int x = 0; x < 8; x++) acc[t].x[x] = ls_gdnt_round(acc[t].x[x]);
                ls_gdnt_stc(Sr + (St[t] - S), acc[t], LS_GDNT_LDS);
            }
        }
        __syncthreads(); /* S complete; the buffer free for chunk i + 2's copies */
    }
    __syncthreads();
    for (int r = warp; r < dk; r += LS_GDNT_SW) S0[(long)r * dv + c0 + lane] = S[r * LS_GDNT_LDS + lane];
}

/* ---- 3. the outputs ---------------------------------------------------------------- */

/* Value columns per output block: all of a head's (up to 128), so P is formed once per chunk and head. */
__host__ __device__ constexpr int ls_gdnt_out_cols(int dv)
{
    return dv % 128 == 0 ? 128 : dv % 64 == 0 ? 64 : LS_GDNT_COLS;
}
/* O = q Ss keeps two accumulator tiles per warp, the same columns: the 4 x 8 tiles of 128 columns fit */
static_assert(2 * (LS_GDNT_OT / LS_WARP) >= (LS_GDNT_C / 16) * (LS_GDNT_MAXD / 16), "output block too small");
static_assert((LS_GDNT_OT / LS_WARP) % (LS_GDNT_MAXD / 16) == 0, "a warp's two O tiles in different columns");

/* Block (chunk i, head h, pw value columns from c0). Shared (dynamic): P [C,
 * LDA]; Qs [C, LDR(dk)] the call's q rows (+0.0 elsewhere); then Ks [C,
 * LDR(dk)] the chunk's key rows (+0.0 beyond the call), overwritten by the chunk's
 * start state Ss [dk, LDB(pw)], overwritten by O [C, LDB(pw)] and Vs [C, LDB(pw)]
 * (the chunk's V rows). P_rs = (q_r · k_s) e^{Γ_r − Γ_s} for s <= r (+0.0
 * otherwise); O = q Ss, then O_r = e^{Γ_r} O_r, then O += P V over the
 * 16-row tiles before row r's own (tensor cores: every s there is < r), then
 * o_r = act(O_r + Σ_{s from r's tile, s <= r, asc} P_rs V_s) on CUDA cores. */
template <int DK, int DV>
__global__ void __launch_bounds__(LS_GDNT_OT)
ls_gdnt_out_kernel(const float *q, float *state, float *scratch, float *o, ls_gdnt_piece pc, const ls_gdnt_seqs sq,
                   long Hk, long Hv, int dk_, int dv_, int pw_, int act)
{
    const int dk = DK ? DK : dk_, dv = DV ? DV : dv_, pw = DV ? ls_gdnt_out_cols(DV) : pw_;
    ls_pdl_entry();
    extern __shared__ __align__(128) float smo[];
    __shared__ float gam[LS_GDNT_C];
    int cb = (int)blockIdx.z; /* column block; batched: sequence cb / (dv / pw) */
    if (sq.n) {
        ls_gdnt_seq(sq, cb / (dv / pw), state, scratch, pc);
        cb %= dv / pw;
    }
    const int ldk = LS_GDNT_LDR(dk), ldo = LS_GDNT_LDB(pw), c0 = cb * pw;
    float *P = smo, *Qs = P + LS_GDNT_C * LS_GDNT_LDA, *Ks = Qs + LS_GDNT_C * ldk, *Ss = Ks, *O = Ks,
          *Vs = O + LS_GDNT_C * ldo;
    const int i = blockIdx.x, tid = threadIdx.x, lane = tid % LS_WARP, warp = tid / LS_WARP;
    const int nw = LS_GDNT_OT / LS_WARP;
    const long h = blockIdx.y, kh = h * Hk / Hv, cs = pc.cs0 + (long)i * LS_GDNT_C;
    int ra, rb;
    ls_gdnt_rows(pc, i, &ra, &rb);
    ls_gdnt_area a = ls_gdnt_area_of(state, scratch, i, h, Hv, dk, dv);
    if (tid < LS_GDNT_C) gam[tid] = a.g[tid];
    for (int r = warp; r < LS_GDNT_C; r += nw) {
        if (r >= ra && r < rb)
            ls_gdnt_row_async(Qs + r * ldk, q + ((cs + r - pc.pos0) * Hk + kh) * dk, dk, lane);
        else
            ls_gdnt_row_zero(Qs + r * ldk, dk, lane);
        if (r < rb)
            ls_gdnt_row_async(Ks + r * ldk, a.k + r * dk, dk, lane);
        else
            ls_gdnt_row_zero(Ks + r * ldk, dk, lane);
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    for (int r = warp; r < LS_GDNT_C; r += nw) { /* q and k only meet the tensor cores: rounded once */
        ls_gdnt_row_round(Qs + r * ldk, dk, lane);
        ls_gdnt_row_round(Ks + r * ldk, dk, lane);
    }
    __syncthreads();
    const int tr0 = ra / 16, tr1 = (rb - 1) / 16, nct = pw / 16, njobs = (tr1 - tr0 + 1) * nct;
    ls_gdnt_xyt(Qs, Ks, ldk, dk, P, LS_GDNT_LDA, tr0, tr1, warp, nw, true);
    __syncthreads(); /* Ks read: the start state over it, copied while P is scaled */
    const float *st = ls_gdnt_start(state, scratch, pc, i, h, Hv, dk, dv);
    for (int r = warp; r < dk; r += nw) ls_gdnt_row_async(Ss + r * ldo, st + (long)r * dv + c0, pw, lane);
    __pipeline_commit();
    for (int r = ra + warp; r < rb; r += nw) /* left of row r's tile P meets only the tensor cores: rounded */
        for (int s = lane; s < LS_GDNT_C; s += LS_WARP) {
            const float x = s <= r ? P[r * LS_GDNT_LDA + s] * expf(gam[r] - gam[s]) : 0.0f;
            P[r * LS_GDNT_LDA + s] = s < r / 16 * 16 ? ls_gdnt_round(x) : x;
        }
    __pipeline_wait_prior(0);
    for (int r = warp; r < dk; r += nw) ls_gdnt_row_round(Ss + r * ldo, pw, lane);
    __syncthreads();
    /* O = q Ss, a warp per (row tile, column tile), kept in registers across
     * the barrier: a warp's jobs j and j + nw (the same columns) in one pass,
     * sharing the loads of Ss, their chains of products side by side */
    ls_gdnt_acc acc[2];
    const int ct = warp % nct, nj = warp + nw < njobs ? 2 : warp < njobs ? 1 : 0;
#pragma unroll
    for (int m = 0; m < 2; m++) ls_gdnt_zero(acc[m]);
    for (int kk = 0; nj && kk < dk; kk += 8) {
        ls_gdnt_fb fb;
        ls_gdnt_ldb(fb, Ss + kk * ldo + ct * 16, ldo, 1, true);
#pragma unroll
        for (int m = 0; m < 2; m++) {
            if (m >= nj) continue;
            ls_gdnt_fa fa;
            ls_gdnt_lda(fa, Qs + (tr0 + (warp + m * nw) / nct) * 16 * ldk + kk, ldk, 1, true);
            ls_gdnt_mma(acc[m], fa, fb);
        }
    }
    __syncthreads(); /* Ss read: O and Vs over it */
#pragma unroll
    for (int m = 0; m < 2; m++) {
        const int j = warp + m * nw;
        if (j < njobs)
            ls_gdnt_stc(O + (tr0 + j / nct) * 16 * ldo + (j % nct) * 16, acc[m], ldo);
    }
    for (int r = warp; r < rb; r += nw) ls_gdnt_row_async(Vs + r * ldo, a.v + r * dv + c0, pw, lane);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    for (int r = ra + warp; r < rb; r += nw) {
        const float eg = expf(gam[r]);
        for (int c = lane; c < pw; c += LS_WARP) O[r * ldo + c] = eg * O[r * ldo + c];
    }
    __syncthreads();
    /* O += P V over the tiles before each row tile's own */
    for (int j = warp; j < njobs; j += nw) {
        const int tr = tr0 + j / nct, ct = j % nct;
        if (tr == 0) continue;
        float *Ot = O + tr * 16 * ldo + ct * 16;
        ls_gdnt_acc ac;
        ls_gdnt_ldc(ac, Ot, ldo);
        for (int ks = 0; ks < tr * 16; ks += 8) {
            ls_gdnt_fa fa;
            ls_gdnt_fb fb;
            ls_gdnt_lda(fa, P + tr * 16 * LS_GDNT_LDA + ks, LS_GDNT_LDA, 1, true);
            ls_gdnt_ldb(fb, Vs + ks * ldo + ct * 16, ldo, 1);
            ls_gdnt_mma(ac, fa, fb);
        }
        ls_gdnt_stc(Ot, ac, ldo);
    }
    __syncthreads();
    for (int r = ra + warp; r < rb; r += nw) {
        float *orow = o + ((cs + r - pc.pos0) * Hv + h) * dv + c0;
        const float *Pr = P + r * LS_GDNT_LDA;
        /* columns c and c + 32: two chains (where pw is 32, c2 = c: one chain twice, its value stored twice) */
        for (int c = lane; c < pw; c += 2 * LS_WARP) {
            const int c2 = c + LS_WARP < pw ? c + LS_WARP : c;
            float x = O[r * ldo + c], x2 = O[r * ldo + c2];
            for (int s = r / 16 * 16; s <= r; s++) {
                x = fmaf(Pr[s], Vs[s * ldo + c], x);
                x2 = fmaf(Pr[s], Vs[s * ldo + c2], x2);
            }
            orow[c] = ls_act_d(x, act);
            orow[c2] = ls_act_d(x2, act);
        }
    }
}

/* ---- the state after a position, for a digest ------------------------------------------ */

__global__ void __launch_bounds__(256)
ls_gdnt_mat_kernel(const float *state, long pos, float *s_out, long Hv, int dk, int dv)
{
    ls_pdl_entry();
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

/* The scratch: n − 1 areas, then n chunk-start states (ls_gdnt_start), n
 * the chunks a piece of the call may touch. */
extern "C" size_t ls_cuda_gdn_tc_scratch_bytes(long T, long Hv, long dk, long dv)
{
    size_t n = (size_t)gdnt_chunks(T);
    return T <= 0 ? 0 : (n - 1) * gdnt_area_bytes(Hv, dk, dv) + n * sizeof(float) * (size_t)(Hv * dk * dv);
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

/* The output blocks' value columns. */
static long gdnt_out_cols(long dv)
{
    return ls_gdnt_out_cols((int)dv);
}

static size_t gdnt_out_smem(long dk, long dv)
{
    long pw = gdnt_out_cols(dv);
    size_t ks = LS_GDNT_C * (size_t)LS_GDNT_LDR(dk), ss = (size_t)(dk * LS_GDNT_LDB(pw));
    size_t ov = 2 * LS_GDNT_C * (size_t)LS_GDNT_LDB(pw), over = ks > ss ? ks : ss;
    over = over > ov ? over : ov;
    return sizeof(float) * (LS_GDNT_C * LS_GDNT_LDA + ks + over);
}

static size_t gdnt_state_smem(long dk)
{
    size_t buf = LS_GDNT_C * (size_t)(LS_GDNT_LDR(dk) + LS_GDNT_LDB(dk) + LS_GDNT_LDS) + LS_GDNT_C;
    return sizeof(float) * (2 * (size_t)dk * LS_GDNT_LDS + LS_GDNT_C * LS_GDNT_LDS + 2 * buf);
}

/* The three kernels of a shape: compiled for d_k = d_v = 128 (the heads of
 * Qwen3-Next and Qwen3.5), where strides and trip counts are constants; any
 * other shape gdnt_check allows runs the same code with them read at run
 * time (the same operations in the same order: the same bits). */
typedef struct ls_gdnt_kernels {
    decltype(&ls_gdnt_rows_kernel<0, 0>) rows;
    decltype(&ls_gdnt_state_kernel<0, 0>) state;
    decltype(&ls_gdnt_out_kernel<0, 0>) out;
    size_t smem[3];
} ls_gdnt_kernels;

/* The kernels for (dk, dv), their shared memory set (above the default 48 KB). */
static ls_status gdnt_kernels(long dk, long dv, ls_gdnt_kernels *kn, ls_error *err)
{
    if (dk == 128 && dv == 128)
        *kn = {ls_gdnt_rows_kernel<128, 128>, ls_gdnt_state_kernel<128, 128>, ls_gdnt_out_kernel<128, 128>, {}};
    else
        *kn = {ls_gdnt_rows_kernel<0, 0>, ls_gdnt_state_kernel<0, 0>, ls_gdnt_out_kernel<0, 0>, {}};
    kn->smem[0] = gdnt_rows_smem(dk, dv);
    kn->smem[1] = gdnt_state_smem(dk);
    kn->smem[2] = gdnt_out_smem(dk, dv);
    LS_CUDA_CHECK(cudaFuncSetAttribute(kn->rows, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kn->smem[0]), err,
                  "the GDN rows kernel's shared memory");
    LS_CUDA_CHECK(cudaFuncSetAttribute(kn->state, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kn->smem[1]),
                  err, "the GDN state kernel's shared memory");
    LS_CUDA_CHECK(cudaFuncSetAttribute(kn->out, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kn->smem[2]), err,
                  "the GDN output kernel's shared memory");
    return LS_OK;
}

/* One piece (sq.n 0), or one position of each of sq.n sequences. */
static ls_status gdnt_launch(const ls_gdnt_kernels &kn, const float *q, const float *k, const float *v,
                             const float *alpha, const float *beta, float *state, float *scr, float *o,
                             const ls_gdnt_piece &pc, const ls_gdnt_seqs &sq, long Hk, long Hv, long dk, long dv,
                             int act_bf16, cudaStream_t s, ls_error *err)
{
    const int idk = (int)dk, idv = (int)dv, pw = (int)gdnt_out_cols(dv);
    const unsigned nz = sq.n ? (unsigned)sq.n : 1u;
    dim3 chunks((unsigned)pc.nch, (unsigned)Hv, nz);
    ls_launch(kn.rows, chunks, LS_GDNT_T, kn.smem[0], s, k, v, alpha, beta, state, scr, pc, sq, Hk, Hv, idk, idv);
    LS_CUDA_CHECK_LAUNCH("ls_gdnt_rows_kernel", err);
    ls_launch(kn.state, dim3((unsigned)(dv / LS_GDNT_COLS), (unsigned)Hv, nz), LS_GDNT_SW * LS_WARP, kn.smem[1], s,
              state, scr, pc, sq, Hv, idk, idv);
    LS_CUDA_CHECK_LAUNCH("ls_gdnt_state_kernel", err);
    ls_launch(kn.out, dim3((unsigned)pc.nch, (unsigned)Hv, nz * (unsigned)(dv / pw)), LS_GDNT_OT, kn.smem[2], s, q,
              state, scr, o, pc, sq, Hk, Hv, idk, idv, pw, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_gdnt_out_kernel", err);
    return LS_OK;
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
    LS_CUDA_REQUIRE(((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)state | (uintptr_t)scratch) % 16 == 0,
                    err, "cuda tensor-core gdn_chunked: q, k, v, the state and the scratch must be 16-byte aligned");
    size_t need = ls_cuda_gdn_tc_scratch_bytes(T, Hv, dk, dv);
    if (scratch_bytes < need)
        return ls_fail(err, LS_E_INTERNAL, "cuda tensor-core gdn_chunked: scratch of %zu bytes, %zu needed",
                       scratch_bytes, need);
    cudaStream_t s = (cudaStream_t)stream;
    ls_gdnt_kernels kn;
    LS_TRY(gdnt_kernels(dk, dv, &kn, err));
    ls_gdnt_seqs none;
    memset(&none, 0, sizeof none);
    float *scr = (float *)scratch;
    const long area_floats = (long)(gdnt_area_bytes(Hv, dk, dv) / sizeof(float));
    ls_gdnt_piece pc = {0, 0, 0, pos0, (gdnt_chunks(T) - 1) * area_floats, 0};
    for (long t0 = 0; t0 < T; t0 += pc.n) {
        pc.p0 = pos0 + t0;
        pc.cs0 = pc.p0 - pc.p0 % LS_GDNT_C;
        long room = LS_GDNT_PIECE * LS_GDNT_C - (pc.p0 - pc.cs0);
        pc.n = T - t0 < room ? T - t0 : room;
        pc.nch = (int)((pc.p0 - pc.cs0 + pc.n + LS_GDNT_C - 1) / LS_GDNT_C);
        LS_TRY(gdnt_launch(kn, q, k, v, alpha, beta, state, scr, o, pc, none, Hk, Hv, dk, dv, act_bf16, s, err));
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

extern "C" size_t ls_cuda_gdn_tc_decode_scratch_bytes(long nseq, long Hv, long dk, long dv)
{
    long n = nseq < LS_CUDA_SEQ_CHUNK ? nseq : LS_CUDA_SEQ_CHUNK;
    return n <= 0 ? 0 : sizeof(float) * (size_t)(n * Hv * dk * dv);
}

extern "C" ls_status ls_cuda_gdn_chunked_tc_decode(const float *q, const float *k, const float *v,
                                                   const float *alpha, const float *beta, float *const *states,
                                                   const long *row0, const long *pos, long nseq, float *o, long Hk,
                                                   long Hv, long dk, long dv, int act_bf16, void *scratch,
                                                   size_t scratch_bytes, void *stream, ls_error *err)
{
    ls_status st = gdnt_check("gdn_chunked decode", Hk, Hv, dk, dv, err);
    if (st != LS_OK) return st;
    if (nseq <= 0) return LS_OK;
    uintptr_t al = (uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)scratch;
    for (long s = 0; s < nseq; s++) {
        LS_CUDA_REQUIRE(pos[s] >= 0, err, "cuda tensor-core gdn_chunked decode: sequence %ld at position %ld < 0", s,
                        pos[s]);
        al |= (uintptr_t)states[s];
    }
    LS_CUDA_REQUIRE(al % 16 == 0, err,
                    "cuda tensor-core gdn_chunked decode: q, k, v, the states and the scratch must be 16-byte aligned");
    size_t need = ls_cuda_gdn_tc_decode_scratch_bytes(nseq, Hv, dk, dv);
    if (scratch_bytes < need)
        return ls_fail(err, LS_E_INTERNAL, "cuda tensor-core gdn_chunked decode: scratch of %zu bytes, %zu needed",
                       scratch_bytes, need);
    ls_gdnt_kernels kn;
    LS_TRY(gdnt_kernels(dk, dv, &kn, err));
    const ls_gdnt_piece any = {1, 0, 0, 0, 0, 1}; /* each sequence's is its own (ls_gdnt_seq) */
    for (long s0 = 0; s0 < nseq; s0 += LS_CUDA_SEQ_CHUNK) {
        ls_gdnt_seqs sq;
        memset(&sq, 0, sizeof sq);
        sq.n = (int)(nseq - s0 < LS_CUDA_SEQ_CHUNK ? nseq - s0 : LS_CUDA_SEQ_CHUNK);
        for (int z = 0; z < sq.n; z++) {
            sq.state[z] = states[s0 + z];
            sq.scratch[z] = (float *)scratch + (long)z * Hv * dk * dv;
            sq.row[z] = row0[s0 + z];
            sq.pos[z] = pos[s0 + z];
        }
        LS_TRY(gdnt_launch(kn, q, k, v, alpha, beta, NULL, NULL, o, any, sq, Hk, Hv, dk, dv, act_bf16,
                           (cudaStream_t)stream, err));
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
    ls_launch(ls_gdnt_mat_kernel, grid, 256, 0, (cudaStream_t)stream, state, pos, s_out, Hv, (int)dk, (int)dv);
    LS_CUDA_CHECK_LAUNCH("ls_gdnt_mat_kernel", err);
    return LS_OK;
}

/* ---- the fast tier's GDN (docs/tensor-core-tier.md §6) -------------------------- */

/* The chunk state's bytes at the head of the scratch, on a 256-byte boundary. */
static size_t gdn_fast_state_bytes(long Hv, long dk, long dv)
{
    return (sizeof(float) * LS_CUDA_GDN_TC_STATE_FLOATS(Hv, dk, dv) + 255) / 256 * 256;
}

extern "C" size_t ls_cuda_gdn_fast_scratch_bytes(long T, long Hv, long dk, long dv)
{
    return gdn_fast_state_bytes(Hv, dk, dv) + ls_cuda_gdn_tc_scratch_bytes(T, Hv, dk, dv);
}

extern "C" ls_status ls_cuda_gdn_fast(const float *q, const float *k, const float *v, const float *alpha,
                                      const float *beta, float *state, float *o, long T, long Hk, long Hv, long dk,
                                      long dv, int act_bf16, void *scratch, size_t scratch_bytes, void *stream,
                                      ls_error *err)
{
    ls_status st = gdnt_check("gdn (fast tier)", Hk, Hv, dk, dv, err);
    if (st != LS_OK || T <= 0) return st;
    size_t sb = gdn_fast_state_bytes(Hv, dk, dv), need = ls_cuda_gdn_fast_scratch_bytes(T, Hv, dk, dv);
    if (scratch_bytes < need)
        return ls_fail(err, LS_E_INTERNAL, "cuda fast gdn: scratch of %zu bytes, %zu needed", scratch_bytes, need);
    float *cs = (float *)scratch; /* the chunk state: S0 the call's start state, no rows pending */
    LS_CUDA_CHECK(cudaMemcpyAsync(cs, state, sizeof(float) * (size_t)(Hv * dk * dv), cudaMemcpyDeviceToDevice,
                                  (cudaStream_t)stream),
                  err, "the fast GDN's start state");
    LS_TRY(ls_cuda_gdn_chunked_tc(q, k, v, alpha, beta, cs, o, T, 0, Hk, Hv, dk, dv, act_bf16, (char *)scratch + sb,
                                  scratch_bytes - sb, stream, err));
    return ls_cuda_gdn_chunked_tc_state(cs, T - 1, state, Hv, dk, dv, stream, err);
}
