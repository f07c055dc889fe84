/* lockstep — pinned cuBLASLt GEMM algorithms: enumeration, qualification for
 * batch invariance, the pinned record and its rebuild. See gemm_pin.h. */
#include "gemm_pin.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemm_rows.h"

/* ---- checks --------------------------------------------------------------------
 * The cuBLASLt and CUDA runtime counterparts of kernels/cuda_check.cuh's
 * LS_CUDA_CHECK for C: file, line, the call, the library's status name and a
 * hint. The _GO forms record the failure in `st` and jump to `done`, where
 * the function frees what it holds. */
#define LT_FAIL(s, call, hint)                                                                  \
    ls_fail(err, LS_E_DEVICE, "%s:%d: %s failed: %s (hint: %s)", __FILE__, __LINE__, call,      \
            cublasLtGetStatusName(s), (hint))
#define RT_FAIL(e, call, hint)                                                                  \
    ls_fail(err, LS_E_DEVICE, "%s:%d: %s failed: %s (%s) (hint: %s)", __FILE__, __LINE__, call, \
            cudaGetErrorName(e), cudaGetErrorString(e), (hint))
#define LT_CHECK(call, hint)                                      \
    do {                                                          \
        cublasStatus_t lt_s_ = (call);                            \
        if (lt_s_ != CUBLAS_STATUS_SUCCESS) return LT_FAIL(lt_s_, #call, hint); \
    } while (0)
#define LT_GO(call, hint)                                         \
    do {                                                          \
        cublasStatus_t lt_s_ = (call);                            \
        if (lt_s_ != CUBLAS_STATUS_SUCCESS) {                     \
            st = LT_FAIL(lt_s_, #call, hint);                     \
            goto done;                                            \
        }                                                         \
    } while (0)
#define RT_GO(call, hint)                                         \
    do {                                                          \
        cudaError_t rt_e_ = (call);                               \
        if (rt_e_ != cudaSuccess) {                               \
            st = RT_FAIL(rt_e_, #call, hint);                     \
            goto done;                                            \
        }                                                         \
    } while (0)
#define LS_GO(expr)                                               \
    do {                                                          \
        st = (expr);                                              \
        if (st != LS_OK) goto done;                               \
    } while (0)

/* The one type combination of the strict linear (gemm_pin.h). */
/* Configurations put to cublasLtMatmulAlgoCheck per algorithm id at most. */
#define LS_GEMM_CHECKS_PER_ALGO 65536L

#define LT_TYPES CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F

const int64_t ls_gemm_timed_m[LS_GEMM_TIMED_MS] = {1, 32, 256};

/* ---- configurations --------------------------------------------------------------- */
void ls_gemm_config_str(const ls_gemm_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "id %" PRId32 " tile %" PRIu32 " stages %" PRIu32 " splitk %" PRId32 " red %" PRIu32
             " swz %" PRIu32 " cust %" PRIu32 " inner %" PRIu32 " cluster %" PRIu32,
             c->algo_id, c->tile, c->stages, c->splitk, c->reduction, c->swizzle, c->custom,
             c->inner_shape, c->cluster_shape);
}

int ls_gemm_config_equal(const ls_gemm_config *a, const ls_gemm_config *b)
{
    return a->algo_id == b->algo_id && a->tile == b->tile && a->stages == b->stages &&
           a->splitk == b->splitk && a->reduction == b->reduction && a->swizzle == b->swizzle &&
           a->custom == b->custom && a->inner_shape == b->inner_shape &&
           a->cluster_shape == b->cluster_shape;
}

/* Builds the algorithm descriptor of c. A configuration cuBLASLt does not know
 * is LS_E_UNSUPPORTED (setting an attribute only fails on a size mismatch;
 * whether the values can run is cublasLtMatmulAlgoCheck's answer). */
static ls_status algo_build(cublasLtHandle_t h, const ls_gemm_config *c, cublasLtMatmulAlgo_t *algo,
                            ls_error *err)
{
    memset(algo, 0, sizeof *algo);
    cublasStatus_t s = cublasLtMatmulAlgoInit(h, LT_TYPES, c->algo_id, algo);
    if (s != CUBLAS_STATUS_SUCCESS)
        return ls_fail(err, LS_E_UNSUPPORTED,
                       "cuBLASLt algorithm id %" PRId32 " cannot be initialised for bf16 x bf16 -> "
                       "fp32 on this cuBLASLt/GPU: cublasLtMatmulAlgoInit: %s", c->algo_id,
                       cublasLtGetStatusName(s));
    uint16_t inner = (uint16_t)c->inner_shape, cluster = (uint16_t)c->cluster_shape;
    LT_CHECK(cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &c->tile,
                                                  sizeof c->tile), "tile id");
    LT_CHECK(cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c->stages,
                                                  sizeof c->stages), "stages id");
    LT_CHECK(cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c->splitk,
                                                  sizeof c->splitk), "split-K");
    LT_CHECK(cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                  &c->reduction, sizeof c->reduction),
             "reduction scheme");
    LT_CHECK(cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
                                                  &c->swizzle, sizeof c->swizzle), "CTA swizzle");
    LT_CHECK(cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
                                                  &c->custom, sizeof c->custom), "custom option");
    LT_CHECK(cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner,
                                                  sizeof inner), "inner shape");
    LT_CHECK(cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                  &cluster, sizeof cluster), "cluster shape");
    return LS_OK;
}

/* Reads the configuration of an algorithm the heuristic returned. */
static ls_status config_read(const cublasLtMatmulAlgo_t *a, ls_gemm_config *c, ls_error *err)
{
    size_t w = 0;
    uint16_t inner = 0, cluster = 0;
    memset(c, 0, sizeof *c);
    LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &c->algo_id,
                                                  sizeof c->algo_id, &w), "algo id");
    LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c->tile,
                                                  sizeof c->tile, &w), "tile id");
    LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c->stages,
                                                  sizeof c->stages, &w), "stages id");
    LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c->splitk,
                                                  sizeof c->splitk, &w), "split-K");
    LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                  &c->reduction, sizeof c->reduction, &w),
             "reduction scheme");
    LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
                                                  &c->swizzle, sizeof c->swizzle, &w), "swizzle");
    LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c->custom,
                                                  sizeof c->custom, &w), "custom option");
    LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner,
                                                  sizeof inner, &w), "inner shape");
    LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                                  sizeof cluster, &w), "cluster shape");
    c->inner_shape = inner;
    c->cluster_shape = cluster;
    return LS_OK;
}

/* What an algorithm id can be configured with. */
typedef struct algo_caps {
    uint32_t *tiles; int n_tiles;   /* owned; none listed: only TILE_UNDEFINED (0) */
    uint32_t *stages; int n_stages; /* owned; none listed: only STAGES_UNDEFINED (0) */
    uint32_t swizzle_max;           /* CTA_SWIZZLING_SUPPORT: 0 or 1 */
    int32_t custom_max;             /* CUSTOM_OPTION_MAX */
    uint64_t numerical_flags;       /* NUMERICAL_IMPL_FLAGS */
} algo_caps;

static void caps_free(algo_caps *c)
{
    free(c->tiles);
    free(c->stages);
    memset(c, 0, sizeof *c);
}

/* An array capability (tile or stages ids): asks its size, then its values.
 * An empty list stands for the one value 0 (UNDEFINED), as cuBLASLt says. */
static ls_status caps_list(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoCapAttributes_t attr,
                           uint32_t **out, int *n_out, ls_error *err)
{
    size_t bytes = 0;
    *out = NULL;
    *n_out = 0;
    LT_CHECK(cublasLtMatmulAlgoCapGetAttribute(a, attr, NULL, 0, &bytes), "capability size");
    size_t n = bytes / sizeof(uint32_t);
    uint32_t *v = calloc(n ? n : 1, sizeof *v);
    if (!v) return ls_fail_nomem(err, (n ? n : 1) * sizeof *v, "cuBLASLt capability list");
    if (n) {
        size_t w = 0;
        cublasStatus_t s = cublasLtMatmulAlgoCapGetAttribute(a, attr, v, n * sizeof *v, &w);
        if (s != CUBLAS_STATUS_SUCCESS) {
            free(v);
            return LT_FAIL(s, "cublasLtMatmulAlgoCapGetAttribute", "capability list");
        }
        n = w / sizeof *v;
    }
    if (n == 0) {
        v[0] = 0;
        n = 1;
    }
    *out = v;
    *n_out = (int)n;
    return LS_OK;
}

static ls_status caps_read(const cublasLtMatmulAlgo_t *a, algo_caps *c, ls_error *err)
{
    size_t w = 0;
    memset(c, 0, sizeof *c);
    ls_status st = caps_list(a, CUBLASLT_ALGO_CAP_TILE_IDS, &c->tiles, &c->n_tiles, err);
    if (st == LS_OK) st = caps_list(a, CUBLASLT_ALGO_CAP_STAGES_IDS, &c->stages, &c->n_stages, err);
    if (st != LS_OK) {
        caps_free(c);
        return st;
    }
    cublasStatus_t s = cublasLtMatmulAlgoCapGetAttribute(a, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT,
                                                         &c->swizzle_max, sizeof c->swizzle_max, &w);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoCapGetAttribute(a, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &c->custom_max,
                                              sizeof c->custom_max, &w);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoCapGetAttribute(a, CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS,
                                              &c->numerical_flags, sizeof c->numerical_flags, &w);
    if (s != CUBLAS_STATUS_SUCCESS) {
        caps_free(c);
        return LT_FAIL(s, "cublasLtMatmulAlgoCapGetAttribute", "swizzle, custom option or flags");
    }
    if (c->swizzle_max > 1) c->swizzle_max = 1; /* other values are reserved */
    if (c->custom_max < 0) c->custom_max = 0;
    return LS_OK;
}

