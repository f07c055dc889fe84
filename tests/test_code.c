/* The build's code-digest table (src/code/code.h): every provider row of
 * every backend this build holds resolves to machine code, every __global__
 * kernel of the kernel sources (kernels/) was extracted (SASS and PTX), a
 * row's digest follows the documented rule, and a pinned manifest records it
 * per operator, outside the claim digest, with an informational diff and a
 * warning. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/providers.h"
#include "code/code.h"
#include "fingerprint/sha256.h"
#include "manifest/manifest.h"
#include "testutil.h"

static int is_hex64(const char *s)
{
    if (!s || strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

START_TEST(test_table_well_formed)
{
    size_t n;
    const ls_code_entry *t = ls_code_list(&n);
    size_t cpu = 0, cuda = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(!strcmp(t[i].backend, "cpu") || !strcmp(t[i].backend, "cuda"),
                      "entry %zu: backend %s", i, t[i].backend);
        if (i) {
            int c = strcmp(t[i - 1].backend, t[i].backend);
            ck_assert_msg(c < 0 || (c == 0 && strcmp(t[i - 1].name, t[i].name) < 0),
                          "entries %zu and %zu (%s %s, %s %s) not sorted or duplicated", i - 1, i,
                          t[i - 1].backend, t[i - 1].name, t[i].backend, t[i].name);
        }
        if (!strcmp(t[i].backend, "cpu")) {
            cpu++;
            ck_assert_msg(is_hex64(t[i].sha256) && !t[i].ptx_sha256, "cpu %s: digests", t[i].name);
        } else if (t[i].sha256) {
            cuda++;
            ck_assert_msg(is_hex64(t[i].sha256) && is_hex64(t[i].ptx_sha256) && t[i].instances >= 1,
                          "cuda %s: expected SASS and PTX digests", t[i].name);
        } else {
            ck_assert_msg(!t[i].ptx_sha256 && t[i].instances == 0, "cuda helper %s", t[i].name);
        }
    }
    ck_assert_msg(cpu >= 20, "only %zu CPU functions in the table", cpu);
#ifdef LOCKSTEP_HAVE_CUDA
    ck_assert_msg(cuda >= 20, "only %zu CUDA kernels in the table", cuda);
#else
    ck_assert_msg(cuda == 0, "%zu CUDA kernels in a build without CUDA", cuda);
#endif
    /* distinct functions have distinct code */
    const ls_code_entry *a = ls_code_find("cpu", "ls_cpu_rmsnorm");
    const ls_code_entry *b = ls_code_find("cpu", "ls_cpu_logprobs");
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_str_ne(a->sha256, b->sha256);
}
END_TEST

/* Every row of the registry, fp8 and chunk-aligned GDN rows included,
 * resolves on every backend this build has code for: no row without a code
 * digest. */
static void check_rows(const char *backend, const ls_provider *rows, size_t n, const char *what)
{
    ck_assert_msg(rows && n > 0, "%s %s: no rows", backend, what);
    for (size_t i = 0; i < n; i++) {
        ls_error err;
        ls_error_clear(&err);
        char hex[65];
        ck_assert_msg(ls_code_digest(backend, rows[i].kernel_id, hex, &err) == LS_OK,
                      "%s %s row %s: %s", backend, what, rows[i].op, err.msg);
        ck_assert_msg(is_hex64(hex), "%s row %s: digest '%s'", backend, rows[i].op, hex);
    }
}

