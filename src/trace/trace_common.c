/* lockstep — trace format pieces shared by writer, reader and index:
 * names, the header JSON, frame loading, record decoding, the trailer. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <jansson.h>
/* the context-size estimates, for out-of-memory messages (exported by
 * libzstd, declared in its static-linking section) */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>

#include "io/json.h"
#include "trace/trace_internal.h"

/* ---- names ------------------------------------------------------------------ */
static const char *const family_names[LS_FAMILY_COUNT] = {"embed", "gdn", "attention", "moe", "norm", "lm_head"};
static const char *const kind_names[LS_DIGEST_COUNT] = {"hidden", "gdn_state", "conv_state", "kv", "router"};

const char *ls_layer_family_name(ls_layer_family f)
{
    return (unsigned)f < LS_FAMILY_COUNT ? family_names[f] : "?";
}
const char *ls_digest_kind_name(ls_digest_kind k)
{
    return (unsigned)k < LS_DIGEST_COUNT ? kind_names[k] : "?";
}
int ls_layer_family_parse(const char *name)
{
    for (int i = 0; i < LS_FAMILY_COUNT; i++)
        if (strcmp(name, family_names[i]) == 0) return i;
    return -1;
}
int ls_digest_kind_parse(const char *name)
{
    for (int i = 0; i < LS_DIGEST_COUNT; i++)
        if (strcmp(name, kind_names[i]) == 0) return i;
    return -1;
}
size_t ls_dump_dtype_size(unsigned dtype)
{
    switch (dtype) {
    case LS_DUMP_BF16: return 2;
    case LS_DUMP_FP32: return 4;
    case LS_DUMP_ROUTER: return 4;
    default: return 0;
    }
}

/* ---- header JSON ----------------------------------------------------------------- */
static int is_hex64(const char *s)
{
    if (!s || strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!strchr("0123456789abcdef", s[i])) return 0;
    return 1;
}

