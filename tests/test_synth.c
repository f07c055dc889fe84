/* Synthetic checkpoints: the safetensors writer's layout, the generator's
 * determinism (pinned digests), presets, --layers / --config-only / sharding,
 * and clear failures on bad input. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/util.h"
#include "fingerprint/sha256.h"
#include "io/checkpoint.h"
#include "numerics/reduce.h"
#include "synth/synth.h"
#include "testutil.h"

/* Digests of `lockstep synth --preset tiny --seed 1`. They change only when
 * the generator, the scales, the tensor list or the file formats change: then
 * bump LS_SYNTH_GENERATOR_VERSION and update docs/synth.md with the new values. */
#define TINY_SEED1_CONFIG_SHA256 "4c5c320722f1fd4fe4899a5daf213342d89f71bcd644e729f0d2a62da9b2af04"
#define TINY_SEED1_MODEL_SHA256 "fbdbe5d8c3be4a8c20c7bd28cce1042302152138e907cd22a06e8aabbe71ecb3"

/* ---- helpers ---------------------------------------------------------------------- */

static void file_sha256(const char *path, char hex[65])
{
    size_t len = 0;
    char *buf = ls_test_read(path, &len);
    ls_digest d;
    ls_error err;
    ck_assert_int_eq(ls_sha256_buf(buf, len, &d, &err), LS_OK);
    ls_digest_to_hex(&d, hex);
    free(buf);
}

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

typedef struct st_entry {
    char name[128];
    char dtype[16];
    int ndim;
    int64_t shape[8];
    uint64_t begin, end;
} st_entry;

typedef struct st_file {
    char *image;           /* whole file */
    size_t len;
    uint64_t data_start;   /* 8 + header length */
    st_entry *e;           /* sorted by name */
    size_t n;
    json_t *meta;          /* __metadata__, owned */
} st_file;

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

/* Independent strict reading of a safetensors file: 8-byte LE length, header
 * padded to a multiple of 8, tensors in name order, contiguous, covering the
 * data region exactly. */
static void st_load(const char *path, st_file *f)
{
    memset(f, 0, sizeof *f);
    f->image = ls_test_read(path, &f->len);
    ck_assert_uint_ge(f->len, 8);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)(uint8_t)f->image[i] << (8 * i);
    ck_assert_msg((8 + n) % 8 == 0, "%s: header length %llu not padded", path,
                  (unsigned long long)n);
    ck_assert_uint_le(8 + n, f->len);
    f->data_start = 8 + n;
    json_error_t jerr;
    json_t *h = json_loadb(f->image + 8, n, JSON_REJECT_DUPLICATES, &jerr);
    ck_assert_msg(h != NULL, "%s: header: %s", path, jerr.text);
    /* Padding is spaces only, after the closing brace. */
    const char *end = f->image + 8 + n;
    const char *p = end;
    while (p > f->image + 8 && p[-1] == ' ') p--;
    ck_assert_msg(p > f->image + 8 && p[-1] == '}', "%s: padding is not spaces", path);
    f->meta = json_incref(json_object_get(h, "__metadata__"));
    f->e = calloc(json_object_size(h) + 1, sizeof *f->e);
    const char *key;
    json_t *val;
    json_object_foreach(h, key, val)
    {
        if (strcmp(key, "__metadata__") == 0) continue;
        st_entry *e = &f->e[f->n++];
        snprintf(e->name, sizeof e->name, "%s", key);
        snprintf(e->dtype, sizeof e->dtype, "%s", json_string_value(json_object_get(val, "dtype")));
        json_t *shape = json_object_get(val, "shape"), *off = json_object_get(val, "data_offsets");
        e->ndim = (int)json_array_size(shape);
        for (int i = 0; i < e->ndim; i++)
            e->shape[i] = json_integer_value(json_array_get(shape, (size_t)i));
        e->begin = (uint64_t)json_integer_value(json_array_get(off, 0));
        e->end = (uint64_t)json_integer_value(json_array_get(off, 1));
    }
    json_decref(h);
    qsort(f->e, f->n, sizeof *f->e, cmp_entry);
    uint64_t at = 0;
    for (size_t i = 0; i < f->n; i++) {
        ck_assert_msg(f->e[i].begin == at, "%s: %s starts at %llu, expected %llu", path,
                      f->e[i].name, (unsigned long long)f->e[i].begin, (unsigned long long)at);
        uint64_t numel = 1;
        for (int d = 0; d < f->e[i].ndim; d++) numel *= (uint64_t)f->e[i].shape[d];
        uint64_t esize = strcmp(f->e[i].dtype, "F32") == 0 ? 4 : strcmp(f->e[i].dtype, "U8") == 0 ? 1 : 2;
        ck_assert_msg(f->e[i].end - f->e[i].begin == numel * esize, "%s: %s has wrong size", path,
                      f->e[i].name);
        at = f->e[i].end;
    }
    ck_assert_msg(f->data_start + at == f->len, "%s: data region %llu bytes, file has %zu", path,
                  (unsigned long long)at, f->len - (size_t)f->data_start);
}

