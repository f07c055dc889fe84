/* lockstep CLI — running the engine; see run_common.h. */
#include "cli/run_common.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "fingerprint/sha256.h"
#include "io/checkpoint.h"
#include "manifest/manifest.h"
#include "model/model.h"
#include "trace/trace.h"

void ls_cli_batch_free(ls_cli_batch *b)
{
    if (!b) return;
    for (long i = 0; i < b->n; i++) free((void *)b->seqs[i].tokens);
    free(b->seqs);
    b->seqs = NULL;
    b->n = 0;
}

ls_status ls_cli_parse_long(const char *opt, const char *v, long lo, long hi, long *out, ls_error *err)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return ls_fail(err, LS_E_USAGE, "%s '%s': expected an integer in %ld..%ld", opt, v, lo, hi);
    *out = x;
    return LS_OK;
}

ls_status ls_cli_workdir(const char *given, const char *tag, char *out, size_t out_size, int *temporary,
                         ls_error *err)
{
    *temporary = 0;
    if (given) {
        if (mkdir(given, 0777) != 0 && errno != EEXIST)
            return ls_fail(err, LS_E_IO, "%s: cannot create directory: %s", given, strerror(errno));
        if ((size_t)snprintf(out, out_size, "%s", given) >= out_size)
            return ls_fail(err, LS_E_USAGE, "%s: path too long", given);
        return LS_OK;
    }
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = "/tmp";
    if ((size_t)snprintf(out, out_size, "%s/lockstep-%s.XXXXXX", tmp, tag) >= out_size)
        return ls_fail(err, LS_E_USAGE, "TMPDIR is too long");
    if (!mkdtemp(out)) return ls_fail(err, LS_E_IO, "%s: cannot create a temporary directory: %s", out, strerror(errno));
    *temporary = 1;
    return LS_OK;
}

static void remove_tree(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char path[4600];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (lstat(path, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode) && depth < 2) remove_tree(path, depth + 1);
        else if (S_ISREG(sb.st_mode)) unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

void ls_cli_workdir_remove(const char *dir)
{
    remove_tree(dir, 0);
}

void ls_run_spec_default(ls_run_spec *s)
{
    memset(s, 0, sizeof *s);
    s->mode = "rollout";
    s->max_new = 16;
    s->sampling = (ls_sampling){LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};
    s->act_bf16 = 1;
    s->backend = "cpu";
    s->threads = 1;
    s->state_digest_every = 64;
    s->max_rows = 256;
}

/* ---- inputs ------------------------------------------------------------------------ */

static ls_status batch_add(ls_cli_batch *b, long *cap, ls_sequence s, ls_error *err)
{
    if (b->n == *cap) {
        long nc = *cap ? 2 * *cap : 16;
        ls_sequence *n = realloc(b->seqs, sizeof *n * (size_t)nc);
        if (!n) return ls_fail(err, LS_E_NOMEM, "out of memory");
        b->seqs = n;
        *cap = nc;
    }
    b->seqs[b->n++] = s;
    return LS_OK;
}

/* Reads JSONL; full = 1 for the replay tokens file (prompt_len required). */
static ls_status load_jsonl(const char *path, long vocab, int full, ls_cli_batch *out, ls_error *err)
{
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    LS_TRY(ls_read_file(path, &text, &len, err));
    long cap = 0, line = 0;
    ls_status st = LS_OK;
    char *p = text;
    while (st == LS_OK && p < text + len) {
        char *nl = memchr(p, '\n', (size_t)(text + len - p));
        size_t ll = nl ? (size_t)(nl - p) : (size_t)(text + len - p);
        line++;
        char *q = p;
        p += ll + (nl ? 1 : 0);
        size_t k = 0;
        while (k < ll && (q[k] == ' ' || q[k] == '\t' || q[k] == '\r')) k++;
        if (k == ll) continue;
        json_error_t je;
        json_t *o = json_loadb(q, ll, JSON_REJECT_DUPLICATES, &je);
        if (!o) {
            st = ls_fail(err, LS_E_INPUT, "%s:%ld: invalid JSON at column %d: %s", path, line, je.column,
                         je.text);
            break;
        }
        json_t *id = json_object_get(o, "id"), *tk = json_object_get(o, "tokens");
        json_t *pl = json_object_get(o, "prompt_len");
        if (!json_is_object(o)) st = ls_fail(err, LS_E_INPUT, "%s:%ld: expected a JSON object", path, line);
        else if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > 0xffffffffLL)
            st = ls_fail(err, LS_E_INPUT, "%s:%ld: field id: expected an integer in 0..4294967295", path, line);
        else if (!json_is_array(tk) || json_array_size(tk) < (size_t)(full ? 2 : 1))
            st = ls_fail(err, LS_E_INPUT, "%s:%ld: field tokens: expected an array of at least %d token "
                         "ids", path, line, full ? 2 : 1);
        else if (full && (!json_is_integer(pl) || json_integer_value(pl) < 1 ||
                          json_integer_value(pl) >= (json_int_t)json_array_size(tk)))
            st = ls_fail(err, LS_E_INPUT, "%s:%ld: field prompt_len: expected an integer in 1..%zu", path,
                         line, json_array_size(tk) - 1);
        for (long i = 0; st == LS_OK && i < out->n; i++)
            if (out->seqs[i].id == (uint32_t)json_integer_value(id))
                st = ls_fail(err, LS_E_INPUT, "%s:%ld: field id: %lld repeats an earlier line", path, line,
                             (long long)json_integer_value(id));
        long n = st == LS_OK ? (long)json_array_size(tk) : 0;
        int32_t *t = st == LS_OK ? malloc(sizeof(int32_t) * (size_t)n) : NULL;
        if (st == LS_OK && !t) st = ls_fail(err, LS_E_NOMEM, "out of memory");
        for (long i = 0; st == LS_OK && i < n; i++) {
            json_t *v = json_array_get(tk, (size_t)i);
            json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
            if (!json_is_integer(v) || x < 0 || (vocab > 0 && x >= vocab) || x > 0x7fffffff)
                st = ls_fail(err, LS_E_INPUT, "%s:%ld: field tokens[%ld]: expected a token id in 0..%ld",
                             path, line, i, vocab > 0 ? vocab - 1 : 0x7fffffffL);
            else t[i] = (int32_t)x;
        }
        if (st == LS_OK) {
            ls_sequence s = {(uint32_t)json_integer_value(id), t, n, full ? (long)json_integer_value(pl) : n};
            st = batch_add(out, &cap, s, err);
            if (st != LS_OK) free(t);
        } else {
            free(t);
        }
        json_decref(o);
    }
    free(text);
    if (st == LS_OK && out->n == 0) st = ls_fail(err, LS_E_INPUT, "%s: no sequences (empty file)", path);
    if (st != LS_OK) ls_cli_batch_free(out);
    return st;
}

