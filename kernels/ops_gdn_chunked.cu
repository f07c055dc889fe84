/* lockstep — portable strict chunk-aligned Gated DeltaNet (see ops.h), the
 * CUDA form of backend/cpu_ops.h ls_cpu_gdn_chunked_heads and
 * ls_cpu_gdn_chunked_state_heads (docs/numerics.md §5.1), bit for bit.
 *
 * One block = LS_GDNC_WPB warps x LS_GDNC_CPW value columns of one value head.
 * Tokens run in order (row r of a chunk reads rows <= r); per token:
 *   A. the row joins the chunk: k_r into shared memory (the chunk's key rows
 *      kb [C, dk] live there for the whole call), q_r beside it, α_r; the
 *      token's inputs were loaded into registers during the previous token.
 *   B. thread 0 takes the decays d[s] from r down (the CPU's chunk_decays);
 *      each warp takes m0 = DOT32_i(S0[i][j], k_r) and mq (q_r) for its
 *      columns as the recurrent kernel does (lane l: rows l + 32r of S0 in
 *      registers, ascending, then the butterfly), and the block takes the
 *      column-independent dots k_r · k_s (s < r) and q_r · k_s (s <= r) once,
 *      a warp per s (LS_GDNC_DG of them a pass), in LS_DOT32 order.
 *   C. lane c < CPW runs column c's correction chain u_r (s ascending),
 *      lane CPW + c its output chain o_r at the same time; o's last term
 *      (s = r) takes u_r from lane c. At r = C − 1 the lanes fold the chunk
 *      into their S0 registers in chunk_fold's order.
 * Every rounding is the CPU's: products and sums are separate operations
 * (nvcc -fmad=false), and each expression has the CPU's shape
 * (a = kk · d[s]; A = β · a; prod = A · u_s; u = u − prod).
 *
 * The chunk area of the state (k [Hv, C, dk], u [Hv, C, dv], α [Hv, C])
 * is read at the start of the call (the rows before pos0's row); u rows are
 * written by the block that owns their columns as they are computed. The
 * key rows and α are shared by all column blocks of a head, so a second
 * launch (ls_gdn_chunk_rows_kernel) writes them after the step has read
 * the old ones: for every row slot, the last token of the call that used
 * it, as the CPU's row-by-row writes leave it. */
#include "ops.h"
#include "ops_common.cuh"

#define LS_GDNC_C LS_CUDA_GDN_CHUNK                 /* rows per chunk */
#define LS_GDNC_CPW 8                               /* value columns per warp */
#define LS_GDNC_WPB 4                               /* warps per block */
#define LS_GDNC_RPL (LS_CUDA_GDN_MAX_DK / LS_WARP)  /* key rows per lane */
#define LS_GDNC_TPB (LS_GDNC_WPB * LS_WARP)
#define LS_GDNC_DG 4                                /* row dot products per warp pass */
static_assert(LS_GDNC_TPB >= LS_CUDA_GDN_MAX_DK, "a block's threads cover a key row");

/* Offsets of head h's parts of the chunk area (cpu_ops_gdn.c chunk_k, chunk_u, chunk_alpha). */
__device__ __forceinline__ long ls_gdnc_k(long Hv, long dk, long dv, long h)
{
    return Hv * dk * dv + h * LS_GDNC_C * dk;
}

__device__ __forceinline__ long ls_gdnc_u(long Hv, long dk, long dv, long h)
{
    return Hv * dk * dv + Hv * LS_GDNC_C * dk + h * LS_GDNC_C * dv;
}

__device__ __forceinline__ long ls_gdnc_alpha(long Hv, long dk, long dv, long h)
{
    return Hv * dk * dv + Hv * LS_GDNC_C * (dk + dv) + h * LS_GDNC_C;
}

/* d[s] = α_{s+1} ··· α_r from r down (d[r] = 1); returns P = d[0] α_0. */
__device__ __forceinline__ float ls_gdnc_decays(const float *al /* [C] */, long r, float *d /* [C] */)
{
    d[r] = 1.0f;
    float x = 1.0f;
    /* one thread, on the block's critical path: unrolled so that the α loads
     * run ahead of the product, which stays the serial chain from r down */
#pragma unroll 8
    for (long s = r - 1; s >= 0; s--) {
        x = x * al[s + 1];
        d[s] = x;
    }
    return x * al[0];
}

