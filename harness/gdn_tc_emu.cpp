/* lockstep — the tensor-core chunk-aligned GDN (kernels/ops_gdn_tc.cu) run on
 * the host under harness/simt_emu.h, through its own host entry points
 * (ls_cuda_gdn_chunked_tc, ls_cuda_gdn_chunked_tc_decode,
 * ls_cuda_gdn_chunked_tc_state), with a model of the tensor cores:
 *
 *   - WMMA (nvcuda::wmma, 16x16x8 tf32): every lane of a warp holds the whole
 *     tile of a fragment; an output element is its accumulator plus the
 *     products of k 0..3, then of k 4..7, added in k order in fp32;
 *   - PTX mma.m16n8k4 tf32 (inline asm, replaced by harness/gdn_tc_emu when
 *     it cuts the kernels out of the .cu file): the registers in PTX's
 *     fragment layouts, exchanged across the warp, each output element its
 *     accumulator plus its four products in k order in fp32;
 *   - tf32 rounding (cvt.rna.tf32.f32, wmma::__float_to_tf32): to nearest,
 *     ties away from zero, the low 13 bits cleared.
 *
 * The model is not the hardware's order of addition (no figure here is a
 * GPU's), but it is one fixed order shared by both forms, so two versions of
 * the kernels that do the same operations in the same order give the same
 * bits here, and a version that reads a wrong element, skips a barrier's
 * worth of data or reads shared memory before it is written (it starts as
 * NaN) shows. What it checks, per case (shape, act, tokens):
 *   - calls of 7 and 64 tokens, and decode steps of two sequences at once
 *     (the batched decode launch), equal one whole call bit for bit:
 *     outputs, the whole state after the call, the materialised state;
 *   - the whole call against the CPU's fp32 recurrence (ls_cpu_gdn_recurrent):
 *     outputs and the materialised state within a tf32 tolerance;
 *   - prints a digest of every case's bits: `harness/gdn_tc_emu BUILD
 *     --against REV` compares it with the kernels of another revision.
 *
 *   gdn_tc_emu [quick]   (built and run by harness/gdn_tc_emu) */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "simt_emu.h"

extern "C" {
#include "backend/cpu_ops.h"
#include "core/status.h"
}
#include "ops.h"
#include "gdn_emu.h"

/* ---- the CUDA runtime and the kernels' helpers ------------------------------------------- */
typedef int cudaError_t;
typedef void *cudaStream_t;
enum { cudaSuccess = 0, cudaFuncAttributeMaxDynamicSharedMemorySize = 8, cudaMemcpyDeviceToDevice = 3 };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
static inline const char *cudaGetErrorString(cudaError_t) { return "emulated"; }
static inline cudaError_t cudaGetLastError() { return cudaSuccess; }
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F, int, int bytes)
{
    if (bytes > EMU_DYN_SMEM) {
        fprintf(stderr, "gdn_tc_emu: a kernel asks for %d bytes of shared memory (the emulation has %d)\n", bytes,
                EMU_DYN_SMEM);
        exit(2);
    }
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int, cudaStream_t)
{
    memmove(dst, src, n);
    return cudaSuccess;
}
#define LS_CUDA_CHECK(call, err, hint)                                                          \
    do {                                                                                        \
        if ((call) != cudaSuccess) return ls_fail((err), LS_E_DEVICE, "emulated: %s", (hint));  \
    } while (0)
#define LS_CUDA_CHECK_LAUNCH(name, err) (void)(name)
#define LS_CUDA_REQUIRE(cond, err, ...)                                      \
    do {                                                                     \
        if (!(cond)) return ls_fail((err), LS_E_UNSUPPORTED, __VA_ARGS__);   \
    } while (0)
static inline unsigned ls_blocks_for(long n, int per_block) { return (unsigned)((n + per_block - 1) / per_block); }

template <typename... P, typename... A>
static inline cudaError_t ls_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t,
                                    A... args)
{
    if (smem > EMU_DYN_SMEM) {
        fprintf(stderr, "gdn_tc_emu: a launch with %zu bytes of shared memory (the emulation has %d)\n", smem,
                EMU_DYN_SMEM);
        exit(2);
    }
    emu_launch(grid.x, grid.y, block.x, [=] { kernel(args...); }, grid.z);
    return cudaSuccess;
}

/* ---- the tensor-core model --------------------------------------------------------------- */
static inline float emu_tf32(float v) /* cvt.rna.tf32.f32, as a float */
{
    unsigned u = __float_as_uint(v);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
    return __uint_as_float(u);
}

