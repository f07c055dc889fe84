/* lockstep — safetensors reader: mmap plus strict header validation.
 *
 * Layout of a file: 8-byte little-endian header length N, N bytes of UTF-8
 * JSON, then the data region. Every rule below is checked before any tensor is
 * handed out, and each failure is one line naming the file, the tensor and a
 * byte offset in the file (docs/checkpoint-io.md lists them all). Both entry
 * points (file and memory image) share validate_image(), so the fuzzer
 * exercises exactly the code that reads real checkpoints. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "io/checkpoint.h"
#include "io/json.h"

/* Same bound as the reference implementation: a header larger than this is
 * not a checkpoint header but an attack or a corrupted length. */
#define LS_ST_HEADER_MAX_BYTES 100000000ull

struct ls_safetensors {
    char *label;                /* path or caller's label; owned */
    const unsigned char *image; /* whole file image, file_len bytes; borrowed or mapped */
    size_t file_len;
    void *map;                  /* mmap'ed base when opened from a path, else NULL */
    size_t map_len;
    int map_slot;               /* core/util.h mapping registry slot (SIGBUS names the file); -1 none */
    uint64_t header_len;        /* N */
    ls_tensor *tensors;         /* count entries, in data order; owned */
    size_t count;
    size_t *by_name;            /* indices into tensors, sorted by name; owned */
    char **meta_keys;           /* meta_count, sorted by key; owned */
    char **meta_values;         /* meta_count; owned */
    size_t meta_count;
    ls_file_identity identity;  /* fstat of the mapped descriptor (ls_safetensors_open) */
    int has_identity;           /* 0 for ls_safetensors_open_mem */
};

/* ---- errors ----------------------------------------------------------------- */

/* Records "<label>: <what> (byte offset <off>)" as LS_E_INPUT. */
static ls_status __attribute__((format(printf, 4, 5)))
st_bad(ls_error *err, const char *label, uint64_t off, const char *fmt, ...)
{
    char what[LS_ERROR_MSG_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ls_fail(err, LS_E_INPUT, "%s: %s (byte offset %llu)", label, what,
                   (unsigned long long)off);
}

/* Byte just after the closing quote of the JSON string starting at s[i]
 * (s[i] == '"'); n when unterminated. */
static size_t skip_json_string(const char *s, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return n;
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

/* Whether the raw JSON string token s[0..len) (quotes included) decodes to key. */
static int token_equals(const char *tok, size_t len, const char *key)
{
    if (!memchr(tok, '\\', len)) {
        size_t klen = strlen(key);
        return len == klen + 2 && memcmp(tok + 1, key, klen) == 0;
    }
    json_t *j = json_loadb(tok, len, JSON_DECODE_ANY, NULL);
    int eq = j && json_is_string(j) && strlen(key) == json_string_length(j) &&
             memcmp(json_string_value(j), key, json_string_length(j)) == 0;
    json_decref(j);
    return eq;
}

/* Position (in the header text) of the top-level key `key`, or -1. Only called
 * on the error path, after jansson accepted the text, so a forgiving scanner
 * is enough; keeping it off the success path costs nothing for big headers. */
static long long header_key_pos(const char *s, size_t n, const char *key)
{
    size_t i = skip_ws(s, n, 0);
    if (i >= n || s[i] != '{') return -1;
    i++;
    while (i < n) {
        i = skip_ws(s, n, i);
        if (i >= n || s[i] != '"') return -1;
        size_t start = i;
        i = skip_json_string(s, n, i);
        if (token_equals(s + start, i - start, key)) return (long long)start;
        /* Skip ':' and the value: nested brackets and strings. */
        int depth = 0;
        for (; i < n; i++) {
            char c = s[i];
            if (c == '"') {
                i = skip_json_string(s, n, i) - 1;
            } else if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                if (depth == 0) return -1;
                depth--;
            } else if (c == ',' && depth == 0) {
                i++;
                break;
            }
        }
    }
    return -1;
}

typedef struct parse_ctx {
    const char *label;
    const char *header;      /* N bytes of JSON text */
    size_t header_len;
    ls_error *err;
} parse_ctx;

/* File offset of a top-level key, falling back to the header start. */
static uint64_t key_offset(const parse_ctx *c, const char *key)
{
    long long p = header_key_pos(c->header, c->header_len, key);
    return 8 + (p < 0 ? 0 : (uint64_t)p);
}

#define NAME_FMT "%.300s" /* tensor names in messages: bounded, never truncating the offset */

/* ---- header entries ------------------------------------------------------------ */

/* Reads a non-negative JSON integer. */
static int get_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0) return -1;
    *out = (uint64_t)x;
    return 0;
}

