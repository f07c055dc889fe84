/* Reduction fingerprints against the compiler. This program links its own
 * build of the CPU backend (backend_cpu.c and cpu_ops_*.c, compiled by
 * tests/CMakeLists.txt as a variant object library) in place of the
 * library's, pins nothing itself, and verifies a manifest pinned by the
 * lockstep binary against its own probe:
 *
 *   LS_PROBE_VARIANT_FMA 0: the same source at the same flags (a rebuild):
 *       no fingerprint may change, and the claim holds although the
 *       binary differs (its digest is informational beside fingerprints);
 *   LS_PROBE_VARIANT_FMA 1: -mfma -ffp-contract=fast: the operators whose
 *       arithmetic contraction reaches change fingerprint, verify names
 *       them, and nothing else voids.
 *
 * Where the compiler does not take -mfma (LS_PROBE_NO_MFMA) or the CPU has
 * no FMA, the FMA variant prints SKIP and exits 77 (ctest: skipped). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manifest/manifest.h"
#include "run/run.h"
#include "testutil.h"

#define SKIP 77

static int report_fail(const char *msg, const char *detail)
{
    printf("FAIL: %s%s%s\n", msg, detail ? ": " : "", detail ? detail : "");
    return 1;
}

static int is_fingerprint_path(const char *p, const char **op, int *oplen)
{
    const char *pre = "numerics.operators.", *suf = ".reduction_fingerprint";
    size_t n = strlen(p), np = strlen(pre), ns = strlen(suf);
    if (n <= np + ns || strncmp(p, pre, np) || strcmp(p + n - ns, suf)) return 0;
    *op = p + np;
    *oplen = (int)(n - np - ns);
    return 1;
}

/* The check itself; returns 0 when it holds (FAIL lines say why not). */
static int verify_against_lockstep(void)
{
    char *dir = ls_test_tmpdir("probe-rebuild");
    char ck[4200], pin[4200];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(pin, sizeof pin, "%s/pin.json", dir);
    char *out = NULL;
    if (ls_test_cli(&out, "synth --preset tiny --seed 5 --out %s", ck) != 0)
        return report_fail("lockstep synth", out);
    free(out);
    if (ls_test_cli(&out, "manifest pin --checkpoint %s -o %s", ck, pin) != 0)
        return report_fail("lockstep manifest pin", out);
    free(out);

    ls_error err;
    ls_error_clear(&err);
    json_t *pinned;
    if (ls_manifest_load(pin, &pinned, &err) != LS_OK) return report_fail("load", err.msg);
    ls_manifest_opts o = ls_manifest_opts_default();
    o.checkpoint_dir = ck;
    ls_run_facts facts;
    ls_manifest_delta d;
    if (ls_run_manifest_facts("cpu", 0, &o, &facts, &err) != LS_OK ||
        ls_manifest_verify(pinned, &o, &d, &err) != LS_OK)
        return report_fail("verify", err.msg);

    int changed = 0, other_voiding = 0, linear = 0, digest = 0;
    for (size_t i = 0; i < d.count; i++) {
        const ls_manifest_change *c = &d.changes[i];
        const char *op;
        int n;
        if (is_fingerprint_path(c->path, &op, &n)) {
            printf("%s operator %.*s: reduction fingerprint differs\n",
                   ls_change_class_name(c->cls), n, op);
            changed++;
            linear |= n == 6 && !strncmp(op, "linear", 6);
            digest |= n == 6 && !strncmp(op, "digest", 6);
            if (c->cls != LS_CHANGE_VOIDING) return report_fail("a fingerprint change is not voiding", c->path);
        } else {
            printf("%s %s: %s -> %s\n", ls_change_class_name(c->cls), c->path, c->old_value,
                   c->new_value);
            other_voiding += c->cls == LS_CHANGE_VOIDING;
        }
    }
    printf("%zu differences, %zu voiding; %d operator fingerprints differ\n", d.count, d.voiding,
           changed);
    int rc = 0;
#if LS_PROBE_VARIANT_FMA
    /* contraction reaches the DOT32 lanes (a*b + acc): linear must change;
     * SHA-256 runs in OpenSSL, outside the variant: digest must not */
    if (!linear) rc = report_fail("-mfma -ffp-contract=fast left the linear fingerprint unchanged", NULL);
    if (digest) rc = report_fail("the digest fingerprint changed (it does not run variant code)", NULL);
    if (other_voiding) rc = report_fail("a voiding difference other than reduction fingerprints", NULL);
#else
    (void)linear, (void)digest, (void)other_voiding; /* the FMA variant's checks */
    if (changed || d.voiding)
        rc = report_fail("a rebuild of the same source at the same flags changed the claim", NULL);
#endif
    ls_manifest_diff_free(&d);
    json_decref(pinned);
    ls_test_rm_tmpdir(dir);
    if (!rc) printf("OK\n");
    return rc;
}

START_TEST(test_probe_against_lockstep)
{
    ck_assert_int_eq(verify_against_lockstep(), 0);
}
END_TEST

int main(void)
{
#if LS_PROBE_VARIANT_FMA
#if defined(LS_PROBE_NO_MFMA)
    printf("SKIP: the C compiler does not accept -mfma -ffp-contract=fast; the FMA "
           "contraction case of the reduction fingerprints is not tested here\n");
    return SKIP;
#elif defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("fma")) {
        printf("SKIP: this CPU has no FMA; the FMA contraction case of the reduction "
               "fingerprints is not tested here\n");
        return SKIP;
    }
#endif
#endif
    Suite *s = suite_create("probe_rebuild");
    TCase *tc = tcase_create("probe_rebuild");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_probe_against_lockstep);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
