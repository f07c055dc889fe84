/* lockstep — CUDA runtime services: device discovery, the run's device arena,
 * copies. See ls_cuda.h. */
#include <math.h>

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

extern "C" ls_status ls_cuda_arena_init(ls_cuda_arena *a, size_t capacity_bytes, ls_error *err)
{
    a->base = NULL;
    a->capacity_bytes = 0;
    a->used_bytes = 0;
    void *p = NULL;
    LS_CUDA_CHECK(cudaMalloc(&p, capacity_bytes ? capacity_bytes : 256), err,
                  "not enough free device memory for the run's arena");
    a->base = (uint8_t *)p;
    a->capacity_bytes = capacity_bytes;
    return LS_OK;
}

extern "C" void *ls_cuda_arena_alloc(ls_cuda_arena *a, size_t bytes, ls_error *err)
{
    size_t start = (a->used_bytes + 255u) & ~(size_t)255u;
    if (start > a->capacity_bytes || bytes > a->capacity_bytes - start) {
        ls_fail(err, LS_E_NOMEM, "device arena full: %zu bytes requested, %zu of %zu used",
                bytes, a->used_bytes, a->capacity_bytes);
        return NULL;
    }
    a->used_bytes = start + bytes;
    return a->base + start;
}

extern "C" void ls_cuda_arena_free(ls_cuda_arena *a)
{
    if (a->base) (void)cudaFree(a->base);
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
    LS_CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 256), err, "not enough free device memory");
    return LS_OK;
}

extern "C" void ls_cuda_free(void *p)
{
    if (p) (void)cudaFree(p);
}
