/* lockstep — device facts (ls_cuda_query_device, ls_cuda.h). cuBLAS and
 * NCCL are not linked by the portable tier, so their versions are 0. */
#include <stdio.h>
#include <string.h>

#include "cuda_check.cuh"

#include "ls_cuda.h"

extern "C" ls_status ls_cuda_query_device(int device, ls_gpu_info *out, ls_error *err)
{
    memset(out, 0, sizeof *out);
    int count = 0;
    LS_CUDA_CHECK(cudaGetDeviceCount(&count), err, "no usable CUDA driver or device");
    if (device < 0 || device >= count)
        return ls_fail(err, LS_E_DEVICE, "CUDA device %d requested, %d visible", device, count);
    cudaDeviceProp p;
    LS_CUDA_CHECK(cudaGetDeviceProperties(&p, device), err, "querying the device properties");
    snprintf(out->name, sizeof out->name, "%s", p.name);
    const unsigned char *u = (const unsigned char *)p.uuid.bytes;
    snprintf(out->uuid, sizeof out->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    out->device_index = device;
    out->device_count = count;
    out->sm_count = p.multiProcessorCount;
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->memory_bytes = (uint64_t)p.totalGlobalMem;
    LS_CUDA_CHECK(cudaDriverGetVersion(&out->driver_version), err, "querying the driver version");
    LS_CUDA_CHECK(cudaRuntimeGetVersion(&out->runtime_version), err, "querying the runtime version");
    out->cublas_version = 0;
    out->nccl_version = 0;
    return LS_OK;
}