static inline float emu_k4(float c, const float *a, int as, const float *b, int bs)
{
    for (int k = 0; k < 4; k++) {
        float p = a[k * as] * b[k * bs];
        c = c + p;
    }
    return c;
}

/* the kernels' inline-asm helpers (harness/gdn_tc_emu cuts their definitions) */
static inline unsigned ls_gdnt_tf32(float v) { return __float_as_uint(emu_tf32(v)); }

static struct { float a[16][4], b[4][8], c[16][8]; } emu_mma_x[EMU_MAX_THREADS / 32];

/* mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32: g = lane / 4, t = lane % 4;
 * a0 (g, t), a1 (g + 8, t); b (k t, n g); c (g, 2t) (g, 2t + 1) (g + 8, 2t) (g + 8, 2t + 1). */
static void ls_gdnt_mma4(float *c, unsigned a0, unsigned a1, unsigned b)
{
    const int l = (int)threadIdx.x % 32, g = l / 4, t = l % 4;
    auto &x = emu_mma_x[threadIdx.x / 32];
    __syncwarp();
    x.a[g][t] = __uint_as_float(a0);
    x.a[g + 8][t] = __uint_as_float(a1);
    x.b[t][g] = __uint_as_float(b);
    __syncwarp();
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int e = 0; e < 4; e++) c[e] = emu_k4(c[e], &x.a[rows[e]][0], 1, &x.b[0][cols[e]], 8);
    __syncwarp();
}

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}
enum layout_t { mem_row_major, mem_col_major };

/* a whole tile in every lane: A [16][8], B [8][16], C [16][16] */
template <typename Use, int M, int N, int K, typename T, typename L = void> struct fragment;
template <typename L> struct fragment<matrix_a, 16, 16, 8, precision::tf32, L> {
    enum { num_elements = 128 };
    float x[128];
};
template <typename L> struct fragment<matrix_b, 16, 16, 8, precision::tf32, L> {
    enum { num_elements = 128 };
    float x[128];
};
template <> struct fragment<accumulator, 16, 16, 8, float, void> {
    enum { num_elements = 256 };
    float x[256];
};

static inline float __float_to_tf32(float v) { return emu_tf32(v); }

/* rows x cols of p (row-major at ld, or column-major) into x, row-major */
static inline void emu_tile(float *x, const float *p, unsigned ld, int rows, int cols, bool row)
{
    __syncwarp();
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) x[i * cols + j] = row ? p[i * ld + j] : p[j * ld + i];
}
template <typename L> static inline void load_matrix_sync(fragment<matrix_a, 16, 16, 8, precision::tf32, L> &f,
                                                          const float *p, unsigned ld)
{
    emu_tile(f.x, p, ld, 16, 8, std::is_same<L, row_major>::value);
}
template <typename L> static inline void load_matrix_sync(fragment<matrix_b, 16, 16, 8, precision::tf32, L> &f,
                                                          const float *p, unsigned ld)
{
    emu_tile(f.x, p, ld, 8, 16, std::is_same<L, row_major>::value);
}
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 8, float> &f, const float *p, unsigned ld,
                                    layout_t l)
{
    emu_tile(f.x, p, ld, 16, 16, l == mem_row_major);
}
static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 8, float> &f, unsigned ld,
                                     layout_t l)
{
    __syncwarp();
    if (threadIdx.x % 32 == 0)
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) (l == mem_row_major ? p[i * ld + j] : p[j * ld + i]) = f.x[i * 16 + j];
    __syncwarp();
}
static inline void fill_fragment(fragment<accumulator, 16, 16, 8, float> &f, float v)
{
    for (float &x : f.x) x = v;
}
template <typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 8, float> &d,
                            const fragment<matrix_a, 16, 16, 8, precision::tf32, LA> &a,
                            const fragment<matrix_b, 16, 16, 8, precision::tf32, LB> &b,
                            const fragment<accumulator, 16, 16, 8, float> &c)
{
    __syncwarp();
    float out[256];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = emu_k4(c.x[i * 16 + j], &a.x[i * 8], 1, &b.x[j], 16);
            out[i * 16 + j] = emu_k4(s, &a.x[i * 8 + 4], 1, &b.x[4 * 16 + j], 16);
        }
    memcpy(d.x, out, sizeof out);
}
} // namespace wmma
} // namespace nvcuda

#include "gdn_tc_body.inc"

/* ---- the cases --------------------------------------------------------------------------- */
static uint64_t emu_digest = 1469598103934665603ull; /* FNV-1a over every bit compared */

