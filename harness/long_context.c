/* lockstep — long-context rollout = replay (harness/long_context runs it and
 * writes the report).
 *
 * One prompt of P tokens (8k, 32k, 128k on a GPU) and N new greedy tokens:
 * a rollout whose prefill runs R rows a step, then a replay of prompt +
 * completion in each chunk size asked for ("whole": one step for the whole
 * sequence). Each run goes through the run layer's drivers (ls_run_rollout,
 * ls_run_replay: what `lockstep run` calls) on an engine of its own whose
 * max_rows is the run's rows per step, and writes its trace with the trace
 * writer, one frame per engine step, as `lockstep run` does; the script then
 * compares each replay's trace with the rollout's (`lockstep compare`).
 *
 * The model: --checkpoint as `lockstep run` takes it, a directory or a
 * synth: spec (synth:qwen3-next-80b-a3b,seed=7,layers=32): that checkpoint
 * generated in memory, each backend generating its matrices itself (on CUDA
 * on the device: Qwen3-Next-80B-A3B's ~160 GB are never on disk) with
 * lockstep synth's values, fingerprinted as the written checkpoint would be.
 * So a release shape runs with as many layers as the device holds.
 *
 * What it measures, per run: wall time of the driver, process peak RSS
 * (VmHWM, reset before each run through /proc/self/clear_refs), the CUDA
 * arena's high-water mark (ls_backend_cuda_arena_usage: weights, caches,
 * work buffers, scratch), frames, records, digests (carried-state ones
 * apart: they come on the state_digest_every cadence), the largest frame
 * (uncompressed; the format's limit is 256 MiB) and the trace's size.
 *
 *   long_context OUT_DIR --prompt P --checkpoint DIR|synth:PRESET,seed=N[,layers=L]
 *                [--backend cpu|cuda] [--new N] [--rollout-rows R] [--chunks C,C,...]
 *                [--state-digest-every N] [--threads T]
 *
 * Defaults: --backend cuda, --new 4, --rollout-rows 4096 (capped at P),
 * --chunks 4096,whole, --state-digest-every 64 (the CLI's), --threads 16 (the
 * CPU backend's workers). OUT_DIR receives rollout.trace, replay-C.trace for
 * each chunk C and runs.md (the table of the runs). Exit status 0, or 2 with
 * one line on stderr (a run that does not fit says so: "out of GPU memory",
 * the bytes asked). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include "backend/backend_cuda.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "run/run.h"
#include "trace/trace.h"

#define MAX_CHUNKS 8

static void die(const char *what, const ls_error *err)
{
    fprintf(stderr, "long_context: %s: %s\n", what, err->msg);
    exit(2);
}

#define TRY(what, call) do { ls_error e_; ls_error_clear(&e_); if ((call) != LS_OK) die(what, &e_); } while (0)
#define E_ (&e_)

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- peak RSS ----------------------------------------------------------------------------- */

