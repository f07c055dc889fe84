/* CPU reference operators (src/backend/cpu_ops.h) against direct
 * transcriptions of docs/numerics.md §3–4, plus the row/chunk/thread
 * invariances each operator promises. Failures print the first mismatching
 * element with both values' bits. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "fingerprint/sha256.h"
#include "backend/cpu_ops.h"
#include "numerics/lsmath.h"
#include "numerics/reduce.h"
#include "testutil.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(float scale)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(rng_state >> 11) / 9007199254740992.0;
    return (float)((u * 2.0 - 1.0) * scale);
}

static float *rvec(long n, float scale, int bf16)
{
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (long i = 0; i < n; i++) v[i] = bf16 ? ls_round_bf16(frand(scale)) : frand(scale);
    return v;
}

static uint16_t *rbf16(long n, float scale)
{
    uint16_t *v = malloc(sizeof(uint16_t) * (size_t)n);
    for (long i = 0; i < n; i++) v[i] = ls_f32_to_bf16(frand(scale));
    return v;
}

static void expect_bits(const char *what, const float *got, const float *want, long n)
{
    for (long i = 0; i < n; i++)
        if (ls_f32_bits(got[i]) != ls_f32_bits(want[i]))
            ck_abort_msg("%s: first mismatch at %ld: got %.9g (0x%08x) want %.9g (0x%08x)", what, i,
                         got[i], ls_f32_bits(got[i]), want[i], ls_f32_bits(want[i]));
}

static float A(float x, int act)
{
    return act ? ls_round_bf16(x) : x;
}

/* Transcription of LS_DOT32 (docs/numerics.md §2). */
static float dot32(const float *a, long sa, const float *b, long sb, long n)
{
    float p[32] = {0};
    for (long k = 0; k < n; k++) {
        float prod = a[k * sa] * b[k * sb];
        p[k % 32] = p[k % 32] + prod;
    }
    for (int s = 16; s >= 1; s /= 2)
        for (int l = 0; l < s; l++) p[l] = p[l] + p[l + s];
    return p[0];
}

START_TEST(test_linear)
{
    long shapes[][3] = {{1, 5, 3}, {4, 64, 17}, {3, 100, 40}, {2, 33, 1}};
    for (int act = 0; act < 2; act++)
        for (int s = 0; s < 4; s++)
            for (int wt = 0; wt < 2; wt++) {
                long T = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
                float *x = rvec(T * in, 2.0f, act);
                uint16_t *wb = rbf16(out * in, 0.5f);
                float *wf = malloc(sizeof(float) * (size_t)(out * in));
                for (long i = 0; i < out * in; i++) wf[i] = ls_bf16_to_f32(wb[i]) * 1.0009765625f;
                ls_wmat w = {wt ? (const void *)wf : (const void *)wb, wt ? LS_WTYPE_F32 : LS_WTYPE_BF16,
                             out, in, NULL, NULL, 0};
                float *y = calloc((size_t)(T * out), sizeof(float));
                float *y2 = calloc((size_t)(T * out), sizeof(float));
                float *want = calloc((size_t)(T * out), sizeof(float));
                ls_cpu_linear(&w, x, y, T, 0, out, act, LS_ORDER_CANONICAL);
                /* A split over output rows gives the same bits. */
                ls_cpu_linear(&w, x, y2, T, 0, out / 2, act, LS_ORDER_CANONICAL);
                ls_cpu_linear(&w, x, y2, T, out / 2, out, act, LS_ORDER_CANONICAL);
                float row[128];
                for (long t = 0; t < T; t++)
                    for (long o = 0; o < out; o++) {
                        for (long i = 0; i < in; i++) row[i] = wt ? wf[o * in + i] : ls_bf16_to_f32(wb[o * in + i]);
                        want[t * out + o] = A(dot32(row, 1, x + t * in, 1, in), act);
                    }
                expect_bits("linear", y, want, T * out);
                expect_bits("linear split", y2, want, T * out);
                /* One row alone equals the row inside a batch (rule 1). */
                if (T > 1) {
                    ls_cpu_linear(&w, x + in, y2, 1, 0, out, act, LS_ORDER_CANONICAL);
                    expect_bits("linear row alone", y2, want + out, out);
                }
                free(x), free(wb), free(wf), free(y), free(y2), free(want);
            }
}
END_TEST