ls_status ls_trace_header_to_json(const ls_trace_header *h, char **out, ls_error *err)
{
    *out = NULL;
    if (!h->mode || (strcmp(h->mode, "rollout") && strcmp(h->mode, "replay") && strcmp(h->mode, "import")))
        return ls_fail(err, LS_E_USAGE, "trace header: mode must be rollout, replay or import");
    if (!is_hex64(h->model_fingerprint))
        return ls_fail(err, LS_E_USAGE, "trace header: model_fingerprint must be 64 lower-case hex characters");
    if (h->manifest_digest && h->manifest_digest[0] && !is_hex64(h->manifest_digest))
        return ls_fail(err, LS_E_USAGE, "trace header: manifest_digest must be empty or 64 lower-case hex characters");
    if (h->topk < 1 || h->topk > LS_TRACE_TOPK_MAX)
        return ls_fail(err, LS_E_USAGE, "trace header: topk %d outside 1..%d", h->topk, LS_TRACE_TOPK_MAX);
    if (h->n_layers < 0 || h->n_layers > 65535 || (h->n_layers && !h->layers))
        return ls_fail(err, LS_E_USAGE, "trace header: n_layers %d outside 0..65535", h->n_layers);
    if (h->digest_kinds_mask >> LS_DIGEST_COUNT)
        return ls_fail(err, LS_E_USAGE, "trace header: unknown digest kind bits 0x%x", h->digest_kinds_mask);
    const char *act = h->activation_dtype ? h->activation_dtype : "bf16";
    if (strcmp(act, "bf16") && strcmp(act, "fp32"))
        return ls_fail(err, LS_E_USAGE, "trace header: activation_dtype must be bf16 or fp32");
    /* run_params is opaque (section 3): checked as JSON syntax, written byte for byte. */
    const char *params_text = h->run_params_json && h->run_params_json[0] ? h->run_params_json : "{}";
    LS_TRY(ls_trace_run_params_check(params_text, err));
    json_t *params = json_object(); /* a placeholder, replaced by params_text below */
    json_t *kinds = json_array(), *layers = json_array();
    for (int k = 0; k < LS_DIGEST_COUNT; k++)
        if (h->digest_kinds_mask & (1u << k)) json_array_append_new(kinds, json_string(kind_names[k]));
    for (int i = 0; i < h->n_layers; i++) {
        const ls_trace_layer *l = &h->layers[i];
        if (l->index != i || (unsigned)l->family >= LS_FAMILY_COUNT) {
            json_decref(params); json_decref(kinds); json_decref(layers);
            return ls_fail(err, LS_E_USAGE, "trace header: layer %d has index %d or an unknown family", i, l->index);
        }
        json_array_append_new(layers, json_pack("{s:i,s:s,s:i}", "index", i, "family",
                                                family_names[l->family], "decoder_layer", l->decoder_layer));
    }
    json_t *root = json_pack("{s:s,s:s,s:s,s:s,s:s,s:o,s:i,s:o,s:I,s:s,s:o}", "format", "lockstep-trace",
                             "mode", h->mode, "engine", h->engine ? h->engine : "", "model_fingerprint",
                             h->model_fingerprint, "manifest_digest", h->manifest_digest ? h->manifest_digest : "",
                             "run_params", params, "topk", h->topk, "digest_kinds", kinds,
                             "state_digest_every", (json_int_t)(h->state_digest_every ? h->state_digest_every : 1),
                             "activation_dtype", act, "layers", layers);
    if (!root) return ls_fail(err, LS_E_NOMEM, "trace header: cannot build JSON");
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return ls_fail(err, LS_E_NOMEM, "trace header: cannot serialise JSON");
    /* The first '"run_params":{}' is the member: inside an encoded string
     * every '"' follows a backslash, so the pattern cannot occur there. */
    static const char slot[] = "\"run_params\":{}";
    char *at = strstr(text, slot);
    size_t head = at ? (size_t)(at - text) + sizeof slot - 3 : 0, np = strlen(params_text);
    *out = at ? malloc(strlen(text) - 2 + np + 1) : NULL;
    if (*out) {
        memcpy(*out, text, head);
        memcpy(*out + head, params_text, np);
        strcpy(*out + head + np, text + head + 2);
    }
    free(text);
    if (!*out) return ls_fail(err, at ? LS_E_NOMEM : LS_E_INTERNAL, "trace header: cannot serialise JSON");
    return LS_OK;
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void ls_trace_header_owned_free(ls_trace_header_owned *o)
{
    free(o->mode); free(o->engine); free(o->model_fingerprint); free(o->manifest_digest);
    free(o->run_params_json); free(o->activation_dtype); free(o->layers);
    memset(o, 0, sizeof *o);
}

static ls_status get_str(json_t *root, const char *key, char **out, const char *where, ls_error *err)
{
    json_t *v = json_object_get(root, key);
    if (!json_is_string(v)) return ls_fail(err, LS_E_INPUT, "%s: header field \"%s\" missing or not a string", where, key);
    *out = dup_str(json_string_value(v));
    return *out ? LS_OK : ls_fail_nomem(err, strlen(json_string_value(v)) + 1, "%s: header field \"%s\"", where, key);
}

ls_status ls_trace_header_from_json(const char *json, size_t len, ls_trace_header_owned *o, const char *where,
                                    ls_error *err)
{
    memset(o, 0, sizeof *o);
    /* run_params is opaque (section 3): its syntax is checked and its text
     * kept; jansson parses the rest with it blanked to "{}" and spaces (the
     * same length, so byte positions in messages stay the file's). */
    size_t p_at, p_len;
    LS_TRY(ls_trace_json_locate(json, len, "run_params", &p_at, &p_len, where, err));
    if (p_len && json[p_at] == '{') {
        o->run_params_json = malloc(p_len + 1);
        char *blank = malloc(len ? len : 1);
        if (!o->run_params_json || !blank) {
            free(blank);
            ls_trace_header_owned_free(o);
            return ls_fail(err, LS_E_NOMEM, "out of memory");
        }
        memcpy(o->run_params_json, json + p_at, p_len);
        o->run_params_json[p_len] = 0;
        memcpy(blank, json, len);
        memset(blank + p_at, ' ', p_len);
        memcpy(blank + p_at, "{}", 2);
        json = blank;
    }
    json_error_t je;
    size_t nomem = 0;
    json_t *root = ls_json_loadb(json, len, JSON_REJECT_DUPLICATES, &je, &nomem);
    if (o->run_params_json) free((char *)json);
    if (!root && nomem) {
        ls_trace_header_owned_free(o);
        return ls_fail_nomem(err, nomem, "%s: parsing the %zu-byte header JSON", where, len);
    }
    if (!root || !json_is_object(root)) {
        json_decref(root);
        ls_trace_header_owned_free(o);
        return ls_fail(err, LS_E_INPUT, "%s: header JSON: %s (JSON byte %d)", where, root ? "not an object" : je.text,
                       je.position);
    }
    ls_status st = LS_OK;
    json_t *fmt = json_object_get(root, "format");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "lockstep-trace")) {
        st = ls_fail(err, LS_E_INPUT, "%s: header field \"format\" is not \"lockstep-trace\"", where);
        goto out;
    }
    if ((st = get_str(root, "mode", &o->mode, where, err)) || (st = get_str(root, "engine", &o->engine, where, err)) ||
        (st = get_str(root, "model_fingerprint", &o->model_fingerprint, where, err)) ||
        (st = get_str(root, "manifest_digest", &o->manifest_digest, where, err)) ||
        (st = get_str(root, "activation_dtype", &o->activation_dtype, where, err)))
        goto out;
    /* The mode fixes the frame kinds (section 4): a header-only or frameless
     * trace of another mode must not read as an empty rollout. */
    if (strcmp(o->mode, "rollout") && strcmp(o->mode, "replay") && strcmp(o->mode, "import")) {
        st = ls_fail(err, LS_E_INPUT, "%s: header field \"mode\" is \"%.40s\": expected rollout, replay or import",
                     where, o->mode);
        goto out;
    }
    if (!is_hex64(o->model_fingerprint) || (o->manifest_digest[0] && !is_hex64(o->manifest_digest))) {
        st = ls_fail(err, LS_E_INPUT, "%s: model_fingerprint/manifest_digest must be 64 lower-case hex characters", where);
        goto out;
    }
    if (strcmp(o->activation_dtype, "bf16") && strcmp(o->activation_dtype, "fp32")) {
        st = ls_fail(err, LS_E_INPUT, "%s: activation_dtype \"%s\" is not bf16 or fp32", where, o->activation_dtype);
        goto out;
    }
    json_t *params = json_object_get(root, "run_params");
    if (!json_is_object(params)) {
        st = ls_fail(err, LS_E_INPUT, "%s: header field \"run_params\" missing or not an object", where);
        goto out;
    }
    /* a key spelled with escapes ("run\u005fparams") was not located above: jansson's value then */
    if (!o->run_params_json) o->run_params_json = json_dumps(params, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_t *topk = json_object_get(root, "topk"), *every = json_object_get(root, "state_digest_every");
    if (!json_is_integer(topk) || json_integer_value(topk) < 1 || json_integer_value(topk) > LS_TRACE_TOPK_MAX) {
        st = ls_fail(err, LS_E_INPUT, "%s: header field \"topk\" missing or outside 1..%d", where, LS_TRACE_TOPK_MAX);
        goto out;
    }
    if (!json_is_integer(every) || json_integer_value(every) < 1 || json_integer_value(every) > UINT32_MAX) {
        st = ls_fail(err, LS_E_INPUT, "%s: header field \"state_digest_every\" missing or < 1", where);
        goto out;
    }
    json_t *kinds = json_object_get(root, "digest_kinds"), *layers = json_object_get(root, "layers");
    if (!json_is_array(kinds) || !json_is_array(layers) || json_array_size(layers) > 65535) {
        st = ls_fail(err, LS_E_INPUT, "%s: header fields \"digest_kinds\"/\"layers\" missing or not arrays", where);
        goto out;
    }
    uint32_t mask = 0;
    for (size_t i = 0; i < json_array_size(kinds); i++) {
        json_t *k = json_array_get(kinds, i);
        int kk = json_is_string(k) ? ls_digest_kind_parse(json_string_value(k)) : -1;
        if (kk < 0) {
            st = ls_fail(err, LS_E_INPUT, "%s: digest_kinds[%zu] is not a known digest kind", where, i);
            goto out;
        }
        if (mask & (1u << kk)) { /* section 3: "none repeated" */
            st = ls_fail(err, LS_E_INPUT, "%s: digest_kinds[%zu] repeats \"%s\"", where, i, json_string_value(k));
            goto out;
        }
        mask |= 1u << kk;
    }
    size_t nl = json_array_size(layers);
    o->layers = calloc(nl ? nl : 1, sizeof *o->layers);
    if (!o->layers) { st = ls_fail_nomem(err, (nl ? nl : 1) * sizeof *o->layers, "%s: table of %zu layers", where, nl); goto out; }
    for (size_t i = 0; i < nl; i++) {
        json_t *l = json_array_get(layers, i);
        json_t *ix = json_object_get(l, "index"), *fam = json_object_get(l, "family"),
               *dl = json_object_get(l, "decoder_layer");
        int f = json_is_string(fam) ? ls_layer_family_parse(json_string_value(fam)) : -1;
        if (!json_is_integer(ix) || json_integer_value(ix) != (json_int_t)i || f < 0 || !json_is_integer(dl) ||
            json_integer_value(dl) < -1 || json_integer_value(dl) > 1000000) {
            st = ls_fail(err, LS_E_INPUT, "%s: layers[%zu] needs index %zu, a known family and decoder_layer >= -1",
                         where, i, i);
            goto out;
        }
        o->layers[i] = (ls_trace_layer){(int)i, (ls_layer_family)f, (int)json_integer_value(dl)};
    }
    o->h.mode = o->mode;
    o->h.engine = o->engine;
    o->h.model_fingerprint = o->model_fingerprint;
    o->h.manifest_digest = o->manifest_digest;
    o->h.run_params_json = o->run_params_json;
    o->h.activation_dtype = o->activation_dtype;
    o->h.topk = (int)json_integer_value(topk);
    o->h.digest_kinds_mask = mask;
    o->h.state_digest_every = (uint32_t)json_integer_value(every);
    o->h.n_layers = (int)nl;
    o->h.layers = o->layers;
out:
    json_decref(root);
    if (st == LS_OK && !o->run_params_json) st = ls_fail(err, LS_E_NOMEM, "out of memory");
    if (st != LS_OK) ls_trace_header_owned_free(o);
    return st;
}

