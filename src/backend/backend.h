/* lockstep — the operator table.
 *
 * The engine (src/engine) is written once against this table; the CPU
 * reference (backend_cpu.c, built on cpu_ops.h) and the CUDA providers
 * (kernels/) implement it. Buffers are opaque and owned by the backend (host
 * memory on the CPU, device memory on CUDA); a backend frees every buffer it
 * handed out when it is destroyed (one arena per run, STYLE habit 6).
 *
 * Operands are views: a buffer plus an element offset. Activation buffers
 * hold fp32 elements (bf16-exact values in bf16 activation mode); index
 * buffers (tokens, positions, expert ids) hold int32 elements. Weights are
 * ls_bweight: a buffer holding a row-major matrix as stored (bf16, fp32, or
 * FP8 e4m3 with a second buffer of block scales; its wtype says whether the
 * FP8 arithmetic is dequant or w8a8, docs/numerics.md §9). linear and the
 * moe's expert matrices take every weight type; embed, conv_silu, router and
 * the shared expert gate take bf16 and fp32 (an FP8 matrix there is
 * LS_E_UNSUPPORTED: the FP8 releases leave them unconverted).
 *
 * Every op has the semantics of the cpu_ops.h function of the same name
 * (docs/numerics.md): same shapes, same act_bf16 and order arguments. A
 * strict provider that cannot honour the contract for a shape returns
 * LS_E_UNSUPPORTED rather than computing something else (fail closed). */
#ifndef LS_BACKEND_BACKEND_H
#define LS_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cpu_ops.h"
#include "core/status.h"
#include "fingerprint/sha256.h"

/* The tiers a backend's linears run in (docs/tensor-core-tier.md): portable
 * (the CPU reference's order, every backend), tc (strict, tensor cores, one
 * pinned algorithm per weight shape) and fast (tensor cores, the library's
 * per-call choice: not row-invariant, the yardstick for what strictness
 * costs). tc and fast are the CUDA backend's (backend_cuda.h). */
typedef enum ls_tier { LS_TIER_PORTABLE = 0, LS_TIER_TC = 1, LS_TIER_FAST = 2 } ls_tier;

typedef struct ls_buf ls_buf;            /* opaque, backend-owned */
typedef struct ls_backend ls_backend;
typedef struct ls_graph ls_graph;        /* opaque, backend-owned: a recorded step */

typedef struct ls_view {
    ls_buf *buf;
    size_t off;                          /* offset in elements (fp32 or int32) */
} ls_view;

static inline ls_view ls_view_at(ls_view v, size_t elems)
{
    ls_view r = {v.buf, v.off + elems};
    return r;
}

typedef struct ls_bweight {
    ls_buf *buf;                         /* holds the matrix */
    size_t off_bytes;                    /* first element of row 0 */
    ls_wtype wtype;
    long rows, cols;                     /* [rows, cols] */
    ls_buf *scale;                       /* FP8 wtypes: fp32 block scales
                                            [LS_FP8_BLOCKS(rows), LS_FP8_BLOCKS(cols)] from
                                            offset 0; NULL otherwise */
} ls_bweight;

/* Weights of one MoE block on the backend. */
typedef struct ls_bmoe {
    long E, D, I, Is;                    /* experts, hidden, expert width, shared width */
    const ls_bweight *gate, *up, *down;  /* [E] each: [I, D], [I, D], [D, I] */
    const ls_bweight *sh_gate, *sh_up;   /* [Is, D]; sh_gate NULL = no shared expert */
    const ls_bweight *sh_down;           /* [D, Is] */
    const ls_bweight *sh_gate_w;         /* shared_expert_gate [1, D] */
} ls_bmoe;

/* The shape of a block copy (copy_blocks). */
typedef struct ls_copy_shape {
    long rows, groups, len;
    long dst_stride, dst_step, src_stride, src_step;
} ls_copy_shape;

/* One block copy of a copy_blocks call. */
typedef struct ls_copy_job {
    ls_view dst, src;
    ls_copy_shape sh;
} ls_copy_job;

#define LS_COPY_JOBS_MAX 8         /* jobs per copy_blocks call */
#define LS_DIGEST_ALL UINT64_MAX   /* digest_wait: every digest call so far */

/* One span of a digest: `rows` rows of `len` elements (4 bytes each, fp32 or
 * int32) starting at src, row starts `stride` elements apart, hashed row by
 * row in order. rows = 0 marks an unused span. */
