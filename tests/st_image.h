/* Test helper: assembles safetensors images by hand (header JSON + data), so
 * that tests do not depend on the library's own writer. Header-only. */
#ifndef LS_TESTS_ST_IMAGE_H
#define LS_TESTS_ST_IMAGE_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Image = 8-byte LE length of header, header bytes, data_len data bytes where
 * byte i of the data region is (i * 7 + 3) & 0xff unless data is given.
 * Caller frees; *len receives the total size. */
static inline unsigned char *st_image(const char *header, const void *data, size_t data_len,
                                      size_t *len)
{
    size_t n = strlen(header);
    unsigned char *img = malloc(8 + n + data_len + 1);
    ck_assert_ptr_nonnull(img);
    for (int i = 0; i < 8; i++) img[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(img + 8, header, n);
    for (size_t i = 0; i < data_len; i++)
        img[8 + n + i] = data ? ((const unsigned char *)data)[i] : (unsigned char)((i * 7 + 3) & 0xff);
    *len = 8 + n + data_len;
    return img;
}

/* One tensor of a hand-built file. */
typedef struct st_spec {
    const char *name;
    const char *dtype;       /* safetensors spelling */
    int ndim;
    int64_t shape[4];
    size_t elem_bytes;       /* size of one element for dtype */
    const void *data;        /* NULL: a pattern derived from the name, every float finite */
} st_spec;

static inline size_t st_spec_bytes(const st_spec *s)
{
    size_t n = s->elem_bytes;
    for (int d = 0; d < s->ndim; d++) n *= (size_t)s->shape[d];
    return n;
}

/* Builds a valid image holding the tensors in the order given (data order),
 * with an optional metadata JSON object text (e.g. "{\"format\":\"pt\"}"). */
static inline unsigned char *st_image_of(const st_spec *ts, size_t n, const char *meta, size_t *len)
{
    size_t cap = 4096 + n * 256, hl = 0, total = 0;
    char *h = malloc(cap);
    ck_assert_ptr_nonnull(h);
    hl += (size_t)snprintf(h + hl, cap - hl, "{");
    if (meta) hl += (size_t)snprintf(h + hl, cap - hl, "\"__metadata__\":%s%s", meta, n ? "," : "");
    for (size_t i = 0; i < n; i++) {
        size_t b = st_spec_bytes(&ts[i]);
        hl += (size_t)snprintf(h + hl, cap - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
                               ts[i].name, ts[i].dtype);
        for (int d = 0; d < ts[i].ndim; d++)
            hl += (size_t)snprintf(h + hl, cap - hl, "%s%lld", d ? "," : "", (long long)ts[i].shape[d]);
        hl += (size_t)snprintf(h + hl, cap - hl, "],\"data_offsets\":[%zu,%zu]}", total, total + b);
        total += b;
    }
    hl += (size_t)snprintf(h + hl, cap - hl, "}");
    ck_assert_uint_lt(hl, cap);
    /* Pad the header with spaces to a multiple of 8, as real writers do. */
    while ((hl & 7) != 0) h[hl++] = ' ';
    h[hl] = '\0';
    unsigned char *data = malloc(total + 1);
    ck_assert_ptr_nonnull(data);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t b = st_spec_bytes(&ts[i]);
        if (ts[i].data) {
            memcpy(data + off, ts[i].data, b);
        } else {
            unsigned hsh = 5381;
            for (const char *p = ts[i].name; *p; p++) hsh = hsh * 33u + (unsigned char)*p;
            /* Bit 6 cleared in every byte: the top exponent bit of every
             * float type (BF16, F16, F32, F64, F8) is then 0, so every value
             * is finite (lockstep refuses NaN and Inf weights). */
            for (size_t k = 0; k < b; k++) data[off + k] = (unsigned char)(((hsh + k * 13u) >> 3) & 0xBF);
        }
        off += b;
    }
    unsigned char *img = st_image(h, data, total, len);
    free(h);
    free(data);
    return img;
}

/* Writes the image of ts[0..n) (metadata {"format":"pt"}) to DIR/NAME. */
static inline void st_write_file(const char *dir, const char *name, const st_spec *ts, size_t n)
{
    size_t len;
    unsigned char *img = st_image_of(ts, n, "{\"format\":\"pt\"}", &len);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ls_test_write(path, img, len);
    free(img);
}

#endif
