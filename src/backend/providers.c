/* lockstep — provider registry tables. CPU rows follow docs/numerics.md and
 * name the cpu_ops.h functions backend_cpu.c actually calls (the engine runs
 * every op through that table, digests included); the
 * CUDA rows are added by the CUDA backend. */
#include "backend/providers.h"

#include <string.h>

#define CPU(op, kernel, tile, acc, order) \
    {op, "cpu-reference", kernel, tile, "none", acc, order, "portable", "strict"}

/* Strict CPU reference (docs/numerics.md §2-§6). */
static const ls_provider cpu_rows[] = {
    CPU("linear", "ls_cpu_linear", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("rmsnorm", "ls_cpu_rmsnorm", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("gated_rmsnorm", "ls_cpu_gated_rmsnorm", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("conv_silu", "ls_cpu_conv_silu", "-", "fp32", "sequential-taps"),
    CPU("gdn_gates", "ls_cpu_gdn_gates", "-", "fp32", "elementwise"),
    CPU("l2norm", "ls_cpu_l2norm_scale", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("gdn_recurrent", "ls_cpu_gdn_recurrent_heads", "1x32", "fp32", "gdn-recurrent-dot32"),
    CPU("rope", "ls_cpu_rope_table+ls_cpu_rope_apply", "-", "fp32", "elementwise"),
    CPU("attention", "ls_cpu_attention_heads", "1x32", "fp32", "online-softmax-block32"),
    CPU("router_softmax", "ls_cpu_router", "1x32", "fp32", "dot32-max-exp-sum32"),
    CPU("topk", "ls_cpu_router", "-", "fp32", "sequential-topk-order"),
    CPU("renormalise", "ls_cpu_router", "-", "fp32", "sequential-topk-order"),
    CPU("experts", "ls_cpu_moe_slot", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("combine", "ls_cpu_moe_combine", "-", "fp32", "sequential-topk-order"),
    CPU("shared_expert", "ls_cpu_moe_slot", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("lm_head", "ls_cpu_linear", "1x32", "fp32", "dot32-lanes32-butterfly"),
    CPU("logprobs", "ls_cpu_logprobs", "1x32", "fp32", "max-exp-sum32-log"),
    CPU("lp_summary", "ls_cpu_lp_summary", "-", "fp32", "sequential-topk-order"),
    CPU("sampling", "ls_sample_select", "-", "fp32", "greedy-lower-id-or-counter-rng"),
    CPU("digest", "cpu_digest (OpenSSL EVP SHA-256, jobs split across threads)", "-", "none",
        "sha256-row-major"),
};

#define CUDA(op, kernel, tile, order) \
    {op, "cuda-portable", kernel, tile, "none", "fp32", order, "portable", "strict"}

/* The chunk-aligned GDN form (docs/numerics.md §5.1; ls_engine_opts.gdn_chunked):
 * the row that replaces gdn_recurrent's in a manifest. The CUDA kernels do
 * the CPU's operations in the CPU's order, hence the same order id. */
static const ls_provider cpu_gdn_chunked =
    CPU("gdn_recurrent", "ls_cpu_gdn_chunked_heads", "1x32", "fp32", "gdn-chunk-aligned-64-dot32");
static const ls_provider cuda_gdn_chunked =
    CUDA("gdn_recurrent", "ls_gdn_chunked_kernel+ls_gdn_chunk_rows_kernel+ls_gdn_chunked_state_kernel",
         "4warps x 8cols/block, lane = key rows l+32r in registers, chunk key rows in shared memory",
         "gdn-chunk-aligned-64-dot32");

/* The tc and fast tiers' chunk-aligned form (docs/tensor-core-tier.md §3):
 * its own arithmetic, the products with the state on tensor cores. */
#define TC_GDN(provider) \
    {"gdn_recurrent", provider, "ls_gdnt_rows_kernel+ls_gdnt_state_kernel+ls_gdnt_out_kernel+ls_gdnt_mat_kernel", \
     "chunks of 64 at absolute positions; blocks per chunk and head (rows), per chunk, head and 128 value " \
     "columns (outputs; 64 or 32 where d_v is not a multiple of 128), per head and 32 value columns (state); " \
     "16x16 tiles of PTX mma.m16n8k4 tf32 pairs (WMMA 16x16x8's instructions on sm_90), fp32 accumulate", "none", \
     "fp32", "chunk-aligned-64-wmma-tf32", \
     "tensor-core", "strict"}
static const ls_provider cuda_tc_gdn_chunked = TC_GDN("cuda-tensor-core");
static const ls_provider cuda_fast_gdn_chunked = TC_GDN("cuda-fast");

const ls_provider *ls_backend_gdn_chunked_provider(const char *backend, ls_tier tier)
{
    if (!backend) return NULL;
    if (!strcmp(backend, "cpu")) return tier == LS_TIER_PORTABLE ? &cpu_gdn_chunked : NULL;
    if (strcmp(backend, "cuda")) return NULL;
    return tier == LS_TIER_TC ? &cuda_tc_gdn_chunked : tier == LS_TIER_FAST ? &cuda_fast_gdn_chunked
                                                                            : &cuda_gdn_chunked;
}

/* The CUDA backend's tc and fast tiers (docs/tensor-core-tier.md §2.2, §2.3,
 * §6; backend_cuda.h tier): the rows that replace linear's, lm_head's and
 * the experts' (and in the fast tier attention's and combine's). The
 * linears' GEMM is cuBLASLt's: tc one algorithm per weight shape, pinned in
 * numerics.tc_gemms (algorithm id, tile, stages, swizzle, cuBLASLt
 * version); fast the default heuristic's pick per call, a non-strict row.
 * The experts are lockstep's own WMMA kernels in both tiers; the fast tier
 * adds their routed rows with atomics (its combine), splits attention's
 * keys by the call's size and runs a sequence's GDN call of 64 tokens or
 * more in chunks counted from the call's start (FLA's prefill). The order
 * within an instruction is the hardware's, so the order ids are new and no
 * probe applies. */
#define TC(op) \
    {op, "cuda-tensor-core", "ls_tc_to_bf16_kernel + cuBLASLt pinned algorithm + ls_tc_out_kernel", \
     "per weight shape: the pinned record's tile, stages and CTA swizzle", "none (split-K 1, no reduction scheme)", \
     "fp32", "cublaslt-pinned-per-shape", "tensor-core", "strict"}
#define FAST(op) \
    {op, "cuda-fast", "ls_tc_to_bf16_kernel + cuBLASLt default heuristic per call + ls_tc_out_kernel", \
     "the heuristic's pick per weight shape and rows of the call", "the heuristic's (split-K and reduction " \
     "schemes allowed)", "fp32", "cublaslt-heuristic-per-call", "tensor-core", "fast"}
#define TC_EXPERTS(provider) \
    {"experts", provider, "ls_moe_count_kernel+ls_moe_group_kernel+ls_moe_tc_gate_up_kernel+ls_moe_tc_down_kernel", \
     "4warps/block per 16 output columns x 16 pairs of one expert, warp per K slice (WMMA 16x16x16 bf16, fp32 accumulate)", \
     "4 fixed K slices summed in slice order", "fp32", "wmma-k16-ascending-4slices", "tensor-core", "strict"}
static const ls_provider cuda_tc_rows[] = {TC("linear"), TC("lm_head"), TC_EXPERTS("cuda-tensor-core")};
static const ls_provider cuda_fast_rows[] = {
    FAST("linear"), FAST("lm_head"), TC_EXPERTS("cuda-fast"),
    {"attention", "cuda-fast", "ls_att_fast_span_kernel (+ls_att_fast_merge_kernel when split)",
     "4warps/block per (query, head, key span), warp per 4 keys at a time, lane per 8 head dims",
     "key spans per (query, head): enough for two blocks an SM by the call's queries x heads, each >= 32 keys",
     "fp32", "split-kv-online-softmax-fma-by-call", "portable", "fast"},
    {"combine", "cuda-fast", "atomicAdd in ls_moe_tc_down_kernel + ls_moe_fast_finish_kernel",
     "thread per (pair, column) of a down block's output tile",
     "none", "fp32", "atomic-add-hardware-order", "portable", "fast"},
    {"gdn_recurrent", "cuda-fast", "a sequence's call of 64 tokens or more: ls_gdnt_rows_kernel+"
     "ls_gdnt_state_kernel+ls_gdnt_out_kernel+ls_gdnt_mat_kernel; shorter: ls_gdn_recurrent_kernel+"
     "ls_gdn_decode_kernel", "as the chunk-aligned form on tensor cores, and the recurrent kernels",
     "chunks of 64 counted from each call's first token", "fp32",
     "chunked-64-from-call-start-wmma-tf32-recurrent-decode", "tensor-core", "fast"},
};

const ls_provider *ls_backend_tier_providers(const char *backend, ls_tier tier, size_t *count)
{
    *count = 0;
    if (!backend || strcmp(backend, "cuda")) return NULL;
    if (tier == LS_TIER_TC) {
        *count = sizeof cuda_tc_rows / sizeof cuda_tc_rows[0];
        return cuda_tc_rows;
    }
    if (tier == LS_TIER_FAST) {
        *count = sizeof cuda_fast_rows / sizeof cuda_fast_rows[0];
        return cuda_fast_rows;
    }
    return NULL;
}

/* Portable strict CUDA kernels (kernels/ops.h): CUDA cores, one warp per
 * reduction in the CPU's orders, so the reduction-order ids equal the CPU's.
 * Tile shapes are launch configurations (warps x lanes, or threads). */
static const ls_provider cuda_rows[] = {
    CUDA("linear", "ls_linear_row1_kernel at 1 token of bf16 with in 2048 or 4096, else ls_linear_kernel at 1 token, ls_linear_tile_kernel from 2 (bf16/fp32; FP8 always ls_linear_kernel)", "bf16 T = 1, in 2048 or 4096: 8warps/block, warp per output row, the whole row in registers, x in shared memory; other T = 1 or FP8: 8warps-x-(1|4|8)tokens/block, warp per output row, 16-byte weight loads via shared memory; bf16/fp32 T >= 2: 4warps/block of 16 rows x 8 tokens, warp per 4 rows x 8 tokens, 256-element chunks copied to shared memory (cp.async, 3 stages)", "dot32-lanes32-butterfly"),
    CUDA("rmsnorm", "ls_rmsnorm_row_kernel (after a residual add ls_residual_rmsnorm_row_kernel) for rows of 1024..8192, else (ls_residual_kernel then) ls_rmsnorm_kernel", "rows of 1024..8192: 256threads/block per row, the row (after a residual add: the sum) copied to shared memory, warp 0 forms the factor; else 4warps/block, warp per row", "dot32-lanes32-butterfly"),
    CUDA("gated_rmsnorm", "ls_gated_rmsnorm_kernel", "4warps/block, warp per row", "dot32-lanes32-butterfly"),
    CUDA("conv_silu", "ls_conv_silu_kernel", "128threads/block, thread per channel", "sequential-taps"),
    CUDA("gdn_gates", "ls_gdn_gates_kernel", "256threads/block", "elementwise"),
    CUDA("l2norm", "ls_l2norm_scale_kernel", "4warps/block, warp per row", "dot32-lanes32-butterfly"),
    CUDA("gdn_recurrent", "ls_gdn_recurrent_kernel+ls_gdn_decode_kernel", "4warps x 8cols/block, lane = key rows l+32r in registers; a decode step: warp per 32 value columns, thread per column, the state slice in shared memory", "gdn-recurrent-dot32"),
    CUDA("rope", "ls_rope_kernel", "256threads/block, thread per pair", "elementwise"),
    CUDA("attention", "ls_attention_kernel; one query per sequence: ls_att_scores_kernel+ls_att_values_kernel+ls_att_combine_kernel", "8warps/block per (query, head), key tiles of 8 blocks of 32, warp per block for scores, thread per head dim for values; one query per sequence: block per (query, head, key block) for scores (4 keys a warp) and for values, block per (query, head) combines the blocks in order", "online-softmax-block32"),
    CUDA("router_softmax", "ls_router_block_kernel (ls_router_softmax_topk_kernel when E > 1024)", "block of E threads (a power of two, >= 32) per token, thread per logit, warp 0 sums (E <= 1024); else warp per token", "dot32-max-exp-sum32"),
    CUDA("topk", "ls_router_block_kernel (ls_router_softmax_topk_kernel when E > 1024)", "block per token, bitonic sort of (probability, index) keys (E <= 1024); else warp per token", "sequential-topk-order"),
    CUDA("renormalise", "ls_router_block_kernel (ls_router_softmax_topk_kernel when E > 1024)", "thread per pick (E <= 1024); else lane 0 per token", "sequential-topk-order"),
    CUDA("experts", "bf16/fp32 experts: ls_moe_gate_up_t_kernel+ls_moe_down_t_kernel (+ls_moe_count_kernel+ls_moe_group_kernel when T*k > E); FP8: ls_moe_gate_up_kernel+ls_moe_down_kernel (+ls_moe_count_kernel+ls_moe_group_kernel when T*k > E)", "T*k <= E: every (pair) its own tile, else tiles of <= 64 pairs of one expert; bf16/fp32: 4warps/block, 8 hidden units (gate+up) or 16 down rows per block, 4 rows per warp, 256-element chunks copied to shared memory (cp.async, 3 stages), 1 pair (single) or 8 pairs (grouped) per pass; FP8: 8warps/block, warp per (pair, row) when T*k <= E (6 blocks/SM), else per (expert, row) x 64 pairs, 8 pairs per row pass (2 blocks/SM)", "dot32-lanes32-butterfly"),
    CUDA("combine", "ls_moe_combine_kernel", "256threads/block, thread per (token, column)", "sequential-topk-order"),
    CUDA("shared_expert", "bf16/fp32: ls_moe_gate_up_t_kernel+ls_moe_shared_gate_kernel+ls_moe_down_t_kernel; FP8: ls_moe_gate_up_kernel+ls_moe_shared_gate_kernel+ls_moe_down_kernel", "tiles of one token (T*k <= E) or runs of 64 tokens, as the experts", "dot32-lanes32-butterfly"),
    CUDA("lm_head", "ls_linear_row1_kernel at 1 token of bf16 with in 2048 or 4096, else ls_linear_kernel at 1 token, ls_linear_tile_kernel from 2 (bf16/fp32; FP8 always ls_linear_kernel)", "bf16 T = 1, in 2048 or 4096: 8warps/block, warp per output row, the whole row in registers, x in shared memory; other T = 1 or FP8: 8warps-x-(1|4|8)tokens/block, warp per output row, 16-byte weight loads via shared memory; bf16/fp32 T >= 2: 4warps/block of 16 rows x 8 tokens, warp per 4 rows x 8 tokens, 256-element chunks copied to shared memory (cp.async, 3 stages)", "dot32-lanes32-butterfly"),
    CUDA("logprobs", "ls_lp_max_kernel+ls_lp_exp_kernel+ls_lp_sum_kernel+ls_lp_sub_kernel (in place: ls_logprobs_kernel)", "max, exp and subtract: 256threads/block per chunk of >= 4096 of a row; sum: 1024threads/block per row, tiles of 4096 in two halves of shared memory, warps 1.. stage the next tile while warp 0 sums", "max-exp-sum32-log"),
    CUDA("lp_summary", "ls_lp_summary_part_kernel+ls_lp_summary_merge_kernel", "256threads/block per chunk of >= 4096 of a row, each thread's first 5 in registers, the block's 5 picks; then a warp per row picks from the chunks' lists", "sequential-topk-order"),
    CUDA("digest", "ls_sha256_rows_kernel", "128threads/block, thread per row", "sha256-row-major"),
};

/* FP8 block-quantised weights (docs/numerics.md §9): the rows a run on an
 * FP8 checkpoint adds, one set per FP8 mode. Their reduction orders are new
 * ids: the dequantised DOT32 is the dot32 order over other operands (weights
 * rounded from q · s), and w8a8 sums per 128-wide block, then the blocks. */
static const ls_provider cpu_fp8_dequant_rows[] = {
    CPU("linear_fp8", "ls_cpu_linear (e4m3 weights dequantised: q * scale, one fp32 rounding)",
        "1x32", "fp32", "fp8-dequant-dot32-lanes32-butterfly"),
    CPU("experts_fp8", "ls_cpu_moe_slot (e4m3 weights dequantised)", "1x32", "fp32",
        "fp8-dequant-dot32-lanes32-butterfly"),
};

static const ls_provider cpu_fp8_w8a8_rows[] = {
    CPU("fp8_act_quant", "ls_cpu_fp8_quant_act", "-", "fp32",
        "fp8-e4m3-group128-absmax-div448-rne-saturate"),
    CPU("linear_fp8", "ls_cpu_linear_q", "1x32", "fp32",
        "fp8-w8a8-block128-dot32-then-sequential-blocks"),
    CPU("experts_fp8", "ls_cpu_moe_slot (ls_cpu_expert: ls_cpu_fp8_quant_act + ls_cpu_linear_q)",
        "1x32", "fp32", "fp8-w8a8-block128-dot32-then-sequential-blocks"),
};

static const ls_provider cuda_fp8_dequant_rows[] = {
    CUDA("linear_fp8", "ls_linear_kernel (e4m3 rows dequantised into shared memory)",
         "8warps-x-(1|4|8)tokens/block, warp per output row, 8-byte weight loads dequantised "
         "into shared memory",
         "fp8-dequant-dot32-lanes32-butterfly"),
    CUDA("experts_fp8", "ls_moe_gate_up_kernel+ls_moe_down_kernel (e4m3 rows dequantised)",
         "as experts", "fp8-dequant-dot32-lanes32-butterfly"),
};

static const ls_provider cuda_fp8_w8a8_rows[] = {
    CUDA("fp8_act_quant", "ls_fp8_quant_kernel, ls_moe_quant_x_kernel, ls_moe_quant_mid_kernel "
         "(ls_fp8_quant_group)", "128threads/block, thread per (row, 128-group)",
         "fp8-e4m3-group128-absmax-div448-rne-saturate"),
    CUDA("linear_fp8", "ls_linear_kernel (w8a8: ls_warp_dot_w8a8 over tokens quantised by "
         "ls_fp8_quant_kernel)", "8warps-x-(1|4|8)tokens/block, warp per output row, lane per "
         "4 elements of each 128-block", "fp8-w8a8-block128-dot32-then-sequential-blocks"),
    CUDA("experts_fp8",
         "ls_moe_quant_x_kernel+ls_moe_gate_up_kernel+ls_moe_quant_mid_kernel+ls_moe_down_kernel "
         "(w8a8)", "as experts; quantisers thread per (row, 128-group)",
         "fp8-w8a8-block128-dot32-then-sequential-blocks"),
};

typedef struct backend_table {
    const char *name;
    const ls_provider *rows;
    size_t count;
    const ls_provider *fp8[2];           /* dequant, w8a8 */
    size_t fp8_count[2];
} backend_table;

#define N(a) (sizeof a / sizeof a[0])
static const backend_table tables[] = {
    {"cpu", cpu_rows, N(cpu_rows), {cpu_fp8_dequant_rows, cpu_fp8_w8a8_rows},
     {N(cpu_fp8_dequant_rows), N(cpu_fp8_w8a8_rows)}},
    {"cuda", cuda_rows, N(cuda_rows), {cuda_fp8_dequant_rows, cuda_fp8_w8a8_rows},
     {N(cuda_fp8_dequant_rows), N(cuda_fp8_w8a8_rows)}},
};
#undef N

const char *const ls_backend_names[] = {"cpu", "cuda", NULL};

const ls_provider *ls_backend_list_providers(const char *backend, size_t *count)
{
    *count = 0;
    if (!backend) return NULL;
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        if (strcmp(tables[i].name, backend) == 0) {
            *count = tables[i].count;
            return tables[i].rows;
        }
    return NULL;
}

const ls_provider *ls_backend_list_fp8_providers(const char *backend, const char *fp8_mode,
                                                 size_t *count)
{
    *count = 0;
    if (!backend || !fp8_mode) return NULL;
    int w = !strcmp(fp8_mode, "w8a8");
    if (!w && strcmp(fp8_mode, "dequant")) return NULL;
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        if (strcmp(tables[i].name, backend) == 0) {
            *count = tables[i].fp8_count[w];
            return tables[i].fp8[w];
        }
    return NULL;
}

const ls_provider *ls_backend_find_provider(const char *backend, const char *op)
{
    size_t n;
    const ls_provider *rows = ls_backend_list_providers(backend, &n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].op, op) == 0) return &rows[i];
    return NULL;
}