/* p[c] of a lane's CPW values with a runtime c, without local memory. */
__device__ __forceinline__ float ls_gdnc_pick(const float *p, int c)
{
    float x = 0.0f;
#pragma unroll
    for (int cc = 0; cc < LS_GDNC_CPW; cc++)
        if (cc == c) x = p[cc];
    return x;
}

/* The LS_DOT32 butterfly (ls_warp_tree) of N values at once. */
template <int N> __device__ __forceinline__ void ls_gdnc_tree_n(float *p)
{
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1)
#pragma unroll
        for (int c = 0; c < N; c++) {
            float other = __shfl_xor_sync(LS_FULL_MASK, p[c], s);
            p[c] = p[c] + other;
        }
}

/* One token's inputs as a thread uses them: q and k at key row tid (a
 * block's threads cover dk), v at the thread's chain column, α, β. */
typedef struct ls_gdnc_tok {
    float q, k, v, a, b;
} ls_gdnc_tok;

__device__ __forceinline__ void ls_gdnc_load(ls_gdnc_tok *x, const float *q, const float *k, const float *v,
                                             const float *alpha, const float *beta, long t, long h, long kh,
                                             long Hk, long Hv, long dk, long dv, long j, int tid, int has_v)
{
    x->q = tid < dk ? q[(t * Hk + kh) * dk + tid] : 0.0f;
    x->k = tid < dk ? k[(t * Hk + kh) * dk + tid] : 0.0f;
    x->v = has_v ? v[(t * Hv + h) * dv + j] : 0.0f;
    x->a = alpha[t * Hv + h];
    x->b = beta[t * Hv + h];
}

/* Only one resident block per SM is required (minBlocks 1; the grid is
 * about one block per SM at Qwen3-Next shapes), so the compiler may spend
 * registers on the chains' unrolling instead of spilling. */
