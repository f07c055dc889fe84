"""Write lockstep traces (format v1, docs/trace-format.md) from any engine.

Standard library plus ``zstandard``. Example::

    from lockstep_trace import TraceWriter, Record, digest
    layers = [("embed", -1), ("gdn", 0), ("moe", 0), ("norm", -1), ("lm_head", -1)]
    with TraceWriter("run.trace", mode="rollout", engine="vllm",
                     model_fingerprint="ab" * 32, layers=layers,
                     digest_kinds=["hidden", "router"]) as w:
        w.begin_frame("prefill")
        w.add(Record(seq=0, pos=0, token=151644, next_token=872,
                     logprob_bits=f32_bits(-0.25),
                     topk=[(872, f32_bits(-0.25)), ...],
                     digests=[(1, "hidden", digest(hidden_row_bytes))]))
        w.end_frame()

Digests are SHA-256 over the canonical bytes the format document defines
(e.g. the bf16 hidden row, little-endian); ``digest(b)`` computes one.
Records of a sequence must be added with increasing positions.
"""

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import zstandard

VERSION_MAJOR, VERSION_MINOR = 1, 0
FAMILIES = ["embed", "gdn", "attention", "moe", "norm", "lm_head"]
KINDS = ["hidden", "gdn_state", "conv_state", "kv", "router"]
FRAME_KINDS = {"prefill": 0, "decode": 1, "chunk": 2, "import": 3}
DTYPES = {"bf16": 0, "fp32": 1, "router": 2}
DTYPE_SIZE = {0: 2, 1: 4, 2: 4}
NAN_BITS = 0x7FC00000
# section 6: the kinds a layer of each family carries
FAMILY_KINDS = {"embed": {"hidden"}, "norm": {"hidden"}, "lm_head": {"hidden"},
                "gdn": {"hidden", "gdn_state", "conv_state"}, "attention": {"hidden", "kv"},
                "moe": {"hidden", "router"}}
# section 4: the frame kinds of each mode
MODE_FRAMES = {"rollout": {"prefill", "decode"}, "replay": {"chunk"}, "import": {"import"}}


