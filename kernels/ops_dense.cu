/* lockstep — portable strict kernels: embedding, linear, norms, elementwise
 * ops, causal conv, GDN gates, logprobs and top-k (see ops.h). Every
 * reduction is one warp in LS_DOT32 order; no kernel's order depends on T. */
#include "ops.h"
#include "ops_common.cuh"
#include "numerics/types.h"

/* ---- embedding ---------------------------------------------------------------- */

__global__ void ls_embed_kernel(const void *emb, int wtype, long V, long D, const int32_t *tokens,
                                long T, float *h, int act)
{
    ls_pdl_entry();
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= T * D) return;
    long t = e / D, i = e % D;
    int32_t tok = tokens[t];
    float v = 0.0f;
    if (tok >= 0 && tok < V)
        v = ls_wload((const uint8_t *)emb + (size_t)tok * D * ls_welem_bytes(wtype), wtype, i);
    h[e] = ls_act_d(v, act);
}

extern "C" ls_status ls_cuda_embed(const void *emb, int wtype, long V, long D,
                                   const int32_t *tokens, long T, float *h, int act_bf16,
                                   void *stream, ls_error *err)
{
    LS_REQUIRE_WTYPE(wtype, err, "embed");
    if (T <= 0 || D <= 0) return LS_OK;
    ls_launch(ls_embed_kernel, ls_blocks_for(T * D, 256), 256, 0, (cudaStream_t)stream, emb, wtype, V, D,
              tokens, T, h, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_embed_kernel", err);
    return LS_OK;
}

/* ---- linear ------------------------------------------------------------------- */

#define LS_LIN_WARPS 8 /* output rows per block, one warp each */

/* grid (ceil(out / 8), ceil(T / NT)), NT = 1, 4 or 8: warp = one output row o for NT tokens;
 * ls_warp_rowdot reads the row once (16-byte loads) and forms each token's
 * LS_DOT32 in the canonical order. NT only sets how many tokens share a weight
 * load; no token's bits depend on it. */
/* The same kernel serves every weight type (ls_warp_rowdot_any): an FP8 row
 * brings its scale row (scale [ceil(out/128), ceil(in/128)]); in w8a8 mode x
 * holds the quantised token rows and xsc their group scales [T,
 * ceil(in/128)] (ls_cuda_fp8_quant_act), NULL otherwise. */
template <int NT>
__global__ void __launch_bounds__(LS_LIN_WARPS * LS_WARP)
ls_linear_kernel(const void *w, const float *scale, int wtype, long out, long in, const float *x,
                 const float *xsc, float *y, long T, int act)
{
    ls_pdl_entry();
    __shared__ float wsm[LS_LIN_WARPS][LS_ROWDOT_SMEM(NT)];
    int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    long o = (long)blockIdx.x * LS_LIN_WARPS + warp;
    long t0 = (long)blockIdx.y * NT;
    if (o >= out) return; /* whole warp */
    int nt = T - t0 < NT ? (int)(T - t0) : NT;
    long nb = LS_FP8_BLOCKS(in);
    const float *xs[NT], *ss[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        long tt = t0 + (t < nt ? t : 0);
        xs[t] = x + tt * in;
        ss[t] = xsc ? xsc + tt * nb : NULL;
    }
    const float *srow = scale ? scale + (o / LS_FP8_BLOCK) * nb : NULL;
    float r[NT];
    ls_warp_rowdot_any<NT>((const uint8_t *)w + (size_t)o * in * ls_welem_bytes(wtype), srow, wtype,
                           in, xs, ss, nt, wsm[warp], r);
#pragma unroll
    for (int t = 0; t < NT; t++)
        if (lane == t && t < nt) y[(t0 + t) * out + o] = ls_act_d(r[t], act);
}

template <int NT>
static ls_status linear_launch(const void *w, const float *scale, int wtype, long out, long in,
                               const float *x, const float *xsc, float *y, long T, int act_bf16,
                               cudaStream_t stream, ls_error *err)
{
    long ty = (T + NT - 1) / NT;
    LS_CUDA_REQUIRE(ty <= 65535 && ls_blocks_for(out, LS_LIN_WARPS) <= 0x7fffffffu, err,
                    "cuda portable linear: shape [%ld, %ld] with T %ld exceeds the grid", out, in, T);
    dim3 grid(ls_blocks_for(out, LS_LIN_WARPS), (unsigned)ty);
    ls_launch(ls_linear_kernel<NT>, grid, LS_LIN_WARPS * LS_WARP, 0, stream, w, scale, wtype, out, in, x, xsc,
              y, T, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_linear_kernel", err);
    return LS_OK;
}

static ls_status linear_any(const void *w, const float *scale, int wtype, long out, long in,
                            const float *x, const float *xsc, float *y, long T, int act_bf16,
                            void *stream, ls_error *err)
{
    if (T == 0 || out == 0) return LS_OK;
    cudaStream_t s = (cudaStream_t)stream;
    if (T == 1) return linear_launch<1>(w, scale, wtype, out, in, x, xsc, y, T, act_bf16, s, err);
    if (T <= 4) return linear_launch<4>(w, scale, wtype, out, in, x, xsc, y, T, act_bf16, s, err);
    return linear_launch<8>(w, scale, wtype, out, in, x, xsc, y, T, act_bf16, s, err);
}

/* Plan 1, tiles (ls_tile_dots): a block forms 16 output rows (4 per warp)
 * for 8 tokens, each value read from shared memory meeting 4 rows or 8
 * tokens (plan 0 reads each activation from L1 once per row and token).
 * Blocks are numbered token tile fastest, so the blocks that read one block
 * of rows run together and the L2 serves the rows after their first read.
 * Rows past `out` repeat row out − 1 and tokens past T token T − 1; neither
 * is stored. */
#define LS_LT_RW 4 /* rows per warp */
#define LS_LT_NT 8 /* tokens per block: LS_LT_RW x LS_LT_NT = 32 sums per warp */
#define LS_LT_ROWS (LS_TILE_WARPS * LS_LT_RW)
#define LS_LT_MIN_T 2 /* the default plan is 1 from this many tokens */

template <int EB>
__global__ void __launch_bounds__(LS_TILE_WARPS * LS_WARP)
ls_linear_tile_kernel(const void *w, long out, long in, const float *x, float *y, long T, long ty,
                      int act)
{
    ls_pdl_entry();
    __shared__ __align__(16) uint8_t sm[LS_TILE_SMEM(EB, LS_LT_RW, LS_LT_NT)];
    long t0 = (long)(blockIdx.x % ty) * LS_LT_NT, r0 = (long)(blockIdx.x / ty) * LS_LT_ROWS;
    int nt = T - t0 < LS_LT_NT ? (int)(T - t0) : LS_LT_NT;
    float p[LS_LT_RW * LS_LT_NT];
    ls_tile_dots<EB, LS_LT_RW, LS_LT_NT>(
        sm, in,
        [&](int r) { return (const uint8_t *)w + (size_t)(r0 + r < out ? r0 + r : out - 1) * in * EB; },
        [&](int t) { return x + (t0 + (t < nt ? t : nt - 1)) * in; }, p);
    int lane = (int)(threadIdx.x & 31u);
    float v = ls_warp_tree_n(p); /* lane l: row l / NT of the warp's, token l % NT */
    long o = r0 + (long)(threadIdx.x >> 5) * LS_LT_RW + lane / LS_LT_NT;
    int t = lane % LS_LT_NT;
    if (t < nt && o < out) y[(t0 + t) * out + o] = ls_act_d(v, act);
}

static ls_status linear_tiles(const void *w, int wtype, long out, long in, const float *x, float *y,
                              long T, int act_bf16, cudaStream_t stream, ls_error *err)
{
    long ty = (T + LS_LT_NT - 1) / LS_LT_NT, nb = ls_blocks_for(out, LS_LT_ROWS) * ty;
    LS_CUDA_REQUIRE(nb <= 0x7fffffffL, err,
                    "cuda portable linear (tiles): shape [%ld, %ld] with T %ld exceeds the grid", out,
                    in, T);
    if (wtype == LS_WTYPE_BF16_ID)
        ls_launch(ls_linear_tile_kernel<2>, (unsigned)nb, LS_TILE_WARPS * LS_WARP, 0, stream, w, out, in, x,
                  y, T, ty, act_bf16);
    else
        ls_launch(ls_linear_tile_kernel<4>, (unsigned)nb, LS_TILE_WARPS * LS_WARP, 0, stream, w, out, in, x,
                  y, T, ty, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_linear_tile_kernel", err);
    return LS_OK;
}

/* Plan 2, one token (T = 1) of bf16 weights with in = 256 CH (CH 8 or 16):
 * the block stages x in shared memory once; each warp takes rows o, o + W,
 * ... (W the grid's warps) and holds a whole row in registers
 * (ls_row1_load), so that all of a row's loads are in flight at once
 * instead of two KiB of it, the first row before the kernel waits for x
 * (kernels/launch.cuh). At in = 2048 a warp also loads its next row
 * before it adds the current one; at in = 4096 two rows would not fit the
 * registers, and the grid has a warp for every row of the model's shapes at
 * that width. The adds are ls_row1_dot's, the canonical order: the same bits
 * as plan 0. Another shape or dtype runs plan 0. */
#define LS_R1_WARPS_PER_SM 32 /* warps the grid is sized to, per SM */

template <int CH>
__global__ void __launch_bounds__(LS_LIN_WARPS * LS_WARP)
ls_linear_row1_kernel(const uint16_t *w, long out, const float *x, float *y, int act)
{
    constexpr long K = 256L * CH;
    constexpr bool ahead = CH <= 8; /* the next row's loads in flight too */
    __shared__ float xsm[K];
    __shared__ float wsm[LS_LIN_WARPS][LS_STAGE_CHUNK];
    int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    long stride = (long)gridDim.x * LS_LIN_WARPS, o = (long)blockIdx.x * LS_LIN_WARPS + warp;
    uint4 raw[CH], next[CH];
    if (o < out) ls_row1_load<CH>(raw, w + o * K, lane); /* weights: before the wait */
    ls_pdl_entry();
    constexpr int NT = LS_LIN_WARPS * LS_WARP;
#pragma unroll
    for (int i = 0; i < K / NT; i++) xsm[i * NT + threadIdx.x] = x[i * NT + threadIdx.x]; /* all in flight */
    __syncthreads();
    if (o >= out) return; /* whole warp */
    for (;;) {
        long nx = o + stride;
        if (ahead && nx < out) ls_row1_load<CH>(next, w + nx * K, lane);
        float p = ls_row1_dot<CH>(raw, wsm[warp], xsm, lane);
        if (lane == 0) y[o] = ls_act_d(p, act);
        if (nx >= out) break;
        o = nx;
        if (!ahead) ls_row1_load<CH>(raw, w + o * K, lane);
        else
#pragma unroll
            for (int c = 0; c < CH; c++) raw[c] = next[c];
    }
}

/* The SM count of the first device asked (132 when it cannot be read),
 * kept (ops_common.cuh). */
int ls_sm_count(void)
{
    static int sms;
    if (sms) return sms;
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
        (void)cudaGetLastError();
        n = 132;
    }
    sms = n;
    return sms;
}

/* Plan 2 where it applies (*done 1), else nothing (*done 0). */
static ls_status linear_row1(const void *w, int wtype, long out, long in, const float *x, float *y, long T,
                             int act_bf16, cudaStream_t stream, int *done, ls_error *err)
{
    *done = T == 1 && wtype == LS_WTYPE_BF16_ID && (in == 2048 || in == 4096) && !((uintptr_t)w & 15u);
    if (!*done) return LS_OK;
    long warps = (long)ls_sm_count() * LS_R1_WARPS_PER_SM;
    if (warps > out) warps = out;
    unsigned nb = ls_blocks_for(warps, LS_LIN_WARPS);
    if (in == 2048)
        ls_launch(ls_linear_row1_kernel<8>, nb, LS_LIN_WARPS * LS_WARP, 0, stream, (const uint16_t *)w, out,
                  x, y, act_bf16);
    else
        ls_launch(ls_linear_row1_kernel<16>, nb, LS_LIN_WARPS * LS_WARP, 0, stream, (const uint16_t *)w, out,
                  x, y, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_linear_row1_kernel", err);
    return LS_OK;
}

static const char *const ls_lin_plan_names[] = {"warp rows (1, 4 or 8 tokens)",
                                                "tiles (16 rows x 8 tokens)",
                                                "one token, whole rows in flight"};

extern "C" int ls_cuda_linear_plan_count(void)
{
    return (int)(sizeof ls_lin_plan_names / sizeof ls_lin_plan_names[0]);
}

extern "C" const char *ls_cuda_linear_plan_name(int plan)
{
    return plan >= 0 && plan < ls_cuda_linear_plan_count() ? ls_lin_plan_names[plan] : "?";
}

extern "C" ls_status ls_cuda_linear_plan(const void *w, int wtype, long out, long in, const float *x,
                                         float *y, long T, int act_bf16, int order, int plan,
                                         void *stream, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "linear");
    LS_REQUIRE_WTYPE(wtype, err, "linear");
    LS_CUDA_REQUIRE(out >= 0 && in >= 0 && T >= 0, err, "cuda portable linear: bad shape [%ld, %ld] x T %ld", out, in, T);
    LS_CUDA_REQUIRE(plan < ls_cuda_linear_plan_count(), err, "cuda portable linear: no plan %d", plan);
    if (plan < 0) plan = T >= LS_LT_MIN_T ? 1 : 2;
    if (T == 0 || out == 0) return LS_OK;
    int done = 0;
    if (plan == 2) LS_TRY(linear_row1(w, wtype, out, in, x, y, T, act_bf16, (cudaStream_t)stream, &done, err));
    if (done) return LS_OK;
    if (plan != 1) return linear_any(w, NULL, wtype, out, in, x, NULL, y, T, act_bf16, stream, err);
    return linear_tiles(w, wtype, out, in, x, y, T, act_bf16, (cudaStream_t)stream, err);
}

extern "C" ls_status ls_cuda_linear(const void *w, int wtype, long out, long in, const float *x,
                                    float *y, long T, int act_bf16, int order, void *stream,
                                    ls_error *err)
{
    return ls_cuda_linear_plan(w, wtype, out, in, x, y, T, act_bf16, order, -1, stream, err);
}

extern "C" ls_status ls_cuda_linear_f8(const uint8_t *w, const float *scale, int wtype, long out,
                                       long in, const float *x, const float *xsc, float *y, long T,
                                       int act_bf16, int order, void *stream, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "linear (fp8)");
    LS_CUDA_REQUIRE(wtype == LS_WTYPE_F8_DEQUANT_ID || (wtype == LS_WTYPE_F8_W8A8_ID && xsc), err,
                    "cuda portable linear (fp8): weight type %d%s", wtype,
                    wtype == LS_WTYPE_F8_W8A8_ID ? " without the activations' group scales" : "");
    LS_CUDA_REQUIRE(scale && out >= 0 && in >= 0 && T >= 0, err,
                    "cuda portable linear (fp8): bad shape [%ld, %ld] x T %ld or no scales", out,
                    in, T);
    return linear_any(w, scale, wtype, out, in, x, xsc, y, T, act_bf16, stream, err);
}

/* ---- FP8 activation quantiser -------------------------------------------------- */

/* One thread per (row, 128-group): ls_fp8_quant_group itself (numerics/fp8.h),
 * the CPU's function on the same elements, so the same bits by construction.
 * Rows of n at stride x_stride (input) and n (q); s [R, ceil(n/128)]. */
__global__ void ls_fp8_quant_kernel(const float *x, long R, long n, long x_stride, float *q,
                                    float *s)
{
    ls_pdl_entry();
    long nb = LS_FP8_BLOCKS(n);
    long g = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= R * nb) return;
    long r = g / nb, b = g % nb;
    long k0 = b * LS_FP8_BLOCK;
    long len = n - k0 < LS_FP8_BLOCK ? n - k0 : LS_FP8_BLOCK;
    s[g] = ls_fp8_quant_group(x + r * x_stride + k0, len, q + r * n + k0);
}