static int list_has(const uint32_t *v, int n, uint32_t x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

/* 1 when c's tile, stages, swizzle and custom option are among what its
 * algorithm lists. The rebuild of a record refuses what this refuses, and
 * qualification accepts only what it accepts, so a qualified candidate can
 * always be rebuilt from its record. */
static int caps_admit(const algo_caps *caps, const ls_gemm_config *c)
{
    return list_has(caps->tiles, caps->n_tiles, c->tile) &&
           list_has(caps->stages, caps->n_stages, c->stages) && c->swizzle <= caps->swizzle_max &&
           (int64_t)c->custom <= (int64_t)caps->custom_max;
}

/* ---- descriptors of the strict linear ------------------------------------------------ */
typedef struct lt_desc {
    cublasLtMatmulDesc_t op;  /* compute fp32, scale fp32, A transposed */
    cublasLtMatrixLayout_t a; /* W: bf16, K x N, ld K (column-major view of [N, K] row-major) */
    cublasLtMatrixLayout_t b; /* x: bf16, K x M, ld K (column-major view of [M, K] row-major) */
    cublasLtMatrixLayout_t d; /* y (C and D): fp32, N x M, ld N (view of [M, N] row-major) */
} lt_desc;

static void desc_destroy(lt_desc *d)
{
    if (d->d) cublasLtMatrixLayoutDestroy(d->d);
    if (d->b) cublasLtMatrixLayoutDestroy(d->b);
    if (d->a) cublasLtMatrixLayoutDestroy(d->a);
    if (d->op) cublasLtMatmulDescDestroy(d->op);
    memset(d, 0, sizeof *d);
}

static ls_status desc_create(lt_desc *d, int64_t n, int64_t k, int64_t m, ls_error *err)
{
    ls_status st = LS_OK;
    int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    memset(d, 0, sizeof *d);
    LT_GO(cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
    LT_GO(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "op(A)");
    LT_GO(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "op(B)");
    LT_GO(cublasLtMatrixLayoutCreate(&d->a, CUDA_R_16BF, (uint64_t)k, (uint64_t)n, k), "layout of W");
    LT_GO(cublasLtMatrixLayoutCreate(&d->b, CUDA_R_16BF, (uint64_t)k, (uint64_t)m, k), "layout of x");
    LT_GO(cublasLtMatrixLayoutCreate(&d->d, CUDA_R_32F, (uint64_t)n, (uint64_t)m, n), "layout of y");
done:
    if (st != LS_OK) desc_destroy(d);
    return st;
}

/* Sets the rows of the call (the columns of B and D). */
static ls_status desc_set_m(lt_desc *d, int64_t m, ls_error *err)
{
    uint64_t cols = (uint64_t)m;
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(d->b, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols),
             "rows of x");
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(d->d, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols),
             "rows of y");
    return LS_OK;
}

/* cublasLtMatmulAlgoCheck at the descriptors' current M: CUBLAS_STATUS_SUCCESS
 * and the workspace needed, or the refusal. */
static cublasStatus_t algo_check(cublasLtHandle_t h, lt_desc *d, const cublasLtMatmulAlgo_t *algo,
                                 size_t *ws_bytes)
{
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    cublasStatus_t s = cublasLtMatmulAlgoCheck(h, d->op, d->a, d->b, d->d, d->d, algo, &r);
    *ws_bytes = r.workspaceSize;
    return s;
}

/* ---- context ------------------------------------------------------------------------------ */
struct ls_gemm_lt {
    cublasLtHandle_t h; /* owned */
    void *ws;           /* device workspace, owned */
    size_t ws_bytes;
};

int64_t ls_gemm_lt_version(void)
{
    return (int64_t)cublasLtGetVersion();
}

ls_status ls_gemm_lt_create(size_t workspace_bytes, ls_gemm_lt **out, ls_error *err)
{
    ls_status st = LS_OK;
    *out = NULL;
    ls_gemm_lt *lt = calloc(1, sizeof *lt);
    if (!lt) return ls_fail_nomem(err, sizeof *lt, "cuBLASLt context");
    cublasLtHandle_t h = NULL;
    LT_GO(cublasLtCreate(&h), "creating the cuBLASLt handle (is a GPU present?)");
    lt->h = h;
    if (workspace_bytes) RT_GO(cudaMalloc(&lt->ws, workspace_bytes), "cuBLASLt workspace");
    lt->ws_bytes = workspace_bytes;
    *out = lt;
    return LS_OK;
done:
    ls_gemm_lt_destroy(lt);
    return st;
}

void ls_gemm_lt_destroy(ls_gemm_lt *lt)
{
    if (!lt) return;
    if (lt->ws) cudaFree(lt->ws);
    if (lt->h) cublasLtDestroy(lt->h);
    free(lt);
}

/* ---- the record ------------------------------------------------------------------------------- */
ls_status ls_gemm_pin_format(const ls_gemm_pin *p, char *buf, size_t cap, ls_error *err)
{
    const ls_gemm_config *c = &p->cfg;
    int n = snprintf(buf, cap,
                     "{\"kind\":\"%s\",\"n\":%" PRId64 ",\"k\":%" PRId64 ",\"algo_id\":%" PRId32
                     ",\"tile\":%" PRIu32 ",\"stages\":%" PRIu32 ",\"splitk\":%" PRId32
                     ",\"reduction\":%" PRIu32 ",\"swizzle\":%" PRIu32 ",\"custom\":%" PRIu32
                     ",\"inner_shape\":%" PRIu32 ",\"cluster_shape\":%" PRIu32
                     ",\"cublaslt_version\":%" PRId64 ",\"cc\":\"%d.%d\",\"qualified_rows\":%" PRId64
                     "}",
                     LS_GEMM_PIN_KIND, p->n, p->k, c->algo_id, c->tile, c->stages, c->splitk,
                     c->reduction, c->swizzle, c->custom, c->inner_shape, c->cluster_shape,
                     p->cublaslt_version, p->cc_major, p->cc_minor, p->qualified_rows);
    if (n < 0 || (size_t)n >= cap)
        return ls_fail(err, LS_E_USAGE, "pinned GEMM record: %zu bytes of buffer, %d needed", cap,
                       n + 1);
    return LS_OK;
}

/* Strictness that no GPU can grant: split-K and reduction schemes sum K in
 * pieces whose number and order follow the launch (docs/numerics.md rule 1). */
static ls_status pin_check_strict(const ls_gemm_pin *p, ls_error *err)
{
    if (p->cfg.splitk != 1)
        return ls_fail(err, LS_E_UNSUPPORTED,
                       "pinned GEMM [%" PRId64 " x %" PRId64 "]: split-K %" PRId32 " is refused: a "
                       "strict GEMM sums all of K in one pass (split-K 1; docs/numerics.md rule 1)",
                       p->n, p->k, p->cfg.splitk);
    if (p->cfg.reduction != 0)
        return ls_fail(err, LS_E_UNSUPPORTED,
                       "pinned GEMM [%" PRId64 " x %" PRId64 "]: reduction scheme %" PRIu32
                       " is refused: a strict GEMM has no split-K reduction (scheme 0)",
                       p->n, p->k, p->cfg.reduction);
    if (p->qualified_rows < 1)
        return ls_fail(err, LS_E_UNSUPPORTED,
                       "pinned GEMM [%" PRId64 " x %" PRId64 "]: qualified_rows %" PRId64
                       ": the record was never qualified", p->n, p->k, p->qualified_rows);
    return LS_OK;
}

