/* lockstep — synth: the counter-based generator, deterministic elementary
 * functions, the tensor list of a Qwen3-Next or Qwen3.5 checkpoint and its initialisers
 * (docs/synth.md says why each scale is what it is). */
#include <math.h> /* HUGE_VAL and NAN only: no libm function is called */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/isa.h"
#include "numerics/fp8.h"
#include "numerics/reduce.h"
#include "synth/synth.h"
#include "synth/synth_internal.h"

/* ---- counter-based generator ------------------------------------------------ */

#define GOLDEN_GAMMA 0x9E3779B97F4A7C15ull

/* splitmix64 finaliser (Stafford's "mix13" variant). */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        h ^= *c;
        h *= 0x100000001B3ull;
    }
    return h;
}

uint64_t ls_synth_key(uint64_t seed, const char *name)
{
    return mix64(mix64(seed) ^ fnv1a64(name));
}

/* Inline for the fill loops below, which run them once per element of every
 * generated weight; exported through the functions after them. */
static inline uint64_t draw(uint64_t key, uint64_t index)
{
    return mix64(key + (index + 1) * GOLDEN_GAMMA);
}

static inline int32_t irwin_hall(uint64_t x)
{
    int32_t s = (int32_t)(x & 0xffff) + (int32_t)((x >> 16) & 0xffff) +
                (int32_t)((x >> 32) & 0xffff) + (int32_t)(x >> 48);
    return 2 * s - 4 * 65535;
}

uint64_t ls_synth_draw(uint64_t key, uint64_t index)
{
    return draw(key, index);
}

int32_t ls_synth_irwin_hall(uint64_t x)
{
    return irwin_hall(x);
}

