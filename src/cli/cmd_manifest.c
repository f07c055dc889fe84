/* lockstep manifest — pin, diff, verify, digest. */
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/util.h"
#include "backend/providers.h"
#include "manifest/manifest.h"
#include "run/run.h"

static const char help[] =
    "usage: lockstep manifest pin --checkpoint DIR [--backend cpu|cuda [--gpu N]]\n"
    "                             [--mode strict|fast] [--perturb SPEC] [--fp8 dequant|w8a8]\n"
    "                             [--samples-per-prompt N] [--prefix-cache off|aligned|any]\n"
    "                             [--prefix-block N] [--preempt none|seeded:S] [--kv-page N]\n"
    "                             [--tp N] [--ep M] [--afd A:F] [--gdn-form recurrent|chunk-aligned]\n"
    "                             [--tier portable|tc|fast] [--threads N] -o FILE\n"
    "       lockstep manifest diff A B [--json]\n"
    "       lockstep manifest verify FILE --checkpoint DIR [--backend cpu|cuda [--gpu N]]\n"
    "                             [--mode strict|fast] [--perturb SPEC] [--fp8 dequant|w8a8]\n"
    "                             [--gdn-form recurrent|chunk-aligned] [--tier portable|tc|fast]\n"
    "                             [--threads N] [--json]\n"
    "       lockstep manifest digest FILE\n"
    "\n"
    "pin     records what a determinism claim depends on: the checkpoint (config\n"
    "        digest, SHA-256 of every tensor, Merkle root, dtype/shape table), the\n"
    "        architecture read from config.json, numerics (mode, tier, perturbation,\n"
    "        the provider of every operator and its reduction fingerprint: the\n"
    "        SHA-256 of its outputs on a fixed ill-conditioned probe, run on the\n"
    "        backend), topology, build and runtime (OS, CPU, host, GPU when\n"
    "        present: CUDA device --gpu N, default 0, which must exist). -o -\n"
    "        writes to stdout. A perturbation needs --mode fast (given --perturb\n"
    "        alone, the mode becomes fast). --samples-per-prompt, --prefix-cache,\n"
    "        --prefix-block, --preempt and --kv-page (as for run) state how the\n"
    "        rollout is served: recorded in the section serving, informational\n"
    "        (none of them changes a bit of lockstep's engine), so they leave the\n"
    "        manifest digest as it is. Without them the section is absent.\n"
    "        --tp N, --ep M and --afd A:F (as for run) record the topology (world\n"
    "        size, degrees, AFD groups, the CPU communicator, reduction tree none);\n"
    "        a strict manifest's digest does not depend on it (manifest/README.md);\n"
    "        a topology the checkpoint does not divide is refused as run refuses it.\n"
    "        --gdn-form chunk-aligned (as for run; cpu or cuda) records the chunk-aligned\n"
    "        GDN arithmetic: numerics.gdn_form and its operator row, the tensor-core\n"
    "        kernels' with --tier tc or fast (a change voids).\n"
    "        --tier tc (as for run; --backend cuda) records the tensor-core tier:\n"
    "        numerics.tier, its linear and lm_head rows and numerics.tc_gemms, the\n"
    "        cuBLASLt algorithm this GPU qualifies for each linear shape (the engine\n"
    "        is opened on the device, weights loaded, as run opens it). --tier fast\n"
    "        records the fast tier's rows in mode fast (no strict claim).\n"
    "diff    lists every difference between two manifests as PATH: old -> new and\n"
    "        classifies it as voiding (the claim no longer holds: checkpoint,\n"
    "        architecture, providers, library versions, GPU kind, topology, mode,\n"
    "        perturbation, reduction fingerprints, build revision/flags) or\n"
    "        informational (host name, time, paths, the binary digest when both\n"
    "        carry fingerprints, ...). The rule table is in manifest/README.md.\n"
    "verify  re-pins the live system and checkpoint with the given options and\n"
    "        fails closed on any voiding difference, naming the first one and\n"
    "        every operator whose reduction fingerprint (re-probed here) differs.\n"
    "digest  prints the SHA-256 of the manifest's canonical JSON (what traces embed).\n"
    "\n"
    "--checkpoint takes a directory or synth:PRESET,seed=N,... (as for run): the\n"
    "checkpoint lockstep synth writes, generated in memory; its manifest is the written\n"
    "one's but for checkpoint.path (the spec, every field spelled out).\n"
    "\n"
    "Under 'lockstep --quiet' only -o - and --json print; the exit code is the verdict.\n"
    "exit codes: 0 identical or informational differences only (verify: claim holds),\n"
    "            1 a voiding difference, 2 bad input or could not do the job\n";

