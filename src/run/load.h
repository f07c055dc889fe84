/* lockstep — run inputs: prompts JSONL (rollout), tokens JSONL and rollout
 * traces (replay). Every loader fails closed with a one-line message naming
 * FILE:LINE and the field (JSONL) or the byte offset (traces). */
#ifndef LS_RUN_LOAD_H
#define LS_RUN_LOAD_H

#include "backend/backend.h"
#include <stddef.h>

#include "core/status.h"
#include "run/drive.h"

/* A batch of sequences; every token array is owned by the batch. */
typedef struct ls_run_batch {
    long n;
    ls_sequence *seqs;             /* [n] */
} ls_run_batch;

void ls_run_batch_free(ls_run_batch *b);

/* Prompts JSONL: one object per line, {"id": u32, "tokens": [int, ...]}
 * (other keys ignored; blank lines skipped; ids unique). vocab > 0 also
 * range-checks the tokens. */
ls_status ls_run_load_prompts(const char *path, long vocab, ls_run_batch *out, ls_error *err);

/* Tokens JSONL for replay: {"id", "tokens" (prompt + completion, >= 2),
 * "prompt_len" (1 .. tokens - 1)}. */
ls_status ls_run_load_tokens(const char *path, long vocab, ls_run_batch *out, ls_error *err);

/* The same two parsers over text in memory; label names it in messages
 * (the fuzz targets call these). */
ls_status ls_run_parse_prompts(const char *label, const char *text, size_t len, long vocab,
                               ls_run_batch *out, ls_error *err);
ls_status ls_run_parse_tokens(const char *label, const char *text, size_t len, long vocab,
                              ls_run_batch *out, ls_error *err);

/* What a replay takes from the rollout trace it re-runs. */
typedef struct ls_run_rollout_info {
    int act_bf16;                  /* the rollout's activation dtype */
    long state_digest_every;
    long max_new;                  /* run_params.max_new_tokens, 0 if absent */
    int gdn_chunked;               /* run_params.gdn_form: 1 = the chunk-aligned GDN form */
    ls_tier tier;                  /* run_params.tier: "tc" or "fast" (absent: portable) */
    char fp8[16];                  /* run_params.fp8 of a run on an FP8 checkpoint ("dequant" or
                                      "w8a8"), "" when absent: a replay's ls_run_spec.fp8 */
    char model_fingerprint[65];    /* the checkpoint's Merkle root (hex) the rollout ran on: a
                                      replay's ls_run_spec.expect_merkle_root */
} ls_run_rollout_info;

/* Full sequences of a rollout trace (each position's token, then the last
 * position's next token) with the prompt lengths of its run_params.batch. */
ls_status ls_run_load_rollout(const char *trace_path, ls_run_batch *out, ls_run_rollout_info *info,
                              ls_error *err);

#endif
