/* In-memory engine records and their bitwise comparison (header-only; shared
 * by tests/gpu/test_engine_cuda and harness/gpu_matrix).
 *
 * A record set holds every record an engine run emitted, with its digests
 * copied (dumps and raw bytes are not kept); recs_diff compares two sets record by record, matched by (seq,
 * pos): token, next token, logprob bits, top-5 ids and logprob bits, and every
 * digest (layer, kind, 32 bytes). */
#ifndef LS_TESTS_GPU_ENGINE_RECORDS_H
#define LS_TESTS_GPU_ENGINE_RECORDS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "run/drive.h"

typedef struct recs_item {
    ls_trace_record r;                 /* r.digests points at d */
    ls_trace_digest *d;                /* [r.n_digests], owned */
} recs_item;

typedef struct recs {
    recs_item *v;
    long n, cap;
} recs;

static inline void recs_free(recs *t)
{
    for (long i = 0; i < t->n; i++) free(t->v[i].d);
    free(t->v);
    memset(t, 0, sizeof *t);
}

static inline ls_status recs_add(recs *t, const ls_trace_record *r, ls_error *err)
{
    if (t->n == t->cap) {
        long cap = t->cap ? 2 * t->cap : 256;
        recs_item *v = realloc(t->v, sizeof *v * (size_t)cap);
        if (!v) return ls_fail(err, LS_E_NOMEM, "records");
        t->v = v;
        t->cap = cap;
    }
    recs_item *m = &t->v[t->n];
    m->r = *r;
    m->r.dumps = NULL;
    m->r.n_dumps = 0;
    m->r.raw = NULL;
    m->d = malloc(sizeof(ls_trace_digest) * (r->n_digests ? r->n_digests : 1));
    if (!m->d) return ls_fail(err, LS_E_NOMEM, "records");
    memcpy(m->d, r->digests, sizeof(ls_trace_digest) * r->n_digests);
    m->r.digests = m->d;
    t->n++;
    return LS_OK;
}

/* An ls_run_sink collecting into a recs. */
static inline ls_status recs_sink(void *ctx, ls_frame_kind kind, const ls_trace_record *recs_, long n,
                                  ls_error *err)
{
    (void)kind;
    for (long i = 0; i < n; i++) LS_TRY(recs_add((recs *)ctx, &recs_[i], err));
    return LS_OK;
}

static inline int recs_cmp_key(const void *a, const void *b)
{
    const recs_item *x = a, *y = b;
    if (x->r.seq != y->r.seq) return x->r.seq < y->r.seq ? -1 : 1;
    if (x->r.pos != y->r.pos) return x->r.pos < y->r.pos ? -1 : 1;
    return 0;
}

/* Sorts by (seq, pos) so sets from different batchings line up. */
static inline void recs_sort(recs *t)
{
    if (t->n > 1) qsort(t->v, (size_t)t->n, sizeof *t->v, recs_cmp_key);
}

/* 0 when a and b (both sorted) are equal bit for bit; else 1 and msg names
 * the first difference (seq, pos, field or layer/kind). Only the records of
 * b whose seq is in `a` are compared when subset is 1 (a = one sequence run
 * alone, b = a batch holding it). */
static inline int recs_diff(const recs *a, const recs *b, int subset, char *msg, size_t msz)
{
    long j = 0;
    long matched = 0;
    for (long i = 0; i < a->n; i++) {
        const ls_trace_record *x = &a->v[i].r;
        while (j < b->n && recs_cmp_key(&b->v[j], &a->v[i]) < 0) {
            if (!subset) {
                snprintf(msg, msz, "seq %u pos %u only in the second run", b->v[j].r.seq, b->v[j].r.pos);
                return 1;
            }
            j++;
        }
        if (j == b->n || recs_cmp_key(&b->v[j], &a->v[i]) != 0) {
            snprintf(msg, msz, "seq %u pos %u only in the first run", x->seq, x->pos);
            return 1;
        }
        const ls_trace_record *y = &b->v[j].r;
        const char *f = NULL;
        if (x->token != y->token) f = "token";
        else if (x->next_token != y->next_token) f = "next_token";
        else if (x->logprob_bits != y->logprob_bits) f = "logprob bits";
        else if (memcmp(x->topk_ids, y->topk_ids, sizeof x->topk_ids)) f = "top-k ids";
        else if (memcmp(x->topk_logprob_bits, y->topk_logprob_bits, sizeof x->topk_logprob_bits))
            f = "top-k logprob bits";
        else if (x->n_digests != y->n_digests) f = "digest count";
        if (f) {
            snprintf(msg, msz, "seq %u pos %u: %s differs (logprob 0x%08x vs 0x%08x, next %d vs %d, "
                     "digests %u vs %u)", x->seq, x->pos, f, x->logprob_bits, y->logprob_bits,
                     x->next_token, y->next_token, x->n_digests, y->n_digests);
            return 1;
        }
        for (uint32_t k = 0; k < x->n_digests; k++) {
            const ls_trace_digest *p = &a->v[i].d[k], *q = &b->v[j].d[k];
            if (p->layer != q->layer || p->kind != q->kind || memcmp(p->digest.bytes, q->digest.bytes, 32)) {
                snprintf(msg, msz, "seq %u pos %u: digest %u (layer %u kind %u vs layer %u kind %u) differs",
                         x->seq, x->pos, k, p->layer, p->kind, q->layer, q->kind);
                return 1;
            }
        }
        matched++;
        j++;
    }
    if (!subset && j != b->n) {
        snprintf(msg, msz, "seq %u pos %u only in the second run", b->v[j].r.seq, b->v[j].r.pos);
        return 1;
    }
    snprintf(msg, msz, "%ld records equal", matched);
    return 0;
}

#endif
