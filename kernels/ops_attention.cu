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
    ls_pdl_entry();
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
    ls_launch(ls_rope_kernel, ls_blocks_for(T * H * (R / 2), 256), 256, 0, (cudaStream_t)stream, x, cos_t,
              sin_t, T, H, d, R, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_rope_kernel", err);
    return LS_OK;
}

/* ---- attention ---------------------------------------------------------------- */

#define LS_ATT_THREADS LS_CUDA_ATT_MAX_D            /* one block per (query, head) */
#define LS_ATT_WARPS (LS_ATT_THREADS / LS_WARP)    /* 8 */
#define LS_ATT_DR (LS_CUDA_ATT_MAX_D / LS_WARP)     /* head dims per lane: d = lane + 32 r */
#define LS_ATT_TILE_BLOCKS LS_ATT_WARPS             /* blocks of 32 keys per tile: one per warp */
#define LS_ATT_TILE (LS_ATT_TILE_BLOCKS * LS_WARP)  /* 256 keys */
#define LS_ATT_KG 8                                 /* key rows per warp loaded before their dots */

/* Per-launch sequence table, passed by value (no device upload): 3 KiB,
 * within the 4 KiB of kernel parameters. */
typedef struct ls_att_seqs {
    long row0[LS_CUDA_SEQ_CHUNK];
    long len[LS_CUDA_SEQ_CHUNK];
    long pos0[LS_CUDA_SEQ_CHUNK];  /* first cache position written (KV append) */
    float *kc[LS_CUDA_SEQ_CHUNK];  /* read-only in attention */
    float *vc[LS_CUDA_SEQ_CHUNK];
    const int32_t *pt[LS_CUDA_SEQ_CHUNK]; /* page tables (device); NULL = identity */
} ls_att_seqs;

/* Fills sq with sequences s0 .. s0+n-1 (pos0 NULL: zeros; pts NULL: every
 * table the identity); returns the longest length. */
static long ls_att_seqs_fill(ls_att_seqs *sq, const float *const *kcs, const float *const *vcs,
                             const int32_t *const *pts, const long *row0, const long *len,
                             const long *pos0, long s0, long n)
{
    long maxlen = 0;
    memset(sq, 0, sizeof *sq);
    for (long s = 0; s < n; s++) {
        sq->row0[s] = row0[s0 + s];
        sq->len[s] = len[s0 + s];
        sq->pos0[s] = pos0 ? pos0[s0 + s] : 0;
        sq->kc[s] = (float *)kcs[s0 + s];
        sq->vc[s] = (float *)vcs[s0 + s];
        sq->pt[s] = pts ? pts[s0 + s] : NULL;
        if (sq->len[s] > maxlen) maxlen = sq->len[s];
    }
    return maxlen;
}

/* The row of position p of KV head h in a paged cache [pages, Hkv, page, d]
 * (ls_cpu_kv_row): its first element is at row * d. */
__device__ __forceinline__ long ls_att_row(const int32_t *pt, long page, long Hkv, long h, long p)
{
    long i = p / page, pg = pt ? (long)pt[i] : i;
    return (pg * Hkv + h) * page + p % page;
}

/* Column `col` of the value rows of the tile's keys j0 .. j0+nb-1 (rows[j]:
 * the row of the tile's key j) into vb[0..nb) and 0 after (nb <= 0: all 0).
 * The loads are issued together, so one thread has up to 32 in flight. */
__device__ __forceinline__ void ls_att_vload(float *vb, const float *V, const long *rows, long j0,
                                             long nb, long d, int col)
{
#pragma unroll
    for (int jj = 0; jj < LS_WARP; jj++)
        vb[jj] = jj < nb ? __ldg(V + rows[j0 + jj] * d + col) : 0.0f;
}

