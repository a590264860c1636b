#!/usr/bin/env python3
"""Our own PyTorch port of the DeepSeek-V4 forward pass (architecture.md §3-§5).

One-shot prefill over the whole prompt (positions 0..S-1) computing logits at EVERY position.

Two numerics modes:
  deepseek  the OFFICIAL reference numerics (§5): per-128 FP8 activation quantization with the
            power-of-two e8m0 scale rule before every FP8/FP4 GEMM and per-K-tile scaled fp32
            accumulation, KV FP8 simulation on the non-rope dims (64-blocks), indexer Hadamard +
            FP4 simulation, bf16 rounding at every place §5 lists, bf16-arithmetic q head norm,
            fp32 compressor / router / mHC / head.
  plain     the same code with every quantization simulation and bf16 rounding switched off:
            pure fp32 on the dequantized weights (what transformers computes in float32).

Attention softmax (both modes) uses an exact two-pass max: m = max of the valid logits of the
query row (the sink does NOT join the max), p_j = exp(l_j - m), den = sum_j p_j + exp(sink - m).
In deepseek mode P is rounded to bf16 before P.V (the denominator keeps the fp32 p). The
reference kernel is an online softmax over 64-index blocks; its running-max rescaling makes its
bf16(p) differ from ours in the last bit now and then - an accepted residual.

Canonical arithmetic (both modes), shared with the C++ CPU backend: every sum and matrix product
accumulates in float64 and is rounded once to float32, and exp, sqrt, rsqrt, sin/cos, sigmoid, silu
and softplus are evaluated in float64 and rounded once. Results are then (but for rare double-rounding
ties) the correctly rounded values whatever the reduction order, so this port and the engine agree
bit for bit where they follow the same definition. Without it, a last-bit difference from a
library's reduction order flips a later FP8 quantization decision now and then, and the random
test models amplify that to whole logits.

Tie-breaking (deepseek mode): the indexer top-k runs on bf16 scores, where exact ties are
common; we order by (score descending, compressed-row index ascending) via a stable sort. The
router top-k uses the same rule (fp32 ties are practically absent).

Usage:
  port.py --ckpt DIR --tokens tokens.json --mode deepseek|plain --out logits.f32
          [--mtp-out mtp.f32] [--dump DIR --dump-tokens N]
`--dump` writes DIR/manifest.json ({name: shape}) and DIR/<name>.f32 (raw little-endian
float32) for the first N tokens of the run (default: all), names like l{i}.hc_attn.u,
l{i}.attn.x, l{i}.attn.qr, l{i}.attn.q, l{i}.attn.kv, l{i}.attn.o, l{i}.attn.out,
l{i}.hc_attn.X, l{i}.ffn.x, l{i}.ffn.out, l{i}.hc_ffn.X, final.y, logits (see README.md).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stfile  # noqa: E402

torch.set_grad_enabled(False)

F32 = torch.float32


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Canonical matrix product: float64 accumulation, rounded once to float32."""
    return (a.double() @ b.double()).float()


