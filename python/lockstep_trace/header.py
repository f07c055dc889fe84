"""The header JSON (docs/trace-format.md section 3): parsing with the rules
lockstep's reader enforces, and serialising.

``run_params`` is opaque to the format: its syntax is checked (RFC 8259) and
its text kept byte for byte, so a u64 seed, a number beyond double range,
``\\u0000`` or a repeated key inside it never make a trace unreadable. The
rest of the header is parsed strictly, as lockstep's jansson-based reader
does: no repeated key, no NaN/Infinity, integers within int64, reals within
double range, no ``\\u0000`` and no lone surrogate in a string.
"""
import json
import math
import re
from dataclasses import dataclass, field
from json.decoder import scanstring
from typing import List, Optional, Tuple

from .format import (ACTIVATION_DTYPES, DECODER_LAYER_MAX, FAMILIES, KINDS, LAYERS_MAX, MODES,
                     TOPK_MAX, TraceError)

_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_WS = " \t\n\r"
_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass
class Layer:
    index: int
    family: str            # one of FAMILIES
    decoder_layer: int     # -1 for embed, norm, lm_head


@dataclass
class Header:
    """A trace's header. ``run_params_text`` is the opaque JSON object as the
    file holds it; ``run_params`` parses it leniently (numbers a strict
    parser refuses stay strings of their text, a repeated key keeps its last
    value)."""
    mode: str
    engine: str
    model_fingerprint: str
    manifest_digest: str
    run_params_text: str
    topk: int
    digest_kinds: List[str]                 # in KINDS order (the file's order is not kept)
    state_digest_every: int
    activation_dtype: str
    layers: List[Layer]
    version_major: int = 1
    version_minor: int = 0
    extra: dict = field(default_factory=dict)   # header keys this version does not know

    @property
    def run_params(self) -> dict:
        return parse_run_params(self.run_params_text)

    def family(self, layer: int) -> str:
        return self.layers[layer].family


def is_hex64(s) -> bool:
    return isinstance(s, str) and _HEX64.match(s) is not None


def _bad_constant(name):
    raise ValueError("%s is not JSON" % name)


def _strict_float(text):
    v = float(text)
    if math.isinf(v):
        raise ValueError("real number overflow")
    return v


def _strict_int(text):
    v = int(text)
    if not _INT64[0] <= v <= _INT64[1]:
        raise ValueError("integer beyond int64")
    return v


