/* lockstep — checkpoint directories: config.json, single-file or sharded
 * safetensors, tensor-name normalisation, routed-expert views.
 *
 * Big checkpoints (tens of shards, ~10^5 tensors, ~10^11 bytes) are handled
 * with mmap and sorted arrays: opening is O(n log n) in the tensor count and
 * touches only the headers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/util.h"
#include "io/checkpoint.h"
#include "io/json.h"

#define NAME_FMT "%.300s"

static const char k_prefix_lm[] = "model.language_model."; /* Qwen3.5 text prefix */
static const char k_prefix_model[] = "model.";

struct ls_checkpoint {
    char *dir;                  /* as given; owned */
    json_t *config;             /* config.json; owned reference */
    char *config_text;          /* raw bytes of config.json (NUL-terminated); owned */
    size_t config_len;
    ls_safetensors **shards;    /* nshards, in shard-file-name order; owned */
    char **shard_paths;         /* dir/name per shard; owned */
    size_t nshards;
    ls_tensor *tensors;         /* count, sorted by normalised name; owned array */
    size_t count;
    ls_tensor *ignored;         /* n_ignored visual / mtp tensors skipped, sorted by stored
                                   name; owned array (names borrowed from the shards) */
    size_t n_ignored;
    uint64_t total_bytes;       /* sum of exposed tensors' size_bytes */
    int generated;              /* 1: ls_checkpoint_open_generated, no shards */
    ls_tensor_source source;    /* generated: where the bytes come from */
    char **gen_names;           /* generated: the stored names, owned */
    size_t n_gen_names;
};

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ---- shards -------------------------------------------------------------------- */

static ls_status add_shard(ls_checkpoint *ck, const char *name, ls_error *err)
{
    char *path = path_join(ck->dir, name);
    if (!path) return ls_fail(err, LS_E_NOMEM, "%s: out of memory", ck->dir);
    ls_safetensors *st = NULL;
    ls_status rc = ls_safetensors_open(path, &st, err);
    if (rc != LS_OK) {
        free(path);
        return rc;
    }
    ck->shards[ck->nshards] = st;
    ck->shard_paths[ck->nshards] = path;
    ck->nshards++;
    return LS_OK;
}

