/* Several ranks from the command line (docs/parallel.md §1, run/ranks.h):
 * `lockstep run --ep N` starts N processes joined by the CPU communicator,
 * rank 0 writing the trace.
 *
 * On synthetic checkpoints (Qwen3-Next tiny, Qwen3.5 tiny, Qwen3.5 tiny FP8
 * with w8a8 experts), the traces of --ep 2 and --ep 4 equal --ep 1's under
 * `lockstep compare` (every record and digest), for a seeded rollout, a
 * GRPO rollout with prefix reuse and preemption, and a chunked replay; the
 * header records the topology and the manifest digest is the one-rank run's.
 * `manifest pin --ep` records it; `manifest diff` calls EP1 against EP2
 * informational for strict manifests and voiding for fast ones; `gate --ep 2`
 * replays an expert-parallel rollout on one rank. Refusals
 * (experts not divisible, the cuda backend, --tp, --rank-timeout with one
 * rank) exit 2 naming the flag. A worker that is killed, exits or hangs
 * mid-run makes every process end non-zero within a bounded time, naming the
 * rank, with no trace and no temporary file left. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "testutil.h"

static char *g_dir;

#define N_MODELS 3
static const char *const g_model[N_MODELS] = {"tiny", "q35", "q35fp8"};

static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("ranks");
    char *out = NULL;
    ck_assert_msg(ls_test_cli(&out, "synth --preset tiny --seed 5 --out %s/tiny", g_dir) == 0, "%s", out);
    free(out);
    ck_assert_msg(ls_test_cli(&out, "synth --preset qwen3.5-tiny --seed 6 --out %s/q35", g_dir) == 0, "%s", out);
    free(out);
    ck_assert_msg(ls_test_cli(&out, "synth --preset qwen3.5-tiny --fp8 --seed 7 --out %s/q35fp8", g_dir) == 0,
                  "%s", out);
    free(out);
    /* prompts of 1, 7, 12, 19 and 30 tokens: several prefill steps at 24 rows */
    static const int lens[] = {1, 7, 12, 19, 30};
    char path[4200];
    snprintf(path, sizeof path, "%s/prompts.jsonl", g_dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int s = 0; s < 5; s++) {
        fprintf(f, "{\"id\": %d, \"tokens\": [", s);
        for (int i = 0; i < lens[s]; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            fprintf(f, "%s%d", i ? ", " : "", (int)((x >> 33) % 1000));
        }
        fprintf(f, "]}\n");
    }
    fclose(f);
}

static void teardown(void) {}

/* `compare A B` passes: every sequence bitwise equal. */
static void expect_equal(const char *a, const char *b)
{
    char *out = NULL;
    int rc = ls_test_cli(&out, "compare %s/%s %s/%s", g_dir, a, g_dir, b);
    ck_assert_msg(rc == 0 && out && strstr(out, "PASS: 5/5 sequences bitwise equal"), "%s vs %s: exit %d\n%s", a, b,
                  rc, out ? out : "");
    free(out);
}

/* The trace's header holds `needle` (the header is JSON text near the start). */
static int header_has(const char *name, const char *needle)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    size_t n = 0;
    char *buf = ls_test_read(path, &n);
    ck_assert_ptr_nonnull(buf);
    size_t lim = n < 65536 ? n : 65536, k = strlen(needle);
    int found = 0;
    for (size_t i = 0; i + k <= lim && !found; i++) found = memcmp(buf + i, needle, k) == 0;
    free(buf);
    return found;
}