extern "C" ls_status ls_cuda_fp8_quant_act(const float *x, long T, long n, float *q, float *s,
                                           void *stream, ls_error *err)
{
    LS_CUDA_REQUIRE(n > 0 && T >= 0, err, "cuda fp8 quantiser: bad shape [%ld, %ld]", T, n);
    if (T == 0) return LS_OK;
    long groups = T * LS_FP8_BLOCKS(n);
    ls_launch(ls_fp8_quant_kernel, ls_blocks_for(groups, 128), 128, 0, (cudaStream_t)stream, x, T, n, n, q, s);
    LS_CUDA_CHECK_LAUNCH("ls_fp8_quant_kernel", err);
    return LS_OK;
}

/* ---- norms -------------------------------------------------------------------- */

#define LS_ROW_WARPS 4 /* rows per block, one warp each */

/* r = rsqrt(DOT32(x,x)/n + 1e-6f), all lanes. */
__device__ __forceinline__ float ls_rms_factor(const float *x, long n)
{
    float ss = ls_warp_dot(x, x, n);
    float ms = ss / (float)n;
    return ls_rsqrtf(ms + 1e-6f);
}

__global__ void ls_rmsnorm_kernel(const float *x, const float *w, float *y, long R, long n, int act)
{
    ls_pdl_entry();
    long r = (long)blockIdx.x * LS_ROW_WARPS + (threadIdx.x >> 5);
    int lane = (int)(threadIdx.x & 31u);
    if (r >= R) return;
    const float *xr = x + r * n; /* [n] */
    float *yr = y + r * n;       /* [n] */
    float f = ls_rms_factor(xr, n);
    const float *in[2] = {xr, w};
    ls_batched_map<2>(in, lane, LS_WARP, n, [&](long i, const float *v) {
        float onew = 1.0f + v[1];
        float xn = v[0] * f;
        yr[i] = ls_act_d(xn * onew, act);
    });
}

