/* lockstep — portable strict router and MoE (see ops.h, docs/numerics.md §3
 * and rule 8). The (token, slot) pairs are grouped by expert so that an
 * expert's weights are read once per call, but every pair's dot products are
 * still the canonical warp DOT32 of the same weight row against that pair's
 * own activations: sharing the weight load changes no operand and no order,
 * so a token's output does not depend on which other tokens chose the same
 * expert; the combine is a sequential fp32 sum in top-k order. */
#include "ops.h"
#include "ops_common.cuh"

#include <cuda_bf16.h>
#include <mma.h>

#define LS_MOE_WARPS 8 /* output rows per block, one warp each */

/* ---- router ------------------------------------------------------------------- */

/* Lane l's top-k weights and their renormalisation (lane 0 writes). */
__device__ __forceinline__ void ls_router_finish(float *wt, long k, int norm_topk, int act)
{
    if ((threadIdx.x & 31u) != 0) return;
    if (norm_topk) {
        float s = 0.0f;
        for (long i = 0; i < k; i++) s = s + wt[i];
        for (long i = 0; i < k; i++) wt[i] = ls_act_d(wt[i] / s, act);
    } else {
        for (long i = 0; i < k; i++) wt[i] = ls_act_d(wt[i], act);
    }
}

/* One warp per token, after the logits (probs = act(W x)) are in place:
 * softmax (exact max, exp, SUM32, divide), top-k, renormalisation. */
__global__ void ls_router_softmax_topk_kernel(float *probs, long T, long E, long k, int norm_topk,
                                              int32_t *ids, float *weights, int act)
{
    ls_pdl_entry();
    long t = (long)blockIdx.x * 4 + (threadIdx.x >> 5);
    int lane = (int)(threadIdx.x & 31u);
    if (t >= T) return;
    float *pr = probs + t * E; /* [E] */
    float m = ls_warp_max_of(pr, E);
    float p = 0.0f;
    const float *in[1] = {pr};
    ls_batched_map<1>(in, lane, LS_WARP, E, [&](long e, const float *v) {
        float ex = ls_expf(v[0] - m);
        pr[e] = ex;
        p = p + ex;
    });
    float sum = ls_warp_tree(p);
    ls_batched_map<1>(in, lane, LS_WARP, E, [&](long e, const float *v) { pr[e] = v[0] / sum; });
    __syncwarp();
    int32_t *id = ids + t * k;  /* [k] */
    float *wt = weights + t * k; /* [k] */
    ls_warp_topk_dev(pr, E, k, id, wt);
    __syncwarp();
    ls_router_finish(wt, k, norm_topk, act);
}

/* The same for E <= 1024 with a block of N threads per token (N = E
 * rounded up to a power of two, at least 32), thread e holding logit e, so
 * that the exps, divisions and the top-k run across the block instead of a
 * warp's chain:
 *   - the maximum: each warp's first maximum (ls_warp_best_first over
 *     (value, index)), then warp 0's over the warps': the first maximum in
 *     element order, as above;
 *   - p_e = exp(l_e − m) by thread e, staged in shared memory; warp 0 sums
 *     them as the lanes above do (lane l: elements l, l + 32, ... ascending,
 *     then ls_warp_tree), and thread e divides;
 *   - the top k: a bitonic sort of the keys (~ord(p_e), e) — ord the
 *     order-preserving bits of a non-negative float, so ascending keys are
 *     descending probabilities, ties by index: ls_rank_before's order, the
 *     picks' — by shuffles below a stride of 32, through shared memory from
 *     32 on; thread i < k then holds pick i;
 *   - the renormalisation: every pick thread adds the picks up in pick
 *     order from 0, then divides its own.
 * The same operations on the same operands in the same orders as
 * ls_router_softmax_topk_kernel, so the same bits (for values that are not
 * NaN). A probability is never −0 (an exp, then a division by a positive
 * sum), so the keys' order of zeros is the index order the others give
 * them. */
#define LS_ROUTER_BLOCK_MAX 1024

template <int N>
__global__ void __launch_bounds__(N)
ls_router_block_kernel(float *probs, long E, long k, int norm_topk, int32_t *ids, float *weights, int act)
{
    ls_pdl_entry();
    constexpr int NW = N / LS_WARP;
    __shared__ float ps[N];
    __shared__ unsigned long long ks[N];
    __shared__ float wm[NW];
    __shared__ int wi[NW];
    __shared__ float pk[64]; /* the picks' probabilities, k <= 64 */
    __shared__ float s_m, s_sum;
    int e = (int)threadIdx.x, warp = e >> 5, lane = e & 31;
    long t = blockIdx.x;
    float *pr = probs + t * E; /* [E] */
    float v = e < E ? pr[e] : -INFINITY;
    float bv = v;
    int bi = e < E ? e : -1;
    ls_warp_best_first(&bv, &bi);
    if (lane == 0) wm[warp] = bv, wi[warp] = bi;
    __syncthreads();
    if (warp == 0) {
        float mv = lane < NW ? wm[lane] : -INFINITY;
        int mi = lane < NW ? wi[lane] : -1;
        ls_warp_best_first(&mv, &mi);
        if (lane == 0) s_m = mv;
    }
    __syncthreads();
    float ex = e < E ? ls_expf(v - s_m) : 0.0f;
    ps[e] = ex;
    __syncthreads();
    if (warp == 0) {
        float p = 0.0f;
        for (long j = lane; j < E; j += LS_WARP) p = p + ps[j];
        float sum = ls_warp_tree(p);
        if (lane == 0) s_sum = sum;
    }
    __syncthreads();
    float pe = 0.0f;
    unsigned long long key = ~0ull; /* past E: after every entry */
    if (e < E) {
        pe = ex / s_sum;
        pr[e] = pe;
        key = ((unsigned long long)~__float_as_uint(pe) << 32) | (unsigned)e;
    }
    __syncthreads();
    ps[e] = pe; /* the probabilities, for the picks */
#pragma unroll
    for (int size = 2; size <= N; size <<= 1)
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            unsigned long long other;
            if (stride >= LS_WARP) {
                ks[e] = key;
                __syncthreads();
                other = ks[e ^ stride];
                __syncthreads();
            } else {
                other = __shfl_xor_sync(LS_FULL_MASK, key, stride);
            }
            bool low = (e & stride) == 0, up = (e & size) == 0;
            unsigned long long lo = key < other ? key : other, hi = key < other ? other : key;
            key = low == up ? lo : hi;
        }
    __syncthreads(); /* ps complete */
    float w = 0.0f;
    if (e < k) {
        w = ps[key & 0xffffffffu];
        pk[e] = w;
    }
    __syncthreads();
    if (e < k) {
        float sum = 0.0f;
        for (long i = 0; i < k; i++) sum = sum + pk[i];
        ids[t * k + e] = (int32_t)(key & 0xffffffffu);
        weights[t * k + e] = ls_act_d(norm_topk ? w / sum : w, act);
    }
}

extern "C" ls_status ls_cuda_router(const void *w, int wtype, long E, long D, const float *x,
                                    long T, long k, int norm_topk, float *probs, int32_t *ids,
                                    float *weights, int act_bf16, int order, void *stream,
                                    ls_error *err)
{
    LS_CUDA_REQUIRE(k >= 1 && k <= 64 && k <= E, err,
                    "cuda portable router: top-k %ld not in 1..min(64, experts %ld)", k, E);
    LS_TRY(ls_cuda_linear(w, wtype, E, D, x, probs, T, act_bf16, order, stream, err));
    if (T <= 0) return LS_OK;
    cudaStream_t s = (cudaStream_t)stream;
    int n = LS_WARP;
    while (n < E && n < LS_ROUTER_BLOCK_MAX) n <<= 1;
    if (E > LS_ROUTER_BLOCK_MAX) {
        ls_launch(ls_router_softmax_topk_kernel, ls_blocks_for(T, 4), 4 * LS_WARP, 0, s, probs, T, E, k,
                  norm_topk, ids, weights, act_bf16);
        LS_CUDA_CHECK_LAUNCH("ls_router_softmax_topk_kernel", err);
        return LS_OK;
    }
#define LS_ROUTER_BLOCK(N)                                                                               \
    case N:                                                                                              \
        ls_launch(ls_router_block_kernel<N>, (unsigned)T, N, 0, s, probs, E, k, norm_topk, ids, weights, \
                  act_bf16);                                                                             \
        break;
    switch (n) {
        LS_ROUTER_BLOCK(32)
        LS_ROUTER_BLOCK(64)
        LS_ROUTER_BLOCK(128)
        LS_ROUTER_BLOCK(256)
        LS_ROUTER_BLOCK(512)
        LS_ROUTER_BLOCK(1024)
    }
#undef LS_ROUTER_BLOCK
    LS_CUDA_CHECK_LAUNCH("ls_router_block_kernel", err);
    return LS_OK;
}

/* ---- experts ------------------------------------------------------------------ */

#define LS_MOE_NT 8    /* pairs per weight-row pass (ls_warp_rowdot) */
#define LS_MOE_TILE 64 /* most pairs per block: bounds a block's work so that a
                          popular expert or the shared one does not leave a
                          tail of a few long blocks */

/* Scratch layout for T tokens, k routed slots plus the shared slot (index k),
 * P = T k routed pairs (pair p = t k + slot), tiles = min(E, P) + P / TILE:
 *   mid     [T, k+1, W]  W = max(I, Is): act(act(silu(g)) · u)
 *   c       [T, k+1, D]  slot outputs (c_i = act(y·w_i); shared: act(γ·y))
 *   gamma   [T]          act(sigmoid(act(w_sg · x)))
 *   count   [E]   int32  pairs per expert
 *   pairs   [P]   int32  pair indices grouped by expert, ascending within one
 *   tile    [3, tiles]   int32 per tile: expert, first entry in pairs, pairs
 *   ntiles  [1]   int32  tiles in use */
static size_t ls_moe_width(const ls_cuda_moe *mw)
{
    return (size_t)(mw->I > mw->Is ? mw->I : mw->Is);
}

static size_t ls_moe_max_tiles(long E, long P)
{
    /* Σ_e ceil(c_e / TILE) <= #active + Σ_e floor((c_e − 1) / TILE) <= min(E, P) + P / TILE */
    return (size_t)((E < P ? E : P) + P / LS_MOE_TILE);
}

/* w8a8 (docs/numerics.md §9): the quantised inputs follow the scratch above,
 *   xq [T, D], xqs [T, ceil(D/128)]           x by token
 *   mq [T, k+1, W], mqs [T, k+1, ceil(W/128)] mid by slot (its own width)
 * present when the routed or the shared expert is w8a8. */
static int ls_moe_w8a8(const ls_cuda_moe *mw)
{
    return mw->wtype == 3 || (mw->sh_gate && mw->sh_wtype == 3);
}

static size_t ls_moe_w8a8_floats(const ls_cuda_moe *mw, long T, long k)
{
    if (!ls_moe_w8a8(mw)) return 0;
    size_t slots = (size_t)T * (size_t)(k + 1), W = ls_moe_width(mw);
    return (size_t)T * (size_t)(mw->D + LS_FP8_BLOCKS(mw->D)) +
           slots * (W + (size_t)LS_FP8_BLOCKS((long)W));
}

extern "C" size_t ls_cuda_moe_scratch_bytes(const ls_cuda_moe *mw, long T, long k)
{
    size_t slots = (size_t)T * (size_t)(k + 1);
    size_t P = (size_t)T * (size_t)k;
    size_t floats = slots * ls_moe_width(mw) + slots * (size_t)mw->D + (size_t)T;
    size_t ints = (size_t)mw->E + P + 3 * ls_moe_max_tiles(mw->E, (long)P) + 1;
    return sizeof(float) * floats + sizeof(int32_t) * ints +
           sizeof(float) * ls_moe_w8a8_floats(mw, T, k);
}

