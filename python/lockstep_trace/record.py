"""Records (docs/trace-format.md section 5): encoding with the writer's
checks, decoding with the reader's, and the completeness rule of section 6."""
import hashlib
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .format import (DIGEST_ENTRY_BYTES, DTYPE_SIZE, DTYPES, DUMP_HEAD_BYTES, FAMILY_KINDS, KINDS, NAN_BITS,
                     RECORD_FIXED_BYTES, STATE_KINDS, TraceError)
from .header import Header


@dataclass
class Record:
    """One (sequence, position). Logprobs are fp32 bit patterns (f32_bits)."""
    seq: int
    pos: int
    token: int
    next_token: int = -1
    logprob_bits: int = NAN_BITS
    topk: List[Tuple[int, int]] = field(default_factory=list)          # (id, fp32 bits), rank order, used slots
    digests: List[Tuple[int, str, bytes]] = field(default_factory=list)  # (layer, kind, sha256)
    dumps: List[Tuple[int, str, str, bytes]] = field(default_factory=list)  # (layer, kind, dtype, canonical bytes)

    def digest(self, layer: int, kind: str) -> Optional[bytes]:
        for l, k, d in self.digests:
            if l == layer and k == kind:
                return d
        return None

    def dump(self, layer: int, kind: str) -> Optional[Tuple[str, bytes]]:
        for l, k, dt, data in self.dumps:
            if l == layer and k == kind:
                return dt, data
        return None


class Layout:
    """What a header requires of every record (sections 5 and 6)."""

    def __init__(self, h: Header):
        self.h = h
        self.topk = h.topk
        self.kinds = set(h.digest_kinds)
        self.n_layers = len(h.layers)
        self.families = [l.family for l in h.layers]
        self.every = h.state_digest_every
        # digests of each kind a complete record holds
        self.want = {k: sum(1 for f in self.families if k in FAMILY_KINDS[f]) for k in KINDS}

    def missing_kind(self, pos: int, count: Dict[str, int]) -> Optional[str]:
        """The first listed kind a record at pos with count[k] digests of kind
        k lacks (section 6), or None: hidden, kv and router at every position;
        the carried-state kinds at p % N == N - 1, and for every gdn layer
        wherever they appear."""
        due = pos % self.every == self.every - 1
        for k in KINDS:
            if k not in self.kinds or count.get(k, 0) == self.want[k]:
                continue
            if k in STATE_KINDS and count.get(k, 0) == 0 and not due:
                continue
            return k
        return None

    def first_layer_lacking(self, kind: str, have) -> int:
        for i, f in enumerate(self.families):
            if kind in FAMILY_KINDS[f] and (i, kind) not in have:
                return i
        return -1


def _u32(v, what):
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 0xFFFFFFFF:
        raise TraceError("%s %r is not a u32" % (what, v))
    return v


def _i32(v, what):
    if not isinstance(v, int) or isinstance(v, bool) or not -(1 << 31) <= v < (1 << 31):
        raise TraceError("%s %r is not an i32" % (what, v))
    return v


def _dtype_code(dtype):
    if isinstance(dtype, int) and not isinstance(dtype, bool) and 0 <= dtype < len(DTYPES):
        return dtype
    if dtype in DTYPES:
        return DTYPES.index(dtype)
    raise TraceError("unknown dump dtype %r (bf16, fp32 or router)" % (dtype,))


