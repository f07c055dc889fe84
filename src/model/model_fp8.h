/* lockstep — FP8 block-quantised checkpoints in the model binding (internal
 * to src/model): the quantization_config reader and the modules_to_not_convert
 * list (docs/model.md §6b). Not installed. */
#ifndef LS_MODEL_MODEL_FP8_H
#define LS_MODEL_MODEL_FP8_H

#include <jansson.h>
#include <stddef.h>

#include "core/status.h"

/* Checks quantization_config (the object qc, found at config.json field
 * `field`): quant_method "fp8"; fmt "e4m3"; weight_block_size [128, 128];
 * activation_scheme "dynamic"; modules_to_not_convert a list of strings;
 * scale_fmt "float", expert_dtype "fp8", dequantize false, modules_to_convert
 * empty where given; any other key refused. LS_E_UNSUPPORTED naming the
 * field for a value lockstep does not compute, LS_E_INPUT for a malformed
 * one. */
ls_status ls_model_fp8_check_config(const json_t *qc, const char *field, ls_error *err);

/* modules_to_not_convert as a set of normalised module names: the Qwen3.5
 * prefix "model.language_model." becomes "model." as tensor names do
 * (io/checkpoint.h), so one list serves the release and a text-only layout. */
typedef struct ls_fp8_skip {
    char **names;              /* [n] sorted (byte order), owned */
    const char **raw;          /* [n] the entry as written (borrowed from the config) */
    size_t n;
} ls_fp8_skip;

/* Reads quantization_config.modules_to_not_convert of the config (top level
 * or text_config; absent: an empty set). */
ls_status ls_fp8_skip_load(const json_t *config, ls_fp8_skip *out, ls_error *err);
/* The entry naming module (a normalised module name, e.g.
 * "model.layers.3.mlp.experts.7.up_proj") as written in the config, or NULL.
 * An entry names a module when it equals it, names a module above it
 * ("model.layers.3.mlp" covers its projections) or is a trailing part of it
 * at a dot ("lm_head", "mlp.gate"). Entries are names, not patterns. */
const char *ls_fp8_skip_find(const ls_fp8_skip *s, const char *module);
void ls_fp8_skip_free(ls_fp8_skip *s);

#endif
