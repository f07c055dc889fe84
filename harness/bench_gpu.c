/* lockstep — performance of the portable strict CUDA tier on Qwen3-Next-80B-A3B
 * or another released config (--preset: qwen3.5-35b-a3b, ...), in bf16 or in
 * the FP8 release layout (--fp8 dequant|w8a8)
 * (harness/bench_gpu runs it; reports/perf-h200.md holds the results).
 *
 * What runs is the engine's own forward: ls_engine_step (src/engine) over the
 * operator table of the CUDA backend (ls_backend_cuda_create_opts), on a model
 * built from the release's config alone (the synth preset, truncated
 * to as many layers as fit the GPU, parsed by ls_model_parse_config;
 * ls_model_synthetic). Its matrices (~150 GB for all 48 layers of
 * Qwen3-Next-80B-A3B in bf16) are never read from disk: the backend fills
 * each on the device from a counter-based generator when the engine wraps it
 * (synthetic_weights_seed); the small parameters are generated on the host.
 * With --fp8 the preset's config carries the FP8 quantization_config: the
 * matrices the FP8 releases quantise (attention, GDN in/out projections,
 * routed and shared experts) are e4m3 bytes generated on the device with
 * block scales from the host, the rest bf16 (ls_model_synthetic); the engine
 * runs them dequantised (dequant) or against quantised activations (w8a8,
 * engine opts fp8_w8a8). Every step does all the engine does:
 * the input upload, every op, the digests of every trace layer, the logprob
 * summary's download; and what the run layer does after it (step_records):
 * each row's record, its next token the item's following one or the greedy
 * sample.
 *
 * The backend is wrapped in a timing decorator (bench_backend_timing.h): an
 * ls_backend whose ops forward to the CUDA backend and, for the breakdowns,
 * bracket each op with CUDA events, bucketed by op (and shape for linear and
 * rmsnorm), plus the time the device waits for the host between ops.
 *
 * Every figure is a ratio of two times measured in this one run (median of
 * repeats after warm-up; engine steps with their records by the host clock,
 * as a step returns only after its logprob summary and digests are on the
 * host; the rest by CUDA events):
 *   copy      device-to-device cudaMemcpy bandwidth (read + write bytes / time)
 *   decode    one step at batch 1 and 32 (context = the prefill length) vs the
 *             bytes it must read / copy bandwidth. Decode steps are timed as
 *             the run layer runs them (ls_engine_step_begin): step N begun,
 *             its records built, then step N - 1 ended, its digests having
 *             hashed on host threads while the device ran step N; the
 *             breakdown instruments steps run alone (ls_engine_step), whose
 *             digest_wait is the hashing a lone step waits for. The distinct
 *             experts per
 *             layer come from a routing census of the engine's router calls.
 *             At batch 1 the step is recorded and replayed as a CUDA graph by
 *             the engine (ls_engine_opts.step_graphs); blocks with the graphs
 *             off alternate with those, and the line "step graphs" gives both
 *             medians and their ratio (each block starts with nothing
 *             recorded: DECODE_WARM untimed steps run it as it is, then
 *             record each bank's graph). The line "programmatic launch"
 *             does the same with programmatic dependent launch on and off
 *             (kernels/launch.cuh: a kernel starts while the one before it
 *             ends, and loads weights before it waits for its inputs).
 *             Weight bytes as stored: 2 per bf16 element; FP8 1 per e4m3
 *             element + 4 per 128 x 128 block scale. With --fp8 the line also
 *             gives the bytes the same step reads in bf16 and the roofline
 *             then, so the two rooflines compare in one run
 *   breakdown per decode step: mixers, MoE experts, digests, the rest, and the
 *             device idle between ops (always; --breakdown adds every op)
 *   digest    the digest op's share of a decode step (default digest set); the
 *             step's median without digests (blocks of steps with and without
 *             them alternate; skipped, a digest op only zeroes its outs), whose
 *             difference is what the digests cost; and
 *             the step with carried-state digests at its position vs without:
 *             a decode item with last = 1 makes the engine digest every GDN and
 *             conv state at that step, exactly what state_digest_every = 1 does
 *             at every decode step (one engine serves both; a second engine
 *             would have to prefill its caches again)
 *   prefill   tokens/s of one step of `prefill` tokens; replay in chunks of 256;
 *             the batched prefill that brings 32 sequences to the context
 *   ttft      (--ttft LENS) per prompt length L of LENS and concurrency c of
 *             --ttft-conc (default 1,8), on an engine of its own opened after
 *             the rest (same max_rows; --layers or as many layers as fit it): c
 *             slots of max L + 2 + reps positions for the largest c. A slot's KV
 *             cache and states are allocated when the engine is created, for
 *             its whole capacity, so the largest point fitting at creation is
 *             what makes every point fit; each point's sequences leave their
 *             slots before the next joins (state zeroed), and a point whose
 *             step still runs out of device memory is printed as skipped.
 *             TTFT: the prefill of c fresh sequences of L-token prompts (each
 *             its own) as the engine serves it, from its first step until the
 *             last returns, every sequence's first-token record built
 *             then: the batched prefill's packing, one step of all c prompts
 *             when c L <= max_rows, else steps of max_rows / c tokens of each
 *             (the line says which, and the split); the joins (state zeroing)
 *             are not in it. Median of min(reps, 3) after a warm-up when one
 *             step, else one run. TPOT: median of reps decode steps of the c
 *             sequences after 2 untimed ones (context L + 2 ..; each step run alone,
 *             not pipelined), per token of
 *             one sequence; decode tok/s = c / TPOT. One line per (L, c) with
 *             the tier and the layers, all of them again as a table at the
 *             end; --only-ttft runs this table alone (no micro-benchmarks)
 *
 * Kernel micro-benchmarks (direct calls to kernels/ops.h, not a forward):
 *   gdn_scan  ls_cuda_gdn_recurrent over 8192 tokens, one layer, vs FLA's
 *             published 0.472 ms (harness/fla_gdn.py times FLA itself); then
 *             one decode step of 1 and of 32 sequences (ls_cuda_gdn_recurrent_batch)
 *   gdn_chunked  the chunk-aligned form (docs/numerics.md §5.1,
 *             ls_cuda_gdn_chunked) over the same 8192 tokens, one layer, vs
 *             FLA's published 0.472 ms; then one decode step of one sequence
 *             at rows 0, 31 and 63 of a chunk (63 folds the chunk into its
 *             state) and the state materialisation a digest at row 31 costs
 *   gdn_chunked_tc  the same rows for the chunk-aligned form on tensor cores
 *             (ls_cuda_gdn_chunked_tc, docs/tensor-core-tier.md §3): 8192
 *             tokens as a ratio to the recurrent and the portable chunk-aligned
 *             times of this run (and FLA's 0.472 ms), the decode step at rows
 *             0, 31, 63, a decode step of 32 sequences at rows 31 and 63 in
 *             one launch per kernel (ls_cuda_gdn_chunked_tc_decode, the
 *             engine's batched step) and the state materialisation at row 31; a shape the
 *             kernel refuses prints one skipped line
 *   --moe-plans  the MoE experts of one layer alone under every kernel plan of
 *             ls_cuda_moe_forward_plan, at 1 .. prefill tokens, vs the bytes of
 *             the distinct experts routed to / copy bandwidth (and whether every
 *             plan gives the same bits); with --fp8 the experts are e4m3 with
 *             block scales in that mode
 *   --profile-decode  after the batch-1 decode rows, 2 x (DECODE_WARM + 1)
 *             more batch-1 steps, the second half (step graphs replayed)
 *             between cudaProfilerStart and cudaProfilerStop: a profiler
 *             started with its collection off (Nsight Compute:
 *             ncu --profile-from-start off) sees one sequence's decode steps
 *             alone, each kernel of the step graph apart
 *   --linear-plans  the model's bf16 linears (lm_head, GDN in_proj_qkvz and
 *             out_proj, attention q) alone under every plan of
 *             ls_cuda_linear_plan at 1 .. prefill tokens, vs their weight bytes /
 *             copy bandwidth (and whether every plan gives the same bits)
 *
 *   bench_gpu [--preset NAME] [--fp8 dequant|w8a8] [--tier portable|tc|fast] [--layers N]
 *             [--prefill T] [--reps N] [--breakdown] [--moe-plans] [--linear-plans]
 *             [--profile-decode] [--ttft LENS [--ttft-conc LIST] [--only-ttft]] [--only-kernels]
 *             --only-kernels: the kernel micro-benchmarks alone (no engine)
 *             NAME: a synth preset (default qwen3-next-80b-a3b); T: the prefill
 *             length and the engines' max_rows (at least 32); LENS, LIST: comma
 *             lists of prompt lengths (e.g. 128,1024,8192,32768) and of
 *             concurrencies (1..32) */
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend_cuda.h"
#include "backend/cpu_ops.h"
#include "bench_backend_timing.h"
#include "engine/engine.h"
#include "run/run.h"
#include "io/json.h"
#include "ls_cuda.h"
#include "model/model.h"
#include "ops.h"
#include "synth/synth.h"

#define BMAX 32                /* the larger decode batch */
#define MAX_REPS 60
#define GIB ((size_t)1 << 30)

static ls_error g_err;

