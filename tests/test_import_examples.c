/* The committed engine-shaped examples (tests/data/import/): they are what
 * harness/import_examples.py writes from today's lockstep rollout (so their
 * bits are known), each imports with one command, compares equal with a
 * lockstep replay of the same tokens and with the rollout, and a 1-ulp change
 * to one logprob is named with its position. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "trace/trace.h"

#define DATA LS_SOURCE_DIR "/tests/data/import"
/* The rollout the examples were written from (tests/data/import/README.md). */
#define ROLLOUT_ARGS                                                                                              \
    "--quiet run --checkpoint '" LS_SOURCE_DIR "/goldens/qwen3next_tiny_a' --mode rollout --prompts '" DATA      \
    "/prompts.jsonl' --max-new-tokens 8 --sampling seeded --seed 5 --temperature 1.0"

typedef struct example {
    const char *file, *format;
    int logprobs_only;       /* no top-k in the format */
    const char *positions;   /* seq 0's "compared/total" against the replay */
} example;

static const example examples[] = {
    {"vllm-completions.json", "vllm", 0, "13/13"}, /* prompt_logprobs: every position */
    {"vllm-chat.jsonl", "vllm", 0, "8/13"},        /* generated positions only */
    {"vllm-offline.jsonl", "vllm-offline", 0, "13/13"},
    {"sglang.json", "sglang", 0, "13/13"},
    {"verl.safetensors", "verl", 1, "8/13"},
    {"lockstep.jsonl", "jsonl", 0, "8/13"},
};
#define N_EXAMPLES (int)(sizeof examples / sizeof examples[0])

static char *dir;
static char fp[65];

static void setup(void)
{
    dir = ls_test_tmpdir("import_examples");
    char *out = NULL;
    int rc = ls_test_cli(&out, ROLLOUT_ARGS " -o '%s/rollout.trace'", dir);
    ck_assert_msg(rc == 0, "rollout failed:\n%s", out);
    free(out);
    char path[4300];
    snprintf(path, sizeof path, "%s/rollout.trace", dir);
    ls_error err;
    ls_trace_reader *r;
    ck_assert_msg(ls_trace_reader_open(path, &r, &err) == LS_OK, "%s", err.msg);
    snprintf(fp, sizeof fp, "%s", ls_trace_reader_header(r)->model_fingerprint);
    ls_trace_reader_close(r);
}
static void teardown(void) { ls_test_rm_tmpdir(dir); }

static int import_example(const example *e, const char *from_dir, const char *tag)
{
    char *out = NULL, tokens[4400] = "";
    if (strcmp(e->format, "jsonl")) snprintf(tokens, sizeof tokens, " --tokens-out '%s/tokens-%s'", dir, e->file);
    int rc = ls_test_cli(&out, "import %s '%s/%s' -o '%s/%s-%s.trace' --model-fingerprint %s%s", e->format, from_dir,
                         e->file, dir, tag, e->file, fp, tokens);
    if (rc) fprintf(stderr, "import %s: %s\n", e->file, out);
    free(out);
    return rc;
}

START_TEST(test_examples_are_generated_from_the_rollout)
{
    char *out = NULL;
    int rc = ls_test_sh(&out, "/usr/bin/python3 '%s/harness/import_examples.py' --lockstep '%s' '%s/rollout.trace' '%s/gen'",
                        LS_SOURCE_DIR, LS_CLI_PATH, dir, dir);
    ck_assert_msg(rc == 0, "%s", out);
    free(out);
    for (int i = 0; i < N_EXAMPLES; i++) {
        rc = ls_test_sh(&out, "cmp '%s/%s' '%s/gen/%s'", DATA, examples[i].file, dir, examples[i].file);
        ck_assert_msg(rc == 0, "tests/data/import/%s is not what harness/import_examples.py writes from today's "
                      "rollout (regenerate: tests/data/import/README.md):\n%s", examples[i].file, out);
        free(out);
    }
}
END_TEST

