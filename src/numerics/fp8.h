/* lockstep — FP8 (e4m3fn) block-quantised weights: the element conversions,
 * the per-token-group activation quantiser and the two strict dot products
 * (docs/numerics.md §9, "FP8 block-quantised weights").
 *
 * Included unchanged by C (CPU reference) and CUDA code (LS_HD functions are
 * __host__ __device__ there), so both compute the same bits by construction:
 * every step is an IEEE fp32 operation or exact integer arithmetic; nothing
 * depends on the rounding mode, a libm call or a fused multiply-add.
 *
 * e4m3fn (the "fn" variant of the FP8 releases): sign, 4 exponent bits (bias
 * 7), 3 mantissa bits; no infinities; S.1111.111 is NaN; largest finite
 * ±448 (S.1111.110); subnormals m · 2^-9. Every e4m3 value is exact in fp32,
 * and so is the product of two (at most 8 significant bits, exponents within
 * fp32's normal range). */
#ifndef LS_NUMERICS_FP8_H
#define LS_NUMERICS_FP8_H

#include <stdint.h>

#include "numerics/reduce.h"

#define LS_FP8_BLOCK 128          /* weight block [128, 128]; activation group 128 */
#define LS_FP8_E4M3_MAX 448.0f    /* largest finite e4m3 value */

/* Blocks of 128 along a dimension of n (the last may be shorter). */
#define LS_FP8_BLOCKS(n) (((n) + LS_FP8_BLOCK - 1) / LS_FP8_BLOCK)

/* e4m3fn -> fp32, exact (NaN -> a quiet fp32 NaN of the same sign). The
 * three cases are computed and one selected by bit masks, without a branch,
 * so that a loop of decodes vectorises (the CPU's FP8 dot products). */
LS_HD float ls_e4m3_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t e = (b >> 3) & 15u, m = b & 7u;
    uint32_t bits = sign | ((e + 120u) << 23) | (m << 20);             /* normal */
    /* subnormal m · 2^-9: exact in fp32 (a power-of-two scale) */
    uint32_t sub = ls_f32_bits((float)m * 0.001953125f) | sign, is_sub = 0u - (uint32_t)(e == 0u);
    bits = (sub & is_sub) | (bits & ~is_sub);
    uint32_t is_nan = 0u - (uint32_t)((b & 0x7fu) == 0x7fu);
    bits = ((sign | 0x7fc00000u) & is_nan) | (bits & ~is_nan);
    return ls_f32_from_bits(bits);
}

/* fp32 -> e4m3fn, round to nearest, ties to even, saturating: |x| >= 448
 * (infinities included) gives ±448; NaN gives S.1111.111 (NaN); −0 stays −0.
 * Integer arithmetic and exact fp32 operations only, so the result does not
 * depend on a rounding mode. Every case is computed and the answer selected
 * by masks, without a branch, so that a loop of conversions (the FP8
 * quantiser of synth) vectorises; checked against the format's definition
 * (tests/test_fp8.c) and, once, against the earlier branching form on all
 * 2^32 inputs. */
LS_HD uint8_t ls_f32_to_e4m3(float x)
{
    uint32_t u = ls_f32_bits(x);
    uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    /* normal (|x| >= 2^-6): keep the exponent and 3 mantissa bits; the 20
     * dropped bits round to nearest even by an add that carries into them */
    uint32_t keep = a >> 20;
    uint32_t normal = keep + (((a & 0xfffffu) + 0x7ffffu + (keep & 1u)) >> 20) - (120u << 3); /* rebias 127 -> 7 */
    /* subnormal grid 2^-9 (|x| < 2^-6): v = |x| · 2^9 < 8 is exact, its
     * integer part and remainder too; other inputs are zeroed first so that
     * the conversion stays in range */
    uint32_t is_sub = a < 0x3c800000u, m = 0u - is_sub; /* a mask: all ones when is_sub */
    float v = ls_f32_from_bits(a & m) * 512.0f;
    int32_t whole = (int32_t)v;
    float rem = v - (float)whole;
    uint32_t n = (uint32_t)whole, gt = rem > 0.5f, tie = rem == 0.5f;
    n += gt | (tie & n & 1u);                                      /* n = 8 is 2^-6 = S.0001.000 */
    uint32_t code = (n & m) | (normal & ~m);
    m = 0u - (uint32_t)(a >= 0x43e00000u);                         /* >= 448: saturate */
    code = (0x7eu & m) | (code & ~m);
    m = 0u - (uint32_t)(a > 0x7f800000u);                          /* NaN */
    code = (0x7fu & m) | (code & ~m);
    return (uint8_t)(sign | code);
}

/* fp32 -> the e4m3 value it rounds to (ls_f32_to_e4m3), widened back. */
LS_HD float ls_round_e4m3(float x)
{
    return ls_e4m3_to_f32(ls_f32_to_e4m3(x));
}

