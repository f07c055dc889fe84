/* lockstep — SHA-256 (FIPS 180-4) on the GPU, one thread per message.
 * Bit-exact with OpenSSL by construction (the standard fixes every bit) and
 * by test (tests/gpu/test_sha256). */
#include "cuda_check.cuh"
#include "launch.cuh"
#include "sha256.h"

/* Round constants; a __constant__ copy for the device and a plain one for the
 * host build of the same functions (used by the host self-check). */
#define LS_SHA256_K_INIT { \
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, \
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, \
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, \
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, \
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, \
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu, \
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u, \
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u, \
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, \
    0xc67178f2u}
__constant__ uint32_t ls_sha256_k_dev[64] = LS_SHA256_K_INIT;

#ifdef __CUDA_ARCH__
#define LS_SHA256_K(i) ls_sha256_k_dev[i]
#define LS_BSWAP32(x) __byte_perm((x), 0, 0x0123)
#else
static const uint32_t ls_sha256_k_host[64] = LS_SHA256_K_INIT;
#define LS_SHA256_K(i) ls_sha256_k_host[i]
#define LS_BSWAP32(x) (((x) >> 24) | (((x) >> 8) & 0xff00u) | (((x) << 8) & 0xff0000u) | ((x) << 24))
#endif
#define LS_SHA_HD __host__ __device__

LS_SHA_HD __forceinline__ uint32_t ls_rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/* One 64-byte block. w[] is consumed as the rolling message schedule; every
 * index is a compile-time constant after unrolling (no local-memory array). */
LS_SHA_HD static void ls_sha256_compress(uint32_t h[8], uint32_t w[16])
{
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
#pragma unroll
    for (int i = 0; i < 64; i++) {
        uint32_t wi;
        if (i < 16) {
            wi = w[i];
        } else {
            uint32_t w15 = w[(i - 15) & 15], w2 = w[(i - 2) & 15];
            uint32_t s0 = ls_rotr(w15, 7) ^ ls_rotr(w15, 18) ^ (w15 >> 3);
            uint32_t s1 = ls_rotr(w2, 17) ^ ls_rotr(w2, 19) ^ (w2 >> 10);
            wi = w[i & 15] + s0 + w[(i - 7) & 15] + s1;
            w[i & 15] = wi;
        }
        uint32_t S1 = ls_rotr(e, 6) ^ ls_rotr(e, 11) ^ ls_rotr(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = hh + S1 + ch + LS_SHA256_K(i) + wi;
        uint32_t S0 = ls_rotr(a, 2) ^ ls_rotr(a, 13) ^ ls_rotr(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = S0 + maj;
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

/* SHA-256 of len bytes at p, written big-endian to out[32]. */
LS_SHA_HD static void ls_sha256_device(const uint8_t *p, uint64_t len, uint8_t *out)
{
    uint32_t h[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                     0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    uint64_t n_blocks = (len + 9 + 63) / 64; /* message + 0x80 + 64-bit length */
    uint64_t bit_len = len * 8;
    for (uint64_t blk = 0; blk < n_blocks; blk++) {
        uint64_t base = blk * 64;
        uint32_t w[16];
        if (base + 64 <= len) {
            const uint8_t *q = p + base;
            if ((((uintptr_t)q) & 3u) == 0) {
                const uint32_t *q32 = (const uint32_t *)q;
#pragma unroll
                for (int i = 0; i < 16; i++) w[i] = LS_BSWAP32(q32[i]);
            } else {
#pragma unroll
                for (int i = 0; i < 16; i++)
                    w[i] = ((uint32_t)q[4 * i] << 24) | ((uint32_t)q[4 * i + 1] << 16) |
                           ((uint32_t)q[4 * i + 2] << 8) | (uint32_t)q[4 * i + 3];
            }
        } else {
            /* Tail: remaining message bytes, 0x80, zeros, and in the final
             * block the bit length in the last 8 bytes. */
#pragma unroll
            for (int i = 0; i < 16; i++) {
                uint32_t v = 0;
                for (int j = 0; j < 4; j++) {
                    uint64_t g = base + (uint64_t)(4 * i + j);
                    uint32_t byte = g < len ? p[g] : (g == len ? 0x80u : 0u);
                    v = (v << 8) | byte;
                }
                w[i] = v;
            }
            if (blk == n_blocks - 1) {
                w[14] = (uint32_t)(bit_len >> 32);
                w[15] = (uint32_t)bit_len;
            }
        }
        ls_sha256_compress(h, w);
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(h[i] >> 8);
        out[4 * i + 3] = (uint8_t)h[i];
    }
}

__global__ void ls_sha256_rows_kernel(const uint8_t *data, uint64_t row_bytes, uint64_t stride,
                                      int n_rows, uint8_t *digests)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rows) return;
    ls_sha256_device(data + (uint64_t)r * stride, row_bytes, digests + (uint64_t)r * 32);
}

__global__ void ls_sha256_spans_kernel(const uint8_t *base, const uint64_t *offsets,
                                       const uint64_t *lens, int n, uint8_t *digests)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    ls_sha256_device(base + offsets[i], lens[i], digests + (uint64_t)i * 32);
}

/* Leaves of a Merkle digest: leaf i covers [i*leaf, min((i+1)*leaf, n)). */
__global__ void ls_sha256_leaves_kernel(const uint8_t *data, uint64_t n_bytes, uint64_t leaf_bytes,
                                        uint64_t n_leaves, uint8_t *digests)
{
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_leaves) return;
    uint64_t start = i * leaf_bytes;
    uint64_t len = n_bytes - start < leaf_bytes ? n_bytes - start : leaf_bytes;
    ls_sha256_device(data + start, len, digests + i * 32);
}

__global__ void ls_sha256_one_kernel(const uint8_t *data, uint64_t len, uint8_t *out)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) ls_sha256_device(data, len, out);
}

