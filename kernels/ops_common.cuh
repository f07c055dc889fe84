/* lockstep — device helpers shared by the portable strict kernels (internal).
 *
 * ls_warp_tree is the LS_DOT32 butterfly (docs/numerics.md §2): lane l holds
 * the partial of elements k ≡ l (mod 32) accumulated in ascending k; stage s
 * adds p[l ^ s], which for l < s is the canonical p[l] + p[l + s] and for
 * l >= s the same sum with the operands swapped (fp addition is commutative),
 * so after the five stages every lane holds lane 0's canonical value. */
#ifndef LS_KERNELS_OPS_COMMON_CUH
#define LS_KERNELS_OPS_COMMON_CUH

#include "cuda_check.cuh"
#include "launch.cuh"

#include <cuda_pipeline.h>

#include "numerics/fp8.h"
#include "numerics/lsmath.h"
#include "numerics/reduce.h"

#define LS_WTYPE_BF16_ID 0       /* = LS_WTYPE_BF16 of numerics/types.h */
#define LS_WTYPE_F32_ID 1        /* = LS_WTYPE_F32 */
#define LS_WTYPE_F8_DEQUANT_ID 2 /* = LS_WTYPE_F8_DEQUANT: e4m3 + block scales, W = q · s */
#define LS_WTYPE_F8_W8A8_ID 3    /* = LS_WTYPE_F8_W8A8: e4m3 against quantised activations */

__device__ __forceinline__ int ls_wtype_f8(int wtype)
{
    return wtype == LS_WTYPE_F8_DEQUANT_ID || wtype == LS_WTYPE_F8_W8A8_ID;
}

__device__ __forceinline__ float ls_warp_tree(float p)
{
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) {
        float other = __shfl_xor_sync(LS_FULL_MASK, p, s);
        p = p + other;
    }
    return p;
}

/* 32 LS_DOT32 butterflies at once: lane l holds v[i], its lane partial of
 * sum i (i < 32), and gets back sum l. Stage s pairs lanes l and l ^ s as
 * ls_warp_tree does, but each lane keeps only the half of the sums its bit s
 * selects (the partner adds the other half): every add has the operands of
 * the one-sum butterfly at that stage, so each result has its bits, in 31
 * shuffles instead of 160. v is overwritten. */
template <int S>
__device__ __forceinline__ void ls_warp_tree32_stage(float (&v)[32], int lane)
{
    bool hi = (lane & S) != 0;
#pragma unroll
    for (int i = 0; i < S; i++) {
        float send = hi ? v[i] : v[i + S];
        float keep = hi ? v[i + S] : v[i];
        float recv = __shfl_xor_sync(LS_FULL_MASK, send, S);
        v[i] = keep + recv;
    }
}

__device__ __forceinline__ float ls_warp_tree32(float (&v)[32])
{
    int lane = (int)(threadIdx.x & 31u);
    ls_warp_tree32_stage<16>(v, lane);
    ls_warp_tree32_stage<8>(v, lane);
    ls_warp_tree32_stage<4>(v, lane);
    ls_warp_tree32_stage<2>(v, lane);
    ls_warp_tree32_stage<1>(v, lane);
    return v[0];
}

/* N <= 32 LS_DOT32 butterflies: lane l < N gets sum l (ls_warp_tree32's
 * halving for N = 32, one butterfly per sum otherwise). */
template <int N>
__device__ __forceinline__ float ls_warp_tree_n(float (&v)[N])
{
    if constexpr (N == 32) {
        return ls_warp_tree32(v);
    } else {
        int lane = (int)(threadIdx.x & 31u);
        float mine = 0.0f;
#pragma unroll
        for (int i = 0; i < N; i++) {
            float s = ls_warp_tree(v[i]);
            if (lane == i) mine = s;
        }
        return mine;
    }
}

/* The LS_DOT32 tree over 32 partials held by one thread (ls_tree32 order:
 * p[l] = p[l] + p[l + s] for l < s, s = 16 .. 1), bitwise equal to the warp
 * butterfly over the same partials. Stages spelled out so that the array
 * stays in registers. */
#define LS_TREE32_STAGE(p, S)                                   \
    _Pragma("unroll") for (int l_ = 0; l_ < (S); l_++) (p)[l_] = (p)[l_] + (p)[l_ + (S)]
#define LS_TREE32(p)                                            \
    do {                                                        \
        LS_TREE32_STAGE(p, 16);                                 \
        LS_TREE32_STAGE(p, 8);                                  \
        LS_TREE32_STAGE(p, 4);                                  \
        LS_TREE32_STAGE(p, 2);                                  \
        LS_TREE32_STAGE(p, 1);                                  \
    } while (0)

/* (a, ia) precedes (b, ib) in the order "value descending, index ascending". */
__device__ __forceinline__ int ls_rank_before(float a, long ia, float b, long ib)
{
    return a > b || (!(a < b) && ia < ib);
}

/* The same, an empty entry (ib < 0) coming after every other. */
__device__ __forceinline__ int ls_rank_first(float a, long ia, float b, long ib)
{
    return ib < 0 || ls_rank_before(a, ia, b, ib);
}

/* (a, ia) is an entry (ia >= 0) and comes first: a strict total order of
 * the entries, the empty ones last, for values that are not NaN or all NaN
 * (then it is index order). */
