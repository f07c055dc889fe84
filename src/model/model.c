/* lockstep — Qwen3-Next and Qwen3.5 MoE configuration validation and weight
 * binding; see model.h. */
#include "model/model.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_fp8.h"
#include "numerics/reduce.h"
#include "synth/synth.h"

#define LIM_DIM 1048576L       /* sanity bound on every size field */

/* ---- config -------------------------------------------------------------------- */

/* Where the language model's fields are: the top level of config.json
 * (Qwen3-Next, a text-only Qwen3.5) or its text_config object (the Qwen3.5
 * release); pfx prefixes field names in messages ("text_config."). */
typedef struct cfg_src {
    const json_t *o;
    const char *pfx;
} cfg_src;

static ls_status get_int(const cfg_src *s, const char *key, int required, long def, long lo,
                         long hi, long *out, ls_error *err)
{
    const json_t *v = json_object_get(s->o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return ls_fail(err, LS_E_INPUT, "config.json: missing field '%s%s'", s->pfx, key);
        *out = def;
        return LS_OK;
    }
    if (!json_is_integer(v))
        return ls_fail(err, LS_E_INPUT, "config.json: field '%s%s' must be an integer", s->pfx, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%s%s' = %lld is outside %ld..%ld",
                       s->pfx, key, (long long)x, lo, hi);
    *out = (long)x;
    return LS_OK;
}

static ls_status get_num(const cfg_src *s, const char *key, int *present, double *out,
                         ls_error *err)
{
    const json_t *v = json_object_get(s->o, key);
    *present = 0;
    if (!v || json_is_null(v)) return LS_OK;
    if (!json_is_number(v))
        return ls_fail(err, LS_E_INPUT, "config.json: field '%s%s' must be a number", s->pfx, key);
    *out = json_number_value(v);
    *present = 1;
    return LS_OK;
}

static ls_status get_bool(const cfg_src *s, const char *key, int def, int *out, ls_error *err)
{
    const json_t *v = json_object_get(s->o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return LS_OK;
    }
    if (!json_is_boolean(v))
        return ls_fail(err, LS_E_INPUT, "config.json: field '%s%s' must be true or false", s->pfx,
                       key);
    *out = json_is_true(v);
    return LS_OK;
}

/* A boolean field that must be absent, null or `allowed` (else
 * LS_E_UNSUPPORTED naming it, with why). */
static ls_status want_bool(const cfg_src *s, const char *key, int allowed, const char *why,
                           ls_error *err)
{
    int b = allowed;
    LS_TRY(get_bool(s, key, allowed, &b, err));
    if (b != allowed)
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%s%s' = %s is not supported%s",
                       s->pfx, key, b ? "true" : "false", why);
    return LS_OK;
}

/* A token id field (bos_token_id, eos_token_id): absent, null, an integer or
 * a list of integers, each inside the vocabulary. Nothing in lockstep stops
 * on these ids, but a config naming a token the model cannot produce
 * describes another model (or a corrupted one), so it is refused. */
static ls_status check_token_ids(const cfg_src *s, const char *key, long vocab, ls_error *err)
{
    const json_t *v = json_object_get(s->o, key);
    if (!v || json_is_null(v)) return LS_OK;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
        char field[96];
        if (json_is_array(v)) snprintf(field, sizeof field, "%s%s[%zu]", s->pfx, key, i);
        else snprintf(field, sizeof field, "%s%s", s->pfx, key);
        if (!json_is_integer(x))
            return ls_fail(err, LS_E_INPUT, "config.json: field '%s' must be an integer token id%s",
                           field, json_is_array(v) ? "" : " or a list of them");
        json_int_t id = json_integer_value(x);
        if (id < 0 || id >= vocab)
            return ls_fail(err, LS_E_INPUT, "config.json: field '%s' = %lld is outside the "
                           "vocabulary (0..%ld, vocab_size %ld)", field, (long long)id, vocab - 1,
                           vocab);
    }
    return LS_OK;
}

/* The integer fields of config.json the model reads, where they go in
 * ls_model_config and the values accepted; one table for the JSON reader and
 * for the check of a config built in memory (ls_model_synthetic). */
typedef struct int_field {
    const char *key;           /* config.json name */
    size_t off;                /* offset of the long in ls_model_config */
    long lo, hi;               /* accepted range */
} int_field;

#define F(key, member, lo, hi) {key, offsetof(ls_model_config, member), lo, hi}
static const int_field int_fields[] = {
    F("hidden_size", hidden, 1, LIM_DIM),
    F("num_hidden_layers", n_layers, 1, LS_MODEL_MAX_LAYERS),
    F("vocab_size", vocab, 1, 1L << 24),
    F("num_attention_heads", n_heads, 1, 4096),
    F("num_key_value_heads", n_kv_heads, 1, 4096),
    F("head_dim", head_dim, 1, 1024),
    F("linear_num_key_heads", lin_k_heads, 1, 4096),
    F("linear_num_value_heads", lin_v_heads, 1, 4096),
    F("linear_key_head_dim", lin_k_dim, 1, 4096),
    F("linear_value_head_dim", lin_v_dim, 1, 1024),
    F("linear_conv_kernel_dim", conv_kernel, 1, 64),
    F("num_experts", n_experts, 1, 65536),
    F("num_experts_per_tok", topk, 1, 64),
    F("moe_intermediate_size", moe_inter, 1, LIM_DIM),
    F("shared_expert_intermediate_size", shared_inter, 1, LIM_DIM),
    F("max_position_embeddings", max_positions, 1, 1L << 30),
};
#undef F

static long *field_at(ls_model_config *c, const int_field *f)
{
    return (long *)((char *)c + f->off);
}

/* Constraints between fields (label names the source in messages, pfx the
 * object the fields are in). */
static ls_status check_relations(const ls_model_config *c, const char *label, const char *pfx,
                                 ls_error *err)
{
    if (c->n_heads % c->n_kv_heads)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: field '%snum_attention_heads' (%ld) is not a "
                       "multiple of '%snum_key_value_heads' (%ld)", label, pfx, c->n_heads, pfx,
                       c->n_kv_heads);
    if (c->lin_v_heads % c->lin_k_heads)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: field '%slinear_num_value_heads' (%ld) is not a "
                       "multiple of '%slinear_num_key_heads' (%ld)", label, pfx, c->lin_v_heads,
                       pfx, c->lin_k_heads);
    if (c->topk > c->n_experts)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: field '%snum_experts_per_tok' (%ld) exceeds "
                       "'%snum_experts' (%ld)", label, pfx, c->topk, pfx, c->n_experts);
    return LS_OK;
}

const char *ls_model_arch_name(ls_model_arch arch)
{
    return arch == LS_MODEL_QWEN3_5_MOE ? "qwen3_5_moe" : "qwen3_next";
}

int ls_model_vision_token(const ls_model_config *cfg, long t)
{
    for (int v = 0; v < 2; v++)
        if ((cfg->vision_tokens_given >> v & 1) && t == cfg->vision_tokens[v]) return v;
    return -1;
}

/* RoPE settings as read: theta, the partial rotary factor and, for Qwen3.5,
 * the multimodal sections (have_* = given somewhere). */
typedef struct rope_cfg {
    double theta, prf;
    int have_theta, have_prf;
    long section[3];
    int have_section, have_interleaved, interleaved;
} rope_cfg;

/* mrope_section: three non-negative integers (temporal, height, width). */
static ls_status read_section(const json_t *v, const char *field, long out[3], ls_error *err)
{
    if (!json_is_array(v) || json_array_size(v) != 3)
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%s' must be a list of 3 "
                       "integers (temporal, height, width sections)", field);
    for (size_t i = 0; i < 3; i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 4096)
            return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%s[%zu]' must be an integer "
                           "in 0..4096", field, i);
        out[i] = (long)json_integer_value(x);
    }
    return LS_OK;
}