def encode_record(lay: Layout, r: Record) -> bytes:
    """The record's bytes, refusing whatever a reader would refuse."""
    where = "seq %r pos %r" % (r.seq, r.pos)
    _u32(r.seq, "seq")
    _u32(r.pos, "pos")
    _i32(r.token, where + ": token")
    _i32(r.next_token, where + ": next_token")
    _u32(r.logprob_bits, where + ": logprob_bits")
    used = list(r.topk)
    while used and used[-1][0] == -1:   # unused slots given explicitly
        if used[-1][1] != NAN_BITS:
            raise TraceError("%s: an unused top-k slot (id -1) has bits 0x%08x, not 0x7fc00000" % (where, used[-1][1]))
        used.pop()
    if len(used) > lay.topk:
        raise TraceError("%s: %d top-k entries, the header's topk is %d" % (where, len(used), lay.topk))
    seen = set()
    for i, (tid, bits) in enumerate(used):
        _i32(tid, "%s: top-k slot %d id" % (where, i))
        _u32(bits, "%s: top-k slot %d bits" % (where, i))
        if tid < 0:
            raise TraceError("%s: top-k slot %d: id %d (used slots come first, with ids >= 0)" % (where, i, tid))
        if tid in seen:
            raise TraceError("%s: top-k id %d repeats" % (where, tid))
        seen.add(tid)
    topk = used + [(-1, NAN_BITS)] * (lay.topk - len(used))
    out = [struct.pack("<IIiiI", r.seq, r.pos, r.token, r.next_token, r.logprob_bits)]
    out += [struct.pack("<iI", i, b) for i, b in topk]

    digests, by_key, count = [], {}, {}
    for entry in r.digests:
        layer, kind, sha = entry
        if kind not in KINDS or kind not in lay.kinds or not isinstance(layer, int) or \
                not 0 <= layer < lay.n_layers or not isinstance(sha, (bytes, bytearray)) or len(sha) != 32:
            raise TraceError("%s: digest (%r, %r) not in the header (kinds %s, %d layers) or not 32 bytes"
                             % (where, layer, kind, list(lay.h.digest_kinds), lay.n_layers))
        fam = lay.families[layer]
        if kind not in FAMILY_KINDS[fam]:
            raise TraceError("%s: digest (%d, %s): a %s layer has no %s digest (section 6)" % (where, layer, kind, fam, kind))
        if (layer, kind) in by_key:
            raise TraceError("%s: digest (%d, %s) given twice" % (where, layer, kind))
        by_key[(layer, kind)] = bytes(sha)
        count[kind] = count.get(kind, 0) + 1
        digests.append((layer, KINDS.index(kind), bytes(sha)))
    digests.sort()
    missing = lay.missing_kind(r.pos, count)
    if missing is not None:
        layer = lay.first_layer_lacking(missing, by_key)
        raise TraceError("%s lacks the %s digest of layer %d (%s): a kind in digest_kinds appears at every position "
                         "for every layer of a family that has it (section 6)"
                         % (where, missing, layer, lay.families[layer] if layer >= 0 else "?"))

    dumps, dump_keys = [], set()
    for layer, kind, dtype, data in r.dumps:
        dt = _dtype_code(dtype)
        data = bytes(data)
        es = DTYPE_SIZE[dt]
        if kind not in KINDS or not isinstance(layer, int) or not 0 <= layer < lay.n_layers:
            raise TraceError("%s: dump (%r, %r): no such layer or kind" % (where, layer, kind))
        if (kind == "router") != (DTYPES[dt] == "router"):
            raise TraceError("%s: dump (%d, %s): dtype router if and only if kind router (section 5)" % (where, layer, kind))
        n = len(data) // es
        if not data or len(data) % es or (DTYPES[dt] == "router" and n % 2) or n > 0xFFFFFFFF:
            raise TraceError("%s: dump (%d, %s): %d bytes are not whole %s elements" % (where, layer, kind, len(data), DTYPES[dt]))
        if kind not in FAMILY_KINDS[lay.families[layer]]:
            raise TraceError("%s: dump (%d, %s): a %s layer has no %s digest (section 6)"
                             % (where, layer, kind, lay.families[layer], kind))
        if (layer, kind) in dump_keys:
            raise TraceError("%s: dump (%d, %s) given twice" % (where, layer, kind))
        dump_keys.add((layer, kind))
        if by_key.get((layer, kind)) != hashlib.sha256(data).digest():  # section 5
            raise TraceError("%s: dump (%d, %s): the record's digest is not the SHA-256 of its data" % (where, layer, kind))
        dumps.append((layer, KINDS.index(kind), dt, n, data))
    dumps.sort(key=lambda d: d[:2])
    out.append(struct.pack("<HH", len(digests), len(dumps)))
    out += [struct.pack("<HBB", l, k, 0) + sha for l, k, sha in digests]
    for l, k, dt, n, data in dumps:
        out.append(struct.pack("<HBBI", l, k, dt, n) + data + b"\0" * (-len(data) % 4))
    body = b"".join(out)
    if len(digests) > 0xFFFF or len(dumps) > 0xFFFF or 4 + len(body) > 0xFFFFFFFF:
        raise TraceError("%s: record too large" % where)
    return struct.pack("<I", 4 + len(body)) + body


