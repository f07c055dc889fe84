/* lockstep — the asynchronous digester (kernels/sha256.h).
 *
 * The engine asks for digests of a layer's rows several times per layer (~83
 * calls in a batch-1 decode step), and each synchronous call costs a device
 * round trip; hashing a 4 KB row on one GPU thread costs ~100 us more
 * (SHA-256 is serial within a message). Here a call only enqueues the
 * encoding of the canonical bytes on the device; their download into pinned
 * host memory is shared by several calls, and host threads hash them with
 * OpenSSL once the stream has passed an event recorded after the download,
 * while the device computes the next layers. The digests are SHA-256 of the
 * same canonical bytes as before.
 *
 * The downloads run on a copy stream of the digester's own, after an event
 * the flush records on the submitting stream: a group's bytes come to the
 * host while that stream computes on (the lm_head's logits rows, 600 KB
 * each, would otherwise hold the step up for the whole copy).
 *
 * What a submit costs (one chunk, the usual case): a kernel launch per 32
 * jobs, the job table passed by value (a read of host memory by the kernel
 * would queue behind the downloads under way), no copy, no event
 * created (a pool, one per batch slot), no heap allocation (slots are
 * preallocated), one lock of mu and no wake-up. Every LS_DG_GROUP_MAX submits
 * at most, or sooner (below), one download and one event record serve the
 * whole group, and a worker waits on that one event.
 *
 * Memory: one ring of `cap` bytes on the device and one of the same size in
 * pinned host memory, at the same offsets, holding encoded bytes only. Each
 * submitted chunk of jobs (a batch) takes a contiguous region of
 * ls_cuda_digest_stage_bytes (16-aligned) appended at the ring's head;
 * regions are released in submission order once all their jobs are hashed,
 * so the ring is a FIFO of batches and never fragments. head and tail count
 * bytes since creation (they only grow), so used = head - tail and a region
 * that would cross the ring's end starts at offset 0, the bytes skipped
 * belonging to it. A batch also takes a slot (LS_DG_SLOTS, used in the same
 * FIFO order): its outs, offsets, lengths and one event.
 *
 * Coalescing: batches staged one after the other into adjacent regions form
 * the open group; they are not yet visible to the workers (next == n). A
 * flush enqueues one download of the group's bytes and records the event of
 * its last slot, then hands the group to the workers. Every byte of a group
 * is written by its encode kernels (jobs are padded to 16 with zeros and
 * regions are adjacent), so the one copy reads no byte nothing wrote. A
 * group is flushed by ls_cuda_digester_wait, after a batch with a part of a
 * running hash (its later parts are still being computed: its hashing
 * should start now), before a submit waits for room
 * (else it could wait on batches only the flush releases), when the next
 * region is not adjacent (the ring wrapped) or is for another stream, and
 * when it has LS_DG_GROUP_MAX batches, LS_DG_GROUP_BYTES bytes, or the ring
 * is more than half full. submit and wait are called from one thread (the
 * one that owns the streams); only that thread touches the open group.
 *
 * Parts: a job that continues a running hash (sha256.h, part) is handed
 * out alone. The worker that takes it owns the hash until it has no part of
 * it left to hash; a later part handed out meanwhile joins the owner's queue
 * (runs), so one thread hashes a run of parts without a hand-over, and no
 * worker waits behind a part. Jobs are handed out in submission order, so a
 * hash's parts are hashed in order.
 *
 * Staged batches (ls_cuda_digester_submit_staged): jobs a step graph
 * already encoded into its own device memory take a slot and no ring
 * region; their bytes are downloaded into the graph's pinned memory on the
 * copy stream after the graph (off the submitting stream, which goes on at
 * once), the slot's event recorded after that, and the batch is handed out
 * at once, hashed and retired in order with the rest.
 *
 * Reuse: a slot and its region are rewritten only after the batch in it
 * is retired, that is after the stream passed its group's event (recorded
 * after the encode kernels and the download of the region) and the workers
 * hashed its bytes, or after a failure path synchronised the stream. A
 * group's event belongs to its last slot, which retires after every other
 * batch of the group, so the event is not recorded again while anyone may
 * still wait on it. */
#include "sha256.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"

