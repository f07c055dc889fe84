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

#ifdef __cplusplus
}
#endif

#endif
