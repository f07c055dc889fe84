/* lockstep — trace files: what one run produced, position by position.
 *
 * The byte format is specified in docs/trace-format.md; this header is the C
 * API. A trace is a header (run parameters, model fingerprint, manifest
 * digest, layer table, digest kinds, top-k width) followed by frames; a frame
 * holds the records of one engine step (a prefill, one decode step, or one
 * replay chunk). A record is addressed by (sequence id, absolute position), so
 * traces of differently-chunked runs align.
 *
 * Record semantics (both modes): the record at position p of a sequence holds
 * the token at p (the model's input), and the model's distribution after
 * reading tokens 0..p: the selected next token (the sampled one in rollout,
 * the teacher-forced one in replay; -1 when there is none), its logprob, and
 * the top-k. Layer digests are of the state after processing position p. */
#ifndef LS_TRACE_TRACE_H
#define LS_TRACE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "fingerprint/sha256.h"

#define LS_TRACE_TOPK_MAX 64
#define LS_TRACE_VERSION_MAJOR 1
#define LS_TRACE_VERSION_MINOR 0
/* Largest uncompressed frame a writer produces or a reader accepts. */
#define LS_TRACE_FRAME_MAX_BYTES ((uint64_t)256 << 20)

/* Families of the trace's layer table. A decoder layer contributes two trace
 * layers: its mixer (gdn or attention) and its moe block. */
typedef enum ls_layer_family {
    LS_FAMILY_EMBED,
    LS_FAMILY_GDN,
    LS_FAMILY_ATTENTION,
    LS_FAMILY_MOE,
    LS_FAMILY_NORM,          /* final norm */
    LS_FAMILY_LM_HEAD,
    LS_FAMILY_COUNT
} ls_layer_family;
const char *ls_layer_family_name(ls_layer_family f);

/* Digest kinds; canonical bytes of each are defined in docs/trace-format.md. */
typedef enum ls_digest_kind {
    LS_DIGEST_HIDDEN,        /* the trace layer's output hidden row, bf16 [D] (fp32 in fp32 mode) */
    LS_DIGEST_GDN_STATE,     /* GDN recurrent state after p, fp32 [H_v, d_k, d_v] */
    LS_DIGEST_CONV_STATE,    /* GDN conv state after p, [conv_dim, K-1] (activation dtype) */
    LS_DIGEST_KV,            /* K then V rows written to the cache at p */
    LS_DIGEST_ROUTER,        /* router top-k ids (int32 LE) then weights (fp32 LE) */
    LS_DIGEST_COUNT
} ls_digest_kind;
const char *ls_digest_kind_name(ls_digest_kind k);

typedef struct ls_trace_layer {
    int index;               /* position in the layer table, 0-based */
    ls_layer_family family;
    int decoder_layer;       /* model layer index, -1 for embed/norm/lm_head */
} ls_trace_layer;

/* Everything in the header besides the layer table. Strings are owned by the
 * caller for the writer, by the reader for the reader. */
typedef struct ls_trace_header {
    uint32_t version_major, version_minor;   /* filled by the writer */
    const char *mode;                  /* "rollout" | "replay" | "import" */
    const char *engine;                /* "lockstep-cpu", "lockstep-cuda", "vllm", ... */
    const char *model_fingerprint;     /* Merkle root hex (64 chars) */
    const char *manifest_digest;       /* SHA-256 hex of the pinned manifest, or "" */
    const char *run_params_json;       /* JSON object text: sampling, chunk size, batch,
                                          perturbation, activations ... Opaque to the
                                          format: checked as JSON syntax only, read and
                                          written byte for byte (ls_trace_run_params_parse
                                          reads fields from it) */
    int topk;                          /* top-k width, 1..LS_TRACE_TOPK_MAX (default 5) */
    uint32_t digest_kinds_mask;        /* bit k set: kind k is carried, by every record for
                                          every layer of a family that has it (docs/trace-format.md §6) */
    uint32_t state_digest_every;       /* carried-state kinds recorded every N positions (1 = all) */
    int n_layers;
    const ls_trace_layer *layers;      /* [n_layers] */
    const char *activation_dtype;      /* "bf16" (NULL means bf16) or "fp32": dtype of
                                          hidden/conv/KV canonical bytes */
} ls_trace_header;

/* One digest of one trace layer at one position. */
typedef struct ls_trace_digest {
    uint16_t layer;                    /* index into the layer table */
    uint8_t kind;                      /* ls_digest_kind */
    ls_digest digest;
} ls_trace_digest;