#define LS_DG_MAX_THREADS 16
#define LS_DG_ALIGN 16                 /* region alignment: the encoded jobs' */
#define LS_DG_GRAB_BYTES (64u << 10)   /* a worker takes jobs until this many bytes */
#define LS_DG_SLOTS 128                /* batches in flight at most */
#define LS_DG_SLOT_JOBS 256            /* jobs per batch at most (a call is chunked) */
#define LS_DG_GROUP_MAX 32             /* batches per download at most */
#define LS_DG_GROUP_BYTES ((size_t)256 << 10) /* a group this large is downloaded at once, so
                                                  the hashing left after a wait stays short */

#define LS_DG_QUEUE 32                 /* parts queued to a hash's owner at most */

typedef struct ls_dg_batch ls_dg_batch;

/* A running hash a worker hashes a part of now (part NULL: entry free), and
 * its later parts handed out meanwhile, queued to that worker in order. */
typedef struct ls_dg_run {
    void *part;
    int n;
    struct { ls_dg_batch *b; int i; } q[LS_DG_QUEUE];
} ls_dg_run;

struct ls_dg_batch {
    uint64_t vat, vend;          /* ring region in bytes since creation: [vat, vend) holds the
                                    encoded bytes at offset vat % cap; vend - vat = the
                                    stage's bytes (a region that crosses the end starts at 0:
                                    vat is then the next multiple of cap) */
    size_t at;                   /* vat % cap */
    const uint8_t *base;         /* host bytes of job i: base + off[i] (h_ring + at; a staged
                                    batch's: the caller's pinned memory, no ring region) */
    int n;                       /* jobs */
    int next;                    /* next job to hand out (n until its group is flushed) */
    int left;                    /* jobs not yet hashed */
    int ready;                   /* the stream has passed ev */
    int syncing;                 /* a worker waits on ev */
    cudaEvent_t ev;              /* its group's event (the group's last slot's own) */
    cudaEvent_t own;             /* this slot's event, created once */
    uint8_t **outs;              /* [LS_DG_SLOT_JOBS] host destinations, 32 bytes each (NULL: a
                                    part that does not end its hash) */
    void **parts;                /* [LS_DG_SLOT_JOBS] the jobs' running hashes (NULL: whole) */
    uint8_t *first;              /* [LS_DG_SLOT_JOBS] the part starts its hash */
    uint64_t *off, *len;         /* [LS_DG_SLOT_JOBS] encoded bytes at h_ring + at + off[i] */
};

struct ls_cuda_digester {
    uint8_t *d_ring, *h_ring;    /* device / pinned host, cap bytes each */
    size_t cap;
    uint64_t head, tail;         /* bytes since creation: appended / released */
    uint64_t placed, retired;    /* batches since creation: placed in the ring / released
                                    (FIFO: batch i is retired once retired > i) */
    ls_dg_batch slot[LS_DG_SLOTS];
    int first, n_used;           /* in use: slot[(first + k) % LS_DG_SLOTS], k < n_used, oldest first */
    /* the open group: slot[(open_slot + i) % LS_DG_SLOTS], i < n_open (the submitting
     * thread's alone) */
    int open_slot, n_open;
    size_t open_at, open_bytes;  /* its region: [open_at, open_at + open_bytes) */
    void *open_stream;
    cudaStream_t copy;           /* the downloads' stream */
    cudaEvent_t staged;          /* recorded on the open stream at a flush: the group is encoded */
    uint64_t *h_meta;            /* every slot's off and len */
    uint8_t **h_outs;            /* every slot's outs */
    void **h_parts;              /* every slot's parts */
    uint8_t *h_first;            /* every slot's first */
    ls_dg_run runs[LS_DG_MAX_THREADS]; /* the running hashes workers hash parts of now */
    int queue_waiters;           /* workers waiting for room in a run's queue */
    pthread_mutex_t mu;
    pthread_cond_t work;         /* a group was handed out or became ready, or stop */
    pthread_cond_t freed;        /* a batch was released */
    pthread_t th[LS_DG_MAX_THREADS];
    int n_threads, stop, device;
    ls_cuda_host_sha256_fn fn;
    ls_status fail;              /* first failure since the last wait */
    char fail_msg[256];
};

