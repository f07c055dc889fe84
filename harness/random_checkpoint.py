#!/usr/bin/env python3
"""Writes a checkpoint directory of random bytes for benchmarks and tests.

    harness/random_checkpoint.py OUT_DIR [--bytes N] [--tensors K] [--shards S] [--seed X]

Tensors are BF16 matrices named model.layers.<i>.mlp.w.weight, split into S
shards (model-0000s-of-0000S.safetensors plus model.safetensors.index.json
when S > 1, model.safetensors otherwise), with a small Qwen3-Next style
config.json. The data is pseudo-random (not meant to be a usable model) but
every value is finite: the top exponent bit of each BF16 is cleared (|x| < 2),
since lockstep refuses NaN and Inf weights while fingerprinting.
"""
import argparse
import json
import os
import random
import struct


_MASKS = {}


def finite_bf16(raw):
    """raw (an even number of bytes) with bit 14 of every little-endian BF16
    cleared: the exponent stays below 0xFF, so no NaN or Inf."""
    mask = _MASKS.get(len(raw))
    if mask is None:
        mask = _MASKS[len(raw)] = int.from_bytes(b"\xff\xbf" * (len(raw) // 2), "little")
    return (int.from_bytes(raw, "little") & mask).to_bytes(len(raw), "little")


def write_safetensors(path, tensors, rng):
    header, offset = {}, 0
    for name, shape in tensors:
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape in tensors:
            n = 2
            for d in shape:
                n *= d
            left = n
            while left:
                k = min(left, 1 << 24)
                f.write(finite_bf16(rng.randbytes(k)))
                left -= k
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    cols = 1024
    rows = max(1, a.bytes // (a.tensors * cols * 2))
    tensors = [("model.layers.%d.mlp.w.weight" % i, [rows, cols]) for i in range(a.tensors)]
    config = {"model_type": "qwen3_next", "hidden_size": cols, "num_hidden_layers": a.tensors,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
              "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1024,
              "rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-6,
              "norm_topk_prob": True, "tie_word_embeddings": False}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if a.shards <= 1:
        write_safetensors(os.path.join(a.out, "model.safetensors"), tensors, rng)
        return
    weight_map = {}
    for s in range(a.shards):
        part = tensors[s::a.shards]
        fname = "model-%05d-of-%05d.safetensors" % (s + 1, a.shards)
        write_safetensors(os.path.join(a.out, fname), part, rng)
        for name, _ in part:
            weight_map[name] = fname
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)


if __name__ == "__main__":
    main()
