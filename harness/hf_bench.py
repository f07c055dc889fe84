#!/usr/bin/env python3
"""Times Hugging Face transformers on a Qwen3-Next model of the shapes of a
config.json, with flash-linear-attention's kernels where FLA is installed:
the reference most users trust today, set beside lockstep's tiers in
reports/perf-h200.md (the same shapes, timed in the same device call as
harness/bench_gpu).

The config is the one lockstep runs, for instance that of 12 layers of the
released Qwen3-Next-80B-A3B:

    lockstep synth --preset qwen3-next-80b-a3b --layers 12 --seed 1 \\
        --config-only --out CFG_DIR

The model (Qwen3NextForCausalLM) is built from it directly on the device,
with transformers' own random initialisation (seeded), in --dtype; no
checkpoint is read. What is timed, each with CUDA events (wall clock on the
CPU), after warm-up:

  prefill  one sequence of --prefill random tokens through the model with an
           empty cache, logits at every position (as lockstep's prefill
           records every position's logprob): the median of --reps calls
  decode   at each batch of --batches: a prompt of --context random tokens
           per sequence prefilled (not timed), then --steps decode steps,
           one greedy token per sequence a step, on the cache (transformers'
           DynamicCache: the KV of the attention layers, the conv and
           recurrent states of the Gated DeltaNet layers): the median step

The first lines say what ran: torch and transformers versions, the device,
the attention and experts implementations transformers chose, and, for each
Gated DeltaNet kernel transformers dispatches (chunk_gated_delta_rule,
fused_recurrent_gated_delta_rule, causal_conv1d_fn, causal_conv1d_update),
whether it is FLA's (or causal-conv1d's) or transformers' PyTorch fallback.
--require-fla exits 2 when FLA's two delta-rule kernels are not the ones in
use.

Usage: python3 harness/hf_bench.py --config CONFIG_JSON [--batches 1,32]
           [--context 256] [--steps 16] [--prefill 1024] [--reps 3]
           [--device cuda|cpu] [--dtype bf16|fp32]
           [--experts eager|grouped_mm|batched_mm] [--require-fla]
           [--seed 1] [--json OUT.json]
Needs torch and transformers (5.x, with Qwen3-Next); exits 2 naming what is
missing or wrong. Each figure is printed as soon as it is measured.
"""
import argparse
import json
import os
import statistics
import sys
import time

DELTA_KERNELS = ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")
CONV_KERNELS = ("causal_conv1d_fn", "causal_conv1d_update")


def fail(msg):
    print(f"hf_bench: {msg}", file=sys.stderr)
    sys.exit(2)


def positive_list(text, what):
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        vals = []
    if not vals or min(vals) < 1:
        fail(f"{what} '{text}': expected positive integers separated by commas")
    return vals


