/* lockstep — which instance of the hot host loops runs (core/isa.h). */
#include "core/isa.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { ISA_UNKNOWN = -1, ISA_BASELINE, ISA_AVX2, ISA_AVX512 };

static int detect(void)
{
    const char *env = getenv("LOCKSTEP_CPU_ISA");
    if (env && !strcmp(env, "baseline")) return ISA_BASELINE;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2")) return ISA_AVX2;
#endif
    return ISA_BASELINE;
}

static int isa(void)
{
    static atomic_int cached = ISA_UNKNOWN; /* threads that race store the same value */
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v == ISA_UNKNOWN) {
        v = detect();
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

int ls_cpu_has_avx2(void)
{
    return isa() >= ISA_AVX2;
}

int ls_cpu_has_avx512(void)
{
    return isa() >= ISA_AVX512;
}