START_TEST(test_norms)
{
    for (int act = 0; act < 2; act++) {
        long R = 3, n = 96;
        float *x = rvec(R * n, 3.0f, act), *z = rvec(R * n, 3.0f, act);
        float *w = rvec(n, 0.3f, 1);
        float *y = malloc(sizeof(float) * (size_t)(R * n)), *want = malloc(sizeof(float) * (size_t)(R * n));
        ls_cpu_rmsnorm(x, w, y, R, n, act, LS_ORDER_CANONICAL);
        for (long r = 0; r < R; r++) {
            float ms = dot32(x + r * n, 1, x + r * n, 1, n) / (float)n;
            float rr = 1.0f / sqrtf(ms + 1e-6f);
            for (long i = 0; i < n; i++) {
                float xn = x[r * n + i] * rr;
                want[r * n + i] = A(xn * (1.0f + w[i]), act);
            }
        }
        expect_bits("rmsnorm", y, want, R * n);
        ls_cpu_gated_rmsnorm(x, z, w, y, R, n, act, LS_ORDER_CANONICAL);
        for (long r = 0; r < R; r++) {
            float ms = dot32(x + r * n, 1, x + r * n, 1, n) / (float)n;
            float rr = 1.0f / sqrtf(ms + 1e-6f);
            for (long i = 0; i < n; i++) {
                float nn = A(x[r * n + i] * rr, act);
                float p = A(w[i] * nn, act);
                float zz = z[r * n + i];
                float sl = zz / (1.0f + ls_expf(-zz));
                want[r * n + i] = A(p * sl, act);
            }
        }
        expect_bits("gated rmsnorm", y, want, R * n);
        /* l2norm + scale */
        memcpy(y, x, sizeof(float) * (size_t)(R * n));
        float sc = ls_cpu_inv_sqrt_scale(n);
        ck_assert_uint_eq(ls_f32_bits(sc), ls_f32_bits((float)(1.0 / sqrt((double)n))));
        ls_cpu_l2norm_scale(y, R, n, sc, LS_ORDER_CANONICAL);
        for (long r = 0; r < R; r++) {
            float f = 1.0f / sqrtf(dot32(x + r * n, 1, x + r * n, 1, n) + 1e-6f);
            for (long i = 0; i < n; i++) {
                float v = x[r * n + i] * f;
                want[r * n + i] = v * sc;
            }
        }
        expect_bits("l2norm", y, want, R * n);
        free(x), free(z), free(w), free(y), free(want);
    }
}
END_TEST

START_TEST(test_conv_state_carry)
{
    for (int act = 0; act < 2; act++) {
        long T = 9, C = 40, K = 4;
        float *x = rvec(T * C, 2.0f, act);
        uint16_t *wb = rbf16(C * K, 0.8f);
        ls_wmat w = {wb, LS_WTYPE_BF16, C, K, NULL, NULL, 0};
        float *st = calloc((size_t)(C * K), sizeof(float)), *st2 = calloc((size_t)(C * K), sizeof(float));
        float *y = malloc(sizeof(float) * (size_t)(T * C)), *y2 = malloc(sizeof(float) * (size_t)(T * C));
        float *want = malloc(sizeof(float) * (size_t)(T * C));
        ls_cpu_conv_silu(x, C, &w, st, y, C, T, C, K, act, LS_ORDER_CANONICAL);
        /* Chunks 2 + 1 + 6 with the state carried give the same bits. */
        ls_cpu_conv_silu(x, C, &w, st2, y2, C, 2, C, K, act, LS_ORDER_CANONICAL);
        ls_cpu_conv_silu(x + 2 * C, C, &w, st2, y2 + 2 * C, C, 1, C, K, act, LS_ORDER_CANONICAL);
        ls_cpu_conv_silu(x + 3 * C, C, &w, st2, y2 + 3 * C, C, 6, C, K, act, LS_ORDER_CANONICAL);
        for (long t = 0; t < T; t++)
            for (long c = 0; c < C; c++) {
                float s = 0.0f;
                for (long j = 0; j < K; j++) {
                    long src = t - K + 1 + j;
                    float xv = src >= 0 ? x[src * C + c] : 0.0f;
                    float prod = ls_bf16_to_f32(wb[c * K + j]) * xv;
                    s = s + prod;
                }
                float sa = A(s, act);
                want[t * C + c] = A(sa / (1.0f + ls_expf(-sa)), act);
            }
        expect_bits("conv", y, want, T * C);
        expect_bits("conv chunked", y2, want, T * C);
        expect_bits("conv state", st2, st, C * K);
        /* The state holds the last K inputs, most recent last. */
        for (long c = 0; c < C; c++) ck_assert_float_eq(st[c * K + K - 1], x[(T - 1) * C + c]);
        free(x), free(wb), free(st), free(st2), free(y), free(y2), free(want);
    }
}
END_TEST

/* GDN inputs for T tokens: q, k (normalised, q scaled) [T, Hk, dk], v
 * [T, Hv, dv], the gates' β and α [T, Hv] from random b, a and per-head
 * A_log (shifted by a_shift) and dt_bias; the raw b, a, A_log, dt_bias too. */
typedef struct gdn_in {
    float *q, *k, *v, *b, *a, *Al, *dt, *beta, *alpha;
} gdn_in;

static gdn_in gdn_inputs(long T, long Hk, long Hv, long dk, long dv, int act, float al_scale, float al_shift)
{
    gdn_in g;
    g.q = rvec(T * Hk * dk, 1.0f, act), g.k = rvec(T * Hk * dk, 1.0f, act);
    g.v = rvec(T * Hv * dv, 1.0f, act);
    g.b = rvec(T * Hv, 3.0f, act), g.a = rvec(T * Hv, 3.0f, act);
    g.Al = rvec(Hv, 1.0f, 1), g.dt = rvec(Hv, 1.0f, 1);
    for (long i = 0; i < Hv; i++) g.Al[i] = al_shift + al_scale * g.Al[i];
    g.beta = malloc(sizeof(float) * (size_t)(T * Hv)), g.alpha = malloc(sizeof(float) * (size_t)(T * Hv));
    ls_cpu_gdn_gates(g.b, g.a, g.Al, g.dt, g.beta, g.alpha, T, Hv, act);
    return g;
}

static void gdn_normalise(gdn_in *g, long T, long Hk, long dk)
{
    ls_cpu_l2norm_scale(g->q, T * Hk, dk, ls_cpu_inv_sqrt_scale(dk), LS_ORDER_CANONICAL);
    ls_cpu_l2norm_scale(g->k, T * Hk, dk, 1.0f, LS_ORDER_CANONICAL);
}

