#!/usr/bin/env python3
"""Write engine-shaped example outputs from a lockstep rollout trace.

usage: import_examples.py --lockstep BIN ROLLOUT.trace OUT_DIR [--bump SEQ:POS]

Reads the rollout with `lockstep trace dump --json` and writes, in OUT_DIR,
the same tokens and logprob bits in the shape each engine writes them
(docs/import.md states the field rules these follow):

  vllm-completions.json   vLLM OpenAI server, /v1/completions with a list of
                          prompts, logprobs=K, prompt_logprobs=K,
                          return_tokens_as_token_ids, return_token_ids
  vllm-chat.jsonl         vLLM OpenAI server, one /v1/chat/completions response
                          per line, top_logprobs=K, token ids as above
  vllm-offline.jsonl      vLLM LLM.generate RequestOutput dumped as JSON, one per
                          line (logprobs=K, prompt_logprobs=K)
  sglang.json             SGLang /generate batch response (return_logprob,
                          top_logprobs_num=K, logprob_start_len=0), written as
                          orjson writes it (non-finite floats as null)
  verl.safetensors        verl rollout tensors: rollout_log_probs F32 [B, R]
                          padded with -1, responses, input_ids, attention_mask,
                          prompts (int64), R = generated tokens + 2
  lockstep.jsonl          lockstep's own per-token JSONL

Floats are written as the engines write them: the fp32 value widened to a
Python float and printed by json (the shortest text that reads back as that
double, which strtof rounds back to the same fp32). Where the trace does not
know a Logprob's rank (a selected or prompt token outside the top-K) the
example writes rank null.

--bump SEQ:POS adds one ULP to the selected-token logprob of record (SEQ, POS)
(and to the same token's top-K entry) before writing: the test that a 1-ulp
change is found and named uses it. Standard library only.
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys

K = 5


def f32(bits):
    """The Python float (double) holding exactly the fp32 value of bits."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def read_rollout(lockstep, path):
    out = subprocess.run([lockstep, "trace", "dump", "--json", path], check=True, capture_output=True, text=True)
    header, records = None, []
    for line in out.stdout.splitlines():
        obj = json.loads(line)
        if "header" in obj:
            header = obj["header"]
        elif "record" in obj:
            records.append(obj["record"])
    if header is None or header["mode"] != "rollout":
        sys.exit(f"{path}: not a rollout trace")
    plen = {b["id"]: b["prompt_len"] for b in header["run_params"]["batch"]}
    seqs = {}
    for r in records:
        s = seqs.setdefault(r["seq"], {"id": r["seq"], "prompt_len": plen[r["seq"]], "recs": []})
        s["recs"].append(r)
    for s in seqs.values():
        recs = sorted(s["recs"], key=lambda r: r["pos"])
        if [r["pos"] for r in recs] != list(range(len(recs))):
            sys.exit(f"{path}: sequence {s['id']} has holes")
        p = s["prompt_len"]
        s["prompt"] = [r["token"] for r in recs[:p]]
        s["gen"] = [r["next_token"] for r in recs[p - 1:]]
        # per scored token position t >= 1: (token, logprob bits, [(id, bits)] top-K in rank order)
        s["scores"] = {}
        for r in recs:
            top = [(e["id"], int(e["logprob_bits"], 16)) for e in r["topk"] if e["id"] >= 0][:K]
            s["scores"][r["pos"] + 1] = (r["next_token"], int(r["logprob_bits"], 16), top)
    return header, [seqs[k] for k in sorted(seqs)]


def bump(seqs, spec):
    seq, pos = (int(x) for x in spec.split(":"))
    s = next(s for s in seqs if s["id"] == seq)
    tok, bits, top = s["scores"][pos + 1]
    nb = bits + 1  # one ULP away from zero
    s["scores"][pos + 1] = (tok, nb, [(i, nb if i == tok else b) for i, b in top])


def rank_of(tok, top):
    for i, (t, _) in enumerate(top):
        if t == tok:
            return i + 1
    return None


def check_ties(seqs):
    """A tie between the selected token and another top-K entry has no order the
    OpenAI-server formats can carry (docs/import.md); refuse such a rollout."""
    for s in seqs:
        for t, (tok, bits, top) in s["scores"].items():
            if any(b == bits and i != tok for i, b in top):
                sys.exit(f"sequence {s['id']} token position {t}: the selected token ties with another top-{K} "
                         "entry; pick another rollout (seed)")


# ---- vLLM ---------------------------------------------------------------------------------


