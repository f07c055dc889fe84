/* Reduction fingerprints (src/probe): stable across processes and thread
 * counts, a perturbation changes exactly the rows it reverses, the CPU probe
 * is fast; the manifest's rules for them (diff classes, the binary digest,
 * older manifests without fingerprints) and the CLI's exit codes. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/providers.h"
#include "manifest/manifest.h"
#include "probe/probe.h"
#include "testutil.h"

static const char *const perturbs[] = {"gdn", "conv", "attention", "router", "experts",
                                       "combine", "norm", "lm_head"};

static void probe_cpu(int threads, const char *fp8, const char *perturb, ls_probe_table *t)
{
    ls_error err;
    ls_error_clear(&err);
    ls_backend *be;
    ck_assert_msg(ls_backend_cpu_create(threads, &be, &err) == LS_OK, "%s", err.msg);
    ls_probe_opts o = {"cpu", fp8, perturb, 0};
    ck_assert_msg(ls_probe_run(be, &o, t, &err) == LS_OK, "%s", err.msg);
    be->destroy(be);
}

/* Prints every row where a and b differ; returns how many. */
static int count_diff(const ls_probe_table *a, const ls_probe_table *b, const char *what)
{
    ck_assert_uint_eq(a->count, b->count);
    int n = 0;
    for (size_t i = 0; i < a->count; i++) {
        ck_assert_str_eq(a->rows[i].op, b->rows[i].op);
        if (strcmp(a->rows[i].sha256, b->rows[i].sha256)) {
            printf("%s: %s %.16s... -> %.16s...\n", what, a->rows[i].op, a->rows[i].sha256,
                   b->rows[i].sha256);
            n++;
        }
    }
    return n;
}

START_TEST(test_every_row_probed)
{
    ls_probe_table t;
    probe_cpu(1, "w8a8", NULL, &t);
    size_t n, nf;
    const ls_provider *rows = ls_backend_list_providers("cpu", &n);
    const ls_provider *frows = ls_backend_list_fp8_providers("cpu", "w8a8", &nf);
    for (size_t i = 0; i < n + nf; i++) {
        const char *op = i < n ? rows[i].op : frows[i - n].op;
        const ls_op_fingerprint *f = ls_probe_find(&t, op);
        if (!strcmp(op, "sampling")) { /* engine code, outside the operator table */
            ck_assert_ptr_null(f);
            continue;
        }
        ck_assert_msg(f != NULL, "operator %s has no reduction fingerprint", op);
        ck_assert_uint_eq(strlen(f->sha256), 64);
    }
    ck_assert_uint_eq(t.count, n + nf - 1);
    /* rows of different ops differ (each probe sees its own inputs) but the
     * router's three rows are one op's outputs */
    ck_assert_str_eq(ls_probe_find(&t, "topk")->sha256, ls_probe_find(&t, "router_softmax")->sha256);
    ck_assert_str_ne(ls_probe_find(&t, "linear")->sha256, ls_probe_find(&t, "lm_head")->sha256);
    ck_assert_str_ne(ls_probe_find(&t, "experts")->sha256, ls_probe_find(&t, "combine")->sha256);
    /* unknown options are refused */
    ls_error err;
    ls_backend *be;
    ck_assert(ls_backend_cpu_create(1, &be, &err) == LS_OK);
    ls_probe_opts bad = {"cpu", NULL, "softmax", 0};
    ck_assert_int_eq(ls_probe_run(be, &bad, &t, &err), LS_E_USAGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "softmax"));
    ls_probe_opts bad2 = {"tpu", NULL, NULL, 0};
    ck_assert_int_eq(ls_probe_run(be, &bad2, &t, &err), LS_E_USAGE);
    be->destroy(be);
}
END_TEST

/* The chunk-aligned GDN row (docs/numerics.md §5.1), asked for: one more
 * row after the registry's, its own fingerprint, the same with 3 threads,
 * reversed under the gdn perturbation; every other row as without it. */
