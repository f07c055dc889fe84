/* lockstep — performance of the portable strict CUDA tier on Qwen3-Next-80B-A3B
 * layer shapes (harness/bench_gpu runs it and writes reports/perf-h200.md).
 *
 * Weights are synthetic bf16 generated on the device by a counter-based
 * generator (splitmix64 of seed and element index), never read from disk. The
 * layer stack mirrors the engine's per-layer op sequence (src/engine/engine.c)
 * through the kernels of kernels/ops.h: every 4th layer full attention, the
 * others Gated DeltaNet, each followed by the 512-expert top-10 MoE.
 *
 * Every figure is a ratio of two times measured in this one run (median of
 * repeats, CUDA events, after warm-up):
 *   copy      device-to-device cudaMemcpy bandwidth (read + write bytes / time)
 *   decode    one step at batch 1 and 32 vs the bytes it must read / copy bandwidth;
 *             also the same step replayed as one CUDA graph (the launch cost)
 *   gdn_scan  strict recurrent GDN over 8192 tokens, one layer, vs FLA's 0.472 ms
 *   prefill   tokens/s of the layer stack, one call; replay in chunks
 *   digest    per decode step: default digest set, and with every-position
 *             state digests, vs the step time
 *
 * --breakdown adds, for decode and prefill, the time of every op of the step
 * (CUDA events between ops; the events themselves add a little).
 *
 * --moe-plans adds the MoE experts alone under every kernel plan of
 * ls_cuda_moe_forward_plan, at 1 .. prefill tokens, vs the bytes of the
 * distinct experts routed to / copy bandwidth (and checks that every plan
 * gives the same bits).
 *
 *   bench_gpu [--layers N] [--prefill T] [--reps N] [--breakdown] [--moe-plans] */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"
#include "ls_cuda.h"
#include "ops.h"
#include "sha256.h"

extern "C" {
#include "fingerprint/sha256.h"
}

/* ---- shapes (Qwen3-Next-80B-A3B) ------------------------------------------------- */
enum {
    D = 2048, V = 151936,
    HQ = 16, HKV = 2, HD = 256, ROT = 64,           /* attention; rotary dims 256 * 0.25 */
    HK = 16, HV = 32, DK = 128, DV = 128, CK = 4,   /* GDN */
    E = 512, TOPK = 10, I = 512, IS = 512,          /* MoE */
    QKVZ = 2 * HK * DK + 2 * HV * DV,               /* 12288 */
    CONV = 2 * HK * DK + HV * DV,                   /* 8192 */
    CAP = 2048                                      /* KV cache positions per sequence */
};

#define CK_(call) do { ls_error e_; ls_error_clear(&e_); if ((call) != LS_OK) { \
    fprintf(stderr, "bench_gpu: %s:%d: %s\n", __FILE__, __LINE__, e_.msg); exit(2); } } while (0)
#define CU_(call) do { cudaError_t c_ = (call); if (c_ != cudaSuccess) { \
    fprintf(stderr, "bench_gpu: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(c_)); \
    exit(2); } } while (0)
/* Calls with an ls_error named err in scope. */
#define T_(call) do { if ((call) != LS_OK) { fprintf(stderr, "bench_gpu: %s:%d: %s\n", __FILE__, \
    __LINE__, err.msg); exit(2); } } while (0)

/* ---- device generator -------------------------------------------------------------- */
__device__ __host__ static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
/* uniform in [-1, 1) from (seed, i) */
__device__ static float uni(uint64_t seed, uint64_t i)
{
    uint64_t r = mix64(seed + (i + 1) * 0x9E3779B97F4A7C15ull);
    return (float)((int64_t)(r >> 40) - (1ll << 23)) * (1.0f / 8388608.0f);
}
__global__ void gen_bf16(uint16_t *p, size_t n, uint64_t seed, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = uni(seed, i) * scale;
        uint32_t u; memcpy(&u, &v, 4);
        u += 0x7fffu + ((u >> 16) & 1u);
        p[i] = (uint16_t)(u >> 16);
    }
}
__global__ void gen_f32(float *p, size_t n, uint64_t seed, float scale, float offset, int bf16_round)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = offset + uni(seed, i) * scale;
        if (bf16_round) { uint32_t u; memcpy(&u, &v, 4); u += 0x7fffu + ((u >> 16) & 1u); u &= 0xffff0000u; memcpy(&v, &u, 4); }
        p[i] = v;
    }
}
__global__ void gen_i32(int32_t *p, size_t n, uint64_t seed, int32_t mod)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (int32_t)(mix64(seed + i * 0x9E3779B97F4A7C15ull) % (uint64_t)mod);
}

static ls_cuda_arena g_arena;
static uint64_t g_seed = 1;
static void *dalloc(size_t bytes)
{
    ls_error err; ls_error_clear(&err);
    void *p = ls_cuda_arena_alloc(&g_arena, bytes, &err);
    if (!p) { fprintf(stderr, "bench_gpu: %s\n", err.msg); exit(2); }
    return p;
}
static uint16_t *wbf16(size_t n, float scale)
{
    uint16_t *p = (uint16_t *)dalloc(n * 2);
    gen_bf16<<<1024, 256>>>(p, n, g_seed++ * 0x1234567ull, scale);
    CU_(cudaGetLastError());
    return p;
}
static float *wf32(size_t n, float scale, float offset)
{
    float *p = (float *)dalloc(n * 4);
    gen_f32<<<1024, 256>>>(p, n, g_seed++ * 0x7654321ull, scale, offset, 1);
    CU_(cudaGetLastError());
    return p;
}
static float *af32(size_t n) { return wf32(n, 0.5f, 0.0f); } /* activations: never zeros */