static ls_status json_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                          ls_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v) return ls_fail(err, LS_E_INPUT, "pinned GEMM record: key \"%s\" is missing", key);
    if (!json_is_integer(v))
        return ls_fail(err, LS_E_INPUT, "pinned GEMM record: \"%s\" must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return ls_fail(err, LS_E_INPUT,
                       "pinned GEMM record: \"%s\" is %lld, outside [%lld, %lld]", key,
                       (long long)x, (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return LS_OK;
}

ls_status ls_gemm_pin_parse(const char *text, ls_gemm_pin *out, ls_error *err)
{
    static const char *const keys[] = {"kind", "n", "k", "algo_id", "tile", "stages", "splitk",
                                       "reduction", "swizzle", "custom", "inner_shape",
                                       "cluster_shape", "cublaslt_version", "cc",
                                       "qualified_rows"};
    const size_t n_keys = sizeof keys / sizeof keys[0];
    ls_status st = LS_OK;
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return ls_fail(err, LS_E_INPUT, "pinned GEMM record: not JSON: %s (line %d, column %d)",
                       je.text, je.line, je.column);
    if (!json_is_object(o)) {
        st = ls_fail(err, LS_E_INPUT, "pinned GEMM record: not a JSON object");
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(o, key, val) {
        size_t i = 0;
        while (i < n_keys && strcmp(keys[i], key) != 0) i++;
        if (i == n_keys) {
            st = ls_fail(err, LS_E_INPUT, "pinned GEMM record: unknown key \"%.100s\"", key);
            goto done;
        }
    }
    for (size_t i = 0; i < n_keys; i++)
        if (!json_object_get(o, keys[i])) {
            st = ls_fail(err, LS_E_INPUT, "pinned GEMM record: key \"%s\" is missing", keys[i]);
            goto done;
        }
    const char *kind = json_string_value(json_object_get(o, "kind"));
    if (!kind || strcmp(kind, LS_GEMM_PIN_KIND) != 0) {
        st = ls_fail(err, LS_E_INPUT, "pinned GEMM record: \"kind\" must be \"%s\"%s%.100s%s",
                     LS_GEMM_PIN_KIND, kind ? " (it is \"" : " (missing or not a string",
                     kind ? kind : "", kind ? "\")" : ")");
        goto done;
    }
    const char *cc = json_string_value(json_object_get(o, "cc"));
    int ccmaj = -1, ccmin = -1;
    char canon[32] = "";
    if (cc && sscanf(cc, "%3d.%3d", &ccmaj, &ccmin) == 2)
        snprintf(canon, sizeof canon, "%d.%d", ccmaj, ccmin);
    if (!cc || strcmp(cc, canon) != 0 || ccmaj < 0 || ccmin < 0) {
        st = ls_fail(err, LS_E_INPUT, "pinned GEMM record: \"cc\" must be a string \"MAJOR.MINOR\"");
        goto done;
    }
    int64_t v[13];
    static const char *const ikeys[13] = {"n", "k", "algo_id", "tile", "stages", "splitk",
                                          "reduction", "swizzle", "custom", "inner_shape",
                                          "cluster_shape", "cublaslt_version", "qualified_rows"};
    static const int64_t hi[13] = {INT32_MAX, INT32_MAX, INT32_MAX, UINT32_MAX, UINT32_MAX,
                                   INT32_MAX, UINT32_MAX, UINT32_MAX, UINT32_MAX, UINT16_MAX,
                                   UINT16_MAX, INT64_MAX, INT32_MAX};
    static const int64_t lo[13] = {1, 1, 0, 0, 0, INT32_MIN, 0, 0, 0, 0, 0, 1, INT32_MIN};
    for (int i = 0; i < 13; i++) LS_GO(json_int(o, ikeys[i], lo[i], hi[i], &v[i], err));
    out->n = v[0];
    out->k = v[1];
    out->cfg.algo_id = (int32_t)v[2];
    out->cfg.tile = (uint32_t)v[3];
    out->cfg.stages = (uint32_t)v[4];
    out->cfg.splitk = (int32_t)v[5];
    out->cfg.reduction = (uint32_t)v[6];
    out->cfg.swizzle = (uint32_t)v[7];
    out->cfg.custom = (uint32_t)v[8];
    out->cfg.inner_shape = (uint32_t)v[9];
    out->cfg.cluster_shape = (uint32_t)v[10];
    out->cublaslt_version = v[11];
    out->qualified_rows = v[12];
    out->cc_major = ccmaj;
    out->cc_minor = ccmin;
    st = pin_check_strict(out, err);
done:
    json_decref(o);
    return st;
}

/* ---- rebuild and run ------------------------------------------------------------------------------ */
struct ls_gemm_plan {
    ls_gemm_lt *lt;               /* not owned */
    ls_gemm_pin pin;              /* the record it was built from */
    lt_desc d;                    /* owned */
    cublasLtMatmulAlgo_t algo;    /* the pinned configuration */
};

void ls_gemm_plan_destroy(ls_gemm_plan *plan)
{
    if (!plan) return;
    desc_destroy(&plan->d);
    free(plan);
}

/* The current device's compute capability and name. */
static ls_status device_facts(int *cc_major, int *cc_minor, char *name, size_t cap, ls_error *err)
{
    ls_status st = LS_OK;
    int dev = 0;
    struct cudaDeviceProp p;
    RT_GO(cudaGetDevice(&dev), "no usable CUDA device");
    RT_GO(cudaGetDeviceProperties(&p, dev), "querying the device properties");
    *cc_major = p.major;
    *cc_minor = p.minor;
    if (name) snprintf(name, cap, "%s", p.name);
done:
    return st;
}

ls_status ls_gemm_pin_rebuild(ls_gemm_lt *lt, const ls_gemm_pin *p, ls_gemm_plan **out,
                              ls_error *err)
{
    ls_status st = LS_OK;
    char cfgs[200];
    algo_caps caps;
    memset(&caps, 0, sizeof caps);
    *out = NULL;
    ls_gemm_config_str(&p->cfg, cfgs, sizeof cfgs);
    LS_TRY(pin_check_strict(p, err));
    int64_t have = ls_gemm_lt_version();
    if (have != p->cublaslt_version)
        return ls_fail(err, LS_E_UNSUPPORTED,
                       "pinned GEMM [%" PRId64 " x %" PRId64 "] (%s) was qualified with cuBLASLt %"
                       PRId64 ", this is %" PRId64 ": another library version may run other "
                       "kernels; requalify the shape", p->n, p->k, cfgs, p->cublaslt_version, have);
    int ccmaj = 0, ccmin = 0;
    LS_TRY(device_facts(&ccmaj, &ccmin, NULL, 0, err));
    if (ccmaj != p->cc_major || ccmin != p->cc_minor)
        return ls_fail(err, LS_E_UNSUPPORTED,
                       "pinned GEMM [%" PRId64 " x %" PRId64 "] (%s) was qualified on compute "
                       "capability %d.%d, this GPU is %d.%d: requalify the shape", p->n, p->k,
                       cfgs, p->cc_major, p->cc_minor, ccmaj, ccmin);
    ls_gemm_plan *plan = calloc(1, sizeof *plan);
    if (!plan) return ls_fail_nomem(err, sizeof *plan, "pinned GEMM plan");
    plan->lt = lt;
    plan->pin = *p;
    LS_GO(desc_create(&plan->d, p->n, p->k, 1, err));
    LS_GO(algo_build(lt->h, &p->cfg, &plan->algo, err));
    LS_GO(caps_read(&plan->algo, &caps, err));
    if (!caps_admit(&caps, &p->cfg)) {
        st = ls_fail(err, LS_E_UNSUPPORTED,
                     "pinned GEMM [%" PRId64 " x %" PRId64 "] (%s): algorithm %" PRId32 " on this "
                     "cuBLASLt/GPU offers %d tiles, %d stages, swizzle <= %" PRIu32
                     ", custom option <= %" PRId32 ": the record's configuration is not among them",
                     p->n, p->k, cfgs, p->cfg.algo_id, caps.n_tiles, caps.n_stages,
                     caps.swizzle_max, caps.custom_max);
        goto done;
    }
    const int64_t check_m[2] = {1, p->qualified_rows};
    for (int i = 0; i < 2; i++) {
        size_t ws = 0;
        LS_GO(desc_set_m(&plan->d, check_m[i], err));
        cublasStatus_t s = algo_check(lt->h, &plan->d, &plan->algo, &ws);
        if (s != CUBLAS_STATUS_SUCCESS) {
            st = ls_fail(err, LS_E_UNSUPPORTED,
                         "pinned GEMM [%" PRId64 " x %" PRId64 "] (%s): cuBLASLt refuses it at M = %"
                         PRId64 " on this GPU: cublasLtMatmulAlgoCheck: %s", p->n, p->k, cfgs,
                         check_m[i], cublasLtGetStatusName(s));
            goto done;
        }
        if (ws > lt->ws_bytes) {
            st = ls_fail(err, LS_E_UNSUPPORTED,
                         "pinned GEMM [%" PRId64 " x %" PRId64 "] (%s) needs %zu bytes of workspace "
                         "at M = %" PRId64 ", the context has %zu", p->n, p->k, cfgs, ws, check_m[i],
                         lt->ws_bytes);
            goto done;
        }
    }
    *out = plan;
    plan = NULL;
done:
    caps_free(&caps);
    ls_gemm_plan_destroy(plan);
    return st;
}

ls_status ls_gemm_plan_run(ls_gemm_plan *plan, const uint16_t *w, const uint16_t *x, float *y,
                           int64_t m, void *stream, ls_error *err)
{
    if (m < 1 || m > plan->pin.qualified_rows)
        return ls_fail(err, LS_E_UNSUPPORTED,
                       "pinned GEMM [%" PRId64 " x %" PRId64 "]: %" PRId64 " rows asked, the "
                       "qualification covered 1 .. %" PRId64, plan->pin.n, plan->pin.k, m,
                       plan->pin.qualified_rows);
    const float alpha = 1.0f, beta = 0.0f;
    LS_TRY(desc_set_m(&plan->d, m, err));
    LT_CHECK(cublasLtMatmul(plan->lt->h, plan->d.op, &alpha, w, plan->d.a, x, plan->d.b, &beta, y,
                            plan->d.d, y, plan->d.d, &plan->algo, plan->lt->ws, plan->lt->ws_bytes,
                            (cudaStream_t)stream),
             "the pinned GEMM");
    return LS_OK;
}

/* ---- unpinned: the default heuristic per call (the fast tier) ---------------------------------------- */
struct ls_gemm_fast {
    ls_gemm_lt *lt;                   /* not owned */
    int64_t n, k, max_rows;
    lt_desc d;                        /* owned */
    cublasLtMatmulPreference_t pref;  /* owned: the context's workspace */
    cublasLtMatmulAlgo_t *algo;       /* [max_rows + 1]: the heuristic's first pick per M */
    unsigned char *have;              /* [max_rows + 1]: 1 once algo[M] was asked for */
};

void ls_gemm_fast_destroy(ls_gemm_fast *f)
{
    if (!f) return;
    if (f->pref) cublasLtMatmulPreferenceDestroy(f->pref);
    desc_destroy(&f->d);
    free(f->algo);
    free(f->have);
    free(f);
}

ls_status ls_gemm_fast_create(ls_gemm_lt *lt, int64_t n, int64_t k, int64_t max_rows, ls_gemm_fast **out,
                              ls_error *err)
{
    ls_status st = LS_OK;
    *out = NULL;
    if (n < 8 || k < 8 || n % 8 || k % 8 || max_rows < 1)
        return ls_fail(err, LS_E_USAGE, "GEMM [%" PRId64 " x %" PRId64 "] up to %" PRId64 " rows: N and K "
                       "must be positive multiples of 8 (16-byte rows)", n, k, max_rows);
    ls_gemm_fast *f = calloc(1, sizeof *f);
    if (!f) return ls_fail_nomem(err, sizeof *f, "unpinned GEMM");
    f->lt = lt;
    f->n = n;
    f->k = k;
    f->max_rows = max_rows;
    f->algo = calloc((size_t)max_rows + 1, sizeof *f->algo);
    f->have = calloc((size_t)max_rows + 1, 1);
    uint64_t wsb = (uint64_t)lt->ws_bytes;
    if (!f->algo || !f->have) {
        st = ls_fail_nomem(err, ((size_t)max_rows + 1) * (sizeof *f->algo + 1), "unpinned GEMM picks");
        goto done;
    }
    LS_GO(desc_create(&f->d, n, k, 1, err));
    LT_GO(cublasLtMatmulPreferenceCreate(&f->pref), "heuristic preference");
    LT_GO(cublasLtMatmulPreferenceSetAttribute(f->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                               sizeof wsb), "heuristic workspace");
    *out = f;
    return LS_OK;
done:
    ls_gemm_fast_destroy(f);
    return st;
}

ls_status ls_gemm_fast_run(ls_gemm_fast *f, const uint16_t *w, const uint16_t *x, float *y, int64_t m,
                           void *stream, ls_error *err)
{
    if (m < 1 || m > f->max_rows)
        return ls_fail(err, LS_E_UNSUPPORTED, "unpinned GEMM [%" PRId64 " x %" PRId64 "]: %" PRId64 " rows "
                       "asked, at most %" PRId64, f->n, f->k, m, f->max_rows);
    LS_TRY(desc_set_m(&f->d, m, err));
    if (!f->have[m]) {
        cublasLtMatmulHeuristicResult_t r;
        int got = 0;
        memset(&r, 0, sizeof r);
        LT_CHECK(cublasLtMatmulAlgoGetHeuristic(f->lt->h, f->d.op, f->d.a, f->d.b, f->d.d, f->d.d, f->pref, 1,
                                                &r, &got),
                 "the default heuristic");
        if (got < 1 || r.state != CUBLAS_STATUS_SUCCESS)
            return ls_fail(err, LS_E_UNSUPPORTED, "unpinned GEMM [%" PRId64 " x %" PRId64 "]: the heuristic "
                           "has no algorithm at M = %" PRId64, f->n, f->k, m);
        f->algo[m] = r.algo;
        f->have[m] = 1;
    }
    const float alpha = 1.0f, beta = 0.0f;
    LT_CHECK(cublasLtMatmul(f->lt->h, f->d.op, &alpha, w, f->d.a, x, f->d.b, &beta, y, f->d.d, y, f->d.d,
                            &f->algo[m], f->lt->ws, f->lt->ws_bytes, (cudaStream_t)stream),
             "the unpinned GEMM");
    return LS_OK;
}

/* ---- qualification ---------------------------------------------------------------------------------- */
void ls_gemm_qualify_opts_default(ls_gemm_qualify_opts *o)
{
    memset(o, 0, sizeof *o);
    o->max_rows = 1024;
    o->seed = 0x5eed6e3dull;
    o->max_candidates = 0;
    o->max_per_algo = 0;
    o->time_reps = 20;
}

void ls_gemm_qual_free(ls_gemm_qual *q)
{
    if (!q) return;
    free(q->ms);
    free(q->cand);
    free(q->heur);
    if (q->w_dev) cudaFree(q->w_dev);
    if (q->x_dev) cudaFree(q->x_dev);
    memset(q, 0, sizeof *q);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* 1..64, then 2^j - 1, 2^j, 2^j + 1, and max_rows itself: every value <= p,
 * ascending, once each. */
static ls_status m_set(int64_t p, int64_t **out, int *n_out, ls_error *err)
{
    int64_t *v = malloc(sizeof *v * 256);
    if (!v) return ls_fail_nomem(err, sizeof *v * 256, "M set");
    int n = 0;
    for (int64_t m = 1; m <= 64 && m <= p; m++) v[n++] = m;
    for (int j = 6; j < 40 && ((int64_t)1 << j) - 1 <= p; j++)
        for (int64_t d = -1; d <= 1; d++) {
            int64_t m = ((int64_t)1 << j) + d;
            if (m > 64 && m <= p) v[n++] = m;
        }
    v[n++] = p;
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    int u = 0;
    for (int i = 0; i < n; i++)
        if (u == 0 || v[u - 1] != v[i]) v[u++] = v[i];
    *out = v;
    *n_out = u;
    return LS_OK;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A random bf16 with a random sign, exponent 2^-7 .. 2^0 and all 7 mantissa
 * bits random: finite, and sums of K products use every bit of fp32, so a
 * change of summation order shows in the result. */
static uint16_t rand_bf16(uint64_t *s)
{
    uint64_t r = splitmix(s);
    return (uint16_t)(((r >> 20) & 1u) << 15 | (120u + (uint32_t)(r & 7u)) << 7 | ((r >> 8) & 0x7fu));
}

/* The value of bf16 bits (the top half of an fp32). */
static float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The input row at position i of the run with m rows: the probe (row 0 of
 * the reference run) first, in the middle and last; the other positions
 * rotate through rows 1 .. p-1 with an offset that changes with m, so every
 * row meets many positions. */
static int32_t row_of(int64_t i, int64_t m, int64_t p)
{
    if (i == 0 || i == m - 1 || i == (m - 1) / 2) return 0;
    int64_t s = (m * 37) % (p - 1);
    return (int32_t)(1 + (i + s) % (p - 1));
}

/* A candidate list that grows. */
static ls_status cand_push(ls_gemm_qual *q, int *cap, const ls_gemm_config *c, int from_heuristic,
                           ls_error *err)
{
    for (int i = 0; i < q->n_cand; i++)
        if (ls_gemm_config_equal(&q->cand[i].cfg, c)) return LS_OK;
    if (q->n_cand == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        ls_gemm_candidate *v = realloc(q->cand, sizeof *v * (size_t)nc);
        if (!v) return ls_fail_nomem(err, sizeof *v * (size_t)nc, "GEMM candidates");
        q->cand = v;
        *cap = nc;
    }
    ls_gemm_candidate *x = &q->cand[q->n_cand++];
    memset(x, 0, sizeof *x);
    x->cfg = *c;
    x->from_heuristic = from_heuristic;
    x->fail_m = x->fail_row = x->fail_col = x->fail_input_row = -1;
    return LS_OK;
}

/* The run's device buffers (gemm_pin.h shapes). */
typedef struct qbufs {
    uint16_t *xall;             /* every run's rows, packed: run i at xoff[i], [ms[i], K] bf16 */
    int64_t *xoff;              /* host, [n_ms] element offsets (256-byte aligned) */
    int32_t *maps;              /* device, packed [Σ ms] input row of each position */
    int32_t *pmaps;             /* device, packed: 0 at the probe's positions, -1 elsewhere */
    int64_t *moff;              /* host, [n_ms] offsets into maps/pmaps */
    float *yref;                /* [max_rows, N] fp32 */
    float *y;                   /* [max_rows, N] fp32 */
    float *y1;                  /* [1, N] fp32: the heuristic's M = 1 output */
    unsigned long long *first;  /* device [2 n_ms]: least differing element per run */
    unsigned long long *count;  /* device [2 n_ms]: differing elements per run */
    unsigned long long *hfirst; /* host copies */
    unsigned long long *hcount;
    double *want0;              /* host [2, N]: rows 0 and max_rows - 1 of x Wᵀ in fp64 */
    double *tol0;               /* host [2, N]: the error any fp32 summation order may make there */
    float *got0;                /* host [2, N]: those rows of a reference run */
} qbufs;

static void qbufs_free(qbufs *b)
{
    cudaFree(b->xall);
    cudaFree(b->maps);
    cudaFree(b->pmaps);
    cudaFree(b->yref);
    cudaFree(b->y);
    cudaFree(b->y1);
    cudaFree(b->first);
    cudaFree(b->count);
    free(b->xoff);
    free(b->moff);
    free(b->hfirst);
    free(b->hcount);
    free(b->want0);
    free(b->tol0);
    free(b->got0);
    memset(b, 0, sizeof *b);
}

/* Inputs: W and the reference rows on the device (kept in q), every run's
 * rows packed, the maps. */
static ls_status qbufs_init(ls_gemm_qual *q, qbufs *b, ls_error *err)
{
    ls_status st = LS_OK;
    const int64_t n = q->n, k = q->k, p = q->max_rows;
    uint16_t *hw = NULL, *hx = NULL, *hall = NULL;
    int32_t *hmap = NULL, *hpmap = NULL;
    size_t nm = (size_t)q->n_ms;
    memset(b, 0, sizeof *b);
    b->xoff = calloc(nm, sizeof *b->xoff);
    b->moff = calloc(nm, sizeof *b->moff);
    b->hfirst = calloc(2 * nm, sizeof *b->hfirst);
    b->hcount = calloc(2 * nm, sizeof *b->hcount);
    b->want0 = malloc(sizeof *b->want0 * 2 * (size_t)n);
    b->tol0 = malloc(sizeof *b->tol0 * 2 * (size_t)n);
    b->got0 = malloc(sizeof *b->got0 * 2 * (size_t)n);
    if (!b->xoff || !b->moff || !b->hfirst || !b->hcount || !b->want0 || !b->tol0 || !b->got0) {
        st = ls_fail_nomem(err, nm * 48, "GEMM qualification tables");
        goto done;
    }
    int64_t xt = 0, mt = 0;
    for (int i = 0; i < q->n_ms; i++) {
        b->xoff[i] = xt;
        b->moff[i] = mt;
        xt += (q->ms[i] * k + 127) / 128 * 128; /* 256-byte starts */
        mt += q->ms[i];
    }
    hw = malloc(sizeof *hw * (size_t)(n * k));
    hx = malloc(sizeof *hx * (size_t)(p * k));
    hall = calloc((size_t)xt, sizeof *hall);
    hmap = malloc(sizeof *hmap * (size_t)mt);
    hpmap = malloc(sizeof *hpmap * (size_t)mt);
    if (!hw || !hx || !hall || !hmap || !hpmap) {
        st = ls_fail_nomem(err, (size_t)(n * k + p * k + xt) * 2 + (size_t)mt * 8,
                           "GEMM qualification inputs");
        goto done;
    }
    uint64_t s = q->seed;
    for (int64_t i = 0; i < n * k; i++) hw[i] = rand_bf16(&s);
    for (int64_t i = 0; i < p * k; i++) hx[i] = rand_bf16(&s);
    /* rows 0 and p - 1 of x Wᵀ in fp64 (the first and the last row a GEMM
     * writes). A bf16 product is exact in fp32, so an fp32 sum of the k
     * products in any order is within 2 k 2^-24 Σ|x w| of it (twice the
     * classical γ_k bound, for accumulators that truncate) */
    for (int c = 0; c < 2; c++) {
        const uint16_t *xr = hx + (c ? p - 1 : 0) * k;
        for (int64_t j = 0; j < n; j++) {
            double sum = 0.0, mag = 0.0;
            for (int64_t i = 0; i < k; i++) {
                double t = (double)bf16_value(xr[i]) * (double)bf16_value(hw[j * k + i]);
                sum += t;
                mag += fabs(t);
            }
            b->want0[c * n + j] = sum;
            b->tol0[c * n + j] = 2.0 * (double)k * ldexp(1.0, -24) * mag + ldexp(1.0, -126);
        }
    }
    for (int r = 0; r < q->n_ms; r++) {
        int64_t m = q->ms[r];
        for (int64_t i = 0; i < m; i++) {
            int32_t src = row_of(i, m, p);
            memcpy(hall + b->xoff[r] + i * k, hx + (int64_t)src * k, sizeof *hx * (size_t)k);
            hmap[b->moff[r] + i] = src;
            hpmap[b->moff[r] + i] = src == 0 ? 0 : -1;
        }
    }
    RT_GO(cudaMalloc((void **)&q->w_dev, sizeof *hw * (size_t)(n * k)), "W");
    RT_GO(cudaMalloc((void **)&q->x_dev, sizeof *hx * (size_t)(p * k)), "reference rows");
    RT_GO(cudaMalloc((void **)&b->xall, sizeof *hall * (size_t)xt), "packed rows");
    RT_GO(cudaMalloc((void **)&b->maps, sizeof *hmap * (size_t)mt), "row maps");
    RT_GO(cudaMalloc((void **)&b->pmaps, sizeof *hpmap * (size_t)mt), "probe maps");
    RT_GO(cudaMalloc((void **)&b->yref, sizeof(float) * (size_t)(p * n)), "reference output");
    RT_GO(cudaMalloc((void **)&b->y, sizeof(float) * (size_t)(p * n)), "output");
    RT_GO(cudaMalloc((void **)&b->y1, sizeof(float) * (size_t)n), "heuristic M = 1 row");
    RT_GO(cudaMalloc((void **)&b->first, sizeof *b->first * 2 * nm), "diff slots");
    RT_GO(cudaMalloc((void **)&b->count, sizeof *b->count * 2 * nm), "diff counts");
    /* The outputs start as a NaN pattern. cuBLASLt's Hopper kernels store
     * through bulk (TMA) copies, which compute-sanitizer 2025.3's initcheck
     * does not record as writes: without this it reports every read of a
     * GEMM's output. NaN bits are no product of these inputs, and the
     * reference check in qualify_one proves each candidate wrote its output. */
    RT_GO(cudaMemset(b->yref, 0xff, sizeof(float) * (size_t)(p * n)), "reference output");
    RT_GO(cudaMemset(b->y, 0xff, sizeof(float) * (size_t)(p * n)), "output");
    RT_GO(cudaMemset(b->y1, 0xff, sizeof(float) * (size_t)n), "heuristic M = 1 row");
    RT_GO(cudaMemcpy(q->w_dev, hw, sizeof *hw * (size_t)(n * k), cudaMemcpyHostToDevice), "upload W");
    RT_GO(cudaMemcpy(q->x_dev, hx, sizeof *hx * (size_t)(p * k), cudaMemcpyHostToDevice), "upload x");
    RT_GO(cudaMemcpy(b->xall, hall, sizeof *hall * (size_t)xt, cudaMemcpyHostToDevice), "upload rows");
    RT_GO(cudaMemcpy(b->maps, hmap, sizeof *hmap * (size_t)mt, cudaMemcpyHostToDevice), "upload maps");
    RT_GO(cudaMemcpy(b->pmaps, hpmap, sizeof *hpmap * (size_t)mt, cudaMemcpyHostToDevice),
          "upload probe maps");
done:
    free(hw);
    free(hx);
    free(hall);
    free(hmap);
    free(hpmap);
    return st;
}

static ls_status slots_reset(qbufs *b, int n, ls_error *err)
{
    ls_status st = LS_OK;
    RT_GO(cudaMemsetAsync(b->first, 0xff, sizeof *b->first * (size_t)n, 0), "diff slots");
    RT_GO(cudaMemsetAsync(b->count, 0, sizeof *b->count * (size_t)n, 0), "diff counts");
done:
    return st;
}

static ls_status slots_read(qbufs *b, int n, ls_error *err)
{
    ls_status st = LS_OK;
    RT_GO(cudaMemcpy(b->hfirst, b->first, sizeof *b->first * (size_t)n, cudaMemcpyDeviceToHost),
          "reading the comparison (a kernel may have failed)");
    RT_GO(cudaMemcpy(b->hcount, b->count, sizeof *b->count * (size_t)n, cudaMemcpyDeviceToHost),
          "reading the comparison");
done:
    return st;
}

/* One GEMM with an explicit algorithm on the default stream. A refusal that
 * belongs to the candidate (not supported, invalid for this shape) comes back
 * in *refused with LS_OK; other failures are errors. */
static ls_status gemm(ls_gemm_lt *lt, lt_desc *d, const cublasLtMatmulAlgo_t *algo,
                      const uint16_t *w, const uint16_t *x, float *y, int64_t m,
                      cublasStatus_t *refused, ls_error *err)
{
    const float alpha = 1.0f, beta = 0.0f;
    *refused = CUBLAS_STATUS_SUCCESS;
    LS_TRY(desc_set_m(d, m, err));
    cublasStatus_t s = cublasLtMatmul(lt->h, d->op, &alpha, w, d->a, x, d->b, &beta, y, d->d, y,
                                      d->d, algo, lt->ws, lt->ws_bytes, 0);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE ||
        s == CUBLAS_STATUS_ARCH_MISMATCH) {
        *refused = s;
        return LS_OK;
    }
    if (s != CUBLAS_STATUS_SUCCESS) return LT_FAIL(s, "cublasLtMatmul", "a qualification GEMM");
    return LS_OK;
}

/* The default heuristic at every M: its first pick, run on that M's rows,
 * row 0 and the probe's other positions compared with its pick at M = 1.
 * Every split-K 1 configuration it lists becomes a candidate. */
static ls_status qualify_heuristic(ls_gemm_lt *lt, ls_gemm_qual *q, qbufs *b, lt_desc *d,
                                   int *cand_cap, ls_error *err)
{
    ls_status st = LS_OK;
    cublasLtMatmulPreference_t pref = NULL;
    enum { TOP = 8 };
    cublasLtMatmulHeuristicResult_t res[TOP];
    uint64_t wsb = (uint64_t)lt->ws_bytes;
    q->heur = calloc((size_t)q->n_ms, sizeof *q->heur);
    if (!q->heur) return ls_fail_nomem(err, sizeof *q->heur * (size_t)q->n_ms, "heuristic table");
    q->n_heur = q->n_ms;
    LT_GO(cublasLtMatmulPreferenceCreate(&pref), "heuristic preference");
    LT_GO(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                               sizeof wsb), "heuristic workspace");
    LS_GO(slots_reset(b, 2 * q->n_ms, err));
    int have1 = 0; /* the M = 1 pick ran: rows can be compared with it */
    for (int r = 0; r < q->n_ms; r++) {
        int64_t m = q->ms[r];
        ls_gemm_heuristic_row *h = &q->heur[r];
        int got = 0;
        h->m = m;
        h->row0_diff_cols = h->probe_diff_cols = -1;
        LS_GO(desc_set_m(d, m, err));
        memset(res, 0, sizeof res);
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt->h, d->op, d->a, d->b, d->d, d->d, pref,
                                                          TOP, res, &got);
        if (s != CUBLAS_STATUS_SUCCESS || got < 1 || res[0].state != CUBLAS_STATUS_SUCCESS) {
            h->cfg.algo_id = -1; /* no pick at this M */
            continue;
        }
        for (int i = 0; i < got; i++) {
            ls_gemm_config c;
            if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
            LS_GO(config_read(&res[i].algo, &c, err));
            if (i == 0) {
                h->cfg = c;
                h->workspace_bytes = res[i].workspaceSize;
            }
            if (c.splitk == 1 && c.reduction == 0) LS_GO(cand_push(q, cand_cap, &c, 1, err));
        }
        cublasStatus_t refused;
        LS_GO(gemm(lt, d, &res[0].algo, q->w_dev, b->xall + b->xoff[r], b->y, m, &refused, err));
        if (refused != CUBLAS_STATUS_SUCCESS) {
            h->cfg.algo_id = -1;
            continue;
        }
        if (m == 1) {
            RT_GO(cudaMemcpyAsync(b->y1, b->y, sizeof(float) * (size_t)q->n, cudaMemcpyDeviceToDevice,
                                  0), "keeping the M = 1 row");
            have1 = 1;
        }
        if (!have1) continue;
        /* row 0 of this run against row 0 at M = 1 (map {0}), then every
         * position holding the probe */
        LS_GO(ls_gemm_rows_diff(b->y, b->y1, b->pmaps + b->moff[r], 1, q->n, b->first + 2 * r,
                                b->count + 2 * r, NULL, err));
        LS_GO(ls_gemm_rows_diff(b->y, b->y1, b->pmaps + b->moff[r], m, q->n, b->first + 2 * r + 1,
                                b->count + 2 * r + 1, NULL, err));
    }
    LS_GO(slots_read(b, 2 * q->n_ms, err));
    q->heur_first_row0_change = -1;
    for (int r = 0; r < q->n_ms; r++) {
        ls_gemm_heuristic_row *h = &q->heur[r];
        if (h->cfg.algo_id < 0) continue;
        if (h->cfg.splitk != 1 || h->cfg.reduction != 0) q->heur_splitk_ms++;
        int seen = 0;
        for (int j = 0; j < r && !seen; j++)
            seen = q->heur[j].cfg.algo_id >= 0 && ls_gemm_config_equal(&q->heur[j].cfg, &h->cfg);
        if (!seen) q->heur_n_configs++;
        if (!have1) continue;
        h->row0_diff_cols = (int64_t)b->hcount[2 * r];
        h->probe_diff_cols = (int64_t)b->hcount[2 * r + 1];
        if (h->row0_diff_cols > 0 && q->heur_first_row0_change < 0) q->heur_first_row0_change = h->m;
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

/* Every configuration cuBLASLt accepts at M = max_rows with split-K 1 and no
 * reduction scheme, per algorithm id, then appended to the candidates
 * (after the heuristic's) taking one from each id in turn. */
static ls_status enumerate(ls_gemm_lt *lt, ls_gemm_qual *q, lt_desc *d, const ls_gemm_qualify_opts *o,
                           int *cand_cap, ls_error *err)
{
    ls_status st = LS_OK;
    enum { MAX_IDS = 1024 };
    int ids[MAX_IDS];
    int n_ids = 0;
    ls_gemm_config **per = NULL; /* per id: its valid configurations */
    int *n_per = NULL;
    algo_caps caps;
    memset(&caps, 0, sizeof caps);
    LT_GO(cublasLtMatmulAlgoGetIds(lt->h, LT_TYPES, MAX_IDS, ids, &n_ids), "listing algorithm ids");
    q->n_algo_ids = n_ids;
    per = calloc((size_t)(n_ids ? n_ids : 1), sizeof *per);
    n_per = calloc((size_t)(n_ids ? n_ids : 1), sizeof *n_per);
    if (!per || !n_per) {
        st = ls_fail_nomem(err, sizeof *per * (size_t)n_ids * 2, "per-algorithm lists");
        goto done;
    }
    LS_GO(desc_set_m(d, q->max_rows, err));
    for (int a = 0; a < n_ids; a++) {
        cublasLtMatmulAlgo_t algo;
        ls_gemm_config c;
        memset(&c, 0, sizeof c);
        c.algo_id = ids[a];
        c.splitk = 1;
        if (cublasLtMatmulAlgoInit(lt->h, LT_TYPES, ids[a], &algo) != CUBLAS_STATUS_SUCCESS) continue;
        caps_free(&caps);
        LS_GO(caps_read(&algo, &caps, err));
        int cap_here = o->max_per_algo > 0 ? o->max_per_algo : 1 << 20;
        long checks_here = 0;
#define MORE (n_per[a] < cap_here && checks_here < LS_GEMM_CHECKS_PER_ALGO)
        /* the tile varies fastest, then the stages: under a limit, the
         * configurations kept span the tiles first */
        for (int32_t u = 0; u <= caps.custom_max && MORE; u++)
            for (uint32_t z = 0; z <= caps.swizzle_max && MORE; z++)
                for (int s = 0; s < caps.n_stages && MORE; s++)
                    for (int t = 0; t < caps.n_tiles && MORE; t++) {
                        c.tile = caps.tiles[t];
                        c.stages = caps.stages[s];
                        c.swizzle = z;
                        c.custom = (uint32_t)u;
                        cublasLtMatmulAlgo_t cand;
                        size_t ws = 0;
                        LS_GO(algo_build(lt->h, &c, &cand, err));
                        q->n_checked++;
                        if (++checks_here == LS_GEMM_CHECKS_PER_ALGO) q->n_ids_cut++;
                        if (algo_check(lt->h, d, &cand, &ws) != CUBLAS_STATUS_SUCCESS ||
                            ws > lt->ws_bytes)
                            continue;
                        if (n_per[a] % 64 == 0) {
                            ls_gemm_config *v =
                                realloc(per[a], sizeof *v * (size_t)(n_per[a] + 64));
                            if (!v) {
                                st = ls_fail_nomem(err, sizeof *v * (size_t)(n_per[a] + 64),
                                                   "configuration list");
                                goto done;
                            }
                            per[a] = v;
                        }
                        per[a][n_per[a]++] = c;
                        q->n_valid++;
                    }
#undef MORE
    }
    /* round robin over the ids, after the heuristic's candidates */
    int limit = o->max_candidates > 0 ? o->max_candidates : INT32_MAX;
    for (int i = 0, more = 1; more; i++) {
        more = 0;
        for (int a = 0; a < n_ids; a++) {
            if (i >= n_per[a]) continue;
            more = 1;
            if (q->n_cand >= limit) {
                int dup = 0;
                for (int j = 0; j < q->n_cand && !dup; j++)
                    dup = ls_gemm_config_equal(&q->cand[j].cfg, &per[a][i]);
                if (!dup) q->n_not_tried++;
                continue;
            }
            LS_GO(cand_push(q, cand_cap, &per[a][i], 0, err));
        }
    }
done:
    caps_free(&caps);
    if (per)
        for (int a = 0; a < n_ids; a++) free(per[a]);
    free(per);
    free(n_per);
    return st;
}

/* The index in q->ms of m, or -1. */
static int m_index(const ls_gemm_qual *q, int64_t m)
{
    for (int i = 0; i < q->n_ms; i++)
        if (q->ms[i] == m) return i;
    return -1;
}

/* Qualifies one candidate: reference run, every M of the set compared with
 * it, hashes for replays, times. */
static ls_status qualify_one(ls_gemm_lt *lt, ls_gemm_qual *q, qbufs *b, lt_desc *d,
                             const ls_gemm_qualify_opts *o, ls_gemm_candidate *c, ls_error *err)
{
    ls_status st = LS_OK;
    cublasLtMatmulAlgo_t algo;
    algo_caps caps;
    cudaEvent_t ev0 = NULL, ev1 = NULL;
    cublasStatus_t refused = CUBLAS_STATUS_SUCCESS;
    memset(&caps, 0, sizeof caps);
    LS_GO(algo_build(lt->h, &c->cfg, &algo, err));
    LS_GO(caps_read(&algo, &caps, err));
    c->numerical_flags = caps.numerical_flags;
    if (!caps_admit(&caps, &c->cfg)) {
        snprintf(c->fail_reason, sizeof c->fail_reason,
                 "its tile, stages, swizzle or custom option is not among those algorithm %" PRId32
                 " lists: a record of it could not be rebuilt", c->cfg.algo_id);
        goto done;
    }
    /* every M must be accepted before anything runs */
    int stop = q->n_ms; /* runs [0, stop) are compared */
    for (int r = 0; r < q->n_ms; r++) {
        size_t ws = 0;
        LS_GO(desc_set_m(d, q->ms[r], err));
        cublasStatus_t s = algo_check(lt->h, d, &algo, &ws);
        if (q->ms[r] == q->max_rows) c->workspace_bytes = ws;
        if (s != CUBLAS_STATUS_SUCCESS || ws > lt->ws_bytes) {
            stop = r;
            c->fail_m = q->ms[r];
            snprintf(c->fail_reason, sizeof c->fail_reason,
                     "cublasLtMatmulAlgoCheck refuses M = %" PRId64 ": %s", q->ms[r],
                     s != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusName(s) : "workspace too large");
            break;
        }
    }
    if (stop < q->n_ms) goto done; /* cannot run every M: not qualified, nothing timed */
    LS_GO(gemm(lt, d, &algo, q->w_dev, q->x_dev, b->yref, q->max_rows, &refused, err));
    if (refused != CUBLAS_STATUS_SUCCESS) {
        c->fail_m = q->max_rows;
        snprintf(c->fail_reason, sizeof c->fail_reason, "cublasLtMatmul refuses M = %" PRId64 ": %s",
                 q->max_rows, cublasLtGetStatusName(refused));
        goto done;
    }
    /* bit-stable is not enough: the first and the last row must be x Wᵀ */
    RT_GO(cudaMemcpy(b->got0, b->yref, sizeof(float) * (size_t)q->n, cudaMemcpyDeviceToHost),
          "reading the reference run (a GEMM may have failed)");
    RT_GO(cudaMemcpy(b->got0 + q->n, b->yref + (q->max_rows - 1) * q->n, sizeof(float) * (size_t)q->n,
                     cudaMemcpyDeviceToHost), "reading the reference run (a GEMM may have failed)");
    for (int64_t e = 0; e < 2 * q->n; e++) {
        double g = (double)b->got0[e];
        if (fabs(g - b->want0[e]) <= b->tol0[e]) continue; /* false for NaN */
        c->fail_m = q->max_rows;
        c->fail_row = c->fail_input_row = e < q->n ? 0 : q->max_rows - 1;
        c->fail_col = e % q->n;
        snprintf(c->fail_reason, sizeof c->fail_reason,
                 "row %" PRId64 " of its output is not x W^T: column %" PRId64 " is %.9g, the fp64 "
                 "product %.9g (error bound %.3g)", c->fail_row, c->fail_col, g, b->want0[e],
                 b->tol0[e]);
        goto done;
    }
    LS_GO(slots_reset(b, q->n_ms, err));
    for (int r = 0; r < q->n_ms; r++) {
        LS_GO(gemm(lt, d, &algo, q->w_dev, b->xall + b->xoff[r], b->y, q->ms[r], &refused, err));
        if (refused != CUBLAS_STATUS_SUCCESS) {
            stop = r;
            break;
        }
        LS_GO(ls_gemm_rows_diff(b->y, b->yref, b->maps + b->moff[r], q->ms[r], q->n, b->first + r,
                                b->count + r, NULL, err));
    }
    LS_GO(slots_read(b, q->n_ms, err));
    int bad = -1;
    for (int r = 0; r < stop && bad < 0; r++)
        if (b->hcount[r]) bad = r;
    if (bad >= 0) {
        int64_t m = q->ms[bad], e = (int64_t)b->hfirst[bad];
        c->fail_m = m;
        c->fail_row = e / q->n;
        c->fail_col = e % q->n;
        c->fail_input_row = row_of(c->fail_row, m, q->max_rows);
        /* the bits: run M again (the run's output was overwritten since) */
        float got = 0.0f, want = 0.0f;
        LS_GO(gemm(lt, d, &algo, q->w_dev, b->xall + b->xoff[bad], b->y, m, &refused, err));
        RT_GO(cudaMemcpy(&got, b->y + e, sizeof got, cudaMemcpyDeviceToHost), "reading a mismatch");
        RT_GO(cudaMemcpy(&want, b->yref + c->fail_input_row * q->n + c->fail_col, sizeof want,
                         cudaMemcpyDeviceToHost), "reading a mismatch");
        memcpy(&c->fail_got_bits, &got, sizeof got);
        memcpy(&c->fail_want_bits, &want, sizeof want);
        snprintf(c->fail_reason, sizeof c->fail_reason,
                 "%llu elements differ over %" PRId64 " rows", b->hcount[bad], m);
    } else if (stop < q->n_ms) {
        c->fail_m = q->ms[stop];
        snprintf(c->fail_reason, sizeof c->fail_reason, "cublasLtMatmul refuses M = %" PRId64 ": %s",
                 q->ms[stop], cublasLtGetStatusName(refused));
        goto done;
    } else {
        c->qualified = 1;
    }
    /* fingerprints for replays: the reference output, and row 0 at M = 1 */
    LS_GO(ls_gemm_hash_f32(b->yref, q->max_rows * q->n, &c->ref_hash, err));
    LS_GO(gemm(lt, d, &algo, q->w_dev, q->x_dev, b->y, 1, &refused, err));
    if (refused == CUBLAS_STATUS_SUCCESS) LS_GO(ls_gemm_hash_f32(b->y, q->n, &c->row0_hash, err));
    /* times */
    RT_GO(cudaEventCreate(&ev0), "timing event");
    RT_GO(cudaEventCreate(&ev1), "timing event");
    for (int t = 0; t < LS_GEMM_TIMED_MS; t++) {
        int r = m_index(q, ls_gemm_timed_m[t]);
        if (r < 0) continue;
        const uint16_t *x = b->xall + b->xoff[r];
        for (int i = 0; i < 3 && refused == CUBLAS_STATUS_SUCCESS; i++)
            LS_GO(gemm(lt, d, &algo, q->w_dev, x, b->y, q->ms[r], &refused, err));
        RT_GO(cudaEventRecord(ev0, 0), "timing event");
        for (int i = 0; i < o->time_reps && refused == CUBLAS_STATUS_SUCCESS; i++)
            LS_GO(gemm(lt, d, &algo, q->w_dev, x, b->y, q->ms[r], &refused, err));
        RT_GO(cudaEventRecord(ev1, 0), "timing event");
        RT_GO(cudaEventSynchronize(ev1), "timing (a GEMM may have failed)");
        float ms = 0.0f;
        RT_GO(cudaEventElapsedTime(&ms, ev0, ev1), "timing");
        if (refused == CUBLAS_STATUS_SUCCESS && o->time_reps > 0)
            c->us[t] = (double)ms * 1000.0 / o->time_reps;
    }
done:
    if (ev0) cudaEventDestroy(ev0);
    if (ev1) cudaEventDestroy(ev1);
    caps_free(&caps);
    return st;
}

ls_status ls_gemm_qualify(ls_gemm_lt *lt, const ls_gemm_qualify_opts *o, ls_gemm_qual *q,
                          FILE *progress, ls_error *err)
{
    ls_status st = LS_OK;
    qbufs b;
    lt_desc d;
    int cand_cap = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    memset(q, 0, sizeof *q);
    memset(&b, 0, sizeof b);
    memset(&d, 0, sizeof d);
    q->best = -1;
    q->heur_first_row0_change = -1;
    if (o->n < 8 || o->k < 8 || o->n % 8 || o->k % 8 || o->n > INT32_MAX || o->k > INT32_MAX)
        return ls_fail(err, LS_E_USAGE,
                       "GEMM qualification: shape [%" PRId64 " x %" PRId64 "]: N and K must be "
                       "positive multiples of 8 (16-byte rows)", o->n, o->k);
    if (o->max_rows < 2 || o->max_rows > (1 << 20) || o->time_reps < 0)
        return ls_fail(err, LS_E_USAGE,
                       "GEMM qualification: max_rows %" PRId64 " (2 .. 1048576), time_reps %d",
                       o->max_rows, o->time_reps);
    q->n = o->n;
    q->k = o->k;
    q->max_rows = o->max_rows;
    q->seed = o->seed;
    q->cublaslt_version = ls_gemm_lt_version();
    LS_GO(device_facts(&q->cc_major, &q->cc_minor, q->gpu, sizeof q->gpu, err));
    LS_GO(m_set(q->max_rows, &q->ms, &q->n_ms, err));
    LS_GO(qbufs_init(q, &b, err));
    LS_GO(desc_create(&d, q->n, q->k, 1, err));
    LS_GO(qualify_heuristic(lt, q, &b, &d, &cand_cap, err));
    LS_GO(enumerate(lt, q, &d, o, &cand_cap, err));
    if (progress) {
        int from_h = 0;
        for (int i = 0; i < q->n_cand; i++) from_h += q->cand[i].from_heuristic;
        fprintf(progress,
                "gemm [%" PRId64 " x %" PRId64 "]: %d algorithm ids, %ld configurations checked, "
                "%d valid, %d candidates (%d from the heuristic), %d not tried\n",
                q->n, q->k, q->n_algo_ids, q->n_checked, q->n_valid, q->n_cand, from_h,
                q->n_not_tried);
    }
    double best_t = 0.0;
    for (int i = 0; i < q->n_cand; i++) {
        ls_gemm_candidate *c = &q->cand[i];
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double spent = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (o->max_seconds > 0.0 && spent > o->max_seconds) {
            /* the rest stay "not run": recorded, never qualified */
            for (int j = i; j < q->n_cand; j++)
                snprintf(q->cand[j].fail_reason, sizeof q->cand[j].fail_reason,
                         "not run: the %.0f s limit was reached", o->max_seconds);
            q->n_not_run = q->n_cand - i;
            if (progress)
                fprintf(progress, "gemm [%" PRId64 " x %" PRId64 "]: time limit (%.0f s) after %d "
                        "of %d candidates\n", q->n, q->k, o->max_seconds, i, q->n_cand);
            break;
        }
        LS_GO(qualify_one(lt, q, &b, &d, o, c, err));
        if (c->qualified) {
            double t = 0.0;
            for (int j = 0; j < LS_GEMM_TIMED_MS; j++) t += c->us[j];
            if (q->best < 0 || t < best_t) {
                q->best = i;
                best_t = t;
            }
        }
        if (progress && (i + 1) % 64 == 0)
            fprintf(progress, "gemm [%" PRId64 " x %" PRId64 "]: %d of %d candidates\n", q->n, q->k,
                    i + 1, q->n_cand);
    }
done:
    desc_destroy(&d);
    qbufs_free(&b);
    return st;
}

ls_status ls_gemm_qual_pin(const ls_gemm_qual *q, int index, ls_gemm_pin *out, ls_error *err)
{
    memset(out, 0, sizeof *out);
    if (index < 0 || index >= q->n_cand)
        return ls_fail(err, LS_E_USAGE, "GEMM candidate %d of %d", index, q->n_cand);
    const ls_gemm_candidate *c = &q->cand[index];
    char cfgs[200];
    ls_gemm_config_str(&c->cfg, cfgs, sizeof cfgs);
    if (!c->qualified) {
        if (c->fail_row >= 0)
            return ls_fail(err, LS_E_UNSUPPORTED,
                           "GEMM [%" PRId64 " x %" PRId64 "] (%s) is not row-invariant: at M = %"
                           PRId64 ", row %" PRId64 " (input row %" PRId64 ") column %" PRId64
                           " is 0x%08" PRIx32 ", 0x%08" PRIx32 " at M = %" PRId64 "; not pinned",
                           q->n, q->k, cfgs, c->fail_m, c->fail_row, c->fail_input_row,
                           c->fail_col, c->fail_got_bits, c->fail_want_bits, q->max_rows);
        return ls_fail(err, LS_E_UNSUPPORTED, "GEMM [%" PRId64 " x %" PRId64 "] (%s) did not "
                       "qualify: %s; not pinned", q->n, q->k, cfgs,
                       c->fail_reason[0] ? c->fail_reason : "not run");
    }
    out->n = q->n;
    out->k = q->k;
    out->cfg = c->cfg;
    out->cublaslt_version = q->cublaslt_version;
    out->cc_major = q->cc_major;
    out->cc_minor = q->cc_minor;
    out->qualified_rows = q->max_rows;
    return LS_OK;
}

ls_status ls_gemm_qual_admits(const ls_gemm_qual *q, const ls_gemm_pin *p, ls_error *err)
{
    char cfgs[200];
    ls_gemm_config_str(&p->cfg, cfgs, sizeof cfgs);
    if (p->n != q->n || p->k != q->k)
        return ls_fail(err, LS_E_UNSUPPORTED, "record for [%" PRId64 " x %" PRId64 "], this "
                       "qualification is of [%" PRId64 " x %" PRId64 "]", p->n, p->k, q->n, q->k);
    if (p->cublaslt_version != q->cublaslt_version || p->cc_major != q->cc_major ||
        p->cc_minor != q->cc_minor)
        return ls_fail(err, LS_E_UNSUPPORTED, "record from cuBLASLt %" PRId64 " on cc %d.%d, this "
                       "qualification ran cuBLASLt %" PRId64 " on cc %d.%d", p->cublaslt_version,
                       p->cc_major, p->cc_minor, q->cublaslt_version, q->cc_major, q->cc_minor);
    if (p->qualified_rows > q->max_rows)
        return ls_fail(err, LS_E_UNSUPPORTED, "record claims %" PRId64 " rows, this qualification "
                       "covered %" PRId64, p->qualified_rows, q->max_rows);
    for (int i = 0; i < q->n_cand; i++) {
        if (!ls_gemm_config_equal(&q->cand[i].cfg, &p->cfg)) continue;
        if (q->cand[i].qualified) return LS_OK;
        ls_error why;
        ls_gemm_pin unused;
        ls_error_clear(&why);
        (void)ls_gemm_qual_pin(q, i, &unused, &why);
        return ls_fail(err, LS_E_UNSUPPORTED, "record (%s) names an unqualified algorithm: %s",
                       cfgs, why.msg);
    }
    return ls_fail(err, LS_E_UNSUPPORTED, "record (%s) names an algorithm this qualification of [%"
                   PRId64 " x %" PRId64 "] did not try", cfgs, q->n, q->k);
}

/* ---- the table ---------------------------------------------------------------------------------------- */
static void md_time(FILE *f, double us)
{
    if (us > 0.0)
        fprintf(f, " %.1f |", us);
    else
        fprintf(f, " – |");
}

void ls_gemm_qual_write_markdown(const ls_gemm_qual *q, FILE *f)
{
    char cfgs[200];
    int n_ok = 0, n_bits = 0, n_refused = 0;
    for (int i = 0; i < q->n_cand; i++) {
        const ls_gemm_candidate *c = &q->cand[i];
        if (c->qualified)
            n_ok++;
        else if (c->fail_row >= 0)
            n_bits++;
        else
            n_refused++;
    }
    fprintf(f, "### GEMM [%" PRId64 " x %" PRId64 "] (y = x Wᵀ, bf16 inputs, fp32 accumulate and "
            "output)\n\n", q->n, q->k);
    fprintf(f, "- device: %s (cc %d.%d), cuBLASLt %" PRId64 "\n", q->gpu, q->cc_major, q->cc_minor,
            q->cublaslt_version);
    fprintf(f, "- M set (%d values): 1 .. %" PRId64 ", then 2^j - 1, 2^j, 2^j + 1 up to %" PRId64
            "; input row 0 at the first, middle and last position of every run, the other rows "
            "rotated; seed 0x%" PRIx64 "\n", q->n_ms, q->max_rows < 64 ? q->max_rows : (int64_t)64,
            q->max_rows, q->seed);
    fprintf(f, "- enumeration: %d algorithm ids, %ld configurations checked, %d accepted by "
            "cublasLtMatmulAlgoCheck at M = %" PRId64 " with split-K 1 and no reduction scheme; "
            "%d candidates run, %d not run (candidate limit); %d ids cut at %ld checks\n",
            q->n_algo_ids, q->n_checked, q->n_valid, q->max_rows, q->n_cand, q->n_not_tried,
            q->n_ids_cut, LS_GEMM_CHECKS_PER_ALGO);
    fprintf(f, "- result: **%d qualified**, %d not row-invariant, %d refused at some M by "
            "cuBLASLt or not rebuildable, %d not run (time limit)\n", n_ok, n_bits,
            n_refused - q->n_not_run, q->n_not_run);
    if (q->best >= 0) {
        ls_gemm_config_str(&q->cand[q->best].cfg, cfgs, sizeof cfgs);
        fprintf(f, "- fastest qualified (least sum of the times at M = 1, 32, 256): `%s`\n", cfgs);
    } else {
        fprintf(f, "- fastest qualified: **none qualified**\n");
    }
    fprintf(f, "\n#### The default heuristic (cublasLtMatmulAlgoGetHeuristic, first pick per M)\n\n");
    fprintf(f, "%d distinct picks over the %d Ms; %d Ms pick split-K > 1 or a reduction scheme; ",
            q->heur_n_configs, q->n_ms, q->heur_splitk_ms);
    if (q->heur_first_row0_change > 0)
        fprintf(f, "row 0 first changes bits at **M = %" PRId64 "** (against its pick at M = 1).\n\n",
                q->heur_first_row0_change);
    else
        fprintf(f, "row 0 keeps its bits at every M.\n\n");
    fprintf(f, "| M | pick | workspace bytes | row 0 cols differing from M = 1 | probe elements "
            "differing (first, middle, last) |\n|---|---|---|---|---|\n");
    for (int r = 0; r < q->n_heur; r++) {
        const ls_gemm_heuristic_row *h = &q->heur[r];
        if (h->cfg.algo_id < 0) {
            fprintf(f, "| %" PRId64 " | no pick | – | – | – |\n", h->m);
            continue;
        }
        ls_gemm_config_str(&h->cfg, cfgs, sizeof cfgs);
        fprintf(f, "| %" PRId64 " | `%s` | %zu | %" PRId64 " | %" PRId64 " |\n", h->m, cfgs,
                h->workspace_bytes, h->row0_diff_cols, h->probe_diff_cols);
    }
    fprintf(f, "\n#### Candidates (split-K 1, no reduction scheme)\n\n");
    fprintf(f, "| # | configuration | heuristic | numerical flags | workspace bytes | result | "
            "µs M=1 | µs M=32 | µs M=256 |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < q->n_cand; i++) {
        const ls_gemm_candidate *c = &q->cand[i];
        ls_gemm_config_str(&c->cfg, cfgs, sizeof cfgs);
        fprintf(f, "| %d%s | `%s` | %s | 0x%" PRIx64 " | %zu | ", i, i == q->best ? " **best**" : "",
                cfgs, c->from_heuristic ? "yes" : "", c->numerical_flags, c->workspace_bytes);
        if (c->qualified)
            fprintf(f, "qualified |");
        else if (c->fail_row >= 0)
            fprintf(f, "fails at M = %" PRId64 ", row %" PRId64 " (input row %" PRId64 "), col %"
                    PRId64 ": 0x%08" PRIx32 " vs 0x%08" PRIx32 " |", c->fail_m, c->fail_row,
                    c->fail_input_row, c->fail_col, c->fail_got_bits, c->fail_want_bits);
        else
            fprintf(f, "%s |", c->fail_reason[0] ? c->fail_reason : "not run");
        for (int t = 0; t < LS_GEMM_TIMED_MS; t++) md_time(f, c->us[t]);
        fprintf(f, "\n");
    }
    fprintf(f, "\n");
}