def vllm_map(tok, bits, top, logprob_value):
    """vLLM's per-position dict: the selected token first, then the top-K in
    rank order (a token already present keeps its first place)."""
    d = {tok: logprob_value(tok, bits, rank_of(tok, top))}
    for i, (t, b) in enumerate(top):
        d[t] = logprob_value(t, b, i + 1)
    return d


def clamp(x):
    return max(x, -9999.0)  # serving_completion.py / serving_chat.py


def vllm_logprob_obj(tok, bits, rank):
    return {"logprob": f32(bits), "rank": rank, "decoded_token": f"token_id:{tok}"}


def vllm_prompt_logprobs(s, clamped):
    out = [None]
    for t in range(1, s["prompt_len"]):
        tok, bits, top = s["scores"][t]
        d = vllm_map(tok, bits, top, vllm_logprob_obj)
        if clamped:
            for v in d.values():
                v["logprob"] = clamp(v["logprob"])
        out.append({str(k): v for k, v in d.items()})
    return out


def vllm_completions(seqs, model):
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for i, s in enumerate(seqs):
        tokens, lps, tops, offsets = [], [], [], []
        last = 0
        for step, tok in enumerate(s["gen"]):
            t = s["prompt_len"] + step
            tok_, bits, top = s["scores"][t]
            assert tok_ == tok
            d = vllm_map(tok, bits, top, lambda t_, b, r: clamp(f32(b)))
            items = list(d.items())
            name = f"token_id:{tok}"
            tokens.append(name)
            lps.append(clamp(f32(bits)))
            tops.append({f"token_id:{k}": v for j, (k, v) in enumerate(items) if K >= j})
            offsets.append(0 if not offsets else offsets[-1] + last)
            last = len(name)
        choices.append({
            "index": i, "text": "", "logprobs": {"text_offset": offsets, "token_logprobs": lps,
                                                               "tokens": tokens, "top_logprobs": tops},
            "finish_reason": "length", "stop_reason": None,
            "prompt_logprobs": vllm_prompt_logprobs(s, clamped=True),
            "prompt_token_ids": s["prompt"], "token_ids": s["gen"]})
        prompt_tokens += s["prompt_len"]
        completion_tokens += len(s["gen"])
    return {"id": "cmpl-6f1c0d2e9a8b4c7d", "object": "text_completion", "created": 1767225600, "model": model,
            "choices": choices, "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                      "completion_tokens": completion_tokens, "prompt_tokens_details": None},
            "prompt_logprobs": None, "kv_transfer_params": None}


def vllm_chat(seqs, model):
    out = []
    for i, s in enumerate(seqs):
        content = []
        for step, tok in enumerate(s["gen"]):
            _, bits, top = s["scores"][s["prompt_len"] + step]
            d = vllm_map(tok, bits, top, lambda t_, b, r: clamp(f32(b)))
            name = f"token_id:{tok}"
            content.append({
                "token": name, "logprob": clamp(f32(bits)), "bytes": list(name.encode()),
                "top_logprobs": [{"token": f"token_id:{k}", "logprob": v, "bytes": list(f"token_id:{k}".encode())}
                                 for j, (k, v) in enumerate(d.items()) if j < K]})
        out.append({
            "id": f"chatcmpl-{i:04d}a7e3", "object": "chat.completion", "created": 1767225600 + i, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "", "refusal": None,
                                                 "tool_calls": [], "reasoning_content": None},
                         "logprobs": {"content": content}, "finish_reason": "length", "stop_reason": None,
                         "token_ids": s["gen"]}],
            "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": s["prompt_len"], "total_tokens": s["prompt_len"] + len(s["gen"]),
                      "completion_tokens": len(s["gen"]), "prompt_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_ids": s["prompt"], "kv_transfer_params": None})
    return out


def vllm_offline(seqs):
    out = []
    for i, s in enumerate(seqs):
        lps, cum = [], 0.0
        for step, tok in enumerate(s["gen"]):
            _, bits, top = s["scores"][s["prompt_len"] + step]
            d = vllm_map(tok, bits, top, vllm_logprob_obj)
            lps.append({str(k): v for k, v in d.items()})
            cum += f32(bits)
        out.append({
            "request_id": str(i), "prompt": None, "prompt_token_ids": s["prompt"],
            "prompt_logprobs": vllm_prompt_logprobs(s, clamped=False),
            "outputs": [{"index": 0, "text": "", "token_ids": s["gen"], "cumulative_logprob": cum,
                         "logprobs": lps, "finish_reason": "length", "stop_reason": None}],
            "finished": True, "num_cached_tokens": 0})
    return out


