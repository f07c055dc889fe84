/* lockstep — CUDA runtime services: device discovery, the run's device arena,
 * copies. See ls_cuda.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"
#include "ls_cuda.h"
#include "numerics/fp8.h"
#include "numerics/reduce.h"

extern "C" int ls_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

extern "C" ls_status ls_cuda_check_device(int device, ls_error *err)
{
    int count = ls_cuda_device_count();
    if (device >= 0 && device < count) return LS_OK;
    /* "0: NVIDIA H200, 1: NVIDIA H200", cut short with ", ..." */
    char list[512] = "none visible";
    size_t n = 0;
    for (int d = 0; d < count; d++) {
        cudaDeviceProp p;
        char one[300];
        if (cudaGetDeviceProperties(&p, d) == cudaSuccess)
            snprintf(one, sizeof one, "%s%d: %s", d ? ", " : "", d, p.name);
        else {
            (void)cudaGetLastError();
            snprintf(one, sizeof one, "%s%d", d ? ", " : "", d);
        }
        size_t k = strlen(one);
        if (n + k + 6 >= sizeof list) {
            snprintf(list + n, sizeof list - n, ", ...");
            break;
        }
        memcpy(list + n, one, k + 1);
        n += k;
    }
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    return ls_fail(err, LS_E_USAGE, "no CUDA device %d: this machine has %d (%s%s%.200s)", device,
                   count, list, vis ? "; CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "");
}

extern "C" ls_status ls_cuda_use_device(int device, ls_error *err)
{
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == device) return LS_OK;
    (void)cudaGetLastError();
    LS_TRY(ls_cuda_check_device(device, err));
    LS_CUDA_CHECK(cudaSetDevice(device), err, "making the run's CUDA device current");
    return LS_OK;
}

extern "C" ls_status ls_cuda_mem_info(size_t *free_bytes, size_t *total_bytes, ls_error *err)
{
    *free_bytes = 0;
    *total_bytes = 0;
    LS_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes), err, "querying the device's free memory");
    return LS_OK;
}

extern "C" ls_status ls_cuda_arena_init(ls_cuda_arena *a, size_t capacity_bytes, ls_error *err)
{
    memset(a, 0, sizeof *a);
    int dev = 0;
    LS_CUDA_CHECK(cudaGetDevice(&dev), err, "no usable CUDA device");
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    a->device = dev;
    a->device_total_bytes = total_b;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, capacity_bytes ? capacity_bytes : 256);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return ls_fail(err, LS_E_NOMEM, "out of GPU memory: the run's arena of %zu bytes does not "
                       "fit on CUDA device %d (%zu of its %zu bytes free)", capacity_bytes, dev,
                       free_b, total_b);
    }
    LS_CUDA_CHECK(e, err, "allocating the run's device arena");
    a->base = (uint8_t *)p;
    a->capacity_bytes = capacity_bytes;
    return LS_OK;
}

extern "C" void *ls_cuda_arena_alloc(ls_cuda_arena *a, size_t bytes, ls_error *err)
{
    size_t start = (a->used_bytes + 255u) & ~(size_t)255u;
    if (start > a->capacity_bytes || bytes > a->capacity_bytes - start) {
        size_t left = start < a->capacity_bytes ? a->capacity_bytes - start : 0;
        ls_fail(err, LS_E_NOMEM, "out of GPU memory: %zu bytes asked, the run's arena has %zu of "
                "its %zu bytes left (CUDA device %d, %zu bytes in all)", bytes, left,
                a->capacity_bytes, a->device, a->device_total_bytes);
        return NULL;
    }
    a->used_bytes = start + bytes;
    return a->base + start;
}

extern "C" void ls_cuda_arena_free(ls_cuda_arena *a)
{
    if (a->base) {
        /* on the arena's device (cudaFree synchronises the current one), then
         * the caller's current device back */
        int cur = -1;
        int switched = cudaGetDevice(&cur) == cudaSuccess && cur != a->device &&
                       cudaSetDevice(a->device) == cudaSuccess;
        (void)cudaFree(a->base);
        if (switched) (void)cudaSetDevice(cur);
        (void)cudaGetLastError();
    }
    a->base = NULL;
    a->capacity_bytes = 0;
    a->used_bytes = 0;
}

extern "C" ls_status ls_cuda_upload(void *dst_dev, const void *src_host, size_t bytes, ls_error *err)
{
    if (bytes == 0) return LS_OK;
    LS_CUDA_CHECK(cudaMemcpy(dst_dev, src_host, bytes, cudaMemcpyHostToDevice), err,
                  "host-to-device copy; is the destination device memory of this size?");
    return LS_OK;
}

extern "C" ls_status ls_cuda_download(void *dst_host, const void *src_dev, size_t bytes, ls_error *err)
{
    if (bytes == 0) return LS_OK;
    LS_CUDA_CHECK(cudaMemcpy(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost), err,
                  "device-to-host copy; an earlier kernel may have faulted (run compute-sanitizer)");
    return LS_OK;
}

