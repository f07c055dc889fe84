/* CUDA engines as ranks of one run (docs/parallel.md §1, §3): `lockstep run
 * --backend cuda` with --ep 2, --tp 2, --tp 2 --ep 2, --afd 1:1 and --afd
 * 2:2, every rank a process with its own CUDA backend, the rows they
 * exchange staged through host memory over the CPU communicator.
 *
 * On synthetic checkpoints (Qwen3-Next tiny, Qwen3.5 tiny, Qwen3.5 tiny FP8
 * in both --fp8 modes), a seeded rollout on every topology and the chunked
 * replay (chunks of 3) of the one-rank CPU rollout on it equal the one-rank
 * CPU rollout under `lockstep compare`: every token, logprob and digest
 * (records, layer digests, KV rows, carried states) bit for bit. The
 * CLI-level `--backend cuda --tp 2` trace equals `--backend cpu --tp 2`'s, and
 * so does a synth: spec's on one CUDA rank and on TP2 ranks. A
 * CUDA worker killed mid-run makes the run exit 2 naming it, with no trace.
 * Through the library (ls_run_execute in a process that has not touched
 * CUDA) --ep 2 gives the same trace; a process that has touched CUDA is
 * refused a run of several CUDA ranks (their forks could not use it).
 *
 * Every CUDA run happens in a process of its own (the CLI, or a fork of
 * this test taken before it touches CUDA): a CUDA context does not survive
 * a fork, so this process never calls CUDA itself, and asks a child whether
 * a GPU is present. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend_cuda.h"
#include "run/load.h"
#include "run/ranks.h"
#include "run/run.h"
#include "testutil.h"

#define LS_GPU_SKIP 77

static char *g_dir;

#define N_CASES 4
static const char *const g_model[N_CASES] = {"tiny", "q35", "q35fp8", "q35fp8"};
static const char *const g_fp8[N_CASES] = {"", "", " --fp8 dequant", " --fp8 w8a8"};

#define N_TOPO 5
static const char *const g_topo[N_TOPO] = {"--ep 2", "--tp 2", "--tp 2 --ep 2", "--afd 1:1", "--afd 2:2"};

static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("ranks_cuda");
    ls_test_synth_rank_models(g_dir);
    /* prompts of 1, 7, 12, 19 and 30 tokens: several prefill steps at 24 rows */
    static const int lens[] = {1, 7, 12, 19, 30};
    ls_test_write_prompts(g_dir, lens, 5, 0x9E3779B97F4A7C15ull, 1000);
}

/* `compare A B` passes: every sequence bitwise equal. */
static void expect_equal(const char *a, const char *b)
{
    ls_test_expect_traces_equal(g_dir, a, b, 5);
}

static void expect_no_file(const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    ck_assert_msg(!f, "%s exists after a failed run", path);
}

/* Every topology on CUDA ranks against the one-rank CPU rollout: the rollout
 * and the chunked replay of the CPU rollout. */
START_TEST(test_cuda_ranks_equal_cpu)
{
    const char *mod = g_model[_i], *fp8 = g_fp8[_i];
    char full[1024], ref[64], name[64];
    snprintf(full, sizeof full, "--checkpoint %s/%s --mode rollout --prompts %s/prompts.jsonl%s --max-new-tokens 6 "
             "--sampling seeded --seed 3 --state-digest-every 4 --max-rows 24", g_dir, mod, g_dir, fp8);
    snprintf(ref, sizeof ref, "c%d-cpu.trace", _i);
    char *out = NULL;
    int rc = ls_test_cli(&out, "run %s --backend cpu -o %s/%s", full, g_dir, ref);
    ck_assert_msg(rc == 0, "%s: exit %d\n%s", ref, rc, out ? out : "");
    free(out);
    for (int t = 0; t < N_TOPO; t++) {
        snprintf(name, sizeof name, "c%d-cuda-t%d.trace", _i, t);
        rc = ls_test_cli(&out, "run %s --backend cuda %s -o %s/%s", full, g_topo[t], g_dir, name);
        ck_assert_msg(rc == 0, "%s%s %s: exit %d\n%s", mod, fp8, g_topo[t], rc, out ? out : "");
        free(out);
        expect_equal(ref, name);
        snprintf(name, sizeof name, "c%d-cuda-p%d.trace", _i, t);
        rc = ls_test_cli(&out, "run --checkpoint %s/%s --mode replay --from %s/%s --chunk 3 --max-rows 24 "
                         "--backend cuda %s -o %s/%s", g_dir, mod, g_dir, ref, g_topo[t], g_dir, name);
        ck_assert_msg(rc == 0, "%s%s %s replay: exit %d\n%s", mod, fp8, g_topo[t], rc, out ? out : "");
        free(out);
        expect_equal(ref, name);
        printf("  ok %s%s %s on cuda ranks = one cpu rank (rollout, replay in chunks of 3)\n", mod, fp8,
               g_topo[t]);
        fflush(stdout);
    }
}
END_TEST

