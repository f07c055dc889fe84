#!/usr/bin/python3
"""The JSON report validates against docs/compare-json.schema.json, the JUnit
report parses as XML with one testsuite and a testcase per sequence (failures
carrying the first drift, manifest digests as properties), and the HTML page
is self-contained (no scripts, no network references).

usage: test_reports.py LOCKSTEP_BINARY SOURCE_DIR
"""
import atexit
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import jsonschema

sys.path.insert(0, os.path.join(sys.argv[2], "tests", "python"))
import test_python_writer as tw  # noqa: E402

LS, SRC = sys.argv[1], sys.argv[2]
schema = json.load(open(os.path.join(SRC, "docs", "compare-json.schema.json")))
d = tempfile.mkdtemp()
atexit.register(shutil.rmtree, d, True)  # passed or failed
a, b, c = (os.path.join(d, n) for n in ("a.trace", "b.trace", "c.trace"))
tw.write(a)
tw.write(b, chunk=4)
tw.write(c, chunk=3, plant=(1, 7, 1, "gdn_state"))
for other, rc_want in ((b, 0), (c, 1)):
    js, ju, ht = (os.path.join(d, n) for n in ("r.json", "r.xml", "r.html"))
    p = subprocess.run([LS, "compare", a, other, "--json", js, "--junit", ju, "--html", ht], capture_output=True, text=True)
    assert p.returncode == rc_want, p.stdout + p.stderr
    doc = json.load(open(js))
    jsonschema.validate(doc, schema)
    assert doc["result"] == ("PASS" if rc_want == 0 else "FAIL"), doc["result"]
    if rc_want:
        fd = doc["first_drift"]
        assert (fd["seq"], fd["pos"], fd["layer"], fd["family"], fd["kind"]) == (1, 7, 1, "gdn", "gdn_state"), fd
    root = ET.parse(ju).getroot()
    assert root.tag == "testsuites", root.tag
    suites = root.findall("testsuite")
    assert len(suites) == 1, suites
    cases = suites[0].findall("testcase")
    assert [t.get("name") for t in cases] == ["seq 0", "seq 1"], cases
    props = {p.get("name"): p.get("value") for p in suites[0].find("properties")}
    assert "manifest_digest_a" in props and "model_fingerprint_a" in props, props
    fails = [t for t in cases if t.find("failure") is not None]
    assert int(suites[0].get("failures")) == len(fails) == rc_want, fails
    if rc_want:
        assert "seq 1 pos 7 layer 1 (gdn, decoder layer 0): gdn_state digest differs" in fails[0].find("failure").get("message")
    html = open(ht).read()
    assert "<script" not in html and "http://" not in html and "https://" not in html, "HTML must be self-contained"
    assert "<svg" in html and ("FIRST DRIFT" in html) == bool(rc_want)
p = subprocess.run([LS, "compare", a, c, "--json", "-"], capture_output=True, text=True)
doc = json.loads(p.stdout)
jsonschema.validate(doc, schema)
assert doc["stats"] is None and all(s["stats"] is None for s in doc["sequences"]), "stats only with --stats"

# --stats: the same verdict and exit status, statistics in every report
for other, rc_want in ((b, 0), (c, 1)):
    js, ht = (os.path.join(d, n) for n in ("s.json", "s.html"))
    p = subprocess.run([LS, "compare", "--stats", a, other, "--json", js, "--html", ht], capture_output=True, text=True)
    assert p.returncode == rc_want, p.stdout + p.stderr
    assert "drift statistics" in p.stdout and "mean |old_log_probs - rollout_log_probs|" in p.stdout, p.stdout
    doc = json.load(open(js))
    jsonschema.validate(doc, schema)
    assert doc["result"] == ("PASS" if rc_want == 0 else "FAIL"), doc["result"]
    st = doc["stats"]
    n_pos = sum(s["positions_compared"] for s in doc["sequences"])
    assert st["steps"] == sum(s["steps"] for s in doc["sequences"]) and st["tokens_agree"] == st["steps"], st
    assert st["dlogprob"]["n"] == st["steps"] and st["dlogprob"]["max"] == 0.0, st["dlogprob"]
    assert st["topk_overlap"] == {"positions": n_pos, "mean": 1.0, "min": 1.0}, st["topk_overlap"]
    layers = st["layers"]
    assert [l["layer"] for l in layers] == list(range(len(doc["layers"]))), layers
    differ = [l["layer"] for l in layers if l["digests_differ"]]
    assert differ == ([1] if rc_want else []), differ  # the planted gdn_state digest is in layer 1
    dumps = [(l["layer"], x["kind"], x["positions"]) for l in layers for x in l["dumps"]]
    assert dumps == [(1, "hidden", 2)], dumps  # both writers dump layer 1's hidden row at position 3
    assert all(s["stats"]["steps"] == s["steps"] for s in doc["sequences"]), doc["sequences"]
    html = open(ht).read()
    assert "Drift statistics" in html and "<script" not in html, "HTML stats section"
# HTML that scales: failing sequences drawn in full and linked from the table,
# passing ones only in the overview; the prompt/completion boundary marked.
html = open(os.path.join(d, "r.html")).read()  # the last run above: a vs c, seq 1 fails
assert 'id="seq-1"' in html and 'href="#seq-1"' in html and 'id="seq-0"' not in html, "links to failing heat maps"
assert html.count('aria-label="heat map seq') == 1 and 'aria-label="all sequences"' in html, "one heat map, one overview"
sys.path.insert(0, os.path.join(SRC, "python"))  # the lockstep_trace package, from the source tree
from lockstep_trace import Record, TraceWriter, f32_bits  # noqa: E402