/* ---- model ----------------------------------------------------------------------------- */
typedef struct layer {
    int attn;
    float *in_norm, *post_norm;                 /* [D] */
    uint16_t *qkvz, *ba, *conv, *out;           /* [QKVZ,D] [2HV,D] [CONV,CK] [D,HV*DV] */
    float *A_log, *dt_bias, *gnorm;             /* [HV] [HV] [DV] */
    uint16_t *q, *k, *v, *o;                    /* [2HQ*HD,D] [HKV*HD,D] x2 [D,HQ*HD] */
    float *q_norm, *k_norm;                     /* [HD] */
    uint16_t *router;                           /* [E, D] */
    ls_cuda_moe moe;
    size_t weight_bytes, dense_bytes;           /* all weights; weights read whatever the routing */
} layer;

typedef struct seqst {                          /* per sequence, per layer */
    float **conv, **gdn, **kc, **vc;
} seqst;

typedef struct model {
    int L;
    uint16_t *embed, *lm_head;                  /* [V, D] */
    float *final_norm;
    layer *ly;
    int max_seqs;
    seqst *ss;
    long Tmax;
    /* work, [Tmax, ...] */
    float *H, *XN, *A, *P, *BAo, *Z, *Bv, *Av, *Y, *Q, *K, *Vv, *beta, *alpha, *O, *QG, *G, *probs,
          *wts, *logits, *cosb, *sinb;
    int32_t *ids, *tok, *pos;
    void *moe_scratch;
    cudaStream_t st;
} model;

static size_t layer_bytes(int attn)
{
    size_t dense = attn ? ((size_t)2 * HQ * HD * D + 2 * (size_t)HKV * HD * D + (size_t)D * HQ * HD) * 2
                        : ((size_t)QKVZ * D + (size_t)2 * HV * D + (size_t)CONV * CK + (size_t)D * HV * DV) * 2;
    dense += (size_t)E * D * 2 + (size_t)3 * IS * D * 2 + (size_t)D * 2;
    return dense + (size_t)E * 3 * I * D * 2;
}

static void build_layer(layer *l, int attn)
{
    float ws = 0.04f; /* ~ 1/sqrt(D) * 1.8: activations keep a realistic spread */
    l->attn = attn;
    l->in_norm = wf32(D, 0.1f, 0.0f);
    l->post_norm = wf32(D, 0.1f, 0.0f);
    size_t dense = 0;
    if (attn) {
        l->q = wbf16((size_t)2 * HQ * HD * D, ws);
        l->k = wbf16((size_t)HKV * HD * D, ws);
        l->v = wbf16((size_t)HKV * HD * D, ws);
        l->o = wbf16((size_t)D * HQ * HD, 0.03f);
        l->q_norm = wf32(HD, 0.1f, 0.0f);
        l->k_norm = wf32(HD, 0.1f, 0.0f);
        dense = ((size_t)2 * HQ * HD * D + 2 * (size_t)HKV * HD * D + (size_t)D * HQ * HD) * 2;
    } else {
        l->qkvz = wbf16((size_t)QKVZ * D, ws);
        l->ba = wbf16((size_t)2 * HV * D, ws);
        l->conv = wbf16((size_t)CONV * CK, 0.5f);
        l->out = wbf16((size_t)D * HV * DV, 0.03f);
        l->A_log = wf32(HV, 1.0f, 1.5f);
        l->dt_bias = wf32(HV, 1.0f, -2.0f);
        l->gnorm = wf32(DV, 0.1f, 1.0f);
        dense = ((size_t)QKVZ * D + (size_t)2 * HV * D + (size_t)CONV * CK + (size_t)D * HV * DV) * 2;
    }
    l->router = wbf16((size_t)E * D, 0.05f);
    uint16_t *eg = wbf16((size_t)E * I * D, ws), *eu = wbf16((size_t)E * I * D, ws);
    uint16_t *ed = wbf16((size_t)E * D * I, 0.06f);
    const void **tab = (const void **)malloc(sizeof(void *) * 3 * E);
    for (int e = 0; e < E; e++) {
        tab[e] = eg + (size_t)e * I * D;
        tab[E + e] = eu + (size_t)e * I * D;
        tab[2 * E + e] = ed + (size_t)e * D * I;
    }
    void *dtab = dalloc(sizeof(void *) * 3 * E);
    CU_(cudaMemcpy(dtab, tab, sizeof(void *) * 3 * E, cudaMemcpyHostToDevice));
    free(tab);
    l->moe.E = E; l->moe.D = D; l->moe.I = I; l->moe.Is = IS; l->moe.wtype = 0;
    l->moe.gate = (const void *const *)dtab;
    l->moe.up = (const void *const *)dtab + E;
    l->moe.down = (const void *const *)dtab + 2 * E;
    l->moe.sh_gate = wbf16((size_t)IS * D, ws);
    l->moe.sh_up = wbf16((size_t)IS * D, ws);
    l->moe.sh_down = wbf16((size_t)D * IS, 0.06f);
    l->moe.sh_gate_w = wbf16(D, 0.05f);
    l->dense_bytes = dense + (size_t)E * D * 2 + (size_t)3 * IS * D * 2 + (size_t)D * 2;
    l->weight_bytes = layer_bytes(attn);
}

