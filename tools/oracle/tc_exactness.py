#!/usr/bin/env python3
"""Does a tensor-core GEMM return the exactly rounded sum of one K tile? (NOTES.md §5; needs a GPU)

  tc_exactness.py

For K = 32 … 512 and three data shapes (normal, heavy-tailed, wide exponent span), quantizes rows to
e4m3 per 128-block with power-of-two scales (as the activation quantization does), multiplies them
on the FP8 tensor cores (torch._scaled_mm, fp32 out) and, for comparison, with a float32 matmul
and bf16 tensor cores, and reports the fraction of outputs equal to the float64 sum rounded once.
"""
import torch

torch.manual_seed(0)
dev = "cuda"


def quant_rows(x, block):
    M, K = x.shape
    xb = x.reshape(M, K // block, block)
    e = torch.ceil(torch.log2(xb.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 448.0))
    return (xb / torch.exp2(e)).clamp(-448, 448).to(torch.float8_e4m3fn).reshape(M, K)


def data(kind, M, K):
    x = torch.randn(M, K, device=dev)
    if kind == "heavy":
        return x / torch.rand(M, K, device=dev).clamp_min(0.02)
    if kind == "wide":
        return x * torch.exp2(torch.randint(-12, 1, (M, K), device=dev).float())
    return x


def exact(out, ref):
    return f"{(out == ref).float().mean().item() * 100:8.4f} %"


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    torch.backends.cuda.matmul.allow_tf32 = False
    one = torch.ones((), device=dev)
    for K in (32, 64, 128, 256, 512):
        for kind in ("normal", "heavy", "wide"):
            a = quant_rows(data(kind, 2048, K), min(K, 128))
            b = quant_rows(data(kind, 2048, K), min(K, 128))
            ref = (a.double() @ b.double().T).float()
            fp8 = torch._scaled_mm(a, b.T, scale_a=one, scale_b=one, out_dtype=torch.float32)
            print(f"K={K:4d} {kind:6s} exact: FP8 tensor cores {exact(fp8, ref)}, "
                  f"float32 matmul {exact(a.float() @ b.float().T, ref)}")
    for K in (128, 1024):
        a = torch.randn(2048, K, device=dev).bfloat16()
        b = torch.randn(2048, K, device=dev).bfloat16()
        ref = (a.double() @ b.double().T).float()
        try:
            tc = exact(torch.mm(a, b.T, out_dtype=torch.float32), ref)
        except (TypeError, RuntimeError) as e:
            tc = f"n/a ({type(e).__name__})"
        print(f"bf16 K={K}: exact: bf16 tensor cores (fp32 out) {tc}, float32 matmul {exact(a.float() @ b.float().T, ref)}")


if __name__ == "__main__":
    main()
