/* A trace taken apart and put back together byte by byte, for tests that
 * need a file the C writer refuses to produce (a nonzero pad byte, a dump
 * that does not match its digest, run_params text jansson cannot hold, a
 * trailer count off by one): raw_load splits a trace into its header JSON and
 * its frames' uncompressed payloads, the test edits them, and raw_save writes
 * a file whose every checksum is valid again (docs/trace-format.md, sections
 * 2, 4 and 7), so only the edited rule can make a reader refuse it.
 * Header-only (static), like trace_synth.h. */
#ifndef LS_TESTS_TRACE_RAW_H
#define LS_TESTS_TRACE_RAW_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>

#include "fingerprint/sha256.h"
#include "testutil.h"

#define RAW_MAX_FRAMES 64

typedef struct raw_frame {
    uint8_t kind, flags;
    uint16_t reserved;
    uint32_t n_records, n_segs;
    uint32_t *segs;          /* [n_segs * 3]: seq, pos_first, n_pos */
    uint8_t *payload;        /* [len] uncompressed records */
    size_t len;
} raw_frame;

typedef struct raw_trace {
    char *json;              /* header JSON, NUL-terminated (editable) */
    int n_frames;
    raw_frame fr[RAW_MAX_FRAMES];
    int trailer;             /* 1: the file had a trailer (raw_save writes one) */
    int64_t trailer_bytes_delta;   /* added to the trailer's byte count */
    uint32_t trailer_reserved;     /* trailer bytes 4..7 */
} raw_trace;

static inline uint32_t raw_rd32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static inline uint64_t raw_rd64(const uint8_t *p) { return raw_rd32(p) | (uint64_t)raw_rd32(p + 4) << 32; }
static inline void raw_wr32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i); }
static inline void raw_wr64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i); }

static inline void raw_free(raw_trace *t)
{
    free(t->json);
    for (int i = 0; i < t->n_frames; i++) {
        free(t->fr[i].segs);
        free(t->fr[i].payload);
    }
    memset(t, 0, sizeof *t);
}

/* Splits the (well-formed) trace at path; returns 0 on success. */
static inline int raw_load(const char *path, raw_trace *t)
{
    memset(t, 0, sizeof *t);
    size_t n;
    uint8_t *f = (uint8_t *)ls_test_read(path, &n);
    if (!f || n < 48) { free(f); return 1; }
    uint32_t jlen = raw_rd32(f + 12);
    t->json = malloc(jlen + 1);
    memcpy(t->json, f + 16, jlen);
    t->json[jlen] = 0;
    uint64_t off = 16 + (uint64_t)jlen + 32;
    while (off + 4 <= n && memcmp(f + off, "LSFR", 4) == 0 && t->n_frames < RAW_MAX_FRAMES) {
        raw_frame *fr = &t->fr[t->n_frames++];
        const uint8_t *h = f + off;
        fr->kind = h[4];
        fr->flags = h[5];
        fr->reserved = (uint16_t)(h[6] | h[7] << 8);
        fr->n_records = raw_rd32(h + 12);
        fr->n_segs = raw_rd32(h + 16);
        fr->len = raw_rd64(h + 24);
        uint64_t comp = raw_rd64(h + 32);
        fr->segs = malloc(12 * (size_t)fr->n_segs);
        for (uint32_t i = 0; i < 3 * fr->n_segs; i++) fr->segs[i] = raw_rd32(h + 40 + 4 * i);
        const uint8_t *z = h + 40 + 12 * (uint64_t)fr->n_segs + 32;
        fr->payload = malloc(fr->len ? fr->len : 1);
        size_t got = ZSTD_decompress(fr->payload, fr->len, z, comp);
        if (ZSTD_isError(got) || got != fr->len) { free(f); return 1; }
        off += 40 + 12 * (uint64_t)fr->n_segs + 32 + comp;
    }
    t->trailer = off + 96 == n && memcmp(f + off, "LSEN", 4) == 0;
    free(f);
    return 0;
}

/* Record i of a frame (its first byte in the payload). */
static inline uint8_t *raw_record(raw_frame *fr, uint32_t i)
{
    uint8_t *p = fr->payload;
    while (i--) p += raw_rd32(p);
    return p;
}

/* Replaces `cut` bytes at byte `at` of record i of a frame by n_ins bytes
 * (ins, or zeros when NULL), keeping record_bytes and the payload length
 * right. Returns the record's new address. */
