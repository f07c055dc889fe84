/* lockstep — the batch-invariance matrix on the strict CUDA engine
 * (harness/gpu_matrix runs it and writes reports/batch-invariance-h200.md).
 *
 * Every sequence's records (tokens, logprob bits, top-5, every digest) must
 * be bitwise equal to the records of the same sequence run alone, whatever
 * else shares its steps:
 *   rollout   N = 1, 4, 16, 64 concurrent sequences x prompt length 8, 64,
 *             256, 1024 (greedy, 4 new tokens)
 *   replay    the same sequences (prompt + completion) whole and in chunks
 *             (rollout = replay)
 *   mixed     the step API: prefill chunks of some sequences and decode
 *             tokens of others in one step, unrelated sequences joining and
 *             leaving slots between steps
 * and with the CPU reference engine: at every prompt length the CPU engine
 * runs each of the 64 sequences alone, the CUDA single-sequence runs must
 * equal those records, and every cell is compared with them as well.
 *
 * Serving cells (what rollout engines do; src/run/drive.h, the entry points
 * `lockstep run` uses): at every prompt length, on the first 16 sequences
 * (sequences 8..15 share a prefix with 0..7, see prompt_of), each compared
 * with exactly those sequences' single-sequence runs, CUDA and CPU:
 *   kvN       paged KV cache, pages of N = 16, 17, 100 positions (an engine
 *             with kv_page N): rollout, and replay in chunks of 16
 *   pfx-any   prefix reuse at any length (ls_run_rollout_group, prefix_cache
 *             any): each prompt starts from the state of the earlier prompt
 *             sharing its longest prefix
 *   pfx-al    prefix reuse at aligned boundaries (multiples of 16; 4 at
 *             prompt length 8)
 *   preempt   seeded preemption (ls_run_preempt_plan, as --preempt seeded:7)
 *   pre-kv17  a forced eviction schedule (every sequence evicted once,
 *             resumed by recompute or from a snapshot) on the paged engine
 *             of page 17
 *   grpo8     a GRPO group: 2 prompts x 8 samples, seeded sampling; compared
 *             with each sample run alone on the same engine and with the CPU
 *             engine running the same group
 *   mixed-kv17  the mixed cell on a paged engine (page 17)
 *
 *   gpu_matrix CHECKPOINT_DIR OUT.md [--quick | --prompts P,P,...] [--serving-only]
 *              [--fp8 dequant|w8a8] [--tier portable|tc] [--gdn-form chunk-aligned]
 *
 * --quick: prompts 8 and 64 only. --prompts: only these prompt lengths (of
 * 8, 64, 256, 1024) and no mixed cell, to run part of the matrix on its own.
 * --serving-only: the serving cells alone (with the single-sequence runs of
 * the 16 sequences they use, CUDA and CPU), combinable with --quick and
 * --prompts. --fp8 (an FP8 checkpoint only): the FP8 mode of every engine,
 * CUDA and CPU alike (engine opts fp8_w8a8); an FP8 checkpoint runs dequant
 * without it, as lockstep run does.
 * --tier tc: every CUDA engine on the tensor-core strict tier, as
 * `lockstep run --backend cuda --tier tc` opens it (ls_run_engine_open_tier:
 * every linear through its cuBLASLt algorithm qualified for LS_RUN_TC_ROWS
 * rows per call; docs/tensor-core-tier.md). The tier is deterministic and
 * batch-invariant but not equal to the CPU reference (§1), so no CPU engine
 * runs: no CPU single runs, no cpu-batch cell, no CPU reference for the mixed
 * and grpo8 cells, and the CPU column reads "n/a (tc tier)"; every cell is
 * still compared bitwise with the same sequences run alone on the tc engine.
 * A bf16 checkpoint only (no --fp8, no FP8 checkpoint) and the cuda backend
 * only. --tier portable (the default): the portable tier, as above.
 * --gdn-form chunk-aligned: every engine, CUDA and CPU, runs Gated DeltaNet
 * in the chunk-aligned form (docs/numerics.md §5.1; on the tc tier its
 * tensor-core kernels, docs/tensor-core-tier.md §3), and the replays add
 * chunks of 63 and 65, which straddle the form's chunk boundaries.
 * LS_MATRIX_BACKEND=cpu runs every "CUDA" engine on the CPU backend instead
 * (a check of the driver itself on a machine without a GPU). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "engine/sample.h"
#include "run/run.h"
#include "engine_records.h"
#include "io/checkpoint.h"
#include "model/model.h"

#define GEN 4
#define MAXN 64

static FILE *g_md;
static int g_fail, g_cells;
static int g_w8a8;         /* --fp8 w8a8: every engine, CUDA and CPU */
static ls_tier g_tier;     /* --tier: the engines' tier (portable or tc) */
static int g_tc;           /* --tier tc: every engine on the tc tier; none on the CPU */
static int g_gdn;          /* --gdn-form chunk-aligned: every engine in that GDN form */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define TRY(call) do { ls_error err_; ls_error_clear(&err_); if ((call) != LS_OK) { \
    fprintf(stderr, "gpu_matrix: %s:%d: %s\n", __FILE__, __LINE__, err_.msg); exit(2); } } while (0)
