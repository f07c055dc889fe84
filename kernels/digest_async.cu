/* lockstep — the asynchronous digester (kernels/sha256.h).
 *
 * The engine asks for digests of a layer's rows several times per layer, and
 * each synchronous call costs a device round trip; hashing a 4 KB row on one
 * GPU thread costs ~100 us more (SHA-256 is serial within a message). Here a
 * call only enqueues work on the stream: the job table's upload, the encoding
 * of the canonical bytes on the device, and their download into pinned host
 * memory; host threads hash them with OpenSSL once the stream has passed an
 * event recorded after the download, while the device computes the next
 * layers. The digests are SHA-256 of the same canonical bytes as before.
 *
 * Memory: one ring of `cap` bytes on the device and one of the same size in
 * pinned host memory, at the same offsets. Each submitted chunk of jobs takes
 * a contiguous region (the stage layout of ls_cuda_digest_stage), appended at
 * the ring's head; regions are released in submission order once all their
 * jobs are hashed, so the ring is a FIFO of batches and never fragments. A
 * submit waits only when the ring is full (backpressure: the device runs
 * ahead of the host by at most the ring). */
#include "sha256.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"

#define LS_DG_MAX_THREADS 16
#define LS_DG_ALIGN 256
#define LS_DG_GRAB_BYTES (64u << 10) /* a worker takes jobs until this many bytes */

typedef struct ls_dg_batch {
    size_t at, bytes;            /* ring region */
    int n;                       /* jobs */
    int next;                    /* next job to hand out (n until staged) */
    int left;                    /* jobs not yet hashed */
    int ready;                   /* the stream has passed ev */
    int syncing;                 /* a worker waits on ev */
    cudaEvent_t ev;
    uint8_t **outs;              /* [n] host destinations, 32 bytes each */
    uint64_t *off, *len;         /* [n] encoded bytes at h_ring + at + off[i] */
    struct ls_dg_batch *nxt;     /* FIFO, oldest first */
} ls_dg_batch;

struct ls_cuda_digester {
    uint8_t *d_ring, *h_ring;    /* device / pinned host, cap bytes each */
    size_t cap;
    ls_dg_batch *first, *last;
    pthread_mutex_t mu;
    pthread_cond_t work;         /* a batch became ready or has jobs, or stop */
    pthread_cond_t freed;        /* a batch was released */
    pthread_t th[LS_DG_MAX_THREADS];
    int n_threads, stop, device;
    ls_cuda_host_sha256_fn fn;
    ls_status fail;              /* first failure since the last wait */
    char fail_msg[256];
};

static void dg_set_fail(ls_cuda_digester *d, ls_status st, const char *msg)
{
    if (d->fail != LS_OK) return;
    d->fail = st;
    snprintf(d->fail_msg, sizeof d->fail_msg, "%s", msg);
}

static void dg_batch_free(ls_dg_batch *b)
{
    if (b->ev) cudaEventDestroy(b->ev);
    free(b->outs);
    free(b->off);
    free(b->len);
    free(b);
}

/* Releases finished batches from the front of the FIFO. Holds mu. */
static void dg_retire(ls_cuda_digester *d)
{
    int any = 0;
    while (d->first && d->first->left == 0 && d->first->syncing == 0) {
        ls_dg_batch *b = d->first;
        d->first = b->nxt;
        if (!d->first) d->last = NULL;
        dg_batch_free(b);
        any = 1;
    }
    if (any) pthread_cond_broadcast(&d->freed);
}

