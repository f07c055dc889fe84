/* Synthetic weights on CUDA (the GPU benchmark's model): the device generator
 * gives the values its header documents, element by element; the CUDA
 * backend refuses a matrix without data unless created to generate weights;
 * and the engine runs a synthetic model on a generating backend with finite
 * logprobs, the same bits for the same seed and other bits for another. */
#include "gpu_testutil.h"

#include <math.h>

#include "backend/backend_cuda.h"
#include "engine/engine.h"
#include "io/json.h"
#include "model/model.h"
#include "synth/synth.h"

/* The synth `tiny` config as ls_model_parse_config reads it. */
static void tiny_config(ls_model_config *c)
{
    ls_error err;
    ls_error_clear(&err);
    ls_synth_config sc;
    ck_assert_msg(ls_synth_preset("tiny", &sc, &err) == LS_OK, "%s", err.msg);
    char *text;
    size_t len;
    ck_assert_msg(ls_synth_config_render(&sc, &text, &len, &err) == LS_OK, "%s", err.msg);
    json_t *j;
    ck_assert_msg(ls_json_load_buf("tiny", text, len, &j, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_model_parse_config(j, c, &err) == LS_OK, "%s", err.msg);
    json_decref(j);
    free(text);
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

START_TEST(test_backend_refuses_without_seed)
{
    ls_error err;
    ls_error_clear(&err);
    ls_backend *be = NULL;
    ck_assert_msg(ls_backend_cuda_create(64u << 20, &be, &err) == LS_OK, "%s", err.msg);
    ls_buf *b = NULL;
    ck_assert_int_eq(be->wrap_weights(be, NULL, 4096, &b, &err), LS_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "no data") && strstr(err.msg, "synthetic_weights_seed"),
                  "message: %s", err.msg);
    be->destroy(be);
}
END_TEST

/* Logprobs of a prefill of 9 tokens then a decode step, on a synthetic tiny
 * model whose weights the backend generates from seed. */
static float *run_synthetic(const ls_model *m, uint64_t seed, long *n_out)
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
    ls_engine *e;
    ck_assert_msg(ls_engine_create(m, be, &o, 1, 32, &e, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_engine_join(e, 0, 1, 9, &err) == LS_OK, "%s", err.msg);
    int32_t toks[10];
    for (int i = 0; i < 10; i++) toks[i] = (int32_t)((i * 131 + 7) % m->cfg.vocab);
    long V = m->cfg.vocab;
    float *lp = malloc(sizeof(float) * (size_t)(10 * V));
    ls_engine_item it = {0, toks, 9, 0};
    ck_assert_msg(ls_engine_step(e, &it, 1, &err) == LS_OK, "%s", err.msg);
    memcpy(lp, ls_engine_logprobs(e, 0), sizeof(float) * (size_t)(9 * V));
    it = (ls_engine_item){0, toks + 9, 1, 1};
    ck_assert_msg(ls_engine_step(e, &it, 1, &err) == LS_OK, "%s", err.msg);
    memcpy(lp + 9 * V, ls_engine_logprobs(e, 0), sizeof(float) * (size_t)V);
    ls_engine_destroy(e);
    *n_out = 10 * V;
    return lp;
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

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
    Suite *s = suite_create("synthetic_cuda");
    TCase *tc = tcase_create("synthetic_cuda");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_fill_matches_formula);
    tcase_add_test(tc, test_backend_refuses_without_seed);
    tcase_add_test(tc, test_engine_runs_synthetic);
    suite_add_tcase(s, tc);
    return ls_gpu_run_suite(s);
}
