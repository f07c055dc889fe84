/* lockstep — Hugging Face checkpoints: safetensors files, sharded indexes,
 * config.json.
 *
 * A checkpoint is a directory holding config.json and either model.safetensors
 * or model.safetensors.index.json plus its shards. Files are mmap'ed read-only;
 * tensor data is never copied. Each mapping is registered with
 * ls_map_register (core/util.h) while it is open, so the CLI's SIGBUS handler
 * can name a shard another process cut short (exit 2); the library itself
 * installs no handler. Every header is validated strictly before any
 * tensor is handed out (see docs/checkpoint-io.md for the rules); a failure
 * names the file, the tensor and the byte offset.
 *
 * Tensor names are normalised on open: the Qwen3.5 prefix
 * "model.language_model." becomes "model."; tensors under "model.visual." and
 * "mtp." (the vision tower and the multi-token-prediction head, which text
 * decoding never reads) are skipped: not exposed to the model, but still
 * fingerprinted under their stored names (fingerprint/fingerprint.h), and
 * listed by ls_checkpoint_ignored_at with ls_checkpoint_skip_reason so a
 * manifest can say what was left out and why. Routed experts may be stored per
 * expert (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight) or fused
 * (experts.gate_up_proj [E, 2I, D], experts.down_proj [E, D, I]);
 * ls_checkpoint_expert() hides the difference. */
#ifndef LS_IO_CHECKPOINT_H
#define LS_IO_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum ls_dtype {
    LS_DTYPE_BF16,
    LS_DTYPE_F16,
    LS_DTYPE_F32,
    LS_DTYPE_F64,
    LS_DTYPE_F8_E4M3,
    LS_DTYPE_F8_E5M2,
    LS_DTYPE_I8,
    LS_DTYPE_U8,
    LS_DTYPE_I16,
    LS_DTYPE_I32,
    LS_DTYPE_I64,
    LS_DTYPE_BOOL,
    LS_DTYPE_COUNT
} ls_dtype;

/* Bytes per element. */
size_t ls_dtype_size(ls_dtype dt);
/* safetensors spelling: "BF16", "F32", "F8_E4M3" ... */
const char *ls_dtype_name(ls_dtype dt);
/* Parses the safetensors spelling; returns 0 and sets *out, or -1 if unknown. */
int ls_dtype_parse(const char *name, ls_dtype *out);
/* The bits of one element (little-endian, as an unsigned integer of the
 * element's width) that are all set exactly when the element is NaN or an
 * infinity: the exponent field for the IEEE-like types, all of 0x7F for
 * F8_E4M3 (the "fn" variant, whose only non-finite values are the two
 * NaNs). The sign bit is never in it. 0 for types without such values
 * (integers, BOOL). */
uint64_t ls_dtype_nonfinite_mask(ls_dtype dt);

#define LS_TENSOR_MAX_DIMS 8

typedef struct ls_tensor {
    const char *name;                  /* normalised name; owned by the checkpoint */
    const char *stored_name;           /* name as written in the file */
    ls_dtype dtype;
    int ndim;
    int64_t shape[LS_TENSOR_MAX_DIMS];
    uint64_t numel;                    /* product of shape (1 for a scalar) */
    const void *data;                  /* mmap'ed bytes, little-endian, size_bytes long; NOT
                                          necessarily aligned (safetensors does not require the
                                          header length to be a multiple of 8): memcpy elements */
    uint64_t size_bytes;
    uint64_t file_offset_bytes;        /* absolute offset of data in its file (0 generated) */
    int shard;                         /* index into ls_checkpoint_shard_path(); -1 for a
                                          generated tensor (data NULL: ls_checkpoint_stream) */
    size_t source_index;               /* generated: the tensor's index in its source's list */
} ls_tensor;

/* ---- file identity -----------------------------------------------------------
 * What stat(2) says about a file, as much as a cache keyed by file identity
 * needs (fingerprint/cache.h). Equal identities mean "same device, inode,
 * size, modification and status-change time", not "same bytes". */
typedef struct ls_file_identity {
    uint64_t dev;                      /* st_dev */
    uint64_t ino;                      /* st_ino */
    uint64_t size_bytes;               /* st_size */
    int64_t mtime_ns;                  /* st_mtim, ns since the epoch */
    int64_t ctime_ns;                  /* st_ctim, ns since the epoch (set by the kernel on
                                          every change to the file; not settable by users) */
} ls_file_identity;

/* stat(2)s path (symlinks followed). LS_E_IO naming path on failure. */
ls_status ls_file_identity_stat(const char *path, ls_file_identity *out, ls_error *err);
/* 1 when every field is equal. */
int ls_file_identity_equal(const ls_file_identity *a, const ls_file_identity *b);

