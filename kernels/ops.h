/* lockstep — portable strict CUDA kernels (C API).
 *
 * One function per operator of docs/numerics.md §3–4, with the semantics,
 * shapes and argument order of the CPU reference function of the same name in
 * src/backend/cpu_ops.h (ls_cuda_X ≙ ls_cpu_X): CUDA cores only, fp32
 * accumulation, every dot product / sum in LS_DOT32 order as one warp (lane l
 * strides k ≡ l mod 32, then the xor butterfly), no atomics, no split-K, and
 * the same kernel and order for 1 token and for thousands (row invariance).
 * The results are bit-identical to the CPU reference; tests/gpu/
 * test_conformance checks every function against it.
 *
 * All pointers are device pointers. Activations are fp32 (bf16-exact values
 * when act_bf16 = 1); ids and positions int32. Weights are as stored:
 * wtype 0 = bf16 (uint16_t), 1 = fp32, and for linear and the MoE's experts
 * 2 = e4m3 dequant, 3 = e4m3 w8a8 (the values of ls_wtype). `order` is an
 * ls_order; only LS_ORDER_CANONICAL (0) is implemented here, anything else
 * fails closed with LS_E_UNSUPPORTED, as does a shape a kernel cannot honour
 * (the message names the operator and the shape). `stream` is a cudaStream_t
 * (NULL = default stream); calls are asynchronous, errors of the launch are
 * reported at once, faults at the next ls_cuda_sync. */
#ifndef LS_KERNELS_OPS_H
#define LS_KERNELS_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/status.h"

/* Largest head dims the register-resident kernels take (fail closed above). */
#define LS_CUDA_GDN_MAX_DK 128
/* Rows per chunk of the chunk-aligned GDN form (= LS_GDN_CHUNK of backend/cpu_ops.h). */
#define LS_CUDA_GDN_CHUNK 64
#define LS_CUDA_ATT_MAX_D 256
#define LS_CUDA_CONV_MAX_K 8
/* Sequences per launch of the batched mixer entries (more: several launches). */
#define LS_CUDA_SEQ_CHUNK 64

/* h[t] = act(E[tokens[t]]). Token ids outside [0, V) give zeros (the engine
 * validates ids first). */
ls_status ls_cuda_embed(const void *emb /* [V, D] */, int wtype, long V, long D,
                        const int32_t *tokens /* [T] */, long T, float *h /* [T, D] */,
                        int act_bf16, void *stream, ls_error *err);

/* y[t][o] = act(DOT32(W[o,:], x[t,:])), each token's order LS_DOT32 whatever
 * the plan: one warp per output row with 16-byte weight loads (plan 0, up
 * to 8 tokens a row pass); from 2 tokens blocks of 16 rows x 8 tokens,
 * weights and activations staged in shared memory, each value read there
 * meeting 4 rows or 8 tokens (plan 1); one token of bf16 weights with in
 * 2048 or 4096, x staged in shared memory and each warp holding whole rows
 * in registers (at 2048 the next row loading while it adds one; plan 2, the
 * default there; plan 0 elsewhere). */
ls_status ls_cuda_linear(const void *w /* [out, in] */, int wtype, long out, long in,
                         const float *x /* [T, in] */, float *y /* [T, out] */, long T,
                         int act_bf16, int order, void *stream, ls_error *err);

/* The same with an explicit plan (0 .. ls_cuda_linear_plan_count()-1; -1 =
 * the default choice above); every plan gives the same bits. */
ls_status ls_cuda_linear_plan(const void *w, int wtype, long out, long in, const float *x, float *y,
                              long T, int act_bf16, int order, int plan, void *stream,
                              ls_error *err);
int ls_cuda_linear_plan_count(void);
const char *ls_cuda_linear_plan_name(int plan);

/* FP8 block-quantised weights (docs/numerics.md §9): w [out, in] e4m3 bytes
 * with scale [ceil(out/128), ceil(in/128)] fp32, wtype 2 (dequant: x the fp32
 * activations, xsc NULL) or 3 (w8a8: x the token rows quantised by
 * ls_cuda_fp8_quant_act, xsc their group scales [T, ceil(in/128)]); the
 * linear kernel above with ls_dot32_f8 / ls_dot_w8a8's order per row. */
ls_status ls_cuda_linear_f8(const uint8_t *w, const float *scale, int wtype, long out, long in,
                            const float *x, const float *xsc, float *y, long T, int act_bf16,
                            int order, void *stream, ls_error *err);

