/* lockstep — what the GDN kernel emulators share (harness/gdn_chunked_emu.cpp,
 * harness/gdn_tc_emu.cpp): their random inputs and their bitwise comparison.
 * Include after harness/simt_emu.h and backend/cpu_ops.h. */
#ifndef LS_HARNESS_GDN_EMU_H
#define LS_HARNESS_GDN_EMU_H

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

static uint64_t emu_rng = 12345; /* a program may reseed it before its first case */

static float emu_rand(float scale) /* uniform in [-scale, scale) */
{
    emu_rng = emu_rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((float)((emu_rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f) * scale;
}

/* 1 when got holds want's bits; else names the first element that differs. */
static int emu_same(const char *what, const float *want, const float *got, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (__float_as_uint(want[i]) != __float_as_uint(got[i])) {
            printf("MISMATCH %s element %zu of %zu: 0x%08x (%.9g) expected, 0x%08x (%.9g) emulated\n", what, i, n,
                   __float_as_uint(want[i]), (double)want[i], __float_as_uint(got[i]), (double)got[i]);
            return 0;
        }
    return 1;
}

/* T rows of GDN inputs: q, k l2-normalised (q scaled), v, α in (0.5, 1], β bf16. */
static void emu_inputs(long T, long Hk, long Hv, long dk, long dv, int act, std::vector<float> &q,
                       std::vector<float> &k, std::vector<float> &v, std::vector<float> &al, std::vector<float> &be)
{
    q.resize(T * Hk * dk);
    k.resize(T * Hk * dk);
    v.resize(T * Hv * dv);
    al.resize(T * Hv);
    be.resize(T * Hv);
    for (size_t i = 0; i < q.size(); i++) {
        q[i] = act ? ls_round_bf16(emu_rand(1.0f)) : emu_rand(1.0f);
        k[i] = act ? ls_round_bf16(emu_rand(1.0f)) : emu_rand(1.0f);
    }
    ls_cpu_l2norm_scale(q.data(), T * Hk, dk, ls_cpu_inv_sqrt_scale(dk), LS_ORDER_CANONICAL);
    ls_cpu_l2norm_scale(k.data(), T * Hk, dk, 1.0f, LS_ORDER_CANONICAL);
    for (float &x : v) x = emu_rand(1.0f);
    for (long i = 0; i < T * Hv; i++) {
        al[i] = 0.5f + 0.5f * fabsf(emu_rand(1.0f));
        be[i] = ls_round_bf16(fabsf(emu_rand(1.0f)));
    }
}

#endif