ls_status ls_trace_read_file_header(ls_trace_file *f, ls_trace_header_owned *out, uint64_t *end_offset,
                                    ls_error *err)
{
    const char *path = f->path;
    uint64_t file_bytes = f->bytes;
    size_t got = file_bytes < LS_TRACE_FILE_HEAD_BYTES ? (size_t)file_bytes : LS_TRACE_FILE_HEAD_BYTES;
    uint8_t *buf = NULL;
    size_t cap = 0;
    const uint8_t *head;
    ls_status st = ls_trace_file_view(f, 0, got, &buf, &cap, &head, err);
    if (st) { free(buf); return st; }
    if (got < 8 || memcmp(head, LS_TRACE_MAGIC, 8) != 0) {
        free(buf);
        return ls_fail(err, LS_E_INPUT, "%s: offset 0: not a lockstep trace (bad magic)", path);
    }
    if (got < LS_TRACE_FILE_HEAD_BYTES) {
        free(buf);
        return ls_fail(err, LS_E_INPUT, "%s: offset %zu: truncated file header (file is %" PRIu64 " bytes)", path,
                       got, file_bytes);
    }
    uint16_t major = ls_rd16(head + 8), minor = ls_rd16(head + 10);
    uint32_t jlen = ls_rd32(head + 12);
    free(buf); /* fields copied out: head is not used below */
    buf = NULL;
    cap = 0;
    if (major != LS_TRACE_VERSION_MAJOR)
        return ls_fail(err, LS_E_UNSUPPORTED,
                       "%s: offset 8: trace format version %u.%u; this lockstep reads major version %u only", path,
                       major, minor, LS_TRACE_VERSION_MAJOR);
    if (jlen > LS_TRACE_JSON_MAX_BYTES)
        return ls_fail(err, LS_E_INPUT, "%s: offset 12: header JSON length %u exceeds %u", path, jlen,
                       LS_TRACE_JSON_MAX_BYTES);
    uint64_t all = LS_TRACE_FILE_HEAD_BYTES + (uint64_t)jlen + 32;
    if (all > file_bytes)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": truncated header (needs %" PRIu64 " bytes, file is %" PRIu64 ")",
                       path, file_bytes, all, file_bytes);
    /* the checksum covers bytes 0 .. 16 + jlen - 1: view them again, whole */
    if ((st = ls_trace_file_view(f, 0, (size_t)all, &buf, &cap, &head, err))) {
        free(buf);
        return st;
    }
    const char *json = (const char *)head + LS_TRACE_FILE_HEAD_BYTES;
    ls_digest d;
    if ((st = ls_sha256_buf(head, LS_TRACE_FILE_HEAD_BYTES + (size_t)jlen, &d, err))) { free(buf); return st; }
    if (memcmp(d.bytes, json + jlen, 32) != 0) {
        free(buf);
        return ls_fail(err, LS_E_INPUT, "%s: offset 0: header checksum mismatch (header bytes 0..%u corrupted)", path,
                       (unsigned)(LS_TRACE_FILE_HEAD_BYTES + jlen + 31));
    }
    char where[600];
    snprintf(where, sizeof where, "%s: offset 16", path);
    st = ls_trace_header_from_json(json, jlen, out, where, err);
    free(buf);
    if (st) return st;
    out->h.version_major = major;
    out->h.version_minor = minor;
    *end_offset = LS_TRACE_FILE_HEAD_BYTES + (uint64_t)jlen + 32;
    return LS_OK;
}

