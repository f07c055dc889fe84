/* Backend conformance through the operator table (in the spirit of ggml's
 * test-backend-ops): a shared test library, linked into tests/
 * test_backend_ops.c (CPU backends) and tests/gpu/test_conformance.c (CUDA).
 *
 * Every operator of ls_backend (src/backend/backend.h) has a table of shapes
 * (the Qwen3-Next-80B dimensions and awkward ones), each run with bf16 and
 * fp32 activations where the op takes act_bf16, and with every reduction
 * order the op takes. A case generates its inputs on the host from a seed
 * fixed by (op, shape, act, order) — so the CPU and GPU suites feed a shape
 * the same numbers — computes the reference with the ls_cpu_* functions of
 * src/backend/cpu_ops.h directly on host arrays, and then, for each backend
 * under test, creates a fresh backend, wraps the weights, allocates and
 * uploads every tensor, runs the op through the table's function pointers,
 * downloads every tensor (inputs too: an op must not write its inputs) and
 * compares bit for bit. The first mismatch is printed as
 *   MISMATCH <backend>: <case>: <tensor> element <i> of <n>: ref 0x.. got 0x..
 * and every passing case as "  ok <case> [<backends>]".
 *
 * Ops whose reference is not a cpu_ops.h function compare against a host
 * model: copy_blocks and kv_append_batch (plain copies), the memory round
 * trip (alloc zero-fills, upload, zero, download) and digest (SHA-256 of the
 * canonical bytes of backend.h, hashed by OpenSSL). A batched mixer that a
 * backend leaves NULL is run the way the engine then runs it (the
 * per-sequence op once per sequence), so its case still checks that
 * backend's per-sequence path against the per-sequence reference.
 *
 * LS_ORDER_REVERSED: a target with reversed = 1 is compared like the
 * canonical order; one with reversed = 0 must answer exactly
 * LS_E_UNSUPPORTED (fail closed), and nothing is compared. */
#ifndef LS_TESTS_BACKEND_OPS_H
#define LS_TESTS_BACKEND_OPS_H

#include "backend/backend.h"

/* One backend under test. */
typedef struct ls_bo_target {
    const char *label;         /* printed in every line, e.g. "cpu x4" */
    /* Creates a fresh backend; called once per case (the backend's arena
     * holds that case's buffers and is freed with it). */
    ls_status (*create)(void *arg, ls_backend **out, ls_error *err);
    void *arg;                 /* passed to create */
    int reversed;              /* 1: implements LS_ORDER_REVERSED (compared);
                                  0: must return LS_E_UNSUPPORTED for it */
    double tol;                /* 0: fp32 outputs equal the reference bit for bit; > 0 (a
                                  non-strict tier): every |got - ref| <= tol max |ref| of
                                  its tensor (512 tol with bf16 activations) */
} ls_bo_target;

/* Which shapes run. */
typedef struct ls_bo_config {
    int quick;                 /* 1: the reduced set (the CPU suite, compute-sanitizer):
                                  drops the shapes marked BO_FULL in backend_ops.c
                                  (lm_head [151936, 2048], [12288, 2048], [2048, 4096],
                                  [2048, 2048] at T 63 and 300, the vocabulary-sized
                                  embedding, the 4200-slot cache, the 2048 x 512 and
                                  E = 512 MoEs, T = 63 / 65 on the 2048-wide GDN,
                                  router and MoE) for BO_QUICK stand-ins of T 2..9 or
                                  narrower experts */
    int small_only;            /* 1: with quick, the BO_ALL shapes alone (the CPU suite
                                  under AddressSanitizer, several times slower: every
                                  operator and path still runs, at small sizes) */
} ls_bo_config;

/* The operators of the table, in a fixed order. */
int ls_bo_op_count(void);
const char *ls_bo_op_name(int op);

/* Runs every case of operator `op` on every target; prints one line per case
 * (and one per failure). Returns the number of failed (case, target) pairs. */
long ls_bo_run_op(int op, const ls_bo_target *targets, int n_targets, const ls_bo_config *cfg);

#endif