static void gdn_free(gdn_in *g)
{
    free(g->q), free(g->k), free(g->v), free(g->b), free(g->a), free(g->Al), free(g->dt), free(g->beta);
    free(g->alpha);
}

START_TEST(test_gdn)
{
    long T = 5, Hk = 2, Hv = 4, dk = 48, dv = 40;
    for (int act = 0; act < 2; act++) {
        gdn_in g = gdn_inputs(T, Hk, Hv, dk, dv, act, 1.0f, 0.0f);
        float *q = g.q, *k = g.k, *v = g.v, *b = g.b, *a = g.a, *Al = g.Al, *dt = g.dt, *beta = g.beta,
              *alpha = g.alpha;
        for (long i = 0; i < T * Hv; i++) {
            float wb = A(1.0f / (1.0f + ls_expf(-b[i])), act);
            float sp_in = a[i] + dt[i % Hv];
            float sp = sp_in > 20.0f ? sp_in : ls_log1pf(ls_expf(sp_in));
            float g = -ls_expf(Al[i % Hv]) * sp;
            expect_bits("beta", &beta[i], &wb, 1);
            float wa = ls_expf(g);
            expect_bits("alpha", &alpha[i], &wa, 1);
        }
        gdn_normalise(&g, T, Hk, dk);
        float *S = calloc((size_t)(Hv * dk * dv), sizeof(float)), *S2 = calloc((size_t)(Hv * dk * dv), sizeof(float));
        float *Sw = calloc((size_t)(Hv * dk * dv), sizeof(float));
        float *o = malloc(sizeof(float) * (size_t)(T * Hv * dv)), *o2 = malloc(sizeof(float) * (size_t)(T * Hv * dv));
        float *want = malloc(sizeof(float) * (size_t)(T * Hv * dv));
        float *scr = malloc(sizeof(float) * LS_CPU_GDN_SCRATCH_FLOATS(dv));
        ls_cpu_gdn_recurrent(q, k, v, alpha, beta, S, o, T, Hk, Hv, dk, dv, scr, act, LS_ORDER_CANONICAL);
        /* Token by token, heads split in two calls: same bits. */
        for (long t = 0; t < T; t++) {
            float *oo = o2 + t * Hv * dv;
            ls_cpu_gdn_recurrent_heads(q + t * Hk * dk, k + t * Hk * dk, v + t * Hv * dv, alpha + t * Hv,
                                       beta + t * Hv, S2, oo, 1, Hk, Hv, dk, dv, 0, 1, scr, act,
                                       LS_ORDER_CANONICAL);
            ls_cpu_gdn_recurrent_heads(q + t * Hk * dk, k + t * Hk * dk, v + t * Hv * dv, alpha + t * Hv,
                                       beta + t * Hv, S2, oo, 1, Hk, Hv, dk, dv, 1, Hv, scr, act,
                                       LS_ORDER_CANONICAL);
        }
        free(scr);
        /* Transcription of the table row, element by element. */
        float mm[64], u[64];
        for (long t = 0; t < T; t++)
            for (long h = 0; h < Hv; h++) {
                long kh = h * Hk / Hv;
                float *Sh = Sw + h * dk * dv;
                const float *kt = k + (t * Hk + kh) * dk, *qt = q + (t * Hk + kh) * dk;
                float al = alpha[t * Hv + h], be = beta[t * Hv + h];
                for (long e = 0; e < dk * dv; e++) Sh[e] = al * Sh[e];
                for (long j = 0; j < dv; j++) mm[j] = dot32(Sh + j, dv, kt, 1, dk);
                for (long j = 0; j < dv; j++) {
                    float d = v[(t * Hv + h) * dv + j] - mm[j];
                    u[j] = d * be;
                }
                for (long i = 0; i < dk; i++)
                    for (long j = 0; j < dv; j++) {
                        float prod = kt[i] * u[j];
                        Sh[i * dv + j] = Sh[i * dv + j] + prod;
                    }
                for (long j = 0; j < dv; j++) want[(t * Hv + h) * dv + j] = A(dot32(Sh + j, dv, qt, 1, dk), act);
            }
        expect_bits("gdn out", o, want, T * Hv * dv);
        expect_bits("gdn out token by token", o2, want, T * Hv * dv);
        expect_bits("gdn state", S, Sw, Hv * dk * dv);
        expect_bits("gdn state token by token", S2, Sw, Hv * dk * dv);
        gdn_free(&g);
        free(S), free(S2), free(Sw), free(o), free(o2), free(want);
    }
}
END_TEST

/* The chunk-aligned GDN form (docs/numerics.md §5.1) over 150 tokens (two
 * full chunks of 64 and 22 rows): the outputs and the whole carried state
 * (S at the chunk start and the chunk's rows) are bit-identical whether the
 * tokens come in one call, one at a time or in runs of 7 and 13, with the
 * heads split over two calls; they equal a transcription of the rows'
 * formulas; the state materialised after each position is within fp32
 * rounding of the recurrent form's state there, and the outputs of the two
 * forms agree to rounding; after a chunk's last row the materialised state is
 * the carried S bit for bit. */