/* Per block of 32 keys (key j = lane j of the canonical formulation):
 *   s_j  = DOT32(q, k_j) · scale
 *   M'   = max(M, max_j s_j);  c = M == −inf ? 0 : exp(M − M');  p_j = exp(s_j − M')
 *   l    = l·c + DOT32_lanes(p, 1);  acc_d = acc_d·c + DOT32_lanes(p, v[·][d])
 * exactly ls_cpu_attention's operations, in the same order.
 *
 * Only (M, l, acc) carry from block to block; the scores do not depend on
 * them, and c, p_j of a block depend only on the scores and the chain of
 * maxima. So keys are taken in tiles of 8 blocks (256 keys), two barriers
 * per tile:
 *  (1) warp w forms the scores of block w of the tile, one warp DOT32 per key
 *      as the canonical formulation has it (lane l strides dims l, l+32, ...,
 *      product then add, then the butterfly, then · scale), with the rows of
 *      LS_ATT_KG keys loaded before the first of their dots; after the
 *      butterfly every lane holds s_j and lane j keeps it. The warp forms its
 *      block maximum (ls_warp_max_first over lanes < nb, as before) for the
 *      shared table. The value rows of the tile's first two blocks are
 *      loaded before the barrier.
 *  (2) every thread replays the chain M' = M > bm ? M : bm over the tile's
 *      blocks in order (selects only, so every thread has the same values and
 *      ends with the M the next tile starts from); warp w then forms c, p_j
 *      and DOT32_lanes(p, 1) of its block from its M and M' and stores them.
 *  (3) every thread applies l = l·c + DOT32_lanes(p, 1) block by block in
 *      order, and thread d (d < head dim) owns acc_d: for each block in order
 *      partial j is 0 + p_j · v_j[d] (the single term of "lane" j), combined
 *      in the LS_DOT32 tree order, which is bitwise the warp butterfly's
 *      result, then acc_d = acc_d·c + that. The value rows are read coalesced
 *      (thread d reads column d) two blocks ahead of their use.
 * A partial last block (nb < 32 keys) contributes score −inf / probability 0
 * in lanes >= nb exactly as the canonical block does; blocks past the query's
 * position are not formed at all. The kernel takes about 200 registers a
 * thread (one block per SM): what bounds it is the loads in flight, not the
 * number of resident warps.
 *
 * The cache is paged (ls_att_row): before a tile, thread j writes the row
 * of the tile's key j (one division per thread and tile) to a shared table
 * that phases (1) and (3) address through; the keys, their order and every
 * operation on them are those of a contiguous cache, which is the identity
 * table with page = cap. The table is double-buffered, so one barrier per
 * tile suffices: tile i + 2 rewrites tile i's half only after every thread
 * has passed tile i + 1's first barrier, i.e. has left tile i. */
