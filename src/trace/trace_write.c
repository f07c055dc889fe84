/* lockstep — streaming trace writer. Memory: one uncompressed frame, its
 * compressed copy, and one last-position entry per sequence. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* the context-size estimates, for out-of-memory messages (exported by
 * libzstd, declared in its static-linking section) */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>

#include "core/util.h"
#include "trace/trace_internal.h"

struct ls_trace_writer {
    ls_outfile out;
    int topk, n_layers;
    uint32_t kinds_mask;
    ls_trace_layer *layers;                      /* [n_layers], a copy of the header's */
    ls_trace_layout lay;                         /* the rules the reader checks */
    int in_frame;
    uint8_t frame_kind;
    uint8_t *buf; size_t len, cap;               /* uncompressed payload of the open frame */
    ls_frame_seg *segs; size_t n_segs, segs_cap; /* segment table of the open frame */
    uint32_t n_records;                          /* in the open frame */
    uint8_t *head; size_t head_cap;
    uint8_t *cbuf; size_t ccap;
    ZSTD_CCtx *cctx;
    ls_sha256 chain;                             /* SHA-256 over frame header checksums */
    int chain_open;
    uint64_t n_frames, n_records_total, bytes_total;
    ls_u32map last;                              /* seq -> index into last_pos */
    uint32_t *last_pos; size_t n_last, last_cap;
};

static ls_status wgrow(void **p, size_t *cap, size_t need, size_t elem, ls_error *err)
{
    if (need <= *cap) return LS_OK;
    size_t n = *cap ? *cap : 4096;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q) return ls_fail_nomem(err, n * elem, "trace writer: buffer");
    *p = q;
    *cap = n;
    return LS_OK;
}

static void writer_free(ls_trace_writer *w)
{
    free(w->buf); free(w->segs); free(w->head); free(w->cbuf); free(w->last_pos); free(w->layers);
    ZSTD_freeCCtx(w->cctx);
    if (w->chain_open) ls_sha256_discard(&w->chain);
    ls_u32map_free(&w->last);
    free(w);
}

static ls_status put(ls_trace_writer *w, const void *p, size_t n, ls_error *err)
{
    return ls_outfile_write(&w->out, p, n, err);
}

/* Flushed per frame so a killed run leaves every completed frame on disk. */
static ls_status flush(ls_trace_writer *w, ls_error *err)
{
    return fflush(w->out.fp) == 0 ? LS_OK : ls_fail_write(err, w->out.path, errno);
}

