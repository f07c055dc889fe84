/* lockstep — reduction fingerprints: what a backend's arithmetic does on
 * fixed, ill-conditioned probe inputs.
 *
 * A provider row names its kernel and reduction order; names prove nothing
 * (a compiler that contracts a*b+c into an FMA, a library update under a
 * pinned algorithm id, other flags keep every name). The probe runs every
 * operator row a backend lists through that backend's operator table
 * (backend.h) on small inputs generated here, deterministically: alternating
 * magnitudes, cancellations, subnormals and values near rounding ties, with
 * reduction lengths that are not multiples of 32 and longer than 32 lanes,
 * several blocks, attention over several key blocks, top-k with tied and
 * nearly tied logits. On such inputs a change of summation order,
 * accumulation width, rounding point or FMA contraction changes output
 * bits. The SHA-256 of the downloaded outputs is the row's fingerprint
 * (manifest/README.md, numerics.operators.OP.reduction_fingerprint).
 *
 * Each operator with an activation mode runs in fp32 and in bf16 activation
 * mode; both outputs are hashed, fp32 first. Rows that one backend op
 * computes together share that op's fingerprint (router_softmax, topk and
 * renormalise: the router's probs, ids and weights). The MoE rows are
 * isolated from each other: the experts probe routes each token to one
 * expert at weight 1 (the combine adds one term), the shared-expert probe
 * gives the routed expert weight 0, and the combine probe's expert matrices
 * are one-hot (every dot product is exact in any order), so each row's
 * fingerprint moves with its own arithmetic only. Operators the engine runs
 * outside the backend (sampling) have no probe and no fingerprint.
 *
 * A perturbation (engine.h's ls_perturb_op, by name) runs the rows that
 * perturbation reverses in the engine with LS_ORDER_REVERSED, so a perturbed
 * pin's fingerprints differ from a strict pin's in exactly those rows. */
#ifndef LS_PROBE_PROBE_H
#define LS_PROBE_PROBE_H

#include <stddef.h>

#include "backend/backend.h"
#include "core/platform.h"
#include "core/status.h"

#define LS_PROBE_MAX_ROWS 32

typedef struct ls_probe_opts {
    const char *backend;             /* registry name whose rows are probed: "cpu" | "cuda" */
    const char *fp8;                 /* NULL: no FP8 rows; "dequant" | "w8a8": that mode's FP8
                                        rows too (ls_backend_list_fp8_providers) */
    const char *perturb_op;          /* NULL, or the engine perturbation op's name ("gdn",
                                        "conv", "attention", "router", "experts", "combine",
                                        "norm", "lm_head"): the rows it reverses run reversed */
    int gdn_chunked;                 /* 1: also the row "gdn_chunked", the chunk-aligned GDN
                                        form (docs/numerics.md §5.1), after the registry's */
} ls_probe_opts;

typedef struct ls_probe_table {
    size_t count;                    /* rows filled */
    ls_op_fingerprint rows[LS_PROBE_MAX_ROWS]; /* [count] in provider-row order */
    double seconds;                  /* wall time of the probe */
} ls_probe_table;

/* Probes every row of o->backend's registry (plus the FP8 rows of o->fp8)
 * that has a probe on `be` and fills *out. The probe's buffers stay
 * allocated on `be` until it is destroyed and the weights they wrap are
 * released when this returns: give it a backend of its own (or one whose
 * probe buffers are never used again). Fails with the backend's error
 * (e.g. LS_E_UNSUPPORTED for a reversed order CUDA does not run), LS_E_USAGE
 * for an unknown backend, FP8 mode or perturbation name. */
ls_status ls_probe_run(ls_backend *be, const ls_probe_opts *o, ls_probe_table *out,
                       ls_error *err);

/* 1 when the engine perturbation `perturb_op` (name as above) reverses the
 * reduction of operator row `op`; 0 otherwise (also for NULL). */
int ls_probe_perturbs(const char *perturb_op, const char *op);

/* The row of `op` in t, or NULL. */
const ls_op_fingerprint *ls_probe_find(const ls_probe_table *t, const char *op);

#endif
