/* lockstep — checkpoint fingerprints: per-tensor SHA-256, canonical config
 * digest, and a Merkle root over the sorted tensor list.
 *
 * The encodings are fixed so that another tool can recompute them; they are
 * specified in manifest/README.md ("Checkpoint fingerprint"):
 *
 *   tensor digest = SHA-256(tensor bytes as stored, little-endian)
 *   leaf bytes    = name || 0x00 || dtype || 0x00 || u32le(ndim)
 *                   || u64le(shape[0]) .. u64le(shape[ndim-1]) || tensor digest
 *   leaf hash     = SHA-256(0x00 || leaf bytes)
 *   node hash     = SHA-256(0x01 || left || right)
 *   level k+1     = pairs of level k in order; an odd last node is promoted
 *                   unchanged; the root is the single node left
 *   empty list    = SHA-256 of the empty string
 *
 * Leaves are ordered by normalised tensor name (byte order), so the root does
 * not depend on how tensors are split across shards or on the order inside a
 * file. */
#ifndef LS_FINGERPRINT_FINGERPRINT_H
#define LS_FINGERPRINT_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "fingerprint/sha256.h"
#include "io/checkpoint.h"

/* ---- one tensor ------------------------------------------------------------ */

typedef struct ls_tensor_fp {
    const char *name;                  /* normalised name; borrowed from the checkpoint */
    ls_dtype dtype;
    int ndim;
    int64_t shape[LS_TENSOR_MAX_DIMS];
    uint64_t size_bytes;
    ls_digest digest;                  /* SHA-256 of the tensor's bytes */
} ls_tensor_fp;

/* Digest of one Merkle leaf (see the encoding above). dtype is the
 * safetensors spelling ("BF16"). Fails with LS_E_USAGE on ndim out of range. */
ls_status ls_fingerprint_hash_leaf(const char *name, const char *dtype, int ndim,
                                   const int64_t *shape, const ls_digest *tensor_digest,
                                   ls_digest *out, ls_error *err);

/* Merkle root over n leaf digests in the given order (the caller sorts).
 * n = 0 gives SHA-256(""). */
ls_status ls_fingerprint_merkle_root(const ls_digest *leaves, size_t n, ls_digest *root,
                                     ls_error *err);

/* ---- config ---------------------------------------------------------------- */

/* Canonical JSON text of a jansson value (ls_json_canonical, io/json.h: keys
 * sorted by byte order, no whitespace, UTF-8, reals as "%.17g"). Returns a malloc'd string (caller frees) or NULL
 * and fills err. `json` is a json_t*. */
char *ls_fingerprint_canonical_json(const void *json, ls_error *err);

/* SHA-256 of ls_fingerprint_canonical_json(config). */
ls_status ls_fingerprint_hash_config(const void *config_json, ls_digest *out, ls_error *err);

/* ---- a whole checkpoint ---------------------------------------------------- */

typedef struct ls_fingerprint_opts {
    int threads;                       /* worker threads; <= 0 means online cores */
    int progress;                      /* 1: draw a progress bar when stderr is a terminal */
} ls_fingerprint_opts;

typedef struct ls_fingerprint {
    size_t count;                      /* number of tensors */
    ls_tensor_fp *tensors;             /* [count], sorted by name; owned (names borrowed) */
    ls_digest config_digest;           /* SHA-256 of canonical config.json */
    ls_digest merkle_root;             /* root over tensors[] (see above) */
    uint64_t total_bytes;              /* sum of tensor sizes */
    int threads_used;                  /* threads that hashed */
    uint64_t elapsed_ns;               /* wall time spent hashing tensors */
} ls_fingerprint;

/* Hashes every tensor of ck (streamed from the mapping, in parallel across
 * tensors), the config and the Merkle root. *out is filled on success and must
 * be released with ls_fingerprint_free; tensor names stay borrowed from ck, so
 * ck must outlive *out. opts may be NULL (defaults). */
ls_status ls_fingerprint_checkpoint(const ls_checkpoint *ck, const ls_fingerprint_opts *opts,
                                    ls_fingerprint *out, ls_error *err);
void ls_fingerprint_free(ls_fingerprint *fp);

/* Number of online CPU cores (at least 1). */
int ls_fingerprint_default_threads(void);

#endif