static void digest(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned u = __float_as_uint(x[i]);
        for (int b = 0; b < 4; b++) emu_digest = (emu_digest ^ ((u >> (8 * b)) & 0xff)) * 1099511628211ull;
    }
}

static int same(const char *what, const std::vector<float> &want, const std::vector<float> &got)
{
    return emu_same(what, want.data(), got.data(), want.size());
}

/* max |a - b| / max |b| */
static double rel_err(const std::vector<float> &a, const std::vector<float> &b)
{
    double m = 0, top = 0;
    for (size_t i = 0; i < a.size(); i++) {
        m = fmax(m, fabs((double)a[i] - (double)b[i]));
        top = fmax(top, fabs((double)b[i]));
    }
    return top > 0 ? m / top : m;
}

struct inputs {
    long T, Hk, Hv, dk, dv;
    std::vector<float> q, k, v, al, be;
};

static inputs make_inputs(long T, long Hk, long Hv, long dk, long dv, int act)
{
    inputs in{T, Hk, Hv, dk, dv, {}, {}, {}, {}, {}};
    emu_inputs(T, Hk, Hv, dk, dv, act, in.q, in.k, in.v, in.al, in.be);
    return in;
}

#define TRY(call)                                                          \
    do {                                                                   \
        ls_error err_;                                                     \
        if ((call) != LS_OK) {                                             \
            printf("gdn_tc_emu: %s:%d: %s\n", __FILE__, __LINE__, err_.msg); \
            exit(2);                                                       \
        }                                                                  \
    } while (0)
#define E_ (&err_)

/* The sequence in calls of `split` tokens (0: one call) through
 * ls_cuda_gdn_chunked_tc: outputs, the whole state after it, the state
 * materialised at its last position. */
static void run_calls(const inputs &in, long split, int act, std::vector<float> &o, std::vector<float> &st,
                      std::vector<float> &mat)
{
    const long T = in.T, Hk = in.Hk, Hv = in.Hv, dk = in.dk, dv = in.dv, n = split ? split : T;
    o.assign(T * Hv * dv, 0.0f);
    st.assign(LS_CUDA_GDN_TC_STATE_FLOATS(Hv, dk, dv), 0.0f);
    mat.assign(Hv * dk * dv, 0.0f);
    std::vector<float> scratch(ls_cuda_gdn_tc_scratch_bytes(n, Hv, dk, dv) / sizeof(float) + 4);
    for (long t = 0; t < T; t += n) {
        long m = T - t < n ? T - t : n;
        TRY(ls_cuda_gdn_chunked_tc(&in.q[t * Hk * dk], &in.k[t * Hk * dk], &in.v[t * Hv * dv], &in.al[t * Hv],
                                   &in.be[t * Hv], st.data(), &o[t * Hv * dv], m, t, Hk, Hv, dk, dv, act,
                                   scratch.data(), scratch.size() * sizeof(float), NULL, E_));
    }
    TRY(ls_cuda_gdn_chunked_tc_state(st.data(), T - 1, mat.data(), Hv, dk, dv, NULL, E_));
}

/* Two sequences a and b, one position of each per launch
 * (ls_cuda_gdn_chunked_tc_decode), b one position behind a. */
static void run_decode(const inputs &a, const inputs &b, int act, std::vector<float> &oa, std::vector<float> &ob,
                       std::vector<float> &sa, std::vector<float> &sb)
{
    const long T = a.T, Hk = a.Hk, Hv = a.Hv, dk = a.dk, dv = a.dv;
    oa.assign(T * Hv * dv, 0.0f);
    ob.assign(T * Hv * dv, 0.0f);
    sa.assign(LS_CUDA_GDN_TC_STATE_FLOATS(Hv, dk, dv), 0.0f);
    sb = sa;
    std::vector<float> scratch(ls_cuda_gdn_tc_decode_scratch_bytes(2, Hv, dk, dv) / sizeof(float) + 4);
    std::vector<float> q(2 * Hk * dk), k(2 * Hk * dk), v(2 * Hv * dv), al(2 * Hv), be(2 * Hv), o(2 * Hv * dv);
    const inputs *src[2] = {&a, &b};
    std::vector<float> *out[2] = {&oa, &ob}, *st[2] = {&sa, &sb};
    for (long step = 0; step <= T; step++) {
        long pos[2], row0[2], n = 0;
        float *states[2];
        int seq[2];
        for (int s = 0; s < 2; s++) {
            const long p = step - s; /* b one position behind a */
            if (p < 0 || p >= T) continue;
            const inputs &x = *src[s];
            memcpy(&q[n * Hk * dk], &x.q[p * Hk * dk], sizeof(float) * Hk * dk);
            memcpy(&k[n * Hk * dk], &x.k[p * Hk * dk], sizeof(float) * Hk * dk);
            memcpy(&v[n * Hv * dv], &x.v[p * Hv * dv], sizeof(float) * Hv * dv);
            memcpy(&al[n * Hv], &x.al[p * Hv], sizeof(float) * Hv);
            memcpy(&be[n * Hv], &x.be[p * Hv], sizeof(float) * Hv);
            states[n] = st[s]->data();
            row0[n] = n;
            pos[n] = p;
            seq[n] = s;
            n++;
        }
        TRY(ls_cuda_gdn_chunked_tc_decode(q.data(), k.data(), v.data(), al.data(), be.data(), states, row0, pos, n,
                                          o.data(), Hk, Hv, dk, dv, act, scratch.data(),
                                          scratch.size() * sizeof(float), NULL, E_));
        for (long i = 0; i < n; i++)
            memcpy(&(*out[seq[i]])[pos[i] * Hv * dv], &o[i * Hv * dv], sizeof(float) * Hv * dv);
    }
}