/* A shard name must stay inside the checkpoint directory: a plain file name. */
static int shard_name_ok(const char *name)
{
    return name[0] != '\0' && !strchr(name, '/') && !strchr(name, '\\') && !strstr(name, "..") &&
           strcmp(name, ".") != 0;
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static long find_shard_name(const char *const *names, size_t n, const char *name)
{
    const char *const *hit = bsearch(&name, names, n, sizeof *names, cmp_str_ptr);
    return hit ? (long)(hit - names) : -1;
}

static ls_status open_sharded(ls_checkpoint *ck, const char *index_path, ls_error *err)
{
    json_t *index = NULL;
    LS_TRY(ls_json_load_file(index_path, &index, err));
    ls_status rc = LS_OK;
    const char **names = NULL;
    json_t *wm = NULL;
    if (!json_is_object(index)) {
        rc = ls_fail(err, LS_E_INPUT, "%s: not a JSON object (byte offset 0)", index_path);
        goto done;
    }
    wm = json_object_get(index, "weight_map");
    if (!json_is_object(wm)) {
        rc = ls_fail(err, LS_E_INPUT, "%s: field 'weight_map' is %s, expected an object of "
                     "tensor name -> shard file", index_path, wm ? "not an object" : "missing");
        goto done;
    }
    json_t *meta = json_object_get(index, "metadata");
    if (meta && !json_is_object(meta) && !json_is_null(meta)) {
        rc = ls_fail(err, LS_E_INPUT, "%s: field 'metadata' is not an object", index_path);
        goto done;
    }
    size_t n = json_object_size(wm);
    if (n == 0) {
        rc = ls_fail(err, LS_E_INPUT, "%s: field 'weight_map' lists no tensors", index_path);
        goto done;
    }
    names = calloc(n, sizeof *names);
    if (!names) {
        rc = ls_fail(err, LS_E_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    size_t k = 0;
    const char *tname;
    json_t *v;
    json_object_foreach(wm, tname, v) {
        if (!json_is_string(v)) {
            rc = ls_fail(err, LS_E_INPUT, "%s: weight_map['" NAME_FMT "'] is not a string",
                         index_path, tname);
            goto done;
        }
        const char *file = json_string_value(v);
        if (!shard_name_ok(file)) {
            rc = ls_fail(err, LS_E_INPUT, "%s: weight_map['" NAME_FMT "'] names shard '%.300s', "
                         "which is not a plain file name inside the checkpoint directory "
                         "(no '/', no '..')", index_path, tname, file);
            goto done;
        }
        names[k++] = file;
    }
    /* Distinct shard names, sorted: shard order is the file-name order. */
    qsort(names, n, sizeof *names, cmp_str_ptr);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || strcmp(names[u - 1], names[i]) != 0) names[u++] = names[i];
    ck->shards = calloc(u, sizeof *ck->shards);
    ck->shard_paths = calloc(u, sizeof *ck->shard_paths);
    if (!ck->shards || !ck->shard_paths) {
        rc = ls_fail(err, LS_E_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    for (size_t i = 0; i < u; i++) {
        rc = add_shard(ck, names[i], err);
        if (rc != LS_OK) goto done;
    }

    /* Every tensor of every shard must be listed, and listed for that shard;
     * a tensor listed for another shard that also holds it is in two shards. */
    for (size_t s = 0; s < ck->nshards; s++) {
        const ls_safetensors *st = ck->shards[s];
        const char *sname = names[s];
        for (size_t i = 0; i < ls_safetensors_count(st); i++) {
            const ls_tensor *t = ls_safetensors_at(st, i);
            const json_t *mapped = json_object_get(wm, t->stored_name);
            if (!mapped) {
                rc = ls_fail(err, LS_E_INPUT, "%s: tensor '" NAME_FMT "' (byte offset %llu) is "
                             "not listed in %s", ck->shard_paths[s], t->stored_name,
                             (unsigned long long)t->file_offset_bytes, index_path);
                goto done;
            }
            const char *want = json_string_value(mapped);
            if (strcmp(want, sname) != 0) {
                long other = find_shard_name(names, u, want);
                if (other >= 0 && ls_safetensors_find(ck->shards[other], t->stored_name))
                    rc = ls_fail(err, LS_E_INPUT, "%s: tensor '" NAME_FMT "' is in two shards: %s "
                                 "(byte offset %llu) and %s", index_path, t->stored_name, sname,
                                 (unsigned long long)t->file_offset_bytes, want);
                else
                    rc = ls_fail(err, LS_E_INPUT, "%s: tensor '" NAME_FMT "' is mapped to shard %s "
                                 "but is stored in %s (byte offset %llu)", index_path,
                                 t->stored_name, want, sname,
                                 (unsigned long long)t->file_offset_bytes);
                goto done;
            }
        }
    }
    json_object_foreach(wm, tname, v) {
        long s = find_shard_name(names, u, json_string_value(v));
        if (s < 0 || !ls_safetensors_find(ck->shards[s], tname)) {
            rc = ls_fail(err, LS_E_INPUT, "%s: tensor '" NAME_FMT "' is mapped to shard %s, which "
                         "does not contain it", index_path, tname, json_string_value(v));
            goto done;
        }
    }
done:
    free(names);
    json_decref(index);
    return rc;
}

/* ---- names ---------------------------------------------------------------------- */

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const ls_tensor *)a)->name, ((const ls_tensor *)b)->name);
}

/* Where tensor t is, for messages: its shard's path, or the checkpoint's
 * label for a generated tensor. */
static const char *where(const ls_checkpoint *ck, const ls_tensor *t)
{
    return t->shard >= 0 ? ck->shard_paths[t->shard] : ck->dir;
}

static ls_status table_reserve(ls_checkpoint *ck, size_t total, ls_error *err)
{
    ck->tensors = calloc(total ? total : 1, sizeof *ck->tensors);
    ck->ignored = calloc(total ? total : 1, sizeof *ck->ignored);
    if (!ck->tensors || !ck->ignored) return ls_fail(err, LS_E_NOMEM, "%s: out of memory", ck->dir);
    return LS_OK;
}