def dsum(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """Canonical sum: float64 accumulation, rounded once to float32."""
    return x.double().sum(dim, keepdim=keepdim).float()


def dmean_sq(x: torch.Tensor) -> torch.Tensor:
    """mean(x^2) over the last dim with exact squares, float64 accumulation, rounded once."""
    xd = x.double()
    return ((xd * xd).sum(-1, keepdim=True) / x.shape[-1]).float()


def fexp(x):
    return torch.exp(x.double()).float()


def frsqrt(x):
    return (1.0 / torch.sqrt(x.double())).float()


def fsqrt(x):
    return torch.sqrt(x.double()).float()


def fsigmoid(x):
    return (1.0 / (1.0 + torch.exp(-x.double()))).float()


def fsilu(x):
    xd = x.double()
    return (xd / (1.0 + torch.exp(-xd))).float()


def fsoftplus(x):
    """PyTorch's softplus (threshold 20) evaluated in float64."""
    return torch.where(x > 20.0, x, torch.log1p(torch.exp(x.double())).float())


def bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to bfloat16 (RNE), keep as float32."""
    return x.to(torch.bfloat16).to(F32)


def pow2_ceil(t: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 t) for positive normal float32 t, from the exponent bits (no log2f)."""
    bits = t.view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return ((e + 127) << 23).view(F32)


INV448 = torch.tensor(1.0 / 448.0, dtype=F32)
INV6 = torch.tensor(1.0 / 6.0, dtype=F32)


def act_quant(x: torch.Tensor, block: int):
    """Per-row, per-`block` FP8 quantization (§3.0 ActQuantFP8). x [..., K] (bf16 values).
    Returns q (e4m3 values as float32) [..., K/block, block] and scales s [..., K/block]."""
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    amax = xb.abs().amax(-1).clamp_min(1e-4)
    s = pow2_ceil(amax * INV448)
    q = stfile.round_e4m3((xb / s[..., None]).clamp(-448.0, 448.0))
    return q, s


def fp8_sim(x: torch.Tensor, block: int = 64) -> torch.Tensor:
    """In-place quantize->dequantize simulation: bf16(e4m3(x/s) * s)."""
    q, s = act_quant(x, block)
    return bf16((q * s[..., None]).reshape(x.shape))


def fp4_sim(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Indexer FP4 simulation (§3.0 FP4Sim): e2m1 RNE with a power-of-two scale per 32."""
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    amax = xb.abs().amax(-1).clamp_min(6.0 * 2.0 ** -126)
    s = pow2_ceil(amax * INV6)
    q = stfile.round_e2m1((xb / s[..., None]).clamp(-6.0, 6.0))
    return bf16((q * s[..., None]).reshape(x.shape))


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Sylvester Walsh-Hadamard butterfly over the last dim (natural order,
    strides 1, 2, 4, ...) in float64, times n^-0.5, rounded once to float32."""
    n = x.shape[-1]
    y = x.double()  # float64: the butterfly is exact
    h = 1
    while h < n:
        y = y.reshape(*x.shape[:-1], n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack([a + b, a - b], dim=-2)
        h *= 2
    return (y.reshape(x.shape) * (1.0 / math.sqrt(n))).float()


class Dump:
    """Collects named intermediates for the first n tokens."""

    def __init__(self, n):
        self.n = n
        self.items = {}

    def __call__(self, name, t, rows=None):
        t = t.detach().to(F32)
        self.items[name] = t[: (self.n if rows is None else rows)].clone()

    def write(self, d):
        os.makedirs(d, exist_ok=True)
        man = {}
        for k, v in self.items.items():
            v.contiguous().numpy().astype("<f4").tofile(os.path.join(d, k + ".f32"))
            man[k] = list(v.shape)
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(man, f, indent=1)
            f.write("\n")


class NoDump:
    def __call__(self, *a, **k):
        pass


class Port:
    def __init__(self, ckpt_dir: str | None, mode: str, cfg: dict | None = None, tensors: dict | None = None):
        """Loads `ckpt_dir`, or uses an in-memory (cfg, tensors) pair (checkpoint calibration)."""
        assert mode in ("deepseek", "plain")
        self.ds = mode == "deepseek"
        if ckpt_dir is not None:
            with open(os.path.join(ckpt_dir, "config.json")) as f:
                cfg = json.load(f)
            tensors = stfile.read_checkpoint(ckpt_dir)
        self.cfg = c = cfg
        self.t = tensors
        self.D = c["hidden_size"]
        self.H = c["num_attention_heads"]
        self.hd = c["head_dim"]
        self.rd = c["qk_rope_head_dim"]
        self.hc = c["hc_mult"]
        self.eps = c["rms_norm_eps"]
        self.hc_eps = c["hc_eps"]
        self.window = c["sliding_window"]
        self.n_layers = c["num_hidden_layers"]
        self.ratios = c["compress_ratios"]
        self.E = c["n_routed_experts"]
        self.topk = c["num_experts_per_tok"]
        self.lim = c["swiglu_limit"]
        self.G = c["o_groups"]
        self.ih = c["index_n_heads"]
        self.idim = c["index_head_dim"]
        self.itopk = c["index_topk"]
        self.cache = {}
        self.rope_main = self._rope_freqs(c["rope_theta"], None)
        self.rope_comp = self._rope_freqs(c["compress_rope_theta"], c.get("rope_scaling"))

    # ------------------------------------------------------------------ weights
    def w_f32(self, name):
        """Dequantized / up-cast fp32 weight for `name` (no .weight suffix handling here)."""
        if name not in self.cache:
            t = self.t
            if name + ".scale" in t:
                w, s = t[name + ".weight"], t[name + ".scale"]
                if w.dtype == torch.int8:
                    self.cache[name] = stfile.dequant_fp4(w, s)
                else:
                    self.cache[name] = stfile.dequant_fp8(w, s)
            elif name + ".weight" in t:
                self.cache[name] = t[name + ".weight"].to(F32)
            else:
                self.cache[name] = t[name].to(F32)
        return self.cache[name]

    def lin_fp8(self, x, name):
        """FP8 Linear (§3.0): act-quant per 128, per-K-tile fp32 partials scaled by s_x*s_W."""
        if not self.ds:
            return mm(x, self.w_f32(name).T)
        key = name + "#fp8"
        if key not in self.cache:
            w = stfile.e4m3_to_f32(self.t[name + ".weight"])
            s = stfile.e8m0_to_f32(self.t[name + ".scale"])
            self.cache[key] = (w, s.repeat_interleave(128, 0)[: w.shape[0]])  # s per output row
        w, s_w = self.cache[key]
        shp = x.shape
        x2 = x.reshape(-1, shp[-1])
        qx, sx = act_quant(x2, 128)
        acc = torch.zeros(x2.shape[0], w.shape[0], dtype=F32)
        for k in range(qx.shape[1]):
            part = mm(qx[:, k], w[:, k * 128:(k + 1) * 128].T)
            acc += part * (sx[:, k, None] * s_w[None, :, k])
        return bf16(acc).reshape(*shp[:-1], w.shape[0])

    def lin_fp4(self, x, name):
        """FP4 Linear (§3.0): act-quant per 128; K tiles of 32: (partial * s_x) * s_W."""
        if not self.ds:
            return mm(x, self.w_f32(name).T)
        key = name + "#fp4"
        if key not in self.cache:
            w = stfile.e2m1_decode(stfile.unpack_fp4(self.t[name + ".weight"]))
            s = stfile.e8m0_to_f32(self.t[name + ".scale"])
            self.cache[key] = (w, s)
        w, s_w = self.cache[key]
        qx, sx = act_quant(x, 128)
        qx = qx.reshape(x.shape[0], -1)
        acc = torch.zeros(x.shape[0], w.shape[0], dtype=F32)
        for k in range(w.shape[1] // 32):
            part = mm(qx[:, k * 32:(k + 1) * 32], w[:, k * 32:(k + 1) * 32].T)
            acc += (part * sx[:, k // 4, None]) * s_w[None, :, k]
        return bf16(acc)

    def lin_bf16(self, x, name):
        """BF16 GEMM: bf16 x bf16, fp32 accumulate, bf16 out (plain: fp32)."""
        y = mm(x, self.w_f32(name).T)
        return bf16(y) if self.ds else y

    def rms(self, x, name):
        """RMSNorm: fp32, weight applied in fp32 before the (deepseek) bf16 rounding."""
        w = self.w_f32(name)
        y = w * (x * frsqrt(dmean_sq(x) + self.eps))
        return bf16(y) if self.ds else y

    def bf(self, x):
        return bf16(x) if self.ds else x

    # ------------------------------------------------------------------ rope
    def _rope_freqs(self, base, scaling):
        rd = self.rd
        f = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=F32) / rd))
        if scaling and scaling.get("type", scaling.get("rope_type")) == "yarn":
            L = scaling["original_max_position_embeddings"]
            factor = scaling["factor"]

            def corr(rot):
                return rd * math.log(L / (rot * 2 * math.pi)) / (2 * math.log(base))

            low = max(math.floor(corr(scaling["beta_fast"])), 0)
            high = min(math.ceil(corr(scaling["beta_slow"])), rd - 1)
            if low == high:
                high += 0.001
            ramp = ((torch.arange(rd // 2, dtype=F32) - low) / (high - low)).clamp(0, 1)
            smooth = 1 - ramp
            f = f / factor * (1 - smooth) + f * smooth
        return f

    def rope_cs(self, freqs, pos):
        ang = pos.to(F32)[:, None] * freqs[None, :]
        return torch.cos(ang.double()).float(), torch.sin(ang.double()).float()

    def rope(self, x, cs, inverse=False):
        """Interleaved rotation of the LAST rd dims of x [S, ..., n]; cos/sin [S, rd/2]."""
        c, s = cs
        while c.dim() < x.dim():
            c, s = c.unsqueeze(-2), s.unsqueeze(-2)
        if inverse:
            s = -s
        n = x.shape[-1] - self.rd
        xr = x[..., n:]
        a, b = xr[..., 0::2].double(), xr[..., 1::2].double()
        c, s = c.double(), s.double()
        ra = a * c - b * s  # 2-term dot products: float64 (exact products), rounded once
        rb = a * s + b * c
        rot = torch.stack([ra, rb], dim=-1).flatten(-2).float()
        return torch.cat([x[..., :n], self.bf(rot)], dim=-1)

    # ------------------------------------------------------------------ mHC
    def hc_pre(self, X, p):
        S, hc, D = X.shape
        x = X.reshape(S, hc * D)
        fn, base, scale = self.w_f32(p + "_fn"), self.w_f32(p + "_base"), self.w_f32(p + "_scale")
        rs = frsqrt(dmean_sq(x) + self.eps)
        mix = mm(x, fn.T) * rs
        pre = fsigmoid(mix[:, :hc] * scale[0] + base[:hc]) + self.hc_eps
        post = 2 * fsigmoid(mix[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
        M = mix[:, 2 * hc:].reshape(S, hc, hc) * scale[2] + base[2 * hc:].reshape(hc, hc)
        e = fexp(M - M.amax(-1, keepdim=True))
        M = e / dsum(e, -1, keepdim=True) + self.hc_eps
        M = M / (dsum(M, -2, keepdim=True) + self.hc_eps)
        for _ in range(self.cfg["hc_sinkhorn_iters"] - 1):
            M = M / (dsum(M, -1, keepdim=True) + self.hc_eps)
            M = M / (dsum(M, -2, keepdim=True) + self.hc_eps)
        u = dsum(pre.double()[:, :, None] * X.double(), 1)
        return self.bf(u), post, M

    def hc_post(self, a, R, post, comb):
        # X'[k] = post_k a + sum_j comb[j,k] R[j]
        y = post.double()[:, :, None] * a.double()[:, None, :] + comb.double().transpose(-1, -2) @ R.double()
        return self.bf(y.float())

    def hc_head(self, X, p):
        S, hc, D = X.shape
        x = X.reshape(S, hc * D)
        fn, base, scale = self.w_f32(p + "_fn"), self.w_f32(p + "_base"), self.w_f32(p + "_scale")
        rs = frsqrt(dmean_sq(x) + self.eps)
        mix = mm(x, fn.T) * rs
        pre = fsigmoid(mix * scale[0] + base) + self.hc_eps
        return self.bf(dsum(pre.double()[:, :, None] * X.double(), 1))

    # ------------------------------------------------------------------ attention parts
    def compressor(self, x, p, r, d, cs_fn, kind):
        """Gated pooling of complete windows (§3.4.3). Returns rows [floor(S/r), d]."""
        S = x.shape[0]
        nW = S // r
        if nW == 0:
            return torch.zeros(0, d, dtype=F32)
        ape = self.w_f32(p + "ape")
        a = mm(x, self.w_f32(p + "wkv").T)
        s = mm(x, self.w_f32(p + "wgate").T) + ape[torch.arange(S) % r]
        a = a[: nW * r].reshape(nW, r, -1)
        s = s[: nW * r].reshape(nW, r, -1)
        if r == 4:  # overlapping: A-halves of the previous window, B-halves of this one
            na = torch.zeros(nW, 2 * r, d, dtype=F32)
            ns = torch.full((nW, 2 * r, d), float("-inf"), dtype=F32)
            na[:, r:] = a[..., d:]
            ns[:, r:] = s[..., d:]
            na[1:, :r] = a[:-1, :, :d]
            ns[1:, :r] = s[:-1, :, :d]
            a, s = na, ns
        e = fexp(s - s.amax(1, keepdim=True))
        pooled = dsum((e / dsum(e, 1, keepdim=True)).double() * a.double(), 1)
        C = self.rms(self.bf(pooled), p + "norm")
        C = self.rope(C, cs_fn(torch.arange(nW) * r))
        if self.ds:
            if kind == "attn":
                C = torch.cat([fp8_sim(C[:, : d - self.rd], 64), C[:, d - self.rd:]], dim=-1)
            else:
                C = fp4_sim(bf16(hadamard(C)))
        return C

    def indexer(self, x, qr, p, cs, cs_fn, dump, il):
        """Lightning indexer (§3.5): returns a bool mask [S, T] of the selected rows."""
        S = x.shape[0]
        KI = self.compressor(x, p + "compressor.", 4, self.idim, cs_fn, "index")
        T = KI.shape[0]
        q = self.lin_fp8(qr, p + "wq_b").reshape(S, self.ih, self.idim)
        q = self.rope(q, cs)
        if self.ds:
            q = fp4_sim(bf16(hadamard(q)))
        c = torch.tensor(self.idim ** -0.5 * self.ih ** -0.5, dtype=F32)
        wts = self.lin_bf16(x, p + "weights_proj")
        wts = self.bf(wts * c)
        dump(f"l{il}.idx.q", q)
        dump(f"l{il}.idx.kv", KI, rows=dump.n // 4 if hasattr(dump, "n") else None)
        dump(f"l{il}.idx.w", wts)
        if T == 0:
            return torch.zeros(S, 0, dtype=torch.bool)
        dots = self.bf(torch.einsum("shd,td->sht", q.double(), KI.double()).float())
        score = self.bf(dsum(self.bf(torch.relu(dots) * wts[:, :, None]), 1))  # [S, T]
        t = torch.arange(S)
        nvis = (t + 1) // 4
        visible = torch.arange(T)[None, :] < nvis[:, None]
        score = score.masked_fill(~visible, float("-inf"))
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices
        k = torch.clamp(nvis, max=self.itopk)
        take = torch.arange(T)[None, :] < k[:, None]
        sel = torch.zeros(S, T, dtype=torch.bool)
        sel.scatter_(1, order, take)
        if hasattr(dump, "n"):
            n = dump.n
            kk = min(self.itopk, T)
            idx = torch.where(take[:n, :kk], order[:n, :kk], torch.full_like(order[:n, :kk], -1))
            dump(f"l{il}.idx.score", score[:n, : n // 4])
            dump(f"l{il}.idx.sel", idx[:, : min(kk, n // 4)].to(F32))
        return sel

    def attention(self, il, x, prefix, r, dump):
        S = x.shape[0]
        pos = torch.arange(S)
        freqs = self.rope_main if r == 0 else self.rope_comp

        def cs_fn(pp):
            return self.rope_cs(freqs, pp)

        cs = cs_fn(pos)
        a = prefix + "attn."
        qr = self.rms(self.lin_fp8(x, a + "wq_a"), a + "q_norm")
        q = self.lin_fp8(qr, a + "wq_b").reshape(S, self.H, self.hd)
        if self.ds:  # weightless per-head RMSNorm in bf16 arithmetic
            m = bf16((bf16(q * q).double().sum(-1, keepdim=True) / self.hd).float())
            rr = bf16(frsqrt(bf16(m + self.eps)))
            q = bf16(q * rr)
        else:
            q = q * frsqrt(dmean_sq(q) + self.eps)
        q = self.rope(q, cs)
        kv = self.rms(self.lin_fp8(x, a + "wkv"), a + "kv_norm")
        kv = self.rope(kv, cs)
        if self.ds:
            kv = torch.cat([fp8_sim(kv[:, : self.hd - self.rd], 64), kv[:, self.hd - self.rd:]], dim=-1)
        dump(f"l{il}.attn.qr", qr)
        dump(f"l{il}.attn.q", q)
        dump(f"l{il}.attn.kv", kv)

        # compressed rows and which of them each query uses
        if r != 0:
            C = self.compressor(x, a + "compressor.", r, self.hd, cs_fn, "attn")
            if hasattr(dump, "n"):
                dump(f"l{il}.comp.kv", C, rows=dump.n // r)
            T = C.shape[0]
            if r == 4:
                cmask = self.indexer(x, qr, a + "indexer.", cs, cs_fn, dump, il)
            else:
                cmask = torch.arange(T)[None, :] < ((pos + 1) // r)[:, None]
        else:
            C = torch.zeros(0, self.hd)
            cmask = torch.zeros(S, 0, dtype=torch.bool)

        sink = self.w_f32(a + "attn_sink")
        scale = torch.tensor(self.hd ** -0.5, dtype=F32)
        o = torch.empty(S, self.H, self.hd, dtype=F32)
        W = self.window
        CH = 256
        for q0 in range(0, S, CH):
            q1 = min(S, q0 + CH)
            r0 = max(0, q0 - W + 1)
            rows = torch.cat([kv[r0:q1], C], dim=0)  # raw window rows, then compressed rows
            tq = pos[q0:q1, None]
            tj = pos[None, r0:q1]
            valid = torch.cat([(tj <= tq) & (tj > tq - W), cmask[q0:q1]], dim=1)  # [n, R]
            lg = torch.einsum("shd,rd->hsr", q[q0:q1].double(), rows.double()).float() * scale
            lg = lg.masked_fill(~valid[None], float("-inf"))
            mx = lg.amax(-1, keepdim=True)  # pass 1: exact max of the valid logits (no sink)
            pe = fexp(lg - mx)  # pass 2
            den = (pe.double().sum(-1, keepdim=True) + fexp(sink[:, None, None] - mx).double()).float()
            oo = mm(self.bf(pe), rows) / den
            o[q0:q1] = self.bf(oo).transpose(0, 1)
        o = self.rope(o, cs, inverse=True)
        dump(f"l{il}.attn.o", o)
        G = self.G
        wa = self.w_f32(a + "wo_a")  # BF16 GEMM on the dequantized wo_a
        wa = wa.reshape(G, -1, wa.shape[-1])
        z = torch.einsum("sgi,goi->sgo", o.reshape(S, G, -1).double(), wa.double()).float()
        z = self.bf(z).reshape(S, -1)
        out = self.lin_fp8(z, a + "wo_b")
        dump(f"l{il}.attn.out", out)
        return out

    # ------------------------------------------------------------------ MoE
    def moe(self, il, x, tok, prefix, hash_layer, dump):
        S = x.shape[0]
        f = prefix + "ffn."
        logits = mm(x, self.w_f32(f + "gate.weight").T)
        s = fsqrt(fsoftplus(logits))
        if hash_layer:
            sel = self.t[f + "gate.tid2eid"][tok].long()
        else:
            biased = s + self.w_f32(f + "gate.bias")
            sel = torch.sort(biased, dim=-1, descending=True, stable=True).indices[:, : self.topk]
        w = s.gather(1, sel)
        w = w / dsum(w, -1, keepdim=True) * self.cfg["routed_scaling_factor"]
        dump(f"l{il}.ffn.gate.idx", sel.to(F32))
        dump(f"l{il}.ffn.gate.w", w)
        Y = torch.zeros(S, self.D, dtype=torch.float64)
        for e in range(self.E):
            tok_idx, k_idx = torch.where(sel == e)
            if tok_idx.numel() == 0:
                continue
            xe = x[tok_idx]
            pe = f + f"experts.{e}."
            g = self.lin_fp4(xe, pe + "w1").clamp(max=self.lim)
            u = self.lin_fp4(xe, pe + "w3").clamp(-self.lim, self.lim)
            h = self.bf(fsilu(g) * u * w[tok_idx, k_idx, None])
            Y.index_add_(0, tok_idx, self.lin_fp4(h, pe + "w2").double())
        sp = f + "shared_experts."
        g = self.lin_fp8(x, sp + "w1").clamp(max=self.lim)
        u = self.lin_fp8(x, sp + "w3").clamp(-self.lim, self.lim)
        sh = self.lin_fp8(self.bf(fsilu(g) * u), sp + "w2")
        return self.bf((Y + sh.double()).float())

    # ------------------------------------------------------------------ model
    def block(self, il, X, tok, prefix, r, hash_layer, dump):
        u, post, comb = self.hc_pre(X, prefix + "hc_attn")
        x = self.rms(u, prefix + "attn_norm")
        dump(f"l{il}.hc_attn.u", u)
        dump(f"l{il}.hc_attn.post", post)
        dump(f"l{il}.hc_attn.comb", comb)
        dump(f"l{il}.attn.x", x)
        a = self.attention(il, x, prefix, r, dump)
        X = self.hc_post(a, X, post, comb)
        dump(f"l{il}.hc_attn.X", X)
        u, post, comb = self.hc_pre(X, prefix + "hc_ffn")
        x = self.rms(u, prefix + "ffn_norm")
        dump(f"l{il}.hc_ffn.u", u)
        dump(f"l{il}.ffn.x", x)
        m = self.moe(il, x, tok, prefix, hash_layer, dump)
        dump(f"l{il}.ffn.out", m)
        X = self.hc_post(m, X, post, comb)
        dump(f"l{il}.hc_ffn.X", X)
        return X

    def forward(self, tokens, dump=None, mtp=False):
        """Logits at every position; with mtp, also the MTP block's (see mtp())."""
        dump = dump if dump is not None else NoDump()
        tok = torch.tensor(tokens, dtype=torch.long)
        S = tok.shape[0]
        e = self.w_f32("embed.weight")[tok]
        dump("embed", e)
        X = e[:, None, :].expand(S, self.hc, self.D).contiguous()
        for il in range(self.n_layers):
            X = self.block(il, X, tok, f"layers.{il}.", self.ratios[il],
                           il < self.cfg["num_hash_layers"], dump)
        y = self.hc_head(X, "hc_head")
        dump("final.y", y)
        z = self.rms(y, "norm")
        dump("final.z", z)
        logits = mm(z, self.w_f32("head").T)
        dump("logits", logits)
        return (logits, self.mtp(X, tok, dump)) if mtp else logits

    def mtp(self, X, tok, dump):
        """The MTP block (§3.8) at positions 0..S-2: position p pairs the main model's final hc state
        X[p] (before the HC head) with token p+1, runs as the block's own sliding-window layer at
        position p, and its logits draft token p+2. Returns [S-1, vocab]."""
        S = X.shape[0] - 1
        p = "mtp.0."
        e = self.rms(self.w_f32("embed.weight")[tok[1:]], p + "enorm")
        hn = self.rms(X[:S], p + "hnorm")  # each hc stream normalised on its own
        X0 = self.bf(self.lin_fp8(e, p + "e_proj")[:, None, :] + self.lin_fp8(hn, p + "h_proj"))
        X1 = self.block(self.n_layers, X0, tok[1:], p, self.ratios[self.n_layers], False, dump)
        y = self.hc_head(X1, p + "hc_head")
        dump("mtp.y", y)
        z = self.rms(y, p + "norm")
        logits = mm(z, self.w_f32("head").T)
        dump("mtp.logits", logits)
        return logits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--tokens", required=True, help='tokens.json ({"tokens": [...]})')
    ap.add_argument("--mode", choices=["deepseek", "plain"], default="deepseek")
    ap.add_argument("--n", type=int, default=None, help="use only the first n tokens")
    ap.add_argument("--out", help="write logits [n_tokens, vocab] as raw LE float32")
    ap.add_argument("--mtp-out", help="also run the MTP block; write its logits [n_tokens - 1, vocab]")
    ap.add_argument("--dump", help="directory for named intermediates")
    ap.add_argument("--dump-tokens", type=int, default=None, help="dump the first N tokens only")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with open(args.tokens) as f:
        tokens = json.load(f)["tokens"]
    if args.n is not None:
        tokens = tokens[: args.n]
    port = Port(args.ckpt, args.mode)
    dump = Dump(args.dump_tokens or len(tokens)) if args.dump else None
    logits = port.forward(tokens, dump, mtp=bool(args.mtp_out))
    if args.mtp_out:
        logits, mtp_logits = logits
        mtp_logits.contiguous().numpy().astype("<f4").tofile(args.mtp_out)
    if args.out:
        logits.contiguous().numpy().astype("<f4").tofile(args.out)
    if dump is not None:
        dump.write(args.dump)
    print(f"{args.mode}: {len(tokens)} tokens, logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()