/* The w8a8 activation quantiser: T rows of n, per group of 128
 * (ls_fp8_quant_row): q [T, n] e4m3 values as fp32, s [T, ceil(n/128)]. */
ls_status ls_cuda_fp8_quant_act(const float *x /* [T, n] */, long T, long n,
                                float *q /* [T, n] */, float *s /* [T, ceil(n/128)] */,
                                void *stream, ls_error *err);

/* Zero-centred RMSNorm over rows of n (y may equal x). */
ls_status ls_cuda_rmsnorm(const float *x /* [R, n] */, const float *w /* [n] */,
                          float *y /* [R, n] */, long R, long n, int act_bf16, int order,
                          void *stream, ls_error *err);

/* Gated RMSNorm per value head (y may equal x). */
ls_status ls_cuda_gated_rmsnorm(const float *x /* [R, n] */, const float *z /* [R, n] */,
                                const float *w /* [n] */, float *y /* [R, n] */, long R, long n,
                                int act_bf16, int order, void *stream, ls_error *err);

/* Causal depthwise conv + SiLU, state [C, K] (column K-1 most recent),
 * updated in place; one thread per channel walks the T tokens. K <= 8. */
ls_status ls_cuda_conv_silu(const float *x /* [T, x_stride] */, long x_stride,
                            const void *w /* [C, K] */, int wtype, float *state /* [C, K] */,
                            float *y /* [T, y_stride] */, long y_stride, long T, long C, long K,
                            int act_bf16, int order, void *stream, ls_error *err);

/* ls_cuda_conv_silu for nseq sequences in one launch per 64: sequence s owns
 * rows row0[s] .. row0[s]+len[s]-1 of x and y and its own state states[s]. */
ls_status ls_cuda_conv_silu_batch(const float *x /* [T, x_stride] */, long x_stride,
                                  const void *w /* [C, K] */, int wtype, float *const *states,
                                  const long *row0, const long *len, long nseq,
                                  float *y /* [T, y_stride] */, long y_stride, long C, long K,
                                  int act_bf16, int order, void *stream, ls_error *err);

/* β = act(sigmoid(b)); α = exp(−exp(A_log) · softplus(a + dt_bias)). */
ls_status ls_cuda_gdn_gates(const float *b /* [T, H] */, const float *a /* [T, H] */,
                            const float *A_log /* [H] */, const float *dt_bias /* [H] */,
                            float *beta /* [T, H] */, float *alpha /* [T, H] */, long T, long H,
                            int act_bf16, void *stream, ls_error *err);

/* x_i = (x_i · rsqrt(DOT32(x,x) + 1e-6)) · scale per row of d, in place. */
ls_status ls_cuda_l2norm_scale(float *x /* [R, d] */, long R, long d, float scale, int order,
                               void *stream, ls_error *err);

/* GDN recurrent rule over T tokens of one sequence, fp32 state carried in
 * registers across the tokens: block = (32 value columns, value head); lane l
 * holds key rows i ≡ l (mod 32), so DOT32 over the key dim is the warp
 * butterfly. Decode (T = 1) and replay use this same kernel. dk <= 128. */
ls_status ls_cuda_gdn_recurrent(const float *q /* [T, Hk, dk] */, const float *k /* [T, Hk, dk] */,
                                const float *v /* [T, Hv, dv] */, const float *alpha /* [T, Hv] */,
                                const float *beta /* [T, Hv] */, float *state /* [Hv, dk, dv] */,
                                float *o /* [T, Hv, dv] */, long T, long Hk, long Hv, long dk,
                                long dv, int act_bf16, int order, void *stream, ls_error *err);

/* ls_cuda_gdn_recurrent for nseq sequences in one launch per 64: sequence s
 * owns rows row0[s] .. row0[s]+len[s]-1 of q, k, v, alpha, beta and o (a
 * packed batch) and its own state states[s] (device). Host arrays; len 0 =
 * skipped. Each sequence's bits are those of its own ls_cuda_gdn_recurrent. */
ls_status ls_cuda_gdn_recurrent_batch(const float *q, const float *k, const float *v,
                                      const float *alpha, const float *beta,
                                      float *const *states, const long *row0, const long *len,
                                      long nseq, float *o, long Hk, long Hv, long dk, long dv,
                                      int act_bf16, int order, void *stream, ls_error *err);

