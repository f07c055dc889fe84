#!/usr/bin/python3
"""The lockstep_trace package (python/) against the C implementation, without
torch (Debian's python3 with python3-zstandard):

  1. reader: on lockstep's fp32 and bf16 replays of the goldens'
     (goldens/qwen3next_tiny_*) teacher-forced tokens, every dumped decoder
     layer, the package reads every field `lockstep trace dump --json` prints;
  2. digests: every dump (hidden, gdn_state, conv_state, kv, router) re-encoded
     from its values by the package's canonical-bytes functions hashes to the
     C digest, and the embed digest computed from the checkpoint's embedding
     rows equals the C one at every position; model_fingerprint equals the
     header's; bf16 rounding matches ls_f32_to_bf16 on edge cases;
  3. writer: lockstep's trace rewritten by the package (other framing) is
     accepted by `trace dump` and compares equal to the original; the
     package's docstring examples run and write a trace lockstep reads;
     run_params is kept byte for byte (u64 seed, 1e999, \\u0000, a repeated key);
  4. rules: for each corruption (checksums recomputed so that only the rule
     is broken) both readers refuse the trace and name the same byte offset;
     the writer refuses what the reader refuses.

usage: test_python_package.py LOCKSTEP_BINARY SOURCE_DIR
"""
import atexit
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

LS, SRC = sys.argv[1], os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.join(SRC, "python"))
import zstandard  # noqa: E402

import lockstep_trace as lt  # noqa: E402
from lockstep_trace.__main__ import header_json_obj, record_json_obj  # noqa: E402

WORK = tempfile.mkdtemp(prefix="lt_pkg_")
atexit.register(shutil.rmtree, WORK, True)  # passed or failed
GOLDENS = ["qwen3next_tiny_a", "qwen3next_tiny_b", "qwen3next_tiny_c"]
checks = 0


def ok(cond, msg):
    global checks
    checks += 1
    if not cond:
        print("FAIL: " + msg)
        sys.exit(1)