__global__ void ls_gated_rmsnorm_kernel(const float *x, const float *z, const float *w, float *y,
                                        long R, long n, int act)
{
    ls_pdl_entry();
    long r = (long)blockIdx.x * LS_ROW_WARPS + (threadIdx.x >> 5);
    int lane = (int)(threadIdx.x & 31u);
    if (r >= R) return;
    const float *xr = x + r * n, *zr = z + r * n; /* [n] */
    float *yr = y + r * n;                         /* [n] */
    float f = ls_rms_factor(xr, n);
    const float *in[3] = {xr, zr, w};
    ls_batched_map<3>(in, lane, LS_WARP, n, [&](long i, const float *v) {
        float nn = ls_act_d(v[0] * f, act);
        float p = ls_act_d(v[2] * nn, act);
        yr[i] = ls_act_d(p * ls_siluf(v[1]), act);
    });
}

__global__ void ls_l2norm_scale_kernel(float *x, long R, long d, float scale)
{
    ls_pdl_entry();
    long r = (long)blockIdx.x * LS_ROW_WARPS + (threadIdx.x >> 5);
    int lane = (int)(threadIdx.x & 31u);
    if (r >= R) return;
    float *xr = x + r * d; /* [d] */
    float f = ls_rsqrtf(ls_warp_dot(xr, xr, d) + 1e-6f);
    const float *in[1] = {xr};
    ls_batched_map<1>(in, lane, LS_WARP, d, [&](long i, const float *v) {
        float xn = v[0] * f;
        xr[i] = xn * scale;
    });
}

/* The same for rows of LS_NORM_ROW_MIN .. LS_NORM_ROW_MAX, a block per row:
 * the whole block copies the row into shared memory (every load in flight
 * at once, where one warp would wait for LS_PF loads at a time), warp 0 forms
 * the factor from that copy in ls_rms_factor's order, and the block writes
 * the outputs. The row is read before any output is written (y may be x). */
#define LS_NORM_ROW_THREADS 256
#define LS_NORM_ROW_MIN 1024
#define LS_NORM_ROW_MAX 8192 /* floats of the shared copy: 32 KiB */

/* The block's second half: the factor of the row xs (shared, [n]), then
 * yr = act(xs · f · (1 + w)). */
__device__ __forceinline__ void ls_rmsnorm_row_out(const float *xs, const float *w, float *yr, long n,
                                                   int act)
{
    __shared__ float fsh;
    int tid = (int)threadIdx.x;
    __syncthreads();
    if (tid < LS_WARP) {
        float f = ls_rms_factor(xs, n);
        if (tid == 0) fsh = f;
    }
    __syncthreads();
    float f = fsh;
    const float *in[1] = {w};
    ls_batched_map<1>(in, tid, LS_NORM_ROW_THREADS, n, [&](long i, const float *v) {
        float onew = 1.0f + v[0];
        float xn = xs[i] * f;
        yr[i] = ls_act_d(xn * onew, act);
    });
}

