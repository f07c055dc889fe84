#!/usr/bin/env python3
"""A slow, plain Python/numpy float32 model of lockstep's strict math
(docs/numerics.md) for ONE token position of a Gated DeltaNet layer and of the
MoE block, to debug the C engine against: every operation is an fp32 scalar
operation in the contract's order, so the results should equal the C
reference bit for bit.

    from ref_strict import *
    W = load_layer("goldens/qwen3next_tiny_a", 0)
    out, conv_state, S = gdn_token(cfg, W, x, conv_state, S)      # x: normed input, fp32[D]
    out = moe_token(cfg, W, x)

`act` rounds to bf16 (default) or is the identity (--activations fp32): pass
bf16=False. lsmath is reproduced bit-exactly (fmaf emulated with exact
rational arithmetic); `python3 ref_strict.py --selftest` checks it against a
few fixed values and runs one token of each block on a golden checkpoint.
"""
import json
import math
import os
import struct
import sys
from fractions import Fraction

import numpy as np

F = np.float32


# ---- bits ------------------------------------------------------------------------

def bits(x):
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def from_bits(u):
    return F(struct.unpack("<f", struct.pack("<I", u & 0xffffffff))[0])


def bf16(x):
    """fp32 -> nearest bf16 (ties to even) -> fp32, as reduce.h ls_round_bf16."""
    u = bits(x)
    if (u & 0x7fffffff) > 0x7f800000:
        return from_bits(((u >> 16) | 0x40) << 16)
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffffffff
    return from_bits(u & 0xffff0000)


# ---- fmaf: a*b + c rounded once to fp32 -------------------------------------------

def fmaf(a, b, c):
    a, b, c = F(a), F(b), F(c)
    if not (np.isfinite(a) and np.isfinite(b) and np.isfinite(c)):
        return F(float(a) * float(b) + float(c))
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if exact == 0:
        return F(float(a) * float(b) + float(c))  # sign of zero as IEEE
    d = float(exact)                   # correctly rounded to double
    f = F(d)
    if float(f) != d:                  # d between two floats: guard the double rounding
        lo, hi = (f, np.nextafter(f, F(np.inf))) if float(f) < d else (np.nextafter(f, F(-np.inf)), f)
        mid = (Fraction(float(lo)) + Fraction(float(hi))) / 2
        if exact != mid:
            f = lo if exact < mid else hi
    return F(f)


# ---- lsmath (src/numerics/lsmath.h, same operations in the same order) -----------------

LN2_HI, LN2_LO, LOG2E, MAGIC = F(0.693145751953125), F(1.428606765330187045e-06), F(1.44269504088896340736), F(12582912.0)


def pow2f(k):
    return from_bits((k + 127) << 23)


def ls_expf(x):
    x = F(x)
    if x != x:
        return x + x
    if x > F(88.72283172607421875):
        return F(np.inf)
    if x < F(-104.0):
        return F(0.0)
    t = x * LOG2E + MAGIC
    kf = t - MAGIC
    k = int(kf)
    r = fmaf(-kf, LN2_HI, x)
    r = fmaf(-kf, LN2_LO, r)
    q = F(1.0) / F(5040.0)
    for c in (F(1.0) / F(720.0), F(1.0) / F(120.0), F(1.0) / F(24.0), F(1.0) / F(6.0), F(0.5), F(1.0)):
        q = fmaf(q, r, c)
    p = fmaf(q, r, F(1.0))
    k1 = int(k / 2)                    # C division truncates toward zero
    k2 = k - k1
    return (p * pow2f(k1)) * pow2f(k2)


def log1p_kernel(f, e, c):
    s = f / (F(2.0) + f)
    z = s * s
    R = F(2.0) / F(9.0)
    for co in (F(2.0) / F(7.0), F(2.0) / F(5.0), F(2.0) / F(3.0)):
        R = fmaf(R, z, co)
    R = R * z
    hf = F(0.5) * f * f
    tail = fmaf(s, hf + R, fmaf(e, LN2_LO, c))
    return e * LN2_HI + (f - (hf - tail))


