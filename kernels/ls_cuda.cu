/* lockstep — CUDA runtime services: device discovery, the run's device arena,
 * copies. See ls_cuda.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"
#include "launch.cuh"
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

extern "C" ls_status ls_cuda_copy(void *dst_dev, const void *src_dev, size_t bytes, ls_error *err)
{
    if (bytes == 0) return LS_OK;
    LS_CUDA_CHECK(cudaMemcpy(dst_dev, src_dev, bytes, cudaMemcpyDeviceToDevice), err, "device-to-device copy");
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

/* ---- streams and graphs ------------------------------------------------------------ */

static int ls_pdl_on = 1;

extern "C" void ls_cuda_set_programmatic_launch(int on)
{
    __atomic_store_n(&ls_pdl_on, on != 0, __ATOMIC_RELAXED);
}

extern "C" int ls_cuda_programmatic_launch(void)
{
    return __atomic_load_n(&ls_pdl_on, __ATOMIC_RELAXED);
}

extern "C" ls_status ls_cuda_stream_create(void **out, ls_error *err)
{
    cudaStream_t s = NULL;
    *out = NULL;
    LS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamDefault), err, "creating a stream");
    *out = s;
    return LS_OK;
}

extern "C" void ls_cuda_stream_destroy(void *stream)
{
    if (stream) (void)cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" ls_status ls_cuda_event_create(void **out, ls_error *err)
{
    cudaEvent_t ev = NULL;
    *out = NULL;
    LS_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), err, "creating an event");
    *out = ev;
    return LS_OK;
}

extern "C" void ls_cuda_event_destroy(void *ev)
{
    if (ev) (void)cudaEventDestroy((cudaEvent_t)ev);
}

extern "C" ls_status ls_cuda_stream_after(void *waiter, void *waited, void *ev, ls_error *err)
{
    LS_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)waited), err, "recording an event");
    LS_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)waiter, (cudaEvent_t)ev, 0), err,
                  "ordering a stream after another");
    return LS_OK;
}

extern "C" ls_status ls_cuda_capture_begin(void *stream, ls_error *err)
{
    LS_CUDA_CHECK(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal), err,
                  "beginning a graph capture");
    return LS_OK;
}

extern "C" ls_status ls_cuda_capture_end(void *stream, int keep, void **exec, ls_error *err)
{
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &g);
    cudaGraphExec_t x = NULL;
    if (e == cudaSuccess && keep) e = cudaGraphInstantiate(&x, g, 0);
    if (g) (void)cudaGraphDestroy(g);
    if (e != cudaSuccess || !keep) {
        (void)cudaGetLastError(); /* a failed recording's error is not the device's */
        if (!keep) return LS_OK;
        return ls_fail(err, LS_E_DEVICE, "recording a step graph: %s", cudaGetErrorString(e));
    }
    if (*exec) (void)cudaGraphExecDestroy((cudaGraphExec_t)*exec);
    *exec = x;
    return LS_OK;
}

extern "C" ls_status ls_cuda_graph_launch(void *exec, void *stream, ls_error *err)
{
    LS_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream), err,
                  "launching a step graph");
    return LS_OK;
}

extern "C" void ls_cuda_graph_destroy(void *exec)
{
    if (exec) (void)cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

extern "C" ls_status ls_cuda_host_alloc(void **p, size_t bytes, ls_error *err)
{
    *p = NULL;
    cudaError_t e = cudaHostAlloc(p, bytes ? bytes : 256, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        return ls_fail(err, LS_E_NOMEM, "%zu bytes of pinned host memory: %s", bytes, cudaGetErrorString(e));
    }
    return LS_OK;
}

extern "C" void ls_cuda_host_free(void *p)
{
    if (p) (void)cudaFreeHost(p);
}

typedef struct ls_copy_jobs {
    ls_cuda_copy_job j[LS_CUDA_COPY_JOBS_MAX];
} ls_copy_jobs;

/* Job blockIdx.y; thread per element, element (r, g, i) at flat index
 * (r groups + g) len + i. */
__global__ void ls_copy_blocks_kernel(ls_copy_jobs jobs)
{
    ls_pdl_entry();
    const ls_cuda_copy_job *c = &jobs.j[blockIdx.y];
    long n = c->rows * c->groups * c->len;
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (long)gridDim.x * blockDim.x) {
        long i = e % c->len, rg = e / c->len;
        long g = rg % c->groups, r = rg / c->groups;
        c->dst[r * c->dst_stride + g * c->dst_step + i] = c->src[r * c->src_stride + g * c->src_step + i];
    }
}

