/* lockstep import FORMAT IN -o TRACE — traces from other engines' outputs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/util.h"
#include "trace/import.h"
#include "trace/trace.h"

static const char usage_text[] =
    "usage: lockstep import FORMAT IN -o OUT.trace --model-fingerprint HEX [options]\n"
    "\n"
    "Converts an engine's logprob output into a trace that 'lockstep compare' reads\n"
    "(docs/import.md gives every field rule with an example). FORMAT is one of:\n"
    "  vllm          vLLM OpenAI-compatible server: a completions or chat response\n"
    "                (or a JSON array / JSON Lines of them) with logprobs; token ids\n"
    "                as \"token_id:N\" (request return_tokens_as_token_ids) and, for\n"
    "                the prompt length, return_token_ids\n"
    "  vllm-offline  vLLM's RequestOutput dumped as JSON: prompt_token_ids,\n"
    "                prompt_logprobs, outputs[].token_ids and outputs[].logprobs\n"
    "                ({id: {logprob, rank, decoded_token}}; ranks from the rank field)\n"
    "  sglang        SGLang /generate responses: meta_info.output_token_logprobs,\n"
    "                output_top_logprobs, input_token_logprobs, input_top_logprobs\n"
    "  verl          verl / Megatron-style tensors in a safetensors file:\n"
    "                rollout_log_probs [batch, response_length] (padded with -1),\n"
    "                responses, input_ids, attention_mask\n"
    "  jsonl         one object per generated token:\n"
    "                {\"seq\": 0, \"pos\": 17, \"token\": 1234, \"logprob\": -0.25,\n"
    "                 \"top_logprobs\": {\"1234\": -0.25, \"99\": -1.5}} (pos = prompt\n"
    "                length + step; top_logprobs in rank order)\n"
    "\n"
    "Every logprob keeps the fp32 bits of its text (strtof on the exact characters,\n"
    "never through double; NaN, Infinity, -Infinity, nan, inf, -inf as written;\n"
    "JSON null as -inf where an engine writes it for -inf) or of its tensor.\n"
    "Sequences are numbered 0, 1, 2 ... in file order; the trace's run_params.batch\n"
    "records each one's request id and prompt length. The trace holds the positions\n"
    "the engine scored: the generated tokens, and the prompt's when the file has\n"
    "prompt logprobs. It has no digests: compare checks tokens, logprobs and top-k\n"
    "on the positions both traces hold, and says so.\n"
    "\n"
    "options:\n"
    "  -o, --output FILE           trace to write (required)\n"
    "  --model-fingerprint HEX     model Merkle root, 64 hex characters (required)\n"
    "  --manifest-digest HEX       manifest SHA-256 to record\n"
    "  --engine NAME               engine name to record (default: the format's)\n"
    "  --topk N                    top-k width (default: the most ranks every position\n"
    "                              of the file fills; jsonl: 5)\n"
    "  --prompt-len N              prompt length of sequences whose file gives none\n"
    "  --tokens-out FILE           also write each sequence's tokens (prompt and\n"
    "                              generated) as JSONL for 'lockstep run --mode replay\n"
    "                              --tokens FILE' (ids as in the trace)\n"
    "  --logprobs-key NAME         verl: the logprob tensor (default rollout_log_probs;\n"
    "                              old_log_probs for the trainer's recompute)\n"
    "Every option also takes the form --option=VALUE.\n"
    "\n"
    "exit status: 0 written, 2 bad input or usage\n";

int ls_cmd_import(int argc, char **argv)
{
    enum { OPT_MODEL = LS_CLI_LONG, OPT_MANIFEST, OPT_ENGINE, OPT_TOPK, OPT_PROMPT_LEN, OPT_TOKENS_OUT, OPT_KEY };
    static const ls_cli_opt opts[] = {
        {"output", 'o', 1},
        {"model-fingerprint", OPT_MODEL, 1},
        {"manifest-digest", OPT_MANIFEST, 1},
        {"engine", OPT_ENGINE, 1},
        {"topk", OPT_TOPK, 1},
        {"prompt-len", OPT_PROMPT_LEN, 1},
        {"tokens-out", OPT_TOKENS_OUT, 1},
        {"logprobs-key", OPT_KEY, 1},
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
    int fmt = argc >= 2 ? ls_import_format_parse(argv[1]) : -1;
    if (fmt < 0)
        return ls_cli_usage_error("import", "%s%s%s: expected a format: vllm, vllm-offline, sglang, verl or jsonl",
                                  argc >= 2 ? "unknown format '" : "no format", argc >= 2 ? argv[1] : "",
                                  argc >= 2 ? "'" : "");
    /* argv[1] is the format; its options and IN follow. */
    ls_cli_args a = {.cmd = "import", .usage = usage_text, .opts = opts, .argc = argc - 1, .argv = argv + 1};
    long v;
    for (int c; (c = ls_cli_next(&a)) != LS_CLI_END;) {
        switch (c) {
        case LS_CLI_EXIT: return a.exit_code;
        case 'o': out = a.arg; break;
        case OPT_MODEL: o.model_fingerprint = a.arg; break;
        case OPT_MANIFEST: o.manifest_digest = a.arg; break;
        case OPT_ENGINE: o.engine = a.arg; break;
        case OPT_TOPK:
            if (ls_cli_parse_long("--topk", a.arg, 1, 64, &v, &err)) return ls_cli_report("import", &err);
            o.topk = (int)v;
            break;
        case OPT_PROMPT_LEN:
            if (ls_cli_parse_long("--prompt-len", a.arg, 1, 0x7fffffffL, &v, &err)) return ls_cli_report("import", &err);
            o.prompt_len = v;
            break;
        case OPT_TOKENS_OUT: o.tokens_out = a.arg; break;
        case OPT_KEY: o.logprobs_key = a.arg; break;
        case LS_CLI_OPERAND:
            if (in) return ls_cli_usage_error("import", "unexpected argument: %s", a.arg);
            in = a.arg;
            break;
        }
    }
    if (!in || !out || !o.model_fingerprint)
        return ls_cli_usage_error("import", "IN, -o OUT and --model-fingerprint are required");
    if (o.logprobs_key && fmt != LS_IMPORT_VERL)
        return ls_cli_usage_error("import", "--logprobs-key applies to the verl format only");
    if (o.tokens_out && fmt == LS_IMPORT_JSONL)
        return ls_cli_usage_error("import", "--tokens-out: the jsonl format carries no prompt tokens");
    if (o.prompt_len && (fmt == LS_IMPORT_JSONL || fmt == LS_IMPORT_VLLM_OFFLINE || fmt == LS_IMPORT_VERL))
        return ls_cli_usage_error("import", "--prompt-len: the %s format gives every prompt length itself",
                                  ls_import_format_name((ls_import_format)fmt));
    ls_import_summary sum = {0};
    if (ls_import_file((ls_import_format)fmt, in, &o, out, &sum, &err)) return ls_cli_report("import", &err);
    if (fmt == LS_IMPORT_JSONL)
        ls_log_info("import: %llu records written to %s", (unsigned long long)sum.records, out);
    else
        ls_log_info("import: %llu sequences, %llu records (%llu at prompt positions), top-%d%s, written to %s%s%s",
                    (unsigned long long)sum.sequences, (unsigned long long)sum.records,
                    (unsigned long long)sum.prompt_records, sum.topk,
                    sum.no_topk ? " (no top-k in the file: compare it with --logprobs-only)" : "", out,
                    o.tokens_out ? "; tokens to " : "", o.tokens_out ? o.tokens_out : "");
    return 0;
}
