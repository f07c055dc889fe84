/* lockstep — the hybrid MoE graph of Qwen3-Next and Qwen3.5 MoE:
 * configuration (validated, fail closed) and weight binding.
 *
 * ls_model_open reads config.json of an open checkpoint (Qwen3-Next at the
 * top level; Qwen3.5 MoE under text_config, or at the top level for a
 * text-only checkpoint), validates every field it reads (an unsupported
 * value is LS_E_UNSUPPORTED naming the field; a malformed one LS_E_INPUT),
 * derives the layer list (layer_types, else full_attention_interval) and
 * binds every tensor the engine needs, checking
 * dtype (BF16 or F32; F8_E4M3 with its block scales for the projections of
 * an FP8 checkpoint, docs/model.md §6b) and shape. Every tensor the checkpoint exposes must be
 * bound: one the graph does not read (a bias, a layer beyond
 * num_hidden_layers, an expert beyond num_experts) is refused, naming it
 * (the vision tower and MTP head are set aside by the checkpoint reader). Matrices stay in the checkpoint's mmap;
 * small parameters (norm weights, A_log, dt_bias) are widened to fp32 arrays
 * owned by the model; the engine rounds them to bf16 in bf16 activation mode,
 * as the reference does when it casts every parameter to the model dtype
 * (docs/model.md §2.4).
 *
 * ls_model_synthetic builds the same model from a config alone, for
 * shapes whose weights are not on disk (Qwen3-Next-80B-A3B is ~150 GB):
 * every matrix has its shape and dtype (bf16; with cfg->fp8, FP8 where the
 * FP8 releases quantise) but no data, and a generator of the values
 * `lockstep synth` writes for that config and seed (docs/synth.md), row
 * range by row range; the small parameters are those values, generated on
 * the host. A backend with wrap_generated (the CPU) generates each matrix,
 * or a rank's share, when the engine wraps it, and so runs the written
 * checkpoint's weights; the CUDA backend fills them with its own
 * bench-only device generator (ls_backend_cuda_opts.synthetic_weights_seed). */
#ifndef LS_MODEL_MODEL_H
#define LS_MODEL_MODEL_H

#include <stdint.h>

#include "numerics/types.h"
#include "core/status.h"
#include "io/checkpoint.h"

#define LS_MODEL_MAX_LAYERS 512

/* Which graph a config describes. The two share every operator; they differ
 * in the GDN input projections (Qwen3-Next: fused in_proj_qkvz / in_proj_ba,
 * interleaved per key head; Qwen3.5: in_proj_qkv, in_proj_z, in_proj_b,
 * in_proj_a in plain head order, docs/model.md §2.3) and in the router
 * (Qwen3.5 always renormalises the top-k weights). */
typedef enum ls_model_arch {
    LS_MODEL_QWEN3_NEXT = 0,   /* model_type qwen3_next */
    LS_MODEL_QWEN3_5_MOE = 1   /* model_type qwen3_5_moe (text_config) or qwen3_5_moe_text */
} ls_model_arch;

/* The model_type a config.json names for arch ("qwen3_next", "qwen3_5_moe"). */
const char *ls_model_arch_name(ls_model_arch arch);

typedef struct ls_model_config {
    ls_model_arch arch;        /* graph; 0 (Qwen3-Next) for a zeroed config */
    long hidden;               /* D */
    long n_layers;             /* L */
    long vocab;                /* V */
    long n_heads, n_kv_heads, head_dim;       /* attention Hq, Hkv, d */
    long rotary_dims;          /* R = head_dim * partial_rotary_factor (even) */
    double rope_theta;
    long lin_k_heads, lin_v_heads;            /* GDN H_k, H_v */
    long lin_k_dim, lin_v_dim;                /* d_k, d_v */
    long conv_kernel;          /* K */
    long n_experts, topk;      /* E, k */
    long moe_inter, shared_inter;             /* I, I_s */
    int norm_topk_prob;
    long max_positions;        /* max_position_embeddings */
    /* Qwen3.5: the placeholder token ids of vision input (image_token_id,
     * video_token_id at the top level of config.json, where given). Text
     * decoding has no pixels to put there, so the engine refuses a prompt
     * holding one. */
    long vision_tokens[2];     /* [0] image_token_id, [1] video_token_id */
    int vision_tokens_given;   /* bit i: vision_tokens[i] given (0 in a zeroed config: none) */
    int fp8;                   /* 1: quantization_config declares FP8 block quantisation
                                  (docs/model.md §6b): e4m3 matrices with block scales allowed */
    int is_attention[LS_MODEL_MAX_LAYERS];    /* 1 = full attention, 0 = gated DeltaNet */
} ls_model_config;

