/* lockstep gate — the CI gate: one rollout, several replays (chunkings and a
 * reordered batch), each compared bitwise against the rollout. */
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "run/gate.h"
#include "run/run.h"
#include "compare/compare.h"
#include "core/util.h"
#include "report/report.h"

static const char usage_text[] =
    "usage: lockstep gate --checkpoint DIR --prompts FILE [options]\n"
    "\n"
    "Rolls the prompts out (prefill + decode), then replays the full sequences\n"
    "teacher-forced at chunk 1, 3, 64 and whole-sequence, and once more with the\n"
    "batch packed in reverse order, and compares each replay with the rollout\n"
    "bitwise (tokens, top-5 ids/order/logprob bits, selected logprob bits, every\n"
    "per-layer digest). Prints one row per replay: positions, exact tokens, top-5\n"
    "set equality, max |d logprob|, PASS/FAIL; then the first drift of a failure.\n"
    "\n"
    "options:\n"
    "  --checkpoint DIR       the checkpoint (or synth:PRESET,seed=N,..., as for run)\n"
    "  --max-new-tokens N     tokens generated per prompt (default 16)\n"
    "  --backend cpu|cuda     operator backend (default cpu)\n"
    "  --gpu N                --backend cuda only: the CUDA device of every run (default 0)\n"
    "  --threads N            CPU worker threads (default 1)\n"
    "  --fp8 dequant|w8a8     FP8 checkpoints only: dequantised weights (default) or w8a8\n"
    "  --seed S               sample the rollout seeded with S (temperature 1; default greedy)\n"
    "  --samples-per-prompt N --prefix-cache off|aligned|any --prefix-block N\n"
    "  --preempt none|seeded:S  the rollout as served (as for run: a GRPO group, prefix\n"
    "                         reuse, preemption; N > 1 needs --seed); the replays recompute\n"
    "                         its sequences plainly, so the gate checks that configuration\n"
    "  --kv-page N            the rollout's KV cache in pages of N positions (as for run;\n"
    "                         default: contiguous); the replays keep a contiguous cache\n"
    "  --tp N, --ep M, --afd A:F  the rollout on tensor-parallel, expert-parallel or\n"
    "                         attention-FFN ranks (as for run; cpu or cuda); the replays run\n"
    "                         on one rank, so the gate checks that topology against one rank\n"
    "  --gdn-form recurrent|chunk-aligned  the GDN arithmetic of every run (as for run;\n"
    "                         cpu or cuda); the replays recompute in the rollout's form\n"
    "  --junit FILE           JUnit XML: one testsuite per replay, holding one testcase (that\n"
    "                         replay vs the rollout; a failure carries its first drift)\n"
    "  --json FILE|-          JSON summary (per replay: verdict, counts, first drift; schema\n"
    "                         docs/gate-json.schema.json: identical between runs except the\n"
    "                         wall times rollout_seconds and seconds)\n"
    "  --checkpoint-cache use|off|refresh  as for run: reuse the SHA-256 of unchanged\n"
    "                         checkpoint files (default use), or hash everything\n"
    "  --workdir DIR          keep the traces and per-replay compare reports in DIR\n"
    "                         (default: a temporary directory, removed afterwards)\n"
    "\n"
    "exit status: 0 every replay bitwise equal to the rollout, 1 a drift, 2 could not run (as\n"
    "for run: usage, bad input, no GPU or no such GPU, out of GPU memory, I/O)\n";

