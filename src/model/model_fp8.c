/* lockstep — FP8 quantization_config and modules_to_not_convert; see
 * model_fp8.h and docs/model.md §6b. */
#include "model/model_fp8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char k_prefix_lm[] = "model.language_model.";

static ls_status want_string(const json_t *qc, const char *field, const char *key,
                             const char *want, ls_error *err)
{
    const json_t *v = json_object_get(qc, key);
    if (!v || json_is_null(v)) return LS_OK;
    if (!json_is_string(v))
        return ls_fail(err, LS_E_INPUT, "config.json: field '%s.%s' must be a string", field, key);
    if (strcmp(json_string_value(v), want) != 0)
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%s.%s' = '%s' is not supported "
                       "(supported: %s)", field, key, json_string_value(v), want);
    return LS_OK;
}

ls_status ls_model_fp8_check_config(const json_t *qc, const char *field, ls_error *err)
{
    if (!json_is_object(qc))
        return ls_fail(err, LS_E_INPUT, "config.json: field '%s' must be an object", field);
    const json_t *qm = json_object_get(qc, "quant_method");
    if (!json_is_string(qm))
        return ls_fail(err, LS_E_INPUT, "config.json: field '%s.quant_method' %s", field,
                       qm ? "must be a string" : "is missing");
    if (strcmp(json_string_value(qm), "fp8") != 0)
        return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%s.quant_method' = '%s' is not "
                       "supported (supported: fp8, block-quantised e4m3 weights)", field,
                       json_string_value(qm));
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)qc, key, v) {
        if (!strcmp(key, "quant_method")) continue;
        if (!strcmp(key, "fmt")) {
            LS_TRY(want_string(qc, field, key, "e4m3", err));
        } else if (!strcmp(key, "activation_scheme")) {
            LS_TRY(want_string(qc, field, key, "dynamic", err));
        } else if (!strcmp(key, "scale_fmt")) {
            LS_TRY(want_string(qc, field, key, "float", err));
        } else if (!strcmp(key, "expert_dtype")) {
            LS_TRY(want_string(qc, field, key, "fp8", err));
        } else if (!strcmp(key, "weight_block_size")) {
            if (json_is_null(v)) continue; /* transformers' default: [128, 128] */
            int ok = json_is_array(v) && json_array_size(v) == 2;
            for (size_t i = 0; ok && i < 2; i++) ok = json_is_integer(json_array_get(v, i));
            if (!ok)
                return ls_fail(err, LS_E_INPUT, "config.json: field '%s.weight_block_size' must be "
                               "a list of two integers", field);
            long r = (long)json_integer_value(json_array_get(v, 0));
            long c = (long)json_integer_value(json_array_get(v, 1));
            if (r != 128 || c != 128)
                return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%s.weight_block_size' = "
                               "[%ld, %ld] is not supported (supported: [128, 128])", field, r, c);
        } else if (!strcmp(key, "modules_to_not_convert")) {
            if (json_is_null(v)) continue;
            if (!json_is_array(v))
                return ls_fail(err, LS_E_INPUT, "config.json: field '%s.modules_to_not_convert' must "
                               "be a list of module names", field);
            for (size_t i = 0; i < json_array_size(v); i++)
                if (!json_is_string(json_array_get(v, i)))
                    return ls_fail(err, LS_E_INPUT, "config.json: field "
                                   "'%s.modules_to_not_convert[%zu]' must be a string", field, i);
        } else if (!strcmp(key, "modules_to_convert")) {
            /* extra modules (embeddings) quantised beyond the linear layers */
            if (!json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
                return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%s.modules_to_convert' "
                               "is not supported (FP8 embeddings); must be null or empty", field);
        } else if (!strcmp(key, "dequantize")) {
            if (!json_is_false(v) && !json_is_null(v))
                return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%s.dequantize' must be "
                               "false (a load option of transformers, not a property of the "
                               "weights)", field);
        } else {
            return ls_fail(err, LS_E_UNSUPPORTED, "config.json: field '%s.%s' is not supported "
                           "(lockstep reads quant_method, fmt, weight_block_size, "
                           "activation_scheme, modules_to_not_convert, scale_fmt, expert_dtype, "
                           "modules_to_convert, dequantize)", field, key);
        }
    }
    return LS_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

ls_status ls_fp8_skip_load(const json_t *config, ls_fp8_skip *out, ls_error *err)
{
    memset(out, 0, sizeof *out);
    const json_t *qc = json_object_get(config, "quantization_config");
    if (!json_is_object(qc)) {
        const json_t *text = json_object_get(config, "text_config");
        qc = json_is_object(text) ? json_object_get(text, "quantization_config") : NULL;
    }
    const json_t *list = json_is_object(qc) ? json_object_get(qc, "modules_to_not_convert") : NULL;
    size_t n = json_is_array(list) ? json_array_size(list) : 0;
    if (n == 0) return LS_OK;
    /* one allocation: the name pointers, then the entries' raw pointers */
    out->names = calloc(n, sizeof(char *));
    out->raw = calloc(n, sizeof(char *));
    if (!out->names || !out->raw) {
        ls_fp8_skip_free(out);
        return ls_fail(err, LS_E_NOMEM, "model: out of memory");
    }
    size_t plm = sizeof k_prefix_lm - 1;
    for (size_t i = 0; i < n; i++) {
        const char *e = json_string_value(json_array_get(list, i));
        if (!e) continue; /* checked by ls_model_fp8_check_config */
        /* normalised name, then NUL, then the raw pointer's index is kept
         * beside it: names are sorted, so each carries its raw entry */
        size_t len = strlen(e);
        char *nm = malloc(len + 1 + sizeof(size_t));
        if (!nm) {
            ls_fp8_skip_free(out);
            return ls_fail(err, LS_E_NOMEM, "model: out of memory");
        }
        if (strncmp(e, k_prefix_lm, plm) == 0) snprintf(nm, len + 1, "model.%s", e + plm);
        else if (strcmp(e, "model.language_model") == 0) snprintf(nm, len + 1, "model");
        else memcpy(nm, e, len + 1);
        memcpy(nm + strlen(nm) + 1, &i, sizeof i);
        out->names[out->n++] = nm;
    }
    qsort(out->names, out->n, sizeof(char *), cmp_str);
    for (size_t k = 0; k < out->n; k++) {
        size_t i;
        memcpy(&i, out->names[k] + strlen(out->names[k]) + 1, sizeof i);
        out->raw[k] = json_string_value(json_array_get(list, i));
    }
    return LS_OK;
}

/* The entry equal to the first len bytes of s, or NULL. */
static const char *lookup(const ls_fp8_skip *s, const char *key, size_t len)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const char *e = s->names[mid];
        int c = strncmp(e, key, len);
        if (c == 0 && e[len] != '\0') c = 1; /* e is longer: after key */
        if (c == 0) return s->raw[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const char *ls_fp8_skip_find(const ls_fp8_skip *s, const char *module)
{
    if (!s || s->n == 0) return NULL;
    size_t n = strlen(module);
    /* the module itself and every module above it */
    for (size_t len = n; len > 0; len--) {
        if (len < n && module[len] != '.') continue;
        const char *hit = lookup(s, module, len);
        if (hit) return hit;
    }
    /* every trailing part at a dot */
    for (size_t i = 1; i < n; i++) {
        if (module[i - 1] != '.') continue;
        const char *hit = lookup(s, module + i, n - i);
        if (hit) return hit;
    }
    return NULL;
}

void ls_fp8_skip_free(ls_fp8_skip *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) free(s->names[i]);
    free(s->names);
    free(s->raw);
    memset(s, 0, sizeof *s);
}