/* Uniform in [0, 1): the top 53 bits of a draw, exact in double. */
static double uniform53(uint64_t x)
{
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- elementary functions from IEEE basic operations ----------------------
 * +, -, *, / and conversions are correctly rounded on every IEEE machine and
 * the build forbids contraction into FMA, so a fixed sequence of them gives
 * the same bits everywhere. libm's log/exp/cos are not correctly rounded and
 * differ between implementations, so synth never calls them. */

#define LN2_D 0.6931471805599453094

static uint64_t dbits(double x)
{
    uint64_t u;
    memcpy(&u, &x, 8);
    return u;
}

static double dfrom(uint64_t u)
{
    double x;
    memcpy(&x, &u, 8);
    return x;
}

/* 2^k for -1022 <= k <= 1023. */
static double pow2i(int k)
{
    return dfrom((uint64_t)(k + 1023) << 52);
}

double ls_synth_sqrt(double x)
{
    if (!(x > 0.0)) return 0.0;
    /* Halving the exponent gives a guess within a factor 1.5; eight Newton
     * steps then converge to the last bit (quadratically). */
    double y = dfrom((dbits(x) >> 1) + (0x3FF0000000000000ull >> 1));
    for (int i = 0; i < 8; i++) y = 0.5 * (y + x / y);
    return y;
}

double ls_synth_log(double x)
{
    if (!(x > 0.0)) return x == 0.0 ? -HUGE_VAL : NAN;
    int e = 0;
    if (x < 2.2250738585072014e-308) { /* subnormal: scale into the normal range */
        x *= 18014398509481984.0;      /* 2^54 */
        e = -54;
    }
    uint64_t b = dbits(x);
    e += (int)((b >> 52) & 0x7ff) - 1023;
    double m = dfrom((b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull); /* [1, 2) */
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e += 1;
    }
    /* log m = 2 atanh(t), t = (m-1)/(m+1), |t| <= 0.172: 20 terms of the
     * odd series reach far below double precision. */
    double t = (m - 1.0) / (m + 1.0), t2 = t * t, term = t, s = 0.0;
    for (int k = 0; k < 20; k++) {
        s = s + term / (double)(2 * k + 1);
        term = term * t2;
    }
    return 2.0 * s + (double)e * LN2_D;
}

double ls_synth_exp(double x)
{
    if (x > 709.0) return HUGE_VAL; /* keeps the int conversion below defined */
    if (x < -708.0) return 0.0;
    double q = x / LN2_D;
    int k = (int)(q >= 0.0 ? q + 0.5 : q - 0.5);
    /* Cody–Waite: ln 2 split so that k * LN2_HI is exact for |k| < 2^11. */
    const double LN2_HI = 6.93147180369123816490e-01, LN2_LO = 1.90821492927058770002e-10;
    double r = (x - (double)k * LN2_HI) - (double)k * LN2_LO; /* |r| <= 0.35 */
    double p = 1.0;
    for (int n = 25; n >= 1; n--) p = 1.0 + r * p / (double)n; /* Taylor, Horner form */
    return p * pow2i(k);
}

/* ---- initialisers --------------------------------------------------------------- */

static uint64_t tensor_numel(const ls_synth_tensor *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

/* The fp32 factor of a NORMAL value: 5726623060 = 4 (2^32 - 1) / 3 exactly,
 * the variance of the centred Irwin–Hall integer. */
static float normal_c(double std)
{
    return (float)(std / ls_synth_sqrt(5726623060.0));
}

int ls_synth_normal_params(const ls_synth_tensor *t, uint64_t seed, uint64_t *key, float *c,
                           float *base)
{
    if (t->fused || t->fp8 == LS_SYNTH_F8_SCALE ||
        (t->init != LS_SYNTH_INIT_NORMAL && t->init != LS_SYNTH_INIT_ONE_PLUS_NORMAL))
        return 0;
    *key = ls_synth_key(seed, t->name);
    *c = normal_c(t->std);
    *base = t->init == LS_SYNTH_INIT_ONE_PLUS_NORMAL ? 1.0f : 0.0f;
    return 1;
}

/* ---- the hot loops, for the host's vector units ------------------------------------
 * The normal fill and the FP8 quantiser run once per element of every
 * generated weight: most of a generated checkpoint's fingerprint time and of
 * a CPU rank's load. Each has a baseline and an AVX-512 instance
 * (core/isa.h); AVX-512's 64-bit vector multiply runs the draws 8 lanes at
 * a time. */

/* n <= NORMAL_BLOCK values from the draw argument z (element j's argument
 * is key + (j + 1) GAMMA, so consecutive elements step it by GAMMA mod 2^64):
 * the integer draws first, then the fp32 arithmetic, each a loop of
 * independent lanes over a whole block (a fixed trip count is what lets the
 * compiler vectorise them at -O2), then the n wanted values copied out. */
enum { NORMAL_BLOCK = 512 };
LS_ISA_BODY void normal_block(uint64_t z, int n, float c, float base, uint16_t *dst)
{
    int32_t ih[NORMAL_BLOCK];
    uint16_t v[NORMAL_BLOCK];
    for (int i = 0; i < NORMAL_BLOCK; i++) ih[i] = irwin_hall(mix64(z + (uint64_t)i * GOLDEN_GAMMA));
    for (int i = 0; i < NORMAL_BLOCK; i++) v[i] = ls_f32_to_bf16(base + (float)ih[i] * c); /* (float)ih is exact */
    memcpy(dst, v, sizeof v[0] * (size_t)n);
}

LS_ISA_BODY void normal_run(uint64_t z, uint64_t n, float c, float base, uint16_t *dst)
{
    for (uint64_t b = 0; b < n; b += NORMAL_BLOCK, z += NORMAL_BLOCK * GOLDEN_GAMMA)
        normal_block(z, n - b < NORMAL_BLOCK ? (int)(n - b) : NORMAL_BLOCK, c, base, dst + b);
}

static void normal_baseline(uint64_t z, uint64_t n, float c, float base, uint16_t *dst)
{
    normal_run(z, n, c, base, dst);
}

LS_TARGET_AVX512 static void normal_avx512(uint64_t z, uint64_t n, float c, float base, uint16_t *dst)
{
    normal_run(z, n, c, base, dst);
}

/* NORMAL (or ONE_PLUS_NORMAL) values first .. first + n - 1 of the tensor
 * keyed `key` (element i depends on (key, i) alone, so a slice is the slice
 * of the whole). */
static void fill_normal_at(uint64_t key, uint64_t first, uint64_t n, double std, int one_plus,
                           uint16_t *dst)
{
    const float c = normal_c(std), base = one_plus ? 1.0f : 0.0f;
    const uint64_t z = key + (first + 1) * GOLDEN_GAMMA; /* draw(key, first)'s argument */
    (ls_cpu_has_avx512() ? normal_avx512 : normal_baseline)(z, n, c, base, dst);
}

static void fill_normal(uint64_t key, uint64_t n, double std, int one_plus, uint16_t *dst)
{
    fill_normal_at(key, 0, n, std, one_plus, dst);
}

void ls_synth_fill_normal_at(const ls_synth_tensor *t, uint64_t key, uint64_t first, uint64_t n, uint16_t *dst)
{
    fill_normal_at(key, first, n, t->std, t->init == LS_SYNTH_INIT_ONE_PLUS_NORMAL, dst);
}

uint64_t ls_synth_fused_key(const ls_synth_tensor *t, uint64_t seed, int64_t e, int part)
{
    const char *cut = strstr(t->name, "experts.");
    int plen = cut ? (int)(cut - t->name) + 8 : 0;
    const char *proj = t->fused == LS_SYNTH_FUSED_DOWN ? "down" : part ? "up" : "gate";
    char name[160];
    snprintf(name, sizeof name, "%.*s%lld.%s_proj.weight", plen, t->name, (long long)e, proj);
    return ls_synth_key(seed, name);
}

/* A fused expert stack: expert e's slices are generated under the names of
 * the per-expert tensors (ls_synth_fused_key). */
static void fill_fused(const ls_synth_tensor *t, uint64_t seed, uint16_t *dst)
{
    const int64_t E = t->shape[0], rows = t->shape[1], cols = t->shape[2];
    const int parts = t->fused == LS_SYNTH_FUSED_DOWN ? 1 : 2; /* gate rows 0..I-1, up rows I..2I-1 */
    const uint64_t per = (uint64_t)(rows / parts) * (uint64_t)cols;
    for (int64_t e = 0; e < E; e++)
        for (int p = 0; p < parts; p++)
            fill_normal(ls_synth_fused_key(t, seed, e, p), per, t->std, 0,
                        dst + ((uint64_t)e * (uint64_t)parts + (uint64_t)p) * per);
}

void ls_synth_fill(const ls_synth_tensor *t, uint64_t seed, uint16_t *dst)
{
    uint64_t key = ls_synth_key(seed, t->name);
    uint64_t n = tensor_numel(t);
    if (t->fused) {
        fill_fused(t, seed, dst);
        return;
    }
    switch (t->init) {
    case LS_SYNTH_INIT_NORMAL:
    case LS_SYNTH_INIT_ONE_PLUS_NORMAL:
        fill_normal(key, n, t->std, t->init == LS_SYNTH_INIT_ONE_PLUS_NORMAL, dst);
        break;
    case LS_SYNTH_INIT_A_LOG:
        /* A = exp(A_log) uniform in [1, 16), as the reference initialisation. */
        for (uint64_t i = 0; i < n; i++) {
            double a = 1.0 + 15.0 * uniform53(draw(key, i));
            dst[i] = ls_f32_to_bf16((float)ls_synth_log(a));
        }
        break;
    case LS_SYNTH_INIT_DT_BIAS: {
        /* dt log-uniform in [1e-3, 1e-1); dt_bias = softplus^-1(dt)
         * = dt + log(1 - exp(-dt)), so softplus(dt_bias) = dt. */
        const double lo = ls_synth_log(1e-3), hi = ls_synth_log(1e-1);
        for (uint64_t i = 0; i < n; i++) {
            double dt = ls_synth_exp(lo + (hi - lo) * uniform53(draw(key, i)));
            double inv = dt + ls_synth_log(1.0 - ls_synth_exp(-dt));
            dst[i] = ls_f32_to_bf16((float)inv);
        }
        break;
    }
    }
}

/* ---- the FP8 layout ------------------------------------------------------------- */

uint64_t ls_synth_tensor_bytes(const ls_synth_tensor *t)
{
    uint64_t n = tensor_numel(t);
    return t->fp8 == LS_SYNTH_F8_WEIGHT ? n : t->fp8 == LS_SYNTH_F8_SCALE ? 4 * n : 2 * n;
}

/* lane[i] = max(lane[i], bits of |w[i]|), NaNs counting as 0: over the
 * rest, the order of these bits is the order of the magnitudes, so the
 * maximum over a block is the bits of its largest magnitude (what a fp32
 * loop of `if (|v| > amax) amax = |v|` from 0 finds, NaNs never being
 * larger). Lanes, not one running maximum, so that the loop vectorises. */
LS_ISA_BODY void row_absmax(const uint16_t *restrict w, int n, uint16_t *restrict lane)
{
    for (int i = 0; i < n; i++) {
        uint16_t a = w[i] & 0x7fffu;
        a = a > 0x7f80u ? 0 : a;
        lane[i] = a > lane[i] ? a : lane[i];
    }
}

LS_ISA_BODY void row_e4m3(const uint16_t *restrict w, int n, float sc, uint8_t *restrict q)
{
    for (int i = 0; i < n; i++) q[i] = ls_f32_to_e4m3(ls_bf16_to_f32(w[i]) / sc);
}

/* The bf16 matrix w [R, C] quantised per 128 x 128 block: the block's scale
 * amax / 448 (fp32 division; 1 for an all-zero block) into scale
 * [ceil(R/128), ceil(C/128)] and e4m3(w / scale) into q [R, C]; either may
 * be NULL. A full block's rows are loops of 128 (the fixed count). */
LS_ISA_BODY void quantise_run(const uint16_t *w, int64_t R, int64_t C, uint8_t *q, float *scale)
{
    const int64_t BR = LS_FP8_BLOCKS(R), BC = LS_FP8_BLOCKS(C);
    for (int64_t bi = 0; bi < BR; bi++)
        for (int64_t bj = 0; bj < BC; bj++) {
            const int64_t r0 = bi * LS_FP8_BLOCK, r1 = R < r0 + LS_FP8_BLOCK ? R : r0 + LS_FP8_BLOCK;
            const int64_t c0 = bj * LS_FP8_BLOCK;
            const int n = C - c0 < LS_FP8_BLOCK ? (int)(C - c0) : LS_FP8_BLOCK;
            uint16_t lane[LS_FP8_BLOCK] = {0}, m = 0;
            for (int64_t r = r0; r < r1; r++) {
                if (n == LS_FP8_BLOCK) row_absmax(w + r * C + c0, LS_FP8_BLOCK, lane);
                else row_absmax(w + r * C + c0, n, lane);
            }
            for (int i = 0; i < n; i++) m = lane[i] > m ? lane[i] : m;
            const float amax = ls_bf16_to_f32(m), sc = amax > 0.0f ? amax / LS_FP8_E4M3_MAX : 1.0f;
            if (scale) scale[bi * BC + bj] = sc;
            if (!q) continue;
            for (int64_t r = r0; r < r1; r++) {
                if (n == LS_FP8_BLOCK) row_e4m3(w + r * C + c0, LS_FP8_BLOCK, sc, q + r * C + c0);
                else row_e4m3(w + r * C + c0, n, sc, q + r * C + c0);
            }
        }
}

static void quantise_baseline(const uint16_t *w, int64_t R, int64_t C, uint8_t *q, float *scale)
{
    quantise_run(w, R, C, q, scale);
}

LS_TARGET_AVX512 static void quantise_avx512(const uint16_t *w, int64_t R, int64_t C, uint8_t *q, float *scale)
{
    quantise_run(w, R, C, q, scale);
}

static void quantise_blocks(const uint16_t *w, int64_t R, int64_t C, uint8_t *q, float *scale)
{
    (ls_cpu_has_avx512() ? quantise_avx512 : quantise_baseline)(w, R, C, q, scale);
}

ls_status ls_synth_fill_bytes(const ls_synth_tensor *t, uint64_t seed, void *dst, ls_error *err)
{
    if (!t->fp8) {
        ls_synth_fill(t, seed, dst);
        return LS_OK;
    }
    /* the weight's bf16 values, generated under its own name */
    ls_synth_tensor w = *t;
    w.fp8 = 0;
    if (t->fp8 == LS_SYNTH_F8_SCALE) {
        size_t n = strlen(w.name);
        if (n > 10) w.name[n - 10] = '\0'; /* NAME.weight_scale_inv -> NAME.weight */
        w.ndim = 2;
        w.shape[0] = t->wshape[0];
        w.shape[1] = t->wshape[1];
    }
    const int64_t R = w.shape[0], C = w.shape[1];
    uint16_t *v = malloc(sizeof(uint16_t) * (size_t)(R * C > 0 ? R * C : 1));
    if (!v)
        return ls_fail(err, LS_E_NOMEM, "synth: cannot allocate the %lld x %lld values of %s",
                       (long long)R, (long long)C, w.name);
    ls_synth_fill(&w, seed, v);
    if (t->fp8 == LS_SYNTH_F8_SCALE) quantise_blocks(v, R, C, NULL, dst);
    else quantise_blocks(v, R, C, dst, NULL);
    free(v);
    return LS_OK;
}

ls_status ls_synth_fill_rows(const ls_synth_tensor *t, uint64_t seed, int64_t r0, int64_t n,
                             void *dst, float *scale, ls_error *err)
{
    /* rows of a 2-D tensor, or of a 3-D one with a middle dimension of 1 (conv1d) */
    const int64_t R = t->shape[0], C = t->ndim == 2 ? t->shape[1] : t->shape[2];
    if (t->fused || t->fp8 == LS_SYNTH_F8_SCALE || (t->ndim != 2 && !(t->ndim == 3 && t->shape[1] == 1)) ||
        (t->init != LS_SYNTH_INIT_NORMAL && t->init != LS_SYNTH_INIT_ONE_PLUS_NORMAL))
        return ls_fail(err, LS_E_INTERNAL, "synth: tensor '%s' is not a matrix of normal values "
                       "generated by rows", t->name);
    if (r0 < 0 || n < 0 || r0 + n > R)
        return ls_fail(err, LS_E_INTERNAL, "synth: rows %lld .. %lld are outside '%s' [%lld, %lld]",
                       (long long)r0, (long long)(r0 + n), t->name, (long long)R, (long long)C);
    const uint64_t first = (uint64_t)r0 * (uint64_t)C, cnt = (uint64_t)n * (uint64_t)C;
    const uint64_t key = ls_synth_key(seed, t->name);
    const int one_plus = t->init == LS_SYNTH_INIT_ONE_PLUS_NORMAL;
    if (!t->fp8) {
        fill_normal_at(key, first, cnt, t->std, one_plus, dst);
        return LS_OK;
    }
    /* FP8: a block's scale is the amax of its 128 x 128 values, so a slice
     * holds whole blocks: it starts a block and ends one (or the matrix). */
    if (r0 % LS_FP8_BLOCK || (n % LS_FP8_BLOCK && r0 + n != R))
        return ls_fail(err, LS_E_INTERNAL, "synth: rows %lld .. %lld of FP8 '%s' do not fall on "
                       "whole %d-row scale blocks", (long long)r0, (long long)(r0 + n), t->name,
                       LS_FP8_BLOCK);
    uint16_t *v = malloc(sizeof(uint16_t) * (size_t)(cnt ? cnt : 1));
    if (!v)
        return ls_fail(err, LS_E_NOMEM, "synth: cannot allocate the %lld x %lld values of %s",
                       (long long)n, (long long)C, t->name);
    fill_normal_at(key, first, cnt, t->std, one_plus, v);
    quantise_blocks(v, n, C, dst, scale);
    free(v);
    return LS_OK;
}

/* ---- the tensor list ------------------------------------------------------------ */

/* lm_head standard deviation = LM_HEAD_GAIN * sqrt(2 ln V) / sqrt(D): the
 * logits of a unit-RMS hidden state then have std ~ 1.15 sqrt(2 ln V), which
 * puts the mean top-1 log-probability near -1 for V from 10^3 to 1.5·10^5
 * (measured numbers in docs/synth.md). */
#define LM_HEAD_GAIN 1.15
#define NORM_STD 0.1           /* zero-centred RMSNorm weights (applied as 1 + w) */
#define GATED_NORM_STD 0.1     /* GDN gated RMSNorm weight, 1 + N(0, 0.1^2) */

typedef struct tensor_list {
    ls_synth_tensor *v;
    size_t n, cap;
    int oom;
} tensor_list;

static void add(tensor_list *l, ls_synth_init init, double std, int ndim, int64_t d0, int64_t d1,
                int64_t d2, const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static void add(tensor_list *l, ls_synth_init init, double std, int ndim, int64_t d0, int64_t d1,
                int64_t d2, const char *fmt, ...)
{
    if (l->oom) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        ls_synth_tensor *nv = realloc(l->v, cap * sizeof *nv);
        if (!nv) {
            l->oom = 1;
            return;
        }
        l->v = nv;
        l->cap = cap;
    }
    ls_synth_tensor *t = &l->v[l->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->init = init;
    t->std = std;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
}

/* The FP8 layout: the tensor just added becomes an F8_E4M3 weight, followed
 * by its F32 block scales (when fp8; nothing otherwise). */
static void q8(tensor_list *l, int fp8)
{
    if (!fp8 || l->oom) return;
    ls_synth_tensor w = l->v[l->n - 1];
    l->v[l->n - 1].fp8 = LS_SYNTH_F8_WEIGHT;
    add(l, w.init, w.std, 2, LS_FP8_BLOCKS(w.shape[0]), LS_FP8_BLOCKS(w.shape[1]), 0,
        "%s_scale_inv", w.name);
    if (l->oom) return;
    l->v[l->n - 1].fp8 = LS_SYNTH_F8_SCALE;
    l->v[l->n - 1].wshape[0] = w.shape[0];
    l->v[l->n - 1].wshape[1] = w.shape[1];
}

static double inv_sqrt(int64_t n) { return 1.0 / ls_synth_sqrt((double)n); }

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const ls_synth_tensor *)a)->name, ((const ls_synth_tensor *)b)->name);
}

