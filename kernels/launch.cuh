/* lockstep — how the library's step kernels are launched (internal to
 * kernels/): programmatic dependent launch (docs/architecture.md,
 * "Programmatic launch").
 *
 * A kernel launched by ls_launch may be started while the kernel before it
 * on the stream still runs, once every block of that kernel has called
 * ls_pdl_release (or ended). Such a kernel must call ls_pdl_wait before it
 * reads anything another kernel writes or writes anything another kernel
 * reads: ls_pdl_wait returns when the kernels before it have finished and
 * their writes are visible. Before it, a kernel may read weights only — the
 * one-token linear loads its whole row there — so no value and no order of
 * any operation depends on the overlap. Kernels start with ls_pdl_entry
 * (wait, then release) unless they load weights first. Without the launch
 * attribute (ls_cuda_set_programmatic_launch(0), or a launch after a copy)
 * both calls do nothing and the stream orders kernels as usual. */
#ifndef LS_KERNELS_LAUNCH_CUH
#define LS_KERNELS_LAUNCH_CUH

#include <cuda_runtime.h>

__device__ __forceinline__ void ls_pdl_wait(void)
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ void ls_pdl_release(void)
{
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

__device__ __forceinline__ void ls_pdl_entry(void)
{
    ls_pdl_wait();
    ls_pdl_release();
}

/* Whether ls_launch sets the attribute (kernels/ls_cuda.cu; default on). */
extern "C" int ls_cuda_programmatic_launch(void);

/* kernel<<<grid, block, smem, stream>>>(args...) with the programmatic
 * stream serialisation attribute; errors as a launch's (cudaGetLastError). */
template <typename... P, typename... A>
static inline cudaError_t ls_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                                    cudaStream_t stream, A... args)
{
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = at;
    cfg.numAttrs = ls_cuda_programmatic_launch() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

#endif
