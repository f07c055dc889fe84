/* Backend conformance through the operator table; see backend_ops.h.
 *
 * A case is a list of tensors (host arrays with their initial contents), a
 * blob of weights wrapped once per backend, and three functions of its op:
 * setup (shapes, inputs), ref (the ls_cpu_* reference on host copies) and
 * exec (the same op through the ls_backend function pointers, on views). The
 * driver (run_case) is the same for every op and every backend. */
#include "backend_ops.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu_ops.h"
#include "fingerprint/sha256.h"
#include "numerics/reduce.h"

/* ---- cases: tensors and weights ------------------------------------------ */

enum { BO_F32, BO_I32, BO_SHA };   /* element kinds: fp32, int32 (4 bytes); SHA-256 (32) */

enum {                             /* tensor flags */
    BO_FRESH = 1,                  /* not uploaded: the backend's alloc must zero-fill */
    BO_AT0 = 2,                    /* view at element 0 of its buffer (batched states) */
    BO_HOST_IN = 4,                /* host data the op reads through upload only */
    BO_HOST_OUT = 8                /* host result the op writes (download, digest) */
};

enum { BO_ALL, BO_FULL, BO_QUICK }; /* shape tiers: both suites, full only, quick only */

/* Output tensors start as this NaN (payload a5): an element the reference
 * leaves alone must be left alone by the backend too. */
#define BO_POISON 0x7fd5a5a5u

#define BO_MAX_TENSORS 160

typedef struct bo_tensor {
    const char *name;              /* printed on a mismatch */
    int kind, flags;
    size_t n;                      /* elements */
    void *init;                    /* [n] initial contents (owned) */
    void *ref;                     /* [n] after the reference (owned; NULL: not computed) */
    void *got;                     /* [n] read back from the backend under test (owned) */
    ls_buf *buf;                   /* on the backend under test */
    ls_view v;                     /* its view */
} bo_tensor;

typedef struct bo_wdesc {
    size_t off;                    /* bytes into the blob */
    long rows, cols;
    ls_wtype wt;
    float *scale;                  /* FP8: block scales [ceil(rows/128), ceil(cols/128)] (owned),
                                      wrapped as their own buffer; NULL otherwise */
} bo_wdesc;

typedef struct bo_op bo_op;

typedef struct bo_case {
    const bo_op *op;
    const void *shape;             /* the op's shape entry */
    int act;                       /* act_bf16 */
    ls_order order;                /* the op's order (the MoE's expert order) */
    ls_order order2;               /* the MoE's combine order */
    long pad;                      /* device views start this many elements in */
    uint64_t rng;                  /* splitmix64 state */
    char what[240];                /* "op shape act order", printed */
    bo_tensor t[BO_MAX_TENSORS];
    int nt;
    unsigned char *wblob;          /* every weight matrix of the case (owned) */
    size_t wbytes, woff;           /* blob size; extra misalignment of each matrix */
    bo_wdesc *wd;                  /* [nw] */
    ls_bweight *bw;                /* [nw] on the backend under test */
    int nw;
    long *aux;                     /* op data: sequence rows, lengths (owned) */
    void *aux2;                    /* op data: digest job specs (owned) */
    const char *fallback;          /* exec ran a NULL optional op through others: how */
} bo_case;

struct bo_op {
    const char *name;
    const void *shapes;            /* array of the op's shape struct; each starts with int tier */
    size_t shape_bytes;
    int n_shapes;
    int has_act;                   /* run with act bf16 and fp32 */
    int n_orders;                  /* 1: no order; 2: canonical, reversed; 3: + combine reversed */
    void (*setup)(bo_case *c, const void *shape);
    void (*ref)(bo_case *c);
    ls_status (*exec)(bo_case *c, ls_backend *be, ls_error *err);
};

static uint64_t bo_rand_u64(bo_case *c)
{
    uint64_t z = (c->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-scale, scale) (the GPU tests' generator). */
static float bo_rand_f32(bo_case *c, float scale)
{
    uint32_t r = (uint32_t)(bo_rand_u64(c) >> 40); /* 24 bits */
    float u = (float)r / 16777216.0f;
    float two_u = 2.0f * u;
    float centred = two_u - 1.0f;
    return centred * scale;
}

static void *bo_xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "backend_ops: out of memory (%zu bytes)\n", bytes);
        abort();
    }
    return p;
}

static size_t bo_esz(int kind)
{
    return kind == BO_SHA ? sizeof(ls_digest) : 4;
}

/* Adds tensor number `idx` (setups add them in their enum's order). */
static bo_tensor *bo_add(bo_case *c, int idx, const char *name, int kind, int flags, size_t n)
{
    if (idx != c->nt || c->nt >= BO_MAX_TENSORS) {
        fprintf(stderr, "backend_ops: %s: tensor %s added as %d, expected %d\n", c->op->name, name,
                c->nt, idx);
        abort();
    }
    bo_tensor *t = &c->t[c->nt++];
    t->name = name;
    t->kind = kind;
    t->flags = flags;
    t->n = n;
    t->init = bo_xmalloc(n * bo_esz(kind));
    return t;
}

/* Input: uniform in [-scale, scale), rounded to bf16 when bf16. */
static float *bo_in(bo_case *c, int idx, const char *name, size_t n, float scale, int bf16)
{
    float *p = bo_add(c, idx, name, BO_F32, 0, n)->init;
    for (size_t i = 0; i < n; i++) {
        float v = bo_rand_f32(c, scale);
        p[i] = bf16 ? ls_round_bf16(v) : v;
    }
    return p;
}

static void bo_poison(void *p, size_t words)
{
    uint32_t *u = p;
    for (size_t i = 0; i < words; i++) u[i] = BO_POISON;
}

/* Output (or state the caller fills): starts poisoned. */
static float *bo_out(bo_case *c, int idx, const char *name, size_t n, int flags)
{
    bo_tensor *t = bo_add(c, idx, name, BO_F32, flags, n);
    bo_poison(t->init, n);
    return t->init;
}

static int32_t *bo_i32(bo_case *c, int idx, const char *name, size_t n)
{
    bo_tensor *t = bo_add(c, idx, name, BO_I32, 0, n);
    bo_poison(t->init, n);
    return t->init;
}

/* A weight matrix [rows, cols] as stored, uniform in [-scale, scale); ids
 * count from 0 in declaration order. Each matrix starts 64-byte aligned plus
 * the case's woff bytes. */
static int bo_weight(bo_case *c, long rows, long cols, ls_wtype wt, float scale)
{
    size_t es = (size_t)ls_wtype_bytes(wt), n = (size_t)rows * (size_t)cols;
    size_t off = ((c->wbytes + 63) & ~(size_t)63) + c->woff;
    c->wblob = realloc(c->wblob, off + n * es);
    c->wd = realloc(c->wd, sizeof *c->wd * (size_t)(c->nw + 1));
    if (!c->wblob || !c->wd) {
        fprintf(stderr, "backend_ops: out of memory (weights)\n");
        abort();
    }
    memset(c->wblob + c->wbytes, 0, off - c->wbytes);
    float *sc = NULL;
    if (ls_wtype_is_f8(wt)) {
        /* uniform values quantised per 128 x 128 block as an FP8 release is:
         * s = amax / 448, q = e4m3(v / s); block (0, 0) of a matrix with more
         * than one column block is all zero (a scale of 1, zero weights) */
        float *v = bo_xmalloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++) v[i] = bo_rand_f32(c, scale);
        long br = LS_FP8_BLOCKS(rows), bc = LS_FP8_BLOCKS(cols);
        sc = bo_xmalloc(sizeof(float) * (size_t)(br * bc));
        for (long bi = 0; bi < br; bi++)
            for (long bj = 0; bj < bc; bj++) {
                int zero = bi == 0 && bj == 0 && bc > 1;
                float amax = 0.0f;
                for (long r = bi * 128; r < rows && r < (bi + 1) * 128; r++)
                    for (long k = bj * 128; k < cols && k < (bj + 1) * 128; k++) {
                        if (zero) v[r * cols + k] = 0.0f;
                        if (fabsf(v[r * cols + k]) > amax) amax = fabsf(v[r * cols + k]);
                    }
                float s = amax > 0.0f ? amax / 448.0f : 1.0f;
                sc[bi * bc + bj] = s;
                for (long r = bi * 128; r < rows && r < (bi + 1) * 128; r++)
                    for (long k = bj * 128; k < cols && k < (bj + 1) * 128; k++)
                        c->wblob[off + (size_t)(r * cols + k)] = ls_f32_to_e4m3(v[r * cols + k] / s);
            }
        free(v);
    } else {
        for (size_t i = 0; i < n; i++) {
            float v = bo_rand_f32(c, scale);
            if (wt == LS_WTYPE_BF16) {
                uint16_t h = ls_f32_to_bf16(v);
                memcpy(c->wblob + off + 2 * i, &h, 2);
            } else {
                memcpy(c->wblob + off + 4 * i, &v, 4);
            }
        }
    }
    c->wd[c->nw] = (bo_wdesc){off, rows, cols, wt, sc};
    c->wbytes = off + n * es;
    return c->nw++;
}

/* Weight `id` on the host (valid until the next bo_weight). */
static ls_wmat bo_wm(const bo_case *c, int id)
{
    ls_wmat m = {c->wblob + c->wd[id].off, c->wd[id].wt, c->wd[id].rows, c->wd[id].cols,
                 c->wd[id].scale, NULL, 0};
    return m;
}

/* Weight `id` on the backend under test. */
static const ls_bweight *bo_bw(const bo_case *c, int id)
{
    return &c->bw[id];
}

static float *R(bo_case *c, int i) { return c->t[i].ref; }
static int32_t *RI(bo_case *c, int i) { return c->t[i].ref; }
static float *INIT(bo_case *c, int i) { return c->t[i].init; }
static const int32_t *INITI(const bo_case *c, int i) { return c->t[i].init; }
static ls_view V(const bo_case *c, int i) { return c->t[i].v; }
static ls_view AT(const bo_case *c, int i, long elems)
{
    return ls_view_at(c->t[i].v, (size_t)elems);
}

static void bo_what(bo_case *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bo_what(bo_case *c, const char *fmt, ...)
{
    size_t len = strlen(c->what);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->what + len, sizeof c->what - len, fmt, ap);
    va_end(ap);
}

static const char *wname(ls_wtype wt)
{
    return wt == LS_WTYPE_BF16 ? "bf16" : wt == LS_WTYPE_F32 ? "fp32"
           : wt == LS_WTYPE_F8_DEQUANT ? "e4m3 dequant" : "e4m3 w8a8";
}

/* Sequence s of a batch: lengths and first positions cycle through short
 * lists, rows are packed in sequence order. aux = [row0 | len | pos0]. */
static long bo_batch(bo_case *c, long nseq, const long *lens, int nlens, const long *pos0s,
                     int npos)
{
    c->aux = bo_xmalloc(sizeof(long) * 3 * (size_t)nseq);
    long T = 0;
    for (long s = 0; s < nseq; s++) {
        c->aux[s] = T;
        c->aux[nseq + s] = lens[s % nlens];
        c->aux[2 * nseq + s] = npos ? pos0s[s % npos] : 0;
        T += c->aux[nseq + s];
    }
    return T;
}

#define ROW0(c, nseq) ((c)->aux)
#define LEN(c, nseq) ((c)->aux + (nseq))
#define POS0(c, nseq) ((c)->aux + 2 * (nseq))

/* ---- dense ops (kernels/ops_dense.cu) ------------------------------------ */

typedef struct sh_embed { int tier; long V, D, T; ls_wtype wt; long pad; } sh_embed;
static const sh_embed embed_shapes[] = {
    {BO_ALL, 1000, 2048, 65, LS_WTYPE_BF16, 0},
    {BO_ALL, 300, 96, 7, LS_WTYPE_F32, 1},
    {BO_FULL, 151936, 2048, 4, LS_WTYPE_BF16, 0}, /* the vocabulary */
};
enum { EMB_TOK, EMB_H };

static void embed_setup(bo_case *c, const void *shape)
{
    const sh_embed *s = shape;
    c->pad = s->pad;
    bo_weight(c, s->V, s->D, s->wt, 1.0f);
    int32_t *tok = bo_i32(c, EMB_TOK, "tokens", (size_t)s->T);
    for (long t = 0; t < s->T; t++) /* the last token is the last id */
        tok[t] = (int32_t)(t == s->T - 1 ? s->V - 1 : (t * 7919) % s->V);
    bo_out(c, EMB_H, "h", (size_t)(s->T * s->D), 0);
    bo_what(c, "V %ld D %ld T %ld w %s", s->V, s->D, s->T, wname(s->wt));
}

static void embed_ref(bo_case *c)
{
    const sh_embed *s = c->shape;
    ls_wmat w = bo_wm(c, 0);
    ls_cpu_embed(&w, RI(c, EMB_TOK), s->T, R(c, EMB_H), c->act);
}

static ls_status embed_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_embed *s = c->shape;
    return be->embed(be, bo_bw(c, 0), V(c, EMB_TOK), s->T, V(c, EMB_H), c->act, err);
}

typedef struct sh_linear { int tier; long out, in, T; ls_wtype wt; long woff, pad; } sh_linear;
static const sh_linear linear_shapes[] = {
    {BO_ALL, 2048, 2048, 1, LS_WTYPE_BF16, 0, 0},
    /* one token, in 2048 (the CUDA whole-row plan): warps of two to three
     * rows in turn, and rows off 16-byte alignment */
    {BO_ALL, 12289, 2048, 1, LS_WTYPE_BF16, 0, 0},
    {BO_ALL, 64, 2048, 1, LS_WTYPE_BF16, 2, 0},
    {BO_FULL, 2048, 2048, 63, LS_WTYPE_BF16, 0, 0},
    {BO_FULL, 512, 2048, 65, LS_WTYPE_BF16, 0, 0},
    {BO_QUICK, 512, 2048, 9, LS_WTYPE_BF16, 0, 0},
    {BO_ALL, 64, 2048, 5, LS_WTYPE_BF16, 0, 0},
    {BO_FULL, 2048, 4096, 3, LS_WTYPE_BF16, 0, 0},
    {BO_QUICK, 256, 4096, 3, LS_WTYPE_BF16, 0, 0},
    {BO_ALL, 100, 77, 5, LS_WTYPE_BF16, 0, 1},
    {BO_ALL, 33, 1, 2, LS_WTYPE_BF16, 0, 0},
    {BO_ALL, 7, 1000, 65, LS_WTYPE_BF16, 0, 0},
    {BO_ALL, 300, 130, 9, LS_WTYPE_F32, 0, 0},
    {BO_ALL, 512, 2048, 5, LS_WTYPE_BF16, 2, 0}, /* rows 2 bytes off 16: no vector loads */
    {BO_ALL, 256, 512, 4, LS_WTYPE_F32, 4, 0},
    {BO_FULL, 12288, 2048, 4, LS_WTYPE_BF16, 0, 0},  /* in_proj_qkvz */
    {BO_FULL, 151936, 2048, 1, LS_WTYPE_BF16, 0, 0}, /* lm_head */
    {BO_FULL, 2048, 2048, 300, LS_WTYPE_BF16, 0, 0},
    /* the CUDA tiles (from 2 tokens): a partial block of rows and of tokens,
     * a chunk tail, rows off 16-byte alignment */
    {BO_ALL, 37, 520, 33, LS_WTYPE_BF16, 0, 0},
    {BO_ALL, 45, 200, 17, LS_WTYPE_BF16, 2, 0},
    {BO_ALL, 70, 300, 12, LS_WTYPE_F32, 0, 0},
    /* FP8 block-quantised (docs/numerics.md §9): whole and partial 128-blocks
     * in both dimensions, rows not 8-byte aligned, 1, 4 and 8 tokens per pass */
    {BO_ALL, 2048, 2048, 1, LS_WTYPE_F8_DEQUANT, 0, 0},
    {BO_ALL, 2048, 2048, 1, LS_WTYPE_F8_W8A8, 0, 0},
    {BO_ALL, 512, 2048, 9, LS_WTYPE_F8_DEQUANT, 0, 0},
    {BO_ALL, 512, 2048, 9, LS_WTYPE_F8_W8A8, 0, 0},
    {BO_ALL, 300, 130, 4, LS_WTYPE_F8_DEQUANT, 0, 1},
    {BO_ALL, 300, 130, 4, LS_WTYPE_F8_W8A8, 0, 1},
    {BO_ALL, 100, 77, 5, LS_WTYPE_F8_W8A8, 3, 0},
    {BO_ALL, 129, 257, 3, LS_WTYPE_F8_DEQUANT, 5, 0},
    {BO_ALL, 129, 257, 3, LS_WTYPE_F8_W8A8, 5, 0},
    {BO_FULL, 2048, 4096, 65, LS_WTYPE_F8_W8A8, 0, 0},
    {BO_FULL, 4096, 2048, 300, LS_WTYPE_F8_DEQUANT, 0, 0},
};
enum { LIN_X, LIN_Y };

