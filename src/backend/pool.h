/* lockstep — a small persistent thread pool for the CPU reference.
 *
 * ls_pool_run splits items [0, n) into contiguous ranges, one per thread
 * (the caller is thread 0), and waits for all of them. Work is split only
 * across independent outputs (rows, heads, tokens, expert slots), never
 * inside a reduction, so results do not depend on the thread count
 * (numerics contract rule 1).
 *
 * Workers start with an explicit stack of LS_THREAD_STACK_BYTES
 * (core/thread.h), not `ulimit -s`; a job's buffers live in per-worker heap
 * scratch (the CPU backend's), never in large stack arrays. */
#ifndef LS_BACKEND_POOL_H
#define LS_BACKEND_POOL_H

#include "core/status.h"

typedef struct ls_pool ls_pool;

/* fn(ctx, thread_index, begin, end) handles items [begin, end). */
typedef void (*ls_pool_fn)(void *ctx, int thread, long begin, long end);

/* n_threads >= 1; 1 means everything runs on the caller. */
ls_status ls_pool_create(int n_threads, ls_pool **out, ls_error *err);
int ls_pool_threads(const ls_pool *p);
void ls_pool_run(ls_pool *p, long n, ls_pool_fn fn, void *ctx);
void ls_pool_destroy(ls_pool *p);

#endif
