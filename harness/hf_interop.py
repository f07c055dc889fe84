#!/usr/bin/env python3
"""Hugging Face interoperability check for lockstep checkpoints.

What it checks:
  (a) transformers -> lockstep: builds a small Qwen3NextForCausalLM in
      transformers, saves it with save_pretrained (safetensors), and runs
      `lockstep manifest pin` on the directory; pin must succeed and count
      every tensor transformers wrote.
  (b) lockstep -> transformers: runs `lockstep synth --preset tiny` (or
      --preset small), loads it with AutoModelForCausalLM.from_pretrained and
      requires no missing, unexpected or mismatched keys; runs an fp32 forward
      pass on random tokens and prints the logit statistics that show the
      checkpoint is "sensitive" (mean top-1 log-probability, logit std,
      entropy, hidden-state RMS per layer, GDN decay range), plus how often a
      bf16 forward pass picks a different top-1 token than the fp32 one.

How to run (from the repository root, after building):
    python3 harness/hf_interop.py [--lockstep build/lockstep] [--preset tiny|small]

Needs python3 with torch, transformers and safetensors. Exit codes: 0 all
checks passed, 1 a check failed, 77 torch/transformers not installed (skip).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM
except ImportError:
    print("SKIP: torch/transformers not installed")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.stdout.strip():
        print(p.stdout.rstrip())
    return p.returncode


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check_hf_to_lockstep(lockstep, work):
    """(a) a transformers-written checkpoint goes through `manifest pin`."""
    print("== (a) transformers save_pretrained -> lockstep manifest pin")
    cfg = Qwen3NextConfig(
        vocab_size=515, hidden_size=64, num_hidden_layers=2, full_attention_interval=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, intermediate_size=128,
        rope_theta=10000000.0, partial_rotary_factor=0.25)
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(cfg).to(torch.bfloat16)
    out = os.path.join(work, "hf_saved")
    model.save_pretrained(out)
    from safetensors import safe_open
    names = []
    for f in sorted(os.listdir(out)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(out, f), "pt") as st:
                names += list(st.keys())
    experts = [n for n in names if ".mlp.experts." in n]
    layout = "per-expert" if any(".experts.0." in n for n in experts) else "fused"
    print(f"transformers {transformers.__version__} wrote {len(names)} tensors "
          f"({layout} expert layout), files: {sorted(os.listdir(out))}")
    manifest = os.path.join(work, "hf_manifest.json")
    rc = run([lockstep, "manifest", "pin", "--checkpoint", out, "-o", manifest])
    if rc != 0:
        fail(f"lockstep manifest pin exited {rc} on a transformers checkpoint")
    with open(manifest) as f:
        m = json.load(f)
    count = m["checkpoint"]["tensor_count"]
    if count != len(names):
        fail(f"manifest counts {count} tensors, transformers wrote {len(names)}")
    print(f"OK: manifest pinned, {count} tensors")


def check_lockstep_to_hf(lockstep, work, preset, seed):
    """(b) a synth checkpoint loads cleanly and has a realistic logit spread."""
    print(f"== (b) lockstep synth --preset {preset} -> transformers from_pretrained")
    out = os.path.join(work, "synth_" + preset)
    rc = run([lockstep, "synth", "--preset", preset, "--seed", str(seed), "--out", out])
    if rc != 0:
        fail(f"lockstep synth exited {rc}")
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True,
                                                       dtype=torch.float32)
    bad = {k: sorted(v) for k, v in info.items() if v}
    if bad:
        fail(f"loading info not clean: {bad}")
    print(f"OK: {type(model).__name__} loaded, no missing/unexpected/mismatched keys")
    c = model.config
    print(f"config: layers {c.num_hidden_layers} {c.layer_types}, vocab {c.vocab_size}, "
          f"rope {c.rope_parameters}")

    torch.manual_seed(1234)
    batch, seq = 4, 64
    ids = torch.randint(0, c.vocab_size, (batch, seq))
    model.eval()
    with torch.no_grad():
        res = model(ids, output_hidden_states=True)
    logits = res.logits.float()
    lp = torch.log_softmax(logits, dim=-1)
    top1 = lp.max(dim=-1).values.mean().item()
    std = logits.std(dim=-1).mean().item()
    ent = (-(lp.exp() * lp).sum(dim=-1)).mean().item()
    print(f"fp32 forward on {batch}x{seq} random tokens:")
    print(f"  mean top-1 logprob {top1:.3f}   (uniform would be {-math.log(c.vocab_size):.3f})")
    print(f"  logit std          {std:.3f}")
    print(f"  entropy            {ent:.3f} nats (uniform {math.log(c.vocab_size):.3f})")
    rms = [h.float().pow(2).mean().sqrt().item() for h in res.hidden_states]
    print("  hidden RMS by layer " + " ".join(f"{r:.2f}" for r in rms))

    # GDN decay alpha = exp(-exp(A_log) * softplus(a + dt_bias)) with the
    # actual a = x W_a of the random tokens is data dependent; report the
    # bias-only value (a = 0) and the range over a in [-3, 3].
    lo, hi, mid = 1.0, 0.0, []
    for name, p in model.named_parameters():
        if name.endswith("linear_attn.A_log"):
            A = p.detach().float().exp()
            dtb = model.get_parameter(name.replace("A_log", "dt_bias")).detach().float()
            for a in (-3.0, 0.0, 3.0):
                alpha = torch.exp(-A * torch.nn.functional.softplus(a + dtb))
                lo, hi = min(lo, alpha.min().item()), max(hi, alpha.max().item())
                if a == 0.0:
                    mid += alpha.tolist()
    print(f"  GDN decay alpha at a=0: {min(mid):.4f} .. {max(mid):.4f}; "
          f"over a in [-3, 3]: {lo:.4f} .. {hi:.4f}")

    # Sensitivity: the same model in bf16 picks a different top-1 token at
    # some positions, so rounding differences are visible in the output.
    bf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    with torch.no_grad():
        lb = bf(ids).logits.float()
    flips = (lb.argmax(-1) != logits.argmax(-1)).float().mean().item()
    dmax = (lb - logits).abs().max().item()
    print(f"  bf16 vs fp32: top-1 differs at {100 * flips:.1f}% of positions, "
          f"max |logit diff| {dmax:.3f}")
    if not (-2.5 < top1 < -0.3):
        fail(f"mean top-1 logprob {top1:.3f} is not in (-2.5, -0.3): checkpoint not sensitive")
    if not (0.0 < lo and hi < 1.0):
        fail(f"GDN decays {lo}..{hi} not inside (0, 1)")
    print("OK: logits have a realistic spread")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lockstep", default=os.path.join(ROOT, "build", "lockstep"),
                    help="path to the lockstep binary (default build/lockstep)")
    ap.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if not os.access(args.lockstep, os.X_OK):
        fail(f"{args.lockstep} is not an executable (build first, or pass --lockstep)")
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    with tempfile.TemporaryDirectory(prefix="lockstep-hf-") as work:
        check_hf_to_lockstep(args.lockstep, work)
        check_lockstep_to_hf(args.lockstep, work, args.preset, args.seed)
    print("PASS")


if __name__ == "__main__":
    main()
