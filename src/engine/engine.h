/* lockstep — the engine: rollout (prefill + decode) and replay (teacher-forced,
 * chunked) over the operator table, with packed batches of sequences.
 *
 * Everything runs through one primitive, ls_engine_step: one packed forward
 * over an arbitrary mix of items (prefill chunks of some sequences, single
 * decode tokens of others) held in sequence slots that join and leave between
 * steps. The rollout, replay and continuous-batching drivers are written once
 * over it in the run layer (src/run/drive.h). Row invariance (numerics contract rule 1)
 * makes a sequence's records independent of what else shares its steps.
 *
 * Records (src/trace/trace.h) at position p of a sequence: the token at p,
 * the selected next token (the following prompt token, the sampled one, or in
 * replay the teacher-forced one), its logprob, the top-5 and the digests of
 * every trace layer after processing p.
 *
 * Trace layers: 0 embed; for decoder layer l: 1 + 2l its mixer (gdn or
 * attention), 2 + 2l its moe; 1 + 2L the final norm; 2 + 2L lm_head.
 * Digests are SHA-256 of the canonical bytes of docs/trace-format.md §6,
 * computed by the backend's digest op (backend.h), batched per layer:
 *   HIDDEN      every trace layer, every position: the hidden row after it
 *               (embed, mixer residual, moe residual, final norm; activation
 *               dtype) or the logits row (lm_head; fp32)
 *   GDN_STATE   gdn layers: the fp32 state [H_v, d_k, d_v] after p
 *   CONV_STATE  gdn layers: the conv state [conv_dim, W-1] after p, oldest
 *               column first (activation dtype)
 *   KV          attention layers, every position: K row [H_kv, d] then V row
 *   ROUTER      moe layers, every position: top-k ids (int32) then weights (fp32)
 * GDN_STATE and CONV_STATE (carried state) are recorded at positions p with
 * p % N == N - 1 (N = state_digest_every), at the last prompt position (the
 * prompt/completion boundary) and at each sequence's last position. */
#ifndef LS_ENGINE_ENGINE_H
#define LS_ENGINE_ENGINE_H

#include <stdint.h>

#include "backend/backend.h"
#include "dist/comm.h"
#include "core/status.h"
#include "engine/sample.h"
#include "model/model.h"
#include "trace/trace.h"

/* Operators the perturbation switch can change (reduction order reversed in
 * one layer; see cpu_ops.h LS_ORDER_REVERSED). */
typedef enum ls_perturb_op {
    LS_PERTURB_NONE,
    LS_PERTURB_GDN,            /* GDN recurrent step dot products */
    LS_PERTURB_CONV,           /* causal conv tap sum */
    LS_PERTURB_ATTENTION,      /* attention dot products and block sums */
    LS_PERTURB_ROUTER,         /* router logits, softmax sum, renormalisation */
    LS_PERTURB_EXPERTS,        /* routed + shared expert dot products */
    LS_PERTURB_COMBINE,        /* MoE combine sum */
    LS_PERTURB_NORM,           /* the layer's two RMSNorms */
    LS_PERTURB_LM_HEAD,        /* lm_head dot products (the layer is ignored) */
    LS_PERTURB_COUNT
} ls_perturb_op;

/* "gdn", "conv", ...; "none" for LS_PERTURB_NONE, "?" out of range. */
const char *ls_perturb_op_name(ls_perturb_op op);

/* 1 when op exists in decoder layer `layer` of a model of config c, so that
 * the engine accepts perturb_layer = layer with it: attention in full
 * attention layers, gdn and conv in gated DeltaNet layers, the others
 * (router, experts, combine, norm) in every layer; lm_head in none (it is
 * not a decoder layer's: the engine ignores its layer). 0 for a layer
 * outside 0..n_layers-1 and for LS_PERTURB_NONE. */
int ls_perturb_op_in_layer(const ls_model_config *c, ls_perturb_op op, long layer);

