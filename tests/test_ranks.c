/* Several ranks from the command line (docs/parallel.md §1, run/ranks.h):
 * `lockstep run --ep N`, `--tp N`, `--tp N --ep M` and `--afd A:F` start
 * that many processes joined by the CPU communicator, rank 0 writing the
 * trace.
 *
 * On synthetic checkpoints (Qwen3-Next tiny, Qwen3.5 tiny, Qwen3.5 tiny FP8
 * with w8a8 experts), the traces of --ep 2 and --ep 4 equal --ep 1's under
 * `lockstep compare` (every record and digest), for a seeded rollout, a
 * GRPO rollout with prefix reuse and preemption (also at --tp 2, --tp 2
 * --ep 2, --afd 1:1 and --afd 1:2), and a chunked replay; the
 * header records the topology and the manifest digest is the one-rank run's.
 * The same for --tp 2, --tp 4 (Qwen3-Next tiny and Qwen3.5 tiny with 4
 * linear key heads, which 4 divides), --tp 2 --ep 2, --afd 1:1, --afd 1:2
 * (the experts split over the two FFN ranks) and --afd 2:2 (the mixers
 * split over the two attention ranks too), rollout and chunked replay.
 * `manifest pin --ep/--tp/--afd` records the topology (and refuses one the
 * checkpoint does not divide, as run does);
 * `manifest diff` calls EP1 against EP2 and TP1 against TP2 informational
 * for strict manifests and voiding for fast ones; `gate --ep 2`, `--tp 2`,
 * `--afd 1:1` and `--afd 1:2` replay the rollout on one rank. Refusals
 * (experts or heads not divisible, CUDA ranks in a build without CUDA, attention ranks that
 * do not divide the heads, FFN ranks that do not divide the experts, --rank-timeout
 * with one rank, --afd-balance without --afd) exit 2 naming the flag.
 * `--afd 1:1` and `--afd 1:2` with `--afd-balance FILE` write the per-layer
 * balance report (one row per decoder layer, of its mixer family, every FFN
 * rank's times; totals the rows' sums) and the one-rank trace. A worker that is killed, exits or
 * hangs mid-run (EP, TP, TP x EP, AFD 1:F and 2:2) makes every process end non-zero within a
 * bounded time, naming the rank, with no trace and no temporary file left.
 * Ranks started by a launcher: --ep 2 and 4, --tp 2, --afd 1:1 equal the
 * self-launched trace; TP x EP and AFD 1:2 under a launcher are refused. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "run/ranks.h"
#include "testutil.h"

static char *g_dir;

#define N_MODELS 3
static const char *const g_model[N_MODELS] = {"tiny", "q35", "q35fp8"};

static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("ranks");
    char *out = NULL;
    ls_test_synth_rank_models(g_dir);
    /* 4 linear key heads (one value head each), so that TP4 divides them */
    ck_assert_msg(ls_test_sh(&out, "cd %s && '%s' synth --preset tiny --seed 8 --config-only --out tiny4c && "
                             "'%s' synth --preset qwen3.5-tiny --seed 9 --config-only --out q35k4c && "
                             "sed -i 's/\"linear_num_key_heads\": 2/\"linear_num_key_heads\": 4/' "
                             "tiny4c/config.json q35k4c/config.json && grep -c '\"linear_num_key_heads\": 4' "
                             "tiny4c/config.json q35k4c/config.json && '%s' synth --config tiny4c/config.json "
                             "--seed 8 --out tiny4 && '%s' synth --config q35k4c/config.json --seed 9 --out q35k4 2>&1",
                             g_dir, LS_CLI_PATH, LS_CLI_PATH, LS_CLI_PATH, LS_CLI_PATH) == 0, "%s", out);
    free(out);
    /* prompts of 1, 7, 12, 19 and 30 tokens: several prefill steps at 24 rows */
    static const int lens[] = {1, 7, 12, 19, 30};
    ls_test_write_prompts(g_dir, lens, 5, 0x9E3779B97F4A7C15ull, 1000);
}

static void teardown(void) {}

