#!/usr/bin/env python3
"""lockstep_trace.hf against lockstep: the hooks on a transformers model of
each golden (goldens/qwen3next_tiny_*, fp32) write a replay trace of the
goldens' teacher-forced tokens; lockstep's fp32 replay of the same tokens is
set against it with `lockstep compare --stats`.

Checks: lockstep reads the hooks' trace (`trace dump`); the two traces hold
the same positions and digest kinds; the embed digests are equal at every
position (the embedding rows are the checkpoint's bf16 values, exact in
fp32: equal bytes mean the hooks' canonical bytes and alignment are
lockstep's); every dumped layer and kind has per-layer error figures, with
relative error < 1e-4 and cosine > 0.9999 (fp32 against fp32); the hooks'
logprobs are within 1e-4 of transformers' own in the goldens and their top-5
ids are the goldens'. Where transformers has Qwen3.5, small random Qwen3.5
MoE and dense models go through the same hooks: lockstep reads their traces,
the dense one without router digests, and an explicit name map records what
the default one does.

usage: test_hf_hooks.py LOCKSTEP_BINARY SOURCE_DIR [--evidence DIR]
  --evidence DIR   also write the compare reports (text, JSON) and a bf16
                   comparison there, for reports/
Exit codes: 0 passed, 1 a check failed, 77 torch/transformers not installed.
"""
import atexit
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
except ImportError:
    print("SKIP: torch/transformers not installed")
    sys.exit(77)

LS, SRC = sys.argv[1], os.path.abspath(sys.argv[2])
EVIDENCE = sys.argv[sys.argv.index("--evidence") + 1] if "--evidence" in sys.argv else None
sys.path.insert(0, os.path.join(SRC, "python"))
import zstandard  # noqa: E402

import lockstep_trace as lt  # noqa: E402
from lockstep_trace.hf import HFRecorder, write_replay  # noqa: E402

GOLDENS = ["qwen3next_tiny_a", "qwen3next_tiny_b", "qwen3next_tiny_c"]
EVERY = 16          # carried-state digests every 16 positions: several per sequence
WORK = tempfile.mkdtemp(prefix="lt_hf_")
atexit.register(shutil.rmtree, WORK, True)  # passed or failed
checks = 0


def ok(cond, msg):
    global checks
    checks += 1
    if not cond:
        print("FAIL: " + msg)
        sys.exit(1)


