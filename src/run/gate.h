/* lockstep CLI — the gate shared by `gate` and `demo`: one rollout, then
 * replays (chunkings, batch order, optionally a perturbation), each compared
 * bitwise with the rollout, printed as an AFD-gate style table. */
#ifndef LS_CLI_GATE_H
#define LS_CLI_GATE_H

#include <stdint.h>
#include <stdio.h>

#include "report/report.h"
#include "run/run.h"
#include "trace/trace.h"

typedef struct ls_gate_variant {
    const char *name;              /* row label, e.g. "chunk 3" */
    long chunk;                    /* 0 = whole sequence */
    int reverse;                   /* pack the batch in reverse order */
    const char *perturb;           /* NULL = strict */
} ls_gate_variant;

typedef struct ls_gate_opts {
    const char *checkpoint;
    const char *prompts;           /* for the record (JSON) */
    long max_new;
    const char *backend;
    int gpu;                       /* cuda: the CUDA device of every run (0 .. count-1); cpu: 0 */
    int threads;
    const char *junit, *json;      /* combined reports, or NULL */
    const char *workdir;           /* NULL = temporary, removed */
    const ls_gate_variant *variants; /* NULL = the standard five (chunk 1, 3, 64, whole, reordered) */
    int n_variants;
    ls_run_hash_cache hash_cache;  /* how the checkpoint is hashed (once, for every run) */
    const char *fp8;               /* FP8 checkpoints: "dequant" (NULL: default) or "w8a8"; the
                                      replays take the rollout's */
    /* The rollout as served (run.h fields of the same names; the replays
     * recompute its sequences plainly): 0 / NULL = 1 sample, off, none. */
    long samples_per_prompt;
    const char *prefix_cache;
    long prefix_block;
    const char *preempt;
    long kv_page;                  /* the rollout's KV page size (run.h kv_page; 0 contiguous) */
    int gdn_chunked;               /* the GDN form of every run (run.h gdn_chunked): the replays
                                      recompute in the rollout's form */
    int ep, tp;                    /* the rollout's expert- and tensor-parallel ranks (run.h ep,
                                      tp; 0 or 1: one); the replays run on one rank */
    int afd_attention, afd_ffn;    /* the rollout's attention-FFN disaggregation (run.h; 0:0
                                      colocated); the replays run colocated */
    int seeded;                    /* 1: the rollout samples seeded with `seed` (temperature 1, no
                                      truncation); 0: greedy */
    uint64_t seed;
} ls_gate_opts;


/* Runs the gate on batch (prompts) and prints the table to out (NULL: quiet). */
ls_status ls_gate_run(const ls_gate_opts *o, const ls_run_batch *batch, FILE *out, ls_gate_result *r,
                      ls_error *err);

#endif