typedef struct ls_engine_opts {
    int act_bf16;              /* 1 = bf16 activations (default), 0 = fp32 */
    long max_rows;             /* rows per forward call (packed tokens); default 256 */
    long state_digest_every;   /* >= 1; default 64 */
    int perturb_layer;         /* decoder layer, -1 = none */
    ls_perturb_op perturb_op;
    int perturb_fast;          /* 1: the perturbed op runs its fast twin (LS_ORDER_FAST_TWIN, a
                                  backend with fast_twins) instead of the reversed order */
    const unsigned char *dump_decoder_layers; /* [n_layers] 1 = dump this decoder layer's
                                          tensors (both trace layers) in the records; NULL = none */
    int gdn_chunked;           /* the GDN form (docs/numerics.md §5.1): 0 = recurrent (default);
                                  1 = chunk-aligned, chunks of LS_GDN_CHUNK positions at absolute
                                  multiples in the sequence, the state carried at their starts
                                  (with the current chunk's rows). Needs a backend with
                                  gdn_chunked (the cpu and cuda backends) */
    int fp8_w8a8;              /* FP8 matrices (docs/numerics.md §9): 0 = dequantised to fp32
                                  (default), 1 = w8a8 with per-token-group activation
                                  quantisation; no effect on a model without FP8 matrices */
    long kv_page;              /* KV cache layout (docs/architecture.md "The KV cache"):
                                  0 = a contiguous cache per slot (default); N > 0 = pages
                                  of N positions from a pool shared by every slot, taken as
                                  a sequence grows and returned when it leaves. The layout
                                  changes no bit (docs/numerics.md §4) */
    long kv_pool_pages;        /* kv_page > 0: pages in the pool; 0 = enough for every slot
                                  at full capacity (max_seqs x ceil(max_len / kv_page)). A
                                  step, fork or restore that needs a page of a full pool
                                  fails with LS_E_USAGE naming kv_pool_pages */
    ls_comm *ep_comm;          /* expert parallelism (docs/parallel.md §3.1), borrowed: NULL =
                                  every expert here (default). Else the engine is one rank of
                                  this communicator's EP group: it holds experts
                                  r*E/ep .. (r+1)*E/ep - 1 only (n_experts % ep == 0, and the
                                  backend must have moe_slots and moe_combine), computes the
                                  slot rows of the pairs its experts own and the shared-expert
                                  rows of tokens t with t % ep == r, and gathers every rank's
                                  rows to combine them in slot order: every record equals the
                                  engine's without it, bit for bit. Every rank runs the same
                                  steps; a step that fails on one rank aborts the communicator,
                                  so every rank's step fails naming it */
    ls_comm *tp_comm;          /* tensor parallelism (docs/parallel.md §3.3, the order-preserving
                                  form), borrowed: NULL = no TP (default). Else the engine is
                                  rank r of this communicator's TP group of tp ranks. The mixers
                                  are split by head: the rank holds its query heads' q_proj rows,
                                  its KV heads' k/v rows (a KV head shared by tp / Hkv ranks when
                                  num_key_value_heads < tp) and KV cache, its key-head groups'
                                  GDN projections, conv channels and states; each mixer's output
                                  is all-gathered before o_proj / out_proj. Those and the lm_head
                                  are held by output rows r*N/tp .. (r+1)*N/tp - 1, their outputs
                                  computed with today's dot products and all-gathered (exact
                                  bytes). Every rank records what one rank records (the KV and
                                  state digests over the full tensors, gathered).
                                  Without ep_comm the MoE runs expert-parallel over this group
                                  (as ep_comm would); with ep_comm the experts are split over
                                  that communicator instead (TP x EP: ep_comm spans the world).
                                  tp must divide num_attention_heads, linear_num_key_heads,
                                  linear_num_value_heads, hidden_size, vocab_size and
                                  num_experts, and num_key_value_heads or be a multiple of it */
    ls_comm *afd_comm;         /* attention-FFN disaggregation AnF (docs/parallel.md §3.2),
                                  borrowed: NULL = colocated (default). Else a communicator of
                                  A + F ranks: ranks 0..A-1 hold the embedding, the mixers, the
                                  norms and the lm_head and run everything but the MoE (A > 1:
                                  tensor-parallel, each attention rank given tp_comm over the A
                                  of them); ranks A..A+F-1 hold the routers and the experts and
                                  run the MoE of every layer (F > 1: expert-parallel, each FFN
                                  rank given ep_comm over the F of them). Per layer rank 0 sends
                                  the normed rows [T, D] to every FFN rank, FFN rank A returns
                                  the MoE output [T, D] with the router's ids and weights to
                                  rank 0, which passes them to the other attention ranks; at
                                  the end of a step rank 0 sends the logprob rows, their
                                  summary and the digests to the FFN ranks, so every rank's
                                  records and samples equal the colocated engine's, bit for
                                  bit. All ranks run the same steps */
    int afd_attention;         /* with afd_comm: A, the attention ranks (0 = 1) */
    int step_graphs;           /* 1 (default): a pipelined decode step of one sequence
                                  (ls_engine_step_begin, one token, no carried-state digest
                                  due) is recorded once as a device graph on a backend with
                                  graph ops, and replayed: the same kernels and arguments, so
                                  the same bits, for a fraction of the host's launch time
                                  (docs/architecture.md, "Step graphs"). 0 = never */
} ls_engine_opts;

