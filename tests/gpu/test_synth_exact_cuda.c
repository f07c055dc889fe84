/* lockstep synth's values generated on the device (CUDA backend with
 * synthetic_weights_exact, wrap_generated; ls_cuda_fill_synth_bf16 /
 * _e4m3): every matrix of a synthetic model, whole and as a rank's row
 * range (bf16: any rows; FP8: whole 128-row blocks and a range inside one
 * block, scales included), equals the bytes the host generator gives
 * (gen->fill, which tests/test_model_synthetic.c holds to the written
 * checkpoint's), and the engine on the device-generated model gives the
 * logprobs of the engine on the written checkpoint, bit for bit (Qwen3-Next
 * tiny bf16, Qwen3.5 tiny bf16 and FP8). */
#include "gpu_testutil.h"

#include "backend/backend_cuda.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "synth/synth.h"
#include "synth_models.h"

static ls_backend *exact_backend(int exact)
{
    ls_error err;
    ls_error_clear(&err);
    ls_backend_cuda_opts co;
    ls_backend_cuda_opts_default(&co);
    co.arena_bytes = 256u << 20;
    co.synthetic_weights_exact = exact;
    ls_backend *be = NULL;
    ck_assert_msg(ls_backend_cuda_create_opts(&co, &be, &err) == LS_OK, "%s", err.msg);
    ck_assert(exact ? be->wrap_generated != NULL : be->wrap_generated == NULL);
    return be;
}

/* Rows r0 .. r0 + n - 1 of g, generated on the device and on the host. */
static void expect_slice(ls_backend *be, const ls_wmat *g, long r0, long n, const char *what)
{
    ls_error err;
    ls_error_clear(&err);
    const int f8 = ls_wtype_is_f8(g->wtype);
    size_t bytes = (size_t)n * (size_t)g->cols * (size_t)ls_wtype_bytes(g->wtype);
    size_t ns = (size_t)LS_FP8_BLOCKS(n) * (size_t)LS_FP8_BLOCKS(g->cols);
    unsigned char *want = malloc(bytes + 1), *got = malloc(bytes + 1);
    float *ws = malloc(sizeof(float) * (ns + 1)), *gs = malloc(sizeof(float) * (ns + 1));
    ck_assert_msg(g->gen->fill(g->gen, g->gen_row0 + r0, n, g->cols, want, f8 ? ws : NULL, &err) == LS_OK,
                  "%s host: %s", what, err.msg);
    ls_buf *b = NULL, *s = NULL;
    ck_assert_msg(be->wrap_generated(be, g->gen, g->gen_row0 + r0, n, g->cols, g->wtype, &b,
                                     f8 ? &s : NULL, &err) == LS_OK, "%s device: %s", what, err.msg);
    ck_assert_msg(be->download(be, got, (ls_view){b, 0}, bytes, &err) == LS_OK, "%s", err.msg);
    for (size_t i = 0; i < bytes; i++)
        ck_assert_msg(got[i] == want[i], "%s rows %ld..%ld: byte %zu: device 0x%02x, host 0x%02x",
                      what, r0, r0 + n - 1, i, got[i], want[i]);
    if (f8) {
        ck_assert_ptr_nonnull(s);
        ck_assert_msg(be->download(be, gs, (ls_view){s, 0}, sizeof(float) * ns, &err) == LS_OK, "%s",
                      err.msg);
        ck_assert(ls_gpu_same_f32(what, ws, gs, ns));
    }
    free(want);
    free(got);
    free(ws);
    free(gs);
}

static void expect_matrix(ls_backend *be, const ls_wmat *g, const char *what)
{
    ck_assert_msg(g->data == NULL && g->gen != NULL && g->gen->normal, "%s: not generated", what);
    expect_slice(be, g, 0, g->rows, what);
    if (!ls_wtype_is_f8(g->wtype)) {
        if (g->rows >= 3) expect_slice(be, g, g->rows / 3, g->rows / 2, what);
        return;
    }
    if (g->rows >= 4) expect_slice(be, g, g->rows / 4, g->rows / 4, what);
    if (g->rows > LS_FP8_BLOCK) expect_slice(be, g, LS_FP8_BLOCK, g->rows - LS_FP8_BLOCK, what);
}

