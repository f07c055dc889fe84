/* A synthetic checkpoint generated in memory (ls_synth_checkpoint, the
 * `--checkpoint synth:PRESET,seed=N,...` argument) is the checkpoint
 * `lockstep synth` writes: the same config digest, tensor table, tensor
 * digests and Merkle root (per-expert, fused and sharded, FP8, truncated);
 * its streamed bytes are the written bytes, also for tensors streamed in
 * several pieces (a fused stack, FP8 weights and scales in bands of 128
 * rows); and `run` on it writes the written checkpoint's trace (every
 * record, the manifest digest and the model fingerprint), on one rank and on
 * tensor- and expert-parallel ranks that each generate their share;
 * `manifest pin` differs only in checkpoint.path; bad specs exit 2 naming
 * the argument. */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint/fingerprint.h"
#include "io/checkpoint.h"
#include "run/run.h"
#include "synth/synth.h"
#include "testutil.h"

static char *g_dir;

typedef struct model_case {
    const char *name;     /* written into g_dir/NAME */
    const char *synth;    /* lockstep synth arguments */
    const char *spec;     /* the same as a --checkpoint synth: spec */
} model_case;

static const model_case k_cases[] = {
    {"tiny", "--preset tiny --seed 3", "synth:tiny,seed=3"},
    {"q35", "--preset qwen3.5-tiny --seed 4 --max-shard-bytes 100KB", "synth:qwen3.5-tiny,seed=4"},
    {"q35pe", "--preset qwen3.5-tiny --seed 4 --expert-layout per-expert", "synth:qwen3.5-tiny,seed=4,experts=per-expert"},
    {"q35fp8", "--preset qwen3.5-tiny --seed 8 --fp8", "synth:qwen3.5-tiny,seed=8,fp8"},
    {"small2", "--preset small --seed 5 --layers 2", "synth:small,seed=5,layers=2"},
};
#define N_CASES (sizeof k_cases / sizeof k_cases[0])

static void setup(void)
{
    if (g_dir) return;
    g_dir = ls_test_tmpdir("synth_checkpoint");
    for (size_t i = 0; i < N_CASES; i++) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "synth %s --out %s/%s", k_cases[i].synth, g_dir, k_cases[i].name);
        ck_assert_msg(rc == 0, "synth %s: %s", k_cases[i].synth, out ? out : "");
        free(out);
    }
    static const int lens[3] = {5, 9, 3};
    ls_test_write_prompts(g_dir, lens, 3, 17, 200);
}

typedef struct collect {
    unsigned char *buf;
    size_t len, cap;
    size_t pieces;
} collect;

static ls_status collect_piece(void *ctx, const void *bytes, size_t n, ls_error *err)
{
    (void)err;
    collect *c = ctx;
    if (c->len + n > c->cap) {
        c->cap = (c->len + n) * 2;
        c->buf = realloc(c->buf, c->cap);
        ck_assert(c->buf != NULL);
    }
    memcpy(c->buf + c->len, bytes, n);
    c->len += n;
    c->pieces++;
    return LS_OK;
}

