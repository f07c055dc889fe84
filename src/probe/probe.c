/* lockstep — reduction fingerprints (probe.h): fixed probe inputs, one call
 * of each operator through the backend's table, SHA-256 of the outputs. */
#include "probe/probe.h"

#include <stdlib.h>
#include <string.h>

#include "backend/providers.h"
#include "core/util.h"
#include "fingerprint/sha256.h"
#include "numerics/fp8.h"
#include "numerics/reduce.h"

/* ---- context: buffers, inputs, hashing ---------------------------------------------- */

typedef struct pctx {
    ls_backend *be;
    ls_error *err;
    ls_sha256 h;                         /* the current row's digest */
    uint64_t rng;                        /* splitmix64 state, reset per row */
    void **host;                         /* host blobs wrapped as weights (borrowed by the CPU
                                            backend): freed when the probe returns */
    size_t nhost, caphost;
    ls_wtype f8;                         /* the FP8 mode's weight type */
} pctx;

static uint64_t next_u64(pctx *c)
{
    uint64_t z = (c->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* [0, 1) with 24 random bits. */
static float unit(pctx *c)
{
    return (float)(uint32_t)(next_u64(c) >> 40) / 16777216.0f;
}

/* Ill-conditioned values of magnitude about `scale`, in a cycle of seven:
 * large (16 scale), tiny (2^-12 scale), the large one two back negated and
 * grown by 2^-11 (cancels to a residue that depends on the order), a value
 * whose low 16 bits are 0x8000 (halfway between two bf16 values), a
 * subnormal, a plain value, and one within a few ulps of ±scale. In bf16
 * mode every value is then rounded to bf16 (activations are bf16-exact). */
static void ill(pctx *c, float *p, size_t n, float scale, int bf16)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = next_u64(c);
        float s = (r & 1) ? -1.0f : 1.0f, u = unit(c);
        float v;
        switch (i % 7) {
        case 0: v = s * scale * (1.0f + u) * 16.0f; break;
        case 1: v = s * scale * u * 0x1p-12f; break;
        case 2: v = i >= 2 ? -(p[i - 2] * 1.00048828125f) : s * scale; break;
        case 3: {
            float b = s * scale * (1.0f + u);
            v = ls_f32_from_bits((ls_f32_bits(b) & 0xffff0000u) | 0x8000u);
            break;
        }
        case 4: v = s * (float)(uint32_t)((r >> 44) | 1) * 0x1p-149f; break;
        case 5: v = s * scale * u; break;
        default: v = s * scale * ls_f32_from_bits(0x3f800000u + (uint32_t)((r >> 8) & 7)); break;
        }
        p[i] = bf16 ? ls_round_bf16(v) : v;
    }
}

static void *hmalloc(pctx *c, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) ls_fail_nomem(c->err, bytes, "probe");
    return p;
}

/* A host blob that must live until the probe returns (wrapped weights). */
static void *keep(pctx *c, size_t bytes)
{
    if (c->nhost == c->caphost) {
        size_t cap = c->caphost ? 2 * c->caphost : 32;
        void **p = realloc(c->host, cap * sizeof *p);
        if (!p) {
            ls_fail_nomem(c->err, cap * sizeof *p, "probe");
            return NULL;
        }
        c->host = p;
        c->caphost = cap;
    }
    void *b = hmalloc(c, bytes);
    if (b) c->host[c->nhost++] = b;
    return b;
}

/* A zero-filled tensor of n 4-byte elements. */
static ls_status tzero(pctx *c, size_t n, ls_view *v)
{
    ls_buf *b;
    LS_TRY(c->be->alloc(c->be, n * 4, &b, c->err));
    *v = (ls_view){b, 0};
    return LS_OK;
}

/* A tensor holding host[0 .. n) (4-byte elements). */
static ls_status tfrom(pctx *c, const void *host, size_t n, ls_view *v)
{
    LS_TRY(tzero(c, n, v));
    return c->be->upload(c->be, *v, host, n * 4, c->err);
}

/* A tensor of n ill-conditioned values (ill). */
static ls_status till(pctx *c, size_t n, float scale, int bf16, ls_view *v)
{
    float *p = hmalloc(c, n * 4);
    if (!p) return c->err->status;
    ill(c, p, n, scale, bf16);
    ls_status st = tfrom(c, p, n, v);
    free(p);
    return st;
}

/* Feeds n 4-byte elements of v into the row's digest. */
static ls_status thash(pctx *c, ls_view v, size_t n)
{
    void *p = hmalloc(c, n * 4);
    if (!p) return c->err->status;
    ls_status st = c->be->download(c->be, p, v, n * 4, c->err);
    if (st == LS_OK) st = ls_sha256_update(&c->h, p, n * 4, c->err);
    free(p);
    return st;
}

/* A weight matrix [rows, cols] of type wt from fp32 values v (bf16: rounded;
 * FP8: quantised per 128 x 128 block as an FP8 release is, s = amax / 448,
 * q = e4m3(v / s), an all-zero block with scale 1). */
