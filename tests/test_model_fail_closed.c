/* The model refuses what it does not read or cannot trust: tensors no part
 * of the graph reads (a bias, a layer beyond num_hidden_layers, an expert
 * beyond num_experts, a stray name), while the families skipped on purpose
 * (vision tower, MTP head) are accepted and listed in the manifest; and
 * weights holding a NaN or an infinity, found by the fingerprinting pass
 * (fresh or from its cache) and refused by run, manifest pin and
 * fingerprint.
 *
 * Every variant is the synthetic tiny checkpoint rewritten by hand
 * (tests/st_image.h) with tensors added, removed or reshaped. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fingerprint/cache.h"
#include "fingerprint/fingerprint.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "st_image.h"
#include "synth_models.h"
#include "testutil.h"

static char *g_dir;
static ls_checkpoint *g_ck;     /* the tiny checkpoint (per-expert layout) */
static ls_model_config g_cfg;

static void setup(void)
{
    if (g_ck) return;
    g_dir = ls_test_tmpdir("model-fc");
    char path[4200];
    snprintf(path, sizeof path, "%s/tiny", g_dir);
    ls_test_write_synth("tiny", 7, path);
    ls_model *m = NULL;
    ls_test_open_model(path, &g_ck, &m);
    g_cfg = m->cfg;
    ls_model_close(m);
    snprintf(path, sizeof path, "%s/prompts.jsonl", g_dir);
    const char *jl = "{\"id\": 0, \"tokens\": [1, 2, 3]}\n";
    ls_test_write(path, jl, strlen(jl));
}

/* Zero bytes for added tensors: finite, so only the rule under test fires. */
static const unsigned char k_zeros[1 << 16];

/* A checkpoint variant: the tiny checkpoint's tensors, except those whose
 * name starts with drop_prefix (NULL: none), plus extra[0..n_extra), with
 * config.json from cfg (NULL: the tiny's). Returns the directory (caller
 * frees). */
static char *variant(const char *tag, const st_spec *extra, size_t n_extra, const char *drop_prefix,
                     const json_t *cfg)
{
    size_t n = ls_checkpoint_count(g_ck);
    st_spec *ts = calloc(n + n_extra, sizeof *ts);
    ck_assert_ptr_nonnull(ts);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const ls_tensor *t = ls_checkpoint_at(g_ck, i);
        if (drop_prefix && strncmp(t->name, drop_prefix, strlen(drop_prefix)) == 0) continue;
        ck_assert_int_le(t->ndim, 4);
        st_spec s = {t->stored_name, ls_dtype_name(t->dtype), t->ndim, {0}, ls_dtype_size(t->dtype),
                     t->data};
        for (int d = 0; d < t->ndim; d++) s.shape[d] = t->shape[d];
        ts[k++] = s;
    }
    for (size_t i = 0; i < n_extra; i++) {
        ts[k] = extra[i];
        if (!ts[k].data) {
            ck_assert_uint_le(st_spec_bytes(&ts[k]), sizeof k_zeros);
            ts[k].data = k_zeros;
        }
        k++;
    }
    char *dir = malloc(4400);
    ck_assert_ptr_nonnull(dir);
    snprintf(dir, 4400, "%s/%s", g_dir, tag);
    ck_assert_int_eq(ls_test_sh(NULL, "mkdir -p '%s'", dir), 0);
    st_write_file(dir, "model.safetensors", ts, k);
    if (cfg) {
        char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
        ck_assert_ptr_nonnull(text);
        ls_test_write_text(dir, "config.json", text);
        free(text);
    } else {
        size_t len;
        const char *text = ls_checkpoint_config_text(g_ck, &len);
        char path[4500];
        snprintf(path, sizeof path, "%s/config.json", dir);
        ls_test_write(path, text, len);
    }
    free(ts);
    return dir;
}

/* Opens dir as a model: want LS_OK, or the status want with every needle in
 * the message. */
