/* lockstep — the drivers: rollout, replay and continuous batching, written
 * once over the engine's public step API (engine/engine.h). The CLI, the
 * gate, the demo, the tests and the harness all drive runs through these.
 *
 * Each driver hands every engine step's records to a sink as one frame; the
 * records are valid during the call only. Frames come in step order, each
 * once the next step has begun (engine.h, ls_engine_step_begin: a step's
 * digests hash while the device runs the next), so a sink must not ask the
 * engine about "the last step". */
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

/* ---- the step pipeline ----------------------------------------------------------
 * How the drivers step (engine.h, ls_engine_step_begin): begin a step,
 * build its records, then push its frame, which ends the step before it and
 * hands that step's frame to the sink, so that a step's digests hash on host
 * threads while the device runs the next. An engine that does not pipeline
 * (ls_engine_pipelines 0) ends each step at its push. Frames reach the sink
 * in step order. A step's records must be contiguous (row 0's record + r is
 * row r's, as ls_engine_record gives them). */
typedef struct ls_run_pipe {
    ls_engine *e;
    ls_run_sink sink;
    void *ctx;
    int on, pending;           /* pipelining; a step begun and pushed, not yet ended */
    ls_frame_kind kind;        /* the pending step's frame */
    const ls_trace_record *rec0;
    long rows;
} ls_run_pipe;

ls_run_pipe ls_run_pipe_open(ls_engine *e, ls_run_sink sink, void *ctx);
/* The frame of the step just begun: rows records from rec0. */
ls_status ls_run_pipe_push(ls_run_pipe *p, ls_frame_kind kind, const ls_trace_record *rec0, long rows,
                           ls_error *err);
/* Ends the pending step and hands its frame to the sink (nothing pending:
 * nothing to do). Before ls_engine_step or anything else that needs every
 * begun step ended. */
ls_status ls_run_pipe_end(ls_run_pipe *p, ls_error *err);
/* The last frame when st is LS_OK; after a failure every begun step is
 * ended (its digests may still be written into the engine: the pending one,
 * and one begun after it whose records failed) and no frame is written.
 * Returns st, or the end's failure. */
ls_status ls_run_pipe_close(ls_run_pipe *p, ls_status st, ls_error *err);

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

/* ---- GRPO groups, prefix reuse and preemption -------------------------------------
 * What rollout engines do to the plain rollout, each built on the engine's
 * carried-state copies (ls_engine_fork and snapshots, engine.h), and each
 * producing, record for record, the trace of the plain rollout of the same
 * sequences (ls_run_rollout over ls_run_group_sequences): the claim the
 * tests check bit for bit (tokens, logprobs, top-5, every digest).
 *
 * GRPO: samples_per_prompt = N > 1 turns prompt i (id P) into N trace
 * sequences, sample k having the id P * N + k (ls_run_sample_id; N = 1 keeps
 * the ids). Seeded sampling draws with (seed, that id, position), so the key
 * is (seed, prompt, sample, position) and sample k of prompt P is the
 * sequence P * N + k of the plain run. The prompt is prefilled once, in
 * sample 0's slot, and forked N ways after its last position; the prompt
 * positions' records are emitted for every sample (equal but for the id and,
 * at the last prompt position, the sampled next token and its logprob).
 *
 * Prefix reuse: before the run, each prompt looks for the earlier prompt
 * sharing its longest prefix (k tokens) and reuses its state at r positions:
 * r = k - 1 (LS_PREFIX_CACHE_ANY) or r rounded down to a multiple of
 * prefix_block (LS_PREFIX_CACHE_ALIGNED, boundaries as a radix cache keeps
 * them); r = 0 is no reuse. The source's prefill stops at r, a snapshot is
 * taken there, and the new prompt starts from it. r <= k - 1 keeps the last
 * shared token computed; that makes the reused positions' records equal to
 * the source's: positions 0..r-2 select the same next prompt token, and at
 * r - 1 neither sequence is at its prompt boundary or its end, so the same
 * carried-state digests are due. The reused positions still emit their
 * records (copies of the source's, with the new sequence's id), so the trace
 * is the plain run's.
 *
 * Preemption: a forced-eviction schedule drops a sequence's slot before a
 * decode step and brings it back before a later one, into another free slot,
 * by recompute (its positions prefilled again, records discarded: rollout =
 * replay at any chunking) or from a snapshot taken at eviction. While out it
 * decodes nothing, so it finishes later: the decode steps go on until every
 * sequence has its tokens. The run needs one spare slot
 * (ls_run_group_slots). ls_run_preempt_plan derives a schedule from a seed. */

