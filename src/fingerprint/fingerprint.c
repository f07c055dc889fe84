/* lockstep — checkpoint fingerprints (see fingerprint.h for the encodings). */
#include "fingerprint/fingerprint.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/util.h"
#include "io/json.h"

/* Bytes hashed between progress updates and cancellation checks: large enough
 * that the per-call cost of EVP_DigestUpdate is negligible. */
#define LS_FP_CHUNK_BYTES ((size_t)8 << 20)

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
    if (!level) return ls_fail(err, LS_E_NOMEM, "Merkle tree: out of memory (%zu leaves)", n);
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
    if (!s) ls_fail(err, LS_E_NOMEM, "canonical JSON: out of memory");
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

/* ---- threaded checkpoint hashing --------------------------------------------- */

typedef struct fp_job {
    const ls_checkpoint *ck;
    ls_tensor_fp *out;           /* [count] */
    size_t *order;               /* [count] indices, largest tensor first */
    size_t count;
    atomic_size_t next;          /* next position in order[] to claim */
    atomic_int failed;           /* set once; workers stop claiming */
    pthread_mutex_t err_lock;
    ls_error err;                /* first failure */
    ls_progress progress;
} fp_job;

static ls_status hash_tensor(fp_job *job, const ls_tensor *t, ls_digest *out, ls_error *err)
{
    const uint8_t *p = t->data;
    uint64_t left = t->size_bytes;
    if (left > 0 && p) {
        /* Advice only: tell the kernel to read ahead and drop behind. */
        long page = sysconf(_SC_PAGESIZE);
        uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1);
        (void)madvise((void *)a, (size_t)((uintptr_t)p + left - a), MADV_SEQUENTIAL);
    }
    ls_sha256 h;
    ls_status st = ls_sha256_init(&h, err);
    while (st == LS_OK && left > 0) {
        size_t n = left < LS_FP_CHUNK_BYTES ? (size_t)left : LS_FP_CHUNK_BYTES;
        st = ls_sha256_update(&h, p, n, err);
        p += n;
        left -= n;
        ls_progress_add(&job->progress, n);
        if (atomic_load_explicit(&job->failed, memory_order_relaxed)) break;
    }
    if (st != LS_OK) {
        ls_sha256_discard(&h);
        return ls_error_prefix(err, "tensor %s", t->name);
    }
    return ls_sha256_final(&h, out, err);
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
        size_t i = job->order[k];
        const ls_tensor *t = ls_checkpoint_at(job->ck, i);
        if (hash_tensor(job, t, &job->out[i].digest, &err) != LS_OK) {
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

static const ls_checkpoint *sort_ck;   /* qsort has no context argument; guarded below */
static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;

static int by_size_desc(const void *a, const void *b)
{
    uint64_t sa = ls_checkpoint_at(sort_ck, *(const size_t *)a)->size_bytes;
    uint64_t sb = ls_checkpoint_at(sort_ck, *(const size_t *)b)->size_bytes;
    if (sa != sb) return sa < sb ? 1 : -1;
    size_t ia = *(const size_t *)a, ib = *(const size_t *)b;
    return ia < ib ? -1 : ia > ib;
}

int ls_fingerprint_default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n > 1024 ? 1024 : (int)n);
}

ls_status ls_fingerprint_checkpoint(const ls_checkpoint *ck, const ls_fingerprint_opts *opts,
                                    ls_fingerprint *out, ls_error *err)
{
    memset(out, 0, sizeof *out);
    int threads = opts && opts->threads > 0 ? opts->threads : ls_fingerprint_default_threads();
    size_t count = ls_checkpoint_count(ck);
    if (count > 0 && (size_t)threads > count) threads = (int)count;
    if (threads < 1) threads = 1;

    ls_status st = ls_fingerprint_hash_config(ls_checkpoint_config_json(ck), &out->config_digest, err);
    if (st != LS_OK) return ls_error_prefix(err, "%s/config.json", ls_checkpoint_dir(ck));

    out->tensors = calloc(count ? count : 1, sizeof *out->tensors);
    fp_job *job = calloc(1, sizeof *job);
    size_t *order = malloc((count ? count : 1) * sizeof *order);
    pthread_t *tids = malloc((size_t)threads * sizeof *tids);
    ls_digest *leaves = malloc((count ? count : 1) * sizeof *leaves);
    if (!out->tensors || !job || !order || !tids || !leaves) {
        free(job);
        free(order);
        free(tids);
        free(leaves);
        ls_fingerprint_free(out);
        return ls_fail(err, LS_E_NOMEM, "fingerprint: out of memory (%zu tensors)", count);
    }
    out->count = count;
    for (size_t i = 0; i < count; i++) {
        const ls_tensor *t = ls_checkpoint_at(ck, i);
        ls_tensor_fp *f = &out->tensors[i];
        f->name = t->name;
        f->dtype = t->dtype;
        f->ndim = t->ndim;
        memcpy(f->shape, t->shape, sizeof f->shape);
        f->size_bytes = t->size_bytes;
        out->total_bytes += t->size_bytes;
        order[i] = i;
    }
    /* Largest first, so the last tensor to finish is a small one. */
    pthread_mutex_lock(&sort_lock);
    sort_ck = ck;
    qsort(order, count, sizeof *order, by_size_desc);
    pthread_mutex_unlock(&sort_lock);

    job->ck = ck;
    job->out = out->tensors;
    job->order = order;
    job->count = count;
    atomic_init(&job->next, 0);
    atomic_init(&job->failed, 0);
    pthread_mutex_init(&job->err_lock, NULL);
    ls_error_clear(&job->err);
    if (opts && opts->progress)
        ls_progress_begin(&job->progress, "fingerprint", out->total_bytes, "B");
    else
        memset(&job->progress, 0, sizeof job->progress); /* enabled = 0: no-op */

    uint64_t t0 = ls_now_ns();
    int started = 0;
    for (; started < threads; started++)
        if (pthread_create(&tids[started], NULL, fp_worker, job) != 0) break;
    if (started == 0) fp_worker(job); /* could not start any thread: hash here */
    for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
    out->elapsed_ns = ls_now_ns() - t0;
    out->threads_used = started ? started : 1;
    if (opts && opts->progress) ls_progress_end(&job->progress);

    if (atomic_load(&job->failed)) {
        st = ls_fail(err, job->err.status, "%s", job->err.msg);
    } else {
        for (size_t i = 0; i < count && st == LS_OK; i++) {
            const ls_tensor_fp *f = &out->tensors[i];
            st = ls_fingerprint_hash_leaf(f->name, ls_dtype_name(f->dtype), f->ndim, f->shape,
                                          &f->digest, &leaves[i], err);
        }
        if (st == LS_OK) st = ls_fingerprint_merkle_root(leaves, count, &out->merkle_root, err);
    }
    pthread_mutex_destroy(&job->err_lock);
    free(job);
    free(order);
    free(tids);
    free(leaves);
    if (st != LS_OK) ls_fingerprint_free(out);
    return st;
}

void ls_fingerprint_free(ls_fingerprint *fp)
{
    if (!fp) return;
    free(fp->tensors);
    memset(fp, 0, sizeof *fp);
}