void ls_engine_opts_default(ls_engine_opts *o);

typedef struct ls_engine ls_engine;

/* An engine for max_seqs sequences of at most max_len tokens each, running
 * on `be`. The engine takes the backend in every case (it is destroyed with
 * the engine, or at once when creation fails): the backend owns every buffer
 * the engine allocates, so one backend serves one engine. */
ls_status ls_engine_create(const ls_model *m, ls_backend *be, const ls_engine_opts *o,
                           long max_seqs, long max_len, ls_engine **out, ls_error *err);
void ls_engine_destroy(ls_engine *e);

/* The KV page size (0: contiguous) and, paged, the pool's pages and the
 * pages in use now (for reports and tests). */
long ls_engine_kv_page(const ls_engine *e);
long ls_engine_kv_pool_pages(const ls_engine *e);
long ls_engine_kv_pages_used(const ls_engine *e);

/* Bytes of the weight matrices (and FP8 scales) this engine wrapped: with
 * tp_comm or ep_comm, this rank's share (the norms and other vectors, a few
 * KB per layer, are not counted). */
size_t ls_engine_weight_bytes(const ls_engine *e);

/* The shape checks ls_engine_create makes for a rank of tp tensor-parallel
 * ranks (ep_elsewhere: the experts are split over another communicator),
 * without a communicator: a run can refuse a topology before it starts its
 * ranks. The same message as the engine's ("... of tp N"). */
ls_status ls_engine_check_tp(const ls_model *m, int tp, int ep_elsewhere, ls_error *err);

/* Sizes fixed at creation: rows per step, slots, positions per sequence. */
long ls_engine_max_rows(const ls_engine *e);
long ls_engine_max_seqs(const ls_engine *e);
long ls_engine_capacity(const ls_engine *e);
/* The backend's name ("cpu", "cuda-portable", "cuda-tensor-core", ...). */
const char *ls_engine_backend_name(const ls_engine *e);
/* The backend the engine owns (for what it pinned: backend_cuda.h tc pins). */
const ls_backend *ls_engine_backend(const ls_engine *e);
/* Vocabulary size: the length of a row of ls_engine_logprobs. */
long ls_engine_vocab(const ls_engine *e);
/* The columns of each lm_head call of a step the engine computes in column
 * chunks (a decode step on a backend with linear_by_column;
 * docs/architecture.md), but the last, which has the rest of `vocab`. */
long ls_engine_lm_head_chunk(long vocab);

/* The trace layer table for this model ([2 + 2L + 1] entries, static storage
 * owned by the engine). */
const ls_trace_layer *ls_engine_layers(const ls_engine *e, int *n);

/* Where the time of an attention-FFN disaggregated engine went, per decoder
 * layer, over all its steps so far (docs/parallel.md §3.2): the attention
 * rank's time busy in the layer (norms, mixer, residuals, digests, the
 * normed rows' way to the host) and waiting for the FFN ranks' answer (the
 * experts, the transfers and any gap); each FFN rank's time busy (router,
 * its experts, the exchange within the FFN group, the answer's way back)
 * and waiting for the attention rank's rows. Wall-clock seconds: the
 * backend's copies to the host are synchronous, so a layer's device work is
 * inside its span. */