#define LS_SHA_THREADS 128

extern "C" ls_status ls_cuda_sha256_rows(const void *d_data, size_t row_bytes, size_t stride_bytes,
                                         int n_rows, uint8_t *d_digests, void *stream, ls_error *err)
{
    LS_CUDA_REQUIRE(n_rows >= 0, err, "sha256_rows: n_rows %d < 0", n_rows);
    if (n_rows == 0) return LS_OK;
    int blocks = (n_rows + LS_SHA_THREADS - 1) / LS_SHA_THREADS;
    ls_sha256_rows_kernel<<<blocks, LS_SHA_THREADS, 0, (cudaStream_t)stream>>>(
        (const uint8_t *)d_data, row_bytes, stride_bytes, n_rows, d_digests);
    LS_CUDA_CHECK_LAUNCH("ls_sha256_rows_kernel", err);
    return LS_OK;
}

extern "C" ls_status ls_cuda_sha256_spans(const void *d_base, const uint64_t *d_offsets,
                                          const uint64_t *d_lens, int n, uint8_t *d_digests,
                                          void *stream, ls_error *err)
{
    LS_CUDA_REQUIRE(n >= 0, err, "sha256_spans: n %d < 0", n);
    if (n == 0) return LS_OK;
    int blocks = (n + LS_SHA_THREADS - 1) / LS_SHA_THREADS;
    ls_sha256_spans_kernel<<<blocks, LS_SHA_THREADS, 0, (cudaStream_t)stream>>>(
        (const uint8_t *)d_base, d_offsets, d_lens, n, d_digests);
    LS_CUDA_CHECK_LAUNCH("ls_sha256_spans_kernel", err);
    return LS_OK;
}

extern "C" size_t ls_cuda_merkle_scratch_bytes(size_t n_bytes, size_t leaf_bytes)
{
    if (leaf_bytes == 0) return 0;
    size_t n_leaves = (n_bytes + leaf_bytes - 1) / leaf_bytes;
    if (n_leaves == 0) n_leaves = 1;
    return n_leaves * 32;
}

extern "C" ls_status ls_cuda_merkle_sha256(const void *d_data, size_t n_bytes, size_t leaf_bytes,
                                           uint8_t *d_scratch, uint8_t *d_root, void *stream,
                                           ls_error *err)
{
    LS_CUDA_REQUIRE(leaf_bytes > 0 && leaf_bytes % 64 == 0, err,
                    "merkle_sha256: leaf_bytes %zu is not a positive multiple of 64", leaf_bytes);
    uint64_t n_leaves = ls_cuda_merkle_scratch_bytes(n_bytes, leaf_bytes) / 32;
    uint64_t blocks = (n_leaves + LS_SHA_THREADS - 1) / LS_SHA_THREADS;
    LS_CUDA_REQUIRE(blocks <= 0x7fffffffu, err, "merkle_sha256: %zu bytes is too many leaves", n_bytes);
    cudaStream_t s = (cudaStream_t)stream;
    ls_sha256_leaves_kernel<<<(unsigned)blocks, LS_SHA_THREADS, 0, s>>>(
        (const uint8_t *)d_data, n_bytes, leaf_bytes, n_leaves, d_scratch);
    LS_CUDA_CHECK_LAUNCH("ls_sha256_leaves_kernel", err);
    ls_sha256_one_kernel<<<1, 1, 0, s>>>(d_scratch, n_leaves * 32, d_root);
    LS_CUDA_CHECK_LAUNCH("ls_sha256_one_kernel", err);
    return LS_OK;
}

