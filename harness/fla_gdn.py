#!/usr/bin/env python3
"""Times flash-linear-attention's Gated DeltaNet kernels at the shapes of one
Qwen3-Next-80B-A3B GDN layer, the yardstick of the GDN rows of
reports/perf-h200.md (docs/tensor-core-tier.md §3.5):

  chunk      chunk_gated_delta_rule over a prompt of --tokens tokens (one
             sequence), the chunked (WY, 64) prefill kernel
  recurrent  fused_recurrent_gated_delta_rule over the same prompt
  decode     fused_recurrent_gated_delta_rule, one token per sequence on a
             carried fp32 state, at each batch of --batches

Shapes: h_qk 16, h_v 32, d_k = d_v 128 (GVA: FLA repeats no head); q and k
already L2-normalised, g = log α, β in (0, 1). Inputs in --dtype (bf16, as
Qwen3-Next runs FLA, or fp32, as lockstep's portable tier computes); states
fp32. Each figure is the mean of --reps timed calls after 5 warm-ups (CUDA
events around the whole loop).

Usage: python3 harness/fla_gdn.py [--tokens 8192] [--batches 1,32]
           [--dtype bf16|fp32|both] [--kernels chunk,recurrent,decode]
           [--reps 20] [--json OUT.json]
Needs torch with a GPU and the fla-core and flash-linear-attention 0.6
packages (pure Python over Triton); exits 2 naming what is missing. Each
kernel's first calls compile its Triton code (minutes): --kernels chunk times
the chunked prefill alone, and every row is printed as soon as it is timed.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--dtype", choices=["bf16", "fp32", "both"], default="both")
    ap.add_argument("--kernels", default="chunk,recurrent,decode")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--hk", type=int, default=16)
    ap.add_argument("--hv", type=int, default=32)
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--json")
    a = ap.parse_args()
    try:
        batches = [int(b) for b in a.batches.split(",")]
    except ValueError:
        print(f"fla_gdn: --batches '{a.batches}': expected integers separated by commas", file=sys.stderr)
        return 2
    kernels = a.kernels.split(",")
    if not kernels or not set(kernels) <= {"chunk", "recurrent", "decode"}:
        print(f"fla_gdn: --kernels '{a.kernels}': expected some of chunk, recurrent, decode separated by commas",
              file=sys.stderr)
        return 2
    if a.tokens < 1 or a.reps < 1 or min(batches) < 1 or a.hv % a.hk:
        print("fla_gdn: --tokens, --reps and every batch must be >= 1, and --hk must divide --hv",
              file=sys.stderr)
        return 2
    try:
        import torch
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError as e:
        print(f"fla_gdn: {e}: needs torch and the fla-core and flash-linear-attention 0.6 packages",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("fla_gdn: torch sees no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1234)

    def inputs(B, T, dtype):
        def rnd(*shape):
            return torch.randn(*shape, device=dev, generator=gen, dtype=torch.float32)
        q = torch.nn.functional.normalize(rnd(B, T, a.hk, a.dk), dim=-1).to(dtype)
        k = torch.nn.functional.normalize(rnd(B, T, a.hk, a.dk), dim=-1).to(dtype)
        v = rnd(B, T, a.hv, a.dv).to(dtype)
        g = (-torch.rand(B, T, a.hv, device=dev, generator=gen) * 0.1).to(dtype)  # log α in (-0.1, 0]
        beta = torch.rand(B, T, a.hv, device=dev, generator=gen).to(dtype)
        return q, k, v, g, beta

    def timed(fn):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(a.reps):
            fn()
        t1.record()
        torch.cuda.synchronize()
        return t0.elapsed_time(t1) / a.reps

    facts = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
             "fla": getattr(fla, "__version__", "unknown"), "h_qk": a.hk, "h_v": a.hv, "d_k": a.dk,
             "d_v": a.dv, "reps": a.reps}
    print(f"FLA {facts['fla']} on {facts['gpu']} (torch {facts['torch']}): one GDN layer, h_qk {a.hk}, "
          f"h_v {a.hv}, d_k {a.dk}, d_v {a.dv}")
    print("| kernel | inputs | batch | tokens | ms per call |")
    print("|---|---|---|---|---|", flush=True)
    rows = []

    def row(kernel, dtype, batch, tokens, ms):
        rows.append({"kernel": kernel, "dtype": dtype, "batch": batch, "tokens": tokens, "ms": ms})
        print(f"| {kernel} | {dtype} | {batch} | {tokens} | {ms:.4f} |", flush=True)

    dtypes = {"bf16": [torch.bfloat16], "fp32": [torch.float32],
              "both": [torch.bfloat16, torch.float32]}[a.dtype]
    for dt in dtypes:
        name = "bf16" if dt == torch.bfloat16 else "fp32"
        q, k, v, g, beta = inputs(1, a.tokens, dt)
        if "chunk" in kernels:
            ms = timed(lambda: chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True))
            row("chunk_gated_delta_rule", name, 1, a.tokens, ms)
        if "recurrent" in kernels:
            ms = timed(lambda: fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, output_final_state=True))
            row("fused_recurrent_gated_delta_rule", name, 1, a.tokens, ms)
        for B in batches if "decode" in kernels else []:
            q, k, v, g, beta = inputs(B, 1, dt)
            h0 = torch.zeros(B, a.hv, a.dk, a.dv, device=dev, dtype=torch.float32)
            ms = timed(lambda: fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0,
                                                                output_final_state=True))
            row("fused_recurrent_gated_delta_rule (decode)", name, B, 1, ms)
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"facts": facts, "rows": rows}, f, indent=1)
        import os
        os.replace(tmp, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
