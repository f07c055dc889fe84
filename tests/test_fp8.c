/* FP8 block-quantised checkpoints on the CPU (docs/numerics.md §9,
 * docs/model.md §6b):
 *
 *   e4m3       every code decodes to its value; the encoder (RNE, saturating)
 *              agrees with a brute-force nearest-value search on every code,
 *              every midpoint and its neighbours, and a sweep of fp32 bit
 *              patterns; the named boundary values (448, 464, ties at the
 *              subnormal grid, infinities, NaN, −0);
 *   quantiser  group scale s = max|x| / 448 and each q = e4m3(x / s), the
 *              group maximum at ±448, zero groups and underflowing scales
 *              (s = 0, q = +0), NaN and infinities (NaN), a short last group;
 *   dots       dequant = DOT32 over the dequantised fp32 matrix, bit for bit;
 *              w8a8 = the written per-block order, against a reference
 *              written here from the documentation;
 *   checkpoint synth --fp8 holds the bf16 synth of the same seed quantised;
 *              both modes run, rollout = replay (the gate) and threads change
 *              no bit; the text-only layout gives the same records;
 *   refusals   a missing, wrongly shaped or non-F32 scale, an F8 tensor in a
 *              module listed as not converted (release and text-only names),
 *              quantization_config fields, an F8 router, a stray scale, F8
 *              without quantization_config, --fp8 on a BF16 checkpoint: exit
 *              2 naming the tensor or field;
 *   manifest   the FP8 mode and block size are pinned, a mode change voids. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <lockstep/lockstep.h>

#include "backend/cpu_ops.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "numerics/fp8.h"
#include "testutil.h"

static char *g_dir;
static char g_ck[4300];      /* synth qwen3.5-tiny --fp8, 2 layers (linear, full attention) */
static char g_ck4[4300];     /* the same, 4 layers (an attention layer too) */
static char g_bf[4300];      /* synth qwen3.5-tiny (bf16), same seed, per expert */
static char g_prompts[4300];

static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("fp8");
    char *out = NULL;
    snprintf(g_ck, sizeof g_ck, "%s/q35-fp8", g_dir);
    snprintf(g_ck4, sizeof g_ck4, "%s/q35-fp8-4", g_dir);
    snprintf(g_bf, sizeof g_bf, "%s/q35-bf16", g_dir);
    int rc = ls_test_cli(&out, "synth --preset qwen3.5-tiny --layers 2 --fp8 --seed 11 -o %s", g_ck);
    ck_assert_msg(rc == 0, "synth --fp8: %s", out);
    free(out);
    rc = ls_test_cli(&out, "synth --preset qwen3.5-tiny --fp8 --seed 11 -o %s", g_ck4);
    ck_assert_msg(rc == 0, "synth --fp8: %s", out);
    free(out);
    rc = ls_test_cli(&out, "synth --preset qwen3.5-tiny --expert-layout per-expert --seed 11 -o %s",
                     g_bf);
    ck_assert_msg(rc == 0, "synth: %s", out);
    free(out);
    snprintf(g_prompts, sizeof g_prompts, "%s/prompts.jsonl", g_dir);
    const char *jl = "{\"id\": 0, \"tokens\": [1, 2, 3, 400, 17]}\n{\"id\": 1, \"tokens\": [9]}\n"
                     "{\"id\": 2, \"tokens\": [5, 6, 7, 8, 9, 10, 11, 12]}\n";
    ls_test_write(g_prompts, jl, strlen(jl));
}

/* ---- e4m3 ------------------------------------------------------------------------------ */

/* The value of code b, from the format's definition (double arithmetic). */
static double e4m3_value(int b)
{
    int sign = b & 0x80 ? -1 : 1, e = (b >> 3) & 15, m = b & 7;
    if (e == 0) return sign * ldexp(m, -9);
    return sign * ldexp(1.0 + m / 8.0, e - 7);
}

/* Brute force: the nearest finite code to x (|x| above 448 saturates), ties
 * to the even code; NaN -> 0x7f with x's sign. */
static uint8_t e4m3_nearest(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return sign | 0x7f;
    double a = fabs((double)x);
    if (a >= 448.0) return sign | 0x7e;
    int best = 0;
    double bd = a;
    for (int c = 1; c <= 0x7e; c++) {
        double d = fabs(e4m3_value(c) - a);
        if (d < bd || (d == bd && (c & 1) == 0 && (best & 1))) {
            best = c;
            bd = d;
        }
    }
    return sign | (uint8_t)best;
}

static void expect_encode(float x, uint8_t want, const char *what)
{
    uint8_t got = ls_f32_to_e4m3(x);
    ck_assert_msg(got == want, "e4m3(%s = %.9g, bits 0x%08x) = 0x%02x, expected 0x%02x", what,
                  (double)x, ls_f32_bits(x), got, want);
}

START_TEST(test_e4m3_decode)
{
    for (int b = 0; b < 256; b++) {
        float v = ls_e4m3_to_f32((uint8_t)b);
        if ((b & 0x7f) == 0x7f) {
            ck_assert_msg(isnan(v) && !!signbit(v) == !!(b & 0x80), "code 0x%02x: 0x%08x, not NaN",
                          b, ls_f32_bits(v));
            continue;
        }
        float want = (float)e4m3_value(b);
        if (b == 0x80) want = -0.0f;
        ck_assert_msg(ls_f32_bits(v) == ls_f32_bits(want), "code 0x%02x: 0x%08x, expected 0x%08x",
                      b, ls_f32_bits(v), ls_f32_bits(want));
    }
    ck_assert(ls_e4m3_to_f32(0x7e) == 448.0f);
    ck_assert(ls_e4m3_to_f32(0x01) == 0x1p-9f);
    ck_assert(ls_e4m3_to_f32(0x08) == 0x1p-6f);
}
END_TEST

