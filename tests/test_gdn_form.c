/* The chunk-aligned GDN form from the command line (--gdn-form chunk-aligned,
 * docs/numerics.md §5.1), on synthetic Qwen3-Next tiny and Qwen3.5 tiny
 * checkpoints with prompts of 1, 63, 64, 65 and 130 tokens (each side of a
 * chunk boundary, and two boundaries):
 *   - a rollout equals its replays in chunks of 1, 7, 64, 256 and whole,
 *     every record and digest (`lockstep compare`); the replays take the
 *     form from the rollout's run_params.gdn_form;
 *   - the recurrent form's rollout of the same prompts differs (the form
 *     changes bits), and so do the manifests: numerics.gdn_form and the
 *     gdn_recurrent row's kernel and reduction fingerprint (the probe's
 *     gdn_chunked row), voiding under `manifest diff`;
 *   - `gate` on Qwen3-Next tiny with the rollout as served (a GRPO group of 4 with prefix reuse,
 *     seeded preemption and a paged cache of 17) passes in that form: forks,
 *     snapshots and restores carry the chunk's rows; so does prefix reuse of
 *     69 shared positions (a snapshot taken 5 rows into a chunk);
 *   - a value other than recurrent or chunk-aligned is refused (exit 2,
 *     naming --gdn-form). The cuda backend's form is tests/gpu's. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static char *g_dir;
static const char *const g_model[2] = {"tiny", "q35"};

static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("gdnform");
    char *out = NULL;
    ck_assert_msg(ls_test_cli(&out, "synth --preset tiny --seed 5 --out %s/tiny", g_dir) == 0, "%s", out);
    free(out);
    ck_assert_msg(ls_test_cli(&out, "synth --preset qwen3.5-tiny --seed 6 --out %s/q35", g_dir) == 0, "%s", out);
    free(out);
    static const int lens[] = {1, 63, 64, 65, 130};
    ls_test_write_prompts(g_dir, lens, 5, 0x2545F4914F6CDD1Dull, 500);
    /* two prompts sharing their first 70 tokens (a chunk and 6 rows): prefix
     * reuse then restores a snapshot taken inside a chunk */
    char path[4200], text[4096];
    int n = snprintf(text, sizeof text, "{\"id\": 0, \"tokens\": [");
    for (int i = 0; i < 100; i++) n += snprintf(text + n, sizeof text - (size_t)n, "%s%d", i ? ", " : "", (i * 37 + 11) % 500);
    n += snprintf(text + n, sizeof text - (size_t)n, "]}\n{\"id\": 1, \"tokens\": [");
    for (int i = 0; i < 73; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%s%d", i ? ", " : "", i < 70 ? (i * 37 + 11) % 500 : 400 + i);
    snprintf(text + n, sizeof text - (size_t)n, "]}\n");
    snprintf(path, sizeof path, "%s/shared.jsonl", g_dir);
    ls_test_write(path, text, strlen(text));
}

static void teardown(void) {}

/* Exit code and output of `lockstep ARGS` (args already formatted). */
static int cli(char **out, const char *args)
{
    return ls_test_cli(out, "%s", args);
}