static_assert(LS_ATT_TILE == LS_ATT_THREADS, "one thread per key of a tile writes its row");
__global__ void __launch_bounds__(LS_ATT_THREADS)
ls_attention_kernel(const float *q, ls_att_seqs sq, long page, long cap, const int32_t *pos,
                    float *o, long Hq, long Hkv, long d, float scale, int act)
{
    ls_pdl_entry();
    __shared__ long row_sm[2][LS_ATT_TILE];     /* row of each key of the tile; two tiles */
    __shared__ float bm_sm[LS_ATT_TILE_BLOCKS]; /* block maxima of the tile */
    __shared__ float c_sm[LS_ATT_TILE_BLOCKS];  /* c of each block */
    __shared__ float l_sm[LS_ATT_TILE_BLOCKS];  /* DOT32_lanes(p, 1) of each block */
    __shared__ float p_sm[LS_ATT_TILE];         /* p_j of the tile's keys */
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
    const float *qv = q + pair * d;    /* [d] */
    const float *K = sq.kc[sidx];      /* [pages, Hkv, page, d] */
    const float *V = sq.vc[sidx];      /* [pages, Hkv, page, d] */
    const int32_t *pt = sq.pt[sidx];   /* [cap / page] or NULL */
    float qr[LS_ATT_DR];
#pragma unroll
    for (int r = 0; r < LS_ATT_DR; r++) {
        long dd = lane + (long)r * LS_WARP;
        qr[r] = dd < d ? qv[dd] : 0.0f;
    }
    int dok = tid < d;
    float acc = 0.0f;
    float M = -INFINITY, l = 0.0f;
    for (long t0 = 0; t0 <= last; t0 += LS_ATT_TILE) {
        long nt = last - t0 + 1;
        if (nt > LS_ATT_TILE) nt = LS_ATT_TILE;
        int nblk = (int)((nt + LS_WARP - 1) / LS_WARP); /* blocks of this tile, >= 1 */
        long *rows = row_sm[(t0 / LS_ATT_TILE) & 1];    /* [nt] */
        if (tid < nt) rows[tid] = ls_att_row(pt, page, Hkv, kvh, t0 + tid);
        __syncthreads();
        /* (1) Scores of block `warp`: keys b0 .. b0+nb-1 (nb <= 0: none). */
        long b0 = t0 + (long)warp * LS_WARP;
        long nb = last - b0 + 1;
        if (nb > LS_WARP) nb = LS_WARP;
        float my_s = -INFINITY; /* s of key b0 + lane */
        if (nb > 0) {           /* uniform over the warp */
            for (int j0 = 0; j0 < nb; j0 += LS_ATT_KG) {
                float kv[LS_ATT_KG][LS_ATT_DR];
#pragma unroll
                for (int g = 0; g < LS_ATT_KG; g++) {
                    /* Keys past the block read the block's last row again
                     * (in the cache, never used): no per-key predicate. */
                    long j = j0 + g < nb ? j0 + g : nb - 1;
                    const float *kl = K + rows[(long)warp * LS_WARP + j] * d + lane; /* [d - lane],
                                                                                       stride 32 */
#pragma unroll
                    for (int r = 0; r < LS_ATT_DR; r++)
                        kv[g][r] = lane + r * LS_WARP < d ? __ldg(kl + r * LS_WARP) : 0.0f;
                }
#pragma unroll
                for (int g = 0; g < LS_ATT_KG; g++) {
                    float pk = 0.0f;
#pragma unroll
                    for (int r = 0; r < LS_ATT_DR; r++) {
                        long dd = lane + (long)r * LS_WARP;
                        if (dd < d) {
                            float prod = qr[r] * kv[g][r];
                            pk = pk + prod;
                        }
                    }
                    float sj = ls_warp_tree(pk) * scale;
                    if (lane == j0 + g && lane < nb) my_s = sj;
                }
            }
            float bm = ls_warp_max_first(my_s, lane < nb ? (long)lane : -1L);
            if (lane == 0) bm_sm[warp] = bm;
        }
        float va[LS_WARP], vb[LS_WARP]; /* value columns of the next two blocks */
        if (dok) {
            ls_att_vload(va, V, rows, 0, nt, d, tid);
            ls_att_vload(vb, V, rows, LS_WARP, nt - LS_WARP, d, tid);
        }
        __syncthreads();
        /* (2) The chain of maxima; c, p_j and DOT32_lanes(p, 1) of block `warp`. */
        float Mb = M, Mnb = M; /* M before and after block `warp` */
        for (int b = 0; b < nblk; b++) {
            float bmb = bm_sm[b];
            float Mn = M > bmb ? M : bmb;
            if (b == warp) {
                Mb = M;
                Mnb = Mn;
            }
            M = Mn;
        }
        if (nb > 0) {
            float c = (Mb == -INFINITY) ? 0.0f : ls_expf(Mb - Mnb);
            float pj = lane < nb ? ls_expf(my_s - Mnb) : 0.0f;
            float pone = 0.0f;
            if (lane < nb) {
                float prod = pj * 1.0f;
                pone = pone + prod;
            }
            float lsum = ls_warp_tree(pone);
            p_sm[warp * LS_WARP + lane] = pj;
            if (lane == 0) {
                c_sm[warp] = c;
                l_sm[warp] = lsum;
            }
        }
        __syncthreads();
        /* (3) l and acc_d, block by block in order. */
#pragma unroll
        for (int b = 0; b < LS_ATT_TILE_BLOCKS; b++) {
            if (b >= nblk) break;
            float c = c_sm[b];
            float lc = l * c;
            l = lc + l_sm[b];
            if (dok) {
                long nbb = nt - (long)b * LS_WARP; /* keys of block b (> 0) */
                float vn[LS_WARP];
                /* block b + 2 of the tile (none past the tile: nbb - 64 <= 0 there) */
                ls_att_vload(vn, V, rows, (long)(b + 2) * LS_WARP, nbb - 2 * LS_WARP, d, tid);
                float pv[LS_WARP];
#pragma unroll
                for (int jj = 0; jj < LS_WARP; jj++) {
                    pv[jj] = 0.0f;
                    if (jj < nbb) {
                        float prod = p_sm[b * LS_WARP + jj] * va[jj];
                        pv[jj] = pv[jj] + prod;
                    }
                }
                LS_TREE32(pv);
                float ac = acc * c;
                acc = ac + pv[0];
#pragma unroll
                for (int jj = 0; jj < LS_WARP; jj++) {
                    va[jj] = vb[jj];
                    vb[jj] = vn[jj];
                }
            }
        }
    }
    if (dok) o[pair * d + tid] = ls_act_d(acc / l, act);
}

static ls_status att_check(long page, long cap, long Hq, long Hkv, long d, int order, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "attention");
    LS_CUDA_REQUIRE(d >= 1 && d <= LS_CUDA_ATT_MAX_D && Hq >= 1 && Hkv >= 1 && cap >= 1, err,
                    "cuda portable attention: head dim %ld (max %d), heads %ld/%ld, cache %ld "
                    "not supported", d, LS_CUDA_ATT_MAX_D, Hq, Hkv, cap);
    LS_CUDA_REQUIRE(page >= 1 && cap % page == 0, err,
                    "cuda portable attention: page %ld, cap %ld (a multiple of the page)", page, cap);
    return LS_OK;
}

