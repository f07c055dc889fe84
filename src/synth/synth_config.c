/* lockstep — synth: presets, reading a Qwen3-Next or Qwen3.5 MoE config.json,
 * writing one. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "synth/synth.h"

/* ---- presets ------------------------------------------------------------------ */

static void set_interval(ls_synth_config *c, int64_t interval)
{
    c->full_attention_interval = interval;
    memset(c->layer_full, 0, sizeof c->layer_full);
    for (int64_t i = 0; i < c->num_hidden_layers; i++)
        c->layer_full[i] = (uint8_t)((i + 1) % interval == 0);
}

const char *ls_synth_preset_names(void)
{
    return "tiny, small, qwen3-next-80b-a3b, qwen3.5-tiny, qwen3.5-small, qwen3.5-35b-a3b, "
           "qwen3.5-122b-a10b, qwen3.5-397b-a17b";
}

void ls_synth_default_mrope_section(int64_t n, int64_t out[3])
{
    int64_t t = (n + 2) / 3, h = t < n - t ? t : n - t;
    out[0] = t;
    out[1] = h;
    out[2] = n - t - h;
}

/* The Qwen3.5 MoE release shapes (docs/model.md §1.2): what differs between
 * 35B-A3B, 122B-A10B and 397B-A17B. */
typedef struct q35_shape {
    const char *name;
    int64_t D, L, H, Hv, E, k, I;
} q35_shape;

static const q35_shape q35_shapes[] = {
    {"qwen3.5-35b-a3b", 2048, 40, 16, 32, 256, 8, 512},
    {"qwen3.5-122b-a10b", 3072, 48, 32, 64, 256, 8, 1024},
    {"qwen3.5-397b-a17b", 4096, 60, 32, 64, 512, 10, 1024},
};

/* Qwen3.5's fields beyond the shared ones: the release layout, sections
 * from the rotary dims, no vision placeholder ids (tiny vocabularies). */
static void make_q35(ls_synth_config *c)
{
    c->arch = LS_SYNTH_QWEN3_5_MOE;
    c->fused_experts = 1;
    c->norm_topk_prob = 1;
    ls_synth_default_mrope_section(
        (int64_t)(c->partial_rotary_factor * (double)c->head_dim) / 2, c->mrope_section);
}

ls_status ls_synth_preset(const char *name, ls_synth_config *c, ls_error *err)
{
    memset(c, 0, sizeof *c);
    c->rope_theta = 10000000.0;
    c->partial_rotary_factor = 0.25;
    c->rms_norm_eps = 1e-6;
    c->norm_topk_prob = 1;
    c->linear_conv_kernel_dim = 4;
    c->image_token_id = -1;
    c->video_token_id = -1;
    int q35 = strncmp(name, "qwen3.5-", 8) == 0;
    if (q35 && (strcmp(name + 8, "tiny") == 0 || strcmp(name + 8, "small") == 0)) {
        /* The Qwen3-Next tiny and small shapes in the Qwen3.5 layout. */
        LS_TRY(ls_synth_preset(name + 8, c, err));
        make_q35(c);
        return LS_OK;
    }
    for (size_t i = 0; q35 && i < sizeof q35_shapes / sizeof q35_shapes[0]; i++) {
        const q35_shape *q = &q35_shapes[i];
        if (strcmp(name, q->name) != 0) continue;
        c->vocab_size = 248320;
        c->hidden_size = q->D;
        c->num_hidden_layers = q->L;
        c->num_attention_heads = q->H;
        c->num_key_value_heads = 2;
        c->head_dim = 256;
        c->max_position_embeddings = 262144;
        c->linear_num_key_heads = 16;
        c->linear_num_value_heads = q->Hv;
        c->linear_key_head_dim = 128;
        c->linear_value_head_dim = 128;
        c->num_experts = q->E;
        c->num_experts_per_tok = q->k;
        c->moe_intermediate_size = q->I;
        c->shared_expert_intermediate_size = q->I;
        c->bos_token_id = -1;
        c->eos_token_id = -1;
        c->image_token_id = 248056; /* transformers' Qwen3_5MoeConfig defaults */
        c->video_token_id = 248057;
        set_interval(c, 4);
        make_q35(c);
        return LS_OK;
    }
    if (strcmp(name, "tiny") == 0) {
        /* Runs in seconds on two cores in the C reference engine. Layers 1 and
         * 3 are full attention, 0 and 2 Gated DeltaNet. V = 1000 is not a
         * multiple of 64 on purpose (tail handling in vocab-parallel code). */
        c->vocab_size = 1000;
        c->hidden_size = 128;
        c->num_hidden_layers = 4;
        c->num_attention_heads = 4;
        c->num_key_value_heads = 2;
        c->head_dim = 32;
        c->max_position_embeddings = 4096;
        c->intermediate_size = 256;
        c->linear_num_key_heads = 2;
        c->linear_num_value_heads = 4;
        c->linear_key_head_dim = 32;
        c->linear_value_head_dim = 32;
        c->num_experts = 8;
        c->num_experts_per_tok = 2;
        c->moe_intermediate_size = 64;
        c->shared_expert_intermediate_size = 64;
        c->bos_token_id = 998;
        c->eos_token_id = 999;
        set_interval(c, 2);
    } else if (strcmp(name, "small") == 0) {
        /* GPU-test sized: every kernel sees realistic tile counts. */
        c->vocab_size = 8250;
        c->hidden_size = 512;
        c->num_hidden_layers = 8;
        c->num_attention_heads = 8;
        c->num_key_value_heads = 2;
        c->head_dim = 64;
        c->max_position_embeddings = 32768;
        c->intermediate_size = 1024;
        c->linear_num_key_heads = 4;
        c->linear_num_value_heads = 8;
        c->linear_key_head_dim = 64;
        c->linear_value_head_dim = 64;
        c->num_experts = 32;
        c->num_experts_per_tok = 4;
        c->moe_intermediate_size = 256;
        c->shared_expert_intermediate_size = 256;
        c->bos_token_id = 8248;
        c->eos_token_id = 8249;
        set_interval(c, 4);
    } else if (strcmp(name, "qwen3-next-80b-a3b") == 0) {
        /* The released Qwen3-Next-80B-A3B config (docs/model.md §1.1). */
        c->vocab_size = 151936;
        c->hidden_size = 2048;
        c->num_hidden_layers = 48;
        c->num_attention_heads = 16;
        c->num_key_value_heads = 2;
        c->head_dim = 256;
        c->max_position_embeddings = 262144;
        c->intermediate_size = 5120;
        c->linear_num_key_heads = 16;
        c->linear_num_value_heads = 32;
        c->linear_key_head_dim = 128;
        c->linear_value_head_dim = 128;
        c->num_experts = 512;
        c->num_experts_per_tok = 10;
        c->moe_intermediate_size = 512;
        c->shared_expert_intermediate_size = 512;
        c->bos_token_id = 151643;
        c->eos_token_id = 151645;
        set_interval(c, 4);
    } else {
        return ls_fail(err, LS_E_USAGE, "unknown preset '%s' (presets: %s)", name,
                       ls_synth_preset_names());
    }
    return LS_OK;
}

