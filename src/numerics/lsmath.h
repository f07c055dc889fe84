/* lockstep — own fp32 transcendentals (docs/numerics.md rule 4 and §1).
 *
 * Included unchanged by C (CPU reference) and CUDA code; under nvcc the
 * functions are __host__ __device__. They are built only from IEEE fp32
 * +, -, *, /, sqrtf, explicit fmaf (correctly rounded fused multiply-add on
 * both glibc and CUDA), integer bit manipulation and comparisons, so a CPU
 * built with -ffp-contract=off and a GPU built with -fmad=false compute the
 * same bits. No table, no libm call other than fmaf and sqrtf. The
 * polynomial coefficients are Taylor coefficients written as exact rationals
 * rounded once to fp32 by the compiler (see each function).
 *
 * Accuracy, measured by tests/test_lsmath.c against long double expl / logl /
 * log1pl rounded to fp32, over every 61st fp32 bit pattern of the whole
 * domain plus exhaustive windows and edges (ULP = distance in fp32 bit
 * patterns from the correctly rounded result; subnormal results count in
 * subnormal ULPs). Measured, and asserted as the bound:
 *
 *   ls_expf    max 1 ULP, 0.7 % of samples not correctly rounded
 *              (worst at subnormal results, which are rounded twice)
 *   ls_logf    max 1 ULP, 0.6 % not correctly rounded
 *   ls_log1pf  max 1 ULP, 0.4 % not correctly rounded
 *   ls_sigmoidf, ls_siluf  max 2 ULP, ls_softplusf max 1 ULP, against the same
 *              formulas in long double over [-80, 80] (test bound 3 ULP)
 *
 * Special values:
 *   ls_expf:   NaN -> NaN; x > 88.72283f (exp overflows fp32) -> +inf;
 *              +inf -> +inf; -inf -> +0; x < -104 -> +0; results in the
 *              subnormal range are produced (gradual underflow, not flushed).
 *   ls_logf:   NaN -> NaN; x < 0 (incl. -inf) -> NaN; ±0 -> -inf; +inf -> +inf;
 *              subnormal inputs are handled exactly (rescaled by 2^23).
 *   ls_log1pf: NaN -> NaN; x < -1 -> NaN; -1 -> -inf; +inf -> +inf;
 *              ±0 -> ±0 (sign kept); tiny x -> x.
 *   ls_sigmoidf(±inf) = 1 / 0; ls_siluf(-inf) = -inf/inf = NaN and
 *   ls_siluf(x) = -0 for x < -88.7 (exp(-x) overflows), exactly as the formula
 *   x / (1 + exp(-x)) evaluated in fp32 gives; ls_softplusf(NaN) = NaN. */
#ifndef LS_NUMERICS_LSMATH_H
#define LS_NUMERICS_LSMATH_H

#include <math.h> /* fmaf, sqrtf only */
#include <stdint.h>

#include "numerics/reduce.h" /* LS_HD, ls_f32_bits, ls_f32_from_bits */

/* ---- helpers ------------------------------------------------------------------ */

/* 2^k as fp32 for -126 <= k <= 127 (built from exponent bits). */
LS_HD float ls__pow2f(int k)
{
    return ls_f32_from_bits((uint32_t)(k + 127) << 23);
}

/* ln 2 split so that k * LS__LN2_HI is exact for |k| < 2^9: the high part has
 * its 9 lowest significand bits zero. hi + lo = ln 2 to about 2^-45. */
#define LS__LN2_HI 0.693145751953125f           /* 0x3f317200 */
#define LS__LN2_LO 1.428606765330187045e-06f     /* 0x35bfbe8e */
#define LS__LOG2E  1.44269504088896340736f       /* 0x3fb8aa3b */

/* 1.5 * 2^23: adding then subtracting it rounds an fp32 of magnitude < 2^22
 * to the nearest integer (ties to even) in the current rounding mode. */
#define LS__ROUND_MAGIC 12582912.0f

/* ---- exp ---------------------------------------------------------------------- */

/* exp(x). Reduction x = k ln2 + r, |r| <= ~0.347, with k = nearest integer to
 * x log2(e) and r computed with two fmaf against the split ln 2 (the first is
 * exact by Sterbenz-like cancellation, the second adds the low part with one
 * rounding). exp(r) = 1 + r (1 + r/2! + ... + r^6/7!), Horner with fmaf;
 * the truncated r^8/8! term is below 6e-9 relative. The result p * 2^k is
 * formed by two exact-or-once-rounded multiplications by powers of two so that
 * 2^k never has to be represented for k = 128 or k < -126. */
LS_HD float ls_expf(float x)
{
    if (x != x) return x + x;                      /* NaN, quietened */
    if (x > 88.72283172607421875f) return ls_f32_from_bits(0x7f800000u); /* 0x42b17217 */
    if (x < -104.0f) return 0.0f;                  /* below 2^-150: rounds to +0 */
    float t = x * LS__LOG2E + LS__ROUND_MAGIC;
    float kf = t - LS__ROUND_MAGIC;
    int k = (int)kf;                               /* -150 <= k <= 128 */
    float r = fmaf(-kf, LS__LN2_HI, x);
    r = fmaf(-kf, LS__LN2_LO, r);
    float q = 1.0f / 5040.0f;                      /* 1/7! */
    q = fmaf(q, r, 1.0f / 720.0f);                 /* 1/6! */
    q = fmaf(q, r, 1.0f / 120.0f);                 /* 1/5! */
    q = fmaf(q, r, 1.0f / 24.0f);                  /* 1/4! */
    q = fmaf(q, r, 1.0f / 6.0f);                   /* 1/3! */
    q = fmaf(q, r, 0.5f);                          /* 1/2! */
    q = fmaf(q, r, 1.0f);                          /* 1/1! */
    float p = fmaf(q, r, 1.0f);                    /* in [0.70, 1.42] */
    /* k = k1 + k2 with |k1|, |k2| <= 75: p * 2^k1 is exact (normal range), the
     * second product rounds once (into the subnormals when k < -126). */
    int k1 = k / 2;
    int k2 = k - k1;
    return (p * ls__pow2f(k1)) * ls__pow2f(k2);
}