#define CK(call)                                                                             \
    do {                                                                                     \
        if ((call) != LS_OK) {                                                               \
            fprintf(stderr, "bench_gpu: %s:%d: %s\n", __FILE__, __LINE__, g_err.msg);        \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)
#define CU(call)                                                                             \
    do {                                                                                     \
        cudaError_t c_ = (call);                                                             \
        if (c_ != cudaSuccess) {                                                             \
            fprintf(stderr, "bench_gpu: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,         \
                    cudaGetErrorString(c_));                                                 \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

/* ---- timing ---------------------------------------------------------------------------- */

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static float median(float *v, int n)
{
    qsort(v, (size_t)n, sizeof(float), cmp_f);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* CUDA events around work on the default stream (the micro-benchmarks). */
typedef struct timer {
    cudaEvent_t a, b;
} timer;

static void tstart(timer *t)
{
    CU(cudaEventRecord(t->a, 0));
}

static float tstop(timer *t)
{
    float ms;
    CU(cudaEventRecord(t->b, 0));
    CU(cudaEventSynchronize(t->b));
    CU(cudaEventElapsedTime(&ms, t->a, t->b));
    return ms;
}

/* ---- device buffers of the micro-benchmarks (outside the engine) ----------------------- */

static void *dmalloc(size_t bytes)
{
    void *p;
    CU(cudaMalloc(&p, bytes));
    return p;
}

static uint64_t g_fill_seed = 0x5eed;

/* Values in [-scale, scale] without a kernel of the bench's own: bf16 pairs
 * from the device generator read as fp32 (ls_cuda_fill_uniform_bf16 says why
 * that gives finite values of the same spread). */
static void *dfill(size_t bytes, float scale)
{
    void *p = dmalloc(bytes);
    CK(ls_cuda_fill_uniform_bf16(p, bytes / 2, g_fill_seed++, scale, NULL, &g_err));
    return p;
}

/* Host values offset + scale u, u uniform in [-1, 1) (xorshift64*). */
static float *hfill(size_t n, float offset, float scale, uint64_t seed)
{
    float *v = malloc(sizeof(float) * n);
    if (!v) exit(2);
    uint64_t x = seed | 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        uint64_t r = x * 0x2545F4914F6CDD1Dull;
        v[i] = offset + scale * ((float)(r >> 40) * (1.0f / 8388608.0f) - 1.0f);
    }
    return v;
}

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---- the model ---------------------------------------------------------------------------- */

static const char *g_preset = "qwen3-next-80b-a3b";
static const char *g_fp8;      /* NULL bf16; "dequant" or "w8a8": the FP8 release layout */
static ls_tier g_tier;         /* --tier: tc pinned cuBLASLt GEMMs for the linears and lm_head, fast
                                  the default heuristic's per call and the other families' fast
                                  twins (backend_cuda.h tier) */

/* The preset's config with its first L layers (all with L = 0), through the
 * parser every checkpoint's config.json goes through; with --fp8 the FP8
 * release layout's (quantization_config, experts one by one). */
static void bench_config(long L, ls_model_config *cfg)
{
    ls_synth_config sc;
    CK(ls_synth_preset(g_preset, &sc, &g_err));
    if (g_fp8) {
        sc.fp8 = 1;
        sc.fused_experts = 0;
    }
    if (L) CK(ls_synth_config_truncate(&sc, L, &g_err));
    char *text;
    size_t len;
    CK(ls_synth_config_render(&sc, &text, &len, &g_err));
    json_t *j;
    CK(ls_json_load_buf(g_preset, text, len, &j, &g_err));
    CK(ls_model_parse_config(j, cfg, &g_err));
    json_decref(j);
    free(text);
}

/* Bytes the device reads for matrix m, split by kind (weight byte accounting
 * of every roofline): bf16 and fp32 elements as stored, FP8 one byte per
 * e4m3 element plus its fp32 block scales. */
typedef struct wsum {
    double wide;               /* bf16 / fp32 elements */
    double e4m3;               /* FP8 elements */
    double scales;             /* FP8 block scales */
    double as_bf16;            /* every element read as bf16 (the bf16 model of the same config) */
} wsum;

static double wsum_total(const wsum *s)
{
    return s->wide + s->e4m3 + s->scales;
}

static void wadd(wsum *s, const ls_wmat *m, double times)
{
    double n = (double)m->rows * (double)m->cols;
    if (ls_wtype_is_f8(m->wtype)) {
        s->e4m3 += times * n;
        s->scales += times * 4.0 * (double)LS_FP8_BLOCKS(m->rows) * (double)LS_FP8_BLOCKS(m->cols);
    } else {
        s->wide += times * n * (double)ls_wtype_bytes(m->wtype);
    }
    s->as_bf16 += times * n * 2.0;
}

static double wbytes(const ls_wmat *m)
{
    wsum s = {0};
    wadd(&s, m, 1.0);
    return wsum_total(&s);
}

/* One routed expert (gate, up, down), `times` times. */
static void expert_bytes(wsum *s, const ls_model_layer *ly, double times)
{
    wadd(s, &ly->exp_gate[0], times);
    wadd(s, &ly->exp_up[0], times);
    wadd(s, &ly->exp_down[0], times);
}

/* A layer's matrices read whatever the routing: all but the experts. */
static void dense_bytes(wsum *s, const ls_model_layer *ly)
{
    const ls_wmat *all[] = {&ly->router, &ly->sh_gate, &ly->sh_up, &ly->sh_down, &ly->sh_gate_w,
                            &ly->q_proj, &ly->k_proj, &ly->v_proj, &ly->o_proj, &ly->qkvz, &ly->ba,
                            &ly->in_qkv, &ly->in_z, &ly->in_b, &ly->in_a, &ly->conv,
                            &ly->out_proj};
    /* the matrices of the other mixer, and one of the two GDN projection
     * layouts, are empty (0 x 0) */
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) wadd(s, all[i], 1.0);
}

static double layer_bytes(const ls_model *m, long l)
{
    const ls_model_layer *ly = &m->layers[l];
    wsum s = {0};
    dense_bytes(&s, ly);
    expert_bytes(&s, ly, (double)m->cfg.n_experts);
    return wsum_total(&s);
}

/* Carried state of one sequence in layer l (device bytes): KV caches of cap
 * positions, or the GDN state and the conv state. */
static double state_bytes(const ls_model_config *c, long l, long cap)
{
    if (c->is_attention[l]) return 2.0 * c->n_kv_heads * cap * c->head_dim * 4;
    long conv_dim = 2 * c->lin_k_heads * c->lin_k_dim + c->lin_v_heads * c->lin_v_dim;
    return ((double)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim + (double)conv_dim * c->conv_kernel) * 4;
}

/* Layers that fit `budget` bytes of device memory besides embed, lm_head and
 * the work buffers of T rows, with `slots` sequences of cap positions. The
 * work estimate is generous (the engine's buffers, the MoE and digest
 * scratch); engine creation retries with a layer less if it is not. */
static long layers_that_fit(const ls_model *full, double budget, long T, long slots, long cap)
{
    const ls_model_config *c = &full->cfg;
    double per_row = 4.0 * (2 * c->vocab + c->n_experts + 8 * c->hidden +
                            4 * (c->lin_v_heads * c->lin_v_dim + c->n_heads * 2 * c->head_dim) +
                            4 * (2 * c->lin_k_heads * c->lin_k_dim + 2 * c->lin_v_heads * c->lin_v_dim));
    double used = wbytes(&full->embed) + wbytes(&full->lm_head) + (double)T * per_row + 6.0 * GIB;
    long L = 0;
    while (L < c->n_layers) {
        double add = layer_bytes(full, L) + (double)slots * state_bytes(c, L, cap);
        if (used + add > budget) break;
        used += add;
        L++;
    }
    return L;
}

/* ---- the engine ---------------------------------------------------------------------------- */

typedef struct bench {
    ls_model *m;
    ls_engine *e;
    ls_backend *tb;            /* the timing decorator (owned by the engine) */
    long T, cap, slots;        /* max_rows, positions per sequence, slots */
    int32_t *prompt;           /* [cap] tokens of every prefill; the TTFT engine's [slots x cap],
                                  a prompt per slot */
    uint64_t rng;              /* decode tokens */
} bench;

#define DECODE_WARM 3 /* untimed pipelined steps before a block's timed ones */

/* Decode steps each decode slot takes: up to 12 blocks of DECODE_WARM
 * untimed and reps timed pipelined steps (with and without digests, with
 * and without step graphs, with and without programmatic launch, twice), 1
 * census, reps instrumented, reps with carried-state digests. */
static long decode_steps(int reps)
{
    return 12L * (DECODE_WARM + reps) + 1 + 2L * reps;
}

/* What the run layer does with a step it began (src/run/drive.c): every
 * row's record, its next token the item's following token where the item
 * has one (replay, the prompt's inside), else the greedy sample. */
static ls_status records(bench *b, const ls_engine_item *items, long n, ls_error *err)
{
    static const ls_sampling greedy = {LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};
    for (long i = 0, r = 0; i < n; i++)
        for (long j = 0; j < items[i].n; j++, r++) {
            int32_t next;
            if (j + 1 < items[i].n || items[i].follows) next = items[i].tokens[j + 1];
            else LS_TRY(ls_engine_sample(b->e, r, &greedy, 0, 0, &next, err));
            const ls_trace_record *rec;
            LS_TRY(ls_engine_record(b->e, r, next, &rec, err));
        }
    return LS_OK;
}

/* One engine step run alone (ls_engine_step) and its records. */
static ls_status step_records(bench *b, const ls_engine_item *items, long n, ls_error *err)
{
    LS_TRY(ls_engine_step(b->e, items, n, err));
    return records(b, items, n, err);
}

/* One step with its records; its time by the host clock is added to *ms. */
static ls_status step_timed(bench *b, const ls_engine_item *items, long n, double *ms)
{
    double t0 = now_ms();
    ls_status st = step_records(b, items, n, &g_err);
    *ms += now_ms() - t0;
    return st;
}

static double step_ms(bench *b, const ls_engine_item *items, long n)
{
    double ms = 0;
    CK(step_timed(b, items, n, &ms));
    return ms;
}

/* Slot s starts a fresh sequence (state zeroed) whose prompt is `prompt_len` long. */
static void rejoin(bench *b, long s, long prompt_len)
{
    ls_engine_leave(b->e, s);
    CK(ls_engine_join(b->e, s, (uint32_t)(100 + s), prompt_len, &g_err));
}

/* The engine on L layers: a synthetic model, the CUDA backend generating its
 * weights, the timing decorator, and a warm-up step of n0 rows on slot 0 (the
 * largest the prefill takes, so that the MoE and digest scratch are taken
 * here). LS_E_NOMEM is returned, the rest is fatal. */
static ls_status bench_open(bench *b, long L, size_t arena, ls_error *err)
{
    ls_model_config cfg;
    bench_config(L, &cfg);
    CK(ls_model_synthetic(&cfg, 1, &b->m, &g_err));
    ls_backend_cuda_opts co;
    ls_backend_cuda_opts_default(&co);
    co.arena_bytes = arena;
    co.synthetic_weights_seed = 0x1234567;
    co.tier = g_tier;
    co.tc_rows = 1024; /* as lockstep run qualifies (LS_RUN_TC_ROWS) */
    ls_backend *cuda, *tb;
    CK(ls_backend_cuda_create_opts(&co, &cuda, &g_err));
    CK(ls_bench_timing_create(cuda, &tb, &g_err));
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.max_rows = b->T;
    o.fp8_w8a8 = g_fp8 && !strcmp(g_fp8, "w8a8");
    ls_status st = ls_engine_create(b->m, tb, &o, b->slots, b->cap, &b->e, err);
    if (st == LS_OK) {
        b->tb = tb;
        rejoin(b, 0, 0);
        long n0 = b->T < b->cap ? b->T : b->cap;
        ls_engine_item it = {0, b->prompt, n0, 0, 0};
        st = step_records(b, &it, 1, err);
    }
    if (st == LS_OK) return LS_OK;
    ls_engine_destroy(b->e);
    b->e = NULL;
    ls_model_close(b->m);
    b->m = NULL;
    if (st != LS_E_NOMEM) {
        fprintf(stderr, "bench_gpu: %s\n", err->msg);
        exit(2);
    }
    return st;
}

/* One decode item per slot s0 .. s0+B-1, each a fresh pseudo-random token. */
static void decode_items(bench *b, long s0, int B, int last, int32_t *tok, ls_engine_item *it)
{
    for (int i = 0; i < B; i++) {
        b->rng = mix(b->rng + 1);
        tok[i] = (int32_t)(b->rng % (uint64_t)b->m->cfg.vocab);
        it[i] = (ls_engine_item){s0 + i, &tok[i], 1, last, 0};
    }
}

/* Median of reps decode steps (after `warm` untimed ones). */
static float decode_median(bench *b, long s0, int B, int last, int warm, int reps)
{
    int32_t tok[BMAX];
    ls_engine_item it[BMAX];
    float t[MAX_REPS];
    for (int r = 0; r < warm + reps; r++) {
        decode_items(b, s0, B, last, tok, it);
        float ms = (float)step_ms(b, it, B);
        if (r >= warm) t[r - warm] = ms;
    }
    return median(t, reps);
}

/* 3 + reps decode steps as the run layer runs them (src/run/drive.c): step
 * N begun, its records built, then step N - 1 ended, so that step N - 1's
 * digests hash while the device runs step N. The first three are untimed
 * (with step graphs: the one that runs as it is, then each bank's
 * recording); the host time of each of the last reps goes to t; the last
 * step is ended untimed. */
static void decode_pipelined(bench *b, long s0, int B, int reps, float *t)
{
    int32_t tok[BMAX];
    ls_engine_item it[BMAX];
    for (int r = 0; r < DECODE_WARM + reps; r++) {
        decode_items(b, s0, B, 0, tok, it);
        double t0 = now_ms();
        CK(ls_engine_step_begin(b->e, it, B, &g_err));
        CK(records(b, it, B, &g_err));
        if (r > 0) CK(ls_engine_step_end(b->e, &g_err));
        if (r >= DECODE_WARM) t[r - DECODE_WARM] = (float)(now_ms() - t0);
    }
    CK(ls_engine_step_end(b->e, &g_err));
}

/* Medians of pipelined decode steps in blocks of reps, twice each block
 * kind, alternating, so that every kind sees nearly the same contexts: with
 * digests and without (mode 0, 1), and when graphs is set, the same two with
 * the step graphs off (mode 2, 3). Each block starts with no graph recorded.
 * ms[mode] gets the medians (modes 2, 3 untouched without graphs). */
static void decode_medians(bench *b, long s0, int B, int reps, int graphs, float ms[4])
{
    float t[4][2 * MAX_REPS];
    int modes = graphs ? 4 : 2;
    for (int k = 0; k < 2 * modes; k++) {
        int m = k % modes;
        CK(ls_engine_set_step_graphs(b->e, m < 2, &g_err));
        ls_bench_timing_no_digests(b->tb, m % 2);
        decode_pipelined(b, s0, B, reps, t[m] + (k / modes) * reps);
        ls_bench_timing_no_digests(b->tb, 0);
    }
    CK(ls_engine_set_step_graphs(b->e, 1, &g_err));
    for (int m = 0; m < modes; m++) ms[m] = median(t[m], 2 * reps);
}

/* Medians of pipelined decode steps (digests on, step graphs as the engine
 * takes them) with programmatic launch on and off (ms[0], ms[1];
 * kernels/launch.cuh), in alternating blocks as decode_medians; the graphs
 * are recorded afresh in each block, since they keep the launch setting
 * they were recorded with. */
static void launch_medians(bench *b, long s0, int B, int reps, float ms[2])
{
    float t[2][2 * MAX_REPS];
    for (int k = 0; k < 4; k++) {
        int m = k % 2;
        ls_cuda_set_programmatic_launch(m == 0);
        CK(ls_engine_set_step_graphs(b->e, 1, &g_err));
        decode_pipelined(b, s0, B, reps, t[m] + (k / 2) * reps);
    }
    ls_cuda_set_programmatic_launch(1);
    CK(ls_engine_set_step_graphs(b->e, 1, &g_err));
    for (int m = 0; m < 2; m++) ms[m] = median(t[m], 2 * reps);
}

/* ---- breakdowns ------------------------------------------------------------------------ */

typedef enum part {
    PART_MIXER, PART_MOE, PART_DIGEST, PART_REST, PART_IDLE, PART_COUNT
} part;

/* A linear of the lm_head: the whole [vocab, hidden], or one of a decode
 * step's column chunks (ls_engine_lm_head_chunk). */
static int is_lm_head(const ls_bench_bucket *k, const ls_model_config *c)
{
    long V = c->vocab, cw = ls_engine_lm_head_chunk(V);
    return k->cols == c->hidden && (k->rows == V || k->rows == cw || k->rows == V - (V - 1) / cw * cw);
}

/* The part of the step a bucket belongs to. Every linear but the lm_head's
 * is a mixer projection (the shared expert is inside moe); every rmsnorm but
 * those of the hidden rows is a q/k norm of attention. */
static part part_of(const ls_bench_bucket *k, const ls_model_config *c)
{
    switch (k->op) {
    case LS_BENCH_OP_MOE: return PART_MOE;
    case LS_BENCH_OP_DIGEST: /* enqueueing the digests */
    case LS_BENCH_OP_DIGEST_WAIT: return PART_DIGEST; /* what of the hashing the step did not hide */
    case LS_BENCH_OP_IDLE: return PART_IDLE;
    case LS_BENCH_OP_LINEAR: return is_lm_head(k, c) ? PART_REST : PART_MIXER;
    case LS_BENCH_OP_RMSNORM: return k->cols == c->hidden ? PART_REST : PART_MIXER;
    case LS_BENCH_OP_COPY_BLOCKS: case LS_BENCH_OP_GATED_RMSNORM: case LS_BENCH_OP_CONV_SILU:
    case LS_BENCH_OP_GDN_GATES: case LS_BENCH_OP_L2NORM_SCALE: case LS_BENCH_OP_GDN_RECURRENT:
    case LS_BENCH_OP_ROPE_APPLY: case LS_BENCH_OP_ATTENTION: case LS_BENCH_OP_SIGMOID_GATE:
    case LS_BENCH_OP_CONV_SILU_BATCH: case LS_BENCH_OP_GDN_RECURRENT_BATCH:
    case LS_BENCH_OP_KV_APPEND_BATCH: case LS_BENCH_OP_ATTENTION_BATCH:
        return PART_MIXER;
    default: return PART_REST; /* embed, router, residual_rmsnorm, logprobs, transfers */
    }
}

/* Per step, over the buckets collected from `steps` steps: each part's time. */
static void parts_of(const bench *b, int steps, double out[PART_COUNT])
{
    int n;
    const ls_bench_bucket *k = ls_bench_timing_buckets(b->tb, &n);
    memset(out, 0, sizeof(double) * PART_COUNT);
    for (int i = 0; i < n; i++) out[part_of(&k[i], &b->m->cfg)] += k[i].ms / steps;
}

static int cmp_bucket(const void *a, const void *b)
{
    double x = ((const ls_bench_bucket *)a)->ms, y = ((const ls_bench_bucket *)b)->ms;
    return (x < y) - (x > y);
}

/* Every bucket per step, largest first. */
static void print_table(const bench *b, const char *what, int steps)
{
    int n;
    const ls_bench_bucket *k = ls_bench_timing_buckets(b->tb, &n);
    ls_bench_bucket *s = malloc(sizeof *s * (size_t)(n > 0 ? n : 1));
    if (!s) exit(2);
    memcpy(s, k, sizeof *s * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_bucket);
    double tot = 0, host = 0;
    for (int i = 0; i < n; i++) tot += s[i].ms, host += s[i].host_ms;
    printf("breakdown of %s (per step, CUDA events around every op of ls_engine_step; total %.3f ms; "
           "the host's time inside the ops' calls %.3f ms):\n", what, tot / steps, host / steps);
    for (int i = 0; i < n; i++)
        printf("  %-32s %8.3f ms  %5.1f %%  %6ld calls  host %7.3f ms\n", s[i].name, s[i].ms / steps,
               100.0 * s[i].ms / tot, s[i].calls / steps, s[i].host_ms / steps);
    free(s);
}

/* Instrumented runs of `steps` steps of run(b, arg); returns the buckets' parts. */
typedef void (*step_fn)(bench *b, void *arg);

static void instrumented(bench *b, int steps, step_fn run, void *arg, double parts[PART_COUNT])
{
    ls_bench_timing_clear(b->tb);
    ls_bench_timing_record(b->tb, 1);
    for (int r = 0; r < steps; r++) {
        run(b, arg);
        CK(ls_bench_timing_collect(b->tb, &g_err));
    }
    ls_bench_timing_record(b->tb, 0);
    parts_of(b, steps, parts);
}

/* ---- measures ---------------------------------------------------------------------------- */

static double copy_bandwidth(timer *tm, int reps)
{
    size_t cb = 4 * GIB;
    void *c0 = dfill(cb, 1.0f), *c1 = dmalloc(cb);
    float t[MAX_REPS];
    for (int r = 0; r < 2 + reps; r++) {
        tstart(tm);
        CU(cudaMemcpyAsync(c1, c0, cb, cudaMemcpyDeviceToDevice, 0));
        float ms = tstop(tm);
        if (r >= 2) t[r - 2] = ms;
    }
    float copy_ms = median(t, reps);
    double bw = 2.0 * cb / (copy_ms * 1e-3); /* bytes read + written per second */
    printf("copy: %.3f ms for %zu bytes -> %.0f GB/s (read + write)\n", copy_ms, cb, bw / 1e9);
    CU(cudaFree(c0));
    CU(cudaFree(c1));
    return bw;
}

/* Kernel micro-benchmark: the strict recurrent scan of one GDN layer;
 * returns the 8192-token time (ms). */
static float gdn_scan(const ls_model_config *c, timer *tm, int reps)
{
    const long TS = 8192;
    long Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    float *q = dfill((size_t)TS * Hk * dk * 4, 0.1f), *k = dfill((size_t)TS * Hk * dk * 4, 0.1f);
    float *v = dfill((size_t)TS * Hv * dv * 4, 1.0f);
    float *al = dmalloc((size_t)TS * Hv * 4), *be = dmalloc((size_t)TS * Hv * 4);
    float *o = dmalloc((size_t)TS * Hv * dv * 4), *S = dmalloc((size_t)Hv * dk * dv * 4);
    float *h_al = hfill((size_t)TS * Hv, 0.95f, 0.04f, 11), *h_be = hfill((size_t)TS * Hv, 0.5f, 0.4f, 12);
    CU(cudaMemcpy(al, h_al, (size_t)TS * Hv * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(be, h_be, (size_t)TS * Hv * 4, cudaMemcpyHostToDevice));
    float t[MAX_REPS];
    for (int r = 0; r < 1 + reps; r++) {
        CU(cudaMemset(S, 0, (size_t)Hv * dk * dv * 4));
        tstart(tm);
        CK(ls_cuda_gdn_recurrent(q, k, v, al, be, S, o, TS, Hk, Hv, dk, dv, 1, 0, NULL, &g_err));
        float ms = tstop(tm);
        if (r >= 1) t[r - 1] = ms;
    }
    float gm = median(t, reps);
    printf("gdn scan 8192 tokens (h_qk %ld, h_v %ld, d %ld), strict recurrent: %.3f ms = %.1f x FLA's "
           "published 0.472 ms (chunked, H200)\n", Hk, Hv, dk, gm, gm / 0.472);
    double bytes = (double)TS * (2 * Hk * dk + 2 * Hv * dv + 2 * Hv) * 4;
    printf("  gdn scan streams %.1f MB -> %.1f GB/s; 4 FLOP per state element per token: %.2f TFLOP/s\n",
           bytes / 1e6, bytes / (gm * 1e-3) / 1e9, 4.0 * TS * Hv * dk * dv / (gm * 1e-3) / 1e12);
    /* decode: one token of each of B sequences on its own carried state
     * (the engine's batched call), the reference of FLA's fused_recurrent */
    static const long decode_b[] = {1, 32};
    for (int bi = 0; bi < 2; bi++) {
        long B = decode_b[bi];
        float *Sb = dmalloc((size_t)B * Hv * dk * dv * 4);
        float *states[32];
        long row0[32], len[32];
        for (long s = 0; s < B; s++) {
            states[s] = Sb + s * Hv * dk * dv;
            row0[s] = s;
            len[s] = 1;
        }
        CU(cudaMemset(Sb, 0, (size_t)B * Hv * dk * dv * 4));
        for (int r = 0; r < 1 + reps; r++) {
            tstart(tm);
            CK(ls_cuda_gdn_recurrent_batch(q, k, v, al, be, states, row0, len, B, o, Hk, Hv, dk, dv, 1, 0,
                                           NULL, &g_err));
            float ms = tstop(tm);
            if (r >= 1) t[r - 1] = ms;
        }
        float dm = median(t, reps);
        double sb = (double)B * Hv * dk * dv * 4 * 2; /* each state read and written */
        printf("gdn decode batch %ld (one token per sequence, one layer): %.4f ms; states %.1f MB read + "
               "written -> %.0f GB/s\n", B, dm, sb / 1e6, sb / (dm * 1e-3) / 1e9);
        CU(cudaFree(Sb));
    }
    free(h_al);
    free(h_be);
    void *bufs[] = {q, k, v, al, be, o, S};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CU(cudaFree(bufs[i]));
    return gm;
}

/* One call of the chunk-aligned form: the portable kernel (tc 0) or the
 * tensor-core one with its scratch (tc 1). */
static ls_status gdn_chunked_call(int tc, const float *q, const float *k, const float *v, const float *al,
                                  const float *be, float *S, float *o, long T, long pos, long Hk, long Hv, long dk,
                                  long dv, void *scr, size_t scr_b)
{
    if (tc) return ls_cuda_gdn_chunked_tc(q, k, v, al, be, S, o, T, pos, Hk, Hv, dk, dv, 1, scr, scr_b, NULL, &g_err);
    return ls_cuda_gdn_chunked(q, k, v, al, be, S, o, T, pos, Hk, Hv, dk, dv, 1, 0, NULL, &g_err);
}

/* Kernel micro-benchmark: the strict chunk-aligned form of one GDN layer,
 * the portable kernel (tc 0; returns the 8192-token time, ms) or the one on
 * tensor cores (tc 1: ls_cuda_gdn_chunked_tc, docs/tensor-core-tier.md §3.6,
 * against the recurrent (rec_ms) and portable chunk-aligned (port_ms) times
 * of this run; a shape it refuses prints a skipped line). Then one decode
 * step of one sequence at rows 0, 31 and 63 of a chunk (63 folds the chunk)
 * and the state materialisation a digest at row 31 costs. */
static float gdn_chunked_scan(const ls_model_config *c, timer *tm, int reps, int tc, float rec_ms, float port_ms)
{
    const long TS = 8192;
    const char *what = tc ? "chunk-aligned tensor cores" : "chunk-aligned";
    long Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    size_t sb = (tc ? LS_CUDA_GDN_TC_STATE_FLOATS(Hv, dk, dv) : LS_GDN_CHUNK_STATE_FLOATS(Hv, dk, dv)) * 4;
    size_t scr_b = tc ? ls_cuda_gdn_tc_scratch_bytes(TS, Hv, dk, dv) : 0;
    float *q = dfill((size_t)TS * Hk * dk * 4, 0.1f), *k = dfill((size_t)TS * Hk * dk * 4, 0.1f);
    float *v = dfill((size_t)TS * Hv * dv * 4, 1.0f);
    float *al = dmalloc((size_t)TS * Hv * 4), *be = dmalloc((size_t)TS * Hv * 4);
    float *o = dmalloc((size_t)TS * Hv * dv * 4), *S = dmalloc(sb), *M = dmalloc((size_t)Hv * dk * dv * 4);
    void *scr = dmalloc(scr_b ? scr_b : 256);
    float *h_al = hfill((size_t)TS * Hv, 0.95f, 0.04f, 11), *h_be = hfill((size_t)TS * Hv, 0.5f, 0.4f, 12);
    CU(cudaMemcpy(al, h_al, (size_t)TS * Hv * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(be, h_be, (size_t)TS * Hv * 4, cudaMemcpyHostToDevice));
    float t[MAX_REPS], gm = 0.0f;
    for (int r = 0; r < 1 + reps; r++) {
        CU(cudaMemset(S, 0, sb));
        tstart(tm);
        ls_status st = gdn_chunked_call(tc, q, k, v, al, be, S, o, TS, 0, Hk, Hv, dk, dv, scr, scr_b);
        float ms = tstop(tm);
        if (st == LS_E_UNSUPPORTED && r == 0) {
            printf("gdn %s (h_qk %ld, h_v %ld, d %ld/%ld): skipped: %s\n", what, Hk, Hv, dk, dv, g_err.msg);
            goto out;
        }
        CK(st);
        if (r >= 1) t[r - 1] = ms;
    }
    gm = median(t, reps);
    if (tc)
        printf("gdn %s 8192 tokens (h_qk %ld, h_v %ld, d %ld), scratch %.1f MB: %.3f ms = %.2f x strict "
               "recurrent, %.2f x strict chunk-aligned, %.1f x FLA's published 0.472 ms (chunked, H200)\n", what, Hk,
               Hv, dk, scr_b / 1e6, gm, gm / rec_ms, gm / port_ms, gm / 0.472);
    else
        printf("gdn %s 8192 tokens (h_qk %ld, h_v %ld, d %ld), strict: %.3f ms = %.1f x FLA's published 0.472 ms "
               "(chunked, H200)\n", what, Hk, Hv, dk, gm, gm / 0.472);
    static const long rows[] = {0, 31, 63};
    for (int ri = 0; ri < 3; ri++) {
        long pos = TS + rows[ri];
        for (int r = 0; r < 1 + reps; r++) {
            tstart(tm);
            CK(gdn_chunked_call(tc, q, k, v, al, be, S, o, 1, pos, Hk, Hv, dk, dv, scr, scr_b));
            float ms = tstop(tm);
            if (r >= 1) t[r - 1] = ms;
        }
        printf("gdn %s decode, one sequence at row %ld of its chunk (one layer): %.4f ms\n", what, rows[ri],
               median(t, reps));
    }
    if (tc) { /* a decode step of 32 sequences, one launch per kernel (the engine's batched step) */
        enum { B = 32 };
        float *Sb = dmalloc(B * sb), *states[B];
        size_t dscr_b = ls_cuda_gdn_tc_decode_scratch_bytes(B, Hv, dk, dv);
        void *dscr = dmalloc(dscr_b);
        long row0[B], pos[B];
        CU(cudaMemset(Sb, 0, B * sb));
        for (int ri = 1; ri < 3; ri++) {
            for (long s = 0; s < B; s++) {
                states[s] = Sb + s * (long)(sb / 4);
                row0[s] = s;
                pos[s] = rows[ri];
            }
            for (int r = 0; r < 1 + reps; r++) {
                tstart(tm);
                CK(ls_cuda_gdn_chunked_tc_decode(q, k, v, al, be, states, row0, pos, B, o, Hk, Hv, dk, dv, 1, dscr,
                                                 dscr_b, NULL, &g_err));
                float ms = tstop(tm);
                if (r >= 1) t[r - 1] = ms;
            }
            printf("gdn %s decode batch %d (one launch per kernel), every sequence at row %ld of its chunk (one "
                   "layer): %.4f ms\n", what, B, rows[ri], median(t, reps));
        }
        CU(cudaFree(Sb));
        CU(cudaFree(dscr));
    }
    for (int r = 0; r < 1 + reps; r++) {
        tstart(tm);
        CK(tc ? ls_cuda_gdn_chunked_tc_state(S, TS + 31, M, Hv, dk, dv, NULL, &g_err)
              : ls_cuda_gdn_chunked_state(S, TS + 31, M, Hv, dk, dv, NULL, &g_err));
        float ms = tstop(tm);
        if (r >= 1) t[r - 1] = ms;
    }
    printf("gdn %s state materialisation at row 31 (one layer, for a digest): %.4f ms\n", what, median(t, reps));
out:
    free(h_al);
    free(h_be);
    void *bufs[] = {q, k, v, al, be, o, S, M, scr};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CU(cudaFree(bufs[i]));
    return gm;
}

/* The FP8 experts of one layer of the MoE micro-benchmark: e4m3 bytes from
 * the device generator, block scales near 0.04/448 from the host (as
 * ls_model_synthetic's), the shared expert gate vector bf16. All device
 * buffers of the layer are listed in bufs[0..3] for freeing. */
static void moe_f8_layer(long E, long D, long I, long Is, int wtype, ls_cuda_moe *mw, void *bufs[4])
{
    size_t n_el = (size_t)3 * E * I * D + (size_t)3 * Is * D;
    long sr = LS_FP8_BLOCKS(I) * LS_FP8_BLOCKS(D), ss = LS_FP8_BLOCKS(Is) * LS_FP8_BLOCKS(D);
    size_t n_sc = (size_t)3 * E * sr + (size_t)3 * ss;
    uint8_t *w = dmalloc(n_el);
    CK(ls_cuda_fill_e4m3(w, n_el, g_fill_seed++, NULL, &g_err));
    float *hs = hfill(n_sc, 0.04f / LS_FP8_E4M3_MAX, 0.01f / LS_FP8_E4M3_MAX, g_fill_seed++);
    float *sc = dmalloc(n_sc * 4);
    CU(cudaMemcpy(sc, hs, n_sc * 4, cudaMemcpyHostToDevice));
    free(hs);
    /* gate, up, down pointers, then their scales' */
    const void **h = malloc(sizeof(void *) * 6 * (size_t)E);
    if (!h) exit(2);
    for (long e = 0; e < 3 * E; e++) {
        h[e] = w + (size_t)e * I * D;
        h[3 * E + e] = sc + (size_t)e * sr;
    }
    void *tab = dmalloc(sizeof(void *) * 6 * (size_t)E);
    CU(cudaMemcpy(tab, h, sizeof(void *) * 6 * (size_t)E, cudaMemcpyHostToDevice));
    free(h);
    const uint8_t *sh = w + (size_t)3 * E * I * D;
    const float *shs = sc + (size_t)3 * E * sr;
    void *gw = dfill((size_t)D * 2, 0.04f);
    const void *const *t = (const void *const *)tab;
    *mw = (ls_cuda_moe){.E = E, .D = D, .I = I, .Is = Is, .wtype = wtype, .gate = t, .up = t + E,
                        .down = t + 2 * E, .gate_s = (const float *const *)(t + 3 * E),
                        .up_s = (const float *const *)(t + 4 * E),
                        .down_s = (const float *const *)(t + 5 * E), .sh_gate = sh,
                        .sh_up = sh + (size_t)Is * D, .sh_down = sh + (size_t)2 * Is * D,
                        .sh_wtype = wtype, .sh_gate_s = shs, .sh_up_s = shs + ss,
                        .sh_down_s = shs + 2 * ss, .sh_gate_w = gw, .shg_wtype = 0};
    bufs[0] = w, bufs[1] = sc, bufs[2] = tab, bufs[3] = gw;
}

/* Kernel micro-benchmark: the MoE experts of one layer alone at T tokens
 * under every plan: time, the bytes of the distinct experts routed to (+ the
 * shared expert) over the copy bandwidth, and whether the plan's output bits
 * equal plan 0's. Routing: token t takes experts (h(t) + 37 i) mod E, i < k
 * (distinct). NL layers of expert weights, the one used rotating with the
 * repeat so that its weights are not in L2. With --fp8 the experts are FP8
 * in that mode (1 byte per element + block scales). */
static void moe_plan_table(const ls_model_config *c, timer *tm, double bw, long tmax, int reps)
{
    enum { NL = 4 };
    long E = c->n_experts, D = c->hidden, I = c->moe_inter, Is = c->shared_inter, K = c->topk;
    long Ts[] = {1, 4, 32, 256, 1024, 4096};
    ls_cuda_moe mw[NL];
    void *tabs[NL];
    void *wts_dev[NL];
    void *f8_bufs[NL][4];
    int f8 = g_fp8 != NULL;
    /* bytes of one expert (gate, up, down) as the kernels read them */
    double ebytes = (double)3 * I * D * 2;
    if (f8) ebytes = (double)3 * I * D + 3.0 * 4 * (double)LS_FP8_BLOCKS(I) * (double)LS_FP8_BLOCKS(D);
    size_t per = (size_t)3 * E * I * D + (size_t)3 * Is * D + (size_t)D;
    for (int l = 0; l < NL && f8; l++)
        moe_f8_layer(E, D, I, Is, strcmp(g_fp8, "w8a8") ? LS_WTYPE_F8_DEQUANT : LS_WTYPE_F8_W8A8,
                     &mw[l], f8_bufs[l]);
    for (int l = 0; l < NL && !f8; l++) {
        uint16_t *w = dfill(per * 2, 0.04f);
        const void **h = malloc(sizeof(void *) * 3 * (size_t)E);
        if (!h) exit(2);
        for (long e = 0; e < 3 * E; e++) h[e] = w + (size_t)e * I * D;
        tabs[l] = dmalloc(sizeof(void *) * 3 * (size_t)E);
        CU(cudaMemcpy(tabs[l], h, sizeof(void *) * 3 * (size_t)E, cudaMemcpyHostToDevice));
        free(h);
        uint16_t *sh = w + (size_t)3 * E * I * D;
        mw[l] = (ls_cuda_moe){.E = E, .D = D, .I = I, .Is = Is, .wtype = 0,
                              .gate = (const void *const *)tabs[l],
                              .up = (const void *const *)tabs[l] + E,
                              .down = (const void *const *)tabs[l] + 2 * E, .sh_gate = sh,
                              .sh_up = sh + (size_t)Is * D, .sh_down = sh + (size_t)2 * Is * D,
                              .sh_wtype = 0, .sh_gate_w = sh + (size_t)3 * Is * D, .shg_wtype = 0};
        wts_dev[l] = w;
    }
    long chunk = 65535 / (K + 1), tcap = tmax < chunk ? tmax : chunk;
    float *x = dfill((size_t)tcap * D * 4, 0.5f), *wts = dfill((size_t)tcap * K * 4, 0.5f);
    float *out = dmalloc((size_t)tcap * D * 4);
    int32_t *ids_dev = dmalloc((size_t)tcap * K * 4);
    void *scratch = dmalloc(ls_cuda_moe_scratch_bytes(&mw[0], tcap, K));
    float *ref = malloc(sizeof(float) * (size_t)tcap * D), *got = malloc(sizeof(float) * (size_t)tcap * D);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)tcap * K);
    unsigned char *used = malloc((size_t)E);
    if (!ref || !got || !ids || !used) exit(2);
    int np = ls_cuda_moe_plan_count();
    printf("moe experts alone, one layer, %s experts, by kernel plan (time; bytes of the distinct "
           "experts / copy bandwidth; bits vs plan 0):\n", f8 ? (strcmp(g_fp8, "w8a8") ? "FP8 dequant"
           : "FP8 w8a8") : "bf16");
    float t[MAX_REPS];
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0] && Ts[ti] <= tcap; ti++) {
        long T = Ts[ti];
        memset(used, 0, (size_t)E);
        for (long q = 0; q < T; q++) {
            uint64_t h = mix(0x5eedull + (uint64_t)q);
            for (long i = 0; i < K; i++) {
                ids[q * K + i] = (int32_t)((h + 37u * (uint64_t)i) % (uint64_t)E);
                used[ids[q * K + i]] = 1;
            }
        }
        int distinct = 0;
        for (long e = 0; e < E; e++) distinct += used[e];
        CU(cudaMemcpy(ids_dev, ids, sizeof(int32_t) * (size_t)T * K, cudaMemcpyHostToDevice));
        double roof = (double)(distinct + 1) * ebytes / bw * 1e3;
        for (int p = 0; p < np; p++) {
            /* bits: layer 0 on its own (a plan that does not take these experts is skipped) */
            ls_status ps = ls_cuda_moe_forward_plan(&mw[0], x, ids_dev, wts, K, out, T, scratch, 1, 0, 0,
                                                    p, NULL, &g_err);
            if (ps == LS_E_UNSUPPORTED) {
                printf("  T %5ld (%3d experts) %-30s not for these experts\n", T, distinct,
                       ls_cuda_moe_plan_name(p));
                continue;
            }
            CK(ps);
            CU(cudaMemcpy(p == 0 ? ref : got, out, sizeof(float) * (size_t)T * D, cudaMemcpyDeviceToHost));
            int same = p == 0 || !memcmp(ref, got, sizeof(float) * (size_t)T * D);
            for (int r = 0; r < 1 + reps; r++) {
                tstart(tm);
                CK(ls_cuda_moe_forward_plan(&mw[r % NL], x, ids_dev, wts, K, out, T, scratch, 1, 0, 0,
                                            p, NULL, &g_err));
                float ms = tstop(tm);
                if (r >= 1) t[r - 1] = ms;
            }
            float ms = median(t, reps);
            printf("  T %5ld (%3d experts) %-30s %9.3f ms = %6.2f x %.3f ms (%4.1f %%)  %s\n", T, distinct,
                   ls_cuda_moe_plan_name(p), ms, ms / roof, roof, 100.0 * roof / ms,
                   same ? "same bits" : "BITS DIFFER");
        }
    }
    free(ref), free(got), free(ids), free(used);
    void *bufs[] = {x, wts, out, ids_dev, scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CU(cudaFree(bufs[i]));
    for (int l = 0; l < NL; l++) {
        if (f8) {
            for (int i = 0; i < 4; i++) CU(cudaFree(f8_bufs[l][i]));
            continue;
        }
        CU(cudaFree(tabs[l]));
        CU(cudaFree(wts_dev[l]));
    }
}

/* Kernel micro-benchmark: the model's bf16 linears alone at T tokens under
 * every plan of ls_cuda_linear_plan: time, the weights' bytes over the copy
 * bandwidth, and whether the plan's bits equal plan 0's. NL copies of each
 * matrix, the one used rotating with the repeat, so that a matrix smaller
 * than the L2 is not served from it. */
static void linear_plan_table(const ls_model_config *c, timer *tm, double bw, long tmax, int reps)
{
    enum { NL = 4 };
    const struct { const char *name; long out, in; } sh[] = {
        {"lm_head", c->vocab, c->hidden},
        {"GDN in_proj_qkvz", 2 * c->lin_k_heads * c->lin_k_dim + 2 * c->lin_v_heads * c->lin_v_dim, c->hidden},
        {"GDN out_proj", c->hidden, c->lin_v_heads * c->lin_v_dim},
        {"attention q (with gate)", 2 * c->n_heads * c->head_dim, c->hidden},
    };
    long Ts[] = {1, 2, 4, 8, 32, 256, 1024};
    int np = ls_cuda_linear_plan_count();
    float t[MAX_REPS];
    printf("linears alone, bf16 weights, by kernel plan (time; weight bytes / copy bandwidth; bits vs plan 0):\n");
    for (size_t si = 0; si < sizeof sh / sizeof sh[0]; si++) {
        long out = sh[si].out, in = sh[si].in;
        size_t wb = (size_t)out * in * 2;
        int nl = wb > ((size_t)256 << 20) ? 1 : NL; /* the lm_head alone is past the L2 five times over */
        void *w[NL];
        for (int l = 0; l < nl; l++) w[l] = dfill(wb, 0.04f);
        float *x = dfill((size_t)tmax * in * 4, 0.5f), *y = dmalloc((size_t)tmax * out * 4);
        float *ref = malloc(sizeof(float) * (size_t)tmax * out), *got = malloc(sizeof(float) * (size_t)tmax * out);
        if (!ref || !got) exit(2);
        double roof = (double)wb / bw * 1e3;
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0] && Ts[ti] <= tmax; ti++) {
            long T = Ts[ti];
            for (int p = 0; p < np; p++) {
                CK(ls_cuda_linear_plan(w[0], 0, out, in, x, y, T, 1, 0, p, NULL, &g_err));
                CU(cudaMemcpy(p == 0 ? ref : got, y, sizeof(float) * (size_t)T * out, cudaMemcpyDeviceToHost));
                int same = p == 0 || !memcmp(ref, got, sizeof(float) * (size_t)T * out);
                for (int r = 0; r < 1 + reps; r++) {
                    tstart(tm);
                    CK(ls_cuda_linear_plan(w[r % nl], 0, out, in, x, y, T, 1, 0, p, NULL, &g_err));
                    float ms = tstop(tm);
                    if (r >= 1) t[r - 1] = ms;
                }
                float ms = median(t, reps);
                printf("  %-24s [%6ld x %4ld] T %4ld  %-28s %9.4f ms = %7.2f x %.4f ms  %s\n", sh[si].name,
                       out, in, T, ls_cuda_linear_plan_name(p), ms, ms / roof, roof,
                       same ? "same bits" : "BITS DIFFER");
            }
        }
        fflush(stdout);
        for (int l = 0; l < nl; l++) CU(cudaFree(w[l]));
        CU(cudaFree(x));
        CU(cudaFree(y));
        free(ref), free(got);
    }
}