extern "C" ls_status ls_cuda_copy_blocks(const ls_cuda_copy_job *jobs, int n, void *stream, ls_error *err)
{
    LS_CUDA_REQUIRE(n >= 1 && n <= LS_CUDA_COPY_JOBS_MAX, err, "device block copy: %d jobs (1..%d)", n,
                    LS_CUDA_COPY_JOBS_MAX);
    ls_copy_jobs js;
    memset(&js, 0, sizeof js);
    long most = 0;
    for (int i = 0; i < n; i++) {
        const ls_cuda_copy_job *c = &jobs[i];
        LS_CUDA_REQUIRE(c->rows >= 0 && c->groups >= 0 && c->len >= 0, err,
                        "device block copy: job %d: rows %ld, groups %ld, len %ld", i, c->rows, c->groups,
                        c->len);
        js.j[i] = *c;
        long e = c->rows * c->groups * c->len;
        if (e > most) most = e;
    }
    if (most == 0) return LS_OK;
    long blocks = (most + 255) / 256;
    dim3 grid((unsigned)(blocks < 65536 ? blocks : 65536), (unsigned)n);
    ls_launch(ls_copy_blocks_kernel, grid, 256, 0, (cudaStream_t)stream, js);
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

/* ---- lockstep synth's values (synth_gen.c, bit for bit) ---------------------- */

/* ls_synth_irwin_hall: 2 (u0 + u1 + u2 + u3) - 4 * 65535 over the four
 * 16-bit fields of x. */
__device__ static int32_t ls_fill_irwin_hall(uint64_t x)
{
    int32_t s = (int32_t)(x & 0xffff) + (int32_t)((x >> 16) & 0xffff) +
                (int32_t)((x >> 32) & 0xffff) + (int32_t)(x >> 48);
    return 2 * s - 4 * 65535;
}

/* Element first + i: fill_normal_at's loop body, operation for operation. */
__global__ void ls_fill_synth_bf16_kernel(uint16_t *dst, size_t n, uint64_t key, uint64_t first,
                                          float c, float base)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = ls_fill_mix64(key + ((uint64_t)first + (uint64_t)i + 1) * 0x9E3779B97F4A7C15ull);
        float z = (float)ls_fill_irwin_hall(x); /* exact */
        float v = base + z * c;                 /* two rounded fp32 operations (-fmad=false) */
        dst[i] = ls_f32_to_bf16(v);
    }
}

extern "C" ls_status ls_cuda_fill_synth_bf16(uint16_t *dst, size_t n, uint64_t key, uint64_t first,
                                             float c, float base, void *stream, ls_error *err)
{
    if (n == 0) return LS_OK;
    size_t blocks = (n + 255) / 256;
    ls_fill_synth_bf16_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0,
                                (cudaStream_t)stream>>>(dst, n, key, first, c, base);
    LS_CUDA_CHECK_LAUNCH("ls_fill_synth_bf16_kernel", err);
    return LS_OK;
}

/* One thread block per 128 x 128 block b of v [rows, cols]: scale[b] =
 * amax / 448 (synth_gen.c block_scale; a max is exact in any order). */
__global__ void ls_fill_synth_scale_kernel(const uint16_t *v, long rows, long cols, float *scale)
{
    __shared__ float m[256];
    const long bc = LS_FP8_BLOCKS(cols), b = (long)blockIdx.x;
    const long r0 = (b / bc) * LS_FP8_BLOCK, c0 = (b % bc) * LS_FP8_BLOCK;
    const long nr = rows - r0 < LS_FP8_BLOCK ? rows - r0 : LS_FP8_BLOCK;
    const long nc = cols - c0 < LS_FP8_BLOCK ? cols - c0 : LS_FP8_BLOCK;
    float amax = 0.0f;
    for (long k = threadIdx.x; k < nr * nc; k += blockDim.x) {
        float a = ls_bf16_to_f32(v[(r0 + k / nc) * cols + c0 + k % nc]);
        if (a < 0.0f) a = -a;
        if (a > amax) amax = a;
    }
    m[threadIdx.x] = amax;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && m[threadIdx.x + s] > m[threadIdx.x]) m[threadIdx.x] = m[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) scale[b] = m[0] > 0.0f ? m[0] / LS_FP8_E4M3_MAX : 1.0f;
}

