/* lockstep — GRPO groups, prefix reuse and preemption over the engine's
 * carried-state copies; see drive.h. Uses the engine's public API only. */
#include "run/drive.h"

#include <stdlib.h>
#include <string.h>

static const char *const prefix_names[] = {"off", "aligned", "any"};

const char *ls_prefix_cache_name(ls_prefix_cache p)
{
    return (unsigned)p < 3 ? prefix_names[p] : "?";
}

void ls_rollout_opts_default(ls_rollout_opts *o)
{
    memset(o, 0, sizeof *o);
    o->samples_per_prompt = 1;
    o->prefix_cache = LS_PREFIX_CACHE_OFF;
    o->prefix_block = 64;
}

uint32_t ls_run_sample_id(uint32_t prompt_id, long n, long k)
{
    return (uint32_t)((uint64_t)prompt_id * (uint64_t)n + (uint64_t)k);
}

ls_status ls_run_group_sequences(const ls_sequence *prompts, long n_prompts, long n, ls_sequence *out,
                                 ls_error *err)
{
    if (n < 1) return ls_fail(err, LS_E_USAGE, "samples_per_prompt must be >= 1 (got %ld)", n);
    for (long i = 0; i < n_prompts; i++) {
        if ((uint64_t)prompts[i].id * (uint64_t)n + (uint64_t)(n - 1) > UINT32_MAX)
            return ls_fail(err, LS_E_USAGE, "samples_per_prompt %ld: sample ids of prompt %u (id * %ld + "
                           "sample) exceed 32 bits", n, prompts[i].id, n);
        for (long k = 0; k < n; k++) {
            out[i * n + k] = prompts[i];
            out[i * n + k].id = ls_run_sample_id(prompts[i].id, n, k);
        }
    }
    return LS_OK;
}

long ls_run_group_slots(long n_prompts, const ls_rollout_opts *o)
{
    return n_prompts * o->samples_per_prompt + (o->n_evictions > 0 ? 1 : 0);
}

/* SplitMix64's finaliser over z + golden gamma (as engine/sample.h). */
static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

ls_status ls_run_preempt_plan(uint64_t seed, long n_seqs, long max_new, ls_run_eviction **out, long *n,
                              ls_error *err)
{
    *out = NULL;
    *n = 0;
    if (max_new < 2 || n_seqs < 1) return LS_OK;
    long cap = 16, k = 0;
    ls_run_eviction *v = malloc(sizeof *v * (size_t)cap);
    if (!v) return ls_fail_nomem(err, sizeof *v * (size_t)cap, "preemption plan");
    for (long s = 0; s < n_seqs; s++) {
        /* the sequence's own course: at decode step t it either leaves (a
         * draw of 1/4) or decodes its next token */
        for (long t = 1, gen = 1; gen < max_new;) {
            uint64_t x = mix(mix(mix(seed ^ 0x707265656d707421ull) ^ (uint64_t)s) ^ (uint64_t)t);
            if ((x & 3) != 0) {
                gen++, t++;
                continue;
            }
            if (k == cap) {
                ls_run_eviction *w = realloc(v, sizeof *v * (size_t)(2 * cap));
                if (!w) {
                    free(v);
                    return ls_fail_nomem(err, sizeof *v * (size_t)(2 * cap), "preemption plan");
                }
                v = w, cap *= 2;
            }
            long r = t + 1 + (long)((x >> 2) % 3);
            v[k++] = (ls_run_eviction){s, t, r, (x >> 8) & 1 ? LS_RESUME_SNAPSHOT : LS_RESUME_RECOMPUTE};
            t = r;
        }
    }
    *out = v;
    *n = k;
    return LS_OK;
}

/* ---- records kept for reuse ---------------------------------------------------------- */

/* Deep copies of a prompt's first records (the positions another prompt
 * reuses), indexed by position. */