/* Prefill and replay on slot 0 (left at context `prefill` for decode batch 1). */
typedef struct prefill_arg {
    long n;
} prefill_arg;

static void prefill_once(bench *b, void *arg)
{
    long n = ((prefill_arg *)arg)->n;
    rejoin(b, 0, n);
    ls_engine_item it = {0, b->prompt, n, 0, 0};
    CK(step_records(b, &it, 1, &g_err));
}

static void prefill_and_replay(bench *b, long prefill, int reps, int breakdown)
{
    int r2 = reps < 3 ? reps : 3;
    float t[MAX_REPS];
    prefill_arg pa = {prefill};
    for (int r = 0; r < 1 + r2; r++) {
        double t0 = now_ms();
        prefill_once(b, &pa);
        if (r >= 1) t[r - 1] = (float)(now_ms() - t0);
    }
    float pm = median(t, r2);
    if (breakdown) {
        double parts[PART_COUNT];
        instrumented(b, 1, prefill_once, &pa, parts);
        print_table(b, "prefill", 1);
    }
    printf("prefill %ld tokens, one call: %.1f ms -> %.0f tokens/s\n", prefill, pm, prefill / (pm * 1e-3));
    long chunk = 256 < prefill ? 256 : prefill;
    for (int r = 0; r < 1 + r2; r++) {
        rejoin(b, 0, prefill);
        double ms = 0;
        for (long c0 = 0; c0 < prefill; c0 += chunk) {
            ls_engine_item it = {0, b->prompt + c0, prefill - c0 < chunk ? prefill - c0 : chunk, 0, 1};
            ms += step_ms(b, &it, 1);
        }
        if (r >= 1) t[r - 1] = (float)ms;
    }
    float rm = median(t, r2);
    printf("replay %ld tokens in chunks of %ld: %.1f ms -> %.0f tokens/s\n", prefill, chunk, rm,
           prefill / (rm * 1e-3));
}

