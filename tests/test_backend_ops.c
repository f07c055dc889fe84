/* Backend conformance through the operator table (tests/backend_ops.h) on
 * the CPU backend with 1 and with 4 worker threads: every operator of
 * ls_backend against its ls_cpu_* reference bit for bit, LS_ORDER_REVERSED
 * included, so the backend glue (views, weight wrapping, thread splits, MoE
 * slot tables, digests) is checked op by op, and the thread count must not
 * change a bit.
 *
 * To keep the run short on a 2-core CI machine this suite uses the quick
 * shape set (ls_bo_config.quick): the lm_head [151936, 2048] and other
 * 2048-wide linears at T = 63 / 65 / 300, the vocabulary-sized embedding, the
 * 4200-slot cache, the 2048 x 512 and E = 512 MoEs and T = 63 / 65 on the
 * 2048-wide GDN and router run only in the GPU suite; here stand-ins with
 * T = 2..9 or 64-wide experts take their place. The vocabulary-wide logprobs
 * (V = 151936), the 512-expert router (T = 1 and 3), and the 700- and
 * 1100-expert routers stay. LS_BACKEND_OPS_FULL=1 runs the full set (several
 * minutes). */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend_ops.h"
#include "testutil.h"

static ls_status cpu_create(void *arg, ls_backend **out, ls_error *err)
{
    return ls_backend_cpu_create((int)(intptr_t)arg, out, err);
}

static const ls_bo_target g_targets[] = {
    {"cpu x1", cpu_create, (void *)(intptr_t)1, 1, 0.0},
    {"cpu x4", cpu_create, (void *)(intptr_t)4, 1, 0.0},
};
static ls_bo_config g_cfg = {1, 0};

START_TEST(test_op)
{
    long fails = ls_bo_run_op(_i, g_targets, 2, &g_cfg);
    ck_assert_msg(fails == 0, "%s: %ld (case, backend) pairs differ from the CPU reference",
                  ls_bo_op_name(_i), fails);
}
END_TEST

int main(void)
{
    const char *full = getenv("LS_BACKEND_OPS_FULL");
    g_cfg.quick = !(full && *full && strcmp(full, "0") != 0);
    g_cfg.small_only = g_cfg.quick && LS_TEST_ASAN;
    Suite *s = suite_create("backend_ops");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_op, 0, ls_bo_op_count());
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}
