/* lockstep run / gate / demo end to end on the synthetic tiny checkpoint:
 * rollout -> chunked replay -> compare equal; a perturbed replay is caught at
 * its layer; gate and demo exit codes and reports; bad inputs exit 2 with one
 * line. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static char *g_dir;

static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("cli-engine");
    char *out = NULL;
    int rc = ls_test_cli(&out, "synth --preset tiny --seed 7 --out %s/ck", g_dir);
    ck_assert_msg(rc == 0, "synth failed: %s", out ? out : "");
    free(out);
    char p[4200];
    snprintf(p, sizeof p, "%s/prompts.jsonl", g_dir);
    const char *jl = "{\"id\": 0, \"tokens\": [1, 2, 3, 4, 5]}\n"
                     "\n"
                     "{\"id\": 3, \"tokens\": [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12], \"note\": \"x\"}\n"
                     "{\"id\": 7, \"tokens\": [42]}\n";
    ls_test_write(p, jl, strlen(jl));
}

/* Runs a CLI command; checks the exit code, prints the output on mismatch.
 * Not inlined: inlined, GCC 12 at -O3 takes strstr() results on the
 * returned buffer for pointers to the local `out` and warns
 * -Wdangling-pointer (a false positive). */
__attribute__((noinline)) static char *expect_rc(int want, const char *args)
{
    char *out = NULL;
    int rc = ls_test_cli(&out, "%s", args);
    ck_assert_msg(rc == want, "lockstep %s: exit %d, expected %d; output:\n%s", args, rc, want, out ? out : "");
    return out;
}

/* The command line fmt with every '@' replaced by the test directory, then a appended. */
static char *cmd(const char *fmt, const char *a)
{
    static char buf[8][8192];
    static int k;
    char *b = buf[k++ % 8];
    size_t n = 0;
    for (const char *f = fmt; *f && n < sizeof buf[0] - 4200; f++) {
        if (*f == '@') n += (size_t)snprintf(b + n, sizeof buf[0] - n, "%s", g_dir);
        else b[n++] = *f;
    }
    snprintf(b + n, sizeof buf[0] - n, "%s", a ? a : "");
    return b;
}

START_TEST(test_run_replay_compare)
{
    setup();
    free(expect_rc(0, cmd("run --checkpoint @/ck --mode rollout --prompts @/prompts.jsonl --max-new-tokens 9 "
                          "-o @/ro.trace --threads 2", NULL)));
    free(expect_rc(0, cmd("run --checkpoint @/ck --mode replay --from @/ro.trace --chunk 3 -o @/rp.trace",
                          NULL)));
    char *out = expect_rc(0, cmd("compare @/ro.trace @/rp.trace", NULL));
    ck_assert_msg(strstr(out, "PASS"), "compare output lacks PASS:\n%s", out);
    free(out);
    /* The header records the engine, the backend and the run parameters. */
    out = expect_rc(0, cmd("trace dump @/rp.trace", NULL));
    ck_assert_msg(strstr(out, "lockstep-cpu") && strstr(out, "prompt_len") && strstr(out, "state_digest_every"),
                  "header lacks engine/run params:\n%s", out);
    free(out);
    /* Perturbed replay: compare exits 1 and names decoder layer 2's gdn mixer. */
    free(expect_rc(0, cmd("run --checkpoint @/ck --mode replay --from @/ro.trace --chunk 3 -o @/pt.trace "
                          "--perturb layer=2,op=gdn", NULL)));
    out = expect_rc(1, cmd("compare @/ro.trace @/pt.trace", NULL));
    ck_assert_msg(strstr(out, "layer 5 (gdn, decoder layer 2)"), "drift not named at decoder layer 2:\n%s", out);
    ck_assert_msg(strstr(out, "FAIL"), "no FAIL:\n%s", out);
    ck_assert_msg(strstr(out, "perturbation A none, B layer=2,op=gdn"), "no perturbation note:\n%s", out);
    free(out);
}
END_TEST

/* Mutation through the CLI: for every operator of the perturbation switch, at
 * layers of the right kind (tiny: gated DeltaNet at 0 and 2, full attention at
 * 1 and 3), `lockstep compare` exits 1 and names exactly the perturbed trace
 * layer (mixer 1+2l, moe 2+2l, lm_head 2+2L) and its family as the first drift. */
