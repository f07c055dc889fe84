/* lockstep — device helpers of the GEMM qualification (internal to
 * kernels/tc/): the row comparison that decides whether a candidate is
 * row-invariant. ls_gemm_hash_f32 is declared in gemm_pin.h. */
#ifndef LS_KERNELS_TC_GEMM_ROWS_H
#define LS_KERNELS_TC_GEMM_ROWS_H

#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Compares row i of y [rows, n] with row map[i] of ref [*, n], bit for bit,
 * for every i with map[i] >= 0 (map: [rows] int32 device). On a difference,
 * *first_dev (device) becomes the least i * n + j that differs (atomicMin:
 * set it to UINT64_MAX before) and *count_dev (device) counts the differing
 * elements (set it to 0 before). Asynchronous on `stream`. */
ls_status ls_gemm_rows_diff(const float *y, const float *ref, const int32_t *map, int64_t rows,
                            int64_t n, unsigned long long *first_dev,
                            unsigned long long *count_dev, void *stream, ls_error *err);

#ifdef __cplusplus
}
#endif

#endif