typedef struct ls_afd_balance {
    long n_layers, steps, rows;       /* rows: all steps' rows */
    int n_ffn;                        /* F, the FFN ranks */
    double *attn_busy_s, *attn_wait_s; /* [n_layers] each: attention rank 0's */
    double *ffn_busy_s, *ffn_wait_s;   /* [n_ffn, n_layers] each: FFN rank A + f's at f * n_layers */
    double attn_head_s;                /* embedding, final norm, lm_head, logprobs: no FFN work */
} ls_afd_balance;

/* Collective over the engine's afd_comm: every rank calls it after the same
 * steps; the FFN ranks send their times, rank 0 fills *out (the other ranks:
 * *out zeroed). LS_E_USAGE on an engine without afd_comm. Free with
 * ls_afd_balance_free. */
ls_status ls_engine_afd_balance(ls_engine *e, ls_afd_balance *out, ls_error *err);
void ls_afd_balance_free(ls_afd_balance *b);


/* ---- step API (continuous batching) -------------------------------------------
 * A slot (0 .. max_seqs-1) holds one sequence's carried state (KV cache, GDN
 * and conv state). ls_engine_join starts a sequence in a slot (its state
 * zeroed); ls_engine_leave frees the slot. Between steps any slot may join or
 * leave. */
ls_status ls_engine_join(ls_engine *e, long slot, uint32_t seq_id, long prompt_len, ls_error *err);
void ls_engine_leave(ls_engine *e, long slot);
/* Tokens the slot's sequence has processed (its next position). */
long ls_engine_slot_len(const ls_engine *e, long slot);

/* ---- carried state: fork and snapshots ------------------------------------------
 * A sequence's carried state is all a later step reads of its slot: the GDN
 * recurrent and conv states of every gdn layer, the K and V rows 0..len-1
 * of every attention layer, its length (the next position) and its prompt
 * length (which places the prompt-boundary state digest). The state digest
 * cadence is a function of the position alone, so there is no other digest
 * state. Copies are 4-byte element copies through the backend's zero and
 * copy_blocks ops (no arithmetic), so a sequence continued from a copy
 * computes, bit for bit, what the original would have computed: GRPO
 * groups, prefix reuse and preemption (src/run/drive.h) rest on this.
 *
 * The destination slot's KV rows past len are zeroed, as ls_engine_join
 * leaves them. With a paged cache (kv_page > 0) the destination takes its
 * own pages from the pool and the K and V rows are copied into them (page
 * contents, never shared pages); a snapshot holds its rows contiguously,
 * outside the pool, so it takes no pages. */

/* Starts sequence seq_id in the free slot dst with a copy of the carried
 * state of the joined slot src (same length and prompt length). */
ls_status ls_engine_fork(ls_engine *e, long src, long dst, uint32_t seq_id, ls_error *err);

/* A snapshot: a copy of one slot's carried state at its current length,
 * held in buffers of the engine's backend. Owned by the caller; release it
 * with ls_engine_snapshot_free (its buffers go back to the engine, which
 * reuses them for later snapshots). Every snapshot is invalid after
 * ls_engine_destroy, which releases them all. */
typedef struct ls_engine_snapshot ls_engine_snapshot;

/* Takes a snapshot of the joined slot's state. */
ls_status ls_engine_snapshot_take(ls_engine *e, long slot, ls_engine_snapshot **out, ls_error *err);
/* Starts sequence seq_id in the free slot with the snapshot's state: its
 * length is the snapshot's, its prompt length prompt_len (> 0; may differ
 * from the snapshotted sequence's, e.g. a prompt that shares a prefix). A
 * snapshot of another engine, model or numerics (activation dtype, FP8
 * mode, perturbation) is refused with LS_E_USAGE naming the field, as is a
 * snapshot longer than the slot's capacity. Restored for another sequence
 * (another id or prompt length) it is a prefix of that prompt and must be
 * shorter than it (prefix_len < prompt_len: the last prompt token is
 * computed, its logprobs select the first generated token); restored for the
 * sequence it was taken from (a preempted sequence) any length is taken. */
ls_status ls_engine_snapshot_restore(ls_engine *e, const ls_engine_snapshot *s, long slot,
                                     uint32_t seq_id, long prompt_len, ls_error *err);