/* Tokens of each of B sequences in one step of the batched prefill: all
 * B sequences in every step, max_rows / B tokens of each. */
static long batch_per(const bench *b, int B)
{
    return b->T / B > 0 ? b->T / B : 1;
}

/* Slots s0 .. s0+B-1 start fresh sequences with prompts of len tokens
 * (sequence i's at b->prompt + i * stride) and prefill them in packed steps
 * (batch_per tokens of each per step; one step when B len <= max_rows). *ms:
 * the steps' time by the host clock; the joins (state zeroing on the
 * device) are done before it starts. The first failing step's status. */
static ls_status prefill_batch(bench *b, long s0, int B, long len, long stride, double *ms)
{
    ls_engine_item it[BMAX];
    long per = batch_per(b, B);
    for (long s = s0; s < s0 + B; s++) rejoin(b, s, len);
    CU(cudaDeviceSynchronize());
    *ms = 0;
    for (long p0 = 0; p0 < len; p0 += per) {
        long n = len - p0 < per ? len - p0 : per;
        for (int i = 0; i < B; i++)
            it[i] = (ls_engine_item){s0 + i, b->prompt + i * stride + p0, n, 0, p0 + n < len};
        ls_status st = step_timed(b, it, B, ms);
        if (st != LS_OK) return st;
    }
    return LS_OK;
}