START_TEST(test_e4m3_encode)
{
    /* every code's value, every midpoint between neighbours (exact in fp32:
     * at most 5 significant bits) and the fp32 values beside it */
    for (int c = 0; c <= 0x7e; c++) {
        for (int s = 0; s < 2; s++) {
            float v = (float)e4m3_value(c) * (s ? -1.0f : 1.0f);
            expect_encode(v, (uint8_t)(c | (s ? 0x80 : 0)), "a code's value");
            if (c == 0x7e) continue;
            float mid = (float)((e4m3_value(c) + e4m3_value(c + 1)) / 2.0) * (s ? -1.0f : 1.0f);
            char what[64];
            snprintf(what, sizeof what, "midpoint after 0x%02x", c);
            expect_encode(mid, e4m3_nearest(mid), what);
            expect_encode(nextafterf(mid, 0.0f), e4m3_nearest(nextafterf(mid, 0.0f)), what);
            expect_encode(nextafterf(mid, s ? -INFINITY : INFINITY),
                          e4m3_nearest(nextafterf(mid, s ? -INFINITY : INFINITY)), what);
        }
    }
    /* a sweep of fp32 bit patterns from 0 to 2^10 and beyond */
    for (uint32_t u = 0; u < 0x45000000u; u += 7919u) {
        float x = ls_f32_from_bits(u);
        expect_encode(x, e4m3_nearest(x), "sweep");
        expect_encode(-x, e4m3_nearest(-x), "sweep");
    }
    /* named boundaries */
    expect_encode(448.0f, 0x7e, "448");
    expect_encode(464.0f, 0x7e, "464 (the tie with 480, saturated)");
    expect_encode(1e30f, 0x7e, "1e30");
    expect_encode(INFINITY, 0x7e, "+inf");
    expect_encode(-INFINITY, 0xfe, "-inf");
    expect_encode(NAN, 0x7f, "NaN");
    expect_encode(-0.0f, 0x80, "-0");
    expect_encode(0x1p-10f, 0x00, "2^-10 (tie between 0 and 2^-9, to even)");
    expect_encode(0x1.8p-9f, 0x02, "3 * 2^-10 (tie between codes 1 and 2)");
    expect_encode(0x1p-9f, 0x01, "2^-9");
    expect_encode(0x1.ep-7f, 0x08, "15 * 2^-10 (tie between 7 * 2^-9 and 2^-6)");
    expect_encode(1e-45f, 0x00, "an fp32 subnormal");
    expect_encode(0x1.1p0f, 0x38, "1 + 1/16 (tie between 1 and 1.125, to even)");
    expect_encode(0x1.3p0f, 0x3a, "1 + 3/16 (tie between 1.125 and 1.25, to even)");
}
END_TEST

/* Denser than the sweep: for every sign, exponent and leading mantissa bits
 * (the top 12 bits), the dropped 20 bits at the rounding boundaries and
 * between them; and every 97th pattern of the subnormal grid's range and just
 * above it (2^-11 .. 2^-5), where the remainder decides. */
START_TEST(test_e4m3_encode_dense)
{
    static const uint32_t low[] = {0, 1, 0x40000, 0x7ffff, 0x80000, 0x80001, 0xc0000, 0xfffff};
    for (uint32_t top = 0; top < 4096; top++)
        for (size_t i = 0; i < sizeof low / sizeof low[0]; i++) {
            float x = ls_f32_from_bits(top << 20 | low[i]);
            expect_encode(x, e4m3_nearest(x), "dense");
        }
    for (uint32_t u = 0x3a000000u; u < 0x3d000000u; u += 97u) {
        float x = ls_f32_from_bits(u);
        expect_encode(x, e4m3_nearest(x), "subnormal range");
    }
}
END_TEST

/* ---- the activation quantiser ----------------------------------------------------------- */

START_TEST(test_quant_group)
{
    float x[133], q[133], s[2];
    uint64_t r = 7;
    for (int i = 0; i < 133; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)(int32_t)(r >> 40) - 8388608.0f) / 4194304.0f; /* (-2, 2) */
    }
    x[17] = -3.5f; /* the first group's maximum */
    x[130] = 0.75f;
    ls_fp8_quant_row(x, 133, q, s);
    float m0 = 3.5f, m1 = 0.0f;
    for (int i = 128; i < 133; i++) m1 = fabsf(x[i]) > m1 ? fabsf(x[i]) : m1;
    ck_assert_msg(s[0] == m0 / 448.0f && s[1] == m1 / 448.0f, "scales %a %a", (double)s[0],
                  (double)s[1]);
    for (int i = 0; i < 133; i++) {
        float sc = s[i / 128];
        float want = ls_e4m3_to_f32(e4m3_nearest(x[i] / sc));
        ck_assert_msg(ls_f32_bits(q[i]) == ls_f32_bits(want), "q[%d] = 0x%08x, expected 0x%08x", i,
                      ls_f32_bits(q[i]), ls_f32_bits(want));
    }
    ck_assert(q[17] == -448.0f); /* the maximum lands on the largest code */

    /* zero group (either sign of zero): s = 0, every q = +0 */
    float z[128], zq[128];
    for (int i = 0; i < 128; i++) z[i] = (i & 1) ? -0.0f : 0.0f;
    zq[5] = 1.0f;
    float zs = ls_fp8_quant_group(z, 128, zq);
    ck_assert(ls_f32_bits(zs) == 0);
    for (int i = 0; i < 128; i++) ck_assert_msg(ls_f32_bits(zq[i]) == 0, "zero group q[%d]", i);
    /* a scale that underflows to 0: the same */
    z[3] = 1e-44f;
    zs = ls_fp8_quant_group(z, 128, zq);
    ck_assert(ls_f32_bits(zs) == 0 && ls_f32_bits(zq[3]) == 0);
    /* a subnormal but nonzero scale is used as it is */
    z[3] = 1e-40f;
    zs = ls_fp8_quant_group(z, 128, zq);
    ck_assert(zs == 1e-40f / 448.0f && zs > 0.0f && zq[3] == 448.0f);
    /* NaN or an infinity: s = NaN and every q NaN */
    float nx[4] = {1.0f, NAN, 2.0f, 0.0f}, nq[4];
    ck_assert(isnan(ls_fp8_quant_group(nx, 4, nq)));
    for (int i = 0; i < 4; i++) ck_assert(isnan(nq[i]));
    nx[1] = -INFINITY;
    ck_assert(isnan(ls_fp8_quant_group(nx, 4, nq)));
    for (int i = 0; i < 4; i++) ck_assert(isnan(nq[i]));
}
END_TEST