__device__ __forceinline__ int ls_rank_lead(float a, long ia, float b, long ib)
{
    return ia >= 0 && ls_rank_first(a, ia, b, ib);
}

/* The warp's first (value, index) in that order; lanes with none pass index
 * -1. I: int or long. */
template <typename I>
__device__ __forceinline__ void ls_warp_best_first(float *bv, I *bi)
{
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) {
        float ov = __shfl_xor_sync(LS_FULL_MASK, *bv, s);
        I oi = __shfl_xor_sync(LS_FULL_MASK, *bi, s);
        if (ls_rank_lead(ov, oi, *bv, *bi)) {
            *bv = ov;
            *bi = oi;
        }
    }
}

/* Exact maximum over the warp: the value of the first maximum in element
 * order, as the CPU's `if (x > m) m = x` scan from -inf finds it (this only
 * matters for the sign of a zero). Each lane passes its own first maximum and
 * that element's index (-1 when it has none). */
__device__ __forceinline__ float ls_warp_max_first(float v, long idx)
{
    ls_warp_best_first(&v, &idx);
    return v;
}

/* A lane's first maximum over x[lane], x[lane+32], ... (< n), then the warp's. */
__device__ __forceinline__ float ls_warp_max_of(const float *x, long n)
{
    int lane = (int)(threadIdx.x & 31u);
    float m = -INFINITY;
    long mi = -1;
    for (long e0 = lane; e0 < n; e0 += LS_WARP * 8) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = e0 + u * LS_WARP < n ? x[e0 + u * LS_WARP] : -INFINITY;
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (v[u] > m) {
                m = v[u];
                mi = e0 + u * LS_WARP;
            }
    }
    return ls_warp_max_first(m, mi);
}

__device__ __forceinline__ float ls_act_d(float x, int act_bf16)
{
    return act_bf16 ? ls_round_bf16(x) : x;
}

/* Element k of a weight row as stored, widened exactly to fp32. */
__device__ __forceinline__ float ls_wload(const void *row, int wtype, long k)
{
    if (wtype == LS_WTYPE_BF16_ID) return ls_bf16_to_f32(((const uint16_t *)row)[k]);
    return ((const float *)row)[k];
}

__host__ __device__ __forceinline__ size_t ls_welem_bytes(int wtype)
{
    return wtype == LS_WTYPE_BF16_ID ? 2 : wtype == LS_WTYPE_F32_ID ? 4 : 1;
}

/* Loads in flight per lane in the warp loops below: element k of lane l is
 * still added in ascending k (k ≡ l mod 32), but LS_PF loads are issued before
 * the first of their adds, so one warp alone is not bound by one memory
 * latency per element. Absent elements are skipped, not added as zeros (that
 * would turn a −0 partial into +0). */
#define LS_PF 8

/* Canonical warp DOT32 of a weight row with an fp32 vector (all lanes get it). */
__device__ __forceinline__ float ls_warp_dot_w(const void *row, int wtype, const float *x, long n)
{
    int lane = (int)(threadIdx.x & 31u);
    float p = 0.0f;
    for (long k0 = lane; k0 < n; k0 += LS_WARP * LS_PF) {
        float wv[LS_PF], xv[LS_PF];
#pragma unroll
        for (int u = 0; u < LS_PF; u++) {
            long k = k0 + (long)u * LS_WARP;
            wv[u] = k < n ? ls_wload(row, wtype, k) : 0.0f;
            xv[u] = k < n ? x[k] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < LS_PF; u++)
            if (k0 + (long)u * LS_WARP < n) {
                float prod = wv[u] * xv[u];
                p = p + prod;
            }
    }
    return ls_warp_tree(p);
}

/* The same DOT32 with one element in flight per lane: the fewest registers,
 * for kernels whose parallelism is many small warps (the decode experts). */
__device__ __forceinline__ float ls_warp_dot_w_lean(const void *row, int wtype, const float *x,
                                                    long n)
{
    int lane = (int)(threadIdx.x & 31u);
    float p = 0.0f;
    for (long k = lane; k < n; k += LS_WARP) {
        float prod = ls_wload(row, wtype, k) * x[k];
        p = p + prod;
    }
    return ls_warp_tree(p);
}

/* Canonical warp DOT32 of two fp32 vectors (a as an fp32 "weight row": the
 * same products and adds). */
__device__ __forceinline__ float ls_warp_dot(const float *a, const float *b, long n)
{
    return ls_warp_dot_w(a, LS_WTYPE_F32_ID, b, n);
}

/* Elementwise pass over i = first, first + stride, ... < n in batches of
 * LS_PF: the NIN inputs of a batch are loaded before any of its outputs is
 * stored (an output may be an input, element by element), so one warp is not
 * bound by a memory latency per element. store(i, v) gets v[j] = in[j][i] and
 * is called in ascending i. */
template <int NIN, typename F>
__device__ __forceinline__ void ls_batched_map(const float *const (&in)[NIN], long first,
                                               long stride, long n, F store)
{
    for (long i0 = first; i0 < n; i0 += stride * LS_PF) {
        float v[LS_PF][NIN];
#pragma unroll
        for (int u = 0; u < LS_PF; u++)
#pragma unroll
            for (int j = 0; j < NIN; j++) {
                long i = i0 + u * stride;
                v[u][j] = i < n ? in[j][i] : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < LS_PF; u++)
            if (i0 + u * stride < n) store(i0 + u * stride, v[u]);
    }
}