static ls_dg_batch *dg_at(ls_cuda_digester *d, int k) { return &d->slot[(d->first + k) % LS_DG_SLOTS]; }

static void dg_set_fail(ls_cuda_digester *d, ls_status st, const char *msg)
{
    if (d->fail != LS_OK) return;
    d->fail = st;
    snprintf(d->fail_msg, sizeof d->fail_msg, "%s", msg);
}

/* Releases finished batches from the front of the FIFO. Holds mu. */
static void dg_retire(ls_cuda_digester *d)
{
    int any = 0;
    while (d->n_used > 0 && d->slot[d->first].left == 0 && d->slot[d->first].syncing == 0) {
        d->tail = d->slot[d->first].vend;
        d->first = (d->first + 1) % LS_DG_SLOTS;
        d->n_used--;
        d->retired++;
        any = 1;
    }
    if (any) pthread_cond_broadcast(&d->freed);
}

/* Marks b's group (b and the batches after it that share its event) ready,
 * or, when the stream failed before the event, done with nothing hashed.
 * Holds mu. */
static void dg_group_passed(ls_cuda_digester *d, const ls_dg_batch *b, int ok)
{
    int k = 0;
    while (dg_at(d, k) != b) k++; /* b cannot have retired: its jobs are not handed out */
    for (cudaEvent_t ev = b->ev; k < d->n_used && dg_at(d, k)->ev == ev; k++) {
        ls_dg_batch *g = dg_at(d, k);
        if (ok) {
            g->ready = 1;
        } else if (!g->ready) {
            g->left -= g->n - g->next; /* nothing of this batch will be hashed */
            g->next = g->n;
        }
    }
}