START_TEST(test_ep_equals_one_rank)
{
    int m = _i;
    const char *mod = g_model[m];
    const char *fp8 = m == 2 ? " --fp8 w8a8" : "";
    char name[64], ref[64], rep[64], full[1024];
    for (int ep = 1; ep <= 4; ep *= 2) {
        snprintf(name, sizeof name, "%s-r%d.trace", mod, ep);
        snprintf(full, sizeof full, "--checkpoint %s/%s --mode rollout --prompts %s/prompts.jsonl%s "
                 "--max-new-tokens 6 --sampling seeded --seed 3 --state-digest-every 4", g_dir, mod, g_dir, fp8);
        char *out = NULL;
        int rc = ls_test_cli(&out, "run %s --max-rows 24 --ep %d -o %s/%s", full, ep, g_dir, name);
        ck_assert_msg(rc == 0, "%s: exit %d\n%s", name, rc, out ? out : "");
        free(out);
        if (ep > 1) {
            snprintf(ref, sizeof ref, "%s-r1.trace", mod);
            expect_equal(ref, name);
            char topo[128];
            snprintf(topo, sizeof topo, "\"topology\":{\"afd\":null,\"communicator\":\"cpu-socket\",\"ep\":%d,\"tp\":1}",
                     ep);
            ck_assert_msg(header_has(name, topo), "%s: run_params lacks %s", name, topo);
        } else {
            ck_assert_msg(!header_has(name, "\"topology\""), "%s: a one-rank trace records no topology", name);
        }
    }
    /* the replay of the one-rank rollout, in chunks of 3, on 1, 2 and 4 ranks */
    snprintf(ref, sizeof ref, "%s-r1.trace", mod);
    for (int ep = 1; ep <= 4; ep *= 2) {
        snprintf(rep, sizeof rep, "%s-p%d.trace", mod, ep);
        char *out = NULL;
        int rc = ls_test_cli(&out, "run --checkpoint %s/%s --mode replay --from %s/%s --chunk 3 --max-rows 24 "
                             "--ep %d -o %s/%s", g_dir, mod, g_dir, ref, ep, g_dir, rep);
        ck_assert_msg(rc == 0, "%s: exit %d\n%s", rep, rc, out ? out : "");
        free(out);
        expect_equal(ref, rep);
        if (ep > 1) {
            snprintf(name, sizeof name, "%s-p1.trace", mod);
            expect_equal(name, rep);
        }
    }
}
END_TEST

START_TEST(test_ep_grouped_rollout)
{
    /* GRPO samples, prefix reuse and preemption take the same steps on every rank */
    for (int ep = 1; ep <= 2; ep++) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "run --checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl "
                             "--max-new-tokens 5 --sampling seeded --seed 9 --samples-per-prompt 2 --prefix-cache any "
                             "--preempt seeded:4 --kv-page 4 --max-rows 24 --ep %d -o %s/g%d.trace",
                             g_dir, g_dir, ep, g_dir, ep);
        ck_assert_msg(rc == 0, "ep %d: exit %d\n%s", ep, rc, out ? out : "");
        free(out);
    }
    char *out = NULL;
    int rc = ls_test_cli(&out, "compare %s/g1.trace %s/g2.trace", g_dir, g_dir);
    ck_assert_msg(rc == 0 && strstr(out, "PASS: 10/10 sequences bitwise equal"), "exit %d\n%s", rc, out);
    free(out);
}
END_TEST

/* gate --ep: the rollout on two ranks, its replays on one */
START_TEST(test_gate_ep)
{
    char *out = NULL;
    int rc = ls_test_cli(&out, "gate --checkpoint %s/tiny --prompts %s/prompts.jsonl --max-new-tokens 4 --seed 3 "
                         "--ep 2", g_dir, g_dir);
    ck_assert_msg(rc == 0 && strstr(out, "PASS: 5/5 replays bitwise equal to the rollout"), "exit %d\n%s", rc, out);
    free(out);
    rc = ls_test_cli(&out, "gate --checkpoint %s/tiny --prompts %s/prompts.jsonl --max-new-tokens 4 --ep 3", g_dir,
                     g_dir);
    ck_assert_msg(rc == 2 && strstr(out, "--ep") && strstr(out, "does not divide num_experts 8"), "exit %d\n%s", rc,
                  out);
    free(out);
}
END_TEST