/* ---- weight rows against several activation rows, 16-byte loads ------------- */

/* A warp forms, for one weight row w[0..n) and nt <= NT activation rows xs[t],
 * out[t] = DOT32(w, xs[t]) in the canonical order, reading the weights with
 * 16-byte loads: a chunk of 32 x 16 bytes (256 bf16 or 128 fp32 elements) is
 * loaded by lane L as elements per·L .. per·L+per−1, staged through the warp's
 * shared buffer `wsm` (LS_ROWDOT_SMEM(NT) floats, ls_stage_at) as fp32, and
 * lane l then takes the chunk's elements k ≡ l (mod 32) in ascending order,
 * exactly the scalar loop's adds. A group of LS_ROWDOT_CH(NT) chunks — their
 * weights and the activations they meet — is loaded before the first add.
 * The vector path needs a 16-byte aligned row; otherwise, and for the tail
 * after the last whole chunk, elements are read one by one in the same
 * order. Every lane gets every out[t]. NT <= 8: with more tokens the
 * activations held in registers leave room for fewer chunks (one token: 4
 * chunks, 2 KiB of weights per warp in flight). */
#define LS_ROWDOT_CH(NT) ((NT) == 1 ? 4 : (NT) <= 4 ? 2 : 1)
#define LS_ROWDOT_SMEM(NT) (LS_ROWDOT_CH(NT) * LS_STAGE_CHUNK)

/* A staged chunk of up to 256 fp32 values in a warp's shared slot: value k
 * at ls_stage_at(k) = k + k / 32, one padding float per 32. Lanes storing
 * PER consecutive values each (k = PER lane + j, PER 4 or 8) then hit 32
 * different banks, as do lanes reading k = 32 m + lane: without the padding
 * the stores conflict 8 ways (PER 8) or 4 ways (PER 4). */
#define LS_STAGE_CHUNK 264 /* floats of one staged chunk: 256 + 256 / 32 */
__device__ __forceinline__ int ls_stage_at(int k) { return k + (k >> 5); }

/* A group of nc <= CH staged chunks' loads: lane l's 16 or 8 weight bytes
 * raw[c] = src[32 c + l], and the activations they meet, xv[c][m][t] =
 * xs[t][kb + c·chunk + m·32] (kb = the group's first element + l), +0.0 for
 * t >= nt. */
template <int CH, int PER, int NT, typename R>
__device__ __forceinline__ void ls_stage_load(R (&raw)[CH], const R *src, float (&xv)[CH][PER][NT],
                                              const float *const *xs, long kb, long chunk, int nc, int nt, int lane)
{
#pragma unroll
    for (int c = 0; c < CH; c++)
        if (c < nc) {
            raw[c] = src[(long)c * LS_WARP + lane];
#pragma unroll
            for (int m = 0; m < PER; m++)
#pragma unroll
                for (int t = 0; t < NT; t++) xv[c][m][t] = t < nt ? xs[t][kb + c * chunk + m * LS_WARP] : 0.0f;
        }
}

/* Lane l's adds over a group of nc staged chunks: p[t] += w · x for the
 * chunk's elements k ≡ l (mod 32), ascending (product, then add). */
template <int CH, int PER, int NT>
__device__ __forceinline__ void ls_stage_add(float (&p)[NT], const float *wsm, const float (&xv)[CH][PER][NT],
                                             int nc, int nt, int lane)
{
#pragma unroll
    for (int c = 0; c < CH; c++) {
        if (c < nc) {
#pragma unroll
            for (int m = 0; m < PER; m++) {
                float w = wsm[c * LS_STAGE_CHUNK + ls_stage_at(m * LS_WARP + lane)];
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if (t < nt) {
                        float prod = w * xv[c][m][t];
                        p[t] = p[t] + prod;
                    }
            }
        }
    }
}

/* The elements from k_done on, one by one in the same order (lane l takes
 * k ≡ l mod 32, ascending), weight element k from wk(k); then every lane gets
 * out[t], the warp's tree of p[t]. */
template <int NT, typename WK>
__device__ __forceinline__ void ls_rowdot_finish(float (&p)[NT], long k_done, long n, const float *const *xs,
                                                 int nt, int lane, WK wk, float *out)
{
    for (long k = k_done + lane; k < n; k += LS_WARP) {
        float w = wk(k);
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < nt) {
                float prod = w * xs[t][k];
                p[t] = p[t] + prod;
            }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) out[t] = ls_warp_tree(p[t]);
}