/* ---- dot products ------------------------------------------------------------------------ */

#define DR 129
#define DC 257

static uint8_t g_w8[DR * DC];
static float g_ws[2 * 3];

static void make_matrix(void)
{
    uint64_t r = 99;
    for (int i = 0; i < DR * DC; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        uint8_t b = (uint8_t)(r >> 56);
        g_w8[i] = (b & 0x7f) == 0x7f ? 0x00 : b; /* no NaN codes */
    }
    for (int i = 0; i < 6; i++) g_ws[i] = 0x1p-10f * (float)(i + 3);
}

START_TEST(test_dot_dequant)
{
    make_matrix();
    static float wf[DR * DC], x[DC];
    for (int r = 0; r < DR; r++)
        for (int c = 0; c < DC; c++)
            wf[r * DC + c] = ls_e4m3_to_f32(g_w8[r * DC + c]) * g_ws[(r / 128) * 3 + c / 128];
    for (int c = 0; c < DC; c++) x[c] = ls_round_bf16(sinf((float)c * 0.37f) * 3.0f);
    ls_wmat f8 = {g_w8, LS_WTYPE_F8_DEQUANT, DR, DC, g_ws, NULL, 0};
    ls_wmat f32 = {wf, LS_WTYPE_F32, DR, DC, NULL, NULL, 0};
    for (int o = 0; o < 2; o++)
        for (int r = 0; r < DR; r++) {
            float a = ls_cpu_dot_wrow(&f8, r, x, (ls_order)o);
            float b = ls_cpu_dot_wrow(&f32, r, x, (ls_order)o);
            ck_assert_msg(ls_f32_bits(a) == ls_f32_bits(b),
                          "order %d row %d: dequant 0x%08x, fp32 matrix 0x%08x", o, r,
                          ls_f32_bits(a), ls_f32_bits(b));
            ck_assert(ls_f32_bits(ls_wmat_at(&f8, r, 200)) == ls_f32_bits(wf[r * DC + 200]));
        }
}
END_TEST

/* The w8a8 dot as docs/numerics.md §9 writes it. */
static float w8a8_doc(const uint8_t *w, const float *srow, const float *q, const float *xs, long n)
{
    float acc = 0.0f;
    for (long b = 0; b * 128 < n; b++) {
        float p[32] = {0};
        for (long k = b * 128; k < n && k < b * 128 + 128; k++) {
            float prod = ls_e4m3_to_f32(w[k]) * q[k];
            p[(k - b * 128) % 32] = p[(k - b * 128) % 32] + prod;
        }
        for (int s = 16; s >= 1; s /= 2)
            for (int l = 0; l < s; l++) p[l] = p[l] + p[l + s];
        float sc = xs[b] * srow[b];
        float part = p[0] * sc;
        acc = acc + part;
    }
    return acc;
}

START_TEST(test_dot_w8a8)
{
    make_matrix();
    static float x[3 * DC], q[3 * DC], xs[3 * 3];
    for (int c = 0; c < 3 * DC; c++) x[c] = cosf((float)c * 0.11f) * (c % 7 == 0 ? 40.0f : 1.0f);
    for (int c = 0; c < 128; c++) x[DC + 128 + c] = 0.0f; /* token 1's middle group: zero */
    ls_cpu_fp8_quant_act(x, 3, DC, q, xs);
    ck_assert(xs[3 + 1] == 0.0f);
    ls_wmat w = {g_w8, LS_WTYPE_F8_W8A8, DR, DC, g_ws, NULL, 0};
    static float y[3 * DR];
    ls_cpu_linear_q(&w, q, xs, y, 3, 0, DR, 0, LS_ORDER_CANONICAL);
    int differs = 0;
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < DR; r++) {
            float want = w8a8_doc(g_w8 + r * DC, g_ws + (r / 128) * 3, q + t * DC, xs + t * 3, DC);
            ck_assert_msg(ls_f32_bits(y[t * DR + r]) == ls_f32_bits(want),
                          "token %d row %d: 0x%08x, expected 0x%08x", t, r,
                          ls_f32_bits(y[t * DR + r]), ls_f32_bits(want));
            ls_wmat dq = w;
            dq.wtype = LS_WTYPE_F8_DEQUANT;
            differs += ls_f32_bits(ls_cpu_dot_wrow(&dq, r, x + t * DC, LS_ORDER_CANONICAL)) !=
                       ls_f32_bits(want);
        }
    ck_assert_msg(differs > DR, "w8a8 equals dequant on %d of %d outputs", 3 * DR - differs, 3 * DR);
    /* reversed (the perturbation): another order, other bits somewhere */
    int rev = 0;
    for (int r = 0; r < DR; r++)
        rev += ls_f32_bits(ls_cpu_dot_wrow_q(&w, r, q, xs, LS_ORDER_REVERSED)) !=
               ls_f32_bits(y[r]);
    ck_assert(rev > 0);
}
END_TEST

