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

/* Lane's dims lane + 32 r of the query row qv [d] (0 past d). */
__device__ __forceinline__ void ls_att_q(const float *qv, long d, int lane, float (&qr)[LS_ATT_DR])
{
#pragma unroll
    for (int r = 0; r < LS_ATT_DR; r++) {
        long dd = lane + (long)r * LS_WARP;
        qr[r] = dd < d ? qv[dd] : 0.0f;
    }
}

/* Scores of nb (1..32) keys whose cache rows are rows[0..nb): one warp
 * DOT32 per key (lane l strides dims l, l+32, ..., product then add, then
 * the butterfly, then · scale), the rows of KG keys loaded before the first
 * of their dots. Lane j gets s of key j (−inf from nb). */
template <int KG>
__device__ __forceinline__ float ls_att_block_scores(const float *K, const long *rows, long nb, long d,
                                                     const float (&qr)[LS_ATT_DR], float scale, int lane)
{
    float my_s = -INFINITY;
    for (int j0 = 0; j0 < nb; j0 += KG) {
        float kv[KG][LS_ATT_DR];
#pragma unroll
        for (int g = 0; g < KG; g++) {
            /* Keys past the block read the block's last row again (in the
             * cache, never used): no per-key predicate. */
            long j = j0 + g < nb ? j0 + g : nb - 1;
            const float *kl = K + rows[j] * d + lane; /* [d - lane], stride 32 */
#pragma unroll
            for (int r = 0; r < LS_ATT_DR; r++)
                kv[g][r] = lane + r * LS_WARP < d ? __ldg(kl + r * LS_WARP) : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < KG; g++) {
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
    return my_s;
}

/* A block's c, p_j (lane j) and DOT32_lanes(p, 1) from its keys' scores
 * (lane j: my_s), nb (1..32) keys, and the maxima before (Mb) and after
 * (Mnb) it. */
__device__ __forceinline__ void ls_att_block_p(float my_s, long nb, float Mb, float Mnb, int lane, float *c,
                                               float *pj, float *lsum)
{
    *c = (Mb == -INFINITY) ? 0.0f : ls_expf(Mb - Mnb);
    *pj = lane < nb ? ls_expf(my_s - Mnb) : 0.0f;
    float pone = 0.0f;
    if (lane < nb) {
        float prod = *pj * 1.0f;
        pone = pone + prod;
    }
    *lsum = ls_warp_tree(pone);
}

/* DOT32_lanes(p, v[·][col]) of a block of nbb keys: partial j is
 * 0 + p[j] · vc[j] (vc: the keys' values of the column), combined in the
 * LS_DOT32 tree order. */
__device__ __forceinline__ float ls_att_block_pv(const float *p, const float (&vc)[LS_WARP], long nbb)
{
    float pv[LS_WARP];
#pragma unroll
    for (int jj = 0; jj < LS_WARP; jj++) {
        pv[jj] = 0.0f;
        if (jj < nbb) {
            float prod = p[jj] * vc[jj];
            pv[jj] = pv[jj] + prod;
        }
    }
    LS_TREE32(pv);
    return pv[0];
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
    ls_att_q(qv, d, lane, qr);
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
            my_s = ls_att_block_scores<LS_ATT_KG>(K, rows + (long)warp * LS_WARP, nb, d, qr, scale, lane);
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
            float c, pj, lsum;
            ls_att_block_p(my_s, nb, Mb, Mnb, lane, &c, &pj, &lsum);
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
                float x = ls_att_block_pv(p_sm + b * LS_WARP, va, nbb);
                float ac = acc * c;
                acc = ac + x;
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

/* ---- attention of one query per sequence, split over key blocks ----------------
 * A decode step has one query per sequence, so the kernel above runs one
 * block per (sequence, head) and walks its keys' blocks in a chain: at batch
 * 1 that is 16 blocks on a GPU of 132 SMs. The same operations spread over
 * the blocks of 32 keys, in three launches (ls_cuda_attention_batch, when
 * every sequence of a launch has one query and the caller gave scratch):
 *   (A) per (query, head, key block), a block of 8 warps: the block's
 *       scores, 4 keys a warp, and its maximum (ls_att_block_scores,
 *       ls_warp_max_first), to scratch;
 *   (B) per (query, head, key block), a block: the chain of maxima up to
 *       and through it (M' = M > bm ? M : bm from −inf, the kernel above's
 *       selects over the same values), then c, p_j and DOT32_lanes(p, 1)
 *       (ls_att_block_p) and, thread d, DOT32_lanes(p, v[·][d])
 *       (ls_att_block_pv), to scratch;
 *   (C) per (query, head), a block: l = l·c + DOT32_lanes(p, 1) and
 *       acc_d = acc_d·c + DOT32_lanes(p, v[·][d]) block by block in order,
 *       then o = acc / l.
 * Every value is formed by the same operations on the same operands as in
 * ls_attention_kernel, so the outputs are its bits; only where the blocks
 * are formed changes. The grids cover the cache's capacity (a step graph
 * replays them at every position), the blocks past a query's position
 * doing nothing. */
#define LS_ATT_SPLIT_GY 64 /* most key blocks across a grid's y; the rest in turn */

/* Scratch of one launch of U = sequences x Hq units, NB = ceil(cap / 32) key
 * blocks each: scores [U, NB, 32], maxima, c and DOT32_lanes(p, 1) [U, NB],
 * DOT32_lanes(p, v) [U, NB, d]. */
typedef struct ls_att_split {
    float *s, *bm, *c, *ls, *x;
    long nb; /* NB */
} ls_att_split;

static size_t ls_att_split_floats(long U, long NB, long d)
{
    return (size_t)U * (size_t)NB * (size_t)(LS_WARP + 3 + d);
}

static ls_att_split ls_att_split_at(float *scratch, long U, long NB, long d)
{
    ls_att_split a;
    size_t cells = (size_t)U * (size_t)NB;
    a.s = scratch;
    a.bm = a.s + cells * LS_WARP;
    a.c = a.bm + cells;
    a.ls = a.c + cells;
    a.x = a.ls + cells;
    a.nb = NB;
    return a;
}

/* The unit (sequence blockIdx.z, head blockIdx.x): its query's last key
 * (its position, within the cache) and its kv head; -1 when the sequence
 * has no query in this launch. */
__device__ __forceinline__ long ls_att_unit(const ls_att_seqs &sq, const int32_t *pos, long cap, long Hq,
                                            long Hkv, long *pair, long *kvh)
{
    int sidx = (int)blockIdx.z;
    if (sq.len[sidx] < 1) return -1;
    long n = blockIdx.x;
    *pair = sq.row0[sidx] * Hq + n;
    *kvh = n * Hkv / Hq;
    long last = pos[sq.row0[sidx]];
    return last > cap - 1 ? cap - 1 : last;
}

/* (A): block (head, y, sequence) takes key blocks y, y + gridDim.y, ...;
 * warp w forms the scores of the block's keys 4w .. 4w + 3, and warp 0 the
 * block's maximum. */
#define LS_ATT_SPLIT_KPW (LS_WARP / LS_ATT_WARPS) /* keys per warp: 4 */
__global__ void __launch_bounds__(LS_ATT_THREADS)
ls_att_scores_kernel(const float *q, ls_att_seqs sq, long page, long cap, const int32_t *pos, long Hq,
                     long Hkv, long d, float scale, ls_att_split a)
{
    ls_pdl_entry();
    __shared__ long rows[LS_WARP];
    __shared__ float s_sm[LS_WARP];
    int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    long pair, kvh;
    long last = ls_att_unit(sq, pos, cap, Hq, Hkv, &pair, &kvh);
    if (last < 0) return;
    long u = (long)blockIdx.z * Hq + blockIdx.x;
    int sidx = (int)blockIdx.z;
    float qr[LS_ATT_DR];
    ls_att_q(q + pair * d, d, lane, qr);
    for (long b = blockIdx.y; b * LS_WARP <= last; b += gridDim.y) {
        long b0 = b * LS_WARP, nb = last - b0 + 1;
        if (nb > LS_WARP) nb = LS_WARP;
        if (tid < nb) rows[tid] = ls_att_row(sq.pt[sidx], page, Hkv, kvh, b0 + tid);
        __syncthreads();
        long j0 = (long)warp * LS_ATT_SPLIT_KPW, nw = nb - j0; /* this warp's keys */
        if (nw > LS_ATT_SPLIT_KPW) nw = LS_ATT_SPLIT_KPW;
        if (nw > 0) {
            float sj = ls_att_block_scores<LS_ATT_SPLIT_KPW>(sq.kc[sidx], rows + j0, nw, d, qr, scale, lane);
            if (lane < nw) s_sm[j0 + lane] = sj;
        }
        __syncthreads();
        if (warp == 0) {
            float my_s = lane < nb ? s_sm[lane] : -INFINITY;
            float bm = ls_warp_max_first(my_s, lane < nb ? (long)lane : -1L);
            a.s[(u * a.nb + b) * LS_WARP + lane] = my_s;
            if (lane == 0) a.bm[u * a.nb + b] = bm;
        }
        __syncthreads();
    }
}

/* (B): block (head, y, sequence) takes key blocks y, y + gridDim.y, ... */
__global__ void __launch_bounds__(LS_ATT_THREADS)
ls_att_values_kernel(ls_att_seqs sq, long page, long cap, const int32_t *pos, long Hq, long Hkv, long d,
                     ls_att_split a)
{
    ls_pdl_entry();
    __shared__ long rows[LS_WARP];
    __shared__ float p_sm[LS_WARP];
    int tid = (int)threadIdx.x, lane = tid & 31;
    long pair, kvh;
    long last = ls_att_unit(sq, pos, cap, Hq, Hkv, &pair, &kvh);
    if (last < 0) return;
    long u = (long)blockIdx.z * Hq + blockIdx.x;
    int sidx = (int)blockIdx.z;
    const float *bm = a.bm + u * a.nb;
    for (long b = blockIdx.y; b * LS_WARP <= last; b += gridDim.y) {
        long b0 = b * LS_WARP, nb = last - b0 + 1;
        if (nb > LS_WARP) nb = LS_WARP;
        float M = -INFINITY, Mb = M;
        for (long i = 0; i <= b; i++) {
            float bmi = bm[i];
            Mb = M;
            M = M > bmi ? M : bmi;
        }
        if (tid < LS_WARP) {
            float c, pj, lsum;
            ls_att_block_p(a.s[(u * a.nb + b) * LS_WARP + lane], nb, Mb, M, lane, &c, &pj, &lsum);
            p_sm[lane] = pj;
            if (lane < nb) rows[lane] = ls_att_row(sq.pt[sidx], page, Hkv, kvh, b0 + lane);
            if (lane == 0) {
                a.c[u * a.nb + b] = c;
                a.ls[u * a.nb + b] = lsum;
            }
        }
        __syncthreads();
        if (tid < d) {
            float vc[LS_WARP];
            ls_att_vload(vc, sq.vc[sidx], rows, 0, nb, d, tid);
            a.x[(u * a.nb + b) * d + tid] = ls_att_block_pv(p_sm, vc, nb);
        }
        __syncthreads();
    }
}

/* (C): block (head, sequence). */
__global__ void __launch_bounds__(LS_ATT_THREADS)
ls_att_combine_kernel(ls_att_seqs sq, long cap, const int32_t *pos, float *o, long Hq, long Hkv, long d,
                      ls_att_split a, int act)
{
    ls_pdl_entry();
    int tid = (int)threadIdx.x;
    long pair, kvh;
    long last = ls_att_unit(sq, pos, cap, Hq, Hkv, &pair, &kvh);
    if (last < 0) return;
    long u = (long)blockIdx.z * Hq + blockIdx.x, nblk = last / LS_WARP + 1;
    int dok = tid < d;
    float acc = 0.0f, l = 0.0f;
    for (long b = 0; b < nblk; b++) {
        float c = a.c[u * a.nb + b];
        float lc = l * c;
        l = lc + a.ls[u * a.nb + b];
        if (dok) {
            float ac = acc * c;
            acc = ac + a.x[(u * a.nb + b) * d + tid];
        }
    }
    if (dok) o[pair * d + tid] = ls_act_d(acc / l, act);
}

#define LS_ATT_SPLIT_MAX_BYTES ((size_t)64 << 20)

extern "C" size_t ls_cuda_attention_scratch_bytes(long nseq, long Hq, long d, long cap)
{
    if (nseq <= 0 || Hq <= 0 || d <= 0 || cap <= 0) return 0;
    long n = nseq < LS_CUDA_SEQ_CHUNK ? nseq : LS_CUDA_SEQ_CHUNK;
    size_t b = sizeof(float) * ls_att_split_floats(n * Hq, (cap + LS_WARP - 1) / LS_WARP, d);
    return b <= LS_ATT_SPLIT_MAX_BYTES ? b : 0;
}

/* (A), (B), (C) for n sequences of one query each. */
static ls_status ls_att_split_launch(const float *q, const ls_att_seqs *sq, long n, long page, long cap,
                                     const int32_t *pos, float *o, long Hq, long Hkv, long d, float scale,
                                     int act, float *scratch, cudaStream_t s, ls_error *err)
{
    long NB = (cap + LS_WARP - 1) / LS_WARP, gy = NB < LS_ATT_SPLIT_GY ? NB : LS_ATT_SPLIT_GY;
    ls_att_split a = ls_att_split_at(scratch, n * Hq, NB, d);
    dim3 grid((unsigned)Hq, (unsigned)gy, (unsigned)n);
    ls_launch(ls_att_scores_kernel, grid, LS_ATT_THREADS, 0, s, q, *sq, page, cap, pos, Hq, Hkv, d, scale, a);
    LS_CUDA_CHECK_LAUNCH("ls_att_scores_kernel", err);
    ls_launch(ls_att_values_kernel, grid, LS_ATT_THREADS, 0, s, *sq, page, cap, pos, Hq, Hkv, d, a);
    LS_CUDA_CHECK_LAUNCH("ls_att_values_kernel", err);
    ls_launch(ls_att_combine_kernel, dim3((unsigned)Hq, 1, (unsigned)n), LS_ATT_THREADS, 0, s, *sq, cap, pos,
              o, Hq, Hkv, d, a, act);
    LS_CUDA_CHECK_LAUNCH("ls_att_combine_kernel", err);
    return LS_OK;
}

/* who: "portable" or "fast", for the messages. */
static ls_status att_check(const char *who, long page, long cap, long Hq, long Hkv, long d, int order,
                           ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "attention");
    LS_CUDA_REQUIRE(d >= 1 && d <= LS_CUDA_ATT_MAX_D && Hq >= 1 && Hkv >= 1 && cap >= 1, err,
                    "cuda %s attention: head dim %ld (max %d), heads %ld/%ld, cache %ld "
                    "not supported", who, d, LS_CUDA_ATT_MAX_D, Hq, Hkv, cap);
    LS_CUDA_REQUIRE(page >= 1 && cap % page == 0, err,
                    "cuda %s attention: page %ld, cap %ld (a multiple of the page)", who, page, cap);
    return LS_OK;
}

extern "C" ls_status ls_cuda_attention_batch(const float *q, const float *const *kcs,
                                             const float *const *vcs, const int32_t *const *pts,
                                             long page, long cap, const long *row0,
                                             const long *len, long nseq, const int32_t *pos,
                                             float *o, long Hq, long Hkv, long d, int act_bf16,
                                             int order, void *scratch, void *stream, ls_error *err)
{
    ls_status st = att_check("portable", page, cap, Hq, Hkv, d, order, err);
    if (st != LS_OK) return st;
    if (!ls_cuda_attention_scratch_bytes(nseq, Hq, d, cap)) scratch = NULL;
    /* fp32(1/sqrt(d)) computed in double and rounded once (ls_cpu_inv_sqrt_scale). */
    float scale = (float)(1.0 / sqrt((double)d));
    for (long s0 = 0; s0 < nseq; s0 += LS_CUDA_SEQ_CHUNK) {
        long n = nseq - s0 < LS_CUDA_SEQ_CHUNK ? nseq - s0 : LS_CUDA_SEQ_CHUNK;
        ls_att_seqs sq;
        long maxlen = ls_att_seqs_fill(&sq, kcs, vcs, pts, row0, len, NULL, s0, n);
        if (maxlen <= 0) continue;
        LS_CUDA_REQUIRE(maxlen * Hq <= 0x7fffffffL, err,
                        "cuda portable attention: %ld tokens x %ld heads in one call", maxlen, Hq);
        if (maxlen == 1 && scratch && Hq <= 65535) {
            LS_TRY(ls_att_split_launch(q, &sq, n, page, cap, pos, o, Hq, Hkv, d, scale, act_bf16,
                                       (float *)scratch, (cudaStream_t)stream, err));
            continue;
        }
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
    ls_status st = att_check("portable", page, cap, Hq, Hkv, d, order, err);
    if (st != LS_OK) return st;
    if (T <= 0) return LS_OK;
    long row0 = 0;
    return ls_cuda_attention_batch(q, &kc, &vc, &pt, page, cap, &row0, &T, 1, pos, o, Hq, Hkv, d,
                                   act_bf16, order, NULL, stream, err);
}

/* ---- the fast tier's attention (docs/tensor-core-tier.md §6) --------------------
 * What serving engines do (split-KV, "flash decoding"), as the yardstick of
 * what the strict order costs: each (query, head)'s keys split into S spans,
 * S chosen per call from its queries x heads against the SMs (at least two
 * blocks an SM while a span keeps LS_ATT_FAST_MIN_KEYS keys), so the bits
 * change with the batch. A span is an online softmax over its keys, warp w
 * taking keys w, w + 4, ... in groups of LS_ATT_FAST_KG, with fused
 * multiply-adds and __expf; the warps, then the spans, are merged by their
 * maxima. Not batch-invariant, not CPU-equal: the fast tier only. */
#define LS_ATT_FAST_WARPS 4
#define LS_ATT_FAST_KG 4          /* keys a warp loads before their scores */
#define LS_ATT_FAST_MIN_KEYS 32   /* fewest keys a span is worth */
#define LS_ATT_FAST_MAX_SPANS 64

/* Spans per (query, head) of a launch of `units` (query, head) pairs over a
 * cache of cap positions. */
static long ls_att_fast_spans(long units, long cap)
{
    long want = (2L * ls_sm_count() + units - 1) / units;
    long most = (cap + LS_ATT_FAST_MIN_KEYS - 1) / LS_ATT_FAST_MIN_KEYS;
    if (most > LS_ATT_FAST_MAX_SPANS) most = LS_ATT_FAST_MAX_SPANS;
    long S = want < most ? want : most;
    return S > 1 ? S : 1;
}

/* grid (maxlen x Hq, S, sequences): block per (query, head, span). Span y of
 * S covers positions [y span, (y + 1) span) up to the query's. S = 1 writes
 * o; otherwise part[(unit - unit0) S + y] = (max, sum, acc[d]) unnormalised
 * (max −inf, sum 0 for a span past the query). */
__global__ void __launch_bounds__(LS_ATT_FAST_WARPS * LS_WARP)
ls_att_fast_span_kernel(const float *q, ls_att_seqs sq, long page, long cap, const int32_t *pos, float *o,
                        long Hq, long Hkv, long d, float scale, long span, long unit0, float *part, int act)
{
    ls_pdl_entry();
    __shared__ float m_sm[LS_ATT_FAST_WARPS], l_sm[LS_ATT_FAST_WARPS];
    __shared__ float acc_sm[LS_ATT_FAST_WARPS][LS_CUDA_ATT_MAX_D];
    int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int sidx = (int)blockIdx.z;
    long lp = blockIdx.x;
    if (lp >= sq.len[sidx] * Hq) return; /* whole block */
    long pair = sq.row0[sidx] * Hq + lp;
    long t = pair / Hq, kvh = (pair % Hq) * Hkv / Hq;
    long last = pos[t] < cap - 1 ? pos[t] : cap - 1;
    long k0 = (long)blockIdx.y * span, k1 = k0 + span <= last + 1 ? k0 + span : last + 1;
    const float *K = sq.kc[sidx], *V = sq.vc[sidx];
    const int32_t *pt = sq.pt[sidx];
    float qr[LS_ATT_DR], acc[LS_ATT_DR];
    ls_att_q(q + pair * d, d, lane, qr);
#pragma unroll
    for (int r = 0; r < LS_ATT_DR; r++) acc[r] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (long j0 = k0 + warp * LS_ATT_FAST_KG; j0 < k1; j0 += LS_ATT_FAST_WARPS * LS_ATT_FAST_KG) {
        float kv[LS_ATT_FAST_KG][LS_ATT_DR], vv[LS_ATT_FAST_KG][LS_ATT_DR], s[LS_ATT_FAST_KG];
#pragma unroll
        for (int g = 0; g < LS_ATT_FAST_KG; g++) {
            long j = j0 + g < k1 ? j0 + g : k1 - 1; /* past the span: the last key again, not counted */
            long row = ls_att_row(pt, page, Hkv, kvh, j);
#pragma unroll
            for (int r = 0; r < LS_ATT_DR; r++) {
                long dd = lane + (long)r * LS_WARP;
                kv[g][r] = dd < d ? __ldg(K + row * d + dd) : 0.0f;
                vv[g][r] = dd < d ? __ldg(V + row * d + dd) : 0.0f;
            }
        }
        float mn = m;
#pragma unroll
        for (int g = 0; g < LS_ATT_FAST_KG; g++) {
            float dot = 0.0f;
#pragma unroll
            for (int r = 0; r < LS_ATT_DR; r++) dot = __fmaf_rn(qr[r], kv[g][r], dot);
#pragma unroll
            for (int off = LS_WARP / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
            s[g] = j0 + g < k1 ? dot * scale : -INFINITY;
            mn = fmaxf(mn, s[g]);
        }
        float c = __expf(m - mn); /* m = −inf: 0 */
        l *= c;
#pragma unroll
        for (int r = 0; r < LS_ATT_DR; r++) acc[r] *= c;
#pragma unroll
        for (int g = 0; g < LS_ATT_FAST_KG; g++) {
            float p = __expf(s[g] - mn);
            l += p;
#pragma unroll
            for (int r = 0; r < LS_ATT_DR; r++) acc[r] = __fmaf_rn(p, vv[g][r], acc[r]);
        }
        m = mn;
    }
    if (lane == 0) {
        m_sm[warp] = m;
        l_sm[warp] = l;
    }
#pragma unroll
    for (int r = 0; r < LS_ATT_DR; r++) {
        long dd = lane + (long)r * LS_WARP;
        if (dd < d) acc_sm[warp][dd] = acc[r];
    }
    __syncthreads();
    float M = m_sm[0];
    for (int w = 1; w < LS_ATT_FAST_WARPS; w++) M = fmaxf(M, m_sm[w]);
    float cw[LS_ATT_FAST_WARPS], L = 0.0f;
    for (int w = 0; w < LS_ATT_FAST_WARPS; w++) {
        cw[w] = m_sm[w] == -INFINITY ? 0.0f : __expf(m_sm[w] - M);
        L = __fmaf_rn(l_sm[w], cw[w], L);
    }
    long S = gridDim.y;
    float *pp = S > 1 ? part + ((pair - unit0) * S + blockIdx.y) * (d + 2) : NULL;
    if (pp && tid == 0) {
        pp[0] = M;
        pp[1] = L;
    }
    for (long dd = tid; dd < d; dd += LS_ATT_FAST_WARPS * LS_WARP) {
        float a = 0.0f;
        for (int w = 0; w < LS_ATT_FAST_WARPS; w++) a = __fmaf_rn(acc_sm[w][dd], cw[w], a);
        if (pp) pp[2 + dd] = a;
        else o[pair * d + dd] = ls_act_d(a / L, act);
    }
}

/* grid (maxlen x Hq, sequences): the S spans of a (query, head) merged. */
__global__ void __launch_bounds__(LS_ATT_THREADS)
ls_att_fast_merge_kernel(ls_att_seqs sq, float *o, long Hq, long d, long S, long unit0, const float *part,
                         int act)
{
    ls_pdl_entry();
    int sidx = (int)blockIdx.y;
    long lp = blockIdx.x;
    if (lp >= sq.len[sidx] * Hq) return;
    long pair = sq.row0[sidx] * Hq + lp;
    const float *pp = part + (pair - unit0) * S * (d + 2);
    float M = -INFINITY;
    for (long y = 0; y < S; y++) M = fmaxf(M, pp[y * (d + 2)]);
    float L = 0.0f;
    for (long y = 0; y < S; y++) {
        float my = pp[y * (d + 2)];
        if (my != -INFINITY) L = __fmaf_rn(pp[y * (d + 2) + 1], __expf(my - M), L);
    }
    for (long dd = threadIdx.x; dd < d; dd += blockDim.x) {
        float a = 0.0f;
        for (long y = 0; y < S; y++) {
            float my = pp[y * (d + 2)];
            if (my != -INFINITY) a = __fmaf_rn(pp[y * (d + 2) + 2 + dd], __expf(my - M), a);
        }
        o[pair * d + dd] = ls_act_d(a / L, act);
    }
}

/* The split of one launch's n sequences: *first the first row they span in
 * q, *S the spans per (query, head); returns the scratch bytes of their
 * partial results (0 when S = 1). */
static size_t ls_att_fast_plan(const long *row0, const long *len, long n, long Hq, long d, long cap, long *first,
                               long *S)
{
    long end = 0;
    int any = 0;
    *first = 0;
    for (long s = 0; s < n; s++) {
        if (len[s] <= 0) continue;
        if (!any || row0[s] < *first) *first = row0[s];
        if (!any || row0[s] + len[s] > end) end = row0[s] + len[s];
        any = 1;
    }
    long units = (end - *first) * Hq;
    *S = units > 0 ? ls_att_fast_spans(units, cap) : 1;
    return *S > 1 ? sizeof(float) * (size_t)units * (size_t)*S * (size_t)(d + 2) : 0;
}

extern "C" size_t ls_cuda_attention_fast_scratch_bytes(const long *row0, const long *len, long nseq, long Hq,
                                                      long d, long cap)
{
    size_t most = 0;
    for (long s0 = 0; s0 < nseq && Hq > 0 && d > 0 && cap > 0; s0 += LS_CUDA_SEQ_CHUNK) {
        long n = nseq - s0 < LS_CUDA_SEQ_CHUNK ? nseq - s0 : LS_CUDA_SEQ_CHUNK, first, S;
        size_t b = ls_att_fast_plan(row0 + s0, len + s0, n, Hq, d, cap, &first, &S);
        most = b > most ? b : most;
    }
    return most;
}

extern "C" ls_status ls_cuda_attention_fast_batch(const float *q, const float *const *kcs,
                                                  const float *const *vcs, const int32_t *const *pts,
                                                  long page, long cap, const long *row0, const long *len,
                                                  long nseq, const int32_t *pos, float *o, long Hq, long Hkv,
                                                  long d, int act_bf16, void *scratch, size_t scratch_bytes,
                                                  void *stream, ls_error *err)
{
    LS_TRY(att_check("fast", page, cap, Hq, Hkv, d, 0, err));
    LS_CUDA_REQUIRE(Hq <= 65535, err, "cuda fast attention: %ld heads", Hq);
    float scale = (float)(1.0 / sqrt((double)d));
    cudaStream_t s = (cudaStream_t)stream;
    for (long s0 = 0; s0 < nseq; s0 += LS_CUDA_SEQ_CHUNK) {
        long n = nseq - s0 < LS_CUDA_SEQ_CHUNK ? nseq - s0 : LS_CUDA_SEQ_CHUNK, first, S;
        ls_att_seqs sq;
        long maxlen = ls_att_seqs_fill(&sq, kcs, vcs, pts, row0, len, NULL, s0, n);
        if (maxlen <= 0) continue;
        LS_CUDA_REQUIRE(maxlen * Hq <= 0x7fffffffL, err, "cuda fast attention: %ld tokens x %ld heads in one call",
                        maxlen, Hq);
        size_t need = ls_att_fast_plan(row0 + s0, len + s0, n, Hq, d, cap, &first, &S);
        if (need > scratch_bytes || (need && !scratch))
            return ls_fail(err, LS_E_INTERNAL, "cuda fast attention: %zu bytes of scratch needed, %zu given "
                           "(ls_cuda_attention_fast_scratch_bytes)", need, scratch_bytes);
        long span = (cap + S - 1) / S;
        ls_launch(ls_att_fast_span_kernel, dim3((unsigned)(maxlen * Hq), (unsigned)S, (unsigned)n),
                  LS_ATT_FAST_WARPS * LS_WARP, 0, s, q, sq, page, cap, pos, o, Hq, Hkv, d, scale, span,
                  first * Hq, (float *)scratch, act_bf16);
        LS_CUDA_CHECK_LAUNCH("ls_att_fast_span_kernel", err);
        if (S > 1) {
            ls_launch(ls_att_fast_merge_kernel, dim3((unsigned)(maxlen * Hq), (unsigned)n), LS_ATT_THREADS, 0, s,
                      sq, o, Hq, d, S, first * Hq, (const float *)scratch, act_bf16);
            LS_CUDA_CHECK_LAUNCH("ls_att_fast_merge_kernel", err);
        }
    }
    return LS_OK;
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
