/* Conformance of the portable strict CUDA backend (src/backend/backend_cuda.c
 * over kernels/ops.h) with the CPU reference, bit for bit.
 *
 * The operator table: every op of ls_backend runs through the table's
 * function pointers on a fresh ls_backend_cuda_create backend per case and
 * is compared with its ls_cpu_* reference computed on host arrays
 * (tests/backend_ops.c, the same library and cases as the CPU suite
 * tests/test_backend_ops.c; only the backend differs). All shapes: the
 * Qwen3-Next-80B dimensions (hidden 2048, GDN 16/32 heads x 128, attention
 * 16/2 x 256, expert width 512, vocab 151936, E = 512 with k = 10, routers of
 * 700 and 1100 experts, fp32-weight MoE) and awkward ones (T = 1, 63, 65;
 * head dims 48, 77 and 96; K not a multiple of 32), bf16 and fp32
 * activations; LS_ORDER_REVERSED must fail closed with LS_E_UNSUPPORTED.
 * LS_GPU_QUICK=1 (used under compute-sanitizer) runs the reduced shape set.
 *
 * Direct kernel checks, for what the table cannot express:
 *   - every MoE kernel plan (ls_cuda_moe_forward_plan): the backend always
 *     takes the default plan, so only a direct call can force the others;
 *     and on the same experts the tensor-core tier's (ls_cuda_moe_forward_tc):
 *     batch invariant bit for bit, near the portable rows, refused where
 *     its shapes do not hold;
 *   - top-k (ls_cuda_topk): not an operator of ls_backend;
 *   - shape limits that fail closed on CUDA (GDN dk > 128, attention d > 256,
 *     conv K > 8, linear with the reversed order, MoE experts of mixed
 *     dtypes): the CPU backend accepts these shapes, so they are not cases of
 *     the shared table; each is checked on the kernel and through the backend.
 * The first mismatching element is printed with both values as hex bits. */
#include "gpu_testutil.h"

#ifdef LOCKSTEP_HAVE_CUDA
#include <math.h>

#include "backend/backend_cuda.h"
#include "backend/cpu_ops.h"
#include "backend_ops.h"
#include "ops.h"

/* Device memory of one table case's backend: the largest case (the lm_head
 * linear, [151936, 2048] bf16) needs about 0.7 GB. */
#define LS_CONF_CASE_ARENA_BYTES ((size_t)4 << 30)

static ls_cuda_arena g_arena; /* the direct checks' device memory */
static int g_quick;
static uint64_t g_seed = 12345;

/* ---- the operator table --------------------------------------------------------- */

static ls_status cuda_create(void *arg, ls_backend **out, ls_error *err)
{
    (void)arg;
    return ls_backend_cuda_create(LS_CONF_CASE_ARENA_BYTES, out, err);
}

/* reversed = 0: the portable kernels implement only the canonical order. */
static const ls_bo_target g_cuda = {"cuda-portable", cuda_create, NULL, 0};

START_TEST(test_op)
{
    ls_bo_config cfg = {g_quick, 0};
    long fails = ls_bo_run_op(_i, &g_cuda, 1, &cfg);
    ck_assert_msg(fails == 0, "%s: %ld cases differ from the CPU reference or did not run",
                  ls_bo_op_name(_i), fails);
}
END_TEST

/* ---- direct checks: helpers ---------------------------------------------------------- */

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

/* ---- direct: every MoE kernel plan ------------------------------------------------------ */

/* The tensor-core tier's experts (ls_cuda_moe_forward_tc) on the same
 * experts and tokens: a pair's bits do not depend on the other tokens (each
 * token alone, and the tokens in reverse order, give its row of the whole
 * call bit for bit), and the rows are the portable ones up to bf16 operand
 * rounding (|Δ| <= 2 % of the largest |out|: a wrong layout or a missed
 * K step is far off). Shapes the kernels do not take fail closed. */