static void linear_setup(bo_case *c, const void *shape)
{
    const sh_linear *s = shape;
    c->pad = s->pad;
    c->woff = (size_t)s->woff;
    bo_weight(c, s->out, s->in, s->wt, 0.05f);
    float *x = bo_in(c, LIN_X, "x", (size_t)(s->T * s->in), 1.0f, c->act);
    if (ls_wtype_is_f8(s->wt) && s->in > 128 && s->T > 1) {
        /* w8a8's special groups: token 0's first group zero (s = 0), token
         * 1's last group holding one large value (the others quantise to
         * small e4m3 values and subnormals) */
        for (long k = 0; k < 128; k++) x[k] = (k & 1) ? -0.0f : 0.0f;
        x[s->in + s->in - 1] = 300.0f;
    }
    bo_out(c, LIN_Y, "y", (size_t)(s->T * s->out), 0);
    bo_what(c, "[%ld, %ld] T %ld w %s", s->out, s->in, s->T, wname(s->wt));
    if (s->woff) bo_what(c, " at +%ld bytes", s->woff);
}

static void linear_ref(bo_case *c)
{
    const sh_linear *s = c->shape;
    ls_wmat w = bo_wm(c, 0);
    if (s->wt != LS_WTYPE_F8_W8A8) {
        ls_cpu_linear(&w, R(c, LIN_X), R(c, LIN_Y), s->T, 0, s->out, c->act, c->order);
        return;
    }
    long nb = LS_FP8_BLOCKS(s->in);
    float *q = bo_xmalloc(sizeof(float) * (size_t)(s->T * (s->in + nb)));
    ls_cpu_fp8_quant_act(R(c, LIN_X), s->T, s->in, q, q + s->T * s->in);
    ls_cpu_linear_q(&w, q, q + s->T * s->in, R(c, LIN_Y), s->T, 0, s->out, c->act, c->order);
    free(q);
}

static ls_status linear_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_linear *s = c->shape;
    return be->linear(be, bo_bw(c, 0), V(c, LIN_X), V(c, LIN_Y), s->T, c->act, c->order, err);
}

typedef struct sh_norm { int tier; long R, n; int inplace; long pad; } sh_norm;
static const sh_norm rmsnorm_shapes[] = {
    {BO_ALL, 1, 2048, 1, 0},  {BO_ALL, 63, 2048, 1, 0}, {BO_ALL, 65, 2048, 1, 0},
    {BO_ALL, 65 * 16, 256, 1, 0}, {BO_ALL, 7, 48, 1, 0}, {BO_ALL, 5, 96, 1, 0},
    {BO_ALL, 3, 77, 1, 0},    {BO_ALL, 2, 1, 1, 0},     {BO_ALL, 9, 2048, 0, 1},
    {BO_ALL, 3, 1100, 0, 1},  {BO_ALL, 2, 8192, 1, 0},  {BO_ALL, 2, 8200, 1, 0},
};
static const sh_norm gated_shapes[] = {
    {BO_ALL, 1, 2048, 1, 0},  {BO_ALL, 63, 2048, 1, 0}, {BO_ALL, 65, 2048, 1, 0},
    {BO_ALL, 65 * 16, 256, 1, 0}, {BO_ALL, 7, 48, 1, 0}, {BO_ALL, 5, 96, 1, 0},
    {BO_ALL, 3, 77, 1, 0},    {BO_ALL, 2, 1, 1, 0},     {BO_ALL, 65 * 32, 128, 1, 0},
    {BO_ALL, 9, 128, 0, 1},
};
enum { NRM_X, NRM_W, NRM_Y };     /* rmsnorm; Y only when not in place */
enum { GNR_X, GNR_Z, GNR_W, GNR_Y }; /* gated; Y only when not in place */

static void rmsnorm_setup(bo_case *c, const void *shape)
{
    const sh_norm *s = shape;
    c->pad = s->pad;
    bo_in(c, NRM_X, "x", (size_t)(s->R * s->n), 3.0f, c->act);
    bo_in(c, NRM_W, "w", (size_t)s->n, 0.5f, 1);
    if (!s->inplace) bo_out(c, NRM_Y, "y", (size_t)(s->R * s->n), 0);
    bo_what(c, "[%ld, %ld]%s", s->R, s->n, s->inplace ? " in place" : "");
}

static void rmsnorm_ref(bo_case *c)
{
    const sh_norm *s = c->shape;
    int y = s->inplace ? NRM_X : NRM_Y;
    ls_cpu_rmsnorm(R(c, NRM_X), R(c, NRM_W), R(c, y), s->R, s->n, c->act, c->order);
}

static ls_status rmsnorm_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_norm *s = c->shape;
    int y = s->inplace ? NRM_X : NRM_Y;
    return be->rmsnorm(be, V(c, NRM_X), V(c, NRM_W), V(c, y), s->R, s->n, c->act, c->order, err);
}

static void gated_setup(bo_case *c, const void *shape)
{
    const sh_norm *s = shape;
    c->pad = s->pad;
    bo_in(c, GNR_X, "x", (size_t)(s->R * s->n), 3.0f, c->act);
    bo_in(c, GNR_Z, "z", (size_t)(s->R * s->n), 4.0f, c->act);
    bo_in(c, GNR_W, "w", (size_t)s->n, 0.5f, 1);
    if (!s->inplace) bo_out(c, GNR_Y, "y", (size_t)(s->R * s->n), 0);
    bo_what(c, "[%ld, %ld]%s", s->R, s->n, s->inplace ? " in place" : "");
}

static void gated_ref(bo_case *c)
{
    const sh_norm *s = c->shape;
    int y = s->inplace ? GNR_X : GNR_Y;
    ls_cpu_gated_rmsnorm(R(c, GNR_X), R(c, GNR_Z), R(c, GNR_W), R(c, y), s->R, s->n, c->act,
                         c->order);
}

static ls_status gated_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_norm *s = c->shape;
    int y = s->inplace ? GNR_X : GNR_Y;
    return be->gated_rmsnorm(be, V(c, GNR_X), V(c, GNR_Z), V(c, GNR_W), V(c, y), s->R, s->n,
                             c->act, c->order, err);
}

typedef struct sh_l2 { int tier; long R, d; int unit_scale, raw; long pad; } sh_l2;
static const sh_l2 l2_shapes[] = {
    {BO_ALL, 65 * 16, 128, 0, 0, 0}, {BO_ALL, 1, 128, 0, 0, 0}, {BO_ALL, 7, 48, 0, 0, 0},
    {BO_ALL, 5, 96, 0, 0, 0},        {BO_ALL, 3, 77, 0, 0, 1},  {BO_ALL, 65 * 16, 128, 1, 1, 0},
};
enum { L2_X };

static void l2_setup(bo_case *c, const void *shape)
{
    const sh_l2 *s = shape;
    c->pad = s->pad;
    bo_in(c, L2_X, "x", (size_t)(s->R * s->d), 2.0f, !s->raw);
    bo_what(c, "[%ld, %ld] scale %s%s", s->R, s->d, s->unit_scale ? "1" : "1/sqrt(d)",
            s->raw ? " fp32 inputs" : "");
}

static float l2_scale(const sh_l2 *s)
{
    return s->unit_scale ? 1.0f : ls_cpu_inv_sqrt_scale(s->d);
}

static void l2_ref(bo_case *c)
{
    const sh_l2 *s = c->shape;
    ls_cpu_l2norm_scale(R(c, L2_X), s->R, s->d, l2_scale(s), c->order);
}

static ls_status l2_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_l2 *s = c->shape;
    return be->l2norm_scale(be, V(c, L2_X), s->R, s->d, l2_scale(s), c->order, err);
}

typedef struct sh_gates { int tier; long T, H, pad; } sh_gates;
static const sh_gates gates_shapes[] = {{BO_ALL, 65, 32, 0}, {BO_ALL, 1, 16, 0}, {BO_ALL, 7, 3, 1}};
enum { GT_B, GT_A, GT_ALOG, GT_DTB, GT_BETA, GT_ALPHA };

static void gates_setup(bo_case *c, const void *shape)
{
    const sh_gates *s = shape;
    size_t n = (size_t)(s->T * s->H);
    c->pad = s->pad;
    bo_in(c, GT_B, "b", n, 6.0f, c->act);
    float *a = bo_in(c, GT_A, "a", n, 6.0f, c->act);
    a[0] = 25.0f; /* softplus threshold branch */
    bo_in(c, GT_ALOG, "A_log", (size_t)s->H, 2.0f, 1);
    bo_in(c, GT_DTB, "dt_bias", (size_t)s->H, 3.0f, 1);
    bo_out(c, GT_BETA, "beta", n, 0);
    bo_out(c, GT_ALPHA, "alpha", n, 0);
    bo_what(c, "T %ld H %ld", s->T, s->H);
}

static void gates_ref(bo_case *c)
{
    const sh_gates *s = c->shape;
    ls_cpu_gdn_gates(R(c, GT_B), R(c, GT_A), R(c, GT_ALOG), R(c, GT_DTB), R(c, GT_BETA),
                     R(c, GT_ALPHA), s->T, s->H, c->act);
}

static ls_status gates_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_gates *s = c->shape;
    return be->gdn_gates(be, V(c, GT_B), V(c, GT_A), V(c, GT_ALOG), V(c, GT_DTB), V(c, GT_BETA),
                         V(c, GT_ALPHA), s->T, s->H, c->act, err);
}

/* sigmoid_gate: o (in place) and a second operand. */
typedef struct sh_elem { int tier; long n, pad; } sh_elem;
static const sh_elem elem_shapes[] = {{BO_ALL, 65 * 4096, 0}, {BO_ALL, 1, 0}, {BO_ALL, 77, 1}};
enum { EL_O, EL_G };

static void elem_setup(bo_case *c, const void *shape)
{
    const sh_elem *s = shape;
    c->pad = s->pad;
    bo_in(c, EL_O, "o", (size_t)s->n, 3.0f, c->act);
    bo_in(c, EL_G, "operand", (size_t)s->n, 8.0f, c->act);
    bo_what(c, "n %ld", s->n);
}

static void sgate_ref(bo_case *c)
{
    const sh_elem *s = c->shape;
    ls_cpu_sigmoid_gate(R(c, EL_O), R(c, EL_G), s->n, c->act);
}

static ls_status sgate_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_elem *s = c->shape;
    return be->sigmoid_gate(be, V(c, EL_O), V(c, EL_G), s->n, c->act, err);
}

/* residual_rmsnorm: h, a, out (h itself, or a buffer of its own: oop), w,
 * y. Rows of 1024..8192 are one launch on CUDA, the others the residual and
 * rmsnorm kernels. */
typedef struct sh_rnorm { int tier; long R, n, pad; int oop; } sh_rnorm;
static const sh_rnorm rnorm_shapes[] = {
    {BO_ALL, 1, 2048, 0, 0}, {BO_ALL, 32, 2048, 0, 0}, {BO_ALL, 65, 2048, 1, 0}, {BO_ALL, 3, 1100, 0, 0},
    {BO_ALL, 2, 8192, 0, 0}, {BO_ALL, 2, 8200, 0, 0},  {BO_ALL, 7, 48, 1, 0},    {BO_ALL, 2, 1, 0, 0},
    {BO_ALL, 1, 2048, 0, 1}, {BO_ALL, 32, 2048, 1, 1}, {BO_ALL, 3, 8200, 0, 1},  {BO_ALL, 7, 48, 0, 1},
};
enum { RN_H, RN_A, RN_W, RN_Y, RN_O };

static void rnorm_setup(bo_case *c, const void *shape)
{
    const sh_rnorm *s = shape;
    c->pad = s->pad;
    bo_in(c, RN_H, "h", (size_t)(s->R * s->n), 3.0f, c->act);
    bo_in(c, RN_A, "a", (size_t)(s->R * s->n), 3.0f, c->act);
    bo_in(c, RN_W, "w", (size_t)s->n, 0.5f, 1);
    bo_out(c, RN_Y, "y", (size_t)(s->R * s->n), 0);
    bo_out(c, RN_O, "out", s->oop ? (size_t)(s->R * s->n) : 1, 0); /* in place: unused */
    bo_what(c, "[%ld, %ld]%s", s->R, s->n, s->oop ? " out of place" : "");
}

static void rnorm_ref(bo_case *c)
{
    const sh_rnorm *s = c->shape;
    float *out = R(c, s->oop ? RN_O : RN_H);
    ls_cpu_residual(out, R(c, RN_H), R(c, RN_A), s->R * s->n, c->act);
    ls_cpu_rmsnorm(out, R(c, RN_W), R(c, RN_Y), s->R, s->n, c->act, c->order);
}

static ls_status rnorm_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_rnorm *s = c->shape;
    return be->residual_rmsnorm(be, V(c, RN_H), V(c, RN_A), V(c, s->oop ? RN_O : RN_H), V(c, RN_W), V(c, RN_Y),
                                s->R, s->n, c->act, c->order, err);
}

/* Causal conv: the backend runs the tokens in two calls (T/2, then the rest;
 * the first is empty when T = 1), the state carried in its buffer; the
 * reference runs them in one. */