typedef enum ls_prefix_cache {
    LS_PREFIX_CACHE_OFF = 0,
    LS_PREFIX_CACHE_ALIGNED,       /* reuse at multiples of prefix_block */
    LS_PREFIX_CACHE_ANY            /* reuse at any length */
} ls_prefix_cache;

/* "off", "aligned", "any". */
const char *ls_prefix_cache_name(ls_prefix_cache p);

typedef enum ls_resume {
    LS_RESUME_RECOMPUTE = 0,       /* prefill the sequence's positions again */
    LS_RESUME_SNAPSHOT             /* restore the snapshot taken at eviction */
} ls_resume;

typedef struct ls_run_eviction {
    long seq;                      /* index in the run's sequence list (prompt i, sample k: i*N + k) */
    long step;                     /* decode step (>= 1) before which it leaves its slot; it must
                                      be running then (joined, not finished) */
    long resume_step;              /* > step: the decode step before which it comes back */
    ls_resume resume;
} ls_run_eviction;

/* What a group rollout did (for logs and tests). */
typedef struct ls_rollout_stats {
    long positions_computed;       /* positions the engine ran, recompute included */
    long positions_reused;         /* prompt positions started from another prompt's snapshot */
    long forks;                    /* GRPO forks */
    long evictions, recomputed, restored; /* preemptions and how they resumed */
} ls_rollout_stats;

typedef struct ls_rollout_opts {
    long samples_per_prompt;       /* >= 1 */
    ls_prefix_cache prefix_cache;
    long prefix_block;             /* LS_PREFIX_CACHE_ALIGNED: the boundary, >= 1 */
    const ls_run_eviction *evictions; /* [n_evictions] forced evictions (any order), or NULL */
    long n_evictions;
    ls_rollout_stats *stats;       /* filled when not NULL */
} ls_rollout_opts;

/* samples_per_prompt 1, prefix cache off (block 64), no evictions. */
void ls_rollout_opts_default(ls_rollout_opts *o);

/* The trace id of sample k of the prompt with id prompt_id (n samples). */
uint32_t ls_run_sample_id(uint32_t prompt_id, long n, long k);

/* The plain run's sequences: each prompt repeated n times with the sample
 * ids (out [n_prompts * n], sequence i*n + k; tokens borrowed). LS_E_USAGE
 * when an id would not fit 32 bits. */
ls_status ls_run_group_sequences(const ls_sequence *prompts, long n_prompts, long n, ls_sequence *out,
                                 ls_error *err);

/* Engine slots ls_run_rollout_group needs. */
long ls_run_group_slots(long n_prompts, const ls_rollout_opts *o);

/* A seeded eviction schedule for n_seqs sequences of max_new tokens: at each
 * decode step a running sequence is evicted with probability 1/4, for 1..3
 * steps, resumed by recompute or from a snapshot (half each), all decided by
 * SplitMix64 draws keyed by (seed, sequence, step). *out is malloc'ed (free
 * it); none when max_new < 2. */
ls_status ls_run_preempt_plan(uint64_t seed, long n_seqs, long max_new, ls_run_eviction **out, long *n,
                              ls_error *err);

/* ls_run_rollout with GRPO groups, prefix reuse and preemption as o says;
 * completion [n_prompts * N, max_new] (may be NULL). With the options of
 * ls_rollout_opts_default it emits the same records as ls_run_rollout. */
ls_status ls_run_rollout_group(ls_engine *e, const ls_sequence *prompts, long n_prompts, long max_new,
                               const ls_sampling *sampling, const ls_rollout_opts *o, int32_t *completion,
                               ls_run_sink sink, void *ctx, ls_error *err);

#endif