def run(*args):
    p = subprocess.run([LS] + [str(a) for a in args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def save(name, text):
    if EVIDENCE:  # trace names without this run's temporary directory
        with open(os.path.join(EVIDENCE, name), "w") as f:
            f.write(text.replace(WORK + os.sep, ""))


torch.set_num_threads(1)
if EVIDENCE:
    os.makedirs(EVIDENCE, exist_ok=True)
print("torch %s, transformers %s, python %s" % (torch.__version__, transformers.__version__, sys.version.split()[0]))
summary = []
for name in GOLDENS:
    ckpt = os.path.join(SRC, "goldens", name)
    with open(os.path.join(ckpt, "expected.json.zst"), "rb") as f:
        exp = json.loads(zstandard.ZstdDecompressor().decompressobj().decompress(f.read()))
    runs = [r for r in exp["runs"] if r["kind"] == "teacher_forced" and r["dtype"] == "float32" and len(r["tokens"]) >= 2]
    seqs = [{"id": r["seq"], "tokens": r["tokens"], "prompt_len": len(r["tokens"]) // 2} for r in runs]
    tok = os.path.join(WORK, name + ".jsonl")
    with open(tok, "w") as f:
        for s in seqs:
            f.write(json.dumps(s) + "\n")
    n_layers = exp["config"]["num_hidden_layers"]
    dump = ",".join(str(i) for i in range(n_layers))
    results = {}
    for act, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        if act == "bf16" and not (EVIDENCE and name == GOLDENS[0]):
            continue
        model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).eval()
        hf = os.path.join(WORK, "%s_%s_hf.trace" % (name, act))
        with HFRecorder(model, dump_decoder_layers=range(n_layers), state_digest_every=EVERY) as rec:
            ok(rec.digest_kinds == list(lt.KINDS), "%s: the hooks give every kind: %s" % (name, rec.digest_kinds))
            write_replay(hf, rec, seqs, model_fingerprint=lt.model_fingerprint(ckpt))
        rc, out, err = run("trace", "dump", hf)
        ok(rc == 0, "%s: lockstep reads the hooks' trace: %s" % (name, err))
        ls = os.path.join(WORK, "%s_%s_lockstep.trace" % (name, act))
        rc, out, err = run("run", "--checkpoint", ckpt, "--mode", "replay", "--tokens", tok, "--activations", act,
                           "--state-digest-every", EVERY, "--dump-layers", dump, "-o", ls)
        ok(rc == 0, "%s: lockstep run: %s" % (name, err))
        cj = os.path.join(WORK, "%s_%s.json" % (name, act))
        rc, text, err = run("compare", "--stats", "--json", cj, ls, hf)
        ok(rc in (0, 1), "%s %s: lockstep compare --stats: rc %d %s" % (name, act, rc, err))
        with open(cj) as f:
            rep = json.load(f)
        save("%s_%s_compare.txt" % (name, act), text)
        save("%s_%s_compare.json" % (name, act), json.dumps(rep, indent=1) + "\n")
        results[act] = (rep, hf)

    rep, hf = results["fp32"]
    ok(rep["digest_kinds_compared"] == list(lt.KINDS), "%s: kinds compared %s" % (name, rep["digest_kinds_compared"]))
    n_rec = sum(len(s["tokens"]) - 1 for s in seqs)
    ok(rep["a"]["records"] == rep["b"]["records"] == n_rec, "%s: both traces hold %d records" % (name, n_rec))
    layers = {l["layer"]: l for l in rep["stats"]["layers"]}
    ok(len(layers) == 2 * n_layers + 3, "%s: per-layer figures for %d layers" % (name, len(layers)))
    ok(layers[0]["digests_differ"] == 0 and layers[0]["digests_compared"] == n_rec,
       "%s: embed digests equal at every position: %s" % (name, layers[0]))
    with lt.TraceReader(hf) as r:
        families = [l.family for l in r.header.layers]
    worst = (0.0, 1.0)
    for li in range(1, 2 * n_layers + 1):
        kinds = {d["kind"]: d for d in layers[li]["dumps"]}
        want = set(lt.FAMILY_KINDS[families[li]])
        ok(set(kinds) == want, "%s layer %d (%s): dumps of %s, want %s" % (name, li, families[li], sorted(kinds), sorted(want)))
        for k, d in kinds.items():
            every = k not in ("gdn_state", "conv_state")
            ok(d["positions"] == n_rec if every else d["positions"] > 0,
               "%s layer %d %s: figures at %d positions" % (name, li, k, d["positions"]))
            ok(d["rel_err"] < 1e-4 and d["cos_min"] > 0.9999,
               "%s layer %d %s: rel err %g, cos min %g (fp32 against fp32)" % (name, li, k, d["rel_err"], d["cos_min"]))
            worst = (max(worst[0], d["rel_err"]), min(worst[1], d["cos_min"]))
    # the hooks' logprobs and top-5 against transformers' own outputs in the goldens
    recs = {}
    with lt.TraceReader(hf) as r:
        for x in r:
            recs[(x.seq, x.pos)] = x
    dmax = 0.0
    for g in runs:
        for p, bits in enumerate(g["next_logprob"]):
            x = recs[(g["seq"], p)]
            ok(x.next_token == g["tokens"][p + 1], "%s seq %d pos %d: next token" % (name, g["seq"], p))
            dmax = max(dmax, abs(f32(x.logprob_bits) - f32(int(bits, 16))))
            ok([i for i, _ in x.topk] == g["top5_ids"][p], "%s seq %d pos %d: top-5 %s, goldens %s"
               % (name, g["seq"], p, [i for i, _ in x.topk], g["top5_ids"][p]))
    ok(dmax < 1e-4, "%s: hooks' logprobs within 1e-4 of the goldens (max %g)" % (name, dmax))
    st = rep["stats"]
    line = ("%s: %d records, %d layers; compare %s; max |d logprob| vs lockstep %.3g, vs transformers' goldens %.3g; "
            "embed digests equal %d/%d; worst dumped layer rel err %.3g, cos min %.9f"
            % (name, n_rec, 2 * n_layers + 3, rep["result"], st["dlogprob"]["max"], dmax, n_rec, n_rec, worst[0], worst[1]))
    print(line)
    summary.append(line)

# Qwen3.5 (when transformers has it): small random models, MoE and dense. The
# hooks find the same trace layers; the dense model has no router, so router is
# left out of digest_kinds; lockstep reads both traces. An explicit name map
# naming the default modules records the same bytes.
if hasattr(transformers, "Qwen3_5MoeForCausalLM") and hasattr(transformers, "Qwen3_5ForCausalLM"):
    from transformers.models.qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig
    kw = dict(vocab_size=97, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
              linear_value_head_dim=8, intermediate_size=48)
    for name, cfg, cls in (("moe", Qwen3_5MoeTextConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                                         shared_expert_intermediate_size=16, **kw),
                            transformers.Qwen3_5MoeForCausalLM),
                           ("dense", Qwen3_5TextConfig(**kw), transformers.Qwen3_5ForCausalLM)):
        torch.manual_seed(0)
        model = cls(cfg).float().eval()
        seq = [{"id": 0, "tokens": list(range(3, 20)), "prompt_len": 5}]
        paths = []
        for nm in (None, {"layers": "model.layers", "norm": "model.norm", "lm_head": "lm_head",
                          "embed": "model.embed_tokens", "mixer_residual": "post_attention_layernorm:input"}):
            path = os.path.join(WORK, "qwen3_5_%s_%d.trace" % (name, len(paths)))
            with HFRecorder(model, dump_decoder_layers=[0, 3], state_digest_every=4, name_map=nm) as rec:
                want = [k for k in lt.KINDS if k != "router" or name == "moe"]
                ok(rec.digest_kinds == want, "Qwen3.5 %s: kinds %s, want %s" % (name, rec.digest_kinds, want))
                ok([f for f, _ in rec.layers] == ["embed"] + ["gdn", "moe"] * 3 + ["attention", "moe", "norm", "lm_head"],
                   "Qwen3.5 %s: trace layers %s" % (name, rec.layers))
                write_replay(path, rec, seq, model_fingerprint="ef" * 32)
            rc, out, err = run("trace", "dump", path)
            ok(rc == 0, "Qwen3.5 %s: lockstep reads the hooks' trace: %s" % (name, err))
            paths.append(path)
        a, b = lt.read_trace(paths[0])[1], lt.read_trace(paths[1])[1]
        ok(a == b, "Qwen3.5 %s: the explicit name map records what the default one does" % name)
        line = "Qwen3.5 %s (%s, random 4-layer): %d records, kinds %s; lockstep reads it" % (
            name, cls.__name__, len(a), ",".join(rec.digest_kinds))
        print(line)
        summary.append(line)
save("summary.txt", "\n".join(summary) + "\n")
print("%d checks passed, 0 failed" % checks)