/* The chunk-aligned GDN form (docs/numerics.md §5.1), bit for bit the CPU's
 * ls_cpu_gdn_chunked_heads over all Hv heads: T tokens at positions pos0 ..
 * pos0+T-1 of one sequence; state is S0 [Hv, dk, dv] then the chunk's rows
 * k [Hv, C, dk], u [Hv, C, dv], alpha [Hv, C] (LS_GDN_CHUNK_STATE_FLOATS).
 * Block = (32 value columns, value head), tokens in order; a second launch
 * writes the call's key rows and alphas into the chunk area. dk <= 128. */
ls_status ls_cuda_gdn_chunked(const float *q /* [T, Hk, dk] */, const float *k /* [T, Hk, dk] */,
                              const float *v /* [T, Hv, dv] */, const float *alpha /* [T, Hv] */,
                              const float *beta /* [T, Hv] */, float *state /* chunk state */,
                              float *o /* [T, Hv, dv] */, long T, long pos0, long Hk, long Hv,
                              long dk, long dv, int act_bf16, int order, void *stream,
                              ls_error *err);

/* The recurrent state after position pos (the last one run) of the
 * chunk-aligned state into s_out [Hv, dk, dv]: ls_cpu_gdn_chunked_state_heads. */
ls_status ls_cuda_gdn_chunked_state(const float *state /* chunk state */, long pos,
                                    float *s_out /* [Hv, dk, dv] */, long Hv, long dk, long dv,
                                    void *stream, ls_error *err);

/* The chunk-aligned GDN form on tensor cores (docs/tensor-core-tier.md §3):
 * the rule of ls_cuda_gdn_chunked (chunks at absolute multiples of C = 64,
 * row r of a chunk reads rows <= r only, so a token's bits do not depend on
 * how its chunk's rows were split between calls), not its arithmetic:
 * per row, U_r = β_r v_r − Σ_{s<r} A_rs U_s and W_r = β_r e^{Γ_r} k_r −
 * Σ_{s<r} A_rs W_s (A_rs = β_r (k_r · k_s) e^{Γ_r − Γ_s}, Γ the running sum
 * of log α from the chunk's start) on CUDA cores; V_r = U_r − W_r S0 and
 * e^{Γ_r} q_r S0 on tensor cores (WMMA tf32); o_r = e^{Γ_r} q_r S0 +
 * Σ_{s<=r} (q_r · k_s) e^{Γ_r − Γ_s} V_s on CUDA cores; a full chunk folds
 * into S0 ← e^{Γ_63} S0 + Σ_s k_s ⊗ (e^{Γ_63 − Γ_s} V_s) on tensor cores.
 * The state is S0 [Hv, dk, dv] then per head the chunk's rows k [C, dk],
 * W [C, dk], U [C, dv], V [C, dv], Γ [C] (LS_CUDA_GDN_TC_STATE_FLOATS).
 * dk a multiple of 16, dv of 32, both <= 128. scratch (device, 256-byte
 * aligned) holds ls_cuda_gdn_tc_scratch_bytes(T, Hv, dk, dv) bytes. */
#define LS_CUDA_GDN_TC_ROW_FLOATS(dk, dv) (2 * (size_t)(dk) + 2 * (size_t)(dv) + 1)
#define LS_CUDA_GDN_TC_STATE_FLOATS(Hv, dk, dv) \
    ((size_t)(Hv) * ((size_t)(dk) * (size_t)(dv) + LS_CUDA_GDN_CHUNK * LS_CUDA_GDN_TC_ROW_FLOATS(dk, dv)))
size_t ls_cuda_gdn_tc_scratch_bytes(long T, long Hv, long dk, long dv);
ls_status ls_cuda_gdn_chunked_tc(const float *q /* [T, Hk, dk] */, const float *k /* [T, Hk, dk] */,
                                 const float *v /* [T, Hv, dv] */, const float *alpha /* [T, Hv] */,
                                 const float *beta /* [T, Hv] */, float *state /* tc chunk state */,
                                 float *o /* [T, Hv, dv] */, long T, long pos0, long Hk, long Hv, long dk,
                                 long dv, int act_bf16, void *scratch, size_t scratch_bytes, void *stream,
                                 ls_error *err);
