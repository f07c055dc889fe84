/* lockstep — CUDA runtime services for the portable strict tier (C API).
 *
 * Everything here is callable from C without CUDA headers: streams are passed
 * as opaque pointers (a cudaStream_t, NULL = the default stream), device
 * memory as plain pointers. Every failing CUDA call is reported through
 * ls_fail with LS_E_DEVICE, naming the call, file, line and a hint.
 *
 * Device memory for a run comes from one ls_cuda_arena: a single cudaMalloc
 * at the start, bump allocation inside it, one cudaFree at the end. */
#ifndef LS_KERNELS_LS_CUDA_H
#define LS_KERNELS_LS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/platform.h"
#include "core/status.h"

/* Number of usable CUDA devices; 0 when there is no driver, no device, or the
 * runtime fails to initialise (never an error: callers skip or fail closed). */
int ls_cuda_device_count(void);

/* Checks that `device` is a CUDA ordinal of this machine (0 .. count-1).
 * LS_E_USAGE otherwise, with one line naming the visible devices:
 * "no CUDA device 5: this machine has 2 (0: NVIDIA H200, 1: NVIDIA H200)",
 * plus CUDA_VISIBLE_DEVICES when it is set (it decides what is visible). */
ls_status ls_cuda_check_device(int device, ls_error *err);

/* Makes `device` the calling thread's current CUDA device (cudaSetDevice,
 * skipped when it already is). The runtime's current device is per thread:
 * every thread that allocates, copies or launches for a run calls this
 * first. LS_E_USAGE for a device that does not exist (ls_cuda_check_device). */
ls_status ls_cuda_use_device(int device, ls_error *err);

/* Fills *out for CUDA device `device`. Returns LS_E_DEVICE (message naming
 * the failing call) when no device can be queried. cuBLAS and NCCL are not
 * linked by the portable tier: their versions are 0. */
ls_status ls_cuda_query_device(int device, ls_gpu_info *out, ls_error *err);

/* ---- arena ------------------------------------------------------------------ */
typedef struct ls_cuda_arena {
    uint8_t *base;          /* device memory from one cudaMalloc; owned */
    size_t capacity_bytes;  /* size of base */
    size_t used_bytes;      /* bump offset, 256-byte aligned steps */
    int device;             /* CUDA ordinal the memory is on */
    size_t device_total_bytes; /* that device's memory in all (for messages) */
} ls_cuda_arena;

/* Allocates capacity_bytes of device memory (cudaMalloc) on the current
 * device. A capacity the device cannot give fails with LS_E_NOMEM ("out of
 * GPU memory", the bytes asked and the device's free and total bytes). */
ls_status ls_cuda_arena_init(ls_cuda_arena *a, size_t capacity_bytes, ls_error *err);
/* Returns 256-byte aligned device memory inside the arena (contents undefined),
 * or NULL and LS_E_NOMEM in err when the arena is full: "out of GPU memory",
 * the bytes asked, the arena's free and total bytes and the device's. */
void *ls_cuda_arena_alloc(ls_cuda_arena *a, size_t bytes, ls_error *err);
/* Frees the arena's memory (safe on a zeroed or already freed arena). */
void ls_cuda_arena_free(ls_cuda_arena *a);

/* ---- copies and synchronisation --------------------------------------------- */
ls_status ls_cuda_upload(void *dst_dev, const void *src_host, size_t bytes, ls_error *err);
ls_status ls_cuda_download(void *dst_host, const void *src_dev, size_t bytes, ls_error *err);
ls_status ls_cuda_memset(void *dst_dev, int value, size_t bytes, ls_error *err);
/* Device to device, not overlapping. */
ls_status ls_cuda_copy(void *dst_dev, const void *src_dev, size_t bytes, ls_error *err);
/* One block copy: rows x groups blocks of len 4-byte elements,
 * dst[r*dst_stride + g*dst_step + i] = src[r*src_stride + g*src_step + i]. */
typedef struct ls_cuda_copy_job {
    float *dst;
    const float *src;
    long rows, groups, len, dst_stride, dst_step, src_stride, src_step;
} ls_cuda_copy_job;
#define LS_CUDA_COPY_JOBS_MAX 8
/* n (1..LS_CUDA_COPY_JOBS_MAX) block copies in one launch; no job's dst
 * overlaps any job's src or another job's dst. */
ls_status ls_cuda_copy_blocks(const ls_cuda_copy_job *jobs, int n, void *stream, ls_error *err);
/* Synthetic weights (benchmarks at shapes whose weights are not on disk):
 * n bf16 values, element i = bf16(scale u), u uniform in [-1, 1) from
 * splitmix64(seed + (i + 1) golden gamma): a counter-based generator, so
 * element i depends only on (seed, i). Read as fp32 (pairs of elements, the
 * upper one high), each value is finite and within one bf16 ulp of a
 * generated value, so a buffer of either dtype holds values of that spread. */
ls_status ls_cuda_fill_uniform_bf16(uint16_t *dst, size_t n, uint64_t seed, float scale,
                                    void *stream, ls_error *err);
