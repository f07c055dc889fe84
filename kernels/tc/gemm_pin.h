/* lockstep — pinned cuBLASLt GEMM algorithms for the tensor-core strict tier
 * (docs/tensor-core-tier.md §2; docs/numerics.md rules 1 and 3).
 *
 * The GEMM is a strict linear y = x Wᵀ: x [M, K] bf16 row-major (M = rows,
 * the tokens of a call), W [N, K] bf16 row-major (the weight as stored),
 * y [M, N] fp32 row-major, fp32 accumulation, alpha 1, beta 0. In cuBLASLt's
 * column-major terms that is D [N, M] = op(A) B with A = W (stored K x N,
 * ld K, op T), B = x (stored K x M, ld K, op N), D ld N: the "TN" GEMM, and
 * the batch dimension M is BLAS n.
 *
 * cuBLASLt's heuristic picks an algorithm per (M, N, K), so a row's bits can
 * change with M. Here an algorithm is instead chosen once per weight shape:
 *   1. ls_gemm_qualify lists the candidate configurations (every algorithm
 *      id, tile, stages, CTA swizzle and custom option cuBLASLt accepts,
 *      split-K 1, no reduction scheme), runs each on fixed random inputs at
 *      every M of a set (1..64, then 2^j - 1, 2^j, 2^j + 1 up to max_rows,
 *      and max_rows) with one probe row placed first, in the middle and last
 *      and the other rows rotated, and accepts a candidate only when every
 *      row of every run equals, bit for bit, the same input row's output in
 *      the reference run (M = max_rows, rows in order). It also records what
 *      the default heuristic does at each M (its pick, and whether row 0
 *      keeps its bits): the evidence that pinning is needed.
 *   2. ls_gemm_qual_pin turns a qualified candidate into a record
 *      (ls_gemm_pin, canonical one-line JSON by ls_gemm_pin_format) and
 *      ls_gemm_pin_rebuild turns a record back into a runnable plan, failing
 *      closed when this cuBLASLt or GPU cannot run exactly that configuration.
 *
 * The CUDA backend's tc tier (backend_cuda.h tier) qualifies and pins every
 * linear shape through these at engine start and records the pins in the
 * manifest (numerics.tc_gemms); its fast tier runs ls_gemm_fast_run. Everything here is callable
 * from C without CUDA headers; device pointers are plain pointers, streams
 * opaque (NULL = the default stream). Every failing CUDA or cuBLASLt call is
 * reported with LS_E_DEVICE naming the call, file and line. */
#ifndef LS_KERNELS_TC_GEMM_PIN_H
#define LS_KERNELS_TC_GEMM_PIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- one algorithm configuration --------------------------------------------- */
/* The cuBLASLt algorithm configuration attributes (cublasLtMatmulAlgoConfig*),
 * as their enum values; together with the shape, dtypes and cuBLASLt version
 * they name exactly one kernel and launch. */
typedef struct ls_gemm_config {
    int32_t algo_id;        /* CUBLASLT_ALGO_CONFIG_ID (cublasLtMatmulAlgoGetIds) */
    uint32_t tile;          /* CUBLASLT_ALGO_CONFIG_TILE_ID, a cublasLtMatmulTile_t */
    uint32_t stages;        /* CUBLASLT_ALGO_CONFIG_STAGES_ID, a cublasLtMatmulStages_t */
    int32_t splitk;         /* CUBLASLT_ALGO_CONFIG_SPLITK_NUM; strict: 1 */
    uint32_t reduction;     /* CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME; strict: 0 (none) */
    uint32_t swizzle;       /* CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, 0 or 1 */
    uint32_t custom;        /* CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION */
    uint32_t inner_shape;   /* CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID (a uint16_t there) */
    uint32_t cluster_shape; /* CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID (uint16_t); 0 = library's choice */
} ls_gemm_config;