START_TEST(test_gdn_chunked)
{
    const long T = 150, Hk = 2, Hv = 4, dk = 48, dv = 40, C = LS_GDN_CHUNK;
    const size_t SF = LS_GDN_CHUNK_STATE_FLOATS(Hv, dk, dv), SN = (size_t)(Hv * dk * dv);
    for (int act = 0; act < 2; act++) {
        gdn_in g = gdn_inputs(T, Hk, Hv, dk, dv, act, 0.25f, -2.0f); /* decays near 1, as trained */
        gdn_normalise(&g, T, Hk, dk);
        const float *q = g.q, *k = g.k, *v = g.v, *beta = g.beta, *alpha = g.alpha;
        float *scr = malloc(sizeof(float) * LS_CPU_GDN_CHUNK_SCRATCH_FLOATS(dv));
        float *st1 = calloc(SF, sizeof(float)), *st2 = calloc(SF, sizeof(float)), *st3 = calloc(SF, sizeof(float));
        size_t on = (size_t)(T * Hv * dv);
        float *o1 = malloc(sizeof(float) * on), *o2 = malloc(sizeof(float) * on), *o3 = malloc(sizeof(float) * on);
        float *orec = malloc(sizeof(float) * on), *want = malloc(sizeof(float) * on);
        float *Srec = calloc(SN, sizeof(float)), *mat = malloc(sizeof(float) * SN);
        float *rscr = malloc(sizeof(float) * LS_CPU_GDN_SCRATCH_FLOATS(dv));
        /* one call */
        ls_cpu_gdn_chunked_heads(q, k, v, alpha, beta, st1, o1, T, 0, Hk, Hv, dk, dv, 0, Hv, scr, act,
                                 LS_ORDER_CANONICAL);
        /* one token a call, heads in two calls; the recurrent form beside it */
        double max_state_rel = 0;
        for (long t = 0; t < T; t++) {
            const float *qt = q + t * Hk * dk, *kt = k + t * Hk * dk, *vt = v + t * Hv * dv;
            for (int part = 0; part < 2; part++)
                ls_cpu_gdn_chunked_heads(qt, kt, vt, alpha + t * Hv, beta + t * Hv, st2, o2 + t * Hv * dv, 1, t, Hk,
                                         Hv, dk, dv, part ? 1 : 0, part ? Hv : 1, scr, act, LS_ORDER_CANONICAL);
            ls_cpu_gdn_recurrent(qt, kt, vt, alpha + t * Hv, beta + t * Hv, Srec, orec + t * Hv * dv, 1, Hk, Hv, dk,
                                 dv, rscr, act, LS_ORDER_CANONICAL);
            ls_cpu_gdn_chunked_state_heads(st2, t, Hv, dk, dv, 0, Hv, mat, scr);
            if ((t + 1) % C == 0) expect_bits("materialised state at a chunk's end = S", mat, st2, (long)SN);
            double num = 0, den = 0;
            for (size_t e = 0; e < SN; e++) {
                double d = (double)mat[e] - Srec[e];
                num += d * d, den += (double)Srec[e] * Srec[e];
            }
            double rel = sqrt(num / (den > 0 ? den : 1));
            if (rel > max_state_rel) max_state_rel = rel;
        }
        ck_assert_msg(max_state_rel < 1e-5, "materialised state vs recurrent: relative error %g", max_state_rel);
        /* runs of 7 and 13 */
        for (long t = 0, n = 7; t < T; t += n, n = n == 7 ? 13 : 7) {
            long m = t + n > T ? T - t : n;
            ls_cpu_gdn_chunked_heads(q + t * Hk * dk, k + t * Hk * dk, v + t * Hv * dv, alpha + t * Hv, beta + t * Hv,
                                     st3, o3 + t * Hv * dv, m, t, Hk, Hv, dk, dv, 0, Hv, scr, act, LS_ORDER_CANONICAL);
        }
        expect_bits("chunked out, token by token", o2, o1, (long)on);
        expect_bits("chunked out, runs of 7 and 13", o3, o1, (long)on);
        expect_bits("chunked state, token by token", st2, st1, (long)SF);
        expect_bits("chunked state, runs of 7 and 13", st3, st1, (long)SF);
        /* transcription of the row formulas (cpu_ops.h), head by head */
        float *S0 = calloc(SN, sizeof(float)), *U = malloc(sizeof(float) * (size_t)(C * dv)), d[64];
        for (long h = 0; h < Hv; h++) {
            long kh = h * Hk / Hv;
            float *Sh = S0 + h * dk * dv;
            for (long t = 0; t < T; t++) {
                long r = t % C, c0 = t - r;
                const float *kr = k + (t * Hk + kh) * dk, *qr = q + (t * Hk + kh) * dk;
                d[r] = 1.0f;
                for (long s2 = r - 1; s2 >= 0; s2--) d[s2] = d[s2 + 1] * alpha[(c0 + s2 + 1) * Hv + h];
                float P = d[0] * alpha[c0 * Hv + h], be = beta[t * Hv + h];
                for (long j = 0; j < dv; j++) {
                    float m0 = dot32(Sh + j, dv, kr, 1, dk), pm = P * m0, df = v[(t * Hv + h) * dv + j] - pm;
                    U[r * dv + j] = df * be;
                }
                for (long s2 = 0; s2 < r; s2++) {
                    float kk = dot32(kr, 1, k + ((c0 + s2) * Hk + kh) * dk, 1, dk), aa = kk * d[s2], Ars = be * aa;
                    for (long j = 0; j < dv; j++) {
                        float prod = Ars * U[s2 * dv + j];
                        U[r * dv + j] = U[r * dv + j] - prod;
                    }
                }
                for (long j = 0; j < dv; j++) {
                    float acc = P * dot32(Sh + j, dv, qr, 1, dk);
                    for (long s2 = 0; s2 <= r; s2++) {
                        float qk = dot32(qr, 1, k + ((c0 + s2) * Hk + kh) * dk, 1, dk), w = qk * d[s2];
                        float prod = w * U[s2 * dv + j];
                        acc = acc + prod;
                    }
                    want[(t * Hv + h) * dv + j] = A(acc, act);
                }
                if (r == C - 1) {
                    for (long e = 0; e < dk * dv; e++) Sh[e] = P * Sh[e];
                    for (long s2 = 0; s2 <= r; s2++)
                        for (long i = 0; i < dk; i++) {
                            float ki = d[s2] * k[((c0 + s2) * Hk + kh) * dk + i];
                            for (long j = 0; j < dv; j++) {
                                float prod = ki * U[s2 * dv + j];
                                Sh[i * dv + j] = Sh[i * dv + j] + prod;
                            }
                        }
                }
            }
        }
        expect_bits("chunked out = the transcription", o1, want, (long)on);
        expect_bits("chunked S at the last chunk start = the transcription", st1, S0, (long)SN);
        /* the two forms agree to rounding (bf16 outputs: a few ulps) */
        double worst = 0;
        for (size_t i = 0; i < on; i++) {
            double dd = fabs((double)o1[i] - orec[i]) / (fabs((double)orec[i]) + 1e-3);
            if (dd > worst) worst = dd;
        }
        printf("  chunk-aligned vs recurrent (%s): state rel err %.3g, outputs max rel diff %.3g\n",
               act ? "bf16" : "fp32", max_state_rel, worst);
        ck_assert_msg(worst < (act ? 2e-2 : 1e-4), "chunk-aligned vs recurrent outputs: relative difference %g (%s)",
                      worst, act ? "bf16" : "fp32");
        gdn_free(&g);
        free(scr), free(st1), free(st2), free(st3), free(o1), free(o2), free(o3), free(orec), free(want), free(Srec), free(mat);
        free(rscr), free(S0), free(U);
    }
}
END_TEST

