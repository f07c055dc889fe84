/* Qwen3.5 MoE end to end on the CPU (docs/model.md §1.2, §2.2):
 *
 *   config     text_config (the release) and top-level (text-only) layouts,
 *              layer_types or the interval (default 4), RoPE fields at the top
 *              or in rope_parameters, and every unsupported value refused
 *              naming its field;
 *   layout     a Qwen3-Next golden rewritten as Qwen3.5 (split GDN
 *              projections de-interleaved, model.language_model. prefix, fused
 *              3-D experts) gives the same records bit for bit: the split path
 *              runs the same operators on the same weights;
 *   refusals   broken checkpoints (a fused expert tensor of the wrong shape,
 *              half-fused experts, text_config missing a field, an F8 tensor, a
 *              quantization_config) exit 2 naming the tensor or field; a vision
 *              placeholder token in a prompt exits 2;
 *   synth      the Qwen3.5 presets parse as the release shapes, their config
 *              renders to a fixed point, the fused and per-expert layouts give
 *              identical records, and qwen3.5-tiny's bytes are pinned. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "fingerprint/fingerprint.h"
#include "fingerprint/sha256.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "model/model.h"
#include "run/run.h"
#include "st_image.h"
#include "synth/synth.h"
#include "gpu/engine_records.h"
#include "testutil.h"

static char *g_dir;

static void setup(void)
{
    if (!g_dir) g_dir = ls_test_tmpdir("qwen35");
}

/* ---- helpers --------------------------------------------------------------------------- */

static json_t *load_json_text(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    ck_assert_msg(j != NULL, "bad JSON in test: %s", je.text);
    return j;
}

/* Parses cfg; want LS_OK, or a failure whose message holds needle. */
static void expect_parse(const json_t *cfg, int ok, const char *needle, ls_model_config *out)
{
    ls_model_config mc;
    ls_error err;
    ls_error_clear(&err);
    ls_status st = ls_model_parse_config(cfg, out ? out : &mc, &err);
    char *text = json_dumps(cfg, JSON_COMPACT | JSON_SORT_KEYS);
    if (ok) {
        ck_assert_msg(st == LS_OK, "refused: %s\nconfig: %.600s", err.msg, text);
    } else {
        ck_assert_msg(st == LS_E_UNSUPPORTED || st == LS_E_INPUT, "accepted: %.600s", text);
        ck_assert_msg(strstr(err.msg, needle), "message '%s' does not name '%s'", err.msg, needle);
        ck_assert_msg(!strchr(err.msg, '\n'), "more than one line: %s", err.msg);
    }
    free(text);
}

/* The golden's config.json (goldens/<name>/config.json), parsed. */
static json_t *golden_config(const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/goldens/%s/config.json", LS_SOURCE_DIR, name);
    json_t *j;
    ls_error err;
    ck_assert_msg(ls_json_load_file(path, &j, &err) == LS_OK, "%s", err.msg);
    return j;
}

/* Sets path "a.b" (one level of nesting at most) of cfg to value (NULL: deletes). */
static void set_field(json_t *cfg, const char *path, json_t *value)
{
    char head[128];
    const char *dot = strchr(path, '.');
    json_t *obj = cfg;
    const char *key = path;
    if (dot) {
        snprintf(head, sizeof head, "%.*s", (int)(dot - path), path);
        obj = json_object_get(cfg, head);
        ck_assert_msg(json_is_object(obj), "no object '%s'", head);
        key = dot + 1;
    }
    if (value) json_object_set_new(obj, key, value);
    else json_object_del(obj, key);
}

static json_t *jv(const char *text)
{
    json_error_t je;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &je);
    ck_assert_msg(v != NULL, "bad JSON value '%s'", text);
    return v;
}

/* ---- config ---------------------------------------------------------------------------- */

START_TEST(test_config_layouts)
{
    /* The release layout (golden a): fields under text_config. */
    json_t *rel = golden_config("qwen35moe_tiny_a");
    ls_model_config c;
    expect_parse(rel, 1, NULL, &c);
    ck_assert_int_eq(c.arch, LS_MODEL_QWEN3_5_MOE);
    ck_assert_int_eq(c.hidden, 64);
    ck_assert_int_eq(c.norm_topk_prob, 1);
    ck_assert_int_eq(c.rotary_dims, 8);
    ck_assert_int_eq(c.vision_tokens_given, 3);
    ck_assert_int_eq(c.vision_tokens[0], 298);
    ck_assert_int_eq(c.vision_tokens[1], 299);
    int want_types[4] = {0, 1, 0, 1};
    for (int l = 0; l < 4; l++) ck_assert_int_eq(c.is_attention[l], want_types[l]);

    /* Without layer_types: full attention every full_attention_interval-th
     * layer, 4 when that is absent too (the reference's default). */
    json_t *v = json_deep_copy(rel);
    set_field(v, "text_config.layer_types", NULL);
    set_field(v, "text_config.num_hidden_layers", json_integer(8));
    expect_parse(v, 1, NULL, &c);
    for (int l = 0; l < 8; l++) ck_assert_int_eq(c.is_attention[l], (l + 1) % 4 == 0);
    set_field(v, "text_config.full_attention_interval", json_integer(3));
    expect_parse(v, 1, NULL, &c);
    for (int l = 0; l < 8; l++) ck_assert_int_eq(c.is_attention[l], (l + 1) % 3 == 0);
    json_decref(v);

    /* RoPE at the top level of text_config instead of rope_parameters, and
     * both (agreeing). */
    v = json_deep_copy(rel);
    set_field(v, "text_config.rope_parameters", NULL);
    set_field(v, "text_config.rope_theta", json_real(10000000.0));
    set_field(v, "text_config.partial_rotary_factor", json_real(0.5));
    set_field(v, "text_config.mrope_section", jv("[4, 2, 2]"));
    set_field(v, "text_config.mrope_interleaved", json_false());
    expect_parse(v, 1, NULL, &c);
    ck_assert_int_eq(c.rotary_dims, 16);
    set_field(v, "text_config.rope_parameters",
              jv("{\"rope_type\": \"default\", \"rope_theta\": 1e7, \"mrope_section\": [4, 2, 2]}"));
    expect_parse(v, 1, NULL, &c);
    set_field(v, "text_config.rope_parameters", jv("{\"mrope_section\": [4, 3, 1]}"));
    expect_parse(v, 0, "'text_config.rope_parameters.mrope_section' disagrees", NULL);
    json_decref(v);

    /* The text-only layout (golden c): model_type qwen3_5_moe_text at the top. */
    json_t *txt = golden_config("qwen35moe_tiny_c");
    expect_parse(txt, 1, NULL, &c);
    ck_assert_int_eq(c.arch, LS_MODEL_QWEN3_5_MOE);
    ck_assert_int_eq(c.hidden, 32);
    ck_assert_int_eq(c.vision_tokens_given, 0);
    json_decref(txt);
    json_decref(rel);
}
END_TEST