/* Row pointer of matrix `which` (0 gate, 1 up, 2 down) for a slot. */
__device__ __forceinline__ const void *ls_moe_matrix(const ls_cuda_moe mw, long e, int shared,
                                                      int which)
{
    if (shared) return which == 0 ? mw.sh_gate : which == 1 ? mw.sh_up : mw.sh_down;
    return which == 0 ? mw.gate[e] : which == 1 ? mw.up[e] : mw.down[e];
}

/* Its block scales (FP8), or NULL. */
__device__ __forceinline__ const float *ls_moe_scales(const ls_cuda_moe mw, long e, int shared,
                                                      int which)
{
    if (shared) return which == 0 ? mw.sh_gate_s : which == 1 ? mw.sh_up_s : mw.sh_down_s;
    const float *const *t = which == 0 ? mw.gate_s : which == 1 ? mw.up_s : mw.down_s;
    return t ? t[e] : NULL;
}

/* The quantised activations of a w8a8 launch (NULLs otherwise). */
typedef struct ls_moe_q8 {
    const float *xq, *xqs;     /* [T, D], [T, ceil(D/128)] */
    const float *mq, *mqs;     /* [T, k+1, W], [T, k+1, ceil(W/128)] */
} ls_moe_q8;

/* Grouping. Integer counts and positions only, each found by a warp scanning
 * the ids in pair order, so the lists are the same on every run; ids outside
 * [0, E) belong to no expert (their slots are settled in the combine). */

/* grid ceil(E / 8): warp per expert e, count[e] = #{p : ids[p] == e}. */
__global__ void ls_moe_count_kernel(const int32_t *ids, long P, long E, int32_t *count)
{
    ls_pdl_entry();
    long e = (long)blockIdx.x * LS_MOE_WARPS + (threadIdx.x >> 5);
    int lane = (int)(threadIdx.x & 31u);
    if (e >= E) return; /* whole warp */
    int n = 0;
    for (long p0 = 0; p0 < P; p0 += LS_WARP) {
        long p = p0 + lane;
        int hit = p < P && ids[p] == e;
        n += __popc(__ballot_sync(LS_FULL_MASK, hit));
    }
    if (lane == 0) count[e] = n;
}

/* grid ceil(E / 8): warp per expert e. Its pairs go, ascending, to
 * pairs[off_e ..), off_e = Σ_{e' < e} count[e']; its tiles (runs of at most
 * TILE pairs) follow those of the experts before it. */
__global__ void ls_moe_group_kernel(const int32_t *ids, long P, long E, const int32_t *count,
                                    int32_t *pairs, int32_t *tile_e, int32_t *tile_p0,
                                    int32_t *tile_n, int32_t *ntiles)
{
    ls_pdl_entry();
    long e = (long)blockIdx.x * LS_MOE_WARPS + (threadIdx.x >> 5);
    int lane = (int)(threadIdx.x & 31u);
    if (e >= E) return; /* whole warp */
    int off = 0, tiles0 = 0;
    for (long e2 = lane; e2 < e; e2 += LS_WARP) {
        int c2 = count[e2];
        off += c2;
        tiles0 += (c2 + LS_MOE_TILE - 1) / LS_MOE_TILE;
    }
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) {
        off += __shfl_xor_sync(LS_FULL_MASK, off, s);
        tiles0 += __shfl_xor_sync(LS_FULL_MASK, tiles0, s);
    }
    int c = count[e];
    int ntile = (c + LS_MOE_TILE - 1) / LS_MOE_TILE;
    if (c > 0) {
        int pos = off;
        unsigned below = (1u << lane) - 1u;
        for (long p0 = 0; p0 < P; p0 += LS_WARP) {
            long p = p0 + lane;
            int hit = p < P && ids[p] == e;
            unsigned m = __ballot_sync(LS_FULL_MASK, hit);
            if (hit) pairs[pos + __popc(m & below)] = (int32_t)p;
            pos += __popc(m);
        }
        for (int q = lane; q < ntile; q += LS_WARP) {
            tile_e[tiles0 + q] = (int32_t)e;
            tile_p0[tiles0 + q] = off + q * LS_MOE_TILE;
            tile_n[tiles0 + q] = c - q * LS_MOE_TILE < LS_MOE_TILE ? c - q * LS_MOE_TILE
                                                                   : LS_MOE_TILE;
        }
    }
    if (e == E - 1 && lane == 0) *ntiles = tiles0 + ntile;
}

/* The tiles of one launch: blockIdx.y < sh_tiles is a run of tokens through
 * the shared expert, then the routed tiles of the grouping (blocks past
 * *ntiles return). Without grouping (`single`: few pairs, as in decode) every
 * tile is one pair: shared tile y = token y, routed tile r = pair r. */
typedef struct ls_moe_tiles {
    const int32_t *ids;    /* [P] */
    const int32_t *pairs;  /* [P] */
    const int32_t *tile_e; /* [tiles] */
    const int32_t *tile_p0;
    const int32_t *tile_n;
    const int32_t *ntiles; /* [1] */
    long T, k, E, sh_tiles;
    int single;
} ls_moe_tiles;

/* This block's tile: 0 when it has none; else *shared, expert *e and, for
 * its pairs q < *n, ls_moe_pair gives token and slot. */
__device__ __forceinline__ int ls_moe_tile_of(const ls_moe_tiles tl, int *shared, long *e,
                                              long *p0, int *n)
{
    long y = blockIdx.y;
    long run = tl.single ? 1 : LS_MOE_TILE;
    if (y < tl.sh_tiles) {
        *shared = 1;
        *e = 0;
        *p0 = y * run;
        *n = tl.T - *p0 < run ? (int)(tl.T - *p0) : (int)run;
        return 1;
    }
    long r = y - tl.sh_tiles;
    if (tl.single) {
        if (r >= tl.T * tl.k) return 0;
        *shared = 0;
        *e = tl.ids[r];
        *p0 = r;
        *n = 1;
        return *e >= 0 && *e < tl.E;
    }
    if (r >= *tl.ntiles) return 0;
    *shared = 0;
    *e = tl.tile_e[r];
    *p0 = tl.tile_p0[r];
    *n = tl.tile_n[r];
    return 1;
}

/* This warp's tile (as ls_moe_tile_of) and weight row: row (blockIdx.x, warp)
 * of the gate/up rows (width I, or Is for the shared expert) or, `down`, of
 * the D down rows. 0 when the warp has none. */
__device__ __forceinline__ int ls_moe_warp_row(const ls_cuda_moe &mw, const ls_moe_tiles &tl,
                                               int down, int *shared, long *e, long *p0, int *n,
                                               int *warp, long *row)
{
    if (!ls_moe_tile_of(tl, shared, e, p0, n)) return 0;
    long rows = down ? mw.D : *shared ? mw.Is : mw.I;
    *warp = (int)(threadIdx.x >> 5);
    *row = (long)blockIdx.x * LS_MOE_WARPS + *warp;
    return *row < rows; /* whole warp */
}

/* Token and slot of pair q of the tile: shared tiles are runs of tokens (slot
 * k), routed ones entries of the pair list (p = t k + slot). */
__device__ __forceinline__ void ls_moe_pair(const ls_moe_tiles tl, int shared, long p0, long q,
                                            long *t, long *slot)
{
    if (shared) {
        *t = p0 + q;
        *slot = tl.k;
        return;
    }
    long p = tl.single ? p0 + q : tl.pairs[p0 + q];
    *t = p / tl.k;
    *slot = p % tl.k;
}

/* The source row of pair q of the tile: its token's row of src (by_slot 0:
 * x) or its slot's row (by_slot 1: mid), rows ld apart. */
__device__ __forceinline__ const float *ls_moe_pair_row(const ls_moe_tiles &tl, int shared, long p0,
                                                        long q, const float *src, long ld,
                                                        int by_slot)
{
    long t, slot;
    ls_moe_pair(tl, shared, p0, q, &t, &slot);
    return src + (by_slot ? t * (tl.k + 1) + slot : t) * ld;
}

/* A slot's hidden unit from its gate and up dots: act(act(silu(act(g))) · act(u)). */
__device__ __forceinline__ float ls_moe_mid(float g, float u, int act)
{
    g = ls_act_d(g, act);
    u = ls_act_d(u, act);
    float sg = ls_act_d(ls_siluf(g), act);
    return ls_act_d(sg * u, act);
}

/* A slot's output element from its down dot y: act(act(y) · w) for a routed
 * slot (w its router weight), act(γ · act(y)) for the shared one. */
__device__ __forceinline__ float ls_moe_slot_out(float y, int shared, const float *gamma,
                                                 const float *weights, long t, long k, long slot,
                                                 int act)
{
    y = ls_act_d(y, act);
    return shared ? ls_act_d(gamma[t] * y, act) : ls_act_d(y * weights[t * k + slot], act);
}

/* Pairs q0 .. q0+nt-1 of a tile (nt <= NT) through gate and up row i; LEAN
 * (NT = 1): the low-register scalar dot instead of the row pass. */
template <int NT, int LEAN>
__device__ __forceinline__ void ls_moe_gate_up_pass(const ls_cuda_moe &mw, const float *x,
                                                    const ls_moe_q8 &q8, const ls_moe_tiles &tl,
                                                    int shared, long p0, int q0, int nt,
                                                    const uint8_t *wg, const uint8_t *wu,
                                                    const float *sg, const float *su, long i,
                                                    long W, float *mid, float *wsm, int act)
{
    int lane = (int)(threadIdx.x & 31u);
    int wt = shared ? mw.sh_wtype : mw.wtype;
    int w8 = wt == LS_WTYPE_F8_W8A8_ID;
    long nbD = LS_FP8_BLOCKS(mw.D);
    const float *xs[NT], *ss[NT]; /* [D] each (w8a8: quantised), their group scales */
#pragma unroll
    for (int q = 0; q < NT; q++) {
        long t = 0, slot = 0;
        if (q < nt) ls_moe_pair(tl, shared, p0, q0 + q, &t, &slot);
        xs[q] = w8 ? q8.xq + t * mw.D : x + t * mw.D;
        ss[q] = w8 ? q8.xqs + t * nbD : NULL;
    }
    float g[NT], u[NT];
    if (LEAN) {
        g[0] = ls_warp_dot_any_lean(wg, sg, wt, xs[0], ss[0], mw.D);
        u[0] = ls_warp_dot_any_lean(wu, su, wt, xs[0], ss[0], mw.D);
    } else {
        ls_warp_rowdot_any<NT>(wg, sg, wt, mw.D, xs, ss, nt, wsm, g);
        ls_warp_rowdot_any<NT>(wu, su, wt, mw.D, xs, ss, nt, wsm, u);
    }
    if (lane < nt) { /* lane q finishes pair q */
        float gq = g[0], uq = u[0];
#pragma unroll
        for (int q = 1; q < NT; q++)
            if (lane == q) {
                gq = g[q];
                uq = u[q];
            }
        long t, slot;
        ls_moe_pair(tl, shared, p0, q0 + lane, &t, &slot);
        mid[(t * (tl.k + 1) + slot) * W + i] = ls_moe_mid(gq, uq, act);
    }
}

/* Launch shape of a plan: NT pairs per weight-row pass (NT = 1: every tile
 * is one pair), LEAN the scalar dot, MINB the blocks per SM the registers
 * are budgeted for. Shared memory per warp: the one-pair row pass, the most
 * chunks in flight (a grouped tile of one pair takes it). */
#define LS_MOE_SMEM(LEAN) ((LEAN) ? 1 : LS_ROWDOT_SMEM(1))