/* ---- digests of encoded activation spans ------------------------------------------ */

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "numerics/reduce.h"

typedef struct ls_digest_entry {   /* device copy of one job */
    uint64_t src[2];               /* device addresses */
    uint64_t n[2];                 /* elements */
    uint64_t row_len[2];           /* 0 = contiguous */
    uint64_t stride[2];
    uint64_t off;                  /* encoded bytes start in the scratch (16-aligned) */
    uint64_t len;                  /* encoded bytes */
    uint32_t bf16[2];
    uint32_t host;                 /* hashed on the host (long, or a part) */
} ls_digest_entry;

#define LS_ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

static uint64_t ls_job_bytes(const ls_cuda_digest_job *j)
{
    return j->n[0] * (j->bf16[0] ? 2u : 4u) + j->n[1] * (j->bf16[1] ? 2u : 4u);
}

/* Scratch layout: [entries][digests][encoded bytes], each part 256-aligned. */
static void ls_digest_layout(const ls_cuda_digest_job *jobs, int n, size_t *digests_at,
                             size_t *bytes_at, size_t *total)
{
    size_t a = LS_ALIGN_UP(sizeof(ls_digest_entry) * (size_t)n, 256);
    size_t b = a + LS_ALIGN_UP((size_t)n * 32, 256);
    size_t c = 0;
    for (int i = 0; i < n; i++) c += LS_ALIGN_UP(ls_job_bytes(&jobs[i]), 16);
    *digests_at = a;
    *bytes_at = b;
    *total = b + c + 16;
}

/* The device copy of a job (its off is set by the caller's layout). */
static void ls_entry_of(const ls_cuda_digest_job *j, ls_digest_entry *e)
{
    for (int s = 0; s < 2; s++) {
        e->src[s] = (uint64_t)(uintptr_t)j->src[s];
        e->n[s] = j->n[s];
        e->row_len[s] = j->row_len[s];
        e->stride[s] = j->stride[s];
        e->bf16[s] = j->bf16[s] ? 1u : 0u;
    }
    e->len = ls_job_bytes(j);
    e->host = 0;
}

extern "C" size_t ls_cuda_digest_scratch_bytes(const ls_cuda_digest_job *jobs, int n_jobs)
{
    size_t a, b, t;
    ls_digest_layout(jobs, n_jobs, &a, &b, &t);
    return t;
}

/* A launch's jobs, passed by value (at most LS_DIGEST_LAUNCH_JOBS: 3 KB of
 * kernel parameters; a launch of at most LS_DIGEST_LAUNCH_FEW jobs, the
 * usual one at batch 1, passes 384 bytes). The table travels with the launch
 * rather than being read from host memory by the kernel: a read of mapped
 * host memory queues on the link behind the downloads already under way
 * (PCIe lets no read request pass an earlier write), and the digester's
 * downloads of earlier groups (megabytes at batch 32) are exactly that. */
#define LS_DIGEST_LAUNCH_JOBS 32
#define LS_DIGEST_LAUNCH_FEW 4
template <int N>
struct ls_digest_launch {
    ls_digest_entry e[N];
};

/* One (job, element) per thread: blockIdx.y is the job, x strides the
 * elements. The 0-15 bytes that pad each job to 16 are zeroed too: the host
 * jobs' part goes to the host in one copy, gaps included, and a copy of bytes
 * nothing wrote is an uninitialised read (compute-sanitizer initcheck). */