START_TEST(test_fingerprint_and_bytes_equal_the_written)
{
    ls_error err;
    ls_error_clear(&err);
    for (size_t i = 0; i < N_CASES; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", g_dir, k_cases[i].name);
        ls_checkpoint *w = NULL, *g = NULL;
        ck_assert_msg(ls_checkpoint_open(path, &w, &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(ls_run_checkpoint_open(k_cases[i].spec, &g, NULL, &err) == LS_OK, "%s", err.msg);
        ck_assert(ls_checkpoint_generated(g) && !ls_checkpoint_generated(w));
        ck_assert_uint_eq(ls_checkpoint_shard_count(g), 0);
        size_t cl_w, cl_g;
        const char *cw = ls_checkpoint_config_text(w, &cl_w), *cg = ls_checkpoint_config_text(g, &cl_g);
        ck_assert_msg(cl_w == cl_g && !memcmp(cw, cg, cl_w), "%s: config.json differs", k_cases[i].name);
        ck_assert_uint_eq(ls_checkpoint_count(w), ls_checkpoint_count(g));
        for (size_t k = 0; k < ls_checkpoint_count(w); k++) {
            const ls_tensor *a = ls_checkpoint_at(w, k), *b = ls_checkpoint_at(g, k);
            ck_assert_str_eq(a->name, b->name);
            ck_assert_str_eq(a->stored_name, b->stored_name);
            ck_assert_int_eq(a->dtype, b->dtype);
            ck_assert_uint_eq(a->size_bytes, b->size_bytes);
            ck_assert(b->data == NULL);
            collect c = {0};
            ck_assert_msg(ls_checkpoint_stream(g, b, collect_piece, &c, &err) == LS_OK, "%s", err.msg);
            ck_assert_msg(c.len == a->size_bytes && !memcmp(c.buf, a->data, c.len), "%s: %s: streamed bytes differ",
                          k_cases[i].name, a->name);
            free(c.buf);
        }
        ls_fingerprint fw, fg;
        ls_fingerprint_opts fo = {2, 0};
        ck_assert_msg(ls_fingerprint_checkpoint(w, &fo, &fw, &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(ls_fingerprint_checkpoint(g, &fo, &fg, &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(!memcmp(&fw.merkle_root, &fg.merkle_root, sizeof fw.merkle_root), "%s: roots differ",
                      k_cases[i].name);
        ck_assert(!memcmp(&fw.config_digest, &fg.config_digest, sizeof fw.config_digest));
        ck_assert_uint_eq(fg.bytes_hashed, fw.total_bytes);
        ck_assert_uint_eq(fg.files_hashed, 0);
        ls_fingerprint_free(&fw);
        ls_fingerprint_free(&fg);
        ls_checkpoint_close(w);
        ls_checkpoint_close(g);
    }
}
END_TEST

/* Tensors larger than one piece: the streamed bytes are ls_synth_fill_bytes's. */
START_TEST(test_stream_in_pieces)
{
    ls_synth_tensor t[4];
    memset(t, 0, sizeof t);
    snprintf(t[0].name, sizeof t[0].name, "model.embed_tokens.weight"); /* 6 MB: two pieces */
    t[0].ndim = 2;
    t[0].shape[0] = 3000;
    t[0].shape[1] = 1000;
    t[0].std = 0.02;
    snprintf(t[1].name, sizeof t[1].name, "model.layers.0.mlp.experts.gate_up_proj");
    t[1].ndim = 3;
    t[1].shape[0] = 5;
    t[1].shape[1] = 2 * 300;
    t[1].shape[2] = 1000; /* 6 MB, 10 slices */
    t[1].std = 0.02;
    t[1].fused = LS_SYNTH_FUSED_GATE_UP;
    snprintf(t[2].name, sizeof t[2].name, "model.layers.0.self_attn.q_proj.weight");
    t[2].ndim = 2;
    t[2].shape[0] = 1300; /* bands of 512 rows: 512, 512, 276 */
    t[2].shape[1] = 8192;
    t[2].std = 0.02;
    t[2].fp8 = LS_SYNTH_F8_WEIGHT;
    t[3] = t[2];
    snprintf(t[3].name, sizeof t[3].name, "model.layers.0.self_attn.q_proj.weight_scale_inv");
    t[3].fp8 = LS_SYNTH_F8_SCALE;
    t[3].shape[0] = LS_FP8_BLOCKS(1300);
    t[3].shape[1] = LS_FP8_BLOCKS(8192);
    t[3].wshape[0] = 1300;
    t[3].wshape[1] = 8192;
    const size_t min_pieces[4] = {2, 10, 3, 3};
    ls_error err;
    ls_error_clear(&err);
    for (int i = 0; i < 4; i++) {
        uint64_t n = ls_synth_tensor_bytes(&t[i]);
        unsigned char *want = malloc(n);
        ck_assert(want != NULL);
        ck_assert_msg(ls_synth_fill_bytes(&t[i], 11, want, &err) == LS_OK, "%s", err.msg);
        collect c = {0};
        ck_assert_msg(ls_synth_stream_bytes(&t[i], 11, collect_piece, &c, &err) == LS_OK, "%s", err.msg);
        ck_assert_msg(c.len == n && !memcmp(c.buf, want, n), "%s: streamed bytes differ", t[i].name);
        ck_assert_msg(c.pieces >= min_pieces[i], "%s: %zu pieces", t[i].name, c.pieces);
        free(c.buf);
        free(want);
    }
}
END_TEST

/* run on the generated checkpoint writes the written checkpoint's trace,
 * on one rank and on ranks that generate their own share. */
START_TEST(test_run_equals_the_written)
{
    static const char *const models[][2] = {{"tiny", "synth:tiny,seed=3"}, {"q35fp8", "synth:qwen3.5-tiny,seed=8,fp8"}};
    for (size_t i = 0; i < 2; i++) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "run --checkpoint %s/%s --mode rollout --prompts %s/prompts.jsonl "
                             "--max-new-tokens 5 -o %s/w%zu.trace", g_dir, models[i][0], g_dir, g_dir, i);
        ck_assert_msg(rc == 0, "%s", out ? out : "");
        free(out);
        static const char *const topo[] = {"", "--threads 3", "--tp 2 --threads 2", "--ep 2", "--afd 1:1"};
        for (size_t k = 0; k < sizeof topo / sizeof topo[0]; k++) {
            rc = ls_test_cli(&out, "run --checkpoint %s --mode rollout --prompts %s/prompts.jsonl "
                             "--max-new-tokens 5 %s -o %s/g%zu_%zu.trace", models[i][1], g_dir, topo[k], g_dir, i, k);
            ck_assert_msg(rc == 0, "%s %s: %s", models[i][1], topo[k], out ? out : "");
            free(out);
            char a[64], b[64];
            snprintf(a, sizeof a, "w%zu.trace", i);
            snprintf(b, sizeof b, "g%zu_%zu.trace", i, k);
            ls_test_expect_traces_equal(g_dir, a, b, 3);
        }
        /* the same header claims: model fingerprint and manifest digest */
        char *hw = NULL, *hg = NULL;
        ck_assert_int_eq(ls_test_sh(&hw, "'%s' trace dump '%s/w%zu.trace' --json | head -n 1", LS_CLI_PATH, g_dir, i), 0);
        ck_assert_int_eq(ls_test_sh(&hg, "'%s' trace dump '%s/g%zu_0.trace' --json | head -n 1", LS_CLI_PATH, g_dir, i),
                         0);
        const char *keys[] = {"\"model_fingerprint\"", "\"manifest_digest\""};
        for (int k = 0; k < 2; k++) {
            const char *x = strstr(hw, keys[k]), *y = strstr(hg, keys[k]);
            ck_assert_msg(x && y && !strncmp(x, y, strlen(keys[k]) + 70), "%s differs", keys[k]);
        }
        free(hw);
        free(hg);
    }
    /* a replay of the written checkpoint's rollout on the generated one */
    char *out = NULL;
    int rc = ls_test_cli(&out, "run --checkpoint synth:tiny,seed=3 --mode replay --from %s/w0.trace --chunk 4 "
                         "-o %s/r0.trace", g_dir, g_dir);
    ck_assert_msg(rc == 0, "%s", out ? out : "");
    free(out);
    ls_test_expect_traces_equal(g_dir, "w0.trace", "r0.trace", 3);
    /* and refused on another seed's */
    rc = ls_test_cli(&out, "run --checkpoint synth:tiny,seed=4 --mode replay --from %s/w0.trace -o %s/r1.trace",
                     g_dir, g_dir);
    ck_assert_msg(rc == 2 && out && strstr(out, "model_fingerprint"), "%s", out ? out : "");
    free(out);
}
END_TEST

START_TEST(test_manifest_pin_differs_in_path_only)
{
    char *out = NULL;
    ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint %s/q35 -o %s/mw.json", g_dir, g_dir), 0);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint synth:qwen3.5-tiny,seed=4 -o %s/mg.json", g_dir), 0);
    free(out);
    int rc = ls_test_cli(&out, "manifest diff %s/mw.json %s/mg.json", g_dir, g_dir);
    /* the two pins may straddle a second, so runtime.pinned_at is the one other difference allowed */
    bool one = out && strstr(out, "1 difference, 0 voiding");
    bool two = out && strstr(out, "2 differences, 0 voiding") && strstr(out, "runtime.pinned_at");
    ck_assert_msg(rc == 0 && strstr(out, "checkpoint.path") &&
                      strstr(out, "synth:qwen3.5-tiny,seed=4,layers=4,experts=fused") && (one || two),
                  "%s", out ? out : "");
    free(out);
    rc = ls_test_cli(&out, "manifest verify %s/mw.json --checkpoint synth:qwen3.5-tiny,seed=4", g_dir);
    ck_assert_msg(rc == 0, "%s", out ? out : "");
    free(out);
    rc = ls_test_cli(&out, "manifest verify %s/mw.json --checkpoint synth:qwen3.5-tiny,seed=5", g_dir);
    ck_assert_msg(rc == 1 && strstr(out, "checkpoint."), "%s", out ? out : "");
    free(out);
}
END_TEST

START_TEST(test_bad_specs_exit_2)
{
    static const char *const bad[][2] = {
        {"synth:", "expected synth:PRESET,seed=N"},
        {"synth:nope,seed=1", "unknown preset 'nope'"},
        {"synth:tiny", "seed=N is required"},
        {"synth:tiny,seed=-1", "seed '-1'"},
        {"synth:tiny,seed=99999999999999999999", "seed '99999999999999999999'"},
        {"synth:tiny,seed=1,layers=0", "layers '0'"},
        {"synth:tiny,seed=1,layers=5", "layers '5': expected 1 .. 4"},
        {"synth:tiny,seed=1,foo=2", "unknown field 'foo=2'"},
        {"synth:tiny,seed=1,experts=stacked", "experts 'stacked'"},
        {"synth:tiny,seed=1,fp8,experts=fused", "experts=fused does not apply"},
        {"synth:tiny,seed=", "empty value"},
        {"synth:tiny,seed=1,seed=2", "field 'seed' is given twice"},
        {"synth:tiny,seed=1,layers=2,layers=3", "field 'layers' is given twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out = NULL;
        int rc = ls_test_cli(&out, "fingerprint --checkpoint '%s'", bad[i][0]);
        ck_assert_msg(rc == 2 && out && strstr(out, bad[i][1]) && strstr(out, bad[i][0]) &&
                          strchr(out, '\n') == out + strlen(out) - 1, /* one line */
                      "%s: rc %d: %s", bad[i][0], rc, out ? out : "");
        free(out);
        rc = ls_test_cli(&out, "run --checkpoint '%s' --mode rollout --prompts %s/prompts.jsonl -o %s/x.trace",
                         bad[i][0], g_dir, g_dir);
        ck_assert_msg(rc == 2 && out && strstr(out, bad[i][1]), "run %s: rc %d: %s", bad[i][0], rc, out ? out : "");
        free(out);
    }
}
END_TEST

/* The hot host loops' baseline instances (LOCKSTEP_CPU_ISA=baseline, core/isa.h)
 * give the bits of the wider ones this CPU runs by default: the generated
 * weights (the model fingerprint in the trace header), bf16 and both FP8
 * modes' dot products, rollout and chunked replay. */
START_TEST(test_isa_instances_equal)
{
    static const char *const runs[][2] = {{"synth:small,seed=3,layers=2", ""},
                                          {"synth:qwen3.5-tiny,seed=8,fp8", "--fp8 dequant"},
                                          {"synth:qwen3.5-tiny,seed=8,fp8", "--fp8 w8a8"}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
        for (int base = 0; base < 2; base++) {
            char *out = NULL;
            int rc = ls_test_sh(&out, "%s'%s' run --checkpoint %s %s --mode rollout --prompts %s/prompts.jsonl "
                                "--max-new-tokens 6 --threads 2 -o %s/isa%zu_%d.trace 2>&1 && %s'%s' run --checkpoint "
                                "%s %s --mode replay --from %s/isa%zu_%d.trace --chunk 5 -o %s/isar%zu_%d.trace 2>&1",
                                base ? "LOCKSTEP_CPU_ISA=baseline " : "", LS_CLI_PATH, runs[i][0], runs[i][1], g_dir,
                                g_dir, i, base, base ? "LOCKSTEP_CPU_ISA=baseline " : "", LS_CLI_PATH, runs[i][0],
                                runs[i][1], g_dir, i, base, g_dir, i, base);
            ck_assert_msg(rc == 0, "%s %s: %s", runs[i][0], runs[i][1], out ? out : "");
            free(out);
            if (!base) continue;
            char a[32], b[32];
            for (int replay = 0; replay < 2; replay++) {
                snprintf(a, sizeof a, "isa%s%zu_0.trace", replay ? "r" : "", i);
                snprintf(b, sizeof b, "isa%s%zu_1.trace", replay ? "r" : "", i);
                ls_test_expect_traces_equal(g_dir, a, b, 3);
            }
        }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("synth_checkpoint");
    TCase *tc = tcase_create("all");
    tcase_add_unchecked_fixture(tc, setup, NULL);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_fingerprint_and_bytes_equal_the_written);
    tcase_add_test(tc, test_stream_in_pieces);
    tcase_add_test(tc, test_run_equals_the_written);
    tcase_add_test(tc, test_manifest_pin_differs_in_path_only);
    tcase_add_test(tc, test_bad_specs_exit_2);
    tcase_add_test(tc, test_isa_instances_equal);
    suite_add_tcase(s, tc);
    int failed = ls_test_run_suite(s, 1);
    if (g_dir) ls_test_rm_tmpdir(g_dir);
    return failed ? 1 : 0;
}
