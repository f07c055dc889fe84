/* lockstep — the element types every layer shares: reduction-order ids,
 * weight element types, and the weight matrix view (a borrowed pointer to a
 * row-major matrix as stored). Plain data, used by the model binding, the CPU
 * reference and the operator table alike. */
#ifndef LS_NUMERICS_TYPES_H
#define LS_NUMERICS_TYPES_H

#include <stdint.h>

#include "numerics/reduce.h"

typedef enum ls_order {
    LS_ORDER_CANONICAL = 0,    /* LS_DOT32 / sequential, docs/numerics.md §2 */
    LS_ORDER_REVERSED = 1      /* perturbation: sequential from the last element */
} ls_order;

typedef enum ls_wtype {
    LS_WTYPE_BF16 = 0,         /* uint16_t elements */
    LS_WTYPE_F32 = 1           /* float elements */
} ls_wtype;

/* A weight matrix [rows, cols], row-major, as stored (borrowed pointer). */
typedef struct ls_wmat {
    const void *data;          /* [rows, cols] */
    ls_wtype wtype;
    long rows, cols;
} ls_wmat;

/* act(x): bf16 rounding in bf16 activation mode, identity otherwise. */
static inline float ls_act(float x, int act_bf16)
{
    return act_bf16 ? ls_round_bf16(x) : x;
}

/* Element (r, c) of a weight matrix, widened to fp32. */
static inline float ls_wmat_at(const ls_wmat *w, long r, long c)
{
    if (w->wtype == LS_WTYPE_BF16) return ls_bf16_to_f32(((const uint16_t *)w->data)[r * w->cols + c]);
    return ((const float *)w->data)[r * w->cols + c];
}

#endif