__global__ void __launch_bounds__(LS_NORM_ROW_THREADS)
ls_rmsnorm_row_kernel(const float *x, const float *w, float *y, long n, int act)
{
    ls_pdl_entry();
    extern __shared__ float xs[]; /* [n] */
    const float *xr = x + (long)blockIdx.x * n; /* [n] */
#pragma unroll 8
    for (long i = threadIdx.x; i < n; i += LS_NORM_ROW_THREADS) xs[i] = xr[i];
    ls_rmsnorm_row_out(xs, w, y + (long)blockIdx.x * n, n, act);
}

/* The residual add fused in: the block adds its row (out = act(h + a), as
 * ls_residual_kernel) while it copies it, then normalises the copy. */
__global__ void __launch_bounds__(LS_NORM_ROW_THREADS)
ls_residual_rmsnorm_row_kernel(const float *h, const float *a, float *out, const float *w, float *y, long n,
                               int act)
{
    ls_pdl_entry();
    extern __shared__ float xs[]; /* [n] */
    long r = (long)blockIdx.x * n;
    const float *in[2] = {h + r, a + r};
    ls_batched_map<2>(in, threadIdx.x, LS_NORM_ROW_THREADS, n, [&](long i, const float *v) {
        float s = ls_act_d(v[0] + v[1], act);
        out[r + i] = s;
        xs[i] = s;
    });
    ls_rmsnorm_row_out(xs, w, y + (long)blockIdx.x * n, n, act);
}

extern "C" ls_status ls_cuda_rmsnorm(const float *x, const float *w, float *y, long R, long n,
                                     int act_bf16, int order, void *stream, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "rmsnorm");
    LS_CUDA_REQUIRE(n > 0 && R >= 0, err, "cuda portable rmsnorm: bad shape [%ld, %ld]", R, n);
    if (R == 0) return LS_OK;
    if (n >= LS_NORM_ROW_MIN && n <= LS_NORM_ROW_MAX && R <= 0x7fffffffL) {
        ls_launch(ls_rmsnorm_row_kernel, (unsigned)R, LS_NORM_ROW_THREADS, (size_t)n * sizeof(float),
                  (cudaStream_t)stream, x, w, y, n, act_bf16);
        LS_CUDA_CHECK_LAUNCH("ls_rmsnorm_row_kernel", err);
        return LS_OK;
    }
    ls_launch(ls_rmsnorm_kernel, ls_blocks_for(R, LS_ROW_WARPS), LS_ROW_WARPS * LS_WARP, 0,
              (cudaStream_t)stream, x, w, y, R, n, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_rmsnorm_kernel", err);
    return LS_OK;
}

extern "C" ls_status ls_cuda_gated_rmsnorm(const float *x, const float *z, const float *w, float *y,
                                           long R, long n, int act_bf16, int order, void *stream,
                                           ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "gated_rmsnorm");
    LS_CUDA_REQUIRE(n > 0 && R >= 0, err, "cuda portable gated_rmsnorm: bad shape [%ld, %ld]", R, n);
    if (R == 0) return LS_OK;
    ls_launch(ls_gated_rmsnorm_kernel, ls_blocks_for(R, LS_ROW_WARPS), LS_ROW_WARPS * LS_WARP, 0,
              (cudaStream_t)stream, x, z, w, y, R, n, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_gated_rmsnorm_kernel", err);
    return LS_OK;
}

extern "C" ls_status ls_cuda_l2norm_scale(float *x, long R, long d, float scale, int order,
                                          void *stream, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "l2norm_scale");
    LS_CUDA_REQUIRE(d > 0 && R >= 0, err, "cuda portable l2norm_scale: bad shape [%ld, %ld]", R, d);
    if (R == 0) return LS_OK;
    ls_launch(ls_l2norm_scale_kernel, ls_blocks_for(R, LS_ROW_WARPS), LS_ROW_WARPS * LS_WARP, 0,
              (cudaStream_t)stream, x, R, d, scale);
    LS_CUDA_CHECK_LAUNCH("ls_l2norm_scale_kernel", err);
    return LS_OK;
}

/* ---- elementwise -------------------------------------------------------------- */

__global__ void ls_gdn_gates_kernel(const float *b, const float *a, const float *A_log,
                                    const float *dt_bias, float *beta, float *alpha, long T, long H,
                                    int act)
{
    ls_pdl_entry();
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= T * H) return;
    long h = e % H;
    beta[e] = ls_act_d(ls_sigmoidf(b[e]), act);
    float sp = ls_softplusf(a[e] + dt_bias[h]);
    float g = -ls_expf(A_log[h]) * sp;
    alpha[e] = ls_expf(g);
}