static ls_status wfrom(pctx *c, const float *v, long rows, long cols, ls_wtype wt, ls_bweight *out)
{
    size_t n = (size_t)rows * (size_t)cols;
    unsigned char *blob = keep(c, n * (size_t)ls_wtype_bytes(wt));
    if (!blob) return c->err->status;
    memset(out, 0, sizeof *out);
    out->wtype = wt;
    out->rows = rows;
    out->cols = cols;
    if (ls_wtype_is_f8(wt)) {
        long br = LS_FP8_BLOCKS(rows), bc = LS_FP8_BLOCKS(cols);
        float *sc = keep(c, sizeof(float) * (size_t)(br * bc));
        if (!sc) return c->err->status;
        for (long bi = 0; bi < br; bi++)
            for (long bj = 0; bj < bc; bj++) {
                float amax = 0.0f;
                for (long r = bi * 128; r < rows && r < (bi + 1) * 128; r++)
                    for (long k = bj * 128; k < cols && k < (bj + 1) * 128; k++) {
                        float a = ls_f32_from_bits(ls_f32_bits(v[r * cols + k]) & 0x7fffffffu);
                        if (a > amax) amax = a;
                    }
                float s = amax > 0.0f ? amax / 448.0f : 1.0f;
                sc[bi * bc + bj] = s;
                for (long r = bi * 128; r < rows && r < (bi + 1) * 128; r++)
                    for (long k = bj * 128; k < cols && k < (bj + 1) * 128; k++)
                        blob[r * cols + k] = ls_f32_to_e4m3(v[r * cols + k] / s);
            }
        LS_TRY(c->be->wrap_weights(c->be, sc, sizeof(float) * (size_t)(br * bc), LS_WTYPE_F32,
                                   &out->scale, c->err));
    } else {
        for (size_t i = 0; i < n; i++) {
            if (wt == LS_WTYPE_BF16) {
                uint16_t h = ls_f32_to_bf16(v[i]);
                memcpy(blob + 2 * i, &h, 2);
            } else {
                memcpy(blob + 4 * i, &v[i], 4);
            }
        }
    }
    return c->be->wrap_weights(c->be, blob, n * (size_t)ls_wtype_bytes(wt), wt, &out->buf, c->err);
}

/* A weight matrix of ill-conditioned values. */
static ls_status will(pctx *c, long rows, long cols, ls_wtype wt, float scale, ls_bweight *out)
{
    size_t n = (size_t)rows * (size_t)cols;
    float *v = hmalloc(c, n * 4);
    if (!v) return c->err->status;
    ill(c, v, n, scale, 0);
    ls_status st = wfrom(c, v, rows, cols, wt, out);
    free(v);
    return st;
}

/* A one-hot matrix: row r holds `value` at column (r * mul + add) % cols,
 * zeros elsewhere, so every dot product with it is exact in any order. */
static ls_status wonehot(pctx *c, long rows, long cols, long mul, long add, float value,
                         ls_wtype wt, ls_bweight *out)
{
    size_t n = (size_t)rows * (size_t)cols;
    float *v = calloc(n ? n : 1, 4);
    if (!v) return ls_fail_nomem(c->err, n * 4, "probe");
    for (long r = 0; r < rows; r++) v[r * cols + (r * mul + add) % cols] = value;
    ls_status st = wfrom(c, v, rows, cols, wt, out);
    free(v);
    return st;
}

/* ---- probes: one per operator row ---------------------------------------------------
 * Shapes are small (the whole CPU probe runs in milliseconds) but cover the
 * reduction structure: K = 100 (three full lanes of 32 and a partial one),
 * several output rows and token counts (the CUDA linear picks 1, 4 or 8
 * tokens per block), several key blocks of 32 in attention, an exp sum over
 * more than one 8192-wide tile in logprobs, FP8 K spanning three 128-blocks. */

typedef ls_status (*probe_fn)(pctx *c, int act, ls_order ord);

static ls_status linear_shape(pctx *c, int act, ls_order ord, long out, long in, long T,
                              ls_wtype wt)
{
    ls_bweight w;
    ls_view x, y, y1;
    LS_TRY(will(c, out, in, wt, 1.0f, &w));
    LS_TRY(till(c, (size_t)(T * in), 1.0f, act, &x));
    LS_TRY(tzero(c, (size_t)(T * out), &y));
    LS_TRY(tzero(c, (size_t)out, &y1));
    LS_TRY(c->be->linear(c->be, &w, x, y, T, act, ord, c->err));
    LS_TRY(c->be->linear(c->be, &w, x, y1, 1, act, ord, c->err)); /* the one-token path */
    LS_TRY(thash(c, y, (size_t)(T * out)));
    return thash(c, y1, (size_t)out);
}