typedef struct kept {
    ls_trace_record *r;        /* [n] */
    ls_trace_digest **d;       /* [n] owned digest arrays */
    long n;                    /* positions kept (the largest boundary taken from it) */
    long have;                 /* positions filled */
} kept;

static ls_status kept_add(kept *k, const ls_trace_record *r, ls_error *err)
{
    long p = (long)r->pos;
    if (p >= k->n) return LS_OK;
    ls_trace_digest *d = malloc(sizeof *d * (r->n_digests ? r->n_digests : 1));
    if (!d) return ls_fail_nomem(err, sizeof *d * r->n_digests, "prefix records");
    memcpy(d, r->digests, sizeof *d * r->n_digests);
    free(k->d[p]);
    k->d[p] = d;
    k->r[p] = *r;
    k->r[p].digests = d;
    k->r[p].n_dumps = 0; /* dumps are refused with prefix reuse (run.c) */
    k->r[p].dumps = NULL;
    k->r[p].raw = NULL;
    if (p + 1 > k->have) k->have = p + 1;
    return LS_OK;
}

/* ---- the driver ---------------------------------------------------------------------- */

typedef struct gprompt {
    long src;                  /* the prompt it starts from, -1 = none */
    long reuse;                /* positions reused from src */
    long done;                 /* positions processed */
    int started, finished;
    long *bounds;              /* [n_bounds] ascending: lengths at which others take its state */
    ls_engine_snapshot **snap; /* [n_bounds] */
    long *users;               /* [n_bounds] prompts still to restore it */
    long n_bounds;
    kept keep;
} gprompt;

typedef struct gseq {
    uint32_t id;
    long plen;
    int32_t *tok;              /* [plen + max_new]: prompt, then generated tokens */
    long gen;                  /* tokens generated */
    long slot;                 /* -1 = evicted or finished */
    long resume_step;          /* while evicted */
    ls_resume resume;
    ls_engine_snapshot *snap;  /* LS_RESUME_SNAPSHOT, while evicted */
} gseq;

typedef struct grun {
    ls_engine *e;
    const ls_sequence *pr;
    long np, N, ns, max_new, T;
    const ls_sampling *sampling;
    const ls_rollout_opts *o;
    gprompt *p;                /* [np] */
    gseq *q;                   /* [ns] */
    unsigned char *used;       /* [slots] */
    long slots;
    ls_engine_item *it;        /* [T] */
    ls_trace_record *frame;    /* [frame_cap] */
    long frame_cap;
    ls_run_sink sink;
    void *ctx;
    ls_rollout_stats st;
} grun;

static long common_prefix(const ls_sequence *a, const ls_sequence *b)
{
    long n = a->n_tokens < b->n_tokens ? a->n_tokens : b->n_tokens, k = 0;
    while (k < n && a->tokens[k] == b->tokens[k]) k++;
    return k;
}

static ls_status add_bound(gprompt *g, long r, ls_error *err)
{
    for (long i = 0; i < g->n_bounds; i++)
        if (g->bounds[i] == r) {
            g->users[i]++;
            return LS_OK;
        }
    long n = g->n_bounds + 1;
    long *b = realloc(g->bounds, sizeof *b * (size_t)n);
    if (b) g->bounds = b;
    long *u = realloc(g->users, sizeof *u * (size_t)n);
    if (u) g->users = u;
    ls_engine_snapshot **s = realloc(g->snap, sizeof *s * (size_t)n);
    if (s) g->snap = s;
    if (!b || !u || !s) return ls_fail(err, LS_E_NOMEM, "prefix plan: out of memory");
    long i = g->n_bounds;
    while (i > 0 && b[i - 1] > r) {
        b[i] = b[i - 1], u[i] = u[i - 1], s[i] = s[i - 1];
        i--;
    }
    b[i] = r, u[i] = 1, s[i] = NULL;
    g->n_bounds = n;
    return LS_OK;
}