/* q[i] = e4m3(v[i] / scale of its block) (synth_gen.c ls_synth_fill_rows). */
__global__ void ls_fill_synth_quant_kernel(const uint16_t *v, const float *scale, size_t n, long cols,
                                           uint8_t *q)
{
    const long bc = LS_FP8_BLOCKS(cols);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        long r = (long)(i / (size_t)cols), cc = (long)(i % (size_t)cols);
        float s = scale[(r / LS_FP8_BLOCK) * bc + cc / LS_FP8_BLOCK];
        q[i] = ls_f32_to_e4m3(ls_bf16_to_f32(v[i]) / s);
    }
}

extern "C" ls_status ls_cuda_fill_synth_e4m3(uint8_t *dst, float *scale, long r0, long n, long rows,
                                             long cols, uint64_t key, float c, float base,
                                             void *stream, ls_error *err)
{
    LS_CUDA_REQUIRE(r0 >= 0 && n > 0 && r0 + n <= rows && cols > 0, err,
                    "synthetic FP8 weights: rows %ld..%ld of a [%ld, %ld] matrix", r0, r0 + n - 1,
                    rows, cols);
    /* the whole blocks around the range: a block's scale needs all its rows */
    const long a0 = r0 / LS_FP8_BLOCK * LS_FP8_BLOCK;
    long a1 = (r0 + n + LS_FP8_BLOCK - 1) / LS_FP8_BLOCK * LS_FP8_BLOCK;
    if (a1 > rows) a1 = rows;
    const int direct = a0 == r0 && a1 == r0 + n;
    const size_t na = (size_t)(a1 - a0) * (size_t)cols;
    const size_t nsa = (size_t)LS_FP8_BLOCKS(a1 - a0) * (size_t)LS_FP8_BLOCKS(cols);
    const size_t ns = (size_t)LS_FP8_BLOCKS(n) * (size_t)LS_FP8_BLOCKS(cols);
    LS_CUDA_REQUIRE(nsa < ((size_t)1 << 31), err, "synthetic FP8 weights: %zu scale blocks", nsa);
    cudaStream_t st = (cudaStream_t)stream;
    uint16_t *v = NULL;   /* [a1 - a0, cols] bf16 values */
    uint8_t *q = dst;     /* [a1 - a0, cols] e4m3 */
    float *sc = scale;    /* [BLOCKS(a1 - a0), BLOCKS(cols)] */
    ls_status rc = ls_cuda_malloc((void **)&v, na * 2, err);
    if (rc == LS_OK && !direct) rc = ls_cuda_malloc((void **)&q, na, err);
    if (rc == LS_OK && !direct) rc = ls_cuda_malloc((void **)&sc, nsa * sizeof(float), err);
    if (rc == LS_OK) rc = ls_cuda_fill_synth_bf16(v, na, key, (uint64_t)a0 * (uint64_t)cols, c, base, stream, err);
    if (rc == LS_OK) {
        ls_fill_synth_scale_kernel<<<(unsigned)nsa, 256, 0, st>>>(v, a1 - a0, cols, sc);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) rc = ls_fail(err, LS_E_DEVICE, "ls_fill_synth_scale_kernel: %s", cudaGetErrorString(e));
    }
    if (rc == LS_OK) {
        size_t blocks = (na + 255) / 256;
        ls_fill_synth_quant_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, st>>>(v, sc, na, cols, q);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) rc = ls_fail(err, LS_E_DEVICE, "ls_fill_synth_quant_kernel: %s", cudaGetErrorString(e));
    }
    if (rc == LS_OK && !direct) {
        /* the range's rows, and the scale rows of its blocks from r0 / 128 on
         * (the first block of the scratch) */
        cudaError_t e = cudaMemcpyAsync(dst, q + (size_t)(r0 - a0) * (size_t)cols, (size_t)n * (size_t)cols,
                                        cudaMemcpyDeviceToDevice, st);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(scale, sc, ns * sizeof(float), cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess) rc = ls_fail(err, LS_E_DEVICE, "synthetic FP8 weights: copy: %s", cudaGetErrorString(e));
    }
    /* the scratch is freed only after the device is done with it */
    cudaError_t e = cudaStreamSynchronize(st);
    if (rc == LS_OK && e != cudaSuccess)
        rc = ls_fail(err, LS_E_DEVICE, "synthetic FP8 weights: %s", cudaGetErrorString(e));
    ls_cuda_free(v);
    if (!direct) {
        if (q != dst) ls_cuda_free(q);
        if (sc != scale) ls_cuda_free(sc);
    }
    return rc;
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
