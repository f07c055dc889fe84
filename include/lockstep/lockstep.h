/* lockstep — the public C API of liblockstep.
 *
 * lockstep runs a model both ways — prompt prefill then token-by-token decode
 * (rollout), and teacher-forced recompute (replay) — with fixed-order,
 * batch-invariant kernels, writes each run as a trace, and compares traces
 * bitwise, naming the first token and layer where they drift.
 *
 * This header is the manual. It is self-contained (it includes only
 * <stddef.h> and <stdint.h>) and reads from simple to advanced:
 *
 *   1. version
 *   2. status and errors (one way, used by every call)
 *   3. simple API: open a checkpoint, rollout, replay, compare
 *   4. advanced API: run and compare options, replay of given tokens,
 *      what a run produced, synthetic checkpoints
 *   5. stability
 *
 * A whole check, rollout = replay, on the checkpoint directory "ckpt"
 * (README.md's example; tests/install/embed.c runs it):
 *
 *   lockstep_checkpoint *ck = NULL;
 *   lockstep_error e;
 *   lockstep_verdict v;
 *   const int32_t prompt[] = {11, 7, 42, 3, 99};
 *   const lockstep_sequence seq = {.id = 0, .tokens = prompt, .n_tokens = 5};
 *   if (lockstep_checkpoint_open("ckpt", &ck, &e) ||
 *       lockstep_rollout(ck, &seq, 1, NULL, "ro.trace", &e) ||
 *       lockstep_replay(ck, "ro.trace", NULL, "rp.trace", &e) ||
 *       lockstep_compare("ro.trace", "rp.trace", NULL, &v, &e))
 *       fprintf(stderr, "lockstep: %s\n", e.message);
 *   else
 *       printf("%s\n", v.line);   // equal: 1 sequence, 20 positions, bitwise
 *   lockstep_checkpoint_close(ck);
 *
 * Build against an installed lockstep with pkg-config:
 *   cc prog.c $(pkg-config --cflags --libs lockstep)                  links liblockstep.so
 *   cc -static prog.c $(pkg-config --cflags --libs --static lockstep) links liblockstep.a
 *
 * Threads: use a lockstep_checkpoint from one thread at a time. Calls on
 * different handles share no mutable state (not yet exercised by a test).
 */
#ifndef LOCKSTEP_LOCKSTEP_H
#define LOCKSTEP_LOCKSTEP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ====================================================================================
 * 1. Version
 * ==================================================================================== */

#define LOCKSTEP_VERSION_MAJOR 0
#define LOCKSTEP_VERSION_MINOR 1
#define LOCKSTEP_VERSION_PATCH 0
#define LOCKSTEP_VERSION_NUMBER \
    (LOCKSTEP_VERSION_MAJOR * 10000 + LOCKSTEP_VERSION_MINOR * 100 + LOCKSTEP_VERSION_PATCH)
#define LOCKSTEP_STRINGIFY_(x) #x
#define LOCKSTEP_STRINGIFY(x) LOCKSTEP_STRINGIFY_(x)
#define LOCKSTEP_VERSION_STRING                                                  \
    LOCKSTEP_STRINGIFY(LOCKSTEP_VERSION_MAJOR) "." LOCKSTEP_STRINGIFY(           \
        LOCKSTEP_VERSION_MINOR) "." LOCKSTEP_STRINGIFY(LOCKSTEP_VERSION_PATCH)

/* lockstep_version_number:
 * Returns LOCKSTEP_VERSION_NUMBER of the library actually linked, which can
 * differ from the header's when a program runs against another liblockstep.so. */
unsigned lockstep_version_number(void);

/* lockstep_version:
 * Returns the linked library's version as "MAJOR.MINOR.PATCH" (a static
 * string; do not free). */
const char *lockstep_version(void);

