/* lockstep import jsonl IN -o TRACE — traces from other engines' logprob dumps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/util.h"
#include "trace/import.h"

static const char usage_text[] =
    "usage: lockstep import jsonl IN.jsonl -o OUT.trace --model-fingerprint HEX [options]\n"
    "\n"
    "Converts per-token logprob dumps, as inference servers emit them, into a trace\n"
    "that 'lockstep compare' reads. IN holds one JSON object per generated token:\n"
    "  {\"seq\": 0, \"pos\": 17, \"token\": 1234, \"logprob\": -0.25,\n"
    "   \"top_logprobs\": {\"1234\": -0.25, \"99\": -1.5, ...}}\n"
    "pos is the absolute position of the generated token (prompt length + step);\n"
    "top_logprobs is in rank order. Other keys are ignored. Every float is parsed\n"
    "from its exact text with strtof (a shortest round-trip decimal, or a hex float\n"
    "or \"inf\"/\"-inf\" given as a JSON string), never through double, so the fp32\n"
    "bits are exactly those the engine printed. Positions of a sequence must\n"
    "increase through the file. Imported traces carry no digests: compare then\n"
    "checks tokens, logprobs and top-k only, and says so.\n"
    "\n"
    "options:\n"
    "  -o, --output FILE           trace to write (required)\n"
    "  --model-fingerprint HEX     model Merkle root, 64 hex characters (required)\n"
    "  --manifest-digest HEX       manifest SHA-256 to record\n"
    "  --engine NAME               engine name to record (default jsonl)\n"
    "  --topk N                    top-k width (default 5; extra entries are dropped)\n"
    "\n"
    "exit status: 0 written, 2 bad input or usage\n";

int ls_cmd_import(int argc, char **argv)
{
    enum { OPT_MODEL = LS_CLI_LONG, OPT_MANIFEST, OPT_ENGINE, OPT_TOPK };
    static const ls_cli_opt opts[] = {
        {"output", 'o', 1},
        {"model-fingerprint", OPT_MODEL, 1},
        {"manifest-digest", OPT_MANIFEST, 1},
        {"engine", OPT_ENGINE, 1},
        {"topk", OPT_TOPK, 1},
        {NULL, 0, 0},
    };
    ls_error err;
    ls_error_clear(&err);
    ls_import_opts o = {0};
    const char *in = NULL, *out = NULL;
    if (argc >= 2 && ls_cli_is_help(argv[1])) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "jsonl") != 0)
        return ls_cli_usage_error("import", "expected 'import jsonl IN -o OUT --model-fingerprint HEX'");
    /* argv[1] = "jsonl" is the format; its options and IN follow. */
    ls_cli_args a = {.cmd = "import", .usage = usage_text, .opts = opts, .argc = argc - 1, .argv = argv + 1};
    for (int c; (c = ls_cli_next(&a)) != LS_CLI_END;) {
        switch (c) {
        case LS_CLI_EXIT: return a.exit_code;
        case 'o': out = a.arg; break;
        case OPT_MODEL: o.model_fingerprint = a.arg; break;
        case OPT_MANIFEST: o.manifest_digest = a.arg; break;
        case OPT_ENGINE: o.engine = a.arg; break;
        case OPT_TOPK: o.topk = atoi(a.arg); break;
        case LS_CLI_OPERAND:
            if (in) return ls_cli_usage_error("import", "unexpected argument: %s", a.arg);
            in = a.arg;
            break;
        }
    }
    if (!in || !out || !o.model_fingerprint)
        return ls_cli_usage_error("import", "IN, -o OUT and --model-fingerprint are required");
    if (o.topk < 0 || o.topk > 64) return ls_cli_usage_error("import", "--topk must be 1..64");
    char *data;
    size_t len;
    uint64_t n = 0;
    if (ls_read_file_max(in, LS_READ_JSONL_MAX_BYTES, &data, &len, &err) != LS_OK) return ls_cli_report("import", &err);
    ls_status st = ls_import_jsonl(in, data, len, &o, out, &n, &err);
    free(data);
    if (st) return ls_cli_report("import", &err);
    ls_log_info("import: %llu records written to %s", (unsigned long long)n, out);
    return 0;
}