#define CMD "manifest"

/* The options of each subcommand: pin and verify share those that pin the
 * live system; diff has --json; digest none (each has -h/--help). */
enum { OPT_CHECKPOINT = LS_CLI_LONG, OPT_BACKEND, OPT_MODE, OPT_PERTURB, OPT_THREADS, OPT_JSON,
       OPT_FP8, OPT_GPU, OPT_SAMPLES, OPT_PREFIX, OPT_PBLOCK, OPT_PREEMPT, OPT_KVPAGE, OPT_EP, OPT_TP, OPT_AFD, OPT_GDN,
       OPT_TIER };
#define LIVE_OPTS                                                                                  \
    {"checkpoint", OPT_CHECKPOINT, 1}, {"backend", OPT_BACKEND, 1}, {"mode", OPT_MODE, 1},         \
        {"perturb", OPT_PERTURB, 1}, {"threads", OPT_THREADS, 1}, {"fp8", OPT_FP8, 1},             \
        {"gpu", OPT_GPU, 1}, {"gdn-form", OPT_GDN, 1}, {"tier", OPT_TIER, 1}
static const ls_cli_opt pin_opts[] = {LIVE_OPTS, {"output", 'o', 1}, {"samples-per-prompt", OPT_SAMPLES, 1},
                                      {"prefix-cache", OPT_PREFIX, 1}, {"prefix-block", OPT_PBLOCK, 1},
                                      {"preempt", OPT_PREEMPT, 1}, {"kv-page", OPT_KVPAGE, 1}, {"ep", OPT_EP, 1},
                                      {"tp", OPT_TP, 1}, {"afd", OPT_AFD, 1}, {NULL, 0, 0}};
static const ls_cli_opt verify_opts[] = {LIVE_OPTS, {"json", OPT_JSON, 0}, {NULL, 0, 0}};
static const ls_cli_opt diff_opts[] = {{"json", OPT_JSON, 0}, {NULL, 0, 0}};
static const ls_cli_opt no_opts[] = {{NULL, 0, 0}};

/* Parses the options pin (opts = pin_opts) and verify (verify_opts) share;
 * positional arguments are handed back in pos[] (at most 2), the CUDA
 * device in *gpu, pin's serving options in the fields of *sv (a run spec,
 * validated by the run layer as run's are). A perturbation without --mode
 * pins mode fast; progress goes to stderr. Returns -1 on success or an exit
 * code. */
