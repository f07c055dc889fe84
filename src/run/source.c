/* lockstep — the model a --checkpoint argument names: a checkpoint
 * directory, or a synthetic checkpoint generated in memory
 * ("synth:PRESET,seed=N[,...]", ls_run_checkpoint_open). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "run/run.h"
#include "synth/synth.h"

/* The fields of a synth spec after the preset: key=value, or fp8 bare. */
enum { FIELD_SEED, FIELD_LAYERS, FIELD_FP8, FIELD_EXPERTS, FIELD_COUNT };
static const struct {
    const char *key;
    int has_value;
} k_fields[FIELD_COUNT] = {{"seed", 1}, {"layers", 1}, {"fp8", 0}, {"experts", 1}};

/* One field of a synth spec; *seen has a bit per field already given (a
 * field given twice is refused: which would win?). */
static ls_status synth_field(const char *arg, const char *f, size_t n, ls_synth_config *cfg, uint64_t *seed,
                             unsigned *seen, int64_t *layers, int *fp8, int *layout, ls_error *err)
{
    const char *eq = memchr(f, '=', n);
    size_t kn = eq ? (size_t)(eq - f) : n;
    int k = 0;
    while (k < FIELD_COUNT && (strlen(k_fields[k].key) != kn || memcmp(f, k_fields[k].key, kn))) k++;
    if (k < FIELD_COUNT && (*seen & 1u << k))
        return ls_fail(err, LS_E_USAGE, "checkpoint (--checkpoint) '%s': field '%s' is given twice", arg,
                       k_fields[k].key);
    if (k == FIELD_COUNT || k_fields[k].has_value != (eq != NULL))
        return ls_fail(err, LS_E_USAGE, "checkpoint (--checkpoint) '%s': unknown field '%.*s' (expected "
                       "seed=N, layers=N, fp8, experts=fused|per-expert)", arg, (int)n, f);
    *seen |= 1u << k;
    char val[64] = "";
    if (eq) {
        size_t vn = n - kn - 1;
        if (vn == 0 || vn >= sizeof val)
            return ls_fail(err, LS_E_USAGE, "checkpoint (--checkpoint) '%s': field '%.*s' has %s value", arg,
                           (int)n, f, vn ? "too long a" : "an empty");
        memcpy(val, eq + 1, vn);
    }
    char *end = NULL;
    switch (k) {
    case FIELD_SEED: {
        errno = 0;
        unsigned long long v = strtoull(val, &end, 10);
        if (*end || val[0] == '-' || errno == ERANGE)
            return ls_fail(err, LS_E_USAGE, "checkpoint (--checkpoint) '%s': seed '%s' is not an unsigned "
                           "integer", arg, val);
        *seed = v;
        break;
    }
    case FIELD_LAYERS: {
        long long v = strtoll(val, &end, 10);
        if (*end || v < 1 || v > cfg->num_hidden_layers)
            return ls_fail(err, LS_E_USAGE, "checkpoint (--checkpoint) '%s': layers '%s': expected 1 .. %lld "
                           "(the preset's layers)", arg, val, (long long)cfg->num_hidden_layers);
        *layers = v;
        break;
    }
    case FIELD_FP8:
        *fp8 = 1;
        break;
    default: /* FIELD_EXPERTS */
        if (strcmp(val, "fused") && strcmp(val, "per-expert"))
            return ls_fail(err, LS_E_USAGE, "checkpoint (--checkpoint) '%s': experts '%s': expected fused or "
                           "per-expert", arg, val);
        *layout = !strcmp(val, "fused") ? 1 : 0;
        break;
    }
    return LS_OK;
}

ls_status ls_run_parse_synth(const char *arg, ls_synth_config *cfg, uint64_t *seed, char *label, size_t label_size,
                             ls_error *err)
{
    const char *p = arg + strlen(LS_RUN_SYNTH_PREFIX);
    const char *comma = strchr(p, ',');
    size_t pn = comma ? (size_t)(comma - p) : strlen(p);
    char preset[64];
    if (pn == 0 || pn >= sizeof preset)
        return ls_fail(err, LS_E_USAGE, "checkpoint (--checkpoint) '%s': expected synth:PRESET,seed=N (presets: "
                       "%s)", arg, ls_synth_preset_names());
    memcpy(preset, p, pn);
    preset[pn] = '\0';
    if (ls_synth_preset(preset, cfg, err) != LS_OK)
        return ls_error_prefix(err, "checkpoint (--checkpoint) '%s'", arg);
    int fp8 = 0, layout = -1;
    unsigned seen = 0; /* bit k: field k given */
    int64_t layers = 0;
    while (comma) {
        const char *f = comma + 1;
        comma = strchr(f, ',');
        size_t n = comma ? (size_t)(comma - f) : strlen(f);
        LS_TRY(synth_field(arg, f, n, cfg, seed, &seen, &layers, &fp8, &layout, err));
    }
    if (!(seen & 1u << FIELD_SEED))
        return ls_fail(err, LS_E_USAGE, "checkpoint (--checkpoint) '%s': seed=N is required (as lockstep synth's "
                       "--seed)", arg);
    if (fp8 && layout == 1)
        return ls_fail(err, LS_E_USAGE, "checkpoint (--checkpoint) '%s': the FP8 layout stores experts one by "
                       "one (experts=fused does not apply)", arg);
    if (layers) LS_TRY(ls_synth_config_truncate(cfg, layers, err));
    if (fp8) {
        cfg->fp8 = 1;
        cfg->fused_experts = 0;
    } else if (layout >= 0) {
        cfg->fused_experts = layout;
    }
    /* every field spelled out, so the label names the weights whatever the
     * defaults */
    snprintf(label, label_size, "%s%s,seed=%llu,layers=%lld%s", LS_RUN_SYNTH_PREFIX, preset,
             (unsigned long long)*seed, (long long)cfg->num_hidden_layers,
             fp8 ? ",fp8" : cfg->fused_experts ? ",experts=fused" : ",experts=per-expert");
    return LS_OK;
}

ls_status ls_run_checkpoint_open(const char *arg, ls_checkpoint **ck, ls_model **m, ls_error *err)
{
    *ck = NULL;
    if (m) *m = NULL;
    if (!arg) return ls_fail(err, LS_E_USAGE, "checkpoint (--checkpoint DIR) is required");
    if (strncmp(arg, LS_RUN_SYNTH_PREFIX, strlen(LS_RUN_SYNTH_PREFIX))) {
        LS_TRY(ls_checkpoint_open(arg, ck, err));
        ls_status st = m ? ls_model_open(*ck, m, err) : LS_OK;
        if (st != LS_OK) {
            ls_checkpoint_close(*ck);
            *ck = NULL;
        }
        return st;
    }
    ls_synth_config cfg;
    uint64_t seed = 0;
    char label[160];
    LS_TRY(ls_run_parse_synth(arg, &cfg, &seed, label, sizeof label, err));
    LS_TRY(ls_synth_checkpoint(&cfg, seed, label, ck, err));
    if (!m) return LS_OK;
    ls_model_config mc;
    ls_status st = ls_model_parse_config(ls_checkpoint_config_json(*ck), &mc, err);
    if (st == LS_OK) st = ls_model_synthetic(&mc, seed, m, err);
    if (st != LS_OK) {
        ls_checkpoint_close(*ck);
        *ck = NULL;
    }
    return st;
}