/* ---- reading config.json ---------------------------------------------------------- */

#define DIM_MAX ((int64_t)1 << 20)

static ls_status get_int(const char *label, json_t *root, const char *key, int required,
                         int64_t def, int64_t lo, int64_t hi, int64_t *out, ls_error *err)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required)
            return ls_fail(err, LS_E_INPUT, "%s: field '%s' is missing", label, key);
        *out = def;
        return LS_OK;
    }
    if (!json_is_integer(v))
        return ls_fail(err, LS_E_INPUT, "%s: field '%s' must be an integer", label, key);
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi)
        return ls_fail(err, LS_E_INPUT, "%s: field '%s' is %lld, outside [%lld, %lld]", label, key,
                       (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return LS_OK;
}

static ls_status get_real(const char *label, json_t *obj, const char *key, double lo, double hi,
                          double *out, int *found, ls_error *err)
{
    json_t *v = json_object_get(obj, key);
    *found = 0;
    if (!v || json_is_null(v)) return LS_OK;
    if (!json_is_number(v))
        return ls_fail(err, LS_E_INPUT, "%s: field '%s' must be a number", label, key);
    double x = json_number_value(v);
    if (!(x > lo && x <= hi))
        return ls_fail(err, LS_E_INPUT, "%s: field '%s' is %g, outside (%g, %g]", label, key, x,
                       lo, hi);
    *out = x;
    *found = 1;
    return LS_OK;
}

/* A field that must be absent, null, or equal to an allowed value. */
static ls_status want_bool(const char *label, json_t *root, const char *key, int allowed,
                           ls_error *err)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return LS_OK;
    if (!json_is_boolean(v))
        return ls_fail(err, LS_E_INPUT, "%s: field '%s' must be true or false", label, key);
    if (json_is_true(v) != allowed)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: field '%s' = %s is not supported by synth",
                       label, key, allowed ? "false" : "true");
    return LS_OK;
}

static ls_status check_rope_type(const char *label, json_t *obj, const char *field, ls_error *err)
{
    if (!obj || json_is_null(obj)) return LS_OK;
    if (!json_is_object(obj))
        return ls_fail(err, LS_E_INPUT, "%s: field '%s' must be an object or null", label, field);
    json_t *t = json_object_get(obj, "rope_type");
    if (!t) t = json_object_get(obj, "type");
    if (!t || json_is_null(t)) return LS_OK;
    if (!json_is_string(t))
        return ls_fail(err, LS_E_INPUT, "%s: field '%s.rope_type' must be a string", label, field);
    if (strcmp(json_string_value(t), "default") != 0)
        return ls_fail(err, LS_E_UNSUPPORTED,
                       "%s: field '%s.rope_type' = '%s' is not supported (only default RoPE)",
                       label, field, json_string_value(t));
    return LS_OK;
}