#define E_ (&err_)

/* Prompt of sequence id at length P: counter-based, so every cell and the
 * single-sequence runs see the same tokens. */
static void prompt(uint32_t id, long P, long V, int32_t *out)
{
    for (long i = 0; i < P; i++) {
        uint64_t x = ((uint64_t)id << 32) ^ (uint64_t)(i + 1) ^ ((uint64_t)P << 48);
        x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
        out[i] = (int32_t)(x % (uint64_t)V);
    }
}

/* The prefix boundary of the aligned prefix cell at prompt length P. */
static long prefix_block(long P)
{
    return P >= 64 ? 16 : 4;
}

/* The matrix's prompt of sequence id at length P: prompt() for every id but
 * 8..15, which share a prefix with an earlier sequence so that the prefix
 * cells have something to reuse (the other cells do not care). Sequence 8 + s
 * takes its first k tokens from its base (sequence s; 15's base is 12, so its
 * source is itself restored from a snapshot) and differs at token k:
 *   s = 0  k = P          the whole prompt (reuse P - 1)
 *       1  k = b + 1      reuse b (a multiple of the block b)
 *       2  k = b + 2      reuse b + 1
 *       3  k = 2b         reuse 2b - 1 (one short of a boundary)
 *       4  k = P/2 + 3
 *       5  k = 1          nothing to reuse
 *       6  k = P - 1
 *       7  k = P/2 + 3 + b/2 + 1, base 12 (more than 12 shares with 4)
 * clamped to 1..P (b = prefix_block(P)). */
static void prompt_of(uint32_t id, long P, long V, int32_t *out)
{
    prompt(id, P, V, out);
    if (id < 8 || id > 15) return;
    long s = id - 8, b = prefix_block(P);
    const long k_of[8] = {P, b + 1, b + 2, 2 * b, P / 2 + 3, 1, P - 1, P / 2 + 3 + b / 2 + 1};
    long k = k_of[s] < 1 ? 1 : k_of[s] > P ? P : k_of[s];
    int32_t *base = malloc(sizeof(int32_t) * (size_t)P);
    if (!base) { fprintf(stderr, "gpu_matrix: out of memory\n"); exit(2); }
    prompt_of(s == 7 ? 12 : (uint32_t)s, P, V, base);
    memcpy(out, base, sizeof(int32_t) * (size_t)k);
    if (k < P && out[k] == base[k]) out[k] = (int32_t)((out[k] + 1) % V);
    free(base);
}

typedef struct seqset {
    long n, P;
    int32_t *tok;          /* [n, P + GEN] prompt then completion */
    ls_sequence *s;
} seqset;

static void seqset_make(seqset *q, uint32_t id0, long n, long P, long V)
{
    q->n = n;
    q->P = P;
    q->tok = calloc((size_t)(n * (P + GEN)), sizeof(int32_t));
    q->s = calloc((size_t)n, sizeof(ls_sequence));
    for (long i = 0; i < n; i++) {
        prompt_of(id0 + (uint32_t)i, P, V, q->tok + i * (P + GEN));
        q->s[i] = (ls_sequence){id0 + (uint32_t)i, q->tok + i * (P + GEN), P, P};
    }
}

static const ls_sampling GREEDY = {LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};

static void rollout(ls_engine *e, const seqset *q, long n, recs *out, int32_t *comp)
{
    TRY(ls_run_rollout(e, q->s, n, GEN, &GREEDY, comp, recs_sink, out, E_));
    recs_sort(out);
}

/* Replay of prompt + completion (completion from comp [n, GEN]). */
static void replay(ls_engine *e, const seqset *q, long n, const int32_t *comp, long chunk, recs *out)
{
    ls_sequence *s = calloc((size_t)n, sizeof *s);
    for (long i = 0; i < n; i++) {
        int32_t *t = q->tok + i * (q->P + GEN);
        memcpy(t + q->P, comp + i * GEN, sizeof(int32_t) * GEN);
        s[i] = (ls_sequence){q->s[i].id, t, q->P + GEN, q->P};
    }
    TRY(ls_run_replay(e, s, n, chunk, recs_sink, out, E_));
    free(s);
    recs_sort(out);
}