/* ---- frames -------------------------------------------------------------------------- */
static ls_status grow(void **p, size_t *cap, size_t need, size_t elem, ls_error *err)
{
    if (need <= *cap) return LS_OK;
    size_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q) return ls_fail_nomem(err, n * elem, "trace: read buffer");
    *p = q;
    *cap = n;
    return LS_OK;
}

/* Like grow, for a payload buffer whose contents need not survive growth.
 * Buffers of megabytes are 2 MiB aligned and offered to the kernel for huge
 * pages: a fresh multi-megabyte frame otherwise costs one page fault per
 * 4 KiB, which showed up as a fifth of 'lockstep compare' time. */
ls_status ls_trace_grow_payload(uint8_t **p, size_t *cap, size_t need, ls_error *err)
{
    const size_t huge = (size_t)2 << 20;
    if (need <= *cap) return LS_OK;
    if (need < huge) return grow((void **)p, cap, need, 1, err);
    size_t n = (need + huge - 1) & ~(huge - 1);
    void *q = NULL;
    if (posix_memalign(&q, huge, n) != 0) return ls_fail_nomem(err, n, "trace: payload buffer");
#ifdef MADV_HUGEPAGE
    (void)madvise(q, n, MADV_HUGEPAGE); /* advice only: without huge pages it still works */
#endif
    free(*p);
    *p = q;
    *cap = n;
    return LS_OK;
}

void ls_frame_buf_free(ls_frame_buf *fb)
{
    free(fb->segs); free(fb->head_buf); free(fb->comp_buf); free(fb->data); free(fb->rec_off);
    ZSTD_freeDCtx(fb->dctx);
    memset(fb, 0, sizeof *fb);
}

/* ---- layout rules ------------------------------------------------------------------- */
static const char *const frame_kind_names[LS_TRACE_FRAME_KIND_COUNT] = {"prefill", "decode", "chunk", "import"};

const char *ls_trace_frame_kind_name(unsigned kind)
{
    return kind < LS_TRACE_FRAME_KIND_COUNT ? frame_kind_names[kind] : "?";
}

int ls_trace_kind_allowed(ls_layer_family f, unsigned kind)
{
    switch (kind) {
    case LS_DIGEST_HIDDEN: return 1;
    case LS_DIGEST_GDN_STATE:
    case LS_DIGEST_CONV_STATE: return f == LS_FAMILY_GDN;
    case LS_DIGEST_KV: return f == LS_FAMILY_ATTENTION;
    case LS_DIGEST_ROUTER: return f == LS_FAMILY_MOE;
    default: return 0;
    }
}

void ls_trace_layout_init(ls_trace_layout *l, const ls_trace_header *h)
{
    memset(l, 0, sizeof *l);
    const char *m = h->mode ? h->mode : "";
    /* Section 4: a rollout writes its prefill and decode steps, a replay its
     * chunks, an importer import frames. */
    if (!strcmp(m, "rollout")) l->mode = "rollout", l->frame_kinds = 1u << LS_FRAME_PREFILL | 1u << LS_FRAME_DECODE;
    else if (!strcmp(m, "replay")) l->mode = "replay", l->frame_kinds = 1u << LS_FRAME_CHUNK;
    else if (!strcmp(m, "import")) l->mode = "import", l->frame_kinds = 1u << LS_FRAME_IMPORT;
    else l->mode = "?";
    l->kinds_mask = h->digest_kinds_mask;
    l->state_every = h->state_digest_every ? h->state_digest_every : 1;
    l->n_layers = h->n_layers;
    l->layers = h->layers;
    for (int i = 0; i < h->n_layers; i++)
        if ((unsigned)h->layers[i].family < LS_FAMILY_COUNT) l->n_family[h->layers[i].family]++;
}

const char *ls_trace_mode_frames(const ls_trace_layout *l)
{
    switch (l->frame_kinds) {
    case 1u << LS_FRAME_PREFILL | 1u << LS_FRAME_DECODE: return "prefill and decode";
    case 1u << LS_FRAME_CHUNK: return "chunk";
    case 1u << LS_FRAME_IMPORT: return "import";
    default: return "no";
    }
}

int ls_trace_layout_missing_kind(const ls_trace_layout *l, uint32_t pos, const uint32_t count[LS_DIGEST_COUNT])
{
    uint32_t want[LS_DIGEST_COUNT] = {(uint32_t)l->n_layers, l->n_family[LS_FAMILY_GDN], l->n_family[LS_FAMILY_GDN],
                                      l->n_family[LS_FAMILY_ATTENTION], l->n_family[LS_FAMILY_MOE]};
    int state_due = pos % l->state_every == l->state_every - 1;
    for (int k = 0; k < LS_DIGEST_COUNT; k++) {
        if (!(l->kinds_mask & (1u << k)) || count[k] == want[k]) continue;
        int state = k == LS_DIGEST_GDN_STATE || k == LS_DIGEST_CONV_STATE;
        if (state && count[k] == 0 && !state_due) continue; /* not a state position the reader can name */
        return k;
    }
    return -1;
}

void ls_rec_decoder_init(ls_rec_decoder *d, const ls_trace_header *h)
{
    ls_trace_layout_init(&d->lay, h);
    d->topk = h->topk;
    d->n_layers = h->n_layers;
    d->kinds_mask = h->digest_kinds_mask;
}

void ls_rec_decoder_free(ls_rec_decoder *d)
{
    free(d->dg);
    free(d->dm);
    d->dg = NULL; d->dm = NULL; d->dg_cap = d->dm_cap = 0;
}

/* Validates the record at data[off..] (section 5 of docs/trace-format.md)
 * and returns its byte length in *len. */
