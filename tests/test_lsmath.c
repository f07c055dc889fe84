/* lockstep's own transcendentals (src/numerics/lsmath.h) against long double
 * libm references rounded to fp32: ULP bounds over dense samples of the whole
 * domain, exhaustive windows where the reductions change regime, and the
 * special values the header promises. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "numerics/lsmath.h"
#include "testutil.h"

/* Stated bounds (ULP of the correctly rounded fp32 result). */
#define EXP_MAX_ULP 1
#define LOG_MAX_ULP 1
#define LOG1P_MAX_ULP 1
#define DERIVED_MAX_ULP 3  /* sigmoid, silu, softplus vs long double formula */

/* Dense stride over bit patterns: odd and prime so every low-bit residue is
 * visited across the domain. */
#define STRIDE 61

/* Position of a float on the ordered line of fp32 values (-0 and +0 equal). */
static int64_t ord(float x)
{
    uint32_t u = ls_f32_bits(x);
    return (u >> 31) ? -(int64_t)(u & 0x7fffffffu) : (int64_t)u;
}

static float from_ord(int64_t o)
{
    return o < 0 ? ls_f32_from_bits(0x80000000u | (uint32_t)(-o)) : ls_f32_from_bits((uint32_t)o);
}

/* ULP distance; NaN against NaN is 0, NaN against a number is huge. */
static int64_t ulp_dist(float a, float b)
{
    if (a != a || b != b) return (a != a && b != b) ? 0 : INT64_MAX;
    if (isinf(a) || isinf(b)) return a == b ? 0 : INT64_MAX;
    int64_t d = ord(a) - ord(b);
    return d < 0 ? -d : d;
}

typedef float (*f32_fn)(float);
typedef long double (*ld_fn)(long double);

typedef struct sweep_result {
    int64_t max_ulp;    /* worst ULP distance seen */
    float worst_x;      /* input of the worst case */
    float worst_got;
    float worst_want;
    long n;             /* inputs checked */
    long n_inexact;     /* results not equal to the correctly rounded one */
} sweep_result;

static void sweep_note(sweep_result *r, float x, float got, float want)
{
    int64_t d = ulp_dist(got, want);
    r->n++;
    if (d != 0) r->n_inexact++;
    if (d > r->max_ulp || r->n == 1) {
        if (d > r->max_ulp) r->max_ulp = d;
        r->worst_x = x;
        r->worst_got = got;
        r->worst_want = want;
    }
}

/* Every stride-th value on the ordered line from lo to hi, plus hi. */
static void sweep_range(sweep_result *r, f32_fn f, ld_fn ref, float lo, float hi, int64_t stride)
{
    int64_t a = ord(lo), b = ord(hi);
    for (int64_t o = a; o <= b; o += stride) {
        float x = from_ord(o);
        sweep_note(r, x, f(x), (float)ref((long double)x));
    }
    sweep_note(r, hi, f(hi), (float)ref((long double)hi));
}

static void report(const char *name, const sweep_result *r, int64_t bound)
{
    printf("%-10s n=%ld max_ulp=%lld inexact=%ld (%.4f%%) worst x=0x%08x (%.9g) got=0x%08x want=0x%08x\n",
           name, r->n, (long long)r->max_ulp, r->n_inexact, 100.0 * (double)r->n_inexact / (double)r->n,
           ls_f32_bits(r->worst_x), (double)r->worst_x, ls_f32_bits(r->worst_got),
           ls_f32_bits(r->worst_want));
    fflush(stdout);
    ck_assert_msg(r->max_ulp <= bound,
                  "%s: %lld ULP > bound %lld at x=0x%08x: got 0x%08x want 0x%08x", name,
                  (long long)r->max_ulp, (long long)bound, ls_f32_bits(r->worst_x),
                  ls_f32_bits(r->worst_got), ls_f32_bits(r->worst_want));
}

static float fbits(uint32_t u) { return ls_f32_from_bits(u); }

/* Exact expected value (NaN matches any NaN). */
static void expect_bits(const char *what, float x, float got, float want)
{
    ck_assert_msg(ulp_dist(got, want) == 0 && (got != 0.0f || signbit(got) == signbit(want)),
                  "%s(0x%08x): got 0x%08x want 0x%08x", what, ls_f32_bits(x), ls_f32_bits(got),
                  ls_f32_bits(want));
}

/* ---- exp ------------------------------------------------------------------------ */

