#!/usr/bin/python3
"""`lockstep gate --json` validates against docs/gate-json.schema.json, and
two gates of the same inputs write the same bytes except the fields the
schema marks run-dependent (descriptions starting 'Run-dependent': the
rollout's and each replay's wall time).

usage: test_gate_json.py LOCKSTEP_BINARY SOURCE_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import jsonschema

LS, SRC = sys.argv[1], sys.argv[2]
schema = json.load(open(os.path.join(SRC, "docs", "gate-json.schema.json")))
jsonschema.Draft202012Validator.check_schema(schema)


def run_dependent(node, path=()):
    """Paths (key tuples; '*' for array items) of the schema's run-dependent fields."""
    out = []
    for key, sub in node.get("properties", {}).items():
        if sub.get("description", "").startswith("Run-dependent"):
            out.append(path + (key,))
        out += run_dependent(sub, path + (key,))
    items = node.get("items")
    if items:
        if "$ref" in items:
            items = schema["$defs"][items["$ref"].split("/")[-1]]
        out += run_dependent(items, path + ("*",))
    return out


TIMING = run_dependent(schema)
assert sorted(TIMING) == [("replays", "*", "seconds"), ("rollout_seconds",)], TIMING

d = tempfile.mkdtemp()
try:
    ck = os.path.join(d, "ck")
    p = subprocess.run([LS, "synth", "--preset", "tiny", "--seed", "3", "--out", ck], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    prompts = os.path.join(d, "prompts.jsonl")
    with open(prompts, "w") as f:
        f.write('{"id": 0, "tokens": [5, 6, 7, 8]}\n{"id": 4, "tokens": [900]}\n{"id": 2, "tokens": [1, 2]}\n')

    texts = []
    for i in range(2):
        js = os.path.join(d, "gate-%d.json" % i)
        p = subprocess.run([LS, "gate", "--checkpoint", ck, "--prompts", prompts, "--max-new-tokens", "5",
                            "--threads", str(1 + i), "--json", js], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        texts.append(open(js).read())
    # The same document on stdout ("--json -").
    p = subprocess.run([LS, "--quiet", "gate", "--checkpoint", ck, "--prompts", prompts, "--max-new-tokens", "5",
                        "--json", "-"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    texts.append(p.stdout)

    docs = [json.loads(t) for t in texts]
    for doc in docs:
        jsonschema.validate(doc, schema)
        assert doc["pass"] is True and len(doc["replays"]) == 5, doc
        assert all(r["equal"] and not r["perturbed"] and "first_drift" not in r for r in doc["replays"]), doc
        assert doc["rollout_positions"] == (4 + 5 - 1) + (1 + 5 - 1) + (2 + 5 - 1), doc["rollout_positions"]

    # Everything but the timing fields is byte-identical: blank the timing
    # values in the text (each is one "key": number on its own line) and
    # compare the bytes.
    keys = sorted({t[-1] for t in TIMING})
    timing_line = re.compile(r'^(\s*"(?:%s)": )[-+0-9.eE]+(,?)$' % "|".join(keys), re.M)
    blanked = [timing_line.subn(r"\1T\2", t) for t in texts]
    for (text, n), doc in zip(blanked, docs):
        assert n == 1 + len(doc["replays"]), (n, text)
    for i in (1, 2):
        if blanked[i][0] != blanked[0][0]:
            a, b = blanked[0][0].splitlines(), blanked[i][0].splitlines()
            first = next(k for k in range(min(len(a), len(b)) + 1) if k == min(len(a), len(b)) or a[k] != b[k])
            sys.exit("gate JSON %d differs from run 0 outside the timing fields, line %d:\n  %r\n  %r"
                     % (i, first + 1, a[first] if first < len(a) else None, b[first] if first < len(b) else None))
    print("gate json: 3 gates validate; identical except %s" % ", ".join(".".join(t) for t in TIMING))
finally:
    shutil.rmtree(d)
