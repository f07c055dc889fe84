/* lockstep — the portable strict CUDA backend; see backend_cuda.h. Every op
 * is one or a few launches of kernels/ops.h on the backend's stream; transfers
 * (download) synchronise, so kernel faults surface there with LS_E_DEVICE.
 * A step graph (graph_begin) records those launches and replays them. */
#include "backend/backend_cuda.h"

#include <string.h>

void ls_backend_cuda_opts_default(ls_backend_cuda_opts *o)
{
    memset(o, 0, sizeof *o);
    o->synthetic_weights_scale = 0.04f;
}

ls_status ls_backend_cuda_create(size_t arena_bytes, ls_backend **out, ls_error *err)
{
    ls_backend_cuda_opts o;
    ls_backend_cuda_opts_default(&o);
    o.arena_bytes = arena_bytes;
    return ls_backend_cuda_create_opts(&o, out, err);
}

#ifndef LOCKSTEP_HAVE_CUDA

int ls_backend_cuda_built(void)
{
    return 0;
}

int ls_backend_cuda_device_count(void)
{
    return 0;
}

int ls_backend_cuda_touched(void)
{
    return 0;
}

ls_status ls_backend_cuda_create_opts(const ls_backend_cuda_opts *o, ls_backend **out,
                                      ls_error *err)
{
    (void)o;
    *out = NULL;
    return ls_fail(err, LS_E_UNSUPPORTED, "this lockstep was built without CUDA (no nvcc at build time)");
}

ls_status ls_backend_cuda_check_device(int device, ls_error *err)
{
    return ls_fail(err, LS_E_UNSUPPORTED, "no CUDA device %d: this lockstep was built without CUDA "
                   "(no nvcc at build time)", device);
}

ls_status ls_backend_cuda_query_gpu(int device, ls_gpu_info *out, int *present, ls_error *err)
{
    (void)device;
    (void)err;
    memset(out, 0, sizeof *out);
    *present = 0;
    return LS_OK;
}

void ls_backend_cuda_arena_usage(const ls_backend *be, size_t *used_bytes, size_t *capacity_bytes)
{
    (void)be;
    *used_bytes = *capacity_bytes = 0;
}

void ls_backend_cuda_tc_pins(const ls_backend *be, const char *const **records, size_t *n)
{
    (void)be;
    *records = NULL;
    *n = 0;
}

#else

#include <inttypes.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/cpu_ops.h"
#include "core/util.h"
#include "fingerprint/sha256.h"
#include "ls_cuda.h"
#include "ops.h"
#include "sha256.h"
#include "tc/gemm_pin.h"

/* The tc and fast tiers' GEMMs (kernels/tc) are in liblockstep.so and the
 * programs built with the library, not in liblockstep.a (they call the
 * shared cuBLASLt, which a fully static program cannot link): referred to
 * weakly, they are NULL in a program without them, whose backend then
 * refuses those tiers (ls_backend_cuda_create_opts). */
#pragma weak ls_gemm_lt_create
#pragma weak ls_gemm_lt_destroy
#pragma weak ls_gemm_qualify_opts_default
#pragma weak ls_gemm_qualify
#pragma weak ls_gemm_qual_free
#pragma weak ls_gemm_qual_pin
#pragma weak ls_gemm_pin_rebuild
#pragma weak ls_gemm_pin_format
#pragma weak ls_gemm_plan_run
#pragma weak ls_gemm_plan_destroy
#pragma weak ls_gemm_fast_create
#pragma weak ls_gemm_fast_run
#pragma weak ls_gemm_fast_destroy

/* Set by every entry point below that calls into the CUDA runtime. */
static volatile int g_touched;

int ls_backend_cuda_built(void)
{
    return 1;
}

int ls_backend_cuda_touched(void)
{
    return g_touched;
}

int ls_backend_cuda_device_count(void)
{
    g_touched = 1;
    return ls_cuda_device_count();
}

ls_status ls_backend_cuda_check_device(int device, ls_error *err)
{
    g_touched = 1;
    return ls_cuda_check_device(device, err);
}

ls_status ls_backend_cuda_query_gpu(int device, ls_gpu_info *out, int *present, ls_error *err)
{
    (void)err;
    g_touched = 1;
    ls_error qerr;
    ls_error_clear(&qerr);
    *present = ls_cuda_query_device(device, out, &qerr) == LS_OK;
    if (!*present) memset(out, 0, sizeof *out); /* no usable device: a CPU-only system */
    return LS_OK;
}

struct ls_buf {
    void *ptr;                 /* device memory inside the arena */
    size_t bytes;
};

typedef struct moe_entry {     /* device pointer tables of one MoE block */
    const ls_bweight *key;     /* mw->gate, stable for the model's lifetime */
    const void **host;         /* the tables' host copy (in the host arena): with key and
                                  cm's shared-expert fields, what the entry was built from */
    size_t table_bytes;
    ls_cuda_moe cm;
    struct moe_entry *next;
} moe_entry;

typedef struct cuda_impl {
    ls_arena host;             /* ls_buf structs, moe entries */
    ls_cuda_arena dev;         /* every device buffer of the run */
    void *scratch;             /* MoE / digest scratch inside the arena */
    size_t scratch_bytes;
    moe_entry *moe;
    uint64_t synth_seed;       /* 0 = weights only from host memory */
    float synth_scale;
    uint64_t synth_calls;      /* synthetic matrices filled so far */
    ls_cuda_digester *dg;      /* asynchronous digests (created on the first digest call) */
    int dg_off;                /* 1: no ring could be had, or synchronous digests were asked
                                  for; digests stay synchronous */
    ls_cuda_digest_job *dg_jobs; /* [dg_cap] a digest call's jobs, kept between calls so that
                                    a call allocates nothing once the largest was seen */
    uint8_t **dg_outs;         /* [dg_cap] their destinations */
    long dg_cap;
    int device;                /* CUDA ordinal everything of this backend runs on */
    ls_tier tier;              /* the GEMMs' tier: linears and experts */
    ls_gemm_lt *lt;            /* tc, fast: cuBLASLt handle and workspace (outside the arena) */
    long tc_rows;              /* tc, fast: rows prepared at least */
    struct tc_shape *tc;       /* tc, fast: the shapes prepared, ordered by (N, K) */
    const char **tc_records;   /* [n_tc] tc: their records (tc[i].record), for the manifest */
    size_t n_tc;
    struct tc_pad *tc_pads;    /* tc, fast: zero-padded copies of weights whose N % 8 != 0 */
    size_t n_tc_pads;
    const void **packed;       /* tc, fast: [packed_cap] open-addressed set of the expert
                                  matrices rewritten into the tensor-core layout (NULL = free) */
    size_t packed_cap, n_packed;
    void *stream;              /* every launch's (STREAM) */
    ls_graph *graphs;          /* every step graph made (graph_begin), until graph_free */
    ls_graph *rec;             /* the graph being recorded, or NULL */
    void *side, *side_ev;      /* a recording's branch for digest_early: its stream and the
                                  event that forks and joins it (made by the first graph_begin) */
    int forked;                /* the branch holds encodes not yet joined (digest_fence) */
    ls_graph *staged;          /* launched, its staged digests not yet handed to the digester
                                  (staged_submit) */
    ls_status staged_st;       /* a failed staged_submit where no caller could be told: */
    ls_error staged_err;       /* reported by the next digest_wait */
} cuda_impl;

/* A recorded step (graph_begin): the executable graph, and the digests its
 * launches stage, each a whole job's canonical bytes at d_stage + off[i],
 * downloaded by the digester into h_stage at the same offsets. */
struct ls_graph {
    void *exec;                /* cudaGraphExec_t, NULL when nothing is recorded */
    uint8_t *d_stage, *h_stage; /* device / pinned host, cap bytes each */
    size_t cap, used;
    long n, jobs_cap;          /* staged jobs */
    uint64_t *off, *len;       /* [jobs_cap] */
    uint8_t **outs;            /* [jobs_cap] the jobs' host destinations */
    struct ls_graph *next;
};

/* A step graph's digest staging: a decode step of one row needs its logits
 * row (vocabulary x 4 bytes) and a few KB a layer. */
#define LS_CUDA_GRAPH_STAGE_BYTES ((size_t)4 << 20)

/* One weight shape of the tc or fast tier: its pinned algorithm (tc) or
 * its unpinned GEMM (fast), for the GEMM of n_pad (N rounded up to a
 * multiple of 8, cuBLASLt's 16-byte rows) output columns. */
typedef struct tc_shape {
    long n, k, n_pad;
    ls_gemm_plan *plan;        /* tc */
    ls_gemm_fast *fast;        /* fast */
    char record[512];          /* tc: ls_gemm_pin_format */
} tc_shape;

/* A weight [N, K] whose N is not a multiple of 8, copied with zero rows up
 * to [n_pad, K] (the padded columns of the GEMM's output are dropped). */
typedef struct tc_pad {
    const void *w;
    void *padded;
} tc_pad;

#define IMPL(be) ((cuda_impl *)(be)->impl)
/* Every launch of the backend goes to its stream (a blocking one: ordered
 * with the synchronous copies, as the default stream's work is), which a
 * step graph records (graph_begin). */
#define STREAM(be) (IMPL(be)->stream)

/* The CUDA runtime's current device belongs to the calling thread, so every
 * entry point makes the backend's device current first (a no-op when it
 * already is: one cudaGetDevice); a run driven from another thread than the
 * one that created the backend still allocates and launches there. */
#define ON_DEVICE(be, err) LS_TRY(ls_cuda_use_device(IMPL(be)->device, (err)))

static float *F(ls_view v) { return (float *)v.buf->ptr + v.off; }
static int32_t *I32(ls_view v) { return (int32_t *)v.buf->ptr + v.off; }
static const void *W(const ls_bweight *w) { return (const char *)w->buf->ptr + w->off_bytes; }

/* ---- memory -------------------------------------------------------------------- */

static ls_status cu_alloc(ls_backend *be, size_t bytes, ls_buf **out, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    ls_buf *b = ls_arena_alloc(&im->host, sizeof *b, err);
    if (!b) return LS_E_NOMEM;
    b->ptr = ls_cuda_arena_alloc(&im->dev, bytes, err);
    if (!b->ptr) return LS_E_NOMEM;
    b->bytes = bytes;
    LS_TRY(ls_cuda_memset(b->ptr, 0, bytes, err));
    *out = b;
    return LS_OK;
}