static void expect_model(const char *dir, ls_status want, const char *needle1, const char *needle2)
{
    ls_checkpoint *ck = NULL;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_checkpoint_open(dir, &ck, &err) == LS_OK, "%s", err.msg);
    ls_model *m = (ls_model *)0x1;
    ls_status st = ls_model_open(ck, &m, &err);
    if (want == LS_OK) {
        ck_assert_msg(st == LS_OK, "%s: refused: %s", dir, err.msg);
        ls_model_close(m);
    } else {
        ck_assert_msg(st == want, "%s: status %s, expected %s (%s)", dir, ls_status_name(st),
                      ls_status_name(want), err.msg);
        ck_assert_msg(strstr(err.msg, needle1), "'%s' not in: %s", needle1, err.msg);
        if (needle2) ck_assert_msg(strstr(err.msg, needle2), "'%s' not in: %s", needle2, err.msg);
        ck_assert_msg(!strchr(err.msg, '\n'), "more than one line: %s", err.msg);
    }
    ls_checkpoint_close(ck);
}

/* First layer of the given kind (1 = full attention). */
static int layer_of_kind(int attention)
{
    for (int l = 0; l < g_cfg.n_layers; l++)
        if (g_cfg.is_attention[l] == attention) return l;
    ck_abort_msg("the tiny checkpoint has no layer of kind %d", attention);
    return -1;
}

/* ---- tensors nobody reads ------------------------------------------------------------ */

