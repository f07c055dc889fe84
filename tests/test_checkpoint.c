/* Checkpoint directories: single file vs shards, index rules, name
 * normalisation, config.json, routed-expert layouts. Every checkpoint is
 * written by hand here (tests/st_image.h), not by the library's writer. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "st_image.h"
#include "testutil.h"

static const char k_config[] = "{\"model_type\":\"qwen3_next\",\"hidden_size\":4}";

/* Index text mapping each tensor of each shard to the shard's file name. */
static char *index_text(const char *const *files, const st_spec *const *shards, const size_t *counts,
                        size_t nshards)
{
    size_t cap = 65536, n = 0;
    char *t = malloc(cap);
    n += (size_t)snprintf(t + n, cap - n, "{\"metadata\":{\"total_size\":1},\"weight_map\":{");
    int first = 1;
    for (size_t s = 0; s < nshards; s++)
        for (size_t i = 0; i < counts[s]; i++, first = 0)
            n += (size_t)snprintf(t + n, cap - n, "%s\"%s\":\"%s\"", first ? "" : ",", shards[s][i].name,
                                  files[s]);
    snprintf(t + n, cap - n, "}}");
    return t;
}

static ls_checkpoint *open_ok(const char *dir)
{
    ls_checkpoint *ck = NULL;
    ls_error err;
    ls_error_clear(&err);
    ls_status rc = ls_checkpoint_open(dir, &ck, &err);
    ck_assert_msg(rc == LS_OK, "open %s: %s", dir, err.msg);
    return ck;
}

static void open_bad(const char *dir, ls_status want, const char *sub1, const char *sub2)
{
    ls_checkpoint *ck = (ls_checkpoint *)0x1;
    ls_error err;
    ls_error_clear(&err);
    ls_status rc = ls_checkpoint_open(dir, &ck, &err);
    ck_assert_msg(rc == want, "want %s, got %s (%s)", ls_status_name(want), ls_status_name(rc), err.msg);
    ck_assert_ptr_null(ck);
    ck_assert_msg(strstr(err.msg, sub1) != NULL, "'%s' not in: %s", sub1, err.msg);
    if (sub2) ck_assert_msg(strstr(err.msg, sub2) != NULL, "'%s' not in: %s", sub2, err.msg);
}

/* ---- single file vs shards --------------------------------------------------------- */

static const st_spec k_all[] = {
    {"model.embed_tokens.weight", "BF16", 2, {8, 4}, 2, NULL},
    {"model.layers.0.input_layernorm.weight", "BF16", 1, {4}, 2, NULL},
    {"model.layers.0.linear_attn.A_log", "F32", 1, {2}, 4, NULL},
    {"model.layers.1.self_attn.q_proj.weight", "BF16", 2, {4, 4}, 2, NULL},
    {"model.norm.weight", "BF16", 1, {4}, 2, NULL},
    {"lm_head.weight", "BF16", 2, {8, 4}, 2, NULL},
};
#define N_ALL (sizeof k_all / sizeof k_all[0])

static char *make_sharded(const char *tag)
{
    char *dir = ls_test_tmpdir(tag);
    ls_test_write_text(dir, "config.json", k_config);
    /* Shards take the tensors in a different order from k_all. */
    const st_spec s0[] = {k_all[5], k_all[0]};
    const st_spec s1[] = {k_all[2], k_all[1], k_all[3]};
    const st_spec s2[] = {k_all[4]};
    const char *files[] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                           "model-00003-of-00003.safetensors"};
    const st_spec *shards[] = {s0, s1, s2};
    size_t counts[] = {2, 3, 1};
    for (int i = 0; i < 3; i++) st_write_file(dir, files[i], shards[i], counts[i]);
    char *idx = index_text(files, shards, counts, 3);
    ls_test_write_text(dir, "model.safetensors.index.json", idx);
    free(idx);
    return dir;
}