/* Slots 1 .. BMAX to context `prefill` in packed steps of T rows (one prompt for all). */
static void fill_batch(bench *b, long prefill)
{
    double ms;
    CK(prefill_batch(b, 1, BMAX, prefill, 0, &ms));
    printf("batched prefill of %d sequences to context %ld (%ld tokens each per step): %.1f ms -> "
           "%.0f tokens/s\n", BMAX, prefill, batch_per(b, BMAX), ms, BMAX * prefill / (ms * 1e-3));
}

/* Bytes a decode step of B sequences at context ctx must read: every dense
 * weight, the distinct experts the batch routes to (per layer, from a census
 * step), the lm_head (*w); B embedding rows, states read and written, KV
 * rows read (*other). */
static void decode_bytes(bench *b, long s0, int B, wsum *w, double *other)
{
    const ls_model_config *c = &b->m->cfg;
    long ctx = ls_engine_slot_len(b->e, s0);
    int32_t tok[BMAX];
    ls_engine_item it[BMAX];
    decode_items(b, s0, B, 0, tok, it);
    ls_bench_timing_census(b->tb, 1);
    CK(ls_engine_step(b->e, it, B, &g_err));
    ls_bench_timing_census(b->tb, 0);
    long n;
    const int *distinct = ls_bench_timing_distinct(b->tb, &n);
    if (n != c->n_layers) {
        fprintf(stderr, "bench_gpu: the census saw %ld router calls in a step of %ld layers\n", n,
                c->n_layers);
        exit(2);
    }
    memset(w, 0, sizeof *w);
    wadd(w, &b->m->lm_head, 1.0);
    double o = (double)B * c->hidden * (double)ls_wtype_bytes(b->m->embed.wtype);
    for (long l = 0; l < c->n_layers; l++) {
        const ls_model_layer *ly = &b->m->layers[l];
        dense_bytes(w, ly);
        expert_bytes(w, ly, (double)distinct[l]);
        o += ly->attention ? (double)B * state_bytes(c, l, ctx + 1) : 2.0 * B * state_bytes(c, l, 0);
    }
    *other = o;
}

