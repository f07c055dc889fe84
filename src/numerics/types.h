/* lockstep — the element types every layer shares: reduction-order ids,
 * weight element types, and the weight matrix view (a borrowed pointer to a
 * row-major matrix as stored). Plain data, used by the model binding, the CPU
 * reference and the operator table alike. */
#ifndef LS_NUMERICS_TYPES_H
#define LS_NUMERICS_TYPES_H

#include <stdint.h>

#include "core/status.h"
#include "numerics/fp8.h"
#include "numerics/reduce.h"

/* The logprob summary (ls_cpu_lp_summary, its kernel): at most this many
 * top entries, and the words of one row's summary. */
#define LS_LP_SUMMARY_KMAX 5
#define LS_LP_SUMMARY_WORDS(k) (2 * (k) + 2)

typedef enum ls_order {
    LS_ORDER_CANONICAL = 0,    /* LS_DOT32 / sequential, docs/numerics.md §2 */
    LS_ORDER_REVERSED = 1,     /* perturbation: sequential from the last element */
    LS_ORDER_FAST_TWIN = 2     /* perturbation: the operator family's fast twin, on a backend
                                  that has one (ls_backend.fast_twins; docs/numerics.md §7) */
} ls_order;

/* How a weight matrix's elements enter a dot product. The two FP8 types
 * hold the same bytes (e4m3fn elements plus an fp32 scale per 128 x 128
 * block, numerics/fp8.h) and differ in the arithmetic (docs/numerics.md §9):
 * the model binds FP8 matrices as LS_WTYPE_F8_DEQUANT, and the engine turns
 * them into LS_WTYPE_F8_W8A8 when it runs in w8a8 mode. */
typedef enum ls_wtype {
    LS_WTYPE_BF16 = 0,         /* uint16_t elements */
    LS_WTYPE_F32 = 1,          /* float elements */
    LS_WTYPE_F8_DEQUANT = 2,   /* uint8_t e4m3 elements, dequantised to fp32: W = q · s */
    LS_WTYPE_F8_W8A8 = 3       /* uint8_t e4m3 elements against per-token-group quantised
                                  activations, per 128-wide K block */
} ls_wtype;

/* 1 for the FP8 weight types (e4m3 elements with block scales). */
static inline int ls_wtype_is_f8(ls_wtype t)
{
    return t == LS_WTYPE_F8_DEQUANT || t == LS_WTYPE_F8_W8A8;
}

/* Bytes per stored element. */
static inline long ls_wtype_bytes(ls_wtype t)
{
    return t == LS_WTYPE_BF16 ? 2 : t == LS_WTYPE_F32 ? 4 : 1;
}

/* A matrix without data whose values are generated where they are needed
 * (a synthetic model's, model.h): fill writes rows r0 .. r0 + n - 1 of the
 * whole matrix [R, cols] as stored into dst ([n, cols] of its wtype; FP8:
 * e4m3 bytes) and, for an FP8 matrix, their block scales into scale
 * ([ceil(n/128), ceil(cols/128)] fp32; r0 and n then fall on 128-row
 * blocks). The values of a row depend on the row alone, so a rank that
 * generates its slice gets the bytes of the same rows of the whole. */
typedef struct ls_wgen ls_wgen;
struct ls_wgen {
    ls_status (*fill)(const ls_wgen *g, long r0, long n, long cols, void *dst, float *scale,
                      ls_error *err);
    /* The same values as parameters a device generator computes them from
     * (docs/synth.md "The generator"): element j of the whole matrix
     * (row-major) is bf16_rne(base + fp32(fp32(ih_j) · c)), ih_j the centred
     * Irwin–Hall integer of splitmix64 draw j under key; an FP8 matrix's
     * bytes are those values quantised per 128 x 128 block (scale = amax /
     * 448, 1 for an all-zero block). */
    int normal;                /* 1: key, c, base and rows are set */
    uint64_t key;
    float c, base;
    long rows;                 /* of the whole matrix */
};

/* A weight matrix [rows, cols], row-major, as stored (borrowed pointer). */
typedef struct ls_wmat {
    const void *data;          /* [rows, cols]; NULL for a synthetic model's matrix */
    ls_wtype wtype;
    long rows, cols;
    const float *scale;        /* FP8 only: [LS_FP8_BLOCKS(rows), LS_FP8_BLOCKS(cols)] fp32, the
                                  checkpoint's weight_scale_inv (borrowed); NULL otherwise */
    const ls_wgen *gen;        /* data == NULL: generates the values (borrowed from the model);
                                  NULL otherwise */
    long gen_row0;             /* gen: the row of the generated matrix this one starts at (a
                                  row range of it, as tensor parallelism wraps) */
} ls_wmat;

/* act(x): bf16 rounding in bf16 activation mode, identity otherwise. */
static inline float ls_act(float x, int act_bf16)
{
    return act_bf16 ? ls_round_bf16(x) : x;
}

/* The scale row of weight row r of an FP8 matrix [LS_FP8_BLOCKS(cols)]. */
static inline const float *ls_wmat_scale_row(const ls_wmat *w, long r)
{
    return w->scale + (r / LS_FP8_BLOCK) * LS_FP8_BLOCKS(w->cols);
}

/* Element (r, c) of a weight matrix, widened to fp32 (FP8: dequantised,
 * fp32(q) · scale rounded once). */
static inline float ls_wmat_at(const ls_wmat *w, long r, long c)
{
    if (w->wtype == LS_WTYPE_BF16) return ls_bf16_to_f32(((const uint16_t *)w->data)[r * w->cols + c]);
    if (ls_wtype_is_f8(w->wtype))
        return ls_fp8_dequant(((const uint8_t *)w->data)[r * w->cols + c],
                              ls_wmat_scale_row(w, r)[c / LS_FP8_BLOCK]);
    return ((const float *)w->data)[r * w->cols + c];
}

#endif
