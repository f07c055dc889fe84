/* lockstep — the run layer: one run of the model, specified once.
 *
 * A run specification names the checkpoint, the mode (rollout or replay),
 * the sequences, sampling, backend, chunking, perturbation and digest
 * cadence. ls_run_execute validates it (errors name the field and the CLI
 * flag that sets it), opens the checkpoint and model, creates the backend,
 * pins the manifest in process (the backend tells it its providers and
 * device), assembles the trace header, drives the engine (src/run/drive.h)
 * and writes the trace through a sink, one frame per engine step, to a
 * temporary name renamed when complete.
 *
 * Layering (docs/architecture.md): the CLI only parses arguments into a spec
 * and prints; the gate (run/gate.h), the demo, the tests, the harness and
 * programs embedding liblockstep (lockstep/lockstep.h) run through here. */
#ifndef LS_RUN_RUN_H
#define LS_RUN_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/platform.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/sample.h"
#include "fingerprint/fingerprint.h"
#include "manifest/manifest.h"
#include "probe/probe.h"
#include "run/drive.h"
#include "run/load.h"
#include "synth/synth.h"
#include "trace/trace.h"

/* How a run hashes its checkpoint (the manifest pins every tensor's SHA-256).
 * The cache (fingerprint/fingerprint.h) keeps each shard's digests keyed by
 * the file's identity; the trace header's run_params.checkpoint_verified
 * says how many bytes were hashed and how many came from it. */
typedef enum ls_run_hash_cache {
    LS_RUN_CACHE_USE = 0,          /* default: reuse digests of unchanged files, store new ones */
    LS_RUN_CACHE_OFF,              /* hash every tensor, store nothing */
    LS_RUN_CACHE_REFRESH           /* hash every tensor, store fresh entries */
} ls_run_hash_cache;

/* Parses "use" | "off" | "refresh". */
ls_status ls_run_parse_hash_cache(const char *s, ls_run_hash_cache *out, ls_error *err);

/* A --checkpoint argument that starts with this names a synthetic
 * checkpoint generated in memory instead of a directory (a directory of
 * that name is reached as ./synth:...). */
#define LS_RUN_SYNTH_PREFIX "synth:"

/* Opens what a --checkpoint argument names, and its model when m is not
 * NULL: a checkpoint directory (ls_checkpoint_open, ls_model_open), or
 * "synth:PRESET,seed=N[,layers=N][,fp8][,experts=fused|per-expert]", the
 * checkpoint `lockstep synth --preset PRESET --seed N [--layers N] [--fp8]
 * [--expert-layout ...]` would write, generated in memory
 * (ls_synth_checkpoint: the same config.json, tensors and Merkle root, the
 * bytes generated when hashed) with its model ls_model_synthetic, whose
 * matrices each backend (each rank: its share) generates itself
 * (docs/synth.md). Nothing is written, so a shape of ~160 GB runs without
 * disk. LS_E_USAGE naming the argument for a malformed synth spec. */
ls_status ls_run_checkpoint_open(const char *arg, ls_checkpoint **ck, ls_model **m, ls_error *err);

/* Parses a synth spec (above) into the preset's config, truncated and laid
 * out as it says, and its seed; *label gets the spec with every field
 * spelled out ("synth:tiny,seed=3,layers=2,experts=per-expert"), the name
 * ls_checkpoint_dir gives the generated checkpoint. */
ls_status ls_run_parse_synth(const char *arg, ls_synth_config *cfg, uint64_t *seed, char *label, size_t label_size,
                             ls_error *err);

/* Hashes the checkpoint as the spec's cache setting says (all cores). */
ls_status ls_run_fingerprint(const ls_checkpoint *ck, ls_run_hash_cache cache, int progress,
                             ls_fingerprint *out, ls_error *err);

/* A field that means nothing in the run's mode must be left unset (0, or
 * the neutral sampling values of ls_run_spec_default): validation refuses a
 * chunk in a rollout, a token budget or sampling in a replay, and sampling
 * parameters with greedy selection, rather than ignore them. */