START_TEST(test_rope)
{
    long T = 3, H = 2, d = 16, R = 8, half = 4;
    int32_t pos[3] = {0, 7, 300};
    for (int act = 0; act < 2; act++) {
        float cs[12], sn[12];
        ls_cpu_rope_table(pos, T, R, 1e7, cs, sn, act);
        for (long t = 0; t < T; t++)
            for (long j = 0; j < half; j++) {
                float inv = (float)pow(1e7, -2.0 * (double)j / (double)R);
                float ang = (float)pos[t] * inv;
                float c = A((float)cos((double)ang), act), s = A((float)sin((double)ang), act);
                expect_bits("cos", &cs[t * half + j], &c, 1);
                expect_bits("sin", &sn[t * half + j], &s, 1);
            }
        float *x = rvec(T * H * d, 2.0f, act);
        float *y = malloc(sizeof(float) * (size_t)(T * H * d));
        memcpy(y, x, sizeof(float) * (size_t)(T * H * d));
        float scr[96]; /* [R] */
        ck_assert_int_le(R, 96);
        ls_cpu_rope_apply(y, cs, sn, T, H, d, R, scr, act);
        float want[96];
        for (long t = 0; t < T; t++)
            for (long h = 0; h < H; h++)
                for (long i = 0; i < d; i++) {
                    const float *xr = x + (t * H + h) * d;
                    float w = xr[i];
                    if (i < R) {
                        float rot = i < half ? -xr[i + half] : xr[i - half];
                        float c = cs[t * half + i % half], s = sn[t * half + i % half];
                        w = A(A(xr[i] * c, act) + A(rot * s, act), act);
                    }
                    want[(t * H + h) * d + i] = w;
                }
        expect_bits("rope", y, want, T * H * d);
        free(x), free(y);
    }
}
END_TEST

/* Transcription of docs/numerics.md §4 for one query and head. */
static void att_ref(const float *q, const float *K, const float *V, long last, long d, int act,
                    float *o)
{
    float scale = (float)(1.0 / sqrt((double)d));
    float M = -INFINITY, l = 0.0f, acc[256] = {0};
    for (long b0 = 0; b0 <= last; b0 += 32) {
        long nb = last - b0 + 1 < 32 ? last - b0 + 1 : 32;
        float s[32], p[32], ones[32], col[32];
        float bm = -INFINITY;
        for (long j = 0; j < nb; j++) {
            s[j] = dot32(q, 1, K + (b0 + j) * d, 1, d) * scale;
            bm = fmaxf(bm, s[j]);
        }
        float Mn = fmaxf(M, bm);
        float c = M == -INFINITY ? 0.0f : ls_expf(M - Mn);
        for (long j = 0; j < nb; j++) p[j] = ls_expf(s[j] - Mn), ones[j] = 1.0f;
        float lc = l * c;
        l = lc + dot32(p, 1, ones, 1, nb);
        for (long i = 0; i < d; i++) {
            for (long j = 0; j < nb; j++) col[j] = V[(b0 + j) * d + i];
            float ac = acc[i] * c;
            acc[i] = ac + dot32(p, 1, col, 1, nb);
        }
        M = Mn;
    }
    for (long i = 0; i < d; i++) o[i] = A(acc[i] / l, act);
}

