"""Writing traces (docs/trace-format.md): a streaming writer that refuses
what lockstep's reader refuses, so every trace it completes reads back."""
import hashlib
import json
import os
import struct
from typing import Sequence, Tuple, Union

import zstandard

from .format import (ACTIVATION_DTYPES, FAMILIES, FRAME_FIXED_BYTES, FRAME_KINDS, FRAME_MAX_BYTES, KINDS,
                     LAYERS_MAX, MODE_FRAMES, MODES, TOPK_MAX, TRAILER_MAGIC, TraceError, VERSION_MAJOR,
                     VERSION_MINOR, DECODER_LAYER_MAX)
from .header import Header, Layer, check_run_params_text, header_json, is_hex64
from .record import Layout, Record, encode_record

LayerSpec = Union[Layer, Tuple[str, int]]


class TraceWriter:
    """Streams frames to ``<path>.tmp.<pid>``; close() writes the trailer and
    renames it over ``path``. Used as a context manager, an exception removes
    the temporary file and leaves ``path`` as it was.

    ``layers``: the layer table, ``(family, decoder_layer)`` pairs (or Layer).
    ``run_params``: a dict (serialised with json) or the JSON object's text,
    written byte for byte. Records of a sequence must come with increasing
    positions; each frame is one engine step (section 4).
    """

    def __init__(self, path: str, *, mode: str, model_fingerprint: str, layers: Sequence[LayerSpec],
                 engine: str = "python", manifest_digest: str = "", run_params=None, topk: int = 5,
                 digest_kinds: Sequence[str] = (), state_digest_every: int = 1,
                 activation_dtype: str = "bf16", level: int = 3):
        if mode not in MODES:
            raise TraceError("mode must be rollout, replay or import, not %r" % (mode,))
        if not is_hex64(model_fingerprint):
            raise TraceError("model_fingerprint must be 64 lower-case hex characters")
        if manifest_digest and not is_hex64(manifest_digest):
            raise TraceError("manifest_digest must be empty or 64 lower-case hex characters")
        if not isinstance(topk, int) or not 1 <= topk <= TOPK_MAX:
            raise TraceError("topk must be 1..%d" % TOPK_MAX)
        if not isinstance(state_digest_every, int) or not 1 <= state_digest_every <= 0xFFFFFFFF:
            raise TraceError("state_digest_every must be >= 1")
        if activation_dtype not in ACTIVATION_DTYPES:
            raise TraceError("activation_dtype must be bf16 or fp32")
        if isinstance(digest_kinds, str):
            digest_kinds = [digest_kinds]
        for k in digest_kinds:
            if k not in KINDS:
                raise TraceError("unknown digest kind %r" % (k,))
        if len(set(digest_kinds)) != len(list(digest_kinds)):
            raise TraceError("digest_kinds %r repeats a kind" % (list(digest_kinds),))
        table = []
        for i, spec in enumerate(layers):
            fam, dl = (spec.family, spec.decoder_layer) if isinstance(spec, Layer) else spec
            if fam not in FAMILIES:
                raise TraceError("layer %d: unknown family %r" % (i, fam))
            if not isinstance(dl, int) or not -1 <= dl <= DECODER_LAYER_MAX:
                raise TraceError("layer %d: decoder_layer %r outside -1..%d" % (i, dl, DECODER_LAYER_MAX))
            table.append(Layer(i, fam, dl))
        if len(table) > LAYERS_MAX:
            raise TraceError("%d layers; the format holds at most %d" % (len(table), LAYERS_MAX))
        if run_params is None:
            params_text = "{}"
        elif isinstance(run_params, str):
            params_text = run_params
        else:
            params_text = json.dumps(run_params, separators=(",", ":"))
        try:
            check_run_params_text(params_text)
        except ValueError as e:
            raise TraceError(str(e))
        self.header = Header(mode=mode, engine=engine, model_fingerprint=model_fingerprint,
                             manifest_digest=manifest_digest, run_params_text=params_text, topk=topk,
                             digest_kinds=[k for k in KINDS if k in digest_kinds],
                             state_digest_every=state_digest_every, activation_dtype=activation_dtype,
                             layers=table)
        self.layout = Layout(self.header)
        self.mode = mode
        self.topk = topk
        self.layers = [(l.family, l.decoder_layer) for l in table]
        self.kinds = list(self.header.digest_kinds)
        self.path, self.tmp = path, "%s.tmp.%d" % (path, os.getpid())
        js = header_json(self.header)
        head = b"LSTRACE\0" + struct.pack("<HHI", VERSION_MAJOR, VERSION_MINOR, len(js)) + js
        self.fp = open(self.tmp, "wb")
        self.fp.write(head + hashlib.sha256(head).digest())
        # every payload carries its content size and content checksum (section 4)
        self.cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True)
        self.chain = hashlib.sha256()
        self.n_frames = self.n_records = self.n_bytes = 0
        self.last = {}
        self.frame = None
        self.closed = False

    def begin_frame(self, kind: str = "decode"):
        """Opens a frame of `kind` (prefill/decode in a rollout, chunk in a replay, import in an import)."""
        if self.frame is not None:
            raise TraceError("begin_frame while a frame is open")
        if kind not in MODE_FRAMES[self.mode]:
            raise TraceError("a %s trace holds %s frames, not %s"
                             % (self.mode, " and ".join(MODE_FRAMES[self.mode]), kind))
        self.frame = (FRAME_KINDS.index(kind), bytearray(), [])

    def add(self, r: Record):
        """Appends one record to the open frame (checked: section 5 and 6)."""
        if self.frame is None:
            raise TraceError("add outside a frame")
        if r.seq in self.last and r.pos <= self.last[r.seq]:
            raise TraceError("seq %d pos %d: positions of a sequence must increase through the trace (last %d)"
                             % (r.seq, r.pos, self.last[r.seq]))
        rec = encode_record(self.layout, r)
        kind, buf, segs = self.frame
        if len(buf) + len(rec) > FRAME_MAX_BYTES:
            raise TraceError("frame payload would exceed %d bytes: end the frame first" % FRAME_MAX_BYTES)
        buf += rec
        if segs and segs[-1][0] == r.seq and segs[-1][1] + segs[-1][2] == r.pos:
            segs[-1][2] += 1
        else:
            segs.append([r.seq, r.pos, 1])
        self.last[r.seq] = r.pos

    def end_frame(self):
        """Compresses and writes the open frame (an empty one is dropped)."""
        if self.frame is None:
            raise TraceError("end_frame without an open frame")
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
        assert len(head) == FRAME_FIXED_BYTES + 12 * len(segs)
        chk = hashlib.sha256(head).digest()  # header checksum: the header and segment table
        self.fp.write(head + chk + comp)
        self.fp.flush()
        self.chain.update(chk)
        self.n_frames += 1
        self.n_records += n_rec
        self.n_bytes += len(buf)

    def close(self):
        """Ends an open frame, writes the trailer and renames the file into place."""
        if self.closed:
            return
        if self.frame is not None:
            self.end_frame()
        t = TRAILER_MAGIC + struct.pack("<IQQQ", 0, self.n_frames, self.n_records, self.n_bytes) + self.chain.digest()
        self.fp.write(t + hashlib.sha256(t).digest())
        self.fp.flush()
        os.fsync(self.fp.fileno())
        self.fp.close()
        os.replace(self.tmp, self.path)
        self.closed = True

    def abort(self):
        """Drops the temporary file; ``path`` is left as it was."""
        if self.closed:
            return
        self.closed = True
        self.fp.close()
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
