/* lockstep — streaming trace reader and the (seq, pos) index. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "trace/trace_internal.h"

/* Per-sequence position tracking: positions must increase through the file. */
typedef struct seq_track {
    ls_u32map map;           /* seq -> index */
    uint32_t *next_min;      /* [n] smallest position allowed next */
    size_t n, cap;
} seq_track;

static ls_status track_segment(seq_track *t, const ls_frame_seg *s, uint32_t *index_out, const char *path,
                               uint64_t off, uint32_t frame, ls_error *err)
{
    uint32_t i;
    if (ls_u32map_get(&t->map, s->seq, &i)) {
        if (s->pos_first < t->next_min[i])
            return ls_fail(err, LS_E_INPUT,
                           "%s: offset %" PRIu64 ": frame %u: seq %u pos %u repeats or goes back (positions of a sequence "
                           "must increase through the trace)", path, off, frame, s->seq, s->pos_first);
    } else {
        if (t->n == t->cap) {
            size_t nc = t->cap ? t->cap * 2 : 64;
            uint32_t *q = realloc(t->next_min, nc * sizeof *q);
            if (!q) return ls_fail_nomem(err, nc * sizeof *q, "trace: table of %zu sequences", nc);
            t->next_min = q;
            t->cap = nc;
        }
        i = (uint32_t)t->n++;
        LS_TRY(ls_u32map_put(&t->map, s->seq, i, err));
    }
    t->next_min[i] = s->pos_first + s->n_pos;
    if (index_out) *index_out = i;
    return LS_OK;
}

static void track_free(seq_track *t)
{
    ls_u32map_free(&t->map);
    free(t->next_min);
    memset(t, 0, sizeof *t);
}

/* ---- streaming reader ------------------------------------------------------------- */
struct ls_trace_reader {
    ls_trace_file f;
    char *path;
    uint64_t file_bytes, offset;   /* offset: next frame/trailer */
    uint8_t *buf; size_t buf_cap;  /* magic and trailer bytes as read */
    ls_trace_header_owned hdr;
    ls_frame_buf fb;
    ls_rec_decoder dec;
    uint32_t next_rec;             /* in fb; fb->n_records when exhausted */
    int have_frame, done, complete;
    uint64_t n_frames, n_records, bytes;
    ls_sha256 chain;
    int chain_open;
    seq_track track;
};

ls_status ls_trace_reader_open(const char *path, ls_trace_reader **out, ls_error *err)
{
    *out = NULL;
    ls_trace_reader *r = calloc(1, sizeof *r);
    if (!r) return ls_fail_nomem(err, sizeof *r, "%s: trace reader", path);
    r->path = strdup(path);
    r->f.fd = -1;
    ls_status st = r->path ? ls_trace_file_open(r->path, 1, &r->f, err)
                           : ls_fail_nomem(err, strlen(path) + 1, "%s: trace reader", path);
    r->file_bytes = r->f.bytes;
    if (!st) st = ls_trace_read_file_header(&r->f, &r->hdr, &r->offset, err);
    if (!st) st = ls_sha256_init(&r->chain, err);
    if (st) {
        ls_trace_reader_close(r);
        return st;
    }
    r->chain_open = 1;
    ls_rec_decoder_init(&r->dec, &r->hdr.h);
    *out = r;
    return LS_OK;
}

const ls_trace_header *ls_trace_reader_header(const ls_trace_reader *r) { return &r->hdr.h; }
int ls_trace_reader_complete(const ls_trace_reader *r) { return r->complete; }
uint64_t ls_trace_reader_frames(const ls_trace_reader *r) { return r->n_frames; }
uint64_t ls_trace_reader_records(const ls_trace_reader *r) { return r->n_records; }
uint64_t ls_trace_reader_bytes(const ls_trace_reader *r) { return r->bytes; }

/* Reads what follows a frame boundary: a frame (loaded into r->fb), the
 * trailer (sets done/complete), or nothing (done, incomplete). */