/* grid (ceil(W / 8), tiles): warp per (tile, hidden unit i); the gate and up
 * rows i are each read once per NT pairs. */
template <int NT, int LEAN, int MINB>
__global__ void __launch_bounds__(LS_MOE_WARPS * LS_WARP, MINB)
ls_moe_gate_up_kernel(const ls_cuda_moe mw, const float *x, const ls_moe_q8 q8,
                      const ls_moe_tiles tl, long W, float *mid, int act)
{
    ls_pdl_entry();
    __shared__ float wsm[LS_MOE_WARPS][LS_MOE_SMEM(LEAN)];
    int shared, n, warp;
    long e, p0, i;
    if (!ls_moe_warp_row(mw, tl, 0, &shared, &e, &p0, &n, &warp, &i)) return;
    int wt = shared ? mw.sh_wtype : mw.wtype;
    size_t rowb = (size_t)mw.D * ls_welem_bytes(wt);
    const uint8_t *wg = (const uint8_t *)ls_moe_matrix(mw, e, shared, 0) + (size_t)i * rowb;
    const uint8_t *wu = (const uint8_t *)ls_moe_matrix(mw, e, shared, 1) + (size_t)i * rowb;
    /* FP8: the scale rows of gate and up row i */
    const float *sg = ls_moe_scales(mw, e, shared, 0), *su = ls_moe_scales(mw, e, shared, 1);
    long soff = (i / LS_FP8_BLOCK) * LS_FP8_BLOCKS(mw.D);
    if (sg) sg += soff;
    if (su) su += soff;
    int step = (NT == 1 || n == 1) ? 1 : NT;
    for (int q0 = 0; q0 < n; q0 += step) {
        int nt = n - q0 < step ? n - q0 : step;
        if (step == 1)
            ls_moe_gate_up_pass<1, LEAN>(mw, x, q8, tl, shared, p0, q0, 1, wg, wu, sg, su, i, W,
                                         mid, wsm[warp], act);
        else
            ls_moe_gate_up_pass<NT, 0>(mw, x, q8, tl, shared, p0, q0, nt, wg, wu, sg, su, i, W,
                                       mid, wsm[warp], act);
    }
}

/* grid T, LS_MOE_SG_THREADS threads: block t computes γ for token t (the gate
 * vector is bf16 or fp32: the FP8 releases leave it unconverted). The
 * canonical DOT32 (ls_warp_dot_w) of one row is one warp's, and loading its
 * 2048 elements batch by batch costs that warp one memory latency per batch,
 * on the MoE's critical path; here every thread loads a part of each chunk
 * of the two rows into shared memory at once, then warp 0 runs the same
 * products and adds, in the same order, from there. */
#define LS_MOE_SG_THREADS 256
#define LS_MOE_SG_CHUNK 2048 /* elements staged at a time: a multiple of 32 */
__global__ void __launch_bounds__(LS_MOE_SG_THREADS)
ls_moe_shared_gate_kernel(const ls_cuda_moe mw, const float *x, long T, float *gamma, int act)
{
    ls_pdl_entry();
    __shared__ float ws[LS_MOE_SG_CHUNK], xs[LS_MOE_SG_CHUNK];
    long t = blockIdx.x;
    if (t >= T) return; /* whole block */
    const float *xt = x + t * mw.D;
    int lane = (int)(threadIdx.x & 31u);
    float p = 0.0f;
    for (long k0 = 0; k0 < mw.D; k0 += LS_MOE_SG_CHUNK) {
        long n = mw.D - k0 < LS_MOE_SG_CHUNK ? mw.D - k0 : LS_MOE_SG_CHUNK;
        __syncthreads(); /* the previous chunk is summed */
        for (long j = threadIdx.x; j < n; j += LS_MOE_SG_THREADS) {
            ws[j] = ls_wload(mw.sh_gate_w, mw.shg_wtype, k0 + j);
            xs[j] = xt[k0 + j];
        }
        __syncthreads();
        if (threadIdx.x < LS_WARP)
            for (long j = lane; j < n; j += LS_WARP) { /* lane l: elements l, l + 32, ... */
                float prod = ws[j] * xs[j];
                p = p + prod;
            }
    }
    if (threadIdx.x >= LS_WARP) return;
    float gl = ls_act_d(ls_warp_tree(p), act);
    if (threadIdx.x == 0) gamma[t] = ls_act_d(ls_sigmoidf(gl), act);
}

/* γ of the T tokens, when the MoE has a shared expert (every plan's launch). */
static ls_status ls_moe_shared_gate(const ls_cuda_moe *mw, const float *x, long T, float *gamma, int act,
                                    cudaStream_t s, ls_error *err)
{
    if (!mw->sh_gate) return LS_OK;
    ls_launch(ls_moe_shared_gate_kernel, (unsigned)T, LS_MOE_SG_THREADS, 0, s, *mw, x, T, gamma, act);
    LS_CUDA_CHECK_LAUNCH("ls_moe_shared_gate_kernel", err);
    return LS_OK;
}

/* w8a8: quantises each slot's hidden row m [width] (routed: I, shared: Is;
 * only slots whose down matrix is w8a8) per group of 128, thread per (slot
 * row, group), with ls_fp8_quant_group as on the CPU. Rows of slots that no
 * tile computed (an id outside [0, E)) hold stale values whose quantisation
 * nobody reads. */
__global__ void ls_moe_quant_mid_kernel(const ls_cuda_moe mw, long T, long k, long W,
                                        const float *mid, float *mq, float *mqs)
{
    ls_pdl_entry();
    long nbW = LS_FP8_BLOCKS(W);
    long g = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= T * (k + 1) * nbW) return;
    long row = g / nbW, b = g % nbW, slot = row % (k + 1);
    int shared = slot == k;
    if (shared ? (!mw.sh_gate || mw.sh_wtype != LS_WTYPE_F8_W8A8_ID)
               : mw.wtype != LS_WTYPE_F8_W8A8_ID)
        return;
    long width = shared ? mw.Is : mw.I, k0 = b * LS_FP8_BLOCK;
    if (k0 >= width) return;
    long len = width - k0 < LS_FP8_BLOCK ? width - k0 : LS_FP8_BLOCK;
    mqs[row * nbW + b] = ls_fp8_quant_group(mid + row * W + k0, len, mq + row * W + k0);
}

/* w8a8: the input rows x [T, D] quantised per group (thread per group). */
__global__ void ls_moe_quant_x_kernel(const float *x, long T, long D, float *xq, float *xqs)
{
    ls_pdl_entry();
    long nb = LS_FP8_BLOCKS(D);
    long g = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= T * nb) return;
    long t = g / nb, b = g % nb, k0 = b * LS_FP8_BLOCK;
    long len = D - k0 < LS_FP8_BLOCK ? D - k0 : LS_FP8_BLOCK;
    xqs[g] = ls_fp8_quant_group(x + t * D + k0, len, xq + t * D + k0);
}

/* Pairs q0 .. q0+nt-1 of a tile (nt <= NT) through down row j (LEAN as above). */
template <int NT, int LEAN>
__device__ __forceinline__ void ls_moe_down_pass(const ls_cuda_moe &mw, const ls_moe_q8 &q8,
                                                 const ls_moe_tiles &tl, int shared, long p0,
                                                 int q0, int nt, const uint8_t *wd,
                                                 const float *sd, long width, long j,
                                                 const float *weights, long W, const float *mid,
                                                 const float *gamma, float *cbuf, float *wsm,
                                                 int act)
{
    int lane = (int)(threadIdx.x & 31u);
    int wt = shared ? mw.sh_wtype : mw.wtype;
    int w8 = wt == LS_WTYPE_F8_W8A8_ID;
    long nbW = LS_FP8_BLOCKS(W);
    const float *ms[NT], *ss[NT]; /* [width] each (w8a8: quantised), their group scales */
#pragma unroll
    for (int q = 0; q < NT; q++) {
        long t = 0, slot = 0;
        if (q < nt) ls_moe_pair(tl, shared, p0, q0 + q, &t, &slot);
        long row = t * (tl.k + 1) + slot;
        ms[q] = (w8 ? q8.mq : mid) + row * W;
        ss[q] = w8 ? q8.mqs + row * nbW : NULL;
    }
    float y[NT];
    if (LEAN) y[0] = ls_warp_dot_any_lean(wd, sd, wt, ms[0], ss[0], width);
    else ls_warp_rowdot_any<NT>(wd, sd, wt, width, ms, ss, nt, wsm, y);
    if (lane < nt) { /* lane q finishes pair q */
        float yq = y[0];
#pragma unroll
        for (int q = 1; q < NT; q++)
            if (lane == q) yq = y[q];
        long t, slot;
        ls_moe_pair(tl, shared, p0, q0 + lane, &t, &slot);
        cbuf[(t * (tl.k + 1) + slot) * mw.D + j] =
            ls_moe_slot_out(yq, shared, gamma, weights, t, tl.k, slot, act);
    }
}

/* grid (ceil(D / 8), tiles): warp per (tile, output j); the down row j is read
 * once per NT pairs (one-pair tiles as in the gate/up kernel). */
template <int NT, int LEAN, int MINB>
__global__ void __launch_bounds__(LS_MOE_WARPS * LS_WARP, MINB)
ls_moe_down_kernel(const ls_cuda_moe mw, const ls_moe_q8 q8, const ls_moe_tiles tl,
                   const float *weights, long W, const float *mid, const float *gamma, float *cbuf,
                   int act)
{
    ls_pdl_entry();
    __shared__ float wsm[LS_MOE_WARPS][LS_MOE_SMEM(LEAN)];
    int shared, n, warp;
    long e, p0, j;
    if (!ls_moe_warp_row(mw, tl, 1, &shared, &e, &p0, &n, &warp, &j)) return;
    long width = shared ? mw.Is : mw.I;
    int wt = shared ? mw.sh_wtype : mw.wtype;
    const uint8_t *wd = (const uint8_t *)ls_moe_matrix(mw, e, shared, 2) +
                        (size_t)j * width * ls_welem_bytes(wt);
    const float *sd = ls_moe_scales(mw, e, shared, 2); /* FP8: down row j's scale row */
    if (sd) sd += (j / LS_FP8_BLOCK) * LS_FP8_BLOCKS(width);
    int step = (NT == 1 || n == 1) ? 1 : NT;
    for (int q0 = 0; q0 < n; q0 += step) {
        int nt = n - q0 < step ? n - q0 : step;
        if (step == 1)
            ls_moe_down_pass<1, LEAN>(mw, q8, tl, shared, p0, q0, 1, wd, sd, width, j, weights, W,
                                      mid, gamma, cbuf, wsm[warp], act);
        else
            ls_moe_down_pass<NT, 0>(mw, q8, tl, shared, p0, q0, nt, wd, sd, width, j, weights, W,
                                    mid, gamma, cbuf, wsm[warp], act);
    }
}

/* ---- plan 2: the lane-group DOT32 (ls_group_rowdot) ------------------------------ */

/* The tiles and formulas above, every pair its own tile; a weight row's
 * DOT32 is formed by a group of 32 / PER lanes with 16-byte loads (PER = 16
 * / EB, EB the experts' element bytes: bf16 or fp32 experts only), so a warp
 * streams PER rows at once, LS_MOE_GU loads per thread and row in flight, no
 * shared memory. A block of LS_MOE_GWARPS warps owns LS_MOE_GROWS(EB)
 * consecutive rows of one tile. */
#define LS_MOE_GWARPS 4
#define LS_MOE_GU 4
#define LS_MOE_GROWS(EB) (LS_MOE_GWARPS * (16 / (EB)))