/* `compare A B` passes: every sequence bitwise equal. */
static void expect_equal(const char *a, const char *b)
{
    ls_test_expect_traces_equal(g_dir, a, b, 5);
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
    /* under AddressSanitizer 1 and 4 ranks (2 runs the same code) */
    for (int ep = 1; ep <= 4; ep *= LS_TEST_ASAN ? 4 : 2) {
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
    for (int ep = 1; ep <= 4; ep *= LS_TEST_ASAN ? 4 : 2) {
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
    static const char *const topo[] = {"--ep 1", "--ep 2", "--tp 2", "--tp 2 --ep 2", "--afd 1:1", "--afd 1:2"};
    for (int t = 0; t < 6; t++) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "run --checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl "
                             "--max-new-tokens 5 --sampling seeded --seed 9 --samples-per-prompt 2 --prefix-cache any "
                             "--preempt seeded:4 --kv-page 4 --max-rows 24 %s -o %s/g%d.trace",
                             g_dir, g_dir, topo[t], g_dir, t);
        ck_assert_msg(rc == 0, "%s: exit %d\n%s", topo[t], rc, out ? out : "");
        free(out);
        if (t == 0) continue;
        rc = ls_test_cli(&out, "compare %s/g0.trace %s/g%d.trace", g_dir, g_dir, t);
        ck_assert_msg(rc == 0 && strstr(out, "PASS: 10/10 sequences bitwise equal"), "%s: exit %d\n%s", topo[t], rc,
                      out);
        free(out);
    }
}
END_TEST

/* TP and AFD from the command line: on each checkpoint, the rollout and the
 * chunked replay of the one-rank rollout on every topology that divides its
 * shapes equal the one-rank traces under `lockstep compare`. */
#define N_TP_MODELS 3
static const char *const g_tp_model[N_TP_MODELS] = {"tiny4", "q35k4", "q35fp8"};

START_TEST(test_tp_equals_one_rank)
{
    const char *mod = g_tp_model[_i];
    int fp8 = _i == 2;
    /* the FP8 model keeps 2 linear key heads: TP4 does not divide them */
    static const char *const topo[] = {"--tp 2", "--tp 4", "--tp 2 --ep 2", "--afd 1:1", "--afd 1:2", "--afd 2:2"};
    static const char *const header[] = {
        "\"topology\":{\"afd\":null,\"communicator\":\"cpu-socket\",\"ep\":1,\"tp\":2}",
        "\"topology\":{\"afd\":null,\"communicator\":\"cpu-socket\",\"ep\":1,\"tp\":4}",
        "\"topology\":{\"afd\":null,\"communicator\":\"cpu-socket\",\"ep\":2,\"tp\":2}",
        "\"topology\":{\"afd\":[1,1],\"communicator\":\"cpu-socket\",\"ep\":1,\"tp\":1}",
        "\"topology\":{\"afd\":[1,2],\"communicator\":\"cpu-socket\",\"ep\":1,\"tp\":1}",
        "\"topology\":{\"afd\":[2,2],\"communicator\":\"cpu-socket\",\"ep\":1,\"tp\":1}",
    };
    char full[1024], ref[64], name[64];
    snprintf(full, sizeof full, "--checkpoint %s/%s --mode rollout --prompts %s/prompts.jsonl%s --max-new-tokens 6 "
             "--sampling seeded --seed 3 --state-digest-every 4 --max-rows 24", g_dir, mod, g_dir,
             fp8 ? " --fp8 w8a8" : "");
    snprintf(ref, sizeof ref, "%s-t1.trace", mod);
    char *out = NULL;
    int rc = ls_test_cli(&out, "run %s -o %s/%s", full, g_dir, ref);
    ck_assert_msg(rc == 0, "%s: exit %d\n%s", ref, rc, out ? out : "");
    free(out);
    for (int t = 0; t < 6; t++) {
        if (fp8 && t == 1) continue;
        /* under AddressSanitizer TP2 x EP2 and AFD 2:2 (TP, EP and AFD code) */
        if (LS_TEST_ASAN && t != 2 && t != 5) continue;
        snprintf(name, sizeof name, "%s-t%d.trace", mod, 10 + t);
        rc = ls_test_cli(&out, "run %s %s -o %s/%s", full, topo[t], g_dir, name);
        ck_assert_msg(rc == 0, "%s %s: exit %d\n%s", mod, topo[t], rc, out ? out : "");
        free(out);
        expect_equal(ref, name);
        ck_assert_msg(header_has(name, header[t]), "%s %s: run_params lacks %s", mod, topo[t], header[t]);
        /* the one-rank rollout replayed in chunks of 3 on these ranks */
        snprintf(name, sizeof name, "%s-t%d.trace", mod, 20 + t);
        rc = ls_test_cli(&out, "run --checkpoint %s/%s --mode replay --from %s/%s --chunk 3 --max-rows 24 %s -o %s/%s",
                         g_dir, mod, g_dir, ref, topo[t], g_dir, name);
        ck_assert_msg(rc == 0, "%s %s replay: exit %d\n%s", mod, topo[t], rc, out ? out : "");
        free(out);
        expect_equal(ref, name);
    }
}
END_TEST

