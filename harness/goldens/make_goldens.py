#!/usr/bin/env python3
"""Builds small, sensitive Qwen3-Next checkpoints and their expected outputs
from Hugging Face transformers (the independent reference), into goldens/.

For every config in CONFIGS:
  goldens/<name>/config.json, model.safetensors   save_pretrained, bf16
  goldens/<name>/expected.json.zst                 transformers' outputs (format: goldens/README.md)

Weights are drawn from a seeded torch generator, scaled so activations and
logits have realistic spread ("sensitive" checkpoints, docs/overview.md), and rounded
to bf16 so the one bf16 checkpoint serves both the fp32 and the bf16 runs.
The model is then reloaded from disk with from_pretrained (dtype float32 and
bfloat16) and run on CPU with transformers' defaults.

Usage: python3 harness/goldens/make_goldens.py [--out goldens]
Deterministic for a given torch/transformers version (single-threaded CPU).
"""
import argparse
import json
import math
import os
import platform
import shutil
import struct
import sys

import torch
import transformers
import zstandard
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

FORMAT = "lockstep-goldens"
FORMAT_VERSION = 1
SEQ_LENGTHS = [1, 7, 65, 130]
GREEDY_PROMPT_SEQS = [1, 2]   # prompts: the 7- and 65-token sequences (65 crosses a GDN chunk)
GREEDY_STEPS = 16
TOPK = 5
TARGET_TOP1_LOGPROB = -1.0

# Each config varies what a C engine could get wrong: GQA ratio, head_dim (48:
# even, not a power of two), d_k != d_v, H_v/H_k, layer pattern, expert count
# and top-k (1 and >= 8), norm_topk_prob, vocab not a multiple of 64.
CONFIGS = [
    dict(name="qwen3next_tiny_a", seed=1001,
         vocab_size=300, hidden_size=64, num_hidden_layers=4, full_attention_interval=2,
         num_attention_heads=4, num_key_value_heads=2, head_dim=32,
         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24,
         num_experts=8, num_experts_per_tok=1, norm_topk_prob=True,
         moe_intermediate_size=32, shared_expert_intermediate_size=48),
    dict(name="qwen3next_tiny_b", seed=2002,
         vocab_size=257, hidden_size=48, num_hidden_layers=4, full_attention_interval=4,
         num_attention_heads=6, num_key_value_heads=1, head_dim=48,
         linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=16,
         num_experts=16, num_experts_per_tok=8, norm_topk_prob=False,
         moe_intermediate_size=24, shared_expert_intermediate_size=32),
    dict(name="qwen3next_tiny_c", seed=3003,
         vocab_size=193, hidden_size=32, num_hidden_layers=3, full_attention_interval=3,
         num_attention_heads=4, num_key_value_heads=4, head_dim=16,
         linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=8, linear_value_head_dim=8,
         num_experts=12, num_experts_per_tok=10, norm_topk_prob=True,
         moe_intermediate_size=16, shared_expert_intermediate_size=16),
]


def hexf(x):
    """fp32 bits of a Python/torch float as "0x%08x"."""
    return "0x%08x" % struct.unpack("<I", struct.pack("<f", float(x)))[0]


def bf16_round_(t):
    with torch.no_grad():
        t.copy_(t.to(torch.bfloat16).to(t.dtype))


def make_config(c):
    return Qwen3NextConfig(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], intermediate_size=4 * c["hidden_size"],
        num_hidden_layers=c["num_hidden_layers"], num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
        linear_num_key_heads=c["linear_num_key_heads"], linear_num_value_heads=c["linear_num_value_heads"],
        linear_key_head_dim=c["linear_key_head_dim"], linear_value_head_dim=c["linear_value_head_dim"],
        linear_conv_kernel_dim=4, num_experts=c["num_experts"], num_experts_per_tok=c["num_experts_per_tok"],
        norm_topk_prob=c["norm_topk_prob"], moe_intermediate_size=c["moe_intermediate_size"],
        shared_expert_intermediate_size=c["shared_expert_intermediate_size"], decoder_sparse_step=1,
        full_attention_interval=c["full_attention_interval"], rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
    )


def init_weights(model, c, gen):
    """Sensitive weights: matrices N(0, 1/fan_in), zero-centred norm weights
    N(0, 0.1), gated-norm weight 1 + N(0, 0.1), decays in (0.4, 1)."""
    def normal(shape, std):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std

    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if name.endswith("embed_tokens.weight"):
                v = normal(shape, 1.0)
            elif name.endswith("layernorm.weight") or name.endswith("model.norm.weight") \
                    or name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
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
                v = normal(shape, 2.0 / math.sqrt(shape[-1]))  # router: logits std ~2, routing not uniform
            elif name.endswith("lm_head.weight"):
                v = normal(shape, 1.0 / math.sqrt(shape[-1]))  # rescaled by calibrate_lm_head
            elif p.dim() == 2:
                v = normal(shape, 1.0 / math.sqrt(shape[-1]))
            else:
                raise SystemExit("make_goldens: no init rule for %s %s" % (name, shape))
            p.copy_(v)
            bf16_round_(p)