static void *dg_worker(void *arg)
{
    ls_cuda_digester *d = (ls_cuda_digester *)arg;
    cudaSetDevice(d->device); /* events are waited on from this thread */
    pthread_mutex_lock(&d->mu);
    for (;;) {
        int k = 0;
        while (k < d->n_used && dg_at(d, k)->next >= dg_at(d, k)->n) k++;
        if (k == d->n_used) {
            if (d->stop) break;
            pthread_cond_wait(&d->work, &d->mu);
            continue;
        }
        ls_dg_batch *b = dg_at(d, k);
        if (!b->ready) {
            if (b->syncing) { /* another worker waits for this group's bytes */
                pthread_cond_wait(&d->work, &d->mu);
                continue;
            }
            b->syncing = 1; /* b cannot retire meanwhile, nor can its group's last slot */
            cudaEvent_t ev = b->ev;
            pthread_mutex_unlock(&d->mu);
            cudaError_t ce = cudaEventSynchronize(ev);
            pthread_mutex_lock(&d->mu);
            b->syncing = 0;
            dg_group_passed(d, b, ce == cudaSuccess);
            if (ce != cudaSuccess) {
                char msg[200];
                snprintf(msg, sizeof msg, "digest: the device failed before the digested bytes "
                         "were downloaded: %s (run compute-sanitizer)", cudaGetErrorString(ce));
                dg_set_fail(d, LS_E_DEVICE, msg);
                dg_retire(d);
            }
            pthread_cond_broadcast(&d->work);
            continue;
        }
        /* A part of a hash another worker hashes now is queued to that
         * worker (handed out in order, so the queue keeps the parts' order);
         * else take whole jobs up to LS_DG_GRAB_BYTES (at least one), or the
         * part alone, which makes this worker its hash's owner. */
        int i0 = b->next, i1 = i0 + 1;
        void *part = b->parts[i0];
        ls_dg_run *run = NULL;
        if (part) {
            for (int w = 0; w < LS_DG_MAX_THREADS && !run; w++)
                if (d->runs[w].part == part) run = &d->runs[w];
            if (run && run->n == LS_DG_QUEUE) { /* its owner is far behind: wait */
                d->queue_waiters++;
                pthread_cond_wait(&d->work, &d->mu);
                d->queue_waiters--;
                continue;
            }
            if (run) {
                run->q[run->n].b = b, run->q[run->n].i = i0, run->n++;
                b->next = i1;
                continue;
            }
            for (int w = 0; !run; w++) /* one entry per worker: there is a free one */
                if (!d->runs[w].part) run = &d->runs[w];
            run->part = part;
            run->n = 0;
        } else {
            uint64_t bytes = b->len[i0];
            while (i1 < b->n && !b->parts[i1] && bytes + b->len[i1] <= LS_DG_GRAB_BYTES) bytes += b->len[i1++];
        }
        b->next = i1;
        /* Hash them, then the parts queued behind, in order. */
        for (;;) {
            pthread_mutex_unlock(&d->mu);
            int bad = 0;
            for (int i = i0; i < i1; i++)
                bad |= d->fn(b->parts[i], b->first[i], b->base + b->off[i], (size_t)b->len[i], b->outs[i]);
            pthread_mutex_lock(&d->mu);
            if (bad) dg_set_fail(d, LS_E_CRYPTO, "digest: host SHA-256 of a staged job failed");
            b->left -= i1 - i0;
            if (!run || run->n == 0) break;
            b = run->q[0].b, i0 = run->q[0].i, i1 = i0 + 1;
            run->n--;
            memmove(run->q, run->q + 1, sizeof run->q[0] * (size_t)run->n);
        }
        if (run) {
            run->part = NULL;
            if (d->queue_waiters) pthread_cond_broadcast(&d->work);
        }
        dg_retire(d);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

static void dg_free(ls_cuda_digester *d)
{
    for (int s = 0; s < LS_DG_SLOTS; s++)
        if (d->slot[s].own) cudaEventDestroy(d->slot[s].own);
    if (d->staged) cudaEventDestroy(d->staged);
    if (d->copy) cudaStreamDestroy(d->copy);
    if (d->h_ring) cudaFreeHost(d->h_ring);
    free(d->h_meta);
    free(d->h_outs);
    free(d->h_parts);
    free(d->h_first);
    free(d);
}

extern "C" ls_status ls_cuda_digester_create(void *d_ring, size_t ring_bytes, int n_threads,
                                             ls_cuda_host_sha256_fn host_sha256, ls_cuda_digester **out,
                                             ls_error *err)
{
    *out = NULL;
    LS_CUDA_REQUIRE(d_ring && ring_bytes >= 256 && host_sha256, err,
                    "digester: ring of %zu bytes at %p, host hash %s", ring_bytes, d_ring,
                    host_sha256 ? "given" : "missing");
    ls_cuda_digester *d = (ls_cuda_digester *)calloc(1, sizeof *d);
    if (!d) return ls_fail(err, LS_E_NOMEM, "digester: out of memory");
    d->d_ring = (uint8_t *)d_ring;
    d->cap = ring_bytes / LS_DG_ALIGN * LS_DG_ALIGN;
    d->fn = host_sha256;
    d->n_threads = n_threads < 1 ? 1 : n_threads > LS_DG_MAX_THREADS ? LS_DG_MAX_THREADS : n_threads;
    d->h_meta = (uint64_t *)malloc(sizeof *d->h_meta * 2 * LS_DG_SLOTS * LS_DG_SLOT_JOBS);
    d->h_outs = (uint8_t **)malloc(sizeof *d->h_outs * LS_DG_SLOTS * LS_DG_SLOT_JOBS);
    d->h_parts = (void **)malloc(sizeof *d->h_parts * LS_DG_SLOTS * LS_DG_SLOT_JOBS);
    d->h_first = (uint8_t *)malloc(LS_DG_SLOTS * LS_DG_SLOT_JOBS);
    if (!d->h_meta || !d->h_outs || !d->h_parts || !d->h_first) {
        dg_free(d);
        return ls_fail(err, LS_E_NOMEM, "digester: out of memory");
    }
    cudaError_t ce = cudaGetDevice(&d->device);
    if (ce == cudaSuccess) ce = cudaHostAlloc((void **)&d->h_ring, d->cap, cudaHostAllocDefault);
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&d->copy, cudaStreamNonBlocking);
    if (ce != cudaSuccess) d->copy = NULL;
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&d->staged, cudaEventDisableTiming);
    if (ce != cudaSuccess) d->staged = NULL;
    for (int s = 0; ce == cudaSuccess && s < LS_DG_SLOTS; s++) {
        ls_dg_batch *b = &d->slot[s];
        ce = cudaEventCreateWithFlags(&b->own, cudaEventDisableTiming);
        if (ce != cudaSuccess) b->own = NULL;
        b->outs = d->h_outs + (size_t)LS_DG_SLOT_JOBS * (size_t)s;
        b->parts = d->h_parts + (size_t)LS_DG_SLOT_JOBS * (size_t)s;
        b->first = d->h_first + (size_t)LS_DG_SLOT_JOBS * (size_t)s;
        b->off = d->h_meta + (size_t)2 * LS_DG_SLOT_JOBS * (size_t)s;
        b->len = b->off + LS_DG_SLOT_JOBS;
    }
    if (ce != cudaSuccess) {
        dg_free(d);
        return ls_fail(err, LS_E_NOMEM, "digester: %zu bytes of pinned host memory, a stream and %d events: %s",
                       ring_bytes, LS_DG_SLOTS + 1, cudaGetErrorString(ce));
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
        dg_free(d);
        return ls_fail(err, LS_E_DEVICE, "digester: no host thread could be started");
    }
    d->n_threads = started;
    *out = d;
    return LS_OK;
}

