"""Reading traces (docs/trace-format.md) with every check lockstep's reader
makes: file header and its checksum, the header JSON, each frame header and
its checksum, the payload (one zstd frame with its content size and content
checksum, equal to the header's copy), every record (section 5 and 6), the
segment tables, position order (section 8) and the trailer (section 7).
Errors are TraceError naming the byte offset of the item that failed."""
import hashlib
import os
import struct
from dataclasses import dataclass
from typing import Iterator, List, Tuple

import zstandard

from .format import (FILE_HEAD_BYTES, FILE_MAGIC, FRAME_FIXED_BYTES, FRAME_KINDS, FRAME_MAGIC, FRAME_MAX_BYTES,
                     JSON_MAX_BYTES, MODE_FRAMES, RECORD_FIXED_BYTES, SEGMENT_BYTES, TRAILER_BYTES, TRAILER_MAGIC,
                     TraceError, VERSION_MAJOR)
from .header import Header, parse_header
from .record import Layout, Record, decode_record

_ZSTD_MAGIC = 0xFD2FB528


@dataclass
class Frame:
    """One frame: its kind, index, byte offset, segment table and records."""
    kind: str
    index: int
    offset: int
    segments: List[Tuple[int, int, int]]     # (seq, pos_first, n_pos)
    records: List[Record]
    uncompressed_bytes: int
    compressed_bytes: int


def _compress_bound(n):
    # ZSTD_COMPRESSBOUND(n) of zstd.h
    return n + (n >> 8) + (((128 << 10) - n) >> 11 if n < (128 << 10) else 0)