static void build_model(model *m, int L, long Tmax, int max_seqs)
{
    m->L = L;
    m->Tmax = Tmax;
    m->max_seqs = max_seqs;
    m->embed = wbf16((size_t)V * D, 0.5f);
    m->lm_head = wbf16((size_t)V * D, 0.05f);
    m->final_norm = wf32(D, 0.1f, 0.0f);
    m->ly = (layer *)calloc((size_t)L, sizeof(layer));
    for (int i = 0; i < L; i++) build_layer(&m->ly[i], (i + 1) % 4 == 0);
    long T = Tmax;
    m->H = af32((size_t)T * D); m->XN = af32((size_t)T * D); m->A = af32((size_t)T * D);
    m->P = af32((size_t)T * QKVZ); m->BAo = af32((size_t)T * 2 * HV); m->Z = af32((size_t)T * HV * DV);
    m->Bv = af32((size_t)T * HV); m->Av = af32((size_t)T * HV); m->Y = af32((size_t)T * CONV);
    m->Q = af32((size_t)T * HQ * HD); m->K = af32((size_t)T * HV * DV); m->Vv = af32((size_t)T * HV * DV);
    m->beta = af32((size_t)T * HV); m->alpha = af32((size_t)T * HV); m->O = af32((size_t)T * HQ * HD);
    m->QG = af32((size_t)T * 2 * HQ * HD); m->G = af32((size_t)T * HQ * HD); m->probs = af32((size_t)T * E);
    m->wts = af32((size_t)T * TOPK); m->logits = af32((size_t)T * V);
    m->cosb = wf32((size_t)T * ROT / 2, 1.0f, 0.0f); m->sinb = wf32((size_t)T * ROT / 2, 1.0f, 0.0f);
    m->ids = (int32_t *)dalloc((size_t)T * TOPK * 4);
    m->tok = (int32_t *)dalloc((size_t)T * 4);
    gen_i32<<<64, 256>>>(m->tok, (size_t)T, 99, V);
    m->pos = (int32_t *)dalloc((size_t)T * 4);
    long chunk = 65535 / (TOPK + 1);
    m->moe_scratch = dalloc(ls_cuda_moe_scratch_bytes(&m->ly[0].moe, T < chunk ? T : chunk, TOPK));
    m->ss = (seqst *)calloc((size_t)max_seqs, sizeof(seqst));
    for (int s = 0; s < max_seqs; s++) {
        seqst *q = &m->ss[s];
        q->conv = (float **)calloc((size_t)L, sizeof(float *));
        q->gdn = (float **)calloc((size_t)L, sizeof(float *));
        q->kc = (float **)calloc((size_t)L, sizeof(float *));
        q->vc = (float **)calloc((size_t)L, sizeof(float *));
        for (int l = 0; l < L; l++) {
            if (m->ly[l].attn) {
                q->kc[l] = af32((size_t)HKV * CAP * HD);
                q->vc[l] = af32((size_t)HKV * CAP * HD);
            } else {
                q->conv[l] = af32((size_t)CONV * CK);
                q->gdn[l] = wf32((size_t)HV * DK * DV, 0.05f, 0.0f);
            }
        }
    }
    CU_(cudaStreamCreateWithFlags(&m->st, cudaStreamNonBlocking));
    CU_(cudaDeviceSynchronize());
}

static void copy2d(cudaStream_t st, float *dst, long dpitch, const float *src, long spitch, long width,
                   long rows)
{
    CU_(cudaMemcpy2DAsync(dst, (size_t)dpitch * 4, src, (size_t)spitch * 4, (size_t)width * 4, (size_t)rows,
                          cudaMemcpyDeviceToDevice, st));
}

/* One forward over nseq sequences of n tokens each (rows packed sequence by
 * sequence), positions p0.. of every sequence. Mirrors engine.c forward(). */
/* Parts of the step left out, to place the time (bench only): 1 mixers, 2 MoE. */
static int g_skip;

/* --breakdown: an event before every op of a forward; the time between two
 * events goes to the op that follows the first (bench only). */
#define PROF_MAX 4096
static int g_prof, g_nmark;
static cudaEvent_t g_ev[PROF_MAX];
static const char *g_evname[PROF_MAX];
typedef struct bucket { const char *name; double ms; long n; } bucket;
static bucket g_bk[64];
static int g_nbk;

static void mark(cudaStream_t st, const char *name)
{
    if (!g_prof) return;
    if (g_nmark == PROF_MAX) { fprintf(stderr, "bench_gpu: too many marks\n"); exit(2); }
    if (!g_ev[g_nmark]) CU_(cudaEventCreate(&g_ev[g_nmark]));
    CU_(cudaEventRecord(g_ev[g_nmark], st));
    g_evname[g_nmark++] = name;
}

/* Called after the stream is synchronised: adds the marked spans. */
static void prof_collect(void)
{
    for (int i = 0; i + 1 < g_nmark; i++) {
        float ms;
        CU_(cudaEventElapsedTime(&ms, g_ev[i], g_ev[i + 1]));
        int b = 0;
        while (b < g_nbk && strcmp(g_bk[b].name, g_evname[i])) b++;
        if (b == g_nbk) {
            if (g_nbk == 64) continue;
            g_bk[g_nbk++] = (bucket){g_evname[i], 0.0, 0};
        }
        g_bk[b].ms += ms;
        g_bk[b].n++;
    }
    g_nmark = 0;
}

static int cmp_bucket(const void *a, const void *b)
{
    double x = ((const bucket *)a)->ms, y = ((const bucket *)b)->ms;
    return (x < y) - (x > y);
}

/* Prints the buckets over `runs` forwards (per forward), largest first. */
static void prof_print(const char *what, int runs)
{
    double tot = 0;
    for (int b = 0; b < g_nbk; b++) tot += g_bk[b].ms;
    qsort(g_bk, (size_t)g_nbk, sizeof(bucket), cmp_bucket);
    printf("breakdown of %s (per step, an event between every two ops; total %.3f ms):\n", what, tot / runs);
    for (int b = 0; b < g_nbk; b++)
        printf("  %-28s %8.3f ms  %5.1f %%  %6ld launches\n", g_bk[b].name, g_bk[b].ms / runs,
               100.0 * g_bk[b].ms / tot, g_bk[b].n / runs);
    g_nbk = 0;
}