static ls_status p_linear(pctx *c, int act, ls_order ord)
{
    return linear_shape(c, act, ord, 40, 100, 11, LS_WTYPE_BF16);
}

static ls_status p_lm_head(pctx *c, int act, ls_order ord)
{
    return linear_shape(c, act, ord, 300, 72, 5, LS_WTYPE_BF16);
}

static ls_status p_linear_fp8(pctx *c, int act, ls_order ord)
{
    return linear_shape(c, act, ord, 40, 300, 5, c->f8);
}

/* w8a8 activation quantisation alone: a one-hot e4m3 weight (448 at block
 * scale 1) passes each quantised activation q · s through a dot product
 * with one nonzero term, exact in any order. */
static ls_status p_fp8_act_quant(pctx *c, int act, ls_order ord)
{
    long n = 300, T = 4;
    ls_bweight w;
    ls_view x, y;
    LS_TRY(wonehot(c, n, n, 1, 0, 448.0f, LS_WTYPE_F8_W8A8, &w));
    LS_TRY(till(c, (size_t)(T * n), 1.0f, act, &x));
    LS_TRY(tzero(c, (size_t)(T * n), &y));
    LS_TRY(c->be->linear(c->be, &w, x, y, T, act, ord, c->err));
    return thash(c, y, (size_t)(T * n));
}

static ls_status p_rmsnorm(pctx *c, int act, ls_order ord)
{
    long R = 5, n = 100;
    ls_view x, w, y;
    LS_TRY(till(c, (size_t)(R * n), 1.0f, act, &x));
    LS_TRY(till(c, (size_t)n, 0.1f, 1, &w));
    LS_TRY(tzero(c, (size_t)(R * n), &y));
    LS_TRY(c->be->rmsnorm(c->be, x, w, y, R, n, act, ord, c->err));
    return thash(c, y, (size_t)(R * n));
}

static ls_status p_gated_rmsnorm(pctx *c, int act, ls_order ord)
{
    long R = 5, n = 72;
    ls_view x, z, w, y;
    LS_TRY(till(c, (size_t)(R * n), 1.0f, act, &x));
    LS_TRY(till(c, (size_t)(R * n), 0.5f, act, &z));
    LS_TRY(till(c, (size_t)n, 1.0f, 1, &w));
    LS_TRY(tzero(c, (size_t)(R * n), &y));
    LS_TRY(c->be->gated_rmsnorm(c->be, x, z, w, y, R, n, act, ord, c->err));
    return thash(c, y, (size_t)(R * n));
}

static ls_status p_conv_silu(pctx *c, int act, ls_order ord)
{
    long T = 6, C = 40, K = 4;
    ls_bweight w;
    ls_view x, st, y;
    LS_TRY(will(c, C, K, LS_WTYPE_BF16, 0.5f, &w));
    LS_TRY(till(c, (size_t)(T * C), 0.5f, act, &x));
    LS_TRY(till(c, (size_t)(C * K), 0.5f, act, &st));
    LS_TRY(tzero(c, (size_t)(T * C), &y));
    LS_TRY(c->be->conv_silu(c->be, x, C, &w, st, y, C, T, C, K, act, ord, c->err));
    LS_TRY(thash(c, y, (size_t)(T * C)));
    return thash(c, st, (size_t)(C * K));
}

static ls_status p_gdn_gates(pctx *c, int act, ls_order ord)
{
    (void)ord; /* elementwise: no reduction to reorder */
    long T = 4, H = 8;
    float alog[8], dtb[8];
    for (int h = 0; h < 8; h++) {
        alog[h] = ls_round_bf16(0.25f * (float)h + unit(c)); /* A = exp(A_log) in [1, ~8] */
        dtb[h] = ls_round_bf16(-4.0f + 0.5f * (float)h * unit(c));
    }
    ls_view b, a, al, dt, beta, alpha;
    LS_TRY(till(c, (size_t)(T * H), 0.5f, act, &b));
    LS_TRY(till(c, (size_t)(T * H), 0.5f, act, &a));
    LS_TRY(tfrom(c, alog, (size_t)H, &al));
    LS_TRY(tfrom(c, dtb, (size_t)H, &dt));
    LS_TRY(tzero(c, (size_t)(T * H), &beta));
    LS_TRY(tzero(c, (size_t)(T * H), &alpha));
    LS_TRY(c->be->gdn_gates(c->be, b, a, al, dt, beta, alpha, T, H, act, c->err));
    LS_TRY(thash(c, beta, (size_t)(T * H)));
    return thash(c, alpha, (size_t)(T * H));
}

static ls_status p_l2norm(pctx *c, int act, ls_order ord)
{
    (void)act;
    long R = 5, d = 100;
    ls_view x;
    LS_TRY(till(c, (size_t)(R * d), 1.0f, 0, &x));
    LS_TRY(c->be->l2norm_scale(c->be, x, R, d, ls_cpu_inv_sqrt_scale(d), ord, c->err));
    return thash(c, x, (size_t)(R * d));
}