START_TEST(test_gdn_chunked_row)
{
    ls_probe_table base, t1, t3, tp;
    probe_cpu(1, NULL, NULL, &base);
    ls_error err;
    ls_error_clear(&err);
    ls_backend *be;
    for (int threads = 1; threads <= 3; threads += 2)
        for (int pert = 0; pert < 2 - (threads == 3); pert++) {
            ck_assert(ls_backend_cpu_create(threads, &be, &err) == LS_OK);
            ls_probe_opts o = {"cpu", NULL, pert ? "gdn" : NULL, 1};
            ck_assert_msg(ls_probe_run(be, &o, pert ? &tp : threads == 1 ? &t1 : &t3, &err) == LS_OK, "%s", err.msg);
            be->destroy(be);
        }
    ck_assert_uint_eq(t1.count, base.count + 1);
    ck_assert_str_eq(t1.rows[base.count].op, "gdn_chunked");
    for (size_t i = 0; i < base.count; i++) ck_assert_str_eq(t1.rows[i].sha256, base.rows[i].sha256);
    const char *c1 = ls_probe_find(&t1, "gdn_chunked")->sha256;
    ck_assert_str_ne(c1, ls_probe_find(&t1, "gdn_recurrent")->sha256);
    ck_assert_str_eq(c1, ls_probe_find(&t3, "gdn_chunked")->sha256);
    ck_assert_str_ne(c1, ls_probe_find(&tp, "gdn_chunked")->sha256);
}
END_TEST

START_TEST(test_stable_across_threads)
{
    ls_probe_table a, b, c;
    probe_cpu(1, "dequant", NULL, &a);
    probe_cpu(4, "dequant", NULL, &b);
    probe_cpu(3, "dequant", NULL, &c);
    ck_assert_int_eq(count_diff(&a, &b, "1 vs 4 threads"), 0);
    ck_assert_int_eq(count_diff(&a, &c, "1 vs 3 threads"), 0);
}
END_TEST

/* A perturbation changes the fingerprint of exactly the rows it reverses,
 * and each of them. */
START_TEST(test_perturb_changes_exactly_its_rows)
{
    ls_probe_table base;
    probe_cpu(2, "dequant", NULL, &base);
    for (size_t p = 0; p < sizeof perturbs / sizeof perturbs[0]; p++) {
        ls_probe_table t;
        probe_cpu(2, "dequant", perturbs[p], &t);
        int changed = 0;
        for (size_t i = 0; i < t.count; i++) {
            int differs = strcmp(base.rows[i].sha256, t.rows[i].sha256) != 0;
            int want = ls_probe_perturbs(perturbs[p], t.rows[i].op);
            ck_assert_msg(differs == want, "perturb %s: operator %s fingerprint %s (expected %s)",
                          perturbs[p], t.rows[i].op, differs ? "changed" : "unchanged",
                          want ? "a change" : "none");
            changed += differs;
        }
        printf("perturb %-9s changes %d row%s\n", perturbs[p], changed, changed == 1 ? "" : "s");
        ck_assert_int_gt(changed, 0);
    }
}
END_TEST

/* The whole CPU probe (21 rows, FP8 included) stays well under a second. */
START_TEST(test_probe_is_fast)
{
    ls_probe_table t;
    double best = 1e9;
    for (int i = 0; i < 3; i++) {
        probe_cpu(1, "w8a8", NULL, &t);
        if (t.seconds < best) best = t.seconds;
    }
    printf("CPU probe: %zu rows in %.1f ms (best of 3, 1 thread)\n", t.count, best * 1e3);
    ck_assert_msg(best < 0.5, "CPU probe took %.3f s", best);
}
END_TEST

/* ---- manifests ------------------------------------------------------------------ */

static char *g_dir, g_ck[4200], g_pin[4200];

static void setup(void)
{
    g_dir = ls_test_tmpdir("probe");
    snprintf(g_ck, sizeof g_ck, "%s/ck", g_dir);
    snprintf(g_pin, sizeof g_pin, "%s/pin.json", g_dir);
    char *out;
    int rc = ls_test_cli(&out, "synth --preset tiny --seed 3 --out %s", g_ck);
    ck_assert_msg(rc == 0, "%s", out);
    free(out);
    rc = ls_test_cli(&out, "manifest pin --checkpoint %s --threads 1 -o %s", g_ck, g_pin);
    ck_assert_msg(rc == 0, "%s", out);
    free(out);
}

static void teardown(void)
{
    ls_test_rm_tmpdir(g_dir);
}

static json_t *load(const char *path)
{
    ls_error err;
    json_t *m;
    ck_assert_msg(ls_manifest_load(path, &m, &err) == LS_OK, "%s", err.msg);
    return m;
}

static json_t *row(json_t *m, const char *op)
{
    return json_object_get(json_object_get(json_object_get(m, "numerics"), "operators"), op);
}

