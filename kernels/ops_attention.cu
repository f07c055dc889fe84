/* lockstep — portable strict partial RoPE and attention (see ops.h,
 * docs/numerics.md §4). */
#include "ops.h"
#include "ops_common.cuh"

/* ---- RoPE --------------------------------------------------------------------- */

/* One thread per rotation pair (i, i + R/2) of one (token, head): it reads
 * both inputs before writing both outputs, so the update in place is safe. */
__global__ void ls_rope_kernel(float *x, const float *cos_t, const float *sin_t, long T, long H,
                               long d, long R, int act)
{
    long half = R / 2;
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= T * H * half) return;
    long i = e % half, th = e / half, t = th / H;
    float *xr = x + th * d; /* [d] */
    float c = cos_t[t * half + i], s = sin_t[t * half + i];
    float x0 = xr[i], x1 = xr[i + half];
    /* i < half: rot = −x_{i+half}; i + half: rot = x_i; both use frequency i. */
    float a0 = ls_act_d(x0 * c, act);
    float b0 = ls_act_d(-x1 * s, act);
    float a1 = ls_act_d(x1 * c, act);
    float b1 = ls_act_d(x0 * s, act);
    xr[i] = ls_act_d(a0 + b0, act);
    xr[i + half] = ls_act_d(a1 + b1, act);
}