static ls_status next_frame(ls_trace_reader *r, ls_error *err)
{
    r->have_frame = 0;
    uint64_t left = r->file_bytes - r->offset;
    if (left == 0) {
        r->done = 1;
        r->complete = 0;
        return LS_OK;
    }
    const uint8_t *magic, *t;
    if (left < 4)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": truncated: %" PRIu64 " stray bytes after the last frame",
                       r->path, r->offset, left);
    LS_TRY(ls_trace_file_view(&r->f, r->offset, 4, &r->buf, &r->buf_cap, &magic, err));
    if (memcmp(magic, LS_TRACE_TRAILER_MAGIC, 4) == 0) {
        if (left < LS_TRACE_TRAILER_BYTES)
            return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": trailer truncated: needs %d bytes, file ends at %" PRIu64,
                           r->path, r->offset, LS_TRACE_TRAILER_BYTES, r->file_bytes);
        LS_TRY(ls_trace_file_view(&r->f, r->offset, LS_TRACE_TRAILER_BYTES, &r->buf, &r->buf_cap, &t, err));
        ls_digest chain;
        r->chain_open = 0;
        LS_TRY(ls_sha256_final(&r->chain, &chain, err));
        LS_TRY(ls_trace_check_trailer(t, r->path, r->offset, r->n_frames, r->n_records, r->bytes, chain.bytes, err));
        if (left > LS_TRACE_TRAILER_BYTES)
            return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": %" PRIu64 " unexpected bytes after the trailer", r->path,
                           r->offset + LS_TRACE_TRAILER_BYTES, left - LS_TRACE_TRAILER_BYTES);
        r->done = 1;
        r->complete = 1;
        return LS_OK;
    }
    if (memcmp(magic, LS_TRACE_FRAME_MAGIC, 4) != 0)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": expected a frame (LSFR) or the trailer (LSEN), found %02x %02x %02x %02x",
                       r->path, r->offset, magic[0], magic[1], magic[2], magic[3]);
    r->fb.offset = r->offset;
    LS_TRY(ls_frame_load(&r->f, &r->fb, &r->dec, 1, err));
    if (r->fb.frame_index != r->n_frames)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame index %u, expected %" PRIu64, r->path, r->offset,
                       r->fb.frame_index, r->n_frames);
    for (uint32_t i = 0; i < r->fb.n_segments; i++)
        LS_TRY(track_segment(&r->track, &r->fb.segs[i], NULL, r->path, r->offset, r->fb.frame_index, err));
    LS_TRY(ls_sha256_update(&r->chain, r->fb.checksum, 32, err));
    r->n_frames++;
    r->n_records += r->fb.n_records;
    r->bytes += r->fb.uncompressed_bytes;
    r->offset = r->fb.next_offset;
    r->have_frame = 1;
    r->next_rec = 0;
    return LS_OK;
}

ls_status ls_trace_reader_next(ls_trace_reader *r, const ls_trace_record **rec, ls_error *err)
{
    *rec = NULL;
    while (!r->done) {
        if (r->have_frame && r->next_rec < r->fb.n_records) {
            ls_status st = ls_frame_record(&r->fb, &r->dec, r->next_rec++, err);
            if (st) return st;
            *rec = &r->dec.rec;
            return LS_OK;
        }
        LS_TRY(next_frame(r, err));
    }
    return LS_OK;
}

void ls_trace_reader_set_lazy(ls_trace_reader *r, int lazy) { r->dec.lazy = lazy != 0; }
ls_status ls_trace_reader_load_digests(ls_trace_reader *r, ls_error *err) { return ls_rec_decoder_fill(&r->dec, err); }

void ls_trace_reader_close(ls_trace_reader *r)
{
    if (!r) return;
    ls_trace_file_close(&r->f);
    free(r->buf);
    if (r->chain_open) ls_sha256_discard(&r->chain);
    ls_frame_buf_free(&r->fb);
    ls_rec_decoder_free(&r->dec);
    ls_trace_header_owned_free(&r->hdr);
    track_free(&r->track);
    free(r->path);
    free(r);
}

/* ---- index ---------------------------------------------------------------------------- */
typedef struct ix_seg {
    uint32_t pos_first, n_pos;
    uint32_t frame;          /* frame number */
    uint32_t rec_first;      /* index of the segment's first record in its frame */
} ix_seg;

typedef struct ix_seq {
    uint32_t seq;
    ix_seg *segs; size_t n, cap;   /* ascending positions */
    uint64_t positions;
} ix_seq;

typedef struct ix_slot {
    ls_frame_buf fb;
    int64_t frame;           /* -1 when empty */
    uint64_t used;           /* LRU clock */
} ix_slot;

