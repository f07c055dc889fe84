/* The public C API (include/lockstep/lockstep.h): versions, one status and
 * message per call, option validation that names the field, rollout = replay
 * in every framing the API offers, completions in prompt order, a planted
 * drift found and reported, and no trace left behind by a failed run.
 * tests/install/ runs the same API from an installed tree. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <lockstep/lockstep.h>

#include "testutil.h"

static char *dir;                /* the suite's temporary directory */
static char ckpt[4200];          /* dir/ckpt: synthetic tiny, seed 1 */
static char path_buf[8][4300];

/* dir/name (a few live at once: slot picks the buffer). */
static const char *at(int slot, const char *name)
{
    snprintf(path_buf[slot], sizeof path_buf[slot], "%s/%s", dir, name);
    return path_buf[slot];
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static const int32_t p0[] = {11, 7, 42, 3, 99};  /* two prompts of different lengths */
static const int32_t p1[] = {500, 1, 998};

static lockstep_checkpoint *open_ckpt(void)
{
    lockstep_checkpoint *ck = NULL;
    lockstep_error e;
    ck_assert_msg(lockstep_checkpoint_open(ckpt, &ck, &e) == LOCKSTEP_OK, "%s", e.message);
    ck_assert_ptr_nonnull(ck);
    ck_assert_int_eq(e.status, LOCKSTEP_OK);
    ck_assert_str_eq(e.message, "");
    return ck;
}

/* Compares a and b; returns the verdict (the comparison itself must run). */
static lockstep_verdict compare(const char *a, const char *b, const lockstep_compare_options *o)
{
    lockstep_verdict v;
    lockstep_error e;
    ck_assert_msg(lockstep_compare(a, b, o, &v, &e) == LOCKSTEP_OK, "%s", e.message);
    return v;
}

START_TEST(test_version_and_status)
{
    ck_assert_str_eq(lockstep_version(), LOCKSTEP_VERSION_STRING);
    ck_assert_uint_eq(lockstep_version_number(), LOCKSTEP_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", LOCKSTEP_VERSION_MAJOR, LOCKSTEP_VERSION_MINOR,
             LOCKSTEP_VERSION_PATCH);
    ck_assert_str_eq(lockstep_version(), want);
    ck_assert_str_eq(lockstep_status_name(LOCKSTEP_OK), "ok");
    ck_assert_str_eq(lockstep_status_name(LOCKSTEP_E_INPUT), "input");
    ck_assert_str_eq(lockstep_status_name(LOCKSTEP_E_INTERNAL), "internal");
    ck_assert_str_eq(lockstep_status_name((lockstep_status)99), "?");
}
END_TEST

START_TEST(test_open_errors)
{
    lockstep_checkpoint *ck = (lockstep_checkpoint *)1;
    lockstep_error e;
    const char *missing = at(0, "no-such-checkpoint");
    lockstep_status st = lockstep_checkpoint_open(missing, &ck, &e);
    ck_assert_int_ne(st, LOCKSTEP_OK);
    ck_assert_int_eq(e.status, st);
    ck_assert_ptr_null(ck);
    ck_assert_msg(strstr(e.message, "no-such-checkpoint"), "message does not name the path: %s", e.message);
    /* err may be NULL; the status still says what happened. */
    ck_assert_int_eq(lockstep_checkpoint_open(missing, &ck, NULL), st);
    ck_assert_int_eq(lockstep_checkpoint_open(NULL, &ck, &e), LOCKSTEP_E_USAGE);
    lockstep_checkpoint_close(NULL);

    ck = open_ckpt();
    ck_assert_int_eq(lockstep_checkpoint_vocab_size(ck), 1000);
    ck_assert_int_eq(lockstep_checkpoint_n_layers(ck), 4);
    ck_assert_uint_eq(strlen(lockstep_checkpoint_fingerprint(ck)), 64);
    ck_assert_ptr_null(lockstep_checkpoint_last_run(ck));
    lockstep_checkpoint_close(ck);
}
END_TEST

/* Each bad input fails with `want` status, a message containing `needle`,
 * and no trace at the output path. */
static void expect_fail(lockstep_status got, const lockstep_error *e, lockstep_status want, const char *needle,
                        const char *trace)
{
    ck_assert_msg(got == want, "status %s, want %s (%s)", lockstep_status_name(got), lockstep_status_name(want),
                  e->message);
    ck_assert_int_eq(e->status, want);
    ck_assert_msg(strstr(e->message, needle), "message lacks '%s': %s", needle, e->message);
    ck_assert_msg(!exists(trace), "a failed run left %s", trace);
}

START_TEST(test_run_errors)
{
    lockstep_checkpoint *ck = open_ckpt();
    lockstep_error e;
    const char *out = at(0, "bad.trace");
    const lockstep_sequence one = {.id = 0, .tokens = p0, .n_tokens = 5};
    lockstep_run_options o;

    lockstep_run_options_default(&o);
    o.activations = "fp16";
    expect_fail(lockstep_rollout(ck, &one, 1, &o, out, &e), &e, LOCKSTEP_E_USAGE, "activations", out);
    lockstep_run_options_default(&o);
    o.sampling = "beam";
    expect_fail(lockstep_rollout(ck, &one, 1, &o, out, &e), &e, LOCKSTEP_E_USAGE, "sampling", out);
    lockstep_run_options_default(&o);
    o.max_new_tokens = 0;
    expect_fail(lockstep_rollout(ck, &one, 1, &o, out, &e), &e, LOCKSTEP_E_USAGE, "max_new", out);
    lockstep_run_options_default(&o);
    o.backend = "tpu";
    expect_fail(lockstep_rollout(ck, &one, 1, &o, out, &e), &e, LOCKSTEP_E_USAGE, "backend", out);
    lockstep_run_options_default(&o);
    o.gdn_form = "chunked";
    expect_fail(lockstep_rollout(ck, &one, 1, &o, out, &e), &e, LOCKSTEP_E_USAGE, "gdn_form 'chunked'", out);
    lockstep_run_options_default(&o);
    o.perturb = "layer=9,op=gdn";
    expect_fail(lockstep_rollout(ck, &one, 1, &o, out, &e), &e, LOCKSTEP_E_USAGE, "layer 9", out);

    const int32_t big[] = {3, 1000};
    const lockstep_sequence oov = {.id = 7, .tokens = big, .n_tokens = 2};
    expect_fail(lockstep_rollout(ck, &oov, 1, NULL, out, &e), &e, LOCKSTEP_E_INPUT,
                "sequence 7: token 1000 at position 1", out);
    const lockstep_sequence twins[2] = {{.id = 4, .tokens = p0, .n_tokens = 5}, {.id = 4, .tokens = p1, .n_tokens = 3}};
    expect_fail(lockstep_rollout(ck, twins, 2, NULL, out, &e), &e, LOCKSTEP_E_USAGE, "the same id 4", out);
    expect_fail(lockstep_rollout(ck, &one, 0, NULL, out, &e), &e, LOCKSTEP_E_USAGE, "no sequences", out);
    const lockstep_sequence no_prompt = {.id = 2, .tokens = p0, .n_tokens = 5, .prompt_len = 5};
    expect_fail(lockstep_replay_sequences(ck, &no_prompt, 1, NULL, out, &e), &e, LOCKSTEP_E_USAGE,
                "prompt_len 5", out);
    expect_fail(lockstep_rollout(ck, &one, 1, NULL, NULL, &e), &e, LOCKSTEP_E_USAGE, "trace_path", out);
    expect_fail(lockstep_replay(ck, at(1, "missing.trace"), NULL, out, &e), &e, LOCKSTEP_E_IO, "missing.trace", out);
    /* Nothing ran: there is still no last run. */
    ck_assert_ptr_null(lockstep_checkpoint_last_run(ck));
    lockstep_checkpoint_close(ck);
}
END_TEST

START_TEST(test_rollout_equals_replay)
{
    lockstep_checkpoint *ck = open_ckpt();
    lockstep_error e;
    const lockstep_sequence prompts[2] = {{.id = 3, .tokens = p0, .n_tokens = 5}, {.id = 9, .tokens = p1, .n_tokens = 3}};
    lockstep_run_options o;
    lockstep_run_options_default(&o);
    o.max_new_tokens = 6;
    o.activations = "fp32";   /* the replays below must take it from the rollout */
    o.state_digest_every = 2;
    const char *ro = at(0, "ro.trace");
    ck_assert_msg(lockstep_rollout(ck, prompts, 2, &o, ro, &e) == LOCKSTEP_OK, "%s", e.message);
    const lockstep_run_summary *sum = lockstep_checkpoint_last_run(ck);
    ck_assert_ptr_nonnull(sum);
    ck_assert_int_eq(sum->n_sequences, 2);
    ck_assert_int_eq(sum->max_new_tokens, 6);
    ck_assert_uint_eq(sum->records, (5 + 6 - 1) + (3 + 6 - 1));
    ck_assert_str_eq(sum->model_fingerprint, lockstep_checkpoint_fingerprint(ck));
    ck_assert_uint_eq(strlen(sum->manifest_digest), 64);
    int32_t done[2][6];
    memcpy(done, sum->completions, sizeof done);

    /* The batch packed in reverse generates the same tokens, reported in
     * the order the prompts were given. */
    lockstep_run_options rev = o;
    rev.reverse_batch = 1;
    ck_assert_msg(lockstep_rollout(ck, prompts, 2, &rev, at(1, "ro_rev.trace"), &e) == LOCKSTEP_OK, "%s", e.message);
    sum = lockstep_checkpoint_last_run(ck);
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < 6; t++)
            ck_assert_msg(sum->completions[i * 6 + t] == done[i][t],
                          "reversed batch: prompt %d token %d: %d, in order %d", i, t, sum->completions[i * 6 + t],
                          done[i][t]);
    lockstep_verdict v = compare(ro, at(1, "ro_rev.trace"), NULL);
    ck_assert_msg(v.equal, "%s", v.line);

    /* Replays from the trace, whole and 2 tokens per step, with 1 row per
     * forward; and the full sequences handed over in memory. */
    lockstep_run_options rp;
    lockstep_run_options_default(&rp);
    ck_assert_msg(lockstep_replay(ck, ro, NULL, at(2, "rp.trace"), &e) == LOCKSTEP_OK, "%s", e.message);
    rp.chunk = 2;
    rp.max_rows = 1;
    ck_assert_msg(lockstep_replay(ck, ro, &rp, at(3, "rp2.trace"), &e) == LOCKSTEP_OK, "%s", e.message);
    ck_assert_int_eq(lockstep_checkpoint_last_run(ck)->max_new_tokens, 0);
    ck_assert_ptr_null(lockstep_checkpoint_last_run(ck)->completions);
    int32_t f0[5 + 6], f1[3 + 6];
    memcpy(f0, p0, sizeof p0);
    memcpy(f0 + 5, done[0], sizeof done[0]);
    memcpy(f1, p1, sizeof p1);
    memcpy(f1 + 3, done[1], sizeof done[1]);
    const lockstep_sequence full[2] = {{.id = 3, .tokens = f0, .n_tokens = 11, .prompt_len = 5},
                                       {.id = 9, .tokens = f1, .n_tokens = 9, .prompt_len = 3}};
    lockstep_run_options given;
    lockstep_run_options_default(&given);
    given.activations = "fp32";   /* given tokens carry no dtype: say the rollout's */
    given.state_digest_every = 2;
    ck_assert_msg(lockstep_replay_sequences(ck, full, 2, &given, at(4, "rpt.trace"), &e) == LOCKSTEP_OK, "%s",
                  e.message);
    for (int k = 2; k <= 4; k++) {
        v = compare(ro, path_buf[k], NULL);
        ck_assert_msg(v.equal, "%s: %s", path_buf[k], v.line);
        ck_assert_int_eq(v.sequences, 2);
        ck_assert_int_eq(v.sequences_failed, 0);
        ck_assert_uint_eq(v.positions, 18);
        ck_assert_int_eq(v.drift, 0);
        ck_assert_str_eq(v.drift_what, "");
        ck_assert_msg(!strncmp(v.line, "equal: 2 sequences, 18 positions", 32), "%s", v.line);
    }

    /* The chunk-aligned GDN form: its replay (the form taken from the
     * rollout) equals it; the recurrent rollout does not. */
    lockstep_run_options ca = o;
    ca.gdn_form = "chunk-aligned";
    ck_assert_msg(lockstep_rollout(ck, prompts, 2, &ca, at(5, "ca.trace"), &e) == LOCKSTEP_OK, "%s", e.message);
    rp.gdn_form = NULL;
    ck_assert_msg(lockstep_replay(ck, at(5, "ca.trace"), &rp, at(6, "ca_rp.trace"), &e) == LOCKSTEP_OK, "%s",
                  e.message);
    v = compare(at(5, "ca.trace"), at(6, "ca_rp.trace"), NULL);
    ck_assert_msg(v.equal, "chunk-aligned rollout vs its replay: %s", v.line);
    v = compare(ro, at(5, "ca.trace"), NULL);
    ck_assert_msg(!v.equal, "the recurrent and chunk-aligned rollouts are equal");
    lockstep_checkpoint_close(ck);
}
END_TEST