/* Which earlier prompt each prompt starts from, and at how many positions. */
static ls_status plan_prefixes(grun *g, ls_error *err)
{
    if (g->o->prefix_cache == LS_PREFIX_CACHE_OFF) return LS_OK;
    for (long i = 0; i < g->np; i++) {
        long best = -1, k = 0;
        for (long j = 0; j < i; j++) {
            long c = common_prefix(&g->pr[i], &g->pr[j]);
            if (c > k) k = c, best = j;
        }
        long r = k - 1; /* the last shared token is computed (drive.h) */
        if (g->o->prefix_cache == LS_PREFIX_CACHE_ALIGNED) r -= r % g->o->prefix_block;
        if (best < 0 || r < 1) continue;
        /* A source that itself started past r never held r positions: its
         * own source shares at least r + 1 tokens with this prompt too. */
        while (r < g->p[best].reuse) best = g->p[best].src;
        g->p[i].src = best;
        g->p[i].reuse = r;
        LS_TRY(add_bound(&g->p[best], r, err));
        if (r > g->p[best].keep.n) g->p[best].keep.n = r;
    }
    for (long i = 0; i < g->np; i++) {
        kept *k = &g->p[i].keep;
        if (!k->n) continue;
        k->r = calloc((size_t)k->n, sizeof *k->r);
        k->d = calloc((size_t)k->n, sizeof *k->d);
        if (!k->r || !k->d) return ls_fail(err, LS_E_NOMEM, "prefix records: out of memory");
    }
    return LS_OK;
}

static ls_status grow_frame(grun *g, long n, ls_error *err)
{
    if (n <= g->frame_cap) return LS_OK;
    ls_trace_record *f = realloc(g->frame, sizeof *f * (size_t)n);
    if (!f) return ls_fail(err, LS_E_NOMEM, "rollout: out of memory");
    g->frame = f;
    g->frame_cap = n;
    return LS_OK;
}

/* Snapshots of prompt i due at its current length. */
static ls_status take_due(grun *g, long i, ls_error *err)
{
    gprompt *p = &g->p[i];
    for (long b = 0; b < p->n_bounds; b++)
        if (p->bounds[b] == p->done && !p->snap[b])
            LS_TRY(ls_engine_snapshot_take(g->e, i * g->N, &p->snap[b], err));
    return LS_OK;
}

/* Starts prompt i in sample 0's slot: from scratch, or from its source's
 * snapshot, emitting the reused positions' records (the source's, with the
 * samples' ids) as one frame. */
static ls_status start_prompt(grun *g, long i, ls_error *err)
{
    gprompt *p = &g->p[i];
    long slot = i * g->N, N = g->N;
    uint32_t id0 = g->q[slot].id;
    long plen = g->pr[i].n_tokens;
    if (p->src < 0) {
        LS_TRY(ls_engine_join(g->e, slot, id0, plen, err));
    } else {
        gprompt *s = &g->p[p->src];
        long b = 0;
        while (s->bounds[b] != p->reuse) b++;
        LS_TRY(ls_engine_snapshot_restore(g->e, s->snap[b], slot, id0, plen, err));
        if (--s->users[b] == 0) {
            ls_engine_snapshot_free(g->e, s->snap[b]);
            s->snap[b] = NULL;
            s->users[b] = -1; /* spent */
        }
        LS_TRY(grow_frame(g, p->reuse * N, err));
        long n = 0;
        for (long k = 0; k < N; k++)
            for (long pos = 0; pos < p->reuse; pos++) {
                g->frame[n] = s->keep.r[pos];
                g->frame[n++].seq = g->q[slot + k].id;
            }
        for (long pos = 0; pos < p->reuse; pos++) {
            ls_trace_record r = s->keep.r[pos];
            r.seq = id0;
            LS_TRY(kept_add(&p->keep, &r, err));
        }
        LS_TRY(g->sink(g->ctx, LS_FRAME_PREFILL, g->frame, n, err));
        p->done = p->reuse;
        g->st.positions_reused += p->reuse;
    }
    g->used[slot] = 1;
    p->started = 1;
    return take_due(g, i, err);
}