ls_status ls_cli_load_prompts(const char *path, long vocab, ls_cli_batch *out, ls_error *err)
{
    return load_jsonl(path, vocab, 0, out, err);
}

ls_status ls_cli_load_tokens(const char *path, long vocab, ls_cli_batch *out, ls_error *err)
{
    return load_jsonl(path, vocab, 1, out, err);
}

ls_status ls_cli_load_rollout(const char *trace_path, ls_cli_batch *out, ls_cli_rollout_info *info,
                              ls_error *err)
{
    memset(out, 0, sizeof *out);
    memset(info, 0, sizeof *info);
    ls_trace_reader *r;
    LS_TRY(ls_trace_reader_open(trace_path, &r, err));
    const ls_trace_header *h = ls_trace_reader_header(r);
    ls_status st = LS_OK;
    json_t *params = NULL;
    if (strcmp(h->mode, "rollout") != 0)
        st = ls_fail(err, LS_E_INPUT, "%s: header field mode is '%s'; replay --from needs a rollout trace",
                     trace_path, h->mode);
    info->act_bf16 = !h->activation_dtype || strcmp(h->activation_dtype, "fp32") != 0;
    info->state_digest_every = h->state_digest_every;
    if (st == LS_OK) {
        params = json_loads(h->run_params_json ? h->run_params_json : "{}", 0, NULL);
        if (!json_is_object(params))
            st = ls_fail(err, LS_E_INPUT, "%s: header field run_params is not a JSON object", trace_path);
    }
    if (st == LS_OK) {
        json_t *mn = json_object_get(params, "max_new_tokens");
        if (json_is_integer(mn)) info->max_new = (long)json_integer_value(mn);
    }
    /* Tokens per sequence, appended in position order. */
    long cap = 0;
    long *tcap = NULL;
    const ls_trace_record *rec;
    while (st == LS_OK && (st = ls_trace_reader_next(r, &rec, err)) == LS_OK && rec) {
        long i = 0;
        while (i < out->n && out->seqs[i].id != rec->seq) i++;
        if (i == out->n) {
            if (rec->pos != 0) {
                st = ls_fail(err, LS_E_INPUT, "%s: sequence %u starts at position %u (frame at byte %llu)",
                             trace_path, rec->seq, rec->pos, (unsigned long long)rec->frame_offset);
                break;
            }
            long oldcap = cap;
            st = batch_add(out, &cap, (ls_sequence){rec->seq, NULL, 0, 0}, err);
            if (st != LS_OK) break;
            if (cap != oldcap) {
                long *n = realloc(tcap, sizeof(long) * (size_t)cap);
                if (!n) {
                    st = ls_fail(err, LS_E_NOMEM, "out of memory");
                    break;
                }
                tcap = n;
            }
            tcap[i] = 0;
        }
        ls_sequence *s = &out->seqs[i];
        if ((long)rec->pos != s->n_tokens) {
            st = ls_fail(err, LS_E_INPUT, "%s: sequence %u jumps to position %u (frame at byte %llu)",
                         trace_path, rec->seq, rec->pos, (unsigned long long)rec->frame_offset);
            break;
        }
        if (s->n_tokens + 2 > tcap[i]) {
            long nc = tcap[i] ? 2 * tcap[i] : 64;
            int32_t *n = realloc((void *)s->tokens, sizeof(int32_t) * (size_t)nc);
            if (!n) {
                st = ls_fail(err, LS_E_NOMEM, "out of memory");
                break;
            }
            s->tokens = n;
            tcap[i] = nc;
        }
        int32_t *t = (int32_t *)s->tokens;
        t[s->n_tokens] = rec->token;
        t[s->n_tokens + 1] = rec->next_token; /* overwritten by the next position's token */
        s->n_tokens++;
    }
    if (st == LS_OK && !ls_trace_reader_complete(r))
        st = ls_fail(err, LS_E_INPUT, "%s: the trace has no trailer (the rollout did not finish)", trace_path);
    ls_trace_reader_close(r);
    free(tcap);
    for (long i = 0; st == LS_OK && i < out->n; i++) {
        ls_sequence *s = &out->seqs[i];
        if (s->tokens[s->n_tokens] < 0) {
            st = ls_fail(err, LS_E_INPUT, "%s: sequence %u has no next token at its last position %ld",
                         trace_path, s->id, s->n_tokens - 1);
            break;
        }
        s->n_tokens++; /* include the last sampled token as the final target */
    }
    /* Prompt lengths from run_params.batch. */
    json_t *b = params ? json_object_get(params, "batch") : NULL;
    for (size_t k = 0; st == LS_OK && json_is_array(b) && k < json_array_size(b); k++) {
        json_t *e = json_array_get(b, k);
        json_t *id = json_object_get(e, "id"), *pl = json_object_get(e, "prompt_len");
        if (!json_is_integer(id) || !json_is_integer(pl)) continue;
        for (long i = 0; i < out->n; i++)
            if (out->seqs[i].id == (uint32_t)json_integer_value(id)) {
                long p = (long)json_integer_value(pl);
                if (p >= 1 && p < out->seqs[i].n_tokens) out->seqs[i].prompt_len = p;
            }
    }
    json_decref(params);
    if (st == LS_OK && out->n == 0) st = ls_fail(err, LS_E_INPUT, "%s: the trace holds no records", trace_path);
    if (st != LS_OK) ls_cli_batch_free(out);
    return st;
}