START_TEST(test_rollout_equals_replays)
{
    setup();
    const char *m = g_model[_i];
    char ck[4200], a[4200], cmd[16384];
    snprintf(ck, sizeof ck, "%s/%s", g_dir, m);
    snprintf(a, sizeof a, "%s/%s-ca.trace", g_dir, m);
    char *out = NULL;
    snprintf(cmd, sizeof cmd, "run --checkpoint %s --mode rollout --prompts %s/prompts.jsonl --max-new-tokens 6 "
             "--state-digest-every 16 --gdn-form chunk-aligned -o %s", ck, g_dir, a);
    int rc = cli(&out, cmd);
    ck_assert_msg(rc == 0, "%s", out);
    free(out);
    /* under AddressSanitizer chunks of 7, 64 and whole (1 and 256 run the same code) */
    static const char *const chunks[] = {"--chunk 7", "--chunk 64", "", "--chunk 1", "--chunk 256"};
    for (int c = 0; c < (LS_TEST_ASAN ? 3 : 5); c++) {
        snprintf(cmd, sizeof cmd, "run --checkpoint %s --mode replay --from %s %s -o %s/%s-rp%d.trace", ck, a,
                 chunks[c], g_dir, m, c);
        rc = cli(&out, cmd);
        ck_assert_msg(rc == 0, "replay %s: %s", chunks[c], out);
        free(out);
        snprintf(cmd, sizeof cmd, "compare %s %s/%s-rp%d.trace", a, g_dir, m, c);
        rc = cli(&out, cmd);
        ck_assert_msg(rc == 0 && strstr(out, "PASS: 5/5 sequences bitwise equal"), "%s replay %s: exit %d\n%s", m,
                      chunks[c][0] ? chunks[c] : "whole", rc, out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "trace dump %s/%s-rp2.trace --positions 0", g_dir, m); /* the whole replay */
    rc = cli(&out, cmd);
    ck_assert_msg(rc == 0 && strstr(out, "chunk-aligned-64"), "the replay's header lacks gdn_form:\n%s", out);
    free(out);
    /* the recurrent form gives other bits */
    snprintf(cmd, sizeof cmd, "run --checkpoint %s --mode rollout --prompts %s/prompts.jsonl --max-new-tokens 6 "
             "--state-digest-every 16 -o %s/%s-rec.trace", ck, g_dir, g_dir, m);
    rc = cli(&out, cmd);
    ck_assert_msg(rc == 0, "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "compare %s %s/%s-rec.trace", a, g_dir, m);
    rc = cli(&out, cmd);
    ck_assert_msg(rc == 1 && strstr(out, "FAIL"), "%s: chunk-aligned and recurrent rollouts: exit %d\n%s", m, rc, out);
    free(out);
}
END_TEST

START_TEST(test_gate_served)
{
    setup();
    char cmd[16384];
    char *out = NULL;
    snprintf(cmd, sizeof cmd, "gate --checkpoint %s/%s --prompts %s/prompts.jsonl --max-new-tokens 5 "
             "--gdn-form chunk-aligned --samples-per-prompt 4 --seed 3 --prefix-cache any --preempt seeded:5 "
             "--kv-page 17 --workdir %s/gate-%s", g_dir, g_model[_i], g_dir, g_dir, g_model[_i]);
    int rc = cli(&out, cmd);
    ck_assert_msg(rc == 0, "gate, chunk-aligned, GRPO 4 + prefix reuse + preemption + paged: exit %d\n%s", rc, out);
    free(out);
    /* prefix reuse inside a chunk: the second prompt starts from the first's
     * state after 69 of the 70 shared positions (64 folded, 5 rows carried) */
    snprintf(cmd, sizeof cmd, "-v gate --checkpoint %s/%s --prompts %s/shared.jsonl --max-new-tokens 4 "
             "--gdn-form chunk-aligned --prefix-cache any --workdir %s/gate-shared-%s", g_dir, g_model[_i], g_dir,
             g_dir, g_model[_i]);
    rc = cli(&out, cmd);
    ck_assert_msg(rc == 0 && strstr(out, "69 prompt positions reused"), "gate, chunk-aligned, prefix reuse: exit %d\n%s",
                  rc, out);
    free(out);
}
END_TEST

START_TEST(test_manifest)
{
    setup();
    char cmd[16384];
    char *out = NULL;
    snprintf(cmd, sizeof cmd, "manifest pin --checkpoint %s/tiny --gdn-form chunk-aligned -o %s/ca.json", g_dir,
             g_dir);
    int rc = cli(&out, cmd);
    ck_assert_msg(rc == 0, "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "manifest pin --checkpoint %s/tiny -o %s/rec.json", g_dir, g_dir);
    rc = cli(&out, cmd);
    ck_assert_msg(rc == 0, "%s", out);
    free(out);
    char path[4200];
    snprintf(path, sizeof path, "%s/ca.json", g_dir);
    size_t n = 0;
    char *text = ls_test_read(path, &n);
    ck_assert_msg(text && strstr(text, "\"gdn_form\": \"chunk-aligned-64\"") && strstr(text, "ls_cpu_gdn_chunked_heads") &&
                      strstr(text, "gdn-chunk-aligned-64-dot32"),
                  "the manifest lacks the form or its row");
    free(text);
    snprintf(cmd, sizeof cmd, "manifest diff %s/rec.json %s/ca.json", g_dir, g_dir);
    rc = cli(&out, cmd);
    /* the form, and the row's kernel and probe fingerprint (the probe's gdn_chunked row) */
    ck_assert_msg(rc == 1 && strstr(out, "numerics.gdn_form") && strstr(out, "voiding") &&
                      strstr(out, "numerics.operators.gdn_recurrent.kernel_id") &&
                      strstr(out, "numerics.operators.gdn_recurrent.reduction_fingerprint"),
                  "exit %d\n%s", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "manifest verify %s/ca.json --checkpoint %s/tiny --gdn-form chunk-aligned", g_dir,
             g_dir);
    rc = cli(&out, cmd);
    ck_assert_msg(rc == 0, "verify with the form: exit %d\n%s", rc, out);
    free(out);
}
END_TEST

START_TEST(test_refusals)
{
    setup();
    char cmd[16384];
    char *out = NULL;
    snprintf(cmd, sizeof cmd,
             "run --checkpoint %s/tiny --mode rollout --prompts %s/prompts.jsonl --gdn-form chunked -o %s/x.trace",
             g_dir, g_dir, g_dir);
    int rc = cli(&out, cmd);
    ck_assert_msg(rc == 2 && strstr(out, "--gdn-form") && strstr(out, "expected recurrent or chunk-aligned"),
                  "%s: exit %d\n%s", cmd, rc, out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gdn_form");
    TCase *tc = tcase_create("cli");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_rollout_equals_replays, 0, 2);
    tcase_add_loop_test(tc, test_gate_served, 0, 1); /* Qwen3-Next tiny (the slowest suite under ASan) */
    tcase_add_test(tc, test_manifest);
    tcase_add_test(tc, test_refusals);
    suite_add_tcase(s, tc);
    int failed = ls_test_run_suite(s, 1);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    return failed ? 1 : 0;
}
