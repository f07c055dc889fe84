/* lockstep — the live system a manifest pins: OS, CPU, host, GPU. */
#ifndef LS_MANIFEST_RUNTIME_H
#define LS_MANIFEST_RUNTIME_H

#include "backend/cuda_info.h"
#include "core/status.h"

/* GPU 0 as the CUDA backend sees it. In builds without LOCKSTEP_HAVE_CUDA,
 * or when the runtime finds no device, *present = 0 and LS_OK is returned
 * (a CPU-only system is not an error). *out is zeroed when absent. */
ls_status ls_runtime_query_gpu(ls_gpu_info *out, int *present, ls_error *err);

/* The runtime section of a manifest as a new jansson object (json_t*, caller
 * owns): os {sysname, release, version, machine}, host_name, pinned_at
 * (UTC, ISO 8601), cpu {model, logical_cores, flags[]}, gpu (object or null).
 * flags lists the CPU features that select code paths, in a fixed order. */
ls_status ls_runtime_describe(void **out_json, ls_error *err);

#endif
