#!/usr/bin/python3
"""`lockstep ablate --json` validates against docs/ablate-json.schema.json;
every operator family drifts on synth tiny, first at or after the trace
layer its change is planted in; the control does not drift; two ablations
of the same inputs (1 and 2 threads) write the same JSON except the
command line and the fields the schema marks run-dependent, and the same
Markdown except the command line; a replay ablation of chosen layers on
the Qwen3.5 layout writes its document alone on stdout (--json -).

usage: test_ablate_json.py LOCKSTEP_BINARY SOURCE_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import jsonschema

LS, SRC = sys.argv[1], sys.argv[2]
schema = json.load(open(os.path.join(SRC, "docs", "ablate-json.schema.json")))
jsonschema.Draft202012Validator.check_schema(schema)
FAMILIES = ["norm", "conv", "gdn", "attention", "router", "experts", "combine", "lm_head"]


def run_dependent(node, path=()):
    """Paths (key tuples; '*' for array items) of the schema's run-dependent fields."""
    out = []
    if "$ref" in node:
        node = schema["$defs"][node["$ref"].split("/")[-1]]
    for key, sub in node.get("properties", {}).items():
        if sub.get("description", "").startswith("Run-dependent"):
            out.append(path + (key,))
        if key in ("control",) or "$ref" in sub or "properties" in sub or "items" in sub:
            out += run_dependent(sub, path + (key,))
    items = node.get("items")
    if items:
        out += run_dependent(items, path + ("*",))
    return out


TIMING = run_dependent(schema)
assert sorted(TIMING) == [("control", "seconds"), ("families", "*", "layers", "*", "seconds"),
                          ("strict_seconds",)], TIMING


def blank(node, path):
    """Sets the field at path (with '*' over arrays) to None where present."""
    if not path:
        return
    key, rest = path[0], path[1:]
    if key == "*":
        for item in node:
            blank(item, rest)
    elif key in node:
        if rest:
            blank(node[key], rest)
        else:
            node[key] = None


def check_doc(doc, n_layers):
    jsonschema.validate(doc, schema)
    assert doc["control_equal"] is True and doc["control"]["outcome"] == "no_drift", doc["control"]
    assert doc["control"]["abs_dlogprob"]["max"] == 0 and doc["control"]["positions_differ"] == 0, doc["control"]
    assert [f["family"] for f in doc["families"]] == FAMILIES, [f["family"] for f in doc["families"]]
    assert doc["fast_tier"] is False
    for f in doc["families"]:
        assert f["verdict"] == "drifts" and f["cells"] == f["cells_drift"] > 0, f
        for c in f["layers"]:
            d = c["first_drift"]
            assert d["trace_layer"] is not None and d["trace_layer"] >= c["planted_trace_layer"], (f["family"], c)
            if f["family"] == "lm_head":
                assert c["layer"] is None and d["family"] == "lm_head", c
            else:
                assert 0 <= c["layer"] < n_layers and d["decoder_layer"] >= c["layer"], (f["family"], c)
            assert c["positions_differ"] > 0 and c["abs_dlogprob"]["max"] > 0, (f["family"], c)


d = tempfile.mkdtemp()
try:
    ck = os.path.join(d, "ck")
    p = subprocess.run([LS, "synth", "--preset", "tiny", "--seed", "1", "--out", ck], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    prompts = os.path.join(d, "prompts.jsonl")
    with open(prompts, "w") as f:
        f.write('{"id": 0, "tokens": [5, 6, 7, 8]}\n{"id": 4, "tokens": [900]}\n{"id": 2, "tokens": [1, 2]}\n')

    docs, mds = [], []
    for i in range(2):
        js, md = os.path.join(d, "a-%d.json" % i), os.path.join(d, "a-%d.md" % i)
        p = subprocess.run([LS, "ablate", "--checkpoint", ck, "--prompts", prompts, "--max-new-tokens", "4",
                            "--threads", str(1 + i), "--json", js, "--markdown", md], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        # progress on stderr (one line per run), the matrix on stdout
        assert "ablate: control (strict again): no drift" in p.stderr, p.stderr
        assert p.stdout.count("\n") >= 3 + 19, p.stdout
        docs.append(json.load(open(js)))
        mds.append(open(md).read())
    for doc in docs:
        check_doc(doc, 4)
        # sample: first, middle, last layer where the family exists (tiny: GDN 0, 2; attention 1, 3)
        layers = {f["family"]: [c["layer"] for c in f["layers"]] for f in doc["families"]}
        assert layers == {"norm": [0, 1, 3], "conv": [0, 2], "gdn": [0, 2], "attention": [1, 3], "router": [0, 1, 3],
                          "experts": [0, 1, 3], "combine": [0, 1, 3], "lm_head": [None]}, layers
    for doc in docs:
        for t in TIMING:
            blank(doc, t)
        doc["command"] = None
    for i in (1,):
        if docs[i] != docs[0]:
            a, b = json.dumps(docs[0], indent=1).splitlines(), json.dumps(docs[i], indent=1).splitlines()
            k = next(k for k in range(min(len(a), len(b)) + 1) if k == min(len(a), len(b)) or a[k] != b[k])
            sys.exit("ablate JSON %d differs from run 0 outside the timing fields and the command, line %d:\n  %r\n  %r"
                     % (i, k + 1, a[k] if k < len(a) else None, b[k] if k < len(b) else None))
    strip = lambda t: "\n".join(l for l in t.splitlines() if not l.startswith("lockstep ablate "))
    assert strip(mds[0]) == strip(mds[1]), "the Markdown reports differ outside the command line"
    assert "| lm_head | head | 10 | drift |" in mds[0], mds[0]

    # replay mode on the Qwen3.5 layout, two layers, the document on stdout
    # ("--json -", nothing else there under --quiet)
    ck35 = os.path.join(d, "ck35")
    p = subprocess.run([LS, "synth", "--preset", "qwen3.5-tiny", "--seed", "1", "--out", ck35],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run([LS, "--quiet", "ablate", "--checkpoint", ck35, "--prompts", prompts, "--max-new-tokens", "3",
                        "--mode", "replay", "--layers", "3,0", "--json", "-"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == "", p.stdout + p.stderr
    doc = json.loads(p.stdout)
    check_doc(doc, 4)
    layers = {f["family"]: [c["layer"] for c in f["layers"]] for f in doc["families"]}
    assert layers == {"norm": [0, 3], "conv": [0], "gdn": [0], "attention": [3], "router": [0, 3],
                      "experts": [0, 3], "combine": [0, 3], "lm_head": [None]}, layers
    assert doc["mode"] == "replay" and doc["layers"] == "3,0", doc
    for f in doc["families"]:
        for c in f["layers"]:  # teacher-forced: every position keeps its context
            assert c["positions"] == doc["strict_positions"], (f["family"], c)
    print("ablate json: 3 ablations validate; every family drifts at or after its planted layer; control equal; "
          "identical except the command and %s" % ", ".join(".".join(t) for t in TIMING))
finally:
    shutil.rmtree(d)