static void st_free(st_file *f)
{
    free(f->image);
    free(f->e);
    json_decref(f->meta);
}

static const st_entry *st_find(const st_file *f, const char *name)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->e[i].name, name) == 0) return &f->e[i];
    return NULL;
}

static void assert_shape(const st_file *f, const char *name, int ndim, int64_t d0, int64_t d1,
                         int64_t d2)
{
    const st_entry *e = st_find(f, name);
    ck_assert_msg(e != NULL, "tensor %s missing", name);
    ck_assert_str_eq(e->dtype, "BF16");
    ck_assert_msg(e->ndim == ndim, "%s: %d dims, expected %d", name, e->ndim, ndim);
    int64_t want[3] = {d0, d1, d2};
    for (int i = 0; i < ndim; i++)
        ck_assert_msg(e->shape[i] == want[i], "%s: dim %d is %lld, expected %lld", name, i,
                      (long long)e->shape[i], (long long)want[i]);
}

/* ---- the writer ------------------------------------------------------------------------ */

START_TEST(test_writer_layout)
{
    char *dir = ls_test_tmpdir("synth");
    char path[4200];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    ls_error err;
    ls_safetensors_writer *w = NULL;
    ck_assert_int_eq(ls_safetensors_writer_new(&w, &err), LS_OK);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3f80, 0x4000, 0x4040};
    uint8_t c[1] = {7};
    float s = 42.0f;
    int64_t sa[2] = {2, 3}, sb[1] = {3}, sc[1] = {1}, sz[2] = {0, 5};
    /* Added out of order: the file must hold them in name order. */
    ck_assert_int_eq(ls_safetensors_writer_add(w, "zeta", LS_DTYPE_F32, 2, sa, a, &err), LS_OK);
    ck_assert_int_eq(ls_safetensors_writer_add(w, "alpha", LS_DTYPE_BF16, 1, sb, b, &err), LS_OK);
    ck_assert_int_eq(ls_safetensors_writer_add(w, "mid \"q\"", LS_DTYPE_U8, 1, sc, c, &err), LS_OK);
    ck_assert_int_eq(ls_safetensors_writer_add(w, "empty", LS_DTYPE_F32, 2, sz, NULL, &err), LS_OK);
    ck_assert_int_eq(ls_safetensors_writer_add(w, "scalar", LS_DTYPE_F32, 0, NULL, &s, &err), LS_OK);
    /* Misuse is refused with a message naming the tensor. */
    ck_assert_int_eq(ls_safetensors_writer_add(w, "alpha", LS_DTYPE_BF16, 1, sb, b, &err),
                     LS_E_USAGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "alpha"));
    ck_assert_int_eq(ls_safetensors_writer_add(w, "__metadata__", LS_DTYPE_BF16, 1, sb, b, &err),
                     LS_E_USAGE);
    ck_assert_int_eq(ls_safetensors_writer_add(w, "nodata", LS_DTYPE_BF16, 1, sb, NULL, &err),
                     LS_E_USAGE);
    ck_assert_int_eq(ls_safetensors_writer_write(w, path, &err), LS_OK);
    ls_safetensors_writer_free(w);

    /* The project's strict reader accepts it. */
    ls_safetensors *rd = NULL;
    ck_assert_msg(ls_safetensors_open(path, &rd, &err) == LS_OK, "%s", err.msg);
    ck_assert_uint_eq(ls_safetensors_count(rd), 5);
    ck_assert_str_eq(ls_safetensors_at(rd, 0)->name, "alpha");
    ls_safetensors_close(rd);

    st_file f;
    st_load(path, &f);
    ck_assert_uint_eq(f.n, 5);
    ck_assert_str_eq(f.e[0].name, "alpha");
    ck_assert_str_eq(f.e[1].name, "empty");
    ck_assert_str_eq(f.e[2].name, "mid \"q\"");
    ck_assert_str_eq(f.e[3].name, "scalar");
    ck_assert_str_eq(f.e[4].name, "zeta");
    ck_assert_int_eq(f.e[3].ndim, 0);
    /* Default metadata, as Hugging Face writes it. */
    ck_assert_str_eq(json_string_value(json_object_get(f.meta, "format")), "pt");
    ck_assert_uint_eq(json_object_size(f.meta), 1);
    ck_assert_mem_eq(f.image + f.data_start + st_find(&f, "zeta")->begin, a, sizeof a);
    ck_assert_mem_eq(f.image + f.data_start + st_find(&f, "alpha")->begin, b, sizeof b);
    ck_assert_mem_eq(f.image + f.data_start + st_find(&f, "scalar")->begin, &s, 4);
    st_free(&f);

    /* An empty file is valid too, and explicit metadata replaces the default. */
    ck_assert_int_eq(ls_safetensors_writer_new(&w, &err), LS_OK);
    ck_assert_int_eq(ls_safetensors_writer_set_metadata(w, "k", "v1", &err), LS_OK);
    ck_assert_int_eq(ls_safetensors_writer_set_metadata(w, "k", "v2", &err), LS_OK);
    ck_assert_int_eq(ls_safetensors_writer_write(w, path, &err), LS_OK);
    ls_safetensors_writer_free(w);
    st_load(path, &f);
    ck_assert_uint_eq(f.n, 0);
    ck_assert_str_eq(json_string_value(json_object_get(f.meta, "k")), "v2");
    ck_assert_ptr_null(json_object_get(f.meta, "format"));
    st_free(&f);
    ls_test_sh(NULL, "rm -rf '%s'", dir);
    free(dir);
}
END_TEST