/* ---- log kernel ---------------------------------------------------------------- */

/* e ln2 + log(1 + f) + c for f in [sqrt(1/2) - 1, sqrt(2) - 1] (f exact),
 * e an integer with |e| < 2^9 and c a small correction (|c| << ulp(f)).
 *
 * With s = f / (2 + f), log(1 + f) = 2 atanh(s) = 2s + 2s^3/3 + 2s^5/5 + ...
 * and the identities f = 2s + s f and hf - s f = s hf (hf = f^2 / 2) give
 *   log(1 + f) = f - (hf - s (hf + R)),   R = s^2 (2/3 + 2/5 s^2 + 2/7 s^4 + 2/9 s^6)
 * so the large part f enters exactly and the rounding of s only affects a
 * term about f^2/4 times smaller. |s| <= 0.1716; the first omitted term,
 * 2/11 s^11, is below 1e-9. */
LS_HD float ls__log1p_kernel(float f, float e, float c)
{
    float s = f / (2.0f + f);
    float z = s * s;
    float R = 2.0f / 9.0f;
    R = fmaf(R, z, 2.0f / 7.0f);
    R = fmaf(R, z, 2.0f / 5.0f);
    R = fmaf(R, z, 2.0f / 3.0f);
    R = R * z;
    float hf = 0.5f * f * f;
    float tail = fmaf(s, hf + R, fmaf(e, LS__LN2_LO, c));
    return e * LS__LN2_HI + (f - (hf - tail));
}

/* Splits a positive finite normal fp32 u into 2^e * m with m in
 * [sqrt(1/2), sqrt(2)); returns m - 1 (exact by Sterbenz) and stores e. */
LS_HD float ls__split_log(float u, int *e)
{
    uint32_t b = ls_f32_bits(u);
    int ex = (int)(b >> 23) - 127;
    uint32_t mb = (b & 0x007fffffu) | 0x3f800000u;  /* m in [1, 2) */
    if (mb > 0x3fb504f3u) {                         /* m > sqrt(2): halve it */
        mb -= 0x00800000u;
        ex += 1;
    }
    *e = ex;
    return ls_f32_from_bits(mb) - 1.0f;
}

/* ---- log ---------------------------------------------------------------------- */

LS_HD float ls_logf(float x)
{
    uint32_t b = ls_f32_bits(x);
    if (x != x) return x + x;                                   /* NaN */
    if ((b & 0x7fffffffu) == 0) return ls_f32_from_bits(0xff800000u); /* ±0 -> -inf */
    if (b >> 31) return ls_f32_from_bits(0x7fc00000u);          /* x < 0 -> NaN */
    if (b == 0x7f800000u) return x;                             /* +inf */
    int bias = 0;
    if (b < 0x00800000u) {                                      /* subnormal */
        x = x * 8388608.0f;                                     /* exact: * 2^23 */
        bias = -23;
    }
    int e;
    float f = ls__split_log(x, &e);
    return ls__log1p_kernel(f, (float)(e + bias), 0.0f);
}

/* ---- log1p -------------------------------------------------------------------- */

/* log(1 + x). For 1 + x in [sqrt(1/2), sqrt(2)) the kernel takes x itself
 * (no rounding of 1 + x at all). Elsewhere u = fl(1 + x) and its rounding
 * error err (exact, by the two-sum of the larger operand first) is carried
 * as the correction err / u, the first-order term of log(u + err) - log(u). */
LS_HD float ls_log1pf(float x)
{
    if (x != x) return x + x;                                   /* NaN */
    if (x < -1.0f) return ls_f32_from_bits(0x7fc00000u);        /* NaN */
    if (x == -1.0f) return ls_f32_from_bits(0xff800000u);       /* -inf */
    if (ls_f32_bits(x) == 0x7f800000u) return x;                /* +inf */
    if (x == 0.0f) return x;                                    /* keeps -0 */
    if (x > -0.29289321881f && x < 0.41421356237f)
        return ls__log1p_kernel(x, 0.0f, 0.0f);
    float u = 1.0f + x;
    float err = (x > 1.0f) ? 1.0f - (u - x) : x - (u - 1.0f);
    int e;
    float f = ls__split_log(u, &e);
    return ls__log1p_kernel(f, (float)e, err / u);
}

/* ---- derived functions (docs/numerics.md §1) ---------------------------------- */

/* 1 / (1 + exp(-x)) */
LS_HD float ls_sigmoidf(float x)
{
    return 1.0f / (1.0f + ls_expf(-x));
}

/* x / (1 + exp(-x)) */
LS_HD float ls_siluf(float x)
{
    return x / (1.0f + ls_expf(-x));
}

/* x > 20 ? x : log1p(exp(x))  (PyTorch's default threshold) */
LS_HD float ls_softplusf(float x)
{
    return x > 20.0f ? x : ls_log1pf(ls_expf(x));
}

/* 1 / sqrtf(x), both correctly rounded IEEE operations */
LS_HD float ls_rsqrtf(float x)
{
    return 1.0f / sqrtf(x);
}

#endif