class TraceReader:
    """Iterates a trace's records (or frames) in file order, checking
    everything as it goes. After the iteration, ``complete`` says whether the
    trailer was there (an incomplete trace ends right after a frame) and
    ``n_frames`` / ``n_records`` / ``n_bytes`` count what was read.

        with TraceReader("run.trace") as r:
            print(r.header.mode, [l.family for l in r.header.layers])
            for rec in r:
                ...
    """

    def __init__(self, path: str):
        self.path = path
        self.fp = open(path, "rb")
        self.size = os.fstat(self.fp.fileno()).st_size
        self.header = self._read_file_header()
        self.layout = Layout(self.header)
        self.complete = False
        self.n_frames = self.n_records = self.n_bytes = 0
        self._chain = hashlib.sha256()
        self._next_min = {}
        self._dctx = zstandard.ZstdDecompressor()
        self._done = False

    # ---- helpers ------------------------------------------------------------
    def _err(self, off, msg):
        return TraceError("%s: offset %d: %s" % (self.path, off, msg), off)

    def _read(self, off, n):
        self.fp.seek(off)
        b = self.fp.read(n)
        if len(b) != n:
            raise self._err(off, "short read (%d of %d bytes)" % (len(b), n))
        return b

    def _read_file_header(self) -> Header:
        head = self._read(0, min(self.size, FILE_HEAD_BYTES))
        if len(head) < 8 or head[:8] != FILE_MAGIC:
            raise self._err(0, "not a lockstep trace (bad magic)")
        if len(head) < FILE_HEAD_BYTES:
            raise self._err(len(head), "truncated file header (file is %d bytes)" % self.size)
        major, minor, jlen = struct.unpack_from("<HHI", head, 8)
        if major != VERSION_MAJOR:
            raise TraceError("%s: offset 8: trace format version %d.%d; this reader reads major version %d only"
                             % (self.path, major, minor, VERSION_MAJOR), 8)
        if jlen > JSON_MAX_BYTES:
            raise TraceError("%s: offset 12: header JSON length %d exceeds %d" % (self.path, jlen, JSON_MAX_BYTES), 12)
        total = FILE_HEAD_BYTES + jlen + 32
        if total > self.size:
            raise self._err(self.size, "truncated header (needs %d bytes, file is %d)" % (total, self.size))
        allb = self._read(0, total)
        if hashlib.sha256(allb[:FILE_HEAD_BYTES + jlen]).digest() != allb[FILE_HEAD_BYTES + jlen:]:
            raise TraceError("%s: offset 0: header checksum mismatch (header bytes 0..%d corrupted)"
                             % (self.path, total - 1), 0)
        h = parse_header(allb[FILE_HEAD_BYTES:FILE_HEAD_BYTES + jlen], "%s: offset 16" % self.path)
        h.version_major, h.version_minor = major, minor
        self._offset = total
        return h

    # ---- frames -------------------------------------------------------------
    def _frame(self, off) -> Frame:
        left = self.size - off
        if left < FRAME_FIXED_BYTES:
            raise self._err(off, "frame truncated: header needs %d bytes, file ends at %d" % (FRAME_FIXED_BYTES, self.size))
        fixed = self._read(off, FRAME_FIXED_BYTES)
        kind, flags, reserved, index, n_rec, n_seg, cchk, ubytes, cbytes = struct.unpack_from("<BBHIIIIQQ", fixed, 4)
        K = self.header.topk
        min_rec = RECORD_FIXED_BYTES + 8 * K + 4
        if flags:
            raise self._err(off, "frame header corrupted: flags (byte 5) are 0x%02x, must be 0" % flags)
        if reserved:
            raise self._err(off, "frame header corrupted: reserved bytes 6..7 are 0x%04x, must be 0" % reserved)
        if kind >= len(FRAME_KINDS) or n_rec == 0 or n_seg == 0 or n_seg > n_rec or \
                ubytes > FRAME_MAX_BYTES or ubytes < n_rec * min_rec or cbytes < 9 or \
                cbytes > _compress_bound(FRAME_MAX_BYTES) + 4:
            raise self._err(off, "frame header corrupted (kind %d, %d records, %d segments, %d / %d bytes)"
                            % (kind, n_rec, n_seg, ubytes, cbytes))
        mode = self.header.mode
        if FRAME_KINDS[kind] not in MODE_FRAMES[mode]:
            raise self._err(off, "frame %d: kind %d (%s) in a%s %s trace, which holds %s frames"
                            % (index, kind, FRAME_KINDS[kind], "n" if mode == "import" else "", mode,
                               " and ".join(MODE_FRAMES[mode])))
        head_bytes = FRAME_FIXED_BYTES + n_seg * SEGMENT_BYTES
        total = head_bytes + 32 + cbytes
        if total > left:
            raise self._err(off, "frame %d truncated: needs %d bytes, file ends at %d" % (index, total, self.size))
        head = self._read(off, head_bytes + 32)
        chk = head[head_bytes:]
        if hashlib.sha256(head[:head_bytes]).digest() != chk:
            raise self._err(off, "frame %d header checksum mismatch (bytes %d..%d corrupted)"
                            % (index, off, off + head_bytes + 31))
        segs = []
        for i in range(n_seg):
            s = struct.unpack_from("<III", head, FRAME_FIXED_BYTES + i * SEGMENT_BYTES)
            if s[2] == 0 or s[1] + s[2] > 0xFFFFFFFF:
                raise self._err(off, "frame %d: segment %d is empty or overflows" % (index, i))
            segs.append(s)
        if sum(s[2] for s in segs) != n_rec:
            raise self._err(off, "frame %d: segments hold %d records, header says %d"
                            % (index, sum(s[2] for s in segs), n_rec))
        if index != self.n_frames:
            raise self._err(off, "frame index %d, expected %d" % (index, self.n_frames))
        for s in segs:  # section 8: positions of a sequence increase through the file
            if s[1] < self._next_min.get(s[0], 0):
                raise self._err(off, "frame %d: seq %d pos %d repeats or goes back (positions of a sequence must "
                                     "increase through the trace)" % (index, s[0], s[1]))
            self._next_min[s[0]] = s[1] + s[2]
        first, last = off + total - cbytes, off + total - 1
        z = self._read(first, cbytes)
        if struct.unpack_from("<I", z)[0] != _ZSTD_MAGIC or not z[4] & 0x04:
            raise self._err(off, "frame %d: payload (bytes %d..%d) is not a zstd frame with a content checksum"
                            % (index, first, last))
        try:
            params = zstandard.get_frame_parameters(z)
            dobj = self._dctx.decompressobj()
            data = dobj.decompress(z)
            one = dobj.eof and not dobj.unused_data
        except zstandard.ZstdError as e:
            if "checksum" in str(e).lower():
                raise self._err(off, "frame %d checksum mismatch: payload content checksum fails (bytes %d..%d "
                                     "corrupted)" % (index, first, last))
            raise self._err(off, "frame %d: payload does not decompress to %d bytes (%s)" % (index, ubytes, e))
        if params.content_size != ubytes or not one:
            raise self._err(off, "frame %d: payload (bytes %d..%d) is not one zstd frame of %d bytes decompressing "
                                 "to %d bytes" % (index, first, last, cbytes, ubytes))
        if struct.unpack_from("<I", z, cbytes - 4)[0] != cchk:
            raise self._err(off, "frame %d checksum mismatch: payload content checksum %08x, header says %08x "
                                 "(bytes %d..%d corrupted)"
                            % (index, struct.unpack_from("<I", z, cbytes - 4)[0], cchk, first, last))
        if len(data) != ubytes:
            raise self._err(off, "frame %d: payload does not decompress to %d bytes (size mismatch)" % (index, ubytes))
        records, q = [], 0
        seg, in_seg = 0, 0
        for i in range(n_rec):
            if q >= ubytes:
                raise self._err(off, "frame %d: %d records declared, payload holds %d" % (index, n_rec, i))

            def bad(msg, q=q):
                return self._err(off, "frame %d, record byte %d: %s" % (index, q, msg))
            rec, n = decode_record(self.layout, data, q, bad)
            want = (segs[seg][0], segs[seg][1] + in_seg)
            if (rec.seq, rec.pos) != want:
                raise self._err(off, "frame %d, record %d is (seq %d, pos %d); its segment says (seq %d, pos %d)"
                                % (index, i, rec.seq, rec.pos, want[0], want[1]))
            in_seg += 1
            if in_seg == segs[seg][2]:
                seg, in_seg = seg + 1, 0
            records.append(rec)
            q += n
        if q != ubytes:
            raise self._err(off, "frame %d: %d trailing payload bytes" % (index, ubytes - q))
        self._chain.update(chk)
        self.n_frames += 1
        self.n_records += n_rec
        self.n_bytes += ubytes
        self._offset = off + total
        return Frame(FRAME_KINDS[kind], index, off, segs, records, ubytes, cbytes)

    def _trailer(self, off):
        left = self.size - off
        if left < TRAILER_BYTES:
            raise self._err(off, "trailer truncated: needs %d bytes, file ends at %d" % (TRAILER_BYTES, self.size))
        t = self._read(off, TRAILER_BYTES)
        if hashlib.sha256(t[:64]).digest() != t[64:]:
            raise self._err(off, "trailer checksum mismatch (trailer corrupted)")
        reserved, frames, records, nbytes = struct.unpack_from("<IQQQ", t, 4)
        if reserved:
            raise self._err(off, "trailer reserved bytes 4..7 are 0x%08x, must be 0" % reserved)
        if frames != self.n_frames or records != self.n_records:
            raise self._err(off, "trailer counts (%d frames, %d records) do not match the file (%d, %d)"
                            % (frames, records, self.n_frames, self.n_records))
        if nbytes != self.n_bytes:
            raise self._err(off, "trailer says %d uncompressed payload bytes, the frames hold %d" % (nbytes, self.n_bytes))
        if t[32:64] != self._chain.digest():
            raise self._err(off, "trailer digest over all frames does not match")
        if left > TRAILER_BYTES:
            raise self._err(off + TRAILER_BYTES, "%d unexpected bytes after the trailer" % (left - TRAILER_BYTES))
        self.complete = True

    def frames(self) -> Iterator[Frame]:
        """Each frame in file order, its records decoded and checked."""
        while not self._done:
            off = self._offset
            left = self.size - off
            if left == 0:          # ends right after a frame: incomplete, readable
                self._done = True
                return
            if left < 4:
                raise self._err(off, "truncated: %d stray bytes after the last frame" % left)
            magic = self._read(off, 4)
            if magic == TRAILER_MAGIC:
                self._trailer(off)
                self._done = True
                return
            if magic != FRAME_MAGIC:
                raise self._err(off, "expected a frame (LSFR) or the trailer (LSEN), found %s"
                                % " ".join("%02x" % b for b in magic))
            yield self._frame(off)

    def __iter__(self) -> Iterator[Record]:
        for f in self.frames():
            yield from f.records

    def close(self):
        self.fp.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_trace(path: str) -> Tuple[Header, List[Record], bool]:
    """(header, every record in file order, complete) of a trace, checked whole."""
    with TraceReader(path) as r:
        recs = list(r)
        return r.header, recs, r.complete
