"""Canonical bytes and digests (docs/trace-format.md section 6), exactly as
lockstep's engine computes them (src/engine/engine_forward.c: one SHA-256
per (position, layer, kind) over the spans below, little-endian, row-major).

Standard library only; values are Python floats/ints or already-encoded
bytes. The torch side (lockstep_trace.hf) produces the same bytes from
tensors.

| kind       | canonical bytes at position p                                          |
|------------|------------------------------------------------------------------------|
| hidden     | the row, act [D] (lm_head: the logits row, always fp32 [vocab])        |
| gdn_state  | the recurrent state after p, fp32 [H_v, d_k, d_v]                      |
| conv_state | the last W-1 conv inputs, act [conv_dim, W-1], oldest column first     |
| kv         | the K row then the V row written at p, act [n_kv_heads, head_dim] each |
| router     | the top-k expert ids, int32 [k], rank order, then their weights fp32   |

"act" is the header's activation_dtype: bf16 (2 bytes, fp32 rounded to
nearest even, lockstep's ls_f32_to_bf16) or fp32 (4 bytes).
"""
import hashlib
import struct
from typing import Iterable, Sequence, Tuple

from .format import TraceError


def f32_bits(x: float) -> int:
    """fp32 bits of a Python float, rounded once to fp32 (nearest even; a
    finite value that rounds beyond the fp32 range becomes an infinity, as a
    C cast does)."""
    try:
        return struct.unpack("<I", struct.pack("<f", x))[0]
    except OverflowError:
        return 0xFF800000 if x < 0 else 0x7F800000


def f32_from_bits(bits: int) -> float:
    """The fp32 value of a bit pattern, as a Python float (exact)."""
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def bf16_bits(x: float) -> int:
    """bf16 bits of x rounded to fp32 then to bf16, nearest even; a NaN keeps
    its sign and top payload bits and is made quiet (ls_f32_to_bf16)."""
    u = f32_bits(x)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return ((u >> 16) | 0x0040) & 0xFFFF
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFFFFFF
    return u >> 16


def bf16_to_f32(bits: int) -> float:
    return f32_from_bits((bits & 0xFFFF) << 16)


def digest(data: bytes) -> bytes:
    """SHA-256 of canonical bytes: the 32 bytes a record's digest holds."""
    return hashlib.sha256(data).digest()


def act_bytes(values: Iterable[float], act: str) -> bytes:
    """Canonical bytes of a row of activations in the activation dtype."""
    vals = list(values)
    if act == "fp32":
        try:
            return struct.pack("<%df" % len(vals), *vals)
        except OverflowError:
            return struct.pack("<%dI" % len(vals), *(f32_bits(v) for v in vals))
    if act == "bf16":
        return struct.pack("<%dH" % len(vals), *(bf16_bits(v) for v in vals))
    raise TraceError("activation dtype must be bf16 or fp32, not %r" % (act,))


def hidden_bytes(row: Iterable[float], act: str) -> bytes:
    """embed / gdn / attention / moe / norm rows: act [D]."""
    return act_bytes(row, act)


def logits_bytes(row: Iterable[float]) -> bytes:
    """The lm_head layer's hidden: the logits row, fp32 [vocab] whatever act is."""
    return act_bytes(row, "fp32")


def gdn_state_bytes(state: Iterable[float]) -> bytes:
    """The GDN recurrent state, fp32 [H_v, d_k, d_v] flattened row-major."""
    return act_bytes(state, "fp32")


def conv_state_bytes(columns: Sequence[Sequence[float]], act: str) -> bytes:
    """The conv state: `columns` is [conv_dim][W-1], each channel's last W-1
    inputs oldest first (the [conv_dim, W] window without its first column)."""
    return b"".join(act_bytes(ch, act) for ch in columns)


def kv_bytes(k_row: Iterable[float], v_row: Iterable[float], act: str) -> bytes:
    """The K row then the V row written to the cache at p, act [n_kv_heads * head_dim] each."""
    return act_bytes(k_row, act) + act_bytes(v_row, act)


def router_bytes(ids: Sequence[int], weights: Sequence[float]) -> bytes:
    """int32 [k] expert ids in the router's rank order, then fp32 [k] weights."""
    if len(ids) != len(weights):
        raise TraceError("router: %d ids but %d weights" % (len(ids), len(weights)))
    return struct.pack("<%di" % len(ids), *ids) + act_bytes(weights, "fp32")


def dump_values(dtype: str, data: bytes):
    """A dump's data decoded: bf16 and fp32 as a list of floats (bf16 widened
    exactly), router as (ids, weights)."""
    if dtype == "bf16":
        return [bf16_to_f32(b) for b in struct.unpack("<%dH" % (len(data) // 2), data)]
    if dtype == "fp32":
        return list(struct.unpack("<%df" % (len(data) // 4), data))
    if dtype == "router":
        k = len(data) // 8
        return list(struct.unpack("<%di" % k, data[:4 * k])), list(struct.unpack("<%df" % k, data[4 * k:]))
    raise TraceError("unknown dump dtype %r" % (dtype,))


def dump_dtype(kind: str, act: str, family: str = "") -> str:
    """The dump dtype of a kind's canonical bytes: router for router, fp32
    for gdn_state and for the lm_head layer's logits, else the activation
    dtype."""
    if kind == "router":
        return "router"
    if kind == "gdn_state" or family == "lm_head":
        return "fp32"
    return act


def canonical(kind: str, act: str, *parts) -> Tuple[bytes, bytes]:
    """(canonical bytes, digest) of one kind from decoded values: hidden(row),
    gdn_state(state), conv_state(columns), kv(k_row, v_row), router(ids, weights)."""
    enc = {"hidden": lambda r: hidden_bytes(r, act), "gdn_state": gdn_state_bytes,
           "conv_state": lambda c: conv_state_bytes(c, act), "kv": lambda k, v: kv_bytes(k, v, act),
           "router": router_bytes}[kind]
    b = enc(*parts)
    return b, digest(b)