static inline uint8_t *raw_splice(raw_frame *fr, uint32_t i, size_t at, size_t cut, const void *ins, size_t n_ins)
{
    size_t r = (size_t)(raw_record(fr, i) - fr->payload);
    size_t len = fr->len - cut + n_ins;
    uint8_t *p = malloc(len);
    memcpy(p, fr->payload, r + at);
    if (ins) memcpy(p + r + at, ins, n_ins);
    else memset(p + r + at, 0, n_ins);
    memcpy(p + r + at + n_ins, fr->payload + r + at + cut, fr->len - r - at - cut);
    raw_wr32(p + r, raw_rd32(p + r) - (uint32_t)cut + (uint32_t)n_ins);
    free(fr->payload);
    fr->payload = p;
    fr->len = len;
    return p + r;
}

/* Replaces the first occurrence of `from` in the header JSON; returns 0 when found. */
static inline int raw_replace_json(raw_trace *t, const char *from, const char *to)
{
    char *at = strstr(t->json, from);
    if (!at) return 1;
    size_t head = (size_t)(at - t->json), lf = strlen(from), lt = strlen(to), tail = strlen(at + lf);
    char *j = malloc(head + lt + tail + 1);
    memcpy(j, t->json, head);
    memcpy(j + head, to, lt);
    memcpy(j + head + lt, at + lf, tail + 1);
    free(t->json);
    t->json = j;
    return 0;
}

/* Writes t with every checksum recomputed; returns 0 on success. */
static inline int raw_save(const char *path, const raw_trace *t)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) return 1;
    size_t jlen = strlen(t->json);
    uint8_t *head = malloc(16 + jlen);
    memcpy(head, "LSTRACE\0", 8);
    head[8] = 1, head[9] = 0, head[10] = 0, head[11] = 0;
    raw_wr32(head + 12, (uint32_t)jlen);
    memcpy(head + 16, t->json, jlen);
    ls_digest d;
    ls_sha256_buf(head, 16 + jlen, &d, NULL);
    fwrite(head, 1, 16 + jlen, fp);
    fwrite(d.bytes, 1, 32, fp);
    free(head);
    ls_sha256 chain;
    ls_sha256_init(&chain, NULL);
    uint64_t records = 0, bytes = 0;
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 1);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    for (int i = 0; i < t->n_frames; i++) {
        const raw_frame *fr = &t->fr[i];
        size_t bound = ZSTD_compressBound(fr->len);
        uint8_t *z = malloc(bound);
        size_t c = ZSTD_compress2(cc, z, bound, fr->payload, fr->len);
        size_t hb = 40 + 12 * (size_t)fr->n_segs;
        uint8_t *h = calloc(1, hb + 32);
        memcpy(h, "LSFR", 4);
        h[4] = fr->kind;
        h[5] = fr->flags;
        h[6] = (uint8_t)fr->reserved, h[7] = (uint8_t)(fr->reserved >> 8);
        raw_wr32(h + 8, (uint32_t)i);
        raw_wr32(h + 12, fr->n_records);
        raw_wr32(h + 16, fr->n_segs);
        raw_wr32(h + 20, raw_rd32(z + c - 4));
        raw_wr64(h + 24, fr->len);
        raw_wr64(h + 32, c);
        for (uint32_t k = 0; k < 3 * fr->n_segs; k++) raw_wr32(h + 40 + 4 * k, fr->segs[k]);
        ls_sha256_buf(h, hb, &d, NULL);
        memcpy(h + hb, d.bytes, 32);
        fwrite(h, 1, hb + 32, fp);
        fwrite(z, 1, c, fp);
        ls_sha256_update(&chain, d.bytes, 32, NULL);
        records += fr->n_records;
        bytes += fr->len;
        free(h);
        free(z);
    }
    ZSTD_freeCCtx(cc);
    uint8_t tr[96] = {0};
    ls_sha256_final(&chain, &d, NULL);
    if (t->trailer) {
        memcpy(tr, "LSEN", 4);
        raw_wr32(tr + 4, t->trailer_reserved);
        raw_wr64(tr + 8, (uint64_t)t->n_frames);
        raw_wr64(tr + 16, records);
        raw_wr64(tr + 24, bytes + (uint64_t)t->trailer_bytes_delta);
        memcpy(tr + 32, d.bytes, 32);
        ls_sha256_buf(tr, 64, &d, NULL);
        memcpy(tr + 64, d.bytes, 32);
        fwrite(tr, 1, 96, fp);
    }
    return fclose(fp) != 0;
}

#endif
