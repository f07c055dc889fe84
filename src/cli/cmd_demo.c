/* lockstep demo — the whole story on the embedded synthetic checkpoint:
 * synth, pin, rollout, chunked replays compare PASS, a perturbed replay is
 * caught at the right layer. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "run/gate.h"
#include "run/run.h"
#include "core/util.h"
#include "manifest/manifest.h"
#include "synth/synth.h"

static const char usage_text[] =
    "usage: lockstep demo [--backend cpu|cuda] [--gpu N] [--workdir DIR] [--keep]\n"
    "\n"
    "Runs the whole story in well under a minute on a CPU:\n"
    "  1. writes the synthetic 'tiny' Qwen3-Next checkpoint (seed 7) and pins its manifest;\n"
    "  2. rolls out four built-in prompts (prefill + 12 greedy decode steps);\n"
    "  3. replays the full sequences teacher-forced at chunk 3 and at chunk 64 with the\n"
    "     batch reversed, and compares each with the rollout bitwise: PASS;\n"
    "  4. replays once more with one operator's reduction order reversed in decoder\n"
    "     layer 2 (--perturb layer=2,op=gdn): the comparator must name that layer.\n"
    "\n"
    "options:\n"
    "  --backend cpu|cuda   operator backend (default cpu; the perturbation runs on cpu)\n"
    "  --gpu N              --backend cuda only: the CUDA device to run on (default 0)\n"
    "  --workdir DIR        work in DIR (kept) instead of a temporary directory\n"
    "  --keep               keep the temporary directory and print its path\n"
    "\n"
    "exit status: 0 the story went as expected, 1 a strict replay drifted or the\n"
    "perturbation went unnoticed, 2 could not run\n";

static const int32_t demo_prompts[4][12] = {
    {1, 17, 256, 3, 999, 42, 42, 7, 0, 0, 0, 0},
    {5, 400, 401, 402, 12, 600, 13, 0, 0, 0, 0, 0},
    {77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {11, 222, 333, 444, 555, 666, 777, 888, 999, 123, 321, 9},
};
static const long demo_lens[4] = {8, 7, 1, 12};

/* The story on stdout; nothing under --quiet (the exit code tells it). */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    if (ls_log_quiet()) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}

