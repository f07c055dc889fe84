/* The ablation (run/ablate.h): on synth tiny (every layer) and qwen3.5-tiny
 * (the default sample of layers) every operator family's planted order
 * change is detected, first at or after the trace layer it is planted in,
 * and the control (the strict run again) does not drift; the layer choice
 * picks the first, middle and last layer where a family exists; bad flags
 * exit 2 naming them. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/ablate.h"
#include "run/load.h"
#include "testutil.h"

static char *g_dir;
static char g_prompts[4200];

static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("ablate");
    const char *presets[2][2] = {{"tiny", "tiny"}, {"qwen3.5-tiny", "q35"}};
    for (int i = 0; i < 2; i++) {
        char *o = NULL;
        int rc = ls_test_cli(&o, "--quiet synth --preset %s --seed 1 --out %s/%s", presets[i][0], g_dir, presets[i][1]);
        ck_assert_msg(rc == 0, "synth %s: exit %d: %s", presets[i][0], rc, o ? o : "");
        free(o);
    }
    /* one prompt of one token (decode only after it), two longer ones */
    ls_test_write_text(g_dir, "p.jsonl",
                       "{\"id\": 0, \"tokens\": [5, 6, 7, 8]}\n{\"id\": 4, \"tokens\": [900]}\n"
                       "{\"id\": 2, \"tokens\": [1, 2, 3]}\n");
    snprintf(g_prompts, sizeof g_prompts, "%s/p.jsonl", g_dir);
}

static void teardown_all(void)
{
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    g_dir = NULL;
}

/* ---- the layer choice -------------------------------------------------------- */

static void layers_expect(const ls_model_config *c, ls_perturb_op op, const char *choice, const int *want, int n_want)
{
    int got[64], n = -1;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_ablate_layers(c, op, choice, got, &n, &err) == LS_OK, "%s %s: %s", ls_perturb_op_name(op),
                  choice ? choice : "(default)", err.msg);
    char g[256] = "", w[256] = "";
    for (int i = 0; i < n; i++) snprintf(g + strlen(g), sizeof g - strlen(g), " %d", got[i]);
    for (int i = 0; i < n_want; i++) snprintf(w + strlen(w), sizeof w - strlen(w), " %d", want[i]);
    ck_assert_msg(!strcmp(g, w), "%s %s: layers [%s ] (want [%s ])", ls_perturb_op_name(op),
                  choice ? choice : "(default)", g, w);
}