START_TEST(test_examples_import_and_compare_equal)
{
    char *out = NULL;
    for (int i = 0; i < N_EXAMPLES; i++) ck_assert_int_eq(import_example(&examples[i], DATA, "ex"), 0);
    /* every format gives the same replay tokens; replay them */
    for (int i = 1; i < N_EXAMPLES - 1; i++) {
        int rc = ls_test_sh(&out, "cmp '%s/tokens-%s' '%s/tokens-%s'", dir, examples[0].file, dir, examples[i].file);
        ck_assert_msg(rc == 0, "%s", out);
        free(out);
    }
    int rc = ls_test_cli(&out, "--quiet run --checkpoint '%s/goldens/qwen3next_tiny_a' --mode replay --tokens "
                         "'%s/tokens-%s' --chunk 3 -o '%s/replay.trace'", LS_SOURCE_DIR, dir, examples[0].file, dir);
    ck_assert_msg(rc == 0, "%s", out);
    free(out);
    for (int i = 0; i < N_EXAMPLES; i++) {
        const example *e = &examples[i];
        for (int against = 0; against < 2; against++) {
            rc = ls_test_cli(&out, "compare %s'%s/ex-%s.trace' '%s/%s.trace'", e->logprobs_only ? "--logprobs-only " : "",
                             dir, e->file, dir, against ? "rollout" : "replay");
            ck_assert_msg(rc == 0, "%s against the %s: exit %d\n%s", e->file, against ? "rollout" : "replay", rc, out);
            char want[64];
            snprintf(want, sizeof want, "0        PASS     %s", e->positions);
            ck_assert_msg(strstr(out, want), "%s: no '%s' in\n%s", e->file, want, out);
            if (strcmp(e->positions, "13/13"))
                ck_assert_msg(strstr(out, "15 positions of trace B before its sequences' first positions (prompt) not "
                                          "compared"), "%s", out);
            free(out);
        }
    }
}
END_TEST

/* Two engines' imports against each other: each holds the positions its
 * engine scored, so the prompt positions one holds (prompt logprobs) and the
 * other lacks are counted as not compared, not reported as drifts; every
 * pair compares equal. */
START_TEST(test_imports_compare_with_each_other)
{
    char *out = NULL;
    for (int i = 0; i < N_EXAMPLES; i++) ck_assert_int_eq(import_example(&examples[i], DATA, "ex"), 0);
    for (int i = 0; i < N_EXAMPLES; i++)
        for (int j = 0; j < N_EXAMPLES; j++) {
            const example *a = &examples[i], *b = &examples[j];
            int rc = ls_test_cli(&out, "compare %s'%s/ex-%s.trace' '%s/ex-%s.trace'",
                                 a->logprobs_only || b->logprobs_only ? "--logprobs-only " : "", dir, a->file, dir, b->file);
            ck_assert_msg(rc == 0, "%s against %s: exit %d\n%s", a->file, b->file, rc, out);
            int a_prompt = !strcmp(a->positions, "13/13"), b_prompt = !strcmp(b->positions, "13/13");
            char want[160];
            snprintf(want, sizeof want, "trace %s is an import (the positions its engine scored): 15 positions of trace %s "
                     "before its sequences' first positions (prompt) not compared", a_prompt ? "B" : "A", a_prompt ? "A" : "B");
            if (a_prompt != b_prompt) ck_assert_msg(strstr(out, want), "%s against %s: no '%s' in\n%s", a->file, b->file, want, out);
            else ck_assert_msg(!strstr(out, "(prompt) not compared"), "%s against %s:\n%s", a->file, b->file, out);
            snprintf(want, sizeof want, "0        PASS     %s", a_prompt && b_prompt ? "13/13" : a_prompt || b_prompt ? "8/13" : "8/8");
            ck_assert_msg(strstr(out, want), "%s against %s: no '%s' in\n%s", a->file, b->file, want, out);
            free(out);
        }
}
END_TEST

/* A format without top-k (verl) says so when imported, and a compare without
 * --logprobs-only, which fails on the unused slots, says why and what to ask. */
START_TEST(test_no_topk_says_logprobs_only)
{
    const example *e = NULL;
    for (int i = 0; i < N_EXAMPLES; i++)
        if (examples[i].logprobs_only) e = &examples[i];
    ck_assert_ptr_nonnull(e);
    char *out = NULL;
    int rc = ls_test_cli(&out, "import %s '%s/%s' -o '%s/nt.trace' --model-fingerprint %s", e->format, DATA, e->file, dir, fp);
    ck_assert_msg(rc == 0 && strstr(out, "top-1 (no top-k in the file: compare it with --logprobs-only)"), "rc %d: %s", rc, out);
    free(out);
    for (int swap = 0; swap < 2; swap++) {
        rc = ls_test_cli(&out, "compare '%s/%s.trace' '%s/%s.trace'", dir, swap ? "rollout" : "nt", dir, swap ? "nt" : "rollout");
        ck_assert_msg(rc == 1, "exit %d\n%s", rc, out);
        char want[200];
        snprintf(want, sizeof want, "trace %s holds no top-k entry at any position compared (its engine returned none): "
                 "--logprobs-only compares token ids and logprobs alone", swap ? "B" : "A");
        ck_assert_msg(strstr(out, want), "no '%s' in\n%s", want, out);
        free(out);
    }
    /* with entries on both sides there is no such note */
    rc = ls_test_cli(&out, "compare --logprobs-only '%s/nt.trace' '%s/rollout.trace'", dir, dir);
    ck_assert_msg(rc == 0 && !strstr(out, "holds no top-k"), "exit %d\n%s", rc, out);
    free(out);
}
END_TEST