/* ====================================================================================
 * 2. Status and errors
 *
 * Every call that can fail returns a lockstep_status: LOCKSTEP_OK (0) on
 * success, else the kind of failure. It also takes a lockstep_error *err
 * (which may be NULL) as its last argument: on failure the call fills it with
 * the same status and a one-line message naming what went wrong and where
 * (file, field, JSON line, byte offset); on success it clears it. Because
 * LOCKSTEP_OK is 0, calls chain with ||, as in the example above.
 *
 * A drift between two traces is a result, not a failure: lockstep_compare
 * returns LOCKSTEP_OK and says so in its verdict.
 * ==================================================================================== */

typedef enum lockstep_status {
    LOCKSTEP_OK = 0,
    LOCKSTEP_E_USAGE = 1,       /* an argument or option is invalid (the message names it) */
    LOCKSTEP_E_INPUT = 2,       /* malformed input: checkpoint, config, trace, tokens */
    LOCKSTEP_E_UNSUPPORTED = 3, /* well-formed but outside what lockstep implements, or no GPU */
    LOCKSTEP_E_IO = 4,          /* open/read/write/rename/mmap failed */
    LOCKSTEP_E_NOMEM = 5,       /* out of memory */
    LOCKSTEP_E_DEVICE = 6,      /* CUDA failure */
    LOCKSTEP_E_CRYPTO = 7,      /* OpenSSL failure */
    LOCKSTEP_E_INTERNAL = 8     /* a bug in lockstep */
} lockstep_status;

#define LOCKSTEP_ERROR_MESSAGE_BYTES 1024

typedef struct lockstep_error {
    lockstep_status status;                     /* LOCKSTEP_OK, or the failure's status */
    char message[LOCKSTEP_ERROR_MESSAGE_BYTES]; /* one line, no newline; "" when OK */
} lockstep_error;

/* lockstep_status_name:
 * Returns a short stable name for st ("ok", "usage", "input", "unsupported",
 * "io", "nomem", "device", "crypto", "internal"; "?" otherwise). Static
 * string. */
const char *lockstep_status_name(lockstep_status st);

/* ====================================================================================
 * 3. Simple API
 * ==================================================================================== */

/* A checkpoint: a Hugging Face Qwen3-Next directory (config.json plus
 * safetensors), its model configuration validated and its tensors hashed. */
typedef struct lockstep_checkpoint lockstep_checkpoint;

/* A sequence of token ids. The tokens are borrowed for the duration of the
 * call that takes the sequence. */
typedef struct lockstep_sequence {
    uint32_t id;            /* the sequence's id in the trace; unique within a run */
    const int32_t *tokens;  /* [n_tokens] ids in 0 .. vocabulary - 1 */
    long n_tokens;          /* rollout: the prompt, >= 1; replay: prompt + completion, >= 2 */
    long prompt_len;        /* replay: prompt tokens, 1 .. n_tokens - 1; rollout: ignored */
} lockstep_sequence;

/* lockstep_checkpoint_open:
 * Opens the checkpoint directory `dir`: validates its safetensors headers,
 * model configuration and tensor shapes (fails closed on anything lockstep
 * does not implement) and hashes every tensor once, on all cores, into the Merkle
 * root that every trace of this handle records. The files are mapped, not
 * copied, and must not change while the handle is open: a file another
 * process truncates raises SIGBUS at the first read past its new end.
 * liblockstep installs no signal handler (a signal's disposition belongs to
 * the program), so by default that kills the process. The lockstep command
 * installs one that names the file, removes its temporary outputs and exits
 * 2 (docs/checkpoint-io.md); a program that wants the same installs its own
 * SIGBUS handler.
 * Returns LOCKSTEP_OK and sets *out to a handle the caller owns and frees
 * with lockstep_checkpoint_close; on failure *out is NULL. */
lockstep_status lockstep_checkpoint_open(const char *dir, lockstep_checkpoint **out,
                                         lockstep_error *err);