typedef struct sh_conv { int tier; long C, K, T; ls_wtype wt; long pad; } sh_conv;
static const sh_conv conv_shapes[] = {
    {BO_ALL, 8192, 4, 1, LS_WTYPE_BF16, 0}, {BO_ALL, 8192, 4, 63, LS_WTYPE_BF16, 0},
    {BO_ALL, 8192, 4, 65, LS_WTYPE_BF16, 0}, {BO_ALL, 100, 3, 1, LS_WTYPE_BF16, 0},
    {BO_ALL, 100, 3, 63, LS_WTYPE_BF16, 0},  {BO_ALL, 100, 3, 65, LS_WTYPE_BF16, 0},
    {BO_ALL, 64, 4, 9, LS_WTYPE_F32, 1},
};
enum { CV_X, CV_STATE, CV_Y };

static void conv_setup(bo_case *c, const void *shape)
{
    const sh_conv *s = shape;
    long xs = s->C + 64, ys = s->C + 32;
    c->pad = s->pad;
    bo_weight(c, s->C, s->K, s->wt, 0.7f);
    bo_in(c, CV_X, "x", (size_t)(s->T * xs), 2.0f, c->act);
    bo_in(c, CV_STATE, "state", (size_t)(s->C * s->K), 2.0f, c->act); /* from an earlier call */
    bo_out(c, CV_Y, "y", (size_t)(s->T * ys), 0);
    bo_what(c, "C %ld K %ld T %ld w %s (calls %ld + %ld)", s->C, s->K, s->T, wname(s->wt),
            s->T / 2, s->T - s->T / 2);
}

static void conv_ref(bo_case *c)
{
    const sh_conv *s = c->shape;
    ls_wmat w = bo_wm(c, 0);
    ls_cpu_conv_silu(R(c, CV_X), s->C + 64, &w, R(c, CV_STATE), R(c, CV_Y), s->C + 32, s->T, s->C,
                     s->K, c->act, c->order);
}

static ls_status conv_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_conv *s = c->shape;
    long xs = s->C + 64, ys = s->C + 32, T1 = s->T / 2;
    LS_TRY(be->conv_silu(be, V(c, CV_X), xs, bo_bw(c, 0), V(c, CV_STATE), V(c, CV_Y), ys, T1, s->C,
                         s->K, c->act, c->order, err));
    return be->conv_silu(be, AT(c, CV_X, T1 * xs), xs, bo_bw(c, 0), V(c, CV_STATE),
                         AT(c, CV_Y, T1 * ys), ys, s->T - T1, s->C, s->K, c->act, c->order, err);
}

typedef struct sh_logprobs { int tier; long R, V; float scale; int inplace; } sh_logprobs;
static const sh_logprobs logprobs_shapes[] = {
    {BO_ALL, 2, 151936, 8.0f, 1}, /* the vocabulary */
    {BO_FULL, 65, 1000, 3.0f, 1},
    {BO_QUICK, 3, 1000, 3.0f, 1},
    {BO_ALL, 4, 37, 0.01f, 1},    /* bf16 rounding makes many exact ties */
    {BO_ALL, 3, 1000, 3.0f, 0},
    /* not in place: the CUDA row in chunks of 4096 (the last one short) */
    {BO_ALL, 2, 151936, 8.0f, 0},
    {BO_FULL, 65, 9000, 3.0f, 0},
    {BO_QUICK, 3, 9000, 3.0f, 0},
    {BO_ALL, 4, 12000, 0.01f, 0}, /* maxima tied across chunks */
};
enum { LP_L, LP_OUT };

static void logprobs_setup(bo_case *c, const void *shape)
{
    const sh_logprobs *s = shape;
    bo_in(c, LP_L, "logits", (size_t)(s->R * s->V), s->scale, 1);
    if (!s->inplace) bo_out(c, LP_OUT, "lp", (size_t)(s->R * s->V), 0);
    bo_what(c, "R %ld V %ld scale %g%s", s->R, s->V, (double)s->scale,
            s->inplace ? " in place" : "");
}

static void logprobs_ref(bo_case *c)
{
    const sh_logprobs *s = c->shape;
    float *scratch = bo_xmalloc(sizeof(float) * (size_t)s->V);
    ls_cpu_logprobs(R(c, LP_L), R(c, s->inplace ? LP_L : LP_OUT), s->R, s->V, scratch, c->order);
    free(scratch);
}

static ls_status logprobs_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_logprobs *s = c->shape;
    return be->logprobs(be, V(c, LP_L), V(c, s->inplace ? LP_L : LP_OUT), s->R, s->V, c->order,
                        err);
}

/* ---- logprob summary ----------------------------------------------------- */

/* special: rows of −inf, of ±0 ties, of one value, with +inf, and two rows
 * with a NaN (flagged: sentinels, and lp at next still read). */
typedef struct sh_lps { int tier; long R, V, k; float scale; int special; } sh_lps;
static const sh_lps lps_shapes[] = {
    {BO_ALL, 2, 151936, 5, 8.0f, 0}, /* the vocabulary */
    {BO_FULL, 65, 1000, 5, 3.0f, 0},
    {BO_QUICK, 3, 1000, 5, 3.0f, 0},
    {BO_ALL, 4, 37, 5, 0.01f, 0},    /* bf16 rounding makes many exact ties */
    {BO_ALL, 3, 4, 4, 1.0f, 0},      /* k = V */
    {BO_ALL, 4, 9000, 5, 0.01f, 0},  /* the CUDA row in 3 chunks, ties across them */
    {BO_ALL, 6, 700, 3, 2.0f, 1},
};
enum { LPS_LP, LPS_NEXT, LPS_OUT };

static void lps_setup(bo_case *c, const void *shape)
{
    const sh_lps *s = shape;
    float *lp = bo_in(c, LPS_LP, "lp", (size_t)(s->R * s->V), s->scale, 1);
    if (s->special) {
        float *x = lp;
        for (long v = 0; v < s->V; v++) x[v] = v % 350 ? -INFINITY : x[v]; /* row 0 */
        x = lp + s->V;
        for (long v = 0; v < s->V; v++) x[v] = -1.0f;                    /* row 1: ±0 tie */
        x[3] = -0.0f, x[5] = 0.0f, x[600] = 0.0f, x[1] = -0.0f;
        lp[2 * s->V + 17] = NAN;                                         /* row 2 */
        x = lp + 3 * s->V;
        for (long v = 0; v < s->V; v++) x[v] = 0.25f;                    /* row 3: one value */
        lp[4 * s->V + 40] = INFINITY, lp[4 * s->V + 9] = INFINITY;       /* row 4 */
        lp[6 * s->V - 1] = NAN;                                          /* row 5, last */
    }
    int32_t *next = bo_i32(c, LPS_NEXT, "next", (size_t)s->R);
    for (long r = 0; r < s->R; r++) /* unknown, the last id, past the end, one inside */
        next[r] = r % 4 == 0 ? -1 : r % 4 == 1 ? (int32_t)(s->V - 1) : r % 4 == 2 ? (int32_t)s->V
                                                                   : (int32_t)((r * 7919) % s->V);
    bo_i32(c, LPS_OUT, "summary", (size_t)(s->R * LS_LP_SUMMARY_WORDS(s->k)));
    bo_what(c, "R %ld V %ld k %ld scale %g%s", s->R, s->V, s->k, (double)s->scale,
            s->special ? " -inf, +-0, +inf, NaN rows" : "");
}

static void lps_ref(bo_case *c)
{
    const sh_lps *s = c->shape;
    ls_cpu_lp_summary(R(c, LPS_LP), RI(c, LPS_NEXT), s->R, s->V, s->k, (uint32_t *)RI(c, LPS_OUT));
}

static ls_status lps_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_lps *s = c->shape;
    return be->lp_summary(be, V(c, LPS_LP), V(c, LPS_NEXT), s->R, s->V, s->k, V(c, LPS_OUT), err);
}

/* ---- GDN (kernels/ops_gdn.cu) -------------------------------------------- */

/* split: the backend runs the tokens one call each (decode), the reference
 * all in one. */
typedef struct sh_gdn { int tier; long Hk, Hv, dk, dv, T; int split; long pad; } sh_gdn;
static const sh_gdn gdn_shapes[] = {
    {BO_ALL, 16, 32, 128, 128, 1, 0, 0},
    {BO_FULL, 16, 32, 128, 128, 65, 0, 0}, {BO_FULL, 16, 32, 128, 128, 65, 1, 0},
    {BO_FULL, 16, 32, 128, 128, 63, 0, 0}, {BO_FULL, 16, 32, 128, 128, 63, 1, 0},
    {BO_QUICK, 16, 32, 128, 128, 5, 0, 0}, {BO_QUICK, 16, 32, 128, 128, 5, 1, 0},
    {BO_ALL, 2, 4, 48, 96, 65, 0, 0},      {BO_ALL, 2, 4, 48, 96, 65, 1, 0},
    {BO_ALL, 1, 2, 96, 48, 63, 0, 0},      {BO_ALL, 1, 2, 96, 48, 63, 1, 0},
    {BO_ALL, 3, 3, 77, 33, 9, 0, 1},       {BO_ALL, 3, 3, 77, 33, 9, 1, 1},
};
enum { GD_Q, GD_K, GD_V, GD_AL, GD_BE, GD_S, GD_O };

/* q, k, v, alpha, beta of T tokens as the engine feeds the step: q and k
 * L2-normalised (q scaled by 1/sqrt(dk)), α in (0.5, 1], β bf16-exact. */
static void gdn_inputs(bo_case *c, int iq, long T, long Hk, long Hv, long dk, long dv)
{
    size_t nq = (size_t)(T * Hk * dk), nv = (size_t)(T * Hv * dv), nh = (size_t)(T * Hv);
    float *q = bo_in(c, iq, "q", nq, 1.0f, c->act);
    float *k = bo_in(c, iq + 1, "k", nq, 1.0f, c->act);
    ls_cpu_l2norm_scale(q, T * Hk, dk, ls_cpu_inv_sqrt_scale(dk), LS_ORDER_CANONICAL);
    ls_cpu_l2norm_scale(k, T * Hk, dk, 1.0f, LS_ORDER_CANONICAL);
    bo_in(c, iq + 2, "v", nv, 1.0f, c->act);
    float *al = bo_out(c, iq + 3, "alpha", nh, 0), *be = bo_out(c, iq + 4, "beta", nh, 0);
    for (size_t i = 0; i < nh; i++) {
        al[i] = 0.5f + 0.5f * fabsf(bo_rand_f32(c, 1.0f));
        be[i] = ls_round_bf16(fabsf(bo_rand_f32(c, 1.0f)));
    }
}

static void gdn_setup(bo_case *c, const void *shape)
{
    const sh_gdn *s = shape;
    c->pad = s->pad;
    gdn_inputs(c, GD_Q, s->T, s->Hk, s->Hv, s->dk, s->dv);
    bo_in(c, GD_S, "state", (size_t)(s->Hv * s->dk * s->dv), 0.1f, 0); /* from an earlier call */
    bo_out(c, GD_O, "o", (size_t)(s->T * s->Hv * s->dv), 0);
    bo_what(c, "Hk %ld Hv %ld dk %ld dv %ld T %ld%s", s->Hk, s->Hv, s->dk, s->dv, s->T,
            s->split ? " token by token" : "");
}

static void gdn_ref(bo_case *c)
{
    const sh_gdn *s = c->shape;
    float *scratch = bo_xmalloc(sizeof(float) * LS_CPU_GDN_SCRATCH_FLOATS(s->dv));
    ls_cpu_gdn_recurrent(R(c, GD_Q), R(c, GD_K), R(c, GD_V), R(c, GD_AL), R(c, GD_BE),
                         R(c, GD_S), R(c, GD_O), s->T, s->Hk, s->Hv, s->dk, s->dv, scratch, c->act,
                         c->order);
    free(scratch);
}

static ls_status gdn_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_gdn *s = c->shape;
    long n = s->split ? 1 : s->T;
    for (long t = 0; t < s->T; t += n)
        LS_TRY(be->gdn_recurrent(be, AT(c, GD_Q, t * s->Hk * s->dk), AT(c, GD_K, t * s->Hk * s->dk),
                                 AT(c, GD_V, t * s->Hv * s->dv), AT(c, GD_AL, t * s->Hv),
                                 AT(c, GD_BE, t * s->Hv), V(c, GD_S),
                                 AT(c, GD_O, t * s->Hv * s->dv), n, s->Hk, s->Hv, s->dk, s->dv,
                                 c->act, c->order, err));
    return LS_OK;
}

/* Packed batch of sequences, each with its own state buffer (offset 0). */
typedef struct sh_gdnb {
    int tier;
    long Hk, Hv, dk, dv, nseq;
    long lens[4];
    int nlens;
} sh_gdnb;
static const sh_gdnb gdnb_shapes[] = {
    {BO_ALL, 16, 32, 128, 128, 4, {1, 5, 0, 2}, 4},
    {BO_ALL, 1, 2, 48, 96, 67, {1, 2, 0}, 3}, /* more than one launch of 64 sequences */
    {BO_ALL, 3, 3, 77, 33, 3, {4, 1, 2}, 3},
    /* decode steps (every sequence one token or none: ls_gdn_decode_kernel) */
    {BO_ALL, 16, 32, 128, 128, 9, {1}, 1},
    {BO_ALL, 3, 3, 77, 33, 5, {1, 0}, 2},
    {BO_ALL, 1, 2, 48, 96, 67, {1}, 1},
};
enum { GB_Q, GB_K, GB_V, GB_AL, GB_BE, GB_O, GB_S0 };

static void gdnb_setup(bo_case *c, const void *shape)
{
    const sh_gdnb *s = shape;
    long T = bo_batch(c, s->nseq, s->lens, s->nlens, NULL, 0);
    gdn_inputs(c, GB_Q, T, s->Hk, s->Hv, s->dk, s->dv);
    bo_out(c, GB_O, "o", (size_t)(T * s->Hv * s->dv), 0);
    for (long q = 0; q < s->nseq; q++)
        bo_in(c, GB_S0 + (int)q, "state", (size_t)(s->Hv * s->dk * s->dv), 0.1f, 0);
    for (long q = 0; q < s->nseq; q++) c->t[GB_S0 + q].flags |= BO_AT0;
    bo_what(c, "Hk %ld Hv %ld dk %ld dv %ld, %ld sequences (%ld rows)", s->Hk, s->Hv, s->dk, s->dv,
            s->nseq, T);
}

static void gdnb_ref(bo_case *c)
{
    const sh_gdnb *s = c->shape;
    const long *row0 = ROW0(c, s->nseq), *len = LEN(c, s->nseq);
    long nk = s->Hk * s->dk, nv = s->Hv * s->dv;
    float *scratch = bo_xmalloc(sizeof(float) * LS_CPU_GDN_SCRATCH_FLOATS(s->dv));
    for (long q = 0; q < s->nseq; q++)
        if (len[q] > 0)
            ls_cpu_gdn_recurrent(R(c, GB_Q) + row0[q] * nk, R(c, GB_K) + row0[q] * nk,
                                 R(c, GB_V) + row0[q] * nv, R(c, GB_AL) + row0[q] * s->Hv,
                                 R(c, GB_BE) + row0[q] * s->Hv, R(c, GB_S0 + (int)q),
                                 R(c, GB_O) + row0[q] * nv, len[q], s->Hk, s->Hv, s->dk, s->dv,
                                 scratch, c->act, c->order);
    free(scratch);
}

