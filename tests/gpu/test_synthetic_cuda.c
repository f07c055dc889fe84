/* Synthetic weights on CUDA (the GPU benchmark's model): the device
 * generators (bf16 and FP8 e4m3) give the values their header documents,
 * element by element; the CUDA backend refuses a matrix without data unless
 * created to generate weights, generates e4m3 bytes for an FP8 matrix and
 * refuses to generate fp32; and the engine runs a synthetic model on a
 * generating backend with finite logprobs, the same bits for the same seed
 * and other bits for another: bf16 Qwen3-Next, and FP8 Qwen3-Next and
 * Qwen3.5 in both FP8 modes (dequant and w8a8, which differ). */
#include "gpu_testutil.h"

#include <math.h>

#include "backend/backend_cuda.h"
#include "engine/engine.h"
#include "model/model.h"
#include "numerics/fp8.h"
#include "synth_models.h"

/* A synth preset's config as ls_model_parse_config reads it (fp8: the FP8
 * release layout's, quantization_config included). */
static void preset_config(const char *name, int fp8, ls_model_config *c)
{
    ls_test_preset_config(name, 0, fp8, c);
    ck_assert_int_eq(c->fp8, fp8);
}

static void tiny_config(ls_model_config *c)
{
    preset_config("tiny", 0, c);
}

/* The FP8 generator's formula (ls_cuda.h, ls_cuda_fill_e4m3), on the host:
 * byte i = e4m3(448 u_i), u_i from splitmix64(seed + (i + 1) golden gamma). */
static void e4m3_formula(uint64_t seed, uint8_t *out, size_t n)
{
    uint64_t state = seed;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = ls_gpu_rand_u64(&state);
        float u = (float)((int64_t)(r >> 40) - ((int64_t)1 << 23)) * (1.0f / 8388608.0f);
        out[i] = ls_f32_to_e4m3(448.0f * u);
    }
}

/* 1 when equal, else prints the first differing byte. */
static int same_u8(const char *what, const uint8_t *want, const uint8_t *got, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (want[i] != got[i]) {
            printf("%s: first mismatch at byte %zu: want 0x%02x, got 0x%02x\n", what, i, want[i],
                   got[i]);
            return 0;
        }
    return 1;
}

START_TEST(test_fill_matches_formula)
{
#ifdef LOCKSTEP_HAVE_CUDA
    ls_error err;
    ls_error_clear(&err);
    const size_t n = 100003;
    uint16_t *want = malloc(n * 2), *got = malloc(n * 2);
    void *d;
    ck_assert_msg(ls_cuda_malloc(&d, n * 2, &err) == LS_OK, "%s", err.msg);
    const uint64_t seeds[2] = {1, 0xfeedfacecafebeefull};
    const float scales[2] = {0.04f, 3.0f};
    for (int c = 0; c < 2; c++) {
        uint64_t state = seeds[c];
        for (size_t i = 0; i < n; i++) {
            /* element i: splitmix64(seed + (i + 1) golden gamma), 24 bits centred */
            uint64_t r = ls_gpu_rand_u64(&state);
            float u = (float)((int64_t)(r >> 40) - ((int64_t)1 << 23)) * (1.0f / 8388608.0f);
            want[i] = ls_f32_to_bf16(scales[c] * u);
        }
        ck_assert_msg(ls_cuda_fill_uniform_bf16(d, n, seeds[c], scales[c], NULL, &err) == LS_OK,
                      "%s", err.msg);
        ck_assert_msg(ls_cuda_download(got, d, n * 2, &err) == LS_OK, "%s", err.msg);
        ck_assert(ls_gpu_same_u16("fill_uniform_bf16", want, got, n));
        /* Read as fp32: finite, within one bf16 ulp of the upper element. */
        for (size_t i = 0; i + 1 < n; i += 2) {
            uint32_t w = (uint32_t)got[i] | (uint32_t)got[i + 1] << 16;
            float f = ls_f32_from_bits(w), hi = ls_bf16_to_f32(got[i + 1]);
            ck_assert_msg(isfinite(f) && fabsf(f) <= fabsf(hi) * (1.0f + 1.0f / 128.0f) + 1e-30f,
                          "pair %zu: fp32 0x%08x from bf16 0x%04x", i / 2, w, got[i + 1]);
        }
    }
    ls_cuda_free(d);
    free(want);
    free(got);
#endif
}
END_TEST

/* The e4m3 fill equals the host formula byte for byte; no byte is an e4m3fn
 * NaN (0x7F, 0xFF); the bytes cover the range as a block-quantised release's
 * do (both signs, magnitudes at 256 and above, and below 1). */