/* lockstep_checkpoint_close:
 * Frees the handle and everything it owns (including the last run's
 * summary and completions). NULL is a no-op. */
void lockstep_checkpoint_close(lockstep_checkpoint *ck);

/* Options of a run; NULL means the defaults (section 4). */
typedef struct lockstep_run_options lockstep_run_options;

/* lockstep_rollout:
 * Runs a rollout of the n_prompts prompts: prefills them (packed) and then
 * decodes opts->max_new_tokens tokens (default 16, greedy) for all of them
 * together, and writes the trace to trace_path (through a temporary name
 * renamed when complete; on failure no trace is left). The trace holds per
 * position the token, the selected next token, its logprob, the top-5 and
 * the per-layer digests; its header pins the checkpoint's Merkle root, the
 * digest of the manifest pinned in process and the run parameters.
 * The prompts are borrowed for the call. Returns LOCKSTEP_OK when the trace
 * was written. */
lockstep_status lockstep_rollout(lockstep_checkpoint *ck, const lockstep_sequence *prompts,
                                 long n_prompts, const lockstep_run_options *opts,
                                 const char *trace_path, lockstep_error *err);

/* lockstep_replay:
 * Replays the rollout trace rollout_trace: recomputes every one of its
 * sequences (prompt + generated tokens) teacher-forced, opts->chunk tokens
 * per sequence per step (default: the whole sequence in one step), with the
 * rollout's activation dtype and state-digest cadence unless opts sets them,
 * and writes the trace to trace_path as lockstep_rollout does. The rollout
 * trace must come from the same checkpoint: when its model fingerprint is
 * not ck's Merkle root the call fails (LOCKSTEP_E_INPUT, both roots named)
 * and writes nothing. Returns LOCKSTEP_OK when the trace was written. */
lockstep_status lockstep_replay(lockstep_checkpoint *ck, const char *rollout_trace,
                                const lockstep_run_options *opts, const char *trace_path,
                                lockstep_error *err);

/* The outcome of a comparison (filled by lockstep_compare; caller-owned). */
typedef struct lockstep_verdict {
    int equal;                  /* 1: bitwise equal at every position, and the same positions */
    long sequences;             /* sequences compared */
    long sequences_failed;      /* sequences with a drift or positions in one trace only */
    uint64_t positions;         /* positions present in both traces */
    int drift;                  /* 1 when a first drift is reported in the fields below */
    uint32_t drift_sequence;    /* the sequence of the first drift (in trace A's order) */
    uint32_t drift_position;    /* its position */
    int drift_layer;            /* trace layer index of the drift, -1 when not in a layer */
    char drift_what[24];        /* "token", "digest", "next_token", "logprob", "topk_set",
                                   "topk_order", "topk_logprob" or "missing"; "" when equal */
    char line[768];             /* one line: "equal: ..." or "drift: ..." naming the first
                                   drift's sequence, position, layer and kind */
} lockstep_verdict;

/* Options of a comparison; NULL means the defaults (section 4). */
typedef struct lockstep_compare_options lockstep_compare_options;

/* lockstep_compare:
 * Compares the traces trace_a and trace_b position by position (aligned by
 * sequence id and position, so a rollout and its replay compare whatever
 * their framing) in causal order: input token, each layer's digests, the
 * selected next token, its logprob bits, the top-k. The verdict is bitwise.
 * Returns LOCKSTEP_OK when the comparison ran — whether or not the traces
 * are equal: see v->equal and v->line — and an error when it could not
 * compare (unreadable or truncated trace, different models or layer tables,
 * an incomplete trace). v is filled in every case (equal = 0 on error). */
lockstep_status lockstep_compare(const char *trace_a, const char *trace_b,
                                 const lockstep_compare_options *opts, lockstep_verdict *v,
                                 lockstep_error *err);

/* ====================================================================================
 * 4. Advanced API
 * ==================================================================================== */

