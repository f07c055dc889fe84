#!/usr/bin/python3
"""Writes traces with the lockstep_trace package (python/) and checks them with the
C CLI: dump reads every field back; a rollout-shaped and a replay-shaped trace
compare equal; a planted router digest difference is the first drift.

usage: test_python_writer.py LOCKSTEP_BINARY SOURCE_DIR
"""
import atexit
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(sys.argv[2], "python"))
from lockstep_trace import Record, TraceWriter, digest, f32_bits  # noqa: E402

LS = sys.argv[1]
LAYERS = [("embed", -1), ("gdn", 0), ("moe", 0), ("attention", 1), ("moe", 1), ("norm", -1), ("lm_head", -1)]
KINDS = ["hidden", "gdn_state", "conv_state", "kv", "router"]
ALLOWED = {"embed": ["hidden"], "gdn": ["hidden", "gdn_state", "conv_state"], "moe": ["hidden", "router"],
           "attention": ["hidden", "kv"], "norm": ["hidden"], "lm_head": ["hidden"]}
N_SEQ, PROMPT, GEN = 2, 5, 6


def record(seq, pos, plant=None):
    h = lambda *a: int(hashlib.sha256(repr(a).encode()).hexdigest()[:8], 16)
    last = pos == PROMPT + GEN - 1
    r = Record(seq=seq, pos=pos, token=h(seq, pos) % 1000,
               next_token=-1 if last else h(seq, pos + 1) % 1000,
               logprob_bits=0x7FC00000 if last else f32_bits(-(h(seq, pos, "lp") % 1000) / 997.0),
               topk=[(h(seq, pos, k) % 1000, f32_bits(-k - 0.25)) for k in range(5)])
    dump = bytes((seq + pos + i) % 256 for i in range(32))  # 16 bf16 elements
    for layer, (fam, _) in enumerate(LAYERS):
        for kind in ALLOWED[fam]:
            data = b"%d/%d/%d/%s" % (seq, pos, layer, kind.encode())
            if pos == 3 and (layer, kind) == (1, "hidden"):
                data = dump  # a dump's SHA-256 is its digest (format section 5)
            if plant == (seq, pos, layer, kind):
                data += b"!"
            r.digests.append((layer, kind, digest(data)))
    if pos == 3:
        r.dumps.append((1, "hidden", "bf16", dump))
    return r


def write(path, chunk=0, plant=None):
    with TraceWriter(path, mode="replay" if chunk else "rollout", engine="python-test",
                     model_fingerprint="ab" * 32, layers=LAYERS, digest_kinds=KINDS,
                     run_params={"chunk": chunk}) as w:
        total = PROMPT + GEN
        if not chunk:
            w.begin_frame("prefill")
            for s in range(N_SEQ):
                for p in range(PROMPT):
                    w.add(record(s, p, plant))
            w.end_frame()
            for p in range(PROMPT, total):
                w.begin_frame("decode")
                for s in range(N_SEQ):
                    w.add(record(s, p, plant))
                w.end_frame()
        else:
            for c in range(0, total, chunk):
                w.begin_frame("chunk")
                for s in range(N_SEQ):
                    for p in range(c, min(c + chunk, total)):
                        w.add(record(s, p, plant))
                w.end_frame()


def run(*args):
    p = subprocess.run([LS] + list(args), capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def main():
    d = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, d, True)  # passed or failed
    a, b, c = (os.path.join(d, n) for n in ("a.trace", "b.trace", "c.trace"))
    write(a)
    write(b, chunk=4)
    write(c, chunk=3, plant=(1, 7, 4, "router"))
    rc, out = run("trace", "dump", a, "--json")
    assert rc == 0, out
    lines = [json.loads(l) for l in out.splitlines()]
    hdr = lines[0]["header"]
    assert hdr["mode"] == "rollout" and hdr["engine"] == "python-test" and hdr["topk"] == 5, hdr
    assert [l["family"] for l in hdr["layers"]] == [f for f, _ in LAYERS], hdr
    recs = [l["record"] for l in lines if "record" in l]
    assert len(recs) == N_SEQ * (PROMPT + GEN), len(recs)
    for got in recs:
        want = record(got["seq"], got["pos"])
        assert got["token"] == want.token and got["next_token"] == want.next_token, got
        assert int(got["logprob_bits"], 16) == want.logprob_bits, got
        assert [(t["id"], int(t["logprob_bits"], 16)) for t in got["topk"]] == want.topk, got
        assert [(g["layer"], g["kind"], bytes.fromhex(g["sha256"])) for g in got["digests"]] == want.digests, got
        assert len(got["dumps"]) == (1 if got["pos"] == 3 else 0), got
    assert lines[-1]["end"]["complete"] is True, lines[-1]
    rc, out = run("compare", a, b)
    assert rc == 0, "rollout vs replay should be equal:\n" + out
    rc, out = run("compare", a, c)
    assert rc == 1 and "seq 1 pos 7 layer 4 (moe, decoder layer 1): router digest differs" in out, out
    print("python writer: %d records read back, rollout == replay, planted drift found" % len(recs))


if __name__ == "__main__":
    main()
