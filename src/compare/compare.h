/* lockstep — the comparator: aligns two traces by (sequence, position) and
 * finds the first drift.
 *
 * Trace A drives the walk in its own record order (execution order); trace B
 * is reached through an index (trace/trace.h, ls_trace_index), so the two may
 * be framed differently (rollout prefill + decode steps vs replay chunks).
 * Memory: B's segment table, a few decompressed frames of each trace, and
 * O(sequences x heat-map columns) for the report; never the record bytes.
 *
 * At each position the checks run in causal order: the input token, then
 * every layer of the layer table in order (within a layer, in causal order:
 * conv_state, gdn_state, kv, router, hidden), then the selected next token,
 * its logprob bits and
 * the top-k (set, order, logprob bits). The first failing check of a sequence
 * is its first drift. The verdict is bitwise; |Δ logprob| and KL over the
 * top-k are diagnostics only.
 *
 * An imported trace holds the positions the engine scored, from some first
 * position of each sequence on; compared with any other trace (a rollout, a
 * replay, another import), the other trace's positions before it are not
 * compared (counted in positions_outside_import and named in the note).
 * Every other position held by one trace only is a drift, and so is a
 * sequence the import lacks. */
#ifndef LS_COMPARE_COMPARE_H
#define LS_COMPARE_COMPARE_H

#include <stdint.h>

#include "core/status.h"
#include "trace/trace.h"

typedef struct ls_compare_opts {
    int allow_different_model;   /* compare traces whose model fingerprints differ */
    int allow_incomplete;        /* compare a trace that has no trailer (killed run) */
    int heatmap_max_cols;        /* columns per sequence in the heat map; 0 = 256 */
} ls_compare_opts;

typedef enum ls_drift_what {
    LS_DRIFT_NONE = 0,
    LS_DRIFT_TOKEN,              /* input token at pos differs */
    LS_DRIFT_DIGEST,             /* a (layer, kind) digest differs */
    LS_DRIFT_NEXT_TOKEN,         /* selected next token differs */
    LS_DRIFT_LOGPROB,            /* selected-token logprob bits differ */
    LS_DRIFT_TOPK_SET,           /* top-k id sets differ */
    LS_DRIFT_TOPK_ORDER,         /* same set, different order */
    LS_DRIFT_TOPK_LOGPROB,       /* same ids and order, logprob bits differ */
    LS_DRIFT_MISSING             /* position present in one trace only */
} ls_drift_what;
const char *ls_drift_what_name(ls_drift_what w);

/* Element-level difference of a dumped tensor (when both traces carry it). */
typedef struct ls_tensor_diff {
    int present;                 /* 1 when both traces dumped this (pos, layer, kind) */
    uint8_t dtype;               /* ls_dump_dtype */
    uint32_t n_elems;
    int64_t first_index;         /* first differing element, -1 if none */
    uint32_t a_bits, b_bits;     /* raw bits of that element (bf16 in the low 16 bits) */
    double a_value, b_value;     /* decoded values (ids for router ids) */
    uint64_t ulp;                /* ULP distance between the two values (same dtype ordering) */
    double max_abs, mean_abs;    /* over the whole tensor (router: over the weights) */
    uint32_t n_differ;           /* elements whose bits differ */
    /* router dumps: top-k ids of both sides */
    int router_k;
    int32_t router_a[LS_TRACE_TOPK_MAX], router_b[LS_TRACE_TOPK_MAX];
    int router_set_differs, router_order_differs;
} ls_tensor_diff;

typedef struct ls_compare_drift {
    ls_drift_what what;
    uint32_t seq, pos;
    int layer;                   /* layer index, -1 when not a layer digest */
    ls_layer_family family;      /* of layer */
    int decoder_layer;           /* of layer (-1 for embed/norm/lm_head) */
    ls_digest_kind kind;         /* LS_DRIFT_DIGEST */
    int64_t a_value, b_value;    /* tokens, logprob bits, or the differing top-k slot's ids
                                    (-1: unused slot); missing: 1 on the side holding the position */
    int topk_slot;               /* first differing top-k slot, -1 otherwise */
    int topk_a_missing, topk_b_missing; /* LS_DRIFT_TOPK_SET: that slot's id of A (of B) is
                                          not in the other list (a_value/b_value -1: unused slot) */
    ls_digest a_digest, b_digest;
    ls_tensor_diff tensor;
    char message[512];           /* one line: what differs, where */
} ls_compare_drift;