typedef struct ls_run_spec {
    const char *checkpoint;        /* directory (--checkpoint) */
    const char *mode;              /* "rollout" | "replay", required (--mode) */
    const ls_run_batch *batch;     /* rollout: prompts; replay: full sequences (borrowed) */
    long max_new;                  /* rollout: tokens to generate, >= 1; replay: 0 (--max-new-tokens) */
    long chunk;                    /* replay: tokens per sequence per step, 0 = the whole sequence;
                                      rollout: 0 (--chunk) */
    int reverse_batch;             /* pack the batch in reverse order (--reverse-batch) */
    ls_sampling sampling;          /* rollout: --sampling, --seed, --temperature, --top-k, --top-p
                                      (greedy: seed 0, temperature 1, top_k 0, top_p 1);
                                      replay: greedy with those values (teacher-forced) */
    int act_bf16;                  /* 1 bf16, 0 fp32 activations (--activations) */
    const char *backend;           /* "cpu" | "cuda" (--backend) */
    int gpu;                       /* cuda: the CUDA device everything runs on, an ordinal
                                      0 .. count-1 (--gpu; default 0); with W ranks rank r on
                                      gpu + r when the machine has gpu + W devices, else all on
                                      gpu with 1/W of its memory each (docs/parallel.md §1);
                                      cpu: 0 */
    int threads;                   /* CPU worker threads, >= 1 (--threads) */
    long state_digest_every;       /* carried-state digest cadence, >= 1 (--state-digest-every) */
    long max_rows;                 /* packed tokens per forward, >= 1 (--max-rows) */
    const char *perturb;           /* "layer=L,op=OP[,twin=fast]" or NULL (--perturb) */
    const char *dump_layers;       /* "L,L,..." or NULL (--dump-layers) */
    const char *fp8;               /* FP8 checkpoints: "dequant" (NULL: the default) or "w8a8"
                                      (--fp8, docs/numerics.md §9); a checkpoint without
                                      quantization_config takes NULL */
    long samples_per_prompt;       /* rollout: GRPO group size, >= 1 (--samples-per-prompt; default
                                      1): sample k of prompt id P is trace sequence P * N + k
                                      (run/drive.h); N > 1 needs seeded sampling; replay: 1 */
    const char *prefix_cache;      /* rollout: "off" (NULL: the default), "aligned" or "any"
                                      (--prefix-cache, run/drive.h); replay: NULL */
    long prefix_block;             /* prefix_cache aligned: the boundary, >= 1 (--prefix-block;
                                      0: 64); otherwise 0 */
    const char *preempt;           /* rollout: "none" (NULL: the default) or "seeded:SEED", the
                                      eviction schedule of ls_run_preempt_plan (--preempt);
                                      replay: NULL */
    long kv_page;                  /* KV cache page size (--kv-page): 0 = contiguous per sequence
                                      (the default), 1 .. LS_RUN_KV_PAGE_MAX = pages of that many
                                      positions from a shared pool (engine.h); changes no bit and
                                      is recorded in run_params when set */
    int gdn_chunked;               /* the GDN form (--gdn-form; docs/numerics.md §5.1): 0 =
                                      recurrent (default), 1 = chunk-aligned (cpu and cuda backends);
                                      recorded in run_params.gdn_form and numerics.gdn_form when
                                      1, and taken from the rollout by replay --from */
    ls_tier tier;                  /* the GEMMs' tier (--tier; docs/tensor-core-tier.md):
                                      portable (default, CPU = CUDA bit for bit); tc: the cuda
                                      backend's linears through cuBLASLt algorithms qualified
                                      row-invariant per weight shape (up to LS_RUN_TC_ROWS rows)
                                      and pinned in numerics.tc_gemms; fast: through cuBLASLt's
                                      default heuristic per call, a non-strict run (manifest mode
                                      fast), the yardstick for what strictness costs. tc and
                                      fast: one rank, bf16 weights, no perturbation but a fast
                                      twin on tc (ls_run_fast_twin); recorded in
                                      run_params.tier and taken from the rollout by replay --from */
    int ep;                        /* expert-parallel ranks (--ep; docs/parallel.md §3.1): 0 or 1 =
                                      one rank; N > 1 = N ranks, one process each (run/ranks.h),
                                      rank 0 writing the trace; num_experts % (tp * ep) == 0; cpu
                                      or cuda (CUDA ranks exchange through host memory) */
    int tp;                        /* tensor-parallel ranks (--tp; docs/parallel.md §3.3, the
                                      order-preserving form): 0 or 1 = none; N > 1 = N ranks
                                      (engine tp_comm), the engine refusing shapes N does not divide.
                                      With ep > 1 the world is tp * ep ranks: TP groups of tp
                                      consecutive ranks (rank / tp), the experts split over the
                                      whole world (§3.4) */
    int afd_attention, afd_ffn;    /* attention-FFN disaggregation (--afd A:F; §3.2): both 0 =
                                      colocated; A:F = A + F ranks, ranks 0..A-1 the mixers, A..
                                      the FFN (engine afd_comm); AFD with tp or ep > 1 is
                                      refused */
    const char *afd_balance;       /* with afd 1:1: where the per-layer balance report goes
                                      (--afd-balance; JSON, docs/parallel.md §3.2), NULL = none */
    long rank_timeout_ms;          /* several ranks: every exchange's deadline, after which the
                                      rank waited for is named and every rank fails
                                      (--rank-timeout; 0 = 60000); 0 with one rank */
    const char *out;               /* trace path (-o) */
    int progress;                  /* progress on stderr (ls_progress) */
    const ls_fingerprint *fingerprint; /* the checkpoint's, already computed (borrowed), or NULL */
    ls_run_hash_cache hash_cache;  /* digest cache use when hashing (--checkpoint-cache) */
    const char *expect_merkle_root; /* replay: the Merkle root (64 hex) the sequences were made with
                                       (a rollout trace's model_fingerprint), or NULL: the run
                                       fails if the checkpoint's root differs */
    const char *expect_source;     /* where expect_merkle_root came from, for the message (e.g. the
                                      rollout trace's path), or NULL */
} ls_run_spec;