static ls_status check_record(const ls_frame_buf *fb, const ls_rec_decoder *dec, uint64_t off, uint32_t *len,
                              const char *path, ls_error *err)
{
    const uint8_t *p = fb->data + off;
    uint64_t avail = fb->uncompressed_bytes - off;
    size_t fixed = LS_TRACE_RECORD_FIXED_BYTES + 8 * (size_t)dec->topk + 4;
#define BAD(...) ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame %u, record byte %" PRIu64 ": " __VA_ARGS__)
#define BADA path, fb->offset, fb->frame_index, off
    if (avail < fixed) return BAD("record header runs past the frame payload", BADA);
    uint32_t rb = ls_rd32(p);
    if (rb < fixed || rb > avail || rb % 4) return BAD("record length %u invalid", BADA, rb);
    /* Section 5: used top-k slots first, with distinct ids >= 0; then unused
     * ones, id -1 and bits 0x7fc00000. */
    int unused = -1;
    for (int k = 0; k < dec->topk; k++) {
        int32_t id = (int32_t)ls_rd32(p + 24 + 8 * k);
        uint32_t bits = ls_rd32(p + 28 + 8 * k);
        if (id < -1) return BAD("top-k slot %d: id %d (ids are >= 0, or -1 for an unused slot)", BADA, k, id);
        if (id == -1) {
            if (bits != 0x7fc00000u)
                return BAD("top-k slot %d is unused (id -1) but its logprob bits are 0x%08x, not 0x7fc00000", BADA, k, bits);
            if (unused < 0) unused = k;
            continue;
        }
        if (unused >= 0) return BAD("top-k slot %d is used after the unused slot %d", BADA, k, unused);
        for (int j = 0; j < k; j++)
            if ((int32_t)ls_rd32(p + 24 + 8 * j) == id) return BAD("top-k slots %d and %d hold the same id %d", BADA, j, k, id);
    }
    uint16_t nd = ls_rd16(p + fixed - 4), nm = ls_rd16(p + fixed - 2);
    uint64_t q = fixed + (uint64_t)nd * LS_TRACE_DIGEST_ENTRY_BYTES;
    if (q > rb) return BAD("%u digests run past the record", BADA, nd);
    int prev = -1;
    uint32_t count[LS_DIGEST_COUNT] = {0};
    for (uint32_t i = 0; i < nd; i++) {
        const uint8_t *e = p + fixed + (size_t)i * LS_TRACE_DIGEST_ENTRY_BYTES;
        uint16_t layer = ls_rd16(e);
        uint8_t kind = e[2];
        if (e[3]) return BAD("digest %u: reserved byte 3 is 0x%02x, must be 0", BADA, i, e[3]);
        if (layer >= dec->n_layers || kind >= LS_DIGEST_COUNT || !(dec->kinds_mask & (1u << kind)))
            return BAD("digest %u: layer %u / kind %u not in the header", BADA, i, layer, kind);
        ls_layer_family fam = dec->lay.layers[layer].family;
        if (!ls_trace_kind_allowed(fam, kind))
            return BAD("digest %u: layer %u is %s, which has no %s digest (section 6)", BADA, i, layer,
                       ls_layer_family_name(fam), ls_digest_kind_name((ls_digest_kind)kind));
        int key = layer * LS_DIGEST_COUNT + kind;
        if (key <= prev) return BAD("digest %u: not ordered by (layer, kind)", BADA, i);
        prev = key;
        count[kind]++;
    }
    prev = -1;
    for (uint32_t i = 0; i < nm; i++) {
        if (q + LS_TRACE_DUMP_HEAD_BYTES > rb) return BAD("dump %u runs past the record", BADA, i);
        const uint8_t *e = p + q;
        uint16_t layer = ls_rd16(e);
        uint8_t kind = e[2], dtype = e[3];
        uint32_t n = ls_rd32(e + 4);
        size_t es = ls_dump_dtype_size(dtype);
        if (layer >= dec->n_layers || kind >= LS_DIGEST_COUNT || !es || !n ||
            ((kind == LS_DIGEST_ROUTER) != (dtype == LS_DUMP_ROUTER)) || (dtype == LS_DUMP_ROUTER && n % 2))
            return BAD("dump %u: bad layer %u / kind %u / dtype %u / n_elems %u", BADA, i, layer, kind, dtype, n);
        if (!ls_trace_kind_allowed(dec->lay.layers[layer].family, kind))
            return BAD("dump %u: layer %u is %s, which has no %s digest (section 6)", BADA, i, layer,
                       ls_layer_family_name(dec->lay.layers[layer].family), ls_digest_kind_name((ls_digest_kind)kind));
        int key = layer * LS_DIGEST_COUNT + kind;
        if (key <= prev) return BAD("dump %u: not ordered by (layer, kind)", BADA, i);
        prev = key;
        uint64_t body = ((uint64_t)n * es + 3) & ~(uint64_t)3;
        if (q + LS_TRACE_DUMP_HEAD_BYTES + body > rb) return BAD("dump %u data runs past the record", BADA, i);
        /* Section 5: the data are the canonical bytes of the kind, so their
         * SHA-256 is the record's digest of the same (layer, kind). */
        const uint8_t *dg = NULL;
        for (uint32_t k = 0; k < nd && !dg; k++) {
            const uint8_t *x = p + fixed + (size_t)k * LS_TRACE_DIGEST_ENTRY_BYTES;
            if (ls_rd16(x) == layer && x[2] == kind) dg = x + 4;
        }
        const char *kn = ls_digest_kind_name((ls_digest_kind)kind);
        if (!dg) return BAD("dump %u (layer %u, %s): the record carries no %s digest of layer %u", BADA, i, layer, kn, kn, layer);
        ls_digest h;
        LS_TRY(ls_sha256_buf(e + LS_TRACE_DUMP_HEAD_BYTES, (size_t)n * es, &h, err));
        if (memcmp(h.bytes, dg, 32) != 0)
            return BAD("dump %u (layer %u, %s): the SHA-256 of its data is not the record's %s digest of layer %u", BADA, i,
                       layer, kn, kn, layer);
        /* Reserved and padding bytes are zero, so equal records have equal bytes. */
        for (uint64_t b = (uint64_t)n * es; b < body; b++)
            if (e[LS_TRACE_DUMP_HEAD_BYTES + b])
                return BAD("dump %u: padding byte %u is 0x%02x, must be 0", BADA, i, (unsigned)(b - (uint64_t)n * es),
                           e[LS_TRACE_DUMP_HEAD_BYTES + b]);
        q += LS_TRACE_DUMP_HEAD_BYTES + body;
    }
    /* checked after the dumps: a dump without its digest is named as such */
    int missing = ls_trace_layout_missing_kind(&dec->lay, ls_rd32(p + 8), count);
    if (missing >= 0) {
        /* name the first layer that lacks it */
        int layer = 0;
        for (; layer < dec->n_layers; layer++) {
            if (!ls_trace_kind_allowed(dec->lay.layers[layer].family, (unsigned)missing)) continue;
            uint32_t i = 0;
            while (i < nd && !(ls_rd16(p + fixed + (size_t)i * LS_TRACE_DIGEST_ENTRY_BYTES) == layer &&
                               p[fixed + (size_t)i * LS_TRACE_DIGEST_ENTRY_BYTES + 2] == missing))
                i++;
            if (i == nd) break;
        }
        return BAD("seq %u pos %u lacks the %s digest of layer %d (%s): a kind in digest_kinds appears at every "
                   "position for every layer of a family that has it (section 6)", BADA, ls_rd32(p + 4), ls_rd32(p + 8),
                   ls_digest_kind_name((ls_digest_kind)missing), layer,
                   layer < dec->n_layers ? ls_layer_family_name(dec->lay.layers[layer].family) : "?");
    }
    if (q != rb) return BAD("record length %u does not match its contents (%" PRIu64 ")", BADA, rb, q);
    *len = rb;
    return LS_OK;
#undef BAD
#undef BADA
}

