"""PyTorch forward hooks that record a Hugging Face transformers forward as a
lockstep trace (needs the ``[torch]`` extra: torch, transformers, numpy).

For a Qwen3-Next model (and Qwen3.5, whose decoder has the same shape) the
trace layers are lockstep's (docs/trace-format.md section 3): ``embed``; per
decoder layer its mixer (``gdn`` or ``attention``: the residual stream after
the mixer's residual add, the input of ``post_attention_layernorm``) and its
``moe`` block (the decoder layer's output); ``norm`` (the final norm's
output); ``lm_head`` (the logits, fp32). The digests are lockstep's canonical
bytes (section 6):

* ``hidden`` — forward hooks on the modules of the name map;
* ``router`` — a forward hook on each MoE block's router (``mlp.gate``): the
  top-k expert ids in rank order and their weights as applied;
* ``kv`` — the K row (after ``k_norm`` and RoPE) and the V row that the
  attention writes to the cache, taken from the cache's ``update``;
* ``conv_state``, ``gdn_state`` — read from the cache (the conv state: the
  last W-1 conv inputs; the recurrent state: fp32 [H_v, d_k, d_v]; through
  ``get_conv_state``/``get_recurrent_state`` where the cache has them, from
  its per-layer ``conv_states``/``recurrent_states`` otherwise, as caches
  before transformers 5.2x keep them) after a forward call that ends where a state digest is due. The cache holds
  the state after the call's last position only, so ``teacher_forced`` runs
  the sequence in calls that end at those positions (p % N == N - 1, the last
  prompt position, the last position), as lockstep's replay does.

A kind the model cannot give (``router`` of a dense MLP layer, ``kv`` or the
states when the model has no cache with them) is left out of
``digest_kinds``: the format requires a listed kind for every layer of its
family (section 6).

Example (a trainer-side teacher-forced forward, compared with lockstep's
replay of the same tokens)::

    import torch, transformers
    from lockstep_trace import model_fingerprint
    from lockstep_trace.hf import HFRecorder, write_replay
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with HFRecorder(model, dump_decoder_layers=[0, 1]) as rec:
        write_replay("hf.trace", rec, [{"id": 1, "tokens": ids, "prompt_len": 3}],
                     model_fingerprint=model_fingerprint(ckpt))
    # lockstep run --checkpoint CKPT --mode replay --tokens TOKENS.jsonl --activations fp32 \
    #     --dump-layers 0,1 -o ls.trace && lockstep compare --stats ls.trace hf.trace
"""
import argparse
import hashlib
import inspect
import json
import sys
from typing import Dict, List, Optional, Sequence

import torch

from .digest import dump_dtype
from .format import KINDS, NAN_BITS, STATE_KINDS, TraceError
from .record import Record
from .writer import TraceWriter

# Where each trace layer's row is taken, as "module path[:input|:output]"
# (default :output). Paths of "embed", "norm", "lm_head" and "layers" are
# from the model's root; the others are relative to one decoder layer.
DEFAULT_NAME_MAP = {
    "embed": None,                 # model.get_input_embeddings()
    "layers": None,                # the ModuleList of decoder layers (found by shape)
    "norm": None,                  # the final norm: the module "norm" beside "layers"
    "lm_head": None,               # model.get_output_embeddings()
    "gdn": "linear_attn",          # a decoder layer holding this module is a gdn layer
    "attention": "self_attn",      # ... this one an attention layer
    "mixer_residual": "post_attention_layernorm:input",
    "moe_residual": ":output",     # the decoder layer itself
    "router": "mlp.gate:output",
}


def _get(root, path):
    m = root
    for part in path.split(".") if path else []:
        m = m[int(part)] if part.isdigit() else getattr(m, part, None)
        if m is None:
            return None
    return m


def _split(spec):
    path, _, where = spec.partition(":")
    return path, where or "output"


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _cache_state(cache, layer: int, which: str):
    """The cache's ``which`` ("conv" or "recurrent") state of decoder layer
    ``layer``, batch first; None when the cache keeps no such state. Newer
    transformers caches have get_conv_state/get_recurrent_state; older ones
    keep the states per layer (layers[i].conv_states[0]) or in one list per
    kind (conv_states[i])."""
    get = getattr(cache, "get_%s_state" % which, None)
    if get is not None:
        return get(layer)
    name = "%s_states" % which
    layers = getattr(cache, "layers", None)
    if layers is not None and layer < len(layers):
        st = getattr(layers[layer], name, None)
        if isinstance(st, dict):
            return st.get(0)
    st = getattr(cache, name, None)
    if isinstance(st, (list, tuple)) and layer < len(st):
        return st[layer]
    return None