# ---- SGLang -------------------------------------------------------------------------------


def orjson_float(x):
    return x if math.isfinite(x) else None  # orjson writes NaN and +-inf as null


def sglang(seqs):
    out = []
    for i, s in enumerate(seqs):
        p = s["prompt_len"]
        in_lp = [[None, s["prompt"][0], None]]
        in_top = [None]
        for t in range(1, p):
            tok, bits, top = s["scores"][t]
            in_lp.append([orjson_float(f32(bits)), tok, None])
            in_top.append([[orjson_float(f32(b)), k, None] for k, b in top])
        out_lp, out_top = [], []
        for step, tok in enumerate(s["gen"]):
            _, bits, top = s["scores"][p + step]
            out_lp.append([orjson_float(f32(bits)), tok, None])
            out_top.append([[orjson_float(f32(b)), k, None] for k, b in top])
        out.append({
            "text": "", "output_ids": s["gen"],
            "meta_info": {"id": f"{0x5eed0000 + i:032x}", "finish_reason": {"type": "length", "length": len(s["gen"])},
                          "prompt_tokens": p, "completion_tokens": len(s["gen"]), "cached_tokens": 0,
                          "e2e_latency": 0.0, "input_token_logprobs": in_lp, "output_token_logprobs": out_lp,
                          "input_top_logprobs": in_top, "output_top_logprobs": out_top}})
    return out


# ---- verl ---------------------------------------------------------------------------------


def safetensors_bytes(tensors):
    """tensors: [(name, dtype, shape, data bytes)] -> a safetensors file image."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, dtype, shape, data in sorted(tensors):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + b"".join(blobs)


def verl(seqs, pad_id=0):
    B = len(seqs)
    P = max(s["prompt_len"] for s in seqs)
    R = max(len(s["gen"]) for s in seqs) + 2  # response_length: longer than any response
    lp, resp, ids, mask, prompts = [], [], [], [], []
    for s in seqs:
        p, g = s["prompt"], s["gen"]
        row_lp = [s["scores"][len(p) + t][1] for t in range(len(g))] + [0xBF800000] * (R - len(g))  # pad -1.0
        lp += row_lp
        r = g + [pad_id] * (R - len(g))
        pr = [pad_id] * (P - len(p)) + p
        resp += r
        prompts += pr
        ids += pr + r
        mask += [0] * (P - len(p)) + [1] * len(p) + [1] * len(g) + [0] * (R - len(g))
    i64 = lambda v: struct.pack(f"<{len(v)}q", *v)
    return safetensors_bytes([
        ("rollout_log_probs", "F32", [B, R], struct.pack(f"<{len(lp)}I", *lp)),
        ("responses", "I64", [B, R], i64(resp)),
        ("input_ids", "I64", [B, P + R], i64(ids)),
        ("attention_mask", "I64", [B, P + R], i64(mask)),
        ("prompts", "I64", [B, P], i64(prompts)),
    ])


# ---- lockstep JSONL -------------------------------------------------------------------------


def lockstep_jsonl(seqs):
    lines = []
    for s in seqs:
        for step, tok in enumerate(s["gen"]):
            t = s["prompt_len"] + step
            _, bits, top = s["scores"][t]
            lines.append(json.dumps({"seq": s["id"], "pos": t, "token": tok, "logprob": f32(bits),
                                     "top_logprobs": {str(k): f32(b) for k, b in top}}, separators=(",", ":")))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lockstep", required=True)
    ap.add_argument("--bump", metavar="SEQ:POS")
    ap.add_argument("rollout")
    ap.add_argument("out_dir")
    a = ap.parse_args()
    header, seqs = read_rollout(a.lockstep, a.rollout)
    check_ties(seqs)
    if a.bump:
        bump(seqs, a.bump)
    model = "qwen3next-tiny"
    os.makedirs(a.out_dir, exist_ok=True)
    dumps = lambda v: json.dumps(v, separators=(",", ":"))

    def write(name, data):
        with open(os.path.join(a.out_dir, name), "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())

    write("vllm-completions.json", dumps(vllm_completions(seqs, model)) + "\n")
    write("vllm-chat.jsonl", "".join(dumps(r) + "\n" for r in vllm_chat(seqs, model)))
    write("vllm-offline.jsonl", "".join(dumps(r) + "\n" for r in vllm_offline(seqs)))
    write("sglang.json", dumps(sglang(seqs)) + "\n")
    write("verl.safetensors", verl(seqs))
    write("lockstep.jsonl", lockstep_jsonl(seqs))


if __name__ == "__main__":
    main()