template <int NT, int BF16>
__device__ __forceinline__ void ls_warp_rowdot_t(const void *row, long n, const float *const *xs,
                                                 int nt, float *wsm, float *out)
{
    constexpr int CH = LS_ROWDOT_CH(NT);
    constexpr int PER = BF16 ? 8 : 4; /* elements per 16 bytes */
    constexpr int ESZ = BF16 ? 2 : 4;
    const long chunk = (long)PER * LS_WARP;
    int lane = (int)(threadIdx.x & 31u);
    float p[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) p[t] = 0.0f;
    long whole = ((uintptr_t)row & 15u) == 0 ? n / chunk : 0;
    long k_done = 0;
    for (long c0 = 0; c0 < whole; c0 += CH) {
        int nc = whole - c0 < CH ? (int)(whole - c0) : CH;
        uint4 raw[CH];
        float xv[CH][PER][NT];
        ls_stage_load(raw, (const uint4 *)((const uint8_t *)row + (size_t)c0 * chunk * ESZ), xv, xs,
                      c0 * chunk + lane, chunk, nc, nt, lane);
        __syncwarp();
#pragma unroll
        for (int c = 0; c < CH; c++) {
            if (c < nc) {
                float *dst = wsm + c * LS_STAGE_CHUNK + ls_stage_at(lane * PER);
                uint32_t u[4] = {raw[c].x, raw[c].y, raw[c].z, raw[c].w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (BF16) {
                        dst[2 * i] = ls_bf16_to_f32((uint16_t)(u[i] & 0xffffu));
                        dst[2 * i + 1] = ls_bf16_to_f32((uint16_t)(u[i] >> 16));
                    } else {
                        dst[i] = ls_f32_from_bits(u[i]);
                    }
                }
            }
        }
        __syncwarp();
        ls_stage_add(p, wsm, xv, nc, nt, lane);
        k_done = (c0 + nc) * chunk;
    }
    ls_rowdot_finish(
        p, k_done, n, xs, nt, lane,
        [row](long k) { return BF16 ? ls_bf16_to_f32(((const uint16_t *)row)[k]) : ((const float *)row)[k]; }, out);
}

template <int NT>
__device__ __forceinline__ void ls_warp_rowdot(const void *row, int wtype, long n,
                                               const float *const *xs, int nt, float *wsm,
                                               float *out)
{
    if (wtype == LS_WTYPE_BF16_ID) ls_warp_rowdot_t<NT, 1>(row, n, xs, nt, wsm, out);
    else ls_warp_rowdot_t<NT, 0>(row, n, xs, nt, wsm, out);
}

/* ---- one token, whole bf16 rows in registers ---------------------------------------- */

/* A bf16 row of 256 CH elements (16-byte aligned) into a warp's registers:
 * lane L holds elements 8L .. 8L+7 of each 256-element chunk c in raw[c]. */
template <int CH>
__device__ __forceinline__ void ls_row1_load(uint4 (&raw)[CH], const void *row, int lane)
{
    const uint4 *src = (const uint4 *)row;
#pragma unroll
    for (int c = 0; c < CH; c++) raw[c] = src[c * LS_WARP + lane];
}

/* DOT32 of that row with the fp32 activations xs [256 CH] (shared memory),
 * in ls_warp_rowdot_t's order: each chunk staged through the warp's shared
 * slot (LS_STAGE_CHUNK floats, ls_stage_at) as fp32, lane l adding the
 * chunk's elements k ≡ l (mod 32) in ascending k (product, then add), then
 * ls_warp_tree. Every lane gets the sum. */
template <int CH>
__device__ __forceinline__ float ls_row1_dot(const uint4 (&raw)[CH], float *slot, const float *xs, int lane)
{
    float p = 0.0f;
#pragma unroll
    for (int c = 0; c < CH; c++) {
        uint32_t u[4] = {raw[c].x, raw[c].y, raw[c].z, raw[c].w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            slot[ls_stage_at(lane * 8) + 2 * i] = ls_bf16_to_f32((uint16_t)(u[i] & 0xffffu));
            slot[ls_stage_at(lane * 8) + 2 * i + 1] = ls_bf16_to_f32((uint16_t)(u[i] >> 16));
        }
        __syncwarp();
#pragma unroll
        for (int m = 0; m < 8; m++) {
            float prod = slot[ls_stage_at(m * LS_WARP + lane)] * xs[c * 256 + m * LS_WARP + lane];
            p = p + prod;
        }
        __syncwarp();
    }
    return ls_warp_tree(p);
}

/* ---- tiles: weight rows x activation rows through shared memory ---------------- */

/* A block of LS_TILE_WARPS warps forms the DOT32s of NROWS = 4 RW weight rows
 * (warp w: rows RW w .. RW w + RW − 1) with NT activation rows, all of
 * length n. Chunks of 32 · PER elements (PER = 16 / EB: 16 bytes of a weight
 * row per lane) of every row, as stored, and of the activations are copied
 * into shared memory with cp.async, LS_TILE_STAGES chunks in flight; lane l
 * then adds, for each of its (row, activation) pairs, the chunk's elements
 * k ≡ l (mod 32) in ascending k — the scalar loop's adds — into p[r NT + t].
 * A value read from shared memory meets RW rows (an activation) or NT
 * activations (a weight). Whole chunks need every row and activation
 * 16-byte aligned (the block agrees by a barrier vote); otherwise, and after
 * the last whole chunk, the elements are read one by one from global memory
 * in the same order. row(r) and xrow(t) give the rows (the caller repeats a
 * valid row for slots it does not store); smem holds LS_TILE_SMEM(EB, RW, NT)
 * bytes, free again when the call returns (it ends with a barrier).
 * ls_warp_tree_n over p then gives the canonical DOT32s. */
#define LS_TILE_WARPS 4
#define LS_TILE_STAGES 3
#define LS_TILE_SMEM(EB, RW, NT) \
    (LS_TILE_STAGES * (LS_TILE_WARPS * (RW) * 512 + (NT) * (16 / (EB)) * LS_WARP * 4))