ls_status ls_rec_decoder_fill(ls_rec_decoder *dec, ls_error *err)
{
    ls_trace_record *r = &dec->rec;
    if ((r->digests || !r->n_digests) && (r->dumps || !r->n_dumps)) return LS_OK;
    /* ls_frame_load validated every record of the frame: decode without re-checking. */
    uint32_t nd = r->n_digests, nm = r->n_dumps;
    LS_TRY(grow((void **)&dec->dg, &dec->dg_cap, nd ? nd : 1, sizeof *dec->dg, err));
    LS_TRY(grow((void **)&dec->dm, &dec->dm_cap, nm ? nm : 1, sizeof *dec->dm, err));
    const uint8_t *e = r->raw + ls_trace_record_head_bytes(dec->topk);
    for (uint32_t k = 0; k < nd; k++, e += LS_TRACE_DIGEST_ENTRY_BYTES) {
        dec->dg[k].layer = ls_rd16(e);
        dec->dg[k].kind = e[2];
        memcpy(dec->dg[k].digest.bytes, e + 4, 32);
    }
    for (uint32_t k = 0; k < nm; k++) {
        uint32_t n = ls_rd32(e + 4);
        dec->dm[k] = (ls_trace_dump){ls_rd16(e), e[2], e[3], n, e + LS_TRACE_DUMP_HEAD_BYTES};
        e += LS_TRACE_DUMP_HEAD_BYTES + (((uint64_t)n * ls_dump_dtype_size(e[3]) + 3) & ~(uint64_t)3);
    }
    r->digests = dec->dg;
    r->dumps = dec->dm;
    return LS_OK;
}

ls_status ls_frame_record(const ls_frame_buf *fb, ls_rec_decoder *dec, uint32_t i, ls_error *err)
{
    if (i >= fb->n_records) return ls_fail(err, LS_E_INTERNAL, "record %u out of range", i);
    const uint8_t *p = fb->data + fb->rec_off[i];
    size_t fixed = ls_trace_record_head_bytes(dec->topk);
    ls_trace_record *r = &dec->rec;
    r->seq = ls_rd32(p + 4);
    r->pos = ls_rd32(p + 8);
    r->token = (int32_t)ls_rd32(p + 12);
    r->next_token = (int32_t)ls_rd32(p + 16);
    r->logprob_bits = ls_rd32(p + 20);
    for (int k = 0; k < dec->topk; k++) {
        r->topk_ids[k] = (int32_t)ls_rd32(p + 24 + 8 * k);
        r->topk_logprob_bits[k] = ls_rd32(p + 28 + 8 * k);
    }
    r->n_digests = ls_rd16(p + fixed - 4);
    r->digests = NULL;
    r->n_dumps = ls_rd16(p + fixed - 2);
    r->dumps = NULL;
    r->raw = p;
    r->raw_bytes = ls_rd32(p);
    r->digests_at = (uint32_t)ls_trace_record_head_bytes(dec->topk);
    r->frame_index = fb->frame_index;
    r->frame_offset = fb->offset;
    return dec->lazy ? LS_OK : ls_rec_decoder_fill(dec, err);
}

/* Checks what the format requires of a payload before it is decompressed:
 * exactly one zstd frame of compressed_bytes, with its content size equal to
 * uncompressed_bytes and a content checksum equal to the header's copy
 * (docs/trace-format.md, section 4). */
static ls_status check_payload(const ls_frame_buf *fb, const char *path, ls_error *err)
{
    const uint8_t *z = fb->comp;
    uint64_t n = fb->compressed_bytes;
    uint64_t first = fb->next_offset - n, last = fb->next_offset - 1;
    /* Frame_Header_Descriptor bit 2 is Content_Checksum_flag (RFC 8878, 3.1.1.1.1). */
    if (n < 9 || ls_rd32(z) != 0xFD2FB528u || !(z[4] & 0x04))
        return ls_fail(err, LS_E_INPUT,
                       "%s: offset %" PRIu64 ": frame %u: payload (bytes %" PRIu64 "..%" PRIu64 ") is not a zstd frame "
                       "with a content checksum", path, fb->offset, fb->frame_index, first, last);
    unsigned long long cs = ZSTD_getFrameContentSize(z, n);
    size_t fs = ZSTD_findFrameCompressedSize(z, n);
    if (cs != fb->uncompressed_bytes || ZSTD_isError(fs) || fs != n)
        return ls_fail(err, LS_E_INPUT,
                       "%s: offset %" PRIu64 ": frame %u: payload (bytes %" PRIu64 "..%" PRIu64 ") is not one zstd frame "
                       "of %" PRIu64 " bytes decompressing to %" PRIu64 " bytes", path, fb->offset, fb->frame_index,
                       first, last, n, fb->uncompressed_bytes);
    if (ls_rd32(z + n - 4) != fb->payload_checksum)
        return ls_fail(err, LS_E_INPUT,
                       "%s: offset %" PRIu64 ": frame %u checksum mismatch: payload content checksum %08x, header says "
                       "%08x (bytes %" PRIu64 "..%" PRIu64 " corrupted)", path, fb->offset, fb->frame_index,
                       ls_rd32(z + n - 4), fb->payload_checksum, first, last);
    return LS_OK;
}