START_TEST(test_slices_match_host)
{
    static const char *const presets[4] = {"tiny", "qwen3.5-tiny", "tiny", "qwen3.5-tiny"};
    for (int k = 0; k < 4; k++) {
        ls_error err;
        ls_error_clear(&err);
        ls_model_config c;
        ls_test_preset_config(presets[k], 0, k >= 2, &c);
        ls_model *m = NULL;
        ck_assert_msg(ls_model_synthetic(&c, 5, &m, &err) == LS_OK, "%s", err.msg);
        ls_backend *be = exact_backend(1);
        char what[96];
        snprintf(what, sizeof what, "%s%s embed", presets[k], k >= 2 ? " fp8" : "");
        expect_matrix(be, &m->embed, what);
        expect_matrix(be, &m->lm_head, what);
        for (long l = 0; l < c.n_layers; l++) {
            const ls_model_layer *y = &m->layers[l];
            const ls_wmat *mats[] = {&y->q_proj, &y->k_proj, &y->v_proj, &y->o_proj, &y->qkvz, &y->ba,
                                     &y->in_qkv, &y->in_z, &y->in_b, &y->in_a, &y->conv, &y->out_proj,
                                     &y->router, &y->sh_gate, &y->sh_up, &y->sh_down, &y->sh_gate_w,
                                     &y->exp_gate[0], &y->exp_up[0], &y->exp_down[c.n_experts - 1]};
            for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
                if (mats[i]->rows == 0) continue; /* another layer kind's or arch's */
                snprintf(what, sizeof what, "%s%s layer %ld matrix %zu", presets[k], k >= 2 ? " fp8" : "",
                         l, i);
                expect_matrix(be, mats[i], what);
            }
        }
        be->destroy(be);
        ls_model_close(m);
    }
}
END_TEST

/* Logprobs of a prefill of 9 tokens and one decode step. */
static float *run(const ls_model *m, ls_backend *be, long *n_out)
{
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = 16;
    return ls_gpu_prefill_decode(m, be, &o, n_out);
}

START_TEST(test_engine_equals_checkpoint)
{
    static const char *const presets[3] = {"tiny", "qwen3.5-tiny", "qwen3.5-tiny"};
    char *dir = ls_test_tmpdir("synth_exact_cuda");
    for (int k = 0; k < 3; k++) {
        ls_error err;
        ls_error_clear(&err);
        ls_synth_config sc;
        ck_assert_msg(ls_synth_preset(presets[k], &sc, &err) == LS_OK, "%s", err.msg);
        if (k == 2) {
            sc.fp8 = 1;
            sc.fused_experts = 0;
        }
        char path[4200];
        snprintf(path, sizeof path, "%s/m%d", dir, k);
        ls_synth_options opt = ls_synth_options_default();
        ck_assert_msg(ls_synth_write(&sc, 5, path, &opt, &err) == LS_OK, "%s", err.msg);
        ls_checkpoint *ck = NULL;
        ls_model *ref = NULL, *m = NULL;
        ck_assert_msg(ls_checkpoint_open(path, &ck, &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(ls_model_open(ck, &ref, &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(ls_model_synthetic(&ref->cfg, 5, &m, &err) == LS_OK, "%s", err.msg);
        long n = 0;
        float *want = run(ref, exact_backend(0), &n), *got = run(m, exact_backend(1), &n);
        char what[64];
        snprintf(what, sizeof what, "%s%s logprobs", presets[k], k == 2 ? " fp8" : "");
        ck_assert(ls_gpu_same_f32(what, want, got, (size_t)n));
        free(want);
        free(got);
        ls_model_close(m);
        ls_model_close(ref);
        ls_checkpoint_close(ck);
    }
    ls_test_rm_tmpdir(dir);
}
END_TEST

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
    Suite *s = suite_create("synth_exact_cuda");
    TCase *tc = tcase_create("synth_exact_cuda");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_slices_match_host);
    tcase_add_test(tc, test_engine_equals_checkpoint);
    suite_add_tcase(s, tc);
    return ls_gpu_run_suite(s);
}