struct ls_trace_index {
    ls_trace_file f;
    char *path;
    uint64_t file_bytes;
    uint8_t *buf; size_t buf_cap;  /* magic and trailer bytes as read */
    ls_trace_header_owned hdr;
    int complete;
    uint64_t *frame_off; size_t n_frames, frame_cap;
    uint8_t *verified;       /* [frame_cap] 1 once the frame's payload was checked (decompressed) */
    seq_track track;         /* seq -> index into seqs */
    ix_seq *seqs; size_t seqs_cap;
    uint32_t *sorted;        /* seqs ascending */
    uint64_t n_records;
    ls_rec_decoder dec;
    ix_slot slots[LS_TRACE_INDEX_CACHE_FRAMES];
    uint64_t clock;
};

ls_status ls_trace_index_open(const char *path, ls_trace_index **out, ls_error *err)
{
    *out = NULL;
    ls_trace_index *ix = calloc(1, sizeof *ix);
    if (!ix) return ls_fail_nomem(err, sizeof *ix, "%s: trace index", path);
    for (int i = 0; i < LS_TRACE_INDEX_CACHE_FRAMES; i++) ix->slots[i].frame = -1;
    ix->path = strdup(path);
    uint64_t off = 0, bytes = 0;
    ls_frame_buf fb = {0};
    ls_sha256 chain;
    int chain_open = 0;
    ix->f.fd = -1;
    ls_status st = ix->path ? ls_trace_file_open(ix->path, 0, &ix->f, err)
                            : ls_fail_nomem(err, strlen(path) + 1, "%s: trace index", path);
    ix->file_bytes = ix->f.bytes;
    if (!st) st = ls_trace_read_file_header(&ix->f, &ix->hdr, &off, err);
    if (!st) st = ls_sha256_init(&chain, err);
    if (!st) chain_open = 1;
    ls_rec_decoder_init(&ix->dec, &ix->hdr.h);
    while (!st) {
        uint64_t left = ix->file_bytes - off;
        if (left == 0) break; /* incomplete */
        const uint8_t *magic, *t;
        if (left < 4) {
            st = ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": truncated: %" PRIu64 " stray bytes after the last frame",
                         path, off, left);
            break;
        }
        if ((st = ls_trace_file_view(&ix->f, off, 4, &ix->buf, &ix->buf_cap, &magic, err))) break;
        if (memcmp(magic, LS_TRACE_TRAILER_MAGIC, 4) == 0) {
            ls_digest cd;
            if (left < LS_TRACE_TRAILER_BYTES) {
                st = ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": trailer truncated: needs %d bytes, file ends at %" PRIu64,
                             path, off, LS_TRACE_TRAILER_BYTES, ix->file_bytes);
                break;
            }
            if ((st = ls_trace_file_view(&ix->f, off, LS_TRACE_TRAILER_BYTES, &ix->buf, &ix->buf_cap, &t, err))) break;
            chain_open = 0;
            st = ls_sha256_final(&chain, &cd, err);
            if (!st) st = ls_trace_check_trailer(t, path, off, ix->n_frames, ix->n_records, bytes, cd.bytes, err);
            if (st == LS_E_INPUT) {
                /* Name the corrupted frame, when it is one, rather than the trailer. */
                ls_error frame_err;
                if (ls_trace_index_verify(ix, &frame_err) != LS_OK && err) *err = frame_err;
            }
            if (!st && left > LS_TRACE_TRAILER_BYTES)
                st = ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": %" PRIu64 " unexpected bytes after the trailer", path,
                             off + LS_TRACE_TRAILER_BYTES, left - LS_TRACE_TRAILER_BYTES);
            if (!st) ix->complete = 1;
            break;
        }
        if (memcmp(magic, LS_TRACE_FRAME_MAGIC, 4) != 0) {
            st = ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": expected a frame (LSFR) or the trailer (LSEN), found %02x %02x %02x %02x",
                         path, off, magic[0], magic[1], magic[2], magic[3]);
            break;
        }
        fb.offset = off;
        /* Headers only (their checksums are verified here); each payload is
         * verified when it is loaded, and ls_trace_index_verify checks the
         * ones never loaded. */
        if ((st = ls_frame_load(&ix->f, &fb, &ix->dec, 0, err))) break;
        if (fb.frame_index != ix->n_frames) {
            st = ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame index %u, expected %zu", path, off, fb.frame_index,
                         ix->n_frames);
            break;
        }
        if (ix->n_frames == ix->frame_cap) {
            size_t nc = ix->frame_cap ? ix->frame_cap * 2 : 64;
            uint64_t *q = realloc(ix->frame_off, nc * sizeof *q);
            if (q) ix->frame_off = q;
            uint8_t *v = realloc(ix->verified, nc);
            if (v) ix->verified = v;
            if (!q || !v) { st = ls_fail_nomem(err, nc * (sizeof *q + 1), "%s: index of %zu frames", path, nc); break; }
            ix->frame_cap = nc;
        }
        ix->frame_off[ix->n_frames] = off;
        ix->verified[ix->n_frames] = 0;
        uint32_t rec_first = 0;
        for (uint32_t i = 0; i < fb.n_segments && !st; i++) {
            uint32_t si;
            size_t before = ix->track.n;
            st = track_segment(&ix->track, &fb.segs[i], &si, path, off, fb.frame_index, err);
            if (st) break;
            if (ix->track.n > before && si >= ix->seqs_cap) {
                size_t nc = ix->seqs_cap ? ix->seqs_cap * 2 : 64;
                ix_seq *q = realloc(ix->seqs, nc * sizeof *q);
                if (!q) { st = ls_fail_nomem(err, nc * sizeof *q, "%s: index of %zu sequences", path, nc); break; }
                memset(q + ix->seqs_cap, 0, (nc - ix->seqs_cap) * sizeof *q);
                ix->seqs = q;
                ix->seqs_cap = nc;
            }
            ix_seq *s = &ix->seqs[si];
            s->seq = fb.segs[i].seq;
            if (s->n == s->cap) {
                size_t nc = s->cap ? s->cap * 2 : 8;
                ix_seg *q = realloc(s->segs, nc * sizeof *q);
                if (!q) { st = ls_fail_nomem(err, nc * sizeof *q, "%s: index of %zu segments", path, nc); break; }
                s->segs = q;
                s->cap = nc;
            }
            s->segs[s->n++] = (ix_seg){fb.segs[i].pos_first, fb.segs[i].n_pos, (uint32_t)ix->n_frames, rec_first};
            s->positions += fb.segs[i].n_pos;
            rec_first += fb.segs[i].n_pos;
        }
        if (st) break;
        if (!st) st = ls_sha256_update(&chain, fb.checksum, 32, err);
        ix->n_frames++;
        ix->n_records += fb.n_records;
        bytes += fb.uncompressed_bytes;
        off = fb.next_offset;
    }
    if (chain_open) ls_sha256_discard(&chain);
    ls_frame_buf_free(&fb);
    if (!st) {
        ix->sorted = malloc((ix->track.n ? ix->track.n : 1) * sizeof *ix->sorted);
        if (!ix->sorted)
            st = ls_fail_nomem(err, (ix->track.n ? ix->track.n : 1) * sizeof *ix->sorted, "%s: sorted index", path);
    }
    if (st) {
        ls_trace_index_close(ix);
        return st;
    }
    /* Insertion sort is fine for batch-sized sequence counts; use qsort-like shell sort for safety. */
    size_t n = ix->track.n;
    for (size_t i = 0; i < n; i++) ix->sorted[i] = (uint32_t)i;
    for (size_t gap = n / 2; gap > 0; gap /= 2)
        for (size_t i = gap; i < n; i++)
            for (size_t j = i; j >= gap && ix->seqs[ix->sorted[j - gap]].seq > ix->seqs[ix->sorted[j]].seq; j -= gap) {
                uint32_t t = ix->sorted[j];
                ix->sorted[j] = ix->sorted[j - gap];
                ix->sorted[j - gap] = t;
            }
    *out = ix;
    return LS_OK;
}