/* ---- the generator ------------------------------------------------------------------------ */

START_TEST(test_generator_fixed_values)
{
    /* splitmix64 from state 0: its published first output. */
    ck_assert_uint_eq(ls_synth_draw(0, 0), 0xE220A8397B1DCDAFull);
    /* Irwin–Hall: bounds, centre. */
    ck_assert_int_eq(ls_synth_irwin_hall(0), -262140);
    ck_assert_int_eq(ls_synth_irwin_hall(UINT64_MAX), 262140);
    ck_assert_int_eq(ls_synth_irwin_hall(0x800080007fff7fffull), 0);
    /* Names and seeds select independent streams. */
    ck_assert_uint_ne(ls_synth_key(1, "a"), ls_synth_key(2, "a"));
    ck_assert_uint_ne(ls_synth_key(1, "a"), ls_synth_key(1, "b"));
    /* Moments of 10^5 draws: mean ~ 0, std ~ LS_SYNTH_IH_STD. */
    double s1 = 0, s2 = 0;
    uint64_t key = ls_synth_key(7, "moments");
    for (uint64_t i = 0; i < 100000; i++) {
        double z = ls_synth_irwin_hall(ls_synth_draw(key, i));
        s1 += z;
        s2 += z * z;
    }
    double mean = s1 / 1e5, sd = sqrt(s2 / 1e5 - mean * mean);
    ck_assert_double_lt(fabs(mean), 0.01 * LS_SYNTH_IH_STD);
    ck_assert_double_lt(fabs(sd / LS_SYNTH_IH_STD - 1.0), 0.01);
}
END_TEST

/* The tiny preset's tensor list (the caller frees it). */
static ls_synth_tensor *tiny_tensors(size_t *n)
{
    ls_synth_config cfg;
    ls_error err;
    ls_synth_tensor *t = NULL;
    ck_assert_int_eq(ls_synth_preset("tiny", &cfg, &err), LS_OK);
    ck_assert_int_eq(ls_synth_list_tensors(&cfg, &t, n, &err), LS_OK);
    return t;
}

/* A matrix's values, whole or from any row, in whatever blocks and vector
 * code the fill runs (AVX-512 where the CPU has it), are the element formula
 * of synth.h: bf16_rne(base + fp32(ih) * c), ih = irwin_hall(draw(key, i)). */
START_TEST(test_fill_equals_element_formula)
{
    ls_error err;
    size_t n = 0;
    ls_synth_tensor *t = tiny_tensors(&n);
    int checked = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t key;
        float c, base;
        if (t[i].ndim != 2 || !ls_synth_normal_params(&t[i], 11, &key, &c, &base)) continue;
        const int64_t R = t[i].shape[0], C = t[i].shape[1];
        uint16_t *v = malloc(sizeof *v * (size_t)(R * C));
        ck_assert_ptr_nonnull(v);
        ls_synth_fill(&t[i], 11, v);
        for (int64_t j = 0; j < R * C; j++) {
            float want = base + (float)ls_synth_irwin_hall(ls_synth_draw(key, (uint64_t)j)) * c;
            ck_assert_uint_eq(v[j], ls_f32_to_bf16(want));
        }
        /* rows from an offset that is no multiple of a block, a count that is none either */
        const int64_t r0 = R / 3, rows = R - R / 3 - 1;
        uint16_t *w = malloc(sizeof *w * (size_t)(rows * C));
        ck_assert_ptr_nonnull(w);
        ck_assert_int_eq(ls_synth_fill_rows(&t[i], 11, r0, rows, w, NULL, &err), LS_OK);
        ck_assert_int_eq(memcmp(w, v + r0 * C, sizeof *w * (size_t)(rows * C)), 0);
        free(w);
        free(v);
        checked++;
    }
    ck_assert_int_gt(checked, 4);
    free(t);
}
END_TEST

