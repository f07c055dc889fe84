/* lockstep fingerprint — per-tensor SHA-256, config digest, Merkle root. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/util.h"
#include "fingerprint/fingerprint.h"
#include "io/checkpoint.h"
#include "run/run.h"

static const char help[] =
    "usage: lockstep fingerprint --checkpoint DIR [--threads N] [--json]\n"
    "\n"
    "Hashes every tensor of a checkpoint (SHA-256 of its bytes as stored, read\n"
    "from the memory mapping), the canonical form of config.json, and the Merkle\n"
    "root over the tensors sorted by normalised name (encoding in\n"
    "manifest/README.md). The root does not depend on how tensors are sharded.\n"
    "\n"
    "  --checkpoint DIR  directory with config.json and model.safetensors or\n"
    "                    model.safetensors.index.json plus shards; or\n"
    "                    synth:PRESET,seed=N,... (as for run): the checkpoint lockstep\n"
    "                    synth writes, generated in memory and hashed as generated\n"
    "  --threads N       hashing threads (default: online cores); tensors are\n"
    "                    spread across threads, each tensor hashed by one\n"
    "  --json            print a JSON object (root, config digest, every tensor,\n"
    "                    throughput) instead of text\n"
    "\n"
    "Progress goes to stderr: a bar on a terminal, else (past 5 s) a plain line every 5 s.\n"
    "Under 'lockstep --quiet' only --json output is printed.\n"
    "exit codes: 0 done, 2 could not read or hash the checkpoint\n";

static void hex(const ls_digest *d, char out[65]) { ls_digest_to_hex(d, out); }

int ls_cmd_fingerprint(int argc, char **argv)
{
    enum { OPT_CHECKPOINT = LS_CLI_LONG, OPT_THREADS, OPT_JSON };
    static const ls_cli_opt opts[] = {
        {"checkpoint", OPT_CHECKPOINT, 1},
        {"threads", OPT_THREADS, 1},
        {"json", OPT_JSON, 0},
        {NULL, 0, 0},
    };
    const char *dir = NULL;
    int threads = 0, as_json = 0;
    ls_error err;
    ls_error_clear(&err);
    ls_cli_args a = {.cmd = "fingerprint", .usage = help, .opts = opts, .argc = argc, .argv = argv};
    for (int c; (c = ls_cli_next(&a)) != LS_CLI_END;) {
        switch (c) {
        case LS_CLI_EXIT: return a.exit_code;
        case OPT_CHECKPOINT: dir = a.arg; break;
        case OPT_THREADS: {
            char *end;
            long n = strtol(a.arg, &end, 10);
            if (*end || n < 1 || n > 4096)
                return ls_cli_usage_error("fingerprint", "--threads: expected an integer 1..4096, got '%s'", a.arg);
            threads = (int)n;
            break;
        }
        case OPT_JSON: as_json = 1; break;
        case LS_CLI_OPERAND: return ls_cli_usage_error("fingerprint", "unexpected argument '%s'", a.arg);
        }
    }
    if (!dir) {
        ls_fail(&err, LS_E_USAGE, "--checkpoint DIR is required");
        return ls_cli_report("fingerprint", &err);
    }
    ls_checkpoint *ck;
    if (ls_run_checkpoint_open(dir, &ck, NULL, &err) != LS_OK) return ls_cli_report("fingerprint", &err);
    ls_fingerprint fp;
    ls_fingerprint_opts fo = {threads, 1};
    if (ls_fingerprint_checkpoint(ck, &fo, &fp, &err) != LS_OK) {
        ls_checkpoint_close(ck);
        return ls_cli_report("fingerprint", &err);
    }
    double secs = (double)fp.elapsed_ns / 1e9;
    double gbps = secs > 0 ? (double)fp.total_bytes / 1e9 / secs : 0.0;
    char root[65], cfg[65], th[65];
    hex(&fp.merkle_root, root);
    hex(&fp.config_digest, cfg);
    if (as_json) { /* asked for by name: printed under --quiet too */
        json_t *tensors = json_array();
        for (size_t i = 0; i < fp.count; i++) {
            const ls_tensor_fp *t = &fp.tensors[i];
            json_t *shape = json_array();
            for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
            hex(&t->digest, th);
            json_array_append_new(tensors, json_pack("{s:s, s:s, s:o, s:I, s:s}", "name", t->name,
                                                     "dtype", ls_dtype_name(t->dtype), "shape",
                                                     shape, "size_bytes",
                                                     (json_int_t)t->size_bytes, "sha256", th));
        }
        json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:i, s:f, s:f, s:o}", "checkpoint", dir,
                              "merkle_root", root, "config_sha256", cfg, "tensor_count",
                              (json_int_t)fp.count, "total_bytes", (json_int_t)fp.total_bytes,
                              "threads", fp.threads_used, "seconds", secs, "gb_per_s", gbps,
                              "tensors", tensors);
        char *s = o ? json_dumps(o, JSON_INDENT(2)) : NULL;
        if (s) ls_stdout_puts(s, NULL); /* a failure is reported by main */
        free(s);
        json_decref(o);
    } else if (!ls_log_quiet()) {
        for (size_t i = 0; i < fp.count; i++) {
            hex(&fp.tensors[i].digest, th);
            printf("%s  %s\n", th, fp.tensors[i].name);
        }
        printf("config_sha256 %s\nmerkle_root   %s\n", cfg, root);
        fprintf(stderr, "%zu tensors, %.3f GB in %.3f s with %d thread%s: %.3f GB/s\n", fp.count,
                (double)fp.total_bytes / 1e9, secs, fp.threads_used,
                fp.threads_used == 1 ? "" : "s", gbps);
    }
    ls_fingerprint_free(&fp);
    ls_checkpoint_close(ck);
    return 0;
}
