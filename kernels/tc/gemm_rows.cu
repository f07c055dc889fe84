/* lockstep — device helpers of the GEMM qualification: the bitwise row
 * comparison (gemm_rows.h) and the output fingerprint (gemm_pin.h). Neither
 * is numerics: integer compares and an integer sum, so the atomics here
 * cannot change a result. */
#include <stdint.h>

#include "cuda_check.cuh"

#include "gemm_pin.h"
#include "gemm_rows.h"

/* y: [rows, n] fp32; ref: [*, n] fp32; map: [rows], -1 = row not compared. */
__global__ static void ls_gemm_rows_diff_kernel(const float *y, const float *ref, const int32_t *map,
                                                int64_t rows, int64_t n,
                                                unsigned long long *first, unsigned long long *count)
{
    int64_t total = rows * n;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    unsigned long long mine = ~0ull, bad = 0;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        int64_t i = e / n, j = e - i * n;
        int32_t r = map[i];
        if (r < 0) continue;
        uint32_t a = __float_as_uint(y[e]);
        uint32_t b = __float_as_uint(ref[(int64_t)r * n + j]);
        if (a != b) {
            if ((unsigned long long)e < mine) mine = (unsigned long long)e;
            bad++;
        }
    }
    if (bad) {
        atomicMin(first, mine);
        atomicAdd(count, bad);
    }
}

static __device__ __forceinline__ unsigned long long ls_gemm_mix(unsigned long long z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* y: [n] fp32; *out += Σ mix(i·2^32 + bits(y[i])) mod 2^64. */
__global__ static void ls_gemm_hash_kernel(const float *y, int64_t n, unsigned long long *out)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    unsigned long long acc = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        acc += ls_gemm_mix(((unsigned long long)i << 32) ^ __float_as_uint(y[i]));
    atomicAdd(out, acc);
}

static unsigned ls_gemm_blocks(int64_t total)
{
    int64_t b = (total + 255) / 256;
    if (b < 1) b = 1;
    if (b > 4096) b = 4096;
    return (unsigned)b;
}

extern "C" ls_status ls_gemm_rows_diff(const float *y, const float *ref, const int32_t *map,
                                       int64_t rows, int64_t n, unsigned long long *first_dev,
                                       unsigned long long *count_dev, void *stream, ls_error *err)
{
    if (rows <= 0 || n <= 0) return LS_OK;
    ls_gemm_rows_diff_kernel<<<ls_gemm_blocks(rows * n), 256, 0, (cudaStream_t)stream>>>(
        y, ref, map, rows, n, first_dev, count_dev);
    LS_CUDA_CHECK_LAUNCH("ls_gemm_rows_diff_kernel", err);
    return LS_OK;
}

extern "C" ls_status ls_gemm_hash_f32(const float *y_dev, int64_t n, uint64_t *out, ls_error *err)
{
    *out = 0;
    unsigned long long *acc = NULL;
    LS_CUDA_CHECK(cudaMalloc((void **)&acc, sizeof *acc), err, "allocating the hash accumulator");
    ls_status st = LS_OK;
    unsigned long long h = 0;
    cudaError_t e = cudaMemset(acc, 0, sizeof *acc);
    if (e == cudaSuccess && n > 0) {
        ls_gemm_hash_kernel<<<ls_gemm_blocks(n), 256>>>(y_dev, n, acc);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaMemcpy(&h, acc, sizeof h, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
        st = ls_fail(err, LS_E_DEVICE, "%s:%d: hashing %lld fp32 values failed: %s (%s)", __FILE__,
                     __LINE__, (long long)n, cudaGetErrorName(e), cudaGetErrorString(e));
    cudaFree(acc);
    *out = (uint64_t)h;
    return st;
}
