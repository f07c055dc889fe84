/* lockstep — CPU reference operators (strict mode).
 *
 * One plain C function per operator of docs/numerics.md §3–4. Each works on
 * host arrays with explicit shapes, computes every token row independently
 * (numerics contract rule 1) in the canonical order (rule 2), and takes
 *
 *   act_bf16   1: round activations to bf16 at the contract's points (act(x)
 *              = bf16(x)); 0: fp32 activation mode (act(x) = x);
 *   order      LS_ORDER_CANONICAL, or LS_ORDER_REVERSED for the perturbation
 *              switch: every DOT32 / sequential sum of that operator becomes a
 *              sequential sum from the last element to the first whose
 *              accumulator is rounded to bf16 after every addition (reduced-
 *              precision reduction, as eager bf16 kernels and cuBLAS's
 *              reduced-precision mode do). It exists only to prove that the
 *              comparator detects a changed reduction. A pure reordering is
 *              not enough: it moves fp32 results by an ulp or so, which the
 *              bf16 rounding of activations hides almost always, and a conv's
 *              few bf16 products sum exactly in any order. The combine's
 *              perturbation sums shared + routed slots in one fp32 sum
 *              (reversed), rounded once, since two routed terms commute.
 *
 * Activations are fp32 arrays in both modes; in bf16 mode they hold values
 * that are exactly representable in bf16. Weights are used as stored (bf16 or
 * fp32, widened exactly) through ls_wmat. Small parameters (norm weights,
 * A_log, dt_bias) are passed as fp32 arrays already rounded as the model
 * requires (src/model).
 *
 * These functions are the reference the portable CUDA kernels are checked
 * against bit for bit; they never allocate and never fail (shapes are
 * validated by the model). Row ranges [r0, r1) let callers split work over
 * threads without changing any bit.
 *
 * The declarations are grouped by operator family, one source file each,
 * mirroring the files of the CUDA kernels (kernels/ops_*.cu) that are checked
 * against them. */
#ifndef LS_BACKEND_CPU_OPS_H
#define LS_BACKEND_CPU_OPS_H

#include <stdint.h>

#include "numerics/reduce.h"
#include "numerics/types.h"

/* ==== dense: cpu_ops_dense.c; CUDA kernels/ops_dense.cu =================== */

/* ---- reductions ---------------------------------------------------------- */

/* DOT32(a, b) over n elements (or the reversed sequential sum). */
float ls_cpu_dot(const float *a /* [n] */, const float *b /* [n] */, long n, ls_order order);
/* DOT32 of weight row r with x; an FP8 row dequantised first (W = q · s,
 * docs/numerics.md §9). Not for LS_WTYPE_F8_W8A8 rows: those meet quantised
 * activations (ls_cpu_dot_wrow_q). */
float ls_cpu_dot_wrow(const ls_wmat *w, long r, const float *x /* [w->cols] */, ls_order order);
/* W8A8 (LS_WTYPE_F8_W8A8, or any FP8 matrix): weight row r against a token
 * row quantised by ls_cpu_fp8_quant_act, per 128-wide K block (ls_dot_w8a8,
 * numerics/fp8.h); reversed: blocks from the last, each a reversed
 * sequential sum, every addition rounded to bf16. */
float ls_cpu_dot_wrow_q(const ls_wmat *w, long r, const float *q /* [w->cols] */,
                        const float *xs /* [LS_FP8_BLOCKS(w->cols)] */, ls_order order);
/* SUM32(a) over n elements (or reversed sequential). */
float ls_cpu_sum(const float *a /* [n] */, long n, ls_order order);

/* ---- embedding and linear ------------------------------------------------ */

/* Embedding rows: h[t] = act(E[tokens[t]]). Token ids must be < E->rows. */
void ls_cpu_embed(const ls_wmat *emb /* [V, D] */, const int32_t *tokens /* [T] */, long T,
                  float *h /* [T, D] */, int act_bf16);

/* linear: y[t][o] = act(DOT32(W[o,:], x[t,:])) for output rows o in [o0, o1).
 * x [T, W.cols], y [T, W.rows] (row stride W.rows; only columns o0..o1-1 written).
 * W is BF16, F32 or F8_DEQUANT (a w8a8 matrix takes ls_cpu_linear_q). */
void ls_cpu_linear(const ls_wmat *w, const float *x /* [T, in] */, float *y /* [T, out] */,
                   long T, long o0, long o1, int act_bf16, ls_order order);

/* ---- FP8 w8a8 (docs/numerics.md §9) -------------------------------------- */