START_TEST(test_elementary_functions)
{
    /* The deterministic versions agree with libm to a few ulp (libm is only
     * the yardstick here; synth never calls it). */
    const double xs[] = {1e-3, 0.1, 0.5, 1.0, 1.5, 2.0, 7.25, 16.0, 2048.0, 151936.0, 5726623060.0};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        double x = xs[i];
        ck_assert_double_le(fabs(ls_synth_sqrt(x) - sqrt(x)), 4e-16 * sqrt(x));
        ck_assert_double_le(fabs(ls_synth_log(x) - log(x)), 4e-16 * (fabs(log(x)) + 1));
    }
    const double es[] = {-20.0, -6.9, -1.0, -1e-3, 0.0, 0.3, 1.0, 4.6, 30.0};
    for (size_t i = 0; i < sizeof es / sizeof es[0]; i++)
        ck_assert_double_le(fabs(ls_synth_exp(es[i]) - exp(es[i])), 8e-16 * exp(es[i]));
    ck_assert(ls_synth_log(1.0) == 0.0);
    ck_assert(ls_synth_exp(0.0) == 1.0);
    ck_assert(ls_synth_sqrt(4.0) == 2.0);
}
END_TEST

START_TEST(test_initialiser_ranges)
{
    size_t n = 0;
    ls_synth_tensor *t = tiny_tensors(&n);
    for (size_t i = 1; i < n; i++) ck_assert_int_lt(strcmp(t[i - 1].name, t[i].name), 0);
    int seen_alog = 0, seen_dt = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t v[64];
        if (t[i].init == LS_SYNTH_INIT_A_LOG) {
            ls_synth_fill(&t[i], 1, v);
            for (int64_t j = 0; j < t[i].shape[0]; j++) {
                float a = ls_bf16_to_f32(v[j]); /* log A, A in [1, 16) */
                ck_assert(a >= 0.0f && a <= 2.78f);
            }
            seen_alog++;
        } else if (t[i].init == LS_SYNTH_INIT_DT_BIAS) {
            ls_synth_fill(&t[i], 1, v);
            for (int64_t j = 0; j < t[i].shape[0]; j++) {
                /* softplus(dt_bias) = dt in [1e-3, 1e-1): dt_bias in [-6.91, -2.25]. */
                float b = ls_bf16_to_f32(v[j]);
                ck_assert(b > -6.95f && b < -2.2f);
            }
            seen_dt++;
        }
    }
    ck_assert_int_eq(seen_alog, 2);
    ck_assert_int_eq(seen_dt, 2);
    free(t);
}
END_TEST

/* ---- the CLI ------------------------------------------------------------------------------ */

START_TEST(test_tiny_digests_pinned)
{
    char *dir = ls_test_tmpdir("synth");
    char *out = NULL;
    int rc = ls_test_cli(&out, "synth --preset tiny --seed 1 --out '%s/ck'", dir);
    ck_assert_msg(rc == 0, "synth failed: %s", out);
    free(out);
    char path[4200], hex[65];
    snprintf(path, sizeof path, "%s/ck/config.json", dir);
    file_sha256(path, hex);
    ck_assert_str_eq(hex, TINY_SEED1_CONFIG_SHA256);
    snprintf(path, sizeof path, "%s/ck/model.safetensors", dir);
    file_sha256(path, hex);
    ck_assert_str_eq(hex, TINY_SEED1_MODEL_SHA256);
    /* Nothing else in the directory, no temporary left beside it. */
    ck_assert_int_eq(ls_test_sh(&out, "ls -A '%s/ck' | wc -l; ls -A '%s' | wc -l", dir, dir), 0);
    ck_assert_str_eq(out, "2\n1\n");
    free(out);

    /* The config it wrote, fed back through --config, gives the same bytes. */
    rc = ls_test_cli(&out, "synth --config '%s/ck/config.json' --seed 1 --out '%s/again'", dir, dir);
    ck_assert_msg(rc == 0, "synth --config failed: %s", out);
    free(out);
    ck_assert_int_eq(ls_test_sh(NULL, "cmp '%s/ck/model.safetensors' '%s/again/model.safetensors'"
                                      " && cmp '%s/ck/config.json' '%s/again/config.json'",
                                dir, dir, dir, dir),
                     0);
    ls_test_sh(NULL, "rm -rf '%s'", dir);
    free(dir);
}
END_TEST