/* ---- checkpoints ------------------------------------------------------------------------ */

typedef struct add_spec {
    const char *name;          /* stored name */
    const char *dtype;
    int ndim;
    int64_t shape[3];
    const void *data;
} add_spec;

/* Copies checkpoint src to dst: tensors named in drop left out, add[] added,
 * config.json replaced by cfg when given; text_only: names
 * model.language_model.X become model.X. */
static void rewrite(const char *src, const char *dst, const char *const *drop, const add_spec *add,
                    int n_add, const json_t *cfg, int text_only)
{
    ls_error err;
    ls_checkpoint *ck;
    ck_assert_msg(ls_checkpoint_open(src, &ck, &err) == LS_OK, "%s", err.msg);
    mkdir(dst, 0777);
    ls_safetensors_writer *w;
    ck_assert(ls_safetensors_writer_new(&w, &err) == LS_OK);
    char (*names)[256] = calloc(ls_checkpoint_count(ck), 256);
    for (size_t i = 0; i < ls_checkpoint_count(ck); i++) {
        const ls_tensor *t = ls_checkpoint_at(ck, i);
        int skip = 0;
        for (int d = 0; drop && drop[d]; d++) skip |= strcmp(drop[d], t->stored_name) == 0;
        if (skip) continue;
        snprintf(names[i], 256, "%s", text_only ? t->name : t->stored_name);
        ck_assert_msg(ls_safetensors_writer_add(w, names[i], t->dtype, t->ndim, t->shape, t->data,
                                                &err) == LS_OK, "%s", err.msg);
    }
    for (int a = 0; a < n_add; a++) {
        ls_dtype dt;
        ck_assert(ls_dtype_parse(add[a].dtype, &dt) == 0);
        ck_assert_msg(ls_safetensors_writer_add(w, add[a].name, dt, add[a].ndim, add[a].shape,
                                                add[a].data, &err) == LS_OK, "%s", err.msg);
    }
    char path[4600];
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    ck_assert_msg(ls_safetensors_writer_write(w, path, &err) == LS_OK, "%s", err.msg);
    ls_safetensors_writer_free(w);
    free(names);
    size_t len;
    const char *raw = ls_checkpoint_config_text(ck, &len);
    char *text = cfg ? json_dumps(cfg, JSON_INDENT(2) | JSON_SORT_KEYS) : strndup(raw, len);
    ls_test_write_text(dst, "config.json", text);
    free(text);
    ls_checkpoint_close(ck);
}

static json_t *load_config(const char *dir)
{
    char path[4600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *j;
    ls_error err;
    ck_assert_msg(ls_json_load_file(path, &j, &err) == LS_OK, "%s", err.msg);
    return j;
}

static json_t *jv(const char *text)
{
    json_error_t je;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &je);
    ck_assert_msg(v != NULL, "bad JSON value '%s'", text);
    return v;
}

static void expect_refused(const char *dir, const char *extra, const char *needle1,
                           const char *needle2)
{
    char *out = NULL;
    int rc = ls_test_cli(&out, "run --checkpoint %s --mode rollout --prompts %s "
                         "--max-new-tokens 2 %s -o %s/refused.trace", dir, g_prompts,
                         extra ? extra : "", g_dir);
    ck_assert_msg(rc == 2 && out && strstr(out, needle1) && (!needle2 || strstr(out, needle2)),
                  "%s: exit %d, expected 2 naming '%s'%s%s:\n%s", dir, rc, needle1,
                  needle2 ? " and " : "", needle2 ? needle2 : "", out ? out : "");
    free(out);
}

/* Runs a rollout of ck into <g_dir>/<name>.trace; returns the path (static). */
static const char *rollout(const char *ck, const char *name, const char *extra)
{
    static char path[4400];
    snprintf(path, sizeof path, "%s/%s.trace", g_dir, name);
    char *out = NULL;
    int rc = ls_test_cli(&out, "run --checkpoint %s --mode rollout --prompts %s "
                         "--max-new-tokens 6 %s -o %s", ck, g_prompts, extra ? extra : "", path);
    ck_assert_msg(rc == 0, "rollout %s: %s", name, out);
    free(out);
    return path;
}

static int compare(const char *a, const char *b)
{
    char *out = NULL;
    int rc = ls_test_cli(&out, "compare %s %s", a, b);
    free(out);
    return rc;
}