START_TEST(test_drift_and_reports)
{
    lockstep_checkpoint *ck = open_ckpt();
    lockstep_error e;
    const lockstep_sequence one = {.id = 5, .tokens = p0, .n_tokens = 5};
    const char *ro = at(0, "d_ro.trace"), *rp = at(1, "d_rp.trace");
    ck_assert_msg(lockstep_rollout(ck, &one, 1, NULL, ro, &e) == LOCKSTEP_OK, "%s", e.message);
    /* A replay with decoder layer 1's norm reduced in reverse order. */
    lockstep_run_options o;
    lockstep_run_options_default(&o);
    o.perturb = "layer=1,op=norm";
    ck_assert_msg(lockstep_replay(ck, ro, &o, rp, &e) == LOCKSTEP_OK, "%s", e.message);
    lockstep_compare_options co;
    lockstep_compare_options_default(&co);
    co.report_text = at(2, "d.txt");
    co.report_json = at(3, "d.json");
    co.report_junit = at(4, "d.xml");
    co.report_html = at(5, "d.html");
    lockstep_verdict v = compare(ro, rp, &co);
    ck_assert_msg(!v.equal && v.drift, "%s", v.line);
    ck_assert_int_eq(v.sequences_failed, 1);
    ck_assert_uint_eq(v.drift_sequence, 5);
    ck_assert_int_ge(v.drift_layer, 0);
    ck_assert_str_eq(v.drift_what, "digest");
    ck_assert_msg(!strncmp(v.line, "drift: 1 of 1 sequences differ; first: seq 5 pos ", 49), "%s", v.line);
    ck_assert_msg(strstr(v.line, "decoder layer 1"), "%s", v.line);
    for (int k = 2; k <= 5; k++) ck_assert_msg(exists(path_buf[k]), "no report %s", path_buf[k]);
    json_error_t je;
    json_t *j = json_load_file(co.report_json, 0, &je);
    ck_assert_msg(j, "%s: %s", co.report_json, je.text);
    json_decref(j);

    /* A comparison that cannot run: an error, and a verdict that says so. */
    lockstep_status st = lockstep_compare(ro, at(6, "missing.trace"), NULL, &v, &e);
    ck_assert_int_eq(st, LOCKSTEP_E_IO);
    ck_assert_int_eq(v.equal, 0);
    ck_assert_msg(strstr(e.message, "missing.trace"), "%s", e.message);
    ck_assert_msg(!strncmp(v.line, "could not compare: ", 19), "%s", v.line);
    lockstep_checkpoint_close(ck);
}
END_TEST

/* Once for the suite (unchecked: outside the tests' forks). */
static void suite_setup(void)
{
    dir = ls_test_tmpdir("api");
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    lockstep_error e;
    ck_assert_msg(lockstep_synth_checkpoint("tiny", 1, ckpt, &e) == LOCKSTEP_OK, "synth: %s", e.message);
}

static void suite_teardown(void)
{
    ls_test_rm_tmpdir(dir);
}

int main(void)
{
    Suite *s = suite_create("api");
    TCase *tc = tcase_create("api");
    tcase_add_unchecked_fixture(tc, suite_setup, suite_teardown);
    tcase_add_test(tc, test_version_and_status);
    tcase_add_test(tc, test_open_errors);
    tcase_add_test(tc, test_run_errors);
    tcase_add_test(tc, test_rollout_equals_replay);
    tcase_add_test(tc, test_drift_and_reports);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