START_TEST(test_tiny_tensors_and_seeds)
{
    char *dir = ls_test_tmpdir("synth");
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset tiny --seed 1 --out '%s/s1'", dir), 0);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset tiny --seed 2 --out '%s/s2'", dir), 0);
    free(out);
    char p1[4200], p2[4200], h1[65], h2[65];
    snprintf(p1, sizeof p1, "%s/s1/model.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/s2/model.safetensors", dir);
    file_sha256(p1, h1);
    file_sha256(p2, h2);
    ck_assert_str_ne(h1, h2);

    st_file a, b;
    st_load(p1, &a);
    st_load(p2, &b);
    ck_assert_uint_eq(a.n, b.n);
    /* 3 global + per layer: 2 norms + MoE (router, 8x3 experts, 3 shared, shared gate)
     * + GDN 7 (layers 0, 2) or attention 6 (layers 1, 3). */
    ck_assert_uint_eq(a.n, 3 + 4 * (2 + 1 + 24 + 4) + 2 * 7 + 2 * 6);
    /* Shapes from the tiny config: D 128, V 1000, 4q/2kv x 32, GDN 2/4 x 32, K 4,
     * 8 experts, I = I_s = 64. */
    assert_shape(&a, "model.embed_tokens.weight", 2, 1000, 128, 0);
    assert_shape(&a, "lm_head.weight", 2, 1000, 128, 0);
    assert_shape(&a, "model.norm.weight", 1, 128, 0, 0);
    assert_shape(&a, "model.layers.0.linear_attn.in_proj_qkvz.weight", 2, 384, 128, 0);
    assert_shape(&a, "model.layers.0.linear_attn.in_proj_ba.weight", 2, 8, 128, 0);
    assert_shape(&a, "model.layers.0.linear_attn.conv1d.weight", 3, 256, 1, 4);
    assert_shape(&a, "model.layers.2.linear_attn.A_log", 1, 4, 0, 0);
    assert_shape(&a, "model.layers.2.linear_attn.dt_bias", 1, 4, 0, 0);
    assert_shape(&a, "model.layers.2.linear_attn.norm.weight", 1, 32, 0, 0);
    assert_shape(&a, "model.layers.2.linear_attn.out_proj.weight", 2, 128, 128, 0);
    assert_shape(&a, "model.layers.1.self_attn.q_proj.weight", 2, 256, 128, 0);
    assert_shape(&a, "model.layers.1.self_attn.k_proj.weight", 2, 64, 128, 0);
    assert_shape(&a, "model.layers.3.self_attn.v_proj.weight", 2, 64, 128, 0);
    assert_shape(&a, "model.layers.3.self_attn.o_proj.weight", 2, 128, 128, 0);
    assert_shape(&a, "model.layers.3.self_attn.q_norm.weight", 1, 32, 0, 0);
    assert_shape(&a, "model.layers.3.mlp.gate.weight", 2, 8, 128, 0);
    assert_shape(&a, "model.layers.3.mlp.experts.7.gate_proj.weight", 2, 64, 128, 0);
    assert_shape(&a, "model.layers.0.mlp.experts.0.down_proj.weight", 2, 128, 64, 0);
    assert_shape(&a, "model.layers.0.mlp.shared_expert.up_proj.weight", 2, 64, 128, 0);
    assert_shape(&a, "model.layers.0.mlp.shared_expert_gate.weight", 2, 1, 128, 0);
    ck_assert_ptr_null(st_find(&a, "model.layers.0.self_attn.q_proj.weight"));
    ck_assert_ptr_null(st_find(&a, "model.layers.1.linear_attn.A_log"));
    /* Every tensor differs between seeds. */
    for (size_t i = 0; i < a.n; i++)
        ck_assert_msg(memcmp(a.image + a.data_start + a.e[i].begin,
                             b.image + b.data_start + b.e[i].begin, a.e[i].end - a.e[i].begin) != 0,
                      "%s is the same for seeds 1 and 2", a.e[i].name);
    /* Spread: embeddings ~ N(0, 1); zero-centred norms small. */
    const st_entry *emb = st_find(&a, "model.embed_tokens.weight");
    const uint16_t *ev = (const uint16_t *)(const void *)(a.image + a.data_start + emb->begin);
    double s2 = 0;
    for (int i = 0; i < 128000; i++) s2 += (double)ls_bf16_to_f32(ev[i]) * ls_bf16_to_f32(ev[i]);
    ck_assert_double_lt(fabs(sqrt(s2 / 128000) - 1.0), 0.02);
    st_free(&a);
    st_free(&b);
    ls_test_sh(NULL, "rm -rf '%s'", dir);
    free(dir);
}
END_TEST