template <int N>
__global__ void ls_digest_encode_kernel(const __grid_constant__ ls_digest_launch<N> t, uint8_t *bytes)
{
    ls_pdl_entry();
    const ls_digest_entry &e = t.e[blockIdx.y];
    if (blockIdx.x == 0 && threadIdx.x < LS_ALIGN_UP(e.len, 16) - e.len)
        bytes[e.off + e.len + threadIdx.x] = 0;
    uint64_t total = e.n[0] + e.n[1];
    uint64_t w0 = e.bf16[0] ? 2u : 4u;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        int s = i < e.n[0] ? 0 : 1;
        uint64_t el = s ? i - e.n[0] : i;
        uint64_t src = e.row_len[s] ? (el / e.row_len[s]) * e.stride[s] + el % e.row_len[s] : el;
        uint32_t bits = ((const uint32_t *)e.src[s])[src];
        uint8_t *dst = bytes + e.off + (s ? e.n[0] * w0 + el * (e.bf16[1] ? 2u : 4u) : el * w0);
        if (e.bf16[s]) {
            uint16_t h = ls_f32_to_bf16(ls_f32_from_bits(bits));
            dst[0] = (uint8_t)h;
            dst[1] = (uint8_t)(h >> 8);
        } else if ((((uintptr_t)dst) & 3u) == 0) {
            *(uint32_t *)dst = bits; /* little-endian device */
        } else {
            dst[0] = (uint8_t)bits;
            dst[1] = (uint8_t)(bits >> 8);
            dst[2] = (uint8_t)(bits >> 16);
            dst[3] = (uint8_t)(bits >> 24);
        }
    }
}

/* One launch for the m <= N jobs of h. */
template <int N>
static void ls_digest_encode_launch(const ls_digest_entry *h, int m, dim3 grid, uint8_t *bytes, cudaStream_t s)
{
    ls_digest_launch<N> t;
    memcpy(t.e, h, sizeof *h * (size_t)m);
    ls_launch(ls_digest_encode_kernel<N>, grid, 256, 0, s, t, bytes);
}

/* Enqueues the encoding of the n jobs of h (offsets set) into bytes, in
 * launches of LS_DIGEST_LAUNCH_JOBS jobs at most. */
static cudaError_t ls_digest_encode(const ls_digest_entry *h, int n, uint8_t *bytes, cudaStream_t s)
{
    for (int j0 = 0; j0 < n; j0 += LS_DIGEST_LAUNCH_JOBS) {
        int m = n - j0 < LS_DIGEST_LAUNCH_JOBS ? n - j0 : LS_DIGEST_LAUNCH_JOBS;
        uint64_t max_el = 0;
        for (int i = 0; i < m; i++)
            if (h[j0 + i].n[0] + h[j0 + i].n[1] > max_el) max_el = h[j0 + i].n[0] + h[j0 + i].n[1];
        if (max_el == 0) continue; /* nothing to encode, no padding */
        uint64_t bx = (max_el + 255) / 256;
        dim3 grid((unsigned)(bx < 64 ? bx : 64), (unsigned)m);
        if (m <= LS_DIGEST_LAUNCH_FEW) ls_digest_encode_launch<LS_DIGEST_LAUNCH_FEW>(h + j0, m, grid, bytes, s);
        else ls_digest_encode_launch<LS_DIGEST_LAUNCH_JOBS>(h + j0, m, grid, bytes, s);
        cudaError_t ce = cudaGetLastError();
        if (ce != cudaSuccess) return ce;
    }
    return cudaSuccess;
}

__global__ void ls_digest_hash_kernel(const ls_digest_entry *ent, int n_jobs, const uint8_t *bytes,
                                      uint8_t *digests)
{
    ls_pdl_entry();
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_jobs) return;
    if (ent[j].host) {
        /* the host hashes this one; its slot is copied back with the others,
         * so it holds zeros rather than bytes nothing wrote (initcheck) */
        for (int i = 0; i < 32; i++) digests[(uint64_t)j * 32 + i] = 0;
        return;
    }
    ls_sha256_device(bytes + ent[j].off, ent[j].len, digests + (uint64_t)j * 32);
}

/* Host hashing of the host jobs, their encoded bytes at staged[off]:
 * up to LS_HOST_HASH_THREADS threads, thread w taking the host jobs w, w + n,
 * ... in job order (each digest lands in its own slot, and a running hash
 * has one part per call, so the split changes nothing). A part that does not
 * end its hash leaves its slot alone. Returns the first job whose hash
 * failed, or -1. */
#define LS_HOST_HASH_THREADS 16

