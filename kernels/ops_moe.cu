/* lockstep — portable strict router and MoE (see ops.h, docs/numerics.md §3,
 * DESIGN rule 8). Every (token, slot) pair is computed by its own warps with
 * the same order whatever other tokens chose, so a token's output does not
 * depend on the batch; the combine is a sequential fp32 sum in top-k order. */
#include "ops.h"
#include "ops_common.cuh"

#define LS_MOE_WARPS 8 /* output rows per block, one warp each */

/* ---- router ------------------------------------------------------------------- */

/* One warp per token, after the logits (probs = act(W x)) are in place:
 * softmax (exact max, exp, SUM32, divide), top-k, renormalisation. */
__global__ void ls_router_softmax_topk_kernel(float *probs, long T, long E, long k, int norm_topk,
                                              int32_t *ids, float *weights, int act)
{
    long t = (long)blockIdx.x * 4 + (threadIdx.x >> 5);
    int lane = (int)(threadIdx.x & 31u);
    if (t >= T) return;
    float *pr = probs + t * E; /* [E] */
    float m = ls_warp_max_of(pr, E);
    float p = 0.0f;
    for (long e = lane; e < E; e += LS_WARP) {
        float ex = ls_expf(pr[e] - m);
        pr[e] = ex;
        p = p + ex;
    }
    float sum = ls_warp_tree(p);
    for (long e = lane; e < E; e += LS_WARP) pr[e] = pr[e] / sum;
    __syncwarp();
    int32_t *id = ids + t * k;  /* [k] */
    float *wt = weights + t * k; /* [k] */
    ls_warp_topk_dev(pr, E, k, id, wt);
    __syncwarp();
    if (lane == 0) {
        if (norm_topk) {
            float s = 0.0f;
            for (long i = 0; i < k; i++) s = s + wt[i];
            for (long i = 0; i < k; i++) wt[i] = ls_act_d(wt[i] / s, act);
        } else {
            for (long i = 0; i < k; i++) wt[i] = ls_act_d(wt[i], act);
        }
    }
}

extern "C" ls_status ls_cuda_router(const void *w, int wtype, long E, long D, const float *x,
                                    long T, long k, int norm_topk, float *probs, int32_t *ids,
                                    float *weights, int act_bf16, int order, void *stream,
                                    ls_error *err)
{
    LS_CUDA_REQUIRE(k >= 1 && k <= 64 && k <= E, err,
                    "cuda portable router: top-k %ld not in 1..min(64, experts %ld)", k, E);
    LS_TRY(ls_cuda_linear(w, wtype, E, D, x, probs, T, act_bf16, order, stream, err));
    if (T <= 0) return LS_OK;
    ls_router_softmax_topk_kernel<<<ls_blocks_for(T, 4), 4 * LS_WARP, 0, (cudaStream_t)stream>>>(
        probs, T, E, k, norm_topk, ids, weights, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_router_softmax_topk_kernel", err);
    return LS_OK;
}

/* ---- experts ------------------------------------------------------------------ */

/* Scratch layout for T tokens, k routed slots plus the shared slot (index k):
 *   mid   [T, k+1, W]   W = max(I, Is): act(act(silu(g)) · u)
 *   c     [T, k+1, D]   slot outputs (c_i = act(y·w_i); shared: act(γ·y))
 *   gamma [T]           act(sigmoid(act(w_sg · x))) */
static size_t ls_moe_width(const ls_cuda_moe *mw)
{
    return (size_t)(mw->I > mw->Is ? mw->I : mw->Is);
}

extern "C" size_t ls_cuda_moe_scratch_bytes(const ls_cuda_moe *mw, long T, long k)
{
    size_t slots = (size_t)T * (size_t)(k + 1);
    return sizeof(float) * (slots * ls_moe_width(mw) + slots * (size_t)mw->D + (size_t)T);
}

/* Row pointer of matrix `which` (0 gate, 1 up, 2 down) for a slot. */
__device__ __forceinline__ const void *ls_moe_matrix(const ls_cuda_moe mw, long e, int shared,
                                                      int which)
{
    if (shared) return which == 0 ? mw.sh_gate : which == 1 ? mw.sh_up : mw.sh_down;
    return which == 0 ? mw.gate[e] : which == 1 ? mw.up[e] : mw.down[e];
}

/* grid (ceil(W / 8), T * (k+1)): warp per (token, slot, hidden unit i). */
__global__ void ls_moe_gate_up_kernel(const ls_cuda_moe mw, const float *x, const int32_t *ids,
                                      long k, long W, float *mid, int act)
{
    long ts = blockIdx.y;
    long t = ts / (k + 1), slot = ts % (k + 1);
    int shared = slot == k;
    if (shared && mw.sh_gate == NULL) return;
    long width = shared ? mw.Is : mw.I;
    long i = (long)blockIdx.x * LS_MOE_WARPS + (threadIdx.x >> 5);
    if (i >= width) return; /* whole warp */
    long e = shared ? 0 : ids[t * k + slot];
    if (!shared && (e < 0 || e >= mw.E)) return;
    size_t rowb = (size_t)mw.D * ls_welem_bytes(mw.wtype);
    const uint8_t *wg = (const uint8_t *)ls_moe_matrix(mw, e, shared, 0) + (size_t)i * rowb;
    const uint8_t *wu = (const uint8_t *)ls_moe_matrix(mw, e, shared, 1) + (size_t)i * rowb;
    const float *xt = x + t * mw.D; /* [D] */
    float g = ls_act_d(ls_warp_dot_w(wg, mw.wtype, xt, mw.D), act);
    float u = ls_act_d(ls_warp_dot_w(wu, mw.wtype, xt, mw.D), act);
    if ((threadIdx.x & 31u) == 0) {
        float sg = ls_act_d(ls_siluf(g), act);
        mid[ts * W + i] = ls_act_d(sg * u, act);
    }
}

/* grid T: warp 0 of each block computes γ for its token. */
__global__ void ls_moe_shared_gate_kernel(const ls_cuda_moe mw, const float *x, long T, float *gamma,
                                          int act)
{
    long t = blockIdx.x;
    if (t >= T || threadIdx.x >= LS_WARP) return;
    float gl = ls_act_d(ls_warp_dot_w(mw.sh_gate_w, mw.wtype, x + t * mw.D, mw.D), act);
    if (threadIdx.x == 0) gamma[t] = ls_act_d(ls_sigmoidf(gl), act);
}

/* grid (ceil(D / 8), T * (k+1)): warp per (token, slot, output j). */
__global__ void ls_moe_down_kernel(const ls_cuda_moe mw, const int32_t *ids, const float *weights,
                                   long k, long W, const float *mid, const float *gamma, float *cbuf,
                                   int act)
{
    long ts = blockIdx.y;
    long t = ts / (k + 1), slot = ts % (k + 1);
    int shared = slot == k;
    if (shared && mw.sh_gate == NULL) return;
    long width = shared ? mw.Is : mw.I;
    long j = (long)blockIdx.x * LS_MOE_WARPS + (threadIdx.x >> 5);
    if (j >= mw.D) return; /* whole warp */
    long e = shared ? 0 : ids[t * k + slot];
    float y = 0.0f;
    if (shared || (e >= 0 && e < mw.E)) {
        const uint8_t *wd = (const uint8_t *)ls_moe_matrix(mw, e, shared, 2) +
                            (size_t)j * width * ls_welem_bytes(mw.wtype);
        y = ls_act_d(ls_warp_dot_w(wd, mw.wtype, mid + ts * W, width), act);
    }
    if ((threadIdx.x & 31u) == 0) {
        float c = shared ? ls_act_d(gamma[t] * y, act) : ls_act_d(y * weights[t * k + slot], act);
        cbuf[ts * mw.D + j] = c;
    }
}

/* One thread per (token, j): routed = act(Σ_i c_i) in top-k order from +0,
 * out = act(routed + shared). */
__global__ void ls_moe_combine_kernel(const float *cbuf, long T, long k, long D, int has_shared,
                                      float *out, int act)
{
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= T * D) return;
    long t = e / D, j = e % D;
    const float *c = cbuf + t * (k + 1) * D; /* [k+1, D] */
    float s = 0.0f;
    for (long i = 0; i < k; i++) s = s + c[i * D + j];
    float routed = ls_act_d(s, act);
    out[e] = has_shared ? ls_act_d(routed + c[k * D + j], act) : routed;
}