START_TEST(test_attention)
{
    long cap = 80, Hq = 4, Hkv = 2, d = 24, T = 70;
    for (int act = 0; act < 2; act++) {
        float *kc = rvec(Hkv * cap * d, 2.0f, act), *vc = rvec(Hkv * cap * d, 2.0f, act);
        float *q = rvec(T * Hq * d, 2.0f, act);
        int32_t pos[70];
        for (long t = 0; t < T; t++) pos[t] = (int32_t)(t + 3);
        float *o = malloc(sizeof(float) * (size_t)(T * Hq * d)), *o1 = malloc(sizeof(float) * (size_t)(Hq * d));
        float want[24], scr[24]; /* [d] */
        ls_cpu_attention(q, kc, vc, cap, pos, o, T, Hq, Hkv, d, scr, act, LS_ORDER_CANONICAL);
        for (long t = 0; t < T; t++) {
            /* One query alone (decode) = the same query among many (prefill). */
            ls_cpu_attention(q + t * Hq * d, kc, vc, cap, pos + t, o1, 1, Hq, Hkv, d, scr, act,
                             LS_ORDER_CANONICAL);
            expect_bits("attention single query", o1, o + t * Hq * d, Hq * d);
            for (long n = 0; n < Hq; n++) {
                long kvh = n * Hkv / Hq;
                att_ref(q + (t * Hq + n) * d, kc + kvh * cap * d, vc + kvh * cap * d, pos[t], d, act, want);
                expect_bits("attention", o + (t * Hq + n) * d, want, d);
            }
        }
        float g[8] = {-3, -1, 0, 0.5f, 1, 2, 7, -20}, ov[8], wv[8];
        for (int i = 0; i < 8; i++) ov[i] = wv[i] = A(frand(3), act);
        ls_cpu_sigmoid_gate(ov, g, 8, act);
        for (int i = 0; i < 8; i++) wv[i] = A(wv[i] * A(1.0f / (1.0f + ls_expf(-g[i])), act), act);
        expect_bits("sigmoid gate", ov, wv, 8);
        free(kc), free(vc), free(q), free(o), free(o1);
    }
}
END_TEST

START_TEST(test_router_moe)
{
    long E = 8, D = 40, I = 24, Is = 16, T = 3, k = 3;
    for (int act = 0; act < 2; act++) {
        uint16_t *wr = rbf16(E * D, 0.5f);
        /* Experts 2 and 5 get identical router rows: their probabilities tie
         * exactly and the lower index must come first. */
        memcpy(wr + 5 * D, wr + 2 * D, sizeof(uint16_t) * (size_t)D);
        ls_wmat router = {wr, LS_WTYPE_BF16, E, D, NULL, NULL, 0};
        float *x = rvec(T * D, 2.0f, act);
        float probs[24], wts[9];
        int32_t ids[9];
        ls_cpu_router(&router, x, T, k, 1, probs, ids, wts, act, LS_ORDER_CANONICAL);
        for (long t = 0; t < T; t++) {
            float r[8], m = -INFINITY, e[8];
            for (long i = 0; i < E; i++) {
                float row[40];
                for (long j = 0; j < D; j++) row[j] = ls_bf16_to_f32(wr[i * D + j]);
                r[i] = A(dot32(row, 1, x + t * D, 1, D), act);
                m = fmaxf(m, r[i]);
            }
            for (long i = 0; i < E; i++) e[i] = ls_expf(r[i] - m);
            float sum = dot32(e, 1, (float[8]){1, 1, 1, 1, 1, 1, 1, 1}, 1, E);
            float pi[8];
            for (long i = 0; i < E; i++) pi[i] = e[i] / sum;
            expect_bits("router probs", probs + t * E, pi, E);
            int used[8] = {0};
            float s = 0.0f;
            for (long i = 0; i < k; i++) {
                long best = -1;
                for (long j = 0; j < E; j++)
                    if (!used[j] && (best < 0 || pi[j] > pi[best])) best = j;
                used[best] = 1;
                ck_assert_int_eq(ids[t * k + i], best);
                s = s + pi[best];
            }
            for (long i = 0; i < k; i++) {
                float w = A(pi[ids[t * k + i]] / s, act);
                expect_bits("router weight", &wts[t * k + i], &w, 1);
            }
            for (long i = 0; i + 1 < k; i++)
                if (ids[t * k + i] == 5) ck_assert_msg(used[2], "tie broken towards expert 5");
        }
        /* MoE vs per-slot transcription. */
        ls_wmat g[8], u[8], dn[8];
        uint16_t *wg = rbf16(E * I * D, 0.3f), *wu = rbf16(E * I * D, 0.3f), *wd = rbf16(E * D * I, 0.3f);
        for (long e = 0; e < E; e++) {
            g[e] = (ls_wmat){wg + e * I * D, LS_WTYPE_BF16, I, D, NULL, NULL, 0};
            u[e] = (ls_wmat){wu + e * I * D, LS_WTYPE_BF16, I, D, NULL, NULL, 0};
            dn[e] = (ls_wmat){wd + e * D * I, LS_WTYPE_BF16, D, I, NULL, NULL, 0};
        }
        uint16_t *sg = rbf16(Is * D, 0.3f), *su = rbf16(Is * D, 0.3f), *sd = rbf16(D * Is, 0.3f), *sgw = rbf16(D, 0.3f);
        ls_wmat shg = {sg, LS_WTYPE_BF16, Is, D, NULL, NULL, 0}, shu = {su, LS_WTYPE_BF16, Is, D, NULL, NULL, 0}, shd = {sd, LS_WTYPE_BF16, D, Is, NULL, NULL, 0},
                shw = {sgw, LS_WTYPE_BF16, 1, D, NULL, NULL, 0};
        ls_moe_weights mw = {E, D, I, Is, g, u, dn, &shg, &shu, &shd, &shw};
        float *out = malloc(sizeof(float) * (size_t)(T * D));
        float *scratch = malloc(sizeof(float) * ((size_t)((k + 1) * D) + LS_CPU_EXPERT_SCRATCH(D, I)));
        ls_cpu_moe(&mw, x, ids, wts, k, out, 0, T, scratch, act, LS_ORDER_CANONICAL, LS_ORDER_CANONICAL);
        for (long t = 0; t < T; t++) {
            float c[3][40], sh[40], gg[24], uu[24], mm[24], row[40];
            for (long i = 0; i <= k; i++) {
                const ls_wmat *G = i < k ? &g[ids[t * k + i]] : &shg, *U = i < k ? &u[ids[t * k + i]] : &shu,
                              *Dn = i < k ? &dn[ids[t * k + i]] : &shd;
                long II = G->rows;
                for (long r = 0; r < II; r++) {
                    for (long j = 0; j < D; j++) row[j] = ls_wmat_at(G, r, j);
                    gg[r] = A(dot32(row, 1, x + t * D, 1, D), act);
                    for (long j = 0; j < D; j++) row[j] = ls_wmat_at(U, r, j);
                    uu[r] = A(dot32(row, 1, x + t * D, 1, D), act);
                    float sl = A(gg[r] / (1.0f + ls_expf(-gg[r])), act);
                    mm[r] = A(sl * uu[r], act);
                }
                float *dst = i < k ? c[i] : sh;
                for (long r = 0; r < D; r++) {
                    for (long j = 0; j < II; j++) row[j] = ls_wmat_at(Dn, r, j);
                    float y = A(dot32(row, 1, mm, 1, II), act);
                    dst[r] = i < k ? A(y * wts[t * k + i], act) : y;
                }
            }
            for (long j = 0; j < D; j++) row[j] = ls_bf16_to_f32(sgw[j]);
            float gam = A(1.0f / (1.0f + ls_expf(-A(dot32(row, 1, x + t * D, 1, D), act))), act);
            float want[40];
            for (long j = 0; j < D; j++) {
                float s = 0.0f;
                for (long i = 0; i < k; i++) s = s + c[i][j];
                want[j] = A(A(s, act) + A(gam * sh[j], act), act);
            }
            expect_bits("moe", out + t * D, want, D);
        }
        /* The perturbed combine order changes some bit somewhere in bf16 and
         * fp32 (with these inputs); the canonical result is unchanged by a
         * second call. */
        float *out2 = malloc(sizeof(float) * (size_t)(T * D));
        ls_cpu_moe(&mw, x, ids, wts, k, out2, 0, T, scratch, act, LS_ORDER_CANONICAL, LS_ORDER_CANONICAL);
        expect_bits("moe repeat", out2, out, T * D);
        free(wr), free(x), free(wg), free(wu), free(wd), free(sg), free(su), free(sd), free(sgw);
        free(out), free(out2), free(scratch);
    }
}
END_TEST