/* One RoPE field, from the top level of the source or from rope_parameters
 * (where given twice, the two must agree). */
static ls_status rope_field(const cfg_src *s, int arch, const char *key, const json_t *val,
                            const char *where, rope_cfg *r, ls_error *err)
{
    char field[128];
    snprintf(field, sizeof field, "%s%s%s", s->pfx, where, key);
    if (strcmp(key, "rope_theta") == 0 || strcmp(key, "partial_rotary_factor") == 0) {
        if (!json_is_number(val))
            return ls_fail(err, LS_E_INPUT, "config.json: field '%s' must be a number", field);
        double x = json_number_value(val);
        int is_theta = key[5] == 't';
        if ((is_theta ? r->have_theta : r->have_prf) && x != (is_theta ? r->theta : r->prf))
            return ls_fail(err, LS_E_INPUT, "config.json: field '%s' disagrees with the top-level "
                           "'%s%s'", field, s->pfx, key);
        if (is_theta) r->theta = x, r->have_theta = 1;
        else r->prf = x, r->have_prf = 1;
        return LS_OK;
    }
    if (arch == LS_MODEL_QWEN3_5_MOE && strcmp(key, "mrope_section") == 0) {
        long sec[3];
        LS_TRY(read_section(val, field, sec, err));
        if (r->have_section && memcmp(sec, r->section, sizeof sec) != 0)
            return ls_fail(err, LS_E_INPUT, "config.json: field '%s' disagrees with the top-level "
                           "'%smrope_section'", field, s->pfx);
        memcpy(r->section, sec, sizeof sec);
        r->have_section = 1;
        return LS_OK;
    }
    if (arch == LS_MODEL_QWEN3_5_MOE && strcmp(key, "mrope_interleaved") == 0) {
        if (!json_is_boolean(val))
            return ls_fail(err, LS_E_INPUT, "config.json: field '%s' must be true or false", field);
        if (r->have_interleaved && json_is_true(val) != r->interleaved)
            return ls_fail(err, LS_E_INPUT, "config.json: field '%s' disagrees with the top-level "
                           "'%smrope_interleaved'", field, s->pfx);
        r->interleaved = json_is_true(val);
        r->have_interleaved = 1;
        return LS_OK;
    }
    return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%s' is not supported", field);
}

/* RoPE: top-level fields and/or the v5 rope_parameters object. Qwen3.5's
 * multimodal RoPE gives each rotary frequency one of three position rows
 * (temporal, height, width; mrope_section says how many of each). For text
 * all three rows hold the token's position, so every frequency turns by
 * position · inv_freq whatever the assignment, interleaved or not: it is the
 * Qwen3-Next partial RoPE (docs/model.md §3.3). That holds for a default
 * RoPE whose sections partition the R/2 frequencies, which is checked. */
static ls_status parse_rope(const cfg_src *s, ls_model_config *c, ls_error *err)
{
    const json_t *rs = json_object_get(s->o, "rope_scaling");
    if (rs && !json_is_null(rs))
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%srope_scaling' must be null",
                       s->pfx);
    rope_cfg r = {10000.0, 0.25, 0, 0, {0, 0, 0}, 0, 0, 0};
    static const char *const top[] = {"rope_theta", "partial_rotary_factor", "mrope_section",
                                      "mrope_interleaved"};
    for (int i = 0; i < (c->arch == LS_MODEL_QWEN3_5_MOE ? 4 : 2); i++) {
        const json_t *v = json_object_get(s->o, top[i]);
        if (v && !json_is_null(v)) LS_TRY(rope_field(s, (int)c->arch, top[i], v, "", &r, err));
    }
    const json_t *rp = json_object_get(s->o, "rope_parameters");
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp))
            return ls_fail(err, LS_E_INPUT, "config.json: field '%srope_parameters' must be an "
                           "object", s->pfx);
        const char *key;
        const json_t *val;
        json_object_foreach((json_t *)rp, key, val) {
            if (strcmp(key, "rope_type") == 0) {
                if (!json_is_string(val) || strcmp(json_string_value(val), "default") != 0)
                    return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field "
                                   "'%srope_parameters.rope_type' must be \"default\"", s->pfx);
            } else {
                LS_TRY(rope_field(s, (int)c->arch, key, val, "rope_parameters.", &r, err));
            }
        }
    }
    if (!(r.theta > 1.0) || !isfinite(r.theta))
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%srope_theta' = %g is not "
                       "supported", s->pfx, r.theta);
    double rd = r.prf * (double)c->head_dim;
    c->rotary_dims = (long)rd;
    if (!(r.prf > 0.0 && r.prf <= 1.0) || (double)c->rotary_dims != rd || c->rotary_dims % 2)
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%spartial_rotary_factor' = %g "
                       "gives %g rotary dims of head_dim %ld (need a positive even integer)",
                       s->pfx, r.prf, rd, c->head_dim);
    if (r.have_section && r.section[0] + r.section[1] + r.section[2] != c->rotary_dims / 2)
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%smrope_section' = [%ld, %ld, "
                       "%ld] does not partition the %ld rotary frequencies (head_dim %ld x "
                       "partial_rotary_factor %g / 2); the text-only reduction of multimodal "
                       "RoPE to partial RoPE (docs/model.md §3.3) is defined for sections that "
                       "do", s->pfx, r.section[0], r.section[1], r.section[2], c->rotary_dims / 2,
                       c->head_dim, r.prf);
    c->rope_theta = r.theta;
    return LS_OK;
}

/* Qwen3.5's vision placeholder ids (top level of config.json), for the
 * engine to refuse (ls_model_config.vision_tokens). */
static ls_status parse_vision_tokens(const json_t *root, ls_model_config *c, ls_error *err)
{
    static const char *const keys[2] = {"image_token_id", "video_token_id"};
    const cfg_src top = {root, ""};
    for (int i = 0; i < 2; i++) {
        long id = -1;
        LS_TRY(get_int(&top, keys[i], 0, -1, 0, 1L << 31, &id, err));
        if (id >= c->vocab)
            return ls_fail(err, LS_E_INPUT, "config.json: field '%s' = %ld is outside the "
                           "vocabulary (0..%ld)", keys[i], id, c->vocab - 1);
        c->vision_tokens[i] = id;
        if (id >= 0) c->vision_tokens_given |= 1 << i;
    }
    return LS_OK;
}