def _cache_has_states(cache, gdn_layers: Sequence[int]) -> bool:
    """Whether the cache keeps GDN states (before any forward filled them)."""
    if hasattr(cache, "get_conv_state") and hasattr(cache, "get_recurrent_state"):
        return True
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return all(i < len(layers) and isinstance(getattr(layers[i], "conv_states", None), dict) and
                   isinstance(getattr(layers[i], "recurrent_states", None), dict) for i in gdn_layers)
    return isinstance(getattr(cache, "conv_states", None), (list, tuple)) and \
        isinstance(getattr(cache, "recurrent_states", None), (list, tuple))


def _rows_bytes(t: torch.Tensor, dtype: torch.dtype) -> List[bytes]:
    """Row i of a [t, ...] tensor as little-endian canonical bytes of dtype."""
    t = t.detach().to(dtype).cpu().contiguous().reshape(t.shape[0], -1)
    u8 = t.view(torch.uint8).numpy()
    if sys.byteorder != "little":
        raise TraceError("canonical bytes are little-endian; this host is not")
    return [u8[i].tobytes() for i in range(u8.shape[0])]


class HFRecorder:
    """Hooks a transformers causal LM and turns its forward calls into trace
    records. Use as a context manager (the hooks are removed on exit).

    ``digest_kinds``: the kinds to record (default: every kind the model
    gives); ``dump_decoder_layers``: decoder layers whose canonical bytes are
    stored in full (every kind of their trace layers, as ``lockstep run
    --dump-layers``); ``state_digest_every``: the carried-state cadence N;
    ``activation_dtype``: "fp32" or "bf16" (default: the model's dtype);
    ``name_map``: overrides of DEFAULT_NAME_MAP, to hook other modules.
    """

    def __init__(self, model, *, digest_kinds: Optional[Sequence[str]] = None,
                 dump_decoder_layers: Sequence[int] = (), state_digest_every: int = 64, topk: int = 5,
                 activation_dtype: Optional[str] = None, name_map: Optional[Dict[str, str]] = None):
        self.model = model
        self.names = dict(DEFAULT_NAME_MAP, **(name_map or {}))
        self.topk = topk
        self.state_digest_every = state_digest_every
        self.dump_layers = set(dump_decoder_layers)
        param = next(model.parameters())
        if activation_dtype is None:
            activation_dtype = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(param.dtype)
            if activation_dtype is None:
                raise TraceError("model dtype %s: pass activation_dtype (fp32 or bf16)" % param.dtype)
        if activation_dtype not in ("fp32", "bf16"):
            raise TraceError("activation_dtype must be fp32 or bf16")
        self.activation_dtype = activation_dtype
        self.act = torch.float32 if activation_dtype == "fp32" else torch.bfloat16
        self._find_modules()
        available = self._available_kinds()
        if digest_kinds is None:
            digest_kinds = available
        for k in digest_kinds:
            if k not in KINDS:
                raise TraceError("unknown digest kind %r" % (k,))
            if k not in available:
                raise TraceError("this model cannot give the %s digest of every layer that carries it; leave it "
                                 "out of digest_kinds" % k)
        self.digest_kinds = [k for k in KINDS if k in digest_kinds]
        self._handles = []
        self._cap = None
        self._install()

    # ---- the model's structure ------------------------------------------------
    def _module(self, key, default):
        spec = self.names.get(key)
        if spec is None:
            return default, "output"
        path, where = _split(spec)
        m = _get(self.model, path)
        if m is None:
            raise TraceError("name map: %s = %r names no module of the model" % (key, spec))
        return m, where

    def _find_modules(self):
        if self.names.get("layers"):
            layers = _get(self.model, self.names["layers"])
            parent = _get(self.model, self.names["layers"].rpartition(".")[0])
        else:
            layers = parent = None
            for name, m in self.model.named_modules():
                if isinstance(m, torch.nn.ModuleList) and len(m) and all(
                        _get(x, self.names["gdn"]) is not None or _get(x, self.names["attention"]) is not None
                        for x in m):
                    layers = m
                    parent = _get(self.model, name.rpartition(".")[0])
                    break
        if layers is None:
            raise TraceError("no decoder layers found: name the ModuleList with name_map['layers']")
        self.decoder_layers = list(layers)
        self.embed, self.embed_where = self._module("embed", self.model.get_input_embeddings())
        self.norm, self.norm_where = self._module("norm", getattr(parent, "norm", None))
        self.lm_head, self.lm_head_where = self._module("lm_head", self.model.get_output_embeddings())
        if self.norm is None or self.lm_head is None or self.embed is None:
            raise TraceError("embed, final norm or lm_head not found: name them in name_map")
        self.layers = [("embed", -1)]
        self.mixer_family = []
        for i, dl in enumerate(self.decoder_layers):
            fam = "gdn" if _get(dl, self.names["gdn"]) is not None else "attention"
            self.mixer_family.append(fam)
            self.layers += [(fam, i), ("moe", i)]
        self.layers += [("norm", -1), ("lm_head", -1)]
        cfg = self.model.config
        self.text_config = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg

    def _router_module(self, dl):
        path, where = _split(self.names["router"])
        return _get(dl, path), where

    def _available_kinds(self):
        kinds = ["hidden"]
        if all(self._router_module(dl)[0] is not None for dl in self.decoder_layers):
            kinds.append("router")
        cache = self.new_cache()
        if cache is not None:
            if "attention" in self.mixer_family:
                kinds.append("kv")
            gdn = [i for i, f in enumerate(self.mixer_family) if f == "gdn"]
            if gdn and _cache_has_states(cache, gdn):
                kinds += ["gdn_state", "conv_state"]
        return kinds

    def new_cache(self):
        """A fresh cache the model's forward accepts (DynamicCache(config)), or None."""
        try:
            from transformers import DynamicCache
            return DynamicCache(config=self.model.config)
        except Exception:  # an older transformers: the model module's own cache class
            mod = sys.modules.get(type(self.model).__module__)
            for name in dir(mod):
                if name.endswith("DynamicCache"):
                    try:
                        return getattr(mod, name)(self.model.config)
                    except Exception:
                        pass
        return None

    # ---- hooks -----------------------------------------------------------------
    def _hook(self, module, where, key):
        def pre(mod, args, kwargs):
            if self._cap is not None:
                x = args[0] if args else next(iter(kwargs.values()))
                self._cap[key] = x.detach()

        def post(mod, args, out):
            if self._cap is not None:
                self._cap[key] = out if key[0] == "router" else _first(out).detach()

        if where == "input":
            h = module.register_forward_pre_hook(pre, with_kwargs=True)
        else:
            h = module.register_forward_hook(post)
        self._handles.append(h)

    def _install(self):
        self._hook(self.embed, self.embed_where, ("hidden", 0))
        for i, dl in enumerate(self.decoder_layers):
            path, where = _split(self.names["mixer_residual"])
            self._hook(_get(dl, path), where, ("hidden", 1 + 2 * i))
            path, where = _split(self.names["moe_residual"])
            self._hook(_get(dl, path), where, ("hidden", 2 + 2 * i))
            if "router" in self.digest_kinds:
                m, where = self._router_module(dl)
                self._hook(m, where, ("router", i))
        self._hook(self.norm, self.norm_where, ("hidden", len(self.layers) - 2))
        self._hook(self.lm_head, self.lm_head_where, ("hidden", len(self.layers) - 1))

    def close(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- capture -----------------------------------------------------------------
    def _router(self, out, t):
        """(ids [t, k] int32, weights [t, k] fp32) from the router's output."""
        if isinstance(out, (tuple, list)) and len(out) >= 3:   # (logits, weights as applied, ids)
            return out[2].detach().reshape(t, -1).to(torch.int32), out[1].detach().reshape(t, -1).float()
        # A router that returns logits only (transformers 4.x): the block's routing
        logits = _first(out).detach().reshape(t, -1)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        k = self.text_config.num_experts_per_tok
        w, ids = torch.topk(probs, k, dim=-1)
        if getattr(self.text_config, "norm_topk_prob", False):
            w = w / w.sum(dim=-1, keepdim=True)
        return ids.to(torch.int32), w.to(logits.dtype).float()

    def _wrap_cache(self, cache, kv):
        update = cache.update

        def recording_update(key_states, value_states, layer_idx, *args, **kwargs):
            if self._cap is not None:
                kv[layer_idx] = (key_states.detach(), value_states.detach())
            return update(key_states, value_states, layer_idx, *args, **kwargs)
        cache.update = recording_update

    def _forward(self, ids, p0, cache):
        kw = {"input_ids": ids, "position_ids": torch.arange(p0, p0 + ids.shape[1], device=ids.device)[None],
              "use_cache": cache is not None}
        if cache is not None:
            params = inspect.signature(self.model.forward).parameters
            kw["cache" if "cache" in params else "past_key_values"] = cache
        return self.model(**kw)

    @torch.no_grad()
    def teacher_forced(self, tokens: Sequence[int], *, seq: int, prompt_len: Optional[int] = None,
                       include_last: bool = False, max_chunk: int = 0) -> List[List[Record]]:
        """Runs the model teacher-forced over `tokens` and returns the records,
        one list per forward call (one trace frame each). Records cover the
        positions that predict a next token (0 .. len-2, as lockstep's
        replay), and the last one too with `include_last`. Calls end where a
        carried-state digest is due (when a state kind is recorded) and hold
        at most `max_chunk` positions (0: no limit)."""
        tokens = [int(t) for t in tokens]
        n = len(tokens) if include_last else len(tokens) - 1
        if n < 1:
            raise TraceError("seq %d: %d tokens: nothing to record" % (seq, len(tokens)))
        N = self.state_digest_every
        states = any(k in STATE_KINDS for k in self.digest_kinds)

        def due(p):
            return p % N == N - 1 or (prompt_len is not None and p == prompt_len - 1) or p == n - 1

        ends = sorted({p for p in range(n) if due(p)}) if states else [n - 1]
        if max_chunk:
            cut, last = [], -1
            for e in ends:
                while e - last > max_chunk:
                    last += max_chunk
                    cut.append(last)
                cut.append(e)
                last = e
            ends = cut
        device = self.embed.weight.device if hasattr(self.embed, "weight") else "cpu"
        ids_all = torch.tensor([tokens[:n]], dtype=torch.long, device=device)
        need_cache = states or "kv" in self.digest_kinds or len(ends) > 1
        cache = self.new_cache() if need_cache else None
        kv = {}
        if cache is not None and "kv" in self.digest_kinds:
            self._wrap_cache(cache, kv)
        frames, a = [], 0
        for e in ends:
            self._cap = {}
            kv.clear()
            try:
                self._forward(ids_all[:, a:e + 1], a, cache)
                cap = self._cap
            finally:
                self._cap = None
            frames.append(self._records(seq, tokens, a, e + 1, cap, kv, cache if due(e) and states else None))
            a = e + 1
        return frames

    def _records(self, seq, tokens, a, b, cap, kv, cache) -> List[Record]:
        t = b - a
        L = len(self.layers)
        # canonical bytes per (layer, kind): a list of t rows (None: not at this position)
        rows = {}
        for li, (fam, dl) in enumerate(self.layers):
            x = cap.get(("hidden", li))
            if x is None:
                raise TraceError("no output captured for trace layer %d (%s %d): check the name map" % (li, fam, dl))
            x = x.reshape(t, -1)
            rows[(li, "hidden")] = _rows_bytes(x, torch.float32 if fam == "lm_head" else self.act)
        logits = cap[("hidden", L - 1)].reshape(t, -1).float().cpu()
        for i, dl in enumerate(self.decoder_layers):
            mix, moe = 1 + 2 * i, 2 + 2 * i
            if "router" in self.digest_kinds:
                ids, w = self._router(cap[("router", i)], t)
                ib, wb = _rows_bytes(ids, torch.int32), _rows_bytes(w, torch.float32)
                rows[(moe, "router")] = [x + y for x, y in zip(ib, wb)]
            if self.mixer_family[i] == "attention" and "kv" in self.digest_kinds:
                k, v = kv[i]                                        # [1, Hkv, t, d]
                kb = _rows_bytes(k[0].transpose(0, 1), self.act)    # [t, Hkv * d]
                vb = _rows_bytes(v[0].transpose(0, 1), self.act)
                rows[(mix, "kv")] = [x + y for x, y in zip(kb, vb)]
            if self.mixer_family[i] == "gdn" and cache is not None:
                if "conv_state" in self.digest_kinds:
                    cs = _cache_state(cache, i, "conv")[0]          # [conv_dim, W]: the last W inputs
                    rows[(mix, "conv_state")] = [None] * (t - 1) + _rows_bytes(cs[:, 1:].reshape(1, -1), self.act)
                if "gdn_state" in self.digest_kinds:
                    gs = _cache_state(cache, i, "recurrent")[0]     # [H_v, d_k, d_v] fp32
                    rows[(mix, "gdn_state")] = [None] * (t - 1) + _rows_bytes(gs.reshape(1, -1), torch.float32)
        lp = torch.log_softmax(logits, dim=-1)
        order = torch.sort(lp, dim=-1, descending=True, stable=True).indices[:, :self.topk]   # ties: lower id first
        lp_bits = lp.contiguous().view(torch.int32).numpy()
        order = order.numpy()
        out = []
        for j in range(t):
            p = a + j
            nxt = tokens[p + 1] if p + 1 < len(tokens) else -1
            r = Record(seq=seq, pos=p, token=tokens[p], next_token=nxt,
                       logprob_bits=int(lp_bits[j, nxt]) & 0xFFFFFFFF if nxt >= 0 else NAN_BITS,
                       topk=[(int(i), int(lp_bits[j, i]) & 0xFFFFFFFF) for i in order[j]])
            for (li, kind), rs in sorted(rows.items(), key=lambda kv_: (kv_[0][0], KINDS.index(kv_[0][1]))):
                if kind not in self.digest_kinds or rs[j] is None:
                    continue
                r.digests.append((li, kind, hashlib.sha256(rs[j]).digest()))
                fam, dl = self.layers[li]
                if dl >= 0 and dl in self.dump_layers:
                    r.dumps.append((li, kind, dump_dtype(kind, self.activation_dtype, fam), rs[j]))
            out.append(r)
        return out


def write_replay(path: str, recorder: HFRecorder, sequences, *, model_fingerprint: str, engine: str = "",
                 run_params: Optional[dict] = None, max_chunk: int = 0) -> int:
    """Writes a replay-mode trace of `sequences` (dicts with "id", "tokens"
    and optionally "prompt_len", as lockstep's --tokens file) teacher-forced
    through the recorder's model: one chunk frame per forward call. Returns
    the number of records."""
    import transformers
    params = {
        "mode": "replay", "activations": recorder.activation_dtype,
        "state_digest_every": recorder.state_digest_every,
        "batch": [{"id": s["id"], "prompt_len": s["prompt_len"], "n_tokens": len(s["tokens"])}
                  for s in sequences if s.get("prompt_len")],
        "producer": {"package": "lockstep_trace", "torch": torch.__version__,
                     "transformers": transformers.__version__, "model_class": type(recorder.model).__name__},
    }
    params.update(run_params or {})
    n = 0
    with TraceWriter(path, mode="replay", engine=engine or "transformers-%s" % transformers.__version__,
                     model_fingerprint=model_fingerprint, layers=recorder.layers, run_params=params,
                     topk=recorder.topk, digest_kinds=recorder.digest_kinds,
                     state_digest_every=recorder.state_digest_every,
                     activation_dtype=recorder.activation_dtype) as w:
        for s in sequences:
            for frame in recorder.teacher_forced(s["tokens"], seq=s["id"], prompt_len=s.get("prompt_len"),
                                                 max_chunk=max_chunk):
                w.begin_frame("chunk")
                for r in frame:
                    w.add(r)
                w.end_frame()
                n += len(frame)
    return n


def main(argv=None):
    """python -m lockstep_trace hf-replay: a teacher-forced trace of a checkpoint."""
    ap = argparse.ArgumentParser(prog="python -m lockstep_trace hf-replay",
                                 description="Teacher-forced forward of a Hugging Face checkpoint, recorded as a "
                                             "lockstep replay trace (the --tokens file of `lockstep run`).")
    ap.add_argument("--model", required=True, help="checkpoint directory (from_pretrained)")
    ap.add_argument("--tokens", required=True, help='JSONL: {"id", "tokens", "prompt_len"} per line')
    ap.add_argument("-o", "--out", required=True, help="the trace to write")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="activation dtype (default fp32)")
    ap.add_argument("--dump-layers", default="", help="decoder layers to dump in full, e.g. 0,1")
    ap.add_argument("--state-digest-every", type=int, default=64)
    ap.add_argument("--kinds", default="", help="digest kinds (default: every kind the model gives)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    a = ap.parse_args(argv)
    import transformers
    from .fingerprint import model_fingerprint
    torch.set_num_threads(a.threads)
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).eval()
    with open(a.tokens) as f:
        seqs = [json.loads(line) for line in f if line.strip()]
    dump = [int(x) for x in a.dump_layers.split(",") if x.strip()]
    kinds = [k for k in a.kinds.split(",") if k] or None
    with HFRecorder(model, digest_kinds=kinds, dump_decoder_layers=dump,
                    state_digest_every=a.state_digest_every) as rec:
        n = write_replay(a.out, rec, seqs, model_fingerprint=model_fingerprint(a.model))
        print("%s: %d records, %d sequences, kinds %s, layers %d, activations %s"
              % (a.out, n, len(seqs), ",".join(rec.digest_kinds), len(rec.layers), rec.activation_dtype))
    return 0