static long status_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            v = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* Resets the peak RSS to the current one; 0 when the kernel does not let us
 * (then the figures are the process's peak so far). */
static int peak_reset(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

static double peak_gib(void)
{
    long kib = status_kib("VmHWM");
    if (kib < 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        kib = ru.ru_maxrss;
    }
    return (double)kib / (1024.0 * 1024.0);
}

/* ---- the model ------------------------------------------------------------------------------- */

typedef struct model_src {
    const char *checkpoint;    /* a directory, or synth:PRESET,seed=N[,...] */
    ls_checkpoint *ck;
    ls_model *m;
    char fingerprint[65];      /* the trace header's model_fingerprint */
    char desc[256];
} model_src;

/* The checkpoint as `lockstep run` opens it (ls_run_checkpoint_open): a
 * directory, or a synth: spec generated in memory, whose matrices each
 * backend generates itself (on CUDA on the device: Qwen3-Next-80B-A3B's
 * ~160 GB are never on disk) with lockstep synth's values, so its Merkle
 * root is the written checkpoint's. */
static void model_open(model_src *s)
{
    TRY(s->checkpoint, ls_run_checkpoint_open(s->checkpoint, &s->ck, &s->m, E_));
    ls_fingerprint fp;
    TRY("fingerprint", ls_run_fingerprint(s->ck, LS_RUN_CACHE_OFF, 0, &fp, E_));
    ls_digest_to_hex(&fp.merkle_root, s->fingerprint);
    ls_fingerprint_free(&fp);
    /* a generated one's spec spelled out, or the directory's name: no machine paths in reports */
    const char *name = ls_checkpoint_dir(s->ck), *base = strrchr(name, '/');
    if (!ls_checkpoint_generated(s->ck) && base && base[1]) name = base + 1;
    long attn = 0;
    for (long l = 0; l < s->m->cfg.n_layers; l++) attn += s->m->cfg.is_attention[l];
    snprintf(s->desc, sizeof s->desc, "checkpoint %s (%ld layers, %ld of them attention; Merkle root %.16s...)",
             name, s->m->cfg.n_layers, attn, s->fingerprint);
}

/* An engine of max_rows rows, one slot of cap positions; *be_out: its backend
 * (owned by the engine). */
static ls_engine *engine_open(const model_src *s, const char *backend, int threads, long rows, long cap,
                              long every, ls_backend **be_out)
{
    ls_backend *be = NULL;
    TRY("backend", ls_run_backend_create(backend, threads, 0, &be, E_));
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = rows;
    o.state_digest_every = every;
    ls_engine *e = NULL;
    char what[96];
    snprintf(what, sizeof what, "engine of %ld rows, %ld positions", rows, cap);
    TRY(what, ls_engine_create(s->m, be, &o, 1, cap, &e, E_));
    *be_out = be;
    return e;
}

/* ---- the trace sink ---------------------------------------------------------------------------- */

typedef struct sink_ctx {
    ls_trace_writer *w;
    long frames, records, digests, state_digests, max_frame_records;
    double max_frame_mib;      /* uncompressed bytes of the largest frame */
    int topk;
} sink_ctx;

static ls_status sink(void *ctx, ls_frame_kind kind, const ls_trace_record *r, long n, ls_error *err)
{
    sink_ctx *c = ctx;
    LS_TRY(ls_trace_writer_begin_frame(c->w, kind, err));
    double bytes = 0;
    for (long i = 0; i < n; i++) {
        LS_TRY(ls_trace_writer_add(c->w, &r[i], err));
        c->digests += r[i].n_digests;
        for (uint32_t k = 0; k < r[i].n_digests; k++)
            c->state_digests += r[i].digests[k].kind == LS_DIGEST_GDN_STATE ||
                                r[i].digests[k].kind == LS_DIGEST_CONV_STATE;
        bytes += 28.0 + 8.0 * c->topk + 36.0 * r[i].n_digests; /* docs/trace-format.md §5 */
    }
    LS_TRY(ls_trace_writer_end_frame(c->w, err));
    c->frames++;
    c->records += n;
    if (n > c->max_frame_records) c->max_frame_records = n;
    if (bytes / (1024.0 * 1024.0) > c->max_frame_mib) c->max_frame_mib = bytes / (1024.0 * 1024.0);
    return LS_OK;
}

/* ---- one run ------------------------------------------------------------------------------------ */

typedef struct run_cfg {
    const char *out_dir, *backend;
    int threads;
    long P, N, every;
    const int32_t *tokens;     /* [P + N]: the prompt, then the rollout's completion */
} run_cfg;

static FILE *g_md;
static int g_peak_resets;

static void run_one(const model_src *s, const run_cfg *rc, int rollout, long chunk, int32_t *completion)
{
    long L = rc->P + rc->N - 1; /* positions the model processes */
    long rows = rollout ? chunk : chunk > L ? L : chunk;
    char name[64], path[4096];
    if (rollout) snprintf(name, sizeof name, "rollout");
    else if (chunk >= L) snprintf(name, sizeof name, "replay-whole");
    else snprintf(name, sizeof name, "replay-%ld", chunk);
    snprintf(path, sizeof path, "%s/%s.trace", rc->out_dir, name);
    ls_backend *be;
    ls_engine *e = engine_open(s, rc->backend, rc->threads, rows, L, rc->every, &be);
    size_t arena_used0, arena_cap;
    ls_backend_cuda_arena_usage(be, &arena_used0, &arena_cap);
    /* the header, as lockstep run writes it (no manifest: "") */
    json_t *batch = json_pack("[{s:i, s:I, s:I}]", "id", 0, "prompt_len", (json_int_t)rc->P, "n_tokens",
                              (json_int_t)(rollout ? rc->P : rc->P + rc->N));
    json_t *params = json_pack("{s:s, s:{s:s}, s:o, s:o, s:s, s:o, s:s, s:s, s:n, s:I, s:I, s:s}", "mode",
                               rollout ? "rollout" : "replay", "sampling", "kind", "greedy", "max_new_tokens",
                               rollout ? json_integer(rc->N) : json_null(), "chunk",
                               rollout ? json_null() : chunk >= L ? json_string("whole") : json_integer(chunk),
                               "batch_order", "as-given", "batch", batch, "activations", "bf16", "backend",
                               rc->backend, "perturbation", "state_digest_every", (json_int_t)rc->every,
                               "max_rows", (json_int_t)rows, "model", s->desc);
    char *params_text = params ? json_dumps(params, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (!params_text) { fprintf(stderr, "long_context: out of memory\n"); exit(2); }
    ls_trace_header h;
    char engine_name[64];
    ls_run_trace_header(e, rollout ? "rollout" : "replay", rc->backend, s->fingerprint, "", params_text,
                        rc->every, 1, &h, engine_name);
    sink_ctx sc;
    memset(&sc, 0, sizeof sc);
    sc.topk = h.topk;
    TRY(path, ls_trace_writer_open(path, &h, &sc.w, E_));
    g_peak_resets += peak_reset();
    static const ls_sampling greedy = {LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};
    ls_error err;
    ls_error_clear(&err);
    double t0 = now_s();
    ls_status st;
    if (rollout) {
        ls_sequence q = {0, rc->tokens, rc->P, rc->P};
        st = ls_run_rollout(e, &q, 1, rc->N, &greedy, completion, sink, &sc, &err);
    } else {
        ls_sequence q = {0, rc->tokens, rc->P + rc->N, rc->P};
        st = ls_run_replay(e, &q, 1, chunk, sink, &sc, &err);
    }
    double secs = now_s() - t0;
    double rss = peak_gib();
    size_t arena_used;
    ls_backend_cuda_arena_usage(be, &arena_used, &arena_cap);
    if (st != LS_OK) {
        ls_trace_writer_abort(sc.w);
        die(name, &err);
    }
    TRY(path, ls_trace_writer_close(sc.w, E_));
    ls_engine_destroy(e);
    free(params_text);
    json_decref(params);
    struct stat sb;
    double trace_mib = stat(path, &sb) == 0 ? (double)sb.st_size / (1024.0 * 1024.0) : -1;
    char dev[64] = "—";
    if (arena_cap)
        snprintf(dev, sizeof dev, "%.2f (%.2f after creation)", (double)arena_used / (1 << 30),
                 (double)arena_used0 / (1 << 30));
    fprintf(g_md, "| %s | %ld | %ld | %.1f | %.0f | %s | %.2f | %ld | %ld | %.1f | %ld | %.2f | %.1f | %.0f |\n",
            name, rows, sc.frames, secs, (double)L / secs, dev, rss, sc.records, sc.digests,
            (double)sc.digests / (double)(sc.records ? sc.records : 1), sc.state_digests, sc.max_frame_mib,
            trace_mib, trace_mib * 1024.0 * 1024.0 / (double)L);
    fflush(g_md);
    printf("long_context: %-13s rows %-6ld %6.1f s  %7.0f positions/s  peak RSS %.2f GiB  device %s GiB  "
           "trace %.1f MiB (%ld frames, largest %.2f MiB)\n", name, rows, secs, (double)L / secs, rss, dev,
           trace_mib, sc.frames, sc.max_frame_mib);
    fflush(stdout);
}

/* ---- main -------------------------------------------------------------------------------------- */

static long arg_long(const char *flag, const char *v, long lo, long hi)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "long_context: %s '%s': expected an integer in %ld..%ld\n", flag, v, lo, hi);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv)
{
    const char *usage = "usage: long_context OUT_DIR --prompt P --checkpoint DIR|synth:PRESET,seed=N[,layers=L]\n"
                        "                    [--backend cpu|cuda] [--new N] [--rollout-rows R] [--chunks C,C,...]\n"
                        "                    [--state-digest-every N] [--threads T]\n";
    if (argc < 2 || argv[1][0] == '-') {
        fputs(usage, stderr);
        return 2;
    }
    model_src s;
    memset(&s, 0, sizeof s);
    run_cfg rc = {argv[1], "cuda", 16, 0, 4, 64, NULL};
    long rollout_rows = 4096, chunks[MAX_CHUNKS] = {4096, 0}; /* 0 = whole */
    int n_chunks = 2;
    for (int a = 2; a < argc; a++) {
        const char *f = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (!v) {
            fputs(usage, stderr);
            return 2;
        }
        a++;
        if (!strcmp(f, "--prompt")) rc.P = arg_long(f, v, 1, 1L << 30);
        else if (!strcmp(f, "--checkpoint")) s.checkpoint = v;
        else if (!strcmp(f, "--backend")) rc.backend = v;
        else if (!strcmp(f, "--new")) rc.N = arg_long(f, v, 1, 1L << 20);
        else if (!strcmp(f, "--rollout-rows")) rollout_rows = arg_long(f, v, 1, 1L << 30);
        else if (!strcmp(f, "--state-digest-every")) rc.every = arg_long(f, v, 1, 1L << 30);
        else if (!strcmp(f, "--threads")) rc.threads = (int)arg_long(f, v, 1, 1024);
        else if (!strcmp(f, "--chunks")) {
            n_chunks = 0;
            for (const char *p = v; *p;) {
                char *end;
                long c = strncmp(p, "whole", 5) == 0 ? 0 : strtol(p, &end, 10);
                if (c == 0 && strncmp(p, "whole", 5) == 0) end = (char *)p + 5;
                if ((c < 1 && strncmp(p, "whole", 5) != 0) || (*end && *end != ',') || n_chunks == MAX_CHUNKS) {
                    fprintf(stderr, "long_context: --chunks '%s': expected up to %d chunk sizes >= 1 or 'whole', "
                            "comma-separated\n", v, MAX_CHUNKS);
                    return 2;
                }
                chunks[n_chunks++] = c;
                p = *end ? end + 1 : end;
            }
        } else {
            fputs(usage, stderr);
            return 2;
        }
    }
    if (rc.P < 1 || !s.checkpoint || n_chunks < 1) {
        fputs(usage, stderr);
        return 2;
    }
    if (strcmp(rc.backend, "cpu") && strcmp(rc.backend, "cuda")) {
        fprintf(stderr, "long_context: --backend '%s': expected cpu or cuda\n", rc.backend);
        return 2;
    }
    model_open(&s);
    long L = rc.P + rc.N - 1;
    if (L > s.m->cfg.max_positions) {
        fprintf(stderr, "long_context: %ld prompt + %ld new tokens need %ld positions; the model's "
                "max_position_embeddings is %ld\n", rc.P, rc.N, L, s.m->cfg.max_positions);
        return 2;
    }
    if (rollout_rows > rc.P) rollout_rows = rc.P;
    /* the prompt: counter-based tokens of the vocabulary (as gpu_matrix) */
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(rc.P + rc.N));
    if (!tok) { fprintf(stderr, "long_context: out of memory\n"); return 2; }
    for (long i = 0; i < rc.P; i++) {
        uint64_t x = (uint64_t)(i + 1) ^ ((uint64_t)rc.P << 40);
        x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
        tok[i] = (int32_t)(x % (uint64_t)s.m->cfg.vocab);
    }
    rc.tokens = tok;
    if (mkdir(rc.out_dir, 0777) != 0 && errno != EEXIST) {
        perror(rc.out_dir);
        return 2;
    }
    char md[4096];
    snprintf(md, sizeof md, "%s/runs.md", rc.out_dir);
    g_md = fopen(md, "w");
    if (!g_md) { perror(md); return 2; }
    printf("long_context: %s; prompt %ld + %ld new tokens, backend %s\n", s.desc, rc.P, rc.N, rc.backend);
    fprintf(g_md, "- model: %s\n- prompt %ld tokens + %ld greedy new tokens (%ld positions); state digests every %ld "
            "positions\n\n", s.desc, rc.P, rc.N, L, rc.every);
    fprintf(g_md, "| run | rows per step | frames | s | positions/s | device GiB (CUDA arena high-water) | peak RSS "
            "GiB | records | digests | per record | carried-state digests | largest frame MiB | trace MiB | "
            "trace bytes per position |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    run_one(&s, &rc, 1, rollout_rows, tok + rc.P);
    for (int c = 0; c < n_chunks; c++) run_one(&s, &rc, 0, chunks[c] ? chunks[c] : L, NULL);
    fprintf(g_md, "\npeak RSS: %s\n", g_peak_resets == 1 + n_chunks ? "of each run alone (VmHWM reset before it)"
                                                                    : "of the process so far (VmHWM could not be reset)");
    fclose(g_md);
    free(tok);
    ls_model_close(s.m);
    ls_checkpoint_close(s.ck);
    return 0;
}
