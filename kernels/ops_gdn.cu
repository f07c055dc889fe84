/* lockstep — portable strict Gated DeltaNet recurrent scan (see ops.h).
 *
 * Block = one warp = 32 value columns of one value head of one sequence;
 * thread j owns column j and keeps all dk <= 128 key rows of it in shared
 * memory (column j of a [128][32] tile: bank j, no conflicts; no other thread
 * touches it) for all T tokens. Each column's DOT32 over the key dim is formed by that
 * thread in the canonical order: partial l accumulates rows i ≡ l (mod 32) in
 * ascending i, then the 32 partials are combined in the LS_DOT32 tree
 * (ls_tree32 order, equal bitwise to the warp butterfly) — the CPU's
 * col_dots, column by column. Loads and stores of the state are coalesced:
 * for a key row i the warp touches 32 consecutive floats of that row. The
 * state is read from device memory once before the first token and written
 * once after the last: a call with T tokens and T calls with one token give
 * the same bits. The batched entry runs many sequences in one launch
 * (blockIdx.z = sequence), each with its own state and rows. */
#include "ops.h"
#include "ops_common.cuh"

#define LS_GDN_ROWS LS_CUDA_GDN_MAX_DK /* key rows per column, in registers */
#define LS_GDN_COLS LS_WARP            /* value columns per block (one per thread) */

/* Per-launch sequence table, passed by value (no device upload). */
typedef struct ls_gdn_seqs {
    long row0[LS_CUDA_SEQ_CHUNK];
    long len[LS_CUDA_SEQ_CHUNK];
    float *state[LS_CUDA_SEQ_CHUNK];
} ls_gdn_seqs;

__global__ void __launch_bounds__(LS_GDN_COLS)
ls_gdn_recurrent_kernel(const float *q, const float *k, const float *v, const float *alpha,
                        const float *beta, ls_gdn_seqs sq, float *o, long Hk, long Hv, long dk,
                        long dv, int act)
{
    __shared__ float ks[LS_GDN_ROWS], qs[LS_GDN_ROWS];
    __shared__ float Ssm[LS_GDN_ROWS][LS_GDN_COLS];
    int lane = (int)threadIdx.x;
    int sidx = (int)blockIdx.z;
    long T = sq.len[sidx], row0 = sq.row0[sidx];
    if (T <= 0) return; /* whole block */
    long h = blockIdx.y;
    long kh = h * Hk / Hv;
    long j = (long)blockIdx.x * LS_GDN_COLS + lane;
    int jok = j < dv;
    float *Sh = sq.state[sidx] + h * dk * dv; /* [dk, dv] */
#define S(i) Ssm[i][lane]
#pragma unroll
    for (int i = 0; i < LS_GDN_ROWS; i++) S(i) = (i < dk && jok) ? Sh[i * dv + j] : 0.0f;
    for (long t = row0; t < row0 + T; t++) {
        const float *qt = q + (t * Hk + kh) * dk; /* [dk] */
        const float *kt = k + (t * Hk + kh) * dk; /* [dk] */
        const float *vt = v + (t * Hv + h) * dv;  /* [dv] */
        __syncwarp();
#pragma unroll
        for (int r = 0; r < LS_GDN_ROWS / LS_WARP; r++) {
            int i = lane + r * LS_WARP;
            ks[i] = i < dk ? kt[i] : 0.0f;
            qs[i] = i < dk ? qt[i] : 0.0f;
        }
        float vj = jok ? vt[j] : 0.0f;
        float a = alpha[t * Hv + h], b = beta[t * Hv + h];
        __syncwarp();
        /* S' = α S, then m_j = DOT32_i(S'[i][j], k_i). */
        float p[LS_WARP];
#pragma unroll
        for (int l = 0; l < LS_WARP; l++) p[l] = 0.0f;
#pragma unroll 1
        for (int r = 0; r < LS_GDN_ROWS / LS_WARP; r++) /* rows ascending per partial */
#pragma unroll
            for (int l = 0; l < LS_WARP; l++) {
                int i = r * LS_WARP + l;
                float sp = a * S(i);
                S(i) = sp;
                if (i < dk) {
                    float prod = sp * ks[i];
                    p[l] = p[l] + prod;
                }
            }
        LS_TREE32(p);
        float m = p[0];
        float diff = vj - m;
        float u = diff * b;
        /* S = S' + k ⊗ u, then o_j = act(DOT32_i(S[i][j], q_i)). */
#pragma unroll
        for (int l = 0; l < LS_WARP; l++) p[l] = 0.0f;
#pragma unroll 1
        for (int r = 0; r < LS_GDN_ROWS / LS_WARP; r++)
#pragma unroll
            for (int l = 0; l < LS_WARP; l++) {
                int i = r * LS_WARP + l;
                float prod = ks[i] * u;
                float sn = S(i) + prod;
                S(i) = sn;
                if (i < dk) {
                    float prod2 = sn * qs[i];
                    p[l] = p[l] + prod2;
                }
            }
        LS_TREE32(p);
        float oj = p[0];
        if (jok) o[(t * Hv + h) * dv + j] = ls_act_d(oj, act);
    }
#pragma unroll
    for (int i = 0; i < LS_GDN_ROWS; i++)
        if (i < dk && jok) Sh[i * dv + j] = S(i);
#undef S
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
        ls_gdn_seqs sq;
        memset(&sq, 0, sizeof sq);
        long any = 0;
        for (long s = 0; s < n; s++) {
            sq.row0[s] = row0[s0 + s];
            sq.len[s] = len[s0 + s];
            sq.state[s] = states[s0 + s];
            if (sq.len[s] > 0) any = 1;
        }
        if (!any) continue;
        dim3 grid(ls_blocks_for(dv, LS_GDN_COLS), (unsigned)Hv, (unsigned)n);
        ls_gdn_recurrent_kernel<<<grid, LS_GDN_COLS, 0, (cudaStream_t)stream>>>(
            q, k, v, alpha, beta, sq, o, Hk, Hv, dk, dv, act_bf16);
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