/* An optional full tensor (--dump-layers) for element-level diagnosis. */
typedef struct ls_trace_dump {
    uint16_t layer;
    uint8_t kind;                      /* ls_digest_kind the tensor belongs to */
    uint8_t dtype;                     /* ls_dump_dtype */
    uint32_t n_elems;
    const void *data;                  /* the kind's canonical bytes: n_elems elements,
                                          little-endian (router: k int32 ids, then k fp32) */
} ls_trace_dump;

typedef enum ls_dump_dtype {
    LS_DUMP_BF16 = 0,
    LS_DUMP_FP32 = 1,
    LS_DUMP_ROUTER = 2                 /* n_elems = 2k: int32 ids [k] then fp32 weights [k] */
} ls_dump_dtype;
/* Bytes per element of a dump dtype (0 for an unknown dtype). */
size_t ls_dump_dtype_size(unsigned dtype);

typedef struct ls_trace_record {
    uint32_t seq;                      /* sequence id */
    uint32_t pos;                      /* absolute position in the sequence */
    int32_t token;                     /* token at pos */
    int32_t next_token;                /* selected next token, -1 if none */
    uint32_t logprob_bits;             /* fp32 bits of log p(next_token); 0x7fc00000 if none */
    int32_t topk_ids[LS_TRACE_TOPK_MAX];
    uint32_t topk_logprob_bits[LS_TRACE_TOPK_MAX];
    uint32_t n_digests;
    const ls_trace_digest *digests;    /* [n_digests], ordered by (layer, kind) */
    uint32_t n_dumps;
    const ls_trace_dump *dumps;        /* [n_dumps] */
    /* Filled by the reader only (ignored by the writer): the record's encoded
     * bytes as stored in the frame; two records with equal bytes are equal. */
    const uint8_t *raw;
    uint32_t raw_bytes;
    uint32_t digests_at;               /* byte offset of the digest array in raw */
    uint32_t frame_index;              /* frame the record came from */
    uint64_t frame_offset;             /* byte offset of that frame in the file */
} ls_trace_record;

typedef enum ls_frame_kind {
    LS_FRAME_PREFILL,
    LS_FRAME_DECODE,
    LS_FRAME_CHUNK,
    LS_FRAME_IMPORT
} ls_frame_kind;

/* ---- writer -----------------------------------------------------------------
 * Streams frames to "<path>.tmp.<pid>"; memory is bounded by one frame.
 * ls_trace_writer_close writes the trailer and renames into place. A process
 * killed mid-way leaves the temporary file, readable up to its last complete
 * frame. */
typedef struct ls_trace_writer ls_trace_writer;

ls_status ls_trace_writer_open(const char *path, const ls_trace_header *hdr,
                               ls_trace_writer **out, ls_error *err);
ls_status ls_trace_writer_begin_frame(ls_trace_writer *w, ls_frame_kind kind, ls_error *err);
/* Copies the record (and its digests/dumps) into the open frame. */
ls_status ls_trace_writer_add(ls_trace_writer *w, const ls_trace_record *rec, ls_error *err);
ls_status ls_trace_writer_end_frame(ls_trace_writer *w, ls_error *err);
/* Writes the trailer, renames into place and frees w. */
ls_status ls_trace_writer_close(ls_trace_writer *w, ls_error *err);
/* Removes the temporary file and frees w. */
void ls_trace_writer_abort(ls_trace_writer *w);

/* ---- reader -------------------------------------------------------------------
 * Streaming: one frame in memory at a time. */
typedef struct ls_trace_reader ls_trace_reader;

ls_status ls_trace_reader_open(const char *path, ls_trace_reader **out, ls_error *err);
const ls_trace_header *ls_trace_reader_header(const ls_trace_reader *r);
/* Advances to the next record. Sets *rec (valid until the next call) and
 * returns LS_OK, or sets *rec = NULL at the end. Corruption and truncation
 * are LS_E_INPUT naming the byte offset; a file that ends cleanly after a
 * complete frame but without a trailer ends with *rec = NULL and
 * ls_trace_reader_complete() == 0. A file that another process shortens
 * while it is open is LS_E_IO naming the first missing byte (traces are read
 * with pread, never mapped, so this is an error and not SIGBUS). */
ls_status ls_trace_reader_next(ls_trace_reader *r, const ls_trace_record **rec, ls_error *err);
int ls_trace_reader_complete(const ls_trace_reader *r);
/* Counts so far (after the end: totals). */
uint64_t ls_trace_reader_frames(const ls_trace_reader *r);
uint64_t ls_trace_reader_records(const ls_trace_reader *r);
/* Uncompressed record bytes read so far. */
uint64_t ls_trace_reader_bytes(const ls_trace_reader *r);
void ls_trace_reader_close(ls_trace_reader *r);