START_TEST(test_families_and_layers)
{
    int nf;
    const ls_perturb_op *fam = ls_ablate_families(&nf);
    ck_assert_int_eq(nf, LS_PERTURB_COUNT - 1);
    for (int op = 1; op < LS_PERTURB_COUNT; op++) {
        int seen = 0;
        for (int i = 0; i < nf; i++) seen += fam[i] == (ls_perturb_op)op;
        ck_assert_msg(seen == 1, "op %s appears %d times among the families", ls_perturb_op_name((ls_perturb_op)op),
                      seen);
    }
    /* eight layers, full attention every fourth (3, 7), as synth small */
    ls_model_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = 8;
    c.is_attention[3] = c.is_attention[7] = 1;
    layers_expect(&c, LS_PERTURB_GDN, NULL, (const int[]){0, 2, 6}, 3);       /* of 0 1 2 4 5 6 */
    layers_expect(&c, LS_PERTURB_CONV, "sample", (const int[]){0, 2, 6}, 3);
    layers_expect(&c, LS_PERTURB_ATTENTION, NULL, (const int[]){3, 7}, 2);   /* first = middle */
    layers_expect(&c, LS_PERTURB_NORM, NULL, (const int[]){0, 3, 7}, 3);
    layers_expect(&c, LS_PERTURB_ROUTER, "all", (const int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8);
    layers_expect(&c, LS_PERTURB_ATTENTION, "all", (const int[]){3, 7}, 2);
    layers_expect(&c, LS_PERTURB_GDN, "7,3,1", (const int[]){1}, 1);        /* where it exists, ascending */
    layers_expect(&c, LS_PERTURB_ATTENTION, "7,3,1", (const int[]){3, 7}, 2);
    layers_expect(&c, LS_PERTURB_ATTENTION, "0", NULL, 0);                 /* none there */
    layers_expect(&c, LS_PERTURB_LM_HEAD, "5", (const int[]){-1}, 1);       /* once, whatever the choice */
    layers_expect(&c, LS_PERTURB_LM_HEAD, NULL, (const int[]){-1}, 1);
    /* bad choices: LS_E_USAGE naming the field and its flag */
    const char *bad[] = {"", "first", "1,", ",1", "1,,2", "1;2", "-1", "1,1", "2,0,2", "1 2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ls_error err;
        ls_error_clear(&err);
        ck_assert_msg(ls_ablate_layers_check(bad[i], &err) == LS_E_USAGE && strstr(err.msg, "--layers"),
                      "layers '%s' accepted (%s)", bad[i], err.msg);
    }
    int out[64], n;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_int_eq(ls_ablate_layers(&c, LS_PERTURB_NORM, "2,8", out, &n, &err), LS_E_USAGE);
    ck_assert_msg(strstr(err.msg, "layer 8 is outside the model's decoder layers 0..7"), "%s", err.msg);
    ck_assert_int_eq(ls_ablate_layers_check("all", &err), LS_OK);
    ck_assert_int_eq(ls_ablate_layers_check("12,0,3", &err), LS_OK);
}
END_TEST

/* ---- the ablation on the CPU --------------------------------------------------- */

static void check_result(const char *what, const ls_ablate_result *r, const ls_model_config *c, const char *choice)
{
    /* the control: the strict run again, bitwise equal */
    ck_assert_msg(r->control.outcome == LS_ABLATE_NO_DRIFT, "%s: the control drifted: %s", what,
                  r->control.first.message);
    ck_assert_msg(r->control.positions == r->strict_positions && r->control.positions_differ == 0 &&
                      r->control.dlogprob.max == 0 && r->control.seqs_diverged == 0,
                  "%s: control: %llu of %llu positions, %llu differ, max |dlogprob| %g", what,
                  (unsigned long long)r->control.positions, (unsigned long long)r->strict_positions,
                  (unsigned long long)r->control.positions_differ, r->control.dlogprob.max);
    int nf;
    const ls_perturb_op *fam = ls_ablate_families(&nf);
    size_t k = 0;
    for (int f = 0; f < nf; f++) {
        int want[64], n_want;
        ls_error err;
        ck_assert_int_eq(ls_ablate_layers(c, fam[f], choice, want, &n_want, &err), LS_OK);
        ck_assert_msg(n_want > 0, "%s: family %s in no layer", what, ls_perturb_op_name(fam[f]));
        for (int i = 0; i < n_want; i++, k++) {
            ck_assert_msg(k < r->n_cells, "%s: %zu cells, fewer than expected", what, r->n_cells);
            const ls_ablate_cell *w = &r->cells[k];
            const char *name = ls_perturb_op_name(w->op);
            ck_assert_msg(w->op == fam[f] && w->layer == want[i], "%s: cell %zu is %s layer %d, want %s layer %d",
                          what, k, name, w->layer, ls_perturb_op_name(fam[f]), want[i]);
            /* the planted layer: the decoder layer's mixer (1 + 2L), its MoE
             * (2 + 2L), or the lm_head (the last of 2L + 3 trace layers) */
            int planted = w->op == LS_PERTURB_LM_HEAD ? (int)(2 * c->n_layers + 2)
                          : (w->op == LS_PERTURB_ROUTER || w->op == LS_PERTURB_EXPERTS ||
                             w->op == LS_PERTURB_COMBINE)
                              ? 2 + 2 * w->layer
                              : 1 + 2 * w->layer;
            ck_assert_msg(w->planted_tl == planted, "%s: %s layer %d planted at trace layer %d, want %d", what,
                          name, w->layer, w->planted_tl, planted);
            ck_assert_msg(w->outcome == LS_ABLATE_DRIFT, "%s: %s layer %d: %s, want a drift", what, name, w->layer,
                          ls_ablate_outcome_name(w->outcome));
            ck_assert_msg(w->first.what == LS_DRIFT_DIGEST && w->first.layer >= w->planted_tl,
                          "%s: %s layer %d: first drift (%s) at trace layer %d, before the planted layer %d", what,
                          name, w->layer, w->first.message, w->first.layer, w->planted_tl);
            ck_assert_msg(w->positions > 0 && w->positions_differ > 0 && w->dlogprob.max > 0 &&
                              w->dlogprob.p50 <= w->dlogprob.p99 && w->dlogprob.p99 <= w->dlogprob.max,
                          "%s: %s layer %d: %llu positions, %llu differ, |dlogprob| p50 %g p99 %g max %g", what,
                          name, w->layer, (unsigned long long)w->positions,
                          (unsigned long long)w->positions_differ, w->dlogprob.p50, w->dlogprob.p99,
                          w->dlogprob.max);
            ck_assert_msg(w->seqs == 3 && w->seqs_diverged <= 3 &&
                              (w->seqs_diverged == 0) == (w->tokens_until_divergence < 0),
                          "%s: %s layer %d: %ld of %ld sequences diverged, %lld tokens before", what, name,
                          w->layer, w->seqs_diverged, w->seqs, (long long)w->tokens_until_divergence);
        }
    }
    ck_assert_msg(k == r->n_cells, "%s: %zu cells, want %zu", what, r->n_cells, k);
}

static void ablate(const char *ck, const char *mode, const char *choice, ls_ablate_result *r, ls_model_config *c)
{
    ls_run_batch b;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_run_load_prompts(g_prompts, 0, &b, &err) == LS_OK, "%s", err.msg);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_dir, ck);
    ls_ablate_opts o;
    memset(&o, 0, sizeof o);
    o.checkpoint = path;
    o.prompts = g_prompts;
    o.mode = mode;
    o.max_new = 4;
    o.backend = "cpu";
    o.threads = 1;
    o.layers = choice;
    ls_status st = ls_ablate_run(&o, &b, r, &err);
    ls_run_batch_free(&b);
    ck_assert_msg(st == LS_OK, "ablate %s: %s", ck, err.msg);
    memset(c, 0, sizeof *c);
    c->n_layers = r->n_layers;
    /* both presets: layers 1 and 3 full attention, 0 and 2 Gated DeltaNet */
    ck_assert_int_eq(c->n_layers, 4);
    c->is_attention[1] = c->is_attention[3] = 1;
}

