/* lockstep — importing other engines' outputs as traces.
 *
 * Each format maps an engine's own output onto trace records
 * (docs/import.md gives every field rule with an example):
 *
 *   jsonl         one JSON object per generated token (lockstep's own simple form)
 *   vllm          vLLM's OpenAI-compatible server: completions or chat responses
 *                 with logprobs (token ids as "token_id:N")
 *   vllm-offline  vLLM's offline RequestOutput dumped as JSON (Logprob rank fields)
 *   sglang        SGLang /generate responses (meta_info logprob lists)
 *   verl          verl / Megatron-style tensors in a safetensors file
 *                 (rollout_log_probs [batch, response_length], responses,
 *                 input_ids, attention_mask)
 *
 * Every logprob reaches the trace with the fp32 bits of its text (strtof on
 * the exact characters; a tensor's own bits), never through double. An
 * imported trace (header mode "import") holds the positions the engine
 * scored: the generated part of each sequence, plus the prompt positions
 * when the engine returned prompt logprobs. Sequence ids are 0, 1, 2 ... in
 * file order (requests, then choices / outputs, or batch rows); the header's
 * run_params.batch maps each to the engine's request id and records its
 * prompt length. */
#ifndef LS_TRACE_IMPORT_H
#define LS_TRACE_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum ls_import_format {
    LS_IMPORT_JSONL,
    LS_IMPORT_VLLM,
    LS_IMPORT_VLLM_OFFLINE,
    LS_IMPORT_SGLANG,
    LS_IMPORT_VERL,
    LS_IMPORT_FORMAT_COUNT
} ls_import_format;

/* "jsonl", "vllm", "vllm-offline", "sglang", "verl". */
const char *ls_import_format_name(ls_import_format f);
/* Parses a format name; -1 when unknown. */
int ls_import_format_parse(const char *name);

typedef struct ls_import_opts {
    const char *model_fingerprint;   /* 64 lower-case hex characters (required) */
    const char *manifest_digest;     /* or NULL */
    const char *engine;              /* engine name recorded in the header (default: the format's) */
    int topk;                        /* top-k width; 0: the widest every position of the file
                                        fills (jsonl: 5) */
    int64_t prompt_len;              /* prompt length for sequences whose file gives none
                                        (0: none; such a sequence is an error) */
    const char *logprobs_key;        /* verl: the logprob tensor (default "rollout_log_probs";
                                        "old_log_probs" for the trainer's recompute) */
    const char *tokens_out;          /* or NULL: also write every sequence's tokens (prompt +
                                        generated) as replay tokens JSONL ({"id", "tokens",
                                        "prompt_len"} per line) */
} ls_import_opts;

typedef struct ls_import_summary {
    uint64_t records;                /* records written */
    uint64_t sequences;
    uint64_t prompt_records;         /* of records: prompt positions (engine prompt logprobs) */
    int topk;                        /* top-k width of the trace */
    int no_topk;                     /* 1: the file gave no top-k entry at any position (slots unused) */
} ls_import_summary;

/* Converts JSONL text (one object per generated token: seq, pos, token,
 * logprob, top_logprobs {id: logprob}) into a trace at out_path. Errors name
 * the line and byte offset. in_path is used in messages only. */
ls_status ls_import_jsonl(const char *in_path, const char *data, size_t len, const ls_import_opts *opts,
                          const char *out_path, uint64_t *n_records, ls_error *err);

/* Imports len bytes of data in format fmt (verl: a safetensors file image)
 * into a trace at out_path. label names the input in messages and in
 * run_params (its last path component). sum may be NULL. */
ls_status ls_import_mem(ls_import_format fmt, const char *label, const void *data, size_t len,
                        const ls_import_opts *opts, const char *out_path, ls_import_summary *sum, ls_error *err);

/* Reads in_path (verl: maps it) and imports it like ls_import_mem. */
ls_status ls_import_file(ls_import_format fmt, const char *in_path, const ls_import_opts *opts,
                         const char *out_path, ls_import_summary *sum, ls_error *err);

#endif