__global__ void __launch_bounds__(LS_GDNC_TPB, 1)
ls_gdn_chunked_kernel(const float *q /* [T, Hk, dk] */, const float *k /* [T, Hk, dk] */,
                      const float *v /* [T, Hv, dv] */, const float *alpha /* [T, Hv] */,
                      const float *beta /* [T, Hv] */, float *state /* LS_GDN_CHUNK_STATE_FLOATS */,
                      float *o /* [T, Hv, dv] */, long T, long pos0, long Hk, long Hv, long dk,
                      long dv, int act)
{
    ls_pdl_entry();
    __shared__ float kb[LS_GDNC_C][LS_CUDA_GDN_MAX_DK];           /* the chunk's key rows */
    __shared__ float kr[LS_CUDA_GDN_MAX_DK], qr[LS_CUDA_GDN_MAX_DK]; /* this row's k, q */
    __shared__ float al[LS_GDNC_C], d[LS_GDNC_C];                 /* α per row; decays to r */
    __shared__ float KK[LS_GDNC_C], QK[LS_GDNC_C];                /* k_r · k_s, q_r · k_s */
    __shared__ float ub[LS_GDNC_WPB][LS_GDNC_C][LS_GDNC_CPW];     /* each warp's u columns */
    __shared__ float Pr;                                          /* d[0] α_0 */
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long h = blockIdx.y, kh = h * Hk / Hv;
    const long j0 = ((long)blockIdx.x * LS_GDNC_WPB + warp) * LS_GDNC_CPW;
    float *S0g = state + h * dk * dv;              /* [dk, dv] the state at the chunk's start */
    float *kbg = state + ls_gdnc_k(Hv, dk, dv, h); /* [C, dk] */
    float *ubg = state + ls_gdnc_u(Hv, dk, dv, h); /* [C, dv] */
    const float *alg = state + ls_gdnc_alpha(Hv, dk, dv, h);
    float (*uw)[LS_GDNC_CPW] = ub[warp];

    /* the rows of the current chunk that earlier calls ran, and S0 */
    const long r0 = pos0 % LS_GDNC_C;
    for (long e = tid; e < r0 * dk; e += LS_GDNC_TPB) kb[e / dk][e % dk] = kbg[e];
    for (long s = tid; s < r0; s += LS_GDNC_TPB) al[s] = alg[s];
    for (long e = lane; e < r0 * LS_GDNC_CPW; e += LS_WARP) {
        long s = e / LS_GDNC_CPW, j = j0 + e % LS_GDNC_CPW;
        uw[s][e % LS_GDNC_CPW] = j < dv ? ubg[s * dv + j] : 0.0f;
    }
    float S[LS_GDNC_RPL][LS_GDNC_CPW];
#pragma unroll
    for (int rr = 0; rr < LS_GDNC_RPL; rr++) {
        long i = lane + (long)rr * LS_WARP;
#pragma unroll
        for (int c = 0; c < LS_GDNC_CPW; c++)
            S[rr][c] = i < dk && j0 + c < dv ? S0g[i * dv + j0 + c] : 0.0f;
    }
    __syncthreads();

    const int c = lane & (LS_GDNC_CPW - 1); /* the column of this lane's chain */
    const int col_ok = j0 + c < dv;
    ls_gdnc_tok cur;
    ls_gdnc_load(&cur, q, k, v, alpha, beta, 0, h, kh, Hk, Hv, dk, dv, j0 + c, tid, lane < LS_GDNC_CPW && col_ok);
    ls_gdnc_tok nxt = cur;
    for (long t = 0; t < T; t++) {
        const long r = (pos0 + t) % LS_GDNC_C;
        /* the next token's inputs are loaded while this one is computed */
        if (t + 1 < T)
            ls_gdnc_load(&nxt, q, k, v, alpha, beta, t + 1, h, kh, Hk, Hv, dk, dv, j0 + c, tid,
                         lane < LS_GDNC_CPW && col_ok);
        /* A: row r joins the chunk first; every sum below runs over rows <= r */
        if (tid < dk) {
            kr[tid] = cur.k;
            kb[r][tid] = cur.k;
            qr[tid] = cur.q;
        }
        if (tid == 0) al[r] = cur.a;
        __syncthreads();

        /* B: decays; m0 and mq of this warp's columns; the block's row dots */
        if (tid == 0) Pr = ls_gdnc_decays(al, r, d);
        float pk[LS_GDNC_CPW], pq[LS_GDNC_CPW];
#pragma unroll
        for (int cc = 0; cc < LS_GDNC_CPW; cc++) pk[cc] = pq[cc] = 0.0f;
#pragma unroll
        for (int rr = 0; rr < LS_GDNC_RPL; rr++) {
            long i = lane + (long)rr * LS_WARP;
            if (i < dk) {
                float ki = kr[i], qi = qr[i];
#pragma unroll
                for (int cc = 0; cc < LS_GDNC_CPW; cc++) {
                    float prod = S[rr][cc] * ki;
                    pk[cc] = pk[cc] + prod;
                    float prodq = S[rr][cc] * qi;
                    pq[cc] = pq[cc] + prodq;
                }
            }
        }
        ls_gdnc_tree_n<LS_GDNC_CPW>(pk);
        ls_gdnc_tree_n<LS_GDNC_CPW>(pq);
        /* rows s = warp + WPB g' for LS_GDNC_DG of them at once, so that
         * their butterflies overlap; a row past r keeps zero partials */
        for (long s0 = warp; s0 <= r; s0 += LS_GDNC_WPB * LS_GDNC_DG) {
            float a[LS_GDNC_DG], b[LS_GDNC_DG];
#pragma unroll
            for (int g = 0; g < LS_GDNC_DG; g++) a[g] = b[g] = 0.0f;
#pragma unroll
            for (int rr = 0; rr < LS_GDNC_RPL; rr++) {
                long i = lane + (long)rr * LS_WARP;
                if (i < dk) {
                    float ki = kr[i], qi = qr[i];
#pragma unroll
                    for (int g = 0; g < LS_GDNC_DG; g++) {
                        long s = s0 + (long)g * LS_GDNC_WPB;
                        if (s <= r) {
                            float ks = kb[s][i];
                            float prod = ki * ks;
                            a[g] = a[g] + prod;
                            float prodq = qi * ks;
                            b[g] = b[g] + prodq;
                        }
                    }
                }
            }
            ls_gdnc_tree_n<LS_GDNC_DG>(a);
            ls_gdnc_tree_n<LS_GDNC_DG>(b);
            if (lane == 0)
#pragma unroll
                for (int g = 0; g < LS_GDNC_DG; g++) {
                    long s = s0 + (long)g * LS_GDNC_WPB;
                    if (s <= r) {
                        KK[s] = a[g]; /* unused at s = r */
                        QK[s] = b[g];
                    }
                }
        }
        __syncthreads();

        /* C: u_r = (v − P m0) β − Σ_{s<r} (β ((k_r · k_s) d[s])) u_s in lanes 0..CPW−1;
         * o_r = P mq + Σ_{s<=r} ((q_r · k_s) d[s]) u_s in lanes CPW..2 CPW−1 */
        const float P = Pr, bt = cur.b;
        float u = 0.0f, acc = 0.0f;
        if (lane < LS_GDNC_CPW) {
            float pm = P * ls_gdnc_pick(pk, c);
            float diff = cur.v - pm;
            u = diff * bt;
            /* unrolled so that the loads run ahead of the chain (the sum stays in s order) */
#pragma unroll 4
            for (long s = 0; s < r; s++) {
                float a = KK[s] * d[s];
                float A = bt * a;
                float prod = A * uw[s][c];
                u = u - prod;
            }
        } else if (lane < 2 * LS_GDNC_CPW) {
            acc = P * ls_gdnc_pick(pq, c);
#pragma unroll 4
            for (long s = 0; s < r; s++) {
                float w = QK[s] * d[s];
                float prod = w * uw[s][c];
                acc = acc + prod;
            }
        }
        float ur = __shfl_sync(LS_FULL_MASK, u, c);
        if (lane < LS_GDNC_CPW) {
            uw[r][c] = u;
            if (col_ok) ubg[r * dv + j0 + c] = u;
        } else if (lane < 2 * LS_GDNC_CPW) {
            float w = QK[r] * d[r];
            float prod = w * ur;
            acc = acc + prod;
            if (col_ok) o[(t * Hv + h) * dv + j0 + c] = ls_act_d(acc, act);
        }
        __syncwarp();

        /* the chunk's last row: S0 <- P S0 + Σ_s (d[s] k_s) ⊗ u_s (chunk_fold) */
        if (r == LS_GDNC_C - 1) {
#pragma unroll
            for (int rr = 0; rr < LS_GDNC_RPL; rr++)
#pragma unroll
                for (int cc = 0; cc < LS_GDNC_CPW; cc++) S[rr][cc] = P * S[rr][cc];
            for (long s = 0; s <= r; s++) {
                float us[LS_GDNC_CPW];
#pragma unroll
                for (int cc = 0; cc < LS_GDNC_CPW; cc++) us[cc] = uw[s][cc];
                float ds = d[s];
#pragma unroll
                for (int rr = 0; rr < LS_GDNC_RPL; rr++) {
                    long i = lane + (long)rr * LS_WARP;
                    if (i < dk) {
                        float ki = ds * kb[s][i];
#pragma unroll
                        for (int cc = 0; cc < LS_GDNC_CPW; cc++) {
                            float prod = ki * us[cc];
                            S[rr][cc] = S[rr][cc] + prod;
                        }
                    }
                }
            }
        }
        __syncthreads(); /* the next row overwrites kr, qr, kb[r'], al, d, KK, QK */
        cur = nxt;
    }

#pragma unroll
    for (int rr = 0; rr < LS_GDNC_RPL; rr++) {
        long i = lane + (long)rr * LS_WARP;
#pragma unroll
        for (int cc = 0; cc < LS_GDNC_CPW; cc++)
            if (i < dk && j0 + cc < dv) S0g[i * dv + j0 + cc] = S[rr][cc];
    }
}

