/* lockstep — the fingerprint cache: the tensor digests of one safetensors
 * shard, keyed by the shard's file identity, so that re-pinning an unchanged
 * checkpoint need not read it again.
 *
 * One entry file per shard, at
 *
 *     <cache_dir>/fingerprint/<hex SHA-256 of the shard's canonical path>.fpc
 *
 * written to a temporary name in the same directory and renamed into place, so
 * concurrent writers (threads or processes) never leave a half-written entry
 * under the final name; the last rename wins and either entry is complete.
 *
 * Entry format, version 2; every integer little-endian:
 *
 *   offset  size  field
 *   0       8     magic "LSFPCACH"
 *   8       4     u32 version = 2
 *   12      4     u32 flags = 0 (reserved)
 *   16      8     u64 st_dev      \
 *   24      8     u64 st_ino       |  identity of the shard when hashed
 *   32      8     u64 st_size      |  (ls_file_identity)
 *   40      8     i64 mtime ns     |
 *   48      8     i64 ctime ns    /
 *   56      8     i64 hashed_at_ns: CLOCK_REALTIME_COARSE when hashing began
 *   64      4     u32 path length P (1 .. 4096)
 *   68      P     canonical absolute path of the shard (no NUL)
 *   68+P    8     u64 tensor count T
 *   then T records, in the shard's data order (the header's tensors, all of
 *   them, including those the checkpoint does not expose):
 *           4     u32 name length L (1 .. 1 MiB)
 *           L     name as stored in the file (no NUL)
 *           1     u8 dtype length K (1 .. 15)
 *           K     dtype, safetensors spelling ("BF16")
 *           1     u8 ndim (0 .. LS_TENSOR_MAX_DIMS)
 *           8*nd  u64 shape[d] (each <= INT64_MAX)
 *           8     u64 size_bytes
 *           8     u64 file_offset_bytes (absolute offset of the data in the shard)
 *           1     u8 has_digest (0 or 1)
 *           32    SHA-256 of the tensor's bytes (all zero when has_digest = 0)
 *           8     u64 first_nonfinite: index of the first element that is NaN
 *                 or an infinity, found in the same pass as the digest;
 *                 2^64 - 1 when there is none, and always when has_digest = 0
 *                 or the dtype has no such values (integers, BOOL); else
 *                 below the element count (size_bytes / dtype size)
 *   end-32  32    SHA-256 of every byte before it
 *
 * Version 1 (no first_nonfinite) was written before lockstep checked
 * finiteness; such an entry counts as absent (ls_fpcache_load) and is
 * replaced when its shard is hashed, since its digests were never paired
 * with a finiteness check.
 *
 * The reader is strict: wrong magic, another version, reserved bits set, a
 * field out of range, a short file, bytes after the checksum or a checksum
 * mismatch all reject the entry with a message naming the entry file and the
 * byte offset. The trailing checksum is what makes a torn or bit-flipped
 * entry (a crash before the data reached the disk, say) a rejection rather
 * than a wrong digest, which is why the writer does not fsync. */
#ifndef LS_FINGERPRINT_CACHE_H
#define LS_FINGERPRINT_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "fingerprint/sha256.h"
#include "io/checkpoint.h"

#define LS_FPCACHE_MAGIC "LSFPCACH"
#define LS_FPCACHE_VERSION 2u
#define LS_FPCACHE_ALL_FINITE UINT64_MAX /* first_nonfinite when there is none */
#define LS_FPCACHE_PATH_OFFSET 68u   /* byte offset of the path length field */
#define LS_FPCACHE_PATH_MAX_BYTES 4096u
#define LS_FPCACHE_NAME_MAX_BYTES (1u << 20)
#define LS_FPCACHE_ENTRY_MAX_BYTES ((size_t)1 << 30) /* far above any real shard's entry */

typedef struct ls_fpcache_tensor {
    char *name;                        /* name as stored in the shard; owned */
    ls_dtype dtype;
    int ndim;
    int64_t shape[LS_TENSOR_MAX_DIMS];
    uint64_t size_bytes;
    uint64_t file_offset_bytes;        /* absolute offset of the data in the shard */
    int has_digest;                    /* 1: digest is SHA-256 of the tensor's bytes */
    ls_digest digest;
    uint64_t first_nonfinite;          /* first NaN / Inf element, LS_FPCACHE_ALL_FINITE if none */
} ls_fpcache_tensor;

typedef struct ls_fpcache_entry {
    char *path;                        /* canonical absolute path of the shard; owned */
    ls_file_identity identity;         /* the shard's identity when it was hashed */
    int64_t hashed_at_ns;              /* CLOCK_REALTIME_COARSE when hashing began */
    size_t count;                      /* number of records */
    ls_fpcache_tensor *tensors;        /* [count], the shard's data order; owned */
} ls_fpcache_entry;

/* Releases what e owns and zeroes it. */
void ls_fpcache_entry_free(ls_fpcache_entry *e);

/* The entry file of a shard: "<cache_dir>/fingerprint/<hex>.fpc" where hex
 * is the SHA-256 of canonical_path. Returns a malloc'd string in *out (caller
 * frees). */
ls_status ls_fpcache_entry_path(const char *cache_dir, const char *canonical_path, char **out,
                                ls_error *err);

/* Serialises e (format above). *out is malloc'd (caller frees), *len its size. */
ls_status ls_fpcache_encode(const ls_fpcache_entry *e, uint8_t **out, size_t *len, ls_error *err);

/* Parses len bytes strictly into *out (caller frees with
 * ls_fpcache_entry_free). Failures are LS_E_INPUT with
 * "<label>: <what> (byte offset N)"; *out is left empty. */
ls_status ls_fpcache_decode(const char *label, const uint8_t *buf, size_t len,
                            ls_fpcache_entry *out, ls_error *err);

/* Reads and parses entry_path. No file, or an entry of an earlier format
 * version (magic right, version below LS_FPCACHE_VERSION): LS_OK with
 * *found = 0, so an upgrade costs one hash of each shard, not a warning
 * per shard. A file that
 * is not a regular file, is owned by another user (an entry is trusted input,
 * so only the user's own are read) or does not parse: a failure naming the
 * file and byte offset, *found = 0. */
ls_status ls_fpcache_load(const char *entry_path, ls_fpcache_entry *out, int *found,
                          ls_error *err);

/* Writes e to entry_path atomically (temporary name in the same directory,
 * then rename), creating missing directories (mode 0700). */
ls_status ls_fpcache_store(const char *entry_path, const ls_fpcache_entry *e, ls_error *err);

/* The clock that file timestamps are taken from (CLOCK_REALTIME_COARSE), ns. */
int64_t ls_fpcache_clock_ns(void);

/* 1 when a file with identity id, hashed from hashed_at_ns on, could have been
 * changed after that moment without its identity changing: its ctime is not
 * older than the start of hashing by at least the file system's timestamp
 * granularity (1 ns, or 2 s where ctime holds whole seconds, as on ext4 with
 * small inodes or FAT). The kernel stamps ctime from this same coarse clock on
 * every change, so for a file that is not racy any later change yields a
 * different ctime. A racy entry is never written and never trusted. */
int ls_fpcache_racy(const ls_file_identity *id, int64_t hashed_at_ns);

#endif