ls_status ls_frame_load(ls_trace_file *f, ls_frame_buf *fb, ls_rec_decoder *dec, int payload, ls_error *err)
{
    const char *path = f->path;
    uint64_t file_bytes = f->bytes;
    uint64_t off = fb->offset;
    const uint8_t *fixed;
    if (file_bytes - off < LS_TRACE_FRAME_FIXED_BYTES)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame truncated: header needs %d bytes, file ends at %" PRIu64,
                       path, off, LS_TRACE_FRAME_FIXED_BYTES, file_bytes);
    LS_TRY(ls_trace_file_view(f, off, LS_TRACE_FRAME_FIXED_BYTES, &fb->head_buf, &fb->head_cap, &fixed, err));
    if (memcmp(fixed, LS_TRACE_FRAME_MAGIC, 4) != 0)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": expected a frame", path, off);
    fb->kind = fixed[4];
    fb->frame_index = ls_rd32(fixed + 8);
    fb->n_records = ls_rd32(fixed + 12);
    fb->n_segments = ls_rd32(fixed + 16);
    fb->payload_checksum = ls_rd32(fixed + 20);
    fb->uncompressed_bytes = ls_rd64(fixed + 24);
    fb->compressed_bytes = ls_rd64(fixed + 32);
    uint64_t min_rec = LS_TRACE_RECORD_FIXED_BYTES + 8 * (uint64_t)dec->topk + 4;
    /* reserved bytes are named, as the document's reserved-bytes rule says */
    if (fixed[5])
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame header corrupted: flags (byte 5) are 0x%02x, must be 0",
                       path, off, fixed[5]);
    if (ls_rd16(fixed + 6))
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame header corrupted: reserved bytes 6..7 are 0x%04x, "
                       "must be 0", path, off, ls_rd16(fixed + 6));
    if (fb->kind >= LS_TRACE_FRAME_KIND_COUNT ||
        fb->n_records == 0 || fb->n_segments == 0 || fb->n_segments > fb->n_records ||
        fb->uncompressed_bytes > LS_TRACE_FRAME_MAX_BYTES || fb->uncompressed_bytes < fb->n_records * min_rec ||
        fb->compressed_bytes < 9 || fb->compressed_bytes > ZSTD_compressBound(LS_TRACE_FRAME_MAX_BYTES) + 4)
        return ls_fail(err, LS_E_INPUT,
                       "%s: offset %" PRIu64 ": frame header corrupted (kind %u, %u records, %u segments, %" PRIu64
                       " / %" PRIu64 " bytes)",
                       path, off, fb->kind, fb->n_records, fb->n_segments, fb->uncompressed_bytes, fb->compressed_bytes);
    if (!(dec->lay.frame_kinds & (1u << fb->kind)))
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame %u: kind %u (%s) in a%s %s trace, which holds %s frames",
                       path, off, fb->frame_index, fb->kind, ls_trace_frame_kind_name(fb->kind),
                       dec->lay.mode[0] == 'i' ? "n" : "", dec->lay.mode, ls_trace_mode_frames(&dec->lay));
    uint64_t head_bytes = LS_TRACE_FRAME_FIXED_BYTES + (uint64_t)fb->n_segments * LS_TRACE_SEGMENT_BYTES;
    uint64_t total = head_bytes + 32 + fb->compressed_bytes;
    if (total > file_bytes - off)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame %u truncated: needs %" PRIu64 " bytes, file ends at %" PRIu64,
                       path, off, fb->frame_index, total, file_bytes);
    fb->next_offset = off + total;
    LS_TRY(grow((void **)&fb->segs, &fb->segs_cap, fb->n_segments, sizeof *fb->segs, err));
    const uint8_t *head; /* [head_bytes + 32]: header, segment table, header checksum */
    LS_TRY(ls_trace_file_view(f, off, head_bytes + 32, &fb->head_buf, &fb->head_cap, &head, err));
    memcpy(fb->checksum, head + head_bytes, 32);
    /* The header checksum is always verified: it is small, and the index
     * trusts segment tables without reading payloads. */
    ls_digest d;
    LS_TRY(ls_sha256_buf(head, head_bytes, &d, err));
    if (memcmp(d.bytes, fb->checksum, 32) != 0)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame %u header checksum mismatch (bytes %" PRIu64 "..%" PRIu64 " corrupted)",
                       path, off, fb->frame_index, off, off + head_bytes + 31);
    uint64_t nrec = 0;
    for (uint32_t i = 0; i < fb->n_segments; i++) {
        const uint8_t *s = head + LS_TRACE_FRAME_FIXED_BYTES + (size_t)i * LS_TRACE_SEGMENT_BYTES;
        fb->segs[i] = (ls_frame_seg){ls_rd32(s), ls_rd32(s + 4), ls_rd32(s + 8)};
        if (fb->segs[i].n_pos == 0 || (uint64_t)fb->segs[i].pos_first + fb->segs[i].n_pos > UINT32_MAX)
            return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame %u: segment %u is empty or overflows", path, off,
                           fb->frame_index, i);
        nrec += fb->segs[i].n_pos;
    }
    if (nrec != fb->n_records)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame %u: segments hold %" PRIu64 " records, header says %u",
                       path, off, fb->frame_index, nrec, fb->n_records);
    if (!payload) return LS_OK;
    LS_TRY(ls_trace_file_view(f, fb->next_offset - fb->compressed_bytes, fb->compressed_bytes, &fb->comp_buf,
                              &fb->comp_cap, &fb->comp, err));
    LS_TRY(check_payload(fb, path, err));
    if (!fb->dctx && !(fb->dctx = ZSTD_createDCtx()))
        return ls_fail_nomem(err, ZSTD_estimateDCtxSize(), "%s: a zstd decompression context", path);
    LS_TRY(ls_trace_grow_payload(&fb->data, &fb->data_cap, fb->uncompressed_bytes, err));
    /* zstd verifies the content checksum (XXH64 of the decompressed bytes) here. */
    size_t r = ZSTD_decompressDCtx(fb->dctx, fb->data, fb->uncompressed_bytes, fb->comp, fb->compressed_bytes);
    /* zstd's own allocation failing is memory, not a damaged payload */
    if (ZSTD_isError(r) && ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation)
        return ls_fail(err, LS_E_NOMEM, "%s: offset %" PRIu64 ": frame %u: out of memory inside zstd decompressing "
                       "%" PRIu64 " bytes", path, off, fb->frame_index, fb->uncompressed_bytes);
    if (ZSTD_isError(r) && ZSTD_getErrorCode(r) == ZSTD_error_checksum_wrong)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame %u checksum mismatch: payload content checksum fails "
                       "(bytes %" PRIu64 "..%" PRIu64 " corrupted)", path, off, fb->frame_index,
                       fb->next_offset - fb->compressed_bytes, fb->next_offset - 1);
    if (ZSTD_isError(r) || r != fb->uncompressed_bytes)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame %u: payload does not decompress to %" PRIu64 " bytes (%s)",
                       path, off, fb->frame_index, fb->uncompressed_bytes,
                       ZSTD_isError(r) ? ZSTD_getErrorName(r) : "size mismatch");
    LS_TRY(grow((void **)&fb->rec_off, &fb->rec_off_cap, fb->n_records, sizeof *fb->rec_off, err));
    uint64_t q = 0;
    uint32_t seg = 0, in_seg = 0;
    for (uint32_t i = 0; i < fb->n_records; i++) {
        uint32_t len = 0;
        fb->rec_off[i] = (uint32_t)q;
        if (q >= fb->uncompressed_bytes)
            return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame %u: %u records declared, payload holds %u", path,
                           off, fb->frame_index, fb->n_records, i);
        LS_TRY(check_record(fb, dec, q, &len, path, err));
        uint32_t rs = ls_rd32(fb->data + q + 4), rp = ls_rd32(fb->data + q + 8);
        if (rs != fb->segs[seg].seq || rp != fb->segs[seg].pos_first + in_seg)
            return ls_fail(err, LS_E_INPUT,
                           "%s: offset %" PRIu64 ": frame %u, record %u is (seq %u, pos %u); its segment says (seq %u, pos %u)",
                           path, off, fb->frame_index, i, rs, rp, fb->segs[seg].seq, fb->segs[seg].pos_first + in_seg);
        if (++in_seg == fb->segs[seg].n_pos) {
            seg++;
            in_seg = 0;
        }
        q += len;
    }
    if (q != fb->uncompressed_bytes)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": frame %u: %" PRIu64 " trailing payload bytes", path, off,
                       fb->frame_index, fb->uncompressed_bytes - q);
    return LS_OK;
}