def calibrate_lm_head(model, tokens):
    """Scales lm_head so the mean top-1 logprob over `tokens` is about
    TARGET_TOP1_LOGPROB (bisection on a scale factor), then rounds to bf16."""
    with torch.no_grad():
        z = model.model(input_ids=tokens, use_cache=False).last_hidden_state[0].float()
        w = model.lm_head.weight.detach().clone()

        def top1(scale):
            lp = torch.log_softmax(z @ (w * scale).t(), dim=-1)
            return lp.max(dim=-1).values.mean().item()

        lo, hi = 0.01, 100.0
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            if top1(mid) < TARGET_TOP1_LOGPROB:
                lo = mid
            else:
                hi = mid
        model.lm_head.weight.copy_(w * math.sqrt(lo * hi))
        bf16_round_(model.lm_head.weight)
        return math.sqrt(lo * hi)


def top5(lp_row):
    """Top-5 of one fp32 logprob row, descending, ties to the lower token id."""
    vals = lp_row.tolist()
    order = sorted(range(len(vals)), key=lambda i: (-vals[i], i))[:TOPK]
    return order, [vals[i] for i in order]


def logprobs_of(logits):
    """fp32 log_softmax of logits (bf16 logits are widened first, as HF's callers do)."""
    return torch.log_softmax(logits.float(), dim=-1)


def teacher_forced(model, tokens):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([tokens]), use_cache=False)
    lp = logprobs_of(out.logits[0])
    t = len(tokens)
    rec = {"tokens": tokens, "next_logprob": [], "top5_ids": [], "top5_logprobs": [],
           "logits_dtype": str(out.logits.dtype).replace("torch.", "")}
    for p in range(t):
        ids, vals = top5(lp[p])
        rec["top5_ids"].append(ids)
        rec["top5_logprobs"].append([hexf(v) for v in vals])
        if p + 1 < t:
            rec["next_logprob"].append(hexf(lp[p, tokens[p + 1]].item()))
    return rec, lp


def greedy(model, prompt, steps):
    """Prefill the prompt with a cache, then decode one token at a time (HF's
    own cache path: chunked GDN for the prefill, recurrent GDN per decode step)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        cache = out.past_key_values if hasattr(out, "past_key_values") and out.past_key_values is not None \
            else out.cache
        gen, lps, t5i, t5v = [], [], [], []
        logits = out.logits[0, -1]
        for s in range(steps):
            lp = logprobs_of(logits)
            ids, vals = top5(lp)
            tok = ids[0]
            gen.append(tok)
            lps.append(hexf(lp[tok].item()))
            t5i.append(ids)
            t5v.append([hexf(v) for v in vals])
            if s + 1 == steps:
                break
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values if hasattr(out, "past_key_values") and out.past_key_values is not None \
                else out.cache
            logits = out.logits[0, -1]
    return {"prompt": prompt, "generated": gen, "logprob": lps, "top5_ids": t5i, "top5_logprobs": t5v}


def f32(h):
    return struct.unpack("<f", struct.pack("<I", int(h, 16)))[0]


def build_one(c, outdir):
    name = c["name"]
    d = os.path.join(outdir, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    gen = torch.Generator().manual_seed(c["seed"])
    cfg = make_config(c)
    torch.manual_seed(c["seed"])
    model = Qwen3NextForCausalLM(cfg).float().eval()
    init_weights(model, c, gen)

    seqs = [torch.randint(0, c["vocab_size"], (n,), generator=gen).tolist() for n in SEQ_LENGTHS]
    calib = torch.tensor([seqs[-1]])
    lm_scale = calibrate_lm_head(model, calib)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    del model

    runs, lp_by, rollout_vs_replay = [], {}, {}
    for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        m = Qwen3NextForCausalLM.from_pretrained(d, dtype=dtype).eval()
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
            # HF's own rollout (cached prefill + recurrent decode) against its
            # own replay (one teacher-forced call over prompt + completion)
            _, lp_replay = teacher_forced(m, g["prompt"] + g["generated"])
            n0 = len(g["prompt"])
            for s_i, tok in enumerate(g["generated"]):
                row = lp_replay[n0 - 1 + s_i]
                d_max = max(d_max, abs(row[tok].item() - f32(g["logprob"][s_i])))
                argmax_eq = argmax_eq and top5(row)[0][0] == tok
        rollout_vs_replay[dtype_name] = {"max_abs_dlogprob": d_max, "replay_argmax_equal": argmax_eq}
        del m

    # transformers' own fp32-vs-bf16 gap on the teacher-forced next-token logprobs
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

    with open(os.path.join(d, "config.json")) as f:
        config_json = json.load(f)
    doc = {
        "format": FORMAT, "version": FORMAT_VERSION, "model": name, "seed": c["seed"],
        "generator": {"script": "harness/goldens/make_goldens.py", "torch": torch.__version__,
                      "transformers": transformers.__version__, "python": platform.python_version(),
                      "device": "cpu", "threads": torch.get_num_threads()},
        "lm_head_scale": lm_scale,
        "config": config_json,
        "fp32_vs_bf16": gap,
        "hf_rollout_vs_replay": rollout_vs_replay,
        "runs": runs,
    }
    raw = json.dumps(doc, separators=(",", ":"), sort_keys=False).encode()
    tmp = os.path.join(d, "expected.json.zst.tmp")
    with open(tmp, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=19).compress(raw))
    os.replace(tmp, os.path.join(d, "expected.json.zst"))
    os.chmod(os.path.join(d, "model.safetensors"), 0o644)
    return name, dict(gap, rollout_vs_replay=rollout_vs_replay)


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