/* ---- run options ---------------------------------------------------------------------
 * Start from lockstep_run_options_default and change what you need; a
 * field at its default runs as the simple API (opts NULL) does. threads,
 * chunk, max_rows and reverse_batch change only how the work is scheduled,
 * never a record of the trace: that is what comparing runs proves. The
 * other fields change what is computed or recorded. A field the run does
 * not use must stay at its default, or the run fails (LOCKSTEP_E_USAGE):
 * chunk in a rollout; max_new_tokens and the sampling fields in a replay
 * (teacher-forced); seed, temperature, top_k and top_p with greedy
 * sampling. */
struct lockstep_run_options {
    const char *backend;          /* "cpu" (default) or "cuda" (a CUDA build and a GPU) */
    int threads;                  /* CPU worker threads, >= 1 (default 1) */
    long max_new_tokens;          /* rollout: tokens generated per sequence, >= 1 (default 16) */
    long chunk;                   /* replay: tokens per sequence per step; 0 = whole (default);
                                     a rollout takes 0 */
    const char *activations;      /* "bf16" or "fp32"; NULL (default): bf16 for a rollout and
                                     replay of given tokens, the rollout's for lockstep_replay */
    const char *sampling;         /* rollout: "greedy" (default) or "seeded" */
    uint64_t seed;                /* seeded: the key, with sequence id and position */
    float temperature;            /* seeded: > 0 (default 1) */
    long top_k;                   /* seeded: 0 = all (default) */
    float top_p;                  /* seeded: in (0, 1] (default 1) */
    long state_digest_every;      /* carried-state digest cadence in positions; 0 (default):
                                     64, or the rollout's for lockstep_replay */
    long max_rows;                /* packed tokens per forward, >= 1 (default 256) */
    int reverse_batch;            /* 1: pack the batch in reverse order */
    const char *perturb;          /* "layer=L,op=OP": reverse one operator's reduction order
                                     (gdn, conv, attention, router, experts, combine, norm,
                                     lm_head; cpu only); recorded as a non-strict run. NULL */
    const char *dump_layers;      /* "L,L,...": also store these decoder layers' full tensors */
    int progress;                 /* 1: progress bars on stderr when it is a terminal */
    const char *fp8;              /* FP8 block-quantised checkpoints only: "dequant" (weights
                                     dequantised to fp32) or "w8a8" (activations quantised per
                                     token group of 128); NULL (default): dequant, or the
                                     rollout's for lockstep_replay. Non-NULL for a checkpoint
                                     without quantization_config fails (LOCKSTEP_E_USAGE) */
    const char *gdn_form;         /* the Gated DeltaNet arithmetic: "recurrent" or
                                     "chunk-aligned" (chunks of 64 at absolute positions,
                                     cpu or cuda; docs/numerics.md section 5.1); NULL (default):
                                     recurrent, or the rollout's for lockstep_replay */
    const char *tier;             /* the linears' tier: "portable", "tc" (cuda: on tensor cores
                                     through pinned cuBLASLt algorithms) or "fast" (cuda:
                                     cuBLASLt's per-call choice, a non-strict run;
                                     docs/tensor-core-tier.md); NULL (default): portable, or
                                     the rollout's for lockstep_replay */
};

/* lockstep_run_options_default:
 * Sets *o to the defaults above. */
void lockstep_run_options_default(lockstep_run_options *o);

/* ---- replay of given tokens ----------------------------------------------------------- */

/* lockstep_replay_sequences:
 * Replays the n_seqs full sequences seqs (prompt + completion, with
 * prompt_len set; from another engine's rollout, say) teacher-forced, as
 * lockstep_replay does, and writes the trace to trace_path. The sequences
 * are borrowed for the call. */
lockstep_status lockstep_replay_sequences(lockstep_checkpoint *ck, const lockstep_sequence *seqs,
                                          long n_seqs, const lockstep_run_options *opts,
                                          const char *trace_path, lockstep_error *err);

