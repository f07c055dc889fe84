/* Synthetic checkpoints opened as models, for tests that run whole models:
 * each preset written with its seed into a temporary directory, opened, and
 * the directory removed (the shards stay mapped; nothing reads the paths
 * again); or the pieces: a preset written to a directory the caller keeps,
 * a checkpoint directory opened as a model; or a preset's config alone, for
 * a model whose weights are generated. Aborts the test on failure. */
#ifndef LS_TESTS_SYNTH_MODELS_H
#define LS_TESTS_SYNTH_MODELS_H

#include <check.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/checkpoint.h"
#include "engine/sample.h"
#include "io/json.h"
#include "model/model.h"
#include "synth/synth.h"
#include "testutil.h"

/* Writes synth preset `preset` with `seed` into directory path. */
static inline void ls_test_write_synth(const char *preset, uint64_t seed, const char *path)
{
    ls_error err;
    ls_error_clear(&err);
    ls_synth_config cfg;
    ck_assert_msg(ls_synth_preset(preset, &cfg, &err) == LS_OK, "%s", err.msg);
    ls_synth_options opt = ls_synth_options_default();
    ck_assert_msg(ls_synth_write(&cfg, seed, path, &opt, &err) == LS_OK, "%s", err.msg);
}

/* Opens the checkpoint in dir and the model on it (the caller closes both). */
static inline void ls_test_open_model(const char *dir, ls_checkpoint **ck, ls_model **m)
{
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_checkpoint_open(dir, ck, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_model_open(*ck, m, &err) == LS_OK, "%s", err.msg);
}

/* presets[0..n) written with seeds[0..n), opened into ck[0..n) and m[0..n). */
static inline void ls_test_open_synth_models(const char *tag, int n, const char *const *presets,
                                             const uint64_t *seeds, ls_checkpoint **ck, ls_model **m)
{
    char *dir = ls_test_tmpdir(tag);
    for (int i = 0; i < n; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/m%d", dir, i);
        ls_test_write_synth(presets[i], seeds[i], path);
        ls_test_open_model(path, &ck[i], &m[i]);
    }
    ls_test_rm_tmpdir(dir);
}

/* A synth preset's config as ls_model_parse_config reads it, for a model
 * whose weights the backend generates (ls_model_synthetic): truncated to
 * n_layers (0: all); fp8: the FP8 release layout's (quantization_config
 * included, experts unfused). */
static inline void ls_test_preset_config(const char *preset, long n_layers, int fp8, ls_model_config *c)
{
    ls_error err;
    ls_error_clear(&err);
    ls_synth_config sc;
    ck_assert_msg(ls_synth_preset(preset, &sc, &err) == LS_OK, "%s", err.msg);
    if (n_layers) ck_assert_msg(ls_synth_config_truncate(&sc, n_layers, &err) == LS_OK, "%s", err.msg);
    if (fp8) {
        sc.fp8 = 1;
        sc.fused_experts = 0;
    }
    char *text;
    size_t len;
    ck_assert_msg(ls_synth_config_render(&sc, &text, &len, &err) == LS_OK, "%s", err.msg);
    json_t *j;
    ck_assert_msg(ls_json_load_buf(preset, text, len, &j, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_model_parse_config(j, c, &err) == LS_OK, "%s", err.msg);
    json_decref(j);
    free(text);
}

/* n token ids of m's vocabulary from a counter-based stream keyed by salt
 * (the same ids for the same salt in every test program). */
static inline void ls_test_fill_tokens(const ls_model *m, int32_t *t, long n, uint64_t salt)
{
    uint64_t x = 0x2545f4914f6cdd1dull ^ (salt * 0x9e3779b97f4a7c15ull);
    for (long i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((x >> 33) % (uint64_t)m->cfg.vocab);
    }
}

/* Seeded sampling from the whole distribution (temperature 1, no top-k/p). */
static inline ls_sampling ls_test_seeded(uint64_t seed)
{
    ls_sampling s = {LS_SAMPLING_SEEDED, seed, 1.0f, 0, 1.0f};
    return s;
}

#endif