static int interval_matches(const ls_synth_config *c, int64_t n)
{
    for (int64_t i = 0; i < c->num_hidden_layers; i++)
        if (c->layer_full[i] != ((i + 1) % n == 0)) return 0;
    return 1;
}

/* Records an interval that yields the layer pattern (HF ignores
 * full_attention_interval when layer_types is given, so the file's value may
 * disagree): the stated one when it matches, else the smallest match in
 * 1..L+1, else 0. Re-reading synth's output then gives the same config. */
static void derive_interval(ls_synth_config *c, int64_t stated)
{
    c->full_attention_interval = 0;
    if (interval_matches(c, stated)) {
        c->full_attention_interval = stated;
        return;
    }
    for (int64_t n = 1; n <= c->num_hidden_layers + 1; n++) {
        if (interval_matches(c, n)) {
            c->full_attention_interval = n;
            return;
        }
    }
}

/* Qwen3.5's multimodal RoPE sections (top level of the text fields or in
 * rope_parameters), defaulting to ls_synth_default_mrope_section; they must
 * partition the rotary frequencies (what lockstep's model accepts). */
static ls_status parse_mrope(const char *label, json_t *obj, ls_synth_config *c, ls_error *err)
{
    int64_t n = (int64_t)(c->partial_rotary_factor * (double)c->head_dim) / 2;
    ls_synth_default_mrope_section(n, c->mrope_section);
    json_t *rp = json_object_get(obj, "rope_parameters");
    json_t *v = json_object_get(obj, "mrope_section");
    if ((!v || json_is_null(v)) && json_is_object(rp)) v = json_object_get(rp, "mrope_section");
    if (!v || json_is_null(v)) return LS_OK;
    if (!json_is_array(v) || json_array_size(v) != 3)
        return ls_fail(err, LS_E_INPUT, "%s: field 'mrope_section' must be a list of 3 integers",
                       label);
    int64_t sum = 0;
    for (size_t i = 0; i < 3; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 4096)
            return ls_fail(err, LS_E_INPUT, "%s: field 'mrope_section[%zu]' must be an integer in "
                           "0..4096", label, i);
        c->mrope_section[i] = (int64_t)json_integer_value(x);
        sum += c->mrope_section[i];
    }
    if (sum != n)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: field 'mrope_section' sums to %lld, not the %lld "
                       "rotary frequencies", label, (long long)sum, (long long)n);
    return LS_OK;
}

static ls_status parse_fields(const char *label, json_t *root, ls_synth_config *c, ls_error *err);

static ls_status parse_root(const char *label, json_t *top, ls_synth_config *c, ls_error *err)
{
    memset(c, 0, sizeof *c);
    if (!json_is_object(top))
        return ls_fail(err, LS_E_INPUT, "%s: top level must be a JSON object", label);

    json_t *mt = json_object_get(top, "model_type");
    if (!mt) return ls_fail(err, LS_E_INPUT, "%s: field 'model_type' is missing", label);
    if (!json_is_string(mt))
        return ls_fail(err, LS_E_INPUT, "%s: field 'model_type' must be a string", label);
    const char *type = json_string_value(mt);
    json_t *root = top;
    if (strcmp(type, "qwen3_5_moe") == 0) {
        root = json_object_get(top, "text_config");
        if (!json_is_object(root))
            return ls_fail(err, LS_E_INPUT, "%s: field 'text_config' is %s (model_type "
                           "qwen3_5_moe keeps the language model there)", label,
                           root ? "not an object" : "missing");
        json_t *tt = json_object_get(root, "model_type");
        if (tt && !(json_is_string(tt) && strcmp(json_string_value(tt), "qwen3_5_moe_text") == 0))
            return ls_fail(err, LS_E_UNSUPPORTED, "%s: field 'text_config.model_type' must be "
                           "\"qwen3_5_moe_text\"", label);
        LS_TRY(want_bool(label, top, "tie_word_embeddings", 0, err));
    } else if (strcmp(type, "qwen3_next") != 0 && strcmp(type, "qwen3_5_moe_text") != 0) {
        return ls_fail(err, LS_E_UNSUPPORTED,
                       "%s: field 'model_type' = '%s' is not supported (synth writes qwen3_next, "
                       "qwen3_5_moe, qwen3_5_moe_text)", label, type);
    }
    c->arch = strcmp(type, "qwen3_next") == 0 ? LS_SYNTH_QWEN3_NEXT : LS_SYNTH_QWEN3_5_MOE;
    LS_TRY(parse_fields(label, root, c, err));
    c->image_token_id = c->video_token_id = -1;
    if (c->arch == LS_SYNTH_QWEN3_5_MOE) {
        c->fused_experts = 1; /* the release layout */
        LS_TRY(get_int(label, top, "image_token_id", 0, -1, 0, c->vocab_size - 1,
                       &c->image_token_id, err));
        LS_TRY(get_int(label, top, "video_token_id", 0, -1, 0, c->vocab_size - 1,
                       &c->video_token_id, err));
        LS_TRY(parse_mrope(label, root, c, err));
        LS_TRY(want_bool(label, root, "attn_output_gate", 1, err));
    }
    return LS_OK;
}