/* "id 6 tile 20 stages 8 splitk 1 red 0 swz 1 cust 0 inner 0 cluster 2" into buf. */
void ls_gemm_config_str(const ls_gemm_config *c, char *buf, size_t cap);
/* 1 when every field is equal. */
int ls_gemm_config_equal(const ls_gemm_config *a, const ls_gemm_config *b);

/* ---- the pinned-algorithm record ------------------------------------------------ */
#define LS_GEMM_PIN_KIND "linear_bf16_f32_tn" /* x bf16, W bf16 [N, K], y fp32, fp32 accumulate */

typedef struct ls_gemm_pin {
    int64_t n, k;             /* weight shape [N, K] */
    ls_gemm_config cfg;       /* the pinned configuration */
    int64_t cublaslt_version; /* cublasLtGetVersion() of the qualifying run */
    int cc_major, cc_minor;   /* compute capability of the qualifying GPU */
    int64_t qualified_rows;   /* largest M the qualification covered (every M up to it in the set) */
} ls_gemm_pin;

/* Canonical one-line JSON of a record, keys in a fixed order, no spaces:
 * {"kind":"linear_bf16_f32_tn","n":2048,"k":4096,"algo_id":..,"tile":..,
 *  "stages":..,"splitk":1,"reduction":0,"swizzle":..,"custom":..,
 *  "inner_shape":..,"cluster_shape":..,"cublaslt_version":..,"cc":"9.0",
 *  "qualified_rows":1024}
 * Equal records give equal bytes. LS_E_USAGE when cap is too small. */
ls_status ls_gemm_pin_format(const ls_gemm_pin *p, char *buf, size_t cap, ls_error *err);

/* Parses a record (any JSON spacing; every key required, no other key).
 * LS_E_INPUT names the key that is missing, unknown or of the wrong type;
 * LS_E_UNSUPPORTED refuses a record that cannot be strict whatever the GPU:
 * split-K other than 1, a reduction scheme, qualified_rows < 1. */
ls_status ls_gemm_pin_parse(const char *text, ls_gemm_pin *out, ls_error *err);

/* ---- cuBLASLt context -------------------------------------------------------------- */
typedef struct ls_gemm_lt ls_gemm_lt; /* cuBLASLt handle + device workspace; opaque */

/* Creates the handle on the current device and a device workspace of
 * workspace_bytes (cudaMalloc). *out owned by the caller: ls_gemm_lt_destroy. */
ls_status ls_gemm_lt_create(size_t workspace_bytes, ls_gemm_lt **out, ls_error *err);
void ls_gemm_lt_destroy(ls_gemm_lt *lt); /* NULL is fine */
/* cublasLtGetVersion() of the loaded library, e.g. 130100 for 13.1.0. */
int64_t ls_gemm_lt_version(void);

/* ---- a rebuilt, runnable plan ---------------------------------------------------------- */
typedef struct ls_gemm_plan ls_gemm_plan; /* descriptors + algorithm for one record; opaque */

/* Builds exactly the record's configuration on this cuBLASLt and GPU and
 * checks it (cublasLtMatmulAlgoCheck) at M = 1 and M = qualified_rows.
 * Fails closed with LS_E_UNSUPPORTED and the reason when: the record is not
 * strict (split-K != 1, a reduction scheme), the cuBLASLt version or the
 * compute capability differs from the qualifying run's (requalify), the
 * algorithm id is unknown here, a tile, stages, swizzle or custom option is
 * outside this algorithm's capabilities, or cuBLASLt's check refuses the
 * configuration or needs more workspace than lt has. *out owned by the
 * caller (ls_gemm_plan_destroy); lt must outlive it. */
ls_status ls_gemm_pin_rebuild(ls_gemm_lt *lt, const ls_gemm_pin *p, ls_gemm_plan **out,
                              ls_error *err);
void ls_gemm_plan_destroy(ls_gemm_plan *plan); /* NULL is fine */

