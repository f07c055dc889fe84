#!/usr/bin/env python3
"""Builds small, sensitive Qwen3.5 MoE checkpoints and their expected outputs
from Hugging Face transformers (the independent reference), into goldens/.
The Qwen3-Next goldens come from make_goldens.py, whose helpers (weights,
calibration, teacher-forced and greedy runs, the expected.json format) this
script reuses; goldens/README.md describes both.

For every config in CONFIGS, two layouts of the same weights:
  goldens/<name>/config.json, model.safetensors    the BF16 release layout: routed experts
                                                   fused, mlp.experts.gate_up_proj [E, 2I, D]
                                                   and mlp.experts.down_proj [E, D, I] (no
                                                   .weight), written by this script
  goldens/<name>/per_expert/                       save_pretrained's output: experts one by
                                                   one, mlp.experts.E.{gate,up,down}_proj.weight
  goldens/<name>/expected.json.zst                 transformers' outputs (goldens/README.md)

transformers loads both layouts; the script checks that they give identical
logits (fp32 and bf16) before it writes anything.

Usage: python3 harness/goldens/make_goldens_qwen35.py [--out goldens]
Needs a transformers with the Qwen3_5Moe* classes (5.2 and later).
Deterministic for a given torch/transformers version (single-threaded CPU).
"""
import argparse
import json
import math
import os
import platform
import shutil
import sys

import torch
import transformers
import zstandard
from safetensors.torch import load_file, save_file
from transformers import (Qwen3_5MoeConfig, Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration,
                          Qwen3_5MoeTextConfig)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import (FORMAT, FORMAT_VERSION, GREEDY_PROMPT_SEQS, GREEDY_STEPS, SEQ_LENGTHS,  # noqa: E402
                          bf16_round_, calibrate_lm_head, f32, greedy, teacher_forced, top5)

# Each config varies what a C engine could get wrong, as the Qwen3-Next ones
# do (GQA ratio, head_dim 48, d_k != d_v, H_v/H_k, layer pattern, top-k 2 / 8
# / 10, vocab not a multiple of 64), plus what is Qwen3.5's own: the release
# (vision-language) config with text_config and a vision tower to skip (a,
# b), a text-only config (c), multimodal RoPE sections of each shape, a
# layer_types list that is not an interval pattern (b), a sharded
# per-expert layout (b), MTP tensors to skip (a).
CONFIGS = [
    dict(name="qwen35moe_tiny_a", seed=4004, release=True, mtp=True, shard_per_expert=False,
         vocab_size=300, hidden_size=64, num_hidden_layers=4, full_attention_interval=2,
         num_attention_heads=4, num_key_value_heads=2, head_dim=32, mrope_section=[2, 1, 1],
         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24,
         num_experts=8, num_experts_per_tok=2,
         moe_intermediate_size=32, shared_expert_intermediate_size=48),
    dict(name="qwen35moe_tiny_b", seed=5005, release=True, mtp=False, shard_per_expert=True,
         vocab_size=257, hidden_size=48, num_hidden_layers=4,
         layer_types=["linear_attention", "full_attention", "full_attention", "linear_attention"],
         num_attention_heads=6, num_key_value_heads=1, head_dim=48, mrope_section=[2, 2, 2],
         linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=16,
         num_experts=16, num_experts_per_tok=8,
         moe_intermediate_size=24, shared_expert_intermediate_size=32),
    dict(name="qwen35moe_tiny_c", seed=6006, release=False, mtp=False, shard_per_expert=False,
         vocab_size=193, hidden_size=32, num_hidden_layers=3, full_attention_interval=3,
         num_attention_heads=4, num_key_value_heads=4, head_dim=16, mrope_section=[1, 1, 0],
         linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=8, linear_value_head_dim=8,
         num_experts=12, num_experts_per_tok=10,
         moe_intermediate_size=16, shared_expert_intermediate_size=16),
]

# The vision placeholder ids sit at the top of each tiny vocabulary; the token
# sequences are drawn below them (lockstep refuses them in a prompt).
N_SPECIAL = 4