START_TEST(test_manifest_topology)
{
    char *out = NULL;
    for (int ep = 1; ep <= 2; ep++) {
        ck_assert_msg(ls_test_cli(&out, "manifest pin --checkpoint %s/tiny --ep %d -o %s/m%d.json", g_dir, ep, g_dir,
                                  ep) == 0, "%s", out);
        free(out);
        ck_assert_msg(ls_test_cli(&out, "manifest pin --checkpoint %s/tiny --perturb layer=1,op=experts --ep %d "
                                  "-o %s/f%d.json", g_dir, ep, g_dir, ep) == 0, "%s", out);
        free(out);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/m2.json", g_dir);
    char *m2 = ls_test_read(path, NULL);
    ck_assert_msg(strstr(m2, "\"ep_degree\": 2") && strstr(m2, "\"world_size\": 2") &&
                  strstr(m2, "\"communicator\": \"cpu-socket\"") && strstr(m2, "\"reduction_tree\": \"none\"") &&
                  strstr(m2, "\"afd\": null"), "%s", m2);
    free(m2);
    /* strict: informational, and one digest */
    int rc = ls_test_cli(&out, "--verbose manifest diff %s/m1.json %s/m2.json", g_dir, g_dir);
    ck_assert_msg(rc == 0 && strstr(out, "informational topology.ep_degree: 1 -> 2") &&
                  strstr(out, "informational topology.communicator: \"none\" -> \"cpu-socket\"") &&
                  strstr(out, " differences, 0 voiding"), "exit %d\n%s", rc, out);
    free(out);
    char *d1 = NULL, *d2 = NULL;
    ck_assert_int_eq(ls_test_cli(&d1, "manifest digest %s/m1.json", g_dir), 0);
    ck_assert_int_eq(ls_test_cli(&d2, "manifest digest %s/m2.json", g_dir), 0);
    ck_assert_msg(strlen(d1) > 64 && !strncmp(d1, d2, 64), "digests differ: %s vs %s", d1, d2);
    free(d1);
    free(d2);
    /* the run's manifest digest is the pinned one */
    char *t = NULL;
    ck_assert_int_eq(ls_test_cli(&t, "manifest digest %s/m2.json", g_dir), 0);
    t[strcspn(t, " \n")] = '\0';
    char needle[128];
    snprintf(needle, sizeof needle, "\"manifest_digest\":\"%s\"", t);
    ck_assert_msg(header_has("tiny-r2.trace", needle), "the --ep 2 run's manifest digest is not the pinned %s", t);
    free(t);
    /* fast: voiding */
    rc = ls_test_cli(&out, "manifest diff %s/f1.json %s/f2.json", g_dir, g_dir);
    ck_assert_msg(rc == 1 && strstr(out, "voiding       topology.ep_degree: 1 -> 2") && strstr(out, "3 voiding"),
                  "exit %d\n%s", rc, out);
    free(out);
    /* refusals */
    rc = ls_test_cli(&out, "manifest pin --checkpoint %s/tiny --tp 2 -o %s/x.json", g_dir, g_dir);
    ck_assert_msg(rc == 2 && strstr(out, "--tp") && strstr(out, "not built yet"), "exit %d\n%s", rc, out);
    free(out);
    rc = ls_test_cli(&out, "manifest pin --checkpoint %s/tiny --backend cuda --ep 2 -o %s/x.json", g_dir, g_dir);
    ck_assert_msg(rc == 2 && strstr(out, "--ep"), "exit %d\n%s", rc, out);
    free(out);
}
END_TEST

/* No file of the test's own besides the expected ones: no trace, no temporary. */
static void expect_no_output(const char *out_name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_dir, out_name);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(!f, "%s exists after a failed run", path);
    DIR *d = opendir(g_dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    while ((de = readdir(d)))
        ck_assert_msg(!strstr(de->d_name, out_name), "%s/%s left behind", g_dir, de->d_name);
    closedir(d);
}

START_TEST(test_refusals)
{
    static const char *const cases[][3] = {
        {"--ep 3", "--ep", "does not divide num_experts 8"},
        {"--ep 2 --backend cuda", "--ep", "cpu backend only"},
        {"--tp 2", "--tp", "not built yet"},
        {"--rank-timeout 100", "--rank-timeout", "several ranks"},
        {"--ep 0", "--ep", "1.."},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "run --checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl "
                             "--max-new-tokens 2 %s -o %s/refused.trace", g_dir, g_dir, cases[i][0], g_dir);
        ck_assert_msg(rc == 2 && strstr(out, cases[i][1]) && strstr(out, cases[i][2]), "%s: exit %d\n%s",
                      cases[i][0], rc, out ? out : "");
        free(out);
        expect_no_output("refused.trace");
    }
}
END_TEST

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A worker that dies or hangs at step 3: every process ends non-zero within
 * 30 s naming the rank, and nothing is written. */