/* y = x Wᵀ with the pinned algorithm on `stream`, asynchronously.
 * w: [N, K] bf16 device; x: [m, K] bf16 device; y: [m, N] fp32 device.
 * Pointers 16-byte aligned. LS_E_UNSUPPORTED for m < 1 or m > qualified_rows
 * (rows the qualification did not cover). Not thread-safe on one plan. */
ls_status ls_gemm_plan_run(ls_gemm_plan *plan, const uint16_t *w, const uint16_t *x, float *y,
                           int64_t m, void *stream, ls_error *err);

/* ---- unpinned: the default heuristic per call ------------------------------------ */
/* What serving engines do, for the fast tier (docs/tensor-core-tier.md §6):
 * the same GEMM with cuBLASLt's default heuristic asked at each M (its first
 * pick, remembered per M), split-K and reduction schemes allowed. Not row-
 * invariant: a row's bits may change with the rows beside it. */
typedef struct ls_gemm_fast ls_gemm_fast;

/* For shape (n, k) (multiples of 8) and calls of 1 .. max_rows rows; lt must
 * outlive it. */
ls_status ls_gemm_fast_create(ls_gemm_lt *lt, int64_t n, int64_t k, int64_t max_rows, ls_gemm_fast **out,
                              ls_error *err);
void ls_gemm_fast_destroy(ls_gemm_fast *f); /* NULL is fine */
/* y [m, N] = x [m, K] Wᵀ as ls_gemm_plan_run, with the heuristic's pick at m. */
ls_status ls_gemm_fast_run(ls_gemm_fast *f, const uint16_t *w, const uint16_t *x, float *y, int64_t m,
                           void *stream, ls_error *err);

/* ---- qualification ---------------------------------------------------------------------- */
typedef struct ls_gemm_qualify_opts {
    int64_t n, k;            /* weight shape [N, K]; K a multiple of 8 */
    int64_t max_rows;        /* largest M qualified (>= 2) */
    uint64_t seed;           /* the random inputs */
    int max_candidates;      /* candidates qualified at most (heuristic picks first); 0 = all */
    int max_per_algo;        /* configurations kept per algorithm id at most; 0 = all (default) */
    int time_reps;           /* timed calls per M (after 3 warm-up calls) */
    double max_seconds;      /* stop starting candidates after this long (from the call's
                                start, enumeration included); 0 = no limit */
} ls_gemm_qualify_opts;

void ls_gemm_qualify_opts_default(ls_gemm_qualify_opts *o);

#define LS_GEMM_TIMED_MS 3 /* times at M = 1, 32, 256 */
extern const int64_t ls_gemm_timed_m[LS_GEMM_TIMED_MS];

typedef struct ls_gemm_candidate {
    ls_gemm_config cfg;        /* split-K 1, reduction 0 */
    int from_heuristic;        /* 1: the default heuristic listed it (top picks, split-K 1) */
    uint64_t numerical_flags;  /* CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS (HMMA, accumulator, inputs) */
    size_t workspace_bytes;    /* cublasLtMatmulAlgoCheck's need at max_rows */
    int qualified;             /* 1: every row bit-equal at every M and position */
    int64_t fail_m;            /* first failure: M of the run (-1: none) */
    int64_t fail_row;          /* row within that run */
    int64_t fail_col;          /* first differing column of that row */
    int64_t fail_input_row;    /* the input row it held (row of the reference run) */
    uint32_t fail_want_bits;   /* fp32 bits in the reference run */
    uint32_t fail_got_bits;    /* fp32 bits in run fail_m */
    char fail_reason[200];     /* "", or why it could not run at fail_m */
    uint64_t ref_hash;         /* ls_gemm_hash_f32 of the reference output [max_rows, N] */
    uint64_t row0_hash;        /* ls_gemm_hash_f32 of row 0 of the output at M = 1 */
    double us[LS_GEMM_TIMED_MS]; /* microseconds per call at ls_gemm_timed_m (0: not timed) */
} ls_gemm_candidate;

/* One M of the heuristic table. algo_id -1: no pick (or cuBLASLt refused to
 * run it) at this M; the diff counts are -1 where nothing was compared. */