/* Quantises T token rows of n per group of 128 (ls_fp8_quant_row):
 * q [T, n] e4m3 values as fp32, s [T, LS_FP8_BLOCKS(n)] group scales. */
void ls_cpu_fp8_quant_act(const float *x /* [T, n] */, long T, long n, float *q /* [T, n] */,
                          float *s /* [T, LS_FP8_BLOCKS(n)] */);
/* The w8a8 linear: y[t][o] = act(ls_cpu_dot_wrow_q(W, o, q[t], s[t])) for o
 * in [o0, o1); q, s from ls_cpu_fp8_quant_act of the input rows. */
void ls_cpu_linear_q(const ls_wmat *w, const float *q /* [T, in] */,
                     const float *xs /* [T, LS_FP8_BLOCKS(in)] */, float *y /* [T, out] */,
                     long T, long o0, long o1, int act_bf16, ls_order order);

/* ---- norms --------------------------------------------------------------- */

/* Zero-centred RMSNorm over rows of n: r = rsqrt(DOT32(x,x)/n + 1e-6);
 * y_i = act((x_i r)(1 + w_i)). y may equal x. */
void ls_cpu_rmsnorm(const float *x /* [R, n] */, const float *w /* [n] */, float *y /* [R, n] */,
                    long R, long n, int act_bf16, ls_order order);

/* Gated RMSNorm per value head (rows of n = d_v): n_i = act(x_i r);
 * p_i = act(w_i n_i); y_i = act(p_i silu(z_i)). y may equal x. */
void ls_cpu_gated_rmsnorm(const float *x /* [R, n] */, const float *z /* [R, n] */,
                          const float *w /* [n] */, float *y /* [R, n] */, long R, long n,
                          int act_bf16, ls_order order);

/* L2 norm per row of d, then scale: x_i = (x_i · rsqrt(DOT32(x,x) + 1e-6)) · scale,
 * fp32 (no activation rounding). scale = 1 leaves the product exact. In place. */
void ls_cpu_l2norm_scale(float *x /* [R, d] */, long R, long d, float scale, ls_order order);

/* ---- elementwise --------------------------------------------------------- */

/* GDN gates per (token, value head): β = act(sigmoid(b)); g = −exp(A_log) ·
 * softplus(a + dt_bias); α = exp(g). b, a [T, H] (strided rows). */
void ls_cpu_gdn_gates(const float *b /* [T, H] */, const float *a /* [T, H] */,
                      const float *A_log /* [H] */, const float *dt_bias /* [H] */,
                      float *beta /* [T, H] */, float *alpha /* [T, H] */, long T, long H,
                      int act_bf16);

/* Output gate: o_i = act(o_i · act(sigmoid(gate_i))). */
void ls_cpu_sigmoid_gate(float *o /* [n] */, const float *gate /* [n] */, long n, int act_bf16);

/* Residual: h_i = act(h_i + a_i). */
void ls_cpu_residual(float *out /* [n], may be h */, const float *h /* [n] */, const float *a /* [n] */, long n,
                     int act_bf16);

/* ---- causal conv + SiLU -------------------------------------------------- */

/* Causal depthwise conv + SiLU over T tokens of one sequence, C channels, K
 * taps. state [C, K] holds the last K inputs (column K-1 the most recent;
 * zeros at sequence start) and is updated in place after every token:
 *   s = Σ_j w[c][j] · window[j] (sequential j), window = state[c][1..K-1], x_t[c]
 *   y = act(silu(act(s))).
 * x and y may alias only if x_stride == y_stride and they are the same array.
 * x rows have stride x_stride, y rows y_stride (so channels can be a slice). */
void ls_cpu_conv_silu(const float *x /* [T, x_stride] */, long x_stride,
                      const ls_wmat *w /* [C, K] */, float *state /* [C, K] */,
                      float *y /* [T, y_stride] */, long y_stride, long T, long C, long K,
                      int act_bf16, ls_order order);

/* ---- logprobs and top-k -------------------------------------------------- */

/* logprobs for R rows of V logits: m = max; lse = m + log(SUM32(exp(l − m)));
 * lp_v = l_v − lse. Returns through lp (may equal logits). scratch [V]. */
void ls_cpu_logprobs(const float *logits /* [R, V] */, float *lp /* [R, V] */, long R, long V,
                     float *scratch /* [V] */, ls_order order);

/* The k largest entries of one row, descending, ties to the lower index. */
void ls_cpu_topk(const float *x /* [n] */, long n, long k, int32_t *ids /* [k] */,
                 float *vals /* [k] */);