START_TEST(test_unread_tensors_refused)
{
    setup();
    long V = g_cfg.vocab, D = g_cfg.hidden, E = g_cfg.n_experts, I = g_cfg.moe_inter;
    int la = layer_of_kind(1), lg = layer_of_kind(0);
    char qb[96], ex[96], wrong_kind[96];
    snprintf(qb, sizeof qb, "model.layers.%d.self_attn.q_proj.bias", la);
    snprintf(ex, sizeof ex, "model.layers.0.mlp.experts.%ld.gate_proj.weight", E);
    snprintf(wrong_kind, sizeof wrong_kind, "model.layers.%d.self_attn.k_norm.weight", lg);
    struct {
        st_spec t;
        ls_status want;
        const char *why;
    } cases[] = {
        {{"lm_head.bias", "BF16", 1, {V}, 2, NULL}, LS_E_UNSUPPORTED, "no part of the qwen3_next graph"},
        {{qb, "BF16", 1, {g_cfg.n_heads * 2 * g_cfg.head_dim}, 2, NULL}, LS_E_UNSUPPORTED,
         "no part of the qwen3_next graph"},
        {{ex, "BF16", 2, {I, D}, 2, NULL}, LS_E_INPUT, "beyond config.json field 'num_experts'"},
        {{"foo.bar", "F32", 1, {3}, 4, NULL}, LS_E_UNSUPPORTED, "no part of the qwen3_next graph"},
        {{wrong_kind, "BF16", 1, {g_cfg.head_dim}, 2, NULL}, LS_E_INPUT, "linear_attention in config.json"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char tag[32], want[200];
        snprintf(tag, sizeof tag, "unread%zu", i);
        char *d = variant(tag, &cases[i].t, 1, NULL, NULL);
        snprintf(want, sizeof want, "tensor '%s' (byte offset ", cases[i].t.name);
        expect_model(d, cases[i].want, want, cases[i].why);
        free(d);
    }
    /* Two stray tensors: the first in name order is named, the count given. */
    st_spec two[] = {{"zz.last", "BF16", 1, {2}, 2, NULL}, {"lm_head.bias", "BF16", 1, {V}, 2, NULL}};
    char *d = variant("unread-two", two, 2, NULL, NULL);
    expect_model(d, LS_E_UNSUPPORTED, "tensor 'lm_head.bias'", "(2 unread tensors in all)");
    free(d);
}
END_TEST

/* num_hidden_layers below the checkpoint's layer count: the last layer's
 * tensors are unread, so the model is refused (the fingerprint would cover
 * them while no output depends on them). */
START_TEST(test_fewer_layers_refused)
{
    setup();
    json_t *cfg = json_deep_copy(ls_checkpoint_config_json(g_ck));
    long L = g_cfg.n_layers;
    json_object_set_new(cfg, "num_hidden_layers", json_integer(L - 1));
    json_array_remove(json_object_get(cfg, "layer_types"), (size_t)(L - 1));
    char *d = variant("fewer-layers", NULL, 0, NULL, cfg);
    char want[96];
    snprintf(want, sizeof want, "tensor 'model.layers.%ld.", L - 1);
    expect_model(d, LS_E_INPUT, want, "beyond config.json field 'num_hidden_layers' (3)");
    free(d);
    /* The same without layer_types (types from full_attention_interval). */
    json_object_del(cfg, "layer_types");
    d = variant("fewer-layers-interval", NULL, 0, NULL, cfg);
    expect_model(d, LS_E_INPUT, want, "'num_hidden_layers'");
    /* And through the command line: exit 2 with the tensor named. */
    char *out = NULL;
    int rc = ls_test_cli(&out, "run --checkpoint %s --mode rollout --prompts %s/prompts.jsonl -o %s/x.trace",
                         d, g_dir, g_dir);
    ck_assert_msg(rc == 2 && out && strstr(out, want), "exit %d:\n%s", rc, out ? out : "");
    free(out);
    free(d);
    json_decref(cfg);
}
END_TEST

/* Fused experts [E', 2I, D] / [E', D, I]: E' = num_experts binds; one expert
 * more is refused, naming the tensor (those bytes would be read by nobody). */
START_TEST(test_fused_expert_count)
{
    setup();
    long L = g_cfg.n_layers, E = g_cfg.n_experts, I = g_cfg.moe_inter, D = g_cfg.hidden;
    for (long extra = 0; extra <= 1; extra++) {
        long En = E + extra;
        size_t gu_bytes = (size_t)(En * 2 * I * D) * 2, dn_bytes = (size_t)(En * D * I) * 2;
        unsigned char *gu = calloc((size_t)L, gu_bytes), *dn = calloc((size_t)L, dn_bytes);
        ck_assert_ptr_nonnull(gu);
        ck_assert_ptr_nonnull(dn);
        st_spec *ts = calloc((size_t)(2 * L), sizeof *ts);
        static char names[64][2][96];
        ck_assert_int_le(L, 64);
        for (long l = 0; l < L; l++) {
            for (long e = 0; e < E; e++) {
                static const char *const pn[] = {"gate", "up", "down"};
                for (int p = 0; p < 3; p++) {
                    char nm[128];
                    snprintf(nm, sizeof nm, "model.layers.%ld.mlp.experts.%ld.%s_proj.weight", l, e, pn[p]);
                    const ls_tensor *t = ls_checkpoint_find(g_ck, nm);
                    ck_assert_ptr_nonnull(t);
                    if (p < 2)
                        memcpy(gu + (size_t)l * gu_bytes + (size_t)(e * 2 * I + p * I) * (size_t)D * 2,
                               t->data, t->size_bytes);
                    else
                        memcpy(dn + (size_t)l * dn_bytes + (size_t)(e * D * I) * 2, t->data, t->size_bytes);
                }
            }
            snprintf(names[l][0], sizeof names[l][0], "model.layers.%ld.mlp.experts.gate_up_proj", l);
            snprintf(names[l][1], sizeof names[l][1], "model.layers.%ld.mlp.experts.down_proj", l);
            ts[2 * l] = (st_spec){names[l][0], "BF16", 3, {En, 2 * I, D}, 2, gu + (size_t)l * gu_bytes};
            ts[2 * l + 1] = (st_spec){names[l][1], "BF16", 3, {En, D, I}, 2, dn + (size_t)l * dn_bytes};
        }
        /* Drop every per-expert tensor: their names all start with a layer
         * prefix and ".mlp.experts.<digit>", so write without them by hand. */
        size_t n = ls_checkpoint_count(g_ck), k = 0;
        st_spec *all = calloc(n + (size_t)(2 * L), sizeof *all);
        for (size_t i = 0; i < n; i++) {
            const ls_tensor *t = ls_checkpoint_at(g_ck, i);
            if (strstr(t->name, ".mlp.experts.")) continue;
            st_spec s = {t->stored_name, ls_dtype_name(t->dtype), t->ndim, {0}, ls_dtype_size(t->dtype),
                         t->data};
            for (int dd = 0; dd < t->ndim; dd++) s.shape[dd] = t->shape[dd];
            all[k++] = s;
        }
        for (long j = 0; j < 2 * L; j++) all[k++] = ts[j];
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/fused%ld", g_dir, extra);
        ck_assert_int_eq(ls_test_sh(NULL, "mkdir -p '%s'", dir), 0);
        st_write_file(dir, "model.safetensors", all, k);
        size_t len;
        const char *text = ls_checkpoint_config_text(g_ck, &len);
        char path[4500];
        snprintf(path, sizeof path, "%s/config.json", dir);
        ls_test_write(path, text, len);
        if (extra == 0)
            expect_model(dir, LS_OK, NULL, NULL);
        else
            expect_model(dir, LS_E_INPUT, "tensor 'model.layers.0.mlp.experts.gate_up_proj'",
                         "holds 9 experts, config.json field 'num_experts' is 8");
        free(all);
        free(ts);
        free(gu);
        free(dn);
    }
}
END_TEST

/* ---- families skipped on purpose -------------------------------------------------------- */

/* Merkle root of dir (fresh, no cache) as hex; fails the test on error. */
START_TEST(test_skipped_families_listed)
{
    setup();
    /* mtp.fc.weight's bytes are ours, so one can be changed below */
    static uint16_t fc[32];
    for (int i = 0; i < 32; i++) fc[i] = (uint16_t)(0x3f80 + i); /* BF16 1.0, 1.0078, ... */
    st_spec extra[] = {
        {"mtp.fc.weight", "BF16", 2, {4, 8}, 2, fc},
        {"model.visual.blocks.0.attn.qkv.weight", "BF16", 2, {4, 4}, 2, NULL},
        {"mtp.layers.0.input_layernorm.weight", "BF16", 1, {8}, 2, NULL},
    };
    char *d = variant("skipped", extra, 3, NULL, NULL);
    expect_model(d, LS_OK, NULL, NULL);
    ls_checkpoint *ck = NULL;
    ls_error err;
    ck_assert_msg(ls_checkpoint_open(d, &ck, &err) == LS_OK, "%s", err.msg);
    ck_assert_uint_eq(ls_checkpoint_ignored_count(ck), 3);
    static const char *const sorted[] = {"model.visual.blocks.0.attn.qkv.weight",
                                         "mtp.fc.weight", "mtp.layers.0.input_layernorm.weight"};
    static const char *const reasons[] = {"vision tower (model.visual.*): not part of the text forward",
                                          "multi-token-prediction head (mtp.*): not part of the text forward",
                                          "multi-token-prediction head (mtp.*): not part of the text forward"};
    for (size_t i = 0; i < 3; i++) {
        ck_assert_str_eq(ls_checkpoint_ignored_at(ck, i)->stored_name, sorted[i]);
        ck_assert_str_eq(ls_checkpoint_skip_reason(sorted[i]), reasons[i]);
    }
    ck_assert_ptr_null(ls_checkpoint_ignored_at(ck, 3));
    ck_assert_ptr_null(ls_checkpoint_skip_reason("model.layers.0.mlp.gate.weight"));
    ck_assert_uint_eq(ls_checkpoint_count(ck), ls_checkpoint_count(g_ck));
    /* The fingerprint covers them: one leaf each, under the stored name,
     * flagged as skipped, in name order with the exposed tensors. */
    ls_fingerprint fp;
    ls_fingerprint_opts o = {2, 0};
    ck_assert_msg(ls_fingerprint_checkpoint(ck, &o, &fp, &err) == LS_OK, "%s", err.msg);
    ck_assert_uint_eq(fp.count, ls_checkpoint_count(ck) + 3);
    size_t n_skipped = 0;
    for (size_t i = 0; i < fp.count; i++) {
        if (i > 0) ck_assert_msg(strcmp(fp.tensors[i - 1].name, fp.tensors[i].name) < 0, "order at %zu", i);
        n_skipped += (size_t)fp.tensors[i].skipped;
        ck_assert_int_eq(fp.tensors[i].skipped, ls_checkpoint_name_skipped(fp.tensors[i].name));
    }
    ck_assert_uint_eq(n_skipped, 3);
    ls_fingerprint_free(&fp);
    ls_checkpoint_close(ck);

    /* The manifest lists them with the reason, and has their digests; a
     * diff against the plain checkpoint's manifest voids on the tensors and
     * the root (exit 1), the list itself informational. */
    char *out = NULL;
    int rc = ls_test_cli(&out, "manifest pin --checkpoint %s -o %s/skipped.json", d, g_dir);
    ck_assert_msg(rc == 0, "pin: exit %d:\n%s", rc, out ? out : "");
    free(out);
    rc = ls_test_cli(&out, "manifest pin --checkpoint %s/tiny -o %s/plain.json", g_dir, g_dir);
    ck_assert_msg(rc == 0, "pin: exit %d:\n%s", rc, out ? out : "");
    free(out);
    char path[4400];
    snprintf(path, sizeof path, "%s/skipped.json", g_dir);
    json_error_t je;
    json_t *m = json_load_file(path, 0, &je);
    ck_assert_ptr_nonnull(m);
    const json_t *sec = json_object_get(m, "checkpoint");
    const json_t *list = json_object_get(sec, "skipped_tensors");
    ck_assert_msg(json_is_array(list) && json_array_size(list) == 3, "checkpoint.skipped_tensors");
    for (size_t i = 0; i < 3; i++) {
        const json_t *e = json_array_get(list, i);
        ck_assert_str_eq(json_string_value(json_object_get(e, "name")), sorted[i]);
        ck_assert_str_eq(json_string_value(json_object_get(e, "reason")), reasons[i]);
        const json_t *t = json_object_get(json_object_get(sec, "tensors"), sorted[i]);
        ck_assert_msg(json_is_string(json_object_get(t, "sha256")), "checkpoint.tensors[\"%s\"].sha256", sorted[i]);
    }
    json_decref(m);
    rc = ls_test_cli(&out, "manifest diff %s/plain.json %s/skipped.json", g_dir, g_dir);
    ck_assert_msg(rc == 1 && out && strstr(out, "checkpoint.skipped_tensors") && strstr(out, "mtp.fc.weight") &&
                      strstr(out, "checkpoint.merkle_root"),
                  "diff: exit %d:\n%s", rc, out ? out : "");
    free(out);

    /* One byte of a skipped tensor changes the root, though the model never
     * reads it; a NaN there is fingerprinted, not refused. */
    char before[65], after[65], nan_root[65];
    ls_test_merkle_root(d, before);
    fc[5] ^= 0x0001;
    char *d2 = variant("skipped-changed", extra, 3, NULL, NULL);
    ls_test_merkle_root(d2, after);
    ck_assert_msg(strcmp(before, after) != 0, "a changed mtp.fc.weight left the root at %s", before);
    fc[5] = 0x7fc0; /* BF16 NaN */
    char *d3 = variant("skipped-nan", extra, 3, NULL, NULL);
    ls_test_merkle_root(d3, nan_root);
    ck_assert_msg(strcmp(nan_root, after) != 0 && strcmp(nan_root, before) != 0, "NaN root %s", nan_root);
    expect_model(d3, LS_OK, NULL, NULL);

    /* A normalised name equal to a skipped stored name is refused: the two
     * would be one leaf name. */
    st_spec clash[] = {
        {"model.visual.x.weight", "BF16", 1, {4}, 2, NULL},
        {"model.language_model.visual.x.weight", "BF16", 1, {4}, 2, NULL},
    };
    char *d4 = variant("skipped-clash", clash, 2, NULL, NULL);
    ck = NULL;
    ck_assert_int_eq(ls_checkpoint_open(d4, &ck, &err), LS_E_INPUT);
    ck_assert_msg(strstr(err.msg, "'model.language_model.visual.x.weight'") &&
                      strstr(err.msg, "the name of the skipped tensor"),
                  "%s", err.msg);
    free(d4);
    free(d3);
    free(d2);
    free(d);
}
END_TEST

/* ---- non-finite weights ----------------------------------------------------------------- */

/* One float type: its width, a finite value (the largest, or near it) and
 * the non-finite ones with their names in messages. */
typedef struct ftype {
    const char *dtype;
    unsigned width;
    uint64_t finite[2];         /* largest finite, its negative */
    uint64_t bad[3];            /* NaN, +Inf, -Inf (0 = the type has none) */
    const char *bad_name[3];
} ftype;

static const ftype k_ftypes[] = {
    {"BF16", 2, {0x7F7F, 0xFF7F}, {0x7FC0, 0x7F80, 0xFF80}, {"NaN", "+Inf", "-Inf"}},
    {"F16", 2, {0x7BFF, 0xFBFF}, {0xFE01, 0x7C00, 0xFC00}, {"NaN", "+Inf", "-Inf"}},
    {"F32", 4, {0x7F7FFFFF, 0xFF7FFFFF}, {0x7FC00000, 0x7F800000, 0xFF800000}, {"NaN", "+Inf", "-Inf"}},
    {"F64", 8, {0x7FEFFFFFFFFFFFFFull, 0xFFEFFFFFFFFFFFFFull},
     {0x7FF8000000000001ull, 0x7FF0000000000000ull, 0xFFF0000000000000ull}, {"NaN", "+Inf", "-Inf"}},
    {"F8_E4M3", 1, {0x7E, 0xFE}, {0x7F, 0xFF, 0}, {"NaN", "NaN", NULL}},
    {"F8_E5M2", 1, {0x7B, 0xFB}, {0x7D, 0x7C, 0xFC}, {"NaN", "+Inf", "-Inf"}},
};

static void put_elem(unsigned char *p, size_t i, unsigned w, uint64_t v)
{
    for (unsigned k = 0; k < w; k++) p[i * w + k] = (unsigned char)(v >> (8 * k));
}

/* Fingerprints a one-tensor checkpoint "x" of n elements: want_index
 * (SIZE_MAX: all finite) and, when one is bad, the message naming it. */
static void expect_fp(const char *tag, const char *dtype, unsigned w, const unsigned char *data,
                      size_t n, size_t want_index, const char *want_name, uint64_t want_bits)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, tag);
    ck_assert_int_eq(ls_test_sh(NULL, "mkdir -p '%s'", dir), 0);
    st_spec t = {"x", dtype, 1, {(int64_t)n}, w, data};
    st_write_file(dir, "model.safetensors", &t, 1);
    ls_test_write_text(dir, "config.json", "{}");
    ls_checkpoint *ck = NULL;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_checkpoint_open(dir, &ck, &err) == LS_OK, "%s", err.msg);
    ls_fingerprint fp;
    ls_fingerprint_opts o = {1, 0};
    ls_status st = ls_fingerprint_checkpoint(ck, &o, &fp, &err);
    if (want_index == SIZE_MAX) {
        ck_assert_msg(st == LS_OK, "%s %s: refused: %s", tag, dtype, err.msg);
        ls_fingerprint_free(&fp);
    } else {
        char want[200];
        snprintf(want, sizeof want, "tensor 'x' element %zu of %zu is %s (bits 0x%0*llx, byte offset ",
                 want_index, n, want_name, (int)(2 * w), (unsigned long long)want_bits);
        ck_assert_msg(st == LS_E_INPUT && strstr(err.msg, want), "%s %s: want '%s', got %s: %s", tag,
                      dtype, want, ls_status_name(st), err.msg);
    }
    ls_checkpoint_close(ck);
}

