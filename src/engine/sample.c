/* lockstep — greedy and seeded token selection; see sample.h. */
#include "engine/sample.h"

#include <stdlib.h>

#include "numerics/lsmath.h"

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float ls_sample_uniform(uint64_t seed, uint32_t seq, uint32_t pos)
{
    uint64_t x = mix(seed ^ 0x6c6f636b73746570ull);
    x = mix(x ^ seq);
    x = mix(x ^ pos);
    return (float)(x >> 40) * (1.0f / 16777216.0f);
}

/* qsort has no context argument in C11: the row being sorted, one per thread
 * (ranks of an expert-parallel group may run as threads of one process, and
 * each samples from its own engine's logprobs at the same time). */
static _Thread_local const float *g_lp;

static int by_logprob(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (g_lp[i] > g_lp[j]) return -1;
    if (g_lp[i] < g_lp[j]) return 1;
    return (i > j) - (i < j);
}

ls_status ls_sample_select(const ls_sampling *s, const float *lp, long V, uint32_t seq,
                           uint32_t pos, int32_t *ids, int32_t *token, ls_error *err)
{
    if (s->kind == LS_SAMPLING_GREEDY) {
        long best = 0;
        for (long v = 1; v < V; v++)
            if (lp[v] > lp[best]) best = v;
        *token = (int32_t)best;
        return LS_OK;
    }
    if (!(s->temperature > 0.0f))
        return ls_fail(err, LS_E_USAGE, "sampling: temperature must be > 0");
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
        return ls_fail(err, LS_E_USAGE, "sampling: top-p must be in (0, 1]");
    for (long v = 0; v < V; v++) ids[v] = (int32_t)v;
    g_lp = lp;
    qsort(ids, (size_t)V, sizeof *ids, by_logprob);
    long n = (s->top_k > 0 && s->top_k < V) ? s->top_k : V;
    float z0 = lp[ids[0]] / s->temperature;
    float total = 0.0f;
    for (long i = 0; i < n; i++) total = total + ls_expf(lp[ids[i]] / s->temperature - z0);
    if (s->top_p < 1.0f) {
        float want = s->top_p * total, run = 0.0f;
        long keep = n;
        for (long i = 0; i < n; i++) {
            run = run + ls_expf(lp[ids[i]] / s->temperature - z0);
            if (run >= want) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        total = run; /* without a break, run is the same sequential sum as total */
    }
    float target = ls_sample_uniform(s->seed, seq, pos) * total, run = 0.0f;
    for (long i = 0; i < n; i++) {
        run = run + ls_expf(lp[ids[i]] / s->temperature - z0);
        if (run > target) {
            *token = ids[i];
            return LS_OK;
        }
    }
    *token = ids[n - 1];
    return LS_OK;
}
