/* lockstep — provider registry (data only): for each backend, which provider
 * runs each operator and with which reduction order. The manifest records one
 * entry per row (numerics.operators), so a change of kernel, tile shape,
 * split policy, accumulator or reduction order voids a pinned claim.
 *
 * Reduction-order ids name the orders defined in docs/numerics.md; a new
 * order gets a new id, never a reused one. */
#ifndef LS_BACKEND_PROVIDERS_H
#define LS_BACKEND_PROVIDERS_H

#include <stddef.h>

typedef struct ls_provider {
    const char *op;                 /* operator name, e.g. "linear" (docs/numerics.md §3) */
    const char *provider;           /* implementation family, e.g. "cpu-reference" */
    const char *kernel_id;          /* function / kernel that runs it */
    const char *tile_shape;         /* e.g. "1x32" (rows x lanes), "-" when not tiled */
    const char *split_policy;       /* "none" for strict providers (no split-K / split-KV) */
    const char *accumulator_dtype;  /* "fp32" */
    const char *reduction_order;    /* e.g. "dot32-lanes32-butterfly" */
    const char *tier;               /* "portable" | "tensor-core" */
    const char *mode;               /* "strict" | "fast" */
} ls_provider;

/* Rows registered for a backend ("cpu", "cuda"), in operator order; *count
 * receives the number of rows. Returns NULL (and *count = 0) when the backend
 * name is unknown. A known backend with no rows yet returns a non-NULL
 * pointer and *count = 0. The table is static; do not free. */
const ls_provider *ls_backend_list_providers(const char *backend, size_t *count);

/* The provider that runs `op` on `backend`, or NULL. */
const ls_provider *ls_backend_find_provider(const char *backend, const char *op);

/* Backend names known to the registry, NULL-terminated. */
extern const char *const ls_backend_names[];

#endif