extern "C" ls_status ls_cuda_moe_forward(const ls_cuda_moe *mw, const float *x, const int32_t *ids,
                                         const float *weights, long k, float *out, long T,
                                         void *scratch, int act_bf16, int order_experts,
                                         int order_combine, void *stream, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order_experts, err, "moe (experts)");
    LS_REQUIRE_CANONICAL(order_combine, err, "moe (combine)");
    LS_REQUIRE_WTYPE(mw->wtype, err, "moe");
    LS_CUDA_REQUIRE(k >= 1 && mw->D >= 1 && mw->I >= 1 && (mw->sh_gate == NULL || mw->Is >= 1),
                    err, "cuda portable moe: shape E %ld D %ld I %ld Is %ld k %ld not supported",
                    mw->E, mw->D, mw->I, mw->Is, k);
    if (T <= 0) return LS_OK;
    long slots = T * (k + 1);
    LS_CUDA_REQUIRE(slots <= 65535, err,
                    "cuda portable moe: T %ld x (k %ld + 1) slots exceed one launch (65535); "
                    "call with fewer tokens", T, k);
    long W = (long)ls_moe_width(mw);
    float *mid = (float *)scratch;                 /* [T, k+1, W] */
    float *cbuf = mid + (size_t)slots * W;         /* [T, k+1, D] */
    float *gamma = cbuf + (size_t)slots * mw->D;   /* [T] */
    cudaStream_t s = (cudaStream_t)stream;
    dim3 g1(ls_blocks_for(W, LS_MOE_WARPS), (unsigned)slots);
    ls_moe_gate_up_kernel<<<g1, LS_MOE_WARPS * LS_WARP, 0, s>>>(*mw, x, ids, k, W, mid, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_moe_gate_up_kernel", err);
    if (mw->sh_gate) {
        ls_moe_shared_gate_kernel<<<(unsigned)T, LS_WARP, 0, s>>>(*mw, x, T, gamma, act_bf16);
        LS_CUDA_CHECK_LAUNCH("ls_moe_shared_gate_kernel", err);
    }
    dim3 g2(ls_blocks_for(mw->D, LS_MOE_WARPS), (unsigned)slots);
    ls_moe_down_kernel<<<g2, LS_MOE_WARPS * LS_WARP, 0, s>>>(*mw, ids, weights, k, W, mid, gamma,
                                                              cbuf, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_moe_down_kernel", err);
    ls_moe_combine_kernel<<<ls_blocks_for(T * mw->D, 256), 256, 0, s>>>(
        cbuf, T, k, mw->D, mw->sh_gate != NULL, out, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_moe_combine_kernel", err);
    return LS_OK;
}