static void save(json_t *m, const char *name, char *path, size_t size)
{
    ls_error err;
    snprintf(path, size, "%s/%s", g_dir, name);
    ck_assert_msg(ls_manifest_save(m, path, &err) == LS_OK, "%s", err.msg);
}

/* Two processes (the CLI, 1 and 3 threads) and this one pin equal fingerprints. */
START_TEST(test_pins_agree_across_processes)
{
    char other[4400];
    snprintf(other, sizeof other, "%s/pin3.json", g_dir);
    char *out;
    ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint %s --threads 3 -o %s", g_ck, other), 0);
    free(out);
    json_t *a = load(g_pin), *b = load(other);
    ls_probe_table t;
    probe_cpu(2, "dequant", NULL, &t);
    const char *op;
    json_t *r;
    size_t n = 0;
    json_object_foreach(json_object_get(json_object_get(a, "numerics"), "operators"), op, r) {
        const ls_op_fingerprint *f = ls_probe_find(&t, op);
        json_t *fa = json_object_get(r, "reduction_fingerprint");
        json_t *fb = json_object_get(row(b, op), "reduction_fingerprint");
        if (!f) {
            ck_assert_msg(!fa && !fb, "%s: fingerprint without a probe", op);
            continue;
        }
        ck_assert_msg(fa && fb, "%s: no reduction_fingerprint in the pinned manifest", op);
        ck_assert_str_eq(json_string_value(fa), f->sha256);
        ck_assert_str_eq(json_string_value(fb), f->sha256);
        n++;
    }
    ck_assert_uint_eq(n, 19); /* every row but sampling; the FP8 rows only for FP8 checkpoints */
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s %s", g_pin, other), 0);
    free(out);
    json_decref(a);
    json_decref(b);
}
END_TEST

START_TEST(test_fingerprint_rules)
{
    json_t *m = load(g_pin);
    /* a changed fingerprint voids, named by its path */
    json_t *ch = json_deep_copy(m);
    json_object_set_new(row(ch, "attention"), "reduction_fingerprint", json_string(
        "00000000000000000000000000000000000000000000000000000000000000aa"));
    ls_manifest_delta d;
    ls_error err;
    ck_assert(ls_manifest_diff(m, ch, &d, &err) == LS_OK);
    ck_assert_uint_eq(d.count, 1);
    ck_assert_uint_eq(d.voiding, 1);
    ck_assert_str_eq(d.changes[0].path, "numerics.operators.attention.reduction_fingerprint");
    ls_manifest_diff_free(&d);

    /* with fingerprints on both sides the binary digest is informational,
     * even for a dirty tree; the claim digest does not contain it */
    json_t *build = json_object_get(m, "build");
    json_object_set_new(build, "source_revision", json_string("0123abc-dirty"));
    json_t *rebuilt = json_deep_copy(m);
    json_object_set_new(json_object_get(rebuilt, "build"), "binary_sha256", json_string(
        "1111111111111111111111111111111111111111111111111111111111111111"));
    ck_assert_int_eq(ls_manifest_classify("build.binary_sha256", m, rebuilt), LS_CHANGE_INFORMATIONAL);
    ls_digest da, db;
    ck_assert(ls_manifest_digest(m, &da, &err) == LS_OK);
    ck_assert(ls_manifest_digest(rebuilt, &db, &err) == LS_OK);
    ck_assert(ls_digest_equal(&da, &db));

    /* older manifests (no fingerprints): the binary digest rule of before,
     * and a fingerprint appearing is informational */
    json_t *old = json_deep_copy(m), *old2 = json_deep_copy(rebuilt);
    const char *op;
    json_t *r;
    json_object_foreach(json_object_get(json_object_get(old, "numerics"), "operators"), op, r)
        json_object_del(r, "reduction_fingerprint");
    json_object_foreach(json_object_get(json_object_get(old2, "numerics"), "operators"), op, r)
        json_object_del(r, "reduction_fingerprint");
    ck_assert_int_eq(ls_manifest_classify("build.binary_sha256", old, old2), LS_CHANGE_VOIDING);
    ck_assert(ls_manifest_diff(old, m, &d, &err) == LS_OK);
    ck_assert_uint_eq(d.count, 19);
    ck_assert_uint_eq(d.voiding, 0);
    ls_manifest_diff_free(&d);
    ck_assert(ls_manifest_diff(old, rebuilt, &d, &err) == LS_OK);
    ck_assert_uint_eq(d.voiding, 1); /* the binary digest, by the old rule */
    ls_manifest_diff_free(&d);

    /* one row's fingerprint dropped beside others: voiding (cannot hide a change),
     * and the binary digest falls back to the old rule */
    json_t *drop = json_deep_copy(rebuilt);
    json_object_del(row(drop, "linear"), "reduction_fingerprint");
    ck_assert_int_eq(ls_manifest_classify("numerics.operators.linear.reduction_fingerprint", m, drop),
                     LS_CHANGE_VOIDING);
    ck_assert_int_eq(ls_manifest_classify("build.binary_sha256", m, drop), LS_CHANGE_VOIDING);

    /* the validator: 64 hex digits */
    json_t *bad = json_deep_copy(m);
    json_object_set_new(row(bad, "rope"), "reduction_fingerprint", json_string("xyz"));
    ck_assert_int_eq(ls_manifest_validate(bad, "bad.json", &err), LS_E_INPUT);
    ck_assert_msg(strstr(err.msg, "numerics.operators.rope.reduction_fingerprint"), "%s", err.msg);

    json_decref(m);
    json_decref(ch);
    json_decref(rebuilt);
    json_decref(old);
    json_decref(old2);
    json_decref(drop);
    json_decref(bad);
}
END_TEST

