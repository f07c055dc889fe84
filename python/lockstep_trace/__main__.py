"""python -m lockstep_trace COMMAND ...

  dump TRACE           every record as JSON lines, in the shape of
                       `lockstep trace dump --json` (header, records, end)
  verify TRACE         read and check the whole trace; prints a summary
  fingerprint DIR      the model_fingerprint (Merkle root) of a checkpoint
  hf-replay ...        teacher-forced trace from a Hugging Face model
                       (needs the [torch] extra; `hf-replay --help`)

Exit status: 0 done (verify: complete and intact), 1 verify: intact but
incomplete, 2 could not read (the message names the byte offset).
"""
import json
import sys

from .fingerprint import model_fingerprint
from .format import DTYPES, TraceError
from .reader import TraceReader


def header_json_obj(h):
    return {"header": {
        "version_major": h.version_major, "version_minor": h.version_minor, "mode": h.mode, "engine": h.engine,
        "model_fingerprint": h.model_fingerprint, "manifest_digest": h.manifest_digest,
        "run_params": h.run_params, "topk": h.topk, "digest_kinds": list(h.digest_kinds),
        "state_digest_every": h.state_digest_every, "activation_dtype": h.activation_dtype,
        "layers": [{"index": l.index, "family": l.family, "decoder_layer": l.decoder_layer} for l in h.layers]}}


def record_json_obj(r, topk):
    slots = list(r.topk) + [(-1, 0x7FC00000)] * (topk - len(r.topk))
    return {"record": {
        "seq": r.seq, "pos": r.pos, "token": r.token, "next_token": r.next_token,
        "logprob_bits": "0x%08x" % r.logprob_bits,
        "topk": [{"id": i, "logprob_bits": "0x%08x" % b} for i, b in slots],
        "digests": [{"layer": l, "kind": k, "sha256": d.hex()} for l, k, d in r.digests],
        "dumps": [{"layer": l, "kind": k, "dtype": DTYPES.index(dt), "n_elems": len(data) // (2 if dt == "bf16" else 4)}
                  for l, k, dt, data in r.dumps]}}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    cmd, args = argv[0], argv[1:]
    try:
        if cmd == "dump" and len(args) == 1:
            with TraceReader(args[0]) as r:
                out = sys.stdout
                out.write(json.dumps(header_json_obj(r.header), separators=(",", ":")) + "\n")
                for rec in r:
                    out.write(json.dumps(record_json_obj(rec, r.header.topk), separators=(",", ":")) + "\n")
                out.write(json.dumps({"end": {"complete": r.complete, "frames": r.n_frames, "records": r.n_records}},
                                     separators=(",", ":")) + "\n")
            return 0
        if cmd == "verify" and len(args) == 1:
            with TraceReader(args[0]) as r:
                seqs = set()
                for rec in r:
                    seqs.add(rec.seq)
                h = r.header
                print("%s: %s trace from %s, %d frames, %d records, %d sequences, %d layers, kinds %s, %s"
                      % (args[0], h.mode, h.engine or "?", r.n_frames, r.n_records, len(seqs), len(h.layers),
                         ",".join(h.digest_kinds) or "none", "complete" if r.complete else "INCOMPLETE (no trailer)"))
                return 0 if r.complete else 1
        if cmd == "fingerprint" and len(args) == 1:
            print(model_fingerprint(args[0]))
            return 0
        if cmd == "hf-replay":
            from .hf import main as hf_main
            return hf_main(args)
    except (TraceError, OSError) as e:
        print("lockstep_trace %s: %s" % (cmd, e), file=sys.stderr)
        return 2
    print("usage: python -m lockstep_trace dump|verify TRACE | fingerprint DIR | hf-replay ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