typedef struct ls_host_hash_work {
    const ls_digest_entry *ent;
    const ls_cuda_digest_job *jobs;
    int n_jobs, w, n_threads;
    const uint8_t *staged;
    ls_cuda_host_sha256_fn fn;
    uint8_t *digests;
    int failed; /* first failed job, or -1 */
} ls_host_hash_work;

static void *ls_host_hash_thread(void *arg)
{
    ls_host_hash_work *wk = (ls_host_hash_work *)arg;
    for (int i = 0, nth = 0; i < wk->n_jobs; i++) {
        if (!wk->ent[i].host) continue;
        if (nth++ % wk->n_threads != wk->w) continue;
        const ls_cuda_digest_job *j = &wk->jobs[i];
        uint8_t *out = !j->part || j->last ? wk->digests + 32 * (size_t)i : NULL;
        if (wk->fn(j->part, j->first, wk->staged + wk->ent[i].off, wk->ent[i].len, out) != 0) {
            wk->failed = i;
            break;
        }
    }
    return NULL;
}

/* Host threads for n_host jobs of `bytes` in all: one per 64 KiB at least
 * (starting a thread costs about as much as hashing 20 KB), at most one per
 * job, per core, and LS_HOST_HASH_THREADS. */
static int ls_host_threads(uint64_t bytes, int n_host)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t by_bytes = bytes / (64u << 10) + 1;
    int n = n_host < LS_HOST_HASH_THREADS ? n_host : LS_HOST_HASH_THREADS;
    if ((uint64_t)n > by_bytes) n = (int)by_bytes;
    if (cores >= 1 && n > cores) n = (int)cores;
    return n < 1 ? 1 : n;
}

static int ls_host_hash_jobs(const ls_digest_entry *ent, const ls_cuda_digest_job *jobs, int n_jobs,
                             const uint8_t *staged, uint64_t staged_bytes, int n_host,
                             ls_cuda_host_sha256_fn fn, uint8_t *digests)
{
    int n = ls_host_threads(staged_bytes, n_host);
    ls_host_hash_work wk[LS_HOST_HASH_THREADS];
    pthread_t th[LS_HOST_HASH_THREADS];
    int started[LS_HOST_HASH_THREADS] = {0};
    for (int w = 0; w < n; w++) {
        wk[w] = (ls_host_hash_work){ent, jobs, n_jobs, w, n, staged, fn, digests, -1};
        /* worker 0 runs on this thread; a thread that cannot start runs here too */
        started[w] = w > 0 && pthread_create(&th[w], NULL, ls_host_hash_thread, &wk[w]) == 0;
    }
    for (int w = 0; w < n; w++)
        if (!started[w]) ls_host_hash_thread(&wk[w]);
    int failed = -1;
    for (int w = 0; w < n; w++) {
        if (started[w]) pthread_join(th[w], NULL);
        if (wk[w].failed >= 0 && (failed < 0 || wk[w].failed < failed)) failed = wk[w].failed;
    }
    return failed;
}

/* The cost model of ls_cuda_digest_plan (seconds). Rates are conservative
 * round figures of what the H200 host measured (reports/perf-h200.md): one
 * GPU thread's SHA-256, a pageable download, one core's OpenSSL SHA-256. */
#define LS_DEV_SHA_BPS 40e6
#define LS_DEV_FIXED_S 10e-6  /* the two launches */
#define LS_LINK_BPS 8e9
#define LS_HOST_SHA_BPS 1e9
#define LS_THREAD_START_S 20e-6

static double ls_plan_device_s(uint64_t longest)
{
    return longest ? LS_DEV_FIXED_S + (double)longest / LS_DEV_SHA_BPS : 0;
}

static double ls_plan_host_s(uint64_t bytes, int n)
{
    if (!n) return 0;
    int th = ls_host_threads(bytes, n);
    return (double)bytes / LS_LINK_BPS + (double)bytes / (LS_HOST_SHA_BPS * th) + (th - 1) * LS_THREAD_START_S;
}

/* Estimated time of hashing jobs longer than `split` on the host and the rest
 * on the device, the two overlapped. */
static double ls_plan_s(const ls_cuda_digest_job *jobs, int n_jobs, uint64_t split)
{
    uint64_t longest_dev = 0, host_bytes = 0;
    int n_host = 0;
    for (int i = 0; i < n_jobs; i++) {
        uint64_t len = ls_job_bytes(&jobs[i]);
        if (len > split || jobs[i].part) {
            host_bytes += LS_ALIGN_UP(len, 16);
            n_host++;
        } else if (len > longest_dev) {
            longest_dev = len;
        }
    }
    double d = ls_plan_device_s(longest_dev), h = ls_plan_host_s(host_bytes, n_host);
    return d > h ? d : h;
}

