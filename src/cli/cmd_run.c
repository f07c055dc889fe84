/* lockstep run — rollout or replay on a checkpoint, writing a trace. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "run/run.h"
#include "core/util.h"

static const char usage_text[] =
    "usage: lockstep run --checkpoint DIR --mode rollout --prompts FILE [--max-new-tokens N] -o TRACE [options]\n"
    "       lockstep run --checkpoint DIR --mode replay (--from ROLLOUT_TRACE | --tokens FILE) -o TRACE [options]\n"
    "\n"
    "Runs the model with the strict (fixed-order, batch-invariant) engine and writes\n"
    "a trace: per position the token, the selected next token, its logprob, the\n"
    "top-5 and per-layer digests (hidden rows, router, KV every position; GDN and\n"
    "conv state every --state-digest-every positions, at the prompt boundary and\n"
    "at each sequence's last position). The header pins the checkpoint's Merkle\n"
    "root, the digest of the manifest built in process and the run parameters.\n"
    "\n"
    "Rollout prefills every prompt (packed) and decodes token by token. Replay\n"
    "recomputes each full sequence teacher-forced, --chunk tokens per step; with\n"
    "--from it takes the sequences, prompt lengths, activations and state cadence\n"
    "from the rollout trace, and refuses a trace made from another checkpoint (its\n"
    "model fingerprint is not this checkpoint's Merkle root). `lockstep compare\n"
    "ROLLOUT REPLAY` then checks them.\n"
    "\n"
    "--mode is required. An option the mode does not use is refused (exit 2), not\n"
    "ignored: --chunk in a rollout; --max-new-tokens and the sampling options in a\n"
    "replay (it is teacher-forced); --seed, --temperature, --top-k and --top-p\n"
    "without --sampling seeded.\n"
    "\n"
    "inputs:\n"
    "  --checkpoint DIR          Hugging Face checkpoint directory (Qwen3-Next, Qwen3.5 MoE;\n"
    "                            BF16, F32 or FP8 block-quantised), or\n"
    "                            synth:PRESET,seed=N[,layers=N][,fp8][,experts=fused|per-expert]:\n"
    "                            the checkpoint `lockstep synth` writes for those options, generated\n"
    "                            in memory (same Merkle root; every backend and rank generates its\n"
    "                            share of the matrices itself; nothing on disk; docs/synth.md)\n"
    "  --mode rollout|replay     what to run (required)\n"
    "  --prompts FILE            rollout: JSONL, one {\"id\": N, \"tokens\": [...]} per line\n"
    "  --from TRACE              replay: the rollout trace to recompute\n"
    "  --tokens FILE             replay: JSONL {\"id\", \"tokens\" (prompt + completion), \"prompt_len\"}\n"
    "options:\n"
    "  --max-new-tokens N        rollout only: tokens to generate per sequence (default 16)\n"
    "  --chunk N                 replay only: tokens per sequence per step (default: whole sequence)\n"
    "  --sampling greedy|seeded  rollout only: token selection (default greedy; seeded is keyed\n"
    "                            by seed, sequence, position)\n"
    "  --seed S --temperature T --top-k K --top-p P   --sampling seeded only: its parameters\n"
    "                            (--seed required; defaults: T 1, K 0 = all, P 1)\n"
    "  --samples-per-prompt N    rollout only: a GRPO group of N samples per prompt (default 1),\n"
    "                            prefilled once and forked N ways; sample k of prompt id P is\n"
    "                            trace sequence P*N+k, so it equals that sequence of the plain\n"
    "                            rollout of each prompt listed N times (N > 1 needs --sampling\n"
    "                            seeded: greedy samples would all be equal)\n"
    "  --prefix-cache off|aligned|any  rollout only: a prompt sharing a prefix with an earlier\n"
    "                            one starts from that prompt's state (snapshot) at the shared\n"
    "                            length minus one (any) or that rounded down to --prefix-block\n"
    "                            (aligned); the reused positions' records are copied (default off)\n"
    "  --prefix-block N          --prefix-cache aligned only: the boundary (default 64)\n"
    "  --preempt none|seeded:S   rollout only: evict sequences between decode steps and resume\n"
    "                            them by recompute or from a snapshot, as drawn from seed S\n"
    "                            (default none). None of these three changes a bit of any record;\n"
    "                            all are recorded in run_params\n"
    "  --kv-page N               KV cache in pages of N >= 1 positions from a pool shared by\n"
    "                            the batch, a page table per sequence (default: one contiguous\n"
    "                            cache per sequence); attention reads the same keys in the\n"
    "                            same order, so no bit changes; recorded in run_params\n"
    "  --activations bf16|fp32   activation dtype (default bf16; replay --from: the rollout's)\n"
    "  --fp8 dequant|w8a8        FP8 checkpoints only: weights dequantised to fp32 (default), or\n"
    "                            w8a8 with activations quantised per token group of 128, as\n"
    "                            serving engines compute (replay --from: the rollout's)\n"
    "  --gdn-form recurrent|chunk-aligned  the Gated DeltaNet arithmetic (default recurrent: token\n"
    "                            by token); chunk-aligned: chunks of 64 positions at absolute\n"
    "                            multiples, the state carried at their starts, rollout = replay\n"
    "                            bitwise at any chunking as with the recurrent form, other bits\n"
    "                            (docs/numerics.md §5.1); cpu and cuda backends, with --tier tc\n"
    "                            or fast on tensor cores (docs/tensor-core-tier.md §3.6); recorded\n"
    "                            in the manifest and run_params (replay --from: the rollout's)\n"
    "  --backend cpu|cuda        operator backend (default cpu; cuda needs a CUDA build and a GPU)\n"
    "  --tier portable|tc|fast   the kernels' tier (default portable: CUDA = CPU bit for bit); tc:\n"
    "                            --backend cuda, the linears and lm_head on tensor cores through\n"
    "                            one cuBLASLt algorithm per weight shape, qualified row-invariant\n"
    "                            on this GPU at start and pinned in the manifest, and the MoE\n"
    "                            experts through lockstep's own tensor-core kernels: deterministic,\n"
    "                            batch- and chunk-invariant, not equal to the CPU; fast: what\n"
    "                            serving engines run: the linears through cuBLASLt's default\n"
    "                            heuristic per call, split-KV attention, GDN prefill chunked from\n"
    "                            each call's start, the MoE combine by atomic adds: not\n"
    "                            batch-invariant, a non-strict run (manifest mode fast), the\n"
    "                            yardstick for what strictness costs\n"
    "                            (docs/tensor-core-tier.md); tc and fast: one rank, bf16\n"
    "                            checkpoints, --max-rows <= 1024; recorded in run_params (replay\n"
    "                            --from: the rollout's)\n"
    "  --gpu N                   --backend cuda only: the CUDA device to run on (default 0; as\n"
    "                            numbered under CUDA_VISIBLE_DEVICES); recorded in the manifest.\n"
    "                            Several ranks (--ep, --tp, --afd): rank r on device N+r when\n"
    "                            the machine has devices N..N+W-1 for its W ranks, else all W\n"
    "                            on device N, each with 1/W of its free memory; under a\n"
    "                            launcher local rank l on device N+l, which must exist\n"
    "  --threads N               CPU worker threads (no effect on any bit; default 1)\n"
    "  --state-digest-every N    carried-state digest cadence (default 64; replay --from: the rollout's)\n"
    "  --perturb layer=L,op=OP   reverse one operator's reduction order in decoder layer L\n"
    "                            (gdn, conv, attention, router, experts, combine, norm, lm_head;\n"
    "                            the cpu backend); layer=L,op=OP,twin=fast: run that family's\n"
    "                            fast twin there instead (the cuda backend: attention, gdn; on\n"
    "                            --tier tc also combine); recorded in the manifest and run\n"
    "                            params, never a strict run\n"
    "  --dump-layers L,...       also store the full tensors of these decoder layers\n"
    "  --max-rows N              packed tokens per forward (default 256)\n"
    "  --reverse-batch           pack the batch in reverse order\n"
    "  --checkpoint-cache use|off|refresh  reuse the SHA-256 of unchanged checkpoint files\n"
    "                            (same device, inode, size, mtime, ctime; default use), hash\n"
    "                            everything (off), or hash everything and store it (refresh);\n"
    "                            the header's run_params.checkpoint_verified says which\n"
    "  --ep N                    expert parallelism on N ranks (default 1): N processes on this\n"
    "                            host joined by the CPU communicator, rank r owning experts\n"
    "                            r*E/N .. (r+1)*E/N-1; every record equals the one-rank run's\n"
    "                            bit for bit; rank 0 writes the trace, and a rank that fails or\n"
    "                            dies makes every rank exit non-zero with no trace written. N\n"
    "                            must divide num_experts; cpu or cuda (the rows exchanged go\n"
    "                            through host memory: no NCCL yet); recorded in run_params and\n"
    "                            the manifest's topology (outside a strict manifest's digest)\n"
    "  --tp N                    tensor parallelism on N ranks (default 1), order-preserving:\n"
    "                            each rank holds its rows of every projection and of the\n"
    "                            lm_head (attention split by head) and the outputs are\n"
    "                            all-gathered, so every record equals the one-rank run's; the\n"
    "                            MoE runs expert-parallel over the same ranks. N must divide\n"
    "                            the heads, hidden_size, vocab_size and num_experts. With\n"
    "                            --ep M: N*M ranks, TP groups of N consecutive ranks, the\n"
    "                            experts split over all N*M. cpu or cuda, as --ep\n"
    "  --afd A:F                 attention-FFN disaggregation on A + F ranks: ranks 0..A-1 run\n"
    "                            the embedding, mixers, norms and lm_head (A > 1: split by\n"
    "                            head as --tp A would, A dividing the heads and hidden_size),\n"
    "                            ranks A..A+F-1 the routers and experts (F > 1: the experts\n"
    "                            split over them, F dividing num_experts); bit-equal to\n"
    "                            colocated. Without --tp/--ep; cpu or cuda, as --ep\n"
    "  --afd-balance FILE        with --afd (cpu or cuda ranks): where each rank's time went, per\n"
    "                            decoder layer (attention rank busy / waiting for the experts,\n"
    "                            each FFN rank busy / waiting for rows) and totals by GDN,\n"
    "                            attention and expert work, as JSON (wall-clock;\n"
    "                            docs/parallel.md §3.2)\n"
    "  --rank-timeout MS         several ranks only: the deadline of every exchange between\n"
    "                            ranks; a rank that does not answer within it is named and\n"
    "                            every rank fails (default 60000)\n"
    "  -o, --out TRACE           the trace to write (temporary name, renamed when complete)\n"
    "Every option also takes the form --option=VALUE.\n"
    "\n"
    "exit status: 0 trace written, 2 could not run (usage, bad input, no GPU or no such GPU,\n"
    "out of GPU memory, I/O)\n";

static ls_status parse_float(const char *opt, const char *v, float lo, float hi, float *out, ls_error *err)
{
    char *end;
    float x = strtof(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi))
        return ls_fail(err, LS_E_USAGE, "%s '%s': expected a number in %g..%g", opt, v, (double)lo, (double)hi);
    *out = x;
    return LS_OK;
}

int ls_cmd_run(int argc, char **argv)
{
    ls_run_spec s;
    ls_run_spec_default(&s);
    const char *prompts = NULL, *from = NULL, *tokens = NULL, *sampling = "greedy", *act = NULL;
    const char *fp8 = NULL;
    long state_every = 0, v;
    /* Options given on the command line, so that one the mode does not use
     * is refused even when its value equals the default. */
    const char *given_chunk = NULL, *given_max_new = NULL, *given_sampling = NULL, *given_param = NULL;
    int gdn_given = 0, tier_given = 0;
    int have_seed = 0, given_gpu = 0;
    ls_error err;
    ls_error_clear(&err);
    ls_status st = LS_OK;
    enum { O_CK = LS_CLI_LONG, O_MODE, O_PROMPTS, O_FROM, O_TOKENS, O_MAXNEW, O_CHUNK, O_SAMPLING,
           O_SEED, O_TEMP, O_TOPK, O_TOPP, O_ACT, O_BACKEND, O_THREADS, O_EVERY, O_PERTURB, O_DUMP,
           O_ROWS, O_REVERSE, O_CACHE, O_FP8, O_GPU, O_SAMPLES, O_PREFIX, O_PBLOCK, O_PREEMPT,
           O_KVPAGE, O_EP, O_TP, O_AFD, O_BALANCE, O_RTIMEOUT, O_GDN, O_TIER };
    static const ls_cli_opt opts[] = {
        {"checkpoint", O_CK, 1}, {"mode", O_MODE, 1}, {"prompts", O_PROMPTS, 1}, {"from", O_FROM, 1},
        {"tokens", O_TOKENS, 1}, {"out", 'o', 1}, {"max-new-tokens", O_MAXNEW, 1}, {"chunk", O_CHUNK, 1},
        {"sampling", O_SAMPLING, 1}, {"seed", O_SEED, 1}, {"temperature", O_TEMP, 1},
        {"top-k", O_TOPK, 1}, {"top-p", O_TOPP, 1}, {"activations", O_ACT, 1},
        {"backend", O_BACKEND, 1}, {"threads", O_THREADS, 1}, {"state-digest-every", O_EVERY, 1},
        {"perturb", O_PERTURB, 1}, {"dump-layers", O_DUMP, 1}, {"max-rows", O_ROWS, 1},
        {"reverse-batch", O_REVERSE, 0}, {"checkpoint-cache", O_CACHE, 1}, {"fp8", O_FP8, 1},
        {"gpu", O_GPU, 1}, {"samples-per-prompt", O_SAMPLES, 1}, {"prefix-cache", O_PREFIX, 1},
        {"prefix-block", O_PBLOCK, 1}, {"preempt", O_PREEMPT, 1}, {"kv-page", O_KVPAGE, 1},
        {"ep", O_EP, 1}, {"tp", O_TP, 1}, {"afd", O_AFD, 1}, {"afd-balance", O_BALANCE, 1},
        {"rank-timeout", O_RTIMEOUT, 1}, {"gdn-form", O_GDN, 1}, {"tier", O_TIER, 1}, {NULL, 0, 0}};
    ls_cli_args ca = {.cmd = "run", .usage = usage_text, .opts = opts, .argc = argc, .argv = argv};
    for (int c; st == LS_OK && (c = ls_cli_next(&ca)) != LS_CLI_END;) {
        const char *a = ca.opt, *x = ca.arg;
        switch (c) {
        case LS_CLI_EXIT: return ca.exit_code;
        case LS_CLI_OPERAND: st = ls_fail(&err, LS_E_USAGE, "unexpected argument: %s", x); break;
        case O_REVERSE: s.reverse_batch = 1; break;
        case O_CK: s.checkpoint = x; break;
        case O_MODE: s.mode = x; break;
        case O_PROMPTS: prompts = x; break;
        case O_FROM: from = x; break;
        case O_TOKENS: tokens = x; break;
        case 'o': s.out = x; break;
        case O_MAXNEW:
            given_max_new = "--max-new-tokens";
            st = ls_cli_parse_long(a, x, 1, 1L << 24, &s.max_new, &err);
            break;
        case O_CHUNK:
            given_chunk = "--chunk";
            st = ls_cli_parse_long(a, x, 1, 1L << 30, &s.chunk, &err);
            break;
        case O_SAMPLING:
            given_sampling = "--sampling";
            sampling = x;
            break;
        case O_SEED: {
            given_param = "--seed";
            char *end;
            s.sampling.seed = strtoull(x, &end, 10);
            if (end == x || *end || x[0] == '-')
                st = ls_fail(&err, LS_E_USAGE, "--seed '%s': expected an unsigned integer", x);
            have_seed = 1;
            break;
        }
        case O_TEMP:
            given_param = "--temperature";
            st = parse_float(a, x, 1e-6f, 1e6f, &s.sampling.temperature, &err);
            break;
        case O_TOPK:
            given_param = "--top-k";
            st = ls_cli_parse_long(a, x, 0, 1L << 30, &s.sampling.top_k, &err);
            break;
        case O_TOPP:
            given_param = "--top-p";
            st = parse_float(a, x, 0.0f, 1.0f, &s.sampling.top_p, &err);
            if (st == LS_OK && s.sampling.top_p <= 0.0f) st = ls_fail(&err, LS_E_USAGE, "--top-p must be > 0");
            break;
        case O_ACT: act = x; break;
        case O_FP8: fp8 = x; break;
        case O_BACKEND: s.backend = x; break;
        case O_GPU:
            given_gpu = 1;
            st = ls_cli_parse_gpu(a, x, &s.gpu, &err);
            break;
        case O_THREADS:
            st = ls_cli_parse_long(a, x, 1, 1024, &v, &err);
            s.threads = (int)v;
            break;
        case O_EVERY: st = ls_cli_parse_long(a, x, 1, 1L << 30, &state_every, &err); break;
        case O_PERTURB: s.perturb = x; break;
        case O_DUMP: s.dump_layers = x; break;
        case O_CACHE: st = ls_run_parse_hash_cache(x, &s.hash_cache, &err); break;
        case O_ROWS: st = ls_cli_parse_long(a, x, 1, 1L << 20, &s.max_rows, &err); break;
        /* range checks are the run layer's (ls_run_spec_validate): 0 is refused there, by name */
        case O_SAMPLES: st = ls_cli_parse_long(a, x, 0, 1L << 20, &s.samples_per_prompt, &err); break;
        case O_PREFIX: s.prefix_cache = x; break;
        case O_PBLOCK: st = ls_cli_parse_long(a, x, 1, 1L << 30, &s.prefix_block, &err); break;
        case O_PREEMPT: s.preempt = x; break;
        /* at least one position; the run layer refuses an absurd size by name */
        case O_KVPAGE: st = ls_cli_parse_kv_page(a, x, &s.kv_page, &err); break;
        /* the run layer refuses a degree the model, the backend or the build cannot take, by name */
        case O_EP:
            st = ls_cli_parse_long(a, x, 1, 1L << 20, &v, &err);
            s.ep = (int)v;
            break;
        case O_TP:
            st = ls_cli_parse_long(a, x, 1, 1L << 20, &v, &err);
            s.tp = (int)v;
            break;
        case O_AFD: st = ls_cli_parse_afd(a, x, &s.afd_attention, &s.afd_ffn, &err); break;
        case O_BALANCE: s.afd_balance = x; break;
        case O_GDN:
            st = ls_run_parse_gdn_form(a, x, &s.gdn_chunked, &err);
            gdn_given = 1;
            break;
        case O_TIER:
            st = ls_run_parse_tier(a, x, &s.tier, &err);
            tier_given = 1;
            break;
        case O_RTIMEOUT: st = ls_cli_parse_long(a, x, 1, 1L << 30, &s.rank_timeout_ms, &err); break;
        }
    }
    if (st != LS_OK) return ls_cli_report("run", &err);
    int rollout = s.mode && !strcmp(s.mode, "rollout");
    if (!s.mode)
        st = ls_fail(&err, LS_E_USAGE, "--mode is required: rollout or replay");
    else if (!rollout && strcmp(s.mode, "replay"))
        st = ls_fail(&err, LS_E_USAGE, "--mode '%s': expected rollout or replay", s.mode);
    else if (rollout && given_chunk)
        st = ls_fail(&err, LS_E_USAGE, "--chunk applies to --mode replay only (a rollout prefills whole "
                     "prompts and decodes one token per step)");
    else if (!rollout && (given_max_new || given_sampling || given_param))
        st = ls_fail(&err, LS_E_USAGE, "%s applies to --mode rollout only (a replay recomputes the "
                     "tokens it is given, teacher-forced)",
                     given_max_new ? given_max_new : given_sampling ? given_sampling : given_param);
    else if (given_param && !strcmp(sampling, "greedy"))
        st = ls_fail(&err, LS_E_USAGE, "%s applies to --sampling seeded only (greedy selection takes no "
                     "parameters)", given_param);
    else if (!s.checkpoint) st = ls_fail(&err, LS_E_USAGE, "--checkpoint DIR is required");
    else if (!s.out) st = ls_fail(&err, LS_E_USAGE, "-o TRACE is required");
    else if (rollout && (!prompts || from || tokens))
        st = ls_fail(&err, LS_E_USAGE, "--mode rollout takes --prompts FILE (not --from/--tokens)");
    else if (!rollout && (prompts || !from == !tokens))
        st = ls_fail(&err, LS_E_USAGE, "--mode replay takes exactly one of --from TRACE or --tokens FILE");
    else if (strcmp(s.backend, "cpu") && strcmp(s.backend, "cuda"))
        st = ls_fail(&err, LS_E_USAGE, "--backend '%s': expected cpu or cuda", s.backend);
    else if (ls_cli_check_gpu(s.backend, given_gpu, &err) != LS_OK)
        st = err.status;
    else if (act && strcmp(act, "bf16") && strcmp(act, "fp32"))
        st = ls_fail(&err, LS_E_USAGE, "--activations '%s': expected bf16 or fp32", act);
    else if (fp8 && strcmp(fp8, "dequant") && strcmp(fp8, "w8a8"))
        st = ls_fail(&err, LS_E_USAGE, "--fp8 '%s': expected dequant or w8a8", fp8);
    else if (!strcmp(sampling, "seeded")) {
        s.sampling.kind = LS_SAMPLING_SEEDED;
        if (!have_seed) st = ls_fail(&err, LS_E_USAGE, "--sampling seeded needs --seed S");
    } else if (strcmp(sampling, "greedy"))
        st = ls_fail(&err, LS_E_USAGE, "--sampling '%s': expected greedy or seeded", sampling);
    if (st != LS_OK) return ls_cli_report("run", &err);

    if (rollout && !given_max_new) s.max_new = 16;
    ls_run_batch b = {0, NULL};
    ls_run_rollout_info info;
    if (rollout) st = ls_run_load_prompts(prompts, 0, &b, &err);
    else if (tokens) st = ls_run_load_tokens(tokens, 0, &b, &err);
    else {
        st = ls_run_load_rollout(from, &b, &info, &err);
        if (st == LS_OK) {
            if (!act) s.act_bf16 = info.act_bf16;
            if (!fp8 && info.fp8[0]) s.fp8 = info.fp8; /* info lives until the run ends */
            if (!gdn_given) s.gdn_chunked = info.gdn_chunked;
            if (!tier_given) s.tier = info.tier;
            if (!state_every) state_every = info.state_digest_every;
            /* the run refuses a checkpoint other than the rollout's */
            s.expect_merkle_root = info.model_fingerprint;
            s.expect_source = from;
        }
    }
    if (st != LS_OK) return ls_cli_report("run", &err);
    if (act) s.act_bf16 = !strcmp(act, "bf16");
    if (fp8) s.fp8 = fp8;
    if (state_every) s.state_digest_every = state_every;
    s.batch = &b;
    s.progress = 1;
    ls_run_result res;
    st = ls_run_execute(&s, &res, &err);
    ls_run_batch_free(&b);
    if (st != LS_OK) return ls_cli_report("run", &err);
    free(res.completions);
    char gpu_label[96] = "";
    if (s.afd_attention > 0)
        snprintf(gpu_label, sizeof gpu_label, " on %d:%d attention-FFN ranks", s.afd_attention, s.afd_ffn);
    else if (s.tp > 1 && s.ep > 1)
        snprintf(gpu_label, sizeof gpu_label, " on %d ranks (TP%d x EP%d)", s.tp * s.ep, s.tp, s.ep);
    else if (s.tp > 1) snprintf(gpu_label, sizeof gpu_label, " on %d tensor-parallel ranks", s.tp);
    else if (s.ep > 1) snprintf(gpu_label, sizeof gpu_label, " on %d expert-parallel ranks", s.ep);
    if (!strcmp(s.backend, "cuda")) {
        size_t n = strlen(gpu_label);
        snprintf(gpu_label + n, sizeof gpu_label - n, ls_run_spec_world(&s) > 1 ? " (from CUDA device %d)"
                                                                               : " (CUDA device %d)", s.gpu);
    }
    ls_log_info("%s: %llu records, %llu positions in %.2f s (%.1f tokens/s), backend %s%s, model %.16s..., "
                "manifest %.16s...%s",
                s.out, (unsigned long long)res.records, (unsigned long long)res.positions, res.seconds,
                res.seconds > 0 ? (double)res.positions / res.seconds : 0.0, s.backend, gpu_label,
                res.merkle_root,
                res.manifest_digest, s.perturb ? " (perturbed: not a strict run)"
                : s.tier == LS_TIER_FAST ? " (fast tier: not a strict run)" : "");
    return 0;
}