/* This thread's row: its lane group's (blockIdx.x, warp, lane / G). */
template <int EB>
__device__ __forceinline__ long ls_moe_group_row(void)
{
    constexpr int PER = 16 / EB;
    return (long)blockIdx.x * LS_MOE_GROWS(EB) + (long)(threadIdx.x >> 5) * PER +
           (long)(threadIdx.x & 31u) / (32 / PER);
}

/* 1 in the first thread of its lane group (the one that stores the result). */
template <int EB>
__device__ __forceinline__ int ls_moe_group_first(void)
{
    return (threadIdx.x & 31u) % (32 / (16 / EB)) == 0;
}

/* grid (ceil(W / GROWS), tiles): gate and up row i of the tile's expert, both
 * streamed at once, for each pair of the tile. xvec: x and D allow float4 loads. */
template <int EB>
__global__ void __launch_bounds__(LS_MOE_GWARPS * LS_WARP)
ls_moe_gate_up_g_kernel(const ls_cuda_moe mw, const float *x, const ls_moe_tiles tl, long W,
                        float *mid, int xvec, int act)
{
    ls_pdl_entry();
    int shared, n;
    long e, p0;
    if (!ls_moe_tile_of(tl, &shared, &e, &p0, &n)) return;
    long i = ls_moe_group_row<EB>();
    if (i >= (shared ? mw.Is : mw.I)) return; /* whole lane group */
    size_t rowb = (size_t)mw.D * EB;
    const void *rows[2] = {(const uint8_t *)ls_moe_matrix(mw, e, shared, 0) + (size_t)i * rowb,
                           (const uint8_t *)ls_moe_matrix(mw, e, shared, 1) + (size_t)i * rowb};
    for (int q = 0; q < n; q++) {
        long t, slot;
        ls_moe_pair(tl, shared, p0, q, &t, &slot);
        float gu[2];
        ls_group_rowdot<EB, 2, LS_MOE_GU>(rows, mw.D, x + t * mw.D, xvec, gu);
        if (ls_moe_group_first<EB>())
            mid[(t * (tl.k + 1) + slot) * W + i] = ls_moe_mid(gu[0], gu[1], act);
    }
}

/* grid (ceil(D / GROWS), tiles): down row j of the tile's expert for each
 * pair of the tile. mvec: mid and W allow float4 loads. */
template <int EB>
__global__ void __launch_bounds__(LS_MOE_GWARPS * LS_WARP)
ls_moe_down_g_kernel(const ls_cuda_moe mw, const ls_moe_tiles tl, const float *weights, long W,
                     const float *mid, const float *gamma, float *cbuf, int mvec, int act)
{
    ls_pdl_entry();
    int shared, n;
    long e, p0;
    if (!ls_moe_tile_of(tl, &shared, &e, &p0, &n)) return;
    long j = ls_moe_group_row<EB>();
    if (j >= mw.D) return; /* whole lane group */
    long width = shared ? mw.Is : mw.I;
    const void *row[1] = {(const uint8_t *)ls_moe_matrix(mw, e, shared, 2) + (size_t)j * width * EB};
    for (int q = 0; q < n; q++) {
        long t, slot;
        ls_moe_pair(tl, shared, p0, q, &t, &slot);
        float y;
        ls_group_rowdot<EB, 1, LS_MOE_GU>(row, width, mid + (t * (tl.k + 1) + slot) * W, mvec, &y);
        if (ls_moe_group_first<EB>())
            cbuf[(t * (tl.k + 1) + slot) * mw.D + j] =
                ls_moe_slot_out(y, shared, gamma, weights, t, tl.k, slot, act);
    }
}

template <int EB>
static ls_status ls_moe_group_launch(const ls_cuda_moe *mw, const float *x, const ls_moe_tiles &tl,
                                     const float *weights, long W, long tiles, float *mid,
                                     float *gamma, float *cbuf, int act, cudaStream_t s,
                                     ls_error *err)
{
    int xvec = ((uintptr_t)x & 15u) == 0 && mw->D % 4 == 0;
    int mvec = ((uintptr_t)mid & 15u) == 0 && W % 4 == 0;
    dim3 g1(ls_blocks_for(W, LS_MOE_GROWS(EB)), (unsigned)tiles);
    ls_launch(ls_moe_gate_up_g_kernel<EB>, g1, LS_MOE_GWARPS * LS_WARP, 0, s, *mw, x, tl, W, mid, xvec, act);
    LS_CUDA_CHECK_LAUNCH("ls_moe_gate_up_g_kernel", err);
    LS_TRY(ls_moe_shared_gate(mw, x, tl.T, gamma, act, s, err));
    dim3 g2(ls_blocks_for(mw->D, LS_MOE_GROWS(EB)), (unsigned)tiles);
    ls_launch(ls_moe_down_g_kernel<EB>, g2, LS_MOE_GWARPS * LS_WARP, 0, s, *mw, tl, weights, W, mid, gamma,
              cbuf, mvec, act);
    LS_CUDA_CHECK_LAUNCH("ls_moe_down_g_kernel", err);
    return LS_OK;
}

/* ---- plans 3 and 4: tiles (ls_tile_dots) ----------------------------------------- */

/* The tiles and formulas above; a block streams a slice of its tile's expert
 * through shared memory (ls_tile_dots) and goes through the tile's pairs NT
 * at a time (plan 3: one-pair tiles, NT = 1; plan 4: grouped tiles, NT = 8),
 * so each weight read from shared memory meets NT pairs. Gate/up: warp w owns
 * hidden units RW/2 w .. of the block's LS_TILE_WARPS RW/2, its rows their
 * gate rows then their up rows; down: warp w owns rows RW w .. of the
 * block's LS_TILE_WARPS RW. Rows past the matrix repeat its last row and
 * pairs past the tile its last pair; neither is stored. bf16 or fp32
 * experts. */
template <int EB, int RW, int NT>
__global__ void __launch_bounds__(LS_TILE_WARPS * LS_WARP)
ls_moe_gate_up_t_kernel(const ls_cuda_moe mw, const float *x, const ls_moe_tiles tl, long W,
                        float *mid, int act)
{
    ls_pdl_entry();
    constexpr int HU = RW / 2; /* hidden units per warp */
    __shared__ __align__(16) uint8_t sm[LS_TILE_SMEM(EB, RW, NT)];
    int shared, n;
    long e, p0;
    if (!ls_moe_tile_of(tl, &shared, &e, &p0, &n)) return;
    long units = shared ? mw.Is : mw.I, i0 = (long)blockIdx.x * LS_TILE_WARPS * HU;
    if (i0 >= units) return; /* whole block */
    size_t rowb = (size_t)mw.D * EB;
    const uint8_t *g = (const uint8_t *)ls_moe_matrix(mw, e, shared, 0);
    const uint8_t *u = (const uint8_t *)ls_moe_matrix(mw, e, shared, 1);
    int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
    for (int q0 = 0; q0 < n; q0 += NT) {
        int nt = n - q0 < NT ? n - q0 : NT;
        float p[RW * NT];
        ls_tile_dots<EB, RW, NT>(
            sm, mw.D,
            [&](int r) {
                int j = r % RW;
                long i = i0 + (long)(r / RW) * HU + j % HU;
                return (j < HU ? g : u) + (size_t)(i < units ? i : units - 1) * rowb;
            },
            [&](int q) { return ls_moe_pair_row(tl, shared, p0, q0 + (q < nt ? q : nt - 1), x, mw.D, 0); },
            p);
        float v = ls_warp_tree_n(p); /* lane l < RW NT: the warp's row l / NT, pair l % NT */
        float up = __shfl_down_sync(LS_FULL_MASK, v, HU * NT);
        int q = lane % NT;
        long i = i0 + (long)warp * HU + lane / NT;
        if (lane < HU * NT && q < nt && i < units) {
            long t, slot;
            ls_moe_pair(tl, shared, p0, q0 + q, &t, &slot);
            mid[(t * (tl.k + 1) + slot) * W + i] = ls_moe_mid(v, up, act);
        }
    }
}

template <int EB, int RW, int NT>
__global__ void __launch_bounds__(LS_TILE_WARPS * LS_WARP)
ls_moe_down_t_kernel(const ls_cuda_moe mw, const ls_moe_tiles tl, const float *weights, long W,
                     const float *mid, const float *gamma, float *cbuf, int act)
{
    ls_pdl_entry();
    __shared__ __align__(16) uint8_t sm[LS_TILE_SMEM(EB, RW, NT)];
    int shared, n;
    long e, p0;
    if (!ls_moe_tile_of(tl, &shared, &e, &p0, &n)) return;
    long j0 = (long)blockIdx.x * LS_TILE_WARPS * RW;
    if (j0 >= mw.D) return; /* whole block */
    long width = shared ? mw.Is : mw.I;
    const uint8_t *dn = (const uint8_t *)ls_moe_matrix(mw, e, shared, 2);
    int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
    for (int q0 = 0; q0 < n; q0 += NT) {
        int nt = n - q0 < NT ? n - q0 : NT;
        float p[RW * NT];
        ls_tile_dots<EB, RW, NT>(
            sm, width,
            [&](int r) { return dn + (size_t)(j0 + r < mw.D ? j0 + r : mw.D - 1) * width * EB; },
            [&](int q) { return ls_moe_pair_row(tl, shared, p0, q0 + (q < nt ? q : nt - 1), mid, W, 1); },
            p);
        float v = ls_warp_tree_n(p); /* lane l < RW NT: the warp's row l / NT, pair l % NT */
        int q = lane % NT;
        long j = j0 + (long)warp * RW + lane / NT;
        if (lane < RW * NT && q < nt && j < mw.D) {
            long t, slot;
            ls_moe_pair(tl, shared, p0, q0 + q, &t, &slot);
            cbuf[(t * (tl.k + 1) + slot) * mw.D + j] =
                ls_moe_slot_out(v, shared, gamma, weights, t, tl.k, slot, act);
        }
    }
}

#define LS_MOE_TRW 4 /* rows per warp of the tile plans */

template <int EB, int NT>
static ls_status ls_moe_tile_launch(const ls_cuda_moe *mw, const float *x, const ls_moe_tiles &tl,
                                    const float *weights, long W, long tiles, float *mid,
                                    float *gamma, float *cbuf, int act, cudaStream_t s,
                                    ls_error *err)
{
    dim3 g1(ls_blocks_for(W, LS_TILE_WARPS * LS_MOE_TRW / 2), (unsigned)tiles);
    ls_launch(ls_moe_gate_up_t_kernel<EB, LS_MOE_TRW, NT>, g1, LS_TILE_WARPS * LS_WARP, 0, s, *mw, x, tl, W,
              mid, act);
    LS_CUDA_CHECK_LAUNCH("ls_moe_gate_up_t_kernel", err);
    LS_TRY(ls_moe_shared_gate(mw, x, tl.T, gamma, act, s, err));
    dim3 g2(ls_blocks_for(mw->D, LS_TILE_WARPS * LS_MOE_TRW), (unsigned)tiles);
    ls_launch(ls_moe_down_t_kernel<EB, LS_MOE_TRW, NT>, g2, LS_TILE_WARPS * LS_WARP, 0, s, *mw, tl, weights,
              W, mid, gamma, cbuf, act);
    LS_CUDA_CHECK_LAUNCH("ls_moe_down_t_kernel", err);
    return LS_OK;
}

/* One thread per (token, j): routed = act(Σ_i c_i) in top-k order from +0,
 * out = act(routed + shared). A slot whose id is outside [0, E) has y = 0,
 * so c_i = act(0 · w_i); it is in no tile, so it is formed here. */