extern "C" ls_status ls_cuda_gdn_gates(const float *b, const float *a, const float *A_log,
                                       const float *dt_bias, float *beta, float *alpha, long T,
                                       long H, int act_bf16, void *stream, ls_error *err)
{
    if (T <= 0 || H <= 0) return LS_OK;
    ls_launch(ls_gdn_gates_kernel, ls_blocks_for(T * H, 256), 256, 0, (cudaStream_t)stream, b, a, A_log,
              dt_bias, beta, alpha, T, H, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_gdn_gates_kernel", err);
    return LS_OK;
}

__global__ void ls_sigmoid_gate_kernel(float *o, const float *gate, long n, int act)
{
    ls_pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = ls_act_d(ls_sigmoidf(gate[i]), act);
    o[i] = ls_act_d(o[i] * g, act);
}

extern "C" ls_status ls_cuda_sigmoid_gate(float *o, const float *gate, long n, int act_bf16,
                                          void *stream, ls_error *err)
{
    if (n <= 0) return LS_OK;
    ls_launch(ls_sigmoid_gate_kernel, ls_blocks_for(n, 256), 256, 0, (cudaStream_t)stream, o, gate, n,
              act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_sigmoid_gate_kernel", err);
    return LS_OK;
}

__global__ void ls_residual_kernel(float *out, const float *h, const float *a, long n, int act)
{
    ls_pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = ls_act_d(h[i] + a[i], act);
}

extern "C" ls_status ls_cuda_residual(float *out, const float *h, const float *a, long n, int act_bf16,
                                      void *stream, ls_error *err)
{
    if (n <= 0) return LS_OK;
    ls_launch(ls_residual_kernel, ls_blocks_for(n, 256), 256, 0, (cudaStream_t)stream, out, h, a, n, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_residual_kernel", err);
    return LS_OK;
}

extern "C" ls_status ls_cuda_residual_rmsnorm(const float *h, const float *a, float *out, const float *w,
                                              float *y, long R, long n, int act_bf16, int order, void *stream,
                                              ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "residual_rmsnorm");
    LS_CUDA_REQUIRE(n > 0 && R >= 0 && y != h && y != out, err,
                    "cuda portable residual_rmsnorm: bad shape [%ld, %ld], or y is h or out", R, n);
    if (R == 0) return LS_OK;
    if (n < LS_NORM_ROW_MIN || n > LS_NORM_ROW_MAX || R > 0x7fffffffL) {
        LS_TRY(ls_cuda_residual(out, h, a, R * n, act_bf16, stream, err));
        return ls_cuda_rmsnorm(out, w, y, R, n, act_bf16, order, stream, err);
    }
    ls_launch(ls_residual_rmsnorm_row_kernel, (unsigned)R, LS_NORM_ROW_THREADS, (size_t)n * sizeof(float),
              (cudaStream_t)stream, h, a, out, w, y, n, act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_residual_rmsnorm_row_kernel", err);
    return LS_OK;
}

/* ---- the tensor-core tier's linear: bf16 operands in, act on the fp32 out --------
 * (docs/tensor-core-tier.md §2.2). The GEMM itself is cuBLASLt's pinned
 * algorithm (kernels/tc/gemm_pin.h); these are its two elementwise ends. */

__global__ void ls_tc_to_bf16_kernel(const float *x, uint16_t *xb, long n)
{
    ls_pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) xb[i] = ls_f32_to_bf16(x[i]);
}

/* y[t, :n] = act(src[t, :n]) with src rows ld apart (ld >= n: a padded GEMM
 * output); in place when src == y and ld == n. */
__global__ void ls_tc_out_kernel(const float *src, long ld, float *y, long T, long n, int act)
{
    ls_pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * n) return;
    long t = i / n, c = i - t * n;
    y[i] = ls_act_d(src[t * ld + c], act);
}

extern "C" ls_status ls_cuda_tc_to_bf16(const float *x, uint16_t *xb, long n, void *stream, ls_error *err)
{
    if (n <= 0) return LS_OK;
    ls_launch(ls_tc_to_bf16_kernel, ls_blocks_for(n, 256), 256, 0, (cudaStream_t)stream, x, xb, n);
    LS_CUDA_CHECK_LAUNCH("ls_tc_to_bf16_kernel", err);
    return LS_OK;
}

extern "C" ls_status ls_cuda_tc_out(const float *src, long ld, float *y, long T, long n, int act_bf16,
                                    void *stream, ls_error *err)
{
    if (T <= 0 || n <= 0 || (src == y && ld == n && !act_bf16)) return LS_OK;
    ls_launch(ls_tc_out_kernel, ls_blocks_for(T * n, 256), 256, 0, (cudaStream_t)stream, src, ld, y, T, n,
              act_bf16);
    LS_CUDA_CHECK_LAUNCH("ls_tc_out_kernel", err);
    return LS_OK;
}

/* ---- causal conv + SiLU ------------------------------------------------------- */

/* One thread per channel; the K-entry window lives in registers (indices are
 * compile-time after unrolling to LS_CUDA_CONV_MAX_K with guards). */

/* Sequence blockIdx.y: its rows of x and y, its own state. */
__global__ void ls_conv_silu_kernel(const float *x0, long x_stride, const void *w, int wtype,
                                    ls_cuda_seqs sq, float *y0, long y_stride, long C, long K,
                                    int act)
{
    ls_pdl_entry();
    long c = (long)blockIdx.x * blockDim.x + threadIdx.x;
    int sidx = (int)blockIdx.y;
    long T = sq.len[sidx];
    if (c >= C || T <= 0) return;
    float *state = sq.state[sidx];
    const float *x = x0 + sq.row0[sidx] * x_stride;
    float *y = y0 + sq.row0[sidx] * y_stride;
    const uint8_t *wr = (const uint8_t *)w + (size_t)c * K * ls_welem_bytes(wtype);
    float st[LS_CUDA_CONV_MAX_K], wv[LS_CUDA_CONV_MAX_K];
#pragma unroll
    for (int j = 0; j < LS_CUDA_CONV_MAX_K; j++) {
        st[j] = j < K ? state[c * K + j] : 0.0f;
        wv[j] = j < K ? ls_wload(wr, wtype, j) : 0.0f;
    }
    for (long t = 0; t < T; t++) {
        float xt = x[t * x_stride + c];
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < LS_CUDA_CONV_MAX_K; j++) {
            if (j < K) {
                float win = (j == K - 1) ? xt : st[j < LS_CUDA_CONV_MAX_K - 1 ? j + 1 : j];
                float prod = wv[j] * win;
                s = s + prod;
            }
        }
#pragma unroll
        for (int j = 0; j < LS_CUDA_CONV_MAX_K - 1; j++)
            if (j + 1 < K) st[j] = st[j + 1];
#pragma unroll
        for (int j = 0; j < LS_CUDA_CONV_MAX_K; j++)
            if (j == K - 1) st[j] = xt;
        y[t * y_stride + c] = ls_act_d(ls_siluf(ls_act_d(s, act)), act);
    }
#pragma unroll
    for (int j = 0; j < LS_CUDA_CONV_MAX_K; j++)
        if (j < K) state[c * K + j] = st[j];
}

extern "C" ls_status ls_cuda_conv_silu_batch(const float *x, long x_stride, const void *w,
                                             int wtype, float *const *states, const long *row0,
                                             const long *len, long nseq, float *y, long y_stride,
                                             long C, long K, int act_bf16, int order,
                                             void *stream, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "conv_silu");
    LS_REQUIRE_WTYPE(wtype, err, "conv_silu");
    LS_CUDA_REQUIRE(K >= 1 && K <= LS_CUDA_CONV_MAX_K, err,
                    "cuda portable conv_silu: kernel size K %ld not in 1..%d (channels %ld)", K,
                    LS_CUDA_CONV_MAX_K, C);
    if (C <= 0) return LS_OK;
    for (long s0 = 0; s0 < nseq; s0 += LS_CUDA_SEQ_CHUNK) {
        long n = nseq - s0 < LS_CUDA_SEQ_CHUNK ? nseq - s0 : LS_CUDA_SEQ_CHUNK;
        ls_cuda_seqs sq;
        if (ls_cuda_seqs_fill(&sq, states, row0, len, s0, n) <= 0) continue;
        dim3 grid(ls_blocks_for(C, 128), (unsigned)n);
        ls_launch(ls_conv_silu_kernel, grid, 128, 0, (cudaStream_t)stream, x, x_stride, w, wtype, sq, y,
                  y_stride, C, K, act_bf16);
        LS_CUDA_CHECK_LAUNCH("ls_conv_silu_kernel", err);
    }
    return LS_OK;
}

extern "C" ls_status ls_cuda_conv_silu(const float *x, long x_stride, const void *w, int wtype,
                                       float *state, float *y, long y_stride, long T, long C,
                                       long K, int act_bf16, int order, void *stream,
                                       ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "conv_silu");
    LS_REQUIRE_WTYPE(wtype, err, "conv_silu");
    LS_CUDA_REQUIRE(K >= 1 && K <= LS_CUDA_CONV_MAX_K, err,
                    "cuda portable conv_silu: kernel size K %ld not in 1..%d (channels %ld)", K,
                    LS_CUDA_CONV_MAX_K, C);
    if (T <= 0 || C <= 0) return LS_OK;
    long row0 = 0;
    return ls_cuda_conv_silu_batch(x, x_stride, w, wtype, &state, &row0, &T, 1, y, y_stride, C, K,
                                   act_bf16, order, stream, err);
}

/* ---- logprobs ----------------------------------------------------------------- */