typedef struct decode_arg {
    long s0;
    int B, last;
} decode_arg;

static void decode_once(bench *b, void *arg)
{
    decode_arg *d = arg;
    int32_t tok[BMAX];
    ls_engine_item it[BMAX];
    decode_items(b, d->s0, d->B, d->last, tok, it);
    CK(step_records(b, it, d->B, &g_err));
}

static void decode(bench *b, int B, long s0, double bw, int reps, int breakdown)
{
    printf("decode batch %d: context %ld, one step per token, pipelined as the run layer runs them "
           "(step N begun, its records built, step N - 1 ended)\n", B, ls_engine_slot_len(b->e, s0));
    float mm[4];
    int graphs = B == 1; /* the steps the engine records: pipelined, one sequence */
    decode_medians(b, s0, B, reps, graphs, mm);
    float ms = mm[0], ms_bare = mm[1];
    wsum w;
    double other;
    decode_bytes(b, s0, B, &w, &other);
    double bytes = wsum_total(&w) + other, roof = bytes / bw * 1e3;
    double parts[PART_COUNT];
    decode_arg da = {s0, B, 0};
    instrumented(b, reps, decode_once, &da, parts);
    if (breakdown) {
        char what[64];
        snprintf(what, sizeof what, "decode batch %d", B);
        print_table(b, what, reps);
    }
    double sum = 0;
    for (int p = 0; p < PART_COUNT; p++) sum += parts[p];
    printf("decode batch %d breakdown: mixers (gdn/attention) %.3f ms, moe experts %.3f ms, rest (norms, "
           "router, residuals, lm_head, logprobs, transfers) %.3f ms, digests %.3f ms, device idle between "
           "ops %.3f ms (instrumented step %.3f ms)\n", B, parts[PART_MIXER], parts[PART_MOE],
           parts[PART_REST], parts[PART_DIGEST], parts[PART_IDLE], sum);
    printf("decode batch %d: %.3f ms/step; must read %.2f GB -> roofline %.3f ms; step / roofline = %.2f; "
           "%.1f tokens/s\n", B, ms, bytes / 1e9, roof, ms / roof, B / (ms * 1e-3));
    if (g_fp8) {
        /* FP8 halves the bytes of the quantised matrices only: the bf16
         * matrices (embed rows, lm_head, routers, GDN b/a, conv, shared
         * expert gate), the scales and the carried state stay */
        double b16 = w.as_bf16 + other, roof16 = b16 / bw * 1e3;
        printf("decode batch %d bytes (FP8 %s): e4m3 weights %.3f GB + block scales %.1f MB + bf16 "
               "weights %.3f GB + state, KV and embedding rows %.3f GB = %.2f GB; the same step "
               "(same routing) in bf16 reads %.2f GB -> roofline %.3f ms; FP8 roofline = %.3f x "
               "bf16's; step / bf16 roofline = %.2f\n", B, g_fp8, w.e4m3 / 1e9, w.scales / 1e6, w.wide / 1e9, other / 1e9,
               bytes / 1e9, b16 / 1e9, roof16, roof / roof16, ms / roof16);
    }
    if (graphs) {
        long rec, launches;
        const char *off;
        ls_engine_step_graph_stats(b->e, &rec, &launches, &off);
        printf("decode batch %d step graphs: %.3f ms/step with them, %.3f ms without (the same blocks, "
               "alternating) = %.2f x; without digests %.3f / %.3f ms; %ld steps recorded, %ld "
               "launched%s%s\n", B, ms, mm[2], ms / mm[2], ms_bare, mm[3], rec, launches,
               off ? "; recording failed: " : "", off ? off : "");
    }
    float pl[2];
    launch_medians(b, s0, B, reps, pl);
    printf("decode batch %d programmatic launch: %.3f ms/step with it, %.3f ms without (the same blocks, "
           "alternating) = %.2f x\n", B, pl[0], pl[1], pl[0] / pl[1]);
    float sm = decode_median(b, s0, B, 1, 0, reps);
    printf("digest per decode step, batch %2d: default set %.3f ms = %.3f x the step (the digest op in "
           "the instrumented step); the step without digests %.3f ms: the digests cost %.3f ms = %.3f x "
           "the step; with carried-state digests at the step (as state_digest_every 1): "
           "%.3f ms/step = %.2f x the default step\n", B, parts[PART_DIGEST], parts[PART_DIGEST] / sum,
           ms_bare, ms - ms_bare, (ms - ms_bare) / ms, sm, sm / ms);
}