/* A decode step of nseq sequences in one launch per kernel: sequence s runs
 * the one position pos[s] (its inputs at row row0[s] of q, k, v, α, β, its
 * output at row row0[s] of o) on its own tc chunk state states[s], with the
 * bits of ls_cuda_gdn_chunked_tc called for it alone with T = 1. scratch
 * (device, 16-byte aligned) holds ls_cuda_gdn_tc_decode_scratch_bytes(nseq,
 * Hv, dk, dv) bytes (the start state of a chunk a sequence folds). */
size_t ls_cuda_gdn_tc_decode_scratch_bytes(long nseq, long Hv, long dk, long dv);
ls_status ls_cuda_gdn_chunked_tc_decode(const float *q, const float *k, const float *v, const float *alpha,
                                        const float *beta, float *const *states, const long *row0,
                                        const long *pos, long nseq, float *o, long Hk, long Hv, long dk,
                                        long dv, int act_bf16, void *scratch, size_t scratch_bytes,
                                        void *stream, ls_error *err);
/* The recurrent state after position pos (the last one run) of the tc
 * chunk state into s_out [Hv, dk, dv]: S0 when pos ends a chunk, else
 * e^{Γ_r} S0 + Σ_{s<=r ascending} e^{Γ_r − Γ_s} k_s ⊗ V_s on CUDA cores. */
ls_status ls_cuda_gdn_chunked_tc_state(const float *state, long pos, float *s_out /* [Hv, dk, dv] */, long Hv,
                                       long dk, long dv, void *stream, ls_error *err);

/* The fast tier's GDN over T tokens of one sequence (docs/tensor-core-tier.md
 * §6), as FLA's chunked prefill does it: chunks of LS_CUDA_GDN_CHUNK counted
 * from the call's first token (pos0 taken as 0), from and back into the
 * recurrent state [Hv, dk, dv] of ls_cuda_gdn_recurrent (its decode steps
 * stay recurrent). The bits depend on where the call starts: neither
 * chunk-invariant nor equal to the recurrence. The shapes of
 * ls_cuda_gdn_chunked_tc; scratch (device, 256-byte aligned) holds
 * ls_cuda_gdn_fast_scratch_bytes(T, Hv, dk, dv) bytes. */
size_t ls_cuda_gdn_fast_scratch_bytes(long T, long Hv, long dk, long dv);
ls_status ls_cuda_gdn_fast(const float *q, const float *k, const float *v, const float *alpha, const float *beta,
                           float *state /* [Hv, dk, dv] */, float *o, long T, long Hk, long Hv, long dk, long dv,
                           int act_bf16, void *scratch, size_t scratch_bytes, void *stream, ls_error *err);

/* Partial rotate-half RoPE in place; tables from ls_cpu_rope_table (host),
 * uploaded: cos_t/sin_t [T, R/2], one row per token of the call. */
ls_status ls_cuda_rope_apply(float *x /* [T, H, d] */, const float *cos_t /* [T, R/2] */,
                             const float *sin_t /* [T, R/2] */, long T, long H, long d, long R,
                             int act_bf16, void *stream, ls_error *err);

/* Attention (docs/numerics.md §4): one warp per (query, head), keys in
 * blocks of 32 from position 0, lane = key within the block. d <= 256. The
 * cache is paged as ls_cpu_kv_row has it: [pages, Hkv, page, d], pt [cap /
 * page] (device) maps a sequence's page to a cache page, NULL = identity (a
 * contiguous [Hkv, cap, d] cache is page = cap, pt NULL). */
ls_status ls_cuda_attention(const float *q /* [T, Hq, d] */,
                            const float *kc /* [pages, Hkv, page, d] */, const float *vc,
                            const int32_t *pt /* [cap / page] or NULL */, long page, long cap,
                            const int32_t *pos /* [T] */, float *o /* [T, Hq, d] */, long T,
                            long Hq, long Hkv, long d, int act_bf16, int order, void *stream,
                            ls_error *err);

/* ls_cuda_attention for nseq sequences in one launch per 64: sequence s owns
 * rows row0[s] .. row0[s]+len[s]-1 of q, pos and o, and its caches kcs[s],
 * vcs[s] with table pts[s] (device pointers in host arrays; pts NULL: every
 * table the identity). Given scratch of ls_cuda_attention_scratch_bytes
 * (device; NULL or 0 bytes: none), a launch whose sequences have one query
 * each spreads its key blocks over the GPU (same bits). */