START_TEST(test_synth_is_quantised_bf16)
{
    setup();
    ls_error err;
    ls_checkpoint *f8, *bf;
    ck_assert_msg(ls_checkpoint_open(g_ck4, &f8, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_checkpoint_open(g_bf, &bf, &err) == LS_OK, "%s", err.msg);
    static const char *const names[] = {"model.layers.3.self_attn.q_proj",
                                        "model.layers.0.mlp.experts.5.down_proj",
                                        "model.layers.2.linear_attn.in_proj_qkv", NULL};
    for (int n = 0; names[n]; n++) {
        char wn[256], sn[256];
        snprintf(wn, sizeof wn, "%s.weight", names[n]);
        snprintf(sn, sizeof sn, "%s.weight_scale_inv", names[n]);
        const ls_tensor *q = ls_checkpoint_find(f8, wn), *s = ls_checkpoint_find(f8, sn);
        const ls_tensor *b = ls_checkpoint_find(bf, wn);
        ck_assert_msg(q && s && b, "%s", names[n]);
        ck_assert_int_eq(q->dtype, LS_DTYPE_F8_E4M3);
        ck_assert_int_eq(s->dtype, LS_DTYPE_F32);
        long R = (long)q->shape[0], C = (long)q->shape[1], BC = LS_FP8_BLOCKS(C);
        ck_assert(s->shape[0] == LS_FP8_BLOCKS(R) && s->shape[1] == BC);
        /* each block's scale: the largest magnitude of its bf16 values / 448 */
        for (long bi = 0; bi < LS_FP8_BLOCKS(R); bi++)
            for (long bj = 0; bj < BC; bj++) {
                float amax = 0.0f, sc;
                for (long r = bi * 128; r < R && r < (bi + 1) * 128; r++)
                    for (long c = bj * 128; c < C && c < (bj + 1) * 128; c++) {
                        uint16_t h;
                        memcpy(&h, (const char *)b->data + 2 * (r * C + c), 2);
                        amax = fmaxf(amax, fabsf(ls_bf16_to_f32(h)));
                    }
                memcpy(&sc, (const char *)s->data + 4 * (bi * BC + bj), 4);
                ck_assert_msg(sc == amax / 448.0f, "%s block [%ld, %ld]: scale %a, amax %a", sn, bi, bj,
                              (double)sc, (double)amax);
            }
        for (long r = 0; r < R; r++)
            for (long c = 0; c < C; c++) {
                uint16_t h;
                float sc;
                memcpy(&h, (const char *)b->data + 2 * (r * C + c), 2);
                memcpy(&sc, (const char *)s->data + 4 * ((r / 128) * BC + c / 128), 4);
                uint8_t want = e4m3_nearest(ls_bf16_to_f32(h) / sc);
                uint8_t got = ((const uint8_t *)q->data)[r * C + c];
                ck_assert_msg(got == want, "%s [%ld, %ld]: 0x%02x, expected 0x%02x", wn, r, c, got,
                              want);
            }
    }
    /* routers, shared expert gates, in_proj_a/b and lm_head stay bf16 */
    ck_assert_int_eq(ls_checkpoint_find(f8, "model.layers.0.mlp.gate.weight")->dtype, LS_DTYPE_BF16);
    ck_assert_int_eq(ls_checkpoint_find(f8, "model.layers.0.linear_attn.in_proj_a.weight")->dtype,
                     LS_DTYPE_BF16);
    ck_assert_int_eq(ls_checkpoint_find(f8, "lm_head.weight")->dtype, LS_DTYPE_BF16);
    ls_checkpoint_close(f8);
    ls_checkpoint_close(bf);
}
END_TEST

START_TEST(test_modes_rollout_equals_replay)
{
    setup();
    static const char *const modes[] = {"dequant", "w8a8"};
    char a[4400], b[4400];
    for (int m = 0; m < 2; m++) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "gate --checkpoint %s --prompts %s --max-new-tokens 5 --fp8 %s",
                             g_ck4, g_prompts, modes[m]);
        ck_assert_msg(rc == 0, "gate --fp8 %s: exit %d\n%s", modes[m], rc, out);
        ck_assert_ptr_nonnull(strstr(out, "PASS: 5/5"));
        free(out);
    }
    /* dequant is the default; the two modes give other records; threads none */
    snprintf(a, sizeof a, "%s", rollout(g_ck4, "default", NULL));
    snprintf(b, sizeof b, "%s", rollout(g_ck4, "dequant", "--fp8 dequant"));
    ck_assert_int_eq(compare(a, b), 0);
    snprintf(b, sizeof b, "%s", rollout(g_ck4, "w8a8", "--fp8 w8a8"));
    ck_assert_int_eq(compare(a, b), 1);
    snprintf(a, sizeof a, "%s", rollout(g_ck4, "w8a8-t3", "--fp8 w8a8 --threads 3"));
    ck_assert_int_eq(compare(a, b), 0);
    /* a replay takes the rollout's mode; told another, it drifts */
    char *out = NULL;
    char rp[4400];
    snprintf(rp, sizeof rp, "%s/replay-w8a8.trace", g_dir);
    ck_assert_int_eq(ls_test_cli(&out, "run --checkpoint %s --mode replay --from %s --chunk 2 -o %s",
                                 g_ck4, b, rp), 0);
    free(out);
    ck_assert_int_eq(compare(b, rp), 0);
    ck_assert_int_eq(ls_test_cli(&out, "run --checkpoint %s --mode replay --from %s --fp8 dequant "
                                 "-o %s", g_ck4, b, rp), 0);
    free(out);
    ck_assert_int_eq(compare(b, rp), 1);
    /* the perturbation runs on FP8 experts too, and is seen */
    snprintf(a, sizeof a, "%s",
             rollout(g_ck4, "w8a8-pert", "--fp8 w8a8 --perturb layer=1,op=experts"));
    ck_assert_int_eq(compare(a, b), 1);
}
END_TEST

