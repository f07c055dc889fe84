/* lockstep manifest — pin, diff, verify, digest. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/util.h"
#include "manifest/manifest.h"
#include "run/run.h"

static const char help[] =
    "usage: lockstep manifest pin --checkpoint DIR [--backend cpu|cuda] [--mode strict|fast]\n"
    "                             [--perturb SPEC] [--threads N] -o FILE\n"
    "       lockstep manifest diff A B [--json]\n"
    "       lockstep manifest verify FILE --checkpoint DIR [--backend cpu|cuda]\n"
    "                             [--mode strict|fast] [--perturb SPEC] [--threads N] [--json]\n"
    "       lockstep manifest digest FILE\n"
    "\n"
    "pin     records what a determinism claim depends on: the checkpoint (config\n"
    "        digest, SHA-256 of every tensor, Merkle root, dtype/shape table), the\n"
    "        architecture read from config.json, numerics (mode, tier, perturbation,\n"
    "        the provider of every operator), topology, build and runtime (OS, CPU,\n"
    "        host, GPU when present). -o - writes to stdout. A perturbation needs\n"
    "        --mode fast (given --perturb alone, the mode becomes fast).\n"
    "diff    lists every difference between two manifests as PATH: old -> new and\n"
    "        classifies it as voiding (the claim no longer holds: checkpoint,\n"
    "        architecture, providers, library versions, GPU kind, topology, mode,\n"
    "        perturbation, build revision/flags) or informational (host name, time,\n"
    "        paths, ...). The rule table is in manifest/README.md.\n"
    "verify  re-pins the live system and checkpoint with the given options and\n"
    "        fails closed on any voiding difference, naming the first one.\n"
    "digest  prints the SHA-256 of the manifest's canonical JSON (what traces embed).\n"
    "\n"
    "exit codes: 0 identical or informational differences only (verify: claim holds),\n"
    "            1 a voiding difference, 2 bad input or could not do the job\n";

#define CMD "manifest"

static int usage_error(const char *fmt, const char *arg)
{
    ls_error err;
    ls_error_clear(&err);
    ls_fail(&err, LS_E_USAGE, fmt, arg);
    return ls_cli_report(CMD, &err);
}

/* Parses the options pin and verify share; positional arguments are handed
 * back in pos[] (at most 2). A perturbation without --mode pins mode fast;
 * progress goes to stderr. Returns -1 on success or an exit code. */
static int parse_live(int argc, char **argv, ls_manifest_opts *o, const char **out_path,
                      int *as_json, const char **pos, int *npos)
{
    int mode_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (strcmp(a, "--checkpoint") == 0 && has) o->checkpoint_dir = argv[++i];
        else if (strcmp(a, "--backend") == 0 && has) o->backend = argv[++i];
        else if (strcmp(a, "--mode") == 0 && has) {
            o->mode = argv[++i];
            mode_given = 1;
        }
        else if (strcmp(a, "--perturb") == 0 && has) o->perturbation = argv[++i];
        else if (strcmp(a, "--threads") == 0 && has) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 4096)
                return usage_error("--threads: expected an integer 1..4096, got '%s'", argv[i]);
            o->threads = (int)n;
        } else if (out_path && (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) && has)
            *out_path = argv[++i];
        else if (as_json && strcmp(a, "--json") == 0) *as_json = 1;
        else if (a[0] == '-' && a[1] != '\0') return usage_error("unexpected option '%s'", a);
        else if (*npos < 2) pos[(*npos)++] = a;
        else return usage_error("unexpected argument '%s'", a);
    }
    if (o->perturbation && !mode_given) o->mode = "fast"; /* a perturbed run is never strict */
    o->progress = 1;
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
    if (s) puts(s);
    free(s);
    json_decref(o);
}

static int cmd_pin(int argc, char **argv)
{
    ls_manifest_opts o = ls_manifest_opts_default();
    const char *out = NULL, *pos[2];
    int npos = 0;
    int rc = parse_live(argc, argv, &o, &out, NULL, pos, &npos);
    if (rc >= 0) return rc;
    if (npos) return usage_error("unexpected argument '%s'", pos[0]);
    if (!o.checkpoint_dir) return usage_error("%s", "pin: --checkpoint DIR is required");
    if (!out) return usage_error("%s", "pin: -o FILE is required");
    ls_error err;
    ls_error_clear(&err);
    json_t *m;
    ls_gpu_info gpu;
    if (ls_run_manifest_facts(o.backend, &o, &gpu, &err) != LS_OK ||
        ls_manifest_build(&o, &m, &err) != LS_OK)
        return ls_cli_report(CMD, &err);
    ls_status st = ls_manifest_save(m, out, &err);
    json_decref(m);
    if (st != LS_OK) return ls_cli_report(CMD, &err);
    return 0;
}