/* What a step's records read of its logprob rows, so that the rows stay on
 * the device (docs/numerics.md §3): per row r, LS_LP_SUMMARY_WORDS(k) words
 *   [0, k)    top-k ids (ls_cpu_topk),    [k, 2k)  their values' bits,
 *   2k        the bits of lp[r, next[r]] (NaN bits 0x7fc00000 when next[r] is
 *             outside 0..V-1: not known),
 *   2k + 1    1 when the row holds a NaN (then ids are -1 and values NaN bits:
 *             the NaN-free order the device selects in is not the CPU scan's,
 *             so the reader takes the whole row), else 0.
 * 1 <= k <= LS_LP_SUMMARY_KMAX, k <= V (numerics/types.h). */
void ls_cpu_lp_summary(const float *lp /* [R, V] */, const int32_t *next /* [R] */, long R, long V,
                       long k, uint32_t *out /* [R, LS_LP_SUMMARY_WORDS(k)] */);

/* ---- RoPE table (host only, for rope_apply) ------------------------------ */

/* RoPE table on the host: for each of T positions, j < R/2:
 * inv_freq_j = fp32(θ^(−2j/R)) (double), a = fp32(pos) · inv_freq_j,
 * cos_j = act(fp32(cos(double a))), sin likewise. */
void ls_cpu_rope_table(const int32_t *pos /* [T] */, long T, long R, double theta,
                       float *cos_t /* [T, R/2] */, float *sin_t /* [T, R/2] */, int act_bf16);

/* ==== GDN: cpu_ops_gdn.c; CUDA kernels/ops_gdn.cu, ops_gdn_chunked.cu ===== */

/* Floats of scratch the GDN step needs: lane partials [32, dv], m and u
 * [dv] each. Scratch, not stack arrays: the ops run on pool workers, whose
 * stacks are small (see pool.h). */
#define LS_CPU_GDN_SCRATCH_FLOATS(dv) ((size_t)(LS_LANES + 2) * (size_t)(dv))

/* GDN recurrent step over T tokens of one sequence (fp32 state, carried):
 * for each token and value head h (key head h·Hk/Hv):
 *   S' = α S;  m_j = DOT32_i(S'[i][j], k_i);  u_j = (v_j − m_j) β;
 *   S = S' + k ⊗ u;  o_j = act(DOT32_i(S[i][j], q_i))
 * q, k already L2-normalised (q scaled), fp32. */
void ls_cpu_gdn_recurrent(const float *q /* [T, Hk, dk] */, const float *k /* [T, Hk, dk] */,
                          const float *v /* [T, Hv, dv] */, const float *alpha /* [T, Hv] */,
                          const float *beta /* [T, Hv] */, float *state /* [Hv, dk, dv] */,
                          float *o /* [T, Hv, dv] */, long T, long Hk, long Hv, long dk, long dv,
                          float *scratch /* [LS_CPU_GDN_SCRATCH_FLOATS(dv)] */, int act_bf16,
                          ls_order order);
/* The same for value heads [h0, h1) only (heads are independent). */
void ls_cpu_gdn_recurrent_heads(const float *q, const float *k, const float *v,
                                const float *alpha, const float *beta, float *state, float *o,
                                long T, long Hk, long Hv, long dk, long dv, long h0, long h1,
                                float *scratch /* [LS_CPU_GDN_SCRATCH_FLOATS(dv)] */,
                                int act_bf16, ls_order order);

/* The chunk-aligned GDN form (docs/numerics.md §5.1): chunks of C positions
 * at absolute multiples of C in the sequence. The carried state is S at the
 * chunk's start [Hv, dk, dv] followed by the chunk's rows so far: k
 * [Hv, C, dk], u [Hv, C, dv], α [Hv, C] (LS_GDN_CHUNK_STATE_FLOATS). */
#define LS_GDN_CHUNK 64
#define LS_GDN_CHUNK_STATE_FLOATS(Hv, dk, dv) \
    ((size_t)(Hv) * ((size_t)(dk) * (size_t)(dv) + LS_GDN_CHUNK * ((size_t)(dk) + (size_t)(dv) + 1)))
#define LS_CPU_GDN_CHUNK_SCRATCH_FLOATS(dv) ((size_t)(LS_LANES + 2) * (size_t)(dv) + LS_GDN_CHUNK)