/* ---- the run ------------------------------------------------------------------------ */

typedef struct sink_ctx {
    ls_trace_writer *w;
    ls_progress prog;
    uint64_t records;
} sink_ctx;

static ls_status write_frame(void *ctx, ls_frame_kind kind, const ls_trace_record *recs, long n,
                             ls_error *err)
{
    sink_ctx *c = ctx;
    LS_TRY(ls_trace_writer_begin_frame(c->w, kind, err));
    for (long i = 0; i < n; i++) LS_TRY(ls_trace_writer_add(c->w, &recs[i], err));
    LS_TRY(ls_trace_writer_end_frame(c->w, err));
    c->records += (uint64_t)n;
    ls_progress_add(&c->prog, (uint64_t)n);
    return LS_OK;
}

static json_t *run_params(const ls_run_spec *s, const ls_sequence *seqs, long n)
{
    json_t *batch = json_array();
    for (long i = 0; i < n; i++) {
        long pl = strcmp(s->mode, "rollout") == 0 ? seqs[i].n_tokens : seqs[i].prompt_len;
        json_array_append_new(batch, json_pack("{s:I, s:I, s:I}", "id", (json_int_t)seqs[i].id, "prompt_len",
                                               (json_int_t)pl, "n_tokens", (json_int_t)seqs[i].n_tokens));
    }
    json_t *samp = s->sampling.kind == LS_SAMPLING_GREEDY
                       ? json_pack("{s:s}", "kind", "greedy")
                       : json_pack("{s:s, s:I, s:f, s:I, s:f}", "kind", "seeded", "seed",
                                   (json_int_t)s->sampling.seed, "temperature",
                                   (double)s->sampling.temperature, "top_k", (json_int_t)s->sampling.top_k,
                                   "top_p", (double)s->sampling.top_p);
    int rollout = strcmp(s->mode, "rollout") == 0;
    return json_pack("{s:s, s:o, s:o, s:o, s:s, s:o, s:s, s:s, s:o, s:I, s:I}", "mode", s->mode, "sampling",
                     samp, "max_new_tokens", rollout ? json_integer(s->max_new) : json_null(), "chunk",
                     rollout ? json_null() : s->chunk > 0 ? json_integer(s->chunk) : json_string("whole"),
                     "batch_order", s->reverse_batch ? "reversed" : "as-given", "batch", batch,
                     "activations", s->act_bf16 ? "bf16" : "fp32", "backend", s->backend,
                     "perturbation", s->perturb ? json_string(s->perturb) : json_null(),
                     "state_digest_every", (json_int_t)s->state_digest_every, "max_rows",
                     (json_int_t)s->max_rows);
}