static int source_ready(const grun *g, long i)
{
    const gprompt *p = &g->p[i];
    if (p->src < 0) return 1;
    const gprompt *s = &g->p[p->src];
    for (long b = 0; b < s->n_bounds; b++)
        if (s->bounds[b] == p->reuse) return s->snap[b] != NULL;
    return 0;
}

/* The next length at which prompt i's state is wanted, or its prompt length. */
static long next_stop(const grun *g, long i)
{
    const gprompt *p = &g->p[i];
    for (long b = 0; b < p->n_bounds; b++)
        if (p->bounds[b] > p->done) return p->bounds[b];
    return g->pr[i].n_tokens;
}

static ls_status prefill(grun *g, ls_error *err)
{
    long N = g->N, T = g->T;
    LS_TRY(grow_frame(g, T * N, err));
    for (;;) {
        int waiting = 0;
        for (long i = 0; i < g->np; i++) {
            if (!g->p[i].started && source_ready(g, i)) LS_TRY(start_prompt(g, i, err));
            waiting |= !g->p[i].started;
        }
        long n = 0, rows = 0;
        for (long i = 0; i < g->np && rows < T; i++) {
            gprompt *p = &g->p[i];
            long left = g->pr[i].n_tokens - p->done;
            if (!p->started || left <= 0) continue;
            long take = next_stop(g, i) - p->done;
            if (take > T - rows) take = T - rows;
            g->it[n++] = (ls_engine_item){i * N, g->pr[i].tokens + p->done, take,
                                          g->max_new == 1 && take == left, take < left};
            rows += take;
        }
        if (n == 0) {
            if (waiting) return ls_fail(err, LS_E_INTERNAL, "prefix plan: a prompt waits on a snapshot "
                                        "that is never taken");
            return LS_OK;
        }
        LS_TRY(ls_engine_step(g->e, g->it, n, err));
        g->st.positions_computed += rows;
        long nf = 0;
        for (long s = 0, r = 0; s < n; s++) {
            long i = g->it[s].slot / N;
            gprompt *p = &g->p[i];
            const ls_sequence *pr = &g->pr[i];
            for (long j = 0; j < g->it[s].n; j++, r++) {
                long pos = p->done + j;
                if (pos + 1 < pr->n_tokens) {
                    const ls_trace_record *rec;
                    LS_TRY(ls_engine_record(g->e, r, pr->tokens[pos + 1], &rec, err));
                    LS_TRY(kept_add(&p->keep, rec, err));
                    for (long k = 0; k < N; k++) {
                        g->frame[nf] = *rec;
                        g->frame[nf++].seq = g->q[i * N + k].id;
                    }
                    continue;
                }
                /* the last prompt position: each sample draws its own first token */
                for (long k = 0; k < N; k++) {
                    gseq *x = &g->q[i * N + k];
                    int32_t next;
                    LS_TRY(ls_engine_sample(g->e, r, g->sampling, x->id, (uint32_t)(pos + 1), &next, err));
                    x->tok[x->plen] = next;
                    x->gen = 1;
                    const ls_trace_record *rec;
                    LS_TRY(ls_engine_record(g->e, r, next, &rec, err));
                    g->frame[nf] = *rec;
                    g->frame[nf++].seq = x->id;
                }
            }
        }
        LS_TRY(g->sink(g->ctx, LS_FRAME_PREFILL, g->frame, nf, err));
        for (long s = 0; s < n; s++) {
            long i = g->it[s].slot / N;
            gprompt *p = &g->p[i];
            p->done += g->it[s].n;
            LS_TRY(take_due(g, i, err));
            if (p->done == g->pr[i].n_tokens) {
                /* the GRPO fork: samples 1..N-1 continue from sample 0's state */
                for (long k = 1; k < N; k++) {
                    LS_TRY(ls_engine_fork(g->e, i * N, i * N + k, g->q[i * N + k].id, err));
                    g->used[i * N + k] = 1;
                    g->st.forks++;
                }
                p->finished = 1;
            }
        }
    }
}