START_TEST(test_single_and_sharded_agree)
{
    char *d1 = ls_test_tmpdir("ck1");
    ls_test_write_text(d1, "config.json", k_config);
    st_write_file(d1, "model.safetensors", k_all, N_ALL);
    char *d3 = make_sharded("ck3");
    ls_checkpoint *a = open_ok(d1), *b = open_ok(d3);
    ck_assert_uint_eq(ls_checkpoint_shard_count(a), 1);
    ck_assert_uint_eq(ls_checkpoint_shard_count(b), 3);
    ck_assert_ptr_nonnull(strstr(ls_checkpoint_shard_path(b, 1), "model-00002-of-00003.safetensors"));
    ck_assert_ptr_null(ls_checkpoint_shard_path(b, 3));
    ck_assert_uint_eq(ls_safetensors_count(ls_checkpoint_shard(b, 1)), 3);
    ck_assert_uint_eq(ls_checkpoint_count(a), N_ALL);
    ck_assert_uint_eq(ls_checkpoint_count(b), N_ALL);
    ck_assert_uint_eq(ls_checkpoint_total_bytes(a), ls_checkpoint_total_bytes(b));
    ck_assert_uint_eq(ls_checkpoint_total_bytes(a), 64 + 8 + 8 + 32 + 8 + 64);
    for (size_t i = 0; i < N_ALL; i++) {
        const ls_tensor *x = ls_checkpoint_at(a, i), *y = ls_checkpoint_at(b, i);
        ck_assert_str_eq(x->name, y->name);
        if (i) ck_assert_int_lt(strcmp(ls_checkpoint_at(a, i - 1)->name, x->name), 0);
        ck_assert_int_eq(x->dtype, y->dtype);
        ck_assert_int_eq(x->ndim, y->ndim);
        ck_assert_uint_eq(x->size_bytes, y->size_bytes);
        ck_assert_int_eq(memcmp(x->data, y->data, x->size_bytes), 0);
        ck_assert_ptr_eq(ls_checkpoint_find(b, x->name), y);
    }
    ck_assert_str_eq(ls_checkpoint_at(a, 0)->name, "lm_head.weight");
    ck_assert_int_eq(ls_checkpoint_find(b, "model.norm.weight")->shard, 2);
    ck_assert_ptr_null(ls_checkpoint_find(a, "model.norm"));
    ck_assert_ptr_null(ls_checkpoint_at(a, N_ALL));
    /* config.json: raw text and parsed object. */
    size_t len;
    ck_assert_str_eq(ls_checkpoint_config_text(a, &len), k_config);
    ck_assert_uint_eq(len, strlen(k_config));
    const json_t *cfg = ls_checkpoint_config_json(a);
    ck_assert_int_eq(json_integer_value(json_object_get(cfg, "hidden_size")), 4);
    ck_assert_str_eq(ls_checkpoint_dir(a), d1);
    ls_checkpoint_close(a);
    ls_checkpoint_close(b);
    ls_test_rm_tmpdir(d1);
    ls_test_rm_tmpdir(d3);
}
END_TEST

/* ---- normalisation ----------------------------------------------------------------- */