ls_status ls_trace_writer_open(const char *path, const ls_trace_header *hdr, ls_trace_writer **out, ls_error *err)
{
    *out = NULL;
    char *json = NULL;
    LS_TRY(ls_trace_header_to_json(hdr, &json, err));
    ls_trace_writer *w = calloc(1, sizeof *w);
    if (!w) { free(json); return ls_fail_nomem(err, sizeof *w, "trace writer"); }
    w->topk = hdr->topk;
    w->n_layers = hdr->n_layers;
    w->kinds_mask = hdr->digest_kinds_mask;
    w->layers = malloc(sizeof *w->layers * (size_t)(hdr->n_layers ? hdr->n_layers : 1));
    if (!w->layers) { free(json); free(w); return ls_fail(err, LS_E_NOMEM, "trace writer: out of memory"); }
    if (hdr->n_layers) memcpy(w->layers, hdr->layers, sizeof *w->layers * (size_t)hdr->n_layers);
    ls_trace_header copy = *hdr;
    copy.layers = w->layers;
    ls_trace_layout_init(&w->lay, &copy);
    ls_status st = LS_OK;
    if (strcmp(path, "-") == 0) st = ls_fail(err, LS_E_USAGE, "trace writer: cannot write a trace to stdout");
    if (!st) st = ls_outfile_open(&w->out, path, err);
    if (st) { free(json); free(w->layers); free(w); return st; }
    w->cctx = ZSTD_createCCtx();
    if (!w->cctx) st = ls_fail_nomem(err, ZSTD_estimateCCtxSize(1), "trace writer: a zstd compression context");
    /* Level 1, content size and content checksum in every payload (docs/trace-format.md, section 4). */
    if (!st && (ZSTD_isError(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, 1)) ||
                ZSTD_isError(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_contentSizeFlag, 1)) ||
                ZSTD_isError(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_checksumFlag, 1))))
        st = ls_fail(err, LS_E_INTERNAL, "trace writer: zstd rejects the frame parameters");
    if (!st) st = ls_sha256_init(&w->chain, err);
    if (!st) w->chain_open = 1;
    size_t jlen = strlen(json);
    uint8_t head[LS_TRACE_FILE_HEAD_BYTES];
    memcpy(head, LS_TRACE_MAGIC, 8);
    ls_wr16(head + 8, LS_TRACE_VERSION_MAJOR);
    ls_wr16(head + 10, LS_TRACE_VERSION_MINOR);
    ls_wr32(head + 12, (uint32_t)jlen);
    ls_sha256 h;
    ls_digest d;
    if (!st) st = ls_sha256_init(&h, err);
    if (!st) {
        st = ls_sha256_update(&h, head, sizeof head, err);
        if (!st) st = ls_sha256_update(&h, json, jlen, err);
        if (!st) st = ls_sha256_final(&h, &d, err); else ls_sha256_discard(&h);
    }
    if (!st) st = put(w, head, sizeof head, err);
    if (!st) st = put(w, json, jlen, err);
    if (!st) st = put(w, d.bytes, 32, err);
    if (!st) st = flush(w, err);
    free(json);
    if (st) {
        ls_trace_writer_abort(w);
        return st;
    }
    *out = w;
    return LS_OK;
}

ls_status ls_trace_writer_begin_frame(ls_trace_writer *w, ls_frame_kind kind, ls_error *err)
{
    if (w->in_frame) return ls_fail(err, LS_E_USAGE, "trace writer: begin_frame while a frame is open");
    if ((unsigned)kind >= LS_TRACE_FRAME_KIND_COUNT) return ls_fail(err, LS_E_USAGE, "trace writer: bad frame kind %d", kind);
    if (!(w->lay.frame_kinds & (1u << kind)))
        return ls_fail(err, LS_E_USAGE, "trace writer: frame kind %d (%s) in a%s %s trace, which holds %s frames", kind,
                       ls_trace_frame_kind_name(kind), w->lay.mode[0] == 'i' ? "n" : "", w->lay.mode,
                       ls_trace_mode_frames(&w->lay));
    w->in_frame = 1;
    w->frame_kind = (uint8_t)kind;
    w->len = 0;
    w->n_segs = 0;
    w->n_records = 0;
    return LS_OK;
}