ls_status ls_synth_list_tensors(const ls_synth_config *c, ls_synth_tensor **out, size_t *count,
                                ls_error *err)
{
    *out = NULL;
    *count = 0;
    tensor_list l = {0};
    const ls_synth_init N = LS_SYNTH_INIT_NORMAL;
    const int64_t D = c->hidden_size, V = c->vocab_size;
    /* Qwen3.5 keeps the language model under model.language_model. */
    const int q35 = c->arch == LS_SYNTH_QWEN3_5_MOE;
    const char *m = q35 ? "model.language_model" : "model";
    /* FP8: what the releases quantise (docs/model.md §6b); fused FP8 experts
     * are not a release layout */
    const int f8 = c->fp8;
    if (f8 && c->fused_experts)
        return ls_fail(err, LS_E_USAGE, "synth: the FP8 layout stores experts one by one (as the "
                       "FP8 releases do), not fused");

    add(&l, N, 1.0, 2, V, D, 0, "%s.embed_tokens.weight", m);
    add(&l, N, NORM_STD, 1, D, 0, 0, "%s.norm.weight", m);
    add(&l, N, LM_HEAD_GAIN * ls_synth_sqrt(2.0 * ls_synth_log((double)V)) * inv_sqrt(D), 2, V, D,
        0, "lm_head.weight");

    for (int64_t L = 0; L < c->num_hidden_layers; L++) {
        char p[64];
        snprintf(p, sizeof p, "%s.layers", m);
        add(&l, N, NORM_STD, 1, D, 0, 0, "%s.%lld.input_layernorm.weight", p, (long long)L);
        add(&l, N, NORM_STD, 1, D, 0, 0, "%s.%lld.post_attention_layernorm.weight", p,
            (long long)L);
        if (c->layer_full[L]) {
            const int64_t H = c->num_attention_heads, KV = c->num_key_value_heads,
                          hd = c->head_dim;
            /* q_proj rows: per head, hd query rows then hd gate rows (docs/model.md §3.3). */
            add(&l, N, inv_sqrt(D), 2, 2 * H * hd, D, 0, "%s.%lld.self_attn.q_proj.weight", p,
                (long long)L);
            q8(&l, f8);
            add(&l, N, inv_sqrt(D), 2, KV * hd, D, 0, "%s.%lld.self_attn.k_proj.weight", p,
                (long long)L);
            q8(&l, f8);
            add(&l, N, inv_sqrt(D), 2, KV * hd, D, 0, "%s.%lld.self_attn.v_proj.weight", p,
                (long long)L);
            q8(&l, f8);
            add(&l, N, inv_sqrt(H * hd), 2, D, H * hd, 0, "%s.%lld.self_attn.o_proj.weight", p,
                (long long)L);
            q8(&l, f8);
            add(&l, N, NORM_STD, 1, hd, 0, 0, "%s.%lld.self_attn.q_norm.weight", p, (long long)L);
            add(&l, N, NORM_STD, 1, hd, 0, 0, "%s.%lld.self_attn.k_norm.weight", p, (long long)L);
        } else {
            const int64_t Hk = c->linear_num_key_heads, Hv = c->linear_num_value_heads,
                          dk = c->linear_key_head_dim, dv = c->linear_value_head_dim,
                          K = c->linear_conv_kernel_dim;
            const int64_t conv_dim = 2 * Hk * dk + Hv * dv;
            if (q35) {
                /* Four projections in plain head order (docs/model.md §2.2). */
                add(&l, N, inv_sqrt(D), 2, conv_dim, D, 0,
                    "%s.%lld.linear_attn.in_proj_qkv.weight", p, (long long)L);
                q8(&l, f8);
                add(&l, N, inv_sqrt(D), 2, Hv * dv, D, 0, "%s.%lld.linear_attn.in_proj_z.weight",
                    p, (long long)L);
                q8(&l, f8);
                add(&l, N, inv_sqrt(D), 2, Hv, D, 0, "%s.%lld.linear_attn.in_proj_b.weight", p,
                    (long long)L);
                add(&l, N, inv_sqrt(D), 2, Hv, D, 0, "%s.%lld.linear_attn.in_proj_a.weight", p,
                    (long long)L);
            } else {
                /* Fused, per-key-head interleaved projections (docs/model.md §2.3). */
                add(&l, N, inv_sqrt(D), 2, 2 * Hk * dk + 2 * Hv * dv, D, 0,
                    "%s.%lld.linear_attn.in_proj_qkvz.weight", p, (long long)L);
                q8(&l, f8);
                add(&l, N, inv_sqrt(D), 2, 2 * Hv, D, 0, "%s.%lld.linear_attn.in_proj_ba.weight",
                    p, (long long)L);
            }
            add(&l, N, inv_sqrt(K), 3, conv_dim, 1, K, "%s.%lld.linear_attn.conv1d.weight", p,
                (long long)L);
            add(&l, LS_SYNTH_INIT_DT_BIAS, 0.0, 1, Hv, 0, 0, "%s.%lld.linear_attn.dt_bias", p,
                (long long)L);
            add(&l, LS_SYNTH_INIT_A_LOG, 0.0, 1, Hv, 0, 0, "%s.%lld.linear_attn.A_log", p,
                (long long)L);
            add(&l, LS_SYNTH_INIT_ONE_PLUS_NORMAL, GATED_NORM_STD, 1, dv, 0, 0,
                "%s.%lld.linear_attn.norm.weight", p, (long long)L);
            add(&l, N, inv_sqrt(Hv * dv), 2, D, Hv * dv, 0, "%s.%lld.linear_attn.out_proj.weight",
                p, (long long)L);
            q8(&l, f8);
        }
        const int64_t E = c->num_experts, I = c->moe_intermediate_size,
                      Is = c->shared_expert_intermediate_size;
        add(&l, N, inv_sqrt(D), 2, E, D, 0, "%s.%lld.mlp.gate.weight", p, (long long)L);
        if (c->fused_experts) {
            /* No .weight suffix: the release's 3-D parameters (docs/model.md §2.2). */
            add(&l, N, inv_sqrt(D), 3, E, 2 * I, D, "%s.%lld.mlp.experts.gate_up_proj", p,
                (long long)L);
            if (!l.oom) l.v[l.n - 1].fused = LS_SYNTH_FUSED_GATE_UP;
            add(&l, N, inv_sqrt(I), 3, E, D, I, "%s.%lld.mlp.experts.down_proj", p, (long long)L);
            if (!l.oom) l.v[l.n - 1].fused = LS_SYNTH_FUSED_DOWN;
        }
        for (int64_t e = 0; e < E && !c->fused_experts; e++) {
            add(&l, N, inv_sqrt(D), 2, I, D, 0, "%s.%lld.mlp.experts.%lld.gate_proj.weight", p,
                (long long)L, (long long)e);
            q8(&l, f8);
            add(&l, N, inv_sqrt(D), 2, I, D, 0, "%s.%lld.mlp.experts.%lld.up_proj.weight", p,
                (long long)L, (long long)e);
            q8(&l, f8);
            add(&l, N, inv_sqrt(I), 2, D, I, 0, "%s.%lld.mlp.experts.%lld.down_proj.weight", p,
                (long long)L, (long long)e);
            q8(&l, f8);
        }
        add(&l, N, inv_sqrt(D), 2, Is, D, 0, "%s.%lld.mlp.shared_expert.gate_proj.weight", p,
            (long long)L);
        q8(&l, f8);
        add(&l, N, inv_sqrt(D), 2, Is, D, 0, "%s.%lld.mlp.shared_expert.up_proj.weight", p,
            (long long)L);
        q8(&l, f8);
        add(&l, N, inv_sqrt(Is), 2, D, Is, 0, "%s.%lld.mlp.shared_expert.down_proj.weight", p,
            (long long)L);
        q8(&l, f8);
        add(&l, N, inv_sqrt(D), 2, 1, D, 0, "%s.%lld.mlp.shared_expert_gate.weight", p,
            (long long)L);
    }
    if (l.oom) {
        free(l.v);
        return ls_fail(err, LS_E_NOMEM, "synth: out of memory listing tensors");
    }
    qsort(l.v, l.n, sizeof *l.v, cmp_name);
    *out = l.v;
    *count = l.n;
    return LS_OK;
}