extern "C" ls_status ls_cuda_rope_apply(float *x, const float *cos_t, const float *sin_t, long T,
                                        long H, long d, long R, int act_bf16, void *stream,
                                        ls_error *err)
{
    LS_CUDA_REQUIRE(R >= 2 && R % 2 == 0 && R <= d, err,
                    "cuda portable rope_apply: rotary dims %ld must be even and <= head dim %ld", R, d);
    if (T <= 0 || H <= 0) return LS_OK;
    ls_rope_kernel<<<ls_blocks_for(T * H * (R / 2), 256), 256, 0, (cudaStream_t)stream>>>(
        x, cos_t, sin_t, T, H, d, R, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_rope_kernel", err);
    return LS_OK;
}

/* ---- attention ---------------------------------------------------------------- */

#define LS_ATT_THREADS LS_CUDA_ATT_MAX_D          /* one block per (query, head) */
#define LS_ATT_WARPS (LS_ATT_THREADS / LS_WARP)  /* 8 */
#define LS_ATT_KPW (LS_WARP / LS_ATT_WARPS)       /* keys per warp per block of 32 */
#define LS_ATT_DR (LS_CUDA_ATT_MAX_D / LS_WARP)   /* head dims per lane: d = lane + 32 r */

/* Per-launch sequence table, passed by value (no device upload). */
typedef struct ls_att_seqs {
    long row0[LS_CUDA_SEQ_CHUNK];
    long len[LS_CUDA_SEQ_CHUNK];
    const float *kc[LS_CUDA_SEQ_CHUNK];
    const float *vc[LS_CUDA_SEQ_CHUNK];
} ls_att_seqs;

/* Per block of 32 keys (key j = lane j of the canonical formulation):
 *   s_j  = DOT32(q, k_j) · scale        (warp DOT32 per key: lane l strides
 *                                        dims l, l+32, ..., then the butterfly)
 *   M'   = max(M, max_j s_j);  c = M == −inf ? 0 : exp(M − M');  p_j = exp(s_j − M')
 *   l    = l·c + DOT32_lanes(p, 1);  acc_d = acc_d·c + DOT32_lanes(p, v[·][d])
 * exactly ls_cpu_attention's operations. Warp w forms s_j for keys
 * j = 4w .. 4w+3 (rows read coalesced); every warp then forms the same M', c,
 * p_j and l from the 32 scores (identical operations, so identical values);
 * thread d owns acc_d and forms DOT32_lanes(p, v[·][d]) itself: partial j is
 * 0 + p_j · v_j[d] (the single term of "lane" j), combined in the LS_DOT32
 * tree order, which is bitwise the warp butterfly's result. The value rows
 * are read coalesced (thread d reads column d of each row). */
__global__ void __launch_bounds__(LS_ATT_THREADS)
ls_attention_kernel(const float *q, ls_att_seqs sq, long cap, const int32_t *pos, float *o,
                    long Hq, long Hkv, long d, float scale, int act)
{
    __shared__ float s_sm[LS_WARP], p_sm[LS_WARP];
    int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int sidx = (int)blockIdx.y;
    long len = sq.len[sidx];
    long lp = blockIdx.x;
    if (lp >= len * Hq) return; /* whole block */
    long pair = sq.row0[sidx] * Hq + lp;
    long t = pair / Hq, n = pair % Hq;
    long kvh = n * Hkv / Hq;
    long last = pos[t];
    if (last > cap - 1) last = cap - 1; /* never read past the cache (checked by the engine) */
    const float *qv = q + pair * d;               /* [d] */
    const float *K = sq.kc[sidx] + kvh * cap * d; /* [cap, d] */
    const float *V = sq.vc[sidx] + kvh * cap * d; /* [cap, d] */
    float qr[LS_ATT_DR];
#pragma unroll
    for (int r = 0; r < LS_ATT_DR; r++) {
        long dd = lane + (long)r * LS_WARP;
        qr[r] = dd < d ? qv[dd] : 0.0f;
    }
    int dok = tid < d;
    float acc = 0.0f;
    float M = -INFINITY, l = 0.0f;
    for (long b0 = 0; b0 <= last; b0 += LS_WARP) {
        long nb = last - b0 + 1;
        if (nb > LS_WARP) nb = LS_WARP;
        /* Scores of this warp's keys. */
        float pk[LS_ATT_KPW];
#pragma unroll
        for (int kk = 0; kk < LS_ATT_KPW; kk++) {
            long j = (long)warp * LS_ATT_KPW + kk;
            pk[kk] = 0.0f;
            if (j < nb) { /* uniform over the warp */
                const float *kj = K + (b0 + j) * d; /* [d] */
#pragma unroll
                for (int r = 0; r < LS_ATT_DR; r++) {
                    long dd = lane + (long)r * LS_WARP;
                    if (dd < d) {
                        float prod = qr[r] * kj[dd];
                        pk[kk] = pk[kk] + prod;
                    }
                }
            }
        }
#pragma unroll
        for (int kk = 0; kk < LS_ATT_KPW; kk++) {
            long j = (long)warp * LS_ATT_KPW + kk;
            float sj = ls_warp_tree(pk[kk]) * scale;
            if (lane == 0 && j < nb) s_sm[j] = sj;
        }
        __syncthreads();
        float my_s = lane < nb ? s_sm[lane] : -INFINITY;
        float bm = ls_warp_max_first(my_s, lane < nb ? (long)lane : -1L);
        float Mn = M > bm ? M : bm;
        float c = (M == -INFINITY) ? 0.0f : ls_expf(M - Mn);
        float pj = lane < nb ? ls_expf(my_s - Mn) : 0.0f;
        float lc = l * c;
        float pone = 0.0f;
        if (lane < nb) {
            float prod = pj * 1.0f;
            pone = pone + prod;
        }
        l = lc + ls_warp_tree(pone);
        if (warp == 0) p_sm[lane] = pj;
        __syncthreads();
        if (dok) {
            const float *vcol = V + b0 * d + tid;
            float pv[LS_WARP];
#pragma unroll
            for (int jj = 0; jj < LS_WARP; jj++) {
                pv[jj] = 0.0f;
                if (jj < nb) {
                    float prod = p_sm[jj] * vcol[(long)jj * d];
                    pv[jj] = pv[jj] + prod;
                }
            }
            LS_TREE32(pv);
            float ac = acc * c;
            acc = ac + pv[0];
        }
        M = Mn;
    }
    if (dok) o[pair * d + tid] = ls_act_d(acc / l, act);
}

static ls_status att_check(long cap, long Hq, long Hkv, long d, int order, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "attention");
    LS_CUDA_REQUIRE(d >= 1 && d <= LS_CUDA_ATT_MAX_D && Hq >= 1 && Hkv >= 1 && cap >= 1, err,
                    "cuda portable attention: head dim %ld (max %d), heads %ld/%ld, cache %ld "
                    "not supported", d, LS_CUDA_ATT_MAX_D, Hq, Hkv, cap);
    return LS_OK;
}

