/* Helpers shared by the GPU test executables (header-only: each test is one
 * source file plus tests/testutil.c).
 *
 * GPU tests run their Check cases without fork (a CUDA context does not
 * survive fork, and compute-sanitizer follows one process best), and exit 77
 * with a visible SKIP line when the build has no CUDA or the machine no GPU. */
#ifndef LS_TESTS_GPU_TESTUTIL_H
#define LS_TESTS_GPU_TESTUTIL_H

#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_cuda.h"
#include "engine/engine.h"
#include "numerics/reduce.h"
#include "run/run.h"
#include "testutil.h"

#ifdef LOCKSTEP_HAVE_CUDA
#include "ls_cuda.h"
#endif

#define LS_GPU_SKIP 77

/* Returns 1 when a GPU can run the tests; prints SKIP otherwise. */
static inline int ls_gpu_available(void)
{
#ifdef LOCKSTEP_HAVE_CUDA
    if (ls_cuda_device_count() > 0) return 1;
    printf("SKIP: no CUDA device\n");
#else
    printf("SKIP: no CUDA device (built without CUDA)\n");
#endif
    fflush(stdout);
    return 0;
}

/* Runs a suite without fork; returns the process exit code. */
static inline int ls_gpu_run_suite(Suite *s)
{
    return ls_test_run_suite(s, 1) ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* Compares two fp32 arrays bit for bit; on the first difference prints the
 * index and both values (hex bits and decimal) and returns 0. */
static inline int ls_gpu_same_f32(const char *what, const float *want, const float *got, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t a = ls_f32_bits(want[i]), b = ls_f32_bits(got[i]);
        if (a != b) {
            printf("MISMATCH %s: element %zu of %zu: want 0x%08" PRIx32 " (%.9g) got 0x%08" PRIx32
                   " (%.9g)\n", what, i, n, a, (double)want[i], b, (double)got[i]);
            fflush(stdout);
            return 0;
        }
    }
    return 1;
}

/* Same for bf16 arrays. */
static inline int ls_gpu_same_u16(const char *what, const uint16_t *want, const uint16_t *got, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (want[i] != got[i]) {
            printf("MISMATCH %s: element %zu of %zu: cpu 0x%04x (%.9g) gpu 0x%04x (%.9g)\n", what, i,
                   n, want[i], (double)ls_bf16_to_f32(want[i]), got[i],
                   (double)ls_bf16_to_f32(got[i]));
            fflush(stdout);
            return 0;
        }
    }
    return 1;
}

/* Same for int32 arrays. */
static inline int ls_gpu_same_i32(const char *what, const int32_t *want, const int32_t *got, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (want[i] != got[i]) {
            printf("MISMATCH %s: element %zu of %zu: cpu %" PRId32 " (0x%08" PRIx32 ") gpu %" PRId32
                   " (0x%08" PRIx32 ")\n", what, i, n, want[i], (uint32_t)want[i], got[i],
                   (uint32_t)got[i]);
            fflush(stdout);
            return 0;
        }
    }
    return 1;
}

/* Device memory of an engine a GPU test opens: the test models need a few
 * MiB. The default arena (90 % of the free memory, taken and zeroed in
 * parts on every open) made the engine test under compute-sanitizer's
 * initcheck run for minutes where memcheck took 18 s. */
#define LS_GPU_TEST_ARENA_BYTES ((size_t)2 << 30)

/* An engine on `backend` ("cpu": one thread; "cuda": device 0 with the arena
 * above) for the model's test runs. */
static inline ls_status ls_gpu_engine_open(const ls_model *m, const char *backend,
                                           const ls_engine_opts *o, long max_seqs, long max_len,
                                           ls_engine **out, ls_error *err)
{
    *out = NULL;
    if (strcmp(backend, "cuda")) return ls_run_engine_open(m, backend, 1, o, max_seqs, max_len, out, err);
    ls_backend_cuda_opts co;
    ls_backend_cuda_opts_default(&co);
    co.arena_bytes = LS_GPU_TEST_ARENA_BYTES;
    ls_backend *be;
    ls_status st = ls_backend_cuda_create_opts(&co, &be, err);
    if (st != LS_OK) return st;
    return ls_engine_create(m, be, o, max_seqs, max_len, out, err);
}

/* The logprobs of one sequence's prefill of 9 tokens then one decode step
 * ([10, V], malloc'd; *n_out = 10 V) on an engine with options o over be
 * (the engine takes the backend and destroys it). */
static inline float *ls_gpu_prefill_decode(const ls_model *m, ls_backend *be, const ls_engine_opts *o,
                                           long *n_out)
{
    ls_error err;
    ls_error_clear(&err);
    ls_engine *e;
    ck_assert_msg(ls_engine_create(m, be, o, 1, 32, &e, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_engine_join(e, 0, 1, 9, &err) == LS_OK, "%s", err.msg);
    int32_t toks[10];
    for (int i = 0; i < 10; i++) toks[i] = (int32_t)((i * 131 + 7) % m->cfg.vocab);
    long V = m->cfg.vocab;
    float *lp = malloc(sizeof(float) * (size_t)(10 * V));
    ck_assert_ptr_nonnull(lp);
    ls_engine_item it = {0, toks, 9, 0, 0};
    const float *rows;
    ck_assert_msg(ls_engine_step(e, &it, 1, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_engine_logprobs(e, 0, &rows, &err) == LS_OK, "%s", err.msg);
    memcpy(lp, rows, sizeof(float) * (size_t)(9 * V));
    it = (ls_engine_item){0, toks + 9, 1, 1, 0};
    ck_assert_msg(ls_engine_step(e, &it, 1, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_engine_logprobs(e, 0, &rows, &err) == LS_OK, "%s", err.msg);
    memcpy(lp + 9 * V, rows, sizeof(float) * (size_t)V);
    ls_engine_destroy(e);
    *n_out = 10 * V;
    return lp;
}

/* Deterministic pseudo-random numbers (splitmix64), so failures reproduce. */
static inline uint64_t ls_gpu_rand_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-scale, scale). */
static inline float ls_gpu_rand_f32(uint64_t *state, float scale)
{
    uint32_t r = (uint32_t)(ls_gpu_rand_u64(state) >> 40); /* 24 bits */
    float u = (float)r / 16777216.0f;
    float two_u = 2.0f * u;
    float centred = two_u - 1.0f;
    return centred * scale;
}

#endif