static int parse_live(int argc, char **argv, const ls_cli_opt *opts, ls_manifest_opts *o,
                      const char **out_path, int *as_json, int *gpu, const char **pos, int *npos,
                      ls_run_spec *sv, ls_tier *tier)
{
    int mode_given = 0, gpu_given = 0, gdn = 0;
    *tier = LS_TIER_PORTABLE;
    ls_error err;
    ls_error_clear(&err);
    ls_cli_args a = {.cmd = CMD, .usage = help, .opts = opts, .argc = argc, .argv = argv};
    for (int c; (c = ls_cli_next(&a)) != LS_CLI_END;) {
        switch (c) {
        case LS_CLI_EXIT: return a.exit_code;
        case OPT_CHECKPOINT: o->checkpoint_dir = a.arg; break;
        case OPT_BACKEND: o->backend = a.arg; break;
        case OPT_GPU:
            gpu_given = 1;
            if (ls_cli_parse_gpu(a.opt, a.arg, gpu, &err) != LS_OK) return ls_cli_report(CMD, &err);
            break;
        case OPT_MODE:
            o->mode = a.arg;
            mode_given = 1;
            break;
        case OPT_PERTURB: o->perturbation = a.arg; break;
        case OPT_FP8:
            if (strcmp(a.arg, "dequant") && strcmp(a.arg, "w8a8"))
                return ls_cli_usage_error(CMD, "--fp8 '%s': expected dequant or w8a8", a.arg);
            o->fp8 = a.arg;
            break;
        case OPT_GDN:
            if (ls_run_parse_gdn_form(a.opt, a.arg, &gdn, &err) != LS_OK) return ls_cli_report(CMD, &err);
            break;
        case OPT_TIER:
            if (ls_run_parse_tier(a.opt, a.arg, tier, &err) != LS_OK) return ls_cli_report(CMD, &err);
            break;
        case OPT_THREADS: {
            char *end;
            long n = strtol(a.arg, &end, 10);
            if (*end || n < 1 || n > 4096)
                return ls_cli_usage_error(CMD, "--threads: expected an integer 1..4096, got '%s'", a.arg);
            o->threads = (int)n;
            break;
        }
        case 'o': *out_path = a.arg; break;
        case OPT_JSON: *as_json = 1; break;
        /* ranges are the run layer's (ls_run_spec_serving), which names the field */
        case OPT_SAMPLES:
            if (ls_cli_parse_long(a.opt, a.arg, 0, 1L << 20, &sv->samples_per_prompt, &err) != LS_OK)
                return ls_cli_report(CMD, &err);
            break;
        case OPT_PREFIX: sv->prefix_cache = a.arg; break;
        case OPT_PBLOCK:
            if (ls_cli_parse_long(a.opt, a.arg, 1, 1L << 30, &sv->prefix_block, &err) != LS_OK)
                return ls_cli_report(CMD, &err);
            break;
        case OPT_PREEMPT: sv->preempt = a.arg; break;
        case OPT_EP:
        case OPT_TP: {
            long n;
            if (ls_cli_parse_long(a.opt, a.arg, 1, 1L << 20, &n, &err) != LS_OK) return ls_cli_report(CMD, &err);
            *(c == OPT_EP ? &sv->ep : &sv->tp) = (int)n;
            break;
        }
        case OPT_AFD:
            if (ls_cli_parse_afd(a.opt, a.arg, &sv->afd_attention, &sv->afd_ffn, &err) != LS_OK)
                return ls_cli_report(CMD, &err);
            break;
        case OPT_KVPAGE:
            if (ls_cli_parse_kv_page(a.opt, a.arg, &sv->kv_page, &err) != LS_OK)
                return ls_cli_report(CMD, &err);
            break;
        case LS_CLI_OPERAND:
            if (*npos == 2) return ls_cli_usage_error(CMD, "unexpected argument '%s'", a.arg);
            pos[(*npos)++] = a.arg;
            break;
        }
    }
    if (ls_cli_check_gpu(o->backend, gpu_given, &err) != LS_OK) return ls_cli_report(CMD, &err);
    if (o->perturbation && !mode_given) o->mode = "fast"; /* a perturbed run is never strict */
    const char *tn = ls_run_tier_name(*tier);
    if (*tier != LS_TIER_PORTABLE && strcmp(o->backend, "cuda"))
        return ls_cli_usage_error(CMD, "--tier %s runs on the cuda backend only (--backend is %s)", tn, o->backend);
    if (ls_run_perturb_tier_check(o->perturbation, *tier, &err) != LS_OK) return ls_cli_report(CMD, &err);
    if (*tier == LS_TIER_FAST && mode_given && strcmp(o->mode, "fast"))
        return ls_cli_usage_error(CMD, "--tier fast is a fast-mode run (--mode %s)", o->mode);
    /* the chunk-aligned GDN row is the backend's in the tier */
    if (gdn && !(o->gdn_chunked = ls_backend_gdn_chunked_provider(o->backend, *tier)))
        return ls_cli_usage_error(CMD, "--gdn-form chunk-aligned: backend %s has no kernel for it", o->backend);
    if (*tier == LS_TIER_FAST) o->mode = "fast";
    o->progress = 1;
    return -1;
}

/* Collects the operands of a subcommand without options of its own but
 * diff's --json (as_json NULL: none). Returns -1 on success or an exit code. */
static int parse_plain(int argc, char **argv, int *as_json, const char **pos, int *npos)
{
    ls_cli_args a = {.cmd = CMD, .usage = help, .opts = as_json ? diff_opts : no_opts, .argc = argc, .argv = argv};
    for (int c; (c = ls_cli_next(&a)) != LS_CLI_END;) {
        switch (c) {
        case LS_CLI_EXIT: return a.exit_code;
        case OPT_JSON: *as_json = 1; break;
        case LS_CLI_OPERAND:
            if (*npos == 2) return ls_cli_usage_error(CMD, "unexpected argument '%s'", a.arg);
            pos[(*npos)++] = a.arg;
            break;
        }
    }
    return -1;
}