/* gate --ep, --tp, --afd: the rollout on several ranks, its replays on one */
START_TEST(test_gate_ep)
{
    char *out = NULL;
    int rc = ls_test_cli(&out, "gate --checkpoint %s/tiny --prompts %s/prompts.jsonl --max-new-tokens 4 --seed 3 "
                         "--ep 2", g_dir, g_dir);
    ck_assert_msg(rc == 0 && strstr(out, "PASS: 5/5 replays bitwise equal to the rollout"), "exit %d\n%s", rc, out);
    free(out);
    /* the tensor-parallel and the disaggregated rollout against one rank */
    static const char *const more[] = {"--tp 2", "--tp 2 --ep 2", "--afd 1:1", "--afd 1:2"};
    for (int i = 0; i < 4; i++) {
        rc = ls_test_cli(&out, "gate --checkpoint %s/tiny --prompts %s/prompts.jsonl --max-new-tokens 4 --seed 3 %s",
                         g_dir, g_dir, more[i]);
        ck_assert_msg(rc == 0 && strstr(out, "PASS: 5/5 replays bitwise equal to the rollout"), "%s: exit %d\n%s",
                      more[i], rc, out);
        free(out);
    }
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
    /* the run's manifest digest is the pinned one (a strict digest holds at
     * every topology: the EP4 run of test_ep_equals_one_rank, made in every
     * build) */
    char *t = NULL;
    ck_assert_int_eq(ls_test_cli(&t, "manifest digest %s/m2.json", g_dir), 0);
    t[strcspn(t, " \n")] = '\0';
    char needle[128];
    snprintf(needle, sizeof needle, "\"manifest_digest\":\"%s\"", t);
    ck_assert_msg(header_has("tiny-r4.trace", needle), "the --ep 4 run's manifest digest is not the pinned %s", t);
    free(t);
    /* fast: voiding */
    rc = ls_test_cli(&out, "manifest diff %s/f1.json %s/f2.json", g_dir, g_dir);
    ck_assert_msg(rc == 1 && strstr(out, "voiding       topology.ep_degree: 1 -> 2") && strstr(out, "3 voiding"),
                  "exit %d\n%s", rc, out);
    free(out);
    /* TP1 against TP2 and against AFD 1:1: informational for strict manifests, one digest */
    ck_assert_msg(ls_test_cli(&out, "manifest pin --checkpoint %s/tiny --tp 2 -o %s/t2.json", g_dir, g_dir) == 0, "%s",
                  out);
    free(out);
    ck_assert_msg(ls_test_cli(&out, "manifest pin --checkpoint %s/tiny --afd 1:1 -o %s/a11.json", g_dir, g_dir) == 0,
                  "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/t2.json", g_dir);
    char *t2 = ls_test_read(path, NULL);
    ck_assert_msg(strstr(t2, "\"tp_degree\": 2") && strstr(t2, "\"ep_degree\": 1") && strstr(t2, "\"world_size\": 2") &&
                  strstr(t2, "\"reduction_tree\": \"none\"") && strstr(t2, "\"afd\": null"), "%s", t2);
    free(t2);
    snprintf(path, sizeof path, "%s/a11.json", g_dir);
    char *a11 = ls_test_read(path, NULL);
    ck_assert_msg(strstr(a11, "\"attention_ranks\": 1") && strstr(a11, "\"ffn_ranks\": 1") &&
                  strstr(a11, "\"world_size\": 2") && strstr(a11, "\"tp_degree\": 1"), "%s", a11);
    free(a11);
    rc = ls_test_cli(&out, "--verbose manifest diff %s/m1.json %s/t2.json", g_dir, g_dir);
    ck_assert_msg(rc == 0 && strstr(out, "informational topology.tp_degree: 1 -> 2") &&
                  strstr(out, "informational topology.world_size: 1 -> 2") && strstr(out, " differences, 0 voiding"),
                  "exit %d\n%s", rc, out);
    free(out);
    rc = ls_test_cli(&out, "--verbose manifest diff %s/t2.json %s/a11.json", g_dir, g_dir);
    ck_assert_msg(rc == 0 && strstr(out, "informational topology.afd") && strstr(out, " differences, 0 voiding"),
                  "exit %d\n%s", rc, out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&d1, "manifest digest %s/m1.json", g_dir), 0);
    ck_assert_int_eq(ls_test_cli(&d2, "manifest digest %s/t2.json", g_dir), 0);
    ck_assert_msg(strlen(d1) > 64 && !strncmp(d1, d2, 64), "digests differ: %s vs %s", d1, d2);
    free(d1);
    free(d2);
    rc = ls_test_cli(&out, "manifest pin --checkpoint %s/tiny --afd 2:4 -o %s/a24.json", g_dir, g_dir);
    ck_assert_msg(rc == 0, "exit %d\n%s", rc, out);
    free(out);
    snprintf(path, sizeof path, "%s/a24.json", g_dir);
    char *a24 = ls_test_read(path, NULL);
    ck_assert_msg(strstr(a24, "\"attention_ranks\": 2") && strstr(a24, "\"ffn_ranks\": 4") &&
                  strstr(a24, "\"world_size\": 6"), "%s", a24);
    free(a24);
    /* refusals: a topology the checkpoint does not divide, as run refuses it */
    rc = ls_test_cli(&out, "manifest pin --checkpoint %s/tiny --afd 2:3 -o %s/x.json", g_dir, g_dir);
    ck_assert_msg(rc == 2 && strstr(out, "--afd") && strstr(out, "3 FFN ranks do not divide num_experts 8"),
                  "exit %d\n%s", rc, out);
    free(out);
    rc = ls_test_cli(&out, "manifest pin --checkpoint %s/tiny --tp 3 -o %s/x.json", g_dir, g_dir);
    ck_assert_msg(rc == 2 && strstr(out, "num_attention_heads 4 is not a multiple of --tp 3"), "exit %d\n%s", rc,
                  out);
    free(out);