typedef struct ls_gemm_heuristic_row {
    int64_t m;                 /* rows of the call */
    ls_gemm_config cfg;        /* the heuristic's first pick */
    size_t workspace_bytes;    /* its workspace */
    int64_t row0_diff_cols;    /* columns of row 0 whose bits differ from the pick at M = 1 */
    int64_t probe_diff_cols;   /* elements of the rows holding row 0's input (first, middle, last)
                                  that differ from row 0 at M = 1 */
} ls_gemm_heuristic_row;

typedef struct ls_gemm_qual {
    int64_t n, k, max_rows;
    uint64_t seed;
    int64_t cublaslt_version;
    int cc_major, cc_minor;
    char gpu[256];                  /* device name */
    int64_t *ms; int n_ms;          /* the M set, ascending; owned */
    int n_algo_ids;                 /* cublasLtMatmulAlgoGetIds */
    long n_checked;                 /* configurations put to cublasLtMatmulAlgoCheck */
    int n_valid;                    /* ... that it accepted (split-K 1, no reduction) */
    int n_not_tried;                /* valid ones left out by max_candidates */
    int n_not_run;                  /* candidates not run: max_seconds reached */
    int n_ids_cut;                  /* ids whose enumeration stopped at the per-id check limit */
    ls_gemm_candidate *cand; int n_cand; /* the candidates qualified; owned */
    int best;                       /* fastest qualified (least sum of the timed M), -1: none */
    ls_gemm_heuristic_row *heur; int n_heur; /* the default heuristic at every M of the set; owned */
    int heur_n_configs;             /* distinct first picks over the set */
    int64_t heur_first_row0_change; /* first M whose row 0 differs from M = 1 (-1: none) */
    int heur_splitk_ms;             /* Ms at which the first pick has split-K > 1 or a reduction */
    /* Device buffers kept for replays against the qualification (owned): */
    uint16_t *w_dev;                /* [N, K] bf16 */
    uint16_t *x_dev;                /* [max_rows, K] bf16, the reference run's rows */
} ls_gemm_qual;

/* Qualifies every candidate for shape (n, k) on the current device; fills
 * *q (free with ls_gemm_qual_free, also after a failure). A candidate that
 * fails is a result (qualified 0 with its first failing M and row), not an
 * error; errors are CUDA/cuBLASLt failures and bad options. Prints one
 * progress line per 64 candidates to `progress` when it is not NULL. */
ls_status ls_gemm_qualify(ls_gemm_lt *lt, const ls_gemm_qualify_opts *o, ls_gemm_qual *q,
                          FILE *progress, ls_error *err);
void ls_gemm_qual_free(ls_gemm_qual *q);

/* The record of candidate `index`. LS_E_UNSUPPORTED, naming the first
 * failing M and row, when that candidate did not qualify. */
ls_status ls_gemm_qual_pin(const ls_gemm_qual *q, int index, ls_gemm_pin *out, ls_error *err);

/* LS_OK when `p` names a candidate this qualification accepted (same shape,
 * configuration, cuBLASLt version, compute capability, qualified_rows no
 * larger); LS_E_UNSUPPORTED otherwise, saying which. */
ls_status ls_gemm_qual_admits(const ls_gemm_qual *q, const ls_gemm_pin *p, ls_error *err);

/* Markdown: the shape, device, cuBLASLt version, the M set, the heuristic
 * summary and its per-M table, then one row per candidate. */
void ls_gemm_qual_write_markdown(const ls_gemm_qual *q, FILE *f);

/* Order-independent 64-bit fingerprint of n fp32 values on the device (the
 * bits of element i mixed with i, summed mod 2^64): equal outputs give equal
 * hashes; a change of any bit changes it except with negligible chance. */
ls_status ls_gemm_hash_f32(const float *y_dev, int64_t n, uint64_t *out, ls_error *err);

#ifdef __cplusplus
}
#endif

#endif