static ls_status parse_tensor(const parse_ctx *c, const char *name, const json_t *entry,
                              uint64_t data_len, ls_tensor *t, uint64_t *begin_out)
{
    if (!json_is_object(entry))
        return st_bad(c->err, c->label, key_offset(c, name),
                      "tensor '" NAME_FMT "': entry is not a JSON object", name);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)entry, k, v) {
        if (strcmp(k, "dtype") != 0 && strcmp(k, "shape") != 0 && strcmp(k, "data_offsets") != 0)
            return st_bad(c->err, c->label, key_offset(c, name),
                          "tensor '" NAME_FMT "': unknown key '%.100s' (allowed: dtype, shape, "
                          "data_offsets)", name, k);
    }
    const json_t *jd = json_object_get(entry, "dtype");
    const json_t *js = json_object_get(entry, "shape");
    const json_t *jo = json_object_get(entry, "data_offsets");
    const char *missing = !jd ? "dtype" : !js ? "shape" : !jo ? "data_offsets" : NULL;
    if (missing)
        return st_bad(c->err, c->label, key_offset(c, name),
                      "tensor '" NAME_FMT "': missing key '%s'", name, missing);

    if (!json_is_string(jd))
        return st_bad(c->err, c->label, key_offset(c, name),
                      "tensor '" NAME_FMT "': dtype is not a string", name);
    if (ls_dtype_parse(json_string_value(jd), &t->dtype) != 0)
        return st_bad(c->err, c->label, key_offset(c, name),
                      "tensor '" NAME_FMT "': unknown dtype '%.40s'", name, json_string_value(jd));

    if (!json_is_array(js))
        return st_bad(c->err, c->label, key_offset(c, name),
                      "tensor '" NAME_FMT "': shape is not an array", name);
    size_t nd = json_array_size(js);
    if (nd > LS_TENSOR_MAX_DIMS)
        return st_bad(c->err, c->label, key_offset(c, name),
                      "tensor '" NAME_FMT "': shape has %zu dimensions, at most %d supported",
                      name, nd, LS_TENSOR_MAX_DIMS);
    /* numel with overflow tracked separately: a zero dimension makes the
     * product 0 even when earlier dimensions overflowed. */
    uint64_t numel = 1;
    int overflow = 0, zero = 0;
    for (size_t d = 0; d < nd; d++) {
        uint64_t dim;
        if (get_uint(json_array_get(js, d), &dim) != 0)
            return st_bad(c->err, c->label, key_offset(c, name),
                          "tensor '" NAME_FMT "': shape[%zu] is not a non-negative integer",
                          name, d);
        t->shape[d] = (int64_t)dim;
        if (dim == 0) zero = 1;
        else if (numel > UINT64_MAX / dim) overflow = 1;
        else numel *= dim;
    }
    t->ndim = (int)nd;
    if (zero) {
        numel = 0;
        overflow = 0;
    }
    size_t esize = ls_dtype_size(t->dtype);
    if (!overflow && numel > UINT64_MAX / esize) overflow = 1;

    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return st_bad(c->err, c->label, key_offset(c, name),
                      "tensor '" NAME_FMT "': data_offsets is not a [begin, end] pair", name);
    uint64_t begin, end;
    if (get_uint(json_array_get(jo, 0), &begin) != 0 || get_uint(json_array_get(jo, 1), &end) != 0)
        return st_bad(c->err, c->label, key_offset(c, name),
                      "tensor '" NAME_FMT "': data_offsets are not non-negative integers", name);
    if (begin > end)
        return st_bad(c->err, c->label, key_offset(c, name),
                      "tensor '" NAME_FMT "': data_offsets begin %llu > end %llu", name,
                      (unsigned long long)begin, (unsigned long long)end);
    uint64_t data_start = 8 + (uint64_t)c->header_len;
    if (overflow || numel * esize != end - begin)
        return st_bad(c->err, c->label, key_offset(c, name),
                      "tensor '" NAME_FMT "': shape x dtype %s is %s%llu bytes but data_offsets "
                      "span %llu bytes", name, ls_dtype_name(t->dtype), overflow ? "more than " : "",
                      overflow ? (unsigned long long)UINT64_MAX : (unsigned long long)(numel * esize),
                      (unsigned long long)(end - begin));
    if (end > data_len)
        return st_bad(c->err, c->label, data_start + begin,
                      "tensor '" NAME_FMT "': data_offsets [%llu, %llu) run past the data region "
                      "of %llu bytes", name, (unsigned long long)begin, (unsigned long long)end,
                      (unsigned long long)data_len);
    t->numel = numel;
    t->size_bytes = end - begin;
    t->file_offset_bytes = data_start + begin;
    *begin_out = begin;
    return LS_OK;
}

