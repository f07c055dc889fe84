#!/usr/bin/env python3
"""lockstep — the HBM roofline of a decode step on W GPUs (harness/multi_gpu).

  multi_gpu_roofline.py MANIFEST WORLD CONC:MS_PER_STEP [CONC:MS_PER_STEP ...]

Bytes a decode step of c sequences must read, from the manifest's tensor
table (every tensor's size as stored: bf16, or e4m3 plus its block scales):
every tensor read once a step (attention and GDN projections, norms, router,
shared expert, lm_head, FP8 scales), c rows of the embedding, and per MoE
layer the distinct routed experts the c tokens choose, expected under
uniform routing, E (1 - (1 - k/E)^c) of E experts (each token picks k
different ones). KV-cache and state reads are left out (small at the short
contexts the harness runs). The bandwidth is measured here, now: on each of
the first WORLD CUDA devices a device-to-device copy of 2 GiB (read + write
bytes over the median time of 10 copies, through PyTorch), summed, the
ranks' bytes being split evenly (tensor parallelism splits every projection,
expert parallelism the experts). Prints a Markdown table: per concurrency
the bytes, the roofline time (bytes / summed bandwidth), the measured time
and their ratio; without PyTorch or CUDA devices the bandwidth and ratio
are "not measured"."""
import json
import statistics
import sys


def bandwidths(world):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or torch.cuda.device_count() < world:
        return None
    out = []
    n = 1 << 30  # bf16 elements: 2 GiB
    for d in range(world):
        with torch.cuda.device(d):
            a = torch.empty(n, dtype=torch.bfloat16, device=f"cuda:{d}")
            b = torch.empty_like(a)
            b.copy_(a)
            torch.cuda.synchronize()
            times = []
            for _ in range(10):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                b.copy_(a)
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) / 1000)
            out.append(2 * 2 * n / statistics.median(times))
            del a, b
            torch.cuda.empty_cache()
    return out


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    m = json.load(open(sys.argv[1]))
    world = int(sys.argv[2])
    points = [(int(c), float(ms)) for c, ms in (p.split(":") for p in sys.argv[3:])]
    arch = m["architecture"]
    E, k = arch["num_experts"], arch["num_experts_per_tok"]
    V = arch["vocab_size"]
    dense = expert = emb_row = 0
    moe_layers = set()
    for name, t in m["checkpoint"]["tensors"].items():
        if ".mlp.experts." in name:
            expert += t["size_bytes"]
            moe_layers.add(name.split(".mlp.experts.")[0])
        elif name.endswith("embed_tokens.weight"):
            emb_row = t["size_bytes"] / V
        else:
            dense += t["size_bytes"]
    per_expert = expert / max(1, len(moe_layers)) / E  # one expert of one layer
    bw = bandwidths(world)
    print("| concurrency | bytes per step (GB) | distinct experts per layer | roofline ms | measured ms | "
          "roofline / measured |")
    print("|---|---|---|---|---|---|")
    for c, ms in points:
        if ms <= 0:
            print(f"| {c} | | | | not measured | |")
            continue
        distinct = E * (1 - (1 - k / E) ** c)
        total = dense + c * emb_row + len(moe_layers) * distinct * per_expert
        if bw:
            roof = 1000 * total / sum(bw)
            print(f"| {c} | {total / 1e9:.2f} | {distinct:.1f} | {roof:.3f} | {ms:.3f} | {roof / ms:.3f} |")
        else:
            print(f"| {c} | {total / 1e9:.2f} | {distinct:.1f} | not measured | {ms:.3f} | not measured |")
    print()
    if bw:
        print("Copy bandwidth per GPU (GB/s, read + write): " + ", ".join(f"{b / 1e9:.0f}" for b in bw) +
              f"; summed over the {world} GPUs: {sum(bw) / 1e9:.0f} GB/s.")
    else:
        print(f"No bandwidth measured (PyTorch with {world} CUDA devices is not available here).")


if __name__ == "__main__":
    main()