static void print_diff_text(const ls_manifest_delta *d, FILE *f)
{
    for (size_t i = 0; i < d->count; i++) {
        const ls_manifest_change *c = &d->changes[i];
        fprintf(f, "%-13s %s: %s -> %s\n", ls_change_class_name(c->cls), c->path, c->old_value,
                c->new_value);
    }
}

/* One warning naming every operator whose code_sha256 differs: the machine
 * code behind it changed (compiler, flags or source) although the row's other
 * fields did not. Informational (manifest/README.md), but worth a look. */
static void warn_code_changes(const ls_manifest_delta *d)
{
    static const char pre[] = "numerics.operators", leaf[] = ".code_sha256";
    char ops[1024] = "";
    size_t n = 0, used = 0;
    for (size_t i = 0; i < d->count; i++) {
        const char *p = d->changes[i].path;
        if (!ls_manifest_is_code_digest_path(p)) continue;
        const char *op = p + sizeof pre - 1; /* ".linear", or ["a key"] when not plain */
        if (*op == '.') op++;
        size_t len = strlen(op) - (sizeof leaf - 1);
        int w = snprintf(ops + used, sizeof ops - used, "%s%.*s", n ? ", " : "", (int)len, op);
        if (w > 0 && (size_t)w < sizeof ops - used) used += (size_t)w;
        n++;
    }
    if (n)
        ls_log_warn("kernel code changed for %zu operator%s: %s (code_sha256 differs; "
                    "informational: the claim rests on the other fields, see manifest/README.md)",
                    n, n == 1 ? "" : "s", ops);
}

static void print_diff_json(const ls_manifest_delta *d, const char *verdict)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < d->count; i++) {
        const ls_manifest_change *c = &d->changes[i];
        json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:s}", "path", c->path, "old",
                                             c->old_value, "new", c->new_value, "class",
                                             ls_change_class_name(c->cls)));
    }
    json_t *o = json_pack("{s:s, s:I, s:I, s:o}", "verdict", verdict, "differences",
                          (json_int_t)d->count, "voiding", (json_int_t)d->voiding, "changes", arr);
    char *s = o ? json_dumps(o, JSON_INDENT(2)) : NULL;
    if (s) ls_stdout_puts(s, NULL); /* a failure is reported by main */
    free(s);
    json_decref(o);
}

/* --tier tc or fast: the tier's rows; tc also the GEMM algorithms this GPU
 * qualifies for the checkpoint's linears, as run pins them (ls_run_tc_pins:
 * the engine is opened on the device). The records stay in *records for the
 * build. */
static ls_status tier_rows(ls_manifest_opts *o, ls_tier tier, int gpu, char ***records, size_t *n, ls_error *err)
{
    if (tier == LS_TIER_PORTABLE) return LS_OK;
    if (tier == LS_TIER_TC) LS_TRY(ls_run_tc_pins(o->checkpoint_dir, gpu, records, n, err));
    o->tier_providers = ls_backend_tier_providers(o->backend, tier, &o->n_tier_providers);
    o->tc_gemms = (const char *const *)*records;
    o->n_tc_gemms = *n;
    return LS_OK;
}