/* The exact maximum is order-free: each thread's first maximum over its
 * elements, combined by (value, first index). The sum keeps the canonical
 * SUM32 order: in a block of LS_LP_THREADS, warps 1.. write exp(l − m) (or
 * values already exponentiated) of a tile of LS_LP_TILE elements into one
 * half of a shared buffer while warp 0 adds the previous tile's elements
 * v ≡ lane (mod 32) from the other half in ascending v (tiles in order, so
 * each lane's partial runs over all its v ascending), and the butterfly.
 * lp = l − (m + log(sum)).
 *
 * In place (lp = logits) one block per row does it all (ls_logprobs_kernel:
 * every element is read before any is written by the same thread). Else the
 * row spreads over the GPU in four launches: chunk maxima, exp into lp, the
 * sum by one block per row, then lp = l − lse. */
#define LS_LP_THREADS 1024
#define LS_LP_TILE 4096 /* elements of a tile: two in shared memory */
#define LS_LP_PER ((LS_LP_TILE + LS_LP_THREADS - LS_WARP - 1) / (LS_LP_THREADS - LS_WARP))
#define LS_LPX_THREADS 256     /* the chunked launches' blocks */

/* The block's first maximum of its threads' (m, mi); every thread gets it. */
__device__ __forceinline__ void ls_block_max_first(float *m, long *mi)
{
    __shared__ float wv[LS_WARP];
    __shared__ long wi[LS_WARP];
    int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u), nw = (int)(blockDim.x >> 5);
    ls_warp_best_first(m, mi);
    if (lane == 0) wv[warp] = *m, wi[warp] = *mi;
    __syncthreads();
    if (warp == 0) {
        *m = lane < nw ? wv[lane] : -INFINITY;
        *mi = lane < nw ? wi[lane] : -1;
        ls_warp_best_first(m, mi);
        if (lane == 0) wv[0] = *m, wi[0] = *mi;
    }
    __syncthreads();
    *m = wv[0], *mi = wi[0];
    __syncthreads();
}

/* Warp 0's lane partials of SUM32 over f(x[v]), v < V, through tiles in tile
 * [2][LS_LP_TILE] (a block of LS_LP_THREADS); 0 in the other warps. Each
 * thread of warps 1.. holds LS_LP_PER elements of the next tile but one in
 * registers: while warp 0 adds tile i, it writes tile i + 1 (loaded an
 * iteration ago) and loads tile i + 2. */
template <typename F>
__device__ __forceinline__ float ls_lp_tiled_sum(const float *x, long V, float *tile, F f)
{
    int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int st = tid - LS_WARP; /* staging thread, warps 1.. */
    const int nst = LS_LP_THREADS - LS_WARP;
    long nt = (V + LS_LP_TILE - 1) / LS_LP_TILE;
    float r[LS_LP_PER];
    auto load = [&](long i) {
#pragma unroll
        for (int u = 0; u < LS_LP_PER; u++) {
            long j = st + (long)u * nst, v = i * LS_LP_TILE + j;
            r[u] = j < LS_LP_TILE && v < V ? x[v] : 0.0f;
        }
    };
    auto put = [&](long i) {
        float *b = tile + (i & 1) * LS_LP_TILE;
#pragma unroll
        for (int u = 0; u < LS_LP_PER; u++) {
            long j = st + (long)u * nst;
            if (j < LS_LP_TILE && i * LS_LP_TILE + j < V) b[j] = f(r[u]);
        }
    };
    if (warp > 0) {
        load(0);
        put(0);
        if (nt > 1) load(1);
    }
    __syncthreads();
    float p = 0.0f;
    for (long i = 0; i < nt; i++) {
        if (warp > 0) {
            if (i + 1 < nt) put(i + 1);
            if (i + 2 < nt) load(i + 2);
        } else {
            long n = V - i * LS_LP_TILE < LS_LP_TILE ? V - i * LS_LP_TILE : LS_LP_TILE;
            const float *b = tile + (i & 1) * LS_LP_TILE;
            if (n == LS_LP_TILE) {
                /* a whole tile: no bounds, each group's loads issued a group ahead of its adds */
                constexpr int G = 16, NG = LS_LP_TILE / LS_WARP / G;
                float e[G], nx[G];
#pragma unroll
                for (int u = 0; u < G; u++) e[u] = b[u * LS_WARP + lane];
#pragma unroll
                for (int g = 0; g < NG; g++) {
                    if (g + 1 < NG)
#pragma unroll
                        for (int u = 0; u < G; u++) nx[u] = b[((g + 1) * G + u) * LS_WARP + lane];
#pragma unroll
                    for (int u = 0; u < G; u++) p = p + e[u];
#pragma unroll
                    for (int u = 0; u < G; u++) e[u] = nx[u];
                }
            } else {
                for (long i0 = lane; i0 < n; i0 += LS_WARP * LS_PF) {
                    float e[LS_PF];
#pragma unroll
                    for (int u = 0; u < LS_PF; u++) e[u] = i0 + u * LS_WARP < n ? b[i0 + u * LS_WARP] : 0.0f;
#pragma unroll
                    for (int u = 0; u < LS_PF; u++)
                        if (i0 + u * LS_WARP < n) p = p + e[u];
                }
            }
        }
        __syncthreads();
    }
    return p;
}

/* A thread's first maximum over x[v], v = first, first + stride, ... < end. */
__device__ __forceinline__ void ls_lp_thread_max(const float *x, long first, long stride, long end, float *m,
                                                 long *mi)
{
    *m = -INFINITY, *mi = -1;
    const float *in[1] = {x};
    ls_batched_map<1>(in, first, stride, end, [&](long v, const float *p) {
        if (p[0] > *m) *m = p[0], *mi = v;
    });
}

__global__ void __launch_bounds__(LS_LP_THREADS)
ls_logprobs_kernel(const float *logits, float *lp, long V)
{
    ls_pdl_entry();
    __shared__ float tile[2 * LS_LP_TILE];
    __shared__ float s_lse;
    int tid = (int)threadIdx.x;
    const float *l = logits + (long)blockIdx.x * V; /* [V] */
    float *o = lp + (long)blockIdx.x * V;           /* [V] */
    float m;
    long mi;
    ls_lp_thread_max(l, tid, LS_LP_THREADS, V, &m, &mi);
    ls_block_max_first(&m, &mi);
    float p = ls_lp_tiled_sum(l, V, tile, [&](float x) { return ls_expf(x - m); });
    if (tid < LS_WARP) {
        float sum = ls_warp_tree(p);
        if (tid == 0) s_lse = m + ls_logf(sum);
    }
    __syncthreads();
    float lse = s_lse;
    const float *in[1] = {l};
    ls_batched_map<1>(in, tid, LS_LP_THREADS, V, [&](long v, const float *x) { o[v] = x[0] - lse; });
}

/* Scratch of the chunked launches: per (row, chunk) the chunk's first
 * maximum; per row its maximum and lse. */
typedef struct ls_lp_parts {
    float *mv;                 /* [R, NC] */
    long *mi;                  /* [R, NC] */
    float *m, *lse;            /* [R] */
} ls_lp_parts;