/* Every float type, a bad element at positions around the 8-byte words and
 * 64-byte blocks of the scan (and in the tail), a second bad one after it:
 * the first is named, with its kind and bits. The largest finite values of
 * either sign are never taken for non-finite; integers are not checked. */
START_TEST(test_nonfinite_every_type_and_position)
{
    setup();
    enum { N = 301 };
    static const size_t pos[] = {0, 1, 3, 7, 8, 9, 31, 32, 63, 64, 65, 127, 128, 200, 296, 300};
    unsigned char *buf = malloc(N * 8);
    ck_assert_ptr_nonnull(buf);
    for (size_t f = 0; f < sizeof k_ftypes / sizeof k_ftypes[0]; f++) {
        const ftype *ft = &k_ftypes[f];
        for (size_t i = 0; i < N; i++) put_elem(buf, i, ft->width, ft->finite[i % 2]);
        char tag[64];
        snprintf(tag, sizeof tag, "fin-%s", ft->dtype);
        expect_fp(tag, ft->dtype, ft->width, buf, N, SIZE_MAX, NULL, 0);
        for (int b = 0; b < 3; b++) {
            if (!ft->bad_name[b]) continue;
            for (size_t k = 0; k < sizeof pos / sizeof pos[0]; k++) {
                for (size_t i = 0; i < N; i++) put_elem(buf, i, ft->width, ft->finite[i % 2]);
                put_elem(buf, pos[k], ft->width, ft->bad[b]);
                if (pos[k] + 5 < N) put_elem(buf, pos[k] + 5, ft->width, ft->bad[(b + 1) % 3] ? ft->bad[(b + 1) % 3] : ft->bad[0]);
                snprintf(tag, sizeof tag, "bad-%s-%d-%zu", ft->dtype, b, pos[k]);
                expect_fp(tag, ft->dtype, ft->width, buf, N, pos[k], ft->bad_name[b], ft->bad[b]);
            }
        }
    }
    /* Integers: bit patterns that would be NaN as floats are plain numbers. */
    for (size_t i = 0; i < N; i++) put_elem(buf, i, 2, 0x7FC0);
    expect_fp("int16", "I16", 2, buf, N, SIZE_MAX, NULL, 0);
    free(buf);
}
END_TEST