/* The language model's fields, in root (the top level, or Qwen3.5's
 * text_config); c->arch is set. */
static ls_status parse_fields(const char *label, json_t *root, ls_synth_config *c, ls_error *err)
{
    int q35 = c->arch == LS_SYNTH_QWEN3_5_MOE;

    struct {
        const char *key;
        int64_t *dst;
        int64_t lo, hi;
    } req[] = {
        {"vocab_size", &c->vocab_size, 2, (int64_t)1 << 24},
        {"hidden_size", &c->hidden_size, 1, DIM_MAX},
        {"num_hidden_layers", &c->num_hidden_layers, 1, LS_SYNTH_MAX_LAYERS},
        {"num_attention_heads", &c->num_attention_heads, 1, 4096},
        {"num_key_value_heads", &c->num_key_value_heads, 1, 4096},
        {"head_dim", &c->head_dim, 2, 65536},
        {"linear_num_key_heads", &c->linear_num_key_heads, 1, 4096},
        {"linear_num_value_heads", &c->linear_num_value_heads, 1, 4096},
        {"linear_key_head_dim", &c->linear_key_head_dim, 1, 65536},
        {"linear_value_head_dim", &c->linear_value_head_dim, 1, 65536},
        {"linear_conv_kernel_dim", &c->linear_conv_kernel_dim, 1, 64},
        {"num_experts", &c->num_experts, 1, 65536},
        {"num_experts_per_tok", &c->num_experts_per_tok, 1, 65536},
        {"moe_intermediate_size", &c->moe_intermediate_size, 1, DIM_MAX},
        {"shared_expert_intermediate_size", &c->shared_expert_intermediate_size, 1, DIM_MAX},
    };
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
        LS_TRY(get_int(label, root, req[i].key, 1, 0, req[i].lo, req[i].hi, req[i].dst, err));
    /* Optional, with the Hugging Face config class defaults. */
    LS_TRY(get_int(label, root, "intermediate_size", 0, 5632, 1, DIM_MAX, &c->intermediate_size,
                   err));
    LS_TRY(get_int(label, root, "max_position_embeddings", 0, 32768, 1, (int64_t)1 << 31,
                   &c->max_position_embeddings, err));
    LS_TRY(get_int(label, root, "bos_token_id", 0, -1, 0, c->vocab_size - 1, &c->bos_token_id,
                   err));
    if (json_is_array(json_object_get(root, "eos_token_id")))
        return ls_fail(err, LS_E_UNSUPPORTED,
                       "%s: field 'eos_token_id' as a list is not supported by synth", label);
    LS_TRY(get_int(label, root, "eos_token_id", 0, -1, 0, c->vocab_size - 1, &c->eos_token_id,
                   err));

    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return ls_fail(err, LS_E_INPUT,
                       "%s: field 'num_key_value_heads' (%lld) must divide num_attention_heads (%lld)",
                       label, (long long)c->num_key_value_heads, (long long)c->num_attention_heads);
    if (c->linear_num_value_heads % c->linear_num_key_heads != 0)
        return ls_fail(err, LS_E_INPUT,
                       "%s: field 'linear_num_key_heads' (%lld) must divide linear_num_value_heads (%lld)",
                       label, (long long)c->linear_num_key_heads,
                       (long long)c->linear_num_value_heads);
    if (c->num_experts_per_tok > c->num_experts)
        return ls_fail(err, LS_E_INPUT, "%s: field 'num_experts_per_tok' (%lld) exceeds num_experts (%lld)",
                       label, (long long)c->num_experts_per_tok, (long long)c->num_experts);

    int found = 0;
    c->rms_norm_eps = 1e-6;
    LS_TRY(get_real(label, root, "rms_norm_eps", 0.0, 1.0, &c->rms_norm_eps, &found, err));

    /* RoPE: top-level fields (the released config) or rope_parameters (v5). */
    json_t *rp = json_object_get(root, "rope_parameters");
    LS_TRY(check_rope_type(label, rp, "rope_parameters", err));
    LS_TRY(check_rope_type(label, json_object_get(root, "rope_scaling"), "rope_scaling", err));
    c->partial_rotary_factor = 0.25;
    LS_TRY(get_real(label, root, "partial_rotary_factor", 0.0, 1.0, &c->partial_rotary_factor,
                    &found, err));
    if (!found && json_is_object(rp))
        LS_TRY(get_real(label, rp, "partial_rotary_factor", 0.0, 1.0, &c->partial_rotary_factor,
                        &found, err));
    LS_TRY(get_real(label, root, "rope_theta", 1.0, 1e30, &c->rope_theta, &found, err));
    if (!found && json_is_object(rp))
        LS_TRY(get_real(label, rp, "rope_theta", 1.0, 1e30, &c->rope_theta, &found, err));
    if (!found)
        return ls_fail(err, LS_E_INPUT,
                       "%s: field 'rope_theta' is missing (neither top level nor rope_parameters)",
                       label);
    double rot = c->partial_rotary_factor * (double)c->head_dim;
    int64_t rot_i = (int64_t)rot;
    if ((double)rot_i != rot || rot_i < 2 || rot_i % 2 != 0)
        return ls_fail(err, LS_E_INPUT,
                       "%s: field 'partial_rotary_factor' (%g) times head_dim (%lld) must be an even integer",
                       label, c->partial_rotary_factor, (long long)c->head_dim);

    json_t *ntp = json_object_get(root, "norm_topk_prob");
    c->norm_topk_prob = 1;
    if (q35) {
        /* the Qwen3.5 router always renormalises */
        LS_TRY(want_bool(label, root, "norm_topk_prob", 1, err));
    } else if (ntp && !json_is_null(ntp)) {
        if (!json_is_boolean(ntp))
            return ls_fail(err, LS_E_INPUT, "%s: field 'norm_topk_prob' must be true or false", label);
        c->norm_topk_prob = json_is_true(ntp);
    }
    LS_TRY(want_bool(label, root, "tie_word_embeddings", 0, err));
    LS_TRY(want_bool(label, root, "attention_bias", 0, err));
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !(json_is_string(act) && strcmp(json_string_value(act), "silu") == 0))
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: field 'hidden_act' must be \"silu\"", label);
    int64_t sparse_step = 1;
    LS_TRY(get_int(label, root, "decoder_sparse_step", 0, 1, 1, 1, &sparse_step, err));
    json_t *mlp_only = json_object_get(root, "mlp_only_layers");
    if (mlp_only && !json_is_null(mlp_only) &&
        !(json_is_array(mlp_only) && json_array_size(mlp_only) == 0))
        return ls_fail(err, LS_E_UNSUPPORTED,
                       "%s: field 'mlp_only_layers' must be empty (synth writes MoE in every layer)",
                       label);

    /* Layer pattern: layer_types wins over full_attention_interval, as in HF. */
    int64_t interval = 4;
    LS_TRY(get_int(label, root, "full_attention_interval", 0, 4, 1, LS_SYNTH_MAX_LAYERS,
                   &interval, err));
    json_t *lt = json_object_get(root, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int64_t)json_array_size(lt) != c->num_hidden_layers)
            return ls_fail(err, LS_E_INPUT,
                           "%s: field 'layer_types' must be a list of num_hidden_layers (%lld) strings",
                           label, (long long)c->num_hidden_layers);
        for (int64_t i = 0; i < c->num_hidden_layers; i++) {
            json_t *s = json_array_get(lt, (size_t)i);
            const char *v = json_is_string(s) ? json_string_value(s) : "";
            if (strcmp(v, "full_attention") == 0)
                c->layer_full[i] = 1;
            else if (strcmp(v, "linear_attention") == 0)
                c->layer_full[i] = 0;
            else
                return ls_fail(err, LS_E_INPUT,
                               "%s: field 'layer_types[%lld]' must be \"linear_attention\" or \"full_attention\"",
                               label, (long long)i);
        }
        derive_interval(c, interval);
    } else {
        set_interval(c, interval);
    }
    return LS_OK;
}