START_TEST(test_normalise_and_ignore)
{
    char *d = ls_test_tmpdir("norm");
    ls_test_write_text(d, "config.json", k_config);
    const st_spec ts[] = {
        {"model.language_model.embed_tokens.weight", "BF16", 2, {8, 4}, 2, NULL},
        {"model.language_model.layers.0.mlp.gate.weight", "BF16", 2, {2, 4}, 2, NULL},
        {"model.visual.blocks.0.attn.qkv.weight", "BF16", 2, {4, 4}, 2, NULL},
        {"mtp.fc.weight", "BF16", 2, {4, 8}, 2, NULL},
        {"lm_head.weight", "BF16", 2, {8, 4}, 2, NULL},
    };
    st_write_file(d, "model.safetensors", ts, 5);
    ls_checkpoint *ck = open_ok(d);
    ck_assert_uint_eq(ls_checkpoint_count(ck), 3);
    ck_assert_uint_eq(ls_checkpoint_ignored_count(ck), 2);
    const ls_tensor *t = ls_checkpoint_find(ck, "model.embed_tokens.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_str_eq(t->stored_name, "model.language_model.embed_tokens.weight");
    ck_assert_ptr_nonnull(ls_checkpoint_find(ck, "model.layers.0.mlp.gate.weight"));
    ck_assert_ptr_null(ls_checkpoint_find(ck, "model.language_model.embed_tokens.weight"));
    ck_assert_ptr_null(ls_checkpoint_find(ck, "mtp.fc.weight"));
    ck_assert_ptr_null(ls_checkpoint_find(ck, "model.visual.blocks.0.attn.qkv.weight"));
    ck_assert_uint_eq(ls_checkpoint_total_bytes(ck), 64 + 16 + 64);
    ls_checkpoint_close(ck);
    ls_test_rm_tmpdir(d);
}
END_TEST

START_TEST(test_normalise_collision)
{
    char *d = ls_test_tmpdir("coll");
    ls_test_write_text(d, "config.json", k_config);
    const st_spec ts[] = {
        {"model.language_model.norm.weight", "BF16", 1, {4}, 2, NULL},
        {"model.norm.weight", "BF16", 1, {4}, 2, NULL},
    };
    st_write_file(d, "model.safetensors", ts, 2);
    open_bad(d, LS_E_INPUT, "both normalise to 'model.norm.weight'", "'model.language_model.norm.weight'");
    ls_test_rm_tmpdir(d);
}
END_TEST

/* ---- index rules ------------------------------------------------------------------- */

START_TEST(test_index_shard_name_escapes)
{
    char *d = ls_test_tmpdir("esc");
    ls_test_write_text(d, "config.json", k_config);
    ls_test_write_text(d, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"../x.safetensors\"}}");
    open_bad(d, LS_E_INPUT, "names shard '../x.safetensors'", "not a plain file name");
    ls_test_write_text(d, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"sub/x.safetensors\"}}");
    open_bad(d, LS_E_INPUT, "names shard 'sub/x.safetensors'", "weight_map['a']");
    ls_test_write_text(d, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"\"}}");
    open_bad(d, LS_E_INPUT, "names shard ''", NULL);
    ls_test_write_text(d, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\".\"}}");
    open_bad(d, LS_E_INPUT, "names shard '.'", NULL);
    ls_test_write_text(d, "model.safetensors.index.json", "{\"metadata\":3,\"weight_map\":{\"a\":\"x\"}}");
    open_bad(d, LS_E_INPUT, "field 'metadata' is not an object", NULL);
    ls_test_write_text(d, "model.safetensors.index.json", "{\"weight_map\":{\"a\":3}}");
    open_bad(d, LS_E_INPUT, "weight_map['a'] is not a string", NULL);
    ls_test_write_text(d, "model.safetensors.index.json", "{\"metadata\":{}}");
    open_bad(d, LS_E_INPUT, "field 'weight_map' is missing", NULL);
    ls_test_write_text(d, "model.safetensors.index.json", "{\"weight_map\":{}}");
    open_bad(d, LS_E_INPUT, "lists no tensors", NULL);
    ls_test_write_text(d, "model.safetensors.index.json", "[]");
    open_bad(d, LS_E_INPUT, "model.safetensors.index.json: not a JSON object", NULL);
    ls_test_write_text(d, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}");
    open_bad(d, LS_E_INPUT, "duplicate object key", "\"a\"");
    /* A shard the index names but that does not exist. */
    ls_test_write_text(d, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"gone.safetensors\"}}");
    open_bad(d, LS_E_IO, "gone.safetensors: cannot open", NULL);
    ls_test_rm_tmpdir(d);
}
END_TEST

START_TEST(test_index_tensor_in_two_shards)
{
    char *d = make_sharded("two");
    /* Put model.norm.weight into shard 1 as well (index still maps it to 3). */
    const st_spec s0[] = {k_all[5], k_all[0], k_all[4]};
    st_write_file(d, "model-00001-of-00003.safetensors", s0, 3);
    open_bad(d, LS_E_INPUT, "tensor 'model.norm.weight' is in two shards",
             "model-00001-of-00003.safetensors (byte offset");
    ls_test_rm_tmpdir(d);
}
END_TEST

START_TEST(test_index_tensor_missing_from_shard)
{
    char *d = make_sharded("miss");
    const st_spec s0[] = {k_all[5]}; /* embed_tokens dropped from shard 1 */
    st_write_file(d, "model-00001-of-00003.safetensors", s0, 1);
    open_bad(d, LS_E_INPUT, "tensor 'model.embed_tokens.weight' is mapped to shard "
             "model-00001-of-00003.safetensors, which does not contain it", NULL);
    ls_test_rm_tmpdir(d);
}
END_TEST

START_TEST(test_index_tensor_not_listed)
{
    char *d = make_sharded("unl");
    const st_spec extra = {"model.extra.weight", "BF16", 1, {4}, 2, NULL};
    const st_spec s2[] = {k_all[4], extra};
    st_write_file(d, "model-00003-of-00003.safetensors", s2, 2);
    open_bad(d, LS_E_INPUT, "model-00003-of-00003.safetensors: tensor 'model.extra.weight'",
             "is not listed in");
    ls_test_rm_tmpdir(d);
}
END_TEST

START_TEST(test_index_tensor_in_wrong_shard)
{
    char *d = make_sharded("wrong");
    /* Move model.norm.weight from shard 3 to shard 2; the index still says 3. */
    const st_spec s1[] = {k_all[2], k_all[1], k_all[3], k_all[4]};
    const st_spec s2[] = {{"model.layers.9.dummy", "U8", 1, {1}, 1, NULL}};
    st_write_file(d, "model-00002-of-00003.safetensors", s1, 4);
    st_write_file(d, "model-00003-of-00003.safetensors", s2, 1);
    ls_checkpoint *ck = NULL;
    ls_error err;
    ck_assert_int_eq(ls_checkpoint_open(d, &ck, &err), LS_E_INPUT);
    /* Either the unlisted dummy or the misplaced norm is reported first,
     * depending on shard order; shard 2 comes first. */
    ck_assert_msg(strstr(err.msg, "'model.norm.weight' is mapped to shard model-00003-of-00003.safetensors "
                                  "but is stored in model-00002-of-00003.safetensors") != NULL, "%s", err.msg);
    ls_test_rm_tmpdir(d);
}
END_TEST

START_TEST(test_dir_layout_errors)
{
    char *d = ls_test_tmpdir("lay");
    open_bad(d, LS_E_IO, "config.json: cannot open", NULL);
    ls_test_write_text(d, "config.json", k_config);
    open_bad(d, LS_E_INPUT, "neither model.safetensors nor model.safetensors.index.json", NULL);
    st_write_file(d, "model.safetensors", k_all, 1);
    ls_test_write_text(d, "model.safetensors.index.json", "{\"weight_map\":{}}");
    open_bad(d, LS_E_INPUT, "holds both model.safetensors and model.safetensors.index.json", NULL);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", d);
    remove(path);
    /* A bad shard's message names the shard file. */
    ls_test_write_text(d, "model.safetensors", "tiny");
    open_bad(d, LS_E_INPUT, "model.safetensors: file is 4 bytes", NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    open_bad(path, LS_E_IO, "not a directory", NULL);
    snprintf(path, sizeof path, "%s/nothing", d);
    open_bad(path, LS_E_IO, "cannot open checkpoint directory", NULL);
    ls_test_rm_tmpdir(d);
}
END_TEST

START_TEST(test_config_rules)
{
    char *d = ls_test_tmpdir("cfg");
    st_write_file(d, "model.safetensors", k_all, N_ALL);
    ls_test_write_text(d, "config.json", "{\"hidden_size\":4,\n \"num_experts\":8,\n \"hidden_size\":5}");
    open_bad(d, LS_E_INPUT, "config.json: invalid JSON at line 3", "duplicate object key near '\"hidden_size\"'");
    ls_test_write_text(d, "config.json", "[1]");
    open_bad(d, LS_E_INPUT, "config.json: not a JSON object", NULL);
    ls_test_write_text(d, "config.json", "{\"a\":1} {}");
    open_bad(d, LS_E_INPUT, "config.json: invalid JSON", NULL);
    /* An integer beyond 64 bits fails the parse; the message names its field. */
    ls_test_write_text(d, "config.json", "{\"model_type\":\"qwen3_next\", \"hidden_size\": "
                       "9999999999999999999999, \"num_experts\": 8}");
    open_bad(d, LS_E_INPUT, "too big integer in field 'hidden_size'", "(byte offset 65)");
    ls_test_rm_tmpdir(d);
}
END_TEST

/* ---- experts ----------------------------------------------------------------------- */

enum { E = 3, I = 2, D = 4 };

/* Element value of projection p of expert e at (r, c), distinct everywhere. */
static uint16_t ev(int layer, int e, int p, int r, int c)
{
    return (uint16_t)(layer * 4096 + e * 512 + p * 128 + r * 16 + c);
}

static char *make_experts(const char *tag, int fused)
{
    char *d = ls_test_tmpdir(tag);
    ls_test_write_text(d, "config.json", k_config);
    static uint16_t split[2][E][3][D * I];
    static uint16_t gate_up[2][E * 2 * I * D], down[2][E * D * I];
    static char names[2][E][3][96];
    st_spec ts[2 * E * 3 + 4];
    size_t n = 0;
    for (int l = 0; l < 2; l++) {
        for (int e = 0; e < E; e++) {
            for (int p = 0; p < 3; p++) {
                int rows = p == 2 ? D : I, cols = p == 2 ? I : D;
                for (int r = 0; r < rows; r++)
                    for (int c = 0; c < cols; c++) {
                        uint16_t v = ev(l, e, p, r, c);
                        split[l][e][p][r * cols + c] = v;
                        if (p < 2)
                            gate_up[l][(e * 2 * I + p * I + r) * D + c] = v;
                        else
                            down[l][(e * D + r) * I + c] = v;
                    }
                static const char *pn[] = {"gate", "up", "down"};
                snprintf(names[l][e][p], sizeof names[l][e][p],
                         "model.language_model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e, pn[p]);
                if (!fused)
                    ts[n++] = (st_spec){names[l][e][p], "BF16", 2, {rows, cols}, 2, split[l][e][p]};
            }
        }
        if (fused) {
            ts[n++] = (st_spec){l ? "model.language_model.layers.1.mlp.experts.gate_up_proj"
                                  : "model.language_model.layers.0.mlp.experts.gate_up_proj",
                                "BF16", 3, {E, 2 * I, D}, 2, gate_up[l]};
            ts[n++] = (st_spec){l ? "model.language_model.layers.1.mlp.experts.down_proj"
                                  : "model.language_model.layers.0.mlp.experts.down_proj",
                                "BF16", 3, {E, D, I}, 2, down[l]};
        }
    }
    st_write_file(d, "model.safetensors", ts, n);
    return d;
}

START_TEST(test_expert_layouts_identical)
{
    char *ds = make_experts("split", 0), *df = make_experts("fused", 1);
    ls_checkpoint *cs = open_ok(ds), *cf = open_ok(df);
    for (int l = 0; l < 2; l++)
        for (int e = 0; e < E; e++)
            for (int p = 0; p < 3; p++) {
                ls_matrix_view a, b;
                ls_error err;
                ck_assert_msg(ls_checkpoint_expert(cs, l, e, (ls_expert_proj)p, &a, &err) == LS_OK, "%s", err.msg);
                ck_assert_msg(ls_checkpoint_expert(cf, l, e, (ls_expert_proj)p, &b, &err) == LS_OK, "%s", err.msg);
                ck_assert_int_eq(a.rows, p == 2 ? D : I);
                ck_assert_int_eq(a.cols, p == 2 ? I : D);
                ck_assert_int_eq(b.rows, a.rows);
                ck_assert_int_eq(b.cols, a.cols);
                ck_assert_int_eq(a.dtype, LS_DTYPE_BF16);
                ck_assert_int_eq(b.dtype, LS_DTYPE_BF16);
                ck_assert_int_eq(memcmp(a.data, b.data, (size_t)(a.rows * a.cols * 2)), 0);
                uint16_t first;
                memcpy(&first, b.data, 2);
                ck_assert_uint_eq(first, ev(l, e, p, 0, 0));
                ck_assert_ptr_nonnull(strstr(b.source, p == 2 ? "experts.down_proj" : "experts.gate_up_proj"));
                ck_assert_ptr_nonnull(strstr(a.source, "_proj.weight"));
            }
    ls_matrix_view v;
    ls_error err;
    ck_assert_int_eq(ls_checkpoint_expert(cf, 0, E, LS_EXPERT_UP, &v, &err), LS_E_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "expert 3 out of range: tensor 'model.layers.0.mlp.experts.gate_up_proj' holds 3 experts"));
    ck_assert_int_eq(ls_checkpoint_expert(cs, 2, 0, LS_EXPERT_GATE, &v, &err), LS_E_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "layer 2 expert 0 not found"));
    ck_assert_ptr_nonnull(strstr(err.msg, "model.layers.2.mlp.experts.0.gate_proj.weight"));
    ck_assert_int_eq(ls_checkpoint_expert(cs, 0, E, LS_EXPERT_DOWN, &v, &err), LS_E_INPUT);
    ck_assert_int_eq(ls_checkpoint_expert(cs, -1, 0, LS_EXPERT_DOWN, &v, &err), LS_E_USAGE);
    ls_checkpoint_close(cs);
    ls_checkpoint_close(cf);
    ls_test_rm_tmpdir(ds);
    ls_test_rm_tmpdir(df);
}
END_TEST

START_TEST(test_expert_bad_shapes)
{
    char *d = ls_test_tmpdir("exb");
    ls_test_write_text(d, "config.json", k_config);
    const st_spec ts[] = {
        {"model.layers.0.mlp.experts.0.gate_proj.weight", "BF16", 2, {2, 4}, 2, NULL},
        {"model.layers.0.mlp.experts.0.up_proj.weight", "BF16", 2, {2, 4}, 2, NULL},
        {"model.layers.0.mlp.experts.0.down_proj.weight", "BF16", 2, {2, 4}, 2, NULL},
        {"model.layers.0.mlp.experts.1.gate_proj.weight", "BF16", 1, {8}, 2, NULL},
        {"model.layers.0.mlp.experts.2.gate_proj.weight", "BF16", 2, {2, 4}, 2, NULL},
        {"model.layers.1.mlp.experts.gate_up_proj", "BF16", 3, {2, 3, 4}, 2, NULL},
        {"model.layers.1.mlp.experts.down_proj", "BF16", 3, {2, 4, 1}, 2, NULL},
        {"model.layers.2.mlp.experts.gate_up_proj", "BF16", 3, {2, 4, 4}, 2, NULL},
        {"model.layers.2.mlp.experts.down_proj", "BF16", 3, {2, 4, 3}, 2, NULL},
        {"model.layers.3.mlp.experts.gate_up_proj", "BF16", 3, {2, 4, 4}, 2, NULL},
        {"model.layers.3.mlp.experts.0.up_proj.weight", "BF16", 2, {2, 4}, 2, NULL},
    };
    st_write_file(d, "model.safetensors", ts, sizeof ts / sizeof ts[0]);
    ls_checkpoint *ck = open_ok(d);
    ls_matrix_view v;
    ls_error err;
    ck_assert_int_eq(ls_checkpoint_expert(ck, 0, 0, LS_EXPERT_GATE, &v, &err), LS_E_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "tensor 'model.layers.0.mlp.experts.0.down_proj.weight'"));
    ck_assert_ptr_nonnull(strstr(err.msg, "has shape [2, 4], expected [4, 2]"));
    ck_assert_int_eq(ls_checkpoint_expert(ck, 0, 1, LS_EXPERT_GATE, &v, &err), LS_E_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "experts.1.gate_proj.weight' (byte offset"));
    ck_assert_ptr_nonnull(strstr(err.msg, "has shape [8], expected 2 dimensions"));
    ck_assert_int_eq(ls_checkpoint_expert(ck, 0, 2, LS_EXPERT_UP, &v, &err), LS_E_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "'model.layers.0.mlp.experts.2.up_proj.weight' not found"));
    ck_assert_int_eq(ls_checkpoint_expert(ck, 0, 2, LS_EXPERT_GATE, &v, &err), LS_OK);
    ck_assert_int_eq(ls_checkpoint_expert(ck, 1, 0, LS_EXPERT_GATE, &v, &err), LS_E_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "'model.layers.1.mlp.experts.gate_up_proj'"));
    ck_assert_ptr_nonnull(strstr(err.msg, "has shape [2, 3, 4], expected [E, 2I, D]"));
    ck_assert_int_eq(ls_checkpoint_expert(ck, 2, 0, LS_EXPERT_DOWN, &v, &err), LS_E_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "'model.layers.2.mlp.experts.down_proj'"));
    ck_assert_ptr_nonnull(strstr(err.msg, "has shape [2, 4, 3], expected [2, 4, 2]"));
    ck_assert_int_eq(ls_checkpoint_expert(ck, 3, 0, LS_EXPERT_GATE, &v, &err), LS_E_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "layer 3 expert 0 is stored twice"));
    ck_assert_int_eq(ls_checkpoint_expert(ck, 3, 1, LS_EXPERT_DOWN, &v, &err), LS_E_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "'model.layers.3.mlp.experts.down_proj' not found"));
    ls_checkpoint_close(ck);
    ls_test_rm_tmpdir(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_add_test(tc, test_single_and_sharded_agree);
    tcase_add_test(tc, test_normalise_and_ignore);
    tcase_add_test(tc, test_normalise_collision);
    tcase_add_test(tc, test_index_shard_name_escapes);
    tcase_add_test(tc, test_index_tensor_in_two_shards);
    tcase_add_test(tc, test_index_tensor_missing_from_shard);
    tcase_add_test(tc, test_index_tensor_not_listed);
    tcase_add_test(tc, test_index_tensor_in_wrong_shard);
    tcase_add_test(tc, test_dir_layout_errors);
    tcase_add_test(tc, test_config_rules);
    tcase_add_test(tc, test_expert_layouts_identical);
    tcase_add_test(tc, test_expert_bad_shapes);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
