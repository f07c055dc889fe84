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

#include "numerics/lsmath.h"
#include "numerics/reduce.h"

#define LS_WTYPE_BF16_ID 0 /* = LS_WTYPE_BF16 of backend/cpu_ops.h */
#define LS_WTYPE_F32_ID 1  /* = LS_WTYPE_F32 */

__device__ __forceinline__ float ls_warp_tree(float p)
{
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) {
        float other = __shfl_xor_sync(LS_FULL_MASK, p, s);
        p = p + other;
    }
    return p;
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

/* Exact maximum over the warp: the value of the first maximum in element
 * order, as the CPU's `if (x > m) m = x` scan from -inf finds it (this only
 * matters for the sign of a zero). Each lane passes its own first maximum and
 * that element's index (-1 when it has none). */
__device__ __forceinline__ float ls_warp_max_first(float v, long idx)
{
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) {
        float ov = __shfl_xor_sync(LS_FULL_MASK, v, s);
        long oi = __shfl_xor_sync(LS_FULL_MASK, idx, s);
        if (oi >= 0 && (idx < 0 || ov > v || (!(ov < v) && oi < idx))) {
            v = ov;
            idx = oi;
        }
    }
    return v;
}

/* A lane's first maximum over x[lane], x[lane+32], ... (< n), then the warp's. */
__device__ __forceinline__ float ls_warp_max_of(const float *x, long n)
{
    int lane = (int)(threadIdx.x & 31u);
    float m = -INFINITY;
    long mi = -1;
    for (long e = lane; e < n; e += LS_WARP)
        if (x[e] > m) {
            m = x[e];
            mi = e;
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

__device__ __forceinline__ size_t ls_welem_bytes(int wtype)
{
    return wtype == LS_WTYPE_BF16_ID ? 2 : 4;
}

/* Canonical warp DOT32 of a weight row with an fp32 vector (all lanes get it). */
__device__ __forceinline__ float ls_warp_dot_w(const void *row, int wtype, const float *x, long n)
{
    int lane = (int)(threadIdx.x & 31u);
    float p = 0.0f;
    for (long k = lane; k < n; k += LS_WARP) {
        float prod = ls_wload(row, wtype, k) * x[k];
        p = p + prod;
    }
    return ls_warp_tree(p);
}

/* Canonical warp DOT32 of two fp32 vectors. */
__device__ __forceinline__ float ls_warp_dot(const float *a, const float *b, long n)
{
    int lane = (int)(threadIdx.x & 31u);
    float p = 0.0f;
    for (long k = lane; k < n; k += LS_WARP) {
        float prod = a[k] * b[k];
        p = p + prod;
    }
    return ls_warp_tree(p);
}

/* (a, ia) precedes (b, ib) in the order "value descending, index ascending". */
__device__ __forceinline__ int ls_rank_before(float a, long ia, float b, long ib)
{
    return a > b || (!(a < b) && ia < ib);
}

/* Pick i is the first element, in the order above, after pick i−1: no marks
 * needed, and the picks are ls_cpu_topk's (for values that are not NaN). */
__device__ __forceinline__ void ls_warp_topk_dev(const float *x, long n, long k, int32_t *ids, float *vals)
{
    int lane = (int)(threadIdx.x & 31u);
    float pv = INFINITY;
    long pi = -1;
    for (long i = 0; i < k; i++) {
        float bv = -INFINITY;
        long bi = -1;
        for (long e = lane; e < n; e += LS_WARP) {
            float v = x[e];
            int after_prev = (pi < 0) || ls_rank_before(pv, pi, v, e);
            if (after_prev && (bi < 0 || ls_rank_before(v, e, bv, bi))) {
                bv = v;
                bi = e;
            }
        }
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) {
            float ov = __shfl_xor_sync(LS_FULL_MASK, bv, s);
            long oi = __shfl_xor_sync(LS_FULL_MASK, bi, s);
            if (oi >= 0 && (bi < 0 || ls_rank_before(ov, oi, bv, bi))) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            ids[i] = (int32_t)bi;
            vals[i] = bv;
        }
        pv = bv;
        pi = bi;
    }
}

#define LS_REQUIRE_CANONICAL(order, err, opname)                                          \
    LS_CUDA_REQUIRE((order) == 0, err,                                                    \
                    "cuda portable %s: only the canonical reduction order is implemented " \
                    "(the reversed-order perturbation runs on the cpu backend)", opname)

#define LS_REQUIRE_WTYPE(wtype, err, opname)                                              \
    LS_CUDA_REQUIRE((wtype) == LS_WTYPE_BF16_ID || (wtype) == LS_WTYPE_F32_ID, err,       \
                    "cuda portable %s: weight dtype %d is neither bf16 nor fp32", opname,  \
                    (int)(wtype))

static inline unsigned ls_blocks_for(long n, int per_block)
{
    return (unsigned)((n + per_block - 1) / per_block);
}

#endif
