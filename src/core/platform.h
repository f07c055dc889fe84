/* lockstep — facts the backends report about themselves, as plain data:
 * which provider runs each operator (a manifest row) and what a GPU is.
 * The backend fills them; the run layer hands them to the manifest, which
 * records them and never asks a backend itself (docs/architecture.md). */
#ifndef LS_CORE_PLATFORM_H
#define LS_CORE_PLATFORM_H

#include <stdint.h>

/* One row of a provider registry: which implementation runs an operator and
 * with which reduction order. Reduction-order ids name the orders of
 * docs/numerics.md; a new order gets a new id, never a reused one. */
typedef struct ls_provider {
    const char *op;                 /* operator name, e.g. "linear" (docs/numerics.md §3) */
    const char *provider;           /* implementation family, e.g. "cpu-reference" */
    const char *kernel_id;          /* function / kernel that runs it */
    const char *tile_shape;         /* e.g. "1x32" (rows x lanes), "-" when not tiled */
    const char *split_policy;       /* "none" for strict providers (no split-K / split-KV) */
    const char *accumulator_dtype;  /* "fp32" */
    const char *reduction_order;    /* e.g. "dot32-lanes32-butterfly" */
    const char *tier;               /* "portable" | "tensor-core" */
    const char *mode;               /* "strict" | "fast" */
} ls_provider;

/* A GPU as the CUDA runtime describes it. */
typedef struct ls_gpu_info {
    char name[256];              /* cudaDeviceProp.name, e.g. "NVIDIA H200" */
    char uuid[64];               /* "GPU-xxxxxxxx-...", informational */
    int device_index;            /* CUDA ordinal queried */
    int device_count;            /* visible devices */
    int sm_count;                /* multiProcessorCount */
    int cc_major, cc_minor;      /* compute capability */
    uint64_t memory_bytes;       /* totalGlobalMem */
    int driver_version;          /* cudaDriverGetVersion: 1000*major + 10*minor */
    int runtime_version;         /* cudaRuntimeGetVersion: 1000*major + 10*minor */
    int cublas_version;          /* cublasGetVersion: major*10000 + minor*100 + patch; 0 if not linked */
    int nccl_version;            /* ncclGetVersion code; 0 if not linked */
} ls_gpu_info;

/* The reduction fingerprint of one operator row: the SHA-256 (64 lowercase
 * hex digits) of the output bits the backend produced for that operator on
 * its fixed probe inputs (src/probe/probe.h). The probe fills it; the run
 * layer hands the table to the manifest beside the provider rows. */
typedef struct ls_op_fingerprint {
    const char *op;                 /* operator name as in the provider row (static) */
    char sha256[65];                /* hex, NUL-terminated */
} ls_op_fingerprint;

#endif
