/* The tensor-core strict tier (`lockstep run --backend cuda --tier tc`;
 * docs/tensor-core-tier.md §2.2): every linear and the lm_head through one
 * cuBLASLt algorithm per weight shape, qualified row-invariant on this GPU at
 * engine start and pinned in the manifest.
 *
 * On synthetic checkpoints (Qwen3-Next tiny, Qwen3.5 tiny), through the CLI:
 *   - a seeded rollout is the same under other packings (--max-rows 7 with
 *     the batch reversed, --max-rows 256) and alone per sequence, and its
 *     teacher-forced replays at chunks 1, 7, 64, 256 and whole equal it,
 *     bit for bit (`lockstep compare`); in the recurrent GDN form and in the
 *     chunk-aligned one (--gdn-form chunk-aligned, docs/numerics.md §5.1:
 *     one prompt crosses position 64, so packings and chunks split a chunk);
 *   - against the portable tier on the same tokens it is not a bitwise
 *     claim: the |d logprob| distribution is printed (for the report), its
 *     median small (the same function, another summation order);
 *   - `manifest pin --tier tc` records tier tensor-core, the linear and
 *     lm_head rows and one pinned GEMM record per linear shape, and its
 *     digest is the one the run's trace carries; the portable manifest
 *     differs from it with a voiding difference; `manifest verify --tier tc`
 *     holds on the same GPU;
 *   - `manifest pin --tier tc --gdn-form chunk-aligned` records the GDN row
 *     of the chunk-aligned form on tensor cores (provider cuda-tensor-core,
 *     order chunk-aligned-64-wmma-tf32; --tier fast: cuda-fast, the same
 *     order), and the chunk-aligned rollout's trace carries its digest;
 *   - the fast tier (--tier fast: cuBLASLt's per-call choice, the combine by
 *     atomics, split-KV attention, GDN prefill in chunks from the call's
 *     start) runs as a non-strict run near the
 *     portable tier, pins mode fast with those rows, and differs from tc
 *     under manifest diff;
 *   - an FP8 checkpoint is refused (exit 2, naming it).
 * Every CUDA run is a CLI process; this process only asks for a device. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_cuda.h"
#include "testutil.h"

#define LS_GPU_SKIP 77

static char *g_dir;

#define N_MODELS 2
static const char *const g_model[N_MODELS] = {"tiny", "q35"};
#define N_SEQS 6
static const int g_lens[N_SEQS] = {1, 7, 12, 19, 30, 70};
/* The GDN forms the invariance runs in: the default (recurrent) and the
 * chunk-aligned one; the flag the rollouts add and the traces' name tag. */
#define N_FORMS 2
static const char *const g_form_flag[N_FORMS] = {"", " --gdn-form chunk-aligned"};
static const char *const g_form_tag[N_FORMS] = {"", "-ca"};
static const char *const g_form_name[N_FORMS] = {"recurrent GDN", "chunk-aligned GDN"};

static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("tier_tc");
    ls_test_synth_rank_models(g_dir);
    /* one prompt crosses position 64: the replays at chunks 64 and 256 split it */
    ls_test_write_prompts(g_dir, g_lens, N_SEQS, 0xC2B2AE3D27D4EB4Full, 1000);
    /* each prompt alone, for the batch-of-one rollouts */
    char *all = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/prompts.jsonl", g_dir);
    all = ls_test_read(path, NULL);
    char *line = all;
    for (int i = 0; i < N_SEQS; i++) {
        char *nl = strchr(line, '\n');
        ck_assert_msg(nl != NULL, "prompts.jsonl: line %d", i);
        snprintf(path, sizeof path, "%s/prompt%d.jsonl", g_dir, i);
        ls_test_write(path, line, (size_t)(nl - line + 1));
        line = nl + 1;
    }
    free(all);
}

static void cli_ok(const char *what, const char *fmt_args)
{
    char *out = NULL;
    int rc = ls_test_cli(&out, "%s", fmt_args);
    ck_assert_msg(rc == 0, "%s: exit %d\n%s", what, rc, out ? out : "");
    free(out);
}

/* `compare A B --json` (flags: more options, or ""): its report, *rc its
 * exit status (0 equal or 1 different; anything else fails the test). */