static ls_status cu_wrap_weights(ls_backend *be, const void *host, size_t bytes, ls_wtype wtype,
                                 ls_buf **out, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    if (!host && !im->synth_seed)
        return ls_fail(err, LS_E_UNSUPPORTED, "cuda backend: a weight matrix of %zu bytes has no "
                       "data (a synthetic model) and this backend was not created to generate "
                       "weights (ls_backend_cuda_opts.synthetic_weights_seed = 0)", bytes);
    if (!host && wtype != LS_WTYPE_BF16 && !ls_wtype_is_f8(wtype))
        return ls_fail(err, LS_E_UNSUPPORTED, "cuda backend: a weight matrix of %zu bytes has no "
                       "data and weight type %d; synthetic weights are generated as bf16 or e4m3 "
                       "(an FP8 matrix's block scales come from the host)", bytes, (int)wtype);
    LS_TRY(cu_alloc(be, bytes, out, err));
    if (host) return ls_cuda_upload((*out)->ptr, host, bytes, err);
    /* Each matrix its own stream of the generator: the seed mixed with the
     * matrix's number (an odd multiplier keeps the seeds distinct). Only
     * generated matrices advance the number, so a bf16 model's values do
     * not depend on whether FP8 scales were uploaded in between. */
    uint64_t seed = im->synth_seed ^ (++im->synth_calls * 0xD1B54A32D192ED03ull);
    if (ls_wtype_is_f8(wtype)) return ls_cuda_fill_e4m3((*out)->ptr, bytes, seed, STREAM(be), err);
    return ls_cuda_fill_uniform_bf16((*out)->ptr, bytes / 2, seed, im->synth_scale, STREAM(be), err);
}

/* A synthetic model's rows, with lockstep synth's values generated on the
 * device (backend.h wrap_generated; synthetic_weights_exact). */
static ls_status cu_wrap_generated(ls_backend *be, const ls_wgen *gen, long r0, long rows,
                                   long cols, ls_wtype wtype, ls_buf **out, ls_buf **scale_out,
                                   ls_error *err)
{
    ON_DEVICE(be, err);
    if (!gen->normal)
        return ls_fail(err, LS_E_UNSUPPORTED, "cuda backend: a synthetic matrix of %ld x %ld has "
                       "no device parameters (ls_wgen.normal = 0)", rows, cols);
    if (wtype != LS_WTYPE_BF16 && !ls_wtype_is_f8(wtype))
        return ls_fail(err, LS_E_UNSUPPORTED, "cuda backend: synthetic weights are generated as "
                       "bf16 or e4m3, not weight type %d", (int)wtype);
    size_t n = (size_t)rows * (size_t)cols;
    LS_TRY(cu_alloc(be, n * (size_t)ls_wtype_bytes(wtype), out, err));
    if (!ls_wtype_is_f8(wtype))
        return ls_cuda_fill_synth_bf16((*out)->ptr, n, gen->key, (uint64_t)r0 * (uint64_t)cols,
                                       gen->c, gen->base, STREAM(be), err);
    ls_buf *s = NULL;
    LS_TRY(cu_alloc(be, sizeof(float) * (size_t)LS_FP8_BLOCKS(rows) * (size_t)LS_FP8_BLOCKS(cols),
                    &s, err));
    LS_TRY(ls_cuda_fill_synth_e4m3((*out)->ptr, s->ptr, r0, rows, gen->rows, cols, gen->key, gen->c,
                                   gen->base, STREAM(be), err));
    if (scale_out) *scale_out = s;
    return LS_OK;
}

static ls_status cu_upload(ls_backend *be, ls_view dst, const void *src, size_t bytes, ls_error *err)
{
    ON_DEVICE(be, err);
    return ls_cuda_upload(F(dst), src, bytes, err);
}

static ls_status staged_submit(cuda_impl *im, ls_error *err);

static ls_status cu_download(ls_backend *be, void *dst, ls_view src, size_t bytes, ls_error *err)
{
    ON_DEVICE(be, err);
    LS_TRY(ls_cuda_download(dst, F(src), bytes, err));
    return staged_submit(IMPL(be), err);
}

static ls_status cu_zero(ls_backend *be, ls_view dst, size_t n, ls_error *err)
{
    ON_DEVICE(be, err);
    return ls_cuda_memset(F(dst), 0, n * 4, err);
}

_Static_assert(LS_COPY_JOBS_MAX <= LS_CUDA_COPY_JOBS_MAX, "a copy_blocks call is one launch");

static ls_status cu_copy_blocks(ls_backend *be, const ls_copy_job *jobs, int n, ls_error *err)
{
    ON_DEVICE(be, err);
    if (n < 1 || n > LS_COPY_JOBS_MAX)
        return ls_fail(err, LS_E_USAGE, "cuda copy_blocks: %d jobs (1..%d)", n, LS_COPY_JOBS_MAX);
    ls_cuda_copy_job cj[LS_COPY_JOBS_MAX];
    for (int i = 0; i < n; i++) {
        const ls_copy_shape *sh = &jobs[i].sh;
        cj[i] = (ls_cuda_copy_job){F(jobs[i].dst), F(jobs[i].src), sh->rows, sh->groups, sh->len,
                                   sh->dst_stride, sh->dst_step, sh->src_stride, sh->src_step};
    }
    return ls_cuda_copy_blocks(cj, n, STREAM(be), err);
}

static void graph_release(ls_graph *g)
{
    ls_cuda_graph_destroy(g->exec);
    ls_cuda_free(g->d_stage);
    ls_cuda_host_free(g->h_stage);
    free(g->off);
    free(g->len);
    free(g->outs);
    free(g);
}

static void cu_destroy(ls_backend *be)
{
    if (!be) return;
    cuda_impl *im = IMPL(be);
    if (im) {
        ls_cuda_digester_destroy(im->dg); /* waits: its threads write into callers' memory */
        while (im->graphs) {
            ls_graph *g = im->graphs;
            im->graphs = g->next;
            graph_release(g);
        }
        ls_cuda_stream_destroy(im->stream);
        ls_cuda_stream_destroy(im->side);
        ls_cuda_event_destroy(im->side_ev);
        free(im->dg_jobs);
        free(im->dg_outs);
        for (size_t i = 0; i < im->n_tc; i++) {
            ls_gemm_plan_destroy(im->tc[i].plan);
            ls_gemm_fast_destroy(im->tc[i].fast);
        }
        free(im->tc);
        free(im->tc_records);
        free(im->tc_pads);
        free(im->packed);
        if (im->lt) ls_gemm_lt_destroy(im->lt);
        ls_cuda_arena_free(&im->dev);
        ls_arena_free(&im->host);
        free(im);
    }
    free(be);
}

void ls_backend_cuda_arena_usage(const ls_backend *be, size_t *used_bytes, size_t *capacity_bytes)
{
    *used_bytes = *capacity_bytes = 0;
    if (!be || be->destroy != cu_destroy || !be->impl) return;
    const cuda_impl *im = IMPL(be);
    *used_bytes = im->dev.used_bytes;
    *capacity_bytes = im->dev.capacity_bytes;
}

void ls_backend_cuda_tc_pins(const ls_backend *be, const char *const **records, size_t *n)
{
    *records = NULL;
    *n = 0;
    if (!be || be->destroy != cu_destroy || !be->impl) return;
    if (IMPL(be)->tier != LS_TIER_TC) return; /* fast pins nothing */
    *records = IMPL(be)->tc_records;
    *n = IMPL(be)->n_tc;
}

/* Scratch shared by the MoE and digest ops, from the run's arena. The arena
 * only grows, so a larger need takes a new region of at least twice the old
 * size; the old one stays unused until the run ends (at most the final size
 * again). */
static ls_status scratch_reserve(cuda_impl *im, size_t need, ls_error *err)
{
    if (need <= im->scratch_bytes) return LS_OK;
    size_t want = need > 2 * im->scratch_bytes ? need : 2 * im->scratch_bytes;
    void *p = ls_cuda_arena_alloc(&im->dev, want, err);
    if (!p) return LS_E_NOMEM;
    im->scratch = p;
    im->scratch_bytes = want;
    return LS_OK;
}

/* ---- operators ------------------------------------------------------------------ */

static ls_status cu_embed(ls_backend *be, const ls_bweight *emb, ls_view tokens, long T, ls_view h,
                          int act_bf16, ls_error *err)
{
    ON_DEVICE(be, err);
    return ls_cuda_embed(W(emb), (int)emb->wtype, emb->rows, emb->cols, I32(tokens), T, F(h),
                         act_bf16, STREAM(be), err);
}

static const float *S(const ls_bweight *w)
{
    return w->scale ? (const float *)w->scale->ptr : NULL;
}

/* ---- the tc and fast tiers' linears (docs/tensor-core-tier.md §2.2, §6) ---------- */

/* The seed of the qualification's random inputs: fixed, so every process
 * that qualifies a shape on the same GPU and cuBLASLt makes the same choice. */
#define TC_QUAL_SEED 0x6c6f636b73746570ull
/* Candidates qualified per shape at most (the heuristic's picks first). */
#define TC_QUAL_CANDIDATES 8
/* cuBLASLt's workspace: what the qualification lets a candidate ask for. */
#define TC_WORKSPACE_BYTES ((size_t)32 << 20)

/* For messages: "tensor-core tier" or "fast tier". */
static const char *tier_label(const cuda_impl *im)
{
    return im->tier == LS_TIER_TC ? "tensor-core tier" : "fast tier";
}

static tc_shape *tc_find(cuda_impl *im, long n, long k)
{
    for (size_t i = 0; i < im->n_tc; i++)
        if (im->tc[i].n == n && im->tc[i].k == k) return &im->tc[i];
    return NULL;
}

static const void *tc_padded(const cuda_impl *im, const void *w)
{
    for (size_t i = 0; i < im->n_tc_pads; i++)
        if (im->tc_pads[i].w == w) return im->tc_pads[i].padded;
    return NULL;
}

#define TC_PAD_N(n) (((n) + 7) / 8 * 8)

/* The zero-padded copy of w (rows up to a multiple of 8), made once. */
static ls_status tc_pad_weight(cuda_impl *im, const ls_bweight *w, ls_error *err)
{
    if (tc_padded(im, W(w))) return LS_OK;
    size_t row = sizeof(uint16_t) * (size_t)w->cols, bytes = row * (size_t)TC_PAD_N(w->rows);
    void *p = ls_cuda_arena_alloc(&im->dev, bytes, err);
    if (!p) return LS_E_NOMEM;
    LS_TRY(ls_cuda_memset(p, 0, bytes, err));
    LS_TRY(ls_cuda_copy(p, W(w), row * (size_t)w->rows, err));
    tc_pad *grown = realloc(im->tc_pads, sizeof *grown * (im->n_tc_pads + 1));
    if (!grown) return ls_fail(err, LS_E_NOMEM, "%s: out of memory", tier_label(im));
    im->tc_pads = grown;
    im->tc_pads[im->n_tc_pads++] = (tc_pad){W(w), p};
    return LS_OK;
}

/* The tc tier's algorithm for shape (n_pad, k): ls_gemm_qualify up to rows
 * rows, and the first candidate, in the qualification's own order, that is
 * row-invariant (the choice is deterministic: not the fastest, which timing
 * noise could change between the processes of a rollout and its replay),
 * rebuilt as a plan, its record in sh->record. */
