/* lockstep — code digests: which machine code this build runs for each
 * provider row (manifest field numerics.operators.<op>.code_sha256).
 *
 * The table is generated at build time (cmake/gen_code_digests.c) from the
 * compiled objects of the library: for every CPU function of the backend and
 * engine modules, the SHA-256 of its machine code (x86-64 bytes and
 * relocations, with the static helpers and constant pools it refers to); for
 * every CUDA kernel, the SHA-256 of its SASS for the built architecture and
 * of its PTX entry (template instances combined); for every __device__
 * helper of the kernel sources, a row saying its code lies inside the
 * kernels that call it. Debug information, file names and paths never enter a
 * digest, so two builds of the same source with the same compiler and flags
 * give the same table (harness/code_digests_repro checks it).
 * manifest/README.md says what a change of these digests means. */
#ifndef LS_CODE_CODE_H
#define LS_CODE_CODE_H

#include <stddef.h>

#include "core/status.h"

typedef struct ls_code_entry {
    const char *backend;                 /* "cpu" | "cuda" */
    const char *name;                    /* function or kernel as source code names it */
    const char *sha256;                  /* hex: machine code (cpu: the function and what it
                                            refers to; cuda: SASS of every instance); NULL for a
                                            __device__ helper, inlined into its callers */
    const char *ptx_sha256;              /* hex: cuda PTX entries; NULL for cpu and helpers */
    int instances;                       /* cuda: kernel instances (templates) combined */
} ls_code_entry;

/* The build's table, sorted by backend, then name; *count receives its
 * length. Static; do not free. Holds CUDA rows only in a CUDA build. */
const ls_code_entry *ls_code_list(size_t *count);

/* The row for `name` on `backend`, or NULL. */
const ls_code_entry *ls_code_find(const char *backend, const char *name);

/* The code digest of a provider row: kernel_id is the row's text (e.g.
 * "ls_moe_gate_up_kernel+ls_moe_down_kernel (+ls_moe_count_kernel when ...)").
 * Every identifier in it that holds an underscore names a function of
 * `backend` and must be in the table (other words are prose: "e4m3", "E").
 * hex receives SHA-256 over the backend and, for each distinct named
 * function with code in name order, name, sha256 and ptx_sha256 (each
 * NUL-terminated; "" for no PTX). Fails LS_E_UNSUPPORTED naming the first
 * identifier the table lacks, or when the row names no function with code. */
ls_status ls_code_digest(const char *backend, const char *kernel_id, char hex[65], ls_error *err);

#endif