def run(*args):
    p = subprocess.run([LS] + [str(a) for a in args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def golden_tokens(name):
    with open(os.path.join(SRC, "goldens", name, "expected.json.zst"), "rb") as f:
        d = json.loads(zstandard.ZstdDecompressor().decompressobj().decompress(f.read()))
    return [{"id": r["seq"], "tokens": r["tokens"], "prompt_len": max(1, len(r["tokens"]) // 2)}
            for r in d["runs"] if r["kind"] == "teacher_forced" and r["dtype"] == "float32" and len(r["tokens"]) >= 2]


def safetensors_tensor(path, name):
    """(dtype, shape, bytes) of one tensor, standard library only."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        a, b = hdr[name]["data_offsets"]
        f.seek(8 + n + a)
        return hdr[name]["dtype"], hdr[name]["shape"], f.read(b - a)


def c_dump(path):
    rc, out, err = run("trace", "dump", path, "--json")
    ok(rc == 0, "lockstep trace dump %s: rc %d %s" % (path, rc, err))
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def py_dump(path):
    with lt.TraceReader(path) as r:
        lines = [header_json_obj(r.header)] + [record_json_obj(x, r.header.topk) for x in r]
        lines.append({"end": {"complete": r.complete, "frames": r.n_frames, "records": r.n_records}})
    return lines


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return "line %d:\n  C:  %s\n  py: %s" % (i, json.dumps(x)[:400], json.dumps(y)[:400])
    return "lengths %d / %d" % (len(a), len(b))


# ---- 0: the package installs ----------------------------------------------------
# pip install of a copy of python/ into a fresh virtual environment, offline
# (its one dependency, zstandard, from the system site packages), then the
# installed package and its command read a trace outside the source tree.
import contextlib  # noqa: E402
import io  # noqa: E402

venv, copy = os.path.join(WORK, "venv"), os.path.join(WORK, "pkg")
shutil.copytree(os.path.join(SRC, "python"), copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
for cmd in ([sys.executable, "-m", "venv", "--system-site-packages", venv],
            [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
             "--no-index", copy]):
    p = subprocess.run(cmd, capture_output=True, text=True)
    ok(p.returncode == 0, "%s: rc %d\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
p = subprocess.run([os.path.join(venv, "bin", "python"), "-c", "import lockstep_trace; print(lockstep_trace.__file__)"],
                   capture_output=True, text=True, cwd=WORK)
ok(p.returncode == 0 and p.stdout.startswith(venv), "the installed package imports from the venv: %s%s" % (p.stdout, p.stderr))
print("install: pip install python/ into a fresh venv; lockstep_trace imports from %s" % os.path.dirname(p.stdout.strip()))

# ---- 1 and 2: the goldens ----------------------------------------------------
def reencode(h, rec, layer, kind, dtype, data):
    """Canonical bytes of a dump rebuilt from its decoded values."""
    act = h.activation_dtype
    v = lt.dump_values(dtype, data)
    if kind == "router":
        return lt.router_bytes(*v)
    if kind == "kv":
        half = len(v) // 2
        return lt.kv_bytes(v[:half], v[half:], act)
    if kind == "gdn_state":
        return lt.gdn_state_bytes(v)
    if kind == "conv_state":
        with open(os.path.join(CKPT, "config.json")) as f:
            W = json.load(f).get("linear_conv_kernel_dim", 4)
        cols = [v[i:i + W - 1] for i in range(0, len(v), W - 1)]
        return lt.conv_state_bytes(cols, act)
    return lt.hidden_bytes(v, act)


kinds_seen = {}
traces = {}
for name in GOLDENS:
    CKPT = os.path.join(SRC, "goldens", name)
    seqs = golden_tokens(name)
    tok = os.path.join(WORK, name + ".jsonl")
    with open(tok, "w") as f:
        for s in seqs:
            f.write(json.dumps(s) + "\n")
    with open(os.path.join(CKPT, "config.json")) as f:
        n_layers = json.load(f)["num_hidden_layers"]
    _, shape, embed = safetensors_tensor(os.path.join(CKPT, "model.safetensors"), "model.embed_tokens.weight")
    D = shape[1]
    fp = lt.model_fingerprint(CKPT)
    for act in ("fp32", "bf16"):
        path = os.path.join(WORK, "%s_%s.trace" % (name, act))
        rc, out, err = run("run", "--checkpoint", CKPT, "--mode", "replay", "--tokens", tok, "--activations", act,
                           "--state-digest-every", 16, "--dump-layers", ",".join(map(str, range(n_layers))), "-o", path)
        ok(rc == 0, "lockstep run %s %s: %s" % (name, act, err))
        traces[(name, act)] = path
        c, py = c_dump(path), py_dump(path)
        ok(c == py, "%s %s: the package reads what trace dump prints; first difference %s"
           % (name, act, first_difference(c, py)))
        with lt.TraceReader(path) as r:
            h = r.header
            ok(h.model_fingerprint == fp, "%s: model_fingerprint %s, the package computes %s" % (name, h.model_fingerprint, fp))
            by_seq = {s["id"]: s["tokens"] for s in seqs}
            for rec in r:
                for layer, kind, dtype, data in rec.dumps:
                    b = reencode(h, rec, layer, kind, dtype, data)
                    ok(lt.digest(b) == rec.digest(layer, kind),
                       "%s %s seq %d pos %d layer %d %s: re-encoded dump hashes to %s, C digest %s"
                       % (name, act, rec.seq, rec.pos, layer, kind, lt.digest(b).hex(), rec.digest(layer, kind).hex()))
                    kinds_seen[(act, kind)] = kinds_seen.get((act, kind), 0) + 1
                # the embed layer from the checkpoint itself: its bf16 row (widened in fp32)
                t = by_seq[rec.seq][rec.pos]
                row16 = embed[2 * D * t:2 * D * (t + 1)]
                vals = [lt.bf16_to_f32(x) for x in struct.unpack("<%dH" % D, row16)]
                want = lt.digest(lt.hidden_bytes(vals, act))
                ok(want == rec.digest(0, "hidden"), "%s %s seq %d pos %d: embed digest %s, C %s"
                   % (name, act, rec.seq, rec.pos, want.hex(), rec.digest(0, "hidden").hex()))
                if act == "bf16":
                    ok(row16 == lt.hidden_bytes(vals, "bf16"), "bf16 canonical bytes of an embedding row")
for act in ("fp32", "bf16"):
    for kind in lt.KINDS:
        ok(kinds_seen.get((act, kind), 0) > 0, "no %s dump of kind %s in the goldens' traces" % (act, kind))
print("goldens: %d traces read as trace dump prints them; %d dumps re-encoded to the C digests (%s)"
      % (len(traces), sum(kinds_seen.values()),
         ", ".join("%s %s %d" % (a, k, n) for (a, k), n in sorted(kinds_seen.items()))))

# bf16 rounding: ls_f32_to_bf16 (round to nearest even; NaN kept quiet with its sign)
for bits, want in [(0x3F800000, 0x3F80), (0x3F808000, 0x3F80), (0x3F818000, 0x3F82), (0x3F808001, 0x3F81),
                   (0x7F7FFFFF, 0x7F80), (0xFF800000, 0xFF80), (0x7FC00000, 0x7FC0), (0xFF812345, 0xFFC1),
                   (0x00000001, 0x0000), (0x80008000, 0x8000), (0x3F80C000, 0x3F81)]:
    got = lt.bf16_bits(lt.f32_from_bits(bits))
    ok(got == want, "bf16_bits(0x%08x) = 0x%04x, want 0x%04x" % (bits, got, want))

# ---- 3: the writer -------------------------------------------------------------
src = traces[("qwen3next_tiny_a", "fp32")]
with lt.TraceReader(src) as r:
    h, recs = r.header, list(r)
re_path = os.path.join(WORK, "rewritten.trace")
with lt.TraceWriter(re_path, mode="replay", engine=h.engine, model_fingerprint=h.model_fingerprint,
                    manifest_digest=h.manifest_digest, run_params=h.run_params_text, topk=h.topk,
                    digest_kinds=h.digest_kinds, state_digest_every=h.state_digest_every,
                    activation_dtype=h.activation_dtype, layers=h.layers) as w:
    for i, rec in enumerate(recs):          # a frame per 7 records: other framing than lockstep's
        if i % 7 == 0:
            if i:
                w.end_frame()
            w.begin_frame("chunk")
        w.add(rec)
ok(c_dump(re_path)[0] == c_dump(src)[0], "rewritten header differs from lockstep's")
ok([x for x in c_dump(re_path)[1:-1]] == [x for x in c_dump(src)[1:-1]], "rewritten records differ")
rc, out, err = run("compare", src, re_path)
ok(rc == 0, "lockstep compare of lockstep's trace and its Python rewrite: rc %d\n%s%s" % (rc, out, err))
print("writer: lockstep's trace rewritten in %d frames; trace dump and compare accept it, equal" % ((len(recs) + 6) // 7))

# The package docstring's examples run as written.
doc = lt.__doc__
blocks = re.findall(r"::\n\n((?:    .*\n|\n)+)", doc)
ok(len(blocks) == 2, "the package docstring has its two examples")
cwd = os.getcwd()
os.chdir(WORK)
try:
    for b in blocks:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile("\n".join(l[4:] for l in b.splitlines()), "lockstep_trace docstring", "exec"), {})
finally:
    os.chdir(cwd)
rc, out, err = run("trace", "dump", os.path.join(WORK, "run.trace"))
ok(rc == 0, "the docstring example's trace: %s" % err)
# docs/python.md: its writing and reading examples (the blocks without the hooks), in order
with open(os.path.join(SRC, "docs", "python.md")) as f:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", f.read(), re.S) if "torch" not in b and "HFRecorder" not in b]
ok(len(blocks) == 2, "docs/python.md has its writing and reading examples (%d)" % len(blocks))
os.chdir(WORK)
try:
    for b in blocks:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(b, "docs/python.md", "exec"), {})
finally:
    os.chdir(cwd)
rc, out, err = run("trace", "dump", os.path.join(WORK, "engine.trace"))
ok(rc == 0, "docs/python.md's example trace: %s" % err)
p = subprocess.run([os.path.join(venv, "bin", "lockstep-trace"), "verify", os.path.join(WORK, "run.trace")],
                   capture_output=True, text=True, cwd=WORK)
ok(p.returncode == 0 and "complete" in p.stdout, "the installed lockstep-trace command: %s%s" % (p.stdout, p.stderr))

# run_params is opaque: what strict parsers refuse is kept byte for byte.
params = '{"seed":18446744073709551615,"big":1e999,"nul":"a\\u0000b","k":1,"k":2,"batch":[]}'
pp = os.path.join(WORK, "params.trace")
with lt.TraceWriter(pp, mode="import", model_fingerprint="cd" * 32, layers=[], run_params=params) as w:
    w.begin_frame("import")
    w.add(lt.Record(seq=0, pos=0, token=-1, next_token=5, logprob_bits=lt.f32_bits(-0.5), topk=[(5, lt.f32_bits(-0.5))]))
rc, out, err = run("trace", "dump", pp, "--json")
ok(rc == 0, "lockstep reads opaque run_params: %s" % err)
with lt.TraceReader(pp) as r:
    ok(r.header.run_params_text == params, "run_params text kept: %r" % r.header.run_params_text)
    rp = r.header.run_params
    ok(rp["seed"] == 18446744073709551615 or rp["seed"] == "18446744073709551615", "u64 seed read")
    ok(rp["big"] == "1e999" and rp["k"] == 2 and rp["nul"] == "a\0b", "lenient run_params: %r" % rp)
    list(r)


# ---- 4: the rules ------------------------------------------------------------------
def read_frames(path):
    """(header bytes, [(kind, index, segments, payload)], trailer or None) of a valid trace."""
    b = open(path, "rb").read()
    jl = struct.unpack_from("<I", b, 12)[0]
    head, off, frames = b[:16 + jl + 32], 16 + jl + 32, []
    while off < len(b) and b[off:off + 4] == b"LSFR":
        kind, flags, res, idx, nrec, nseg, cchk, ub, cb = struct.unpack_from("<BBHIIIIQQ", b, off + 4)
        segs = [list(struct.unpack_from("<III", b, off + 40 + 12 * i)) for i in range(nseg)]
        start = off + 40 + 12 * nseg + 32
        payload = zstandard.ZstdDecompressor().decompressobj().decompress(b[start:start + cb])
        frames.append([kind, idx, segs, bytearray(payload), 0])
        off = start + cb
    return head, frames, b[off:]


def build(path, head, frames, trailer="auto", tail=b""):
    """Writes frames with every checksum recomputed; frame[4] = flags byte | reserved bytes 6..7 << 8."""
    out, chain, nrec, nbytes = bytearray(head), hashlib.sha256(), 0, 0
    cctx = zstandard.ZstdCompressor(write_content_size=True, write_checksum=True)
    for kind, idx, segs, payload, flags in frames:
        comp = cctx.compress(bytes(payload))
        n = sum(s[2] for s in segs)
        fh = b"LSFR" + struct.pack("<BBHIIIIQQ", kind, flags & 0xff, flags >> 8, idx, n, len(segs), struct.unpack("<I", comp[-4:])[0],
                                   len(payload), len(comp)) + b"".join(struct.pack("<III", *s) for s in segs)
        chk = hashlib.sha256(fh).digest()
        out += fh + chk + comp
        chain.update(chk)
        nrec += n
        nbytes += len(payload)
    if trailer == "auto":
        t = b"LSEN" + struct.pack("<IQQQ", 0, len(frames), nrec, nbytes) + chain.digest()
        out += t + hashlib.sha256(t).digest()
    elif trailer is not None:
        out += trailer
    out += tail
    with open(path, "wb") as f:
        f.write(out)


def expect_refused(label, path, incomplete=False, says=None):
    rc, out, err = run("trace", "dump", path)
    try:
        with lt.TraceReader(path) as r:
            list(r)
            py_err, complete = None, r.complete
    except lt.TraceError as e:
        py_err, complete = e, None
    if incomplete:
        ok(rc == 2 and "incomplete" in err and py_err is None and complete is False,
           "%s: both read an incomplete trace (C rc %d %s; py %s)" % (label, rc, err.strip(), py_err))
        return
    ok(rc == 2 and py_err is not None, "%s: C rc %d (%s), package %s" % (label, rc, err.strip(), py_err))
    m = re.search(r"offset (\d+)", err)
    ok(m is not None and int(m.group(1)) == py_err.offset,
       "%s: C names %s, the package offset %s (%s)" % (label, m and m.group(1), py_err.offset, py_err))
    if says:
        ok(says in err and says in str(py_err), "%s: both readers say '%s' (C: %s; package: %s)"
           % (label, says, err.strip(), py_err))


# A small bf16 trace: every family, a 3-element bf16 dump (2 padding bytes), K = 5.
LAY = [("embed", -1), ("gdn", 0), ("moe", 0), ("attention", 1), ("moe", 1), ("norm", -1), ("lm_head", -1)]
ALL = ["hidden", "gdn_state", "conv_state", "kv", "router"]


def small_record(seq, pos):
    r = lt.Record(seq=seq, pos=pos, token=7 + pos, next_token=8 + pos, logprob_bits=lt.f32_bits(-0.5),
                  topk=[(8 + pos, lt.f32_bits(-0.5)), (3, lt.f32_bits(-1.0)), (4, lt.f32_bits(-2.0))])
    for i, (fam, _) in enumerate(LAY):
        for k in lt.FAMILY_KINDS[fam]:
            data = b"%d %d %d %s" % (seq, pos, i, k.encode())
            if (i, k) == (1, "hidden"):
                data = lt.hidden_bytes([0.5, -1.25, 3.0], "bf16")
            r.digests.append((i, k, lt.digest(data)))
    r.dumps.append((1, "hidden", "bf16", lt.hidden_bytes([0.5, -1.25, 3.0], "bf16")))
    return r


good = os.path.join(WORK, "good.trace")
with lt.TraceWriter(good, mode="replay", model_fingerprint="ab" * 32, layers=LAY, digest_kinds=ALL,
                    state_digest_every=1) as w:
    for c in range(2):
        w.begin_frame("chunk")
        for s in range(2):
            for p in range(3 * c, 3 * c + 3):
                w.add(small_record(s, p))
        w.end_frame()
ok(c_dump(good) == py_dump(good), "small trace read alike")
HEAD, FR, TR = read_frames(good)
FIXED = 24 + 8 * 5 + 4            # record bytes before the digests


n_mutations = 0


def mutate(label, fn, **kw):
    global n_mutations
    n_mutations += 1
    frames = [[k, i, [list(s) for s in segs], bytearray(p), fl] for k, i, segs, p, fl in FR]
    head = bytearray(HEAD)
    extra = fn(head, frames) or {}
    path = os.path.join(WORK, "bad_%s.trace" % re.sub(r"\W+", "_", label))
    if "raw" in extra:
        with open(path, "wb") as f:
            f.write(extra["raw"])
    else:
        build(path, bytes(head), frames, **{k: v for k, v in extra.items() if k in ("trailer", "tail")})
    expect_refused(label, path, **kw)


def rec0(frames):
    return frames[0][3]


def set_header(obj_fn):
    def fn(head, frames):
        jl = struct.unpack_from("<I", head, 12)[0]
        obj = json.loads(bytes(head[16:16 + jl]))
        text = obj_fn(obj)
        js = (text if isinstance(text, str) else json.dumps(obj, separators=(",", ":"))).encode()
        h = b"LSTRACE\0" + struct.pack("<HHI", 1, 0, len(js)) + js
        head[:] = h + hashlib.sha256(h).digest()
    return fn


def poke(off, fmt, value):
    def fn(head, frames):
        struct.pack_into(fmt, rec0(frames), off, value)
    return fn


GOOD_BYTES = open(good, "rb").read()
mutate("top-k slot used after an unused one", lambda h, f: struct.pack_into("<iI", rec0(f), 24, -1, 0x7FC00000))
mutate("top-k ids repeat", lambda h, f: struct.pack_into("<i", rec0(f), 32, struct.unpack_from("<i", rec0(f), 24)[0]))
mutate("unused top-k slot with logprob bits", lambda h, f: struct.pack_into("<I", rec0(f), 24 + 8 * 4 + 4, 0x3F800000))
mutate("top-k id below -1", lambda h, f: struct.pack_into("<i", rec0(f), 24 + 8 * 4, -2))
mutate("digest pad byte", lambda h, f: rec0(f).__setitem__(FIXED + 3, 1))
mutate("digests out of order", lambda h, f: rec0(f).__setitem__(slice(FIXED, FIXED + 72),
                                                                  rec0(f)[FIXED + 36:FIXED + 72] + rec0(f)[FIXED:FIXED + 36]))
mutate("digest kind the family lacks", lambda h, f: rec0(f).__setitem__(FIXED + 2, 4))   # embed router
mutate("dump hashes to another digest", lambda h, f: rec0(f).__setitem__(struct.unpack_from("<I", rec0(f), 0)[0] - 8, 0x41))
mutate("dump padding byte", lambda h, f: rec0(f).__setitem__(struct.unpack_from("<I", rec0(f), 0)[0] - 1, 1))
mutate("dump dtype router for hidden", lambda h, f: rec0(f).__setitem__(struct.unpack_from("<I", rec0(f), 0)[0] - 13, 2))


def drop_digest(h, frames):
    """The record lacks its lm_head digest (the last one): n_digests - 1."""
    p = rec0(frames)
    rb, nd = struct.unpack_from("<I", p, 0)[0], struct.unpack_from("<H", p, FIXED - 4)[0]
    cut = FIXED + 36 * (nd - 1)
    p[cut:cut + 36] = b""
    struct.pack_into("<I", p, 0, rb - 36)
    struct.pack_into("<H", p, FIXED - 4, nd - 1)


mutate("a listed kind missing", drop_digest)
mutate("record length", lambda h, f: struct.pack_into("<I", rec0(f), 0, struct.unpack_from("<I", rec0(f), 0)[0] + 4))
mutate("record and segment disagree", lambda h, f: struct.pack_into("<I", rec0(f), 8, 1))
mutate("frame kind prefill in a replay", lambda h, f: f[1].__setitem__(0, 0))
mutate("frame flags", lambda h, f: f[1].__setitem__(4, 1), says="flags (byte 5) are 0x01, must be 0")
mutate("frame reserved", lambda h, f: f[1].__setitem__(4, 0x2000), says="reserved bytes 6..7 are 0x0020, must be 0")
mutate("frame index", lambda h, f: f[1].__setitem__(1, 5))


def go_back(h, frames):
    """Frame 1 holds seq 0 at positions 0..2 again (records and segment)."""
    p, q = frames[1][3], 0
    for _ in range(3):
        struct.pack_into("<I", p, q + 8, struct.unpack_from("<I", p, q + 8)[0] - 3)
        q += struct.unpack_from("<I", p, q)[0]
    frames[1][2][0] = [0, 0, 3]


def trailer(frames, reserved=0, records_delta=0):
    chain = hashlib.sha256()
    cctx = zstandard.ZstdCompressor(write_content_size=True, write_checksum=True)
    for kind, idx, segs, payload, flags in frames:   # the same bytes build() writes
        comp = cctx.compress(bytes(payload))
        fh = b"LSFR" + struct.pack("<BBHIIIIQQ", kind, flags & 0xff, flags >> 8, idx, sum(s[2] for s in segs), len(segs),
                                   struct.unpack("<I", comp[-4:])[0], len(payload), len(comp))
        chain.update(hashlib.sha256(fh + b"".join(struct.pack("<III", *s) for s in segs)).digest())
    t = b"LSEN" + struct.pack("<IQQQ", reserved, len(frames), sum(s[2] for f in frames for s in f[2]) + records_delta,
                              sum(len(f[3]) for f in frames)) + chain.digest()
    return t + hashlib.sha256(t).digest()


mutate("position goes back", go_back)
mutate("trailer reserved bytes", lambda h, f: {"trailer": trailer(f, reserved=1)})
mutate("trailer counts", lambda h, f: {"trailer": trailer(f, records_delta=-1)})
mutate("bytes after the trailer", lambda h, f: {"tail": b"\0"})
mutate("no trailer", lambda h, f: {"trailer": None}, incomplete=True)
mutate("truncated in a frame", lambda h, f: {"raw": GOOD_BYTES[:len(GOOD_BYTES) - 96 - 10]})
mutate("header checksum", lambda h, f: {"raw": GOOD_BYTES[:20] + bytes([GOOD_BYTES[20] ^ 1]) + GOOD_BYTES[21:]})
mutate("payload byte", lambda h, f: {"raw": GOOD_BYTES[:-96 - 20] + bytes([GOOD_BYTES[-96 - 20] ^ 0x10]) + GOOD_BYTES[-96 - 19:]})
mutate("version 2", lambda h, f: {"raw": GOOD_BYTES[:8] + b"\x02" + GOOD_BYTES[9:]})
mutate("header mode", set_header(lambda o: o.update(mode="rollout")))      # chunk frames in a rollout
mutate("header repeated key", set_header(lambda o: json.dumps(o, separators=(",", ":"))[:-1] + ',"topk":5}'))
mutate("header topk 0", set_header(lambda o: o.update(topk=0)))
mutate("header integer beyond int64", set_header(lambda o: json.dumps(o, separators=(",", ":"))[:-1] + ',"x":18446744073709551616}'))
mutate("header NUL in a string", set_header(lambda o: o.update(engine="a\0b")))
mutate("header layer index", set_header(lambda o: o["layers"][2].update(index=5)))
mutate("header kind unknown", set_header(lambda o: o.update(digest_kinds=["hidden", "logits"])))
mutate("header fingerprint case", set_header(lambda o: o.update(model_fingerprint="AB" * 32)))
print("rules: %d corruptions refused by both readers at the same offset (one read alike as incomplete)" % n_mutations)

# The writer refuses what the reader refuses.
def refused(label, fn):
    try:
        fn()
    except lt.TraceError:
        ok(True, label)
        return
    ok(False, "the writer accepted: " + label)


def with_writer(fn, **kw):
    def go():
        args = dict(mode="replay", model_fingerprint="ab" * 32, layers=LAY, digest_kinds=ALL, state_digest_every=1)
        args.update(kw)
        w = lt.TraceWriter(os.path.join(WORK, "refused.trace"), **args)
        try:
            w.begin_frame("chunk")
            fn(w)
        finally:
            w.abort()
    return go


def strip(r, layer=None, kind=None, dump=False):
    r.digests = [d for d in r.digests if (d[0], d[1]) != (layer, kind)]
    if dump:
        r.dumps = [(1, "hidden", "bf16", b"\0\0\0\0")]
    return r


refused("a listed kind missing", with_writer(lambda w: w.add(strip(small_record(0, 0), 6, "hidden"))))
refused("a gdn_state missing at a due position", with_writer(lambda w: w.add(strip(small_record(0, 0), 1, "gdn_state"))))
refused("a dump that does not hash to its digest", with_writer(lambda w: w.add(strip(small_record(0, 0), dump=True))))
refused("prefill frame in a replay", lambda: lt.TraceWriter(os.path.join(WORK, "x.trace"), mode="replay",
                                                              model_fingerprint="ab" * 32, layers=LAY).begin_frame("prefill"))
refused("positions going back", with_writer(lambda w: [w.add(small_record(0, 1)), w.add(small_record(0, 1))]))
refused("top-k ids repeating", with_writer(lambda w: w.add(lt.Record(0, 0, 1, topk=[(3, 0), (3, 0)])), digest_kinds=[]))
refused("top-k wider than the header", with_writer(lambda w: w.add(lt.Record(0, 0, 1, topk=[(i, 0) for i in range(6)])),
                                                   digest_kinds=[]))
refused("router digest on an attention layer", with_writer(lambda w: w.add(lt.Record(0, 0, 1, digests=[(3, "router", b"\0" * 32)])),
                                                           digest_kinds=["router"]))
refused("a repeated digest kind", lambda: lt.TraceWriter(os.path.join(WORK, "x.trace"), mode="replay",
                                                          model_fingerprint="ab" * 32, layers=LAY, digest_kinds=["hidden", "hidden"]))
refused("run_params not an object", lambda: lt.TraceWriter(os.path.join(WORK, "x.trace"), mode="replay",
                                                            model_fingerprint="ab" * 32, layers=LAY, run_params="[1]"))
ok(not any(n.startswith("refused.trace") for n in os.listdir(WORK)), "abort leaves no file behind")
print("writer refusals: 10 cases refused, no file left behind")
print("%d checks passed, 0 failed" % checks)