#define BENCH_MAX_SEQS 1024
static float *g_st[BENCH_MAX_SEQS], *g_st2[BENCH_MAX_SEQS];
static long g_row0[BENCH_MAX_SEQS], g_len[BENCH_MAX_SEQS], g_pos0[BENCH_MAX_SEQS];

static void forward(model *m, int nseq, long n, long p0, int act)
{
    ls_error err; ls_error_clear(&err);
    if (nseq > BENCH_MAX_SEQS) { fprintf(stderr, "bench_gpu: %d sequences\n", nseq); exit(2); }
    for (int q = 0; q < nseq; q++) {
        g_row0[q] = (long)q * n;
        g_len[q] = n;
        g_pos0[q] = p0;
    }
    cudaStream_t st = m->st;
    void *s = (void *)st;
    long T = (long)nseq * n;
    mark(st, "embed");
    T_(ls_cuda_embed(m->embed, 0, V, D, m->tok, T, m->H, act, s, &err));
    for (int li = 0; li < m->L; li++) {
        layer *l = &m->ly[li];
        mark(st, "rmsnorm (input)");
        T_(ls_cuda_rmsnorm(m->H, l->in_norm, m->XN, T, D, act, 0, s, &err));
        if (g_skip & 1) {
        } else if (!l->attn) {
            mark(st, "linear qkvz");
            T_(ls_cuda_linear(l->qkvz, 0, QKVZ, D, m->XN, m->P, T, act, 0, s, &err));
            mark(st, "linear ba");
            T_(ls_cuda_linear(l->ba, 0, 2 * HV, D, m->XN, m->BAo, T, act, 0, s, &err));
            mark(st, "copies (split)");
            copy2d(st, m->Z, HV * DV, m->P + CONV, QKVZ, HV * DV, T);
            copy2d(st, m->Bv, HV, m->BAo, 2 * HV, HV, T);
            copy2d(st, m->Av, HV, m->BAo + HV, 2 * HV, HV, T);
            /* One launch over all sequences (the engine's batched mixer ops). */
            for (int q = 0; q < nseq; q++) g_st[q] = m->ss[q].conv[li];
            mark(st, "conv+silu");
            T_(ls_cuda_conv_silu_batch(m->P, QKVZ, l->conv, 0, g_st, g_row0, g_len, nseq, m->Y, CONV,
                                       CONV, CK, act, 0, s, &err));
            mark(st, "copies (split)");
            copy2d(st, m->Q, HK * DK, m->Y, CONV, HK * DK, T);
            copy2d(st, m->K, HK * DK, m->Y + HK * DK, CONV, HK * DK, T);
            copy2d(st, m->Vv, HV * DV, m->Y + 2 * HK * DK, CONV, HV * DV, T);
            mark(st, "l2norm q,k");
            T_(ls_cuda_l2norm_scale(m->Q, T * HK, DK, 0.08838834764831845f, 0, s, &err));
            T_(ls_cuda_l2norm_scale(m->K, T * HK, DK, 1.0f, 0, s, &err));
            mark(st, "gdn gates");
            T_(ls_cuda_gdn_gates(m->Bv, m->Av, l->A_log, l->dt_bias, m->beta, m->alpha, T, HV, act, s, &err));
            for (int q = 0; q < nseq; q++) g_st[q] = m->ss[q].gdn[li];
            mark(st, "gdn recurrent");
            T_(ls_cuda_gdn_recurrent_batch(m->Q, m->K, m->Vv, m->alpha, m->beta, g_st, g_row0, g_len,
                                           nseq, m->O, HK, HV, DK, DV, act, 0, s, &err));
            mark(st, "gated rmsnorm");
            T_(ls_cuda_gated_rmsnorm(m->O, m->Z, l->gnorm, m->O, T * HV, DV, act, 0, s, &err));
            mark(st, "linear out (gdn)");
            T_(ls_cuda_linear(l->out, 0, D, HV * DV, m->O, m->A, T, act, 0, s, &err));
        } else {
            mark(st, "linear q (attn)");
            T_(ls_cuda_linear(l->q, 0, 2 * HQ * HD, D, m->XN, m->QG, T, act, 0, s, &err));
            mark(st, "linear k,v (attn)");
            T_(ls_cuda_linear(l->k, 0, HKV * HD, D, m->XN, m->K, T, act, 0, s, &err));
            T_(ls_cuda_linear(l->v, 0, HKV * HD, D, m->XN, m->Vv, T, act, 0, s, &err));
            mark(st, "copies (split)");
            copy2d(st, m->Q, HD, m->QG, 2 * HD, HD, T * HQ);
            copy2d(st, m->G, HD, m->QG + HD, 2 * HD, HD, T * HQ);
            mark(st, "q/k norm + rope");
            T_(ls_cuda_rmsnorm(m->Q, l->q_norm, m->Q, T * HQ, HD, act, 0, s, &err));
            T_(ls_cuda_rmsnorm(m->K, l->k_norm, m->K, T * HKV, HD, act, 0, s, &err));
            T_(ls_cuda_rope_apply(m->Q, m->cosb, m->sinb, T, HQ, HD, ROT, act, s, &err));
            T_(ls_cuda_rope_apply(m->K, m->cosb, m->sinb, T, HKV, HD, ROT, act, s, &err));
            mark(st, "kv append");
            for (int q = 0; q < nseq; q++) {
                g_st[q] = m->ss[q].kc[li];
                g_st2[q] = m->ss[q].vc[li];
            }
            T_(ls_cuda_kv_append_batch(m->K, m->Vv, g_st, g_st2, CAP, g_row0, g_len, g_pos0, nseq, HKV,
                                       HD, s, &err));
            mark(st, "attention");
            T_(ls_cuda_attention_batch(m->Q, (const float *const *)g_st, (const float *const *)g_st2,
                                       CAP, g_row0, g_len, nseq, m->pos, m->O, HQ, HKV, HD, act, 0, s,
                                       &err));
            mark(st, "sigmoid gate");
            T_(ls_cuda_sigmoid_gate(m->O, m->G, T * HQ * HD, act, s, &err));
            mark(st, "linear o (attn)");
            T_(ls_cuda_linear(l->o, 0, D, HQ * HD, m->O, m->A, T, act, 0, s, &err));
        }
        mark(st, "residual");
        T_(ls_cuda_residual(m->H, m->A, T * D, act, s, &err));
        mark(st, "rmsnorm (post)");
        T_(ls_cuda_rmsnorm(m->H, l->post_norm, m->XN, T, D, act, 0, s, &err));
        mark(st, "router");
        T_(ls_cuda_router(l->router, 0, E, D, m->XN, T, TOPK, 1, m->probs, m->ids, m->wts, act, 0, s, &err));
        long chunk = 65535 / (TOPK + 1);
        for (long t0 = 0; t0 < T && !(g_skip & 2); t0 += chunk) {
            long c = T - t0 < chunk ? T - t0 : chunk;
            if (t0 == 0) mark(st, "moe experts");
            T_(ls_cuda_moe_forward(&l->moe, m->XN + t0 * D, m->ids + t0 * TOPK, m->wts + t0 * TOPK, TOPK,
                                   m->A + t0 * D, c, m->moe_scratch, act, 0, 0, s, &err));
        }
        mark(st, "residual");
        T_(ls_cuda_residual(m->H, m->A, T * D, act, s, &err));
    }
    mark(st, "final norm");
    T_(ls_cuda_rmsnorm(m->H, m->final_norm, m->XN, T, D, act, 0, s, &err));
    mark(st, "lm_head");
    T_(ls_cuda_linear(m->lm_head, 0, V, D, m->XN, m->logits, T, act, 0, s, &err));
    mark(st, "logprobs");
    T_(ls_cuda_logprobs(m->logits, m->logits, T, V, 0, s, &err));
    mark(st, "end");
}

