/* Options that mean nothing in a run's mode are refused, never ignored: at
 * the command line (exit 2, one line naming the flag, no trace written) and
 * in the run layer (ls_run_spec_validate), so the C API and the gate refuse
 * them too. A replay of a rollout trace made from another checkpoint is
 * refused by the run layer, naming both Merkle roots, before any trace is
 * written. */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <lockstep/lockstep.h>

#include "run/load.h"
#include "run/run.h"
#include "testutil.h"

static char *g_dir;           /* a: tiny seed 7, b: tiny seed 8, ro.trace: a rollout on a */
static char g_root_a[65], g_root_b[65];
static char g_ck_a[4200], g_ck_b[4200], g_x[4200], g_ro[4200]; /* paths in g_dir */

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The command line fmt with every '@' replaced by the test directory. */
static char *cmd(const char *fmt)
{
    static char buf[4][8192];
    static int k;
    char *b = buf[k++ % 4];
    size_t n = 0;
    for (const char *f = fmt; *f && n < sizeof buf[0] - 4200; f++) {
        if (*f == '@') n += (size_t)snprintf(b + n, sizeof buf[0] - n, "%s", g_dir);
        else b[n++] = *f;
    }
    b[n] = '\0';
    return b;
}

/* The merkle_root line of `lockstep fingerprint --checkpoint DIR`. */
static void merkle_root(const char *ck, char out[65])
{
    char *o = NULL;
    int rc = ls_test_cli(&o, "fingerprint --checkpoint %s/%s", g_dir, ck);
    const char *m = o ? strstr(o, "merkle_root") : NULL;
    ck_assert_msg(rc == 0 && m, "fingerprint %s: exit %d:\n%s", ck, rc, o ? o : "");
    m += strlen("merkle_root");
    while (*m == ' ') m++;
    ck_assert_msg(sscanf(m, "%64[0-9a-f]", out) == 1 && strlen(out) == 64, "no root in:\n%s", o);
    free(o);
}

static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("run-modes");
    snprintf(g_ck_a, sizeof g_ck_a, "%s/a", g_dir);
    snprintf(g_ck_b, sizeof g_ck_b, "%s/b", g_dir);
    snprintf(g_x, sizeof g_x, "%s/x.trace", g_dir);
    snprintf(g_ro, sizeof g_ro, "%s/ro.trace", g_dir);
    for (int i = 0; i < 2; i++) {
        char *o = NULL;
        int rc = ls_test_cli(&o, "synth --preset tiny --seed %d --out %s/%c", 7 + i, g_dir, 'a' + i);
        ck_assert_msg(rc == 0, "synth failed: %s", o ? o : "");
        free(o);
    }
    ls_test_write_text(g_dir, "prompts.jsonl", "{\"id\": 0, \"tokens\": [1, 2, 3, 4]}\n"
                                               "{\"id\": 5, \"tokens\": [9, 8]}\n");
    char *o = NULL;
    int rc = ls_test_cli(&o, "%s", cmd("run --checkpoint @/a --mode rollout --prompts @/prompts.jsonl "
                                       "--max-new-tokens 4 -o @/ro.trace"));
    ck_assert_msg(rc == 0, "rollout failed: %s", o ? o : "");
    free(o);
    merkle_root("a", g_root_a);
    merkle_root("b", g_root_b);
    ck_assert_str_ne(g_root_a, g_root_b);
}

/* lockstep ARGS exits 2 with one message line containing every needle
 * (NULL-terminated) and leaves no @/x.trace behind. */
static void expect_refused(const char *args, ...)
{
    char *o = NULL;
    int rc = ls_test_cli(&o, "%s", cmd(args));
    ck_assert_msg(rc == 2, "lockstep %s: exit %d, expected 2:\n%s", args, rc, o ? o : "");
    va_list ap;
    va_start(ap, args);
    for (const char *n; (n = va_arg(ap, const char *));)
        ck_assert_msg(strstr(o, n), "lockstep %s: message lacks '%s':\n%s", args, n, o);
    va_end(ap);
    int lines = 0;
    for (const char *s = o; *s; s++) lines += *s == '\n';
    ck_assert_msg(lines == 1, "lockstep %s: %d lines, expected one:\n%s", args, lines, o);
    free(o);
    ck_assert_msg(!exists(g_x), "lockstep %s left x.trace behind", args);
}

static void expect_ok(const char *args)
{
    char *o = NULL;
    int rc = ls_test_cli(&o, "%s", cmd(args));
    ck_assert_msg(rc == 0, "lockstep %s: exit %d, expected 0:\n%s", args, rc, o ? o : "");
    free(o);
}