static int run_case(long Hk, long Hv, long dk, long dv, long T, int act)
{
    inputs a = make_inputs(T, Hk, Hv, dk, dv, act), b = make_inputs(T, Hk, Hv, dk, dv, act);
    std::vector<float> o, st, mat, o2, st2, mat2;
    run_calls(a, 0, act, o, st, mat);
    digest(o.data(), o.size());
    digest(st.data(), st.size());
    digest(mat.data(), mat.size());
    int ok = 1;
    for (long split : {7L, 64L}) {
        run_calls(a, split, act, o2, st2, mat2);
        char what[64];
        snprintf(what, sizeof what, "calls of %ld: outputs", split);
        ok &= same(what, o, o2);
        snprintf(what, sizeof what, "calls of %ld: state", split);
        ok &= same(what, st, st2);
        snprintf(what, sizeof what, "calls of %ld: materialised state", split);
        ok &= same(what, mat, mat2);
    }
    /* decode: a against its whole call, b against its own */
    std::vector<float> ob, stb, matb, da, db, sa, sb;
    run_calls(b, 0, act, ob, stb, matb);
    run_decode(a, b, act, da, db, sa, sb);
    ok &= same("decode, sequence a: outputs", o, da) && same("decode, sequence a: state", st, sa);
    ok &= same("decode, sequence b: outputs", ob, db) && same("decode, sequence b: state", stb, sb);
    /* the CPU's fp32 recurrence */
    std::vector<float> ro(T * Hv * dv), rs(Hv * dk * dv, 0.0f), scr(LS_CPU_GDN_SCRATCH_FLOATS(dv));
    ls_cpu_gdn_recurrent(a.q.data(), a.k.data(), a.v.data(), a.al.data(), a.be.data(), rs.data(), ro.data(), T, Hk,
                         Hv, dk, dv, scr.data(), act, LS_ORDER_CANONICAL);
    double eo = rel_err(o, ro), es = rel_err(mat, rs);
    int close = eo < 2e-2 && es < 2e-2;
    ok &= close;
    printf("%s Hk %ld Hv %ld dk %ld dv %ld T %ld act %s: calls of 7 and 64 and decode = whole; vs the CPU "
           "recurrence: outputs %.2e, state %.2e%s\n",
           ok ? "  ok" : "FAIL", Hk, Hv, dk, dv, T, act ? "bf16" : "fp32", eo, es, close ? "" : " (too far)");
    fflush(stdout);
    return !ok;
}

int main(int argc, char **argv)
{
    int quick = argc == 2 && !strcmp(argv[1], "quick");
    if (argc != 1 && !quick) {
        fprintf(stderr, "usage: gdn_tc_emu [quick]\n");
        return 2;
    }
    /* Hk Hv dk dv T act: the models' d = 128, the smallest shapes, a value
     * width of 96 (output blocks of 32 columns), GQA */
    static const long cases[][6] = {
        {1, 2, 32, 32, 140, 0}, {1, 1, 128, 128, 130, 1}, {2, 4, 48, 64, 70, 0}, {1, 2, 64, 96, 66, 1},
    };
    size_t n = quick ? 2 : sizeof cases / sizeof cases[0];
    int bad = 0;
    emu_rng = 777;
    for (size_t i = 0; i < n; i++) {
        const long *c = cases[i];
        bad |= run_case(c[0], c[1], c[2], c[3], c[4], (int)c[5]);
    }
    printf("digest %016llx\n", (unsigned long long)emu_digest);
    return bad;
}
