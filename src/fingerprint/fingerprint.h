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
 * file. Every tensor of the checkpoint has a leaf: the exposed ones under
 * their normalised names and the skipped ones (vision tower "model.visual.*",
 * MTP head "mtp.*", io/checkpoint.h) under their stored names, so a changed
 * skipped tensor changes the root although the model never reads it. */
#ifndef LS_FINGERPRINT_FINGERPRINT_H
#define LS_FINGERPRINT_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "fingerprint/sha256.h"
#include "io/checkpoint.h"

/* ---- one tensor ------------------------------------------------------------ */

#define LS_FP_ALL_FINITE UINT64_MAX    /* ls_tensor_fp.first_nonfinite when there is none */

typedef struct ls_tensor_fp {
    const char *name;                  /* normalised name (stored name of a skipped tensor);
                                          borrowed from the checkpoint */
    int skipped;                       /* 1: a family skipped on purpose (vision tower, MTP
                                          head): fingerprinted, never read by the model, and
                                          its non-finite elements are not refused */
    ls_dtype dtype;
    int ndim;
    int64_t shape[LS_TENSOR_MAX_DIMS];
    uint64_t size_bytes;
    ls_digest digest;                  /* SHA-256 of the tensor's bytes */
    uint64_t first_nonfinite;          /* index of the first NaN / infinite element, found in
                                          the hashing pass (or its cache entry);
                                          LS_FP_ALL_FINITE when none (integer dtypes too). A
                                          successful fingerprint has none in any tensor that
                                          is not skipped. */
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

/* The fingerprint cache, kept apart from ls_fingerprint_opts so that callers
 * initialising that struct positionally ({threads, progress}) still compile
 * warning-free. */
typedef struct ls_fingerprint_cache_opts {
    const char *dir;                   /* cache root (see ls_fingerprint_checkpoint_cached);
                                          NULL or "": no cache, every tensor is hashed and
                                          nothing is stored */
    int refresh;                       /* 1: ignore cached digests, hash every tensor, and
                                          store fresh entries (when dir is set) */
} ls_fingerprint_cache_opts;

typedef struct ls_fingerprint {
    size_t count;                      /* number of tensors, skipped ones included */
    ls_tensor_fp *tensors;             /* [count], sorted by name; owned (names borrowed) */
    ls_digest config_digest;           /* SHA-256 of canonical config.json */
    ls_digest merkle_root;             /* root over tensors[] (see above) */
    uint64_t total_bytes;              /* sum of tensor sizes, skipped ones included */
    int threads_used;                  /* threads that hashed (0 when nothing was hashed) */
    uint64_t elapsed_ns;               /* wall time spent hashing tensors */
    /* What was verified. A shard is counted once, as hashed or as cached;
     * shards holding no fingerprinted tensor are in neither count.
     * files_hashed + files_cached = shards read or looked up, and
     * bytes_hashed + bytes_cached = total_bytes. */
    size_t files_hashed;               /* shards whose tensors were read and hashed now */
    size_t files_cached;               /* shards whose digests came from the cache */
    uint64_t bytes_hashed;             /* tensor bytes read and hashed now */
    uint64_t bytes_cached;             /* tensor bytes whose digests came from the cache */
    size_t cache_entries_written;      /* entries stored (or refreshed) by this call */
} ls_fingerprint;

/* Hashes every tensor of ck, the skipped ones included (streamed from the
 * mapping, in parallel across tensors), the config and the Merkle root. The
 * same pass checks that every element of every floating-point tensor (BF16,
 * F16, F32, F64, F8) the model reads is finite (skipped tensors are hashed,
 * not checked: the model never reads them, so their values reach no
 * output): a NaN or an infinity fails with LS_E_INPUT naming the shard, the
 * first such tensor in name order, the element's index, its bits and its
 * byte offset (cache entries are stored first, so a second call refuses
 * from the cache). *out is filled on success and must
 * be released with ls_fingerprint_free; tensor names stay borrowed from ck, so
 * ck must outlive *out. opts may be NULL (defaults). No cache is used: this is
 * ls_fingerprint_checkpoint_cached with cache = NULL.
 *
 * It only reads ck, so it may run on a worker thread while other threads read
 * the same checkpoint's mapping. */
ls_status ls_fingerprint_checkpoint(const ls_checkpoint *ck, const ls_fingerprint_opts *opts,
                                    ls_fingerprint *out, ls_error *err);

/* The same, taking the digests of unchanged shards from the fingerprint cache
 * under cache->dir and storing those it hashed (fingerprint/cache.h has the
 * entry format). cache may be NULL (no cache). Reads only ck and the cache
 * directory, so it too may run on a worker thread beside readers of ck.
 *
 * A shard's digests are taken from its entry, instead of reading the shard,
 * only when all of these hold:
 *   - the shard's path still names the mapped file with the identity it had
 *     when opened: same device, inode, size, mtime and ctime (ns);
 *   - the entry records that same identity and that same canonical path;
 *   - hashing for the entry began after the file's last change
 *     (ls_fpcache_racy), so no later change can have kept the identity;
 *   - the entry's tensor list equals the shard's current header (names,
 *     dtypes, shapes, sizes, offsets) and holds a digest for every tensor the
 *     fingerprint covers in that shard (skipped ones included; an entry
 *     written when skipped tensors were not hashed lacks theirs, so it
 *     misses once and is rewritten).
 * A cached digest therefore means "this file has the same identity (device,
 * inode, size, mtime, ctime) as when lockstep hashed it", not that its bytes
 * were read again: a change that leaves all five as they were (a write to the
 * block device beneath the file system, a clock set back, a forged ctime)
 * goes unseen until a refresh. files_cached / bytes_cached say how much of a
 * result rests on that.
 *
 * An entry that is malformed, truncated, of another format or version, not
 * owned by the user or made for another path is never trusted: a one-line
 * warning names it and the byte offset, the shard is hashed and the entry
 * rewritten. A cache directory that cannot be created or written costs one
 * warning per call; the result is unaffected. After hashing, an entry is
 * stored only when the shard kept its identity from before hashing to after
 * it and is not racy.
 *
 * config.json is always digested afresh from the bytes read at open: it is
 * parsed in memory, so a cached digest would save microseconds and prove less.
 *
 * Digests, leaves and root are the same whether they come from the cache or
 * from hashing; only the counts and elapsed_ns differ. */
ls_status ls_fingerprint_checkpoint_cached(const ls_checkpoint *ck,
                                           const ls_fingerprint_opts *opts,
                                           const ls_fingerprint_cache_opts *cache,
                                           ls_fingerprint *out, ls_error *err);
void ls_fingerprint_free(ls_fingerprint *fp);

/* The default cache root: $LOCKSTEP_CACHE_DIR if set and non-empty, else
 * $XDG_CACHE_HOME/lockstep if XDG_CACHE_HOME is an absolute path, else
 * $HOME/.cache/lockstep if HOME is set and non-empty; NULL when none can be
 * formed. Returns a malloc'd string (caller frees). Nothing is created. */
char *ls_fingerprint_default_cache_dir(void);

/* Number of online CPU cores (at least 1). */
int ls_fingerprint_default_threads(void);

#endif