ls_status ls_trace_check_trailer(const uint8_t t[LS_TRACE_TRAILER_BYTES], const char *path, uint64_t offset,
                                 uint64_t n_frames, uint64_t n_records, uint64_t bytes, const uint8_t chain[32],
                                 ls_error *err)
{
    ls_digest d;
    LS_TRY(ls_sha256_buf(t, 64, &d, err));
    if (memcmp(t, LS_TRACE_TRAILER_MAGIC, 4) != 0 || memcmp(d.bytes, t + 64, 32) != 0)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": trailer checksum mismatch (trailer corrupted)", path, offset);
    if (ls_rd32(t + 4))
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": trailer reserved bytes 4..7 are 0x%08x, must be 0", path,
                       offset, ls_rd32(t + 4));
    if (ls_rd64(t + 8) != n_frames || ls_rd64(t + 16) != n_records)
        return ls_fail(err, LS_E_INPUT,
                       "%s: offset %" PRIu64 ": trailer counts (%" PRIu64 " frames, %" PRIu64 " records) do not match the file (%" PRIu64 ", %" PRIu64 ")",
                       path, offset, ls_rd64(t + 8), ls_rd64(t + 16), n_frames, n_records);
    if (ls_rd64(t + 24) != bytes)
        return ls_fail(err, LS_E_INPUT,
                       "%s: offset %" PRIu64 ": trailer says %" PRIu64 " uncompressed payload bytes, the frames hold %" PRIu64,
                       path, offset, ls_rd64(t + 24), bytes);
    if (memcmp(t + 32, chain, 32) != 0)
        return ls_fail(err, LS_E_INPUT, "%s: offset %" PRIu64 ": trailer digest over all frames does not match", path, offset);
    return LS_OK;
}

/* ---- record access ------------------------------------------------------------------ */

int ls_trace_record_bytes_equal(const ls_trace_record *a, const ls_trace_record *b)
{
    return a->raw && b->raw && a->raw_bytes == b->raw_bytes && memcmp(a->raw, b->raw, a->raw_bytes) == 0;
}

int ls_trace_record_digests_equal(const ls_trace_record *a, const ls_trace_record *b)
{
    return a->raw && b->raw && a->n_digests == b->n_digests &&
           memcmp(a->raw + a->digests_at, b->raw + b->digests_at,
                  (size_t)a->n_digests * LS_TRACE_DIGEST_ENTRY_BYTES) == 0;
}

int ls_trace_record_digest_layer(const ls_trace_record *r, uint32_t i)
{
    return ls_rd16(r->raw + r->digests_at + (size_t)i * LS_TRACE_DIGEST_ENTRY_BYTES);
}
