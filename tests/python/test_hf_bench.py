#!/usr/bin/env python3
"""harness/hf_bench.py on the CPU: the transformers timing of
reports/perf-h200.md at the synth `tiny` shapes (lockstep synth --config-only).

Checks: it runs to the end (exit 0) and its JSON holds a prefill figure and
one decode figure per batch, each a positive median of as many times as
steps asked for, the model of the config's layers, and where each Gated
DeltaNet kernel comes from; bad arguments and a config of another model
exit 2 with one line naming the field; --require-fla without FLA exits 2.

usage: test_hf_bench.py LOCKSTEP_BINARY SOURCE_DIR
Exit codes: 0 passed, 1 a check failed, 77 skipped: torch or transformers
not installed, or FLA installed (its kernels run on CUDA only, so
hf_bench refuses --device cpu there).
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
except ImportError:
    print("SKIP: torch/transformers not installed")
    sys.exit(77)
try:
    import fla.ops.gated_delta_rule  # noqa: F401
    print("SKIP: fla is installed (hf_bench times FLA's kernels on CUDA only)")
    sys.exit(77)
except Exception:  # not installed (or not importable here): transformers falls back to PyTorch
    pass

LS, SRC = sys.argv[1], os.path.abspath(sys.argv[2])
BENCH = os.path.join(SRC, "harness", "hf_bench.py")
WORK = tempfile.mkdtemp(prefix="lt_hfb_")
atexit.register(shutil.rmtree, WORK, True)
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def bench(*args):
    p = subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


subprocess.run([LS, "synth", "--preset", "tiny", "--seed", "1", "--config-only", "--out",
                os.path.join(WORK, "tiny")], check=True, capture_output=True)
cfg = os.path.join(WORK, "tiny", "config.json")
out = os.path.join(WORK, "hf.json")
rc, so, se = bench("--config", cfg, "--device", "cpu", "--batches", "1,3", "--context", "24", "--steps", "3",
                   "--prefill", "40", "--reps", "2", "--json", out)
check(rc == 0, f"runs at the tiny shapes (exit {rc}: {se.strip()[-300:]})")
if rc == 0:
    r = json.load(open(out))
    info = r["info"]
    check(info["layers"] == 4 and info["device"] == "cpu" and info["parameters"] > 0,
          f"the model of the config: {info['layers']} layers, {info['parameters']} parameters")
    check(sorted(info["kernels"]) == sorted(["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule",
                                             "causal_conv1d_fn", "causal_conv1d_update"])
          and not info["fla"] and all("fallback" in v for v in info["kernels"].values()),
          f"each GDN kernel's origin (no FLA here): {info['kernels']}")
    p = r["prefill"]
    check(p["tokens"] == 40 and len(p["all_ms"]) == 2 and p["ms"] > 0, f"prefill: {p}")
    d = r["decode"]
    check([x["batch"] for x in d] == [1, 3] and all(len(x["all_ms"]) == 3 and x["ms"] > 0 and x["context"] == 24
                                                     for x in d), f"decode per batch: {d}")
    check("transformers decode batch 3: context 24" in so and "transformers prefill 40 tokens" in so,
          "each figure printed")

# bad input: exit 2, one line naming what is wrong
other = os.path.join(WORK, "other.json")
with open(other, "w") as f:
    json.dump({"model_type": "qwen3_5_moe"}, f)
for args, needle in [
    (["--config", other], "field model_type"),
    (["--config", os.path.join(WORK, "missing.json")], "missing.json"),
    (["--config", cfg, "--batches", "1,0"], "--batches '1,0'"),
    (["--config", cfg, "--steps", "0"], "--steps"),
    (["--config", cfg, "--device", "cpu", "--require-fla"], "--require-fla"),
]:
    rc, so, se = bench(*args)
    lines = se.strip().splitlines()
    check(rc == 2 and len(lines) == 1 and needle in lines[0], f"{' '.join(args[2:]) or args[1]}: exit {rc}, {se.strip()}")
with open(os.path.join(WORK, "bad.json"), "w") as f:
    f.write('{"model_type": ')
rc, so, se = bench("--config", os.path.join(WORK, "bad.json"))
check(rc == 2 and "bad.json" in se and "char" in se, f"malformed JSON: exit {rc}, {se.strip()}")

print(f"{len(failures)} failed" if failures else "all passed")
sys.exit(1 if failures else 0)