ls_status ls_cuda_attention_batch(const float *q, const float *const *kcs,
                                  const float *const *vcs, const int32_t *const *pts, long page,
                                  long cap, const long *row0, const long *len, long nseq,
                                  const int32_t *pos, float *o, long Hq, long Hkv, long d,
                                  int act_bf16, int order, void *scratch, void *stream, ls_error *err);
size_t ls_cuda_attention_scratch_bytes(long nseq, long Hq, long d, long cap);

/* The fast tier's attention (docs/tensor-core-tier.md §6): the arguments of
 * ls_cuda_attention_batch, each (query, head)'s keys split into spans whose
 * count depends on the call's queries and heads (split-KV), fused
 * multiply-adds and __expf. Not batch-invariant, not the strict order. The
 * scratch is ls_cuda_attention_fast_scratch_bytes of the same sequences
 * (0 when no call splits; device). */
ls_status ls_cuda_attention_fast_batch(const float *q, const float *const *kcs, const float *const *vcs,
                                       const int32_t *const *pts, long page, long cap, const long *row0,
                                       const long *len, long nseq, const int32_t *pos, float *o, long Hq,
                                       long Hkv, long d, int act_bf16, void *scratch, size_t scratch_bytes,
                                       void *stream, ls_error *err);
size_t ls_cuda_attention_fast_scratch_bytes(const long *row0, const long *len, long nseq, long Hq, long d,
                                            long cap);

/* KV-cache append for nseq sequences: rows row0[s] + i of k, v [T, Hkv, d]
 * go to position pos[row0[s] + i] of head h of kcs[s], vcs[s] (paged as
 * above); pos (device, one per row) holds pos0[s] + i there, and the host's
 * pos0 bounds the launch, so a recorded launch writes its replay's
 * positions. */
ls_status ls_cuda_kv_append_batch(const float *k, const float *v, float *const *kcs,
                                  float *const *vcs, const int32_t *const *pts, long page,
                                  long cap, const long *row0, const long *len, const long *pos0,
                                  const int32_t *pos, long nseq, long Hkv, long d, void *stream,
                                  ls_error *err);

/* o_i = act(o_i · act(sigmoid(gate_i))). */
ls_status ls_cuda_sigmoid_gate(float *o /* [n] */, const float *gate /* [n] */, long n,
                               int act_bf16, void *stream, ls_error *err);

/* Router: logits (linear), softmax (max, exp, SUM32), top-k descending with
 * ties to the lower index, renormalisation in top-k order. */
ls_status ls_cuda_router(const void *w /* [E, D] */, int wtype, long E, long D,
                         const float *x /* [T, D] */, long T, long k, int norm_topk,
                         float *probs /* [T, E] */, int32_t *ids /* [T, k] */,
                         float *weights /* [T, k] */, int act_bf16, int order, void *stream,
                         ls_error *err);

/* MoE block weights on the device: per-expert row pointers (device arrays of
 * device pointers, one entry per expert). The routed experts share one wtype,
 * the shared expert's three matrices another, the shared expert gate vector
 * a third (bf16 or fp32); FP8 matrices come with their block scales. */
typedef struct ls_cuda_moe {
    long E, D, I, Is;              /* experts, hidden, expert width, shared width */
    int wtype;                     /* routed experts: 0 bf16, 1 fp32, 2 e4m3 dequant, 3 e4m3 w8a8 */
    const void *const *gate;       /* device [E] -> [I, D] */
    const void *const *up;         /* device [E] -> [I, D] */
    const void *const *down;       /* device [E] -> [D, I] */
    const float *const *gate_s;    /* FP8: device [E] -> [ceil(I/128), ceil(D/128)]; else NULL */
    const float *const *up_s;      /* FP8: device [E] -> [ceil(I/128), ceil(D/128)] */
    const float *const *down_s;    /* FP8: device [E] -> [ceil(D/128), ceil(I/128)] */
    const void *sh_gate;           /* [Is, D]; NULL = no shared expert */
    const void *sh_up;             /* [Is, D] */
    const void *sh_down;           /* [D, Is] */
    int sh_wtype;                  /* the shared expert's gate, up, down (as wtype) */
    const float *sh_gate_s, *sh_up_s, *sh_down_s; /* FP8 scales of those; else NULL */
    const void *sh_gate_w;         /* [1, D] */
    int shg_wtype;                 /* sh_gate_w: 0 bf16, 1 fp32 */
    int tc_layout;                 /* 1: gate, up and down of every expert (routed and shared)
                                      are in the tensor-core layout (ls_cuda_moe_tc_pack), which
                                      the tensor-core experts need and the portable ones refuse */
} ls_cuda_moe;