static ls_status gdnb_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_gdnb *s = c->shape;
    const long *row0 = ROW0(c, s->nseq), *len = LEN(c, s->nseq);
    long nk = s->Hk * s->dk, nv = s->Hv * s->dv;
    if (be->gdn_recurrent_batch) {
        ls_buf *st[BO_MAX_TENSORS];
        for (long q = 0; q < s->nseq; q++) st[q] = c->t[GB_S0 + q].buf;
        return be->gdn_recurrent_batch(be, V(c, GB_Q), V(c, GB_K), V(c, GB_V), V(c, GB_AL),
                                       V(c, GB_BE), st, row0, len, s->nseq, V(c, GB_O), s->Hk,
                                       s->Hv, s->dk, s->dv, c->act, c->order, err);
    }
    c->fallback = " via per-sequence ops";
    for (long q = 0; q < s->nseq; q++)
        if (len[q] > 0)
            LS_TRY(be->gdn_recurrent(be, AT(c, GB_Q, row0[q] * nk), AT(c, GB_K, row0[q] * nk),
                                     AT(c, GB_V, row0[q] * nv), AT(c, GB_AL, row0[q] * s->Hv),
                                     AT(c, GB_BE, row0[q] * s->Hv), V(c, GB_S0 + (int)q),
                                     AT(c, GB_O, row0[q] * nv), len[q], s->Hk, s->Hv, s->dk,
                                     s->dv, c->act, c->order, err));
    return LS_OK;
}

/* The chunk-aligned form (gdn_chunked, then gdn_chunked_state after the
 * last position): T tokens at positions pos0.. of a sequence whose current
 * chunk already holds rows 0 .. pos0 mod 64 − 1 from earlier calls. The
 * backend runs the tokens in calls of `split` (0: one call), the reference
 * in one; the whole carried state is compared (S0 and every chunk row, the
 * rows of earlier chunks a call leaves behind included), the outputs and the
 * materialised state. */
typedef struct sh_gdnc { int tier; long Hk, Hv, dk, dv, T, pos0, split, pad; } sh_gdnc;
static const sh_gdnc gdnc_shapes[] = {
    {BO_ALL, 16, 32, 128, 128, 1, 0, 0, 0},      /* the first decode step */
    {BO_ALL, 16, 32, 128, 128, 1, 100, 0, 0},    /* decode inside a chunk */
    {BO_ALL, 16, 32, 128, 128, 1, 127, 0, 0},    /* decode at a chunk's last row: the fold */
    {BO_FULL, 16, 32, 128, 128, 150, 0, 0, 0},   /* prefill over two boundaries */
    {BO_FULL, 16, 32, 128, 128, 150, 37, 1, 0},  /* the same token by token */
    {BO_FULL, 16, 32, 128, 128, 91, 37, 0, 0},   /* ends on a chunk's last row */
    {BO_QUICK, 16, 32, 128, 128, 70, 5, 0, 0},
    {BO_QUICK, 16, 32, 128, 128, 9, 60, 1, 0},
    {BO_ALL, 2, 4, 48, 96, 130, 63, 7, 0},       /* calls of 7 */
    {BO_ALL, 1, 2, 96, 48, 65, 64, 0, 0},
    {BO_ALL, 3, 3, 77, 33, 9, 60, 1, 1},
    {BO_ALL, 2, 6, 40, 72, 200, 3, 64, 0},       /* GQA 2:6, a column tile of 8 */
    {BO_ALL, 1, 1, 128, 20, 67, 190, 0, 1},      /* more than a chunk's worth of new rows */
};
enum { GC_Q, GC_K, GC_V, GC_AL, GC_BE, GC_S, GC_O, GC_M };

static void gdnc_setup(bo_case *c, const void *shape)
{
    const sh_gdnc *s = shape;
    c->pad = s->pad;
    gdn_inputs(c, GC_Q, s->T, s->Hk, s->Hv, s->dk, s->dv);
    /* S0 and the chunk's rows from earlier calls: k and u rows, α in (0.5, 1] */
    size_t SN = (size_t)(s->Hv * s->dk * s->dv), n = LS_GDN_CHUNK_STATE_FLOATS(s->Hv, s->dk, s->dv);
    size_t na = (size_t)(s->Hv * LS_GDN_CHUNK);
    float *st = bo_in(c, GC_S, "state", n, 0.1f, 0);
    for (size_t i = n - na; i < n; i++) st[i] = 0.5f + 0.5f * fabsf(bo_rand_f32(c, 1.0f));
    bo_out(c, GC_O, "o", (size_t)(s->T * s->Hv * s->dv), 0);
    bo_out(c, GC_M, "materialised state", SN, 0);
    bo_what(c, "Hk %ld Hv %ld dk %ld dv %ld T %ld at %ld", s->Hk, s->Hv, s->dk, s->dv, s->T, s->pos0);
    if (s->split) bo_what(c, " in calls of %ld", s->split);
}

static void gdnc_ref(bo_case *c)
{
    const sh_gdnc *s = c->shape;
    float *scratch = bo_xmalloc(sizeof(float) * LS_CPU_GDN_CHUNK_SCRATCH_FLOATS(s->dv));
    ls_cpu_gdn_chunked_heads(R(c, GC_Q), R(c, GC_K), R(c, GC_V), R(c, GC_AL), R(c, GC_BE), R(c, GC_S),
                             R(c, GC_O), s->T, s->pos0, s->Hk, s->Hv, s->dk, s->dv, 0, s->Hv, scratch,
                             c->act, c->order);
    ls_cpu_gdn_chunked_state_heads(R(c, GC_S), s->pos0 + s->T - 1, s->Hv, s->dk, s->dv, 0, s->Hv,
                                   R(c, GC_M), scratch);
    free(scratch);
}

static ls_status gdnc_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_gdnc *s = c->shape;
    if (!be->gdn_chunked || !be->gdn_chunked_state)
        return ls_fail(err, LS_E_UNSUPPORTED, "backend %s has no chunk-aligned GDN op", be->name);
    long n = s->split ? s->split : s->T;
    for (long t = 0; t < s->T; t += n) {
        long m = s->T - t < n ? s->T - t : n;
        LS_TRY(be->gdn_chunked(be, AT(c, GC_Q, t * s->Hk * s->dk), AT(c, GC_K, t * s->Hk * s->dk),
                               AT(c, GC_V, t * s->Hv * s->dv), AT(c, GC_AL, t * s->Hv), AT(c, GC_BE, t * s->Hv),
                               V(c, GC_S), AT(c, GC_O, t * s->Hv * s->dv), m, s->pos0 + t, s->Hk, s->Hv, s->dk,
                               s->dv, c->act, c->order, err));
    }
    return be->gdn_chunked_state(be, V(c, GC_S), s->pos0 + s->T - 1, V(c, GC_M), s->Hv, s->dk, s->dv, err);
}

/* conv_silu_batch: as conv_silu, one state per sequence. */
typedef struct sh_convb {
    int tier;
    long C, K;
    ls_wtype wt;
    long nseq;
    long lens[4];
    int nlens;
} sh_convb;
static const sh_convb convb_shapes[] = {
    {BO_ALL, 8192, 4, LS_WTYPE_BF16, 3, {1, 0, 65}, 3},
    {BO_ALL, 100, 3, LS_WTYPE_BF16, 70, {1, 2, 0, 3}, 4},
    {BO_ALL, 64, 4, LS_WTYPE_F32, 5, {2, 1}, 2},
};
enum { CB_X, CB_Y, CB_S0 };

static void convb_setup(bo_case *c, const void *shape)
{
    const sh_convb *s = shape;
    long T = bo_batch(c, s->nseq, s->lens, s->nlens, NULL, 0);
    bo_weight(c, s->C, s->K, s->wt, 0.7f);
    bo_in(c, CB_X, "x", (size_t)(T * (s->C + 64)), 2.0f, c->act);
    bo_out(c, CB_Y, "y", (size_t)(T * (s->C + 32)), 0);
    for (long q = 0; q < s->nseq; q++)
        bo_in(c, CB_S0 + (int)q, "state", (size_t)(s->C * s->K), 2.0f, c->act);
    for (long q = 0; q < s->nseq; q++) c->t[CB_S0 + q].flags |= BO_AT0;
    bo_what(c, "C %ld K %ld w %s, %ld sequences (%ld rows)", s->C, s->K, wname(s->wt), s->nseq, T);
}

static void convb_ref(bo_case *c)
{
    const sh_convb *s = c->shape;
    const long *row0 = ROW0(c, s->nseq), *len = LEN(c, s->nseq);
    long xs = s->C + 64, ys = s->C + 32;
    ls_wmat w = bo_wm(c, 0);
    for (long q = 0; q < s->nseq; q++)
        if (len[q] > 0)
            ls_cpu_conv_silu(R(c, CB_X) + row0[q] * xs, xs, &w, R(c, CB_S0 + (int)q),
                             R(c, CB_Y) + row0[q] * ys, ys, len[q], s->C, s->K, c->act, c->order);
}

static ls_status convb_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_convb *s = c->shape;
    const long *row0 = ROW0(c, s->nseq), *len = LEN(c, s->nseq);
    long xs = s->C + 64, ys = s->C + 32;
    if (be->conv_silu_batch) {
        ls_buf *st[BO_MAX_TENSORS];
        for (long q = 0; q < s->nseq; q++) st[q] = c->t[CB_S0 + q].buf;
        return be->conv_silu_batch(be, V(c, CB_X), xs, bo_bw(c, 0), st, row0, len, s->nseq,
                                   V(c, CB_Y), ys, s->C, s->K, c->act, c->order, err);
    }
    c->fallback = " via per-sequence ops";
    for (long q = 0; q < s->nseq; q++)
        if (len[q] > 0)
            LS_TRY(be->conv_silu(be, AT(c, CB_X, row0[q] * xs), xs, bo_bw(c, 0),
                                 V(c, CB_S0 + (int)q), AT(c, CB_Y, row0[q] * ys), ys, len[q], s->C,
                                 s->K, c->act, c->order, err));
    return LS_OK;
}

/* ---- attention (kernels/ops_attention.cu) -------------------------------- */

typedef struct sh_rope { int tier; long T, H, d, R, pad; } sh_rope;
static const sh_rope rope_shapes[] = {
    {BO_ALL, 65, 16, 256, 64, 0}, {BO_ALL, 1, 2, 256, 64, 0}, {BO_ALL, 7, 3, 96, 32, 0},
    {BO_ALL, 5, 4, 48, 48, 0},    {BO_ALL, 3, 2, 77, 76, 1},
};
enum { RP_COS, RP_SIN, RP_X };

static void rope_setup(bo_case *c, const void *shape)
{
    const sh_rope *s = shape;
    c->pad = s->pad;
    int32_t *pos = bo_xmalloc(sizeof(int32_t) * (size_t)s->T);
    for (long t = 0; t < s->T; t++) pos[t] = (int32_t)(t * 37 + 5);
    float *ct = bo_out(c, RP_COS, "cos", (size_t)(s->T * (s->R / 2)), 0);
    float *st = bo_out(c, RP_SIN, "sin", (size_t)(s->T * (s->R / 2)), 0);
    ls_cpu_rope_table(pos, s->T, s->R, 1e7, ct, st, c->act);
    free(pos);
    bo_in(c, RP_X, "x", (size_t)(s->T * s->H * s->d), 2.0f, c->act);
    bo_what(c, "T %ld H %ld d %ld R %ld", s->T, s->H, s->d, s->R);
}

static void rope_ref(bo_case *c)
{
    const sh_rope *s = c->shape;
    float *scratch = bo_xmalloc(sizeof(float) * (size_t)s->R);
    ls_cpu_rope_apply(R(c, RP_X), R(c, RP_COS), R(c, RP_SIN), s->T, s->H, s->d, s->R, scratch, c->act);
    free(scratch);
}

static ls_status rope_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_rope *s = c->shape;
    return be->rope_apply(be, V(c, RP_X), V(c, RP_COS), V(c, RP_SIN), s->T, s->H, s->d, s->R,
                          c->act, err);
}

/* Paged caches (ls_cpu_kv_row): page > 0 puts the cache in a pool of pages
 * [P, Hkv, page, d] behind a page table that scatters the logical pages
 * over the pool (a stride coprime to P, and spare pages the table never
 * names). The reference is the contiguous ls_cpu_attention over the
 * logical cache gathered from the pool with the layout's formula written
 * out here, so a backend passes only if paging changes no bit. Positions are
 * chosen at the ceil-division boundaries: lengths pos + 1 = 0, 1 and
 * page - 1 (mod page), a sequence ending exactly on a page, blocks of 32
 * keys that span pages. */

/* The logical page -> pool page map of `n` tables of `entries` each over
 * a pool of P >= n * entries pages: a permutation step coprime to P. */
static void bo_page_tables(int32_t *pt, long n, long entries, long P)
{
    long k = 7;
    for (;; k++) {
        long a = k, b = P;
        while (b) {
            long t = a % b;
            a = b;
            b = t;
        }
        if (a == 1) break;
    }
    for (long i = 0; i < n * entries; i++) pt[i] = (int32_t)((i * k + 3) % P);
}

/* The row of position p of head h behind table pt (the layout, spelled out
 * independently of the library's helper). */
static long bo_kv_row(const int32_t *pt, long page, long Hkv, long h, long p)
{
    return ((long)pt[p / page] * Hkv + h) * page + p % page;
}

/* The logical cache [Hkv, cap, d] of a paged pool (cap = entries * page). */
static float *bo_kv_gather(const float *pool, const int32_t *pt, long page, long cap, long Hkv,
                           long d)
{
    float *out = bo_xmalloc(sizeof(float) * (size_t)(Hkv * cap * d));
    for (long h = 0; h < Hkv; h++)
        for (long p = 0; p < cap; p++)
            memcpy(out + (h * cap + p) * d, pool + bo_kv_row(pt, page, Hkv, h, p) * d,
                   sizeof(float) * (size_t)d);
    return out;
}

typedef struct sh_att { int tier; long Hq, Hkv, d, cap, T, p0, pad, page; } sh_att;
static const sh_att att_shapes[] = {
    {BO_ALL, 16, 2, 256, 200, 65, 0, 0, 0},   /* prefill */
    {BO_ALL, 16, 2, 256, 200, 1, 130, 0, 0},  /* decode */
    {BO_FULL, 16, 2, 256, 200, 63, 64, 0, 0}, /* chunk */
    {BO_QUICK, 16, 2, 256, 200, 9, 64, 0, 0},
    {BO_ALL, 4, 2, 48, 100, 65, 0, 0, 0},
    {BO_ALL, 6, 3, 96, 100, 33, 31, 0, 0},
    {BO_ALL, 2, 1, 77, 40, 9, 20, 1, 0},
    {BO_FULL, 16, 2, 256, 4200, 2, 4100, 0, 0},
    /* paged: a prefill covers every length mod the page; the short runs
     * start at lengths 0 and page - 1 (mod page) and cross into the next */
    {BO_ALL, 16, 2, 256, 208, 65, 0, 0, 16},
    {BO_ALL, 16, 2, 256, 208, 3, 31, 0, 16},  /* lengths 32, 33, 34: ends on a page */
    {BO_ALL, 16, 2, 256, 208, 2, 46, 0, 16},  /* lengths 47, 48 */
    {BO_ALL, 16, 2, 256, 204, 65, 0, 0, 17},
    {BO_ALL, 16, 2, 256, 204, 3, 33, 0, 17},  /* lengths 34, 35, 36 */
    {BO_ALL, 16, 2, 256, 204, 2, 49, 0, 17},  /* lengths 50, 51 */
    {BO_ALL, 2, 1, 77, 51, 9, 20, 1, 17},     /* odd head dim, padded views */
    {BO_ALL, 16, 2, 256, 400, 3, 99, 0, 100}, /* lengths 100, 101, 102 */
    {BO_ALL, 16, 2, 256, 400, 2, 198, 0, 100},/* lengths 199, 200 */
    {BO_FULL, 16, 2, 256, 4200, 2, 4099, 0, 100}, /* more than one key tile per page run */
};
enum { AT_Q, AT_KC, AT_VC, AT_POS, AT_O, AT_PT }; /* AT_PT: paged only */