#define RO "run --checkpoint @/a --mode rollout --prompts @/prompts.jsonl -o @/x.trace "
#define RP "run --checkpoint @/a --mode replay --from @/ro.trace -o @/x.trace "

START_TEST(test_cli_refuses_flags_the_mode_does_not_use)
{
    setup();
    expect_refused("run --checkpoint @/a --prompts @/prompts.jsonl -o @/x.trace", "--mode is required", NULL);
    expect_refused(RO "--chunk 3", "--chunk applies to --mode replay only", NULL);
    expect_refused(RP "--max-new-tokens 4", "--max-new-tokens applies to --mode rollout only", NULL);
    expect_refused(RP "--max-new-tokens 16", "--max-new-tokens applies", NULL); /* even the default */
    expect_refused(RP "--sampling greedy", "--sampling applies to --mode rollout only", NULL);
    expect_refused(RP "--sampling seeded --seed 3", "applies to --mode rollout only", NULL);
    expect_refused(RP "--seed 3", "--seed applies to --mode rollout only", NULL);
    expect_refused(RO "--seed 5", "--seed applies to --sampling seeded only", NULL);
    expect_refused(RO "--seed 0", "--seed applies to --sampling seeded only", NULL); /* the neutral value */
    expect_refused(RO "--sampling greedy --temperature 0.5", "--temperature applies to --sampling seeded", NULL);
    expect_refused(RO "--top-k 1", "--top-k applies to --sampling seeded only", NULL);
    expect_refused(RO "--top-p 1", "--top-p applies to --sampling seeded only", NULL);
    /* What each mode does use still runs. */
    expect_ok(RO "--sampling seeded --seed 5 --temperature 0.7 --top-k 20 --top-p 0.9 --max-new-tokens 3");
    ck_assert(exists(g_x));
    remove(g_x);
    expect_ok(RP "--chunk 2 --reverse-batch");
    remove(g_x);
}
END_TEST

START_TEST(test_cli_replay_of_another_checkpoint)
{
    setup();
    expect_refused("run --checkpoint @/b --mode replay --from @/ro.trace -o @/x.trace", "ro.trace",
                   "model_fingerprint", g_root_a, g_root_b, "/b", NULL);
}
END_TEST

START_TEST(test_cli_import_topk)
{
    setup();
    ls_test_write_text(g_dir, "in.jsonl",
                       "{\"seq\": 0, \"pos\": 3, \"token\": 7, \"logprob\": -0.5, \"top_logprobs\": {\"7\": -0.5}}\n");
    char args[512];
    static const char *const bad[] = {"0", "-1", "65", "abc", "5x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "import jsonl @/in.jsonl -o @/x.trace --model-fingerprint %s --topk %s",
                 g_root_a, bad[i]);
        expect_refused(args, "--topk", "1..64", NULL);
    }
    snprintf(args, sizeof args, "import jsonl @/in.jsonl -o @/x.trace --model-fingerprint %s --topk 1", g_root_a);
    expect_ok(args);
    remove(g_x);
}
END_TEST

/* ---- the run layer ---------------------------------------------------------------------- */

static ls_run_batch g_prompts;

static void spec_base(ls_run_spec *s, const char *mode)
{
    if (!g_prompts.n) {
        const char *jl = "{\"id\": 0, \"tokens\": [1, 2, 3]}\n";
        ls_error err;
        ck_assert_int_eq(ls_run_parse_prompts("prompts", jl, strlen(jl), 0, &g_prompts, &err), LS_OK);
    }
    ls_run_spec_default(s);
    s->checkpoint = g_ck_a;
    s->out = g_x;
    s->batch = &g_prompts;
    s->mode = mode;
    if (mode && !strcmp(mode, "rollout")) s->max_new = 2;
}

static void expect_invalid(const ls_run_spec *s, const char *what, const char *needle)
{
    ls_error err;
    ls_error_clear(&err);
    ls_status st = ls_run_spec_validate(s, &err);
    ck_assert_msg(st == LS_E_USAGE, "%s: status %s, expected usage (%s)", what, ls_status_name(st), err.msg);
    ck_assert_msg(strstr(err.msg, needle), "%s: message lacks '%s': %s", what, needle, err.msg);
}