const ls_trace_header *ls_trace_index_header(const ls_trace_index *ix) { return &ix->hdr.h; }
int ls_trace_index_complete(const ls_trace_index *ix) { return ix->complete; }
size_t ls_trace_index_n_seqs(const ls_trace_index *ix) { return ix->track.n; }
uint32_t ls_trace_index_seq(const ls_trace_index *ix, size_t i) { return ix->seqs[ix->sorted[i]].seq; }
uint64_t ls_trace_index_records(const ls_trace_index *ix) { return ix->n_records; }

uint64_t ls_trace_index_seq_positions(const ls_trace_index *ix, uint32_t seq)
{
    uint32_t i;
    return ls_u32map_get(&ix->track.map, seq, &i) ? ix->seqs[i].positions : 0;
}

uint32_t ls_trace_index_seq_end(const ls_trace_index *ix, uint32_t seq)
{
    uint32_t i;
    if (!ls_u32map_get(&ix->track.map, seq, &i) || !ix->seqs[i].n) return 0;
    const ix_seg *g = &ix->seqs[i].segs[ix->seqs[i].n - 1];
    return g->pos_first + g->n_pos;
}

/* Index of the first segment of s with pos_first > pos. */
static size_t seg_after(const ix_seq *s, uint32_t pos)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->segs[mid].pos_first <= pos) lo = mid + 1; else hi = mid;
    }
    return lo;
}