START_TEST(test_text_only_layout)
{
    setup();
    json_t *cfg = load_config(g_ck);
    json_t *text = json_deep_copy(json_object_get(cfg, "text_config"));
    json_object_set(text, "quantization_config", json_object_get(cfg, "quantization_config"));
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/text-only", g_dir);
    rewrite(g_ck, dir, NULL, NULL, 0, text, 1);
    char rel[4400];
    snprintf(rel, sizeof rel, "%s", rollout(g_ck, "release", "--fp8 w8a8"));
    const char *t = rollout(dir, "text-only", "--fp8 w8a8");
    ck_assert_int_eq(compare(rel, t), 0);
    /* the list's release names (model.language_model.) match text-only names */
    json_array_append_new(json_object_get(json_object_get(text, "quantization_config"),
                                          "modules_to_not_convert"),
                          json_string("model.language_model.layers.1.self_attn.o_proj"));
    snprintf(dir, sizeof dir, "%s/text-only-listed", g_dir);
    rewrite(g_ck, dir, NULL, NULL, 0, text, 1);
    expect_refused(dir, NULL, "tensor 'model.layers.1.self_attn.o_proj.weight' is F8_E4M3",
                   "modules_to_not_convert' lists its module ('model.language_model.layers.1."
                   "self_attn.o_proj')");
    json_decref(text);
    json_decref(cfg);
}
END_TEST

START_TEST(test_refusals)
{
    setup();
    char dir[4400];
    static float one[64];
    static uint16_t bfz[64 * 512];
    static uint8_t f8z[1000 * 128];
    for (int i = 0; i < 64; i++) one[i] = 1.0f;
    const char *pre = "model.language_model.layers.0.";
    char qkv[128], qkv_s[128], gate[128], gate_s[128];
    snprintf(qkv, sizeof qkv, "%slinear_attn.in_proj_qkv.weight", pre);
    snprintf(qkv_s, sizeof qkv_s, "%slinear_attn.in_proj_qkv.weight_scale_inv", pre);
    snprintf(gate, sizeof gate, "%smlp.gate.weight", pre);
    snprintf(gate_s, sizeof gate_s, "%smlp.gate.weight_scale_inv", pre);
    /* conv_dim = 2 * 2 * 32 + 4 * 32 = 256 rows, 128 columns: scale [2, 1] */

    /* the checkpoint itself runs */
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "run --checkpoint %s --mode rollout --prompts %s "
                                 "--max-new-tokens 2 -o %s/ok.trace", g_ck, g_prompts, g_dir), 0);
    free(out);

    /* a missing scale */
    const char *drop_s[] = {qkv_s, NULL};
    snprintf(dir, sizeof dir, "%s/no-scale", g_dir);
    rewrite(g_ck, dir, drop_s, NULL, 0, NULL, 0);
    expect_refused(dir, NULL, "tensor 'model.layers.0.linear_attn.in_proj_qkv.weight' is F8_E4M3 "
                   "but its block scale 'model.layers.0.linear_attn.in_proj_qkv.weight_scale_inv' "
                   "(F32 [2, 1]) is missing", NULL);
    /* a wrongly shaped one */
    add_spec bad = {qkv_s, "F32", 2, {1, 1, 0}, one};
    snprintf(dir, sizeof dir, "%s/scale-shape", g_dir);
    rewrite(g_ck, dir, drop_s, &bad, 1, NULL, 0);
    expect_refused(dir, NULL, "tensor 'model.layers.0.linear_attn.in_proj_qkv.weight_scale_inv' has "
                   "shape [1, 1], expected [2, 1]", NULL);
    add_spec flat = {qkv_s, "F32", 1, {2, 0, 0}, one};
    snprintf(dir, sizeof dir, "%s/scale-1d", g_dir);
    rewrite(g_ck, dir, drop_s, &flat, 1, NULL, 0);
    expect_refused(dir, NULL, "weight_scale_inv' has shape [2], expected [2, 1]", NULL);
    /* a scale that is not F32 */
    add_spec bfs = {qkv_s, "BF16", 2, {2, 1, 0}, bfz};
    snprintf(dir, sizeof dir, "%s/scale-bf16", g_dir);
    rewrite(g_ck, dir, drop_s, &bfs, 1, NULL, 0);
    expect_refused(dir, NULL, "in_proj_qkv.weight_scale_inv' has dtype BF16", "F32 block scales");

    /* an F8 tensor in a module listed as not converted */
    json_t *cfg = load_config(g_ck);
    json_t *qc = json_object_get(cfg, "quantization_config");
    json_array_append_new(json_object_get(qc, "modules_to_not_convert"),
                          json_string("model.language_model.layers.0.linear_attn.in_proj_qkv"));
    snprintf(dir, sizeof dir, "%s/listed", g_dir);
    rewrite(g_ck, dir, NULL, NULL, 0, cfg, 0);
    expect_refused(dir, NULL, "tensor 'model.layers.0.linear_attn.in_proj_qkv.weight' is F8_E4M3",
                   "modules_to_not_convert");
    json_decref(cfg);
    /* ... or a module above it */
    cfg = load_config(g_ck);
    json_array_append_new(json_object_get(json_object_get(cfg, "quantization_config"),
                                          "modules_to_not_convert"),
                          json_string("model.language_model.layers.1.mlp"));
    snprintf(dir, sizeof dir, "%s/listed-parent", g_dir);
    rewrite(g_ck, dir, NULL, NULL, 0, cfg, 0);
    expect_refused(dir, NULL, "is F8_E4M3, but config.json field "
                   "'quantization_config.modules_to_not_convert' lists its module "
                   "('model.language_model.layers.1.mlp')", NULL);
    json_decref(cfg);

    /* quantization_config fields */
    static const struct {
        const char *key, *value, *needle;
    } qcases[] = {
        {"quant_method", "\"gptq\"", "'quantization_config.quant_method' = 'gptq' is not supported"},
        {"quant_method", NULL, "'quantization_config.quant_method' is missing"},
        {"fmt", "\"e5m2\"", "'quantization_config.fmt' = 'e5m2' is not supported"},
        {"weight_block_size", "[128, 64]", "'quantization_config.weight_block_size' = [128, 64]"},
        {"weight_block_size", "[128]", "'quantization_config.weight_block_size' must be a list"},
        {"activation_scheme", "\"static\"", "'quantization_config.activation_scheme' = 'static'"},
        {"modules_to_not_convert", "\"lm_head\"", "'quantization_config.modules_to_not_convert' must"},
        {"modules_to_not_convert", "[\"lm_head\", 3]", "'quantization_config.modules_to_not_convert[1]'"},
        {"scale_fmt", "\"ue8m0\"", "'quantization_config.scale_fmt' = 'ue8m0'"},
        {"ignored_layers", "[]", "'quantization_config.ignored_layers' is not supported"},
    };
    for (size_t i = 0; i < sizeof qcases / sizeof qcases[0]; i++) {
        cfg = load_config(g_ck);
        qc = json_object_get(cfg, "quantization_config");
        if (qcases[i].value) json_object_set_new(qc, qcases[i].key, jv(qcases[i].value));
        else json_object_del(qc, qcases[i].key);
        snprintf(dir, sizeof dir, "%s/qc-%zu", g_dir, i);
        rewrite(g_ck, dir, NULL, NULL, 0, cfg, 0);
        expect_refused(dir, NULL, qcases[i].needle, NULL);
        json_decref(cfg);
    }
    /* F8 weights without a quantization_config */
    cfg = load_config(g_ck);
    json_object_del(cfg, "quantization_config");
    snprintf(dir, sizeof dir, "%s/no-qc", g_dir);
    rewrite(g_ck, dir, NULL, NULL, 0, cfg, 0);
    expect_refused(dir, NULL, "has dtype F8_E4M3 but config.json has no quantization_config", NULL);
    json_decref(cfg);

    /* an F8 router (the releases leave it unconverted) */
    const char *drop_g[] = {gate, NULL};
    add_spec f8g[2] = {{gate, "F8_E4M3", 2, {8, 128, 0}, f8z}, {gate_s, "F32", 2, {1, 1, 0}, one}};
    snprintf(dir, sizeof dir, "%s/f8-router", g_dir);
    rewrite(g_ck, dir, drop_g, f8g, 2, NULL, 0);
    expect_refused(dir, NULL, "tensor 'model.layers.0.mlp.gate.weight' has dtype F8_E4M3", NULL);
    /* a scale beside a bf16 weight */
    snprintf(dir, sizeof dir, "%s/stray-scale", g_dir);
    rewrite(g_ck, dir, NULL, &f8g[1], 1, NULL, 0);
    expect_refused(dir, NULL, "tensor 'model.layers.0.mlp.gate.weight_scale_inv'",
                   "the weight beside it is not F8_E4M3");
    /* a scale that is not finite */
    static float nan_s[2] = {1.0f, NAN};
    add_spec nanspec = {qkv_s, "F32", 2, {2, 1, 0}, nan_s};
    snprintf(dir, sizeof dir, "%s/scale-nan", g_dir);
    rewrite(g_ck, dir, drop_s, &nanspec, 1, NULL, 0);
    char *o2 = NULL;
    ck_assert_int_eq(ls_test_cli(&o2, "run --checkpoint %s --mode rollout --prompts %s "
                                 "--max-new-tokens 2 -o %s/nan.trace", dir, g_prompts, g_dir), 2);
    ck_assert_msg(o2 && strstr(o2, "in_proj_qkv.weight_scale_inv' element 1 is not finite"), "%s",
                  o2);
    free(o2);

    /* --fp8 on a checkpoint without FP8, and a bad value */
    expect_refused(g_bf, "--fp8 w8a8", "--fp8) applies to FP8 checkpoints only", NULL);
    expect_refused(g_ck, "--fp8 int8", "--fp8 'int8': expected dequant or w8a8", NULL);
}
END_TEST

