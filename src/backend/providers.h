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

#include "backend/backend.h"
#include "core/platform.h"


/* Rows registered for a backend ("cpu", "cuda"), in operator order; *count
 * receives the number of rows. Returns NULL (and *count = 0) when the backend
 * name is unknown. A known backend with no rows yet returns a non-NULL
 * pointer and *count = 0. The table is static; do not free. */
const ls_provider *ls_backend_list_providers(const char *backend, size_t *count);

/* The rows a run on FP8 block-quantised weights adds (docs/numerics.md §9):
 * fp8_mode "dequant" or "w8a8" (ops linear_fp8, experts_fp8, and w8a8's
 * fp8_act_quant). NULL (*count = 0) for an unknown backend or mode. Static. */
const ls_provider *ls_backend_list_fp8_providers(const char *backend, const char *fp8_mode,
                                                 size_t *count);

/* The row of the chunk-aligned GDN form on `backend` in `tier` (it replaces
 * the gdn_recurrent row when a run uses that form: the portable kernels, or
 * the tensor-core ones in the tc and fast tiers), or NULL where the backend
 * has no kernel for it. */
const ls_provider *ls_backend_gdn_chunked_provider(const char *backend, ls_tier tier);

/* The rows of a tier on `backend` (they replace the linear, lm_head and
 * experts rows when a run uses the tier: tc strict, its algorithms pinned in
 * numerics.tc_gemms; fast non-strict in its linears), or NULL (*count = 0)
 * for the portable tier and where the backend has no such tier. */
const ls_provider *ls_backend_tier_providers(const char *backend, ls_tier tier, size_t *count);

/* The provider that runs `op` on `backend`, or NULL. */
const ls_provider *ls_backend_find_provider(const char *backend, const char *op);

/* Backend names known to the registry, NULL-terminated. */
extern const char *const ls_backend_names[];

#endif
