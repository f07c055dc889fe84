/* Synthetic checkpoints opened as models, for tests that run whole models:
 * each preset written with its seed into a temporary directory, opened, and
 * the directory removed (the shards stay mapped; nothing reads the paths
 * again). Aborts the test on failure. Include once per test program. */
#ifndef LS_TESTS_SYNTH_MODELS_H
#define LS_TESTS_SYNTH_MODELS_H

#include <check.h>
#include <stdio.h>

#include "io/checkpoint.h"
#include "model/model.h"
#include "synth/synth.h"
#include "testutil.h"

static void ls_test_open_synth_models(const char *tag, int n, const char *const *presets,
                                      const uint64_t *seeds, ls_checkpoint **ck, ls_model **m)
{
    char *dir = ls_test_tmpdir(tag);
    for (int i = 0; i < n; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/m%d", dir, i);
        ls_error err;
        ls_error_clear(&err);
        ls_synth_config cfg;
        ck_assert_msg(ls_synth_preset(presets[i], &cfg, &err) == LS_OK, "%s", err.msg);
        ls_synth_options opt = ls_synth_options_default();
        ck_assert_msg(ls_synth_write(&cfg, seeds[i], path, &opt, &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(ls_checkpoint_open(path, &ck[i], &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(ls_model_open(ck[i], &m[i], &err) == LS_OK, "%s", err.msg);
    }
    ls_test_rm_tmpdir(dir);
}

#endif