/* Singles: each sequence run alone on engine e; records appended to out. */
/* Sequences w, w + nw, ... (< n) of q, each alone on engine e; records
 * appended to out (unsorted), completions to comp [n, GEN]. */
static void singles_strided(ls_engine *e, const seqset *q, long n, long w, long nw, recs *out,
                            int32_t *comp)
{
    for (long i = w; i < n; i += nw)
        TRY(ls_run_rollout(e, q->s + i, 1, GEN, &GREEDY, comp + i * GEN, recs_sink, out, E_));
}

static void singles(ls_engine *e, const seqset *q, long n, recs *out, int32_t *comp)
{
    singles_strided(e, q, n, 0, 1, out, comp);
    recs_sort(out);
}

/* The CPU reference's single-sequence runs, one engine (one thread) per
 * worker so that the 64 sequences run side by side on the machine's cores;
 * each run is still one sequence alone on its own engine. */
#define CPU_WORKERS 16

typedef struct cpu_job {
    ls_engine *e;
    const seqset *q;
    long n, w, nw;
    recs out;
    int32_t comp[MAXN * GEN];
} cpu_job;

static void *cpu_worker(void *arg)
{
    cpu_job *j = arg;
    singles_strided(j->e, j->q, j->n, j->w, j->nw, &j->out, j->comp);
    return NULL;
}

static void cpu_singles(ls_engine **cpu, int nw, const seqset *q, long n, recs *out)
{
    cpu_job *jobs = calloc((size_t)nw, sizeof *jobs);
    pthread_t *th = calloc((size_t)nw, sizeof *th);
    for (int w = 0; w < nw; w++) {
        jobs[w] = (cpu_job){.e = cpu[w], .q = q, .n = n, .w = w, .nw = nw};
        if (pthread_create(&th[w], NULL, cpu_worker, &jobs[w]) != 0) {
            fprintf(stderr, "gpu_matrix: cannot start a CPU worker\n");
            exit(2);
        }
    }
    for (int w = 0; w < nw; w++) {
        pthread_join(th[w], NULL);
        for (long i = 0; i < jobs[w].out.n; i++) {
            ls_error err_;
            ls_trace_record r = jobs[w].out.v[i].r;
            r.digests = jobs[w].out.v[i].d;
            if (recs_add(out, &r, &err_) != LS_OK) {
                fprintf(stderr, "gpu_matrix: %s\n", err_.msg);
                exit(2);
            }
        }
        recs_free(&jobs[w].out);
    }
    recs_sort(out);
    free(jobs);
    free(th);
}

/* subset 1: got's records must be among the reference's (the reference runs
 * more sequences); 0: got and the reference hold the same records. */
static void row_cmp(const char *cell, long N, long P, const char *mode, const recs *got, const recs *single,
                    const recs *cpu, double secs, int subset)
{
    char m1[400], m2[400] = "not run (subset)";
    int d1 = recs_diff(got, single, subset, m1, sizeof m1);
    int d2 = 0;
    if (cpu) d2 = recs_diff(got, cpu, subset, m2, sizeof m2);
    g_cells++;
    if (d1 || d2) g_fail++;
    fprintf(g_md, "| %s | %ld | %ld | %s | %ld | %s | %s | %.1f |\n", cell, N, P, mode, got->n,
            d1 ? m1 : "equal", cpu ? (d2 ? m2 : "equal") : g_tc ? "n/a (tc tier)" : "—", secs);
    fflush(g_md);
    printf("%-6s %-8s N=%-3ld P=%-5ld %-22s records %-6ld single: %s; cpu: %s (%.1fs)\n",
           (d1 || d2) ? "FAIL" : "ok", cell, N, P, mode, got->n, d1 ? m1 : "equal",
           cpu ? (d2 ? m2 : "equal") : g_tc ? "n/a (tc tier)" : "-", secs);
    fflush(stdout);
}

static void row(const char *cell, long N, long P, const char *mode, const recs *got, const recs *single,
                const recs *cpu, double secs)
{
    row_cmp(cell, N, P, mode, got, single, cpu, secs, 1);
}

/* Mixed steps on engine e through the run layer's continuous-batching
 * driver: `nseq` sequences (ids from id0, prompt lengths cycling through
 * plens) arrive every other step, take a free slot of the engine's, prefill
 * in chunks of their own size while others decode, and leave after their
 * last position. */