extern "C" size_t ls_cuda_digest_plan(const ls_cuda_digest_job *jobs, int n_jobs, size_t split)
{
    const size_t plans[3] = {split, SIZE_MAX, 0};
    size_t best = split;
    double best_s = 0;
    for (int p = 0; p < 3; p++) {
        double t = ls_plan_s(jobs, n_jobs, plans[p]);
        if (p == 0 || t < best_s) best = plans[p], best_s = t;
    }
    return best;
}

extern "C" ls_status ls_cuda_digest(const ls_cuda_digest_job *jobs, int n_jobs, void *d_scratch,
                                    size_t scratch_bytes, size_t device_max_bytes,
                                    ls_cuda_host_sha256_fn host_sha256, uint8_t *h_digests,
                                    void *stream, ls_error *err)
{
    LS_CUDA_REQUIRE(n_jobs >= 0, err, "digest: n_jobs %d < 0", n_jobs);
    if (n_jobs == 0) return LS_OK;
    size_t dig_at, bytes_at, total;
    ls_digest_layout(jobs, n_jobs, &dig_at, &bytes_at, &total);
    LS_CUDA_REQUIRE(total <= scratch_bytes, err, "digest: scratch of %zu bytes, %zu needed",
                    scratch_bytes, total);
    ls_digest_entry *h = (ls_digest_entry *)malloc(sizeof *h * (size_t)n_jobs);
    if (!h) return ls_fail(err, LS_E_NOMEM, "digest: %d job entries", n_jobs);
    if (!host_sha256) device_max_bytes = SIZE_MAX;
    int n_host = 0; /* jobs the host hashes: the long ones and the parts */
    for (int i = 0; i < n_jobs; i++) {
        ls_entry_of(&jobs[i], &h[i]);
        h[i].host = jobs[i].part || h[i].len > device_max_bytes;
        n_host += (int)h[i].host;
    }
    if (n_host && !host_sha256) {
        free(h);
        return ls_fail(err, LS_E_INTERNAL, "digest: a part of a running hash without a host hash function");
    }
    int n_dev = n_jobs - n_host; /* jobs the device hashes */
    /* Encoded bytes: the host jobs first, so that one download fetches them
     * all, then the short ones (16-aligned each; the layout's total). */
    uint64_t off = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n_jobs; i++)
            if ((h[i].host != 0) == (pass == 0)) {
                h[i].off = off;
                off += LS_ALIGN_UP(h[i].len, 16);
            }
    uint64_t staged = 0; /* bytes of the host jobs' part */
    for (int i = 0; i < n_jobs; i++)
        if (h[i].host) staged = h[i].off + h[i].len;
    uint8_t *h_big = n_host ? (uint8_t *)malloc(staged ? staged : 1) : NULL;
    if (n_host && !h_big) {
        free(h);
        return ls_fail(err, LS_E_NOMEM, "digest: %llu bytes of host staging",
                       (unsigned long long)staged);
    }
    cudaStream_t s = (cudaStream_t)stream;
    uint8_t *base = (uint8_t *)d_scratch;
    ls_digest_entry *d_ent = (ls_digest_entry *)base;
    /* the encode launches take the table by value; only the device's hash
     * kernel reads it from device memory */
    cudaError_t ce = cudaSuccess;
    if (n_dev) ce = cudaMemcpyAsync(d_ent, h, sizeof *h * (size_t)n_jobs, cudaMemcpyHostToDevice, s);
    if (n_dev && ce == cudaSuccess) ce = cudaStreamSynchronize(s);
    if (ce != cudaSuccess) {
        free(h);
        free(h_big);
    }
    LS_CUDA_CHECK(ce, err, "digest: job table upload");
    ce = ls_digest_encode(h, n_jobs, base + bytes_at, s);
    /* The host jobs' bytes go to the host on a second stream that waits only
     * for the encoding, so the host hashes them while the device hashes the
     * short ones. */
    cudaStream_t s2 = NULL, hs = s; /* hs: the stream the host jobs' bytes come down on */
    cudaEvent_t encoded = NULL;
    if (ce == cudaSuccess && n_host && n_dev) { /* with nothing to overlap, stay on s */
        ce = cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
        if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&encoded, cudaEventDisableTiming);
        if (ce == cudaSuccess) ce = cudaEventRecord(encoded, s);
        if (ce == cudaSuccess) ce = cudaStreamWaitEvent(s2, encoded, 0);
        hs = s2;
    }
    if (ce == cudaSuccess && n_dev) {
        ls_launch(ls_digest_hash_kernel, (n_jobs + 63) / 64, 64, 0, s, d_ent, n_jobs, base + bytes_at,
                  base + dig_at);
        ce = cudaGetLastError();
    }
    int host_failed = -1;
    if (ce == cudaSuccess && n_host) {
        ce = cudaMemcpyAsync(h_big, base + bytes_at, staged, cudaMemcpyDeviceToHost, hs);
        if (ce == cudaSuccess) ce = cudaStreamSynchronize(hs);
        if (ce == cudaSuccess)
            host_failed = ls_host_hash_jobs(h, jobs, n_jobs, h_big, staged, n_host,
                                            host_sha256, h_digests);
    }
    /* The device's digests, one copy; the host jobs' slots keep the host's. */
    if (ce == cudaSuccess && host_failed < 0 && !n_host)
        ce = cudaMemcpyAsync(h_digests, base + dig_at, (size_t)n_jobs * 32, cudaMemcpyDeviceToHost, s);
    if (ce == cudaSuccess && host_failed < 0 && n_host && n_dev) {
        uint8_t *dev = (uint8_t *)malloc((size_t)n_jobs * 32);
        if (!dev) ce = cudaErrorMemoryAllocation;
        if (ce == cudaSuccess)
            ce = cudaMemcpyAsync(dev, base + dig_at, (size_t)n_jobs * 32, cudaMemcpyDeviceToHost, s);
        if (ce == cudaSuccess) ce = cudaStreamSynchronize(s);
        for (int i = 0; ce == cudaSuccess && i < n_jobs; i++)
            if (!h[i].host) memcpy(h_digests + 32 * (size_t)i, dev + 32 * (size_t)i, 32);
        free(dev);
    }
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(s);
    if (s2) cudaStreamDestroy(s2);
    if (encoded) cudaEventDestroy(encoded);
    free(h);
    free(h_big);
    if (host_failed >= 0)
        return ls_fail(err, LS_E_CRYPTO, "digest: host SHA-256 of job %d failed", host_failed);
    LS_CUDA_CHECK(ce, err, "digest: a kernel or copy faulted (run compute-sanitizer)");
    return LS_OK;
}

