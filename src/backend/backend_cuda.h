/* lockstep — the portable strict CUDA backend (operator table of backend.h
 * over device memory, each op a kernel of kernels/ops.h that gives the CPU
 * reference's bits). Available when the library is built with CUDA
 * (LOCKSTEP_HAVE_CUDA); otherwise ls_backend_cuda_create fails closed. */
#ifndef LS_BACKEND_BACKEND_CUDA_H
#define LS_BACKEND_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/platform.h"

typedef struct ls_backend_cuda_opts {
    int device;                      /* CUDA ordinal (0 .. count-1) everything runs on; default 0 */
    size_t arena_bytes;              /* device memory of the run; 0 = 90 % of the device's free
                                        memory, divided by arena_share */
    int arena_share;                 /* processes that share the device, each with its own
                                        arena (ranks of one run on one GPU); 0 or 1: none */
    uint64_t synthetic_weights_seed; /* 0: wrap_weights needs host data (refuses NULL);
                                        else wrap_weights with host == NULL fills the buffer
                                        on the device from seed ^ (k · 0xD1B54A32D192ED03),
                                        the k-th matrix generated (k = 1, 2, ...): bf16
                                        ls_cuda_fill_uniform_bf16, FP8 ls_cuda_fill_e4m3
                                        (e4m3 bytes over the whole range; the values they
                                        stand for come with the model's block scales) */
    float synthetic_weights_scale;   /* synthetic bf16 values uniform in [-scale, scale) */
    int synthetic_weights_exact;     /* 1: the backend has wrap_generated, so the engine has
                                        it generate a synthetic model's matrices (and a rank's
                                        row ranges) with lockstep synth's values on the device
                                        (ls_cuda_fill_synth_bf16 / _e4m3: the written
                                        checkpoint's bytes, FP8 scales included); 0 (default):
                                        the seed's generator above, for benchmarks */
    int synchronous_digests;         /* 1: every digest call computes its digests before it
                                        returns (digest_wait has nothing to wait for); no ring
                                        of device and pinned memory, no hashing threads. For a
                                        backend that digests a few rows once (the reduction
                                        probe); 0 (default): asynchronous where a ring fits */
    ls_tier tier;                    /* the GEMMs' tier (docs/tensor-core-tier.md §2.2, §2.3, §6):
                                        LS_TIER_PORTABLE (default); LS_TIER_TC: every bf16
                                        linear through one cuBLASLt algorithm per weight
                                        shape, qualified row-invariant on this GPU by
                                        prepare_linear and pinned (ls_backend_cuda_tc_pins);
                                        LS_TIER_FAST: through cuBLASLt's default heuristic
                                        per call (not row-invariant). Both run the MoE
                                        experts on tensor cores (ls_cuda_moe_forward_tc;
                                        fast: ls_cuda_moe_forward_fast, its combine by
                                        atomics), fast its attention split by the call's
                                        size (ls_cuda_attention_fast_batch) and its GDN
                                        calls of 64 tokens or more chunked from their start
                                        (ls_cuda_gdn_fast); the other ops stay portable in
                                        every tier */
    long tc_rows;                    /* tc and fast: the rows per call each shape is prepared
                                        (tc: qualified) for: the larger of this and
                                        prepare_linear's max_rows (a fixed value makes the
                                        choice independent of max_rows) */
} ls_backend_cuda_opts;

/* device 0, arena_bytes 0, no synthetic weights, scale 0.04 (about 1.8 / sqrt(2048):
 * activations of Qwen3-Next-80B-A3B's hidden size keep a realistic spread). */
void ls_backend_cuda_opts_default(ls_backend_cuda_opts *o);

/* Creates the backend on CUDA device o->device, which it makes the calling
 * thread's current device; every op makes it current again on the thread
 * that calls it (the runtime's current device is per thread). A device
 * that does not exist fails with LS_E_USAGE: "no CUDA device N: this
 * machine has M (0: NAME, ...)"; no device at all with LS_E_DEVICE.
 *
 * Device memory for the run (weights, activations, caches) comes from one
 * arena of o->arena_bytes, taken with one cudaMalloc; MoE and digest scratch
 * come from it too. A request the arena cannot hold fails with LS_E_NOMEM
 * ("out of GPU memory", the bytes asked, the arena's and the device's
 * bytes), never waits; destroy frees the arena whatever failed, so the
 * device's free memory is what it was before the backend was created. The
 * CUDA kernels run the canonical order only: an op asked for the reversed
 * order (a perturbation) fails closed with LS_E_UNSUPPORTED. */
ls_status ls_backend_cuda_create_opts(const ls_backend_cuda_opts *o, ls_backend **out,
                                      ls_error *err);

/* ls_backend_cuda_create_opts with the defaults and arena_bytes. */
ls_status ls_backend_cuda_create(size_t arena_bytes, ls_backend **out, ls_error *err);

/* The device memory a CUDA backend's run has taken: *used_bytes of its
 * arena's *capacity_bytes. The arena hands memory out and frees it only when
 * the backend is destroyed, so *used_bytes is the run's high-water mark
 * (weights, caches, work buffers, MoE and digest scratch). Both 0 for a
 * backend that is not this one (the CPU's) and in a build without CUDA. */
void ls_backend_cuda_arena_usage(const ls_backend *be, size_t *used_bytes, size_t *capacity_bytes);

/* The tensor-core tier's pinned GEMM records (kernels/tc/gemm_pin.h, one
 * canonical JSON line each), one per weight shape prepared so far, ordered
 * by (N, K): *n of them in *records, owned by the backend until it is
 * destroyed. *n = 0 for a portable backend, the CPU's, and without CUDA. */
void ls_backend_cuda_tc_pins(const ls_backend *be, const char *const **records, size_t *n);

/* LS_OK when `device` is a CUDA ordinal of this machine; else LS_E_USAGE
 * "no CUDA device N: this machine has M (0: NAME, ...)", or LS_E_UNSUPPORTED
 * in a build without CUDA. */
ls_status ls_backend_cuda_check_device(int device, ls_error *err);

/* 1 in a build with CUDA, else 0; touches no device (a process that forks
 * CUDA ranks may ask before it forks). */
int ls_backend_cuda_built(void);

/* The CUDA devices this process sees (0 without CUDA or without a device).
 * Initialises the CUDA runtime: a process that has asked must not fork
 * children that use CUDA. */
int ls_backend_cuda_device_count(void);

/* 1 once this process has called into the CUDA runtime through this
 * header's functions (a backend created, a device checked, queried or
 * counted), else 0. */
int ls_backend_cuda_touched(void);

/* CUDA device `device` as the runtime describes it, for the manifest.
 * *present = 0 (and *out zeroed, LS_OK) in a build without CUDA or when no
 * device can be queried: a CPU-only system is not an error. */
ls_status ls_backend_cuda_query_gpu(int device, ls_gpu_info *out, int *present, ls_error *err);

#endif