static void check_moe_tc(const ls_cuda_moe *cm, const float *x, const int32_t *ids, const float *w,
                         long k, long T, const float *ref, const char *what)
{
    long D = cm->D;
    float *dout = dalloc(4 * T * D), *tout = malloc(4 * T * D);
    void *dscr = dalloc(ls_cuda_moe_scratch_bytes(cm, T, k));
    ls_error e_;
    ls_status st = ls_cuda_moe_forward_tc(cm, dup_dev(x, 4 * T * D), dup_dev(ids, 4 * T * k),
                                          dup_dev(w, 4 * T * k), k, dout, T, dscr, 1, 0, 0, NULL, &e_);
    if (cm->wtype != LS_WTYPE_BF16 || D % 16 || cm->I % 16 || (cm->sh_gate && cm->Is % 16)) {
        ck_assert_int_eq(st, LS_E_UNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(e_.msg, "tensor-core tier"));
        printf("  ok %s, tensor cores refused: %s\n", what, e_.msg);
        free(tout);
        return;
    }
    ck_assert_msg(st == LS_OK, "%s", e_.msg);
    fetch(tout, dout, 4 * T * D);
    float big = 0.0f, worst = 0.0f;
    for (long i = 0; i < T * D; i++) {
        big = fmaxf(big, fabsf(ref[i]));
        worst = fmaxf(worst, fabsf(ref[i] - tout[i]));
    }
    ck_assert_msg(worst <= 0.02f * big, "%s, tensor cores: max |tc - portable| %g of max |out| %g", what,
                  (double)worst, (double)big);
    /* each token alone, then all of them in reverse order */
    for (long t = 0; t <= T; t++) {
        int rev = t == T;
        long n = rev ? T : 1;
        float *xs = malloc(4 * n * D), *ws = malloc(4 * n * k), *got = malloc(4 * n * D);
        int32_t *is = malloc(4 * n * k);
        for (long r = 0; r < n; r++) {
            long src = rev ? T - 1 - r : t;
            memcpy(xs + r * D, x + src * D, 4 * D);
            memcpy(is + r * k, ids + src * k, 4 * k);
            memcpy(ws + r * k, w + src * k, 4 * k);
        }
        ck_assert_msg(ls_cuda_moe_forward_tc(cm, dup_dev(xs, 4 * n * D), dup_dev(is, 4 * n * k),
                                             dup_dev(ws, 4 * n * k), k, dout, n, dscr, 1, 0, 0, NULL,
                                             &e_) == LS_OK, "%s", e_.msg);
        fetch(got, dout, 4 * n * D);
        for (long r = 0; r < n; r++) {
            long src = rev ? T - 1 - r : t;
            char w2[256];
            snprintf(w2, sizeof w2, "%s, tensor cores, token %ld %s", what, src,
                     rev ? "in the reversed batch" : "alone");
            ck_assert_msg(ls_gpu_same_f32(w2, tout + src * D, got + r * D, (size_t)D),
                          "%s: differs from the batch", w2);
        }
        free(xs); free(ws); free(is); free(got);
    }
    printf("  ok %s, tensor cores: each token alone and reversed equal the batch; max |tc - portable| %.3g "
           "(max |out| %.3g)\n", what, (double)worst, (double)big);
    free(tout);
}