/* The GDN step's inputs for T rows of one key head and Hv = 2 value heads
 * (T <= 70), drawn in this order: q, k (small, not normalised), v, the
 * decays α in (0.5, 1) and β in (0.1, 0.9), both bf16-exact. */
static ls_status gdn_inputs(pctx *c, long T, long dk, long dv, int act, ls_view *q, ls_view *k, ls_view *v,
                            ls_view *alpha, ls_view *beta)
{
    const long Hk = 1, Hv = 2;
    float g[2 * 70];
    LS_TRY(till(c, (size_t)(T * Hk * dk), 0.05f, 0, q));
    LS_TRY(till(c, (size_t)(T * Hk * dk), 0.05f, 0, k));
    LS_TRY(till(c, (size_t)(T * Hv * dv), 0.5f, act, v));
    for (long i = 0; i < T * Hv; i++) g[i] = ls_round_bf16(0.5f + 0.45f * unit(c)); /* decay in (0.5, 1) */
    LS_TRY(tfrom(c, g, (size_t)(T * Hv), alpha));
    for (long i = 0; i < T * Hv; i++) g[i] = ls_round_bf16(0.1f + 0.8f * unit(c));
    return tfrom(c, g, (size_t)(T * Hv), beta);
}

static ls_status p_gdn_recurrent(pctx *c, int act, ls_order ord)
{
    long T = 3, Hk = 1, Hv = 2, dk = 40, dv = 20;
    ls_view q, k, v, alpha, beta, st, o;
    LS_TRY(gdn_inputs(c, T, dk, dv, act, &q, &k, &v, &alpha, &beta));
    LS_TRY(till(c, (size_t)(Hv * dk * dv), 0.1f, 0, &st));
    LS_TRY(tzero(c, (size_t)(T * Hv * dv), &o));
    LS_TRY(c->be->gdn_recurrent(c->be, q, k, v, alpha, beta, st, o, T, Hk, Hv, dk, dv, act, ord,
                                c->err));
    LS_TRY(thash(c, o, (size_t)(T * Hv * dv)));
    return thash(c, st, (size_t)(Hv * dk * dv));
}

/* The chunk-aligned form (docs/numerics.md §5.1) over 70 rows, one chunk
 * boundary crossed: the outputs, the carried state (S at the second chunk's
 * start and its 6 rows) and the state materialised after the last row. */
static ls_status p_gdn_chunked(pctx *c, int act, ls_order ord)
{
    long T = 70, Hk = 1, Hv = 2, dk = 40, dv = 20;
    size_t SF = LS_GDN_CHUNK_STATE_FLOATS(Hv, dk, dv);
    if (!c->be->gdn_chunked || !c->be->gdn_chunked_state)
        return ls_fail(c->err, LS_E_UNSUPPORTED, "backend %s has no chunk-aligned GDN op", c->be->name);
    ls_view q, k, v, alpha, beta, st, o, mat;
    LS_TRY(gdn_inputs(c, T, dk, dv, act, &q, &k, &v, &alpha, &beta));
    LS_TRY(tzero(c, SF, &st));
    LS_TRY(tzero(c, (size_t)(T * Hv * dv), &o));
    LS_TRY(tzero(c, (size_t)(Hv * dk * dv), &mat));
    LS_TRY(c->be->gdn_chunked(c->be, q, k, v, alpha, beta, st, o, T, 0, Hk, Hv, dk, dv, act, ord, c->err));
    LS_TRY(c->be->gdn_chunked_state(c->be, st, T - 1, mat, Hv, dk, dv, c->err));
    LS_TRY(thash(c, o, (size_t)(T * Hv * dv)));
    LS_TRY(thash(c, st, SF));
    return thash(c, mat, (size_t)(Hv * dk * dv));
}

static ls_status p_rope(pctx *c, int act, ls_order ord)
{
    (void)ord; /* elementwise */
    long T = 3, H = 2, d = 16, R = 8;
    int32_t pos[3] = {0, 7, 100000};
    float cs[3 * 4], sn[3 * 4];
    ls_cpu_rope_table(pos, T, R, 1e7, cs, sn, act);
    ls_view x, cv, sv;
    LS_TRY(till(c, (size_t)(T * H * d), 1.0f, act, &x));
    LS_TRY(tfrom(c, cs, (size_t)(T * R / 2), &cv));
    LS_TRY(tfrom(c, sn, (size_t)(T * R / 2), &sv));
    LS_TRY(c->be->rope_apply(c->be, x, cv, sv, T, H, d, R, act, c->err));
    return thash(c, x, (size_t)(T * H * d));
}

/* Three queries over 6, 101 and 300 keys: one partial block of 32, several,
 * and more than one CUDA key tile (8 blocks of 32). */