__global__ void ls_moe_combine_kernel(const float *cbuf, const int32_t *ids, const float *weights,
                                      long E, long T, long k, long D, int has_shared, float *out,
                                      int act)
{
    ls_pdl_entry();
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= T * D) return;
    long t = e / D, j = e % D;
    const float *c = cbuf + t * (k + 1) * D; /* [k+1, D] */
    float s = 0.0f;
    /* in batches of LS_PF slots: every id of a batch, then every slot value,
     * loaded before the sum (two memory latencies a batch, not one a slot) */
    for (long i0 = 0; i0 < k; i0 += LS_PF) {
        long id[LS_PF];
        float cv[LS_PF];
#pragma unroll
        for (int u = 0; u < LS_PF; u++) id[u] = i0 + u < k ? ids[t * k + i0 + u] : -1;
#pragma unroll
        for (int u = 0; u < LS_PF; u++) {
            if (id[u] >= 0 && id[u] < E) {
                cv[u] = c[(i0 + u) * D + j];
            } else if (i0 + u < k) {
                float y = 0.0f;
                cv[u] = ls_act_d(y * weights[t * k + i0 + u], act);
            }
        }
#pragma unroll
        for (int u = 0; u < LS_PF; u++)
            if (i0 + u < k) s = s + cv[u];
    }
    float routed = ls_act_d(s, act);
    out[e] = has_shared ? ls_act_d(routed + c[k * D + j], act) : routed;
}

template <int NT, int LEAN, int MINB>
static ls_status ls_moe_experts_launch(const ls_cuda_moe *mw, const float *x, const ls_moe_q8 &q8,
                                       float *xq_w, float *xqs_w, float *mq_w, float *mqs_w,
                                       const ls_moe_tiles &tl, const float *weights, long W,
                                       long tiles, float *mid, float *gamma, float *cbuf, int act,
                                       cudaStream_t s, ls_error *err)
{
    if (xq_w) { /* w8a8: the input rows quantised once per token */
        long groups = tl.T * LS_FP8_BLOCKS(mw->D);
        ls_launch(ls_moe_quant_x_kernel, ls_blocks_for(groups, 128), 128, 0, s, x, tl.T, mw->D, xq_w, xqs_w);
        LS_CUDA_CHECK_LAUNCH("ls_moe_quant_x_kernel", err);
    }
    dim3 g1(ls_blocks_for(W, LS_MOE_WARPS), (unsigned)tiles);
    ls_launch(ls_moe_gate_up_kernel<NT, LEAN, MINB>, g1, LS_MOE_WARPS * LS_WARP, 0, s, *mw, x, q8, tl, W, mid,
              act);
    LS_CUDA_CHECK_LAUNCH("ls_moe_gate_up_kernel", err);
    LS_TRY(ls_moe_shared_gate(mw, x, tl.T, gamma, act, s, err));
    if (mq_w) { /* w8a8: each slot's hidden row quantised before the down projection */
        long groups = tl.T * (tl.k + 1) * LS_FP8_BLOCKS(W);
        ls_launch(ls_moe_quant_mid_kernel, ls_blocks_for(groups, 128), 128, 0, s, *mw, tl.T, tl.k, W, mid,
                  mq_w, mqs_w);
        LS_CUDA_CHECK_LAUNCH("ls_moe_quant_mid_kernel", err);
    }
    dim3 g2(ls_blocks_for(mw->D, LS_MOE_WARPS), (unsigned)tiles);
    ls_launch(ls_moe_down_kernel<NT, LEAN, MINB>, g2, LS_MOE_WARPS * LS_WARP, 0, s, *mw, q8, tl, weights, W,
              mid, gamma, cbuf, act);
    LS_CUDA_CHECK_LAUNCH("ls_moe_down_kernel", err);
    return LS_OK;
}

/* The plans, chosen by measurement on the H200 (reports/perf-h200.md,
 * bench_gpu --moe-plans; every plan gives the same bits):
 *   0  every pair its own tile, the lean scalar dot, 40 registers for 6
 *      blocks per SM: the default for FP8 experts at T k <= E (decode).
 *   1  grouped by expert, 8 pairs per warp row pass, registers cut to 128
 *      for 2 blocks per SM: the default for FP8 experts above.
 *   2  every pair its own tile, the lane-group dot (bf16 and fp32 experts):
 *      1.6x faster than plan 0 at 32 tokens; kept for comparison.
 *   3  every pair its own tile, tiles through shared memory (ls_tile_dots,
 *      bf16 and fp32 experts): the default for them at T k <= E, 1.15-1.3x
 *      faster than plan 2 at 1-32 tokens (run 19).
 *   4  grouped by expert, tiles, 8 pairs a pass: the default for bf16 and
 *      fp32 experts above, 2.1x faster than plan 2 at 256 tokens and 2.9x
 *      at 1024 (run 19). */
static const char *const ls_moe_plan_names[] = {"single pairs, lean dot",
                                                "grouped by expert, 8 pairs per pass",
                                                "single pairs, lane groups",
                                                "single pairs, tiles",
                                                "grouped by expert, tiles"};

/* Element bytes of experts the lane-group plan takes (all of them bf16, or all
 * fp32), else 0. */
static int ls_moe_group_eb(const ls_cuda_moe *mw)
{
    if (mw->wtype != LS_WTYPE_BF16_ID && mw->wtype != LS_WTYPE_F32_ID) return 0;
    if (mw->sh_gate && mw->sh_wtype != mw->wtype) return 0;
    return (int)ls_welem_bytes(mw->wtype);
}

extern "C" int ls_cuda_moe_plan_count(void)
{
    return (int)(sizeof ls_moe_plan_names / sizeof ls_moe_plan_names[0]);
}

extern "C" const char *ls_cuda_moe_plan_name(int plan)
{
    return plan >= 0 && plan < ls_cuda_moe_plan_count() ? ls_moe_plan_names[plan] : "?";
}

/* What every MoE entry point refuses (fail closed). */
static ls_status ls_moe_check(const ls_cuda_moe *mw, long k, int order_experts, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order_experts, err, "moe (experts)");
    LS_REQUIRE_WTYPE_ANY(mw->wtype, err, "moe");
    if (mw->sh_gate) {
        LS_REQUIRE_WTYPE_ANY(mw->sh_wtype, err, "moe (shared expert)");
        LS_REQUIRE_WTYPE(mw->shg_wtype, err, "moe (shared expert gate)");
    }
    LS_CUDA_REQUIRE((mw->wtype < 2 || (mw->gate_s && mw->up_s && mw->down_s)) &&
                        (!mw->sh_gate || mw->sh_wtype < 2 ||
                         (mw->sh_gate_s && mw->sh_up_s && mw->sh_down_s)),
                    err, "cuda portable moe: FP8 experts without their block scales");
    LS_CUDA_REQUIRE(k >= 1 && mw->E >= 1 && mw->D >= 1 && mw->I >= 1 &&
                        (mw->sh_gate == NULL || mw->Is >= 1),
                    err, "cuda portable moe: shape E %ld D %ld I %ld Is %ld k %ld not supported",
                    mw->E, mw->D, mw->I, mw->Is, k);
    return LS_OK;
}

/* Carves the scratch (the layout of ls_cuda_moe_scratch_bytes, tile lists
 * of max_tiles entries) into mid, cbuf, gamma and the grouping's lists, and
 * unless `single` launches the count and group kernels over the T k pairs of
 * ids; *tl: the tiles of the expert launches. Fails when those exceed one
 * launch. */
static ls_status ls_moe_layout(const ls_cuda_moe *mw, const int32_t *ids, long T, long k,
                               long sh_tiles, long max_tiles, int single, void *scratch,
                               cudaStream_t s, ls_moe_tiles *tl, float **mid, float **cbuf,
                               float **gamma, ls_error *err)
{
    long P = T * k, slots = T * (k + 1);
    LS_CUDA_REQUIRE(P <= INT32_MAX && sh_tiles + max_tiles <= 65535, err,
                    "cuda moe: T %ld x k %ld pairs over E %ld experts exceed one launch; "
                    "call with fewer tokens", T, k, mw->E);
    *mid = (float *)scratch;                                /* [T, k+1, W] */
    *cbuf = *mid + (size_t)slots * ls_moe_width(mw);        /* [T, k+1, D] */
    *gamma = *cbuf + (size_t)slots * mw->D;                 /* [T] */
    int32_t *count = (int32_t *)(*gamma + T);               /* [E] */
    int32_t *pairs = count + mw->E;                         /* [P] */
    int32_t *tile_e = pairs + P;                            /* [max_tiles] */
    int32_t *tile_p0 = tile_e + max_tiles;                  /* [max_tiles] */
    int32_t *tile_n = tile_p0 + max_tiles;                  /* [max_tiles] */
    int32_t *ntiles = tile_n + max_tiles;                   /* [1] */
    if (!single) {
        unsigned eb = ls_blocks_for(mw->E, LS_MOE_WARPS);
        ls_launch(ls_moe_count_kernel, eb, LS_MOE_WARPS * LS_WARP, 0, s, ids, P, mw->E, count);
        LS_CUDA_CHECK_LAUNCH("ls_moe_count_kernel", err);
        ls_launch(ls_moe_group_kernel, eb, LS_MOE_WARPS * LS_WARP, 0, s, ids, P, mw->E, count, pairs, tile_e,
                  tile_p0, tile_n, ntiles);
        LS_CUDA_CHECK_LAUNCH("ls_moe_group_kernel", err);
    }
    *tl = {ids, pairs, tile_e, tile_p0, tile_n, ntiles, T, k, mw->E, sh_tiles, single};
    return LS_OK;
}

/* The slot rows of every (token, slot) pair whose expert id is in [0, E),
 * and the shared slot of every token (mw->sh_gate set), into the scratch's
 * c [T, k+1, D] (*cbuf_out): the expert launches of the forward, without its
 * combine. T >= 1, mw checked (ls_moe_check). */