/* One element of each lane's stride: p[r NT + t] += w[r] · x[t] (product, then add). */
template <int RW, int NT>
__device__ __forceinline__ void ls_tile_add(const float (&w)[RW], const float (&x)[NT],
                                            float (&p)[RW * NT])
{
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float prod = w[r] * x[t];
            p[r * NT + t] = p[r * NT + t] + prod;
        }
}

template <int EB, int RW, int NT, typename RowF, typename XF>
__device__ __forceinline__ void ls_tile_dots(uint8_t *smem, long n, RowF row, XF xrow,
                                             float (&p)[RW * NT])
{
    constexpr int PER = 16 / EB, CHK = PER * LS_WARP, WB = CHK * EB, NTH = LS_TILE_WARPS * LS_WARP;
    constexpr int NROWS = LS_TILE_WARPS * RW, XB = CHK * 4;
    constexpr int WC = NROWS * WB / 16, XC = NT * XB / 16; /* 16-byte copies per chunk */
    constexpr int WPT = (WC + NTH - 1) / NTH, XPT = (XC + NTH - 1) / NTH;
    constexpr int WT = EB == 2 ? LS_WTYPE_BF16_ID : LS_WTYPE_F32_ID;
    constexpr size_t WSTAGE = (size_t)NROWS * WB, XSTAGE = (size_t)NT * XB;
    uint8_t *wsm = smem, *xsm = smem + LS_TILE_STAGES * WSTAGE;
    int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
#pragma unroll
    for (int i = 0; i < RW * NT; i++) p[i] = 0.0f;
    /* this thread's copy sources at chunk 0: copy q = tid + i NTH */
    const uint8_t *wsrc[WPT];
    const uint8_t *xsrc[XPT];
    int ok = 1;
#pragma unroll
    for (int i = 0; i < WPT; i++) {
        int q = tid + i * NTH;
        wsrc[i] = q < WC ? (const uint8_t *)row(q / (WB / 16)) + (q % (WB / 16)) * 16 : NULL;
        ok &= ((uintptr_t)wsrc[i] & 15u) == 0;
    }
#pragma unroll
    for (int i = 0; i < XPT; i++) {
        int q = tid + i * NTH;
        xsrc[i] = q < XC ? (const uint8_t *)xrow(q / (XB / 16)) + (q % (XB / 16)) * 16 : NULL;
        ok &= ((uintptr_t)xsrc[i] & 15u) == 0;
    }
    ok &= (((size_t)n * EB) & 15u) == 0 && ((size_t)n & 3u) == 0;
    long whole = __syncthreads_and(ok) ? n / CHK : 0;
    auto issue = [&](long c) {
        if (c < whole) {
            size_t b = (size_t)(c % LS_TILE_STAGES);
#pragma unroll
            for (int i = 0; i < WPT; i++) {
                int q = tid + i * NTH;
                if (q < WC) __pipeline_memcpy_async(wsm + b * WSTAGE + (size_t)q * 16, wsrc[i] + (size_t)c * WB, 16);
            }
#pragma unroll
            for (int i = 0; i < XPT; i++) {
                int q = tid + i * NTH;
                if (q < XC) __pipeline_memcpy_async(xsm + b * XSTAGE + (size_t)q * 16, xsrc[i] + (size_t)c * XB, 16);
            }
        }
        __pipeline_commit(); /* an empty group past the last chunk keeps the count */
    };
#pragma unroll
    for (int c = 0; c < LS_TILE_STAGES - 1; c++) issue(c);
    for (long c = 0; c < whole; c++) {
        __pipeline_wait_prior(LS_TILE_STAGES - 2); /* this thread's copies of chunk c are in */
        __syncthreads(); /* everyone's, and chunk c - 1's adds are done: its buffer is free */
        issue(c + LS_TILE_STAGES - 1);
        size_t b = (size_t)(c % LS_TILE_STAGES);
        const uint8_t *wb = wsm + b * WSTAGE + (size_t)warp * RW * WB;
        const float *xb = (const float *)(xsm + b * XSTAGE);
#pragma unroll
        for (int m = 0; m < PER; m++) {
            float wv[RW], xv[NT];
#pragma unroll
            for (int r = 0; r < RW; r++)
                wv[r] = ls_wload(wb + r * WB, WT, m * LS_WARP + lane);
#pragma unroll
            for (int t = 0; t < NT; t++) xv[t] = xb[t * CHK + m * LS_WARP + lane];
            ls_tile_add<RW, NT>(wv, xv, p);
        }
    }
    /* the rest, element by element */
    const void *mine[RW];
    const float *xs[NT];
#pragma unroll
    for (int r = 0; r < RW; r++) mine[r] = row(warp * RW + r);
#pragma unroll
    for (int t = 0; t < NT; t++) xs[t] = (const float *)xrow(t);
    for (long k = whole * CHK + lane; k < n; k += LS_WARP) {
        float wv[RW], xv[NT];
#pragma unroll
        for (int r = 0; r < RW; r++) wv[r] = ls_wload(mine[r], WT, k);
#pragma unroll
        for (int t = 0; t < NT; t++) xv[t] = xs[t][k];
        ls_tile_add<RW, NT>(wv, xv, p);
    }
    __syncthreads(); /* smem free for the caller's next call */
}

/* ---- the DOT32 by a lane group: 16-byte loads, no shared memory --------------- */