/* ---- what a run produced ---------------------------------------------------------------- */

typedef struct lockstep_run_summary {
    char model_fingerprint[65];   /* the checkpoint's Merkle root, hex */
    char manifest_digest[65];     /* digest of the manifest pinned in process, hex */
    uint64_t records;             /* trace records written (one per position) */
    uint64_t positions;           /* token positions the model processed */
    double seconds;               /* engine wall time */
    long n_sequences;
    long max_new_tokens;          /* rollout: tokens generated per sequence; replay: 0 */
    const int32_t *completions;   /* rollout: [n_sequences, max_new_tokens] generated tokens,
                                     in the order the prompts were given; replay: NULL */
} lockstep_run_summary;

/* lockstep_checkpoint_last_run:
 * Returns what the last successful run on ck produced, or NULL before the
 * first one. The summary and its completions are owned by ck and valid until
 * its next run or lockstep_checkpoint_close. */
const lockstep_run_summary *lockstep_checkpoint_last_run(const lockstep_checkpoint *ck);

/* lockstep_checkpoint_fingerprint:
 * Returns the checkpoint's Merkle root over every tensor (64 hex digits;
 * owned by ck). */
const char *lockstep_checkpoint_fingerprint(const lockstep_checkpoint *ck);

/* lockstep_checkpoint_vocab_size, lockstep_checkpoint_n_layers:
 * The model's vocabulary size (valid token ids are 0 .. size - 1) and its
 * number of decoder layers. */
long lockstep_checkpoint_vocab_size(const lockstep_checkpoint *ck);
long lockstep_checkpoint_n_layers(const lockstep_checkpoint *ck);

/* ---- compare options and reports -------------------------------------------------------- */

struct lockstep_compare_options {
    int allow_different_model;    /* compare traces whose model fingerprints differ */
    int allow_incomplete;         /* compare a trace without a trailer (a killed run) */
    const char *report_text;      /* human report (table + first drifts), or NULL; "-" = stdout */
    const char *report_json;      /* JSON report (docs/compare-json.schema.json), or NULL */
    const char *report_junit;     /* JUnit XML, one testcase per sequence, or NULL */
    const char *report_html;      /* one self-contained HTML page, or NULL */
};

/* lockstep_compare_options_default:
 * Sets *o to: same model required, complete traces required, no reports. */
void lockstep_compare_options_default(lockstep_compare_options *o);

/* ---- synthetic checkpoints -------------------------------------------------------------- */

/* lockstep_synth_checkpoint:
 * Writes a synthetic Qwen3-Next checkpoint with deterministic random weights
 * (the same preset and seed give the same bytes on every machine) to the
 * directory dir (written under a temporary name, renamed when complete;
 * dir must not exist or be empty). preset: "tiny" (hidden 128, 4 layers,
 * 8 experts, vocabulary 1000; about 3 MB), "small" or "qwen3-next-80b-a3b"
 * (the released configuration, about 160 GB). For tests and examples. */
lockstep_status lockstep_synth_checkpoint(const char *preset, uint64_t seed, const char *dir,
                                          lockstep_error *err);

/* ====================================================================================
 * 5. Stability
 *
 * Stable: the functions, types, macros and struct layouts declared in this
 * header. Within a minor version (0.1.x) the ABI does not change: a program
 * built against 0.1.0 runs against any 0.1.y liblockstep.so (the shared
 * library's soname is liblockstep.so.MAJOR.MINOR). A new minor version may
 * add functions and struct fields; a removal or change of meaning bumps the
 * major version (while MAJOR is 0, the minor version).
 *
 * Not stable: everything else liblockstep exports — the ls_-prefixed
 * internals of the engine, backends, trace reader and writer, comparator and
 * reports, and their headers in the source tree — may change in any release.
 * Trace files carry their own format version (docs/trace-format.md).
 * ==================================================================================== */

#ifdef __cplusplus
}
#endif

#endif
