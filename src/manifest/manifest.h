/* lockstep — manifests: pin, load, diff, verify.
 *
 * A manifest is a JSON document (manifest/README.md documents every field,
 * manifest/schema.json is its JSON Schema) that pins what a determinism claim
 * depends on: the checkpoint (config digest, per-tensor SHA-256, Merkle root),
 * the architecture read from config.json, the numerics (mode, tier,
 * perturbation, the provider of every operator), the topology, the build and
 * the live runtime. Every value is a jansson json_t; the caller owns what a
 * function hands out and releases it with json_decref.
 *
 * Typical use by the engine: build in process, then embed the digest in the
 * trace header:
 *
 *     ls_manifest_opts o = ls_manifest_opts_default();
 *     o.checkpoint = ck;                    // already open
 *     o.providers = rows;                   // told by the backend (via src/run)
 *     o.n_providers = n;
 *     json_t *m; ls_digest d;
 *     LS_TRY(ls_manifest_build(&o, &m, err));
 *     LS_TRY(ls_manifest_digest(m, &d, err));
 */
#ifndef LS_MANIFEST_MANIFEST_H
#define LS_MANIFEST_MANIFEST_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/platform.h"
#include "core/status.h"
#include "fingerprint/fingerprint.h"
#include "fingerprint/sha256.h"
#include "io/checkpoint.h"

#define LS_MANIFEST_VERSION 1
/* numerics.gdn_form of a run in the chunk-aligned GDN form (docs/numerics.md §5.1) */
#define LS_MANIFEST_GDN_CHUNKED "chunk-aligned-64"

/* ---- building ---------------------------------------------------------------- */

/* How a rollout is served (docs/architecture.md, "GRPO groups, prefix reuse
 * and preemption" and "The KV cache"), recorded as the manifest's `serving`
 * section so that a manifest says which of them the rollout used. None of
 * them changes a bit of lockstep's engine (the claim tests/test_group.c and
 * tests/test_paged.c check), so the section is informational: a difference
 * in it voids nothing and it is outside the manifest digest. */
typedef struct ls_manifest_serving {
    long kv_page;                        /* KV cache page size; 0 = contiguous per sequence */
    long samples_per_prompt;             /* GRPO group size, >= 1 */
    const char *prefix_cache;            /* "off" | "aligned" | "any" */
    long prefix_block;                   /* "aligned": the boundary, >= 1; otherwise 0 */
    const char *preemption;              /* "none" | "seeded" */
    uint64_t preempt_seed;               /* "seeded": the eviction schedule's seed; otherwise 0 */
} ls_manifest_serving;

typedef struct ls_manifest_opts {
    const char *checkpoint_dir;          /* opened when checkpoint is NULL */
    const ls_checkpoint *checkpoint;     /* already open (borrowed), or NULL */
    const char *backend;                 /* "cpu" (default) | "cuda" */
    const ls_provider *providers;        /* [n_providers] the backend's provider rows
                                            (borrowed); the manifest records them as told */
    size_t n_providers;
    const ls_gpu_info *gpu;              /* the GPU as the backend reported it, or NULL */
    const char *mode;                    /* "strict" (default) | "fast" */
    const char *perturbation;            /* spec string; NULL for none (required NULL when strict) */
    int threads;                         /* fingerprint threads; <= 0 = online cores */
    int progress;                        /* 1: progress bar on a terminal */
    int world_size, tp_degree, ep_degree;/* topology; <= 0 means 1. Colocated, world_size =
                                            tp_degree * ep_degree (docs/parallel.md §4) */
    int afd_attention_ranks, afd_ffn_ranks; /* topology.afd: both 0 = null (colocated); else
                                            world_size = attention + ffn ranks */
    const char *communicator;            /* topology.communicator: "none" (NULL: the default,
                                            one rank), "cpu-socket" or "nccl" */
    const char *reduction_tree;          /* topology.reduction_tree: "none" (NULL: today's
                                            order) or "k8-binary" (docs/parallel.md §3.3) */
    const ls_fingerprint *fingerprint;   /* the checkpoint's fingerprint, already computed
                                            (borrowed; a gate hashes once for all its
                                            runs), or NULL to compute it */
    const char *cache_dir;               /* fingerprint cache root when the fingerprint is
                                            computed here (ls_fingerprint_checkpoint_cached);
                                            NULL (default): no cache. The manifest does not
                                            depend on it: cached and hashed digests agree */
    int refresh;                         /* 1: hash every tensor and refresh the cache */
    const char *fp8;                     /* FP8 arithmetic of a checkpoint whose config.json holds
                                            a quantization_config: "dequant" (NULL: the default)
                                            or "w8a8" (docs/numerics.md §9); must be NULL for
                                            any other checkpoint */
    const ls_provider *gdn_chunked;      /* the backend's row of the chunk-aligned GDN form
                                            (docs/numerics.md §5.1) when the run uses it: it
                                            replaces the gdn_recurrent row, its reduction
                                            fingerprint the probe's "gdn_chunked" row, and
                                            numerics.gdn_form records the form; NULL: the
                                            recurrent form (the field absent) */
    const ls_provider *tier_providers;   /* [n_tier_providers] the tc or fast tier's rows when the
                                            run uses one (providers.h): they replace the linear,
                                            lm_head and experts rows whatever their mode (no
                                            reduction fingerprint: no probe applies), and
                                            numerics.tier says "tensor-core" (the fast rows only
                                            in mode fast); NULL: the portable tier */
    size_t n_tier_providers;
    const char *const *tc_gemms;         /* [n_tc_gemms] with tc's rows: the pinned GEMM records,
                                            one canonical JSON object each (kernels/tc/gemm_pin.h),
                                            recorded in order as numerics.tc_gemms */
    size_t n_tc_gemms;
    const ls_provider *fp8_providers;    /* [n_fp8_providers] the backend's rows for that mode
                                            (borrowed), recorded for an FP8 checkpoint */
    size_t n_fp8_providers;
    const ls_op_fingerprint *reduction_fingerprints; /* [n_reduction_fingerprints] the
                                            backend's probe results (src/probe, borrowed):
                                            each recorded operator row with an entry of its
                                            op gets reduction_fingerprint; NULL: none (the
                                            manifest then pins operators by name only) */
    size_t n_reduction_fingerprints;
    const ls_manifest_serving *serving;  /* the serving section (borrowed), or NULL: none (the
                                            plain engine: contiguous KV, 1 sample, no prefix
                                            cache, no preemption) */
} ls_manifest_opts;