static ls_status tc_qualify(cuda_impl *im, tc_shape *sh, long rows, ls_error *err)
{
    ls_gemm_qualify_opts qo;
    ls_gemm_qualify_opts_default(&qo);
    qo.n = sh->n_pad;
    qo.k = sh->k;
    qo.max_rows = rows;
    qo.seed = TC_QUAL_SEED;
    qo.max_candidates = TC_QUAL_CANDIDATES;
    qo.time_reps = 0;
    ls_gemm_qual q;
    ls_status st = ls_gemm_qualify(im->lt, &qo, &q, NULL, err);
    int pick = -1;
    for (int i = 0; st == LS_OK && i < q.n_cand && pick < 0; i++)
        if (q.cand[i].qualified) pick = i;
    if (st == LS_OK && pick < 0) {
        const ls_gemm_candidate *c = q.n_cand > 0 ? &q.cand[0] : NULL;
        st = ls_fail(err, LS_E_UNSUPPORTED, "tensor-core tier: no cuBLASLt algorithm for linear [%ld x %ld] is "
                     "row-invariant up to %ld rows on this GPU (%d candidates tried%s%s)", sh->n, sh->k, rows,
                     q.n_cand, c ? "; the first: " : "",
                     c ? (c->fail_reason[0] ? c->fail_reason : "a row changed with M") : "");
    }
    ls_gemm_pin pin;
    if (st == LS_OK) st = ls_gemm_qual_pin(&q, pick, &pin, err);
    ls_gemm_qual_free(&q);
    if (st == LS_OK) st = ls_gemm_pin_rebuild(im->lt, &pin, &sh->plan, err);
    if (st == LS_OK) st = ls_gemm_pin_format(&pin, sh->record, sizeof sh->record, err);
    return st;
}

/* Prepares the shape of w once: tc qualifies and pins its algorithm, fast
 * makes its unpinned GEMM. */
static ls_status cu_prepare_linear(ls_backend *be, const ls_bweight *w, long max_rows, ls_error *err)
{
    cuda_impl *im = IMPL(be);
    if (!im->lt) return LS_OK;
    ON_DEVICE(be, err);
    const char *tier = tier_label(im);
    if (w->wtype != LS_WTYPE_BF16)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: linear [%ld x %ld] has %s weights; the tier runs bf16 weights "
                       "only", tier, w->rows, w->cols, w->wtype == LS_WTYPE_F32 ? "fp32" : "FP8");
    if (w->cols % 8 != 0)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: linear [%ld x %ld]: K = %ld is not a multiple of 8 "
                       "(cuBLASLt's 16-byte bf16 rows)", tier, w->rows, w->cols, w->cols);
    if (w->rows % 8 != 0) LS_TRY(tc_pad_weight(im, w, err));
    if (tc_find(im, w->rows, w->cols)) return LS_OK;
    long rows = max_rows > im->tc_rows ? max_rows : im->tc_rows;
    if (rows < 2) rows = 2;
    tc_shape sh = {w->rows, w->cols, TC_PAD_N(w->rows), NULL, NULL, ""};
    uint64_t t0 = ls_now_ns();
    ls_status st = im->tier == LS_TIER_TC ? tc_qualify(im, &sh, rows, err)
                                          : ls_gemm_fast_create(im->lt, sh.n_pad, sh.k, rows, &sh.fast, err);
    tc_shape *grown = st == LS_OK ? realloc(im->tc, sizeof *im->tc * (im->n_tc + 1)) : NULL;
    const char **recs = grown ? realloc(im->tc_records, sizeof *recs * (im->n_tc + 1)) : NULL;
    if (grown) im->tc = grown;
    if (recs) im->tc_records = recs;
    if (st == LS_OK && (!grown || !recs)) st = ls_fail(err, LS_E_NOMEM, "%s: out of memory", tier);
    if (st != LS_OK) {
        ls_gemm_plan_destroy(sh.plan);
        ls_gemm_fast_destroy(sh.fast);
        return st;
    }
    /* keep (N, K) order: the manifest lists the records as they stand */
    size_t at = im->n_tc;
    while (at > 0 && (im->tc[at - 1].n > sh.n || (im->tc[at - 1].n == sh.n && im->tc[at - 1].k > sh.k))) {
        im->tc[at] = im->tc[at - 1];
        at--;
    }
    im->tc[at] = sh;
    im->n_tc++;
    for (size_t i = 0; i < im->n_tc; i++) im->tc_records[i] = im->tc[i].record;
    if (im->tier == LS_TIER_TC)
        ls_log_verbose("tensor-core tier: linear [%ld x %ld] pinned up to %ld rows in %.2f s: %s", sh.n, sh.k, rows,
                       (double)(ls_now_ns() - t0) / 1e9, sh.record);
    return LS_OK;
}

/* y = act(bf16(x) Wᵀ) with the shape's GEMM (tc pinned, fast unpinned): x
 * to bf16 in scratch (exact for bf16 activations), the GEMM into y (fp32
 * accumulation in the algorithm's order; into scratch for a padded weight,
 * whose extra columns are dropped), then y rounded to bf16 for bf16
 * activations. */
static ls_status tc_linear(ls_backend *be, const ls_bweight *w, ls_view x, ls_view y, long T, int act_bf16,
                           ls_order order, ls_error *err)
{
    cuda_impl *im = IMPL(be);
    tc_shape *sh = tc_find(im, w->rows, w->cols);
    const void *wp = sh && sh->n_pad != sh->n ? tc_padded(im, W(w)) : W(w);
    if (!sh || !wp)
        return ls_fail(err, LS_E_INTERNAL, "%s: linear [%ld x %ld] was never prepared (prepare_linear)",
                       tier_label(im), w->rows, w->cols);
    if (order != LS_ORDER_CANONICAL)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: linear has cuBLASLt's order only (a reversed order was "
                       "asked for)", tier_label(im));
    size_t ny = sh->n_pad != sh->n ? (size_t)T * (size_t)sh->n_pad : 0, nx = (size_t)T * (size_t)w->cols;
    LS_TRY(scratch_reserve(im, sizeof(float) * ny + sizeof(uint16_t) * nx, err));
    float *yp = ny ? im->scratch : F(y);
    uint16_t *xb = (uint16_t *)((float *)im->scratch + ny);
    if ((uintptr_t)yp % 16 != 0 || (uintptr_t)wp % 16 != 0 || (uintptr_t)xb % 16 != 0)
        return ls_fail(err, LS_E_INTERNAL, "%s: linear [%ld x %ld]: an operand is not 16-byte aligned",
                       tier_label(im), w->rows, w->cols);
    LS_TRY(ls_cuda_tc_to_bf16(F(x), xb, (long)nx, STREAM(be), err));
    if (sh->plan) LS_TRY(ls_gemm_plan_run(sh->plan, wp, xb, yp, T, STREAM(be), err));
    else LS_TRY(ls_gemm_fast_run(sh->fast, wp, xb, yp, T, STREAM(be), err));
    return ls_cuda_tc_out(yp, sh->n_pad, F(y), T, w->rows, act_bf16, STREAM(be), err);
}

static ls_status cu_linear(ls_backend *be, const ls_bweight *w, ls_view x, ls_view y, long T,
                           int act_bf16, ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    if (IMPL(be)->lt) return tc_linear(be, w, x, y, T, act_bf16, order, err);
    if (!ls_wtype_is_f8(w->wtype))
        return ls_cuda_linear(W(w), (int)w->wtype, w->rows, w->cols, F(x), F(y), T, act_bf16,
                              (int)order, STREAM(be), err);
    if (w->wtype == LS_WTYPE_F8_DEQUANT)
        return ls_cuda_linear_f8(W(w), S(w), (int)w->wtype, w->rows, w->cols, F(x), NULL, F(y), T,
                                 act_bf16, (int)order, STREAM(be), err);
    /* w8a8: the input rows quantised once (scratch), then every output row */
    cuda_impl *im = IMPL(be);
    size_t nq = (size_t)T * (size_t)w->cols, ns = (size_t)T * (size_t)LS_FP8_BLOCKS(w->cols);
    LS_TRY(scratch_reserve(im, sizeof(float) * (nq + ns), err));
    float *q = im->scratch, *qs = q + nq;
    LS_TRY(ls_cuda_fp8_quant_act(F(x), T, w->cols, q, qs, STREAM(be), err));
    return ls_cuda_linear_f8(W(w), S(w), (int)w->wtype, w->rows, w->cols, q, qs, F(y), T, act_bf16,
                             (int)order, STREAM(be), err);
}

static ls_status cu_rmsnorm(ls_backend *be, ls_view x, ls_view w, ls_view y, long R, long n,
                            int act_bf16, ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    return ls_cuda_rmsnorm(F(x), F(w), F(y), R, n, act_bf16, (int)order, STREAM(be), err);
}

static ls_status cu_gated_rmsnorm(ls_backend *be, ls_view x, ls_view z, ls_view w, ls_view y, long R,
                                  long n, int act_bf16, ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    return ls_cuda_gated_rmsnorm(F(x), F(z), F(w), F(y), R, n, act_bf16, (int)order, STREAM(be), err);
}

static ls_status cu_conv_silu(ls_backend *be, ls_view x, long x_stride, const ls_bweight *w,
                              ls_view state, ls_view y, long y_stride, long T, long C, long K,
                              int act_bf16, ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    return ls_cuda_conv_silu(F(x), x_stride, W(w), (int)w->wtype, F(state), F(y), y_stride, T, C, K,
                             act_bf16, (int)order, STREAM(be), err);
}

static ls_status cu_gdn_gates(ls_backend *be, ls_view b, ls_view a, ls_view A_log, ls_view dt_bias,
                              ls_view beta, ls_view alpha, long T, long H, int act_bf16,
                              ls_error *err)
{
    ON_DEVICE(be, err);
    return ls_cuda_gdn_gates(F(b), F(a), F(A_log), F(dt_bias), F(beta), F(alpha), T, H, act_bf16,
                             STREAM(be), err);
}

static ls_status cu_l2norm_scale(ls_backend *be, ls_view x, long R, long d, float scale,
                                 ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    if (order == LS_ORDER_FAST_TWIN) order = LS_ORDER_CANONICAL; /* gdn's twin leaves its L2 norms as they are */
    return ls_cuda_l2norm_scale(F(x), R, d, scale, (int)order, STREAM(be), err);
}

/* Whether a call of the family runs its fast twin: the fast tier's
 * provider, or a fast-twin perturbation (LS_ORDER_FAST_TWIN) on the strict
 * tiers. *order becomes the order the strict kernels of the call are given:
 * canonical for a twin (what it leaves as it is stays canonical), else as
 * asked (a refused order is refused by the kernel). */
static int fast_twin(const cuda_impl *im, ls_order *order)
{
    if (*order == LS_ORDER_FAST_TWIN) {
        *order = LS_ORDER_CANONICAL;
        return 1;
    }
    return im->tier == LS_TIER_FAST && *order == LS_ORDER_CANONICAL;
}

/* The fast twin runs a call of a chunk (64 tokens) or more as FLA's
 * chunked prefill does, chunks counted from the call's first token
 * (ls_cuda_gdn_fast, docs/tensor-core-tier.md §6); shorter calls, decode
 * steps among them, stay recurrent. */
