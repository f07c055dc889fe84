/* A model from a config alone (ls_model_synthetic, the GPU benchmark's model):
 * its config is the one given, it binds exactly the tensors and shapes
 * ls_model_open binds from a checkpoint of that config, its matrices have no
 * data, its small parameters are bf16-exact and fixed by the seed, a config
 * the JSON reader would refuse is refused, and the CPU backend refuses to run
 * it (fail closed, saying why). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "numerics/reduce.h"
#include "synth/synth.h"
#include "testutil.h"

/* ---- fixture: the synth `tiny` checkpoint and its model --------------------------- */

static char *g_dir;
static ls_checkpoint *g_ck;
static ls_model *g_ref;              /* ls_model_open of the checkpoint */

static void setup(void)
{
    if (g_ref) return;
    ls_error err;
    ls_error_clear(&err);
    g_dir = ls_test_tmpdir("model_synthetic");
    char path[4200];
    snprintf(path, sizeof path, "%s/tiny", g_dir);
    ls_synth_config sc;
    ck_assert_msg(ls_synth_preset("tiny", &sc, &err) == LS_OK, "%s", err.msg);
    ls_synth_options opt = ls_synth_options_default();
    ck_assert_msg(ls_synth_write(&sc, 7, path, &opt, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_checkpoint_open(path, &g_ck, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_model_open(g_ck, &g_ref, &err) == LS_OK, "%s", err.msg);
}

static void teardown(void)
{
    ls_model_close(g_ref);
    ls_checkpoint_close(g_ck);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    g_ref = NULL;
    g_ck = NULL;
    g_dir = NULL;
}

static ls_model *synthetic(const ls_model_config *c, uint64_t seed)
{
    ls_error err;
    ls_error_clear(&err);
    ls_model *m = NULL;
    ck_assert_msg(ls_model_synthetic(c, seed, &m, &err) == LS_OK, "%s", err.msg);
    ck_assert_ptr_nonnull(m);
    return m;
}

/* ---- helpers ------------------------------------------------------------------------ */

/* Same shape and dtype as the checkpoint's matrix, and no data. */
static void check_mat(const ls_wmat *got, const ls_wmat *want, const char *what, long layer)
{
    ck_assert_msg(got->data == NULL, "layer %ld %s: synthetic matrix has data", layer, what);
    ck_assert_msg(want->data != NULL, "layer %ld %s: the checkpoint's matrix has no data", layer,
                  what);
    ck_assert_msg(got->rows == want->rows && got->cols == want->cols && got->wtype == want->wtype,
                  "layer %ld %s: synthetic [%ld, %ld] wtype %d, checkpoint [%ld, %ld] wtype %d",
                  layer, what, got->rows, got->cols, (int)got->wtype, want->rows, want->cols,
                  (int)want->wtype);
}

/* n values present, finite and bf16-exact; NULL exactly where the checkpoint's is. */
static void check_vec(const float *got, const float *want, long n, const char *what, long layer)
{
    ck_assert_msg((got == NULL) == (want == NULL), "layer %ld %s: present %d, checkpoint %d",
                  layer, what, got != NULL, want != NULL);
    for (long i = 0; got && i < n; i++)
        ck_assert_msg(isfinite(got[i]) && ls_round_bf16(got[i]) == got[i],
                      "layer %ld %s[%ld] = 0x%08x is not a finite bf16 value", layer, what, i,
                      ls_f32_bits(got[i]));
}

/* First differing element of two small-parameter vectors, or -1. */
static long first_diff(const float *a, const float *b, long n)
{
    for (long i = 0; i < n; i++)
        if (ls_f32_bits(a[i]) != ls_f32_bits(b[i])) return i;
    return -1;
}

static void check_refused(const ls_model_config *c, const char *needle)
{
    ls_error err;
    ls_error_clear(&err);
    ls_model *m = (ls_model *)1;
    ls_status st = ls_model_synthetic(c, 1, &m, &err);
    ck_assert_msg(st != LS_OK, "config accepted, expected a refusal naming '%s'", needle);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "message '%s' does not name '%s'", err.msg,
                  needle);
}

/* ---- tests -------------------------------------------------------------------------- */

START_TEST(test_same_config_and_tensors)
{
    const ls_model_config *c = &g_ref->cfg;
    ls_model *m = synthetic(c, 42);
    const unsigned char *a = (const unsigned char *)&m->cfg, *b = (const unsigned char *)c;
    for (size_t i = 0; i < sizeof *c; i++)
        ck_assert_msg(a[i] == b[i], "config byte %zu differs: 0x%02x, given 0x%02x", i, a[i], b[i]);
    ck_assert_ptr_null(m->ck);
    check_mat(&m->embed, &g_ref->embed, "embed", -1);
    check_mat(&m->lm_head, &g_ref->lm_head, "lm_head", -1);
    check_vec(m->final_norm, g_ref->final_norm, c->hidden, "final_norm", -1);
    for (long l = 0; l < c->n_layers; l++) {
        const ls_model_layer *s = &m->layers[l], *r = &g_ref->layers[l];
        ck_assert_int_eq(s->attention, r->attention);
        check_vec(s->in_norm, r->in_norm, c->hidden, "in_norm", l);
        check_vec(s->post_norm, r->post_norm, c->hidden, "post_norm", l);
        if (s->attention) {
            check_mat(&s->q_proj, &r->q_proj, "q_proj", l);
            check_mat(&s->k_proj, &r->k_proj, "k_proj", l);
            check_mat(&s->v_proj, &r->v_proj, "v_proj", l);
            check_mat(&s->o_proj, &r->o_proj, "o_proj", l);
            check_vec(s->q_norm, r->q_norm, c->head_dim, "q_norm", l);
            check_vec(s->k_norm, r->k_norm, c->head_dim, "k_norm", l);
        } else {
            check_mat(&s->qkvz, &r->qkvz, "qkvz", l);
            check_mat(&s->ba, &r->ba, "ba", l);
            check_mat(&s->conv, &r->conv, "conv", l);
            check_mat(&s->out_proj, &r->out_proj, "out_proj", l);
            check_vec(s->A_log, r->A_log, c->lin_v_heads, "A_log", l);
            check_vec(s->dt_bias, r->dt_bias, c->lin_v_heads, "dt_bias", l);
            check_vec(s->gnorm, r->gnorm, c->lin_v_dim, "gnorm", l);
        }
        check_mat(&s->router, &r->router, "router", l);
        for (long e = 0; e < c->n_experts; e++) {
            check_mat(&s->exp_gate[e], &r->exp_gate[e], "expert gate", l);
            check_mat(&s->exp_up[e], &r->exp_up[e], "expert up", l);
            check_mat(&s->exp_down[e], &r->exp_down[e], "expert down", l);
        }
        check_mat(&s->sh_gate, &r->sh_gate, "shared gate", l);
        check_mat(&s->sh_up, &r->sh_up, "shared up", l);
        check_mat(&s->sh_down, &r->sh_down, "shared down", l);
        check_mat(&s->sh_gate_w, &r->sh_gate_w, "shared expert gate", l);
    }
    ls_model_close(m);
}
END_TEST

START_TEST(test_small_params_from_seed)
{
    const ls_model_config *c = &g_ref->cfg;
    ls_model *a = synthetic(c, 5), *b = synthetic(c, 5), *d = synthetic(c, 6);
    long i = first_diff(a->final_norm, b->final_norm, c->hidden);
    ck_assert_msg(i < 0, "final_norm[%ld]: 0x%08x vs 0x%08x with the same seed", i,
                  ls_f32_bits(a->final_norm[i]), ls_f32_bits(b->final_norm[i]));
    int gdn_seen = 0;
    for (long l = 0; l < c->n_layers; l++) {
        const ls_model_layer *x = &a->layers[l], *y = &b->layers[l];
        i = first_diff(x->in_norm, y->in_norm, c->hidden);
        ck_assert_msg(i < 0, "layer %ld in_norm[%ld]: 0x%08x vs 0x%08x with the same seed", l, i,
                      ls_f32_bits(x->in_norm[i]), ls_f32_bits(y->in_norm[i]));
        if (x->attention) continue;
        gdn_seen = 1;
        i = first_diff(x->A_log, y->A_log, c->lin_v_heads);
        ck_assert_msg(i < 0, "layer %ld A_log[%ld]: 0x%08x vs 0x%08x with the same seed", l, i,
                      ls_f32_bits(x->A_log[i]), ls_f32_bits(y->A_log[i]));
        /* Qwen3-Next's ranges: A_log in [0.5, 2.5), dt_bias in [-3, -1), gated
         * norm weights near 1 (all within one bf16 rounding). */
        for (long h = 0; h < c->lin_v_heads; h++) {
            ck_assert_msg(x->A_log[h] >= 0.49f && x->A_log[h] <= 2.51f, "layer %ld A_log[%ld] = %g",
                          l, h, (double)x->A_log[h]);
            ck_assert_msg(x->dt_bias[h] >= -3.02f && x->dt_bias[h] <= -0.99f,
                          "layer %ld dt_bias[%ld] = %g", l, h, (double)x->dt_bias[h]);
        }
        for (long j = 0; j < c->lin_v_dim; j++)
            ck_assert_msg(x->gnorm[j] >= 0.89f && x->gnorm[j] <= 1.11f, "layer %ld gnorm[%ld] = %g",
                          l, j, (double)x->gnorm[j]);
    }
    ck_assert_msg(gdn_seen, "the tiny preset has no gated DeltaNet layer");
    /* Another seed, other values; distinct vectors of one model differ too. */
    ck_assert_msg(first_diff(a->final_norm, d->final_norm, c->hidden) >= 0,
                  "seeds 5 and 6 give the same final_norm");
    ck_assert_msg(first_diff(a->layers[0].in_norm, a->layers[0].post_norm, c->hidden) >= 0,
                  "layer 0's two norms are the same vector");
    ls_model_close(a);
    ls_model_close(b);
    ls_model_close(d);
}
END_TEST

START_TEST(test_bad_config_refused)
{
    ls_model_config c = g_ref->cfg;
    c.n_heads = c.n_kv_heads * 2 + 1;
    check_refused(&c, "model config: field 'num_attention_heads'");
    c = g_ref->cfg;
    c.hidden = 0;
    check_refused(&c, "field 'hidden_size' = 0 is outside");
    c = g_ref->cfg;
    c.topk = c.n_experts + 1;
    check_refused(&c, "field 'num_experts_per_tok'");
    c = g_ref->cfg;
    c.rotary_dims = 3;
    check_refused(&c, "rotary dims");
    c = g_ref->cfg;
    c.rope_theta = 1.0;
    check_refused(&c, "rope_theta");
    c = g_ref->cfg;
    c.is_attention[1] = 2;
    check_refused(&c, "layer 1 has type 2");
}
END_TEST

START_TEST(test_cpu_backend_refuses)
{
    ls_error err;
    ls_error_clear(&err);
    ls_model *m = synthetic(&g_ref->cfg, 3);
    ls_backend *be = NULL;
    ck_assert_msg(ls_backend_cpu_create(1, &be, &err) == LS_OK, "%s", err.msg);
    ls_buf *b = NULL;
    ck_assert_int_eq(be->wrap_weights(be, NULL, 64, &b, &err), LS_E_UNSUPPORTED);
    ck_assert_ptr_null(b);
    ck_assert_msg(strstr(err.msg, "no data") && strstr(err.msg, "synthetic"),
                  "wrap_weights(NULL) message: %s", err.msg);
    /* Through the engine: creation fails closed at the first matrix, with
     * the same reason; the engine took (and destroyed) the backend. */
    ls_error_clear(&err);
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    ls_engine *e = (ls_engine *)1;
    ls_status st = ls_engine_create(m, be, &o, 1, 8, &e, &err);
    ck_assert_int_eq(st, LS_E_UNSUPPORTED);
    ck_assert_ptr_null(e);
    ck_assert_msg(strstr(err.msg, "cpu backend") && strstr(err.msg, "no data"),
                  "engine creation message: %s", err.msg);
    /* The checkpoint's model still runs on a fresh CPU backend. */
    ls_error_clear(&err);
    ck_assert_msg(ls_backend_cpu_create(1, &be, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_engine_create(g_ref, be, &o, 1, 8, &e, &err) == LS_OK, "%s", err.msg);
    ls_engine_destroy(e);
    ls_model_close(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model_synthetic");
    TCase *tc = tcase_create("model_synthetic");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_same_config_and_tensors);
    tcase_add_test(tc, test_small_params_from_seed);
    tcase_add_test(tc, test_bad_config_refused);
    tcase_add_test(tc, test_cpu_backend_refuses);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