ls_status ls_trace_writer_add(ls_trace_writer *w, const ls_trace_record *r, ls_error *err)
{
    if (!w->in_frame) return ls_fail(err, LS_E_USAGE, "trace writer: add outside a frame");
    /* Positions of a sequence must increase through the trace (docs/trace-format.md, "Ordering"). */
    uint32_t li;
    int have = ls_u32map_get(&w->last, r->seq, &li);
    if (have && r->pos <= w->last_pos[li])
        return ls_fail(err, LS_E_USAGE, "trace writer: seq %u pos %u after pos %u: positions must increase", r->seq, r->pos,
                       w->last_pos[li]);
    if (r->n_digests > 65535 || r->n_dumps > 65535) return ls_fail(err, LS_E_USAGE, "trace writer: too many digests");
    uint64_t need = LS_TRACE_RECORD_FIXED_BYTES + 8 * (uint64_t)w->topk + 4 +
                    (uint64_t)r->n_digests * LS_TRACE_DIGEST_ENTRY_BYTES;
    /* The rules of docs/trace-format.md, sections 5 and 6, as the reader checks them. */
    int prev = -1, unused = -1;
    for (int k = 0; k < w->topk; k++) {
        int32_t id = r->topk_ids[k];
        int bad = id < -1 || (id == -1 && r->topk_logprob_bits[k] != 0x7fc00000u) || (id >= 0 && unused >= 0);
        for (int j = 0; j < k && id >= 0; j++) bad |= r->topk_ids[j] == id;
        if (bad)
            return ls_fail(err, LS_E_USAGE, "trace writer: seq %u pos %u top-k slot %d (id %d, bits 0x%08x): used slots "
                           "come first with distinct ids >= 0, unused ones hold id -1 and bits 0x7fc00000", r->seq, r->pos,
                           k, id, r->topk_logprob_bits[k]);
        if (id == -1 && unused < 0) unused = k;
    }
    uint32_t count[LS_DIGEST_COUNT] = {0};
    for (uint32_t i = 0; i < r->n_digests; i++) {
        const ls_trace_digest *d = &r->digests[i];
        int key = d->layer * LS_DIGEST_COUNT + d->kind;
        if (d->layer >= w->n_layers || d->kind >= LS_DIGEST_COUNT || !(w->kinds_mask & (1u << d->kind)) || key <= prev ||
            !ls_trace_kind_allowed(w->layers[d->layer].family, d->kind))
            return ls_fail(err, LS_E_USAGE,
                           "trace writer: seq %u pos %u digest %u (layer %u, kind %u): not in the header, not a kind of "
                           "the layer's family, or not ordered by (layer, kind)", r->seq, r->pos, i, d->layer, d->kind);
        prev = key;
        count[d->kind]++;
    }
    prev = -1;
    for (uint32_t i = 0; i < r->n_dumps; i++) {
        const ls_trace_dump *d = &r->dumps[i];
        size_t es = ls_dump_dtype_size(d->dtype);
        int key = d->layer * LS_DIGEST_COUNT + d->kind;
        if (d->layer >= w->n_layers || d->kind >= LS_DIGEST_COUNT || !es || !d->n_elems || !d->data || key <= prev ||
            ((d->kind == LS_DIGEST_ROUTER) != (d->dtype == LS_DUMP_ROUTER)) || (d->dtype == LS_DUMP_ROUTER && d->n_elems % 2))
            return ls_fail(err, LS_E_USAGE, "trace writer: seq %u pos %u dump %u: bad layer/kind/dtype/size or order",
                           r->seq, r->pos, i);
        prev = key;
        need += LS_TRACE_DUMP_HEAD_BYTES + (((uint64_t)d->n_elems * es + 3) & ~(uint64_t)3);
        /* The reader checks that a dump hashes to its digest (docs/trace-format.md, section 5). */
        const ls_trace_digest *dg = NULL;
        for (uint32_t k = 0; k < r->n_digests && !dg; k++)
            if (r->digests[k].layer == d->layer && r->digests[k].kind == d->kind) dg = &r->digests[k];
        const char *kn = ls_digest_kind_name((ls_digest_kind)d->kind);
        if (!dg)
            return ls_fail(err, LS_E_USAGE, "trace writer: seq %u pos %u dump %u (layer %u, %s): the record carries no %s "
                           "digest of layer %u", r->seq, r->pos, i, d->layer, kn, kn, d->layer);
        ls_digest h;
        LS_TRY(ls_sha256_buf(d->data, (size_t)d->n_elems * es, &h, err));
        if (!ls_digest_equal(&h, &dg->digest))
            return ls_fail(err, LS_E_USAGE, "trace writer: seq %u pos %u dump %u (layer %u, %s): the SHA-256 of its data is "
                           "not the record's %s digest of layer %u", r->seq, r->pos, i, d->layer, kn, kn, d->layer);
    }
    int missing = ls_trace_layout_missing_kind(&w->lay, r->pos, count);
    if (missing >= 0)
        return ls_fail(err, LS_E_USAGE, "trace writer: seq %u pos %u lacks %s digests: a kind in digest_kinds appears at "
                       "every position for every layer of a family that has it", r->seq, r->pos,
                       ls_digest_kind_name((ls_digest_kind)missing));
    if (w->len + need > LS_TRACE_FRAME_MAX_BYTES || need > UINT32_MAX)
        return ls_fail(err, LS_E_USAGE, "trace writer: frame would exceed %" PRIu64 " bytes; end the frame earlier",
                       LS_TRACE_FRAME_MAX_BYTES);
    LS_TRY(wgrow((void **)&w->buf, &w->cap, w->len + need, 1, err));
    uint8_t *p = w->buf + w->len;
    memset(p, 0, need);
    ls_wr32(p, (uint32_t)need);
    ls_wr32(p + 4, r->seq);
    ls_wr32(p + 8, r->pos);
    ls_wr32(p + 12, (uint32_t)r->token);
    ls_wr32(p + 16, (uint32_t)r->next_token);
    ls_wr32(p + 20, r->logprob_bits);
    for (int k = 0; k < w->topk; k++) {
        ls_wr32(p + 24 + 8 * k, (uint32_t)r->topk_ids[k]);
        ls_wr32(p + 28 + 8 * k, r->topk_logprob_bits[k]);
    }
    size_t q = 24 + 8 * (size_t)w->topk;
    ls_wr16(p + q, (uint16_t)r->n_digests);
    ls_wr16(p + q + 2, (uint16_t)r->n_dumps);
    q += 4;
    for (uint32_t i = 0; i < r->n_digests; i++, q += LS_TRACE_DIGEST_ENTRY_BYTES) {
        ls_wr16(p + q, r->digests[i].layer);
        p[q + 2] = r->digests[i].kind;
        memcpy(p + q + 4, r->digests[i].digest.bytes, 32);
    }
    for (uint32_t i = 0; i < r->n_dumps; i++) {
        const ls_trace_dump *d = &r->dumps[i];
        size_t bytes = (size_t)d->n_elems * ls_dump_dtype_size(d->dtype);
        ls_wr16(p + q, d->layer);
        p[q + 2] = d->kind;
        p[q + 3] = d->dtype;
        ls_wr32(p + q + 4, d->n_elems);
        memcpy(p + q + 8, d->data, bytes); /* the caller's bytes are little-endian already */
        q += LS_TRACE_DUMP_HEAD_BYTES + ((bytes + 3) & ~(size_t)3);
    }
    w->len += need;
    ls_frame_seg *s = w->n_segs ? &w->segs[w->n_segs - 1] : NULL;
    if (s && s->seq == r->seq && s->pos_first + s->n_pos == r->pos) {
        s->n_pos++;
    } else {
        LS_TRY(wgrow((void **)&w->segs, &w->segs_cap, w->n_segs + 1, sizeof *w->segs, err));
        w->segs[w->n_segs++] = (ls_frame_seg){r->seq, r->pos, 1};
    }
    if (have) {
        w->last_pos[li] = r->pos;
    } else {
        LS_TRY(wgrow((void **)&w->last_pos, &w->last_cap, w->n_last + 1, sizeof *w->last_pos, err));
        w->last_pos[w->n_last] = r->pos;
        LS_TRY(ls_u32map_put(&w->last, r->seq, (uint32_t)w->n_last, err));
        w->n_last++;
    }
    w->n_records++;
    return LS_OK;
}