static ls_status cu_gdn_recurrent(ls_backend *be, ls_view q, ls_view k, ls_view v, ls_view alpha,
                                  ls_view beta, ls_view state, ls_view o, long T, long Hk, long Hv,
                                  long dk, long dv, int act_bf16, ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    if (fast_twin(im, &order) && T >= LS_CUDA_GDN_CHUNK) {
        LS_TRY(scratch_reserve(im, ls_cuda_gdn_fast_scratch_bytes(T, Hv, dk, dv), err));
        return ls_cuda_gdn_fast(F(q), F(k), F(v), F(alpha), F(beta), F(state), F(o), T, Hk, Hv, dk, dv, act_bf16,
                                im->scratch, im->scratch_bytes, STREAM(be), err);
    }
    return ls_cuda_gdn_recurrent(F(q), F(k), F(v), F(alpha), F(beta), F(state), F(o), T, Hk, Hv, dk,
                                 dv, act_bf16, (int)order, STREAM(be), err);
}

/* The chunk-aligned form (kernels/ops_gdn_chunked.cu): the CPU's state layout. */
_Static_assert(LS_CUDA_GDN_CHUNK == LS_GDN_CHUNK, "the CUDA and CPU chunk-aligned GDN forms share C");

/* The tc and fast tiers run the tensor-core form (kernels/ops_gdn_tc.cu,
 * docs/tensor-core-tier.md §3), with its own state layout. */
static ls_status cu_gdn_chunked(ls_backend *be, ls_view q, ls_view k, ls_view v, ls_view alpha,
                                ls_view beta, ls_view state, ls_view o, long T, long pos0, long Hk,
                                long Hv, long dk, long dv, int act_bf16, ls_order order,
                                ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    if (im->tier == LS_TIER_PORTABLE)
        return ls_cuda_gdn_chunked(F(q), F(k), F(v), F(alpha), F(beta), F(state), F(o), T, pos0, Hk, Hv,
                                   dk, dv, act_bf16, (int)order, STREAM(be), err);
    if (order != LS_ORDER_CANONICAL)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s gdn_chunked: only the canonical order", tier_label(im));
    size_t need = ls_cuda_gdn_tc_scratch_bytes(T, Hv, dk, dv);
    LS_TRY(scratch_reserve(im, need, err));
    return ls_cuda_gdn_chunked_tc(F(q), F(k), F(v), F(alpha), F(beta), F(state), F(o), T, pos0, Hk, Hv, dk, dv,
                                  act_bf16, im->scratch, im->scratch_bytes, STREAM(be), err);
}

static ls_status cu_gdn_chunked_state(ls_backend *be, ls_view state, long pos, ls_view s_out,
                                      long Hv, long dk, long dv, ls_error *err)
{
    ON_DEVICE(be, err);
    if (IMPL(be)->tier == LS_TIER_PORTABLE)
        return ls_cuda_gdn_chunked_state(F(state), pos, F(s_out), Hv, dk, dv, STREAM(be), err);
    return ls_cuda_gdn_chunked_tc_state(F(state), pos, F(s_out), Hv, dk, dv, STREAM(be), err);
}

static size_t cu_gdn_chunked_floats(ls_backend *be, long Hv, long dk, long dv)
{
    return IMPL(be)->tier == LS_TIER_PORTABLE ? LS_GDN_CHUNK_STATE_FLOATS(Hv, dk, dv)
                                              : LS_CUDA_GDN_TC_STATE_FLOATS(Hv, dk, dv);
}

static ls_status cu_rope_apply(ls_backend *be, ls_view x, ls_view cos_t, ls_view sin_t, long T,
                               long H, long d, long R, int act_bf16, ls_error *err)
{
    ON_DEVICE(be, err);
    return ls_cuda_rope_apply(F(x), F(cos_t), F(sin_t), T, H, d, R, act_bf16, STREAM(be), err);
}

/* The fast tier's split-KV attention (docs/tensor-core-tier.md §6) over
 * device pointers of nseq caches and tables. */
static ls_status attention_fast(ls_backend *be, ls_view q, const float *const *kp, const float *const *vp,
                                const int32_t *const *tp, long page, long cap, const long *row0, const long *len,
                                long nseq, ls_view pos, ls_view o, long Hq, long Hkv, long d, int act_bf16,
                                ls_error *err)
{
    cuda_impl *im = IMPL(be);
    size_t sb = ls_cuda_attention_fast_scratch_bytes(row0, len, nseq, Hq, d, cap);
    if (sb) LS_TRY(scratch_reserve(im, sb, err));
    return ls_cuda_attention_fast_batch(F(q), kp, vp, tp, page, cap, row0, len, nseq, I32(pos), F(o), Hq, Hkv, d,
                                        act_bf16, im->scratch, sb ? im->scratch_bytes : 0, STREAM(be), err);
}

static ls_status cu_attention(ls_backend *be, ls_view q, ls_view kc, ls_view vc, ls_view pt,
                              long page, long cap, ls_view pos, ls_view o, long T, long Hq,
                              long Hkv, long d, int act_bf16, ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    const float *kp = F(kc), *vp = F(vc);
    const int32_t *tp = pt.buf ? I32(pt) : NULL;
    long row0 = 0;
    if (fast_twin(IMPL(be), &order))
        return attention_fast(be, q, &kp, &vp, &tp, page, cap, &row0, &T, 1, pos, o, Hq, Hkv, d, act_bf16, err);
    return ls_cuda_attention(F(q), kp, vp, tp, page, cap, I32(pos), F(o), T, Hq, Hkv, d, act_bf16, (int)order,
                             STREAM(be), err);
}

/* Device pointers of nseq state buffers (offset 0), in a malloc'd array. */
static float **dev_ptrs(ls_buf *const *bufs, long nseq, ls_error *err)
{
    float **p = malloc(sizeof(float *) * (size_t)(nseq > 0 ? nseq : 1));
    if (!p) {
        ls_fail(err, LS_E_NOMEM, "cuda backend: %ld sequence pointers", nseq);
        return NULL;
    }
    for (long s = 0; s < nseq; s++) p[s] = (float *)bufs[s]->ptr;
    return p;
}

/* Device pointers of nseq page tables (NULL for a NULL buf, or all NULL
 * when views is NULL), in a malloc'd array. */
static const int32_t **dev_tables(const ls_view *views, long nseq, ls_error *err)
{
    const int32_t **p = malloc(sizeof(int32_t *) * (size_t)(nseq > 0 ? nseq : 1));
    if (!p) {
        ls_fail(err, LS_E_NOMEM, "cuda backend: %ld page table pointers", nseq);
        return NULL;
    }
    for (long s = 0; s < nseq; s++) p[s] = views && views[s].buf ? I32(views[s]) : NULL;
    return p;
}

static ls_status cu_conv_silu_batch(ls_backend *be, ls_view x, long x_stride, const ls_bweight *w,
                                    ls_buf *const *states, const long *row0, const long *len,
                                    long nseq, ls_view y, long y_stride, long C, long K,
                                    int act_bf16, ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    float **st = dev_ptrs(states, nseq, err);
    if (!st) return LS_E_NOMEM;
    ls_status r = ls_cuda_conv_silu_batch(F(x), x_stride, W(w), (int)w->wtype, st, row0, len, nseq,
                                          F(y), y_stride, C, K, act_bf16, (int)order, STREAM(be), err);
    free(st);
    return r;
}

/* The views of one sequence's rows, from row r, of a packed GDN batch. */
typedef struct gdn_rows {
    ls_view q, k, v, alpha, beta, o;
} gdn_rows;

static gdn_rows gdn_rows_at(ls_view q, ls_view k, ls_view v, ls_view alpha, ls_view beta, ls_view o, long r,
                            long Hk, long Hv, long dk, long dv)
{
    gdn_rows g = {ls_view_at(q, (size_t)(r * Hk * dk)), ls_view_at(k, (size_t)(r * Hk * dk)),
                  ls_view_at(v, (size_t)(r * Hv * dv)), ls_view_at(alpha, (size_t)(r * Hv)),
                  ls_view_at(beta, (size_t)(r * Hv)), ls_view_at(o, (size_t)(r * Hv * dv))};
    return g;
}

static ls_status cu_gdn_recurrent_batch(ls_backend *be, ls_view q, ls_view k, ls_view v,
                                        ls_view alpha, ls_view beta, ls_buf *const *states,
                                        const long *row0, const long *len, long nseq, ls_view o,
                                        long Hk, long Hv, long dk, long dv, int act_bf16,
                                        ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    /* the fast twin: a sequence of a chunk or more its own chunked call
     * (cu_gdn_recurrent), the others in the one recurrent launch */
    ls_order asked = order;
    long *rec = NULL; /* the twin: the lengths left to the recurrent launch */
    if (fast_twin(IMPL(be), &order)) {
        rec = malloc(sizeof *rec * (size_t)(nseq > 0 ? nseq : 1));
        if (!rec) return ls_fail(err, LS_E_NOMEM, "cuda gdn_recurrent batch: %ld sequences", nseq);
    }
    ls_status r = LS_OK;
    for (long s = 0; rec && s < nseq && r == LS_OK; s++) {
        rec[s] = len[s];
        if (len[s] < LS_CUDA_GDN_CHUNK) continue;
        gdn_rows g = gdn_rows_at(q, k, v, alpha, beta, o, row0[s], Hk, Hv, dk, dv);
        r = cu_gdn_recurrent(be, g.q, g.k, g.v, g.alpha, g.beta, (ls_view){states[s], 0}, g.o, len[s], Hk, Hv, dk, dv,
                             act_bf16, asked, err);
        rec[s] = 0;
    }
    float **st = r == LS_OK ? dev_ptrs(states, nseq, err) : NULL;
    if (st)
        r = ls_cuda_gdn_recurrent_batch(F(q), F(k), F(v), F(alpha), F(beta), st, row0, rec ? rec : len, nseq, F(o),
                                        Hk, Hv, dk, dv, act_bf16, (int)order, STREAM(be), err);
    else if (r == LS_OK)
        r = LS_E_NOMEM;
    free(st);
    free(rec);
    return r;
}

/* On the tc and fast tiers a decode step (every sequence one position or
 * none) is one launch per kernel (ls_cuda_gdn_chunked_tc_decode); otherwise
 * each sequence is its own gdn_chunked call. Either way, each sequence's
 * bits are those of gdn_chunked called for it alone. */