/* Enters src (of shard `shard`, -1 for a generated tensor) under its
 * normalised name, or among the skipped tensors. */
static ls_status table_add(ls_checkpoint *ck, const ls_tensor *src, int shard, ls_error *err)
{
    const char *sn = src->stored_name;
    if (ls_checkpoint_name_skipped(sn)) {
        ls_tensor *g = &ck->ignored[ck->n_ignored++];
        *g = *src;
        g->name = sn;
        g->shard = shard;
        return LS_OK;
    }
    ls_tensor *t = &ck->tensors[ck->count];
    *t = *src;
    t->shard = shard;
    if (starts_with(sn, k_prefix_lm)) {
        size_t rest = strlen(sn) - (sizeof k_prefix_lm - 1);
        char *nn = malloc(sizeof k_prefix_model - 1 + rest + 1);
        if (!nn) return ls_fail(err, LS_E_NOMEM, "%s: out of memory", ck->dir);
        memcpy(nn, k_prefix_model, sizeof k_prefix_model - 1);
        memcpy(nn + sizeof k_prefix_model - 1, sn + sizeof k_prefix_lm - 1, rest + 1);
        t->name = nn; /* owned by the checkpoint: freed when name != stored_name */
    } else {
        t->name = sn; /* borrowed from the shard (or the generated names) */
    }
    ck->count++;
    ck->total_bytes += t->size_bytes;
    return LS_OK;
}

/* Sorts both lists and refuses names that collide. */
static ls_status table_finish(ls_checkpoint *ck, ls_error *err)
{
    qsort(ck->tensors, ck->count, sizeof *ck->tensors, cmp_tensor_name);
    qsort(ck->ignored, ck->n_ignored, sizeof *ck->ignored, cmp_tensor_name);
    for (size_t i = 1; i < ck->count; i++) {
        const ls_tensor *a = &ck->tensors[i - 1], *b = &ck->tensors[i];
        if (strcmp(a->name, b->name) == 0)
            return ls_fail(err, LS_E_INPUT, "%s: tensors '" NAME_FMT "' (%s, byte offset %llu) and '"
                           NAME_FMT "' (%s, byte offset %llu) both normalise to '" NAME_FMT "'",
                           ck->dir, a->stored_name, where(ck, a), (unsigned long long)a->file_offset_bytes,
                           b->stored_name, where(ck, b), (unsigned long long)b->file_offset_bytes, a->name);
    }
    /* The fingerprint merges both lists by name: a normalised name equal to
     * a skipped stored name ("model.language_model.visual.X" and
     * "model.visual.X") would give two leaves one name. */
    for (size_t i = 0; i < ck->n_ignored; i++) {
        const ls_tensor *g = &ck->ignored[i];
        const ls_tensor *t = ls_checkpoint_find(ck, g->name);
        if (t)
            return ls_fail(err, LS_E_INPUT, "%s: tensor '" NAME_FMT "' (%s, byte offset %llu) normalises to '"
                           NAME_FMT "', the name of the skipped tensor stored in %s at byte offset %llu",
                           ck->dir, t->stored_name, where(ck, t), (unsigned long long)t->file_offset_bytes,
                           g->name, where(ck, g), (unsigned long long)g->file_offset_bytes);
    }
    return LS_OK;
}

static ls_status build_table(ls_checkpoint *ck, ls_error *err)
{
    size_t total = 0;
    for (size_t s = 0; s < ck->nshards; s++) total += ls_safetensors_count(ck->shards[s]);
    LS_TRY(table_reserve(ck, total, err));
    for (size_t s = 0; s < ck->nshards; s++)
        for (size_t i = 0; i < ls_safetensors_count(ck->shards[s]); i++)
            LS_TRY(table_add(ck, ls_safetensors_at(ck->shards[s], i), (int)s, err));
    return table_finish(ck, err);
}

/* ---- open / close ------------------------------------------------------------------ */