static json_t *compare_json(const char *a, const char *b, const char *flags, int *rc)
{
    char *out = NULL;
    *rc = ls_test_sh(&out, "'%s' --quiet compare %s/%s %s/%s%s --json - 2>/dev/null", LS_CLI_PATH, g_dir, a, g_dir,
                     b, flags);
    json_error_t je;
    json_t *j = (*rc == 0 || *rc == 1) && out ? json_loads(out, 0, &je) : NULL;
    ck_assert_msg(j != NULL, "compare %s %s%s: exit %d\n%s", a, b, flags, *rc, out ? out : "");
    free(out);
    return j;
}

/* `compare A B --json`: sequence `seq` (present in both) is bitwise equal
 * with every position of A compared; the other sequences of B are B's
 * alone. */
static int seq_equal(const char *a, const char *b, int seq)
{
    int rc;
    json_t *j = compare_json(a, b, "", &rc);
    int found = 0, equal = 0;
    json_t *sq = json_object_get(j, "sequences"), *e;
    size_t i;
    json_array_foreach(sq, i, e) {
        if (json_integer_value(json_object_get(e, "seq")) != seq) continue;
        found = 1;
        equal = !strcmp(json_string_value(json_object_get(e, "result")), "PASS") &&
                json_integer_value(json_object_get(e, "positions_only_a")) == 0 &&
                json_integer_value(json_object_get(e, "positions_only_b")) == 0;
    }
    ck_assert_msg(found, "compare %s %s: no sequence %d", a, b, seq);
    json_decref(j);
    return equal;
}

#define RUN_TC "run --backend cuda --tier tc --checkpoint %s/%s"
#define ROLLOUT "--mode rollout --max-new-tokens 6 --sampling seeded --seed 11 --state-digest-every 4"

/* Rollout under three packings and alone per sequence, replays at five
 * chunkings: all equal the first rollout. Loop index: model x GDN form
 * (the replays take the form from the rollout). */
START_TEST(test_tc_invariance)
{
    const char *mod = g_model[_i / N_FORMS], *form = g_form_flag[_i % N_FORMS], *tag = g_form_tag[_i % N_FORMS];
    const char *fname = g_form_name[_i % N_FORMS];
    char args[4096], name[64], ref[64];
    snprintf(ref, sizeof ref, "%s-tc%s.trace", mod, tag);
    snprintf(args, sizeof args, RUN_TC " " ROLLOUT "%s --prompts %s/prompts.jsonl --max-rows 24 -o %s/%s", g_dir,
             mod, form, g_dir, g_dir, ref);
    cli_ok("tc rollout", args);
    static const char *const packings[] = {"--max-rows 7 --reverse-batch", "--max-rows 256"};
    for (int p = 0; p < 2; p++) {
        snprintf(name, sizeof name, "%s-tc%s-pack%d.trace", mod, tag, p);
        snprintf(args, sizeof args, RUN_TC " " ROLLOUT "%s --prompts %s/prompts.jsonl %s -o %s/%s", g_dir, mod, form,
                 g_dir, packings[p], g_dir, name);
        cli_ok(packings[p], args);
        ls_test_expect_traces_equal(g_dir, ref, name, N_SEQS);
    }
    printf("  ok %s tc, %s: rollout equal at --max-rows 24, 7 (batch reversed) and 256\n", mod, fname);
    /* batch of one: the sequence's records equal its records in the batch */
    for (int i = 0; i < N_SEQS; i++) {
        snprintf(name, sizeof name, "%s-tc%s-alone%d.trace", mod, tag, i);
        snprintf(args, sizeof args, RUN_TC " " ROLLOUT "%s --prompts %s/prompt%d.jsonl --max-rows 24 -o %s/%s",
                 g_dir, mod, form, g_dir, i, g_dir, name);
        cli_ok("tc rollout alone", args);
        ck_assert_msg(seq_equal(name, ref, i), "%s, %s: sequence %d alone differs from it in the batch", mod, fname,
                      i);
    }
    printf("  ok %s tc, %s: each of %d sequences alone = in the batch\n", mod, fname, N_SEQS);
    static const char *const chunks[] = {"--chunk 1", "--chunk 7", "--chunk 64", "--chunk 256", ""};
    for (int c = 0; c < 5; c++) {
        snprintf(name, sizeof name, "%s-tc%s-replay%d.trace", mod, tag, c);
        snprintf(args, sizeof args, "run --backend cuda --checkpoint %s/%s --mode replay --from %s/%s %s -o %s/%s",
                 g_dir, mod, g_dir, ref, chunks[c], g_dir, name);
        cli_ok("tc replay (tier and GDN form from the rollout)", args);
        ls_test_expect_traces_equal(g_dir, ref, name, N_SEQS);
    }
    printf("  ok %s tc, %s: replays at chunks 1, 7, 64, 256 and whole = the rollout\n", mod, fname);
    fflush(stdout);
}
END_TEST