ls_status ls_model_parse_config(const void *config_json, ls_model_config *c, ls_error *err)
{
    const json_t *root = config_json;
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) return ls_fail(err, LS_E_INPUT, "config.json: not a JSON object");
    const json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt))
        return ls_fail(err, LS_E_INPUT, "config.json: field 'model_type' missing or not a string");
    const char *type = json_string_value(mt);
    cfg_src s = {root, ""};
    if (strcmp(type, "qwen3_next") == 0) {
        c->arch = LS_MODEL_QWEN3_NEXT;
    } else if (strcmp(type, "qwen3_5_moe") == 0) {
        /* The release: a vision-language config whose language model is
         * text_config; the vision tower's weights are set aside by the
         * checkpoint reader and vision_config is not read. */
        c->arch = LS_MODEL_QWEN3_5_MOE;
        const json_t *text = json_object_get(root, "text_config");
        if (!json_is_object(text))
            return ls_fail(err, LS_E_INPUT, "config.json: field 'model_type' = 'qwen3_5_moe' "
                           "keeps the language model's fields under 'text_config', which is %s",
                           text ? "not an object" : "missing");
        const json_t *tt = json_object_get(text, "model_type");
        if (tt && (!json_is_string(tt) || strcmp(json_string_value(tt), "qwen3_5_moe_text") != 0))
            return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field 'text_config.model_type' = "
                           "'%s' is not supported (expected qwen3_5_moe_text)",
                           json_is_string(tt) ? json_string_value(tt) : "(not a string)");
        s.o = text;
        s.pfx = "text_config.";
    } else if (strcmp(type, "qwen3_5_moe_text") == 0) {
        c->arch = LS_MODEL_QWEN3_5_MOE; /* a text-only checkpoint: fields at the top level */
    } else {
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field 'model_type' = '%s' is not "
                       "supported (supported: qwen3_next, qwen3_5_moe, qwen3_5_moe_text)", type);
    }
    int q35 = c->arch == LS_MODEL_QWEN3_5_MOE;
    /* Both objects where they differ (the release's top level and
     * text_config), the language model's first. */
    const cfg_src both[2] = {s, {root, ""}};
    int n_src = s.o == root ? 1 : 2;

    for (size_t i = 0; i < sizeof int_fields / sizeof int_fields[0]; i++) {
        const int_field *f = &int_fields[i];
        LS_TRY(get_int(&s, f->key, 1, 0, f->lo, f->hi, field_at(c, f), err));
    }
    LS_TRY(check_relations(c, "config.json", s.pfx, err));
    const json_t *quant_seen = NULL;
    for (int k = 0; k < n_src; k++) {
        LS_TRY(check_token_ids(&both[k], "bos_token_id", c->vocab, err));
        LS_TRY(check_token_ids(&both[k], "eos_token_id", c->vocab, err));
        /* FP8 block quantisation is the one quantised form lockstep computes
         * (docs/model.md §6b); anything else is refused rather than run as
         * if its weights were plain. The release keeps it at the top level,
         * a text-only load may carry it in text_config: where both hold
         * one, they must be the same. */
        const json_t *quant = json_object_get(both[k].o, "quantization_config");
        if (quant && !json_is_null(quant)) {
            char field[64];
            snprintf(field, sizeof field, "%squantization_config", both[k].pfx);
            LS_TRY(ls_model_fp8_check_config(quant, field, err));
            if (quant_seen && !json_equal((json_t *)quant, (json_t *)quant_seen))
                return ls_fail(err, LS_E_INPUT, "config.json: fields 'quantization_config' and "
                               "'text_config.quantization_config' differ");
            quant_seen = quant;
            c->fp8 = 1;
        }
        LS_TRY(want_bool(&both[k], "tie_word_embeddings", 0, "", err));
    }
    if (q35) LS_TRY(parse_vision_tokens(root, c, err));

    const json_t *act = json_object_get(s.o, "hidden_act");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%shidden_act' must be \"silu\"",
                       s.pfx);
    LS_TRY(want_bool(&s, "attention_bias", 0, "", err));
    /* The gated attention (a sigmoid gate beside each query head) is the
     * only kind either graph has; Qwen3.5 configs say so explicitly. */
    LS_TRY(want_bool(&s, "attn_output_gate", 1, " (the attention output is always gated: q_proj "
                     "holds a query and a gate per head)", err));
    if (q35) {
        /* The Qwen3.5 router always renormalises the top-k weights; the
         * reference has no switch, so a config saying otherwise describes
         * something it does not compute. */
        LS_TRY(want_bool(&s, "norm_topk_prob", 1, " (the qwen3_5_moe router always renormalises "
                         "the top-k weights)", err));
        c->norm_topk_prob = 1;
        const json_t *sd = json_object_get(s.o, "mamba_ssm_dtype");
        if (sd && !json_is_null(sd) &&
            (!json_is_string(sd) || strcmp(json_string_value(sd), "float32") != 0))
            return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%smamba_ssm_dtype' must be "
                           "\"float32\" (lockstep carries the GDN state in fp32)", s.pfx);
    } else {
        LS_TRY(get_bool(&s, "norm_topk_prob", 1, &c->norm_topk_prob, err));
    }
    long step = 1;
    LS_TRY(get_int(&s, "decoder_sparse_step", 0, 1, 0, 1L << 20, &step, err));
    if (step != 1)
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%sdecoder_sparse_step' = %ld is "
                       "not supported (only 1: every layer MoE)", s.pfx, step);
    const json_t *mlp_only = json_object_get(s.o, "mlp_only_layers");
    if (mlp_only && !json_is_null(mlp_only) && (!json_is_array(mlp_only) || json_array_size(mlp_only)))
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%smlp_only_layers' must be "
                       "empty (dense-MLP layers are not supported)", s.pfx);

    int have;
    double eps = 0;
    LS_TRY(get_num(&s, "rms_norm_eps", &have, &eps, err));
    if (!have) return ls_fail(err, LS_E_INPUT, "config.json: missing field '%srms_norm_eps'", s.pfx);
    if ((float)eps != 1e-6f)
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%srms_norm_eps' = %g is not "
                       "supported (the strict operators use 1e-6)", s.pfx, eps);
    LS_TRY(parse_rope(&s, c, err));

    /* Layer types: layer_types wins, as in the reference; without it full
     * attention every full_attention_interval-th layer (Qwen3.5: default 4,
     * as the reference; Qwen3-Next: required). */
    const json_t *lt = json_object_get(s.o, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (long)json_array_size(lt) != c->n_layers)
            return ls_fail(err, LS_E_INPUT, "config.json: field '%slayer_types' must be an array of "
                           "num_hidden_layers (%ld) strings", s.pfx, c->n_layers);
        for (long i = 0; i < c->n_layers; i++) {
            const json_t *e = json_array_get(lt, (size_t)i);
            const char *str = json_is_string(e) ? json_string_value(e) : "";
            if (strcmp(str, "full_attention") == 0) c->is_attention[i] = 1;
            else if (strcmp(str, "linear_attention") == 0) c->is_attention[i] = 0;
            else
                return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%slayer_types[%ld]' "
                               "must be \"full_attention\" or \"linear_attention\"", s.pfx, i);
        }
        long fai;
        LS_TRY(get_int(&s, "full_attention_interval", 0, 0, 0, 1L << 20, &fai, err));
        (void)fai; /* layer_types wins, as in the reference */
    } else {
        long fai;
        LS_TRY(get_int(&s, "full_attention_interval", !q35, 4, 1, 1L << 20, &fai, err));
        for (long i = 0; i < c->n_layers; i++) c->is_attention[i] = (i + 1) % fai == 0;
    }
    return LS_OK;
}

/* ---- config built in memory ------------------------------------------------------- */

static long field_get(const ls_model_config *c, const int_field *f)
{
    long v;
    memcpy(&v, (const char *)c + f->off, sizeof v);
    return v;
}

/* A config built in memory (ls_model_synthetic), held to the rules
 * ls_model_parse_config applies to config.json: the same ranges and
 * relations, rotary dims and RoPE theta as parsing would accept, one type
 * per layer. */