int ls_cmd_demo(int argc, char **argv)
{
    const char *backend = "cpu", *workdir = NULL;
    int keep = 0, gpu = 0, given_gpu = 0;
    ls_error err;
    ls_error_clear(&err);
    enum { O_KEEP = LS_CLI_LONG, O_BACKEND, O_WORKDIR, O_GPU };
    static const ls_cli_opt opts[] = {{"keep", O_KEEP, 0}, {"backend", O_BACKEND, 1},
                                      {"workdir", O_WORKDIR, 1}, {"gpu", O_GPU, 1}, {NULL, 0, 0}};
    ls_cli_args ca = {.cmd = "demo", .usage = usage_text, .opts = opts, .argc = argc, .argv = argv};
    for (int c; (c = ls_cli_next(&ca)) != LS_CLI_END;) {
        switch (c) {
        case LS_CLI_EXIT: return ca.exit_code;
        case LS_CLI_OPERAND:
            ls_fail(&err, LS_E_USAGE, "unexpected argument: %s", ca.arg);
            return ls_cli_report("demo", &err);
        case O_KEEP: keep = 1; break;
        case O_BACKEND: backend = ca.arg; break;
        case O_WORKDIR: workdir = ca.arg; break;
        case O_GPU:
            given_gpu = 1;
            if (ls_cli_parse_gpu(ca.opt, ca.arg, &gpu, &err) != LS_OK) return ls_cli_report("demo", &err);
            break;
        }
    }
    if (strcmp(backend, "cpu") && strcmp(backend, "cuda")) {
        ls_fail(&err, LS_E_USAGE, "--backend '%s': expected cpu or cuda", backend);
        return ls_cli_report("demo", &err);
    }
    if (ls_cli_check_gpu(backend, given_gpu, &err) != LS_OK) return ls_cli_report("demo", &err);
    uint64_t t0 = ls_now_ns();
    char dir[4096], ck[4200], man_path[4200];
    int temporary;
    if (ls_run_workdir(workdir, "demo", dir, sizeof dir, &temporary, &err)) return ls_cli_report("demo", &err);
    snprintf(ck, sizeof ck, "%s/tiny", dir);
    snprintf(man_path, sizeof man_path, "%s/manifest.json", dir);

    /* 1. the checkpoint and its manifest */
    ls_synth_config cfg;
    ls_synth_options so = ls_synth_options_default();
    so.force = 1;
    ls_status st = ls_synth_preset("tiny", &cfg, &err);
    if (st == LS_OK) st = ls_synth_write(&cfg, 7, ck, &so, &err);
    json_t *man = NULL;
    if (st == LS_OK) {
        ls_manifest_opts mo = ls_manifest_opts_default();
        mo.checkpoint_dir = ck;
        ls_run_facts facts;
        st = ls_run_manifest_facts(backend, gpu, &mo, &facts, &err);
        if (st == LS_OK) st = ls_manifest_build(&mo, &man, &err);
    }
    if (st == LS_OK) st = ls_manifest_save(man, man_path, &err);
    json_decref(man);
    if (st == LS_OK)
        say("lockstep demo\n\n1. wrote the synthetic 'tiny' Qwen3-Next checkpoint (seed 7: hidden 128, 4 "
               "layers of gated DeltaNet / full attention, 8 experts, vocab 1000) and pinned its manifest.\n");

    /* 2-4. rollout, strict replays, perturbed replay */
    ls_run_batch b = {4, NULL};
    b.seqs = calloc(4, sizeof *b.seqs);
    if (st == LS_OK && !b.seqs) st = ls_fail(&err, LS_E_NOMEM, "out of memory");
    for (int i = 0; st == LS_OK && i < 4; i++) {
        int32_t *t = malloc(sizeof(int32_t) * (size_t)demo_lens[i]);
        if (!t) {
            st = ls_fail(&err, LS_E_NOMEM, "out of memory");
            break;
        }
        memcpy(t, demo_prompts[i], sizeof(int32_t) * (size_t)demo_lens[i]);
        b.seqs[i] = (ls_sequence){(uint32_t)i, t, demo_lens[i], demo_lens[i]};
    }
    const int perturb_layer = 2;
    ls_gate_variant vars[3] = {
        {"chunk 3", 3, 0, NULL},
        {"chunk 64, batch reversed", 64, 1, NULL},
        {"chunk 3, perturbed gdn L2", 3, 0, "layer=2,op=gdn"},
    };
    ls_gate_opts go;
    memset(&go, 0, sizeof go);
    go.checkpoint = ck;
    go.max_new = 12;
    go.backend = backend;
    go.gpu = gpu;
    go.threads = 1;
    go.workdir = dir;
    go.variants = vars;
    go.n_variants = strcmp(backend, "cpu") == 0 ? 3 : 2; /* perturbations are CPU-only */
    ls_gate_result r;
    memset(&r, 0, sizeof r);
    if (st == LS_OK) {
        say("2. rollout of 4 built-in prompts (1-12 tokens) + 12 greedy tokens each, backend %s.\n"
               "3. teacher-forced replays, compared bitwise with the rollout.\n",
               backend);
        if (go.n_variants == 3)
            say("4. a replay with the GDN reduction order reversed in decoder layer %d.\n",
                   perturb_layer);
        else
            say("4. (the perturbation switch is CPU-only: no perturbed replay on %s)\n", backend);
        say("\n");
        fflush(stdout);
        st = ls_gate_run(&go, &b, ls_log_quiet() ? NULL : stdout, &r, &err);
    }
    ls_run_batch_free(&b);
    if (temporary && keep) ls_run_workdir_keep(dir, sizeof dir); /* not a temporary any more */
    int rc = 0;
    if (st != LS_OK) {
        rc = ls_cli_report("demo", &err);
    } else {
        say("\nmodel fingerprint (Merkle root): %s\nmanifest digest (strict run):    %s\n", r.merkle_root,
               r.manifest_digest);
        if (!r.all_equal) {
            say("UNEXPECTED: a strict replay drifted from the rollout (see the first drift above)\n");
            rc = 1;
        } else {
            say("strict: every replay is bitwise equal to the rollout (tokens, top-5, logprob bits, "
                   "per-layer digests)\n");
        }
        if (go.n_variants == 3) {
            const ls_gate_row *p = &r.rows[2];
            int caught = !p->equal && p->has_drift && p->digest_drift && p->decoder_layer == perturb_layer &&
                         p->family == LS_FAMILY_GDN;
            if (caught)
                say("perturbed: caught at the first drift: decoder layer %d (%s), sequence %u, position %u\n",
                       p->decoder_layer, ls_layer_family_name(p->family), p->seq, p->pos);
            else {
                say("UNEXPECTED: the perturbation in decoder layer %d was %s\n", perturb_layer,
                       p->equal ? "not detected" : "detected at the wrong place");
                rc = 1;
            }
        } else {
            say("perturbed replay skipped: perturbations run on the cpu backend only\n");
        }
        say("%s in %.1f s (work directory %s)\n", rc == 0 ? "demo: the story went as expected" : "demo: FAILED",
               (double)(ls_now_ns() - t0) / 1e9, temporary && !keep ? "removed" : dir);
    }
    if (temporary && !keep) ls_run_workdir_remove(dir);
    return rc;
}