/* The key rows and α of the call into the chunk area, after the step: row
 * slot s gets the last token t of the call with (pos0 + t) mod C = s. One
 * block per value head. */
__global__ void __launch_bounds__(128)
ls_gdn_chunk_rows_kernel(const float *k /* [T, Hk, dk] */, const float *alpha /* [T, Hv] */,
                         float *state, long T, long pos0, long Hk, long Hv, long dk, long dv)
{
    ls_pdl_entry();
    const long h = blockIdx.x, kh = h * Hk / Hv;
    float *kbg = state + ls_gdnc_k(Hv, dk, dv, h);
    float *alg = state + ls_gdnc_alpha(Hv, dk, dv, h);
    const long re = (pos0 + T - 1) % LS_GDNC_C;
    for (long s = 0; s < LS_GDNC_C; s++) {
        long t = T - 1 - (re - s + LS_GDNC_C) % LS_GDNC_C;
        if (t < 0) continue;
        for (long i = threadIdx.x; i < dk; i += blockDim.x) kbg[s * dk + i] = k[(t * Hk + kh) * dk + i];
        if (threadIdx.x == 0) alg[s] = alpha[t * Hv + h];
    }
}

/* The recurrent state after position pos (ls_cpu_gdn_chunked_state_heads):
 * S0 at a chunk's last row, else chunk_fold of rows 0 .. pos mod C, one
 * thread per element (i, j) of head blockIdx.y. */
