/* The ablation on the CUDA backend (synth tiny, the default sample of
 * layers): the strict run and its control are bitwise equal; each family's
 * cell either drifts, first at or after its planted trace layer, or is
 * refused by the backend (LS_E_UNSUPPORTED: the CUDA kernels fail closed on
 * a reversed order) and reported as not ablatable, with the backend's
 * message, never failing the whole ablation; the JSON report says so per
 * family. Prints the matrix. */
#include <jansson.h>

#include "gpu_testutil.h"
#include "run/ablate.h"
#include "run/load.h"
#include "testutil.h"

START_TEST(test_ablate_cuda_tiny)
{
    char *dir = ls_test_tmpdir("ablate-cuda");
    char *o = NULL;
    int rc = ls_test_cli(&o, "--quiet synth --preset tiny --seed 1 --out %s/ck", dir);
    ck_assert_msg(rc == 0, "synth: exit %d: %s", rc, o ? o : "");
    free(o);
    ls_test_write_text(dir, "p.jsonl", "{\"id\": 0, \"tokens\": [5, 6, 7, 8]}\n{\"id\": 4, \"tokens\": [900]}\n");
    char ck[4200], prompts[4200], json[4200];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(prompts, sizeof prompts, "%s/p.jsonl", dir);
    snprintf(json, sizeof json, "%s/a.json", dir);
    ls_run_batch b;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_run_load_prompts(prompts, 0, &b, &err) == LS_OK, "%s", err.msg);
    ls_ablate_opts opt;
    memset(&opt, 0, sizeof opt);
    opt.checkpoint = ck;
    opt.prompts = prompts;
    opt.max_new = 4;
    opt.backend = "cuda";
    opt.threads = 1;
    ls_ablate_result r;
    ls_status st = ls_ablate_run(&opt, &b, &r, &err);
    ls_run_batch_free(&b);
    ck_assert_msg(st == LS_OK, "ablate on cuda: %s", err.msg);
    ls_ablate_print(stdout, &r);
    ck_assert_msg(r.control.outcome == LS_ABLATE_NO_DRIFT, "the control drifted on cuda: %s", r.control.first.message);
    ck_assert_msg(r.n_cells == 3 * 4 + 2 * 2 + 2 + 1, "%zu cells", r.n_cells);
    for (size_t i = 0; i < r.n_cells; i++) {
        const ls_ablate_cell *w = &r.cells[i];
        const char *name = ls_perturb_op_name(w->op);
        ck_assert_msg(w->planted_tl >= 0, "%s layer %d: no planted trace layer", name, w->layer);
        if (w->outcome == LS_ABLATE_UNSUPPORTED) {
            ck_assert_msg(w->note[0] != '\0', "%s layer %d: not ablatable, no message", name, w->layer);
            continue;
        }
        ck_assert_msg(w->outcome == LS_ABLATE_DRIFT && w->first.what == LS_DRIFT_DIGEST &&
                          w->first.layer >= w->planted_tl,
                      "%s layer %d on cuda: %s, first drift (%s) at trace layer %d, planted at %d", name, w->layer,
                      ls_ablate_outcome_name(w->outcome), w->first.message, w->first.layer, w->planted_tl);
    }
    ck_assert_msg(ls_ablate_write_json(json, &opt, &r, &err) == LS_OK, "%s", err.msg);
    json_error_t je;
    json_t *doc = json_load_file(json, 0, &je);
    ck_assert_msg(doc != NULL, "%s: %s", json, je.text);
    json_t *fams = json_object_get(doc, "families");
    ck_assert_int_eq(json_array_size(fams), 8);
    for (size_t i = 0; i < json_array_size(fams); i++) {
        json_t *f = json_array_get(fams, i);
        long cells = (long)json_integer_value(json_object_get(f, "cells"));
        long unsupported = (long)json_integer_value(json_object_get(f, "cells_unsupported"));
        const char *verdict = json_string_value(json_object_get(f, "verdict"));
        ck_assert_msg(verdict && cells > 0 && !strcmp(verdict, unsupported == cells ? "not_ablatable" : "drifts"),
                      "family %s: verdict %s with %ld of %ld cells unsupported",
                      json_string_value(json_object_get(f, "family")), verdict ? verdict : "(none)", unsupported,
                      cells);
    }
    json_decref(doc);
    ls_ablate_result_free(&r);
    ls_test_rm_tmpdir(dir);
}
END_TEST

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
    Suite *s = suite_create("ablate_cuda");
    TCase *tc = tcase_create("ablate_cuda");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_ablate_cuda_tiny);
    suite_add_tcase(s, tc);
    return ls_gpu_run_suite(s);
}