/* Synthetic FP8 weights: n e4m3fn bytes, byte i = ls_f32_to_e4m3(448 u),
 * u the value ls_cuda_fill_uniform_bf16 draws for element i with the same
 * seed (448 u is one fp32 product, rounded to nearest even). The bytes span
 * the whole e4m3 range as those of a block-quantised release do (each block
 * scaled so its largest element maps to ±448); u >= -1 and finite, so every
 * byte is finite: never 0x7F or 0xFF (the e4m3fn NaNs); u = -1 gives 0xFE
 * (-448). The values a matrix stands for come with its block scales. */
ls_status ls_cuda_fill_e4m3(uint8_t *dst, size_t n, uint64_t seed, void *stream, ls_error *err);
/* lockstep synth's values on the device (docs/synth.md, "The same weights
 * without a checkpoint"): n bf16 values, dst[i] = element first + i of the
 * tensor whose values are bf16_rne(base + fp32(fp32(ih_j) · c)), ih_j the
 * centred Irwin–Hall integer (ls_synth_irwin_hall) of splitmix64 draw j
 * under key (ls_synth_draw); the same integer mixing and fp32 operations in
 * the same order as synth_gen.c fill_normal_at (the build forbids FMA
 * contraction), so the same bits as ls_synth_fill_rows. */
ls_status ls_cuda_fill_synth_bf16(uint16_t *dst, size_t n, uint64_t key, uint64_t first, float c,
                                  float base, void *stream, ls_error *err);
/* Rows r0 .. r0 + n - 1 of an FP8 matrix [rows, cols] of those values,
 * quantised as synth --fp8 writes them: e4m3 bytes into dst [n, cols] and
 * the block scales amax / 448 (1 for an all-zero block) of the blocks from
 * r0 / 128 on into scale [ceil(n/128), ceil(cols/128)]. A range that does
 * not hold whole 128-row blocks is cut from the blocks around it (scratch
 * device memory, freed before return); the call returns after the device
 * finished (it synchronises stream). */
ls_status ls_cuda_fill_synth_e4m3(uint8_t *dst, float *scale, long r0, long n, long rows,
                                  long cols, uint64_t key, float c, float base, void *stream,
                                  ls_error *err);
/* Free device memory on the current device in bytes (0 on failure). */
size_t ls_cuda_mem_free_bytes(void);
/* Free and total memory of the current device in bytes (cudaMemGetInfo:
 * what the driver reports, the same number nvidia-smi's free column shows). */
ls_status ls_cuda_mem_info(size_t *free_bytes, size_t *total_bytes, ls_error *err);
/* Plain cudaMalloc / cudaFree for buffers outside the arena (scratch that grows). */
ls_status ls_cuda_malloc(void **p, size_t bytes, ls_error *err);
void ls_cuda_free(void *p);
/* Waits for all work on the device and reports any asynchronous kernel error. */
ls_status ls_cuda_sync(ls_error *err);

/* ---- streams and graphs (a backend's step graphs) ----------------------------
 * A stream of ls_cuda_stream_create is a blocking one: work on it is ordered
 * with the synchronous copies above (which use the legacy default stream),
 * as work on the default stream is. Between ls_cuda_capture_begin and
 * ls_cuda_capture_end the calling thread's launches on the stream are
 * recorded into a graph instead of run (cudaStreamCaptureModeThreadLocal: a
 * synchronous copy or allocation in that thread fails the recording).
 * capture_end with keep instantiates the graph into *exec (replacing and
 * destroying what *exec held); without keep, or when the recording failed, it
 * drops it (*exec unchanged) and clears the error the recording left. */
ls_status ls_cuda_stream_create(void **out, ls_error *err);
void ls_cuda_stream_destroy(void *stream);
ls_status ls_cuda_capture_begin(void *stream, ls_error *err);
ls_status ls_cuda_capture_end(void *stream, int keep, void **exec, ls_error *err);
ls_status ls_cuda_graph_launch(void *exec, void *stream, ls_error *err);
void ls_cuda_graph_destroy(void *exec);
/* Work enqueued on `waiter` from now on starts after the work enqueued on
 * `waited` so far (ev: an event of ls_cuda_event_create, recorded on waited).
 * While waited is captured, this forks a branch of the graph onto waiter;
 * the other way round it joins the branch back, as the capture must before
 * it ends. */
ls_status ls_cuda_event_create(void **out, ls_error *err);
void ls_cuda_event_destroy(void *ev);
ls_status ls_cuda_stream_after(void *waiter, void *waited, void *ev, ls_error *err);
ls_status ls_cuda_host_alloc(void **p, size_t bytes, ls_error *err);
void ls_cuda_host_free(void *p);

/* Programmatic dependent launch of the step kernels (kernels/launch.cuh):
 * on (the default), a kernel may start while the one before it on its
 * stream finishes, and waits for it before it touches its data; off, every
 * kernel starts after the one before it has ended. No bit depends on it: it
 * exists to measure the overlap. Set it between steps, not while another
 * thread launches; a step graph keeps the setting it was recorded with. */
void ls_cuda_set_programmatic_launch(int on);
int ls_cuda_programmatic_launch(void);

#ifdef __cplusplus
}
#endif

#endif
