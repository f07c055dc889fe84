/* lockstep — importing other engines' outputs as traces. */
#ifndef LS_TRACE_IMPORT_H
#define LS_TRACE_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct ls_import_opts {
    const char *model_fingerprint;   /* 64 lower-case hex characters (required) */
    const char *manifest_digest;     /* or NULL */
    const char *engine;              /* engine name recorded in the header (default "jsonl") */
    int topk;                        /* top-k width (default 5) */
} ls_import_opts;

/* Converts JSONL text (one object per generated token: seq, pos, token,
 * logprob, top_logprobs {id: logprob}) into a trace at out_path. Errors name
 * the line and byte offset. in_path is used in messages only. */
ls_status ls_import_jsonl(const char *in_path, const char *data, size_t len, const ls_import_opts *opts,
                          const char *out_path, uint64_t *n_records, ls_error *err);

#endif