/* Scratch the MoE needs for T tokens (bytes of device memory). */
size_t ls_cuda_moe_scratch_bytes(const ls_cuda_moe *mw, long T, long k);

/* Routed experts + combine + gated shared expert (ls_cpu_moe): while T k <= E
 * (decode) every (token, slot) pair is its own tile, above that the pairs are
 * grouped by expert so that its weights are read once per tile of up to 64
 * pairs; bf16 and fp32 experts stream their rows through shared memory
 * (ls_tile_dots: one weight read meets 8 pairs of a grouped tile), FP8
 * experts go a warp per row. Either way each pair's dots are the canonical
 * DOT32 of its own activations, so a token's output does not depend on which
 * other tokens chose the expert; combine a sequential fp32 sum in top-k
 * order. T k must fit int32. */
ls_status ls_cuda_moe_forward(const ls_cuda_moe *mw, const float *x /* [T, D] */,
                              const int32_t *ids /* [T, k] */, const float *weights /* [T, k] */,
                              long k, float *out /* [T, D] */, long T, void *scratch,
                              int act_bf16, int order_experts, int order_combine, void *stream,
                              ls_error *err);

/* The same with an explicit kernel plan (0 .. ls_cuda_moe_plan_count()-1;
 * -1 = the default choice above); every plan gives the same bits. */
ls_status ls_cuda_moe_forward_plan(const ls_cuda_moe *mw, const float *x, const int32_t *ids,
                                   const float *weights, long k, float *out, long T, void *scratch,
                                   int act_bf16, int order_experts, int order_combine, int plan,
                                   void *stream, ls_error *err);
int ls_cuda_moe_plan_count(void);
const char *ls_cuda_moe_plan_name(int plan);

/* Rewrites the bf16 matrix w [N, K] (N and K multiples of 16, 32-byte
 * aligned) in place into the tensor-core experts' layout: each 16 x 16
 * fragment of its rows whole, as one warp's 512-byte load
 * (kernels/ops_moe.cu, docs/tensor-core-tier.md §2.3). scratch: N K 2 bytes
 * of device memory, 32-byte aligned. Packing a matrix twice scrambles it. */
ls_status ls_cuda_moe_tc_pack(void *w, long N, long K, void *scratch, void *stream, ls_error *err);

/* The tensor-core tier's experts (docs/tensor-core-tier.md §2.3): the same
 * grouping, slot rows and combine as ls_cuda_moe_forward, each expert's
 * gate/up and down products on tensor cores (bf16 operands: x and the
 * hidden rows rounded to bf16; fp32 accumulation in ascending K steps of 16;
 * one pass per 16 pairs of an expert, so a pair's bits do not depend on the
 * others). bf16 experts, D, I and Is multiples of 16, every matrix 32-byte
 * aligned and in the tensor-core layout (mw->tc_layout); else
 * LS_E_UNSUPPORTED.
 * Scratch: ls_cuda_moe_scratch_bytes(mw, T, k). */
ls_status ls_cuda_moe_forward_tc(const ls_cuda_moe *mw, const float *x /* [T, D] */,
                                 const int32_t *ids /* [T, k] */, const float *weights /* [T, k] */,
                                 long k, float *out /* [T, D] */, long T, void *scratch,
                                 int act_bf16, int order_experts, int order_combine, void *stream,
                                 ls_error *err);

/* The fast tier's experts and combine (docs/tensor-core-tier.md §6): the
 * tensor-core experts of ls_cuda_moe_forward_tc, whose routed slot rows are
 * added into out with fp32 atomics as the down products finish (the order
 * is the hardware's, run to run), then the shared slot. Not deterministic;
 * the arguments, requirements and scratch of ls_cuda_moe_forward_tc. */
ls_status ls_cuda_moe_forward_fast(const ls_cuda_moe *mw, const float *x, const int32_t *ids,
                                   const float *weights, long k, float *out, long T, void *scratch,
                                   int act_bf16, int order_experts, int order_combine, void *stream,
                                   ls_error *err);