static void mixed(ls_engine *e, const ls_model *m, uint32_t id0, int nseq, const long *plens, recs *out)
{
    long V = m->cfg.vocab;
    int32_t *tok = calloc((size_t)nseq * (1024 + GEN), sizeof(int32_t));
    ls_run_request *req = calloc((size_t)nseq, sizeof *req);
    for (int i = 0; i < nseq; i++) {
        int32_t *t = tok + (size_t)i * (1024 + GEN);
        long P = plens[i % 3];
        prompt(id0 + (uint32_t)i, P, V, t);
        req[i] = (ls_run_request){id0 + (uint32_t)i, t, P, GEN, 2 * i, (long[]){3, 16, 40, 7}[i % 4], NULL};
    }
    TRY(ls_run_serve(e, req, nseq, &GREEDY, recs_sink, out, E_));
    recs_sort(out);
    free(req), free(tok);
}

/* kv_page 0: the contiguous cache; N > 0: pages of N positions. On the tc
 * tier (g_tc) the backend must be cuda and rows at most LS_RUN_TC_ROWS, the
 * rows per call its GEMMs are qualified for. */
static ls_engine *make_engine_kv(const ls_model *m, const char *backend, long max_seqs, long max_len, long rows,
                                 int threads, long kv_page)
{
    if (g_tc && rows > LS_RUN_TC_ROWS) {
        fprintf(stderr, "gpu_matrix: --tier tc: an engine of %ld rows per call; the tc tier qualifies its GEMMs "
                "for at most %d\n", rows, LS_RUN_TC_ROWS);
        exit(2);
    }
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = rows;
    o.state_digest_every = 16;
    o.fp8_w8a8 = g_w8a8;
    o.kv_page = kv_page;
    o.gdn_chunked = g_gdn;
    ls_engine *e = NULL;
    TRY(ls_run_engine_open_tier(m, backend, threads, 0, g_tier, &o, max_seqs, max_len, &e, E_));
    return e;
}

static ls_engine *make_engine(const ls_model *m, const char *backend, long max_seqs, long max_len, long rows,
                              int threads)
{
    return make_engine_kv(m, backend, max_seqs, max_len, rows, threads, 0);
}

/* ---- serving cells ---------------------------------------------------------------------
 * What rollout engines do, through the run layer's entry points (the ones
 * `lockstep run` calls: ls_run_rollout and ls_run_replay on a paged engine,
 * ls_run_rollout_group for prefix reuse, preemption and GRPO). Each cell's
 * records must be exactly the reference's: every record of every sequence,
 * none missing, none extra. */

#define NSERVE 16              /* the serving cells' sequences: the matrix's 0..15 */
#define GRPO_PROMPTS 2
#define GRPO_N 8

static const ls_sampling SEEDED = {LS_SAMPLING_SEEDED, 7, 1.0f, 0, 1.0f};

/* Appends the records of sequences lo..hi-1 of src to out (sorted stays sorted). */
static void recs_pick(const recs *src, uint32_t lo, uint32_t hi, recs *out)
{
    for (long i = 0; i < src->n; i++) {
        if (src->v[i].r.seq < lo || src->v[i].r.seq >= hi) continue;
        ls_trace_record r = src->v[i].r;
        r.digests = src->v[i].d;
        TRY(recs_add(out, &r, E_));
    }
}

static void group_run(ls_engine *e, const ls_sequence *pr, long np, const ls_sampling *s, const ls_rollout_opts *o,
                      int32_t *comp, recs *out)
{
    TRY(ls_run_rollout_group(e, pr, np, GEN, s, o, comp, recs_sink, out, E_));
    recs_sort(out);
}

/* Distinct completions among the n of comp [n, GEN]. */
static long distinct(const int32_t *comp, long n)
{
    long d = 0;
    for (long i = 0; i < n; i++) {
        long j = 0;
        while (j < i && memcmp(comp + j * GEN, comp + i * GEN, sizeof(int32_t) * GEN) != 0) j++;
        d += j == i;
    }
    return d;
}

/* The serving cells at q's prompt length. single and cpu: the records of
 * sequences 0..NSERVE-1 run alone on engine g's backend and on the CPU (cpu
 * NULL on the tc tier: no CPU comparison, no CPU engine for grpo8);
 * comp [NSERVE, GEN]: their completions (what the replays recompute). */