START_TEST(test_layers_and_config_only)
{
    char *dir = ls_test_tmpdir("synth");
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset tiny --seed 1 --out '%s/full'", dir), 0);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset tiny --seed 1 --layers 2 --out '%s/two'", dir), 0);
    free(out);
    char path[4200];
    snprintf(path, sizeof path, "%s/two/config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(cfg);
    ck_assert_int_eq(json_integer_value(json_object_get(cfg, "num_hidden_layers")), 2);
    ck_assert_uint_eq(json_array_size(json_object_get(cfg, "layer_types")), 2);
    json_decref(cfg);

    /* The two-layer model's tensors are byte-identical to the full model's. */
    st_file full, two;
    snprintf(path, sizeof path, "%s/full/model.safetensors", dir);
    st_load(path, &full);
    snprintf(path, sizeof path, "%s/two/model.safetensors", dir);
    st_load(path, &two);
    ck_assert_uint_eq(two.n, 3 + 2 * (2 + 1 + 24 + 4) + 7 + 6);
    for (size_t i = 0; i < two.n; i++) {
        const st_entry *e = st_find(&full, two.e[i].name);
        ck_assert_msg(e != NULL, "%s not in the full model", two.e[i].name);
        ck_assert_msg(memcmp(full.image + full.data_start + e->begin,
                             two.image + two.data_start + two.e[i].begin, e->end - e->begin) == 0,
                      "%s differs from the full model", e->name);
    }
    ck_assert_ptr_null(st_find(&two, "model.layers.2.input_layernorm.weight"));
    st_free(&full);
    st_free(&two);

    /* --config-only: config.json alone, identical to the full write's. */
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset tiny --seed 1 --config-only --out '%s/cfg'", dir), 0);
    free(out);
    ck_assert_int_eq(ls_test_sh(&out, "ls -A '%s/cfg'", dir), 0);
    ck_assert_str_eq(out, "config.json\n");
    free(out);
    ck_assert_int_eq(ls_test_sh(NULL, "cmp '%s/cfg/config.json' '%s/full/config.json'", dir, dir), 0);

    /* The 80B preset's config: released values, --layers respected. */
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset qwen3-next-80b-a3b --seed 1 --config-only "
                                       "--layers 4 --out '%s/big'", dir), 0);
    free(out);
    snprintf(path, sizeof path, "%s/big/config.json", dir);
    cfg = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(cfg);
    ck_assert_int_eq(json_integer_value(json_object_get(cfg, "num_hidden_layers")), 4);
    ck_assert_int_eq(json_integer_value(json_object_get(cfg, "vocab_size")), 151936);
    ck_assert_int_eq(json_integer_value(json_object_get(cfg, "num_experts")), 512);
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(cfg, "layer_types"), 3)),
                     "full_attention");
    json_decref(cfg);
    ls_test_sh(NULL, "rm -rf '%s'", dir);
    free(dir);
}
END_TEST

START_TEST(test_sharded_index)
{
    char *dir = ls_test_tmpdir("synth");
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset tiny --seed 1 --out '%s/one'", dir), 0);
    free(out);
    int rc = ls_test_cli(&out, "synth --preset tiny --seed 1 --max-shard-bytes 1MB --out '%s/sh'", dir);
    ck_assert_msg(rc == 0, "%s", out);
    free(out);
    char path[4200];
    snprintf(path, sizeof path, "%s/sh/model.safetensors", dir);
    ck_assert(!file_exists(path));
    snprintf(path, sizeof path, "%s/sh/model.safetensors.index.json", dir);
    json_t *idx = json_load_file(path, JSON_REJECT_DUPLICATES, NULL);
    ck_assert_ptr_nonnull(idx);
    json_t *map = json_object_get(idx, "weight_map");

    st_file one;
    snprintf(path, sizeof path, "%s/one/model.safetensors", dir);
    st_load(path, &one);
    ck_assert_uint_eq(json_object_size(map), one.n);
    /* tiny holds 2.8 MB of tensors: at most 1 MB per shard needs at least 3. */
    const char *first = json_string_value(json_object_get(map, "lm_head.weight"));
    ck_assert_ptr_nonnull(first);
    int n_shards = atoi(first + strlen("model-00001-of-"));
    ck_assert_int_ge(n_shards, 3);
    ck_assert_int_le(n_shards, 5);
    uint64_t total = 0;
    size_t seen = 0;
    for (int s = 1; s <= n_shards; s++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s, n_shards);
        snprintf(path, sizeof path, "%s/sh/%s", dir, name);
        ck_assert_msg(file_exists(path), "%s missing", path);
        st_file sh;
        st_load(path, &sh);
        ck_assert_uint_le(sh.len - sh.data_start, 1000000);
        for (size_t i = 0; i < sh.n; i++) {
            /* Listed in the index under this shard, bytes equal to the single file's. */
            ck_assert_str_eq(json_string_value(json_object_get(map, sh.e[i].name)), name);
            const st_entry *e = st_find(&one, sh.e[i].name);
            ck_assert_ptr_nonnull(e);
            ck_assert(memcmp(one.image + one.data_start + e->begin,
                             sh.image + sh.data_start + sh.e[i].begin, e->end - e->begin) == 0);
            total += sh.e[i].end - sh.e[i].begin;
            seen++;
        }
        st_free(&sh);
    }
    ck_assert_uint_eq(seen, one.n);
    ck_assert_uint_eq(json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")),
                      total);
    json_decref(idx);
    st_free(&one);
    ls_test_sh(NULL, "rm -rf '%s'", dir);
    free(dir);
}
END_TEST

