#!/usr/bin/python3
"""Builds the inputs of the bad-input corpus (tests/badinput/cases.tsv).

    make_inputs.py LOCKSTEP OUT_DIR

Every input is derived at test time from a few good ones, so the repository
holds only this script and the tiny config it starts from:

  base/ck        a synthetic 2-layer checkpoint (micro_config.json, one GDN
                 and one attention layer, 4 experts, vocabulary 64; 63 kB),
                 written by `lockstep synth`
  base/shard     the same checkpoint in two shards with an index
  base/p.jsonl   prompts; base/t.jsonl tokens for a replay
  base/r.trace   a rollout trace of base/ck; base/c.trace a replay trace
  base/m.json    a manifest pinned from base/ck
  base/qwen35moe_tiny_{a,c}  copies of the Qwen3.5 goldens (goldens/)

and each variant below breaks exactly one thing of one of them. The names are
the ones cases.tsv uses ({IN}/ck/NAME, {IN}/cfg/NAME, ...). Rewrites keep
every checksum valid unless the variant is about the checksum, so that the
rule under test is the one that fires.
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

import zstandard

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(SRC, "tests", "data", "import")
CACHE_DIR = [None]   # the fingerprint cache of the runs below: inside OUT_DIR, never $HOME


# ---- small helpers -----------------------------------------------------------

def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def jdump(obj):
    return json.dumps(obj, indent=2) + "\n"


def run_cli(lockstep, *args):
    env = dict(os.environ, LOCKSTEP_CACHE_DIR=CACHE_DIR[0])
    r = subprocess.run([lockstep, "--quiet", *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit("make_inputs: lockstep %s failed (exit %d): %s" % (" ".join(args), r.returncode, r.stderr))
    return r.stdout


# ---- safetensors -------------------------------------------------------------

def st_parse(blob):
    """(header dict in file order, data bytes) of a safetensors image."""
    n = struct.unpack_from("<Q", blob, 0)[0]
    header = json.loads(blob[8:8 + n].decode())
    return header, blob[8 + n:]


def st_image(header, data, raw=None):
    """A safetensors image of header (dict, or raw JSON text) and data."""
    text = (raw if raw is not None else json.dumps(header, separators=(",", ":"))).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I32": 4, "I64": 8, "U8": 1, "I8": 1, "BOOL": 1}


def prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def st_tensors(header, data):
    """[name, dtype, shape, bytes] of every tensor, in data order."""
    ts = [[k, v["dtype"], list(v["shape"]), data[v["data_offsets"][0]:v["data_offsets"][1]]]
          for k, v in header.items() if k != "__metadata__"]
    ts.sort(key=lambda t: header[t[0]]["data_offsets"][0])
    return ts


def st_pack(metadata, tensors):
    """A safetensors image holding tensors back to back, in list order."""
    header = {"__metadata__": metadata} if metadata is not None else {}
    data = b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    return st_image(header, data)


BF16_NAN = b"\xc0\x7f"
BF16_INF = b"\x80\x7f"


# ---- checkpoint variants -------------------------------------------------------

class Checkpoints:
    def __init__(self, base, out):
        self.base = base
        self.out = out
        self.cfg = json.loads(read(os.path.join(base, "config.json")))
        self.header, self.data = st_parse(read(os.path.join(base, "model.safetensors")))

    def weights(self, name, blob):
        """ck/NAME: the base config with model.safetensors = blob."""
        d = os.path.join(self.out, name)
        write(os.path.join(d, "config.json"), jdump(self.cfg))
        write(os.path.join(d, "model.safetensors"), blob)

    def tensors(self, name, header, data):
        self.weights(name, st_image(header, data))

    def config(self, name, cfg=None, text=None):
        """ck/NAME: config.json replaced (a dict or raw text), the base weights
        hard-linked (a regular file; no copy)."""
        d = os.path.join(self.out, name)
        write(os.path.join(d, "config.json"), text if text is not None else jdump(cfg))
        os.link(os.path.join(self.base, "model.safetensors"), os.path.join(d, "model.safetensors"))

    def copy_header(self):
        return json.loads(json.dumps(self.header))


def make_checkpoints(ck):
    H, D = ck.header, ck.data
    first = "lm_head.weight"      # the first tensor in data order (offset 0)

    # -- file-level corruption of model.safetensors
    blob = st_image(H, D)
    n = struct.unpack_from("<Q", blob, 0)[0]
    ck.weights("st_empty", b"")
    ck.weights("st_short_len", blob[:5])
    ck.weights("st_len_only", blob[:8])
    ck.weights("st_len_beyond_file", struct.pack("<Q", len(blob)) + blob[8:])
    ck.weights("st_len_huge", struct.pack("<Q", 1 << 62) + blob[8:])
    ck.weights("st_len_zero", struct.pack("<Q", 0) + blob[8:])
    ck.weights("st_cut_in_header", blob[:8 + n // 2])
    ck.weights("st_cut_in_data", blob[:8 + n + len(D) // 2])
    ck.weights("st_trailing_bytes", blob + b"\0" * 64)
    ck.weights("st_not_json", struct.pack("<Q", 16) + b"{not json}      " + D)
    ck.weights("st_header_array", st_image(None, D, raw="[1, 2, 3]"))
    ck.weights("st_header_nul", blob[:8 + n // 3] + b"\0" + blob[8 + n // 3 + 1:])
    ck.weights("st_header_bad_utf8", blob[:8 + 20] + b"\xff\xfe" + blob[8 + 22:])

    # -- one tensor's entry broken (header JSON)
    def entry(name, fn):
        h = ck.copy_header()
        fn(h)
        ck.tensors(name, h, D)

    entry("st_dtype_unknown", lambda h: h[first].update(dtype="Q7"))
    entry("st_dtype_number", lambda h: h[first].update(dtype=16))
    entry("st_dtype_missing", lambda h: h[first].pop("dtype"))
    entry("st_shape_missing", lambda h: h[first].pop("shape"))
    entry("st_shape_negative", lambda h: h[first].update(shape=[-64, -32]))
    entry("st_shape_float", lambda h: h[first].update(shape=[64.0, 32]))
    entry("st_shape_string", lambda h: h[first].update(shape="64x32"))
    entry("st_shape_overflow", lambda h: h[first].update(shape=[1 << 40, 1 << 40, 1 << 40]))
    entry("st_shape_mismatch_bytes", lambda h: h[first].update(shape=[64, 31]))
    entry("st_offsets_missing", lambda h: h[first].pop("data_offsets"))
    entry("st_offsets_reversed", lambda h: h[first].update(data_offsets=[4096, 0]))
    entry("st_offsets_beyond", lambda h: h[first].update(data_offsets=[len(D), len(D) + 4096]))
    entry("st_offsets_three", lambda h: h[first].update(data_offsets=[0, 4096, 8192]))
    entry("st_offsets_negative", lambda h: h[first].update(data_offsets=[-4096, 0]))
    entry("st_entry_not_object", lambda h: h.update({first: [1, 2]}))
    entry("st_entry_extra_key", lambda h: h[first].update(crc=1))
    entry("st_metadata_not_strings", lambda h: h["__metadata__"].update(n=1))
    entry("st_metadata_array", lambda h: h.update(__metadata__=[1]))
    entry("st_name_empty", lambda h: h.update({"": h.pop(first)}))

    def overlap(h):
        h["model.embed_tokens.weight"]["data_offsets"] = [2048, 6144]
    entry("st_overlap", overlap)

    def hole(h):  # drop the first tensor: bytes 0..4096 belong to nobody
        h.pop(first)
    entry("st_hole", hole)
    # a repeated key: JSON text edited by hand
    text = json.dumps(H, separators=(",", ":"))
    dup = text.replace('"lm_head.weight":', '"model.norm.weight":', 1)
    ck.weights("st_duplicate_name", st_image(None, D, raw=dup))

    # -- tensors the model cannot use (model binding). Each variant is
    # repacked: the data region stays contiguous, so the safetensors reader
    # accepts the file and the model's rule is the one that fires.
    def tens(name, fn):
        ts = st_tensors(H, D)
        fn(ts)
        ck.weights(name, st_pack(H.get("__metadata__"), ts))

    def drop(tname):
        return lambda ts: ts.remove(next(t for t in ts if t[0] == tname))

    def reshape(tname, shape):
        def fn(ts):
            t = next(t for t in ts if t[0] == tname)
            t[2] = shape
            t[3] = b"\0" * (DTYPE_BYTES[t[1]] * prod(shape))
        return fn

    def retype(tname, dtype):
        def fn(ts):
            t = next(t for t in ts if t[0] == tname)
            t[1] = dtype
            t[3] = b"\0" * (DTYPE_BYTES[dtype] * prod(t[2]))
        return fn

    def extra(tname, shape, dtype="BF16"):
        return lambda ts: ts.append([tname, dtype, shape, b"\0" * (DTYPE_BYTES[dtype] * prod(shape))])

    def poison(tname, elem, bits):
        def fn(ts):
            t = next(t for t in ts if t[0] == tname)
            t[3] = t[3][:2 * elem] + bits + t[3][2 * elem + 2:]
        return fn

    tens("t_missing_norm", drop("model.norm.weight"))
    tens("t_missing_expert", drop("model.layers.1.mlp.experts.3.up_proj.weight"))
    tens("t_missing_conv", drop("model.layers.0.linear_attn.conv1d.weight"))
    tens("t_missing_q_proj", drop("model.layers.1.self_attn.q_proj.weight"))
    tens("t_missing_lm_head", drop("lm_head.weight"))
    tens("t_shape_lm_head", reshape("lm_head.weight", [63, 32]))
    tens("t_shape_embed", reshape("model.embed_tokens.weight", [64, 33]))
    tens("t_shape_norm", reshape("model.norm.weight", [16]))
    tens("t_shape_norm_2d", reshape("model.norm.weight", [32, 1]))
    tens("t_shape_expert", reshape("model.layers.0.mlp.experts.1.gate_proj.weight", [16, 16]))
    tens("t_shape_router", reshape("model.layers.1.mlp.gate.weight", [5, 32]))
    tens("t_shape_conv", reshape("model.layers.0.linear_attn.conv1d.weight", [64, 1, 3]))
    tens("t_shape_a_log", reshape("model.layers.0.linear_attn.A_log", [3]))
    tens("t_shape_k_norm", reshape("model.layers.1.self_attn.k_norm.weight", [8]))
    tens("t_dtype_f16_lm_head", retype("lm_head.weight", "F16"))
    tens("t_dtype_i32_norm", retype("model.norm.weight", "I32"))
    tens("t_dtype_f64_embed", retype("model.embed_tokens.weight", "F64"))
    tens("t_dtype_u8_router", retype("model.layers.1.mlp.gate.weight", "U8"))
    tens("t_extra_lm_head_bias", extra("lm_head.bias", [64]))
    tens("t_extra_q_proj_bias", extra("model.layers.1.self_attn.q_proj.bias", [64]))
    tens("t_extra_expert_index", extra("model.layers.0.mlp.experts.4.up_proj.weight", [16, 32]))
    tens("t_extra_stray", extra("foo.bar", [4]))
    tens("t_extra_layer", extra("model.layers.2.input_layernorm.weight", [32]))
    tens("t_extra_conv_bias", extra("model.layers.0.linear_attn.conv1d.bias", [64]))
    tens("t_extra_gdn_in_attention", extra("model.layers.1.linear_attn.A_log", [2]))
    tens("t_extra_fused_and_split", extra("model.layers.0.mlp.experts.gate_up_proj", [4, 32, 32]))
    # skipped on purpose and listed by the manifest: accepted (exit 0)
    tens("t_ok_mtp", extra("mtp.fc.weight", [32, 64]))
    tens("t_ok_visual", extra("model.visual.patch_embed.proj.weight", [4, 4]))

    # -- non-finite weights (the fingerprinting pass)
    tens("t_nan_lm_head", poison("lm_head.weight", 0, BF16_NAN))
    tens("t_inf_embed", poison("model.embed_tokens.weight", 37, BF16_INF))
    tens("t_nan_norm", poison("model.norm.weight", 5, BF16_NAN))
    tens("t_nan_expert", poison("model.layers.1.mlp.experts.2.down_proj.weight", 100, BF16_NAN))
    tens("t_ninf_a_log", poison("model.layers.0.linear_attn.A_log", 1, b"\x80\xff"))

    # -- the layer count: num_hidden_layers below the checkpoint's layers
    cfg = dict(ck.cfg, num_hidden_layers=1, layer_types=ck.cfg["layer_types"][:1])
    ck.config("t_fewer_layers", cfg)
    cfg = dict(ck.cfg, num_hidden_layers=3, layer_types=ck.cfg["layer_types"] + ["linear_attention"])
    ck.config("t_more_layers", cfg)


def make_qwen35(out, base):
    """Qwen3.5 MoE layouts (the goldens of harness/goldens): fused experts,
    split GDN projections, the gated q_proj, the multimodal config's
    text_config and the model.language_model. prefix."""
    gold = os.path.join(SRC, "goldens")
    for name in ("qwen35moe_tiny_c", "qwen35moe_tiny_a"):
        d = os.path.join(base, name)
        os.makedirs(d)
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(gold, name, f), d)
    c = Checkpoints(os.path.join(base, "qwen35moe_tiny_c"), out)
    H, D = c.header, c.data

    def tens(name, fn):
        ts = st_tensors(H, D)
        fn(ts)
        c.weights(name, st_pack(H.get("__metadata__"), ts))

    def find(ts, n):
        return next(t for t in ts if t[0] == n)

    def reshape(n, shape):
        def fn(ts):
            t = find(ts, n)
            t[2], t[3] = shape, b"\0" * (2 * prod(shape))
        return fn

    def extra(n, shape):
        return lambda ts: ts.append([n, "BF16", shape, b"\0" * (2 * prod(shape))])

    L0 = "model.layers.0."
    tens("q35_gate_up_shape", reshape(L0 + "mlp.experts.gate_up_proj", [12, 32, 31]))
    tens("q35_gate_up_experts", reshape(L0 + "mlp.experts.gate_up_proj", [11, 32, 32]))
    tens("q35_down_missing", lambda ts: ts.remove(find(ts, L0 + "mlp.experts.down_proj")))
    tens("q35_fused_and_per_expert", extra(L0 + "mlp.experts.0.up_proj.weight", [16, 32]))
    tens("q35_in_proj_z_shape", reshape(L0 + "linear_attn.in_proj_z.weight", [23, 32]))
    tens("q35_in_proj_qkvz_extra", extra(L0 + "linear_attn.in_proj_qkvz.weight", [64, 32]))
    tens("q35_q_proj_no_gate", reshape("model.layers.2.self_attn.q_proj.weight", [64, 32]))
    tens("q35_two_prefixes", extra("model.language_model.norm.weight", [32]))

    def nan(ts):
        t = find(ts, L0 + "mlp.experts.gate_up_proj")
        t[3] = t[3][:2 * 77] + BF16_NAN + t[3][2 * 77 + 2:]
    tens("q35_nan_gate_up", nan)
    tens("q35_ok_mtp", extra("mtp.fc.weight", [32, 64]))
    cfg0 = c.cfg
    rp = cfg0["rope_parameters"]
    c.config("q35_mrope_section_sum", dict(cfg0, rope_parameters=dict(rp, mrope_section=[2, 2, 2])))
    c.config("q35_mrope_section_string", dict(cfg0, rope_parameters=dict(rp, mrope_section="1,1,0")))
    c.config("q35_mrope_interleaved_string", dict(cfg0, rope_parameters=dict(rp, mrope_interleaved="yes")))
    c.config("q35_model_type_other", dict(cfg0, model_type="qwen3_5_text"))
    c.config("q35_layer_types_short", dict(cfg0, layer_types=cfg0["layer_types"][:2]))
    c.config("q35_experts_per_tok_gt", dict(cfg0, num_experts_per_tok=13))
    # the multimodal config: the text model's fields sit under text_config
    a = Checkpoints(os.path.join(base, "qwen35moe_tiny_a"), out)
    a.config("q35a_ok", a.cfg)
    a.config("q35a_text_config_missing", {k: v for k, v in a.cfg.items() if k != "text_config"})
    a.config("q35a_text_config_array", dict(a.cfg, text_config=[1]))
    a.config("q35a_text_hidden_size_string", dict(a.cfg, text_config=dict(a.cfg["text_config"], hidden_size="64")))
    a.config("q35a_text_vocab_zero", dict(a.cfg, text_config=dict(a.cfg["text_config"], vocab_size=0)))
    a.config("q35a_text_eos_beyond", dict(a.cfg, text_config=dict(a.cfg["text_config"], eos_token_id=300)))


def make_configs(ck):
    c0 = ck.cfg

    def cfg(name, **changes):
        c = dict(c0)
        for k, v in changes.items():
            if v is DROP:
                c.pop(k, None)
            else:
                c[k] = v
        ck.config(name, c)

    # integers: wrong type, zero/negative, beyond range, overflowing int64
    for field in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                  "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
                  "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "shared_expert_intermediate_size", "intermediate_size", "max_position_embeddings"):
        cfg("c_%s_string" % field, **{field: str(c0[field])})
        cfg("c_%s_zero" % field, **{field: 0})
        cfg("c_%s_missing" % field, **{field: DROP})
    for field in ("hidden_size", "vocab_size", "num_experts", "head_dim"):
        cfg("c_%s_negative" % field, **{field: -1})
        cfg("c_%s_float" % field, **{field: 32.5})
    # an integer beyond int64: the text is edited, jansson would refuse it with
    # a byte offset, and the message must still name the field
    text = jdump(c0).replace('"hidden_size": 32', '"hidden_size": 99999999999999999999999', 1)
    ck.config("c_hidden_size_overflow", text=text)
    text = jdump(c0).replace('"vocab_size": 64', '"vocab_size": 1e400', 1)
    ck.config("c_vocab_size_1e400", text=text)
    cfg("c_hidden_size_huge", hidden_size=1 << 40)
    cfg("c_vocab_size_huge", vocab_size=1 << 40)
    cfg("c_num_experts_per_tok_gt_experts", num_experts_per_tok=5)
    cfg("c_heads_not_multiple", num_key_value_heads=3)
    cfg("c_linear_heads_not_multiple", linear_num_key_heads=3)
    cfg("c_head_dim_mismatch", head_dim=8)
    # token ids
    cfg("c_eos_beyond_vocab", eos_token_id=64)
    cfg("c_eos_negative", eos_token_id=-1)
    cfg("c_eos_string", eos_token_id="63")
    cfg("c_eos_list_bad", eos_token_id=[63, 1000])
    cfg("c_bos_beyond_vocab", bos_token_id=4096)
    # strings and enums
    cfg("c_model_type_other", model_type="llama")
    cfg("c_model_type_missing", model_type=DROP)
    cfg("c_model_type_number", model_type=3)
    cfg("c_hidden_act_gelu", hidden_act="gelu")
    cfg("c_hidden_act_number", hidden_act=1)
    cfg("c_attention_bias_true", attention_bias=True)
    cfg("c_attention_bias_string", attention_bias="false")
    cfg("c_tie_embeddings_true", tie_word_embeddings=True)
    cfg("c_norm_topk_string", norm_topk_prob="yes")
    cfg("c_quantization_config", quantization_config={"quant_method": "gptq", "bits": 4})
    cfg("c_decoder_sparse_step_2", decoder_sparse_step=2)
    cfg("c_mlp_only_layers", mlp_only_layers=[0])
    cfg("c_rope_scaling_object", rope_scaling={"type": "yarn", "factor": 4.0})
    # numbers
    cfg("c_rms_norm_eps_zero", rms_norm_eps=0)
    cfg("c_rms_norm_eps_negative", rms_norm_eps=-1e-6)
    cfg("c_rms_norm_eps_string", rms_norm_eps="1e-6")
    cfg("c_rms_norm_eps_missing", rms_norm_eps=DROP)
    cfg("c_rope_theta_negative", rope_theta=-1.0,
        rope_parameters=dict(c0["rope_parameters"], rope_theta=-1.0))
    cfg("c_rope_theta_string", rope_theta="1e7")
    cfg("c_partial_rotary_2", partial_rotary_factor=2.0,
        rope_parameters=dict(c0["rope_parameters"], partial_rotary_factor=2.0))
    cfg("c_rope_parameters_array", rope_parameters=[1])
    cfg("c_rope_type_yarn", rope_parameters=dict(c0["rope_parameters"], rope_type="yarn"))
    cfg("c_rope_parameters_unknown", rope_parameters=dict(c0["rope_parameters"], mrope_section=[1, 2]))
    cfg("c_rope_theta_disagree", rope_parameters=dict(c0["rope_parameters"], rope_theta=5.0))
    # layer layout
    cfg("c_layer_types_short", layer_types=["linear_attention"])
    cfg("c_layer_types_unknown", layer_types=["linear_attention", "sliding_attention"])
    cfg("c_layer_types_string", layer_types="linear_attention")
    cfg("c_full_attention_interval_0", layer_types=DROP, full_attention_interval=0)
    cfg("c_full_attention_interval_str", layer_types=DROP, full_attention_interval="2")
    # the file itself
    ck.config("c_not_json", text="{\"model_type\": \"qwen3_next\",\n")
    ck.config("c_empty", text="")
    ck.config("c_array", text="[1, 2]\n")
    ck.config("c_nul_byte", text=jdump(c0)[:40] + "\0" + jdump(c0)[41:])
    ck.config("c_bad_utf8", text=b'{"model_type": "qwen3_next\xff"}\n'.decode("latin-1"))
    dup = jdump(c0).replace('{\n', '{\n  "hidden_size": 64,\n', 1)
    ck.config("c_duplicate_key", text=dup)


DROP = object()


def make_checkpoint_layout(ck, out, base_shard):
    """Directory-level problems: missing files, sharded indexes."""
    d = os.path.join(out, "no_config")
    os.makedirs(d)
    os.link(os.path.join(ck.base, "model.safetensors"), os.path.join(d, "model.safetensors"))
    d = os.path.join(out, "no_weights")
    write(os.path.join(d, "config.json"), jdump(ck.cfg))
    d = os.path.join(out, "config_dir")
    os.makedirs(os.path.join(d, "config.json"))
    os.link(os.path.join(ck.base, "model.safetensors"), os.path.join(d, "model.safetensors"))
    d = os.path.join(out, "weights_dir")
    write(os.path.join(d, "config.json"), jdump(ck.cfg))
    os.makedirs(os.path.join(d, "model.safetensors"))
    write(os.path.join(out, "a_file"), "not a directory\n")

    index = json.loads(read(os.path.join(base_shard, "model.safetensors.index.json")))
    shards = sorted(set(index["weight_map"].values()))

    def sharded(name, idx=None, text=None, both=False, drop_shard=None):
        d = os.path.join(out, name)
        os.makedirs(d)
        for f in os.listdir(base_shard):
            if f == "model.safetensors.index.json" or f == drop_shard:
                continue
            os.link(os.path.join(base_shard, f), os.path.join(d, f))
        write(os.path.join(d, "model.safetensors.index.json"), text if text is not None else jdump(idx))
        if both:
            os.link(os.path.join(ck.base, "model.safetensors"), os.path.join(d, "model.safetensors"))

    def idx_with(fn):
        i = json.loads(json.dumps(index))
        fn(i)
        return i
    sharded("ix_missing_shard", index, drop_shard=shards[1])
    sharded("ix_not_json", text="{\"weight_map\": ")
    sharded("ix_array", text="[]")
    sharded("ix_weight_map_array", idx_with(lambda i: i.update(weight_map=[])))
    sharded("ix_weight_map_empty", idx_with(lambda i: i.update(weight_map={})))
    sharded("ix_weight_map_missing", idx_with(lambda i: i.pop("weight_map")))
    sharded("ix_metadata_string", idx_with(lambda i: i.update(metadata="x")))
    sharded("ix_value_number", idx_with(lambda i: i["weight_map"].update({"lm_head.weight": 1})))
    sharded("ix_path_escape", idx_with(lambda i: i["weight_map"].update({"lm_head.weight": "../x.safetensors"})))
    sharded("ix_path_absolute", idx_with(lambda i: i["weight_map"].update({"lm_head.weight": "/etc/passwd"})))
    sharded("ix_unknown_shard", idx_with(lambda i: i["weight_map"].update({"lm_head.weight": "model-9.safetensors"})))
    sharded("ix_wrong_shard", idx_with(lambda i: i["weight_map"].update({"lm_head.weight": shards[1]})))
    sharded("ix_unlisted_tensor", idx_with(lambda i: i["weight_map"].pop("model.norm.weight")))
    sharded("ix_phantom_tensor", idx_with(lambda i: i["weight_map"].update({"model.ghost.weight": shards[0]})))
    sharded("ix_and_single", index, both=True)

    # inputs that are not regular files (issue 16, defect 3): a FIFO (no
    # writer: a blocking open or read never returns), /dev/zero (endless),
    # a sparse file far larger than any config
    d = os.path.join(out, "fifo_weights")
    write(os.path.join(d, "config.json"), jdump(ck.cfg))
    os.mkfifo(os.path.join(d, "model.safetensors"))
    d = os.path.join(out, "fifo_config")
    os.makedirs(d)
    os.mkfifo(os.path.join(d, "config.json"))
    os.link(os.path.join(ck.base, "model.safetensors"), os.path.join(d, "model.safetensors"))
    d = os.path.join(out, "zero_config")
    os.makedirs(d)
    os.symlink("/dev/zero", os.path.join(d, "config.json"))
    os.link(os.path.join(ck.base, "model.safetensors"), os.path.join(d, "model.safetensors"))
    d = os.path.join(out, "huge_config")
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "wb") as f:
        f.write(b"{")
        f.truncate(4 << 30)            # sparse: no disk used
    os.link(os.path.join(ck.base, "model.safetensors"), os.path.join(d, "model.safetensors"))
    d = os.path.join(out, "fifo_index")
    os.makedirs(d)
    for f in os.listdir(base_shard):
        if f != "model.safetensors.index.json":
            os.link(os.path.join(base_shard, f), os.path.join(d, f))
    os.mkfifo(os.path.join(d, "model.safetensors.index.json"))
    os.mkfifo(os.path.join(out, "fifo"))
    os.symlink("/dev/zero", os.path.join(out, "zero"))


# ---- prompts, tokens, import JSONL ------------------------------------------------

def make_jsonl(out):
    P = {
        "empty": "",
        "blank_lines": "\n\n",
        "not_json": "{\"id\": 0, \"tokens\": [1, 2\n",
        "array_line": "[1, 2, 3]\n",
        "missing_id": "{\"tokens\": [1, 2]}\n",
        "missing_tokens": "{\"id\": 0}\n",
        "tokens_empty": "{\"id\": 0, \"tokens\": []}\n",
        "tokens_string": "{\"id\": 0, \"tokens\": \"1 2 3\"}\n",
        "token_beyond_vocab": "{\"id\": 0, \"tokens\": [1, 64]}\n",
        "token_negative": "{\"id\": 0, \"tokens\": [1, -2]}\n",
        "token_float": "{\"id\": 0, \"tokens\": [1, 2.5]}\n",
        "token_huge": "{\"id\": 0, \"tokens\": [1, 99999999999999999999]}\n",
        "id_duplicate": "{\"id\": 0, \"tokens\": [1]}\n{\"id\": 0, \"tokens\": [2]}\n",
        "id_negative": "{\"id\": -1, \"tokens\": [1]}\n",
        "id_string": "{\"id\": \"a\", \"tokens\": [1]}\n",
        "id_huge": "{\"id\": 4294967296, \"tokens\": [1]}\n",
        "trailing_garbage": "{\"id\": 0, \"tokens\": [1]} x\n",
        "second_line_bad": "{\"id\": 0, \"tokens\": [1]}\n{\"id\": 1, \"tokens\": [1,]}\n",
        "nul_byte": "{\"id\": 0, \"tokens\": [1]}\0\n",
        "prompt_too_long": "{\"id\": 0, \"tokens\": [%s]}\n" % ", ".join(["1"] * 5000),
    }
    for k, v in P.items():
        write(os.path.join(out, "prompts", k + ".jsonl"), v)
    T = {
        "prompt_len_missing": "{\"id\": 0, \"tokens\": [1, 2, 3]}\n",
        "prompt_len_zero": "{\"id\": 0, \"tokens\": [1, 2, 3], \"prompt_len\": 0}\n",
        "prompt_len_beyond": "{\"id\": 0, \"tokens\": [1, 2, 3], \"prompt_len\": 4}\n",
        "prompt_len_string": "{\"id\": 0, \"tokens\": [1, 2, 3], \"prompt_len\": \"2\"}\n",
        "token_beyond_vocab": "{\"id\": 0, \"tokens\": [1, 2, 99], \"prompt_len\": 2}\n",
        "tokens_missing": "{\"id\": 0, \"prompt_len\": 2}\n",
    }
    for k, v in T.items():
        write(os.path.join(out, "tokens", k + ".jsonl"), v)
    good = {"seq": 0, "pos": 3, "token": 7, "logprob": -0.25, "top_logprobs": {"7": -0.25, "9": -1.5}}

    def rec(**ch):
        r = dict(good)
        for k, v in ch.items():
            if v is DROP:
                r.pop(k)
            else:
                r[k] = v
        return json.dumps(r) + "\n"
    J = {
        "missing_seq": rec(seq=DROP),
        "missing_pos": rec(pos=DROP),
        "missing_token": rec(token=DROP),
        "missing_logprob": rec(logprob=DROP),
        "seq_negative": rec(seq=-1),
        "pos_string": rec(pos="3"),
        "token_float": rec(token=7.5),
        "logprob_text": rec(logprob="minus a quarter"),
        "logprob_null": rec(logprob=None),
        "logprob_positive": rec(logprob=0.5),
        "top_array": rec(top_logprobs=[[7, -0.25]]),
        "top_key_not_int": rec(top_logprobs={"seven": -0.25}),
        "top_value_string": rec(top_logprobs={"7": "x"}),
        "pos_repeated": rec() + rec(),
        "pos_backwards": rec(pos=5) + rec(pos=4),
        "not_object": "[0, 3, 7]\n",
        "not_json": "{\"seq\": 0,\n",
        "empty": "",
        "top_not_ranked": rec(top_logprobs={"9": -1.5, "7": -0.25}),
    }
    for k, v in J.items():
        write(os.path.join(out, "import", k + ".jsonl"), v)

    # engine formats: the committed examples, each broken in one place
    vc = read(os.path.join(EXAMPLES, "vllm-completions.json")).decode()
    write(os.path.join(out, "import", "vllm_cut.json"), vc[:len(vc) // 2])
    doc = json.loads(vc)
    first = doc[0] if isinstance(doc, list) else doc
    choice = first["choices"][0]
    lp = choice["logprobs"]
    if "tokens" in lp:
        lp["tokens"] = lp["tokens"][:-1]      # one token short of the logprobs
    write(os.path.join(out, "import", "vllm_ragged.json"), json.dumps(doc))
    lp2 = json.loads(vc)
    c2 = (lp2[0] if isinstance(lp2, list) else lp2)["choices"][0]
    c2["logprobs"]["tokens"] = ["word%d" % i for i in range(len(c2["logprobs"]["tokens"]))]
    c2.pop("token_ids", None)
    write(os.path.join(out, "import", "vllm_no_token_ids.json"), json.dumps(lp2))
    sg = read(os.path.join(EXAMPLES, "sglang.json")).decode()
    write(os.path.join(out, "import", "sglang_not_json.json"), sg[:-10])
    sgd = json.loads(sg)
    s0 = sgd[0] if isinstance(sgd, list) else sgd
    s0["meta_info"].pop("output_token_logprobs", None)
    write(os.path.join(out, "import", "sglang_no_logprobs.json"), json.dumps(sgd))
    vo = read(os.path.join(EXAMPLES, "vllm-offline.jsonl")).decode().splitlines()
    o0 = json.loads(vo[0])
    o0["prompt_token_ids"] = "1 2 3"
    write(os.path.join(out, "import", "vllm_offline_ids_string.jsonl"), json.dumps(o0) + "\n")
    vh, vd = st_parse(read(os.path.join(EXAMPLES, "verl.safetensors")))
    ts = [t for t in st_tensors(vh, vd) if t[0] != "rollout_log_probs"]
    write(os.path.join(out, "import", "verl_no_logprobs.safetensors"), st_pack(vh.get("__metadata__"), ts))
    ts = st_tensors(vh, vd)
    next(t for t in ts if t[0] == "rollout_log_probs")[1] = "I32"
    write(os.path.join(out, "import", "verl_logprobs_i32.safetensors"), st_pack(vh.get("__metadata__"), ts))
    h = json.loads(json.dumps(vh))
    name = [k for k in h if k not in ("__metadata__", "rollout_log_probs")][0]
    h[name]["shape"] = [s + 1 for s in h[name]["shape"]]
    write(os.path.join(out, "import", "verl_bad_shape.safetensors"), st_image(h, vd))
    blob = read(os.path.join(EXAMPLES, "verl.safetensors"))
    write(os.path.join(out, "import", "verl_cut.safetensors"), blob[:len(blob) - 100])


# ---- traces ----------------------------------------------------------------------

class Trace:
    """A trace split into its parts, re-encodable with valid checksums."""

    def __init__(self, blob):
        assert blob[:8] == b"LSTRACE\0"
        self.major, self.minor, n = struct.unpack_from("<HHI", blob, 8)
        self.header = json.loads(blob[16:16 + n])
        self.header_text = blob[16:16 + n]
        off = 16 + n + 32
        self.frames = []   # [fixed 40 bytes, segments bytes, payload bytes]
        while off < len(blob) and blob[off:off + 4] == b"LSFR":
            nseg = struct.unpack_from("<I", blob, off + 16)[0]
            clen = struct.unpack_from("<Q", blob, off + 32)[0]
            fixed = blob[off:off + 40]
            segs = blob[off + 40:off + 40 + 12 * nseg]
            pay = blob[off + 72 + 12 * nseg:off + 72 + 12 * nseg + clen]
            self.frames.append([bytearray(fixed), bytearray(segs), bytes(pay)])
            off += 72 + 12 * nseg + clen
        self.trailer = bytearray(blob[off:])
        assert len(self.trailer) in (0, 96)

    def encode_header(self, text=None):
        t = text if text is not None else self.header_text
        head = b"LSTRACE\0" + struct.pack("<HHI", self.major, self.minor, len(t)) + t
        return head + hashlib.sha256(head).digest()

    def frame_checksum(self, f):
        return hashlib.sha256(bytes(f[0]) + bytes(f[1])).digest()

    def encode_frame(self, f):
        return bytes(f[0]) + bytes(f[1]) + self.frame_checksum(f) + f[2]

    def encode_trailer(self, fix=True):
        if not self.trailer:
            return b""
        t = bytearray(self.trailer)
        if fix:
            allsums = b"".join(self.frame_checksum(f) for f in self.frames)
            t[32:64] = hashlib.sha256(allsums).digest()
            t[64:96] = hashlib.sha256(bytes(t[:64])).digest()
        return bytes(t)

    def encode(self, header_text=None):
        return (self.encode_header(header_text) + b"".join(self.encode_frame(f) for f in self.frames)
                + self.encode_trailer())

    def set_header(self, obj):
        self.header_text = json.dumps(obj, separators=(",", ":")).encode()

    def set_payload(self, i, raw):
        """Replaces frame i's decompressed payload, fixing sizes and checksums."""
        comp = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True).compress(raw)
        f = self.frames[i]
        struct.pack_into("<I", f[0], 20, struct.unpack_from("<I", comp, len(comp) - 4)[0])
        struct.pack_into("<Q", f[0], 24, len(raw))
        struct.pack_into("<Q", f[0], 32, len(comp))
        f[2] = comp
        # the trailer's byte total follows the frames
        if self.trailer:
            struct.pack_into("<Q", self.trailer, 24, sum(struct.unpack_from("<Q", g[0], 24)[0] for g in self.frames))

    def payload(self, i):
        return zstandard.ZstdDecompressor().decompress(self.frames[i][2])