/* The chunk-aligned step over T tokens at positions pos0 .. pos0+T-1, value
 * heads [h0, h1). Row r = p mod C of its chunk, for each head (key head
 * h·Hk/Hv), with d_s = α_{s+1} ··· α_r (the product from r down, d_r = 1)
 * and P = d_0 α_0:
 *   m0 = DOT32_i(S0[i][·], k_r),  mq = DOT32_i(S0[i][·], q_r)
 *   u_r = (v − P m0) β − Σ_{s<r ascending} (β ((k_r · k_s) d_s)) u_s
 *   o_r = act(P mq + Σ_{s<=r ascending} ((q_r · k_s) d_s) u_s)
 * dots LS_DOT32; at r = C − 1 the chunk folds into S0:
 *   S0 ← P S0 + Σ_{s ascending} (d_s k_s) ⊗ u_s.
 * Every quantity of row r reads rows <= r only, so a token's bits do not
 * depend on how its chunk's rows were split between calls. */
void ls_cpu_gdn_chunked_heads(const float *q /* [T, Hk, dk] */, const float *k /* [T, Hk, dk] */,
                              const float *v /* [T, Hv, dv] */, const float *alpha /* [T, Hv] */,
                              const float *beta /* [T, Hv] */, float *state /* LS_GDN_CHUNK_STATE_FLOATS */,
                              float *o /* [T, Hv, dv] */, long T, long pos0, long Hk, long Hv, long dk, long dv,
                              long h0, long h1, float *scratch /* [LS_CPU_GDN_CHUNK_SCRATCH_FLOATS(dv)] */,
                              int act_bf16, ls_order order);
/* The recurrent state after position pos (the last one the chunk-aligned
 * step ran) of heads [h0, h1) into s_out [Hv, dk, dv]: S0 when pos ends a
 * chunk, else the fold of rows 0 .. pos mod C (the same arithmetic as the
 * fold at the boundary). */
void ls_cpu_gdn_chunked_state_heads(const float *state, long pos, long Hv, long dk, long dv, long h0, long h1,
                                    float *s_out /* [Hv, dk, dv] */, float *scratch /* [LS_GDN_CHUNK] */);

/* ==== attention: cpu_ops_attention.c; CUDA kernels/ops_attention.cu ======= */

/* Partial rotate-half RoPE in place on the first R dims of every head:
 * y_i = act(act(x_i cos) + act(rot_i sin)), rot_i = −x_{i+R/2} (i < R/2),
 * x_{i−R/2} otherwise. Rows are heads: x [T, H, d]. */
void ls_cpu_rope_apply(float *x /* [T, H, d] */, const float *cos_t /* [T, R/2] */,
                       const float *sin_t /* [T, R/2] */, long T, long H, long d, long R,
                       float *scratch /* [R] */, int act_bf16);

/* The query scale fp32(1/sqrt(d)) computed in double and rounded once. */
float ls_cpu_inv_sqrt_scale(long d);

/* The KV cache layout (docs/architecture.md "The KV cache"). A cache is
 * pages of `page` positions, [pages, Hkv, page, d]; a sequence's page table
 * pt maps its page i (positions i*page .. i*page + page - 1) to a page of
 * that buffer. Row p of KV head h starts at element ls_cpu_kv_row(..) * d.
 * pt NULL is the identity: a contiguous per-sequence cache [Hkv, cap, d] is
 * the one-page case page = cap. Attention iterates logical positions; only
 * this address depends on the layout, so the layout cannot change a bit. */
static inline long ls_cpu_kv_row(const int32_t *pt, long page, long Hkv, long h, long p)
{
    long i = p / page, pg = pt ? (long)pt[i] : i;
    return (pg * Hkv + h) * page + p % page;
}

/* Attention (docs/numerics.md §4) for T queries of one sequence. Query t
 * attends keys 0..pos[t] of the cache (rows already written, K after norm and
 * RoPE). Cache layout [Hkv, cap, d]. o = act(acc / l). */
void ls_cpu_attention(const float *q /* [T, Hq, d] */, const float *kc /* [Hkv, cap, d] */,
                      const float *vc /* [Hkv, cap, d] */, long cap, const int32_t *pos /* [T] */,
                      float *o /* [T, Hq, d] */, long T, long Hq, long Hkv, long d,
                      float *scratch /* [d] */, int act_bf16, ls_order order);
/* The same over a paged cache (ls_cpu_kv_row: pt [cap / page] or NULL),
 * for query heads [n0, n1) only (heads are independent). With pt NULL and
 * page = cap it is ls_cpu_attention; any layout holding the same rows gives
 * the same bits. */