ls_status ls_synth_config_parse(const char *label, const char *text, size_t len,
                                ls_synth_config *cfg, ls_error *err)
{
    json_t *root = NULL;
    LS_TRY(ls_json_load_buf(label, text, len, &root, err));
    ls_status st = parse_root(label, root, cfg, err);
    json_decref(root);
    return st;
}

ls_status ls_synth_config_load(const char *path, ls_synth_config *cfg, ls_error *err)
{
    json_t *root = NULL;
    LS_TRY(ls_json_load_file(path, &root, err));
    ls_status st = parse_root(path, root, cfg, err);
    json_decref(root);
    return st;
}

ls_status ls_synth_config_truncate(ls_synth_config *cfg, int64_t n, ls_error *err)
{
    if (n < 1 || n > cfg->num_hidden_layers)
        return ls_fail(err, LS_E_USAGE, "layers %lld: must be between 1 and %lld", (long long)n,
                       (long long)cfg->num_hidden_layers);
    for (int64_t i = n; i < LS_SYNTH_MAX_LAYERS; i++) cfg->layer_full[i] = 0;
    cfg->num_hidden_layers = n;
    return LS_OK;
}

/* ---- writing config.json ------------------------------------------------------------
 * A small emitter rather than jansson's dump, so that reals print as the
 * shortest text that reads back to the same double (1e-06, not
 * 9.9999999999999995e-07) and the bytes are fixed for the tests' digests. */

typedef struct field {
    const char *key;
    char *value;                 /* rendered JSON, owned */
} field;

static char *fmt_real(double x)
{
    char buf[64];
    if (x > -1e15 && x < 1e15 && x == (double)(int64_t)x) {
        snprintf(buf, sizeof buf, "%.1f", x);
    } else {
        for (int p = 1; p <= 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, x);
            if (strtod(buf, NULL) == x) break;
        }
    }
    return strdup(buf);
}

static char *fmt_int(int64_t x)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)x);
    return strdup(buf);
}