static void check_moe_plans(long E, long D, long I, long Is, long k, long T, int shared, int wt_)
{
    reset_arena();
    ls_wmat *g = calloc(E, sizeof *g), *u = calloc(E, sizeof *u), *dn = calloc(E, sizeof *dn);
    const void **dg = calloc(E, sizeof *dg), **du = calloc(E, sizeof *du), **dd = calloc(E, sizeof *dd);
    for (long e = 0; e < E; e++) {
        g[e] = (ls_wmat){rand_w(I, D, wt_, 0.05f), wt_, I, D, NULL, NULL, 0};
        u[e] = (ls_wmat){rand_w(I, D, wt_, 0.05f), wt_, I, D, NULL, NULL, 0};
        dn[e] = (ls_wmat){rand_w(D, I, wt_, 0.05f), wt_, D, I, NULL, NULL, 0};
        dg[e] = dup_dev(g[e].data, wbytes(I, D, wt_));
        du[e] = dup_dev(u[e].data, wbytes(I, D, wt_));
        dd[e] = dup_dev(dn[e].data, wbytes(D, I, wt_));
    }
    ls_wmat sg = {rand_w(Is, D, wt_, 0.05f), wt_, Is, D, NULL, NULL, 0};
    ls_wmat su = {rand_w(Is, D, wt_, 0.05f), wt_, Is, D, NULL, NULL, 0};
    ls_wmat sd = {rand_w(D, Is, wt_, 0.05f), wt_, D, Is, NULL, NULL, 0};
    ls_wmat sgw = {rand_w(1, D, wt_, 0.05f), wt_, 1, D, NULL, NULL, 0};
    ls_moe_weights mw = {E, D, I, Is, g, u, dn, shared ? &sg : NULL, &su, &sd, &sgw};
    ls_cuda_moe cm = {.E = E, .D = D, .I = I, .Is = Is, .wtype = wt_,
                      .gate = dup_dev(dg, sizeof(void *) * E), .up = dup_dev(du, sizeof(void *) * E),
                      .down = dup_dev(dd, sizeof(void *) * E),
                      .sh_gate = shared ? dup_dev(sg.data, wbytes(Is, D, wt_)) : NULL,
                      .sh_up = dup_dev(su.data, wbytes(Is, D, wt_)),
                      .sh_down = dup_dev(sd.data, wbytes(D, Is, wt_)), .sh_wtype = wt_,
                      .sh_gate_w = dup_dev(sgw.data, wbytes(1, D, wt_)), .shg_wtype = wt_};
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
        snprintf(what, sizeof what, "moe E %ld D %ld I %ld Is %ld k %ld T %ld shared %d %s, plan %s", E,
                 D, I, Is, k, T, shared, wt_ == LS_WTYPE_BF16 ? "bf16" : "fp32",
                 plan < 0 ? "default" : ls_cuda_moe_plan_name(plan));
        same_f32(what, out, gout, (size_t)(T * D));
        printf("  ok %s\n", what);
    }
    check_moe_tc(&cm, x, ids, w, k, T, out, what);
    for (long e = 0; e < E; e++) {
        free((void *)g[e].data); free((void *)u[e].data); free((void *)dn[e].data);
    }
    free(g); free(u); free(dn); free(dg); free(du); free(dd);
    free((void *)sg.data); free((void *)su.data); free((void *)sd.data); free((void *)sgw.data);
    free(x); free(ids); free(w); free(out); free(gout); free(scratch);
}

START_TEST(test_moe_plans)
{
    check_moe_plans(16, 2048, 512, 512, 10, 1, 1, LS_WTYPE_BF16);
    check_moe_plans(16, 2048, 512, 512, 10, g_quick ? 3 : 65, 1, LS_WTYPE_BF16);
    check_moe_plans(16, 512, 256, 128, 4, g_quick ? 5 : 40, 1, LS_WTYPE_F32);
    check_moe_plans(4, 256, 128, 64, 2, g_quick ? 40 : 150, 1, LS_WTYPE_BF16); /* > 64 pairs an expert */
    check_moe_plans(8, 96, 48, 80, 3, 7, 1, LS_WTYPE_BF16);
    check_moe_plans(8, 96, 48, 80, 3, 7, 0, LS_WTYPE_BF16);
}
END_TEST

/* ---- direct: top-k of logprob rows ---------------------------------------------------- */