static void *dg_worker(void *arg)
{
    ls_cuda_digester *d = (ls_cuda_digester *)arg;
    cudaSetDevice(d->device); /* events are waited on from this thread */
    pthread_mutex_lock(&d->mu);
    for (;;) {
        ls_dg_batch *b = d->first;
        while (b && b->next >= b->n) b = b->nxt;
        if (!b) {
            if (d->stop) break;
            pthread_cond_wait(&d->work, &d->mu);
            continue;
        }
        if (!b->ready) {
            if (b->syncing) { /* another worker waits for this batch's bytes */
                pthread_cond_wait(&d->work, &d->mu);
                continue;
            }
            b->syncing = 1;
            cudaEvent_t ev = b->ev;
            pthread_mutex_unlock(&d->mu);
            cudaError_t ce = cudaEventSynchronize(ev);
            pthread_mutex_lock(&d->mu);
            b->syncing = 0;
            if (ce == cudaSuccess) {
                b->ready = 1;
            } else {
                char msg[200];
                snprintf(msg, sizeof msg, "digest: the device failed before the digested bytes "
                         "were downloaded: %s (run compute-sanitizer)", cudaGetErrorString(ce));
                dg_set_fail(d, LS_E_DEVICE, msg);
                b->left -= b->n - b->next; /* nothing of this batch will be hashed */
                b->next = b->n;
                dg_retire(d);
            }
            pthread_cond_broadcast(&d->work);
            continue;
        }
        /* Take jobs up to LS_DG_GRAB_BYTES (at least one). */
        int i0 = b->next, i1 = i0;
        uint64_t bytes = 0;
        while (i1 < b->n && (i1 == i0 || bytes + b->len[i1] <= LS_DG_GRAB_BYTES)) bytes += b->len[i1++];
        b->next = i1;
        pthread_mutex_unlock(&d->mu);
        int bad = -1;
        for (int i = i0; i < i1; i++)
            if (d->fn(d->h_ring + b->at + b->off[i], (size_t)b->len[i], b->outs[i]) != 0 && bad < 0) bad = i;
        pthread_mutex_lock(&d->mu);
        if (bad >= 0) dg_set_fail(d, LS_E_CRYPTO, "digest: host SHA-256 of a staged job failed");
        b->left -= i1 - i0;
        dg_retire(d);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

extern "C" ls_status ls_cuda_digester_create(void *d_ring, size_t ring_bytes, int n_threads,
                                             ls_cuda_host_sha256_fn host_sha256, ls_cuda_digester **out,
                                             ls_error *err)
{
    *out = NULL;
    LS_CUDA_REQUIRE(d_ring && ring_bytes >= LS_DG_ALIGN && host_sha256, err,
                    "digester: ring of %zu bytes at %p, host hash %s", ring_bytes, d_ring,
                    host_sha256 ? "given" : "missing");
    ls_cuda_digester *d = (ls_cuda_digester *)calloc(1, sizeof *d);
    if (!d) return ls_fail(err, LS_E_NOMEM, "digester: out of memory");
    d->d_ring = (uint8_t *)d_ring;
    d->cap = ring_bytes / LS_DG_ALIGN * LS_DG_ALIGN;
    d->fn = host_sha256;
    d->n_threads = n_threads < 1 ? 1 : n_threads > LS_DG_MAX_THREADS ? LS_DG_MAX_THREADS : n_threads;
    cudaError_t ce = cudaGetDevice(&d->device);
    if (ce == cudaSuccess) ce = cudaHostAlloc((void **)&d->h_ring, d->cap, cudaHostAllocDefault);
    if (ce != cudaSuccess) {
        free(d);
        return ls_fail(err, LS_E_NOMEM, "digester: %zu bytes of pinned host memory: %s", ring_bytes,
                       cudaGetErrorString(ce));
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->work, NULL);
    pthread_cond_init(&d->freed, NULL);
    int started = 0;
    for (; started < d->n_threads; started++)
        if (pthread_create(&d->th[started], NULL, dg_worker, d) != 0) break;
    if (started == 0) {
        pthread_cond_destroy(&d->work);
        pthread_cond_destroy(&d->freed);
        pthread_mutex_destroy(&d->mu);
        cudaFreeHost(d->h_ring);
        free(d);
        return ls_fail(err, LS_E_DEVICE, "digester: no host thread could be started");
    }
    d->n_threads = started;
    *out = d;
    return LS_OK;
}

/* Offset of a free region of `need` bytes (a multiple of LS_DG_ALIGN), or
 * (size_t)-1 when the ring has none now. Holds mu. */
static size_t dg_place(const ls_cuda_digester *d, size_t need)
{
    if (!d->first) return need <= d->cap ? 0 : (size_t)-1;
    size_t tail = d->first->at, head = d->last->at + d->last->bytes;
    if (d->last->at >= d->first->at) { /* in use: [tail, head); free: [head, cap) and [0, tail) */
        if (d->cap - head >= need) return head;
        return tail >= need ? 0 : (size_t)-1;
    }
    /* wrapped, in use: [tail, ...) and [0, head); free: [head, tail) */
    return tail - head >= need ? head : (size_t)-1;
}

/* Stages jobs [0, n) as one batch (their stage fits half the ring). */
static ls_status dg_submit_chunk(ls_cuda_digester *d, const ls_cuda_digest_job *jobs, uint8_t *const *outs,
                                 int n, void *stream, ls_error *err)
{
    size_t need = ls_cuda_digest_stage_bytes(jobs, n);
    need = (need + LS_DG_ALIGN - 1) / LS_DG_ALIGN * LS_DG_ALIGN;
    ls_dg_batch *b = (ls_dg_batch *)calloc(1, sizeof *b);
    if (b) {
        b->outs = (uint8_t **)malloc(sizeof *b->outs * (size_t)n);
        b->off = (uint64_t *)malloc(sizeof *b->off * (size_t)n);
        b->len = (uint64_t *)malloc(sizeof *b->len * (size_t)n);
    }
    if (!b || !b->outs || !b->off || !b->len) {
        if (b) dg_batch_free(b);
        return ls_fail(err, LS_E_NOMEM, "digester: a batch of %d jobs", n);
    }
    cudaError_t ce = cudaEventCreateWithFlags(&b->ev, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        b->ev = NULL;
        dg_batch_free(b);
        return ls_fail(err, LS_E_DEVICE, "digester: cudaEventCreateWithFlags: %s", cudaGetErrorString(ce));
    }
    memcpy(b->outs, outs, sizeof *outs * (size_t)n);
    b->n = b->next = b->left = n;
    b->bytes = need;
    pthread_mutex_lock(&d->mu);
    size_t at;
    while ((at = dg_place(d, need)) == (size_t)-1) pthread_cond_wait(&d->freed, &d->mu);
    b->at = at;
    if (d->last) d->last->nxt = b;
    else d->first = b;
    d->last = b;
    pthread_mutex_unlock(&d->mu);
    /* The region is ours: the workers skip the batch until next < n. */
    ls_status st = ls_cuda_digest_stage(jobs, n, d->h_ring + at, d->d_ring + at, b->off, b->len, stream, err);
    if (st == LS_OK) {
        ce = cudaEventRecord(b->ev, (cudaStream_t)stream);
        if (ce != cudaSuccess)
            st = ls_fail(err, LS_E_DEVICE, "digester: event record: %s", cudaGetErrorString(ce));
    }
    pthread_mutex_lock(&d->mu);
    if (st == LS_OK) {
        b->next = 0;
    } else { /* nothing enqueued for it will be hashed; the region is released once the
              * stream is past whatever of the stage was enqueued */
        pthread_mutex_unlock(&d->mu);
        cudaStreamSynchronize((cudaStream_t)stream);
        pthread_mutex_lock(&d->mu);
        b->next = b->n;
        b->left = 0;
        dg_retire(d);
    }
    pthread_cond_broadcast(&d->work);
    pthread_mutex_unlock(&d->mu);
    return st;
}

extern "C" ls_status ls_cuda_digester_submit(ls_cuda_digester *d, const ls_cuda_digest_job *jobs,
                                             uint8_t *const *outs, int n_jobs, void *stream, ls_error *err)
{
    size_t half = d->cap / 2; /* a chunk of at most half the ring lets the next one stage meanwhile */
    for (int i = 0; i < n_jobs; i++)
        if (ls_cuda_digest_stage_bytes(&jobs[i], 1) + LS_DG_ALIGN > half)
            return ls_fail(err, LS_E_UNSUPPORTED, "digester: job %d needs %zu bytes of staging, more "
                           "than half the %zu-byte ring", i, ls_cuda_digest_stage_bytes(&jobs[i], 1), d->cap);
    for (int i0 = 0; i0 < n_jobs;) {
        int i1 = i0 + 1;
        size_t bytes = ls_cuda_digest_stage_job_bytes(&jobs[i0]);
        while (i1 < n_jobs) {
            size_t more = bytes + ls_cuda_digest_stage_job_bytes(&jobs[i1]);
            if (ls_cuda_digest_stage_table_bytes(i1 + 1 - i0) + more + LS_DG_ALIGN > half) break;
            bytes = more;
            i1++;
        }
        LS_TRY(dg_submit_chunk(d, jobs + i0, outs + i0, i1 - i0, stream, err));
        i0 = i1;
    }
    return LS_OK;
}

extern "C" ls_status ls_cuda_digester_wait(ls_cuda_digester *d, ls_error *err)
{
    pthread_mutex_lock(&d->mu);
    while (d->first) pthread_cond_wait(&d->freed, &d->mu);
    ls_status st = d->fail;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", d->fail_msg);
    d->fail = LS_OK;
    pthread_mutex_unlock(&d->mu);
    return st == LS_OK ? LS_OK : ls_fail(err, st, "%s", msg);
}

extern "C" void ls_cuda_digester_destroy(ls_cuda_digester *d)
{
    if (!d) return;
    ls_error ignored;
    ls_cuda_digester_wait(d, &ignored);
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_broadcast(&d->work);
    pthread_mutex_unlock(&d->mu);
    for (int i = 0; i < d->n_threads; i++) pthread_join(d->th[i], NULL);
    pthread_cond_destroy(&d->work);
    pthread_cond_destroy(&d->freed);
    pthread_mutex_destroy(&d->mu);
    cudaFreeHost(d->h_ring);
    free(d);
}