ls_status ls_checkpoint_open(const char *dir, ls_checkpoint **out, ls_error *err)
{
    if (!out || !dir) return ls_fail(err, LS_E_USAGE, "ls_checkpoint_open: NULL argument");
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return ls_fail(err, LS_E_IO, "%s: cannot open checkpoint directory: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return ls_fail(err, LS_E_IO, "%s: not a directory", dir);
    ls_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->dir = strdup(dir))) {
        free(ck);
        return ls_fail(err, LS_E_NOMEM, "%s: out of memory", dir);
    }
    ls_status rc = LS_OK;
    char *cfg_path = path_join(dir, "config.json");
    char *single = path_join(dir, "model.safetensors");
    char *index = path_join(dir, "model.safetensors.index.json");
    if (!cfg_path || !single || !index) {
        rc = ls_fail(err, LS_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    /* config.json: the raw bytes are kept for digests, and parsed from those
     * same bytes so the two can never disagree. */
    rc = ls_read_file(cfg_path, &ck->config_text, &ck->config_len, err);
    if (rc != LS_OK) goto done;
    rc = ls_json_load_buf(cfg_path, ck->config_text, ck->config_len, &ck->config, err);
    if (rc != LS_OK) goto done;
    if (!json_is_object(ck->config)) {
        rc = ls_fail(err, LS_E_INPUT, "%s: not a JSON object (byte offset 0)", cfg_path);
        goto done;
    }

    int has_single = file_exists(single), has_index = file_exists(index);
    if (has_single && has_index) {
        rc = ls_fail(err, LS_E_INPUT, "%s: holds both model.safetensors and "
                     "model.safetensors.index.json; which one is the checkpoint is ambiguous", dir);
    } else if (has_index) {
        rc = open_sharded(ck, index, err);
    } else if (has_single) {
        ck->shards = calloc(1, sizeof *ck->shards);
        ck->shard_paths = calloc(1, sizeof *ck->shard_paths);
        rc = (ck->shards && ck->shard_paths) ? add_shard(ck, "model.safetensors", err)
                                             : ls_fail(err, LS_E_NOMEM, "%s: out of memory", dir);
    } else {
        rc = ls_fail(err, LS_E_INPUT, "%s: neither model.safetensors nor "
                     "model.safetensors.index.json found", dir);
    }
    if (rc == LS_OK) rc = build_table(ck, err);
done:
    free(cfg_path);
    free(single);
    free(index);
    if (rc != LS_OK) {
        ls_checkpoint_close(ck);
        return rc;
    }
    *out = ck;
    return LS_OK;
}

void ls_checkpoint_close(ls_checkpoint *ck)
{
    if (!ck) return;
    for (size_t i = 0; i < ck->count; i++)
        if (ck->tensors[i].name != ck->tensors[i].stored_name) free((char *)ck->tensors[i].name);
    free(ck->tensors);
    free(ck->ignored);
    for (size_t s = 0; s < ck->nshards; s++) {
        ls_safetensors_close(ck->shards[s]);
        free(ck->shard_paths[s]);
    }
    free(ck->shards);
    free(ck->shard_paths);
    for (size_t i = 0; i < ck->n_gen_names; i++) free(ck->gen_names[i]);
    free(ck->gen_names);
    if (ck->source.release) ck->source.release(ck->source.ctx);
    json_decref(ck->config);
    free(ck->config_text);
    free(ck->dir);
    free(ck);
}

ls_status ls_checkpoint_open_generated(const char *label, const char *config_text, size_t config_len,
                                       const ls_tensor *tensors, size_t n, const ls_tensor_source *src,
                                       ls_checkpoint **out, ls_error *err)
{
    *out = NULL;
    ls_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck) {
        if (src->release) src->release(src->ctx);
        return ls_fail(err, LS_E_NOMEM, "%s: out of memory", label);
    }
    ck->generated = 1;
    ck->source = *src;
    ls_status rc = LS_OK;
    ck->dir = strdup(label);
    ck->config_text = malloc(config_len + 1);
    ck->gen_names = calloc(n ? n : 1, sizeof *ck->gen_names);
    if (!ck->dir || !ck->config_text || !ck->gen_names) {
        rc = ls_fail(err, LS_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    memcpy(ck->config_text, config_text, config_len);
    ck->config_text[config_len] = '\0';
    ck->config_len = config_len;
    char what[320];
    snprintf(what, sizeof what, "%.300s/config.json", label);
    rc = ls_json_load_buf(what, ck->config_text, ck->config_len, &ck->config, err);
    if (rc == LS_OK && !json_is_object(ck->config))
        rc = ls_fail(err, LS_E_INPUT, "%s: not a JSON object (byte offset 0)", what);
    if (rc == LS_OK) rc = table_reserve(ck, n, err);
    for (size_t i = 0; rc == LS_OK && i < n; i++) {
        ls_tensor t = tensors[i];
        if (!(ck->gen_names[i] = strdup(t.stored_name))) {
            rc = ls_fail(err, LS_E_NOMEM, "%s: out of memory", label);
            break;
        }
        ck->n_gen_names++;
        t.stored_name = ck->gen_names[i];
        t.data = NULL;
        t.file_offset_bytes = 0;
        t.source_index = i;
        rc = table_add(ck, &t, -1, err);
    }
    if (rc == LS_OK) rc = table_finish(ck, err);
done:
    if (rc != LS_OK) {
        ls_checkpoint_close(ck);
        return rc;
    }
    *out = ck;
    return LS_OK;
}

int ls_checkpoint_generated(const ls_checkpoint *ck) { return ck && ck->generated; }

ls_status ls_checkpoint_stream(const ls_checkpoint *ck, const ls_tensor *t, ls_tensor_sink_fn sink,
                               void *sink_ctx, ls_error *err)
{
    if (t->data || t->size_bytes == 0) {
        const uint8_t *p = t->data;
        uint64_t left = t->size_bytes;
        do {
            size_t n = left < LS_CHECKPOINT_PIECE_BYTES ? (size_t)left : LS_CHECKPOINT_PIECE_BYTES;
            LS_TRY(sink(sink_ctx, p, n, err));
            p += n;
            left -= n;
        } while (left > 0);
        return LS_OK;
    }
    if (!ck->generated || !ck->source.stream)
        return ls_fail(err, LS_E_INTERNAL, "%s: tensor '" NAME_FMT "' has no data", ck->dir, t->name);
    return ck->source.stream(ck->source.ctx, t->source_index, sink, sink_ctx, err);
}

/* ---- accessors -------------------------------------------------------------------- */

const char *ls_checkpoint_dir(const ls_checkpoint *ck) { return ck ? ck->dir : NULL; }

const void *ls_checkpoint_config_json(const ls_checkpoint *ck) { return ck ? ck->config : NULL; }

const char *ls_checkpoint_config_text(const ls_checkpoint *ck, size_t *len)
{
    if (len) *len = ck ? ck->config_len : 0;
    return ck ? ck->config_text : NULL;
}

size_t ls_checkpoint_count(const ls_checkpoint *ck) { return ck ? ck->count : 0; }

const ls_tensor *ls_checkpoint_at(const ls_checkpoint *ck, size_t i)
{
    return ck && i < ck->count ? &ck->tensors[i] : NULL;
}

const ls_tensor *ls_checkpoint_find(const ls_checkpoint *ck, const char *name)
{
    if (!ck || !name) return NULL;
    size_t lo = 0, hi = ck->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->tensors[mid].name, name);
        if (c == 0) return &ck->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

size_t ls_checkpoint_index(const ls_checkpoint *ck, const ls_tensor *t)
{
    const ls_tensor *hit = t ? ls_checkpoint_find(ck, t->name) : NULL;
    return hit && hit == t ? (size_t)(hit - ck->tensors) : (size_t)-1;
}

int ls_checkpoint_name_skipped(const char *stored_name)
{
    return ls_checkpoint_skip_reason(stored_name) != NULL;
}

const char *ls_checkpoint_skip_reason(const char *stored_name)
{
    if (!stored_name) return NULL;
    if (starts_with(stored_name, "model.visual."))
        return "vision tower (model.visual.*): not part of the text forward";
    if (starts_with(stored_name, "mtp."))
        return "multi-token-prediction head (mtp.*): not part of the text forward";
    return NULL;
}

size_t ls_checkpoint_ignored_count(const ls_checkpoint *ck) { return ck ? ck->n_ignored : 0; }

const ls_tensor *ls_checkpoint_ignored_at(const ls_checkpoint *ck, size_t i)
{
    return ck && i < ck->n_ignored ? &ck->ignored[i] : NULL;
}

size_t ls_checkpoint_shard_count(const ls_checkpoint *ck) { return ck ? ck->nshards : 0; }

const char *ls_checkpoint_shard_path(const ls_checkpoint *ck, size_t i)
{
    return ck && i < ck->nshards ? ck->shard_paths[i] : NULL;
}

const ls_safetensors *ls_checkpoint_shard(const ls_checkpoint *ck, size_t i)
{
    return ck && i < ck->nshards ? ck->shards[i] : NULL;
}

uint64_t ls_checkpoint_total_bytes(const ls_checkpoint *ck) { return ck ? ck->total_bytes : 0; }

/* ---- experts ----------------------------------------------------------------------- */

static void shape_str(const ls_tensor *t, char *buf, size_t cap)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int d = 0; d < t->ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static ls_status bad_shape(const ls_checkpoint *ck, const ls_tensor *t, const char *expected,
                           ls_error *err)
{
    char got[160];
    shape_str(t, got, sizeof got);
    return ls_fail(err, LS_E_INPUT, "%s: tensor '" NAME_FMT "' (byte offset %llu) has shape %s, "
                   "expected %s", ck->shard_paths[t->shard], t->name,
                   (unsigned long long)t->file_offset_bytes, got, expected);
}

static const char *const k_proj_name[] = {"gate", "up", "down"};

/* Per-expert layout: three 2-D tensors per expert; gate and up [I, D], down [D, I]. */
static ls_status expert_split(const ls_checkpoint *ck, const ls_tensor *const t[3],
                              ls_expert_proj proj, ls_matrix_view *out, ls_error *err)
{
    for (int p = 0; p < 3; p++)
        if (t[p] && t[p]->ndim != 2) return bad_shape(ck, t[p], "2 dimensions", err);
    /* I and D from the first projection present; the others must agree. */
    int64_t I = 0, D = 0;
    int have = 0;
    for (int p = 0; p < 3 && !have; p++) {
        if (!t[p]) continue;
        I = p == LS_EXPERT_DOWN ? t[p]->shape[1] : t[p]->shape[0];
        D = p == LS_EXPERT_DOWN ? t[p]->shape[0] : t[p]->shape[1];
        have = 1;
    }
    for (int p = 0; p < 3; p++) {
        if (!t[p]) continue;
        int64_t r = p == LS_EXPERT_DOWN ? D : I, c = p == LS_EXPERT_DOWN ? I : D;
        if (t[p]->shape[0] != r || t[p]->shape[1] != c) {
            char want[96];
            snprintf(want, sizeof want, "[%lld, %lld] (%s, from the expert's other projections)",
                     (long long)r, (long long)c, p == LS_EXPERT_DOWN ? "[D, I]" : "[I, D]");
            return bad_shape(ck, t[p], want, err);
        }
    }
    const ls_tensor *x = t[proj];
    *out = (ls_matrix_view){x->data, x->dtype, x->shape[0], x->shape[1], x->name};
    return LS_OK;
}

/* Fused layout: gate_up_proj [E, 2I, D] (per expert: I gate rows, then I up
 * rows) and down_proj [E, D, I]. */
static ls_status expert_fused(const ls_checkpoint *ck, const ls_tensor *gu, const ls_tensor *dn,
                              int expert, ls_expert_proj proj, ls_matrix_view *out, ls_error *err)
{
    if (gu && (gu->ndim != 3 || gu->shape[1] % 2 != 0))
        return bad_shape(ck, gu, "[E, 2I, D] (3 dimensions, even middle dimension)", err);
    if (dn && dn->ndim != 3) return bad_shape(ck, dn, "[E, D, I] (3 dimensions)", err);
    if (gu && dn) {
        int64_t E = gu->shape[0], I = gu->shape[1] / 2, D = gu->shape[2];
        if (dn->shape[0] != E || dn->shape[1] != D || dn->shape[2] != I) {
            char want[128];
            snprintf(want, sizeof want, "[%lld, %lld, %lld] ([E, D, I] from %s)", (long long)E,
                     (long long)D, (long long)I, gu->name);
            return bad_shape(ck, dn, want, err);
        }
    }
    const ls_tensor *x = proj == LS_EXPERT_DOWN ? dn : gu;
    if (expert >= x->shape[0])
        return ls_fail(err, LS_E_INPUT, "%s: expert %d out of range: tensor '" NAME_FMT "' holds "
                       "%lld experts", ck->shard_paths[x->shard], expert, x->name,
                       (long long)x->shape[0]);
    size_t es = ls_dtype_size(x->dtype);
    /* Products are bounded by size_bytes, which the header check tied to the
     * file size, so none of these overflow. */
    uint64_t per_expert = (uint64_t)x->shape[1] * (uint64_t)x->shape[2];
    const unsigned char *base = (const unsigned char *)x->data + (uint64_t)expert * per_expert * es;
    if (proj == LS_EXPERT_DOWN) {
        *out = (ls_matrix_view){base, x->dtype, x->shape[1], x->shape[2], x->name};
    } else {
        int64_t I = x->shape[1] / 2;
        if (proj == LS_EXPERT_UP) base += (uint64_t)I * (uint64_t)x->shape[2] * es;
        *out = (ls_matrix_view){base, x->dtype, I, x->shape[2], x->name};
    }
    return LS_OK;
}

ls_status ls_checkpoint_expert(const ls_checkpoint *ck, int layer, int expert,
                               ls_expert_proj proj, ls_matrix_view *out, ls_error *err)
{
    if (!ck || !out || layer < 0 || expert < 0 || (unsigned)proj > LS_EXPERT_DOWN)
        return ls_fail(err, LS_E_USAGE, "ls_checkpoint_expert: bad argument (layer %d, expert %d)",
                       layer, expert);
    char name[3][128];
    const ls_tensor *t[3];
    int any_split = 0;
    for (int p = 0; p < 3; p++) {
        snprintf(name[p], sizeof name[p], "model.layers.%d.mlp.experts.%d.%s_proj.weight", layer,
                 expert, k_proj_name[p]);
        t[p] = ls_checkpoint_find(ck, name[p]);
        any_split |= t[p] != NULL;
    }
    char gu_name[96], dn_name[96];
    snprintf(gu_name, sizeof gu_name, "model.layers.%d.mlp.experts.gate_up_proj", layer);
    snprintf(dn_name, sizeof dn_name, "model.layers.%d.mlp.experts.down_proj", layer);
    const ls_tensor *gu = ls_checkpoint_find(ck, gu_name);
    const ls_tensor *dn = ls_checkpoint_find(ck, dn_name);
    int any_fused = gu || dn;
    if (any_split && any_fused)
        return ls_fail(err, LS_E_INPUT, "%s: layer %d expert %d is stored twice: per expert (%s) "
                       "and fused (%s)", ck->dir, layer, expert, t[0] ? name[0] : t[1] ? name[1] : name[2],
                       gu ? gu_name : dn_name);
    if (any_split) {
        if (!t[proj])
            return ls_fail(err, LS_E_INPUT, "%s: tensor '%s' not found (the expert's other "
                           "projections are present)", ck->dir, name[proj]);
        return expert_split(ck, t, proj, out, err);
    }
    if (any_fused) {
        const char *need = proj == LS_EXPERT_DOWN ? dn_name : gu_name;
        if (!(proj == LS_EXPERT_DOWN ? dn : gu))
            return ls_fail(err, LS_E_INPUT, "%s: tensor '%s' not found (fused expert layout)",
                           ck->dir, need);
        return expert_fused(ck, gu, dn, expert, proj, out, err);
    }
    return ls_fail(err, LS_E_INPUT, "%s: layer %d expert %d not found: neither '%s' nor '%s'",
                   ck->dir, layer, expert, name[proj], proj == LS_EXPERT_DOWN ? dn_name : gu_name);
}