/* The canonical DOT32 (docs/numerics.md §2) of R weight rows against one
 * activation row x, formed by G = 32 / PER consecutive lanes instead of a
 * warp; PER = 16 / EB elements fill one 16-byte load (EB the element bytes:
 * 2 bf16, 4 fp32). Thread a of the group keeps the partials of lanes PER·a ..
 * PER·a + PER − 1: its j-th load of a row is elements 32j + PER·a .. 32j +
 * PER·a + PER − 1, one for each of its lanes, so every partial still adds its
 * products in ascending k from +0. The tree then pairs the same partials as
 * the warp butterfly (ls_warp_tree): a stage s >= PER pairs lanes of two
 * threads (a shuffle with thread a ^ s / PER of the group), a stage s < PER
 * lanes of one thread (p[m] + p[m + s], LS_TREE32's order), so the bits are
 * those of ls_warp_tree; every thread of the group gets out[r]. U loads per
 * row, of R rows at once, are in flight before their adds. A row that is not
 * 16-byte aligned, and a load that would cross n, go element by element
 * (absent elements skipped, not added as zeros); xvec: x is 16-byte aligned
 * (its PER values then come in whole float4 loads). */

/* One load's products: p[r][m] += w[r][m] · x[k0 + m] for m < lim, in
 * ascending m (lim = PER: a whole load). */
template <int R, int PER>
__device__ __forceinline__ void ls_gdot_add(const float (&w)[R][PER], const float *x, long k0,
                                            int lim, int xvec, float (&p)[R][PER])
{
    float xv[PER];
    if (xvec && lim == PER) {
#pragma unroll
        for (int i = 0; i < PER / 4; i++) {
            float4 f = __ldg((const float4 *)(x + k0) + i);
            xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int m = 0; m < PER; m++) xv[m] = m < lim ? x[k0 + m] : 0.0f;
    }
#pragma unroll
    for (int m = 0; m < PER; m++)
        if (m < lim)
#pragma unroll
            for (int r = 0; r < R; r++) {
                float prod = w[r][m] * xv[m];
                p[r][m] = p[r][m] + prod;
            }
}

template <int EB, int R, int U>
__device__ __forceinline__ void ls_group_rowdot(const void *const *rows, long n, const float *x,
                                                int xvec, float *out)
{
    constexpr int PER = 16 / EB, G = 32 / PER, WT = EB == 2 ? LS_WTYPE_BF16_ID : LS_WTYPE_F32_ID;
    int lane = (int)(threadIdx.x & 31u), a = lane % G;
    unsigned gmask = (G == 32 ? 0xffffffffu : ((1u << G) - 1u)) << (lane - a);
    float p[R][PER];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < PER; m++) p[r][m] = 0.0f;
    int wvec = 1;
#pragma unroll
    for (int r = 0; r < R; r++) wvec &= ((uintptr_t)rows[r] & 15u) == 0;
    /* loads j < jf are whole for every thread: 16-byte loads, U in flight */
    long jf = wvec ? n / LS_WARP : 0, nj = (n + LS_WARP - 1) / LS_WARP;
    for (long j0 = 0; j0 < jf; j0 += U) {
        uint4 raw[U][R];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (j0 + u < jf)
#pragma unroll
                for (int r = 0; r < R; r++)
                    raw[u][r] = __ldg((const uint4 *)((const uint8_t *)rows[r] +
                                                      (size_t)((j0 + u) * LS_WARP + PER * a) * EB));
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (j0 + u >= jf) continue;
            float w[R][PER];
#pragma unroll
            for (int r = 0; r < R; r++) {
                uint32_t v[4] = {raw[u][r].x, raw[u][r].y, raw[u][r].z, raw[u][r].w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (EB == 2) {
                        w[r][2 * i] = ls_bf16_to_f32((uint16_t)(v[i] & 0xffffu));
                        w[r][2 * i + 1] = ls_bf16_to_f32((uint16_t)(v[i] >> 16));
                    } else {
                        w[r][i] = ls_f32_from_bits(v[i]);
                    }
                }
            }
            ls_gdot_add<R, PER>(w, x, (j0 + u) * LS_WARP + PER * a, PER, xvec, p);
        }
    }
    /* the rest (a partial last load, or a row not 16-byte aligned): element by element */
#pragma unroll 1
    for (long j = jf; j < nj; j++) {
        long k0 = j * LS_WARP + PER * a;
        int lim = n - k0 < PER ? (int)(n - k0) : PER;
        if (lim <= 0) continue;
        float w[R][PER];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < PER; m++) w[r][m] = m < lim ? ls_wload(rows[r], WT, k0 + m) : 0.0f;
        ls_gdot_add<R, PER>(w, x, k0, lim, 0, p);
    }
#pragma unroll
    for (int s = 16; s >= PER; s >>= 1)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < PER; m++) {
                float other = __shfl_xor_sync(gmask, p[r][m], s / PER);
                p[r][m] = p[r][m] + other;
            }
#pragma unroll
    for (int s = PER / 2; s >= 1; s >>= 1)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < s; m++) p[r][m] = p[r][m] + p[r][m + s];
#pragma unroll
    for (int r = 0; r < R; r++) out[r] = p[r][0];
}

/* ---- FP8 block-quantised rows (docs/numerics.md §9, numerics/fp8.h) ------------ */