def kernel_origin(module, name):
    """Where the implementation of kernel `name` that `module` dispatches to
    comes from. transformers wraps each such kernel (whatever the wrapped
    function is called in a given release) in closures that hold the kernel's
    name and the implementation it resolved at import: the package's (fla,
    causal_conv1d) or its own PyTorch fallback."""
    def cells(f):
        for cell in getattr(f, "__closure__", None) or ():
            try:
                yield cell.cell_contents
            except ValueError:
                pass

    for attr in vars(module).values():
        if not callable(attr) or name not in [c for c in cells(attr) if isinstance(c, str)]:
            continue
        seen, todo = set(), [attr]
        while todo:
            f = todo.pop()
            if id(f) in seen or not callable(f):
                continue
            seen.add(id(f))
            mod = getattr(f, "__module__", "") or ""
            if mod and not mod.startswith("transformers"):
                return mod
            todo.extend(cells(f))
            if getattr(f, "__wrapped__", None) is not None:
                todo.append(f.__wrapped__)
        return "transformers (PyTorch fallback)"
    return "not dispatched by this transformers"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--experts", choices=["eager", "grouped_mm", "batched_mm"])
    ap.add_argument("--require-fla", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    batches = positive_list(a.batches, "--batches")
    if a.context < 1 or a.steps < 1 or a.prefill < 0 or a.reps < 1:
        fail("--context, --steps and --reps must be >= 1, --prefill >= 0 (0: not timed)")
    try:
        with open(a.config, encoding="utf-8") as f:
            cfg_json = json.load(f)
    except OSError as e:
        fail(f"{a.config}: cannot read: {e.strerror}")
    except ValueError as e:
        fail(f"{a.config}: not JSON: {e}")
    if not isinstance(cfg_json, dict) or cfg_json.get("model_type") != "qwen3_next":
        fail(f"{a.config}: field model_type: expected \"qwen3_next\"")
    try:
        import torch
        import transformers
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
        from transformers.models.qwen3_next import modeling_qwen3_next as mq
    except ImportError as e:
        fail(f"{e}: needs torch and transformers 5.x with Qwen3-Next")
    # its warnings that a kernel falls back to PyTorch: the origins line says it
    transformers.logging.set_verbosity_error()
    if a.device == "cuda" and not torch.cuda.is_available():
        fail("torch sees no CUDA device (--device cpu runs on the CPU)")

    origins = {name: kernel_origin(mq, name) for name in DELTA_KERNELS + CONV_KERNELS}
    fla = all(origins[n].startswith("fla") for n in DELTA_KERNELS)
    if a.device == "cpu" and any(o.startswith("fla") for o in origins.values()):
        fail("--device cpu: transformers dispatches to FLA, whose Triton kernels run on CUDA only "
             "(on the CPU, time it where fla is not installed)")
    if a.require_fla and not fla:
        fail("--require-fla: transformers runs " + ", ".join(f"{n} from {origins[n]}" for n in DELTA_KERNELS)
             + " (install fla-core and flash-linear-attention)")

    kw = {k: v for k, v in cfg_json.items() if k not in ("architectures", "torch_dtype", "dtype")}
    try:
        cfg = Qwen3NextConfig(**kw)
    except (TypeError, ValueError) as e:
        fail(f"{a.config}: transformers' Qwen3NextConfig refuses it: {e}")
    if "full_attention" not in (getattr(cfg, "layer_types", None) or []):
        fail(f"{a.config}: no full-attention layer among its {cfg.num_hidden_layers} (transformers' cache "
             "cannot decode without one: take more layers)")
    dev = torch.device(a.device)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    torch.manual_seed(a.seed)
    t0 = time.time()
    extra = {"experts_implementation": a.experts} if a.experts else {}
    with torch.device(dev):
        model = Qwen3NextForCausalLM._from_config(cfg, dtype=dtype, **extra)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    if dev.type == "cuda":
        torch.cuda.synchronize()
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    info = {
        "torch": torch.__version__, "transformers": transformers.__version__, "device": gpu,
        "dtype": a.dtype, "layers": cfg.num_hidden_layers, "parameters": n_params,
        "attention": model.config._attn_implementation, "experts": model.config._experts_implementation,
        "kernels": origins, "fla": fla,
    }
    print(f"hf_bench: torch {torch.__version__}, transformers {transformers.__version__}, {gpu}, {a.dtype}, "
          f"{cfg.num_hidden_layers} layers, {n_params / 1e9:.2f} G parameters (built in {time.time() - t0:.1f} s)")
    print(f"hf_bench: attention {info['attention']}, experts {info['experts']}; "
          + ", ".join(f"{n} from {o}" for n, o in origins.items()))
    sys.stdout.flush()

    gen = torch.Generator(device="cpu").manual_seed(a.seed)

    def tokens(b, t):
        return torch.randint(0, cfg.vocab_size, (b, t), generator=gen).to(dev)

    def timed(fn):
        """fn's result and its time in ms: CUDA events on a GPU."""
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return out, start.elapsed_time(end)
        t = time.perf_counter()
        out = fn()
        return out, (time.perf_counter() - t) * 1e3

    results = {"info": info, "prefill": None, "decode": []}
    with torch.inference_mode():
        if a.prefill:
            ids = tokens(1, a.prefill)
            times = []
            for i in range(a.reps + 1):  # the first call warms up
                _, ms = timed(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=0))
                if i:
                    times.append(ms)
            med = statistics.median(times)
            results["prefill"] = {"tokens": a.prefill, "ms": med, "all_ms": times}
            print(f"transformers prefill {a.prefill} tokens, batch 1: {med:.2f} ms "
                  f"(median of {a.reps}; {a.prefill / med * 1e3:.0f} tokens/s)")
            sys.stdout.flush()
        for b in batches:
            out = model(input_ids=tokens(b, a.context), use_cache=True, logits_to_keep=1)
            cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            times = []
            for i in range(a.steps + 3):  # three warm-up steps
                out, ms = timed(lambda: model(input_ids=nxt, past_key_values=cache, use_cache=True))
                cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                if i >= 3:
                    times.append(ms)
            med = statistics.median(times)
            results["decode"].append({"batch": b, "context": a.context, "ms": med, "all_ms": times})
            print(f"transformers decode batch {b}: context {a.context}, median of {a.steps} steps {med:.2f} ms/step "
                  f"(min {min(times):.2f}, max {max(times):.2f}; {b / med * 1e3:.1f} tokens/s)")
            sys.stdout.flush()
            del cache, out
    if a.json:
        tmp = f"{a.json}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
        os.replace(tmp, a.json)
    print("hf_bench: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