/* Positions the snapshot holds (the next position of a restored sequence). */
long ls_engine_snapshot_len(const ls_engine_snapshot *s);
/* The id of the sequence it was taken from. */
uint32_t ls_engine_snapshot_seq(const ls_engine_snapshot *s);
void ls_engine_snapshot_free(ls_engine *e, ls_engine_snapshot *s);

typedef struct ls_engine_item {
    long slot;                 /* a joined slot; at most one item per slot per step */
    const int32_t *tokens;     /* [n] the tokens at positions len .. len+n-1 of the slot */
    long n;                    /* >= 1: a prefill chunk, or 1 for a decode token */
    int last;                  /* 1: the item's last token is the sequence's last position
                                  (carried-state digests are recorded there) */
    int follows;               /* 1: tokens[n] is readable and is the token after the item's
                                  last (a prompt or teacher-forced token, not one to be
                                  sampled). Row j's next token is tokens[j + 1] for j < n - 1,
                                  and for j = n - 1 when follows: the step takes the logprobs
                                  of those next tokens on the device. 0 is always correct; a
                                  record whose next token the step did not know may cost a
                                  transfer of its own */
} ls_engine_item;

/* Runs one packed forward over the items (total tokens <= max_rows). Rows are
 * the items' tokens in item order. The logprob rows stay where the backend
 * computed them: the step brings back only what the records read (each row's
 * top-5 and the logprob of its known next token, backend op lp_summary).
 * After it returns, until the next step, ls_engine_sample selects a row's
 * next token, ls_engine_record builds the row's record with it, and
 * ls_engine_logprobs gives a whole row. */
ls_status ls_engine_step(ls_engine *e, const ls_engine_item *items, long n_items, ls_error *err);
/* The same step in two halves, so that a step's digests hash on host threads
 * while the device runs the next step (an asynchronous backend, backend.h
 * digest). ls_engine_step_begin runs the step and returns without waiting for
 * its digests: ls_engine_sample, ls_engine_logprobs and ls_engine_record work
 * at once, as after ls_engine_step, but the records' digests are filled in by
 * ls_engine_step_end, which waits for the digests of the older step begun and
 * not ended. At most two steps are begun and not ended; a step's records stay
 * valid until the step after next begins. The run layer's loop: begin step
 * N, build its records, end step N - 1 and hand its records on. ls_engine_step
 * is begin then end, and refuses to run while a begun step is not ended. An
 * engine that writes layer dumps does not pipeline (ls_engine_pipelines 0):
 * a record's dumps are valid until the next step begins, so end each step
 * before beginning the next. */
ls_status ls_engine_step_begin(ls_engine *e, const ls_engine_item *items, long n_items, ls_error *err);
ls_status ls_engine_step_end(ls_engine *e, ls_error *err);
int ls_engine_pipelines(const ls_engine *e);
/* Step graphs (ls_engine_opts.step_graphs) on or off from the next step,
 * dropping what was recorded (LS_E_USAGE while a begun step is not ended:
 * its digests may still be staged in a graph's memory); records: steps
 * recorded, launches: steps run as a graph, off: why a recording failed
 * (graphs are then off), or NULL. */
ls_status ls_engine_set_step_graphs(ls_engine *e, int on, ls_error *err);
void ls_engine_step_graph_stats(const ls_engine *e, long *records, long *launches, const char **off);
long ls_engine_step_rows(const ls_engine *e);
/* Selects row's next token (sample.h; ids scratch is the engine's). Greedy
 * reads the row's top-1 (the same token as the scan over the row); the other
 * samplers, and a row holding a NaN, read the whole rows (one transfer of
 * every row of the step, the first time a step needs it). */
ls_status ls_engine_sample(ls_engine *e, long row, const ls_sampling *s, uint32_t seq, uint32_t pos,
                           int32_t *token, ls_error *err);
/* *lp = row's logprobs [vocab], valid until the next step (engine-owned). */
ls_status ls_engine_logprobs(ls_engine *e, long row, const float **lp, ls_error *err);
/* Builds row's record (next = selected next token or -1) into *rec. The
 * records of one step are contiguous: row 0's record + r is row r's, so a
 * frame of rows [a, b) can go to a sink in one call once built. */
ls_status ls_engine_record(ls_engine *e, long row, int32_t next, const ls_trace_record **rec,
                           ls_error *err);

#endif
