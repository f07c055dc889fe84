/* lockstep — the portable GDN kernels run on the host under a small SIMT
 * emulation, against the CPU reference, bit for bit: the chunk-aligned ones
 * of kernels/ops_gdn_chunked.cu (ls_cpu_gdn_chunked_heads,
 * ls_cpu_gdn_chunked_state_heads: outputs, the whole carried state, the
 * materialised state) and the recurrent ones of kernels/ops_gdn.cu (the
 * scan kernel and the decode-step kernel against ls_cpu_gdn_recurrent:
 * outputs and states of several sequences in one launch). A check of the
 * kernel source where no GPU is at hand; it proves nothing about the GPU's
 * scheduling (harness/gpu_check's racecheck does that), only that the
 * source's arithmetic and indexing are the CPU's. Built and run by
 * harness/gdn_chunked_emu, which cuts the kernels out of the .cu file.
 *
 * The kernels run under harness/simt_emu.h (a fiber per CUDA thread). */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "simt_emu.h"

extern "C" {
#include "backend/cpu_ops.h"
}
#include "ops.h" /* LS_CUDA_GDN_MAX_DK, LS_CUDA_GDN_CHUNK */
#include "gdn_emu.h"

typedef struct ls_cuda_seqs { /* kernels/ops_common.cuh's */
    long row0[LS_CUDA_SEQ_CHUNK];
    long len[LS_CUDA_SEQ_CHUNK];
    float *state[LS_CUDA_SEQ_CHUNK];
} ls_cuda_seqs;

#include "kernels_body.inc"
#include "kernels_recurrent.inc"

/* ---- one case ------------------------------------------------------------------------ */
/* T tokens at pos0 (the emulated kernels in calls of split, 0 = one) against
 * the CPU in one call; the chunk's earlier rows and S0 random. 1 = differ. */
static int run(long Hk, long Hv, long dk, long dv, long T, long pos0, long split, int act)
{
    size_t SF = LS_GDN_CHUNK_STATE_FLOATS(Hv, dk, dv), SN = (size_t)(Hv * dk * dv);
    std::vector<float> q, k, v, al, be;
    emu_inputs(T, Hk, Hv, dk, dv, act, q, k, v, al, be);
    std::vector<float> s_cpu(SF), o_cpu(T * Hv * dv), m_cpu(SN), o_emu(T * Hv * dv), m_emu(SN);
    for (float &x : s_cpu) x = emu_rand(0.1f);
    for (size_t i = SF - (size_t)(Hv * LS_GDN_CHUNK); i < SF; i++) s_cpu[i] = 0.5f + 0.5f * fabsf(emu_rand(1.0f));
    std::vector<float> s_emu = s_cpu, scratch(LS_CPU_GDN_CHUNK_SCRATCH_FLOATS(dv));
    ls_cpu_gdn_chunked_heads(q.data(), k.data(), v.data(), al.data(), be.data(), s_cpu.data(), o_cpu.data(), T,
                             pos0, Hk, Hv, dk, dv, 0, Hv, scratch.data(), act, LS_ORDER_CANONICAL);
    ls_cpu_gdn_chunked_state_heads(s_cpu.data(), pos0 + T - 1, Hv, dk, dv, 0, Hv, m_cpu.data(), scratch.data());
    long n = split ? split : T;
    float *S = s_emu.data();
    for (long t = 0; t < T; t += n) {
        long m = T - t < n ? T - t : n, p0 = pos0 + t;
        const float *qt = &q[t * Hk * dk], *kt = &k[t * Hk * dk], *vt = &v[t * Hv * dv];
        const float *at = &al[t * Hv], *bt = &be[t * Hv];
        float *ot = &o_emu[t * Hv * dv];
        /* the launches of ls_cuda_gdn_chunked (keep in step with it) */
        emu_launch((unsigned)((dv + 31) / 32), (unsigned)Hv, 128,
                   [=] { ls_gdn_chunked_kernel(qt, kt, vt, at, bt, S, ot, m, p0, Hk, Hv, dk, dv, act); });
        emu_launch((unsigned)Hv, 1, 128, [=] { ls_gdn_chunk_rows_kernel(kt, at, S, m, p0, Hk, Hv, dk, dv); });
    }
    float *M = m_emu.data(); /* ls_cuda_gdn_chunked_state's launch */
    emu_launch((unsigned)((dk * dv + 255) / 256), (unsigned)Hv, 256,
               [=] { ls_gdn_chunked_state_kernel(S, pos0 + T - 1, M, Hv, dk, dv); });
    int ok = emu_same("o", o_cpu.data(), o_emu.data(), o_cpu.size()) &&
             emu_same("state", s_cpu.data(), s_emu.data(), SF) && emu_same("materialised state", m_cpu.data(), M, SN);
    printf("%s Hk %ld Hv %ld dk %ld dv %ld T %ld at %ld calls of %ld act %s\n", ok ? "  ok" : "FAIL", Hk, Hv, dk,
           dv, T, pos0, split ? split : T, act ? "bf16" : "fp32");
    fflush(stdout);
    return !ok;
}

/* nseq sequences of lens[s] tokens (0: none) packed in one call, each on its
 * own random state, as ls_cuda_gdn_recurrent_batch launches them (a decode
 * step, every length <= 1, through ls_gdn_decode_kernel; else the scan
 * kernel), against ls_cpu_gdn_recurrent per sequence. 1 = differ. */