/* ---- record access for comparators ---------------------------------------------
 * A reader or index set lazy leaves a record's digests and dumps undecoded
 * (NULL, counts set) until ..._load_digests is called for the current record:
 * a comparator that finds two records' bytes equal never copies them. */
void ls_trace_reader_set_lazy(ls_trace_reader *r, int lazy);
ls_status ls_trace_reader_load_digests(ls_trace_reader *r, ls_error *err);
/* 1 when two records read from traces of the same layout (top-k width,
 * digest kinds) have identical encoded bytes, i.e. are equal in every field. */
int ls_trace_record_bytes_equal(const ls_trace_record *a, const ls_trace_record *b);
/* 1 when two read records carry identical digest arrays (same (layer, kind)
 * list, same digests), compared on the encoded bytes, without decoding. */
int ls_trace_record_digests_equal(const ls_trace_record *a, const ls_trace_record *b);
/* Layer of digest i (< n_digests) of a read record, without decoding. */
int ls_trace_record_digest_layer(const ls_trace_record *r, uint32_t i);

/* ---- indexed access ---------------------------------------------------------
 * Random access by (seq, pos) for the comparator. Opening scans the frame
 * headers only (payloads are skipped, not read) and keeps, per sequence, the
 * list of (first position, count, frame) segments; frames are read,
 * checksum-verified (first use only), decompressed and kept in a small cache
 * (at most LS_TRACE_INDEX_CACHE_FRAMES frames). Memory: the segment table plus
 * the cache, independent of record bytes. */
#define LS_TRACE_INDEX_CACHE_FRAMES 8
typedef struct ls_trace_index ls_trace_index;

ls_status ls_trace_index_open(const char *path, ls_trace_index **out, ls_error *err);
const ls_trace_header *ls_trace_index_header(const ls_trace_index *ix);
int ls_trace_index_complete(const ls_trace_index *ix);
/* Looks up (seq, pos): *rec is the record (valid until the next find or
 * close) or NULL when the trace has no such record. */
ls_status ls_trace_index_find(ls_trace_index *ix, uint32_t seq, uint32_t pos,
                              const ls_trace_record **rec, ls_error *err);
/* Sequences in the trace (ascending), and the number of positions of one. */
size_t ls_trace_index_n_seqs(const ls_trace_index *ix);
uint32_t ls_trace_index_seq(const ls_trace_index *ix, size_t i);
uint64_t ls_trace_index_seq_positions(const ls_trace_index *ix, uint32_t seq);
/* Largest position of seq + 1 (0 if absent). */
uint32_t ls_trace_index_seq_end(const ls_trace_index *ix, uint32_t seq);
/* Smallest position >= from that seq has in the trace, or -1 (segment table
 * only: loads no frame). */
int64_t ls_trace_index_next_pos(const ls_trace_index *ix, uint32_t seq, uint32_t from);
/* Total records. */
uint64_t ls_trace_index_records(const ls_trace_index *ix);
/* Verifies the checksum of every frame not loaded so far. Call it before
 * trusting a result built from the index: until then a corrupted segment
 * table in a frame never loaded would go unnoticed. */
ls_status ls_trace_index_verify(ls_trace_index *ix, ls_error *err);
void ls_trace_index_close(ls_trace_index *ix);
void ls_trace_index_set_lazy(ls_trace_index *ix, int lazy);
ls_status ls_trace_index_load_digests(ls_trace_index *ix, ls_error *err);

/* Parses a header's run_params_json for a reader that needs some of its
 * fields (docs/trace-format.md, section 3). run_params is opaque to the
 * format, so any JSON object is valid there; this parse keeps every value a
 * strict parser would refuse: an integer outside int64 or a number beyond
 * double range becomes a string holding its text ("18446744073709551615"),
 * and "\u0000" is allowed in strings (json_string_length counts it). A key
 * that repeats in one object is an error. Returns a new reference (a JSON
 * object; json_decref it) or NULL with err filled. Include <jansson.h> to
 * use it. */
struct json_t;
struct json_t *ls_trace_run_params_parse(const char *run_params_json, ls_error *err);

/* Parses a family / digest-kind name; returns -1 when unknown. */
int ls_layer_family_parse(const char *name);
int ls_digest_kind_parse(const char *name);

#endif