typedef struct ls_digest_span {
    ls_view src;                         /* first element of row 0 */
    long rows;                           /* >= 0; 0 = span unused */
    long len;                            /* elements per row, >= 0 */
    long stride;                         /* elements between row starts (>= len) */
    int bf16;                            /* 1: each fp32 element hashed as ls_f32_to_bf16 of it
                                            (2 bytes LE; the values are bf16-exact);
                                            0: the raw 4 bytes LE (fp32 or int32) */
} ls_digest_span;

/* One SHA-256: span[0]'s bytes then span[1]'s (docs/trace-format.md §6 gives
 * the canonical bytes of each digest kind; e.g. conv_state is one span of
 * conv_dim rows of W-1 elements at stride W, kv is the K row then the V row).
 *
 * A digest in parts: the jobs of several calls feed one running hash (a
 * logits row, hashed column chunk by column chunk as the lm_head writes
 * it). Each part's job names it in `run`; the part with `first` starts it,
 * the one with an `out` ends it there, those between have out NULL. A
 * hash's parts come in order, one per call at most, and the backend hashes
 * them in that order. The caller owns *run (zeroed before its first use)
 * and frees a context a failed hash left with ls_sha256_discard. */
typedef struct ls_digest_job {
    ls_digest_span span[2];
    ls_digest *out;                      /* host destination, 32 bytes; NULL only for a part
                                            that is not the last */
    ls_sha256 *run;                      /* NULL: the job is the whole digest */
    int first;                           /* with run: this part starts the hash */
} ls_digest_job;

struct ls_backend {
    const char *name;                    /* "cpu", "cuda-portable", ... */
    void *impl;                          /* backend state; owned */
    /* 1: linear computes every output column on its own (one weight row, one
     * canonical dot product: the portable providers), so a call over a block
     * of a weight's rows gives exactly those columns' bits; the engine then
     * computes the lm_head in column chunks and hashes each logits row in
     * parts as they are written. 0: a call's bits may depend on its shape
     * (a GEMM algorithm pinned per shape). */
    int linear_by_column;
    /* 1: LS_ORDER_FAST_TWIN runs the family's fast twin in the ops of the
     * families that have one (CUDA: attention; gdn's gdn_recurrent, with
     * its l2norm_scale canonical; combine on the tc tier) and is refused
     * like any other order elsewhere. 0: no op takes it (the engine refuses
     * a fast-twin perturbation). */
    int fast_twins;

    /* ---- memory ---------------------------------------------------------- */
    /* Zero-filled buffer of `bytes`. */
    ls_status (*alloc)(ls_backend *be, size_t bytes, ls_buf **out, ls_error *err);
    /* Weights: a buffer holding `bytes` from host memory that stays valid for
     * the backend's lifetime (the checkpoint mmap), whose elements are of
     * type wtype (an FP8 matrix's e4m3 bytes: LS_WTYPE_F8_DEQUANT or _W8A8;
     * its block scales: LS_WTYPE_F32). The CPU borrows it; CUDA copies it to
     * the device. host == NULL (a synthetic model's matrix, model.h, on a
     * backend without wrap_generated): a backend created to generate
     * weights fills the buffer itself with values of that type (CUDA with
     * synthetic_weights_seed: bf16 or e4m3 of its own generator, for
     * benchmarks only, backend_cuda.h); every other refuses with
     * LS_E_UNSUPPORTED. */
    ls_status (*wrap_weights)(ls_backend *be, const void *host, size_t bytes, ls_wtype wtype,
                              ls_buf **out, ls_error *err);
    /* Optional (NULL: the engine wraps such a matrix with wrap_weights and
     * host == NULL). A matrix without data that gen generates (a synthetic
     * model's, numerics/types.h ls_wgen): rows r0 .. r0 + rows - 1 of gen's
     * matrix [.., cols] of type wtype, generated into a buffer of this
     * backend (*out); for an FP8 wtype also their block scales (*scale_out,
     * F32 [ceil(rows/128), ceil(cols/128)]). The bytes are those of the same
     * rows of the whole matrix, so a rank that wraps its slice holds what
     * the written checkpoint holds there. */
    ls_status (*wrap_generated)(ls_backend *be, const ls_wgen *gen, long r0, long rows, long cols,
                                ls_wtype wtype, ls_buf **out, ls_buf **scale_out, ls_error *err);
    ls_status (*upload)(ls_backend *be, ls_view dst, const void *src, size_t bytes, ls_error *err);
    ls_status (*download)(ls_backend *be, void *dst, ls_view src, size_t bytes, ls_error *err);
    /* Sets n elements (4 bytes each) to zero. */
    ls_status (*zero)(ls_backend *be, ls_view dst, size_t n, ls_error *err);
    /* n (1..LS_COPY_JOBS_MAX) block copies in one call (one device pass):
     * each copies rows x groups blocks of len elements (4 bytes each),
     * dst[r*dst_stride + g*dst_step + i] = src[r*src_stride + g*src_step + i]
     * for r < rows, g < groups, i < len. No job's dst overlaps its own or
     * another job's src or dst. One group is a plain strided row copy
     * (ls_copy_rows). */
    ls_status (*copy_blocks)(ls_backend *be, const ls_copy_job *jobs, int n, ls_error *err);
    /* Frees every buffer and the backend itself. */
    void (*destroy)(ls_backend *be);