typedef struct ls_model_layer {
    int attention;             /* 1 = full attention layer */
    float *in_norm;            /* input_layernorm [D] */
    float *post_norm;          /* post_attention_layernorm [D] */
    /* gated DeltaNet */
    ls_wmat qkvz;              /* Qwen3-Next in_proj_qkvz [2 Hk dk + 2 Hv dv, D] */
    ls_wmat ba;                /* Qwen3-Next in_proj_ba [2 Hv, D] */
    ls_wmat in_qkv;            /* Qwen3.5 in_proj_qkv [2 Hk dk + Hv dv, D]: q, k, v head-major */
    ls_wmat in_z;              /* Qwen3.5 in_proj_z [Hv dv, D] */
    ls_wmat in_b, in_a;        /* Qwen3.5 in_proj_b, in_proj_a [Hv, D] */
    ls_wmat conv;              /* conv1d [conv_dim, K] (stored [conv_dim, 1, K]) */
    float *A_log;              /* [Hv] */
    float *dt_bias;            /* [Hv] */
    float *gnorm;              /* norm.weight [dv] */
    ls_wmat out_proj;          /* [D, Hv dv] */
    /* full attention */
    ls_wmat q_proj;            /* [Hq 2 d, D] (per head: d query rows, then d gate rows) */
    ls_wmat k_proj, v_proj;    /* [Hkv d, D] */
    ls_wmat o_proj;            /* [D, Hq d] */
    float *q_norm, *k_norm;    /* [d] */
    /* MoE */
    ls_wmat router;            /* [E, D] */
    ls_wmat *exp_gate, *exp_up, *exp_down; /* [E]: [I, D], [I, D], [D, I] */
    ls_wmat sh_gate, sh_up;    /* [Is, D] */
    ls_wmat sh_down;           /* [D, Is] */
    ls_wmat sh_gate_w;         /* shared_expert_gate [1, D] */
} ls_model_layer;

typedef struct ls_model {
    ls_model_config cfg;
    const ls_checkpoint *ck;   /* borrowed; must outlive the model; NULL = synthetic */
    long n_fp8;                /* matrices bound as FP8 (LS_WTYPE_F8_DEQUANT) */
    float **fp8_scales;        /* [n_fp8] each matrix's block scales, copied from the checkpoint
                                  (owned; an ls_wmat.scale points at one) */
    ls_wmat embed;             /* [V, D] */
    ls_wmat lm_head;           /* [V, D] */
    float *final_norm;         /* [D] */
    ls_model_layer *layers;    /* [L] */
    struct ls_model_synth *synth; /* synthetic: synth's tensor list and the matrices'
                                     generators (ls_wmat.gen points into it); owned; NULL
                                     for a checkpoint's model */
} ls_model;

/* Which vision placeholder token t is: 0 image_token_id, 1 video_token_id,
 * -1 neither (or none given). */
int ls_model_vision_token(const ls_model_config *cfg, long t);
/* Parses and validates a config.json object (a jansson json_t*). */
ls_status ls_model_parse_config(const void *config_json, ls_model_config *cfg, ls_error *err);
/* Validates the config of ck and binds its weights. *out owned by the caller.
 * A generated checkpoint (io/checkpoint.h; synth/synth.h ls_synth_checkpoint)
 * is refused (LS_E_USAGE): its model is ls_model_synthetic, which
 * run/run.h ls_run_checkpoint_open opens. */
ls_status ls_model_open(const ls_checkpoint *ck, ls_model **out, ls_error *err);
/* A model with config *cfg (checked like a parsed config.json: LS_E_UNSUPPORTED
 * or LS_E_USAGE naming the field) and no checkpoint: the tensors and shapes
 * ls_model_open binds, every matrix with data == NULL and gen set (gen_row0
 * 0): gen->fill writes any row range of the bytes `lockstep synth` writes
 * for this config and seed (ls_synth_fill_rows; FP8: e4m3 bytes and the
 * block scales amax / 448 of whole 128-row blocks). The small parameters
 * (norm weights, A_log, dt_bias) are synth's bf16 values, widened as
 * ls_model_open widens them, and do not depend on cfg->fp8. Matrices are
 * bf16, except with cfg->fp8 = 1 those an FP8 release stores F8_E4M3 (what
 * synth --fp8 quantises: attention q/k/v/o, the GDN qkvz or qkv and z
 * projections and out_proj, every routed and shared expert projection):
 * LS_WTYPE_F8_DEQUANT; embed, lm_head, the GDN b/a projections, conv1d, the
 * router and the shared expert gate stay bf16 (as the releases keep them).
 * An FP8 matrix's scale holds block scales for the CUDA benchmark's device
 * generator only (which has no wrap_generated): about 0.04 / 448 each, so
 * W = q · s has the spread of its bf16 values (model.c synth_f8; owned by
 * the model, fp8_scales); a backend that generates ignores them and
 * generates synth's. *out owned by the caller. */
ls_status ls_model_synthetic(const ls_model_config *cfg, uint64_t seed, ls_model **out,
                             ls_error *err);
void ls_model_close(ls_model *m);

#endif