/* A free slot, the highest first (so a resumed sequence lands in another
 * slot than it left whenever one is spare). */
static long free_slot(const grun *g)
{
    for (long s = g->slots - 1; s >= 0; s--)
        if (!g->used[s]) return s;
    return -1;
}

static ls_status evict(grun *g, long x, long step, const ls_run_eviction *ev, ls_error *err)
{
    gseq *q = &g->q[x];
    if (q->slot < 0 || q->gen >= g->max_new)
        return ls_fail(err, LS_E_USAGE, "preemption: sequence %ld (id %u) is not running at decode step %ld",
                       x, q->id, step);
    if (ev->resume == LS_RESUME_SNAPSHOT) LS_TRY(ls_engine_snapshot_take(g->e, q->slot, &q->snap, err));
    ls_engine_leave(g->e, q->slot);
    g->used[q->slot] = 0;
    q->slot = -1;
    q->resume_step = ev->resume_step;
    q->resume = ev->resume;
    g->st.evictions++;
    return LS_OK;
}

static ls_status resume(grun *g, long x, ls_error *err)
{
    gseq *q = &g->q[x];
    long slot = free_slot(g);
    if (slot < 0) return ls_fail(err, LS_E_INTERNAL, "preemption: no free slot to resume sequence %u", q->id);
    long len = q->plen + q->gen - 1; /* positions processed: it left with its next token drawn */
    q->resume_step = 0;
    if (q->resume == LS_RESUME_SNAPSHOT) {
        LS_TRY(ls_engine_snapshot_restore(g->e, q->snap, slot, q->id, q->plen, err));
        ls_engine_snapshot_free(g->e, q->snap);
        q->snap = NULL;
        g->st.restored++;
    } else {
        g->st.recomputed++;
        /* recompute: the positions again, max_rows at a time; the records
         * were emitted the first time and are dropped here */
        LS_TRY(ls_engine_join(g->e, slot, q->id, q->plen, err));
        for (long done = 0; done < len;) {
            long take = len - done < g->T ? len - done : g->T;
            ls_engine_item it = {slot, q->tok + done, take, 0, 0};
            LS_TRY(ls_engine_step(g->e, &it, 1, err));
            g->st.positions_computed += take;
            done += take;
        }
    }
    if (ls_engine_slot_len(g->e, slot) != len)
        return ls_fail(err, LS_E_INTERNAL, "preemption: sequence %u resumed at %ld positions, not %ld", q->id,
                       ls_engine_slot_len(g->e, slot), len);
    g->used[slot] = 1;
    q->slot = slot;
    return LS_OK;
}

/* Decode steps until every sequence has its tokens: each running sequence
 * decodes one token a step; an evicted one waits (and so finishes later).
 * The steps are pipelined as the drivers' are (drive.h, ls_run_pipe), and
 * every begun step is ended before a resume, whose recompute steps alone. */
