/* Conformance: every portable strict CUDA kernel (kernels/ops.h) against its
 * CPU reference function (src/backend/cpu_ops.h), bit for bit, over shape
 * sweeps with the Qwen3-Next-80B dimensions (hidden 2048, GDN 16/32 heads x
 * 128, attention 16/2 x 256, expert width 512, vocab 151936) and awkward ones
 * (T = 1, 63, 65; head dims 48 and 96; K not a multiple of 32). The first
 * mismatching element is printed with both values as hex bits.
 * LS_GPU_QUICK=1 (used under compute-sanitizer) drops the largest shapes. */
#include "gpu_testutil.h"

#ifdef LOCKSTEP_HAVE_CUDA
#include <math.h>

#include "backend/cpu_ops.h"
#include "ops.h"

static ls_cuda_arena g_arena;
static int g_quick;
static uint64_t g_seed = 12345;

/* ---- helpers ------------------------------------------------------------------ */

static void *dalloc(size_t bytes)
{
    ls_error err;
    void *p = ls_cuda_arena_alloc(&g_arena, bytes ? bytes : 4, &err);
    ck_assert_msg(p != NULL, "%s", err.msg);
    return p;
}

static void *dup_dev(const void *h, size_t bytes)
{
    ls_error err;
    void *d = dalloc(bytes);
    ck_assert_msg(ls_cuda_upload(d, h, bytes, &err) == LS_OK, "%s", err.msg);
    return d;
}

static void fetch(void *h, const void *d, size_t bytes)
{
    ls_error err;
    ck_assert_msg(ls_cuda_sync(&err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_cuda_download(h, d, bytes, &err) == LS_OK, "%s", err.msg);
}

static float *rand_f32(size_t n, float scale, int bf16_exact)
{
    float *a = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        float v = ls_gpu_rand_f32(&g_seed, scale);
        a[i] = bf16_exact ? ls_round_bf16(v) : v;
    }
    return a;
}

/* Weights [rows, cols] as stored: bf16 (wtype 0) or fp32 (1). */
static void *rand_w(long rows, long cols, int wtype, float scale)
{
    size_t n = (size_t)rows * (size_t)cols;
    if (wtype == LS_WTYPE_BF16) {
        uint16_t *w = malloc(2 * (n ? n : 1));
        for (size_t i = 0; i < n; i++) w[i] = ls_f32_to_bf16(ls_gpu_rand_f32(&g_seed, scale));
        return w;
    }
    return rand_f32(n, scale, 0);
}

static size_t wbytes(long rows, long cols, int wtype)
{
    return (size_t)rows * (size_t)cols * (wtype == LS_WTYPE_BF16 ? 2 : 4);
}

static void same_f32(const char *what, const float *cpu, const float *gpu, size_t n)
{
    ck_assert_msg(ls_gpu_same_f32(what, cpu, gpu, n), "%s: GPU differs from the CPU reference", what);
}

static void reset_arena(void)
{
    g_arena.used_bytes = 0;
}

/* ---- linear / embed --------------------------------------------------------------- */