static ls_status p_attention(pctx *c, int act, ls_order ord)
{
    long T = 3, Hq = 2, Hkv = 1, d = 40, cap = 300;
    int32_t pos[3] = {5, 100, 299};
    ls_view q, kc, vc, pv, o;
    LS_TRY(till(c, (size_t)(T * Hq * d), 0.25f, act, &q));
    LS_TRY(till(c, (size_t)(Hkv * cap * d), 0.25f, act, &kc));
    LS_TRY(till(c, (size_t)(Hkv * cap * d), 1.0f, act, &vc));
    LS_TRY(tfrom(c, pos, (size_t)T, &pv));
    LS_TRY(tzero(c, (size_t)(T * Hq * d), &o));
    ls_view contiguous = {NULL, 0}; /* no page table: [Hkv, cap, d] */
    LS_TRY(c->be->attention(c->be, q, kc, vc, contiguous, cap, cap, pv, o, T, Hq, Hkv, d, act, ord,
                            c->err));
    return thash(c, o, (size_t)(T * Hq * d));
}

/* The router: E = 12 experts over D = 100; rows 5 and 6 are equal (an exact
 * tie, broken to the lower id) and row 7 is row 6 with one element a bf16
 * ulp away (a near tie). */
static ls_status p_router(pctx *c, int act, ls_order ord)
{
    long E = 12, D = 100, T = 4, k = 3;
    float *wv = hmalloc(c, (size_t)(E * D) * 4);
    if (!wv) return c->err->status;
    ill(c, wv, (size_t)(E * D), 0.1f, 1);
    memcpy(wv + 6 * D, wv + 5 * D, (size_t)D * 4);
    memcpy(wv + 7 * D, wv + 6 * D, (size_t)D * 4);
    wv[7 * D + 5] = ls_f32_from_bits(ls_f32_bits(wv[7 * D + 5]) + 0x10000u);
    ls_bweight w;
    ls_status st = wfrom(c, wv, E, D, LS_WTYPE_BF16, &w);
    free(wv);
    LS_TRY(st);
    ls_view x, probs, ids, wts;
    LS_TRY(till(c, (size_t)(T * D), 0.5f, act, &x));
    LS_TRY(tzero(c, (size_t)(T * E), &probs));
    LS_TRY(tzero(c, (size_t)(T * k), &ids));
    LS_TRY(tzero(c, (size_t)(T * k), &wts));
    LS_TRY(c->be->router(c->be, &w, x, T, k, 1, probs, ids, wts, act, ord, c->err));
    LS_TRY(thash(c, probs, (size_t)(T * E)));
    LS_TRY(thash(c, ids, (size_t)(T * k)));
    return thash(c, wts, (size_t)(T * k));
}

/* ---- MoE ------------------------------------------------------------------------------ */

typedef struct moe_w {
    ls_bweight g[4], u[4], d[4], sg, su, sd, sgw;
    ls_bmoe m;
} moe_w;

/* A MoE weight set that lives until the probe returns: the CUDA backend
 * keys its device tables by the address of the gate array (stable for a
 * model's lifetime), so no two probe calls may share one. */
static moe_w *moe_new(pctx *c)
{
    moe_w *w = keep(c, sizeof *w);
    if (w) memset(w, 0, sizeof *w);
    return w;
}

/* Routed experts of ill-conditioned values ([I, D], [I, D], [D, I]), and a
 * shared expert of width Is when Is > 0. */
static ls_status moe_ill(pctx *c, long E, long D, long I, long Is, ls_wtype wt, moe_w *w)
{
    for (long e = 0; e < E; e++) {
        LS_TRY(will(c, I, D, wt, 0.1f, &w->g[e]));
        LS_TRY(will(c, I, D, wt, 0.1f, &w->u[e]));
        LS_TRY(will(c, D, I, wt, 0.1f, &w->d[e]));
    }
    if (Is > 0) {
        LS_TRY(will(c, Is, D, wt, 0.1f, &w->sg));
        LS_TRY(will(c, Is, D, wt, 0.1f, &w->su));
        LS_TRY(will(c, D, Is, wt, 0.1f, &w->sd));
        LS_TRY(will(c, 1, D, LS_WTYPE_BF16, 0.1f, &w->sgw));
    }
    w->m = (ls_bmoe){E, D, I, Is, w->g, w->u, w->d, Is > 0 ? &w->sg : NULL,
                     Is > 0 ? &w->su : NULL, Is > 0 ? &w->sd : NULL, Is > 0 ? &w->sgw : NULL};
    return LS_OK;
}

/* One moe call over T tokens of k slots each: ids[t*k + i], weights wt[...]. */
static ls_status moe_call(pctx *c, const moe_w *w, long T, long k, const int32_t *ids,
                          const float *wts, int act, ls_order oe, ls_order oc)
{
    long D = w->m.D;
    ls_view x, iv, wv, out;
    LS_TRY(till(c, (size_t)(T * D), 1.0f, act, &x));
    LS_TRY(tfrom(c, ids, (size_t)(T * k), &iv));
    LS_TRY(tfrom(c, wts, (size_t)(T * k), &wv));
    LS_TRY(tzero(c, (size_t)(T * D), &out));
    LS_TRY(c->be->moe(c->be, &w->m, x, iv, wv, k, out, T, act, oe, oc, c->err));
    return thash(c, out, (size_t)(T * D));
}