/* The rows per call the tensor-core tier qualifies its GEMMs for, whatever
 * max_rows (<= this) a run has, so a rollout and its replays pin the same
 * algorithms. */
#define LS_RUN_TC_ROWS 1024

/* The largest KV page size a spec takes (a page of a million positions is
 * a typing error, not a layout). */
#define LS_RUN_KV_PAGE_MAX (1L << 20)

/* Defaults: no mode (the caller says which), no token budget, greedy,
 * bf16, cpu, 1 thread, state digests every 64 positions, 256 rows per
 * step. */
void ls_run_spec_default(ls_run_spec *s);

/* Checks every field that does not need the checkpoint (LS_E_USAGE naming
 * the field and its flag), including the fields the mode leaves unused
 * (see above). ls_run_execute calls it first. */
ls_status ls_run_spec_validate(const ls_run_spec *s, ls_error *err);

/* The group options of a validated spec: GRPO size, prefix policy and
 * block, and the seeded preemption (*preempt_on 0 = none, else *preempt_seed). */
ls_status ls_run_spec_group(const ls_run_spec *s, ls_rollout_opts *o, int *preempt_on, uint64_t *preempt_seed,
                            ls_error *err);

/* The serving options of a spec (samples_per_prompt, prefix_cache and
 * prefix_block, preempt, kv_page) as a manifest records them
 * (manifest/manifest.h ls_manifest_serving; strings static), validated as
 * ls_run_spec_validate does them (LS_E_USAGE naming the field and its flag).
 * *any = 0 when every one is the plain engine's (contiguous KV, 1 sample, no
 * prefix cache, no preemption): the manifest then has no serving section.
 * ls_run_execute records them in the manifest it pins; `manifest pin` takes
 * the same flags. */
ls_status ls_run_spec_serving(const ls_run_spec *s, ls_manifest_serving *out, int *any, ls_error *err);

/* The topology of a spec (tp, ep, afd) as a manifest records it (mo's
 * world_size, tp_degree, ep_degree, afd, communicator), validated as
 * ls_run_spec_validate does (LS_E_USAGE naming the field and its flag).
 * ls_run_execute records it in the manifest it pins; `manifest pin` takes
 * the same flags. */
ls_status ls_run_spec_topology(const ls_run_spec *s, ls_manifest_opts *mo, ls_error *err);

/* The number of ranks a spec runs on: afd_attention + afd_ffn with AFD,
 * else tp * ep (each 0 counting as 1). */
int ls_run_spec_world(const ls_run_spec *s);

/* Whether the model divides the spec's topology: ep (or tp x ep) and the FFN
 * ranks divide num_experts, tp and the attention ranks what tensor
 * parallelism splits (ls_engine_check_tp). LS_E_USAGE / LS_E_UNSUPPORTED
 * naming the flag and the field, as ls_run_execute refuses before any rank
 * starts. s->checkpoint names the model in messages. */
ls_status ls_run_topology_check(const ls_run_spec *s, const ls_model *m, ls_error *err);

/* The same for the checkpoint in s->checkpoint, opened for the check (a
 * one-rank spec: nothing opened, LS_OK). `manifest pin` refuses what run
 * would. */