static ls_status parse_metadata(const parse_ctx *c, const json_t *meta, ls_safetensors *st)
{
    if (!json_is_object(meta))
        return st_bad(c->err, c->label, key_offset(c, "__metadata__"),
                      "__metadata__ is not a JSON object");
    size_t n = json_object_size(meta);
    st->meta_keys = calloc(n ? n : 1, sizeof *st->meta_keys);
    st->meta_values = calloc(n ? n : 1, sizeof *st->meta_values);
    if (!st->meta_keys || !st->meta_values)
        return ls_fail(c->err, LS_E_NOMEM, "%s: out of memory", c->label);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)meta, k, v) {
        if (!json_is_string(v))
            return st_bad(c->err, c->label, key_offset(c, "__metadata__"),
                          "__metadata__ value of '%.200s' is not a string", k);
        size_t i = st->meta_count;
        st->meta_keys[i] = strdup(k);
        st->meta_values[i] = strdup(json_string_value(v));
        if (!st->meta_keys[i] || !st->meta_values[i]) {
            free(st->meta_keys[i]);
            free(st->meta_values[i]);
            return ls_fail(c->err, LS_E_NOMEM, "%s: out of memory", c->label);
        }
        st->meta_count++;
    }
    /* Sorted by key so that iteration order does not depend on the file. */
    for (size_t i = 1; i < st->meta_count; i++) {
        for (size_t j = i; j > 0 && strcmp(st->meta_keys[j - 1], st->meta_keys[j]) > 0; j--) {
            char *tk = st->meta_keys[j], *tv = st->meta_values[j];
            st->meta_keys[j] = st->meta_keys[j - 1];
            st->meta_values[j] = st->meta_values[j - 1];
            st->meta_keys[j - 1] = tk;
            st->meta_values[j - 1] = tv;
        }
    }
    return LS_OK;
}

/* ---- sorting ------------------------------------------------------------------- */

typedef struct span {
    uint64_t begin, end;
    size_t idx;              /* index into the unsorted tensor array */
    const char *name;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name); /* ties among empty tensors: deterministic */
}

static int cmp_by_name_ctx(const ls_tensor *ts, size_t a, size_t b)
{
    return strcmp(ts[a].name, ts[b].name);
}