/* Table entries and positions they cover. */
static long att_entries(const sh_att *s)
{
    return s->page ? (s->cap + s->page - 1) / s->page : 1;
}

static void att_setup(bo_case *c, const void *shape)
{
    const sh_att *s = shape;
    long E = att_entries(s), P = s->page ? E + 2 : 1;
    size_t nc = s->page ? (size_t)(P * s->Hkv * s->page * s->d) : (size_t)(s->Hkv * s->cap * s->d);
    size_t nq = (size_t)(s->T * s->Hq * s->d);
    c->pad = s->pad;
    bo_in(c, AT_Q, "q", nq, 4.0f, c->act);
    bo_in(c, AT_KC, s->page ? "k pool" : "k cache", nc, 1.0f, c->act);
    bo_in(c, AT_VC, s->page ? "v pool" : "v cache", nc, 1.0f, c->act);
    int32_t *pos = bo_i32(c, AT_POS, "pos", (size_t)s->T);
    for (long t = 0; t < s->T; t++) pos[t] = (int32_t)(s->p0 + t);
    bo_out(c, AT_O, "o", nq, 0);
    if (s->page) bo_page_tables(bo_i32(c, AT_PT, "page table", (size_t)E), 1, E, P);
    bo_what(c, "Hq %ld Hkv %ld d %ld cap %ld T %ld from pos %ld", s->Hq, s->Hkv, s->d, s->cap, s->T,
            s->p0);
    if (s->page) bo_what(c, " page %ld (%ld of %ld pool pages)", s->page, E, P);
}

static void att_ref(bo_case *c)
{
    const sh_att *s = c->shape;
    float *scratch = bo_xmalloc(sizeof(float) * (size_t)s->d);
    if (s->page) {
        long cap = att_entries(s) * s->page;
        float *kc = bo_kv_gather(R(c, AT_KC), RI(c, AT_PT), s->page, cap, s->Hkv, s->d);
        float *vc = bo_kv_gather(R(c, AT_VC), RI(c, AT_PT), s->page, cap, s->Hkv, s->d);
        ls_cpu_attention(R(c, AT_Q), kc, vc, cap, RI(c, AT_POS), R(c, AT_O), s->T, s->Hq, s->Hkv,
                         s->d, scratch, c->act, c->order);
        free(kc);
        free(vc);
    } else {
        ls_cpu_attention(R(c, AT_Q), R(c, AT_KC), R(c, AT_VC), s->cap, RI(c, AT_POS), R(c, AT_O),
                         s->T, s->Hq, s->Hkv, s->d, scratch, c->act, c->order);
    }
    free(scratch);
}

static ls_status att_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_att *s = c->shape;
    ls_view pt = {NULL, 0};
    long page = s->cap, cap = s->cap;
    if (s->page) {
        pt = V(c, AT_PT);
        page = s->page;
        cap = att_entries(s) * s->page;
    }
    return be->attention(be, V(c, AT_Q), V(c, AT_KC), V(c, AT_VC), pt, page, cap, V(c, AT_POS),
                         V(c, AT_O), s->T, s->Hq, s->Hkv, s->d, c->act, c->order, err);
}

/* kv_append_batch and attention_batch: sequence s owns rows row0[s].. of the
 * packed K, V (or Q) and its own caches, written from position pos0[s].
 * Paged (page > 0): every sequence's pages are in one pool (as the engine
 * has them), each behind its own table. */
typedef struct sh_kvb {
    int tier;
    long Hq, Hkv, d, cap, nseq;
    long lens[4];
    int nlens;
    long pos0[4];
    int npos;
    long page;
} sh_kvb;
static const sh_kvb kvb_shapes[] = {
    {BO_ALL, 16, 2, 256, 200, 3, {65, 1, 10}, 3, {0, 130, 64}, 3, 0},
    {BO_ALL, 4, 1, 48, 20, 70, {1, 2, 0, 3}, 4, {0, 5, 17}, 3, 0}, /* two launches of 64 */
    {BO_ALL, 2, 1, 77, 40, 2, {9, 1}, 2, {20, 39}, 2, 0},
    /* paged: a decode ending exactly on a page, runs crossing pages */
    {BO_ALL, 16, 2, 256, 208, 3, {65, 1, 10}, 3, {0, 31, 47}, 3, 16},
    {BO_ALL, 16, 2, 256, 204, 3, {65, 1, 18}, 3, {0, 33, 34}, 3, 17},
    {BO_ALL, 16, 2, 256, 200, 3, {1, 2, 101}, 3, {99, 100, 0}, 3, 100},
    {BO_ALL, 4, 1, 48, 32, 70, {1, 2, 0, 3}, 4, {15, 16, 17}, 3, 16}, /* two launches of 64 */
    {BO_ALL, 2, 1, 77, 51, 2, {9, 1}, 2, {8, 33}, 2, 17},
    /* one query per sequence (a decode step: CUDA splits the keys' blocks
     * over the GPU), contiguous and paged, past several tiles */
    {BO_ALL, 16, 2, 256, 400, 4, {1}, 1, {0, 31, 287, 399}, 4, 0},
    {BO_ALL, 16, 2, 256, 400, 1, {1}, 1, {32}, 1, 0},
    {BO_ALL, 4, 1, 48, 40, 70, {1, 0}, 2, {0, 5, 39}, 3, 0}, /* two launches of 64 */
    {BO_ALL, 16, 2, 256, 208, 3, {1}, 1, {47, 207, 100}, 3, 16},
    {BO_ALL, 2, 1, 77, 51, 2, {1}, 1, {50, 16}, 2, 17},
};
enum { KB_K, KB_V, KB_POS, KB_C0 }; /* then the k caches, then the v caches (paged: the k
                                       pool, the v pool, the page tables) */

static long kvb_entries(const sh_kvb *s)
{
    return (s->cap + s->page - 1) / s->page;
}

/* Paged: the pools and tables of a batch (tensors from index `first`). */
static void kvb_pool_setup(bo_case *c, const sh_kvb *s, int first)
{
    long E = kvb_entries(s), P = s->nseq * E + 1;
    size_t np = (size_t)(P * s->Hkv * s->page * s->d);
    bo_in(c, first, "k pool", np, 1.0f, c->act);
    bo_in(c, first + 1, "v pool", np, 1.0f, c->act);
    c->t[first].flags |= BO_AT0;
    c->t[first + 1].flags |= BO_AT0;
    bo_page_tables(bo_i32(c, first + 2, "page tables", (size_t)(s->nseq * E)), s->nseq, E, P);
    bo_what(c, " page %ld (%ld pool pages)", s->page, P);
}

/* The position of every packed row (as the engine uploads them), i32 [T]. */
static void kvb_positions(bo_case *c, const sh_kvb *s, int idx, long T)
{
    int32_t *pos = bo_i32(c, idx, "pos", (size_t)T);
    for (long q = 0; q < s->nseq; q++)
        for (long i = 0; i < LEN(c, s->nseq)[q]; i++)
            pos[ROW0(c, s->nseq)[q] + i] = (int32_t)(POS0(c, s->nseq)[q] + i);
}

static void kvb_setup(bo_case *c, const void *shape)
{
    const sh_kvb *s = shape;
    long T = bo_batch(c, s->nseq, s->lens, s->nlens, s->pos0, s->npos);
    size_t nr = (size_t)(T * s->Hkv * s->d), nc = (size_t)(s->Hkv * s->cap * s->d);
    bo_in(c, KB_K, "k", nr, 1.0f, c->act);
    bo_in(c, KB_V, "v", nr, 1.0f, c->act);
    kvb_positions(c, s, KB_POS, T);
    bo_what(c, "Hkv %ld d %ld cap %ld, %ld sequences (%ld rows)", s->Hkv, s->d, s->cap, s->nseq, T);
    if (s->page) {
        kvb_pool_setup(c, s, KB_C0);
        return;
    }
    for (long q = 0; q < 2 * s->nseq; q++) /* earlier rows of each cache stay */
        bo_in(c, KB_C0 + (int)q, q < s->nseq ? "k cache" : "v cache", nc, 1.0f, c->act);
    for (long q = 0; q < 2 * s->nseq; q++) c->t[KB_C0 + q].flags |= BO_AT0;
}

/* Rows [len, Hkv, d] from row r0 to positions p0.. of each head of a cache
 * (pt NULL: contiguous [Hkv, cap, d]; else paged with pages of `page`). */
static void kv_copy(float *cache, const float *rows, long r0, long p0, long len, long Hkv, long d,
                    long cap, const int32_t *pt, long page)
{
    for (long i = 0; i < len; i++)
        for (long h = 0; h < Hkv; h++) {
            long row = pt ? bo_kv_row(pt, page, Hkv, h, p0 + i) : h * cap + p0 + i;
            memcpy(cache + row * d, rows + ((r0 + i) * Hkv + h) * d, sizeof(float) * (size_t)d);
        }
}

static void kvb_ref(bo_case *c)
{
    const sh_kvb *s = c->shape;
    const long *row0 = ROW0(c, s->nseq), *len = LEN(c, s->nseq), *pos0 = POS0(c, s->nseq);
    for (long q = 0; q < s->nseq; q++) {
        if (s->page) {
            const int32_t *pt = RI(c, KB_C0 + 2) + q * kvb_entries(s);
            kv_copy(R(c, KB_C0), R(c, KB_K), row0[q], pos0[q], len[q], s->Hkv, s->d, 0, pt, s->page);
            kv_copy(R(c, KB_C0 + 1), R(c, KB_V), row0[q], pos0[q], len[q], s->Hkv, s->d, 0, pt,
                    s->page);
            continue;
        }
        kv_copy(R(c, KB_C0 + (int)q), R(c, KB_K), row0[q], pos0[q], len[q], s->Hkv, s->d, s->cap,
                NULL, 0);
        kv_copy(R(c, KB_C0 + (int)(s->nseq + q)), R(c, KB_V), row0[q], pos0[q], len[q], s->Hkv,
                s->d, s->cap, NULL, 0);
    }
}

/* The batch's caches, tables, page and capacity as the batched ops take them. */
static void kvb_args(const bo_case *c, const sh_kvb *s, int first, ls_buf **kc, ls_buf **vc,
                     ls_view *pts, long *page, long *cap)
{
    for (long q = 0; q < s->nseq; q++) {
        kc[q] = s->page ? c->t[first].buf : c->t[first + q].buf;
        vc[q] = s->page ? c->t[first + 1].buf : c->t[first + s->nseq + q].buf;
        pts[q] = s->page ? AT(c, first + 2, q * kvb_entries(s)) : (ls_view){NULL, 0};
    }
    *page = s->page ? s->page : s->cap;
    *cap = s->page ? kvb_entries(s) * s->page : s->cap;
}

static ls_status kvb_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_kvb *s = c->shape;
    const long *row0 = ROW0(c, s->nseq), *len = LEN(c, s->nseq), *pos0 = POS0(c, s->nseq);
    ls_buf *kc[BO_MAX_TENSORS], *vc[BO_MAX_TENSORS];
    ls_view pts[BO_MAX_TENSORS];
    long page, cap;
    kvb_args(c, s, KB_C0, kc, vc, pts, &page, &cap);
    if (be->kv_append_batch)
        return be->kv_append_batch(be, V(c, KB_K), V(c, KB_V), kc, vc, pts, page, cap, row0, len,
                                   pos0, V(c, KB_POS), s->nseq, s->Hkv, s->d, err);
    /* As the engine does without it: block copies per sequence, cache and
     * run of positions within one page (contiguous: one run). */
    c->fallback = " via per-sequence ops";
    for (long q = 0; q < s->nseq; q++) {
        const int32_t *pt = s->page ? INITI(c, KB_C0 + 2) + q * kvb_entries(s) : NULL;
        for (long i = 0; i < len[q];) {
            long p = pos0[q] + i, m = len[q] - i, room = page - p % page;
            if (m > room) m = room;
            ls_copy_shape kv = {m, s->Hkv, s->d, s->d, page * s->d, s->Hkv * s->d, s->d};
            long at = (pt ? bo_kv_row(pt, page, s->Hkv, 0, p) : p) * s->d;
            ls_copy_job jobs[2] = {
                {ls_view_at((ls_view){kc[q], 0}, (size_t)at), AT(c, KB_K, (row0[q] + i) * s->Hkv * s->d), kv},
                {ls_view_at((ls_view){vc[q], 0}, (size_t)at), AT(c, KB_V, (row0[q] + i) * s->Hkv * s->d), kv}};
            LS_TRY(be->copy_blocks(be, jobs, 2, err));
            i += m;
        }
    }
    return LS_OK;
}

enum { AB_Q, AB_POS, AB_O, AB_C0 }; /* then the k caches, then the v caches (paged: the k
                                       pool, the v pool, the page tables) */

static void attb_setup(bo_case *c, const void *shape)
{
    const sh_kvb *s = shape;
    long T = bo_batch(c, s->nseq, s->lens, s->nlens, s->pos0, s->npos);
    size_t nq = (size_t)(T * s->Hq * s->d), nc = (size_t)(s->Hkv * s->cap * s->d);
    bo_in(c, AB_Q, "q", nq, 4.0f, c->act);
    kvb_positions(c, s, AB_POS, T);
    bo_out(c, AB_O, "o", nq, 0);
    bo_what(c, "Hq %ld Hkv %ld d %ld cap %ld, %ld sequences (%ld rows)", s->Hq, s->Hkv, s->d,
            s->cap, s->nseq, T);
    if (s->page) {
        kvb_pool_setup(c, s, AB_C0);
        return;
    }
    for (long q = 0; q < 2 * s->nseq; q++)
        bo_in(c, AB_C0 + (int)q, q < s->nseq ? "k cache" : "v cache", nc, 1.0f, c->act);
    for (long q = 0; q < 2 * s->nseq; q++) c->t[AB_C0 + q].flags |= BO_AT0;
}