static char *fmt_opt_id(int64_t x) { return x < 0 ? strdup("null") : fmt_int(x); }

static int cmp_field(const void *a, const void *b)
{
    return strcmp(((const field *)a)->key, ((const field *)b)->key);
}

/* Sorted fields as a JSON object whose closing brace sits at `indent`
 * spaces (fields at indent + 2); a NULL value is left out. Frees the values;
 * NULL when out of memory. */
static char *render_object(field *f, size_t nf, int indent)
{
    qsort(f, nf, sizeof f[0], cmp_field);
    size_t cap = 16 + (size_t)indent;
    for (size_t i = 0; i < nf; i++)
        if (f[i].value) cap += strlen(f[i].key) + strlen(f[i].value) + (size_t)indent + 10;
    char *s = malloc(cap);
    if (s) {
        size_t m = (size_t)snprintf(s, cap, "{\n");
        size_t last = nf;
        for (size_t i = 0; i < nf; i++)
            if (f[i].value) last = i;
        for (size_t i = 0; i < nf; i++)
            if (f[i].value)
                m += (size_t)snprintf(s + m, cap - m, "%*s\"%s\": %s%s\n", indent + 2, "", f[i].key,
                                      f[i].value, i == last ? "" : ",");
        snprintf(s + m, cap - m, "%*s}", indent, "");
    }
    for (size_t i = 0; i < nf; i++) free(f[i].value);
    return s;
}

/* quantization_config of the FP8 layout (a top-level field, as in the FP8
 * releases), or NULL when c->fp8 is 0 (left out) or out of memory (*oom).
 * modules_to_not_convert names what the releases leave in BF16 (docs/model.md
 * §6b): lm_head and, per layer, the router, the shared expert gate and
 * Qwen3.5's in_proj_a / in_proj_b (Qwen3-Next's in_proj_ba), with the
 * checkpoint's own module prefix. */
static char *render_quant(const ls_synth_config *c, int *oom)
{
    if (!c->fp8) return NULL;
    const int q35 = c->arch == LS_SYNTH_QWEN3_5_MOE;
    const char *m = q35 ? "model.language_model" : "model";
    size_t cap = 64 + (size_t)c->num_hidden_layers * 4 * 96;
    char *list = malloc(cap);
    if (!list) {
        *oom = 1;
        return NULL;
    }
    size_t n = (size_t)snprintf(list, cap, "[\n      \"lm_head\"");
    for (int64_t L = 0; L < c->num_hidden_layers; L++) {
        static const char *const q35_lin[] = {"linear_attn.in_proj_a", "linear_attn.in_proj_b"};
        static const char *const next_lin[] = {"linear_attn.in_proj_ba"};
        if (!c->layer_full[L])
            for (int i = 0; i < (q35 ? 2 : 1); i++)
                n += (size_t)snprintf(list + n, cap - n, ",\n      \"%s.layers.%lld.%s\"", m,
                                      (long long)L, q35 ? q35_lin[i] : next_lin[i]);
        n += (size_t)snprintf(list + n, cap - n, ",\n      \"%s.layers.%lld.mlp.gate\"", m,
                              (long long)L);
        n += (size_t)snprintf(list + n, cap - n,
                              ",\n      \"%s.layers.%lld.mlp.shared_expert_gate\"", m,
                              (long long)L);
    }
    snprintf(list + n, cap - n, "\n    ]");
    field q[] = {
        {"activation_scheme", strdup("\"dynamic\"")},
        {"fmt", strdup("\"e4m3\"")},
        {"modules_to_not_convert", list},
        {"quant_method", strdup("\"fp8\"")},
        {"weight_block_size", strdup("[\n      128,\n      128\n    ]")},
    };
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        if (!q[i].value) *oom = 1;
    char *r = render_object(q, sizeof q / sizeof q[0], 2);
    if (!r) *oom = 1;
    return r;
}

/* Qwen3.5 MoE in the release layout: Qwen3_5MoeForConditionalGeneration,
 * the language model's fields under text_config (with the multimodal RoPE
 * sections in rope_parameters), the vision placeholder ids at the top when
 * given. No vision_config: synth writes no vision tower. */
