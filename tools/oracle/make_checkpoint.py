#!/usr/bin/env python3
"""Writes a tiny random DeepSeek-V4 checkpoint in the OFFICIAL on-disk format.

  make_checkpoint.py --config tiny-flash --seed 1 --out DIR [--shards N]

Layout (architecture.md §2.1-§2.4): config.json with the HF keys of §1.1; native tensor names
(embed.weight, layers.{i}.*, norm.weight, head.weight, hc_head_*, mtp.0.*); FP8 E4M3 weights with
F8_E8M0 128x128 block scales in `<name>.scale`; routed experts as I8-packed FP4 (low nibble =
element 2j) with F8_E8M0 1x32 scales; BF16 norms / embed / head / compressor wkv, wgate /
indexer weights_proj / router gate; F32 hc_*, attn_sink, ape, gate.bias; I64 tid2eid on hash
layers only (distinct experts per row); gate.bias only on non-hash layers; MTP block = the
tensors of a ratio-0 layer with a biased router + e_proj/h_proj (FP8), enorm/hnorm/norm,
hc_head_*. With --shards N > 1: model-0000k-of-0000N.safetensors + model.safetensors.index.json.

Every tensor is drawn from its own generator seeded by (seed, crc32(name)), so the output is
deterministic and adding a tensor never perturbs the others.

Init (chosen so activations stay O(1), every expert gets traffic and the logits have a spread):
  linear weights  N(0, gain^2/fan_in) times a per-quantization-block factor 2^U(-1,1), so the
                  E8M0 block scales vary from block to block; gain 1 except the residual
                  writers (GAINS: wo_b, shared/expert w2 = 0.5);
  embed           (N(0,1) + mu)/sqrt(2) with one shared random direction mu (real LMs have one);
  RMSNorm weights U(0.8, 1.2);  attn_sink N(0.5, 1);  ape N(0, 0.5);
  hc_*_fn         N(0, 1/(hc*D)) (mixes O(1)), base N(0, 0.5), scale U(0.5, 1.5);
  indexer         rank-1 terms along mu keep the tiny (2-8 head) Lightning Indexer well-posed
                  (see build_tensors); router rows are orthogonal to the mu direction;
  head            Gaussian rows orthogonal to mu, times lognormal(0, 0.6) row norms: the heavier
                  upper tail of the logits makes near-ties at the top rarer than iid rows;
  calibrate()     balances the router biases (gate.bias) of the non-hash layers, removes the
                  mean final state from the head rows and scales the logit std to ~3.8.
"""
import argparse
import json
import math
import os
import sys
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stfile  # noqa: E402
from configs import CONFIGS  # noqa: E402


# Gains of the output projections of each sublayer (the residual-stream writers): the sublayer
# outputs come out at ~0.3-0.7 rms against a residual stream of ~1.2-1.9 rms.
GAINS = {"wo_a": 1.0, "wo_b": 0.5, "shared_w2": 0.5, "expert_w2": 0.5}
# Strength of the rank-1 indexer terms along the shared direction (q heads, keys, head weights).
# Tuned so that exact zero-score ties at the top-k boundary are absent in plain mode for all
# three configs (2, 4 and 8 indexer heads).
IDX_BOOST = {"q": 0.8, "k": 0.4, "w": 1.0}


class Gen:
    def __init__(self, seed):
        self.seed = seed

    def g(self, name):
        return torch.Generator().manual_seed((self.seed * 0x9E3779B1 + zlib.crc32(name.encode())) & 0x7FFFFFFFFFFF)

    def normal(self, name, shape, std=1.0, mean=0.0):
        return torch.randn(shape, generator=self.g(name), dtype=torch.float64).float() * std + mean

    def uniform(self, name, shape, lo, hi):
        return torch.rand(shape, generator=self.g(name), dtype=torch.float64).float() * (hi - lo) + lo


