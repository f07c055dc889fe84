/* lockstep — safetensors writer (synthetic checkpoints, tests).
 *
 * File layout written (the format's strict reading, docs/checkpoint-io.md):
 *
 *   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
 *   bytes [8, 8+N)      JSON header: {"__metadata__":{...},"name":{"dtype":..,
 *                       "shape":[..],"data_offsets":[begin,end]},...} padded
 *                       with spaces so that 8+N is a multiple of 8
 *   bytes [8+N, end)    tensor data, in name order (byte order of the names),
 *                       contiguous, no gaps, exactly covering the region
 *
 * The header is built in memory (it is small); tensor bytes are streamed to
 * the file from the caller's pointers, never copied into one big buffer. The
 * file goes through ls_outfile: written to a temporary name, renamed when
 * complete. The JSON is compact with a fixed key order, so the same tensors
 * always give the same bytes. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "io/checkpoint.h"

/* ---- writer state ---------------------------------------------------------- */

typedef struct writer_tensor {
    char *name;                        /* owned copy */
    ls_dtype dtype;
    int ndim;
    int64_t shape[LS_TENSOR_MAX_DIMS];
    uint64_t size_bytes;               /* numel * dtype size */
    const void *data;                  /* borrowed; valid until write returns */
} writer_tensor;

typedef struct writer_meta {
    char *key;                         /* owned */
    char *value;                       /* owned */
} writer_meta;

struct ls_safetensors_writer {
    writer_tensor *tensors;            /* [n_tensors], owned */
    size_t n_tensors, cap_tensors;
    writer_meta *meta;                 /* [n_meta], owned, insertion order */
    size_t n_meta, cap_meta;
    int meta_default;                  /* 1 until the caller sets a key */
};

/* A growable string for the header. */
typedef struct strbuf {
    char *p;                           /* owned */
    size_t len, cap;
    int oom;                           /* set on the first failed allocation */
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(strbuf *b, uint64_t v)
{
    char tmp[24];
    snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_str(b, tmp);
}

/* A JSON string literal: quotes, backslashes and control bytes escaped; other
 * bytes (UTF-8 included) copied as they are. */
static void sb_json_string(strbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char esc[2] = {'\\', (char)*c};
            sb_put(b, esc, 2);
        } else if (*c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", *c);
            sb_str(b, esc);
        } else {
            sb_put(b, (const char *)c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* ---- public API ------------------------------------------------------------ */

ls_status ls_safetensors_writer_new(ls_safetensors_writer **out, ls_error *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return ls_fail(err, LS_E_NOMEM, "safetensors writer: out of memory");
    (*out)->meta_default = 1;
    return LS_OK;
}

ls_status ls_safetensors_writer_add(ls_safetensors_writer *w, const char *name, ls_dtype dt,
                                    int ndim, const int64_t *shape, const void *data,
                                    ls_error *err)
{
    if (!name || !*name)
        return ls_fail(err, LS_E_USAGE, "safetensors writer: empty tensor name");
    if (strcmp(name, "__metadata__") == 0)
        return ls_fail(err, LS_E_USAGE, "safetensors writer: '__metadata__' is not a tensor name");
    if ((int)dt < 0 || dt >= LS_DTYPE_COUNT)
        return ls_fail(err, LS_E_USAGE, "safetensors writer: tensor '%s': bad dtype %d", name,
                       (int)dt);
    if (ndim < 0 || ndim > LS_TENSOR_MAX_DIMS)
        return ls_fail(err, LS_E_USAGE, "safetensors writer: tensor '%s': %d dimensions (0..%d)",
                       name, ndim, LS_TENSOR_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return ls_fail(err, LS_E_USAGE, "safetensors writer: tensor '%s': negative dim %d",
                           name, i);
        uint64_t d = (uint64_t)shape[i];
        if (d && numel > UINT64_MAX / d)
            return ls_fail(err, LS_E_USAGE, "safetensors writer: tensor '%s': size overflows",
                           name);
        numel *= d;
    }
    size_t esize = ls_dtype_size(dt);
    if (numel > UINT64_MAX / esize)
        return ls_fail(err, LS_E_USAGE, "safetensors writer: tensor '%s': size overflows", name);
    uint64_t bytes = numel * esize;
    if (bytes && !data)
        return ls_fail(err, LS_E_USAGE, "safetensors writer: tensor '%s': no data", name);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return ls_fail(err, LS_E_USAGE, "safetensors writer: tensor '%s' added twice", name);
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        writer_tensor *nt = realloc(w->tensors, cap * sizeof *nt);
        if (!nt) return ls_fail(err, LS_E_NOMEM, "safetensors writer: out of memory");
        w->tensors = nt;
        w->cap_tensors = cap;
    }
    writer_tensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return ls_fail(err, LS_E_NOMEM, "safetensors writer: out of memory");
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->size_bytes = bytes;
    t->data = data;
    w->n_tensors++;
    return LS_OK;
}

ls_status ls_safetensors_writer_set_metadata(ls_safetensors_writer *w, const char *key,
                                             const char *value, ls_error *err)
{
    if (!key || !value)
        return ls_fail(err, LS_E_USAGE, "safetensors writer: metadata key and value required");
    if (w->meta_default) {
        /* The first explicit key replaces the default {"format":"pt"} map;
         * callers that want "format" too set it themselves. */
        w->meta_default = 0;
    }
    for (size_t i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta[i].key, key) == 0) {
            char *v = strdup(value);
            if (!v) return ls_fail(err, LS_E_NOMEM, "safetensors writer: out of memory");
            free(w->meta[i].value);
            w->meta[i].value = v;
            return LS_OK;
        }
    }
    if (w->n_meta == w->cap_meta) {
        size_t cap = w->cap_meta ? 2 * w->cap_meta : 8;
        writer_meta *nm = realloc(w->meta, cap * sizeof *nm);
        if (!nm) return ls_fail(err, LS_E_NOMEM, "safetensors writer: out of memory");
        w->meta = nm;
        w->cap_meta = cap;
    }
    writer_meta *m = &w->meta[w->n_meta];
    m->key = strdup(key);
    m->value = strdup(value);
    if (!m->key || !m->value) {
        free(m->key);
        free(m->value);
        return ls_fail(err, LS_E_NOMEM, "safetensors writer: out of memory");
    }
    w->n_meta++;
    return LS_OK;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const writer_tensor *)a)->name, ((const writer_tensor *)b)->name);
}