static int cmd_diff(int argc, char **argv)
{
    const char *pos[2];
    int npos = 0, as_json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) as_json = 1;
        else if (argv[i][0] == '-' && argv[i][1] != '\0') return usage_error("unexpected option '%s'", argv[i]);
        else if (npos < 2) pos[npos++] = argv[i];
        else return usage_error("unexpected argument '%s'", argv[i]);
    }
    if (npos != 2) return usage_error("%s", "diff: two manifest files are required (A B)");
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
    if (as_json) {
        print_diff_json(&d, d.voiding ? "voided" : d.count ? "informational" : "identical");
    } else {
        print_diff_text(&d, stdout);
        printf("%zu difference%s, %zu voiding: %s\n", d.count, d.count == 1 ? "" : "s", d.voiding,
               verdict);
    }
    int rc = d.voiding ? 1 : 0;
    ls_manifest_diff_free(&d);
    return rc;
}

static int cmd_verify(int argc, char **argv)
{
    ls_manifest_opts o = ls_manifest_opts_default();
    const char *pos[2];
    int npos = 0, as_json = 0;
    int rc = parse_live(argc, argv, &o, NULL, &as_json, pos, &npos);
    if (rc >= 0) return rc;
    if (npos != 1) return usage_error("%s", "verify: exactly one manifest FILE is required");
    if (!o.checkpoint_dir) return usage_error("%s", "verify: --checkpoint DIR is required");
    ls_error err;
    ls_error_clear(&err);
    json_t *pinned;
    if (ls_manifest_load(pos[0], &pinned, &err) != LS_OK) return ls_cli_report(CMD, &err);
    ls_manifest_delta d;
    ls_gpu_info gpu;
    ls_status st = ls_run_manifest_facts(o.backend, &o, &gpu, &err);
    if (st == LS_OK) st = ls_manifest_verify(pinned, &o, &d, &err);
    json_decref(pinned);
    if (st != LS_OK) return ls_cli_report(CMD, &err);
    if (as_json) {
        print_diff_json(&d, d.voiding ? "voided" : "holds");
    } else if (d.voiding) {
        for (size_t i = 0; i < d.count; i++)
            if (d.changes[i].cls == LS_CHANGE_VOIDING) {
                printf("verify: FAILED: %s differs: pinned %s, live %s\n", d.changes[i].path,
                       d.changes[i].old_value, d.changes[i].new_value);
                break;
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
    if (argc != 2 || argv[1][0] == '-') return usage_error("%s", "digest: exactly one manifest FILE is required");
    ls_error err;
    ls_error_clear(&err);
    json_t *m;
    if (ls_manifest_load(argv[1], &m, &err) != LS_OK) return ls_cli_report(CMD, &err);
    ls_digest d;
    ls_status st = ls_manifest_digest(m, &d, &err);
    json_decref(m);
    if (st != LS_OK) return ls_cli_report(CMD, &err);
    char hex[65];
    ls_digest_to_hex(&d, hex);
    printf("%s  %s\n", hex, argv[1]);
    return 0;
}

int ls_cmd_manifest(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (ls_cli_is_help(argv[i])) {
            fputs(help, stdout);
            return 0;
        }
    if (argc < 2) return usage_error("%s", "a subcommand is required: pin, diff, verify or digest");
    const char *sub = argv[1];
    if (strcmp(sub, "pin") == 0) return cmd_pin(argc - 1, argv + 1);
    if (strcmp(sub, "diff") == 0) return cmd_diff(argc - 1, argv + 1);
    if (strcmp(sub, "verify") == 0) return cmd_verify(argc - 1, argv + 1);
    if (strcmp(sub, "digest") == 0) return cmd_digest(argc - 1, argv + 1);
    return usage_error("unknown subcommand '%s' (pin, diff, verify, digest)", sub);
}