START_TEST(test_config_fail_closed)
{
    json_t *rel = golden_config("qwen35moe_tiny_a");
    static const struct {
        const char *path, *value, *needle;
    } cases[] = {
        {"text_config", NULL, "'text_config', which is missing"},
        {"text_config", "[]", "'text_config', which is not an object"},
        {"text_config.model_type", "\"qwen3_next\"", "'text_config.model_type'"},
        {"text_config.hidden_size", NULL, "missing field 'text_config.hidden_size'"},
        {"text_config.num_experts", NULL, "missing field 'text_config.num_experts'"},
        {"text_config.rms_norm_eps", NULL, "missing field 'text_config.rms_norm_eps'"},
        {"text_config.linear_num_value_heads", "3", "'text_config.linear_num_value_heads'"},
        {"text_config.attn_output_gate", "false", "'text_config.attn_output_gate' = false"},
        {"text_config.norm_topk_prob", "false", "'text_config.norm_topk_prob' = false"},
        {"text_config.mamba_ssm_dtype", "\"bfloat16\"", "'text_config.mamba_ssm_dtype'"},
        {"text_config.hidden_act", "\"gelu\"", "'text_config.hidden_act'"},
        {"text_config.attention_bias", "true", "'text_config.attention_bias'"},
        {"text_config.tie_word_embeddings", "true", "'text_config.tie_word_embeddings'"},
        {"tie_word_embeddings", "true", "'tie_word_embeddings'"},
        {"text_config.rope_scaling", "{\"type\": \"mrope\"}", "'text_config.rope_scaling'"},
        {"text_config.rope_parameters", "{\"rope_type\": \"yarn\"}", "'text_config.rope_parameters.rope_type'"},
        {"text_config.rope_parameters", "{\"factor\": 2.0}", "'text_config.rope_parameters.factor'"},
        {"text_config.rope_parameters", "{\"rope_theta\": 1e7, \"mrope_section\": [11, 11, 10]}",
         "'text_config.mrope_section' = [11, 11, 10] does not partition the 4 rotary frequencies"},
        {"text_config.rope_parameters", "{\"rope_theta\": 1e7, \"mrope_section\": [2, 2]}",
         "'text_config.rope_parameters.mrope_section' must be a list of 3"},
        {"text_config.rope_parameters", "{\"rope_theta\": 1e7, \"mrope_interleaved\": 1}",
         "'text_config.rope_parameters.mrope_interleaved'"},
        {"text_config.layer_types", "[\"linear_attention\"]", "'text_config.layer_types'"},
        {"text_config.quantization_config", "{\"quant_method\": \"gptq\"}",
         "'text_config.quantization_config.quant_method' = 'gptq' is not supported"},
        {"quantization_config", "{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}",
         "'quantization_config.fmt' = 'e5m2' is not supported"},
        {"image_token_id", "300", "'image_token_id' = 300 is outside the vocabulary"},
        {"model_type", "\"qwen3_moe\"", "'model_type' = 'qwen3_moe'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *v = json_deep_copy(rel);
        set_field(v, cases[i].path, cases[i].value ? jv(cases[i].value) : NULL);
        expect_parse(v, 0, cases[i].needle, NULL);
        json_decref(v);
    }
    /* A text-only config names its fields without a prefix. */
    json_t *txt = golden_config("qwen35moe_tiny_c");
    json_object_del(txt, "moe_intermediate_size");
    expect_parse(txt, 0, "missing field 'moe_intermediate_size'", NULL);
    json_decref(txt);
    /* mrope_section is a Qwen3.5 field: a Qwen3-Next config holding it is refused. */
    json_t *next = golden_config("qwen3next_tiny_a");
    json_object_set_new(json_object_get(next, "rope_parameters"), "mrope_section", jv("[2, 1, 1]"));
    expect_parse(next, 0, "'rope_parameters.mrope_section' is not supported", NULL);
    json_decref(next);
    json_decref(rel);
}
END_TEST

/* ---- records ---------------------------------------------------------------------------- */

/* Replay (chunks of 16) of a 70-token sequence, then a 12-token greedy
 * rollout from its first 9 tokens, both activation modes, of the model in
 * dir. */
static void run_model(const char *dir, recs *out)
{
    ls_checkpoint *ck;
    ls_model *m;
    ls_error err;
    ck_assert_msg(ls_checkpoint_open(dir, &ck, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_model_open(ck, &m, &err) == LS_OK, "%s: %s", dir, err.msg);
    int32_t tok[71];
    uint64_t x = 0x9e3779b9ull;
    for (int i = 0; i < 71; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((x >> 33) % (uint64_t)(m->cfg.vocab - 8));
    }
    for (int act = 1; act >= 0; act--) {
        ls_engine_opts o;
        ls_engine_opts_default(&o);
        o.act_bf16 = act;
        o.state_digest_every = 5;
        ls_engine *e;
        ck_assert_msg(ls_run_engine_open(m, "cpu", 2, &o, 1, 256, &e, &err) == LS_OK, "%s", err.msg);
        ls_sequence s = {1, tok, 71, 71};
        ck_assert_msg(ls_run_replay(e, &s, 1, 16, recs_sink, out, &err) == LS_OK, "%s", err.msg);
        ls_sequence p = {2, tok, 9, 9};
        ls_sampling g = {LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};
        int32_t gen[12];
        ck_assert_msg(ls_run_rollout(e, &p, 1, 12, &g, gen, recs_sink, out, &err) == LS_OK, "%s",
                      err.msg);
        ls_engine_destroy(e);
    }
    ls_model_close(m);
    ls_checkpoint_close(ck);
}

/* Every record equal, bit for bit; the first difference is named. */
static void expect_same_records(const char *what, const recs *a, const recs *b)
{
    ck_assert_msg(a->n == b->n && a->n > 0, "%s: %ld vs %ld records", what, a->n, b->n);
    for (long i = 0; i < a->n; i++) {
        const ls_trace_record *x = &a->v[i].r, *y = &b->v[i].r;
        ck_assert_msg(x->seq == y->seq && x->pos == y->pos && x->token == y->token &&
                      x->next_token == y->next_token,
                      "%s: record %ld: seq/pos/token %u/%u/%d vs %u/%u/%d", what, i, x->seq, x->pos,
                      x->token, y->seq, y->pos, y->token);
        ck_assert_msg(x->logprob_bits == y->logprob_bits, "%s: record %ld (pos %u): logprob 0x%08x "
                      "vs 0x%08x", what, i, x->pos, x->logprob_bits, y->logprob_bits);
        for (int k = 0; k < 5; k++)
            ck_assert_msg(x->topk_ids[k] == y->topk_ids[k] &&
                          x->topk_logprob_bits[k] == y->topk_logprob_bits[k],
                          "%s: record %ld top-%d: %d 0x%08x vs %d 0x%08x", what, i, k,
                          x->topk_ids[k], x->topk_logprob_bits[k], y->topk_ids[k],
                          y->topk_logprob_bits[k]);
        ck_assert_msg(x->n_digests == y->n_digests, "%s: record %ld: %u vs %u digests", what, i,
                      x->n_digests, y->n_digests);
        for (uint32_t k = 0; k < x->n_digests; k++) {
            const ls_trace_digest *p = &x->digests[k], *q = &y->digests[k];
            char hp[65], hq[65];
            ls_digest_to_hex(&p->digest, hp);
            ls_digest_to_hex(&q->digest, hq);
            ck_assert_msg(p->layer == q->layer && p->kind == q->kind && strcmp(hp, hq) == 0,
                          "%s: record %ld (pos %u) digest %u: layer %u %s %s vs layer %u %s %s",
                          what, i, x->pos, k, p->layer, ls_digest_kind_name((ls_digest_kind)p->kind),
                          hp, q->layer, ls_digest_kind_name((ls_digest_kind)q->kind), hq);
        }
    }
}

/* ---- a Qwen3-Next checkpoint in the Qwen3.5 layout --------------------------------------- */

/* Rows [r0, r0 + n) of a bf16 matrix with `cols` columns, appended at dst. */
static unsigned char *take_rows(unsigned char *dst, const ls_tensor *t, long r0, long n, long cols)
{
    memcpy(dst, (const unsigned char *)t->data + (size_t)r0 * (size_t)cols * 2, (size_t)(n * cols) * 2);
    return dst + (size_t)(n * cols) * 2;
}

/* Writes dir: the Qwen3-Next checkpoint src rewritten as the Qwen3.5 release
 * (docs/model.md §2.2, §2.3): in_proj_qkvz / in_proj_ba de-interleaved into
 * in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; model.* under
 * model.language_model.; each layer's experts stacked into gate_up_proj
 * [E, 2I, D] and down_proj [E, D, I]; config.json under text_config. */
static void rewrite_as_qwen35(const char *src, const char *dir)
{
    ls_checkpoint *ck;
    ls_model *m;
    ls_error err;
    ck_assert_msg(ls_checkpoint_open(src, &ck, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_model_open(ck, &m, &err) == LS_OK, "%s", err.msg);
    const ls_model_config *c = &m->cfg;
    ck_assert_msg(c->norm_topk_prob, "a Qwen3.5 router always renormalises: %s does not", src);
    long D = c->hidden, Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim;
    long dv = c->lin_v_dim, r = Hv / Hk, gw = 2 * dk + 2 * r * dv, E = c->n_experts;
    long I = c->moe_inter;
    size_t n = ls_checkpoint_count(ck), k = 0;
    st_spec *ts = calloc(n + 16 * (size_t)c->n_layers, sizeof *ts);
    char **names = calloc(n + 16 * (size_t)c->n_layers, sizeof *names);
    unsigned char **bufs = calloc(16 * (size_t)c->n_layers, sizeof *bufs);
    size_t nb = 0;
    for (size_t i = 0; i < n; i++) {
        const ls_tensor *t = ls_checkpoint_at(ck, i);
        ck_assert_int_eq(t->dtype, LS_DTYPE_BF16);
        if (strstr(t->name, ".mlp.experts.") || strstr(t->name, ".in_proj_")) continue;
        names[k] = malloc(strlen(t->name) + 32);
        if (strncmp(t->name, "model.", 6) == 0)
            sprintf(names[k], "model.language_model.%s", t->name + 6);
        else
            strcpy(names[k], t->name);
        st_spec s = {names[k], "BF16", t->ndim, {0}, 2, t->data};
        for (int d = 0; d < t->ndim; d++) s.shape[d] = t->shape[d];
        ts[k++] = s;
    }
    for (long l = 0; l < c->n_layers; l++) {
        char nm[160];
        if (!c->is_attention[l]) {
            snprintf(nm, sizeof nm, "model.layers.%ld.linear_attn.in_proj_qkvz.weight", l);
            const ls_tensor *qkvz = ls_checkpoint_find(ck, nm);
            snprintf(nm, sizeof nm, "model.layers.%ld.linear_attn.in_proj_ba.weight", l);
            const ls_tensor *ba = ls_checkpoint_find(ck, nm);
            ck_assert(qkvz && ba);
            long conv_dim = 2 * Hk * dk + Hv * dv;
            unsigned char *qkv = malloc((size_t)(conv_dim * D) * 2), *z = malloc((size_t)(Hv * dv * D) * 2);
            unsigned char *b = malloc((size_t)(Hv * D) * 2), *a = malloc((size_t)(Hv * D) * 2);
            unsigned char *p = qkv;
            for (long g = 0; g < Hk; g++) p = take_rows(p, qkvz, g * gw, dk, D);            /* q */
            for (long g = 0; g < Hk; g++) p = take_rows(p, qkvz, g * gw + dk, dk, D);       /* k */
            for (long g = 0; g < Hk; g++) p = take_rows(p, qkvz, g * gw + 2 * dk, r * dv, D); /* v */
            p = z;
            for (long g = 0; g < Hk; g++) p = take_rows(p, qkvz, g * gw + 2 * dk + r * dv, r * dv, D);
            unsigned char *pb = b, *pa = a;
            for (long g = 0; g < Hk; g++) {
                pb = take_rows(pb, ba, g * 2 * r, r, D);
                pa = take_rows(pa, ba, g * 2 * r + r, r, D);
            }
            static const char *const part[4] = {"qkv", "z", "b", "a"};
            unsigned char *data[4] = {qkv, z, b, a};
            long rows[4] = {conv_dim, Hv * dv, Hv, Hv};
            for (int q = 0; q < 4; q++) {
                names[k] = malloc(128);
                snprintf(names[k], 128, "model.language_model.layers.%ld.linear_attn.in_proj_%s.weight",
                         l, part[q]);
                ts[k] = (st_spec){names[k], "BF16", 2, {rows[q], D}, 2, data[q]};
                k++;
                bufs[nb++] = data[q];
            }
        }
        unsigned char *gu = malloc((size_t)(E * 2 * I * D) * 2), *dn = malloc((size_t)(E * D * I) * 2);
        for (long e = 0; e < E; e++) {
            static const char *const pn[3] = {"gate", "up", "down"};
            for (int q = 0; q < 3; q++) {
                snprintf(nm, sizeof nm, "model.layers.%ld.mlp.experts.%ld.%s_proj.weight", l, e, pn[q]);
                const ls_tensor *t = ls_checkpoint_find(ck, nm);
                ck_assert_msg(t != NULL, "%s", nm);
                unsigned char *at = q < 2 ? gu + (size_t)((e * 2 + q) * I * D) * 2 : dn + (size_t)(e * D * I) * 2;
                memcpy(at, t->data, t->size_bytes);
            }
        }
        names[k] = malloc(128);
        snprintf(names[k], 128, "model.language_model.layers.%ld.mlp.experts.gate_up_proj", l);
        ts[k] = (st_spec){names[k], "BF16", 3, {E, 2 * I, D}, 2, gu};
        k++;
        names[k] = malloc(128);
        snprintf(names[k], 128, "model.language_model.layers.%ld.mlp.experts.down_proj", l);
        ts[k] = (st_spec){names[k], "BF16", 3, {E, D, I}, 2, dn};
        k++;
        bufs[nb++] = gu;
        bufs[nb++] = dn;
    }
    ck_assert_int_eq(ls_test_sh(NULL, "mkdir -p '%s'", dir), 0);
    st_write_file(dir, "model.safetensors", ts, k);
    /* config: the Qwen3-Next fields under text_config, as the release has them */
    json_t *text = json_deep_copy(ls_checkpoint_config_json(ck));
    json_object_set_new(text, "model_type", json_string("qwen3_5_moe_text"));
    json_object_del(text, "norm_topk_prob");
    json_object_del(text, "decoder_sparse_step");
    json_object_del(text, "mlp_only_layers");
    json_object_set_new(text, "attn_output_gate", json_true());
    long half = c->rotary_dims / 2;
    json_t *sec = json_pack("[I, I, I]", (json_int_t)(half - half / 2), (json_int_t)(half / 2), (json_int_t)0);
    json_object_set_new(json_object_get(text, "rope_parameters"), "mrope_section", sec);
    json_object_set_new(json_object_get(text, "rope_parameters"), "mrope_interleaved", json_true());
    json_t *cfg = json_pack("{s:[s], s:s, s:o, s:b}", "architectures", "Qwen3_5MoeForConditionalGeneration",
                            "model_type", "qwen3_5_moe", "text_config", text, "tie_word_embeddings", 0);
    char *t = json_dumps(cfg, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    ls_test_write_text(dir, "config.json", t);
    free(t);
    json_decref(cfg);
    for (size_t i = 0; i < k; i++) free(names[i]);
    for (size_t i = 0; i < nb; i++) free(bufs[i]);
    free(names), free(bufs), free(ts);
    ls_model_close(m);
    ls_checkpoint_close(ck);
}

START_TEST(test_qwen3next_as_qwen35_identical)
{
    static const char *const src[2] = {"qwen3next_tiny_a", "qwen3next_tiny_c"};
    setup();
    char from[4200], to[4200];
    snprintf(from, sizeof from, "%s/goldens/%s", LS_SOURCE_DIR, src[_i]);
    snprintf(to, sizeof to, "%s/%s-as-qwen35", g_dir, src[_i]);
    rewrite_as_qwen35(from, to);
    recs a = {0}, b = {0};
    run_model(from, &a);
    run_model(to, &b);
    char what[160];
    snprintf(what, sizeof what, "%s vs its Qwen3.5 rewrite", src[_i]);
    expect_same_records(what, &a, &b);
    printf("%s: %ld records identical in the Qwen3.5 layout\n", src[_i], a.n);
    recs_free(&a);
    recs_free(&b);
}
END_TEST

/* ---- refused checkpoints ------------------------------------------------------------------ */

/* dir: the checkpoint `golden` (fused layout) with the tensors named in
 * drop removed (exact names, NULL-terminated), extra added, and config.json
 * from cfg (NULL: the golden's). */
static void variant(const char *golden, const char *dir, const char *const *drop, const st_spec *extra,
                    size_t n_extra, const json_t *cfg)
{
    char src[4200];
    snprintf(src, sizeof src, "%s/goldens/%s", LS_SOURCE_DIR, golden);
    ls_checkpoint *ck;
    ls_error err;
    ck_assert_msg(ls_checkpoint_open(src, &ck, &err) == LS_OK, "%s", err.msg);
    size_t n = ls_checkpoint_count(ck) + ls_checkpoint_ignored_count(ck), k = 0;
    st_spec *ts = calloc(n + n_extra, sizeof *ts);
    for (size_t i = 0; i < n; i++) {
        size_t nc = ls_checkpoint_count(ck);
        const ls_tensor *t = i < nc ? ls_checkpoint_at(ck, i) : ls_checkpoint_ignored_at(ck, i - nc);
        int skip = 0;
        for (const char *const *d = drop; d && *d; d++) skip |= strcmp(t->stored_name, *d) == 0;
        if (skip) continue;
        /* the vision tower's 5-D patch embedding is written with its
         * trailing dimensions folded into the fourth (st_spec holds four;
         * the tensor is skipped, its bytes are what matters) */
        st_spec s = {t->stored_name, ls_dtype_name(t->dtype), t->ndim < 4 ? t->ndim : 4, {0},
                     ls_dtype_size(t->dtype), t->data};
        for (int d = 0; d < t->ndim; d++) {
            if (d < 4) s.shape[d] = t->shape[d];
            else s.shape[3] *= t->shape[d];
        }
        ts[k++] = s;
    }
    for (size_t i = 0; i < n_extra; i++) ts[k++] = extra[i];
    ck_assert_int_eq(ls_test_sh(NULL, "rm -rf '%s' && mkdir -p '%s'", dir, dir), 0);
    st_write_file(dir, "model.safetensors", ts, k);
    char *text = json_dumps(cfg ? cfg : ls_checkpoint_config_json(ck),
                            JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    ls_test_write_text(dir, "config.json", text);
    free(text);
    free(ts);
    ls_checkpoint_close(ck);
}

/* `lockstep run` on dir exits 2 with every needle on its one error line. */
static void expect_run_refused(const char *dir, const char *needle1, const char *needle2)
{
    char *out = NULL;
    int rc = ls_test_cli(&out, "run --checkpoint %s --mode rollout --prompts %s/prompts.jsonl "
                         "--max-new-tokens 2 -o %s/refused.trace", dir, g_dir, g_dir);
    ck_assert_msg(rc == 2 && out && strstr(out, needle1) && (!needle2 || strstr(out, needle2)),
                  "%s: exit %d, expected 2 naming '%s'%s%s:\n%s", dir, rc, needle1,
                  needle2 ? " and " : "", needle2 ? needle2 : "", out ? out : "");
    free(out);
}

START_TEST(test_broken_checkpoints_refused)
{
    setup();
    char path[4300], dir[4300];
    snprintf(path, sizeof path, "%s/prompts.jsonl", g_dir);
    const char *jl = "{\"id\": 0, \"tokens\": [1, 2, 3]}\n";
    ls_test_write(path, jl, strlen(jl));
    const char *G = "qwen35moe_tiny_a";
    const long E = 8, I = 32, D = 64;
    static unsigned char zeros[2 * 8 * 2 * 32 * 64 + 4096];
    const char *gu0 = "model.language_model.layers.0.mlp.experts.gate_up_proj";
    const char *dn0 = "model.language_model.layers.0.mlp.experts.down_proj";

    /* the golden itself runs */
    snprintf(dir, sizeof dir, "%s/goldens/%s", LS_SOURCE_DIR, G);
    char *out = NULL;
    int rc = ls_test_cli(&out, "run --checkpoint %s --mode rollout --prompts %s "
                         "--max-new-tokens 2 -o %s/ok.trace", dir, path, g_dir);
    ck_assert_msg(rc == 0, "golden refused:\n%s", out ? out : "");
    free(out);

    /* a fused expert tensor of the wrong shape: 2-D, or an odd middle dimension */
    const char *drop_gu[] = {gu0, NULL};
    st_spec flat = {gu0, "BF16", 2, {E * 2 * I, D}, 2, zeros};
    snprintf(dir, sizeof dir, "%s/fused-2d", g_dir);
    variant(G, dir, drop_gu, &flat, 1, NULL);
    expect_run_refused(dir, "tensor 'model.layers.0.mlp.experts.gate_up_proj'", "expected [E, 2I, D]");
    st_spec odd = {gu0, "BF16", 3, {E, 2 * I - 1, D}, 2, zeros};
    snprintf(dir, sizeof dir, "%s/fused-odd", g_dir);
    variant(G, dir, drop_gu, &odd, 1, NULL);
    expect_run_refused(dir, "tensor 'model.layers.0.mlp.experts.gate_up_proj'", "even middle dimension");
    st_spec narrow = {gu0, "BF16", 3, {E, 2 * I - 2, D}, 2, zeros};
    snprintf(dir, sizeof dir, "%s/fused-narrow", g_dir);
    variant(G, dir, drop_gu, &narrow, 1, NULL);
    expect_run_refused(dir, "model.layers.0.mlp.experts.down_proj", "from model.layers.0.mlp.experts.gate_up_proj");

    /* half-fused: gate_up_proj fused, down_proj per expert; or down_proj missing */
    const char *drop_dn[] = {dn0, NULL};
    char pe[8][96];
    st_spec per[8];
    for (long e = 0; e < E; e++) {
        snprintf(pe[e], sizeof pe[e], "model.language_model.layers.0.mlp.experts.%ld.down_proj.weight", e);
        per[e] = (st_spec){pe[e], "BF16", 2, {D, I}, 2, zeros};
    }
    snprintf(dir, sizeof dir, "%s/half-fused", g_dir);
    variant(G, dir, drop_dn, per, (size_t)E, NULL);
    expect_run_refused(dir, "layer 0 expert 0 is stored twice", "model.layers.0.mlp.experts.gate_up_proj");
    snprintf(dir, sizeof dir, "%s/no-down", g_dir);
    variant(G, dir, drop_dn, NULL, 0, NULL);
    expect_run_refused(dir, "tensor 'model.layers.0.mlp.experts.down_proj' not found", NULL);

    /* text_config missing a field, and a quantization_config */
    json_t *cfg = golden_config(G);
    json_object_del(json_object_get(cfg, "text_config"), "linear_key_head_dim");
    snprintf(dir, sizeof dir, "%s/no-field", g_dir);
    variant(G, dir, NULL, NULL, 0, cfg);
    expect_run_refused(dir, "missing field 'text_config.linear_key_head_dim'", NULL);
    json_decref(cfg);
    cfg = golden_config(G);
    json_object_set_new(cfg, "quantization_config",
                        jv("{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"weight_block_size\": [64, 64]}"));
    snprintf(dir, sizeof dir, "%s/quantized", g_dir);
    variant(G, dir, NULL, NULL, 0, cfg);
    expect_run_refused(dir, "field 'quantization_config.weight_block_size' = [64, 64] is not supported",
                       "[128, 128]");
    json_decref(cfg);

    /* an F8_E4M3 matrix without a quantization_config is refused naming it */
    const char *qkv0 = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight";
    const char *drop_qkv[] = {qkv0, NULL};
    st_spec f8 = {qkv0, "F8_E4M3", 2, {160, D}, 1, zeros};
    snprintf(dir, sizeof dir, "%s/f8", g_dir);
    variant(G, dir, drop_qkv, &f8, 1, NULL);
    expect_run_refused(dir, "tensor 'model.layers.0.linear_attn.in_proj_qkv.weight' has dtype F8_E4M3",
                       "no quantization_config");

    /* a Qwen3-Next projection in a Qwen3.5 checkpoint is not read: refused */
    st_spec stray = {"model.language_model.layers.0.linear_attn.in_proj_ba.weight", "BF16", 2, {8, D}, 2,
                     zeros};
    snprintf(dir, sizeof dir, "%s/stray", g_dir);
    variant(G, dir, NULL, &stray, 1, NULL);
    expect_run_refused(dir, "tensor 'model.layers.0.linear_attn.in_proj_ba.weight'",
                       "no part of the qwen3_5_moe graph reads it");
}
END_TEST

/* The vision tower and MTP tensors of the release layout are skipped and
 * listed in the manifest; a prompt holding a vision placeholder is refused. */
START_TEST(test_vision_skipped_and_refused)
{
    setup();
    char dir[4200], path[4300];
    snprintf(dir, sizeof dir, "%s/goldens/qwen35moe_tiny_a", LS_SOURCE_DIR);
    char *out = NULL;
    int rc = ls_test_cli(&out, "manifest pin --checkpoint %s -o %s/a.manifest.json", dir, g_dir);
    ck_assert_msg(rc == 0, "manifest pin: %s", out ? out : "");
    free(out);
    snprintf(path, sizeof path, "%s/a.manifest.json", g_dir);
    json_t *m;
    ls_error err;
    ck_assert_msg(ls_json_load_file(path, &m, &err) == LS_OK, "%s", err.msg);
    const json_t *list = json_object_get(json_object_get(m, "checkpoint"), "skipped_tensors");
    size_t n_visual = 0, n_mtp = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *e = json_array_get(list, i);
        const char *s = json_string_value(json_object_get(e, "name"));
        const char *why = json_string_value(json_object_get(e, "reason"));
        ck_assert_msg(s && why, "skipped_tensors[%zu]: no name or reason", i);
        int v = strncmp(s, "model.visual.", 13) == 0, t = strncmp(s, "mtp.", 4) == 0;
        ck_assert_msg(!v || strstr(why, "vision tower"), "%s: reason '%s'", s, why);
        ck_assert_msg(!t || strstr(why, "multi-token-prediction head"), "%s: reason '%s'", s, why);
        /* fingerprinted: its digest is in checkpoint.tensors under the stored name */
        const json_t *d = json_object_get(json_object_get(json_object_get(m, "checkpoint"), "tensors"), s);
        ck_assert_msg(json_is_string(json_object_get(d, "sha256")), "checkpoint.tensors[\"%s\"]: no sha256", s);
        n_visual += (size_t)v;
        n_mtp += (size_t)t;
    }
    ck_assert_msg(n_visual > 10 && n_mtp == 2 && n_visual + n_mtp == json_array_size(list),
                  "skipped_tensors: %zu visual, %zu mtp of %zu", n_visual, n_mtp, json_array_size(list));
    json_decref(m);

    /* image_token_id of golden a is 298 */
    snprintf(path, sizeof path, "%s/vision.jsonl", g_dir);
    const char *jl = "{\"id\": 0, \"tokens\": [1, 298, 3]}\n";
    ls_test_write(path, jl, strlen(jl));
    rc = ls_test_cli(&out, "run --checkpoint %s --mode rollout --prompts %s --max-new-tokens 2 "
                     "-o %s/vision.trace", dir, path, g_dir);
    ck_assert_msg(rc == 2 && out && strstr(out, "token id 298 at position 1") &&
                  strstr(out, "image_token_id") && strstr(out, "vision input is not supported"),
                  "exit %d:\n%s", rc, out ? out : "");
    free(out);
}
END_TEST


/* The vision tower and the MTP head are fingerprinted though never read:
 * one byte changed in one of them changes the Merkle root, and every record
 * of a run stays bit for bit the same. */
START_TEST(test_skipped_fingerprinted_records_unchanged)
{
    static const char *const victims[2] = {"mtp.fc.weight", "model.visual.blocks.0.attn.proj.weight"};
    setup();
    char src[4200], dir[4200];
    snprintf(src, sizeof src, "%s/goldens/qwen35moe_tiny_a", LS_SOURCE_DIR);
    snprintf(dir, sizeof dir, "%s/skipped-%d", g_dir, _i);
    ls_checkpoint *ck;
    ls_error err;
    ck_assert_msg(ls_checkpoint_open(src, &ck, &err) == LS_OK, "%s", err.msg);
    const ls_tensor *t = NULL;
    for (size_t i = 0; i < ls_checkpoint_ignored_count(ck); i++)
        if (!strcmp(ls_checkpoint_ignored_at(ck, i)->stored_name, victims[_i])) t = ls_checkpoint_ignored_at(ck, i);
    ck_assert_msg(t && t->ndim == 2, "%s: not a skipped 2-D tensor of the golden", victims[_i]);
    unsigned char *bytes = malloc(t->size_bytes);
    memcpy(bytes, t->data, t->size_bytes);
    bytes[t->size_bytes / 2] ^= 0x01; /* the low mantissa bit of one BF16 element */
    st_spec changed = {t->stored_name, ls_dtype_name(t->dtype), 2, {t->shape[0], t->shape[1]},
                       ls_dtype_size(t->dtype), bytes};
    const char *const drop[] = {victims[_i], NULL};
    variant("qwen35moe_tiny_a", dir, drop, &changed, 1, NULL);
    ls_checkpoint_close(ck);
    free(bytes);

    char a[65], b[65];
    ls_test_merkle_root(src, a);
    ls_test_merkle_root(dir, b);
    ck_assert_msg(strcmp(a, b) != 0, "one byte of %s changed, the root did not (%s)", victims[_i], a);
    recs ra = {0}, rb = {0};
    run_model(src, &ra);
    run_model(dir, &rb);
    char what[200];
    snprintf(what, sizeof what, "qwen35moe_tiny_a vs one byte of %s changed", victims[_i]);
    expect_same_records(what, &ra, &rb);
    recs_free(&ra);
    recs_free(&rb);
}
END_TEST

/* ---- synth -------------------------------------------------------------------------------- */

static void sha_file(const char *path, char hex[65])
{
    size_t len;
    char *data = ls_test_read(path, &len);
    ck_assert_ptr_nonnull(data);
    ls_sha256 h;
    ls_digest d;
    ls_error err;
    ck_assert(ls_sha256_init(&h, &err) == LS_OK);
    ck_assert(ls_sha256_update(&h, data, len, &err) == LS_OK);
    ck_assert(ls_sha256_final(&h, &d, &err) == LS_OK);
    ls_digest_to_hex(&d, hex);
    free(data);
}

START_TEST(test_synth_release_shapes)
{
    static const struct {
        const char *preset;
        long D, L, Hq, Hv, E, k, I, full;
    } want[] = {
        {"qwen3.5-35b-a3b", 2048, 40, 16, 32, 256, 8, 512, 10},
        {"qwen3.5-122b-a10b", 3072, 48, 32, 64, 256, 8, 1024, 12},
        {"qwen3.5-397b-a17b", 4096, 60, 32, 64, 512, 10, 1024, 15},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ls_synth_config sc;
        ls_error err;
        ck_assert_msg(ls_synth_preset(want[i].preset, &sc, &err) == LS_OK, "%s", err.msg);
        char *text;
        size_t len;
        ck_assert(ls_synth_config_render(&sc, &text, &len, &err) == LS_OK);
        /* the rendering is a fixed point of parse + render */
        ls_synth_config back;
        ck_assert_msg(ls_synth_config_parse("rendered", text, len, &back, &err) == LS_OK, "%s", err.msg);
        char *again;
        size_t len2;
        ck_assert(ls_synth_config_render(&back, &again, &len2, &err) == LS_OK);
        ck_assert_msg(len == len2 && memcmp(text, again, len) == 0, "%s: render not a fixed point",
                      want[i].preset);
        json_t *j = load_json_text(text);
        ls_model_config c;
        expect_parse(j, 1, NULL, &c);
        ck_assert_int_eq(c.arch, LS_MODEL_QWEN3_5_MOE);
        ck_assert_int_eq(c.vocab, 248320);
        ck_assert_int_eq(c.hidden, want[i].D);
        ck_assert_int_eq(c.n_layers, want[i].L);
        ck_assert_int_eq(c.n_heads, want[i].Hq);
        ck_assert_int_eq(c.n_kv_heads, 2);
        ck_assert_int_eq(c.head_dim, 256);
        ck_assert_int_eq(c.rotary_dims, 64);
        ck_assert_int_eq(c.lin_k_heads, 16);
        ck_assert_int_eq(c.lin_v_heads, want[i].Hv);
        ck_assert_int_eq(c.n_experts, want[i].E);
        ck_assert_int_eq(c.topk, want[i].k);
        ck_assert_int_eq(c.moe_inter, want[i].I);
        ck_assert_int_eq(c.shared_inter, want[i].I);
        ck_assert_int_eq(c.vision_tokens_given, 3);
        long full = 0;
        for (long l = 0; l < c.n_layers; l++) full += c.is_attention[l];
        ck_assert_int_eq(full, want[i].full);
        const json_t *sec = json_object_get(json_object_get(json_object_get(j, "text_config"),
                                                            "rope_parameters"), "mrope_section");
        ck_assert_int_eq(json_integer_value(json_array_get(sec, 0)), 11);
        ck_assert_int_eq(json_integer_value(json_array_get(sec, 1)), 11);
        ck_assert_int_eq(json_integer_value(json_array_get(sec, 2)), 10);
        json_decref(j);
        free(text);
        free(again);
        /* --layers keeps the first layers */
        ck_assert(ls_synth_config_truncate(&sc, 3, &err) == LS_OK);
        ck_assert(ls_synth_config_render(&sc, &text, &len, &err) == LS_OK);
        j = load_json_text(text);
        expect_parse(j, 1, NULL, &c);
        ck_assert_int_eq(c.n_layers, 3);
        ck_assert_int_eq(c.is_attention[2], 0);
        json_decref(j);
        free(text);
    }
}
END_TEST

/* qwen3.5-tiny in both expert layouts: the same records; the release
 * layout's names and shapes; its bytes pinned (docs/synth.md). */
START_TEST(test_synth_layouts)
{
    setup();
    char f[4200], p[4200], path[4300];
    snprintf(f, sizeof f, "%s/q35-fused", g_dir);
    snprintf(p, sizeof p, "%s/q35-per-expert", g_dir);
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset qwen3.5-tiny --seed 1 --out %s", f), 0);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset qwen3.5-tiny --seed 1 --expert-layout "
                                 "per-expert --out %s", p), 0);
    free(out);
    ck_assert_int_ne(ls_test_cli(&out, "synth --preset qwen3.5-tiny --seed 1 --expert-layout "
                                 "stacked --out %s/x", g_dir), 0);
    ck_assert_msg(out && strstr(out, "--expert-layout 'stacked'"), "%s", out ? out : "");
    free(out);

    ls_checkpoint *ck;
    ls_error err;
    ck_assert_msg(ls_checkpoint_open(f, &ck, &err) == LS_OK, "%s", err.msg);
    const ls_tensor *gu = ls_checkpoint_find(ck, "model.layers.1.mlp.experts.gate_up_proj");
    ck_assert_msg(gu && gu->ndim == 3 && gu->shape[0] == 8 && gu->shape[1] == 128 && gu->shape[2] == 128,
                  "gate_up_proj");
    ck_assert_str_eq(gu->stored_name, "model.language_model.layers.1.mlp.experts.gate_up_proj");
    ck_assert_ptr_nonnull(ls_checkpoint_find(ck, "model.layers.0.linear_attn.in_proj_qkv.weight"));
    ck_assert_ptr_null(ls_checkpoint_find(ck, "model.layers.0.linear_attn.in_proj_qkvz.weight"));
    ck_assert_ptr_null(ls_checkpoint_find(ck, "model.layers.0.mlp.experts.0.up_proj.weight"));
    ls_checkpoint_close(ck);

    recs a = {0}, b = {0};
    run_model(f, &a);
    run_model(p, &b);
    expect_same_records("qwen3.5-tiny fused vs per-expert", &a, &b);
    recs_free(&a);
    recs_free(&b);

    char h[65];
    snprintf(path, sizeof path, "%s/config.json", f);
    sha_file(path, h);
    ck_assert_str_eq(h, "214b29646e841b6588314c6af1cceed0bdd724102089aed4e4195afe1e85a754");
    snprintf(path, sizeof path, "%s/model.safetensors", f);
    sha_file(path, h);
    ck_assert_str_eq(h, "91ee5702aaeba532cdff6a7775eff606ec2ef580efbe39402e441c205a29d6bf");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("qwen35");
    TCase *tc = tcase_create("qwen35");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_config_layouts);
    tcase_add_test(tc, test_config_fail_closed);
    tcase_add_loop_test(tc, test_qwen3next_as_qwen35_identical, 0, 2);
    tcase_add_test(tc, test_broken_checkpoints_refused);
    tcase_add_test(tc, test_vision_skipped_and_refused);
    tcase_add_loop_test(tc, test_skipped_fingerprinted_records_unchanged, 0, 2);
    tcase_add_test(tc, test_synth_release_shapes);
    tcase_add_test(tc, test_synth_layouts);
    suite_add_tcase(s, tc);
    int failed = ls_test_run_suite(s, 0);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    return failed ? 1 : 0;
}