/* Positions past the 64 KiB scan step and the 8 MiB hashing chunk: the index
 * counts from the start of the tensor. */
START_TEST(test_nonfinite_far_into_a_tensor)
{
    setup();
    size_t n = (9u << 20) / 2 + 3; /* BF16: 9 MiB + 6 bytes */
    unsigned char *buf = calloc(n, 2);
    ck_assert_ptr_nonnull(buf);
    static const size_t pos[] = {32768 + 1, (8u << 20) / 2 - 1, (8u << 20) / 2, (9u << 20) / 2 + 2};
    for (size_t k = 0; k < sizeof pos / sizeof pos[0]; k++) {
        memset(buf, 0, n * 2);
        put_elem(buf, pos[k], 2, 0xFF80);
        char tag[64];
        snprintf(tag, sizeof tag, "far-%zu", k);
        expect_fp(tag, "BF16", 2, buf, n, pos[k], "-Inf", 0xFF80);
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", g_dir, tag);
        char *p = strdup(path);
        ls_test_rm_tmpdir(p);
    }
    free(buf);
}
END_TEST

/* A copy of the tiny checkpoint with element `index` of tensor `name` set
 * to the BF16 bits `bits` (all elements when index is SIZE_MAX). */
static char *poisoned(const char *tag, const char *name, size_t index, uint16_t bits)
{
    char *d = variant(tag, NULL, 0, NULL, NULL);
    const ls_tensor *t = ls_checkpoint_find(g_ck, name);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->dtype, LS_DTYPE_BF16);
    /* The variant's file has a layout of its own: find the tensor there. */
    ls_checkpoint *ck = NULL;
    ls_error err;
    ck_assert_msg(ls_checkpoint_open(d, &ck, &err) == LS_OK, "%s", err.msg);
    const ls_tensor *u = ls_checkpoint_find(ck, name);
    ck_assert_ptr_nonnull(u);
    uint64_t off = u->file_offset_bytes, numel = u->numel;
    ls_checkpoint_close(ck);
    char path[4500];
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    size_t len;
    unsigned char *img = (unsigned char *)ls_test_read(path, &len);
    ck_assert_ptr_nonnull(img);
    for (uint64_t i = 0; i < numel; i++)
        if (index == SIZE_MAX || i == index) {
            img[off + 2 * i] = (unsigned char)bits;
            img[off + 2 * i + 1] = (unsigned char)(bits >> 8);
        }
    ls_test_write(path, img, len);
    free(img);
    return d;
}

