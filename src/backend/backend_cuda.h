/* lockstep — the portable strict CUDA backend (operator table of backend.h
 * over device memory, each op a kernel of kernels/ops.h that gives the CPU
 * reference's bits). Available when the library is built with CUDA
 * (LOCKSTEP_HAVE_CUDA); otherwise ls_backend_cuda_create fails closed. */
#ifndef LS_BACKEND_BACKEND_CUDA_H
#define LS_BACKEND_BACKEND_CUDA_H

#include <stddef.h>

#include "backend/backend.h"
#include "core/platform.h"

/* Creates the backend on the current CUDA device. Device memory for the run
 * (weights, activations, caches) comes from one arena of arena_bytes
 * (0 = 90 % of the free device memory), taken with one cudaMalloc; MoE and
 * digest scratch come from it too. The reversed-order perturbation is not
 * implemented on CUDA: such ops return LS_E_UNSUPPORTED. */
ls_status ls_backend_cuda_create(size_t arena_bytes, ls_backend **out, ls_error *err);

/* CUDA device `device` as the runtime describes it, for the manifest.
 * *present = 0 (and *out zeroed, LS_OK) in a build without CUDA or when no
 * device can be queried: a CPU-only system is not an error. */
ls_status ls_backend_cuda_query_gpu(int device, ls_gpu_info *out, int *present, ls_error *err);

#endif