/* Positions p0 .. p0+n-1 for each of nseq sequences. */
static void set_pos(model *m, int nseq, long n, long p0)
{
    int32_t *h = (int32_t *)malloc(sizeof(int32_t) * (size_t)nseq * n);
    for (int q = 0; q < nseq; q++)
        for (long i = 0; i < n; i++) h[q * n + i] = (int32_t)(p0 + i);
    CU_(cudaMemcpy(m->pos, h, sizeof(int32_t) * (size_t)nseq * n, cudaMemcpyHostToDevice));
    free(h);
}

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

typedef struct timer { cudaEvent_t a, b; } timer;
static void tstart(timer *t, cudaStream_t s) { CU_(cudaEventRecord(t->a, s)); }
static float tstop(timer *t, cudaStream_t s)
{
    float ms;
    CU_(cudaEventRecord(t->b, s));
    CU_(cudaEventSynchronize(t->b));
    CU_(cudaEventElapsedTime(&ms, t->a, t->b));
    return ms;
}

static int host_sha(const void *p, size_t len, uint8_t out[32])
{
    ls_error err; ls_digest d;
    if (ls_sha256_buf(p, len, &d, &err) != LS_OK) return 1;
    memcpy(out, d.bytes, 32);
    return 0;
}

/* The digest jobs of one decode step for nseq sequences (engine.h's set):
 * hidden rows (embed, each mixer and moe residual, final norm) and logits in
 * bf16, KV rows, router ids + weights; with states: GDN state (fp32 raw) and
 * conv state (bf16) of every GDN layer. */
static int digest_jobs(model *m, int nseq, int states, ls_cuda_digest_job *j)
{
    int n = 0;
    for (int q = 0; q < nseq; q++) {
        ls_cuda_digest_job z; memset(&z, 0, sizeof z);
        z.src[0] = m->H + (size_t)q * D; z.n[0] = D; z.bf16[0] = 1;
        for (int t = 0; t < 2 * m->L + 2; t++) j[n++] = z;
        z.src[0] = m->logits + (size_t)q * V; z.n[0] = V; z.bf16[0] = 1;
        j[n++] = z;
        for (int l = 0; l < m->L; l++) {
            ls_cuda_digest_job r; memset(&r, 0, sizeof r);
            r.src[0] = m->ids + (size_t)q * TOPK; r.n[0] = TOPK;
            r.src[1] = m->wts + (size_t)q * TOPK; r.n[1] = TOPK;
            j[n++] = r;
            if (m->ly[l].attn) {
                ls_cuda_digest_job k; memset(&k, 0, sizeof k);
                k.src[0] = m->K + (size_t)q * HKV * HD; k.n[0] = HKV * HD; k.bf16[0] = 1;
                k.src[1] = m->Vv + (size_t)q * HKV * HD; k.n[1] = HKV * HD; k.bf16[1] = 1;
                j[n++] = k;
            } else if (states) {
                ls_cuda_digest_job g; memset(&g, 0, sizeof g);
                g.src[0] = m->ss[q].gdn[l]; g.n[0] = (uint64_t)HV * DK * DV;
                j[n++] = g;
                g.src[0] = m->ss[q].conv[l]; g.n[0] = (uint64_t)CONV * CK; g.bf16[0] = 1;
                j[n++] = g;
            }
        }
    }
    return n;
}

/* The MoE experts of one layer alone at T tokens under every plan: time, the
 * bytes of the distinct experts routed to (+ the shared expert) over the copy
 * bandwidth, and whether the plan's output bits equal plan 0's. Routing: token
 * t takes experts (h(t) + 37 i) mod E, i < TOPK (distinct). The layer used
 * rotates with the repeat so that its weights are not all in L2. */