/* The portable tier's replay of the tokens of trace `ref` (a tc or fast
 * run): a distribution, not a bitwise claim; most positions must agree
 * closely (the same function in another summation order: a GEMM that
 * computed something else would move every position). Printed for the
 * report. */
static void expect_close_to_portable(const char *mod, const char *ref, const char *tier)
{
    char args[4096], name[64];
    snprintf(name, sizeof name, "%s-%s-portable-replay.trace", mod, tier);
    snprintf(args, sizeof args, "run --backend cuda --tier portable --checkpoint %s/%s --mode replay --from %s/%s "
             "-o %s/%s", g_dir, mod, g_dir, ref, g_dir, name);
    cli_ok("portable replay", args);
    int rc;
    json_t *j = compare_json(ref, name, " --stats", &rc);
    json_t *dl = json_object_get(json_object_get(j, "stats"), "dlogprob");
    double mx = json_number_value(json_object_get(dl, "max")), p99 = json_number_value(json_object_get(dl, "p99"));
    double p50 = json_number_value(json_object_get(dl, "p50"));
    double mean = json_number_value(json_object_get(dl, "mean"));
    json_int_t n = json_integer_value(json_object_get(dl, "n"));
    ck_assert_msg(n > 0, "%s vs %s: no positions compared", ref, name);
    /* bf16 operands, fp32 accumulation in both tiers: only the order
     * differs, so most positions agree closely; a flipped expert choice
     * downstream of a tiny difference can move a few by more (max) */
    ck_assert_msg(p50 < 0.05, "%s: %s vs portable median |d logprob| %.3g (max %.3g)", mod, tier, p50, mx);
    printf("  ok %s %s vs portable on the same tokens (%s): %lld positions, |d logprob| mean %.3g p50 %.3g "
           "p99 %.3g max %.3g\n", mod, tier, rc == 0 ? "bitwise equal" : "not bitwise equal", (long long)n, mean,
           p50, p99, mx);
    fflush(stdout);
    json_decref(j);
}

START_TEST(test_tc_vs_portable)
{
    const char *mod = g_model[_i];
    char args[4096], ref[64];
    snprintf(ref, sizeof ref, "%s-tc-vp.trace", mod);
    snprintf(args, sizeof args, RUN_TC " " ROLLOUT " --prompts %s/prompts.jsonl -o %s/%s", g_dir, mod, g_dir,
             g_dir, ref);
    cli_ok("tc rollout", args);
    expect_close_to_portable(mod, ref, "tc");
}
END_TEST

static json_t *load_json(const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    ck_assert_msg(j != NULL, "%s: %s", path, je.text);
    return j;
}

/* The header of trace `trace` carries the digest of the manifest `manifest`
 * pinned beside it (both in g_dir). */
static void expect_trace_digest(const char *trace, const char *manifest)
{
    char *out = NULL, *dig = NULL;
    int rc = ls_test_cli(&dig, "manifest digest %s/%s", g_dir, manifest);
    ck_assert_msg(rc == 0 && dig, "manifest digest %s: exit %d", manifest, rc);
    dig[strcspn(dig, " \n")] = '\0'; /* "HEX  FILE" */
    rc = ls_test_sh(&out, "'%s' trace dump %s/%s --json 2>/dev/null | head -1", LS_CLI_PATH, g_dir, trace);
    ck_assert_msg(rc == 0 && out && strstr(out, dig), "%s's header lacks the digest %s of %s:\n%.600s", trace, dig,
                  manifest, out ? out : "");
    free(out);
    free(dig);
}

/* The pinned manifest: what it records, its digest in the trace, the
 * difference to the portable tier's, verify on the same GPU. */