def decode_record(lay: Layout, data: bytes, off: int, bad) -> Tuple[Record, int]:
    """Validates and decodes the record at data[off:] (section 5) as
    lockstep's reader does; returns it and its length. `bad(msg)` builds the
    error (it names the frame and the record's byte)."""
    K = lay.topk
    fixed = RECORD_FIXED_BYTES + 8 * K + 4
    avail = len(data) - off
    if avail < fixed:
        raise bad("record header runs past the frame payload")
    rb, seq, pos, token, next_token, lp = struct.unpack_from("<IIIiiI", data, off)
    if rb < fixed or rb > avail or rb % 4:
        raise bad("record length %d invalid" % rb)
    topk, unused = [], -1
    for k in range(K):
        tid, bits = struct.unpack_from("<iI", data, off + 24 + 8 * k)
        if tid < -1:
            raise bad("top-k slot %d: id %d (ids are >= 0, or -1 for an unused slot)" % (k, tid))
        if tid == -1:
            if bits != NAN_BITS:
                raise bad("top-k slot %d is unused (id -1) but its logprob bits are 0x%08x, not 0x7fc00000" % (k, bits))
            if unused < 0:
                unused = k
            continue
        if unused >= 0:
            raise bad("top-k slot %d is used after the unused slot %d" % (k, unused))
        for j, (prev, _) in enumerate(topk):
            if prev == tid:
                raise bad("top-k slots %d and %d hold the same id %d" % (j, k, tid))
        topk.append((tid, bits))
    nd, nm = struct.unpack_from("<HH", data, off + fixed - 4)
    q = fixed + nd * DIGEST_ENTRY_BYTES
    if q > rb:
        raise bad("%d digests run past the record" % nd)
    digests, prev, count, by_key = [], -1, {}, {}
    for i in range(nd):
        e = off + fixed + i * DIGEST_ENTRY_BYTES
        layer, kind, pad = struct.unpack_from("<HBB", data, e)
        if pad:
            raise bad("digest %d: reserved byte 3 is 0x%02x, must be 0" % (i, pad))
        if layer >= lay.n_layers or kind >= len(KINDS) or KINDS[kind] not in lay.kinds:
            raise bad("digest %d: layer %d / kind %d not in the header" % (i, layer, kind))
        fam, kn = lay.families[layer], KINDS[kind]
        if kn not in FAMILY_KINDS[fam]:
            raise bad("digest %d: layer %d is %s, which has no %s digest (section 6)" % (i, layer, fam, kn))
        key = layer * len(KINDS) + kind
        if key <= prev:
            raise bad("digest %d: not ordered by (layer, kind)" % i)
        prev = key
        count[kn] = count.get(kn, 0) + 1
        sha = bytes(data[e + 4:e + 36])
        by_key[(layer, kn)] = sha
        digests.append((layer, kn, sha))
    dumps, prev = [], -1
    for i in range(nm):
        if q + DUMP_HEAD_BYTES > rb:
            raise bad("dump %d runs past the record" % i)
        layer, kind, dt, n = struct.unpack_from("<HBBI", data, off + q)
        es = DTYPE_SIZE[dt] if dt < len(DTYPES) else 0
        if layer >= lay.n_layers or kind >= len(KINDS) or not es or not n or \
                (KINDS[kind] == "router") != (dt == 2) or (dt == 2 and n % 2):
            raise bad("dump %d: bad layer %d / kind %d / dtype %d / n_elems %d" % (i, layer, kind, dt, n))
        kn, fam = KINDS[kind], lay.families[layer]
        if kn not in FAMILY_KINDS[fam]:
            raise bad("dump %d: layer %d is %s, which has no %s digest (section 6)" % (i, layer, fam, kn))
        key = layer * len(KINDS) + kind
        if key <= prev:
            raise bad("dump %d: not ordered by (layer, kind)" % i)
        prev = key
        size = n * es
        body = (size + 3) & ~3
        if q + DUMP_HEAD_BYTES + body > rb:
            raise bad("dump %d data runs past the record" % i)
        start = off + q + DUMP_HEAD_BYTES
        blob = bytes(data[start:start + size])
        if (layer, kn) not in by_key:
            raise bad("dump %d (layer %d, %s): the record carries no %s digest of layer %d" % (i, layer, kn, kn, layer))
        if hashlib.sha256(blob).digest() != by_key[(layer, kn)]:
            raise bad("dump %d (layer %d, %s): the SHA-256 of its data is not the record's %s digest of layer %d"
                      % (i, layer, kn, kn, layer))
        for b in range(size, body):
            if data[start + b]:
                raise bad("dump %d: padding byte %d is 0x%02x, must be 0" % (i, b - size, data[start + b]))
        dumps.append((layer, kn, DTYPES[dt], blob))
        q += DUMP_HEAD_BYTES + body
    missing = lay.missing_kind(pos, count)
    if missing is not None:
        layer = lay.first_layer_lacking(missing, by_key)
        raise bad("seq %d pos %d lacks the %s digest of layer %d (%s): a kind in digest_kinds appears at every "
                  "position for every layer of a family that has it (section 6)"
                  % (seq, pos, missing, layer, lay.families[layer] if layer >= 0 else "?"))
    if q != rb:
        raise bad("record length %d does not match its contents (%d)" % (rb, q))
    return Record(seq, pos, token, next_token, lp, topk, digests, dumps), rb