static ls_status decode(grun *g, ls_error *err)
{
    const ls_rollout_opts *o = g->o;
    long T = g->T;
    long *act = malloc(sizeof(long) * (size_t)g->ns);
    if (!act) return ls_fail(err, LS_E_NOMEM, "rollout: out of memory");
    ls_status st = LS_OK;
    ls_run_pipe pl = ls_run_pipe_open(g->e, g->sink, g->ctx);
    long step = 1;
    for (;; step++) {
        for (long x = 0; st == LS_OK && x < g->ns; x++)
            if (g->q[x].resume_step == step) {
                st = ls_run_pipe_end(&pl, err);
                if (st == LS_OK) st = resume(g, x, err);
            }
        for (long v = 0; st == LS_OK && v < o->n_evictions; v++)
            if (o->evictions[v].step == step) st = evict(g, o->evictions[v].seq, step, &o->evictions[v], err);
        long na = 0, waiting = 0;
        for (long x = 0; x < g->ns; x++) {
            if (g->q[x].slot >= 0 && g->q[x].gen < g->max_new) act[na++] = x;
            waiting += g->q[x].resume_step > 0;
        }
        if (st != LS_OK || (na == 0 && waiting == 0)) break;
        for (long b0 = 0; st == LS_OK && b0 < na; b0 += T) {
            long nb = na - b0 < T ? na - b0 : T;
            for (long s = 0; s < nb; s++) {
                gseq *q = &g->q[act[b0 + s]];
                g->it[s] = (ls_engine_item){q->slot, &q->tok[q->plen + q->gen - 1], 1, q->gen == g->max_new - 1, 0};
            }
            st = ls_engine_step_begin(g->e, g->it, nb, err);
            g->st.positions_computed += nb;
            const ls_trace_record *rec0 = NULL;
            for (long s = 0; st == LS_OK && s < nb; s++) {
                gseq *q = &g->q[act[b0 + s]];
                int32_t next;
                st = ls_engine_sample(g->e, s, g->sampling, q->id, (uint32_t)(q->plen + q->gen), &next, err);
                q->tok[q->plen + q->gen] = next;
                q->gen++;
                const ls_trace_record *rec;
                if (st == LS_OK) st = ls_engine_record(g->e, s, next, &rec, err);
                if (st == LS_OK && s == 0) rec0 = rec;
            }
            if (st == LS_OK) st = ls_run_pipe_push(&pl, LS_FRAME_DECODE, rec0, nb, err);
        }
    }
    st = ls_run_pipe_close(&pl, st, err);
    /* an eviction after its sequence finished never happened: the schedule was wrong */
    for (long v = 0; st == LS_OK && v < o->n_evictions; v++)
        if (o->evictions[v].step >= step)
            st = ls_fail(err, LS_E_USAGE, "preemption: sequence %ld is not running at decode step %ld (every "
                         "sequence finished at step %ld)", o->evictions[v].seq, o->evictions[v].step, step - 1);
    free(act);
    return st;
}

/* Every eviction names a sequence and a later resume step: the schedule is
 * input (a test's or ls_run_preempt_plan's). */
static ls_status check_evictions(const grun *g, ls_error *err)
{
    const ls_rollout_opts *o = g->o;
    for (long v = 0; v < o->n_evictions; v++) {
        const ls_run_eviction *ev = &o->evictions[v];
        if (ev->seq < 0 || ev->seq >= g->ns || ev->step < 1 || ev->resume_step <= ev->step ||
            (ev->resume != LS_RESUME_RECOMPUTE && ev->resume != LS_RESUME_SNAPSHOT))
            return ls_fail(err, LS_E_USAGE, "preemption: eviction %ld (sequence %ld, step %ld, resume step %ld) "
                           "needs a sequence in 0..%ld and 1 <= step < resume step", v, ev->seq, ev->step,
                           ev->resume_step, g->ns - 1);
    }
    return LS_OK;
}

