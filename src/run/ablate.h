/* lockstep — ablation: which operator families drift when their reduction
 * order changes, where the drift shows first, and how far it goes.
 *
 * ls_ablate_run runs the strict run once (rollout, or a rollout and then
 * its strict replay), runs it again as a control (it must be bitwise equal:
 * otherwise nothing below means anything), then for each operator family
 * and each chosen decoder layer where the family exists the same run with
 * that one family's order changed in that one layer, and compares each
 * with the strict run (compare/compare.h): the first drift (sequence,
 * position, trace layer, what differed), |Δ selected-token logprob| over the
 * positions whose context is still the same, and where greedy decoding
 * would first pick another token.
 *
 * The changed order is the perturbation switch (engine.h ls_perturb_op,
 * docs/numerics.md §7). On the cpu backend: a planted reversed order with
 * bf16 rounding after every addition. On the cuda backend: the family's
 * fast twin where it has one (run.h ls_run_fast_twin: attention split-KV,
 * gdn chunked from the call's start, combine by atomics on the tc tier),
 * what a serving engine runs in its place (docs/ablate.md). A family the
 * backend refuses (LS_E_UNSUPPORTED: on cuda, one without a fast twin) is
 * "not ablatable on this backend" in the result, not a failure.
 *
 * Cost: 2 + (cells) runs of the model (replay: 3 + cells, the first being
 * the rollout the replays recompute). The default layer choice, "sample",
 * bounds the cells to at most three per family (see ls_ablate_layers). */
#ifndef LS_RUN_ABLATE_H
#define LS_RUN_ABLATE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "compare/compare.h"
#include "core/status.h"
#include "engine/engine.h"
#include "model/model.h"
#include "run/load.h"
#include "run/run.h"

/* What changes in each ablated run, for reports: on the cpu backend the
 * planted order change (it has no fast providers), on cuda the fast twins. */
#define LS_ABLATE_SUBSTITUTE_PLANTED "planted reversed reduction order (the cpu backend has no fast twins)"
#define LS_ABLATE_SUBSTITUTE_TWIN                                                                         \
    "the family's fast twin (attention: split-KV; gdn: chunks counted from each call's start; combine: " \
    "atomic adds, tc tier); families without one are not ablatable"

typedef struct ls_ablate_opts {
    const char *checkpoint;        /* directory (--checkpoint) */
    const char *prompts;           /* the prompts file, for the record (--prompts) */
    const char *mode;              /* "rollout" (NULL: the default) or "replay" (--mode) */
    long max_new;                  /* tokens generated per prompt, >= 1 (--max-new-tokens) */
    const char *backend;           /* "cpu" | "cuda" (--backend) */
    int gpu;                       /* cuda: the device (--gpu); cpu: 0 */
    ls_tier tier;                  /* cuda: the strict run's tier, portable or tc (--tier) */
    int threads;                   /* CPU worker threads, >= 1 (--threads) */
    const char *layers;            /* "sample" (NULL: the default), "all" or "L,L,..." (--layers) */
    const char *fp8;               /* FP8 checkpoints: "dequant" (NULL) or "w8a8" (--fp8) */
    ls_run_hash_cache hash_cache;  /* --checkpoint-cache */
    const char *workdir;           /* keep every trace there (--workdir); NULL: a temporary
                                      directory, removed, each ablated trace removed once compared */
    const char *command;           /* the command line, for the reports (NULL: none) */
    int progress;                  /* one line per run on stderr, and the runs' own progress */
} ls_ablate_opts;

typedef enum ls_ablate_outcome {
    LS_ABLATE_NO_DRIFT = 0,        /* bitwise equal to the strict run */
    LS_ABLATE_DRIFT,               /* differs from the strict run */
    LS_ABLATE_UNSUPPORTED          /* the backend refused the changed order: not ablatable there */
} ls_ablate_outcome;

/* What replaces a family's strict order on o's backend (the substitutes above),
 * and whether that is a fast twin. */
const char *ls_ablate_substitute(const ls_ablate_opts *o, int *fast_twin);

/* "no_drift", "drift", "unsupported". */
const char *ls_ablate_outcome_name(ls_ablate_outcome o);