int ls_cmd_gate(int argc, char **argv)
{
    ls_gate_opts o;
    memset(&o, 0, sizeof o);
    o.max_new = 16;
    o.backend = "cpu";
    o.threads = 1;
    o.samples_per_prompt = 1;
    ls_error err;
    ls_error_clear(&err);
    ls_status st = LS_OK;
    long v;
    int given_gpu = 0;
    enum { O_CK = LS_CLI_LONG, O_PROMPTS, O_MAXNEW, O_BACKEND, O_THREADS, O_JUNIT, O_JSON, O_WORKDIR,
           O_CACHE, O_FP8, O_GPU, O_SEED, O_SAMPLES, O_PREFIX, O_PBLOCK, O_PREEMPT,
           O_KVPAGE, O_EP, O_TP, O_AFD, O_GDN };
    static const ls_cli_opt opts[] = {
        {"checkpoint", O_CK, 1}, {"prompts", O_PROMPTS, 1}, {"max-new-tokens", O_MAXNEW, 1},
        {"backend", O_BACKEND, 1}, {"threads", O_THREADS, 1}, {"junit", O_JUNIT, 1},
        {"json", O_JSON, 1}, {"workdir", O_WORKDIR, 1}, {"checkpoint-cache", O_CACHE, 1},
        {"fp8", O_FP8, 1}, {"gpu", O_GPU, 1}, {"seed", O_SEED, 1},
        {"samples-per-prompt", O_SAMPLES, 1}, {"prefix-cache", O_PREFIX, 1}, {"prefix-block", O_PBLOCK, 1},
        {"preempt", O_PREEMPT, 1}, {"kv-page", O_KVPAGE, 1}, {"ep", O_EP, 1},
        {"tp", O_TP, 1}, {"afd", O_AFD, 1}, {"gdn-form", O_GDN, 1}, {NULL, 0, 0}};
    ls_cli_args ca = {.cmd = "gate", .usage = usage_text, .opts = opts, .argc = argc, .argv = argv};
    for (int c; st == LS_OK && (c = ls_cli_next(&ca)) != LS_CLI_END;) {
        const char *x = ca.arg;
        switch (c) {
        case LS_CLI_EXIT: return ca.exit_code;
        case LS_CLI_OPERAND: st = ls_fail(&err, LS_E_USAGE, "unexpected argument: %s", x); break;
        case O_CK: o.checkpoint = x; break;
        case O_PROMPTS: o.prompts = x; break;
        case O_MAXNEW: st = ls_cli_parse_long(ca.opt, x, 1, 1L << 24, &o.max_new, &err); break;
        case O_BACKEND: o.backend = x; break;
        case O_GPU:
            given_gpu = 1;
            st = ls_cli_parse_gpu(ca.opt, x, &o.gpu, &err);
            break;
        case O_THREADS:
            st = ls_cli_parse_long(ca.opt, x, 1, 1024, &v, &err);
            o.threads = (int)v;
            break;
        case O_SEED: {
            char *end;
            o.seed = strtoull(x, &end, 10);
            o.seeded = 1;
            if (end == x || *end || x[0] == '-')
                st = ls_fail(&err, LS_E_USAGE, "--seed '%s': expected an unsigned integer", x);
            break;
        }
        case O_SAMPLES: st = ls_cli_parse_long(ca.opt, x, 1, 1L << 20, &o.samples_per_prompt, &err); break;
        case O_PREFIX: o.prefix_cache = x; break;
        case O_PBLOCK: st = ls_cli_parse_long(ca.opt, x, 1, 1L << 30, &o.prefix_block, &err); break;
        case O_PREEMPT: o.preempt = x; break;
        /* at least one position; the run layer refuses an absurd size by name */
        case O_KVPAGE: st = ls_cli_parse_kv_page(ca.opt, x, &o.kv_page, &err); break;
        case O_EP:
        case O_TP: {
            long n;
            st = ls_cli_parse_long(ca.opt, x, 1, 1L << 20, &n, &err);
            *(c == O_EP ? &o.ep : &o.tp) = (int)n;
            break;
        }
        case O_AFD: st = ls_cli_parse_afd(ca.opt, x, &o.afd_attention, &o.afd_ffn, &err); break;
        case O_GDN: st = ls_run_parse_gdn_form(ca.opt, x, &o.gdn_chunked, &err); break;
        case O_JUNIT: o.junit = x; break;
        case O_JSON: o.json = x; break;
        case O_WORKDIR: o.workdir = x; break;
        case O_CACHE: st = ls_run_parse_hash_cache(x, &o.hash_cache, &err); break;
        case O_FP8:
            o.fp8 = x;
            if (strcmp(x, "dequant") && strcmp(x, "w8a8"))
                st = ls_fail(&err, LS_E_USAGE, "--fp8 '%s': expected dequant or w8a8", x);
            break;
        }
    }
    if (st == LS_OK && (!o.checkpoint || !o.prompts))
        st = ls_fail(&err, LS_E_USAGE, "--checkpoint DIR and --prompts FILE are required");
    if (st == LS_OK && strcmp(o.backend, "cpu") && strcmp(o.backend, "cuda"))
        st = ls_fail(&err, LS_E_USAGE, "--backend '%s': expected cpu or cuda", o.backend);
    if (st == LS_OK) st = ls_cli_check_gpu(o.backend, given_gpu, &err);
    if (st != LS_OK) return ls_cli_report("gate", &err);
    ls_run_batch b;
    st = ls_run_load_prompts(o.prompts, 0, &b, &err);
    if (st != LS_OK) return ls_cli_report("gate", &err);
    ls_gate_result r;
    st = ls_gate_run(&o, &b, ls_log_quiet() ? NULL : stdout, &r, &err);
    ls_run_batch_free(&b);
    if (st != LS_OK) return ls_cli_report("gate", &err);
    return r.all_equal ? 0 : 1;
}