static ls_status check_config(const ls_model_config *c, ls_error *err)
{
    const char *label = "model config";
    for (size_t i = 0; i < sizeof int_fields / sizeof int_fields[0]; i++) {
        const int_field *f = &int_fields[i];
        long v = field_get(c, f);
        if (v < f->lo || v > f->hi)
            return ls_fail(err, LS_E_UNSUPPORTED, "%s: field '%s' = %ld is outside %ld..%ld",
                           label, f->key, v, f->lo, f->hi);
    }
    if (c->arch != LS_MODEL_QWEN3_NEXT && c->arch != LS_MODEL_QWEN3_5_MOE)
        return ls_fail(err, LS_E_USAGE, "%s: arch = %d (0 qwen3_next, 1 qwen3_5_moe)", label,
                       (int)c->arch);
    LS_TRY(check_relations(c, label, "", err));
    if (c->arch == LS_MODEL_QWEN3_5_MOE && c->norm_topk_prob != 1)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: norm_topk_prob = %d (the qwen3_5_moe router "
                       "always renormalises)", label, c->norm_topk_prob);
    if (c->fp8 != 0 && c->fp8 != 1)
        return ls_fail(err, LS_E_USAGE, "%s: fp8 = %d (0 bf16 matrices, 1 FP8 block-quantised "
                       "where the FP8 releases quantise)", label, c->fp8);
    if (c->vision_tokens_given & ~3)
        return ls_fail(err, LS_E_USAGE, "%s: vision_tokens_given = %d (bits 0 and 1)", label,
                       c->vision_tokens_given);
    if (c->rotary_dims < 2 || c->rotary_dims > c->head_dim || c->rotary_dims % 2)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: %ld rotary dims of head_dim %ld (need a "
                       "positive even number, at most head_dim)", label, c->rotary_dims,
                       c->head_dim);
    if (!(c->rope_theta > 1.0) || !isfinite(c->rope_theta))
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: field 'rope_theta' = %g is not supported",
                       label, c->rope_theta);
    if (c->norm_topk_prob != 0 && c->norm_topk_prob != 1)
        return ls_fail(err, LS_E_USAGE, "%s: norm_topk_prob = %d (0 or 1)", label,
                       c->norm_topk_prob);
    for (long l = 0; l < c->n_layers; l++)
        if (c->is_attention[l] != 0 && c->is_attention[l] != 1)
            return ls_fail(err, LS_E_USAGE, "%s: layer %ld has type %d (0 gated DeltaNet, 1 full "
                           "attention)", label, l, c->is_attention[l]);
    return LS_OK;
}

/* ---- weights -------------------------------------------------------------------- */

/* Where the tensors come from: a checkpoint, or none (a synthetic model:
 * matrices without data, small parameters generated). One binding path
 * serves both, so a synthetic model has exactly the tensors and shapes
 * ls_model_open binds. */
typedef struct binder {
    const ls_checkpoint *ck;   /* NULL = synthetic */
    unsigned char *used;       /* [ls_checkpoint_count(ck)]: 1 = bound; owned, NULL if synthetic */
    long n_experts;            /* config's num_experts (fused expert tensors must match it) */
    uint64_t seed;             /* synthetic: the generator's seed */
    uint64_t stream;           /* synthetic: vectors generated so far */
    ls_model *m;               /* the model being bound (FP8 scales are kept there) */
    ls_fp8_skip skip;          /* quantization_config.modules_to_not_convert */
    long fp8_cap;              /* capacity of m->fp8_scales */
} binder;

/* ---- synthetic weights: lockstep synth's, by (seed, name, element) ---------------
 * A synthetic model keeps the tensor list `lockstep synth` writes for its
 * config (ls_synth_list_tensors, per-expert names: a fused stack holds the
 * same values under them) and, per matrix, a generator naming its tensor;
 * the small parameters are filled from the same list. So every byte equals
 * the checkpoint synth writes for the same config and seed, and a row range
 * (a tensor-parallel rank's) is generated alone. */
typedef struct ls_model_synth {
    ls_synth_tensor *tensors;  /* [n] sorted by name (owned) */
    size_t n;
    struct synth_gen *gens;    /* [n]: at most one generator per tensor (owned) */
    size_t n_gens;
    uint64_t seed;
} ls_model_synth;

typedef struct synth_gen {
    ls_wgen g;                 /* first member: fill casts back */
    const ls_synth_tensor *t;  /* into ls_model_synth.tensors */
    uint64_t seed;
} synth_gen;

static int cmp_tensor_name(const void *key, const void *elem)
{
    return strcmp(key, ((const ls_synth_tensor *)elem)->name);
}

/* The synth name of the model's tensor `name`: Qwen3.5 keeps the language
 * model under model.language_model (the checkpoint reader strips it). */
static const ls_synth_tensor *synth_find(const binder *b, const char *name, ls_error *err)
{
    char full[300];
    const char *pre = "model.";
    if (b->m->cfg.arch == LS_MODEL_QWEN3_5_MOE && strncmp(name, pre, strlen(pre)) == 0)
        snprintf(full, sizeof full, "model.language_model.%s", name + strlen(pre));
    else
        snprintf(full, sizeof full, "%s", name);
    const ls_model_synth *s = b->m->synth;
    const ls_synth_tensor *t = bsearch(full, s->tensors, s->n, sizeof *s->tensors, cmp_tensor_name);
    if (!t) ls_fail(err, LS_E_INTERNAL, "model: synthetic tensor '%s' is not in synth's list", full);
    return t;
}

/* Rows r0 .. r0 + n - 1 of the matrix. An FP8 range that lies inside one
 * scale block without starting it (tensor parallelism allows that,
 * ls_engine_check_tp) is cut from the whole blocks around it, whose scales
 * are the slice's; every other range is generated as it is. */
static ls_status synth_gen_fill(const ls_wgen *g, long r0, long n, long cols, void *dst,
                                float *scale, ls_error *err)
{
    const synth_gen *sg = (const synth_gen *)g;
    const ls_synth_tensor *t = sg->t;
    const long C = (long)(t->ndim == 2 ? t->shape[1] : t->shape[2]), R = (long)t->shape[0];
    if (cols != C)
        return ls_fail(err, LS_E_INTERNAL, "model: '%s' has %ld columns, asked for %ld", t->name,
                       C, cols);
    if (!t->fp8 || (r0 % LS_FP8_BLOCK == 0 && (n % LS_FP8_BLOCK == 0 || r0 + n == R)))
        return ls_synth_fill_rows(t, sg->seed, r0, n, dst, scale, err);
    long a0 = r0 / LS_FP8_BLOCK * LS_FP8_BLOCK;
    long a1 = (r0 + n + LS_FP8_BLOCK - 1) / LS_FP8_BLOCK * LS_FP8_BLOCK;
    if (a1 > R) a1 = R;
    uint8_t *q = malloc((size_t)(a1 - a0) * (size_t)C);
    float *sc = malloc(sizeof(float) * (size_t)(LS_FP8_BLOCKS(a1 - a0) * LS_FP8_BLOCKS(C)));
    ls_status st = q && sc ? ls_synth_fill_rows(t, sg->seed, a0, a1 - a0, q, sc, err)
                           : ls_fail(err, LS_E_NOMEM, "model: rows %ld..%ld of '%s'", a0, a1, t->name);
    if (st == LS_OK) {
        memcpy(dst, q + (size_t)(r0 - a0) * (size_t)C, (size_t)n * (size_t)C);
        if (scale)
            memcpy(scale, sc, sizeof(float) * (size_t)(LS_FP8_BLOCKS(n) * LS_FP8_BLOCKS(C)));
    }
    free(q);
    free(sc);
    return st;
}

/* The generator of synthetic matrix `name` [rows, cols] of type wtype. */
static ls_status synth_mat(binder *b, const char *name, long rows, long cols, ls_wtype wtype,
                           ls_wmat *m, ls_error *err)
{
    const ls_synth_tensor *t = synth_find(b, name, err);
    if (!t) return err ? err->status : LS_E_INTERNAL;
    long tc = (long)(t->ndim == 2 ? t->shape[1] : t->shape[2]);
    int f8 = ls_wtype_is_f8(wtype);
    if ((long)t->shape[0] != rows || tc != cols || (t->fp8 == LS_SYNTH_F8_WEIGHT) != f8)
        return ls_fail(err, LS_E_INTERNAL, "model: synthetic '%s' is [%ld, %ld]%s, synth lists "
                       "[%lld, %ld]%s", t->name, rows, cols, f8 ? " FP8" : "",
                       (long long)t->shape[0], tc, t->fp8 ? " FP8" : "");
    ls_model_synth *s = b->m->synth;
    synth_gen *g = &s->gens[s->n_gens++]; /* n_gens <= n: one per listed tensor at most */
    g->g.fill = synth_gen_fill;
    g->g.normal = ls_synth_normal_params(t, s->seed, &g->g.key, &g->g.c, &g->g.base);
    g->g.rows = rows;
    g->t = t;
    g->seed = s->seed;
    m->gen = &g->g;
    m->gen_row0 = 0;
    return LS_OK;
}