    /* ---- operators (cpu_ops.h) ------------------------------------------- */
    ls_status (*embed)(ls_backend *be, const ls_bweight *emb, ls_view tokens /* i32 [T] */,
                       long T, ls_view h /* [T, D] */, int act_bf16, ls_error *err);
    ls_status (*linear)(ls_backend *be, const ls_bweight *w, ls_view x /* [T, in] */,
                        ls_view y /* [T, out] */, long T, int act_bf16, ls_order order,
                        ls_error *err);
    /* Optional (NULL: nothing to prepare). Called by the engine once for each
     * weight it will pass to linear, before the first step, with the most rows
     * a call will have: a backend that chooses a kernel per weight shape
     * chooses it here, so the choice is made, and can be pinned in the
     * manifest, before the run (the CUDA tensor-core tier qualifies a
     * cuBLASLt algorithm per shape, backend_cuda.h tier). */
    ls_status (*prepare_linear)(ls_backend *be, const ls_bweight *w, long max_rows, ls_error *err);
    ls_status (*rmsnorm)(ls_backend *be, ls_view x /* [R, n] */, ls_view w /* [n] */,
                         ls_view y /* [R, n] */, long R, long n, int act_bf16, ls_order order,
                         ls_error *err);
    ls_status (*gated_rmsnorm)(ls_backend *be, ls_view x /* [R, n] */, ls_view z /* [R, n] */,
                               ls_view w /* [n] */, ls_view y /* [R, n] */, long R, long n,
                               int act_bf16, ls_order order, ls_error *err);
    ls_status (*conv_silu)(ls_backend *be, ls_view x /* [T, x_stride] */, long x_stride,
                           const ls_bweight *w /* [C, K] */, ls_view state /* [C, K] */,
                           ls_view y /* [T, y_stride] */, long y_stride, long T, long C, long K,
                           int act_bf16, ls_order order, ls_error *err);
    ls_status (*gdn_gates)(ls_backend *be, ls_view b /* [T, H] */, ls_view a /* [T, H] */,
                           ls_view A_log /* [H] */, ls_view dt_bias /* [H] */,
                           ls_view beta /* [T, H] */, ls_view alpha /* [T, H] */, long T, long H,
                           int act_bf16, ls_error *err);
    ls_status (*l2norm_scale)(ls_backend *be, ls_view x /* [R, d] */, long R, long d, float scale,
                              ls_order order, ls_error *err);
    ls_status (*gdn_recurrent)(ls_backend *be, ls_view q /* [T, Hk, dk] */,
                               ls_view k /* [T, Hk, dk] */, ls_view v /* [T, Hv, dv] */,
                               ls_view alpha /* [T, Hv] */, ls_view beta /* [T, Hv] */,
                               ls_view state /* [Hv, dk, dv] */, ls_view o /* [T, Hv, dv] */,
                               long T, long Hk, long Hv, long dk, long dv, int act_bf16,
                               ls_order order, ls_error *err);
    /* The chunk-aligned GDN form (backend/cpu_ops.h ls_cpu_gdn_chunked_heads;
     * docs/numerics.md §5.1), optional: NULL on a backend without it. The
     * state holds LS_GDN_CHUNK_STATE_FLOATS(Hv, dk, dv); rows t are
     * positions pos0 + t. gdn_chunked_state writes the recurrent state
     * after position pos (the last one run) [Hv, dk, dv] to s_out. */
    ls_status (*gdn_chunked)(ls_backend *be, ls_view q, ls_view k, ls_view v, ls_view alpha, ls_view beta,
                             ls_view state, ls_view o, long T, long pos0, long Hk, long Hv, long dk, long dv,
                             int act_bf16, ls_order order, ls_error *err);
    ls_status (*gdn_chunked_state)(ls_backend *be, ls_view state, long pos, ls_view s_out, long Hv, long dk,
                                   long dv, ls_error *err);
    /* Floats of the state gdn_chunked carries, where it is not
     * LS_GDN_CHUNK_STATE_FLOATS (NULL): the tensor-core form keeps more per
     * row (kernels/ops.h LS_CUDA_GDN_TC_STATE_FLOATS). */
    size_t (*gdn_chunked_floats)(ls_backend *be, long Hv, long dk, long dv);
    ls_status (*rope_apply)(ls_backend *be, ls_view x /* [T, H, d] */, ls_view cos_t /* [T, R/2] */,
                            ls_view sin_t /* [T, R/2] */, long T, long H, long d, long R,
                            int act_bf16, ls_error *err);
    /* The cache is paged (ls_cpu_kv_row): kc and vc hold pages of `page`
     * positions, the view pt (i32 [cap / page]) maps a sequence's page i to
     * its pool page; pt.buf NULL is the identity (a contiguous [Hkv, cap, d]
     * cache is page = cap with no table). cap: the positions the table
     * covers (a multiple of page); keys past it are never read. */
    ls_status (*attention)(ls_backend *be, ls_view q /* [T, Hq, d] */,
                           ls_view kc /* [pages, Hkv, page, d] */, ls_view vc /* same */,
                           ls_view pt /* i32 [cap / page] or NULL buf */, long page, long cap,
                           ls_view pos /* i32 [T] */, ls_view o /* [T, Hq, d] */,
                           long T, long Hq, long Hkv, long d, int act_bf16, ls_order order,
                           ls_error *err);
    ls_status (*sigmoid_gate)(ls_backend *be, ls_view o /* [n] */, ls_view gate /* [n] */, long n,
                              int act_bf16, ls_error *err);
    ls_status (*router)(ls_backend *be, const ls_bweight *w /* [E, D] */, ls_view x /* [T, D] */,
                        long T, long k, int norm_topk, ls_view probs /* [T, E] */,
                        ls_view ids /* i32 [T, k] */, ls_view weights /* [T, k] */, int act_bf16,
                        ls_order order, ls_error *err);
    ls_status (*moe)(ls_backend *be, const ls_bmoe *mw, ls_view x /* [T, D] */,
                     ls_view ids /* i32 [T, k] */, ls_view weights /* [T, k] */, long k,
                     ls_view out /* [T, D] */, long T, int act_bf16, ls_order order_experts,
                     ls_order order_combine, ls_error *err);
    /* The residual add out = act(h + a) over R rows of n (out is h, or
     * overlaps neither h nor a), then rmsnorm of out into y (y neither h nor
     * out): one launch where a backend can. */
    ls_status (*residual_rmsnorm)(ls_backend *be, ls_view h /* [R, n] */, ls_view a /* [R, n] */,
                                  ls_view out /* [R, n] */, ls_view w /* [n] */, ls_view y /* [R, n] */,
                                  long R, long n, int act_bf16, ls_order order, ls_error *err);
    ls_status (*logprobs)(ls_backend *be, ls_view logits /* [R, V] */, ls_view lp /* [R, V] */,
                          long R, long V, ls_order order, ls_error *err);
    /* What a step's records read of its logprob rows (ls_cpu_lp_summary:
     * top-k, lp at next[r], NaN flag), so that the rows stay on the device. */
    ls_status (*lp_summary)(ls_backend *be, ls_view lp /* [R, V] */, ls_view next /* i32 [R] */,
                            long R, long V, long k, ls_view out /* u32 [R, 2k + 2] */,
                            ls_error *err);