#ifndef LOCKSTEP_HAVE_CUDA
    /* CUDA ranks in a build without CUDA (with it: tests/gpu/test_ranks_cuda.c) */
    rc = ls_test_cli(&out, "manifest pin --checkpoint %s/tiny --backend cuda --tp 2 -o %s/x.json", g_dir, g_dir);
    ck_assert_msg(rc == 2 && strstr(out, "--tp 2") && strstr(out, "built without CUDA"), "exit %d\n%s", rc, out);
    free(out);
    rc = ls_test_cli(&out, "manifest pin --checkpoint %s/tiny --backend cuda --ep 2 -o %s/x.json", g_dir, g_dir);
    ck_assert_msg(rc == 2 && strstr(out, "--ep") && strstr(out, "built without CUDA"), "exit %d\n%s", rc, out);
    free(out);
#endif
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
        {"--tp 3", "--tp 3", "num_attention_heads 4 is not a multiple of --tp 3"},
        {"--tp 3 --ep 3", "--tp 3 --ep 3", "9 ranks do not divide num_experts 8"},
        {"--afd 3:1", "--afd", "3 attention ranks split every mixer by head"},
        {"--afd 1:3", "--afd", "3 FFN ranks do not divide num_experts 8"},
        {"--afd 1:1 --ep 2", "--afd", "does not combine with --tp or --ep"},
        {"--afd 1", "--afd", "expected A:F"},
        {"--rank-timeout 100", "--rank-timeout", "several ranks"},
        {"--ep 0", "--ep", "1.."},
        {"--afd-balance refused.json", "--afd-balance", "attention-FFN disaggregated run (--afd A:F)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "run --checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl "
                             "--max-new-tokens 2 %s -o %s/refused.trace", g_dir, g_dir, cases[i][0], g_dir);
        ck_assert_msg(rc == 2 && strstr(out, cases[i][1]) && strstr(out, cases[i][2]), "%s: exit %d\n%s",
                      cases[i][0], rc, out ? out : "");
        /* a shape tp does not divide is refused before any worker starts: one line */
        if (!strcmp(cases[i][0], "--tp 3"))
            ck_assert_msg(!strstr(out, "rank "), "--tp 3: a worker started:\n%s", out);
        free(out);
        expect_no_output("refused.trace");
        expect_no_output("refused.json");
    }