START_TEST(test_logprobs_topk)
{
    long V = 300;
    float *l = rvec(2 * V, 8.0f, 1), *lp = malloc(sizeof(float) * (size_t)(2 * V)), scr[300];
    l[17] = l[40] = 30.0f; /* a tie at the top */
    ls_cpu_logprobs(l, lp, 2, V, scr, LS_ORDER_CANONICAL);
    for (long r = 0; r < 2; r++) {
        float m = -INFINITY, e[300], ones[300];
        for (long v = 0; v < V; v++) m = fmaxf(m, l[r * V + v]);
        for (long v = 0; v < V; v++) e[v] = ls_expf(l[r * V + v] - m), ones[v] = 1.0f;
        float lse = m + ls_logf(dot32(e, 1, ones, 1, V));
        float want[300];
        for (long v = 0; v < V; v++) want[v] = l[r * V + v] - lse;
        expect_bits("logprobs", lp + r * V, want, V);
    }
    int32_t ids[5];
    float vals[5];
    ls_cpu_topk(lp, V, 5, ids, vals);
    ck_assert_int_eq(ids[0], 17);
    ck_assert_int_eq(ids[1], 40);
    for (int i = 0; i + 1 < 5; i++) ck_assert(vals[i] >= vals[i + 1]);
    free(l), free(lp);
}
END_TEST

START_TEST(test_reversed_order_differs)
{
    /* The perturbation must change bits on ordinary data, or the detection
     * tests would prove nothing. */
    float *a = rvec(512, 1.0f, 1), *b = rvec(512, 1.0f, 1);
    int differ = 0;
    for (int r = 0; r < 8; r++) {
        float c = ls_cpu_dot(a + r * 64, b + r * 64, 64, LS_ORDER_CANONICAL);
        float d = ls_cpu_dot(a + r * 64, b + r * 64, 64, LS_ORDER_REVERSED);
        differ += ls_f32_bits(c) != ls_f32_bits(d);
    }
    ck_assert_int_gt(differ, 0);
    free(a), free(b);
}
END_TEST

