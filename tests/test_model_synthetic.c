/* A model from a config alone (ls_model_synthetic): its config is the one
 * given, it binds exactly the tensors and shapes ls_model_open binds from a
 * checkpoint of that config, its matrices have no data but a generator, and
 * every value is the one `lockstep synth` writes for that config and seed:
 * the small parameters, and every matrix generated whole or by row ranges
 * (a tensor-parallel rank's slice is the slice of the whole, FP8 scales
 * included), tensor by tensor against the written checkpoint (Qwen3-Next
 * tiny, Qwen3.5 tiny with fused experts, and both FP8). A config the JSON
 * reader would refuse is refused. With an FP8 config the matrices synth
 * --fp8 quantises are FP8; the model also keeps block scales by the
 * documented formula for the CUDA benchmark's device generator. */
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
static ls_checkpoint *g_ck, *g_ck8, *g_ck8q, *g_ckq;
static ls_model *g_ref;              /* ls_model_open of the `tiny` checkpoint */
static ls_model *g_refq;             /* of `qwen3.5-tiny` (fused experts) */
static ls_model *g_ref8;             /* of `tiny` written with --fp8 */
static ls_model *g_ref8q;            /* of `qwen3.5-tiny` written with --fp8 */

/* Writes preset `name` (FP8 layout when fp8) under g_dir and opens its model. */
static void open_synth(const char *name, int fp8, ls_checkpoint **ck, ls_model **m)
{
    ls_error err;
    ls_error_clear(&err);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s%s", g_dir, name, fp8 ? "-fp8" : "");
    ls_synth_config sc;
    ck_assert_msg(ls_synth_preset(name, &sc, &err) == LS_OK, "%s", err.msg);
    if (fp8) {
        sc.fp8 = 1;
        sc.fused_experts = 0;
    }
    ls_synth_options opt = ls_synth_options_default();
    ck_assert_msg(ls_synth_write(&sc, 7, path, &opt, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_checkpoint_open(path, ck, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_model_open(*ck, m, &err) == LS_OK, "%s", err.msg);
}

static void setup(void)
{
    if (g_ref) return;
    g_dir = ls_test_tmpdir("model_synthetic");
    open_synth("tiny", 0, &g_ck, &g_ref);
    open_synth("tiny", 1, &g_ck8, &g_ref8);
    open_synth("qwen3.5-tiny", 1, &g_ck8q, &g_ref8q);
    open_synth("qwen3.5-tiny", 0, &g_ckq, &g_refq);
}

static void teardown(void)
{
    ls_model_close(g_ref);
    ls_model_close(g_ref8);
    ls_model_close(g_ref8q);
    ls_model_close(g_refq);
    ls_checkpoint_close(g_ckq);
    ls_checkpoint_close(g_ck);
    ls_checkpoint_close(g_ck8);
    ls_checkpoint_close(g_ck8q);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    g_ref = g_ref8 = g_ref8q = g_refq = NULL;
    g_ck = g_ck8 = g_ck8q = g_ckq = NULL;
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

/* Same shape and dtype as the checkpoint's matrix, and no data; block scales
 * exactly where the checkpoint's matrix has them. */
static void check_mat(const ls_wmat *got, const ls_wmat *want, const char *what, long layer)
{
    ck_assert_msg(got->data == NULL, "layer %ld %s: synthetic matrix has data", layer, what);
    ck_assert_msg(want->data != NULL || (want->rows == 0 && want->cols == 0),
                  "layer %ld %s: the checkpoint's matrix has no data", layer, what);
    ck_assert_msg(got->rows == want->rows && got->cols == want->cols && got->wtype == want->wtype,
                  "layer %ld %s: synthetic [%ld, %ld] wtype %d, checkpoint [%ld, %ld] wtype %d",
                  layer, what, got->rows, got->cols, (int)got->wtype, want->rows, want->cols,
                  (int)want->wtype);
    ck_assert_msg((got->scale != NULL) == (want->scale != NULL),
                  "layer %ld %s: block scales present %d, checkpoint %d", layer, what,
                  got->scale != NULL, want->scale != NULL);
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

/* The model's matrices that may be FP8, in binding order (model.c
 * bind_model, bind_layer): FP8 block scales are generated in this order. */
static long matrices(const ls_model *m, const ls_wmat **out, long cap)
{
    long n = 0;
#define PUT(w) do { ck_assert(n < cap); out[n++] = (w); } while (0)
    PUT(&m->lm_head);
    for (long l = 0; l < m->cfg.n_layers; l++) {
        const ls_model_layer *y = &m->layers[l];
        if (y->attention) {
            PUT(&y->q_proj);
            PUT(&y->k_proj);
            PUT(&y->v_proj);
            PUT(&y->o_proj);
        } else {
            PUT(&y->in_qkv);
            PUT(&y->in_z);
            PUT(&y->in_b);
            PUT(&y->in_a);
            PUT(&y->qkvz);
            PUT(&y->ba);
            PUT(&y->out_proj);
        }
        for (long e = 0; e < m->cfg.n_experts; e++) {
            PUT(&y->exp_gate[e]);
            PUT(&y->exp_up[e]);
            PUT(&y->exp_down[e]);
        }
        PUT(&y->sh_gate);
        PUT(&y->sh_up);
        PUT(&y->sh_down);
    }
#undef PUT
    return n;
}

/* Synthetic model m against the model ref bound from a checkpoint of its config. */
static void check_model(const ls_model *m, const ls_model *ref)
{
    const ls_model_config *c = &ref->cfg;
    const unsigned char *a = (const unsigned char *)&m->cfg, *b = (const unsigned char *)c;
    for (size_t i = 0; i < sizeof *c; i++)
        ck_assert_msg(a[i] == b[i], "config byte %zu differs: 0x%02x, given 0x%02x", i, a[i], b[i]);
    ck_assert_ptr_null(m->ck);
    ck_assert_msg(m->n_fp8 == ref->n_fp8, "%ld FP8 matrices, the checkpoint %ld", m->n_fp8,
                  ref->n_fp8);
    check_mat(&m->embed, &ref->embed, "embed", -1);
    check_mat(&m->lm_head, &ref->lm_head, "lm_head", -1);
    check_vec(m->final_norm, ref->final_norm, c->hidden, "final_norm", -1);
    for (long l = 0; l < c->n_layers; l++) {
        const ls_model_layer *s = &m->layers[l], *r = &ref->layers[l];
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
            check_mat(&s->in_qkv, &r->in_qkv, "in_qkv", l);
            check_mat(&s->in_z, &r->in_z, "in_z", l);
            check_mat(&s->in_b, &r->in_b, "in_b", l);
            check_mat(&s->in_a, &r->in_a, "in_a", l);
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
}

START_TEST(test_same_config_and_tensors)
{
    ck_assert_int_eq(g_ref->n_fp8, 0);
    ls_model *m = synthetic(&g_ref->cfg, 42);
    check_model(m, g_ref);
    ls_model_close(m);
}
END_TEST

/* FP8 configs (Qwen3-Next, Qwen3.5): the synth --fp8 checkpoint's wtypes,
 * shapes and scale shapes, and nothing FP8 that synth keeps bf16. */
START_TEST(test_fp8_same_tensors)
{
    const ls_model *refs[2] = {g_ref8, g_ref8q};
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(refs[i]->cfg.fp8 == 1 && refs[i]->n_fp8 > 0, "reference %d is not FP8", i);
        ls_model *m = synthetic(&refs[i]->cfg, 42);
        check_model(m, refs[i]);
        ck_assert_int_eq(m->lm_head.wtype, LS_WTYPE_BF16);
        ls_model_close(m);
    }
    ck_assert_int_eq(g_ref8q->cfg.arch, LS_MODEL_QWEN3_5_MOE);
}
END_TEST

/* The documented scale formula, reimplemented (model.h, model.c synth_f8). */
static uint64_t t_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float want_scale(uint64_t seed, long k, long j)
{
    uint64_t key = t_mix64(seed ^ t_mix64(0x8000000000000000ull | (uint64_t)k));
    uint64_t r = t_mix64(key + (uint64_t)(j + 1) * 0x9E3779B97F4A7C15ull);
    float u = (float)((int64_t)(r >> 40) - ((int64_t)1 << 23)) / 8388608.0f;
    float base = 0.04f / 448.0f;
    return base * (1.0f + u / 4.0f);
}

/* Block scales: the k-th FP8 matrix in binding order holds fp8_scales[k],
 * every value the formula's for (seed, k, block), within 0.04/448 x [0.75,
 * 1.25]; another seed gives others; the small parameters are those of the
 * bf16 synthetic model of the same seed. */
START_TEST(test_fp8_scales_from_seed)
{
    const ls_model *refs[2] = {g_ref8, g_ref8q};
    for (int i = 0; i < 2; i++) {
        ls_model *m = synthetic(&refs[i]->cfg, 9), *d = synthetic(&refs[i]->cfg, 10);
        ls_model_config c16 = refs[i]->cfg;
        c16.fp8 = 0;
        ls_model *b16 = synthetic(&c16, 9);
        ck_assert_int_eq(b16->n_fp8, 0);
        const ls_wmat *w[4096];
        long n = matrices(m, w, 4096), k = 0, differ = 0;
        for (long x = 0; x < n; x++) {
            if (!ls_wtype_is_f8(w[x]->wtype)) {
                ck_assert_ptr_null(w[x]->scale);
                continue;
            }
            ck_assert_msg(k < m->n_fp8 && w[x]->scale == m->fp8_scales[k],
                          "model %d: FP8 matrix %ld of the binding order is not fp8_scales[%ld]", i,
                          x, k);
            long nb = LS_FP8_BLOCKS(w[x]->rows) * LS_FP8_BLOCKS(w[x]->cols);
            for (long j = 0; j < nb; j++) {
                float want = want_scale(9, k, j), got = w[x]->scale[j];
                ck_assert_msg(ls_f32_bits(got) == ls_f32_bits(want),
                              "model %d: scale %ld of FP8 matrix %ld: 0x%08x, formula 0x%08x", i,
                              j, k, ls_f32_bits(got), ls_f32_bits(want));
                ck_assert_msg(got >= 0.75f * 0.04f / 448.0f && got <= 1.25f * 0.04f / 448.0f,
                              "model %d: scale %ld of FP8 matrix %ld = %g", i, j, k, (double)got);
                differ += ls_f32_bits(d->fp8_scales[k][j]) != ls_f32_bits(got);
            }
            k++;
        }
        ck_assert_msg(k == m->n_fp8, "model %d: %ld FP8 matrices walked, %ld bound", i, k, m->n_fp8);
        ck_assert_msg(differ > 0, "model %d: seeds 9 and 10 give the same block scales", i);
        long j = first_diff(m->final_norm, b16->final_norm, m->cfg.hidden);
        ck_assert_msg(j < 0, "model %d: final_norm[%ld] differs from the bf16 model's", i, j);
        for (long l = 0; l < m->cfg.n_layers; l++) {
            j = first_diff(m->layers[l].in_norm, b16->layers[l].in_norm, m->cfg.hidden);
            ck_assert_msg(j < 0, "model %d: layer %ld in_norm[%ld] differs from the bf16 model's", i,
                          l, j);
            if (!m->layers[l].attention) {
                j = first_diff(m->layers[l].A_log, b16->layers[l].A_log, m->cfg.lin_v_heads);
                ck_assert_msg(j < 0, "model %d: layer %ld A_log[%ld] differs from the bf16 model's",
                              i, l, j);
            }
        }
        ls_model_close(m);
        ls_model_close(d);
        ls_model_close(b16);
    }
}
END_TEST

/* Every small parameter bitwise equal to the written checkpoint's (seed 7,
 * the fixture's); another seed gives others. */
static void expect_vec(const float *got, const float *want, long n, const char *what, int model,
                       long layer)
{
    long i = first_diff(got, want, n);
    ck_assert_msg(i < 0, "model %d layer %ld %s[%ld]: 0x%08x, the checkpoint's 0x%08x", model, layer,
                  what, i, i < 0 ? 0 : ls_f32_bits(got[i]), i < 0 ? 0 : ls_f32_bits(want[i]));
}

START_TEST(test_small_params_equal_checkpoint)
{
    const ls_model *refs[4] = {g_ref, g_refq, g_ref8, g_ref8q};
    for (int k = 0; k < 4; k++) {
        const ls_model_config *c = &refs[k]->cfg;
        ls_model *a = synthetic(c, 7), *d = synthetic(c, 8);
        const ls_model *r = refs[k];
        expect_vec(a->final_norm, r->final_norm, c->hidden, "final_norm", k, -1);
        int gdn_seen = 0;
        for (long l = 0; l < c->n_layers; l++) {
            const ls_model_layer *x = &a->layers[l], *y = &r->layers[l];
            expect_vec(x->in_norm, y->in_norm, c->hidden, "in_norm", k, l);
            expect_vec(x->post_norm, y->post_norm, c->hidden, "post_norm", k, l);
            if (x->attention) {
                expect_vec(x->q_norm, y->q_norm, c->head_dim, "q_norm", k, l);
                expect_vec(x->k_norm, y->k_norm, c->head_dim, "k_norm", k, l);
                continue;
            }
            gdn_seen = 1;
            expect_vec(x->A_log, y->A_log, c->lin_v_heads, "A_log", k, l);
            expect_vec(x->dt_bias, y->dt_bias, c->lin_v_heads, "dt_bias", k, l);
            expect_vec(x->gnorm, y->gnorm, c->lin_v_dim, "gnorm", k, l);
        }
        ck_assert_msg(gdn_seen, "model %d has no gated DeltaNet layer", k);
        ck_assert_msg(first_diff(a->final_norm, d->final_norm, c->hidden) >= 0,
                      "model %d: seeds 7 and 8 give the same final_norm", k);
        ls_model_close(a);
        ls_model_close(d);
    }
}
END_TEST

/* Every matrix of a model, with a name for messages. */
static long all_matrices(const ls_model *m, const ls_wmat **out, char (*name)[64], long cap)
{
    long n = 0;
#define PUT(w, fmt, ...) do { ck_assert(n < cap); snprintf(name[n], 64, fmt, __VA_ARGS__); out[n++] = (w); } while (0)
    PUT(&m->embed, "%s", "embed");
    PUT(&m->lm_head, "%s", "lm_head");
    for (long l = 0; l < m->cfg.n_layers; l++) {
        const ls_model_layer *y = &m->layers[l];
        if (y->attention) {
            PUT(&y->q_proj, "layer %ld q_proj", l);
            PUT(&y->k_proj, "layer %ld k_proj", l);
            PUT(&y->v_proj, "layer %ld v_proj", l);
            PUT(&y->o_proj, "layer %ld o_proj", l);
        } else if (m->cfg.arch == LS_MODEL_QWEN3_5_MOE) {
            PUT(&y->in_qkv, "layer %ld in_proj_qkv", l);
            PUT(&y->in_z, "layer %ld in_proj_z", l);
            PUT(&y->in_b, "layer %ld in_proj_b", l);
            PUT(&y->in_a, "layer %ld in_proj_a", l);
        } else {
            PUT(&y->qkvz, "layer %ld in_proj_qkvz", l);
            PUT(&y->ba, "layer %ld in_proj_ba", l);
        }
        if (!y->attention) {
            PUT(&y->conv, "layer %ld conv1d", l);
            PUT(&y->out_proj, "layer %ld out_proj", l);
        }
        PUT(&y->router, "layer %ld router", l);
        for (long e = 0; e < m->cfg.n_experts; e++) {
            PUT(&y->exp_gate[e], "layer %ld expert %ld gate", l, e);
            PUT(&y->exp_up[e], "layer %ld expert %ld up", l, e);
            PUT(&y->exp_down[e], "layer %ld expert %ld down", l, e);
        }
        PUT(&y->sh_gate, "layer %ld shared gate", l);
        PUT(&y->sh_up, "layer %ld shared up", l);
        PUT(&y->sh_down, "layer %ld shared down", l);
        PUT(&y->sh_gate_w, "layer %ld shared expert gate", l);
    }
#undef PUT
    return n;
}

/* Rows r0 .. r0 + n - 1 of synthetic matrix g generated alone equal those
 * rows of the checkpoint's matrix w: the bytes, and for FP8 the scale rows
 * from block r0 / 128 on (where a tensor-parallel rank's slice points). */
static void expect_rows(const ls_wmat *g, const ls_wmat *w, long r0, long n, const char *what,
                        int model)
{
    size_t eb = (size_t)ls_wtype_bytes(w->wtype), row = (size_t)w->cols * eb;
    size_t nsc = (size_t)(LS_FP8_BLOCKS(n) * LS_FP8_BLOCKS(w->cols));
    unsigned char *buf = malloc(row * (size_t)n + 1);
    float *sc = malloc(sizeof(float) * (nsc + 1));
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(g->gen != NULL, "model %d %s: no generator", model, what);
    ck_assert_msg(g->gen->fill(g->gen, g->gen_row0 + r0, n, g->cols, buf,
                               ls_wtype_is_f8(g->wtype) ? sc : NULL, &err) == LS_OK,
                  "model %d %s rows %ld+%ld: %s", model, what, r0, n, err.msg);
    const unsigned char *want = (const unsigned char *)w->data + (size_t)r0 * row;
    for (size_t i = 0; i < row * (size_t)n; i++)
        ck_assert_msg(buf[i] == want[i], "model %d %s rows %ld..%ld: byte %zu (row %zu) is 0x%02x, "
                      "the checkpoint's 0x%02x", model, what, r0, r0 + n - 1, i, r0 + i / row,
                      buf[i], want[i]);
    if (ls_wtype_is_f8(w->wtype)) {
        const float *ws = ls_wmat_scale_row(w, r0);
        for (size_t i = 0; i < nsc; i++)
            ck_assert_msg(ls_f32_bits(sc[i]) == ls_f32_bits(ws[i]), "model %d %s rows %ld..%ld: "
                          "scale %zu is 0x%08x, the checkpoint's 0x%08x", model, what, r0,
                          r0 + n - 1, i, ls_f32_bits(sc[i]), ls_f32_bits(ws[i]));
    }
    free(buf);
    free(sc);
}

/* The generator's parameters (what a device generator computes from,
 * ls_wgen.normal) give every bf16 value of the checkpoint's matrix; for an
 * FP8 matrix, the value each e4m3 byte quantises to within its block. */
static void expect_params(const ls_wmat *g, const ls_wmat *w, const char *what, int model)
{
    ck_assert_msg(g->gen->normal && g->gen->rows == w->rows, "model %d %s: no device parameters",
                  model, what);
    /* every element; under AddressSanitizer (several times slower) every
     * 7th of each row, from a column that moves with the row */
    const long step = LS_TEST_ASAN ? 7 : 1;
    for (long r = 0; r < w->rows; r++)
        for (long c = r % step; c < w->cols; c += step) {
            uint64_t j = (uint64_t)(r * w->cols + c);
            float z = (float)ls_synth_irwin_hall(ls_synth_draw(g->gen->key, j));
            uint16_t v = ls_f32_to_bf16(g->gen->base + z * g->gen->c);
            if (w->wtype == LS_WTYPE_BF16) {
                uint16_t want = ((const uint16_t *)w->data)[j];
                ck_assert_msg(v == want, "model %d %s element %llu: parameters give 0x%04x, the "
                              "checkpoint holds 0x%04x", model, what, (unsigned long long)j, v,
                              want);
            } else {
                float s = ls_wmat_scale_row(w, r)[c / LS_FP8_BLOCK];
                uint8_t q = ls_f32_to_e4m3(ls_bf16_to_f32(v) / s);
                uint8_t want = ((const uint8_t *)w->data)[j];
                ck_assert_msg(q == want, "model %d %s element %llu: parameters give e4m3 0x%02x, "
                              "the checkpoint holds 0x%02x", model, what, (unsigned long long)j, q,
                              want);
            }
        }
}

/* Every matrix generated whole equals the written checkpoint's tensor
 * (bf16 bytes; FP8 e4m3 bytes and block scales); a slice generated alone
 * equals the slice of the whole: any rows of a bf16 matrix; for FP8 whole
 * 128-row blocks, and a range inside one block (what TP may take). */
START_TEST(test_weights_equal_checkpoint)
{
    const ls_model *refs[4] = {g_ref, g_refq, g_ref8, g_ref8q};
    static const ls_wmat *ws[4096], *gs[4096];
    static char names[4096][64], gnames[4096][64];
    for (int k = 0; k < 4; k++) {
        ls_model *m = synthetic(&refs[k]->cfg, 7);
        long n = all_matrices(refs[k], ws, names, 4096);
        ck_assert_int_eq(all_matrices(m, gs, gnames, 4096), n);
        long f8 = 0;
        for (long i = 0; i < n; i++) {
            const ls_wmat *w = ws[i], *g = gs[i];
            ck_assert_msg(g->rows == w->rows && g->cols == w->cols && g->wtype == w->wtype,
                          "model %d %s: shape or type differs", k, names[i]);
            expect_rows(g, w, 0, w->rows, names[i], k);
            expect_params(g, w, names[i], k);
            if (!ls_wtype_is_f8(w->wtype)) {
                if (w->rows >= 3) expect_rows(g, w, w->rows / 3, w->rows / 2, names[i], k);
                continue;
            }
            f8++;
            if (w->rows > LS_FP8_BLOCK)
                expect_rows(g, w, LS_FP8_BLOCK, w->rows - LS_FP8_BLOCK, names[i], k);
            if (w->rows >= 4) expect_rows(g, w, w->rows / 4, w->rows / 4, names[i], k);
        }
        ck_assert_msg((f8 > 0) == (refs[k]->cfg.fp8 != 0), "model %d: %ld FP8 matrices", k, f8);
        ls_model_close(m);
    }
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
    c = g_ref->cfg;
    c.fp8 = 2;
    check_refused(&c, "fp8 = 2");
}
END_TEST

/* The CPU backend wraps a synthetic model's matrices by generating them
 * (wrap_generated); a matrix with neither data nor a generator is still
 * refused (wrap_weights with NULL), saying why. */
START_TEST(test_cpu_backend_generates)
{
    ls_error err;
    ls_error_clear(&err);
    ls_model *m = synthetic(&g_ref->cfg, 3);
    ls_backend *be = NULL;
    ck_assert_msg(ls_backend_cpu_create(1, &be, &err) == LS_OK, "%s", err.msg);
    ck_assert_ptr_nonnull(be->wrap_generated);
    ls_buf *b = NULL;
    ck_assert_int_eq(be->wrap_weights(be, NULL, 64, LS_WTYPE_BF16, &b, &err), LS_E_UNSUPPORTED);
    ck_assert_ptr_null(b);
    ck_assert_msg(strstr(err.msg, "no data") && strstr(err.msg, "no generator"),
                  "wrap_weights(NULL) message: %s", err.msg);
    ls_error_clear(&err);
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    ls_engine *e = NULL;
    ck_assert_msg(ls_engine_create(m, be, &o, 1, 8, &e, &err) == LS_OK, "%s", err.msg);
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
    tcase_add_test(tc, test_fp8_same_tensors);
    tcase_add_test(tc, test_fp8_scales_from_seed);
    tcase_add_test(tc, test_small_params_equal_checkpoint);
    tcase_add_test(tc, test_weights_equal_checkpoint);
    tcase_add_test(tc, test_bad_config_refused);
    tcase_add_test(tc, test_cpu_backend_generates);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