static ls_status parse_dump_layers(const char *spec, long L, unsigned char *mask, ls_error *err)
{
    const char *p = spec;
    while (*p) {
        char *end;
        errno = 0;
        long l = strtol(p, &end, 10);
        if (errno || end == p || l < 0 || l >= L || (*end && *end != ','))
            return ls_fail(err, LS_E_USAGE, "--dump-layers '%s': expected decoder layers in 0..%ld, "
                           "comma-separated", spec, L - 1);
        mask[l] = 1;
        p = *end ? end + 1 : end;
    }
    return LS_OK;
}

ls_status ls_cli_run_engine(const ls_run_spec *s, ls_run_result *res, ls_error *err)
{
    memset(res, 0, sizeof *res);
    int rollout = strcmp(s->mode, "rollout") == 0;
    const ls_cli_batch *b = s->batch;
    ls_checkpoint *ck = NULL;
    ls_model *m = NULL;
    json_t *man = NULL, *params = NULL;
    ls_engine *e = NULL;
    ls_sequence *seqs = NULL;
    unsigned char *dump = NULL;
    char *params_text = NULL;
    sink_ctx sc;
    memset(&sc, 0, sizeof sc);
    ls_engine_opts eo;
    ls_engine_opts_default(&eo);
    eo.backend = s->backend;
    eo.act_bf16 = s->act_bf16;
    eo.n_threads = s->threads;
    eo.max_rows = s->max_rows;
    eo.state_digest_every = s->state_digest_every;
    ls_status st = LS_OK;
    if (s->perturb) st = ls_perturb_parse(s->perturb, &eo.perturb_layer, &eo.perturb_op, err);
    if (st == LS_OK) st = ls_checkpoint_open(s->checkpoint, &ck, err);
    if (st == LS_OK) st = ls_model_open(ck, &m, err);
    if (st == LS_OK && s->dump_layers) {
        dump = calloc((size_t)m->cfg.n_layers, 1);
        if (!dump) st = ls_fail(err, LS_E_NOMEM, "out of memory");
        else st = parse_dump_layers(s->dump_layers, m->cfg.n_layers, dump, err);
        eo.dump_decoder_layers = dump;
    }
    long max_len = 1;
    for (long i = 0; st == LS_OK && i < b->n; i++) {
        const ls_sequence *q = &b->seqs[i];
        for (long t = 0; t < q->n_tokens; t++)
            if (q->tokens[t] < 0 || q->tokens[t] >= m->cfg.vocab) {
                st = ls_fail(err, LS_E_INPUT, "sequence %u: token %d at position %ld is outside the "
                             "vocabulary of %s (0..%ld)", q->id, q->tokens[t], t, s->checkpoint,
                             m->cfg.vocab - 1);
                break;
            }
        long need = rollout ? q->n_tokens + s->max_new - 1 : q->n_tokens - 1;
        if (need > max_len) max_len = need;
    }
    /* Pin the manifest in process; a perturbed run is a "fast" run with the
     * perturbation recorded, so its digest can never equal a strict one. */
    if (st == LS_OK) {
        ls_manifest_opts mo = ls_manifest_opts_default();
        mo.checkpoint = ck;
        mo.backend = s->backend;
        mo.threads = s->threads;
        mo.progress = s->progress;
        mo.fingerprint = s->fingerprint;
        if (s->perturb) {
            mo.mode = "fast";
            mo.perturbation = s->perturb;
        }
        st = ls_manifest_build(&mo, &man, err);
    }
    ls_digest md;
    if (st == LS_OK) st = ls_manifest_digest(man, &md, err);
    if (st == LS_OK) {
        ls_digest_to_hex(&md, res->manifest_digest);
        ls_log_verbose("%s: %zu tensors, %.3f GB; manifest pinned (backend %s, mode %s), digest %s",
                       s->checkpoint, ls_checkpoint_count(ck), (double)ls_checkpoint_total_bytes(ck) / 1e9,
                       s->backend, s->perturb ? "fast" : "strict", res->manifest_digest);
        const char *root = json_string_value(json_object_get(json_object_get(man, "checkpoint"), "merkle_root"));
        if (!root || strlen(root) != 64) st = ls_fail(err, LS_E_INTERNAL, "manifest without checkpoint.merkle_root");
        else memcpy(res->merkle_root, root, 65);
    }
    if (st == LS_OK) st = ls_engine_create(m, &eo, b->n, max_len, &e, err);
    if (st == LS_OK) {
        seqs = malloc(sizeof *seqs * (size_t)b->n);
        if (!seqs) st = ls_fail(err, LS_E_NOMEM, "out of memory");
        for (long i = 0; st == LS_OK && i < b->n; i++) seqs[i] = b->seqs[s->reverse_batch ? b->n - 1 - i : i];
    }
    if (st == LS_OK) {
        params = run_params(s, seqs, b->n);
        params_text = params ? json_dumps(params, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        if (!params_text) st = ls_fail(err, LS_E_NOMEM, "out of memory");
    }
    if (st == LS_OK) {
        int nl;
        const ls_trace_layer *layers = ls_engine_layers(e, &nl);
        ls_trace_header h;
        memset(&h, 0, sizeof h);
        h.mode = s->mode;
        h.engine = ls_engine_trace_name(e);
        h.model_fingerprint = res->merkle_root;
        h.manifest_digest = res->manifest_digest;
        h.run_params_json = params_text;
        h.topk = 5;
        h.digest_kinds_mask = (1u << LS_DIGEST_COUNT) - 1;
        h.state_digest_every = (uint32_t)s->state_digest_every;
        h.n_layers = nl;
        h.layers = layers;
        h.activation_dtype = s->act_bf16 ? "bf16" : "fp32";
        st = ls_trace_writer_open(s->out, &h, &sc.w, err);
    }
    if (st == LS_OK) {
        uint64_t total = 0;
        for (long i = 0; i < b->n; i++)
            total += (uint64_t)(rollout ? b->seqs[i].n_tokens + s->max_new - 1 : b->seqs[i].n_tokens - 1);
        res->positions = total;
        if (s->progress) ls_progress_begin(&sc.prog, s->mode, total, "tok");
        uint64_t t0 = ls_now_ns();
        if (rollout) {
            res->completions = malloc(sizeof(int32_t) * (size_t)(b->n * s->max_new));
            if (!res->completions) st = ls_fail(err, LS_E_NOMEM, "out of memory");
            else st = ls_engine_rollout(e, seqs, b->n, s->max_new, &s->sampling, res->completions,
                                        write_frame, &sc, err);
        } else {
            long chunk = s->chunk > 0 ? s->chunk : max_len;
            st = ls_engine_replay(e, seqs, b->n, chunk, write_frame, &sc, err);
        }
        res->seconds = (double)(ls_now_ns() - t0) / 1e9;
        if (s->progress) ls_progress_end(&sc.prog);
        ls_log_verbose("%s: %llu records in %.3f s on backend %s (max %ld rows per step)", s->mode,
                       (unsigned long long)sc.records, res->seconds, s->backend, eo.max_rows);
        if (st == LS_OK) st = ls_trace_writer_close(sc.w, err);
        else ls_trace_writer_abort(sc.w);
        res->records = sc.records;
    }
    if (st != LS_OK) {
        free(res->completions);
        res->completions = NULL;
    }
    free(params_text);
    json_decref(params);
    json_decref(man);
    free(seqs);
    free(dump);
    ls_engine_destroy(e);
    ls_model_close(m);
    ls_checkpoint_close(ck);
    return st;
}