ls_status ls_trace_writer_end_frame(ls_trace_writer *w, ls_error *err)
{
    if (!w->in_frame) return ls_fail(err, LS_E_USAGE, "trace writer: end_frame without begin_frame");
    w->in_frame = 0;
    if (w->n_records == 0) return LS_OK; /* an empty frame is not written */
    size_t bound = ZSTD_compressBound(w->len);
    LS_TRY(wgrow((void **)&w->cbuf, &w->ccap, bound, 1, err));
    size_t c = ZSTD_compress2(w->cctx, w->cbuf, bound, w->buf, w->len);
    if (ZSTD_isError(c) && ZSTD_getErrorCode(c) == ZSTD_error_memory_allocation)
        return ls_fail(err, LS_E_NOMEM, "trace writer: out of memory inside zstd compressing a frame of %zu bytes", w->len);
    if (ZSTD_isError(c)) return ls_fail(err, LS_E_INTERNAL, "trace writer: zstd: %s", ZSTD_getErrorName(c));
    if (c < 9) return ls_fail(err, LS_E_INTERNAL, "trace writer: zstd frame of %zu bytes has no content checksum", c);
    size_t hb = LS_TRACE_FRAME_FIXED_BYTES + w->n_segs * LS_TRACE_SEGMENT_BYTES;
    LS_TRY(wgrow((void **)&w->head, &w->head_cap, hb + 32, 1, err));
    uint8_t *h = w->head;
    memset(h, 0, LS_TRACE_FRAME_FIXED_BYTES);
    memcpy(h, LS_TRACE_FRAME_MAGIC, 4);
    h[4] = w->frame_kind;
    ls_wr32(h + 8, (uint32_t)w->n_frames);
    ls_wr32(h + 12, w->n_records);
    ls_wr32(h + 16, (uint32_t)w->n_segs);
    ls_wr32(h + 20, ls_rd32(w->cbuf + c - 4)); /* the payload's content checksum */
    ls_wr64(h + 24, w->len);
    ls_wr64(h + 32, c);
    for (size_t i = 0; i < w->n_segs; i++) {
        uint8_t *s = h + LS_TRACE_FRAME_FIXED_BYTES + i * LS_TRACE_SEGMENT_BYTES;
        ls_wr32(s, w->segs[i].seq);
        ls_wr32(s + 4, w->segs[i].pos_first);
        ls_wr32(s + 8, w->segs[i].n_pos);
    }
    ls_digest d;
    LS_TRY(ls_sha256_buf(h, hb, &d, err));
    memcpy(h + hb, d.bytes, 32);
    LS_TRY(put(w, h, hb + 32, err));
    LS_TRY(put(w, w->cbuf, c, err));
    LS_TRY(flush(w, err));
    LS_TRY(ls_sha256_update(&w->chain, d.bytes, 32, err));
    w->n_frames++;
    w->n_records_total += w->n_records;
    w->bytes_total += w->len;
    return LS_OK;
}

