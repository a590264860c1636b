#!/usr/bin/env python3
"""Self-checks of the oracle's numeric primitives against slow, independent scalar versions.

  python3 tools/oracle/selftest.py

Checks: e4m3 RNE (midpoints of every binade), e2m1 RNE + nibble packing, e8m0 decode, the
power-of-two activation scale rule (float32 product with 1/448, ceil-log2 from the bits)
against a frexp-based scalar version, the FP8 and FP4 GEMM simulation against a plain float64
matmul of the dequantized operands (within one bf16 step: the simulation rounds each K tile's
exact partial to float32 and accumulates the tiles in float32), the FP4 simulation, and the
Hadamard butterfly against the explicit Sylvester matrix.
"""
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import port as P  # noqa: E402
import stfile  # noqa: E402


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def scalar_pow2_scale(amax: float, inv: float) -> float:
    t = f32(f32(amax) * f32(inv))
    m, e = math.frexp(t)  # t = m * 2^e, m in [0.5, 1)
    return 2.0 ** (e - 1) if m == 0.5 else 2.0 ** e


def within_one_bf16_step(y: torch.Tensor, exact: torch.Tensor) -> bool:
    """|y - exact| <= the bf16 spacing at |exact| (y is a bf16 value)."""
    step = torch.ldexp(torch.ones_like(exact), torch.frexp(exact.abs().float())[1].double() - 8)
    return bool(((y.double() - exact).abs() <= step).all())


def check(name, ok):
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if not ok:
        check.failed = True


check.failed = False


def main():
    g = torch.Generator().manual_seed(0)
    # e4m3 grid and RNE at midpoints
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    pos = torch.unique(grid[(grid >= 0) & ~torch.isnan(grid)])
    mids = (pos[1:] + pos[:-1]) / 2
    r = stfile.round_e4m3(mids)
    lo_code = torch.arange(len(pos) - 1)  # codes of the lower neighbour are 0..125 in order
    expect = torch.where(lo_code % 2 == 0, pos[:-1], pos[1:])
    check("e4m3 RNE ties to even code", bool((r == expect).all()))
    # e2m1
    vals = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 0.3, 2.6, 5.5])
    exp = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -4.0, 0.5, 3.0, 6.0])
    check("e2m1 RNE", bool((stfile.round_e2m1(vals) == exp).all()))
    codes = torch.randint(0, 16, (5, 64), generator=g)
    packed = stfile.pack_fp4(codes)
    check("fp4 low nibble = element 2j", bool(((packed.view(torch.uint8) & 15) == codes[:, 0::2]).all()))
    check("fp4 pack/unpack", bool((stfile.unpack_fp4(packed) == codes).all()))
    check("e8m0 decode", stfile.e8m0_to_f32(torch.tensor([0, 127, 130], dtype=torch.uint8)).tolist()
          == [2.0 ** -127, 1.0, 8.0])
    # scale rule
    x = (torch.randn(64, 256, generator=g) * torch.exp(torch.randn(64, 1, generator=g) * 3)).double()
    x = P.bf16(x)
    q, s = P.act_quant(x, 128)
    amax = x.reshape(64, 2, 128).abs().amax(-1).clamp_min(1e-4)
    ref = torch.tensor([[scalar_pow2_scale(float(a), 1 / 448) for a in row] for row in amax])
    check("activation scale 2^ceil(log2(amax*fp32(1/448)))", bool((s.double() == ref.double()).all()))
    check("e4m3 values within +-448", bool((q.abs() <= 448).all()))
    # FP8 GEMM simulation == float64 matmul of dequantized operands (all steps exact)
    w = torch.randn(256, 256, generator=g) / 16
    from make_checkpoint import quant_fp8_weight, quant_fp4_weight
    wq, ws = quant_fp8_weight(w)
    port = P.Port.__new__(P.Port)
    port.ds = True
    port.cache = {}
    port.t = {"w.weight": wq, "w.scale": ws}
    y = port.lin_fp8(x, "w")
    exact = (q * s[..., None]).reshape(64, 256).double() @ stfile.dequant_fp8(wq, ws).double().T
    check("FP8 GEMM within one bf16 step of the exact product", within_one_bf16_step(y, exact))
    wq4, ws4 = quant_fp4_weight(w[:128])
    port.t.update({"e.weight": wq4, "e.scale": ws4})
    y4 = port.lin_fp4(x, "e")
    exact4 = (q * s[..., None]).reshape(64, 256).double() @ stfile.dequant_fp4(wq4, ws4).double().T
    check("FP4 GEMM within one bf16 step of the exact product", within_one_bf16_step(y4, exact4))
    # FP4 simulation
    v = P.bf16(torch.randn(8, 128, generator=g).double() * 3)
    fs = P.fp4_sim(v)
    vb = v.reshape(8, 4, 32)
    sc = torch.tensor([[scalar_pow2_scale(float(a), 1 / 6) for a in row] for row in vb.abs().amax(-1)]).double()
    ref = P.bf16((stfile.round_e2m1((vb / sc[..., None]).float().clamp(-6, 6)).double() * sc[..., None]).reshape(8, 128))
    check("FP4 simulation", bool((fs.double() == ref.double()).all()))
    # Hadamard
    Hm = torch.ones(1, 1, dtype=torch.float64)
    while Hm.shape[0] < 128:
        Hm = torch.cat([torch.cat([Hm, Hm], 1), torch.cat([Hm, -Hm], 1)], 0)
    hv = P.hadamard(v)
    exact_h = (v.double() @ Hm.T * (1.0 / math.sqrt(128))).float()
    check("Hadamard = Sylvester matrix * 128^-0.5, rounded once", bool((hv == exact_h).all()))
    sys.exit(1 if check.failed else 0)


if __name__ == "__main__":
    main()