static ls_status render_q35(const ls_synth_config *c, char **out, size_t *len, ls_error *err)
{
    size_t lt_cap = 16 + (size_t)c->num_hidden_layers * 32;
    char *lt = malloc(lt_cap);
    if (!lt) return ls_fail(err, LS_E_NOMEM, "synth: out of memory");
    size_t n = 0;
    n += (size_t)snprintf(lt + n, lt_cap - n, "[\n");
    for (int64_t i = 0; i < c->num_hidden_layers; i++)
        n += (size_t)snprintf(lt + n, lt_cap - n, "      \"%s\"%s\n",
                              c->layer_full[i] ? "full_attention" : "linear_attention",
                              i + 1 < c->num_hidden_layers ? "," : "");
    snprintf(lt + n, lt_cap - n, "    ]");
    char sec[96];
    snprintf(sec, sizeof sec, "[\n        %lld,\n        %lld,\n        %lld\n      ]",
             (long long)c->mrope_section[0], (long long)c->mrope_section[1],
             (long long)c->mrope_section[2]);
    field rope[] = {
        {"mrope_interleaved", strdup("true")},
        {"mrope_section", strdup(sec)},
        {"partial_rotary_factor", fmt_real(c->partial_rotary_factor)},
        {"rope_theta", fmt_real(c->rope_theta)},
        {"rope_type", strdup("\"default\"")},
    };
    char *rope_s = render_object(rope, sizeof rope / sizeof rope[0], 4);
    field t[] = {
        {"attention_bias", strdup("false")},
        {"attention_dropout", strdup("0.0")},
        {"attn_output_gate", strdup("true")},
        {"bos_token_id", fmt_opt_id(c->bos_token_id)},
        {"dtype", strdup("\"bfloat16\"")},
        {"eos_token_id", fmt_opt_id(c->eos_token_id)},
        {"full_attention_interval",
         c->full_attention_interval ? fmt_int(c->full_attention_interval) : NULL},
        {"head_dim", fmt_int(c->head_dim)},
        {"hidden_act", strdup("\"silu\"")},
        {"hidden_size", fmt_int(c->hidden_size)},
        {"initializer_range", strdup("0.02")},
        {"layer_types", lt},
        {"linear_conv_kernel_dim", fmt_int(c->linear_conv_kernel_dim)},
        {"linear_key_head_dim", fmt_int(c->linear_key_head_dim)},
        {"linear_num_key_heads", fmt_int(c->linear_num_key_heads)},
        {"linear_num_value_heads", fmt_int(c->linear_num_value_heads)},
        {"linear_value_head_dim", fmt_int(c->linear_value_head_dim)},
        {"mamba_ssm_dtype", strdup("\"float32\"")},
        {"max_position_embeddings", fmt_int(c->max_position_embeddings)},
        {"model_type", strdup("\"qwen3_5_moe_text\"")},
        {"moe_intermediate_size", fmt_int(c->moe_intermediate_size)},
        {"num_attention_heads", fmt_int(c->num_attention_heads)},
        {"num_experts", fmt_int(c->num_experts)},
        {"num_experts_per_tok", fmt_int(c->num_experts_per_tok)},
        {"num_hidden_layers", fmt_int(c->num_hidden_layers)},
        {"num_key_value_heads", fmt_int(c->num_key_value_heads)},
        {"output_router_logits", strdup("false")},
        {"rms_norm_eps", fmt_real(c->rms_norm_eps)},
        {"rope_parameters", rope_s},
        {"router_aux_loss_coef", strdup("0.001")},
        {"shared_expert_intermediate_size", fmt_int(c->shared_expert_intermediate_size)},
        {"tie_word_embeddings", strdup("false")},
        {"use_cache", strdup("true")},
        {"vocab_size", fmt_int(c->vocab_size)},
    };
    const size_t nt = sizeof t / sizeof t[0];
    int oom = !rope_s;
    for (size_t i = 0; i < nt; i++)
        if (!t[i].value && strcmp(t[i].key, "full_attention_interval") != 0) oom = 1;
    char *text = render_object(t, nt, 2);
    field top[] = {
        {"architectures", strdup("[\n    \"Qwen3_5MoeForConditionalGeneration\"\n  ]")},
        {"image_token_id", c->image_token_id >= 0 ? fmt_int(c->image_token_id) : NULL},
        {"model_type", strdup("\"qwen3_5_moe\"")},
        {"quantization_config", render_quant(c, &oom)},
        {"text_config", text},
        {"tie_word_embeddings", strdup("false")},
        {"video_token_id", c->video_token_id >= 0 ? fmt_int(c->video_token_id) : NULL},
    };
    const size_t nto = sizeof top / sizeof top[0];
    oom |= !text || !top[0].value || !top[2].value || !top[5].value;
    char *all = render_object(top, nto, 0);
    if (oom || !all) {
        free(all);
        return ls_fail(err, LS_E_NOMEM, "synth: out of memory");
    }
    size_t m = strlen(all);
    char *s = realloc(all, m + 2);
    if (!s) {
        free(all);
        return ls_fail(err, LS_E_NOMEM, "synth: out of memory");
    }
    s[m] = '\n';
    s[m + 1] = '\0';
    *out = s;
    if (len) *len = m + 1;
    return LS_OK;
}