static ls_status cu_gdn_chunked_batch(ls_backend *be, ls_view q, ls_view k, ls_view v, ls_view alpha,
                                      ls_view beta, ls_buf *const *states, const long *row0,
                                      const long *len, const long *pos0, long nseq, ls_view o, long Hk,
                                      long Hv, long dk, long dv, int act_bf16, ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    long n = 0, most = 0;
    for (long s = 0; s < nseq; s++) {
        n += len[s] > 0;
        most = len[s] > most ? len[s] : most;
    }
    if (im->tier == LS_TIER_PORTABLE || order != LS_ORDER_CANONICAL || most > 1) {
        for (long s = 0; s < nseq; s++)
            if (len[s] > 0) {
                gdn_rows r = gdn_rows_at(q, k, v, alpha, beta, o, row0[s], Hk, Hv, dk, dv);
                LS_TRY(cu_gdn_chunked(be, r.q, r.k, r.v, r.alpha, r.beta, (ls_view){states[s], 0}, r.o, len[s],
                                      pos0[s], Hk, Hv, dk, dv, act_bf16, order, err));
            }
        return LS_OK;
    }
    /* the sequences with a position, packed */
    size_t m = (size_t)(n > 0 ? n : 1);
    float **st = malloc(sizeof *st * m);
    long *rows = malloc(sizeof *rows * m), *pos = malloc(sizeof *pos * m);
    ls_status r = st && rows && pos ? LS_OK : ls_fail(err, LS_E_NOMEM, "cuda gdn_chunked batch: %ld sequences", nseq);
    for (long s = 0, j = 0; r == LS_OK && s < nseq; s++)
        if (len[s] > 0) {
            st[j] = (float *)states[s]->ptr;
            rows[j] = row0[s];
            pos[j++] = pos0[s];
        }
    if (r == LS_OK) r = scratch_reserve(im, ls_cuda_gdn_tc_decode_scratch_bytes(n, Hv, dk, dv), err);
    if (r == LS_OK)
        r = ls_cuda_gdn_chunked_tc_decode(F(q), F(k), F(v), F(alpha), F(beta), st, rows, pos, n, F(o), Hk, Hv, dk, dv,
                                          act_bf16, im->scratch, im->scratch_bytes, STREAM(be), err);
    free(st);
    free(rows);
    free(pos);
    return r;
}

static ls_status cu_kv_append_batch(ls_backend *be, ls_view k, ls_view v, ls_buf *const *kcs,
                                    ls_buf *const *vcs, const ls_view *pts, long page, long cap,
                                    const long *row0, const long *len, const long *pos0, ls_view pos,
                                    long nseq, long Hkv, long d, ls_error *err)
{
    ON_DEVICE(be, err);
    float **kp = dev_ptrs(kcs, nseq, err);
    float **vp = kp ? dev_ptrs(vcs, nseq, err) : NULL;
    const int32_t **tp = vp ? dev_tables(pts, nseq, err) : NULL;
    ls_status r = LS_E_NOMEM;
    if (tp)
        r = ls_cuda_kv_append_batch(F(k), F(v), kp, vp, tp, page, cap, row0, len, pos0, I32(pos), nseq, Hkv,
                                    d, STREAM(be), err);
    free(kp);
    free(vp);
    free(tp);
    return r;
}

static ls_status cu_attention_batch(ls_backend *be, ls_view q, ls_buf *const *kcs,
                                    ls_buf *const *vcs, const ls_view *pts, long page, long cap,
                                    const long *row0, const long *len, long nseq, ls_view pos,
                                    ls_view o, long Hq, long Hkv, long d, int act_bf16,
                                    ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    int fast = fast_twin(im, &order);
    size_t sb = fast ? 0 : ls_cuda_attention_scratch_bytes(nseq, Hq, d, cap);
    if (sb) LS_TRY(scratch_reserve(im, sb, err));
    float **kp = dev_ptrs(kcs, nseq, err);
    float **vp = kp ? dev_ptrs(vcs, nseq, err) : NULL;
    const int32_t **tp = vp ? dev_tables(pts, nseq, err) : NULL;
    ls_status r = LS_E_NOMEM;
    if (tp && fast)
        r = attention_fast(be, q, (const float *const *)kp, (const float *const *)vp, tp, page, cap, row0, len, nseq,
                           pos, o, Hq, Hkv, d, act_bf16, err);
    else if (tp)
        r = ls_cuda_attention_batch(F(q), (const float *const *)kp, (const float *const *)vp, tp,
                                    page, cap, row0, len, nseq, I32(pos), F(o), Hq, Hkv, d,
                                    act_bf16, (int)order, sb ? im->scratch : NULL, STREAM(be), err);
    free(kp);
    free(vp);
    free(tp);
    return r;
}

static ls_status cu_sigmoid_gate(ls_backend *be, ls_view o, ls_view gate, long n, int act_bf16,
                                 ls_error *err)
{
    ON_DEVICE(be, err);
    return ls_cuda_sigmoid_gate(F(o), F(gate), n, act_bf16, STREAM(be), err);
}

static ls_status cu_router(ls_backend *be, const ls_bweight *w, ls_view x, long T, long k,
                           int norm_topk, ls_view probs, ls_view ids, ls_view weights, int act_bf16,
                           ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    return ls_cuda_router(W(w), (int)w->wtype, w->rows, w->cols, F(x), T, k, norm_topk, F(probs),
                          I32(ids), F(weights), act_bf16, (int)order, STREAM(be), err);
}

/* An expert whose weights this backend holds (an expert-parallel rank wraps
 * its own only; the others' have a NULL buf). */
static int expert_held(const ls_bmoe *mw, long e)
{
    return mw->gate[e].buf && mw->up[e].buf && mw->down[e].buf;
}

/* The fields of two MoE descriptions but their device tables. */
static int same_moe(const ls_cuda_moe *a, const ls_cuda_moe *b)
{
    return a->E == b->E && a->D == b->D && a->I == b->I && a->Is == b->Is && a->wtype == b->wtype &&
           a->sh_gate == b->sh_gate && a->sh_up == b->sh_up && a->sh_down == b->sh_down &&
           a->sh_wtype == b->sh_wtype && a->sh_gate_s == b->sh_gate_s && a->sh_up_s == b->sh_up_s &&
           a->sh_down_s == b->sh_down_s && a->sh_gate_w == b->sh_gate_w && a->shg_wtype == b->shg_wtype &&
           a->tc_layout == b->tc_layout;
}

/* The set of packed matrices: slot of p (its own, or the free one where it
 * would go). packed_cap is a power of two, at most half full. */
static size_t packed_slot(const cuda_impl *im, const void *p)
{
    size_t mask = im->packed_cap - 1, i = (size_t)(((uintptr_t)p >> 5) * 0x9E3779B97F4A7C15ull) & mask;
    while (im->packed[i] && im->packed[i] != p) i = (i + 1) & mask;
    return i;
}

static int packed_has(const cuda_impl *im, const void *p)
{
    return im->packed_cap && im->packed[packed_slot(im, p)] == p;
}

/* Room in the set for one more matrix. */
static ls_status packed_grow(cuda_impl *im, ls_error *err)
{
    if (2 * (im->n_packed + 1) <= im->packed_cap) return LS_OK;
    size_t cap = im->packed_cap ? 2 * im->packed_cap : 4096, old_cap = im->packed_cap;
    const void **old = im->packed, **t = calloc(cap, sizeof *t);
    if (!t) return ls_fail_nomem(err, cap * sizeof *t, "cuda moe: the set of packed matrices");
    im->packed = t;
    im->packed_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i]) im->packed[packed_slot(im, old[i])] = old[i];
    free(old);
    return LS_OK;
}

/* tc and fast: the matrix w at p (NULL: not held) rewritten into the
 * tensor-core experts' layout (ls_cuda_moe_tc_pack) unless an earlier table
 * had it packed. The set has room before the pack runs, so a packed matrix
 * is always in it. */
static ls_status pack_matrix(ls_backend *be, const ls_bweight *w, const void *p, ls_error *err)
{
    cuda_impl *im = IMPL(be);
    if (!p || packed_has(im, p)) return LS_OK;
    LS_TRY(packed_grow(im, err));
    LS_TRY(scratch_reserve(im, (size_t)w->rows * (size_t)w->cols * 2, err));
    LS_TRY(ls_cuda_moe_tc_pack((void *)p, w->rows, w->cols, im->scratch, STREAM(be), err));
    im->packed[packed_slot(im, p)] = p;
    im->n_packed++;
    return LS_OK;
}

/* Every matrix of the table h ([3 E]: gate, up, down pointers) and of the
 * shared expert, packed (pack_matrix). */
static ls_status moe_pack(ls_backend *be, const ls_bmoe *mw, const void *const *h, ls_error *err)
{
    long E = mw->E;
    for (long e = 0; e < E; e++) {
        LS_TRY(pack_matrix(be, &mw->gate[e], h[e], err));
        LS_TRY(pack_matrix(be, &mw->up[e], h[E + e], err));
        LS_TRY(pack_matrix(be, &mw->down[e], h[2 * E + e], err));
    }
    if (!mw->sh_gate) return LS_OK;
    LS_TRY(pack_matrix(be, mw->sh_gate, W(mw->sh_gate), err));
    LS_TRY(pack_matrix(be, mw->sh_up, W(mw->sh_up), err));
    return pack_matrix(be, mw->sh_down, W(mw->sh_down), err);
}

/* Device pointer tables for one MoE block, built on first use and kept for
 * the backend's lifetime. All matrices must share one dtype (fail closed);
 * an expert not held has NULL pointers, which no launch reads (moe_slots
 * computes only the pairs of held experts). An entry is reused when its
 * key and every pointer it holds are this call's (a caller may hand the
 * same table with other experts held), else a new one is built: on the
 * tc and fast tiers after its matrices are packed (moe_pack), which is why
 * none is built while a step graph is recorded. */
