/* lockstep CLI — running the engine for `run`, `gate` and `demo`: reading
 * the inputs (prompts JSONL, a rollout trace, tokens JSONL), pinning the
 * manifest in process, writing the trace (header + one frame per engine
 * step) and drawing progress on a terminal. */
#ifndef LS_CLI_RUN_COMMON_H
#define LS_CLI_RUN_COMMON_H

#include <stdint.h>

#include "core/status.h"
#include "fingerprint/fingerprint.h"
#include "engine/engine.h"

/* A batch of sequences; every token array is owned by the batch. */
typedef struct ls_cli_batch {
    long n;
    ls_sequence *seqs;             /* [n] */
} ls_cli_batch;

void ls_cli_batch_free(ls_cli_batch *b);

/* Prompts JSONL: one object per line, {"id": u32, "tokens": [int, ...]}
 * (other keys ignored; blank lines skipped). Errors name FILE:LINE and the
 * field. vocab > 0 also range-checks the tokens. */
ls_status ls_cli_load_prompts(const char *path, long vocab, ls_cli_batch *out, ls_error *err);

/* Tokens JSONL for replay: {"id", "tokens" (prompt + completion), "prompt_len"}. */
ls_status ls_cli_load_tokens(const char *path, long vocab, ls_cli_batch *out, ls_error *err);

/* What a replay takes from the rollout trace it re-runs. */
typedef struct ls_cli_rollout_info {
    int act_bf16;                  /* the rollout's activation dtype */
    long state_digest_every;
    long max_new;                  /* run_params.max_new_tokens, 0 if absent */
} ls_cli_rollout_info;

/* Full sequences of a rollout trace (each position's token, then the last
 * position's next token) with the prompt lengths of its run_params.batch. */
ls_status ls_cli_load_rollout(const char *trace_path, ls_cli_batch *out, ls_cli_rollout_info *info,
                              ls_error *err);

typedef struct ls_run_spec {
    const char *checkpoint;        /* directory */
    const char *mode;              /* "rollout" | "replay" */
    const ls_cli_batch *batch;     /* rollout: prompts; replay: full sequences */
    long max_new;                  /* rollout */
    long chunk;                    /* replay: tokens per sequence per step; 0 = whole sequence */
    int reverse_batch;             /* replay: pack the batch in reverse order */
    ls_sampling sampling;
    int act_bf16;
    const char *backend;           /* "cpu" | "cuda" */
    int threads;
    long state_digest_every;
    long max_rows;
    const char *perturb;           /* "layer=L,op=OP" or NULL */
    const char *dump_layers;       /* "L,L,..." or NULL */
    const char *out;               /* trace path */
    int progress;                  /* progress bar on a terminal */
    const ls_fingerprint *fingerprint; /* the checkpoint's, already computed (borrowed), or NULL */
} ls_run_spec;

void ls_run_spec_default(ls_run_spec *s);

typedef struct ls_run_result {
    char merkle_root[65];
    char manifest_digest[65];
    uint64_t records;
    uint64_t positions;            /* token positions the model processed */
    double seconds;                /* engine wall time (excludes pinning the manifest) */
    int32_t *completions;          /* rollout: [batch n, max_new] generated tokens; owned, free() */
} ls_run_result;

/* Opens the checkpoint and model, pins the manifest (perturbation recorded as
 * numerics.perturbation, mode "fast"), runs the engine and writes the trace. */
ls_status ls_cli_run_engine(const ls_run_spec *s, ls_run_result *res, ls_error *err);

/* A working directory: `given` (created if missing, kept) or a fresh
 * temporary one (*temporary = 1; remove it with ls_cli_workdir_remove). */
ls_status ls_cli_workdir(const char *given, const char *tag, char *out, size_t out_size, int *temporary,
                         ls_error *err);
/* Removes the regular files directly inside dir, then dir. */
void ls_cli_workdir_remove(const char *dir);

/* Parses an unsigned decimal option value into [lo, hi]. */
ls_status ls_cli_parse_long(const char *opt, const char *v, long lo, long hi, long *out, ls_error *err);

#endif