START_TEST(test_tc_manifest)
{
    char args[4096];
    snprintf(args, sizeof args, "manifest pin --checkpoint %s/tiny --backend cuda --tier tc -o %s/tc.json", g_dir,
             g_dir);
    cli_ok("manifest pin --tier tc", args);
    snprintf(args, sizeof args, "manifest pin --checkpoint %s/tiny --backend cuda -o %s/portable.json", g_dir, g_dir);
    cli_ok("manifest pin portable", args);
    json_t *m = load_json("tc.json");
    json_t *num = json_object_get(m, "numerics");
    ck_assert_str_eq(json_string_value(json_object_get(num, "tier")), "tensor-core");
    json_t *ops = json_object_get(num, "operators");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(ops, "linear"), "tier")), "tensor-core");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(ops, "lm_head"), "tier")), "tensor-core");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(ops, "rmsnorm"), "tier")), "portable");
    json_t *g = json_object_get(num, "tc_gemms");
    ck_assert_msg(json_is_array(g) && json_array_size(g) >= 4, "tc_gemms: %zu records", json_array_size(g));
    for (size_t i = 0; i < json_array_size(g); i++) {
        json_t *r = json_array_get(g, i);
        ck_assert_int_eq(json_integer_value(json_object_get(r, "splitk")), 1);
        ck_assert_int_eq(json_integer_value(json_object_get(r, "qualified_rows")), 1024);
        printf("    pinned %s\n", json_dumps(r, JSON_COMPACT | JSON_SORT_KEYS));
    }
    printf("  ok manifest pin --tier tc: %zu pinned GEMM shapes\n", json_array_size(g));
    json_decref(m);
    /* the run's trace carries the pinned manifest's digest */
    expect_trace_digest("tiny-tc.trace", "tc.json");
    /* portable -> tc is a voiding difference */
    char *out = NULL;
    int rc = ls_test_cli(&out, "manifest diff %s/portable.json %s/tc.json", g_dir, g_dir);
    ck_assert_msg(rc == 1 && out && strstr(out, "numerics.tier"), "diff: exit %d\n%s", rc, out ? out : "");
    free(out);
    rc = ls_test_cli(&out, "manifest verify %s/tc.json --checkpoint %s/tiny --backend cuda --tier tc", g_dir,
                     g_dir);
    ck_assert_msg(rc == 0, "verify --tier tc: exit %d\n%s", rc, out ? out : "");
    free(out);
    printf("  ok the trace's manifest digest is the pinned one; diff vs portable voids; verify holds\n");
}
END_TEST

/* The GDN row of `manifest pin --tier TIER --gdn-form chunk-aligned`
 * (pinned to g_dir/NAME): an operator row of a gdn op with provider
 * `provider` and the tensor-core chunk-aligned order, and the form. */
static void expect_gdn_tc_row(const char *tier, const char *name, const char *provider)
{
    char args[4096];
    snprintf(args, sizeof args, "manifest pin --checkpoint %s/tiny --backend cuda --tier %s --gdn-form chunk-aligned "
             "-o %s/%s", g_dir, tier, g_dir, name);
    cli_ok("manifest pin --gdn-form chunk-aligned", args);
    json_t *m = load_json(name);
    json_t *num = json_object_get(m, "numerics");
    ck_assert_str_eq(json_string_value(json_object_get(num, "gdn_form")), "chunk-aligned-64");
    json_t *ops = json_object_get(num, "operators"), *row;
    const char *op;
    int found = 0;
    json_object_foreach(ops, op, row) {
        if (strncmp(op, "gdn", 3) != 0) continue;
        const char *pv = json_string_value(json_object_get(row, "provider"));
        const char *order = json_string_value(json_object_get(row, "reduction_order"));
        printf("    %s: %s %s: %s / %s\n", name, tier, op, pv ? pv : "?", order ? order : "?");
        found |= pv && order && !strcmp(pv, provider) && !strcmp(order, "chunk-aligned-64-wmma-tf32");
    }
    ck_assert_msg(found, "%s: no gdn row with provider %s and order chunk-aligned-64-wmma-tf32", name, provider);
    json_decref(m);
}

/* The chunk-aligned form's manifests on the tc and fast tiers, and the
 * digest of the tc one in the chunk-aligned tc rollout's trace (after
 * test_tc_invariance, which writes tiny-tc-ca.trace). */
START_TEST(test_tc_gdn_chunked_manifest)
{
    expect_gdn_tc_row("tc", "tc-ca.json", "cuda-tensor-core");
    expect_trace_digest("tiny-tc-ca.trace", "tc-ca.json");
    expect_gdn_tc_row("fast", "fast-ca.json", "cuda-fast");
    printf("  ok manifest pin --gdn-form chunk-aligned: tc and fast tiers' gdn rows on tensor cores; the "
           "chunk-aligned trace carries the tc digest\n");
}
END_TEST

/* The fast tier: the same linears through cuBLASLt's per-call choice, the
 * combine by atomics, attention split by the call's size and GDN calls
 * chunked from their start, a non-strict run. It runs, says so, pins mode fast with its rows (no GEMM
 * records), and whether its replay in chunks of 1 still equals its rollout
 * is printed, not asserted: nothing promises it. */