START_TEST(test_exp_accuracy)
{
    sweep_result r = {0};
    sweep_range(&r, ls_expf, expl, -104.5f, 89.0f, STRIDE);
    /* exhaustive: small arguments, the reduction boundary near ln2/2, the
     * overflow threshold and the start of the subnormal results */
    sweep_range(&r, ls_expf, expl, 0x1p-12f, 0x1.1p-12f, 1);
    sweep_range(&r, ls_expf, expl, -0x1.1p-12f, -0x1p-12f, 1);
    sweep_range(&r, ls_expf, expl, 0.340f, 0.355f, 1);
    sweep_range(&r, ls_expf, expl, -0.355f, -0.340f, 1);
    sweep_range(&r, ls_expf, expl, 88.70f, 89.0f, 1);
    sweep_range(&r, ls_expf, expl, -104.0f, -87.0f, 5);
    report("ls_expf", &r, EXP_MAX_ULP);
}
END_TEST

START_TEST(test_exp_specials)
{
    const float inf = fbits(0x7f800000u);
    expect_bits("exp", 0.0f, ls_expf(0.0f), 1.0f);
    expect_bits("exp", -0.0f, ls_expf(-0.0f), 1.0f);
    expect_bits("exp", inf, ls_expf(inf), inf);
    expect_bits("exp", -inf, ls_expf(-inf), 0.0f);
    expect_bits("exp", fbits(0x7fc00000u), ls_expf(fbits(0x7fc00000u)), fbits(0x7fc00000u));
    expect_bits("exp", fbits(0xffc00001u), ls_expf(fbits(0xffc00001u)), fbits(0x7fc00000u));
    expect_bits("exp", 88.72283172607421875f, ls_expf(88.72283172607421875f),
                (float)expl(88.72283172607421875L));
    ck_assert(isfinite(ls_expf(88.72283172607421875f)));
    expect_bits("exp", fbits(0x42b17218u), ls_expf(fbits(0x42b17218u)), inf);
    expect_bits("exp", 1000.0f, ls_expf(1000.0f), inf);
    expect_bits("exp", fbits(0x7f7fffffu), ls_expf(fbits(0x7f7fffffu)), inf);
    expect_bits("exp", -200.0f, ls_expf(-200.0f), 0.0f);
    expect_bits("exp", fbits(0xff7fffffu), ls_expf(fbits(0xff7fffffu)), 0.0f);
    /* ln(2^-149) lands on the smallest subnormal; -104 rounds to 0 */
    expect_bits("exp", -103.27893f, ls_expf(-103.27893f), (float)expl(-103.27893L));
    ck_assert(ls_expf(-103.27893f) > 0.0f);
    expect_bits("exp", -104.0f, ls_expf(-104.0f), 0.0f);
    for (int k = -100; k <= 88; k += 7) /* integer arguments */
        ck_assert(ulp_dist(ls_expf((float)k), (float)expl((long double)k)) <= EXP_MAX_ULP);
}
END_TEST

/* ---- log ------------------------------------------------------------------------ */

START_TEST(test_log_accuracy)
{
    sweep_result r = {0};
    sweep_range(&r, ls_logf, logl, fbits(0x00000001u), fbits(0x7f7fffffu), STRIDE);
    sweep_range(&r, ls_logf, logl, 0.98f, 1.02f, 1);          /* cancellation near 1 */
    sweep_range(&r, ls_logf, logl, 0.7071f, 0.7072f, 1);      /* mantissa split point */
    sweep_range(&r, ls_logf, logl, 1.4141f, 1.4143f, 1);
    sweep_range(&r, ls_logf, logl, fbits(0x00000001u), fbits(0x00010000u), 1); /* subnormals */
    report("ls_logf", &r, LOG_MAX_ULP);
}
END_TEST

START_TEST(test_log_specials)
{
    const float inf = fbits(0x7f800000u), qnan = fbits(0x7fc00000u);
    expect_bits("log", 1.0f, ls_logf(1.0f), 0.0f);
    expect_bits("log", 0.0f, ls_logf(0.0f), -inf);
    expect_bits("log", -0.0f, ls_logf(-0.0f), -inf);
    expect_bits("log", inf, ls_logf(inf), inf);
    expect_bits("log", -inf, ls_logf(-inf), qnan);
    expect_bits("log", -1.0f, ls_logf(-1.0f), qnan);
    expect_bits("log", fbits(0x80000001u), ls_logf(fbits(0x80000001u)), qnan);
    expect_bits("log", qnan, ls_logf(qnan), qnan);
    expect_bits("log", fbits(0x00000001u), ls_logf(fbits(0x00000001u)), (float)logl(0x1p-149L));
    expect_bits("log", fbits(0x7f7fffffu), ls_logf(fbits(0x7f7fffffu)),
                (float)logl((long double)fbits(0x7f7fffffu)));
}
END_TEST

/* ---- log1p ---------------------------------------------------------------------- */