/* grid (R, NC): chunk c of row r. */
__global__ void __launch_bounds__(LS_LPX_THREADS)
ls_lp_max_kernel(const float *logits, long V, long chunk, ls_lp_parts pt)
{
    ls_pdl_entry();
    long r = blockIdx.x, c = blockIdx.y, v0 = c * chunk, v1 = v0 + chunk < V ? v0 + chunk : V;
    float m;
    long mi;
    ls_lp_thread_max(logits + r * V, v0 + (long)threadIdx.x, LS_LPX_THREADS, v1, &m, &mi);
    ls_block_max_first(&m, &mi);
    if (threadIdx.x == 0) pt.mv[r * gridDim.y + c] = m, pt.mi[r * gridDim.y + c] = mi;
}

/* grid (R, NC): the row's maximum from its chunks' (every block alike), then
 * exp(l − m) of chunk c into lp. */
__global__ void __launch_bounds__(LS_LPX_THREADS)
ls_lp_exp_kernel(const float *logits, float *lp, long V, long chunk, ls_lp_parts pt)
{
    ls_pdl_entry();
    long r = blockIdx.x, c = blockIdx.y, nc = gridDim.y, v0 = c * chunk, v1 = v0 + chunk < V ? v0 + chunk : V;
    float m = -INFINITY;
    long mi = -1;
    for (long j = threadIdx.x; j < nc; j += LS_LPX_THREADS) {
        float v = pt.mv[r * nc + j];
        long i = pt.mi[r * nc + j];
        if (ls_rank_lead(v, i, m, mi)) m = v, mi = i;
    }
    ls_block_max_first(&m, &mi);
    if (c == 0 && threadIdx.x == 0) pt.m[r] = m;
    const float *in[1] = {logits + r * V};
    float *o = lp + r * V;
    ls_batched_map<1>(in, v0 + (long)threadIdx.x, LS_LPX_THREADS, v1,
                      [&](long v, const float *x) { o[v] = ls_expf(x[0] - m); });
}

/* One block per row: lse = m + log(SUM32(lp)), lp holding the exps. */
__global__ void __launch_bounds__(LS_LP_THREADS) ls_lp_sum_kernel(const float *lp, long V, ls_lp_parts pt)
{
    ls_pdl_entry();
    __shared__ float tile[2 * LS_LP_TILE];
    long r = blockIdx.x;
    float p = ls_lp_tiled_sum(lp + r * V, V, tile, [](float x) { return x; });
    if (threadIdx.x < LS_WARP) {
        float sum = ls_warp_tree(p);
        if (threadIdx.x == 0) pt.lse[r] = pt.m[r] + ls_logf(sum);
    }
}

/* grid (R, NC): lp = l − lse over chunk c. */
__global__ void __launch_bounds__(LS_LPX_THREADS)
ls_lp_sub_kernel(const float *logits, float *lp, long V, long chunk, ls_lp_parts pt)
{
    ls_pdl_entry();
    long r = blockIdx.x, c = blockIdx.y, v0 = c * chunk, v1 = v0 + chunk < V ? v0 + chunk : V;
    float lse = pt.lse[r];
    const float *in[1] = {logits + r * V};
    float *o = lp + r * V;
    ls_batched_map<1>(in, v0 + (long)threadIdx.x, LS_LPX_THREADS, v1,
                      [&](long v, const float *x) { o[v] = x[0] - lse; });
}

/* Elements of a row per block of a chunked launch over rows of V: at least
 * LS_ROW_CHUNK_MIN, and at most max_chunks chunks. */
#define LS_ROW_CHUNK_MIN 4096

static long ls_row_chunk(long V, long max_chunks)
{
    long c = (V + max_chunks - 1) / max_chunks;
    return c > LS_ROW_CHUNK_MIN ? c : LS_ROW_CHUNK_MIN;
}

#define LS_LP_CHUNKS_MAX 65535 /* a grid's y extent */

extern "C" size_t ls_cuda_logprobs_scratch_bytes(long R, long V)
{
    if (R <= 0 || V <= 0) return 0;
    long chunk = ls_row_chunk(V, LS_LP_CHUNKS_MAX), nc = (V + chunk - 1) / chunk;
    return (size_t)R * ((size_t)nc * (sizeof(float) + sizeof(long)) + 2 * sizeof(float)) + 64;
}

extern "C" ls_status ls_cuda_logprobs(const float *logits, float *lp, long R, long V, int order,
                                      void *scratch, void *stream, ls_error *err)
{
    LS_REQUIRE_CANONICAL(order, err, "logprobs");
    LS_CUDA_REQUIRE(V > 0 && R >= 0 && R <= 0x7fffffffL, err,
                    "cuda portable logprobs: bad shape [%ld, %ld]", R, V);
    if (R == 0) return LS_OK;
    cudaStream_t s = (cudaStream_t)stream;
    if (lp == logits || !scratch) {
        ls_launch(ls_logprobs_kernel, (unsigned)R, LS_LP_THREADS, 0, s, logits, lp, V);
        LS_CUDA_CHECK_LAUNCH("ls_logprobs_kernel", err);
        return LS_OK;
    }
    long chunk = ls_row_chunk(V, LS_LP_CHUNKS_MAX), nc = (V + chunk - 1) / chunk;
    size_t cells = (size_t)R * (size_t)nc;
    ls_lp_parts pt;
    pt.mi = (long *)scratch; /* the 8-byte part first: aligned as the scratch is */
    pt.mv = (float *)(pt.mi + cells);
    pt.m = pt.mv + cells;
    pt.lse = pt.m + R;
    dim3 grid((unsigned)R, (unsigned)nc);
    ls_launch(ls_lp_max_kernel, grid, LS_LPX_THREADS, 0, s, logits, V, chunk, pt);
    LS_CUDA_CHECK_LAUNCH("ls_lp_max_kernel", err);
    ls_launch(ls_lp_exp_kernel, grid, LS_LPX_THREADS, 0, s, logits, lp, V, chunk, pt);
    LS_CUDA_CHECK_LAUNCH("ls_lp_exp_kernel", err);
    ls_launch(ls_lp_sum_kernel, (unsigned)R, LS_LP_THREADS, 0, s, lp, V, pt);
    LS_CUDA_CHECK_LAUNCH("ls_lp_sum_kernel", err);
    ls_launch(ls_lp_sub_kernel, grid, LS_LPX_THREADS, 0, s, logits, lp, V, chunk, pt);
    LS_CUDA_CHECK_LAUNCH("ls_lp_sub_kernel", err);
    return LS_OK;
}

/* ---- logprob summary ------------------------------------------------------------ */

/* ls_cpu_lp_summary in two launches, so that one row spreads over the GPU.
 * Each block of ls_lp_summary_part_kernel takes a chunk of a row: each thread
 * keeps, in registers, the first LS_LP_SUMMARY_KMAX of its elements in the
 * order "value descending, index ascending", and the block the first of
 * their union, one at a time. ls_lp_summary_merge_kernel (a warp per row)
 * then takes the first k of the chunks' lists the same way. On a row without
 * NaN that order is total (−0 and +0 tie, to the lower index, as in the CPU
 * scan), so the picks are ls_cpu_topk's; a row with a NaN gets the sentinels
 * and its flag. */
#define LS_LPS_THREADS 256
#define LS_LPS_WARPS (LS_LPS_THREADS / LS_WARP)
#define LS_LPS_CHUNKS_MAX 128  /* chunks of a row, at most (4 per lane of the merge) */