__global__ void __launch_bounds__(256)
ls_gdn_chunked_state_kernel(const float *state, long pos, float *s_out /* [Hv, dk, dv] */, long Hv,
                            long dk, long dv)
{
    ls_pdl_entry();
    __shared__ float d[LS_GDNC_C];
    __shared__ float Pr;
    const long h = blockIdx.y, r = pos % LS_GDNC_C;
    const float *S0 = state + h * dk * dv;
    const float *kbg = state + ls_gdnc_k(Hv, dk, dv, h), *ubg = state + ls_gdnc_u(Hv, dk, dv, h);
    if (r != LS_GDNC_C - 1 && threadIdx.x == 0) Pr = ls_gdnc_decays(state + ls_gdnc_alpha(Hv, dk, dv, h), r, d);
    __syncthreads();
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= dk * dv) return;
    if (r == LS_GDNC_C - 1) { /* folded at the boundary already */
        s_out[h * dk * dv + e] = S0[e];
        return;
    }
    long i = e / dv, j = e % dv;
    float x = Pr * S0[e];
    for (long s = 0; s <= r; s++) {
        float ki = d[s] * kbg[s * dk + i];
        float prod = ki * ubg[s * dv + j];
        x = x + prod;
    }
    s_out[h * dk * dv + e] = x;
}

/* ---- host entry points (harness/gdn_chunked_emu runs everything above this line) ---- */

static ls_status gdnc_check(long Hk, long Hv, long dk, long dv, ls_error *err)
{
    LS_CUDA_REQUIRE(dk >= 1 && dk <= LS_CUDA_GDN_MAX_DK && dv >= 1 && Hk >= 1 && Hv >= 1 &&
                        Hv <= 65535,
                    err,
                    "cuda portable gdn_chunked: shape Hk %ld Hv %ld dk %ld dv %ld not supported "
                    "(needs 1 <= dk <= %d, Hv <= 65535)",
                    Hk, Hv, dk, dv, LS_CUDA_GDN_MAX_DK);
    return LS_OK;
}

extern "C" ls_status ls_cuda_gdn_chunked(const float *q, const float *k, const float *v,
                                         const float *alpha, const float *beta, float *state,
                                         float *o, long T, long pos0, long Hk, long Hv, long dk,
                                         long dv, int act_bf16, int order, void *stream,
                                         ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "gdn_chunked");
    ls_status st = gdnc_check(Hk, Hv, dk, dv, err);
    if (st != LS_OK) return st;
    LS_CUDA_REQUIRE(pos0 >= 0, err, "cuda portable gdn_chunked: position %ld < 0", pos0);
    if (T <= 0) return LS_OK;
    dim3 grid(ls_blocks_for(dv, LS_GDNC_CPW * LS_GDNC_WPB), (unsigned)Hv);
    ls_launch(ls_gdn_chunked_kernel, grid, LS_GDNC_TPB, 0, (cudaStream_t)stream, q, k, v, alpha, beta, state,
              o, T, pos0, Hk, Hv, dk, dv, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_gdn_chunked_kernel", err);
    ls_launch(ls_gdn_chunk_rows_kernel, (unsigned)Hv, 128, 0, (cudaStream_t)stream, k, alpha, state, T, pos0,
              Hk, Hv, dk, dv);
    LS_CUDA_CHECK_LAUNCH("ls_gdn_chunk_rows_kernel", err);
    return LS_OK;
}

extern "C" ls_status ls_cuda_gdn_chunked_state(const float *state, long pos, float *s_out, long Hv,
                                               long dk, long dv, void *stream, ls_error *err)
{
    ls_status st = gdnc_check(1, Hv, dk, dv, err);
    if (st != LS_OK) return st;
    LS_CUDA_REQUIRE(pos >= 0, err, "cuda portable gdn_chunked_state: position %ld < 0", pos);
    dim3 grid(ls_blocks_for(dk * dv, 256), (unsigned)Hv);
    ls_launch(ls_gdn_chunked_state_kernel, grid, 256, 0, (cudaStream_t)stream, state, pos, s_out, Hv, dk, dv);
    LS_CUDA_CHECK_LAUNCH("ls_gdn_chunked_state_kernel", err);
    return LS_OK;
}