static int cmd_pin(int argc, char **argv)
{
    ls_manifest_opts o = ls_manifest_opts_default();
    const char *out = NULL, *pos[2];
    int npos = 0, gpu = 0;
    ls_run_spec sv;
    ls_run_spec_default(&sv);
    ls_tier tier;
    int rc = parse_live(argc, argv, pin_opts, &o, &out, NULL, &gpu, pos, &npos, &sv, &tier);
    if (rc >= 0) return rc;
    if (npos) return ls_cli_usage_error(CMD, "unexpected argument '%s'", pos[0]);
    if (!o.checkpoint_dir) return ls_cli_usage_error(CMD, "pin: --checkpoint DIR is required");
    if (!out) return ls_cli_usage_error(CMD, "pin: -o FILE is required");
    ls_error err;
    ls_error_clear(&err);
    ls_manifest_serving serving;
    int serving_any;
    if (ls_run_spec_serving(&sv, &serving, &serving_any, &err) != LS_OK) return ls_cli_report(CMD, &err);
    o.serving = serving_any ? &serving : NULL;
    sv.backend = o.backend;
    sv.checkpoint = o.checkpoint_dir;
    if (ls_run_spec_topology(&sv, &o, &err) != LS_OK || ls_run_topology_check_checkpoint(&sv, &err) != LS_OK)
        return ls_cli_report(CMD, &err);
    json_t *m = NULL;
    ls_run_facts facts;
    char **recs = NULL;
    size_t n_recs = 0;
    ls_status st = ls_output_path_check(out, &err); /* before hashing the checkpoint */
    if (st == LS_OK) st = tier_rows(&o, tier, gpu, &recs, &n_recs, &err);
    if (st == LS_OK) st = ls_run_manifest_facts(o.backend, gpu, &o, &facts, &err);
    ls_checkpoint *ck = NULL; /* a directory or a synth: spec (ls_run_checkpoint_open) */
    if (st == LS_OK) st = ls_run_checkpoint_open(o.checkpoint_dir, &ck, NULL, &err);
    o.checkpoint = ck;
    if (st == LS_OK) st = ls_manifest_build(&o, &m, &err);
    ls_checkpoint_close(ck);
    ls_run_tc_pins_free(recs, n_recs);
    if (st != LS_OK) return ls_cli_report(CMD, &err);
    st = ls_manifest_save(m, out, &err);
    json_decref(m);
    if (st != LS_OK) return ls_cli_report(CMD, &err);
    return 0;
}

static int cmd_diff(int argc, char **argv)
{
    const char *pos[2];
    int npos = 0, as_json = 0;
    int rc = parse_plain(argc, argv, &as_json, pos, &npos);
    if (rc >= 0) return rc;
    if (npos != 2) return ls_cli_usage_error(CMD, "diff: two manifest files are required (A B)");
    ls_error err;
    ls_error_clear(&err);
    json_t *a = NULL, *b = NULL;
    if (ls_manifest_load(pos[0], &a, &err) != LS_OK || ls_manifest_load(pos[1], &b, &err) != LS_OK) {
        json_decref(a);
        return ls_cli_report(CMD, &err);
    }
    ls_manifest_delta d;
    ls_status st = ls_manifest_diff(a, b, &d, &err);
    json_decref(a);
    json_decref(b);
    if (st != LS_OK) return ls_cli_report(CMD, &err);
    const char *verdict = d.voiding ? "voided" : d.count ? "holds (informational differences only)"
                                                         : "identical";
    warn_code_changes(&d);
    if (as_json) { /* asked for by name: printed under --quiet too */
        print_diff_json(&d, d.voiding ? "voided" : d.count ? "informational" : "identical");
    } else if (!ls_log_quiet()) {
        print_diff_text(&d, stdout);
        printf("%zu difference%s, %zu voiding: %s\n", d.count, d.count == 1 ? "" : "s", d.voiding,
               verdict);
    }
    rc = d.voiding ? 1 : 0;
    ls_manifest_diff_free(&d);
    return rc;
}

