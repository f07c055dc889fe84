/* lockstep — the one check macro for CUDA runtime calls and launches (internal
 * to kernels/). Records file, line, the call, CUDA's error name and a hint,
 * and returns LS_E_DEVICE through ls_fail. */
#ifndef LS_KERNELS_CUDA_CHECK_CUH
#define LS_KERNELS_CUDA_CHECK_CUH

#include <cuda_runtime.h>

extern "C" {
#include "core/status.h"
}

#define LS_CUDA_CHECK(call, err, hint)                                                   \
    do {                                                                                 \
        cudaError_t ls_cuda_e_ = (call);                                                 \
        if (ls_cuda_e_ != cudaSuccess)                                                   \
            return ls_fail((err), LS_E_DEVICE, "%s:%d: %s failed: %s (%s) (hint: %s)",   \
                           __FILE__, __LINE__, #call, cudaGetErrorName(ls_cuda_e_),      \
                           cudaGetErrorString(ls_cuda_e_), (hint));                      \
    } while (0)

/* After a kernel launch: reports launch-configuration errors at once. */
#define LS_CUDA_CHECK_LAUNCH(name, err)                                                  \
    LS_CUDA_CHECK(cudaGetLastError(), (err), "launch of " name " failed; check the "     \
                  "shapes and that the binary was built for this GPU (sm_90)")

/* Fails closed naming the operator and the offending shape. */
#define LS_CUDA_REQUIRE(cond, err, ...)                                                  \
    do {                                                                                 \
        if (!(cond)) return ls_fail((err), LS_E_UNSUPPORTED, __VA_ARGS__);               \
    } while (0)

#define LS_WARP 32
#define LS_FULL_MASK 0xffffffffu

#endif
