/* lockstep — SHA-256 on the GPU (C API).
 *
 * Digests of device buffers without copying them to the host: per-token rows
 * (hidden states), arbitrary spans, and a two-level Merkle digest of one large
 * buffer (GDN state, KV rows). Every digest is exactly FIPS 180-4 SHA-256, the
 * bytes OpenSSL's EVP_sha256 (ls_sha256_buf) produces for the same input;
 * tests/gpu/test_sha256 checks that for every length 0..300 and large buffers.
 *
 * Digests are written to device memory, 32 bytes each, big-endian as the
 * standard writes them (the layout of ls_digest.bytes). `stream` is a
 * cudaStream_t (NULL = default stream); calls are asynchronous. */
#ifndef LS_KERNELS_SHA256_H
#define LS_KERNELS_SHA256_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/status.h"

/* n_rows digests of equal-length rows: row r is the row_bytes bytes starting at
 * d_data + r * stride_bytes. One thread per row. */
ls_status ls_cuda_sha256_rows(const void *d_data,    /* device bytes */
                              size_t row_bytes, size_t stride_bytes, int n_rows,
                              uint8_t *d_digests,    /* device [n_rows][32] */
                              void *stream, ls_error *err);

/* n digests of arbitrary spans of one device allocation: span i is
 * d_lens[i] bytes at d_base + d_offsets[i]. */
ls_status ls_cuda_sha256_spans(const void *d_base,
                               const uint64_t *d_offsets, /* device [n] */
                               const uint64_t *d_lens,    /* device [n] */
                               int n,
                               uint8_t *d_digests,        /* device [n][32] */
                               void *stream, ls_error *err);

/* Merkle digest of one device buffer, computed on the device:
 *   leaf_i = SHA-256(bytes [i*leaf_bytes, min((i+1)*leaf_bytes, n_bytes)))
 *            for i = 0 .. n_leaves-1, n_leaves = max(1, ceil(n_bytes / leaf_bytes))
 *   root   = SHA-256(leaf_0 || leaf_1 || ... || leaf_{n_leaves-1})   (32 bytes each)
 * An empty buffer has one empty leaf. d_scratch must hold n_leaves * 32 bytes
 * (ls_cuda_merkle_scratch_bytes). The leaves run in parallel, one thread each;
 * the root is one thread. leaf_bytes must be a positive multiple of 64. */
size_t ls_cuda_merkle_scratch_bytes(size_t n_bytes, size_t leaf_bytes);
ls_status ls_cuda_merkle_sha256(const void *d_data, size_t n_bytes, size_t leaf_bytes,
                                uint8_t *d_scratch,   /* device, scratch_bytes */
                                uint8_t *d_root,      /* device [32] */
                                void *stream, ls_error *err);


/* ---- digests of encoded activation spans (the backend's digest op) ---------
 * A job hashes the concatenation of up to two spans of 4-byte elements
 * (fp32 or int32) in device memory, each encoded either as bf16 (bf16 = 1:
 * the fp32 value rounded to bf16 by ls_f32_to_bf16, 2 bytes little-endian) or
 * raw (bf16 = 0: the 4 bytes as stored, little-endian). The digest equals
 * SHA-256 of the same canonical bytes built on the host (the CPU backend).
 * A span is n elements read row by row (rows of row_len elements whose
 * starts are stride elements apart). A span with n = 0 contributes nothing
 * (src may then be NULL). */
typedef struct ls_cuda_digest_job {
    const void *src[2];          /* device: first element of row 0 */
    uint64_t n[2];               /* elements of each span (all its rows) */
    uint64_t row_len[2];         /* elements per row; 0 = one contiguous row of n */
    uint64_t stride[2];          /* elements between row starts (row_len > 0) */
    uint8_t bf16[2];             /* 1 = bf16 encoding, 0 = raw 4 bytes */
    void *part;                  /* NULL: a whole digest. Else one part of a running hash
                                    (the host_sha256 function's, opaque here), always hashed
                                    on the host: a hash's parts are submitted in order, one
                                    per call at most, and hashed in that order */
    uint8_t first, last;         /* with part: it starts / ends the hash (only the last has
                                    a digest) */
} ls_cuda_digest_job;

/* Device scratch ls_cuda_digest needs for these jobs (bytes). */
size_t ls_cuda_digest_scratch_bytes(const ls_cuda_digest_job *jobs, int n_jobs);

/* Host SHA-256 for the jobs too long to hash well with one GPU thread
 * (SHA-256 is serial within a message: one thread does roughly 50 MB/s, a CPU
 * core with SHA extensions 1-2 GB/s) and for the parts of running hashes.
 * part NULL: the digest of data into out. Else data continues the running
 * hash `part` (a job's), started when first, ended into out when out is not
 * NULL. Returns 0 on success. */
typedef int (*ls_cuda_host_sha256_fn)(void *part, int first, const void *data, size_t len, uint8_t *out);

/* Where to hash these jobs: the device_max_bytes for ls_cuda_digest that
 * its cost model expects to finish first among three plans (jobs longer than
 * `split` on the host and the rest on the device; all on the device,
 * SIZE_MAX; all on the host, 0). The device hashes every job at once, one
 * thread each, so its time is the longest job's (~40 MB/s per thread); the
 * host's is the download plus OpenSSL on up to 16 threads (~1 GB/s each).
 * A decode step's few 4 KB rows go to the host (~5 us against ~100 us on one
 * GPU thread); a prefill's thousands of rows to the device. The digests are
 * the same whichever plan runs. */