void ls_cpu_attention_heads(const float *q, const float *kc /* [pages, Hkv, page, d] */,
                            const float *vc, const int32_t *pt, long page, long cap,
                            const int32_t *pos, float *o, long T, long Hq, long Hkv, long d,
                            long n0, long n1, float *scratch /* [d] */, int act_bf16,
                            ls_order order);

/* ==== MoE: cpu_ops_moe.c; CUDA kernels/ops_moe.cu ========================= */

/* Router for T tokens: r_e = act(DOT32(W[e], x)); softmax (max, exp,
 * SUM32); top-k descending, ties to the lower index; renormalise
 * (sequential sum in top-k order) when norm_topk, weights act()-rounded.
 * probs is scratch/output [T, E] (the softmax). */
void ls_cpu_router(const ls_wmat *w /* [E, D] */, const float *x /* [T, D] */, long T,
                   long k, int norm_topk, float *probs /* [T, E] */, int32_t *ids /* [T, k] */,
                   float *weights /* [T, k] */, int act_bf16, ls_order order);

/* Floats of scratch one expert of width W over hidden size D needs
 * (ls_cpu_expert): g and u [W] each, and for w8a8 weights the quantised input
 * and hidden rows with their group scales. */
#define LS_CPU_EXPERT_SCRATCH(D, W) \
    ((size_t)(3 * (W) + (D)) + (size_t)LS_FP8_BLOCKS(D) + (size_t)LS_FP8_BLOCKS(W))

/* One SwiGLU expert for one token: g = act(W_g x), u = act(W_u x),
 * m = act(act(silu(g)) u), y = act(W_d m); each matrix of any weight type
 * (a w8a8 one meets the quantised x or m, docs/numerics.md §9).
 * scratch [LS_CPU_EXPERT_SCRATCH(D, I)]. */
void ls_cpu_expert(const ls_wmat *wg /* [I, D] */, const ls_wmat *wu /* [I, D] */,
                   const ls_wmat *wd /* [D, I] */, const float *x /* [D] */, float *y /* [D] */,
                   float *scratch /* [2 I] */, int act_bf16, ls_order order);

typedef struct ls_moe_weights {
    long E, D, I, Is;          /* experts, hidden, expert and shared widths */
    const ls_wmat *gate;       /* [E] each [I, D] */
    const ls_wmat *up;         /* [E] each [I, D] */
    const ls_wmat *down;       /* [E] each [D, I] */
    const ls_wmat *sh_gate;    /* [Is, D], NULL = no shared expert */
    const ls_wmat *sh_up;      /* [Is, D] */
    const ls_wmat *sh_down;    /* [D, Is] */
    const ls_wmat *sh_gate_w;  /* shared_expert_gate [1, D] */
} ls_moe_weights;

/* Routed experts + combine + shared expert for tokens [t0, t1):
 * c_i = act(y_{e_i} · w_i); routed = act(sequential Σ c_i in top-k order);
 * s = act(γ · shared(x)), γ = act(sigmoid(act(w_sg·x))); out = act(routed + s).
 * order_experts applies to the expert/shared dot products, order_combine to
 * the combine sum. scratch [(k + 1) * D + LS_CPU_EXPERT_SCRATCH(D, max(I, Is))]. */
void ls_cpu_moe(const ls_moe_weights *mw, const float *x /* [T, D] */,
                const int32_t *ids /* [T, k] */, const float *weights /* [T, k] */, long k,
                float *out /* [T, D] */, long t0, long t1, float *scratch, int act_bf16,
                ls_order order_experts, ls_order order_combine);

/* One slot of a token's MoE: slot i < k is routed expert ids[t][i],
 * c = act(y · w); slot k is the gated shared expert s = act(γ · shared(x)).
 * scratch [LS_CPU_EXPERT_SCRATCH(D, max(I, Is))]. */
void ls_cpu_moe_slot(const ls_moe_weights *mw, const float *x /* [T, D] */,
                     const int32_t *ids /* [T, k] */, const float *weights /* [T, k] */, long k,
                     long t, long i, float *c /* [D] */, float *scratch, int act_bf16,
                     ls_order order_experts);
/* Combine for one token: routed = act(sequential Σ_{i<k} c_i);
 * out = act(routed + c_k) when has_shared, else routed. */
void ls_cpu_moe_combine(const float *c /* [k + 1, D] */, long k, long D, int has_shared,
                        float *out /* [D] */, int act_bf16, ls_order order_combine);

#endif