/* Merge sort of indices by tensor name (qsort lacks a context pointer). */
static void sort_by_name(const ls_tensor *ts, size_t *idx, size_t *tmp, size_t n)
{
    if (n < 2) return;
    size_t h = n / 2;
    sort_by_name(ts, idx, tmp, h);
    sort_by_name(ts, idx + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = cmp_by_name_ctx(ts, idx[i], idx[j]) <= 0 ? idx[i++] : idx[j++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

/* ---- validation ------------------------------------------------------------------ */

static ls_status validate_image(ls_safetensors *st, ls_error *err)
{
    const char *label = st->label;
    const unsigned char *img = st->image;
    size_t file_len = st->file_len;
    if (file_len < 8)
        return st_bad(err, label, 0,
                      "file is %zu bytes, too short for the 8-byte header length", file_len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | img[i];
    if (n > LS_ST_HEADER_MAX_BYTES)
        return st_bad(err, label, 0, "header length %llu exceeds the limit of %llu bytes",
                      (unsigned long long)n, LS_ST_HEADER_MAX_BYTES);
    if (8 + n > file_len)
        return st_bad(err, label, 0, "header length %llu runs past the end of the %zu-byte file",
                      (unsigned long long)n, file_len);
    st->header_len = n;
    uint64_t data_len = file_len - 8 - n;

    parse_ctx c = {label, (const char *)img + 8, (size_t)n, err};
    json_t *root = NULL;
    json_error_t je;
    size_t nomem = 0;
    root = ls_json_loadb(c.header, c.header_len, JSON_REJECT_DUPLICATES, &je, &nomem);
    if (!root && nomem)
        return ls_fail_nomem(err, nomem, "%s: parsing the %llu-byte header JSON (byte offset 8)", label,
                             (unsigned long long)n);
    if (!root)
        return st_bad(err, label, 8 + (uint64_t)(je.position > 0 ? je.position : 0),
                      "header is not valid JSON (line %d, column %d): %s", je.line, je.column,
                      je.text);
    ls_status rc = LS_OK;
    span *spans = NULL;
    ls_tensor *unsorted = NULL;
    size_t cap = 0, count = 0;
    if (!json_is_object(root)) {
        rc = st_bad(err, label, 8, "header is not a JSON object");
        goto done;
    }
    cap = json_object_size(root);
    unsorted = calloc(cap ? cap : 1, sizeof *unsorted);
    spans = calloc(cap ? cap : 1, sizeof *spans);
    if (!unsorted || !spans) {
        rc = ls_fail(err, LS_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            rc = parse_metadata(&c, val, st);
            if (rc != LS_OK) goto done;
            continue;
        }
        ls_tensor *t = &unsorted[count];
        uint64_t begin = 0;
        rc = parse_tensor(&c, key, val, data_len, t, &begin);
        if (rc != LS_OK) goto done;
        t->name = t->stored_name = strdup(key);
        if (!t->name) {
            rc = ls_fail(err, LS_E_NOMEM, "%s: out of memory", label);
            goto done;
        }
        spans[count] = (span){begin, begin + t->size_bytes, count, t->name};
        count++;
    }

    /* Spans in data order must tile [0, data_len) exactly: no gap (bytes no
     * tensor owns would escape every digest), no overlap (two tensors sharing
     * bytes). */
    qsort(spans, count, sizeof *spans, cmp_span);
    uint64_t expect = 0;
    uint64_t base = 8 + n;
    for (size_t i = 0; i < count; i++) {
        const span *s = &spans[i];
        if (s->begin > expect) {
            if (i == 0)
                rc = st_bad(err, label, base + s->begin,
                            "tensor '" NAME_FMT "': data starts at offset %llu, not 0: %llu bytes "
                            "at the start of the data region belong to no tensor",
                            s->name, (unsigned long long)s->begin, (unsigned long long)s->begin);
            else
                rc = st_bad(err, label, base + s->begin,
                            "tensor '" NAME_FMT "': gap of %llu bytes after tensor '" NAME_FMT
                            "' (data_offsets must be contiguous)", s->name,
                            (unsigned long long)(s->begin - expect), spans[i - 1].name);
            goto done;
        }
        if (s->begin < expect) {
            rc = st_bad(err, label, base + s->begin,
                        "tensor '" NAME_FMT "': data [%llu, %llu) overlaps tensor '" NAME_FMT
                        "' which ends at %llu", s->name, (unsigned long long)s->begin,
                        (unsigned long long)s->end, spans[i - 1].name, (unsigned long long)expect);
            goto done;
        }
        expect = s->end;
    }
    if (expect != data_len) {
        rc = st_bad(err, label, base + expect,
                    "data region is %llu bytes but tensors cover only %llu: %llu trailing bytes "
                    "belong to no tensor", (unsigned long long)data_len,
                    (unsigned long long)expect, (unsigned long long)(data_len - expect));
        goto done;
    }

    st->tensors = calloc(count ? count : 1, sizeof *st->tensors);
    st->by_name = calloc(count ? count : 1, sizeof *st->by_name);
    size_t *tmp = calloc(count ? count : 1, sizeof *tmp);
    if (!st->tensors || !st->by_name || !tmp) {
        free(tmp);
        rc = ls_fail(err, LS_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    for (size_t i = 0; i < count; i++) {
        ls_tensor *t = &st->tensors[i];
        *t = unsorted[spans[i].idx];
        unsorted[spans[i].idx].name = NULL; /* moved */
        t->data = img + t->file_offset_bytes;
        t->shard = 0;
        st->by_name[i] = i;
    }
    st->count = count;
    sort_by_name(st->tensors, st->by_name, tmp, count);
    free(tmp);

done:
    if (unsorted) {
        for (size_t i = 0; i < cap; i++) free((char *)unsorted[i].name);
        free(unsorted);
    }
    free(spans);
    json_decref(root);
    return rc;
}

/* ---- public ---------------------------------------------------------------------- */

static ls_safetensors *st_new(const char *label, ls_error *err)
{
    ls_safetensors *st = calloc(1, sizeof *st);
    if (st) st->map_slot = -1;
    if (st) st->label = strdup(label ? label : "<memory>");
    if (!st || !st->label) {
        free(st);
        ls_fail(err, LS_E_NOMEM, "%s: out of memory", label ? label : "<memory>");
        return NULL;
    }
    return st;
}

ls_status ls_safetensors_open_mem(const char *label, const void *image, size_t file_len,
                                  ls_safetensors **out, ls_error *err)
{
    if (!out) return ls_fail(err, LS_E_USAGE, "ls_safetensors_open_mem: out is NULL");
    *out = NULL;
    if (!image && file_len) return ls_fail(err, LS_E_USAGE, "ls_safetensors_open_mem: image is NULL");
    ls_safetensors *st = st_new(label, err);
    if (!st) return LS_E_NOMEM;
    static const unsigned char empty[1];
    st->image = image ? image : empty;
    st->file_len = file_len;
    ls_status rc = validate_image(st, err);
    if (rc != LS_OK) {
        ls_safetensors_close(st);
        return rc;
    }
    *out = st;
    return LS_OK;
}

/* ---- file identity ------------------------------------------------------------ */

static void identity_from_stat(const struct stat *sb, ls_file_identity *out)
{
    out->dev = (uint64_t)sb->st_dev;
    out->ino = (uint64_t)sb->st_ino;
    out->size_bytes = (uint64_t)sb->st_size;
    out->mtime_ns = (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
    out->ctime_ns = (int64_t)sb->st_ctim.tv_sec * 1000000000 + sb->st_ctim.tv_nsec;
}

ls_status ls_file_identity_stat(const char *path, ls_file_identity *out, ls_error *err)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ls_fail(err, LS_E_IO, "%s: cannot stat: %s", path, strerror(errno));
    identity_from_stat(&sb, out);
    return LS_OK;
}

int ls_file_identity_equal(const ls_file_identity *a, const ls_file_identity *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size_bytes == b->size_bytes &&
           a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

ls_status ls_safetensors_open(const char *path, ls_safetensors **out, ls_error *err)
{
    if (!out || !path) return ls_fail(err, LS_E_USAGE, "ls_safetensors_open: NULL argument");
    *out = NULL;
    int fd;
    struct stat sb;
    LS_TRY(ls_file_open_regular(path, &fd, &sb, err));
    ls_safetensors *st = st_new(path, err);
    if (!st) {
        close(fd);
        return LS_E_NOMEM;
    }
    identity_from_stat(&sb, &st->identity);
    st->has_identity = 1;
    size_t len = (size_t)sb.st_size;
    if (len > 0) {
        /* Read-only private mapping: tensor data is never copied, and pages of
         * tensors nobody reads are never faulted in. */
        void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            ls_safetensors_close(st);
            /* ENOMEM: no address space left for the mapping (ulimit -v, or
             * too many mappings), which is running out of memory. */
            if (e == ENOMEM) return ls_fail_nomem(err, len, "%s: mapping the file", path);
            return ls_fail(err, LS_E_IO, "%s: cannot mmap %zu bytes: %s", path, len, strerror(e));
        }
        st->map = m;
        st->map_len = len;
        st->image = m;
        /* Registered before the first byte is read (the header), so that a
         * file cut short by another process from here on ends in one line
         * naming it (under the CLI's SIGBUS handler) instead of a bare
         * "Bus error" (core/util.h). */
        st->map_slot = ls_map_register(st->label, m, len);
    } else {
        static const unsigned char empty[1];
        st->image = empty; /* mmap refuses length 0; validation reports the short file */
    }
    close(fd);
    st->file_len = len;
    ls_status rc = validate_image(st, err);
    if (rc != LS_OK) {
        ls_safetensors_close(st);
        return rc;
    }
    *out = st;
    return LS_OK;
}

const char *ls_safetensors_label(const ls_safetensors *st)
{
    return st ? st->label : NULL;
}

const ls_file_identity *ls_safetensors_identity(const ls_safetensors *st)
{
    return st && st->has_identity ? &st->identity : NULL;
}

size_t ls_safetensors_count(const ls_safetensors *st)
{
    return st ? st->count : 0;
}

const ls_tensor *ls_safetensors_at(const ls_safetensors *st, size_t i)
{
    return st && i < st->count ? &st->tensors[i] : NULL;
}

const ls_tensor *ls_safetensors_find(const ls_safetensors *st, const char *name)
{
    if (!st || !name) return NULL;
    size_t lo = 0, hi = st->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const ls_tensor *t = &st->tensors[st->by_name[mid]];
        int c = strcmp(t->name, name);
        if (c == 0) return t;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

size_t ls_safetensors_metadata_count(const ls_safetensors *st)
{
    return st ? st->meta_count : 0;
}

void ls_safetensors_metadata_at(const ls_safetensors *st, size_t i, const char **key,
                                const char **value)
{
    int ok = st && i < st->meta_count;
    if (key) *key = ok ? st->meta_keys[i] : NULL;
    if (value) *value = ok ? st->meta_values[i] : NULL;
}

void ls_safetensors_close(ls_safetensors *st)
{
    if (!st) return;
    for (size_t i = 0; i < st->count; i++) free((char *)st->tensors[i].name);
    free(st->tensors);
    free(st->by_name);
    for (size_t i = 0; i < st->meta_count; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->meta_keys);
    free(st->meta_values);
    ls_map_unregister(st->map_slot); /* before the range and the label go */
    if (st->map) munmap(st->map, st->map_len);
    free(st->label);
    free(st);
}