/* Hands the open group to the workers: one download of its bytes on the
 * copy stream, after its stream's encodes, and the event of its last slot,
 * recorded after the download. On failure the group is dropped (recorded for
 * the next wait). Called without mu by the submitting thread; the workers
 * ignore the open batches (next == n) and cannot retire them (left == n). */
/* On the copy stream, after the work enqueued on `stream` so far: the
 * download of bytes from src into dst, then ev recorded. On failure both
 * streams are synchronised, so nothing enqueued still uses the memory. */
static cudaError_t dg_download(ls_cuda_digester *d, void *stream, uint8_t *dst, const uint8_t *src, size_t bytes,
                               cudaEvent_t ev)
{
    cudaError_t ce = cudaEventRecord(d->staged, (cudaStream_t)stream);
    if (ce == cudaSuccess) ce = cudaStreamWaitEvent(d->copy, d->staged, 0);
    if (ce == cudaSuccess && bytes) ce = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, d->copy);
    if (ce == cudaSuccess) ce = cudaEventRecord(ev, d->copy);
    if (ce != cudaSuccess) {
        cudaStreamSynchronize((cudaStream_t)stream);
        cudaStreamSynchronize(d->copy);
    }
    return ce;
}

static void dg_flush(ls_cuda_digester *d)
{
    if (d->n_open == 0) return;
    cudaEvent_t ev = d->slot[(d->open_slot + d->n_open - 1) % LS_DG_SLOTS].own;
    cudaError_t ce = dg_download(d, d->open_stream, d->h_ring + d->open_at, d->d_ring + d->open_at,
                                 d->open_bytes, ev);
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < d->n_open; i++) {
        ls_dg_batch *b = &d->slot[(d->open_slot + i) % LS_DG_SLOTS];
        if (ce == cudaSuccess) {
            b->ev = ev;
            b->next = 0;
        } else { /* nothing of the group will be hashed */
            b->next = b->n;
            b->left = 0;
        }
    }
    if (ce != cudaSuccess) {
        char msg[200];
        snprintf(msg, sizeof msg, "digest: the download of %zu staged bytes failed: %s", d->open_bytes,
                 cudaGetErrorString(ce));
        dg_set_fail(d, LS_E_DEVICE, msg);
        dg_retire(d);
    }
    pthread_cond_broadcast(&d->work);
    pthread_mutex_unlock(&d->mu);
    d->n_open = 0;
    d->open_bytes = 0;
}

/* Room for a region of `need` bytes: its start in bytes since creation, or
 * UINT64_MAX when the ring has none now. Holds mu. */
static uint64_t dg_place(const ls_cuda_digester *d, size_t need)
{
    size_t pos = (size_t)(d->head % d->cap);
    uint64_t vat = pos + need > d->cap ? d->head + (d->cap - pos) : d->head; /* no region crosses the end */
    return vat + need - d->tail <= d->cap ? vat : UINT64_MAX;
}

