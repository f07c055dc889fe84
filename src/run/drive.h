/* lockstep — the drivers: rollout, replay and continuous batching, written
 * once over the engine's public step API (engine/engine.h). The CLI, the
 * gate, the demo, the tests and the harness all drive runs through these.
 *
 * Each driver hands every engine step's records to a sink as one frame; the
 * records are valid during the call only. */
#ifndef LS_RUN_DRIVE_H
#define LS_RUN_DRIVE_H

#include <stdint.h>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/sample.h"
#include "trace/trace.h"

/* One step's records (a frame). */
typedef ls_status (*ls_run_sink)(void *ctx, ls_frame_kind kind, const ls_trace_record *recs, long n,
                                 ls_error *err);

typedef struct ls_sequence {
    uint32_t id;               /* sequence id in the trace */
    const int32_t *tokens;     /* [n_tokens] prompt (rollout) or prompt + completion (replay) */
    long n_tokens;
    long prompt_len;           /* replay: prompt tokens (the rollout trace's run params), for the
                                  boundary state digest; 0 = unknown. Rollout: ignored */
} ls_sequence;

/* Rollout: prefill every prompt (packed, at most max_rows rows a step), then
 * decode max_new tokens one at a time for all sequences together (batches of
 * max_rows). completion receives [n_seqs, max_new] generated tokens (may be
 * NULL). Sequence i runs in slot i. */
ls_status ls_run_rollout(ls_engine *e, const ls_sequence *seqs, long n_seqs, long max_new,
                         const ls_sampling *sampling, int32_t *completion, ls_run_sink sink,
                         void *ctx, ls_error *err);

/* Replay: teacher-forced recompute of every sequence's tokens 0..n-2 (the
 * last token is only a target), `chunk` tokens per sequence per step, all
 * sequences packed into each step (which sequence is served first rotates
 * when max_rows runs short). */
ls_status ls_run_replay(ls_engine *e, const ls_sequence *seqs, long n_seqs, long chunk,
                        ls_run_sink sink, void *ctx, ls_error *err);

/* ---- continuous batching -------------------------------------------------------- */
typedef struct ls_run_request {
    uint32_t id;               /* sequence id */
    const int32_t *prompt;     /* [prompt_len] */
    long prompt_len;           /* >= 1 */
    long max_new;              /* >= 1 tokens to generate */
    long arrival_step;         /* first step at which it may take a free slot */
    long prefill_chunk;        /* >= 1 prompt tokens per step */
    int32_t *completion;       /* [max_new] generated tokens out, or NULL */
} ls_run_request;

/* Serves requests the way a continuous-batching engine does: before each
 * step, waiting requests whose arrival step has come take free slots (in
 * request order); each joined request then adds its next prefill chunk or
 * one decode token (in request order) while max_rows allows; a request
 * leaves its slot after its last position. Prefill and decode rows share
 * steps. A frame is LS_FRAME_PREFILL when it holds prompt rows only, else
 * LS_FRAME_DECODE. Row invariance makes every record equal to the one the
 * request would get alone. */
ls_status ls_run_serve(ls_engine *e, const ls_run_request *reqs, long n, const ls_sampling *sampling,
                       ls_run_sink sink, void *ctx, ls_error *err);

#endif