ls_status ls_run_topology_check_checkpoint(const ls_run_spec *s, ls_error *err);

/* Parses a perturbation "layer=L,op=OP" (op one of gdn, conv, attention,
 * router, experts, combine, norm, lm_head): the planted reversed order (the
 * cpu backend), *twin 0; "layer=L,op=OP,twin=fast": the family's fast twin
 * (the cuda backend, ls_run_fast_twin), *twin 1 (docs/numerics.md §7). */
ls_status ls_run_parse_perturb(const char *spec, int *layer, ls_perturb_op *op, int *twin, ls_error *err);

/* A perturbation on tier `tier`: any on the portable tier, only a fast twin
 * (layer=L,op=OP,twin=fast) on the tc tier, none on the fast tier; else
 * LS_E_USAGE naming --perturb. A spec that is not the engine's counts as no
 * twin. NULL: LS_OK. */
ls_status ls_run_perturb_tier_check(const char *spec, ls_tier tier, ls_error *err);

/* 1 when the cuda backend's tier `tier` has a fast twin for op: attention
 * (split-KV) and gdn (chunked from the call's start) on the portable and tc
 * tiers, combine (atomic adds) on the tc tier, whose experts it rides on. */
int ls_run_fast_twin(ls_perturb_op op, ls_tier tier);

/* A GDN form's name (--gdn-form, lockstep_run_options.gdn_form; docs/numerics.md
 * §5.1): "recurrent" -> *chunked 0, "chunk-aligned" -> 1; anything else
 * LS_E_USAGE, the message opening with `what` (the option as the caller
 * knows it). */
ls_status ls_run_parse_gdn_form(const char *what, const char *v, int *chunked, ls_error *err);

/* A tier's name (--tier, lockstep_run_options.tier): "portable", "tc" or
 * "fast"; anything else LS_E_USAGE, the message opening with `what`. */
ls_status ls_run_parse_tier(const char *what, const char *v, ls_tier *tier, ls_error *err);

/* The name ls_run_parse_tier reads ("portable", "tc", "fast"). */
const char *ls_run_tier_name(ls_tier tier);

/* The pinned GEMM records (kernels/tc/gemm_pin.h) a tc-tier run of the bf16
 * checkpoint in `checkpoint` on CUDA device `gpu` pins, for `manifest pin` and
 * `verify`: its engine opened (weights on the device) on a tc backend as
 * ls_run_execute opens it, each linear shape qualified, the records copied
 * out. Free *records (n strings) with ls_run_tc_pins_free. LS_E_UNSUPPORTED
 * for an FP8 checkpoint or without CUDA. */
ls_status ls_run_tc_pins(const char *checkpoint, int gpu, char ***records, size_t *n, ls_error *err);
void ls_run_tc_pins_free(char **records, size_t n);

/* The backend called `name` ("cpu": threads workers; "cuda": CUDA device
 * gpu, its arena 90 % of that device's free memory). LS_E_USAGE for an
 * unknown name, a gpu other than 0 with cpu, or a device this machine does
 * not have ("no CUDA device N: this machine has M (...)"); LS_E_NOMEM when
 * the arena does not fit; LS_E_UNSUPPORTED when CUDA is not built or no
 * GPU is usable. */
ls_status ls_run_backend_create(const char *name, int threads, int gpu, ls_backend **out,
                                ls_error *err);

/* ls_run_backend_create, then ls_engine_create on that backend (which the
 * engine then owns). A model larger than the device's memory fails with
 * LS_E_NOMEM ("out of GPU memory: N bytes asked, ...") and leaves nothing
 * allocated on the device. */
ls_status ls_run_engine_open_gpu(const ls_model *m, const char *backend, int threads, int gpu,
                                 const ls_engine_opts *o, long max_seqs, long max_len,
                                 ls_engine **out, ls_error *err);

/* ls_run_engine_open_gpu on the GEMMs' tier (ls_run_spec.tier;
 * docs/tensor-core-tier.md): portable is ls_run_engine_open_gpu; tc and fast
 * the cuda backend as ls_run_execute opens it for --tier tc or fast (tc:
 * every linear's cuBLASLt algorithm qualified for LS_RUN_TC_ROWS rows per
 * call and pinned when the engine is created). LS_E_USAGE for tc or fast on
 * a backend other than cuda or with o->max_rows > LS_RUN_TC_ROWS,
 * LS_E_UNSUPPORTED on an FP8 checkpoint. */