extern "C" ls_status ls_cuda_attention_batch(const float *q, const float *const *kcs,
                                             const float *const *vcs, long cap,
                                             const long *row0, const long *len, long nseq,
                                             const int32_t *pos, float *o, long Hq, long Hkv,
                                             long d, int act_bf16, int order, void *stream,
                                             ls_error *err)
{
    ls_status st = att_check(cap, Hq, Hkv, d, order, err);
    if (st != LS_OK) return st;
    /* fp32(1/sqrt(d)) computed in double and rounded once (ls_cpu_inv_sqrt_scale). */
    float scale = (float)(1.0 / sqrt((double)d));
    for (long s0 = 0; s0 < nseq; s0 += LS_CUDA_SEQ_CHUNK) {
        long n = nseq - s0 < LS_CUDA_SEQ_CHUNK ? nseq - s0 : LS_CUDA_SEQ_CHUNK;
        ls_att_seqs sq;
        memset(&sq, 0, sizeof sq);
        long maxlen = 0;
        for (long s = 0; s < n; s++) {
            sq.row0[s] = row0[s0 + s];
            sq.len[s] = len[s0 + s];
            sq.kc[s] = kcs[s0 + s];
            sq.vc[s] = vcs[s0 + s];
            if (sq.len[s] > maxlen) maxlen = sq.len[s];
        }
        if (maxlen <= 0) continue;
        LS_CUDA_REQUIRE(maxlen * Hq <= 0x7fffffffL, err,
                        "cuda portable attention: %ld tokens x %ld heads in one call", maxlen, Hq);
        dim3 grid((unsigned)(maxlen * Hq), (unsigned)n);
        ls_attention_kernel<<<grid, LS_ATT_THREADS, 0, (cudaStream_t)stream>>>(
            q, sq, cap, pos, o, Hq, Hkv, d, scale, act_bf16);
        LS_CUDA_CHECK_LAUNCH("ls_attention_kernel", err);
    }
    return LS_OK;
}

extern "C" ls_status ls_cuda_attention(const float *q, const float *kc, const float *vc, long cap,
                                       const int32_t *pos, float *o, long T, long Hq, long Hkv,
                                       long d, int act_bf16, int order, void *stream, ls_error *err)
{
    ls_status st = att_check(cap, Hq, Hkv, d, order, err);
    if (st != LS_OK) return st;
    if (T <= 0) return LS_OK;
    long row0 = 0;
    return ls_cuda_attention_batch(q, &kc, &vc, cap, &row0, &T, 1, pos, o, Hq, Hkv, d, act_bf16,
                                   order, stream, err);
}

/* ---- KV append ------------------------------------------------------------------- */

typedef struct ls_kv_seqs {
    long row0[LS_CUDA_SEQ_CHUNK];
    long len[LS_CUDA_SEQ_CHUNK];
    long pos0[LS_CUDA_SEQ_CHUNK];
    float *kc[LS_CUDA_SEQ_CHUNK];
    float *vc[LS_CUDA_SEQ_CHUNK];
} ls_kv_seqs;

/* Element e of (row i, kv head h, dim) of sequence blockIdx.y: a plain copy. */
__global__ void ls_kv_append_kernel(const float *k, const float *v, ls_kv_seqs sq, long cap,
                                    long Hkv, long d)
{
    int sidx = (int)blockIdx.y;
    long W = Hkv * d;
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= sq.len[sidx] * W) return;
    long i = e / W, hd = e % W, h = hd / d, dd = hd % d;
    long src = (sq.row0[sidx] + i) * W + hd;
    long dst = (h * cap + sq.pos0[sidx] + i) * d + dd;
    sq.kc[sidx][dst] = k[src];
    sq.vc[sidx][dst] = v[src];
}

extern "C" ls_status ls_cuda_kv_append_batch(const float *k, const float *v, float *const *kcs,
                                             float *const *vcs, long cap, const long *row0,
                                             const long *len, const long *pos0, long nseq,
                                             long Hkv, long d, void *stream, ls_error *err)
{
    for (long s0 = 0; s0 < nseq; s0 += LS_CUDA_SEQ_CHUNK) {
        long n = nseq - s0 < LS_CUDA_SEQ_CHUNK ? nseq - s0 : LS_CUDA_SEQ_CHUNK;
        ls_kv_seqs sq;
        memset(&sq, 0, sizeof sq);
        long maxlen = 0;
        for (long s = 0; s < n; s++) {
            sq.row0[s] = row0[s0 + s];
            sq.len[s] = len[s0 + s];
            sq.pos0[s] = pos0[s0 + s];
            sq.kc[s] = kcs[s0 + s];
            sq.vc[s] = vcs[s0 + s];
            if (sq.len[s] > maxlen) maxlen = sq.len[s];
        }
        if (maxlen <= 0) continue;
        dim3 grid(ls_blocks_for(maxlen * Hkv * d, 256), (unsigned)n);
        ls_kv_append_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>(k, v, sq, cap, Hkv, d);
        LS_CUDA_CHECK_LAUNCH("ls_kv_append_kernel", err);
    }
    return LS_OK;
}