static void check_topk(long R, long V, long k, float scale)
{
    reset_arena();
    float *l = rand_f32((size_t)R * V, scale, 1), *scr = malloc(4 * V);
    ls_cpu_logprobs(l, l, R, V, scr, LS_ORDER_CANONICAL);
    int32_t *ids = malloc(4 * R * k), *gids = malloc(4 * R * k);
    float *vals = malloc(4 * R * k), *gvals = malloc(4 * R * k);
    for (long r = 0; r < R; r++) ls_cpu_topk(l + r * V, V, k, ids + r * k, vals + r * k);
    float *dl = dup_dev(l, 4 * R * V), *dvals = dalloc(4 * R * k);
    int32_t *dids = dalloc(4 * R * k);
    ls_error e_;
    ck_assert_msg(ls_cuda_topk(dl, R, V, k, dids, dvals, NULL, &e_) == LS_OK, "%s", e_.msg);
    fetch(gids, dids, 4 * R * k);
    fetch(gvals, dvals, 4 * R * k);
    char what[96];
    snprintf(what, sizeof what, "top-%ld of logprobs R %ld V %ld", k, R, V);
    ck_assert_msg(ls_gpu_same_i32(what, ids, gids, (size_t)(R * k)), "%s: ids differ", what);
    same_f32(what, vals, gvals, (size_t)(R * k));
    printf("  ok %s\n", what);
    free(l); free(scr); free(ids); free(gids); free(vals); free(gvals);
}

START_TEST(test_topk)
{
    check_topk(2, 151936, 5, 8.0f);
    check_topk(g_quick ? 3 : 65, 1000, 5, 3.0f);
    check_topk(4, 37, 5, 0.01f); /* bf16 rounding makes many exact ties */
    check_topk(3, 1000, 64, 3.0f);
}
END_TEST

/* ---- direct: shape limits fail closed ----------------------------------------------------- */

static ls_buf *bo_buf(ls_backend *be, size_t floats)
{
    ls_error err;
    ls_buf *b = NULL;
    ck_assert_msg(be->alloc(be, 4 * floats, &b, &err) == LS_OK, "%s", err.msg);
    return b;
}

static ls_view vw(ls_buf *b)
{
    ls_view v = {b, 0};
    return v;
}

