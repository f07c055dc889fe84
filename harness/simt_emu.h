/* lockstep — a small SIMT emulation on the host, for running CUDA kernel
 * source without a GPU (harness/gdn_chunked_emu.cpp, harness/gdn_tc_emu.cpp).
 *
 * Each CUDA thread of a block is a ucontext fiber; __syncthreads and the warp
 * shuffles are barriers over the block's or the warp's fibers (a shuffle:
 * every lane stores, barrier, reads its partner, barrier), so the kernels run
 * as written, one block at a time. Static shared memory is a function-static
 * array (one block runs at a time); dynamic shared memory is emu_dyn_smem,
 * filled with a NaN pattern before each block so that a value read before it
 * is written shows. cp.async copies at once. It proves nothing about the
 * GPU's scheduling (racecheck on a GPU does that), only that the source's
 * arithmetic and indexing do what the host reference does. */
#ifndef LS_HARNESS_SIMT_EMU_H
#define LS_HARNESS_SIMT_EMU_H

#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>

extern "C" {
#include "numerics/reduce.h"
}

/* ---- the CUDA names kernels use ------------------------------------------------------- */
struct emu_dim {
    unsigned x, y, z;
};
static emu_dim threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static /* one block runs at a time */
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define LS_WARP 32
#define LS_FULL_MASK 0xffffffffu

struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
/* cp.async: the copy at once; a thread's later wait is then a no-op */
static inline void __pipeline_memcpy_async(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static inline void __pipeline_commit() {}
static inline void __pipeline_wait_prior(int) {}

/* programmatic dependent launch (kernels/launch.cuh): kernels run one after another here */
static inline void ls_pdl_entry() {}
static inline void ls_pdl_wait() {}
static inline void ls_pdl_release() {}

static inline float ls_act_d(float x, int act_bf16)
{
    return act_bf16 ? ls_round_bf16(x) : x;
}

/* ---- fibers and barriers ----------------------------------------------------------------- */
#define EMU_MAX_THREADS 512
#define EMU_DYN_SMEM (256 * 1024)
static ucontext_t emu_sched, emu_ctx[EMU_MAX_THREADS];
static int emu_cur, emu_threads, emu_done, emu_finished[EMU_MAX_THREADS];
static int emu_arrived[1 + EMU_MAX_THREADS / 32]; /* group 0: the block; 1 + w: warp w */
static long emu_gen[1 + EMU_MAX_THREADS / 32];
static float emu_lanes[EMU_MAX_THREADS / 32][32]; /* a warp's shuffle exchange */
alignas(128) static unsigned char emu_dyn_smem[EMU_DYN_SMEM];

static void emu_barrier(int g, int size)
{
    long my = emu_gen[g];
    if (++emu_arrived[g] == size) {
        emu_arrived[g] = 0;
        emu_gen[g]++;
        return;
    }
    while (emu_gen[g] == my) swapcontext(&emu_ctx[emu_cur], &emu_sched);
}

static void __syncthreads() { emu_barrier(0, emu_threads); }
static void __syncwarp() { emu_barrier(1 + (int)threadIdx.x / 32, 32); }

static float emu_shuffle(float v, int from)
{
    int w = (int)threadIdx.x / 32;
    __syncwarp();
    emu_lanes[w][threadIdx.x % 32] = v;
    __syncwarp();
    float r = emu_lanes[w][from];
    __syncwarp();
    return r;
}

static inline float __shfl_xor_sync(unsigned, float v, int s) { return emu_shuffle(v, (int)(threadIdx.x % 32) ^ s); }
static inline float __shfl_sync(unsigned, float v, int src) { return emu_shuffle(v, src); }

static std::function<void()> *emu_body;
static char emu_stacks[EMU_MAX_THREADS][64 * 1024];

static void emu_fiber()
{
    (*emu_body)();
    emu_finished[emu_cur] = 1;
    emu_done++;
    swapcontext(&emu_ctx[emu_cur], &emu_sched);
}

/* Runs body as a grid (gx, gy, gz) of blocks of nt threads, one block at a time. */
static void emu_launch(unsigned gx, unsigned gy, unsigned nt, std::function<void()> body, unsigned gz = 1)
{
    if (nt > EMU_MAX_THREADS || nt % 32 != 0) {
        fprintf(stderr, "simt_emu: a block of %u threads (at most %d, whole warps)\n", nt, EMU_MAX_THREADS);
        exit(2);
    }
    blockDim = {nt, 1, 1};
    gridDim = {gx, gy, gz};
    emu_body = &body;
    static unsigned bz, by, bx; /* live across swapcontext, which returns like setjmp */
    for (bz = 0; bz < gz; bz++)
        for (by = 0; by < gy; by++)
            for (bx = 0; bx < gx; bx++) {
                emu_threads = (int)nt;
                emu_done = 0;
                memset(emu_arrived, 0, sizeof emu_arrived);
                memset(emu_dyn_smem, 0xff, sizeof emu_dyn_smem); /* NaN in every float */
                for (unsigned t = 0; t < nt; t++) {
                    emu_finished[t] = 0;
                    getcontext(&emu_ctx[t]);
                    emu_ctx[t].uc_stack.ss_sp = emu_stacks[t];
                    emu_ctx[t].uc_stack.ss_size = sizeof emu_stacks[t];
                    emu_ctx[t].uc_link = NULL;
                    makecontext(&emu_ctx[t], emu_fiber, 0);
                }
                while (emu_done < (int)nt)
                    for (emu_cur = 0; emu_cur < (int)nt; emu_cur++) {
                        if (emu_finished[emu_cur]) continue;
                        threadIdx = {(unsigned)emu_cur, 0, 0};
                        blockIdx = {bx, by, bz};
                        swapcontext(&emu_sched, &emu_ctx[emu_cur]);
                    }
            }
}

#endif
