/* Portable-tier conformance for src/numerics/lsmath.h: the same header
 * compiled by nvcc (-fmad=false) for the device and by the host compiler
 * (-ffp-contract=off) must give the same bits for every function. Checks a
 * strided sample of all 2^32 fp32 bit patterns (stride from the environment
 * variable LS_LSMATH_STRIDE, default 4093; 1 = exhaustive). Prints SKIP and
 * exits 77 where no GPU is present. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "numerics/lsmath.h"

#define LS_NFN 7

static const char *const fn_names[LS_NFN] = {"exp", "log", "log1p", "sigmoid", "silu", "softplus", "rsqrt"};

__host__ __device__ static float apply(int f, float x)
{
    switch (f) {
    case 0: return ls_expf(x);
    case 1: return ls_logf(x);
    case 2: return ls_log1pf(x);
    case 3: return ls_sigmoidf(x);
    case 4: return ls_siluf(x);
    case 5: return ls_softplusf(x);
    default: return ls_rsqrtf(x);
    }
}

/* in: n bit patterns; out: [LS_NFN][n] result bits */
__global__ static void eval_all(const uint32_t *in, uint32_t *out, long n)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = ls_f32_from_bits(in[i]);
    for (int f = 0; f < LS_NFN; f++) out[(long)f * n + i] = ls_f32_bits(apply(f, x));
}

#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    long stride = 4093;
    const char *env = getenv("LS_LSMATH_STRIDE");
    if (env && atol(env) > 0) stride = atol(env);

    const long batch = 1L << 24;
    uint32_t *h_in = (uint32_t *)malloc(batch * 4), *h_out = (uint32_t *)malloc(LS_NFN * batch * 4);
    uint32_t *d_in, *d_out;
    CK(cudaMalloc(&d_in, batch * 4));
    CK(cudaMalloc(&d_out, LS_NFN * batch * 4));
    long checked = 0, mismatches = 0;
    uint64_t next = 0;
    while (next <= 0xffffffffull) {
        long n = 0;
        while (n < batch && next <= 0xffffffffull) {
            h_in[n++] = (uint32_t)next;
            next += (uint64_t)stride;
        }
        CK(cudaMemcpy(d_in, h_in, n * 4, cudaMemcpyHostToDevice));
        eval_all<<<(unsigned)((n + 255) / 256), 256>>>(d_in, d_out, n);
        CK(cudaGetLastError());
        CK(cudaMemcpy(h_out, d_out, LS_NFN * n * 4, cudaMemcpyDeviceToHost));
        for (long i = 0; i < n; i++) {
            float x = ls_f32_from_bits(h_in[i]);
            for (int f = 0; f < LS_NFN; f++) {
                uint32_t host = ls_f32_bits(apply(f, x)), dev = h_out[(long)f * n + i];
                int both_nan = (host & 0x7fffffffu) > 0x7f800000u && (dev & 0x7fffffffu) > 0x7f800000u;
                if (host != dev && !both_nan) {
                    if (mismatches < 10)
                        printf("MISMATCH %s(0x%08x): host 0x%08x device 0x%08x\n", fn_names[f], h_in[i], host, dev);
                    mismatches++;
                }
            }
        }
        checked += n;
    }
    printf("lsmath host vs device: %ld inputs x %d functions, stride %ld, %ld mismatches\n", checked, LS_NFN,
           stride, mismatches);
    cudaFree(d_in);
    cudaFree(d_out);
    free(h_in);
    free(h_out);
    return mismatches ? 1 : 0;
}