START_TEST(test_fail_closed)
{
    ls_error err;
    ls_error_clear(&err);
    /* The kernels (null pointers: the check comes before any launch). */
    ck_assert_int_eq(ls_cuda_gdn_recurrent(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 256, 128, 1, 0, NULL, &err), LS_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "gdn_recurrent"));
    ck_assert_int_eq(ls_cuda_attention(NULL, NULL, NULL, NULL, 8, 8, NULL, NULL, 1, 1, 1, 512, 1, 0, NULL, &err), LS_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "attention"));
    ck_assert_int_eq(ls_cuda_linear(NULL, 0, 8, 8, NULL, NULL, 1, 1, LS_ORDER_REVERSED, NULL, &err), LS_E_UNSUPPORTED);
    ck_assert_int_eq(ls_cuda_conv_silu(NULL, 1, NULL, 0, NULL, NULL, 1, 1, 1, 9, 1, 0, NULL, &err), LS_E_UNSUPPORTED);

    /* The same through the backend, on real buffers of the right sizes. */
    ls_backend *be = NULL;
    ck_assert_msg(ls_backend_cuda_create((size_t)64 << 20, &be, &err) == LS_OK, "%s", err.msg);
    ls_buf *q = bo_buf(be, 256), *k = bo_buf(be, 256), *v = bo_buf(be, 128), *ab = bo_buf(be, 2);
    ls_buf *st = bo_buf(be, 256 * 128), *o = bo_buf(be, 512);
    ck_assert_int_eq(be->gdn_recurrent(be, vw(q), vw(k), vw(v), vw(ab), vw(ab), vw(st), vw(o), 1,
                                       1, 1, 256, 128, 1, LS_ORDER_CANONICAL, &err),
                     LS_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "gdn_recurrent"));
    ls_buf *qa = bo_buf(be, 512), *kc = bo_buf(be, 8 * 512), *vc = bo_buf(be, 8 * 512);
    ls_buf *pos = bo_buf(be, 1);
    ck_assert_int_eq(be->attention(be, vw(qa), vw(kc), vw(vc), (ls_view){NULL, 0}, 8, 8, vw(pos),
                                   vw(o), 1, 1, 1, 512, 1, LS_ORDER_CANONICAL, &err), LS_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "attention"));
    /* Conv with K = 9 taps (the kernels hold at most 8). */
    float wc[9] = {0};
    ls_buf *wb = NULL;
    ck_assert_msg(be->wrap_weights(be, wc, sizeof wc, LS_WTYPE_F32, &wb, &err) == LS_OK, "%s", err.msg);
    ls_bweight w9 = {wb, 0, LS_WTYPE_F32, 1, 9, NULL};
    ls_buf *cx = bo_buf(be, 1), *cs = bo_buf(be, 9), *cy = bo_buf(be, 1);
    ck_assert_int_eq(be->conv_silu(be, vw(cx), 1, &w9, vw(cs), vw(cy), 1, 1, 1, 9, 1,
                                   LS_ORDER_CANONICAL, &err), LS_E_UNSUPPORTED);
    /* MoE experts of mixed dtypes: expert 0 bf16, expert 1 fp32 (one buffer
     * of host bytes; its wtype says fp32, the widest) */
    long D = 32, I = 32;
    float *mw = calloc((size_t)(6 * I * D), sizeof(float));
    ls_buf *mb = NULL;
    ck_assert_msg(be->wrap_weights(be, mw, sizeof(float) * (size_t)(6 * I * D), LS_WTYPE_F32, &mb,
                                   &err) == LS_OK,
                  "%s", err.msg);
    ls_bweight gate[2], up[2], down[2];
    for (int e = 0; e < 2; e++) {
        ls_wtype wt = e == 0 ? LS_WTYPE_BF16 : LS_WTYPE_F32;
        size_t base = sizeof(float) * (size_t)(3 * e * I * D);
        gate[e] = (ls_bweight){mb, base, wt, I, D, NULL};
        up[e] = (ls_bweight){mb, base + sizeof(float) * (size_t)(I * D), wt, I, D, NULL};
        down[e] = (ls_bweight){mb, base + 2 * sizeof(float) * (size_t)(I * D), wt, D, I, NULL};
    }
    ls_bmoe bm = {2, D, I, I, gate, up, down, NULL, NULL, NULL, NULL};
    ls_buf *mx = bo_buf(be, (size_t)D), *mids = bo_buf(be, 1), *mwt = bo_buf(be, 1);
    ls_buf *mo = bo_buf(be, (size_t)D);
    ck_assert_int_eq(be->moe(be, &bm, vw(mx), vw(mids), vw(mwt), 1, vw(mo), 1, 1, LS_ORDER_CANONICAL,
                             LS_ORDER_CANONICAL, &err), LS_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "moe"));
    be->destroy(be);
    free(mw);
    printf("  ok fail closed: GDN dk 256, attention d 512, conv K 9, reversed linear, "
           "mixed-dtype MoE\n");
}
END_TEST

int main(void)
{
    if (!ls_gpu_available()) return LS_GPU_SKIP;
    const char *q = getenv("LS_GPU_QUICK");
    g_quick = q && *q && strcmp(q, "0") != 0;
    ls_error err;
    ls_error_clear(&err);
    if (ls_cuda_arena_init(&g_arena, (size_t)1 << 30, &err) != LS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    Suite *s = suite_create("gpu_conformance");
    TCase *tc = tcase_create("operator table");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, test_op, 0, ls_bo_op_count());
    suite_add_tcase(s, tc);
    TCase *td = tcase_create("direct kernels");
    tcase_set_timeout(td, 900);
    tcase_add_test(td, test_moe_plans);
    tcase_add_test(td, test_topk);
    tcase_add_test(td, test_fail_closed);
    suite_add_tcase(s, td);
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
