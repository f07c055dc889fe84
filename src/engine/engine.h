/* lockstep — the engine: rollout (prefill + decode) and replay (teacher-forced,
 * chunked) over the operator table, with packed batches of sequences.
 *
 * Both modes emit ls_trace_record values (src/trace/trace.h) through a sink,
 * one call per engine step (frame). Record at position p of a sequence: the
 * token at p, the selected next token (the following prompt token, the
 * sampled one, or in replay the teacher-forced one), its logprob, the top-5
 * and the digests of every trace layer after processing p.
 *
 * Trace layers: 0 embed; for decoder layer l: 1 + 2l its mixer (gdn or
 * attention), 2 + 2l its moe; 1 + 2L the final norm; 2 + 2L lm_head.
 * Digests (SHA-256 of canonical bytes: little-endian, row-major; activation
 * values as bf16 = 2 bytes in bf16 mode, fp32 = 4 bytes in fp32 mode):
 *   HIDDEN      every trace layer: the hidden row after it (embed, mixer
 *               residual, moe residual, final norm) or the logits row (lm_head)
 *   GDN_STATE   gdn layers: the fp32 state [H_v, d_k, d_v] after p
 *   CONV_STATE  gdn layers: the conv state [conv_dim, K] after p (activation dtype)
 *   KV          attention layers: K rows [H_kv, d] then V rows [H_kv, d] written at p
 *   ROUTER      moe layers: top-k ids (int32) then weights (fp32)
 * GDN_STATE and CONV_STATE are recorded at positions p with p % every == 0. */
#ifndef LS_ENGINE_ENGINE_H
#define LS_ENGINE_ENGINE_H

#include <stdint.h>

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

const char *ls_perturb_op_name(ls_perturb_op op);
/* Parses "layer=L,op=OP". */
ls_status ls_perturb_parse(const char *spec, int *layer, ls_perturb_op *op, ls_error *err);

typedef struct ls_engine_opts {
    int act_bf16;              /* 1 = bf16 activations (default), 0 = fp32 */
    int n_threads;             /* >= 1 */
    long max_rows;             /* rows per forward call (packed tokens); default 256 */
    long state_digest_every;   /* >= 1 */
    int perturb_layer;         /* decoder layer, -1 = none */
    ls_perturb_op perturb_op;
} ls_engine_opts;

void ls_engine_opts_default(ls_engine_opts *o);

/* A frame's records; the arrays are valid during the callback only. */
typedef ls_status (*ls_engine_sink)(void *ctx, ls_frame_kind kind, const ls_trace_record *recs,
                                    long n, ls_error *err);

typedef struct ls_engine ls_engine;

/* max_seqs sequences of at most max_len tokens each. */
ls_status ls_engine_create(const ls_model *m, const ls_engine_opts *o, long max_seqs,
                           long max_len, ls_engine **out, ls_error *err);
void ls_engine_destroy(ls_engine *e);

/* The trace layer table for this model ([2 + 2L + 1] entries, static storage
 * owned by the engine). */
const ls_trace_layer *ls_engine_layers(const ls_engine *e, int *n);

typedef struct ls_sequence {
    uint32_t id;               /* sequence id in the trace */
    const int32_t *tokens;     /* [n_tokens] prompt (rollout) or prompt + completion (replay) */
    long n_tokens;
} ls_sequence;

/* Rollout: prefill every prompt (packed), then decode max_new tokens one at a
 * time for all sequences together. completion[i] receives max_new tokens
 * (caller-owned [n_seqs][max_new], may be NULL). */
ls_status ls_engine_rollout(ls_engine *e, const ls_sequence *seqs, long n_seqs, long max_new,
                            const ls_sampling *sampling, int32_t *completion,
                            ls_engine_sink sink, void *ctx, ls_error *err);

/* Replay: teacher-forced recompute of every sequence's tokens 0..n-2 (the
 * last token is only a target), `chunk` tokens per sequence per step, all
 * sequences packed into each step. */
ls_status ls_engine_replay(ls_engine *e, const ls_sequence *seqs, long n_seqs, long chunk,
                           ls_engine_sink sink, void *ctx, ls_error *err);

#endif
