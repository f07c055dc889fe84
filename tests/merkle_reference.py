#!/usr/bin/env python3
"""Independent recomputation of lockstep's checkpoint fingerprint, written from
manifest/README.md ("Checkpoint fingerprint") with the standard library only.

    tests/merkle_reference.py CHECKPOINT_DIR

Prints "merkle_root <hex>" and "config_sha256 <hex>". Handles single-file and
sharded checkpoints; applies the name normalisation of the README (the
Qwen3.5 prefix "model.language_model." -> "model.", tensors under
"model.visual." and "mtp." kept under their stored names). Config canonical form here covers the
values the tests use (objects, arrays, strings, integers, booleans, null,
reals printed with %.17g rules of the README).
"""
import hashlib
import json
import os
import struct
import sys


def canonical(v):
    if isinstance(v, dict):
        items = sorted(v.items(), key=lambda kv: kv[0].encode())
        return "{" + ",".join(canonical(k) + ":" + canonical(x) for k, x in items) + "}"
    if isinstance(v, list):
        return "[" + ",".join(canonical(x) for x in v) + "]"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        s = "%.17g" % v
        if "e" in s:
            mant, exp = s.split("e")
            sign = "-" if exp.startswith("-") else ""
            s = mant + "e" + sign + exp.lstrip("+-").lstrip("0")
        elif "." not in s:
            s += ".0"
        return s
    out = ['"']
    for ch in v:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ord(ch) < 0x20:
            out.append({"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(
                ch, "\\u%04x" % ord(ch)))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def normalise(name):
    if name.startswith("model.visual.") or name.startswith("mtp."):
        return name     # skipped by the model, fingerprinted under the stored name
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


def tensors_of(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        for name, t in header.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            f.seek(base + a)
            yield name, t["dtype"], t["shape"], hashlib.sha256(f.read(b - a)).digest()


def main():
    d = sys.argv[1]
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    rows = []
    for fn in files:
        for name, dtype, shape, digest in tensors_of(os.path.join(d, fn)):
            norm = normalise(name)
            if norm is not None:
                rows.append((norm.encode(), dtype, shape, digest))
    rows.sort(key=lambda r: r[0])
    level = []
    for name, dtype, shape, digest in rows:
        leaf = name + b"\0" + dtype.encode() + b"\0" + struct.pack("<I", len(shape))
        leaf += b"".join(struct.pack("<Q", s) for s in shape) + digest
        level.append(hashlib.sha256(b"\x00" + leaf).digest())
    if not level:
        level = [hashlib.sha256(b"").digest()]
    while len(level) > 1:
        nxt = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
               for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    cfg = json.load(open(os.path.join(d, "config.json")))
    print("merkle_root", level[0].hex())
    print("config_sha256", hashlib.sha256(canonical(cfg).encode()).hexdigest())


if __name__ == "__main__":
    main()