    /* ---- batched mixers (optional) ------------------------------------------ */
    /* NULL on a backend without them: the engine then calls the per-sequence
     * op once per sequence. Sequence s of nseq owns rows row0[s] .. row0[s] +
     * len[s] - 1 of the packed activations (views at row 0) and its own state
     * buffers (offset 0); each sequence's results are those of the
     * per-sequence op called for it alone (host arrays, len 0 = skipped). */
    ls_status (*conv_silu_batch)(ls_backend *be, ls_view x, long x_stride, const ls_bweight *w,
                                 ls_buf *const *states, const long *row0, const long *len,
                                 long nseq, ls_view y, long y_stride, long C, long K,
                                 int act_bf16, ls_order order, ls_error *err);
    ls_status (*gdn_recurrent_batch)(ls_backend *be, ls_view q, ls_view k, ls_view v,
                                     ls_view alpha, ls_view beta, ls_buf *const *states,
                                     const long *row0, const long *len, long nseq, ls_view o,
                                     long Hk, long Hv, long dk, long dv, int act_bf16,
                                     ls_order order, ls_error *err);
    /* The chunk-aligned form (gdn_chunked; NULL where it or its batch is
     * absent): sequence s's rows sit at positions pos0[s] ... */
    ls_status (*gdn_chunked_batch)(ls_backend *be, ls_view q, ls_view k, ls_view v, ls_view alpha,
                                   ls_view beta, ls_buf *const *states, const long *row0,
                                   const long *len, const long *pos0, long nseq, ls_view o, long Hk,
                                   long Hv, long dk, long dv, int act_bf16, ls_order order,
                                   ls_error *err);
    /* Each sequence's K and V rows [len, Hkv, d] to positions pos0[s].. of
     * its caches (paged as in attention: pts[s] its table, NULL pts or a
     * NULL buf = identity; one page and cap for every sequence). pos (i32,
     * one per packed row) holds the same positions on the backend: row
     * row0[s] + i at pos0[s] + i. The copies take their positions from pos,
     * so that a recorded step (graph_begin) writes where its replay's rows go;
     * pos0 bounds the call. */
    ls_status (*kv_append_batch)(ls_backend *be, ls_view k, ls_view v, ls_buf *const *kcs,
                                 ls_buf *const *vcs, const ls_view *pts, long page, long cap,
                                 const long *row0, const long *len, const long *pos0, ls_view pos,
                                 long nseq, long Hkv, long d, ls_error *err);
    ls_status (*attention_batch)(ls_backend *be, ls_view q, ls_buf *const *kcs,
                                 ls_buf *const *vcs, const ls_view *pts, long page, long cap,
                                 const long *row0, const long *len, long nseq, ls_view pos,
                                 ls_view o, long Hq, long Hkv, long d, int act_bf16,
                                 ls_order order, ls_error *err);