START_TEST(test_spec_validate)
{
    setup();
    ls_run_spec s;
    ls_error err;
    spec_base(&s, "rollout");
    ck_assert_msg(ls_run_spec_validate(&s, &err) == LS_OK, "%s", err.msg);
    spec_base(&s, NULL);
    expect_invalid(&s, "no mode", "mode (--mode) is required");
    spec_base(&s, "rollout");
    s.max_new = 0;
    expect_invalid(&s, "rollout without a budget", "max_new");
    spec_base(&s, "rollout");
    s.chunk = 3;
    expect_invalid(&s, "chunk in a rollout", "chunk (--chunk) applies to replays only");
    spec_base(&s, "rollout");
    s.sampling.seed = 9;
    expect_invalid(&s, "seed with greedy", "apply to seeded sampling only");
    spec_base(&s, "rollout");
    s.sampling.top_p = 0.5f;
    expect_invalid(&s, "top_p with greedy", "apply to seeded sampling only");
    spec_base(&s, "rollout");
    s.expect_merkle_root = g_root_a;
    expect_invalid(&s, "expected root in a rollout", "expect_merkle_root applies to replays only");
    spec_base(&s, "replay");
    s.max_new = 4;
    expect_invalid(&s, "budget in a replay", "max_new (--max-new-tokens) applies to rollouts only");
    spec_base(&s, "replay");
    s.sampling.kind = LS_SAMPLING_SEEDED;
    s.sampling.seed = 1;
    expect_invalid(&s, "sampling in a replay", "applies to rollouts only");
    spec_base(&s, "replay");
    s.chunk = -1;
    expect_invalid(&s, "negative chunk", "chunk (--chunk) must be >= 1");
    spec_base(&s, "rollout");
    s.gpu = 1;
    expect_invalid(&s, "a GPU with the cpu backend", "gpu (--gpu) 1 applies to the cuda backend only");
    spec_base(&s, "rollout");
    s.gpu = 3;
    s.backend = "cuda";
    ck_assert_msg(ls_run_spec_validate(&s, &err) == LS_OK, "%s", err.msg); /* the backend judges it */
}
END_TEST

/* --gpu N chooses the CUDA device: refused with the cpu backend (given at
 * all, whatever N), not an integer refused, and a device this machine does
 * not have refused in one line naming the devices it has (or, without a
 * GPU or a CUDA build, why cuda is not available); never a trace. The run
 * layer refuses a device with cpu in its other entry points too. */
START_TEST(test_gpu_option)
{
    setup();
    expect_refused(RO "--gpu 0", "--gpu applies to --backend cuda only", "the backend is cpu", NULL);
    expect_refused(RO "--backend cpu --gpu 2", "--gpu applies to --backend cuda only", NULL);
    expect_refused(RO "--backend cuda --gpu one", "--gpu 'one': expected an integer", NULL);
    expect_refused("gate --checkpoint @/a --prompts @/prompts.jsonl --gpu 1",
                   "--gpu applies to --backend cuda only", NULL);
    expect_refused("demo --gpu 0", "--gpu applies to --backend cuda only", NULL);
    static const char *const bad[] = {RO "--backend cuda --gpu 99", RO "--backend cuda --gpu -1",
                                      ("gate --checkpoint @/a --prompts @/prompts.jsonl --backend cuda "
                                       "--gpu 99")};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *o = NULL;
        int rc = ls_test_cli(&o, "%s", cmd(bad[i]));
        ck_assert_msg(rc == 2, "lockstep %s: exit %d, expected 2:\n%s", bad[i], rc, o ? o : "");
        int lines = 0;
        for (const char *c = o; *c; c++) lines += *c == '\n';
        const char *dev = strstr(bad[i], "-1") ? "no CUDA device -1: this machine has "
                                               : "no CUDA device 99: this machine has ";
        ck_assert_msg(lines == 1 && (strstr(o, dev) || strstr(o, "cuda is not available") ||
                                     strstr(o, "this lockstep was built without CUDA")),
                      "lockstep %s:\n%s", bad[i], o);
        free(o);
        ck_assert_msg(!exists(g_x), "lockstep %s left x.trace behind", bad[i]);
    }
    ls_error err;
    ls_error_clear(&err);
    ls_backend *be = NULL;
    ck_assert_int_eq(ls_run_backend_create("cpu", 1, 2, &be, &err), LS_E_USAGE);
    ck_assert_msg(strstr(err.msg, "gpu (--gpu) 2 applies to the cuda backend only") && !be, "%s",
                  err.msg);
    ls_manifest_opts mo = ls_manifest_opts_default();
    ls_run_facts info;
    ck_assert_int_eq(ls_run_manifest_facts("cpu", 1, &mo, &info, &err), LS_E_USAGE);
    ck_assert_msg(strstr(err.msg, "applies to the cuda backend only"), "%s", err.msg);
    ls_status st = ls_run_manifest_facts("cuda", 4096, &mo, &info, &err);
    ck_assert_msg((st == LS_E_USAGE && strstr(err.msg, "no CUDA device 4096: this machine has ")) ||
                      (st == LS_E_UNSUPPORTED && strstr(err.msg, "built without CUDA")),
                  "status %s: %s", ls_status_name(st), err.msg);
}
END_TEST

