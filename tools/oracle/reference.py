#!/usr/bin/env python3
"""Runs transformers' DeepseekV4ForCausalLM in float32 on a tiny official-format checkpoint.

  reference.py --ckpt DIR --tokens tokens.json --out plain.f32 [--n N]

The model is built from the checkpoint's config.json (eager attention, eager experts, float32,
no cache) and loaded with EXACTLY the dequantized checkpoint weights. The native -> HF name map
is written out here (architecture.md §2.8 and the transformers modeling file); transformers' own
FP8 loader is not used. Every HF parameter and persistent buffer must be covered (strict load).
Writes the logits of every position as raw little-endian float32 [n_tokens, vocab].
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stfile  # noqa: E402

torch.set_grad_enabled(False)


def dequantized(t: dict) -> dict:
    """native name (without .weight where a .scale exists) -> fp32 tensor."""
    out = {}
    for k, v in t.items():
        if k.endswith(".scale"):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        if base is not None and base + ".scale" in t:
            s = t[base + ".scale"]
            out[k] = stfile.dequant_fp4(v, s) if v.dtype == torch.int8 else stfile.dequant_fp8(v, s)
        elif v.dtype == torch.int64:
            out[k] = v
        else:
            out[k] = v.to(torch.float32)
    return out


def hf_state_dict(cfg: dict, w: dict) -> dict:
    """Maps native checkpoint names to transformers module names (main model only; HF does not
    instantiate the MTP block)."""
    sd = {
        "model.embed_tokens.weight": w["embed.weight"],
        "lm_head.weight": w["head.weight"],
        "model.norm.weight": w["norm.weight"],
        "model.hc_head.hc_fn": w["hc_head_fn"],
        "model.hc_head.hc_base": w["hc_head_base"],
        "model.hc_head.hc_scale": w["hc_head_scale"],
    }
    for i in range(cfg["num_hidden_layers"]):
        n, h = f"layers.{i}.", f"model.layers.{i}."
        r = cfg["compress_ratios"][i]
        for site, hf_site in (("hc_attn", "attn_hc"), ("hc_ffn", "ffn_hc")):
            for p in ("fn", "base", "scale"):
                sd[f"{h}{hf_site}.{p}"] = w[f"{n}{site}_{p}"]
        sd[h + "input_layernorm.weight"] = w[n + "attn_norm.weight"]
        sd[h + "post_attention_layernorm.weight"] = w[n + "ffn_norm.weight"]
        a, ha = n + "attn.", h + "self_attn."
        sd[ha + "q_a_proj.weight"] = w[a + "wq_a.weight"]
        sd[ha + "q_a_norm.weight"] = w[a + "q_norm.weight"]
        sd[ha + "q_b_proj.weight"] = w[a + "wq_b.weight"]
        sd[ha + "kv_proj.weight"] = w[a + "wkv.weight"]
        sd[ha + "kv_norm.weight"] = w[a + "kv_norm.weight"]
        sd[ha + "o_a_proj.weight"] = w[a + "wo_a.weight"]
        sd[ha + "o_b_proj.weight"] = w[a + "wo_b.weight"]
        sd[ha + "sinks"] = w[a + "attn_sink"]
        if r != 0:
            c, hc = a + "compressor.", ha + "compressor."
            sd[hc + "kv_proj.weight"] = w[c + "wkv.weight"]
            sd[hc + "gate_proj.weight"] = w[c + "wgate.weight"]
            sd[hc + "position_bias"] = w[c + "ape"]
            sd[hc + "kv_norm.weight"] = w[c + "norm.weight"]
        if r == 4:
            x, hx = a + "indexer.", ha + "compressor.indexer."
            sd[hx + "q_b_proj.weight"] = w[x + "wq_b.weight"]
            sd[hx + "scorer.weights_proj.weight"] = w[x + "weights_proj.weight"]
            sd[hx + "kv_proj.weight"] = w[x + "compressor.wkv.weight"]
            sd[hx + "gate_proj.weight"] = w[x + "compressor.wgate.weight"]
            sd[hx + "position_bias"] = w[x + "compressor.ape"]
            sd[hx + "kv_norm.weight"] = w[x + "compressor.norm.weight"]
        f, hm = n + "ffn.", h + "mlp."
        sd[hm + "gate.weight"] = w[f + "gate.weight"]
        if f + "gate.tid2eid" in w:
            sd[hm + "gate.tid2eid"] = w[f + "gate.tid2eid"]
        else:
            sd[hm + "gate.e_score_correction_bias"] = w[f + "gate.bias"]
        sd[hm + "shared_experts.gate_proj.weight"] = w[f + "shared_experts.w1.weight"]
        sd[hm + "shared_experts.up_proj.weight"] = w[f + "shared_experts.w3.weight"]
        sd[hm + "shared_experts.down_proj.weight"] = w[f + "shared_experts.w2.weight"]
        E = cfg["n_routed_experts"]
        # gate_up_proj[e] = [w1_e ; w3_e] (HF chunks the fused output into gate, up)
        sd[hm + "experts.gate_up_proj"] = torch.stack(
            [torch.cat([w[f + f"experts.{e}.w1.weight"], w[f + f"experts.{e}.w3.weight"]], 0) for e in range(E)])
        sd[hm + "experts.down_proj"] = torch.stack([w[f + f"experts.{e}.w2.weight"] for e in range(E)])
    return sd


def build_model(ckpt: str):
    from transformers import AutoConfig, DeepseekV4ForCausalLM

    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    config = AutoConfig.from_pretrained(ckpt)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # weights are handed over already dequantized
    model = DeepseekV4ForCausalLM._from_config(
        config, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32)
    model.eval()
    w = dequantized(stfile.read_checkpoint(ckpt))
    sd = hf_state_dict(cfg, w)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # strict coverage check; non-persistent rope buffers are not in the state dict anyway
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    for k, p in model.state_dict().items():
        assert p.dtype in (torch.float32, torch.int64), (k, p.dtype)
    return cfg, model


def run(ckpt: str, tokens: list) -> torch.Tensor:
    _, model = build_model(ckpt)
    ids = torch.tensor([tokens], dtype=torch.long)
    out = model(input_ids=ids, use_cache=False)
    return out.logits[0].float()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with open(args.tokens) as f:
        tokens = json.load(f)["tokens"]
    if args.n is not None:
        tokens = tokens[: args.n]
    logits = run(args.ckpt, tokens)
    logits.contiguous().numpy().astype("<f4").tofile(args.out)
    print(f"transformers float32: {len(tokens)} tokens, logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()