/* One ablated run (or the control) against the strict run. */
typedef struct ls_ablate_cell {
    ls_perturb_op op;              /* LS_PERTURB_NONE: the control */
    int layer;                     /* decoder layer changed; -1: lm_head or the control */
    int planted_tl;                /* trace layer whose output the change reaches first (its
                                      operator's mixer or MoE layer, the lm_head layer); -1:
                                      the control */
    ls_ablate_outcome outcome;
    char note[1024];               /* unsupported: the backend's message; "" otherwise */
    double seconds;                /* engine wall time of the run */
    /* LS_ABLATE_DRIFT: the comparator's first drift, in the strict trace's record order */
    ls_compare_drift first;
    /* The positions of both traces whose context (every earlier token) is
     * the same: all of them in a replay; in a rollout, up to each sequence's
     * first position where the next token differs. */
    uint64_t positions;
    uint64_t positions_differ;     /* of those, with any digest, token or logprob bit different */
    ls_compare_dist dlogprob;      /* |Δ selected-token logprob| over those where both select the
                                      same token (zeros included) */
    /* Greedy divergence: the first completion position (pos >= prompt_len - 1)
     * of the same context where the top-1 token differs; in a greedy
     * rollout, where the generated tokens part. */
    long seqs;                     /* sequences compared */
    long seqs_diverged;
    int64_t diverge_seq;           /* the sequence that diverged after the fewest tokens; -1: none */
    int64_t diverge_pos;           /* its position */
    int64_t tokens_until_divergence; /* completion tokens equal before it (pos - (prompt_len - 1)) */
} ls_ablate_cell;

typedef struct ls_ablate_result {
    char merkle_root[65];          /* the checkpoint's */
    char manifest_digest[65];      /* the strict run's */
    char mode[16];                 /* "rollout" | "replay" */
    long n_layers;                 /* decoder layers of the model */
    long n_seqs;
    uint64_t strict_positions;
    double strict_seconds;
    ls_ablate_cell control;        /* strict vs strict */
    size_t n_cells;
    ls_ablate_cell *cells;         /* [n_cells] family by family (ls_ablate_families order), then
                                      layer ascending; owned */
} ls_ablate_result;

/* The operator families in causal order within a layer (norm, conv, gdn,
 * attention, router, experts, combine), then lm_head: every ls_perturb_op
 * but LS_PERTURB_NONE, once. *n receives the count. */
const ls_perturb_op *ls_ablate_families(int *n);

/* The decoder layers ablated for op: "sample" (NULL) the first, middle
 * (index (n-1)/2) and last of the n layers where op exists; "all" every
 * one; "L,L,..." those listed where op exists (a listed layer outside the
 * model is LS_E_USAGE naming it; a list with no layer of op's gives none).
 * lm_head, in no decoder layer, always gives the one entry -1. Writes up to
 * c->n_layers entries to out and their count to *n. */
ls_status ls_ablate_layers(const ls_model_config *c, ls_perturb_op op, const char *layers, int *out, int *n,
                           ls_error *err);

/* Checks the syntax of a layer choice ("sample", "all", or decimal layers
 * separated by commas, none repeated) without a model: LS_E_USAGE naming
 * layers (--layers). */
ls_status ls_ablate_layers_check(const char *layers, ls_error *err);

/* Runs the ablation on batch (the prompts; ids become sequence ids) and
 * fills *r (free it with ls_ablate_result_free, also on failure). Returns an
 * error when a run cannot be done (bad input, I/O, the strict run refused);
 * a family the backend refuses is an outcome, not an error. */
ls_status ls_ablate_run(const ls_ablate_opts *o, const ls_run_batch *batch, ls_ablate_result *r,
                        ls_error *err);
void ls_ablate_result_free(ls_ablate_result *r);

/* The reports (docs/ablate.md): JSON (schema docs/ablate-json.schema.json)
 * and Markdown, each written atomically ("-": stdout); the text table
 * printed by the command. */
ls_status ls_ablate_write_json(const char *path, const ls_ablate_opts *o, const ls_ablate_result *r,
                               ls_error *err);
ls_status ls_ablate_write_markdown(const char *path, const ls_ablate_opts *o, const ls_ablate_result *r,
                                   ls_error *err);
void ls_ablate_print(FILE *out, const ls_ablate_opts *o, const ls_ablate_result *r);

#endif
