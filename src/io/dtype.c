/* lockstep — element types of safetensors tensors. */
#include <string.h>

#include "io/checkpoint.h"

/* Indexed by ls_dtype; spellings are the safetensors ones. */
static const struct {
    const char *name;
    size_t size_bytes;
} dtype_table[LS_DTYPE_COUNT] = {
    [LS_DTYPE_BF16] = {"BF16", 2},       [LS_DTYPE_F16] = {"F16", 2},
    [LS_DTYPE_F32] = {"F32", 4},         [LS_DTYPE_F64] = {"F64", 8},
    [LS_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [LS_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
    [LS_DTYPE_I8] = {"I8", 1},           [LS_DTYPE_U8] = {"U8", 1},
    [LS_DTYPE_I16] = {"I16", 2},         [LS_DTYPE_I32] = {"I32", 4},
    [LS_DTYPE_I64] = {"I64", 8},         [LS_DTYPE_BOOL] = {"BOOL", 1},
};

size_t ls_dtype_size(ls_dtype dt)
{
    /* 0 for an out-of-range value, so a caller's size check fails loudly. */
    if ((unsigned)dt >= LS_DTYPE_COUNT) return 0;
    return dtype_table[dt].size_bytes;
}

const char *ls_dtype_name(ls_dtype dt)
{
    if ((unsigned)dt >= LS_DTYPE_COUNT) return "?";
    return dtype_table[dt].name;
}

uint64_t ls_dtype_nonfinite_mask(ls_dtype dt)
{
    switch (dt) {
    case LS_DTYPE_BF16: return 0x7F80u;                 /* exponent 8 bits */
    case LS_DTYPE_F16: return 0x7C00u;                  /* exponent 5 bits */
    case LS_DTYPE_F32: return 0x7F800000u;              /* exponent 8 bits */
    case LS_DTYPE_F64: return 0x7FF0000000000000u;      /* exponent 11 bits */
    case LS_DTYPE_F8_E4M3: return 0x7Fu;                /* e4m3fn: only S.1111.111 is NaN, no infinities */
    case LS_DTYPE_F8_E5M2: return 0x7Cu;                /* exponent 5 bits, IEEE-like */
    default: return 0;                                  /* integers, BOOL */
    }
}

int ls_dtype_parse(const char *name, ls_dtype *out)
{
    if (!name) return -1;
    for (int i = 0; i < LS_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            if (out) *out = (ls_dtype)i;
            return 0;
        }
    }
    return -1;
}