/* Read back through the checkpoint reader (src/io): every tensor the config
 * implies is present with its shape, single file and shards agree. */
START_TEST(test_reader_roundtrip)
{
    char *dir = ls_test_tmpdir("synth");
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset tiny --seed 3 --out '%s/one'", dir), 0);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset tiny --seed 3 --max-shard-bytes 700000 "
                                       "--out '%s/sh'", dir), 0);
    free(out);
    char path[4200];
    ls_error err;
    ls_checkpoint *one = NULL, *sh = NULL;
    snprintf(path, sizeof path, "%s/one", dir);
    ck_assert_msg(ls_checkpoint_open(path, &one, &err) == LS_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/sh", dir);
    ck_assert_msg(ls_checkpoint_open(path, &sh, &err) == LS_OK, "%s", err.msg);
    ck_assert_uint_eq(ls_checkpoint_shard_count(one), 1);
    ck_assert_uint_ge(ls_checkpoint_shard_count(sh), 4);

    size_t n = 0;
    ls_synth_tensor *t = tiny_tensors(&n);
    ck_assert_uint_eq(ls_checkpoint_count(one), n);
    ck_assert_uint_eq(ls_checkpoint_count(sh), n);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const ls_tensor *a = ls_checkpoint_find(one, t[i].name), *b = ls_checkpoint_find(sh, t[i].name);
        ck_assert_msg(a && b, "%s missing", t[i].name);
        ck_assert_int_eq(a->dtype, LS_DTYPE_BF16);
        ck_assert_int_eq(a->ndim, t[i].ndim);
        ck_assert_int_eq(b->ndim, t[i].ndim);
        for (int d = 0; d < t[i].ndim; d++) {
            ck_assert_int_eq(a->shape[d], t[i].shape[d]);
            ck_assert_int_eq(b->shape[d], t[i].shape[d]);
        }
        ck_assert_uint_eq(a->size_bytes, b->size_bytes);
        ck_assert_msg(memcmp(a->data, b->data, a->size_bytes) == 0, "%s differs", t[i].name);
        total += a->size_bytes;
    }
    ck_assert_uint_eq(ls_checkpoint_total_bytes(sh), total);
    /* Metadata: the format HF expects, plus provenance. */
    const ls_safetensors *st = ls_checkpoint_shard(one, 0);
    int have_format = 0;
    for (size_t i = 0; i < ls_safetensors_metadata_count(st); i++) {
        const char *k, *v;
        ls_safetensors_metadata_at(st, i, &k, &v);
        if (strcmp(k, "format") == 0) have_format = strcmp(v, "pt") == 0;
    }
    ck_assert(have_format);
    /* Per-expert layout as the hub stores Qwen3-Next. */
    ls_matrix_view mv;
    ck_assert_msg(ls_checkpoint_expert(sh, 3, 7, LS_EXPERT_DOWN, &mv, &err) == LS_OK, "%s", err.msg);
    ck_assert_int_eq(mv.rows, 128);
    ck_assert_int_eq(mv.cols, 64);
    free(t);
    ls_checkpoint_close(one);
    ls_checkpoint_close(sh);

    /* The manifest pins it (the acceptance path of harness/hf_interop.py). */
    int rc = ls_test_cli(&out, "manifest pin --checkpoint '%s/sh' -o '%s/m.json'", dir, dir);
    ck_assert_msg(rc == 0, "manifest pin failed: %s", out);
    free(out);
    ls_test_sh(NULL, "rm -rf '%s'", dir);
    free(dir);
}
END_TEST

static void expect_fail(const char *args, const char *needle)
{
    char *out = NULL;
    int rc = ls_test_cli(&out, "%s", args);
    ck_assert_msg(rc == 2, "'%s' exited %d, expected 2: %s", args, rc, out);
    ck_assert_msg(strstr(out, needle) != NULL, "'%s': message lacks '%s': %s", args, needle, out);
    ck_assert_msg(strstr(out, "Sanitizer") == NULL, "%s", out);
    free(out);
}

