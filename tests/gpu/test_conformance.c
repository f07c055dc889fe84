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
 *   - every MoE kernel plan (ls_cuda_moe_forward_plan) and every linear
 *     plan (ls_cuda_linear_plan): the backend always takes the default
 *     plan, so only a direct call can force the others;
 *     and on the same experts the tensor-core tier's (ls_cuda_moe_forward_tc):
 *     batch invariant bit for bit, near the portable rows, refused where
 *     its shapes do not hold;
 *   - the chunk-aligned GDN form on tensor cores (ls_cuda_gdn_chunked_tc, not
 *     an operator of ls_backend yet): whole, cut and in pieces bit for bit
 *     (outputs, its state, the materialised states), near the portable
 *     chunk-aligned kernel, refused where its shapes or scratch do not hold;
 *     and the fast tier's GDN (ls_cuda_gdn_fast) near the recurrent kernel;
 *   - the fast tier's experts (ls_cuda_moe_forward_fast) near the tc ones,
 *     and its attention on the table's attention cases within a bound;
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
static const ls_bo_target g_cuda = {"cuda-portable", cuda_create, NULL, 0, 0.0};

static ls_status cuda_fast_create(void *arg, ls_backend **out, ls_error *err)
{
    (void)arg;
    ls_backend_cuda_opts o;
    ls_backend_cuda_opts_default(&o);
    o.arena_bytes = LS_CONF_CASE_ARENA_BYTES;
    o.tier = LS_TIER_FAST;
    return ls_backend_cuda_create_opts(&o, out, err);
}

/* The fast tier's split-KV attention (docs/tensor-core-tier.md §6) on the
 * attention cases: not the strict order, so within a bound of the CPU's
 * outputs (fp32 accumulation in another order, __expf), not bitwise. */
static const ls_bo_target g_cuda_fast = {"cuda-fast", cuda_fast_create, NULL, 0, 2e-5};