/* Scratch: per (row, chunk) K values, K indices (−1: none) and a NaN flag. */
typedef struct ls_lps_parts {
    float *val;                /* [R, NC, K] */
    int32_t *idx;              /* [R, NC, K] */
    int32_t *nan;              /* [R, NC] */
} ls_lps_parts;

__global__ void __launch_bounds__(LS_LPS_THREADS)
ls_lp_summary_part_kernel(const float *lp, long V, long chunk, ls_lps_parts pt)
{
    ls_pdl_entry();
    constexpr int K = LS_LP_SUMMARY_KMAX;
    __shared__ float wv[LS_LPS_WARPS];
    __shared__ long wi[LS_LPS_WARPS];
    __shared__ long s_pick;
    int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    long r = blockIdx.x, c = blockIdx.y, nc = gridDim.y;
    long v0 = c * chunk, v1 = v0 + chunk < V ? v0 + chunk : V;
    float bv[K];
    long bi[K];
#pragma unroll
    for (int j = 0; j < K; j++) bv[j] = -INFINITY, bi[j] = -1;
    int nan = 0;
    const float *in[1] = {lp + r * V};
    ls_batched_map<1>(in, v0 + tid, LS_LPS_THREADS, v1, [&](long v, const float *p) {
        float a = p[0];
        if (isnan(a)) {
            nan = 1;
            return;
        }
        if (!ls_rank_first(a, v, bv[K - 1], bi[K - 1])) return;
#pragma unroll
        for (int j = K - 1; j >= 0; j--)
            if (ls_rank_first(a, v, bv[j], bi[j])) {
                if (j + 1 < K) bv[j + 1] = bv[j], bi[j + 1] = bi[j];
                bv[j] = a, bi[j] = v;
            }
    });
    nan = __syncthreads_or(nan);
    long at = (r * nc + c) * K;
    for (int i = 0; i < K; i++) {
        float cv = bv[0];
        long ci = bi[0];
        ls_warp_best_first(&cv, &ci);
        if (lane == 0) wv[warp] = cv, wi[warp] = ci;
        __syncthreads();
        if (warp == 0) {
            cv = lane < LS_LPS_WARPS ? wv[lane] : -INFINITY;
            ci = lane < LS_LPS_WARPS ? wi[lane] : -1;
            ls_warp_best_first(&cv, &ci);
            if (lane == 0) {
                s_pick = ci;
                pt.val[at + i] = cv;
                pt.idx[at + i] = (int32_t)ci;
            }
        }
        __syncthreads();
        if (bi[0] >= 0 && bi[0] == s_pick) { /* the owner's next entry moves up */
#pragma unroll
            for (int j = 0; j + 1 < K; j++) bv[j] = bv[j + 1], bi[j] = bi[j + 1];
            bv[K - 1] = -INFINITY, bi[K - 1] = -1;
        }
    }
    if (tid == 0) pt.nan[r * nc + c] = nan;
}

/* Lane l merges the lists of chunks l, l + 32, ... (heads in registers). */
__global__ void ls_lp_summary_merge_kernel(const float *lp, const int32_t *next, long V, long nc, int k,
                                           ls_lps_parts pt, uint32_t *out)
{
    ls_pdl_entry();
    constexpr int K = LS_LP_SUMMARY_KMAX, M = LS_LPS_CHUNKS_MAX / LS_WARP;
    int lane = (int)threadIdx.x;
    long r = blockIdx.x;
    uint32_t *o = out + r * LS_LP_SUMMARY_WORDS(k); /* the row's summary */
    int head[M];
    int nan = 0;
#pragma unroll
    for (int m = 0; m < M; m++) {
        head[m] = 0;
        long c = lane + (long)m * LS_WARP;
        if (c < nc) nan |= pt.nan[r * nc + c];
    }
    nan = __any_sync(LS_FULL_MASK, nan);
    for (int i = 0; i < k; i++) {
        float cv = -INFINITY;
        long ci = -1;
#pragma unroll
        for (int m = 0; m < M; m++) {
            long c = lane + (long)m * LS_WARP;
            if (c >= nc || head[m] >= K) continue;
            long at = (r * nc + c) * K + head[m];
            long e = pt.idx[at];
            if (ls_rank_lead(pt.val[at], e, cv, ci)) cv = pt.val[at], ci = e;
        }
        ls_warp_best_first(&cv, &ci);
#pragma unroll
        for (int m = 0; m < M; m++) { /* the owner's list moves on */
            long c = lane + (long)m * LS_WARP;
            if (c < nc && head[m] < K && ci >= 0 && pt.idx[(r * nc + c) * K + head[m]] == ci) head[m]++;
        }
        if (lane == 0) {
            o[i] = nan ? 0xffffffffu : (uint32_t)ci;
            o[k + i] = nan ? 0x7fc00000u : ls_f32_bits(cv);
        }
    }
    if (lane == 0) {
        int32_t nx = next[r];
        o[2 * k] = nx >= 0 && nx < V ? ls_f32_bits(lp[r * V + nx]) : 0x7fc00000u;
        o[2 * k + 1] = (uint32_t)nan;
    }
}

extern "C" size_t ls_cuda_lp_summary_scratch_bytes(long R, long V)
{
    long chunk = ls_row_chunk(V, LS_LPS_CHUNKS_MAX), nc = V > 0 ? (V + chunk - 1) / chunk : 0;
    size_t cells = (size_t)(R > 0 ? R : 0) * (size_t)nc;
    return cells * (LS_LP_SUMMARY_KMAX * 8 + 4) + 64;
}

extern "C" ls_status ls_cuda_lp_summary(const float *lp, const int32_t *next, long R, long V, long k,
                                        uint32_t *out, void *scratch, void *stream, ls_error *err)
{
    LS_CUDA_REQUIRE(k >= 1 && k <= LS_LP_SUMMARY_KMAX && k <= V && R >= 0 && R <= 0x7fffffffL, err,
                    "cuda portable lp_summary: k %ld not in 1..min(%d, V = %ld), or %ld rows", k,
                    LS_LP_SUMMARY_KMAX, V, R);
    if (R == 0) return LS_OK;
    long chunk = ls_row_chunk(V, LS_LPS_CHUNKS_MAX), nc = (V + chunk - 1) / chunk;
    size_t cells = (size_t)R * (size_t)nc;
    ls_lps_parts pt = {(float *)scratch, (int32_t *)((float *)scratch + cells * LS_LP_SUMMARY_KMAX), NULL};
    pt.nan = pt.idx + cells * LS_LP_SUMMARY_KMAX;
    cudaStream_t s = (cudaStream_t)stream;
    ls_launch(ls_lp_summary_part_kernel, dim3((unsigned)R, (unsigned)nc), LS_LPS_THREADS, 0, s, lp, V, chunk,
              pt);
    LS_CUDA_CHECK_LAUNCH("ls_lp_summary_part_kernel", err);
    ls_launch(ls_lp_summary_merge_kernel, (unsigned)R, LS_WARP, 0, s, lp, next, V, nc, (int)k, pt, out);
    LS_CUDA_CHECK_LAUNCH("ls_lp_summary_merge_kernel", err);
    return LS_OK;
}