static int cmd_verify(int argc, char **argv)
{
    ls_manifest_opts o = ls_manifest_opts_default();
    const char *pos[2];
    int npos = 0, as_json = 0, gpu = 0;
    ls_tier tier;
    int rc = parse_live(argc, argv, verify_opts, &o, NULL, &as_json, &gpu, pos, &npos, NULL, &tier);
    if (rc >= 0) return rc;
    if (npos != 1) return ls_cli_usage_error(CMD, "verify: exactly one manifest FILE is required");
    if (!o.checkpoint_dir) return ls_cli_usage_error(CMD, "verify: --checkpoint DIR is required");
    ls_error err;
    ls_error_clear(&err);
    json_t *pinned;
    if (ls_manifest_load(pos[0], &pinned, &err) != LS_OK) return ls_cli_report(CMD, &err);
    ls_manifest_delta d;
    ls_run_facts facts;
    char **recs = NULL;
    size_t n_recs = 0;
    ls_status st = tier_rows(&o, tier, gpu, &recs, &n_recs, &err);
    if (st == LS_OK) st = ls_run_manifest_facts(o.backend, gpu, &o, &facts, &err);
    ls_checkpoint *ck = NULL;
    if (st == LS_OK) st = ls_run_checkpoint_open(o.checkpoint_dir, &ck, NULL, &err);
    o.checkpoint = ck;
    if (st == LS_OK) st = ls_manifest_verify(pinned, &o, &d, &err);
    ls_checkpoint_close(ck);
    ls_run_tc_pins_free(recs, n_recs);
    json_decref(pinned);
    if (st != LS_OK) return ls_cli_report(CMD, &err);
    warn_code_changes(&d);
    if (as_json) { /* asked for by name: printed under --quiet too */
        print_diff_json(&d, d.voiding ? "voided" : "holds");
    } else if (ls_log_quiet()) {
        /* the exit code is the verdict */
    } else if (d.voiding) {
        for (size_t i = 0; i < d.count; i++)
            if (d.changes[i].cls == LS_CHANGE_VOIDING) {
                printf("verify: FAILED: %s differs: pinned %s, live %s\n", d.changes[i].path,
                       d.changes[i].old_value, d.changes[i].new_value);
                break;
            }
        /* every operator whose arithmetic differs on the probe, by name */
        for (size_t i = 0; i < d.count; i++) {
            const char *p = d.changes[i].path, *suf = ".reduction_fingerprint";
            size_t n = strlen(p), ns = strlen(suf), np = strlen("numerics.operators.");
            if (d.changes[i].cls != LS_CHANGE_VOIDING || n <= np + ns ||
                strncmp(p, "numerics.operators.", np) || strcmp(p + n - ns, suf))
                continue;
            printf("verify: operator %.*s: reduction fingerprint differs (its arithmetic on the "
                   "probe changed): pinned %s, live %s\n", (int)(n - np - ns), p + np,
                   d.changes[i].old_value, d.changes[i].new_value);
        }
        if (ls_log_level >= 2) print_diff_text(&d, stdout);
        printf("%zu voiding difference%s (of %zu); the pinned claim does not hold here\n",
               d.voiding, d.voiding == 1 ? "" : "s", d.count);
    } else {
        printf("verify: OK (%zu informational difference%s)\n", d.count, d.count == 1 ? "" : "s");
        if (ls_log_level >= 2) print_diff_text(&d, stdout);
    }
    rc = d.voiding ? 1 : 0;
    ls_manifest_diff_free(&d);
    return rc;
}

static int cmd_digest(int argc, char **argv)
{
    const char *pos[2];
    int npos = 0;
    int rc = parse_plain(argc, argv, NULL, pos, &npos);
    if (rc >= 0) return rc;
    if (npos != 1) return ls_cli_usage_error(CMD, "digest: exactly one manifest FILE is required");
    ls_error err;
    ls_error_clear(&err);
    json_t *m;
    if (ls_manifest_load(pos[0], &m, &err) != LS_OK) return ls_cli_report(CMD, &err);
    ls_digest d;
    ls_status st = ls_manifest_digest(m, &d, &err);
    json_decref(m);
    if (st != LS_OK) return ls_cli_report(CMD, &err);
    char hex[65];
    ls_digest_to_hex(&d, hex);
    if (!ls_log_quiet()) printf("%s  %s\n", hex, pos[0]);
    return 0;
}

int ls_cmd_manifest(int argc, char **argv)
{
    /* manifest --help, or a subcommand; each parses its own options (and --help). */
    if (argc >= 2 && ls_cli_is_help(argv[1])) {
        fputs(help, stdout);
        return 0;
    }
    if (argc < 2) return ls_cli_usage_error(CMD, "a subcommand is required: pin, diff, verify or digest");
    const char *sub = argv[1];
    if (strcmp(sub, "pin") == 0) return cmd_pin(argc - 1, argv + 1);
    if (strcmp(sub, "diff") == 0) return cmd_diff(argc - 1, argv + 1);
    if (strcmp(sub, "verify") == 0) return cmd_verify(argc - 1, argv + 1);
    if (strcmp(sub, "digest") == 0) return cmd_digest(argc - 1, argv + 1);
    return ls_cli_usage_error(CMD, "unknown subcommand '%s' (pin, diff, verify, digest)", sub);
}