/* Stages jobs [0, n) as one batch (at most LS_DG_SLOT_JOBS jobs, whose bytes
 * fit half the ring). */
static ls_status dg_submit_chunk(ls_cuda_digester *d, const ls_cuda_digest_job *jobs, uint8_t *const *outs,
                                 int n, void *stream, ls_error *err)
{
    size_t need = ls_cuda_digest_stage_bytes(jobs, n); /* a multiple of LS_DG_ALIGN */
    pthread_mutex_lock(&d->mu);
    uint64_t vat = dg_place(d, need);
    /* The open group joins the ring only after a flush: flush it before the
     * new region unless the region extends it on the same stream. */
    int extends = vat != UINT64_MAX && d->n_used < LS_DG_SLOTS &&
                  (size_t)(vat % d->cap) == d->open_at + d->open_bytes && stream == d->open_stream;
    if (d->n_open > 0 && !extends) {
        pthread_mutex_unlock(&d->mu);
        dg_flush(d);
        pthread_mutex_lock(&d->mu);
    }
    while (d->n_used == LS_DG_SLOTS || (vat = dg_place(d, need)) == UINT64_MAX)
        pthread_cond_wait(&d->freed, &d->mu);
    ls_dg_batch *b = dg_at(d, d->n_used);
    b->vat = vat;
    b->vend = vat + need;
    b->at = (size_t)(vat % d->cap);
    b->base = d->h_ring + b->at;
    b->n = b->next = b->left = n;
    b->ready = 0;
    b->syncing = 0;
    b->ev = NULL;
    d->head = b->vend;
    d->n_used++;
    d->placed++;
    int half_full = d->head - d->tail > d->cap / 2;
    pthread_mutex_unlock(&d->mu);
    /* The slot and the region are ours: the workers skip the batch while next == n. */
    memcpy(b->outs, outs, sizeof *outs * (size_t)n);
    for (int i = 0; i < n; i++) {
        b->parts[i] = jobs[i].part;
        b->first[i] = jobs[i].first;
    }
    ls_status st = ls_cuda_digest_stage(jobs, n, d->d_ring + b->at, b->off, b->len,
                                        stream, err);
    if (st != LS_OK) { /* the earlier group keeps its bytes; this batch is dropped once the
                        * stream is past whatever of it was enqueued */
        dg_flush(d);
        cudaStreamSynchronize((cudaStream_t)stream);
        pthread_mutex_lock(&d->mu);
        b->next = b->n;
        b->left = 0;
        dg_retire(d);
        pthread_mutex_unlock(&d->mu);
        return st;
    }
    if (d->n_open == 0) {
        d->open_slot = (int)(b - d->slot);
        d->open_at = b->at;
        d->open_stream = stream;
    }
    d->n_open++;
    d->open_bytes += need;
    int parts = 0; /* a part's hash has later parts still being computed: start it now */
    for (int i = 0; i < n && !parts; i++) parts = jobs[i].part != NULL;
    if (d->n_open == LS_DG_GROUP_MAX || d->open_bytes >= LS_DG_GROUP_BYTES || half_full || parts) dg_flush(d);
    return LS_OK;
}

extern "C" ls_status ls_cuda_digester_submit(ls_cuda_digester *d, const ls_cuda_digest_job *jobs,
                                             uint8_t *const *outs, int n_jobs, void *stream, ls_error *err)
{
    size_t half = d->cap / 2; /* a chunk of at most half the ring lets the next one stage meanwhile */
    for (int i = 0; i < n_jobs; i++)
        if (ls_cuda_digest_stage_job_bytes(&jobs[i]) > half)
            return ls_fail(err, LS_E_UNSUPPORTED, "digester: job %d needs %zu bytes of staging, more "
                           "than half the %zu-byte ring", i, ls_cuda_digest_stage_job_bytes(&jobs[i]), d->cap);
    for (int i0 = 0; i0 < n_jobs;) {
        int i1 = i0 + 1;
        size_t bytes = ls_cuda_digest_stage_job_bytes(&jobs[i0]);
        while (i1 < n_jobs && i1 - i0 < LS_DG_SLOT_JOBS) {
            size_t more = bytes + ls_cuda_digest_stage_job_bytes(&jobs[i1]);
            if (more > half) break;
            bytes = more;
            i1++;
        }
        LS_TRY(dg_submit_chunk(d, jobs + i0, outs + i0, i1 - i0, stream, err));
        i0 = i1;
    }
    return LS_OK;
}