    /* ---- expert parallelism (optional) --------------------------------------------
     * NULL on a backend without them: the engine then refuses an expert-parallel
     * run (docs/parallel.md §3.1). They split moe in two, the slot rows and the
     * combine, so that the slot rows of one step can be computed on the ranks
     * that own their experts and combined on another, with the bits of moe.
     *
     * moe_slots: the slot rows of n (token, slot) pairs. pairs holds (t, i):
     * i < k the routed slot i of token t (expert ids[t][i], weight
     * weights[t][i]), i = k its shared expert. Row j of c is that slot's output
     * exactly as moe computes it (ls_cpu_moe_slot): act(y · w), or act(γ ·
     * shared(x)). Only the experts the pairs name need their weights (an EP
     * rank wraps its own; the others may have a NULL buf); a pair outside
     * 0..T-1, 0..k (0..k-1 without a shared expert), or naming an expert whose
     * weights are absent fails with LS_E_INTERNAL. */
    ls_status (*moe_slots)(ls_backend *be, const ls_bmoe *mw, ls_view x /* [T, D] */,
                           ls_view ids /* i32 [T, k] */, ls_view weights /* [T, k] */, long k,
                           long T, ls_view pairs /* i32 [n, 2] */, long n, ls_view c /* [n, D] */,
                           int act_bf16, ls_order order_experts, ls_error *err);
    /* moe_combine: out[t] from token t's slot rows c[t] (slots = k + has_shared:
     * the k routed slots in top-k order, then the shared one), exactly as moe
     * combines them (ls_cpu_moe_combine). */
    ls_status (*moe_combine)(ls_backend *be, ls_view c /* [T, k + has_shared, D] */, long k,
                             long D, int has_shared, ls_view out /* [T, D] */, long T, int act_bf16,
                             ls_order order_combine, ls_error *err);

