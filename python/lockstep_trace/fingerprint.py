"""The checkpoint fingerprint a trace header pins (``model_fingerprint``):
the Merkle root over a safetensors checkpoint's tensors, as
docs/trace-format.md section 3 and manifest/README.md specify. A trace
written from the same checkpoint by another engine carries the same root, so
``lockstep compare`` sets it against lockstep's traces without
``--allow-different-model``."""
import hashlib
import json
import os
import struct
from typing import List, Tuple


def _normalise(name: str):
    # Qwen3.5: "model.language_model." is "model."; the vision tower and MTP
    # head ("model.visual.", "mtp.") keep their stored names: the model never
    # reads them, but they are fingerprinted like every tensor
    if name.startswith("model.visual.") or name.startswith("mtp."):
        return name
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


def _tensors(path: str):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        for name, t in header.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            f.seek(base + a)
            h = hashlib.sha256()
            left = b - a
            while left:
                chunk = f.read(min(left, 1 << 24))
                if not chunk:
                    raise ValueError("%s: tensor %s runs past the file" % (path, name))
                h.update(chunk)
                left -= len(chunk)
            yield name, t["dtype"], t["shape"], h.digest()


def model_fingerprint(checkpoint_dir: str) -> str:
    """Merkle root (64 lower-case hex) of a checkpoint directory: one leaf per
    tensor, ``name 0 dtype 0 u32(ndim) u64(shape)... SHA-256(bytes)``, leaf
    hash ``SHA-256(0x00 || leaf)``, leaves sorted by name, each level
    ``SHA-256(0x01 || left || right)`` with an odd last node promoted."""
    index = os.path.join(checkpoint_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    rows: List[Tuple[bytes, str, list, bytes]] = []
    for fn in files:
        for name, dtype, shape, sha in _tensors(os.path.join(checkpoint_dir, fn)):
            norm = _normalise(name)
            if norm is not None:
                rows.append((norm.encode(), dtype, shape, sha))
    rows.sort(key=lambda r: r[0])
    level = []
    for name, dtype, shape, sha in rows:
        leaf = name + b"\0" + dtype.encode() + b"\0" + struct.pack("<I", len(shape))
        leaf += b"".join(struct.pack("<Q", s) for s in shape) + sha
        level.append(hashlib.sha256(b"\x00" + leaf).digest())
    if not level:
        return hashlib.sha256(b"").hexdigest()
    while len(level) > 1:
        nxt = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].hex()