/* ---- drift statistics (ls_compare_diag.stats) ---------------------------------
 * How far apart two traces are where their bits differ: diagnostics beside
 * the bitwise verdict, which they never change. */

/* A distribution of non-negative values over positions (nearest-rank
 * percentiles; every field 0 when n == 0). */
typedef struct ls_compare_dist {
    uint64_t n;
    double mean, p50, p99, max;
} ls_compare_dist;

/* Statistics of the positions of one sequence, or of all of them. */
typedef struct ls_compare_stats {
    uint64_t steps;                  /* positions where both traces selected a next token */
    uint64_t tokens_agree;           /* ... the same one */
    ls_compare_dist dlogprob;        /* |Δ selected-token logprob| over the positions where both
                                        selected the same token (finite values) */
    double dprob_mean, dprob_max;    /* |Δ exp(logprob)| over the same positions */
    /* The completion only (positions >= prompt_len - 1, where each record
     * predicts a generated token; all positions when no prompt length is
     * known): the figures RL frameworks log for old_log_probs against
     * rollout_log_probs. */
    uint64_t completion_n;
    double completion_mean_abs_dlogprob;   /* mean |old_log_probs - rollout_log_probs| */
    double completion_mean_abs_dprob, completion_max_abs_dprob, completion_std_dprob;
    uint64_t topk_positions;         /* positions where either top-k list has a used slot */
    double topk_overlap_mean, topk_overlap_min; /* |A ∩ B| / max(|A|, |B|) over the used ids */
    ls_compare_dist kl_topk;         /* KL(A||B) over the shared top-k ids, renormalised */
} ls_compare_stats;

/* Element-level error of one (layer, kind) where both traces dumped it
 * (--dump-layers), over every position where they did. */
typedef struct ls_compare_dump_stats {
    uint64_t positions;
    double max_abs;                  /* max |a - b| over every element (router: the weights) */
    double rel_err;                  /* ||a - b||_2 / ||a||_2 over all those elements */
    double cos_mean, cos_min;        /* cosine similarity of a and b, per position */
    double sum_d2, sum_a2, cos_sum;  /* accumulators of the above */
} ls_compare_dump_stats;

typedef struct ls_compare_layer_stats {
    uint64_t digests_compared, digests_differ;   /* every kind of the layer */
    ls_compare_dump_stats dumps[LS_DIGEST_COUNT];
} ls_compare_layer_stats;

/* Heat-map cell states. */
enum { LS_CELL_NONE = 0, LS_CELL_EQUAL = 1, LS_CELL_DIFFERS = 2, LS_CELL_FIRST = 3 };

typedef struct ls_compare_seq {
    uint32_t seq;
    uint64_t positions_compared;     /* present in both */
    uint64_t positions_only_a, positions_only_b;
    uint64_t steps;                  /* positions with a selected next token in both */
    uint64_t tokens_equal;           /* positions whose input and next token are equal */
    uint64_t topk_set_equal;         /* positions whose top-k sets are equal */
    uint64_t digests_compared, digests_differ;
    uint64_t router_differ;          /* MoE router digests that differ */
    double max_abs_dlogprob;         /* over selected (same token) and top-k (same id) logprobs */
    double max_kl_topk;              /* KL(A||B) over the shared top-k, renormalised */
    int pass;
    ls_compare_drift first;          /* what == NONE when pass */
    int64_t first_token_divergence;  /* first pos whose next token differs, -1 if none */
    /* heat map: rows = layers + 3 (token, next/logprob, top-k); cols cover positions
     * [0, pos_end) in buckets of pos_per_col; cell = max state in the bucket */
    uint32_t pos_end, pos_per_col, cols;
    uint8_t *cells;                  /* [(n_layers + 3) * cols], owned by the result */
    float *dlogprob;                 /* [cols] max |Δ logprob| per bucket, owned */
    uint32_t prompt_len;             /* from run_params.batch of A or B, 0 when unknown */
    ls_compare_stats stats;          /* filled with ls_compare_diag.stats */
} ls_compare_seq;