START_TEST(test_mutation_named_by_compare)
{
    setup();
    static const struct {
        const char *op;
        int layer;
        const char *where; /* expected first-drift text */
    } cases[] = {
        {"gdn", 0, "layer 1 (gdn, decoder layer 0)"},
        {"gdn", 2, "layer 5 (gdn, decoder layer 2)"},
        {"conv", 0, "layer 1 (gdn, decoder layer 0)"},
        {"conv", 2, "layer 5 (gdn, decoder layer 2)"},
        {"attention", 1, "layer 3 (attention, decoder layer 1)"},
        {"attention", 3, "layer 7 (attention, decoder layer 3)"},
        {"norm", 0, "layer 1 (gdn, decoder layer 0)"},
        {"norm", 3, "layer 7 (attention, decoder layer 3)"},
        {"router", 0, "layer 2 (moe, decoder layer 0)"},
        {"router", 3, "layer 8 (moe, decoder layer 3)"},
        {"experts", 1, "layer 4 (moe, decoder layer 1)"},
        {"experts", 2, "layer 6 (moe, decoder layer 2)"},
        {"combine", 0, "layer 2 (moe, decoder layer 0)"},
        {"combine", 3, "layer 8 (moe, decoder layer 3)"},
        {"lm_head", 0, "layer 10 (lm_head"},
    };
    free(expect_rc(0, cmd("run --checkpoint @/ck --mode rollout --prompts @/prompts.jsonl --max-new-tokens 12 "
                          "--state-digest-every 1 -o @/mut-ro.trace", NULL)));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char extra[128];
        snprintf(extra, sizeof extra, " --perturb layer=%d,op=%s", cases[i].layer, cases[i].op);
        free(expect_rc(0, cmd("run --checkpoint @/ck --mode replay --from @/mut-ro.trace --chunk 5 "
                              "-o @/mut-pt.trace", extra)));
        char *out = expect_rc(1, cmd("compare @/mut-ro.trace @/mut-pt.trace", NULL));
        const char *first = strstr(out, "first drift");
        ck_assert_msg(first && strstr(first, cases[i].where),
                      "perturb layer=%d,op=%s: first drift not at '%s':\n%s", cases[i].layer, cases[i].op,
                      cases[i].where, out);
        free(out);
    }
}
END_TEST

/* --dump-layers: both traces carry the full tensors of decoder layer 2, so
 * compare names the first differing element with hex bits and ULP distance. */
START_TEST(test_dump_layers_element_diagnosis)
{
    setup();
    free(expect_rc(0, cmd("run --checkpoint @/ck --mode rollout --prompts @/prompts.jsonl --max-new-tokens 6 "
                          "--dump-layers 2 -o @/dump-ro.trace", NULL)));
    free(expect_rc(0, cmd("run --checkpoint @/ck --mode replay --from @/dump-ro.trace --chunk 4 --dump-layers 2 "
                          "--perturb layer=2,op=gdn -o @/dump-pt.trace", NULL)));
    char *out = expect_rc(1, cmd("compare --no-color @/dump-ro.trace @/dump-pt.trace", NULL));
    const char *t = strstr(out, "tensor: first differing element");
    ck_assert_msg(t && strstr(t, " ULP") && strstr(t, "(0x") == NULL && strstr(t, "A 0x") && strstr(t, "B 0x"),
                  "no element-level diagnosis:\n%s", out);
    free(out);
}
END_TEST

START_TEST(test_gate)
{
    setup();
    char *out = expect_rc(0, cmd("gate --checkpoint @/ck --prompts @/prompts.jsonl --max-new-tokens 6 "
                                 "--junit @/gate.xml", " --json -"));
    ck_assert_msg(strstr(out, "chunk 1") && strstr(out, "whole sequence") && strstr(out, "batch reversed") &&
                      strstr(out, "PASS: 5/5"), "gate table incomplete:\n%s", out);
    ck_assert_msg(strstr(out, "\"pass\": true"), "gate JSON lacks pass:\n%s", out);
    free(out);
    char p[4200];
    snprintf(p, sizeof p, "%s/gate.xml", g_dir);
    char *x = ls_test_read(p, NULL);
    ck_assert_msg(x && strstr(x, "<?xml") && strstr(x, "<testsuites") && strstr(x, "failures=\"0\"") &&
                      strstr(x, "</testsuites>"), "bad JUnit:\n%s", x ? x : "(none)");
    int open = 0, close = 0;
    for (const char *s = x; (s = strstr(s, "<testcase")); s++) open++;
    for (const char *s = x; (s = strstr(s, "</testcase>")); s++) close++;
    ck_assert_int_eq(open, 5);
    ck_assert_int_eq(close, 5);
    free(x);
}
END_TEST

START_TEST(test_demo)
{
    char *out = expect_rc(0, "demo");
    ck_assert_msg(strstr(out, "PASS: 2/2"), "demo lacks the PASS line:\n%s", out);
    ck_assert_msg(strstr(out, "first drift (chunk 3, perturbed gdn L2)") && strstr(out, "decoder layer 2"),
                  "demo lacks the drift line:\n%s", out);
    ck_assert_msg(strstr(out, "Merkle root"), "demo lacks the Merkle root:\n%s", out);
    free(out);
}
END_TEST