static void attb_ref(bo_case *c)
{
    const sh_kvb *s = c->shape;
    const long *row0 = ROW0(c, s->nseq), *len = LEN(c, s->nseq);
    long nq = s->Hq * s->d;
    float *scratch = bo_xmalloc(sizeof(float) * (size_t)s->d);
    for (long q = 0; q < s->nseq; q++) {
        if (len[q] == 0) continue;
        const float *kc = R(c, AB_C0 + (int)q), *vc = R(c, AB_C0 + (int)(s->nseq + q));
        float *kg = NULL, *vg = NULL;
        long cap = s->cap;
        if (s->page) { /* the contiguous reference over the gathered logical cache */
            const int32_t *pt = RI(c, AB_C0 + 2) + q * kvb_entries(s);
            cap = kvb_entries(s) * s->page;
            kc = kg = bo_kv_gather(R(c, AB_C0), pt, s->page, cap, s->Hkv, s->d);
            vc = vg = bo_kv_gather(R(c, AB_C0 + 1), pt, s->page, cap, s->Hkv, s->d);
        }
        ls_cpu_attention(R(c, AB_Q) + row0[q] * nq, kc, vc, cap, RI(c, AB_POS) + row0[q],
                         R(c, AB_O) + row0[q] * nq, len[q], s->Hq, s->Hkv, s->d, scratch, c->act,
                         c->order);
        free(kg);
        free(vg);
    }
    free(scratch);
}

static ls_status attb_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_kvb *s = c->shape;
    const long *row0 = ROW0(c, s->nseq), *len = LEN(c, s->nseq);
    long nq = s->Hq * s->d;
    ls_buf *kc[BO_MAX_TENSORS], *vc[BO_MAX_TENSORS];
    ls_view pts[BO_MAX_TENSORS];
    long page, cap;
    kvb_args(c, s, AB_C0, kc, vc, pts, &page, &cap);
    if (be->attention_batch)
        return be->attention_batch(be, V(c, AB_Q), kc, vc, pts, page, cap, row0, len, s->nseq,
                                   V(c, AB_POS), V(c, AB_O), s->Hq, s->Hkv, s->d, c->act, c->order,
                                   err);
    c->fallback = " via per-sequence ops";
    for (long q = 0; q < s->nseq; q++)
        if (len[q] > 0)
            LS_TRY(be->attention(be, AT(c, AB_Q, row0[q] * nq), (ls_view){kc[q], 0},
                                 (ls_view){vc[q], 0}, pts[q], page, cap, AT(c, AB_POS, row0[q]),
                                 AT(c, AB_O, row0[q] * nq), len[q], s->Hq, s->Hkv, s->d, c->act,
                                 c->order, err));
    return LS_OK;
}

/* ---- router and MoE (kernels/ops_moe.cu) --------------------------------- */

typedef struct sh_router { int tier; long E, D, T, k; int norm, ties; ls_wtype wt; } sh_router;
static const sh_router router_shapes[] = {
    {BO_ALL, 512, 2048, 1, 10, 1, 0, LS_WTYPE_BF16},
    {BO_FULL, 512, 2048, 65, 10, 1, 0, LS_WTYPE_BF16},
    {BO_QUICK, 512, 2048, 3, 10, 1, 0, LS_WTYPE_BF16},
    {BO_ALL, 64, 96, 63, 8, 0, 1, LS_WTYPE_BF16},
    {BO_ALL, 64, 96, 5, 8, 1, 1, LS_WTYPE_BF16},
    {BO_ALL, 64, 96, 5, 40, 1, 1, LS_WTYPE_BF16}, /* picks past lane 31; lanes run out */
    {BO_ALL, 700, 96, 5, 8, 1, 1, LS_WTYPE_BF16},  /* 32 logits per lane in registers */
    {BO_ALL, 1100, 96, 5, 8, 0, 1, LS_WTYPE_BF16}, /* beyond the register kernels */
    {BO_ALL, 48, 64, 4, 4, 1, 0, LS_WTYPE_F32},
};
enum { RT_X, RT_PROBS, RT_IDS, RT_W };

static void router_setup(bo_case *c, const void *shape)
{
    const sh_router *s = shape;
    bo_weight(c, s->E, s->D, s->wt, 0.05f);
    if (s->ties) { /* duplicate rows: equal logits, so ties must go to the lower index */
        size_t row = (size_t)s->D * (s->wt == LS_WTYPE_BF16 ? 2 : 4);
        unsigned char *w = c->wblob + c->wd[0].off;
        for (long e = 1; e < s->E; e += 2)
            memcpy(w + (size_t)e * row, w + (size_t)(e - 1) * row, row);
    }
    bo_in(c, RT_X, "x", (size_t)(s->T * s->D), 1.0f, c->act);
    bo_out(c, RT_PROBS, "probs", (size_t)(s->T * s->E), 0);
    bo_i32(c, RT_IDS, "ids", (size_t)(s->T * s->k));
    bo_out(c, RT_W, "weights", (size_t)(s->T * s->k), 0);
    bo_what(c, "E %ld D %ld T %ld k %ld norm %d ties %d w %s", s->E, s->D, s->T, s->k, s->norm,
            s->ties, wname(s->wt));
}

static void router_ref(bo_case *c)
{
    const sh_router *s = c->shape;
    ls_wmat w = bo_wm(c, 0);
    ls_cpu_router(&w, R(c, RT_X), s->T, s->k, s->norm, R(c, RT_PROBS), RI(c, RT_IDS), R(c, RT_W),
                  c->act, c->order);
}

static ls_status router_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_router *s = c->shape;
    return be->router(be, bo_bw(c, 0), V(c, RT_X), s->T, s->k, s->norm, V(c, RT_PROBS),
                      V(c, RT_IDS), V(c, RT_W), c->act, c->order, err);
}

/* split: the backend runs tokens [0, T-1) and then the last token alone (a
 * token's output must not depend on which other tokens share its experts). */
typedef struct sh_moe {
    int tier;
    long E, D, I, Is, k, T;
    int shared;
    ls_wtype wt;
    int split;
} sh_moe;
static const sh_moe moe_shapes[] = {
    {BO_FULL, 16, 2048, 512, 512, 10, 1, 1, LS_WTYPE_BF16, 0},
    {BO_FULL, 16, 2048, 512, 512, 10, 65, 1, LS_WTYPE_BF16, 0},
    {BO_FULL, 16, 2048, 512, 512, 10, 65, 1, LS_WTYPE_BF16, 1},
    {BO_QUICK, 16, 2048, 64, 64, 10, 2, 1, LS_WTYPE_BF16, 1},
    {BO_FULL, 16, 512, 256, 128, 4, 40, 1, LS_WTYPE_F32, 0},
    {BO_QUICK, 16, 512, 256, 128, 4, 5, 1, LS_WTYPE_F32, 0},
    {BO_ALL, 8, 96, 48, 80, 3, 7, 1, LS_WTYPE_BF16, 0},
    {BO_ALL, 8, 96, 48, 80, 3, 7, 0, LS_WTYPE_BF16, 0},
    {BO_ALL, 8, 96, 48, 80, 3, 7, 1, LS_WTYPE_BF16, 1},
    {BO_FULL, 512, 128, 64, 32, 10, 65, 1, LS_WTYPE_BF16, 0}, /* E = 512, k = 10 */
    /* FP8 experts (the shared expert gate vector stays bf16, as released) */
    {BO_ALL, 8, 256, 128, 160, 3, 7, 1, LS_WTYPE_F8_DEQUANT, 0},
    {BO_ALL, 8, 256, 128, 160, 3, 7, 1, LS_WTYPE_F8_W8A8, 1},
    {BO_ALL, 8, 200, 100, 72, 3, 7, 0, LS_WTYPE_F8_W8A8, 0},
    {BO_ALL, 16, 512, 256, 128, 4, 40, 1, LS_WTYPE_F8_W8A8, 0},
    {BO_FULL, 16, 2048, 512, 512, 10, 65, 1, LS_WTYPE_F8_W8A8, 1},
    {BO_FULL, 16, 2048, 512, 512, 10, 65, 1, LS_WTYPE_F8_DEQUANT, 0},
};
enum { MO_X, MO_IDS, MO_W, MO_OUT };

/* Weight ids: gate e, up E + e, down 2E + e; the shared expert's gate, up,
 * down and gate vector 3E .. 3E + 3. */
static void moe_setup(bo_case *c, const void *shape)
{
    const sh_moe *s = shape;
    for (long e = 0; e < s->E; e++) bo_weight(c, s->I, s->D, s->wt, 0.05f);
    for (long e = 0; e < s->E; e++) bo_weight(c, s->I, s->D, s->wt, 0.05f);
    for (long e = 0; e < s->E; e++) bo_weight(c, s->D, s->I, s->wt, 0.05f);
    if (s->shared) {
        bo_weight(c, s->Is, s->D, s->wt, 0.05f);
        bo_weight(c, s->Is, s->D, s->wt, 0.05f);
        bo_weight(c, s->D, s->Is, s->wt, 0.05f);
        bo_weight(c, 1, s->D, ls_wtype_is_f8(s->wt) ? LS_WTYPE_BF16 : s->wt, 0.05f);
    }
    bo_in(c, MO_X, "x", (size_t)(s->T * s->D), 1.0f, c->act);
    int32_t *ids = bo_i32(c, MO_IDS, "ids", (size_t)(s->T * s->k));
    float *w = bo_out(c, MO_W, "weights", (size_t)(s->T * s->k), 0);
    for (long t = 0; t < s->T; t++)
        for (long i = 0; i < s->k; i++) {
            ids[t * s->k + i] = (int32_t)((t * 5 + i * 3) % s->E); /* tokens share experts */
            w[t * s->k + i] = ls_round_bf16(0.05f + fabsf(bo_rand_f32(c, 0.2f)));
        }
    bo_out(c, MO_OUT, "out", (size_t)(s->T * s->D), 0);
    bo_what(c, "E %ld D %ld I %ld Is %ld k %ld T %ld shared %d w %s%s", s->E, s->D, s->I, s->Is,
            s->k, s->T, s->shared, wname(s->wt), s->split ? " (last token alone)" : "");
}

static void moe_ref(bo_case *c)
{
    const sh_moe *s = c->shape;
    ls_wmat *m = bo_xmalloc(sizeof *m * (size_t)c->nw);
    for (int i = 0; i < c->nw; i++) m[i] = bo_wm(c, i);
    long E = s->E;
    ls_moe_weights mw = {E, s->D, s->I, s->Is, m, m + E, m + 2 * E,
                         s->shared ? m + 3 * E : NULL, s->shared ? m + 3 * E + 1 : NULL,
                         s->shared ? m + 3 * E + 2 : NULL, s->shared ? m + 3 * E + 3 : NULL};
    float *scratch = bo_xmalloc(sizeof(float) * ((size_t)((s->k + 1) * s->D) +
                                                 LS_CPU_EXPERT_SCRATCH(s->D, s->I > s->Is ? s->I : s->Is)));
    ls_cpu_moe(&mw, R(c, MO_X), RI(c, MO_IDS), R(c, MO_W), s->k, R(c, MO_OUT), 0, s->T, scratch,
               c->act, c->order, c->order2);
    free(scratch);
    free(m);
}

static ls_status moe_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_moe *s = c->shape;
    long E = s->E, T1 = s->split ? s->T - 1 : s->T;
    ls_bmoe mw = {E, s->D, s->I, s->Is, bo_bw(c, 0), bo_bw(c, (int)E), bo_bw(c, (int)(2 * E)),
                  s->shared ? bo_bw(c, (int)(3 * E)) : NULL,
                  s->shared ? bo_bw(c, (int)(3 * E + 1)) : NULL,
                  s->shared ? bo_bw(c, (int)(3 * E + 2)) : NULL,
                  s->shared ? bo_bw(c, (int)(3 * E + 3)) : NULL};
    LS_TRY(be->moe(be, &mw, V(c, MO_X), V(c, MO_IDS), V(c, MO_W), s->k, V(c, MO_OUT), T1, c->act,
                   c->order, c->order2, err));
    if (T1 == s->T) return LS_OK;
    return be->moe(be, &mw, AT(c, MO_X, T1 * s->D), AT(c, MO_IDS, T1 * s->k),
                   AT(c, MO_W, T1 * s->k), s->k, AT(c, MO_OUT, T1 * s->D), 1, c->act, c->order,
                   c->order2, err);
}

/* Expert parallelism (moe_slots, then moe_combine): the (token, slot) pairs
 * split between two ranks by owner (experts 0..E/2-1 and the shared slots of
 * even tokens on the first, the rest on the second), each rank computing
 * its pairs with its own experts' weights only (the others' have no
 * buffer), the rows put in slot order by exact copies, then combined: the
 * output of moe, bit for bit. A backend without the ops runs moe (the
 * engine refuses expert parallelism there). */
static ls_status moe_ep_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_moe *s = c->shape;
    long E = s->E, k = s->k, T = s->T, D = s->D, slots = k + (s->shared ? 1 : 0);
    if (!be->moe_slots || !be->moe_combine) {
        c->fallback = " via moe (no expert-parallel ops)";
        return moe_exec(c, be, err);
    }
    const int32_t *ids = INITI(c, MO_IDS);
    int32_t *pairs = bo_xmalloc(sizeof(int32_t) * (size_t)(2 * T * slots));
    ls_bweight *mine = bo_xmalloc(sizeof(ls_bweight) * (size_t)(3 * E));
    ls_buf *all = NULL;
    ls_status st = be->alloc(be, sizeof(float) * (size_t)(T * slots * D), &all, err);
    for (int r = 0; r < 2 && st == LS_OK; r++) {
        long n = 0;
        for (long t = 0; t < T; t++)
            for (long i = 0; i < slots; i++)
                if ((i < k ? ids[t * k + i] >= E / 2 : t % 2) == r) {
                    pairs[2 * n] = (int32_t)t;
                    pairs[2 * n + 1] = (int32_t)i;
                    n++;
                }
        for (long e = 0; e < 3 * E; e++) {
            mine[e] = *bo_bw(c, (int)e);
            if ((e % E >= E / 2) != r) mine[e].buf = NULL;
        }
        ls_bmoe mw = {E, D, s->I, s->Is, mine, mine + E, mine + 2 * E,
                      s->shared ? bo_bw(c, (int)(3 * E)) : NULL,
                      s->shared ? bo_bw(c, (int)(3 * E + 1)) : NULL,
                      s->shared ? bo_bw(c, (int)(3 * E + 2)) : NULL,
                      s->shared ? bo_bw(c, (int)(3 * E + 3)) : NULL};
        ls_buf *pb = NULL, *cb = NULL;
        st = be->alloc(be, sizeof(int32_t) * (size_t)(2 * n + 1), &pb, err);
        if (st == LS_OK) st = be->alloc(be, sizeof(float) * (size_t)(n * D + 1), &cb, err);
        if (st == LS_OK && n) st = be->upload(be, (ls_view){pb, 0}, pairs, sizeof(int32_t) * (size_t)(2 * n), err);
        if (st == LS_OK)
            st = be->moe_slots(be, &mw, V(c, MO_X), V(c, MO_IDS), V(c, MO_W), k, T, (ls_view){pb, 0}, n,
                               (ls_view){cb, 0}, c->act, c->order, err);
        for (long j = 0; j < n && st == LS_OK; j++)
            st = ls_copy_rows(be, (ls_view){all, (size_t)((pairs[2 * j] * slots + pairs[2 * j + 1]) * D)}, D,
                              (ls_view){cb, (size_t)(j * D)}, D, 1, D, err);
    }
    if (st == LS_OK)
        st = be->moe_combine(be, (ls_view){all, 0}, k, D, s->shared, V(c, MO_OUT), T, c->act, c->order2,
                             err);
    free(pairs);
    free(mine);
    return st;
}