#ifndef LOCKSTEP_HAVE_CUDA
    /* CUDA ranks in a build without CUDA: refused before any worker starts
     * (with CUDA they run: tests/gpu/test_ranks_cuda.c) */
    static const char *const cuda_topo[] = {"--ep 2", "--tp 2", "--afd 1:1"};
    for (size_t i = 0; i < sizeof cuda_topo / sizeof *cuda_topo; i++) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "run --checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl "
                             "--max-new-tokens 2 --backend cuda %s -o %s/refused.trace", g_dir, g_dir,
                             cuda_topo[i], g_dir);
        ck_assert_msg(rc == 2 && strstr(out, cuda_topo[i]) && strstr(out, "built without CUDA") &&
                      !strstr(out, "rank "), "%s --backend cuda: exit %d\n%s", cuda_topo[i], rc, out ? out : "");
        free(out);
        expect_no_output("refused.trace");
    }
#else
    /* CUDA ranks on a machine without a GPU: one refusal before any worker
     * starts, not one per rank (with a GPU: tests/gpu/test_ranks_cuda.c) */
    if (ls_run_ranks_cuda_devices() == 0) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "run --checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl "
                             "--max-new-tokens 2 --backend cuda --tp 2 -o %s/refused.trace", g_dir, g_dir, g_dir);
        ck_assert_msg(rc == 2 && strstr(out, "--tp 2 with backend (--backend) cuda: no CUDA device visible") &&
                      !strstr(out, "rank "), "exit %d\n%s", rc, out ? out : "");
        free(out);
        expect_no_output("refused.trace");
    }