def _no_repeats(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError("duplicate object key %r" % k)
        out[k] = v
    return out


_STRICT = json.JSONDecoder(object_pairs_hook=_no_repeats, parse_constant=_bad_constant,
                           parse_float=_strict_float, parse_int=_strict_int)
# Syntax only: every number is kept as its text, repeated keys are allowed.
_SYNTAX = json.JSONDecoder(object_pairs_hook=list, parse_constant=_bad_constant,
                           parse_float=str, parse_int=str)


def _strict_strings(v):
    """jansson refuses "\\u0000" and lone surrogates; so does this reader."""
    if isinstance(v, str):
        if "\0" in v or any(0xD800 <= ord(c) <= 0xDFFF for c in v):
            raise ValueError("invalid string (NUL or a lone surrogate)")
    elif isinstance(v, dict):
        for k, x in v.items():
            _strict_strings(k)
            _strict_strings(x)
    elif isinstance(v, list):
        for x in v:
            _strict_strings(x)


def _skip(s, i):
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def split_header_json(raw: bytes) -> Tuple[dict, Optional[str]]:
    """Parses the header JSON bytes: returns the members other than
    run_params (parsed strictly) and run_params' text (None when absent).
    Raises ValueError naming the JSON byte."""
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError("invalid UTF-8 at JSON byte %d" % e.start)
    members, params = {}, None
    try:
        i = _skip(s, 0)
        if i >= len(s) or s[i] != "{":
            raise ValueError("not an object at JSON byte %d" % i)
        i = _skip(s, i + 1)
        if i < len(s) and s[i] == "}":
            i += 1
        else:
            while True:
                if i >= len(s) or s[i] != '"':
                    raise ValueError("expected a key at JSON byte %d" % i)
                key, i = scanstring(s, i + 1, True)
                _strict_strings(key)
                i = _skip(s, i)
                if i >= len(s) or s[i] != ":":
                    raise ValueError("expected ':' at JSON byte %d" % i)
                i = _skip(s, i + 1)
                if key in members or (key == "run_params" and params is not None):
                    raise ValueError("duplicate object key %r" % key)
                if key == "run_params":
                    value, end = _SYNTAX.raw_decode(s, i)
                    if not isinstance(value, list) or s[i] != "{":
                        raise ValueError('header field "run_params" is not an object')
                    params = s[i:end]
                else:
                    value, end = _STRICT.raw_decode(s, i)
                    _strict_strings(value)
                    members[key] = value
                i = _skip(s, end)
                if i < len(s) and s[i] == ",":
                    i = _skip(s, i + 1)
                    continue
                if i < len(s) and s[i] == "}":
                    i += 1
                    break
                raise ValueError("expected ',' or '}' at JSON byte %d" % i)
        if _skip(s, i) != len(s):
            raise ValueError("end of file expected at JSON byte %d" % i)
    except json.JSONDecodeError as e:
        raise ValueError("%s at JSON byte %d" % (e.msg, e.pos))
    except RecursionError:
        raise ValueError("too deeply nested")
    return members, params


def parse_run_params(text: str) -> dict:
    """run_params read leniently: an integer or real stays a number when it
    fits (int64, double), else a string of its text, as lockstep's
    ``ls_trace_run_params_parse`` does; a repeated key keeps its last value."""
    def num_int(t):
        v = int(t)
        return v if _INT64[0] <= v <= _INT64[1] else t

    def num_real(t):
        v = float(t)
        return t if math.isinf(v) else v

    dec = json.JSONDecoder(parse_int=num_int, parse_float=num_real, parse_constant=_bad_constant)
    return dec.decode(text)


def parse_header(raw: bytes, where: str) -> Header:
    """Validates the header JSON as lockstep's reader does and as section 3
    requires; errors are TraceError at offset 16, prefixed with `where`."""
    def bad(msg):
        return TraceError("%s: %s" % (where, msg), 16)

    try:
        m, params = split_header_json(raw)
    except ValueError as e:
        raise bad("header JSON: %s" % e)
    if m.get("format") != "lockstep-trace":
        raise bad('header field "format" is not "lockstep-trace"')
    for key in ("mode", "engine", "model_fingerprint", "manifest_digest", "activation_dtype"):
        if not isinstance(m.get(key), str):
            raise bad('header field "%s" missing or not a string' % key)
    if m["mode"] not in MODES:
        raise bad('mode "%s" is not rollout, replay or import' % m["mode"])
    if not is_hex64(m["model_fingerprint"]) or (m["manifest_digest"] and not is_hex64(m["manifest_digest"])):
        raise bad("model_fingerprint/manifest_digest must be 64 lower-case hex characters")
    if m["activation_dtype"] not in ACTIVATION_DTYPES:
        raise bad('activation_dtype "%s" is not bf16 or fp32' % m["activation_dtype"])
    if params is None:
        raise bad('header field "run_params" missing or not an object')

    def integer(v):
        return isinstance(v, int) and not isinstance(v, bool)

    topk, every = m.get("topk"), m.get("state_digest_every")
    if not integer(topk) or not 1 <= topk <= TOPK_MAX:
        raise bad('header field "topk" missing or outside 1..%d' % TOPK_MAX)
    if not integer(every) or not 1 <= every <= 0xFFFFFFFF:
        raise bad('header field "state_digest_every" missing or < 1')
    kinds, layers = m.get("digest_kinds"), m.get("layers")
    if not isinstance(kinds, list) or not isinstance(layers, list) or len(layers) > LAYERS_MAX:
        raise bad('header fields "digest_kinds"/"layers" missing or not arrays')
    for i, k in enumerate(kinds):
        if k not in KINDS:
            raise bad("digest_kinds[%d] is not a known digest kind" % i)
        if k in kinds[:i]:
            raise bad('digest_kinds[%d]: "%s" repeats (section 3: none repeated)' % (i, k))
    table = []
    for i, l in enumerate(layers):
        ok = isinstance(l, dict) and integer(l.get("index")) and l["index"] == i and \
            l.get("family") in FAMILIES and integer(l.get("decoder_layer")) and \
            -1 <= l["decoder_layer"] <= DECODER_LAYER_MAX
        if not ok:
            raise bad("layers[%d] needs index %d, a known family and decoder_layer >= -1" % (i, i))
        table.append(Layer(i, l["family"], l["decoder_layer"]))
    known = {"format", "mode", "engine", "model_fingerprint", "manifest_digest", "run_params", "topk",
             "digest_kinds", "state_digest_every", "activation_dtype", "layers"}
    return Header(mode=m["mode"], engine=m["engine"], model_fingerprint=m["model_fingerprint"],
                  manifest_digest=m["manifest_digest"], run_params_text=params, topk=topk,
                  digest_kinds=[k for k in KINDS if k in kinds], state_digest_every=every,
                  activation_dtype=m["activation_dtype"], layers=table,
                  extra={k: v for k, v in m.items() if k not in known})


def check_run_params_text(text: str) -> None:
    """Raises ValueError unless text is one JSON object (syntax only)."""
    s = text
    i = _skip(s, 0)
    try:
        value, end = _SYNTAX.raw_decode(s, i)
    except json.JSONDecodeError as e:
        raise ValueError("run_params: %s at byte %d" % (e.msg, e.pos))
    except RecursionError:
        raise ValueError("run_params: too deeply nested")
    if i >= len(s) or s[i] != "{" or _skip(s, end) != len(s):
        raise ValueError("run_params must be one JSON object")


def header_json(h: Header) -> bytes:
    """The header JSON bytes of h, run_params written as the text it holds."""
    body = {
        "format": "lockstep-trace", "mode": h.mode, "engine": h.engine,
        "model_fingerprint": h.model_fingerprint, "manifest_digest": h.manifest_digest,
        "run_params": {}, "topk": h.topk, "digest_kinds": list(h.digest_kinds),
        "state_digest_every": h.state_digest_every, "activation_dtype": h.activation_dtype,
        "layers": [{"index": l.index, "family": l.family, "decoder_layer": l.decoder_layer} for l in h.layers],
    }
    text = json.dumps(body, separators=(",", ":"))
    # The first '"run_params":{}' is the member: inside an encoded string every
    # '"' follows a backslash, so the pattern cannot occur there.
    slot = '"run_params":{}'
    at = text.index(slot) + len(slot) - 2
    return (text[:at] + h.run_params_text + text[at + 2:]).encode("utf-8")