def text_config(c):
    kw = dict(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], num_hidden_layers=c["num_hidden_layers"],
        num_attention_heads=c["num_attention_heads"], num_key_value_heads=c["num_key_value_heads"],
        head_dim=c["head_dim"], linear_num_key_heads=c["linear_num_key_heads"],
        linear_num_value_heads=c["linear_num_value_heads"], linear_key_head_dim=c["linear_key_head_dim"],
        linear_value_head_dim=c["linear_value_head_dim"], linear_conv_kernel_dim=4,
        num_experts=c["num_experts"], num_experts_per_tok=c["num_experts_per_tok"],
        moe_intermediate_size=c["moe_intermediate_size"],
        shared_expert_intermediate_size=c["shared_expert_intermediate_size"], rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": c["mrope_section"], "mrope_interleaved": True},
        max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        pad_token_id=None)
    if "layer_types" in c:
        kw["layer_types"] = c["layer_types"]
    else:
        kw["full_attention_interval"] = c["full_attention_interval"]
    return kw


def make_model(c):
    """The release class (vision-language, with a minimal vision tower) or
    the text-only one."""
    tc = text_config(c)
    v = c["vocab_size"]
    if not c["release"]:
        return Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**tc))
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3, patch_size=2,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=c["hidden_size"],
                  num_position_embeddings=16)
    cfg = Qwen3_5MoeConfig(text_config=tc, vision_config=vision, image_token_id=v - 2, video_token_id=v - 1,
                           vision_start_token_id=v - 4, vision_end_token_id=v - 3, tie_word_embeddings=False)
    return Qwen3_5MoeForConditionalGeneration(cfg)


def init_weights(model, gen):
    """As make_goldens.init_weights, for Qwen3.5's parameter names (split GDN
    projections; the vision tower, which text never reaches, N(0, 0.02))."""
    def normal(shape, std):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std

    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if ".visual." in "." + name:
                v = normal(shape, 0.02)
            elif name.endswith("embed_tokens.weight"):
                v = normal(shape, 1.0)
            elif name.endswith("layernorm.weight") or name.endswith("language_model.norm.weight") \
                    or name == "model.norm.weight" or name.endswith("q_norm.weight") \
                    or name.endswith("k_norm.weight"):
                v = normal(shape, 0.1)                       # zero-centred: applied as 1 + w
            elif name.endswith("linear_attn.norm.weight"):
                v = 1.0 + normal(shape, 0.1)                 # gated norm: applied as w
            elif name.endswith("A_log"):
                v = torch.log(1.0 + 7.0 * torch.rand(shape, generator=gen))        # A in [1, 8]
            elif name.endswith("dt_bias"):
                dt = torch.exp(math.log(0.005) + (math.log(0.2) - math.log(0.005)) * torch.rand(shape, generator=gen))
                v = torch.log(torch.expm1(dt))               # softplus(dt_bias) = dt
            elif name.endswith("conv1d.weight"):
                v = normal(shape, 0.5)
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                v = normal(shape, 1.0 / math.sqrt(shape[-1]))  # [E, out, in]
            elif name.endswith("mlp.gate.weight"):
                v = normal(shape, 2.0 / math.sqrt(shape[-1]))  # router: logits std ~2
            elif p.dim() == 2:
                v = normal(shape, 1.0 / math.sqrt(shape[-1]))  # every linear, lm_head (recalibrated)
            else:
                raise SystemExit("make_goldens_qwen35: no init rule for %s %s" % (name, shape))
            p.copy_(v)
            bf16_round_(p)