static void moe_plan_table(model *m, timer *tm, double bw, long tmax, int reps)
{
    long Ts[] = {1, 4, 32, 256, 1024, 4096};
    int np = ls_cuda_moe_plan_count();
    float *ref = (float *)malloc(sizeof(float) * (size_t)tmax * D);
    float *got = (float *)malloc(sizeof(float) * (size_t)tmax * D);
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)tmax * TOPK);
    printf("moe experts alone, one layer, by kernel plan (time; bytes of the distinct experts / copy "
           "bandwidth; bits vs plan 0):\n");
    float t[64];
    for (int ti = 0; ti < (int)(sizeof Ts / sizeof Ts[0]); ti++) {
        long T = Ts[ti];
        if (T > tmax) break;
        char used[E];
        memset(used, 0, sizeof used);
        for (long q = 0; q < T; q++) {
            uint64_t h = mix64(0x5eedull + (uint64_t)q);
            for (int i = 0; i < TOPK; i++) {
                ids[q * TOPK + i] = (int32_t)((h + 37u * (uint64_t)i) % E);
                used[ids[q * TOPK + i]] = 1;
            }
        }
        int distinct = 0;
        for (int e = 0; e < E; e++) distinct += used[e];
        CU_(cudaMemcpy(m->ids, ids, sizeof(int32_t) * (size_t)T * TOPK, cudaMemcpyHostToDevice));
        double bytes = (double)(distinct + 1) * 3 * I * D * 2;
        double roof = bytes / bw * 1e3;
        for (int p = 0; p < np; p++) {
            ls_error err; ls_error_clear(&err);
            for (int r = 0; r < 1 + reps; r++) {
                layer *l = &m->ly[r % m->L];
                tstart(tm, m->st);
                T_(ls_cuda_moe_forward_plan(&l->moe, m->XN, m->ids, m->wts, TOPK, m->A, T, m->moe_scratch,
                                            1, 0, 0, p, (void *)m->st, &err));
                float ms = tstop(tm, m->st);
                if (r >= 1) t[r - 1] = ms;
            }
            float ms = median(t, reps);
            /* bits: the last repeat's layer, run once more on its own */
            T_(ls_cuda_moe_forward_plan(&m->ly[0].moe, m->XN, m->ids, m->wts, TOPK, m->A, T, m->moe_scratch, 1,
                                        0, 0, p, (void *)m->st, &err));
            CU_(cudaMemcpyAsync(p == 0 ? ref : got, m->A, sizeof(float) * (size_t)T * D, cudaMemcpyDeviceToHost,
                                m->st));
            CU_(cudaStreamSynchronize(m->st));
            int same = p == 0 || !memcmp(ref, got, sizeof(float) * (size_t)T * D);
            printf("  T %5ld (%3d experts) %-20s %9.3f ms = %6.2f x %.3f ms (%4.1f %%)  %s\n", T, distinct,
                   ls_cuda_moe_plan_name(p), ms, ms / roof, roof, 100.0 * roof / ms, same ? "same bits" : "BITS DIFFER");
        }
    }
    free(ref); free(got); free(ids);
}

