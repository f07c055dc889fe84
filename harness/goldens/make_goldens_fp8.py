#!/usr/bin/env python3
"""Builds small FP8 block-quantised Qwen3.5 MoE checkpoints, as the FP8
releases store them, and transformers' fp32 outputs on them through its
`dequantize=True` path, into goldens/ (goldens/README.md, "FP8").

For every config in CONFIGS:
  1. a Qwen3.5 model as make_goldens_qwen35.py makes one (same initialisation,
     lm_head calibrated), saved by save_pretrained in bf16, experts one by one;
  2. the projections the releases quantise (attention q/k/v/o, GDN
     in_proj_qkv / in_proj_z / out_proj, routed and shared experts'
     gate/up/down) quantised per 128 x 128 block: s = amax / 448 (fp32; 1
     for an all-zero block), q = float8_e4m3fn(clamp(w / s)), stored as
     <module>.weight (F8_E4M3) and <module>.weight_scale_inv (F32 s); the rest
     stays bf16 and config.json gets a quantization_config whose
     modules_to_not_convert lists it, as the releases do;
  3. transformers loads it with FineGrainedFP8Config(dequantize=True) at
     fp32: W = fp32(q) * fp32(s), rounded once (the script checks this bit
     for bit on every quantised weight, the contract lockstep's dequant mode
     implements), and writes the teacher-forced and greedy fp32 runs in the
     expected.json format of the other goldens.

Every quantised dimension is at most 128 or a multiple of 128: transformers
derives the block from the scale grid (rows // scale_rows), which equals the
[ceil(out/128), ceil(in/128)] convention only then.

Usage: python3 harness/goldens/make_goldens_fp8.py [--out goldens]
Needs transformers with Qwen3_5Moe* and FineGrainedFP8Config, and accelerate.
"""
import argparse
import json
import os
import platform
import shutil
import sys

import torch
import transformers
import zstandard
from safetensors.torch import load_file, save_file
from transformers import FineGrainedFP8Config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import (FORMAT, FORMAT_VERSION, GREEDY_PROMPT_SEQS, GREEDY_STEPS, SEQ_LENGTHS,  # noqa: E402
                          calibrate_lm_head, greedy, teacher_forced)
from make_goldens_qwen35 import N_SPECIAL, init_weights, make_model, model_class  # noqa: E402

CONFIGS = [
    # the release (vision-language) class; single partial blocks (k/v 64 rows)
    dict(name="qwen35moe_fp8_a", seed=7007, release=True, vocab_size=300, hidden_size=128,
         num_hidden_layers=4, full_attention_interval=2, num_attention_heads=2, num_key_value_heads=1,
         head_dim=64, mrope_section=[3, 3, 2], linear_num_key_heads=1, linear_num_value_heads=2,
         linear_key_head_dim=64, linear_value_head_dim=64, num_experts=8, num_experts_per_tok=2,
         moe_intermediate_size=128, shared_expert_intermediate_size=128),
    # text-only: hidden 256 (two K blocks), 64-wide shared expert, top-4 of 12
    dict(name="qwen35moe_fp8_b", seed=8008, release=False, vocab_size=257, hidden_size=256,
         num_hidden_layers=3, full_attention_interval=3, num_attention_heads=4, num_key_value_heads=2,
         head_dim=64, mrope_section=[3, 3, 2], linear_num_key_heads=2, linear_num_value_heads=4,
         linear_key_head_dim=32, linear_value_head_dim=32, num_experts=12, num_experts_per_tok=4,
         moe_intermediate_size=128, shared_expert_intermediate_size=64),
]

QUANTISED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj",
             "shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj")


def quantised_module(name):
    """The module of a weight the FP8 releases quantise, or None."""
    if not name.endswith(".weight") or name.startswith("model.visual.") or name.startswith("mtp."):
        return None
    m = name[: -len(".weight")]
    parts = m.split(".")
    if ".mlp.experts." in m and parts[-2].isdigit() and parts[-1] in ("gate_proj", "up_proj", "down_proj"):
        return m
    return m if any(m.endswith(q) for q in QUANTISED) else None


def quantise(w):
    """bf16 [R, C] -> (e4m3 [R, C], fp32 scales [ceil(R/128), ceil(C/128)])."""
    w = w.float()
    R, C = w.shape
    br, bc = (R + 127) // 128, (C + 127) // 128
    s = torch.ones((br, bc), dtype=torch.float32)
    q = torch.empty((R, C), dtype=torch.float8_e4m3fn)
    for i in range(br):
        for j in range(bc):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = blk.abs().max()
            if amax > 0:
                s[i, j] = amax / 448.0
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = \
                (blk / s[i, j]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, s


def to_fp8(src, dst, c):
    """The FP8 release layout of save_pretrained's bf16 output src."""
    idx = os.path.join(src, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) \
        else ["model.safetensors"]
    t = {}
    for fn in files:
        t.update(load_file(os.path.join(src, fn)))
    out = {}
    for k, v in t.items():
        m = quantised_module(k)
        if m is None:
            out[k] = v
            continue
        q, s = quantise(v)
        out[k] = q
        out[m + ".weight_scale_inv"] = s
    os.makedirs(dst, exist_ok=True)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    lm = "model.language_model" if c["release"] else "model"
    skip = ["lm_head"]
    tc = cfg.get("text_config", cfg)
    for L, kind in enumerate(tc["layer_types"]):
        if kind == "linear_attention":
            skip += ["%s.layers.%d.linear_attn.in_proj_a" % (lm, L), "%s.layers.%d.linear_attn.in_proj_b" % (lm, L)]
        skip += ["%s.layers.%d.mlp.gate" % (lm, L), "%s.layers.%d.mlp.shared_expert_gate" % (lm, L)]
    if c["release"]:
        skip += ["model.visual"]
    # the releases name their modules with the release prefix even when the
    # loader drops it: a text-only load must match them as well
    if not c["release"]:
        skip = [s.replace("model.", "model.language_model.", 1) if s.startswith("model.") else s for s in skip]
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128], "modules_to_not_convert": skip}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    for fn in ("generation_config.json",):
        if os.path.exists(os.path.join(src, fn)):
            shutil.copyfile(os.path.join(src, fn), os.path.join(dst, fn))
    return out, skip