def split_log(u):
    b = bits(u)
    ex = (b >> 23) - 127
    mb = (b & 0x007fffff) | 0x3f800000
    if mb > 0x3fb504f3:
        mb -= 0x00800000
        ex += 1
    return from_bits(mb) - F(1.0), ex


def ls_logf(x):
    x = F(x)
    b = bits(x)
    if x != x:
        return x + x
    if (b & 0x7fffffff) == 0:
        return F(-np.inf)
    if b >> 31:
        return F(np.nan)
    if b == 0x7f800000:
        return x
    bias = 0
    if b < 0x00800000:
        x = x * F(8388608.0)
        bias = -23
    f, e = split_log(x)
    return log1p_kernel(f, F(e + bias), F(0.0))


def ls_log1pf(x):
    x = F(x)
    if x != x:
        return x + x
    if x < F(-1.0):
        return F(np.nan)
    if x == F(-1.0):
        return F(-np.inf)
    if bits(x) == 0x7f800000:
        return x
    if x == F(0.0):
        return x
    if F(-0.29289321881) < x < F(0.41421356237):
        return log1p_kernel(x, F(0.0), F(0.0))
    u = F(1.0) + x
    err = F(1.0) - (u - x) if x > F(1.0) else x - (u - F(1.0))
    f, e = split_log(u)
    return log1p_kernel(f, F(e), err / u)


def ls_sigmoidf(x):
    return F(1.0) / (F(1.0) + ls_expf(-F(x)))


def ls_siluf(x):
    return F(x) / (F(1.0) + ls_expf(-F(x)))


def ls_softplusf(x):
    x = F(x)
    return x if x > F(20.0) else ls_log1pf(ls_expf(x))


def ls_rsqrtf(x):
    return F(1.0) / np.sqrt(F(x))


# ---- reductions (src/numerics/reduce.h) ---------------------------------------------

def dot32(a, b):
    """LS_DOT32: 32 lane partials, lane k % 32, then the butterfly."""
    p = [F(0.0)] * 32
    for k in range(len(a)):
        p[k % 32] = p[k % 32] + F(a[k]) * F(b[k])
    s = 16
    while s >= 1:
        for l in range(s):
            p[l] = p[l] + p[l + s]
        s //= 2
    return p[0]


def sum32(a):
    """LS_DOT32 order applied to a plain sum."""
    p = [F(0.0)] * 32
    for k in range(len(a)):
        p[k % 32] = p[k % 32] + F(a[k])
    s = 16
    while s >= 1:
        for l in range(s):
            p[l] = p[l] + p[l + s]
        s //= 2
    return p[0]


def seqsum(a):
    s = F(0.0)
    for v in a:
        s = s + F(v)
    return s


# ---- operators (docs/numerics.md §3) -------------------------------------------------

class Ctx:
    def __init__(self, bf16_acts=True):
        self.bf16 = bf16_acts

    def act(self, x):
        return bf16(x) if self.bf16 else F(x)


def linear(ctx, W, x):
    """W: fp32 [out, in] (bf16 values), x: fp32 [in] -> [out]"""
    return [ctx.act(dot32(W[o], x)) for o in range(W.shape[0])]


def rmsnorm(ctx, x, w, eps=F(1e-6)):
    r = ls_rsqrtf(dot32(x, x) / F(len(x)) + eps)
    return [ctx.act((F(x[i]) * r) * (F(1.0) + F(w[i]))) for i in range(len(x))]


def gated_rmsnorm(ctx, x, z, w, eps=F(1e-6)):
    r = ls_rsqrtf(dot32(x, x) / F(len(x)) + eps)
    out = []
    for i in range(len(x)):
        n = ctx.act(F(x[i]) * r)
        p = ctx.act(F(w[i]) * n)
        out.append(ctx.act(p * ls_siluf(z[i])))
    return out


def l2norm(x):
    r = ls_rsqrtf(dot32(x, x) + F(1e-6))
    return [F(v) * r for v in x]


# ---- checkpoint ----------------------------------------------------------------------

def load_config(ckpt):
    with open(os.path.join(ckpt, "config.json")) as f:
        return json.load(f)