static ls_status ls_moe_slot_rows(const ls_cuda_moe *mw, const float *x, const int32_t *ids,
                                  const float *weights, long k, long T, void *scratch,
                                  int act_bf16, int plan, cudaStream_t s, float **cbuf_out,
                                  ls_error *err)
{
    LS_CUDA_REQUIRE(!mw->tc_layout, err, "cuda portable moe: the expert matrices are in the tensor-core "
                    "layout, which only the tensor-core experts read");
    long P = T * k;
    int eb = ls_moe_group_eb(mw);
    if (plan < 0) plan = (P <= mw->E ? 0 : 1) + (eb ? 3 : 0);
    LS_CUDA_REQUIRE(plan < ls_cuda_moe_plan_count(), err, "cuda portable moe: no plan %d", plan);
    LS_CUDA_REQUIRE(plan < 2 || eb, err, "cuda portable moe: plan %d (%s) takes bf16 or fp32 "
                    "experts only", plan, ls_cuda_moe_plan_name(plan));
    int single = plan == 0 || plan == 2 || plan == 3;
    long sh_tiles = !mw->sh_gate ? 0 : single ? T : (T + LS_MOE_TILE - 1) / LS_MOE_TILE;
    long max_tiles = single ? P : (long)ls_moe_max_tiles(mw->E, P);
    LS_CUDA_REQUIRE(sh_tiles + max_tiles <= 65535, err,
                    "cuda portable moe: plan %d (%s) launches %ld tiles for %ld tokens x top-%ld; one "
                    "launch holds 65535", plan, ls_cuda_moe_plan_name(plan), sh_tiles + max_tiles, T, k);
    long slots = T * (k + 1);
    long W = (long)ls_moe_width(mw);
    float *mid, *cbuf, *gamma;
    ls_moe_tiles tl;
    LS_TRY(ls_moe_layout(mw, ids, T, k, sh_tiles, max_tiles, single, scratch, s, &tl, &mid, &cbuf,
                         &gamma, err));
    /* w8a8: x and the slots' hidden rows quantised (ls_moe_w8a8_floats) */
    float *xq = NULL, *xqs = NULL, *mq = NULL, *mqs = NULL;
    if (ls_moe_w8a8(mw)) {
        xq = (float *)(tl.ntiles + 1);             /* [T, D] */
        xqs = xq + (size_t)T * mw->D;              /* [T, ceil(D/128)] */
        mq = xqs + (size_t)T * LS_FP8_BLOCKS(mw->D); /* [T, k+1, W] */
        mqs = mq + (size_t)slots * W;              /* [T, k+1, ceil(W/128)] */
    }
    ls_moe_q8 q8 = {xq, xqs, mq, mqs};
    long tiles = sh_tiles + max_tiles;
    if (plan == 3 || plan == 4) {
        if (eb == 2 && plan == 3)
            LS_TRY((ls_moe_tile_launch<2, 1>(mw, x, tl, weights, W, tiles, mid, gamma, cbuf, act_bf16, s, err)));
        else if (eb == 2)
            LS_TRY((ls_moe_tile_launch<2, 8>(mw, x, tl, weights, W, tiles, mid, gamma, cbuf, act_bf16, s, err)));
        else if (plan == 3)
            LS_TRY((ls_moe_tile_launch<4, 1>(mw, x, tl, weights, W, tiles, mid, gamma, cbuf, act_bf16, s, err)));
        else
            LS_TRY((ls_moe_tile_launch<4, 8>(mw, x, tl, weights, W, tiles, mid, gamma, cbuf, act_bf16, s, err)));
    } else if (plan == 2) {
        if (eb == 2)
            LS_TRY(ls_moe_group_launch<2>(mw, x, tl, weights, W, tiles, mid, gamma, cbuf, act_bf16, s,
                                          err));
        else
            LS_TRY(ls_moe_group_launch<4>(mw, x, tl, weights, W, tiles, mid, gamma, cbuf, act_bf16, s,
                                          err));
    } else if (single)
        LS_TRY((ls_moe_experts_launch<1, 1, 6>(mw, x, q8, xq, xqs, mq, mqs, tl, weights, W, tiles,
                                               mid, gamma, cbuf, act_bf16, s, err)));
    else
        LS_TRY((ls_moe_experts_launch<LS_MOE_NT, 0, 2>(mw, x, q8, xq, xqs, mq, mqs, tl, weights, W,
                                                       tiles, mid, gamma, cbuf, act_bf16, s, err)));
    *cbuf_out = cbuf;
    return LS_OK;
}

extern "C" ls_status ls_cuda_moe_forward_plan(const ls_cuda_moe *mw, const float *x,
                                              const int32_t *ids, const float *weights, long k,
                                              float *out, long T, void *scratch, int act_bf16,
                                              int order_experts, int order_combine, int plan,
                                              void *stream, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order_combine, err, "moe (combine)");
    LS_TRY(ls_moe_check(mw, k, order_experts, err));
    if (T <= 0) return LS_OK;
    cudaStream_t s = (cudaStream_t)stream;
    float *cbuf = NULL;
    LS_TRY(ls_moe_slot_rows(mw, x, ids, weights, k, T, scratch, act_bf16, plan, s, &cbuf, err));
    ls_launch(ls_moe_combine_kernel, ls_blocks_for(T * mw->D, 256), 256, 0, s, cbuf, ids, weights, mw->E, T,
              k, mw->D, mw->sh_gate != NULL, out, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_moe_combine_kernel", err);
    return LS_OK;
}

extern "C" ls_status ls_cuda_moe_forward(const ls_cuda_moe *mw, const float *x, const int32_t *ids,
                                         const float *weights, long k, float *out, long T,
                                         void *scratch, int act_bf16, int order_experts,
                                         int order_combine, void *stream, ls_error *err)
{
    return ls_cuda_moe_forward_plan(mw, x, ids, weights, k, out, T, scratch, act_bf16,
                                    order_experts, order_combine, -1, stream, err);
}

/* ---- the tensor-core tier's experts (docs/tensor-core-tier.md §2.3) -------------------- */

/* The grouping and tiles above (every call grouped, tiles of at most
 * LS_MOE_TILE pairs of one expert, the shared expert's tiles runs of tokens),
 * each tile in passes of 16 pairs. A block owns 16 NC output columns of its
 * tile (NC column tiles of 16, NC 1 or 4 by the call's size); its 4 warps
 * own the 4 K slices of ls_moe_tc_slice (consecutive runs
 * of K, each a multiple of 16 long, the last ones possibly empty). A warp
 * stages the pass's activation rows of its slice rounded to bf16
 * (ls_f32_to_bf16, as the tc linears' inputs; zero rows past the tile's
 * end) and sweeps the slice in ascending steps of 16 through WMMA 16x16x16
 * (bf16 in, fp32 accumulate) from a zero accumulator; the block then sums
 * the 4 slice partials in slice order, ((p0 + p1) + p2) + p3. An output
 * element is the hardware's dot of its own row and column, so a pair's bits
 * do not depend on the other pairs of its pass, its row in it, or how many
 * pairs chose the expert. Gate/up: mid = act(act(silu(act(g))) · act(u)) as
 * the portable kernels form it; down: c = act(act(y) · w) (shared: act(γ ·
 * act(y))); the combine is the portable one. bf16 weights only, D, I and Is
 * multiples of 16, in the tensor-core layout (ls_moe_tc_check). */
#define LS_MOE_TC_WARPS 4                      /* = the K slices */
#define LS_MOE_TC_KC 128                       /* K staged at a time per warp */
#define LS_MOE_TC_LDA (LS_MOE_TC_KC + 16)      /* staged row stride: 32-byte aligned rows */

typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> ls_tc_acc;

/* Length of each K slice: K / 16 steps split into LS_MOE_TC_WARPS runs. */
__device__ __forceinline__ long ls_moe_tc_slice(long K)
{
    return (K / 16 + LS_MOE_TC_WARPS - 1) / LS_MOE_TC_WARPS * 16;
}

/* Threads 0..15: the source row of each pass row (NULL past the tile's
 * end), the pair's token row of x (by_slot 0) or its slot row of mid. */
__device__ __forceinline__ void ls_moe_tc_rows(const float **rows, const ls_moe_tiles &tl,
                                               int shared, long p0, int q0, int nr,
                                               const float *src, long ld, int by_slot)
{
    int r = (int)threadIdx.x;
    if (r >= 16) return;
    rows[r] = r < nr ? ls_moe_pair_row(tl, shared, p0, q0 + r, src, ld, by_slot) : NULL;
}

/* The warp's slice ks .. ke-1 of (the 16 rows) · Bᵀ for NW weight matrices
 * and NC column tiles: acc[m][c] over weight rows 16 c .. 16 c + 15 of w[m]
 * (rows of length K in the tensor-core layout, ls_cuda_moe_tc_pack; tiles
 * c >= live are left alone), from a zero
 * accumulator in ascending steps of 16 along K. a is the warp's staging
 * buffer: per chunk of LS_MOE_TC_KC, lane l converts columns 4l .. 4l+3 of
 * every row. The column tiles only share the staging: each accumulates
 * alone, so NC changes no bit. The weight fragments, the stream that bounds
 * these kernels, are loaded in groups of G steps (NW NC G = 8 fragments),
 * each group's loads issued before the group before it is multiplied, two
 * groups in registers (ls_moe_tc_group); the order of the multiplies is the
 * plain loop's. Measured on an H200 (reports/perf-h200.md, runs 27 and 28):
 * groups of 16 fragments and of 4 were slower at batch 1, and so were
 * streaming loads (__ldcs); since the fragments are packed, asking L2 for
 * the next groups ahead (prefetch.global.L2) no longer helps. */
#define LS_MOE_TC_GROUP_FRAGS 8
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __nv_bfloat16, nvcuda::wmma::col_major>
    ls_tc_b;

template <int NW, int NC>
struct ls_moe_tc_group {
    static constexpr int G0 = LS_MOE_TC_GROUP_FRAGS / (NW * NC) > 0 ? LS_MOE_TC_GROUP_FRAGS / (NW * NC) : 1;
    static constexpr int G = G0 < LS_MOE_TC_KC / 16 ? G0 : LS_MOE_TC_KC / 16;
    ls_tc_b b[G][NW][NC];
};

/* The tensor-core layout of a bf16 weight matrix [N, K] (N and K multiples
 * of 16; ls_cuda_moe_tc_pack): the 16 x 16 fragment of rows 16 c .. 16 c + 15
 * and columns 16 t .. 16 t + 15 lies whole at elements (c K / 16 + t) 256 ..
 * + 255, lane l's part of it as WMMA holds it in registers (ls_tc_b.x) at
 * 8 l .. 8 l + 7. The fragments of a row tile thus fill the bytes its rows
 * filled, in ascending t, and a warp loads one as 512 contiguous bytes, 16 a
 * lane, where the row-major matrix cost 16 rows' 32-byte pieces 2 K bytes
 * apart. The pack writes the registers that load_matrix_sync fills from the
 * row-major matrix and the experts read them back into the same fragment
 * type, so a fragment's elements are the ones it held before, whatever
 * WMMA's register order is, and no product changes. */
static_assert(sizeof(((ls_tc_b *)0)->x) == 16, "a bf16 16x16 B fragment holds 16 bytes a lane");

__device__ __forceinline__ const __nv_bfloat16 *ls_moe_tc_frag(const __nv_bfloat16 *w, long K, int c, long t)
{
    return w + ((long)c * (K / 16) + t) * 256;
}

__device__ __forceinline__ void ls_moe_tc_frag_load(ls_tc_b &b, const __nv_bfloat16 *frag)
{
    uint4 v = *((const uint4 *)frag + (threadIdx.x & 31u));
    memcpy(b.x, &v, sizeof v);
}

/* The twin of ls_moe_tc_frag_load: lane l's part of b to its place in frag. */
__device__ __forceinline__ void ls_moe_tc_frag_store(const ls_tc_b &b, __nv_bfloat16 *frag)
{
    uint4 v;
    memcpy(&v, b.x, sizeof v);
    *((uint4 *)frag + (threadIdx.x & 31u)) = v;
}

/* Warp per fragment: fragment f of the packed matrix w from its row-major
 * copy src. */
__global__ void __launch_bounds__(LS_MOE_TC_WARPS * LS_WARP)
ls_moe_tc_pack_kernel(const __nv_bfloat16 *src, __nv_bfloat16 *w, long N, long K)
{
    long f = (long)blockIdx.x * LS_MOE_TC_WARPS + (threadIdx.x >> 5), steps = K / 16;
    if (f >= N / 16 * steps) return;
    long c = f / steps, t = f % steps;
    ls_tc_b b;
    nvcuda::wmma::load_matrix_sync(b, src + c * 16 * K + t * 16, (unsigned)K);
    ls_moe_tc_frag_store(b, (__nv_bfloat16 *)ls_moe_tc_frag(w, K, (int)c, t));
}

extern "C" ls_status ls_cuda_moe_tc_pack(void *w, long N, long K, void *scratch, void *stream, ls_error *err)
{
    LS_CUDA_REQUIRE(N > 0 && K > 0 && N % 16 == 0 && K % 16 == 0, err,
                    "tensor-core moe layout: matrix [%ld x %ld] is not made of 16 x 16 fragments", N, K);
    LS_CUDA_REQUIRE((uintptr_t)w % 32 == 0 && (uintptr_t)scratch % 32 == 0, err,
                    "tensor-core moe layout: the matrix and the scratch must be 32-byte aligned");
    cudaStream_t s = (cudaStream_t)stream;
    size_t bytes = (size_t)N * (size_t)K * 2;
    LS_CUDA_CHECK(cudaMemcpyAsync(scratch, w, bytes, cudaMemcpyDeviceToDevice, s), err,
                  "tensor-core moe layout: the row-major copy of an expert matrix");
    long frags = N / 16 * (K / 16);
    ls_launch(ls_moe_tc_pack_kernel, ls_blocks_for(frags, LS_MOE_TC_WARPS), LS_MOE_TC_WARPS * LS_WARP, 0, s,
              (const __nv_bfloat16 *)scratch, (__nv_bfloat16 *)w, N, K);
    LS_CUDA_CHECK_LAUNCH("ls_moe_tc_pack_kernel", err);
    return LS_OK;
}

