/* The portable tier's CPU = CUDA claim, per operator: the CUDA backend's
 * reduction fingerprints (src/probe) equal the CPU reference's for every
 * operator row, FP8 rows of both modes and the chunk-aligned GDN row
 * (gdn_chunked) included. Prints the table and the probe times. SKIP (77)
 * without a GPU. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/backend_cuda.h"
#include "gpu_testutil.h"
#include "probe/probe.h"

static void probe(int cuda, const char *fp8, ls_probe_table *t)
{
    ls_error err;
    ls_error_clear(&err);
    ls_backend *be;
    if (cuda)
        ck_assert_msg(ls_backend_cuda_create((size_t)256 << 20, &be, &err) == LS_OK, "%s", err.msg);
    else
        ck_assert_msg(ls_backend_cpu_create(4, &be, &err) == LS_OK, "%s", err.msg);
    ls_probe_opts o = {cuda ? "cuda" : "cpu", fp8, NULL, 1};
    ck_assert_msg(ls_probe_run(be, &o, t, &err) == LS_OK, "%s", err.msg);
    be->destroy(be);
}

START_TEST(test_cuda_fingerprints_equal_cpu)
{
    static const char *const modes[] = {"dequant", "w8a8"};
    int differ = 0, rows = 0;
    printf("%-15s %-8s %-18s %-18s %s\n", "operator", "fp8", "cpu", "cuda", "");
    for (int m = 0; m < 2; m++) {
        ls_probe_table c, g;
        probe(0, modes[m], &c);
        probe(1, modes[m], &g);
        probe(1, modes[m], &g); /* the second CUDA run: warm, the time a pin pays */
        for (size_t i = 0; i < g.count; i++) {
            const ls_op_fingerprint *f = ls_probe_find(&c, g.rows[i].op);
            ck_assert_msg(f != NULL, "operator %s: CUDA row without a CPU row", g.rows[i].op);
            int same = !strcmp(f->sha256, g.rows[i].sha256);
            /* the non-FP8 rows are the same in both modes: printed once */
            int fp8row = strstr(g.rows[i].op, "fp8") != NULL;
            if (m == 0 || fp8row)
                printf("%-15s %-8s %.16s.. %.16s.. %s\n", g.rows[i].op, fp8row ? modes[m] : "-",
                       f->sha256, g.rows[i].sha256, same ? "equal" : "DIFFERENT");
            differ += !same;
            rows++;
        }
        ck_assert_uint_eq(c.count, g.count);
        printf("fp8 %s: CPU probe %.1f ms, CUDA probe %.1f ms (%zu rows)\n", modes[m],
               c.seconds * 1e3, g.seconds * 1e3, g.count);
    }
    fflush(stdout);
    ck_assert_msg(differ == 0, "%d of %d operator fingerprints differ between CPU and CUDA",
                  differ, rows);
}
END_TEST

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
    Suite *s = suite_create("probe_cuda");
    TCase *tc = tcase_create("probe_cuda");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_cuda_fingerprints_equal_cpu);
    suite_add_tcase(s, tc);
    return ls_gpu_run_suite(s);
}