#endif
    /* TP x EP under a launcher: its TP groups would need Unix socket pairs
     * handed over TCP connections; refused before any rank connects */
    char *out = NULL;
    int rc = ls_test_sh(&out, "RANK=0 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 timeout -s KILL 60 '%s' run "
                        "--checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl --max-new-tokens 2 --tp 2 "
                        "--ep 2 -o %s/refused.trace 2>&1", LS_CLI_PATH, g_dir, g_dir, g_dir);
    ck_assert_msg(rc == 2 && strstr(out, "--tp 2 --ep 2 under a launcher (torchrun)"), "exit %d\n%s", rc, out);
    free(out);
    expect_no_output("refused.trace");
    /* so is AFD's FFN group */
    rc = ls_test_sh(&out, "RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 timeout -s KILL 60 '%s' run "
                    "--checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl --max-new-tokens 2 --afd 1:2 "
                    "-o %s/refused.trace 2>&1", LS_CLI_PATH, g_dir, g_dir, g_dir);
    ck_assert_msg(rc == 2 && strstr(out, "--afd 1:2 under a launcher (torchrun): the attention and FFN groups"), "exit %d\n%s", rc,
                  out);
    free(out);
    expect_no_output("refused.trace");
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
        const char *ranks;
        const char *needle;
    } cases[] = {
        {"1:3:kill", "--ep 2", "rank 1 was killed by signal 9"},
        {"1:3:kill", "--ep 4", "rank 1 was killed by signal 9"},
        {"2:3:exit", "--ep 4", "rank 2 exited with status 3"},
        {"3:1:exit", "--ep 4", "rank 3 exited with status 3"},
        {"1:3:hang", "--ep 4", "rank 1 sent no message to it within 1500 ms"},
        {"1:3:kill", "--tp 2", "rank 1 was killed by signal 9"},
        {"3:2:kill", "--tp 2 --ep 2", "rank 3 was killed by signal 9"},
        {"1:3:kill", "--afd 1:1", "rank 1 was killed by signal 9"},
        {"2:3:kill", "--afd 1:2", "rank 2 was killed by signal 9"},
        {"1:2:hang", "--afd 1:2", "rank 1 sent no message to it within 1500 ms"},
        {"1:3:kill", "--afd 2:2", "rank 1 was killed by signal 9"}, /* the second attention rank */
        {"3:3:kill", "--afd 2:2", "rank 3 was killed by signal 9"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[64];
        snprintf(name, sizeof name, "fault%zu.trace", i);
        char *out = NULL;
        double t0 = now_s();
        int rc = ls_test_sh(&out, "LOCKSTEP_TEST_RANK_FAULT=%s timeout -s KILL 60 '%s' run --checkpoint %s/tiny "
                            "--mode rollout --prompts %s/prompts.jsonl --max-new-tokens 6 --max-rows 24 %s "
                            "--rank-timeout 1500 -o %s/%s 2>&1",
                            cases[i].fault, LS_CLI_PATH, g_dir, g_dir, cases[i].ranks, g_dir, name);
        double dt = now_s() - t0;
        ck_assert_msg(rc == 2 && out && strstr(out, cases[i].needle), "%s at %s: exit %d\n%s", cases[i].fault,
                      cases[i].ranks, rc, out ? out : "");
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
 * `world`, the topology flags `topo` (NULL: --ep `world`), env `extra`;
 * waits for all. *rc0 = rank 0's exit
 * code (-1 when rank 0 was not started); returns the largest exit code of
 * the others; *out = every rank's output. */
static int launch(const char *family, const char *ranks, int world, const char *topo, const char *extra,
                  const char *trace, int *rc0, char **out)
{
    char ep[32];
    snprintf(ep, sizeof ep, "--ep %d", world);
    int port = free_port() - !strcmp(family, "torchrun"); /* torchrun: lockstep listens on MASTER_PORT + 1 */
    const char *rv = !strcmp(family, "torchrun") ? "RANK" : "OMPI_COMM_WORLD_RANK";
    const char *ws = !strcmp(family, "torchrun") ? "WORLD_SIZE" : "OMPI_COMM_WORLD_SIZE";
    int rc = ls_test_sh(out, "cd %s && rm -f rc.*; for r in %s; do (env %s %s=$r %s=%d MASTER_ADDR=127.0.0.1 "
                        "MASTER_PORT=%d timeout -s KILL 60 '%s' run --checkpoint tiny --mode rollout "
                        "--prompts prompts.jsonl --max-new-tokens 6 --sampling seeded --seed 3 "
                        "--state-digest-every 4 --max-rows 24 %s --rank-timeout 3000 -o %s 2>&1; "
                        "echo $? > rc.$r) & done; wait; worst=0; for f in rc.*; do r=${f#rc.}; v=$(cat $f); "
                        "if [ $r = 0 ]; then echo \"rank0=$v\"; elif [ $v -gt $worst ]; then worst=$v; fi; done; "
                        "rm -f rc.*; exit $worst",
                        g_dir, ranks, extra, rv, ws, world, port, LS_CLI_PATH, topo ? topo : ep, trace);
    const char *p = *out ? strstr(*out, "rank0=") : NULL;
    *rc0 = p ? atoi(p + 6) : -1;
    return rc;
}

/* Two ranks with torchrun's variables, after the shell command `setup`
 * (empty, or ending in "&& "), each `run ... --ep 2 RANK_ARGS` where
 * rank_args may use the shell's $r (the rank): both exit 2 before the first
 * step, the output names `msg`, and no trace is in place. */
static void expect_pair_refused(const char *setup, const char *rank_args, const char *trace, const char *msg)
{
    char *out = NULL;
    int port = free_port() - 1; /* torchrun: lockstep listens on MASTER_PORT + 1 */
    ls_test_sh(&out, "cd %s && %sfor r in 0 1; do (RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=%d "
               "timeout -s KILL 60 '%s' run %s --mode rollout --prompts prompts.jsonl --max-new-tokens 6 "
               "--sampling seeded --ep 2 -o %s 2>&1; echo \"rc$r=$?\") & done; wait", g_dir, setup, port,
               LS_CLI_PATH, rank_args, trace);
    ck_assert_msg(out && strstr(out, "rc0=2") && strstr(out, "rc1=2") && strstr(out, msg), "%s:\n%s", trace,
                  out ? out : "");
    free(out);
    expect_no_output(trace);
}

/* Ranks started by a launcher (torchrun's and Open MPI's variables, TCP
 * rendezvous on this host) give the self-launched run's bits; a worker that
 * dies, or a rank that never comes, fails every rank with no trace. */
START_TEST(test_launcher_ranks)
{
    char *out = NULL;
    int rc0, rc = launch("torchrun", "1 0", 2, NULL, "", "launched2.trace", &rc0, &out);
    ck_assert_msg(rc0 == 0 && rc == 0, "torchrun 2: rank 0 exit %d, workers %d\n%s", rc0, rc, out);
    free(out);
    expect_equal("tiny-r1.trace", "launched2.trace");
    rc = launch("openmpi", "3 2 1 0", 4, NULL, "", "launched4.trace", &rc0, &out);
    ck_assert_msg(rc0 == 0 && rc == 0, "openmpi 4: rank 0 exit %d, workers %d\n%s", rc0, rc, out);
    free(out);
    expect_equal("tiny-r1.trace", "launched4.trace");
    /* TP and AFD ranks join the same way (no TP group to split) */
    rc = launch("torchrun", "1 0", 2, "--tp 2", "", "launched-tp2.trace", &rc0, &out);
    ck_assert_msg(rc0 == 0 && rc == 0, "torchrun --tp 2: rank 0 exit %d, workers %d\n%s", rc0, rc, out);
    free(out);
    expect_equal("tiny-r1.trace", "launched-tp2.trace");
    rc = launch("openmpi", "0 1", 2, "--afd 1:1", "", "launched-afd.trace", &rc0, &out);
    ck_assert_msg(rc0 == 0 && rc == 0, "openmpi --afd 1:1: rank 0 exit %d, workers %d\n%s", rc0, rc, out);
    free(out);
    expect_equal("tiny-r1.trace", "launched-afd.trace");

    rc = launch("torchrun", "0 1 2 3", 4, NULL, "LOCKSTEP_TEST_RANK_FAULT=1:3:kill", "launched-kill.trace", &rc0, &out);
    ck_assert_msg(rc0 == 2 && rc != 0 && strstr(out, "rank 1 closed its connection"), "kill: rank 0 exit %d, "
                  "workers %d\n%s", rc0, rc, out);
    free(out);
    expect_no_output("launched-kill.trace");

    /* a rank started with another seed is refused before the first step */
    expect_pair_refused("", "--checkpoint tiny --seed $((3 + r))", "mismatch.trace",
                        "rank 1: its run options, sequences or checkpoint config.json differ from rank 0's");
    /* a rank whose copy of the checkpoint holds other weights (one mantissa
     * bit of the last element; config.json the same) is refused before the
     * first step, naming it: launched ranks fingerprint their own copies */
    expect_pair_refused("rm -rf tinyw && cp -r tiny tinyw && f=tinyw/model.safetensors && "
                        "n=$(($(stat -c %s $f) - 2)) && b=$(od -An -tu1 -j $n -N1 $f) && "
                        "printf \"\\\\$(printf %03o $((b ^ 1)))\" | dd of=$f bs=1 seek=$n conv=notrunc 2>/dev/null && ",
                        "--checkpoint $([ $r = 0 ] && echo tiny || echo tinyw) --seed 3", "weights.trace",
                        "rank 1: the weights of its checkpoint differ from rank 0's (Merkle root");

    double t0 = now_s();
    rc = launch("torchrun", "0", 2, NULL, "", "launched-alone.trace", &rc0, &out);
    ck_assert_msg(rc0 == 2 && strstr(out, "rank 1 did not") && now_s() - t0 < 30.0, "alone: rank 0 exit %d\n%s",
                  rc0, out);
    free(out);
    expect_no_output("launched-alone.trace");
}
END_TEST

/* --afd 1:F --afd-balance (F = 1, 2; loop index F - 1): the trace is the
 * one-rank trace, and the report has one row per decoder layer, of that
 * layer's mixer family, with the attention rank's and every FFN rank's busy
 * and waiting times; the totals are the rows' sums (experts: the slowest
 * FFN rank of each layer). */
START_TEST(test_afd_balance)
{
    setup();
    int F = 1 + _i;
    char *out = NULL;
    int rc = ls_test_cli(&out, "run --checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl "
                         "--max-new-tokens 4 --max-rows 24 -o %s/bal1.trace", g_dir, g_dir, g_dir);
    ck_assert_msg(rc == 0, "%s", out);
    free(out);
    rc = ls_test_cli(&out, "run --checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl --max-new-tokens 4 "
                     "--max-rows 24 --afd 1:%d --afd-balance %s/bal.json -o %s/bal2.trace", g_dir, g_dir, F, g_dir,
                     g_dir);
    ck_assert_msg(rc == 0 && strstr(out, "afd balance: mixers") && strstr(out, "bal.json"), "exit %d\n%s", rc, out);
    free(out);
    expect_equal("bal1.trace", "bal2.trace");
    char path[4200];
    snprintf(path, sizeof path, "%s/bal.json", g_dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    ck_assert_msg(root, "%s: %s", path, je.text);
    json_t *layers = json_object_get(root, "layers"), *tot = json_object_get(root, "totals");
    ck_assert_msg(json_array_size(layers) == 4 && tot, "4 layer rows and totals expected");
    ck_assert_str_eq(json_string_value(json_object_get(root, "mode")), "rollout");
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(root, "topology"), "ffn_ranks")), F);
    /* 5 prompts of 1..30 tokens at 24 rows a step, then 3 decode steps */
    ck_assert_int_gt(json_integer_value(json_object_get(root, "steps")), 4);
    ck_assert_int_eq(json_integer_value(json_object_get(root, "rows")), 1 + 7 + 12 + 19 + 30 + 3 * 5);
    static const char *const fam[4] = {"gdn", "attention", "gdn", "attention"}; /* tiny: interval 2 */
    double mix[2] = {0}, attn_wait = 0, experts = 0, fbusy[2] = {0}, fwait[2] = {0};
    for (size_t l = 0; l < 4; l++) {
        json_t *r = json_array_get(layers, l);
        ck_assert_int_eq(json_integer_value(json_object_get(r, "layer")), (long)l);
        ck_assert_str_eq(json_string_value(json_object_get(r, "mixer")), fam[l]);
        double busy = json_real_value(json_object_get(r, "attention_rank_busy_s"));
        double wait = json_real_value(json_object_get(r, "attention_rank_wait_s"));
        ck_assert_msg(busy > 0 && wait >= 0, "layer %zu attention rank busy %g wait %g", l, busy, wait);
        mix[l % 2] += busy, attn_wait += wait;
        json_t *fb = json_object_get(r, "ffn_ranks_busy_s"), *fw = json_object_get(r, "ffn_ranks_wait_s");
        ck_assert_msg(json_array_size(fb) == (size_t)F && json_array_size(fw) == (size_t)F, "layer %zu: %d FFN ranks",
                      l, F);
        double slowest = 0;
        for (int f = 0; f < F; f++) {
            double b = json_real_value(json_array_get(fb, (size_t)f)), w = json_real_value(json_array_get(fw, (size_t)f));
            /* every FFN rank works in every layer; waiting may round to 0 */
            ck_assert_msg(b > 0 && w >= 0, "layer %zu FFN rank %d busy %g wait %g", l, 1 + f, b, w);
            if (b > slowest) slowest = b;
            fbusy[f] += b, fwait[f] += w;
        }
        experts += slowest;
    }
    static const char *const tkeys[4] = {"gdn_mixers_s", "attention_mixers_s", "experts_s", "attention_rank_wait_s"};
    const double want[4] = {mix[0], mix[1], experts, attn_wait};
    for (int k = 0; k < 4; k++) {
        double v = json_real_value(json_object_get(tot, tkeys[k]));
        ck_assert_msg(fabs(v - want[k]) <= 1e-5 * (1 + want[k]), "totals.%s %g, the rows give %g", tkeys[k], v,
                      want[k]);
    }
    for (int f = 0; f < F; f++) {
        double b = json_real_value(json_array_get(json_object_get(tot, "ffn_ranks_busy_s"), (size_t)f));
        double w = json_real_value(json_array_get(json_object_get(tot, "ffn_ranks_wait_s"), (size_t)f));
        double i = json_real_value(json_array_get(json_object_get(tot, "ffn_ranks_idle_fraction"), (size_t)f));
        ck_assert_msg(fabs(b - fbusy[f]) <= 1e-5 * (1 + b) && fabs(w - fwait[f]) <= 1e-5 * (1 + w),
                      "FFN rank %d totals %g %g, the rows sum to %g %g", 1 + f, b, w, fbusy[f], fwait[f]);
        ck_assert_msg(i >= 0 && i < 1, "FFN rank %d idle fraction %g", 1 + f, i);
    }
    double i0 = json_real_value(json_object_get(tot, "attention_rank_idle_fraction"));
    ck_assert_msg(i0 >= 0 && i0 < 1, "attention rank idle fraction %g", i0);
    json_decref(root);
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
    tcase_add_loop_test(tc, test_tp_equals_one_rank, 0, N_TP_MODELS);
    tcase_add_test(tc, test_gate_ep);
    tcase_add_test(tc, test_manifest_topology);
    tcase_add_test(tc, test_refusals);
    tcase_add_loop_test(tc, test_afd_balance, 0, 2);
    tcase_add_test(tc, test_rank_failure);
    tcase_add_test(tc, test_launcher_ranks);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed = ls_test_run_suite(suite(), 1);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    return failed ? 1 : 0;
}