int main(int argc, char **argv)
{
    int L = 0, reps = 5;
    long prefill = 1024;
    int breakdown = 0, moe_plans = 0;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--breakdown")) { breakdown = 1; i--; continue; }
        if (!strcmp(argv[i], "--moe-plans")) { moe_plans = 1; i--; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "bench_gpu: %s needs a value\n", argv[i]); return 2; }
        if (!strcmp(argv[i], "--layers")) L = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prefill")) prefill = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else { fprintf(stderr, "usage: bench_gpu [--layers N] [--prefill T] [--reps N] [--breakdown] [--moe-plans]\n"); return 2; }
    }
    if (ls_cuda_device_count() < 1) { printf("SKIP: no CUDA device\n"); return 77; }
    cudaDeviceProp prop;
    CU_(cudaGetDeviceProperties(&prop, 0));
    size_t free_b, total_b;
    CU_(cudaMemGetInfo(&free_b, &total_b));
    const int BMAX = 32;
    long Tmax = prefill > BMAX ? prefill : BMAX;
    /* Everything but the layers' weights: embed + lm_head, activations, states,
     * the copy and scan buffers, digest scratch; 6 GiB margin. */
    size_t act = (size_t)Tmax * 4 * (6 * D + 2 * QKVZ + CONV + 8 * HQ * HD + E + (size_t)V) + ((size_t)4 << 30);
    size_t per_seq_attn = (size_t)2 * HKV * CAP * HD * 4, per_seq_gdn = ((size_t)HV * DK * DV + CONV * CK) * 4;
    size_t fixed = (size_t)2 * V * D * 2 + act + ((size_t)16 << 30); /* + copy, scan, digest buffers */
    size_t avg_layer = (3 * layer_bytes(0) + layer_bytes(1)) / 4 + BMAX * (3 * per_seq_gdn + per_seq_attn) / 4;
    int fit = (int)((free_b - fixed) / avg_layer);
    if (L <= 0) L = fit < 48 ? fit : 48;
    if (L > 48) L = 48;
    CK_(ls_cuda_arena_init(&g_arena, free_b - ((size_t)3 << 30), &e_));
    model m;
    memset(&m, 0, sizeof m);
    build_model(&m, L, Tmax, BMAX);
    timer tm;
    CU_(cudaEventCreate(&tm.a));
    CU_(cudaEventCreate(&tm.b));
    size_t weights = (size_t)2 * V * D * 2;
    for (int l = 0; l < L; l++) weights += m.ly[l].weight_bytes;
    printf("device: %s, %d SMs, %.1f GiB; layers %d (%d attention), weights %.1f GiB generated on device\n",
           prop.name, prop.multiProcessorCount, total_b / 1073741824.0, L, L / 4, weights / 1073741824.0);
    float t[64];

    /* ---- copy bandwidth ---- */
    size_t cb = (size_t)4 << 30;
    void *c0 = dalloc(cb), *c1 = dalloc(cb);
    gen_f32<<<1024, 256>>>((float *)c0, cb / 4, 5, 1.0f, 0.0f, 0);
    for (int r = 0; r < 2 + reps; r++) {
        tstart(&tm, m.st);
        CU_(cudaMemcpyAsync(c1, c0, cb, cudaMemcpyDeviceToDevice, m.st));
        float ms = tstop(&tm, m.st);
        if (r >= 2) t[r - 2] = ms;
    }
    float copy_ms = median(t, reps);
    double bw = 2.0 * cb / (copy_ms * 1e-3); /* bytes read + written per second */
    printf("copy: %.3f ms for %zu bytes -> %.0f GB/s (read + write)\n", copy_ms, cb, bw / 1e9);

    if (moe_plans) moe_plan_table(&m, &tm, bw, prefill, reps);

    /* ---- decode steps ---- */
    int act_bf16 = 1;
    long p0 = 1024; /* context length already in the caches */
    int bs[2] = {1, BMAX};
    float dec_ms[2];
    for (int bi = 0; bi < 2; bi++) {
        int B = bs[bi];
        set_pos(&m, B, 1, p0);
        gen_i32<<<64, 256>>>(m.tok, (size_t)B, 7 + bi, V);
        for (int r = 0; r < 2 + reps; r++) {
            tstart(&tm, m.st);
            forward(&m, B, 1, p0, act_bf16);
            float ms = tstop(&tm, m.st);
            if (r >= 2) t[r - 2] = ms;
        }
        dec_ms[bi] = median(t, reps);
        { /* the same step captured once as a CUDA graph: what the launches cost */
            cudaGraph_t gr;
            cudaGraphExec_t ge;
            CU_(cudaStreamBeginCapture(m.st, cudaStreamCaptureModeThreadLocal));
            forward(&m, B, 1, p0, act_bf16);
            CU_(cudaStreamEndCapture(m.st, &gr));
            CU_(cudaGraphInstantiate(&ge, gr, 0));
            for (int r = 0; r < 2 + reps; r++) {
                tstart(&tm, m.st);
                CU_(cudaGraphLaunch(ge, m.st));
                float ms = tstop(&tm, m.st);
                if (r >= 2) t[r - 2] = ms;
            }
            float gms = median(t, reps);
            printf("decode batch %d as one CUDA graph: %.3f ms/step (launched op by op: %.3f ms)\n", B, gms,
                   dec_ms[bi]);
            CU_(cudaGraphExecDestroy(ge));
            CU_(cudaGraphDestroy(gr));
        }
        if (breakdown) {
            g_prof = 1;
            for (int r = 0; r < reps; r++) {
                forward(&m, B, 1, p0, act_bf16);
                CU_(cudaStreamSynchronize(m.st));
                prof_collect();
            }
            g_prof = 0;
            char what[64];
            snprintf(what, sizeof what, "decode batch %d", B);
            prof_print(what, reps);
        }
        float part[3];
        for (int v = 1; v <= 3; v++) { /* time left out: mixers, MoE experts, both */
            g_skip = v;
            for (int r = 0; r < 1 + reps; r++) {
                tstart(&tm, m.st);
                forward(&m, B, 1, p0, act_bf16);
                float ms = tstop(&tm, m.st);
                if (r >= 1) t[r - 1] = ms;
            }
            part[v - 1] = median(t, reps);
            g_skip = 0;
        }
        printf("decode batch %d breakdown: mixers (gdn/attention) %.3f ms, moe experts %.3f ms, rest "
               "(norms, router, residuals, lm_head, logprobs) %.3f ms\n", B, dec_ms[bi] - part[0],
               dec_ms[bi] - part[1], part[2]);
        /* Bytes the step must read: every dense weight, the distinct experts
         * the batch routes to (counted per layer on an untimed pass), the
         * lm_head, B embedding rows, states read and written, KV rows read. */
        double bytes = (double)V * D * 2 + (double)B * D * 2;
        int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)B * TOPK);
        ls_error err; ls_error_clear(&err);
        for (int l = 0; l < L; l++) {
            /* per-layer routing of this batch: rerun the layer's router on the
             * hidden rows left by the last step (same shapes, same distinct counts in
             * distribution) */
            T_(ls_cuda_router(m.ly[l].router, 0, E, D, m.XN, B, TOPK, 1, m.probs, m.ids, m.wts, act_bf16, 0,
                              (void *)m.st, &err));
            CU_(cudaMemcpyAsync(ids, m.ids, sizeof(int32_t) * (size_t)B * TOPK, cudaMemcpyDeviceToHost, m.st));
            CU_(cudaStreamSynchronize(m.st));
            char used[E];
            memset(used, 0, sizeof used);
            int distinct = 0;
            for (int i = 0; i < B * TOPK; i++) if (!used[ids[i]]) { used[ids[i]] = 1; distinct++; }
            bytes += (double)m.ly[l].dense_bytes + (double)distinct * 3 * I * D * 2;
            if (m.ly[l].attn) bytes += (double)B * 2 * HKV * (p0 + 1) * HD * 4;
            else bytes += (double)B * 2 * per_seq_gdn;
        }
        free(ids);
        printf("decode batch %d: %.3f ms/step; must read %.2f GB -> roofline %.3f ms; step / roofline = %.2f; "
               "%.1f tokens/s\n", B, dec_ms[bi], bytes / 1e9, bytes / bw * 1e3, dec_ms[bi] / (bytes / bw * 1e3),
               B / (dec_ms[bi] * 1e-3));
    }

    /* ---- digest overhead per decode step ---- */
    ls_cuda_digest_job *jobs = (ls_cuda_digest_job *)malloc(sizeof(ls_cuda_digest_job) * (size_t)BMAX * (6 * L + 8));
    size_t dscr = 0;
    for (int states = 0; states < 2; states++) {
        int nj = digest_jobs(&m, BMAX, states, jobs);
        size_t b = ls_cuda_digest_scratch_bytes(jobs, nj);
        if (b > dscr) dscr = b;
    }
    void *dscratch = dalloc(dscr);
    uint8_t *hd = (uint8_t *)malloc((size_t)BMAX * (6 * L + 8) * 32);
    printf("digest per decode step (one batched digest call per step; hashes on the device, "
           "jobs over the threshold on the host):\n");
    for (int bi = 0; bi < 2; bi++) {
        int B = bs[bi];
        for (int states = 0; states < 2; states++) {
            for (int host = 0; host < 2; host++) {
                int nj = digest_jobs(&m, B, states, jobs);
                size_t thr = host ? (size_t)32768 : SIZE_MAX;
                for (int r = 0; r < 1 + reps; r++) {
                    tstart(&tm, m.st);
                    ls_error err; ls_error_clear(&err);
                    T_(ls_cuda_digest(jobs, nj, dscratch, dscr, thr, host ? host_sha : NULL, hd, (void *)m.st, &err));
                    float ms = tstop(&tm, m.st);
                    if (r >= 1) t[r - 1] = ms;
                }
                float ms = median(t, reps);
                printf("  batch %2d, %-28s %-26s %5d jobs: %8.3f ms = %6.3f x the step\n", B,
                       states ? "default + every-position state" : "default set",
                       host ? "(device <= 32 KiB, host above)" : "(all on the device)", nj, ms, ms / dec_ms[bi]);
            }
        }
    }

    /* ---- prefill / replay tokens/s ---- */
    {
        set_pos(&m, 1, prefill, 0);
        gen_i32<<<64, 256>>>(m.tok, (size_t)prefill, 11, V);
        int r2 = reps < 3 ? reps : 3;
        for (int r = 0; r < 1 + r2; r++) {
            tstart(&tm, m.st);
            forward(&m, 1, prefill, 0, act_bf16);
            float ms = tstop(&tm, m.st);
            if (r >= 1) t[r - 1] = ms;
        }
        float pm = median(t, r2);
        if (breakdown) {
            g_prof = 1;
            forward(&m, 1, prefill, 0, act_bf16);
            CU_(cudaStreamSynchronize(m.st));
            prof_collect();
            g_prof = 0;
            prof_print("prefill", 1);
        }
        printf("prefill %ld tokens, one call: %.1f ms -> %.0f tokens/s\n", prefill, pm, prefill / (pm * 1e-3));
        long chunk = 256 < prefill ? 256 : prefill;
        for (int r = 0; r < 1 + r2; r++) {
            tstart(&tm, m.st);
            for (long c0p = 0; c0p < prefill; c0p += chunk) {
                set_pos(&m, 1, chunk, c0p); /* host copy between chunks, as the engine uploads positions */
                forward(&m, 1, chunk, c0p, act_bf16);
            }
            float ms = tstop(&tm, m.st);
            if (r >= 1) t[r - 1] = ms;
        }
        float rm = median(t, r2);
        printf("replay %ld tokens in chunks of %ld: %.1f ms -> %.0f tokens/s\n", prefill, chunk, rm,
               prefill / (rm * 1e-3));
    }

    /* ---- GDN scan, 8192 tokens, one layer ---- */
    {
        const long TS = 8192;
        float *q = wf32((size_t)TS * HK * DK, 0.1f, 0.0f), *k = wf32((size_t)TS * HK * DK, 0.1f, 0.0f);
        float *v = wf32((size_t)TS * HV * DV, 1.0f, 0.0f), *al = wf32((size_t)TS * HV, 0.04f, 0.95f);
        float *be = wf32((size_t)TS * HV, 0.4f, 0.5f), *o = (float *)dalloc((size_t)TS * HV * DV * 4);
        float *S = (float *)dalloc((size_t)HV * DK * DV * 4);
        ls_error err; ls_error_clear(&err);
        for (int r = 0; r < 1 + reps; r++) {
            CU_(cudaMemsetAsync(S, 0, (size_t)HV * DK * DV * 4, m.st));
            tstart(&tm, m.st);
            T_(ls_cuda_gdn_recurrent(q, k, v, al, be, S, o, TS, HK, HV, DK, DV, 1, 0, (void *)m.st, &err));
            float ms = tstop(&tm, m.st);
            if (r >= 1) t[r - 1] = ms;
        }
        float gm = median(t, reps);
        printf("gdn scan 8192 tokens (h_qk 16, h_v 32, d 128), strict recurrent: %.3f ms = %.1f x FLA's published "
               "0.472 ms (chunked, H200)\n", gm, gm / 0.472);
        double bytes = (double)TS * (2 * HK * DK + 2 * HV * DV + 2 * HV) * 4;
        printf("  gdn scan streams %.1f MB -> %.1f GB/s; 4 FLOP per state element per token: %.2f TFLOP/s\n",
               bytes / 1e6, bytes / (gm * 1e-3) / 1e9, 4.0 * TS * HV * DK * DV / (gm * 1e-3) / 1e12);
    }
    printf("bench_gpu: done\n");
    ls_cuda_arena_free(&g_arena);
    return 0;
}