/* Routed experts alone: each token to one expert at weight 1 (the combine
 * adds one exact term), no shared expert; six tokens over four experts (the
 * grouped CUDA path, T*k > E), then two (per pair). */
static ls_status experts_of(pctx *c, int act, ls_order ord, long D, long I, ls_wtype wt)
{
    moe_w *w = moe_new(c);
    if (!w) return c->err->status;
    LS_TRY(moe_ill(c, 4, D, I, 0, wt, w));
    int32_t ids[6] = {0, 1, 2, 3, 1, 0}, ids2[2] = {3, 1};
    float one[6] = {1, 1, 1, 1, 1, 1};
    LS_TRY(moe_call(c, w, 6, 1, ids, one, act, ord, LS_ORDER_CANONICAL));
    return moe_call(c, w, 2, 1, ids2, one, act, ord, LS_ORDER_CANONICAL);
}

static ls_status p_experts(pctx *c, int act, ls_order ord)
{
    return experts_of(c, act, ord, 72, 40, LS_WTYPE_BF16);
}

static ls_status p_experts_fp8(pctx *c, int act, ls_order ord)
{
    return experts_of(c, act, ord, 200, 136, c->f8); /* K spans two 128-blocks both ways */
}

/* The shared expert alone: the routed slot's weight is 0, so the output is
 * the gated shared expert (plus an exact zero). */
static ls_status p_shared_expert(pctx *c, int act, ls_order ord)
{
    moe_w *w = moe_new(c);
    if (!w) return c->err->status;
    LS_TRY(moe_ill(c, 2, 72, 40, 48, LS_WTYPE_BF16, w));
    int32_t ids[6] = {0, 1, 0, 1, 1, 0};
    float zero[6] = {0, 0, 0, 0, 0, 0};
    return moe_call(c, w, 6, 1, ids, zero, act, ord, LS_ORDER_CANONICAL);
}

/* The combine alone: one-hot expert matrices make every expert output exact
 * in any order (a silu product scaled by a power of two, 2^(4e-6) for
 * expert e, 8 for the shared expert), so the sum of four routed slots of
 * alternating magnitudes and the shared slot is the only reduction. */
static ls_status p_combine(pctx *c, int act, ls_order ord)
{
    long E = 4, D = 72, I = 40, k = 4, T = 3;
    moe_w *w = moe_new(c);
    if (!w) return c->err->status;
    for (long e = 0; e < E; e++) {
        LS_TRY(wonehot(c, I, D, 7, 3 * e, 1.0f, LS_WTYPE_BF16, &w->g[e]));
        LS_TRY(wonehot(c, I, D, 5, e + 1, 1.0f, LS_WTYPE_BF16, &w->u[e]));
        LS_TRY(wonehot(c, D, I, 1, e, (float)(1 << (4 * e)) * 0x1p-6f, LS_WTYPE_BF16, &w->d[e]));
    }
    LS_TRY(wonehot(c, I, D, 3, 2, 1.0f, LS_WTYPE_BF16, &w->sg));
    LS_TRY(wonehot(c, I, D, 11, 1, 1.0f, LS_WTYPE_BF16, &w->su));
    LS_TRY(wonehot(c, D, I, 1, 5, 8.0f, LS_WTYPE_BF16, &w->sd));
    LS_TRY(wonehot(c, 1, D, 1, 3, 1.0f, LS_WTYPE_BF16, &w->sgw));
    w->m = (ls_bmoe){E, D, I, I, w->g, w->u, w->d, &w->sg, &w->su, &w->sd, &w->sgw};
    int32_t ids[12] = {0, 1, 2, 3, 3, 2, 1, 0, 2, 0, 3, 1};
    float wts[12] = {0.875f, 0.0009765625f, 0.5f, 0.0000305f, 0.6f,  0.3f,
                     0.07f,  0.03f,         0.25f, 0.25f,     0.25f, 0.25f};
    for (int i = 0; i < 12; i++) wts[i] = ls_act(wts[i], act);
    return moe_call(c, w, T, k, ids, wts, act, LS_ORDER_CANONICAL, ord);
}

/* ---- logprobs and digests ------------------------------------------------------------- */

static ls_status p_logprobs(pctx *c, int act, ls_order ord)
{
    (void)act;
    long R = 2, V = 8500;
    ls_view l, lp;
    LS_TRY(till(c, (size_t)(R * V), 0.5f, 0, &l));
    LS_TRY(tzero(c, (size_t)(R * V), &lp));
    LS_TRY(c->be->logprobs(c->be, l, lp, R, V, ord, c->err));
    return thash(c, lp, (size_t)(R * V));
}