    /* ---- digests ----------------------------------------------------------- */
    /* Computes n_jobs independent SHA-256 digests over backend buffers and
     * writes each to its job's host `out`. The engine batches a layer's rows
     * into one call; every digest lockstep records goes through here. The
     * spans are read, never written, and read in op order: an op issued after
     * the call may overwrite them at once. A backend may finish the jobs
     * later (the CUDA backend encodes on the device and hashes on host
     * threads while the device runs on): then every `out` is written, and
     * any failure reported, by the next digest_wait. NULL digest on a backend
     * without the op: the engine then refuses to run (fail closed). */
    ls_status (*digest)(ls_backend *be, const ls_digest_job *jobs, long n_jobs, ls_error *err);
    /* Completes the digest calls made before `mark` was taken (digest_mark;
     * LS_DIGEST_ALL: every call so far); calls made since may still run: their
     * `out` destinations and running hashes are written to until a wait
     * covers them. NULL:
     * digest completes in the call. Returns the first failure since the last
     * wait. The job arrays may be reused once a call returns. */
    ls_status (*digest_wait)(ls_backend *be, uint64_t mark, ls_error *err);
    /* A mark of the digest calls so far (NULL with digest_wait). */
    uint64_t (*digest_mark)(ls_backend *be);
    /* Optional (NULL: the caller uses digest). digest_early is digest, except
     * that its spans may be read while the ops issued after the call run, up
     * to the next digest_fence: the caller writes none of them before that
     * fence. The CUDA backend, while a step graph is recorded, encodes them
     * on a branch of the graph beside those ops (joined by the fence, or by
     * graph_end), off the step's critical path. */
    ls_status (*digest_early)(ls_backend *be, const ls_digest_job *jobs, long n_jobs, ls_error *err);
    ls_status (*digest_fence)(ls_backend *be, ls_error *err);

    /* ---- step graphs (optional; NULL on a backend without them) ----------------
     * graph_begin starts recording the device work of the calls that follow
     * instead of running it; graph_end stops and, with keep, makes the record
     * g's (replacing what g held); graph_launch replays it: the same kernels
     * on the same buffers with the same arguments, so the same bits, for a
     * fraction of the host's time. *g NULL: graph_begin makes a new graph,
     * the backend's until graph_free or its destruction. Digest calls while
     * recording stage their jobs in g's own memory (whole jobs only: a digest
     * in parts fails); each launch hands them to the hashing as one digest
     * call would (done by the next digest_wait covering it). A call that
     * cannot be recorded (a synchronous transfer or allocation) fails; the
     * caller then ends with keep 0, which drops the record and leaves g
     * empty (nothing to launch until recorded again). Recording does not run
     * anything: a caller replays what it recorded
     * (graph_launch) to have it done. Reading host values into launch
     * arguments is recorded as the values: a graph is replayed only where
     * every such argument is the same. */
    ls_status (*graph_begin)(ls_backend *be, ls_graph **g, ls_error *err);
    ls_status (*graph_end)(ls_backend *be, ls_graph *g, int keep, ls_error *err);
    ls_status (*graph_launch)(ls_backend *be, ls_graph *g, ls_error *err);
    void (*graph_free)(ls_backend *be, ls_graph *g);
};

/* The CPU reference backend. n_threads >= 1 worker threads split rows,
 * output columns and tokens without changing any result bit. */
ls_status ls_backend_cpu_create(int n_threads, ls_backend **out, ls_error *err);

/* A copy_blocks job of one group: `rows` rows of `len` elements,
 * dst[r*dst_stride + i] = src[r*src_stride + i]. */
static inline ls_copy_job ls_copy_rows_job(ls_view dst, long dst_stride, ls_view src, long src_stride,
                                           long rows, long len)
{
    ls_copy_job j = {dst, src, {rows, 1, len, dst_stride, 0, src_stride, 0}};
    return j;
}

/* That job alone. */
static inline ls_status ls_copy_rows(ls_backend *be, ls_view dst, long dst_stride, ls_view src,
                                     long src_stride, long rows, long len, ls_error *err)
{
    ls_copy_job j = ls_copy_rows_job(dst, dst_stride, src, src_stride, rows, len);
    return be->copy_blocks(be, &j, 1, err);
}

#endif