START_TEST(test_run_layer_refuses_another_checkpoint)
{
    setup();
    ls_run_batch full;
    ls_run_rollout_info info;
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_run_load_rollout(g_ro, &full, &info, &err) == LS_OK, "%s", err.msg);
    ck_assert_str_eq(info.model_fingerprint, g_root_a);
    ls_run_spec s;
    ls_run_result res;
    spec_base(&s, "replay");
    s.batch = &full;
    s.checkpoint = g_ck_b;
    s.expect_merkle_root = info.model_fingerprint;
    ls_status st = ls_run_execute(&s, &res, &err);
    ck_assert_msg(st == LS_E_INPUT, "status %s (%s)", ls_status_name(st), err.msg);
    ck_assert_msg(strstr(err.msg, g_root_a) && strstr(err.msg, g_root_b) && strstr(err.msg, "expect_merkle_root"),
                  "message lacks both roots: %s", err.msg);
    ck_assert(!exists(s.out));
    /* The rollout's own checkpoint replays. */
    s.checkpoint = g_ck_a;
    ck_assert_msg(ls_run_execute(&s, &res, &err) == LS_OK, "%s", err.msg);
    free(res.completions);
    ck_assert(exists(s.out));
    remove(s.out);
    ls_run_batch_free(&full);
}
END_TEST

/* ---- the C API ---------------------------------------------------------------------------- */

static void api_expect(lockstep_status got, const lockstep_error *e, lockstep_status want, const char *needle,
                       const char *out)
{
    ck_assert_msg(got == want, "status %s, want %s (%s)", lockstep_status_name(got), lockstep_status_name(want),
                  e->message);
    ck_assert_msg(strstr(e->message, needle), "message lacks '%s': %s", needle, e->message);
    ck_assert_msg(!exists(out), "a failed run left %s", out);
}

START_TEST(test_api_refuses)
{
    setup();
    lockstep_checkpoint *a = NULL, *b = NULL;
    lockstep_error e;
    ck_assert_msg(lockstep_checkpoint_open(g_ck_a, &a, &e) == LOCKSTEP_OK, "%s", e.message);
    ck_assert_msg(lockstep_checkpoint_open(g_ck_b, &b, &e) == LOCKSTEP_OK, "%s", e.message);
    const char *out = g_x, *ro = g_ro;
    const int32_t toks[] = {4, 5, 6};
    const lockstep_sequence one = {.id = 1, .tokens = toks, .n_tokens = 3};
    lockstep_run_options o;

    api_expect(lockstep_replay(b, ro, NULL, out, &e), &e, LOCKSTEP_E_INPUT, g_root_b, out);
    ck_assert_msg(strstr(e.message, g_root_a) && strstr(e.message, "ro.trace"), "%s", e.message);
    lockstep_run_options_default(&o);
    o.chunk = 2;
    api_expect(lockstep_rollout(a, &one, 1, &o, out, &e), &e, LOCKSTEP_E_USAGE, "chunk", out);
    lockstep_run_options_default(&o);
    o.seed = 3;
    api_expect(lockstep_rollout(a, &one, 1, &o, out, &e), &e, LOCKSTEP_E_USAGE, "seeded sampling only", out);
    lockstep_run_options_default(&o);
    o.max_new_tokens = 7;
    api_expect(lockstep_replay(a, ro, &o, out, &e), &e, LOCKSTEP_E_USAGE, "max_new", out);
    lockstep_run_options_default(&o);
    o.sampling = "seeded";
    o.seed = 3;
    api_expect(lockstep_replay(a, ro, &o, out, &e), &e, LOCKSTEP_E_USAGE, "rollouts only", out);
    /* Defaults replay, on the rollout's checkpoint. */
    lockstep_run_options_default(&o);
    o.chunk = 3;
    ck_assert_msg(lockstep_replay(a, ro, &o, out, &e) == LOCKSTEP_OK, "%s", e.message);
    remove(out);
    lockstep_checkpoint_close(a);
    lockstep_checkpoint_close(b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("run_modes");
    TCase *tc = tcase_create("run_modes");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_cli_refuses_flags_the_mode_does_not_use);
    tcase_add_test(tc, test_cli_replay_of_another_checkpoint);
    tcase_add_test(tc, test_cli_import_topk);
    tcase_add_test(tc, test_spec_validate);
    tcase_add_test(tc, test_gpu_option);
    tcase_add_test(tc, test_run_layer_refuses_another_checkpoint);
    tcase_add_test(tc, test_api_refuses);
    suite_add_tcase(s, tc);
    int failed = ls_test_run_suite(s, 1);
    if (g_prompts.n) ls_run_batch_free(&g_prompts);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    return failed ? 1 : 0;
}