def load_dequantised(d, c, skip):
    cls = model_class(c)
    qc = FineGrainedFP8Config(dequantize=True, weight_block_size=(128, 128), modules_to_not_convert=skip)
    return cls.from_pretrained(d, dtype=torch.float32, quantization_config=qc).eval()


def check_dequant(model, tensors):
    """Every quantised weight transformers holds is fp32(q) * fp32(s), one
    rounding, bit for bit (expert weights: transformers stacks them)."""
    params = dict(model.named_parameters())
    checked = 0
    for k, q in tensors.items():
        if q.dtype != torch.float8_e4m3fn:
            continue
        s = tensors[k[: -len(".weight")] + ".weight_scale_inv"]
        R, C = q.shape
        want = q.float() * s.repeat_interleave(128, 0)[:R].repeat_interleave(128, 1)[:, :C]
        parts = k.split(".")
        if ".mlp.experts." in k and parts[-3].isdigit():
            e, proj = int(parts[-3]), parts[-2]
            base = ".".join(parts[:-3])
            cand = [n for n in params if n.endswith(base.split("language_model.")[-1] + "." +
                                                    ("gate_up_proj" if proj != "down_proj" else "down_proj"))]
            if len(cand) != 1:
                raise SystemExit("make_goldens_fp8: no stacked parameter for %s (%s)" % (k, cand))
            p = params[cand[0]][e]
            if proj == "gate_proj":
                p = p[:R]
            elif proj == "up_proj":
                p = p[R:]
        else:
            name = k.replace("model.language_model.", "model.language_model.")
            cand = [n for n in params if n == name or n.endswith(name.split("language_model.")[-1])]
            cand = [n for n in cand if params[n].shape == q.shape]
            if not cand:
                raise SystemExit("make_goldens_fp8: no parameter for %s" % k)
            p = params[cand[0]]
        if p.dtype != torch.float32 or not torch.equal(p.detach(), want):
            raise SystemExit("make_goldens_fp8: transformers' dequantised %s is not fp32(q) * fp32(s) "
                             "rounded once (dtype %s)" % (k, p.dtype))
        checked += 1
    return checked


def build_one(c, outdir):
    name = c["name"]
    d = os.path.join(outdir, name)
    tmp = os.path.join(outdir, name + ".bf16.tmp")
    for p in (d, tmp):
        if os.path.isdir(p):
            shutil.rmtree(p)
    gen = torch.Generator().manual_seed(c["seed"])
    torch.manual_seed(c["seed"])
    model = make_model(c).float().eval()
    init_weights(model, gen)
    v_text = c["vocab_size"] - N_SPECIAL
    seqs = [torch.randint(0, v_text, (n,), generator=gen).tolist() for n in SEQ_LENGTHS]
    lm_scale = calibrate_lm_head(model, torch.tensor([seqs[-1]]))
    model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    del model
    tensors, skip = to_fp8(tmp, d, c)
    shutil.rmtree(tmp)

    m = load_dequantised(d, c, skip)
    n_checked = check_dequant(m, tensors)
    runs = []
    impl = {"attn_implementation": m.config._attn_implementation,
            "experts_implementation": getattr(m.config, "_experts_implementation", None)}
    for i, toks in enumerate(seqs):
        rec, _ = teacher_forced(m, toks)
        runs.append(dict(kind="teacher_forced", dtype="float32", seq=i, **impl, **rec))
    for gseq in GREEDY_PROMPT_SEQS:
        g = greedy(m, seqs[gseq], GREEDY_STEPS)
        runs.append(dict(kind="greedy", dtype="float32", seq=gseq, **impl, **g))
    cls = type(m).__name__
    del m

    with open(os.path.join(d, "config.json")) as f:
        config_json = json.load(f)
    doc = {
        "format": FORMAT, "version": FORMAT_VERSION, "model": name, "seed": c["seed"],
        "generator": {"script": "harness/goldens/make_goldens_fp8.py", "torch": torch.__version__,
                      "transformers": transformers.__version__, "python": platform.python_version(),
                      "device": "cpu", "threads": torch.get_num_threads(), "model_class": cls,
                      "load": "FineGrainedFP8Config(dequantize=True), dtype float32"},
        "lm_head_scale": lm_scale,
        "config": config_json,
        "fp8": {"quantised_weights": n_checked, "dequantised_exactly": True},
        "runs": runs,
    }
    raw = json.dumps(doc, separators=(",", ":"), sort_keys=False).encode()
    tmpz = os.path.join(d, "expected.json.zst.tmp")
    with open(tmpz, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=19).compress(raw))
    os.replace(tmpz, os.path.join(d, "expected.json.zst"))
    for root, _, files in os.walk(d):
        for fn in files:
            os.chmod(os.path.join(root, fn), 0o644)
    return name, {"quantised_weights": n_checked, "tensors": len(tensors)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "goldens"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for c in CONFIGS:
        name, info = build_one(c, args.out)
        print("%s: %s" % (name, json.dumps(info)))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