/* The records' selection: rows of many exact ties (values of a few bits), one
 * with a NaN, next tokens inside, the last and unknown. */
static ls_status p_lp_summary(pctx *c, int act, ls_order ord)
{
    (void)act;
    (void)ord;
    long R = 3, V = 4100, k = LS_LP_SUMMARY_KMAX, W = LS_LP_SUMMARY_WORDS(k);
    float *h = hmalloc(c, (size_t)(R * V) * 4);
    if (!h) return c->err->status;
    for (long i = 0; i < R * V; i++) h[i] = -(float)(next_u64(c) >> 61) * 0.25f;
    h[2 * V + 9] = ls_f32_from_bits(0x7fc00000u);
    int32_t next[3] = {17, (int32_t)(V - 1), -1};
    ls_view lp, nx, out;
    ls_status st = tfrom(c, h, (size_t)(R * V), &lp);
    free(h);
    LS_TRY(st);
    LS_TRY(tfrom(c, next, 3, &nx));
    LS_TRY(tzero(c, (size_t)(R * W), &out));
    LS_TRY(c->be->lp_summary(c->be, lp, nx, R, V, k, out, c->err));
    return thash(c, out, (size_t)(R * W));
}

/* Digests over strided rows, bf16 spans (of bf16-exact values, as the
 * engine's are), an odd length and a long row; the 32-byte results are
 * hashed in job order. */
static ls_status p_digest(pctx *c, int act, ls_order ord)
{
    (void)act;
    (void)ord;
    ls_view x, xb;
    LS_TRY(till(c, 5000, 1.0f, 0, &x));
    LS_TRY(till(c, 400, 1.0f, 1, &xb));
    ls_digest d[3];
    ls_digest_job jobs[3] = {
        {{{x, 3, 37, 40, 0}, {ls_view_at(xb, 200), 1, 5, 5, 1}}, &d[0], NULL, 0},
        {{{ls_view_at(x, 300), 1, 4000, 4000, 0}, {{NULL, 0}, 0, 0, 0, 0}}, &d[1], NULL, 0},
        {{{ls_view_at(xb, 7), 2, 64, 100, 1}, {ls_view_at(x, 4400), 1, 3, 3, 0}}, &d[2], NULL, 0},
    };
    LS_TRY(c->be->digest(c->be, jobs, 3, c->err));
    /* an asynchronous backend fills d by its digest_wait */
    if (c->be->digest_wait) LS_TRY(c->be->digest_wait(c->be, LS_DIGEST_ALL, c->err));
    return ls_sha256_update(&c->h, d, sizeof d, c->err);
}

/* ---- the table ------------------------------------------------------------------------ */

typedef struct probe_def {
    const char *op;                      /* provider row */
    probe_fn fn;
    int has_act;                         /* run in fp32 and in bf16 activation mode */
} probe_def;

static const probe_def probes[] = {
    {"linear", p_linear, 1},
    {"rmsnorm", p_rmsnorm, 1},
    {"gated_rmsnorm", p_gated_rmsnorm, 1},
    {"conv_silu", p_conv_silu, 1},
    {"gdn_gates", p_gdn_gates, 1},
    {"l2norm", p_l2norm, 0},
    {"gdn_recurrent", p_gdn_recurrent, 1},
    {"gdn_chunked", p_gdn_chunked, 1},
    {"rope", p_rope, 1},
    {"attention", p_attention, 1},
    {"router_softmax", p_router, 1},
    {"topk", p_router, 1},
    {"renormalise", p_router, 1},
    {"experts", p_experts, 1},
    {"combine", p_combine, 1},
    {"shared_expert", p_shared_expert, 1},
    {"lm_head", p_lm_head, 1},
    {"logprobs", p_logprobs, 0},
    {"lp_summary", p_lp_summary, 0},
    {"digest", p_digest, 0},
    {"linear_fp8", p_linear_fp8, 1},
    {"experts_fp8", p_experts_fp8, 1},
    {"fp8_act_quant", p_fp8_act_quant, 1},
};

/* Which rows each engine perturbation reverses (engine_forward.c's ord():
 * gdn -> the recurrent step and both l2norms, norm -> the layer and final
 * RMSNorms, experts -> routed and shared experts, whatever their weights). */
static const struct {
    const char *perturb, *op;
} perturbed_rows[] = {
    {"gdn", "gdn_recurrent"},   {"gdn", "l2norm"},    {"gdn", "gdn_chunked"},
    {"conv", "conv_silu"},      {"attention", "attention"},
    {"router", "router_softmax"}, {"router", "topk"},
    {"router", "renormalise"},  {"experts", "experts"},
    {"experts", "shared_expert"}, {"experts", "experts_fp8"},
    {"combine", "combine"},     {"norm", "rmsnorm"},
    {"lm_head", "lm_head"},
};