/* ---- memory: copy_blocks, alloc / upload / zero / download --------------- */

/* split: the backend gets one job per group, all in one call (groups <=
 * LS_COPY_JOBS_MAX), the reference the one shape. */
typedef struct sh_copy {
    int tier;
    ls_copy_shape sh;
    long dst_n, src_n, dst_off, src_off;
    const char *label;
    int split;
} sh_copy;
static const sh_copy copy_shapes[] = {
    /* the engine's GDN projection split: v of 16 key-head groups [q k v z] */
    {BO_ALL, {65, 16, 256, 8192, 256, 16 * 768, 768}, 65 * 8192, 65 * 16 * 768, 2 * 16 * 128,
     2 * 128, "GDN split of v", 0},
    {BO_ALL, {65, 1, 2048, 2048, 0, 8192, 0}, 65 * 2048, 65 * 8192, 0, 4096, "rows", 0},
    {BO_ALL, {7, 2, 256, 256, 200 * 256, 512, 256}, 2 * 200 * 256, 10 * 512, 30 * 256, 3 * 512,
     "KV rows to cache positions 30..", 0},
    {BO_ALL, {7, 2, 256, 256, 200 * 256, 512, 256}, 2 * 200 * 256, 10 * 512, 30 * 256, 3 * 512,
     "KV rows to cache positions 30.., a job per head", 1},
    {BO_ALL, {3, 5, 7, 40, 8, 37, 7}, 200, 150, 1, 2, "odd strides", 0},
    {BO_ALL, {3, 5, 7, 40, 8, 37, 7}, 200, 150, 1, 2, "odd strides, a job per group", 1},
    {BO_ALL, {9, 8, 33, 300, 34, 280, 35}, 9 * 300, 9 * 280, 3, 0, "8 jobs in one call", 1},
};
enum { CP_SRC, CP_DST };

static void copy_setup(bo_case *c, const void *shape)
{
    const sh_copy *s = shape;
    bo_in(c, CP_SRC, "src", (size_t)s->src_n, 4.0f, 0);
    bo_in(c, CP_DST, "dst", (size_t)s->dst_n, 4.0f, 0); /* what is not copied over stays */
    bo_what(c, "%s: %ld rows x %ld groups of %ld", s->label, s->sh.rows, s->sh.groups, s->sh.len);
}

static void copy_ref(bo_case *c)
{
    const sh_copy *s = c->shape;
    const ls_copy_shape *h = &s->sh;
    float *d = R(c, CP_DST) + s->dst_off;
    const float *src = R(c, CP_SRC) + s->src_off;
    for (long r = 0; r < h->rows; r++)
        for (long g = 0; g < h->groups; g++)
            memcpy(d + r * h->dst_stride + g * h->dst_step,
                   src + r * h->src_stride + g * h->src_step, sizeof(float) * (size_t)h->len);
}

static ls_status copy_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_copy *s = c->shape;
    ls_copy_job jobs[LS_COPY_JOBS_MAX];
    if (!s->split) {
        jobs[0] = (ls_copy_job){AT(c, CP_DST, s->dst_off), AT(c, CP_SRC, s->src_off), s->sh};
        return be->copy_blocks(be, jobs, 1, err);
    }
    ls_copy_shape one = s->sh;
    one.groups = 1;
    for (long g = 0; g < s->sh.groups; g++)
        jobs[g] = (ls_copy_job){AT(c, CP_DST, s->dst_off + g * s->sh.dst_step),
                                AT(c, CP_SRC, s->src_off + g * s->sh.src_step), one};
    return be->copy_blocks(be, jobs, (int)s->sh.groups, err);
}

/* A fresh buffer reads back as zeros; then upload, zero and download at
 * element offsets of a second buffer. */
typedef struct sh_mem {
    int tier;
    long n, up_off, up_n, zero_off, zero_n, down_off, down_n, pad;
} sh_mem;
static const sh_mem mem_shapes[] = {
    {BO_ALL, 1000, 3, 500, 100, 77, 50, 900, 0},
    {BO_ALL, 65 * 2048, 0, 65 * 2048, 2048, 2048, 1, 65 * 2048 - 1, 1},
};
enum { MM_FRESH, MM_B, MM_P, MM_Q };

static void mem_setup(bo_case *c, const void *shape)
{
    const sh_mem *s = shape;
    c->pad = s->pad;
    memset(bo_add(c, MM_FRESH, "fresh buffer", BO_F32, BO_FRESH, (size_t)s->n)->init, 0,
           sizeof(float) * (size_t)s->n);
    bo_in(c, MM_B, "buffer", (size_t)s->n, 4.0f, 0);
    bo_in(c, MM_P, "uploaded", (size_t)s->up_n, 4.0f, 0);
    c->t[MM_P].flags = BO_HOST_IN;
    bo_out(c, MM_Q, "downloaded", (size_t)s->down_n, BO_HOST_OUT);
    bo_what(c, "n %ld: upload %ld at %ld, zero %ld at %ld, download %ld at %ld", s->n, s->up_n,
            s->up_off, s->zero_n, s->zero_off, s->down_n, s->down_off);
}

static void mem_ref(bo_case *c)
{
    const sh_mem *s = c->shape;
    memcpy(R(c, MM_B) + s->up_off, INIT(c, MM_P), sizeof(float) * (size_t)s->up_n);
    memset(R(c, MM_B) + s->zero_off, 0, sizeof(float) * (size_t)s->zero_n);
    memcpy(R(c, MM_Q), R(c, MM_B) + s->down_off, sizeof(float) * (size_t)s->down_n);
}

static ls_status mem_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_mem *s = c->shape;
    LS_TRY(be->upload(be, AT(c, MM_B, s->up_off), INIT(c, MM_P), sizeof(float) * (size_t)s->up_n,
                      err));
    LS_TRY(be->zero(be, AT(c, MM_B, s->zero_off), (size_t)s->zero_n, err));
    return be->download(be, c->t[MM_Q].got, AT(c, MM_B, s->down_off),
                        sizeof(float) * (size_t)s->down_n, err);
}

/* ---- digests ------------------------------------------------------------- */

/* Jobs over the kinds of rows the engine digests: hidden rows (bf16), K then
 * V rows (two spans), expert ids (raw int32), a whole GDN state (raw and
 * bf16; long enough that CUDA hashes it on the host), conv states (strided
 * rows), empty spans and jobs. Values include NaN, infinities, signed zeros
 * and bf16 rounding ties. */
typedef struct sh_digest { int tier; long T, D, W, Hv, dk, dv, C, K, k; } sh_digest;
static const sh_digest digest_shapes[] = {
    {BO_ALL, 65, 2048, 512, 32, 128, 128, 8192, 4, 10},
    {BO_ALL, 1, 96, 48, 2, 48, 96, 100, 3, 3},
};
enum { DG_H, DG_STATE, DG_CONV, DG_K, DG_V, DG_IDS, DG_OUT };

typedef struct bo_span_spec { int tensor; long off, rows, len, stride; int bf16; } bo_span_spec;
typedef struct bo_job_spec { bo_span_spec span[2]; } bo_job_spec;

static uint32_t bo_rand_bits(bo_case *c)
{
    uint64_t r = bo_rand_u64(c);
    switch (r % 16) {
    case 0: return 0x7fc00001u; /* NaN with payload */
    case 1: return 0xff800000u; /* -inf */
    case 2: return 0x80000000u; /* -0 */
    case 3: return 0x3f80ffffu; /* rounds up in bf16 */
    case 4: return 0x3f808000u; /* tie, even */
    case 5: return 0x3f818000u; /* tie, odd */
    default: return (uint32_t)(r >> 32);
    }
}

static void bo_fill_bits(bo_case *c, int idx, const char *name, int kind, size_t n)
{
    uint32_t *p = bo_add(c, idx, name, kind, 0, n)->init;
    for (size_t i = 0; i < n; i++) p[i] = bo_rand_bits(c);
}

static long digest_jobs(const sh_digest *s)
{
    return 3 * s->T + 8;
}

static void digest_setup(bo_case *c, const void *shape)
{
    const sh_digest *s = shape;
    long n = digest_jobs(s), S = s->Hv * s->dk * s->dv;
    bo_fill_bits(c, DG_H, "hidden", BO_F32, (size_t)(s->T * s->D));
    bo_fill_bits(c, DG_STATE, "gdn state", BO_F32, (size_t)S);
    bo_fill_bits(c, DG_CONV, "conv state", BO_F32, (size_t)(s->C * s->K));
    bo_fill_bits(c, DG_K, "k", BO_F32, (size_t)(s->T * s->W));
    bo_fill_bits(c, DG_V, "v", BO_F32, (size_t)(s->T * s->W));
    bo_fill_bits(c, DG_IDS, "ids", BO_I32, (size_t)(s->T * s->k));
    bo_poison(bo_add(c, DG_OUT, "digest", BO_SHA, BO_HOST_OUT, (size_t)n)->init,
              (size_t)n * sizeof(ls_digest) / 4);
    bo_job_spec *j = calloc((size_t)n, sizeof *j);
    if (!j) abort();
    c->aux2 = j;
    long i = 0;
    for (long t = 0; t < s->T; t++, i++)
        j[i].span[0] = (bo_span_spec){DG_H, t * s->D, 1, s->D, s->D, 1};
    for (long t = 0; t < s->T; t++, i++) {
        j[i].span[0] = (bo_span_spec){DG_K, t * s->W, 1, s->W, s->W, 1};
        j[i].span[1] = (bo_span_spec){DG_V, t * s->W, 1, s->W, s->W, 1};
    }
    for (long t = 0; t < s->T; t++, i++)
        j[i].span[0] = (bo_span_spec){DG_IDS, t * s->k, 1, s->k, s->k, 0};
    j[i++].span[0] = (bo_span_spec){DG_H, 0, s->T, s->D, s->D, 0};
    j[i++].span[0] = (bo_span_spec){DG_STATE, 0, 1, S, S, 0};
    j[i++].span[0] = (bo_span_spec){DG_STATE, 0, s->Hv, s->dk * s->dv, s->dk * s->dv, 1};
    j[i++].span[0] = (bo_span_spec){DG_CONV, 1, s->C, s->K - 1, s->K, 0};
    j[i++].span[0] = (bo_span_spec){DG_CONV, 1, s->C, s->K - 1, s->K, 1};
    j[i].span[0] = (bo_span_spec){DG_CONV, 1, s->C, s->K - 1, s->K, 0};
    j[i++].span[1] = (bo_span_spec){DG_H, 0, 1, s->D, s->D, 1};
    i++; /* both spans unused: the digest of no bytes */
    j[i].span[0] = (bo_span_spec){DG_H, 0, 1, 0, 0, 0}; /* one empty row */
    j[i++].span[1] = (bo_span_spec){DG_H, (s->T - 1) * s->D, 1, s->D, s->D, 1};
    bo_what(c, "%ld jobs (T %ld D %ld, K/V rows %ld, state %ld x %ld x %ld, conv %ld x %ld)", n,
            s->T, s->D, s->W, s->Hv, s->dk, s->dv, s->C, s->K);
}

static void digest_ref(bo_case *c)
{
    const sh_digest *s = c->shape;
    const bo_job_spec *j = c->aux2;
    long n = digest_jobs(s);
    ls_digest *out = c->t[DG_OUT].ref;
    for (long i = 0; i < n; i++) {
        size_t bytes = 0;
        for (int k = 0; k < 2; k++) bytes += (size_t)(j[i].span[k].rows * j[i].span[k].len) * 4;
        unsigned char *buf = bo_xmalloc(bytes), *p = buf;
        for (int k = 0; k < 2; k++) {
            const bo_span_spec *sp = &j[i].span[k];
            const uint32_t *src = (const uint32_t *)c->t[sp->tensor].init + sp->off;
            for (long r = 0; r < sp->rows; r++)
                for (long e = 0; e < sp->len; e++) {
                    uint32_t u = src[r * sp->stride + e];
                    if (sp->bf16) {
                        float f;
                        memcpy(&f, &u, 4);
                        uint16_t h = ls_f32_to_bf16(f);
                        *p++ = (unsigned char)(h & 0xff);
                        *p++ = (unsigned char)(h >> 8);
                    } else {
                        for (int b = 0; b < 4; b++) *p++ = (unsigned char)(u >> (8 * b));
                    }
                }
        }
        ls_error err;
        if (ls_sha256_buf(buf, (size_t)(p - buf), &out[i], &err) != LS_OK) {
            fprintf(stderr, "backend_ops: reference SHA-256: %s\n", err.msg);
            abort();
        }
        free(buf);
    }
}

static ls_status digest_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const sh_digest *s = c->shape;
    const bo_job_spec *j = c->aux2;
    long n = digest_jobs(s);
    ls_digest_job *jobs = calloc((size_t)n, sizeof *jobs);
    if (!jobs) return ls_fail(err, LS_E_NOMEM, "digest jobs");
    for (long i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            const bo_span_spec *sp = &j[i].span[k];
            jobs[i].span[k] = (ls_digest_span){AT(c, sp->tensor, sp->off), sp->rows, sp->len,
                                               sp->stride, sp->bf16};
        }
        jobs[i].out = (ls_digest *)c->t[DG_OUT].got + i;
    }
    ls_status st = be->digest(be, jobs, n, err);
    /* an asynchronous backend fills the digests by its digest_wait */
    if (st == LS_OK && be->digest_wait) st = be->digest_wait(be, LS_DIGEST_ALL, err);
    free(jobs);
    return st;
}

/* The same digests fed in parts (backend.h, a digest in parts), as the
 * engine hashes a logits row: a part is at most DG_PART elements of one row
 * of one span, and each call carries one part of every hash not yet done. */
#define DG_PART 4096

/* Walks job j's parts: writes part `want` (a one-row span) to *out when
 * there is one; returns the number of parts. */
static long dg_part(const bo_job_spec *j, long want, bo_span_spec *out)
{
    long n = 0;
    for (int k = 0; k < 2; k++) {
        const bo_span_spec *sp = &j->span[k];
        for (long r = 0; r < sp->rows; r++)
            for (long e = 0; e < sp->len; e += DG_PART, n++)
                if (n == want)
                    *out = (bo_span_spec){sp->tensor, sp->off + r * sp->stride + e, 1,
                                          sp->len - e < DG_PART ? sp->len - e : DG_PART, 0, sp->bf16};
    }
    return n;
}