/* ---- manifest ------------------------------------------------------------------------------ */

START_TEST(test_manifest_pins_mode)
{
    setup();
    char a[4400], b[4400], c[4400];
    snprintf(a, sizeof a, "%s/m-dequant.json", g_dir);
    snprintf(b, sizeof b, "%s/m-w8a8.json", g_dir);
    snprintf(c, sizeof c, "%s/m-default.json", g_dir);
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint %s --fp8 dequant -o %s", g_ck, a), 0);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint %s --fp8 w8a8 -o %s", g_ck, b), 0);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint %s -o %s", g_ck, c), 0);
    free(out);
    json_t *m;
    ls_error err;
    ck_assert_msg(ls_json_load_file(b, &m, &err) == LS_OK, "%s", err.msg);
    json_t *f = json_object_get(json_object_get(m, "numerics"), "fp8");
    ck_assert_str_eq(json_string_value(json_object_get(f, "mode")), "w8a8");
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(f, "weight_block_size"), 1)), 128);
    ck_assert_ptr_nonnull(json_object_get(json_object_get(json_object_get(m, "numerics"), "operators"),
                                          "fp8_act_quant"));
    json_decref(m);
    /* both validate against manifest/schema.json, which refuses another mode */
    const char *py = "import json,sys,jsonschema\n"
                     "s=json.load(open(sys.argv[1]))\n"
                     "v=jsonschema.Draft202012Validator(s)\n"
                     "for p in sys.argv[2:]: v.validate(json.load(open(p)))\n"
                     "bad=json.load(open(sys.argv[2])); bad['numerics']['fp8']['mode']='int8'\n"
                     "print('ok' if not v.is_valid(bad) else 'schema accepted fp8 mode int8')\n";
    char pyfile[4400];
    snprintf(pyfile, sizeof pyfile, "%s/schema-check.py", g_dir);
    ls_test_write(pyfile, py, strlen(py));
    int rc = ls_test_sh(&out, "/usr/bin/python3 %s %s/manifest/schema.json %s %s", pyfile,
                        LS_SOURCE_DIR, a, b);
    ck_assert_msg(rc == 0 && out && strstr(out, "ok"), "schema: %s", out);
    free(out);
    /* dequant is the default; a mode change voids */
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s %s", a, c), 0);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s %s", a, b), 1);
    ck_assert_msg(strstr(out, "voiding       numerics.fp8.mode: \"dequant\" -> \"w8a8\""), "%s", out);
    ck_assert_msg(strstr(out, "numerics.operators.linear_fp8.reduction_order"), "%s", out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest verify %s --checkpoint %s --fp8 w8a8", a, g_ck), 1);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest verify %s --checkpoint %s --fp8 w8a8", b, g_ck), 0);
    free(out);
    /* the block size voids as well, and a manifest's fp8 section is validated */
    char *text = ls_test_read(a, NULL);
    char *p = strstr(text, "\"weight_block_size\"");
    ck_assert_ptr_nonnull(p);
    p = strstr(p, "128");
    memcpy(p, " 64", 3);
    snprintf(c, sizeof c, "%s/m-block64.json", g_dir);
    ls_test_write(c, text, strlen(text));
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s %s", a, c), 1);
    ck_assert_msg(strstr(out, "numerics.fp8.weight_block_size[0]: 128 -> 64"), "%s", out);
    free(out);
    p = strstr(text, "\"dequant\"");
    memcpy(p, "\"bf16xx8\"", 9);
    ls_test_write(c, text, strlen(text));
    ck_assert_int_eq(ls_test_cli(&out, "manifest digest %s", c), 2);
    ck_assert_msg(strstr(out, "numerics.fp8.mode"), "%s", out);
    free(out);
    free(text);
    /* a BF16 checkpoint has no FP8 section and refuses an FP8 mode */
    ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint %s -o -", g_bf), 0);
    ck_assert_ptr_null(strstr(out, "\"fp8\""));
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint %s --fp8 w8a8 -o -", g_bf), 2);
    free(out);
}
END_TEST