static void serving(ls_engine *g, const char *gb, const ls_model *m, const seqset *q, const recs *single,
                    const recs *cpu, const int32_t *comp)
{
    long P = q->P;
    char cell[64], mode[200];
    ls_rollout_stats st;
    ls_rollout_opts o;
    static const long pages[3] = {16, 17, 100};
    for (int k = 0; k < 3; k++) {
        /* NSERVE + 1 slots: the forced preemption needs a spare */
        ls_engine *pe = make_engine_kv(m, gb, NSERVE + 1, P + GEN, 256, 16, pages[k]);
        double tc = now_s();
        recs b = {0};
        int32_t cc[NSERVE * GEN];
        rollout(pe, q, NSERVE, &b, cc);
        snprintf(cell, sizeof cell, "kv%ld.%ld", pages[k], P);
        snprintf(mode, sizeof mode, "rollout, paged KV (page %ld)", pages[k]);
        row_cmp(cell, NSERVE, P, mode, &b, single, cpu, now_s() - tc, 0);
        recs_free(&b);
        tc = now_s();
        recs r = {0};
        replay(pe, q, NSERVE, comp, 16, &r);
        snprintf(cell, sizeof cell, "kv%ld.%ld.16", pages[k], P);
        snprintf(mode, sizeof mode, "replay chunk 16, paged KV (page %ld)", pages[k]);
        row_cmp(cell, NSERVE, P, mode, &r, single, cpu, now_s() - tc, 0);
        recs_free(&r);
        if (pages[k] == 17) {
            /* every sequence evicted once: at decode step 1 or 2, back one or
             * two steps later, by recompute (even) or from a snapshot (odd) */
            ls_run_eviction ev[NSERVE];
            for (long i = 0; i < NSERVE; i++) {
                long at = 1 + (i / 2) % 2;
                ev[i] = (ls_run_eviction){i, at, at + 1 + i % 2, i % 2 ? LS_RESUME_SNAPSHOT : LS_RESUME_RECOMPUTE};
            }
            ls_rollout_opts_default(&o);
            o.evictions = ev;
            o.n_evictions = NSERVE;
            o.stats = &st;
            tc = now_s();
            recs x = {0};
            group_run(pe, q->s, NSERVE, &GREEDY, &o, NULL, &x);
            snprintf(cell, sizeof cell, "pre-kv17.%ld", P);
            snprintf(mode, sizeof mode, "forced preemption, paged KV (page 17): %ld evictions, %ld recomputed, "
                     "%ld restored", st.evictions, st.recomputed, st.restored);
            row_cmp(cell, NSERVE, P, mode, &x, single, cpu, now_s() - tc, 0);
            recs_free(&x);
        }
        ls_engine_destroy(pe);
    }
    /* prefix reuse, at any length and at aligned boundaries */
    for (int a = 0; a < 2; a++) {
        ls_rollout_opts_default(&o);
        o.prefix_cache = a ? LS_PREFIX_CACHE_ALIGNED : LS_PREFIX_CACHE_ANY;
        o.prefix_block = prefix_block(P);
        o.stats = &st;
        double tc = now_s();
        recs x = {0};
        group_run(g, q->s, NSERVE, &GREEDY, &o, NULL, &x);
        snprintf(cell, sizeof cell, "pfx-%s.%ld", a ? "al" : "any", P);
        if (a)
            snprintf(mode, sizeof mode, "prefix reuse aligned (block %ld): %ld positions reused", prefix_block(P),
                     st.positions_reused);
        else
            snprintf(mode, sizeof mode, "prefix reuse any: %ld positions reused", st.positions_reused);
        row_cmp(cell, NSERVE, P, mode, &x, single, cpu, now_s() - tc, 0);
        recs_free(&x);
    }
    /* seeded preemption (--preempt seeded:7) */
    {
        ls_run_eviction *plan = NULL;
        long n_plan = 0;
        TRY(ls_run_preempt_plan(7, NSERVE, GEN, &plan, &n_plan, E_));
        ls_rollout_opts_default(&o);
        o.evictions = plan;
        o.n_evictions = n_plan;
        o.stats = &st;
        double tc = now_s();
        recs x = {0};
        group_run(g, q->s, NSERVE, &GREEDY, &o, NULL, &x);
        snprintf(cell, sizeof cell, "preempt.%ld", P);
        snprintf(mode, sizeof mode, "seeded preemption (seed 7): %ld evictions, %ld recomputed, %ld restored",
                 st.evictions, st.recomputed, st.restored);
        row_cmp(cell, NSERVE, P, mode, &x, single, cpu, now_s() - tc, 0);
        recs_free(&x);
        free(plan);
    }
    /* GRPO: the prompts of sequences 0 and 1 as ids 100 and 101, 8 samples
     * each (sample ids 800..815); the reference is each sample alone */
    {
        ls_sequence pr[GRPO_PROMPTS], smp[GRPO_PROMPTS * GRPO_N];
        for (long i = 0; i < GRPO_PROMPTS; i++) pr[i] = (ls_sequence){100 + (uint32_t)i, q->s[i].tokens, P, P};
        TRY(ls_run_group_sequences(pr, GRPO_PROMPTS, GRPO_N, smp, E_));
        double tc = now_s();
        recs alone = {0}, x = {0}, xc = {0};
        for (long i = 0; i < GRPO_PROMPTS * GRPO_N; i++)
            TRY(ls_run_rollout(g, &smp[i], 1, GEN, &SEEDED, NULL, recs_sink, &alone, E_));
        recs_sort(&alone);
        ls_rollout_opts_default(&o);
        o.samples_per_prompt = GRPO_N;
        o.stats = &st;
        int32_t cc[GRPO_PROMPTS * GRPO_N * GEN];
        group_run(g, pr, GRPO_PROMPTS, &SEEDED, &o, cc, &x);
        if (cpu) {
            ls_engine *ce = make_engine(m, "cpu", GRPO_PROMPTS * GRPO_N, P + GEN, 256, 16);
            group_run(ce, pr, GRPO_PROMPTS, &SEEDED, &o, NULL, &xc);
            ls_engine_destroy(ce);
        }
        snprintf(cell, sizeof cell, "grpo8.%ld", P);
        snprintf(mode, sizeof mode, "GRPO %d prompts x %d samples (seeded): %ld forks, %ld and %ld distinct "
                 "completions%s", GRPO_PROMPTS, GRPO_N, st.forks, distinct(cc, GRPO_N),
                 distinct(cc + GRPO_N * GEN, GRPO_N), cpu ? "; vs CPU: the same group" : "");
        row_cmp(cell, GRPO_PROMPTS * GRPO_N, P, mode, &x, &alone, cpu ? &xc : NULL, now_s() - tc, 0);
        recs_free(&alone);
        recs_free(&x);
        recs_free(&xc);
    }
}