START_TEST(test_every_provider_resolves)
{
    const char *backends[] = {"cpu",
#ifdef LOCKSTEP_HAVE_CUDA
                              "cuda",
#endif
                              NULL};
    for (int b = 0; backends[b]; b++) {
        size_t n;
        const ls_provider *rows = ls_backend_list_providers(backends[b], &n);
        check_rows(backends[b], rows, n, "strict");
        rows = ls_backend_list_fp8_providers(backends[b], "dequant", &n);
        check_rows(backends[b], rows, n, "fp8 dequant");
        rows = ls_backend_list_fp8_providers(backends[b], "w8a8", &n);
        check_rows(backends[b], rows, n, "fp8 w8a8");
        check_rows(backends[b], ls_backend_gdn_chunked_provider(backends[b], LS_TIER_PORTABLE), 1,
                   "gdn chunk-aligned");
        for (int t = LS_TIER_TC; t <= LS_TIER_FAST && b > 0; t++) {
            check_rows(backends[b], ls_backend_gdn_chunked_provider(backends[b], (ls_tier)t), 1, "gdn chunk-aligned, tier");
            rows = ls_backend_tier_providers(backends[b], (ls_tier)t, &n);
            check_rows(backends[b], rows, n, "tier");
        }
    }
}
END_TEST

/* Every __global__ kernel the sources define was found in the objects. */
START_TEST(test_every_kernel_extracted)
{
#ifdef LOCKSTEP_HAVE_CUDA
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/kernels", LS_SOURCE_DIR);
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int kernels = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t ln = strlen(e->d_name);
        if (ln < 3 || strcmp(e->d_name + ln - 3, ".cu") != 0) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        ck_assert_ptr_nonnull(f);
        char line[4096];
        int pending = 0; /* "__global__" seen, name on this or a later line */
        while (fgets(line, sizeof line, f)) {
            const char *g = strstr(line, "__global__");
            if (g && !strstr(line, "/*")) pending = 1;
            if (!pending) continue;
            const char *p = strstr(g ? g : line, "ls_");
            const char *q = p ? strchr(p, '(') : NULL;
            if (!p || !q) continue;
            pending = 0;
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(q - p), p);
            const ls_code_entry *c = ls_code_find("cuda", name);
            ck_assert_msg(c && c->sha256 && c->ptx_sha256, "%s: kernel %s has no code digest",
                          e->d_name, name);
            kernels++;
        }
        fclose(f);
    }
    closedir(d);
    ck_assert_msg(kernels >= 20, "found only %d kernels in the kernel sources", kernels);
#endif
}
END_TEST

static void expect_digest(const char *backend, const char *id, char hex[65])
{
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_code_digest(backend, id, hex, &err) == LS_OK, "'%s': %s", id, err.msg);
}

START_TEST(test_row_digest_rule)
{
    /* the documented rule, recomputed: SHA-256 over backend, then per named
     * function in name order: name, digest, PTX digest ("" on the CPU) */
    const ls_code_entry *a = ls_code_find("cpu", "ls_cpu_rope_apply");
    const ls_code_entry *b = ls_code_find("cpu", "ls_cpu_rope_table");
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    char buf[1024];
    size_t n = 0;
    const char *parts[] = {"cpu", a->name, a->sha256, "", b->name, b->sha256, ""};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        memcpy(buf + n, parts[i], strlen(parts[i]) + 1);
        n += strlen(parts[i]) + 1;
    }
    ls_digest d;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_int_eq(ls_sha256_buf(buf, n, &d, &err), LS_OK);
    char want[65], got[65], other[65];
    ls_digest_to_hex(&d, want);
    expect_digest("cpu", "ls_cpu_rope_table+ls_cpu_rope_apply", got);
    ck_assert_str_eq(got, want);
    /* order, repetition and prose do not matter */
    expect_digest("cpu", "ls_cpu_rope_apply, then ls_cpu_rope_table (twice: ls_cpu_rope_apply)", got);
    ck_assert_str_eq(got, want);
    /* another function set gives another digest */
    expect_digest("cpu", "ls_cpu_rope_apply", other);
    ck_assert_str_ne(other, want);
    /* a name the table lacks fails, naming it */
    ck_assert_int_eq(ls_code_digest("cpu", "ls_cpu_rope_apply+ls_cpu_no_such_fn", got, &err),
                     LS_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "ls_cpu_no_such_fn") != NULL, "%s", err.msg);
    /* prose alone names no code */
    ck_assert_int_eq(ls_code_digest("cpu", "OpenSSL EVP", got, &err), LS_E_UNSUPPORTED);
    /* a backend's names resolve only in its own table */
    ck_assert_int_eq(ls_code_digest("tpu", "ls_cpu_rope_apply", got, &err), LS_E_UNSUPPORTED);