START_TEST(test_rank_failure)
{
    static const struct {
        const char *fault;
        int ep;
        const char *needle;
    } cases[] = {
        {"1:3:kill", 2, "rank 1 was killed by signal 9"},
        {"1:3:kill", 4, "rank 1 was killed by signal 9"},
        {"2:3:exit", 4, "rank 2 exited with status 3"},
        {"3:1:exit", 4, "rank 3 exited with status 3"},
        {"1:3:hang", 4, "rank 1 sent no message to it within 1500 ms"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[64];
        snprintf(name, sizeof name, "fault%zu.trace", i);
        char *out = NULL;
        double t0 = now_s();
        int rc = ls_test_sh(&out, "LOCKSTEP_TEST_RANK_FAULT=%s timeout -s KILL 60 '%s' run --checkpoint %s/tiny "
                            "--mode rollout --prompts %s/prompts.jsonl --max-new-tokens 6 --max-rows 24 --ep %d "
                            "--rank-timeout 1500 -o %s/%s 2>&1",
                            cases[i].fault, LS_CLI_PATH, g_dir, g_dir, cases[i].ep, g_dir, name);
        double dt = now_s() - t0;
        ck_assert_msg(rc == 2 && out && strstr(out, cases[i].needle), "%s at ep %d: exit %d\n%s", cases[i].fault,
                      cases[i].ep, rc, out ? out : "");
        ck_assert_msg(dt < 30.0, "%s: %.1f s", cases[i].fault, dt);
        free(out);
        expect_no_output(name);
        /* no process of this run is left (workers are forks: same arguments) */
        rc = ls_test_sh(&out, "ps -eo stat=,args= | grep -v '^Z' | grep -F -- '%s/%s' | grep -v grep", g_dir, name);
        ck_assert_msg(rc != 0, "%s: processes left:\n%s", cases[i].fault, out ? out : "");
        free(out);
    }
}
END_TEST

/* A TCP port nobody listens on now (the kernel's pick). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* Starts `lockstep run` once per rank in `ranks` (a space-separated list)
 * with a launcher's variables (family: "torchrun" or "openmpi"), world size
 * `world`, --ep `world`, env `extra`; waits for all. *rc0 = rank 0's exit
 * code (-1 when rank 0 was not started); returns the largest exit code of
 * the others; *out = every rank's output. */
static int launch(const char *family, const char *ranks, int world, const char *extra, const char *trace,
                  int *rc0, char **out)
{
    int port = free_port() - !strcmp(family, "torchrun"); /* torchrun: lockstep listens on MASTER_PORT + 1 */
    const char *rv = !strcmp(family, "torchrun") ? "RANK" : "OMPI_COMM_WORLD_RANK";
    const char *ws = !strcmp(family, "torchrun") ? "WORLD_SIZE" : "OMPI_COMM_WORLD_SIZE";
    int rc = ls_test_sh(out, "cd %s && rm -f rc.*; for r in %s; do (env %s %s=$r %s=%d MASTER_ADDR=127.0.0.1 "
                        "MASTER_PORT=%d timeout -s KILL 60 '%s' run --checkpoint tiny --mode rollout "
                        "--prompts prompts.jsonl --max-new-tokens 6 --sampling seeded --seed 3 "
                        "--state-digest-every 4 --max-rows 24 --ep %d --rank-timeout 3000 -o %s 2>&1; "
                        "echo $? > rc.$r) & done; wait; worst=0; for f in rc.*; do r=${f#rc.}; v=$(cat $f); "
                        "if [ $r = 0 ]; then echo \"rank0=$v\"; elif [ $v -gt $worst ]; then worst=$v; fi; done; "
                        "rm -f rc.*; exit $worst",
                        g_dir, ranks, extra, rv, ws, world, port, LS_CLI_PATH, world, trace);
    const char *p = *out ? strstr(*out, "rank0=") : NULL;
    *rc0 = p ? atoi(p + 6) : -1;
    return rc;
}

/* Ranks started by a launcher (torchrun's and Open MPI's variables, TCP
 * rendezvous on this host) give the self-launched run's bits; a worker that
 * dies, or a rank that never comes, fails every rank with no trace. */
START_TEST(test_launcher_ranks)
{
    char *out = NULL;
    int rc0, rc = launch("torchrun", "1 0", 2, "", "launched2.trace", &rc0, &out);
    ck_assert_msg(rc0 == 0 && rc == 0, "torchrun 2: rank 0 exit %d, workers %d\n%s", rc0, rc, out);
    free(out);
    expect_equal("tiny-r1.trace", "launched2.trace");
    rc = launch("openmpi", "3 2 1 0", 4, "", "launched4.trace", &rc0, &out);
    ck_assert_msg(rc0 == 0 && rc == 0, "openmpi 4: rank 0 exit %d, workers %d\n%s", rc0, rc, out);
    free(out);
    expect_equal("tiny-r1.trace", "launched4.trace");

    rc = launch("torchrun", "0 1 2 3", 4, "LOCKSTEP_TEST_RANK_FAULT=1:3:kill", "launched-kill.trace", &rc0, &out);
    ck_assert_msg(rc0 == 2 && rc != 0 && strstr(out, "rank 1 closed its connection"), "kill: rank 0 exit %d, "
                  "workers %d\n%s", rc0, rc, out);
    free(out);
    expect_no_output("launched-kill.trace");

    /* a rank started with another seed is refused before the first step */
    int port = free_port() - 1;
    rc = ls_test_sh(&out, "cd %s && for r in 0 1; do (RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=%d "
                    "timeout -s KILL 60 '%s' run --checkpoint tiny --mode rollout --prompts prompts.jsonl "
                    "--max-new-tokens 6 --sampling seeded --seed $((3 + r)) --ep 2 -o mismatch.trace 2>&1; "
                    "echo \"rc$r=$?\") & done; wait", g_dir, port, LS_CLI_PATH);
    ck_assert_msg(strstr(out, "rc0=2") && strstr(out, "rc1=2") &&
                  strstr(out, "rank 1: its run options, sequences or checkpoint config.json differ from rank 0's"),
                  "mismatch:\n%s", out);
    free(out);
    expect_no_output("mismatch.trace");

    double t0 = now_s();
    rc = launch("torchrun", "0", 2, "", "launched-alone.trace", &rc0, &out);
    ck_assert_msg(rc0 == 2 && strstr(out, "rank 1 did not") && now_s() - t0 < 30.0, "alone: rank 0 exit %d\n%s",
                  rc0, out);
    free(out);
    expect_no_output("launched-alone.trace");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("ranks");
    TCase *tc = tcase_create("cli");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_ep_equals_one_rank, 0, N_MODELS);
    tcase_add_test(tc, test_ep_grouped_rollout);
    tcase_add_test(tc, test_gate_ep);
    tcase_add_test(tc, test_manifest_topology);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_rank_failure);
    tcase_add_test(tc, test_launcher_ranks);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    return failed ? 1 : 0;
}