START_TEST(test_fill_e4m3_matches_formula)
{
#ifdef LOCKSTEP_HAVE_CUDA
    ls_error err;
    ls_error_clear(&err);
    const size_t n = 1000003;
    uint8_t *want = malloc(n), *got = malloc(n);
    void *d;
    ck_assert_msg(ls_cuda_malloc(&d, n, &err) == LS_OK, "%s", err.msg);
    const uint64_t seeds[2] = {1, 0xfeedfacecafebeefull};
    for (int c = 0; c < 2; c++) {
        e4m3_formula(seeds[c], want, n);
        ck_assert_msg(ls_cuda_fill_e4m3(d, n, seeds[c], NULL, &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(ls_cuda_download(got, d, n, &err) == LS_OK, "%s", err.msg);
        ck_assert(same_u8("fill_e4m3", want, got, n));
        size_t neg = 0, big = 0, small = 0;
        for (size_t i = 0; i < n; i++) {
            ck_assert_msg((got[i] & 0x7f) != 0x7f, "byte %zu is 0x%02x, an e4m3fn NaN", i, got[i]);
            float v = ls_e4m3_to_f32(got[i]);
            ck_assert_msg(isfinite(v) && fabsf(v) <= 448.0f, "byte %zu = 0x%02x", i, got[i]);
            neg += v < 0.0f;
            big += fabsf(v) >= 256.0f;
            small += fabsf(v) < 1.0f;
        }
        ck_assert_msg(neg > n / 3 && neg < 2 * n / 3, "%zu of %zu bytes negative", neg, n);
        ck_assert_msg(big > n / 4 && small > 0, "%zu bytes >= 256, %zu below 1", big, small);
    }
    ls_cuda_free(d);
    free(want);
    free(got);
#endif
}
END_TEST

/* A generating backend: an FP8 matrix without data gets e4m3 bytes (the
 * fill's formula at the seed of the k-th generated matrix, seed ^ k ·
 * 0xD1B54A32D192ED03, backend_cuda.h); buffers with host data (block
 * scales) do not count; an fp32 matrix without data is refused. */
START_TEST(test_backend_generates_fp8)
{
    ls_error err;
    ls_error_clear(&err);
    ls_backend_cuda_opts co;
    ls_backend_cuda_opts_default(&co);
    co.arena_bytes = 64u << 20;
    co.synthetic_weights_seed = 0x77;
    ls_backend *be;
    ck_assert_msg(ls_backend_cuda_create_opts(&co, &be, &err) == LS_OK, "%s", err.msg);
    const size_t n = 3 * 128 * 257;
    uint8_t *want = malloc(n), *got = malloc(n);
    ls_buf *b1 = NULL, *s = NULL, *b2 = NULL;
    const float scales[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    ck_assert_msg(be->wrap_weights(be, NULL, n, LS_WTYPE_F8_DEQUANT, &b1, &err) == LS_OK, "%s",
                  err.msg);
    ck_assert_msg(be->wrap_weights(be, scales, sizeof scales, LS_WTYPE_F32, &s, &err) == LS_OK,
                  "%s", err.msg);
    ck_assert_msg(be->wrap_weights(be, NULL, n, LS_WTYPE_F8_W8A8, &b2, &err) == LS_OK, "%s",
                  err.msg);
    for (uint64_t k = 1; k <= 2; k++) {
        e4m3_formula(0x77 ^ (k * 0xD1B54A32D192ED03ull), want, n);
        ck_assert_msg(be->download(be, got, (ls_view){k == 1 ? b1 : b2, 0}, n, &err) == LS_OK, "%s",
                      err.msg);
        ck_assert(same_u8(k == 1 ? "first generated matrix" : "second generated matrix", want, got,
                          n));
    }
    float back[4];
    ck_assert_msg(be->download(be, back, (ls_view){s, 0}, sizeof back, &err) == LS_OK, "%s", err.msg);
    ck_assert(ls_gpu_same_f32("uploaded scales", scales, back, 4));
    ls_buf *b3 = NULL;
    ck_assert_int_eq(be->wrap_weights(be, NULL, 4096, LS_WTYPE_F32, &b3, &err), LS_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "bf16 or e4m3"), "message: %s", err.msg);
    be->destroy(be);
    free(want);
    free(got);
}
END_TEST

START_TEST(test_backend_refuses_without_seed)
{
    ls_error err;
    ls_error_clear(&err);
    ls_backend *be = NULL;
    ck_assert_msg(ls_backend_cuda_create(64u << 20, &be, &err) == LS_OK, "%s", err.msg);
    ls_buf *b = NULL;
    ck_assert_int_eq(be->wrap_weights(be, NULL, 4096, LS_WTYPE_BF16, &b, &err), LS_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "no data") && strstr(err.msg, "synthetic_weights_seed"),
                  "message: %s", err.msg);
    be->destroy(be);
}
END_TEST

/* Logprobs of a prefill of 9 tokens then a decode step, on a synthetic
 * model whose weights the backend generates from seed (FP8 matrices in w8a8
 * mode when w8a8). */
static float *run_synthetic_mode(const ls_model *m, uint64_t seed, int w8a8, long *n_out)
{
    ls_error err;
    ls_error_clear(&err);
    ls_backend_cuda_opts co;
    ls_backend_cuda_opts_default(&co);
    co.arena_bytes = 256u << 20;
    co.synthetic_weights_seed = seed;
    ls_backend *be;
    ck_assert_msg(ls_backend_cuda_create_opts(&co, &be, &err) == LS_OK, "%s", err.msg);
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = 16;
    o.fp8_w8a8 = w8a8;
    return ls_gpu_prefill_decode(m, be, &o, n_out);
}

static float *run_synthetic(const ls_model *m, uint64_t seed, long *n_out)
{
    return run_synthetic_mode(m, seed, 0, n_out);
}

START_TEST(test_engine_runs_synthetic)
{
    ls_error err;
    ls_error_clear(&err);
    ls_model_config c;
    tiny_config(&c);
    ls_model *m;
    ck_assert_msg(ls_model_synthetic(&c, 3, &m, &err) == LS_OK, "%s", err.msg);
    long n;
    float *a = run_synthetic(m, 11, &n), *b = run_synthetic(m, 11, &n), *d = run_synthetic(m, 12, &n);
    for (long i = 0; i < n; i++)
        ck_assert_msg(isfinite(a[i]) && a[i] <= 0.0f, "logprob %ld = 0x%08x", i, ls_f32_bits(a[i]));
    ck_assert(ls_gpu_same_f32("same seed", a, b, (size_t)n));
    ck_assert_msg(memcmp(a, d, sizeof(float) * (size_t)n) != 0, "seeds 11 and 12 give the same logprobs");
    free(a);
    free(b);
    free(d);
    ls_model_close(m);
}
END_TEST

/* FP8 synthetic models (Qwen3-Next and Qwen3.5 tiny shapes) in both modes:
 * finite logprobs, the same bits for the same seed, other bits for another
 * seed and for the other mode. */
START_TEST(test_engine_runs_synthetic_fp8)
{
    const char *presets[2] = {"tiny", "qwen3.5-tiny"};
    for (int p = 0; p < 2; p++) {
        ls_error err;
        ls_error_clear(&err);
        ls_model_config c;
        preset_config(presets[p], 1, &c);
        ls_model *m;
        ck_assert_msg(ls_model_synthetic(&c, 3, &m, &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(m->n_fp8 > 0, "%s: no FP8 matrix", presets[p]);
        float *mode[2];
        long n = 0;
        for (int w8a8 = 0; w8a8 < 2; w8a8++) {
            float *a = run_synthetic_mode(m, 11, w8a8, &n), *b = run_synthetic_mode(m, 11, w8a8, &n);
            float *d = run_synthetic_mode(m, 12, w8a8, &n);
            for (long i = 0; i < n; i++)
                ck_assert_msg(isfinite(a[i]) && a[i] <= 0.0f, "%s %s: logprob %ld = 0x%08x",
                              presets[p], w8a8 ? "w8a8" : "dequant", i, ls_f32_bits(a[i]));
            ck_assert(ls_gpu_same_f32(w8a8 ? "w8a8, same seed" : "dequant, same seed", a, b,
                                      (size_t)n));
            ck_assert_msg(memcmp(a, d, sizeof(float) * (size_t)n) != 0,
                          "%s %s: seeds 11 and 12 give the same logprobs", presets[p],
                          w8a8 ? "w8a8" : "dequant");
            mode[w8a8] = a;
            free(b);
            free(d);
        }
        ck_assert_msg(memcmp(mode[0], mode[1], sizeof(float) * (size_t)n) != 0,
                      "%s: dequant and w8a8 give the same logprobs", presets[p]);
        free(mode[0]);
        free(mode[1]);
        ls_model_close(m);
    }
}
END_TEST

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
    Suite *s = suite_create("synthetic_cuda");
    TCase *tc = tcase_create("synthetic_cuda");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_fill_matches_formula);
    tcase_add_test(tc, test_fill_e4m3_matches_formula);
    tcase_add_test(tc, test_backend_generates_fp8);
    tcase_add_test(tc, test_backend_refuses_without_seed);
    tcase_add_test(tc, test_engine_runs_synthetic);
    tcase_add_test(tc, test_engine_runs_synthetic_fp8);
    suite_add_tcase(s, tc);
    return ls_gpu_run_suite(s);
}