static void check_linear(long out, long in, long T, int wtype, int act)
{
    reset_arena();
    void *w = rand_w(out, in, wtype, 0.05f);
    float *x = rand_f32((size_t)T * in, 1.0f, act);
    float *want = malloc(sizeof(float) * (size_t)T * out);
    float *got = malloc(sizeof(float) * (size_t)T * out);
    ls_wmat wm = {w, (ls_wtype)wtype, out, in};
    ls_cpu_linear(&wm, x, want, T, 0, out, act, LS_ORDER_CANONICAL);
    void *dw = dup_dev(w, wbytes(out, in, wtype));
    float *dx = dup_dev(x, sizeof(float) * (size_t)T * in);
    float *dy = dalloc(sizeof(float) * (size_t)T * out);
    ls_error e_;
    ck_assert_msg(ls_cuda_linear(dw, wtype, out, in, dx, dy, T, act, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(got, dy, sizeof(float) * (size_t)T * out);
    char what[128];
    snprintf(what, sizeof what, "linear [%ld, %ld] T %ld wtype %d act %d", out, in, T, wtype, act);
    same_f32(what, want, got, (size_t)T * out);
    printf("  ok %s\n", what);
    free(w); free(x); free(want); free(got);
}

START_TEST(test_linear)
{
    long shapes[][3] = {{2048, 2048, 1}, {2048, 2048, 63}, {512, 2048, 65}, {64, 2048, 5},
                        {2048, 4096, 3}, {100, 77, 5}, {33, 1, 2}, {7, 1000, 65}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_linear(shapes[i][0], shapes[i][1], shapes[i][2], LS_WTYPE_BF16, 1);
    check_linear(300, 130, 9, LS_WTYPE_F32, 1);
    check_linear(300, 130, 9, LS_WTYPE_BF16, 0);
    if (!g_quick) {
        check_linear(12288, 2048, 4, LS_WTYPE_BF16, 1);  /* in_proj_qkvz */
        check_linear(151936, 2048, 1, LS_WTYPE_BF16, 1); /* lm_head */
        check_linear(2048, 2048, 300, LS_WTYPE_BF16, 1);
    }
}
END_TEST

START_TEST(test_embed)
{
    reset_arena();
    long V = 1000, D = 2048, T = 65;
    void *emb = rand_w(V, D, LS_WTYPE_BF16, 1.0f);
    int32_t tok[65];
    for (long t = 0; t < T; t++) tok[t] = (int32_t)((t * 7919) % V);
    float *want = malloc(sizeof(float) * T * D), *got = malloc(sizeof(float) * T * D);
    ls_wmat wm = {emb, LS_WTYPE_BF16, V, D};
    ls_cpu_embed(&wm, tok, T, want, 1);
    void *de = dup_dev(emb, wbytes(V, D, 0));
    int32_t *dt = dup_dev(tok, sizeof tok);
    float *dh = dalloc(sizeof(float) * T * D);
    ls_error e_;
    ck_assert_msg(ls_cuda_embed(de, 0, V, D, dt, T, dh, 1, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(got, dh, sizeof(float) * T * D);
    same_f32("embed", want, got, (size_t)T * D);
    free(emb); free(want); free(got);
}
END_TEST

/* ---- norms and elementwise ------------------------------------------------------- */

static void check_rmsnorm(long R, long n, int gated, int act)
{
    reset_arena();
    float *x = rand_f32((size_t)R * n, 3.0f, act), *z = rand_f32((size_t)R * n, 4.0f, act);
    float *w = rand_f32((size_t)n, 0.5f, 1);
    float *want = malloc(sizeof(float) * R * n), *got = malloc(sizeof(float) * R * n);
    float *dx = dup_dev(x, sizeof(float) * R * n), *dz = dup_dev(z, sizeof(float) * R * n);
    float *dw = dup_dev(w, sizeof(float) * n);
    ls_error e_;
    if (gated) {
        ls_cpu_gated_rmsnorm(x, z, w, want, R, n, act, LS_ORDER_CANONICAL);
        ck_assert_msg(ls_cuda_gated_rmsnorm(dx, dz, dw, dx, R, n, act, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
    } else {
        ls_cpu_rmsnorm(x, w, want, R, n, act, LS_ORDER_CANONICAL);
        ck_assert_msg(ls_cuda_rmsnorm(dx, dw, dx, R, n, act, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
    }
    fetch(got, dx, sizeof(float) * R * n);
    char what[96];
    snprintf(what, sizeof what, "%srmsnorm [%ld, %ld] act %d (in place)", gated ? "gated_" : "", R, n, act);
    same_f32(what, want, got, (size_t)R * n);
    printf("  ok %s\n", what);
    free(x); free(z); free(w); free(want); free(got);
}

START_TEST(test_norms)
{
    long shapes[][2] = {{1, 2048}, {63, 2048}, {65, 2048}, {65 * 16, 256}, {7, 48}, {5, 96}, {3, 77}, {2, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        check_rmsnorm(shapes[i][0], shapes[i][1], 0, 1);
        check_rmsnorm(shapes[i][0], shapes[i][1], 1, 1);
    }
    check_rmsnorm(65 * 32, 128, 1, 1);
    check_rmsnorm(9, 2048, 0, 0);
    check_rmsnorm(9, 128, 1, 0);
    /* L2 norm + scale */
    long l2[][2] = {{65 * 16, 128}, {1, 128}, {7, 48}, {5, 96}, {3, 77}};
    for (size_t i = 0; i < sizeof l2 / sizeof l2[0]; i++) {
        reset_arena();
        long R = l2[i][0], d = l2[i][1];
        float *x = rand_f32((size_t)R * d, 2.0f, 1);
        float *got = malloc(sizeof(float) * R * d);
        float *dx = dup_dev(x, sizeof(float) * R * d);
        float sc = ls_cpu_inv_sqrt_scale(d);
        ls_cpu_l2norm_scale(x, R, d, sc, LS_ORDER_CANONICAL);
        ls_error e_;
        ck_assert_msg(ls_cuda_l2norm_scale(dx, R, d, sc, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
        fetch(got, dx, sizeof(float) * R * d);
        same_f32("l2norm_scale", x, got, (size_t)R * d);
        free(x); free(got);
    }
}
END_TEST

START_TEST(test_elementwise)
{
    reset_arena();
    long T = 65, H = 32, n = 65 * 4096;
    float *b = rand_f32(T * H, 6.0f, 1), *a = rand_f32(T * H, 6.0f, 1);
    float *Al = rand_f32(H, 2.0f, 1), *dtb = rand_f32(H, 3.0f, 1);
    a[0] = 25.0f; /* softplus threshold branch */
    float *beta = malloc(sizeof(float) * T * H), *alpha = malloc(sizeof(float) * T * H);
    float *gb = malloc(sizeof(float) * T * H), *ga = malloc(sizeof(float) * T * H);
    ls_cpu_gdn_gates(b, a, Al, dtb, beta, alpha, T, H, 1);
    float *db = dup_dev(b, 4 * T * H), *da = dup_dev(a, 4 * T * H), *dAl = dup_dev(Al, 4 * H),
          *ddt = dup_dev(dtb, 4 * H);
    float *dbeta = dalloc(4 * T * H), *dalpha = dalloc(4 * T * H);
    ls_error e_;
    ck_assert_msg(ls_cuda_gdn_gates(db, da, dAl, ddt, dbeta, dalpha, T, H, 1, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(gb, dbeta, 4 * T * H);
    fetch(ga, dalpha, 4 * T * H);
    same_f32("gdn_gates beta", beta, gb, (size_t)(T * H));
    same_f32("gdn_gates alpha", alpha, ga, (size_t)(T * H));

    float *o = rand_f32(n, 3.0f, 1), *g = rand_f32(n, 8.0f, 1), *got = malloc(4 * n);
    float *dout = dup_dev(o, 4 * n), *dg = dup_dev(g, 4 * n);
    ls_cpu_sigmoid_gate(o, g, n, 1);
    ck_assert_msg(ls_cuda_sigmoid_gate(dout, dg, n, 1, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(got, dout, 4 * n);
    same_f32("sigmoid_gate", o, got, (size_t)n);
    ls_cpu_residual(o, g, n, 1);
    ck_assert_msg(ls_cuda_residual(dout, dg, n, 1, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(got, dout, 4 * n);
    same_f32("residual", o, got, (size_t)n);
    free(b); free(a); free(Al); free(dtb); free(beta); free(alpha); free(gb); free(ga);
    free(o); free(g); free(got);
}
END_TEST

/* The GDN projection split of the engine (16 key-head groups of q, k, v, z
 * per row), as one block copy: the device copy = the host loop. */
START_TEST(test_copy_blocks)
{
    reset_arena();
    long T = 65, G = 16, dk = 128, vz = 256, gw = 2 * dk + 2 * vz, C = G * (2 * dk + vz);
    float *src = rand_f32((size_t)T * G * gw, 1.0f, 0);
    float *want = calloc((size_t)T * C, sizeof(float)), *got = malloc(sizeof(float) * T * C);
    for (long r = 0; r < T; r++)
        for (long g = 0; g < G; g++)
            memcpy(want + r * C + 2 * G * dk + g * vz, src + r * G * gw + g * gw + 2 * dk, 4 * vz);
    float *dsrc = dup_dev(src, 4 * T * G * gw), *dd = dalloc(4 * T * C);
    ls_error e_;
    ck_assert_msg(ls_cuda_memset(dd, 0, 4 * T * C, &e_) == LS_OK, "%s", e_.msg);
    ck_assert_msg(ls_cuda_copy_blocks(dd + 2 * G * dk, dsrc + 2 * dk, T, G, vz, C, vz, G * gw, gw,
                                      NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(got, dd, 4 * T * C);
    same_f32("copy_blocks (gdn split of v)", want, got, (size_t)(T * C));
    free(src); free(want); free(got);
}
END_TEST

/* ---- conv ------------------------------------------------------------------------ */

START_TEST(test_conv)
{
    long Cs[] = {8192, 100}, Ks[] = {4, 3}, Ts[] = {1, 63, 65};
    for (int ci = 0; ci < 2; ci++)
        for (int ti = 0; ti < 3; ti++) {
            reset_arena();
            long C = Cs[ci], K = Ks[ci], T = Ts[ti], xs = C + 64, ys = C + 32;
            float *x = rand_f32((size_t)T * xs, 2.0f, 1);
            void *w = rand_w(C, K, LS_WTYPE_BF16, 0.7f);
            float *st = rand_f32((size_t)C * K, 2.0f, 1); /* carried state from an earlier call */
            float *y = calloc((size_t)T * ys, 4), *gy = calloc((size_t)T * ys, 4);
            float *gst = malloc(4 * C * K);
            float *dx = dup_dev(x, 4 * T * xs), *dst = dup_dev(st, 4 * C * K);
            float *dy = dup_dev(y, 4 * T * ys);
            void *dw = dup_dev(w, wbytes(C, K, 0));
            ls_wmat wm = {w, LS_WTYPE_BF16, C, K};
            ls_cpu_conv_silu(x, xs, &wm, st, y, ys, T, C, K, 1, LS_ORDER_CANONICAL);
            /* GPU: the same tokens split in two calls (state carried on the device). */
            long T1 = T / 2;
            ls_error e_;
            ck_assert_msg(ls_cuda_conv_silu(dx, xs, dw, 0, dst, dy, ys, T1, C, K, 1, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
            ck_assert_msg(ls_cuda_conv_silu(dx + T1 * xs, xs, dw, 0, dst, dy + T1 * ys, ys, T - T1, C, K, 1, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
            fetch(gy, dy, 4 * T * ys);
            fetch(gst, dst, 4 * C * K);
            char what[96];
            snprintf(what, sizeof what, "conv_silu C %ld K %ld T %ld (calls %ld + %ld)", C, K, T, T1, T - T1);
            same_f32(what, y, gy, (size_t)(T * ys));
            same_f32("conv state", st, gst, (size_t)(C * K));
            printf("  ok %s\n", what);
            free(x); free(w); free(st); free(y); free(gy); free(gst);
        }
}
END_TEST

/* ---- GDN recurrent ------------------------------------------------------------- */

static void check_gdn(long Hk, long Hv, long dk, long dv, long T)
{
    reset_arena();
    size_t nq = (size_t)T * Hk * dk, nv = (size_t)T * Hv * dv, ns = (size_t)Hv * dk * dv;
    float *q = rand_f32(nq, 1.0f, 1), *k = rand_f32(nq, 1.0f, 1), *v = rand_f32(nv, 1.0f, 1);
    ls_cpu_l2norm_scale(q, T * Hk, dk, ls_cpu_inv_sqrt_scale(dk), LS_ORDER_CANONICAL);
    ls_cpu_l2norm_scale(k, T * Hk, dk, 1.0f, LS_ORDER_CANONICAL);
    float *al = malloc(4 * T * Hv), *be = malloc(4 * T * Hv);
    for (long i = 0; i < T * Hv; i++) {
        al[i] = 0.5f + 0.5f * fabsf(ls_gpu_rand_f32(&g_seed, 1.0f));
        be[i] = ls_round_bf16(fabsf(ls_gpu_rand_f32(&g_seed, 1.0f)));
    }
    float *S = rand_f32(ns, 0.1f, 0);
    float *o = malloc(4 * nv), *go = malloc(4 * nv), *gS = malloc(4 * ns);
    float *dq = dup_dev(q, 4 * nq), *dk_ = dup_dev(k, 4 * nq), *dv_ = dup_dev(v, 4 * nv);
    float *dal = dup_dev(al, 4 * T * Hv), *dbe = dup_dev(be, 4 * T * Hv);
    float *dS = dup_dev(S, 4 * ns), *dS2 = dup_dev(S, 4 * ns);
    float *dout = dalloc(4 * nv);
    ls_cpu_gdn_recurrent(q, k, v, al, be, S, o, T, Hk, Hv, dk, dv, 1, LS_ORDER_CANONICAL);
    ls_error e_;
    /* One call over all T tokens. */
    ck_assert_msg(ls_cuda_gdn_recurrent(dq, dk_, dv_, dal, dbe, dS, dout, T, Hk, Hv, dk, dv, 1, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(go, dout, 4 * nv);
    fetch(gS, dS, 4 * ns);
    char what[128];
    snprintf(what, sizeof what, "gdn_recurrent Hk %ld Hv %ld dk %ld dv %ld T %ld", Hk, Hv, dk, dv, T);
    same_f32(what, o, go, nv);
    same_f32("gdn state after one call", S, gS, ns);
    /* Token by token (decode) from the same initial state: same bits. */
    for (long t = 0; t < T; t++)
        ck_assert_msg(ls_cuda_gdn_recurrent(dq + t * Hk * dk, dk_ + t * Hk * dk, dv_ + t * Hv * dv,
                                            dal + t * Hv, dbe + t * Hv, dS2, dout + t * Hv * dv, 1,
                                            Hk, Hv, dk, dv, 1, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(go, dout, 4 * nv);
    fetch(gS, dS2, 4 * ns);
    same_f32("gdn_recurrent token by token", o, go, nv);
    same_f32("gdn state token by token", S, gS, ns);
    printf("  ok %s (one call and token by token)\n", what);
    free(q); free(k); free(v); free(al); free(be); free(S); free(o); free(go); free(gS);
}

START_TEST(test_gdn)
{
    check_gdn(16, 32, 128, 128, 1);
    check_gdn(16, 32, 128, 128, g_quick ? 5 : 65);
    if (!g_quick) check_gdn(16, 32, 128, 128, 63);
    check_gdn(2, 4, 48, 96, 65);
    check_gdn(1, 2, 96, 48, 63);
    check_gdn(3, 3, 77, 33, 9);
}
END_TEST

/* ---- RoPE + attention -------------------------------------------------------------- */

static void check_rope(long T, long H, long d, long R)
{
    reset_arena();
    int32_t *pos = malloc(4 * T);
    for (long t = 0; t < T; t++) pos[t] = (int32_t)(t * 37 + 5);
    float *ct = malloc(4 * T * (R / 2)), *st = malloc(4 * T * (R / 2));
    ls_cpu_rope_table(pos, T, R, 1e7, ct, st, 1);
    float *x = rand_f32((size_t)T * H * d, 2.0f, 1), *got = malloc(4 * T * H * d);
    float *dx = dup_dev(x, 4 * T * H * d), *dc = dup_dev(ct, 4 * T * (R / 2)), *ds = dup_dev(st, 4 * T * (R / 2));
    ls_cpu_rope_apply(x, ct, st, T, H, d, R, 1);
    ls_error e_;
    ck_assert_msg(ls_cuda_rope_apply(dx, dc, ds, T, H, d, R, 1, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(got, dx, 4 * T * H * d);
    same_f32("rope_apply", x, got, (size_t)(T * H * d));
    free(pos); free(ct); free(st); free(x); free(got);
}

static void check_attention(long Hq, long Hkv, long d, long cap, long T, long p0)
{
    reset_arena();
    size_t nc = (size_t)Hkv * cap * d, nq = (size_t)T * Hq * d;
    float *kc = rand_f32(nc, 1.0f, 1), *vc = rand_f32(nc, 1.0f, 1), *q = rand_f32(nq, 4.0f, 1);
    int32_t *pos = malloc(4 * T);
    for (long t = 0; t < T; t++) pos[t] = (int32_t)(p0 + t);
    float *o = malloc(4 * nq), *go = malloc(4 * nq);
    ls_cpu_attention(q, kc, vc, cap, pos, o, T, Hq, Hkv, d, 1, LS_ORDER_CANONICAL);
    float *dkc = dup_dev(kc, 4 * nc), *dvc = dup_dev(vc, 4 * nc), *dq = dup_dev(q, 4 * nq);
    int32_t *dpos = dup_dev(pos, 4 * T);
    float *dout = dalloc(4 * nq);
    ls_error e_;
    ck_assert_msg(ls_cuda_attention(dq, dkc, dvc, cap, dpos, dout, T, Hq, Hkv, d, 1, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(go, dout, 4 * nq);
    char what[128];
    snprintf(what, sizeof what, "attention Hq %ld Hkv %ld d %ld cap %ld T %ld from pos %ld", Hq, Hkv, d, cap, T, p0);
    same_f32(what, o, go, nq);
    printf("  ok %s\n", what);
    free(kc); free(vc); free(q); free(pos); free(o); free(go);
}

START_TEST(test_attention)
{
    check_rope(65, 16, 256, 64);
    check_rope(1, 2, 256, 64);
    check_rope(7, 3, 96, 32);
    check_rope(5, 4, 48, 48);
    check_attention(16, 2, 256, 200, 65, 0);   /* prefill */
    check_attention(16, 2, 256, 200, 1, 130);  /* decode */
    check_attention(16, 2, 256, 200, 63, 64);  /* chunk */
    check_attention(4, 2, 48, 100, 65, 0);
    check_attention(6, 3, 96, 100, 33, 31);
    if (!g_quick) check_attention(16, 2, 256, 4200, 2, 4100);
}
END_TEST

/* ---- router + MoE ---------------------------------------------------------------- */

static void check_router(long E, long D, long T, long k, int norm, int ties)
{
    reset_arena();
    uint16_t *w = rand_w(E, D, LS_WTYPE_BF16, 0.05f);
    if (ties) /* duplicate rows: equal logits, so ties must go to the lower index */
        for (long e = 1; e < E; e += 2) memcpy(w + e * D, w + (e - 1) * D, 2 * D);
    float *x = rand_f32((size_t)T * D, 1.0f, 1);
    float *pr = malloc(4 * T * E), *wt = malloc(4 * T * k), *gpr = malloc(4 * T * E), *gwt = malloc(4 * T * k);
    int32_t *ids = malloc(4 * T * k), *gids = malloc(4 * T * k);
    ls_wmat wm = {w, LS_WTYPE_BF16, E, D};
    ls_cpu_router(&wm, x, T, k, norm, pr, ids, wt, 1, LS_ORDER_CANONICAL);
    void *dw = dup_dev(w, wbytes(E, D, 0));
    float *dx = dup_dev(x, 4 * T * D), *dpr = dalloc(4 * T * E), *dwt = dalloc(4 * T * k);
    int32_t *dids = dalloc(4 * T * k);
    ls_error e_;
    ck_assert_msg(ls_cuda_router(dw, 0, E, D, dx, T, k, norm, dpr, dids, dwt, 1, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(gpr, dpr, 4 * T * E);
    fetch(gids, dids, 4 * T * k);
    fetch(gwt, dwt, 4 * T * k);
    char what[96];
    snprintf(what, sizeof what, "router E %ld D %ld T %ld k %ld norm %d ties %d", E, D, T, k, norm, ties);
    same_f32(what, pr, gpr, (size_t)(T * E));
    ck_assert_msg(ls_gpu_same_i32("router ids", ids, gids, (size_t)(T * k)), "router ids differ");
    same_f32("router weights", wt, gwt, (size_t)(T * k));
    printf("  ok %s\n", what);
    free(w); free(x); free(pr); free(wt); free(gpr); free(gwt); free(ids); free(gids);
}

static void check_moe(long E, long D, long I, long Is, long k, long T, int shared, int wt_)
{
    reset_arena();
    ls_wmat *g = calloc(E, sizeof *g), *u = calloc(E, sizeof *u), *dn = calloc(E, sizeof *dn);
    const void **dg = calloc(E, sizeof *dg), **du = calloc(E, sizeof *du), **dd = calloc(E, sizeof *dd);
    for (long e = 0; e < E; e++) {
        g[e] = (ls_wmat){rand_w(I, D, wt_, 0.05f), wt_, I, D};
        u[e] = (ls_wmat){rand_w(I, D, wt_, 0.05f), wt_, I, D};
        dn[e] = (ls_wmat){rand_w(D, I, wt_, 0.05f), wt_, D, I};
        dg[e] = dup_dev(g[e].data, wbytes(I, D, wt_));
        du[e] = dup_dev(u[e].data, wbytes(I, D, wt_));
        dd[e] = dup_dev(dn[e].data, wbytes(D, I, wt_));
    }
    ls_wmat sg = {rand_w(Is, D, wt_, 0.05f), wt_, Is, D};
    ls_wmat su = {rand_w(Is, D, wt_, 0.05f), wt_, Is, D};
    ls_wmat sd = {rand_w(D, Is, wt_, 0.05f), wt_, D, Is};
    ls_wmat sgw = {rand_w(1, D, wt_, 0.05f), wt_, 1, D};
    ls_moe_weights mw = {E, D, I, Is, g, u, dn, shared ? &sg : NULL, &su, &sd, &sgw};
    ls_cuda_moe cm = {E, D, I, Is, wt_, dup_dev(dg, sizeof(void *) * E), dup_dev(du, sizeof(void *) * E),
                      dup_dev(dd, sizeof(void *) * E), shared ? dup_dev(sg.data, wbytes(Is, D, wt_)) : NULL,
                      dup_dev(su.data, wbytes(Is, D, wt_)), dup_dev(sd.data, wbytes(D, Is, wt_)),
                      dup_dev(sgw.data, wbytes(1, D, wt_))};
    float *x = rand_f32((size_t)T * D, 1.0f, 1);
    int32_t *ids = malloc(4 * T * k);
    float *w = malloc(4 * T * k);
    for (long t = 0; t < T; t++)
        for (long i = 0; i < k; i++) {
            ids[t * k + i] = (int32_t)((t * 5 + i * 3) % E); /* several tokens share experts */
            w[t * k + i] = ls_round_bf16(0.05f + fabsf(ls_gpu_rand_f32(&g_seed, 0.2f)));
        }
    float *out = malloc(4 * T * D), *gout = malloc(4 * T * D);
    float *scratch = malloc(4 * ((k + 1) * D + 2 * (I > Is ? I : Is)));
    ls_cpu_moe(&mw, x, ids, w, k, out, 0, T, scratch, 1, LS_ORDER_CANONICAL, LS_ORDER_CANONICAL);
    float *dx = dup_dev(x, 4 * T * D), *dw = dup_dev(w, 4 * T * k), *dout = dalloc(4 * T * D);
    int32_t *dids = dup_dev(ids, 4 * T * k);
    void *dscr = dalloc(ls_cuda_moe_scratch_bytes(&cm, T, k));
    ls_error e_;
    char what[160];
    /* Every kernel plan (-1: the default choice) gives the CPU's bits. */
    for (int plan = -1; plan < ls_cuda_moe_plan_count(); plan++) {
        ck_assert_msg(ls_cuda_moe_forward_plan(&cm, dx, dids, dw, k, dout, T, dscr, 1, 0, 0, plan, NULL,
                                               &e_) == LS_OK, "%s", e_.msg);
        fetch(gout, dout, 4 * T * D);
        snprintf(what, sizeof what, "moe plan %s", plan < 0 ? "default" : ls_cuda_moe_plan_name(plan));
        same_f32(what, out, gout, (size_t)(T * D));
    }
    snprintf(what, sizeof what, "moe E %ld D %ld I %ld Is %ld k %ld T %ld shared %d %s, every plan", E,
             D, I, Is, k, T, shared, wt_ == LS_WTYPE_BF16 ? "bf16" : "fp32");
    /* Batch independence: token T-1 alone gives the same row. */
    ck_assert_msg(ls_cuda_moe_forward(&cm, dx + (T - 1) * D, dids + (T - 1) * k, dw + (T - 1) * k, k, dout, 1, dscr, 1, 0, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(gout, dout, 4 * D);
    same_f32("moe last token alone", out + (T - 1) * D, gout, (size_t)D);
    printf("  ok %s\n", what);
    for (long e = 0; e < E; e++) {
        free((void *)g[e].data); free((void *)u[e].data); free((void *)dn[e].data);
    }
    free(g); free(u); free(dn); free(dg); free(du); free(dd);
    free((void *)sg.data); free((void *)su.data); free((void *)sd.data); free((void *)sgw.data);
    free(x); free(ids); free(w); free(out); free(gout); free(scratch);
}

START_TEST(test_router_moe)
{
    check_router(512, 2048, 1, 10, 1, 0);
    check_router(512, 2048, g_quick ? 3 : 65, 10, 1, 0);
    check_router(64, 96, 63, 8, 0, 1);
    check_router(64, 96, 5, 8, 1, 1);
    check_router(700, 96, 5, 8, 1, 1);  /* 32 logits per lane in registers */
    check_router(1100, 96, 5, 8, 0, 1); /* beyond the register kernels */
    check_moe(16, 2048, 512, 512, 10, 1, 1, LS_WTYPE_BF16);
    check_moe(16, 2048, 512, 512, 10, g_quick ? 3 : 65, 1, LS_WTYPE_BF16);
    check_moe(16, 512, 256, 128, 4, g_quick ? 5 : 40, 1, LS_WTYPE_F32);
    check_moe(8, 96, 48, 80, 3, 7, 1, LS_WTYPE_BF16);
    check_moe(8, 96, 48, 80, 3, 7, 0, LS_WTYPE_BF16);
}
END_TEST

/* ---- logprobs + top-k ------------------------------------------------------------ */

static void check_logprobs(long R, long V, float scale)
{
    reset_arena();
    float *l = rand_f32((size_t)R * V, scale, 1), *lp = malloc(4 * R * V), *glp = malloc(4 * R * V);
    float *scr = malloc(4 * V);
    ls_cpu_logprobs(l, lp, R, V, scr, LS_ORDER_CANONICAL);
    float *dl = dup_dev(l, 4 * R * V);
    ls_error e_;
    ck_assert_msg(ls_cuda_logprobs(dl, dl, R, V, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(glp, dl, 4 * R * V);
    char what[64];
    snprintf(what, sizeof what, "logprobs R %ld V %ld", R, V);
    same_f32(what, lp, glp, (size_t)(R * V));
    /* top-5 of each row */
    long k = 5;
    int32_t *ids = malloc(4 * R * k), *gids = malloc(4 * R * k);
    float *vals = malloc(4 * R * k), *gvals = malloc(4 * R * k);
    for (long r = 0; r < R; r++) ls_cpu_topk(lp + r * V, V, k, ids + r * k, vals + r * k);
    int32_t *dids = dalloc(4 * R * k);
    float *dvals = dalloc(4 * R * k);
    ck_assert_msg(ls_cuda_topk(dl, R, V, k, dids, dvals, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(gids, dids, 4 * R * k);
    fetch(gvals, dvals, 4 * R * k);
    ck_assert_msg(ls_gpu_same_i32("top-5 ids", ids, gids, (size_t)(R * k)), "top-5 ids differ");
    same_f32("top-5 logprobs", vals, gvals, (size_t)(R * k));
    printf("  ok %s + top-5\n", what);
    free(l); free(lp); free(glp); free(scr); free(ids); free(gids); free(vals); free(gvals);
}

START_TEST(test_logprobs)
{
    check_logprobs(2, 151936, 8.0f);
    check_logprobs(g_quick ? 3 : 65, 1000, 3.0f);
    check_logprobs(4, 37, 0.01f); /* bf16 rounding makes many exact ties */
}
END_TEST

/* ---- fail closed ---------------------------------------------------------------- */

START_TEST(test_fail_closed)
{
    ls_error err;
    ls_error_clear(&err);
    ck_assert_int_eq(ls_cuda_gdn_recurrent(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 256, 128, 1, 0, NULL, &err), LS_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "gdn_recurrent"));
    ck_assert_int_eq(ls_cuda_attention(NULL, NULL, NULL, 8, NULL, NULL, 1, 1, 1, 512, 1, 0, NULL, &err), LS_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "attention"));
    ck_assert_int_eq(ls_cuda_linear(NULL, 0, 8, 8, NULL, NULL, 1, 1, LS_ORDER_REVERSED, NULL, &err), LS_E_UNSUPPORTED);
    ck_assert_int_eq(ls_cuda_conv_silu(NULL, 1, NULL, 0, NULL, NULL, 1, 1, 1, 9, 1, 0, NULL, &err), LS_E_UNSUPPORTED);
}
END_TEST

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
    const char *q = getenv("LS_GPU_QUICK");
    g_quick = q && *q && strcmp(q, "0") != 0;
    ls_error err;
    ls_error_clear(&err);
    if (ls_cuda_arena_init(&g_arena, (size_t)3 << 30, &err) != LS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    Suite *s = suite_create("gpu_conformance");
    TCase *tc = tcase_create("conformance");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_linear);
    tcase_add_test(tc, test_embed);
    tcase_add_test(tc, test_norms);
    tcase_add_test(tc, test_elementwise);
    tcase_add_test(tc, test_copy_blocks);
    tcase_add_test(tc, test_conv);
    tcase_add_test(tc, test_gdn);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_router_moe);
    tcase_add_test(tc, test_logprobs);
    tcase_add_test(tc, test_fail_closed);
    suite_add_tcase(s, tc);
    int rc = ls_gpu_run_suite(s);
    ls_cuda_arena_free(&g_arena);
    return rc;
}
#else
int main(void)
{
    (void)ls_gpu_available();
    return LS_GPU_SKIP;
}
#endif