size_t ls_cuda_digest_plan(const ls_cuda_digest_job *jobs /* host [n_jobs] */, int n_jobs, size_t split);

/* Encodes every job's spans on the device (one launch) and hashes each job of
 * at most device_max_bytes encoded bytes with one GPU thread (one launch);
 * longer jobs (when host_sha256 is not NULL) are downloaded encoded (one copy,
 * while the device hashes the short ones) and hashed by host_sha256 on up to
 * 16 host threads at once, so host_sha256 must be thread-safe
 * (device_max_bytes = SIZE_MAX, or host_sha256 NULL: all on the device;
 * ls_cuda_digest_plan picks device_max_bytes). Copies the n_jobs x 32 digest
 * bytes to the host (synchronous).
 * d_scratch: device memory of ls_cuda_digest_scratch_bytes. */
ls_status ls_cuda_digest(const ls_cuda_digest_job *jobs /* host [n_jobs] */, int n_jobs,
                         void *d_scratch, size_t scratch_bytes, size_t device_max_bytes,
                         ls_cuda_host_sha256_fn host_sha256,
                         uint8_t *h_digests /* host [n_jobs][32] */, void *stream, ls_error *err);

/* ---- staged digests: the device encodes, the host hashes, asynchronously ----
 * ls_cuda_digest_stage enqueues on `stream` the encoding of every job's
 * canonical bytes into d_bytes (device memory of ls_cuda_digest_stage_bytes):
 * a launch per 32 jobs, the jobs' table passed by value (nothing read from
 * host memory), no copy, nothing waits. Once the stream has passed it, job
 * i's encoded bytes are the len[i] bytes at d_bytes + off[i], for the caller
 * to download. Every byte of the stage is written (each job padded to 16
 * with zeros), so the stages of adjacent regions may be downloaded in one
 * copy. d_bytes must stay untouched until the stream is past the launches. */
size_t ls_cuda_digest_stage_bytes(const ls_cuda_digest_job *jobs, int n_jobs);
/* One job's encoded bytes (a multiple of 16). */
size_t ls_cuda_digest_stage_job_bytes(const ls_cuda_digest_job *job);
ls_status ls_cuda_digest_stage(const ls_cuda_digest_job *jobs /* host [n_jobs] */, int n_jobs, void *d_bytes,
                               uint64_t *off /* [n_jobs] */, uint64_t *len /* [n_jobs] */, void *stream,
                               ls_error *err);

/* An asynchronous digester (kernels/digest_async.cu): a ring of device and
 * pinned host memory, and host threads that hash what the device encoded.
 * submit stages the jobs (waiting only when the ring is full) and returns;
 * several submits may share one download, flushed by the next wait at the
 * latest; each job's digest lands in outs[i] (32 bytes) by the next wait,
 * which returns the first failure since the last wait. submit and wait are
 * called from one thread. The jobs' spans are read in stream order, so later
 * work on the stream may overwrite them at once. A job whose stage exceeds
 * half the ring is refused (LS_E_UNSUPPORTED): the caller hashes it with
 * ls_cuda_digest. destroy waits first. mark names the submits so far, and
 * wait_for completes those alone (later submits may still be hashing), with
 * the first failure since the last wait of either kind. */
typedef struct ls_cuda_digester ls_cuda_digester;
ls_status ls_cuda_digester_create(void *d_ring, size_t ring_bytes, int n_threads,
                                  ls_cuda_host_sha256_fn host_sha256, ls_cuda_digester **out,
                                  ls_error *err);
ls_status ls_cuda_digester_submit(ls_cuda_digester *d, const ls_cuda_digest_job *jobs,
                                  uint8_t *const *outs, int n_jobs, void *stream, ls_error *err);
/* Jobs whose canonical bytes (ls_cuda_digest_stage) work enqueued on stream
 * before the call writes into device memory: job i's are len[i] bytes at
 * d_bytes + off[i] once the stream is past that work. The digester
 * downloads the `bytes` bytes at d_bytes into pinned host memory h_bytes on
 * its copy stream, after that point of stream (which does not wait for it),
 * and hashes them there. Whole jobs only (no parts); hashed and waited for
 * as submitted ones; d_bytes and h_bytes must stay untouched until a wait
 * covers them. */
ls_status ls_cuda_digester_submit_staged(ls_cuda_digester *d, const uint8_t *d_bytes, uint8_t *h_bytes,
                                         size_t bytes, const uint64_t *off, const uint64_t *len,
                                         uint8_t *const *outs, int n_jobs, void *stream, ls_error *err);
ls_status ls_cuda_digester_wait(ls_cuda_digester *d, ls_error *err);
uint64_t ls_cuda_digester_mark(const ls_cuda_digester *d);
ls_status ls_cuda_digester_wait_for(ls_cuda_digester *d, uint64_t mark, ls_error *err);
void ls_cuda_digester_destroy(ls_cuda_digester *d);

#ifdef __cplusplus
}
#endif

#endif