START_TEST(test_fast_tier)
{
    char args[4096];
    char *out = NULL;
    snprintf(args, sizeof args, "run --backend cuda --tier fast --checkpoint %s/tiny " ROLLOUT " --prompts "
             "%s/prompts.jsonl -o %s/tiny-fast.trace", g_dir, g_dir, g_dir);
    int rc = ls_test_cli(&out, "%s", args);
    ck_assert_msg(rc == 0 && out && strstr(out, "fast tier: not a strict run"), "fast rollout: exit %d\n%s", rc,
                  out ? out : "");
    free(out);
    snprintf(args, sizeof args, "run --backend cuda --checkpoint %s/tiny --mode replay --from %s/tiny-fast.trace "
             "--chunk 1 -o %s/tiny-fast-rp.trace", g_dir, g_dir, g_dir);
    cli_ok("fast replay (tier from the rollout)", args);
    rc = ls_test_cli(&out, "compare %s/tiny-fast.trace %s/tiny-fast-rp.trace", g_dir, g_dir);
    ck_assert_msg(rc == 0 || rc == 1, "compare: exit %d\n%s", rc, out ? out : "");
    printf("  fast tier on tiny: rollout vs replay in chunks of 1 %s\n", rc == 0 ? "equal" : "differ");
    free(out);
    expect_close_to_portable("tiny", "tiny-fast.trace", "fast");
    snprintf(args, sizeof args, "manifest pin --checkpoint %s/tiny --backend cuda --tier fast -o %s/fast.json", g_dir,
             g_dir);
    cli_ok("manifest pin --tier fast", args);
    json_t *m = load_json("fast.json");
    json_t *num = json_object_get(m, "numerics");
    ck_assert_str_eq(json_string_value(json_object_get(num, "mode")), "fast");
    static const char *const fast_ops[] = {"linear", "lm_head", "experts", "attention", "combine", "gdn_recurrent"};
    for (int i = 0; i < 6; i++)
        ck_assert_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(num, "operators"),
                                                                           fast_ops[i]), "provider")), "cuda-fast");
    ck_assert_msg(!json_object_get(num, "tc_gemms"), "a fast manifest pins no GEMM records");
    json_decref(m);
    expect_trace_digest("tiny-fast.trace", "fast.json");
    rc = ls_test_cli(&out, "manifest diff %s/tc.json %s/fast.json", g_dir, g_dir);
    ck_assert_msg(rc == 1 && out && strstr(out, "numerics.mode"), "diff tc -> fast: exit %d\n%s", rc, out ? out : "");
    free(out);
    printf("  ok fast tier: runs, marked non-strict; manifest mode fast, its digest in the trace; tc -> fast voids\n");
}
END_TEST

START_TEST(test_tc_fp8_refused)
{
    char *out = NULL;
    int rc = ls_test_cli(&out, RUN_TC " " ROLLOUT " --prompts %s/prompts.jsonl -o %s/fp8.trace", g_dir, "q35fp8",
                         g_dir, g_dir);
    ck_assert_msg(rc == 2 && out && strstr(out, "FP8 checkpoint"), "exit %d\n%s", rc, out ? out : "");
    free(out);
    char path[4200];
    snprintf(path, sizeof path, "%s/fp8.trace", g_dir);
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    ck_assert_msg(!f, "%s exists after a refused run", path);
}
END_TEST

int main(void)
{
    if (ls_backend_cuda_device_count() < 1) {
        printf("SKIP: no CUDA device%s\n", ls_backend_cuda_built() ? "" : " (built without CUDA)");
        return LS_GPU_SKIP;
    }
    Suite *s = suite_create("gpu_tier_tc");
    TCase *tc = tcase_create("tier_tc");
    tcase_set_timeout(tc, 1800);
    tcase_add_unchecked_fixture(tc, setup, NULL);
    /* LS_GPU_QUICK (the sanitizer runs): Qwen3-Next tiny only */
    int models = getenv("LS_GPU_QUICK") ? 1 : N_MODELS;
    tcase_add_loop_test(tc, test_tc_invariance, 0, models * N_FORMS);
    tcase_add_loop_test(tc, test_tc_vs_portable, 0, models);
    tcase_add_test(tc, test_tc_manifest);
    tcase_add_test(tc, test_tc_gdn_chunked_manifest);
    tcase_add_test(tc, test_fast_tier); /* after test_tc_manifest: it diffs against tc.json */
    tcase_add_test(tc, test_tc_fp8_refused);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 1) ? EXIT_FAILURE : EXIT_SUCCESS;
}