def load_layer(ckpt, layer):
    """All tensors of model.layers.<layer> as fp32 numpy arrays (bf16 widened)."""
    from safetensors import safe_open
    pre = "model.layers.%d." % layer
    out = {}
    with safe_open(os.path.join(ckpt, "model.safetensors"), "pt") as f:
        for k in f.keys():
            if k.startswith(pre):
                out[k[len(pre):]] = f.get_tensor(k).float().numpy().astype(np.float32)
    return out


# ---- one GDN token (fused projections docs/model.md §2.3, ops docs/numerics.md §3) -----

def gdn_token(cfg, W, x, conv_state, S, bf16_acts=True):
    """x: normed input fp32[D]; conv_state: fp32 [K-1][conv_dim] (previous X rows,
    oldest first, zeros at sequence start); S: fp32 [H_v][d_k][d_v].
    Returns (out fp32[D], new conv_state, new S)."""
    ctx = Ctx(bf16_acts)
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    r = Hv // Hk
    P = linear(ctx, W["linear_attn.in_proj_qkvz.weight"], x)
    R = linear(ctx, W["linear_attn.in_proj_ba.weight"], x)
    blk = 2 * dk + 2 * r * dv
    q, k, v, z, b, a = [], [], [], [], [], []
    for g in range(Hk):
        o = g * blk
        q += P[o:o + dk]
        k += P[o + dk:o + 2 * dk]
        v += P[o + 2 * dk:o + 2 * dk + r * dv]
        z += P[o + 2 * dk + r * dv:o + blk]
        b += R[g * 2 * r:g * 2 * r + r]
        a += R[g * 2 * r + r:g * 2 * r + 2 * r]
    X = q + k + v                                  # de-interleaved conv input
    cw = W["linear_attn.conv1d.weight"]            # [conv_dim, 1, K]
    rows = [list(rw) for rw in conv_state] + [X]   # K rows, oldest first
    Y = []
    for c in range(len(X)):
        s = F(0.0)
        for j in range(K):
            s = s + F(cw[c, 0, j]) * F(rows[j][c])
        Y.append(ctx.act(ls_siluf(ctx.act(s))))
    new_conv = rows[1:]
    qh = [l2norm(Y[h * dk:(h + 1) * dk]) for h in range(Hk)]
    kh = [l2norm(Y[Hk * dk + h * dk:Hk * dk + (h + 1) * dk]) for h in range(Hk)]
    vh = [Y[2 * Hk * dk + h * dv:2 * Hk * dk + (h + 1) * dv] for h in range(Hv)]
    scale = F(1.0 / math.sqrt(dk))
    A_log, dt_bias = W["linear_attn.A_log"], W["linear_attn.dt_bias"]
    S = [[list(map(F, row)) for row in Sh] for Sh in S]
    o_all = []
    for h in range(Hv):
        kk, qq = kh[h // r], [qi * scale for qi in qh[h // r]]
        beta = ctx.act(ls_sigmoidf(b[h]))
        gg = -ls_expf(A_log[h]) * ls_softplusf(F(a[h]) + F(dt_bias[h]))
        alpha = ls_expf(gg)
        Sp = [[alpha * S[h][i][j] for j in range(dv)] for i in range(dk)]
        out_h = []
        for j in range(dv):
            m = dot32([Sp[i][j] for i in range(dk)], kk)
            u = (F(vh[h][j]) - m) * beta
            for i in range(dk):
                Sp[i][j] = Sp[i][j] + kk[i] * u
        for j in range(dv):
            out_h.append(ctx.act(dot32([Sp[i][j] for i in range(dk)], qq)))
        S[h] = Sp
        o_all += gated_rmsnorm(ctx, out_h, z[h * dv:(h + 1) * dv], W["linear_attn.norm.weight"])
    out = linear(ctx, W["linear_attn.out_proj.weight"], o_all)
    return out, new_conv, S


# ---- one MoE token (docs/numerics.md §3: router, top-k, renormalise, experts, combine) --

def moe_token(cfg, W, x, bf16_acts=True):
    ctx = Ctx(bf16_acts)
    E, topk = cfg["num_experts"], cfg["num_experts_per_tok"]
    rl = linear(ctx, W["mlp.gate.weight"], x)
    m = max(rl)
    e = [ls_expf(v - m) for v in rl]
    tot = sum32(e)
    pi = [v / tot for v in e]
    order = sorted(range(E), key=lambda i: (-float(pi[i]), i))[:topk]
    if cfg.get("norm_topk_prob", True):
        s = seqsum([pi[i] for i in order])
        w = [ctx.act(pi[i] / s) for i in order]
    else:
        w = [ctx.act(pi[i]) for i in order]

    def mlp(pre, xx):
        g = linear(ctx, W[pre + "gate_proj.weight"], xx)
        u = linear(ctx, W[pre + "up_proj.weight"], xx)
        mm = [ctx.act(ctx.act(ls_siluf(g[i])) * u[i]) for i in range(len(g))]
        return linear(ctx, W[pre + "down_proj.weight"], mm)

    D = len(x)
    routed = [F(0.0)] * D
    for idx, ex in enumerate(order):
        y = mlp("mlp.experts.%d." % ex, x)
        c = [ctx.act(y[d] * w[idx]) for d in range(D)]
        routed = [routed[d] + c[d] for d in range(D)]
    routed = [ctx.act(v) for v in routed]
    sh = mlp("mlp.shared_expert.", x)
    gam = ctx.act(ls_sigmoidf(ctx.act(dot32(W["mlp.shared_expert_gate.weight"][0], x))))
    sh = [ctx.act(gam * v) for v in sh]
    return [ctx.act(routed[d] + sh[d]) for d in range(D)], order, w


# ---- self-test ---------------------------------------------------------------------------

def _selftest(ckpt):
    # bit patterns from tests/test_lsmath.c expectations (spot values)
    for x in (0.0, 1.0, -1.0, 0.5, 10.0, -50.0, 88.0, -100.0):
        got, want = ls_expf(F(x)), F(math.exp(float(F(x)))) if x > -88 else ls_expf(F(x))
        assert abs(int(bits(got)) - int(bits(want))) <= 1, (x, hex(bits(got)), hex(bits(want)))
    for x in (0.5, 1.0, 2.0, 1e-30, 3e38, 1.4142135):
        got, want = ls_logf(F(x)), F(math.log(float(F(x))))
        assert abs(int(bits(got)) - int(bits(want))) <= 1, (x, hex(bits(got)), hex(bits(want)))
    for x in (-0.5, 1e-5, 0.3, 2.0, 1e10):
        got, want = ls_log1pf(F(x)), F(math.log1p(float(F(x))))
        assert abs(int(bits(got)) - int(bits(want))) <= 1, (x, hex(bits(got)), hex(bits(want)))
    cfg = load_config(ckpt)
    lin = cfg["layer_types"].index("linear_attention")
    W = load_layer(ckpt, lin)
    D = cfg["hidden_size"]
    rng = np.random.default_rng(0)
    x = [bf16(F(v)) for v in rng.standard_normal(D)]
    xn = rmsnorm(Ctx(), x, W["input_layernorm.weight"])
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    conv_dim = 2 * Hk * dk + Hv * dv
    conv = [[F(0.0)] * conv_dim for _ in range(K - 1)]
    S = [[[F(0.0)] * dv for _ in range(dk)] for _ in range(Hv)]
    for t in range(3):
        out, conv, S = gdn_token(cfg, W, xn, conv, S)
    print("gdn layer %d token 2: out[0:4] = %s" % (lin, [hex(bits(v)) for v in out[:4]]))
    mo, order, w = moe_token(cfg, W, xn)
    print("moe layer %d: experts %s weights %s out[0:4] = %s" % (lin, order, [hex(bits(v)) for v in w],
                                                               [hex(bits(v)) for v in mo[:4]]))


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--selftest":
        here = os.path.dirname(os.path.abspath(__file__))
        _selftest(sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "..", "goldens", "qwen3next_tiny_a"))
    else:
        print(__doc__)