START_TEST(test_bad_input_exit_2)
{
    char *dir = ls_test_tmpdir("synth");
    char args[8600], path[4200];
    snprintf(args, sizeof args, "synth --preset huge --seed 1 --out '%s/x'", dir);
    expect_fail(args, "unknown preset 'huge'");
    snprintf(args, sizeof args, "synth --preset tiny --out '%s/x'", dir);
    expect_fail(args, "--seed");
    snprintf(args, sizeof args, "synth --preset tiny --seed -3 --out '%s/x'", dir);
    expect_fail(args, "--seed");
    snprintf(args, sizeof args, "synth --preset tiny --seed 1 --layers 9 --out '%s/x'", dir);
    expect_fail(args, "--layers");
    snprintf(args, sizeof args, "synth --preset tiny --seed 1 --max-shard-bytes 0 --out '%s/x'", dir);
    expect_fail(args, "--max-shard-bytes");
    expect_fail("synth --seed 1 --out x", "--preset");

    /* Configs: the message names the field. */
    static const struct {
        const char *json;
        const char *needle;
    } bad[] = {
        {"{\"model_type\": \"llama\", \"hidden_size\": 8}", "'model_type'"},
        {"{\"hidden_size\": 8}", "'model_type'"},
        {"{\"model_type\": \"qwen3_next\", \"vocab_size\": 100}", "'hidden_size'"},
        {"{\"model_type\": \"qwen3_next\",", "line"},
        {"[1, 2]", "object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/bad%zu.json", dir, i);
        ls_test_write(path, bad[i].json, strlen(bad[i].json));
        snprintf(args, sizeof args, "synth --config '%s' --seed 1 --out '%s/x'", path, dir);
        expect_fail(args, bad[i].needle);
    }
    /* A valid config with one field broken at a time. */
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset tiny --seed 1 --config-only --out '%s/c'", dir), 0);
    free(out);
    static const struct {
        const char *sed;
        const char *needle;
    } edits[] = {
        {"s/\"num_key_value_heads\": 2/\"num_key_value_heads\": 3/", "'num_key_value_heads'"},
        {"s/\"head_dim\": 32/\"head_dim\": \"32\"/", "'head_dim'"},
        {"s/\"tie_word_embeddings\": false/\"tie_word_embeddings\": true/", "'tie_word_embeddings'"},
        {"s/\"mlp_only_layers\": \\[\\]/\"mlp_only_layers\": [1]/", "'mlp_only_layers'"},
        {"s/\"rope_type\": \"default\"/\"rope_type\": \"yarn\"/", "rope_type"},
        {"s/\"full_attention\"/\"sliding\"/", "'layer_types[1]'"},
        {"s/\"num_experts_per_tok\": 2/\"num_experts_per_tok\": 9/", "'num_experts_per_tok'"},
        {"s/\"partial_rotary_factor\": 0.25,/\"partial_rotary_factor\": 0.3,/", "'partial_rotary_factor'"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        snprintf(path, sizeof path, "%s/edit%zu.json", dir, i);
        ck_assert_int_eq(ls_test_sh(NULL, "sed '%s' '%s/c/config.json' > '%s'", edits[i].sed, dir, path), 0);
        snprintf(args, sizeof args, "synth --config '%s' --seed 1 --out '%s/x'", path, dir);
        expect_fail(args, edits[i].needle);
    }
    snprintf(path, sizeof path, "%s/x", dir);
    ck_assert_msg(!file_exists(path), "a failed run left %s behind", path);

    /* An existing non-empty directory is refused unless --force. */
    snprintf(args, sizeof args, "synth --preset tiny --seed 1 --config-only --out '%s/c'", dir);
    expect_fail(args, "--force");
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset tiny --seed 2 --out '%s/c' --force", dir), 0);
    free(out);
    snprintf(path, sizeof path, "%s/c/model.safetensors", dir);
    ck_assert(file_exists(path));
    ck_assert_int_eq(ls_test_sh(&out, "ls -A '%s' | grep -c '\\.old\\.\\|\\.tmp\\.'", dir), 1);
    ck_assert_str_eq(out, "0\n");
    free(out);
    ls_test_sh(NULL, "rm -rf '%s'", dir);
    free(dir);
}
END_TEST

START_TEST(test_help)
{
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "synth --help"), 0);
    ck_assert_ptr_nonnull(strstr(out, "--max-shard-bytes"));
    ck_assert_ptr_nonnull(strstr(out, "qwen3-next-80b-a3b"));
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("synth");
    TCase *tc = tcase_create("synth");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_writer_layout);
    tcase_add_test(tc, test_generator_fixed_values);
    tcase_add_test(tc, test_fill_equals_element_formula);
    tcase_add_test(tc, test_elementary_functions);
    tcase_add_test(tc, test_initialiser_ranges);
    tcase_add_test(tc, test_tiny_digests_pinned);
    tcase_add_test(tc, test_tiny_tensors_and_seeds);
    tcase_add_test(tc, test_layers_and_config_only);
    tcase_add_test(tc, test_sharded_index);
    tcase_add_test(tc, test_reader_roundtrip);
    tcase_add_test(tc, test_bad_input_exit_2);
    tcase_add_test(tc, test_help);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}