START_TEST(test_tiny_every_layer)
{
    ls_ablate_result r;
    ls_model_config c;
    ablate("tiny", "rollout", "all", &r, &c);
    ck_assert_int_eq(r.n_cells, 4 * 4 + 2 * 2 + 2 + 1); /* norm router experts combine; conv gdn; attention; head */
    ck_assert_uint_eq(r.strict_positions, (4 + 4 - 1) + (1 + 4 - 1) + (3 + 4 - 1));
    check_result("tiny, rollout, all layers", &r, &c, "all");
    ls_ablate_result_free(&r);
}
END_TEST

START_TEST(test_qwen35_tiny_sample)
{
    ls_ablate_result r;
    ls_model_config c;
    ablate("q35", NULL, NULL, &r, &c);
    ck_assert_str_eq(r.mode, "rollout");
    check_result("qwen3.5-tiny, rollout, sample", &r, &c, "sample");
    ls_ablate_result_free(&r);
}
END_TEST

START_TEST(test_tiny_replay)
{
    ls_ablate_result r;
    ls_model_config c;
    ablate("tiny", "replay", "2,1", &r, &c);
    ck_assert_str_eq(r.mode, "replay");
    check_result("tiny, replay, layers 2,1", &r, &c, "2,1");
    /* teacher-forced: every position keeps its context */
    for (size_t i = 0; i < r.n_cells; i++)
        ck_assert_uint_eq(r.cells[i].positions, r.strict_positions);
    ls_ablate_result_free(&r);
}
END_TEST

/* ---- the command line --------------------------------------------------------- */

START_TEST(test_cli_bad_flags)
{
    static const struct {
        const char *args, *says;
    } cases[] = {
        {"--checkpoint @/tiny --prompts @/p.jsonl", "--max-new-tokens N are required"},
        {"--checkpoint @/tiny --max-new-tokens 2", "--prompts FILE"},
        {"--prompts @/p.jsonl --max-new-tokens 2", "--checkpoint DIR"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 0", "--max-new-tokens"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --mode chunked", "--mode 'chunked'"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --layers first", "--layers"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --layers 1,1", "listed twice"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --layers 9", "outside the model's decoder layers"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --backend tpu", "--backend 'tpu'"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --gpu 1", "--gpu"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --tier tc", "--tier applies to --backend cuda"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --tier fast", "--tier fast"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --tier big", "--tier 'big'"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --fp8 int4", "--fp8 'int4'"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --json - --markdown -", "both go to stdout"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --bogus", "unknown option '--bogus'"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 extra", "unexpected argument: extra"},
        {"--checkpoint @/tiny --prompts @/missing.jsonl --max-new-tokens 2", "missing.jsonl"},
        {"--checkpoint @/nothing --prompts @/p.jsonl --max-new-tokens 2", "nothing"},
        {"--checkpoint @/tiny --prompts @/p.jsonl --max-new-tokens 2 --json @/no/such/dir/a.json", "a.json"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[8192];
        size_t n = 0;
        for (const char *f = cases[i].args; *f && n < sizeof args - 4300; f++) {
            if (*f == '@') n += (size_t)snprintf(args + n, sizeof args - n, "%s", g_dir);
            else args[n++] = *f;
        }
        args[n] = '\0';
        char *out = NULL;
        int rc = ls_test_cli(&out, "ablate %s", args);
        ck_assert_msg(rc == 2 && out && strstr(out, cases[i].says) && strstr(out, "lockstep ablate: "),
                      "ablate %s: exit %d (want 2), output lacks '%s':\n%s", cases[i].args, rc, cases[i].says,
                      out ? out : "");
        free(out);
    }
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "ablate --help"), 0);
    ck_assert_msg(out && strstr(out, "usage: lockstep ablate") && strstr(out, "fast\ntwin"), "%s", out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ablate");
    TCase *tc = tcase_create("ablate");
    tcase_add_unchecked_fixture(tc, setup, teardown_all);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_families_and_layers);
    tcase_add_test(tc, test_tiny_every_layer);
    tcase_add_test(tc, test_qwen35_tiny_sample);
    tcase_add_test(tc, test_tiny_replay);
    tcase_add_test(tc, test_cli_bad_flags);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 1) ? 1 : 0;
}