/* Dequantised weight element: fp32(q) · scale, one fp32 rounding. */
LS_HD float ls_fp8_dequant(uint8_t q, float scale)
{
    return ls_e4m3_to_f32(q) * scale;
}

/* Quantises one activation group x[0..n) (n <= 128) of a token:
 *   m = max |x_i|;  s = m / 448 (fp32 division);
 *   q_i = e4m3(x_i / s)  (fp32 division, then RNE, saturating)
 * written to q as fp32 values (exact e4m3 values); returns s. A group
 * holding a NaN or an infinity gives s = NaN and every q_i = NaN. A zero
 * group (m = 0), or one whose s underflows to 0 (m < 448 · 2^-150), gives
 * s = 0 and every q_i = +0: the block then contributes +0 · 0. */
LS_HD float ls_fp8_quant_group(const float *x, long n, float *q)
{
    float m = 0.0f;
    int bad = 0;
    for (long i = 0; i < n; i++) {
        float a = ls_f32_from_bits(ls_f32_bits(x[i]) & 0x7fffffffu);
        if (!(a <= 3.40282347e38f)) bad = 1;                       /* NaN or infinity */
        else if (a > m) m = a;
    }
    if (bad) {
        float nan = ls_f32_from_bits(0x7fc00000u);
        for (long i = 0; i < n; i++) q[i] = nan;
        return nan;
    }
    float s = m / LS_FP8_E4M3_MAX;
    if (s == 0.0f) {
        for (long i = 0; i < n; i++) q[i] = 0.0f;
        return 0.0f;
    }
    for (long i = 0; i < n; i++) q[i] = ls_round_e4m3(x[i] / s);
    return s;
}

/* Quantises a token row x[0..n) group by group: q [n], s [LS_FP8_BLOCKS(n)]. */
LS_HD void ls_fp8_quant_row(const float *x, long n, float *q, float *s)
{
    for (long b = 0; b * LS_FP8_BLOCK < n; b++) {
        long k0 = b * LS_FP8_BLOCK;
        long nb = n - k0 < LS_FP8_BLOCK ? n - k0 : LS_FP8_BLOCK;
        s[b] = ls_fp8_quant_group(x + k0, nb, q + k0);
    }
}

/* Dequant mode: LS_DOT32 of the dequantised weight row with x:
 *   w_k = fp32(e4m3(row[k])) · srow[k / 128]   (rounded once)
 *   p[k % 32] += w_k · x_k, then the butterfly (reduce.h).
 * srow is the row's scale row [LS_FP8_BLOCKS(n)]. */
LS_HD float ls_dot32_f8(const uint8_t *row, const float *srow, const float *x, long n)
{
    /* whole rounds of 32 (reduce.h), each inside one 128-wide scale block */
    float p[LS_LANES];
    for (int l = 0; l < LS_LANES; l++) p[l] = 0.0f;
    long k = 0;
    for (; k + LS_LANES <= n; k += LS_LANES) {
        const float s = srow[k / LS_FP8_BLOCK];
        for (int l = 0; l < LS_LANES; l++) p[l] = p[l] + ls_fp8_dequant(row[k + l], s) * x[k + l];
    }
    for (int l = 0; k < n; k++, l++) p[l] = p[l] + ls_fp8_dequant(row[k], srow[k / LS_FP8_BLOCK]) * x[k];
    return ls_tree32(p);
}

/* W8A8 mode: the weight row (e4m3, scale row srow) against a quantised token
 * row (q, its group scales xs):
 *   for each 128-wide K block b (the last may be shorter):
 *     d_b = LS_DOT32 over the block of e4m3(row[k]) · q_k, lane (k − 128b) % 32
 *           (each product exact; lanes start at +0 in every block)
 *     acc = acc + d_b · (xs[b] · srow[b])
 *   blocks in ascending order from acc = +0. */
LS_HD float ls_dot_w8a8(const uint8_t *row, const float *srow, const float *q, const float *xs,
                        long n)
{
    float acc = 0.0f;
    for (long b = 0; b * LS_FP8_BLOCK < n; b++) {
        long k0 = b * LS_FP8_BLOCK;
        long nb = n - k0 < LS_FP8_BLOCK ? n - k0 : LS_FP8_BLOCK;
        float p[LS_LANES];
        for (int l = 0; l < LS_LANES; l++) p[l] = 0.0f;
        long i = 0; /* whole rounds of 32, then the tail (reduce.h) */
        for (; i + LS_LANES <= nb; i += LS_LANES)
            for (int l = 0; l < LS_LANES; l++) p[l] = p[l] + ls_e4m3_to_f32(row[k0 + i + l]) * q[k0 + i + l];
        for (int l = 0; i < nb; i++, l++) p[l] = p[l] + ls_e4m3_to_f32(row[k0 + i]) * q[k0 + i];
        float d = ls_tree32(p);
        float sc = xs[b] * srow[b];
        float part = d * sc;
        acc = acc + part;
    }
    return acc;
}

#endif