/* Expert parallelism (backend.h moe_slots, moe_combine). ls_cuda_moe_slots:
 * the slot rows of the pairs (t, i) (i < k routed slot i, i = k the shared
 * slot) whose token t is in t0 .. t0+T-1, with x, ids and weights the rows
 * of those T tokens (token t0 first): row j of c is pair j's slot row, the
 * one ls_cuda_moe_forward combines (ls_cpu_moe_slot); rows of pairs outside
 * the tokens are left as they are. Every pair (t, i < k) of the tokens whose
 * id is in [0, E) is computed (-1 in ids: none), and with mw->sh_gate every
 * token's shared slot, so ids names the pairs to compute and mw holds their
 * experts' weights. With mw->tc_layout the rows are the tensor-core
 * experts' (the ones ls_cuda_moe_forward_tc combines). Scratch:
 * ls_cuda_moe_scratch_bytes(mw, T, k). */
ls_status ls_cuda_moe_slots(const ls_cuda_moe *mw, const float *x /* [T, D] */,
                            const int32_t *ids /* [T, k] */, const float *weights /* [T, k] */,
                            long k, long t0, long T, const int32_t *pairs /* [n, 2] */, long n,
                            float *c /* [n, D] */, void *scratch, int act_bf16, int order_experts,
                            void *stream, ls_error *err);

/* out[t] = the canonical combine of token t's slot rows c[t] (the k routed
 * ones in top-k order, then the shared one): ls_cpu_moe_combine. */
ls_status ls_cuda_moe_combine(const float *c /* [T, k + has_shared, D] */, long k, long D,
                              int has_shared, float *out /* [T, D] */, long T, int act_bf16,
                              int order_combine, void *stream, ls_error *err);

/* out_i = act(h_i + a_i) (out may be h). */
ls_status ls_cuda_residual(float *out /* [n] */, const float *h /* [n] */, const float *a /* [n] */, long n,
                           int act_bf16, void *stream, ls_error *err);

/* The residual add, then RMSNorm of its rows: out = act(h + a) (out is h or
 * apart from it), then y = ls_cuda_rmsnorm(out) (y neither h nor out): the
 * same two operations, one launch for rows of 1024..8192, else the two
 * kernels. */
ls_status ls_cuda_residual_rmsnorm(const float *h /* [R, n] */, const float *a /* [R, n] */,
                                   float *out /* [R, n] */, const float *w /* [n] */, float *y /* [R, n] */,
                                   long R, long n, int act_bf16, int order, void *stream, ls_error *err);

/* The tensor-core tier's linear (docs/tensor-core-tier.md §2.2) around its
 * pinned cuBLASLt GEMM: x fp32 [n] to bf16 (round to nearest even: exact for
 * bf16 activations); and y [T, n] = act(src [T, ld]) (ld >= n: the GEMM's
 * output padded to a multiple of 8 columns; in place when src == y, ld == n,
 * where fp32 activations leave nothing to do). */
ls_status ls_cuda_tc_to_bf16(const float *x, uint16_t *xb, long n, void *stream, ls_error *err);
ls_status ls_cuda_tc_out(const float *src, long ld, float *y, long T, long n, int act_bf16, void *stream,
                         ls_error *err);

/* lp_v = l_v − (m + log(SUM32(exp(l − m)))) per row (lp may equal logits).
 * With scratch (ls_cuda_logprobs_scratch_bytes(R, V) device bytes, 8-byte
 * aligned) and lp != logits each row spreads over the GPU; in place, or
 * without scratch, one block per row. The same bits either way. */
size_t ls_cuda_logprobs_scratch_bytes(long R, long V);
ls_status ls_cuda_logprobs(const float *logits /* [R, V] */, float *lp /* [R, V] */, long R,
                           long V, int order, void *scratch, void *stream, ls_error *err);

/* ls_cpu_lp_summary per row (src/backend/cpu_ops.h: top-k, lp at next[r], NaN
 * flag; k <= LS_LP_SUMMARY_KMAX), bitwise; scratch of
 * ls_cuda_lp_summary_scratch_bytes(R, V) device bytes, 16-byte aligned. */
size_t ls_cuda_lp_summary_scratch_bytes(long R, long V);
ls_status ls_cuda_lp_summary(const float *lp /* [R, V] */, const int32_t *next /* [R] */, long R,
                             long V, long k, uint32_t *out /* [R, 2k + 2] */, void *scratch,
                             void *stream, ls_error *err);

#ifdef __cplusplus
}
#endif

#endif
