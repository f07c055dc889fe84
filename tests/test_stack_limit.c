/* Runs do not depend on `ulimit -s`: every thread lockstep starts gets an
 * explicit stack (core/thread.h) and the CPU operators keep their buffers in
 * per-worker heap scratch. A rollout and a replay under a 128 KiB stack
 * limit, on a checkpoint with Qwen3-Next's head dimensions (d_k = d_v = 128
 * for the gated DeltaNet, 256 for attention), exit 0 with 1, 2 and 4
 * threads and write the same bytes as a run without the limit. */
/* pthread_getattr_np: the build defines _GNU_SOURCE */
#include <check.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/pool.h"
#include "core/thread.h"
#include "testutil.h"

static char *g_dir;

/* Runs lockstep with argv (NULL-terminated, argv[0] ignored) in a child
 * whose RLIMIT_STACK soft limit is stack_kib (0: unchanged), output to
 * g_dir/NAME.log. Returns the exit code, or 128 + signal. Every run hashes
 * the checkpoint itself (--checkpoint-cache off): the hashing threads run
 * under the limit too, and the headers of all runs say the same. */
static int run_limited(long stack_kib, const char *name, char *const argv[])
{
    char log[4300];
    snprintf(log, sizeof log, "%s/%s.log", g_dir, name);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        if (!f || dup2(fileno(stdout), 2) < 0) _exit(126);
        if (stack_kib) {
            struct rlimit rl;
            if (getrlimit(RLIMIT_STACK, &rl) != 0) _exit(126);
            rl.rlim_cur = (rlim_t)stack_kib * 1024;
            if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < rl.rlim_cur) rl.rlim_cur = rl.rlim_max;
            if (setrlimit(RLIMIT_STACK, &rl) != 0) _exit(126);
        }
        execv(LS_CLI_PATH, argv);
        _exit(127);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc != 0) {
        char *out = ls_test_read(log, NULL);
        fprintf(stderr, "lockstep %s (stack %ld KiB): exit %d%s\n%s\n", name, stack_kib, rc,
                WIFSIGNALED(status) ? " (killed by a signal)" : "", out);
        free(out);
    }
    return rc;
}

static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("stack-limit");
    char *o = NULL;
    int rc = ls_test_cli(&o, "synth --preset tiny --seed 11 --config-only --out %s/cfg", g_dir);
    ck_assert_msg(rc == 0, "synth --config-only: %s", o ? o : "");
    free(o);
    char path[4300];
    snprintf(path, sizeof path, "%s/cfg/config.json", g_dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    ck_assert_msg(cfg, "%s: %s", path, je.text);
    /* Qwen3-Next's head dimensions on the tiny model's widths. */
    json_object_set_new(cfg, "linear_key_head_dim", json_integer(128));
    json_object_set_new(cfg, "linear_value_head_dim", json_integer(128));
    json_object_set_new(cfg, "head_dim", json_integer(256));
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    ck_assert_int_eq(json_dump_file(cfg, path, JSON_INDENT(2)), 0);
    json_decref(cfg);
    rc = ls_test_cli(&o, "synth --config %s/config.json --seed 11 --out %s/ck", g_dir, g_dir);
    ck_assert_msg(rc == 0, "synth --config: %s", o ? o : "");
    free(o);
    ls_test_write_text(g_dir, "prompts.jsonl", "{\"id\": 0, \"tokens\": [1, 2, 3, 4, 5, 6, 7]}\n"
                                               "{\"id\": 1, \"tokens\": [40, 41]}\n");
}