static const char *const perturb_names[] = {"gdn", "conv", "attention", "router", "experts",
                                            "combine", "norm", "lm_head", NULL};

int ls_probe_perturbs(const char *perturb_op, const char *op)
{
    if (!perturb_op || !op) return 0;
    for (size_t i = 0; i < sizeof perturbed_rows / sizeof perturbed_rows[0]; i++)
        if (!strcmp(perturbed_rows[i].perturb, perturb_op) && !strcmp(perturbed_rows[i].op, op))
            return 1;
    return 0;
}

const ls_op_fingerprint *ls_probe_find(const ls_probe_table *t, const char *op)
{
    for (size_t i = 0; i < t->count; i++)
        if (!strcmp(t->rows[i].op, op)) return &t->rows[i];
    return NULL;
}

static const probe_def *find_probe(const char *op)
{
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++)
        if (!strcmp(probes[i].op, op)) return &probes[i];
    return NULL;
}

/* Runs one row's probe: a fresh input stream seeded by the probe's name (so
 * a row's inputs do not depend on which rows ran before it). */
static ls_status probe_row(pctx *c, const probe_def *p, ls_order ord, ls_digest *out)
{
    ls_digest seed;
    LS_TRY(ls_sha256_buf(p->op, strlen(p->op), &seed, c->err));
    LS_TRY(ls_sha256_init(&c->h, c->err));
    ls_status st = LS_OK;
    for (int act = 0; st == LS_OK && act <= p->has_act; act++) {
        memcpy(&c->rng, seed.bytes, sizeof c->rng);
        st = p->fn(c, act, ord);
    }
    if (st == LS_OK) return ls_sha256_final(&c->h, out, c->err);
    ls_sha256_discard(&c->h);
    return st;
}

ls_status ls_probe_run(ls_backend *be, const ls_probe_opts *o, ls_probe_table *out,
                       ls_error *err)
{
    memset(out, 0, sizeof *out);
    uint64_t t0 = ls_now_ns();
    size_t n = 0, nf = 0;
    const ls_provider *rows = ls_backend_list_providers(o->backend, &n);
    if (!rows) return ls_fail(err, LS_E_USAGE, "probe: unknown backend '%s'", o->backend);
    const ls_provider *frows = NULL;
    if (o->fp8) {
        frows = ls_backend_list_fp8_providers(o->backend, o->fp8, &nf);
        if (!frows)
            return ls_fail(err, LS_E_USAGE, "probe: FP8 mode '%s': expected dequant or w8a8", o->fp8);
    }
    if (o->perturb_op) {
        int known = 0;
        for (size_t i = 0; perturb_names[i]; i++) known |= !strcmp(perturb_names[i], o->perturb_op);
        if (!known) return ls_fail(err, LS_E_USAGE, "probe: unknown perturbation op '%s'", o->perturb_op);
    }
    pctx c;
    memset(&c, 0, sizeof c);
    c.be = be;
    c.err = err;
    c.f8 = o->fp8 && !strcmp(o->fp8, "w8a8") ? LS_WTYPE_F8_W8A8 : LS_WTYPE_F8_DEQUANT;
    ls_status st = LS_OK;
    /* rows computed by one probe (the router's three) share its digest */
    const probe_def *last = NULL;
    ls_digest last_d;
    /* the chunk-aligned GDN row when asked for: after the registry's rows */
    static const ls_provider gdn_chunked_row = {"gdn_chunked", NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t ng = o->gdn_chunked ? 1 : 0;
    for (size_t i = 0; st == LS_OK && i < n + nf + ng; i++) {
        const ls_provider *r = i < n ? &rows[i] : i < n + nf ? &frows[i - n] : &gdn_chunked_row;
        const probe_def *p = find_probe(r->op);
        if (!p) continue; /* no backend op of its own (sampling) */
        if (out->count == LS_PROBE_MAX_ROWS) {
            st = ls_fail(err, LS_E_INTERNAL, "probe: more than %d rows", LS_PROBE_MAX_ROWS);
            break;
        }
        ls_digest d;
        ls_order ord = ls_probe_perturbs(o->perturb_op, r->op) ? LS_ORDER_REVERSED
                                                                : LS_ORDER_CANONICAL;
        if (last && last->fn == p->fn) {
            d = last_d;
        } else {
            st = probe_row(&c, p, ord, &d);
            if (st != LS_OK) {
                ls_error inner = *err;
                st = ls_fail(err, st, "probe of operator %s on backend %s: %s", r->op, be->name,
                             inner.msg);
                break;
            }
        }
        last = p;
        last_d = d;
        out->rows[out->count].op = r->op;
        ls_digest_to_hex(&d, out->rows[out->count].sha256);
        out->count++;
    }
    for (size_t i = 0; i < c.nhost; i++) free(c.host[i]);
    free(c.host);
    if (st != LS_OK) memset(out, 0, sizeof *out);
    else out->seconds = (double)(ls_now_ns() - t0) / 1e9;
    return st;
}