/* --profile-decode: batch-1 steps from slot 0, the first DECODE_WARM + 1
 * recording the step graphs, the next as many inside the profiler's range. */
static void profile_decode(bench *b)
{
    float t[1];
    decode_pipelined(b, 0, 1, 1, t);
    if (cudaProfilerStart() != cudaSuccess) {
        fprintf(stderr, "bench_gpu: cudaProfilerStart: %s\n", cudaGetErrorString(cudaGetLastError()));
        exit(1);
    }
    decode_pipelined(b, 0, 1, 1, t);
    cudaProfilerStop();
    printf("profile: %d batch-1 decode steps inside the profiler's range\n", DECODE_WARM + 1);
}

/* ---- TTFT and TPOT ------------------------------------------------------------------------- */

#define TTFT_MAX 16            /* entries of --ttft and of --ttft-conc */
#define TTFT_LINE 2048

/* How the batched prefill splits c prompts of len tokens into steps. */
static void ttft_split(const bench *b, int c, long len, char *out, size_t size)
{
    long per = batch_per(b, c), steps = (len + per - 1) / per, last = len - (steps - 1) * per;
    if (steps == 1) {
        if (c == 1) snprintf(out, size, "1 step of 1 x %ld tokens (the whole prompt in one ls_engine_step)", len);
        else snprintf(out, size, "1 step of %d x %ld tokens (all %d prompts in one ls_engine_step)", c, len, c);
        return;
    }
    char tail[64] = "", rule[64] = "max_rows tokens per step";
    if (last != per) snprintf(tail, sizeof tail, ", the last %d x %ld", c, last);
    if (c > 1) snprintf(rule, sizeof rule, "max_rows / %d tokens of each sequence per step", c);
    snprintf(out, size, "%ld steps of %d x %ld tokens%s (%d x %ld > max_rows %ld: the batched prefill's "
             "packing, %s)", steps, c, per, tail, c, len, b->T, rule);
}

/* The TTFT / TPOT table on b's engine (c slots from 0 for each point; every
 * sequence leaves its slot after its point). */
static void ttft_table(bench *b, long L, const long *lens, int n_lens, const long *conc, int n_conc, int reps)
{
    const char *tier = ls_run_tier_name(g_tier);
    char(*lines)[TTFT_LINE] = calloc((size_t)(n_lens * n_conc), TTFT_LINE);
    if (!lines) exit(2);
    int n = 0;
    for (int li = 0; li < n_lens; li++)
        for (int ci = 0; ci < n_conc; ci++, n++) {
            long len = lens[li];
            int c = (int)conc[ci];
            char split[256];
            ttft_split(b, c, len, split, sizeof split);
            int one = c * len <= b->T, runs = one ? 1 + (reps < 3 ? reps : 3) : 1;
            printf("ttft L=%ld conc=%d: running: prefill of %d x %ld tokens in %s, %s, then %d + %d decode "
                   "steps\n", len, c, c, len, split, one ? "timed after a warm-up" : "one run", 2, reps);
            fflush(stdout);
            float t[MAX_REPS];
            int k = 0;
            ls_status st = LS_OK;
            for (int r = 0; r < runs && st == LS_OK; r++) {
                double ms;
                st = prefill_batch(b, 0, c, len, b->cap, &ms);
                if (st == LS_OK && (!one || r >= 1)) t[k++] = (float)ms;
            }
            if (st == LS_OK) {
                char run_what[48] = "one run";
                if (one) snprintf(run_what, sizeof run_what, "median of %d after a warm-up", k);
                float ttft = median(t, k);
                float tpot = decode_median(b, 0, c, 0, 2, reps);
                snprintf(lines[n], TTFT_LINE, "ttft L=%ld conc=%d: TTFT %.1f ms, TPOT %.3f ms/token, %.1f "
                         "decode tok/s (tier %s, %ld layers; prefill %s; TTFT %s; TPOT median of %d "
                         "steps at context %ld..%ld)", len, c, ttft, tpot, c / (tpot * 1e-3), tier, L, split,
                         run_what, reps, len + 2, len + 1 + reps);
            } else if (st == LS_E_NOMEM) {
                snprintf(lines[n], TTFT_LINE, "ttft L=%ld conc=%d: skipped (tier %s, %ld layers): a prefill "
                         "step ran out of device memory: %s", len, c, tier, L, g_err.msg);
            } else {
                fprintf(stderr, "bench_gpu: ttft L=%ld conc=%d: %s\n", len, c, g_err.msg);
                exit(2);
            }
            for (long s = 0; s < c; s++) ls_engine_leave(b->e, s);
            printf("%s\n", lines[n]);
            fflush(stdout);
        }
    printf("ttft table (%s, %ld layers, max_rows %ld):\n", tier, L, b->T);
    for (int i = 0; i < n; i++) printf("  %s\n", lines[i]);
    fflush(stdout);
    free(lines);
}

/* ---- main ------------------------------------------------------------------------------------ */

/* A comma list of 1 .. TTFT_MAX integers in lo..hi ("128,1024") into v;
 * returns how many, or 0 after a one-line message naming the option. */
static int parse_list(const char *opt, const char *text, long lo, long hi, long *v)
{
    int n = 0;
    const char *p = text;
    for (;;) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < lo || x > hi || n == TTFT_MAX || (*end != ',' && *end)) {
            fprintf(stderr, "bench_gpu: %s '%s': expected a comma list of at most %d integers in %ld..%ld\n",
                    opt, text, TTFT_MAX, lo, hi);
            return 0;
        }
        v[n++] = x;
        if (!*end) return n;
        p = end + 1;
    }
}

