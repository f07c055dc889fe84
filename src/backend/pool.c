/* lockstep — persistent thread pool; see pool.h. */
#include "backend/pool.h"

#include <pthread.h>
#include <stdlib.h>

#include "core/thread.h"

struct ls_pool {
    int n;                       /* threads including the caller */
    pthread_t *tids;             /* [n - 1] workers */
    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    unsigned long gen;           /* incremented for every job */
    int pending;                 /* workers still running the current job */
    int stop;
    ls_pool_fn fn;               /* current job */
    void *ctx;
    long items;
};

typedef struct worker_arg {
    ls_pool *p;
    int index;
} worker_arg;

static void run_share(ls_pool *p, int t)
{
    long per = p->items / p->n, rem = p->items % p->n;
    long b = t * per + (t < rem ? t : rem);
    long e = b + per + (t < rem ? 1 : 0);
    if (b < e) p->fn(p->ctx, t, b, e);
}

static void *worker_main(void *arg)
{
    worker_arg *wa = arg;
    ls_pool *p = wa->p;
    int t = wa->index;
    free(wa);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->cv_go, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_share(p, t);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ls_status ls_pool_create(int n_threads, ls_pool **out, ls_error *err)
{
    if (n_threads < 1 || n_threads > 256)
        return ls_fail(err, LS_E_USAGE, "threads: %d is outside 1..256", n_threads);
    ls_pool *p = calloc(1, sizeof *p);
    if (!p) return ls_fail(err, LS_E_NOMEM, "thread pool: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_go, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->tids = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->tids) {
        ls_pool_destroy(p);
        return ls_fail(err, LS_E_NOMEM, "thread pool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->p = p;
            wa->index = i;
        }
        if (!wa || ls_thread_start(&p->tids[i - 1], worker_main, wa) != 0) {
            free(wa);
            p->n = i; /* only i-1 workers exist */
            ls_pool_destroy(p);
            return ls_fail(err, LS_E_INTERNAL, "thread pool: cannot start thread %d", i);
        }
    }
    *out = p;
    return LS_OK;
}

int ls_pool_threads(const ls_pool *p)
{
    return p->n;
}

void ls_pool_run(ls_pool *p, long n, ls_pool_fn fn, void *ctx)
{
    if (p->n == 1 || n <= 1) {
        if (n > 0) fn(ctx, 0, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->items = n;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_go);
    pthread_mutex_unlock(&p->mu);
    run_share(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void ls_pool_destroy(ls_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->tids[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_go);
    pthread_cond_destroy(&p->cv_done);
    free(p->tids);
    free(p);
}