ls_status ls_trace_writer_close(ls_trace_writer *w, ls_error *err)
{
    ls_status st = LS_OK;
    if (w->in_frame) st = ls_trace_writer_end_frame(w, err);
    uint8_t t[LS_TRACE_TRAILER_BYTES];
    memset(t, 0, sizeof t);
    memcpy(t, LS_TRACE_TRAILER_MAGIC, 4);
    ls_wr64(t + 8, w->n_frames);
    ls_wr64(t + 16, w->n_records_total);
    ls_wr64(t + 24, w->bytes_total);
    ls_digest chain, d;
    if (!st) {
        w->chain_open = 0;
        st = ls_sha256_final(&w->chain, &chain, err);
    }
    if (!st) {
        memcpy(t + 32, chain.bytes, 32);
        st = ls_sha256_buf(t, 64, &d, err);
    }
    if (!st) {
        memcpy(t + 64, d.bytes, 32);
        st = put(w, t, sizeof t, err);
    }
    if (!st) {
        st = ls_outfile_commit(&w->out, err);
        w->out.fp = NULL;
    }
    if (st) {
        ls_trace_writer_abort(w);
        return st;
    }
    writer_free(w);
    return LS_OK;
}

void ls_trace_writer_abort(ls_trace_writer *w)
{
    if (!w) return;
    if (w->out.fp) ls_outfile_abort(&w->out);
    writer_free(w);
}
