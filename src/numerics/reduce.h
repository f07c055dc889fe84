/* lockstep — canonical reductions and bf16 rounding (numerics contract,
 * docs/numerics.md rules 1–2 and §2).
 *
 * Included unchanged by C (CPU reference) and CUDA code; under nvcc the
 * functions are __host__ __device__. Every dot product, norm and sum in the
 * strict path uses LS_DOT32 order:
 *
 *   p[l] = +0.0f for l = 0..31
 *   for k = 0..n-1:  p[k % 32] = p[k % 32] + a[k] * b[k]   (product rounded, then sum
 *                                                              rounded: no FMA)
 *   for s = 16, 8, 4, 2, 1:  p[l] = p[l] + p[l + s]  for l < s
 *   result p[0]
 *
 * which is a warp with lane l striding over k, followed by the xor-shuffle
 * butterfly (p[l] + p[l^s] equals p[l] + p[l+s] bitwise for l < s, since fp
 * addition is commutative), and 32 independent accumulators on a CPU. */
#ifndef LS_NUMERICS_REDUCE_H
#define LS_NUMERICS_REDUCE_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define LS_HD __host__ __device__ __forceinline__
#else
#define LS_HD static inline
#endif

#define LS_LANES 32

LS_HD uint32_t ls_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

LS_HD float ls_f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* bf16 storage is the upper 16 bits of an fp32. */
LS_HD float ls_bf16_to_f32(uint16_t h)
{
    return ls_f32_from_bits((uint32_t)h << 16);
}

/* fp32 -> bf16, round to nearest, ties to even; NaN stays a quiet NaN. */
LS_HD uint16_t ls_f32_to_bf16(float x)
{
    uint32_t u = ls_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return (uint16_t)(u >> 16);
}

/* Rounds an fp32 value to the nearest bf16 value, returned as fp32. */
LS_HD float ls_round_bf16(float x)
{
    return ls_bf16_to_f32(ls_f32_to_bf16(x));
}

/* Combines 32 lane partials in the canonical butterfly order. */
LS_HD float ls_tree32(float p[LS_LANES])
{
    for (int s = LS_LANES / 2; s >= 1; s >>= 1)
        for (int l = 0; l < s; l++) p[l] = p[l] + p[l + s];
    return p[0];
}

/* The LS_DOT32 functions below take whole rounds of 32 elements first, a
 * fixed-count loop over the 32 independent lanes (what a compiler
 * vectorises), then the tail: lane k % 32 gets its terms in ascending k
 * either way, so the order (and the bits) are the canonical ones. */

/* LS_DOT32 of two fp32 vectors of length n. */
LS_HD float ls_dot32_f32(const float *a, const float *b, long n)
{
    float p[LS_LANES];
    for (int l = 0; l < LS_LANES; l++) p[l] = 0.0f;
    long k = 0;
    for (; k + LS_LANES <= n; k += LS_LANES)
        for (int l = 0; l < LS_LANES; l++) p[l] = p[l] + a[k + l] * b[k + l];
    for (int l = 0; k < n; k++, l++) p[l] = p[l] + a[k] * b[k];
    return ls_tree32(p);
}

/* LS_DOT32 of a bf16 vector (weights as stored) with an fp32 vector. */
LS_HD float ls_dot32_bf16(const uint16_t *a, const float *b, long n)
{
    float p[LS_LANES];
    for (int l = 0; l < LS_LANES; l++) p[l] = 0.0f;
    long k = 0;
    for (; k + LS_LANES <= n; k += LS_LANES)
        for (int l = 0; l < LS_LANES; l++) p[l] = p[l] + ls_bf16_to_f32(a[k + l]) * b[k + l];
    for (int l = 0; k < n; k++, l++) p[l] = p[l] + ls_bf16_to_f32(a[k]) * b[k];
    return ls_tree32(p);
}

/* LS_DOT32 order applied to a plain sum (b[k] = 1 without the multiply). */
LS_HD float ls_sum32(const float *a, long n)
{
    float p[LS_LANES];
    for (int l = 0; l < LS_LANES; l++) p[l] = 0.0f;
    long k = 0;
    for (; k + LS_LANES <= n; k += LS_LANES)
        for (int l = 0; l < LS_LANES; l++) p[l] = p[l] + a[k + l];
    for (int l = 0; k < n; k++, l++) p[l] = p[l] + a[k];
    return ls_tree32(p);
}

#endif