int main(int argc, char **argv)
{
    const char *usage = "usage: gpu_matrix CHECKPOINT_DIR OUT.md [--quick | --prompts P,P,...] "
                        "[--serving-only] [--fp8 dequant|w8a8] [--tier portable|tc] [--gdn-form chunk-aligned]\n";
    if (argc < 3) {
        fputs(usage, stderr);
        return 2;
    }
    int quick = 0, prompts = 0, want[4] = {1, 1, 1, 1}, mixed_on = 1, serving_only = 0, tier_given = 0;
    const char *fp8 = NULL;
    long Ps[4] = {8, 64, 256, 1024}, Ns[4] = {1, 4, 16, 64};
    for (int a = 3; a < argc; a++) {
        if (strcmp(argv[a], "--quick") == 0 && !quick && !prompts) {
            quick = 1;
            want[2] = want[3] = 0;
        } else if (strcmp(argv[a], "--prompts") == 0 && a + 1 < argc && !quick && !prompts) {
            prompts = 1;
            mixed_on = 0;
            for (int i = 0; i < 4; i++) want[i] = 0;
            char *arg = argv[++a], *list = arg, *end;
            for (;;) {
                long v = strtol(list, &end, 10);
                int hit = 0;
                for (int i = 0; i < 4; i++)
                    if (end != list && Ps[i] == v) want[i] = hit = 1;
                if (!hit || (*end != '\0' && *end != ',')) {
                    fprintf(stderr, "gpu_matrix: --prompts: '%s' is not a list of 8, 64, 256, 1024\n", arg);
                    return 2;
                }
                if (*end == '\0') break;
                list = end + 1;
            }
        } else if (strcmp(argv[a], "--serving-only") == 0 && !serving_only) {
            serving_only = 1;
        } else if (strcmp(argv[a], "--fp8") == 0 && a + 1 < argc && !fp8) {
            fp8 = argv[++a];
            if (strcmp(fp8, "dequant") != 0 && strcmp(fp8, "w8a8") != 0) {
                fprintf(stderr, "gpu_matrix: --fp8 '%s': expected dequant or w8a8\n", fp8);
                return 2;
            }
            g_w8a8 = strcmp(fp8, "w8a8") == 0;
        } else if (strcmp(argv[a], "--tier") == 0 && a + 1 < argc && !tier_given) {
            tier_given = 1;
            ls_error err;
            if (ls_run_parse_tier("--tier", argv[++a], &g_tier, &err) != LS_OK) {
                fprintf(stderr, "gpu_matrix: %s\n", err.msg);
                return 2;
            }
            if (g_tier == LS_TIER_FAST) {
                fprintf(stderr, "gpu_matrix: --tier fast: the matrix checks the strict tiers (portable, tc)\n");
                return 2;
            }
            g_tc = g_tier == LS_TIER_TC;
        } else if (strcmp(argv[a], "--gdn-form") == 0 && a + 1 < argc && !g_gdn) {
            ls_error err;
            if (ls_run_parse_gdn_form("--gdn-form", argv[++a], &g_gdn, &err) != LS_OK) {
                fprintf(stderr, "gpu_matrix: %s\n", err.msg);
                return 2;
            }
        } else {
            fputs(usage, stderr);
            return 2;
        }
    }
    /* LS_MATRIX_BACKEND=cpu runs the driver itself on a machine without a GPU. */
    const char *gb = getenv("LS_MATRIX_BACKEND") ? getenv("LS_MATRIX_BACKEND") : "cuda";
    if (g_tc && fp8) {
        fprintf(stderr, "gpu_matrix: --tier tc: the tc tier runs bf16 weights only (its FP8 GEMMs are not built); "
                "leave out --fp8 %s\n", fp8);
        return 2;
    }
    if (g_tc && strcmp(gb, "cuda") != 0) {
        fprintf(stderr, "gpu_matrix: --tier tc runs on the cuda backend only (LS_MATRIX_BACKEND is %s)\n", gb);
        return 2;
    }
    ls_checkpoint *ck = NULL;
    ls_model *m = NULL;
    TRY(ls_checkpoint_open(argv[1], &ck, E_));
    TRY(ls_model_open(ck, &m, E_));
    if (fp8 && !m->cfg.fp8) {
        fprintf(stderr, "gpu_matrix: --fp8 applies to FP8 checkpoints only: %s/config.json has no "
                "quantization_config\n", argv[1]);
        return 2;
    }
    if (g_tc && m->cfg.fp8) {
        fprintf(stderr, "gpu_matrix: --tier tc: %s is an FP8 checkpoint; the tc tier runs bf16 weights only\n",
                argv[1]);
        return 2;
    }
    if (m->cfg.fp8)
        printf("gpu_matrix: FP8 checkpoint (%ld e4m3 matrices), every engine in %s mode\n", m->n_fp8,
               g_w8a8 ? "w8a8" : "dequant");
    long V = m->cfg.vocab;
    g_md = fopen(argv[2], "w");
    if (!g_md) { perror(argv[2]); return 2; }
    if (g_tc)
        fprintf(g_md, "Tier: tc (every linear through a cuBLASLt algorithm qualified row-invariant for %d rows "
                "per call and pinned; docs/tensor-core-tier.md). Every cell is compared bitwise with the same "
                "sequences run alone on this tc engine. The CPU column does not apply: the tc tier is "
                "deterministic and batch-invariant but not equal to the CPU reference (tensor cores accumulate "
                "in the hardware's order, not the reference's; docs/tensor-core-tier.md §1), so no CPU engine "
                "runs.\n\n", LS_RUN_TC_ROWS);
    else
        fprintf(g_md, "Tier: portable (CUDA = CPU bit for bit). Every cell is compared bitwise with the same "
                "sequences run alone on this engine and on the CPU reference engine.\n\n");
    if (g_gdn)
        fprintf(g_md, "Gated DeltaNet form: chunk-aligned (chunks of 64 at absolute positions; %s). The replays "
                "add chunks of 63 and 65, which straddle its chunk boundaries.\n\n",
                g_tc ? "the tensor-core kernels, docs/tensor-core-tier.md §3" : "docs/numerics.md §5.1");
    fprintf(g_md, "| cell | sequences | prompt | mode | records | vs single-sequence run | vs CPU engine | s |\n"
                  "|---|---|---|---|---|---|---|---|\n");
    double t0 = now_s();
    ls_engine *g = make_engine(m, gb, MAXN, 1024 + GEN, 256, 16);
    /* the CPU reference engines: none on the tc tier (not CPU-equal) */
    ls_engine *c = NULL, *cw[CPU_WORKERS] = {NULL};
    if (!g_tc) {
        c = make_engine(m, "cpu", 8, 256 + GEN, 256, 16);
        for (int w = 0; w < CPU_WORKERS; w++) cw[w] = make_engine(m, "cpu", 1, 1024 + GEN, 256, 1);
    }
    int32_t *comp = calloc(MAXN * GEN, sizeof(int32_t)), *comp_b = calloc(MAXN * GEN, sizeof(int32_t));
    /* mixed prefill + decode, joining and leaving: on a contiguous engine
     * (the matrix) and on a paged one (the serving cells) */
    if (mixed_on) {
        long plens[3] = {8, 64, quick ? 64 : 256};
        int nseq = 9;
        double tc = now_s();
        recs mc = {0}, single = {0};
        if (!g_tc) {
            ls_engine *cm = make_engine(m, "cpu", 4, plens[2] + GEN, 64, 16);
            mixed(cm, m, 500, nseq, plens, &mc);
            ls_engine_destroy(cm);
        }
        const recs *mcpu = g_tc ? NULL : &mc;
        for (int i = 0; i < nseq; i++) {
            seqset one;
            seqset_make(&one, 500 + (uint32_t)i, 1, plens[i % 3], V);
            int32_t cc[GEN];
            TRY(ls_run_rollout(g, one.s, 1, GEN, &GREEDY, cc, recs_sink, &single, E_));
            free(one.tok);
            free(one.s);
        }
        recs_sort(&single);
        double t_ref = now_s() - tc;
        for (int paged = serving_only; paged < 2; paged++) {
            tc = now_s();
            recs mg = {0};
            /* 4 slots and 64 rows a step, so that sequences queue for slots */
            ls_engine *gm = make_engine_kv(m, gb, 4, plens[2] + GEN, 64, 16, paged ? 17 : 0);
            mixed(gm, m, 500, nseq, plens, &mg);
            ls_engine_destroy(gm);
            if (paged)
                row_cmp("mixed-kv17", 9, 0, "continuous batching, paged KV (page 17): mixed, join/leave (4 slots, "
                        "64 rows)", &mg, &single, mcpu, now_s() - tc + t_ref, 0);
            else
                row("mixed", 9, 0, "continuous batching: mixed, join/leave (4 slots, 64 rows)", &mg, &single, mcpu,
                    now_s() - tc + t_ref);
            recs_free(&mg);
        }
        recs_free(&mc);
        recs_free(&single);
    }
    for (int pi = 0; pi < 4; pi++) {
        if (!want[pi]) continue;
        long P = Ps[pi];
        seqset q;
        seqset_make(&q, 0, MAXN, P, V);
        double ts = now_s();
        recs single = {0}, cpu = {0};
        const recs *cref = g_tc ? NULL : &cpu; /* the CPU reference, if it applies */
        /* the serving cells alone need the single runs of their sequences only */
        long ns = serving_only ? NSERVE : MAXN;
        singles(g, &q, ns, &single, comp);
        if (cref) {
            cpu_singles(cw, CPU_WORKERS, &q, ns, &cpu); /* the CPU engine, each sequence alone */
            row("single", ns, P, "CPU engine, each sequence alone (vs the CUDA ones)", &cpu, &single, NULL,
                now_s() - ts);
        }
        for (int ni = 0; ni < 4 && !serving_only; ni++) {
            long N = Ns[ni];
            char cell[64];
            snprintf(cell, sizeof cell, "r%ld.%ld", N, P);
            double tc = now_s();
            recs b = {0};
            rollout(g, &q, N, &b, comp_b);
            row(cell, N, P, "rollout (prefill+decode)", &b, &single, cref, now_s() - tc);
            recs_free(&b);
            /* whole, then chunks (1 for short prompts only; 63 and 65 in the chunk-aligned GDN form) */
            long chunks[6] = {P + GEN, 128, 65, 63, 16, 1};
            for (int k = 0; k < 6; k++) {
                if ((chunks[k] >= P + GEN && k > 0) || (chunks[k] == 1 && P > 64) ||
                    ((chunks[k] == 63 || chunks[k] == 65) && !g_gdn))
                    continue;
                tc = now_s();
                recs r = {0};
                replay(g, &q, N, comp, chunks[k], &r);
                char mode[48];
                if (k == 0) snprintf(mode, sizeof mode, "replay whole");
                else snprintf(mode, sizeof mode, "replay chunk %ld", chunks[k]);
                snprintf(cell, sizeof cell, "p%ld.%ld.%ld", N, P, chunks[k]);
                row(cell, N, P, mode, &r, &single, cref, now_s() - tc);
                recs_free(&r);
            }
            if (cref && P <= 64 && N == 4) { /* the CPU engine on the same batch */
                tc = now_s();
                recs cb = {0};
                int32_t cc[4 * GEN];
                rollout(c, &q, 4, &cb, cc);
                row("cpu-batch", 4, P, "CPU rollout, batch of 4", &cb, &single, cref, now_s() - tc);
                recs_free(&cb);
            }
        }
        recs s16 = {0}, c16 = {0};
        recs_pick(&single, 0, NSERVE, &s16);
        recs_pick(&cpu, 0, NSERVE, &c16);
        serving(g, gb, m, &q, &s16, cref ? &c16 : NULL, comp);
        recs_free(&s16);
        recs_free(&c16);
        recs_free(&single);
        recs_free(&cpu);
        free(q.tok);
        free(q.s);
    }
    ls_engine_destroy(g);
    ls_engine_destroy(c);
    for (int w = 0; w < CPU_WORKERS; w++) ls_engine_destroy(cw[w]);
    fprintf(g_md, "\n%d cells, %d failed, %.0f s\n", g_cells, g_fail, now_s() - t0);
    fclose(g_md);
    printf("gpu_matrix: %d cells, %d failed, %.0f s\n", g_cells, g_fail, now_s() - t0);
    free(comp), free(comp_b);
    ls_model_close(m);
    ls_checkpoint_close(ck);
    return g_fail ? 1 : 0;
}