static int run_recurrent(long Hk, long Hv, long dk, long dv, long nseq, const long *lens, int act)
{
    long T = 0, most = 0;
    std::vector<long> row0(nseq), len(lens, lens + nseq);
    for (long s = 0; s < nseq; s++) {
        row0[s] = T;
        T += len[s];
        most = len[s] > most ? len[s] : most;
    }
    size_t SN = (size_t)(Hv * dk * dv);
    std::vector<float> q, k, v, al, be;
    emu_inputs(T, Hk, Hv, dk, dv, act, q, k, v, al, be);
    std::vector<float> s_cpu(SN * nseq), o_cpu(T * Hv * dv), o_emu(T * Hv * dv), scratch(LS_CPU_GDN_SCRATCH_FLOATS(dv));
    for (float &x : s_cpu) x = emu_rand(0.1f);
    std::vector<float> s_emu = s_cpu;
    ls_cuda_seqs sq;
    memset(&sq, 0, sizeof sq);
    for (long s = 0; s < nseq; s++) {
        if (len[s] > 0)
            ls_cpu_gdn_recurrent(&q[row0[s] * Hk * dk], &k[row0[s] * Hk * dk], &v[row0[s] * Hv * dv], &al[row0[s] * Hv],
                                 &be[row0[s] * Hv], &s_cpu[s * SN], &o_cpu[row0[s] * Hv * dv], len[s], Hk, Hv, dk, dv,
                                 scratch.data(), act, LS_ORDER_CANONICAL);
        sq.row0[s] = row0[s];
        sq.len[s] = len[s];
        sq.state[s] = &s_emu[s * SN];
    }
    const float *qp = q.data(), *kp = k.data(), *vp = v.data(), *ap = al.data(), *bp = be.data();
    float *op = o_emu.data();
    /* the launches of ls_cuda_gdn_recurrent_batch (keep in step with it) */
    if (most == 1)
        emu_launch((unsigned)((dv + 31) / 32), (unsigned)Hv, 32,
                   [=] { ls_gdn_decode_kernel(qp, kp, vp, ap, bp, sq, op, Hk, Hv, dk, dv, act); }, (unsigned)nseq);
    else
        emu_launch((unsigned)((dv + LS_GDN_CPW * LS_GDN_WPB - 1) / (LS_GDN_CPW * LS_GDN_WPB)), (unsigned)Hv,
                   LS_GDN_WPB * 32, [=] { ls_gdn_recurrent_kernel(qp, kp, vp, ap, bp, sq, op, Hk, Hv, dk, dv, act); },
                   (unsigned)nseq);
    int ok = emu_same("o", o_cpu.data(), o_emu.data(), o_cpu.size()) && emu_same("states", s_cpu.data(), s_emu.data(), s_cpu.size());
    printf("%s recurrent (%s kernel) Hk %ld Hv %ld dk %ld dv %ld, %ld sequences, %ld rows, act %s\n",
           ok ? "  ok" : "FAIL", most == 1 ? "decode" : "scan", Hk, Hv, dk, dv, nseq, T, act ? "bf16" : "fp32");
    fflush(stdout);
    return !ok;
}

/* Hk Hv dk dv T pos0 split act: one chunk-aligned case; "quick": the first
 * three chunk-aligned cases of the default set and the first two recurrent
 * ones (the unit suite's, ~10 s); no arguments: the default set (GQA, dk 40
 * .. 128, partial column tiles, pos0 inside a chunk, calls of 1, 7 and 64,
 * more new rows than a chunk holds, the fold at a chunk's end; decode steps
 * and scans of several sequences, one without rows; a few minutes). */
int main(int argc, char **argv)
{
    if (argc == 9)
        return run(atol(argv[1]), atol(argv[2]), atol(argv[3]), atol(argv[4]), atol(argv[5]), atol(argv[6]),
                   atol(argv[7]), atoi(argv[8]));
    int quick = argc == 2 && !strcmp(argv[1], "quick");
    if (argc != 1 && !quick) {
        fprintf(stderr, "usage: gdn_chunked_emu [quick | Hk Hv dk dv T pos0 split act]\n");
        return 2;
    }
    static const long cases[][8] = {
        {1, 2, 40, 20, 70, 0, 0, 1},    {3, 3, 77, 33, 9, 60, 1, 0},   {1, 1, 48, 40, 67, 190, 7, 0},
        {2, 6, 40, 72, 140, 3, 64, 0},  {1, 2, 96, 48, 67, 190, 0, 1}, {1, 2, 128, 40, 130, 63, 7, 1},
        {1, 1, 128, 128, 1, 127, 0, 1}, {1, 1, 128, 128, 1, 100, 0, 0}, {1, 2, 128, 128, 70, 5, 0, 1},
    };
    /* Hk Hv dk dv act nseq lens... */
    static const long rec[][10] = {
        {2, 4, 128, 128, 1, 4, 1, 1, 0, 1}, {3, 3, 77, 33, 0, 3, 1, 1, 1, 0},
        {1, 2, 48, 96, 0, 3, 5, 1, 3, 0},   {2, 4, 128, 128, 1, 2, 3, 2, 0, 0},
    };
    int bad = 0;
    size_t n = quick ? 3 : sizeof cases / sizeof cases[0];
    for (size_t i = 0; i < n; i++) {
        const long *c = cases[i];
        bad |= run(c[0], c[1], c[2], c[3], c[4], c[5], c[6], (int)c[7]);
    }
    n = quick ? 2 : sizeof rec / sizeof rec[0];
    for (size_t i = 0; i < n; i++) {
        const long *c = rec[i];
        bad |= run_recurrent(c[0], c[1], c[2], c[3], c[5], c + 6, (int)c[4]);
    }
    return bad;
}
