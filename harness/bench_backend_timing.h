/* lockstep — a timing decorator over the CUDA backend (harness/bench_gpu only).
 *
 * ls_bench_timing_create wraps a backend in another ls_backend whose every op
 * forwards to it unchanged (same buffers, same results, the same optional
 * batched ops present or absent), so the engine runs its own forward on it.
 * While recording is on, each op of the step is bracketed by two CUDA events
 * on the default stream, the one the CUDA backend launches on; collecting
 * adds each op's span to its bucket and the span between one op's end and
 * the next op's start to the bucket of the time the device waited for the
 * host (the engine's own work between launches). Synchronous ops (uploads,
 * downloads, digests) are timed whole, host part included. The events add a
 * few microseconds of host time per op.
 *
 * The routing census (census on) downloads each router call's expert ids
 * after the call and keeps the number of distinct experts it routed to: the
 * experts a step must read, layer by layer. It synchronises; leave it off
 * while timing. */
#ifndef LS_HARNESS_BENCH_BACKEND_TIMING_H
#define LS_HARNESS_BENCH_BACKEND_TIMING_H

#include "backend/backend.h"
#include "core/status.h"

/* Operations the decorator times, one bucket kind each. */
typedef enum ls_bench_op {
    LS_BENCH_OP_IDLE,          /* not an op: the device idle between two ops */
    LS_BENCH_OP_UPLOAD, LS_BENCH_OP_DOWNLOAD, LS_BENCH_OP_ZERO, LS_BENCH_OP_COPY_BLOCKS,
    LS_BENCH_OP_EMBED, LS_BENCH_OP_LINEAR, LS_BENCH_OP_RMSNORM, LS_BENCH_OP_GATED_RMSNORM,
    LS_BENCH_OP_CONV_SILU, LS_BENCH_OP_GDN_GATES, LS_BENCH_OP_L2NORM_SCALE,
    LS_BENCH_OP_GDN_RECURRENT, LS_BENCH_OP_ROPE_APPLY, LS_BENCH_OP_ATTENTION,
    LS_BENCH_OP_SIGMOID_GATE, LS_BENCH_OP_ROUTER, LS_BENCH_OP_MOE,
    LS_BENCH_OP_LOGPROBS, LS_BENCH_OP_CONV_SILU_BATCH, LS_BENCH_OP_GDN_RECURRENT_BATCH,
    LS_BENCH_OP_KV_APPEND_BATCH, LS_BENCH_OP_ATTENTION_BATCH, LS_BENCH_OP_DIGEST,
    LS_BENCH_OP_DIGEST_WAIT, LS_BENCH_OP_LP_SUMMARY, LS_BENCH_OP_RESIDUAL_RMSNORM,
    LS_BENCH_OP_COUNT
} ls_bench_op;

/* The op's backend.h name ("linear", "moe", ...; "(device idle between ops)"). */
const char *ls_bench_op_name(ls_bench_op op);

/* A bucket: one op, and for linear and rmsnorm one shape of it. */
typedef struct ls_bench_bucket {
    ls_bench_op op;
    long rows, cols;           /* linear: the weight's [rows, cols]; rmsnorm: cols = n; else 0 */
    char name[64];             /* "linear [12288 x 2048]", "rmsnorm [n 256]", "moe", ... */
    double ms;                 /* summed over the collected steps */
    double host_ms;            /* the host's time inside the op's calls, summed likewise */
    long calls;
} ls_bench_bucket;

/* A decorator over `inner`, which it takes in every case: destroying *out
 * destroys inner, and inner is destroyed at once when creation fails. */
ls_status ls_bench_timing_create(ls_backend *inner, ls_backend **out, ls_error *err);

/* Recording on or off (off: ops forward with no event). */
void ls_bench_timing_record(ls_backend *tb, int on);

/* Waits for the events recorded since the last collect and adds their spans
 * to the buckets; spans never join across two collects (call it after every
 * step, so the wait between steps is not counted). */
ls_status ls_bench_timing_collect(ls_backend *tb, ls_error *err);

/* The buckets (owned by the decorator, valid until the next collect or clear). */
const ls_bench_bucket *ls_bench_timing_buckets(const ls_backend *tb, int *n);

/* Forgets the buckets. */
void ls_bench_timing_clear(ls_backend *tb);

/* Routing census on or off; turning it on forgets the previous counts. */
void ls_bench_timing_census(ls_backend *tb, int on);

/* Digests skipped (on) or computed: skipped, a digest op only zeroes its
 * jobs' outs and the wait returns at once, so a step's time with and
 * without its digests compare (the records then hold zero digests). */
void ls_bench_timing_no_digests(ls_backend *tb, int on);

/* Distinct experts of each router call since the census was turned on, in
 * call order (the engine calls the router once per layer per step). */
const int *ls_bench_timing_distinct(const ls_backend *tb, long *n);

#endif
