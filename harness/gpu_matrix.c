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
 *   gpu_matrix CHECKPOINT_DIR OUT.md [--quick | --prompts P,P,...] [--fp8 dequant|w8a8]
 *
 * --quick: prompts 8 and 64 only. --prompts: only these prompt lengths (of
 * 8, 64, 256, 1024) and no mixed cell, to run part of the matrix on its own.
 * --fp8 (an FP8 checkpoint only): the FP8 mode of every engine, CUDA and CPU
 * alike (engine opts fp8_w8a8); an FP8 checkpoint runs dequant without it,
 * as lockstep run does. */
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
        prompt(id0 + (uint32_t)i, P, V, q->tok + i * (P + GEN));
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

static void row(const char *cell, long N, long P, const char *mode, const recs *got, const recs *single,
                const recs *cpu, double secs)
{
    char m1[400], m2[400] = "not run (subset)";
    int d1 = recs_diff(got, single, 1, m1, sizeof m1);
    int d2 = 0;
    if (cpu) d2 = recs_diff(got, cpu, 1, m2, sizeof m2);
    g_cells++;
    if (d1 || d2) g_fail++;
    fprintf(g_md, "| %s | %ld | %ld | %s | %ld | %s | %s | %.1f |\n", cell, N, P, mode, got->n,
            d1 ? m1 : "equal", cpu ? (d2 ? m2 : "equal") : "—", secs);
    fflush(g_md);
    printf("%-6s %-8s N=%-3ld P=%-5ld %-22s records %-6ld single: %s; cpu: %s (%.1fs)\n",
           (d1 || d2) ? "FAIL" : "ok", cell, N, P, mode, got->n, d1 ? m1 : "equal",
           cpu ? (d2 ? m2 : "equal") : "-", secs);
    fflush(stdout);
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

static ls_engine *make_engine(const ls_model *m, const char *backend, long max_seqs, long max_len, long rows,
                              int threads)
{
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = rows;
    o.state_digest_every = 16;
    o.fp8_w8a8 = g_w8a8;
    ls_engine *e = NULL;
    TRY(ls_run_engine_open(m, backend, threads, &o, max_seqs, max_len, &e, E_));
    return e;
}

int main(int argc, char **argv)
{
    const char *usage = "usage: gpu_matrix CHECKPOINT_DIR OUT.md [--quick | --prompts P,P,...] "
                        "[--fp8 dequant|w8a8]\n";
    if (argc < 3) {
        fputs(usage, stderr);
        return 2;
    }
    int quick = 0, prompts = 0, want[4] = {1, 1, 1, 1}, mixed_on = 1;
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
        } else if (strcmp(argv[a], "--fp8") == 0 && a + 1 < argc && !fp8) {
            fp8 = argv[++a];
            if (strcmp(fp8, "dequant") != 0 && strcmp(fp8, "w8a8") != 0) {
                fprintf(stderr, "gpu_matrix: --fp8 '%s': expected dequant or w8a8\n", fp8);
                return 2;
            }
            g_w8a8 = strcmp(fp8, "w8a8") == 0;
        } else {
            fputs(usage, stderr);
            return 2;
        }
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
    if (m->cfg.fp8)
        printf("gpu_matrix: FP8 checkpoint (%ld e4m3 matrices), every engine in %s mode\n", m->n_fp8,
               g_w8a8 ? "w8a8" : "dequant");
    long V = m->cfg.vocab;
    g_md = fopen(argv[2], "w");
    if (!g_md) { perror(argv[2]); return 2; }
    fprintf(g_md, "| cell | sequences | prompt | mode | records | vs single-sequence run | vs CPU engine | s |\n"
                  "|---|---|---|---|---|---|---|---|\n");
    double t0 = now_s();
    /* LS_MATRIX_BACKEND=cpu runs the driver itself on a machine without a GPU. */
    const char *gb = getenv("LS_MATRIX_BACKEND") ? getenv("LS_MATRIX_BACKEND") : "cuda";
    ls_engine *g = make_engine(m, gb, MAXN, 1024 + GEN, 256, 16);
    ls_engine *c = make_engine(m, "cpu", 8, 256 + GEN, 256, 16);
    ls_engine *cw[CPU_WORKERS];
    for (int w = 0; w < CPU_WORKERS; w++) cw[w] = make_engine(m, "cpu", 1, 1024 + GEN, 256, 1);
    int32_t *comp = calloc(MAXN * GEN, sizeof(int32_t)), *comp_b = calloc(MAXN * GEN, sizeof(int32_t));
    /* mixed prefill + decode, joining and leaving */
    if (mixed_on) {
        long plens[3] = {8, 64, quick ? 64 : 256};
        int nseq = 9;
        double tc = now_s();
        recs mg = {0}, mc = {0}, single = {0};
        /* 4 slots and 64 rows a step, so that sequences queue for slots */
        ls_engine *gm = make_engine(m, gb, 4, plens[2] + GEN, 64, 16);
        ls_engine *cm = make_engine(m, "cpu", 4, plens[2] + GEN, 64, 16);
        mixed(gm, m, 500, nseq, plens, &mg);
        mixed(cm, m, 500, nseq, plens, &mc);
        ls_engine_destroy(gm);
        ls_engine_destroy(cm);
        for (int i = 0; i < nseq; i++) {
            seqset one;
            seqset_make(&one, 500 + (uint32_t)i, 1, plens[i % 3], V);
            int32_t cc[GEN];
            TRY(ls_run_rollout(g, one.s, 1, GEN, &GREEDY, cc, recs_sink, &single, E_));
            free(one.tok);
            free(one.s);
        }
        recs_sort(&single);
        row("mixed", 9, 0, "continuous batching: mixed, join/leave (4 slots, 64 rows)", &mg, &single, &mc, now_s() - tc);
        recs_free(&mg);
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
        singles(g, &q, MAXN, &single, comp);
        cpu_singles(cw, CPU_WORKERS, &q, MAXN, &cpu); /* the CPU engine, each sequence alone */
        row("single", MAXN, P, "CPU engine, each sequence alone (vs the CUDA ones)", &cpu, &single, NULL,
            now_s() - ts);
        for (int ni = 0; ni < 4; ni++) {
            long N = Ns[ni];
            char cell[64];
            snprintf(cell, sizeof cell, "r%ld.%ld", N, P);
            double tc = now_s();
            recs b = {0};
            rollout(g, &q, N, &b, comp_b);
            row(cell, N, P, "rollout (prefill+decode)", &b, &single, &cpu, now_s() - tc);
            recs_free(&b);
            long chunks[4] = {P + GEN, 128, 16, 1};
            int nch = P <= 64 ? 4 : 3;
            for (int k = 0; k < nch; k++) {
                if (chunks[k] >= P + GEN && k > 0) continue;
                tc = now_s();
                recs r = {0};
                replay(g, &q, N, comp, chunks[k], &r);
                char mode[48];
                if (k == 0) snprintf(mode, sizeof mode, "replay whole");
                else snprintf(mode, sizeof mode, "replay chunk %ld", chunks[k]);
                snprintf(cell, sizeof cell, "p%ld.%ld.%ld", N, P, chunks[k]);
                row(cell, N, P, mode, &r, &single, &cpu, now_s() - tc);
                recs_free(&r);
            }
            if (P <= 64 && N == 4) { /* the CPU engine on the same batch */
                tc = now_s();
                recs cb = {0};
                int32_t cc[4 * GEN];
                rollout(c, &q, 4, &cb, cc);
                row("cpu-batch", 4, P, "CPU rollout, batch of 4", &cb, &single, &cpu, now_s() - tc);
                recs_free(&cb);
            }
        }
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