/* The config synth writes for cfg (the fields its tensor list reads). */
static void synth_config_of(const ls_model_config *c, ls_synth_config *sc)
{
    memset(sc, 0, sizeof *sc);
    sc->arch = c->arch == LS_MODEL_QWEN3_5_MOE ? LS_SYNTH_QWEN3_5_MOE : LS_SYNTH_QWEN3_NEXT;
    sc->fused_experts = 0; /* per-expert names: a fused stack's values are generated under them */
    sc->fp8 = c->fp8;
    sc->vocab_size = c->vocab;
    sc->hidden_size = c->hidden;
    sc->num_hidden_layers = c->n_layers;
    sc->num_attention_heads = c->n_heads;
    sc->num_key_value_heads = c->n_kv_heads;
    sc->head_dim = c->head_dim;
    sc->linear_num_key_heads = c->lin_k_heads;
    sc->linear_num_value_heads = c->lin_v_heads;
    sc->linear_key_head_dim = c->lin_k_dim;
    sc->linear_value_head_dim = c->lin_v_dim;
    sc->linear_conv_kernel_dim = c->conv_kernel;
    sc->num_experts = c->n_experts;
    sc->num_experts_per_tok = c->topk;
    sc->moe_intermediate_size = c->moe_inter;
    sc->shared_expert_intermediate_size = c->shared_inter;
    for (long l = 0; l < c->n_layers && l < LS_SYNTH_MAX_LAYERS; l++)
        sc->layer_full[l] = (uint8_t)(c->is_attention[l] != 0);
}

/* Records that the model reads t (every exposed tensor must be read, see
 * check_all_used). */
static void mark_used(binder *b, const ls_tensor *t)
{
    size_t i = ls_checkpoint_index(b->ck, t);
    if (i != (size_t)-1) b->used[i] = 1;
}

/* splitmix64 finaliser. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A synthetic small parameter: the bf16 values synth writes for it,
 * widened as ls_model_open widens a checkpoint's. */
static ls_status synth_vec(binder *b, const char *name, long n, float **out, ls_error *err)
{
    const ls_synth_tensor *t = synth_find(b, name, err);
    if (!t) return err ? err->status : LS_E_INTERNAL;
    if (t->ndim != 1 || t->shape[0] != n || t->fp8)
        return ls_fail(err, LS_E_INTERNAL, "model: synthetic '%s' is not a vector of %ld", t->name, n);
    float *v = malloc(sizeof(float) * (size_t)n);
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n);
    if (!v || !h) {
        free(v);
        free(h);
        return ls_fail(err, LS_E_NOMEM, "model: out of memory");
    }
    ls_synth_fill(t, b->seed, h);
    for (long i = 0; i < n; i++) v[i] = ls_bf16_to_f32(h[i]);
    free(h);
    *out = v;
    return LS_OK;
}

static ls_status find(binder *b, const char *name, int ndim, const int64_t *shape, int allow_f8,
                      const ls_tensor **out, ls_error *err)
{
    /* *out is defined on every path: NULL on failure (and -O3 can then see
     * that callers never read an unset pointer). */
    *out = NULL;
    const ls_tensor *t = ls_checkpoint_find(b->ck, name);
    if (!t) return ls_fail(err, LS_E_INPUT, "checkpoint: tensor '%s' is missing", name);
    if (t->dtype == LS_DTYPE_F8_E4M3 && allow_f8 && !b->m->cfg.fp8)
        return ls_fail(err, LS_E_INPUT, "checkpoint: tensor '%s' has dtype F8_E4M3 but config.json "
                       "has no quantization_config (an FP8 checkpoint declares quant_method fp8 "
                       "and its block size)", name);
    if (t->dtype == LS_DTYPE_F8_E4M3 && !allow_f8 && b->m->cfg.fp8)
        return ls_fail(err, LS_E_UNSUPPORTED, "checkpoint: tensor '%s' has dtype F8_E4M3, which "
                       "lockstep takes for the projections an FP8 release quantises (attention, "
                       "GDN in/out projections, experts, lm_head), not for this tensor "
                       "(supported: BF16, F32)", name);
    if (t->dtype != LS_DTYPE_BF16 && t->dtype != LS_DTYPE_F32 &&
        !(t->dtype == LS_DTYPE_F8_E4M3 && allow_f8))
        return ls_fail(err, LS_E_UNSUPPORTED, "checkpoint: tensor '%s' has dtype %s (supported: "
                       "BF16, F32%s)", name, ls_dtype_name(t->dtype),
                       allow_f8 ? "; F8_E4M3 in an FP8 checkpoint" : "");
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[128] = "", got[128] = "";
        for (int i = 0; i < ndim; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "",
                     (long long)shape[i]);
        for (int i = 0; i < t->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                     (long long)t->shape[i]);
        return ls_fail(err, LS_E_INPUT, "checkpoint: tensor '%s' has shape [%s], expected [%s]",
                       name, got, want);
    }
    mark_used(b, t);
    *out = t;
    return LS_OK;
}

/* A new array of n block scales, owned by the model (m->fp8_scales). */
static ls_status new_scales(binder *b, long n, float **out, ls_error *err)
{
    *out = NULL;
    if (b->m->n_fp8 == b->fp8_cap) {
        long cap = b->fp8_cap ? 2 * b->fp8_cap : 64;
        float **p = realloc(b->m->fp8_scales, sizeof(float *) * (size_t)cap);
        if (!p) return ls_fail(err, LS_E_NOMEM, "model: out of memory");
        b->m->fp8_scales = p;
        b->fp8_cap = cap;
    }
    float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!v) return ls_fail(err, LS_E_NOMEM, "model: out of memory");
    b->m->fp8_scales[b->m->n_fp8++] = v;
    *out = v;
    return LS_OK;
}

/* An F8_E4M3 matrix `name` [rows, cols] of an FP8 checkpoint: its module
 * must not be listed as not converted, and `<module>.weight_scale_inv` must
 * be F32 [ceil(rows/128), ceil(cols/128)] with finite values (copied into
 * the model, so scales need no alignment in the file). Fills m's wtype and
 * scale (docs/model.md §6b). */
static ls_status bind_f8(binder *b, const char *name, long rows, long cols, ls_wmat *m,
                         ls_error *err)
{
    char module[256], sname[288];
    size_t n = strlen(name);
    if (n < 7 || strcmp(name + n - 7, ".weight") != 0 || n - 7 >= sizeof module)
        return ls_fail(err, LS_E_INPUT, "checkpoint: tensor '%s' is F8_E4M3 but not a module's "
                       "'.weight'", name);
    memcpy(module, name, n - 7);
    module[n - 7] = '\0';
    const char *entry = ls_fp8_skip_find(&b->skip, module);
    if (entry)
        return ls_fail(err, LS_E_INPUT, "checkpoint: tensor '%s' is F8_E4M3, but config.json field "
                       "'quantization_config.modules_to_not_convert' lists its module ('%s'): a "
                       "module not converted keeps its BF16 weights", name, entry);
    snprintf(sname, sizeof sname, "%s.weight_scale_inv", module);
    const ls_tensor *st = ls_checkpoint_find(b->ck, sname);
    long sr = LS_FP8_BLOCKS(rows), sc = LS_FP8_BLOCKS(cols);
    if (!st)
        return ls_fail(err, LS_E_INPUT, "checkpoint: tensor '%s' is F8_E4M3 but its block scale "
                       "'%s' (F32 [%ld, %ld]) is missing", name, sname, sr, sc);
    if (st->dtype != LS_DTYPE_F32)
        return ls_fail(err, LS_E_UNSUPPORTED, "checkpoint: tensor '%s' has dtype %s (supported: "
                       "F32 block scales)", sname, ls_dtype_name(st->dtype));
    if (st->ndim != 2 || st->shape[0] != sr || st->shape[1] != sc) {
        char got[128] = "";
        for (int i = 0; i < st->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                     (long long)st->shape[i]);
        return ls_fail(err, LS_E_INPUT, "checkpoint: tensor '%s' has shape [%s], expected [%ld, "
                       "%ld] (blocks of 128 x 128 over '%s' [%ld, %ld])", sname, got, sr, sc,
                       name, rows, cols);
    }
    float *v;
    LS_TRY(new_scales(b, sr * sc, &v, err));
    memcpy(v, st->data, sizeof(float) * (size_t)(sr * sc));
    for (long i = 0; i < sr * sc; i++)
        if (!isfinite(v[i]))
            return ls_fail(err, LS_E_INPUT, "checkpoint: tensor '%s' element %ld is not finite",
                           sname, i);
    mark_used(b, st);
    m->wtype = LS_WTYPE_F8_DEQUANT;
    m->scale = v;
    return LS_OK;
}