def make_traces(out, base):
    blob = read(os.path.join(base, "r.trace"))

    def put(name, data):
        write(os.path.join(out, name + ".trace"), data)

    tr = Trace(blob)
    n = len(tr.header_text)
    f0 = 16 + n + 32                        # first frame
    nseg0 = struct.unpack_from("<I", blob, f0 + 16)[0]
    pay0 = f0 + 72 + 12 * nseg0
    tail = len(blob) - 96                   # trailer
    # truncations at and inside each section
    put("cut_empty", b"")
    put("cut_in_magic", blob[:5])
    put("cut_after_magic", blob[:8])
    put("cut_in_json", blob[:16 + n // 2])
    put("cut_in_header_sha", blob[:16 + n + 10])
    put("cut_in_frame_header", blob[:f0 + 20])
    put("cut_in_segments", blob[:f0 + 40 + 6])
    put("cut_in_frame_sha", blob[:f0 + 40 + 12 * nseg0 + 16])
    put("cut_in_payload", blob[:pay0 + 10])
    put("cut_in_trailer", blob[:tail + 40])
    put("cut_no_trailer", blob[:tail])       # incomplete, not corrupt
    put("cut_header_only", blob[:f0])         # incomplete, no frame
    put("extra_after_trailer", blob + b"\0" * 8)
    # file header
    put("bad_magic", b"LSTRACX\0" + blob[8:])
    put("version_2", blob[:8] + struct.pack("<H", 2) + blob[10:])
    put("json_bytes_huge", blob[:12] + struct.pack("<I", 1 << 30) + blob[16:])
    flip = bytearray(blob)
    flip[16 + n + 3] ^= 1
    put("header_sha_flip", bytes(flip))

    def header(name, fn):
        t = Trace(blob)
        h = json.loads(t.header_text)
        r = fn(h)
        if isinstance(r, bytes):
            put(name, t.encode(header_text=r))
        else:
            t.set_header(h)
            put(name, t.encode())
    H = tr.header
    header("h_not_json", lambda h: b"{\"format\": ")
    header("h_array", lambda h: b"[]")
    header("h_format_other", lambda h: h.update(format="other-trace"))
    header("h_format_missing", lambda h: h.pop("format"))
    header("h_mode_bogus", lambda h: h.update(mode="bogus"))
    header("h_mode_number", lambda h: h.update(mode=1))
    header("h_engine_missing", lambda h: h.pop("engine"))
    header("h_fingerprint_short", lambda h: h.update(model_fingerprint="abc"))
    header("h_fingerprint_upper", lambda h: h.update(model_fingerprint=h["model_fingerprint"].upper()))
    header("h_manifest_digest_bad", lambda h: h.update(manifest_digest="xyz"))
    header("h_run_params_array", lambda h: h.update(run_params=[1]))
    header("h_topk_zero", lambda h: h.update(topk=0))
    header("h_topk_65", lambda h: h.update(topk=65))
    header("h_topk_string", lambda h: h.update(topk="5"))
    header("h_kinds_unknown", lambda h: h.update(digest_kinds=h["digest_kinds"] + ["logits"]))
    header("h_kinds_repeated", lambda h: h.update(digest_kinds=h["digest_kinds"] + [h["digest_kinds"][0]]))
    header("h_state_every_zero", lambda h: h.update(state_digest_every=0))
    header("h_act_dtype_fp16", lambda h: h.update(activation_dtype="fp16"))
    header("h_layers_index", lambda h: h["layers"][1].update(index=7))
    header("h_layers_family", lambda h: h["layers"][1].update(family="mamba"))
    header("h_layers_empty", lambda h: h.update(layers=[]))
    t = Trace(blob)
    h = json.loads(t.header_text)
    h["mode"] = "bogus"
    t.set_header(h)
    t.frames = []
    struct.pack_into("<QQQ", t.trailer, 8, 0, 0, 0)
    put("h_mode_bogus_empty", t.encode())
    header("h_extra_key_ok", lambda h: h.update(future_key=1))          # 1.y keys: accepted
    header("h_duplicate_key",
           lambda h: json.dumps(h, separators=(",", ":")).replace('{"format"', '{"topk":5,"format"', 1).encode())

    # frame headers (checksums recomputed: the field rule fires)
    def frame(name, fn, i=0, fix_payload=None):
        t = Trace(blob)
        fn(t.frames[i])
        if fix_payload:
            t.set_payload(i, fix_payload(t.payload(i)))
        put(name, t.encode())
    frame("f_magic", lambda f: f[0].__setitem__(slice(0, 4), b"LSFX"))
    frame("f_kind_chunk", lambda f: f[0].__setitem__(4, 2))
    frame("f_kind_9", lambda f: f[0].__setitem__(4, 9))
    frame("f_flags", lambda f: f[0].__setitem__(5, 1))
    frame("f_reserved", lambda f: f[0].__setitem__(6, 1))
    frame("f_index", lambda f: struct.pack_into("<I", f[0], 8, 5), i=1)
    frame("f_records_zero", lambda f: struct.pack_into("<I", f[0], 12, 0))
    frame("f_records_more", lambda f: struct.pack_into("<I", f[0], 12, struct.unpack_from("<I", f[0], 12)[0] + 1))
    frame("f_uncompressed_huge", lambda f: struct.pack_into("<Q", f[0], 24, 1 << 40))
    frame("f_compressed_small", lambda f: struct.pack_into("<Q", f[0], 32, 4))
    frame("f_content_checksum", lambda f: struct.pack_into("<I", f[0], 20, 0x12345678))
    frame("f_segment_npos_zero", lambda f: struct.pack_into("<I", f[1], 8, 0))
    frame("f_segment_seq", lambda f: struct.pack_into("<I", f[1], 0, 77))
    # bytes flipped without fixing checksums
    t = Trace(blob)
    fixed = bytearray(t.encode())
    fixed[f0 + 12] ^= 0x40
    put("f_header_sha_mismatch", bytes(fixed))
    fixed = bytearray(t.encode())
    fixed[pay0 + 20] ^= 0x01
    put("f_payload_flip", bytes(fixed))
    # frames reordered, dropped, repeated (trailer digest recomputed)
    t = Trace(blob)
    t.frames[1], t.frames[2] = t.frames[2], t.frames[1]
    put("f_reordered", t.encode())
    t = Trace(blob)
    del t.frames[1]
    put("f_dropped", t.encode())

    # records (payload rewritten, sizes and checksums fixed)
    K = H["topk"]

    def record0(fn, name, i=0):
        frame(name, lambda f: None, i=i, fix_payload=lambda raw: fn(bytearray(raw)))

    def rec_size(raw):
        return struct.unpack_from("<I", raw, 0)[0]
    record0(lambda r: (struct.pack_into("<I", r, 0, rec_size(r) + 4), bytes(r))[1], "r_size_wrong")
    record0(lambda r: (struct.pack_into("<I", r, 4, 99), bytes(r))[1], "r_seq_not_segment")
    record0(lambda r: (struct.pack_into("<I", r, 8, 1000), bytes(r))[1], "r_pos_not_segment")
    record0(lambda r: (struct.pack_into("<i", r, 24 + 8, struct.unpack_from("<i", r, 24)[0]), bytes(r))[1],
            "r_topk_duplicate_id")
    nd = 24 + 8 * K
    record0(lambda r: (struct.pack_into("<H", r, nd, struct.unpack_from("<H", r, nd)[0] - 1), bytes(r))[1],
            "r_digests_count")
    record0(lambda r: (r.__setitem__(nd + 4 + 3, 1), bytes(r))[1], "r_digest_reserved")
    record0(lambda r: (r.__setitem__(nd + 4 + 2, 9), bytes(r))[1], "r_digest_kind")
    record0(lambda r: (struct.pack_into("<H", r, nd + 4, 9999), bytes(r))[1], "r_digest_layer")
    record0(lambda r: (struct.pack_into("<H", r, nd + 4 + 36, 0), bytes(r))[1], "r_digest_order")
    record0(lambda r: bytes(r)[:-4], "r_cut")
    # trailer
    t = Trace(blob)
    body = t.encode()[:tail]

    def trailer(name, fn, fix=True):
        tt = Trace(blob)
        fn(tt.trailer)
        put(name, body + tt.encode_trailer(fix))
    trailer("t_magic", lambda x: x.__setitem__(slice(0, 4), b"LSEX"))
    trailer("t_reserved", lambda x: x.__setitem__(4, 1))
    trailer("t_frames", lambda x: struct.pack_into("<Q", x, 8, 99))
    trailer("t_records", lambda x: struct.pack_into("<Q", x, 16, 1))
    trailer("t_bytes", lambda x: struct.pack_into("<Q", x, 24, 7))
    trailer("t_sha", lambda x: x.__setitem__(70, x[70] ^ 1), fix=False)
    trailer("t_frames_digest", lambda x: x.__setitem__(40, x[40] ^ 1), fix=False)

    # run_params read by run --from: bad entries are ignored, a bad object is not
    def rp(name, fn):
        header(name, lambda h: (h.__setitem__("run_params", fn(h["run_params"])), None)[1])
    rp("rp_batch_string", lambda p: dict(p, batch="all"))
    rp("rp_batch_bad_entries", lambda p: dict(p, batch=[{"id": 99, "prompt_len": 0}, 7]))
    rp("rp_gdn_form_bad", lambda p: dict(p, gdn_form="chunked"))
    rp("rp_gdn_form_number", lambda p: dict(p, gdn_form=64))
    rp("rp_tier_bad", lambda p: dict(p, tier="tensor-core"))
    header("rp_not_json", lambda h: json.dumps(h, separators=(",", ":")).replace(
        '"run_params":{', '"run_params":{]', 1).encode())
    # offsets the messages name (the header's length is the base trace's)
    offsets = {"F0": str(f0), "F1": str(f0 + 72 + 12 * nseg0 + len(tr.frames[0][2])), "TRAILER": str(tail),
               "END": str(len(blob))}
    # another checkpoint's rollout (the base/ck2 checkpoint: other seed)
    shutil.copy(os.path.join(base, "r2.trace"), os.path.join(out, "other_model.trace"))
    # the header's topk no longer matches the records' layout
    header("h_topk_3", lambda h: h.update(topk=3))
    return offsets


# ---- manifests -----------------------------------------------------------------------

def make_manifests(out, base):
    m0 = json.loads(read(os.path.join(base, "m.json")))

    def man(name, fn=None, text=None):
        if text is None:
            m = json.loads(json.dumps(m0))
            fn(m)
            text = jdump(m)
        write(os.path.join(out, name + ".json"), text)
    man("not_json", text="{\"manifest_version\": 1,")
    man("empty", text="")
    man("array", text="[]\n")
    man("version_missing", lambda m: m.pop("manifest_version"))
    man("version_string", lambda m: m.update(manifest_version="1"))
    man("version_2", lambda m: m.update(manifest_version=2))
    for sec in ("checkpoint", "architecture", "numerics", "topology", "build", "runtime"):
        man("%s_missing" % sec, lambda m, s=sec: m.pop(s))
        man("%s_array" % sec, lambda m, s=sec: m.update({s: []}))
    man("gdn_form_bad", lambda m: m["numerics"].update(gdn_form="chunk-aligned-32"))
    man("tier_bad", lambda m: m["numerics"].update(tier="tc"))
    man("tier_tc_no_gemms", lambda m: m["numerics"].update(tier="tensor-core"))
    man("tc_gemms_portable", lambda m: m["numerics"].update(tc_gemms=[{"kind": "linear_bf16_f32_tn"}]))
    man("tc_gemms_bad_record", lambda m: m["numerics"].update(tier="tensor-core", tc_gemms=[{"kind": "x"}]))
    man("config_sha_short", lambda m: m["checkpoint"].update(config_sha256="00"))
    man("total_bytes_negative", lambda m: m["checkpoint"].update(total_bytes=-1))
    man("tensor_count_wrong", lambda m: m["checkpoint"].update(tensor_count=3))
    man("tensors_array", lambda m: m["checkpoint"].update(tensors=[]))
    t0 = "lm_head.weight"
    man("tensor_dtype_bad", lambda m: m["checkpoint"]["tensors"][t0].update(dtype="Q7"))
    man("tensor_shape_negative", lambda m: m["checkpoint"]["tensors"][t0].update(shape=[-1, 32]))
    man("tensor_shape_string", lambda m: m["checkpoint"]["tensors"][t0].update(shape="64x32"))
    man("tensor_size_string", lambda m: m["checkpoint"]["tensors"][t0].update(size_bytes="4096"))
    man("tensor_sha_short", lambda m: m["checkpoint"]["tensors"][t0].update(sha256="abc"))
    man("tensor_sha_edited", lambda m: m["checkpoint"]["tensors"][t0].update(sha256="0" * 64))
    man("merkle_root_missing", lambda m: m["checkpoint"].pop("merkle_root"))
    man("tensor_not_object", lambda m: m["checkpoint"]["tensors"].update({t0: 1}))
    dup = jdump(m0).replace('{\n', '{\n  "manifest_version": 1,\n', 1)
    man("duplicate_key", text=dup)
    # a manifest of another checkpoint (voiding for verify: exit 1)
    shutil.copy(os.path.join(base, "m2.json"), os.path.join(out, "other_model.json"))


# ---- fingerprint cache -------------------------------------------------------------------

def make_synth_configs(out, cfg):
    def sc(name, **changes):
        c = dict(cfg)
        for k, v in changes.items():
            if v is DROP:
                c.pop(k, None)
            else:
                c[k] = v
        write(os.path.join(out, name + ".json"), jdump(c))
    sc("hidden_size_zero", hidden_size=0)
    sc("hidden_size_string", hidden_size="32")
    sc("vocab_missing", vocab_size=DROP)
    sc("layers_huge", num_hidden_layers=1 << 40, layer_types=DROP)
    sc("experts_negative", num_experts=-4)
    sc("model_type_other", model_type="llama")
    sc("layer_types_short", layer_types=["linear_attention"])
    sc("head_dim_float", head_dim=16.5)
    sc("topk_gt_experts", num_experts_per_tok=9)
    write(os.path.join(out, "not_json.json"), "{")
    write(os.path.join(out, "array.json"), "[]")


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: make_inputs.py LOCKSTEP OUT_DIR")
    lockstep, out = sys.argv[1], os.path.abspath(sys.argv[2])
    for k, v in sorted(build(lockstep, out).items()):
        print("%s=%s" % (k, v))


def build(lockstep, out):
    """Writes every input under out (which must not exist or be empty).
    Returns the values cases.tsv may name: FP (the base checkpoint's Merkle
    root) and the base trace's offsets F0 (first frame), F1 (second frame),
    TRAILER and END (its length)."""
    base = os.path.join(out, "base")
    os.makedirs(base, exist_ok=True)
    CACHE_DIR[0] = os.path.join(out, "cache")
    cfg_path = os.path.join(HERE, "micro_config.json")
    run_cli(lockstep, "synth", "--config", cfg_path, "--seed", "11", "--out", os.path.join(base, "ck"))
    run_cli(lockstep, "synth", "--config", cfg_path, "--seed", "12", "--out", os.path.join(base, "ck2"))
    run_cli(lockstep, "synth", "--config", cfg_path, "--seed", "11", "--max-shard-bytes", "30KB",
            "--out", os.path.join(base, "shard"))
    write(os.path.join(base, "p.jsonl"), "{\"id\": 0, \"tokens\": [1, 2, 3]}\n{\"id\": 1, \"tokens\": [4, 5]}\n")
    write(os.path.join(base, "t.jsonl"), "{\"id\": 0, \"tokens\": [1, 2, 3, 9], \"prompt_len\": 3}\n")
    ck = os.path.join(base, "ck")
    run_cli(lockstep, "run", "--checkpoint", ck, "--mode", "rollout", "--prompts", os.path.join(base, "p.jsonl"),
            "--max-new-tokens", "4", "-o", os.path.join(base, "r.trace"))
    run_cli(lockstep, "run", "--checkpoint", ck, "--mode", "replay", "--from", os.path.join(base, "r.trace"),
            "--chunk", "2", "-o", os.path.join(base, "c.trace"))
    run_cli(lockstep, "run", "--checkpoint", os.path.join(base, "ck2"), "--mode", "rollout",
            "--prompts", os.path.join(base, "p.jsonl"), "--max-new-tokens", "4", "-o", os.path.join(base, "r2.trace"))
    run_cli(lockstep, "manifest", "pin", "--checkpoint", ck, "-o", os.path.join(base, "m.json"))
    run_cli(lockstep, "manifest", "pin", "--checkpoint", os.path.join(base, "ck2"), "-o", os.path.join(base, "m2.json"))
    fp = json.loads(run_cli(lockstep, "fingerprint", "--checkpoint", ck, "--json"))["merkle_root"]
    write(os.path.join(base, "fingerprint.txt"), fp + "\n")

    c = Checkpoints(ck, os.path.join(out, "ck"))
    make_checkpoints(c)
    make_configs(c)
    make_checkpoint_layout(c, os.path.join(out, "layout"), os.path.join(base, "shard"))
    make_qwen35(os.path.join(out, "q35"), base)
    make_jsonl(out)
    values = make_traces(os.path.join(out, "trace"), base)
    make_manifests(os.path.join(out, "manifest"), base)
    make_synth_configs(os.path.join(out, "synth"), json.loads(read(cfg_path)))
    values["FP"] = fp
    return values


if __name__ == "__main__":
    main()
