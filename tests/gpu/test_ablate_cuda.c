/* The ablation on the CUDA backend's tc tier (synth tiny, the default
 * sample of layers): the strict run and its control are bitwise equal; the
 * families with a fast twin run it: gdn (chunked from the call's start,
 * which the 70-token prompt reaches) drifts, attention (split-KV) and
 * combine (atomic adds) may or may not (with bf16 activations their
 * outputs are often the same bits: a sum of a few bf16 values in fp32 is
 * exact), and any drift shows first at or after the planted trace layer;
 * every other family is not ablatable there, with the run layer's message
 * naming it, never failing the whole ablation; the JSON report says fast
 * twins, the tier, and each family's verdict. Prints the matrix. */
#include <jansson.h>

#include "gpu_testutil.h"
#include "run/ablate.h"
#include "run/load.h"
#include "testutil.h"

static int has_twin(ls_perturb_op op)
{
    return op == LS_PERTURB_ATTENTION || op == LS_PERTURB_GDN || op == LS_PERTURB_COMBINE;
}

START_TEST(test_ablate_cuda_tiny)
{
    char *dir = ls_test_tmpdir("ablate-cuda");
    char *o = NULL;
    int rc = ls_test_cli(&o, "--quiet synth --preset tiny --seed 1 --out %s/ck", dir);
    ck_assert_msg(rc == 0, "synth: exit %d: %s", rc, o ? o : "");
    free(o);
    char line[1024] = "{\"id\": 0, \"tokens\": [5, 6, 7, 8]}\n{\"id\": 4, \"tokens\": [900]}\n{\"id\": 7, \"tokens\": [";
    for (int t = 0; t < 70; t++) snprintf(line + strlen(line), sizeof line - strlen(line), "%s%d", t ? ", " : "",
                                          (t * 37 + 11) % 1000);
    snprintf(line + strlen(line), sizeof line - strlen(line), "]}\n");
    ls_test_write_text(dir, "p.jsonl", line);
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
    opt.tier = LS_TIER_TC;
    opt.threads = 1;
    ls_ablate_result r;
    ls_status st = ls_ablate_run(&opt, &b, &r, &err);
    ls_run_batch_free(&b);
    ck_assert_msg(st == LS_OK, "ablate on cuda: %s", err.msg);
    ls_ablate_print(stdout, &opt, &r);
    ck_assert_msg(r.control.outcome == LS_ABLATE_NO_DRIFT, "the control drifted on cuda: %s", r.control.first.message);
    ck_assert_msg(r.n_cells == 3 * 4 + 2 * 2 + 2 + 1, "%zu cells", r.n_cells);
    for (size_t i = 0; i < r.n_cells; i++) {
        const ls_ablate_cell *w = &r.cells[i];
        const char *name = ls_perturb_op_name(w->op);
        ck_assert_msg(w->planted_tl >= 0, "%s layer %d: no planted trace layer", name, w->layer);
        if (!has_twin(w->op)) {
            ck_assert_msg(w->outcome == LS_ABLATE_UNSUPPORTED && strstr(w->note, "no fast twin"),
                          "%s layer %d on cuda: %s (%s), want not ablatable", name, w->layer,
                          ls_ablate_outcome_name(w->outcome), w->note);
            continue;
        }
        int drift = w->outcome == LS_ABLATE_DRIFT;
        ck_assert_msg((drift && w->first.layer >= w->planted_tl) ||
                          (w->outcome == LS_ABLATE_NO_DRIFT && w->op != LS_PERTURB_GDN),
                      "%s layer %d on cuda: %s (%s), first drift (%s) at trace layer %d, planted at %d", name,
                      w->layer, ls_ablate_outcome_name(w->outcome), w->note, w->first.message, w->first.layer,
                      w->planted_tl);
    }
    ck_assert_msg(ls_ablate_write_json(json, &opt, &r, &err) == LS_OK, "%s", err.msg);
    json_error_t je;
    json_t *doc = json_load_file(json, 0, &je);
    ck_assert_msg(doc != NULL, "%s: %s", json, je.text);
    ck_assert_msg(json_is_true(json_object_get(doc, "fast_tier")), "fast_tier is not true");
    ck_assert_str_eq(json_string_value(json_object_get(doc, "tier")), "tc");
    ck_assert_msg(strstr(json_string_value(json_object_get(doc, "substitute")), "fast twin"), "substitute");
    json_t *fams = json_object_get(doc, "families");
    ck_assert_int_eq(json_array_size(fams), 8);
    for (size_t i = 0; i < json_array_size(fams); i++) {
        json_t *f = json_array_get(fams, i);
        long cells = (long)json_integer_value(json_object_get(f, "cells"));
        long unsupported = (long)json_integer_value(json_object_get(f, "cells_unsupported"));
        const char *verdict = json_string_value(json_object_get(f, "verdict"));
        long drifting = (long)json_integer_value(json_object_get(f, "cells_drift"));
        const char *want = unsupported == cells ? "not_ablatable" : drifting ? "drifts" : "no_drift";
        ck_assert_msg(verdict && cells > 0 && !strcmp(verdict, want),
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
