/* lockstep — what the CUDA backend reports about a device, for manifests.
 *
 * ls_cuda_query_device is implemented in kernels/ (built only when nvcc is
 * found, which defines LOCKSTEP_HAVE_CUDA); C code reaches it through
 * ls_runtime_query_gpu (manifest/runtime.h), never directly. */
#ifndef LS_BACKEND_CUDA_INFO_H
#define LS_BACKEND_CUDA_INFO_H

#include <stdint.h>

#include "core/status.h"

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

/* Fills *out for CUDA device `device`. Returns LS_E_DEVICE (message naming
 * the failing call) when no device can be queried. Implemented in kernels/. */
ls_status ls_cuda_query_device(int device, ls_gpu_info *out, ls_error *err);

#endif