extern "C" ls_status ls_cuda_memset(void *dst_dev, int value, size_t bytes, ls_error *err)
{
    if (bytes == 0) return LS_OK;
    LS_CUDA_CHECK(cudaMemset(dst_dev, value, bytes), err, "device memset");
    return LS_OK;
}

extern "C" ls_status ls_cuda_sync(ls_error *err)
{
    LS_CUDA_CHECK(cudaDeviceSynchronize(), err,
                  "a kernel faulted or timed out; rerun under compute-sanitizer --tool memcheck");
    return LS_OK;
}

/* Thread per element, element (r, g, i) at flat index (r groups + g) len + i. */
__global__ void ls_copy_blocks_kernel(float *dst, const float *src, long groups, long len, long n,
                                      long dst_stride, long dst_step, long src_stride,
                                      long src_step)
{
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (long)gridDim.x * blockDim.x) {
        long i = e % len, rg = e / len;
        long g = rg % groups, r = rg / groups;
        dst[r * dst_stride + g * dst_step + i] = src[r * src_stride + g * src_step + i];
    }
}

extern "C" ls_status ls_cuda_copy_blocks(float *dst, const float *src, long rows, long groups,
                                         long len, long dst_stride, long dst_step, long src_stride,
                                         long src_step, void *stream, ls_error *err)
{
    LS_CUDA_REQUIRE(rows >= 0 && groups >= 0 && len >= 0, err,
                    "device block copy: rows %ld, groups %ld, len %ld", rows, groups, len);
    long n = rows * groups * len;
    if (n == 0) return LS_OK;
    long blocks = (n + 255) / 256;
    ls_copy_blocks_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0,
                            (cudaStream_t)stream>>>(dst, src, groups, len, n, dst_stride, dst_step,
                                                    src_stride, src_step);
    LS_CUDA_CHECK_LAUNCH("ls_copy_blocks_kernel", err);
    return LS_OK;
}

__device__ static uint64_t ls_fill_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__global__ void ls_fill_uniform_bf16_kernel(uint16_t *dst, size_t n, uint64_t seed, float scale)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t r = ls_fill_mix64(seed + (i + 1) * 0x9E3779B97F4A7C15ull);
        float u = (float)((int64_t)(r >> 40) - ((int64_t)1 << 23)) * (1.0f / 8388608.0f);
        dst[i] = ls_f32_to_bf16(scale * u);
    }
}

extern "C" ls_status ls_cuda_fill_uniform_bf16(uint16_t *dst, size_t n, uint64_t seed,
                                               float scale, void *stream, ls_error *err)
{
    LS_CUDA_REQUIRE(isfinite(scale), err, "synthetic weights: scale %g is not finite",
                    (double)scale);
    if (n == 0) return LS_OK;
    size_t blocks = (n + 255) / 256;
    ls_fill_uniform_bf16_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0,
                                  (cudaStream_t)stream>>>(dst, n, seed, scale);
    LS_CUDA_CHECK_LAUNCH("ls_fill_uniform_bf16_kernel", err);
    return LS_OK;
}

/* Byte i: e4m3(448 u_i), u_i the value ls_fill_uniform_bf16_kernel draws
 * for element i (ls_cuda.h). */
__global__ void ls_fill_e4m3_kernel(uint8_t *dst, size_t n, uint64_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t r = ls_fill_mix64(seed + (i + 1) * 0x9E3779B97F4A7C15ull);
        float u = (float)((int64_t)(r >> 40) - ((int64_t)1 << 23)) * (1.0f / 8388608.0f);
        dst[i] = ls_f32_to_e4m3(LS_FP8_E4M3_MAX * u);
    }
}

extern "C" ls_status ls_cuda_fill_e4m3(uint8_t *dst, size_t n, uint64_t seed, void *stream,
                                       ls_error *err)
{
    if (n == 0) return LS_OK;
    size_t blocks = (n + 255) / 256;
    ls_fill_e4m3_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0,
                          (cudaStream_t)stream>>>(dst, n, seed);
    LS_CUDA_CHECK_LAUNCH("ls_fill_e4m3_kernel", err);
    return LS_OK;
}

extern "C" size_t ls_cuda_mem_free_bytes(void)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return free_b;
}

extern "C" ls_status ls_cuda_malloc(void **p, size_t bytes, ls_error *err)
{
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 256);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return ls_fail(err, LS_E_NOMEM, "out of GPU memory: %zu bytes asked (%zu bytes free on "
                       "the device)", bytes, ls_cuda_mem_free_bytes());
    }
    LS_CUDA_CHECK(e, err, "cudaMalloc");
    return LS_OK;
}

extern "C" void ls_cuda_free(void *p)
{
    if (p) (void)cudaFree(p);
}