static ls_status moe_tables(ls_backend *be, const ls_bmoe *mw, const ls_cuda_moe **out,
                            ls_error *err)
{
    cuda_impl *im = IMPL(be);
    /* one weight type for the routed experts, one for the shared expert's
     * three matrices; the shared expert gate vector bf16 or fp32 */
    long first = 0;
    while (first < mw->E - 1 && !expert_held(mw, first)) first++;
    ls_wtype wt = mw->gate[first].wtype;
    for (long e = 0; e < mw->E; e++)
        if (expert_held(mw, e) &&
            (mw->gate[e].wtype != wt || mw->up[e].wtype != wt || mw->down[e].wtype != wt))
            return ls_fail(err, LS_E_UNSUPPORTED,
                           "cuda portable moe: expert %ld mixes weight dtypes (all experts of a "
                           "block must share one)", e);
    ls_wtype swt = mw->sh_gate ? mw->sh_gate->wtype : LS_WTYPE_BF16;
    if (mw->sh_gate && (mw->sh_up->wtype != swt || mw->sh_down->wtype != swt))
        return ls_fail(err, LS_E_UNSUPPORTED, "cuda portable moe: the shared expert's gate, up and "
                       "down projections differ in weight dtype");
    if (mw->sh_gate && ls_wtype_is_f8(mw->sh_gate_w->wtype))
        return ls_fail(err, LS_E_UNSUPPORTED, "cuda portable moe: an FP8 shared expert gate vector "
                       "is not supported (bf16 or fp32)");
    int f8 = ls_wtype_is_f8(wt);
    size_t tb = sizeof(void *) * (size_t)mw->E;
    size_t ntab = f8 ? 6 : 3; /* gate, up, down pointers; FP8: their scales too */
    const void **h = malloc(ntab * tb);
    if (!h) return ls_fail_nomem(err, ntab * tb, "cuda moe tables");
    for (long e = 0; e < mw->E; e++) {
        int held = expert_held(mw, e);
        h[e] = held ? W(&mw->gate[e]) : NULL;
        h[mw->E + e] = held ? W(&mw->up[e]) : NULL;
        h[2 * mw->E + e] = held ? W(&mw->down[e]) : NULL;
        if (f8) {
            h[3 * mw->E + e] = held ? S(&mw->gate[e]) : NULL;
            h[4 * mw->E + e] = held ? S(&mw->up[e]) : NULL;
            h[5 * mw->E + e] = held ? S(&mw->down[e]) : NULL;
        }
    }
    int sh = mw->sh_gate != NULL;
    ls_cuda_moe cm = {.E = mw->E, .D = mw->D, .I = mw->I, .Is = mw->Is, .wtype = (int)wt,
                      .sh_gate = sh ? W(mw->sh_gate) : NULL, .sh_up = sh ? W(mw->sh_up) : NULL,
                      .sh_down = sh ? W(mw->sh_down) : NULL, .sh_wtype = (int)swt,
                      .sh_gate_s = sh ? S(mw->sh_gate) : NULL, .sh_up_s = sh ? S(mw->sh_up) : NULL,
                      .sh_down_s = sh ? S(mw->sh_down) : NULL, .sh_gate_w = sh ? W(mw->sh_gate_w) : NULL,
                      .shg_wtype = sh ? (int)mw->sh_gate_w->wtype : 0};
    /* tc and fast: the experts the tensor-core kernels take are read in their
     * layout (kernels/ops_moe.cu ls_cuda_moe_tc_pack); others stay as they
     * are, for ls_cuda_moe_forward_tc to refuse by name */
    cm.tc_layout = im->tier != LS_TIER_PORTABLE && wt == LS_WTYPE_BF16 && (!sh || swt == LS_WTYPE_BF16) &&
                   mw->D % 16 == 0 && mw->I % 16 == 0 && (!sh || mw->Is % 16 == 0);
    for (moe_entry *e = im->moe; e; e = e->next)
        if (e->key == mw->gate && e->table_bytes == ntab * tb && !memcmp(e->host, h, ntab * tb) &&
            same_moe(&e->cm, &cm)) {
            free(h);
            *out = &e->cm;
            return LS_OK;
        }
    /* a new table: the tensor-core experts read whole 32-byte fragments (kernels/ops_moe.cu) */
    int misaligned = 0;
    for (size_t i = 0; im->tier != LS_TIER_PORTABLE && i < 3 * (size_t)mw->E; i++)
        misaligned |= (int)((uintptr_t)h[i] % 32);
    if (sh && im->tier != LS_TIER_PORTABLE)
        misaligned |= (int)(((uintptr_t)cm.sh_gate | (uintptr_t)cm.sh_up | (uintptr_t)cm.sh_down) % 32);
    ls_status st = LS_OK;
    if (misaligned)
        st = ls_fail(err, LS_E_INTERNAL, "%s: an expert matrix is not 32-byte aligned", tier_label(im));
    else if (im->rec) /* the engine's first step of a shape runs without a graph */
        st = ls_fail(err, LS_E_UNSUPPORTED, "cuda moe: a new expert table while a step graph is recorded");
    else if (cm.tc_layout)
        st = moe_pack(be, mw, h, err);
    if (st != LS_OK) {
        free(h);
        return st;
    }
    void *d = ls_cuda_arena_alloc(&im->dev, ntab * tb, err);
    const void **keep = d ? ls_arena_alloc(&im->host, ntab * tb, err) : NULL;
    st = keep ? ls_cuda_upload(d, h, ntab * tb, err) : LS_E_NOMEM;
    if (keep) memcpy(keep, h, ntab * tb);
    free(h);
    LS_TRY(st);
    moe_entry *e = ls_arena_alloc(&im->host, sizeof *e, err);
    if (!e) return LS_E_NOMEM;
    e->key = mw->gate;
    e->host = keep;
    e->table_bytes = ntab * tb;
    e->cm = cm;
    e->cm.gate = (const void *const *)d;
    e->cm.up = (const void *const *)((char *)d + tb);
    e->cm.down = (const void *const *)((char *)d + 2 * tb);
    e->cm.gate_s = f8 ? (const float *const *)((char *)d + 3 * tb) : NULL;
    e->cm.up_s = f8 ? (const float *const *)((char *)d + 4 * tb) : NULL;
    e->cm.down_s = f8 ? (const float *const *)((char *)d + 5 * tb) : NULL;
    e->next = im->moe;
    im->moe = e;
    *out = &e->cm;
    return LS_OK;
}

static ls_status cu_moe(ls_backend *be, const ls_bmoe *mw, ls_view x, ls_view ids, ls_view weights,
                        long k, ls_view out, long T, int act_bf16, ls_order order_experts,
                        ls_order order_combine, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    const ls_cuda_moe *cm = NULL;
    LS_TRY(moe_tables(be, mw, &cm, err));
    /* Chunks of tokens keep one launch's slot count bounded; tokens are
     * independent, so the chunking changes no bit. */
    long chunk = 65535 / (k + 1);
    if (chunk < 1) return ls_fail(err, LS_E_UNSUPPORTED, "cuda portable moe: top-k %ld too large", k);
    long Tc = T < chunk ? T : chunk;
    size_t need = ls_cuda_moe_scratch_bytes(cm, Tc, k);
    LS_TRY(scratch_reserve(im, need, err));
    /* tc: the tensor-core experts (docs/tensor-core-tier.md §2.3); fast: the
     * same with the combine's atomic adds (§6) */
    ls_status (*forward)(const ls_cuda_moe *, const float *, const int32_t *, const float *, long, float *,
                         long, void *, int, int, int, void *, ls_error *) =
        im->tier == LS_TIER_PORTABLE ? ls_cuda_moe_forward : ls_cuda_moe_forward_tc;
    if (im->tier != LS_TIER_PORTABLE && fast_twin(im, &order_combine)) forward = ls_cuda_moe_forward_fast;
    for (long t0 = 0; t0 < T; t0 += chunk) {
        long n = T - t0 < chunk ? T - t0 : chunk;
        LS_TRY(forward(cm, F(x) + t0 * mw->D, I32(ids) + t0 * k, F(weights) + t0 * k, k, F(out) + t0 * mw->D,
                       n, im->scratch, act_bf16, (int)order_experts, (int)order_combine, STREAM(be), err));
    }
    return LS_OK;
}

/* The pairs (t, i) are checked on the host as the CPU checks them; the
 * launches then compute every pair of ids_sel [T, k] (the routed pairs
 * asked for, -1 elsewhere) and, when a pair asks for it, every token's shared
 * slot, and gather the rows asked for. Each row is the one moe forms for its
 * pair (ls_cuda_moe_slots), so the bits are moe's. */
static ls_status cu_moe_slots(ls_backend *be, const ls_bmoe *mw, ls_view x, ls_view ids,
                              ls_view weights, long k, long T, ls_view pairs, long n, ls_view c,
                              int act_bf16, ls_order order_experts, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    if (n <= 0 || T <= 0) return LS_OK;
    long slots = k + (mw->sh_gate ? 1 : 0);
    long chunk = 65535 / (k + 1); /* tokens per launch, as in cu_moe */
    if (chunk < 1) return ls_fail(err, LS_E_UNSUPPORTED, "cuda portable moe: top-k %ld too large", k);
    int32_t *h = malloc(sizeof(int32_t) * (size_t)(2 * n + 2 * T * k));
    if (!h) return ls_fail_nomem(err, sizeof(int32_t) * (size_t)(2 * n + 2 * T * k), "cuda moe_slots: pairs");
    int32_t *pr = h, *id = h + 2 * n, *sel = id + T * k; /* [n, 2], [T, k], [T, k] */
    ls_status st = ls_cuda_download(pr, I32(pairs), sizeof(int32_t) * (size_t)(2 * n), err);
    if (st == LS_OK) st = ls_cuda_download(id, I32(ids), sizeof(int32_t) * (size_t)(T * k), err);
    for (long i = 0; i < T * k; i++) sel[i] = -1;
    int shared = 0;
    for (long p = 0; st == LS_OK && p < n; p++) {
        long t = pr[2 * p], i = pr[2 * p + 1];
        if (t < 0 || t >= T || i < 0 || i >= slots) {
            st = ls_fail(err, LS_E_INTERNAL, "cuda moe_slots: pair %ld is (token %ld, slot %ld), "
                         "outside %ld tokens of %ld slots", p, t, i, T, slots);
            break;
        }
        long e = i < k ? id[t * k + i] : -1;
        if (i < k && (e < 0 || e >= mw->E || !expert_held(mw, e)))
            st = ls_fail(err, LS_E_INTERNAL, "cuda moe_slots: pair %ld (token %ld, slot %ld) names "
                         "expert %ld, whose weights this backend does not hold", p, t, i, e);
        else if (i < k) sel[t * k + i] = (int32_t)e;
        else shared = 1;
    }
    const ls_cuda_moe *cm = NULL;
    if (st == LS_OK) st = moe_tables(be, mw, &cm, err);
    long Tc = T < chunk ? T : chunk;
    /* the moe's scratch, then ids_sel on a 256-byte boundary */
    size_t moe_bytes = cm ? (ls_cuda_moe_scratch_bytes(cm, Tc, k) + 255) / 256 * 256 : 0;
    if (st == LS_OK) st = scratch_reserve(im, moe_bytes + sizeof(int32_t) * (size_t)(T * k), err);
    int32_t *sel_dev = st == LS_OK ? (int32_t *)((char *)im->scratch + moe_bytes) : NULL;
    if (st == LS_OK) st = ls_cuda_upload(sel_dev, sel, sizeof(int32_t) * (size_t)(T * k), err);
    free(h);
    LS_TRY(st);
    ls_cuda_moe cs = *cm;
    if (!shared) { /* no shared slot asked for: none computed */
        cs.sh_gate = cs.sh_up = cs.sh_down = cs.sh_gate_w = NULL;
        cs.sh_gate_s = cs.sh_up_s = cs.sh_down_s = NULL;
    }
    for (long t0 = 0; t0 < T; t0 += chunk) {
        long m = T - t0 < chunk ? T - t0 : chunk;
        LS_TRY(ls_cuda_moe_slots(&cs, F(x) + t0 * mw->D, sel_dev + t0 * k, F(weights) + t0 * k, k, t0, m,
                                 I32(pairs), n, F(c), im->scratch, act_bf16, (int)order_experts, STREAM(be),
                                 err));
    }
    return LS_OK;
}

static ls_status cu_moe_combine(ls_backend *be, ls_view c, long k, long D, int has_shared,
                                ls_view out, long T, int act_bf16, ls_order order_combine,
                                ls_error *err)
{
    ON_DEVICE(be, err);
    return ls_cuda_moe_combine(F(c), k, D, has_shared, F(out), T, act_bf16, (int)order_combine, STREAM(be),
                               err);
}

