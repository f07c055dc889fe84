#!/usr/bin/python3
"""The JSON report validates against docs/compare-json.schema.json, the JUnit
report parses as XML with one testsuite and a testcase per sequence (failures
carrying the first drift, manifest digests as properties), and the HTML page
is self-contained (no scripts, no network references).

usage: test_reports.py LOCKSTEP_BINARY SOURCE_DIR
"""
import json
import os
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
print("reports: JSON validates (with and without --stats), JUnit parses, HTML self-contained")