/* A batch of jobs already encoded into device memory by work enqueued on
 * stream before this call (a step graph's staging), downloaded to h_bytes
 * by the first chunk (bytes > 0): no ring region, the slot's own event
 * recorded after the download on the copy stream, handed out at once. */
static ls_status dg_staged_chunk(ls_cuda_digester *d, const uint8_t *d_bytes, uint8_t *h_bytes, size_t bytes,
                                 const uint64_t *off, const uint64_t *len, uint8_t *const *outs, int n,
                                 void *stream, ls_error *err)
{
    dg_flush(d); /* batches are handed out and retired in submission order */
    pthread_mutex_lock(&d->mu);
    while (d->n_used == LS_DG_SLOTS) pthread_cond_wait(&d->freed, &d->mu);
    ls_dg_batch *b = dg_at(d, d->n_used);
    b->vat = b->vend = d->head;
    b->at = 0;
    b->base = h_bytes;
    b->n = b->next = b->left = n;
    b->ready = 0;
    b->syncing = 0;
    b->ev = NULL;
    d->n_used++;
    d->placed++;
    pthread_mutex_unlock(&d->mu);
    memcpy(b->outs, outs, sizeof *outs * (size_t)n);
    memcpy(b->off, off, sizeof *off * (size_t)n);
    memcpy(b->len, len, sizeof *len * (size_t)n);
    memset(b->parts, 0, sizeof *b->parts * (size_t)n);
    memset(b->first, 0, (size_t)n);
    cudaError_t ce = dg_download(d, stream, h_bytes, d_bytes, bytes, b->own);
    pthread_mutex_lock(&d->mu);
    if (ce == cudaSuccess) {
        b->ev = b->own;
        b->next = 0;
    } else {
        b->next = b->n;
        b->left = 0;
        dg_retire(d);
    }
    pthread_cond_broadcast(&d->work);
    pthread_mutex_unlock(&d->mu);
    if (ce != cudaSuccess)
        return ls_fail(err, LS_E_DEVICE, "digest: the download of %d staged jobs (%zu bytes): %s", n, bytes,
                       cudaGetErrorString(ce));
    return LS_OK;
}

extern "C" ls_status ls_cuda_digester_submit_staged(ls_cuda_digester *d, const uint8_t *d_bytes,
                                                    uint8_t *h_bytes, size_t bytes, const uint64_t *off,
                                                    const uint64_t *len, uint8_t *const *outs, int n_jobs,
                                                    void *stream, ls_error *err)
{
    for (int i0 = 0; i0 < n_jobs; i0 += LS_DG_SLOT_JOBS) {
        int n = n_jobs - i0 < LS_DG_SLOT_JOBS ? n_jobs - i0 : LS_DG_SLOT_JOBS;
        LS_TRY(dg_staged_chunk(d, d_bytes, h_bytes, i0 == 0 ? bytes : 0, off + i0, len + i0, outs + i0, n,
                               stream, err));
    }
    return LS_OK;
}

extern "C" uint64_t ls_cuda_digester_mark(const ls_cuda_digester *d)
{
    return d->placed; /* changed by the submitting thread alone */
}

extern "C" ls_status ls_cuda_digester_wait_for(ls_cuda_digester *d, uint64_t mark, ls_error *err)
{
    dg_flush(d);
    pthread_mutex_lock(&d->mu);
    while (d->n_used > 0 && d->retired < mark) pthread_cond_wait(&d->freed, &d->mu);
    ls_status st = d->fail;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", d->fail_msg);
    d->fail = LS_OK;
    pthread_mutex_unlock(&d->mu);
    return st == LS_OK ? LS_OK : ls_fail(err, st, "%s", msg);
}

extern "C" ls_status ls_cuda_digester_wait(ls_cuda_digester *d, ls_error *err)
{
    return ls_cuda_digester_wait_for(d, UINT64_MAX, err);
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
    dg_free(d);
}