/* A synthetic model's matrix: bf16, no data; synth_mat then gives it its
 * generator (a backend with wrap_generated runs it; CUDA's bench generator
 * fills it at wrap_weights instead). */
static ls_wmat no_data(long rows, long cols)
{
    ls_wmat m = {NULL, LS_WTYPE_BF16, rows, cols, NULL, NULL, 0};
    return m;
}

/* The block scales of a synthetic FP8 matrix: the same block scale for
 * block j of the model's k-th FP8 matrix (in binding order) from the same
 * seed, s = fp32(0.04 / 448) · (1 + u / 4), u uniform in [-1, 1) from
 * mix64(key + (j + 1) golden gamma), key = mix64(seed ^ mix64(2^63 | k)) (a
 * stream of its own: the small parameters are those of the bf16 model of
 * the same seed). The backend's e4m3 bytes span ±448 (ls_cuda_fill_e4m3),
 * so W = q · s spans about ±0.04, ±0.05 at most: the spread of the bf16
 * synthetic weights (ls_backend_cuda_opts.synthetic_weights_scale 0.04),
 * with scales that differ between blocks as a release's do. */
#define SYNTH_F8_SCALE (0.04f / LS_FP8_E4M3_MAX)

static ls_status synth_f8(binder *b, long rows, long cols, ls_wmat *m, ls_error *err)
{
    long n = LS_FP8_BLOCKS(rows) * LS_FP8_BLOCKS(cols);
    uint64_t key = mix64(b->seed ^ mix64(((uint64_t)1 << 63) | (uint64_t)b->m->n_fp8));
    float *v;
    LS_TRY(new_scales(b, n, &v, err));
    for (long j = 0; j < n; j++) {
        uint64_t r = mix64(key + (uint64_t)(j + 1) * 0x9E3779B97F4A7C15ull);
        float u = (float)((int64_t)(r >> 40) - ((int64_t)1 << 23)) * (1.0f / 8388608.0f);
        v[j] = SYNTH_F8_SCALE * (1.0f + 0.25f * u);
    }
    *m = (ls_wmat){NULL, LS_WTYPE_F8_DEQUANT, rows, cols, v, NULL, 0};
    return LS_OK;
}

/* Which matrices an FP8 checkpoint may store as F8_E4M3: those that reach
 * the linear op or the experts (mat's f8 argument). F8_RELEASE: those the
 * FP8 releases do store so (every one not in their modules_to_not_convert:
 * what synth --fp8 quantises), and so a synthetic FP8 model makes FP8;
 * F8_OK: the rest that may be, which the releases keep bf16 (lm_head, the
 * small GDN b/a projections). */
enum { PLAIN = 0, F8_OK = 1, F8_RELEASE = 2 };

/* Matrix `name` [rows, cols]; stored [rows, 1, cols] when mid1 (conv1d).
 * f8 = F8_OK or F8_RELEASE: an FP8 checkpoint may store it as F8_E4M3 with
 * block scales. */
static ls_status mat(binder *b, const char *name, long rows, long cols, int mid1, int f8,
                     ls_wmat *m, ls_error *err)
{
    if (!b->ck) {
        if (b->m->cfg.fp8 && f8 == F8_RELEASE) LS_TRY(synth_f8(b, rows, cols, m, err));
        else *m = no_data(rows, cols);
        return synth_mat(b, name, rows, cols, m->wtype, m, err);
    }
    const ls_tensor *t;
    int64_t sh2[2] = {rows, cols}, sh3[3] = {rows, 1, cols};
    LS_TRY(find(b, name, mid1 ? 3 : 2, mid1 ? sh3 : sh2, f8 != PLAIN, &t, err));
    m->data = t->data;
    m->wtype = t->dtype == LS_DTYPE_BF16 ? LS_WTYPE_BF16 : LS_WTYPE_F32;
    m->rows = rows;
    m->cols = cols;
    m->scale = NULL;
    if (t->dtype == LS_DTYPE_F8_E4M3) LS_TRY(bind_f8(b, name, rows, cols, m, err));
    return LS_OK;
}

static ls_status vec(binder *b, const char *name, long n, float **out, ls_error *err)
{
    if (!b->ck) return synth_vec(b, name, n, out, err);
    const ls_tensor *t;
    int64_t sh[1] = {n};
    LS_TRY(find(b, name, 1, sh, 0, &t, err));
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v) return ls_fail(err, LS_E_NOMEM, "model: out of memory");
    for (long i = 0; i < n; i++) {
        if (t->dtype == LS_DTYPE_BF16) {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * i, 2);
            v[i] = ls_bf16_to_f32(h);
        } else {
            memcpy(&v[i], (const char *)t->data + 4 * i, 4);
        }
        if (!isfinite(v[i])) {
            free(v);
            return ls_fail(err, LS_E_INPUT, "checkpoint: tensor '%s' element %ld is not finite",
                           name, i);
        }
    }
    *out = v;
    return LS_OK;
}