N_SEQ, N_POS, PROMPT = 16, 512, 200
LAYERS = [("embed", -1)] + [(f, i) for i in range(48) for f in ("gdn" if i % 4 != 3 else "attention", "moe")] + \
         [("norm", -1), ("lm_head", -1)]


def big(path, plant_seq=None):
    batch = [{"id": q, "prompt_len": PROMPT, "n_tokens": N_POS} for q in range(N_SEQ)]
    with TraceWriter(path, mode="replay", model_fingerprint="ab" * 32, layers=LAYERS,
                     run_params={"batch": batch}) as w:
        w.begin_frame("chunk")
        for q in range(N_SEQ):
            for p in range(N_POS):
                lp = -1.0 - (p % 5) / 8 + (2 ** -20 if q == plant_seq and p >= 300 else 0)
                w.add(Record(seq=q, pos=p, token=p % 97, next_token=(p + 1) % 97, logprob_bits=f32_bits(lp),
                             topk=[((p + k) % 97, f32_bits(-k - 0.5)) for k in range(5)]))
        w.end_frame()


ba, bb = os.path.join(d, "big_a.trace"), os.path.join(d, "big_b.trace")
big(ba)
big(bb, plant_seq=3)
ht = os.path.join(d, "big.html")
p = subprocess.run([LS, "--quiet", "compare", ba, bb, "--html", ht], capture_output=True, text=True)
assert p.returncode == 1, p.stdout + p.stderr
size = os.path.getsize(ht)
html = open(ht).read()
# 16 x 512 positions x 99 layers: every cell drawn was ~10 MB; runs of equal cells, failing sequences only
assert size < 200_000, "HTML page of %d bytes" % size
assert html.count('aria-label="heat map seq') == 1 and 'id="seq-3"' in html, "seq 3 alone drawn in full"
assert "prompt | completion (pos %d)" % PROMPT in html and "15 passing sequences not drawn" in html, "boundary, summary"

# Two nearly equal engines: every sequence fails, and the hidden digests differ
# at scattered positions of every layer (8 x 512 positions x 99 layers). Rows
# of many runs are drawn compactly (a path per state under one tooltip per
# row): 0.7 MB; a titled rectangle per run made it 10 MB.
N_SPARSE = 8
DIG = [hashlib.sha256(b"layer %d" % i).digest() for i in range(len(LAYERS))]


def sparse(path, differs):
    batch = [{"id": q, "prompt_len": PROMPT, "n_tokens": N_POS} for q in range(N_SPARSE)]
    with TraceWriter(path, mode="replay", model_fingerprint="ab" * 32, layers=LAYERS, digest_kinds=["hidden"],
                     run_params={"batch": batch}) as w:
        w.begin_frame("chunk")
        for q in range(N_SPARSE):
            for p in range(N_POS):
                cells = [l for l in range(1, len(LAYERS)) if differs and hashlib.sha256(b"%d %d %d" % (q, p, l)).digest()[0] < 40]
                w.add(Record(seq=q, pos=p, token=p % 97, next_token=(p + 1) % 97, logprob_bits=f32_bits(-1.0),
                             topk=[((p + k) % 97, f32_bits(-k - 0.5)) for k in range(5)],
                             digests=[(l, "hidden", bytes(32) if l in cells else DIG[l]) for l in range(len(LAYERS))]))
        w.end_frame()


sa, sb = os.path.join(d, "sparse_a.trace"), os.path.join(d, "sparse_b.trace")
sparse(sa, False)
sparse(sb, True)
ht = os.path.join(d, "sparse.html")
p = subprocess.run([LS, "--quiet", "compare", sa, sb, "--html", ht], capture_output=True, text=True)
assert p.returncode == 1, p.stdout + p.stderr
size = os.path.getsize(ht)
html = open(ht).read()
assert size < 1_000_000, "HTML page of %d bytes for %d sequences with scattered differences" % (size, N_SPARSE)
assert html.count('aria-label="heat map seq') == N_SPARSE, "every failing sequence drawn in full"
assert "runs of equal cells (the axis gives the positions per column)" in html, "dense rows drawn compactly"
assert html.count('stroke="#000"') == N_SPARSE, "each heat map outlines its first drift"

# --github: one ::error per failing sequence, a Markdown step summary appended to GITHUB_STEP_SUMMARY
summary = os.path.join(d, "summary.md")
open(summary, "w").write("earlier step output\n")
env = dict(os.environ, GITHUB_STEP_SUMMARY=summary)
p = subprocess.run([LS, "--quiet", "compare", "--github", a, c], capture_output=True, text=True, env=env)
assert p.returncode == 1, p.stdout + p.stderr
lines = p.stdout.splitlines()
assert lines == ["::error title=lockstep compare%3A seq 1 drifts::seq 1 pos 7 layer 1 (gdn, decoder layer 0): "
                 "gdn_state digest differs"], lines
md = open(summary).read()
assert md.startswith("earlier step output\n### lockstep compare: FAIL"), md[:200]
rows = [l for l in md.splitlines() if l.startswith("| ") and l[2].isdigit()]
assert len(rows) == 2 and "**FAIL**" in rows[1] and "gdn_state digest differs" in rows[1], rows
p = subprocess.run([LS, "--quiet", "compare", "--github", a, b], capture_output=True, text=True, env=env)
assert p.returncode == 0 and p.stdout.startswith("::notice title=lockstep compare::PASS: 2/2"), p.stdout
print("reports: JSON validates (with and without --stats), JUnit parses, HTML self-contained and scales, "
      "GitHub annotations and step summary")