#ifdef LOCKSTEP_HAVE_CUDA
    /* an inlined helper adds nothing: its code is in the kernels that call it */
    char k[65], kh[65];
    expect_digest("cuda", "ls_fp8_quant_kernel", k);
    expect_digest("cuda", "ls_fp8_quant_kernel (ls_fp8_quant_group)", kh);
    ck_assert_str_eq(k, kh);
    ck_assert_int_eq(ls_code_digest("cuda", "ls_fp8_quant_group", got, &err), LS_E_UNSUPPORTED);
#endif
}
END_TEST

/* A pinned manifest records each row's digest; changing it is informational,
 * leaves the claim digest alone, and diff warns naming the operator. */
START_TEST(test_manifest_records_code)
{
    char *tmp = ls_test_tmpdir("code");
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "synth --preset tiny --seed 3 --out %s/ck", tmp), 0);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint %s/ck -o %s/a.json", tmp, tmp), 0);
    free(out);
    char path[4096];
    snprintf(path, sizeof path, "%s/a.json", tmp);
    json_t *m;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_manifest_load(path, &m, &err) == LS_OK, "%s", err.msg);
    json_t *ops = json_object_get(json_object_get(m, "numerics"), "operators");
    const char *op;
    json_t *row;
    size_t rows = 0;
    json_object_foreach(ops, op, row) {
        char want[65];
        expect_digest("cpu", json_string_value(json_object_get(row, "kernel_id")), want);
        const char *have = json_string_value(json_object_get(row, "code_sha256"));
        ck_assert_msg(have && !strcmp(have, want), "operator %s: code_sha256 %s, expected %s", op,
                      have ? have : "(absent)", want);
        rows++;
    }
    ck_assert_uint_gt(rows, 10);
    ls_digest d1, d2;
    ck_assert_int_eq(ls_manifest_digest(m, &d1, &err), LS_OK);
    json_object_set_new(json_object_get(ops, "rmsnorm"), "code_sha256",
                        json_string("00000000000000000000000000000000000000000000000000000000000000ff"));
    ck_assert_int_eq(ls_manifest_digest(m, &d2, &err), LS_OK);
    ck_assert_msg(ls_digest_equal(&d1, &d2), "code_sha256 entered the claim digest");
    snprintf(path, sizeof path, "%s/b.json", tmp);
    ck_assert_int_eq(ls_manifest_save(m, path, &err), LS_OK);
    json_decref(m);
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s/a.json %s/b.json", tmp, tmp), 0);
    ck_assert_msg(strstr(out, "informational numerics.operators.rmsnorm.code_sha256") != NULL,
                  "%s", out);
    ck_assert_msg(strstr(out, "warning: kernel code changed for 1 operator: rmsnorm") != NULL,
                  "%s", out);
    free(out);
    /* malformed: not 64 hex digits */
    ck_assert_int_eq(ls_test_sh(&out, "sed 's/\"code_sha256\": \"0*ff\"/\"code_sha256\": \"xyz\"/' "
                                "%s/b.json > %s/c.json", tmp, tmp), 0);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s/a.json %s/c.json", tmp, tmp), 2);
    ck_assert_msg(strstr(out, "numerics.operators.rmsnorm.code_sha256") != NULL, "%s", out);
    free(out);
    ls_test_rm_tmpdir(tmp);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("code");
    TCase *tc = tcase_create("code");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_table_well_formed);
    tcase_add_test(tc, test_every_provider_resolves);
    tcase_add_test(tc, test_every_kernel_extracted);
    tcase_add_test(tc, test_row_digest_rule);
    tcase_add_test(tc, test_manifest_records_code);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}