static ls_status cu_residual_rmsnorm(ls_backend *be, ls_view h, ls_view a, ls_view out, ls_view w, ls_view y,
                                     long R, long n, int act_bf16, ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    return ls_cuda_residual_rmsnorm(F(h), F(a), F(out), F(w), F(y), R, n, act_bf16, (int)order, STREAM(be), err);
}

static ls_status cu_logprobs(ls_backend *be, ls_view logits, ls_view lp, long R, long V,
                             ls_order order, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    void *scratch = NULL;
    if (F(lp) != F(logits)) {
        LS_TRY(scratch_reserve(im, ls_cuda_logprobs_scratch_bytes(R, V), err));
        scratch = im->scratch;
    }
    return ls_cuda_logprobs(F(logits), F(lp), R, V, (int)order, scratch, STREAM(be), err);
}

static ls_status cu_lp_summary(ls_backend *be, ls_view lp, ls_view next, long R, long V, long k,
                               ls_view out, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    LS_TRY(scratch_reserve(im, ls_cuda_lp_summary_scratch_bytes(R, V), err));
    return ls_cuda_lp_summary(F(lp), I32(next), R, V, k, (uint32_t *)I32(out), im->scratch, STREAM(be), err);
}

/* ---- digests ------------------------------------------------------------------------ */

/* The split the digest planner weighs against all-device and all-host
 * (ls_cuda_digest_plan): jobs longer than this many encoded bytes on the
 * host. SHA-256 is serial within a message, one GPU thread hashes ~40 MB/s
 * and a CPU core with SHA extensions 1-2 GB/s, so a 2 MiB GDN state or a
 * logits row is faster downloaded (encoded) and hashed by OpenSSL, while a
 * prefill's many short rows (hidden, KV, router) hash in parallel on the
 * device, 32 bytes back each, and a decode step's few rows all go to the
 * host. Either way the digest is SHA-256 of the same canonical bytes. */
#define LS_CUDA_DIGEST_DEVICE_MAX_BYTES 32768

/* Called from up to 16 threads at once (ls_cuda_digest, the digester); keeps
 * no shared state (a running hash has one part in flight at a time). */
static int host_sha256(void *part, int first, const void *data, size_t len, uint8_t *out)
{
    ls_error err;
    ls_digest d;
    ls_status st = part ? ls_sha256_part((ls_sha256 *)part, first, data, len, out ? &d : NULL, &err)
                        : ls_sha256_buf(data, len, &d, &err);
    if (st != LS_OK) return 1;
    if (out) memcpy(out, d.bytes, 32);
    return 0;
}

/* The digester's ring: up to 256 MiB of the arena, a quarter of what is left
 * at the first digest call at most (the MoE scratch may still grow), and no
 * ring under 8 MiB (then every digest call is synchronous). Host threads: one
 * per online core, up to 16. */
#define LS_CUDA_DIGEST_RING_MAX ((size_t)256 << 20)
#define LS_CUDA_DIGEST_RING_MIN ((size_t)8 << 20)

static void digester_open(cuda_impl *im)
{
    size_t left = im->dev.capacity_bytes - im->dev.used_bytes, ring = left / 4;
    if (ring > LS_CUDA_DIGEST_RING_MAX) ring = LS_CUDA_DIGEST_RING_MAX;
    ls_error ignored;
    void *d_ring = ring >= LS_CUDA_DIGEST_RING_MIN ? ls_cuda_arena_alloc(&im->dev, ring, &ignored) : NULL;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (!d_ring || ls_cuda_digester_create(d_ring, ring, cores < 1 ? 1 : cores > 16 ? 16 : (int)cores,
                                           host_sha256, &im->dg, &ignored) != LS_OK)
        im->dg_off = 1;
}

/* A launched step graph's staged digests go to the digester (their download
 * after the graph's work) only at the backend's next call that could see or
 * order them: the next download, digest, mark, wait or graph call. The
 * download the caller makes right after a step, its logprob summary, then
 * goes first: both copies would start when the graph ends, and the step's
 * summary is what the next step waits for. */
static ls_status staged_submit(cuda_impl *im, ls_error *err)
{
    ls_graph *g = im->staged;
    if (!g) return LS_OK;
    im->staged = NULL;
    LS_TRY(ls_cuda_use_device(im->device, err));
    return ls_cuda_digester_submit_staged(im->dg, g->d_stage, g->h_stage, g->used, g->off, g->len, g->outs,
                                          (int)g->n, im->stream, err);
}

static ls_status cu_digest_wait(ls_backend *be, uint64_t mark, ls_error *err)
{
    cuda_impl *im = IMPL(be);
    if (im->staged_st != LS_OK) {
        ls_status st = im->staged_st;
        im->staged_st = LS_OK;
        if (err) *err = im->staged_err;
        return st;
    }
    LS_TRY(staged_submit(im, err));
    return im->dg ? ls_cuda_digester_wait_for(im->dg, mark, err) : LS_OK;
}

/* staged_submit where the caller cannot be told: a failure is the next
 * digest_wait's. */
static void staged_submit_quiet(cuda_impl *im)
{
    ls_error e = {0};
    ls_status st = staged_submit(im, &e);
    if (st != LS_OK && im->staged_st == LS_OK) {
        im->staged_st = st;
        im->staged_err = e;
    }
}

/* The mark covers a launched graph's digests: they are submitted first. */
static uint64_t cu_digest_mark(ls_backend *be)
{
    cuda_impl *im = IMPL(be);
    staged_submit_quiet(im);
    return im->dg ? ls_cuda_digester_mark(im->dg) : 0;
}

/* The synchronous digest: where to hash chosen per call (ls_cuda_digest_plan),
 * the digests copied to the jobs' outs before it returns. */
static ls_status digest_now(cuda_impl *im, const ls_cuda_digest_job *cj, const ls_digest_job *jobs, long n_jobs,
                            ls_error *err)
{
    uint8_t *dig = malloc((size_t)n_jobs * 32);
    if (!dig) return ls_fail(err, LS_E_NOMEM, "cuda digest: %ld jobs", n_jobs);
    ls_status st = scratch_reserve(im, ls_cuda_digest_scratch_bytes(cj, (int)n_jobs), err);
    if (st == LS_OK)
        st = ls_cuda_digest(cj, (int)n_jobs, im->scratch, im->scratch_bytes,
                            ls_cuda_digest_plan(cj, (int)n_jobs, LS_CUDA_DIGEST_DEVICE_MAX_BYTES),
                            host_sha256, dig, im->stream, err);
    for (long j = 0; st == LS_OK && j < n_jobs; j++)
        if (jobs[j].out) memcpy(jobs[j].out->bytes, dig + 32 * j, 32);
    free(dig);
    return st;
}

/* The jobs of a digest call as the kernels take them, into im->dg_jobs,
 * and their destinations into im->dg_outs. */
static ls_status digest_jobs(cuda_impl *im, const ls_digest_job *jobs, long n_jobs, ls_error *err)
{
    if (n_jobs > 0x7fffffffL)
        return ls_fail(err, LS_E_UNSUPPORTED, "cuda digest: %ld jobs in one call (at most 2^31-1)", n_jobs);
    if (n_jobs > im->dg_cap) {
        ls_cuda_digest_job *nj = realloc(im->dg_jobs, sizeof *nj * (size_t)n_jobs);
        if (nj) im->dg_jobs = nj;
        uint8_t **no = nj ? realloc(im->dg_outs, sizeof *no * (size_t)n_jobs) : NULL;
        if (no) im->dg_outs = no;
        if (!no) return ls_fail(err, LS_E_NOMEM, "cuda digest: %ld jobs", n_jobs);
        im->dg_cap = n_jobs;
    }
    ls_cuda_digest_job *cj = im->dg_jobs;
    uint8_t **outs = im->dg_outs;
    memset(cj, 0, sizeof *cj * (size_t)n_jobs);
    ls_status st = LS_OK;
    for (long j = 0; st == LS_OK && j < n_jobs; j++) {
        if (!jobs[j].out && !jobs[j].run) {
            st = ls_fail(err, LS_E_INTERNAL, "cuda digest: job %ld has no destination", j);
            break;
        }
        cj[j].part = jobs[j].run;
        cj[j].first = jobs[j].first != 0;
        cj[j].last = jobs[j].out != NULL;
        for (int s = 0; s < 2; s++) {
            const ls_digest_span *sp = &jobs[j].span[s];
            if (sp->rows < 0 || sp->len < 0 || (sp->rows > 1 && sp->stride < sp->len)) {
                st = ls_fail(err, LS_E_INTERNAL, "cuda digest: job %ld span %d has rows %ld, len %ld, "
                             "stride %ld", j, s, sp->rows, sp->len, sp->stride);
                break;
            }
            if (sp->rows == 0 || sp->len == 0) continue;
            cj[j].src[s] = F(sp->src);
            cj[j].n[s] = (uint64_t)sp->rows * (uint64_t)sp->len;
            cj[j].row_len[s] = sp->rows > 1 && sp->stride != sp->len ? (uint64_t)sp->len : 0;
            cj[j].stride[s] = (uint64_t)sp->stride;
            cj[j].bf16[s] = sp->bf16 ? 1 : 0;
        }
    }
    for (long j = 0; j < n_jobs; j++) outs[j] = jobs[j].out ? jobs[j].out->bytes : NULL;
    return st;
}

/* Recording a step graph: the jobs (im->dg_jobs) staged in g's memory by
 * the graph (launches on `stream`), their offsets and destinations kept for
 * its launches. */
static ls_status graph_stage(cuda_impl *im, ls_graph *g, long n, void *stream, ls_error *err)
{
    const ls_cuda_digest_job *cj = im->dg_jobs;
    for (long j = 0; j < n; j++)
        if (cj[j].part)
            return ls_fail(err, LS_E_UNSUPPORTED, "step graph: a digest in parts cannot be recorded");
    size_t need = ls_cuda_digest_stage_bytes(cj, (int)n);
    if (need > g->cap - g->used)
        return ls_fail(err, LS_E_UNSUPPORTED, "step graph: the step's digests need more than the "
                       "graph's %zu bytes of staging", g->cap);
    if (g->n + n > g->jobs_cap) {
        long cap = 2 * (g->n + n);
        uint64_t *off = realloc(g->off, sizeof *off * (size_t)cap);
        if (off) g->off = off;
        uint64_t *len = off ? realloc(g->len, sizeof *len * (size_t)cap) : NULL;
        if (len) g->len = len;
        uint8_t **outs = len ? realloc(g->outs, sizeof *outs * (size_t)cap) : NULL;
        if (!outs) return ls_fail(err, LS_E_NOMEM, "step graph: %ld digest jobs", cap);
        g->outs = outs;
        g->jobs_cap = cap;
    }
    LS_TRY(ls_cuda_digest_stage(cj, (int)n, g->d_stage + g->used, g->off + g->n, g->len + g->n, stream,
                                err));
    for (long j = 0; j < n; j++) {
        g->off[g->n + j] += g->used;
        g->outs[g->n + j] = im->dg_outs[j];
    }
    g->n += n;
    g->used += need;
    return LS_OK;
}

