/* lockstep — checkpoint fingerprints (see fingerprint.h for the encodings). */
#include "fingerprint/fingerprint.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/thread.h"
#include "core/util.h"
#include "fingerprint/cache.h"
#include "io/json.h"

/* ---- leaves and the tree ---------------------------------------------------- */

static void put_u32le(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64le(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

ls_status ls_fingerprint_hash_leaf(const char *name, const char *dtype, int ndim,
                                   const int64_t *shape, const ls_digest *tensor_digest,
                                   ls_digest *out, ls_error *err)
{
    if (ndim < 0 || ndim > LS_TENSOR_MAX_DIMS)
        return ls_fail(err, LS_E_USAGE, "tensor %s: ndim %d out of range", name, ndim);
    static const uint8_t zero = 0x00;
    uint8_t dims[4 + 8 * LS_TENSOR_MAX_DIMS];
    put_u32le(dims, (uint32_t)ndim);
    for (int i = 0; i < ndim; i++) put_u64le(dims + 4 + 8 * i, (uint64_t)shape[i]);

    ls_sha256 h;
    ls_status st = ls_sha256_init(&h, err);
    if (st == LS_OK) st = ls_sha256_update(&h, &zero, 1, err); /* domain: leaf */
    if (st == LS_OK) st = ls_sha256_update(&h, name, strlen(name), err);
    if (st == LS_OK) st = ls_sha256_update(&h, &zero, 1, err);
    if (st == LS_OK) st = ls_sha256_update(&h, dtype, strlen(dtype), err);
    if (st == LS_OK) st = ls_sha256_update(&h, &zero, 1, err);
    if (st == LS_OK) st = ls_sha256_update(&h, dims, 4 + 8 * (size_t)ndim, err);
    if (st == LS_OK) st = ls_sha256_update(&h, tensor_digest->bytes, 32, err);
    if (st != LS_OK) {
        ls_sha256_discard(&h);
        return st;
    }
    return ls_sha256_final(&h, out, err);
}

ls_status ls_fingerprint_merkle_root(const ls_digest *leaves, size_t n, ls_digest *root,
                                     ls_error *err)
{
    if (n == 0) return ls_sha256_buf("", 0, root, err);
    ls_digest *level = malloc(n * sizeof *level);
    if (!level) return ls_fail_nomem(err, ls_bytes_mul(n, sizeof *level), "Merkle tree of %zu leaves", n);
    memcpy(level, leaves, n * sizeof *level);
    while (n > 1) {
        size_t m = 0;
        for (size_t i = 0; i < n; i += 2) {
            if (i + 1 == n) { /* odd node promoted unchanged */
                level[m++] = level[i];
                continue;
            }
            uint8_t buf[65];
            buf[0] = 0x01; /* domain: interior node */
            memcpy(buf + 1, level[i].bytes, 32);
            memcpy(buf + 33, level[i + 1].bytes, 32);
            ls_status st = ls_sha256_buf(buf, sizeof buf, &level[m++], err);
            if (st != LS_OK) {
                free(level);
                return st;
            }
        }
        n = m;
    }
    *root = level[0];
    free(level);
    return LS_OK;
}

/* ---- config ------------------------------------------------------------------ */

char *ls_fingerprint_canonical_json(const void *json, ls_error *err)
{
    if (!json) {
        ls_fail(err, LS_E_USAGE, "canonical JSON: no value");
        return NULL;
    }
    char *s = ls_json_canonical((const json_t *)json);
    if (!s && ls_json_failed_bytes()) ls_fail_nomem(err, ls_json_failed_bytes(), "canonical JSON");
    else if (!s) ls_fail(err, LS_E_NOMEM, "canonical JSON: out of memory");
    return s;
}

ls_status ls_fingerprint_hash_config(const void *config_json, ls_digest *out, ls_error *err)
{
    char *s = ls_fingerprint_canonical_json(config_json, err);
    if (!s) return err ? err->status : LS_E_NOMEM;
    ls_status st = ls_sha256_buf(s, strlen(s), out, err);
    free(s);
    return st;
}

/* ---- threaded hashing ---------------------------------------------------------- */

typedef struct fp_task {
    uint64_t size_bytes;         /* the tensor's size, the sort key */
    size_t index;                /* into the fingerprinted tensors (fp_job.src) */
} fp_task;

typedef struct fp_job {
    const ls_checkpoint *ck;     /* the tensors' checkpoint (a generated tensor streams from it) */
    const ls_tensor *const *src; /* [count of the fingerprint] tensors in name order: exposed and
                                    skipped; borrowed from the checkpoint */
    ls_tensor_fp *out;           /* [count of the fingerprint]; workers fill .digest */
    const fp_task *tasks;        /* [count], largest tensor first */
    size_t count;
    atomic_size_t next;          /* next position in tasks[] to claim */
    atomic_int failed;           /* set once; workers stop claiming */
    pthread_mutex_t err_lock;
    ls_error err;                /* first failure */
    ls_progress progress;
} fp_job;

/* ---- finiteness ------------------------------------------------------------------ */

/* ls_tensor_fp.first_nonfinite is stored in cache entries as it is. */
_Static_assert(LS_FP_ALL_FINITE == LS_FPCACHE_ALL_FINITE, "one \"none\" for both");

/* Element lanes of one 64-bit word for elements of width w bytes: rep(v)
 * copies the w-byte value v into every lane. */
static uint64_t lanes_rep(uint64_t v, unsigned w)
{
    uint64_t r = 0;
    for (unsigned k = 0; k < 8; k += w) r |= v << (8 * k);
    return r;
}

static uint64_t load_le(const uint8_t *p, unsigned w)
{
    uint64_t v = 0;
    for (unsigned k = 0; k < w; k++) v |= (uint64_t)p[k] << (8 * k);
    return v;
}

/* Index of the first element among the n_bytes at p (whole elements of w
 * bytes, little-endian) whose bits under mask are all set -- NaN or an
 * infinity (ls_dtype_nonfinite_mask) -- or LS_FP_ALL_FINITE.
 *
 * Eight bytes at a time: y = ~x & M is zero in a lane exactly when that
 * lane's exponent bits are all set. The mask never holds a lane's top bit
 * (the sign), so y + (H - L) cannot carry across lanes, and a lane's top
 * bit of the sum is clear exactly when its y is zero. A word that shows one
 * is then searched element by element for the index. */
static uint64_t first_nonfinite(const uint8_t *p, uint64_t n_bytes, unsigned w, uint64_t mask)
{
    const uint64_t M = lanes_rep(mask, w);
    const uint64_t H = lanes_rep((uint64_t)1 << (8 * w - 1), w), L = lanes_rep(1, w);
    const uint64_t K = H - L;
    uint64_t i = 0;
    for (; i + 64 <= n_bytes; i += 64) {
        uint64_t hit = 0;
        for (unsigned k = 0; k < 64; k += 8) {
            uint64_t x;
            memcpy(&x, p + i + k, 8);
            hit |= ~((~x & M) + K) & H;
        }
        if (hit) break;
    }
    for (; i + w <= n_bytes; i += w)
        if ((load_le(p + i, w) & mask) == mask) return i / w;
    return LS_FP_ALL_FINITE;
}

/* Bytes scanned for finiteness and then hashed per step: small enough that
 * the hash reads them again from the L2 cache, not from memory. */
#define LS_FP_STEP_BYTES ((size_t)64 << 10)

/* One tensor being hashed: its digest so far and its finiteness scan. */
typedef struct fp_feed {
    fp_job *job;
    ls_sha256 h;
    uint64_t mask;               /* ls_dtype_nonfinite_mask of its dtype */
    unsigned w;                  /* element bytes */
    int scan;                    /* 1 while no non-finite element has been seen */
    uint64_t done;               /* bytes fed so far */
    uint64_t *first_bad;
} fp_feed;

/* The next piece of a tensor's bytes (whole elements; ls_checkpoint_stream's
 * pieces are also the progress updates and cancellation checks), scanned
 * for finiteness and hashed step by step. Fails once another worker failed,
 * to stop the tensor early (that error is never reported). */
static ls_status fp_feed_piece(void *ctx, const void *bytes, size_t n, ls_error *err)
{
    fp_feed *f = ctx;
    const uint8_t *p = bytes;
    ls_status st = LS_OK;
    /* LS_FP_STEP_BYTES is a multiple of every element width, so each step
     * holds whole elements. */
    for (size_t k = 0; st == LS_OK && k < n; k += LS_FP_STEP_BYTES) {
        size_t m = n - k < LS_FP_STEP_BYTES ? n - k : LS_FP_STEP_BYTES;
        if (f->scan) {
            uint64_t bad = first_nonfinite(p + k, m, f->w, f->mask);
            if (bad != LS_FP_ALL_FINITE) {
                *f->first_bad = (f->done + k) / f->w + bad;
                f->scan = 0; /* the first one is all that is reported */
            }
        }
        st = ls_sha256_update(&f->h, p + k, m, err);
    }
    f->done += n;
    ls_progress_add(&f->job->progress, n);
    if (st == LS_OK && atomic_load_explicit(&f->job->failed, memory_order_relaxed))
        st = ls_fail(err, LS_E_INTERNAL, "stopped: another tensor failed");
    return st;
}

/* SHA-256 of t's bytes into *out and, for a floating dtype, the index of
 * its first non-finite element into *first_bad (LS_FP_ALL_FINITE if none):
 * one pass over the bytes (ls_checkpoint_stream: the mapping, or a
 * generated tensor's source) serves both. */
static ls_status hash_tensor(fp_job *job, const ls_tensor *t, ls_digest *out, uint64_t *first_bad,
                             ls_error *err)
{
    fp_feed f = {.job = job, .mask = ls_dtype_nonfinite_mask(t->dtype), .w = (unsigned)ls_dtype_size(t->dtype),
                 .first_bad = first_bad};
    *first_bad = LS_FP_ALL_FINITE;
    f.scan = f.mask != 0 && f.w > 0 && f.w <= 8 && (8 % f.w) == 0;
    if (t->data && t->size_bytes > 0) {
        /* Advice only: tell the kernel to read ahead and drop behind. */
        uintptr_t p = (uintptr_t)t->data, a = p & ~(uintptr_t)(sysconf(_SC_PAGESIZE) - 1);
        (void)madvise((void *)a, (size_t)(p + t->size_bytes - a), MADV_SEQUENTIAL);
    }
    ls_status st = ls_sha256_init(&f.h, err);
    if (st == LS_OK) st = ls_checkpoint_stream(job->ck, t, fp_feed_piece, &f, err);
    if (st == LS_OK && f.done != t->size_bytes)
        st = ls_fail(err, LS_E_INTERNAL, "%llu bytes of %llu", (unsigned long long)f.done,
                     (unsigned long long)t->size_bytes);
    if (st != LS_OK) {
        ls_sha256_discard(&f.h);
        return ls_error_prefix(err, "tensor %s", t->name);
    }
    return ls_sha256_final(&f.h, out, err);
}

static void *fp_worker(void *arg)
{
    fp_job *job = arg;
    ls_error err;
    ls_error_clear(&err);
    for (;;) {
        if (atomic_load(&job->failed)) break;
        size_t k = atomic_fetch_add(&job->next, 1);
        if (k >= job->count) break;
        size_t i = job->tasks[k].index;
        const ls_tensor *t = job->src[i];
        if (hash_tensor(job, t, &job->out[i].digest, &job->out[i].first_nonfinite, &err) != LS_OK) {
            pthread_mutex_lock(&job->err_lock);
            if (!atomic_load(&job->failed)) {
                job->err = err;
                atomic_store(&job->failed, 1);
            }
            pthread_mutex_unlock(&job->err_lock);
            break;
        }
    }
    return NULL;
}

static int by_size_desc(const void *a, const void *b)
{
    const fp_task *x = a, *y = b;
    if (x->size_bytes != y->size_bytes) return x->size_bytes < y->size_bytes ? 1 : -1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Hashes the n tensors of tasks[] into out[].digest over up to `threads`
 * threads, largest first so the last tensor to finish is a small one. */
static ls_status hash_tasks(const ls_checkpoint *ck, const ls_tensor *const *src, ls_tensor_fp *out, fp_task *tasks, size_t n,
                            int threads, int progress, uint64_t bytes, int *threads_used,
                            ls_error *err)
{
    *threads_used = 0;
    if (n == 0) return LS_OK;
    if ((size_t)threads > n) threads = (int)n;
    if (threads < 1) threads = 1;
    qsort(tasks, n, sizeof *tasks, by_size_desc);
    fp_job *job = calloc(1, sizeof *job);
    pthread_t *tids = malloc((size_t)threads * sizeof *tids);
    if (!job || !tids) {
        free(job);
        free(tids);
        return ls_fail_nomem(err, (size_t)threads * (sizeof *job + sizeof *tids), "fingerprint: tables of %d threads", threads);
    }
    job->ck = ck;
    job->src = src;
    job->out = out;
    job->tasks = tasks;
    job->count = n;
    atomic_init(&job->next, 0);
    atomic_init(&job->failed, 0);
    pthread_mutex_init(&job->err_lock, NULL);
    ls_error_clear(&job->err);
    if (progress)
        ls_progress_begin(&job->progress, "fingerprint", bytes, "B");
    else
        memset(&job->progress, 0, sizeof job->progress); /* enabled = 0: no-op */

    int started = 0;
    for (; started < threads; started++)
        if (ls_thread_start(&tids[started], fp_worker, job) != 0) break;
    if (started == 0) fp_worker(job); /* could not start any thread: hash here */
    for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
    *threads_used = started ? started : 1;
    if (progress) ls_progress_end(&job->progress);

    ls_status st = LS_OK;
    if (atomic_load(&job->failed)) st = ls_fail(err, job->err.status, "%s", job->err.msg);
    pthread_mutex_destroy(&job->err_lock);
    free(job);
    free(tids);
    return st;
}

/* ---- the cache, per shard -------------------------------------------------------- */

typedef struct fp_shard {
    const ls_safetensors *st;    /* borrowed from the checkpoint */
    const char *path;            /* as opened; borrowed */
    size_t first, n;             /* its fingerprinted tensors (exposed and skipped):
                                    by_shard[first .. first + n) */
    uint64_t bytes;              /* their sizes summed */
    ls_file_identity id;         /* of the mapped file, taken when it was opened */
    char *canon;                 /* canonical absolute path; owned */
    char *entry_path;            /* owned; NULL: this shard is not cached this time */
    int cached;                  /* 1: digests came from the cache */
} fp_shard;

static int cmp_record_name(const void *a, const void *b)
{
    return strcmp((*(const ls_fpcache_tensor *const *)a)->name,
                  (*(const ls_fpcache_tensor *const *)b)->name);
}

/* The records of e sorted by name (pointers into e), for lookups by the
 * stored name. Caller frees; NULL when out of memory. */
static ls_fpcache_tensor **records_by_name(const ls_fpcache_entry *e)
{
    ls_fpcache_tensor **v = malloc((e->count ? e->count : 1) * sizeof *v);
    if (!v) return NULL;
    for (size_t i = 0; i < e->count; i++) v[i] = &e->tensors[i];
    qsort(v, e->count, sizeof *v, cmp_record_name);
    return v;
}

static ls_fpcache_tensor *record_find(ls_fpcache_tensor **v, size_t n, const char *name)
{
    ls_fpcache_tensor key = {.name = (char *)name}, *kp = &key;
    ls_fpcache_tensor **hit = bsearch(&kp, v, n, sizeof *v, cmp_record_name);
    return hit ? *hit : NULL;
}

/* Decides whether shard sh may use the cache at all: its identity is known,
 * its path resolves, and the path still names the mapped file unchanged (if
 * the file was replaced or modified since it was opened, neither a cached
 * digest nor a stored one would describe the mapping). Sets sh->entry_path. */
static void shard_prepare(fp_shard *sh, const char *cache_dir)
{
    const ls_file_identity *id = ls_safetensors_identity(sh->st);
    if (!id) return;
    sh->id = *id;
    ls_error e;
    ls_error_clear(&e);
    ls_file_identity now;
    if (ls_file_identity_stat(sh->path, &now, &e) != LS_OK ||
        !ls_file_identity_equal(&now, &sh->id)) {
        ls_log_verbose("fingerprint cache: %s changed since it was opened; hashing the mapping, "
                       "not caching it", sh->path);
        return;
    }
    sh->canon = realpath(sh->path, NULL);
    if (!sh->canon) {
        ls_log_verbose("fingerprint cache: %s: cannot resolve the path (%s); not caching it",
                       sh->path, strerror(errno));
        return;
    }
    if (ls_fpcache_entry_path(cache_dir, sh->canon, &sh->entry_path, &e) != LS_OK)
        ls_log_verbose("fingerprint cache: %s", e.msg);
}

/* Why entry e does not describe the shard's current header, or NULL when it
 * does (same tensors in the same data order, same dtype, shape, size and
 * offset). why[] receives the first difference. */
static const char *header_mismatch(const ls_fpcache_entry *e, const ls_safetensors *st,
                                   char *why, size_t cap)
{
    size_t n = ls_safetensors_count(st);
    if (e->count != n) {
        snprintf(why, cap, "the entry lists %zu tensors, the header %zu", e->count, n);
        return why;
    }
    for (size_t k = 0; k < n; k++) {
        const ls_fpcache_tensor *r = &e->tensors[k];
        const ls_tensor *t = ls_safetensors_at(st, k);
        int same = strcmp(r->name, t->name) == 0 && r->dtype == t->dtype && r->ndim == t->ndim &&
                   r->size_bytes == t->size_bytes && r->file_offset_bytes == t->file_offset_bytes;
        for (int d = 0; same && d < t->ndim; d++) same = r->shape[d] == t->shape[d];
        if (!same) {
            snprintf(why, cap, "tensor %zu of the header ('%.300s') differs from the entry's "
                     "('%.300s')", k, t->name, r->name);
            return why;
        }
    }
    return NULL;
}

/* Fills the digests of shard sh's fingerprinted tensors from its entry when the
 * entry may be trusted (see fingerprint.h); returns 1 on a hit. */
static int shard_lookup(fp_shard *sh, const ls_tensor *const *src, const size_t *by_shard,
                        ls_tensor_fp *out)
{
    ls_fpcache_entry e;
    ls_error err;
    ls_error_clear(&err);
    int found = 0;
    if (ls_fpcache_load(sh->entry_path, &e, &found, &err) != LS_OK) {
        ls_log_warn("fingerprint cache: %s; entry not trusted, hashing %s afresh", err.msg,
                    sh->path);
        return 0;
    }
    if (!found) return 0;
    int hit = 0;
    char why[800];
    const char *miss = NULL;
    ls_fpcache_tensor **sorted = NULL;
    ls_digest *digests = NULL;
    uint64_t *first_bad = NULL;
    if (strcmp(e.path, sh->canon) != 0) {
        ls_log_warn("fingerprint cache: %s: entry is for '%.300s', not '%.300s' (byte offset %u); "
                    "entry not trusted, hashing %s afresh", sh->entry_path, e.path, sh->canon,
                    LS_FPCACHE_PATH_OFFSET, sh->path);
        goto done;
    }
    if (!ls_file_identity_equal(&e.identity, &sh->id))
        miss = "the file's identity differs from the entry's";
    else if (ls_fpcache_racy(&e.identity, e.hashed_at_ns))
        miss = "the file changed no earlier than hashing began (racy entry)";
    else
        miss = header_mismatch(&e, sh->st, why, sizeof why);
    if (!miss) {
        sorted = records_by_name(&e);
        digests = malloc((sh->n ? sh->n : 1) * sizeof *digests);
        first_bad = malloc((sh->n ? sh->n : 1) * sizeof *first_bad);
        if (!sorted || !digests || !first_bad) {
            miss = "out of memory";
        } else {
            for (size_t j = 0; j < sh->n && !miss; j++) {
                const ls_tensor *t = src[by_shard[sh->first + j]];
                const ls_fpcache_tensor *r = record_find(sorted, e.count, t->stored_name);
                if (!r || !r->has_digest) {
                    snprintf(why, sizeof why, "no digest for tensor '%.300s'", t->stored_name);
                    miss = why;
                } else {
                    digests[j] = r->digest;
                    first_bad[j] = r->first_nonfinite;
                }
            }
        }
    }
    if (miss) {
        ls_log_verbose("fingerprint cache: %s: %s; hashing it", sh->path, miss);
        goto done;
    }
    for (size_t j = 0; j < sh->n; j++) {
        out[by_shard[sh->first + j]].digest = digests[j];
        out[by_shard[sh->first + j]].first_nonfinite = first_bad[j];
    }
    hit = 1;
done:
    free(sorted);
    free(digests);
    free(first_bad);
    ls_fpcache_entry_free(&e);
    return hit;
}

/* Stores the entry of a shard just hashed, if the shard kept its identity
 * throughout and is not racy for a hash begun at hashed_at_ns. */
static ls_status shard_store(const fp_shard *sh, const ls_tensor *const *src, const size_t *by_shard,
                             const ls_tensor_fp *out, int64_t hashed_at_ns, int *stored,
                             ls_error *err)
{
    *stored = 0;
    ls_file_identity now;
    ls_error e;
    ls_error_clear(&e);
    if (ls_file_identity_stat(sh->path, &now, &e) != LS_OK ||
        !ls_file_identity_equal(&now, &sh->id)) {
        ls_log_verbose("fingerprint cache: %s changed while it was hashed; not caching it",
                       sh->path);
        return LS_OK;
    }
    if (ls_fpcache_racy(&sh->id, hashed_at_ns)) {
        ls_log_verbose("fingerprint cache: %s changed too shortly before it was hashed to be "
                       "told apart from a later change; not caching it this time", sh->path);
        return LS_OK;
    }
    size_t n = ls_safetensors_count(sh->st);
    ls_fpcache_entry ent = {0};
    ent.path = sh->canon;
    ent.identity = sh->id;
    ent.hashed_at_ns = hashed_at_ns;
    ent.count = n;
    ent.tensors = calloc(n ? n : 1, sizeof *ent.tensors);
    ls_fpcache_tensor **sorted = NULL;
    ls_status st = LS_OK;
    if (!ent.tensors) st = ls_fail_nomem(err, (n ? n : 1) * sizeof *ent.tensors, "fingerprint cache: entry of %zu tensors", n);
    for (size_t k = 0; st == LS_OK && k < n; k++) {
        const ls_tensor *t = ls_safetensors_at(sh->st, k);
        ls_fpcache_tensor *r = &ent.tensors[k];
        r->name = (char *)t->name; /* borrowed for encoding; not freed below */
        r->dtype = t->dtype;
        r->ndim = t->ndim;
        memcpy(r->shape, t->shape, sizeof r->shape);
        r->size_bytes = t->size_bytes;
        r->file_offset_bytes = t->file_offset_bytes;
        r->first_nonfinite = LS_FPCACHE_ALL_FINITE;
    }
    if (st == LS_OK && !(sorted = records_by_name(&ent)))
        st = ls_fail_nomem(err, (n ? n : 1) * sizeof *sorted, "fingerprint cache: sorted entry of %zu tensors", n);
    for (size_t j = 0; st == LS_OK && j < sh->n; j++) {
        size_t i = by_shard[sh->first + j];
        const ls_tensor *t = src[i];
        ls_fpcache_tensor *r = record_find(sorted, n, t->stored_name);
        if (!r) {
            st = ls_fail(err, LS_E_INTERNAL, "%s: tensor '%.300s' is not in its shard's header",
                         sh->path, t->stored_name);
        } else {
            r->has_digest = 1;
            r->digest = out[i].digest;
            r->first_nonfinite = out[i].first_nonfinite;
        }
    }
    if (st == LS_OK) st = ls_fpcache_store(sh->entry_path, &ent, err);
    if (st == LS_OK) *stored = 1;
    free(sorted);
    free(ent.tensors);
    return st;
}

/* ---- a whole checkpoint ------------------------------------------------------------ */

/* Fails naming the first tensor (in name order) with a NaN or an infinity,
 * its first such element and that element's bits: a non-finite weight turns
 * every output it reaches into NaN, and a run on it would "agree with
 * itself" about nothing. */
static ls_status refuse_nonfinite(const ls_checkpoint *ck, const ls_tensor *const *src,
                                  const ls_fingerprint *fp, ls_error *err)
{
    /* Skipped tensors (vision tower, MTP head) are fingerprinted but never
     * read by the model, so a NaN in one reaches no output: not refused. */
    size_t bad = 0, first = fp->count;
    for (size_t i = 0; i < fp->count; i++)
        if (!fp->tensors[i].skipped && fp->tensors[i].first_nonfinite != LS_FP_ALL_FINITE && bad++ == 0)
            first = i;
    if (!bad) return LS_OK;
    const ls_tensor *t = src[first];
    const unsigned w = (unsigned)ls_dtype_size(t->dtype);
    const uint64_t idx = fp->tensors[first].first_nonfinite, mask = ls_dtype_nonfinite_mask(t->dtype);
    if (!t->data) /* generated: its bytes are gone, its index is what there is */
        return ls_fail(err, LS_E_INPUT, "%s: tensor '%.300s' element %llu of %llu is not finite: "
                       "non-finite weights are refused (%zu tensor%s with one)", ls_checkpoint_dir(ck), t->name,
                       (unsigned long long)idx, (unsigned long long)(t->size_bytes / w), bad, bad == 1 ? "" : "s");
    const uint64_t bits = load_le((const uint8_t *)t->data + idx * w, w);
    const uint64_t sign = (uint64_t)1 << (8 * w - 1);
    const char *what = (bits & ~mask & ~sign) || t->dtype == LS_DTYPE_F8_E4M3 ? "NaN"
                       : (bits & sign)                                       ? "-Inf"
                                                                             : "+Inf";
    return ls_fail(err, LS_E_INPUT, "%s: tensor '%.300s' element %llu of %llu is %s (bits 0x%0*llx, "
                   "byte offset %llu): non-finite weights are refused (%zu tensor%s with one)",
                   ls_checkpoint_shard_path(ck, (size_t)t->shard), t->name,
                   (unsigned long long)idx, (unsigned long long)(t->size_bytes / w), what,
                   (int)(2 * w), (unsigned long long)bits,
                   (unsigned long long)(t->file_offset_bytes + idx * w), bad, bad == 1 ? "" : "s");
}

int ls_fingerprint_default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n > 1024 ? 1024 : (int)n);
}

char *ls_fingerprint_default_cache_dir(void)
{
    const char *v = getenv("LOCKSTEP_CACHE_DIR");
    if (v && *v) return strdup(v);
    const char *base = NULL, *suffix = NULL;
    v = getenv("XDG_CACHE_HOME");
    if (v && v[0] == '/') { /* the XDG spec: a relative value is ignored */
        base = v;
        suffix = "/lockstep";
    } else if ((v = getenv("HOME")) && *v) {
        base = v;
        suffix = "/.cache/lockstep";
    }
    if (!base) return NULL;
    size_t n = strlen(base) + strlen(suffix) + 1;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s%s", base, suffix);
    return p;
}

ls_status ls_fingerprint_checkpoint(const ls_checkpoint *ck, const ls_fingerprint_opts *opts,
                                    ls_fingerprint *out, ls_error *err)
{
    return ls_fingerprint_checkpoint_cached(ck, opts, NULL, out, err);
}

ls_status ls_fingerprint_checkpoint_cached(const ls_checkpoint *ck,
                                           const ls_fingerprint_opts *opts,
                                           const ls_fingerprint_cache_opts *cache,
                                           ls_fingerprint *out, ls_error *err)
{
    memset(out, 0, sizeof *out);
    int threads = opts && opts->threads > 0 ? opts->threads : ls_fingerprint_default_threads();
    const char *cache_dir = cache && cache->dir && *cache->dir ? cache->dir : NULL;
    int refresh = cache && cache->refresh;
    /* Exposed and skipped tensors alike (io/checkpoint.h): the vision tower
     * and the MTP head are never read by the model, but the fingerprint
     * covers every byte of the checkpoint's tensors, so a changed skipped
     * tensor changes the root. */
    size_t n_exposed = ls_checkpoint_count(ck), n_skipped = ls_checkpoint_ignored_count(ck);
    size_t count = n_exposed + n_skipped, nshards = ls_checkpoint_shard_count(ck);
    const ls_tensor **src = NULL;

    ls_status st = ls_fingerprint_hash_config(ls_checkpoint_config_json(ck), &out->config_digest, err);
    if (st != LS_OK) return ls_error_prefix(err, "%s/config.json", ls_checkpoint_dir(ck));

    out->tensors = calloc(count ? count : 1, sizeof *out->tensors);
    size_t *by_shard = malloc((count ? count : 1) * sizeof *by_shard);
    fp_task *tasks = malloc((count ? count : 1) * sizeof *tasks);
    ls_digest *leaves = malloc((count ? count : 1) * sizeof *leaves);
    fp_shard *shards = calloc(nshards ? nshards : 1, sizeof *shards);
    src = malloc((count ? count : 1) * sizeof *src);
    if (!out->tensors || !by_shard || !tasks || !leaves || !shards || !src) {
        st = ls_fail_nomem(err, (count ? count : 1) * (sizeof *out->tensors + sizeof *by_shard + sizeof *tasks + sizeof *leaves + sizeof *src) +
                                    (nshards ? nshards : 1) * sizeof *shards, "fingerprint: tables of %zu tensors", count);
        goto done;
    }
    out->count = count;
    /* Merge the two name-sorted lists; the reader guarantees no name is in
     * both (a normalised name equal to a skipped stored name is refused). */
    for (size_t i = 0, a = 0, b = 0; i < count; i++) {
        const ls_tensor *x = a < n_exposed ? ls_checkpoint_at(ck, a) : NULL;
        const ls_tensor *y = b < n_skipped ? ls_checkpoint_ignored_at(ck, b) : NULL;
        int take_x = x && (!y || strcmp(x->name, y->name) < 0);
        src[i] = take_x ? x : y;
        out->tensors[i].skipped = !take_x;
        if (take_x) a++;
        else b++;
    }
    for (size_t s = 0; s < nshards; s++) {
        shards[s].st = ls_checkpoint_shard(ck, s);
        shards[s].path = ls_checkpoint_shard_path(ck, s);
    }
    for (size_t i = 0; i < count; i++) {
        const ls_tensor *t = src[i];
        ls_tensor_fp *f = &out->tensors[i];
        f->name = t->name;
        f->dtype = t->dtype;
        f->ndim = t->ndim;
        memcpy(f->shape, t->shape, sizeof f->shape);
        f->size_bytes = t->size_bytes;
        f->first_nonfinite = LS_FP_ALL_FINITE;
        out->total_bytes += t->size_bytes;
        if (t->shard < 0 && ls_checkpoint_generated(ck)) continue; /* no shard: hashed below */
        if (t->shard < 0 || (size_t)t->shard >= nshards) {
            st = ls_fail(err, LS_E_INTERNAL, "tensor %s: shard %d out of range", t->name, t->shard);
            goto done;
        }
        shards[t->shard].n++;
        shards[t->shard].bytes += t->size_bytes;
    }
    /* Group the tensor indices by shard (counting sort, name order within). */
    for (size_t s = 1; s < nshards; s++) shards[s].first = shards[s - 1].first + shards[s - 1].n;
    {
        size_t *fill = calloc(nshards ? nshards : 1, sizeof *fill);
        if (!fill) {
            st = ls_fail_nomem(err, (nshards ? nshards : 1) * sizeof *fill, "fingerprint: table of %zu shards", nshards);
            goto done;
        }
        for (size_t i = 0; i < count; i++) {
            int s = src[i]->shard;
            if (s >= 0) by_shard[shards[s].first + fill[s]++] = i;
        }
        free(fill);
    }

    for (size_t s = 0; s < nshards; s++) {
        fp_shard *sh = &shards[s];
        if (sh->n == 0) continue;
        if (cache_dir) shard_prepare(sh, cache_dir);
        if (sh->entry_path && !refresh) sh->cached = shard_lookup(sh, src, by_shard, out->tensors);
    }

    /* Read before the first byte is hashed: an entry is only as good as the
     * ordering of this moment and the file's last change (ls_fpcache_racy). */
    int64_t hashed_at_ns = ls_fpcache_clock_ns();
    size_t ntasks = 0;
    for (size_t s = 0; s < nshards; s++) {
        const fp_shard *sh = &shards[s];
        if (sh->n == 0) continue;
        if (sh->cached) {
            out->files_cached++;
            out->bytes_cached += sh->bytes;
            continue;
        }
        out->files_hashed++;
        out->bytes_hashed += sh->bytes;
        for (size_t j = 0; j < sh->n; j++) {
            size_t i = by_shard[sh->first + j];
            tasks[ntasks].index = i;
            tasks[ntasks].size_bytes = out->tensors[i].size_bytes;
            ntasks++;
        }
    }
    for (size_t i = 0; i < count; i++) /* a generated checkpoint's tensors: always hashed */
        if (src[i]->shard < 0) {
            out->bytes_hashed += out->tensors[i].size_bytes;
            tasks[ntasks].index = i;
            tasks[ntasks].size_bytes = out->tensors[i].size_bytes;
            ntasks++;
        }
    uint64_t t0 = ls_now_ns();
    st = hash_tasks(ck, src, out->tensors, tasks, ntasks, threads, opts && opts->progress,
                    out->bytes_hashed, &out->threads_used, err);
    out->elapsed_ns = ls_now_ns() - t0;
    if (st != LS_OK) goto done;

    int warned = 0;
    for (size_t s = 0; s < nshards; s++) {
        const fp_shard *sh = &shards[s];
        if (sh->n == 0 || sh->cached || !sh->entry_path) continue;
        ls_error e;
        ls_error_clear(&e);
        int stored = 0;
        if (shard_store(sh, src, by_shard, out->tensors, hashed_at_ns, &stored, &e) != LS_OK) {
            /* The result does not depend on the cache: say so once and go on. */
            if (!warned)
                ls_log_warn("fingerprint cache: %s; continuing without storing entries", e.msg);
            warned = 1;
        }
        out->cache_entries_written += (size_t)stored;
    }
    /* After the entries are stored, so a second look at the same files
     * refuses from the cache without reading them again. */
    st = refuse_nonfinite(ck, src, out, err);
    if (st != LS_OK) goto done;

    for (size_t i = 0; i < count && st == LS_OK; i++) {
        const ls_tensor_fp *f = &out->tensors[i];
        st = ls_fingerprint_hash_leaf(f->name, ls_dtype_name(f->dtype), f->ndim, f->shape,
                                      &f->digest, &leaves[i], err);
    }
    if (st == LS_OK) st = ls_fingerprint_merkle_root(leaves, count, &out->merkle_root, err);
done:
    for (size_t s = 0; shards && s < nshards; s++) {
        free(shards[s].canon);
        free(shards[s].entry_path);
    }
    free(shards);
    free(by_shard);
    free(tasks);
    free(leaves);
    free(src);
    if (st != LS_OK) ls_fingerprint_free(out);
    return st;
}

void ls_fingerprint_free(ls_fingerprint *fp)
{
    if (!fp) return;
    free(fp->tensors);
    memset(fp, 0, sizeof *fp);
}