def ceil_log2_pow2(t: torch.Tensor) -> torch.Tensor:
    """Exponent e = ceil(log2 t) of positive normal float32 t via the exponent bits."""
    bits = t.float().view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127
    return e + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def quant_fp8_weight(w: torch.Tensor):
    """fp32 [out,in] -> (F8_E4M3 [out,in], F8_E8M0 [ceil(out/128), ceil(in/128)])."""
    out, inn = w.shape
    bo, bi = math.ceil(out / 128), math.ceil(inn / 128)
    amax = torch.zeros(bo, bi)
    for i in range(bo):
        for j in range(bi):
            amax[i, j] = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].abs().max()
    e = ceil_log2_pow2(amax.clamp_min(1e-30) * torch.tensor(1.0 / 448.0, dtype=torch.float32))
    s = torch.pow(2.0, e.double()).float()
    sf = s.repeat_interleave(128, 0)[:out].repeat_interleave(128, 1)[:, :inn]
    q = (w / sf).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def quant_fp4_weight(w: torch.Tensor):
    """fp32 [out,in] -> (I8 [out, in/2] packed e2m1, F8_E8M0 [out, in/32])."""
    out, inn = w.shape
    blocks = w.reshape(out, inn // 32, 32)
    amax = blocks.abs().amax(-1)
    e = ceil_log2_pow2(amax.clamp_min(1e-30) * torch.tensor(1.0 / 6.0, dtype=torch.float32))
    s = torch.pow(2.0, e.double()).float()
    codes = stfile.e2m1_codes((blocks / s[..., None]).clamp(-6, 6)).reshape(out, inn)
    return stfile.pack_fp4(codes), (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def build_tensors(cfg: dict, seed: int) -> dict:
    G = Gen(seed)
    T = {}
    D = cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    hd = cfg["head_dim"]
    ql = cfg["q_lora_rank"]
    og = cfg["o_groups"]
    ol = cfg["o_lora_rank"]
    E = cfg["n_routed_experts"]
    inter = cfg["moe_intermediate_size"]
    hc = cfg["hc_mult"]
    mix = (2 + hc) * hc
    V = cfg["vocab_size"]
    ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
    topk = cfg["num_experts_per_tok"]
    n_layers = cfg["num_hidden_layers"]
    ratios = cfg["compress_ratios"]
    assert len(ratios) == n_layers + cfg["num_nextn_predict_layers"]

    def block_factor(name, shape, bshape):
        """Per-block multiplier 2^U(-1,1) broadcast to `shape` with blocks `bshape`."""
        nb = [math.ceil(s / b) for s, b in zip(shape, bshape)]
        f = torch.pow(2.0, G.uniform(name + "#blk", nb, -1.0, 1.0))
        return f.repeat_interleave(bshape[0], 0)[: shape[0]].repeat_interleave(bshape[1], 1)[:, : shape[1]]

    def real_weight(name, out, inn, gain):
        return G.normal(name, (out, inn), gain / math.sqrt(inn))

    def fp8(name, out, inn, gain=1.0):
        w = real_weight(name, out, inn, gain) * block_factor(name, (out, inn), (128, 128))
        q, s = quant_fp8_weight(w)
        T[name + ".weight"] = q
        T[name + ".scale"] = s

    def fp4(name, out, inn, gain=1.0):
        w = real_weight(name, out, inn, gain) * block_factor(name, (out, inn), (1, 32))
        q, s = quant_fp4_weight(w)
        T[name + ".weight"] = q
        T[name + ".scale"] = s

    def bf16(name, out, inn, gain=1.0):
        T[name + ".weight"] = real_weight(name, out, inn, gain).to(torch.bfloat16)

    def norm(name, n):
        T[name + ".weight"] = G.uniform(name, (n,), 0.8, 1.2).to(torch.bfloat16)

    def hc_params(prefix, tag, n_mix):
        T[f"{prefix}{tag}_fn"] = G.normal(f"{prefix}{tag}_fn", (n_mix, hc * D), 1.0 / math.sqrt(hc * D))
        T[f"{prefix}{tag}_base"] = G.normal(f"{prefix}{tag}_base", (n_mix,), 0.5)
        n_scale = 3 if n_mix == mix else 1
        T[f"{prefix}{tag}_scale"] = G.uniform(f"{prefix}{tag}_scale", (n_scale,), 0.5, 1.5)

    def compressor(prefix, r, d):
        c = 2 if r == 4 else 1
        T[prefix + "ape"] = G.normal(prefix + "ape", (r, c * d), 0.5)
        bf16(prefix + "wkv", c * d, D)
        bf16(prefix + "wgate", c * d, D)
        norm(prefix + "norm", d)

    # A shared mean direction mu of the embeddings (real LMs have one too). It survives into the
    # normalised layer inputs x, and we use it to keep the tiny Lightning Indexer well-posed: with
    # only 2-8 indexer heads and random weights, score = sum_h w_h relu(q_h.k) is exactly 0 for
    # ~1/2^heads of the rows and negative whenever the w_h are, so the top-k boundary often falls
    # into a block of exactly tied zeros (resolved only by the tie rule). Rank-1 terms along mu
    # make the head weights w_h positive and most q_h.k positive, which makes such ties rare.
    mu = G.normal("embed.weight#mean", (D,), 1.0)

    def unit(v):
        return v / v.norm()

    def block(prefix, r, hash_layer):
        hc_params(prefix, "hc_attn", mix)
        hc_params(prefix, "hc_ffn", mix)
        norm(prefix + "attn_norm", D)
        norm(prefix + "ffn_norm", D)
        a = prefix + "attn."
        T[a + "attn_sink"] = G.normal(a + "attn_sink", (H,), 1.0, mean=0.5)
        fp8(a + "wq_a", ql, D)
        norm(a + "q_norm", ql)
        fp8(a + "wq_b", H * hd, ql)
        fp8(a + "wkv", hd, D)
        norm(a + "kv_norm", hd)
        fp8(a + "wo_a", og * ol, H * hd // og, gain=GAINS["wo_a"])
        fp8(a + "wo_b", D, og * ol, gain=GAINS["wo_b"])
        if r != 0:
            compressor(a + "compressor.", r, hd)
        if r == 4:
            ix = a + "indexer."
            # common direction of x (attn_norm * mu) and of qr (q_norm * wq_a x_common)
            m_x = unit(T[prefix + "attn_norm.weight"].float() * mu)
            wqa = stfile.dequant_fp8(T[a + "wq_a.weight"], T[a + "wq_a.scale"])
            m_q = unit(T[a + "q_norm.weight"].float() * (wqa @ m_x))
            v = torch.zeros(idim)
            v[: idim - cfg["qk_rope_head_dim"]] = 1.0  # non-rope dims only
            v = unit(v)
            wq = real_weight(ix + "wq_b", ih * idim, ql, 1.0).reshape(ih, idim, ql)
            wq = wq + IDX_BOOST["q"] * v[None, :, None] * m_q[None, None, :]
            wq = wq.reshape(ih * idim, ql) * block_factor(ix + "wq_b", (ih * idim, ql), (128, 128))
            T[ix + "wq_b.weight"], T[ix + "wq_b.scale"] = quant_fp8_weight(wq)
            wp = real_weight(ix + "weights_proj", ih, D, 1.0) + IDX_BOOST["w"] * m_x[None, :]
            T[ix + "weights_proj.weight"] = wp.to(torch.bfloat16)
            compressor(ix + "compressor.", 4, idim)
            ck = ix + "compressor.wkv.weight"
            wk = T[ck].float().reshape(2, idim, D) + IDX_BOOST["k"] * v[None, :, None] * m_x[None, None, :]
            T[ck] = wk.reshape(2 * idim, D).to(torch.bfloat16)
        f = prefix + "ffn."
        # router rows orthogonal to the common direction of x, so it cannot favour experts globally
        m_f = unit(T[prefix + "ffn_norm.weight"].float() * mu)
        wg = real_weight(f + "gate", E, D, 1.0)
        T[f + "gate.weight"] = (wg - (wg @ m_f)[:, None] * m_f[None, :]).to(torch.bfloat16)
        if hash_layer:
            g = G.g(f + "gate.tid2eid")
            T[f + "gate.tid2eid"] = torch.stack(
                [torch.randperm(E, generator=g)[:topk] for _ in range(V)]).to(torch.int64)
        else:
            T[f + "gate.bias"] = G.normal(f + "gate.bias", (E,), 0.2)
        fp8(f + "shared_experts.w1", inter, D)
        fp8(f + "shared_experts.w3", inter, D)
        fp8(f + "shared_experts.w2", D, inter, gain=GAINS["shared_w2"])
        for e in range(E):
            fp4(f + f"experts.{e}.w1", inter, D)
            fp4(f + f"experts.{e}.w3", inter, D)
            fp4(f + f"experts.{e}.w2", D, inter, gain=GAINS["expert_w2"])

    T["embed.weight"] = ((G.normal("embed.weight", (V, D), 1.0) + mu) / math.sqrt(2)).to(torch.bfloat16)
    for i in range(n_layers):
        block(f"layers.{i}.", ratios[i], i < cfg["num_hash_layers"])
    norm("norm", D)
    # Head: Gaussian rows with lognormal row norms, logit std across vocab ~3.5 for unit-rms z.
    rows = G.normal("head.weight", (V, D), 1.0)
    m_z = unit(T["norm.weight"].float() * mu)  # keep the common direction out of the logits
    rows = rows - (rows @ m_z)[:, None] * m_z[None, :]
    rown = torch.exp(G.normal("head.weight#rownorm", (V,), 0.6))
    rown = rown / rown.pow(2).mean().sqrt()
    T["head.weight"] = (rows * rown[:, None] * (3.5 / math.sqrt(D))).to(torch.bfloat16)  # refined by calibrate()
    hc_params("", "hc_head", hc)
    for m in range(cfg["num_nextn_predict_layers"]):
        p = f"mtp.{m}."
        block(p, ratios[n_layers + m], False)
        fp8(p + "e_proj", D, D)
        fp8(p + "h_proj", D, D)
        norm(p + "enorm", D)
        norm(p + "hnorm", D)
        norm(p + "norm", D)
        hc_params(p, "hc_head", hc)
    return T


def calibrate(cfg: dict, T: dict, seed: int, n_tokens: int = 512, target_std: float = 3.8):
    """Data-dependent touches (deterministic; plain-mode forwards of our port on random tokens):
    1. router biases of the non-hash layers are set to balance the expert load (like DeepSeek's
       aux-loss-free bias update), layer by layer in order, so every expert gets traffic;
    2. the head rows are made orthogonal to the mean final hidden state z (no token is favoured
       at every position) and scaled so the logit std across the vocabulary is ~`target_std`.
    Results are snapped to coarse grids (bias steps of 1/256, bf16 mean direction, scale factor
    to 1/1024) so that last-bit differences of another machine's float math do not change the
    checkpoint. The MTP block is not run by the port; its router bias stays random."""
    import port as P

    g = torch.Generator().manual_seed(seed * 7919 + 17)
    toks = torch.randint(0, cfg["vocab_size"], (n_tokens,), generator=g).tolist()
    k = cfg["num_experts_per_tok"]
    E = cfg["n_routed_experts"]
    for il in range(cfg["num_hash_layers"], cfg["num_hidden_layers"]):
        d = P.Dump(n_tokens)
        P.Port(None, "plain", cfg, T).forward(toks, d)
        f = f"layers.{il}.ffn."
        x = d.items[f"l{il}.ffn.x"].double()
        s = torch.sqrt(torch.nn.functional.softplus(x @ T[f + "gate.weight"].double().T))
        b = torch.round(T[f + "gate.bias"].double() * 64) / 256  # a quarter of the random bias
        for _ in range(400):
            sel = torch.sort(s + b, dim=-1, descending=True, stable=True).indices[:, :k]
            load = torch.bincount(sel.flatten(), minlength=E).double()
            b = b + torch.sign(load.mean() - load) / 256
        T[f + "gate.bias"] = (b + 1 / 512).float()  # a common shift keeps the selection, avoids 0
    d = P.Dump(n_tokens)
    P.Port(None, "plain", cfg, T).forward(toks, d)
    z = d.items["final.z"].double()
    m = z.mean(0).to(torch.bfloat16).double()
    head = T["head.weight"].double()
    head = head - (head @ m)[:, None] * m[None, :] / (m @ m)
    factor = round(float(target_std / (z @ head.T).std(-1).mean()) * 1024) / 1024
    T["head.weight"] = (head * factor).to(torch.bfloat16)


def write_checkpoint(cfg: dict, tensors: dict, out: str, shards: int):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    for fn in os.listdir(out):
        if fn.endswith(".safetensors") or fn == "model.safetensors.index.json":
            os.remove(os.path.join(out, fn))
    if shards <= 1:
        stfile.write_safetensors(os.path.join(out, "model.safetensors"), tensors, {"format": "pt"})
        return
    sizes = {k: v.numel() * v.element_size() for k, v in tensors.items()}
    total = sum(sizes.values())
    names = list(tensors)
    # greedy split into `shards` contiguous runs of roughly equal byte size
    parts, cur, acc = [], [], 0
    for k in names:
        cur.append(k)
        acc += sizes[k]
        if acc >= total * (len(parts) + 1) / shards and len(parts) < shards - 1:
            parts.append(cur)
            cur = []
    parts.append(cur)
    assert len(parts) == shards and all(parts)
    weight_map = {}
    for i, part in enumerate(parts):
        fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        stfile.write_safetensors(os.path.join(out, fn), {k: tensors[k] for k in part}, {"format": "pt"})
        for k in part:
            weight_map[k] = fn
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


def expected_tensors(cfg: dict) -> dict:
    """{name: (safetensors dtype, shape)} of architecture.md §2.4, derived from the config alone
    (independently of build_tensors, as a cross-check)."""
    D, H, hd, ql = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"], cfg["q_lora_rank"]
    G, ol, E, I = cfg["o_groups"], cfg["o_lora_rank"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    hc, V, ih, idim = cfg["hc_mult"], cfg["vocab_size"], cfg["index_n_heads"], cfg["index_head_dim"]
    mix = (2 + hc) * hc
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    X = {}

    def fp8(n, o, i):
        X[n + ".weight"] = ("F8_E4M3", [o, i])
        X[n + ".scale"] = ("F8_E8M0", [cdiv(o, 128), cdiv(i, 128)])

    def fp4(n, o, i):
        X[n + ".weight"] = ("I8", [o, i // 2])
        X[n + ".scale"] = ("F8_E8M0", [o, i // 32])

    def blk(p, r, hash_layer):
        for site in ("hc_attn", "hc_ffn"):
            X[f"{p}{site}_fn"] = ("F32", [mix, hc * D])
            X[f"{p}{site}_base"] = ("F32", [mix])
            X[f"{p}{site}_scale"] = ("F32", [3])
        X[p + "attn_norm.weight"] = ("BF16", [D])
        X[p + "ffn_norm.weight"] = ("BF16", [D])
        a = p + "attn."
        X[a + "attn_sink"] = ("F32", [H])
        fp8(a + "wq_a", ql, D)
        X[a + "q_norm.weight"] = ("BF16", [ql])
        fp8(a + "wq_b", H * hd, ql)
        fp8(a + "wkv", hd, D)
        X[a + "kv_norm.weight"] = ("BF16", [hd])
        fp8(a + "wo_a", G * ol, H * hd // G)
        fp8(a + "wo_b", D, G * ol)
        for cp, rr, d in ((a + "compressor.", r, hd), (a + "indexer.compressor.", 4 if r == 4 else 0, idim)):
            if rr:
                c = 2 if rr == 4 else 1
                X[cp + "ape"] = ("F32", [rr, c * d])
                X[cp + "wkv.weight"] = ("BF16", [c * d, D])
                X[cp + "wgate.weight"] = ("BF16", [c * d, D])
                X[cp + "norm.weight"] = ("BF16", [d])
        if r == 4:
            fp8(a + "indexer.wq_b", ih * idim, ql)
            X[a + "indexer.weights_proj.weight"] = ("BF16", [ih, D])
        f = p + "ffn."
        X[f + "gate.weight"] = ("BF16", [E, D])
        if hash_layer:
            X[f + "gate.tid2eid"] = ("I64", [V, cfg["num_experts_per_tok"]])
        else:
            X[f + "gate.bias"] = ("F32", [E])
        fp8(f + "shared_experts.w1", I, D)
        fp8(f + "shared_experts.w3", I, D)
        fp8(f + "shared_experts.w2", D, I)
        for e in range(E):
            fp4(f + f"experts.{e}.w1", I, D)
            fp4(f + f"experts.{e}.w3", I, D)
            fp4(f + f"experts.{e}.w2", D, I)

    X["embed.weight"] = ("BF16", [V, D])
    X["head.weight"] = ("BF16", [V, D])
    X["norm.weight"] = ("BF16", [D])
    X["hc_head_fn"], X["hc_head_base"], X["hc_head_scale"] = ("F32", [hc, hc * D]), ("F32", [hc]), ("F32", [1])
    n = cfg["num_hidden_layers"]
    for i in range(n):
        blk(f"layers.{i}.", cfg["compress_ratios"][i], i < cfg["num_hash_layers"])
    for m in range(cfg["num_nextn_predict_layers"]):
        p = f"mtp.{m}."
        blk(p, cfg["compress_ratios"][n + m], False)
        fp8(p + "e_proj", D, D)
        fp8(p + "h_proj", D, D)
        for k in ("enorm", "hnorm", "norm"):
            X[p + k + ".weight"] = ("BF16", [D])
        X[p + "hc_head_fn"], X[p + "hc_head_base"], X[p + "hc_head_scale"] = (
            ("F32", [hc, hc * D]), ("F32", [hc]), ("F32", [1]))
    return X


def verify_checkpoint(d: str) -> dict:
    """Checks a written checkpoint against expected_tensors() and the format rules; returns
    a few statistics. Raises AssertionError on any violation."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    T = stfile.read_checkpoint(d)
    X = expected_tensors(cfg)
    assert set(T) == set(X), f"names differ: extra {sorted(set(T) - set(X))[:5]} missing {sorted(set(X) - set(T))[:5]}"
    for k, (dt, shp) in X.items():
        assert stfile.TORCH_TO_ST[T[k].dtype] == dt and list(T[k].shape) == shp, (k, T[k].dtype, T[k].shape, dt, shp)
    scales = torch.cat([T[k].view(torch.uint8).flatten() for k in T if k.endswith(".scale")])
    assert int(scales.max()) < 255, "E8M0 NaN"
    for k in T:
        if T[k].dtype == torch.float8_e4m3fn:
            b = T[k].view(torch.uint8) & 0x7F
            assert not bool((b == 0x7F).any()), f"e4m3 NaN in {k}"
        if k.endswith("tid2eid"):
            t = T[k]
            assert int(t.min()) >= 0 and int(t.max()) < cfg["n_routed_experts"]
            assert all(len(set(r)) == len(r) for r in t.tolist()), f"repeated expert in a {k} row"
    for k in ("attn_sink", "ape", "gate.bias"):
        for n in T:
            if n.endswith(k):
                assert bool((T[n] != 0).all()), f"zero entries in {n}"
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            ix = json.load(f)
        assert set(ix["weight_map"]) == set(T)
        assert ix["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in T.values())
    fp8_scales = torch.cat([T[k].view(torch.uint8).flatten() for k in T
                            if k.endswith(".scale") and T[k[:-6] + ".weight"].dtype == torch.float8_e4m3fn])
    return {"tensors": len(T), "bytes": sum(v.numel() * v.element_size() for v in T.values()),
            "distinct_e8m0_exponents": int(torch.unique(scales).numel()),
            "fp8_scale_exponent_range": [int(fp8_scales.min()) - 127, int(fp8_scales.max()) - 127]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, choices=sorted(CONFIGS))
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shards", type=int, default=1)
    args = ap.parse_args()
    cfg = CONFIGS[args.config]
    tensors = build_tensors(cfg, args.seed)
    calibrate(cfg, tensors, args.seed)
    write_checkpoint(cfg, tensors, args.out, args.shards)
    print(json.dumps(verify_checkpoint(args.out)))
    nbytes = sum(v.numel() * v.element_size() for v in tensors.values())
    print(f"{args.out}: {len(tensors)} tensors, {nbytes} bytes, {max(args.shards, 1)} file(s)")


if __name__ == "__main__":
    main()