/* Submitted to the digester when there is one (done by digest_wait), else
 * synchronous; a job too long for the digester's ring makes the call
 * synchronous, after whatever was submitted before it. While a step graph
 * is recorded, staged in its memory. */
static ls_status cu_digest(ls_backend *be, const ls_digest_job *jobs, long n_jobs, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    LS_TRY(staged_submit(im, err));
    if (n_jobs <= 0) return LS_OK;
    ls_status st = digest_jobs(im, jobs, n_jobs, err);
    if (st != LS_OK) return st;
    if (im->rec) return graph_stage(im, im->rec, n_jobs, im->stream, err);
    if (!im->dg && !im->dg_off) digester_open(im);
    ls_cuda_digest_job *cj = im->dg_jobs;
    int submitted = 0;
    if (im->dg) {
        st = ls_cuda_digester_submit(im->dg, cj, im->dg_outs, (int)n_jobs, STREAM(be), err);
        submitted = st != LS_E_UNSUPPORTED;
        if (!submitted) st = ls_cuda_digester_wait(im->dg, err);
    }
    if (st == LS_OK && !submitted) st = digest_now(im, cj, jobs, n_jobs, err);
    return st;
}

/* While a step graph is recorded, the encoding goes on a branch of the
 * graph forked after the ops so far, so the ops that follow need not wait
 * for it; the branch joins the step at digest_fence or graph_end. Otherwise
 * a digest call (whose encoding the stream orders anyway). */
static ls_status cu_digest_early(ls_backend *be, const ls_digest_job *jobs, long n_jobs, ls_error *err)
{
    cuda_impl *im = IMPL(be);
    if (!im->rec) return cu_digest(be, jobs, n_jobs, err);
    ON_DEVICE(be, err);
    if (n_jobs <= 0) return LS_OK;
    LS_TRY(digest_jobs(im, jobs, n_jobs, err));
    LS_TRY(ls_cuda_stream_after(im->side, im->stream, im->side_ev, err));
    im->forked = 1;
    return graph_stage(im, im->rec, n_jobs, im->side, err);
}

static ls_status cu_digest_fence(ls_backend *be, ls_error *err)
{
    cuda_impl *im = IMPL(be);
    if (!im->forked) return LS_OK;
    ON_DEVICE(be, err);
    im->forked = 0;
    return ls_cuda_stream_after(im->stream, im->side, im->side_ev, err);
}

/* ---- step graphs ------------------------------------------------------------------ */

static ls_status cu_graph_begin(ls_backend *be, ls_graph **gp, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    if (im->rec) return ls_fail(err, LS_E_INTERNAL, "step graph: a graph is being recorded already");
    LS_TRY(staged_submit(im, err)); /* before g's staging is reused */
    ls_graph *g = *gp;
    if (!g) {
        g = calloc(1, sizeof *g);
        if (!g) return ls_fail(err, LS_E_NOMEM, "step graph");
        g->cap = LS_CUDA_GRAPH_STAGE_BYTES;
        ls_status st = ls_cuda_malloc((void **)&g->d_stage, g->cap, err);
        if (st == LS_OK) st = ls_cuda_host_alloc((void **)&g->h_stage, g->cap, err);
        if (st != LS_OK) {
            graph_release(g);
            return st;
        }
        g->next = im->graphs;
        im->graphs = g;
        *gp = g;
    }
    if (!im->side) LS_TRY(ls_cuda_stream_create(&im->side, err));
    if (!im->side_ev) LS_TRY(ls_cuda_event_create(&im->side_ev, err));
    g->n = 0;
    g->used = 0;
    LS_TRY(ls_cuda_capture_begin(im->stream, err));
    im->rec = g;
    return LS_OK;
}

/* Whatever fails leaves g empty. */
static ls_status cu_graph_end(ls_backend *be, ls_graph *g, int keep, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    im->rec = NULL;
    ls_status st = cu_digest_fence(be, err); /* a capture ends joined */
    if (st != LS_OK) keep = 0;
    ls_status st_end = ls_cuda_capture_end(im->stream, keep, &g->exec, err);
    if (st == LS_OK) st = st_end;
    if (!keep || st != LS_OK) {
        ls_cuda_graph_destroy(g->exec);
        g->exec = NULL;
        g->n = 0;
        g->used = 0;
    }
    return st;
}

/* The graph, then its staged digests handed to the digester, which
 * downloads them beside the stream's next work (downloaded and hashed here
 * after the stream when digests are synchronous). */
static ls_status cu_graph_launch(ls_backend *be, ls_graph *g, ls_error *err)
{
    ON_DEVICE(be, err);
    cuda_impl *im = IMPL(be);
    if (!g->exec) return ls_fail(err, LS_E_INTERNAL, "step graph: launched with nothing recorded");
    LS_TRY(staged_submit(im, err));
    if (g->n > 0 && !im->dg && !im->dg_off) digester_open(im);
    if (g->n > 0x7fffffffL)
        return ls_fail(err, LS_E_UNSUPPORTED, "step graph: %ld digest jobs (at most 2^31-1)", g->n);
    LS_TRY(ls_cuda_graph_launch(g->exec, im->stream, err));
    if (g->n == 0) return LS_OK;
    if (im->dg) {
        im->staged = g; /* submitted by the next call that could see them (staged_submit) */
        return LS_OK;
    }
    LS_TRY(ls_cuda_download(g->h_stage, g->d_stage, g->used, err)); /* after the stream's work */
    for (long j = 0; j < g->n; j++)
        if (host_sha256(NULL, 0, g->h_stage + g->off[j], (size_t)g->len[j], g->outs[j]))
            return ls_fail(err, LS_E_CRYPTO, "step graph: host SHA-256 of a staged digest failed");
    return LS_OK;
}

static void cu_graph_free(ls_backend *be, ls_graph *g)
{
    cuda_impl *im = IMPL(be);
    if (!g) return;
    if (im->staged == g) staged_submit_quiet(im);
    for (ls_graph **p = &im->graphs; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    graph_release(g);
}

ls_status ls_backend_cuda_create_opts(const ls_backend_cuda_opts *o, ls_backend **out,
                                      ls_error *err)
{
    *out = NULL;
    g_touched = 1;
    if (ls_cuda_device_count() < 1)
        return ls_fail(err, LS_E_DEVICE, "cuda backend: no CUDA device visible (hint: check "
                       "nvidia-smi and CUDA_VISIBLE_DEVICES)");
    ls_backend *be = calloc(1, sizeof *be);
    cuda_impl *im = calloc(1, sizeof *im);
    if (!be || !im) {
        free(be);
        free(im);
        return ls_fail(err, LS_E_NOMEM, "cuda backend");
    }
    be->impl = im;
    ls_arena_init(&im->host);
    im->synth_seed = o->synthetic_weights_seed;
    im->synth_scale = o->synthetic_weights_scale;
    im->dg_off = o->synchronous_digests != 0;
    im->device = o->device;
    im->tier = o->tier;
    im->tc_rows = o->tc_rows;
    /* the arena, its free-memory reading and every later call on this device */
    ls_status st = ls_cuda_use_device(o->device, err);
    size_t arena_bytes = o->arena_bytes;
    /* the tier's cuBLASLt workspace before the arena sizes itself by what is free */
    if (st == LS_OK && o->tier != LS_TIER_PORTABLE && !ls_gemm_lt_create)
        st = ls_fail(err, LS_E_UNSUPPORTED, "the %s tier needs cuBLASLt, which this program was linked without "
                     "(liblockstep.a has the portable tier only; link liblockstep.so, or use the lockstep "
                     "command)", o->tier == LS_TIER_TC ? "tc" : "fast");
    if (st == LS_OK && o->tier != LS_TIER_PORTABLE) st = ls_gemm_lt_create(TC_WORKSPACE_BYTES, &im->lt, err);
    if (st == LS_OK && arena_bytes == 0)
        arena_bytes = ls_cuda_mem_free_bytes() / 10 * 9 / (size_t)(o->arena_share > 1 ? o->arena_share : 1);
    if (st == LS_OK) st = ls_cuda_arena_init(&im->dev, arena_bytes, err);
    if (st == LS_OK) st = ls_cuda_stream_create(&im->stream, err);
    if (st != LS_OK) {
        cu_destroy(be);
        return st;
    }
    be->name = o->tier == LS_TIER_TC ? "cuda-tensor-core" : o->tier == LS_TIER_FAST ? "cuda-fast" : "cuda-portable";
    be->linear_by_column = o->tier == LS_TIER_PORTABLE;
    be->fast_twins = 1;
    be->alloc = cu_alloc;
    be->wrap_weights = cu_wrap_weights;
    if (o->synthetic_weights_exact) be->wrap_generated = cu_wrap_generated;
    be->upload = cu_upload;
    be->download = cu_download;
    be->zero = cu_zero;
    be->copy_blocks = cu_copy_blocks;
    be->destroy = cu_destroy;
    be->embed = cu_embed;
    be->linear = cu_linear;
    if (o->tier != LS_TIER_PORTABLE) be->prepare_linear = cu_prepare_linear;
    be->rmsnorm = cu_rmsnorm;
    be->gated_rmsnorm = cu_gated_rmsnorm;
    be->conv_silu = cu_conv_silu;
    be->gdn_gates = cu_gdn_gates;
    be->l2norm_scale = cu_l2norm_scale;
    be->gdn_recurrent = cu_gdn_recurrent;
    be->gdn_chunked = cu_gdn_chunked;
    be->gdn_chunked_state = cu_gdn_chunked_state;
    be->gdn_chunked_floats = cu_gdn_chunked_floats;
    be->rope_apply = cu_rope_apply;
    be->attention = cu_attention;
    be->conv_silu_batch = cu_conv_silu_batch;
    be->gdn_recurrent_batch = cu_gdn_recurrent_batch;
    be->gdn_chunked_batch = cu_gdn_chunked_batch;
    be->kv_append_batch = cu_kv_append_batch;
    be->attention_batch = cu_attention_batch;
    be->sigmoid_gate = cu_sigmoid_gate;
    be->router = cu_router;
    be->moe = cu_moe;
    be->moe_slots = cu_moe_slots;
    be->moe_combine = cu_moe_combine;
    be->residual_rmsnorm = cu_residual_rmsnorm;
    be->logprobs = cu_logprobs;
    be->lp_summary = cu_lp_summary;
    be->digest = cu_digest;
    be->digest_wait = cu_digest_wait;
    be->digest_mark = cu_digest_mark;
    be->digest_early = cu_digest_early;
    be->digest_fence = cu_digest_fence;
    be->graph_begin = cu_graph_begin;
    be->graph_end = cu_graph_end;
    be->graph_launch = cu_graph_launch;
    be->graph_free = cu_graph_free;
    *out = be;
    return LS_OK;
}

#endif