START_TEST(test_log1p_accuracy)
{
    sweep_result r = {0};
    sweep_range(&r, ls_log1pf, log1pl, -1.0f, fbits(0x7f7fffffu), STRIDE);
    sweep_range(&r, ls_log1pf, log1pl, 0x1p-12f, 0x1.1p-12f, 1);  /* small x */
    sweep_range(&r, ls_log1pf, log1pl, -0x1.1p-12f, -0x1p-12f, 1);
    sweep_range(&r, ls_log1pf, log1pl, -0.2930f, -0.2928f, 1);    /* kernel / u switch */
    sweep_range(&r, ls_log1pf, log1pl, 0.4141f, 0.4143f, 1);
    sweep_range(&r, ls_log1pf, log1pl, 0.99f, 1.01f, 1);          /* two-sum branch switch */
    sweep_range(&r, ls_log1pf, log1pl, -1.0f, -0.99f, 1);
    report("ls_log1pf", &r, LOG1P_MAX_ULP);
}
END_TEST

START_TEST(test_log1p_specials)
{
    const float inf = fbits(0x7f800000u), qnan = fbits(0x7fc00000u);
    expect_bits("log1p", 0.0f, ls_log1pf(0.0f), 0.0f);
    expect_bits("log1p", -0.0f, ls_log1pf(-0.0f), -0.0f);
    expect_bits("log1p", -1.0f, ls_log1pf(-1.0f), -inf);
    expect_bits("log1p", -1.5f, ls_log1pf(-1.5f), qnan);
    expect_bits("log1p", -inf, ls_log1pf(-inf), qnan);
    expect_bits("log1p", inf, ls_log1pf(inf), inf);
    expect_bits("log1p", qnan, ls_log1pf(qnan), qnan);
    expect_bits("log1p", fbits(0x00000001u), ls_log1pf(fbits(0x00000001u)), fbits(0x00000001u));
    expect_bits("log1p", fbits(0x80000001u), ls_log1pf(fbits(0x80000001u)), fbits(0x80000001u));
}
END_TEST

/* ---- derived ---------------------------------------------------------------------- */

static long double sigmoid_ld(long double x) { return 1.0L / (1.0L + expl(-x)); }
static long double silu_ld(long double x) { return x / (1.0L + expl(-x)); }
static long double softplus_ld(long double x) { return x > 20.0L ? x : log1pl(expl(x)); }

START_TEST(test_derived)
{
    sweep_result r = {0};
    sweep_range(&r, ls_sigmoidf, sigmoid_ld, -80.0f, 80.0f, 1021);
    report("sigmoid", &r, DERIVED_MAX_ULP);
    sweep_result s = {0};
    sweep_range(&s, ls_siluf, silu_ld, -80.0f, 80.0f, 1021);
    report("silu", &s, DERIVED_MAX_ULP);
    sweep_result p = {0};
    sweep_range(&p, ls_softplusf, softplus_ld, -80.0f, 80.0f, 1021);
    report("softplus", &p, DERIVED_MAX_ULP);

    /* the definitions, bit for bit */
    const float xs[] = {-30.5f, -3.0f, -0.7f, -0x1p-30f, 0.0f, 0.25f, 1.0f, 5.5f, 19.99f, 20.0f, 20.01f, 77.0f};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        float x = xs[i];
        expect_bits("sigmoid", x, ls_sigmoidf(x), 1.0f / (1.0f + ls_expf(-x)));
        expect_bits("silu", x, ls_siluf(x), x / (1.0f + ls_expf(-x)));
        expect_bits("softplus", x, ls_softplusf(x), x > 20.0f ? x : ls_log1pf(ls_expf(x)));
        expect_bits("rsqrt", x, ls_rsqrtf(x), 1.0f / sqrtf(x));
    }
    const float inf = fbits(0x7f800000u);
    expect_bits("sigmoid", inf, ls_sigmoidf(inf), 1.0f);
    expect_bits("sigmoid", -inf, ls_sigmoidf(-inf), 0.0f);
    expect_bits("softplus", 20.0f, ls_softplusf(20.0f), (float)log1pl(expl(20.0L)));
    expect_bits("softplus", 25.0f, ls_softplusf(25.0f), 25.0f);
    expect_bits("softplus", -inf, ls_softplusf(-inf), 0.0f);
    expect_bits("rsqrt", 4.0f, ls_rsqrtf(4.0f), 0.5f);
    expect_bits("rsqrt", 0.0f, ls_rsqrtf(0.0f), inf);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("lsmath");
    TCase *tc = tcase_create("lsmath");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_exp_accuracy);
    tcase_add_test(tc, test_exp_specials);
    tcase_add_test(tc, test_log_accuracy);
    tcase_add_test(tc, test_log_specials);
    tcase_add_test(tc, test_log1p_accuracy);
    tcase_add_test(tc, test_log1p_specials);
    tcase_add_test(tc, test_derived);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}