/* Dequant mode, ls_warp_rowdot_t with e4m3 weights: the same chunks of 256
 * elements (8 bytes per lane, one 8-byte load), staged in `wsm` as the
 * dequantised fp32 values ls_fp8_dequant(q, srow[k / 128]) — lane L's eight
 * elements 8L .. 8L+7 of a chunk lie in one 128-block, since 128 is a multiple
 * of 8 — and then added in the canonical order: lane l takes the chunk's
 * elements k ≡ l (mod 32) ascending, exactly ls_dot32_f8's products and adds.
 * Rows not 8-byte aligned, and the tail, go element by element in that order. */
template <int NT>
__device__ __forceinline__ void ls_warp_rowdot_f8(const uint8_t *row, const float *srow, long n,
                                                  const float *const *xs, int nt, float *wsm,
                                                  float *out)
{
    constexpr int CH = LS_ROWDOT_CH(NT);
    constexpr int PER = 8;
    const long chunk = (long)PER * LS_WARP; /* 256 elements, 256 bytes */
    int lane = (int)(threadIdx.x & 31u);
    float p[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) p[t] = 0.0f;
    long whole = ((uintptr_t)row & 7u) == 0 ? n / chunk : 0;
    long k_done = 0;
    for (long c0 = 0; c0 < whole; c0 += CH) {
        int nc = whole - c0 < CH ? (int)(whole - c0) : CH;
        uint2 raw[CH];
        float xv[CH][PER][NT];
        ls_stage_load(raw, (const uint2 *)(row + (size_t)c0 * chunk), xv, xs, c0 * chunk + lane, chunk, nc, nt,
                      lane);
        __syncwarp();
#pragma unroll
        for (int c = 0; c < CH; c++) {
            if (c < nc) {
                float *dst = wsm + c * LS_STAGE_CHUNK + ls_stage_at(lane * PER);
                float sc = srow[((c0 + c) * chunk + (long)lane * PER) / LS_FP8_BLOCK];
                uint32_t u[2] = {raw[c].x, raw[c].y};
#pragma unroll
                for (int i = 0; i < PER; i++)
                    dst[i] = ls_fp8_dequant((uint8_t)(u[i / 4] >> (8 * (i % 4))), sc);
            }
        }
        __syncwarp();
        ls_stage_add(p, wsm, xv, nc, nt, lane);
        k_done = (c0 + nc) * chunk;
    }
    ls_rowdot_finish(
        p, k_done, n, xs, nt, lane, [row, srow](long k) { return ls_fp8_dequant(row[k], srow[k / LS_FP8_BLOCK]); },
        out);
}

/* W8A8 mode (ls_dot_w8a8): for nt <= NT token rows quantised by
 * ls_fp8_quant_row (qs[t] the e4m3 values as fp32, ss[t] the group scales),
 * per 128-wide block b: lane l adds e4m3(w[k]) · q[k] for k = 128b + l + 32j
 * (j = 0..3, ascending, only k < n), the warp butterfly gives d_b in every
 * lane, and every lane adds d_b · (ss[t][b] · srow[b]) to its accumulator in
 * block order: the CPU's operations in the CPU's order. The block's four
 * weight bytes per lane are loaded before the first add. */
template <int NT>
__device__ __forceinline__ void ls_warp_dot_w8a8(const uint8_t *row, const float *srow, long n,
                                                 const float *const *qs, const float *const *ss,
                                                 int nt, float *out)
{
    int lane = (int)(threadIdx.x & 31u);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (long b = 0; b * LS_FP8_BLOCK < n; b++) {
        long k0 = b * LS_FP8_BLOCK + lane;
        float w[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            long k = k0 + j * LS_WARP;
            w[j] = k < n ? ls_e4m3_to_f32(row[k]) : 0.0f;
        }
        float sw = srow[b];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) continue;
            float p = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                long k = k0 + j * LS_WARP;
                if (k < n) {
                    float prod = w[j] * qs[t][k];
                    p = p + prod;
                }
            }
            float d = ls_warp_tree(p);
            float sc = ss[t][b] * sw;
            float part = d * sc;
            acc[t] = acc[t] + part;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) out[t] = acc[t];
}

/* One weight row of any weight type against nt <= NT activation rows: bf16
 * and fp32 through ls_warp_rowdot; FP8 dequant with its scale row srow; FP8
 * w8a8 with xs the quantised rows and ss their group scales (unused
 * otherwise). Every lane gets every out[t]. */
template <int NT>
__device__ __forceinline__ void ls_warp_rowdot_any(const void *row, const float *srow, int wtype,
                                                   long n, const float *const *xs,
                                                   const float *const *ss, int nt, float *wsm,
                                                   float *out)
{
    if (wtype == LS_WTYPE_F8_W8A8_ID)
        ls_warp_dot_w8a8<NT>((const uint8_t *)row, srow, n, xs, ss, nt, out);
    else if (wtype == LS_WTYPE_F8_DEQUANT_ID)
        ls_warp_rowdot_f8<NT>((const uint8_t *)row, srow, n, xs, nt, wsm, out);
    else
        ls_warp_rowdot<NT>(row, wtype, n, xs, nt, wsm, out);
}

/* The lean (one element in flight) DOT32 of ls_warp_dot_w_lean for any
 * weight type: FP8 dequant element by element, w8a8 as ls_warp_dot_w8a8. */