def fuse_experts(src_dir, dst_dir, mtp_hidden):
    """The release layout from save_pretrained's: each layer's experts
    stacked into gate_up_proj [E, 2I, D] (expert e: gate rows, then up rows)
    and down_proj [E, D, I], without a .weight suffix; everything else as
    saved. With mtp_hidden, two multi-token-prediction tensors as the release
    carries (text decoding skips them)."""
    idx = os.path.join(src_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    t = {}
    for fn in files:
        t.update(load_file(os.path.join(src_dir, fn)))
    per = {}
    out = {}
    for k, v in t.items():
        parts = k.split(".")
        if ".mlp.experts." in k and parts[-1] == "weight" and parts[-3].isdigit():
            # <prefix>.mlp.experts.<e>.<proj>.weight
            prefix = ".".join(parts[:-3])
            per.setdefault(prefix, {})[(int(parts[-3]), parts[-2])] = v
        else:
            out[k] = v
    if not per:
        raise SystemExit("make_goldens_qwen35: %s holds no per-expert tensors to fuse" % src_dir)
    for prefix, d in per.items():
        n = 1 + max(e for e, _ in d)
        out[prefix + ".gate_up_proj"] = torch.stack(
            [torch.cat([d[(e, "gate_proj")], d[(e, "up_proj")]], dim=0) for e in range(n)]).contiguous()
        out[prefix + ".down_proj"] = torch.stack([d[(e, "down_proj")] for e in range(n)]).contiguous()
    if mtp_hidden:
        g = torch.Generator().manual_seed(7)
        out["mtp.fc.weight"] = (torch.randn((mtp_hidden, 2 * mtp_hidden), generator=g) * 0.1).to(torch.bfloat16)
        out["mtp.norm.weight"] = torch.zeros((mtp_hidden,), dtype=torch.bfloat16)
    os.makedirs(dst_dir, exist_ok=True)
    save_file(out, os.path.join(dst_dir, "model.safetensors"), metadata={"format": "pt"})
    for fn in ("config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src_dir, fn)):
            shutil.copyfile(os.path.join(src_dir, fn), os.path.join(dst_dir, fn))
    return sorted(out)


def model_class(c):
    return Qwen3_5MoeForConditionalGeneration if c["release"] else Qwen3_5MoeForCausalLM


def build_one(c, outdir):
    name = c["name"]
    d = os.path.join(outdir, name)
    pe = os.path.join(d, "per_expert")
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    gen = torch.Generator().manual_seed(c["seed"])
    torch.manual_seed(c["seed"])
    model = make_model(c).float().eval()
    init_weights(model, gen)

    v_text = c["vocab_size"] - N_SPECIAL
    seqs = [torch.randint(0, v_text, (n,), generator=gen).tolist() for n in SEQ_LENGTHS]
    lm_scale = calibrate_lm_head(model, torch.tensor([seqs[-1]]))
    model.to(torch.bfloat16).save_pretrained(pe, safe_serialization=True,
                                             max_shard_size="150KB" if c["shard_per_expert"] else "50GB")
    del model
    names = fuse_experts(pe, d, c["hidden_size"] if c["mtp"] else 0)
    cls = model_class(c)

    # The two layouts are the same model to transformers.
    for dtype in (torch.float32, torch.bfloat16):
        a = cls.from_pretrained(pe, dtype=dtype).eval()
        b = cls.from_pretrained(d, dtype=dtype).eval()
        with torch.no_grad():
            la = a(input_ids=torch.tensor([seqs[2]]), use_cache=False).logits
            lb = b(input_ids=torch.tensor([seqs[2]]), use_cache=False).logits
        if not torch.equal(la, lb):
            raise SystemExit("make_goldens_qwen35: %s: fused and per-expert layouts give different %s "
                             "logits" % (name, dtype))
        del a, b

    runs, lp_by, rollout_vs_replay = [], {}, {}
    for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        m = cls.from_pretrained(d, dtype=dtype).eval()
        impl = {"attn_implementation": m.config._attn_implementation,
                "experts_implementation": getattr(m.config, "_experts_implementation", None)}
        for i, toks in enumerate(seqs):
            rec, lp = teacher_forced(m, toks)
            lp_by[(dtype_name, i)] = lp
            runs.append(dict(kind="teacher_forced", dtype=dtype_name, seq=i, **impl, **rec))
        d_max, argmax_eq = 0.0, True
        for gseq in GREEDY_PROMPT_SEQS:
            g = greedy(m, seqs[gseq], GREEDY_STEPS)
            runs.append(dict(kind="greedy", dtype=dtype_name, seq=gseq, **impl, **g))
            _, lp_replay = teacher_forced(m, g["prompt"] + g["generated"])
            n0 = len(g["prompt"])
            for s_i, tok in enumerate(g["generated"]):
                row = lp_replay[n0 - 1 + s_i]
                d_max = max(d_max, abs(row[tok].item() - f32(g["logprob"][s_i])))
                argmax_eq = argmax_eq and top5(row)[0][0] == tok
        rollout_vs_replay[dtype_name] = {"max_abs_dlogprob": d_max, "replay_argmax_equal": argmax_eq}
        del m

    gap = {"max_abs_dlogprob_next": 0.0, "max_abs_dlogprob_top1": 0.0, "top1_agree": 0, "positions": 0}
    top1_mean = []
    for i, toks in enumerate(seqs):
        a, b = lp_by[("float32", i)], lp_by[("bfloat16", i)]
        for p in range(len(toks)):
            gap["positions"] += 1
            ia, ib = int(a[p].argmax()), int(b[p].argmax())
            gap["top1_agree"] += int(ia == ib)
            gap["max_abs_dlogprob_top1"] = max(gap["max_abs_dlogprob_top1"], abs(a[p, ia].item() - b[p, ia].item()))
            top1_mean.append(a[p, ia].item())
            if p + 1 < len(toks):
                gap["max_abs_dlogprob_next"] = max(gap["max_abs_dlogprob_next"],
                                                   abs(a[p, toks[p + 1]].item() - b[p, toks[p + 1]].item()))
    diffs = sorted(abs(lp_by[("float32", i)][p, toks[p + 1]].item() - lp_by[("bfloat16", i)][p, toks[p + 1]].item())
                   for i, toks in enumerate(seqs) for p in range(len(toks) - 1))
    gap["median_abs_dlogprob_next"] = diffs[len(diffs) // 2]
    gap["p90_abs_dlogprob_next"] = diffs[(len(diffs) * 9) // 10]
    gr = [r for r in runs if r["kind"] == "greedy"]
    gap["greedy_equal"] = all(a["generated"] == b["generated"] for a, b in
                              zip([r for r in gr if r["dtype"] == "float32"], [r for r in gr if r["dtype"] == "bfloat16"]))
    gap["mean_top1_logprob_fp32"] = sum(top1_mean) / len(top1_mean)

    # transformers' bf16 with its other experts path (eager: a bf16 combine
    # in ascending expert order): where does its top-1 leave the fp32 one,
    # and by how large an fp32 margin. A bf16 rounding that flips a routed
    # expert moves a logprob by whole units in any bf16 path; this is how
    # far the reference itself goes (tests/test_goldens.c bounds lockstep's
    # flips by it).
    m = cls.from_pretrained(d, dtype=torch.bfloat16, experts_implementation="eager").eval()
    eager = {"top1_agree": 0, "max_flip_margin_vs_fp32": 0.0}
    for i, toks in enumerate(seqs):
        _, lp = teacher_forced(m, toks)
        a = lp_by[("float32", i)]
        for p in range(len(toks)):
            t, t32 = int(lp[p].argmax()), int(a[p].argmax())
            eager["top1_agree"] += int(t == t32)
            if t != t32:
                eager["max_flip_margin_vs_fp32"] = max(eager["max_flip_margin_vs_fp32"],
                                                       a[p, t32].item() - a[p, t].item())
    del m
    gap["bf16_eager_experts"] = eager

    with open(os.path.join(d, "config.json")) as f:
        config_json = json.load(f)
    doc = {
        "format": FORMAT, "version": FORMAT_VERSION, "model": name, "seed": c["seed"],
        "generator": {"script": "harness/goldens/make_goldens_qwen35.py", "torch": torch.__version__,
                      "transformers": transformers.__version__, "python": platform.python_version(),
                      "device": "cpu", "threads": torch.get_num_threads(),
                      "model_class": cls.__name__},
        "lm_head_scale": lm_scale,
        "config": config_json,
        "layouts": {"fused": ".", "per_expert": "per_expert"},
        "fp32_vs_bf16": gap,
        "hf_rollout_vs_replay": rollout_vs_replay,
        "runs": runs,
    }
    raw = json.dumps(doc, separators=(",", ":"), sort_keys=False).encode()
    tmp = os.path.join(d, "expected.json.zst.tmp")
    with open(tmp, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=19).compress(raw))
    os.replace(tmp, os.path.join(d, "expected.json.zst"))
    for root, _, files in os.walk(d):
        for fn in files:
            os.chmod(os.path.join(root, fn), 0o644)
    skipped = [n for n in names if n.startswith("model.visual.") or n.startswith("mtp.")]
    return name, dict(gap, rollout_vs_replay=rollout_vs_replay, skipped_tensors=len(skipped))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "goldens"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for c in CONFIGS:
        name, gap = build_one(c, args.out)
        print("%s: %s" % (name, json.dumps(gap)))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