/* The CLI: diff and verify exit codes; verify names every operator whose
 * fingerprint differs. */
START_TEST(test_cli_verify_and_diff)
{
    char *out, path[4400];
    ck_assert_int_eq(ls_test_cli(&out, "manifest verify %s --checkpoint %s", g_pin, g_ck), 0);
    ck_assert_ptr_nonnull(strstr(out, "verify: OK"));
    free(out);
    json_t *m = load(g_pin);
    json_object_set_new(row(m, "linear"), "reduction_fingerprint", json_string(
        "00000000000000000000000000000000000000000000000000000000000000aa"));
    json_object_set_new(row(m, "logprobs"), "reduction_fingerprint", json_string(
        "00000000000000000000000000000000000000000000000000000000000000bb"));
    save(m, "changed.json", path, sizeof path);
    json_decref(m);
    ck_assert_int_eq(ls_test_cli(&out, "manifest verify %s --checkpoint %s", path, g_ck), 1);
    ck_assert_msg(strstr(out, "verify: operator linear: reduction fingerprint differs") &&
                      strstr(out, "verify: operator logprobs: reduction fingerprint differs") &&
                      strstr(out, "2 voiding differences"), "%s", out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s %s", g_pin, path), 1);
    free(out);
    /* a perturbed live system: verify names the reversed operator */
    ck_assert_int_eq(ls_test_cli(&out, "manifest verify %s --checkpoint %s --perturb layer=1,op=conv",
                                 g_pin, g_ck), 1);
    ck_assert_msg(strstr(out, "verify: operator conv_silu: reduction fingerprint differs"), "%s", out);
    ck_assert_msg(!strstr(out, "verify: operator linear"), "%s", out);
    free(out);
    /* a rebuilt binary (other digest, dirty tree) with equal fingerprints holds */
    m = load(g_pin);
    json_object_set_new(json_object_get(m, "build"), "source_revision", json_string("0123abc-dirty"));
    save(m, "a.json", path, sizeof path);
    json_object_set_new(json_object_get(m, "build"), "binary_sha256", json_string(
        "1111111111111111111111111111111111111111111111111111111111111111"));
    char path2[4400];
    save(m, "b.json", path2, sizeof path2);
    json_decref(m);
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s %s", path, path2), 0);
    ck_assert_msg(strstr(out, "informational build.binary_sha256"), "%s", out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("probe");
    TCase *tc = tcase_create("probe");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_every_row_probed);
    tcase_add_test(tc, test_gdn_chunked_row);
    tcase_add_test(tc, test_stable_across_threads);
    tcase_add_test(tc, test_perturb_changes_exactly_its_rows);
    tcase_add_test(tc, test_probe_is_fast);
    suite_add_tcase(s, tc);
    TCase *tm = tcase_create("manifest");
    tcase_set_timeout(tm, 120);
    tcase_add_checked_fixture(tm, setup, teardown);
    tcase_add_test(tm, test_pins_agree_across_processes);
    tcase_add_test(tm, test_fingerprint_rules);
    tcase_add_test(tm, test_cli_verify_and_diff);
    suite_add_tcase(s, tm);
    return ls_test_run_suite(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}