/* ---- the C API ----------------------------------------------------------------------------- */

START_TEST(test_c_api_option)
{
    setup();
    lockstep_error err;
    lockstep_checkpoint *ck = NULL, *bf = NULL;
    ck_assert_msg(lockstep_checkpoint_open(g_ck, &ck, &err) == LOCKSTEP_OK, "%s", err.message);
    int32_t toks[4] = {3, 1, 4, 1};
    lockstep_sequence p = {7, toks, 4, 0};
    lockstep_run_options o;
    lockstep_run_options_default(&o);
    ck_assert_ptr_null(o.fp8);
    o.fp8 = "w8a8";
    o.max_new_tokens = 5;
    char ro[4400], rp[4400], rd[4400];
    snprintf(ro, sizeof ro, "%s/api-rollout.trace", g_dir);
    snprintf(rp, sizeof rp, "%s/api-replay.trace", g_dir);
    snprintf(rd, sizeof rd, "%s/api-dequant.trace", g_dir);
    ck_assert_msg(lockstep_rollout(ck, &p, 1, &o, ro, &err) == LOCKSTEP_OK, "%s", err.message);
    /* a replay takes the rollout's mode when the options leave it unset */
    lockstep_run_options r;
    lockstep_run_options_default(&r);
    r.chunk = 3;
    ck_assert_msg(lockstep_replay(ck, ro, &r, rp, &err) == LOCKSTEP_OK, "%s", err.message);
    lockstep_verdict v;
    ck_assert(lockstep_compare(ro, rp, NULL, &v, &err) == LOCKSTEP_OK);
    ck_assert_msg(v.equal, "%s", v.line);
    r.fp8 = "dequant";
    ck_assert_msg(lockstep_replay(ck, ro, &r, rd, &err) == LOCKSTEP_OK, "%s", err.message);
    ck_assert(lockstep_compare(ro, rd, NULL, &v, &err) == LOCKSTEP_OK);
    ck_assert_msg(!v.equal, "w8a8 rollout equals a dequant replay");
    /* a bad value, and a mode for a checkpoint without FP8 */
    o.fp8 = "e5m2";
    ck_assert_int_eq(lockstep_rollout(ck, &p, 1, &o, ro, &err), LOCKSTEP_E_USAGE);
    ck_assert_ptr_nonnull(strstr(err.message, "fp8"));
    ck_assert_msg(lockstep_checkpoint_open(g_bf, &bf, &err) == LOCKSTEP_OK, "%s", err.message);
    o.fp8 = "dequant";
    ck_assert_int_eq(lockstep_rollout(bf, &p, 1, &o, ro, &err), LOCKSTEP_E_USAGE);
    ck_assert_msg(strstr(err.message, "applies to FP8 checkpoints only"), "%s", err.message);
    lockstep_checkpoint_close(bf);
    lockstep_checkpoint_close(ck);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fp8");
    TCase *tc = tcase_create("fp8");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_e4m3_decode);
    tcase_add_test(tc, test_e4m3_encode);
    tcase_add_test(tc, test_e4m3_encode_dense);
    tcase_add_test(tc, test_quant_group);
    tcase_add_test(tc, test_dot_dequant);
    tcase_add_test(tc, test_dot_w8a8);
    tcase_add_test(tc, test_synth_is_quantised_bf16);
    tcase_add_test(tc, test_modes_rollout_equals_replay);
    tcase_add_test(tc, test_text_only_layout);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_manifest_pins_mode);
    tcase_add_test(tc, test_c_api_option);
    suite_add_tcase(s, tc);
    int failed = ls_test_run_suite(s, 1);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    return failed ? 1 : 0;
}