/* ---- staged (asynchronous) digests ------------------------------------------------- */

/* Stage: the jobs' encoded bytes (16-aligned each) in device memory. */
extern "C" size_t ls_cuda_digest_stage_job_bytes(const ls_cuda_digest_job *job)
{
    return LS_ALIGN_UP(ls_job_bytes(job), 16);
}

extern "C" size_t ls_cuda_digest_stage_bytes(const ls_cuda_digest_job *jobs, int n_jobs)
{
    size_t b = 0;
    for (int i = 0; i < n_jobs; i++) b += ls_cuda_digest_stage_job_bytes(&jobs[i]);
    return b;
}

extern "C" ls_status ls_cuda_digest_stage(const ls_cuda_digest_job *jobs, int n_jobs, void *d_bytes,
                                          uint64_t *off, uint64_t *len, void *stream, ls_error *err)
{
    LS_CUDA_REQUIRE(n_jobs > 0, err, "digest stage: n_jobs %d", n_jobs);
    ls_digest_entry h[LS_DIGEST_LAUNCH_JOBS];
    uint64_t at = 0;
    for (int j0 = 0; j0 < n_jobs; j0 += LS_DIGEST_LAUNCH_JOBS) {
        int m = n_jobs - j0 < LS_DIGEST_LAUNCH_JOBS ? n_jobs - j0 : LS_DIGEST_LAUNCH_JOBS;
        for (int i = 0; i < m; i++) {
            ls_entry_of(&jobs[j0 + i], &h[i]);
            h[i].off = at;
            off[j0 + i] = at;
            len[j0 + i] = h[i].len;
            at += LS_ALIGN_UP(h[i].len, 16);
        }
        LS_CUDA_CHECK(ls_digest_encode(h, m, (uint8_t *)d_bytes, (cudaStream_t)stream), err,
                      "digest stage: ls_digest_encode_kernel launch");
    }
    return LS_OK;
}