/* The same topology on both backends, from the command line: equal traces,
 * the topology recorded alike. */
START_TEST(test_cli_tp2_cuda_equals_cpu)
{
    const char *be[2] = {"cpu", "cuda"};
    for (int b = 0; b < 2; b++) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "run --checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl "
                             "--max-new-tokens 5 --sampling seeded --seed 4 --backend %s --tp 2 -o %s/tp2-%s.trace",
                             g_dir, g_dir, be[b], g_dir, be[b]);
        ck_assert_msg(rc == 0, "--backend %s --tp 2: exit %d\n%s", be[b], rc, out ? out : "");
        free(out);
    }
    expect_equal("tp2-cpu.trace", "tp2-cuda.trace");
}
END_TEST

/* A synthetic checkpoint generated in memory (--checkpoint synth:...): on
 * one CUDA rank and on TP2 CUDA ranks, every rank generating its share of
 * the matrices on its device with lockstep synth's values, the trace equals
 * the one-rank CPU trace of the written checkpoint. */
START_TEST(test_synth_spec_cuda)
{
    static const char *const spec[2][2] = {{"tiny", "synth:tiny,seed=5"}, {"q35fp8", "synth:qwen3.5-tiny,seed=7,fp8"}};
    static const char *const topo[2] = {"", "--tp 2"};
    for (int i = 0; i < 2; i++) {
        char common[512], ref[64], name[64];
        snprintf(common, sizeof common, "--mode rollout --prompts %s/prompts.jsonl --max-new-tokens 5 --sampling "
                 "seeded --seed 9 --max-rows 24", g_dir);
        snprintf(ref, sizeof ref, "syn%d-cpu.trace", i);
        char *out = NULL;
        int rc = ls_test_cli(&out, "run --checkpoint %s/%s %s --backend cpu -o %s/%s", g_dir, spec[i][0], common,
                             g_dir, ref);
        ck_assert_msg(rc == 0, "%s: exit %d\n%s", ref, rc, out ? out : "");
        free(out);
        for (int t = 0; t < 2; t++) {
            snprintf(name, sizeof name, "syn%d-cuda%d.trace", i, t);
            rc = ls_test_cli(&out, "run --checkpoint %s %s --backend cuda %s -o %s/%s", spec[i][1], common, topo[t],
                             g_dir, name);
            ck_assert_msg(rc == 0, "%s %s: exit %d\n%s", spec[i][1], topo[t], rc, out ? out : "");
            free(out);
            expect_equal(ref, name);
            printf("  ok %s %s on cuda = the written checkpoint on one cpu rank\n", spec[i][1], topo[t]);
            fflush(stdout);
        }
    }
}
END_TEST

/* --afd 2:2 --afd-balance on CUDA ranks: the one-rank trace, and a report
 * with a row per decoder layer in which every rank was busy (its times the
 * device's: each timed span ends at a download, which waits for it). */