/* Loads group g (steps g G .. g G + G - 1 of the slice, those below n). */
template <int NW, int NC>
__device__ __forceinline__ void ls_moe_tc_load(ls_moe_tc_group<NW, NC> &f, const __nv_bfloat16 *const *w,
                                               int live, long K, long ks, int g, int n)
{
    constexpr int G = ls_moe_tc_group<NW, NC>::G;
#pragma unroll
    for (int i = 0; i < G; i++) {
        int t = g * G + i;
        if (t >= n) break;
#pragma unroll
        for (int m = 0; m < NW; m++)
#pragma unroll
            for (int c = 0; c < NC; c++)
                if (c < live) ls_moe_tc_frag_load(f.b[i][m][c], ls_moe_tc_frag(w[m], K, c, ks / 16 + t));
    }
}

/* Multiplies group g, staging the activation chunk that its first step
 * begins (G divides the chunk's steps, so a group lies in one chunk). */
template <int NW, int NC>
__device__ __forceinline__ void ls_moe_tc_mul(ls_tc_acc (&acc)[NW][NC], const ls_moe_tc_group<NW, NC> &f,
                                              __nv_bfloat16 (*a)[LS_MOE_TC_LDA], const float *const *rows,
                                              int live, long ks, long ke, int g, int n)
{
    using namespace nvcuda;
    constexpr int G = ls_moe_tc_group<NW, NC>::G, CS = LS_MOE_TC_KC / 16;
    static_assert(CS % G == 0, "a group must lie in one chunk");
    int lane = (int)(threadIdx.x & 31u);
    int t0 = g * G;
    if (t0 % CS == 0) {
        long k0 = ks + 16L * t0, kc = ke - k0 < LS_MOE_TC_KC ? ke - k0 : LS_MOE_TC_KC;
        __syncwarp();
        for (int r = 0; r < 16; r++) {
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (rows[r] && 4 * lane < kc) v = *(const float4 *)(rows[r] + k0 + 4 * lane);
            uint2 b;
            b.x = (uint32_t)ls_f32_to_bf16(v.x) | (uint32_t)ls_f32_to_bf16(v.y) << 16;
            b.y = (uint32_t)ls_f32_to_bf16(v.z) | (uint32_t)ls_f32_to_bf16(v.w) << 16;
            *(uint2 *)&a[r][4 * lane] = b;
        }
        __syncwarp();
    }
#pragma unroll
    for (int i = 0; i < G; i++) {
        int t = t0 + i;
        if (t >= n) break;
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
        wmma::load_matrix_sync(fa, &a[0][16 * (t % CS)], LS_MOE_TC_LDA);
#pragma unroll
        for (int m = 0; m < NW; m++)
#pragma unroll
            for (int c = 0; c < NC; c++)
                if (c < live) wmma::mma_sync(acc[m][c], fa, f.b[i][m][c], acc[m][c]);
    }
}

template <int NW, int NC>
__device__ __forceinline__ void ls_moe_tc_slice_mma(ls_tc_acc (&acc)[NW][NC],
                                                    __nv_bfloat16 (*a)[LS_MOE_TC_LDA],
                                                    const float *const *rows,
                                                    const __nv_bfloat16 *const *w, int live,
                                                    long K, long ks, long ke)
{
    constexpr int G = ls_moe_tc_group<NW, NC>::G;
#pragma unroll
    for (int m = 0; m < NW; m++)
#pragma unroll
        for (int c = 0; c < NC; c++) nvcuda::wmma::fill_fragment(acc[m][c], 0.0f);
    int n = ke > ks ? (int)((ke - ks) / 16) : 0, groups = (n + G - 1) / G;
    ls_moe_tc_group<NW, NC> f0, f1;
    if (groups > 0) ls_moe_tc_load(f0, w, live, K, ks, 0, n);
    for (int g = 0; g < groups; g += 2) {
        if (g + 1 < groups) ls_moe_tc_load(f1, w, live, K, ks, g + 1, n);
        ls_moe_tc_mul(acc, f0, a, rows, live, ks, ke, g, n);
        if (g + 1 >= groups) break;
        if (g + 2 < groups) ls_moe_tc_load(f0, w, live, K, ks, g + 2, n);
        ls_moe_tc_mul(acc, f1, a, rows, live, ks, ke, g + 1, n);
    }
}

/* Element i of a 16x16 output tile: the slice partials part[w][i] summed in
 * slice order. */
__device__ __forceinline__ float ls_moe_tc_sum(const float (*part)[16 * 16], int i)
{
    float s = part[0][i];
#pragma unroll
    for (int w = 1; w < LS_MOE_TC_WARPS; w++) s = s + part[w][i];
    return s;
}

/* The column tiles of a block: NC tiles of 16 from n0 = 16 NC blockIdx.x,
 * those below `width` live. */
template <int NC>
__device__ __forceinline__ int ls_moe_tc_live(long n0, long width)
{
    long live = (width - n0) / 16;
    return live < NC ? (int)live : NC;
}

/* grid (ceil(W / (16 NC)), tiles): block per (tile, hidden units n0 ..
 * n0 + 16 NC - 1). */
template <int NC>
__global__ void __launch_bounds__(LS_MOE_TC_WARPS * LS_WARP)
ls_moe_tc_gate_up_kernel(const ls_cuda_moe mw, const float *x, const ls_moe_tiles tl, long W,
                         float *mid, int act)
{
    ls_pdl_entry();
    using namespace nvcuda;
    __shared__ __align__(128) __nv_bfloat16 a[LS_MOE_TC_WARPS][16][LS_MOE_TC_LDA];
    __shared__ __align__(128) float o[2][LS_MOE_TC_WARPS][16 * 16];
    __shared__ const float *rows[16];
    int shared, n;
    long e, p0;
    if (!ls_moe_tile_of(tl, &shared, &e, &p0, &n)) return; /* whole block */
    long width = shared ? mw.Is : mw.I, n0 = (long)blockIdx.x * 16 * NC;
    if (n0 >= width) return;                               /* whole block */
    int live = ls_moe_tc_live<NC>(n0, width);
    int warp = (int)(threadIdx.x >> 5);
    long slice = ls_moe_tc_slice(mw.D), ks = warp * slice;
    long ke = ks + slice < mw.D ? ks + slice : mw.D;
    const __nv_bfloat16 *w[2] = {
        (const __nv_bfloat16 *)ls_moe_matrix(mw, e, shared, 0) + n0 * mw.D,
        (const __nv_bfloat16 *)ls_moe_matrix(mw, e, shared, 1) + n0 * mw.D};
    for (int q0 = 0; q0 < n; q0 += 16) {
        int nr = n - q0 < 16 ? n - q0 : 16;
        ls_moe_tc_rows(rows, tl, shared, p0, q0, nr, x, mw.D, 0);
        __syncthreads();
        ls_tc_acc acc[2][NC];
        ls_moe_tc_slice_mma<2, NC>(acc, a[warp], rows, w, live, mw.D, ks, ke);
#pragma unroll
        for (int c = 0; c < NC; c++) { /* c a constant: acc stays in registers */
            if (c >= live) break;
            wmma::store_matrix_sync(o[0][warp], acc[0][c], 16, wmma::mem_row_major);
            wmma::store_matrix_sync(o[1][warp], acc[1][c], 16, wmma::mem_row_major);
            __syncthreads();
            for (int i = (int)threadIdx.x; i < nr * 16; i += LS_MOE_TC_WARPS * LS_WARP) {
                long t, slot;
                ls_moe_pair(tl, shared, p0, q0 + i / 16, &t, &slot);
                float gq = ls_act_d(ls_moe_tc_sum(o[0], i), act);
                float uq = ls_act_d(ls_moe_tc_sum(o[1], i), act);
                float sg = ls_act_d(ls_siluf(gq), act);
                mid[(t * (tl.k + 1) + slot) * W + n0 + 16 * c + i % 16] = ls_act_d(sg * uq, act);
            }
            __syncthreads();
        }
    }
}

/* grid (ceil(D / (16 NC)), tiles): block per (tile, outputs j0 .. j0 + 16 NC - 1).
 * sum (the fast tier): the routed slot rows are added to sum [T, D] with
 * atomics instead of stored. */
template <int NC>
__global__ void __launch_bounds__(LS_MOE_TC_WARPS * LS_WARP)
ls_moe_tc_down_kernel(const ls_cuda_moe mw, const ls_moe_tiles tl, const float *weights, long W,
                      const float *mid, const float *gamma, float *cbuf, float *sum, int act)
{
    ls_pdl_entry();
    using namespace nvcuda;
    __shared__ __align__(128) __nv_bfloat16 a[LS_MOE_TC_WARPS][16][LS_MOE_TC_LDA];
    __shared__ __align__(128) float o[LS_MOE_TC_WARPS][16 * 16];
    __shared__ const float *rows[16];
    int shared, n;
    long e, p0;
    if (!ls_moe_tile_of(tl, &shared, &e, &p0, &n)) return; /* whole block */
    long width = shared ? mw.Is : mw.I, j0 = (long)blockIdx.x * 16 * NC;
    int live = ls_moe_tc_live<NC>(j0, mw.D);
    int warp = (int)(threadIdx.x >> 5);
    long slice = ls_moe_tc_slice(width), ks = warp * slice;
    long ke = ks + slice < width ? ks + slice : width;
    const __nv_bfloat16 *w[1] = {(const __nv_bfloat16 *)ls_moe_matrix(mw, e, shared, 2) + j0 * width};
    for (int q0 = 0; q0 < n; q0 += 16) {
        int nr = n - q0 < 16 ? n - q0 : 16;
        ls_moe_tc_rows(rows, tl, shared, p0, q0, nr, mid, W, 1);
        __syncthreads();
        ls_tc_acc acc[1][NC];
        ls_moe_tc_slice_mma<1, NC>(acc, a[warp], rows, w, live, width, ks, ke);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            if (c >= live) break;
            wmma::store_matrix_sync(o[warp], acc[0][c], 16, wmma::mem_row_major);
            __syncthreads();
            for (int i = (int)threadIdx.x; i < nr * 16; i += LS_MOE_TC_WARPS * LS_WARP) {
                long t, slot;
                ls_moe_pair(tl, shared, p0, q0 + i / 16, &t, &slot);
                float yq = ls_act_d(ls_moe_tc_sum(o, i), act);
                float cq = shared ? ls_act_d(gamma[t] * yq, act)
                                  : ls_act_d(yq * weights[t * tl.k + slot], act);
                long j = j0 + 16 * c + i % 16;
                if (sum && !shared) atomicAdd(sum + t * mw.D + j, cq); /* the fast tier's combine */
                else cbuf[(t * (tl.k + 1) + slot) * mw.D + j] = cq;
            }
            __syncthreads();
        }
    }
}

/* Launch of the gate/up and down kernels with NC and ND column tiles per
 * block. LS_MOE_TC_BLOCKS: the fewest gate/up blocks worth a launch, two
 * waves of 4 blocks on each of an H200's 132 SMs. */