typedef struct ls_compare_side {
    char path[1024];
    char mode[16], engine[64];
    char model_fingerprint[65], manifest_digest[65];
    int complete;
    uint64_t records, frames;
    uint32_t kinds_mask;
    int topk;
    char activation_dtype[8];        /* "bf16" or "fp32" */
} ls_compare_side;

/* A run parameter that makes a trace perturbed or of another backend
 * ("perturbation", "backend"), when the traces' values differ. */
#define LS_COMPARE_PARAM_KEYS 2
typedef struct ls_compare_param_diff {
    char key[32];
    char a[128], b[128];             /* a string's value, other values as compact JSON,
                                        "none" when absent or null */
} ls_compare_param_diff;

typedef struct ls_compare_result {
    ls_compare_side a, b;
    int equal;                       /* 1: no drift and the same positions */
    int model_differs;               /* fingerprints differ (only with allow_different_model) */
    uint32_t kinds_compared;         /* digest kinds present in both headers */
    int topk_compared;               /* min(topk A, topk B) */
    int n_layers;
    ls_trace_layer *layers;          /* [n_layers], owned */
    uint64_t *router_differ_per_layer;   /* [n_layers], owned */
    size_t n_seqs;
    ls_compare_seq *seqs;            /* [n_seqs], ascending seq, owned */
    int first_seq;                   /* index in seqs of the first drift in A's order, -1 */
    uint64_t bytes_compared;         /* uncompressed record bytes of A read */
    uint64_t elapsed_ns;
    int activation_differs;          /* activation dtypes differ: hidden/conv/kv digests cannot match */
    int manifest_differs;            /* manifest digests differ (informational) */
    int n_param_diffs;
    ls_compare_param_diff param_diffs[LS_COMPARE_PARAM_KEYS];
    int has_stats;                   /* stats, layer_stats and every seq's stats are filled */
    ls_compare_stats stats;          /* over every position of every sequence */
    ls_compare_layer_stats *layer_stats; /* [n_layers], owned; NULL without stats */
    /* Where a trace is an import (mode "import"; one or both): the positions
     * of the other trace before the imported sequence's first position (its
     * prompt, when the engine returned no prompt logprobs). They are counted
     * in positions_only_a/b but are not drifts. */
    uint64_t positions_outside_import;
    char note[1024];                 /* what was not compared and why, and header facts that
                                        differ, "; "-separated, e.g. "trace B has no digests: ..." */
} ls_compare_result;

/* Compares two trace files. Returns LS_OK when the comparison ran (the verdict
 * is result->equal); an error when it could not compare (bad or truncated
 * trace, different models without allow_different_model, different layer
 * tables, incomplete trace without allow_incomplete). opts may be NULL.
 * Free the result with ls_compare_result_free in every case. */
ls_status ls_compare_files(const char *path_a, const char *path_b, const ls_compare_opts *opts,
                           ls_compare_result *result, ls_error *err);

/* Diagnostics beyond the verdict, kept apart from ls_compare_opts so that
 * callers initialising that struct positionally still compile warning-free
 * (as fingerprint.h keeps its cache options apart). */
typedef struct ls_compare_diag {
    int stats;                   /* 1: fill the drift statistics (has_stats); keeps 8 bytes per
                                    compared position until the end, and decodes every dump */
    int logprobs_only;           /* 1: token ids and selected-token logprob bits only (engines
                                    that return no top-k); digests and top-k not compared */
} ls_compare_diag;

/* ls_compare_files with diagnostics; diag may be NULL (none). */
ls_status ls_compare_files_diag(const char *path_a, const char *path_b, const ls_compare_opts *opts,
                                const ls_compare_diag *diag, ls_compare_result *result, ls_error *err);
void ls_compare_result_free(ls_compare_result *result);

/* Decodes element i of a dump as a double (bf16/fp32; router: ids then weights). */
double ls_compare_dump_value(const ls_trace_dump *d, uint32_t i, uint32_t *bits);

#endif