def f32_bits(x: float) -> int:
    """fp32 bits of a Python float (rounded once to fp32)."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


def digest(data: bytes) -> bytes:
    """SHA-256 of canonical bytes."""
    return hashlib.sha256(data).digest()


@dataclass
class Record:
    seq: int
    pos: int
    token: int
    next_token: int = -1
    logprob_bits: int = NAN_BITS
    topk: List[Tuple[int, int]] = field(default_factory=list)  # (id, fp32 bits), rank order
    digests: List[Tuple[int, str, bytes]] = field(default_factory=list)  # (layer, kind, sha256)
    dumps: List[Tuple[int, str, str, bytes]] = field(default_factory=list)  # (layer, kind, dtype, bytes)


class TraceWriter:
    """Streams frames to ``path + '.tmp.<pid>'``, renamed into place by close()."""

    def __init__(self, path: str, *, mode: str, model_fingerprint: str, layers: Sequence[Tuple[str, int]],
                 engine: str = "python", manifest_digest: str = "", run_params: Optional[dict] = None,
                 topk: int = 5, digest_kinds: Sequence[str] = (), state_digest_every: int = 1,
                 activation_dtype: str = "bf16", level: int = 3):
        if mode not in ("rollout", "replay", "import"):
            raise ValueError("mode must be rollout, replay or import")
        if len(model_fingerprint) != 64 or model_fingerprint != model_fingerprint.lower():
            raise ValueError("model_fingerprint must be 64 lower-case hex characters")
        if not 1 <= topk <= 64:
            raise ValueError("topk must be 1..64")
        self.mode = mode
        self.path, self.tmp = path, "%s.tmp.%d" % (path, os.getpid())
        self.topk = topk
        self.layers = list(layers)
        self.kinds = [k for k in KINDS if k in digest_kinds]
        if len(self.kinds) != len(set(digest_kinds)):
            raise ValueError("unknown digest kind in %r" % (digest_kinds,))
        header = {
            "format": "lockstep-trace", "mode": mode, "engine": engine,
            "model_fingerprint": model_fingerprint, "manifest_digest": manifest_digest,
            "run_params": run_params or {}, "topk": topk, "digest_kinds": self.kinds,
            "state_digest_every": state_digest_every, "activation_dtype": activation_dtype,
            "layers": [{"index": i, "family": f, "decoder_layer": d} for i, (f, d) in enumerate(self.layers)],
        }
        for f, _ in self.layers:
            if f not in FAMILIES:
                raise ValueError("unknown family %r" % f)
        js = json.dumps(header, separators=(",", ":")).encode()
        head = b"LSTRACE\0" + struct.pack("<HHI", VERSION_MAJOR, VERSION_MINOR, len(js)) + js
        self.fp = open(self.tmp, "wb")
        self.fp.write(head + hashlib.sha256(head).digest())
        # every payload carries its content size and content checksum (format section 4)
        self.cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True)
        self.chain = hashlib.sha256()
        self.n_frames = self.n_records = self.n_bytes = 0
        self.last = {}
        self.frame = None

    def begin_frame(self, kind: str = "decode"):
        if self.frame is not None:
            raise RuntimeError("begin_frame while a frame is open")
        if kind not in MODE_FRAMES[self.mode]:
            raise ValueError("a %s trace holds %s frames, not %s" % (self.mode, " and ".join(sorted(MODE_FRAMES[self.mode])), kind))
        self.frame = (FRAME_KINDS[kind], bytearray(), [])

    def add(self, r: Record):
        if self.frame is None:
            raise RuntimeError("add outside a frame")
        if r.seq in self.last and r.pos <= self.last[r.seq]:
            raise ValueError("seq %d pos %d: positions of a sequence must increase" % (r.seq, r.pos))
        topk = list(r.topk[: self.topk]) + [(-1, NAN_BITS)] * (self.topk - len(r.topk[: self.topk]))
        body = struct.pack("<IIiiI", r.seq, r.pos, r.token, r.next_token, r.logprob_bits)
        body += b"".join(struct.pack("<iI", i, b) for i, b in topk)
        digests = sorted(r.digests, key=lambda d: (d[0], KINDS.index(d[1])))
        dumps = sorted(r.dumps, key=lambda d: (d[0], KINDS.index(d[1])))
        body += struct.pack("<HH", len(digests), len(dumps))
        for layer, kind, sha in digests:
            if kind not in self.kinds or not 0 <= layer < len(self.layers) or len(sha) != 32:
                raise ValueError("digest (%d, %s) not in the header" % (layer, kind))
            if kind not in FAMILY_KINDS[self.layers[layer][0]]:
                raise ValueError("digest (%d, %s): a %s layer has no %s digest" % (layer, kind, self.layers[layer][0], kind))
            body += struct.pack("<HBB", layer, KINDS.index(kind), 0) + sha
        by_key = {(layer, kind): sha for layer, kind, sha in digests}
        for layer, kind, dtype, data in dumps:
            if by_key.get((layer, kind)) != digest(data):  # section 5: a dump hashes to its digest
                raise ValueError("dump (%d, %s): the record's digest is not the SHA-256 of its data" % (layer, kind))
            dt = DTYPES[dtype]
            n = len(data) // DTYPE_SIZE[dt]
            body += struct.pack("<HBBI", layer, KINDS.index(kind), dt, n) + data + b"\0" * (-len(data) % 4)
        rec = struct.pack("<I", 4 + len(body)) + body
        kind, buf, segs = self.frame
        buf += rec
        if segs and segs[-1][0] == r.seq and segs[-1][1] + segs[-1][2] == r.pos:
            segs[-1][2] += 1
        else:
            segs.append([r.seq, r.pos, 1])
        self.last[r.seq] = r.pos

    def end_frame(self):
        kind, buf, segs = self.frame
        self.frame = None
        if not segs:
            return
        comp = self.cctx.compress(bytes(buf))
        n_rec = sum(s[2] for s in segs)
        content_checksum = struct.unpack("<I", comp[-4:])[0]  # the zstd frame's last 4 bytes
        head = b"LSFR" + struct.pack("<BBHIIIIQQ", kind, 0, 0, self.n_frames, n_rec, len(segs), content_checksum,
                                     len(buf), len(comp))
        head += b"".join(struct.pack("<III", *s) for s in segs)
        chk = hashlib.sha256(head).digest()  # header checksum: the header and segment table only
        self.fp.write(head + chk + comp)
        self.fp.flush()
        self.chain.update(chk)
        self.n_frames += 1
        self.n_records += n_rec
        self.n_bytes += len(buf)

    def close(self):
        if self.frame is not None:
            self.end_frame()
        t = b"LSEN" + struct.pack("<IQQQ", 0, self.n_frames, self.n_records, self.n_bytes) + self.chain.digest()
        self.fp.write(t + hashlib.sha256(t).digest())
        self.fp.flush()
        os.fsync(self.fp.fileno())
        self.fp.close()
        os.replace(self.tmp, self.path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.fp.close()
            os.unlink(self.tmp)
