/* lockstep — trace internals shared by the writer, the streaming reader and
 * the index: byte layouts (docs/trace-format.md), little-endian helpers, a
 * small seq-id hash map, frame loading and record decoding. Not public. */
#ifndef LS_TRACE_TRACE_INTERNAL_H
#define LS_TRACE_TRACE_INTERNAL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/bytes.h"
#include "core/u32map.h"
#include "trace/trace.h"

/* ---- byte layouts (docs/trace-format.md) ---------------------------------- */
#define LS_TRACE_MAGIC "LSTRACE\0"            /* 8 bytes at offset 0 */
#define LS_TRACE_FILE_HEAD_BYTES 16           /* magic, major u16, minor u16, json_bytes u32 */
#define LS_TRACE_JSON_MAX_BYTES (16u << 20)
#define LS_TRACE_FRAME_MAGIC "LSFR"
#define LS_TRACE_FRAME_FIXED_BYTES 40         /* before the segment table */
#define LS_TRACE_SEGMENT_BYTES 12             /* seq u32, pos_first u32, n_pos u32 */
#define LS_TRACE_TRAILER_MAGIC "LSEN"
#define LS_TRACE_TRAILER_BYTES 96
#define LS_TRACE_RECORD_FIXED_BYTES 24        /* record_bytes, seq, pos, token, next, logprob */
#define LS_TRACE_DIGEST_ENTRY_BYTES 36        /* layer u16, kind u8, 0 u8, sha256[32] */
#define LS_TRACE_DUMP_HEAD_BYTES 8            /* layer u16, kind u8, dtype u8, n_elems u32 */
#define LS_TRACE_FRAME_KIND_COUNT 4


/* ---- file access (trace_file.c) ---------------------------------------------- */
/* A trace file opened read-only, read with pread() (never mapped: a mapped
 * file that shrinks raises SIGBUS, a read reports it). */
typedef struct ls_trace_file {
    int fd;                  /* -1 when closed */
    uint64_t bytes;          /* file size at open; every offset check uses it */
    uint8_t *win;            /* [LS_TRACE_FILE_WINDOW_BYTES] read-ahead for small views; owned */
    uint64_t win_off;        /* file offset of win[0] */
    size_t win_len;          /* valid bytes in win */
    const char *path;        /* for messages; not owned */
} ls_trace_file;

/* Views of at most this many bytes point into a read-ahead window of four
 * times the size, refilled by one pread: a frame's magic, fixed header,
 * segment table and small payload then cost one system call per window
 * instead of four per frame, and are copied once. Larger views are read
 * straight into the caller's buffer. */
#define LS_TRACE_FILE_SMALL_VIEW_BYTES (64u << 10)
#define LS_TRACE_FILE_WINDOW_BYTES (4 * LS_TRACE_FILE_SMALL_VIEW_BYTES)

/* Opens path, which must be a regular file (ls_file_open_regular: a FIFO or
 * device is refused, never read). `sequential`: read front to back once. */
ls_status ls_trace_file_open(const char *path, int sequential, ls_trace_file *f, ls_error *err);
/* Sets *out to bytes [off, off + len) of the file, which the caller has
 * checked lie inside it: read into the file's window (small views) or into
 * *buf (grown as needed, owned by the caller). Valid until the next view of
 * the same file or its close. A file that shrank since open fails with
 * LS_E_IO naming the path and the first missing offset. */
ls_status ls_trace_file_view(ls_trace_file *f, uint64_t off, size_t len, uint8_t **buf, size_t *cap,
                             const uint8_t **out, ls_error *err);
void ls_trace_file_close(ls_trace_file *f);

/* Grows a buffer whose contents need not survive growth to at least need
 * bytes; from 2 MiB up, 2 MiB aligned and offered to the kernel for huge
 * pages (a fresh multi-megabyte buffer otherwise costs a page fault per 4 KiB). */
ls_status ls_trace_grow_payload(uint8_t **p, size_t *cap, size_t need, ls_error *err);

/* ---- header ------------------------------------------------------------------ */
/* A parsed header with owned strings. */
typedef struct ls_trace_header_owned {
    ls_trace_header h;       /* pointers below */
    char *mode, *engine, *model_fingerprint, *manifest_digest, *run_params_json, *activation_dtype;
    ls_trace_layer *layers;  /* [h.n_layers] */
} ls_trace_header_owned;

/* ---- run_params (trace_params.c) ---------------------------------------------- */
/* Checks that json[0..len) is one JSON value, syntax only (RFC 8259, UTF-8),
 * and finds the value of the top-level object's member `key` (its first
 * spelling without escapes): *at and *value_len give its span, both 0 when
 * absent. Errors are LS_E_INPUT "<where>: header JSON: <why> at JSON byte N". */
ls_status ls_trace_json_locate(const char *json, size_t len, const char *key, size_t *at, size_t *value_len,
                               const char *where, ls_error *err);
/* LS_OK when text is a JSON object (syntax only), for the writer. */
ls_status ls_trace_run_params_check(const char *text, ls_error *err);

/* Serialises the header JSON (malloc'd, caller frees). Validates fields. */
ls_status ls_trace_header_to_json(const ls_trace_header *h, char **json, ls_error *err);
/* Parses and validates header JSON; `where` prefixes messages ("file: offset N"). */
ls_status ls_trace_header_from_json(const char *json, size_t len, ls_trace_header_owned *out,
                                    const char *where, ls_error *err);
void ls_trace_header_owned_free(ls_trace_header_owned *o);