ls_status ls_run_engine_open_tier(const ls_model *m, const char *backend, int threads, int gpu, ls_tier tier,
                                  const ls_engine_opts *o, long max_seqs, long max_len, ls_engine **out,
                                  ls_error *err);

/* ls_run_engine_open_gpu on CUDA device 0 (the cpu backend takes no device). */
ls_status ls_run_engine_open(const ls_model *m, const char *backend, int threads,
                             const ls_engine_opts *o, long max_seqs, long max_len, ls_engine **out,
                             ls_error *err);

/* The trace header of a run on engine e, filled as ls_run_execute fills it
 * for `lockstep run`: engine "lockstep-<backend>" (written into engine_name,
 * which must outlive *h), top-5 candidates, every digest kind, the engine's
 * layer table, activations "bf16" or "fp32" as act_bf16 says. One fill, so a
 * caller that drives ls_run_rollout / ls_run_replay itself (the long-context
 * harness) writes the header `run` writes and its traces compare with run's.
 * *h borrows every string given; manifest_digest is "" when no manifest was
 * pinned. */
void ls_run_trace_header(const ls_engine *e, const char *mode, const char *backend,
                         const char *model_fingerprint, const char *manifest_digest,
                         const char *run_params_json, long state_digest_every, int act_bf16,
                         ls_trace_header *h, char engine_name[64]);

/* Storage for what ls_run_manifest_facts hands a manifest; must outlive
 * the ls_manifest_opts it fills. */
typedef struct ls_run_facts {
    ls_gpu_info gpu;               /* the device, when a GPU is present */
    ls_probe_table probe;          /* reduction fingerprints of the backend's rows */
} ls_run_facts;

/* What a manifest is told about `backend`: its provider rows (and the FP8
 * rows of mo->fp8, default dequant, recorded for an FP8 checkpoint), the GPU
 * (facts->gpu, which must outlive *mo): CUDA device `gpu`, or none
 * (runtime.gpu null) where no device can be queried, and the reduction
 * fingerprint of every row (src/probe/probe.h), probed on a backend of its
 * own (the CPU with mo->threads workers, at least 1; CUDA device `gpu` with
 * a small arena), with the operator of mo->perturbation reversed (a spec
 * that is not the engine's layer=L,op=OP is recorded as given and reverses
 * none). A gpu other than 0 must name a device of this machine (LS_E_USAGE
 * otherwise, as ls_run_backend_create) and is refused with the cpu backend.
 * LS_E_USAGE for an unknown backend or FP8 mode; the backend's error when it
 * cannot be created or cannot run a probe. */
ls_status ls_run_manifest_facts(const char *backend, int gpu, ls_manifest_opts *mo,
                                ls_run_facts *facts, ls_error *err);

typedef struct ls_run_result {
    char merkle_root[65];
    char manifest_digest[65];
    uint64_t records;
    uint64_t positions;            /* token positions the model processed */
    double seconds;                /* engine wall time (excludes pinning the manifest) */
    int32_t *completions;          /* rollout: [batch n * samples_per_prompt, max_new] generated
                                      tokens (sample k of prompt i at row i * N + k); owned, free() */
} ls_run_result;

/* Runs the spec and writes the trace (see the top of this file). A perturbed
 * run pins mode "fast" with the perturbation recorded, so its manifest
 * digest never equals a strict one. A replay whose expect_merkle_root is
 * not the checkpoint's Merkle root fails (LS_E_INPUT, both roots named)
 * before the engine runs. On failure no trace is left behind. */
ls_status ls_run_execute(const ls_run_spec *s, ls_run_result *res, ls_error *err);

/* A working directory: `given` (created if missing, kept) or a fresh
 * temporary one (*temporary = 1; remove it with ls_run_workdir_remove). */
ls_status ls_run_workdir(const char *given, const char *tag, char *out, size_t out_size, int *temporary,
                         ls_error *err);
/* Removes the regular files inside dir (two levels down at most), then dir. */
void ls_run_workdir_remove(const char *dir);
/* Keeps a temporary work directory: renames "lockstep-TAG.tmp.<pid>.XXXXXX"
 * to "lockstep-TAG.XXXXXX" (updating dir, of size dir_size), so that neither
 * a signal nor a later run's sweep of stale temporaries removes it. */
void ls_run_workdir_keep(char *dir, size_t dir_size);

#endif