START_TEST(test_afd_balance_cuda)
{
    char *out = NULL;
    const char *common = "--mode rollout --max-new-tokens 4 --max-rows 24";
    int rc = ls_test_cli(&out, "run --checkpoint %s/tiny --prompts %s/prompts.jsonl %s -o %s/bal-cpu.trace", g_dir,
                         g_dir, common, g_dir);
    ck_assert_msg(rc == 0, "%s", out ? out : "");
    free(out);
    rc = ls_test_cli(&out, "run --checkpoint %s/tiny --prompts %s/prompts.jsonl %s --backend cuda --afd 2:2 "
                     "--afd-balance %s/bal.json -o %s/bal-cuda.trace", g_dir, g_dir, common, g_dir, g_dir);
    ck_assert_msg(rc == 0 && strstr(out, "afd balance: mixers"), "exit %d\n%s", rc, out ? out : "");
    free(out);
    expect_equal("bal-cpu.trace", "bal-cuda.trace");
    char path[4200];
    snprintf(path, sizeof path, "%s/bal.json", g_dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    ck_assert_msg(root, "%s: %s", path, je.text);
    ck_assert_str_eq(json_string_value(json_object_get(root, "backend")), "cuda");
    json_t *layers = json_object_get(root, "layers");
    ck_assert_uint_eq(json_array_size(layers), 4);
    for (size_t l = 0; l < 4; l++) {
        json_t *r = json_array_get(layers, l), *fb = json_object_get(r, "ffn_ranks_busy_s");
        ck_assert(json_real_value(json_object_get(r, "attention_rank_busy_s")) > 0);
        ck_assert_uint_eq(json_array_size(fb), 2);
        for (size_t f = 0; f < 2; f++) ck_assert(json_real_value(json_array_get(fb, f)) > 0);
    }
    json_decref(root);
    printf("  ok --afd 2:2 --afd-balance on cuda ranks\n");
}
END_TEST

/* A CUDA worker killed at its third step: exit 2 naming it, no trace. */
START_TEST(test_cuda_worker_killed)
{
    char *out = NULL;
    int rc = ls_test_sh(&out, "LOCKSTEP_TEST_RANK_FAULT=1:3:kill timeout -s KILL 120 '%s' run --checkpoint %s/tiny "
                        "--mode rollout --prompts %s/prompts.jsonl --max-new-tokens 6 --max-rows 24 --backend cuda "
                        "--tp 2 --rank-timeout 5000 -o %s/killed.trace 2>&1", LS_CLI_PATH, g_dir, g_dir, g_dir);
    ck_assert_msg(rc == 2 && out && strstr(out, "rank 1 was killed by signal 9"), "exit %d\n%s", rc,
                  out ? out : "");
    free(out);
    expect_no_file("killed.trace");
}
END_TEST

/* ls_run_execute of --ep 2 on cuda in a child; `touch` first makes the
 * child call into CUDA before it. Returns the child's status and message
 * (through a pipe). */
static ls_status lib_run(int touch, const char *out_name, char *msg, size_t n)
{
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fd[0]);
        ls_error err;
        ls_error_clear(&err);
        char prompts[4200], path[4200], ck[4200];
        snprintf(prompts, sizeof prompts, "%s/prompts.jsonl", g_dir);
        snprintf(path, sizeof path, "%s/%s", g_dir, out_name);
        snprintf(ck, sizeof ck, "%s/tiny", g_dir);
        ls_run_batch b = {0, NULL};
        ls_status st = ls_run_load_prompts(prompts, 0, &b, &err);
        ls_run_spec s;
        ls_run_spec_default(&s);
        s.checkpoint = ck;
        s.mode = "rollout";
        s.max_new = 5;
        s.backend = "cuda";
        s.ep = 2;
        s.out = path;
        s.batch = &b;
        if (touch) (void)ls_backend_cuda_device_count();
        ls_run_result res;
        if (st == LS_OK) st = ls_run_execute(&s, &res, &err);
        if (st == LS_OK) free(res.completions);
        ls_run_batch_free(&b);
        char line[600];
        int len = snprintf(line, sizeof line, "%d %s", (int)st, err.msg);
        if (write(fd[1], line, (size_t)len) != len) _exit(3);
        _exit(0);
    }
    close(fd[1]);
    char line[600] = "";
    ssize_t got = 0, r;
    while ((r = read(fd[0], line + got, sizeof line - 1 - (size_t)got)) > 0) got += r;
    close(fd[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "library run child: wait status %d", status);
    int st = -1, used = 0;
    ck_assert_msg(sscanf(line, "%d %n", &st, &used) == 1, "library run child said '%s'", line);
    snprintf(msg, n, "%s", line + used);
    return (ls_status)st;
}

START_TEST(test_library_ranks)
{
    char msg[600];
    ls_status st = lib_run(0, "lib-ep2.trace", msg, sizeof msg);
    ck_assert_msg(st == LS_OK, "ls_run_execute --ep 2 on cuda: %s", msg);
    char *out = NULL;
    int rc = ls_test_cli(&out, "run --checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl "
                         "--max-new-tokens 5 --backend cpu -o %s/lib-cpu.trace", g_dir, g_dir, g_dir);
    ck_assert_msg(rc == 0, "exit %d\n%s", rc, out ? out : "");
    free(out);
    expect_equal("lib-cpu.trace", "lib-ep2.trace");
    /* a process that already called CUDA cannot fork CUDA ranks: refused */
    st = lib_run(1, "lib-touched.trace", msg, sizeof msg);
    ck_assert_msg(st == LS_E_UNSUPPORTED && strstr(msg, "this process already has"), "status %d: %s", (int)st,
                  msg);
    expect_no_file("lib-touched.trace");
    printf("  ok a process that touched CUDA is refused: %s\n", msg);
}
END_TEST

int main(void)
{
    if (ls_run_ranks_cuda_devices() < 1) { /* asked in a child: this process stays CUDA-free */
        printf("SKIP: no CUDA device%s\n", ls_backend_cuda_built() ? "" : " (built without CUDA)");
        return LS_GPU_SKIP;
    }
    Suite *s = suite_create("gpu_ranks");
    TCase *tc = tcase_create("ranks");
    tcase_set_timeout(tc, 1800);
    tcase_add_unchecked_fixture(tc, setup, NULL);
    tcase_add_loop_test(tc, test_cuda_ranks_equal_cpu, 0, N_CASES);
    tcase_add_test(tc, test_cli_tp2_cuda_equals_cpu);
    tcase_add_test(tc, test_synth_spec_cuda);
    tcase_add_test(tc, test_afd_balance_cuda);
    tcase_add_test(tc, test_cuda_worker_killed);
    tcase_add_test(tc, test_library_ranks);
    suite_add_tcase(s, tc);
    /* without fork: the library test's children must be forks of a process
     * that never touched CUDA, and every other CUDA run is a CLI process */
    return ls_test_run_suite(s, 1) ? EXIT_FAILURE : EXIT_SUCCESS;
}