START_TEST(test_op)
{
    ls_bo_config cfg = {g_quick, 0};
    const char *name = ls_bo_op_name(_i);
    int fast = !strcmp(name, "attention") || !strcmp(name, "attention_batch");
    ls_bo_target tg[2] = {g_cuda, g_cuda_fast};
    long fails = ls_bo_run_op(_i, tg, fast ? 2 : 1, &cfg);
    ck_assert_msg(fails == 0, "%s: %ld cases differ from the CPU reference or did not run", name, fails);
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

/* A device copy of the bf16 matrix d [N, K] in the tensor-core experts'
 * layout (ls_cuda_moe_tc_pack; scr: N K 2 bytes of device scratch). */
static void *packed_dup(const void *d, long N, long K, void *scr)
{
    size_t bytes = (size_t)(N * K * 2);
    void *h = malloc(bytes);
    fetch(h, d, bytes);
    void *p = dup_dev(h, bytes);
    free(h);
    ls_error e_;
    ck_assert_msg(ls_cuda_moe_tc_pack(p, N, K, scr, NULL, &e_) == LS_OK, "%s", e_.msg);
    return p;
}

/* The tensor-core tier's experts (ls_cuda_moe_forward_tc) on the same
 * experts and tokens, tcm the experts of cm packed (tc_layout) where the
 * kernels take them: a pair's bits do not depend on the other tokens (each
 * token alone, and the tokens in reverse order, give its row of the whole
 * call bit for bit), the expert-parallel slot rows (ls_cuda_moe_slots on
 * the packed experts) combine to the same bits, and the rows are the
 * portable ones up to bf16 operand rounding (|Δ| <= 2 % of the largest
 * |out|: a wrong layout or a missed K step is far off). Shapes the kernels
 * do not take fail closed, and so do experts in the wrong layout for the
 * kernels called. */
static void check_moe_tc(const ls_cuda_moe *cm, const ls_cuda_moe *tcm, const float *x, const int32_t *ids,
                         const float *w, long k, long T, const float *ref, const char *what)
{
    long D = cm->D;
    float *dout = dalloc(4 * T * D), *tout = malloc(4 * T * D);
    void *dscr = dalloc(ls_cuda_moe_scratch_bytes(cm, T, k));
    float *dx = dup_dev(x, 4 * T * D), *dw = dup_dev(w, 4 * T * k);
    int32_t *dids = dup_dev(ids, 4 * T * k);
    ls_error e_;
    ls_status st = ls_cuda_moe_forward_tc(cm, dx, dids, dw, k, dout, T, dscr, 1, 0, 0, NULL, &e_);
    if (!tcm->tc_layout) {
        ck_assert_int_eq(st, LS_E_UNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(e_.msg, "tensor-core tier"));
        printf("  ok %s, tensor cores refused: %s\n", what, e_.msg);
        free(tout);
        return;
    }
    ck_assert_msg(st == LS_E_UNSUPPORTED && strstr(e_.msg, "tensor-core layout"),
                  "%s: the tensor-core experts ran on row-major weights (%s)", what, e_.msg);
    st = ls_cuda_moe_forward_plan(tcm, dx, dids, dw, k, dout, T, dscr, 1, 0, 0, -1, NULL, &e_);
    ck_assert_msg(st == LS_E_UNSUPPORTED && strstr(e_.msg, "tensor-core layout"),
                  "%s: the portable experts ran on packed weights (%s)", what, e_.msg);
    cm = tcm;
    st = ls_cuda_moe_forward_tc(cm, dx, dids, dw, k, dout, T, dscr, 1, 0, 0, NULL, &e_);
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
    /* every slot row through the expert-parallel path, then combined */
    long slots = k + (cm->sh_gate ? 1 : 0), n = T * slots;
    int32_t *pairs = malloc(sizeof(int32_t) * 2 * (size_t)n);
    for (long j = 0; j < n; j++) {
        pairs[2 * j] = (int32_t)(j / slots);
        pairs[2 * j + 1] = (int32_t)(j % slots);
    }
    float *dc = dalloc(4 * (size_t)(n * D)), *got = malloc(4 * T * D);
    ck_assert_msg(ls_cuda_moe_slots(cm, dx, dids, dw, k, 0, T, dup_dev(pairs, sizeof(int32_t) * 2 * (size_t)n),
                                    n, dc, dscr, 1, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
    ck_assert_msg(ls_cuda_moe_combine(dc, k, D, cm->sh_gate != NULL, dout, T, 1, 0, NULL, &e_) == LS_OK, "%s",
                  e_.msg);
    fetch(got, dout, 4 * T * D);
    char w3[200];
    snprintf(w3, sizeof w3, "%s, tensor cores, slot rows combined", what);
    ck_assert_msg(ls_gpu_same_f32(w3, tout, got, (size_t)(T * D)), "%s: differs from the call", w3);
    /* the fast tier's combine (atomic adds of the same slot rows): the tc
     * outputs up to the order of the k additions, one bf16 rounding away */
    ck_assert_msg(ls_cuda_moe_forward_fast(cm, dx, dids, dw, k, dout, T, dscr, 1, 0, 0, NULL, &e_) == LS_OK, "%s",
                  e_.msg);
    fetch(got, dout, 4 * T * D);
    float fworst = 0.0f;
    for (long i = 0; i < T * D; i++) fworst = fmaxf(fworst, fabsf(got[i] - tout[i])); /* NaN: stays 0, below */
    for (long i = 0; i < T * D; i++) ck_assert_msg(isfinite(got[i]), "%s, fast: element %ld is %g", what, i, got[i]);
    ck_assert_msg(fworst <= 0.01f * big, "%s, fast combine: max |fast - tc| %g of max |out| %g", what,
                  (double)fworst, (double)big);
    /* with fp32 activations the slot rows are not bf16, so the order of the adds shows */
    float *t32 = malloc(4 * T * D);
    ck_assert_msg(ls_cuda_moe_forward_tc(cm, dx, dids, dw, k, dout, T, dscr, 0, 0, 0, NULL, &e_) == LS_OK, "%s",
                  e_.msg);
    fetch(t32, dout, 4 * T * D);
    ck_assert_msg(ls_cuda_moe_forward_fast(cm, dx, dids, dw, k, dout, T, dscr, 0, 0, 0, NULL, &e_) == LS_OK, "%s",
                  e_.msg);
    fetch(got, dout, 4 * T * D);
    float w32 = 0.0f, b32 = 0.0f;
    for (long i = 0; i < T * D; i++) {
        b32 = fmaxf(b32, fabsf(t32[i]));
        w32 = isfinite(got[i]) ? fmaxf(w32, fabsf(got[i] - t32[i])) : INFINITY;
    }
    ck_assert_msg(w32 <= 1e-5f * b32, "%s, fast combine, fp32: max |fast - tc| %g of max |out| %g", what,
                  (double)w32, (double)b32);
    free(t32);
    printf("  ok %s, tensor cores: each token alone, reversed and the slot rows combined equal the batch; "
           "max |tc - portable| %.3g; fast combine (atomic adds) |fast - tc| %.3g with bf16, %.3g with fp32 "
           "activations (max |out| %.3g)\n", what, (double)worst, (double)fworst, (double)w32, (double)big);
    free(pairs); free(got); free(tout);
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
    /* the same experts in the tensor-core layout, where the kernels take them */
    ls_cuda_moe tcm = cm;
    if (wt_ == LS_WTYPE_BF16 && D % 16 == 0 && I % 16 == 0 && Is % 16 == 0) {
        const void **pg = calloc(E, sizeof *pg), **pu = calloc(E, sizeof *pu), **pd = calloc(E, sizeof *pd);
        void *scr = dalloc(2 * (size_t)D * (size_t)(I > Is ? I : Is));
        for (long e = 0; e < E; e++) {
            pg[e] = packed_dup(dg[e], I, D, scr);
            pu[e] = packed_dup(du[e], I, D, scr);
            pd[e] = packed_dup(dd[e], D, I, scr);
        }
        tcm.gate = dup_dev(pg, sizeof(void *) * E);
        tcm.up = dup_dev(pu, sizeof(void *) * E);
        tcm.down = dup_dev(pd, sizeof(void *) * E);
        tcm.sh_gate = shared ? packed_dup(cm.sh_gate, Is, D, scr) : NULL;
        tcm.sh_up = packed_dup(cm.sh_up, Is, D, scr);
        tcm.sh_down = packed_dup(cm.sh_down, D, Is, scr);
        tcm.tc_layout = 1;
        free(pg); free(pu); free(pd);
    }
    check_moe_tc(&cm, &tcm, x, ids, w, k, T, out, what);
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
    /* rows of 200 and 72 bytes: every other row, and every down row, not
       16-byte aligned (the lane-group plans' element-by-element path) */
    check_moe_plans(8, 100, 36, 20, 3, 7, 1, LS_WTYPE_BF16);
}
END_TEST

/* ---- direct: every linear kernel plan -------------------------------------------------- */

/* Every plan of ls_cuda_linear_plan (-1: the default choice) gives the CPU's
 * bits; woff bytes before the weights put every row off 16-byte alignment
 * (the plans' element-by-element path). */
static void check_linear_plans(long out, long in, long T, int wt_, long woff)
{
    reset_arena();
    ls_wmat w = {rand_w(out, in, wt_, 0.05f), wt_, out, in, NULL, NULL, 0};
    float *x = rand_f32((size_t)T * in, 1.0f, 0), *y = malloc(4 * T * out), *g = malloc(4 * T * out);
    ls_cpu_linear(&w, x, y, T, 0, out, 1, LS_ORDER_CANONICAL);
    uint8_t *dwb = dalloc(wbytes(out, in, wt_) + (size_t)woff);
    ls_error e_;
    ck_assert_msg(ls_cuda_upload(dwb + woff, w.data, wbytes(out, in, wt_), &e_) == LS_OK, "%s", e_.msg);
    float *dx = dup_dev(x, 4 * T * in), *dy = dalloc(4 * T * out);
    for (int plan = -1; plan < ls_cuda_linear_plan_count(); plan++) {
        ck_assert_msg(ls_cuda_linear_plan(dwb + woff, wt_, out, in, dx, dy, T, 1, LS_ORDER_CANONICAL,
                                          plan, NULL, &e_) == LS_OK, "%s", e_.msg);
        fetch(g, dy, 4 * T * out);
        char what[160];
        snprintf(what, sizeof what, "linear [%ld, %ld] T %ld %s at +%ld bytes, plan %s", out, in, T,
                 wt_ == LS_WTYPE_BF16 ? "bf16" : "fp32", woff,
                 plan < 0 ? "default" : ls_cuda_linear_plan_name(plan));
        same_f32(what, y, g, (size_t)(T * out));
        printf("  ok %s\n", what);
    }
    free((void *)w.data); free(x); free(y); free(g);
}

START_TEST(test_linear_plans)
{
    check_linear_plans(2048, 2048, 1, LS_WTYPE_BF16, 0);
    check_linear_plans(2048, 2048, 32, LS_WTYPE_BF16, 0);
    check_linear_plans(12288, 2048, g_quick ? 9 : 33, LS_WTYPE_BF16, 0);
    check_linear_plans(37, 520, 17, LS_WTYPE_BF16, 0); /* a partial row block, chunk tail, token tile */
    check_linear_plans(37, 520, 17, LS_WTYPE_BF16, 2);
    check_linear_plans(1, 300, 8, LS_WTYPE_F32, 0);
    check_linear_plans(70, 300, 12, LS_WTYPE_F32, 4);
    check_linear_plans(3, 5, 4, LS_WTYPE_BF16, 0);
}
END_TEST

/* ---- direct: the chunk-aligned GDN form on tensor cores ---------------------------------- */

/* ls_cuda_gdn_chunked_tc (docs/tensor-core-tier.md §3) on one sequence of
 * N = P + T tokens: P = 0, or a first call of P = 37 tokens that leaves the
 * state mid-chunk, then T tokens. Three splittings of the same tokens, each
 * from a zeroed state:
 *   whole   the P tokens, then the T in one call (T > 1024: the kernel's
 *           own pieces);
 *   cut     calls that end at the marks (positions mid-chunk and at a
 *           chunk's end, and the last), the state materialised at each;
 *   pieces  calls of 1 for the first 70 positions, then of 7, 64, 65, 256
 *           in turn, also ending at the marks, materialised there.
 * The three give the same o and the same whole tc state
 * (LS_CUDA_GDN_TC_STATE_FLOATS), and cut and pieces the same materialised
 * states, bit for bit: row r of a chunk reads rows <= r only. Against the
 * portable chunk-aligned kernel (ls_cuda_gdn_chunked, the CPU's bits) on the
 * cut calls, o and every materialised state are within 2 % of the largest
 * portable |value| (TF32 products: a wrong row, decay or fold is far off).
 * Each call is given exactly ls_cuda_gdn_tc_scratch_bytes of its T. */
#define LS_CONF_GDN_TC_P 37        /* the mid-chunk start's first call */
#define LS_CONF_GDN_TC_TMAX 1100   /* the longest T: more than one of the kernel's pieces */
#define LS_CONF_GDN_TC_MARKS 8

typedef struct gdn_tc_seq {
    long Hk, Hv, dk, dv;
    int act;
    const float *q, *k, *v, *al, *be; /* device: [N, Hk, dk] twice, [N, Hv, dv], [N, Hv] twice */
    void *scr;                        /* device scratch of the largest call */
    long marks[LS_CONF_GDN_TC_MARKS]; /* ascending positions whose materialised state is compared */
    int n_marks;
} gdn_tc_seq;

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* The last positions of the calls that run positions 0 .. N-1 (ascending,
 * into ends [N]); returns their count. pieces 0: a call ending at P-1 (when
 * P > 0) and one ending at N-1; 1: the pieces schedule. Every mark also ends
 * a call unless whole is set. */
static long gdn_tc_ends(const gdn_tc_seq *s, long N, long P, int pieces, int whole, long *ends)
{
    static const long cycle[] = {7, 64, 65, 256};
    long n = 0;
    if (pieces) {
        int ci = 0;
        for (long pos = 0; pos < N;) {
            long m = pos < 70 ? 1 : cycle[ci++ % 4];
            pos = pos + m < N ? pos + m : N;
            ends[n++] = pos - 1;
        }
    } else {
        if (P > 0) ends[n++] = P - 1;
        ends[n++] = N - 1;
    }
    for (int i = 0; i < s->n_marks && !whole; i++) ends[n++] = s->marks[i];
    qsort(ends, (size_t)n, sizeof *ends, cmp_long);
    long u = 0;
    for (long i = 0; i < n; i++)
        if (u == 0 || ends[i] != ends[u - 1]) ends[u++] = ends[i];
    return u;
}

/* Runs positions 0 .. ends[n-1] in the calls ending at ends[] from a zeroed
 * state, on tensor cores (tc 1) or the portable kernel (0); after a call
 * ending at mark i materialises the state into mats + i Hv dk dv (device). */
static void gdn_tc_run(const gdn_tc_seq *s, int tc, const long *ends, long n, float *state, float *o, float *mats)
{
    size_t SN = (size_t)(s->Hv * s->dk * s->dv);
    size_t sf = tc ? LS_CUDA_GDN_TC_STATE_FLOATS(s->Hv, s->dk, s->dv)
                   : LS_GDN_CHUNK_STATE_FLOATS(s->Hv, s->dk, s->dv);
    long nk = s->Hk * s->dk, nv = s->Hv * s->dv;
    ls_error e_;
    ck_assert_msg(ls_cuda_memset(state, 0, 4 * sf, &e_) == LS_OK, "%s", e_.msg);
    long pos = 0;
    for (long c = 0; c < n; c++) {
        long m = ends[c] + 1 - pos;
        ls_status st;
        if (tc)
            st = ls_cuda_gdn_chunked_tc(s->q + pos * nk, s->k + pos * nk, s->v + pos * nv, s->al + pos * s->Hv,
                                        s->be + pos * s->Hv, state, o + pos * nv, m, pos, s->Hk, s->Hv, s->dk,
                                        s->dv, s->act, s->scr, ls_cuda_gdn_tc_scratch_bytes(m, s->Hv, s->dk, s->dv),
                                        NULL, &e_);
        else
            st = ls_cuda_gdn_chunked(s->q + pos * nk, s->k + pos * nk, s->v + pos * nv, s->al + pos * s->Hv,
                                     s->be + pos * s->Hv, state, o + pos * nv, m, pos, s->Hk, s->Hv, s->dk, s->dv,
                                     s->act, LS_ORDER_CANONICAL, NULL, &e_);
        ck_assert_msg(st == LS_OK, "gdn %s, %ld tokens at %ld: %s", tc ? "tc" : "portable", m, pos, e_.msg);
        pos = ends[c] + 1;
        for (int i = 0; i < s->n_marks; i++) {
            if (s->marks[i] != ends[c]) continue;
            st = tc ? ls_cuda_gdn_chunked_tc_state(state, ends[c], mats + i * SN, s->Hv, s->dk, s->dv, NULL, &e_)
                    : ls_cuda_gdn_chunked_state(state, ends[c], mats + i * SN, s->Hv, s->dk, s->dv, NULL, &e_);
            ck_assert_msg(st == LS_OK, "gdn %s state at %ld: %s", tc ? "tc" : "portable", ends[c], e_.msg);
        }
    }
}

/* a and b bit for bit (memcmp); else prints the first differing element
 * with both values' bits and fails. */
static void same_bits(const char *what, const float *a, const float *b, size_t n)
{
    if (memcmp(a, b, 4 * n) == 0) return;
    ls_gpu_same_f32(what, a, b, n);
    ck_abort_msg("%s: not bitwise equal", what);
}

/* max |got - want| / max |want| over n values (infinite when got is not
 * finite somewhere); fails above 2 %. */
static double near_portable(const char *what, const float *want, const float *got, size_t n)
{
    float big = 0.0f, worst = 0.0f;
    for (size_t i = 0; i < n; i++) {
        big = fmaxf(big, fabsf(want[i]));
        worst = isfinite(got[i]) ? fmaxf(worst, fabsf(got[i] - want[i])) : INFINITY;
    }
    double rel = big > 0.0f ? (double)worst / (double)big : (double)worst;
    ck_assert_msg(rel <= 2e-2, "%s: max |tc - portable| %g of max |portable| %g (%.3g)", what, (double)worst,
                  (double)big, rel);
    return rel;
}

/* Host inputs of N tokens as the engine feeds the step: q, k L2-normalised
 * per head (q scaled by 1/sqrt(dk)), α = exp(-e^a softplus(x)) in (0, 1)
 * with every 13th near 1e-30, β a sigmoid; bf16-exact under act. */
static void gdn_tc_inputs(long N, long Hk, long Hv, long dk, long dv, int act, float **q, float **k, float **v,
                          float **al, float **be)
{
    size_t nq = (size_t)(N * Hk * dk), nh = (size_t)(N * Hv);
    *q = rand_f32(nq, 1.0f, act);
    *k = rand_f32(nq, 1.0f, act);
    *v = rand_f32((size_t)(N * Hv * dv), 1.0f, act);
    ls_cpu_l2norm_scale(*q, N * Hk, dk, ls_cpu_inv_sqrt_scale(dk), LS_ORDER_CANONICAL);
    ls_cpu_l2norm_scale(*k, N * Hk, dk, 1.0f, LS_ORDER_CANONICAL);
    for (size_t i = 0; i < nq && act; i++) {
        (*q)[i] = ls_round_bf16((*q)[i]);
        (*k)[i] = ls_round_bf16((*k)[i]);
    }
    *al = malloc(4 * nh);
    *be = malloc(4 * nh);
    for (size_t i = 0; i < nh; i++) {
        float x = ls_gpu_rand_f32(&g_seed, 4.0f), a = ls_gpu_rand_f32(&g_seed, 2.0f);
        float sp = x > 20.0f ? x : log1pf(expf(x));
        (*al)[i] = i % 13 == 5 ? 1e-30f : expf(-expf(a) * sp);
        if (!((*al)[i] > 0.0f)) (*al)[i] = 1e-30f;
        float b = 1.0f / (1.0f + expf(-ls_gpu_rand_f32(&g_seed, 4.0f)));
        (*be)[i] = act ? ls_round_bf16(b) : b;
    }
}

static void check_gdn_tc(long Hk, long Hv, long dk, long dv, int act)
{
    reset_arena();
    static const long Ts_full[] = {1, 63, 64, 65, 200, LS_CONF_GDN_TC_TMAX}, Ts_quick[] = {1, 64, 65};
    const long *Ts = g_quick ? Ts_quick : Ts_full;
    int nT = g_quick ? 3 : 6;
    long NMAX = LS_CONF_GDN_TC_P + Ts[nT - 1];
    long nk = Hk * dk, nv = Hv * dv;
    size_t SN = (size_t)(Hv * dk * dv), SF = LS_CUDA_GDN_TC_STATE_FLOATS(Hv, dk, dv);
    size_t PF = LS_GDN_CHUNK_STATE_FLOATS(Hv, dk, dv), OF = (size_t)(NMAX * nv);
    float *q, *k, *v, *al, *be;
    gdn_tc_inputs(NMAX, Hk, Hv, dk, dv, act, &q, &k, &v, &al, &be);
    gdn_tc_seq s = {Hk, Hv, dk, dv, act, dup_dev(q, 4 * NMAX * nk), dup_dev(k, 4 * NMAX * nk),
                    dup_dev(v, 4 * OF), dup_dev(al, 4 * NMAX * Hv), dup_dev(be, 4 * NMAX * Hv), NULL, {0}, 0};
    size_t scr_bytes = 0;
    for (long t = 1; t <= NMAX; t++) {
        size_t b = ls_cuda_gdn_tc_scratch_bytes(t, Hv, dk, dv);
        scr_bytes = b > scr_bytes ? b : scr_bytes;
    }
    ls_error e_;
    ck_assert_msg(ls_cuda_malloc(&s.scr, scr_bytes ? scr_bytes : 256, &e_) == LS_OK, "%s", e_.msg);
    /* device: o and state of each run (whole, cut, pieces tc; cut portable), materialised states */
    float *d_o[4], *d_st[4], *d_m[4];
    for (int r = 0; r < 4; r++) {
        d_o[r] = dalloc(4 * OF);
        d_st[r] = dalloc(4 * (r == 3 ? PF : SF));
        d_m[r] = dalloc(4 * SN * LS_CONF_GDN_TC_MARKS);
    }
    float *h_o[4], *h_st[3], *h_m[4];
    for (int r = 0; r < 4; r++) {
        h_o[r] = malloc(4 * OF);
        h_m[r] = malloc(4 * SN * LS_CONF_GDN_TC_MARKS);
        if (r < 3) h_st[r] = malloc(4 * SF);
    }
    long *ends = malloc(sizeof(long) * (size_t)(NMAX + LS_CONF_GDN_TC_MARKS));
    double worst_o = 0.0, worst_s = 0.0;
    long calls = 0;
    for (int ti = 0; ti < nT; ti++)
        for (long P = 0; P <= LS_CONF_GDN_TC_P; P += LS_CONF_GDN_TC_P) {
            long T = Ts[ti], N = P + T;
            /* mid-chunk rows 40, 64, 100, 1000; chunk ends 63, 127, 1023; the last position */
            static const long cand[] = {40, 63, 64, 100, 127, 1000, 1023};
            s.n_marks = 0;
            for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++)
                if (cand[i] >= P && cand[i] < N - 1) s.marks[s.n_marks++] = cand[i];
            s.marks[s.n_marks++] = N - 1;
            int last = s.n_marks - 1;
            char what[200];
            snprintf(what, sizeof what, "gdn tc Hk %ld Hv %ld dk %ld dv %ld act %d, T %ld at %ld", Hk, Hv, dk, dv,
                     act, T, P);
            /* whole, cut, pieces on tensor cores; cut on the portable kernel */
            for (int r = 0; r < 4; r++) {
                long n = gdn_tc_ends(&s, N, P, r == 2, r == 0, ends);
                gdn_tc_run(&s, r < 3, ends, n, d_st[r], d_o[r], d_m[r]);
                calls += n;
                fetch(h_o[r], d_o[r], 4 * (size_t)(N * nv));
                /* the whole run ends at no mark but the last */
                size_t m0 = r == 0 ? (size_t)last * SN : 0;
                fetch(h_m[r] + m0, d_m[r] + m0, 4 * (SN * (size_t)s.n_marks - m0));
                if (r < 3) fetch(h_st[r], d_st[r], 4 * SF);
            }
            static const char *const run_name[] = {"whole", "cut at the marks", "in pieces"};
            char w2[300];
            for (int r = 1; r < 3; r++) {
                snprintf(w2, sizeof w2, "%s: o %s vs whole", what, run_name[r]);
                same_bits(w2, h_o[0], h_o[r], (size_t)(N * nv));
                snprintf(w2, sizeof w2, "%s: tc state %s vs whole", what, run_name[r]);
                same_bits(w2, h_st[0], h_st[r], SF);
            }
            snprintf(w2, sizeof w2, "%s: materialised state at %ld, whole vs in pieces", what, N - 1);
            same_bits(w2, h_m[0] + last * SN, h_m[2] + last * SN, SN);
            for (int i = 0; i < s.n_marks; i++) {
                snprintf(w2, sizeof w2, "%s: materialised state at %ld, cut vs in pieces", what, s.marks[i]);
                same_bits(w2, h_m[1] + i * SN, h_m[2] + i * SN, SN);
            }
            snprintf(w2, sizeof w2, "%s: o", what);
            worst_o = fmax(worst_o, near_portable(w2, h_o[3], h_o[1], (size_t)(N * nv)));
            for (int i = 0; i < s.n_marks; i++) {
                snprintf(w2, sizeof w2, "%s: materialised state at %ld", what, s.marks[i]);
                worst_s = fmax(worst_s, near_portable(w2, h_m[3] + i * SN, h_m[1] + i * SN, SN));
            }
        }
    printf("  ok gdn tc Hk %ld Hv %ld dk %ld dv %ld act %d: T 1 .. %ld at 0 and %d, whole = cut = in pieces bit "
           "for bit (o, state, materialised states; %ld calls); vs portable max rel |d| o %.3g state %.3g\n", Hk,
           Hv, dk, dv, act, Ts[nT - 1], LS_CONF_GDN_TC_P, calls, worst_o, worst_s);
    fflush(stdout);
    /* a scratch one byte short of what the call needs is refused */
    long T = 65;
    size_t need = ls_cuda_gdn_tc_scratch_bytes(T, Hv, dk, dv);
    ls_error_clear(&e_);
    ls_status st = ls_cuda_gdn_chunked_tc(s.q, s.k, s.v, s.al, s.be, d_st[0], d_o[0], T, 0, Hk, Hv, dk, dv, act,
                                          s.scr, need - 1, NULL, &e_);
    ck_assert_msg(need > 0 && st != LS_OK && strstr(e_.msg, "scratch"),
                  "%ld tokens with %zu of %zu scratch bytes: status %d, '%s'", T, need - 1, need, (int)st, e_.msg);
    ls_cuda_free(s.scr);
    for (int r = 0; r < 4; r++) {
        free(h_o[r]); free(h_m[r]);
        if (r < 3) free(h_st[r]);
    }
    free(ends); free(q); free(k); free(v); free(al); free(be);
}

/* A batched decode step (ls_cuda_gdn_chunked_tc_decode) against each
 * sequence's own one-position call: nseq sequences whose states were run
 * to prefixes of 0 .. 200 positions (the step at a chunk's first row, inside
 * one and at its last, which folds), their step's inputs at scattered rows;
 * outputs and whole states bit for bit. */
static void check_gdn_tc_decode_batch(long Hk, long Hv, long dk, long dv, int act, long nseq)
{
    reset_arena();
    static const long prefix[] = {0, 1, 31, 63, 64, 100, 127, 200};
    const long np = (long)(sizeof prefix / sizeof prefix[0]), PMAX = 200, N = PMAX + nseq;
    long nk = Hk * dk, nv = Hv * dv;
    size_t SF = LS_CUDA_GDN_TC_STATE_FLOATS(Hv, dk, dv);
    float *q, *k, *v, *al, *be;
    gdn_tc_inputs(N, Hk, Hv, dk, dv, act, &q, &k, &v, &al, &be);
    float *dq = dup_dev(q, 4 * (size_t)(N * nk)), *dk_ = dup_dev(k, 4 * (size_t)(N * nk));
    float *dv_ = dup_dev(v, 4 * (size_t)(N * nv)), *dal = dup_dev(al, 4 * (size_t)(N * Hv));
    float *dbe = dup_dev(be, 4 * (size_t)(N * Hv));
    size_t pre_b = ls_cuda_gdn_tc_scratch_bytes(PMAX, Hv, dk, dv), dec_b = ls_cuda_gdn_tc_decode_scratch_bytes(nseq, Hv, dk, dv);
    void *scr = dalloc(pre_b > dec_b ? pre_b : dec_b);
    float *zero = calloc(SF, 4), **st_b = malloc(sizeof(float *) * (size_t)nseq);
    float *st_1 = dalloc(4 * SF), *o_b = dalloc(4 * (size_t)(N * nv)), *o_1 = dalloc(4 * (size_t)(N * nv));
    long *row = malloc(sizeof(long) * (size_t)nseq), *pos = malloc(sizeof(long) * (size_t)nseq);
    float *h_b = malloc(4 * SF), *h_1 = malloc(4 * SF), *ho_b = malloc(4 * (size_t)nv), *ho_1 = malloc(4 * (size_t)nv);
    ls_error e_;
    for (long s = 0; s < nseq; s++) {
        pos[s] = prefix[s % np];
        row[s] = N - 1 - (s * 11) % nseq; /* distinct rows above the prefixes, out of order */
        st_b[s] = dup_dev(zero, 4 * SF);
        if (pos[s] > 0)
            ck_assert_msg(ls_cuda_gdn_chunked_tc(dq, dk_, dv_, dal, dbe, st_b[s], o_b, pos[s], 0, Hk, Hv, dk, dv, act,
                                                 scr, pre_b, NULL, &e_) == LS_OK, "%s", e_.msg);
    }
    ck_assert_msg(ls_cuda_gdn_chunked_tc_decode(dq, dk_, dv_, dal, dbe, st_b, row, pos, nseq, o_b, Hk, Hv, dk, dv,
                                                act, scr, dec_b, NULL, &e_) == LS_OK, "%s", e_.msg);
    char what[200];
    for (long s = 0; s < nseq; s++) {
        ck_assert_msg(ls_cuda_upload(st_1, zero, 4 * SF, &e_) == LS_OK, "%s", e_.msg);
        if (pos[s] > 0)
            ck_assert_msg(ls_cuda_gdn_chunked_tc(dq, dk_, dv_, dal, dbe, st_1, o_1, pos[s], 0, Hk, Hv, dk, dv, act,
                                                 scr, pre_b, NULL, &e_) == LS_OK, "%s", e_.msg);
        long r = row[s];
        ck_assert_msg(ls_cuda_gdn_chunked_tc(dq + r * nk, dk_ + r * nk, dv_ + r * nv, dal + r * Hv, dbe + r * Hv, st_1,
                                             o_1 + r * nv, 1, pos[s], Hk, Hv, dk, dv, act, scr, pre_b, NULL,
                                             &e_) == LS_OK, "%s", e_.msg);
        fetch(h_b, st_b[s], 4 * SF);
        fetch(h_1, st_1, 4 * SF);
        fetch(ho_b, o_b + r * nv, 4 * (size_t)nv);
        fetch(ho_1, o_1 + r * nv, 4 * (size_t)nv);
        snprintf(what, sizeof what, "gdn tc decode batch Hk %ld Hv %ld dk %ld dv %ld: sequence %ld at %ld, o", Hk,
                 Hv, dk, dv, s, pos[s]);
        same_bits(what, ho_1, ho_b, (size_t)nv);
        snprintf(what, sizeof what, "gdn tc decode batch Hk %ld Hv %ld dk %ld dv %ld: sequence %ld at %ld, state",
                 Hk, Hv, dk, dv, s, pos[s]);
        same_bits(what, h_1, h_b, SF);
    }
    /* a scratch one byte short is refused */
    ls_error_clear(&e_);
    ls_status st = ls_cuda_gdn_chunked_tc_decode(dq, dk_, dv_, dal, dbe, st_b, row, pos, nseq, o_b, Hk, Hv, dk, dv,
                                                 act, scr, dec_b - 1, NULL, &e_);
    ck_assert_msg(st != LS_OK && strstr(e_.msg, "scratch"), "decode batch with a short scratch: status %d, '%s'",
                  (int)st, e_.msg);
    printf("  ok gdn tc decode batch Hk %ld Hv %ld dk %ld dv %ld act %d: %ld sequences at positions 0 .. %ld in one "
           "step = each alone (o, whole state)\n", Hk, Hv, dk, dv, act, nseq, PMAX);
    fflush(stdout);
    free(zero); free(st_b); free(row); free(pos); free(h_b); free(h_1); free(ho_b); free(ho_1);
    free(q); free(k); free(v); free(al); free(be);
}

/* Shapes the tensor-core form does not take fail closed, naming the
 * dimension (null inputs: the check comes before any launch). */
static void check_gdn_tc_refused(void)
{
    static const long shapes[][3] = {{40, 32, 'k'}, {144, 32, 'k'}, {32, 48, 'v'}, {64, 100, 'v'}};
    void *scr = NULL;
    size_t bytes = (size_t)64 << 20;
    ls_error e_;
    ck_assert_msg(ls_cuda_malloc(&scr, bytes, &e_) == LS_OK, "%s", e_.msg);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        long dk = shapes[i][0], dv = shapes[i][1];
        const char *field = shapes[i][2] == 'k' ? "dk" : "dv";
        ls_error_clear(&e_);
        ls_status st = ls_cuda_gdn_chunked_tc(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 0, 1, 2, dk, dv, 1, scr,
                                              bytes, NULL, &e_);
        ck_assert_msg(st == LS_E_UNSUPPORTED && strstr(e_.msg, field), "gdn tc dk %ld dv %ld: status %d, '%s'",
                      dk, dv, (int)st, e_.msg);
        printf("  ok gdn tc dk %ld dv %ld refused: %s\n", dk, dv, e_.msg);
    }
    ls_cuda_free(scr);
}

/* The fast tier's GDN (ls_cuda_gdn_fast): T tokens after a recurrent
 * prefix of P, in chunks counted from the call's start, near the recurrent
 * kernel's outputs and final state; the same tokens in two calls are near
 * the one call too, and whether they are bitwise equal (they need not be:
 * the chunks start elsewhere) is printed. */
static void check_gdn_fast(long Hk, long Hv, long dk, long dv, int act)
{
    reset_arena();
    const long P = 100, T = 150, T1 = 70, N = P + T;
    long nk = Hk * dk, nv = Hv * dv;
    size_t SN = (size_t)(Hv * dk * dv);
    float *q, *k, *v, *al, *be;
    gdn_tc_inputs(N, Hk, Hv, dk, dv, act, &q, &k, &v, &al, &be);
    float *dq = dup_dev(q, 4 * (size_t)(N * nk)), *dk_ = dup_dev(k, 4 * (size_t)(N * nk));
    float *dv_ = dup_dev(v, 4 * (size_t)(N * nv)), *dal = dup_dev(al, 4 * (size_t)(N * Hv));
    float *dbe = dup_dev(be, 4 * (size_t)(N * Hv)), *zero = calloc(SN, 4);
    float *st[3], *o[3], *ho[3], *hs[3];
    for (int r = 0; r < 3; r++) {
        st[r] = dup_dev(zero, 4 * SN);
        o[r] = dalloc(4 * (size_t)(N * nv));
        ho[r] = malloc(4 * (size_t)(T * nv));
        hs[r] = malloc(4 * SN);
    }
    size_t sb = ls_cuda_gdn_fast_scratch_bytes(T, Hv, dk, dv);
    void *scr = dalloc(sb);
    ls_error e_;
    /* the prefix, recurrent, into every state; then r 0 recurrent, 1 fast whole, 2 fast in two calls */
    for (int r = 0; r < 3; r++)
        ck_assert_msg(ls_cuda_gdn_recurrent(dq, dk_, dv_, dal, dbe, st[r], o[r], P, Hk, Hv, dk, dv, act, 0, NULL, &e_)
                          == LS_OK, "%s", e_.msg);
    ck_assert_msg(ls_cuda_gdn_recurrent(dq + P * nk, dk_ + P * nk, dv_ + P * nv, dal + P * Hv, dbe + P * Hv, st[0],
                                        o[0] + P * nv, T, Hk, Hv, dk, dv, act, 0, NULL, &e_) == LS_OK, "%s", e_.msg);
    for (int r = 1; r < 3; r++)
        for (long t0 = P; t0 < N;) {
            long n = r == 1 ? T : t0 == P ? T1 : N - t0;
            ck_assert_msg(ls_cuda_gdn_fast(dq + t0 * nk, dk_ + t0 * nk, dv_ + t0 * nv, dal + t0 * Hv, dbe + t0 * Hv,
                                           st[r], o[r] + t0 * nv, n, Hk, Hv, dk, dv, act, scr, sb, NULL, &e_) == LS_OK,
                          "%s", e_.msg);
            t0 += n;
        }
    for (int r = 0; r < 3; r++) {
        fetch(ho[r], o[r] + P * nv, 4 * (size_t)(T * nv));
        fetch(hs[r], st[r], 4 * SN);
    }
    char what[200];
    snprintf(what, sizeof what, "gdn fast Hk %ld Hv %ld dk %ld dv %ld act %d, %ld tokens after %ld", Hk, Hv, dk, dv,
             act, T, P);
    double ro = near_portable(what, ho[0], ho[1], (size_t)(T * nv)), rs = near_portable(what, hs[0], hs[1], SN);
    double r2 = near_portable(what, ho[1], ho[2], (size_t)(T * nv));
    int same = !memcmp(ho[1], ho[2], 4 * (size_t)(T * nv));
    ck_assert_msg(ls_cuda_gdn_fast(dq, dk_, dv_, dal, dbe, st[1], o[1], T, Hk, Hv, dk, dv, act, scr, sb - 1, NULL,
                                   &e_) != LS_OK && strstr(e_.msg, "scratch"), "a short scratch was not refused");
    printf("  ok %s: vs recurrent max rel |d| o %.3g state %.3g; in calls of %ld + %ld vs one call %.3g (%s)\n", what,
           ro, rs, T1, T - T1, r2, same ? "bitwise equal" : "not bitwise equal");
    fflush(stdout);
    for (int r = 0; r < 3; r++) {
        free(ho[r]); free(hs[r]);
    }
    free(zero); free(q); free(k); free(v); free(al); free(be);
}

START_TEST(test_gdn_tc)
{
    check_gdn_tc_refused();
    check_gdn_tc(2, 4, 32, 32, 0);
    check_gdn_tc(4, 8, 64, 64, 1);
    check_gdn_tc(16, 32, 128, 128, 1);
    check_gdn_tc_decode_batch(2, 4, 32, 32, 0, 70); /* two launches of at most 64 */
    check_gdn_tc_decode_batch(16, 32, 128, 128, 1, 9);
    check_gdn_fast(2, 4, 32, 32, 0);
    check_gdn_fast(16, 32, 128, 128, 1);
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

/* ---- the tc backend's expert tables: every matrix packed once --------------------------- */

/* One moe call on backend be: x [T, D], ids and weights [T, k]; out [T, D]
 * downloaded into got. */
static void be_moe(ls_backend *be, const ls_bmoe *mw, const float *x, const int32_t *ids, const float *w,
                   long k, long T, float *got)
{
    ls_error err;
    ls_buf *bx = bo_buf(be, (size_t)(T * mw->D)), *bi = bo_buf(be, (size_t)(T * k)),
           *bw = bo_buf(be, (size_t)(T * k)), *bo = bo_buf(be, (size_t)(T * mw->D));
    ck_assert_msg(be->upload(be, vw(bx), x, 4 * (size_t)(T * mw->D), &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(be->upload(be, vw(bi), ids, 4 * (size_t)(T * k), &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(be->upload(be, vw(bw), w, 4 * (size_t)(T * k), &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(be->moe(be, mw, vw(bx), vw(bi), vw(bw), k, vw(bo), T, 1, LS_ORDER_CANONICAL, LS_ORDER_CANONICAL,
                          &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(be->download(be, got, vw(bo), 4 * (size_t)(T * mw->D), &err) == LS_OK, "%s", err.msg);
}

/* A tc backend rewrites each expert matrix into the tensor-core layout when
 * a table first names it (backend_cuda.c moe_tables): a table holding half
 * the experts, then two tables (other keys) holding all of them, over the
 * same matrices, give the bits a fresh backend gives for the whole call; a
 * matrix packed twice would be scrambled. */
START_TEST(test_tc_tables_pack_once)
{
    enum { E = 4, D = 64, I = 32, Is = 48, k = 2, T = 6, NM = 3 * E + 4 /* + the shared four */ };
    ls_error err;
    ls_backend_cuda_opts o;
    ls_backend_cuda_opts_default(&o);
    o.arena_bytes = (size_t)64 << 20;
    o.tier = LS_TIER_TC;
    void *host[NM];
    long shape[NM][2];
    for (long e = 0; e < E; e++) {
        shape[e][0] = shape[E + e][0] = I, shape[e][1] = shape[E + e][1] = D;
        shape[2 * E + e][0] = D, shape[2 * E + e][1] = I;
    }
    long sh[4][2] = {{Is, D}, {Is, D}, {D, Is}, {1, D}};
    for (int i = 0; i < 4; i++) shape[3 * E + i][0] = sh[i][0], shape[3 * E + i][1] = sh[i][1];
    for (long i = 0; i < NM; i++) host[i] = rand_w(shape[i][0], shape[i][1], LS_WTYPE_BF16, 0.05f);
    float *x = rand_f32((size_t)(T * D), 1.0f, 1), *w = malloc(4 * T * k);
    int32_t half[T * k], all[T * k];
    for (long t = 0; t < T; t++)
        for (long i = 0; i < k; i++) {
            half[t * k + i] = (int32_t)((t + i) % 2);      /* experts 0 and 1 only */
            all[t * k + i] = (int32_t)((t + 3 * i) % E);
            w[t * k + i] = ls_round_bf16(0.25f + 0.125f * (float)i);
        }
    float *ref = malloc(4 * T * D), *got = malloc(4 * T * D);
    ls_backend *bes[2];
    ls_bweight bw[2][NM];
    for (int b = 0; b < 2; b++) {
        ck_assert_msg(ls_backend_cuda_create_opts(&o, &bes[b], &err) == LS_OK, "%s", err.msg);
        for (long i = 0; i < NM; i++) {
            bw[b][i] = (ls_bweight){NULL, 0, LS_WTYPE_BF16, shape[i][0], shape[i][1], NULL};
            ck_assert_msg(bes[b]->wrap_weights(bes[b], host[i], 2 * (size_t)(shape[i][0] * shape[i][1]),
                                               LS_WTYPE_BF16, &bw[b][i].buf, &err) == LS_OK, "%s", err.msg);
        }
    }
    ls_bweight *W = bw[1];
    ls_bmoe whole0 = {E, D, I, Is, bw[0], bw[0] + E, bw[0] + 2 * E, bw[0] + 3 * E, bw[0] + 3 * E + 1,
                      bw[0] + 3 * E + 2, bw[0] + 3 * E + 3};
    be_moe(bes[0], &whole0, x, all, w, k, T, ref);
    /* the other backend: experts 2 and 3 not held, then all of them twice */
    ls_bweight part[3 * E], again[3 * E];
    memcpy(part, W, sizeof part);
    memcpy(again, W, sizeof again);
    for (long e = 2; e < E; e++) part[e].buf = part[E + e].buf = part[2 * E + e].buf = NULL;
    ls_bmoe pm = {E, D, I, Is, part, part + E, part + 2 * E, W + 3 * E, W + 3 * E + 1, W + 3 * E + 2, W + 3 * E + 3};
    be_moe(bes[1], &pm, x, half, w, k, T, got);
    ls_bmoe whole1 = {E, D, I, Is, W, W + E, W + 2 * E, W + 3 * E, W + 3 * E + 1, W + 3 * E + 2, W + 3 * E + 3};
    ls_bmoe whole2 = whole1;
    whole2.gate = again, whole2.up = again + E, whole2.down = again + 2 * E;
    be_moe(bes[1], &whole1, x, all, w, k, T, got);
    ck_assert_msg(ls_gpu_same_f32("tc moe after a half table", ref, got, (size_t)(T * D)),
                  "a table over matrices an earlier table packed differs from a fresh backend's");
    be_moe(bes[1], &whole2, x, all, w, k, T, got);
    ck_assert_msg(ls_gpu_same_f32("tc moe, a third table", ref, got, (size_t)(T * D)),
                  "a third table over the same matrices differs from a fresh backend's");
    for (int b = 0; b < 2; b++) bes[b]->destroy(bes[b]);
    for (long i = 0; i < NM; i++) free(host[i]);
    free(x); free(w); free(ref); free(got);
    printf("  ok tc backend: tables over half, then all of the experts (two keys) equal a fresh backend's "
           "call bit for bit (every matrix packed once)\n");
}
END_TEST

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
    /* A plan that gives every (token, expert) pair its own tile, asked for more
     * tiles than one launch holds (7000 tokens x top-10): refused before
     * anything runs. */
    ls_cuda_moe cm = {.E = 512, .D = 2048, .I = 512, .Is = 0, .wtype = LS_WTYPE_BF16};
    ck_assert_int_eq(ls_cuda_moe_forward_plan(&cm, NULL, NULL, NULL, 10, NULL, 7000, NULL, 1, 0, 0, 3, NULL,
                                              &err), LS_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "65535") != NULL, "%s", err.msg);
    printf("  ok fail closed: GDN dk 256, attention d 512, conv K 9, reversed linear, "
           "mixed-dtype MoE, a one-pair MoE plan past 65535 tiles\n");
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
    tcase_add_test(td, test_linear_plans);
    tcase_add_test(td, test_gdn_tc);
    tcase_add_test(td, test_fail_closed);
    tcase_add_test(td, test_tc_tables_pack_once);
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
