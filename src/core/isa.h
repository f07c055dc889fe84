/* lockstep — hot host loops compiled for wider vector units as well as for
 * the build's baseline, the instance chosen at run time by what the CPU has.
 *
 * A loop is written once as an LS_ISA_BODY function (always inlined) of
 * fixed-count loops over independent lanes, which the compiler vectorises
 * at -O2, and wrapped twice: a plain function, and one marked
 * LS_TARGET_AVX2 or LS_TARGET_AVX512. The bits are the same in every
 * instance: the integer operations are exact, a vector fp32 multiply, add
 * or divide is the same IEEE operation as a scalar one, and the build
 * forbids contraction into FMA for every target (-ffp-contract=off), so a
 * wider instance changes the speed and nothing else. The test suite runs
 * the baseline instances beside the wider ones (LOCKSTEP_CPU_ISA below) and
 * compares their traces. On compilers or machines without these targets
 * the marks are empty and the checks say 0. */
#ifndef LS_CORE_ISA_H
#define LS_CORE_ISA_H

#define LS_ISA_BODY static inline __attribute__((always_inline))

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LS_TARGET_AVX2 __attribute__((target("avx2")))
#define LS_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw")))
#else
#define LS_TARGET_AVX2
#define LS_TARGET_AVX512
#endif

/* 1 when the wider instance may run: the CPU has AVX2 (AVX-512 with the
 * 64-bit multiply and 8/16-bit lanes: f, dq, vl, bw) and the environment
 * does not set LOCKSTEP_CPU_ISA=baseline (any other value: the widest the
 * CPU has). Read once, then cached. */
int ls_cpu_has_avx2(void);
int ls_cpu_has_avx512(void);

#endif