static ls_status digest_parts_exec(bo_case *c, ls_backend *be, ls_error *err)
{
    const bo_job_spec *j = c->aux2;
    long n = digest_jobs(c->shape), most = 1;
    ls_digest_job *jobs = calloc((size_t)n, sizeof *jobs);
    ls_sha256 *run = calloc((size_t)n, sizeof *run);
    long *parts = calloc((size_t)n, sizeof *parts);
    if (!jobs || !run || !parts) {
        free(jobs), free(run), free(parts);
        return ls_fail(err, LS_E_NOMEM, "digest parts");
    }
    for (long i = 0; i < n; i++) {
        parts[i] = dg_part(&j[i], -1, NULL);
        if (parts[i] < 1) parts[i] = 1; /* no bytes: one empty part */
        if (parts[i] > most) most = parts[i];
    }
    ls_status st = LS_OK;
    for (long p = 0; st == LS_OK && p < most; p++) {
        long m = 0;
        for (long i = 0; i < n; i++) {
            if (p >= parts[i]) continue;
            bo_span_spec sp = {DG_H, 0, 0, 0, 0, 0};
            dg_part(&j[i], p, &sp);
            memset(&jobs[m], 0, sizeof jobs[m]);
            jobs[m].span[0] = (ls_digest_span){AT(c, sp.tensor, sp.off), sp.rows, sp.len, sp.len, sp.bf16};
            jobs[m].run = &run[i];
            jobs[m].first = p == 0;
            jobs[m].out = p == parts[i] - 1 ? (ls_digest *)c->t[DG_OUT].got + i : NULL;
            m++;
        }
        st = be->digest(be, jobs, m, err);
    }
    if (be->digest_wait) { /* also after a failure: nothing may still write into run */
        ls_error werr;
        ls_status ws = be->digest_wait(be, LS_DIGEST_ALL, st == LS_OK ? err : &werr);
        if (st == LS_OK) st = ws;
    }
    for (long i = 0; i < n; i++) ls_sha256_discard(&run[i]);
    free(jobs), free(run), free(parts);
    return st;
}

/* ---- the table ----------------------------------------------------------- */

#define SHAPES(a) a, sizeof a[0], (int)(sizeof a / sizeof a[0])

static const bo_op bo_ops[] = {
    {"embed", SHAPES(embed_shapes), 1, 1, embed_setup, embed_ref, embed_exec},
    {"linear", SHAPES(linear_shapes), 1, 2, linear_setup, linear_ref, linear_exec},
    {"rmsnorm", SHAPES(rmsnorm_shapes), 1, 2, rmsnorm_setup, rmsnorm_ref, rmsnorm_exec},
    {"gated_rmsnorm", SHAPES(gated_shapes), 1, 2, gated_setup, gated_ref, gated_exec},
    {"conv_silu", SHAPES(conv_shapes), 1, 2, conv_setup, conv_ref, conv_exec},
    {"gdn_gates", SHAPES(gates_shapes), 1, 1, gates_setup, gates_ref, gates_exec},
    {"l2norm_scale", SHAPES(l2_shapes), 0, 2, l2_setup, l2_ref, l2_exec},
    {"gdn_recurrent", SHAPES(gdn_shapes), 1, 2, gdn_setup, gdn_ref, gdn_exec},
    {"gdn_chunked", SHAPES(gdnc_shapes), 1, 2, gdnc_setup, gdnc_ref, gdnc_exec},
    {"rope_apply", SHAPES(rope_shapes), 1, 1, rope_setup, rope_ref, rope_exec},
    {"attention", SHAPES(att_shapes), 1, 2, att_setup, att_ref, att_exec},
    {"sigmoid_gate", SHAPES(elem_shapes), 1, 1, elem_setup, sgate_ref, sgate_exec},
    {"router", SHAPES(router_shapes), 1, 2, router_setup, router_ref, router_exec},
    {"moe", SHAPES(moe_shapes), 1, 3, moe_setup, moe_ref, moe_exec},
    {"moe_ep", SHAPES(moe_shapes), 1, 3, moe_setup, moe_ref, moe_ep_exec},
    {"residual_rmsnorm", SHAPES(rnorm_shapes), 1, 2, rnorm_setup, rnorm_ref, rnorm_exec},
    {"logprobs", SHAPES(logprobs_shapes), 0, 2, logprobs_setup, logprobs_ref, logprobs_exec},
    {"lp_summary", SHAPES(lps_shapes), 0, 1, lps_setup, lps_ref, lps_exec},
    {"copy_blocks", SHAPES(copy_shapes), 0, 1, copy_setup, copy_ref, copy_exec},
    {"alloc_upload_zero_download", SHAPES(mem_shapes), 0, 1, mem_setup, mem_ref, mem_exec},
    {"conv_silu_batch", SHAPES(convb_shapes), 1, 2, convb_setup, convb_ref, convb_exec},
    {"gdn_recurrent_batch", SHAPES(gdnb_shapes), 1, 2, gdnb_setup, gdnb_ref, gdnb_exec},
    {"kv_append_batch", SHAPES(kvb_shapes), 0, 1, kvb_setup, kvb_ref, kvb_exec},
    {"attention_batch", SHAPES(kvb_shapes), 1, 2, attb_setup, attb_ref, attb_exec},
    {"digest", SHAPES(digest_shapes), 0, 1, digest_setup, digest_ref, digest_exec},
    {"digest_parts", SHAPES(digest_shapes), 0, 1, digest_setup, digest_ref, digest_parts_exec},
};

int ls_bo_op_count(void)
{
    return (int)(sizeof bo_ops / sizeof bo_ops[0]);
}

const char *ls_bo_op_name(int op)
{
    return op >= 0 && op < ls_bo_op_count() ? bo_ops[op].name : "?";
}

/* ---- the driver ---------------------------------------------------------- */

static const char *order_name(ls_order o)
{
    return o == LS_ORDER_CANONICAL ? "canonical" : "reversed";
}

/* A non-strict target's fp32 tensor: every element within tol max |ref|
 * (ls_bo_target.tol); prints the first one outside and returns 0, or 1. */
static int bo_close(const bo_case *c, const char *label, const bo_tensor *t, double tol)
{
    const float *want = t->ref, *got = t->got;
    double big = 0.0;
    for (size_t i = 0; i < t->n; i++) big = fmax(big, fabs((double)want[i]));
    double bound = tol * (c->act ? 512.0 : 1.0) * big;
    for (size_t i = 0; i < t->n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (d <= bound) continue; /* NaN fails */
        printf("MISMATCH %s: %s: %s element %zu of %zu: ref %.9g got %.9g, |d| %.3g > %.3g (%g of max |ref| "
               "%.3g)\n", label, c->what, t->name, i, t->n, (double)want[i], (double)got[i], d, bound,
               bound / (big > 0 ? big : 1), big);
        fflush(stdout);
        return 0;
    }
    return 1;
}

/* Compares tensor t read back from a backend with the reference; prints the
 * first difference and returns 0, or returns 1. */
static int bo_same(const bo_case *c, const char *label, const bo_tensor *t)
{
    size_t es = bo_esz(t->kind);
    const unsigned char *want = t->ref, *got = t->got;
    for (size_t i = 0; i < t->n; i++) {
        if (memcmp(want + i * es, got + i * es, es) == 0) continue;
        printf("MISMATCH %s: %s: %s ", label, c->what, t->name);
        if (t->kind == BO_SHA) {
            char a[65], b[65];
            ls_digest_to_hex((const ls_digest *)(want + i * es), a);
            ls_digest_to_hex((const ls_digest *)(got + i * es), b);
            printf("job %zu of %zu: ref %s got %s\n", i, t->n, a, b);
        } else {
            uint32_t a, b;
            memcpy(&a, want + i * es, 4);
            memcpy(&b, got + i * es, 4);
            if (t->kind == BO_I32)
                printf("element %zu of %zu: ref %" PRId32 " (0x%08" PRIx32 ") got %" PRId32
                       " (0x%08" PRIx32 ")\n", i, t->n, (int32_t)a, a, (int32_t)b, b);
            else
                printf("element %zu of %zu: ref 0x%08" PRIx32 " (%.9g) got 0x%08" PRIx32
                       " (%.9g)\n", i, t->n, a, (double)ls_f32_from_bits(a), b,
                       (double)ls_f32_from_bits(b));
        }
        fflush(stdout);
        return 0;
    }
    return 1;
}

/* Runs case c on one fresh backend; returns 1 when it conforms. */
static int run_target(bo_case *c, const ls_bo_target *tg, int expect_unsupported)
{
    ls_error err;
    ls_error_clear(&err);
    ls_backend *be = NULL;
    ls_status st = tg->create(tg->arg, &be, &err);
    if (st != LS_OK) {
        printf("FAIL %s: %s: cannot create the backend: %s\n", tg->label, c->what, err.msg);
        return 0;
    }
    c->fallback = NULL;
    if (c->nw) {
        ls_buf *wb = NULL;
        /* one buffer of host bytes for every matrix of the case (copied as
         * they are: the type matters only to a backend generating weights) */
        st = be->wrap_weights(be, c->wblob, c->wbytes, c->wd[0].wt, &wb, &err);
        for (int i = 0; st == LS_OK && i < c->nw; i++) {
            c->bw[i] = (ls_bweight){wb, c->wd[i].off, c->wd[i].wt, c->wd[i].rows, c->wd[i].cols, NULL};
            if (c->wd[i].scale) /* an FP8 matrix's block scales: a buffer of their own */
                st = be->wrap_weights(be, c->wd[i].scale,
                                      sizeof(float) * (size_t)(LS_FP8_BLOCKS(c->wd[i].rows) *
                                                               LS_FP8_BLOCKS(c->wd[i].cols)),
                                      LS_WTYPE_F32, &c->bw[i].scale, &err);
        }
    }
    for (int i = 0; st == LS_OK && i < c->nt; i++) {
        bo_tensor *t = &c->t[i];
        if (t->flags & BO_HOST_IN) continue;
        size_t bytes = t->n * bo_esz(t->kind);
        t->got = bo_xmalloc(bytes);
        bo_poison(t->got, bytes / 4);
        if (t->flags & BO_HOST_OUT) continue;
        size_t off = (t->flags & BO_AT0) ? 0 : (size_t)c->pad;
        st = be->alloc(be, (off + t->n) * 4, &t->buf, &err);
        t->v = (ls_view){t->buf, off};
        if (st == LS_OK && !(t->flags & BO_FRESH)) st = be->upload(be, t->v, t->init, bytes, &err);
    }
    int ok = 1;
    if (st != LS_OK) {
        printf("FAIL %s: %s: setting up the buffers: %s (%s)\n", tg->label, c->what,
               ls_status_name(st), err.msg);
        ok = 0;
    } else {
        st = c->op->exec(c, be, &err);
        if (expect_unsupported) {
            if (st != LS_E_UNSUPPORTED) {
                printf("FAIL %s: %s: must fail closed with LS_E_UNSUPPORTED, returned %s%s%s\n",
                       tg->label, c->what, ls_status_name(st), st == LS_OK ? "" : ": ",
                       st == LS_OK ? "" : err.msg);
                ok = 0;
            }
        } else if (st != LS_OK) {
            printf("FAIL %s: %s: %s (%s)\n", tg->label, c->what, ls_status_name(st), err.msg);
            ok = 0;
        } else {
            for (int i = 0; ok && i < c->nt; i++) {
                bo_tensor *t = &c->t[i];
                if (t->flags & BO_HOST_IN) continue;
                if (!(t->flags & BO_HOST_OUT)) {
                    st = be->download(be, t->got, t->v, t->n * 4, &err);
                    if (st != LS_OK) {
                        printf("FAIL %s: %s: download of %s: %s (%s)\n", tg->label, c->what,
                               t->name, ls_status_name(st), err.msg);
                        ok = 0;
                        break;
                    }
                }
                ok = tg->tol > 0 && t->kind == BO_F32 ? bo_close(c, tg->label, t, tg->tol)
                                                      : bo_same(c, tg->label, t);
            }
        }
    }
    be->destroy(be);
    for (int i = 0; i < c->nt; i++) {
        free(c->t[i].got);
        c->t[i].got = NULL;
        c->t[i].buf = NULL;
        c->t[i].v = (ls_view){NULL, 0};
    }
    return ok;
}

static void case_free(bo_case *c)
{
    for (int i = 0; i < c->nt; i++) {
        free(c->t[i].init);
        free(c->t[i].ref);
    }
    free(c->wblob);
    for (int i = 0; i < c->nw; i++) free(c->wd[i].scale);
    free(c->wd);
    free(c->bw);
    free(c->aux);
    free(c->aux2);
    free(c);
}

/* One (op, shape, act, order) on every target; returns the failures. */
static long run_case(int opi, int si, int act, int ov, const ls_bo_target *tg, int ntg)
{
    const bo_op *op = &bo_ops[opi];
    bo_case *c = calloc(1, sizeof *c);
    if (!c) abort();
    c->op = op;
    c->shape = (const char *)op->shapes + (size_t)si * op->shape_bytes;
    c->act = act;
    c->order = ov == 1 ? LS_ORDER_REVERSED : LS_ORDER_CANONICAL;
    c->order2 = ov == 2 ? LS_ORDER_REVERSED : LS_ORDER_CANONICAL;
    /* The seed depends on the case alone, not on which cases ran before it. */
    c->rng = 0x6c6f636b73746570ull ^ ((uint64_t)opi << 40) ^ ((uint64_t)si << 24) ^
             ((uint64_t)act << 8) ^ (uint64_t)ov;
    snprintf(c->what, sizeof c->what, "%s ", op->name);
    op->setup(c, c->shape);
    if (op->has_act) bo_what(c, " act %s", act ? "bf16" : "fp32");
    if (op->n_orders == 2) bo_what(c, " order %s", order_name(c->order));
    if (op->n_orders == 3)
        bo_what(c, " order experts %s combine %s", order_name(c->order), order_name(c->order2));
    c->bw = calloc((size_t)(c->nw ? c->nw : 1), sizeof *c->bw);
    if (!c->bw) abort();
    int reversed = c->order != LS_ORDER_CANONICAL || c->order2 != LS_ORDER_CANONICAL;
    int need_ref = !reversed;
    for (int i = 0; i < ntg; i++) need_ref |= tg[i].reversed;
    if (need_ref) {
        for (int i = 0; i < c->nt; i++) {
            size_t bytes = c->t[i].n * bo_esz(c->t[i].kind);
            c->t[i].ref = bo_xmalloc(bytes);
            memcpy(c->t[i].ref, c->t[i].init, bytes);
        }
        op->ref(c);
    }
    long fails = 0;
    char oks[256] = "";
    for (int i = 0; i < ntg; i++) {
        int expect_unsupported = reversed && !tg[i].reversed;
        if (!run_target(c, &tg[i], expect_unsupported)) {
            fails++;
            continue;
        }
        size_t len = strlen(oks);
        snprintf(oks + len, sizeof oks - len, "%s%s%s%s", len ? ", " : "", tg[i].label,
                 c->fallback ? c->fallback : "",
                 expect_unsupported ? ": LS_E_UNSUPPORTED" : "");
    }
    if (!fails) printf("  ok %s [%s]\n", c->what, oks);
    fflush(stdout);
    case_free(c);
    return fails;
}

long ls_bo_run_op(int op, const ls_bo_target *targets, int n_targets, const ls_bo_config *cfg)
{
    if (op < 0 || op >= ls_bo_op_count()) return 1;
    const bo_op *o = &bo_ops[op];
    long fails = 0;
    for (int si = 0; si < o->n_shapes; si++) {
        int tier = *(const int *)((const char *)o->shapes + (size_t)si * o->shape_bytes);
        if ((tier == BO_FULL && cfg->quick) || (tier == BO_QUICK && (!cfg->quick || cfg->small_only))) continue;
        /* Ops without act_bf16 get bf16-exact inputs, as in the engine's default mode. */
        for (int a = 0; a < (o->has_act ? 2 : 1); a++)
            for (int ov = 0; ov < o->n_orders; ov++)
                fails += run_case(op, si, 1 - a, ov, targets, n_targets);
    }
    return fails;
}