ls_status ls_run_rollout_group(ls_engine *e, const ls_sequence *prompts, long n_prompts, long max_new,
                               const ls_sampling *sampling, const ls_rollout_opts *o, int32_t *completion,
                               ls_run_sink sink, void *ctx, ls_error *err)
{
    long N = o->samples_per_prompt;
    if (N < 1) return ls_fail(err, LS_E_USAGE, "samples_per_prompt must be >= 1 (got %ld)", N);
    if (o->prefix_cache == LS_PREFIX_CACHE_ALIGNED && o->prefix_block < 1)
        return ls_fail(err, LS_E_USAGE, "prefix_block must be >= 1 (got %ld)", o->prefix_block);
    if ((unsigned)o->prefix_cache > LS_PREFIX_CACHE_ANY)
        return ls_fail(err, LS_E_USAGE, "prefix_cache: unknown policy %d", (int)o->prefix_cache);
    if (n_prompts < 1 || ls_run_group_slots(n_prompts, o) > ls_engine_max_seqs(e))
        return ls_fail(err, LS_E_USAGE, "rollout: %ld prompts x %ld samples need %ld slots (engine holds %ld)",
                       n_prompts, N, ls_run_group_slots(n_prompts, o), ls_engine_max_seqs(e));
    if (max_new < 1) return ls_fail(err, LS_E_USAGE, "rollout: max_new must be >= 1");
    for (long i = 0; i < n_prompts; i++) {
        if (prompts[i].n_tokens < 1)
            return ls_fail(err, LS_E_INPUT, "rollout: sequence %u has an empty prompt", prompts[i].id);
        if (prompts[i].n_tokens + max_new - 1 > ls_engine_capacity(e))
            return ls_fail(err, LS_E_USAGE, "rollout: sequence %u needs %ld positions (capacity %ld)",
                           prompts[i].id, prompts[i].n_tokens + max_new - 1, ls_engine_capacity(e));
    }
    grun g;
    memset(&g, 0, sizeof g);
    g.e = e, g.pr = prompts, g.np = n_prompts, g.N = N, g.ns = n_prompts * N, g.max_new = max_new;
    g.T = ls_engine_max_rows(e), g.sampling = sampling, g.o = o;
    g.sink = sink, g.ctx = ctx, g.slots = ls_engine_max_seqs(e);
    ls_sequence *ids = malloc(sizeof *ids * (size_t)g.ns);
    g.p = calloc((size_t)n_prompts, sizeof *g.p);
    g.q = calloc((size_t)g.ns, sizeof *g.q);
    g.used = calloc((size_t)g.slots, 1);
    g.it = calloc((size_t)g.T, sizeof *g.it);
    ls_status st = ids && g.p && g.q && g.used && g.it ? LS_OK
                                                       : ls_fail(err, LS_E_NOMEM, "rollout: out of memory");
    if (st == LS_OK) st = ls_run_group_sequences(prompts, n_prompts, N, ids, err);
    if (st == LS_OK) st = check_evictions(&g, err);
    for (long i = 0; st == LS_OK && i < n_prompts; i++) g.p[i].src = -1;
    for (long x = 0; st == LS_OK && x < g.ns; x++) {
        gseq *q = &g.q[x];
        q->id = ids[x].id;
        q->plen = ids[x].n_tokens;
        q->slot = x;
        q->tok = malloc(sizeof(int32_t) * (size_t)(q->plen + max_new));
        if (!q->tok) st = ls_fail(err, LS_E_NOMEM, "rollout: out of memory");
        else memcpy(q->tok, ids[x].tokens, sizeof(int32_t) * (size_t)q->plen);
    }
    if (st == LS_OK) st = plan_prefixes(&g, err);
    for (long s = 0; st == LS_OK && s < g.slots; s++) ls_engine_leave(e, s);
    if (st == LS_OK) st = prefill(&g, err);
    if (st == LS_OK) st = decode(&g, err);
    if (st == LS_OK && completion)
        for (long x = 0; x < g.ns; x++)
            memcpy(completion + x * max_new, g.q[x].tok + g.q[x].plen, sizeof(int32_t) * (size_t)max_new);
    if (o->stats) *o->stats = g.st;
    for (long s = 0; g.used && s < g.slots; s++) ls_engine_leave(e, s);
    for (long x = 0; g.q && x < g.ns; x++) {
        ls_engine_snapshot_free(e, g.q[x].snap);
        free(g.q[x].tok);
    }
    for (long i = 0; g.p && i < n_prompts; i++) {
        gprompt *p = &g.p[i];
        for (long b = 0; b < p->n_bounds; b++) ls_engine_snapshot_free(e, p->snap[b]);
        for (long k = 0; p->keep.d && k < p->keep.n; k++) free(p->keep.d[k]);
        free(p->keep.d), free(p->keep.r), free(p->bounds), free(p->snap), free(p->users);
    }
    free(ids), free(g.p), free(g.q), free(g.used), free(g.it), free(g.frame);
    return st;
}