/* The first command block of docs/import.md, run as written (lockstep on
 * PATH; DIR the examples' checkpoint, resp.json the vLLM example): it
 * imports, replays and compares equal. */
START_TEST(test_documented_commands_run)
{
    size_t n;
    char *doc = ls_test_read(LS_SOURCE_DIR "/docs/import.md", &n);
    char *b = strstr(doc, "\n```\n");
    ck_assert_ptr_nonnull(b);
    b += 5;
    char *e = strstr(b, "\n```");
    ck_assert_ptr_nonnull(e);
    e[1] = '\0';
    char script[8192] = "", *o = script;
    for (const char *p = b; *p && o < script + sizeof script - 600; p++) {
        if (!strncmp(p, "DIR", 3)) o += sprintf(o, "'%s/goldens/qwen3next_tiny_a'", LS_SOURCE_DIR), p += 2;
        else if (!strncmp(p, "resp.json", 9)) o += sprintf(o, "'%s/vllm-completions.json'", DATA), p += 8;
        else *o++ = *p;
    }
    *o = '\0';
    free(doc);
    ls_test_write_text(dir, "doc.sh", script);
    char bin[4200];
    snprintf(bin, sizeof bin, "%s", LS_CLI_PATH);
    *strrchr(bin, '/') = '\0';
    char *out = NULL;
    int rc = ls_test_sh(&out, "cd '%s' && PATH='%s':\"$PATH\" sh -e doc.sh", dir, bin);
    ck_assert_msg(rc == 0 && strstr(out, "PASS: 3/3 sequences bitwise equal"), "docs/import.md's commands: exit %d\n%s\n%s",
                  rc, script, out);
    free(out);
}
END_TEST

START_TEST(test_one_ulp_is_named)
{
    char *out = NULL;
    int rc = ls_test_sh(&out, "/usr/bin/python3 '%s/harness/import_examples.py' --lockstep '%s' --bump 1:5 "
                        "'%s/rollout.trace' '%s/bump'", LS_SOURCE_DIR, LS_CLI_PATH, dir, dir);
    ck_assert_msg(rc == 0, "%s", out);
    free(out);
    char bump_dir[4300];
    snprintf(bump_dir, sizeof bump_dir, "%s/bump", dir);
    for (int i = 0; i < N_EXAMPLES; i++) {
        const example *e = &examples[i];
        ck_assert_int_eq(import_example(e, bump_dir, "bump"), 0);
        rc = ls_test_cli(&out, "compare %s'%s/bump-%s.trace' '%s/rollout.trace'",
                         e->logprobs_only ? "--logprobs-only " : "", dir, e->file, dir);
        ck_assert_msg(rc == 1, "%s: a 1-ulp change not found (exit %d)\n%s", e->file, rc, out);
        ck_assert_msg(strstr(out, "seq 1 first drift (first overall): seq 1 pos 5: selected-token logprob bits differ: "
                                  "A 0xc02a142d (-2.65748143), B 0xc02a142c (-2.65748119)"),
                      "%s: the drift is not named at seq 1 pos 5:\n%s", e->file, out);
        ck_assert_msg(strstr(out, "0        PASS") && strstr(out, "2        PASS"), "%s", out);
        free(out);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("import_examples");
    TCase *tc = tcase_create("import_examples");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_examples_are_generated_from_the_rollout);
    tcase_add_test(tc, test_examples_import_and_compare_equal);
    tcase_add_test(tc, test_imports_compare_with_each_other);
    tcase_add_test(tc, test_no_topk_says_logprobs_only);
    tcase_add_test(tc, test_documented_commands_run);
    tcase_add_test(tc, test_one_ulp_is_named);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