static int same_file(const char *a, const char *b)
{
    size_t na, nb;
    char *x = ls_test_read(a, &na), *y = ls_test_read(b, &nb);
    int same = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

START_TEST(test_run_under_small_stack)
{
    setup();
    char ck[4300], prompts[4300], ref[4300], ro[4300], rp[4300], rp_ref[4300], th[8];
    snprintf(ck, sizeof ck, "%s/ck", g_dir);
    snprintf(prompts, sizeof prompts, "%s/prompts.jsonl", g_dir);
    snprintf(ref, sizeof ref, "%s/ref.trace", g_dir);
    snprintf(rp_ref, sizeof rp_ref, "%s/rp-ref.trace", g_dir);
    char *ref_args[] = {"lockstep", "run", "--checkpoint", ck, "--mode", "rollout", "--prompts", prompts,
                        "--max-new-tokens", "5", "--threads", "1", "--checkpoint-cache", "off", "-o", ref, NULL};
    ck_assert_int_eq(run_limited(0, "reference", ref_args), 0);
    char *rp_ref_args[] = {"lockstep", "run", "--checkpoint", ck, "--mode", "replay", "--from", ref,
                           "--chunk", "3", "--checkpoint-cache", "off", "-o", rp_ref, NULL};
    ck_assert_int_eq(run_limited(0, "reference-replay", rp_ref_args), 0);
    static const int threads[] = {1, 2, 4};
    for (size_t i = 0; i < sizeof threads / sizeof threads[0]; i++) {
        snprintf(th, sizeof th, "%d", threads[i]);
        snprintf(ro, sizeof ro, "%s/ro-%d.trace", g_dir, threads[i]);
        snprintf(rp, sizeof rp, "%s/rp-%d.trace", g_dir, threads[i]);
        char *ro_args[] = {"lockstep", "run", "--checkpoint", ck, "--mode", "rollout", "--prompts", prompts,
                           "--max-new-tokens", "5", "--threads", th, "--checkpoint-cache", "off", "-o", ro, NULL};
        int rc = run_limited(128, "rollout", ro_args);
        ck_assert_msg(rc == 0, "rollout under ulimit -s 128 with %d threads: exit %d", threads[i], rc);
        ck_assert_msg(same_file(ro, ref), "%d threads under ulimit -s 128: the trace differs", threads[i]);
        char *rp_args[] = {"lockstep", "run", "--checkpoint", ck, "--mode", "replay", "--from", ro, "--chunk", "3",
                           "--threads", th, "--checkpoint-cache", "off", "-o", rp, NULL};
        rc = run_limited(128, "replay", rp_args);
        ck_assert_msg(rc == 0, "replay under ulimit -s 128 with %d threads: exit %d", threads[i], rc);
        ck_assert_msg(same_file(rp, rp_ref), "replay with %d threads under ulimit -s 128: the trace differs",
                      threads[i]);
    }
}
END_TEST

/* The pool's workers have the stack core/thread.h asks for, whatever the
 * process's limit says. */
static void stack_size_of(void *ctx, int thread, long b, long e)
{
    (void)b;
    (void)e;
    size_t *sizes = ctx;
    pthread_attr_t a;
    if (pthread_getattr_np(pthread_self(), &a) == 0) {
        pthread_attr_getstacksize(&a, &sizes[thread]);
        pthread_attr_destroy(&a);
    }
}

START_TEST(test_pool_worker_stack)
{
    struct rlimit old, rl;
    ck_assert_int_eq(getrlimit(RLIMIT_STACK, &old), 0);
    rl = old;
    rl.rlim_cur = 128 * 1024;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < rl.rlim_cur) rl.rlim_cur = rl.rlim_max;
    ck_assert_int_eq(setrlimit(RLIMIT_STACK, &rl), 0); /* the default for threads created from now on */
    ls_pool *p = NULL;
    ls_error err;
    ck_assert_msg(ls_pool_create(3, &p, &err) == LS_OK, "%s", err.msg);
    size_t sizes[3] = {0, 0, 0};
    ls_pool_run(p, 3, stack_size_of, sizes);
    ls_pool_destroy(p);
    ck_assert_int_eq(setrlimit(RLIMIT_STACK, &old), 0);
    for (int t = 1; t < 3; t++)
        ck_assert_msg(sizes[t] >= LS_THREAD_STACK_BYTES, "worker %d: stack of %zu bytes, expected >= %zu", t,
                      sizes[t], LS_THREAD_STACK_BYTES);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("stack_limit");
    TCase *tc = tcase_create("stack_limit");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_pool_worker_stack);
    tcase_add_test(tc, test_run_under_small_stack);
    suite_add_tcase(s, tc);
    int failed = ls_test_run_suite(s, 1);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    return failed ? 1 : 0;
}