/* Reads and verifies the file header; sets *end_offset to the first frame. */
ls_status ls_trace_read_file_header(ls_trace_file *f, ls_trace_header_owned *out, uint64_t *end_offset,
                                    ls_error *err);

/* ---- frames ---------------------------------------------------------------------- */
typedef struct ls_frame_seg {
    uint32_t seq, pos_first, n_pos;
} ls_frame_seg;

/* A frame's header, loaded (and optionally its payload decompressed). */
typedef struct ls_frame_buf {
    uint64_t offset;           /* byte offset of the frame in the file */
    uint64_t next_offset;      /* first byte after it */
    uint8_t kind;
    uint32_t frame_index, n_records, n_segments;
    uint64_t uncompressed_bytes, compressed_bytes;
    uint32_t payload_checksum; /* header copy of the payload's zstd content checksum */
    ls_frame_seg *segs; size_t segs_cap;          /* [n_segments] */
    uint8_t checksum[32];      /* header checksum as stored (verified on every load) */
    const uint8_t *comp;       /* [compressed_bytes] the payload, in comp_buf */
    uint8_t *head_buf; size_t head_cap;            /* frame header bytes as read */
    uint8_t *comp_buf; size_t comp_cap;            /* compressed payload as read */
    uint8_t *data; size_t data_cap;                /* uncompressed payload (reused across loads) */
    uint32_t *rec_off; size_t rec_off_cap;         /* [n_records] record offsets into data */
    void *dctx;                                    /* ZSTD_DCtx*, owned */
} ls_frame_buf;

/* ---- the layout rules (docs/trace-format.md, sections 4 to 6) ------------------- */
/* What the header says every record and frame must hold. */
typedef struct ls_trace_layout {
    const char *mode;                 /* static: "rollout", "replay" or "import" */
    uint32_t frame_kinds;             /* bit k set: frame kind k belongs to the mode */
    uint32_t kinds_mask;              /* digest_kinds */
    uint32_t state_every;             /* state_digest_every */
    int n_layers;
    const ls_trace_layer *layers;     /* [n_layers], not owned */
    uint32_t n_family[LS_FAMILY_COUNT]; /* layers of each family */
} ls_trace_layout;

void ls_trace_layout_init(ls_trace_layout *l, const ls_trace_header *h);
/* 1 when a layer of family f carries digest kind `kind` (section 6). */
int ls_trace_kind_allowed(ls_layer_family f, unsigned kind);
/* The kinds that a record at position pos with count[k] digests of kind k
 * (each valid for its layer's family, none repeated) lacks: -1 when none,
 * else the first kind some layer lacks (section 6: a kind in digest_kinds
 * appears at every position for every layer of a family that has it;
 * carried-state kinds at the positions state_digest_every names, and for
 * every gdn layer wherever they appear). */
int ls_trace_layout_missing_kind(const ls_trace_layout *l, uint32_t pos, const uint32_t count[LS_DIGEST_COUNT]);
/* "prefill", "decode", "chunk", "import", or "?". */
const char *ls_trace_frame_kind_name(unsigned kind);
/* "prefill and decode" ...: the frame kinds of a mode, for messages. */
const char *ls_trace_mode_frames(const ls_trace_layout *l);

/* Decoding context of one trace (header facts + scratch for one record). */
typedef struct ls_rec_decoder {
    ls_trace_layout lay;
    int topk;
    int n_layers;
    uint32_t kinds_mask;
    int lazy;                  /* 1: ls_frame_record leaves digests/dumps NULL until ls_rec_decoder_fill */
    ls_trace_record rec;
    ls_trace_digest *dg; size_t dg_cap;
    ls_trace_dump *dm; size_t dm_cap;
} ls_rec_decoder;

/* Reads the frame header at fb->offset and verifies its checksum. With
 * `payload`, also reads the payload, checks it is one zstd frame whose
 * content checksum matches the header's copy, decompresses it (zstd verifies
 * the content checksum) and validates every record; without it, skips
 * the payload. Errors name fb->offset. */
ls_status ls_frame_load(ls_trace_file *f, ls_frame_buf *fb, ls_rec_decoder *dec, int payload, ls_error *err);
void ls_frame_buf_free(ls_frame_buf *fb);

/* Decodes record i of a loaded frame into dec->rec. With dec->lazy, the
 * digest and dump arrays are left NULL (their counts and rec.raw are set):
 * a reader of raw bytes (the comparator's equal-record path) skips copying
 * them, and ls_rec_decoder_fill decodes them when needed. */
ls_status ls_frame_record(const ls_frame_buf *fb, ls_rec_decoder *dec, uint32_t i, ls_error *err);
/* Decodes the digests and dumps of dec->rec (a no-op when already done). */
ls_status ls_rec_decoder_fill(ls_rec_decoder *dec, ls_error *err);
/* Bytes before a record's digest array: the fixed fields, the top-k, the two counts. */
static inline size_t ls_trace_record_head_bytes(int topk) { return LS_TRACE_RECORD_FIXED_BYTES + 8 * (size_t)topk + 4; }

/* Sets the header facts of a decoder (the layout, top-k width, ...); h must
 * outlive it. */
void ls_rec_decoder_init(ls_rec_decoder *d, const ls_trace_header *h);
void ls_rec_decoder_free(ls_rec_decoder *d);

/* Checks that the 96 trailer bytes at `offset` are well formed and match the counts. */
ls_status ls_trace_check_trailer(const uint8_t t[LS_TRACE_TRAILER_BYTES], const char *path, uint64_t offset,
                                 uint64_t n_frames, uint64_t n_records, uint64_t bytes,
                                 const uint8_t chain[32], ls_error *err);

#endif