/* ---- single safetensors file --------------------------------------------- */

typedef struct ls_safetensors ls_safetensors;

/* Maps and validates one safetensors file. *out is owned by the caller. */
ls_status ls_safetensors_open(const char *path, ls_safetensors **out, ls_error *err);
/* Validates a header held in memory (whole file image of file_len bytes); used
 * by tests and the fuzzer. Same rules and messages as ls_safetensors_open.
 * image is borrowed: it must outlive *out (tensor data points into it). */
ls_status ls_safetensors_open_mem(const char *label, const void *image, size_t file_len,
                                  ls_safetensors **out, ls_error *err);
/* The path (or label) the file was opened with; owned by st. */
const char *ls_safetensors_label(const ls_safetensors *st);
/* Identity of the file st maps, taken by fstat(2) on the descriptor that was
 * mapped, so it describes the mapped file even if its path has since been
 * replaced; NULL for ls_safetensors_open_mem. Owned by st. */
const ls_file_identity *ls_safetensors_identity(const ls_safetensors *st);
size_t ls_safetensors_count(const ls_safetensors *st);
const ls_tensor *ls_safetensors_at(const ls_safetensors *st, size_t i); /* data order */
const ls_tensor *ls_safetensors_find(const ls_safetensors *st, const char *name);
/* __metadata__ entries (string map), sorted by key; strings owned by st. */
size_t ls_safetensors_metadata_count(const ls_safetensors *st);
void ls_safetensors_metadata_at(const ls_safetensors *st, size_t i, const char **key,
                                const char **value);
void ls_safetensors_close(ls_safetensors *st);

/* ---- writer (synthetic checkpoints, tests) -------------------------------
 * Collects tensors and writes one safetensors file atomically. Data pointers
 * must stay valid until ls_safetensors_writer_write returns. Tensors are laid
 * out in name order (byte order of the names), 8-byte aligned header. */
typedef struct ls_safetensors_writer ls_safetensors_writer;
ls_status ls_safetensors_writer_new(ls_safetensors_writer **out, ls_error *err);
ls_status ls_safetensors_writer_add(ls_safetensors_writer *w, const char *name, ls_dtype dt,
                                    int ndim, const int64_t *shape, const void *data,
                                    ls_error *err);
ls_status ls_safetensors_writer_set_metadata(ls_safetensors_writer *w, const char *key,
                                             const char *value, ls_error *err);
ls_status ls_safetensors_writer_write(ls_safetensors_writer *w, const char *path, ls_error *err);
void ls_safetensors_writer_free(ls_safetensors_writer *w);

/* ---- checkpoint directory -------------------------------------------------- */

typedef struct ls_checkpoint ls_checkpoint;

/* Opens dir: config.json plus model.safetensors or model.safetensors.index.json
 * and its shards, all validated (docs/checkpoint-io.md lists the rules and
 * messages). *out is owned by the caller; every pointer obtained from it
 * (tensors, names, data, paths, config) lives until ls_checkpoint_close. */
ls_status ls_checkpoint_open(const char *dir, ls_checkpoint **out, ls_error *err);
void ls_checkpoint_close(ls_checkpoint *ck);

const char *ls_checkpoint_dir(const ls_checkpoint *ck);
/* config.json parsed with duplicate keys rejected (io/json.h); a jansson
 * json_t* (cast it), borrowed, always an object. */
const void *ls_checkpoint_config_json(const ls_checkpoint *ck);
/* Raw bytes of config.json as read (for digests that want the file as is). */
const char *ls_checkpoint_config_text(const ls_checkpoint *ck, size_t *len);

/* Exposed tensors, sorted by normalised name (byte order). */
size_t ls_checkpoint_count(const ls_checkpoint *ck);
const ls_tensor *ls_checkpoint_at(const ls_checkpoint *ck, size_t i);
/* NULL when absent. */
const ls_tensor *ls_checkpoint_find(const ls_checkpoint *ck, const char *name);
/* Position of t among the exposed tensors (ls_checkpoint_at(ck, i) == t), or
 * (size_t)-1 when t is not one of ck's exposed tensors. O(log n). */
size_t ls_checkpoint_index(const ls_checkpoint *ck, const ls_tensor *t);
/* 1 when a tensor stored under this name belongs to a family skipped on
 * purpose: "model.visual." (vision tower) or "mtp." (multi-token-prediction
 * head). */
int ls_checkpoint_name_skipped(const char *stored_name);
/* Why a tensor stored under this name is skipped (one line, static), or NULL
 * when it is not. */
const char *ls_checkpoint_skip_reason(const char *stored_name);
/* The skipped (visual / mtp) tensors, sorted by stored name (byte order);
 * name == stored_name, data points into the mapping like any tensor's. NULL
 * past the end. Owned by ck. No exposed tensor's normalised name equals a
 * skipped stored name (such a checkpoint is refused on open), so the two
 * lists merge into one name-ordered list without duplicates. */