START_TEST(test_backend_threads)
{
    /* The CPU backend's linear and attention give the same bits with 1 and 3 threads. */
    long T = 4, in = 64, out = 37;
    uint16_t *wb = rbf16(out * in, 0.5f);
    float *x = rvec(T * in, 2.0f, 1);
    float res[2][148];
    for (int th = 0; th < 2; th++) {
        ls_backend *be;
        ls_error err;
        ck_assert_int_eq(ls_backend_cpu_create(th ? 3 : 1, &be, &err), LS_OK);
        ls_buf *wbuf, *xb, *yb;
        ck_assert_int_eq(be->wrap_weights(be, wb, sizeof(uint16_t) * (size_t)(out * in), LS_WTYPE_BF16, &wbuf, &err), LS_OK);
        ck_assert_int_eq(be->alloc(be, sizeof(float) * (size_t)(T * in), &xb, &err), LS_OK);
        ck_assert_int_eq(be->alloc(be, sizeof(float) * (size_t)(T * out), &yb, &err), LS_OK);
        ls_bweight w = {wbuf, 0, LS_WTYPE_BF16, out, in, NULL};
        ls_view xv = {xb, 0}, yv = {yb, 0};
        ck_assert_int_eq(be->upload(be, xv, x, sizeof(float) * (size_t)(T * in), &err), LS_OK);
        ck_assert_int_eq(be->linear(be, &w, xv, yv, T, 1, LS_ORDER_CANONICAL, &err), LS_OK);
        ck_assert_int_eq(be->download(be, res[th], yv, sizeof(float) * (size_t)(T * out), &err), LS_OK);
        /* Out-of-range transfers are refused, not performed. */
        ck_assert_int_ne(be->download(be, res[th], ls_view_at(yv, 1), sizeof(float) * (size_t)(T * out), &err), LS_OK);
        be->destroy(be);
    }
    expect_bits("linear threads", res[1], res[0], T * out);
    free(wb), free(x);
}
END_TEST

START_TEST(test_backend_digest)
{
    /* The digest op hashes exactly the canonical bytes: bf16 spans as 2 bytes
     * LE of each element's bf16, raw spans as 4 bytes LE, strided rows in order,
     * span 0 then span 1; same digests with 1 and 3 threads. */
    float v[3 * 4];
    for (int i = 0; i < 12; i++) v[i] = ls_round_bf16((float)(i - 5) * 0.375f + 0.0078125f * (float)i);
    ls_digest want[3], got[2][3];
    unsigned char bytes[64];
    size_t n = 0;
    for (int r = 0; r < 3; r++) /* job 0: rows 1..3 of each 4-element row, bf16 */
        for (int c = 1; c < 4; c++) {
            uint16_t h = ls_f32_to_bf16(v[r * 4 + c]);
            bytes[n++] = (unsigned char)(h & 0xff);
            bytes[n++] = (unsigned char)(h >> 8);
        }
    ls_error err;
    ck_assert_int_eq(ls_sha256_buf(bytes, n, &want[0], &err), LS_OK);
    n = 0;
    for (int i = 0; i < 5; i++) { /* job 1: v[0..1] raw then v[8..10] raw */
        uint32_t u = ls_f32_bits(v[i < 2 ? i : 6 + i]);
        for (int b = 0; b < 4; b++) bytes[n++] = (unsigned char)(u >> (8 * b));
    }
    ck_assert_int_eq(ls_sha256_buf(bytes, n, &want[1], &err), LS_OK);
    ck_assert_int_eq(ls_sha256_buf(bytes, 0, &want[2], &err), LS_OK); /* job 2: empty */
    for (int th = 0; th < 2; th++) {
        ls_backend *be;
        ck_assert_int_eq(ls_backend_cpu_create(th ? 3 : 1, &be, &err), LS_OK);
        ck_assert_ptr_nonnull(be->digest);
        ls_buf *b;
        ck_assert_int_eq(be->alloc(be, sizeof v, &b, &err), LS_OK);
        ls_view bv = {b, 0};
        ck_assert_int_eq(be->upload(be, bv, v, sizeof v, &err), LS_OK);
        ls_digest_job jobs[3];
        memset(jobs, 0, sizeof jobs);
        jobs[0].span[0] = (ls_digest_span){ls_view_at(bv, 1), 3, 3, 4, 1};
        jobs[1].span[0] = (ls_digest_span){bv, 1, 2, 2, 0};
        jobs[1].span[1] = (ls_digest_span){ls_view_at(bv, 8), 1, 3, 3, 0};
        for (int j = 0; j < 3; j++) jobs[j].out = &got[th][j];
        ck_assert_int_eq(be->digest(be, jobs, 3, &err), LS_OK);
        for (int j = 0; j < 3; j++)
            ck_assert_msg(ls_digest_equal(&got[th][j], &want[j]), "digest job %d (threads %d) differs", j,
                          th ? 3 : 1);
        /* A span beyond its buffer is refused. */
        jobs[0].span[0].rows = 4;
        ck_assert_int_ne(be->digest(be, jobs, 1, &err), LS_OK);
        be->destroy(be);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cpu_ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_linear);
    tcase_add_test(tc, test_norms);
    tcase_add_test(tc, test_conv_state_carry);
    tcase_add_test(tc, test_gdn);
    tcase_add_test(tc, test_gdn_chunked);
    tcase_add_test(tc, test_rope);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_router_moe);
    tcase_add_test(tc, test_logprobs_topk);
    tcase_add_test(tc, test_reversed_order_differs);
    tcase_add_test(tc, test_backend_threads);
    tcase_add_test(tc, test_backend_digest);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