int64_t ls_trace_index_next_pos(const ls_trace_index *ix, uint32_t seq, uint32_t from)
{
    uint32_t si;
    if (!ls_u32map_get(&ix->track.map, seq, &si)) return -1;
    const ix_seq *s = &ix->seqs[si];
    size_t i = seg_after(s, from);
    if (i > 0 && from < s->segs[i - 1].pos_first + s->segs[i - 1].n_pos) return from;
    return i < s->n ? (int64_t)s->segs[i].pos_first : -1;
}

ls_status ls_trace_index_find(ls_trace_index *ix, uint32_t seq, uint32_t pos, const ls_trace_record **rec, ls_error *err)
{
    *rec = NULL;
    uint32_t si;
    if (!ls_u32map_get(&ix->track.map, seq, &si)) return LS_OK;
    const ix_seq *s = &ix->seqs[si];
    size_t lo = seg_after(s, pos);
    if (lo == 0) return LS_OK;
    const ix_seg *g = &s->segs[lo - 1];
    if (pos >= g->pos_first + g->n_pos) return LS_OK;
    ix_slot *slot = NULL, *victim = &ix->slots[0];
    for (int i = 0; i < LS_TRACE_INDEX_CACHE_FRAMES; i++) {
        if (ix->slots[i].frame == (int64_t)g->frame) slot = &ix->slots[i];
        if (ix->slots[i].used < victim->used) victim = &ix->slots[i];
    }
    if (!slot) {
        slot = victim;
        slot->frame = -1;
        slot->fb.offset = ix->frame_off[g->frame];
        LS_TRY(ls_frame_load(&ix->f, &slot->fb, &ix->dec, 1, err));
        ix->verified[g->frame] = 1;
        slot->frame = g->frame;
    }
    slot->used = ++ix->clock;
    LS_TRY(ls_frame_record(&slot->fb, &ix->dec, g->rec_first + (pos - g->pos_first), err));
    *rec = &ix->dec.rec;
    return LS_OK;
}

ls_status ls_trace_index_verify(ls_trace_index *ix, ls_error *err)
{
    ls_frame_buf fb = {0};
    ls_status st = LS_OK;
    for (size_t f = 0; f < ix->n_frames && !st; f++) {
        if (ix->verified[f]) continue;
        fb.offset = ix->frame_off[f];
        st = ls_frame_load(&ix->f, &fb, &ix->dec, 1, err);
        if (!st) ix->verified[f] = 1;
    }
    ls_frame_buf_free(&fb);
    return st;
}

void ls_trace_index_set_lazy(ls_trace_index *ix, int lazy) { ix->dec.lazy = lazy != 0; }
ls_status ls_trace_index_load_digests(ls_trace_index *ix, ls_error *err) { return ls_rec_decoder_fill(&ix->dec, err); }

void ls_trace_index_close(ls_trace_index *ix)
{
    if (!ix) return;
    ls_trace_file_close(&ix->f);
    free(ix->buf);
    for (int i = 0; i < LS_TRACE_INDEX_CACHE_FRAMES; i++) ls_frame_buf_free(&ix->slots[i].fb);
    for (size_t i = 0; i < ix->track.n && ix->seqs; i++) free(ix->seqs[i].segs);
    free(ix->seqs);
    free(ix->sorted);
    free(ix->frame_off);
    free(ix->verified);
    ls_rec_decoder_free(&ix->dec);
    ls_trace_header_owned_free(&ix->hdr);
    track_free(&ix->track);
    free(ix->path);
    free(ix);
}