/* Builds the padded header for the tensors (already sorted). */
static ls_status build_header(const ls_safetensors_writer *w, strbuf *b, ls_error *err)
{
    sb_str(b, "{\"__metadata__\":{");
    if (w->meta_default) {
        sb_str(b, "\"format\":\"pt\"");
    } else {
        for (size_t i = 0; i < w->n_meta; i++) {
            if (i) sb_put(b, ",", 1);
            sb_json_string(b, w->meta[i].key);
            sb_put(b, ":", 1);
            sb_json_string(b, w->meta[i].value);
        }
    }
    sb_put(b, "}", 1);
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        sb_put(b, ",", 1);
        sb_json_string(b, t->name);
        sb_str(b, ":{\"dtype\":\"");
        sb_str(b, ls_dtype_name(t->dtype));
        sb_str(b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) sb_put(b, ",", 1);
            sb_u64(b, (uint64_t)t->shape[d]);
        }
        sb_str(b, "],\"data_offsets\":[");
        sb_u64(b, offset);
        sb_put(b, ",", 1);
        sb_u64(b, offset + t->size_bytes);
        sb_str(b, "]}");
        offset += t->size_bytes;
    }
    sb_put(b, "}", 1);
    while ((8 + b->len) % 8 != 0) sb_put(b, " ", 1);
    if (b->oom) return ls_fail(err, LS_E_NOMEM, "safetensors writer: out of memory (header)");
    return LS_OK;
}

ls_status ls_safetensors_writer_write(ls_safetensors_writer *w, const char *path, ls_error *err)
{
    if (strcmp(path, "-") == 0)
        return ls_fail(err, LS_E_USAGE, "safetensors writer: cannot write to stdout");
    if (w->n_tensors > 1) qsort(w->tensors, w->n_tensors, sizeof *w->tensors, cmp_tensor_name);

    strbuf hdr = {0};
    ls_status st = build_header(w, &hdr, err);
    if (st != LS_OK) {
        free(hdr.p);
        return st;
    }
    uint8_t len_le[8];
    uint64_t n = hdr.len;
    for (int i = 0; i < 8; i++) len_le[i] = (uint8_t)(n >> (8 * i));

    ls_outfile o;
    st = ls_outfile_open(&o, path, err);
    if (st != LS_OK) {
        free(hdr.p);
        return st;
    }
    st = ls_outfile_write(&o, len_le, 8, err);
    if (st == LS_OK) st = ls_outfile_write(&o, hdr.p, hdr.len, err);
    free(hdr.p);
    for (size_t i = 0; st == LS_OK && i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        /* Streamed in 64 MiB pieces straight from the caller's buffer. */
        const uint8_t *p = t->data;
        uint64_t left = t->size_bytes;
        while (st == LS_OK && left) {
            size_t piece = left > ((uint64_t)64 << 20) ? ((size_t)64 << 20) : (size_t)left;
            st = ls_outfile_write(&o, p, piece, err);
            p += piece;
            left -= piece;
        }
    }
    if (st != LS_OK) {
        ls_outfile_abort(&o);
        return st;
    }
    return ls_outfile_commit(&o, err);
}

void ls_safetensors_writer_free(ls_safetensors_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    for (size_t i = 0; i < w->n_meta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->tensors);
    free(w->meta);
    free(w);
}