/* Exit 2 with exactly one "lockstep ...:" line naming what is wrong. */
static void expect_error(const char *args, const char *needle)
{
    char *out = expect_rc(2, args);
    ck_assert_msg(out && strstr(out, needle), "lockstep %s: message lacks '%s':\n%s", args, needle, out ? out : "");
    int lines = 0;
    for (const char *s = out; *s; s++) lines += *s == '\n';
    ck_assert_msg(lines <= 2, "more than one message line:\n%s", out); /* + the --help pointer for usage */
    free(out);
}

START_TEST(test_errors)
{
    setup();
    char p[4200];
    snprintf(p, sizeof p, "%s/bad.jsonl", g_dir);
    const char *bad = "{\"id\": 0, \"tokens\": [1, 2]}\n{\"id\": 1, \"tokens\": [1, \"a\"]}\n";
    ls_test_write(p, bad, strlen(bad));
    expect_error(cmd("run --checkpoint @/ck --mode rollout --prompts @/bad.jsonl -o @/x.trace", NULL),
                 "bad.jsonl:2: field tokens[1]");
    snprintf(p, sizeof p, "%s/bad2.jsonl", g_dir);
    const char *bad2 = "{\"id\": 0, \"tokens\": [1, 2]}\n{\"id\": 0, \"tokens\": [3]}\n";
    ls_test_write(p, bad2, strlen(bad2));
    expect_error(cmd("run --checkpoint @/ck --mode rollout --prompts @/bad2.jsonl -o @/x.trace", NULL),
                 "bad2.jsonl:2: field id");
    snprintf(p, sizeof p, "%s/big.jsonl", g_dir);
    const char *big = "{\"id\": 0, \"tokens\": [1, 5000]}\n";
    ls_test_write(p, big, strlen(big));
    expect_error(cmd("run --checkpoint @/ck --mode rollout --prompts @/big.jsonl -o @/x.trace", NULL),
                 "outside the vocabulary");
    expect_error(cmd("run --checkpoint @/missing --mode rollout --prompts @/prompts.jsonl -o @/x.trace",
                     NULL), "missing");
    expect_error(cmd("gate --checkpoint @/missing --prompts @/prompts.jsonl", NULL), "missing");
    expect_error(cmd("run --checkpoint @/ck --mode replay --from @/prompts.jsonl -o @/x.trace", NULL),
                 "prompts.jsonl");
    expect_error(cmd("run --checkpoint @/ck --mode rollout --prompts @/prompts.jsonl -o @/x.trace",
                     " --perturb layer=1,op=gdn"), "layer 1");
    /* a fast twin is the cuda backend's; a twin other than fast is no spec */
    expect_error(cmd("run --checkpoint @/ck --mode rollout --prompts @/prompts.jsonl -o @/x.trace",
                     " --perturb layer=0,op=attention,twin=fast"), "has no fast twins");
    expect_error(cmd("run --checkpoint @/ck --mode rollout --prompts @/prompts.jsonl -o @/x.trace",
                     " --perturb layer=0,op=gdn,twin=slow"), "layer=L,op=OP[,twin=fast]");
    expect_error("run --mode sideways", "--mode");
{ /* Without a GPU (or a CUDA build), --backend cuda fails closed, naming why. */
        char *out = NULL;
        int rc = ls_test_cli(&out, "%s", cmd("run --checkpoint @/ck --mode rollout --prompts @/prompts.jsonl "
                                               "-o @/cuda.trace", " --backend cuda"));
        ck_assert_msg(rc == 2 || rc == 0, "--backend cuda: exit %d:\n%s", rc, out ? out : "");
        if (rc == 2)
            ck_assert_msg(strstr(out, "--backend") && strstr(out, "cuda is not available") &&
                              (strstr(out, "no CUDA device") || strstr(out, "without CUDA")),
                          "unclear --backend cuda message:\n%s", out);
        free(out);
    }
    /* No trace is left behind by a failed run. */
    snprintf(p, sizeof p, "%s/x.trace", g_dir);
    ck_assert_ptr_null(fopen(p, "rb"));
    for (const char *c = "run\0gate\0demo\0"; *c; c += strlen(c) + 1) {
        char a[64];
        snprintf(a, sizeof a, "%s --help", c);
        free(expect_rc(0, a));
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cli_engine");
    TCase *tc = tcase_create("cli_engine");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_run_replay_compare);
    tcase_add_test(tc, test_mutation_named_by_compare);
    tcase_add_test(tc, test_dump_layers_element_diagnosis);
    tcase_add_test(tc, test_gate);
    tcase_add_test(tc, test_demo);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 1) ? 1 : 0;
}