static long max_of(const long *v, int n)
{
    long m = v[0];
    for (int i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

/* b->prompt: n counter-based token ids of cfg's vocabulary, none of them a
 * vision placeholder (image_token_id, video_token_id: the text-only engine refuses
 * them; such an id moves on to the next one). */
static void bench_prompt(bench *b, long n, const ls_model_config *cfg)
{
    b->prompt = malloc(sizeof(int32_t) * (size_t)n);
    if (!b->prompt) exit(2);
    for (long i = 0; i < n; i++) {
        long t = (long)(mix(0xabcdull + (uint64_t)i) % (uint64_t)cfg->vocab);
        while (ls_model_vision_token(cfg, t) >= 0) t = (t + 1) % cfg->vocab;
        b->prompt[i] = (int32_t)t;
    }
}

/* Opens b's engine (T, slots, cap and prompt set) on L_arg layers or, with
 * L_arg 0, on as many as layers_that_fit gives for this sizing, a layer less
 * each time creation runs out of device memory; returns the layers. */
static long bench_fit(bench *b, const ls_model_config *full_cfg, long L_arg)
{
    ls_model *full;
    CK(ls_model_synthetic(full_cfg, 1, &full, &g_err));
    size_t free_b, total_b;
    CU(cudaMemGetInfo(&free_b, &total_b));
    /* the CUDA context, events, the digest stream; with --tier tc also the
     * GEMM qualification's own buffers (up to [1024 x 151936] fp32 outputs) */
    size_t arena = free_b - (g_tier != LS_TIER_PORTABLE ? 8 : 1) * GIB;
    long L = L_arg ? L_arg : layers_that_fit(full, (double)arena, b->T, b->slots, b->cap);
    if (L > full_cfg->n_layers) L = full_cfg->n_layers;
    ls_model_close(full);
    ls_error err;
    ls_error_clear(&err);
    while (L >= 1 && bench_open(b, L, arena, &err) != LS_OK) {
        if (L_arg) {
            fprintf(stderr, "bench_gpu: %ld layers do not fit: %s\n", L, err.msg);
            exit(2);
        }
        fprintf(stderr, "bench_gpu: %ld layers do not fit (%s); trying %ld\n", L, err.msg, L - 1);
        L--;
    }
    if (L < 1) {
        fprintf(stderr, "bench_gpu: not even one layer fits\n");
        exit(2);
    }
    return L;
}

static void bench_close(bench *b)
{
    ls_engine_destroy(b->e);
    ls_model_close(b->m);
    free(b->prompt);
    b->e = NULL;
    b->m = NULL;
    b->prompt = NULL;
}

/* The model, device and engine lines of b's engine on L layers. */
static void describe(const bench *b, long L, long n_layers_full, const struct cudaDeviceProp *prop,
                     size_t total_b)
{
    long n_att = 0;
    double weights = wbytes(&b->m->embed) + wbytes(&b->m->lm_head);
    for (long l = 0; l < L; l++) {
        n_att += b->m->cfg.is_attention[l];
        weights += layer_bytes(b->m, l);
    }
    if (g_fp8)
        printf("model: %s config (synth preset), FP8 release layout (%ld e4m3 matrices with 128 x 128 "
               "block scales, the rest bf16), --fp8 %s (%s), %ld of its %ld layers\n", g_preset,
               b->m->n_fp8, g_fp8, strcmp(g_fp8, "w8a8") ? "weights dequantised to fp32"
               : "e4m3 weights against per-token-group e4m3 activations", L, n_layers_full);
    else
        printf("model: %s config (synth preset), bf16 weights, %ld of its %ld layers\n", g_preset, L,
               n_layers_full);
    printf("device: %s, %d SMs, %.1f GiB; layers %ld (%ld attention), weights %.1f GiB generated on device\n",
           prop->name, prop->multiProcessorCount, total_b / 1073741824.0, L, n_att, weights / 1073741824.0);
    printf("engine: ls_engine_step on the %s backend (synthetic weights), max_rows %ld, %ld slots of %ld "
           "positions, state digests every 64 positions\n", ls_engine_backend_name(b->e), b->T, b->slots, b->cap);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    long L_arg = 0, prefill = 1024;
    int reps = 5, breakdown = 0, moe_plans = 0, linear_plans = 0, only_ttft = 0, only_kernels = 0, n_lens = 0,
        n_conc = 2, profile = 0;
    long lens[TTFT_MAX], conc[TTFT_MAX] = {1, 8};
    const char *conc_arg = NULL;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--breakdown")) { breakdown = 1; i--; continue; }
        if (!strcmp(argv[i], "--moe-plans")) { moe_plans = 1; i--; continue; }
        if (!strcmp(argv[i], "--linear-plans")) { linear_plans = 1; i--; continue; }
        if (!strcmp(argv[i], "--profile-decode")) { profile = 1; i--; continue; }
        if (!strcmp(argv[i], "--only-ttft")) { only_ttft = 1; i--; continue; }
        if (!strcmp(argv[i], "--only-kernels")) { only_kernels = 1; i--; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "bench_gpu: %s needs a value\n", argv[i]); return 2; }
        if (!strcmp(argv[i], "--layers")) L_arg = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--prefill")) prefill = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--preset")) g_preset = argv[i + 1];
        else if (!strcmp(argv[i], "--fp8")) g_fp8 = argv[i + 1];
        else if (!strcmp(argv[i], "--tier") && ls_run_parse_tier("--tier", argv[i + 1], &g_tier, &g_err) == LS_OK) {}
        else if (!strcmp(argv[i], "--ttft")) {
            if (!(n_lens = parse_list("--ttft", argv[i + 1], 1, 1L << 20, lens))) return 2;
        } else if (!strcmp(argv[i], "--ttft-conc")) {
            conc_arg = argv[i + 1];
            if (!(n_conc = parse_list("--ttft-conc", conc_arg, 1, BMAX, conc))) return 2;
        } else {
            fprintf(stderr, "usage: bench_gpu [--preset NAME] [--fp8 dequant|w8a8] [--tier portable|tc|fast] "
                            "[--layers N] [--prefill T] [--reps N] [--breakdown] [--moe-plans] [--linear-plans] "
                            "[--profile-decode] "
                            "[--ttft LENS [--ttft-conc LIST] [--only-ttft]] [--only-kernels]\n");
            return 2;
        }
    }
    if (g_fp8 && strcmp(g_fp8, "dequant") && strcmp(g_fp8, "w8a8")) {
        fprintf(stderr, "bench_gpu: --fp8 '%s': expected dequant or w8a8\n", g_fp8);
        return 2;
    }
    if (reps < 1 || reps > MAX_REPS || prefill < 1 || prefill > 65536 || L_arg < 0) {
        fprintf(stderr, "bench_gpu: --reps 1..%d, --prefill 1..65536, --layers >= 1\n", MAX_REPS);
        return 2;
    }
    if (!n_lens && (only_ttft || conc_arg)) {
        fprintf(stderr, "bench_gpu: %s: needs --ttft LENS\n", only_ttft ? "--only-ttft" : "--ttft-conc");
        return 2;
    }
    ls_model_config full_cfg;
    bench_config(0, &full_cfg);
    /* the TTFT engine's positions: the longest prompt and its decode steps */
    long ttft_cap = n_lens ? max_of(lens, n_lens) + 2 + reps : 0;
    if (ttft_cap > full_cfg.max_positions) {
        fprintf(stderr, "bench_gpu: --ttft %ld: with its %d decode steps past the model's "
                "max_position_embeddings (%ld)\n", max_of(lens, n_lens), 2 + reps, full_cfg.max_positions);
        return 2;
    }
    if (ls_cuda_device_count() < 1) { printf("SKIP: no CUDA device\n"); return 77; }
    ls_error_clear(&g_err);
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    size_t free_b, total_b;
    CU(cudaMemGetInfo(&free_b, &total_b));
    timer tm;
    CU(cudaEventCreate(&tm.a));
    CU(cudaEventCreate(&tm.b));

    bench b;
    memset(&b, 0, sizeof b);
    b.T = prefill > BMAX ? prefill : BMAX;
    b.rng = 7;
    double bw = 0;
    if (!only_ttft) {
        /* Kernel micro-benchmarks first, in memory the engine takes afterwards. */
        bw = copy_bandwidth(&tm, reps);
        if (moe_plans) moe_plan_table(&full_cfg, &tm, bw, prefill, reps);
        if (linear_plans) linear_plan_table(&full_cfg, &tm, bw, prefill, reps);
        float rec_ms = gdn_scan(&full_cfg, &tm, reps);
        float port_ms = gdn_chunked_scan(&full_cfg, &tm, reps, 0, 0.0f, 0.0f);
        gdn_chunked_scan(&full_cfg, &tm, reps, 1, rec_ms, port_ms);
    }
    if (!only_ttft && !only_kernels) {
        /* The engine: as many layers as fit (or --layers), 1 + BMAX slots of
         * prefill + the decode steps' positions, max_rows for the prefill. */
        b.cap = prefill + decode_steps(reps) + (profile ? 2 * (DECODE_WARM + 1) : 0);
        b.slots = 1 + BMAX;
        bench_prompt(&b, b.cap, &full_cfg);
        long L = bench_fit(&b, &full_cfg, L_arg);
        describe(&b, L, full_cfg.n_layers, &prop, total_b);

        prefill_and_replay(&b, prefill, reps, breakdown);
        fill_batch(&b, prefill);
        decode(&b, 1, 0, bw, reps, breakdown);
        if (profile) profile_decode(&b);
        decode(&b, BMAX, 1, bw, reps, breakdown);
        bench_close(&b);
    }
    if (n_lens) {
        /* An engine of its own: a slot's KV cache holds its capacity from
         * creation on, so it is sized for the largest point (the most
         * sequences, the longest prompt) and the points take turns. */
        b.slots = max_of(conc, n_conc);
        b.cap = ttft_cap;
        bench_prompt(&b, b.slots * b.cap, &full_cfg);
        printf("ttft: an engine for %ld sequences of up to %ld positions (prompts up to %ld tokens and %d "
               "decode steps)\n", b.slots, b.cap, ttft_cap - 2 - reps, 2 + reps);
        fflush(stdout);
        long L = bench_fit(&b, &full_cfg, L_arg);
        describe(&b, L, full_cfg.n_layers, &prop, total_b);
        ttft_table(&b, L, lens, n_lens, conc, n_conc, reps);
        bench_close(&b);
    }

    printf("bench_gpu: done\n");
    return 0;
}
