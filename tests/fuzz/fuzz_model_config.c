/* libFuzzer: the model's config.json validation (ls_model_parse_config) on
 * arbitrary JSON. A refusal is one line; an accepted config satisfies what
 * the engine relies on (sizes in range, heads divisible, top-k within the
 * experts, even rotary dims within the head) and, when small, builds a
 * weightless model (ls_model_synthetic): validation and binding agree. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 16)) return 0;
    json_t *j = NULL;
    ls_error err;
    ls_error_clear(&err);
    if (ls_json_load_buf("config.json", data, size, &j, &err) != LS_OK) return 0;
    static ls_model_config c; /* the layer table is large: off the stack */
    memset(&c, 0, sizeof c);
    if (ls_model_parse_config(j, &c, &err) != LS_OK) {
        if (!err.msg[0] || strchr(err.msg, '\n')) abort();
        json_decref(j);
        return 0;
    }
    if (c.hidden < 1 || c.n_layers < 1 || c.n_layers > LS_MODEL_MAX_LAYERS || c.vocab < 1) abort();
    if (c.n_heads < 1 || c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads) abort();
    if (c.lin_k_heads < 1 || c.lin_v_heads < 1 || c.lin_v_heads % c.lin_k_heads) abort();
    if (c.n_experts < 1 || c.topk < 1 || c.topk > c.n_experts) abort();
    if (c.rotary_dims < 2 || c.rotary_dims % 2 || c.rotary_dims > c.head_dim) abort();
    if (c.conv_kernel < 1 || c.moe_inter < 1 || c.shared_inter < 1 || c.max_positions < 1) abort();
    for (long i = 0; i < c.n_layers; i++)
        if (c.is_attention[i] != 0 && c.is_attention[i] != 1) abort();
    /* a weightless model allocates the small parameters, D and H_v floats
     * per layer: only where that stays small */
    if ((c.hidden + c.lin_v_heads) * c.n_layers <= (1L << 20) && c.vocab <= (1L << 20)) {
        ls_model *m = NULL;
        if (ls_model_synthetic(&c, 1, &m, &err) != LS_OK) {
            if (err.status != LS_E_NOMEM) abort();
        } else {
            ls_model_close(m);
        }
    }
    json_decref(j);
    return 0;
}