__device__ __forceinline__ float ls_warp_dot_any_lean(const void *row, const float *srow, int wtype,
                                                      const float *x, const float *xsc, long n)
{
    if (wtype == LS_WTYPE_F8_W8A8_ID) {
        float r;
        ls_warp_dot_w8a8<1>((const uint8_t *)row, srow, n, &x, &xsc, 1, &r);
        return r;
    }
    if (wtype != LS_WTYPE_F8_DEQUANT_ID) return ls_warp_dot_w_lean(row, wtype, x, n);
    int lane = (int)(threadIdx.x & 31u);
    const uint8_t *r8 = (const uint8_t *)row;
    float p = 0.0f;
    for (long k = lane; k < n; k += LS_WARP) {
        float prod = ls_fp8_dequant(r8[k], srow[k / LS_FP8_BLOCK]) * x[k];
        p = p + prod;
    }
    return ls_warp_tree(p);
}

/* (v, e) becomes the lane's candidate (*bv, *bi) when it comes after the
 * previous pick (pv, pi) (none yet: pi < 0) and before the candidate. */
__device__ __forceinline__ void ls_topk_offer(float v, long e, float pv, long pi, float *bv,
                                              long *bi)
{
    if ((pi < 0 || ls_rank_before(pv, pi, v, e)) && (*bi < 0 || ls_rank_before(v, e, *bv, *bi))) {
        *bv = v;
        *bi = e;
    }
}

/* Pick i is the first element, in the order above, after pick i−1: no marks
 * needed, and the picks are ls_cpu_topk's (for values that are not NaN).
 * offer_all(pv, pi, &bv, &bi) passes each of the lane's elements to
 * ls_topk_offer; lane 0 writes the picks. */
template <typename F>
__device__ __forceinline__ void ls_warp_topk_by(long k, int32_t *ids, float *vals, F offer_all)
{
    float pv = INFINITY;
    long pi = -1;
    for (long i = 0; i < k; i++) {
        float bv = -INFINITY;
        long bi = -1;
        offer_all(pv, pi, &bv, &bi);
        ls_warp_best_first(&bv, &bi);
        if ((threadIdx.x & 31u) == 0) {
            ids[i] = (int32_t)bi;
            vals[i] = bv;
        }
        pv = bv;
        pi = bi;
    }
}

/* The top k of x[0..n) (lane l: elements l, l+32, ...). */
__device__ __forceinline__ void ls_warp_topk_dev(const float *x, long n, long k, int32_t *ids, float *vals)
{
    int lane = (int)(threadIdx.x & 31u);
    ls_warp_topk_by(k, ids, vals, [&](float pv, long pi, float *bv, long *bi) {
        for (long e = lane; e < n; e += LS_WARP) ls_topk_offer(x[e], e, pv, pi, bv, bi);
    });
}

/* Per-launch table of the sequences of a batched mixer launch (conv, GDN),
 * passed by value (no device upload): sequence s's rows of the packed
 * activations and its own carried state. */
typedef struct ls_cuda_seqs {
    long row0[LS_CUDA_SEQ_CHUNK];
    long len[LS_CUDA_SEQ_CHUNK];
    float *state[LS_CUDA_SEQ_CHUNK];
} ls_cuda_seqs;

/* Fills sq with sequences s0 .. s0+n-1; returns the longest length. */
static inline long ls_cuda_seqs_fill(ls_cuda_seqs *sq, float *const *states, const long *row0,
                                     const long *len, long s0, long n)
{
    long maxlen = 0;
    memset(sq, 0, sizeof *sq);
    for (long s = 0; s < n; s++) {
        sq->row0[s] = row0[s0 + s];
        sq->len[s] = len[s0 + s];
        sq->state[s] = states[s0 + s];
        if (sq->len[s] > maxlen) maxlen = sq->len[s];
    }
    return maxlen;
}

#define LS_REQUIRE_CANONICAL(order, err, opname)                                          \
    LS_CUDA_REQUIRE((order) == 0, err,                                                    \
                    "cuda portable %s: only the canonical reduction order is implemented " \
                    "(the reversed-order perturbation runs on the cpu backend; fast twins: attention, " \
                    "gdn, combine)", opname)

#define LS_REQUIRE_WTYPE(wtype, err, opname)                                              \
    LS_CUDA_REQUIRE((wtype) == LS_WTYPE_BF16_ID || (wtype) == LS_WTYPE_F32_ID, err,       \
                    "cuda portable %s: weight dtype %d is neither bf16 nor fp32", opname,  \
                    (int)(wtype))

/* bf16, fp32 or one of the FP8 types (linear, the MoE's experts). */
#define LS_REQUIRE_WTYPE_ANY(wtype, err, opname)                                          \
    LS_CUDA_REQUIRE((wtype) >= LS_WTYPE_BF16_ID && (wtype) <= LS_WTYPE_F8_W8A8_ID, err,   \
                    "cuda portable %s: weight dtype %d is not bf16, fp32 or e4m3", opname, \
                    (int)(wtype))

/* The SM count of the first device asked (132 when it cannot be read), kept
 * for the process (kernels/ops_dense.cu). It sizes grids only where the
 * bits do not depend on them (or, in the fast tier, where they may). */
int ls_sm_count(void);

static inline unsigned ls_blocks_for(long n, int per_block)
{
    return (unsigned)((n + per_block - 1) / per_block);
}

#endif
