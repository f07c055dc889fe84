/* lockstep — the live system a manifest pins: OS, CPU, host, GPU. */
#ifndef LS_MANIFEST_RUNTIME_H
#define LS_MANIFEST_RUNTIME_H

#include "core/platform.h"
#include "core/status.h"

/* The runtime section of a manifest as a new jansson object (json_t*, caller
 * owns): os {sysname, release, version, machine}, host_name, pinned_at
 * (UTC, ISO 8601), cpu {model, logical_cores, flags[]}, gpu (object or null).
 * flags lists the CPU features that select code paths, in a fixed order.
 * gpu_info is the GPU the run uses as its backend reported it, or NULL (no
 * GPU: "gpu" is null); the manifest is told, it never queries a device. */
ls_status ls_runtime_describe(const ls_gpu_info *gpu_info, void **out_json, ls_error *err);

#endif