ls_status ls_synth_config_render(const ls_synth_config *c, char **out, size_t *len, ls_error *err)
{
    *out = NULL;
    if (c->arch == LS_SYNTH_QWEN3_5_MOE) return render_q35(c, out, len, err);
    /* layer_types, one string per line at indent 4. */
    size_t lt_cap = 16 + (size_t)c->num_hidden_layers * 32;
    char *lt = malloc(lt_cap);
    if (!lt) return ls_fail(err, LS_E_NOMEM, "synth: out of memory");
    size_t n = 0;
    n += (size_t)snprintf(lt + n, lt_cap - n, "[\n");
    for (int64_t i = 0; i < c->num_hidden_layers; i++)
        n += (size_t)snprintf(lt + n, lt_cap - n, "    \"%s\"%s\n",
                              c->layer_full[i] ? "full_attention" : "linear_attention",
                              i + 1 < c->num_hidden_layers ? "," : "");
    snprintf(lt + n, lt_cap - n, "  ]");

    char *prf = fmt_real(c->partial_rotary_factor), *theta = fmt_real(c->rope_theta);
    int oom_q = 0;
    char rope[256];
    snprintf(rope, sizeof rope,
             "{\n    \"partial_rotary_factor\": %s,\n    \"rope_theta\": %s,\n"
             "    \"rope_type\": \"default\"\n  }",
             prf ? prf : "0", theta ? theta : "0");

    field f[] = {
        {"architectures", strdup("[\n    \"Qwen3NextForCausalLM\"\n  ]")},
        {"attention_bias", strdup("false")},
        {"attention_dropout", strdup("0.0")},
        {"bos_token_id", fmt_opt_id(c->bos_token_id)},
        {"decoder_sparse_step", strdup("1")},
        {"dtype", strdup("\"bfloat16\"")},
        {"eos_token_id", fmt_opt_id(c->eos_token_id)},
        {"full_attention_interval",
         c->full_attention_interval ? fmt_int(c->full_attention_interval) : NULL},
        {"head_dim", fmt_int(c->head_dim)},
        {"hidden_act", strdup("\"silu\"")},
        {"hidden_size", fmt_int(c->hidden_size)},
        {"initializer_range", strdup("0.02")},
        {"intermediate_size", fmt_int(c->intermediate_size)},
        {"layer_types", lt},
        {"linear_conv_kernel_dim", fmt_int(c->linear_conv_kernel_dim)},
        {"linear_key_head_dim", fmt_int(c->linear_key_head_dim)},
        {"linear_num_key_heads", fmt_int(c->linear_num_key_heads)},
        {"linear_num_value_heads", fmt_int(c->linear_num_value_heads)},
        {"linear_value_head_dim", fmt_int(c->linear_value_head_dim)},
        {"max_position_embeddings", fmt_int(c->max_position_embeddings)},
        {"mlp_only_layers", strdup("[]")},
        {"model_type", strdup("\"qwen3_next\"")},
        {"moe_intermediate_size", fmt_int(c->moe_intermediate_size)},
        {"norm_topk_prob", strdup(c->norm_topk_prob ? "true" : "false")},
        {"num_attention_heads", fmt_int(c->num_attention_heads)},
        {"num_experts", fmt_int(c->num_experts)},
        {"num_experts_per_tok", fmt_int(c->num_experts_per_tok)},
        {"num_hidden_layers", fmt_int(c->num_hidden_layers)},
        {"num_key_value_heads", fmt_int(c->num_key_value_heads)},
        {"output_router_logits", strdup("false")},
        {"partial_rotary_factor", fmt_real(c->partial_rotary_factor)},
        {"quantization_config", render_quant(c, &oom_q)},
        {"rms_norm_eps", fmt_real(c->rms_norm_eps)},
        {"rope_parameters", strdup(rope)},
        {"rope_scaling", strdup("null")},
        {"rope_theta", fmt_real(c->rope_theta)},
        {"router_aux_loss_coef", strdup("0.001")},
        {"shared_expert_intermediate_size", fmt_int(c->shared_expert_intermediate_size)},
        {"tie_word_embeddings", strdup("false")},
        {"torch_dtype", strdup("\"bfloat16\"")},
        {"use_cache", strdup("true")},
        {"vocab_size", fmt_int(c->vocab_size)},
    };
    free(prf);
    free(theta);
    const size_t nf = sizeof f / sizeof f[0];
    qsort(f, nf, sizeof f[0], cmp_field);

    size_t cap = 64;
    int oom = oom_q;
    for (size_t i = 0; i < nf; i++) {
        if (!f[i].value && strcmp(f[i].key, "full_attention_interval") != 0 &&
            strcmp(f[i].key, "quantization_config") != 0)
            oom = 1;
        if (f[i].value) cap += strlen(f[i].key) + strlen(f[i].value) + 8;
    }
    char *s = oom ? NULL : malloc(cap);
    if (s) {
        size_t m = (size_t)snprintf(s, cap, "{\n");
        size_t last = nf;
        for (size_t i = 0; i < nf; i++)
            if (f[i].value) last = i;
        for (size_t i = 0; i < nf; i++) {
            if (!f[i].value) continue;
            m += (size_t)snprintf(s + m, cap - m, "  \"%s\": %s%s\n", f[i].key, f[i].value,
                                  i == last ? "" : ",");
        }
        m += (size_t)snprintf(s + m, cap - m, "}\n");
        *out = s;
        if (len) *len = m;
    }
    for (size_t i = 0; i < nf; i++) free(f[i].value);
    if (!s) return ls_fail(err, LS_E_NOMEM, "synth: out of memory");
    return LS_OK;
}