/* Defaults: backend "cpu", mode "strict", no perturbation, all threads,
 * topology 1/1/1, no progress bar, no fingerprint cache. */
ls_manifest_opts ls_manifest_opts_default(void);

/* Pins the live system: fingerprints the checkpoint and describes build,
 * runtime, numerics and topology. *out is a new object (caller decrefs).
 * Fails LS_E_USAGE for bad options, LS_E_UNSUPPORTED for a backend with no
 * registered providers, or whatever opening/hashing the checkpoint reports. */
ls_status ls_manifest_build(const ls_manifest_opts *opts, json_t **out, ls_error *err);

/* The claim digest: SHA-256 of the manifest's canonical JSON (sorted keys,
 * no whitespace; see ls_fingerprint_canonical_json) without the fields that
 * ls_manifest_classify calls informational (host, pin time, paths, ...). Two
 * manifests whose diff is informational only share it. Traces embed it. */
ls_status ls_manifest_digest(const json_t *manifest, ls_digest *out, ls_error *err);

/* Writes the manifest (indented, keys in pin order, trailing newline)
 * atomically; path "-" is stdout. */
ls_status ls_manifest_save(const json_t *manifest, const char *path, ls_error *err);

/* ---- reading ----------------------------------------------------------------- */

/* Reads and validates a manifest file (duplicate keys rejected, version 1
 * only, structure as in manifest/schema.json, Merkle root consistent with the
 * tensor table). Failures name the file and the field. */
ls_status ls_manifest_load(const char *path, json_t **out, ls_error *err);

/* Same rules for a manifest held in memory; label names it in messages. */
ls_status ls_manifest_parse(const char *label, const char *text, size_t len, json_t **out,
                            ls_error *err);

/* Structural validation of an already parsed manifest. */
ls_status ls_manifest_validate(const json_t *manifest, const char *label, ls_error *err);

/* ---- comparing --------------------------------------------------------------- */

typedef enum ls_change_class {
    LS_CHANGE_INFORMATIONAL = 0,         /* does not affect the claim (host, time, paths) */
    LS_CHANGE_VOIDING = 1                /* the pinned claim no longer holds */
} ls_change_class;

typedef struct ls_manifest_change {
    char *path;                          /* e.g. checkpoint.tensors["model.norm.weight"].sha256; owned */
    char *old_value;                     /* compact JSON, "(absent)" when missing; owned, may be shortened */
    char *new_value;                     /* same for the new side; owned */
    ls_change_class cls;
} ls_manifest_change;

typedef struct ls_manifest_delta {
    size_t count;                        /* number of changes */
    ls_manifest_change *changes;         /* [count], in document order of the old manifest; owned */
    size_t voiding;                      /* how many of them are voiding */
} ls_manifest_delta;

/* Lists every difference between two (validated) manifests, leaf by leaf,
 * and classifies each (rule table in manifest/README.md). The caller
 * releases *out with ls_manifest_diff_free. */
ls_status ls_manifest_diff(const json_t *old_m, const json_t *new_m, ls_manifest_delta *out,
                           ls_error *err);
void ls_manifest_diff_free(ls_manifest_delta *d);

/* The class of a difference at `path`, given both manifests (some rules look
 * at context: the binary digest is informational when both manifests carry
 * reduction fingerprints for the same operators, or else when both source
 * revisions are clean; a reduction fingerprint present on one side only is
 * informational when the other side has none at all, an older manifest). */
ls_change_class ls_manifest_classify(const char *path, const json_t *old_m, const json_t *new_m);

const char *ls_change_class_name(ls_change_class c); /* "informational" | "voiding" */

/* 1 when `path` (as ls_manifest_diff writes it) is an operator row's
 * code_sha256: the machine code behind that operator changed. Informational;
 * diff and verify print a warning naming those operators. */
int ls_manifest_is_code_digest_path(const char *path);

/* Re-pins the live system with live_opts (checkpoint, backend ...) and diffs
 * the pinned manifest against it. *out holds every difference; the claim
 * holds when out->voiding == 0. */
ls_status ls_manifest_verify(const json_t *pinned, const ls_manifest_opts *live_opts,
                             ls_manifest_delta *out, ls_error *err);

#endif