size_t ls_checkpoint_ignored_count(const ls_checkpoint *ck);
const ls_tensor *ls_checkpoint_ignored_at(const ls_checkpoint *ck, size_t i);

size_t ls_checkpoint_shard_count(const ls_checkpoint *ck);
const char *ls_checkpoint_shard_path(const ls_checkpoint *ck, size_t i);
/* The opened shard i (its __metadata__, data-order tensors); owned by ck. */
const ls_safetensors *ls_checkpoint_shard(const ls_checkpoint *ck, size_t i);
uint64_t ls_checkpoint_total_bytes(const ls_checkpoint *ck); /* sum of exposed tensors' sizes
                                                                (skipped ones not included) */

/* ---- generated checkpoints ---------------------------------------------------
 * A checkpoint whose tensors are not in files but produced on demand, byte
 * for byte what a written checkpoint would hold (lockstep synth's
 * generator, synth/synth.h ls_synth_checkpoint): it has a config.json text,
 * a tensor table and no shards, and every tensor's data is NULL. Its bytes
 * come only through ls_checkpoint_stream; the fingerprint hashes them from
 * there, so a generated checkpoint and the same tensors written to disk have
 * one Merkle root. Nothing maps or caches it. */

/* Receives a tensor's bytes in order, piece by piece. */
typedef ls_status (*ls_tensor_sink_fn)(void *ctx, const void *bytes, size_t n, ls_error *err);

typedef struct ls_tensor_source {
    /* Streams the stored bytes of tensor `index` (of the list given to
     * ls_checkpoint_open_generated) to sink, in pieces of whole elements.
     * May be called from several threads at once. */
    ls_status (*stream)(void *ctx, size_t index, ls_tensor_sink_fn sink, void *sink_ctx, ls_error *err);
    void (*release)(void *ctx);        /* frees ctx when the checkpoint closes; may be NULL */
    void *ctx;
} ls_tensor_source;

/* A generated checkpoint named `label` (what ls_checkpoint_dir returns and
 * messages name) with config.json `config_text` and the n tensors of
 * `tensors` (stored_name, dtype, ndim, shape, numel, size_bytes read; names
 * copied; normalised as a file's are). The checkpoint owns src->ctx from the
 * call on, failure included. */
ls_status ls_checkpoint_open_generated(const char *label, const char *config_text, size_t config_len,
                                       const ls_tensor *tensors, size_t n, const ls_tensor_source *src,
                                       ls_checkpoint **out, ls_error *err);

/* 1 when ck was made by ls_checkpoint_open_generated. */
int ls_checkpoint_generated(const ls_checkpoint *ck);

/* The stored bytes of t (one of ck's tensors) to sink, in order, in pieces
 * of whole elements: from the mapping in pieces of LS_CHECKPOINT_PIECE_BYTES
 * (one call, of 0 bytes, for an empty tensor), or from the source of a
 * generated tensor. A sink's failure ends the stream with its status. */
#define LS_CHECKPOINT_PIECE_BYTES ((size_t)8 << 20)
ls_status ls_checkpoint_stream(const ls_checkpoint *ck, const ls_tensor *t, ls_tensor_sink_fn sink,
                               void *sink_ctx, ls_error *err);

/* A 2-D weight matrix view [rows, cols], row-major, dtype as stored. */
typedef struct ls_matrix_view {
    const void *data;          /* first element of row 0 */
    ls_dtype dtype;
    int64_t rows, cols;
    const char *source;        /* tensor name it came from (for messages) */
} ls_matrix_view;

typedef enum ls_expert_proj {
    LS_EXPERT_GATE,            /* [I, D] */
    LS_EXPERT_UP,              /* [I, D] */
    LS_EXPERT_DOWN             /* [D, I] */
} ls_expert_proj;

/* Finds routed expert `expert` of decoder layer `layer` in either layout
 * (normalised names):
 *   per expert: model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
 *   fused:      model.layers.L.mlp.experts.gate_up_proj [E, 2I, D]
 *               (per expert, rows 0..I-1 gate, I..2I-1 up) and
 *               model.layers.L.mlp.experts.down_proj [E, D, I].
 * The view points into the mapping (borrowed, valid until close). Fails
 * (LS_E_INPUT, naming the tensor and expected vs actual shape) when absent,
 * mis-shaped, out of range or stored in both layouts; LS_E_USAGE for negative
 * layer/expert. */
ls_status ls_checkpoint_expert(const ls_checkpoint *ck, int layer, int expert,
                               ls_expert_proj proj, ls_matrix_view *out, ls_error *err);

#endif