static ls_status expert_view(binder *b, int layer, int e, ls_expert_proj p, long rows, long cols,
                             ls_wmat *m, ls_error *err)
{
    if (!b->ck) {
        /* every expert of an FP8 release is FP8 */
        if (b->m->cfg.fp8) LS_TRY(synth_f8(b, rows, cols, m, err));
        else *m = no_data(rows, cols);
        static const char *const proj[3] = {"gate", "up", "down"};
        char name[160];
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s_proj.weight", layer, e,
                 proj[p == LS_EXPERT_GATE ? 0 : p == LS_EXPERT_UP ? 1 : 2]);
        return synth_mat(b, name, rows, cols, m->wtype, m, err);
    }
    ls_matrix_view v;
    LS_TRY(ls_checkpoint_expert(b->ck, layer, e, p, &v, err));
    if (v.rows != rows || v.cols != cols)
        return ls_fail(err, LS_E_INPUT, "checkpoint: expert %d of layer %d (%s) is [%lld, %lld], "
                       "expected [%ld, %ld]", e, layer, v.source, (long long)v.rows,
                       (long long)v.cols, rows, cols);
    const ls_tensor *t = ls_checkpoint_find(b->ck, v.source);
    if (v.dtype == LS_DTYPE_F8_E4M3 && !b->m->cfg.fp8)
        return ls_fail(err, LS_E_INPUT, "checkpoint: %s has dtype F8_E4M3 but config.json has no "
                       "quantization_config (an FP8 checkpoint declares quant_method fp8 and its "
                       "block size)", v.source);
    if (v.dtype == LS_DTYPE_F8_E4M3 && t && t->ndim == 3)
        return ls_fail(err, LS_E_UNSUPPORTED, "checkpoint: tensor '%s' is a fused F8_E4M3 expert "
                       "tensor; lockstep reads FP8 experts stored one by one, as the FP8 releases "
                       "store them (mlp.experts.E.{gate,up,down}_proj.weight with their "
                       "weight_scale_inv)", v.source);
    if (v.dtype != LS_DTYPE_BF16 && v.dtype != LS_DTYPE_F32 && v.dtype != LS_DTYPE_F8_E4M3)
        return ls_fail(err, LS_E_UNSUPPORTED, "checkpoint: %s has dtype %s (supported: BF16, F32; "
                       "F8_E4M3 in an FP8 checkpoint)", v.source, ls_dtype_name(v.dtype));
    /* A fused tensor [E', ...] serves experts 0..E-1; the rest of it would be
     * bytes nobody reads, so E' must be num_experts exactly. */
    if (t && t->ndim == 3 && t->shape[0] != b->n_experts)
        return ls_fail(err, LS_E_INPUT, "%s: tensor '%s' (byte offset %llu) holds %lld experts, "
                       "config.json field 'num_experts' is %ld", ls_checkpoint_shard_path(b->ck,
                       (size_t)t->shard), t->name, (unsigned long long)t->file_offset_bytes,
                       (long long)t->shape[0], b->n_experts);
    if (t) mark_used(b, t);
    m->data = v.data;
    m->wtype = v.dtype == LS_DTYPE_BF16 ? LS_WTYPE_BF16 : LS_WTYPE_F32;
    m->rows = rows;
    m->cols = cols;
    m->scale = NULL;
    if (v.dtype == LS_DTYPE_F8_E4M3) LS_TRY(bind_f8(b, v.source, rows, cols, m, err));
    return LS_OK;
}

static ls_status bind_layer(binder *b, const ls_model_config *c, int l, ls_model_layer *ly,
                            ls_error *err)
{
    char n[256];
    long D = c->hidden;
#define NAME(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
    ly->attention = c->is_attention[l];
    LS_TRY(vec(b, NAME("input_layernorm.weight"), D, &ly->in_norm, err));
    LS_TRY(vec(b, NAME("post_attention_layernorm.weight"), D, &ly->post_norm, err));
    if (ly->attention) {
        long Hq = c->n_heads, Hkv = c->n_kv_heads, d = c->head_dim;
        LS_TRY(mat(b, NAME("self_attn.q_proj.weight"), Hq * 2 * d, D, 0, F8_RELEASE, &ly->q_proj,
                   err));
        LS_TRY(mat(b, NAME("self_attn.k_proj.weight"), Hkv * d, D, 0, F8_RELEASE, &ly->k_proj,
                   err));
        LS_TRY(mat(b, NAME("self_attn.v_proj.weight"), Hkv * d, D, 0, F8_RELEASE, &ly->v_proj,
                   err));
        LS_TRY(mat(b, NAME("self_attn.o_proj.weight"), D, Hq * d, 0, F8_RELEASE, &ly->o_proj,
                   err));
        LS_TRY(vec(b, NAME("self_attn.q_norm.weight"), d, &ly->q_norm, err));
        LS_TRY(vec(b, NAME("self_attn.k_norm.weight"), d, &ly->k_norm, err));
    } else {
        long Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
        long conv_dim = 2 * Hk * dk + Hv * dv;
        if (c->arch == LS_MODEL_QWEN3_5_MOE) {
            /* four projections in plain head order (docs/model.md §2.2) */
            LS_TRY(mat(b, NAME("linear_attn.in_proj_qkv.weight"), conv_dim, D, 0, F8_RELEASE,
                       &ly->in_qkv, err));
            LS_TRY(mat(b, NAME("linear_attn.in_proj_z.weight"), Hv * dv, D, 0, F8_RELEASE,
                       &ly->in_z, err));
            LS_TRY(mat(b, NAME("linear_attn.in_proj_b.weight"), Hv, D, 0, F8_OK, &ly->in_b, err));
            LS_TRY(mat(b, NAME("linear_attn.in_proj_a.weight"), Hv, D, 0, F8_OK, &ly->in_a, err));
        } else {
            /* fused, interleaved per key head (docs/model.md §2.3) */
            LS_TRY(mat(b, NAME("linear_attn.in_proj_qkvz.weight"), 2 * Hk * dk + 2 * Hv * dv, D, 0,
                       F8_RELEASE, &ly->qkvz, err));
            LS_TRY(mat(b, NAME("linear_attn.in_proj_ba.weight"), 2 * Hv, D, 0, F8_OK, &ly->ba, err));
        }
        LS_TRY(mat(b, NAME("linear_attn.conv1d.weight"), conv_dim, c->conv_kernel, 1, PLAIN, &ly->conv,
                   err));
        if (b->ck && ls_checkpoint_find(b->ck, NAME("linear_attn.conv1d.bias")))
            return ls_fail(err, LS_E_UNSUPPORTED, "checkpoint: tensor '%s' (conv bias) is not "
                           "supported", n);
        LS_TRY(vec(b, NAME("linear_attn.A_log"), Hv, &ly->A_log, err));
        LS_TRY(vec(b, NAME("linear_attn.dt_bias"), Hv, &ly->dt_bias, err));
        LS_TRY(vec(b, NAME("linear_attn.norm.weight"), dv, &ly->gnorm, err));
        LS_TRY(mat(b, NAME("linear_attn.out_proj.weight"), D, Hv * dv, 0, F8_RELEASE,
                   &ly->out_proj, err));
    }
    long E = c->n_experts, I = c->moe_inter, Is = c->shared_inter;
    LS_TRY(mat(b, NAME("mlp.gate.weight"), E, D, 0, PLAIN, &ly->router, err));
    ly->exp_gate = calloc((size_t)E * 3, sizeof(ls_wmat));
    if (!ly->exp_gate) return ls_fail(err, LS_E_NOMEM, "model: out of memory");
    ly->exp_up = ly->exp_gate + E;
    ly->exp_down = ly->exp_gate + 2 * E;
    for (int e = 0; e < E; e++) {
        LS_TRY(expert_view(b, l, e, LS_EXPERT_GATE, I, D, &ly->exp_gate[e], err));
        LS_TRY(expert_view(b, l, e, LS_EXPERT_UP, I, D, &ly->exp_up[e], err));
        LS_TRY(expert_view(b, l, e, LS_EXPERT_DOWN, D, I, &ly->exp_down[e], err));
    }
    LS_TRY(mat(b, NAME("mlp.shared_expert.gate_proj.weight"), Is, D, 0, F8_RELEASE, &ly->sh_gate,
               err));
    LS_TRY(mat(b, NAME("mlp.shared_expert.up_proj.weight"), Is, D, 0, F8_RELEASE, &ly->sh_up,
               err));
    LS_TRY(mat(b, NAME("mlp.shared_expert.down_proj.weight"), D, Is, 0, F8_RELEASE, &ly->sh_down,
               err));
    LS_TRY(mat(b, NAME("mlp.shared_expert_gate.weight"), 1, D, 0, PLAIN, &ly->sh_gate_w, err));
#undef NAME
    return LS_OK;
}

/* The number at *s followed by '.', advancing *s past the dot; -1 when *s
 * does not start with one (or it is out of range). */
static long dotted_number(const char **s)
{
    const char *p = *s;
    long v = 0;
    if (*p < '0' || *p > '9') return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (*p - '0');
        if (v > (1L << 30)) return -1;
    }
    if (*p != '.') return -1;
    *s = p + 1;
    return v;
}

/* Why the model does not read tensor `name`, as far as its name tells
 * (written to why): LS_E_INPUT when the checkpoint and config.json disagree
 * (a layer or expert beyond the config), LS_E_UNSUPPORTED otherwise. */