/* run, manifest pin and fingerprint exit 2 naming the tensor and element;
 * the cache entry records it, and a second run refuses from the cache with
 * the same message. */
START_TEST(test_nonfinite_refused_by_commands)
{
    setup();
    struct {
        const char *name;
        size_t index;
        uint16_t bits;
        const char *want;
    } cases[] = {
        {"lm_head.weight", SIZE_MAX, 0x7FC0, "tensor 'lm_head.weight' element 0 of 128000 is NaN (bits 0x7fc0"},
        {"model.embed_tokens.weight", SIZE_MAX, 0x7F80,
         "tensor 'model.embed_tokens.weight' element 0 of 128000 is +Inf (bits 0x7f80"},
        {"model.layers.2.mlp.experts.5.down_proj.weight", 4097, 0xFF80,
         "tensor 'model.layers.2.mlp.experts.5.down_proj.weight' element 4097 of 8192 is -Inf (bits 0xff80"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char tag[32];
        snprintf(tag, sizeof tag, "poison%zu", c);
        char *d = poisoned(tag, cases[c].name, cases[c].index, cases[c].bits);
        char *out = NULL;
        char cache[4200];
        snprintf(cache, sizeof cache, "%s/cache%zu", g_dir, c);
        for (int pass = 0; pass < 2; pass++) { /* the second from the cache */
            int rc = ls_test_sh(&out, "LOCKSTEP_CACHE_DIR='%s' '%s' run --checkpoint %s --mode rollout "
                                "--prompts %s/prompts.jsonl -o %s/p.trace", cache, LS_CLI_PATH, d, g_dir,
                                g_dir);
            ck_assert_msg(rc == 2 && out && strstr(out, cases[c].want), "run (pass %d): exit %d:\n%s",
                          pass, rc, out ? out : "");
            free(out);
        }
        char path[4500];
        snprintf(path, sizeof path, "%s/p.trace", g_dir);
        ck_assert_msg(access(path, F_OK) != 0, "a refused run left %s", path);
        int rc = ls_test_cli(&out, "manifest pin --checkpoint %s -o %s/p.json", d, g_dir);
        ck_assert_msg(rc == 2 && out && strstr(out, cases[c].want), "pin: exit %d:\n%s", rc, out ? out : "");
        free(out);
        rc = ls_test_cli(&out, "fingerprint --checkpoint %s", d);
        ck_assert_msg(rc == 2 && out && strstr(out, cases[c].want), "fingerprint: exit %d:\n%s", rc,
                      out ? out : "");
        free(out);
        /* The entry written by the first run holds the index. */
        snprintf(path, sizeof path, "%s/model.safetensors", d);
        char *canon = realpath(path, NULL), *entry = NULL;
        ck_assert_ptr_nonnull(canon);
        ls_error err;
        ck_assert_int_eq(ls_fpcache_entry_path(cache, canon, &entry, &err), LS_OK);
        ls_fpcache_entry e;
        int found = 0;
        ck_assert_msg(ls_fpcache_load(entry, &e, &found, &err) == LS_OK && found, "%s: %s", entry, err.msg);
        size_t bad = 0;
        for (size_t i = 0; i < e.count; i++) {
            uint64_t want = strcmp(e.tensors[i].name, cases[c].name) != 0 ? LS_FPCACHE_ALL_FINITE
                            : cases[c].index == SIZE_MAX              ? 0
                                                                      : cases[c].index;
            ck_assert_msg(e.tensors[i].first_nonfinite == want, "entry: %s first_nonfinite %llu, want %llu",
                          e.tensors[i].name, (unsigned long long)e.tensors[i].first_nonfinite,
                          (unsigned long long)want);
            bad += e.tensors[i].first_nonfinite != LS_FPCACHE_ALL_FINITE;
        }
        ck_assert_uint_eq(bad, 1);
        ls_fpcache_entry_free(&e);
        free(entry);
        free(canon);
        free(d);
    }
}
END_TEST

/* ---- the command line ------------------------------------------------------------------- */

START_TEST(test_cli_refuses_unread)
{
    setup();
    st_spec bias = {"lm_head.bias", "BF16", 1, {g_cfg.vocab}, 2, NULL};
    char *d = variant("cli-bias", &bias, 1, NULL, NULL);
    char *out = NULL;
    int rc = ls_test_cli(&out, "run --checkpoint %s --mode rollout --prompts %s/prompts.jsonl -o %s/y.trace",
                         d, g_dir, g_dir);
    ck_assert_msg(rc == 2 && out && strstr(out, "tensor 'lm_head.bias'") &&
                      strstr(out, "not read by the model"),
                  "exit %d:\n%s", rc, out ? out : "");
    free(out);
    free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model_fail_closed");
    TCase *tc = tcase_create("model_fail_closed");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_unread_tensors_refused);
    tcase_add_test(tc, test_fewer_layers_refused);
    tcase_add_test(tc, test_fused_expert_count);
    tcase_add_test(tc, test_skipped_families_listed);
    tcase_add_test(tc, test_cli_refuses_unread);
    tcase_add_test(tc, test_nonfinite_every_type_and_position);
    tcase_add_test(tc, test_nonfinite_far_into_a_tensor);
    tcase_add_test(tc, test_nonfinite_refused_by_commands);
    suite_add_tcase(s, tc);
    int failed = ls_test_run_suite(s, 1);
    ls_checkpoint_close(g_ck);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    return failed ? 1 : 0;
}