#define LS_MOE_TC_BLOCKS 1024
template <int NC, int ND>
static ls_status ls_moe_tc_launch(const ls_cuda_moe *mw, const float *x, const ls_moe_tiles &tl,
                                  const float *weights, long W, long tiles, float *mid,
                                  float *gamma, float *cbuf, float *sum, int act, cudaStream_t s,
                                  ls_error *err)
{
    dim3 g1(ls_blocks_for(W, 16 * NC), (unsigned)tiles);
    ls_launch(ls_moe_tc_gate_up_kernel<NC>, g1, LS_MOE_TC_WARPS * LS_WARP, 0, s, *mw, x, tl, W, mid, act);
    LS_CUDA_CHECK_LAUNCH("ls_moe_tc_gate_up_kernel", err);
    LS_TRY(ls_moe_shared_gate(mw, x, tl.T, gamma, act, s, err));
    dim3 g2(ls_blocks_for(mw->D, 16 * ND), (unsigned)tiles);
    ls_launch(ls_moe_tc_down_kernel<ND>, g2, LS_MOE_TC_WARPS * LS_WARP, 0, s, *mw, tl, weights, W, mid, gamma,
              cbuf, sum, act);
    LS_CUDA_CHECK_LAUNCH("ls_moe_tc_down_kernel", err);
    return LS_OK;
}

/* What the tensor-core experts refuse beyond ls_moe_check. */
static ls_status ls_moe_tc_check(const ls_cuda_moe *mw, ls_error *err)
{
    LS_CUDA_REQUIRE(mw->wtype == LS_WTYPE_BF16_ID && (!mw->sh_gate || mw->sh_wtype == LS_WTYPE_BF16_ID),
                    err, "tensor-core tier: the MoE experts must be bf16 (wtype %d, shared %d)",
                    mw->wtype, mw->sh_gate ? mw->sh_wtype : LS_WTYPE_BF16_ID);
    LS_CUDA_REQUIRE(mw->D % 16 == 0 && mw->I % 16 == 0 && (!mw->sh_gate || mw->Is % 16 == 0), err,
                    "tensor-core tier: MoE hidden %ld, expert width %ld and shared width %ld must be "
                    "multiples of 16", mw->D, mw->I, mw->Is);
    LS_CUDA_REQUIRE(mw->tc_layout, err, "tensor-core tier: the expert matrices are not in the tensor-core "
                    "layout (ls_cuda_moe_tc_pack)");
    return LS_OK;
}

/* The slot rows of every pair of the call (ls_moe_slot_rows' on tensor
 * cores): *cbuf_out as ls_moe_combine_kernel reads it; with sum (the fast
 * tier) the routed rows are added to sum [T, D] instead (zeroed first). */
static ls_status ls_moe_tc_slot_rows(const ls_cuda_moe *mw, const float *x, const int32_t *ids,
                                     const float *weights, long k, long T, void *scratch, int act_bf16,
                                     cudaStream_t s, float *sum, float **cbuf_out, ls_error *err)
{
    LS_TRY(ls_moe_tc_check(mw, err));
    LS_CUDA_REQUIRE((uintptr_t)x % 16 == 0 && (uintptr_t)scratch % 16 == 0, err,
                    "tensor-core moe: x and the scratch must be 16-byte aligned");
    long P = T * k;
    /* A one-token call (a decode step of one sequence) takes a tile per
     * pair, which is what grouping gives whenever its k experts are
     * distinct (the router's are), without the count and group launches.
     * A pair's bits do not depend on its tile's other pairs, so they are
     * the grouped call's either way. */
    int single = T == 1;
    long sh_tiles = !mw->sh_gate ? 0 : (T + LS_MOE_TILE - 1) / LS_MOE_TILE;
    long max_tiles = single ? P : (long)ls_moe_max_tiles(mw->E, P);
    long W = (long)ls_moe_width(mw);
    float *mid, *cbuf, *gamma;
    ls_moe_tiles tl;
    LS_TRY(ls_moe_layout(mw, ids, T, k, sh_tiles, max_tiles, single, scratch, s, &tl, &mid, &cbuf, &gamma,
                         err));
    /* Column tiles per block, which change no bit (ls_moe_tc_slice_mma):
     * down 4 (64 outputs), so that a block's weight stream amortises its
     * set-up and epilogue, and gate/up, whose blocks read 4 times as much
     * each, the most of 4, 2, 1 whose grid has at least LS_MOE_TC_BLOCKS
     * blocks by the call's pairs (an upper bound of its tiles), else 1.
     * Measured on the H200 (reports/perf-h200.md run 28), 12 layers of the
     * 80B shape: down 16 -> 64 outputs took the batch-32 step from 10.9 to
     * 9.0 ms and batch 1 from 1.70 to 1.62 ms; gate/up 4 tiles took batch 32
     * to 8.5 ms, and batch 1 (10 pairs) to 1.78 ms. */
    long gu = W / 16 * P;
    if (sum)
        LS_CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(float) * (size_t)(T * mw->D), s), err, "the fast combine's sum");
    if (gu >= 4 * LS_MOE_TC_BLOCKS || P > mw->E)
        LS_TRY((ls_moe_tc_launch<4, 4>(mw, x, tl, weights, W, sh_tiles + max_tiles, mid, gamma, cbuf,
                                       sum, act_bf16, s, err)));
    else if (gu >= 2 * LS_MOE_TC_BLOCKS)
        LS_TRY((ls_moe_tc_launch<2, 4>(mw, x, tl, weights, W, sh_tiles + max_tiles, mid, gamma, cbuf,
                                       sum, act_bf16, s, err)));
    else
        LS_TRY((ls_moe_tc_launch<1, 4>(mw, x, tl, weights, W, sh_tiles + max_tiles, mid, gamma, cbuf,
                                       sum, act_bf16, s, err)));
    *cbuf_out = cbuf;
    return LS_OK;
}

/* The fast tier's combine after the atomic adds: out = act(act(out) + the
 * shared slot) (without a shared expert act(out)), thread per element. */
__global__ void ls_moe_fast_finish_kernel(const float *cbuf, long T, long k, long D, int has_shared, float *out,
                                          int act)
{
    ls_pdl_entry();
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= T * D) return;
    float routed = ls_act_d(out[e], act);
    out[e] = has_shared ? ls_act_d(routed + cbuf[((e / D) * (k + 1) + k) * D + e % D], act) : routed;
}

/* The tensor-core experts and their combine: in top-k order (the tc tier),
 * or by atomic adds as the down products finish (fast, the fast tier). */
static ls_status ls_moe_forward_tc(const ls_cuda_moe *mw, const float *x, const int32_t *ids, const float *weights,
                                   long k, float *out, long T, void *scratch, int act_bf16, int order_experts,
                                   int order_combine, int fast, void *stream, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order_combine, err, "moe (combine)");
    LS_TRY(ls_moe_check(mw, k, order_experts, err));
    if (T <= 0) return LS_OK;
    cudaStream_t s = (cudaStream_t)stream;
    float *cbuf = NULL;
    LS_TRY(ls_moe_tc_slot_rows(mw, x, ids, weights, k, T, scratch, act_bf16, s, fast ? out : NULL, &cbuf, err));
    unsigned blocks = ls_blocks_for(T * mw->D, 256);
    if (fast) {
        ls_launch(ls_moe_fast_finish_kernel, blocks, 256, 0, s, cbuf, T, k, mw->D, mw->sh_gate != NULL, out,
                  act_bf16);
        LS_CUDA_CHECK_LAUNCH("ls_moe_fast_finish_kernel", err);
        return LS_OK;
    }
    ls_launch(ls_moe_combine_kernel, blocks, 256, 0, s, cbuf, ids, weights, mw->E, T, k, mw->D,
              mw->sh_gate != NULL, out, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_moe_combine_kernel", err);
    return LS_OK;
}

extern "C" ls_status ls_cuda_moe_forward_tc(const ls_cuda_moe *mw, const float *x, const int32_t *ids,
                                            const float *weights, long k, float *out, long T,
                                            void *scratch, int act_bf16, int order_experts,
                                            int order_combine, void *stream, ls_error *err)
{
    return ls_moe_forward_tc(mw, x, ids, weights, k, out, T, scratch, act_bf16, order_experts, order_combine, 0,
                             stream, err);
}

extern "C" ls_status ls_cuda_moe_forward_fast(const ls_cuda_moe *mw, const float *x, const int32_t *ids,
                                              const float *weights, long k, float *out, long T, void *scratch,
                                              int act_bf16, int order_experts, int order_combine, void *stream,
                                              ls_error *err)
{
    return ls_moe_forward_tc(mw, x, ids, weights, k, out, T, scratch, act_bf16, order_experts, order_combine, 1,
                             stream, err);
}

/* ---- expert parallelism: slot rows and their combine ----------------------------- */

/* Thread per (pair j, column d) of the pairs whose token is in [t0, t0 + T):
 * c[j] = the slot row the launches above formed for (t, i). */
__global__ void ls_moe_gather_slots_kernel(const float *cbuf, const int32_t *pairs, long n, long t0,
                                           long T, long k, long D, float *c)
{
    ls_pdl_entry();
    long g = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n * D) return;
    long j = g / D, d = g % D, t = pairs[2 * j] - t0, i = pairs[2 * j + 1];
    if (t < 0 || t >= T) return;
    c[g] = cbuf[(t * (k + 1) + i) * D + d];
}

extern "C" ls_status ls_cuda_moe_slots(const ls_cuda_moe *mw, const float *x, const int32_t *ids,
                                       const float *weights, long k, long t0, long T,
                                       const int32_t *pairs, long n, float *c, void *scratch,
                                       int act_bf16, int order_experts, void *stream,
                                       ls_error *err)
{
    LS_TRY(ls_moe_check(mw, k, order_experts, err));
    if (T <= 0 || n <= 0) return LS_OK;
    cudaStream_t s = (cudaStream_t)stream;
    float *cbuf = NULL;
    if (mw->tc_layout)
        LS_TRY(ls_moe_tc_slot_rows(mw, x, ids, weights, k, T, scratch, act_bf16, s, NULL, &cbuf, err));
    else
        LS_TRY(ls_moe_slot_rows(mw, x, ids, weights, k, T, scratch, act_bf16, -1, s, &cbuf, err));
    ls_launch(ls_moe_gather_slots_kernel, ls_blocks_for(n * mw->D, 256), 256, 0, s, cbuf, pairs, n, t0, T, k,
              mw->D, c);
    LS_CUDA_CHECK_LAUNCH("ls_moe_gather_slots_kernel", err);
    return LS_OK;
}

/* Thread per (token, j): ls_cpu_moe_combine's canonical sum over c [T,
 * slots, D] (the k routed slots in top-k order from +0, rounded once, then
 * the shared one added and rounded), as ls_moe_combine_kernel over its own
 * slot rows. */
__global__ void ls_moe_combine_slots_kernel(const float *c, long T, long k, long D, int has_shared,
                                            float *out, int act)
{
    ls_pdl_entry();
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= T * D) return;
    long t = e / D, j = e % D;
    const float *ct = c + t * (k + has_shared) * D; /* [k + has_shared, D] */
    float s = 0.0f;
    for (long i = 0; i < k; i++) s = s + ct[i * D + j];
    float routed = ls_act_d(s, act);
    out[e] = has_shared ? ls_act_d(routed + ct[k * D + j], act) : routed;
}

extern "C" ls_status ls_cuda_moe_combine(const float *c, long k, long D, int has_shared, float *out,
                                         long T, int act_bf16, int order_combine, void *stream,
                                         ls_error *err)
{
    LS_REQUIRE_CANONICAL(order_combine, err, "moe (combine)");
    if (T <= 0) return LS_OK;
    ls_launch(ls_moe_combine_slots_kernel, ls_blocks_for(T * D, 256), 256, 0, (cudaStream_t)stream, c, T, k,
              D, has_shared != 0, out, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_moe_combine_slots_kernel", err);
    return LS_OK;
}