static ls_status unused_reason(const ls_model_config *c, const char *name, char *why, size_t cap)
{
    static const char layers[] = "model.layers.", experts[] = "mlp.experts.";
    if (ends_with(name, ".weight_scale_inv")) {
        snprintf(why, cap, "it is an FP8 block scale, but the weight beside it is not F8_E4M3 "
                 "(a BF16 or F32 weight is used as stored, without a scale)");
        return LS_E_INPUT;
    }
    const char *rest = name + sizeof layers - 1;
    long layer = strncmp(name, layers, sizeof layers - 1) == 0 ? dotted_number(&rest) : -1;
    if (layer >= c->n_layers) {
        snprintf(why, cap, "layer %ld is beyond config.json field 'num_hidden_layers' (%ld)",
                 layer, c->n_layers);
        return LS_E_INPUT;
    }
    if (layer >= 0) {
        const char *e = rest + sizeof experts - 1;
        long expert = strncmp(rest, experts, sizeof experts - 1) == 0 ? dotted_number(&e) : -1;
        if (expert >= c->n_experts) {
            snprintf(why, cap, "expert %ld is beyond config.json field 'num_experts' (%ld)",
                     expert, c->n_experts);
            return LS_E_INPUT;
        }
        int attn = c->is_attention[layer];
        const char *other = attn ? "linear_attn." : "self_attn.";
        if (strncmp(rest, other, strlen(other)) == 0) {
            snprintf(why, cap, "layer %ld is %s in config.json", layer,
                     attn ? "full_attention" : "linear_attention");
            return LS_E_INPUT;
        }
    }
    snprintf(why, cap, "no part of the %s graph reads it (a bias, or a tensor of another "
             "architecture)", ls_model_arch_name(c->arch));
    return LS_E_UNSUPPORTED;
}

/* Every exposed tensor must have been bound: a weight the model does not
 * read (a bias it has no term for, a layer beyond num_hidden_layers, an
 * expert beyond num_experts) would otherwise be dropped in silence, and the
 * fingerprint would vouch for bytes no output depends on. Families skipped
 * on purpose (vision tower, MTP head) never reach here: the checkpoint
 * reader sets them aside (ls_checkpoint_ignored_at). */
static ls_status check_all_used(const binder *b, const ls_model_config *c, ls_error *err)
{
    size_t n = ls_checkpoint_count(b->ck), unused = 0, first = 0;
    for (size_t i = n; i-- > 0;)
        if (!b->used[i]) unused++, first = i;
    if (!unused) return LS_OK;
    const ls_tensor *t = ls_checkpoint_at(b->ck, first);
    char why[256];
    ls_status st = unused_reason(c, t->name, why, sizeof why);
    return ls_fail(err, st,
                   "%s: tensor '%.300s' (byte offset %llu) is not read by the model: %s; "
                   "refused rather than ignored (%zu unread tensor%s in all)",
                   ls_checkpoint_shard_path(b->ck, (size_t)t->shard), t->name,
                   (unsigned long long)t->file_offset_bytes, why, unused, unused == 1 ? "" : "s");
}

/* Binds every tensor of m (whose cfg is set); closes m on failure. */
static ls_status bind_model(ls_model *m, binder *b, ls_model **out, ls_error *err)
{
    const ls_model_config *c = &m->cfg;
    ls_status st = LS_OK;
    b->n_experts = c->n_experts;
    if (b->ck) {
        b->used = calloc(ls_checkpoint_count(b->ck) + 1, 1);
        if (!b->used) st = ls_fail(err, LS_E_NOMEM, "model: out of memory");
    }
    m->layers = st == LS_OK ? calloc((size_t)c->n_layers, sizeof *m->layers) : NULL;
    if (st == LS_OK && !m->layers) st = ls_fail(err, LS_E_NOMEM, "model: out of memory");
    if (st == LS_OK) st = mat(b, "model.embed_tokens.weight", c->vocab, c->hidden, 0, PLAIN, &m->embed, err);
    if (st == LS_OK) st = mat(b, "lm_head.weight", c->vocab, c->hidden, 0, F8_OK, &m->lm_head, err);
    if (st == LS_OK) st = vec(b, "model.norm.weight", c->hidden, &m->final_norm, err);
    for (int l = 0; st == LS_OK && l < c->n_layers; l++)
        st = bind_layer(b, c, l, &m->layers[l], err);
    if (st == LS_OK && b->ck) st = check_all_used(b, c, err);
    free(b->used);
    b->used = NULL;
    if (st != LS_OK) {
        ls_model_close(m);
        return st;
    }
    *out = m;
    return LS_OK;
}

ls_status ls_model_open(const ls_checkpoint *ck, ls_model **out, ls_error *err)
{
    if (ls_checkpoint_generated(ck))
        return ls_fail(err, LS_E_USAGE, "%s: a generated checkpoint has no weights to bind: its model is "
                       "ls_model_synthetic of its config and seed", ls_checkpoint_dir(ck));
    ls_model *m = calloc(1, sizeof *m);
    if (!m) return ls_fail(err, LS_E_NOMEM, "model: out of memory");
    m->ck = ck;
    ls_status st = ls_model_parse_config(ls_checkpoint_config_json(ck), &m->cfg, err);
    if (st != LS_OK) {
        ls_model_close(m);
        return st;
    }
    binder b = {ck, NULL, 0, 0, 0, m, {NULL, NULL, 0}, 0};
    if (m->cfg.fp8) {
        st = ls_fp8_skip_load(ls_checkpoint_config_json(ck), &b.skip, err);
        if (st != LS_OK) {
            ls_model_close(m);
            return st;
        }
    }
    st = bind_model(m, &b, out, err);
    ls_fp8_skip_free(&b.skip);
    return st;
}

ls_status ls_model_synthetic(const ls_model_config *cfg, uint64_t seed, ls_model **out,
                             ls_error *err)
{
    *out = NULL;
    LS_TRY(check_config(cfg, err));
    ls_model *m = calloc(1, sizeof *m);
    if (!m) return ls_fail(err, LS_E_NOMEM, "model: out of memory");
    m->cfg = *cfg;
    ls_synth_config sc;
    synth_config_of(cfg, &sc);
    ls_status st = LS_OK;
    m->synth = calloc(1, sizeof *m->synth);
    if (!m->synth) st = ls_fail(err, LS_E_NOMEM, "model: out of memory");
    if (st == LS_OK) st = ls_synth_list_tensors(&sc, &m->synth->tensors, &m->synth->n, err);
    if (st == LS_OK) {
        m->synth->seed = seed;
        m->synth->gens = calloc(m->synth->n + 1, sizeof *m->synth->gens);
        if (!m->synth->gens) st = ls_fail(err, LS_E_NOMEM, "model: out of memory");
    }
    if (st != LS_OK) {
        ls_model_close(m);
        return st;
    }
    binder b = {NULL, NULL, 0, seed, 0, m, {NULL, NULL, 0}, 0};
    return bind_model(m, &b, out, err);
}

void ls_model_close(ls_model *m)
{
    if (!m) return;
    if (m->layers)
        for (long l = 0; l < m->cfg.n_layers; l++) {
            ls_model_layer *ly = &m->layers[l];
            free(ly->in_norm), free(ly->post_norm), free(ly->A_log), free(ly->dt_bias);
            free(ly->gnorm), free(ly->q_norm), free(ly->k_norm), free(ly->exp_gate);
        }
    free(m->layers);
    free(m->final_norm);
    for (long i = 0; i < m->n_fp8; i++) free(m->fp8_scales[i]);
    free(m->fp8_scales);
    if (m->synth) {
        free(m->synth->tensors);
        free(m->synth->gens);
        free(m->synth);
    }
    free(m);
}