extern "C" ls_status ls_cuda_attention_batch(const float *q, const float *const *kcs,
                                             const float *const *vcs, const int32_t *const *pts,
                                             long page, long cap, const long *row0,
                                             const long *len, long nseq, const int32_t *pos,
                                             float *o, long Hq, long Hkv, long d, int act_bf16,
                                             int order, void *stream, ls_error *err)
{
    ls_status st = att_check(page, cap, Hq, Hkv, d, order, err);
    if (st != LS_OK) return st;
    /* fp32(1/sqrt(d)) computed in double and rounded once (ls_cpu_inv_sqrt_scale). */
    float scale = (float)(1.0 / sqrt((double)d));
    for (long s0 = 0; s0 < nseq; s0 += LS_CUDA_SEQ_CHUNK) {
        long n = nseq - s0 < LS_CUDA_SEQ_CHUNK ? nseq - s0 : LS_CUDA_SEQ_CHUNK;
        ls_att_seqs sq;
        long maxlen = ls_att_seqs_fill(&sq, kcs, vcs, pts, row0, len, NULL, s0, n);
        if (maxlen <= 0) continue;
        LS_CUDA_REQUIRE(maxlen * Hq <= 0x7fffffffL, err,
                        "cuda portable attention: %ld tokens x %ld heads in one call", maxlen, Hq);
        dim3 grid((unsigned)(maxlen * Hq), (unsigned)n);
        ls_launch(ls_attention_kernel, grid, LS_ATT_THREADS, 0, (cudaStream_t)stream, q, sq, page, cap, pos,
                  o, Hq, Hkv, d, scale, act_bf16);
        LS_CUDA_CHECK_LAUNCH("ls_attention_kernel", err);
    }
    return LS_OK;
}

extern "C" ls_status ls_cuda_attention(const float *q, const float *kc, const float *vc,
                                       const int32_t *pt, long page, long cap, const int32_t *pos,
                                       float *o, long T, long Hq, long Hkv, long d, int act_bf16,
                                       int order, void *stream, ls_error *err)
{
    ls_status st = att_check(page, cap, Hq, Hkv, d, order, err);
    if (st != LS_OK) return st;
    if (T <= 0) return LS_OK;
    long row0 = 0;
    return ls_cuda_attention_batch(q, &kc, &vc, &pt, page, cap, &row0, &T, 1, pos, o, Hq, Hkv, d,
                                   act_bf16, order, stream, err);
}

/* ---- KV append ------------------------------------------------------------------- */

/* Element e of (row i, kv head h, dim) of sequence blockIdx.y: a plain copy
 * to its position's row (ls_att_row), the position read from pos. */
__global__ void ls_kv_append_kernel(const float *k, const float *v, ls_att_seqs sq, const int32_t *pos,
                                    long page, long Hkv, long d)
{
    ls_pdl_entry();
    int sidx = (int)blockIdx.y;
    long W = Hkv * d;
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= sq.len[sidx] * W) return;
    long i = e / W, hd = e % W, h = hd / d, dd = hd % d;
    long src = (sq.row0[sidx] + i) * W + hd;
    long dst = ls_att_row(sq.pt[sidx], page, Hkv, h, pos[sq.row0[sidx] + i]) * d + dd;
    sq.kc[sidx][dst] = k[src];
    sq.vc[sidx][dst] = v[src];
}

extern "C" ls_status ls_cuda_kv_append_batch(const float *k, const float *v, float *const *kcs,
                                             float *const *vcs, const int32_t *const *pts,
                                             long page, long cap, const long *row0,
                                             const long *len, const long *pos0,
                                             const int32_t *pos, long nseq, long Hkv, long d,
                                             void *stream, ls_error *err)
{
    LS_CUDA_REQUIRE(page >= 1 && cap % page == 0, err,
                    "cuda portable kv_append_batch: page %ld, cap %ld (a multiple of the page)",
                    page, cap);
    for (long s0 = 0; s0 < nseq; s0 += LS_CUDA_SEQ_CHUNK) {
        long n = nseq - s0 < LS_CUDA_SEQ_CHUNK ? nseq - s0 : LS_CUDA_SEQ_CHUNK;
        ls_att_seqs sq;
        long maxlen = ls_att_seqs_fill(&sq, (const float *const *)kcs, (const float *const *)vcs,
                                       pts, row0, len, pos0, s0, n);
        if (maxlen <= 0) continue;
        for (long s = 0; s < n; s++)
            LS_CUDA_REQUIRE(sq.len[s] <= 0 || sq.pos0[s] + sq.len[s] <= cap, err,
                            "cuda portable kv_append_batch: positions %ld..%ld past the cache (%ld)",
                            sq.pos0[s], sq.pos0[s] + sq.len[s] - 1, cap);
        dim3 grid(ls_blocks_for(maxlen * Hkv * d, 256), (unsigned)n);
        ls_launch(ls_kv_append_kernel, grid, 256, 0, (cudaStream_t)stream, k, v, sq, pos, page, Hkv, d);
        LS_CUDA_CHECK_LAUNCH("ls_kv_append_kernel", err);
    }
    return LS_OK;
}
